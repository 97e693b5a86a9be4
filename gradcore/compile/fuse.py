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
fused multiply-add), so a tape compiled with check=... is not fused. A line cupy.fuse would
compute in another dtype than eager CuPy (a Python float beside an integer array) is left
unfused; an operator its tracer lacks (`abs(v)`, `2.0 ** v`) is written as the ufunc it calls.
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
        name = _written_as(line)
        return (line.target in _OPERATORS and _numbers_or_refs(line.args)
                and (name is None or name in _ufuncs(facts.xp)[0]))
    # a ufunc with a signature (matmul) works on whole axes, not element by element; one of
    # another library (NumPy's np.exp on CuPy arrays, which CuPy computes) is left to it
    target = line.target
    return (line.kind == "call" and not line.kwargs and type(target).__name__ == "ufunc"
            and getattr(target, "signature", None) is None
            and _ufuncs(facts.xp)[1].get(id(target)) is target and _numbers_or_refs(line.args))


# namespace -> its ufuncs by name and by id. A line's function is known by identity, not by its
# __name__, which need not be its name in the namespace: CuPy's tanh is called "cupy_tanh"
_NAMESPACE_UFUNCS = {}


def _ufuncs(xp):
    """({name: ufunc}, {id(ufunc): ufunc}) of the namespace `xp`'s ufuncs."""
    found = _NAMESPACE_UFUNCS.get(xp)
    if found is None:
        named = {name: f for name, f in list(vars(xp).items()) if type(f).__name__ == "ufunc"}
        found = _NAMESPACE_UFUNCS[xp] = named, {id(f): f for f in named.values()}
    return found


# Operators cupy.fuse cannot trace (its proxies have no __abs__, __pos__ or __rpow__), written in
# a fused function as calls of the namespace's ufuncs of these names, which compute the same
_AS_UFUNCS = {operator.abs: "absolute", operator.pos: "positive"}


def _written_as(line):
    """The name of the ufunc a fused function calls for the operator line `line`, or None where
    it writes the operator."""
    if line.target is operator.pow and line.args[0].__class__ is not Ref:
        return "power"  # 2.0 ** v
    return _AS_UFUNCS.get(line.target) if line.kind == "unary" else None


# The kinds of the Python numbers a fused line may hold and of dtypes, in NumPy's order of
# promotion, and the size of the default dtype of a number's kind (int64, float64)
_NUMBER_KINDS = {bool: 0, int: 1, float: 2}
_DTYPE_KINDS = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}
_DEFAULT_BYTES = {1: 8, 2: 8}


def _promotes_as_eagerly(line, dtypes):
    """False if a Python number of `line` may be of a higher kind than an array it meets (a float
    beside integers, an int beside bools). NumPy and eager CuPy then compute in that kind's
    default dtype (uint8 / 255.0 in float64); cupy.fuse takes the smallest dtype of that kind
    (float16; bool + 1 in int8). `dtypes`: slot -> dtype, where known."""
    kind = max((_NUMBER_KINDS[a.__class__] for a in line.args if a.__class__ is not Ref),
               default=0)
    if kind == 0:
        return True
    known = [dtypes.get(a.slot) for a in line.args if a.__class__ is Ref]
    if all(dtype is not None for dtype in known):  # not `None in`: float64 == None in NumPy
        return all(_DTYPE_KINDS.get(dtype.kind, -1) >= kind for dtype in known)
    # an array of a lower kind would have made the number that kind's default dtype, and the
    # result at least as wide (so for every binary ufunc and operator of NumPy and CuPy): a
    # narrower result of the kind (float32 from * 2.0) rules it out
    result = line.array.dtype
    return _DTYPE_KINDS.get(result.kind, -1) >= kind and result.itemsize < _DEFAULT_BYTES[kind]


def _numbers_or_refs(args):
    return all(a.__class__ is Ref or a.__class__ in (int, float, bool) for a in args)


def fusable(lines):
    """True if a line of `lines` computes elementwise in a library that fuses (CuPy)."""
    if not any(hasattr(backend.inner.xp, "fuse") for backend in trace_backends()):
        return False  # no library recorded with fuses (NumPy has none): no line need be read
    return any(map(_elementwise, lines))


def fuse(lines, last, source_of, dtypes=None):
    """`lines` with each run of 2 or more consecutive elementwise lines replaced by one call of a
    fused function (and a line per result it hands on). `last`: each slot's last use (its index
    in `lines`; past the end for the step's results). `source_of(lines, inputs, results)` writes
    the function's Python source and its globals (the tape's statement writer). `dtypes`: the
    dtype of each slot no line makes (the step's arguments, the Variables' data it loads). New
    slots, for a function's tuple of results, are numbered after every slot `lines` uses."""
    dtypes = dict(dtypes or ())
    for line in lines:
        if line.array is not None:
            dtypes[line.out] = line.array.dtype
        elif line.kind == "constant" and hasattr(line.target, "dtype"):
            dtypes[line.out] = line.target.dtype
    spare = iter(range(max(last, default=-1) + 1, 1 << 62))
    fused, run = [], []
    for i, line in enumerate(lines):
        if _elementwise(line) and _promotes_as_eagerly(line, dtypes):
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
        name = _written_as(line)
        if name is None:
            renamed.append(Line(line.kind, line.target, args, None, position[line.out]))
        else:
            renamed.append(Line("call", _ufuncs(xp)[0][name], args, None, position[line.out]))
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
