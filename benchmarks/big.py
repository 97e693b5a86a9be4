"""big: `(sin(x) * x).sum()` forward + backward over N float64, gradcore on Dask, out of core.

x_k = k/N (k < N) is made lazily, chunk by chunk, inside the run; gradcore records the forward and
the backward on Dask arrays, and one `dask.compute` streams the chunks once for the value and the
gradient's sum together, so memory holds a few chunks per Dask thread, not N floats. The floor is
NumPy doing the same in memory (x and two arrays of its size); it is skipped, with a note, at an N
it would not fit in comfortably. There is no PyTorch version: PyTorch has no out-of-core arrays.

N is 1e7 by default (quick enough for `make bench`); GRADCORE_BENCH_BIG_SIZE sets it, for the suite
and its memory children alike: `GRADCORE_BENCH_BIG_SIZE=1e9 python -m benchmarks --only big`.
Both sums are checked against exact closed forms (`exact`), not against another float64 sum.
"""
import cmath
import functools
import importlib
import math
import os

import numpy

import gradcore
import gradcore.functions as F

from .common import Memory, Target, Unavailable, Workload, proc_bytes, whole_number_from

SIZE_VARIABLE = "GRADCORE_BENCH_BIG_SIZE"
DEFAULT_SIZE = 10_000_000
# Dask's "auto" chunk size while the graph is built: x and the seed that sum's backward
# broadcasts are both chunked "auto", so they line up (no rechunk). At N = 1e8 on 2 cores, 8 MiB
# chunks took 1.4 s and peaked at 174 MiB; Dask's default 128 MiB took 4.6 s and 2.2 GiB (chunks
# out of cache), 2 MiB 2.3 s (more tasks).
CHUNK_SIZE = "8MiB"
RTOL = 1e-9                # value and gradient sum against the closed forms ("1e-9" in a target)
TARGET_SIZE = 10 ** 9      # the memory target is for this N (1e9) and beyond
TARGET_PEAK_MIB = 2048
FLOOR_ARRAYS = 3           # what NumPy's floor holds at its peak: x, sin(x) and a temporary


def size_from(environ=os.environ):
    """N: GRADCORE_BENCH_BIG_SIZE as a whole number of at least 2 ("1e9" or "1000000000"), or
    DEFAULT_SIZE when it is not set."""
    return whole_number_from(environ, SIZE_VARIABLE, DEFAULT_SIZE, minimum=2, example="1e9")


# ================================================================================ the reference
@functools.lru_cache(maxsize=None)
def exact(n):
    """(sum of x sin x, sum of its derivative sin x + x cos x) over x_k = k h, k < n, h = 1/n (the
    float64 h the runs use), from closed forms.

    With z = e^{ih}: sum_k k z^k = -(1 - z^n + n z^(n-1) (z - 1)) / (4 sin^2(h/2)), as
    (1 - z)^2 = -4 sin^2(h/2) z; its imaginary part times h is sum x sin x, its real part times h
    is sum x cos x; sum sin x = sin(nh/2) sin((n-1)h/2) / sin(h/2). 1 - z^n and z - 1 are written
    with sines of half angles (no 1 - cos cancellation), and the numerator is a sum of two O(1)
    terms, so float64 keeps ~15 digits (4e-16 against 50-digit arithmetic up to n = 1e10).
    """
    h = 1.0 / n
    s = math.sin(h / 2)
    one_minus_zn = -2j * math.sin(n * h / 2) * cmath.exp(0.5j * n * h)
    z_minus_one = 2j * s * cmath.exp(0.5j * h)
    weighted = -(one_minus_zn + n * cmath.exp(1j * (n - 1) * h) * z_minus_one) / (4 * s * s)
    sum_sin = math.sin(n * h / 2) * math.sin((n - 1) * h / 2) / s
    return h * weighted.imag, sum_sin + h * weighted.real


def relative_errors(n, result):
    """(value's, gradient sum's) relative error against `exact(n)`; `result` = (value, sum)."""
    return tuple(abs(got - want) / abs(want) for got, want in zip(result, exact(n)))


# ================================================================================ the workload
def import_dask():
    """(dask, dask.array); Unavailable without Dask and array-api-compat (the dask extra)."""
    try:
        dask = importlib.import_module("dask")
        da = importlib.import_module("dask.array")
        importlib.import_module("array_api_compat.dask.array")  # gradcore's Dask backend needs it
    except ImportError as e:
        raise Unavailable(f"needs Dask: pip install 'gradcore[dask]' ({e})") from None
    return dask, da


def lazy_gradcore(n, chunk_size=CHUNK_SIZE):
    """gradcore on Dask, nothing computed: x (x_k = k/n, chunks of `chunk_size`), y = (sin(x) *
    x).sum(), y.backward(). Returns (x, y); x.grad holds the gradient."""
    dask, da = import_dask()
    with dask.config.set({"array.chunk-size": chunk_size}):
        x = gradcore.Variable(da.arange(n, chunks="auto", dtype="float64") * (1.0 / n))
        y = (F.sin(x) * x).sum()
        y.backward()
    return x, y


def big_gradcore(n, chunk_size=CHUNK_SIZE):
    """The value and the gradient's sum, computed together: one pass over the chunks."""
    dask, _ = import_dask()
    x, y = lazy_gradcore(n, chunk_size)
    value, grad_sum = dask.compute(y.data, x.grad.data.sum())
    return float(value), float(grad_sum)


def big_floor(n):
    """By hand in NumPy, in memory: the forward, and the backward of mul and sin with a seed of
    one (d/dx sum(sin(x) * x) = sin(x) + x cos(x)), then its sum."""
    x = numpy.arange(n, dtype=numpy.float64) * (1.0 / n)
    s = numpy.sin(x)
    value = (s * x).sum()
    grad_sum = (s + numpy.cos(x) * x).sum()
    return float(value), float(grad_sum)


def _on_the_cpu(device):
    if device.type != "cpu":
        raise Unavailable(f"big runs on the CPU (Dask's threads, NumPy's floor), not on {device}")


def available_bytes():
    """The memory the system can hand out without swapping (MemAvailable), or None if unknown."""
    return proc_bytes("/proc/meminfo", "MemAvailable")


def floor_fits(n, available=None):
    """None if NumPy's floor fits comfortably (in half the available memory) at `n`, else why
    not."""
    available = available_bytes() if available is None else available
    needed = FLOOR_ARRAYS * 8 * n
    if available is None or needed <= available / 2:
        return None
    return (f"NumPy in memory would hold about {needed / 2 ** 30:.1f} GiB ({FLOOR_ARRAYS} arrays "
            f"of {n:,} float64) and {available / 2 ** 30:.1f} GiB is available: not run at this N")


def make_workload(n):
    """The Workload for N = `n` (WORKLOAD: N from GRADCORE_BENCH_BIG_SIZE)."""
    def make_gradcore(device):
        _on_the_cpu(device)
        dask, _ = import_dask()
        x, _ = lazy_gradcore(n)  # for the facts only: the run builds its own

        def run():
            return big_gradcore(n)
        run.facts = {"size": n, "chunk_size": CHUNK_SIZE, "chunks": x.data.numblocks[0],
                     "dask_threads": dask.config.get("num_workers", None)
                     or importlib.import_module("dask.system").CPU_COUNT}
        return run

    def make_floor(device):
        _on_the_cpu(device)
        why = floor_fits(n)
        if why:
            raise Unavailable(why)

        def run():
            return big_floor(n)
        run.facts = {"size": n}
        return run

    def verify(kind, result):
        errors = relative_errors(n, result)
        if not max(errors) <= RTOL:
            raise AssertionError(f"big/{kind}: relative errors {errors[0]:.3g} (value) and "
                                 f"{errors[1]:.3g} (gradient sum) against the closed forms, "
                                 f"above {RTOL:g}")

    def probe(run, meter):
        """One run from the baseline (libraries loaded, nothing made: x is made in the run)."""
        meter.start()
        result = run()
        value_error, grad_error = relative_errors(n, result)
        return {"peak_mib": meter.peak_mib(), "size": n, "value_rel_error": value_error,
                "grad_sum_rel_error": grad_error}, result

    return Workload(
        name="big",
        summary=(f"(sin(x) * x).sum() forward + backward over N = {n:,} float64 (x_k = k/N), "
                 f"gradcore on Dask in {CHUNK_SIZE} chunks"),
        count=1,
        unit="run",
        convention=("one run = x made, the forward and backward recorded, and one dask.compute "
                    "of the value and the gradient's sum; no PyTorch version (PyTorch has no "
                    "out-of-core arrays)"),
        gradcore=make_gradcore,
        floor=make_floor,
        floor_label=("the same by hand in memory: x, sin(x), the value, sin(x) + x cos(x) and its "
                     "sum, on one thread (gradcore's Dask uses all its threads); skipped where "
                     f"{FLOOR_ARRAYS} arrays of N float64 exceed half the available memory"),
        verify=verify,
        time_unit="s",
        repeat=5,
        warmup=1,
        memory=Memory(
            summary=("peak memory of one run above the process's baseline (libraries imported; "
                     f"x is made in the run), in a fresh process per implementation; x alone is "
                     f"{n * 8 / 2 ** 20:,.0f} MiB"),
            probe=probe,
            rows=(("big, peak memory", "peak_mib", True),),
        ),
        targets=(Target("value and gradient sum within 1e-9 relative of the closed forms",
                        _accurate),
                 Target(f"peak memory <= {TARGET_PEAK_MIB / 1024:g} GiB at N = 1e9",
                        _bounded, row="peak_mib")),
    )


def _gradcore_memory(record):
    entry = record.get("memory", {}).get("results", {}).get("gradcore", {})
    return entry if entry.get("status") == "ok" else None


def _accurate(record):
    """Met if gradcore's value and gradient sum (from its memory run) are within RTOL; the timed
    runs are held to the same by `verify`."""
    entry = _gradcore_memory(record)
    if entry is None:
        return "n/a", None
    errors = entry["value_rel_error"], entry["grad_sum_rel_error"]
    return f"{errors[0]:.2g} (value), {errors[1]:.2g} (gradient sum)", max(errors) <= RTOL


def _bounded(record):
    """Met if gradcore's peak is within TARGET_PEAK_MIB at N >= TARGET_SIZE; below that N the
    figure is shown and the target is not measured."""
    entry = _gradcore_memory(record)
    if entry is None:
        return "n/a", None
    measured = f"{entry['peak_mib']:,.0f} MiB at N = {entry['size']:,}"
    if entry["size"] < TARGET_SIZE:
        return measured + f" (the target is for N = 1e9: {SIZE_VARIABLE}=1e9)", None
    return measured, entry["peak_mib"] <= TARGET_PEAK_MIB


SIZE = size_from()
WORKLOAD = make_workload(SIZE)
