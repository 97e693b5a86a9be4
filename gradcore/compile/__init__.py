"""gradcore.compile: record a step once, replay it as a flat tape of array operations.

`train_step = gradcore.compile(train_step)`, or `@gradcore.compile` on its definition (the
README's section "Record once, replay" has a whole training loop and the rules). The first call
with arguments of new shapes, dtypes or devices runs eagerly and records every array operation
it performs (forward, backward, anything else); later calls with arguments like them replay
that tape: the same operations in the same order, with no Variables, Functions or graph walk.
The optimizer's update runs as it does eagerly, so learning-rate changes and Adam's step count
are honoured. A step that reads a traced value on the host (`float(loss)`, `.item()`, printing)
or whose shapes depend on values stays eager for those arguments, with one warning naming the
line.
"""
import builtins
import collections
import contextlib
import dis
import functools
import gc
import inspect
import itertools
import operator
import os
import random
import struct
import sys
import threading
import time
import types
import warnings
import weakref

import backends

from .. import engine as _engine
from .. import func as _func
from .. import variable as _variable
from ..config import anomaly_on, in_module_test_mode, recording, training
from ..function import _SavedOutput, add_note
from ..nn import module as _module
from ..nn.module import _BY_VALUE, Module, mode_key, structure_changes, watch as _watch_modules
from ..optim.optimizer import Optimizer
from ..variable import Parameter, Variable, value_changes
from . import trace
from .check import ReplayMismatch, Snapshot, _host_tree, compare
from .tape import Diverged, Tape
from .trace import _GRADCORE_DIRS, _LIBRARIES, _users_code

__all__ = ["compile", "Compiled", "ReplayMismatch"]

# Keys that fell back to eager kept, the most recently used: one costs ~1 KB, far less than a
# tape, and one forgotten costs a recording when it comes back (a step cycling through more
# shapes than this that all fall back records at every call), so many are kept
EAGER_KEYS_KEPT = 1024
# One recording at a time: it switches the fast path off. Reentrant only to be asked whether
# this thread holds it (_is_owned), by _ended after an interrupted recording
_recording_lock = threading.RLock()
# While a thread records, the Variables its step touches hold traced arrays: no compiled call in
# another thread may run then. Each call enters its thread's id here for as long as it runs
# (list.append and list.remove: no lock taken on a cache hit); a recording, once it holds the
# lock, names its thread in _recording_thread and waits until no other thread's id is left
_running_calls = []
_recording_thread = [None]
# The recording running, as _stop takes it (the Recorder, the backends' `plain` before it), so
# that a forked child can end one whose thread it lacks; None between recordings
_recording = [None]
# The thread whose recording turned the garbage collector off (Compiled._record), None while
# none did: a forked child that lacks it turns the collector back on
_collector_stopped_by = [None]
_get_ident = threading.get_ident
# Held by a checked call (check=...) from its snapshot to its comparison: each puts NumPy's
# global generator back between its replay and its eager step, which would rewind it under
# another checked call (their draws would differ: a false ReplayMismatch)
_checking = threading.RLock()


def _after_fork():
    """In the child of an os.fork: the parent's other threads are not there, so a recording or
    checked call of theirs is not either: the locks they held would never be released, nor the
    garbage collector a recording turned off turned back on."""
    global _recording_lock, _checking
    me = _get_ident()
    if _recording_thread[0] != me:
        _recording_lock = threading.RLock()
        _recording_thread[0] = None
        if _recording[0] is not None:
            # ended as a recording cut short is: the Variables it adopted get their arrays
            # back, and the ops and grads that would wait for it (Recorder.wait_for_release) go on
            _abandon(*_recording[0])
    if _collector_stopped_by[0] not in (None, me):
        _collector_stopped_by[0] = None
        gc.enable()
    _running_calls[:] = [thread for thread in _running_calls if thread == me]
    if not _checking._is_owned():
        _checking = threading.RLock()


os.register_at_fork(after_in_child=_after_fork)


_CALLS = ("recordings", "replays", "eager calls", "checked replays")  # Compiled._counts
# tapes kept for one key, recorded with other grads there or other Python values on its modules
# (a smaller last batch's `self.n`): a replay takes the first that fits, the newest first
TAPES_PER_KEY = 4
# recordings in a row, for the grads present, after which a step warns (_note_grads_recording)
GRADS_RECORDINGS_WARNED = TAPES_PER_KEY + 1


class Compiled:
    """A function compiled with gradcore.compile: call it as the function; `stats()` says what
    happened so far."""

    def __init__(self, fn, cache_size=8, check=False, graphs=True):
        if not callable(fn):
            raise TypeError(f"gradcore.compile: expected a function, got {type(fn).__name__}")
        if not isinstance(cache_size, int) or cache_size < 1:
            raise ValueError(f"gradcore.compile: cache_size must be a positive int, got "
                             f"{cache_size!r}")
        if check is not False and check is not True and not (
                isinstance(check, int) and check >= 0):
            raise ValueError(f"gradcore.compile: check must be True, False or a number of "
                             f"replays, got {check!r}")
        if graphs is not True and graphs is not False:
            raise ValueError(f"gradcore.compile: graphs must be True or False, got {graphs!r}")
        functools.update_wrapper(self, fn)
        # a partial or an object with __call__ has no __name__ to copy; warnings name the step
        self.__name__ = _name_of(fn)
        if _makes_a_generator(fn):
            raise TypeError(
                f"gradcore.compile: {self.__name__} is a generator or async function: calling it "
                "returns a generator or coroutine without running the step, so there is nothing "
                "to record. Compile the function that runs one step (the body of the loop) and "
                "call it from the generator")
        self.fn = fn
        self._surroundings = _surroundings(fn)
        self.check = check
        self.graphs = graphs
        self.cache_size = cache_size
        self._tapes = collections.OrderedDict()  # key -> Tape, the most recently used last
        # key -> why calls with that key run eagerly, the most recently used last; the
        # EAGER_KEYS_KEPT most recent are kept (one forgotten records again)
        self._eager = collections.OrderedDict()
        self._again = {}  # key -> recordings in a row that asked to record again
        self._warned_of_anomaly = False  # warned that anomaly mode keeps the calls eager
        self._warned_of_keywords = False  # warned that a call with keywords runs eagerly
        self._warned_of_recordings = False  # warned that the grads or values keep it recording
        self._grads_recordings = (0, -1)  # (recordings in a row for the grads present, replays)
        # (key, recordings in a row for it that took Python values, the count of calls then)
        self._value_recordings = (None, 0, 0)
        self._signature = None  # fn's inspect.Signature (False: none), read at a keyword call
        self._counts = collections.Counter()
        self._recent = None  # the tape used last, last in _tapes
        self._keys_recorded = 0  # keys recorded for, one after another (the same twice: once)
        self._last_key = None    # the last of them
        # id -> a weak reference to each Variable argument that a recording also reached by
        # name: keyed by identity from then on (see _key)
        self._by_identity = {}
        self._also = ()  # hooks of the user's a recording ran, not reached by name: followed too
        self._method = None  # the Compiled of a class whose __get__ made this one for an object
        # the name in an object's __dict__ under which __get__ keeps the one made for it
        self._per_object = f"{getattr(self, '__qualname__', self.__name__)} (gradcore.compile)"

    def __call__(self, *args, **kwargs):
        if kwargs:
            return self._with_keywords(args, kwargs)
        if getattr(trace._active, "recorder", None) is not None or _func.transforming():
            # in a recording (trace.recorder()), or in an f a gradcore.func transform
            # differentiates: a tape's results hold no graph
            self._counts["eager calls"] += 1
            return self.fn(*args)
        me = _get_ident()
        try:
            _running_calls.append(me)  # before _recording_thread is read: see _alone
            recording_thread = _recording_thread[0]
            if recording_thread is not None:
                if recording_thread == me:
                    # called from code this thread's recording runs as Python (an optimizer's
                    # hook): eager, as within the recording, or it would wait for the recording
                    # lock its own thread holds
                    self._counts["eager calls"] += 1
                    return self.fn(*args)
                _wait_for_recording(me)
            if anomaly_on():  # before any tape is looked up: a replay would skip its checks
                return self._eager_in_anomaly_mode(args)
            key = (_key(args, self._by_identity), self._surroundings(), structure_changes[0],
                   mode_key[0])
            tape = self._tapes.get(key)
            while tape is not None and (tape.guards or tape.values_seen != value_changes[0]) \
                    and not tape.ready():
                tape = tape.other  # the key's tape for the grads or values there now, if any
            if tape is None:
                return self._without_tape(key, args)
            if tape is not self._recent:  # most recently used last (hashing the key again)
                self._tapes.move_to_end(key)
                self._recent = tape
            if self.check is True or tape.replays < self.check:
                return self._checked(tape, args)
            try:
                arrays = tape.run(*args)
            except Diverged:  # a check came out otherwise, before anything changed: run eagerly
                self._counts["eager calls"] += 1
                return self.fn(*args)
            except Exception as error:  # an index out of range, say: the op's name is eager's
                if not _raised_in_users_code(error):  # a hook of the user's names its line
                    add_note(error, f"raised replaying the tape gradcore.compile recorded for "
                             f"{self.__name__}, whose lines name no op: the call run eagerly "
                             "names the op and your line (`with gradcore.detect_anomaly(): "
                             f"{self.__name__}(...)` runs it eagerly)")
                raise
            if tape.modes:
                _switch_modes(tape.modes)
            self._counts["replays"] += 1
            return _results(tape.results, arrays, args)
        finally:
            try:
                _running_calls.remove(me)
            except ValueError:  # not put in (a Ctrl-C), or taken out by a recording one cut short
                pass

    def __get__(self, obj, kind=None):
        """`obj.step`, for a function compiled in a class's body (`@gradcore.compile` over `def
        step(self, x)`), as a function is bound: that function bound to obj, compiled for obj
        alone, its tapes its own (obj's attributes the step reads are part of their keys, as
        for `gradcore.compile(obj.step)`). Made at the first lookup on obj and kept in obj's
        __dict__, under a name no code spells (it lives and dies with obj, in a cycle the
        collector frees; a copy.copy of obj, which finds it there, makes its own); `Class.step`
        is this object, which takes the object as its first argument."""
        if obj is None:
            return self
        try:  # the lookups after the first: ~2,000 instructions
            bound = obj.__dict__[self._per_object]
            if bound.fn.__self__ is obj:
                return bound
        except (AttributeError, KeyError, TypeError):
            pass
        return self._bind(obj)

    def _bind(self, obj):
        """The Compiled of this function bound to obj, made now (see __get__)."""
        if self.fn.__class__ is not types.FunctionType:
            return self  # a partial or a callable object is not bound, as in a class
        namespace = _namespace(obj)
        if namespace.__class__ is not dict:
            raise TypeError(
                f"gradcore.compile: {type(obj).__name__}.{self.__name__} compiles the method for "
                f"each object, and keeps it in the object's __dict__, which "
                f"{type(obj).__name__} objects lack (__slots__): add '__dict__' to __slots__, "
                f"or compile the bound method yourself (self.step = gradcore.compile(self._step))")
        bound = Compiled(types.MethodType(self.fn, obj), self.cache_size, self.check,
                         self.graphs)
        bound._method = self
        namespace[self._per_object] = bound
        return bound

    def __reduce__(self):
        """Pickled and deep-copied as the function it compiles, compiled again, with no tape (a
        tape holds this process's arrays and code); one its module names (`@gradcore.compile`
        on a definition) by that name, as a function is; one a method's lookup made for an
        object (__get__) as that lookup on the object."""
        if self._method is not None:
            obj = self.fn.__self__
            for cls in type(obj).__mro__:
                for name, value in (_namespace(cls) or {}).items():
                    if value is self._method:
                        return getattr, (obj, name)
        named = sys.modules.get(getattr(self, "__module__", None))
        for part in getattr(self, "__qualname__", "").split("."):
            named = getattr(named, part, None)
        if named is self:
            return self.__qualname__
        return Compiled, (self.fn, self.cache_size, self.check, self.graphs)

    def _with_keywords(self, args, kwargs):
        """A call given keyword arguments, as the same call made positionally (what a key and a
        tape are made of; a parameter left out before one given gets its default); eager where
        that cannot be done (a keyword-only parameter or **kwargs given, no signature to read,
        arguments it does not take), with one warning saying why."""
        signature = self._signature
        if signature is None:
            try:
                # fn's own, not the one functools.wraps points to: a decorator's wrapper may
                # take or pass other arguments than the function it wraps
                signature = inspect.signature(self.fn, follow_wrapped=False)
            except (TypeError, ValueError):  # a builtin, a callable without a signature
                signature = False
            self._signature = signature
        if signature is False:
            why = "its signature cannot be read, to tell their positions. Pass them positionally"
        else:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as error:  # eagerly it raises as much, unless its signature lies
                bound = None
                why = f"its signature does not take them ({error})"
            if bound is not None:
                parameters = signature.parameters
                keyword_only = [name for name in kwargs if name in parameters
                                and parameters[name].kind is inspect.Parameter.KEYWORD_ONLY]
                passed_on = [name for name in kwargs if name not in parameters
                             or parameters[name].kind is inspect.Parameter.POSITIONAL_ONLY]
                if keyword_only:
                    why = (f"{', '.join(map(repr, keyword_only))} can only be given by "
                           "keyword, and a tape takes its arguments by position. Make them "
                           "parameters that can be given by position")
                elif passed_on:
                    why = (f"it takes {', '.join(map(repr, passed_on))} through **kwargs (a "
                           "decorator's wrapper, say), and a tape takes its arguments by "
                           "position. Pass them by position")
                else:
                    return self(*_by_position(bound))
        self._counts["eager calls"] += 1
        result = self.fn(*args, **kwargs)  # before the warning: none for a call that raises
        if not self._warned_of_keywords:  # once: every such call comes here
            self._warned_of_keywords = True
            warnings.warn(f"gradcore.compile: {self.__name__} runs eagerly when called with "
                          f"keyword arguments: {why}", RuntimeWarning, stacklevel=3)
        return result

    def _without_tape(self, key, args):
        """A call whose key has no tape: eager if the key fell back, else recorded."""
        if key in self._eager:
            self._eager.move_to_end(key)
            self._counts["eager calls"] += 1
            return self.fn(*args)
        # the functions reached, as they are bound now
        surroundings = _surroundings(self.fn, self._also)
        changed = surroundings() != key[1]
        self._surroundings = surroundings  # with the hooks registered since, say
        if changed:  # a helper rebound since: find what it reads, key again
            return self(*args)
        if key in self._tapes and not self._warned_of_recordings:  # tapes for other grads present
            self._note_grads_recording(key)
        # not the same key again (lazy weights made), nor one whose tapes took other grads or
        # values (its TAPES_PER_KEY tell)
        if key != self._last_key and key not in self._tapes:
            self._keys_recorded += 1
            if self._keys_recorded == self.cache_size + 1:
                self._warn_of_new_keys(key, surroundings)
            self._last_key = key
        try:
            return self._record(key, args)
        finally:
            if _collector_stopped_by[0] == _get_ident():  # a Ctrl-C cut _ended short
                gc.enable()
                _collector_stopped_by[0] = None

    def _note_grads_recording(self, key):
        """A call records because neither tape of its key is for the grads present now (a tape
        adds to those its recording found and sets the others): warned once where that happens
        GRADS_RECORDINGS_WARNED times in a row, no replay between (some grads cleared, others
        not, in a pattern)."""
        replays = self._counts["replays"]
        count, replays_then = self._grads_recordings
        count = count + 1 if replays == replays_then else 1
        self._grads_recordings = (count, replays)
        if count < GRADS_RECORDINGS_WARNED:
            return
        tape = self._tapes[key]
        differing = [v for v in tape.grads_present if v._grad is None] + [
            v for v in tape.grads_absent if v._grad is not None]
        if not differing:  # the newest tape took other Python values or settings
            changed = _what_changed(tape)
            if changed is not None:
                self._warned_of_recordings = True
                warnings.warn(f"gradcore.compile: {self.__name__} recorded again at each of its "
                              f"last {count} calls, as {changed} changed before each (between "
                              "calls, or in Python a replay runs: an optimizer's hook): a tape "
                              "serves the values it took, and a key keeps "
                              f"{TAPES_PER_KEY} tapes. Change it less often, or pass what "
                              "decides it as an argument", RuntimeWarning, stacklevel=4)
            return
        self._warned_of_recordings = True
        warnings.warn(f"gradcore.compile: {self.__name__} recorded again at each of its last "
                      f"{count} calls, as the grads present before a call "
                      f"({_engine._describe(differing[0])}, say) differ from "
                      "call to call: a tape serves the grads present at its recording (it adds "
                      f"to those and sets the others), and a key keeps {TAPES_PER_KEY} tapes. "
                      "Clear all of "
                      "the model's grads or none between calls (model.cleargrads()), or clear "
                      "them inside the step", RuntimeWarning, stacklevel=4)

    def _eager_in_anomaly_mode(self, args):
        """A call with anomaly mode on runs eagerly: anomaly mode reads every op's values on the
        host (fingerprints, finiteness), which a tape cannot replay, and a replay would skip its
        checks. The key is not kept as fallen back: once anomaly mode is off, the call records."""
        self._counts["eager calls"] += 1
        if not self._warned_of_anomaly:  # once: every call of the step comes here
            self._warned_of_anomaly = True
            warnings.warn(f"gradcore.compile: {self.__name__} runs eagerly while anomaly mode is "
                          "on (it reads every op's values on the host); it records once "
                          "gradcore.detect_anomaly() is left", RuntimeWarning, stacklevel=3)
        return self.fn(*args)

    def _warn_of_new_keys(self, key, surroundings):
        what, advice = _change(self._last_key, key, surroundings)
        warnings.warn(f"gradcore.compile: {self.__name__} has recorded for {self._keys_recorded} "
                      f"keys, more than cache_size={self.cache_size} keeps, so its calls keep "
                      "recording (each costs more than an eager call). The last two that "
                      f"recorded differed in {what}: {advice}, or raise cache_size",
                      RuntimeWarning, stacklevel=4)

    def _record(self, key, args):
        why = _unrecordable(key, args)
        if why is not None:
            self._fall_back(key, why)
            self._counts["eager calls"] += 1
            warnings.warn(f"gradcore.compile: {self.__name__} runs eagerly when {why}",
                          RuntimeWarning, stacklevel=4)
            return self.fn(*args)
        rec = trace.Recorder()
        # A recording makes many objects and frees none: the collector's passes over them would
        # cost about as much again as the recording (measured on chain and wide), to find nothing
        me = _get_ident()
        collecting = gc.isenabled()
        if collecting:  # named first, and cleared last: a fork in between finds it
            _collector_stopped_by[0] = me
        try:
            gc.disable()
            return self._record_without_collector(key, args, rec)
        finally:
            _ended(rec, me, collecting)

    def _record_without_collector(self, key, args, rec):
        with _alone():
            # what the step reaches besides its arguments: Variables it may also get as one,
            # random generators it may draw from, hooks it may run
            keyed = [a for a in args if a.__class__ not in _BY_VALUE
                     and backends.backend_of(a) is None and not isinstance(a, Variable)]
            rec.outside = [self.fn, *self._surroundings.objects(), *keyed]
            # changes from here on count for the tape (an optimizer's hook, run as Python, may
            # set a module's number while the step records)
            rec.values_seen = value_changes[0]
            variables, modules, generators, rec.reached, found = _reachable(rec.outside)
            rec.reached_all = len(rec.reached) < REACH_LIMIT
            rec.modules_reached = {id(module): module for module in modules}
            rec.values_found = {(id(module), name): value for module in modules
                                for name, value in module.__dict__.items()
                                if _variable.is_python_value(value)}
            rec.settings_found = {i: _variable.settings_of(v) for i, v in found.items()}
            rec.argument_settings = {id(a): (i, a, a._requires_grad) for i, a in enumerate(args)
                                     if isinstance(a, Variable)}
            generators = _Generators(generators)
            # the hooks on the Variable arguments (their ids are in the key), before the step
            # adds or removes any: a tape holds them
            argument_hooks = [hook for a in args if isinstance(a, Variable)
                              for hook in _hook_functions(a)]
            in_eval = _modules_in_eval()  # to tell which modes the step switches
            plain = _start(rec)
            try:
                seen = []
                for i, a in enumerate(args):
                    part = key[0][2 + i]
                    if part.__class__ is tuple and part[0] is SAME_AS:
                        seen.append(seen[part[1]])  # one object twice: one slot, as eagerly
                    elif isinstance(a, Variable) or (backends.is_array(a)
                                                     and a.__class__ not in _NUMPY_SCALARS):
                        seen.append(rec.argument(i, a))
                    else:
                        seen.append(a)
                try:
                    result = self.fn(*seen)
                except BaseException:
                    _changes_told(rec)  # no tape: what it changed, other tapes learn
                    raise
                slots = []
                rec.results_shaped, rec.results_shared = {}, False
                rec.returning = self.fn  # a fallback it finds names the return statement
                shape = _shape(rec, result, slots, args)
                rec.returning = None
                if rec.results_shared:
                    shape = ("shared", shape)
            finally:
                _stop(rec, plain)
            rec.check_module_states()
            generators.check(rec)
            _settings_left(rec)
            if rec.values_set and rec.fallback is None and any(
                    line.kind == "opaque" and _runs_users_code(line) for line in rec.lines):
                # Python a replay runs (an optimizer's hook) may read the value where the step
                # had set it, or not yet: a replay sets it after, so it records again
                module, name, value = rec.values_set[-1]
                rec.record_again = True
                rec.again_because = (
                    f"the step set {type(module).__name__}.{name} to another value ({value!r} "
                    "at the last) at each of its last three calls, beside Python a replay runs "
                    "(an optimizer's hook), which may read it: update it outside the compiled "
                    "step, or pass what decides it as an argument")
            # the modes are read before a call, to pick its tape; a replay runs no code that
            # sets them: it sets those the step left switched after it runs
            if any(not module.training for module in rec.modules_alive()):
                # one it made in eval mode outlived the call: its mode counts from now on, as
                # any module's (the recording's _modes_changed passed it by)
                _module._modes_changed()
            switched = _modes_switched(rec, in_eval, modules) if mode_key[0] != key[3] else ()
            if (recording(), _train_state()) != key[0][:2]:
                rec.give_up("the step left grad mode or test mode switched (gradcore's "
                            "settings for the thread), which a replay would not do: switch it "
                            "outside the compiled step, or in a `with` block inside it")
        self._counts["recordings"] += 1
        # the user's hooks the step ran or may run that no name led to: their globals are part
        # of the key from the next call on, which records again (this call's key lacks them)
        hooks = _unfollowed_hooks(
            self._surroundings, modules,
            [*rec.touched, *variables.values(), *(a for a in args if isinstance(a, Variable))])
        if hooks and rec.fallback is None:
            self._also = (*self._also, *hooks)
            self._surroundings = _surroundings(self.fn, self._also)
            rec.record_again = True
        kept = _kept_outside(rec) if rec.fallback is None and not rec.record_again else []
        if kept:
            # eagerly each call keeps a new one, where a replay keeps none: a tape serves only
            # steps whose own Variables no one outside sees (Recorder.release stores no grad
            # into those at the end, and check leaves them out)
            rec.give_up(f"the step kept {_engine._describe(kept[0])}, which it made, where code "
                        "outside it reaches it (a global list, an object of yours), which a "
                        "replay would not do: return what you need of it as a result instead")
        made = _made_optimizer(rec) if rec.fallback is None and not rec.record_again else None
        if made is not None:
            # eagerly a new one at each call, where a replay would step this one again, its
            # state carried over: this call was an eager one. One made once and kept (at the
            # first call) is not made at the next, which records; one made at each call runs
            # eagerly after three
            rec.record_again = True
        unreplayed = 1
        if rec.fallback is None and not rec.record_again:
            key = self._keyed_by_identity(key, args, variables)
            head = self._tapes.get(key)
            changed = _guard_changed(head, rec)
            if changed is not None:
                # the key's newest tape took another value of one the step sets: one set from
                # what it was (a counter) is found changed at each call. After three calls in a
                # row of this key, or 2 * TAPES_PER_KEY such recordings of the key with no
                # replay (other keys' calls between), the step runs eagerly
                calls = sum(self._counts[what] for what in _CALLS)
                last, in_a_row, then = self._value_recordings
                in_a_row = in_a_row + 1 if last == key and then == calls - 1 else 2
                self._value_recordings = (key, in_a_row, calls)
                if not any(tape.replays for tape in _chain(head)):
                    unreplayed = head.unreplayed + 1
                if in_a_row >= 3 or unreplayed >= 2 * TAPES_PER_KEY:
                    rec.give_up(_values_differ(rec, changed))
        if rec.record_again or rec.fallback is not None:
            # this call was an eager one: its graph, and the state it kept on modules (an RNN's
            # hidden state, which the next call's graph continues) or elsewhere, become what
            # eager code builds
            _make_eager([result, *(getattr(module, name, None)
                                   for module, name in rec.module_states),
                         *_made_in_step(rec, result), *kept])  # in an object of the user's too
        # a value the step changed bumped the count keys hold (other keys' tapes read it as it
        # was): the next call's key is this one's with the new count, and inherits its record
        bumped = (None if structure_changes[0] == key[2]
                  else (*key[:2], structure_changes[0], *key[3:]))
        if rec.record_again and rec.fallback is None:
            # weights were created (lazy layers), or reshaped, or hooks found: record again; a
            # step that does so at every call (a new Parameter each time) would record for ever:
            # eager after two
            again = self._again.get(key, 0) + 1
            self._again[key] = again
            if bumped is not None:
                self._again[bumped] = again
            if again < 3:
                return _materialize(result)
            rec.give_up(
                rec.again_because if rec.again_because is not None and made is None else
                f"the step made the optimizer {type(made).__name__} it steps at each of its last "
                "three calls: eagerly a new one starts at each call, where a replay would step "
                "one again, its state (moments, counts of steps) carried over: make the "
                "optimizer outside the compiled step" if made is not None else
                "the step created or reshaped a weight at each of its last three calls (a "
                "Parameter given data in the step), so no tape would serve the next")
        else:
            self._again.pop(key, None)
        if rec.fallback is not None:
            reason, where = rec.fallback
            self._fall_back(key, f"{reason} at {where}")
            if bumped is not None:
                self._fall_back(bumped, f"{reason} at {where}")
            warnings.warn(f"gradcore.compile: {self.__name__} runs eagerly for these arguments: "
                          f"{reason} at {where}", RuntimeWarning, stacklevel=5)
        else:
            tape = Tape(rec, slots, fusing=not self.check,  # fused: not bitwise
                        graphs=self.graphs)
            tape.results = shape
            tape.modes = switched
            tape.unreplayed = unreplayed
            # the objects keyed by identity, held: a dead one's id is soon another object's,
            # which would then replay this tape
            tape.keyed = (self._surroundings.objects(), [
                a for a, part in zip(args, key[0][2:]) if a.__class__ not in _BY_VALUE
                and backends.backend_of(a) is None
                and (not isinstance(a, Variable) or part[0] is Variable and part[-1] is not None)],
                argument_hooks)
            # their attributes, taken as they are, changed: compared (those called too)
            _watch_modules(rec.modules_reached.values())
            tape.other = self._tapes.get(key)  # one not ready: for other grads or values
            kept = tape
            for _ in range(TAPES_PER_KEY - 1):
                kept = kept.other
                if kept is None:
                    break
            else:
                kept.other = None  # the oldest beyond TAPES_PER_KEY forgotten
            self._tapes[key] = tape
            self._recent = tape
            while len(self._tapes) > self.cache_size:
                self._tapes.popitem(last=False)
            return _materialize(result, detach=True)  # as a replay returns it: no graph
        return _materialize(result)  # traced arrays it holds as the real ones

    def _fall_back(self, key, why):
        """Calls with `key` run eagerly from now on, for the reason `why`. A step called with
        ever new shapes that all fall back (a loss read on the host, sequences of any length)
        would add a key for each: the least recently used beyond EAGER_KEYS_KEPT are
        forgotten (counted), and such a key records again if it comes back."""
        self._eager[key] = why
        self._again.pop(key, None)  # given up after recording again: nothing more to count
        self._counts["fallbacks"] += 1
        while len(self._eager) > EAGER_KEYS_KEPT:
            self._eager.popitem(last=False)
            self._counts["eager keys forgotten"] += 1

    def _keyed_by_identity(self, key, args, reached):
        """`key`, with each Variable argument that the step also reaches otherwise (`reached`:
        by a global or closure variable, through a module) keyed by identity, as Parameters
        are: a replay reads such a Variable through the argument, so a call passing another
        Variable must not replay it. Noted in _by_identity for later calls' keys."""
        parts = list(key[0])
        for i, a in enumerate(args):
            part = parts[2 + i]
            if (isinstance(a, Variable) and part[0] is Variable and part[-1] is None
                    and reached.get(id(a)) is a):
                parts[2 + i] = (*part[:-1], id(a))
                self._by_identity[id(a)] = weakref.ref(
                    a, lambda ref, i=id(a), by_identity=self._by_identity:
                    by_identity.get(i) is ref and by_identity.pop(i))
        return (tuple(parts), *key[1:]) if parts != list(key[0]) else key

    def _checked(self, tape, args):
        """Replay, then run eagerly from the same state; ReplayMismatch unless they agree. One
        checked call at a time (_checking)."""
        if not _checking.acquire(blocking=False):
            _wait_for_checking()
        try:
            return self._checked_alone(tape, args)
        finally:
            _checking.release()

    def _checked_alone(self, tape, args):
        snapshot = Snapshot(tape, args)
        try:
            replayed = _results(tape.results, tape.run(*args), args)
        except Diverged:
            snapshot.restore()
            self._counts["eager calls"] += 1
            return self.fn(*args)
        self._counts["checked replays"] += 1
        replayed = (_host_tree(replayed), snapshot.now())
        snapshot.restore()
        eager = self.fn(*args)
        compare(self.__name__, replayed, (_host_tree(eager), snapshot.now()))
        return eager

    def stats(self):
        """A dict: tapes held, ops in each, recordings, replays, eager calls, fallbacks, why
        each key that fell back and is kept did (the most recently used last), how many such
        keys were forgotten; on a library with device graphs (CuPy), the runs of each tape
        replayed as graphs, and why a run is not."""
        tapes = self.tapes()
        return {"tapes": len(tapes), "ops": [t.ops for t in tapes],
                "recordings": self._counts["recordings"], "replays": self._counts["replays"],
                "eager calls": self._counts["eager calls"],
                "checked replays": self._counts["checked replays"],
                "fallbacks": self._counts["fallbacks"], "why eager": list(self._eager.values()),
                "eager keys forgotten": self._counts["eager keys forgotten"],
                "graphs": [sum(g.graph is not None for g in t.graphed) for t in tapes],
                "why not graphs": [g.why for t in tapes for g in t.graphed if g.why is not None]}

    def tapes(self):
        """The tapes held, most recently used key last (each has `source` and `ops`); a key
        recorded with other grads there or other values on its modules has up to TAPES_PER_KEY,
        the oldest first."""
        return [tape for head in self._tapes.values() for tape in reversed(_chain(head))]

    def clear(self):
        """Forget every tape and every fallback: the next call records again."""
        self._tapes.clear()
        self._recent = None
        self._eager.clear()
        self._again.clear()


def _chain(tape):
    """The tapes of one key, the newest (`tape`) first."""
    chain = []
    while tape is not None:
        chain.append(tape)
        tape = tape.other
    return chain


def _guard_changed(head, rec):
    """(module, name, value, found) where `rec`, recording again for a key whose newest tape is
    `head`, found a Python value the step sets at another value than `head` took; else None
    (it records for other grads, or values it does not set)."""
    if head is None:
        return None
    took = {(id(module), name): value for module, name, value in head.values_read}
    for module, name, found in rec.values_read:
        value = took.get((id(module), name), trace._UNSET)
        if (id(module), name) in took and not trace._same_value(value, found):
            return module, name, value, found
    return None


def _values_differ(rec, changed):
    """Why a step that found a Python value it sets on a module changed at three calls in a
    row (`changed`: see _guard_changed) runs eagerly."""
    module, name, _, found = changed
    after = next((value for m, n, value in rec.values_set if m is module and n == name), None)
    found = "no value" if found is trace._UNSET else repr(found)
    advice = ("update it outside the compiled step, and pass in what it decides (an array "
              "argument replays for any values; a number is part of the key)")
    if after is not None:
        return (f"the step set {type(module).__name__}.{name} (from {found} to {after!r} at "
                "the last) from another value at each of its last three calls, Python state a "
                "tape cannot compute (a counter, `self.t += 1`, or a value code outside the "
                f"step sets too between calls): {advice}")
    return (f"the step found {type(module).__name__}.{name} at another value ({found} at the "
            "last) at each of its last three calls, Python state code outside the step "
            f"changes: {advice}")


def _raised_in_users_code(error):
    """Whether the innermost frame of `error`'s traceback is the user's code (an optimizer
    hook's), not gradcore's, a library's or the tape's."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    code = None if tb is None else tb.tb_frame.f_code
    return (code is not None and code.co_filename != "<gradcore.compile tape>"
            and trace._users_code(code))


def _unwrapped(fn):
    """`fn`, or the function a functools.partial (of a partial...) calls."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _by_position(bound):
    """The arguments of the call `bound` (an inspect.BoundArguments given no keyword-only
    parameter) by position: those given, and the defaults of the parameters left out before the
    last one given; none after it, so `step(x, t=t)` is `step(x, t)`, the call as made."""
    if not bound.kwargs:  # no gap: each parameter given is at its position
        return bound.args
    given = set(bound.arguments)
    bound.apply_defaults()
    last = max(i for i, name in enumerate(bound.arguments) if name in given)
    return bound.args[:last + 1]


def _name_of(fn):
    """A name for the step `fn` in warnings and errors: its own, a partial's function's, else
    its class's (an object with __call__)."""
    fn = _unwrapped(fn)
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def _makes_a_generator(fn):
    """True if calling `fn` (a function, a partial of one, an object with __call__) returns a
    generator or coroutine instead of running its body."""
    fn = _unwrapped(fn)
    if not isinstance(fn, (types.FunctionType, types.MethodType)):
        fn = getattr(type(fn), "__call__", fn)
    return (inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn)
            or inspect.isasyncgenfunction(fn))


def compile(fn=None, *, cache_size=8, check=False, graphs=True):
    """Compile `fn` (a training or inference step) to replay recorded tapes; usable as
    `@gradcore.compile` or `@gradcore.compile(cache_size=4)`. `cache_size`: how many tapes
    (one per argument signature) are kept. `check`: N (or True for every replay) runs the first N
    replays of each tape beside the eager step, from the same state, and raises ReplayMismatch
    at the first difference (the eager step's results and state are kept). `graphs`: on CuPy,
    replay runs of GPU operations as CUDA graphs (one launch each; their memory is held with
    the tape); False launches every operation from Python."""
    if fn is None:
        return lambda f: Compiled(f, cache_size, check, graphs)
    return Compiled(fn, cache_size, check, graphs)


# `gradcore.compile` is this function (the package's name is taken by it on gradcore), so what
# goes with it hangs on it too: gradcore.compile.ReplayMismatch
compile.ReplayMismatch = ReplayMismatch
compile.Compiled = Compiled


# ------------------------------------------------------------------------------ threads
def _wait_for_recording(me):
    """A compiled call in thread `me` found a recording running in another thread: wait for it
    to end (this thread's calls not counted meanwhile, or the two would wait for each other)."""
    while _recording_thread[0] is not None and _recording_thread[0] != me:
        with _uncounted(me):
            if not _recording_lock.acquire(timeout=trace.WAIT_SECONDS):
                raise RuntimeError(
                    f"gradcore.compile: a compiled call waited {trace.WAIT_SECONDS} s for a "
                    "recording in another thread to end; the step recording there may be "
                    "waiting for this thread. Call each compiled step once per signature "
                    "before threads call them, or call them from one thread")
            _recording_lock.release()


def _wait_for_checking():
    """Take _checking, held by a checked call in another thread. This thread's calls are not
    counted meanwhile (a recording that call's eager step makes would wait for them), and a
    recording started meanwhile is waited for, as a call that starts waits for one."""
    me = _get_ident()
    with _uncounted(me):
        if not _checking.acquire(timeout=trace.WAIT_SECONDS):
            raise RuntimeError(
                f"gradcore.compile: a checked call (check=...) waited {trace.WAIT_SECONDS} s for "
                "one in another thread to end (they run one at a time); that one may be waiting "
                "for this thread. Check the step from one thread, or compile it with check=False")
    if _recording_thread[0] is not None and _recording_thread[0] != me:
        try:
            _wait_for_recording(me)
        except BaseException:
            _checking.release()
            raise


def _leave(me):
    """Take this thread's calls out of _running_calls; returns how many there were."""
    count = _running_calls.count(me)
    for _ in range(count):
        _running_calls.remove(me)
    return count


@contextlib.contextmanager
def _uncounted(me):
    """This thread's calls out of _running_calls while it waits (a recording in another thread
    waits for them: the two would wait for each other), back in afterwards."""
    count = _leave(me)
    try:
        yield
    finally:
        _running_calls.extend([me] * count)


class _alone:
    """A recording's time: the one recording (_recording_lock), with no compiled call running
    in another thread (those that start meanwhile wait: _wait_for_recording)."""

    def __enter__(self):
        me = _get_ident()
        self.me, self.count = me, _leave(me)  # not waited for by a recording in another thread
        try:
            if not _recording_lock.acquire(timeout=trace.WAIT_SECONDS):
                raise RuntimeError(
                    f"gradcore.compile: a recording waited {trace.WAIT_SECONDS} s for another "
                    "recording to end")
            _recording_thread[0] = me
            deadline = time.monotonic() + trace.WAIT_SECONDS
            while any(other != me for other in list(_running_calls)):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"gradcore.compile: a recording waited {trace.WAIT_SECONDS} s for "
                        "compiled calls in other threads to end; one of them may be waiting for "
                        "this thread. Call each compiled step once per signature before threads "
                        "call them, or call them from one thread")
                time.sleep(1e-4)
        except BaseException:  # a Ctrl-C too: nothing left held
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *_):
        # each part in a finally of the one before, so that one Ctrl-C landing on any line
        # leaves the others done (_ended does again what it cut short)
        try:
            if _recording_thread[0] == self.me:
                _recording_thread[0] = None
        finally:
            try:
                if _recording_lock._is_owned():
                    _recording_lock.release()
            finally:
                _running_calls.extend([self.me] * self.count)


# ------------------------------------------------------------------------------ keys


def _train_state():
    """Train mode as a tape depends on it: True, False, or "module's" for an eval-mode module's
    own test mode, where a train-mode module the step calls runs in train mode (Module.__call__)."""
    if training():
        return True
    return "module's" if in_module_test_mode() else False


def _key(args, by_identity=None):
    """What a tape depends on besides the code: each argument's kind, shape, dtype, device and
    strides (Python and NumPy scalars by value, other objects by identity), which arguments are one
    object or share memory, and the grad and train switches. Read at every call: the device
    asked of a backend only where it has more than one. `by_identity`: ids of the Variables
    keyed by identity besides Parameters."""
    parts = [recording(), _train_state()]
    arrays = []  # (index, argument, its array, its backend) of each array or Variable argument
    for i, a in enumerate(args):
        kind = a.__class__
        if kind in _BY_VALUE:
            # _number_part(a), in line: a cache hit reads every argument
            parts.append((kind, a) if kind is not float or a and a == a else _number_part(a))
        elif isinstance(a, Variable):
            data, backend = a._data, a._backend
            parts.append((Variable, data.__class__, getattr(data, "shape", None),
                          getattr(data, "dtype", None), a._requires_grad, a._grad is None,
                          a.creator is None,
                          None if data is None or backend.single_device else
                          backend.device_of(data),
                          getattr(data, "strides", None) or _layout(data, backend),
                          # the hooks on it: a tape runs those its recording ran (see
                          # _HOOKED_LEAVES for the post-accumulate ones)
                          _hooks_part(a) if a._hooks or _HOOKED_LEAVES and hasattr(
                              a, "_post_hooks") else None,
                          # a Parameter by identity too: the step may also reach it by name,
                          # and the tape then reads both through the argument
                          id(a) if kind is Parameter or by_identity and id(a) in by_identity
                          else None))
            arrays.append((i, a, data, backend))
        else:
            backend = backends.backend_of(a)
            if backend is None:
                parts.append(_by_contents(a) if issubclass(kind, _CONTAINERS) else (kind, id(a)))
            elif kind in _NUMPY_SCALARS:
                parts.append(_scalar_part(a))
            else:
                parts.append((kind, a.shape, a.dtype,
                              None if backend.single_device else backend.device_of(a),
                              getattr(a, "strides", None) or _layout(a, backend)))
                arrays.append((i, a, a, backend))
    if len(arrays) > 1 and _may_alias(arrays):
        _note_aliases(parts, arrays)
    return tuple(parts)


def _layout(array, backend):
    """An array's layout for its key, where it has no strides to read in line (Dask's, a 0-d
    NumPy array's): eager results follow the layout (a sum over a Fortran-ordered array adds in
    another order, one over a Dask array adds chunk by chunk), so a replay must be for that
    layout. A lazy backend's layout (Dask: the chunks), else the strides, or None."""
    if array is not None and backend.lazy:
        return backend.layout(array)
    return getattr(array, "strides", None)


# The set inside engine.hooked_leaves (a WeakSet, whose own truth test runs in Python): empty
# while no Variable has a post-accumulate hook, and _key then asks no Variable argument for its
# _post_hooks. While one has (a distributed optimizer registers one per parameter), each is asked
_HOOKED_LEAVES = _engine.hooked_leaves.data


def _hooks_part(v):
    """The ids of the hooks registered on the Variable argument v, or None (a tape holds the
    hooks themselves: see Compiled._record_without_collector)."""
    hooks = _hook_functions(v)
    return tuple(map(id, hooks)) if hooks else None


def _may_alias(arrays):
    """False if no two of `arrays` (as _key lists them) are one array or views of one (the
    common case: batches sliced from different arrays, or no views at all), asked cheaply
    before _note_aliases asks each pair."""
    if len(arrays) == 2:
        return _owner(arrays[0][2]) is _owner(arrays[1][2])
    return len({id(_owner(data)) for _, _, data, _ in arrays}) < len(arrays)


def _owner(x):
    """The object whose memory the array x views: x itself if it views none. An array made on
    a buffer (numpy.frombuffer) has a memoryview of it as base: the buffer is the owner."""
    base = getattr(x, "base", None)
    while base is not None:
        x = base
        base = x.obj if x.__class__ is memoryview else getattr(x, "base", None)
    return x


# An argument's part of a key where it is an earlier argument again (SAME_AS, that argument's
# index), or shares memory with one (SHARES_MEMORY, that index, its own part): a tape recorded
# with distinct arguments reads and writes them as distinct, and the other way round
SAME_AS = "the same object as argument"
SHARES_MEMORY = "sharing memory with argument"


def _note_aliases(parts, arrays):
    """Mark in `parts` (a key's, being built) each array or Variable argument among `arrays`
    (as _key lists them) that is an earlier one again, or whose array (a Variable's data)
    shares memory with an earlier one's. Two arrays viewing different owners (_owner) share
    none; a library without shares_memory or may_share_memory (array-api-strict) is asked
    nothing."""
    for j in range(1, len(arrays)):
        index, a, data, backend = arrays[j]
        for earlier, a0, data0, backend0 in arrays[:j]:
            if a is a0:
                parts[2 + index] = (SAME_AS, earlier)
                break
            if data is None or data0 is None or backend is not backend0:
                continue
            if data is data0 or _owner(data) is _owner(data0) and _overlap(backend.xp)(data,
                                                                                   data0):
                parts[2 + index] = (SHARES_MEMORY, earlier, parts[2 + index])
                break


def _overlap(xp):
    """xp's exact test of two arrays' memory overlapping (NumPy's shares_memory: the columns
    B[:, :k] and B[:, k:] do not, though their bounds do), else its bounds test, else none (a
    library that cannot tell: array-api-strict)."""
    return getattr(xp, "shares_memory", None) or getattr(xp, "may_share_memory", _never)


def _never(*_):
    return False


def _number_part(a):
    """A Python number's, string's or None's part of a key (or a NumPy longdouble's, which
    _scalar_part keeps as it is): its type and value (2 is not 2.0), for a zero its sign (0.0 ==
    -0.0, yet 1 / x tells them apart), and for a NaN its bits (a NaN equals nothing, itself
    included: keyed by value, a NaN would record at every call)."""
    kind = a.__class__
    if kind is not float and kind is not _LONGDOUBLE or a and a == a:
        return (kind, a)
    if a != a:
        return (kind, "nan", struct.pack("<d", a))
    return (kind, a, str(a))


def _scalar_part(a):
    """A NumPy scalar's part of a key (np.float64(0.7)): its type, and its value as a Python
    number's part (a complex one's real and imaginary parts each: 1-0j is not 1+0j, a branch cut
    tells them apart). Eager code takes it as a weak Python number (Function._constant), so a
    tape takes it as a constant too, as it does a Python number: traced, it would be a 0-d
    array, which makes float32 data float64 and is on the host, not where the data is."""
    value = a.item()  # a Python number; a longdouble's or clongdouble's own (a float loses digits)
    if a.__class__ in _COMPLEX_SCALARS:
        return (a.__class__, _number_part(value.real), _number_part(value.imag))
    return (a.__class__, _number_part(value))


# Keyed by what they hold, their subclasses too (a namedtuple, an OrderedDict, a defaultdict):
# by identity, each new batch object would record a tape of its own
_CONTAINERS = (tuple, list, dict)
HOLDS_ARRAYS = "holds arrays"  # a container argument's key when an array is in it


def _by_contents(a):
    """A tuple, list or dict argument's part of a key (a subclass's too, read by the base
    class's own iteration: no code of the subclass's runs): its Python numbers, strings and None
    by value (nested containers too), HOLDS_ARRAYS if an array or Variable is in it (a tape would
    keep those as constants: such calls run eagerly), by identity if another object is, or if it
    is a subclass's with attributes of its own (which the step may read as well)."""
    kind = a.__class__
    if kind is not tuple and kind is not list and kind is not dict and _namespace(a):
        return (kind, id(a))
    values = []
    if issubclass(kind, dict):
        items = [v for pair in dict.items(a) for v in pair]
        if issubclass(kind, collections.defaultdict):
            # what it makes for a key it lacks, by identity (a tape holds its arguments)
            values.append(id(collections.defaultdict.default_factory.__get__(a)))
    else:
        items = _sequence_iter(kind)(a)
    for item in items:
        if item.__class__ in _BY_VALUE:
            values.append(_number_part(item))
        elif item.__class__ in _NUMPY_SCALARS:
            values.append(_scalar_part(item))
        elif issubclass(item.__class__, _CONTAINERS):
            part = _by_contents(item)
            if part[1] is HOLDS_ARRAYS:
                return (kind, HOLDS_ARRAYS)
            values.append(part)
        elif isinstance(item, Variable) or backends.backend_of(item) is not None:
            return (kind, HOLDS_ARRAYS)
        else:
            return (kind, id(a))
    return (kind, "values", tuple(values))


def _unrecordable(key, args):
    """Why a call with these arguments cannot be recorded (it runs eagerly), or None."""
    for i, (part, a) in enumerate(zip(key[0][2:], args)):
        if part.__class__ is tuple and len(part) == 2 and part[1] is HOLDS_ARRAYS:
            return (f"argument {i} is a {type(a).__name__} holding arrays: a tape would keep "
                    "those arrays as constants. Pass them as arguments of their own "
                    "(step(*batch))")
        if part[0] is SHARES_MEMORY:
            return (f"argument {i} may share memory with argument {part[1]} (a view of it, or "
                    "a Variable and its data): a tape reads and writes arguments as separate "
                    "arrays. Pass separate arrays (a copy), or one of them once")
        if isinstance(a, Variable) and a.creator is not None:
            return (f"argument {i} is a Variable computed outside the step (its graph reaches "
                    "back past the step, which a tape cannot replay): compute it in the step, "
                    "or pass x.detach() or its array")
    return None


class _Generators:
    """The host's global random generators (NumPy's, which gradcore's NumPy and array-API
    backends draw from, and Python's) around a recording, and the generators of the user's the
    step reaches (`others`: NumPy Generators, RandomStates and BitGenerators, random.Random
    objects): a draw the step made past gradcore would be frozen into the tape, so it makes the
    recording fall back. So does a NumPy generator the step makes (_made_while_recording)."""

    def __init__(self, others=()):
        self.numpy = backends.NUMPY.random_state(backends.CPU)
        self.python = random.getstate()
        self.others = [(g, _generator_state(g)) for g in others]

    def check(self, rec):
        if rec.fallback is not None:
            return
        if random.getstate() != self.python:
            rec.give_up("the step drew from Python's random module, which a replay would not "
                        "draw again: draw through gradcore, or pass the numbers as arguments")
            return
        for generator, state in self.others:
            if not _same_state(_generator_state(generator), state):
                rec.give_up(f"the step drew from a {type(generator).__name__} of its own, "
                            "numbers a replay would not draw again: draw through gradcore "
                            "(F.dropout, the backends' generators), or pass the numbers as "
                            "arguments")
                return
        end = backends.NUMPY.random_state(backends.CPU)
        where = backends.NUMPY.random_position(backends.CPU)
        backends.NUMPY.set_random_state(backends.CPU, self.numpy)
        for draw, args, kwargs in rec.draws:  # the draws gradcore made, again, from the start
            owner = draw.__self__
            if getattr(owner, "xp", None) is not None and owner.device_type != "cuda":
                draw(*trace.unwrap(args), **trace.unwrap(kwargs))
        if backends.NUMPY.random_position(backends.CPU) != where:
            rec.give_up("the step drew from numpy.random outside gradcore, numbers a replay "
                        "would not draw again: draw through gradcore (F.dropout, the backends' "
                        "generators), or pass the numbers as arguments")
        backends.NUMPY.set_random_state(backends.CPU, end)


def _what_changed(tape):
    """Words for a Python value of a module, or the settings of a Variable, that `tape` took
    otherwise than they are now (see Tape.values_hold); None if none."""
    for (i, name), was in tape.values_found.items():
        ref = None if tape.modules is None else tape.modules.get(i)
        module = None if ref is None else ref()
        if module is not None and (i, name) not in tape.guarded:
            now = module.__dict__.get(name, trace._UNSET)
            if not trace._same_value(now, was):
                now = "no value" if now is trace._UNSET else repr(now)
                return f"{type(module).__name__}.{name} (taken as {was!r}, {now} now)"
    for ref, found in tape.settings_found.values():
        v = ref()
        if v is not None and found is not None and not _variable.same_settings(
                _variable.settings_of(v), found):
            return f"the requires_grad, hooks or data layout of {_engine._describe(v)}"
    return None


def _runs_users_code(line):
    """Whether the opaque `line` (an optimizer's step) may run code of the user's, which may
    read a Python value the step sets: a hook of the user's, or an optimizer class of its own
    (gradcore's, and gradcore's hooks, read none)."""
    optimizer = (line.kwargs or {}).get("optimizer")
    if optimizer is None:
        return False  # DistributedOptimizer's averaging
    return any(_module_of(part).partition(".")[0] != "gradcore"
               for part in (*map(type, _wrapped(optimizer)), *getattr(optimizer, "hooks", ())))


def _wrapped(optimizer):
    """`optimizer` and those it wraps (DistributedOptimizer's `optimizer`), outermost first."""
    found = [optimizer]
    inner = optimizer.__dict__.get("optimizer") if hasattr(optimizer, "__dict__") else None
    while isinstance(inner, Optimizer) and inner not in found:
        found.append(inner)
        inner = inner.__dict__.get("optimizer")
    return found


def _module_of(obj):
    """The module that defined `obj` (a class, a function) or its class."""
    module = obj.__dict__.get("__module__") if isinstance(obj, type) else getattr(
        obj, "__module__", None)
    return module if isinstance(module, str) else type(obj).__module__


def _changes_told(rec):
    """A recording that raised: the requires_grad, hooks and Python values of modules it changed
    are told to every tape (variable.value_changed), as a recording that ends tells them."""
    _settings_told(rec)
    for (module, name), before in rec.python_states.items():
        if not trace._same_value(module.__dict__.get(name, trace._UNSET), before):
            _variable.value_changed(module, name)


def _settings_told(rec):
    """Tell every tape of the requires_grad and hook changes the recording noted."""
    for v in rec.settings_noted.values():
        _variable.value_changed(v, None)


def _settings_left(rec):
    """The recording has ended: the requires_grad and hook changes it made are told to every
    tape (variable.settings_changed held them back while it ran). Hooks the step leaves on a
    Variable it reads or writes, other than it found them (one it registers and keeps), a
    replay would not register: the next call records again (eager after three, saying so)."""
    _settings_told(rec)
    for v in rec.touched:
        found = rec.settings_found.get(id(v))
        if found is None:
            continue
        now = _variable.settings_of(v)
        if not _variable.same_settings((*now[:1], *found[1:3], *now[3:]), now):  # the hooks
            rec.record_again = True
            rec.again_because = (
                f"the step left the hooks of {_engine._describe(v)} otherwise than it found them "
                "(a hook it registers and keeps) at each of its last three calls, which a replay "
                "would not do: register it outside the step, or remove it before the step "
                "returns")
            return


def _modules_in_eval():
    """id -> each live Module in eval mode now (what mode_key numbers)."""
    modules = {}
    for i, ref in list(_module._in_eval.items()):
        module = ref()
        if module is not None:
            modules[i] = module
    return modules


def _modes_switched(rec, found, reached):
    """The (Module, training) pairs a replay sets after it runs, for a step that left Modules
    in another train or eval mode than it found them (`model.train()` at its start, finding the
    model in eval mode after a validation): `found`, the Modules in eval mode when it began
    (_modules_in_eval); `reached`, the Modules it reached then (_reachable). Each replay of its
    tape starts from the modes this call found (they are in the key), so setting these leaves
    them as the step did. Not so for a Module the step put into eval mode that it was not seen
    to reach before it ran: one it made, most likely, which a replay does not make (or one past
    REACH_LIMIT objects): that falls back."""
    now = _modules_in_eval()
    switched = [(module, True) for i, module in found.items() if i not in now]
    reached = set(map(id, reached))
    for i, module in now.items():
        if i in found:
            continue
        if i not in reached:
            rec.give_up(f"the step put a {type(module).__name__} it made (or one no name led to "
                        "before it ran) into eval mode, which a replay would not do: switch "
                        "modes outside the compiled step, or back before it returns")
            return ()
        switched.append((module, False))
    return switched


def _switch_modes(switched):
    """Leave Modules in the modes a recording left them (see _modes_switched), as
    Module.train does."""
    for module, train in switched:
        object.__setattr__(module, "training", train)
        _module._note_mode(module, train)
    _module._modes_changed()


def _generator_state(generator):
    if isinstance(generator, random.Random):
        return generator.getstate()
    if isinstance(generator, _NUMPY_RANDOM.RandomState):
        return generator.get_state(legacy=False)
    if isinstance(generator, _NUMPY_RANDOM.BitGenerator):
        return generator.state
    return generator.bit_generator.state


def _same_state(a, b):
    """True if two generator states (dicts, tuples, numbers, arrays within) are equal."""
    if a.__class__ is dict:
        return b.__class__ is dict and a.keys() == b.keys() and all(
            _same_state(a[k], b[k]) for k in a)
    if a.__class__ in (tuple, list):
        return b.__class__ is a.__class__ and len(a) == len(b) and all(
            map(_same_state, a, b))
    if backends.backend_of(a) is not None:
        return backends.backend_of(b) is not None and bool(_NUMPY.array_equal(a, b))
    return a == b


_NUMPY = backends.NUMPY.xp
# NumPy's scalar types keyed by value (_scalar_part): its numbers and bools (a timedelta64 is an
# integer to NumPy, not a number to eager code)
_NUMPY_SCALARS = frozenset(kind for kind in _NUMPY.sctypeDict.values()
                           if issubclass(kind, (_NUMPY.number, _NUMPY.bool_))
                           and not issubclass(kind, _NUMPY.timedelta64))
_COMPLEX_SCALARS = frozenset(kind for kind in _NUMPY_SCALARS
                             if issubclass(kind, _NUMPY.complexfloating))
_LONGDOUBLE = _NUMPY.longdouble  # item() gives a longdouble (as a float it would lose digits)
_NUMPY_RANDOM = _NUMPY.random
# Generators a step may draw from past gradcore; the global ones (numpy.random's, which
# gradcore's host backends draw from, and the random module's) are checked by _Generators
_GENERATOR_TYPES = (_NUMPY_RANDOM.Generator, _NUMPY_RANDOM.RandomState,
                    _NUMPY_RANDOM.BitGenerator, random.Random)
_GLOBAL_GENERATORS = frozenset(map(id, (
    getattr(_NUMPY_RANDOM.mtrand, "_rand", None), getattr(random, "_inst", None),
    getattr(getattr(_NUMPY_RANDOM.mtrand, "_rand", None), "_bit_generator", None))))


def _made_while_recording():
    """Stands for the RLock that every NumPy BitGenerator makes as it is made (default_rng(),
    Generator(PCG64()), RandomState(), a copy or spawn of one): a generator the user's code
    makes while a step records gives the recording up, naming the line, as the numbers drawn
    from it would be frozen into the tape (an OS-seeded one would draw others each call; one
    kept past the step would go on). One Python call more per generator made, none per draw."""
    rec = trace.recorder() if _recording[0] is not None else None  # no recording: no lookup
    if rec is not None and rec.fallback is None:
        frame = sys._getframe(1)  # BitGenerator.__init__ is compiled: the caller's frame
        while frame is not None and not _users_code(frame.f_code):
            # gradcore's own (Dask's chunked draws, from a seed drawn through gradcore): drawn
            # afresh at each replay
            if os.path.abspath(frame.f_code.co_filename).startswith(_GRADCORE_DIRS):
                return _RLOCK()
            frame = frame.f_back
        rec.give_up("the step made a NumPy random generator (default_rng(), a Generator, "
                    "RandomState or BitGenerator), whose numbers a replay would not draw again: "
                    "draw through gradcore (F.dropout, the backends' generators), or pass the "
                    "numbers as arguments")
    return _RLOCK()


# numpy.random.bit_generator looks RLock up by name at each BitGenerator made (NumPy 1.17 on):
# while a step records (_start to _stop), _made_while_recording stands there. A NumPy that
# does not look it up leaves the generators a step makes unseen
_BIT_GENERATOR_MODULE = sys.modules.get("numpy.random.bit_generator")
_RLOCK = getattr(_BIT_GENERATOR_MODULE, "RLock", None)


_SKIPPED = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
            types.CodeType)
REACH_LIMIT = 20000  # objects _reachable looks at, at most
# Containers _reachable and _made_in_step look into, subclasses too (a namedtuple, an
# OrderedDict, a defaultdict): listed by the base class's own iteration, so no code of the
# subclass's runs
_SEQUENCES = (list, tuple, set, frozenset, collections.deque)


def _reachable(roots):
    """What a step may reach past its arguments, from `roots` (the step, what it reads by name,
    and its arguments keyed by identity) through containers, Modules' and other objects'
    attributes (their __dict__ and __slots__, and their class's attributes where the class is
    the user's: a generator set on the class, read as `self.rng`), bound methods' objects and
    functions, a generator's bound builtin methods, weak references' objects, staticmethods'
    and classmethods' functions, partials' arguments, the default arguments and closure
    variables of the user's functions, and the attributes of the user's modules and classes
    (not of gradcore's, the standard library's or installed packages'): (the Variables by id,
    the Modules, the random generators of the user's, the ids of every object looked at: an
    array among them is not one the step makes), and every Variable reached, by id. The Variables first are those reached without
    passing through an attribute of an object other than a Module (`cfg.state` is not, as
    attributes are no part of a key; a function's defaults and closure variables are as good as
    names). At most REACH_LIMIT objects are looked at. Run only when recording: a cache hit
    never pays for it.

    A safety net, so it runs none of the objects' code: it asks type(obj), never obj.__class__
    or isinstance (which asks obj.__class__ too: a lazy import's proxy would import its module
    there), and reads attributes as object's own lookup does (no __getattr__ runs: a module's
    PEP 562 one, a proxy's); an object it cannot look into is skipped."""
    variables, modules, generators, found = {}, [], [], {}
    seen, todo = set(), [(root, True) for root in roots]
    kinds = {}  # class -> (what is done with its objects, its __slots__ descriptors)
    while todo and len(seen) < REACH_LIMIT:
        obj, named = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        kind = type(obj)
        try:
            known = kinds.get(kind)
            if known is None:
                known = kinds[kind] = _reach_kind(kind, obj)
            what = known[0]
            if what is _SKIP:
                continue
            if what is _OBJECT:
                module = issubclass(kind, Module)
                if module:
                    modules.append(obj)
                attributes = _namespace(obj)
                if attributes.__class__ is dict:
                    todo.extend((item, named and module) for item in attributes.values())
                for slot in known[1]:
                    try:
                        todo.append((slot.__get__(obj, kind), named and module))
                    except AttributeError:  # a slot not set
                        pass
                todo.append((kind, False))  # followed if the user's: a class attribute
            elif what is Variable:
                if named:
                    variables[id(obj)] = obj
                found[id(obj)] = obj
            elif what is dict:
                todo.extend((item, named) for item in itertools.islice(dict.values(obj),
                                                                       REACH_LIMIT))
            elif what is tuple:  # one of _SEQUENCES
                todo.extend((item, named) for item in itertools.islice(known[1](obj),
                                                                       REACH_LIMIT))
            elif what is types.FunctionType:
                if _users_code(obj.__code__):  # a generator in a default: `rng=default_rng()`
                    todo.extend((item, named) for item in (
                        *(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values(),
                        *map(_content, obj.__closure__ or ())))
            elif what is type:  # a module or a class
                if _users_namespace(obj):  # `noise.rng`: an attribute is no name of the key's
                    todo.extend((item, False) for name, item in
                                itertools.islice(list(_namespace(obj).items()), REACH_LIMIT)
                                if not name.startswith("__"))
            elif what is _GENERATOR_TYPES:
                if id(obj) not in _GLOBAL_GENERATORS:
                    generators.append(obj)
            elif what is types.MethodType:
                todo.extend(((obj.__self__, named), (obj.__func__, named)))
            elif what is weakref.ReferenceType:  # a module held weakly is read all the same
                todo.append((weakref.ReferenceType.__call__(obj), False))
            elif what is staticmethod:  # or a classmethod, in a class's namespace
                todo.append((obj.__func__, named))
            elif what is Compiled:  # a compiled step it calls, or a method compiled for obj
                todo.append((obj.fn, named))
            elif what is functools.partial:
                todo.extend((item, named) for item in (obj.func, *obj.args,
                                                       *obj.keywords.values()))
            elif what is types.BuiltinMethodType:  # bound to a generator: `draw = rng.random`
                todo.append((obj.__self__, named))
        except Exception:  # nothing of what it holds is looked at
            continue
    return variables, modules, generators, seen, found


_SKIP, _OBJECT = "skip", "object"


def _reach_kind(kind, obj):
    """What _reachable does with the objects of the class `kind` (`obj` one of them): (what,
    more), `what` naming the branch it takes (_SKIP, _OBJECT for attributes, else a class
    standing for its kind), `more` the __slots__ descriptors for an _OBJECT, the iteration for
    a sequence."""
    if kind in _BY_VALUE or kind is types.CodeType:
        return _SKIP, None
    if kind is types.FunctionType or kind is types.MethodType or kind is types.BuiltinMethodType:
        return kind, None
    if issubclass(kind, (types.ModuleType, type)):
        return type, None
    for what in (Variable, _GENERATOR_TYPES, dict, functools.partial):
        if issubclass(kind, what):
            return what, None
    iterate = _sequence_iter(kind)
    if iterate is not None:
        return tuple, iterate
    if kind is staticmethod or kind is classmethod:
        return staticmethod, None
    if issubclass(kind, weakref.ReferenceType):
        return weakref.ReferenceType, None
    if issubclass(kind, Compiled):  # its function; not its tapes (what they hold is theirs)
        return Compiled, None
    if backends.backend_of(obj) is not None:  # an array (a backend knows it by its type)
        return _SKIP, None
    return _OBJECT, _slot_descriptors(kind)


def _sequence_iter(kind):
    """The __iter__ of the one of _SEQUENCES that the class `kind` derives from (the base's own:
    no code of a subclass's runs), or None."""
    for base in _SEQUENCES:
        if issubclass(kind, base):
            return base.__iter__
    return None


def _namespace(obj):
    """obj.__dict__ as object's own lookup finds it (no __getattribute__ or __getattr__ of obj's
    class runs: a lazy module would load, a proxy would import), or None where there is none."""
    try:
        namespace = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
    return namespace if namespace.__class__ in (dict, types.MappingProxyType) else None


def _slot_descriptors(kind):
    """The descriptors of the __slots__ of the class `kind` and its bases (read from their
    namespaces, names mangled as Python does)."""
    found = []
    for cls in kind.__mro__:
        namespace = _namespace(cls) or {}
        names = namespace.get("__slots__", ())
        for name in (names,) if names.__class__ is str else names:
            if name.__class__ is not str or name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{cls.__name__.lstrip('_')}{name}"
            descriptor = namespace.get(name)
            if type(descriptor) is types.MemberDescriptorType:
                found.append(descriptor)
    return tuple(found)


def _users_namespace(obj):
    """True if the module or class `obj` is the user's: defined in a file of the user's, or a
    module made at run time (types.ModuleType, with no spec; a built-in one has one). Read from
    the namespaces (_namespace), so no module's __getattr__ runs."""
    namespace = _namespace(obj)
    if namespace is not None and not issubclass(type(obj), types.ModuleType):  # a class
        name = namespace.get("__module__")
        namespace = _namespace(sys.modules.get(name)) if name.__class__ is str else None
    if namespace is None:
        return False
    path = namespace.get("__file__")
    if path.__class__ is not str:
        return namespace.get("__spec__") is None and (
            namespace.get("__name__") not in sys.builtin_module_names)
    return not os.path.abspath(path).startswith(_LIBRARIES)


def _module_hooks(module):
    """The hooks registered on `module` and on the Variables it holds as attributes."""
    return [*_hook_functions(module), *(hook for v in vars(module).values()
                                        if isinstance(v, Variable) for hook in _hook_functions(v))]


def _hook_functions(obj):
    """The hooks registered on a Module (forward and forward pre-hooks) or a Variable (grad and
    post-accumulate hooks)."""
    if isinstance(obj, Module):
        return [*obj.__dict__.get("_forward_pre_hooks", {}).values(),
                *obj.__dict__.get("_forward_hooks", {}).values()]
    return [*(obj._hooks or ()), *getattr(obj, "_post_hooks", ())]


def _user_functions(fn):
    """The functions of the user's that calling `fn` runs first: `fn` itself, a partial's or a
    bound method's function, an object's __call__ (none for gradcore's, the standard library's
    or installed packages')."""
    fn = _unwrapped(fn)
    fn = getattr(fn, "__func__", fn)
    if not isinstance(fn, types.FunctionType) and not isinstance(fn, type):
        fn = getattr(getattr(type(fn), "__call__", None), "__func__",
                     getattr(type(fn), "__call__", None))
    if isinstance(fn, types.FunctionType) and _users_code(fn.__code__):
        return [fn]
    return []


def _unfollowed_hooks(surroundings, modules, variables):
    """The functions of the user's registered as hooks on `modules` (and their Variables) or
    `variables` that `surroundings` does not follow for the globals they read."""
    found = {}
    for module in modules:
        for hook in _module_hooks(module):
            for f in _user_functions(hook):
                found.setdefault(id(f.__code__), f)
    for v in variables:
        for hook in _hook_functions(v):
            for f in _user_functions(hook):
                found.setdefault(id(f.__code__), f)
    # one that reads nothing from outside (no global, no closure variable) adds nothing to a key
    return [f for code, f in found.items() if code not in surroundings.followed
            and any(_reads(f)[:2])]


def _surroundings(fn, also=()):
    """A function of no arguments giving the identities of what `fn` reads from outside its
    arguments by name: the contents of its closure cells, its default arguments (the tuple of
    them, and each keyword-only one) and the globals its code reads, its comprehensions',
    lambdas' and inner functions' included, and so for each function of the user's that it
    reaches by a global name, and each hook registered on a Module or Variable it reaches so (a
    model rebound to another, a Python number a global holds changed: another key, so a new
    recording), and for the functions `also` (hooks a recording ran). For a method bound to an
    object (not a Module, which counts its own changes), also the object's own attributes its
    code reads by name (`self.opt`, `self.scale`: its __dict__ entries or __slots__), and those
    the methods of its class that it reads so read (`self._loss(...)`). Attributes of those
    objects are not followed (Modules count their own changes: structure_changes). What stays
    the same from call to call is looked up once, here (again when a call finds no tape: see
    Compiled.__call__). Its `followed`: the ids of the code objects whose reads it gives."""
    fn = _unwrapped(fn)  # a partial's fixed arguments are constants of the tape, as attributes
    if (getattr(fn, "__code__", None) is None and getattr(fn, "__func__", None) is None
            and not isinstance(fn, type) and hasattr(type(fn), "__call__")
            and hasattr(type(fn).__call__, "__code__")):
        fn = fn.__call__  # an object of the user's with __call__: that method, bound to it
    bound_to = getattr(fn, "__self__", None)  # a bound method: its object too
    owner = id(bound_to)
    fn = getattr(fn, "__func__", fn)
    if getattr(fn, "__code__", None) is None and not also:
        read = lambda: owner  # noqa: E731
        read.labels = ["the object it is bound to"]
        read.objects = lambda: (bound_to,)  # noqa: E731
        read.followed = frozenset()
        return read
    cells, spaces, names, holders, held, labels, followed = _reads(fn, also, bound_to)
    read = _reader(owner, cells, spaces, names, holders, held)

    def objects():
        """What read() gives the ids of: a tape keyed on them holds them, so that no other
        object takes one of their ids while it lives."""
        return (bound_to, *map(_content, cells), *map(dict.get, spaces, names),
                *map(_attribute, holders, held))
    read.labels = ["the object it is bound to", *labels]  # what each entry of its key is
    read.objects = objects
    read.followed = followed
    return read


def _attribute(obj, name):
    return getattr(obj, name, None)


def _reader(owner, cells, spaces, names, holders, held):
    """_surroundings' read(): a cache hit reads what the step reads from outside at every call,
    so each is spelled out in the source of a function made here (`_id(c0.cell_contents)`,
    `_id(_get(s0, 'model'))`, `_id(h0.__defaults__)`), which takes the objects it reads as
    default arguments (locals: steps whose reads look alike share the code, and no cache of
    globals). By map() over the lists, as before, read() cost ~5,000 instructions more a call
    (cachegrind, an empty step reading two globals: 7,700 against 2,200; ~700 an entry)."""
    parameters, values, entries = ["owner", "slow", "_id", "_get"], [owner, None, id, dict.get], []
    for i, cell in enumerate(cells):
        parameters.append(f"c{i}")
        values.append(cell)
        entries.append(f"_id(c{i}.cell_contents)")
    numbers = {}  # id(namespace read) -> its number: one parameter per namespace
    for space, name in zip(spaces, names):
        number = numbers.get(id(space))
        if number is None:
            number = numbers[id(space)] = len(numbers)
            parameters.append(f"s{number}")
            values.append(space)
        entries.append(f"_id(_get(s{number}, {name!r}))")
    for i, (holder, name) in enumerate(zip(holders, held)):
        parameters.append(f"h{i}")
        values.append(holder)
        entries.append(f"_id(h{i}.{name})")  # `name` an identifier: __defaults__, a slot's

    def slow():  # a cell not yet filled, a slot not set: their None
        return (owner, *map(id, map(_content, cells)), *map(id, map(dict.get, spaces, names)),
                *map(id, map(_attribute, holders, held)))
    values[1] = slow
    code = _reader_code(", ".join(parameters), "".join(entry + ", " for entry in entries))
    return types.FunctionType(code, _READER_GLOBALS, "read", tuple(values))


_READER_GLOBALS = {"__builtins__": builtins}


@functools.lru_cache(maxsize=256)
def _reader_code(parameters, entries):
    """The code of a read(<parameters>) returning `(owner, <entries>)` (see _reader): compiled
    once for each (~400,000 instructions, a third of a small step's recording), as every
    recording asks again for the same."""
    source = (f"def read({parameters}):\n"
              "    try:\n"
              f"        return (owner, {entries})\n"
              "    except (ValueError, AttributeError):\n"
              "        return slow()\n")
    namespace = {}
    exec(builtins.compile(source, "<gradcore.compile surroundings>", "exec"), namespace)
    return namespace.pop("read").__code__  # popped: no cycle of it and its globals left


def _change(old, new, surroundings):
    """What differs between the keys `old` and `new`, in words (the first difference found),
    and what to do about it."""
    (parts, around, layers, modes), (new_parts, new_around, new_layers, new_modes) = old, new
    for what, a, b in (("grad mode", parts[0], new_parts[0]),
                       ("train mode", parts[1], new_parts[1]),
                       ("the number of arguments", len(parts), len(new_parts))):
        if a != b:
            return what, _PASS_IT
    for i, (a, b) in enumerate(zip(parts[2:], new_parts[2:])):
        if a != b:
            if _identity_only(a, b):
                return f"argument {i} ({_signature(a)} -> another like it)", _SAME_OBJECT
            if _strides_only(a, b):
                layout = "chunks" if any(isinstance(n, tuple) for n in _strides(a)) else "strides"
                return (f"argument {i} ({_signature(a)}, laid out with {layout} "
                        f"{_strides(a)} -> {_strides(b)})", _LAYOUT)
            return f"argument {i} ({_signature(a)} -> {_signature(b)})", _advice(a, b)
    if around != new_around:
        if len(around) == len(new_around) == len(surroundings.labels):
            return next(label for label, a, b in zip(surroundings.labels, around, new_around)
                        if a != b), _PASS_IT
        return "the functions the step calls", _PASS_IT
    if layers != new_layers:
        return ("a Module's layers or its hooks, or an object other than a number or string "
                "set on a Module (a list made anew at each call: every step's tapes then record "
                "again)"), _PASS_IT
    if modes != new_modes:
        return "a Module's train or eval mode", _PASS_IT
    return "nothing it can name", _PASS_IT


_PASS_IT = "pass what changes as an argument"
# A number changing at every call (an annealed loss weight, a time t) records at every call: as
# a 0-d array it is an argument the tape reads (as eagerly: float32 data times a float32 0-d
# array is float32 data times the number)
_A_NUMBER = ("a number is keyed by its value, so each new one records a tape: pass one that "
             "changes at every call as a 0-d array of the data's library and dtype "
             "(np.asarray(w, dtype=np.float32)), which a replay reads afresh, or keep to a few "
             "values")
_VALUES = ("such an argument is keyed by its value (a tuple, list or dict by the numbers and "
           "strings in it): keep to a few values, or pass a number that changes at every call "
           "as an argument of its own, a 0-d array of the data's library and dtype")
_SAME_OBJECT = ("such an argument is keyed by identity: pass the same one at every call, or what "
                "changes in it as arguments of their own")
_LAYOUT = ("an array's layout is part of its key (results follow it): pass arrays of one "
           "layout, numpy.ascontiguousarray(x) say, or Dask arrays of one chunking "
           "(x.rechunk(chunks))")


def _strides(part):
    """The strides in an array argument's or a Variable argument's part of a key."""
    return part[-3] if part[0] is Variable else part[-1]


def _strides_only(a, b):
    """True if two parts of keys for one array or Variable argument differ only in strides."""
    if a[0] is not b[0] or len(a) != len(b) or a[0] is SAME_AS or a[0] is SHARES_MEMORY:
        return False
    if a[0] is Variable:
        return a[:-3] == b[:-3] and a[-2:] == b[-2:] and a[-3] != b[-3]
    return (len(a) == 5 and a[0].__class__ is type and not issubclass(a[0], _CONTAINERS)
            and a[:-1] == b[:-1] and a[-1] != b[-1])


def _identity_only(a, b):
    """True if two parts of keys for one argument differ only in the identity of the object
    (the last entry of a part keyed by identity: another Parameter, another object of yours)."""
    return (a[0].__class__ is type and a[0] not in _BY_VALUE and a[:-1] == b[:-1]
            and a[-1].__class__ is int and b[-1].__class__ is int)


def _advice(a, b):
    """What to do about an argument whose part of a key went from `a` to `b`."""
    if _is_number(a) and _is_number(b):
        return _A_NUMBER
    if _by_value(a) and _by_value(b):
        return _VALUES
    return "keep to a few shapes and dtypes (pad a short last batch)"


def _is_number(part):
    """True if `part` (an argument's part of a key) is a Python number's or NumPy scalar's."""
    kind = part[0]
    return kind is int or kind is float or kind in _NUMPY_SCALARS and kind is not _NUMPY.bool_


def _by_value(part):
    """True if `part` is a part of a key by value: a Python number's, string's, None's, a NumPy
    scalar's, or a container's of those (_by_contents)."""
    return part[0] in _BY_VALUE or part[0] in _NUMPY_SCALARS or (
        len(part) == 3 and part[1] == "values")


def _signature(part):
    """An argument's part of a key, in words."""
    kind = part[0]
    if kind is SAME_AS or kind is SHARES_MEMORY:
        return f"{kind} {part[1]}"
    if kind is Variable:
        hooks = part[-2]
        return f"a Variable of shape {part[2]}, {part[3]}" + (
            "" if hooks is None else f", with {len(hooks)} hook{'s' if len(hooks) > 1 else ''}")
    if kind in _BY_VALUE:
        return repr(part[1])
    if kind in _NUMPY_SCALARS:
        return f"{kind.__name__}({', '.join(repr(value[1]) for value in part[1:])})"
    if len(part) == 5:
        return f"{kind.__name__} of shape {part[1]}, {part[2]}"
    return f"a {kind.__name__} object"


def _reads(fn, also=(), bound_to=None):
    """What `fn`, the functions `also`, and each function of the user's they reach by global
    names or closure variables (transitively; for a Module, the forward of each of its modules
    and the hooks registered on them and on their Variables; for a Variable, its hooks; for a
    step bound to `bound_to`, the methods of its class it reads by name: see _instance_reads)
    read from outside: their closure cells; each name read with the namespace it is read from
    (two lists, side by side: the globals, each keyword-only default in __kwdefaults__, and the
    attributes of `bound_to` in its __dict__); the objects whose attributes are read by getattr
    and those attributes' names (two lists: a function's __defaults__ and __kwdefaults__, a
    slot of `bound_to`); a label for each, in that order; the ids of the code objects
    followed."""
    cells, spaces, names, holders, held, seen = [], [], [], [], [], set()
    cell_labels, name_labels, held_labels = [], [], []
    namespace, attributes, slots, methods = _instance_reads(bound_to, fn)
    spaces += [namespace] * len(attributes)
    names += attributes
    name_labels += [f"the attribute {name!r} of the object it is bound to" for name in attributes]
    holders += [bound_to] * len(slots)
    held += slots
    held_labels += [f"the attribute {name!r} of the object it is bound to" for name in slots]
    todo = [*also, *methods, *([fn] if getattr(fn, "__code__", None) is not None else [])]
    while todo:
        f = todo.pop()
        if id(f.__code__) in seen:
            continue
        seen.add(id(f.__code__))
        read = _global_names(f.__code__)
        where = "" if f is fn else f" (read by {f.__qualname__})"
        cells += f.__closure__ or ()
        cell_labels += [f"the closure variable {name!r}{where}"
                        for name in f.__code__.co_freevars[:len(f.__closure__ or ())]]
        spaces += [f.__globals__] * len(read)
        names += read
        name_labels += [f"the global {name!r}{where}" for name in read]
        # the defaults: the tuple (immutable: replaced as a whole), and the keyword-only ones
        # (a dict: the dict, and what each of its names holds)
        defaults, keyword_defaults = f.__defaults__, f.__kwdefaults__
        if defaults is not None:
            holders.append(f)
            held.append("__defaults__")
            held_labels.append(f"the default arguments of {f.__qualname__}")
        if keyword_defaults is not None or f.__code__.co_kwonlyargcount:
            holders.append(f)
            held.append("__kwdefaults__")
            held_labels.append(f"the keyword-only defaults of {f.__qualname__}")
        if keyword_defaults:
            spaces += [keyword_defaults] * len(keyword_defaults)
            names += list(keyword_defaults)
            name_labels += [f"the default of {name!r} of {f.__qualname__}"
                            for name in keyword_defaults]
        for value in [*map(f.__globals__.get, read), *map(_content, f.__closure__ or ()),
                      *(defaults or ()), *(keyword_defaults or {}).values()]:
            # a function it reaches by name; the forward of each module of a model it does, and
            # the hooks on those modules and their Variables; a Variable's hooks. Asked of
            # type(value): isinstance asks value.__class__ too, which imports a lazy import
            kind = type(value)
            if issubclass(kind, Module):
                reached = [called for module in value.modules()
                           for called in (type(module).forward, *_module_hooks(module))]
            elif issubclass(kind, Variable):
                reached = _hook_functions(value)
            elif kind is types.FunctionType:
                reached = [value]
            else:
                continue
            todo += [g for called in reached for g in _user_functions(called)]
    # in the order read() gives them: cells, names in namespaces, attributes by getattr
    return (cells, spaces, names, holders, held, cell_labels + name_labels + held_labels,
            frozenset(seen))


def _instance_reads(obj, fn):
    """What a step `fn` bound to `obj` reads of obj's own attributes by name: (obj's __dict__,
    the names read there, the names of its __slots__ read, the methods of its class it reads by
    name, whose code is followed too). The names are the attributes its code reads (of any
    object: a name obj lacks, in its __dict__ and its class, is left out), each in obj's
    __dict__ or its class (a class attribute is keyed by the instance's entry, absent until one
    is set: `self.scale = 3.0` over a class's `scale = 1.0`). None of it for a Module (its own
    attribute changes are counted: structure_changes), a class, or code not the user's."""
    if (obj is None or isinstance(obj, type) or issubclass(type(obj), Module)
            or getattr(fn, "__code__", None) is None or not _users_code(fn.__code__)):
        return None, [], [], []
    kind = type(obj)
    namespace = _namespace(obj)
    if namespace.__class__ is not dict:
        namespace = None
    slots = {descriptor.__name__ for descriptor in _slot_descriptors(kind)}
    attributes, slotted, methods = [], [], []
    found, todo, seen = set(), [fn.__code__], set()
    while todo:
        code = todo.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        for name in _attribute_names(code):
            if name in found:
                continue
            found.add(name)
            if name in slots:
                slotted.append(name)
                continue
            in_class = _class_attribute(kind, name)
            if namespace is not None and (name in namespace or in_class is not _ABSENT):
                attributes.append(name)
            if type(in_class) is types.FunctionType and _users_code(in_class.__code__):
                methods.append(in_class)  # self._loss(...): what it reads, read too
                todo.append(in_class.__code__)
    return namespace, attributes, slotted, methods


_ABSENT = object()


def _class_attribute(kind, name):
    """`name` as the class `kind` holds it (in its namespace or a base's: no descriptor runs),
    or _ABSENT."""
    for cls in kind.__mro__:
        namespace = _namespace(cls)
        if namespace is not None and name in namespace:
            return namespace[name]
    return _ABSENT


def _attribute_names(code):
    """The attribute names `code`, and the code objects made in it, read (`self.opt`, also
    `x.data`: of any object)."""
    return _names_loaded(code, ("LOAD_ATTR", "LOAD_METHOD"), _ATTRIBUTE_NAMES)


_ATTRIBUTE_NAMES = weakref.WeakKeyDictionary()  # code object -> _attribute_names(code)


def _content(cell):
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled
        return None


def _global_names(code):
    """The global names `code` reads, and the code objects made in it (comprehensions, lambdas,
    inner functions) read. Not co_names, which also holds every attribute name: a global named as
    an attribute the step reads (`data`, rebound by a loop over batches) would have made each
    call another key."""
    return _names_loaded(code, ("LOAD_GLOBAL", "LOAD_NAME"), _GLOBAL_NAMES)


def _names_loaded(code, opnames, cache):
    """The names the instructions `opnames` of `code`, and of the code objects made in it,
    load, each once, in order; kept in `cache` (a code object never changes: dis takes ~0.15
    ms for a function of 20 lines, and each recording asks twice for every function it
    follows)."""
    names = cache.get(code)
    if names is None:
        names = [instruction.argval for instruction in dis.get_instructions(code)
                 if instruction.opname in opnames]
        for constant in code.co_consts:
            if isinstance(constant, types.CodeType):
                names += _names_loaded(constant, opnames, cache)
        names = cache[code] = tuple(dict.fromkeys(names))
    return names


_GLOBAL_NAMES = weakref.WeakKeyDictionary()  # code object -> _global_names(code)


# ------------------------------------------------------------------------------ recording
def _start(rec):
    """Make `rec` the recorder and send every op through Function._call, where inputs are
    adopted; returns what _stop puts back. Noted in _recording before anything is set, so that
    a recording cut short anywhere from here on (a Ctrl-C) is ended by _ended."""
    plain = {backend: backend.plain for backend in backends.registered()}
    _recording[0] = rec, plain
    trace._active.recorder = rec
    _variable.step_recorder = rec
    for backend in plain:
        backend.plain = False
    if _RLOCK is not None:
        _BIT_GENERATOR_MODULE.RLock = _made_while_recording
    if threading.active_count() > 1:
        # an op another thread began before step_recorder was set reads its Variables' arrays
        # without asking the recorder: let it finish now, before the step adopts any (that
        # thread's next ops ask, and wait: Recorder.wait_for_release). sleep(0) hands over
        # nothing: this thread takes the GIL back before the other is scheduled
        time.sleep(1e-4)
    return plain


def _stop(rec, plain):
    """End the recording `rec`: the recorder uninstalled, the Variables it touched given their
    arrays back, the lines that leave them as the step did written. _recording is cleared last:
    one cut short (an exception, a Ctrl-C) is ended again by _ended."""
    _uninstall(plain)
    rec.release(last=True)
    rec.finished.set()  # other threads waiting for its Variables go on
    _recording[0] = None


def _uninstall(plain):
    """Every op back on its own path (`plain`, as _start found it), no recorder: done again as
    often as need be."""
    trace._active.recorder = None
    _variable.step_recorder = None
    if _RLOCK is not None:
        _BIT_GENERATOR_MODULE.RLock = _RLOCK
    for backend, value in plain.items():
        backend.plain = value


def _abandon(rec, plain):
    """End the recording `rec` that _stop did not end: the recorder uninstalled, the Variables it
    touched given their arrays back, writing no line (no tape is made of it)."""
    _uninstall(plain)
    rec.restore()
    rec.finished.set()
    _recording[0] = None


def _ended(rec, me, collecting):
    """After the recording `rec` in the thread `me`, however it ended: one that _stop did not
    end (a Ctrl-C between _start and _stop, or inside either) is abandoned, and the recording
    lock is let go (a Ctrl-C inside _alone.__exit__); then the recording is forgotten, and the
    collector turned back on. Each part runs in a finally of the one before: one Ctrl-C landing
    on any line leaves the others done (the lines of the last part: see Compiled._without_tape)."""
    try:
        try:
            running = _recording[0]
            if running is not None and running[0] is rec:
                _abandon(rec, running[1])
        finally:
            try:
                if _recording_thread[0] == me:
                    _recording_thread[0] = None
            finally:
                if _recording_lock._is_owned():
                    _recording_lock.release()
        rec.forget()
    finally:
        if collecting:
            gc.enable()
            _collector_stopped_by[0] = None


def _shape(rec, value, slots, args, logs=None):
    """The shape of the step's result `value` (of a call with `args`), with a slot index (into
    `slots`, appended to) where a replay puts an array."""
    if isinstance(value, trace.Traced):
        if value.recorder is not rec:  # kept from another recording: the array it holds
            return ("object", value.value)
        rec.hands_out(value)
        slots.append(value.slot)
        return ("array", len(slots) - 1)
    if isinstance(value, Variable):
        shaped = rec.results_shaped.get(id(value))
        if shaped is not None:  # returned twice (`return h, h`): one Variable at a replay too
            rec.results_shared = True
            return shaped
        entry = rec.adopted.get(id(value))
        if (entry is None or entry.variable is not value) and isinstance(
                value._data, trace.Traced) and value._data.recorder is rec:
            rec.hands_out(value._data)
            slots.append(value._data.slot)
            if logs is None:  # write log -> where the Variable sharing it is at replay
                logs = {key: site for key, (_, site) in rec.logs.items()}  # before a release
                logs.update((id(e.variable._writes), rec.site(e.variable))
                            for e in rec.adopted.values()
                            if e.grad_of is None and getattr(e.variable, "_writes", None))
            log = getattr(value, "_writes", None)
            # a view of an outside Variable (W.T, W.detach()) shares its version, as eagerly
            shaped = rec.results_shaped[id(value)] = (
                "variable", len(slots) - 1, value.name, None if log is None else logs.get(id(log)))
            return shaped
        stored = rec.grads_stored.get(id(value))
        if stored is not None and stored[0] is value:
            # a grad the step computed, which a line stores into a Variable: a new one at each
            # call. That Variable's grad still, it is the one a replay leaves there (the same
            # object, as eagerly); else (cleared or replaced since: opt.zero_grad() after
            # opt.step(), a WeightDecay hook) a new Variable over the array the line stores
            for line in rec.lines:
                if line.kind == "store_grad":
                    owner = line.target  # an argument's index, or the Variable
                    if (args[owner] if owner.__class__ is int else owner)._grad is value:
                        return ("grad", owner)
            traced = stored[1]
            if value._data is not traced.value:  # its data set since, by an optimizer's hook
                rec.give_up("the step returns a grad whose data was set after it was stored "
                            "(in an optimizer's step or hook), which a replay cannot hand back: "
                            "return the grad's data before the optimizer step, or a copy of it")
                return ("object", value)
            rec.hands_out(traced)
            slots.append(traced.slot)
            return ("variable", len(slots) - 1, value.name, None)
        if rec.made_here.get(id(value)) is value:  # Variable(np.zeros(3)) or Variable(BUF)
            # eagerly a new one at each call, over memory that may be the user's: a replay can
            # neither hand out this one again nor a copy of it
            rec.give_up(_NOT_ITS_OWN)
        index = rec.argument_sites.get(id(value))
        if index is not None and args[index] is value:  # an argument: a replay's is another
            return ("argument", index)
        for line in rec.lines:  # the grad the tape stores into a Variable: a new one each call
            if line.kind == "store_grad":
                owner = line.target  # an argument's index, or the Variable
                if (args[owner] if owner.__class__ is int else owner)._grad is value:
                    return ("grad", owner)
        if rec.grads_found.get(id(value)) is value:
            # a grad from before the step: the one its Variable has at a replay's end, as long
            # as the step left it there (one set between calls is another object each call)
            for v in (*rec.touched, *(a for a in args if isinstance(a, Variable))):
                if v._grad is value:
                    return ("grad", rec.site(v))
            rec.give_up("the step returns a grad it found on a Variable (there before the step "
                        "ran, or made by an optimizer's hook in it: WeightDecay, ClipGrad), and "
                        "then set or cleared that Variable's grad (opt.zero_grad()): a replay "
                        "would hand back this one again. Return a copy made with gradcore's ops "
                        "(g * 1.0) before the grad changes")
        return ("object", value)
    kind = value.__class__
    if kind in (tuple, list):
        return (kind, [_shape(rec, v, slots, args, logs) for v in value])
    if kind is dict:
        return (dict, {k: _shape(rec, v, slots, args, logs) for k, v in value.items()})
    if isinstance(value, tuple) and hasattr(kind, "_make"):  # a namedtuple: rebuilt by _make
        return ("namedtuple", kind, [_shape(rec, v, slots, args, logs) for v in value])
    if kind not in _BY_VALUE:
        # any other object is handed back as it is at every replay: right for one from outside
        # the step (a model), frozen for one holding what the step computed
        if isinstance(value, _SUSPENDED):
            rec.give_up(f"the step returned a {kind.__name__}, which runs its body only as it "
                        "is consumed, after the recording: a replay would hand back this one "
                        "again. Compile the function that runs one step, and call it from the "
                        "generator")
        elif _made_in_step(rec, value):
            rec.give_up(f"the step returned a {kind.__name__} holding Variables or arrays it "
                        "computed, which a replay cannot rebuild: return them in a tuple, list, "
                        "dict or namedtuple")
        elif _is_mutable_array(value) and not _reached(rec, value):
            # made in the step (np.full(3, 0.5), a new one at each call) or the user's memory
            # held where _reachable cannot look: neither this one nor a copy is right at a replay
            rec.give_up(_NOT_ITS_OWN)
    return ("object", value)


_NOT_ITS_OWN = ("the step returns an array (or a Variable over one) the tape cannot tell from "
                "your own memory: return a value computed by gradcore ops, or F.copy(...) of it")


def _reached(rec, array):
    """Whether the memory of the step's result `array` (it, or an array it is a view of) can be
    reached from outside the step: it could before the step ran, or the step kept it there (a
    buffer it makes once), as found by looking again, once, after the step."""
    ids = []
    while array is not None:
        ids.append(id(array))
        array = getattr(array, "base", None)
    return not rec.reached.isdisjoint(ids) or not _reached_after(rec).isdisjoint(ids)


def _reached_after(rec):
    """The ids of what can be reached from outside the step once it has run (what it reached
    before, and what it kept there), looked for once."""
    if rec.reached_after is None:
        rec.reached_after = _reachable(rec.outside)[3]
    return rec.reached_after


def _kept_outside(rec):
    """The Variables the step made (`Variable(...)`, a grad) that can be reached from outside it
    once it has run: kept in a global list, or on an object of the user's."""
    if not rec.made_here:
        return []
    reached = _reached_after(rec)
    return [v for i, v in rec.made_here.items() if i in reached]


def _made_optimizer(rec):
    """The first optimizer whose step the tape runs that the step made itself, or None."""
    if rec.made_optimizers:
        for line in rec.lines:
            if line.kind == "opaque" and line.kwargs:
                opt = line.kwargs["optimizer"]
                if rec.made_optimizers.get(id(opt)) is opt:
                    return opt
    return None


def _is_mutable_array(value):
    """True for an array of a registered backend, not one of its (immutable) scalars."""
    backend = backends.backend_of(value)
    return backend is not None and value.__class__ not in backend.scalar_types


_SUSPENDED = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)


def _made_in_step(rec, value):
    """The Variables the recording `rec` made and its traced arrays that `value` (a result of
    the step) holds: looked for in containers and in objects' attributes, REACH_LIMIT objects
    at most."""
    found, seen, todo = [], set(), [value]
    while todo and len(seen) < REACH_LIMIT:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        kind = type(obj)  # as _reachable asks: no code of obj's runs
        if issubclass(kind, trace.Traced):
            if obj.recorder is rec:
                found.append(obj)
        elif issubclass(kind, Variable):
            data, entry = obj._data, rec.adopted.get(id(obj))
            if (isinstance(data, trace.Traced) and data.recorder is rec
                    and (entry is None or entry.variable is not obj)):  # not one from outside
                found.append(obj)
        elif (kind in _BY_VALUE or issubclass(kind, _SKIPPED)
              or backends.backend_of(obj) is not None):
            continue
        elif issubclass(kind, dict):
            todo.extend(dict.values(obj))
        elif issubclass(kind, _SEQUENCES):
            todo.extend(_sequence_iter(kind)(obj))
        elif issubclass(kind, _SUSPENDED):  # what its frame holds, for the code run later
            frame = getattr(obj, "gi_frame", None) or getattr(obj, "cr_frame", None) or getattr(
                obj, "ag_frame", None)
            if frame is not None:
                todo.extend(frame.f_locals.values())
        else:
            attributes = _namespace(obj)
            if attributes.__class__ is dict:
                todo.extend(attributes.values())
    return found


def _results(shape, arrays, args, made=None):
    """The step's result for a replay of a call with `args`: `shape` filled with the replayed
    arrays. `made`: the Variables made so far by their entries' ids, where the step returned
    one Variable in several places (a "shared" shape)."""
    kind = shape[0]
    if kind == "variable":
        if made is not None and id(shape) in made:
            return made[id(shape)]
        v = Variable(arrays[shape[1]], name=shape[2], requires_grad=False)
        source = shape[3]
        if source is not None:
            _variable.share_versions(args[source] if source.__class__ is int else source, v)
        if made is not None:
            made[id(shape)] = v
        return v
    if kind == "array":
        return arrays[shape[1]]
    if kind == "object":
        return shape[1]
    if kind == "grad":
        owner = shape[1]
        return (args[owner] if owner.__class__ is int else owner)._grad
    if kind == "argument":
        return args[shape[1]]
    if kind is dict:
        return {k: _results(v, arrays, args, made) for k, v in shape[1].items()}
    if kind == "namedtuple":
        return shape[1]._make([_results(v, arrays, args, made) for v in shape[2]])
    if kind == "shared":
        return _results(shape[1], arrays, args, {})
    items = [_results(v, arrays, args, made) for v in shape[1]]
    return items if kind is list else tuple(items)


def _materialize(value, detach=False):
    """The recording run's result with real arrays in place of traced ones; with `detach`, the
    Variables made in the step hold no graph and no grad, as a replay's results."""
    if isinstance(value, trace.Traced):
        return value.value
    if isinstance(value, Variable):
        if isinstance(value._data, trace.Traced):
            value._data, value._backend = value._data.value, value._data.backend.inner
            if detach:
                value.unchain()  # a retain_grad() of the step's goes too: no leaf keeps one
                value.generation, value._requires_grad, value._grad = 0, False, None
        return value
    kind = value.__class__
    if kind in (tuple, list) or isinstance(value, tuple) and hasattr(kind, "_make"):
        items = [_materialize(v, detach) for v in value]
        if all(map(operator.is_, items, value)):
            return value  # nothing traced in it: the step's own object, as eagerly
        return kind(items) if kind in (tuple, list) else kind._make(items)
    if kind is dict:
        items = {k: _materialize(v, detach) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items
    return value


def _make_eager(values):
    """Real arrays, in place of traced ones, everywhere in the graph behind `values` (Variables,
    in lists, tuples and dicts: Functions' backends, attributes and saved values), so that
    backward through it later runs as it would through the graph an eager call builds."""
    stack = list(values)
    seen = set()
    while stack:
        v = stack.pop()
        if isinstance(v, (tuple, list)):  # a namedtuple too
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        if not isinstance(v, Variable) or id(v) in seen:
            continue
        seen.add(id(v))
        _materialize(v)
        f = v.creator
        if f is None or id(f) in seen:
            continue
        seen.add(id(f))
        if isinstance(f.backend, trace.TraceBackend):
            f.backend = f.backend.inner
        f._saved = trace.unwrap(f._saved)  # a slot: not among vars(f)
        for saved in f._saved:
            if saved.__class__ is _SavedOutput:
                saved.array = trace.unwrap(saved.array)
        for name, attribute in vars(f).items():
            setattr(f, name, trace.unwrap(attribute))
        stack.extend(x for x in f.inputs if isinstance(x, Variable))  # not Python scalars
        stack.extend(y for y in (ref() for ref in f.outputs) if y is not None)
