"""A recorded step as a flat program: Python source, one line per array operation.

`Tape` turns a Recorder's lines into the source of one function, `replay(a0, a1, ...)`, drops
the lines no result needs, and compiles it. The source is kept (`tape.source`) so a replay can be
read and stepped through like any Python function.
"""
import math
import operator

from ..variable import Variable, note_write
from .trace import BINARY, IN_PLACE, UNARY, Ref, has_side_effect

class Diverged(Exception):
    """A replay met a guard that came out otherwise than when it was recorded."""


def _store(v, value):
    """`v.data = value` as a replay does it: the array as it is, counted as a write."""
    v._data = value
    note_write(v)


def _store_grad(v, value):
    """`v.grad` as the recorded run left it: None, or a new Variable holding `value`."""
    v._grad = None if value is None else Variable(value, requires_grad=False)


class Tape:
    """One recorded step: `run(args)` replays it and returns the arrays its results hold."""

    def __init__(self, recorder, outputs):
        self.outputs = outputs  # output slots, in the order the results template lists them
        self.guards = [line.target for line in recorder.lines if line.kind == "load_grad"]
        lines = _needed(recorder.lines, outputs)
        self.ops = sum(1 for line in lines if line.kind not in ("load", "load_grad", "constant",
                                                                "store", "store_grad"))
        self.source, namespace = _source(lines, recorder.arguments, outputs)
        code = compile(self.source, "<gradcore.compile tape>", "exec")
        exec(code, namespace)
        self.replay = namespace["replay"]

    def ready(self):
        """True if the Variables whose grads the tape reads have one (as when it was recorded)."""
        return all(v._grad is not None for v in self.guards)


def _refs(value, found):
    kind = value.__class__
    if kind is Ref:
        found.add(value.slot)
    elif kind is tuple or kind is list:
        for v in value:
            _refs(v, found)
    elif kind is dict:
        for v in value.values():
            _refs(v, found)
    elif kind is slice:
        _refs((value.start, value.stop, value.step), found)


def _needed(lines, outputs):
    """The lines a result, a stored value or a side effect depends on, in order."""
    needed = set(outputs)
    kept = []
    for line in reversed(lines):
        if has_side_effect(line) or line.out in needed:
            kept.append(line)
            _refs(line.args, needed)
            if line.kwargs:
                _refs(line.kwargs, needed)
    kept.reverse()
    return kept


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


def _source(lines, arguments, outputs):
    """The replay function's source, and the globals it runs with."""
    writer = _Writer()
    body = []
    for index, slot, variable in arguments:
        body.append(f"v{slot} = a{index}._data" if variable else f"v{slot} = a{index}")
    for line in lines:
        body.append(_statement(line, writer))
    body.append("return (" + "".join(f"v{slot}, " for slot in outputs) + ")")
    count = 1 + max((index for index, _, _ in arguments), default=-1)
    signature = "".join(f"a{i}, " for i in range(count)) + "*_"
    source = f"def replay({signature}):\n" + "".join(f"    {s}\n" for s in body)
    return source, writer.namespace


def _statement(line, w):
    kind, target, args, out = line.kind, line.target, line.args, line.out
    if kind == "call":
        return f"v{out} = {w.bind(target, 'f')}({w.arguments(args, line.kwargs)})"
    if kind == "method":
        return f"v{out} = {w.expression(args[0])}.{target}({w.arguments(args[1:], line.kwargs)})"
    if kind == "binary":
        a, b = w.expression(args[0]), w.expression(args[1])
        if target is operator.getitem:
            return f"v{out} = {a}[{b}]"
        return f"v{out} = {a} {BINARY[target]} {b}"
    if kind == "unary":
        symbol = UNARY[target]
        a = w.expression(args[0])
        return f"v{out} = abs({a})" if symbol == "abs" else f"v{out} = {symbol}{a}"
    if kind == "in_place":
        return f"{w.expression(args[0])} {IN_PLACE[target]} {w.expression(args[1])}"
    if kind == "setitem":
        return f"{w.expression(args[0])}[{w.expression(args[1])}] = {w.expression(args[2])}"
    if kind == "load":
        return f"v{out} = {w.site(target)}._data"
    if kind == "load_grad":
        return f"v{out} = {w.site(target)}._grad._data"
    if kind == "constant":
        return f"v{out} = {w.bind(target, 'k')}"
    if kind == "store":
        return f"_store({w.site(target)}, {w.expression(args[0])})"
    if kind == "store_grad":
        return f"_store_grad({w.site(target)}, {w.expression(args[0])})"
    if kind == "opaque":
        return f"{w.bind(target, 'f')}({w.arguments(args, None)})"
    if kind == "guard":
        test = "not " if target else ""
        return f"if {test}{w.expression(args[0])}: raise Diverged({line.kwargs['where']!r})"
    raise AssertionError(f"unknown tape line kind {kind!r}")
