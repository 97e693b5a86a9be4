"""gradcore.cuda (DeZero's names): gpu_enable, get_array_module, as_numpy, as_cupy."""
import subprocess
import sys

import numpy as np
import pytest

import array_api_strict
import backends
import gradcore
from backends import DeviceUnavailableError
from gradcore import cuda


def test_gpu_enable_is_lazy_and_then_a_plain_bool():
    code = (
        "import sys, gradcore, gradcore.cuda as c\n"
        "assert 'cupy' not in sys.modules\n"
        "assert 'gpu_enable' not in vars(c)\n"
        "c.get_array_module(gradcore.Variable([1.0])); c.as_numpy([1.0])\n"
        "assert 'cupy' not in sys.modules, 'a CPU-only call imported cupy'\n"
        "from gradcore.cuda import gpu_enable\n"
        "assert type(gpu_enable) is bool and vars(c)['gpu_enable'] is gpu_enable\n"
        "print(gpu_enable)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(backends.cuda_available())


def test_gpu_enable_in_process():
    assert cuda.gpu_enable is backends.cuda_available()
    assert "gpu_enable" in dir(cuda)
    with pytest.raises(AttributeError, match="no attribute 'gpu_enabled'"):
        cuda.gpu_enabled


def test_get_array_module():
    a = np.ones(2)
    assert cuda.get_array_module(a) is np
    assert cuda.get_array_module(gradcore.Variable(a)) is np
    assert cuda.get_array_module(3.0) is np and cuda.get_array_module([1, 2]) is np
    strict = array_api_strict.asarray([1.0])
    assert cuda.get_array_module(strict) is array_api_strict
    assert cuda.get_array_module(gradcore.Variable(strict)) is array_api_strict


def test_as_numpy(xp):
    data = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    a = xp.asarray(data)
    for value in (a, gradcore.Variable(a)):
        host = cuda.as_numpy(value)
        assert type(host) is np.ndarray and host.dtype == np.float32
        np.testing.assert_array_equal(host, data)


def test_as_numpy_of_numpy_values_and_scalars():
    a = np.ones(3)
    assert cuda.as_numpy(a) is a
    for scalar in (2.5, np.float64(2.5), np.float32(2.5)):
        host = cuda.as_numpy(scalar)
        assert type(host) is np.ndarray and host.shape == () and host == 2.5
    assert cuda.as_numpy(np.float32(1.0)).dtype == np.float32
    np.testing.assert_array_equal(cuda.as_numpy([1, 2]), [1, 2])
    with pytest.raises(TypeError, match="as_numpy: cannot convert builtins.str"):
        cuda.as_numpy("text")


def test_as_numpy_of_a_variable_with_no_data_says_so():
    # it said "cannot convert builtins.NoneType" of a Variable it was given
    with pytest.raises(ValueError, match=r"^as_numpy: the Variable holds no data \(its data is "
                                         r"None, as in Variable\(None\)\); give it an array "
                                         r"first \(x.data = array\)$"):
        cuda.as_numpy(gradcore.Variable(None))
    with pytest.raises(TypeError, match="as_numpy: cannot convert builtins.NoneType"):
        cuda.as_numpy(None)  # None itself is not a Variable


def test_as_cupy_without_a_gpu_is_one_clear_error():
    pytest.importorskip("cupy")
    if backends.cuda_available():
        pytest.skip("a GPU is present")
    with pytest.raises(DeviceUnavailableError, match="no CUDA device was found"):
        cuda.as_cupy(np.ones(2))
    with pytest.raises(DeviceUnavailableError, match="no CUDA device was found"):
        cuda.as_cupy(gradcore.Variable(np.ones(2)))


def test_as_cupy_without_cupy_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` now raises ImportError
    monkeypatch.delitem(backends._by_name, "cupy", raising=False)
    monkeypatch.delitem(backends._by_device_type, "cuda", raising=False)
    with pytest.raises(DeviceUnavailableError, match=r"CuPy is not installed.*gradcore\[gpu\]"):
        cuda.as_cupy(np.ones(2))
    assert cuda.DeviceUnavailableError is DeviceUnavailableError


@pytest.mark.gpu
def test_cupy_round_trip_on_a_gpu():
    cupy = backends.get_backend("cupy").xp
    data = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    g = cuda.as_cupy(data)
    assert type(g) is cupy.ndarray and g.dtype == np.float32
    assert cuda.as_cupy(g) is g
    assert cuda.get_array_module(g) is cupy
    assert cuda.get_array_module(gradcore.Variable(g)) is cupy
    np.testing.assert_array_equal(cuda.as_numpy(g), data)
    np.testing.assert_array_equal(cuda.as_numpy(gradcore.Variable(g)), data)
    np.testing.assert_array_equal(cuda.as_numpy(cuda.as_cupy(gradcore.Variable(data))), data)
    assert cuda.gpu_enable is True
