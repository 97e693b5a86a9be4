"""NumPy: the CPU backend."""
import numpy

from .base import Backend, HostRandom
from .indexing import flat_positions, is_advanced
from .device import CPU


class NumpyBackend(HostRandom, Backend):
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
        elif target.dtype == numpy.float16:
            # np.add.at adds one value at a time in the target's dtype: in float16, 20,000 x 0.1
            # into one element stop at 256. Added up in float32, then rounded once (the values
            # cast first: np.add.at casting them as it goes is 7x slower)
            total = target.astype(numpy.float32)
            values = numpy.asarray(values, dtype=numpy.float32)
            target[...] = self.add_at(total, key, values)
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
