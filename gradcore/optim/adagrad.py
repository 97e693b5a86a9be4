"""AdaGrad and AdaDelta: per-element step sizes from accumulated squared gradients."""
from .optimizer import Optimizer, nonzero_eps
from .params import set_data, update_arrays


class AdaGrad(Optimizer):
    """h <- h + grad**2;  param <- param - lr * grad / (sqrt(h) + eps).

    `AdaGrad(lr=0.001, eps=1e-8)`, optionally after the parameters (see Optimizer; there eps goes
    by keyword: PyTorch's Adagrad(params, lr, lr_decay) reads lr_decay second). A float16
    parameter's h is kept in float32 and its update computed in float32 (in float16, h of a
    gradient under 2.4e-4 would be 0, and the step g / eps hundreds of times lr). An eps the
    update's dtype cannot hold (0) is taken as its smallest positive number: a zero gradient
    then leaves the element as it is, not 0 / 0 = NaN.
    State per parameter: "h".
    """

    defaults = {"lr": 0.001, "eps": 1e-8}
    pytorch_order = ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps")
    state_names = ("h",)

    def update_one(self, param):
        xp = param.xp
        p, g = update_arrays(param)
        state = self.param_state(param)
        h = state["h"]
        h += g * g
        state["h"] = h
        eps = nonzero_eps(xp, p.dtype, float(self.eps))  # eps=0: 0 / 0 would be NaN
        p -= float(self.lr) * g / (xp.sqrt(h) + eps)
        set_data(param, p)


class AdaDelta(Optimizer):
    """Running averages of squared gradients (msg) and squared steps (msdx):
    msg  <- rho * msg + (1 - rho) * grad**2
    dx   <- sqrt((msdx + eps) / (msg + eps)) * grad
    msdx <- rho * msdx + (1 - rho) * dx**2
    param <- param - lr * dx

    `AdaDelta(rho=0.95, eps=1e-6, lr=1.0)`: DeZero's two positionally, then PyTorch's `lr`
    (DeZero has none: lr=1). After the parameters every hyperparameter goes by keyword:
    PyTorch's Adadelta(params, 1.0) means lr=1.0, where DeZero's order reads rho. A float16
    parameter's state and update are float32, and an eps the update's dtype cannot hold is
    taken as its smallest positive number, as in AdaGrad.
    State per parameter: "msg", "msdx".
    """

    defaults = {"rho": 0.95, "eps": 1e-6, "lr": 1.0}
    pytorch_order = ("lr", "rho", "eps", "weight_decay")
    state_names = ("msg", "msdx")

    def update_one(self, param):
        xp = param.xp
        p, g = update_arrays(param)
        rho, eps = float(self.rho), nonzero_eps(xp, g.dtype, float(self.eps))  # never 0 / 0
        state = self.param_state(param)
        msg, msdx = state["msg"], state["msdx"]
        msg *= rho
        msg += (1 - rho) * g * g
        dx = xp.sqrt((msdx + eps) / (msg + eps)) * g
        msdx *= rho
        msdx += (1 - rho) * dx * dx
        state["msg"], state["msdx"] = msg, msdx
        p -= float(self.lr) * dx
        set_data(param, p)
