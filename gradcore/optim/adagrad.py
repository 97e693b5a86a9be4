"""AdaGrad and AdaDelta: per-element step sizes from accumulated squared gradients."""
from .optimizer import Optimizer, nonzero_eps
from .params import grad_array, set_data


class AdaGrad(Optimizer):
    """h <- h + grad**2;  param <- param - lr * grad / (sqrt(h) + eps).

    `AdaGrad(lr=0.001, eps=1e-8)`, optionally after the parameters (see Optimizer). Where the
    parameter's dtype cannot hold eps (float16: 1e-8 rounds to 0), eps is its smallest positive
    number (6e-8): a zero gradient then leaves the element as it is, not 0 / 0 = NaN.
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
        eps = nonzero_eps(xp, p.dtype, float(self.eps))  # float16: 1e-8 would be 0, and 0 / 0 NaN
        p -= float(self.lr) * g / (xp.sqrt(h) + eps)
        set_data(param, p)


class AdaDelta(Optimizer):
    """Running averages of squared gradients (msg) and squared steps (msdx):
    msg  <- rho * msg + (1 - rho) * grad**2
    dx   <- sqrt((msdx + eps) / (msg + eps)) * grad
    msdx <- rho * msdx + (1 - rho) * dx**2
    param <- param - lr * dx

    `AdaDelta(rho=0.95, eps=1e-6, lr=1.0)`: DeZero's two positionally, then PyTorch's `lr`
    (DeZero has none: lr=1). An eps below the smallest positive number of the parameter's dtype
    (float16: 6e-8) is taken as that number, as in AdaGrad. State per parameter: "msg", "msdx".
    """

    defaults = {"rho": 0.95, "eps": 1e-6, "lr": 1.0}
    state_names = ("msg", "msdx")

    def update_one(self, param):
        xp = param.xp
        g = grad_array(param)
        rho, eps = float(self.rho), nonzero_eps(xp, g.dtype, float(self.eps))  # never 0 / 0
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
