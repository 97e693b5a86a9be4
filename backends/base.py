"""The Backend contract: what is asked of an array library, written down once."""
import contextlib
import threading

import numpy

from . import indexing


_own_generators = threading.local()  # HostRandom.random_draw's generator, one per thread


class HostRandom:
    """Random numbers for the backends that draw them on the host, from NumPy's global
    generator (numpy.random.seed(n) then reproduces a run, as in DeZero). A backend mixes it in
    ahead of Backend and turns samples into its arrays in `host_samples`."""

    def random_normal(self, shape, dtype, device):
        return self.host_samples(numpy.random, "normal", shape, dtype, device)

    def random_uniform(self, shape, dtype, device):
        return self.host_samples(numpy.random, "uniform", shape, dtype, device)

    def random_draw(self, kind, shape, dtype, device, state):
        generator = getattr(_own_generators, "generator", None)
        if generator is None:  # one per thread, made once: making one costs more than a draw
            generator = _own_generators.generator = numpy.random.RandomState(0)
        generator.set_state(state)
        return self.host_samples(generator, kind, shape, dtype, device)

    def random_lock(self, device):
        # the lock every numpy.random call takes: NumPy's global generator's bit generator's
        # (reentrant); a private attribute, hence the fallback
        lock = getattr(getattr(numpy.random.mtrand, "_rand", None), "_bit_generator", None)
        return getattr(lock, "lock", None) or contextlib.nullcontext()

    def host_samples(self, generator, kind, shape, dtype, device):
        """`kind` ("normal" or "uniform") samples drawn from `generator` (the numpy.random
        module or a RandomState), as this backend's array."""
        samples = generator.randn(*shape) if kind == "normal" else generator.rand(*shape)
        return self.asarray(samples, dtype=dtype, device=device)  # randn() is a float

    def manual_seed(self, seed):
        numpy.random.seed(seed)

    def random_state(self, device):
        return numpy.random.get_state()

    def set_random_state(self, device, state):
        numpy.random.set_state(state)

    def random_position(self, device, state=None):
        kind, keys, position, has_gauss, gauss = (numpy.random.get_state() if state is None
                                                  else state)
        return kind, keys.tobytes(), position, has_gauss, gauss


class ViewsByBase:
    """may_view for the libraries whose views name the array owning their memory as `base`
    (NumPy and CuPy collapse chains of views to it). A backend mixes it in ahead of Backend."""

    def may_view(self, array, other):
        # a copy made by a reshape of a view has a base of its own
        base = array.base
        return base is other or base is getattr(other, "base", None) and base is not None


class DeviceUnavailableError(RuntimeError):
    """A device was asked for that this machine cannot provide (no CuPy, no GPU, no such index)."""


class Backend:
    """One array library. Subclasses fill in every member below; callers use only these.

    Found through `backend_of(array)` and `backend_for_device(device)`.
    """

    name = None           # registry key: "numpy", "cupy", or the namespace's module name
    device_type = None    # the `type` of the Devices it serves: "cpu", "cuda", ...
    xp = None             # the array-API namespace: numpy, cupy, array_api_strict, ...
    array_type = None     # the exact type of its arrays (`type(a) is array_type` is the quick test)
    scalar_types = frozenset()  # types of scalars its functions may return in place of 0-d arrays
    single_device = False # True when all its arrays live on one device
    needs_device_context = False  # True when computing needs `device_context` (CuPy)
    plain = False         # one device and no device context needed: set by backends.register
    lazy = False          # results are recipes until computed (Dask): see `persist`, `layout`
    inner = None          # for a backend whose arrays wrap another backend's: that backend
    captures_graphs = False  # True when `capture` records work as a graph to launch again (CuPy)
    multiplies_bool = False  # True when its multiply takes bool and float arrays (NumPy, CuPy)
    # True when its ufuncs loop over host memory in the calling thread and take out= (NumPy): a
    # recorded step may then run a large elementwise pair a cache-sized block at a time
    loops_on_host = False
    # False when the same work may round differently from one run to the next (CuPy: its
    # scatter-adds add with atomics, so a sum over repeated indices comes in any order)
    reproducible = True

    def settings(self):
        """What decides this backend's arrays and results, by name: two backends with equal
        settings are interchangeable, so registering the second returns the first (register).
        A backend whose options change results (a constructor argument) adds them here."""
        return {"class": type(self), "name": self.name, "device type": self.device_type,
                "library": self.xp, "array type": self.array_type}

    def owns(self, array):
        """True if `array` is one of this backend's arrays."""
        return isinstance(array, self.array_type)

    def owns_memory(self, array):
        """True if writing into `array` can change no other array: it is writable and no view of
        another. False when the library cannot tell (a caller that must own it then copies)."""
        return False

    def may_view(self, array, other):
        """Whether `array`, which owns no memory of its own (owns_memory), may be a view of
        `other`'s: True where the library cannot tell."""
        return True

    def writable(self, array):
        """False if `array` refuses writes in place (NumPy's read-only arrays: numpy.load with
        mmap_mode='r', broadcast_to, frombuffer), read from NumPy-style `flags` without a copy;
        True where the library cannot tell."""
        return getattr(getattr(array, "flags", None), "writeable", True)

    def device_of(self, array):
        """The `Device` that `array` lives on."""
        raise NotImplementedError

    def device_context(self, device):
        """A context manager under which computation happens on `device`. A no-op unless
        `needs_device_context` (CuPy computes on the current GPU, not the array's)."""
        return contextlib.nullcontext()

    def arithmetic_warnings_off(self):
        """A context manager under which the library does not warn of a division by zero, an
        overflow or an invalid value (NumPy's RuntimeWarnings): for callers that report such
        results themselves (anomaly mode). A no-op where the library never warns."""
        return contextlib.nullcontext()

    def as_factor(self, condition, dtype):
        """The bool array `condition` ready to multiply arrays of the floating `dtype` (a mask:
        relu's and max pooling's backward): as it is where `multiplies_bool` (NumPy's and CuPy's
        multiply convert it as they go, to the same product bit for bit, and no float copy of the
        mask is written), else cast, as the array API mixes no bool with float."""
        return condition if self.multiplies_bool else self.xp.astype(condition, dtype)

    def ensure_array(self, obj):
        """A scalar of this library (NumPy's reductions and 0-d arithmetic return them) as a 0-d
        array; anything else unchanged."""
        raise NotImplementedError

    def asarray(self, obj, dtype=None, device=None):
        """A new or shared array from `obj` (array, scalar or nested list) on `device`."""
        raise NotImplementedError

    def zeros(self, shape, dtype, device):
        """A new array of zeros on `device`."""
        raise NotImplementedError

    def empty(self, shape, dtype, device):
        """A new array on `device` whose elements are whatever its memory held: for a buffer
        every element of which is written before it is read. By default zeros."""
        return self.zeros(shape, dtype, device)

    def layout(self, array):
        """How `array` is laid out where the backend is `lazy` (Dask: its chunks), an opaque
        value for `laid_out`; None elsewhere. Ops ask only where `lazy`: NumPy pays nothing."""
        return None

    def check_known_shape(self, array):
        """ValueError, saying how to learn it, where `array`'s shape is not known until it is
        computed (Dask's x[x > 0]); a Variable cannot take such an array: its gradient is laid
        out in it. Asked only where `lazy`: NumPy pays nothing."""

    def laid_out(self, array, layout):
        """`array`, the same values, in `layout` (from `layout` of an array of its shape): what
        an op makes in an input's shape (its gradient, a dropout mask) takes that input's. An
        array this backend has just made (zeros, `xp.broadcast_to`, a random draw) is made again
        in it rather than rearranged (a draw: from the same seed). `array` itself unless
        `lazy`."""
        return array

    def to_device(self, array, device):
        """`array` (one of ours) moved to `device` (one of ours)."""
        raise NotImplementedError

    def to_numpy(self, array):
        """`array` as a NumPy array on the host."""
        raise NotImplementedError

    def normalize_key(self, index, shape):
        """`index` by NumPy's rules (ints, slices, None, Ellipsis, integer arrays, boolean masks;
        arrays on the indexed array's device) checked against `shape`: an opaque key for
        `get_item` and `scatter_add`. IndexError out of bounds (CuPy alone would wrap), TypeError
        for what is no index. A key it returned comes back as it is (checked once)."""
        return indexing.normalize_key(self.xp, index, shape)

    def get_item(self, array, key):
        """`array[key]` by NumPy's rules, for a key from `normalize_key` (shaped for `array`)."""
        if indexing.is_advanced(key):
            return indexing.gather(self.xp, array, key)
        return array[tuple(key)]

    def scatter_add(self, target, index, values):
        """Add `values` into `target[index]` in place, repeated indices adding up (np.add.at);
        returns `target`. `index` is a key from `normalize_key` or anything it takes."""
        return self.add_at(target, tuple(self.normalize_key(index, target.shape)), values)

    def add_at(self, target, key, values):
        """`scatter_add` for a checked key: a plain tuple naming every axis of `target` with
        non-negative ints, slices, None and int64 index arrays (Ellipsis only if it covers none)."""
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

    def random_draw(self, kind, shape, dtype, device, state):
        """The samples `random_normal` (`kind` "normal") or `random_uniform` ("uniform") would
        give after `set_random_state(device, state)`, drawn from a generator of their own: the
        global one does not move."""
        raise NotImplementedError

    def random_lock(self, device):
        """A context manager under which no other thread draws from the global generator for
        `device` through the array library (its own lock, where it has one)."""
        return contextlib.nullcontext()

    def random_state(self, device):
        """An opaque snapshot of the global generator for `device`: `set_random_state` with it
        makes the next draws repeat the draws made after it was taken."""
        raise NotImplementedError

    def set_random_state(self, device, state):
        """Put back a snapshot from `random_state`."""
        raise NotImplementedError

    def random_position(self, device, state=None):
        """Where the global generator for `device` is (read without moving it), or where
        `state` from `random_state` puts it, as a value two of which compare with ==; None
        where it cannot be read (CuPy's generators)."""
        return None

    def assign(self, target, value):
        """Every element of `target` replaced by `value`'s (broadcast, in `target`'s dtype), in
        place: whoever holds `target` sees the new values. Returns `target`."""
        target[...] = value
        return target

    def persist(self, arrays):
        """`arrays` (a list) worked out now and kept so: the same values, no longer a recipe
        that holds how they were made; in the same pass, so are the arrays given to `assign`
        since the last persist (in place). Only lazy backends have anything to do."""
        return arrays

    def capture(self, run):
        """(graph, what `run()` returned): the work `run()` queues on the current device,
        captured to be launched again with one call and no Python, where `captures_graphs`.
        Nothing is computed until `graph.launch(copies)`, the first time included, which first
        copies each (buffer, value) pair of `copies` into the buffer. Every launch does the same
        work on the same memory: it reads the arrays `run` read as they are then, and writes the
        arrays it returned afresh; random numbers drawn in it are the same at every launch. A
        launch runs after the last one, on whatever stream each was made. The memory the graph
        uses is its own for as long as the graph lives."""
        raise NotImplementedError(f"{self.name} arrays are not captured as graphs")

    def refused_in_graphs(self, name, module):
        """True if `capture` refuses a call of the function (or method, or operator) `name`
        from the module `module`: such calls run between graphs."""
        return False

    def graph_memory(self, device):
        """Bytes of device memory held by the graphs `capture` made that are still alive."""
        return 0

    def synchronize(self, device):
        """Block until all work queued on `device` is done (for honest timing)."""

    def memory_in_use(self, device):
        """Bytes of device memory held by the library for `device`, or None if not tracked."""
        return None

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r}>"

    # A backend is a registry entry, not data: copies of an object that holds one share it, and a
    # pickled one finds it again by name (so deepcopy and pickle of such objects work).
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        from . import get_backend

        return get_backend, (self.name,)
