"""Recording a step: traced arrays that compute as they record.

While `gradcore.compile` records, the arrays inside the step are `Traced`: each wraps the real
array (`value`) and the tape slot that holds it at replay (`slot`) in its recording's tape
(`recorder`). Every operator on a Traced, every call into the array namespace (`xp`) and every
Backend method that takes or makes an array runs at once on the real arrays, so the recording
call returns exactly what eager code returns, and appends one line to the tape: the same call,
with slots where arrays were.

Arrays gradcore did not make in the step (a Parameter's data, a grad from before, a constant)
enter through `Recorder.adopt`: the tape loads them from their Variable when it is replayed, so it
sees their values as they are then. What a tape cannot replay (a value read on the host, a shape
that depends on values) marks the recording as a fallback: the step then stays eager.
"""
import bisect
import dis
import functools
import gc
import operator
import os
import sys
import sysconfig
import threading
import types
import weakref

import numpy

import backends

from .. import variable as _variable
from ..variable import same_value as _same_value

# operator -> the Python spelling the tape's source uses
BINARY = {
    operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
    operator.floordiv: "//", operator.mod: "%", operator.pow: "**", operator.matmul: "@",
    operator.and_: "&", operator.or_: "|", operator.xor: "^", operator.lshift: "<<",
    operator.rshift: ">>", operator.lt: "<", operator.le: "<=", operator.gt: ">",
    operator.ge: ">=", operator.eq: "==", operator.ne: "!=",
}
IN_PLACE = {
    operator.iadd: "+=", operator.isub: "-=", operator.imul: "*=", operator.itruediv: "/=",
    operator.ifloordiv: "//=", operator.imod: "%=", operator.ipow: "**=", operator.imatmul: "@=",
    operator.iand: "&=", operator.ior: "|=", operator.ixor: "^=",
}
UNARY = {operator.neg: "-", operator.pos: "+", operator.invert: "~", operator.abs: "abs"}

# Functions whose result's shape depends on the values: a tape of fixed shapes cannot replay them
# (bincount's too, unless minlength fixes it: see _counted_to_fixed_length)
DATA_DEPENDENT_SHAPES = frozenset((
    "nonzero", "argwhere", "flatnonzero", "unique", "unique_all", "unique_counts",
    "unique_inverse", "unique_values", "extract", "compress", "trim_zeros",
    "setdiff1d", "intersect1d", "union1d", "setxor1d"))

# Functions and methods whose result's shape is given by some of their arguments: (the
# positions, as a slice, and the keywords of those). A traced value there that the step
# computed from its inputs (`xp.zeros(n)`, n from the labels) is a size read from the values:
# a tape would keep this call's size (Recorder.from_inputs). Not insert's places: the result
# grows by as many values as it is given, wherever they go. Each is a function of the
# namespace, a method of the arrays, or a Backend method (zeros)
SIZE_ARGUMENTS = {
    "zeros": (slice(0, 1), ("shape",)), "ones": (slice(0, 1), ("shape",)),
    "empty": (slice(0, 1), ("shape",)), "full": (slice(0, 1), ("shape",)),
    "zeros_like": (slice(0, 0), ("shape",)), "ones_like": (slice(0, 0), ("shape",)),
    "empty_like": (slice(0, 0), ("shape",)), "full_like": (slice(0, 0), ("shape",)),
    "random_normal": (slice(0, 1), ("shape",)), "random_uniform": (slice(0, 1), ("shape",)),
    "arange": (slice(0, 3), ("start", "stop", "step")),
    "linspace": (slice(2, 3), ("num",)), "logspace": (slice(2, 3), ("num",)),
    "geomspace": (slice(2, 3), ("num",)), "eye": (slice(0, 2), ("N", "M", "n_rows", "n_cols")),
    "identity": (slice(0, 1), ("n",)), "tri": (slice(0, 2), ("N", "M")),
    "indices": (slice(0, 1), ("dimensions",)),
    # x.reshape(n, -1) as a method: every argument after the array
    "reshape": (slice(1, None), ("shape", "newshape")),
    "resize": (slice(1, None), ("new_shape",)), "broadcast_to": (slice(1, 2), ("shape",)),
    "tile": (slice(1, 2), ("reps",)), "repeat": (slice(1, 2), ("repeats",)),
    "split": (slice(1, 2), ("indices_or_sections",)),
    "array_split": (slice(1, 2), ("indices_or_sections",)),
    "delete": (slice(1, 2), ("obj",)),
}
# Backend methods that take an index by NumPy's rules, and where it is among their arguments: a
# boolean mask there becomes as many indices as it has true values (xp.nonzero)
INDEX_ARGUMENTS = {"normalize_key": 0, "scatter_add": 1}
MASKED = ("indexing with a boolean mask gives a shape that depends on the values (keep the shape "
          "instead: multiply by the mask, or F.where(mask, x, 0))")
# Functions given a number of bins: a traced number, or a rule that reads the values ("auto")
BINS = frozenset(("histogram", "histogram_bin_edges", "histogram2d", "histogramdd"))
# The names the rules above apply to: call() asks this first, most calls meeting none
_SHAPE_RULED = frozenset((*INDEX_ARGUMENTS, *DATA_DEPENDENT_SHAPES, "where", *SIZE_ARGUMENTS,
                          *BINS, "bincount"))

_bare = object.__new__  # an instance without the call of its __init__ (a frame): see each use

try:
    # NumPy's floating-point error handling (errstate, seterr) of this context: one object
    # until either sets another, so a recorded op compares it in ~30 ns where np.geterr() takes
    # ~1.5 µs. Private to NumPy (2.0 to 2.4 at least); where it is gone the check is not made
    from numpy._core._ufunc_config import _extobj_contextvar
    _error_handling = _extobj_contextvar.get  # the bound method: no Python frame per op
except ImportError:  # pragma: no cover - a NumPy that has moved it
    def _error_handling():
        return None

ERROR_HANDLING = ("NumPy's floating-point error handling was changed inside the step (np.errstate "
                  "or np.seterr): a replay runs every line under the handling its call finds, so "
                  "an op that raised or stayed quiet eagerly would warn or give inf/nan instead; "
                  "set it around the call to the compiled function, not inside it")
_active = threading.local()  # .recorder: the Recorder of this thread, while one records


def recorder():
    """The Recorder of the calling thread, or None."""
    return getattr(_active, "recorder", None)


def give_up(reason):
    """If this thread is recording a step, the step cannot be replayed: see Recorder.give_up."""
    rec = recorder()
    if rec is not None:
        rec.give_up(reason)


# id -> a weak reference to each Variable a recording adopted (a parameter, a buffer): while a
# recording runs, another thread waits for it before using one (Recorder.wait_for_release),
# since the recording may adopt it at any moment
_adopted_before = {}


def _note_adopted(v):
    _adopted_before[id(v)] = weakref.ref(v, lambda ref, i=id(v): _adopted_before.get(i) is ref
                                         and _adopted_before.pop(i))


# How long a thread that is not recording waits for a recording in another thread to give back
# the Variables it is using (compiled calls and eager code alike) before it raises: long past any
# recording's time, short of waiting for ever on a step that waits for that thread
WAIT_SECONDS = 60


def _check_not_in_use(args, kwargs):
    """RuntimeError if an op outside any recording computes on a traced array that a recording
    running in another thread is using: its result would be a traced array in that thread's
    hands. (One kept from a recording that has ended is a constant.)"""
    for a in (*args, *kwargs.values()) if kwargs else args:
        rec = getattr(a, "recorder", None) if isinstance(a, Traced) else None
        if (rec is not None and not rec.finished.is_set()
                and rec.thread != threading.get_ident()):
            raise RuntimeError(
                "gradcore.compile: this thread computed with a Variable that a compiled step "
                "recording in another thread is using (it holds a traced array until that "
                "recording ends). Call each compiled step once per signature before other "
                "threads use its model, or use the model from one thread")


# gradcore's own code: its package and the backends
_GRADCORE_DIRS = tuple(os.path.abspath(path) for path in (
    os.path.dirname(os.path.dirname(__file__)), os.path.dirname(backends.__file__)))
# Code that is not the user's: gradcore, backends, the standard library and installed packages.
# A step's calls into it are not followed for the globals they read (their globals are not the
# user's settings), and a fallback names the user's line that called it
_LIBRARIES = tuple(dict.fromkeys((*_GRADCORE_DIRS, *(
    os.path.abspath(sysconfig.get_paths()[name])
    for name in ("stdlib", "platstdlib", "purelib", "platlib")))))


def _users_code(code):
    """True if `code` is the user's: not gradcore's, the standard library's or an installed
    package's."""
    return not os.path.abspath(code.co_filename).startswith(_LIBRARIES)


def _returned_at(fn):
    """'file:line' of the return statement of the step `fn` (a function of the user's, or a
    partial of one, a bound method, an object with __call__), 'file:line, line' where it has
    several; None where it is not the user's code."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = getattr(fn, "__func__", fn)
    if not isinstance(fn, types.FunctionType):
        fn = getattr(getattr(type(fn), "__call__", None), "__func__", None)
    code = getattr(fn, "__code__", None)
    if code is None or not _users_code(code):
        return None
    returns = {i.offset for i in dis.get_instructions(code)
               if i.opname in ("RETURN_VALUE", "RETURN_CONST")}
    lines = sorted({line for start, end, line in code.co_lines()
                    if line is not None and any(start <= r < end for r in returns)})
    return f"{code.co_filename}:{', '.join(map(str, lines))}" if lines else None


def _user_frame():
    """'file:line' of the innermost frame of the user's code: where it asked, maybe through
    NumPy (np.nonzero runs x.nonzero()), for what the tape cannot replay."""
    frame = sys._getframe(1)
    while frame is not None:
        if _users_code(frame.f_code):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "an unknown place"


class Ref:
    """A slot in a line's arguments: the array the tape holds there."""

    __slots__ = ("slot",)

    def __init__(self, slot):
        self.slot = slot


_UNSET = object()  # an attribute a module did not have


class Line:
    """One tape line. kind: "call" (out = target(*args, **kwargs)), "method" (out =
    args[0].target(*args[1:], **kwargs)), "binary", "unary", "in_place" (args[0] op= args[1]),
    "setitem" (args[0][args[1]] = args[2]), "load" (out = target._data), "load_grad" (out =
    target._grad._data), "opaque" (target(*args) run eagerly; kwargs["optimizer"] the optimizer
    whose step it is, if one's), "store" (target._data = args[0]),
    "store_grad" (target._grad = a new Variable of args[0], or None), "guard" (bool(args[0]) must
    be `target` again, else the call runs eagerly)."""

    __slots__ = ("kind", "target", "args", "kwargs", "out", "reads", "array")

    def __init__(self, kind, target, args=(), kwargs=None, out=None, reads=None):
        self.kind, self.target, self.args, self.kwargs, self.out = kind, target, args, kwargs, out
        # the slots its arguments refer to (the recorder, which has them at hand, may pass them)
        self.reads = slots_in(kwargs, slots_in(args, [])) if reads is None else reads
        self.array = None  # an ArrayFacts when the line made an array (not a scalar)


def _line(kind, target, args, kwargs, out, reads):
    """Line(kind, target, args, kwargs, out, reads) without the call of __init__: one per
    traced op (callgrind: ~750 instructions less of ~3,000)."""
    line = _bare(Line)
    line.kind = kind
    line.target = target
    line.args = args
    line.kwargs = kwargs
    line.out = out
    line.reads = reads
    line.array = None
    return line


class ArrayFacts:
    """What a line's array result was when it was recorded: for reusing its buffer later."""

    __slots__ = ("shape", "dtype", "nbytes", "fresh", "root", "xp", "contiguous", "strides")

    def __init__(self, array, fresh, root, xp):
        self.shape, self.dtype, self.fresh, self.xp = array.shape, array.dtype, fresh, xp
        self.nbytes = getattr(array, "nbytes", 0)  # unknown (array-api-strict): never reused
        self.root = root  # a number for the memory it is in: equal for an array and its views
        # C order: a view in C order as large as its memory spans all of it, in the order a
        # fresh result is laid out (NumPy's and CuPy's flags; unknown: False; None where not
        # asked: a small fresh array's, _fresh_facts). A read-only view (of broadcast_to's
        # result, in sum's backward) is never lent: NumPy refuses out= into it
        flags = getattr(array, "flags", None)
        self.contiguous = getattr(flags, "c_contiguous", False) and getattr(flags, "writeable",
                                                                            True)
        # the layout: a result written into an input's memory (out=) takes that input's, where
        # eager code gives it one that follows all its inputs'
        self.strides = getattr(array, "strides", None)


def _fresh_facts(array, nbytes, root, xp):
    """ArrayFacts(array, True, root, xp) of an array of the step's own too small to lend its
    memory (nbytes < REUSE_BYTES, read already): one per traced op on small arrays, without
    the call of __init__, and `contiguous` left None, as the buffer pass asks it only of an
    array that is not fresh (callgrind: ~1,800 instructions less of ~5,200)."""
    facts = _bare(ArrayFacts)
    facts.shape = array.shape
    facts.dtype = array.dtype
    facts.nbytes = nbytes
    facts.fresh = True
    facts.root = root
    facts.xp = xp
    facts.contiguous = None
    facts.strides = getattr(array, "strides", None)
    return facts


_NESTED = frozenset((tuple, list, dict, slice))
# Python numbers: a line argument as they are (never one of Recorder.objects, which wrap
# gives up rather than hold)
_NUMBERS = frozenset((int, float))

# Below this size an allocation is cheap (NumPy keeps small blocks for reuse; large ones are
# mapped from the system afresh): the tape reuses buffers of this size or more only
REUSE_BYTES = 1 << 16


def slots_in(value, found):
    """Append to `found` the slots a line argument refers to."""
    kind = value.__class__
    if kind is Ref:
        found.append(value.slot)
    elif kind is tuple or kind is list:
        for v in value:
            if v.__class__ is Ref:
                found.append(v.slot)
            elif v.__class__ in _NESTED:
                slots_in(v, found)
    elif kind is dict:
        slots_in(tuple(value.values()), found)
    elif kind is slice:
        slots_in((value.start, value.stop, value.step), found)
    return found


def _cone(line, writers):
    """`line` and every line it depends on, through the lines that last wrote what each reads
    (one that wrote a slot again after the reader counts as well: a cone is never too small)."""
    cone, todo, seen = [], [line] if line is not None else [], set()
    while todo:
        line = todo.pop()
        if id(line) not in seen:
            seen.add(id(line))
            cone.append(line)
            todo.extend(writers[slot] for slot in line.reads if slot in writers)
    return cone


class Recorder:
    """The tape being written, and the Variables the step touched that existed before it."""

    def __init__(self):
        self.thread = threading.get_ident()
        self.error_handling = _error_handling()  # what each traced op must find (wrap)
        self.finished = threading.Event()  # set once the adopted Variables have their arrays back
        self.lines = []
        self.slots = 0
        self.fallback = None        # (reason, 'file:line') once the step cannot be replayed
        self.objects = {}           # id(object) -> (object, slot): non-array results (index keys)
        self.adopted = {}           # id(Variable) -> _Adopted
        self.arguments = []         # (argument index, slot, is a Variable) per array argument
        self.dtypes = {}            # slot -> dtype of each array no line makes (argument, load)
        # slot -> strides of each array no line's ArrayFacts describe (argument, load, constant,
        # an item of a tuple result): a line lending memory checks its inputs' at each replay
        self.layouts = {}
        self.grad_owners = {}       # id(grad Variable) -> the adopted Variable it is the grad of
        # id(grad Variable) -> (it, its Traced) for each grad the step made that a line stores
        # into a Variable (release): returned, a replay hands out a Variable over that array
        self.grads_stored = {}
        self.grads_found = {}       # id -> each grad Variable from before the step it met
        # the step, while its result is looked at (Compiled): a fallback then names its return
        self.returning = None
        # the step created weights (lazy layers), or left an outside Variable's data with
        # another shape, dtype or library (a growing memory): the next call records again
        self.record_again = False
        self.arrays = {}            # id(array) -> (its ArrayFacts, a weak reference to it)
        # the most bytes of the arrays lines made, where REUSE_BYTES or more (else less): the
        # tape's buffer passes run only where it is that large
        self.largest = 0
        self.memories = {}          # id(base array) -> (a weak reference to it, its number)
        self.memory_count = 0       # the numbers given out in memories
        self.checked = 0            # lines[:checked] are guards and what they test: the start
        self.module_states = []     # (module, name) of each Variable the step kept on a module
        # (module, name) -> (the value before the step first set it, where it did): see
        # module_state
        self.states_before = {}
        # (module, name) -> the value the step read there before it set it (see
        # module_state_read), which a replay checks; [(module, name)]: states the step left
        # None where it found a Variable, which a replay leaves None
        self.states_read = {}
        self.states_left = []
        # (module, name) -> the Python value, not a Variable, before the step first set it (or
        # _UNSET): see python_state
        self.python_states = {}
        self.reads_noted = set()  # (module, name) of carried states whose reads are told
        # (module, name, value): each Python value the step set, with the value it found, which
        # a replay checks; values_set, (module, name, value) each it left another value in,
        # which a replay sets
        self.values_read = []
        self.values_set = []
        # (id(module), name) -> each Python value (is_python_value) of the modules the step
        # reached, as it began (Compiled fills it): what the tape took them as
        self.values_found = {}
        self.modules_reached = {}  # id -> each Module the step reached as it began
        # id -> a weak reference to each Module made while it recorded (in its thread): eagerly
        # each call makes another, so what it registers, sets and keeps is the step's own, no
        # state a tape took or leaves (python_state, module_state, module_called pass it by),
        # as long as it dies with the call (check_module_states)
        self.modules_made = {}
        self.reached_all = True    # False where the walk stopped at REACH_LIMIT objects
        self.values_seen = 0       # the count of value changes then (variable.value_changes)
        self.settings_found = {}   # id -> the settings_of each Variable it reached, as it began
        # id -> each Variable whose requires_grad or hooks changed while it recorded (see
        # variable.settings_changed): noted as changed when it ends
        self.settings_noted = {}
        # id -> (the place, each Variable argument, its requires_grad as the step began)
        self.argument_settings = {}
        self.again_because = None  # why record_again was set, where it says more than a weight
        self.draws = []             # (backend method, args, kwargs) of each random draw made
        self.grads_read = []        # the Variables whose grad a load_grad line reads
        # id -> each grad the step set (backward's, an optimizer hook's in an opaque call): one
        # a line loads need not be there before the step
        self.grads_made = {}
        self.grads_absent = []      # those whose grad the step set where it found none
        self.made_here = {}         # id -> each Variable the step made (a new one at each call)
        self.made_optimizers = {}   # id -> each optimizer the step made (see _made_optimizer)
        # ids of the made Variables read already, and the slots of their first reads: a replay
        # reads the array a Variable was made over there (constant lines), not the Variable
        self.made_read, self.made_slots = set(), set()
        self.own_memories = set()   # memory numbers of arrays the step made outside the tape
        # ids of what the step can reach from outside it, from `outside` (its function, what
        # it reads by name, its keyed arguments): arrays among them are not made by the step
        self.reached = set()
        self.outside = None
        self.reached_after = None   # the same, looked for again once the step has run
        self.touched = []           # the outside Variables (not arguments) the step read or set
        self.argument_sites = {}    # id(Variable argument) -> its index: a replay's is another
        self.grads_cleared = set()  # ids of the Variables whose grad the step cleared
        self.logs = {}              # id(write log) -> (it, its Variable's site), seen at release
        # What the guards ask of the lines before them, brought up to date at each guard over
        # the lines appended since the last (Recorder._scan): a step with no guard pays nothing,
        # and one with a guard per timestep looks at each line once. A line's time is its index
        # when it was appended (lines appended since the last guard are where they were put)
        self.scanned = 0            # lines[:scanned] are taken into account below
        self.settled = 0            # lines[settled:] are where they were appended
        self.writers = {}           # slot -> the line that last wrote it (made it, or in place)
        self.makers = {}            # slot -> the line that made it (its `out`)
        self.pinned = set()         # ids of the loads after a store or an opaque line: they
        self.stored = set()         # read what one left ("data", "grad": what those may set)
        self.times = {}             # id(line) -> its time; -1 once a guard moved it first
        self.roots = {}             # slot -> the memory number of its array
        self.held = {}              # memory number -> the time a Variable's data or grad got it
        self.first_written = {}     # memory number -> the time a line first wrote into it
        self.in_place = {}          # memory number -> the lines that wrote into it in place
        self.opaque_times = []      # the time of each opaque line (an optimizer step)

    def forget(self):
        """Drop what the recording holds, once its tape is built or its call fell back. The
        Variables the step made hold traced arrays that refer back here, and this holds them
        (made_here, the lines, the Variables touched): kept, each recording would be a cycle
        holding its arrays and, through the touched parameters, the model until the collector
        ran. A tape has its own references to what it took. What stays is what a traced array
        kept past the recording may still ask (_check_not_in_use)."""
        # one statement: a Ctrl-C cannot land between dropping the rest and keeping these
        self.__dict__ = {"thread": self.thread, "finished": self.finished}

    # ------------------------------------------------------------ slots and lines
    def new_slot(self):
        self.slots += 1
        return self.slots - 1

    def append(self, kind, target, args=(), kwargs=None, out=None):
        self.lines.append(Line(kind, target, args, kwargs, out))

    def guard(self, traced, value):
        """A traced boolean decided a Python branch (a check such as labels in range): the tape
        tests it first thing and, if it comes out otherwise, the call runs eagerly, before the
        replay has changed anything. So the lines it depends on move to the tape's start, which
        needs them to change nothing and read no state a line before them changes; otherwise
        the step cannot be replayed."""
        self._scan()
        cone = _cone(self.writers.get(traced.slot), self.writers)
        if traced.recorder is not self or any(id(line) in self.pinned or has_side_effect(line)
                                              for line in cone) or self._overwritten(cone):
            self.give_up("a traced value decided a Python branch (bool) and depends on a "
                         "change the step made")
            return
        # The cone's lines move to the start, after those earlier guards moved. Only the lines
        # from the cone's first on are looked at: a line appended since the last guard is at
        # the index that is its time (a guard's cone is mostly recent: labels just indexed)
        first = min((time for time in map(self.times.__getitem__, map(id, cone)) if time >= 0),
                    default=len(self.lines))
        if first < self.settled:
            first = self.checked  # a line from before the last guard, which moved lines
        moved = set(map(id, cone))
        tail = self.lines[first:]
        head = [line for line in tail if id(line) in moved]
        self.lines[self.checked:] = [
            *head, Line("guard", value, (traced.ref,), {"where": _user_frame()}),
            *self.lines[self.checked:first], *(line for line in tail if id(line) not in moved)]
        self.checked += len(head) + 1
        for line in head:
            self.times[id(line)] = -1  # at the start now: before every line that writes
        self.scanned = self.settled = len(self.lines)  # the guard line writes nothing

    def _scan(self):
        """Take the lines appended since the last guard into Recorder.writers, makers, pinned,
        roots, held, first_written, in_place and opaque_times (see __init__)."""
        lines, writers, roots = self.lines, self.writers, self.roots
        for time in range(self.scanned, len(lines)):
            line = lines[time]
            self.times[id(line)] = time
            kind, out = line.kind, line.out
            if kind == "load" and "data" in self.stored or kind == "load_grad" and self.stored:
                self.pinned.add(id(line))
            if out is not None:
                writers[out] = self.makers[out] = line
                if line.array is not None:
                    roots[out] = line.array.root
            if kind == "load" or kind == "load_grad":
                self._now_held(out, time)
            elif kind == "store" or kind == "store_grad" or kind == "opaque":
                # what a Variable holds from here on, and what an opaque call is handed: an
                # optimizer step may write those (and nothing else of the tape's)
                for slot in line.reads:
                    self._now_held(slot, time)
                if kind == "opaque":
                    self.opaque_times.append(time)
                self.stored.update(("grad",) if kind == "store_grad" else ("data", "grad"))
            else:
                for slot in written(line):
                    writers[slot] = line
                    memory = roots.get(slot)
                    if memory is not None:
                        self.first_written.setdefault(memory, time)
                        self.in_place.setdefault(memory, []).append(line)
        self.scanned = len(lines)

    def _now_held(self, slot, time):
        memory = self.roots.get(slot)
        if memory is not None:
            self.held.setdefault(memory, time)

    def _overwritten(self, cone):
        """True if a line of `cone` (a guard's, to move to the tape's start) reads memory that a
        line before it, not in the cone, wrote: in place, maybe through a view (`row = x[0];
        row[...] = 5` writes x, whose slot no line wrote), or in an opaque call, which writes
        what Variables hold (an optimizer step updates the parameters' data and may change
        their grads), not the step's other arrays. Memory is told by number (Recorder._memory);
        a scalar's, with none, is never written. No line of a cone writes (guard checks that
        first), and the lines an earlier guard moved come before every write."""
        for line in cone:
            time = self.times[id(line)]
            if time < 0:
                continue
            for slot in line.reads:
                memory = self.roots.get(slot)
                if memory is None:
                    continue
                if self.first_written.get(memory, time) < time:
                    return True
                held = self.held.get(memory)
                if held is not None:
                    # the first opaque line at or after the time a Variable got it
                    after = bisect.bisect_left(self.opaque_times, held)
                    if after < len(self.opaque_times) and self.opaque_times[after] < time:
                        return True
        return False

    def from_inputs(self, value):
        """True if a traced array in `value` (a line argument: containers looked into) may come
        out otherwise at a replay: its lines reach an argument, a Variable's array (a load, or
        the first read of one the step made: `Variable(BUF)`, BUF refilled between calls) or a
        random draw. A size the step computed from numbers of its own with xp
        (`xp.cumsum(xp.asarray([2]))`) does not, nor an array from outside (the same at every
        replay, as a constant of the tape is)."""
        found = _traced_in(value, [])
        if not found:
            return False
        self._scan()
        arguments = {slot for _, slot, _ in self.arguments}
        for traced in found:
            if traced.recorder is not self:  # kept from an earlier call: a constant
                continue
            if traced.slot in arguments or traced.slot not in self.writers:
                return True
            for line in self._sources(self.writers[traced.slot]):
                kind = line.kind
                if (kind == "load" or kind == "load_grad"
                        or kind == "constant" and line.out in self.made_slots
                        or (kind == "call" or kind == "method")
                        and _name(kind, line.target) in _DRAWS
                        or any(slot in arguments for slot in line.reads)):
                    return True
        return False

    def _sources(self, line):
        """`line` and every line whose result it may read, for from_inputs: for each slot read,
        the line that made it, the last that wrote it and every line that wrote into its memory
        in place, through any view (`view = buf[0:1]; view[...] = n` names the view's slot, not
        buf's, and a write into buf names buf as a line that made it no longer). A write after
        the read counts as well: too many lines only make a fallback more likely."""
        makers, writers, roots, in_place = self.makers, self.writers, self.roots, self.in_place
        found, todo, seen = [], [line], set()
        while todo:
            line = todo.pop()
            if id(line) in seen:
                continue
            seen.add(id(line))
            found.append(line)
            for slot in line.reads:
                for source in (makers.get(slot), writers.get(slot)):
                    if source is not None:
                        todo.append(source)
                todo.extend(in_place.get(roots.get(slot), ()))
        return found

    def give_up(self, reason):
        """The step cannot be replayed: keep the first reason and where it arose (the step's
        return statement, for a reason found in its result)."""
        if self.fallback is None:
            where = None if self.returning is None else _returned_at(self.returning)
            self.fallback = (reason, where or _user_frame())

    def template(self, value):
        """`value` as a line argument: Ref for a Traced or a known non-array result, containers
        element by element, anything else as the constant it is."""
        if isinstance(value, Traced):
            if value.recorder is not self:  # made outside this recording (kept): a constant
                return value.value
            return value.ref
        kind = value.__class__
        if kind is tuple or kind is list:
            items = [self.template(v) for v in value]
            return items if kind is list else tuple(items)
        if kind is dict:
            return {k: self.template(v) for k, v in value.items()}
        entry = self.objects.get(id(value))
        if entry is not None and entry[0] is value:
            return Ref(entry[1])
        return value

    def wrap(self, backend, result, kind, target, args, kwargs, reads=None, real=(), name=None):
        """Record `result = target(args)` as one line and give back what the step sees: Traced
        arrays, a tuple of them, or the object itself (known by identity). `reads`: the slots
        args and kwargs refer to, where the caller has them; `real`: the arrays it was called
        with, where one may come back as the result; `name`: _name(kind, target), where the
        caller has it."""
        if _error_handling() is not self.error_handling:
            self.give_up(ERROR_HANDLING)
        inner = backend.inner
        array = result.__class__ is inner.array_type
        scalar = not array and result.__class__ in inner.scalar_types
        if array or scalar or inner.owns(result):  # _is_array, in line (the common case first)
            out = self.slots
            self.slots = out + 1
            line = Line(kind, target, args, kwargs, out) if reads is None else _line(
                kind, target, args, kwargs, out, reads)
            self.lines.append(line)  # self.append, in line
            if array:
                # memory of its own now is memory of its own at every replay only where the
                # call always makes new memory: ravel, reshape or asarray copy a non-contiguous
                # input but hand back a view of a contiguous one (another call's argument, a
                # parameter given another layout since), and a line writing into that (out=)
                # would write into the caller's array. One given no array makes a new one
                new_memory = kind == "binary" or kind == "unary" or _makes_new_memory(
                    kind, target, kwargs, name) or not _takes_an_array(inner, real, kwargs)
                nbytes = getattr(result, "nbytes", REUSE_BYTES)
                if new_memory and nbytes < REUSE_BYTES and inner.owns_memory(result):
                    # too small to lend its memory, and its own (a view is never fresh): a
                    # number of its own is all the buffer pass needs; no alias lookup (small
                    # arrays are never entered in self.arrays). It is entered in self.memories
                    # all the same: a view of it (`buf[0:1]`) must get its number, or a write
                    # through the view would not count as a write into it (from_inputs, guard)
                    memory = self.memory_count = self.memory_count + 1
                    try:
                        self.memories[id(result)] = (weakref.ref(result), memory)
                    except TypeError:  # no weak references: its views get numbers of their own
                        pass
                    line.array = _fresh_facts(result, nbytes, memory, inner.xp)
                else:
                    line.array = self._facts(inner, result, new_memory, real)
            elif scalar:
                # a NumPy scalar (a reduction's) has one layout: a line reading it may still
                # write into another input's memory (tape._input_layouts)
                self.layouts[out] = ()
            # backend.traced(result, out, self), in line: one per traced op
            traced = _bare(backend._scalar_type if scalar else backend.array_type)
            traced.value = result
            traced.slot = out
            traced.recorder = self
            traced.ref = ref = _bare(Ref)  # Ref(out) without the call of __init__: one per op
            ref.slot = out
            return traced
        if result.__class__ in (bool, int, float, complex):
            self.give_up(f"{_describe_target(target)} gave a Python {type(result).__name__} "
                         "computed from array values")
            return result
        out = self.new_slot()
        self.append(kind, target, args, kwargs, out)
        if result.__class__ in (tuple, list) and result and all(
                _is_array(inner, r) for r in result):
            items = []
            for i, r in enumerate(result):
                slot = self.new_slot()
                self.append("binary", operator.getitem, (Ref(out), i), None, slot)
                self.layouts[slot] = getattr(r, "strides", None)
                items.append(backend.traced(r, slot, self))
            return type(result)(items)
        self.objects[id(result)] = (result, out)
        return result

    def _facts(self, inner, result, new_memory, real):
        """The ArrayFacts of a line's array result that may lend its memory (large enough) or
        is not memory of its own (a view, a copy that may be one); None for an array type
        without weak references (never reused)."""
        # fresh: memory of its own that no other slot holds (asarray(x) may be x itself,
        # and x an argument, a parameter's data or a constant: never a line's to write)
        seen = self.arrays.get(id(result))
        alias = seen is not None and seen[1]() is result
        if alias:
            seen[0].fresh = False
        owns = inner.owns_memory(result)
        fresh = new_memory and not alias and owns and not any(a is result for a in real)
        try:
            # a copy that may be a view at a replay is counted as in its input's memory
            # there: no line lends that memory while the copy is still read
            memory = (self._memory(result) if new_memory or not owns else
                      self._first_input_memory(inner, real, result))
            facts = ArrayFacts(result, fresh, memory, inner.xp)
            self.arrays[id(result)] = (facts, weakref.ref(result))
        except TypeError:
            return None
        if facts.nbytes > self.largest:
            self.largest = facts.nbytes
        return facts

    def _first_input_memory(self, inner, real, result):
        """The memory number of the first array among `real` (a call's arguments), or one of
        `result`'s own where it had none."""
        for a in real or ():
            if a.__class__ is inner.array_type:
                return self._memory(a)
        return self._memory(result)

    def _memory(self, array):
        """A number for the memory `array` is in (its base's, for a view). Not an id: a dead
        array's id is soon another's, and the number must tell them apart."""
        while getattr(array, "base", None) is not None:
            array = array.base
        known = self.memories.get(id(array))
        if known is None or known[0]() is not array:
            self.memory_count += 1
            known = self.memories[id(array)] = (weakref.ref(array), self.memory_count)
        return known[1]

    def _note_memory(self, slot, array, variable=False):
        """Note the memory number of `array`, which no line makes (an argument's, a load's),
        for the guards (Recorder._overwritten); a `variable` argument's as held from the start.
        Its dtype too, for fusion (fuse.py), and its layout (Recorder.layouts)."""
        self.dtypes[slot] = getattr(array, "dtype", None)
        self.layouts[slot] = getattr(array, "strides", None)
        try:
            self.roots[slot] = self._memory(array)
        except TypeError:  # a scalar, or an array without weak references: never compared
            return
        if variable:
            self.held[self.roots[slot]] = -1

    # ------------------------------------------------------------ Variables from outside
    def adopt(self, v):
        """v's data as a Traced: loaded from v (or from the Variable whose grad v is) when the
        tape is replayed; the array itself, a constant of the tape, where the step made v and
        reads it for the first time. v keeps the Traced until `release` puts its real array
        back."""
        data = v._data
        if data is None or isinstance(data, Traced):
            return data
        entry = self.adopted.get(id(v))
        if entry is not None and entry.variable is v:  # given a raw array since: a constant
            self.give_up("the step set a Variable's data to an array made outside gradcore's "
                         "ops, which a replay would not make again (make it with x.xp, e.g. "
                         "xp.zeros_like, or set it outside the step)")
            backend = trace_backend(v._backend)
            slot = self.new_slot()
            self.append("constant", data, out=slot)
            self.layouts[slot] = getattr(data, "strides", None)
        else:
            owner = self.grad_owners.get(id(v))
            if owner is not None and owner._grad is not v:
                owner = None
            stored = self.grads_stored.get(id(v)) if owner is None else None
            if stored is not None and stored[0] is v:
                # a grad the step made, which a line stored into a Variable whose grad it is no
                # more (cleared since, or replaced by an optimizer's hook): at a replay that
                # line stores a new Variable, so the tape reads the array it stored, in its
                # slot, not this Variable
                if data is stored[1].value:
                    v._data, v._backend = stored[1], stored[1].backend
                    return stored[1]
                self.give_up("the step read a grad whose data was set (in an optimizer's step or "
                             "hook) after its Variable's grad was cleared or replaced, which a "
                             "replay cannot find: read it before the optimizer step")
            backend = trace_backend(v._backend)
            slot = self.new_slot()
            first_made = (owner is None and self.made_here.get(id(v)) is v
                          and id(v) not in self.made_read)
            # held from the start, as the loads' memory from their time: an optimizer step
            # (an opaque line) may write it
            self._note_memory(slot, data, variable=first_made)
            if owner is None:
                if first_made:
                    # eagerly a new Variable over this array at each call: a replay reads the
                    # array, not what the last replay left in this Variable (v.data = v.data * 2)
                    self.made_read.add(id(v))
                    self.made_slots.add(slot)
                    self.append("constant", data, out=slot)
                else:  # from outside, or made and released since (around an optimizer step)
                    self.append("load", self.site(v), out=slot)
                if id(v) in self.made_here:  # an array of the step's own, new at each call
                    self.note_own(data)
            else:
                self.append("load_grad", self.site(owner), out=slot)
                # an argument's grad is in the key; one an optimizer's hook made in the step
                # need not be there before it
                if id(owner) not in self.argument_sites and self.grads_made.get(id(v)) is not v:
                    self.grads_read.append(owner)
            self.adopted[id(v)] = _Adopted(v, data, v._backend, v._grad,
                                           self.argument_sites.get(id(v)), owner)
            self.touched.append(v)
            _note_adopted(v)
            grad = v._grad  # the grad Variable may be another object when the tape replays
            if grad is not None and not isinstance(grad._data, Traced):
                self.grad_owners[id(grad)] = v
                self.grads_found[id(grad)] = grad
        traced = backend.traced(data, slot, self)
        v._data, v._backend = traced, backend
        return traced

    def argument(self, index, value):
        """The step's argument `index` (a Variable or an array) as the step will see it."""
        slot = self.new_slot()
        backend = backends.backend_of(value)
        self.arguments.append((index, slot, backend is None))  # (.., .., a Variable)
        self._note_memory(slot, value if backend is not None else value._data, backend is None)
        if backend is not None:
            return trace_backend(backend).traced(value, slot, self)
        self.adopted[id(value)] = _Adopted(value, value._data, value._backend, value._grad, index)
        self.argument_sites[id(value)] = index
        grad = value._grad  # a replay adds to the grad the argument has then, not to this one
        if grad is not None and not isinstance(grad._data, Traced):
            self.grad_owners[id(grad)] = value
            self.grads_found[id(grad)] = grad
        value._data = trace_backend(value._backend).traced(value._data, slot, self)
        value._backend = value._data.backend
        return value

    def site(self, v):
        """Where a replay finds the Variable v: its argument index if v is an argument (a replay
        is called with others), else v itself."""
        index = self.argument_sites.get(id(v))
        return v if index is None else index

    # ------------------------------------------------------------ what Variable and Function call
    def is_active(self):
        """True in the recording thread, outside an opaque call."""
        return getattr(_active, "recorder", None) is self

    def copied(self, v):
        """The Variable v is being copied (copy.deepcopy, pickle) in the recording thread: a
        host copy, which a replay cannot make again."""
        if self.is_active():
            self.give_up(f"a Variable ({v.name or type(v).__name__}) was copied by copy or "
                         "pickle: the copy's array is made where the tape cannot see it")

    def read(self, v):
        """`v.data` while recording: its traced array (a 0-d array, not a scalar)."""
        if not self.is_active():
            self.wait_for_release((v,))
            return v._data
        data = self.adopt(v)
        if data is not None and data.value.__class__ in data.backend.inner.scalar_types:
            data = v._data = data.backend.ensure_array(data)
        return data

    def given_grad(self, value):
        """`value`, which the step sets as a Variable's grad. One holding an array made outside
        gradcore's ops (a hand-made gradient) would be the same array at every replay: the step
        runs eagerly from the next call on; this run takes it as a constant."""
        if value is None or not self.is_active():
            return value
        data = value._data if isinstance(value, _variable.Variable) else value
        backend = backends.backend_of(data)
        if data is None or isinstance(data, Traced) or backend is None:
            return value
        self.give_up("the step set a grad to an array made outside gradcore's ops, which a replay "
                     "would not make again (compute it with gradcore or x.xp)")
        return self._constant_variable(data, trace_backend(backend))

    def constant_for(self, v, y):
        """The Variable v (a backward seed the step made from an array of its own, as
        numpy.ones) with its array as a constant of the tape, where y is traced: else v."""
        data = v._data
        if (not self.is_active() or isinstance(data, Traced) or not isinstance(y._data, Traced)
                or backends.backend_of(data) is not y._data.backend.inner):
            return v
        return self._constant_variable(data, y._data.backend)

    def _constant_variable(self, data, backend):
        """A constant Variable of `data`, an array of the step's own, traced by the TraceBackend
        `backend` as a constant line of the tape."""
        slot = self.new_slot()
        self.append("constant", data, out=slot)
        self.layouts[slot] = getattr(data, "strides", None)
        return _variable.Variable(backend.traced(data, slot, self), requires_grad=False)

    def not_replayed(self, what):
        """`what` (a learning-rate schedule's step) ran in the step: Python state only the
        recording would change."""
        if self.is_active():
            self.give_up(f"{what} changes Python state a replay would not change again: call it "
                         "outside the compiled step")

    def note_own(self, array):
        """`array`, made by the step's own code (not an op the tape replays) and wrapped in a
        Variable there: a replay reads the same array at every call, so a write into it would
        add up from call to call where eager code starts afresh."""
        try:
            self.own_memories.add(self._memory(array))
        except TypeError:  # a scalar: immutable
            pass

    def writes_into(self, traced):
        """A line is about to write into the traced array `traced` in place."""
        if traced.recorder is not self:
            self.give_up("the step wrote in place into an array from outside this recording "
                         "(kept from an earlier call), which a replay would not write into")
            return
        if self._in_own_memory(traced):
            self.give_up("the step wrote in place into an array it made outside gradcore's ops "
                         "and wrapped in a Variable: a replay would write into the same array at "
                         "every call (make it with x.xp, e.g. xp.zeros_like)")

    def hands_out(self, traced):
        """`traced` is a result of the step: the step runs eagerly if it is in the memory of an
        array the step made and wrapped in a Variable (its .data, a view of it), which a replay
        would hand out again, the tape reading it, at every call."""
        if self._in_own_memory(traced):
            self.give_up("the step returned memory the tape reads at every call: an array it "
                         "made outside gradcore's ops and wrapped in a Variable or gave to an op "
                         "(the Variable's .data, a view of it), which eagerly is new at each "
                         "call; return a copy (F.copy(v))")

    def _in_own_memory(self, traced):
        """Whether `traced` is in the memory of an array the step made outside gradcore's ops
        and wrapped in a Variable (own_memories); False where that cannot be told."""
        if not self.own_memories:
            return False
        try:
            return self._memory(traced.value) in self.own_memories
        except TypeError:
            return False

    def made(self, v):
        """The step made the Variable v (Variable(...) in its code)."""
        if self.is_active():
            self.made_here[id(v)] = v  # held: its id stays its own while recording

    def adopt_inputs(self, inputs):
        """A Function's inputs: the Variables among them traced (Function._call calls this)."""
        if self.is_active():
            for x in inputs:
                if isinstance(x, _variable.Variable) and x._data is not None and not isinstance(
                        x._data, Traced):
                    self.adopt(x)
        else:
            self.wait_for_release(inputs)

    def wait_for_release(self, values):
        """A thread is about to use the Variables among `values`: if it is not the recording
        one, and one of them holds this recording's traced array or may come to (a Parameter,
        or a Variable a recording adopted before), wait until the recording ends, so that
        thread computes on the real arrays (RuntimeError after WAIT_SECONDS, when the step
        recording here may be waiting for that thread). Another thread's own Variables (a data
        loader's) never wait."""
        if threading.get_ident() == self.thread:
            return  # the recording thread, in an opaque call (an optimizer step)
        for v in values:
            if not isinstance(v, _variable.Variable):
                continue
            data = v._data
            before = _adopted_before.get(id(v))
            if (isinstance(data, Traced) and data.recorder is self
                    or before is not None and before() is v or v.__class__ is _variable.Parameter):
                if not self.finished.wait(WAIT_SECONDS):
                    raise RuntimeError(
                        f"gradcore.compile: this thread waited {WAIT_SECONDS} s for a Variable "
                        "that a compiled step recording in another thread is using (it holds a "
                        "traced array until that recording ends); that step may be waiting for "
                        "this thread. Call each compiled step once per signature before other "
                        "threads use its model, or use the model from one thread")
                return

    def reading_grad(self, v):
        """v.grad is read: a replay must load it through v (its grad is a new Variable after
        every step), not from the Variable it is now."""
        if not self.is_active():
            self.wait_for_release((v,))
            return
        if v._grad is None or isinstance(v._data, Traced) and id(v) not in self.adopted:
            return  # no grad, or a Variable made in the step
        self.writing(v)
        grad = v._grad
        if not isinstance(grad._data, Traced):
            self.grad_owners.setdefault(id(grad), v)
            self.grads_found[id(grad)] = grad

    def made_module(self, module):
        """Whether `module` was made in the recording thread while it recorded."""
        made = self.modules_made.get(id(module))
        return made is not None and made() is module

    def _own_state(self, module, name):
        """Whether `module.name` is the step's own state: a module it made holding none, an
        argument or a Variable it made. Not one from before the step (an RNN's h that a copy of
        the RNN holds, however it was copied), which a replay would keep reading as it was."""
        if not self.made_module(module):
            return False
        value = module.__dict__.get(name)
        if value is None or id(value) in self.argument_sites:  # an argument: each call's own
            return True
        data, entry = getattr(value, "_data", None), self.adopted.get(id(value))
        return (isinstance(data, Traced) and data.recorder is self
                and (entry is None or entry.variable is not value))  # not one from outside

    def module_state(self, module, name, reads_noted=False):
        """The step is about to set `module.name` to a Variable, or to clear one there (an
        RNN's hidden state): Python state a replay does not set. Fine where the step leaves the
        value it found (reset_state() at its start and end: check_module_states). `reads_noted`:
        a carried state whose reads the step tells (module_state_read)."""
        if (self.is_active() and (module, name) not in self.states_before
                and not self._own_state(module, name)):
            self.module_states.append((module, name))
            self.states_before[module, name] = (module.__dict__.get(name), _user_frame())
            if reads_noted:
                self.reads_noted.add((module, name))

    def python_state(self, module, name):
        """The step is about to set `module.name` to a Python value that is no Variable (a
        counter: self.t += 1). A replay checks the value it found, and sets the one it left
        where that is a number or string (check_module_states)."""
        if (self.is_active() and (module, name) not in self.python_states
                and not self.made_module(module)):
            self.python_states[module, name] = module.__dict__.get(name, _UNSET)

    def module_called(self, module):
        """`module` runs in the step: its Python values, and those of its sub-modules (which it
        may use through their methods), are compared as those of a module the step reached
        (values_found), where no name led to it before it ran (a cache's or a factory's
        module), as found now (those the step set before are checked anyway)."""
        if self.is_active() and id(module) not in self.modules_reached:
            for sub in module.modules():  # a made one's too: Sequential(model.l1, model.l2)
                if id(sub) not in self.modules_reached and not self.made_module(sub):
                    self.modules_reached[id(sub)] = sub
                    for name, value in sub.__dict__.items():
                        if (_variable.is_python_value(value)
                                and (sub, name) not in self.python_states):
                            self.values_found[id(sub), name] = value

    def module_state_read(self, module, name, value):
        """The step read `module.name`, a carried state (an RNN's h: nn.module._Carried), found
        as `value`. Read before the step set it, the tape depends on it: a replay checks that it
        is still the same object (Tape.states_as_read), as eager code may set it between
        calls (an RNN used for a sample)."""
        if (self.is_active() and (module, name) not in self.states_before
                and (module, name) not in self.states_read and not self._own_state(module, name)):
            self.states_read[module, name] = value

    def check_module_states(self):
        """The step has ended: a Variable it left on a module, where another was before, is
        state the next call would not see after a replay; one it cleared (reset_state() at its
        end), having set it before reading it, a replay clears too."""
        for (module, name), (before, where) in self.states_before.items():
            after = module.__dict__.get(name)
            if (after is None and (module, name) not in self.states_read
                    and (module, name) in self.reads_noted):
                # found whatever eager code left there (that the step did not read): None
                # after eagerly, so after a replay
                self.states_left.append((module, name))
            elif after is before:
                # the step ends with the object it found, which a replay leaves there only if
                # it finds it too
                self.states_read.setdefault((module, name), before)
            elif after is None and before is not None:
                # it read and cleared a state eager code left (a sample's): a tape of this call
                # would serve only calls finding that state; the next call records again
                self.record_again = True
                self.again_because = (
                    f"the step read {type(module).__name__}.{name}, which eager code left set "
                    "before each of its last three calls, and cleared it: call reset_state() at "
                    "the start of the step too, or after the eager code")
            elif self.fallback is None:
                self.fallback = (
                    f"the step set {type(module).__name__}.{name}, state a replay would not "
                    "carry to the next call (an RNN's or LSTM's hidden state: call "
                    "reset_state() at the start and the end of the step, and feed it the "
                    "whole sequence)", where)
        changed = False
        for (module, name), before in self.python_states.items():
            after = module.__dict__.get(name, _UNSET)
            if after is before or _same_value(after, before):
                # set as it was (a shape kept): a replay is right where it still is, which it
                # checks, as a call that fell back or eager code may have set another
                self.values_read.append((module, name, before))
            elif _variable.is_python_value(after) and (before is _UNSET or
                                                       _variable.is_python_value(before)):
                # another number or string (a shape: `self.n = x.shape[0]`): a replay finding
                # `before` sets it, as this call did; the tapes that took the old value see the
                # change (value_changed). One set from what it was (a counter) is found at
                # another value by each next call, which records: eager after three (Compiled)
                self.values_read.append((module, name, before))
                self.values_set.append((module, name, after))
                _variable.value_changed(module, name)
            else:
                # an object (a list made anew, a function) or an attribute deleted: a replay
                # would leave the recorded one. Recorded again (a flag a first call sets);
                # changed at each call, the step runs eagerly after three, saying so
                changed = self.record_again = True
                self.again_because = (
                    f"the step set {type(module).__name__}.{name} (from {before!r} to {after!r} "
                    "at the last), Python state a replay would not set, at each of its last "
                    "three calls: update it outside the compiled step, and pass in what it "
                    "decides (an array argument replays for any values; a number is part of "
                    "the key)")
        if changed:  # tapes that read it without setting it took it as it was: keys change
            _variable.structure_changes[0] += 1
        kept = self._module_kept()
        if kept is not None:
            # a module made in the step outlived it (a cache's: `if not cache: cache.append(
            # Scale(3.0))`): the next call finds it made, and may use it as it is then, which
            # this tape did not compare; that call records as for any module, and so do other
            # steps' (eagerly, a module registering its layers changes every key)
            _variable.structure_changes[0] += 1
            self.record_again = True
            self.again_because = (
                f"the step made a {type(kept).__name__} that outlived the call (kept in an "
                "object or a container, or returned) at each of its last three calls: make it "
                "outside the compiled step, or let it go with the call")

    def _module_kept(self):
        """A module made in the step that is still alive, or None. The recording runs with the
        collector off: a module in a reference cycle (a forward hook of its own method) is
        looked for again after a collection of the youngest objects, where the recording's
        are."""
        if not self.modules_alive():
            return None
        gc.collect(0)
        return next(iter(self.modules_alive()), None)

    def modules_alive(self):
        """The modules made in the step that are alive now."""
        return [module for module in (made() for made in self.modules_made.values())
                if module is not None]

    def writing(self, v, data=False, clearing=False):
        """v's grad (or, with `data`, its data) is about to be set: remember how v was. A grad
        cleared (`clearing`) is cleared at this point of the replay too, as eagerly: the old
        gradients are not held through the step (a step's worth of memory on a training step)."""
        if not self.is_active():
            self.wait_for_release((v,))
            return
        entry = self.adopted.get(id(v))
        if entry is None or entry.variable is not v:
            if isinstance(v._data, Traced):
                if v._data.recorder is not self:
                    self.give_up("the step set the data or grad of a Variable an earlier "
                                 "recording made (kept from an earlier call), which a replay "
                                 "would not set")
                return  # made in the step (adopted ones have an entry): nothing outside changes
            if v._data is None:
                self.adopted[id(v)] = _Adopted(v, v._data, v._backend, v._grad)
                self.touched.append(v)
            else:
                self.adopt(v)
        entry = self.adopted[id(v)]
        if data:
            if entry.data is None:  # a lazily created weight (its grad cleared first, maybe):
                self.record_again = True  # the next call differs
            entry.data_sets += 1
        if clearing:
            # cleared at replay even where the grad was absent now: another tape of the step,
            # or a backward outside it, may have set one by then
            self.grads_cleared.add(id(v))
            self.append("store_grad", self.site(v), (None,))

    def release(self, last=False):
        """Give every adopted Variable its real arrays back, and write the lines that make a
        replay leave them as this run did (data rebound, grad set or cleared). `last`: the step
        has ended, so no line reads what is stored now into a Variable the step made (a new one
        at each call eagerly, which the caller does not reach: Compiled checks): left out. Before
        an optimizer step, such a Variable's data is stored even where unchanged: the lines after
        it load it from this Variable, which the last replay left as it ended."""
        # what each holds now, before any is given its real array back: a Variable that is
        # another's grad (p.grad = g) hands on its traced value, whichever comes first below
        traced = {id(e.variable): e.variable._data for e in self.adopted.values()
                  if isinstance(e.variable._data, Traced)}
        for entry in self.adopted.values():
            v = entry.variable
            site = self.site(v)
            data = traced.get(id(v), v._data)
            made = self.made_here.get(id(v)) is v
            if isinstance(data, Traced):
                if made and entry.grad_of is None:
                    stored = not last  # before an optimizer step only, and then always
                else:
                    stored = data.value is not entry.data or entry.data_sets
                if stored:
                    # the data setter ran (also `v.data -= ...`, which hands back the same
                    # array): the replay rebinds and counts the writes as the setter did; into
                    # the grad of its owner where v is a grad (the owner's is another at replay)
                    store = {"writes": entry.data_sets} if entry.data_sets > 1 else {}
                    if entry.grad_of is not None:
                        site, store["in_grad"] = self.site(entry.grad_of), True
                    self.append("store", site, (self.template(data),), store or None)
                v._data, v._backend = data.value, data.backend.inner
            if (entry.argument is None and not made and entry.data is not None
                    and v._data is not entry.data and v._data is not None
                    and (v._backend is not entry.backend or v._data.shape != entry.data.shape
                         or v._data.dtype != entry.data.dtype)):
                # a tape of this call's shapes would not fit the next (an argument's shape and
                # dtype are in the next call's key; one the step made starts from its array)
                self.record_again = True
            log = getattr(v, "_writes", None)
            if log is not None and entry.grad_of is None:  # for results that view v (_shape)
                self.logs[id(log)] = (log, self.site(v))
            grad = v._grad
            if grad is not entry.grad:
                if grad is not None:  # made in the step (backward's): a replay makes it again
                    self.grads_made[id(grad)] = grad
                value = (None if grad is None else self.template(traced[id(grad)])
                         if id(grad) in traced else self._real(grad))
                if not (last and made):
                    self.append("store_grad", self.site(v), (value,))
                if (entry.grad is None and id(v) not in self.grads_cleared
                        and entry.argument is None and id(v) not in self.made_here):
                    # set where none was found (backward: eagerly it adds to one it finds),
                    # so the tape replays while the grad is absent again (an argument's
                    # absence is part of the key)
                    self.grads_absent.append(v)
        self.adopted = {}
        self.grad_owners = {}

    def restore(self):
        """Give each Variable the step touched (and its grad, and a Variable it kept on a
        module) its real arrays back, writing no line: for a recording that its last release
        did not end (a Ctrl-C cut it short), of which no tape is made. Done again as often as
        need be."""
        for entry in list(self.adopted.values()):
            v = entry.variable
            for w in (v, v._grad):
                if w is not None and isinstance(w._data, Traced):
                    w._data, w._backend = w._data.value, w._data.backend.inner
        for module, name in self.module_states:
            v = getattr(module, name, None)
            if isinstance(v, _variable.Variable) and isinstance(v._data, Traced):
                v._data, v._backend = v._data.value, v._data.backend.inner

    def _real(self, v):
        """A Variable made in the step, a grad that a line stores: its real array back, its
        slot as a line argument."""
        data = v._data
        if isinstance(data, Traced):
            v._data, v._backend = data.value, data.backend.inner
            if data.recorder is self:
                self.grads_stored[id(v)] = (v, data)
            return self.template(data)
        return data

    def opaque(self, method, args, optimizer=None):
        """Run `method(*args)` eagerly now and at every replay (an optimizer step: Python state
        such as the learning rate or Adam's step count is read afresh each time). `optimizer`:
        the optimizer whose step it is, kept on the line for compile(check=...), which must save
        and put back its state around a replay however the step was bound."""
        self.release()
        self.append("opaque", method, args, None if optimizer is None else {
            "optimizer": optimizer})
        grads = {id(v): (v, v._grad) for v in self.touched}.values()  # (adopted: released)
        _active.recorder = None
        try:
            return method(*args)
        finally:
            _active.recorder = self
            for v, grad in grads:  # replaced in the call (WeightDecay's): made at each replay
                if v._grad is not None and v._grad is not grad:
                    self.grads_made[id(v._grad)] = v._grad


class _Adopted:
    """A Variable the step did not create, as it was before the step touched it."""

    __slots__ = ("variable", "data", "backend", "grad", "argument", "grad_of", "data_sets")

    def __init__(self, variable, data, backend, grad, argument=None, grad_of=None):
        self.variable, self.data, self.backend, self.grad = variable, data, backend, grad
        self.argument = argument  # the step's argument index, or None
        self.grad_of = grad_of    # the Variable whose grad this one is, where loaded as that
        self.data_sets = 0        # times the step ran its data setter


# Calls that change an argument in place or draw random numbers: kept even if no result needs them
_DRAWS = frozenset(("random_normal", "random_uniform"))
# Backend methods that change their first argument in place (and return it)
_WRITES_INTO_FIRST = frozenset(("scatter_add", "add_at", "assign"))
_SIDE_EFFECT_CALLS = _WRITES_INTO_FIRST | _DRAWS
# Attributes that hand out an array's memory as something other than an array
_MEMORY_ATTRIBUTES = frozenset(("flat", "ctypes", "data"))
# Methods and functions that change their first argument in place (and return None)
_IN_PLACE = frozenset(("sort", "partition", "fill", "put", "resize", "setfield", "setflags",
                       "itemset", "copyto", "place", "putmask", "fill_diagonal",
                       "put_along_axis"))


# Functions and methods whose array result is new memory whatever their inputs' layout (a
# ufunc's too, without out=). Not reshape, ravel, asarray, ascontiguousarray, astype(copy=False),
# einsum or to_device: each hands back a view of, or the same array as, an input of one layout
# and a copy of another
_NEW_MEMORY = frozenset((
    "sum", "prod", "mean", "std", "var", "max", "min", "amax", "amin", "argmax", "argmin",
    "cumsum", "cumprod", "matmul", "dot", "vdot", "inner", "outer", "tensordot", "where",
    "concatenate", "concat", "stack", "hstack", "vstack", "zeros", "zeros_like", "ones",
    "ones_like", "empty", "empty_like", "full", "full_like", "copy", "clip", "take",
    "take_along_axis", "sort", "argsort", "pad", "tile", "repeat", "flatten", "astype", "round",
    "around", "diff", "cross", "kron", "arange", "linspace", "eye", "tril", "triu",
    "random_normal", "random_uniform"))


def _takes_an_array(inner, real, kwargs):
    """True if a call's arguments (`real`, `kwargs` as a line's) hold an array of `inner` that
    its result may be a view of."""
    return any(a.__class__ is inner.array_type for a in real) or bool(
        kwargs and any(v.__class__ is Ref for v in kwargs.values()))


def _makes_new_memory(kind, target, kwargs, name=None):
    """True if a "call" or "method" line's array result is always memory of its own (`name`:
    _name(kind, target), where the caller has it)."""
    if kwargs and ("out" in kwargs or kwargs.get("copy") is False):
        return False
    if kind == "call" and type(target).__name__ == "ufunc":
        return True
    return (_name(kind, target) if name is None else name) in _NEW_MEMORY


def _name(kind, target):
    """The name of what a "call" or "method" line runs (a method line's target is its name)."""
    return target if kind == "method" else getattr(target, "__name__", "")


_EFFECT_KINDS = frozenset(("in_place", "setitem", "opaque", "store", "store_grad", "guard"))


def has_side_effect(line):
    """True for a line a replay must run although no result needs it."""
    kind = line.kind
    if kind in _EFFECT_KINDS:
        return True
    if kind != "call" and kind != "method":
        return False
    target = line.target
    name = _name(kind, target)
    return (name in _SIDE_EFFECT_CALLS or name in _IN_PLACE
            or bool(line.kwargs and "out" in line.kwargs)  # writes into out=
            or len(line.args) > getattr(target, "nin", len(line.args)))  # a ufunc's out


def written(line):
    """The slots `line` writes into in place: the target of `a += b` or of a setitem, the first
    argument of a call that changes it (sort, copyto, scatter_add, ...), and a ufunc's out, given
    by keyword or by position. (An operator, binary or unary, writes into no operand.)"""
    kind, args = line.kind, line.args
    if kind == "in_place" or kind == "setitem":
        return slots_in(args[:1], [])
    if kind != "call" and kind != "method":
        return []
    target = line.target
    name = _name(kind, target)
    found = slots_in(args[:1], []) if name in _IN_PLACE or name in _WRITES_INTO_FIRST else []
    if line.kwargs and "out" in line.kwargs:
        slots_in(line.kwargs["out"], found)
    nin = getattr(target, "nin", None)  # a ufunc: arguments past its inputs are outputs
    if nin is not None:
        slots_in(args[nin:], found)
    return found


def _is_array(inner, value):
    """True if `value` is an array of the backend `inner` or one of its scalars (NumPy's)."""
    return inner.owns(value) or value.__class__ in inner.scalar_types


def _describe_target(target):
    return getattr(target, "__name__", None) or repr(target)


def _traced_in(value, found):
    """Append to `found` the Traced arrays in `value` (containers looked into)."""
    kind = value.__class__
    if kind is tuple or kind is list:
        for v in value:
            _traced_in(v, found)
    elif kind is dict:
        for v in value.values():
            _traced_in(v, found)
    elif isinstance(value, Traced):
        found.append(value)
    return found


def _has_traced(value):
    kind = value.__class__
    if kind is tuple or kind is list:
        return any(_has_traced(v) for v in value)
    if kind is dict:
        return any(_has_traced(v) for v in value.values())
    return isinstance(value, Traced)


def unwrap(value):
    """The real arrays in `value` (a Traced, or containers of them)."""
    if isinstance(value, Traced):
        return value.value
    kind = value.__class__
    if kind is tuple or kind is list:
        items = [unwrap(v) for v in value]
        return items if kind is list else tuple(items)
    if kind is dict:
        return {k: unwrap(v) for k, v in value.items()}
    return value


def _known(rec, args, kwargs):
    """True if an argument is traced or a recorded non-array result."""
    if _has_traced(args) or (kwargs and _has_traced(kwargs)):
        return True
    objects = rec.objects
    return any(id(a) in objects for a in args) if objects else False


def _masked_index(name, args, kwargs):
    """True if the Backend method `name` (in INDEX_ARGUMENTS) is given a boolean mask as its
    index."""
    position = INDEX_ARGUMENTS[name]
    return _is_mask(args[position] if len(args) > position else (kwargs or {}).get("index"))


def _destinations(kind, function, name, args, kwargs, result, traced, real):
    """The arguments a call wrote into in place: the first of copyto, putmask, x.fill() and the
    like (they return None), out= and a ufunc's out given by position, and an out given by
    position to another function (np.dot(a, b, out), x.sum(0, None, out)), which comes back as
    its result. `real`: the arrays the call was given, in the order of `args`."""
    writes_first = result is None and name in _IN_PLACE or name in _WRITES_INTO_FIRST
    found = list(args[:1]) if writes_first else []
    if kwargs and "out" in kwargs:
        out = kwargs["out"]
        found += out if out.__class__ is tuple else (out,)
    nin = getattr(function, "nin", None)  # a ufunc: arguments past its inputs are outputs
    if nin is not None:
        found += args[nin:]
    elif traced and result is not None:
        # An array of the caller's handed back beside a traced one was written into; a traced
        # one only by a call that otherwise makes new memory (asarray(x) hands x back as it is)
        for a, r in zip(args, real):
            if r is result and (a is r or _makes_new_memory(kind, function, kwargs)):
                found.append(a)
    return found


def _check_destinations(rec, kind, function, name, args, kwargs, result, traced, real):
    """Give up if a call wrote into an array that is not a traced array of this recording (a
    buffer of the user's, np.zeros made in the step): the tape holds it as a constant, so what
    reads it after the call (NumPy, the step's result) would read the recording's values at
    every replay. A traced one is checked as `a += b` is (Recorder.writes_into)."""
    if not args and result is None and name in _IN_PLACE:  # np.copyto(dst=a, src=b)
        rec.give_up(f"{name}() was given the array it writes into by keyword, where the tape "
                    "looks for it as the first argument (give it by position)")
        return
    for destination in _destinations(kind, function, name, args, kwargs, result, traced,
                                     real):
        if isinstance(destination, Traced):
            rec.writes_into(destination)
        elif destination is not None:
            rec.give_up(f"{name}() wrote into an array the tape does not hold (an array of "
                        "yours, or one made with NumPy in the step), which a replay would not "
                        "write into (write into an array made with x.xp, e.g. "
                        "x.xp.zeros_like(a), or return the value from the step)")
            return


def _sized_by_values(rec, name, args, kwargs):
    """True if a call of `name` (in SIZE_ARGUMENTS) is given a value computed from the step's
    inputs where it reads a size: its result's shape would come from the values."""
    positions, keywords = SIZE_ARGUMENTS[name]
    return rec.from_inputs(args[positions]) or bool(kwargs) and any(
        rec.from_inputs(kwargs[k]) for k in keywords if k in kwargs)


def _binned_by_values(rec, args, kwargs):
    """True if a histogram's bins (the second argument, or `bins=`) are a rule that reads the
    values ("auto") or a number computed from the inputs: bin edges given as an array are a
    shape of their own."""
    bins = args[1] if len(args) > 1 else (kwargs or {}).get("bins")
    items = bins if bins.__class__ in (tuple, list) else (bins,)
    return any(b.__class__ is str or isinstance(b, Traced) and not b.value.shape
               and rec.from_inputs(b) for b in items)


def _counted_to_fixed_length(rec, args, kwargs, result):
    """True if bincount's result has the same length at every replay: its labels are not
    computed from the inputs, or `minlength` (a number of the step's) gave this length, and a
    guard tests that the labels stay below it (a label at or above it would make the result
    longer; a negative one raises): another call runs eagerly, as a branch on them would."""
    labels = args[0] if args else (kwargs or {}).get("x")
    if not rec.from_inputs(labels):
        return True
    minlength = args[2] if len(args) > 2 else (kwargs or {}).get("minlength")
    if isinstance(minlength, Traced) or minlength.__class__ is bool:
        return False
    try:
        minlength = operator.index(minlength)
    except TypeError:  # None: no minlength
        return False
    if len(result) != minlength:  # labels past it now: the length is theirs
        return False
    bool(((labels >= 0) & (labels < minlength)).all())  # Traced.__bool__: the guard
    return True


def call(backend, function, args, kwargs, kind="call"):
    """Run `function` on the real arrays; while recording, also as a tape line. Results that are
    arrays come back Traced."""
    rec = getattr(_active, "recorder", None)  # recorder(), in line: once per traced op
    # The common case in one pass: flat arguments, Traced or constants, no keywords
    real, template, reads = [], [], []
    if not kwargs:
        for a in args:
            if isinstance(a, Traced):
                real.append(a.value)
                if a.recorder is rec:
                    template.append(a.ref)
                    reads.append(a.slot)
                else:  # made outside this recording (kept from another): a constant
                    template.append(a.value)
            elif a.__class__ in _NESTED:
                real = None
                break
            else:
                real.append(a)
                template.append(a)
    if real is None or kwargs:
        real = unwrap(args)
    if kind == "method":  # function is the method's name; args[0] the array
        receiver, *rest = real
        result = getattr(receiver, function)(*rest, **(unwrap(kwargs) if kwargs else {}))
    elif kwargs:
        result = function(*real, **unwrap(kwargs))
    else:
        result = function(*real)
    inner = backend.inner
    if rec is None:
        _check_not_in_use(args, kwargs)
        return backend.traced(result, None) if inner.owns(result) else result
    traced = bool(reads)
    if kwargs or len(template) != len(args) or rec.objects:  # nested, keywords, objects to know
        traced = _known(rec, args, kwargs)
        template = rec.template(args)
        reads = None  # Line finds them
    if not traced and not _is_array(inner, result):
        return result  # nothing traced in or out: a query (isdtype, finfo, result_type)
    name = None
    if kind != "binary" and kind != "unary":  # an operator's result is shaped by its operands
        name = function if kind == "method" else getattr(function, "__name__", "")  # _name
        ruled = name in _SHAPE_RULED  # one lookup for the names the rules below look for
        if ruled and name in INDEX_ARGUMENTS and _masked_index(name, args, kwargs):
            rec.give_up(MASKED)  # a Variable's v[mask]: GetItem's key becomes indices here
        # the function xp.nonzero(x) or the method x.nonzero(); where(c) alone is nonzero(c);
        # a size the step computed (repeat(x, counts), zeros(n)); bins chosen from the values
        elif ruled and (
                name in DATA_DEPENDENT_SHAPES or name == "where" and len(args) == 1 and not kwargs
                or name in SIZE_ARGUMENTS and _sized_by_values(rec, name, args, kwargs)
                or name in BINS and _binned_by_values(rec, args, kwargs)
                or name == "bincount" and not _counted_to_fixed_length(rec, args, kwargs,
                                                                       result)):
            rec.give_up(f"{name}'s result has a shape that depends on the values (compute "
                        "what sets it, indices or a size, outside the step and pass it as an "
                        "argument)")
        elif result is None and name not in _IN_PLACE:
            rec.give_up(f"{name}() returned None: what it did is unknown to the tape (it may "
                        "have changed an array in place, or written one somewhere)")
        if result is None or kwargs or len(args) > 1:  # else it has nothing to write into
            _check_destinations(rec, kind, function, name, args, kwargs, result, traced, real)
    return rec.wrap(backend, result, kind, function, tuple(template),
                    rec.template(kwargs) if kwargs else None, reads, real, name)


# ================================================================================ Traced
def _binary(op):
    def method(self, other):
        rec = getattr(_active, "recorder", None)
        if rec is not None and self.recorder is rec:
            # call() in line for the commonest operands, a Python number or another traced
            # array of this recording: no lists to build, nothing to ask of the operator
            # (callgrind: `x * 2` on a 16-vector ~5,000 instructions less of ~35,000)
            if other.__class__ in _NUMBERS:
                x = self.value
                return rec.wrap(self.backend, op(x, other), "binary", op,
                                (self.ref, other), None, [self.slot], (x, other))
            if isinstance(other, Traced) and other.recorder is rec:
                x0, x1 = self.value, other.value
                return rec.wrap(self.backend, op(x0, x1), "binary", op,
                                (self.ref, other.ref), None,
                                [self.slot, other.slot], (x0, x1))
        if isinstance(other, _variable.Variable):
            # x + v with x an argument's array: the Variable's own (reflected) operator, as in
            # eager code, which then takes this traced array as an input
            return NotImplemented
        return call(self.backend, op, (self, other), None, "binary")
    method.__name__ = f"__{op.__name__.strip('_')}__"
    return method


def _reflected(op):
    def method(self, other):
        rec = getattr(_active, "recorder", None)
        if other.__class__ in _NUMBERS and rec is not None and self.recorder is rec:
            x = self.value  # call() in line, as in _binary
            return rec.wrap(self.backend, op(other, x), "binary", op, (other, self.ref),
                            None, [self.slot], (other, x))
        if isinstance(other, _variable.Variable):
            return NotImplemented
        return call(self.backend, op, (other, self), None, "binary")
    method.__name__ = f"__r{op.__name__.strip('_')}__"
    return method


def _in_place(op):
    def method(self, other):
        rec = getattr(_active, "recorder", None)  # recorder(), in line
        if rec is not None:
            rec.writes_into(self)
            if _error_handling() is not rec.error_handling:
                rec.give_up(ERROR_HANDLING)
        if rec is not None and isinstance(other, Traced) and other.recorder is rec:
            # another traced array of this recording (a gradient added up): no unwrap, template
            # or Line.__init__ (callgrind: wide, 5.5 M instructions less for its 1,000)
            result = op(self.value, other.value)
            if self.recorder is rec:
                rec.lines.append(_line("in_place", op, (self.ref, other.ref), None,
                                       self.slot, [self.slot, other.slot]))
        else:
            result = op(self.value, unwrap(other))
            if rec is not None and self.recorder is rec:
                rec.append("in_place", op, (self.ref, rec.template(other)), None,
                           self.slot)
        self.value = result
        return self
    method.__name__ = f"__{op.__name__.strip('_')}__"
    return method


def _unary(op):
    def method(self):
        rec = getattr(_active, "recorder", None)
        if rec is not None and self.recorder is rec:
            x = self.value  # call() in line, as in _binary
            return rec.wrap(self.backend, op(x), "unary", op, (self.ref,), None,
                            [self.slot], (x,))
        return call(self.backend, op, (self,), None, "unary")
    return method


def _host_read(name):
    def method(self, *args, **kwargs):
        give_up(_read_on_host(name))
        return getattr(self.value, name)(*args, **kwargs)
    method.__name__ = name
    return method


# What to do instead of each host read (the rest: float(loss), .item(), print)
_INSTEAD_OF_READING = {
    "__index__": "compute an index or a size outside the step and pass it as an argument",
    "__array__": "NumPy made it an array of its own: call x.xp's function on it instead, or "
                 "return it from the step and use it after the call",
    "__copy__": "copy it with x.xp.asarray(a, copy=True)",
    "__deepcopy__": "copy it with x.xp.asarray(a, copy=True)",
}


def _read_on_host(name):
    instead = _INSTEAD_OF_READING.get(
        name, "return the value from the step and read it after the call")
    return (f"a traced array's value was read on the host ({name}), which a replay cannot do "
            f"({instead})")


class Traced:
    """An array inside a recorded step: the real array (`value`), its tape slot (`slot`) and the
    Recorder whose tape has that slot (`recorder`; None, and slot None, for one made while
    nothing recorded), and the Ref of that slot (`ref`), the line argument that reads it: made
    once with the array, not at each use (callgrind: wide, 5 M instructions less of a 355 M
    recording). One kept from another recording (in a dict, say) is no slot of this one's: a
    constant, its real array. Subclassed once per backend it wraps."""

    __slots__ = ("value", "slot", "recorder", "ref", "__weakref__")
    __array_priority__ = 1000
    backend = None  # the TraceBackend of the subclass

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """A NumPy ufunc given a traced array: `np.exp(x.data)`, `ndarray * x.data`. A plain
        call is a tape line like any other; one that writes into an array of the caller's
        (`total += loss.data`: out=) or reduces (`np.add.reduce`) is computed on the values and
        the step falls back to eager, which does the same."""
        if method == "__call__" and not any(
                not isinstance(o, Traced) for o in kwargs.get("out", ())):
            return call(self.backend, ufunc, inputs, kwargs)
        give_up(f"NumPy's {ufunc.__name__} wrote into an array the tape does not hold (out=), "
                "which a replay would not write into (return the value from the step and add "
                "it up after the call, or write into an array made with x.xp)"
                if method == "__call__" else
                f"NumPy's {ufunc.__name__}.{method} ran on a traced array (use gradcore's "
                "ops or x.xp's functions instead)")
        return getattr(ufunc, method)(*unwrap(inputs), **unwrap(kwargs))

    def __array_function__(self, function, kinds, args, kwargs):
        """A NumPy function given a traced array. One written in Python (np.mean, np.nonzero)
        runs as it does on an array, through the methods and ufuncs it calls on this one. One
        written in C (np.copyto, np.concatenate), which takes ndarrays only, is a tape line of
        its own, as xp's functions are, and so is one whose result's shape depends on the
        values (np.unique, np.histogram), which then falls back for that reason, and so is one
        named in _IN_PLACE (np.place would hand the traced array to C, np.fill_diagonal reach
        its .flat). One writing into an array the tape does not hold (out=, np.copyto's first
        argument) falls back (call)."""
        implementation = getattr(function, "_implementation", None)
        name = function.__name__
        if (isinstance(implementation, types.FunctionType) and name not in DATA_DEPENDENT_SHAPES
                and name not in BINS and name not in _IN_PLACE):
            return implementation(*args, **kwargs)
        return call(self.backend, function, args, kwargs)

    def __init__(self, value, slot, recorder=None):
        self.value = value
        self.slot = slot
        self.recorder = recorder
        self.ref = None if slot is None else Ref(slot)

    # the value's, read by a C getter (no Python frame: the walk reads shape and dtype per edge)
    shape = property(operator.attrgetter("value.shape"))
    dtype = property(operator.attrgetter("value.dtype"))
    ndim = property(operator.attrgetter("value.ndim"))
    size = property(operator.attrgetter("value.size"))
    device = property(operator.attrgetter("value.device"))
    T = property(lambda self: call(self.backend, operator.attrgetter("T"), (self,), None))
    mT = property(lambda self: call(self.backend, operator.attrgetter("mT"), (self,), None))

    def __len__(self):
        return len(self.value)

    def __iter__(self):
        return (self[i] for i in range(len(self.value)))

    def __getitem__(self, key):
        if _is_mask(key):
            give_up(MASKED)
        return call(self.backend, operator.getitem, (self, key), None, "binary")

    def __setitem__(self, key, value):
        rec = recorder()
        if rec is not None:
            rec.writes_into(self)
        operator.setitem(self.value, unwrap(key), unwrap(value))
        if rec is not None and self.recorder is rec:
            rec.append("setitem", operator.setitem,
                       (self.ref, rec.template(key), rec.template(value)))

    def __getattr__(self, name):  # methods and attributes the class does not spell out
        if name.startswith("__"):
            raise AttributeError(name)
        attribute = getattr(self.value, name)
        if callable(attribute):
            return lambda *args, **kwargs: call(self.backend, name, (self, *args), kwargs,
                                                "method")
        if self.backend.inner.owns(attribute):
            return call(self.backend, operator.attrgetter(name), (self,), None)
        if name in _MEMORY_ATTRIBUTES:  # reads and writes through it would bypass the tape
            give_up(f"a traced array's memory was reached through .{name}, past the tape (use "
                    "x.xp's functions instead, e.g. xp.reshape(x, -1) for .flat)")
        return attribute

    def __array_namespace__(self, api_version=None):
        return self.backend.xp

    for _op in BINARY:
        locals()[f"__{_op.__name__.strip('_')}__"] = _binary(_op)
        if _op not in (operator.lt, operator.le, operator.gt, operator.ge, operator.eq,
                       operator.ne):
            locals()[f"__r{_op.__name__.strip('_')}__"] = _reflected(_op)
    for _op in IN_PLACE:
        locals()[f"__{_op.__name__.strip('_')}__"] = _in_place(_op)
    __neg__, __pos__ = _unary(operator.neg), _unary(operator.pos)
    __invert__, __abs__ = _unary(operator.invert), _unary(operator.abs)
    def __bool__(self):
        value = bool(self.value)
        rec = recorder()
        if rec is not None:
            rec.guard(self, value)
        return value

    # copy.copy, copy.deepcopy and pickle copy the value on the host, where the tape cannot see
    # it (a model snapshot taken in the step would be a constant of every replay): the step
    # falls back, and the copy is the real array's
    for _name in ("__float__", "__int__", "__index__", "__complex__", "item",
                  "tolist", "__dlpack__", "__repr__", "__str__", "__format__",
                  "__copy__", "__deepcopy__", "__reduce_ex__"):
        locals()[_name] = _host_read(_name)
    del _op, _name

    def __array__(self, dtype=None, copy=None):
        # through numpy.asarray: a NumPy scalar's own __array__ takes no dtype or copy
        give_up(_read_on_host("__array__"))
        return numpy.asarray(self.value, dtype=dtype, copy=copy)

    __hash__ = object.__hash__


def _is_mask(key):
    keys = key if key.__class__ is tuple else (key,)
    for k in keys:
        if isinstance(k, Traced):
            k = k.value
        dtype = getattr(k, "dtype", None)
        if dtype is not None and getattr(dtype, "kind", None) == "b":
            return True
        if k.__class__ is list and k and all(v.__class__ is bool for v in k):
            return True
    return False


# ================================================================================ the backend
class Namespace:
    """An array namespace whose functions record: `xp.exp(x)` on a Traced is a tape line."""

    def __init__(self, backend, module):
        self._backend = backend
        self._module = module

    def __getattr__(self, name):
        attribute = getattr(self._module, name)
        if isinstance(attribute, types.ModuleType):
            wrapped = Namespace(self._backend, attribute)
        elif callable(attribute) and not isinstance(attribute, type):
            backend = self._backend

            def wrapped(*args, **kwargs):
                return call(backend, attribute, args, kwargs)
            wrapped.__name__ = name
        else:
            wrapped = attribute  # dtypes, constants
        setattr(self, name, wrapped)  # found once
        return wrapped


# Backend methods that take or make arrays: each call is a tape line
_RECORDED = ("asarray", "zeros", "empty", "normalize_key", "get_item",
             "scatter_add", "add_at", "random_normal", "random_uniform")


class TraceBackend(backends.Backend):
    """The backend of the Traced arrays that wrap another backend's (`inner`)."""

    def __init__(self, inner):
        self.inner = inner
        self.name = f"traced {inner.name}"
        self.device_type = inner.device_type
        # Two classes, as the inner library has arrays and scalars (NumPy's 0-d results):
        # Function and Variable then treat a traced scalar as they treat a scalar
        name = type(inner).__name__
        self.array_type = type(f"TracedArray{name}", (Traced,), {"__slots__": (), "backend": self})
        scalar_type = type(f"TracedScalar{name}", (Traced,), {"__slots__": (), "backend": self})
        self.scalar_types = frozenset((scalar_type,)) if inner.scalar_types else frozenset()
        self._scalar_type = scalar_type
        self.xp = Namespace(self, inner.xp)
        self.single_device = inner.single_device
        self.needs_device_context = inner.needs_device_context
        self.multiplies_bool = inner.multiplies_bool  # no cast recorded where eager makes none
        self.lazy = inner.lazy  # Dask: ops lay out what they make as eagerly (laid_out below)
        self.plain = False
        for name in _RECORDED:
            setattr(self, name, self._recorded(getattr(inner, name), name in _DRAWS))

    def _recorded(self, method, draws):
        def recorded(*args, **kwargs):
            if draws:  # noted for the check that the step drew nothing past gradcore
                rec = recorder()
                if rec is not None:
                    rec.draws.append((method, args, kwargs))
            return call(self, method, args, kwargs)
        recorded.__name__ = method.__name__
        return recorded

    def traced(self, value, slot, recorder=None):
        # Traced(value, slot, recorder) without the call of __init__: one per traced op
        traced = _bare(self._scalar_type if value.__class__ in self.inner.scalar_types
                       else self.array_type)
        traced.value = value
        traced.slot = slot
        traced.recorder = recorder
        traced.ref = None if slot is None else Ref(slot)
        return traced

    def owns(self, array):
        return isinstance(array, Traced) and array.backend is self

    def owns_memory(self, array):
        return self.inner.owns_memory(array.value)

    def may_view(self, array, other):
        other = getattr(other, "value", other)
        return self.inner.may_view(array.value, other)

    def device_of(self, array):
        return self.inner.device_of(array.value)

    def device_context(self, device):
        return self.inner.device_context(device)

    def ensure_array(self, obj):
        if isinstance(obj, Traced) and obj.value.__class__ in self.inner.scalar_types:
            return call(self, self.inner.ensure_array, (obj,), None)
        return obj

    def assign(self, target, value):
        if type(self.inner).assign is backends.Backend.assign:
            return super().assign(target, value)  # target[...] = value: a setitem line
        # the inner backend's own (Dask's rebinds target to value's graph, persisted with the
        # parameters, where a setitem would keep every earlier graph), as a line writing target
        call(self, self.inner.assign, (target, value), None)  # checked as a write: call()
        return target

    def layout(self, array):
        return self.inner.layout(unwrap(array))

    def laid_out(self, array, layout):
        return call(self, self.inner.laid_out, (array, layout), None)

    def check_known_shape(self, array):
        self.inner.check_known_shape(unwrap(array))

    def to_device(self, array, device):
        """`array` moved to `device` as a tape line, to another library's device too (NumPy
        labels sent to the GPU by softmax_cross_entropy): a replay moves that call's array."""
        # None is a one-device backend's own device (an op's self.device on Dask), as the inner
        # backend reads it, not "cpu": Dask's arange would otherwise become a NumPy array
        target = self.inner if device is None else backends.backend_for_device(device)
        if target is self.inner:
            return call(self, self.inner.to_device, (array, device), None)
        return call(trace_backend(target), backends.to_device, (array, device), None)

    def to_numpy(self, array):
        give_up("a traced array was copied to the host (to_numpy)")
        return self.inner.to_numpy(unwrap(array))

    def manual_seed(self, seed):
        self.inner.manual_seed(seed)

    def random_state(self, device):
        return self.inner.random_state(device)

    def random_position(self, device, state=None):
        return self.inner.random_position(device, state)

    def random_lock(self, device):
        return self.inner.random_lock(device)

    def random_draw(self, kind, shape, dtype, device, state):
        # gradcore.checkpoint notes its block's draws to draw them again at backward; a replay
        # would draw afresh instead
        give_up("gradcore.checkpoint around random ops: backward draws the block's numbers "
                "again, which a replay would draw afresh")
        samples = self.inner.random_draw(kind, shape, dtype, device, state)
        return call(self, _as_is, (samples,), None)

    def set_random_state(self, device, state):
        # gradcore.checkpoint draws again what its block drew: a replay draws afresh each time
        rec = recorder()
        if rec is not None and rec.draws:
            rec.give_up("a random state was restored after random draws (gradcore.checkpoint "
                        "around random ops), which a replay would draw afresh")
        self.inner.set_random_state(device, state)

    def synchronize(self, device):
        self.inner.synchronize(device)

    def memory_in_use(self, device):
        return self.inner.memory_in_use(device)


def _as_is(array):
    return array


_backends = {}  # inner Backend -> its TraceBackend


def trace_backends():
    """The TraceBackends made so far (one per backend a recording has met)."""
    return list(_backends.values())


def trace_backend(inner):
    """The TraceBackend wrapping `inner`, made and made known to backend_of on first use."""
    backend = _backends.get(inner)
    if backend is None:
        backend = _backends[inner] = backends.register(TraceBackend(inner), devices=False)
    return backend
