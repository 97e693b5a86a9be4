"""Gradient clipping, PyTorch's names: clip_grad_norm_ and clip_grad_value_.

Both replace each parameter's `.grad` with a clipped one (the grad setter checks it) and never
read a value on the host unless asked to (error_if_nonfinite): on a GPU they queue kernels and go
on. The optimizer hook optim.ClipGrad (DeZero's) does the norm clipping inside a step.
"""
import math
import sys

import backends

from ..variable import Variable

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _with_grads(parameters):
    """The Variables among `parameters` (one, or an iterable) that have a gradient."""
    if isinstance(parameters, Variable):
        parameters = [parameters]
    parameters = list(parameters)
    distributed = sys.modules.get("gradcore.distributed.optimizer")  # none made, if not imported
    if distributed is not None:  # gradients a DistributedOptimizer will average: the mean ones
        distributed.average_before_reading(parameters)
    return [p for p in parameters if p.grad is not None]


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False):
    """Scale the gradients of `parameters` together so that their total `norm_type`-norm (2,
    1, any p > 0, or math.inf) is at most `max_norm`; returns that total norm, before clipping,
    as a 0-d Variable on the first gradient's device, in the widest of the gradients' dtypes
    (float32 at least). error_if_nonfinite=True raises (a host read) when the norm is nan or inf
    instead of scaling by it."""
    norm_type = float(norm_type)
    if not norm_type > 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be positive (or math.inf), got "
                         f"{norm_type}")
    params = _with_grads(parameters)
    if not params:
        return Variable(0.0, requires_grad=False)
    first = params[0].grad.data
    backend, device = backends.backend_of(first), params[0].grad.device
    xp = backend.xp
    # the total is summed in the widest of the gradients' dtypes, whatever their order, and never
    # below float32: a float64 gradient's power overflows float32, float16's past ~256 (for the
    # 2-norm), and a total of inf would zero every gradient
    total_dtype = xp.float32
    for dtype in {p.grad.dtype for p in params}:
        total_dtype = xp.result_type(total_dtype, dtype)
    with backend.device_context(device):
        parts = []
        for p in params:
            g = p.grad.data  # in the total's dtype before the power: 1e20 ** 2 overflows float32
            g = xp.abs(g if g.dtype == total_dtype else xp.astype(g, total_dtype))
            part = xp.max(g) if norm_type == math.inf else xp.sum(g ** norm_type)
            parts.append(backends.to_device(xp.astype(part, total_dtype), device))
        total = xp.max(xp.stack(parts)) if norm_type == math.inf else (
            xp.sum(xp.stack(parts)) ** (1.0 / norm_type))
        if error_if_nonfinite and not bool(xp.isfinite(total)):
            raise RuntimeError(f"clip_grad_norm_: the total norm of the gradients is "
                               f"{float(total)}; pass error_if_nonfinite=False to scale by it")
        scale = xp.clip(max_norm / (total + 1e-6), None, 1.0)  # CuPy's clip: no max=
    for p in params:
        g = p.grad
        with g.backend.device_context(g.device):
            factor = backends.to_device(xp.astype(scale, g.dtype), g.device)
            p.grad = Variable(g.data * factor, requires_grad=False)
    return Variable(total, requires_grad=False)



def clip_grad_value_(parameters, clip_value):
    """Clip every gradient of `parameters` to [-clip_value, clip_value], elementwise."""
    clip_value = float(clip_value)
    if clip_value < 0:
        raise ValueError(f"clip_grad_value_: clip_value must be >= 0, got {clip_value}")
    for p in _with_grads(parameters):
        g = p.grad
        with g.backend.device_context(g.device):
            p.grad = Variable(g.xp.clip(g.data, -clip_value, clip_value), requires_grad=False)
