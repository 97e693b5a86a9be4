"""gradcore.utils array helpers: array_equal, array_allclose, sum_to, the conv size helpers."""
import numpy as np
import pytest

import backends
import gradcore
import gradcore.functions.conv as conv
from gradcore import utils
from gradcore.utils import array_allclose, array_equal, sum_to


# =============================================================================== comparison
def test_array_equal_across_variables_and_backends(xp):
    data = np.array([[1.0, 2.0], [3.0, 4.0]])
    a = xp.asarray(data)
    assert array_equal(a, data) is True
    assert array_equal(gradcore.Variable(a), a) is True
    assert array_equal(data, gradcore.Variable(xp.asarray(data))) is True
    assert array_equal(a, xp.asarray(data + 1e-9)) is False
    assert array_equal(a, xp.asarray(data[:1])) is False  # shapes differ
    assert array_equal(xp.asarray(3.0), 3.0) is True


def test_array_allclose_uses_its_tolerances(xp):
    data = np.array([1.0, 100.0])
    a = xp.asarray(data)
    near = xp.asarray(data * (1 + 5e-5))
    assert array_allclose(a, near) is True           # default rtol=1e-4
    assert array_allclose(a, near, rtol=1e-6) is False
    assert array_allclose(gradcore.Variable(a), xp.asarray(data + 0.5), rtol=0, atol=1.0) is True
    assert array_allclose(a, xp.asarray(data + 0.5), rtol=0, atol=0.1) is False


def test_array_allclose_is_false_for_shapes_that_do_not_broadcast(xp):
    assert array_allclose(xp.asarray(np.zeros(2)), xp.asarray(np.zeros(3))) is False
    assert array_allclose(gradcore.Variable(xp.asarray(np.zeros((2, 3)))), np.zeros(2)) is False
    assert array_allclose(xp.asarray(np.zeros((2, 3))), np.zeros(3)) is True  # broadcasts
    assert array_allclose(xp.asarray(np.zeros((2, 1))), 0.0) is True


# =============================================================================== sum_to
@pytest.mark.parametrize("source, target", [
    ((2, 3), (1, 3)),
    ((2, 3, 4), (3, 1)),
    ((2, 3), ()),
    ((4, 1, 3), (1, 1, 3)),
])
def test_sum_to_on_raw_arrays(xp, source, target):
    data = np.arange(np.prod(source), dtype=np.float32).reshape(source)
    y = sum_to(xp.asarray(data), target)
    assert backends.backend_of(y) is xp.backend and xp.backend.device_of(y) == xp.device
    assert tuple(y.shape) == target and y.dtype == xp.float32
    lead = len(source) - len(target)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(target) if n == 1)
    expected = data.sum(axis=axes, keepdims=True).reshape(target)
    np.testing.assert_array_equal(xp.numpy(y), expected)


def test_sum_to_same_shape_is_the_array_itself(xp):
    a = xp.asarray(np.ones((2, 3)))
    assert sum_to(a, (2, 3)) is a


def test_sum_to_errors():
    with pytest.raises(ValueError, match=r"cannot sum shape \(2, 3\) to shape \(3, 2\)"):
        sum_to(np.ones((2, 3)), (3, 2))
    with pytest.raises(ValueError, match="cannot sum shape"):
        sum_to(np.ones(3), (2, 3))
    with pytest.raises(TypeError, match="functions.sum_to for Variables"):
        sum_to(gradcore.Variable(np.ones(3)), ())


# =============================================================================== conv helpers
def test_conv_size_helpers_are_reexported_for_dezero_code():
    assert utils.get_conv_outsize is conv.get_conv_outsize
    assert utils.get_deconv_outsize is conv.get_deconv_outsize
    assert utils.pair is conv.pair
    assert utils.get_conv_outsize(32, 3, 1, 1) == 32
    assert utils.get_conv_outsize(7, 3, 2, 0) == 3
    assert utils.get_deconv_outsize(3, 3, 2, 0) == 7
    assert utils.pair(2) == (2, 2) and utils.pair((1, 3)) == (1, 3)


def test_utils_names():
    assert set(utils.__all__) == {
        "numerical_grad", "gradient_check", "array_equal", "array_allclose", "sum_to",
        "get_dot_graph", "plot_dot_graph", "get_conv_outsize", "get_deconv_outsize", "pair",
        "gradcheck", "gradgradcheck", "GradcheckError", "reshape_sum_backward",
        "max_backward_shape", "logsumexp", "get_file", "cache_dir"}
    assert all(callable(getattr(utils, name)) for name in set(utils.__all__) - {"cache_dir"})
    assert isinstance(utils.cache_dir, str)  # a folder, as DeZero's
