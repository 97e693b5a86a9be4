"""NumPy: the CPU backend."""
import numpy

from .base import Backend, HostRandom, ViewsByBase
from .indexing import flat_positions, is_advanced
from .device import CPU


# An element of a float32 target that np.add.at adds to this many times or fewer drifts by at
# most that many float32 roundings (256: 1.5e-5 of the total): the fast sum in float32 stays
FLOAT32_REPEATS = 256


def _repeats(key):
    """How many times, at most, the normalized `key` picks one element: its index array's most
    repeated index (slices and ints pick each once); more than FLOAT32_REPEATS for a key of
    several index arrays, which is not counted."""
    arrays = [k for k in key if hasattr(k, "shape")]
    if len(arrays) != 1:
        return FLOAT32_REPEATS + 1
    index = arrays[0].reshape(-1)
    if not index.size:
        return 0
    if int(index.max()) < 8 * index.size:  # a count per index value costs no more than a sort
        return int(numpy.bincount(index).max())
    return int(numpy.unique(index, return_counts=True)[1].max())


class NumpyBackend(HostRandom, ViewsByBase, Backend):
    name = "numpy"
    device_type = "cpu"
    xp = numpy
    array_type = numpy.ndarray
    single_device = True
    multiplies_bool = True
    loops_on_host = True
    scalar_types = frozenset(t for t in numpy.sctypeDict.values() if issubclass(t, numpy.generic))

    def owns_memory(self, array):
        # a NumPy scalar (which callers may keep in place of a 0-d array) is immutable; any
        # array, a subclass's (np.memmap) too, is memory that other arrays may share
        return array.__class__ in self.scalar_types or (
            array.base is None and array.flags.writeable)

    def device_of(self, array):
        return CPU

    def ensure_array(self, obj):
        # NumPy reductions and 0-d arithmetic hand back scalars: make them 0-d arrays again.
        if isinstance(obj, numpy.generic):
            return numpy.asarray(obj)
        if obj.__class__ is numpy.ndarray or not isinstance(obj, numpy.ndarray):
            return obj
        # A subclass's array: a plain ndarray over the same memory (np.memmap's stays the
        # file's), as the ops' NumPy semantics hold for ndarrays only: np.matrix's * is a matrix
        # product, and its sum keeps two axes
        if isinstance(obj, numpy.ma.MaskedArray):
            raise TypeError(
                "numpy.ma.MaskedArray data is not supported: gradcore's ops and their gradients "
                "read every element, masked ones too; pass a.filled(value) to replace the masked "
                "elements, or numpy.asarray(a) to drop the mask")
        return numpy.asarray(obj)

    def asarray(self, obj, dtype=None, device=None):
        return numpy.asarray(obj, dtype=dtype)

    def zeros(self, shape, dtype, device):
        return numpy.zeros(shape, dtype=dtype)

    def empty(self, shape, dtype, device):
        return numpy.empty(shape, dtype=dtype)

    def to_device(self, array, device):
        return array

    def to_numpy(self, array):
        return numpy.asarray(array)

    def add_at(self, target, key, values):
        if not is_advanced(key):
            target[key] += values  # basic indices never repeat an element
        elif target.dtype.kind == "f" and target.dtype.itemsize < 8 and (
                target.dtype == numpy.float16 or _repeats(key) > FLOAT32_REPEATS):
            # np.add.at adds one value at a time in the target's dtype: 20,000 x 0.1 into one
            # float16 element stop at 256, 2,000,000 into a float32 one drift 1.5% (197,025 for
            # 200,000; the Dask backend's totals are float64 too). Each element's values are
            # summed in float64 and added to it once: by bincount over the whole target where
            # the key picks an eighth of it or more, else over the elements picked (sorting
            # the positions costs less than a float64 array of the target's size)
            positions = flat_positions(numpy, target.shape, key)
            values = numpy.broadcast_to(values, positions.shape).reshape(-1)
            positions = positions.reshape(-1)
            if positions.size * 8 >= target.size:
                sums = numpy.bincount(positions, weights=values, minlength=target.size)
                target += sums.reshape(target.shape)
                return target
            picked, slot = numpy.unique(positions, return_inverse=True)
            sums = numpy.bincount(slot, weights=values, minlength=len(picked))
            target[numpy.unravel_index(picked, target.shape)] += sums
        elif target.flags.c_contiguous and any(k.__class__ is slice for k in key):
            # np.add.at is several times slower on rows picked with slices (x[i] of a 2-d
            # array) than on a flat array with one flat index
            positions = flat_positions(numpy, target.shape, key)
            values = numpy.broadcast_to(values, positions.shape)
            numpy.add.at(target.reshape(-1), positions.reshape(-1), values.reshape(-1))
        else:
            numpy.add.at(target, key, values)
        return target

    def arithmetic_warnings_off(self):
        return numpy.errstate(all="ignore")  # per context since NumPy 2: other threads still warn
