"""Array helpers on raw arrays of any backend: comparison on the host, and sum_to."""
import numpy

import backends

from ..cuda import as_numpy


def array_equal(a, b):
    """True if `a` and `b` (Variables or arrays of any backend) have the same shape and values,
    compared on the host."""
    return bool(numpy.array_equal(as_numpy(a), as_numpy(b)))


def array_allclose(a, b, rtol=1e-4, atol=1e-5):
    """True if `a` and `b` (Variables or arrays of any backend) have broadcast-compatible shapes
    and |a - b| <= atol + rtol * |b| everywhere, compared on the host; False for shapes that do
    not broadcast (as array_equal is False for different shapes)."""
    a, b = as_numpy(a), as_numpy(b)
    try:
        numpy.broadcast_shapes(numpy.shape(a), numpy.shape(b))
    except ValueError:
        return False
    return bool(numpy.allclose(a, b, rtol=rtol, atol=atol))


def sum_to(x, shape):
    """The raw array `x` summed over broadcast axes down to `shape` (the reverse of broadcasting):
    leading extra axes are summed away, axes of size 1 in `shape` are summed with keepdims.
    Works on arrays of any backend; F.sum_to is the differentiable version for Variables."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    backend = backends.backend_of(x)
    if backend is None:
        raise TypeError(f"sum_to: expected an array, got {type(x).__module__}."
                        f"{type(x).__qualname__} (use gradcore.functions.sum_to for Variables)")
    if tuple(x.shape) == shape:
        return x
    lead = x.ndim - len(shape)
    if lead < 0 or any(n != 1 and n != x.shape[lead + i] for i, n in enumerate(shape)):
        raise ValueError(f"sum_to: cannot sum shape {tuple(x.shape)} to shape {shape}: "
                         "the target must broadcast to the array's shape")
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1)
    y = backend.xp.sum(x, axis=axes, keepdims=True)
    if lead:
        y = backend.xp.reshape(y, shape)
    return backend.ensure_array(y)
