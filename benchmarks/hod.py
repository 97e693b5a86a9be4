"""hod: the 1st to 6th derivatives of tanh at 200 points, each by differentiating the last.

gradcore: `gx, = gradcore.grad(y, x, create_graph=True); y = gx`, six times from y = tanh(x);
each backward is recorded, so the graph grows with every order: this measures the engine on
graphs that it built itself. PyTorch does the same with torch.autograd.grad. The floor evaluates
the closed-form derivatives: d^k tanh / dx^k is a polynomial in t = tanh(x).
"""
import numpy
from numpy.polynomial import Polynomial

import gradcore
import gradcore.functions as F

from .common import Workload, one_input, ratio_target, to_device
from .training import assert_close, host

ORDER = 6
POINTS = 200
LOW, HIGH = -4.0, 4.0
RTOL = 1e-9  # float64, relative to the largest value of each derivative


def _x():
    return numpy.linspace(LOW, HIGH, POINTS)


def derivative_polynomials(order=ORDER):
    """Coefficients, lowest degree first, of P_1 ... P_order with d^k tanh(x)/dx^k = P_k(tanh x).

    P_0(t) = t and, as dt/dx = 1 - t**2, P_(k+1)(t) = P_k'(t) (1 - t**2); integer coefficients.
    """
    p = Polynomial([0.0, 1.0])
    one_minus_t2 = Polynomial([1.0, 0.0, -1.0])
    polynomials = []
    for _ in range(order):
        p = p.deriv() * one_minus_t2
        polynomials.append(tuple(float(c) for c in p.coef))
    return tuple(polynomials)


POLYNOMIALS = derivative_polynomials()
# tanh x = x - x**3/3 + 2 x**5/15 - 17 x**7/315 + ...: its derivatives at 0, from that series
AT_ZERO = (1.0, 0.0, -2.0, 0.0, 16.0, 0.0)
assert tuple(p[0] for p in POLYNOMIALS) == AT_ZERO, "the derivative polynomials are wrong"


# ================================================================================ the workload
def hod_gradcore(x0):
    """gradcore.grad six times, each differentiating the last gradient (create_graph=True)."""
    x = gradcore.Variable(x0)
    y = F.tanh(x)
    derivatives = []
    for _ in range(ORDER):
        gx, = gradcore.grad(y, x, create_graph=True)
        derivatives.append(gx.data)
        y = gx
    return derivatives


def hod_gradcore_backward(x0):
    """The same, DeZero style: backward(create_graph=True), read x.grad, cleargrad, again."""
    x = gradcore.Variable(x0)
    y = F.tanh(x)
    y.backward(create_graph=True)
    derivatives = [x.grad.data]
    for _ in range(ORDER - 1):
        gx = x.grad
        x.cleargrad()
        gx.backward(create_graph=True)
        derivatives.append(x.grad.data)
    return derivatives


def hod_floor(xp, x):
    """t = tanh(x), then each P_k(t) by Horner's rule: 1 + 2 * degree array ops per order."""
    t = xp.tanh(x)
    derivatives = []
    for coefficients in POLYNOMIALS:
        value = xp.full_like(t, coefficients[-1])
        for c in coefficients[-2::-1]:
            value = value * t + c
        derivatives.append(value)
    return derivatives


def hod_torch(torch, x0):
    x = x0.detach().requires_grad_()
    y = torch.tanh(x)
    seed = torch.ones_like(x0)  # the same seed gradcore.grad uses: ones shaped like y
    derivatives = []
    for _ in range(ORDER):
        gx, = torch.autograd.grad(y, x, seed, create_graph=True)
        derivatives.append(gx.detach())
        y = gx
    return derivatives


# ================================================================================ factories
make_gradcore, make_floor, make_torch, make_replay = one_input(
    _x, hod_gradcore, hod_floor, hod_torch)


def make_gradcore_backward(device):
    x0 = to_device(device, _x())
    return lambda: hod_gradcore_backward(x0)


def verify(kind, result):
    """Each derivative against the closed form evaluated in float64 NumPy on the host."""
    expected = hod_floor(numpy, _x())
    if len(result) != ORDER:
        raise AssertionError(f"hod/{kind}: {len(result)} derivatives, expected {ORDER}")
    for k, (got, want) in enumerate(zip(result, expected), 1):
        assert_close(f"hod/{kind}: derivative {k}", host(got), want, RTOL)


WORKLOAD = Workload(
    name="hod",
    summary=(f"derivatives 1 to {ORDER} of tanh at {POINTS} points in [{LOW:g}, {HIGH:g}] "
             "(float64), each by differentiating the last with create_graph=True"),
    count=1,
    unit="run",
    convention=(f"one run = tanh, then {ORDER} gradient calls, each recording its own backward "
                "(gradcore.grad / torch.autograd.grad)"),
    gradcore=make_gradcore,
    replay=make_replay,
    floor=make_floor,
    floor_label=("the closed forms: t = tanh(x), then each derivative as its polynomial in t "
                 "(Horner's rule), no autodiff"),
    torch=make_torch,
    verify=verify,
    references=(("gradcore_backward", "gradcore DeZero style: y.backward(create_graph=True), "
                 "then gx = x.grad; x.cleargrad(); gx.backward(create_graph=True)",
                 make_gradcore_backward),),
    time_unit="ms",
    targets=(ratio_target("<= 1.0x PyTorch", "gradcore/torch", 1.0),
             ratio_target("replay <= 0.5x PyTorch", "replay/torch", 0.5, row="replay")),
)
