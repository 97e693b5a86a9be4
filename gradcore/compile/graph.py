"""Replaying runs of a tape as device graphs, where the array library captures them (CuPy: CUDA
graphs).

On a GPU each replayed line is a kernel launch from Python, some 10-20 µs however little the
kernel does (the H100 figures: chain replays at 19 µs an op). A CUDA graph records the kernels a
run of lines launches, with the memory each one reads and writes, once; one launch from the host
then runs them all. Here each run of consecutive lines that only compute on the device becomes a
`Graphed` run, which the replay calls in the run's place: the first call captures it, later calls
launch the graph.

What a graph cannot do stays out of it or is arranged around it:

- A graph reads and writes the same memory at every launch. Arrays that are new at every call
  (the step's arguments, grads, a Variable's data the step replaces, what lines outside graphs
  made, the index arrays of a key checked outside them) are copied into the graph's own buffers
  before each launch ("staged"). Arrays that stay (a Parameter's data, updated in place; a
  constant; another graph's buffer) are read where they are, and each launch checks that they
  are still the same arrays: where one was replaced, the run is captured again, staging it
  (after CAPTURES captures, it stays lines).
- What leaves the graphs for Python (a result, a grad or data stored on a Variable, a value a
  guard or an optimizer's step reads) is a copy: the graph writes its own memory again at the next
  launch, and a result the caller keeps must not change under them.
- Random draws (the host advances the generator: a graph would draw the same numbers at every
  launch), guards (read on the host), stores, optimizer steps, lines on other arrays and calls
  the library refuses to capture (CuPy: matrix products, which call cuBLAS) run as Python
  between graphs; loads of Variables move in front of the run they feed.
- A run that writes in place into a staged array runs as lines from then on; one whose capture
  the library refuses (a call that waits for the device) tries again at later calls, CAPTURES
  captures in all, then stays lines; `Compiled.stats()` says why.

A graph's memory is its own (CuPy: a private memory pool), held as long as the tape: about one
step's arrays per tape.
"""
import functools
import operator

import backends
from backends.indexing import NormalizedKey

from .trace import _DRAWS, Line, Ref, _name, trace_backends, written

# Fewer device lines than this are left as lines: a graph's launch and the copies around it
# cost a few launches' worth (a guess: the H200 run measured graphs against none, not this)
GRAPH_MIN_LINES = 4
# Captures a run makes (arrays it reads directly replaced since) before it stays lines
CAPTURES = 3

_COMPUTE = frozenset(("call", "method", "binary", "unary", "in_place", "setitem"))
# Calls that make an array from host values: CuPy copies one of 1 element or more through a
# pinned host buffer it reuses once the copy is seen done, which a graph would read again at
# every launch (a 0-d one is filled by a kernel, with the value as its argument: capturable)
_TRANSFERS = frozenset(("asarray", "array", "asanyarray", "ascontiguousarray", "to_device"))
_MOVABLE = frozenset(("load", "load_grad", "constant"))  # read no slot, change nothing
_CONSTANTS = (int, float, bool, complex, str, bytes, type(None), slice, type(Ellipsis))


class Uncapturable(Exception):
    """A run cannot be captured as a graph (the message says why): it runs as lines."""


class CaptureFailed(Uncapturable):
    """The library refused a capture: it may be passing (another thread waited for the whole
    GPU meanwhile), so the run tries again at later calls, CAPTURES captures in all."""


def graph_backend(lines):
    """The backend whose arrays `lines` compute with, if it captures graphs; else None."""
    for backend in trace_backends():
        inner = backend.inner
        if inner.captures_graphs and any(
                facts is not None and facts.xp is inner.xp
                for facts in map(operator.attrgetter("array"), lines)):
            return inner
    return None


def draws(line):
    """True if `line` draws random numbers (a gradcore draw, or a call into a random module)."""
    if line.kind != "call":
        return False
    target = line.target
    if _name("call", target) in _DRAWS:
        return True
    owner = getattr(target, "__self__", None)
    modules = (getattr(target, "__module__", None) or "",
               type(owner).__module__ if owner is not None else "")
    return any("random" in module.split(".") for module in modules)


def _on_device(line, backend):
    """True if `line` only computes, on arrays of `backend` (as far as the tape knows: a line it
    kept no facts of is checked as the run is captured), in a way its graphs capture."""
    if line.kind not in _COMPUTE or draws(line) or _refused(line, backend):
        return False
    facts = line.array
    if line.kind == "call" and not line.reads and _name("call", line.target) in _TRANSFERS and (
            facts is None or facts.shape != ()):
        return False  # from the host
    if line.kind == "call" and line.reads and _name("call", line.target) == "normalize_key":
        return False  # an index array's bounds are checked on the host: a wait for the device
    if line.target is backends.to_device:
        return False  # from another library (NumPy labels to the GPU): through the host
    return facts is None or facts.xp is backend.xp


def _refused(line, backend):
    """True if `backend` refuses to capture what `line` calls (CuPy: cuBLAS)."""
    target = line.target
    owner = getattr(target, "__self__", None)  # a NumPy or CuPy ufunc's method: its ufunc
    module = getattr(target, "__module__", None) or (
        type(owner).__module__ if owner is not None else "")
    return backend.refused_in_graphs(_name(line.kind, target), module)


def graphed(lines, frees, outputs, arguments, backend, interpreter):
    """`lines` and `frees` with each run of GRAPH_MIN_LINES or more device lines replaced by a
    call of a Graphed run (and a line per value of it read later), and the Graphed runs.
    `interpreter(lines, frees, arguments, outputs, inspect)` runs lines (the tape's)."""
    runs = _runs(lines, backend)
    in_graph = {k for start, end in runs for k in range(start, end)
                if lines[k].kind not in _MOVABLE}
    readers = {}  # slot -> indices of the lines reading it
    for k, line in enumerate(lines):
        for slot in line.reads:
            readers.setdefault(slot, []).append(k)
    written_outside = {slot for k, line in enumerate(lines) if k not in in_graph
                       for slot in written(line)}
    stored = {_site(line.target) for line in lines if line.kind == "store"}
    staged = {slot for _, slot, _ in arguments}  # slots whose array is new at every call
    fresh = set()  # of those, arrays of their own made by lines outside graphs
    for k, line in enumerate(lines):
        if line.kind == "load_grad" or line.kind == "load" and _site(line.target) in stored:
            staged.add(line.out)
        elif line.kind in _COMPUTE and k not in in_graph and line.out is not None:
            staged.add(line.out)  # made by a line outside graphs
            if line.array is not None and line.array.fresh:
                fresh.add(line.out)
    results = set(outputs)
    used = [s for line in lines for s in line.reads] + [
        line.out for line in lines if line.out is not None] + list(outputs) + [
        slot for _, slot, _ in arguments]
    spare = iter(range(1 + max(used, default=-1), 1 << 62))
    new_lines, new_frees, runs_made = [], [], []
    position = 0
    for start, end in runs:
        new_lines += lines[position:start]
        new_frees += frees[position:start]
        run = lines[start:end]
        moved = [line for line in run if line.kind in _MOVABLE]
        device = [line for line in run if line.kind not in _MOVABLE]
        made, inputs = set(), {}
        for line in device:
            for slot in line.reads:
                if slot not in made:
                    inputs.setdefault(slot, None)
            if line.out is not None and line.kind != "in_place":
                made.add(line.out)
        freed = set().union(*frees[start:end])
        out = sorted(made - freed)  # read after the run, or the step's results
        escaping = [slot in results or any(k >= end and k not in in_graph
                                           for k in readers.get(slot, ())) for slot in out]
        # a fresh array only this run reads: its buffer may take the run's writes (out=, +=),
        # which no one else could see
        scratch = [slot in fresh and slot not in results
                   and all(start <= k < end for k in readers[slot]) for slot in inputs]
        graph = Graphed(backend, device, [frees[k] for k in range(start, end)
                                          if lines[k].kind not in _MOVABLE],
                        list(inputs), out, escaping, [slot in staged for slot in inputs],
                        interpreter, scratch)
        if any(slot in written_outside for slot in out):
            graph.why = "a line outside graphs writes in place into a value the run made"
        # a value copied out, or made by lines run as lines, is another array at every call:
        # a later run stages it
        staged.update(slot for slot, escapes in zip(out, escaping)
                      if escapes or graph.why is not None)
        runs_made.append(graph)
        holder = next(spare)
        call = Line("call", graph, tuple(Ref(slot) for slot in inputs), None, holder)
        new_lines += moved + [call]
        new_frees += [set() for _ in moved] + [freed - made | ({holder} if not out else set())]
        for i, slot in enumerate(out):
            new_lines.append(Line("binary", operator.getitem, (Ref(holder), i), None, slot))
            new_frees.append({holder} if i == len(out) - 1 else set())
        position = end
    new_lines += lines[position:]
    new_frees += frees[position:]
    return new_lines, new_frees, runs_made


def _runs(lines, backend):
    """(start, end) of each run of lines that compute on the device, with the loads and
    constants among them, holding GRAPH_MIN_LINES device lines or more."""
    runs, start, count = [], None, 0
    for k, line in enumerate(lines + [None]):
        if line is not None and _on_device(line, backend):
            if start is None:
                start, count = k, 0
            count += 1
            end = k + 1
        elif line is not None and line.kind in _MOVABLE and start is not None:
            continue
        else:
            if start is not None and count >= GRAPH_MIN_LINES:
                runs.append((start, end))
            start = None
    return runs


def _site(target):
    return ("argument", target) if target.__class__ is int else id(target)


def _fits(value, buffer):
    """True if the array `value` can be copied into the graph's `buffer` as it is."""
    return (value.__class__ is buffer.__class__ and value.shape == buffer.shape
            and value.dtype == buffer.dtype)


def _fits_key(value, key, cls):
    """True if the index key `value` is the graph's `key` but for its index arrays (of class
    `cls`), which can be copied into the key's buffers as they are."""
    return value.__class__ is key.__class__ and len(value) == len(key) and all(
        _fits(v, k) if k.__class__ is cls else v is k or _same_constant(v, k)
        for v, k in zip(value, key))


def _same_constant(a, b):
    """True if `a` and `b` are equal Python values a graph may have taken as constants (numbers,
    strings, slices, None, tuples of them), as a key made afresh at every call is."""
    if a.__class__ is not b.__class__:
        return False
    if a.__class__ is tuple:
        return len(a) == len(b) and all(map(_same_constant, a, b))
    return a.__class__ in _CONSTANTS and a == b


class Graphed:
    """A run of tape lines replayed as one device graph: called with the values of the slots it
    reads (`inputs`), it returns those of the slots read after it (`outputs`)."""

    def __init__(self, backend, lines, frees, inputs, outputs, escaping, staged, interpreter,
                 scratch):
        self.backend = backend
        self.lines, self.frees = lines, frees
        self.inputs, self.outputs = inputs, outputs
        self.escaping = escaping  # per output: True if Python reads it (it gets a copy)
        self.staged = staged      # per input: True if it is a new array at every call
        # per input: True if its buffer may be written (a fresh array no one else reads)
        self.scratch = scratch
        self.interpreter = interpreter
        # the array class's own copy where it has one (NumPy, CuPy; made on the current GPU),
        # keeping the layout (a transposed argument's buffer stays transposed, so its kernels
        # and matrix products are those the step ran eagerly), else the backends' (the array
        # API has no copy method)
        copy = getattr(backend.array_type, "copy", None)
        self._copy = functools.partial(copy, order="K") if copy else backends.copy
        # the interpreter's (argument index, slot, is a Variable) for each input
        self._arguments = [(i, slot, False) for i, slot in enumerate(inputs)]
        self._run = interpreter(lines, frees, self._arguments, outputs, None)
        self.graph = None
        self._device = None    # the device it was captured on (None: the backend has one)
        self.why = None        # why the run runs as lines, once it does for good
        self.captures = 0
        self.launches = 0
        self._direct = ()      # (position, the array or object read there) for each direct input
        self._buffers = ()     # (position, the graph's buffer) for each staged input
        self._keys = ()        # (position, the graph's key, its arrays buffers) per staged key
        self._results = ()     # the graph's output arrays
        self._copied = ()      # per output: True if a launch hands out a copy of it

    def __call__(self, *values):
        # called by its tape's replay, one call at a time (Tape: the graphs' memory is shared)
        graph = self.graph
        if graph is not None:
            if self._same_inputs(values):
                with self.backend.device_context(self._device):  # copies out made there
                    graph.launch(self._copies_in(values))
                    self.launches += 1
                    return self._handed_out()
            self.graph = None  # an input is another array now: capture again, staging it
        if self.why is None and self.captures >= CAPTURES:
            self.why = (f"it was captured {CAPTURES} times (the arrays it reads were replaced "
                        "after a capture, or the library refused)")
        if self.why is None:
            try:
                return self._capture(values)
            except CaptureFailed as e:
                if self.captures >= CAPTURES:
                    self.why = f"{e} ({self.captures} captures)"
            except Uncapturable as e:
                self.why = str(e)
        results = self._run(*values)
        if True in self.escaping:
            # run as lines, on buffers of graphs before it: a view of one must not reach Python
            cls, owns_memory = self.backend.array_type, self.backend.owns_memory
            results = tuple(self._copy(result) if escapes and result.__class__ is cls
                            and not owns_memory(result) else result
                            for result, escapes in zip(results, self.escaping))
        return results

    def _same_inputs(self, values):
        for i, expected in self._direct:
            value = values[i]
            if value is not expected and not _same_constant(value, expected):
                self.staged[i] = self.backend.owns(value)  # an array: stage it from now on
                return False
        for i, buffer in self._buffers:
            if not _fits(values[i], buffer):
                return False
        cls = self.backend.array_type
        for i, key in self._keys:
            if not _fits_key(values[i], key, cls):
                return False
        return True

    def _copies_in(self, values):
        """(buffer, value) for each array a launch copies in: staged inputs, keys' arrays."""
        copies = [(buffer, values[i]) for i, buffer in self._buffers]
        cls = self.backend.array_type
        for i, key in self._keys:
            copies += [(k, v) for k, v in zip(key, values[i]) if k.__class__ is cls]
        return copies

    def _capture(self, values):
        backend = self.backend
        self.captures += 1
        arrays = [v for v in values if backend.owns(v)]
        devices = {backend.device_of(a) for a in arrays} if not backend.single_device else ()
        if len(devices) > 1:
            raise Uncapturable("its arrays are on more than one device")
        device = next(iter(devices), None)
        with backend.device_context(device):
            return self._capture_on(device, values)

    def _capture_on(self, device, values):
        backend = self.backend
        inputs, buffers, keys, direct = list(values), [], [], []
        for i, value in enumerate(values):
            if self.staged[i] and value.__class__ is backend.array_type:
                inputs[i] = self._copy(value)  # the graph's own: each launch copies into it
                buffers.append((i, inputs[i]))
            elif self.staged[i] and value.__class__ is NormalizedKey:
                # an index key checked outside graphs, its index arrays new at every call: the
                # graph indexes with a key of its own buffers, into which each launch copies them
                inputs[i] = NormalizedKey(self._copy(k) if k.__class__ is backend.array_type
                                          else k for k in value)
                keys.append((i, inputs[i]))
            elif self.staged[i] and backends.is_array(value):
                raise Uncapturable(f"it reads a {type(value).__name__}, which cannot be "
                                   "written into for each launch")
            else:
                direct.append((i, value))
        staged = [buffer for i, buffer in buffers if not self.scratch[i]] + [
            k for _, key in keys for k in key if k.__class__ is backend.array_type]
        xp = backend.xp
        overlaps = getattr(xp, "may_share_memory", None)

        def inspect(line, slots):
            for slot in line.reads:
                value = slots[slot]
                if backends.is_array(value) and not (
                        backend.owns(value) or value.__class__ in backend.scalar_types):
                    raise Uncapturable(f"a line computes on {type(value).__name__} arrays")
            for slot in written(line):
                target = slots[slot]
                if any(overlaps is None or overlaps(target, buffer) for buffer in staged):
                    raise Uncapturable("a line writes in place into an array that is new at "
                                       "every call (an argument, a grad, a value from outside "
                                       "the run)")

        run = self.interpreter(self.lines, self.frees, self._arguments, self.outputs, inspect)
        try:
            graph, results = backend.capture(lambda: run(*inputs))
        except Uncapturable:
            raise
        except Exception as e:  # what the library refused to capture (a wait on the device)
            raise CaptureFailed(f"the capture failed: {type(e).__name__}: {e}") from e
        self.graph, self._buffers, self._direct, self._results = graph, buffers, direct, results
        self._keys = keys
        self._device = device
        self._copied = [escapes and result.__class__ is backend.array_type
                        for result, escapes in zip(results, self.escaping)]
        graph.launch()  # the buffers hold the values already
        self.launches += 1
        return self._handed_out()

    def _handed_out(self):
        """The graph's results as the replay goes on with them: a copy of each that Python reads
        (the next launch writes the graph's own again)."""
        return tuple(self._copy(result) if copied else result
                     for result, copied in zip(self._results, self._copied))
