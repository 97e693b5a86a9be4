"""gradcore.functions.device: astype's dtypes, and the float32 that float16 sums are accumulated
in. Float casts are differentiable (tests/test_engine.py checks them twice over); integer and bool
casts are constants; complex casts are refused."""
import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from gradcore.functions.device import accumulator_dtype
from conftest import CASES as BACKENDS


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8", "bool"])
def test_astype_to_an_integer_or_bool_dtype_is_a_constant(xp, dtype):
    x = gradcore.Variable(xp.asarray([0.0, 1.5, 2.0]))
    y = F.astype(x, getattr(xp, dtype))
    assert y.dtype == getattr(xp, dtype)
    np.testing.assert_array_equal(xp.numpy(y.data), np.array([0.0, 1.5, 2.0]).astype(dtype))
    assert not y.requires_grad and y.creator is None  # an integer cannot carry a gradient
    with pytest.raises(RuntimeError, match="has no graph"):
        y.backward()
    # a float Variable computed beside it still differentiates back to x
    z = F.sum(x * F.astype(y, xp.float64))
    z.backward()
    np.testing.assert_array_equal(xp.numpy(x.grad.data), np.array([0.0, 1.5, 2.0]).astype(dtype))


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_astype_to_a_complex_dtype_is_refused(xp, dtype):
    x = gradcore.Variable(xp.asarray([1.0, 2.0]))
    with pytest.raises(TypeError, match=rf"astype: gradcore does not differentiate complex numbers "
                                        rf"\(asked for \S*{dtype}\).*real and imaginary parts "
                                        "as two real Variables"):
        F.astype(x, getattr(xp, dtype))
    with pytest.raises(TypeError, match="does not differentiate complex numbers"):
        F.astype(xp.asarray([1.0, 2.0]), getattr(xp, dtype))  # a raw array too


def test_astype_float_to_float_stays_differentiable(xp):
    x = gradcore.Variable(xp.asarray([1.0, -2.0], dtype="float32"))
    y = F.astype(x, xp.float64)
    assert y.requires_grad and y.creator is not None and y.dtype == xp.float64
    F.sum(y * 3.0).backward()
    assert x.grad.dtype == xp.float32
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [3.0, 3.0])


def test_astype_takes_numpy_dtype_names_on_numpy():
    """NumPy's astype takes names and Python types: so does gradcore's on NumPy."""
    x = gradcore.Variable(np.array([1.5, -2.0]))
    assert F.astype(x, "float32").dtype == np.float32 and F.astype(x, "float32").requires_grad
    assert F.astype(x, int).dtype == np.int64 and not F.astype(x, int).requires_grad
    assert not F.astype(x, "bool").requires_grad
    with pytest.raises(TypeError, match="does not differentiate complex numbers"):
        F.astype(x, "complex64")


@pytest.mark.parametrize("dtype", ["float64", np.float64, np.dtype("float64"), float],
                         ids=["name", "numpy-type", "numpy-dtype", "python-type"])
def test_astype_takes_names_and_numpy_dtypes_on_every_backend(xp, dtype):
    """array-api-strict takes only its own dtypes: astype maps the others to them."""
    x = gradcore.Variable(xp.asarray([1.5, -2.0], dtype="float32"))
    y = F.astype(x, dtype)
    assert y.dtype == xp.float64 and y.requires_grad
    F.sum(y * 3.0).backward()
    assert x.grad.dtype == xp.float32
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [3.0, 3.0])
    assert F.astype(x, "int32").dtype == xp.int32 and not F.astype(x, "int32").requires_grad
    assert F.astype(x, "float32") is x


def test_astype_to_what_is_no_dtype_says_what_to_pass(xp):
    x = gradcore.Variable(xp.asarray([1.0, 2.0]))
    with pytest.raises(TypeError, match=r"astype: 'floaty' is not a dtype \w+ has .*pass one of "
                                        "its dtypes or a name such as 'float32'"):
        F.astype(x, "floaty")


@pytest.mark.parametrize("backend", ["numpy", "dask", pytest.param("cupy", marks=pytest.mark.gpu)])
def test_float16_is_accumulated_in_float32_on_every_backend_that_has_it(backend):
    # float16 known by its width: the Dask namespace has no xp.float16 to compare with
    xp = BACKENDS[backend]()
    half = xp.asarray([1.0], dtype="float16").dtype
    assert accumulator_dtype(xp.namespace, half) == xp.float32
    for dtype in ("float32", "float64", "int16"):
        assert accumulator_dtype(xp.namespace, xp.asarray([1], dtype=dtype).dtype) is None
    # 70,000 ones sum to inf in float16, and so does a count of 70,000 ties
    x = gradcore.Variable(xp.asarray(np.ones(70_000), dtype="float16"))
    assert float(xp.numpy(F.mean(x).data)) == 1.0
    F.max(x).backward()
    np.testing.assert_array_equal(xp.numpy(x.grad.data), np.full(70_000, np.float16(1 / 70_000)))
