"""RMSprop: each gradient divided by a running root mean square of the recent ones."""
import backends

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
    State per parameter: "v", and "m" once centered, "b" once momentum is not 0 (made as zeros
    when those are set, and kept, as PyTorch keeps them, when they are set back: a momentum
    that comes back from 0 goes on with the buffer it had).
    """

    defaults = {"lr": 0.01, "alpha": 0.99, "eps": 1e-8, "momentum": 0.0, "centered": False}
    pytorch_order = ("lr", "alpha", "eps", "weight_decay", "momentum", "centered")
    kept_state_names = ("m", "b")

    @property
    def state_names(self):
        return self.state_names_with(self.hyperparameters)

    def state_names_with(self, hyperparameters):
        return ("v", *(("m",) if hyperparameters["centered"] else ()),
                *(("b",) if hyperparameters["momentum"] else ()))

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name in ("momentum", "centered") and "state" in self.__dict__:  # one set from 0
            names = self.state_names
            for _, state in self.state.items():
                _match(state, names)

    def update_one(self, param):
        xp = param.xp
        p, g = update_arrays(param)
        alpha = float(self.alpha)
        state = self.param_state(param)
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


def _match(state, names):
    """A parameter's state with the arrays `names` at least: zeros for a new one."""
    for name in names:
        if name not in state:
            v = state["v"]
            state[name] = backends.backend_of(v).xp.zeros_like(v)
