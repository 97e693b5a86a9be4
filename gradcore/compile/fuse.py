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

from .trace import BINARY, UNARY, Line, Ref, trace_backends

# Elementwise operators cupy.fuse takes on its arguments
_OPERATORS = frozenset(BINARY) - {operator.matmul} | frozenset(UNARY)

# Each distinct run is a kernel compiled at recording (0.05-0.1 s with CUDA's runtime compiler),
# and it saves per replay a launch (a few us) and a round trip to memory per line it absorbs.
# Below this size the launch is the cost, and a wide graph of small runs spent minutes
# compiling (benchmarks' wide, 1,000 branches, on an H100): those runs are left as they are.
FUSE_MIN_BYTES = 1 << 18

# Fused kernels by their source, which names slots by position (v0, v1, ...): a run that
# repeats (a layer's activation in each layer, each step's recording of it) compiles once
_KERNELS = {}
_KERNELS_KEPT = 512


def _elementwise(line):
    """True if `line` computes one array of FUSE_MIN_BYTES or more elementwise, from arrays and
    Python numbers."""
    facts = line.array
    if facts is None or facts.nbytes < FUSE_MIN_BYTES or getattr(facts.xp, "fuse", None) is None:
        return False
    if line.kind in ("binary", "unary"):
        return line.target in _OPERATORS and _numbers_or_refs(line.args)
    # a ufunc with a signature (matmul) works on whole axes, not element by element; one of
    # another library (NumPy's np.exp on CuPy arrays, which CuPy computes) is left to it
    target = line.target
    return (line.kind == "call" and not line.kwargs and type(target).__name__ == "ufunc"
            and getattr(target, "signature", None) is None
            and getattr(facts.xp, getattr(target, "__name__", ""), None) is target
            and _numbers_or_refs(line.args))


def _numbers_or_refs(args):
    return all(a.__class__ is Ref or a.__class__ in (int, float, bool) for a in args)


def fusable(lines):
    """True if a line of `lines` computes elementwise in a library that fuses (CuPy)."""
    if not any(hasattr(backend.inner.xp, "fuse") for backend in trace_backends()):
        return False  # no library recorded with fuses (NumPy has none): no line need be read
    return any(map(_elementwise, lines))


def fuse(lines, last, source_of):
    """`lines` with each run of 2 or more consecutive elementwise lines replaced by one call of a
    fused function (and a line per result it hands on). `last`: each slot's last use (its index
    in `lines`; past the end for the step's results). `source_of(lines, inputs, results)` writes
    the function's Python source and its globals (the tape's statement writer). New slots, for
    a function's tuple of results, are numbered after every slot `lines` uses."""
    spare = iter(range(max(last, default=-1) + 1, 1 << 62))
    fused, run = [], []
    for i, line in enumerate(lines):
        if _elementwise(line):
            if run and line.array.shape != run[0][1].array.shape:
                # a fused kernel has one shape, its inputs broadcast to it: every result of it
                # has that shape, so a run holds the lines of one shape only
                fused.extend(_fused_run(run, last, source_of, spare))
                run = []
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
    inputs = list(dict.fromkeys(slot for line in lines for slot in line.reads
                                if slot not in made))
    end = run[-1][0]
    results = [slot for slot in dict.fromkeys(made) if last[slot] > end]  # read after the run
    if not results:
        return lines  # nothing of it is read later: dead lines, left for the tape to drop
    kernel = _kernel(lines, inputs, results, source_of, lines[0].array.xp)
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


def _kernel(lines, inputs, results, source_of, xp):
    """The fused kernel doing `lines`: made once for each source (slots renamed by position)."""
    position = {slot: i for i, slot in enumerate(inputs)}
    for line in lines:
        position.setdefault(line.out, len(position))
    renamed = []
    for line in lines:
        args = tuple(Ref(position[a.slot]) if a.__class__ is Ref else a for a in line.args)
        renamed.append(Line(line.kind, line.target, args, None, position[line.out]))
    source, namespace = source_of(renamed, [position[s] for s in inputs],
                                  [position[s] for s in results])
    key = (id(xp), source, tuple(sorted((k, id(v)) for k, v in namespace.items())))
    kernel = _KERNELS.get(key)
    if kernel is None:
        exec(compile(source, "<gradcore.compile fused run>", "exec"), namespace)
        kernel = xp.fuse(namespace["fused"])
        kernel.source = source
        if len(_KERNELS) >= _KERNELS_KEPT:
            del _KERNELS[next(iter(_KERNELS))]  # the oldest
        _KERNELS[key] = kernel
    return kernel
