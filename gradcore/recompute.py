"""checkpoint(fn, *args): keep a block's inputs instead of its intermediate arrays, and compute
the block again during backward (memory for compute, as torch.utils.checkpoint).

The block runs once, recorded, to find every Variable from outside it that it reads (the
Parameters of the layers it calls, say) and its results; that graph is then dropped, so the
block's intermediate arrays are freed at once. One node stands for the whole block in the
graph, its inputs being the block's arguments and those outside Variables. Its backward runs the
block again with recording on, from the same Variables, and differentiates that: random ops
(dropout) draw the same numbers (each draw was noted with where the generator was: see
random.DrawLog), batch norm leaves its running statistics as the first run left them and, in
test mode, reads them as the first run read them (noted in the same log: a train-mode call may
have updated them since), gradients reach the outside Variables through the outer walk
(gradcore.grad leaves every .grad alone, as without a checkpoint), and with create_graph the
gradients stay differentiable. Hooks the block registers stay as the first run left them. A
result that lies behind another (an intermediate returned beside what the block computed from
it) comes from a node of its own, an input of the other's, so that its whole gradient reaches
it: one more recomputation per such stage.

State a block keeps on a Module from one call to the next (an RNN's h: Module.__setattr__ notes
each Variable attribute the block sets) is read again as the block found it: the recomputation
sets each such attribute back to that value and, when done, to what it holds then. After the
first run the attribute holds the node's result in place of the block's own Variable (one the
block left there without returning it, an LSTM's c, is a result of the node too), so the next
call reads what stands for the block outside it, and the block's graph is freed. The
recomputation's graph must read the same Variables from outside the block as the first run's,
found in the same order (two plain leaves with equal values count as the same: a constant made
anew); anything else (a weight replaced before backward, state changed on an object that is not
a Module) is refused, as its gradients would go elsewhere.
"""
import contextvars
import sys
import traceback

import backends

from . import engine, random
from . import variable as _variables
from .config import (Config, anomaly_on, enable_grad, is_grad_enabled, recomputation,
                     using_config)
from .function import Function, View, _base_of
from .variable import Variable, sequence, share_versions, variables_returned

__all__ = ["checkpoint"]

# While a checkpointed block first runs: a list that each Variable attribute of a Module the
# block sets (an RNN's h) joins as (module, name, the value it replaces); Module.__setattr__
# adds to it (note_state). None otherwise, and during a recomputation, which puts back what it
# sets.
states_set = contextvars.ContextVar("gradcore.states_set", default=None)
_ABSENT = object()  # an attribute the module did not have


def note_state(module, name):
    """Module.__setattr__'s hook: `module.name`, a Variable or about to be one, is set while a
    checkpointed block first runs."""
    states = states_set.get()
    if states is not None:
        states.append((module, name, module.__dict__.get(name, _ABSENT)))


def checkpoint(fn, /, *args, use_reentrant=None, preserve_rng_state=True,
               determinism_check="default", debug=False, **kwargs):
    """fn(*args, **kwargs), recorded as one node that recomputes fn during backward instead of
    keeping its intermediate arrays. `fn` returns a Variable or a tuple of Variables; `args` and
    `kwargs` may mix Variables, arrays and other values (passed as they are). PyTorch's
    `use_reentrant`, `preserve_rng_state`, `determinism_check` and `debug` are taken and change
    nothing: the recomputation always draws the first run's random numbers and is compared
    with the first run, and it runs inside backward's walk, as use_reentrant=False does.

    The recomputation must see what the first run saw. gradcore sees to that for the random
    numbers the block's ops draw, batch norm's running statistics, and Variables the block keeps
    on a Module from one call to the next (an RNN's `h`: checkpointing an RNN one step at a time
    gives the gradients of the plain run, and backward leaves `rnn.h` as it was; truncated
    backprop, `h.unchain_backward()`, cuts the step's node inside too). Whatever else
    the block reads from outside must stay until backward: backward raises RuntimeError where
    the recomputation reads other Variables from outside than the first run did (a weight
    replaced, `lin.W = Parameter(...)`, before backward: replace it after; state the block
    changes on an object that is not a Module: checkpoint a function that takes the state and
    returns the new one), and arrays changed in place outside gradcore are not seen at all."""
    if determinism_check not in ("default", "none"):
        raise ValueError(f"checkpoint: determinism_check must be 'default' or 'none' (PyTorch's; "
                         f"the recomputation is always compared), got {determinism_check!r}")
    if kwargs:  # arguments as the positional ones are (a Variable, an array: the block's input)
        fn, args = _by_keyword(fn, len(args), list(kwargs)), (*args, *kwargs.values())
    where = [i for i, a in enumerate(args) if isinstance(a, Variable) or _is_array(a)]
    if not where:
        raise TypeError("checkpoint: needs at least one Variable or array among the arguments, "
                        "the block's input")
    if not is_grad_enabled():
        # no backward can follow, so nothing to recompute: a plain call (a lazy layer may be
        # sized through it), but fn still sees Variables and must return them, as with grad on
        out = fn(*_filled(args, where, [args[i] if isinstance(args[i], Variable)
                                        else Variable(args[i], requires_grad=False)
                                        for i in where]))
        _results(out)
        return out
    # in anomaly mode: the stack its errors show for the block's ops, recomputed in backward
    called_at = _called_at() if anomaly_on() else None
    first = args[where[0]]
    backend = first.backend if isinstance(first, Variable) else backends.backend_of(first)
    device = first.device if isinstance(first, Variable) else backend.device_of(first)
    # an array is a constant, as the node's call makes it for the recomputation (and an op
    # makes it in the plain call): requiring grad in the first run only, it would have the
    # block's first ops on it (x / 255) recorded there and not in the recomputation
    leaves = [_Argument(args[i]) if isinstance(args[i], Variable)
              else Variable(args[i], requires_grad=False) for i in where]
    start = next(sequence)
    draws = random.DrawLog(backend, device)
    # what the first run sets on modules, writes into Variables, makes, and hooks it registers
    noted = (states_set, _variables.block_writes, _variables.made_in_block,
             _variables.hooks_registered)
    tokens = [var.set(_Writes(start) if var is _variables.block_writes else [])
              for var in noted]
    try:
        with _variables.block_running(), enable_grad(), draws:
            out = fn(*_filled(args, where, leaves))
    finally:
        states, writes, made, registered = lists = [var.get() for var in noted]
        for var, token in zip(noted, tokens):
            var.reset(token)
    for var, inner in zip(noted, lists):
        # a block inside another's first run (or its hooks inside another's recomputation,
        # which takes them off): the other's too
        outer = var.get()
        if outer is not None:
            outer.merge(inner) if isinstance(outer, _Writes) else outer.extend(inner)
    if writes:
        _check_writes(writes, made, states, registered, draws, start)
    several = isinstance(out, tuple)
    outputs = _results(out)
    count = len(outputs)
    # each module attribute the block set, once, with the value the block found there (read
    # again by its recomputation), and the Variables the block left there that it computed but
    # did not return (an LSTM's c): results of the node too, for the attribute to hold, as the
    # block's own would keep its whole graph alive
    found = {}
    for m, name, before in states:
        found.setdefault((id(m), name), (m, name, before))
    states = list(found.values())
    returned = set(map(id, outputs))
    left = [(m, name, m.__dict__.get(name, _ABSENT)) for m, name, _ in states]
    kept = [(m, name) for m, name, y in left if isinstance(y, Variable) and id(y) not in returned
            and y.creator is not None and y.creator.sequence > start]
    outputs = (*outputs, *(m.__dict__[name] for m, name in kept))
    # what checkpoint returns, position by position. As the block returned them: a result with
    # no graph in the block (a detached value, an index), a Variable from outside it (a
    # Parameter); an argument: the caller's Variable, as without checkpoint; a result the block
    # computed: the output of a node below
    results = list(outputs)
    passed = {id(leaf): args[i] for leaf, i in zip(leaves, where)}
    computed = {}  # position -> the first position of the same result (one returned twice)
    at = {}  # id -> that first position
    for k, y in enumerate(outputs):
        if id(y) in passed:
            if isinstance(passed[id(y)], Variable):
                results[k] = passed[id(y)]
        elif y.creator is not None and y.creator.sequence > start:
            computed[k] = at.setdefault(id(y), k)
    if not computed:  # nothing to differentiate, so nothing to recompute
        _rebind(left, passed, at, results)
        return _returned(type(out), results, several)
    ours = [outputs[k] for k in at.values()]
    outside = _outside_variables(ours, leaves, start)
    nodes = [Checkpoint(fn, args, where, draws, Config.train, stage,
                        (list(at.values()), count, kept, states), called_at)
             for stage in _stages(ours, list(at.values()), leaves, start)]
    # the leaves the block made (Variable(...) in it) that the nodes read and no result is:
    # made anew by each run, only the recomputation's one sees the gradient (a returned one is
    # the caller's: see Checkpoint._check_replaced)
    returned, made = set(map(id, results)), set(map(id, made))
    own = {id(x) for x in outside if id(x) in made and id(x) not in returned}
    made_returned = {id(x) for x in outside if id(x) in made and id(x) in returned}
    # the positions of the results whose arrays the block's gradcore ops made: an outer
    # block may write into those (_made_by_the_block)
    fresh = {k for k in at.values()
             if _made_by_the_block(outputs[k], start, writes.detached, writes.replaced,
                                   writes.changed)}
    for node in nodes:
        node.made_inside, node.made_returned, node.fresh = own, made_returned, fresh
    kind = type(out)
    # the write log each result shared in the first run: a View's result (v[0:2], W.T) shares
    # its input's there
    shared = [getattr(y, "_writes", None) for y in outputs]
    del out, outputs, ours  # the block's graph goes: only the nodes' inputs stay
    inputs = [args[i] for i in where] + outside
    firsts = [getattr(x, "_writes", None) for x in (*leaves, *outside)]  # the same, for inputs
    for node in nodes:
        given = [*inputs, *[results[k] for k in node.behind]]
        ys = node(*given)
        if called_at is not None and getattr(node, "_anomaly", None) is not None:
            node._anomaly.stack = called_at  # where the block was called, not this line
        for k, y in zip(node.positions, ys if isinstance(ys, tuple) else (ys,)):
            results[k] = y
            # an input's array or a view of it (a.T): as View's results. Where the library
            # cannot tell (array-api-strict), _base_of would take any result for a view of the
            # first input (sin(v) * 2 too): the first run's View ops say which one it is
            x = _base_of(y, given) if hasattr(y.xp, "may_share_memory") else _viewed(
                y, shared[k], given, [*firsts, *(shared[b] for b in node.behind)])
            if x is not None:
                share_versions(x, y)
    for k, j in computed.items():
        results[k] = results[j]
    _rebind(left, passed, at, results)
    return _returned(kind, results[:count], several)


def _is_array(a):
    """Whether the argument `a` is an array, which the block gets as a constant Variable; a
    NumPy scalar (np.float64(2.0)) is passed as it is, a number as ops take it (weak: float32
    data stays float32), as in the plain call."""
    backend = backends.backend_of(a)
    return backend is not None and a.__class__ not in backend.scalar_types


def _rebind(left, passed, at, results):
    """Each module attribute the block set to one of its own Variables (`left`: (module, name,
    value)) set again to what stands for it outside the block: the caller's Variable for an
    argument, the node's result for a Variable the block computed (`at`: its position among
    `results`), as the next call must read it."""
    for module, name, y in left:
        if id(y) in passed:
            if isinstance(passed[id(y)], Variable):
                setattr(module, name, passed[id(y)])
        elif id(y) in at:
            setattr(module, name, results[at[id(y)]])


def _viewed(y, log, given, logs):
    """The Variable of `given` whose array is y's, or whose write log in the block's first run
    (`logs`, one per input) y's shared then (`log`: y came from it through View ops, which take
    their result for a view where the library cannot tell, as without checkpoint); None if
    neither."""
    for x, mine in zip(given, logs):
        if isinstance(x, Variable) and (x._data is y._data or mine is not None and mine is log):
            return x
    return None


def _returned(kind, results, several):
    """The results as checkpoint returns them: a namedtuple fn returned comes back as one, as it
    does with grad off."""
    if not several:
        return results[0]
    return kind._make(results) if hasattr(kind, "_make") else tuple(results)


class _Argument(Variable):
    """The block's copy of a Variable argument `caller` in its first run. A hook registered on
    it is registered on the caller's Variable too, as without checkpoint (the recomputation
    runs on that one and registers nothing that stays: see _take_off), and its handle takes
    it off both; retain_grad() is the caller's."""

    __slots__ = ("_caller",)

    def __init__(self, caller):
        # one that requires no grad (an input batch) is a constant here as in the recomputation
        super().__init__(caller.data, requires_grad=caller.requires_grad)
        self._caller = caller

    def register_hook(self, hook):
        # the caller's first: it refuses as without checkpoint (it does not require grad)
        there = self._caller.register_hook(hook)
        return _Handles(there, super().register_hook(hook))

    def register_post_accumulate_grad_hook(self, hook):
        there = self._caller.register_post_accumulate_grad_hook(hook)  # refuses a computed one
        return _Handles(there, super().register_post_accumulate_grad_hook(hook))

    def retain_grad(self):
        self._caller.retain_grad()


class _Handles:
    """The handles of one hook registered on two Variables: remove() takes it off both."""

    __slots__ = ("handles",)

    def __init__(self, *handles):
        self.handles = handles

    def remove(self):
        for handle in self.handles:
            handle.remove()


def _stages(outputs, positions, leaves, start):
    """The block's computed results `outputs` (at `positions` among fn's) split among nodes, one
    (arrays, positions, positions of earlier results it reads) each. A result that lies behind
    another is an output of an earlier node that the other's takes as an input: its hooks,
    retain_grad and gradcore.grad then see the gradient coming through the other too. Most
    blocks are one node."""
    behind = _behind(outputs, leaves, start) if len(outputs) > 1 else [()]
    if not any(behind):
        return [(tuple(y.data for y in outputs), tuple(positions), ())]
    stage = {}
    # oldest first: a result behind another was made before it
    for j in sorted(range(len(outputs)), key=lambda j: outputs[j].creator.sequence):
        stage[j] = max((stage[b] + 1 for b in behind[j]), default=0)
    parts = []
    for n in range(max(stage.values()) + 1):
        mine = [j for j in range(len(outputs)) if stage[j] == n]
        read = sorted({b for j in mine for b in behind[j]})
        parts.append((tuple(outputs[j].data for j in mine), tuple(positions[j] for j in mine),
                      tuple(positions[b] for b in read)))
    return parts


def _behind(outputs, leaves, start):
    """For each of the block's computed results, the indices of the others that lie behind it
    (reached without passing through a third one)."""
    index = {id(y): j for j, y in enumerate(outputs)}
    own = set(map(id, leaves))
    found = []
    for y in outputs:
        behind, seen = set(), set()
        todo = list(y.creator.inputs)
        while todo:
            x = todo.pop()
            if not isinstance(x, Variable) or id(x) in own or id(x) in seen:
                continue
            seen.add(id(x))
            if id(x) in index:
                behind.add(index[id(x)])
            elif x.creator is not None and x.creator.sequence > start:
                todo.extend(x.creator.inputs)
        found.append(behind)
    return found


def _read_by(outputs):
    """The ids of the Variables the graph behind `outputs` reads (and of the outputs)."""
    read, seen = {id(y) for y in outputs if isinstance(y, Variable)}, set()
    stack = [y.creator for y in outputs if isinstance(y, Variable) and y.creator is not None]
    while stack:
        f = stack.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        for x in f.inputs:
            if isinstance(x, Variable):
                read.add(id(x))
                if x.creator is not None:
                    stack.append(x.creator)
    return read


def _results(out):
    """fn's results as a tuple, each checked to be a Variable."""
    return variables_returned(out, "checkpoint: fn must return a Variable or a tuple of Variables")


def _by_keyword(fn, count, names):
    """fn, called with `count` positional arguments and then the values of the keyword
    arguments `names`, in that order."""
    def block(*values):
        return fn(*values[:count], **dict(zip(names, values[count:])))
    return block


def _made_by_the_block(v, start, detached, replaced=(), changed=()):
    """Whether v's array is one an op of the block (recorded after `start`) made anew, as far
    as the ops that made v tell: a view (a View op, or a result sharing its input's write log)
    is followed back to its input, a Variable detached in the block takes the verdict given
    when it was detached (`detached`: id -> True or False), a nested checkpoint's result is
    its block's own only where that block's ops made it (Checkpoint.fresh), and one of
    gradcore's other ops makes a new array. An author's Function may return any array (an
    argument's, a view of one, one it holds), which cannot be told reliably where the library
    cannot say which arrays share memory: its results are not the block's own. Nor is a
    Variable the block gave another array (`replaced`: ids), which may be anyone's
    (t.data = buf.data). A View op's result that is no view of its input's array (a copy:
    fancy indexing, a reshape of a transposed view) is a new array, where that input still
    holds the array it had (`changed`: ids of those given another array or released)."""
    while True:
        if id(v) in replaced:
            return False
        verdict = detached.get(id(v))
        if verdict is not None:
            return verdict
        creator = v.creator
        if creator is None or creator.sequence <= start:
            return False
        if type(creator) is Checkpoint:
            return any(y is v and k in creator.fresh for k, y in zip(
                creator.positions, (ref() for ref in creator.outputs)))
        if not type(creator).__module__.startswith("gradcore."):
            return False
        if isinstance(creator, View):  # its input's memory, whatever their write logs say now
            x, data, backend = creator.inputs[0], v._data, v._backend
            if data is not None and data is not x._data and id(x) not in changed and (
                    backend.owns_memory(data) or not backend.may_view(data, x._data)):
                return True  # a copy (fancy indexing, a reshape of a transposed view)
            v = x
            continue
        log, data = getattr(v, "_writes", None), v._data
        base = next((x for x in creator.inputs if log is not None and getattr(
            x, "_writes", None) is log or data is not None and id(x) not in changed
            and getattr(x, "_data", None) is data), None)  # not one given that array since
        if base is None:  # a new array; not its input's own object (Dask's concatenate of one)
            return True
        v = base


class _Writes(list):
    """The writes a run of a block begun at `start` made (variable.block_writes), as
    (Variable, how, before, whether the array was the block's own then): each judged as it is
    made, by what the Variable held then (a view released or given other data afterwards is
    judged as the view it was), with the verdict on each Variable detached in the run, given
    when it was detached (`detached`: id -> True or False), and the Variables given other data
    (`replaced`), held so that their ids stay theirs."""

    def __init__(self, start):
        super().__init__()
        self.start, self.detached, self.replaced, self.kept = start, {}, {}, []
        self.changed = {}  # id -> each Variable given other data or released

    def note(self, v, how, before=None):
        if how == "detached":  # judged now: what `before` holds now is what v holds
            self.detached[id(v)] = _made_by_the_block(before, self.start, self.detached,
                                                      self.replaced, self.changed)
            self.kept.append(v)
            return
        if how == "release":
            # no memory written: the block may drop what it holds (DeZero's t.data = None)
            self.changed[id(v)] = v
            return
        own = None
        if how in ("set", "in place", "given"):
            own = _made_by_the_block(v, self.start, self.detached,
                                     self.replaced if how == "in place" else (), self.changed)
            if how != "in place":
                self.replaced[id(v)] = self.changed[id(v)] = v  # now maybe anyone's array
        self.append((v, how, before, own))

    def merge(self, inner):
        """The writes of a block run inside this one's run."""
        self.extend(inner)
        self.detached.update(inner.detached)
        self.replaced.update(inner.replaced)
        self.changed.update(inner.changed)
        self.kept.extend(inner.kept)


def _written(writes, made):
    """{id: (Variable, how)} of the writes (a _Writes) a run of a block made into Variables
    but arrays its ops made and constants it made (`made`, the ids of the Variables it made
    with Variable(...)) that had no data before; and those of them that were lazily created
    weights."""
    created, written = {}, {}
    for v, how, _, own in writes:
        if how == "statistics" or own:
            continue  # batch norm's (updated once: see functions.nn); an op's result, each run's
        if how == "given" and isinstance(v, _variables.Parameter):
            created[id(v)] = v
        elif not (how == "given" and id(v) in made):
            written.setdefault(id(v), (v, how))
    return written, created


def _write_described(x, how):
    """"the Variable ... (by an in-place Function)" or "... (its .data set)", for errors."""
    from .engine import _describe  # the engine imports this module
    return (f"{_describe(x)} "
            f"({'by an in-place Function' if how == 'in place' else 'its .data set'})")


def _check_written_again(writes, made):
    """RuntimeError if a recomputation wrote into a Variable it did not
    make: its first run, checked, wrote only into its own, so this is one that run made and
    kept where the recomputation finds it (in a dict or a global), now written twice."""
    written, _ = _written(writes, set(map(id, made)))
    if written:
        raise RuntimeError(
            "checkpoint: computed again during backward, the block wrote into "
            f"{_write_described(*next(iter(written.values())))}, which was there before it ran "
            "again: one its first run made and kept (in a dict or a "
            "global, read again by the recomputation instead of computed), which is now written "
            "twice; keep no state between runs of a checkpointed block, or pass it in and "
            "return the new one")


def _check_writes(writes, made, states, registered, draws, start):
    """RuntimeError if the block's first run wrote into Variables (`writes`: see
    variable.block_writes) but arrays its ops made (_made_by_the_block), and constants it made
    itself (Variable(None), then its data: `made`): weights it created lazily, which its
    recomputation would not create again, nor draw their initializers' numbers for; or data it
    set or wrote in place, which its recomputation would write again: into a Variable from
    outside, or into whatever one it made holds then (one kept from an earlier call, an array
    from outside: Variable(buf)). What the first run changed is put back first, so that the
    call the error advises starts where this one did: the weights uncreated (and the statistics
    a BatchNorm made beside them), batch norm's running statistics, the modules' attributes it
    set (an RNN's h), the hooks it registered, and the random generator where no other
    thread's op drew from it meanwhile."""
    made = set(map(id, made))
    written, created = _written(writes, made)
    if not created and not written:
        return
    if created:
        # every one is named: which of them drew random numbers (W, not a zero b) is not known
        error = RuntimeError(
            f"checkpoint: the block created {_names(list(created.values()))} as it ran; its "
            "recomputation would not create them again, nor draw the random numbers their "
            "initializers drew; create them first: call the model once outside checkpoint, or "
            "give the layer its input size")
    else:
        x, how = next(iter(written.values()))
        made_here = id(x) in made and id(x) not in writes.detached  # Variable(...) in the block
        whose = ("a Variable the block made: its recomputation would write again into what "
                 "the one it reads then holds (an array from outside, as in Variable(buf), or "
                 "a Variable kept from an earlier call)" if made_here else
                 "not an array the block's gradcore ops made (one from outside, computed under "
                 "no_grad(), which keeps no record, or returned by a Function of yours, which "
                 "may hand out any array): its recomputation in backward would write into it "
                 "again")
        error = RuntimeError(
            f"checkpoint: the block wrote into {_write_described(x, how)}, {whose}; do the write "
            "outside checkpoint, or write the result into a new array (y = x + 1, not x += 1)")
    for v, how, before, _ in reversed(writes):  # the first value found wins
        if how == "given" and v._data is not None:
            v.data = None
        elif how == "statistics":
            backend, array, copy = before
            backend.assign(array, copy)
    for module, name, before in reversed(states):
        _put(module, name, before)
    _take_off(registered, start)
    if not draws.others and draws.state is not None:
        # no other thread's op drew meanwhile; one's own numpy.random calls cannot be told from
        # the block's (as in its recomputation: see random.DrawLog), and are drawn again
        draws.backend.set_random_state(draws.device, draws.state)
    raise error


def _names(weights):
    """The weights in words: "a weight ('W', shape (3, 4))", "2 weights ('W', ...; 'b', ...)"."""
    named = "; ".join(f"{x.name!r}, shape {tuple(x.shape)}" if x.name
                      else f"shape {tuple(x.shape)}" for x in weights)
    return f"a weight ({named})" if len(weights) == 1 else f"{len(weights)} weights ({named})"


def _filled(args, where, values):
    """args with the array arguments (positions `where`) replaced by `values`."""
    filled = list(args)
    for i, v in zip(where, values):
        filled[i] = v
    return filled


def _outside_variables(outputs, leaves, start):
    """The Variables the block's graph reads from outside: leaves other than its own arguments,
    and results of Functions recorded before it began (those that need no gradient too: a
    write into one before backward must stop the recompute, as it stops a backward)."""
    own = set(map(id, leaves))
    found, seen = {}, set()
    todo = list(outputs)
    while todo:
        x = todo.pop()
        if not isinstance(x, Variable) or id(x) in own or id(x) in seen:
            continue
        seen.add(id(x))
        if x.creator is None or x.creator.sequence < start:
            found[id(x)] = x
        else:
            todo.extend(x.creator.inputs)
    return list(found.values())


class Checkpoint(Function):
    """The node of a checkpointed block: its forward hands on the results computed when the
    block ran; its backward computes the block again and differentiates it."""

    def __init__(self, fn, args, where, draws, train, stage, block, called_at):
        self.fn, self.args, self.where = fn, args, where
        # in anomaly mode, the stack of the call of checkpoint as anomaly errors show it (see
        # _as_first_run); None otherwise
        self.called_at = called_at
        self.draws, self.train = draws, train  # a closed random.DrawLog
        # the arrays it hands on, which of fn's results they are, and which of fn's results
        # (other nodes' outputs) are its last inputs: see _stages
        self.results, self.positions, self.behind = stage
        # the first position of each result the block computed, how many fn returned, the
        # module attributes that hold the others (see checkpoint), and each module attribute
        # the block set, with the value it found there
        self.computed, self.count, self.kept, self.states = block
        # once cut inside by unchain_backward: the block's results computed again, and the
        # node's inputs as that graph has them (see cut_inside); None before
        self.again = self.targets = None
        # id -> the Variable the latest recomputation read where the first run read another,
        # alike (_check_reads); the ids of the leaves among the inputs the block made, and of
        # those of them it returns
        self.read_instead, self.made_inside, self.made_returned = {}, set(), set()
        self.fresh = set()  # positions of results the block's ops made (see checkpoint)

    def forward(self, *xs):
        results, self.results = self.results, None  # the arrays live on in the outputs only
        return results if len(results) > 1 else results[0]

    def zeros_for_output(self, i):
        """The walk's gradient for a result it did not reach (unused or dead): None, not zeros,
        so backward leaves that result out and an argument only it reads gets no gradient, as
        without checkpoint (WeightDecay would act on a zero one)."""
        return None

    def cut_inside(self, root):
        """`root.unchain_backward()` reached this node: cut the block's own ops as a plain run's
        unchain_backward would. Those ops exist only when the block is computed again, so
        while a result of the node still leads into it (root itself, or one not behind root),
        the block is computed again now, while it reads what its first run read (a weight an
        optimizer writes next is not read again), and the links behind each result behind root
        are cut in that graph; backward then differentiates what is left (the op that made
        root, say). Otherwise, or where a Variable the block read was written since, nothing
        can reach the block again, or it cannot be computed as it ran: backward hands its
        inputs nothing. What the node kept to compute the block goes, and with it the graph
        before the cut."""
        cut, reached = [], False
        for i, ref in enumerate(self.outputs):
            y = ref()
            if y is None:
                continue
            if y is root:  # its own op stays: what is behind it is cut
                cut.append((self.positions[i], False))
            elif y.creator is not self:  # unchained behind root: a leaf now, as in the block
                cut.append((self.positions[i], True))
            reached = reached or y.creator is self
        if reached and self.again is None:
            try:
                engine._check_versions(self)
            except RuntimeError:
                reached = False
            else:
                self.again = self._computed_again("at unchain_backward, to cut inside it")
                # the graph kept till backward holds each living result once, as a plain
                # run's does: the values computed again are the first run's (checked)
                for k, ref in zip(self.positions, self.outputs):
                    y = ref()
                    if y is not None and y._data is not None and not y._backend.lazy:
                        self.again[k]._data = y._data
        if reached:
            if self.targets is None:
                self.targets = self._targets(self.again)
            for k, itself in cut:
                self.again[k].unchain_backward()
                if itself:
                    self.again[k].unchain()
            # the inputs that graph still reads, alone: the version check leaves a weight
            # alone that only the ops behind the cut read (an optimizer step between
            # truncated-backprop chunks), and a state from before the cut is let go
            read = _read_by(self.again)
            kept = [i for i, t in enumerate(self.targets) if id(t) in read]
            self.targets = tuple(self.targets[i] for i in kept)
        else:
            kept, self.again, self.targets = [], None, None
        self.inputs = tuple(self.inputs[i] for i in kept)
        self.needs_input_grad = tuple(self.needs_input_grad[i] for i in kept)
        record = getattr(self, "_anomaly", None)
        if record is not None:  # anomaly mode's fingerprints name the inputs by position
            renamed = {f"input {old}": f"input {new}" for new, old in enumerate(kept)}
            record.fingerprints = [(renamed.get(what, what), fingerprint)
                                   for what, fingerprint in record.fingerprints
                                   if what in renamed or not what.startswith("input ")]
        self.fn = self.args = self.draws = self.states = None

    def backward(self, *gys):
        create_graph = is_grad_enabled()
        if self.again is not None:  # computed again already, and cut (cut_inside)
            outputs, targets = self.again, self.targets
            # a result unchained since is a leaf: what reaches it goes no further, as in a
            # plain run (the walk still hands it here, the node's output once)
            gys = [g if (y := ref()) is not None and y.creator is self else None
                   for g, ref in zip(gys, self.outputs)]
        elif self.fn is None:  # cut inside, nothing left to reach
            return (None,) * len(self.inputs)
        else:
            outputs = self._computed_again("during backward")
            targets = self._targets(outputs)
        if create_graph:
            self._check_replaced()
        pairs = [(outputs[k], g) for k, g in zip(self.positions, gys) if g is not None]
        # one position per Variable: one passed twice, or passed and also read from outside,
        # gets its whole gradient once (grad_within gives it at each position)
        first = {}
        for i, (x, need) in enumerate(zip(self.inputs, self.needs_input_grad)):
            if need:
                first.setdefault(id(x), i)
        if not pairs or not first:
            return (None,) * len(self.inputs)
        # the gradients reaching the node's inputs from the block; the walk this backward runs
        # in carries them on behind the inputs
        gradients = dict(zip(first.values(), engine.grad_within(
            [y for y, _ in pairs], [targets[i] for i in first.values()], [g for _, g in pairs],
            create_graph)))
        return tuple(gradients.get(i) for i in range(len(self.inputs)))

    def _check_replaced(self):
        """With create_graph: RuntimeError where a leaf that requires grad, from outside the
        block or made and returned by it, is not the one the recomputation read, but an equal
        one (read_instead: replaced before backward, or made anew). Its gradient is the same,
        but the graph of it would reach the other leaf: a second derivative would go there,
        not to the leaf the caller has."""
        for x in self.inputs:
            instead = self.read_instead.get(id(x))
            if instead is None or not x.requires_grad or id(x) in self.made_inside:
                continue
            if id(x) in self.made_returned:
                raise RuntimeError(
                    f"checkpoint: the block made {_what(x)} and returns it; computed again "
                    "during backward (create_graph), it makes another, which the gradient's "
                    "graph would reach, not the one returned: make it outside the block and "
                    "pass it in")
            raise RuntimeError(
                f"checkpoint: computed again during backward (create_graph), the block read "
                f"{_what(instead)} where its first run read {_what(x)}: it was replaced "
                "between forward and backward, and the gradient's graph would reach the new "
                "one, not it; replace it after backward, or pass it as an argument")

    def _computed_again(self, when):
        """The block's results computed again from the node's arguments, in the train mode of
        its first run, checked against that run's (`when`: for the message)."""
        with enable_grad(), using_config("train", self.train), recomputation():
            outputs = self._run_again(self.inputs[:len(self.where)])
        self._check_values(outputs, when)
        return outputs

    def _targets(self, outputs):
        """The node's inputs as the block computed again (`outputs`) has them: the results
        before this node's made again, and a constant it made again (or one replaced by an
        equal one) where it read it: the gradient reaching that one is the first's."""
        instead = self.read_instead
        before = self.inputs[:len(self.inputs) - len(self.behind)]
        return (*(instead.get(id(x), x) for x in before), *(outputs[k] for k in self.behind))

    def _run_again(self, arguments):
        """The block's results from `arguments` as a tuple (the Variables it left on modules
        after those it returned), with the random numbers it drew, the running statistics and
        the module attributes it read the first time; the attributes are put back as they are
        now. Refused where it read other Variables from outside than the first time."""
        start = next(sequence)
        registered, writes, made = [], _Writes(start), []
        token = _variables.hooks_registered.set(registered)
        writes_token = _variables.block_writes.set(writes)
        made_token = _variables.made_in_block.set(made)
        unnoted = states_set.set(None)
        now = [module.__dict__.get(name, _ABSENT) for module, name, _ in self.states]
        try:
            for module, name, before in self.states:
                _put(module, name, before)
            with _variables.block_running(), self.draws.replay():
                out = self.fn(*_filled(self.args, self.where, arguments))
            outputs = out if isinstance(out, tuple) else (out,)
            if len(outputs) == self.count:
                outputs += tuple(module.__dict__.get(name) for module, name in self.kept)
        finally:
            for (module, name, _), value in zip(self.states, now):
                _put(module, name, value)
            states_set.reset(unnoted)
            _variables.hooks_registered.reset(token)
            _variables.block_writes.reset(writes_token)
            _variables.made_in_block.reset(made_token)
            _take_off(registered, start)
        _check_written_again(writes, made)
        self._check_reads(outputs, arguments, start)
        if self.called_at is not None and anomaly_on():
            _restack(outputs, start, self.called_at)
        return outputs

    def _check_values(self, outputs, when):
        """Refuse a recomputation whose results (`outputs`, all of fn's) differ from the first
        run's, where those are still alive: backward would differentiate another
        function than the one that gave them (random numbers the block drew past gradcore and
        numpy.random, Python's random or a NumPy Generator; a value read from outside that
        changed). The first run's results are the node's outputs, held weakly as every node's:
        checkpoint keeps no array more for this (one written through gradcore since stopped the
        walk before this node: see engine._check_versions). Not checked: a result no longer
        alive or released (y.data = None), one on a lazy backend (Dask: comparing would compute
        the block, which backward leaves to the caller), and while gradcore.compile records a
        step (a comparison would be a host read of traced arrays there)."""
        recorder = _variables.step_recorder
        if recorder is not None and recorder.is_active():
            return
        for k, ref in zip(self.positions, self.outputs):
            y = ref()
            if y is None or y._data is None or y._backend.lazy:
                continue
            again = outputs[k]
            if again._backend is y._backend and _same_values(y._data, again._data, y._backend):
                continue
            raise RuntimeError(
                f"checkpoint: computed again {when}, the block gave other values than "
                f"the first time (its result {k}, {_what_array(y)}): backward would "
                "differentiate another function than the one that gave that result. The block "
                "must compute the same from the same inputs. Likely causes: random numbers drawn "
                "past gradcore's random ops and numpy.random's global functions (Python's "
                "random, a NumPy Generator such as np.random.default_rng()): use F.dropout or "
                "numpy.random's functions (np.random.rand, drawn again as the first time), or "
                "draw the numbers outside the block and pass them as arguments; a value the "
                "block reads from outside (a global, an array or number it closes over) that "
                "changed before backward: pass it as an argument; or the result's array written "
                "in place outside gradcore (y.data[...] = v) before backward")

    def _check_reads(self, outputs, arguments, start):
        """Refuse a recomputation (begun at sequence number `start`) whose graph reads other
        Variables from outside the block than the first run's did, in the order found: their
        gradients would go to Variables the first run did not read, and those it read would get
        none. Two plain leaves (not Parameters) with equal values count as the same: the block
        may make a constant anew each time (an array passed to an op)."""
        if len(outputs) != self.count + len(self.kept) or not all(
                isinstance(outputs[k], Variable) for k in self.computed):
            raise RuntimeError(
                "checkpoint: computed again during backward, the block returned other results "
                "than the first time (or left other Variables on modules): what a checkpointed "
                "block does must depend on its inputs alone")
        own = set(map(id, arguments))
        read = _outside_variables([outputs[k] for k in self.computed], arguments, start)
        first = [x for x in self.inputs[len(self.where):len(self.inputs) - len(self.behind)]
                 if id(x) not in own]  # one read from outside and passed too: passed now
        self.read_instead = {}
        if len(read) == len(first) and all(a is b for a, b in zip(read, first)):
            return
        for i in range(max(len(read), len(first))):
            a = first[i] if i < len(first) else None
            b = read[i] if i < len(read) else None
            if a is not b and _same_constant(a, b):
                # a gradient reaches b, not a: the same, as the two are alike (a leaf that
                # requires grad replaced by an equal one before backward gets it, as without
                # checkpoint)
                self.read_instead[id(a)] = b
            elif a is not b:
                if _same_constant(a, b, values=False):
                    raise RuntimeError(
                        f"checkpoint: computed again during backward, the block read a "
                        f"constant ({_what(b)}, Variable {i + 1} it reads from outside the "
                        "block, made in it or not) with other values than the first time, so "
                        "backward would differentiate another function. Likely causes: random "
                        "numbers drawn past gradcore's random ops and numpy.random's global "
                        "functions (a mask from Python's random or a NumPy Generator such as "
                        "np.random.default_rng()): use F.dropout or numpy.random's functions, "
                        "or draw the numbers outside the block and pass them as arguments; or a "
                        "value the block reads from outside that was changed or replaced before "
                        "backward: pass it as an argument")
                raise RuntimeError(
                    f"checkpoint: computed again during backward, the block read {_what(b)} "
                    f"where its first run read {_what(a)} (Variable {i + 1} it reads from "
                    "outside the block): one was replaced between forward and backward (a "
                    "layer's weight set anew: replace it after backward), or the block reads "
                    "state kept from one call to the next that it changes itself, on an object "
                    "that is not a Module: checkpoint a function that takes the state as an "
                    "argument and returns the new one")


def _put(module, name, value):
    """module.name = value (_ABSENT: no such attribute) as it was, with nothing else noted (not
    a change to the module's structure): gradcore.checkpoint's recomputation sets an attribute
    for the block to read, and then puts it back."""
    if value is _ABSENT:
        if name in module.__dict__:
            object.__delattr__(module, name)
    else:
        object.__setattr__(module, name, value)


def _same_constant(a, b, values=True):
    """Whether `a` and `b` are plain leaves (not Parameters) alike in all a gradient depends on:
    requires_grad, dtype, shape, device and (if `values`) values (NaN where the other has
    NaN)."""
    if not (isinstance(a, Variable) and isinstance(b, Variable)) or isinstance(
            a, _variables.Parameter) or isinstance(b, _variables.Parameter) or (
            a.creator is not None or b.creator is not None):
        return False
    if a._data is b._data:
        return a.requires_grad == b.requires_grad
    if (a.requires_grad != b.requires_grad or a.dtype != b.dtype or a.shape != b.shape
            or a._backend is not b._backend or a.device != b.device):
        return False
    if not values:
        return True
    xp, x, y = a.xp, a.data, b.data
    same = x == y
    if _variables.dtype_kind(a._backend, a.dtype) != "integral":
        same = same | (x != x) & (y != y)
    return bool(xp.all(same))


def _same_values(x, y, backend):
    """Whether the array `y` (a recomputed result) holds x's values (the first run's): NaN where
    x has NaN. Exactly, bit for bit, wherever the same ops on the same inputs on the same device
    give the same bits, which is nearly always; but some libraries do not promise it: MKL's BLAS
    picks its kernels by the arrays' alignment in memory (unless MKL_CBWR is set), and adds made
    with atomics (CuPy's scatter_add) come in any order. So a floating-point difference no
    larger than rounding would make, sqrt(eps) of the largest finite magnitude in x, passes;
    the random numbers of another draw, a branch taken otherwise, a changed scale are far
    larger. Equal arrays, the usual case, cost one comparison and one reduction."""
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    xp = backend.xp
    equal = x == y
    if bool(xp.all(equal)):
        return True
    exact = equal | (x != x) & (y != y)
    if bool(xp.all(exact)):
        return True
    if _variables.dtype_kind(backend, x.dtype) == "integral":
        return False
    finite = xp.isfinite(x) & xp.isfinite(y)
    if not bool(xp.all(exact | finite)):  # an inf or a NaN on one side only
        return False
    # the others as zeros on both sides: inf - inf would warn
    zeros = xp.zeros_like(x)
    x, y = xp.where(finite, x, zeros), xp.where(finite, y, zeros)
    tolerance = float(xp.finfo(x.dtype).eps) ** 0.5 * xp.max(xp.abs(x))
    return bool(xp.all(xp.abs(x - y) <= tolerance))


def _what_array(y):
    """A block's result in words, for an error."""
    name = f" {y.name!r}" if y.name else ""
    return f"a Variable{name} of shape {tuple(y.shape)} and dtype {y.dtype}"


def _what(x):
    """A Variable read from outside a block, in words."""
    if x is None:
        return "nothing"
    kind = "Parameter" if isinstance(x, _variables.Parameter) else (
        "Variable" if x.creator is None else "Variable computed before the block")
    name = f" {x.name!r}" if x.name else ""
    return f"a {kind}{name} of shape {tuple(x.shape)}"


def _take_off(registered, start):
    """Take off the hooks a recomputation (begun at sequence number `start`) registered on
    Variables from before it (the block's arguments, Parameters it reads, whether or not its
    results depend on them): the first run registered them already, and registered again they
    would run once more in each later backward. Those on Variables it computed stay: its own
    differentiation runs them."""
    for x, handle in reversed(registered):
        if x.creator is not None and x.creator.sequence > start:
            continue
        handle._take_off(x)  # its own registration: not a copy the block or its caller added


# Anomaly mode's stacks. An op the recomputation runs records the stack of backward (the walk,
# this file, then the block); anomaly errors about it show the first run's instead: the call of
# checkpoint, then the block's frames below it, as without checkpoint.

_FILE = checkpoint.__code__.co_filename
_RUN_AGAIN = Checkpoint._run_again.__code__


def _as_first_run(stack, called_at):
    """`stack` (a traceback.StackSummary) as the block's first run had it: taken while a block
    is computed again (under Checkpoint._run_again), `called_at` (the first run's stack up to
    the call of checkpoint; None: that run was outside anomaly mode, and `stack` stays as it
    is) followed by the frames below the innermost _run_again; checkpoint's own frames left
    out."""
    last = None
    for i, frame in enumerate(stack):
        if frame.filename == _FILE and frame.name == "_run_again":
            last = i
    if last is None:
        return traceback.StackSummary.from_list([f for f in stack if f.filename != _FILE])
    if called_at is None:
        return stack
    return traceback.StackSummary.from_list(
        [*called_at, *(f for f in stack[last + 1:] if f.filename != _FILE)])


def _called_at():
    """The stack of checkpoint's caller, as the first run of the block that calls it had it
    where that block is being computed again (a checkpoint inside a checkpointed block)."""
    caller = sys._getframe(2)
    running = caller
    while running is not None and running.f_code is not _RUN_AGAIN:
        running = running.f_back
    outer = None if running is None else running.f_locals["self"].called_at
    return _as_first_run(traceback.extract_stack(caller), outer)


def _restack(outputs, start, called_at):
    """The stacks recorded by the ops of a recomputation (begun at sequence number `start`)
    that its results `outputs` come from, made the first run's (_as_first_run)."""
    todo = [y.creator for y in outputs if isinstance(y, Variable) and y.creator is not None]
    seen = set()
    while todo:
        f = todo.pop()
        if id(f) in seen or f.sequence <= start:
            continue
        seen.add(id(f))
        record = getattr(f, "_anomaly", None)
        if record is not None:
            record.stack = _as_first_run(record.stack, called_at)
        todo.extend(x.creator for x in f.inputs
                    if isinstance(x, Variable) and x.creator is not None)
