"""Shape ops: reshape, expand_dims, squeeze, flatten, transpose, broadcast_to, sum_to,
concatenate, stack, split, get_item."""
import math

import backends

from ..function import Function, View
from ..variable import Variable, as_variable


def _normalize_shape(shape):
    return (shape,) if isinstance(shape, int) else tuple(shape)


# =============================================================================== reshape
class Reshape(View):
    def __init__(self, shape):
        self.shape = shape

    def forward(self, x):
        return self.xp.reshape(x, self.shape)

    def backward(self, gy):
        x, = self.inputs
        return reshape(gy, x.shape)


def reshape(x, shape):
    """x with a new shape (same number of elements); returns x itself if the shape is unchanged."""
    shape = _normalize_shape(shape)
    if isinstance(x, Variable) and x.shape == shape:
        return x
    return Reshape(shape)(x)


def normalize_axis(axis, ndim, array="an array of {} dimension(s)", hint="", single=False):
    """`axis` (None: all; an int; a tuple or list of ints; negatives count from the end) as a
    sorted tuple of distinct non-negative axes of an `ndim`-d array; with `single`, `axis` must
    be one int. Else TypeError or ValueError: `array` names the array in the out-of-range
    message (`{}`: ndim), and `hint` ends it."""
    if single and (isinstance(axis, bool) or not isinstance(axis, int)):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if axis is None:
        return tuple(range(ndim))
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, int):
            raise TypeError(f"axis must be None, an int or a tuple of ints, got {axis!r}")
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of range for {array.format(ndim)}{hint}")
    axes = tuple(sorted(a % ndim for a in axes))
    if len(set(axes)) != len(axes):
        raise ValueError(f"repeated axis in {axis!r}")
    return axes


_RESULT = "the result of {} dimension(s)"  # an axis of the output: expand_dims, stack


class ExpandDims(View):
    def __init__(self, axis):
        self.axis = axis

    def forward(self, x):
        many = isinstance(self.axis, (tuple, list))
        ndim = x.ndim + (len(self.axis) if many else 1)
        new = normalize_axis(self.axis, ndim, _RESULT, single=not many)
        rest = iter(x.shape)
        return self.xp.reshape(x, tuple(1 if a in new else next(rest) for a in range(ndim)))

    def backward(self, gy):
        x, = self.inputs
        return reshape(gy, x.shape)


def expand_dims(x, axis):
    """x with a new size-1 axis at `axis` (an int or a tuple; axes of the result)."""
    return ExpandDims(axis)(x)


class Squeeze(View):
    def __init__(self, axis=None):
        self.axis = axis

    def forward(self, x):
        if self.axis is None:
            drop = {a for a, n in enumerate(x.shape) if n == 1}
        else:
            drop = normalize_axis(self.axis, x.ndim)
            for a in drop:
                if x.shape[a] != 1:
                    raise ValueError(f"cannot squeeze axis {a} of size {x.shape[a]}: only "
                                     "size-1 axes can be removed")
        return self.xp.reshape(x, tuple(n for a, n in enumerate(x.shape) if a not in drop))

    def backward(self, gy):
        x, = self.inputs
        return reshape(gy, x.shape)


def squeeze(x, axis=None):
    """x without its size-1 axes (all of them, or those in `axis`: an int or a tuple)."""
    return Squeeze(axis)(x)


def flatten(x):
    """x reshaped to (N, -1): the first (batch) axis kept, the others merged into one."""
    if x.ndim < 1:
        raise ValueError("flatten: the input needs at least one axis (the batch axis); got a "
                         "0-d input")
    return reshape(x, (x.shape[0], math.prod(x.shape[1:])))


# =============================================================================== transpose
class Transpose(View):
    def __init__(self, axes=None):
        self.axes = axes

    def forward(self, x):
        axes = self.axes if self.axes is not None else tuple(range(x.ndim))[::-1]
        return self.xp.permute_dims(x, axes)

    def backward(self, gy):
        if self.axes is None:
            return transpose(gy)
        inverse = [0] * len(self.axes)
        for i, axis in enumerate(self.axes):
            inverse[axis % len(self.axes)] = i
        return transpose(gy, tuple(inverse))


def transpose(x, axes=None):
    """Reverse the axes of x, or permute them by `axes`."""
    return Transpose(None if axes is None else tuple(axes))(x)


# =============================================================================== broadcasting
class BroadcastTo(View):
    def __init__(self, shape):
        self.shape = shape

    def forward(self, x):
        return self.xp.broadcast_to(x, self.shape)

    def backward(self, gy):
        x, = self.inputs
        return sum_to(gy, x.shape)


def broadcast_to(x, shape):
    """x repeated along new or size-1 axes to `shape`."""
    shape = _normalize_shape(shape)
    if isinstance(x, Variable) and x.shape == shape:
        return x
    return BroadcastTo(shape)(x)


class SumTo(Function):
    def __init__(self, shape):
        self.shape = shape

    def forward(self, x):
        lead = x.ndim - len(self.shape)
        if lead < 0:
            raise ValueError(f"cannot sum shape {x.shape} to the larger shape {self.shape}")
        if any(n != 1 and n != x.shape[lead + i] for i, n in enumerate(self.shape)):
            # each target axis must be 1 or match: (2, 3) cannot become (3, 2)
            raise ValueError(f"cannot sum shape {tuple(x.shape)} to shape {self.shape}: "
                             "it does not broadcast to the input shape")
        axes = tuple(range(lead)) + tuple(
            lead + i for i, n in enumerate(self.shape) if n == 1 and x.shape[lead + i] != 1)
        y = self.xp.sum(x, axis=axes, keepdims=True)
        return self.xp.reshape(y, self.shape) if lead else y

    def backward(self, gy):
        x, = self.inputs
        return broadcast_to(gy, x.shape)


def sum_to(x, shape):
    """Sum x over broadcast axes so it has `shape` (the reverse of broadcast_to)."""
    if x.shape == shape:  # the common case first: nothing was broadcast
        return x if isinstance(x, Variable) else as_variable(x)
    shape = _normalize_shape(shape)
    if x.shape == shape:
        return as_variable(x)
    return SumTo(shape)(x)


# =============================================================================== joining
class Concatenate(Function):
    def __init__(self, axis=0):
        self.axis = axis

    def forward(self, *xs):
        _check_same_shapes(xs, self.axis, "concatenate")
        return self.xp.concat(xs, axis=self.axis)

    def backward(self, gy):
        axis, = normalize_axis(self.axis, gy.ndim, single=True)
        ends = []
        for x in self.inputs[:-1]:
            ends.append((ends[-1] if ends else 0) + x.shape[axis])
        gxs = split(gy, ends, axis)
        return tuple(g if need else None for g, need in zip(gxs, self.needs_input_grad))


def concatenate(xs, axis=0):
    """The arrays in `xs` joined along an existing `axis`; all other axes must match."""
    xs = _as_sequence(xs, "concatenate")
    return Concatenate(axis)(*xs)


class Stack(Function):
    def __init__(self, axis=0):
        self.axis = axis

    def forward(self, *xs):
        _check_same_shapes(xs, None, "stack")
        normalize_axis(self.axis, xs[0].ndim + 1, _RESULT, single=True)
        return self.xp.stack(xs, axis=self.axis)

    def backward(self, gy):
        gxs = split(gy, len(self.inputs), self.axis)
        return tuple(reshape(g, x.shape) if need else None
                     for g, x, need in zip(gxs, self.inputs, self.needs_input_grad))


def stack(xs, axis=0):
    """The arrays in `xs` (all of one shape) joined along a new `axis`."""
    xs = _as_sequence(xs, "stack")
    return Stack(axis)(*xs)


def _as_sequence(xs, name):
    if isinstance(xs, Variable) or backends.is_array(xs) or not isinstance(xs, (list, tuple)):
        raise TypeError(f"{name}: expects a list or tuple of arrays, got {type(xs).__name__}")
    if not xs:
        raise ValueError(f"{name}: needs at least one array, got an empty {type(xs).__name__}")
    return xs


def _check_same_shapes(xs, axis, name):
    """ValueError unless the inputs are arrays of one shape (except along `axis`, if given)."""
    for x in xs:
        if not hasattr(x, "shape"):
            raise TypeError(f"inputs must be arrays or Variables, got {type(x).__name__}")
    first = xs[0]
    if axis is not None:
        if first.ndim == 0:
            raise ValueError("cannot join 0-d arrays along an axis; use stack")
        axis, = normalize_axis(axis, first.ndim, single=True)
    for x in xs[1:]:
        same = x.ndim == first.ndim and all(
            n == m or a == axis for a, (n, m) in enumerate(zip(x.shape, first.shape)))
        if not same:
            where = "except along the joined axis" if axis is not None else "exactly"
            raise ValueError(f"input shapes must match {where}: got {tuple(first.shape)} and "
                             f"{tuple(x.shape)}")


class Split(View):
    def __init__(self, indices_or_sections, axis=0):
        self.indices_or_sections = indices_or_sections
        self.axis = axis

    def forward(self, x):
        if x.ndim == 0:
            raise ValueError("cannot split a 0-d array")
        axis, = normalize_axis(self.axis, x.ndim, single=True)
        bounds = _split_bounds(self.indices_or_sections, x.shape[axis], axis)
        head = (slice(None),) * axis
        return tuple(x[head + (slice(a, b), Ellipsis)] for a, b in zip(bounds, bounds[1:]))

    def backward(self, *gys):
        return concatenate(gys, self.axis)


def _split_bounds(indices_or_sections, n, axis):
    """[0, i1, ..., n]: the piece boundaries, as np.split reads `indices_or_sections`."""
    if isinstance(indices_or_sections, int) and not isinstance(indices_or_sections, bool):
        sections = indices_or_sections
        if sections < 1 or n % sections:
            raise ValueError(f"axis {axis} of size {n} cannot be split into {sections} equal "
                             "sections; pass the split points instead")
        return [n // sections * i for i in range(sections + 1)]
    bounds = [0]
    for i in indices_or_sections:
        i = min(i + n if i < 0 else i, n)
        if i < bounds[-1]:
            raise ValueError(f"split points must be increasing, got {list(indices_or_sections)}")
        bounds.append(i)
    return bounds + [n]


def split(x, indices_or_sections, axis=0):
    """x cut along `axis` into a tuple of pieces: N equal sections (an int) or at the given
    points (a list of ints, as in np.split)."""
    return Split(indices_or_sections, axis)(x)


# =============================================================================== indexing
class GetItem(View):
    def __init__(self, slices, key=None):
        self.slices = slices
        self.key = key  # `slices` as the backend's checked key, once known

    def forward(self, x):
        if self.key is None:  # NumPy's indexing rules on every backend
            index = _index_on_device(self.slices, self.backend, self.backend.device_of(x))
            self.key = self.backend.normalize_key(index, x.shape)
        return self.backend.get_item(x, self.key)

    def backward(self, gy):
        x, = self.inputs
        return GetItemGrad(self.key, x.shape)(gy)


class GetItemGrad(Function):
    def __init__(self, key, in_shape):
        self.key = key  # a key from the forward's backend.normalize_key
        self.in_shape = in_shape

    def forward(self, gy):
        gx = self.backend.zeros(self.in_shape, gy.dtype, self.device)
        return self.backend.scatter_add(gx, self.key, gy)  # repeated indices add up

    def backward(self, ggx):
        return GetItem(self.key, key=self.key)(ggx)  # checked already, for this shape and device


def _index_on_device(key, backend, device):
    """`key` with lists, Variables and other backends' or devices' arrays as `backend` arrays on
    `device` (where the indexed array lives)."""
    out = []
    for k in key if isinstance(key, tuple) else (key,):
        if isinstance(k, Variable):
            k = k.data
        if isinstance(k, (list, tuple)):
            k = backend.asarray(k, dtype=None if k else backend.xp.int64, device=device)
        elif getattr(k, "ndim", 0):
            k = backends.asarray_on(k, device)
        out.append(k)
    return tuple(out)


def get_item(x, slices):
    """x[slices] by NumPy's rules: ints, slices, None, Ellipsis, and integer arrays (NumPy or
    backend arrays, lists) and boolean masks, on any backend. Repeated indices add up in the
    gradient. Out-of-bounds indices raise IndexError (also on CuPy, which would wrap them)."""
    return GetItem(slices)(x)
