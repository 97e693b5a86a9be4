"""Optimizer hooks, called with the parameters that have a gradient before each update."""
import math

from ..variable import Variable
from .hyperparameters import checked_hyperparameter
from .params import _unique_params, grad_array


def _widened(xp, g, bits):
    """`g` in a floating dtype of `bits` bits (32 or 64) if its own is narrower (no copy
    otherwise): squares summed in float16 overflow to inf once an element passes 256, in float32
    past 1.8e19 (beside float64 gradients whose norm holds it), and a norm of inf would zero
    every gradient."""
    if xp.finfo(g.dtype).bits >= bits:
        return g
    return xp.astype(g, xp.float64 if bits > 32 else xp.float32)


class WeightDecay:
    """Hook: L2 regularisation, grad <- grad + rate * param (DeZero's WeightDecay)."""

    def __init__(self, rate):
        self.rate = checked_hyperparameter("WeightDecay", "rate", rate, rule="weight_decay")

    def __call__(self, params):
        rate = float(self.rate)
        for p in params:
            with p.backend.device_context(p.device):
                # a new grad Variable: the old one may be shared (backward of x + y hands both
                # inputs the same gradient), so it is never changed in place
                p.grad = Variable(grad_array(p) + rate * p.data, requires_grad=False)

    def __repr__(self):
        return f"WeightDecay({self.rate!r})"


class ClipGrad:
    """Hook: scale all gradients together so their global L2 norm is at most `max_norm`
    (DeZero's ClipGrad)."""

    def __init__(self, max_norm):
        self.max_norm = checked_hyperparameter("ClipGrad", "max_norm", max_norm)

    def __call__(self, params):
        lazy = [p for p in params if p.backend.lazy]
        if lazy:  # Dask: reading the norm would compute the step, and the update again
            done = lazy[0].backend.persist([grad_array(p) for p in lazy])
            for p, g in zip(lazy, done):
                p.grad = Variable(g, requires_grad=False)
        totals = {}  # device -> sum of squares there: one device-to-host read per device
        # summed in the widest of the gradients' dtypes, float32 at least, as clip_grad_norm_
        bits = max([32] + [p.xp.finfo(p.dtype).bits for p in params])
        for p in params:
            with p.backend.device_context(p.device):
                g = _widened(p.xp, grad_array(p), bits)
                s = p.xp.sum(g * g)
            key = (p.backend, p.device)
            totals[key] = s if key not in totals else totals[key] + s
        norm = math.sqrt(sum(float(s) for s in totals.values()))
        rate = float(self.max_norm) / (norm + 1e-6)
        if rate < 1:
            for p in params:
                with p.backend.device_context(p.device):
                    p.grad = Variable(grad_array(p) * rate, requires_grad=False)

    def __repr__(self):
        return f"ClipGrad({self.max_norm!r})"


class FreezeParam:
    """Hook: the given layers (anything with `parameters()` or `params()`) and parameters are not
    updated; their gradients are dropped before each update (DeZero's FreezeParam). The optimizer
    runs it before its other hooks, whatever the order they were added in, so that WeightDecay
    and ClipGrad never see a frozen gradient."""

    def __init__(self, *layers):
        items = []
        for position, layer in enumerate(layers):
            if isinstance(layer, Variable):
                items.append(layer)
                continue
            get = getattr(layer, "parameters", None)
            get = get if callable(get) else getattr(layer, "params", None)
            if not callable(get):
                raise TypeError(f"FreezeParam: argument {position} is a {type(layer).__name__}; "
                                "pass layers/models (with parameters()) or Parameters")
            items.extend(get())
        self.freeze_params = _unique_params(items, "FreezeParam")

    def __call__(self, params):
        for p in self.freeze_params:
            p.grad = None

    def __repr__(self):
        return f"FreezeParam(<{len(self.freeze_params)} parameter(s)>)"
