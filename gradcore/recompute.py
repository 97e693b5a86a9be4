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
gradients stay differentiable.
"""
import backends

from . import engine, random
from .config import Config, enable_grad, is_grad_enabled, recomputation, using_config
from .function import Function
from .variable import Variable, has_graph, sequence, variables_returned

__all__ = ["checkpoint"]


def checkpoint(fn, *args):
    """fn(*args), recorded as one node that recomputes fn during backward instead of keeping
    its intermediate arrays. `fn` returns a Variable or a tuple of Variables; `args` may mix
    Variables, arrays and other values (passed as they are)."""
    where = [i for i, a in enumerate(args) if isinstance(a, Variable) or backends.is_array(a)]
    if not where:
        raise TypeError("checkpoint: needs at least one Variable or array among the arguments, "
                        "the block's input")
    if not is_grad_enabled():
        # no backward can follow, so nothing to recompute: a plain call (a lazy layer may be
        # sized through it), but fn still sees Variables and must return them, as with grad on
        out = fn(*_filled(args, where, [args[i] if isinstance(args[i], Variable)
                                        else Variable(args[i]) for i in where]))
        _results(out)
        return out
    first = args[where[0]]
    backend = first.backend if isinstance(first, Variable) else backends.backend_of(first)
    device = first.device if isinstance(first, Variable) else backend.device_of(first)
    leaves = [Variable(args[i].data if isinstance(args[i], Variable) else args[i])
              for i in where]
    start = next(sequence)
    draws = random.DrawLog(backend, device)
    with enable_grad(), draws:
        out = fn(*_filled(args, where, leaves))
    several = isinstance(out, tuple)
    outputs = _results(out)
    # a result with no graph in the block (a detached value, an index) gets none from the node:
    # it comes back as the block returned it
    plain = {k: y for k, y in enumerate(outputs) if not has_graph(y)}
    if len(plain) == len(outputs):  # nothing to differentiate, so nothing to recompute
        return out
    # not those: the node would hold them, and refuse its backward after a write into one
    outside = _outside_variables([y for y in outputs if has_graph(y)], leaves, start)
    # lazily created weights, in the order they were made
    created = sorted((x for x in outside if _written_since(x, start)),
                     key=lambda x: x._writes.stamps[-1])
    if created:
        # every one is named: which of them drew random numbers (W, not a zero b) is not known
        raise RuntimeError(
            f"checkpoint: the block created {_names(created)} as it ran; its recomputation "
            "would not create them again, nor draw the random numbers their initializers drew; "
            "create them first: call the model once outside checkpoint, or give the layer its "
            "input size")
    node = Checkpoint(fn, args, where, draws, Config.train,
                      tuple(y.data for y in outputs) if several else outputs[0].data)
    kind = type(out)
    del out, outputs  # the block's graph goes: only the node's inputs stay
    results = node(*[args[i] for i in where], *outside)
    if plain:
        results = tuple(plain.get(k, y) for k, y in enumerate(results))
    # a namedtuple fn returned comes back as one, as it does with grad off
    return kind._make(results) if several and hasattr(kind, "_make") else results


def _results(out):
    """fn's results as a tuple, each checked to be a Variable."""
    return variables_returned(out, "checkpoint: fn must return a Variable or a tuple of Variables")


def _written_since(x, start):
    """Whether gradcore wrote x's data after sequence number `start`."""
    log = getattr(x, "_writes", None)
    return log is not None and bool(log.stamps) and log.stamps[-1] > start


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
    write into one before backward must stop the recompute, as it stops a backward). A result
    that is one of them, handed on as it is (a Parameter the block returns), counts too: its
    gradient reaches it through the node."""
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

    def __init__(self, fn, args, where, draws, train, results):
        self.fn, self.args, self.where = fn, args, where
        self.draws, self.train = draws, train  # a closed random.DrawLog
        self.results = results

    def forward(self, *xs):
        results, self.results = self.results, None  # the arrays live on in the outputs only
        return results

    def zeros_for_output(self, i):
        """The walk's gradient for a result it did not reach (unused or dead): None, not zeros,
        so backward leaves that result out and an argument only it reads gets no gradient, as
        without checkpoint (WeightDecay would act on a zero one)."""
        return None

    def backward(self, *gys):
        arguments = self.inputs[:len(self.where)]
        create_graph = is_grad_enabled()
        with enable_grad(), using_config("train", self.train), recomputation():
            out = self._run_again(arguments)
        outputs = out if isinstance(out, tuple) else (out,)
        pairs = [(y, g) for y, g in zip(outputs, gys)
                 if y.creator is not None and g is not None]
        # one position per Variable: one passed twice, or passed and also read from outside,
        # gets its whole gradient once (grad_within gives it at each position)
        first = {}
        for i, (x, need) in enumerate(zip(self.inputs, self.needs_input_grad)):
            if need:
                first.setdefault(id(x), i)
        gradients = {}
        if pairs and first:
            # the gradients reaching the node's inputs from the block; the walk this backward
            # runs in carries them on behind the inputs
            wanted = [self.inputs[i] for i in first.values()]
            gradients = dict(zip(first.values(), engine.grad_within(
                [y for y, _ in pairs], wanted, [g for _, g in pairs], create_graph)))
        for y, g in zip(outputs, gys):  # an input handed back as it is: its gradient as it is
            i = first.get(id(y))
            if y.creator is None and g is not None and i is not None:
                gradients[i] = g if gradients.get(i) is None else gradients[i] + g
        return tuple(gradients.get(i) for i in range(len(self.inputs)))

    def _run_again(self, arguments):
        """The block's results from `arguments`, with the random numbers it drew and the running
        statistics it read the first time."""
        with self.draws.replay():
            return self.fn(*_filled(self.args, self.where, arguments))
