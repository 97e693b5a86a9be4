"""What every workload shares: the Workload record, timing, device sync, machine info, runner."""
import argparse
import collections
import dataclasses
import gc
import importlib
import itertools
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from typing import Callable, Optional

import numpy

import backends
import gradcore
from gradcore.compile.tape import INTERPRETED_REPLAYS

# Seconds -> the unit a figure is shown in.
SCALES = {"ns": 1e9, "us": 1e6, "ms": 1e3, "s": 1.0}
KINDS = ("gradcore", "floor", "torch")  # the three columns, in table order
# gradcore.compile's replay of gradcore's run: a row of its own under each workload's figures
REPLAY = "replay"
# PyTorch's own compiler on PyTorch's run: a note under each workload, timed in a process of its
# own (benchmarks/torch_compiled.py)
TORCH_COMPILE = "torch_compile"
# The id of a workload's time row; a memory row's id is its figure's key ("peak_mib")
TIME_ROW = "time"
# Environment variables that change what a workload runs (GRADCORE_BENCH_BIG_SIZE, _MLP_BATCH,
# _GRAPHS) begin with this: a recorded command names those that were set
SETTINGS_PREFIX = "GRADCORE_BENCH_"
# The variables that fix the thread count of the BLAS under NumPy and of PyTorch's OpenMP pool.
# They only act before those libraries load, so the suite sets them and starts itself again.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# Thread pools that go to sleep as soon as their work is done, for --threads above 1 (at the
# default 1 there is no pool). By default PyTorch's OpenMP threads and NumPy's OpenBLAS threads
# spin on for a while after each call, and the implementations take turns, so each ran on the
# cores the previous one's pool was spinning on: mlp with 2 threads on the 2-core VM, taking
# turns, gave PyTorch 16.6-19.6 ms and the floor 14.6-15.2 where each alone takes about 8 and 6;
# with these set, 8.8-9.0 and 6.7-6.8 (PyTorch alone 8.1-8.6)
IDLE_VARIABLES = {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


class Unavailable(Exception):
    """Raised by a factory that cannot run here (no PyTorch, no CUDA in PyTorch, CPU-only...):
    the column shows n/a and the reason goes into the notes and the JSON."""


@dataclasses.dataclass(frozen=True)
class Memory:
    """A memory figure, measured in a fresh process per implementation (memory.py), where
    `probe(run, meter)` gets the factory's `run` and a memory.Meter and returns (figures: a dict of
    MiB, the result `verify` checks). `rows`: the table's (label, figure's key, ratios make sense).
    """

    summary: str
    probe: Callable
    rows: tuple


@dataclasses.dataclass(frozen=True)
class Target:
    """A goal the workload is held to: `text` says it ("<= 0.6x PyTorch"); `check(record)` returns
    (what was measured, True/False, or None when it could not be measured here). `row`: the id of
    the table row it is about (see `replay_row` and `Workload.row_ids`)."""

    text: str
    check: Callable
    row: str = TIME_ROW


def replay_row(row):
    """The id of the replay row under the row `row`: "replay" under the time row, "replay KEY"
    under the memory row KEY."""
    return REPLAY if row == TIME_ROW else f"{REPLAY} {row}"


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark, as each workload module declares it (`WORKLOAD = Workload(...)`). A factory
    builds what a run needs outside the clock and returns `run`, which does one whole run and
    returns a value that `verify` checks: a fast but wrong implementation is caught, not reported.
    """

    name: str
    summary: str                          # one line: what a run computes
    count: int                            # how many `unit`s one run does (chain: 4,000 ops)
    unit: str                             # "op", "step", ...
    convention: str                       # how `count` is counted; printed under the table
    gradcore: Callable                    # gradcore(device) -> run
    floor: Callable                       # floor(device) -> run: by hand in NumPy/CuPy, no autodiff
    verify: Callable                      # verify(kind, result): AssertionError if result is wrong
    # For a run that trains a model in place (mlp, conv), the check of where it has got to:
    # verify_steps(kind, result, calls, device), `calls` the calls made since its factory returned
    verify_steps: Optional[Callable] = None
    floor_label: str = ""                 # what the floor computes
    torch: Optional[Callable] = None      # torch(torch_module, torch_device) -> run
    replay: Optional[Callable] = None     # replay(device) -> run: gradcore's run, compiled
    # The key of a reference that does the floor's arithmetic the way the replay's tape runs it,
    # where the floor deliberately does not (chain on NumPy: the tape runs on numpy.float64
    # scalars, the floor keeps 0-d arrays as eager gradcore must): where it ran, the table's
    # replay time row shows it as its floor, and its ratio to it (the record's "replay/floor",
    # which targets read, stays the floor's)
    replay_floor: str = ""
    references: tuple = ()                # more (key, label, factory(device)) figures, as notes
    time_unit: str = "us"                 # a key of SCALES
    timed: bool = True                    # False: only the memory figure (leak)
    repeat: Optional[int] = None          # timed runs if --repeat is not given (None: the default)
    warmup: Optional[int] = None          # warm-up runs if --warmup is not given (None: default)
    memory: Optional[Memory] = None       # a memory figure, measured in subprocesses
    targets: tuple = ()                   # its goals (Target), each shown beside its row
    # (bytes, how they are counted): the least memory traffic one run needs, so that a GPU run
    # says what bandwidth each implementation reached (memory-bound workloads)
    traffic: Optional[tuple] = None

    def __post_init__(self):
        unknown = [target.row for target in self.targets if target.row not in self.row_ids()]
        if unknown:  # a mistyped row id would leave a goal off the table
            raise ValueError(f"{self.name}: no row {', '.join(map(repr, unknown))} for a "
                             f"target; its rows: {', '.join(self.row_ids())}")

    def row_ids(self):
        """The ids of the table rows this workload's record gets, in table order: the time
        row and its replay row, then each memory row and, when it has ratios, its replay row."""
        ids = []
        if self.timed:
            ids += [TIME_ROW, *([replay_row(TIME_ROW)] if self.replay else [])]
        for _, key, with_ratios in self.memory.rows if self.memory else ():
            ids += [key, *([replay_row(key)] if with_ratios and self.replay else [])]
        return ids


def ratio_target(text, key, limit, row=TIME_ROW, device_type=None):
    """A Target met when the ratio `key` is at most `limit`: a ratio of the times
    ("gradcore/torch", "replay/floor") or, after "memory ", of the headline memory figure
    ("memory gradcore/torch", "memory replay/gradcore"). With `device_type` ("cpu"), a run on
    another kind of device does not measure it (its floor is another library)."""
    def check(record):
        device = record.get("device", "")
        if device_type is not None and device and device.partition(":")[0] != device_type:
            return f"n/a on {device}", None
        section = record.get("memory", {}) if key.startswith("memory ") else record
        ratio = section.get("ratios", {}).get(key.removeprefix("memory "))
        if ratio is None:
            return "n/a", None
        return f"{number(ratio)}x", ratio <= limit
    return Target(text, check, row)


def check_targets(targets, record):
    """The JSON entries of `targets` (Target) checked against `record`."""
    entries = []
    for target in targets:
        measured, met = target.check(record)
        entries.append({"text": target.text, "measured": measured, "met": met, "row": target.row})
    return entries


def number(value):
    """Three significant digits, no trailing dot, no exponent: 7.99, 0.673, 11.9, 125, 1234,
    0.0000420."""
    rounded = float(f"{value:.3g}")  # first: 999.7 is 1000, so it gets the format of 1000
    if abs(rounded) >= 1000:
        return f"{value:.0f}"
    if rounded == 0 or not math.isfinite(rounded):
        return f"{value:#.3g}"
    return f"{rounded:.{2 - math.floor(math.log10(abs(rounded)))}f}"


def at_least(minimum):
    """An argparse type: an integer of at least `minimum`."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, got {text!r}")
        return value
    return parse


# ================================================================================== devices
def whole_number_from(environ, variable, default, minimum, example):
    """The environment variable `variable` as a whole number of at least `minimum` ("1e9" or
    "1000000000"), or `default` when it is not set."""
    text = environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= minimum and value.is_integer()):  # nan and inf fail too
        raise ValueError(f"{variable}: expected a whole number of at least {minimum}, such as "
                         f"{example}, got {text!r}")
    return int(value)


def resolve_device(name):
    """The concrete Device to run on: "auto" is "cuda" if backends.cuda_available() else "cpu";
    "cuda" becomes the current GPU ("cuda:0"). Raises backends.DeviceUnavailableError (which says
    what is missing) when "cuda" is asked for without CuPy or without a GPU."""
    if name == "auto":
        name = "cuda" if backends.cuda_available() else "cpu"
    device = backends.parse_device(name)
    backend = backends.backend_for_device(device)
    if device.index is None and not backend.single_device:
        device = backend.device_of(backend.zeros((), "float64", device))  # "cuda" -> "cuda:N"
    return device


def on_device(device, fn, *args):
    """A zero-argument callable running `fn(*args)` with `device` current, for hand-written
    code on a backend that computes on the current device rather than the array's (CuPy)."""
    backend = backends.backend_for_device(device)
    if not backend.needs_device_context:
        return lambda: fn(*args)

    def run():
        with backend.device_context(device):
            return fn(*args)
    return run


def to_device(device, array):
    """A NumPy array copied onto `device` (made once, outside the clock)."""
    return backends.backend_for_device(device).asarray(array, device=device)


def one_input(make_input, run_gradcore, run_floor, run_torch):
    """(make_gradcore, make_floor, make_torch) for implementations that each take one array,
    `make_input()` copied to the device outside the clock: run_gradcore(array), run_floor(xp,
    array), run_torch(torch, tensor of the same dtype)."""
    def make_gradcore(device):
        x0 = to_device(device, make_input())
        return lambda: run_gradcore(x0)

    def make_floor(device):
        x0 = to_device(device, make_input())
        return on_device(device, run_floor, backends.backend_for_device(device).xp, x0)

    def make_torch(torch, device):
        x0 = torch.tensor(make_input(), device=device)
        return lambda: run_torch(torch, x0)

    def make_replay(device):
        x0 = to_device(device, make_input())
        return replayed(lambda: run_gradcore(x0))
    return make_gradcore, make_floor, make_torch, make_replay


def graphs_wanted(environ):
    """GRADCORE_BENCH_GRAPHS: "1" (the default) lets replays run their GPU ops as CUDA graphs,
    "0" launches each op from Python (gradcore.compile's graphs=False), to measure the graphs."""
    text = environ.get("GRADCORE_BENCH_GRAPHS", "1").strip()
    if text not in ("0", "1"):
        raise ValueError(f"GRADCORE_BENCH_GRAPHS: expected 0 or 1, got {text!r}")
    return text == "1"


def replayed(run):
    """`run` compiled with gradcore.compile and run until it replays compiled Python (the first
    call records, the next ones interpret the tape), outside the clock. The returned run has
    `facts`: the median time of three recordings (after a first: it also makes the traced array
    classes and warms up their code), the tape's size, and how many times `run` ran here
    ("calls")."""
    graphs = graphs_wanted(os.environ)
    gradcore.compile(run)()  # a first recording pays what only the process's first one does
    recordings = []
    for _ in range(3):  # the median of three, as one sample swings with the machine's load
        compiled = gradcore.compile(run, graphs=graphs)
        start = time.perf_counter()
        compiled()
        recordings.append(time.perf_counter() - start)
    recording = statistics.median(recordings)
    for _ in range(INTERPRETED_REPLAYS + 1):
        compiled()
    stats = compiled.stats()
    if not stats["tapes"]:
        raise RuntimeError(f"gradcore.compile did not record a tape: {stats['why eager']}")
    # calls: how many times `run` ran here (a training step advances the model each time)
    compiled.facts = {"recording_s": recording, "tape_ops": stats["ops"][0],
                      "calls": 4 + stats["replays"], "call_overhead_us": _call_overhead(run),
                      "graphs": stats["graphs"][0], "why_not_graphs": stats["why not graphs"]}
    return compiled


def proc_bytes(path, field):
    """`field` of a /proc file of "Field:   123 kB" lines (/proc/meminfo, /proc/self/status), in
    bytes; None where there is no such file or field."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def run_child(module, args, env=None, timeout=None):
    """Run `python -m benchmarks.<module> *args` in a fresh process from the repository's root
    (which puts the repository on its path) and return the JSON object it printed last, or
    {"status": "error", "error": why}."""
    command = [sys.executable, "-m", f"benchmarks.{module}", *map(str, args)]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "error", "error": f"the child process ran past {timeout} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])
        except ValueError:
            pass
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"status": "error", "error": f"child exited with {done.returncode}: {last}"}


def child_main(child):
    """The `__main__` of a child module: child(argv) is its exit status; a traceback and status 1
    on an exception (run_child then reports the traceback's last line)."""
    try:
        sys.exit(child(sys.argv[1:]))
    except Exception:
        traceback.print_exc()
        sys.exit(1)


def thread_environment(threads):
    """os.environ with the BLAS and OpenMP thread counts set to `threads`, their pools idle
    when not working (IDLE_VARIABLES)."""
    return {**os.environ, **{name: str(threads) for name in THREAD_VARIABLES}, **IDLE_VARIABLES}


# ================================================================================== timing
def time_once(run, sync):
    """One timed call: (seconds, what run() returned). It starts from a collected heap (the
    collector stays on during the run, as in real use) and an idle device: sync() is called
    before each reading of the clock."""
    gc.collect()
    sync()
    start = time.perf_counter()
    result = run()
    sync()
    return time.perf_counter() - start, result


def import_torch():
    """The torch module; Unavailable if it does not import."""
    try:
        return importlib.import_module("torch")
    except Exception as e:  # ImportError, or a broken install failing to load its libraries
        raise Unavailable(f"PyTorch is not installed ({type(e).__name__}: {e})") from None


def torch_device(torch, device):
    """PyTorch's name for `device`; Unavailable if this PyTorch cannot run there."""
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise Unavailable(f"PyTorch {torch.__version__} has no CUDA or sees no GPU")
        return f"cuda:{device.index}"
    raise Unavailable(f"PyTorch does not run on {device}")


# ================================================================================== progress
def progress_line(done, total, elapsed, label, bar=24):
    """`[bench] [######..................]  25%  0:30, ~1:30 left  wide: round 8/23`: `done` of
    `total` units of work after `elapsed` seconds, the time left extrapolated from the pace so
    far. bar=0 leaves out the bar (a log's plain lines)."""
    fraction = min(done / total, 1.0) if total > 0 else 1.0
    left = f"~{_clock(elapsed * (1 - fraction) / fraction)}" if fraction else "?"
    filled = round(bar * fraction)
    drawn = f"[{'#' * filled}{'.' * (bar - filled)}] " if bar else ""
    return f"[bench] {drawn}{fraction:4.0%}  {_clock(elapsed)}, {left} left  {label}"


def _clock(seconds):
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}:{seconds:02d}"


class Progress:
    """Progress on stderr, in units of work (a timing round; a memory child counts as several):
    on a terminal, a progress_line redrawn in place, messages printed above it; elsewhere (a log,
    CI) only the messages, one plain line each with the same figures."""

    def __init__(self, total, stream=None):
        self.total, self.done, self.label = total, 0, ""
        self.stream = stream or sys.stderr
        self.live = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.shown = 0  # characters of the bar on screen
        self.start = time.perf_counter()

    def _line(self, label, bar):
        return progress_line(self.done, self.total, time.perf_counter() - self.start, label, bar)

    def _draw(self):
        line = self._line(self.label, 24)[:shutil.get_terminal_size().columns - 1]  # no wrap
        self.stream.write("\r" + line.ljust(self.shown))
        self.stream.flush()
        self.shown = len(line)

    def _clear(self):
        if self.shown:
            self.stream.write("\r" + " " * self.shown + "\r")
            self.shown = 0

    def advance(self, label, steps=1):
        """Count `steps` units of work as done; `label` says what is running now."""
        self.done += steps
        self.label = label
        if self.live:
            self._draw()

    def say(self, message):
        """A line of its own (what starts, what failed), above the bar."""
        if self.live:
            self._clear()
            print(f"[bench] {message}", file=self.stream, flush=True)
            self._draw()
        else:
            print(self._line(message, 0), file=self.stream, flush=True)

    def close(self):
        self._clear()  # nothing to clear where the bar is not drawn
        self.stream.flush()


# ================================================================================== the runner
@dataclasses.dataclass
class Contender:
    """One implementation of a workload, ready to time."""

    key: str                  # "gradcore", "floor", "torch", or a reference's key
    run: Callable             # one whole run
    sync: Callable            # waits for the device
    facts: dict               # what the record should say about it (PyTorch's device, threads)
    samples: list = dataclasses.field(default_factory=list)  # seconds per timed run
    result: object = None     # what the last run returned, for verify
    error: Optional[str] = None
    # runs made since the factory returned: those it made as facts["calls"] (a replay's warm-up),
    # then every call, timed or not (a training step's model advances at each)
    calls: int = 0


def wrong_result(workload, contender, device):
    """Why the contender's last result is wrong, or None: `workload.verify`, then, for a run that
    trains a model, `workload.verify_steps` after all its calls."""
    try:
        workload.verify(contender.key, contender.result)
        if workload.verify_steps is not None:
            workload.verify_steps(contender.key, contender.result, contender.calls, device)
    except Exception as e:
        return f"wrong result: {e}"
    return None


def turns(count, rounds):
    """The order of each round's runs, as lists of indices into `count` implementations: each
    round's order is the permutation whose successions (its first run after the previous round's
    last included) have come least often so far, the first such in lexicographic order. So none
    follows itself (given two or more), and for up to 6 (wide has 6, the most) each follows
    every other as often, to within one, over any number of rounds: tests/test_benchmarks.py
    counts."""
    if not count:
        return [[] for _ in range(rounds)]
    done = collections.Counter()  # (before, after) -> how often `after` ran right after `before`
    last, order = None, []
    for _ in range(rounds):
        def successions(permutation):
            return list(zip((last, *permutation), permutation))[last is None:]

        def cost(permutation):
            counts = [done[pair] for pair in successions(permutation)]
            return (permutation[0] == last, max(counts, default=0), sum(counts))
        best = min(itertools.permutations(range(count)), key=cost)
        done.update(successions(best))
        last = best[-1]
        order.append(list(best))
    return order


def candidates(workload):
    """(key, factory) for every implementation timed in the suite's process: the three columns,
    the replay, the references."""
    pairs = [(kind, getattr(workload, kind)) for kind in (*KINDS, REPLAY)]
    return pairs + [(key, factory) for key, _, factory in workload.references]


def _call_overhead(run, calls=2000):
    """Microseconds a compiled call costs before its first op and after its last: a step with
    no op, compiled and replayed, its arguments and surroundings those of `run`."""
    empty = gradcore.compile(lambda: run and None)
    for _ in range(INTERPRETED_REPLAYS + 2):
        empty()
    start = time.perf_counter()
    for _ in range(calls):
        empty()
    return (time.perf_counter() - start) / calls * 1e6


def torch_compiled(torch, run):
    """`run` (PyTorch's) through torch.compile, compiled by a first call outside the clock; its
    `facts` say how long that took, how many graphs it compiled (None: not known; 0: Dynamo runs
    `run` eagerly) and why it broke graphs. Unavailable if it fails here."""
    compiled = torch.compile(run)
    before = _dynamo_counts()
    start = time.perf_counter()
    try:
        compiled()
    except Exception as e:  # no compiler, an unsupported construct...
        raise Unavailable(f"torch.compile failed here: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}") from None
    compiling = time.perf_counter() - start
    after = _dynamo_counts()
    graphs, breaks, why = None, None, None  # where this PyTorch does not count them
    if before and after:
        graphs, breaks = after[0] - before[0], after[1] - before[1]
        why = next((reason.splitlines()[0] for reason, count in after[2].items()
                    if count > before[2].get(reason, 0)), None)

    def timed():
        return compiled()
    timed.facts = {"compile_s": compiling, "graphs": graphs, "graph_breaks": breaks,
                   "first_graph_break": why, "calls": 1}  # `run` ran once, compiling
    return timed


def _dynamo_counts():
    """(graphs compiled, graph breaks, {break reason: count}) in this process so far, from
    torch.compile's own counters; None where this PyTorch keeps none."""
    try:
        counters = importlib.import_module("torch._dynamo.utils").counters
        return (counters["stats"]["unique_graphs"], sum(counters["graph_break"].values()),
                dict(counters["graph_break"]))
    except (ImportError, AttributeError, KeyError, TypeError):
        return None


def missing(key):
    """The entry of an implementation the workload does not have (PyTorch's, the one optional)."""
    return {"status": "none", "reason": f"no {key} version of this workload"}


def run_workload(workload, device, repeat, warmup, threads, progress):
    """Time every implementation of `workload` on `device`; returns the JSON-ready record. They
    take turns, one run each per round (`warmup` untimed rounds, then `repeat` timed ones), so a
    change in the machine's load hits all of them alike, in orders (`turns`) in which each
    follows every other as often: whatever a run leaves behind (a cache full of its arrays, a
    thread pool not yet asleep: see IDLE_VARIABLES) is shared out alike. Each implementation's
    last result is checked right after its last run, outside the clock."""
    entries, contenders = {}, []
    for key, factory in candidates(workload):
        if factory is None:
            entries[key] = missing(key)
            continue
        try:
            contenders.append(prepare(key, factory, device, threads))
        except Unavailable as e:
            entries[key] = {"status": "skipped", "reason": str(e)}
        except Exception as e:  # report it, go on with the others
            entries[key] = {"status": "error", "error": f"{type(e).__name__}: {e}"}
            progress.say(f"{workload.name}/{key} FAILED while preparing: {entries[key]['error']}")
    progress.say(f"{workload.name}: timing {', '.join(c.key for c in contenders)} in turn, "
                 f"{warmup} warm-up + {repeat} timed runs each")
    take_turns(workload, contenders, device, warmup, repeat, progress)
    for c in contenders:
        entries[c.key] = _entry(workload, c, warmup)
    results = {kind: entries[kind] for kind in (*KINDS, REPLAY)}
    return {
        "results": results,
        "references": {key: {**entries[key], "label": label}
                       for key, label, _ in workload.references},
        "ratios": gradcore_ratios({kind: measured(results[kind], "median_s_per_run")
                                   for kind in (*KINDS, REPLAY)}),
    }


def take_turns(workload, contenders, device, warmup, repeat, progress=None):
    """Run the contenders in turns (`turns`): `warmup` untimed rounds, then `repeat` timed ones,
    their times added to each one's samples. One that raises, or whose last result is wrong
    (checked right after its last run, outside the clock), gets an error and runs no more."""
    rounds = warmup + repeat
    for round, order in enumerate(turns(len(contenders), rounds)):
        for c in [contenders[i] for i in order if contenders[i].error is None]:
            c.calls += 1
            try:
                seconds, result = time_once(c.run, c.sync)
            except Exception as e:
                c.error = f"{type(e).__name__}: {e}"
                continue
            if round >= warmup:
                c.samples.append(seconds)
            if round == rounds - 1:
                c.result = result
                c.error = wrong_result(workload, c, device)
                c.result = None
            # let go of it before any other run: gradcore's holds its step's whole graph
            del result
        if progress is not None:
            progress.advance(f"{workload.name}: round {round + 1}/{rounds}")


def prepare(key, factory, device, threads):
    """A Contender for one implementation, its factory run here, outside the clock. PyTorch gets
    `threads` intra-op threads on the CPU: the count the suite pins for its whole process."""
    if key not in ("torch", TORCH_COMPILE):  # sync: wait for every kernel queued on the device
        run = factory(device)
        facts = dict(getattr(run, "facts", {}))
        return Contender(key, run, lambda: backends.backend_for_device(device).synchronize(device),
                         facts, calls=facts.get("calls", 0))
    torch = import_torch()
    where = torch_device(torch, device)
    if where == "cpu":
        torch.set_num_threads(threads)
    sync = (lambda: torch.cuda.synchronize(where)) if where != "cpu" else (lambda: None)
    run = factory(torch, where)
    facts = {"torch_device": where, "torch_threads": torch.get_num_threads(),
             **getattr(run, "facts", {})}
    return Contender(key, run, sync, facts, calls=facts.get("calls", 0))


def _entry(workload, contender, warmup):
    """The record of one implementation: its figures, or why there are none (a wrong answer is
    reported, never timed)."""
    if contender.error is not None:
        return {"status": "error", "error": contender.error}
    return {"status": "ok", **timing_figures(workload, contender.samples), "warmup": warmup,
            **contender.facts}


def timing_figures(workload, samples):
    """The figures of timed runs (`samples`, seconds each): median and best in the workload's
    unit, the median run, every sample, their count."""
    median = statistics.median(samples)
    scale = SCALES[workload.time_unit] / workload.count
    return {
        f"median_{workload.time_unit}_per_{workload.unit}": median * scale,
        f"best_{workload.time_unit}_per_{workload.unit}": min(samples) * scale,
        "median_s_per_run": median,
        "samples_s_per_run": samples,
        "repeat": len(samples),
    }


def measured(entry, key):
    """The figure `key` of a result entry, or None if that implementation did not run."""
    return entry.get(key) if entry.get("status") == "ok" else None


def ratio(numerator, denominator):
    """numerator / denominator, or None unless both are known and the denominator is positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def per_unit(entry, workload_record):
    """The median figure of a result entry in the workload's unit, or None if it did not run."""
    return measured(entry, f"median_{workload_record['time_unit']}_per_{workload_record['unit']}")


def median_ratio(numerator, denominator):
    """The ratio of two result entries' median run times, or None unless both ran."""
    return ratio(measured(numerator, "median_s_per_run"),
                 measured(denominator, "median_s_per_run"))


def gradcore_ratios(figures):
    """{"gradcore/torch": ..., "gradcore/floor": ...} from each kind's figure (None: unknown);
    when `figures` has "replay", the same for it and "replay/gradcore"."""
    ratios = {f"{kind}/{other}": ratio(figures[kind], figures[other])
              for kind in ("gradcore", REPLAY) if kind in figures for other in ("torch", "floor")}
    if REPLAY in figures:
        ratios[f"{REPLAY}/gradcore"] = ratio(figures[REPLAY], figures["gradcore"])
    return ratios


# ================================================================================== machine info
def machine_info(device, threads):
    """What the figures depend on: processor, GPU, versions, thread settings, git commit."""
    cpu = {}  # /proc/cpuinfo's first processor; empty where there is none
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                cpu.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    model = cpu.get("model name") or cpu.get("Model") or cpu.get("cpu model")
    return {
        "device": str(device),
        "cpu": model or platform.processor() or None,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        # the CPU flags of a machine a hypervisor runs say so; None where they are unknown
        "virtual_machine": "hypervisor" in cpu["flags"].split() if "flags" in cpu else None,
        "load_average_1_5_15_min": load_average(),
        "gpu": _gpu_name(device),
        "gpu_peak_bytes_per_s": _gpu_peak_bandwidth(device),
        "platform": platform.platform(),
        "versions": {"python": platform.python_version(), "gradcore": gradcore.__version__,
                     "numpy": numpy.__version__, "cupy": _version("cupy"),  # imports without a GPU
                     "torch": _version("torch"), "matplotlib": _version("matplotlib")},
        "threads": _threads(threads),
        "env": {name: os.environ.get(name) for name in (
            *THREAD_VARIABLES, *IDLE_VARIABLES, "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
            "CUDA_VISIBLE_DEVICES", *settings(os.environ))},
        "numpy_blas": _numpy_blas(),
        "git": _git(),
    }


def settings(environ):
    """The names of the variables of `environ` that change what a workload runs, sorted."""
    return sorted(name for name in environ if name.startswith(SETTINGS_PREFIX))


def command_line(argv, environ):
    """The suite's command as run: `python -m benchmarks ARGV`, after the variables of `environ`
    that change what runs (GRADCORE_BENCH_BIG_SIZE=1e9...), so that it runs the same again."""
    return shlex.join([*(f"{name}={environ[name]}" for name in settings(environ)),
                       "python", "-m", "benchmarks", *argv])


def load_average():
    """The 1, 5 and 15-minute load averages, or None where the system keeps none."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def _gpu_name(device):
    """The name of the GPU the run used, or of GPU 0 if one is visible; None without one."""
    if not backends.cuda_available():
        return None
    cupy = backends.get_backend("cupy").xp
    index = device.index if device.type == "cuda" else 0
    name = cupy.cuda.runtime.getDeviceProperties(index)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _gpu_peak_bandwidth(device):
    """The GPU's memory bandwidth by its specification: two transfers a clock (DDR and HBM)
    over the whole bus; None without a GPU."""
    if device.type != "cuda":
        return None
    cupy = backends.get_backend("cupy").xp
    properties = cupy.cuda.runtime.getDeviceProperties(device.index)
    return 2 * properties["memoryClockRate"] * 1e3 * properties["memoryBusWidth"] / 8


def _version(module):
    try:
        return importlib.import_module(module).__version__
    except Exception:
        return None


def _threads(threads):
    """The thread counts in force: the suite's, and what PyTorch reports under it."""
    info = {"suite": threads, "blas_and_openmp": "set by " + ", ".join(
        [f"{name}={threads}" for name in THREAD_VARIABLES]
        + [f"{name}={value}" for name, value in IDLE_VARIABLES.items()])}
    try:
        torch = import_torch()
    except Unavailable:
        return info
    return {**info, "torch_intra_op": torch.get_num_threads(),
            "torch_inter_op": torch.get_num_interop_threads()}


def _numpy_blas():
    try:
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:
        return None


def _git():
    """The commit the code was at, and whether the tree had changes; None outside a checkout."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()

    try:  # --no-optional-locks: status must not rewrite the index of a tree others work in
        dirty = bool(git("--no-optional-locks", "status", "--porcelain"))
        return {"commit": git("rev-parse", "HEAD"), "dirty": dirty}
    except Exception:
        return None
