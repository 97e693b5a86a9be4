"""Optimizer hooks, called with the parameters that have a gradient before each update."""
import math

from ..nn.utils import norm_parts
from ..variable import Variable
from .hyperparameters import checked_hyperparameter
from .params import _unique_params, grad_array, update_arrays, update_grad_array


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
                # in the update's dtype (float32 for a float16 parameter), rounded once into
                # the gradient's: rate * p and the sum each rounded to float16 would round
                # twice (PyTorch's float16 add computes in float32 too)
                data, grad = update_arrays(p)
                p.grad = Variable(p.xp.astype(grad + rate * data, p.dtype), requires_grad=False)

    def __repr__(self):
        return f"WeightDecay({self.rate!r})"


class ClipGrad:
    """Hook: scale all gradients together so their global L2 norm is at most `max_norm`
    (DeZero's ClipGrad)."""

    def __init__(self, max_norm):
        self.max_norm = checked_hyperparameter("ClipGrad", "max_norm", max_norm)

    def __call__(self, params):
        if not params:
            return
        lazy = [p for p in params if p.backend.lazy]
        if lazy:  # Dask: reading the norm would compute the step, and the update again
            done = lazy[0].backend.persist([grad_array(p) for p in lazy])
            for p, g in zip(lazy, done):
                p.grad = Variable(g, requires_grad=False)
        # clip_grad_norm_'s norm (float16 gradients summed in float32), read on the host: the
        # plain sum of squares first, and where a square overflowed (float32's past 1.8e19), the
        # sum of the gradients divided by the largest magnitude, whose norm times that magnitude
        # is the norm (a norm of inf would zero every gradient)
        grads = [p.grad for p in params]
        r, inv = norm_parts(grads, scaled=False)
        if math.isinf(float(r)):
            r, inv = norm_parts(grads)
        norm = float(r) / float(inv)  # in float64: a norm past float32's fits
        rate = float(self.max_norm) / (norm + 1e-6)
        if not rate >= 1:  # NaN too (a NaN gradient): every gradient NaN, as clip_grad_norm_
            # gives, not the others' step unclipped
            for p in params:
                with p.backend.device_context(p.device):
                    p.grad = Variable(p.xp.astype(update_grad_array(p) * rate, p.dtype),
                                      requires_grad=False)

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
