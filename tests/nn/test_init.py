"""nn.init: shapes, bounds and statistics, on the parameter's device, repeatable by seed."""
import math

import numpy as np
import pytest

import gradcore
from gradcore.nn import Deconv2d, init


def parameter(xp, shape, dtype="float32"):
    return gradcore.Parameter(xp.asarray(np.zeros(shape), dtype=dtype))


def test_constants(xp2):
    p = parameter(xp2, (3, 4))
    assert init.ones_(p) is p and np.array_equal(xp2.numpy(p.data), np.ones((3, 4)))
    init.constant_(p, 2.5)
    assert np.array_equal(xp2.numpy(p.data), np.full((3, 4), 2.5)) and p.version == 2
    init.zeros_(p)
    assert not xp2.numpy(p.data).any() and p.device == xp2.device
    assert xp2.numpy(p.data).dtype == np.float32


@pytest.mark.parametrize("fill, check", [
    (lambda p: init.uniform_(p, -2.0, 3.0), lambda a: -2 <= a.min() and a.max() < 3),
    (lambda p: init.normal_(p, 1.0, 0.5), lambda a: abs(a.mean() - 1) < 0.01
     and abs(a.std() - 0.5) < 0.01),
    # W is (in, out): fan_in 400, fan_out 100
    (lambda p: init.xavier_uniform_(p), lambda a: abs(a).max() <= math.sqrt(6 / 500)
     and abs(a.std() - math.sqrt(2 / 500)) < 0.002),
    (lambda p: init.xavier_normal_(p, gain=2.0), lambda a: abs(a.std() - 2 * math.sqrt(2 / 500))
     < 0.003),
    (lambda p: init.kaiming_uniform_(p, nonlinearity="relu"),
     lambda a: abs(a).max() <= math.sqrt(6 / 400) and abs(a.std() - math.sqrt(2 / 400)) < 0.002),
    (lambda p: init.kaiming_normal_(p, mode="fan_out", nonlinearity="relu"),
     lambda a: abs(a.std() - math.sqrt(2 / 100)) < 0.003),
])
def test_random_fills_have_their_distribution(xp2, fill, check):
    p = parameter(xp2, (400, 100))
    fill(p)
    a = xp2.numpy(p.data).astype(np.float64)
    assert a.shape == (400, 100) and p.device == xp2.device
    assert xp2.numpy(p.data).dtype == np.float32
    assert check(a)


def test_orthogonal(xp2):
    for shape in ((6, 4), (4, 6), (8, 2, 3)):
        p = init.orthogonal_(parameter(xp2, shape, "float64"), gain=1.5)
        q = xp2.numpy(p.data).reshape(shape[0], -1) / 1.5
        small = min(q.shape)
        gram = q.T @ q if q.shape[0] >= q.shape[1] else q @ q.T
        np.testing.assert_allclose(gram, np.eye(small), atol=1e-12)


@pytest.mark.parametrize("dtype, tolerance", [("float16", 2e-3), ("longdouble", 1e-14)])
def test_orthogonal_in_a_dtype_linalg_does_not_take(dtype, tolerance):
    # NumPy's linalg takes float32 and float64 only: decomposed in one of them, then cast
    for shape in ((6, 4), (4, 6)):
        p = init.orthogonal_(parameter(np, shape, dtype))
        assert p.dtype == np.dtype(dtype)
        q = p.data.astype(np.float64)
        gram = q.T @ q if shape[0] >= shape[1] else q @ q.T
        np.testing.assert_allclose(gram, np.eye(4), atol=tolerance)


def test_a_seed_repeats_the_draw():
    a, b = parameter(np, (5, 5)), parameter(np, (5, 5))
    gradcore.manual_seed(3)
    init.kaiming_uniform_(a)
    gradcore.manual_seed(3)
    init.kaiming_uniform_(b)
    assert np.array_equal(a.data, b.data)


def test_fans_follow_gradcores_layouts_and_errors_say_what_to_do():
    conv = parameter(np, (8, 3, 3, 3), "float64")  # out, in, kh, kw: fan_in 27, fan_out 72
    init.kaiming_normal_(conv, nonlinearity="relu")
    assert abs(conv.data.std() - math.sqrt(2 / 27)) < 0.1
    assert init.calculate_gain("leaky_relu", 0.2) == math.sqrt(2 / 1.04)
    with pytest.raises(ValueError, match="no data yet.*call the model once"):
        init.normal_(gradcore.Parameter(None))
    for fill in (init.zeros_, init.ones_):  # the function called, not the one it calls
        with pytest.raises(ValueError, match=f"^{fill.__name__}: the parameter has no data yet"):
            fill(gradcore.Parameter(None))
    with pytest.raises(ValueError, match="2 or more axes"):
        init.xavier_uniform_(parameter(np, (4,)))
    with pytest.raises(ValueError, match="unknown nonlinearity 'swish'"):
        init.calculate_gain("swish")


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 0), (0, 2, 3, 3)])
@pytest.mark.parametrize("fill", [init.xavier_uniform_, init.xavier_normal_,
                                  init.kaiming_uniform_, init.kaiming_normal_])
def test_an_empty_weight_is_left_as_it_is(fill, shape):
    """A weight with no elements has a fan of 0: nothing to draw, no division by it (PyTorch:
    a no-op)."""
    p = gradcore.Parameter(np.zeros(shape, np.float32))
    assert fill(p) is p
    assert p.shape == shape and p.dtype == np.float32


def test_calculate_gain_knows_pytorchs_convolution_names():
    for name in ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                 "conv_transpose3d"):
        assert init.calculate_gain(name) == 1.0, name


def test_a_deconv_weight_has_pytorchs_conv_transpose_fans_the_swapped_ones():
    deconv = Deconv2d(8, kernel_size=3, in_channels=2)  # W (in 2, out 8, 3, 3)
    assert deconv.W.shape == (2, 8, 3, 3)
    gradcore.manual_seed(0)
    init.kaiming_uniform_(deconv.W, nonlinearity="relu")  # bound sqrt(6 / fan_in), fan_in 8 * 9
    assert abs(deconv.W.data).max() <= math.sqrt(6 / 72)
    init.kaiming_uniform_(deconv.W, mode="fan_out", nonlinearity="relu")  # the input side, 2 * 9
    assert math.sqrt(6 / 72) < abs(deconv.W.data).max() <= math.sqrt(6 / 18)


# every numeric argument of every fill, as fill(p, v)
FILLS = {
    "constant_": lambda p, v: init.constant_(p, v),
    "uniform_ a": lambda p, v: init.uniform_(p, v, 10.0),
    "uniform_ b": lambda p, v: init.uniform_(p, -10.0, v),
    "normal_ mean": lambda p, v: init.normal_(p, mean=v),
    "normal_ std": lambda p, v: init.normal_(p, std=v),
    "xavier_uniform_": lambda p, v: init.xavier_uniform_(p, gain=v),
    "xavier_normal_": lambda p, v: init.xavier_normal_(p, gain=v),
    "kaiming_uniform_": lambda p, v: init.kaiming_uniform_(p, a=v),
    "kaiming_normal_": lambda p, v: init.kaiming_normal_(p, a=v),
    "orthogonal_": lambda p, v: init.orthogonal_(p, gain=v),
}
NUMBERS = {  # NumPy 2 would make float32 data times the first ones float64
    "np.float64": lambda xp: np.float64(0.3), "np.sqrt": lambda xp: np.sqrt(2.0),
    "np.float32": lambda xp: np.float32(0.3), "np.float16": lambda xp: np.float16(0.3),
    "np.int64": lambda xp: np.int64(2), "0-d numpy": lambda xp: np.array(0.3),
    "0-d of the backend": lambda xp: xp.asarray(0.3),
}


@pytest.mark.parametrize("fill", FILLS, ids=str)
@pytest.mark.parametrize("number", NUMBERS, ids=str)
def test_numpy_numbers_keep_the_parameters_dtype(xp2, fill, number):
    v = NUMBERS[number](xp2)
    p, q = parameter(xp2, (4, 3)), parameter(xp2, (4, 3))
    gradcore.manual_seed(0)
    FILLS[fill](p, v)
    gradcore.manual_seed(0)
    FILLS[fill](q, float(v))  # the Python float: the float32 computation
    assert xp2.numpy(p.data).dtype == np.float32
    np.testing.assert_array_equal(xp2.numpy(p.data), xp2.numpy(q.data))


def test_numpy_numbers_give_the_float32_computations_values():
    p = parameter(np, (4, 3))
    init.constant_(p, np.float64(0.1))
    np.testing.assert_array_equal(p.data, np.full((4, 3), np.float32(0.1)))
    gradcore.manual_seed(0)
    init.normal_(p, np.float64(0.1), np.sqrt(2.0))
    gradcore.manual_seed(0)
    draw = np.random.randn(4, 3).astype(np.float32)  # the backend's draw: host float64, cast
    expected = draw * np.float32(np.sqrt(2.0)) + np.float32(0.1)
    assert p.data.dtype == np.float32 and expected.dtype == np.float32
    np.testing.assert_array_equal(p.data, expected)
    assert init.calculate_gain("leaky_relu", np.float32(0.5)) == math.sqrt(2 / 1.25)


@pytest.mark.parametrize("fill", FILLS, ids=str)
@pytest.mark.parametrize("bad", [True, np.True_, np.array(True), "0.5", 1j, np.ones(2)],
                         ids=["True", "np.True_", "0-d bool", "str", "complex", "1-d"])
def test_fills_refuse_what_is_not_a_real_number(fill, bad):
    p = parameter(np, (4, 3))
    function, _, argument = fill.partition(" ")
    with pytest.raises(TypeError, match=fr"{function}: {argument or '[a-z]+'} must be a real "
                       "number, got "):
        FILLS[fill](p, bad)
    assert not p.data.any() and p.version == 0
    with pytest.raises(TypeError, match="calculate_gain: param must be a real number, got True"):
        init.calculate_gain("leaky_relu", True)


def test_integer_parameters_keep_their_dtype():
    p = parameter(np, (2, 3), "int32")
    init.constant_(p, 2.7)  # truncated, as by PyTorch's fill_
    assert p.data.dtype == np.int32 and np.array_equal(p.data, np.full((2, 3), 2))
    for name, fill in FILLS.items():
        if name != "constant_":
            with pytest.raises(TypeError, match="needs a floating-point parameter, got dtype "
                               "int32"):
                fill(p, 1.0)
    assert np.array_equal(p.data, np.full((2, 3), 2))


def test_a_fill_is_cast_to_the_parameters_dtype(xp2):
    # the guard behind every fill: a float64 array stored into a float32 parameter is cast
    p = parameter(xp2, (2, 2))
    init._fill(p, xp2.asarray(np.full((2, 2), 0.1)))
    assert xp2.numpy(p.data).dtype == np.float32
    np.testing.assert_array_equal(xp2.numpy(p.data), np.full((2, 2), np.float32(0.1)))


def test_constant_fills_an_int64_parameter_exactly():
    for value in (2 ** 60 + 1, np.int64(2 ** 60 + 1), np.asarray(2 ** 60 + 1)):
        p = gradcore.Parameter(np.zeros(3, np.int64))
        init.constant_(p, value)
        assert p.dtype == np.int64 and p.data.tolist() == [2 ** 60 + 1] * 3


def test_every_initialiser_has_a_docstring():
    for name in init.__all__:
        assert (getattr(init, name).__doc__ or "").strip(), name


# ============================================================ found by a review
def test_uniform_never_draws_b_in_float16_and_keeps_float32_and_float64_numbers():
    """float64 samples of [0, 1) cast to float16 round up to 1 about once in 4096: a float16
    weight is drawn and scaled in float32, cast, and b taken down to the float16 below it."""
    for a, b in ((0.0, 1.0), (-2.0, 2.0)):
        p = parameter(np, (1000, 1000), "float16")
        gradcore.manual_seed(0)
        init.uniform_(p, a, b)
        gradcore.manual_seed(0)
        u = np.random.rand(1000, 1000).astype(np.float32) * np.float32(b - a) + np.float32(a)
        expected = np.minimum(u.astype(np.float16), np.nextafter(np.float16(b), np.float16(a)))
        assert p.dtype == np.float16 and a <= p.data.min() and p.data.max() < b
        assert (u.astype(np.float16) == b).any()  # without the clamp b would be there
        np.testing.assert_array_equal(p.data, expected)
    for dtype in ("float32", "float64"):  # the numbers a seed gave before, DeZero's included
        p = parameter(np, (50, 40), dtype)
        gradcore.manual_seed(1)
        init.uniform_(p, -0.5, 0.25)
        gradcore.manual_seed(1)
        u = np.random.rand(50, 40).astype(dtype)
        np.testing.assert_array_equal(p.data, u * p.data.dtype.type(0.75) - p.data.dtype.type(0.5))


def test_uniform_takes_b_down_to_the_number_below_it_on_every_backend(xp2, monkeypatch):
    """Samples that come out as 1 in float32 (float64 ones of 1 - 2**-26 and above, rare) give
    the float32 below b, never b."""
    p = parameter(xp2, (2, 3))
    ones = xp2.asarray(np.ones((2, 3)), dtype="float32")
    monkeypatch.setattr(type(xp2.backend), "random_uniform", lambda *args: ones)
    init.uniform_(p, -1.0, 3.0)
    np.testing.assert_array_equal(xp2.numpy(p.data),
                                  np.full((2, 3), np.nextafter(np.float32(3), np.float32(0))))


def _dask_parameter(shape, chunks, dtype="float32"):
    da = pytest.importorskip("dask.array")
    pytest.importorskip("array_api_compat")
    return gradcore.Parameter(da.zeros(shape, chunks=chunks, dtype=dtype))


@pytest.mark.parametrize("fill", FILLS, ids=str)
def test_every_fill_keeps_a_dask_parameters_chunks(fill):
    """Backward and the optimizer keep a parameter's chunks; its initialisation does too, small
    (drawn on the host) or large (drawn chunk by chunk: drawn in these chunks, not cut)."""
    dask = pytest.importorskip("dask")
    for shape, chunks, limit in (((40, 30), (20, 10), "128MiB"), ((80, 60), (30, 25), "4KiB")):
        p = _dask_parameter(shape, chunks)
        before = p.data.chunks
        with dask.config.set({"array.chunk-size": limit}):
            FILLS[fill](p, 0.5)
        assert p.data.chunks == before and p.dtype == np.float32 and p.version == 1


def test_orthogonal_on_a_dask_weight_larger_than_a_chunk():
    """Drawn in chunks of rows and columns, the matrix is decomposed in one column of chunks,
    as Dask's qr (tsqr) needs."""
    dask = pytest.importorskip("dask")
    for shape in ((30, 40), (40, 30), (10, 4, 5)):
        p = _dask_parameter(shape, 10, "float64")
        with dask.config.set({"array.chunk-size": "4KiB"}):  # the draw: more than one chunk
            init.orthogonal_(p, gain=2.0)
        q = np.asarray(p.data.compute()).reshape(shape[0], -1) / 2
        gram = q.T @ q if q.shape[0] >= q.shape[1] else q @ q.T
        np.testing.assert_allclose(gram, np.eye(min(q.shape)), atol=1e-12)


@pytest.mark.parametrize("dtype, fill, message", [
    ("float16", lambda p: init.constant_(p, 1e5),
     r"constant_: value = 100000.0 does not fit the parameter's float16 \(finite numbers up to "
     "65504 in magnitude\\)"),
    ("float16", lambda p: init.constant_(p, 65520.0), "value = 65520.0 does not fit"),
    ("float32", lambda p: init.constant_(p, 1e39), "value = 1e\\+39 does not fit .* float32"),
    ("int8", lambda p: init.constant_(p, 300), r"value = 300 does not fit .* int8 \(-128 to 127\)"),
    ("uint8", lambda p: init.constant_(p, -1), "value = -1 does not fit .* uint8"),
    ("int64", lambda p: init.constant_(p, math.nan), "value = nan does not fit .* int64"),
    ("float16", lambda p: init.uniform_(p, -1e5, 1e5), "uniform_: a = -100000.0 does not fit"),
    ("float16", lambda p: init.normal_(p, 7e4, 1.0), "normal_: mean = 70000.0 does not fit"),
    ("float16", lambda p: init.normal_(p, 0.0, 3e4),
     r"normal_: draws of mean=0.0, std=30000.0 pass the largest number of the parameter's "
     r"float16 \(65504\) and would be inf"),
    ("float16", lambda p: init.orthogonal_(p, 1e6), "orthogonal_: gain = 1000000.0 does not fit"),
    ("float16", lambda p: init.xavier_uniform_(p, 1e6), "xavier_uniform_: the bound gain"),
])
def test_a_value_the_parameters_dtype_cannot_hold_is_refused(dtype, fill, message):
    # float16 constant_(p, 1e5) filled inf with only NumPy's cast warning; an int8 300 raised
    # NumPy's OverflowError naming neither (CuPy wraps it)
    p = parameter(np, (40, 30), dtype)
    with pytest.raises(ValueError, match=message):
        fill(p)
    np.testing.assert_array_equal(p.data, np.zeros((40, 30)))  # unchanged


def test_values_that_round_into_the_dtype_are_taken():
    p = parameter(np, (3,), "float16")
    init.constant_(p, 65519.0)  # rounds to 65504, float16's largest
    assert p.data.tolist() == [65504.0] * 3
    init.constant_(p, math.inf)  # asked for: as PyTorch's fill_
    assert p.data.tolist() == [math.inf] * 3
    q = parameter(np, (3,), "uint8")
    init.constant_(q, -0.5)  # truncated to 0, as PyTorch's fill_
    assert q.data.tolist() == [0] * 3
    r = parameter(np, (2000,), "float32")
    init.uniform_(r, -3e38, 3e38)  # b - a overflows float32: scaled in halves
    assert np.isfinite(r.data).all() and r.data.min() < -1e38 and r.data.max() > 1e38
    s = parameter(np, (2000,), "float16")
    init.normal_(s, 0.0, 5e3)  # checked, and every draw fits
    assert np.isfinite(s.data).all() and 1e4 < np.abs(s.data).max() < 65504
