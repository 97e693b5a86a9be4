"""RMSprop: each gradient divided by a running root mean square of the recent ones."""
from .optimizer import Optimizer, nonzero_eps
from .params import set_data, update_arrays


class RMSprop(Optimizer):
    """Hinton's RMSprop, as PyTorch's:
    v <- alpha * v + (1 - alpha) * grad**2
    centered: m <- m + (1 - alpha) * (grad - m), and v - m**2 (the variance) for v below
    step = grad / (sqrt(v) + eps)
    momentum: b <- momentum * b + step; param <- param - lr * b; else param <- param - lr * step

    `RMSprop(lr=0.01, alpha=0.99, eps=1e-8, momentum=0.0, centered=False)`, optionally after the
    parameters, PyTorch's defaults; positionally there PyTorch reads weight_decay fourth, so
    momentum and centered go by keyword (weight decay: the WeightDecay hook). alpha here is the
    smoothing constant, as in PyTorch: Adam's alpha (DeZero's name) is its step size. A float16
    parameter's state and update are float32, and an eps the update's dtype cannot hold is
    taken as its smallest positive number, as in Adam.
    State per parameter: "v", and "m" where centered, "b" where momentum is not 0 (made, or
    dropped, at the next update when those are changed).
    """

    defaults = {"lr": 0.01, "alpha": 0.99, "eps": 1e-8, "momentum": 0.0, "centered": False}
    pytorch_order = ("lr", "alpha", "eps", "weight_decay", "momentum", "centered")

    @property
    def state_names(self):
        return self.state_names_with(self.hyperparameters)

    def state_names_with(self, hyperparameters):
        return ("v", *(("m",) if hyperparameters["centered"] else ()),
                *(("b",) if hyperparameters["momentum"] else ()))

    def update_one(self, param):
        xp = param.xp
        p, g = update_arrays(param)
        alpha, names = float(self.alpha), self.state_names
        state = self.param_state(param)
        if len(state) != len(names) or not all(name in state for name in names):
            # centered or momentum changed since this parameter's state was made
            v = state["v"]
            for name in [name for name in state if name not in names]:
                del state[name]
            for name in names:
                if name not in state:
                    state[name] = xp.zeros_like(v)
        v = state["v"]
        v *= alpha
        v += (1 - alpha) * g * g
        state["v"] = v
        if self.centered:
            m = state["m"]
            m += (1 - alpha) * (g - m)
            state["m"] = m
            v = v - m * m
        step = g / (xp.sqrt(v) + nonzero_eps(xp, g.dtype, float(self.eps)))
        if self.momentum:
            b = state["b"]
            b *= float(self.momentum)
            b += step
            state["b"] = b
            step = b
        p -= float(self.lr) * step
        set_data(param, p)
