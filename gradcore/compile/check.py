"""compile(fn, check=...): run a replay and the eager step from the same state, and compare.

Everything either may change is saved first: the data and grads of the Variables the tape reads
or writes, of the step's Variable arguments and of the parameters of the optimizers it steps
(each grad's data too), what those optimizers hold (their attributes and the dicts, lists,
arrays and objects of the user's in them), and NumPy's global random generator (the one
gradcore's NumPy and array-API backends draw from). The replay runs; its results and that state
are kept; the saved state is put back; the eager step runs; the two must agree to the bit (on a
library whose runs round differently, CuPy, to within rounding: _allowed). The eager step's
state is the one left in place. One checked call runs at a time (the generator is
set back between the two runs); other threads' own draws from it meanwhile are not waited for.
"""
import sys
import types

import numpy

import backends

from ..nn.module import Module
from ..optim.optimizer import Optimizer
from ..optim.param_state import ParamState
from ..variable import Variable, _WriteLog
from .trace import _UNSET


class ReplayMismatch(AssertionError):
    """A checked replay gave something other than the eager step (see compile's `check`)."""


class Snapshot:
    """What a step may change, saved so that it can be put back."""

    def __init__(self, tape, args):
        self.optimizers = tape.optimizers()
        # an optimizer steps every parameter with a grad, those the tape never reads included;
        # a Variable the step made is left out: the eager step makes another, and no one sees
        # what a replay leaves in this one
        found = {id(v): v for v in (*(v for v in tape.variables() if id(v) not in tape.made),
                                    *(a for a in args if isinstance(a, Variable)),
                                    *(p for opt in self.optimizers for p in _parameters(opt)))}
        # each grad as a Variable of its own: the step may write its data (W.grad.data = ...)
        found.update((id(v._grad), v._grad) for v in list(found.values()) if v._grad is not None)
        self.variables = list(found.values())
        self.arrays = [v._data for v in self.variables]
        self.data = [_copy(v._data) for v in self.variables]
        self.grads = [v._grad for v in self.variables]
        self.logs = [_saved_log(v) for v in self.variables]  # versions: the eager step counts again
        self.held = [_OwnState(opt) for opt in self.optimizers]
        self.random = backends.NUMPY.random_state(backends.CPU)
        # the Python values the step sets on modules (self.n = x.shape[0]), as they are
        self.values = [(module, name, module.__dict__.get(name, _UNSET))
                       for module, name, _ in tape.values_set]
        # the requires_grad the replay sets (a layer the step freezes), as they are
        self.flags = [(v, v._requires_grad) for v in (
            *(ref() for ref, _ in tape.requires_grad_left), *(args[i] for i, _ in
                                                             tape.arguments_left))
            if v is not None]
        # the state as host arrays, to measure what the step changes where rounding is allowed
        self.before = None
        if any(a is not None and not backends.backend_of(a).reproducible for a in (
                *self.arrays, *(array for held in self.held for _, array in held.arrays))):
            self.before = self.now()

    def restore(self):
        for v, array, data, grad in zip(self.variables, self.arrays, self.data, self.grads):
            backend = backends.backend_of(array) if array is not None else None
            if backend is not None and backend.owns(array) and _in_place(backend, array):
                # the same array, its values put back: what holds it (a device graph reading
                # it where it is, another Variable over its memory) sees the state as it was
                v._data = backend.assign(array, data)
            else:
                v._data = _copy(data)
            v._grad = grad
        for v, saved in zip(self.variables, self.logs):
            _restore_log(v, saved)
        for held in self.held:
            held.restore()
        backends.NUMPY.set_random_state(backends.CPU, self.random)
        for module, name, value in self.values:
            if value is _UNSET:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = value
        for v, requires_grad in self.flags:
            v._requires_grad = requires_grad

    def now(self):
        """The state as it is now, as host arrays, named for a report; where rounding is allowed,
        each float array marked with the largest change since the snapshot (_mark_changes)."""
        state, grads = {}, set()
        for i, v in enumerate(self.variables):
            name = f"Variable {v.name or i} (shape {tuple(v.shape) if v._data is not None else ''})"
            state[f"{name} data"] = _host(v._data)
            state[f"{name} grad"] = None if v._grad is None else _host(v._grad._data)
            state[f"{name} version"] = v.version
            grads.add(f"{name} grad")
        for i, opt in enumerate(self.optimizers):
            name = f"{type(opt).__name__} {i}"
            # a DeZero-style optimizer's own attributes refuse state_dict(): _held_by has them
            if hasattr(opt, "state_dict") and not getattr(opt, "_unsaved_attributes", list)():
                state[f"{name} state"] = _host_tree(opt.state_dict())
            for path, array in _held_by(opt)[1]:  # an optimizer keeping state its own way too
                state[f"{name}{path}"] = _host(array)
        for module, name, _ in self.values:
            state[f"{type(module).__name__}.{name}"] = module.__dict__.get(name, "(unset)")
        for i, (v, _) in enumerate(self.flags):
            state[f"Variable {v.name or i} requires_grad"] = v._requires_grad
        if self.before is not None:
            for key, value in state.items():
                # a grad is computed whole by the step (cleargrad, backward): no change is
                # marked, so it is measured by its own largest value, as a result is
                if key not in grads:
                    _mark_changes(value, self.before.get(key))
        return state


class _OwnState:
    """What an optimizer holds of its own (_held_by), saved so that it can be put back where it
    is, as the Variables' data is: the same dicts, lists and arrays, with the contents and values
    they had (what holds them sees the state as it was)."""

    def __init__(self, opt):
        self.holders, self.arrays = _held_by(opt)
        self.saved = [_copy(array) for _, array in self.arrays]

    def restore(self):
        # each array's values back in place; where that cannot be done (a read-only view, a
        # library without in-place writes), its holder is given a copy of the saved values
        again = {}
        for (_, array), saved in zip(self.arrays, self.saved):
            backend = backends.backend_of(array)
            if _in_place(backend, array):
                backend.assign(array, saved)
            else:
                again[id(array)] = _copy(saved)
        for holder, held in self.holders:
            if isinstance(holder, list):
                holder[:] = [again.get(id(v), v) for v in held]
            else:  # a dict, an optimizer's attributes among them
                holder.clear()
                holder.update((k, again.get(id(v), v)) for k, v in held)


def _in_place(backend, array):
    """True if `array`'s saved values can be written back into it: an array of its own, or a
    writable view (NumPy's, CuPy's: they name their `base`). A view given a copy instead would
    part from the array it views, and Variables over one memory (a Parameter over a slice of
    another's data) would run the eager step apart. All are saved at once, so views that overlap
    put back the same values in any order."""
    return backend.owns_memory(array) or (
        getattr(array, "base", None) is not None and backend.writable(array))


def _parameters(opt):
    """The parameters `opt` steps (a gradcore Optimizer's; none known for another kind)."""
    parameters = getattr(opt, "_parameters", None)
    if parameters is None or getattr(opt, "target", None) is None:
        return ()
    return parameters()


def _held_by(opt):
    """What the optimizer `opt` holds of its own: its attributes, and the dicts, lists, tuples,
    arrays and objects of the user's (_plain) in them (Adam's state, a DeZero-style optimizer's
    `self.vs`, its step count, a counter in an object of its own), through a ParamState and an
    optimizer it wraps (a DistributedOptimizer's); not its target, nor a Module or Variable (the
    Snapshot holds their data). (holders, arrays): each dict (an object's attributes too) and
    list with what it holds now; each array with its path from `opt`, for a report."""
    holders, arrays = [], []
    seen, todo = set(), [(opt, "")]
    while todo:
        obj, path = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        backend = backends.backend_of(obj)
        if backend is not None:
            if backend.owns(obj):  # an array; a NumPy scalar is a value, put back as one
                arrays.append((path, obj))
            continue
        if isinstance(obj, (Variable, Module)):
            continue
        if isinstance(obj, dict):
            items = list(obj.items())
            holders.append((obj, items))
            todo.extend((v, f"{path}[{_label(k, i)}]") for i, (k, v) in enumerate(items))
        elif isinstance(obj, list):
            holders.append((obj, list(obj)))
            todo.extend((v, f"{path}[{i}]") for i, v in enumerate(obj))
        elif isinstance(obj, tuple):
            todo.extend((v, f"{path}[{i}]") for i, v in enumerate(obj))
        elif isinstance(obj, ParamState):
            todo.append((obj._entries, f"{path}._entries"))
        elif obj is opt or isinstance(obj, Optimizer) or _plain(obj):
            attributes = list(obj.__dict__.items())
            holders.append((obj.__dict__, attributes))  # put back as a dict is
            # an optimizer's target: the parameters, the Snapshot's Variables
            optimizer = obj is opt or isinstance(obj, Optimizer)
            todo.extend((v, f"{path}.{name}") for name, v in attributes
                        if name != "target" or not optimizer)
    return holders, arrays


def _plain(obj):
    """True for an object of the user's that keeps its attributes in a dict (a SimpleNamespace,
    a dataclass's or another class's object): what an optimizer keeps there is saved as its own
    attributes are. Not the standard library's others (modules, functions, threads, loggers),
    whose attributes are no step's state."""
    kind = type(obj)
    return isinstance(getattr(obj, "__dict__", None), dict) and (
        kind is types.SimpleNamespace
        or (kind.__module__ or "").partition(".")[0] not in sys.stdlib_module_names)


def _label(key, i):
    """A dict key in a report's path: a number or string as itself, else its position."""
    return repr(key) if key.__class__ in (int, str) else f"#{i}"


def compare(what, replayed, eager):
    """ReplayMismatch naming the first place where `replayed` and `eager` (pairs of host trees:
    the results, and Snapshot.now()) differ."""
    difference = _difference(list(replayed), list(eager))
    if difference is not None:
        where, detail = difference
        raise ReplayMismatch(f"gradcore.compile(check=...): the replay of {what} differs from the "
                             f"eager step at {where}: {detail}. Something the step depends on "
                             "is not among its arguments (a Python number or array read from "
                             "outside that changed), or an op is not replayable: pass what "
                             "changes as an argument, or leave this step uncompiled. (Or "
                             "another thread's code drew from NumPy's global random generator "
                             "during the check, which sets it back between the two runs: "
                             "checked calls run one at a time, but other code does not wait)")


def _saved_log(v):
    """v's write log (shared with its views) and what it holds now, or None."""
    log = getattr(v, "_writes", None)
    return None if log is None else (log, log.count, tuple(log.stamps))


def _restore_log(v, saved):
    """v's write log back as `_saved_log` saw it: the same object (its views share it), with the
    count and stamps it had."""
    if saved is None:
        v._writes = None
        return
    log, count, stamps = saved
    log.count = count
    log.stamps = _WriteLog(count, stamps).stamps
    v._writes = log


def _copy(data):
    return None if data is None else backends.copy(data)


# How far apart a replay's and the eager step's float arrays may be where the library rounds
# differently from run to run (CuPy's scatter-adds add with atomics), per element (_allowed):
# OWN_ULPS units in the last place of the element itself, and ROUNDING_ULPS of the largest
# change the step made to the array (the largest value of a result or grad)
ROUNDING_ULPS = 64
OWN_ULPS = 2


class _RoundsFreely(numpy.ndarray):
    """A host copy of an array of a library whose runs may round differently (not
    `reproducible`): compared to within rounding (_allowed). `change`: the largest change the
    step made to it, marked on state (_mark_changes); None for a result or grad."""

    change = None


def _host(data):
    if data is None:
        return None
    backend = backends.backend_of(data)
    host = numpy.array(backend.to_numpy(backend.ensure_array(data)))
    return host if backend.reproducible else host.view(_RoundsFreely)


def _host_tree(value):
    if isinstance(value, Variable):
        return _host(value._data)
    if backends.is_array(value) or isinstance(value, numpy.generic):
        return _host(value)
    if isinstance(value, (tuple, list)):
        return [_host_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: _host_tree(v) for k, v in value.items()}
    return value


def _mark_changes(now, before):
    """Mark each float _RoundsFreely array in the host tree `now` with the largest finite change
    from the array at the same place in `before` (from zeros where there is none like it)."""
    if isinstance(now, dict):
        for k, v in now.items():
            _mark_changes(v, before.get(k) if isinstance(before, dict) else None)
    elif isinstance(now, list):
        for i, v in enumerate(now):
            _mark_changes(v, before[i] if isinstance(before, list) and i < len(before) else None)
    elif isinstance(now, _RoundsFreely) and now.dtype.kind in "fc":
        alike = isinstance(before, numpy.ndarray) and (before.shape, before.dtype) == (
            now.shape, now.dtype)
        with numpy.errstate(invalid="ignore"):  # inf - inf: no finite change, left out
            now.change = _largest(_wide(now) - _wide(before) if alike else _wide(now))


def _wide(a):
    """a (a float or complex array) as float64 or complex128: differences there are exact."""
    return numpy.asarray(a).astype(numpy.complex128 if a.dtype.kind == "c" else numpy.float64)


def _largest(a):
    """The largest finite magnitude in the array `a`, 0.0 if it has none."""
    magnitude = numpy.abs(a)
    return float(numpy.max(magnitude[numpy.isfinite(magnitude)], initial=0.0))


def _allowed(eager):
    """How far a replay's float array may be from `eager` (a _RoundsFreely array), per element.
    A sum added in another order is a few ulps of its largest value off (an element that
    cancels too); a step carries that on as a few ulps of what it changed (lr times a grad's,
    (1 - beta) times it in Adam's moments), not of the parameter's values, by which a whole
    update could pass. Each run then rounds the element once more: an ulp, <= eps * |element|."""
    eps = numpy.finfo(eager.dtype).eps
    change = getattr(eager, "change", None)
    if change is None:
        change = _largest(_wide(eager))
    own = numpy.abs(_wide(eager))
    own = numpy.where(numpy.isfinite(own), own, 0.0)  # an infinity allows no number beside it
    return OWN_ULPS * eps * own + ROUNDING_ULPS * eps * change


def _difference(a, b, where="the result"):
    """(where, what) for the first difference between two host trees, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return where, f"keys {sorted(map(str, a))} against {sorted(map(str, b))}"
        for k in a:
            found = _difference(a[k], b[k], k if where == "the state" else f"{where}[{k!r}]")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return where, f"{len(a)} items against {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = _difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    if isinstance(a, numpy.ndarray) or isinstance(b, numpy.ndarray):
        rounds_freely = isinstance(a, _RoundsFreely) or isinstance(b, _RoundsFreely)
        eager = b  # its change marked, which asarray drops
        a, b = numpy.asarray(a), numpy.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return where, f"shape {a.shape} {a.dtype} against {b.shape} {b.dtype}"
        floating = a.dtype.kind in "fc"
        if numpy.array_equal(a, b, equal_nan=floating):
            return None
        if not floating:
            gap = numpy.max(numpy.abs(a.astype(float) - b.astype(float)))
            return where, f"largest difference {gap:.3g}"
        same = (a == b) | numpy.isnan(a) & numpy.isnan(b)  # infinities and NaN where both are
        with numpy.errstate(invalid="ignore"):  # inf - inf where they are equal
            gaps = numpy.where(same, 0.0, numpy.abs(_wide(a) - _wide(b)))
        if not rounds_freely:
            return where, f"largest difference {numpy.max(gaps):.3g}"
        allowed = _allowed(eager)
        over = ~(gaps <= allowed)  # NaN against a number too
        if not over.any():
            return None
        i = numpy.unravel_index(numpy.argmax(numpy.where(over, gaps - allowed, -1.0)), b.shape)
        at = f" at {list(map(int, i))}" if b.ndim else ""
        return where, (f"largest difference {numpy.max(gaps):.3g}; {gaps[i]:.3g}{at} is more "
                       "than this library's rounding from run to run explains there "
                       f"({allowed[i]:.3g})")
    if a != b and not (a is None and b is None):
        return where, f"{a!r} against {b!r}"
    return None
