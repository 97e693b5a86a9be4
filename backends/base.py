"""The Backend contract: everything gradcore needs from an array library, written down once."""
import math
import operator


class DeviceUnavailableError(RuntimeError):
    """A device was asked for that this machine cannot provide (no CuPy, no GPU, no such index)."""


class Backend:
    """One array library. Subclasses fill in every member below; ops only ever use these.

    A backend knows nothing of autodiff. `gradcore` reaches it through `backend_of(array)`
    (cached on each Variable) and `backend_for_device(device)`.
    """

    name = None           # registry key: "numpy", "cupy", or the namespace's module name
    device_type = None    # the `type` of the Devices it serves: "cpu", "cuda", ...
    xp = None             # the array-API namespace ops call: numpy, cupy, array_api_strict, ...
    array_type = None     # the exact type of its arrays (the fast path checks `type(y) is array_type`)
    scalar_types = frozenset()  # types of the scalars its ops may return instead of 0-d arrays
    single_device = False # True when every array lives on one device: device checks are skipped
    needs_device_context = False  # True when computing needs `device_context` (CuPy)

    def owns(self, array):
        """True if `array` is one of this backend's arrays."""
        return isinstance(array, self.array_type)

    def device_of(self, array):
        """The `Device` that `array` lives on."""
        raise NotImplementedError

    def device_context(self, device):
        """A context manager under which computation happens on `device`."""
        raise NotImplementedError

    def ensure_array(self, obj):
        """A scalar of this library (NumPy's reductions and 0-d ops return them) as a 0-d array;
        anything else unchanged. Called on every op result that is not `array_type`."""
        raise NotImplementedError

    def asarray(self, obj, dtype=None, device=None):
        """A new or shared array from `obj` (array, scalar or nested list) on `device`."""
        raise NotImplementedError

    def zeros(self, shape, dtype, device):
        """A new array of zeros on `device`."""
        raise NotImplementedError

    def to_device(self, array, device):
        """`array` (one of ours) moved to `device` (one of ours)."""
        raise NotImplementedError

    def to_numpy(self, array):
        """`array` as a NumPy array on the host."""
        raise NotImplementedError

    def scatter_add(self, target, index, values):
        """Add `values` into `target[index]` in place, repeated indices adding up; returns `target`."""
        raise NotImplementedError

    def random_normal(self, shape, dtype, device):
        """Standard normal samples from the backend's global generator for `device`."""
        raise NotImplementedError

    def random_uniform(self, shape, dtype, device):
        """Uniform [0, 1) samples from the backend's global generator for `device`."""
        raise NotImplementedError

    def manual_seed(self, seed):
        """Seed the backend's global generator(s)."""
        raise NotImplementedError

    def synchronize(self, device):
        """Block until all work queued on `device` is done (for honest timing)."""

    def memory_in_use(self, device):
        """Bytes of device memory held by the library for `device`, or None if not tracked."""
        return None

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r}>"


# =============================================================================== NumPy-style keys
# gradcore indexes by NumPy's rules (integer arrays, boolean masks, mixed with slices and None);
# the array API promises only basic indices, all-integer keys and `take`. These two helpers give
# NumPy's result from array-API calls alone: get_item's forward and the generic scatter_add use them.
_REST = object()  # the axes a key without an ellipsis leaves unnamed, at its end

def normalize_key(xp, key, shape):
    """`key` (one index or a tuple) as a tuple that spells out every axis of `shape`.

    Ellipsis becomes slices; ints and integer arrays are checked against their axis and made
    non-negative; integer arrays become int64; a boolean mask becomes one integer array per axis
    it covers (`nonzero`). Index arrays must already be `xp` arrays on the indexed array's device.
    Raises IndexError (out of bounds, too many indices, a mask of the wrong shape) or TypeError
    (an index that is not an int, slice, None, Ellipsis, or integer/boolean array).
    """
    entries = []
    used = 0  # axes of `shape` the key consumes
    ellipses = 0
    for k in key if isinstance(key, tuple) else (key,):
        if k is None or isinstance(k, slice):
            used += k is not None
        elif k is Ellipsis:
            ellipses += 1
        elif isinstance(k, bool):
            raise TypeError(f"a Python bool ({k}) is not an index: use a boolean array as a mask")
        elif getattr(k, "ndim", 0) == 0:  # ints, NumPy integer scalars, 0-d integer arrays
            try:
                k = operator.index(k)
            except TypeError:
                raise TypeError(
                    f"indices must be ints, slices, None, Ellipsis, or integer or boolean arrays; "
                    f"got {k!r} of type {type(k).__name__}") from None
            used += 1
        elif xp.isdtype(k.dtype, "bool"):
            used += k.ndim
        elif xp.isdtype(k.dtype, "integral"):
            used += 1
        else:
            raise TypeError(f"index arrays must have an integer or boolean dtype, got {k.dtype}; "
                            "convert them first (e.g. astype int64)")
        entries.append(k)
    if ellipses > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if used > len(shape):
        raise IndexError(f"too many indices: {used} for an array of {len(shape)} dimension(s)")
    if not ellipses:
        entries.append(_REST)

    out = []
    axis = 0
    for k in entries:
        if k is Ellipsis or k is _REST:
            rest = len(shape) - used
            out.extend([slice(None)] * rest)
            axis += rest
            if not rest and k is Ellipsis:
                out.append(Ellipsis)  # even an empty ellipsis parts advanced indices for NumPy
        elif k is None:
            out.append(None)
        elif isinstance(k, slice):
            out.append(k)
            axis += 1
        elif isinstance(k, int):
            n = shape[axis]
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for axis {axis} with size {n}")
            out.append(k + n if k < 0 else k)
            axis += 1
        elif xp.isdtype(k.dtype, "bool"):
            covered = tuple(shape[axis:axis + k.ndim])
            if tuple(k.shape) != covered:
                raise IndexError(f"a boolean index of shape {tuple(k.shape)} does not match the "
                                 f"shape {covered} of the axes it masks (from axis {axis})")
            out.extend(xp.nonzero(k))
            axis += k.ndim
        else:
            out.append(_checked_indices(xp, k, axis, shape[axis]))
            axis += 1
    return tuple(out)


def _checked_indices(xp, k, axis, n):
    """An integer index array for an axis of size `n`: int64, bounds-checked, negatives wrapped.
    The check is done here on purpose: CuPy's `take` and indexing wrap out-of-range indices."""
    if k.dtype != xp.int64:
        k = xp.astype(k, xp.int64)
    if bool(xp.any((k < -n) | (k >= n))):
        low, high = int(xp.min(k)), int(xp.max(k))
        raise IndexError(f"index {high if high >= n else low} is out of bounds for axis {axis} "
                         f"with size {n}")
    return xp.where(k < 0, k + n, k)


def is_advanced(key):
    """True if a normalized key holds an index array."""
    return any(hasattr(k, "shape") for k in key)


def gather(xp, x, key):
    """`x[key]` by NumPy's rules for a key from `normalize_key`, with array-API calls only: the
    basic part by slicing, then one `take` over the array-indexed axes merged into one."""
    basic = []
    arrays = []       # (axis of the sliced array, index array)
    advanced_at = []  # positions in `key` of the advanced entries: arrays, and ints beside them
    axis = 0
    for position, k in enumerate(key):
        if k is None or isinstance(k, slice):
            basic.append(k)
            axis += 1
        elif k is Ellipsis:  # an empty one (normalize_key keeps it only then)
            basic.append(k)
        elif isinstance(k, int):
            basic.append(k)
            advanced_at.append(position)
        else:
            basic.append(slice(None))
            arrays.append((axis, k))
            advanced_at.append(position)
            axis += 1
    y = x[tuple(basic)]
    if not arrays:
        return y

    # NumPy puts the broadcast index shape where the indexed axes were if the advanced entries
    # are next to each other in the key, and in front otherwise
    adjacent = advanced_at[-1] - advanced_at[0] == len(advanced_at) - 1
    start = sum(1 for k in key[:advanced_at[0]] if k is None or isinstance(k, slice)) if adjacent else 0
    axes = [a for a, _ in arrays]
    indices = [i for _, i in arrays]
    if len(indices) > 1:
        indices = xp.broadcast_arrays(*indices)
    rest = [a for a in range(y.ndim) if a not in axes]
    order = rest[:start] + axes + rest[start:]
    if order != list(range(y.ndim)):
        y = xp.permute_dims(y, tuple(order))
    sizes = y.shape[start:start + len(axes)]
    before, after = tuple(y.shape[:start]), tuple(y.shape[start + len(axes):])
    flat = indices[0]
    for i, n in zip(indices[1:], sizes[1:]):
        flat = flat * n + i  # row-major position within the merged axes
    if len(axes) > 1:
        y = xp.reshape(y, before + (math.prod(sizes),) + after)
    y = xp.take(y, xp.reshape(flat, (-1,)), axis=start)
    return xp.reshape(y, before + tuple(flat.shape) + after)
