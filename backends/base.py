"""The Backend contract: everything gradcore needs from an array library, written down once."""
import contextlib


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
    plain = False         # single_device and not needs_device_context: set by backends.register

    def owns(self, array):
        """True if `array` is one of this backend's arrays."""
        return isinstance(array, self.array_type)

    def owns_memory(self, array):
        """True if writing into `array` can change no other array: it is writable and no view of
        another. False when the library cannot tell (then gradcore copies where it must own)."""
        return False

    def device_of(self, array):
        """The `Device` that `array` lives on."""
        raise NotImplementedError

    def device_context(self, device):
        """A context manager under which computation happens on `device`. A no-op unless
        `needs_device_context` (CuPy computes on the current GPU, not the array's)."""
        return contextlib.nullcontext()

    def ensure_array(self, obj):
        """A scalar of this library (NumPy's reductions and 0-d ops return them) as a 0-d array;
        anything else unchanged. gradcore keeps such scalars inside the graph and calls this when
        one is handed out (Variable.data) or comes in (Variable(data))."""
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
        """Add `values` into `target[index]` in place, repeated indices adding up (np.add.at);
        returns `target`. `index` follows NumPy's rules (ints, slices, None, Ellipsis, integer
        arrays, boolean masks; arrays on `target`'s device). Bounds are the caller's to check
        (CuPy wraps out-of-range indices); `normalize_key` does it."""
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

    # A backend is a registry entry, not data: copies of a Variable share it, and a pickled one
    # finds it again by name (so deepcopy and pickle of Variables and models work).
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        from . import get_backend

        return get_backend, (self.name,)
