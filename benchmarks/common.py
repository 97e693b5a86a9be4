"""What every workload shares: the Workload record, timing, device sync, machine info, runner."""
import dataclasses
import gc
import importlib
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Optional

import numpy

import backends
import gradcore

# Seconds -> the unit a figure is shown in.
SCALES = {"ns": 1e9, "us": 1e6, "ms": 1e3, "s": 1.0}
KINDS = ("gradcore", "floor", "torch")  # the three columns, in table order


class Unavailable(Exception):
    """Raised by a factory that cannot run here (no PyTorch, no CUDA in PyTorch, CPU-only...):
    the column shows n/a and the reason goes into the notes and the JSON."""


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark, as each workload module declares it (`WORKLOAD = Workload(...)`).

    A factory builds what a run needs (arrays on the device, closures) outside the clock and
    returns `run`, a zero-argument callable doing one whole run; `run()` returns a value that
    `verify` checks, so a fast but wrong implementation is caught, not reported.
    """

    name: str
    summary: str                          # one line: what a run computes
    count: int                            # how many `unit`s one run does (chain: 4,000 ops)
    unit: str                             # "op", "step", ...
    convention: str                       # how `count` is counted; printed under the table
    gradcore: Callable                    # gradcore(device) -> run
    floor: Optional[Callable] = None      # floor(device) -> run: by hand in NumPy/CuPy, no autodiff
    floor_label: str = ""                 # what the floor computes
    torch: Optional[Callable] = None      # torch(torch_module, torch_device) -> run
    torch_threads: Optional[int] = 1      # torch.set_num_threads on CPU (None: PyTorch's default)
    verify: Optional[Callable] = None     # verify(kind, result): AssertionError if result is wrong
    references: tuple = ()                # more (key, label, factory(device)) figures, as notes
    time_unit: str = "us"                 # a key of SCALES


# ================================================================================== devices
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


def synchronize(device):
    """Wait until every kernel queued on `device` has finished (a no-op on the CPU)."""
    backends.backend_for_device(device).synchronize(device)


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


# ================================================================================== timing
def time_once(run, sync):
    """One timed call: (seconds, what run() returned).

    It starts from a collected heap (gc.collect(); the collector stays on during the run, as in
    real use) and an idle device: sync() is called before each reading of the clock.
    """
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


def run_workload(workload, device, repeat, warmup, progress=None):
    """Time every implementation of `workload` on `device`; returns the JSON-ready record.

    The implementations take turns, one run each per round (`warmup` untimed rounds, then
    `repeat` timed ones), so a change in the machine's load hits all of them alike.
    """
    say = progress or (lambda message: None)
    entries = {}
    contenders = []
    undo = []  # put back what preparing changed (PyTorch's thread count)
    try:
        candidates = [(kind, getattr(workload, kind)) for kind in KINDS]
        candidates += [(key, factory) for key, _, factory in workload.references]
        for key, factory in candidates:
            if factory is None:
                missing = "no hand-written floor" if key == "floor" else f"no {key} version"
                entries[key] = {"status": "none", "reason": f"{missing} of this workload"}
                continue
            try:
                contenders.append(_prepare(workload, key, factory, device, undo))
            except Unavailable as e:
                entries[key] = {"status": "skipped", "reason": str(e)}
            except Exception as e:  # report it, go on with the others
                entries[key] = {"status": "error", "error": f"{type(e).__name__}: {e}"}
        say(f"{workload.name}: {', '.join(c.key for c in contenders)} in turn, "
            f"{warmup} warm-up + {repeat} timed runs each")
        for round in range(warmup + repeat):
            for c in contenders:
                if c.error is not None:
                    continue
                try:
                    seconds, c.result = time_once(c.run, c.sync)
                except Exception as e:
                    c.error = f"{type(e).__name__}: {e}"
                    continue
                if round >= warmup:
                    c.samples.append(seconds)
    finally:
        for action in reversed(undo):
            action()
    for c in contenders:
        entries[c.key] = _entry(workload, c, warmup)

    labels = {key: label for key, label, _ in workload.references}
    record = {
        "summary": workload.summary,
        "count": workload.count,
        "unit": workload.unit,
        "convention": workload.convention,
        "time_unit": workload.time_unit,
        "floor_label": workload.floor_label,
        "results": {kind: entries[kind] for kind in KINDS},
        "references": {key: {**entries[key], "label": label} for key, label in labels.items()},
    }
    results = record["results"]
    record["ratios"] = {
        "gradcore/torch": _ratio(results["gradcore"], results["torch"]),
        "gradcore/floor": _ratio(results["gradcore"], results["floor"]),
    }
    return record


def _prepare(workload, key, factory, device, undo):
    """A Contender for one implementation (its factory runs here, outside the clock)."""
    if key != "torch":
        return Contender(key, factory(device), lambda: synchronize(device), {})
    torch = import_torch()
    where = torch_device(torch, device)
    if where == "cpu" and workload.torch_threads is not None:
        undo.append(lambda threads=torch.get_num_threads(): torch.set_num_threads(threads))
        torch.set_num_threads(workload.torch_threads)
    sync = (lambda: torch.cuda.synchronize(where)) if where != "cpu" else (lambda: None)
    facts = {"torch_device": where, "torch_threads": torch.get_num_threads()}
    return Contender(key, factory(torch, where), sync, facts)


def _entry(workload, contender, warmup):
    """The record of one implementation: its figures, or why there are none."""
    if contender.error is None and workload.verify is not None:
        try:
            workload.verify(contender.key, contender.result)
        except Exception as e:  # a wrong answer is reported, never timed
            contender.error = f"wrong result: {e}"
    if contender.error is not None:
        return {"status": "error", "error": contender.error}
    median = statistics.median(contender.samples)
    scale = SCALES[workload.time_unit] / workload.count
    return {
        "status": "ok",
        f"median_{workload.time_unit}_per_{workload.unit}": median * scale,
        f"best_{workload.time_unit}_per_{workload.unit}": min(contender.samples) * scale,
        "median_s_per_run": median,
        "samples_s_per_run": contender.samples,
        "repeat": len(contender.samples),
        "warmup": warmup,
        **contender.facts,
    }


def per_unit(entry, workload_record):
    """The median figure of a result entry in the workload's unit, or None if it did not run."""
    if entry.get("status") != "ok":
        return None
    return entry[f"median_{workload_record['time_unit']}_per_{workload_record['unit']}"]


def _ratio(numerator, denominator):
    if numerator.get("status") != "ok" or denominator.get("status") != "ok":
        return None
    return numerator["median_s_per_run"] / denominator["median_s_per_run"]


# ================================================================================== machine info
def machine_info(device):
    """What the figures depend on: processor, GPU, versions, thread settings, git commit."""
    info = {
        "device": str(device),
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average_1_5_15_min": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "gpu": _gpu_name(device),
        "platform": platform.platform(),
        "versions": _versions(),
        "threads": _threads(),
        "env": {name: os.environ.get(name) for name in (
            "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
            "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")},
        "numpy_blas": _numpy_blas(),
        "git": _git(),
    }
    return info


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def _gpu_name(device):
    """The name of the GPU the run used, or of GPU 0 if one is visible; None without one."""
    if not backends.cuda_available():
        return None
    cupy = backends.get_backend("cupy").xp
    index = device.index if device.type == "cuda" else 0
    name = cupy.cuda.runtime.getDeviceProperties(index)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _version(module):
    try:
        return importlib.import_module(module).__version__
    except Exception:
        return None


def _versions():
    return {
        "python": platform.python_version(),
        "gradcore": gradcore.__version__,
        "numpy": numpy.__version__,
        "cupy": _version("cupy"),  # imports without a GPU
        "torch": _version("torch"),
    }


def _threads():
    """PyTorch's default thread counts (before a workload changes them)."""
    threads = {}
    if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
        try:
            torch = import_torch()
            threads["torch_intra_op_default"] = torch.get_num_threads()
            threads["torch_inter_op_default"] = torch.get_num_interop_threads()
        except Unavailable:
            pass
    return threads


def _numpy_blas():
    try:
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:
        return None


def _git():
    """The commit the code was at, and whether the tree had changes; None outside a checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except Exception:
        return None
