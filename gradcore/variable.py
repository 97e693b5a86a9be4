"""Variable (a node holding an array and its gradient), Parameter, as_variable, as_array."""
import builtins
import collections
import contextlib
import contextvars
import copy
import itertools
import math
import operator
import os
import sys
import threading
import weakref

import numpy

import backends
from backends import backend_of

from .config import recording

# While gradcore.compile records a step: its Recorder (which acts in the recording thread only)
step_recorder = None
# Bumped whenever a Module gains, loses or replaces a Parameter, buffer or sub-Module, and,
# outside a recording, whenever a Module's hooks change: a step gradcore.compile recorded ran
# with what it found, so record again (a Variable's requires_grad, hooks and data's shape, dtype,
# library or chunks: value_changes)
structure_changes = [0]
# Counts each change of a Python value (a number, a string, a tuple of them) on a Module a
# recorded step reached, and of the settings_of a Variable a tape reads; changed_values notes
# which, (count, id(module), name) or (count, id(variable), None), the most recent
# VALUE_CHANGES_KEPT. Unlike structure_changes, no key changes: a tape looks at what changed
# since it last ran (Tape.values_hold), so one step's `self.n = x.shape[0]`, which a smaller
# last batch changes, leaves the other steps' tapes alone, and a GAN's steps, freezing one
# model and then the other, each find the settings their tapes took
VALUE_CHANGES_KEPT = 4096
value_changes = [0]
changed_values = collections.deque(maxlen=VALUE_CHANGES_KEPT)
# held to count and note a change, and to read the notes (a deque changed while read raises;
# counts noted out of order would hide one)
values_lock = threading.Lock()


def value_changed(obj, name):
    """obj.name, a Python value of a Module a tape may have taken as it was, changed; with name
    None, the settings_of the Variable obj: see value_changes."""
    with values_lock:
        value_changes[0] += 1
        changed_values.append((value_changes[0], id(obj), name))


def same_value(a, b):
    """Whether a and b are equal numbers (Python's, NumPy's scalars), strings, None, or tuples,
    lists or dicts of them (a shape kept); anything else only if it is the same object."""
    kind = a.__class__
    if kind is not b.__class__:
        return False
    if kind in (tuple, list):
        return len(a) == len(b) and all(map(same_value, a, b))
    if kind is dict:
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if kind in (float, complex) or issubclass(kind, (numpy.floating, numpy.complexfloating)):
        # NaN as NaN (the keys' rule), -0.0 apart from 0.0 (as keys tell them apart)
        return all(x == y and math.copysign(1.0, x) == math.copysign(1.0, y) or x != x and y != y
                   for x, y in ((a.real, b.real), (a.imag, b.imag)))
    if kind in (int, bool, str, bytes, type(None)) or issubclass(kind, numpy.generic):
        return bool(a == b)
    return a is b


_IMMUTABLE = frozenset((int, float, bool, complex, str, bytes, type(None)))


def is_python_value(value):
    """Whether `value` is a Python value a tape compares by value (see value_changes): a number
    (Python's or NumPy's), a string, None, or a tuple of them; nothing that can change in place."""
    kind = value.__class__
    if kind in _IMMUTABLE or issubclass(kind, numpy.generic):
        return True
    return kind is tuple and all(map(is_python_value, value))


_watched = {}  # id -> a weak reference to each Variable a recorded tape reads or writes


def watch(variables):
    """Changes to the requires_grad or hooks of these Variables (a tape's) count: see
    settings_changed."""
    for v in variables:
        _watched[id(v)] = weakref.ref(v, lambda ref, i=id(v): _watched.get(i) is ref and
                                      _watched.pop(i))


def settings_changed(v=None):
    """A requires_grad or a hook changed, of the Variable v (noted if a tape reads it: the tapes
    that did compare its settings_of, see value_changes) or of a Module (see structure_changes).
    While a step records, a Variable's change is noted for the end of the recording (where the
    tapes of other steps learn of it too), a Module's not: hooks it registers as it runs are
    part of what it records."""
    recording = step_recorder is not None and step_recorder.is_active()
    if v is None:
        if not recording:
            structure_changes[0] += 1
        return
    if recording:
        step_recorder.settings_noted[id(v)] = v
        return
    watched = _watched.get(id(v))
    if watched is not None and watched() is v:
        value_changed(v, None)


def settings_of(v):
    """What a recorded tape took of the Variable v besides its values: whether it requires grad,
    its hooks (the objects), and its data's library, shape, dtype, device and (Dask) chunks.
    Compared by same_settings."""
    data, backend = v._data, v._backend
    return (v._requires_grad, tuple(v._hooks or ()), tuple(getattr(v, "_post_hooks", ())),
            backend, None if data is None else (data.shape, data.dtype, backend.device_of(data)),
            backend.layout(data) if data is not None and backend.lazy else None)


def same_settings(a, b):
    """Whether two settings_of are the same: the hooks the same objects (a hook's own == may
    compare arrays), the rest equal."""
    return (a[0] == b[0] and a[3:] == b[3:] and len(a[1]) == len(b[1]) and len(a[2]) == len(b[2])
            and all(map(operator.is_, a[1] + a[2], b[1] + b[2])))


def has_graph(v):
    """True if gradients flow back from the Variable v: a recorded op made it, or it is a leaf
    that requires grad (one computed under no_grad or from constants only has none)."""
    return v.creator is not None or v._requires_grad


_SCALARS = frozenset((int, float, bool))  # `x.__class__ in _SCALARS`: a hash lookup, no comparisons


def _check_data(data):
    """(array, backend, "float" or "integral") for what `Variable(data)` accepts; TypeError
    naming anything else."""
    if data is None:
        return None, None, "float"
    backend = backend_of(data)
    if backend is not None and backend.inner is not None and step_recorder is None:
        # a traced array a compiled step kept (in a dict, a list) past its recording: outside
        # a recording, the array it wraps, the one eager code would have kept
        data, backend = data.value, backend.inner
    if backend is None:
        if isinstance(data, (*_SCALARS, list, tuple)):
            try:
                array, failed = numpy.asarray(data), None
            except (TypeError, ValueError) as e:
                array, failed = None, e
            # a Variable that requires grad among the items makes NumPy fail (its __array__
            # refuses) or give an object array, numbers alone never: only then are the items
            # walked in Python. One that needs no grad gives its values: no graph to lose
            if (failed is not None or array.dtype == object) and isinstance(
                    data, (list, tuple)) and _holds_variable(data):
                raise TypeError(
                    "Variable data: a list or tuple holding Variables would keep their values "
                    "but not their graph; use F.stack(...) or F.concatenate(...) to keep it, or "
                    "pass [v.data for v in ...] for the values alone") from None
            if failed is not None:
                raise failed
            return array, backends.NUMPY, _numeric_kind(backends.NUMPY, array.dtype)
        raise TypeError(
            f"Variable data must be an array of a registered backend (numpy.ndarray, cupy.ndarray, "
            f"an __array_namespace__ array), a Python scalar, a list or a tuple; got "
            f"{type(data).__module__}.{type(data).__qualname__}")
    if type(data) is not backend.array_type:
        data = backend.ensure_array(data)  # NumPy scalars become 0-d arrays
    elif backend.lazy:
        backend.check_known_shape(data)  # a recipe whose shape is not known yet: refused now
    accepted = _ACCEPTED.get(backend)
    kind = None if accepted is None else accepted.get(data.dtype)
    if kind is None:  # a dtype seen for the first time, one held as another, or one refused
        data = _native(data)
        kind = _numeric_kind(backend, data.dtype)
        _ACCEPTED.setdefault(backend, {})[data.dtype] = kind
    return data, backend, kind


def _native(data):
    """`data` in the machine's byte order: a copy of data in the other one (a .npy file written
    on another machine, numpy.frombuffer(..., ">f8")), whose gradients, computed in native
    order, would never match its dtype (a hook's result refused); else `data` itself."""
    dtype = data.dtype
    if getattr(dtype, "isnative", True):  # only NumPy's dtypes have a byte order
        return data
    return data.astype(dtype.type)  # the type: NumPy's own native dtype, not an equal copy


def _holds_variable(items):
    """True if the list or tuple `items` holds a Variable, at any depth."""
    return any(isinstance(v, Variable) or isinstance(v, (list, tuple)) and _holds_variable(v)
               for v in items)


def _numeric_kind(backend, dtype):
    """dtype_kind, for the dtypes a Variable may hold: TypeError for complex ones."""
    kind = dtype_kind(backend, dtype)
    if kind == "complex":
        raise TypeError(
            f"Variable: {dtype} data is not supported: gradcore differentiates real numbers only "
            "(a complex gradient needs a convention no op here implements); hold the real and "
            "imaginary parts in two float Variables")
    return kind


# backend -> {dtype: "float" or "integral" (bool and integers)}, filled on first sight. Per backend:
# array-api-strict's dtypes hash like NumPy's and warn when compared with them
_KINDS = {}
# The same for the dtypes Variable(data) takes as they are, for _check_data's one lookup: a dtype
# in the other byte order (_native) or a refused one is never here, so it is looked at each time
_ACCEPTED = {}


def dtype_kind(backend, dtype):
    """"float", "integral" (bool and integers) or "complex" for a dtype of `backend`; TypeError
    for anything that is not numbers."""
    kinds = _KINDS.get(backend)
    if kinds is None:
        kinds = _KINDS[backend] = {}
    kind = kinds.get(dtype)
    if kind is None:
        isdtype = backend.xp.isdtype
        if isdtype(dtype, "complex floating"):
            kind = "complex"
        elif isdtype(dtype, "real floating"):
            kind = "float"
        elif isdtype(dtype, "integral") or isdtype(dtype, "bool"):
            kind = "integral"
        else:
            raise TypeError(f"Variable: {dtype} data is not numbers; a Variable holds bool, "
                            "integer or floating-point arrays")
        kinds[dtype] = kind
    return kind


def no_data(where, error=TypeError):
    """The error for `where` ("len(x)", "x.shape") on a Variable with no data: Variable(None),
    or one released (x.data = None)."""
    return error(f"{where}: this Variable has no data (data is None); give it an array first "
                 "(x.data = ...)")


def _cannot_require_grad(dtype):
    return TypeError(
        f"only floating-point Variables can require grad, and this one holds {dtype} data (its "
        "gradient would be truncated to integers); cast it to a float dtype first, e.g. "
        "Variable(x.astype(numpy.float32)), or pass requires_grad=False")


# One clock orders both the Functions (their `sequence`, taken when recorded) and the writes to
# Variables: a Function recorded before a write to one of its inputs has a smaller number.
sequence = itertools.count()
# while gradcore.checkpoint runs a block again: a list that each hook registered then joins, as
# (Variable, the handle of that registration), for the recomputation to take off
hooks_registered = contextvars.ContextVar("gradcore.hooks_registered", default=None)
# While gradcore.checkpoint runs a block: block_writes (recompute._Writes), told of each write
# into a Variable's data: "given" data where it had none (a lazily created weight), "release"d
# (set to None), "set" to other data, or written "in place" by a Function (mark_dirty); of each
# Variable "detached" from another (before: the other); and of each update of batch norm's
# running statistics (before: (backend, the array, a copy of it before)), to put back where the
# block is refused; made_in_block, a list that each Variable made by Variable(...) joins (a
# constant the block makes anew); and how many such runs are open in any thread (the data
# setter, Variable() and mark_dirty look at the lists only then: see block_running)
block_writes = contextvars.ContextVar("gradcore.block_writes", default=None)
made_in_block = contextvars.ContextVar("gradcore.made_in_block", default=None)
blocks_running = [0]
blocks_lock = threading.Lock()


def note_block_write(v, how, before=None):
    """v's data is written (`how`: see block_writes) while a checkpointed block runs."""
    writes = block_writes.get()
    if writes is not None:
        writes.note(v, how, before)


@contextlib.contextmanager
def block_running():
    """A checkpointed block runs, in this thread, inside: counted in blocks_running."""
    with blocks_lock:
        blocks_running[0] += 1
    try:
        yield
    finally:
        with blocks_lock:
            blocks_running[0] -= 1


# The code of every Function subclass's backward (Function.__init_subclass__ adds each): an
# augmented assignment written there rebinds (_augmented)
backward_codes = set()
# The gradient a hook running in this thread was handed (engine._run_hooks; a post-accumulate
# hook's .grad too), and, once the hook writes `g op= ...` (which rebinds: _augmented), that
# gradient again as `rebound`, with its `result`: a hook that then returns None has lost its
# result, and is told so. `handed`: a gradient hook's g alone, whose array it must not write
# into (g.data *= 10: the data setter sees its own array come back)
hooked = threading.local()
# The stamp of the latest write to any Variable: backward checks a Function's inputs only if it
# was recorded before that (in a loop of forward, backward, update: never).
latest_write = [-1]
_stamping = threading.Lock()
# a leaf's post-accumulate hook list, made and emptied; a hook list and the tickets of its
# handles (_Registrations), changed together
_post_hooks_lock = threading.Lock()


def _after_fork():
    """In the child of an os.fork (multiprocessing's workers on Linux): a write another thread
    of the parent was stamping, or a hook list it was changing, would never release its lock
    there. The forking thread holds neither while it forks: no user code runs under them."""
    global _stamping, _post_hooks_lock
    _stamping = threading.Lock()
    _post_hooks_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
# Variable -> (shape, dtype, backend, device) of the array it held before `x.data = None` (DeZero
# frees an intermediate's memory so, book step 43: t = matmul(x, W); y = t + b; t.data = None):
# the walk still gives t a gradient shaped and placed like it. Held weakly, emptied on new data
released = weakref.WeakKeyDictionary()
_KEPT_STAMPS = 64  # stamps kept per Variable: enough to tell every version a live graph saw
# A number of that clock read back from a pickle or a copy (a Function's sequence, an op
# result's _sequence, a write's stamp) may be another process's, whose clock ran on its own: it
# is moved this far into the past. The numbers of one pickle move together, so they keep their
# order, and whatever is recorded or written after (larger) comes after them: a later write is
# seen, a later consumer's gradient is added before the old op runs. No clock changes: no lock
_RESTORED_SHIFT = 2 ** 64


def restored(number):
    """A number of the clock (`sequence`) read back from a pickle or a copy, moved into the
    past (see _RESTORED_SHIFT)."""
    return number - _RESTORED_SHIFT


class _WriteLog:
    """A Variable's writes: how many (its version) and the stamps of the latest ones. Views share
    their base's log (share_versions): most never see a write, so the stamps' deque is made at
    the first one."""

    __slots__ = ("count", "stamps")

    def __init__(self, count=0, stamps=()):
        self.count = count
        self.stamps = collections.deque(stamps, maxlen=_KEPT_STAMPS) if stamps else ()

    def __setstate__(self, state):
        # a copy or pickle: Python's state of a class with __slots__, (None, {slot: value})
        slots = state[1]
        self.__init__(slots["count"], [restored(s) for s in slots["stamps"]])


def note_write(x):
    """Count a write to `x.data` by gradcore (the data setter, optimizers, in-place moves): bumps
    `x.version`, so backward through a graph recorded before it refuses to run."""
    log = getattr(x, "_writes", None)
    if log is None:
        log = x._writes = _WriteLog()
    if not log.stamps:
        log.stamps = collections.deque(maxlen=_KEPT_STAMPS)
    log.count += 1
    with _stamping:  # taken and published together: latest_write never goes back to an older one
        log.stamps.append(stamp := next(sequence))
        latest_write[0] = stamp


def fresh_log(x):
    """A copy of x's write log (or None), for x to go on with alone when it is given another
    array: its views keep the old one."""
    log = getattr(x, "_writes", None)
    return None if log is None else _WriteLog(log.count, log.stamps)


def _may_share_memory(old, old_backend, new, new_backend):
    """False only if the arrays `old` and `new` surely share no memory: the library says so
    (NumPy's and CuPy's may_share_memory, a bounds check), or neither is a view of another
    array (owns_memory). True where the library cannot tell (array-api-strict): the price is a
    backward refused that could have run, never one that runs on overwritten values."""
    if old is None or new is None:
        return False
    if step_recorder is not None and step_recorder.is_active():
        return False  # traced arrays, not asked: as a replay stores them (compile.tape._store)
    if old_backend is new_backend:
        overlaps = getattr(new_backend.xp, "may_share_memory", None)
        if overlaps is not None:
            return overlaps(old, new)
    return not (old_backend.owns_memory(old) and new_backend.owns_memory(new))


def share_versions(x, view):
    """Give `view` (a Variable over x's memory: x.detach(), a reshape of it) x's write log: a
    write through either bumps both versions, so a backward that saved one refuses to run after
    the other was written in place (an optimizer step on a parameter)."""
    log = getattr(x, "_writes", None)
    if log is None:
        log = x._writes = _WriteLog()
    view._writes = log


def version_at(x, stamp):
    """(x's version just before `stamp`, True if exact; False: at most that, older writes being
    forgotten)."""
    log = getattr(x, "_writes", None)
    if log is None:
        return 0, True
    later = builtins.sum(1 for s in log.stamps if s > stamp)
    exact = later < len(log.stamps) or log.count == len(log.stamps)
    return log.count - later, exact


class Variable:
    """An array in the graph: `data`, its `grad` (a Variable or None) and its `creator` Function.

    `requires_grad` (by default True for floating-point data, as in DeZero, and False for bool
    and integer data, which cannot carry a gradient) makes backward fill `grad`; raw arrays
    passed straight into an op are constants and never receive one. `version` counts the writes
    to `data` through gradcore; backward refuses a graph whose inputs were written after it was
    recorded.

    `x += y` (-=, *=, /=, **=, @=) writes into a leaf that requires grad under no_grad, as
    PyTorch's in-place ops (an update by hand); it is refused on one under grad mode; anywhere
    else it rebinds, as in DeZero: x = x + y, recorded where in the graph, and another name for
    the old x keeps the old value (unlike PyTorch).
    """

    # _writes is left unset until the first write, or a view's sharing of its base's (a
    # _WriteLog): nothing to store per op result.
    # _sequence, set on a recorded op's result only, is its creator's sequence (see the walk).
    # _post_hooks, set only while a leaf has post-accumulate hooks: their list (see
    # engine.hooked_leaves)
    # _retained_grad, set by a backward that kept this computed Variable's gradient
    # (retain_grad): that .grad, copied and pickled with it, which tells it from one set by hand
    # (the seed of its own backward, DeZero's y.grad = v); cleared when .grad is set or cleared
    __slots__ = ("_data", "_backend", "name", "_grad", "creator", "generation", "_requires_grad",
                 "_hooks", "_writes", "_sequence", "_post_hooks", "_retained_grad", "__weakref__")
    __array_priority__ = 200
    __array_ufunc__ = None  # `ndarray <op> Variable` defers to the Variable's reflected operator

    def __init__(self, data, name=None, requires_grad=None):
        data, backend, kind = _check_data(data)
        if requires_grad is None:
            requires_grad = kind == "float"
        elif requires_grad and kind != "float":
            raise _cannot_require_grad(data.dtype)
        _init_slots(self, data, backend, None, 0, bool(requires_grad))
        self.name = name
        if step_recorder is not None:  # made by a step gradcore.compile records
            step_recorder.made(self)
        if blocks_running[0]:
            made = made_in_block.get()
            if made is not None:
                made.append(self)

    # ---------------------------------------------------------------- data and its properties
    @property
    def data(self):
        """The array. An op result that NumPy computed as a scalar (0-d arithmetic, reductions)
        is stored as that scalar, ops being faster on it; read here, it becomes a 0-d array."""
        data = self._data
        if data is not None and data.__class__ is not self._backend.array_type:
            data = self._data = self._backend.ensure_array(data)
        if step_recorder is not None:
            return step_recorder.read(self)
        return data

    @data.setter
    def data(self, value):
        if value is None and self._data is None:
            return  # released already, or never given data: nothing changes, so no write
        if step_recorder is not None:
            step_recorder.writing(self, data=True)
        data, backend, kind = _check_data(value)
        if self._requires_grad and kind != "float":
            raise _cannot_require_grad(data.dtype)
        old = self._data
        if data is old and self is getattr(hooked, "handed", None):
            raise RuntimeError(
                "a hook wrote into the array of the gradient it was handed (g.data *= ...): "
                "that array may be another input's gradient too, or the caller's seed. Return "
                "a new gradient instead (return g * 10)")
        if data is not old and not _may_share_memory(old, self._backend, data, backend):
            # another array, not a write into the old one: the views of the old one (which
            # share this log) keep their version, this Variable's history goes on alone
            self._writes = fresh_log(self)
        # else the same memory, perhaps (x.data = x.data.reshape(...)): the log stays shared,
        # so a later write through x counts for the views of the old array too
        if data is None and old is not None:
            released[self] = (old.shape, old.dtype, self._backend, self.device)
        elif released:
            released.pop(self, None)
        self._data, self._backend = data, backend
        note_write(self)
        if blocks_running[0]:  # a release writes no memory: the block may drop its own; the
            # same array again is one written in place (t.data -= 1)
            note_block_write(self, "given" if old is None else "release" if data is None
                             else "in place" if data is old else "set")
        if id(self) in _watched and old is not None and (
                backend is not backend_of(old) or old.shape != data.shape
                or old.dtype != data.dtype
                or backend.device_of(old) != backend.device_of(data)
                or backend.lazy and backend.layout(old) != backend.layout(data)):
            # another shape, dtype, library or device: a tape's casts and placements differ;
            # other chunks (Dask): its gradients would be laid out in the old ones
            settings_changed(self)

    @property
    def version(self):
        """How many times gradcore wrote `data` (the setter, optimizer updates, loading, in-place
        moves). A direct write into the array (`x.data[...] = 0`) is not counted: anomaly mode
        (gradcore.detect_anomaly) catches those."""
        log = getattr(self, "_writes", None)
        return 0 if log is None else log.count

    _version = version  # PyTorch's name

    def _set_grad(self, value):
        if step_recorder is not None:
            step_recorder.writing(self, clearing=value is None)
            value = step_recorder.given_grad(value)
        if value is not None:
            value = _checked_grad(self, value)
        self._grad = value
        self._retained_grad = None

    def _get_grad(self):
        if step_recorder is not None:  # the grad object may be another at each replay
            step_recorder.reading_grad(self)
        return self._grad

    grad = property(_get_grad, _set_grad, doc=(
        "The gradient (a Variable shaped, typed and placed like `data`), or None."))

    def _set_requires_grad(self, value):
        value = bool(value)
        if value == self._requires_grad:
            if step_recorder is not None and step_recorder.is_active():
                # set as it was: a replay sets it too, where code between calls changed it
                step_recorder.settings_noted[id(self)] = self
            return
        if self.creator is not None:
            raise RuntimeError(
                f"requires_grad can only be changed on a leaf Variable; this one was computed by "
                f"{self.creator._name()}. For a Variable cut from the graph use detach() (a new "
                "leaf sharing the data) or unchain()")
        if value and self._data is not None and dtype_kind(self._backend,
                                                           self._data.dtype) != "float":
            raise _cannot_require_grad(self._data.dtype)
        self._requires_grad = value
        settings_changed(self)

    requires_grad = property(operator.attrgetter("_requires_grad"), _set_requires_grad, doc=(
        "True if backward computes a gradient for this Variable. Only a leaf's can be changed, "
        "and only a floating-point Variable can require grad."))

    def requires_grad_(self, requires_grad=True):
        """Set `requires_grad` (PyTorch's spelling); returns self."""
        self.requires_grad = requires_grad
        return self

    # With no data, these raise an AttributeError that says so (hasattr(x, "shape") stays
    # False). The walk and the ops read `_data` directly
    @property
    def shape(self):
        """The shape of `data`."""
        data = self._data
        if data is None:
            raise no_data("x.shape", AttributeError)
        return data.shape

    @property
    def ndim(self):
        """The number of axes of `data`."""
        data = self._data
        if data is None:
            raise no_data("x.ndim", AttributeError)
        return data.ndim

    @property
    def size(self):
        """The number of elements of `data`."""
        data = self._data
        if data is None:
            raise no_data("x.size", AttributeError)
        return data.size

    @property
    def dtype(self):
        """The dtype of `data`."""
        data = self._data
        if data is None:
            raise no_data("x.dtype", AttributeError)
        return data.dtype

    @property
    def backend(self):
        """The backends.Backend owning `data`."""
        return self._backend

    @property
    def xp(self):
        """The array namespace of `data` (numpy, cupy, ...)."""
        if self._backend is None:
            raise no_data("x.xp", AttributeError)
        return self._backend.xp

    @property
    def device(self):
        """The backends.Device that `data` lives on."""
        if self._data is None:
            raise no_data("x.device", AttributeError)
        return self._backend.device_of(self._data)

    @property
    def is_leaf(self):
        """True if no recorded Function created this Variable."""
        return self.creator is None

    @property
    def grad_fn(self):
        """PyTorch's name for `creator`."""
        return self.creator

    @property
    def T(self):
        """The transpose, axes reversed (F.transpose(x)); differentiable."""
        return transpose(self)

    def __len__(self):
        if self._data is None:
            raise no_data("len(x)")
        if not self._data.ndim:
            raise TypeError("len() of a 0-d Variable")
        return self._data.shape[0]

    def __iter__(self):
        """x[0], x[1], ... along the first axis, each in the graph. TypeError for a 0-d Variable,
        as NumPy and PyTorch raise: Python's fallback, indexing until IndexError, would yield
        nothing at all (sum(loss) == 0)."""
        if self._data is None:
            raise no_data("iter(x)")
        if not self._data.ndim:
            raise TypeError("iteration over a 0-d Variable")
        return (self[i] for i in range(self._data.shape[0]))

    def __contains__(self, value):
        # `0.5 in x` would compare each row with ==, which is identity here (as in DeZero):
        # always False, never an error
        raise TypeError("`value in x` is not supported on a Variable: == compares Variables by "
                        "identity, so it would always be False; test the values instead, e.g. "
                        "bool((x.numpy() == value).any())")

    def __reduce_ex__(self, protocol):
        # copy.copy, copy.deepcopy and pickle: while a step is recorded, the copy's array is
        # made where the tape cannot see it (a model snapshot taken in the step would be the
        # recording's at every replay), so the step runs eagerly
        if step_recorder is not None:
            step_recorder.copied(self)
        reduced = super().__reduce_ex__(protocol)
        if self.creator is None and not hasattr(self, "_post_hooks"):
            return reduced  # a leaf (a parameter): Python's own state, nothing more to do
        # Python's state of an object with __slots__ is (its __dict__ or None, {slot: value});
        # a subclass's own __getstate__ or __reduce__ may give another, left as it is
        state = reduced[2] if len(reduced) > 2 else None
        if not (state.__class__ is tuple and len(state) == 2 and isinstance(state[1], dict)):
            return reduced
        attributes, slots = state
        # the post-accumulate hooks stay with this leaf (they step or send its gradient): a
        # copy gets the gradient hooks only
        slots = {name: value for name, value in slots.items() if name != "_post_hooks"}
        if self.creator is not None:  # its graph first, oldest op first: see _OpsFirst
            slots = {"_ops_first": _OpsFirst(self), **slots}
        return (*reduced[:2], (attributes, slots), *reduced[3:])

    def __copy__(self):
        """copy.copy: a new Variable over the same data. Of a computed Variable, its result
        through an identity op (a view of the data, sharing its version), so that a gradient
        reaching the copy flows on into this one's graph, as through PyTorch's clone(); made
        under no_grad, it has no graph, as any op's result. Of a leaf, Python's shallow copy: a
        leaf of its own with this one's data, version, name and gradient hooks (a list of its
        own: a hook registered on either is that one's) and a copy of its gradient (an array
        of its own, as every leaf's .grad owns its array)."""
        if self.creator is None:
            make, args, state = self.__reduce_ex__(4)[:3]
            copied = make(*args)
            if state is not None:
                copied.__setstate__(state)
            share_versions(self, copied)  # a log made now if this leaf was never written
            if copied._hooks is not None:
                copied._hooks = list(copied._hooks)
            if copied._grad is not None:
                copied._grad = Copy()(copied._grad)  # recorded only if that gradient has a graph
            return copied
        if step_recorder is not None:  # as in __reduce_ex__: the step runs eagerly
            step_recorder.copied(self)
        y = Reshape(self.shape)(self)  # to its own shape: the identity
        y.name = self.name
        return y

    def __setstate__(self, state):
        """Restore a copy or an unpickled Variable from Python's state of an object with
        __slots__: (its __dict__ or None, {slot: value}). An op result's _sequence is moved into
        the past, as its creator's sequence is (see variable.restored)."""
        attributes, slots = state if state.__class__ is tuple else (state, None)
        if attributes:
            self.__dict__.update(attributes)
        for name, value in (slots or {}).items():
            if name != "_ops_first":  # the graph, copied first (see _OpsFirst): no slot
                setattr(self, name, value)
        if getattr(self, "_sequence", None) is not None:
            self._sequence = restored(self._sequence)

    def _host_data(self):
        """`_data`, for reading or sharing its values: while a step is recorded
        (gradcore.compile), through the recorder, which loads it at each replay (and sees that
        a value read on the host could not be read again)."""
        if step_recorder is not None:
            return step_recorder.read(self)
        return self._data

    def __bool__(self):
        if self._data is None:  # not False: `if x:` would read a missing value as zero
            raise no_data("bool(x)")
        return bool(self._host_data())

    def __float__(self):
        return float(self._one_value("float"))

    def __format__(self, spec):
        """f"{loss:.4f}": a 0-d Variable formats its value as a Python number, as a 0-d NumPy
        array or PyTorch tensor does; an empty spec gives str(x). TypeError for other shapes."""
        if not spec:
            return str(self)
        if self._data is None or self._data.ndim != 0:
            shape = None if self._data is None else tuple(self.shape)
            raise TypeError(f"format spec {spec!r} needs a 0-d Variable; this one has shape "
                            f"{shape}: format one value, e.g. f'{{float(x[0]):{spec}}}', or the "
                            "values, e.g. numpy.array2string(x.numpy())")
        return format(self.item(), spec)

    def __int__(self):
        return int(self._one_value("int"))

    def _one_value(self, where):
        if self._data is None or self.size != 1:
            shape = None if self._data is None else tuple(self.shape)
            raise TypeError(f"{where}() needs a Variable holding one value; this one has shape "
                            f"{shape}: pick an element first, e.g. {where}(x[0]), or use "
                            "x.numpy()")
        return self.item()

    def __repr__(self):
        if self._data is None:
            return "variable(None)"
        if self._backend.lazy:  # its recipe, not its values: printing must not compute them
            return f"variable({self._data!r})"
        text = str(self._backend.to_numpy(self._data)).replace("\n", "\n" + " " * 9)
        device = self.device
        if device != backends.CPU:
            text += f", device={device}"
        return f"variable({text})"

    def item(self):
        """The single value as a Python scalar (a device-to-host copy on a GPU)."""
        if self._data is None:
            raise no_data("x.item()")
        try:
            return self._host_data().item()
        except AttributeError:  # an array library without item() (array-api-strict)
            return self.numpy().item()

    def numpy(self):
        """`data` as a NumPy array (copied to the host if it lives elsewhere)."""
        if self._data is None:
            raise no_data("x.numpy()")
        data = self._host_data()  # first: recording, it makes _backend the tracing one
        return self._backend.to_numpy(data)

    def __array__(self, dtype=None, copy=None):
        """The values for NumPy (numpy.asarray(x), numpy.save) of a Variable that needs no
        gradient: data on the host (NumPy) only, no copy unless `dtype` or `copy=True` needs one.
        TypeError for one that requires grad, as PyTorch's: a NumPy function would return its
        values with no graph (numpy.dot(w, x), numpy.sum([loss1, loss2])). TypeError too for data
        elsewhere, which x.numpy() copies to the host."""
        if self._requires_grad and self._data is not None:
            raise TypeError(
                "NumPy on a Variable that requires grad (numpy.asarray(x), numpy.dot(w, x), "
                "numpy.sum([a, b]), ...) would give its values and drop its graph: use x.data or "
                "x.numpy() for the values, or gradcore ops (F.matmul, F.sum, F.stack, ...) to keep "
                "the graph")
        data = self._host_data()  # first: recording, it makes _backend the tracing one
        backend = self._backend
        if data is None:
            raise no_data("numpy.asarray(x)")
        if (backend.inner or backend) is not backends.NUMPY:
            raise TypeError(
                f"numpy.asarray(x): this Variable's data is a {backend.name} array on "
                f"{self.device}, not a NumPy array on the host; use x.numpy() for a host copy, "
                "or x.to_cpu() to move it there")
        return numpy.array(backend.to_numpy(data), dtype=dtype, copy=copy)

    # ---------------------------------------------------------------- graph
    def backward(self, grad=None, retain_grad=False, create_graph=False, retain_graph=None, *,
                 gradient=None):
        """Add into `.grad` of the leaves this Variable depends on (gradients accumulate over
        backward calls until cleared: cleargrad(), a model's cleargrads(), zero_grad(); a leaf
        given data of another shape or dtype meanwhile must be cleared, else RuntimeError).

        `grad` is the seed (array or Variable shaped like this one); by default ones, i.e. the
        gradient of `sum(self)`. On a computed Variable a `.grad` set by hand (DeZero's
        `y.grad = v; y.backward()`), not one retain_grad kept, is the default seed instead, and
        is taken off as DeZero does: `y.grad` is None after (or what retain_grad keeps).
        `retain_grad` keeps gradients of intermediate Variables too
        (`x.retain_grad()` keeps one's); `create_graph` records the backward pass so gradients
        can be differentiated again. `retain_graph` is accepted for PyTorch code and changes
        nothing: backward never frees the graph, which lives as long as a Variable refers to it,
        so backward may run through it again. `gradient=` is PyTorch's name for `grad`.
        """
        if gradient is not None:
            if grad is not None:
                raise TypeError("backward: got both grad and gradient, which name the same seed "
                                "(gradient is PyTorch's name for it); pass one")
            grad = gradient
        if grad is not None:
            # DeZero's backward(retain_grad, create_graph) takes flags where this takes the seed:
            # True would silently be a seed of ones and the flags would be lost. A flag may be
            # NumPy's bool (y.backward(step % 10 == 0), a NumPy step) or any 0-d bool array
            seed = grad.data if isinstance(grad, Variable) else grad
            backend = backend_of(seed)
            if seed.__class__ is bool or (backend is not None and seed.ndim == 0
                                          and backend.xp.isdtype(seed.dtype, "bool")):
                raise TypeError(
                    f"backward({grad}): the first argument is the seed gradient (an array or "
                    "Variable), not a flag; pass the flags by keyword, e.g. "
                    "y.backward(retain_grad=True, create_graph=True)")
        engine.backward(self, grad, retain_grad, create_graph)

    def cleargrad(self):
        """Forget the accumulated gradient (DeZero's name; PyTorch zeroes `grad` instead)."""
        if step_recorder is not None:
            step_recorder.writing(self, clearing=True)
        self._grad = self._retained_grad = None

    def retain_grad(self):
        """Keep this Variable's gradient in `.grad` at each backward although it is not a leaf
        (leaves keep theirs anyway: on a leaf this does nothing); it is stored after this
        Variable's hooks ran. RuntimeError on a Variable that does not require grad, as in
        PyTorch: it never gets a gradient to keep."""
        if not self._requires_grad:
            raise RuntimeError(
                "retain_grad: this Variable does not require grad, so it never gets a gradient "
                "to keep (it was made with requires_grad=False, holds integers, or was computed "
                "under no_grad() or from inputs that do not require grad)")
        if self.creator is not None and not self.retains_grad:
            with _post_hooks_lock:  # beside the handles' registrations: see _HookHandle
                _gradient_hooks(self).append(RETAIN_GRAD)
            settings_changed(self)

    @property
    def retains_grad(self):
        """True if retain_grad() was called on this non-leaf Variable."""
        return self._hooks is not None and RETAIN_GRAD in self._hooks

    def unchain(self):
        """Cut the link to the creator: this Variable becomes a leaf. A leaf keeps its gradient
        anyway, so a retain_grad() it had is dropped, as PyTorch ignores one on a leaf: kept,
        backward would add each gradient into `.grad` twice, and gradcore.grad would set the
        `.grad` it leaves alone."""
        self.creator = None
        hooks = self._hooks
        if hooks and self.retains_grad:
            with _post_hooks_lock:  # beside the handles' registrations: see _HookHandle
                for i, hook in enumerate(hooks):
                    if hook is RETAIN_GRAD:
                        del hooks[i]
                        break
            settings_changed(self)

    def unchain_backward(self):
        """Cut every link in the graph behind this Variable (iteratively, however deep). A node
        standing for a whole block of ops (gradcore.checkpoint's) is cut inside as well, as the
        block's own ops would be."""
        stack = [self.creator] if self.creator is not None else []
        seen = set()
        while stack:
            f = stack.pop()
            for x in f.inputs:
                if isinstance(x, Variable) and x.creator is not None:
                    if id(x.creator) not in seen:
                        seen.add(id(x.creator))
                        stack.append(x.creator)
                    x.unchain()
            cut_inside = getattr(f, "cut_inside", None)
            if cut_inside is not None:
                cut_inside(self)

    def detach(self):
        """A new leaf sharing `data`, with requires_grad=False, and its version: a write into
        either (an optimizer step on this one) stops a backward through graphs of the other.
        An op's 0-d result, kept as a NumPy scalar (immutable), has no memory to share: a write
        into one detached from it (`d.data[...] = 1`) is a write into a copy."""
        v = Variable(self._host_data(), name=self.name, requires_grad=False)
        share_versions(self, v)
        if blocks_running[0]:  # what it was detached from: a checkpointed block's own result?
            note_block_write(v, "detached", self)
        return v

    def register_hook(self, hook):
        """Call `hook(grad)` when this Variable's total gradient is known; a returned Variable
        replaces the gradient. Returns a handle whose `.remove()` unregisters the hook.
        RuntimeError on a Variable that does not require grad: no gradient ever reaches it."""
        if not callable(hook):
            raise TypeError(f"register_hook expects a callable, got {type(hook).__name__}")
        if not self._requires_grad:
            raise RuntimeError(
                "register_hook: this Variable does not require grad, so no gradient ever reaches "
                "it and the hook would never run (it was made with requires_grad=False, holds "
                "integers, or was computed under no_grad() or from inputs that do not require "
                "grad); on a float leaf, call x.requires_grad_() first")
        with _post_hooks_lock:  # a handle knows its copy of the hook: see _HookHandle
            handle = _HookHandle(self, _gradient_hooks(self), hook)
        _note_hook(self, handle)
        settings_changed(self)
        return handle

    def register_post_accumulate_grad_hook(self, hook):
        """Call `hook(self)` in each backward once this leaf's `.grad` holds all that backward
        adds to it: as soon as no op still to run can add more, while backward goes on with the
        rest of the graph (PyTorch's name; data-parallel training starts sending a gradient
        then). Not called by gradcore.grad, which leaves `.grad` alone. Returns a handle whose
        `.remove()` unregisters the hook. While any leaf has such a hook, each backward first
        counts the ops behind it (one pass over the graph)."""
        if not callable(hook):
            raise TypeError("register_post_accumulate_grad_hook expects a callable, got "
                            f"{type(hook).__name__}")
        if self.creator is not None:
            raise RuntimeError("register_post_accumulate_grad_hook: only a leaf Variable (one no "
                               "op made, such as a Parameter) accumulates into .grad")
        if self._data is not None and dtype_kind(self._backend, self.dtype) != "float":
            # never a gradient, so never a call (a frozen float leaf may require grad again)
            raise RuntimeError(
                f"register_post_accumulate_grad_hook: this Variable holds {self.dtype} data, "
                "which never gets a gradient, so the hook would never run")
        with _post_hooks_lock:  # two threads registering on one leaf keep both hooks
            hooks = getattr(self, "_post_hooks", None)
            if hooks is None:
                hooks = self._post_hooks = _Hooks()
                engine.hooked_leaves.add(self)
            handle = _HookHandle(self, hooks, hook)
        _note_hook(self, handle)
        settings_changed(self)
        return handle

    # ---------------------------------------------------------------- devices
    def to(self, device=None, dtype=None):
        """This Variable on `device` ("cpu", "cuda", "cuda:1", a Device) and/or cast to `dtype`
        (a dtype or its name, as F.astype; PyTorch's x.to(numpy.float64) passes it in the
        device's place). Differentiable: the gradient flows back to the source device and
        dtype. Returns self if nothing changes."""
        if self._data is None:
            raise no_data("x.to()")
        unknown = _unknown_device(device) if isinstance(device, str) else None
        if dtype is None and (unknown is not None or not isinstance(
                device, (str, backends.Device, type(None)))):
            try:  # a dtype where the device goes, as PyTorch's tensor.to(dtype) takes it
                self._backend.empty((0,), device, None)
                device, dtype = None, device
            except (TypeError, ValueError):
                if unknown is not None:  # neither: say both ("float16" on a library without)
                    raise ValueError(f"x.to({device!r}): {unknown}; nor is {device!r} a dtype "
                                     f"of {self._backend.name}, the library x is in") from None
                # not a dtype: the device's own error follows
        y = self if device is None else to(self, device)
        return y if dtype is None else astype(y, dtype)

    def to_cpu(self):
        """Move `data` (and `grad`) to the CPU in place, as DeZero does; returns self."""
        return self._move("cpu")

    def to_gpu(self, device=None):
        """Move `data` (and `grad`) to a GPU in place ("cuda" = the current one); returns self."""
        return self._move("cuda" if device is None else device)

    def _move(self, device):
        if self._data is not None:
            moved = backends.to_device(self._data, device)
            if moved is not self._data:  # already there: no write, graphs that saved it stay
                self.data = moved
        if self.grad is not None:
            self.grad._move(device)
        return self

    # ---------------------------------------------------------------- shape methods
    def reshape(self, *shape):
        """`reshape(2, 3)` or `reshape((2, 3))`."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        return reshape(self, tuple(shape))

    def transpose(self, *axes):
        """Reverse the axes, or permute them: `transpose(1, 0, 2)` or `transpose((1, 0, 2))`."""
        if not axes:
            axes = None
        elif len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
            axes = axes[0]
        return transpose(self, axes)

    def sum(self, axis=None, keepdims=False, **numpy_keywords):
        """Sum over `axis` (None: all; an int or a tuple), as F.sum; `keepdims` keeps the summed
        axes as size 1."""
        if numpy_keywords:  # numpy.sum(x) calls this with its own keywords
            return self._numpy_reduction("sum", axis, keepdims, numpy_keywords)
        return sum(self, axis, keepdims)

    def max(self, axis=None, keepdims=False, **numpy_keywords):
        """Largest element over `axis` (None: all; an int or a tuple), as F.max."""
        if numpy_keywords:  # numpy.max(x) calls this with its own keywords
            return self._numpy_reduction("max", axis, keepdims, numpy_keywords)
        return reduce_max(self, axis, keepdims)

    def min(self, axis=None, keepdims=False, **numpy_keywords):
        """Smallest element over `axis` (None: all; an int or a tuple), as F.min."""
        if numpy_keywords:  # numpy.min(x) calls this with its own keywords
            return self._numpy_reduction("min", axis, keepdims, numpy_keywords)
        return reduce_min(self, axis, keepdims)

    def _numpy_reduction(self, name, axis, keepdims, keywords):
        """numpy.sum(x) (max, min) calls x.sum(axis=..., dtype=..., out=...): NumPy's result on
        the values of a Variable that needs no grad, as numpy.asarray(x) gives them; TypeError
        for one that requires grad, whose graph NumPy would drop. A keyword NumPy does not pass
        (PyTorch's dim=, keepdim=) is this method's TypeError, named in gradcore's spelling."""
        unknown = [k for k in keywords if k not in _NUMPY_REDUCTION_KEYWORDS]
        if unknown:
            spelled = [f"{k}= (gradcore's {_TORCH_SPELLING[k]}=)" if k in _TORCH_SPELLING
                       else f"{k}=" for k in unknown]
            raise TypeError(f"Variable.{name}() got the unexpected keyword {', '.join(spelled)}; "
                            f"it takes axis= and keepdims=")
        if self._requires_grad:
            raise TypeError(
                f"numpy.{name}(x) on a Variable that requires grad would give its values and drop "
                f"its graph (NumPy calls x.{name} with {', '.join(keywords)}): use x.{name}(axis, "
                f"keepdims) or F.{name}(x, axis, keepdims) to keep the graph, or "
                f"numpy.{name}(x.data) for the values alone")
        return getattr(numpy, name)(numpy.asarray(self), axis=axis, keepdims=keepdims, **keywords)

    def matmul(self, W):
        """The matrix product `self @ W`, as F.matmul."""
        return matmul(self, W)

    dot = matmul  # DeZero's second name for it

    # ---------------------------------------------------------------- operators
    def __add__(self, other):
        return Add()(self, other)

    def __radd__(self, other):
        return Add()(other, self)

    def __sub__(self, other):
        return Sub()(self, other)

    def __rsub__(self, other):
        return Sub()(other, self)

    def __mul__(self, other):
        return Mul()(self, other)

    def __rmul__(self, other):
        return Mul()(other, self)

    def __truediv__(self, other):
        return Div()(self, other)

    def __rtruediv__(self, other):
        return Div()(other, self)

    def __neg__(self):
        return Neg()(self)

    def __pos__(self):
        """+x: x itself, as NumPy's and PyTorch's unary plus give x's values."""
        return self

    def __abs__(self):
        return abs_(self)

    def __pow__(self, c):
        return pow(self, c)

    def __rpow__(self, c):
        return power_of(c, self)

    def __matmul__(self, other):
        return matmul(self, other)

    def __rmatmul__(self, other):
        return matmul(other, self)

    def __getitem__(self, slices):
        return get_item(self, slices)

    # comparisons: bool Variables, no gradient; == and != stay identity (Variables are dict keys)
    def __lt__(self, other):
        return compare(operator.lt, self, other)

    def __le__(self, other):
        return compare(operator.le, self, other)

    def __gt__(self, other):
        return compare(operator.gt, self, other)

    def __ge__(self, other):
        return compare(operator.ge, self, other)

    # augmented assignment: see _augmented. No //= or %=: Variable has no // or %
    def __iadd__(self, other):
        return _augmented(self, other, add, "+=")

    def __isub__(self, other):
        return _augmented(self, other, sub, "-=")

    def __imul__(self, other):
        return _augmented(self, other, mul, "*=")

    def __itruediv__(self, other):
        return _augmented(self, other, div, "/=")

    def __ipow__(self, c):
        return _augmented(self, c, pow, "**=")

    def __imatmul__(self, other):
        return _augmented(self, other, matmul, "@=")


def _augmented(x, other, op, symbol):
    """`x op= other`. On a leaf that requires grad (a Parameter) under no_grad the result is
    written into x, as PyTorch's in-place ops do: x.data becomes op(x, other) cast to x's dtype,
    through the data setter (x.version goes up), and x is returned; a result of another shape
    is refused. Such a leaf is refused under grad mode, as in PyTorch. Otherwise (x computed
    in the graph, other in it, or x requiring no grad: a gradient) DeZero's rebinding:
    `x = op(x, other)`, a new Variable recorded in the graph, so another name bound to the old x
    keeps the old value (PyTorch would change it too). Written in a Function's backward it always
    rebinds, as in DeZero (`gy *= 1 / N`): the gradient gy backward gets may be another op's too,
    or the caller's seed. Found by the code that runs `x op= ...` (the frame above the operator
    method), so that no backward pays for the case."""
    if sys._getframe(2).f_code in backward_codes:
        return op(x, other)
    if x is getattr(hooked, "gradient", None):
        stepped = getattr(hooked, "stepped", None)
        if stepped is not None and stepped[1] is None:
            # a post-accumulate hook's: its Variable's values now, for the lost-result warning
            # (engine._call_post_hook) to tell a hook that then steps it with the result
            # through its array (p.data[...] -= g.data) from one that lost the result
            v = stepped[0]
            hooked.stepped = v, Variable(v.xp.asarray(v._data, copy=True), requires_grad=False)
        hooked.rebound, hooked.result = x, op(x, other)
        return hooked.result
    if not x._requires_grad:
        # only a Variable that requires grad (a Parameter, updated by hand) is written into: a
        # gradient, which requires none, may be another input's too (g *= c in a helper a
        # backward calls), and an integer one would be truncated
        return op(x, other)
    if x.creator is not None:
        # computed: recorded under grad mode; under no_grad too, a new Variable, for the graph
        # behind x (another name's) still holds x as an input its backward may read
        return op(x, other)
    if recording() is not False:
        raise RuntimeError(
            f"x {symbol} ...: x is a leaf Variable that requires grad; writing into it "
            "under grad mode would break its graph, so it is refused (as in PyTorch). For an "
            "update by hand (an optimizer step) write it under `with gradcore.no_grad():`, "
            f"or into its array (x.data {symbol} ..., with arrays on the right: x.grad.data); "
            f"for a new Variable in the graph write x = x {symbol[:-1]} ...")
    if x._data is None:
        raise no_data(f"x {symbol} ...")
    y = op(x, other)  # records nothing here: grad mode is off
    if y._data.shape != x._data.shape:
        raise ValueError(
            f"x {symbol} ...: the result has shape {tuple(y._data.shape)} but x has shape "
            f"{tuple(x._data.shape)}; writing into x keeps its shape (write x = x "
            f"{symbol[:-1]} ... for a new Variable of the new shape)")
    if y._data.dtype != x._data.dtype:
        y = astype(y, x._data.dtype)
    x.data = y.data  # the setter: version, released arrays, gradcore.compile's recorder
    return x


def _unknown_device(name):
    """None if the string `name` is a device ("cpu", "cuda:1"), else the ValueError saying no
    device is called so (it may be a dtype: "float32")."""
    if ":" in name or name.strip() in ("cpu", "cuda", "dask"):  # a device, valid or not
        return None
    try:
        backends.backend_for_device(name)
    except ValueError as error:
        return error
    except Exception:  # a device whose library is missing: its own error comes later
        return None
    return None


def _checked_grad(x, g):
    """`g` (a Variable or an array) as x's gradient: ValueError unless it has x's shape, dtype
    and device; TypeError for anything else."""
    if not isinstance(g, Variable):
        if backend_of(g) is None:
            raise TypeError(f"grad must be a Variable, an array or None, got {type(g).__name__}")
        g = Variable(g, requires_grad=False)
    problems = gradient_mismatch(x, g)
    if problems:
        raise ValueError(f"grad: a gradient must match its Variable's shape, dtype and device; this "
                         f"one has {problems}")
    return g


def elsewhere(g, backend, device):
    """True if the Variable g is not of `backend`'s library, or not on `device` (asked only of a
    backend with several devices). A backend wrapping another's arrays (a step being recorded)
    counts as that one."""
    if (g._backend.inner or g._backend) is not (backend.inner or backend):
        return True
    return not backend.single_device and g.device != device


def gradient_mismatch(x, g):
    """What keeps the Variable g from being x's gradient ("shape (3,), not (2,)"), or ""."""
    if x._data is None or g._data is None:
        return ""
    problems = []
    if tuple(g.shape) != tuple(x.shape):
        problems.append(f"shape {tuple(g.shape)}, not {tuple(x.shape)}")
    # a recording step's traced arrays are their library's (x given its real one back before
    # an optimizer step the recording runs as Python, g computed after it)
    if elsewhere(g, x._backend, x.device):
        problems.append(f"device {g.device}, not {x.device}")
    elif g.dtype != x.dtype:  # dtypes of two libraries never compare equal
        problems.append(f"dtype {g.dtype}, not {x.dtype}")
    return " and ".join(problems)


class _RetainGrad:
    """The marker retain_grad() puts among a Variable's hooks."""

    __slots__ = ()

    def __repr__(self):
        return "RETAIN_GRAD"

    def __reduce__(self):
        return "RETAIN_GRAD"  # copies and pickles are this one marker: retains_grad looks for it


RETAIN_GRAD = _RetainGrad()


class _OpsFirst:
    """First in the state of a computed Variable being copied or pickled: the Functions of its
    graph, for the copier or pickler to take oldest first. Each then finds its inputs' creators
    made already, so the copy goes a few frames deep whatever the graph's length; taken as they
    come, each op nests its inputs' ~14 frames deeper, past Python's recursion limit some 70
    ops back (an RNN's state in truncated BPTT). Copied it leaves None, pickled a list:
    Variable.__setstate__ drops either."""

    __slots__ = ("y", "__weakref__")

    def __init__(self, y):
        self.y = y

    def __deepcopy__(self, memo):
        # memo: the ids of what this copy has begun, the Functions among them included
        for f in _ops_to_copy(self.y, memo):
            copy.deepcopy(f, memo)
        return None

    def __reduce_ex__(self, protocol):
        # a list, which the pickler fills from the iterator
        return list, (), None, iter(_ops_to_copy(self.y, _pickled_so_far(self)))


# While this thread pickles a graph: .session, (a weak reference to an _OpsFirst that pickling
# holds, the ids of the Functions it has begun to pickle)
_pickling = threading.local()
_by_sequence = operator.attrgetter("sequence")


def _pickled_so_far(token):
    """The ids of the Functions the pickling under way in this thread has begun, as a deep
    copy's memo has them. Pickle has no memo to look in, so they are noted here (begin_pickling)
    while the object `token` lives: the pickler's memo holds it until that pickling ends, done
    or failed. A new pickling starts with `token`."""
    session = getattr(_pickling, "session", None)
    if session is None or session[0]() is None:
        begun = set()
        session = _pickling.session = (weakref.ref(token, lambda _: begun.clear()), begun)
    return session[1]


def begin_pickling(f):
    """Count the Function f as begun by the pickling of a graph under way, if one is: the
    pickler asks for f's state (Function.__getstate__) as it starts on f."""
    session = getattr(_pickling, "session", None)
    if session is not None and session[0]() is not None:
        session[1].add(id(f))


def _ops_to_copy(y, begun):
    """The Functions behind the computed Variable `y` that are not begun (`begun`: ids) nor
    behind one begun, oldest first: creation order, in which an op's inputs were made first."""
    found = {}
    stack = [y.creator]
    while stack:
        f = stack.pop()
        if id(f) in found or id(f) in begun:
            continue
        found[id(f)] = f
        for x in f.inputs:
            if isinstance(x, Variable) and x.creator is not None:
                stack.append(x.creator)
    return sorted(found.values(), key=_by_sequence)


def _init_slots(y, data, backend, creator=None, generation=0, requires_grad=False):
    """Set every slot a Variable starts with; returns `y`. Variable() checks its data, then comes
    here; an op's result, made by object.__new__(Variable), comes here directly (its array needs
    no check). `creator` is the Function whose output it is, if that call was recorded."""
    y._data = data
    y._backend = backend
    y.name = y._grad = y._hooks = None
    y.creator = creator
    y.generation = generation
    y._requires_grad = requires_grad
    return y


class Parameter(Variable):
    """A Variable that a Module registers as one of its parameters."""

    __slots__ = ()


def _note_hook(variable, handle):
    """Note a hook registered during a checkpointed block's recomputation: see hooks_registered."""
    registered = hooks_registered.get()
    if registered is not None:
        registered.append((variable, handle))


class _Hooks(list):
    """A Variable's hooks (`_hooks`, `_post_hooks`), in the order they run: all the engine
    reads. Beside them, the registrations of each hook by a handle (`registrations`: id(hook) ->
    _Registrations), changed together under _post_hooks_lock. The Variable owns both and a
    handle holds them weakly, so a handle kept in a list keeps no hook alive, nor the Variable
    a hook's closure refers to. Copied or pickled, it is a plain list of the hooks: the handles
    are the original's."""

    __slots__ = ("registrations", "__weakref__")

    def __init__(self, hooks=()):
        super().__init__(hooks)
        self.registrations = {}

    def __reduce_ex__(self, protocol):
        return list, (list(self),)


def _gradient_hooks(variable):
    """Under _post_hooks_lock: variable's `_hooks` as a _Hooks, made now if it has none or a
    plain list (a copy's)."""
    hooks = variable._hooks
    if hooks.__class__ is not _Hooks:
        hooks = variable._hooks = _Hooks(hooks or ())
    return hooks


class _HookHandle:
    """Returned by `register_hook` and `register_post_accumulate_grad_hook`: appends the hook to
    its list; `remove()` takes this registration off (twice, after a checkpoint's recomputation
    took it off, or after the Variable died, is harmless). One callable registered twice has two
    handles, and each takes off its own copy: the other keeps its place among the hooks."""

    # weak references and numbers only: see _Hooks. _ticket is None once taken off
    __slots__ = ("_variable", "_hooks", "_key", "_ticket")

    def __init__(self, variable, hooks, hook):
        registrations = hooks.registrations.get(id(hook))
        if registrations is None:
            registrations = hooks.registrations[id(hook)] = _Registrations(hooks, hook)
        self._variable = weakref.ref(variable)
        self._hooks = weakref.ref(hooks)
        self._key = id(hook)
        self._ticket = next(_tickets)
        registrations.tickets.append(self._ticket)
        hooks.append(hook)

    def remove(self):
        variable = self._variable()
        if variable is None or self._ticket is None:
            return
        settings_changed(variable)
        self._take_off(variable)

    def _take_off(self, variable):
        """Take this registration off its list, if it is still there (a checkpoint's
        recomputation takes off what it registered again this way)."""
        with _post_hooks_lock:  # two threads removing one handle: one takes it off
            ticket, self._ticket = self._ticket, None
            hooks = self._hooks()
            if ticket is None or hooks is None:
                return
            registrations = hooks.registrations[self._key]
            registrations.take_off(hooks, ticket)
            if not registrations.tickets:  # no copy left: a later hook of this id starts anew
                del hooks.registrations[self._key]
            _forget_if_empty(variable, hooks)  # a leaf's emptied post list


_tickets = itertools.count()


class _Registrations:
    """The registrations of `hook` on a hook list: a ticket each, in the order of the hook's
    copies in the list; None for a copy the list held when this was made (a copied Variable's
    list, whose handles are the original's)."""

    __slots__ = ("hook", "tickets")

    def __init__(self, hooks, hook):
        self.hook = hook
        self.tickets = [None] * builtins.sum(h is hook for h in hooks)

    def take_off(self, hooks, ticket):
        """Take the copy of the hook that `ticket` registered off `hooks` (the hook itself, not
        one that only compares equal to it, a dataclass's, say), and the ticket with it."""
        n = self.tickets.index(ticket)
        copies = [i for i, h in enumerate(hooks) if h is self.hook]
        del hooks[copies[n]]
        del self.tickets[n]


def _forget_if_empty(variable, hooks):
    """Under _post_hooks_lock, once hooks were taken off `hooks`: with none left in what is still
    variable's list, the list goes (no counting pass)."""
    if not hooks and getattr(variable, "_post_hooks", None) is hooks:
        del variable._post_hooks
        engine.hooked_leaves.discard(variable)


# what numpy.sum(x) (max, min) passes on to x.sum besides axis and keepdims
_NUMPY_REDUCTION_KEYWORDS = frozenset(("dtype", "out", "initial", "where"))
_TORCH_SPELLING = {"dim": "axis", "keepdim": "keepdims"}


def variables_returned(out, refusal):
    """A function's result `out` (a Variable, or a tuple of them) as a tuple, each checked to
    be a Variable; else TypeError: `refusal` (what the function must return), then what it got."""
    outputs = out if isinstance(out, tuple) else (out,)
    if not outputs:
        raise TypeError(f"{refusal}, got an empty tuple")
    for y in outputs:
        if not isinstance(y, Variable):
            inside = f"a {type(out).__qualname__} holding " if outputs is out else ""
            flatten = "; flatten it" if isinstance(y, (tuple, list)) else ""
            raise TypeError(f"{refusal}, got {inside}{type(y).__qualname__}{flatten}")
    return outputs


def as_variable(obj):
    """`obj` if it is a Variable, else `Variable(obj)`."""
    return obj if isinstance(obj, Variable) else Variable(obj)


def as_array(x, array_module=None):
    """`x` as an array: arrays pass through, scalars become 0-d arrays of `array_module` (NumPy)."""
    if backend_of(x) is not None and not isinstance(x, numpy.generic):
        return x
    xp = numpy if array_module is None else array_module
    return xp.asarray(x)


# Bound at the end: the operators above call these, and they import Variable.
from . import engine  # noqa: E402
from .functions.math import (Add, Copy, Div, Mul, Neg, Sub, add, compare, div, mul,  # noqa: E402
                             pow, power_of, sub)
from .functions.math import abs as abs_  # noqa: E402
from .functions.linalg import matmul  # noqa: E402
from .functions.device import astype, to  # noqa: E402
from .functions.shape import Reshape, get_item, reshape, transpose  # noqa: E402
from .functions.reduce import sum  # noqa: E402
from .functions.reduce import max as reduce_max, min as reduce_min  # noqa: E402
