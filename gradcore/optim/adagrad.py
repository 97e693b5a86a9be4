"""AdaGrad and AdaDelta: per-element step sizes from accumulated squared gradients."""
from .optimizer import Optimizer
from .params import grad_array, set_data


class AdaGrad(Optimizer):
    """h <- h + grad**2;  param <- param - lr * grad / (sqrt(h) + eps).

    `AdaGrad(lr=0.001, eps=1e-8)`, optionally after the parameters (see Optimizer).
    State per parameter: "h".
    """

    defaults = {"lr": 0.001, "eps": 1e-8}
    state_names = ("h",)

    def update_one(self, param):
        xp = param.xp
        g = grad_array(param)
        state = self.param_state(param)
        h = state["h"]
        h += g * g
        state["h"] = h
        p = param.data
        p -= float(self.lr) * g / (xp.sqrt(h) + float(self.eps))
        set_data(param, p)


class AdaDelta(Optimizer):
    """Running averages of squared gradients (msg) and squared steps (msdx):
    msg  <- rho * msg + (1 - rho) * grad**2
    dx   <- sqrt((msdx + eps) / (msg + eps)) * grad
    msdx <- rho * msdx + (1 - rho) * dx**2
    param <- param - lr * dx

    `AdaDelta(rho=0.95, eps=1e-6, lr=1.0)`: DeZero's two positionally, then PyTorch's `lr`
    (DeZero has none: lr=1). State per parameter: "msg", "msdx".
    """

    defaults = {"rho": 0.95, "eps": 1e-6, "lr": 1.0}
    state_names = ("msg", "msdx")

    def update_one(self, param):
        xp = param.xp
        rho, eps = float(self.rho), float(self.eps)
        g = grad_array(param)
        state = self.param_state(param)
        msg, msdx = state["msg"], state["msdx"]
        msg *= rho
        msg += (1 - rho) * g * g
        dx = xp.sqrt((msdx + eps) / (msg + eps)) * g
        msdx *= rho
        msdx += (1 - rho) * dx * dx
        state["msg"], state["msdx"] = msg, msdx
        p = param.data
        p -= float(self.lr) * dx
        set_data(param, p)
