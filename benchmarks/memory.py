"""Memory figures: each implementation measured alone, in a fresh Python process of its own.

A process's peak memory only ever grows, and importing PyTorch alone adds some 250 MiB to it, so
the parent (`measure`) starts one child per implementation: `python -m benchmarks.memory NAME
KIND DEVICE THREADS`. The child builds the implementation with the workload's factory, hands it
to the workload's `Memory.probe` with a Meter, checks the result with `verify`, and prints its
figures as one JSON line. Every figure is a difference from the child's own baseline (imports and
inputs done), so what the libraries cost to import never counts. The replay's factory records its
tape and replays it until it runs as compiled Python, so its figure is a steady-state replay's.

On Linux the CPU peak is VmHWM from /proc/self/status, not getrusage's ru_maxrss: Linux carries
ru_maxrss across exec, so a child that subprocess starts (vfork + exec) reports its parent's
peak, and after the timed runs every child would start above anything it does itself. VmHWM
belongs to the child's own address space, and writing 5 to /proc/self/clear_refs lowers it to
the current resident set, so a baseline is what the process holds, not what its imports once
peaked at. Before that, malloc_trim returns the pages malloc keeps after frees: a run after
warm-up runs (a replay's) would reuse them, and its peak would not rise above a baseline that
counts them. Elsewhere (macOS) ru_maxrss is the fallback.

Every child runs with glibc malloc's mmap threshold fixed (MALLOC_VARIABLES); a child started
without it, by hand, starts itself again with it.
"""
import ctypes
import json
import os
import resource
import sys

from . import load
from .common import (KINDS, REPLAY, Unavailable, child_main, gradcore_ratios, import_torch,
                     measured, missing, prepare, proc_bytes, resolve_device, run_child,
                     thread_environment, wrong_result)

TIMEOUT_S = 600
MIB = 1024 * 1024
MEMORY_WEIGHT = 10  # a child counts as this many timing rounds in the suite's progress bar
# glibc malloc's settings in every memory child, the same for each implementation. By default
# an allocation above the mmap threshold (128 KiB) is mapped on its own and unmapped when freed,
# but each such free raises the threshold (up to 32 MiB), and blocks below it come from the heap,
# where freed memory is kept and reused as fragmentation allows: the resident peak then depends
# on the order of allocations and frees (PyTorch's deep_checkpoint: 219 or 502 MiB, run to run).
# Fixed, every array of 128 KiB or more is mapped on its own, and the peak counts about the bytes
# in use, as the GPU meters do (deep_checkpoint: 157 MiB, run after run).
MALLOC_VARIABLES = {"MALLOC_MMAP_THRESHOLD_": "131072"}
MALLOC_NOTE = ("each child runs with glibc malloc's mmap threshold fixed at 128 KiB "
               "(MALLOC_MMAP_THRESHOLD_=131072), so that its resident peak counts the arrays "
               "in use")


class Meter:
    """The peak memory a workload reaches, in MiB above the baseline taken by `start()`.

    CPU: the process's peak resident set (VmHWM; ru_maxrss without /proc). GPU: for CuPy
    (gradcore and the floor), every allocation of the default memory pool goes through a counting
    allocator, so the peak is of bytes in use, not of bytes the pool keeps, and the memory the
    replay's CUDA graphs hold (their own pools, filled when they were captured, before the
    baseline) counts on top, as a step's: without graphs those arrays would come and go within
    it; for PyTorch, torch.cuda's peak statistics (max_memory_allocated), the same quantity.
    """

    def __init__(self, kind, device):
        self.kind = kind
        self.device = device
        self.baseline = 0
        self._graphs = lambda: 0  # bytes held by device graphs (CuPy's, for gradcore)
        if device.type == "cpu":
            if _vm_hwm() is not None:
                self.source = ("VmHWM of /proc/self/status (peak resident set), reset by "
                               "/proc/self/clear_refs at the baseline; MALLOC_MMAP_THRESHOLD_="
                               f"{os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')}")
                self._peak = _vm_hwm
            else:
                self.source = "ru_maxrss (peak resident set of the process)"
                self._peak = _max_rss
        elif kind == "torch":
            self.torch = import_torch()
            self.source = "torch.cuda.max_memory_allocated"
            self._peak = lambda: self.torch.cuda.max_memory_allocated(device.index)
        else:
            import cupy  # this child runs on a GPU: CuPy is there

            import backends

            self.source = ("CuPy memory pool: peak of used_bytes(), every allocation counted, "
                           "plus the memory held by CUDA graphs")
            self._pool = cupy.get_default_memory_pool()
            self._highest = self._pool.used_bytes()
            cupy.cuda.set_allocator(self._counting_malloc)
            self._peak = lambda: self._highest
            self._graphs = lambda: backends.get_backend("cupy").graph_memory(device)

    def _counting_malloc(self, size):
        memory = self._pool.malloc(size)
        used = self._pool.used_bytes()
        if used > self._highest:
            self._highest = used
        return memory

    def start(self):
        """Take the baseline, the memory in use now: figures from now on are peaks above it."""
        if self.device.type == "cuda":
            if self.kind == "torch":
                cuda = self.torch.cuda
                cuda.synchronize(self.device.index)
                cuda.reset_peak_memory_stats(self.device.index)
                self.baseline = cuda.memory_allocated(self.device.index)
            else:
                self._highest = self._pool.used_bytes()
                self.baseline = self._highest
        else:
            _release_freed_memory()
            _reset_hwm()
            self.baseline = self._peak()

    def peak_mib(self):
        """The highest memory use since `start()`, less the baseline, in MiB."""
        return (self._peak() - self.baseline + self._graphs()) / MIB

    def facts(self):
        return {"meter": self.source, "baseline_mib": self.baseline / MIB}


def _vm_hwm():
    """The peak resident set of this process's address space in bytes; None without /proc."""
    return proc_bytes("/proc/self/status", "VmHWM")


def _release_freed_memory():
    """Hand back to the system what malloc keeps of freed memory (glibc's malloc_trim), so that
    the resident set is what the process holds; harmless where there is no malloc_trim."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_hwm():
    """Lower VmHWM to the current resident set (Linux 4.0+); harmless where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _max_rss():
    """The process's peak resident set in bytes (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# ================================================================================== the parent
def measured_kinds(workload):
    """The implementations whose memory is measured: the three columns, and the replay when the
    workload has one."""
    return (*KINDS, REPLAY) if workload.replay is not None else KINDS


def measure(workload, device, threads, progress):
    """The memory record of `workload`: one child process per implementation, one at a time."""
    results = {}
    for kind in measured_kinds(workload):
        if getattr(workload, kind) is None:
            results[kind] = missing(kind)
        else:
            progress.advance(f"{workload.name}: memory of {kind}, in a process of its own", 0)
            results[kind] = run_child("memory", [workload.name, kind, device, threads],
                                      env=memory_environment(threads), timeout=TIMEOUT_S)
            if results[kind]["status"] == "error":
                progress.say(f"{workload.name}/{kind} memory FAILED: {results[kind]['error']}")
        progress.advance(f"{workload.name}: memory of {kind} done", MEMORY_WEIGHT)
    rows = [{"label": label, "key": key, "ratios": with_ratios}
            for label, key, with_ratios in workload.memory.rows]
    headline = rows[0]  # the figure a target reads ("memory gradcore/torch")
    figures = {kind: measured(entry, headline["key"]) for kind, entry in results.items()}
    summary = workload.memory.summary
    if str(device).partition(":")[0] == "cpu":  # the GPU meters count no host memory
        summary += f"; {MALLOC_NOTE}"
    return {"summary": summary, "unit": "MiB", "rows": rows, "results": results,
            "ratios": gradcore_ratios(figures) if headline["ratios"] else {}}


def memory_environment(threads):
    """The environment of a memory child: thread_environment(threads) and MALLOC_VARIABLES."""
    return {**thread_environment(threads), **MALLOC_VARIABLES}


# ================================================================================== the child
def child(argv):
    """Measure one implementation of one workload; print its figures as one JSON line."""
    name, kind, device_name, threads = argv
    workload = load([name])[0]
    device = resolve_device(device_name)
    try:
        contender = prepare(kind, getattr(workload, kind), device, int(threads))
    except Unavailable as e:
        print(json.dumps({"status": "skipped", "reason": str(e)}))
        return 0
    meter = Meter(kind, device)

    def run():
        contender.calls += 1  # the probe's calls, for verify_steps
        return contender.run()
    figures, contender.result = workload.memory.probe(run, meter)
    contender.sync()
    error = wrong_result(workload, contender, device)
    if error:
        print(json.dumps({"status": "error", "error": error}))
        return 0
    print(json.dumps({"status": "ok", **figures, **meter.facts(), **contender.facts}))
    return 0


if __name__ == "__main__":
    if any(os.environ.get(key) != value for key, value in MALLOC_VARIABLES.items()):
        # malloc reads them once, as the process starts: start again with them
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.memory", *sys.argv[1:]],
                  {**os.environ, **MALLOC_VARIABLES})
    child_main(child)
