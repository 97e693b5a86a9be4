"""Indexing by NumPy's rules with array-API calls only: the keys of reading and scatter_add."""
import math
import operator

# =============================================================================== NumPy-style keys
# NumPy's indexing rules (integer arrays, boolean masks, mixed with slices and None) on any
# backend; the array API promises only basic indices, all-integer keys and `take`. These helpers
# give NumPy's result from array-API calls alone, for reading an item and for scatter_add.


def normalize_key(xp, key, shape):
    """`key` (one index or a tuple) as a tuple that spells out every axis of `shape`.

    Ellipsis becomes slices; slice bounds past an end are clipped to it (as NumPy reads them;
    the array API leaves them unspecified); ints and integer arrays are checked against their
    axis and made non-negative; integer arrays become int64; a boolean mask, once its shape is
    checked, becomes one integer array per axis it covers (xp.nonzero). Index arrays must
    already be `xp` arrays on the indexed array's device. Raises IndexError (out of bounds, too
    many indices, a mask of the wrong shape) or TypeError (an index that is not an int, slice,
    None, Ellipsis, or integer/boolean array). A key it returned comes back as it is (the checks
    are not paid twice for a key used again).
    """
    if key.__class__ is NormalizedKey:
        return key
    entries = []  # (kind, index)
    used = 0      # axes of `shape` the key consumes
    ellipses = 0
    for k in key if isinstance(key, tuple) else (key,):
        if k is None:
            kind = "new"
        elif isinstance(k, slice):
            kind, used = "slice", used + 1
        elif k is Ellipsis:
            kind, ellipses = "rest", ellipses + 1
        elif isinstance(k, bool):
            raise TypeError(f"a Python bool ({k}) is not an index: use a boolean array as a mask")
        elif getattr(k, "ndim", 0) == 0:  # ints, NumPy integer scalars, 0-d integer arrays
            try:
                k = operator.index(k)
            except TypeError:
                raise TypeError(
                    f"indices must be ints, slices, None, Ellipsis, integer arrays, or boolean "
                    f"arrays of at least one axis (get_item takes 0-d ones too); got {k!r} of "
                    f"type {type(k).__name__}") from None
            kind, used = "int", used + 1
        elif k.dtype == xp.int64 or xp.isdtype(k.dtype, "integral"):
            kind, used = "array", used + 1
        elif xp.isdtype(k.dtype, "bool"):
            kind, used = "mask", used + k.ndim
        else:
            raise TypeError(f"index arrays must have an integer or boolean dtype, got {k.dtype}; "
                            "convert them first (e.g. astype int64)")
        entries.append((kind, k))
    if ellipses > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if used > len(shape):
        raise IndexError(f"too many indices: {used} for an array of {len(shape)} dimension(s)")
    if not ellipses:
        entries.append(("rest", None))  # the axes the key leaves unnamed, at its end

    out = []
    axis = 0
    for kind, k in entries:
        if kind == "slice":
            n, start, stop = shape[axis], k.start, k.stop
            # bounds already in range, the common case, pass as they are: checked inline, as
            # every get_item comes here
            if not ((start is None or start.__class__ is int and -n <= start <= n)
                    and (stop is None or stop.__class__ is int and -n <= stop <= n)):
                k = _bounded_slice(k, n)
            out.append(k)
            axis += 1
        elif kind == "int":
            n = shape[axis]
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for axis {axis} with size {n}")
            out.append(k + n if k < 0 else k)
            axis += 1
        elif kind == "array":
            out.append(_checked_indices(xp, k, axis, shape[axis]))
            axis += 1
        elif kind == "rest":
            rest = len(shape) - used
            out.extend([slice(None)] * rest)
            axis += rest
            if not rest and k is Ellipsis:
                out.append(Ellipsis)  # even an empty ellipsis parts advanced indices for NumPy
        elif kind == "new":
            out.append(None)
        else:  # a mask
            covered = tuple(shape[axis:axis + k.ndim])
            if tuple(k.shape) != covered:
                raise IndexError(f"a boolean index of shape {tuple(k.shape)} does not match the "
                                 f"shape {covered} of the axes it masks (from axis {axis})")
            out.extend(xp.nonzero(k))
            axis += k.ndim
    arrays = [tuple(k.shape) for k in out if hasattr(k, "shape")]
    if len(arrays) > 1:
        _broadcast_shape(arrays)  # IndexError if they do not broadcast together
    return NormalizedKey(out)


def _bounded_slice(k, n):
    """The slice `k` of an axis of size `n` with its bounds in range, picking the same elements:
    NumPy clips bounds past the ends (x[:10] of 4 rows, the last batch of x[i:i + B]); the
    array API leaves them unspecified, and array-api-strict refuses them."""
    r = range(*k.indices(n))
    if not r:
        return slice(0, 0, 1)
    # a stop of -1 (before the first element, for a negative step) would read as the last one
    return slice(r.start, None if r.stop < 0 else r.stop, r.step)


class NormalizedKey(tuple):
    """A key from `normalize_key`, for the shape it was checked against."""

    __slots__ = ()


def _checked_indices(xp, k, axis, n):
    """An integer index array for an axis of size `n`: int64, bounds-checked, negatives wrapped.
    The check is done here on purpose: CuPy's `take` and indexing wrap out-of-range indices."""
    if k.dtype != xp.int64 and xp.isdtype(k.dtype, "unsigned integer"):
        # checked before the cast: uint64 past int64's range would turn negative (2**64 - 1 to
        # -1, the last element), and the message shows the index as given
        high = int(xp.max(k)) if k.size else 0
        if high >= n:
            raise IndexError(f"index {high} is out of bounds for axis {axis} with size {n}")
        return xp.astype(k, xp.int64, copy=True)
    # a copy, always: the caller may write into their index array before backward reads it
    k = xp.astype(k, xp.int64, copy=True)
    if k.size == 0:
        return k
    low, high = int(xp.min(k)), int(xp.max(k))
    if low < -n or high >= n:
        raise IndexError(f"index {high if high >= n else low} is out of bounds for axis {axis} "
                         f"with size {n}")
    return xp.where(k < 0, k + n, k) if low < 0 else k


def is_advanced(key):
    """True if a normalized key holds an index array."""
    return any(hasattr(k, "shape") for k in key)


def gather(xp, x, key):
    """`x[key]` by NumPy's rules for a key from `normalize_key`, with array-API calls only: the
    basic part by slicing, then one `take` over the array-indexed axes merged into one."""
    basic = []
    arrays = []   # (axis of the sliced array, index array)
    axis = 0
    for k in key:
        if k is None or k.__class__ is slice:
            basic.append(k)
            axis += 1
        elif k is Ellipsis or k.__class__ is int:  # an int drops its axis from y
            basic.append(k)
        else:
            basic.append(slice(None))
            arrays.append((axis, k))
            axis += 1
    y = x[tuple(basic)]
    if not arrays:
        return y
    start = index_start(key)
    axes = [a for a, _ in arrays]
    if axes != list(range(start, start + len(axes))):
        rest = [a for a in range(y.ndim) if a not in axes]
        y = xp.permute_dims(y, tuple(rest[:start] + axes + rest[start:]))
    sizes = y.shape[start:start + len(axes)]
    before, after = tuple(y.shape[:start]), tuple(y.shape[start + len(axes):])
    flat = arrays[0][1]
    for (_, i), n in zip(arrays[1:], sizes[1:]):
        flat = flat * n + i  # row-major position within the merged axes (broadcasting)
    if len(axes) > 1:
        y = xp.reshape(y, before + (math.prod(sizes),) + after)
    if flat.ndim == 1:
        return xp.take(y, flat, axis=start)
    y = xp.take(y, xp.reshape(flat, (-1,)), axis=start)
    return xp.reshape(y, before + tuple(flat.shape) + after)


def _broadcast_shape(shapes):
    """The shape `shapes` broadcast to (they are index arrays that NumPy broadcasts together)."""
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for shape in shapes:
        for d, n in enumerate(shape, ndim - len(shape)):
            if n != 1:
                if out[d] not in (1, n):
                    raise IndexError("index arrays could not be broadcast together, shapes "
                                     + " and ".join(str(tuple(s)) for s in shapes))
                out[d] = n
    return tuple(out)


def index_start(key):
    """For a key from `normalize_key` holding index arrays: the axis of x[key] where their
    broadcast shape goes. NumPy puts it where the indexed axes were if the advanced entries
    (ints too) stand next to each other in the key, and in front otherwise."""
    advanced = [p for p, k in enumerate(key) if k.__class__ is int or hasattr(k, "shape")]
    if advanced[-1] - advanced[0] != len(advanced) - 1:
        return 0
    return sum(1 for k in key[:advanced[0]] if k is None or k.__class__ is slice)


def flat_positions(xp, shape, key, device=None):
    """For a key from `normalize_key`: the row-major flat position, in an array of `shape`, of
    each element of `x[key]`, shaped like `x[key]` (a broadcast view). Summed from one small term
    per axis, so nothing of `shape`'s full size is built; scatter_add uses it on a flat target."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    others = []       # the output axes made by slices (axis, slice) and None (None), in order
    arrays = []       # (axis, index array)
    offset = 0        # what the ints add
    axis = 0
    for k in key:
        if k is None:
            others.append(None)
        elif isinstance(k, slice):
            others.append((axis, k))
            axis += 1
        elif isinstance(k, int):
            offset += k * strides[axis]
            axis += 1
        elif k is not Ellipsis:
            arrays.append((axis, k))
            axis += 1
    start = index_start(key) if arrays else 0
    index_shape = _broadcast_shape([tuple(i.shape) for _, i in arrays]) if arrays else ()
    sizes = [1 if o is None else len(range(*o[1].indices(shape[o[0]]))) for o in others]
    out_shape = tuple(sizes[:start]) + index_shape + tuple(sizes[start:])
    ndim = len(out_shape)

    total = offset
    for j, o in enumerate(others):
        if o is None:
            continue
        d, k = o
        at = j if j < start else j + len(index_shape)
        kwargs = {} if device is None else {"device": device}
        term = xp.arange(*k.indices(shape[d]), **kwargs) * strides[d]
        total = total + xp.reshape(term, (1,) * at + (sizes[j],) + (1,) * (ndim - at - 1))
    trail = (1,) * (ndim - start - len(index_shape))
    for d, i in arrays:  # each index array right-aligned within the broadcast index shape
        lead = (1,) * (start + len(index_shape) - i.ndim)
        total = total + xp.reshape(i * strides[d], lead + tuple(i.shape) + trail)
    return xp.broadcast_to(total, out_shape)
