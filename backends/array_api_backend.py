"""Any array library with `__array_namespace__` (array-api-strict in the tests)."""
import math
import re

import numpy

from .base import Backend, DeviceUnavailableError, HostRandom
from .indexing import flat_positions, is_advanced
from .device import Device


def _device_name(native, position):
    """A short name for a native device: the word in its repr (`Device('device1')`), else its position."""
    match = re.fullmatch(r"[\w.]*\(\s*['\"]?([\w\-]+)['\"]?\s*\)", repr(native))
    return match.group(1) if match else str(position)


class ArrayAPIBackend(HostRandom, Backend):
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

    def writable(self, array):
        # the standard cannot say; array-api-strict's arrays wrap a NumPy array (`_array`), which
        # can: its asarray of a read-only NumPy array shares that array's memory
        return super().writable(getattr(array, "_array", array))

    def native(self, device):
        """The library's own device object for a `Device` (None: the default device)."""
        if device is None or device.index is None:
            return self._to_native[self._default]
        try:
            return self._to_native[device]
        except KeyError:
            raise DeviceUnavailableError(
                f"{device} does not exist; {self.name} has: "
                + ", ".join(str(d) for d in self._to_native)) from None

    def ensure_array(self, obj):
        return obj  # results are always arrays, 0-d included

    def namespace_dtype(self, dtype, device=None):
        """`dtype` as the namespace's own: a name ("float64"), a NumPy dtype or type
        (numpy.float64, float) becomes the namespace's dtype of that name; anything else (the
        namespace's dtypes) is returned as it is. array-api-strict takes only its own. A NumPy
        dtype the namespace lacks (array-api-strict's float16) is a ValueError naming `device`
        (None: the default one) and the dtypes of that kind it has."""
        if isinstance(dtype, (str, type, numpy.dtype)):
            try:
                name = numpy.dtype(dtype).name
            except TypeError:  # not a name NumPy knows: the namespace says what it takes
                return dtype
            own = getattr(self.xp, name, None)
            if own is None:
                raise self._lacks(name, device)
            return own
        return dtype

    def _lacks(self, name, device):
        """The ValueError for a dtype named `name` that the namespace lacks on `device`."""
        device = self._default if device is None or device.index is None else device
        floating = numpy.dtype(name).kind == "f"
        has = self.xp.__array_namespace_info__().dtypes(
            device=self.native(device), kind="real floating" if floating else None)
        return ValueError(f"{device} has no {name} (its {'floating ' if floating else ''}dtypes: "
                          f"{', '.join(has)}); use one of those, or a device that has {name}, "
                          "such as 'cpu'")

    def asarray(self, obj, dtype=None, device=None):
        if isinstance(obj, (numpy.ndarray, numpy.generic)) and dtype is None:
            dtype = obj.dtype  # a NumPy dtype the namespace lacks is said here, on `device`
        dtype = self.namespace_dtype(dtype, device)
        return self.xp.asarray(obj, dtype=dtype, device=self.native(device))

    def zeros(self, shape, dtype, device):
        return self.xp.zeros(shape, dtype=self.namespace_dtype(dtype, device),
                             device=self.native(device))

    def empty(self, shape, dtype, device):
        return self.xp.empty(shape, dtype=self.namespace_dtype(dtype, device),
                             device=self.native(device))

    def to_device(self, array, device):
        return array.to_device(self.native(device))

    def to_numpy(self, array):
        # array-api-strict refuses to hand a non-default-device array to NumPy: move it first
        return numpy.asarray(array.to_device(self.native(None)))

    def add_at(self, target, key, values):
        # index arrays (masks are ones by now) go through flat positions and a segment sum, since
        # the standard has no integer-array __setitem__
        xp = self.xp
        if not hasattr(values, "shape"):
            values = xp.asarray(values, dtype=target.dtype, device=target.device)
        elif values.dtype != target.dtype:
            values = xp.astype(values, target.dtype)
        if not is_advanced(key):
            # the standard allows None (a new axis) when reading, not in __setitem__: a new axis
            # only adds a size-1 axis to `values`, so drop it from the key and from `values`
            if any(i is None for i in key):
                values = xp.broadcast_to(values, target[key].shape)
                key = tuple(i for i in key if i is not None)
                values = xp.reshape(values, target[key].shape)
            target[key] = target[key] + values  # basic indices never repeat an element
            return target
        size = math.prod(target.shape)
        positions = flat_positions(xp, target.shape, key, target.device)
        values = xp.broadcast_to(values, positions.shape)
        float16 = getattr(xp, "float16", None)  # the standard has none; some libraries do
        if float16 is not None and values.dtype == float16:
            # each run's total is rounded at every step of the scan: float32 rounds it once
            values = xp.astype(values, xp.float32)
        total = _segment_sum(xp, xp.reshape(positions, (-1,)), xp.reshape(values, (-1,)), size)
        total = target + xp.reshape(total, target.shape)
        target[...] = xp.astype(total, target.dtype, copy=False)
        return target

    def arithmetic_warnings_off(self):
        return numpy.errstate(all="ignore")  # per context since NumPy 2: other threads still warn


def _segment_sum(xp, positions, values, size):
    """`out[j]` = the sum of `values[i]` over `positions[i] == j`, for j < size (1-d arrays).

    Sort by position, then an inclusive scan within runs of equal positions (Hillis-Steele:
    after the step with shift d, entry i holds the sum of its run's entries in (i - 2d, i]), and
    read each run's total at its last entry. log2(n) steps of array-API calls; sums, never
    differences, so a small run is not swamped by rounding in a big running total.
    """
    n = positions.shape[0]
    if n == 0:
        return xp.zeros((size,), dtype=values.dtype, device=values.device)
    order = xp.argsort(positions, stable=True)
    p = xp.take(positions, order)
    v = xp.take(values, order)
    d = 1
    while d < n:
        same_run = p[d:] == p[:-d]
        v = xp.concat([v[:d], v[d:] + xp.where(same_run, v[:-d], xp.zeros_like(v[:-d]))])
        d *= 2
    j = xp.arange(size, device=values.device)
    last = xp.maximum(xp.searchsorted(p, j, side="right") - 1, 0)  # the last entry <= j
    total = xp.take(v, last)
    return xp.where(xp.take(p, last) == j, total, xp.zeros_like(total))
