"""gradcore.functions.reduce: sum, average, mean, max, min, logsumexp. One row per op;
tests/harness.py checks each. Then: ties, large inputs, bad axes, empty inputs."""
import warnings

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from float16_backends import float16_backends
from harness import Case, check_case, ids


def lse(x, axis=1, keepdims=True):
    m = np.max(x, axis=axis, keepdims=True)
    y = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return y if keepdims else np.squeeze(y, axis)


# fmt: off
CASES = [
    Case("sum",                F.sum,                                np.sum, ((2, 3),)),
    Case("sum-axis",           lambda x: F.sum(x, axis=1),           lambda x: x.sum(axis=1), ((2, 3, 4),)),
    Case("sum-neg-axis",       lambda x: F.sum(x, axis=-1),          lambda x: x.sum(axis=-1), ((2, 3),)),
    Case("sum-keepdims",       lambda x: F.sum(x, (0, 2), True),     lambda x: x.sum((0, 2), keepdims=True), ((2, 3, 4),)),
    Case("sum-0-d",            F.sum,                                np.sum, ((),)),
    Case("average",            F.average,                            np.mean, ((2, 3),)),
    Case("average-axis",       lambda x: F.average(x, 1),            lambda x: x.mean(1), ((2, 3, 4),)),
    Case("average-tuple",      lambda x: F.average(x, (0, -1), True), lambda x: x.mean((0, 2), keepdims=True), ((2, 3, 4),)),
    Case("mean",               F.mean,                               np.mean, ((3, 4),)),
    Case("mean-axis",          lambda x: F.mean(x, axis=-2),         lambda x: x.mean(-2), ((3, 4),)),
    Case("mean-empty-other",   lambda x: F.mean(x, axis=0),          lambda x: x.mean(0), ((3, 0),)),
    # max and min: random data, so no ties (the tie rule has its own test)
    Case("max",                F.max,                                np.max, ((2, 3),)),
    Case("max-axis",           lambda x: F.max(x, axis=1),           lambda x: x.max(1), ((2, 3, 4),)),
    Case("max-keepdims",       lambda x: F.max(x, (0, -1), True),    lambda x: x.max((0, 2), keepdims=True), ((2, 3, 4),)),
    Case("max-0-d",            F.max,                                np.max, ((),)),
    Case("min",                F.min,                                np.min, ((2, 3),)),
    Case("min-axis",           lambda x: F.min(x, axis=-1),          lambda x: x.min(-1), ((3, 4),)),
    Case("logsumexp",          F.logsumexp,                          lse, ((2, 3),)),
    Case("logsumexp-axis0",    lambda x: F.logsumexp(x, 0, False),   lambda x: lse(x, 0, False), ((3, 4),)),
    Case("logsumexp-tuple",    lambda x: F.logsumexp(x, (0, -1)),    lambda x: lse(x, (0, 2)), ((2, 3, 4),)),
    Case("logsumexp-large",    F.logsumexp,                          lse, ((3, 4),), (998.0, 1002.0)),
    Case("logsumexp-empty",    F.logsumexp,                          lse, ((0, 4),)),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_op(case, xp):
    check_case(case, xp)


# =============================================================================== special cases
@pytest.mark.parametrize("op", [F.max, F.min])
def test_max_and_min_share_the_gradient_among_ties(xp, op):
    x = gradcore.Variable(xp.asarray([[1.0, 3.0, 3.0, 2.0], [0.0, 0.0, 0.0, 5.0]]))
    op(x, axis=1).backward(grad=xp.asarray([2.0, 3.0]))
    expected = ([[0, 1, 1, 0], [0, 0, 0, 3]] if op is F.max else [[2, 0, 0, 0], [1, 1, 1, 0]])
    np.testing.assert_array_equal(xp.numpy(x.grad.data), expected)
    assert x.grad.data.dtype == x.data.dtype


@pytest.mark.parametrize("op", [F.max, F.min])
def test_max_and_min_send_the_gradient_of_a_nan_extreme_to_the_nans(xp, op):
    # as torch.max(): a NaN is the extreme of its slice and takes gy (shared among NaNs); the
    # other elements get 0, not the NaN of 0 ties (torch.amax gives the whole slice NaN)
    nan = np.nan
    for data, full in [([[1.0, nan, 2.0], [3.0, 3.0, 1.0]], [[0, 1, 0], [0, 0, 0]]),
                       ([[1.0, nan, nan], [3.0, 3.0, 1.0]], [[0, 0.5, 0.5], [0, 0, 0]])]:
        x = gradcore.Variable(xp.asarray(data))
        op(x).backward()
        np.testing.assert_array_equal(xp.numpy(x.grad.data), full)
    x = gradcore.Variable(xp.asarray([[1.0, nan, 2.0], [3.0, 3.0, 1.0]]))
    op(x, axis=1).backward(grad=xp.asarray([2.0, 3.0]))
    rows = [[0, 2, 0], [1.5, 1.5, 0]] if op is F.max else [[0, 2, 0], [0, 0, 3]]
    np.testing.assert_array_equal(xp.numpy(x.grad.data), rows)


def test_logsumexp_is_stable_for_large_and_small_inputs(xp):
    data = np.array([[1000.0, 1000.0, 1000.0], [-1000.0, -1001.0, -np.inf]])
    for dtype in ("float64", "float32"):
        x = gradcore.Variable(xp.asarray(data, dtype=dtype))
        y = F.logsumexp(x)  # DeZero's default: axis=1, reduced axis kept
        assert y.shape == (2, 1) and y.dtype == x.dtype
        expected = [[1000.0 + np.log(3.0)], [-1000.0 + np.log1p(np.exp(-1.0))]]
        np.testing.assert_allclose(xp.numpy(y.data), expected, rtol=1e-6)
        y.backward()
        softmax = [[1 / 3, 1 / 3, 1 / 3], [1 / (1 + np.exp(-1)), 1 - 1 / (1 + np.exp(-1)), 0.0]]
        np.testing.assert_allclose(xp.numpy(x.grad.data), softmax, rtol=1e-6)
    row = gradcore.Variable(xp.asarray(np.full((1, 2), -np.inf)))
    with np.errstate(divide="ignore"):  # log(0): the sum of exp(-inf) is 0
        np.testing.assert_array_equal(xp.numpy(F.logsumexp(row).data), [[-np.inf]])


@pytest.mark.parametrize("op, name", [
    (lambda x, a: F.sum(x, a), "sum"), (lambda x, a: F.average(x, a), "average"),
    (lambda x, a: F.mean(x, a), "average"), (lambda x, a: F.max(x, a), "max"),
    (lambda x, a: F.min(x, a), "min"), (lambda x, a: F.logsumexp(x, a), "logsumexp"),
])
def test_reductions_reject_a_bad_axis(xp, op, name):
    x = gradcore.Variable(xp.asarray(np.ones((2, 3))))
    with pytest.raises(ValueError, match=rf"{name}: axis 2 is out of range for an array of 2 dimension"):
        op(x, 2)
    with pytest.raises(ValueError, match=rf"{name}: axis -3 is out of range"):
        op(x, (0, -3))
    with pytest.raises(ValueError, match=rf"{name}: repeated axis in \(1, -1\)"):
        op(x, (1, -1))
    with pytest.raises(TypeError, match=rf"{name}: axis must be None, an int or a tuple of ints, got 1.0"):
        op(x, 1.0)
    assert x.creator is None and x.grad is None
    with pytest.raises(ValueError, match=rf"{name}: axis 0 is out of range .* \(inputs: 0-d\)"):
        op(gradcore.Variable(xp.asarray(np.array(2.0))), 0)  # a 0-d input said as such


# =============================================================================== empty inputs
# (shape, axis, keepdims): an empty axis reduced; or (last rows) another axis empty, as a guard
EMPTY = [((0,), None, False), ((3, 0), None, False), ((3, 0), 1, False), ((3, 0), 1, True),
         ((0, 4), 0, False), ((0, 4), (0, 1), True), ((2, 0, 3), -2, False),
         ((3, 0), 0, False), ((0, 4), 1, True)]
EMPTY_IDS = ["0-all", "3x0-all", "3x0-axis1", "3x0-axis1-kept", "0x4-axis0", "0x4-both-kept",
             "2x0x3-axis-2", "3x0-axis0-other", "0x4-axis1-other-kept"]


@pytest.mark.filterwarnings("error")  # NumPy warns on the mean of nothing; gradcore need not
@pytest.mark.parametrize("op", [F.mean, F.average])
@pytest.mark.parametrize("shape, axis, keepdims", EMPTY, ids=EMPTY_IDS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_mean_of_nothing_is_nan_like_numpy(xp, op, shape, axis, keepdims, dtype):
    x = gradcore.Variable(xp.asarray(np.ones(shape), dtype=dtype))
    y = op(x, axis, keepdims)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "Mean of empty slice"
        expected = np.mean(np.ones(shape, dtype=dtype), axis=axis, keepdims=keepdims)
    assert y.shape == expected.shape and y.dtype == x.dtype
    np.testing.assert_array_equal(xp.numpy(y.data), expected)  # nan where NumPy has nan
    y.backward()  # every input element is in an empty mean: nothing to receive
    assert x.grad.shape == x.shape and x.grad.dtype == x.dtype and x.grad.device == x.device


@pytest.mark.filterwarnings("error")  # no log(0) warning: -inf is the answer, not an accident
@pytest.mark.parametrize("shape, axis, keepdims", EMPTY, ids=EMPTY_IDS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_logsumexp_of_nothing_is_minus_infinity(xp, shape, axis, keepdims, dtype):
    x = gradcore.Variable(xp.asarray(np.ones(shape), dtype=dtype))
    y = F.logsumexp(x, axis, keepdims)
    # the log of an empty sum, as scipy.special.logsumexp and torch.logsumexp give (an input
    # empty along another axis: an empty result)
    expected = np.full(np.sum(np.ones(shape), axis=axis, keepdims=keepdims).shape, -np.inf)
    assert y.shape == expected.shape and y.dtype == x.dtype
    np.testing.assert_array_equal(xp.numpy(y.data), expected)
    y.backward()
    assert x.grad.shape == x.shape and x.grad.dtype == x.dtype and x.grad.device == x.device
    gx, = gradcore.grad(F.sum(F.logsumexp(x, axis, keepdims)), x, create_graph=True)
    F.sum(gx).backward()  # and again: the gradient of an empty softmax
    assert gx.shape == x.shape


@pytest.mark.parametrize("op", [F.max, F.min])
@pytest.mark.parametrize("shape, axis", [((2, 0), 1), ((2, 0), None), ((0, 4), 0)])
def test_max_and_min_of_an_empty_axis_are_an_error(xp, op, shape, axis):
    name = op.__name__
    x = gradcore.Variable(xp.asarray(np.ones(shape)))
    with pytest.raises(ValueError, match=f"{name}: cannot take the {name} over an empty axis"):
        op(x, axis=axis)
    rows = gradcore.Variable(xp.asarray(np.ones((0, 4))))
    assert op(rows, axis=1).shape == (0,)  # another axis empty: an empty result


@pytest.mark.parametrize("op", [F.max, F.min])
def test_max_and_min_over_rows_of_nothing_on_dask_are_empty(op):
    da = pytest.importorskip("dask.array")
    x = gradcore.Variable(da.from_array(np.ones((0, 4)), chunks=-1))
    y = op(x, axis=1)
    F.sum(y).backward()  # Dask's own max of a (0, 4) array raises at compute: no identity
    assert y.data.compute().shape == (0,) and x.grad.data.compute().shape == (0, 4)


def test_mean_of_float16_accumulates_in_float32():
    # 100,000 ones sum to inf in float16; NumPy's mean and torch.mean accumulate in float32
    x = gradcore.Variable(np.ones(100_000, np.float16))
    y = F.mean(x)
    assert y.dtype == np.float16 and float(y.data) == 1.0
    y.backward()
    assert x.grad.dtype == np.float16
    np.testing.assert_array_equal(x.grad.data, np.float16(1 / 100_000))
    images = gradcore.Variable(np.full((4, 256, 256), 0.5, np.float16))  # 65,536 per mean
    y = F.average(images, axis=(1, 2))
    np.testing.assert_array_equal(y.data, [0.5, 0.5, 0.5, 0.5])
    assert y.dtype == np.float16
    F.sum(y).backward()
    np.testing.assert_array_equal(images.grad.data, np.float16(1 / 65_536))


@float16_backends
def test_sum_of_float16_accumulates_in_float32(xp):
    # NumPy adds along a strided axis one value at a time: in float16, 10,000 times 0.1 is 256
    x = gradcore.Variable(xp.asarray(np.full((10_000, 2), 0.1), dtype="float16"))
    y = F.sum(x, axis=0)
    assert y.dtype == xp.float16
    np.testing.assert_array_equal(xp.numpy(y.data), [1000.0, 1000.0])  # 999.76 in float16
    y.backward()
    assert x.grad.dtype == xp.float16
    np.testing.assert_array_equal(xp.numpy(x.grad.data), np.ones((10_000, 2)))


@float16_backends
@pytest.mark.parametrize("op", [F.max, F.min])
@pytest.mark.parametrize("shape, axis", [((3_000, 2), 0), ((70_000,), None)])
def test_max_and_min_of_float16_count_ties_in_float32(xp, op, shape, axis):
    # counted in float16, 3,000 tied zeros along axis 0 stop at 2,048 (shares adding to 1.46)
    # and 70,000 are inf (every share 0)
    x = gradcore.Variable(xp.zeros(shape, dtype=xp.float16))
    op(x, axis=axis).backward()
    assert x.grad.dtype == xp.float16
    n = shape[0]
    np.testing.assert_array_equal(xp.numpy(x.grad.data), np.full(shape, np.float16(1 / n)))


@pytest.mark.parametrize("op", [F.mean, F.average])
@pytest.mark.parametrize("values", [[1, 2, 4], [True, False, True]], ids=["int", "bool"])
def test_mean_of_integers_is_taken_in_float64_like_numpy(xp, op, values):
    # the array API refuses an integer sum times a Python float: "mul: Python float scalars can
    # only be promoted with floating-point arrays", from a mean the caller never wrote as mul
    y = op(gradcore.Variable(xp.asarray(values)))
    assert y.dtype == xp.float64
    np.testing.assert_allclose(xp.numpy(y.data), np.mean(values), rtol=4e-16)  # 7 * (1 / 3)


@pytest.mark.skipif(np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps,
                    reason="longdouble is float64 on this platform")
def test_mean_of_longdouble_keeps_its_digits():
    # 1 / 3 as a Python float is rounded to double: the mean of three ones would be 1 - 5.6e-17
    x = gradcore.Variable(np.ones(3, np.longdouble))
    y = F.mean(x)
    assert y.dtype == np.longdouble and y.data == 1
    y.backward()
    np.testing.assert_array_equal(x.grad.data, np.full(3, np.longdouble(1) / 3))


@pytest.mark.parametrize("op", [F.max, F.min])
@pytest.mark.parametrize("shape, axis, keepdims, result_shape", [
    ((0, 3), 1, False, (0,)), ((3, 0), 0, False, (0,)), ((0, 3), 1, True, (0, 1))])
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "float32"])
def test_max_and_min_over_rows_of_nothing_keep_the_dtype(xp, op, shape, axis, keepdims,
                                                         result_shape, dtype):
    # as for any other shape: not the int64 (uint64) a sum of the empty rows would give
    y = op(gradcore.Variable(xp.asarray(np.zeros(shape), dtype)), axis=axis, keepdims=keepdims)
    assert y.dtype == xp.asarray(np.zeros(1), dtype).dtype and y.shape == result_shape


@pytest.mark.filterwarnings("error")  # no overflow: exp sees x - max(x) or -|x|
@float16_backends  # the backends whose exp takes integers (array-api-strict's refuses them)
@pytest.mark.parametrize("dtype, values", [("uint8", [[0, 200, 1]]), ("uint16", [[0, 200, 1]]),
                                           ("int8", [[0, -100, 100]]),
                                           ("bool", [[True, False, True]])],
                         ids=["uint8", "uint16", "int8", "bool"])
def test_logsumexp_of_integers_is_computed_in_the_dtype_exp_gives_them(xp, dtype, values):
    # x - max(x) in uint8 wrapped: 0 - 200 is 56, and the result was inf
    x = np.array(values, dtype)
    result_dtype = np.exp(x[:0]).dtype  # as F.exp: uint8, int8, bool -> float16, uint16 -> float32
    y = F.logsumexp(xp.asarray(x))
    assert y.dtype == result_dtype
    wide = x.astype(np.float64)
    m = wide.max(axis=1, keepdims=True)
    np.testing.assert_allclose(xp.numpy(y.data), m + np.log(np.exp(wide - m).sum(1, keepdims=True)),
                               rtol=4 * np.finfo(result_dtype).eps)
