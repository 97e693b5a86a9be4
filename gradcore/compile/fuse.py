"""Fusing a tape's runs of elementwise operations into one kernel, where the array library can.

On CuPy every elementwise operation is a kernel launch that reads its inputs from GPU memory and
writes its result back; a run of them (`y * 1.0001 + 0.1`, an activation and its gradient) costs
a launch and a round trip to memory per operation. `cupy.fuse` compiles a Python function of
elementwise operations into one kernel. Here each run of consecutive elementwise lines of a tape
becomes one such function, with the run's inputs as its arguments and, as its results, the values
of the run that lines after it (or the step's results) still read.

The library decides: fusion happens where the tape's array namespace has `fuse` (CuPy). NumPy has
none, so a NumPy tape is never fused; tests stand a `fuse` in to check the grouping. A fused
kernel may round differently in the last bit (the compiler may contract a * b + c into one
fused multiply-add), so a tape compiled with check=... is not fused.
"""
import operator

from .trace import BINARY, UNARY, Line, Ref, slots_in

# Elementwise operators cupy.fuse takes on its arguments (getitem is not elementwise)
_OPERATORS = frozenset(BINARY) - {operator.getitem} | frozenset(UNARY)


def _elementwise(line):
    """True if `line` computes one array elementwise from arrays and Python numbers."""
    if line.array is None or getattr(line.array.xp, "fuse", None) is None:
        return False
    if line.kind in ("binary", "unary"):
        return line.target in _OPERATORS and _numbers_or_refs(line.args)
    return (line.kind == "call" and not line.kwargs and type(line.target).__name__ == "ufunc"
            and _numbers_or_refs(line.args))


def _numbers_or_refs(args):
    return all(a.__class__ is Ref or a.__class__ in (int, float, bool) for a in args)


def fuse(lines, last, source_of):
    """`lines` with each run of 2 or more consecutive elementwise lines replaced by one call of a
    fused function (and a line per result it hands on). `last`: each slot's last use (its index
    in `lines`; past the end for the step's results). `source_of(lines, inputs, results)` writes
    the function's Python source and its globals (the tape's statement writer). New slots, for
    a function's tuple of results, are numbered after every slot `lines` uses."""
    namespaces = {id(line.array.xp): line.array.xp for line in lines if line.array is not None}
    if not any(hasattr(xp, "fuse") for xp in namespaces.values()):
        return lines  # nothing can fuse here (NumPy has no fuse): asked once, not per line
    if not any(map(_elementwise, lines)):
        return lines
    spare = iter(range(max(last, default=-1) + 1, 1 << 62))
    fused, run = [], []
    for i, line in enumerate(lines):
        if _elementwise(line):
            run.append((i, line))
            continue
        fused.extend(_fused_run(run, last, source_of, spare))
        run = []
        fused.append(line)
    fused.extend(_fused_run(run, last, source_of, spare))
    return fused


def _fused_run(run, last, source_of, spare):
    """The lines standing for one run: itself if too short, else the fused call."""
    if len(run) < 2:
        return [line for _, line in run]
    lines = [line for _, line in run]
    made = [line.out for line in lines]
    inputs = list(dict.fromkeys(slot for line in lines for slot in slots_in(line.args, [])
                                if slot not in made))
    end = run[-1][0]
    results = [slot for slot in dict.fromkeys(made) if last[slot] > end]  # read after the run
    if not results:
        return lines  # nothing of it is read later: dead lines, left for the tape to drop
    source, namespace = source_of(lines, inputs, results)
    exec(compile(source, "<gradcore.compile fused run>", "exec"), namespace)
    kernel = lines[0].array.xp.fuse(namespace["fused"])
    kernel.source = source
    args = tuple(Ref(slot) for slot in inputs)
    if len(results) == 1:
        call = Line("call", kernel, args, None, results[0])
        call.array = next(line.array for line in lines if line.out == results[0])
        return [call]
    holder = next(spare)  # the tuple of results
    out = [Line("call", kernel, args, None, holder)]
    for index, slot in enumerate(results):
        take = Line("binary", operator.getitem, (Ref(holder), index), None, slot)
        take.array = next(line.array for line in lines if line.out == slot)
        out.append(take)
    return out
