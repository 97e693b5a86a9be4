"""leak: `square(square(square(x)))` and its backward on 100,000 floats, 2,000 times over.

Each iteration builds a fresh graph from a fresh leaf and drops it. If anything kept a graph
alive (a reference cycle the collector is slow to find, a global cache, a gradient holding its
graph), the peak memory would climb with the number of iterations. So the figure is the peak
above the memory in use after the warm-up, read after 200 and after 2,000 iterations, each
implementation in a fresh process (benchmarks/memory.py): without a leak the two are the same.
"""
import numpy

import gradcore
import gradcore.functions as F

from .common import Memory, Target, Workload, one_input
from .training import assert_close, host

SIZE = 100_000
WARMUP = 20
SHORT, LONG = 200, 2000
SEED = 0
TOLERANCE_MIB = 1.0  # how much more growth 2,000 iterations may show than 200: < 600 B each


def _x():
    return numpy.random.default_rng(SEED).uniform(-1.0, 1.0, SIZE)


# ================================================================================ one iteration
def leak_gradcore(x0):
    """gradcore: a fresh leaf, y = square(square(square(x))), y.backward(); x's grad (8 x**7)."""
    x = gradcore.Variable(x0)
    y = F.square(F.square(F.square(x)))
    y.backward()
    return x.grad.data


def leak_floor(xp, x):
    """By hand: the three squares, then the chain rule back (seed ones), no autodiff."""
    a = x * x
    b = a * a
    c = b * b
    gy = xp.ones_like(c)
    gb = gy * (2 * b)
    ga = gb * (2 * a)
    return ga * (2 * x)


def leak_torch(torch, x0):
    x = x0.detach().requires_grad_()
    y = torch.square(torch.square(torch.square(x)))
    y.backward(torch.ones_like(y))
    return x.grad


# ================================================================================ factories
make_gradcore, make_floor, make_torch, _ = one_input(_x, leak_gradcore, leak_floor, leak_torch)


def verify(kind, result):
    assert_close(f"leak/{kind}: gradient", host(result), 8 * _x() ** 7, 1e-12)


# ================================================================================ memory
def probe(run, meter):
    """WARMUP iterations, the baseline, then LONG more, reading the peak after SHORT and LONG."""
    for _ in range(WARMUP):
        run()
    # the memory in use, not the warm-up's peak: a leak smaller than one iteration's arrays
    # would otherwise hide below that peak for hundreds of iterations
    meter.start()
    figures = {"warmup_iterations": WARMUP}
    for i in range(1, LONG + 1):
        result = run()
        if i == SHORT:
            figures["growth_200_mib"] = meter.peak_mib()
    figures["growth_2000_mib"] = meter.peak_mib()
    return figures, result


def _independent(record):
    """Met if gradcore's peak grew by at most TOLERANCE_MIB more over 2,000 iterations than
    over 200."""
    entry = record.get("memory", {}).get("results", {}).get("gradcore", {})
    if entry.get("status") != "ok":
        return "n/a", None
    short, long = entry["growth_200_mib"], entry["growth_2000_mib"]
    measured = f"+{short:.2f} MiB after {SHORT:,}, +{long:.2f} MiB after {LONG:,} iterations"
    return measured, long - short <= TOLERANCE_MIB


WORKLOAD = Workload(
    name="leak",
    summary=(f"{LONG:,} iterations of square(square(square(x))) and backward on {SIZE:,} "
             "float64, each from a fresh leaf"),
    count=1,
    unit="iteration",
    convention="memory only: the peak above the memory in use after the warm-up, not a time",
    gradcore=make_gradcore,
    floor=make_floor,
    floor_label="the same arithmetic by hand, forward and chain rule (no autodiff)",
    torch=make_torch,
    verify=verify,
    timed=False,
    memory=Memory(
        summary=(f"peak memory after {SHORT:,} and after {LONG:,} iterations, above the memory "
                 f"in use after {WARMUP} warm-up iterations, in a fresh process per "
                 f"implementation; one array is {SIZE * 8 / 2 ** 20:.2f} MiB"),
        probe=probe,
        rows=((f"leak, {SHORT:,} iterations", "growth_200_mib", False),
              (f"leak, {LONG:,} iterations", "growth_2000_mib", False)),
    ),
    targets=(Target(f"peak growth independent of the loop count (200 vs 2,000: "
                    f"within {TOLERANCE_MIB:g} MiB)", _independent, row="growth_2000_mib"),),
)
