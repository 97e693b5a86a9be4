"""Gradient clipping, PyTorch's names: clip_grad_norm_ and clip_grad_value_.

Both replace each parameter's `.grad` with a clipped one (the grad setter checks it) and never
read a value on the host unless asked to (error_if_nonfinite): on a GPU they queue kernels and go
on. The optimizer hook optim.ClipGrad (DeZero's) does the norm clipping inside a step, with the
same norm (norm_parts).
"""
import contextlib
import math
import sys
from collections.abc import Iterable, Mapping

import backends

from ..variable import Variable

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _parameters(parameters, where):
    """The Variables of `parameters`, each once (by identity: a weight tied between two layers,
    listed twice as list(enc.parameters()) + list(dec.parameters()) gives it, is one gradient),
    in order: `parameters` is a model (an object with parameters(), or DeZero's params()), one
    Variable, or an iterable of Variables."""
    if isinstance(parameters, Variable):
        return [parameters]
    get = getattr(parameters, "parameters", None)
    get = get if callable(get) else getattr(parameters, "params", None)
    if isinstance(parameters, type):  # MLP for MLP(...): its parameters() needs a model
        raise TypeError(f"{where}: got the class {parameters.__name__}, not a model; pass the "
                        f"model (model = {parameters.__name__}(...)) or model.parameters()")
    if callable(get):
        parameters = get()
    elif (backends.is_array(parameters) or isinstance(parameters, (str, bytes, Mapping))
          or not isinstance(parameters, Iterable)):
        raise TypeError(f"{where}: expected the parameters whose gradients to clip: a model (an "
                        "object with parameters() or params()), a Variable, or an iterable of "
                        f"Variables (model.parameters()); got {type(parameters).__name__}")
    from ..optim.params import _unique_params  # not at the top: optim imports nn
    return _unique_params(parameters, where)


def _with_grads(parameters, where):
    """The Variables among `parameters` (see _parameters) that have a gradient, each once."""
    parameters = _parameters(parameters, where)
    distributed = sys.modules.get("gradcore.distributed.optimizer")  # none made, if not imported
    if distributed is not None:  # gradients a DistributedOptimizer will average: the mean ones
        distributed.average_before_reading(parameters)
    return [p for p in parameters if p.grad is not None]


def norm_parts(grads, norm_type=2.0, scaled=True):
    """(r, inv): the total `norm_type`-norm of the gradients `grads` (Variables) is r / inv, both
    0-d arrays on the first gradient's device, in the widest of the gradients' dtypes and float32
    at least (float16 gradients are summed in float32, whose sum of squares holds their largest).

    inv is 1 / the largest magnitude among the gradients (brought into the dtype's normal range),
    and r the norm of the gradients times inv: each power is of a number <= 1, so none overflows
    where the norm fits the dtype (float32 gradients of 3e19 and 4e19: the norm 5e19, not the
    inf their squares would sum to). An inf gradient gives r = inf, a NaN one NaN; gradients of
    no elements add nothing. This costs two reductions (the largest magnitude) and a
    multiplication per gradient more than `scaled=False`, the plain sum of powers (inv = 1),
    which is right unless a power overflows: then r is inf."""
    # each gradient's backend from its array (inside gradcore.compile, the tracing one)
    parts = [(g.data, backends.backend_of(g.data), g.device) for g in grads]
    _, backend, device = parts[0]
    xp = backend.xp
    dtype = xp.float32
    for other, d in {(b, a.dtype) for a, b, _ in parts}:
        if other is not backend:  # another library's dtype: the one of its width here
            d = xp.float64 if other.xp.finfo(d).bits > 32 else xp.float32
        dtype = xp.result_type(dtype, d)
    parts = [part for part in parts if part[0].size != 0]  # nothing to add, and no maximum
    one = backend.asarray(1.0, dtype=dtype, device=device)
    if not parts:
        return backend.asarray(0.0, dtype=dtype, device=device), one

    def here(x, b, d):  # x, a 0-d result on b's device d, on the first's, in the total's dtype
        if b is not backend or d != device:
            x = backends.to_device(x, device)
        return x if x.dtype == dtype else xp.astype(x, dtype)

    inv = one
    if scaled or norm_type == math.inf:
        highs, lows = [], []
        for a, b, d in parts:
            with b.device_context(d):
                if a.size >= 1 << 16:  # the largest magnitude without an array of magnitudes
                    highs.append(here(b.xp.max(a), b, d))
                    lows.append(here(b.xp.min(a), b, d))
                else:  # a small one: one reduction, the cheaper on the host
                    highs.append(here(b.xp.max(b.xp.abs(a)), b, d))
        with backend.device_context(device):
            top = xp.max(xp.stack(highs))
            if lows:
                top = xp.maximum(top, -xp.min(xp.stack(lows)))
            if norm_type == math.inf:
                return top, one
            info = xp.finfo(dtype)
            # at most 1 / the smallest normal number, which is finite, and above 0 for an inf
            # gradient (which stays inf scaled), so no product is 0 * inf = NaN
            inv = 1.0 / xp.clip(top, float(info.smallest_normal), float(info.max))
    factors = {}  # (backend, device) -> inv there, in the dtype of the sum there
    sums = []
    with contextlib.ExitStack() as quiet:
        if not scaled:  # an overflow is the caller's to take up
            for b in {b for _, b, _ in parts}:
                quiet.enter_context(b.arithmetic_warnings_off())
        for a, b, d in parts:
            with b.device_context(d):
                factor = factors.get((b, d))
                if factor is None:
                    factor = factors[b, d] = inv if b is backend and d == device else (
                        backends.to_device(inv, d))
                h = a if a.dtype == factor.dtype else b.xp.astype(a, factor.dtype)
                if scaled:
                    h = h * factor  # each magnitude <= 1: its power does not overflow
                s = b.xp.sum(h * h) if norm_type == 2 else b.xp.sum(b.xp.abs(h) ** norm_type)
            sums.append(here(s, b, d))
    with backend.device_context(device):
        return xp.sum(xp.stack(sums)) ** (1.0 / norm_type), inv


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False):
    """Scale the gradients of `parameters` together so that their total `norm_type`-norm (2,
    1, any p > 0, or math.inf) is at most `max_norm` (>= 0; math.inf scales nothing); returns
    that total norm, before clipping, as a 0-d Variable on the first gradient's device, in the
    widest of the gradients' dtypes (float32 at least). error_if_nonfinite=True raises (a host
    read) when the norm is nan or inf instead of scaling by it.

    `parameters`: a model (with parameters() or params()), one Variable, or an iterable of
    Variables; a parameter listed twice (a tied weight) counts once, as in optim.ClipGrad.

    The powers are taken of the gradients divided by the largest magnitude among them
    (norm_parts), so float16 and float32 gradients whose squares would overflow (3e19 in float32)
    still give their norm; the scale is computed in float64. A norm past the range of the
    returned dtype (float32: 3.4e38) comes back as inf, while the gradients are still scaled
    by max_norm over the true norm; past float64's (1.8e308) the scale is 0 too. An inf gradient
    gives a norm of inf (and, as in PyTorch, zero gradients where finite), a NaN one NaN."""
    max_norm = float(max_norm)
    if not max_norm >= 0:  # NaN too: it would make every gradient NaN, a negative one reverse it
        raise ValueError(f"clip_grad_norm_: max_norm must be >= 0 (math.inf: no clipping), got "
                         f"{max_norm}")
    norm_type = float(norm_type)
    if not norm_type > 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be positive (or math.inf), got "
                         f"{norm_type}")
    params = _with_grads(parameters, "clip_grad_norm_")
    if not params:
        return Variable(0.0, requires_grad=False)
    r, inv = norm_parts([p.grad for p in params], norm_type)
    backend, device = backends.backend_of(params[0].grad.data), params[0].grad.device
    xp = backend.xp
    with backend.device_context(device):
        total = r / inv  # past the dtype's range: inf (NumPy warns of the overflow)
        wide = xp.float64  # r / inv fits it where the gradients are float32 or narrower
        norm = (r if r.dtype == wide else xp.astype(r, wide)) / (
            inv if inv.dtype == wide else xp.astype(inv, wide))
        if error_if_nonfinite and not bool(xp.isfinite(norm)):
            raise RuntimeError(f"clip_grad_norm_: the total norm of the gradients is "
                               f"{float(norm)}; pass error_if_nonfinite=False to scale by it")
        if max_norm == math.inf:
            return Variable(total, requires_grad=False)
        scale = xp.clip(max_norm / (norm + 1e-6), None, 1.0)  # CuPy's clip: no max=
    factors = {}  # (backend, device, dtype) -> the scale there
    for p in params:
        g = p.grad
        b = backends.backend_of(g.data)
        with b.device_context(g.device):
            key = (b, g.device, g.dtype)
            factor = factors.get(key)
            if factor is None:
                factor = backends.to_device(scale, g.device)
                factor = factors[key] = b.xp.astype(factor, g.dtype)  # float64 scales float64
            p.grad = Variable(g.data * factor, requires_grad=False)
    return Variable(total, requires_grad=False)


def clip_grad_value_(parameters, clip_value):
    """Clip every gradient of `parameters` (a model, one Variable or an iterable of Variables,
    each counted once) to [-clip_value, clip_value], elementwise; clip_value >= 0."""
    clip_value = float(clip_value)
    if not clip_value >= 0:  # NaN too: every gradient would become NaN
        raise ValueError(f"clip_grad_value_: clip_value must be >= 0, got {clip_value}")
    for p in _with_grads(parameters, "clip_grad_value_"):
        g = p.grad
        with g.backend.device_context(g.device):
            p.grad = Variable(g.xp.clip(g.data, -clip_value, clip_value), requires_grad=False)
