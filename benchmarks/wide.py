"""wide: 1,000 branches `sin(x * i)` of one 16-vector, summed into one output; forward + backward.

Every branch reads x, so backward gathers 1,000 gradients into x and the walk's queue holds
1,000 Functions at once: what the engine costs on a wide graph (a list re-sorted on every
insertion, as in DeZero, turns quadratic here). Each op is tiny, so per-op overhead decides.
"""
import math

import numpy

import backends
import gradcore
import gradcore.functions as F

from .common import Unavailable, Workload, on_device, one_input, ratio_target, to_device
from .stripped import wide_stripped
from .training import assert_close, host

BRANCHES = 1000
SIZE = 16
SEED = 0
RTOL = 1e-9  # float64 throughout; the sums run in different orders


def _x():
    return numpy.random.default_rng(SEED).standard_normal(SIZE)


def expected():
    """sum(sum_i sin(x i)) and its gradient sum_i i cos(x i), in float64 on the host."""
    x = _x()
    i = numpy.arange(1, BRANCHES + 1, dtype=numpy.float64)[:, None]
    return float(numpy.sin(i * x).sum()), (i * numpy.cos(i * x)).sum(axis=0)


# ================================================================================ the workload
def wide_gradcore(x0):
    """gradcore: y = sin(x * 1) + sin(x * 2) + ... + sin(x * 1000), sum(y).backward(); x's grad."""
    x = gradcore.Variable(x0)
    y = F.sin(x * 1)
    for i in range(2, BRANCHES + 1):
        y = y + F.sin(x * i)
    F.sum(y).backward()
    return x.grad.data


def wide_floor(xp, x):
    """The same ops one at a time, no autodiff: the forward keeps each x * i, as autodiff must,
    and the backward adds up i * cos(x * i). Returns (the sum, its gradient)."""
    products = []
    y = None
    for i in range(1, BRANCHES + 1):
        t = x * i
        products.append(t)
        s = xp.sin(t)
        y = s if y is None else y + s
    total = xp.sum(y)
    gx = xp.zeros_like(x)
    for i, t in enumerate(products, 1):  # d sin(x i) / dx = i cos(x i)
        gx = gx + xp.cos(t) * i
    return total, gx


def wide_vectorised(xp, x, i):
    """A reference: all branches as one (1000, 16) array, three array calls each way."""
    t = i * x
    return xp.sum(xp.sin(t)), xp.sum(i * xp.cos(t), axis=0)


def wide_torch(torch, x0):
    x = x0.detach().requires_grad_()
    y = torch.sin(x * 1)
    for i in range(2, BRANCHES + 1):
        y = y + torch.sin(x * i)
    y.sum().backward()
    return x.grad


# ================================================================================ factories
make_gradcore, make_floor, make_torch, make_replay = one_input(
    _x, wide_gradcore, wide_floor, wide_torch)


def make_vectorised(device):
    x = to_device(device, _x())
    i = to_device(device, numpy.arange(1, BRANCHES + 1, dtype=numpy.float64)[:, None])
    return on_device(device, wide_vectorised, backends.backend_for_device(device).xp, x, i)


def make_stripped(device):
    if device.type != "cpu":
        raise Unavailable("NumPy only: the stripped engine has no backends")
    x0 = _x()
    return lambda: wide_stripped(x0, BRANCHES)


def verify(kind, result):
    """The gradient (and, for the floors, the sum) against the float64 closed form."""
    total, gx = expected()
    if kind in ("floor", "vectorised"):
        got_total, result = result
        got_total = float(host(got_total))
        if not math.isclose(got_total, total, rel_tol=RTOL, abs_tol=RTOL * BRANCHES):
            raise AssertionError(f"wide/{kind}: sum {got_total!r}, expected {total!r}")
    assert_close(f"wide/{kind}: gradient", host(result), gx, RTOL)


WORKLOAD = Workload(
    name="wide",
    summary=(f"{BRANCHES:,} branches sin(x * i) of one {SIZE}-vector (float64) summed into one "
             "output, forward + backward"),
    count=BRANCHES,
    unit="branch",
    convention=(f"one branch = x * i, sin, and its + into the total, forward and backward; a run "
                f"is {BRANCHES:,} branches and the final sum"),
    gradcore=make_gradcore,
    replay=make_replay,
    floor=make_floor,
    floor_label=("the same ops one at a time, keeping each x * i, then the gradient "
                 "sum of i * cos(x * i) one branch at a time (no autodiff)"),
    torch=make_torch,
    verify=verify,
    references=(("vectorised", "forward and backward as three (1000, 16) array ops each way, "
                 "no Python loop", make_vectorised),
                ("stripped", "the bare design: an engine with a Function per op, weakly held "
                 "outputs, the heap walk and backward in its own ops, but no backends, checks or "
                 "hooks (benchmarks/stripped.py)", make_stripped)),
    targets=(ratio_target("<= 0.6x PyTorch", "gradcore/torch", 0.6),
             ratio_target("replay <= 0.35x PyTorch", "replay/torch", 0.35, row="replay")),
)
