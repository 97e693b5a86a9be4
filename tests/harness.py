"""The op harness: one declarative `Case` per op row, one `check_case` that runs every check.

For a row and a backend case `xp` it checks: forward against the NumPy reference; a directional
gradient check in float64 (a random output weight `w` and input direction `v`: backward's
sum_i <grad_i, v_i> against a central difference of L(t) = sum(w * f(x + t v))); the same check on
the gradient itself, built with create_graph (double backward); and that float32 inputs give a
float32 output and float32 gradients. One direction instead of one probe per element is the idea
of autograd's `check_grads`: one check per row, whatever the size.
"""
from typing import Callable, NamedTuple

import numpy as np

import gradcore

EPS = np.finfo(np.float64).eps
STEP = EPS ** (1 / 3)          # balances rounding (EPS / h) against truncation (h ** 2)
RTOL = 1e3 * EPS ** (2 / 3)    # about 4e-8 relative; a wrong gradient is off by O(1)


class Case(NamedTuple):
    """One row: `fn(*variables, *args)` against `ref(*arrays, *args)`.

    `shapes`: one per differentiable input, drawn uniformly from `domain`. `args`: constants passed
    after them (NumPy arrays go to the backend's device; labels, masks, indices). `double=False`
    skips the second-order check (ops whose backward is not differentiable), `float32=False` the
    dtype check. `rtol` loosens the forward comparison only.
    """
    name: str
    fn: Callable
    ref: Callable
    shapes: tuple
    domain: tuple = (-2.0, 2.0)
    args: tuple = ()
    double: bool = True
    float32: bool = True
    rtol: float = 1e-12


def ids(cases):
    return [c.name for c in cases]


def _to_case(xp, value):
    return xp.asarray(value) if isinstance(value, np.ndarray) else value


def directional_check(fn, arrays, xp, rng, allow_unused=False):
    """Check `fn` (Variables -> Variable) at `arrays` (float64 NumPy arrays), on the case `xp`.

    Asserts that every input gets a gradient of its own shape, dtype and device, and that the
    directional derivative from backward matches the central difference. With `allow_unused`, an
    input with no gradient counts as a zero gradient. Returns the forward result as NumPy.
    """
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    xs = [gradcore.Variable(xp.asarray(a)) for a in arrays]
    y = fn(*xs)
    w = np.asarray(rng.standard_normal(y.shape))
    vs = [np.asarray(rng.standard_normal(a.shape)) for a in arrays]
    y.backward(grad=xp.asarray(w))

    analytic = 0.0
    for x, v in zip(xs, vs):
        if x.grad is None and allow_unused:
            continue
        assert x.grad is not None, "an input received no gradient"
        assert tuple(x.grad.shape) == tuple(x.shape)
        assert x.grad.dtype == x.dtype
        assert x.grad.device == x.device
        analytic += float(np.sum(xp.numpy(x.grad.data) * v))

    def loss(t):  # grad mode stays on: fn may itself differentiate (the second-order check)
        out = fn(*[gradcore.Variable(xp.asarray(a + t * v)) for a, v in zip(arrays, vs)])
        return xp.numpy(out.data) * w

    plus, minus = loss(STEP), loss(-STEP)
    numeric = float(np.sum(plus - minus)) / (2 * STEP)
    # rounding costs EPS * sum|w f| / STEP, truncation STEP**2 * |L'''|: both ~EPS**(2/3) * size
    scale = 1.0 + float(np.sum(np.abs(plus))) + abs(numeric)
    assert abs(analytic - numeric) <= RTOL * scale, (
        f"directional derivative: backward gives {analytic!r}, central difference {numeric!r}")
    return xp.numpy(y.data)


def gradient_of(fn, xp, rng, shapes):
    """x -> sum_i <u_i, d/dx_i sum(w * fn(x))>, built with create_graph: its gradient is the
    second derivative of fn in the direction u, so checking it checks double backward."""
    state = {}

    def h(*xs):
        y = fn(*xs)
        if "w" not in state:
            state["w"] = np.asarray(rng.standard_normal(y.shape))
            state["u"] = [np.asarray(rng.standard_normal(s)) for s in shapes]
        w = gradcore.Variable(xp.asarray(state["w"]), requires_grad=False)
        gs = gradcore.grad(y, list(xs), grad_outputs=w, create_graph=True, allow_unused=True)
        # starts as a zero that depends on x: for a linear op the gradient is a constant
        total = gradcore.functions.sum(xs[0] * 0.0)
        for g, u in zip(gs, state["u"]):
            if g is not None:
                total = total + gradcore.functions.sum(g * xp.asarray(u))
        return total

    return h


def check_case(case, xp, seed=None):
    """Every check of the harness for one row on one backend case."""
    rng = np.random.default_rng(sum(map(ord, case.name)) if seed is None else seed)
    lo, hi = case.domain
    arrays = [rng.uniform(lo, hi, size=shape) for shape in case.shapes]
    args = [_to_case(xp, a) for a in case.args]

    def fn(*xs):
        return case.fn(*xs, *args)

    y = directional_check(fn, arrays, xp, rng)
    expected = np.asarray(case.ref(*arrays, *case.args))
    assert y.shape == expected.shape, f"shape {y.shape}, reference {expected.shape}"
    np.testing.assert_allclose(y, expected, rtol=case.rtol, atol=case.rtol)

    if case.double:
        directional_check(gradient_of(fn, xp, rng, case.shapes), arrays, xp, rng,
                          allow_unused=True)

    if case.float32:
        xs = [gradcore.Variable(xp.asarray(a, dtype="float32")) for a in arrays]
        y32 = fn(*xs)
        assert y32.dtype == xp.float32, f"float32 inputs gave a {y32.dtype} output"
        y32.backward()
        for x in xs:
            if x.grad is not None:
                assert x.grad.dtype == xp.float32, f"float32 input got a {x.grad.dtype} gradient"
