"""gradcore.functions.loss: mean squared error, softmax / sigmoid / binary cross entropy, accuracy.
One row per op; tests/harness.py checks each. Then: fused ops against compositions, large logits,
the clip, labels and their errors."""
import warnings

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from float16_backends import float16_backends
from harness import Case, check_case, ids

LABELS = np.array([0, 2, 1, 2])
BINARY = np.array([1.0, 0.0, 0.0, 1.0, 1.0])
SOFT = np.array([[0.2, 0.9], [1.0, 0.0], [0.5, 0.3]])
PROB = (0.05, 0.95)
# uint8 labels, as raw MNIST / CIFAR files hold them: a range of 300 rows or classes overflows them
BYTE_LABELS_300_ROWS = np.random.default_rng(3).integers(0, 3, 300).astype(np.uint8)
BYTE_LABELS_300_CLASSES = np.array([5, 7, 200, 30], np.uint8)  # 5 + 256 is a class too


def np_mse(x0, x1):
    return np.sum((x0 - x1) ** 2) / (len(x0) if x0.ndim else 1)


def np_sce(x, t):
    t = t.reshape(-1)
    log_p = x - x.max(1, keepdims=True)
    log_p = log_p - np.log(np.exp(log_p).sum(1, keepdims=True))
    return -log_p[np.arange(len(x)), t].mean()


def np_sigmoid_ce(x, t):
    p, t = 1 / (1 + np.exp(-x)), t.reshape(x.shape)
    return -np.sum(t * np.log(p) + (1 - t) * np.log(1 - p)) / len(x)


def np_bce(p, t):
    t = t.reshape(p.shape)
    return -np.sum(t * np.log(p) + (1 - t) * np.log(1 - p)) / len(p)


def np_accuracy(y, t):
    return np.mean(y.argmax(axis=1) == t)


# fmt: off
CASES = [
    Case("mean_squared_error",                F.mean_squared_error,            np_mse, ((4, 1), (4, 1))),
    Case("mean_squared_error-rows",           F.mean_squared_error,            np_mse, ((5, 3), (5, 3))),
    Case("mean_squared_error-0-d",            F.mean_squared_error,            np_mse, ((), ())),
    Case("mean_squared_error-const",          F.mean_squared_error,            np_mse, ((4, 2),), args=(np.arange(8.0).reshape(4, 2) / 4,)),
    Case("mean_squared_error_simple",         F.mean_squared_error_simple,     np_mse, ((5, 3), (5, 3))),
    Case("softmax_cross_entropy",             F.softmax_cross_entropy,         np_sce, ((4, 3),), args=(LABELS,)),
    Case("softmax_cross_entropy-int32",       F.softmax_cross_entropy,         np_sce, ((4, 3),), args=(LABELS.astype(np.int32),)),
    Case("softmax_cross_entropy-column",      F.softmax_cross_entropy,         np_sce, ((4, 3),), args=(LABELS[:, None],)),
    Case("softmax_cross_entropy-wide",        F.softmax_cross_entropy,         np_sce, ((4, 3),), (-40.0, 40.0), args=(LABELS,)),
    Case("softmax_cross_entropy-uint8",       F.softmax_cross_entropy,         np_sce, ((4, 300),), args=(BYTE_LABELS_300_CLASSES,)),
    Case("softmax_cross_entropy_simple",      F.softmax_cross_entropy_simple,  np_sce, ((4, 3),), args=(LABELS,)),
    Case("softmax_cross_entropy_simple-uint8", F.softmax_cross_entropy_simple, np_sce, ((300, 3),), args=(BYTE_LABELS_300_ROWS,)),
    Case("sigmoid_cross_entropy",             F.sigmoid_cross_entropy,         np_sigmoid_ce, ((5,),), args=(BINARY,)),
    Case("sigmoid_cross_entropy-column",      F.sigmoid_cross_entropy,         np_sigmoid_ce, ((5, 1),), args=(BINARY.astype(np.int64),)),
    Case("sigmoid_cross_entropy-soft",        F.sigmoid_cross_entropy,         np_sigmoid_ce, ((3, 2),), (-8.0, 8.0), args=(SOFT,)),
    Case("binary_cross_entropy",              F.binary_cross_entropy,          np_bce, ((5,),), PROB, args=(BINARY,)),
    Case("binary_cross_entropy-column",       F.binary_cross_entropy,          np_bce, ((5, 1),), PROB, args=(BINARY.astype(np.int32),)),
    Case("binary_cross_entropy-soft",         F.binary_cross_entropy,          np_bce, ((3, 2),), PROB, args=(SOFT,)),
    # accuracy has no graph: + 0 * sum(y) gives the harness one (a zero gradient) to run its checks
    Case("accuracy",                          lambda y, t: F.accuracy(y, t) + F.sum(y) * 0.0,
         np_accuracy, ((6, 4),), args=(np.array([0, 1, 2, 3, 0, 1]),),
         float32=False),  # float64 whatever the scores' dtype, as DeZero's
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_op(case, xp):
    check_case(case, xp)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_accuracy_is_a_variable_with_no_graph(xp, dtype):
    y = np.random.default_rng(0).uniform(-2, 2, size=(6, 4))
    t = np.array([0, 1, 2, 3, 0, 1])
    acc = F.accuracy(gradcore.Variable(xp.asarray(y, dtype=dtype)), xp.asarray(t))
    assert acc.shape == () and acc.dtype == xp.float64 and acc.device == xp.device
    assert acc.creator is None and not acc.requires_grad
    np.testing.assert_allclose(xp.numpy(acc.data), np_accuracy(y, t), rtol=1e-7)


def test_accuracy_of_low_precision_scores_counts_every_row():
    # in the scores' dtype, as before: float16 counted 9,194 of 10,000 where 9,196 are right,
    # and float32's float(acc) * N was 9,196.0001 (DeZero's accuracy is float64)
    rng = np.random.default_rng(0)
    t = rng.integers(0, 3, 10_000)
    y = np.eye(3)[t] * 2.0 + rng.uniform(0, 1, (10_000, 3))
    y[:804] = np.eye(3)[(t[:804] + 1) % 3] * 2.0  # 804 rows wrong
    for dtype in (np.float16, np.float32):
        acc = F.accuracy(y.astype(dtype), t)
        assert acc.dtype == np.float64 and float(acc.data) * len(t) == 9196.0


# =============================================================================== fused vs composed
def derivatives(f, xs, xp, seed=0):
    """f(*xs), its gradients, and the gradients of <those gradients, u>: lists of NumPy arrays."""
    rng = np.random.default_rng(seed)
    vs = [gradcore.Variable(xp.asarray(x)) for x in xs]
    y = f(*vs)
    gs = gradcore.grad(y, vs, create_graph=True)
    total = F.sum(vs[0] * 0.0)
    for g, x in zip(gs, xs):
        total = total + F.sum(g * xp.asarray(rng.standard_normal(x.shape)))
    hs = gradcore.grad(total, vs)
    return [xp.numpy(y.data)] + [xp.numpy(g.data) for g in gs] + [xp.numpy(h.data) for h in hs]


def constant_like(t, x):
    """NumPy targets as a constant on x's device (the compositions below use plain operators)."""
    return F.to(gradcore.Variable(t, requires_grad=False), x.device)


def dezero_sigmoid_ce(x, t):
    """DeZero's composition (clip to [1e-15, 1], which moderate inputs never reach)."""
    t = constant_like(t, x)
    p = F.sigmoid_simple(x)
    return -F.sum(t * F.log(p) + (1 - t) * F.log(1 - p)) / len(x)


def dezero_bce(p, t):
    t = constant_like(t, p)
    return -F.sum(t * F.log(p) + (1 - t) * F.log(1 - p)) / len(p)


@pytest.mark.parametrize("fused, composed, make", [
    (F.mean_squared_error, F.mean_squared_error_simple,
     lambda r: [r.normal(size=(4, 3)), r.normal(size=(4, 3))]),
    (lambda x: F.softmax_cross_entropy(x, LABELS),
     lambda x: F.softmax_cross_entropy_simple(x, LABELS),
     lambda r: [r.uniform(-3, 3, size=(4, 3))]),
    (lambda x: F.sigmoid_cross_entropy(x, BINARY), lambda x: dezero_sigmoid_ce(x, BINARY),
     lambda r: [r.uniform(-3, 3, size=5)]),
    (lambda p: F.binary_cross_entropy(p, SOFT), lambda p: dezero_bce(p, SOFT),
     lambda r: [r.uniform(0.1, 0.9, size=(3, 2))]),
], ids=["mean_squared_error", "softmax_cross_entropy", "sigmoid_cross_entropy",
        "binary_cross_entropy"])
def test_fused_loss_agrees_with_its_composition(xp2, fused, composed, make):
    xs = make(np.random.default_rng(2))
    for a, b in zip(derivatives(fused, xs, xp2), derivatives(composed, xs, xp2)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_a_target_variable_gets_a_gradient(xp):
    x = gradcore.Variable(xp.asarray([0.5, -1.0]))
    t = gradcore.Variable(xp.asarray([0.25, 1.0]))
    F.sigmoid_cross_entropy(x, t).backward()
    np.testing.assert_allclose(xp.numpy(t.grad.data), [-0.25, 0.5])  # -x / N
    p = gradcore.Variable(xp.asarray([0.5, 0.8]))
    t.cleargrad()
    F.binary_cross_entropy(p, t).backward()
    np.testing.assert_allclose(xp.numpy(t.grad.data), [0.0, -np.log(4.0) / 2], atol=1e-15)


# =========================================================================== large logits, the clip
@pytest.mark.filterwarnings("error")  # no overflow, no log(0), no 0 * inf
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cross_entropies_are_stable_for_large_logits(xp, dtype):
    raw = np.array([[1000.0, -1000.0], [-1000.0, 1000.0], [999.0, 1000.0]])
    x = gradcore.Variable(xp.asarray(raw, dtype=dtype))
    loss = F.softmax_cross_entropy(x, np.array([1, 1, 0]))
    loss.backward()
    e1 = np.exp(-1.0)
    # -log p: 2000, 0, 1 + log(1 + e^-1); gradient (softmax - onehot) / 3
    np.testing.assert_allclose(xp.numpy(loss.data), (2000 + 1 + np.log1p(e1)) / 3, rtol=1e-6)
    np.testing.assert_allclose(xp.numpy(x.grad.data), np.array(
        [[1, -1], [0, 0], [-1 / (1 + e1), 1 / (1 + e1)]]) / 3, rtol=1e-6, atol=1e-7)
    assert loss.dtype == x.dtype and x.grad.dtype == x.dtype

    z = gradcore.Variable(xp.asarray([1000.0, -1000.0, 1000.0, 0.0], dtype=dtype))
    loss = F.sigmoid_cross_entropy(z, np.array([0, 1, 1, 1]))
    loss.backward()
    np.testing.assert_allclose(xp.numpy(loss.data), (2000 + np.log(2.0)) / 4, rtol=1e-6)
    np.testing.assert_allclose(xp.numpy(z.grad.data), [0.25, -0.25, 0.0, -0.125], rtol=1e-6)
    assert loss.dtype == z.dtype and z.grad.dtype == z.dtype


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_binary_cross_entropy_clips_to_the_dtype_epsilon(xp, dtype):
    eps = np.finfo(dtype).eps
    p = gradcore.Variable(xp.asarray([0.0, 1.0, 1.0, 0.5, 0.75], dtype=dtype))
    loss = F.binary_cross_entropy(p, np.array([1, 0, 1, 1, 0]))
    loss.backward()
    # 0 and 1 are clipped to eps and 1 - eps: finite, and no gradient flows through the clip
    expected = -2 * np.log(eps) - np.log1p(-eps) + np.log(2.0) - np.log(0.25)
    np.testing.assert_allclose(xp.numpy(loss.data), expected / 5, rtol=1e-6)
    np.testing.assert_allclose(xp.numpy(p.grad.data), [0.0, 0.0, 0.0, -0.4, 0.8], rtol=1e-6)
    assert loss.dtype == p.dtype and p.grad.dtype == p.dtype


@pytest.mark.filterwarnings("error")  # the NaN comes from where, not from log of a negative
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_binary_cross_entropy_of_values_outside_0_1_is_nan(xp, dtype):
    """Logits passed for probabilities were clipped, silently: p = [2, 0.3, -1], t = [1, 1, 0]
    gave 0.4013 and the gradient [0, -1.11, 0], the two rows outside [0, 1] counted as perfect.
    Now NaN, in the loss and in the gradients of those rows (PyTorch raises)."""
    p = gradcore.Variable(xp.asarray([[2.0], [0.3], [-1.0]], dtype=dtype))
    t = gradcore.Variable(xp.asarray([[1.0], [1.0], [0.0]], dtype=dtype))
    loss = F.binary_cross_entropy(p, t)
    loss.backward()
    assert np.isnan(xp.numpy(loss.data)) and loss.dtype == p.dtype
    gp, gt = xp.numpy(p.grad.data).ravel(), xp.numpy(t.grad.data).ravel()
    assert np.isnan(gp).tolist() == [True, False, True] == np.isnan(gt).tolist()
    np.testing.assert_allclose(gp[1], -0.7 / 0.21 / 3, rtol=1e-6)  # (p - t) / (p (1 - p)) / N
    np.testing.assert_allclose(gt[1], np.log(0.7 / 0.3) / 3, rtol=1e-6)


# =============================================================================== labels
def test_numpy_labels_follow_x_to_its_device(xp):
    x = gradcore.Variable(xp.asarray(np.array([[2.0, 1.0, 0.1], [0.3, 0.2, 3.0]])))
    expected = np_sce(np.array([[2.0, 1.0, 0.1], [0.3, 0.2, 3.0]]), np.array([0, 1]))
    for t in (np.array([0, 1]), xp.asarray(np.array([0, 1])), [0, 1],
              gradcore.Variable(np.array([0, 1])), np.array([[0], [1]])):
        loss = F.softmax_cross_entropy(x, t)
        assert loss.device == x.device
        np.testing.assert_allclose(xp.numpy(loss.data), expected, rtol=1e-14)
        np.testing.assert_allclose(xp.numpy(F.accuracy(x, t).data), 0.5)
    binary = F.sigmoid_cross_entropy(x, np.ones((2, 3), dtype=np.int8))
    assert binary.device == x.device


@pytest.mark.parametrize("shape", [(2,), (2, 1)], ids=["1-d", "column"])
def test_softmax_cross_entropy_backward_keeps_the_labels_of_forward(xp, shape):
    # a label buffer refilled for the next batch before backward: the gradient was the new
    # labels' ([1/6, 1/6, -1/3] in row 0), silently. A column (N, 1) is reshaped to a view
    z = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    t_first, t_next = np.array([0, 1]), np.array([2, 2])
    expected = F.softmax(gradcore.Variable(z)).data - np.eye(3)[t_first]
    for wrap in (lambda a: a, gradcore.Variable):
        x = gradcore.Variable(xp.asarray(z))
        t = xp.asarray(t_first.copy().reshape(shape))  # NumPy's asarray would hand t_first
        loss = F.softmax_cross_entropy(x, wrap(t))
        t[...] = xp.asarray(t_next.reshape(shape))
        loss.backward()
        np.testing.assert_allclose(xp.numpy(x.grad.data), expected / 2, rtol=1e-14)
        assert xp.numpy(t).reshape(-1).tolist() == [2, 2]  # the caller's array is untouched


def test_accuracy_matches_dezero_example(xp):
    y = np.array([[0.2, 0.8, 0.0], [0.1, 0.9, 0.0], [0.8, 0.1, 0.1]])
    acc = F.accuracy(gradcore.Variable(xp.asarray(y)), np.array([1, 2, 0]))
    np.testing.assert_allclose(xp.numpy(acc.data), 2 / 3)
    acc = F.accuracy(xp.asarray(y), xp.asarray(np.array([1, 1, 0])))  # raw arrays too
    assert isinstance(acc, gradcore.Variable) and acc.item() == 1.0


# =============================================================================== errors
X = np.array([[1.0, 2.0, 3.0], [0.5, 0.1, 0.2]])  # N = 2 rows, C = 3 classes


@pytest.mark.parametrize("op", [F.softmax_cross_entropy, F.softmax_cross_entropy_simple])
@pytest.mark.parametrize("t, error, message", [
    (np.array([0, 1, 2]), ValueError, r"got 3 labels for 2 rows of x"),
    (np.array([0.0, 1.0]), TypeError, r"labels must be integer class indices, "
                                      r"got dtype \S*float64"),
    (np.array([True, False]), TypeError, r"labels must be integer class indices"),
    (np.array([0, 3]), IndexError, r"labels must lie in \[0, 3\) for 3 classes, got values from 0 "
                                   r"to 3"),
    (np.array([-1, 2]), IndexError, r"labels must lie in \[0, 3\) .* from -1 to 2"),
    (np.array([[0, 1], [1, 0]]), ValueError, r"labels must be a 1-d array of class indices"),
    # one-hot rows: the advice was t.astype(int), which then failed for the shape
    (np.eye(3)[[2, 0]], ValueError, r"labels must be N class indices, got an array of shape "
     r"\(2, 3\), one row of 3 per example \(one-hot targets or probabilities\?\): pass the "
     r"class of each row, t\.argmax\(axis=1\)"),
    (np.eye(3, dtype=int)[[2, 0]], ValueError, r"labels must be N class indices, .*one-hot"),
], ids=["length", "float", "bool", "too-large", "negative", "2-d", "one-hot", "int-one-hot"])
def test_softmax_cross_entropy_rejects_bad_labels(xp, op, t, error, message):
    x = gradcore.Variable(xp.asarray(X))
    with pytest.raises(error, match=rf"^{op.__name__}: {message}"):
        op(x, t)
    assert x.grad is None


def test_softmax_cross_entropy_needs_2d_logits(xp):
    x = gradcore.Variable(xp.asarray(np.ones(3)))
    with pytest.raises(ValueError, match=r"softmax_cross_entropy: expects logits of shape "
                                         r"\(N, C\), got shape \(3,\)"):
        F.softmax_cross_entropy(x, np.array([0]))


@pytest.mark.parametrize("op, a, b", [
    (F.mean_squared_error_simple, "x0", "x1"),
    (F.sigmoid_cross_entropy, "x", "t"),
    (F.binary_cross_entropy, "p", "t"),
])
def test_losses_reject_shape_mismatch(xp, op, a, b):
    x0 = gradcore.Variable(xp.asarray(np.full((3, 2), 0.5)))
    x1 = gradcore.Variable(xp.asarray(np.full((2, 3), 0.5)))
    with pytest.raises(ValueError, match=rf"^{op.__name__}: {a} and {b} must have the same shape, "
                                         r"got \(3, 2\) and \(2, 3\)"):
        op(x0, x1)
    assert x0.grad is None and x1.grad is None


def test_mean_squared_error_broadcasts_as_dezero_does_and_warns(xp):
    # DeZero's RNN example compares a (1, 1) prediction with a (1,) target
    a, b = np.array([[1.0], [2.0], [4.0]]), np.array([0.5, 1.0, 3.0])
    x0, x1 = gradcore.Variable(xp.asarray(a)), gradcore.Variable(xp.asarray(b))
    with pytest.warns(UserWarning, match=r"x0 has shape \(3, 1\) and x1 \(3,\); they broadcast"):
        y = F.mean_squared_error(x0, x1)
    diff = a - b  # (3, 3), as DeZero computes it: the sum over it, by its first axis
    np.testing.assert_allclose(float(y.item()), np.sum(diff ** 2) / 3, rtol=1e-15)
    y.backward()
    np.testing.assert_allclose(xp.numpy(x0.grad.data), np.sum(2 * diff / 3, axis=1,
                                                               keepdims=True), rtol=1e-14)
    np.testing.assert_allclose(xp.numpy(x1.grad.data), -np.sum(2 * diff / 3, axis=0),
                               rtol=1e-14)
    with pytest.warns(UserWarning), pytest.raises(ValueError,
                                                  match=r"^mean_squared_error: .*broadcast"):
        F.mean_squared_error(gradcore.Variable(xp.asarray(np.ones((3, 2)))),
                             gradcore.Variable(xp.asarray(np.ones((2, 3)))))
    # shapes that differ by axes of 1 alone, pairing the same elements with the same N: a
    # DeZero RNN's (1, 1) prediction against its (1,) target warned at every step
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = F.mean_squared_error(gradcore.Variable(xp.asarray([[2.0]])), xp.asarray([0.5]))
    assert float(y.item()) == 2.25
    for s0, s1 in (((1, 3), (3,)), ((4,), (4, 1))):  # N or the pairs change: warned
        with pytest.warns(UserWarning, match="they broadcast"):
            F.mean_squared_error(gradcore.Variable(xp.asarray(np.ones(s0))),
                                 xp.asarray(np.ones(s1)))


@pytest.mark.parametrize("y, t, error, message", [
    (np.ones(3), np.array([0]), ValueError, r"expects scores of shape \(N, C\), got shape \(3,\)"),
    (X, np.array([0, 1, 2]), ValueError, r"got 3 labels for 2 rows of x"),
    (X, np.array([0.0, 1.0]), TypeError, r"labels must be integer class indices"),
])
def test_accuracy_errors(xp, y, t, error, message):
    with pytest.raises(error, match=rf"^accuracy: {message}"):
        F.accuracy(gradcore.Variable(xp.asarray(y)), t)


@pytest.mark.parametrize("loss", ["sigmoid_cross_entropy", "binary_cross_entropy"])
def test_soft_targets_of_another_dtype_get_their_gradient(loss):
    # float32 scores, float64 soft targets that require grad: the targets' gradient (in their
    # own dtype) is what it is when both are float64
    scores = np.array([0.5, -1.0]) if loss == "sigmoid_cross_entropy" else np.array([0.3, 0.8])
    grads = []
    for dtype in ("float32", "float64"):
        x = gradcore.Variable(scores.astype(dtype))
        t = gradcore.Variable(np.array([0.2, 0.7]))
        getattr(F, loss)(x, t).backward()
        assert t.grad is not None and t.grad.dtype == np.float64
        grads.append(t.grad.data)
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6)


def test_float16_losses_of_a_large_batch_divide_by_n_in_float32():
    # N = 70,000 is inf in float16: sum / N would make each loss 0 (or nan) and its gradient 0
    n = 70_000
    zeros = np.zeros(n, np.float16)
    cases = [  # (loss, x, t, the loss, the gradient of each element of x)
        (F.softmax_cross_entropy, np.zeros((n, 2), np.float16), np.zeros(n, int), np.log(2),
         np.array([-0.5, 0.5]) / n),
        (F.mean_squared_error, np.full(n, 0.01, np.float16), zeros, 0.01 ** 2, 2 * 0.01 / n),
        (F.sigmoid_cross_entropy, zeros, zeros.astype(int), np.log(2), 0.5 / n),
        (F.binary_cross_entropy, np.full(n, 0.5, np.float16), zeros, np.log(2), 2 / n),
    ]
    for loss, x, t, value, grad in cases:
        x = gradcore.Variable(x)
        y = loss(x, t)
        assert y.dtype == np.float16, loss.__name__
        np.testing.assert_allclose(float(y.data), value, rtol=1e-2, err_msg=loss.__name__)
        y.backward()
        assert x.grad.dtype == np.float16
        # float16 holds these gradients as subnormals, 6e-8 apart
        np.testing.assert_allclose(x.grad.data.astype(np.float64),
                                   np.broadcast_to(grad, x.shape), rtol=1e-2, atol=6e-8,
                                   err_msg=loss.__name__)


@pytest.mark.parametrize("loss, t", [
    (F.softmax_cross_entropy, np.zeros(0, int)),
    (F.sigmoid_cross_entropy, np.zeros((0, 3))),
    (lambda x, t: F.binary_cross_entropy(F.sigmoid(x), t), np.zeros((0, 3))),
    (F.mean_squared_error, np.zeros((0, 3))),
], ids=["softmax_cross_entropy", "sigmoid_cross_entropy", "binary_cross_entropy",
        "mean_squared_error"])
def test_the_loss_of_an_empty_batch_is_nan_with_an_empty_gradient(xp, loss, t):
    # as in PyTorch: the mean of no samples is nan, and no sample gets a gradient
    x = gradcore.Variable(xp.asarray(np.zeros((0, 3))))
    with np.errstate(invalid="ignore"):  # 0 / 0
        y = loss(x, t)
    assert np.isnan(float(xp.numpy(y.data)))
    y.backward()
    assert x.grad.shape == (0, 3) and x.grad.dtype == x.dtype and x.grad.device == x.device


# integer and bool logits, whose stable forms wrapped in their own dtype (uint8: 0 - 200 is 56)
INTEGER_LOGITS = [("uint8", [[0, 200, 1], [3, 0, 250]]), ("uint16", [[0, 200, 1], [3, 0, 250]]),
                  ("int8", [[0, -100, 100], [-128, 127, 0]]),
                  ("bool", [[True, False, True], [False, False, True]])]


@pytest.mark.filterwarnings("error")  # no overflow: exp sees x - max(x) or -|x|
@float16_backends  # the backends whose exp takes integers (array-api-strict's refuses them)
@pytest.mark.parametrize("dtype, values", INTEGER_LOGITS, ids=[d for d, _ in INTEGER_LOGITS])
def test_cross_entropies_of_integer_logits_are_computed_in_the_dtype_exp_gives(xp, dtype,
                                                                               values):
    x = np.array(values, dtype)
    result_dtype = np.exp(x[:0]).dtype  # as F.exp: uint8, int8, bool -> float16, uint16 -> float32
    wide = x.astype(np.float64)
    labels, targets = np.array([1, 2]), np.array([[1, 0, 1], [0, 1, 1]])
    # by hand: the mean over rows of logsumexp(x) - x[t]; of softplus(x) - t * x summed
    m = wide.max(axis=1)
    log_z = m + np.log(np.exp(wide - m[:, None]).sum(axis=1))
    expected_sce = np.mean(log_z - wide[[0, 1], labels])
    expected_sigmoid_ce = np.sum(np.logaddexp(0, wide) - targets * wide) / 2
    for loss, t, expected in [(F.softmax_cross_entropy, labels, expected_sce),
                              (F.sigmoid_cross_entropy, targets, expected_sigmoid_ce)]:
        y = loss(xp.asarray(x), xp.asarray(t))
        assert y.dtype == result_dtype, loss.__name__
        np.testing.assert_allclose(float(xp.numpy(y.data)), expected,
                                   rtol=4 * np.finfo(result_dtype).eps, err_msg=loss.__name__)


def test_soft_targets_beside_integer_logits_get_their_gradient():
    # the gradient of soft targets is -x / N: -x in uint8 wrapped (-200 became 56)
    x = np.array([[0, 200]], np.uint8)
    t = gradcore.Variable(np.array([[0.25, 0.75]]))
    F.sigmoid_cross_entropy(x, t).backward()
    np.testing.assert_array_equal(t.grad.data, [[0.0, -200.0]])
    # computed in the wider of float16 (uint8's) and the targets' float32: 62.25 for 62.255
    x, t = np.array([[200, 3]], np.uint8), np.array([[0.3, 0.7]], np.float32)
    y = F.sigmoid_cross_entropy(x, t)
    xf = x.astype(np.float64)
    want = (xf - t.astype(np.float64) * xf + np.log1p(np.exp(-xf))).sum()  # 140.948585
    assert y.dtype == np.float32 and abs(float(y.data) - want) < 1e-5


@pytest.mark.parametrize("dtype, x0, x1, expected", [
    ("int8", [100, -100], [0, 0], 10_000.0),        # 100 ** 2 in int8 was 16
    ("uint8", [0, 200], [200, 0], 40_000.0),        # 0 - 200 in uint8 was 56
    ("bool", [True, False], [False, False], 0.5),   # NumPy refused bool - bool
])
def test_mean_squared_error_of_integers_is_taken_in_float64(xp, dtype, x0, x1, expected):
    # float64, as the mean of integers (NumPy's, F.mean's)
    y = F.mean_squared_error(xp.asarray(x0, dtype), xp.asarray(x1, dtype))
    assert y.dtype == xp.float64
    assert float(xp.numpy(y.data)) == expected
