"""A recorded step as a flat program: Python source, one line per array operation.

`Tape` keeps the lines a result, a stored value or a side effect needs, and replays them. The
first replays run them through small closures (`_interpreted`); from the third on, the tape runs
as the source of one Python function, `replay(a0, a1, ...)`, compiled once (CPython compiles
~7 µs per line: more than the recording itself, so a signature replayed twice never pays it).
Each slot is released after its last use, so a replay holds no more arrays than it needs. The
source (`tape.source`) can be read and stepped through like any Python function. Where the array
library captures device graphs (CuPy), that function calls each run of GPU lines as one graph
(graph.py).
"""
import itertools
import math
import operator
import threading
import warnings
import weakref

from ..variable import (Variable, changed_values, fresh_log, is_python_value, note_write,
                        same_settings, settings_of, value_changed, value_changes, values_lock,
                        watch)
from .fuse import fusable, fuse
from .graph import Graphed, graph_backend, graphed
from .trace import (_NESTED, _UNSET, BINARY, IN_PLACE, REUSE_BYTES, UNARY, ArrayFacts, Line,
                    Ref, _same_value, has_side_effect, slots_in, trace_backends)

INTERPRETED_REPLAYS = 2  # replays run through closures before the tape is compiled


class Diverged(Exception):
    """A replay met a guard that came out otherwise than when it was recorded."""


def _store(v, value, writes=1):
    """`v.data = value` as a replay does it (`writes` times): the array as it is, counted as a
    write; another array gives v a history of its own, apart from the views of the old one."""
    if value is not v._data:
        v._writes = fresh_log(v)
    v._data = value
    for _ in range(writes):
        note_write(v)


def _store_grad(v, value):
    """`v.grad` as the recorded run left it: None, or a new Variable holding `value`."""
    v._grad = None if value is None else Variable(value, requires_grad=False)


class Tape:
    """One recorded step: `run(*args)` replays it and returns the arrays its results hold."""

    def __init__(self, recorder, outputs, fusing=True, graphs=True):
        self.outputs = outputs  # output slots, in the order the results template lists them
        # the Variables whose grad must be there (it is read), and those whose grad must not
        # (backward sets it, where eagerly it would add to one), for a replay: else another tape
        self.grads_present, self.grads_absent = recorder.grads_read, recorder.grads_absent
        self.values_read = recorder.values_read  # Python values the step set, as it found them
        self.values_set = recorder.values_set    # and those it changed, as it left them
        self.guards = bool(self.grads_present or self.grads_absent or self.values_read)
        # another tape of the same key, recorded with other grads there or other values found
        # (Compiled keeps TAPES_PER_KEY)
        self.other = None
        self._take_what_it_found(recorder)
        self.unreplayed = 1  # the key's recordings since one of its tapes replayed (Compiled)
        results = set(outputs)
        lines = _into_views(recorder.lines, results)
        lines, self.frees = _needed(lines, outputs)
        if fusing and fusable(lines):  # where the array library fuses (CuPy): see fuse.py
            fused = fuse(lines, _last_uses(self.frees, outputs, len(lines)), _fused_source,
                         recorder.dtypes)
            if fused is not lines:
                lines, self.frees = _needed(fused, outputs)
        # Neither buffer pass pays on a tape of small arrays, nor does asking each line for the
        # size of its array: the recorder kept the largest (the lines the passes above make
        # are no larger than those they replace). Callgrind, wide: 13 M instructions less of a
        # 409 M recording, 7 M of them _blocked_pairs' look at the lines before its 1,000
        # in-place ones
        if recorder.largest >= REUSE_BYTES:
            lines = _reuse_buffers(lines, self.frees, results, recorder.layouts)
        if recorder.largest >= BLOCKED_BYTES:
            lines, self.frees = _blocked_pairs(lines, self.frees, results)
        self.lines = lines
        self.arguments = recorder.arguments
        # the ids of the Variables the step made that the tape loads or stores (`Variable(c)`
        # of a constant c, its grad stored before an optimizer step): eagerly a new one at each
        # call, so no code outside the step sees these (Compiled falls back where it would)
        self.made = {id(v) for v in self.variables() if id(v) in recorder.made_here}
        # carried states (an RNN's h) the step read before setting it, each with the object it
        # found (a Variable weakly: a dead one is not there), and those it left None
        self.states_read = [(module, name, weakref.ref(v) if isinstance(v, Variable) else v,
                             isinstance(v, Variable))
                            for (module, name), v in recorder.states_read.items()]
        self.states_left = recorder.states_left
        self.replays = 0
        self.graphs = graphs  # runs of device lines become device graphs when compiled (graph.py)
        self.graphed = []     # those runs, once compiled
        self._program = None  # (lines, frees) as compiled
        self._run = _interpreted(self.lines, self.frees, self.arguments, outputs)
        # their requires_grad, hooks or data's dtype changed: compared (values_hold)
        watch(recorder.touched)
        watch(recorder.settings_noted.values())
        # a replay sets the values the step set after its lines, an optimizer's step among
        # them: a hook of the user's added since may read them (Compiled records such a step
        # again), so the hooks are those it ran with
        self.hooks_taken = [(opt, tuple(getattr(opt, "hooks", ()))) for opt in
                            self.optimizers()] if self.values_set else []
        self.guards = self.guards or bool(self.hooks_taken)

    def _take_what_it_found(self, recorder):
        """Keep the Python values of the modules the step reached and the settings of the
        Variables it read, wrote or set as it found them (values_hold compares them), and what
        a replay sets as the step did; tell every tape what the step left otherwise unnoted."""
        # the Python values of the modules the step reached, as it found them (values_hold),
        # and the count of value changes it has looked at (value_changes): those as it began
        self.values_found = recorder.values_found
        self.values_seen = recorder.values_seen
        # id -> a weak reference to each module it reached or called; None where the walk
        # stopped short (REACH_LIMIT), so that a change to any module counts
        self.modules = None if not recorder.reached_all else {
            i: weakref.ref(module) for i, module in recorder.modules_reached.items()}
        self.guarded = {(id(module), name) for module, name, _ in self.values_read}
        # id -> (a weak reference to each Variable the tape reads or writes, or whose
        # requires_grad or hooks the step set, and its settings_of as the step found it: None
        # where it was not reached then, so that any change counts). An argument's, part of the
        # key, is set by its place: arguments_left
        self.settings_found = {
            id(v): (weakref.ref(v), recorder.settings_found.get(id(v)))
            for v in (*recorder.touched, *recorder.settings_noted.values())
            if id(v) not in recorder.argument_settings}
        # (index, requires_grad) of each Variable argument the step left otherwise
        self.arguments_left = [(i, v._requires_grad)
                               for i, v, found in recorder.argument_settings.values()
                               if v._requires_grad != found]
        # the requires_grad the step left otherwise than it found (a layer it froze): a replay
        # sets it so too, where it finds them as the recording did (its changes were noted as
        # the recording ended: the next call records, unless code between calls sets it back)
        self.requires_grad_left = [
            (ref, ref()._requires_grad) for ref, found in self.settings_found.values()
            if found is not None and ref()._requires_grad != found[0]]
        # settings changed while it recorded where nothing noted it (an optimizer's hook, run
        # as Python, freezing a layer no tape watched yet): the next call finds the change
        for ref, found in self.settings_found.values():
            if found is not None and not same_settings(settings_of(ref()), found):
                value_changed(ref(), None)
        self.stale = None  # what values_hold found changed last: looked at first next time
        # a number the step left otherwise, unnoted while it recorded (one an optimizer's hook
        # set on a module no tape watched yet): the next call finds the change, and records
        now = {(i, name): value for i, module in recorder.modules_reached.items()
               for name, value in module.__dict__.items() if is_python_value(value)}
        for i, name in now.keys() | self.values_found.keys():
            if (i, name) not in self.guarded and not _same_value(
                    now.get((i, name), _UNSET), self.values_found.get((i, name), _UNSET)):
                value_changed(recorder.modules_reached[i], name)

    @property
    def ops(self):
        """How many array operations a replay runs (loads, stores and guards not counted)."""
        return sum(1 for line in self.lines if line.kind not in (
            "load", "load_grad", "constant", "store", "store_grad", "guard"))

    def variables(self):
        """The Variables (not the step's arguments) the tape loads from or stores into."""
        sites = {id(line.target): line.target for line in self.lines
                 if line.kind in ("load", "load_grad", "store", "store_grad")
                 and line.target.__class__ is not int}
        return list(sites.values())

    def optimizers(self):
        """The optimizers whose steps the tape runs (as its opaque lines name them: see
        Recorder.opaque)."""
        found = {}
        for line in self.lines:
            if line.kind == "opaque" and line.kwargs:
                found[id(line.kwargs["optimizer"])] = line.kwargs["optimizer"]
        return list(found.values())

    def ready(self):
        """True if the Variables whose grad the tape reads have one, and those whose grad it
        sets have none, and the Python values it took are as they were (values_hold)."""
        return (all(v._grad is not None for v in self.grads_present)
                and all(v._grad is None for v in self.grads_absent)
                and all(_same_value(module.__dict__.get(name, _UNSET), value)
                        for module, name, value in self.values_read)
                and all(len(opt.hooks) == len(hooks) and all(map(operator.is_, opt.hooks, hooks))
                        for opt, hooks in self.hooks_taken)
                and self.values_hold())

    def values_hold(self):
        """True if the Python values of the modules the step reached, and the settings of the
        Variables it read or wrote (settings_of), that changed since the tape last looked are as
        the step found them (the values it set: checked in ready). A look that passes is not made
        again for the same changes."""
        if self.values_seen == value_changes[0]:
            return True
        if self.stale is not None and not self._holds(*self.stale):
            return False  # still changed: no walk over the log again (a tape of an old value)
        with values_lock:
            now = value_changes[0]
            changes, count = set(), 0  # each changed thing once (a GAN's toggles: twice)
            for change in reversed(changed_values):
                if change[0] <= self.values_seen:
                    break
                changes.add(change[1:])
                count += 1
            else:
                if count < now - self.values_seen:
                    self.stale = (None, None)  # more changes than are kept: which is unknown
                    return False
        for i, name in changes:
            if not self._holds(i, name):
                self.stale = (i, name)
                return False
        self.stale = None
        self.values_seen = now
        return True

    def _holds(self, i, name):
        """Whether module i's value `name` (a Variable i's settings, for name None) is as the
        step found it, or no concern of the tape's; (None, None): changes that were lost."""
        if i is None:
            return False
        if name is None:  # a Variable's settings
            found = self.settings_found.get(i)
            v = found[0]() if found is not None else None
            return v is None or (found[1] is not None
                                 and same_settings(settings_of(v), found[1]))
        if (i, name) in self.guarded:
            return True  # checked in ready(): one the step sets, which its replays set
        if self.modules is None:
            return False  # which modules it reached is not known
        module = self.modules.get(i)
        module = module() if module is not None else None
        return (module is None or _same_value(
            module.__dict__.get(name, _UNSET), self.values_found.get((i, name), _UNSET)))

    def run(self, *args):
        if self.states_read and not self.states_as_read():
            raise Diverged("a state the step read is another object now")
        self.replays += 1
        if self.replays == INTERPRETED_REPLAYS + 1:
            source, namespace = _source(*self._compiled(), self.arguments, self.outputs)
            exec(compile(source, "<gradcore.compile tape>", "exec"), namespace)
            self._run = namespace["replay"]
            if self.graphed:
                self._run = _one_call_at_a_time(self._run)
        arrays = self._run(*args)
        for module, name in self.states_left:
            setattr(module, name, None)
        for module, name, value in self.values_set:  # found as before the step (ready)
            module.__dict__[name] = value  # where the step's Module.__setattr__ put it
            value_changed(module, name)
        for ref, requires_grad in self.requires_grad_left:
            v = ref()
            if v is not None:
                v._requires_grad = requires_grad
                value_changed(v, None)
        for i, requires_grad in self.arguments_left:
            args[i]._requires_grad = requires_grad
            value_changed(args[i], None)
        return arrays

    def states_as_read(self):
        """True if each carried state the step read before setting it (an RNN's h) is the
        object it read then: eager code between calls may have left another there."""
        for module, name, value, weakly in self.states_read:
            if weakly:
                value = value()
                if value is None:
                    return False
            if module.__dict__.get(name) is not value:
                return False
        return True

    def _compiled(self):
        """The lines and frees the compiled replay runs: the tape's, with runs of device lines as
        graphs where the array library captures them."""
        if self._program is None:
            lines, frees = self.lines, self.frees
            backend = graph_backend(lines) if self.graphs else None
            if backend is not None:
                lines, frees, self.graphed = graphed(lines, frees, self.outputs, self.arguments,
                                                     backend, _interpreted)
            self._program = lines, frees
        return self._program

    @property
    def source(self):
        """The replay as the source of a Python function; after it, that of each run of lines
        it calls as a device graph (named as the replay calls it)."""
        writer = _Writer()
        source = _source(*self._compiled(), self.arguments, self.outputs, writer)[0]
        for name, target in list(writer.namespace.items()):
            if target.__class__ is Graphed:
                source += "\n" + _fused_source(target.lines, target.inputs, target.outputs,
                                               name, writer)[0]
        return source


def _one_call_at_a_time(replay):
    """`replay` behind a lock. A tape's graphs are the same memory at every call and hand their
    results to one another where they are: two calls interleaved (two threads) would launch
    one graph twice before the next read its results, and each would read the other's."""
    lock = threading.Lock()

    def locked(*args):
        with lock:
            return replay(*args)
    return locked


def _needed(lines, outputs):
    """The lines a result, a stored value or a side effect depends on, in order, and for each
    the set of slots no later line reads (outputs excepted): those a replay frees after it."""
    needed = set(outputs)
    used_later = set(outputs)
    kept, frees = [], []
    for line in reversed(lines):
        out = line.out
        if out in needed or has_side_effect(line):
            reads = line.reads
            needed.update(reads)
            free = set(reads)
            if out is not None:
                free.add(out)
            free -= used_later  # set operations in C: a comprehension took 1.5x as long
            used_later |= free
            kept.append(line)
            frees.append(free)
    kept.reverse()
    frees.reverse()
    return kept, frees


def _last_uses(frees, outputs, count):
    """Each slot's last use, from `frees` (the slots freed after each line): the index of the
    line after which it goes; `count` (past the end) for the step's results."""
    last = {slot: i for i, free in enumerate(frees) for slot in free}
    last.update((slot, count) for slot in outputs)
    return last


# Operators whose ufunc can write into one of its inputs: (operator, the namespace's name)
_UFUNCS = {operator.add: "add", operator.sub: "subtract", operator.mul: "multiply",
           operator.truediv: "divide", operator.pow: "power", operator.neg: "negative"}


def _ufunc(line):
    """The ufunc `line` computes with, if it takes `out=` (NumPy's and CuPy's do); else None."""
    if line.array is None or line.kwargs:
        return None
    if line.kind in ("binary", "unary"):
        name = _UFUNCS.get(line.target)
        function = getattr(line.array.xp, name, None) if name else None
    elif line.kind == "call":
        function = line.target
    else:
        return None
    return function if type(function).__name__ == "ufunc" else None


# A Line field read in C, by map(), where a pass asks one question of every line
_KIND = operator.attrgetter("kind")


def _reuse_buffers(lines, frees, outputs, layouts):
    """Lines rewritten to write their result into the memory of an input they read last, as
    `multiply(a, b, out=a)`: a replay allocates less (eager code cannot know that `a` dies
    there). The input must be an array a line made (no one else's), of the result's shape,
    dtype and strides, held by nothing after the line: not a result, not in the memory of an
    array stored (as a Variable's data or grad: `state.data = a.reshape(-1)` keeps `a`'s
    memory), handed to an opaque line or kept in an index key, with no view of it used later.
    A rewritten line lends only where its inputs are laid out at the replay as they were
    recorded (_Lent). `layouts`: the strides of the arrays no line made (Recorder.layouts).
    (Tape runs it only where a line makes an array of REUSE_BYTES or more.)"""
    last = _last_uses(frees, outputs, len(lines))
    made, views, kept = {}, {}, set()
    for i, line in enumerate(lines):
        if line.array is not None and line.kind != "in_place":
            made[line.out] = line.array
            views.setdefault(line.array.root, []).append(line.out)
        if line.kind in ("store", "store_grad", "opaque") or (
                line.out is not None and line.array is None and line.kind != "in_place"):
            kept.update(line.reads)
    # what is kept past the tape lives on in the memory it views: all of that memory is kept
    kept_memory = {made[slot].root for slot in kept if slot in made}
    # the memory of each array a line made of its own, by size: a view in C order as large as
    # it (a reshape: relu's maximum after a convolution's matmul) lends it as the array would
    whole = {facts.root: facts.nbytes for facts in made.values() if facts.fresh}
    rewritten = []
    for i, line in enumerate(lines):
        function = _ufunc(line) if line.array is not None and (
            line.array.nbytes >= REUSE_BYTES) else None
        if function is not None:
            for slot in dict.fromkeys(line.reads):
                facts = made.get(slot)
                if (slot in frees[i] and slot not in outputs and slot not in kept
                        and facts is not None and facts.root not in kept_memory
                        and (facts.fresh or facts.contiguous
                             and whole.get(facts.root) == facts.nbytes)
                        and facts.shape == line.array.shape and facts.dtype == line.array.dtype
                        # eager NumPy lays a result out after all its inputs (`tanh(x.T) - y`:
                        # C order); out= would give it the lent input's layout
                        and facts.strides == line.array.strides
                        and not any(last[v] > i
                                    for v in views.get(facts.root, ()) if v != slot)):
                    inputs = _input_layouts(line, made, layouts)
                    if inputs is not None:
                        line = _with_out(line, function, slot, inputs)
                    break
        rewritten.append(line)
    return rewritten


# In-place operators whose ufunc writes into the left operand: (operator, the namespace's name)
_IN_PLACE_UFUNCS = {operator.iadd: "add", operator.isub: "subtract", operator.imul: "multiply",
                    operator.itruediv: "divide"}
# ufuncs IEEE 754 rounds exactly, or that do not round: an element's result does not depend on
# where in a vector loop it falls, so running a block of rows at a time gives the same bits
_EXACT = frozenset(("add", "subtract", "multiply", "divide", "negative", "positive", "absolute",
                    "maximum", "minimum", "sqrt", "square"))
# A pair runs in blocks only where its temporary is this large (a core's L2 cache holds less);
# each block of it is this large (L2 holds it between the two lines)
BLOCKED_BYTES = 1 << 21
BLOCK_BYTES = 1 << 18
_VECTOR = 64  # elements: a multiple of any SIMD width NumPy's loops use


def _blocked_pairs(lines, frees, outputs):
    """(lines, frees) with each pair `t = f(...); a op= t` (an SGD update, `p -= lr * g`), where t
    is a large temporary no other line reads and the library loops on the host (NumPy), made one
    line that runs both a block of rows at a time: each block of t stays in cache between the
    two, where eager code writes all of t out to memory and reads it back (mlp: 4 MB weights,
    the update 0.85 -> 0.63 ms each). Only ufuncs that round exactly: the same bits. (Tape runs it
    only where a line makes an array of BLOCKED_BYTES or more.)"""
    hosts = [b.inner.xp for b in trace_backends() if b.inner.loops_on_host]
    if not hosts:
        return lines, frees
    # only the lines before an in-place one are asked, found in C (a Python step per line took
    # 2.5 ms of wide's 7,000-line tape, this 0.9 ms)
    pairs = {}
    for i in itertools.compress(itertools.count(-1), map(operator.eq, map(_KIND, lines),
                                                          itertools.repeat("in_place"))):
        if i >= 0 and i - 1 not in pairs:
            pair = _blocked_pair(lines[i], lines[i + 1], frees[i + 1], outputs, hosts)
            if pair is not None:
                pairs[i] = pair
    if not pairs:
        return lines, frees
    merged_lines, merged_frees, i = [], [], 0
    while i < len(lines):
        pair = pairs.get(i)
        if pair is not None:
            merged_lines.append(pair)
            merged_frees.append((frees[i] | frees[i + 1]) - {lines[i].out})
            i += 2
        else:
            merged_lines.append(lines[i])
            merged_frees.append(frees[i])
            i += 1
    return merged_lines, merged_frees


def _blocked_pair(make, update, freed, outputs, hosts):
    """The one line running `make` (t = f(...)) and `update` (a op= t) block by block, or None."""
    facts, temp = make.array, make.out
    if (update.kind != "in_place" or update.target not in _IN_PLACE_UFUNCS
            or make.__class__ is not Line or make.kwargs or facts is None
            or facts.xp not in hosts or not facts.fresh or facts.nbytes < BLOCKED_BYTES
            or not facts.shape or facts.dtype.kind not in "biuf"
            or _slot_of(update.args[1]) != temp or _slot_of(update.args[0]) in (None, temp)
            or temp not in freed or temp in outputs):
        return None
    function = _ufunc(make)
    if function is None or function.__name__ not in _EXACT:
        return None
    row_bytes = facts.nbytes // facts.shape[0]  # not 0: nbytes >= BLOCKED_BYTES
    # blocks of a multiple of _VECTOR elements: on contiguous memory every element falls where it
    # falls in the whole array's vector loop, the tail included (where two NaNs meet, a vector
    # instruction and the scalar tail may pick different ones)
    step = _VECTOR // math.gcd(row_bytes // facts.dtype.itemsize, _VECTOR)
    rows = max(step, BLOCK_BYTES // row_bytes // step * step)
    block = _Blocked(make.target, function, update.target,
                     getattr(facts.xp, _IN_PLACE_UFUNCS[update.target]), facts, rows)
    return Line("call", block, (update.args[0], *make.args), None, update.out,
                [*update.reads[:1], *make.reads])


_QUIET = frozenset(("ignore", "warn"))  # floating-point error modes that raise nothing
_ERRORS = ("divide by zero", "overflow", "underflow", "invalid value")  # NumPy's order


class _Blocked:
    """`a op= f(*args)` a block of rows at a time, a block of f's result in one small buffer;
    done as the two lines were (f, then op=) where a block cannot stand for the whole (_fits)
    or a floating-point error would raise."""

    __slots__ = ("make", "make_ufunc", "update", "update_ufunc", "shape", "dtype", "array_type",
                 "empty", "may_share_memory", "geterr", "errstate", "rows", "__name__")

    def __init__(self, make, make_ufunc, update, update_ufunc, facts, rows):
        self.make, self.make_ufunc = make, make_ufunc
        self.update, self.update_ufunc = update, update_ufunc
        self.shape, self.dtype, self.rows = facts.shape, facts.dtype, rows
        xp = facts.xp
        self.empty, self.may_share_memory = xp.empty, xp.may_share_memory
        self.geterr, self.errstate = xp.geterr, xp.errstate
        self.array_type = type(self.empty(0))
        self.__name__ = f"blocked_{make_ufunc.__name__}_{update_ufunc.__name__}"

    def __call__(self, a, *args):
        modes = self.geterr()
        if not self._fits(a, args) or not _QUIET.issuperset(modes.values()):
            # under errstate(...="raise"), eagerly `a` is left whole (f raised) or all written
            # (op= raised after its loop); a block raising would leave it half updated
            return self.update(a, self.make(*args))
        warn_kinds = [kind for kind, mode in modes.items() if mode == "warn"]
        if not warn_kinds:
            self._run(a, args, None)
            return a
        # NumPy would warn once per block: the errors are collected and each warned once, as
        # eagerly (the temporary's first, then the update's)
        found, running = {}, [0]
        with self.errstate(call=lambda error, flag: found.setdefault((running[0], error)),
                           **dict.fromkeys(warn_kinds, "call")):
            self._run(a, args, running)
        names = (self.make_ufunc.__name__, self.update_ufunc.__name__)
        for op, error in sorted(found, key=lambda k: (k[0], _ERRORS.index(k[1]))):
            warnings.warn(f"{error} encountered in {names[op]}", RuntimeWarning, stacklevel=2)
        return a

    def _fits(self, a, args):
        """True if a block of rows stands for the whole: `a` of the temporary's shape and dtype, no
        argument sharing a's memory other than as `a`, none cast (NumPy loops through
        8192-element buffers where it casts, which blocks would start elsewhere), and all in C
        order (the whole array's loop and the blocks' then run the same vector loops over the
        same elements: another layout may take a strided loop, which can pick another of two
        NaNs)."""
        array_type, dtype = self.array_type, self.dtype
        return (a.__class__ is array_type and a.shape == self.shape and a.dtype == dtype
                and a.flags.c_contiguous and all(
                    x.__class__ is not array_type or x.dtype == dtype and x.flags.c_contiguous
                    and (x is a or not self.may_share_memory(x, a)) for x in args))

    def _run(self, a, args, running):
        """The pair, a block of rows at a time; running[0] says which of the two runs (0: the
        temporary's, 1: the update), if `running` is given."""
        ndim, count, rows = len(self.shape), self.shape[0], self.rows
        split = [x.__class__ is self.array_type and x.ndim == ndim and x.shape[0] == count
                 for x in args]
        buffer = self.empty((min(rows, count), *self.shape[1:]), self.dtype)
        make_ufunc, update_ufunc = self.make_ufunc, self.update_ufunc
        for start in range(0, count, rows):
            stop = min(start + rows, count)
            t = buffer[:stop - start]
            if running is not None:
                running[0] = 0
            make_ufunc(*[x[start:stop] if cut else x for x, cut in zip(args, split)], out=t)
            if running is not None:
                running[0] = 1
            part = a[start:stop]
            update_ufunc(part, t, out=part)

    def __repr__(self):
        return self.__name__


def _readers(lines):
    """slot -> how many line arguments refer to it."""
    readers = {}
    for line in lines:
        for slot in line.reads:
            readers[slot] = readers.get(slot, 0) + 1
    return readers


def _slot_of(value):
    return value.slot if value.__class__ is Ref else None


def _into_views(lines, outputs):
    """A ufunc's result that the next line only copies into a view of another array
    (`z[key] = a * b`: max pooling's backward filling its strided windows) is written there
    directly, `multiply(a, b, out=z[key])`: the replay makes no array in between and copies
    nothing (conv: 3 MB less written per step).
    Only for a basic index (slices, integers: a view) of strided memory (NumPy's, CuPy's), a
    result of the view's shape and of z's dtype, read by nothing else."""
    if "setitem" not in map(_KIND, lines):
        return lines  # the common case, asked in C: no Python step per line
    readers = None
    rewritten, skip, changed = [], False, False
    for i, line in enumerate(lines):
        if skip:
            skip = False
            continue
        after = lines[i + 1] if i + 1 < len(lines) else None
        if (after is not None and after.kind == "setitem" and line.out is not None
                and _slot_of(after.args[2]) == line.out and line.array is not None
                and line.out not in outputs and _ufunc(line) is not None):
            if readers is None:
                readers = _readers(lines)
            view = _view_of(lines, i, after, readers)
            if view is not None:
                rewritten += view
                skip = changed = True
                continue
        rewritten.append(line)
    return rewritten if changed else lines


def _view_of(lines, index, setitem, readers):
    """[the view line, the ufunc line writing into it] for lines[index] and the setitem after it,
    or None where that would change what the step computes."""
    line = lines[index]
    target, key = setitem.args[0], setitem.args[1]
    if readers.get(line.out) != 1 or target.__class__ is not Ref or slots_in(key, []):
        return None
    if not all(k is Ellipsis or k is None or k.__class__ in (int, slice)
               for k in (key if key.__class__ is tuple else (key,))):
        return None  # an array index would make getitem a copy
    maker = next((other for other in reversed(lines[:index]) if other.out == target.slot), None)
    if maker is None or maker.array is None or maker.array.dtype != line.array.dtype:
        return None
    if maker.array.strides is None:
        return None  # no strided memory (Dask's): target[key] is a new array, not a view of it
    xp = line.array.xp
    # the view as an array of the target's shape that takes no memory gives it
    probe = xp.broadcast_to(xp.empty((), dtype=maker.array.dtype), maker.array.shape)[key]
    if probe.shape != line.array.shape:
        return None  # the setitem broadcasts the result: keep it
    view = Line("binary", operator.getitem, (target, key), None, line.out)
    view.array = ArrayFacts(probe, False, maker.array.root, xp)  # a view: the target's memory
    into = _with_out(line, _ufunc(line), line.out)
    into.array = view.array  # the target's memory, as a view: never lent to another line
    return [view, into]


def _input_layouts(line, made, layouts):
    """((slot, strides), ...) of the arrays `line` reads, as recorded (0-d ones left out: they
    have one layout), or None if one's is unknown."""
    found = []
    for slot in dict.fromkeys(line.reads):
        facts = made.get(slot)
        strides = facts.strides if facts is not None else layouts.get(slot)
        if strides is None:
            return None
        if strides:
            found.append((slot, strides))
    return tuple(found)


class _Lent(Line):
    """A line writing its result into the memory of an input (`out=`), where the arrays it
    reads have the strides they were recorded with (`layouts`: (slot, strides) of each); else
    it makes a new array, as eager code does. Their layouts decide the result's, and one may be
    another at a replay: a parameter's data given another layout since (np.asfortranarray, a
    loader), or an array an optimizer's step made."""

    __slots__ = ("layouts",)


def _with_out(line, function, slot, layouts=None):
    """`line` as a call of `function` writing into the slot's array; a _Lent if `layouts`."""
    if layouts is None:
        new = Line("call", function, line.args, {"out": Ref(slot)}, line.out)
    else:
        new = _Lent("call", function, line.args, {"out": Ref(slot)}, line.out)
        new.layouts = layouts
    new.array = line.array
    return new


class _Writer:
    """Names for the objects the source refers to: bound in the function's globals."""

    def __init__(self):
        self.namespace = {"_store": _store, "_store_grad": _store_grad, "slice": slice,
                          "Diverged": Diverged}
        self._names = {}

    def bind(self, obj, prefix):
        name = self._names.get(id(obj))
        if name is None:
            name = self._names[id(obj)] = f"{prefix}{len(self._names)}"
            self.namespace[name] = obj
        return name

    def site(self, target):
        """A Variable the tape loads from or stores into: an argument (its index) or a bound one."""
        return f"a{target}" if target.__class__ is int else self.bind(target, "x")

    def expression(self, value):
        kind = value.__class__
        if kind is Ref:
            return f"v{value.slot}"
        if kind is tuple:
            return "(" + "".join(f"{self.expression(v)}, " for v in value) + ")"
        if kind is list:
            return "[" + ", ".join(self.expression(v) for v in value) + "]"
        if kind is dict and all(k.__class__ is str for k in value):
            return "{" + ", ".join(f"{k!r}: {self.expression(v)}" for k, v in value.items()) + "}"
        if kind is slice:
            return (f"slice({self.expression(value.start)}, {self.expression(value.stop)}, "
                    f"{self.expression(value.step)})")
        if value is None or value is Ellipsis or kind in (bool, int, str) or (
                kind is float and math.isfinite(value)):
            return f"({value!r})" if kind in (int, float) and value < 0 else repr(value)
        return self.bind(value, "k")

    def arguments(self, args, kwargs):
        parts = [self.expression(a) for a in args]
        if kwargs:
            parts += [f"{k}={self.expression(v)}" for k, v in kwargs.items()]
        return ", ".join(parts)


def _fused_source(lines, inputs, results, name="fused", writer=None):
    """The source of `fused(inputs) -> results` doing `lines` (or of `name`), and its globals
    (`writer`'s, if given: names shared with another function's source)."""
    writer = _Writer() if writer is None else writer
    body = [_statement(line, writer) for line in lines]
    returned = ", ".join(f"v{slot}" for slot in results)
    source = (f"def {name}({', '.join(f'v{slot}' for slot in inputs)}):\n"
              + "".join(f"    {s}\n" for s in body) + f"    return {returned}\n")
    return source, writer.namespace


def _source(lines, frees, arguments, outputs, writer=None):
    """The replay function's source, and the globals it runs with."""
    writer = _Writer() if writer is None else writer
    body = []
    for index, slot, variable in arguments:
        body.append(f"v{slot} = a{index}._data" if variable else f"v{slot} = a{index}")
    for line, free in zip(lines, frees):
        body.append(_statement(line, writer))
        if free:
            body.append("del " + ", ".join(f"v{slot}" for slot in free))
    body.append("return (" + "".join(f"v{slot}, " for slot in outputs) + ")")
    count = 1 + max((index for index, _, _ in arguments), default=-1)
    signature = "".join(f"a{i}, " for i in range(count)) + "*_"
    source = f"def replay({signature}):\n" + "".join(f"    {s}\n" for s in body)
    return source, writer.namespace


def _operation(line, w):
    a, b = (w.expression(x) for x in (*line.args, None)[:2])
    if line.kind == "unary":
        return f"abs({a})" if line.target is operator.abs else f"{UNARY[line.target]}{a}"
    if line.target is operator.getitem:
        return f"{a}[{b}]"
    return f"{a} {BINARY[line.target]} {b}"


def _call(line, w):
    """A call line's statement; a _Lent's writes into its input only where the inputs' strides
    are those recorded."""
    call = f"{w.bind(line.target, 'f')}({w.arguments(line.args, line.kwargs)})"
    if line.__class__ is not _Lent:
        return f"v{line.out} = {call}"
    laid_out = " and ".join(f"v{slot}.strides == {strides!r}" for slot, strides in line.layouts)
    return (f"v{line.out} = {call} if {laid_out} else "
            f"{w.bind(line.target, 'f')}({w.arguments(line.args, None)})")


# kind -> the Python statement of a line of that kind (`w` names what the source refers to)
_STATEMENTS = {
    "call": _call,
    "method": lambda line, w: f"v{line.out} = {w.expression(line.args[0])}.{line.target}("
                              f"{w.arguments(line.args[1:], line.kwargs)})",
    "binary": lambda line, w: f"v{line.out} = {_operation(line, w)}",
    "unary": lambda line, w: f"v{line.out} = {_operation(line, w)}",
    "in_place": lambda line, w: f"{w.expression(line.args[0])} {IN_PLACE[line.target]} "
                                f"{w.expression(line.args[1])}",
    "setitem": lambda line, w: "{}[{}] = {}".format(*map(w.expression, line.args)),
    "load": lambda line, w: f"v{line.out} = {w.site(line.target)}._data",
    "load_grad": lambda line, w: f"v{line.out} = {w.site(line.target)}._grad._data",
    "constant": lambda line, w: f"v{line.out} = {w.bind(line.target, 'k')}",
    "store": lambda line, w: f"_store({w.site(line.target)}"
                             f"{'._grad' if line.kwargs and line.kwargs.get('in_grad') else ''}, "
                             f"{w.expression(line.args[0])}"
                             f"{_writes_argument(line)})",
    "store_grad": lambda line, w: f"_store_grad({w.site(line.target)}, "
                                  f"{w.expression(line.args[0])})",
    "opaque": lambda line, w: f"{w.bind(line.target, 'f')}({w.arguments(line.args, None)})",
    "guard": lambda line, w: f"if {'not ' if line.target else ''}{w.expression(line.args[0])}: "
                             f"raise Diverged({line.kwargs['where']!r})",
}


def _writes_argument(line):
    writes = line.kwargs.get("writes", 1) if line.kwargs else 1
    return f", {writes}" if writes != 1 else ""


def _statement(line, w):
    return _STATEMENTS[line.kind](line, w)


# ================================================================================ interpreted
def _resolve(value, values):
    """A nested line argument (an index key holding arrays) with the slot values in its Refs."""
    kind = value.__class__
    if kind is Ref:
        return values[value.slot]
    if kind is tuple or kind is list:
        return kind([_resolve(v, values) for v in value])
    if kind is dict:
        return {k: _resolve(v, values) for k, v in value.items()}
    if kind is slice:
        return slice(*[_resolve(v, values) for v in (value.start, value.stop, value.step)])
    return value


def _interpreted(lines, frees, arguments, outputs, inspect=None):
    """The replay as one loop over the lines, freeing each slot after its last use. It reads
    the lines as they are: building nothing ahead keeps the recording cheap (a tape that is
    replayed more than twice is compiled, see Tape.run). `inspect(line, values)`, if given, is
    called before each line runs, with the slots' values (a graph's capture checks them)."""
    def replay(*args):
        values = {}
        for index, slot, variable in arguments:
            values[slot] = args[index]._data if variable else args[index]
        for line, free in zip(lines, frees):
            if inspect is not None:
                inspect(line, values)
            kind, target = line.kind, line.target
            xs = [values[a.slot] if a.__class__ is Ref else
                  _resolve(a, values) if a.__class__ in _NESTED else a for a in line.args]
            if kind in _CALLS:
                if kind == "method":
                    target = getattr(xs.pop(0), target)
                if line.kwargs and (line.__class__ is not _Lent or all(
                        values[slot].strides == strides for slot, strides in line.layouts)):
                    values[line.out] = target(*xs, **_resolve(line.kwargs, values))
                else:
                    values[line.out] = target(*xs)
            elif kind == "setitem":
                operator.setitem(*xs)
            elif kind == "load":
                values[line.out] = (args[target] if target.__class__ is int else target)._data
            elif kind == "load_grad":
                values[line.out] = (args[target] if target.__class__ is int else
                                    target)._grad._data
            elif kind == "constant":
                values[line.out] = target
            elif kind == "store":
                v = args[target] if target.__class__ is int else target
                store = line.kwargs or {}
                _store(v._grad if store.get("in_grad") else v, xs[0], store.get("writes", 1))
            elif kind == "store_grad":
                _store_grad(args[target] if target.__class__ is int else target, xs[0])
            elif kind == "opaque":
                target(*xs)
            elif kind == "guard":
                if bool(xs[0]) is not target:
                    raise Diverged(line.kwargs["where"])
            else:
                raise AssertionError(f"unknown tape line kind {kind!r}")
            for slot in free:
                del values[slot]
        return tuple(values[slot] for slot in outputs)
    return replay


_CALLS = frozenset(("call", "method", "binary", "unary", "in_place"))
