"""DeZero's `cuda` module: is a GPU usable, which array module an array belongs to, host <-> GPU.

`import gradcore` never imports CuPy: `gpu_enable` is computed on first access (module
`__getattr__`), then kept, so `gradcore.cuda.gpu_enable` and `from gradcore.cuda import
gpu_enable` read as DeZero's module-level bool.
"""
import numpy

import backends
from backends import DeviceUnavailableError

from .variable import Variable

__all__ = ["gpu_enable", "get_array_module", "as_numpy", "as_cupy", "DeviceUnavailableError"]


def __getattr__(name):
    # DeZero computes `gpu_enable` at import, which would import CuPy: here it is computed the
    # first time someone reads it (importing CuPy then), and cached as a real module global.
    if name == "gpu_enable":
        value = backends.cuda_available()
        globals()["gpu_enable"] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"gpu_enable"})


def _data(x):
    return x.data if isinstance(x, Variable) else x


def get_array_module(x):
    """The array namespace of `x` (a Variable or an array): numpy, cupy, or the array-API
    namespace of its library. NumPy for Python scalars, lists and anything no backend owns."""
    backend = backends.backend_of(_data(x))
    return numpy if backend is None else backend.xp


def as_numpy(x):
    """`x` (a Variable, an array of any backend, a scalar or a list) as a NumPy array on the host.
    A NumPy array comes back as it is; other arrays are copied to the host."""
    given, x = x, _data(x)
    if isinstance(x, numpy.ndarray):
        return x
    backend = backends.backend_of(x)
    if backend is not None:
        return backends.NUMPY.ensure_array(backend.to_numpy(x))
    if isinstance(x, (int, float, complex, bool, list, tuple)):
        return numpy.asarray(x)
    if x is None and isinstance(given, Variable):
        raise ValueError("as_numpy: the Variable holds no data (its data is None, as in "
                         "Variable(None)); give it an array first (x.data = array)")
    raise TypeError(f"as_numpy: cannot convert {type(x).__module__}.{type(x).__qualname__}; "
                    "pass a Variable, an array, a Python scalar or a list")


def as_cupy(x):
    """`x` (a Variable, an array of any backend, a scalar or a list) as a CuPy array. A CuPy array
    comes back as it is; anything else is copied to the current GPU. Raises
    DeviceUnavailableError (saying whether CuPy or the GPU is missing) when no GPU is usable."""
    x = _data(x)
    cupy_backend = backends.get_backend("cupy")  # the clear error without CuPy or a GPU
    if isinstance(x, cupy_backend.array_type):
        return x
    return cupy_backend.asarray(as_numpy(x), device=backends.Device("cuda"))
