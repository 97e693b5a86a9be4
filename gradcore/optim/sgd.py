"""SGD and MomentumSGD."""
from .optimizer import Optimizer
from .params import set_data, update_arrays


class SGD(Optimizer):
    """Plain gradient descent: param <- param - lr * grad.

    `SGD(lr=0.01).setup(model)` (DeZero) or `SGD(model.parameters(), lr=0.01)` (PyTorch).
    A float16 parameter's step is computed in float32 and rounded once, at the write.
    """

    defaults = {"lr": 0.01}
    pytorch_order = ("lr", "momentum", "dampening", "weight_decay", "nesterov")  # torch.optim.SGD

    def update_one(self, param):
        p, g = update_arrays(param)  # float16: in float32, rounded once at the write
        p -= float(self.lr) * g
        set_data(param, p)


class MomentumSGD(Optimizer):
    """Gradient descent with momentum (DeZero's form):
    v <- momentum * v - lr * grad;  param <- param + v.

    `MomentumSGD(lr=0.01, momentum=0.9)`, optionally after the parameters (see Optimizer).
    State per parameter: "v" (float32 for a float16 parameter, whose update is computed in
    float32 and rounded once, at the write).

    lr multiplies each gradient as it enters v, so v keeps the step sizes of earlier steps: when
    lr changes (a schedule, or by hand) the new one applies to new gradients only, and the step
    reaches its new size over about 1 / (1 - momentum) steps. PyTorch's SGD(momentum=) keeps the
    sum of gradients instead (v <- momentum * v + grad; param <- param - lr * v), so there a new
    lr scales the whole step at once: the two agree as long as lr never changes, and differ
    for a while after each change.
    """

    defaults = {"lr": 0.01, "momentum": 0.9}
    pytorch_order = SGD.pytorch_order  # PyTorch's SGD(params, lr, momentum): the same two
    state_names = ("v",)

    def update_one(self, param):
        p, g = update_arrays(param)
        state = self.param_state(param)
        v = state["v"]
        v *= float(self.momentum)
        v -= float(self.lr) * g
        state["v"] = v
        p += v
        set_data(param, p)
