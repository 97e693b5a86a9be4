"""chain: 2,000 steps of `y = y * 1.0001 + 0.1` on a 0-d float64, forward + backward.

Every op is tiny, so this measures what the engine costs per op: building a node, dispatch,
the backward walk. Counting each `*` and each `+` as one op, a run is 4,000 ops.
"""
import math

import numpy

import gradcore

from .common import Unavailable, Workload, one_input, ratio_target

STEPS = 2000
OPS = 2 * STEPS  # each * and each + is one op, for every implementation
A, B = 1.0001, 0.1
X0 = 1.0

# y_n = A**n * x + B * (A**n - 1) / (A - 1), so dy/dx = A**n
EXPECTED_GRAD = A ** STEPS
EXPECTED_Y = A ** STEPS * X0 + B * (A ** STEPS - 1) / (A - 1)


def _x():
    return numpy.array(X0)  # 0-d float64


# ================================================================================ the workload
def chain_gradcore(x0):
    """gradcore: a leaf holding `x0`, the chain, backward; returns dy/dx (an array)."""
    x = gradcore.Variable(x0)
    y = x
    for _ in range(STEPS):
        y = y * A + B
    y.backward()
    return x.grad.data


def chain_floor(xp, x0):
    """The forward arithmetic alone on 0-d arrays, no autodiff; returns y.

    NumPy hands back a numpy.float64 scalar from 0-d arithmetic; `asarray` makes it a 0-d array
    again, as eager gradcore must (see `chain_numpy_scalars` for the scalar-only figure, the
    floor of the replay, whose tape runs on scalars). CuPy keeps 0-d arrays, and its `asarray`
    of a CuPy array returns it unchanged.
    """
    asarray = xp.asarray
    y = x0
    for _ in range(STEPS):
        y = asarray(asarray(y * A) + B)
    return y


def chain_numpy_scalars(x0):
    """The literal loop on a NumPy 0-d array: after the first op it runs on numpy.float64
    scalars, not arrays. A reference only: a library handing back arrays cannot go this fast."""
    y = x0
    for _ in range(STEPS):
        y = y * A + B
    return y


def chain_torch(torch, x0):
    """PyTorch: the same chain from a float64 leaf with requires_grad; returns dy/dx."""
    x = x0.detach().requires_grad_()
    y = x
    for _ in range(STEPS):
        y = y * A + B
    y.backward()
    return x.grad


# ================================================================================ factories
make_gradcore, make_floor, make_torch, make_replay = one_input(
    _x, chain_gradcore, chain_floor, chain_torch)


def make_numpy_scalars(device):
    if device.type != "cpu":
        raise Unavailable("NumPy only: other array libraries keep 0-d arrays")
    x0 = _x()
    return lambda: chain_numpy_scalars(x0)


def verify(kind, result):
    """gradcore (eager or replayed) and PyTorch must return dy/dx = 1.0001**2000; the floors, y
    itself."""
    expected = EXPECTED_GRAD if kind in ("gradcore", "replay", "torch") else EXPECTED_Y
    value = float(result)  # NumPy, CuPy (a copy to the host) or torch 0-d
    if not math.isclose(value, expected, rel_tol=1e-9):
        raise AssertionError(f"chain/{kind}: got {value!r}, expected {expected!r}")


WORKLOAD = Workload(
    name="chain",
    summary=f"{STEPS:,} x (y = y * {A} + {B}) on a 0-d float64, forward + backward",
    count=OPS,
    unit="op",
    convention=(f"each * and each + counts as one op: {OPS:,} ops a run, for gradcore, "
                "the floor and PyTorch alike"),
    gradcore=make_gradcore,
    replay=make_replay,
    floor=make_floor,
    floor_label=("the forward arithmetic alone, results kept as 0-d arrays as eager gradcore "
                 "keeps them (no autodiff, no backward)"),
    torch=make_torch,
    verify=verify,
    references=(("numpy_scalars", "the literal NumPy loop, forward only, which runs on "
                 "numpy.float64 scalars after the first op", make_numpy_scalars),),
    replay_floor="numpy_scalars",  # on NumPy the tape runs on numpy.float64 scalars too
    targets=(ratio_target("<= 0.6x PyTorch, time per op", "gradcore/torch", 0.6),
             ratio_target("replay <= 0.25x PyTorch", "replay/torch", 0.25, row="replay")),
)
