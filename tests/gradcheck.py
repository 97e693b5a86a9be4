"""Directional gradient check: backward against a float64 central difference along one direction.

One direction instead of one probe per element (the idea of autograd's `check_grads`): with a
random output weight `w` and input direction `v`, the scalar L(t) = sum(w * f(x + t v)) has
L'(0) = sum_i <grad_i, v_i>, where grad_i is what backward leaves on input i when seeded with `w`.
"""
import numpy as np

import gradcore

EPS = np.finfo(np.float64).eps
STEP = EPS ** (1 / 3)          # balances rounding (EPS / h) against truncation (h ** 2)
RTOL = 1e3 * EPS ** (2 / 3)    # about 4e-8 relative; a wrong gradient is off by O(1)


def directional_check(fn, arrays, xp, rng):
    """Check `fn` (Variables -> Variable) at `arrays` (float64 NumPy arrays), on the case `xp`.

    Asserts that every input gets a gradient of its own shape, dtype and device, and that the
    directional derivative from backward matches the central difference. Returns the forward
    result as a NumPy array (for a comparison with a reference).
    """
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    xs = [gradcore.Variable(xp.asarray(a)) for a in arrays]
    y = fn(*xs)
    w = np.asarray(rng.standard_normal(y.shape))
    vs = [np.asarray(rng.standard_normal(a.shape)) for a in arrays]
    y.backward(grad=xp.asarray(w))

    analytic = 0.0
    for x, v in zip(xs, vs):
        assert x.grad is not None, "an input received no gradient"
        assert tuple(x.grad.shape) == tuple(x.shape)
        assert x.grad.dtype == x.dtype
        assert x.grad.device == x.device
        analytic += float(np.sum(xp.numpy(x.grad.data) * v))

    def loss(t):
        with gradcore.no_grad():
            out = fn(*[gradcore.Variable(xp.asarray(a + t * v)) for a, v in zip(arrays, vs)])
        return xp.numpy(out.data) * w

    plus, minus = loss(STEP), loss(-STEP)
    numeric = float(np.sum(plus - minus)) / (2 * STEP)
    # rounding costs EPS * sum|w f| / STEP, truncation STEP**2 * |L'''|: both ~EPS**(2/3) * size
    scale = 1.0 + float(np.sum(np.abs(plus))) + abs(numeric)
    assert abs(analytic - numeric) <= RTOL * scale, (
        f"directional derivative: backward gives {analytic!r}, central difference {numeric!r}")
    return xp.numpy(y.data)
