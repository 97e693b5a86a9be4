"""Shape ops: reshape, expand_dims, squeeze, flatten, transpose, broadcast_to, sum_to,
concatenate, stack, split, get_item; on lazy backends, gradients laid out as their inputs."""
import math
import numbers

import backends

from ..function import Function, View
from ..variable import Variable
from .device import wide_sum


def _normalize_shape(shape):
    return (shape,) if isinstance(shape, int) else tuple(shape)


# =============================================================================== reshape
class Reshape(View):
    """y = x with a new `shape` (the same number of elements); gx = gy reshaped to x.shape."""

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
    if single and not _is_integer(axis):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if axis is None:
        return tuple(range(ndim))
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    if not all(_is_integer(a) for a in axes):
        raise TypeError(f"axis must be None, an int or a tuple of ints, got {axis!r}")
    axes = tuple(int(a) for a in axes)  # NumPy integers as Python ints, for every backend
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of range for {array.format(ndim)}{hint}")
    axes = tuple(sorted(a % ndim for a in axes))
    if len(set(axes)) != len(axes):
        raise ValueError(f"repeated axis in {axis!r}")
    return axes


def _is_integer(value):
    """True for an int of any kind (a NumPy integer too), but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


_RESULT = "the result of {} dimension(s)"  # an axis of the output: expand_dims, stack


class ExpandDims(View):
    """y = x with size-1 axes inserted at `axis` (axes of y); gx = gy reshaped to x.shape."""

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
    """y = x without its size-1 axes (all, or those in `axis`); gx = gy reshaped to x.shape."""

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
    """y = x with its axes permuted by `axes` (None: reversed); gx = gy transposed by the
    inverse permutation."""

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
    """y = x broadcast to `shape`; gx = sum_to(gy, x.shape)."""

    def __init__(self, shape):
        self.shape = shape

    def forward(self, x):
        return self.xp.broadcast_to(x, self.shape)

    def backward(self, gy):
        x, = self.inputs
        return laid_out_like(sum_to(gy, x.shape), x)  # Dask: in x's chunks, as the engine's sum


def broadcast_to(x, shape):
    """x repeated along new or size-1 axes to `shape`."""
    shape = _normalize_shape(shape)
    if isinstance(x, Variable) and x.shape == shape:
        return x
    return BroadcastTo(shape)(x)


class SumTo(Function):
    """y = x summed over its broadcast axes down to `shape` (float16 accumulates in float32);
    gx = gy broadcast back to x.shape."""

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
        xp = self.xp
        # float16: summed in float32, as in sum (the engine sums broadcast gradients here)
        y = wide_sum(xp, x, axes, keepdims=True)
        return xp.reshape(y, self.shape) if lead else y

    def backward(self, gy):
        x, = self.inputs
        return broadcast_like(gy, x)


def sum_to(x, shape):
    """Sum x over broadcast axes so it has `shape` (the reverse of broadcast_to)."""
    if x.shape == shape:  # the common case first: nothing was broadcast
        return x if isinstance(x, Variable) else Variable(x, requires_grad=False)
    shape = _normalize_shape(shape)
    if x.shape == shape:  # a raw array is a constant, as in every op
        return x if isinstance(x, Variable) else Variable(x, requires_grad=False)
    return SumTo(shape)(x)


# =============================================================================== layout
# On a lazy backend (Dask) what an op makes in the shape of an input (its gradient) is laid out
# as that input (in its chunks): made in larger chunks, each would be computed whole and held
# while its pieces meet the input's, and memory would grow with the array, not with its chunks.
# Elsewhere these cost one test of `backend.lazy`.
def layout(x, shape=None):
    """The layout of Variable x's data (reshaped to `shape`, if given) where its backend is lazy
    (Dask: its chunks), for `backend.laid_out`; None elsewhere."""
    backend = x.backend
    if not backend.lazy:
        return None
    return backend.layout(x.data if shape is None else backend.xp.reshape(x.data, shape))


class LaidOut(View):
    """x, the same values, in a lazy backend's `layout` (Dask: chunks)."""

    def __init__(self, layout):
        self.layout = layout

    def forward(self, x):
        return self.backend.laid_out(x, self.layout)

    def backward(self, gy):
        return laid_out_like(gy, self.inputs[0])


def laid_out_like(y, x):
    """y (a gradient for x, of x's shape) laid out as x where the backend is lazy (Dask: in x's
    chunks); y itself elsewhere."""
    return LaidOut(layout(x))(y) if x.backend.lazy else y


def broadcast_like(y, x):
    """y broadcast to x's shape, laid out as x where the backend is lazy: a gradient for x."""
    return laid_out_like(broadcast_to(y, x.shape), x)


# =============================================================================== joining
class Concatenate(Function):
    """y = the inputs xs joined along an existing `axis` (other axes equal); gy is split
    back at the inputs' boundaries into one gx each."""

    integers_take_float_dtype = True  # x32 beside an int64 array stays float32, as in + - * /

    def __init__(self, axis=0):
        self.axis = axis

    def forward(self, *xs):
        axis = _check_same_shapes(xs, self.axis, "concatenate")
        return self.xp.concat(xs, axis=axis)

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
    """y = the inputs xs (all of one shape) joined along a new `axis`; gy is split along it
    into one gx per input."""

    integers_take_float_dtype = True  # x32 beside an int64 array stays float32, as in + - * /

    def __init__(self, axis=0):
        self.axis = axis

    def forward(self, *xs):
        _check_same_shapes(xs, None, "stack")
        axis, = normalize_axis(self.axis, xs[0].ndim + 1, _RESULT, single=True)
        return self.xp.stack(xs, axis=axis)

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
    """ValueError unless the inputs are arrays of one shape (except along `axis`, if given);
    returns `axis` made non-negative."""
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
    return axis


class Split(View):
    """ys = pieces of x cut along `axis` (np.split's rules); gx = the gys joined, added up
    where pieces overlap."""

    def __init__(self, indices_or_sections, axis=0):
        self.indices_or_sections = indices_or_sections
        self.axis = axis
        self.overlap = None  # for pieces that overlap: where each element of theirs came from

    def forward(self, x):
        if x.ndim == 0:
            raise ValueError("cannot split a 0-d array")
        axis, = normalize_axis(self.axis, x.ndim, single=True)
        bounds = _split_bounds(self.indices_or_sections, x.shape[axis], axis)
        head = (slice(None),) * axis
        pieces = list(zip(bounds, bounds[1:]))
        if any(b < a for a, b in pieces):
            # a point before the one ahead of it (np.split allows it): that piece is empty and
            # the next one starts back there, so pieces overlap
            positions = [i for a, b in pieces for i in range(a, b)]
            index = self.backend.asarray(positions, dtype=self.xp.int64,
                                         device=self.backend.device_of(x))
            self.overlap = self.backend.normalize_key(head + (index,), x.shape)
        return tuple(x[head + (slice(a, b), Ellipsis)] for a, b in pieces)

    def backward(self, *gys):
        x, = self.inputs
        gy = concatenate(gys, self.axis)
        if self.overlap is None:  # the pieces tile x: their gradients, joined, are x's
            return laid_out_like(gy, x)  # pieces' chunks cut at the split points: x's whole
        # each piece's gradient added where it was taken (twice where pieces overlap)
        return GetItemGrad(self.overlap, x.shape, layout(x))(gy)


def _split_bounds(indices_or_sections, n, axis):
    """[0, i1, ..., n]: the piece boundaries, as np.split reads `indices_or_sections`: each
    point a slice bound (a negative one counts from the end; all are clipped to [0, n])."""
    if _is_integer(indices_or_sections):
        sections = int(indices_or_sections)
        if sections < 1 or n % sections:
            raise ValueError(f"axis {axis} of size {n} cannot be split into {sections} equal "
                             "sections; pass the split points instead")
        return [n // sections * i for i in range(sections + 1)]
    try:
        points = list(indices_or_sections)
    except TypeError:
        points = None
    if points is None or not all(_is_integer(i) for i in points):
        raise TypeError(f"indices_or_sections must be an int (equal sections) or a list of ints "
                        f"(split points), got {indices_or_sections!r}")
    return [0] + [max(int(i) + n, 0) if i < 0 else min(int(i), n) for i in points] + [n]


def split(x, indices_or_sections, axis=0):
    """x cut along `axis` into a tuple of pieces: N equal sections (an int) or at the given
    points (a list of ints, read as np.split reads them: negative points count from the end,
    and a point before the previous one gives an empty piece and pieces that overlap)."""
    return Split(indices_or_sections, axis)(x)


# =============================================================================== indexing
class GetItem(View):
    """y = x[slices] by NumPy's indexing rules, on any backend; backward scatters gy into
    zeros of x's shape, repeated indices adding up (GetItemGrad)."""

    def __init__(self, slices, key=None):
        self.slices = slices
        self.key = key  # `slices` as the backend's checked key, once known
        self.expanded = None  # for 0-d masks in `slices`: the shape of x the key indexes

    def forward(self, x):
        if self.key is None:  # NumPy's indexing rules on every backend
            device = self.backend.device_of(x)
            index, masks = _index_on_device(self.slices, self.backend, device)
            if masks:
                self.expanded, index = _axes_for_0d_masks(x.shape, index, self.backend, device)
            shape = x.shape if self.expanded is None else self.expanded
            self.key = self.backend.normalize_key(index, shape)
        if self.expanded is not None:
            x = self.xp.reshape(x, self.expanded)
        return self.backend.get_item(x, self.key)

    def backward(self, gy):
        x, = self.inputs
        if self.expanded is None:
            return GetItemGrad(self.key, x.shape, layout(x))(gy)
        expanded = GetItemGrad(self.key, self.expanded, layout(x, self.expanded))(gy)
        return reshape(expanded, x.shape)


class GetItemGrad(Function):
    """gx = zeros of the input's shape with gy scatter-added at `key`, repeated indices
    adding up (GetItem's backward); its own backward is GetItem again."""

    def __init__(self, key, in_shape, layout=None):
        self.key = key  # a key from the forward's backend.normalize_key
        self.in_shape = in_shape
        self.layout = layout  # of the input whose gradient this is, on a lazy backend

    def forward(self, gy):
        gx = self.backend.zeros(self.in_shape, gy.dtype, self.device)
        if self.layout is not None:
            gx = self.backend.laid_out(gx, self.layout)
        return self.backend.scatter_add(gx, self.key, gy)  # repeated indices add up

    def backward(self, ggx):
        return GetItem(self.key, key=self.key)(ggx)  # checked already, for this shape and device


_BASIC_INDICES = frozenset((int, slice, type(None), type(Ellipsis)))


def _index_on_device(key, backend, device):
    """(index, masks): `key` with lists, Variables and other backends' or devices' arrays as
    `backend` arrays on `device` (where the indexed array lives); `masks`: whether it holds a
    0-d boolean mask."""
    out = []
    masks = False
    for k in key if isinstance(key, tuple) else (key,):
        if k.__class__ not in _BASIC_INDICES:  # those stay as they are
            if isinstance(k, Variable):
                k = k.data
            if isinstance(k, (list, tuple)):
                k = backend.asarray(k, dtype=None if k else backend.xp.int64, device=device)
            elif getattr(k, "ndim", 0):
                k = backends.asarray_on(k, device)
            elif not masks:
                masks = _is_0d_mask(k)
        out.append(k)
    return tuple(out), masks


def _is_0d_mask(k):
    """True for a 0-d boolean array or a NumPy bool."""
    if getattr(k, "ndim", None) != 0:
        return False
    backend = backends.backend_of(k)
    return backend is not None and backend.xp.isdtype(k.dtype, "bool")


def _axes_for_0d_masks(shape, key, backend, device):
    """(shape, key) for a key holding 0-d boolean masks, indexing the same elements without them.
    NumPy reads a 0-d mask as an index array into a new axis of length 1 where the mask stands:
    [0] if True, [] if False (its rules then place and broadcast that index as any other). So
    `shape` (x's) gets that size-1 axis, and the key that index array."""
    xp = backend.xp

    def axes_taken(k):  # of x, by an index other than a 0-d mask and Ellipsis
        if k is None or k is Ellipsis:
            return 0
        if getattr(k, "ndim", 0) and xp.isdtype(k.dtype, "bool"):
            return k.ndim
        return 1

    masks = [_is_0d_mask(k) for k in key]
    ellipsis = len(shape) - sum(axes_taken(k) for k, m in zip(key, masks) if not m)
    shape, out, axis = list(shape), [], 0
    for k, mask in zip(key, masks):
        if mask:
            shape.insert(axis, 1)
            out.append(backend.asarray([0] if bool(k) else [], dtype=xp.int64, device=device))
            axis += 1
        else:
            out.append(k)
            axis += ellipsis if k is Ellipsis else axes_taken(k)
    return tuple(shape), tuple(out)


def get_item(x, slices):
    """x[slices] by NumPy's rules: ints, slices, None, Ellipsis, and integer arrays (NumPy or
    backend arrays, lists) and boolean masks (0-d ones too), on any backend. Repeated indices add
    up in the gradient. Out-of-bounds indices raise IndexError (also on CuPy, which would wrap
    them)."""
    return GetItem(slices)(x)
