"""compile(fn, check=...): run a replay and the eager step from the same state, and compare.

Everything either may change is saved first: the data and grads of the Variables the tape reads
or writes and of the step's Variable arguments, the state of the optimizers it steps, and NumPy's
global random generator (the one gradcore's NumPy and array-API backends draw from). The replay
runs; its results and that state are kept; the saved state is put back; the eager step runs; the
two must agree to the bit. The eager step's state is the one left in place.
"""
import copy

import numpy

import backends

from ..variable import Variable, _WriteLog


class ReplayMismatch(AssertionError):
    """A checked replay gave something other than the eager step (see compile's `check`)."""


class Snapshot:
    """What a step may change, saved so that it can be put back."""

    def __init__(self, tape, args):
        self.variables = list({id(v): v for v in (*tape.variables(),
                                                  *(a for a in args if isinstance(a, Variable)))
                               }.values())
        self.arrays = [v._data for v in self.variables]
        self.data = [_copy(v._data) for v in self.variables]
        self.grads = [v._grad for v in self.variables]
        self.logs = [_saved_log(v) for v in self.variables]  # versions: the eager step counts again
        self.optimizers = tape.optimizers()
        self.states = [copy.deepcopy(opt.state_dict()) for opt in self.optimizers]
        self.random = backends.NUMPY.random_state(backends.CPU)

    def restore(self):
        for v, array, data, grad in zip(self.variables, self.arrays, self.data, self.grads):
            backend = backends.backend_of(array) if array is not None else None
            if backend is not None and backend.owns(array) and backend.owns_memory(array):
                # the same array, its values put back: what holds it (a device graph reading
                # it where it is) sees the state as it was
                v._data = backend.assign(array, data)
            else:
                v._data = _copy(data)
            v._grad = grad
        for v, saved in zip(self.variables, self.logs):
            _restore_log(v, saved)
        for opt, state in zip(self.optimizers, self.states):
            opt.load_state_dict(state)
        backends.NUMPY.set_random_state(backends.CPU, self.random)

    def now(self):
        """The state as it is now, as host arrays, named for a report."""
        state = {}
        for i, v in enumerate(self.variables):
            name = f"Variable {v.name or i} (shape {tuple(v.shape) if v._data is not None else ''})"
            state[f"{name} data"] = _host(v._data)
            state[f"{name} grad"] = None if v._grad is None else _host(v._grad._data)
            state[f"{name} version"] = v.version
        for i, opt in enumerate(self.optimizers):
            state[f"{type(opt).__name__} {i} state"] = _host_tree(opt.state_dict())
        return state


def compare(what, replayed, eager):
    """ReplayMismatch naming the first place where `replayed` and `eager` differ."""
    difference = _difference(_host_tree(replayed), _host_tree(eager))
    if difference is not None:
        where, detail = difference
        raise ReplayMismatch(f"gradcore.compile(check=...): the replay of {what} differs from the "
                             f"eager step at {where}: {detail}. Something the step depends on "
                             "is not among its arguments (a Python number or array read from "
                             "outside that changed), or an op is not replayable: pass what "
                             "changes as an argument, or leave this step uncompiled")


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


def _host(data):
    if data is None:
        return None
    backend = backends.backend_of(data)
    return numpy.array(backend.to_numpy(backend.ensure_array(data)))


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
        a, b = numpy.asarray(a), numpy.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return where, f"shape {a.shape} {a.dtype} against {b.shape} {b.dtype}"
        if not numpy.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
            gap = numpy.max(numpy.abs(a.astype(float) - b.astype(float)), initial=0.0)
            return where, f"largest difference {gap:.3g}"
        return None
    if a != b and not (a is None and b is None):
        return where, f"{a!r} against {b!r}"
    return None
