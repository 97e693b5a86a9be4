"""Any array library with `__array_namespace__` (array-api-strict in the tests)."""
import re

import numpy

from .base import Backend, DeviceUnavailableError
from .device import Device


def _device_name(native, position):
    """A short name for a native device: the word in its repr (`Device('device1')`), else its position."""
    match = re.fullmatch(r"[\w.]*\(\s*['\"]?([\w\-]+)['\"]?\s*\)", repr(native))
    return match.group(1) if match else str(position)


class ArrayAPIBackend(Backend):
    """A backend for one array-API namespace; its devices are named `NAMESPACE:DEVICE`."""

    def __init__(self, xp, array_type, name=None):
        self.xp = xp
        self.array_type = array_type
        self.name = self.device_type = name or xp.__name__.replace(".", "_")
        info = xp.__array_namespace_info__()
        natives = info.devices()
        self._to_native = {}
        self._from_native = {}
        for position, native in enumerate(natives):
            device = Device(self.device_type, _device_name(native, position))
            self._to_native[device] = native
            self._from_native[native] = device
        self._default = self._from_native[info.default_device()]

    def device_of(self, array):
        return self._from_native[array.device]

    def native(self, device):
        """The library's own device object for a gradcore `Device` (None: the default device)."""
        if device is None or device.index is None:
            return self._to_native[self._default]
        try:
            return self._to_native[device]
        except KeyError:
            raise DeviceUnavailableError(
                f"{device} does not exist; {self.name} has: "
                + ", ".join(str(d) for d in self._to_native)) from None

    def device_context(self, device):
        raise NotImplementedError(f"{self.name} computes where its arrays are; no context needed")

    def ensure_array(self, obj):
        return obj  # results are always arrays, 0-d included

    def asarray(self, obj, dtype=None, device=None):
        if isinstance(obj, numpy.ndarray) and obj.ndim and dtype is None:
            dtype = getattr(self.xp, obj.dtype.name)
        return self.xp.asarray(obj, dtype=dtype, device=self.native(device))

    def zeros(self, shape, dtype, device):
        return self.xp.zeros(shape, dtype=dtype, device=self.native(device))

    def to_device(self, array, device):
        return array.to_device(self.native(device))

    def to_numpy(self, array):
        # array-api-strict refuses to hand a non-default-device array to NumPy: move it first
        return numpy.asarray(array.to_device(self.native(None)))

    def scatter_add(self, target, index, values):
        index = index if isinstance(index, tuple) else (index,)
        if any(getattr(i, "ndim", 0) for i in index):
            raise NotImplementedError(
                f"{self.name}: scatter_add with integer-array indices is not supported")
        if any(i is None for i in index):
            # the standard allows None (a new axis) when reading, not in __setitem__: a new axis
            # only adds a size-1 axis to `values`, so drop it from the key and from `values`
            index = tuple(i for i in index if i is not None)
            values = self.xp.reshape(values, target[index].shape)
        target[index] = target[index] + values  # basic indices never repeat an element
        return target

    def random_normal(self, shape, dtype, device):
        return self.asarray(numpy.random.randn(*shape), dtype=dtype, device=device)

    def random_uniform(self, shape, dtype, device):
        return self.asarray(numpy.random.rand(*shape), dtype=dtype, device=device)

    def manual_seed(self, seed):
        numpy.random.seed(seed)  # samples come from NumPy's global generator
