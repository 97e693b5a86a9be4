"""deep: 100 nested `sin` on a 1e6-vector (float32), forward + backward: time and peak memory.

Large arrays, so the array library decides the time; what autodiff adds is memory. Each sin's
backward needs its input, so any implementation holds 100 arrays of 4 MB at the end of the
forward; anything above that (an extra copy, a gradient kept too long, a float64 upcast) shows
in the peak, measured in a fresh process per implementation (benchmarks/memory.py).
"""
import numpy

import gradcore
import gradcore.functions as F

from .common import Memory, Workload, one_input, ratio_target
from .training import assert_close, host

DEPTH = 100
SIZE = 1_000_000
SEED = 0
RTOL = 1e-4  # float32 through 100 ops, against float64


def _x():
    return numpy.random.default_rng(SEED).uniform(-3.0, 3.0, SIZE).astype(numpy.float32)


def expected():
    """sin applied DEPTH times and the gradient prod_k cos(x_k), in float64, in O(1) arrays."""
    y = _x().astype(numpy.float64)
    gx = numpy.ones_like(y)
    for _ in range(DEPTH):
        gx *= numpy.cos(y)
        y = numpy.sin(y)
    return y, gx


_EXPECTED = []  # computed on first use, kept: verify runs once per implementation


# ================================================================================ the workload
def deep_gradcore(x0):
    """gradcore: y = sin(sin(...sin(x))), y.backward() (seed: ones); x's grad."""
    x = gradcore.Variable(x0)
    y = x
    for _ in range(DEPTH):
        y = F.sin(y)
    y.backward()
    return x.grad.data


def deep_floor(xp, x):
    """By hand: the forward keeps each sin's input, the backward multiplies by its cos."""
    inputs = []
    y = x
    for _ in range(DEPTH):
        inputs.append(y)
        y = xp.sin(y)
    gx = xp.ones_like(y)
    while inputs:  # pop: each input is let go once its cos is used, as autodiff may
        gx = gx * xp.cos(inputs.pop())
    return gx


def deep_torch(torch, x0):
    x = x0.detach().requires_grad_()
    y = x
    for _ in range(DEPTH):
        y = torch.sin(y)
    y.backward(torch.ones_like(y))
    return x.grad


# ================================================================================ factories
make_gradcore, make_floor, make_torch, make_replay = one_input(
    _x, deep_gradcore, deep_floor, deep_torch)


def verify(kind, result):
    """float32 kept, and the gradient against the float64 product of cosines."""
    if not _EXPECTED:
        _EXPECTED.append(expected()[1])
    got = host(result)
    if str(got.dtype) != "float32":
        raise AssertionError(f"deep/{kind}: the gradient is {got.dtype}, not float32")
    assert_close(f"deep/{kind}: gradient", got, _EXPECTED[0], RTOL)


# ================================================================================ memory
def probe(run, meter):
    """One run from the baseline (input made, libraries loaded): its peak above it."""
    meter.start()
    result = run()
    return {"peak_mib": meter.peak_mib(),
            "arrays_of_input_size": meter.peak_mib() / (SIZE * 4 / 2 ** 20)}, result


WORKLOAD = Workload(
    name="deep",
    summary=f"{DEPTH} nested sin on a {SIZE:,}-vector (float32), forward + backward",
    count=1,
    unit="run",
    convention=f"one run = {DEPTH} sin forward, backward from a seed of ones",
    gradcore=make_gradcore,
    replay=make_replay,
    floor=make_floor,
    floor_label=("the same by hand: the forward keeps every sin's input, the backward multiplies "
                 "by each cos and lets the input go (no autodiff)"),
    torch=make_torch,
    verify=verify,
    traffic=(DEPTH * 5 * SIZE * 4, "each sin reads its input and writes its result; each layer "
             "of the backward reads its input and the gradient and writes the next gradient"),
    time_unit="ms",
    repeat=5,
    warmup=1,
    memory=Memory(
        summary=("peak memory of one run above the process's baseline (libraries imported, "
                 f"input made), in a fresh process per implementation; one input is "
                 f"{SIZE * 4 / 2 ** 20:.2f} MiB"),
        probe=probe,
        rows=(("deep, peak memory", "peak_mib", True),),
    ),
    targets=(ratio_target("peak memory <= PyTorch's", "memory gradcore/torch", 1.0,
                          row="peak_mib"),),
)
