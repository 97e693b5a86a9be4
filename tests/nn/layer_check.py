"""A directional gradient check for a whole module: with respect to its input and to every
parameter at once (the idea of harness.directional_check, applied to a module's parameters)."""
import numpy as np

import gradcore
from harness import RTOL, STEP


def check_module(module, x, xp, rng, run=None):
    """Check backward of `run(module, x)` (default: module(x)) against a central difference.

    `x` is a NumPy array (float64, or integer ids: then only the parameters are checked). The
    module is made float64 and moved to xp's device first (its lazy parameters are created by a
    first call). Asserts that every parameter and the input get gradients of their own shape,
    dtype and device, and that sum <grad, v> over a random direction v matches the central
    difference of sum(w * y). Returns the output as NumPy.
    """
    run = run or (lambda m, v: m(v))
    module.to(xp.device)
    run(module, gradcore.Variable(xp.asarray(x)))  # creates lazy parameters on the device
    module.to(dtype="float64")
    differentiable_x = np.issubdtype(np.asarray(x).dtype, np.floating)
    xv = gradcore.Variable(xp.asarray(x))
    module.zero_grad()
    y = run(module, xv)
    w = rng.standard_normal(y.shape)
    y.backward(grad=xp.asarray(w))

    params = list(module.parameters())
    origins = [xp.numpy(p.data).copy() for p in params]
    directions = [rng.standard_normal(o.shape) for o in origins]
    analytic = 0.0
    for p, v in zip(params, directions):
        assert p.grad is not None, "a parameter received no gradient"
        assert tuple(p.grad.shape) == tuple(p.shape)
        assert p.grad.dtype == p.dtype and p.grad.device == xp.device
        analytic += float(np.sum(xp.numpy(p.grad.data) * v))
    vx = rng.standard_normal(np.shape(x)) if differentiable_x else None
    if differentiable_x:
        assert xv.grad is not None and xv.grad.device == xp.device
        analytic += float(np.sum(xp.numpy(xv.grad.data) * vx))

    def loss(t):
        for p, o, v in zip(params, origins, directions):
            p.data = xp.asarray(o + t * v)
        xt = x + t * vx if differentiable_x else x
        with gradcore.no_grad():
            out = run(module, gradcore.Variable(xp.asarray(xt)))
        return xp.numpy(out.data) * w

    plus, minus = loss(STEP), loss(-STEP)
    for p, o in zip(params, origins):
        p.data = xp.asarray(o)
    numeric = float(np.sum(plus - minus)) / (2 * STEP)
    scale = 1.0 + float(np.sum(np.abs(plus))) + abs(numeric)
    assert abs(analytic - numeric) <= RTOL * scale, (
        f"directional derivative: backward gives {analytic!r}, central difference {numeric!r}")
    return xp.numpy(y.data)
