"""Arrays and devices: which library owns an array, and where it lives. Knows nothing of autodiff."""
import importlib
import sys

from .base import Backend, DeviceUnavailableError
from .device import CPU, Device, parse_device
from .numpy_backend import NumpyBackend

__all__ = [
    "Backend", "Device", "DeviceUnavailableError", "CPU", "parse_device", "backend_of",
    "get_backend", "register", "registered", "differences", "asarray_on", "backend_for_device",
    "is_array", "to_device", "copy", "cuda_available",
]

_by_type = {}          # type(array) -> Backend: backend_of's O(1) lookup
_by_name = {}          # Backend.name -> Backend
_by_device_type = {}   # Device.type -> Backend


# Read on every call that dispatches on an array. As instance attributes CPython 3.11 specialises
# the reads; class attributes read through an instance take the slow generic lookup (callgrind:
# 4.3% of the instructions of a chain of small NumPy calls, 1.6% of a wide one's).
_HOT_ATTRIBUTES = ("xp", "array_type", "scalar_types", "single_device", "needs_device_context")


def register(backend, devices=True):
    """Make `backend` known: its arrays are then accepted everywhere. Returns it. With
    devices=False it is found from its arrays only, not by name or device (a backend whose arrays
    wrap another backend's, on that backend's devices).

    Registering again one with the same `settings()` (a re-run notebook cell, or after gradcore
    registered the library on first sight of its arrays) returns the registered backend: arrays
    made before and after then mix. One that would take a registered backend's name, device type
    or array type with other settings raises ValueError saying what differs."""
    registered = _registered_like(backend, devices)
    if registered is not None:
        return registered
    for name in _HOT_ATTRIBUTES:
        setattr(backend, name, getattr(backend, name))
    # one device and no device context needed
    backend.plain = backend.single_device and not backend.needs_device_context
    if devices:
        _by_name[backend.name] = backend
        _by_device_type[backend.device_type] = backend
    _by_type[backend.array_type] = backend
    if not devices:  # a wrapper has a class of its own for the library's scalars, if it has any
        _by_type.update((t, backend) for t in backend.scalar_types)
    return backend


def _registered_like(backend, devices):
    """The registered backend that `backend` repeats (equal settings), or None where it takes
    no one's place; ValueError where it would replace a different one. Two backends under one
    name, device type or array type would split that library's arrays: Variables made before
    would keep the old one, later ones get the new, and ops refuse to mix them."""
    claims = [("array type", _qualname(backend.array_type), _by_type.get(backend.array_type))]
    if devices:
        claims += [("name", repr(backend.name), _by_name.get(backend.name)),
                   ("device type", repr(backend.device_type),
                    _by_device_type.get(backend.device_type))]
    for what, value, old in claims:
        # an array type found by subclass lookup (_lookup) is no registered backend's own
        if old is None or old is backend or what == "array type" and (
                old.array_type is not backend.array_type):
            continue
        if old.settings() == backend.settings():
            return old
        use = f"use the registered one: backends.get_backend({old.name!r})"
        raise ValueError(
            f"backends.register: the {what} {value} belongs to the registered {old!r}, and "
            f"{backend!r} differs from it in {differences(backend, old)} (new vs registered); "
            f"two backends for one {what} would split its arrays into two that ops refuse to "
            "mix. "
            + (f"An array type has one backend: {use}" if what == "array type" else
               f"Give it a name of its own (ArrayAPIBackend(xp, array_type, name=...)), or {use}"))
    return None


def differences(a, b):
    """Where the settings() of backends `a` and `b` differ, for messages ("library: numpy vs
    array_api_strict; ..."); "" where they have the same."""
    a, b = a.settings(), b.settings()
    return "; ".join(f"{key}: {_qualname(a.get(key))} vs {_qualname(b.get(key))}"
                     for key in dict.fromkeys([*a, *b]) if a.get(key) != b.get(key))


def _qualname(value):
    """A module, class or value as a short readable name."""
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return getattr(value, "__name__", None) or repr(value)


NUMPY = register(NumpyBackend())


def registered():
    """The backends known so far (NumPy, every registered one, CuPy once it is in use)."""
    return list(_by_name.values())


# backends imported the first time one of their arrays or devices is seen
_ON_DEMAND = {"cupy": ("cupy_backend", "CupyBackend"), "dask": ("dask_backend", "DaskBackend")}


def get_backend(name):
    """The backend called `name` ("numpy", "cupy", "dask", or a registered one)."""
    backend = _by_name.get(name)
    if backend is None:
        if name not in _ON_DEMAND:
            raise ValueError(f"no backend named {name!r}; known: "
                             + ", ".join(sorted(set(_by_name) | set(_ON_DEMAND))))
        module, cls = _ON_DEMAND[name]
        backend = register(getattr(importlib.import_module(f".{module}", __name__), cls)())
    return backend


def _lookup(array):
    """Slow path of backend_of for a type not seen before; None if no backend owns it."""
    tp = type(array)
    library = tp.__module__.partition(".")[0]
    if library in _ON_DEMAND and library in sys.modules:
        backend = get_backend(library)  # seen one of its arrays: the library is imported already
        if issubclass(tp, backend.array_type):
            _by_type[tp] = backend
            return backend
        return None
    for backend in list(_by_name.values()):
        if issubclass(tp, backend.array_type):
            _by_type[tp] = backend
            return backend
    namespace = getattr(tp, "__array_namespace__", None)
    if namespace is not None:
        from .array_api_backend import ArrayAPIBackend

        try:
            xp = array.__array_namespace__()
        except Exception:
            return None
        backend = _by_name.get(xp.__name__.replace(".", "_")) or register(ArrayAPIBackend(xp, tp))
        _by_type[tp] = backend
        return backend
    return None


def backend_of(array):
    """The Backend owning `array`, or None: a dict lookup on type(array) after the first sight."""
    tp = type(array)
    backend = _by_type.get(tp)
    return backend if backend is not None else _lookup(array)


def is_array(obj):
    """True if some backend owns `obj`."""
    return backend_of(obj) is not None


def backend_for_device(device):
    """The backend that serves `device` (a Device or a string); "cuda" and "dask" import CuPy
    and Dask on demand."""
    device = parse_device(device)
    backend = _by_device_type.get(device.type)
    if backend is None:
        name = "cupy" if device.type == "cuda" else device.type
        if name not in _ON_DEMAND:
            raise ValueError(
                f"unknown device {device}: known device types are "
                + ", ".join(sorted(set(_by_device_type) | {"cuda", "dask"})))
        backend = get_backend(name)
    if device.index is not None and backend.single_device:
        raise ValueError(f"invalid device '{device}': '{device.type}' is one device and takes "
                         f"no index; use '{device.type}'")
    return backend


def _serving(source, device):
    """The backend that serves `device` for an array of `source`: `source` itself when it wraps
    the arrays of the backend that serves it."""
    target = backend_for_device(device)
    return source if source is not None and source.inner is target else target


def to_device(array, device):
    """`array` on `device`, on whichever backend serves it (through the host across backends)."""
    device = parse_device(device)
    source = backend_of(array)
    target = _serving(source, device)
    if source is target or source.inner is not None:
        # an array wrapping another backend's is moved by its backend, wherever it goes: a
        # wrapper (gradcore.compile's traced arrays) may not read its array on the host
        return source.to_device(array, device)
    host = source.to_numpy(array)
    if not source.lazy and device.type != "cuda" and source.device_of(array).type != "cuda":
        # host memory to host memory: the host array may be the array's own memory (NumPy's,
        # array-api-strict's) and the target may wrap it as it is (array-api-strict's asarray,
        # Dask's from_array): copied, so that a write to one is no write to the other, which no
        # version would count. A lazy library's to_numpy computes an array of its own (Dask's
        # compute): a copy would double a large array's memory on its way to the host
        host = host.copy()
    return target.asarray(host, device=device)


def copy(array):
    """A new array with `array`'s values, on its device."""
    backend = backend_of(array)
    with backend.device_context(backend.device_of(array)):
        return backend.xp.asarray(array, copy=True)


def asarray_on(obj, device, dtype=None):
    """`obj` (an array of any backend, a list, a scalar) as an array on `device`, cast to `dtype`
    when given: constants (labels, masks, indices) go where the arrays they go with live."""
    device = parse_device(device)
    source = backend_of(obj)
    target = _serving(source, device)
    if source is None:
        return target.asarray(obj, dtype=dtype, device=device)
    if source is not target or not source.single_device and source.device_of(obj) != device:
        obj = to_device(obj, device)
        target = backend_of(obj)  # a wrapper's array moved to another library is a wrapper's
    if dtype is not None and obj.dtype != dtype:
        obj = target.asarray(obj, dtype=dtype, device=device)
    return obj


def cuda_available():
    """True if CuPy is installed and sees at least one GPU."""
    try:
        get_backend("cupy")
    except DeviceUnavailableError:
        return False
    return True
