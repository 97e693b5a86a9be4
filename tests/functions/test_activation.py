"""gradcore.functions.activation: sigmoid, relu, leaky_relu, softmax, log_softmax and the composite
twins. One row per op; tests/harness.py checks each. Then: fused ops against their twins, large
inputs, kinks, errors."""
import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from float16_backends import float16_backends
from harness import Case, check_case, ids


def np_sigmoid(x):
    return 1 / (1 + np.exp(-x))


def np_softmax(x, axis=1):
    # initial=-inf: the max over an empty axis is -inf instead of an error (an empty result)
    e = np.exp(x - x.max(axis=axis, keepdims=True, initial=-np.inf))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(x, axis=1):
    s = x - x.max(axis=axis, keepdims=True, initial=-np.inf)
    with np.errstate(divide="ignore"):  # the log of an empty axis's sum, 0 (an empty result)
        return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


def np_leaky_relu(x, slope=0.2):
    return np.where(x > 0, x, slope * x)


# fmt: off
CASES = [
    Case("sigmoid",              F.sigmoid,                              np_sigmoid, ((2, 3),)),
    Case("sigmoid-wide",         F.sigmoid,                              np_sigmoid, ((3, 4),), (-30.0, 30.0)),
    Case("sigmoid-0-d",          F.sigmoid,                              np_sigmoid, ((),)),
    Case("sigmoid_simple",       F.sigmoid_simple,                       np_sigmoid, ((2, 3),)),
    Case("relu",                 F.relu,                                 lambda x: np.maximum(x, 0), ((3, 4),)),
    Case("relu-0-d",             F.relu,                                 lambda x: np.maximum(x, 0), ((),), (0.5, 2.0)),
    Case("leaky_relu",           F.leaky_relu,                           np_leaky_relu, ((3, 4),)),
    Case("leaky_relu-slope",     lambda x: F.leaky_relu(x, slope=0.05),  lambda x: np_leaky_relu(x, 0.05), ((3, 4),)),
    Case("softmax",              F.softmax,                              np_softmax, ((2, 3),)),
    Case("softmax-axis0",        lambda x: F.softmax(x, axis=0),         lambda x: np_softmax(x, 0), ((3, 2),)),
    Case("softmax-last",         lambda x: F.softmax(x, axis=-1),        lambda x: np_softmax(x, -1), ((2, 3, 4),)),
    Case("softmax-axes",         lambda x: F.softmax(x, axis=(1, 2)),    lambda x: np_softmax(x, (1, 2)), ((2, 3, 2),)),
    Case("softmax-wide",         F.softmax,                              np_softmax, ((3, 4),), (-50.0, 50.0)),
    # empty inputs: an empty result; the axis empty (3, 0), (0, 4) axis 0, all axes; or another
    Case("softmax-empty-axis",   F.softmax,                              np_softmax, ((3, 0),)),
    Case("softmax-empty-axis0",  lambda x: F.softmax(x, axis=0),         lambda x: np_softmax(x, 0), ((0, 4),)),
    Case("softmax-empty-all",    lambda x: F.softmax(x, axis=None),      lambda x: np_softmax(x, None), ((2, 0, 3),)),
    Case("softmax-empty-other",  F.softmax,                              np_softmax, ((0, 4),)),
    Case("softmax_simple",       F.softmax_simple,                       np_softmax, ((2, 3),)),
    Case("softmax_simple-axis0", lambda x: F.softmax_simple(x, axis=0),  lambda x: np_softmax(x, 0), ((3, 2),)),
    Case("log_softmax",          F.log_softmax,                          np_log_softmax, ((2, 3),)),
    Case("log_softmax-last",     lambda x: F.log_softmax(x, axis=-1),    lambda x: np_log_softmax(x, -1), ((2, 3, 4),)),
    Case("log_softmax-wide",     F.log_softmax,                          np_log_softmax, ((3, 4),), (-50.0, 50.0)),
    Case("log_softmax-empty-axis",  F.log_softmax,                      np_log_softmax, ((3, 0),)),
    Case("log_softmax-empty-axis0", lambda x: F.log_softmax(x, axis=0), lambda x: np_log_softmax(x, 0), ((0, 4),)),
    Case("log_softmax-empty-all",   lambda x: F.log_softmax(x, axis=None), lambda x: np_log_softmax(x, None), ((2, 0, 3),)),
    Case("log_softmax-empty-other", F.log_softmax,                      np_log_softmax, ((0, 4),)),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_op(case, xp):
    check_case(case, xp)


# =============================================================================== fused ops vs twins
def derivatives(f, x, xp, seed=0):
    """f(x), the gradient of sum(w * f(x)), and the gradient of <that gradient, u>: NumPy arrays."""
    rng = np.random.default_rng(seed)
    v = gradcore.Variable(xp.asarray(x))
    y = f(v)
    w = gradcore.Variable(xp.asarray(rng.standard_normal(y.shape)), requires_grad=False)
    u = xp.asarray(rng.standard_normal(x.shape))
    g, = gradcore.grad(F.sum(y * w), v, create_graph=True)
    h, = gradcore.grad(F.sum(g * u), v)
    return xp.numpy(y.data), xp.numpy(g.data), xp.numpy(h.data)


@pytest.mark.parametrize("fused, twin", [
    (F.sigmoid, F.sigmoid_simple),
    (F.softmax, F.softmax_simple),
    (lambda x: F.softmax(x, axis=0), lambda x: F.softmax_simple(x, axis=0)),
    (lambda x: F.softmax(x, axis=(0, 1)), lambda x: F.softmax_simple(x, axis=(0, 1))),
    (F.log_softmax, lambda x: F.log(F.softmax_simple(x))),
], ids=["sigmoid", "softmax", "softmax-axis0", "softmax-axes", "log_softmax"])
def test_fused_op_agrees_with_its_twin(xp2, fused, twin):
    x = np.random.default_rng(1).uniform(-3, 3, size=(4, 5))
    for a, b in zip(derivatives(fused, x, xp2), derivatives(twin, x, xp2)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


# =============================================================================== large inputs
@pytest.mark.filterwarnings("error")  # no overflow, no 0 * inf
def test_sigmoid_is_exact_for_large_inputs(xp):
    for dtype in ("float64", "float32"):
        x = gradcore.Variable(xp.asarray([-1000.0, -50.0, 0.0, 50.0, 1000.0], dtype=dtype))
        y = F.sigmoid(x)
        y.backward()
        assert y.dtype == x.dtype and x.grad.dtype == x.dtype
        e = np.exp(-50.0)
        expected = np.array([0.0, e / (1 + e), 0.5, 1 / (1 + e), 1.0])
        tol = 1e-6 if dtype == "float32" else 1e-15
        np.testing.assert_allclose(xp.numpy(y.data), expected, rtol=tol)
        assert xp.numpy(y.data)[1] > 0  # e^-50 is kept, not rounded to 0
        np.testing.assert_allclose(xp.numpy(x.grad.data), expected * (1 - expected), rtol=1e-5)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_softmax_and_log_softmax_are_stable_for_large_inputs(xp, dtype):
    raw = np.array([[1000.0, 999.0, -1000.0], [-1000.0, -1000.0, -1001.0]])
    w = xp.asarray(np.array([[1.0, 2.0, 3.0]]), dtype=dtype)

    def run(data):
        x = gradcore.Variable(xp.asarray(data, dtype=dtype))
        y, log_y = F.softmax(x), F.log_softmax(x)
        (F.sum(y * w) + F.sum(log_y * w)).backward()
        assert y.dtype == log_y.dtype == x.grad.dtype == x.dtype
        return xp.numpy(y.data), xp.numpy(log_y.data), xp.numpy(x.grad.data)

    y, log_y, grad = run(raw)
    tol = 1e-6 if dtype == "float32" else 1e-14
    e1 = np.exp(-1.0)
    expected = [[1 / (1 + e1), e1 / (1 + e1), 0.0], [1 / (2 + e1), 1 / (2 + e1), e1 / (2 + e1)]]
    np.testing.assert_allclose(y, expected, rtol=tol)
    np.testing.assert_allclose(log_y, [[-np.log1p(e1), -1 - np.log1p(e1), -2000 - np.log1p(e1)],
                                       [-np.log(2 + e1), -np.log(2 + e1), -1 - np.log(2 + e1)]],
                               rtol=tol)
    # both are invariant to shifting a row: the same values and gradients from moderate inputs
    for a, b in zip((y, log_y, grad), run(raw - raw.max(axis=1, keepdims=True))):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


# =============================================================================== kinks and slopes
def test_relu_and_leaky_relu_gradients_at_the_kink(xp):
    x = gradcore.Variable(xp.asarray([-1.0, 0.0, 2.0]))
    F.relu(x).backward()
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [0.0, 0.0, 1.0])
    x.cleargrad()
    y = F.leaky_relu(x, slope=0.1)
    y.backward()
    np.testing.assert_array_equal(xp.numpy(y.data), [-0.1, 0.0, 2.0])
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [0.1, 0.1, 1.0])


def test_relu_of_minus_infinity_is_zero(xp):
    y = F.relu(gradcore.Variable(xp.asarray([-np.inf, np.inf])))
    np.testing.assert_array_equal(xp.numpy(y.data), [0.0, np.inf])


def test_sigmoid_second_derivative(xp):
    """d2 sigmoid = y (1 - y) (1 - 2y), through the backward that reuses y."""
    x = gradcore.Variable(xp.asarray([-1.5, 0.3, 2.0]))
    y = F.sigmoid(x)
    g, = gradcore.grad(F.sum(y), x, create_graph=True)
    h, = gradcore.grad(F.sum(g), x)
    s = np_sigmoid(np.array([-1.5, 0.3, 2.0]))
    np.testing.assert_allclose(xp.numpy(h.data), s * (1 - s) * (1 - 2 * s), rtol=1e-14)


# =============================================================================== errors
@pytest.mark.parametrize("op", [F.softmax, F.log_softmax])
def test_softmax_axis_out_of_range(xp, op):
    name = op.__name__
    x = gradcore.Variable(xp.asarray([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=rf"{name}: axis 1 is out of range for a 1-d input.*"
                                         r"axis=-1.*\(inputs: \(3,\)\)"):
        op(x)
    assert x.grad is None
    np.testing.assert_allclose(xp.numpy(op(x, axis=-1).data),
                               (np_softmax if name == "softmax" else np_log_softmax)(
                                   np.array([1.0, 2.0, 3.0]), -1))


def test_leaky_relu_slope_must_be_a_number():
    x = gradcore.Variable(np.ones(3))
    with pytest.raises(TypeError, match="leaky_relu: slope must be a number, got ndarray"):
        F.leaky_relu(x, slope=np.ones(3))


def test_leaky_relu_refuses_integer_input(xp):
    # in int64 the slope 0.5 would be 0: [-1, 2] would give [0, 2] (PyTorch refuses too)
    x = gradcore.Variable(xp.asarray([-1, 2]))
    with pytest.raises(TypeError, match=r"leaky_relu: x must be a floating-point array, got "
                                        r".*int.*; cast it first"):
        F.leaky_relu(x, 0.5)
    y = F.leaky_relu(F.astype(x, "float64"), 0.5)
    np.testing.assert_array_equal(xp.numpy(y.data), [-0.5, 2.0])


def test_softmax_family_of_float16_sums_in_float32():
    # over a 70,000-wide axis the sum of exp() passes float16's 65,504: it is taken in float32,
    # as PyTorch does, and the result cast back
    x = gradcore.Variable(np.zeros((2, 70_000), np.float16))
    p = F.softmax(x, axis=1)
    assert p.dtype == np.float16
    np.testing.assert_array_equal(p.data, np.float16(1 / 70_000))
    np.testing.assert_allclose(F.log_softmax(x, axis=1).data, -np.log(70_000), rtol=1e-3)
    lse = F.logsumexp(x, axis=1)
    assert lse.dtype == np.float16
    np.testing.assert_allclose(lse.data, np.log(70_000), rtol=1e-3)
    F.sum(lse).backward()  # d logsumexp = softmax, normalised in float32 too
    np.testing.assert_array_equal(x.grad.data, np.float16(1 / 70_000))


def test_relu_passes_the_gradient_at_nan(xp):
    # as torch.relu: 1 at NaN (and where x > 0), 0 where x <= 0
    x = gradcore.Variable(xp.asarray([np.nan, 2.0, 0.0, -1.0, np.inf, -np.inf]))
    y = F.relu(x)
    np.testing.assert_array_equal(xp.numpy(y.data), [np.nan, 2.0, 0.0, 0.0, np.inf, 0.0])
    F.sum(y).backward()
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [1.0, 1.0, 0.0, 0.0, 1.0, 0.0])


@float16_backends
def test_log_softmax_gradient_of_float16_sums_in_float32(xp):
    # the gradient of sum(log_softmax(x)) is 1 - softmax(x) * sum(gy) = 1 - 70,000 / 70,000:
    # sum(gy) is inf in float16, where softmax times it is 1
    x = gradcore.Variable(xp.asarray(np.zeros((2, 70_000)), dtype="float16"))
    F.log_softmax(x).backward()
    assert x.grad.dtype == xp.float16
    # float16 rounds 1 / 70,000 and 70,000 times it to within 1e-3
    np.testing.assert_allclose(xp.numpy(x.grad.data), 0.0, atol=2e-3)


# integer and bool rows whose stable forms wrapped in x's own dtype (uint8: 0 - 200 is 56)
INTEGER_INPUTS = [("uint8", [[0, 200, 1]]), ("uint16", [[0, 200, 1]]), ("uint32", [[0, 200, 1]]),
                  ("int8", [[0, -128, 100]]), ("bool", [[True, False, True]])]


@pytest.mark.filterwarnings("error")  # no overflow: exp sees x - max(x) or -|x|
@float16_backends  # the backends whose exp takes integers (array-api-strict's refuses them)
@pytest.mark.parametrize("op, reference", [(F.sigmoid, np_sigmoid), (F.softmax, np_softmax),
                                           (F.log_softmax, np_log_softmax)],
                         ids=["sigmoid", "softmax", "log_softmax"])
@pytest.mark.parametrize("dtype, values", INTEGER_INPUTS, ids=[d for d, _ in INTEGER_INPUTS])
def test_integer_input_is_computed_in_the_dtype_exp_gives_it(xp, op, reference, dtype, values):
    x = np.array(values, dtype)
    result_dtype = np.exp(x[:0]).dtype  # as F.exp: uint8, int8, bool -> float16, uint16 -> float32
    y = op(xp.asarray(x))
    assert y.dtype == result_dtype
    np.testing.assert_allclose(xp.numpy(y.data), reference(x.astype(np.float64)),
                               rtol=4 * np.finfo(result_dtype).eps,
                               atol=np.finfo(result_dtype).tiny)  # exp(-200) underflows
