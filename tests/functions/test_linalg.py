"""gradcore.functions.linalg: matmul, linear, linear_simple. One row per op; tests/harness.py checks
each."""
import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from float16_backends import float16_backends
from harness import Case, check_case, directional_check, ids


def mm(a, b):
    return np.matmul(a, b)


def affine(x, W, b=None):
    return x @ W if b is None else x @ W + b


# fmt: off
CASES = [
    Case("matmul",             F.matmul,                             mm, ((2, 3), (3, 4))),
    Case("matmul-batched",     F.matmul,                             mm, ((2, 3, 4), (2, 4, 5))),
    Case("matmul-broadcast",   F.matmul,                             mm, ((2, 1, 3, 4), (5, 4, 2))),
    Case("matmul-1d-left",     F.matmul,                             mm, ((3,), (3, 4))),
    Case("matmul-1d-right",    F.matmul,                             mm, ((3, 4), (4,))),
    Case("matmul-1d-both",     F.matmul,                             mm, ((3,), (3,))),
    Case("matmul-1d-batched",  F.matmul,                             mm, ((4,), (2, 4, 3))),
    Case("matmul-batched-1d",  F.matmul,                             mm, ((2, 3, 4), (4,))),
    Case("linear",             F.linear,                             affine, ((4, 3), (3, 2), (2,))),
    Case("linear-no-bias",     F.linear,                             affine, ((4, 3), (3, 2))),
    Case("linear-row-bias",    F.linear,                             affine, ((4, 3), (3, 2), (1, 2))),
    Case("linear-one-row",     F.linear,                             affine, ((1, 3), (3, 5), (5,))),
    Case("linear_simple",      F.linear_simple,                      affine, ((4, 3), (3, 2), (2,))),
    Case("linear_simple-no-b", F.linear_simple,                      affine, ((4, 3), (3, 2))),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_op(case, xp):
    check_case(case, xp)


@pytest.mark.parametrize("batch", [(), (5,), (2, 5), (2, 1, 3)],
                         ids=["one example", "rows", "3-d", "4-d"])
def test_linear_agrees_with_linear_simple(xp, batch):
    """The fused op against its composition: same value, same first and second derivatives;
    x (..., in) or (in,) as PyTorch's (refused where it was not 2-d)."""
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(s) for s in ((*batch, 4), (4, 3), (3,))]
    xs = [gradcore.Variable(xp.asarray(a)) for a in arrays]
    ys = [gradcore.Variable(xp.asarray(a)) for a in arrays]
    w = xp.asarray(rng.standard_normal((*batch, 3)))
    fused, simple = F.linear(*xs), F.linear_simple(*ys)
    np.testing.assert_allclose(xp.numpy(fused.data), xp.numpy(simple.data), rtol=1e-12)
    g_fused = gradcore.grad(fused, xs, grad_outputs=w, create_graph=True)
    g_simple = gradcore.grad(simple, ys, grad_outputs=w, create_graph=True)
    for a, b in zip(g_fused, g_simple):
        np.testing.assert_allclose(xp.numpy(a.data), xp.numpy(b.data), rtol=1e-12)
    # second order: d/dW sum(gx**2), through both
    (h_fused,) = gradcore.grad(F.sum(g_fused[0] ** 2), [xs[1]])
    (h_simple,) = gradcore.grad(F.sum(g_simple[0] ** 2), [ys[1]])
    np.testing.assert_allclose(xp.numpy(h_fused.data), xp.numpy(h_simple.data), rtol=1e-12)


def test_linear_bias_gradient_is_summed_over_the_batch(xp):
    x = gradcore.Variable(xp.asarray(np.ones((4, 3))))
    W = gradcore.Variable(xp.asarray(np.ones((3, 2))))
    b = gradcore.Variable(xp.asarray(np.zeros(2)))
    F.linear(x, W, b).backward()
    np.testing.assert_array_equal(xp.numpy(b.grad.data), [4.0, 4.0])
    directional_check(lambda W, b: F.linear(x, W, b), [np.ones((3, 2)), np.zeros(2)], xp,
                      np.random.default_rng(0))


def test_float32_matmul_and_linear_with_integer_constants_stay_float32(xp):
    # the rule of + - * /: an int64 batch into a float32 layer gave float64 (NumPy's promotion),
    # and so the rest of the network ran in float64
    ints = xp.asarray([[1, 2, 3], [0, -1, 4]])  # (2, 3) int64
    W = gradcore.Variable(xp.asarray(np.arange(6.0).reshape(3, 2), dtype="float32"))
    b = gradcore.Variable(xp.asarray([0.5, -0.5], dtype="float32"))
    expected = np.array([[16.0, 22.0], [14.0, 17.0]])  # ints @ W
    for y in (F.matmul(ints, W), F.linear(ints, W), F.linear(ints, W, b) - b,
              F.linear_simple(ints, W, b) - b):
        assert y.dtype == xp.float32
        np.testing.assert_array_equal(xp.numpy(y.data), expected)
    F.sum(F.linear(ints, W, b)).backward()
    assert W.grad.dtype == b.grad.dtype == xp.float32
    np.testing.assert_array_equal(xp.numpy(W.grad.data), [[1.0, 1.0], [1.0, 1.0], [7.0, 7.0]])
    # the float32 Variable on either side, and an integer bias
    x = gradcore.Variable(xp.asarray(np.ones((2, 2)), dtype="float32"))
    for y in (F.matmul(x, ints), F.matmul(xp.asarray([[1, 0]]), x),
              F.linear(x, xp.asarray([[1, 2], [3, 4]]), xp.asarray([1, 1]))):
        assert y.dtype == xp.float32
        F.sum(y).backward()
        assert x.grad.dtype == xp.float32
        x.cleargrad()
    np.testing.assert_array_equal(xp.numpy(F.matmul(x, ints).data), [[1, 1, 7], [1, 1, 7]])
    # an integer Variable is not a constant: it promotes, as in + - * / (the README's rule)
    if xp.name == "numpy":
        assert F.matmul(gradcore.Variable(np.array([[1, 2, 3]])), W).dtype == np.float64


@pytest.mark.parametrize("op, shapes, message", [
    (F.matmul, ((2, 3), (4, 5)), r"matmul: shapes \(2, 3\) and \(4, 5\) do not match: the last axis of x \(3\) must equal the second-to-last axis of W \(4\)"),
    (F.matmul, ((2, 3), (4,)), r"matmul: shapes \(2, 3\) and \(4,\) do not match: .* the only axis of W \(4\)"),
    (F.matmul, ((), (4,)), r"matmul: matmul needs inputs of at least one dimension"),
    (F.linear, ((2, 3), (4, 5)), r"linear: x \(2, 3\) and W \(4, 5\) do not match: x.shape\[-1\] \(3\) must equal W.shape\[0\] \(4\)"),
    (F.linear, ((3,), (3, 5, 1)), r"linear: x must be \(in,\), \(batch, in\) or \(\.\.\., "
     r"in\) and W 2-d \(in, out\); got x \(3,\) and W \(3, 5, 1\)"),
    (F.linear, ((2, 2, 3), (3, 5), (3, 2, 5)), r"linear: b \(3, 2, 5\) does not broadcast to the output \(2, 2, 5\)"),
    (F.linear, ((2, 3), (3, 5), (4,)), r"linear: b \(4,\) does not broadcast to the output \(2, 5\)"),
])
def test_linear_algebra_rejects_mismatched_shapes(xp, op, shapes, message):
    xs = [gradcore.Variable(xp.asarray(np.ones(s))) for s in shapes]
    with pytest.raises(ValueError, match=message):
        op(*xs)
    assert all(x.creator is None and x.grad is None for x in xs)


@pytest.mark.parametrize("number", [np.float32(2.0), np.float64(2.0), np.int64(2), 2.0, 2],
                         ids=["np.float32", "np.float64", "np.int64", "float", "int"])
def test_a_number_for_x_or_W_gets_the_0d_error(xp, number):
    # a NumPy scalar reaches forward as a Python number: the same error as a 0-d array
    W = gradcore.Variable(xp.asarray(np.ones((1, 3), dtype=np.float32)))
    zero_d = gradcore.Variable(xp.asarray(np.array(2.0, dtype=np.float32)))
    got_x = (r"linear: x must be \(in,\), \(batch, in\) or \(\.\.\., in\) and W 2-d "
             r"\(in, out\); got x "
             r"\(\) and W \(1, 3\) \(reshape x, e.g. flatten\)")
    for x in (zero_d, number):
        with pytest.raises(ValueError, match=got_x):
            F.linear(x, W)
    with pytest.raises(ValueError, match=got_x):
        gradcore.nn.Linear(1, 3)(number)
    with pytest.raises(ValueError, match=r"linear: x must be .*; got x \(1, 3\) and W \(\)"):
        F.linear(W, number)
    for args in ((number, W), (W, number)):
        with pytest.raises(ValueError, match="matmul: matmul needs inputs of at least one "
                           "dimension; use mul for scalars"):
            F.matmul(*args)


@float16_backends
def test_linear_bias_gradient_of_float16_is_summed_in_float32(xp):
    x = gradcore.Variable(xp.asarray(np.zeros((10_000, 2)), dtype="float16"))
    W = gradcore.Variable(xp.asarray(np.zeros((2, 2)), dtype="float16"))
    b = gradcore.Variable(xp.asarray(np.zeros(2), dtype="float16"))
    F.linear(x, W, b).backward(xp.asarray(np.full((10_000, 2), 0.1), dtype="float16"))
    assert b.grad.dtype == xp.float16
    np.testing.assert_array_equal(xp.numpy(b.grad.data), [1000.0, 1000.0])  # not 256
