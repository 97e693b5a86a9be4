"""Optimizers (DeZero's names and defaults, PyTorch's call style too) and optimizer hooks.

    optimizer = Adam(alpha=1e-3).setup(model)      # DeZero: then backward, optimizer.update()
    optimizer = Adam(model.parameters(), lr=1e-3)  # PyTorch: zero_grad(), backward, step()

A number (or nothing) first means hyperparameters; anything else first is what to optimize.
"""
from .adagrad import AdaDelta, AdaGrad
from .adam import Adam, AdamW
from . import lr_scheduler
from .hooks import ClipGrad, FreezeParam, WeightDecay
from .optimizer import Optimizer
from .param_state import ParamState
from .rmsprop import RMSprop
from .sgd import SGD, MomentumSGD

__all__ = [
    "Optimizer", "SGD", "MomentumSGD", "AdaGrad", "AdaDelta", "Adam", "AdamW", "RMSprop",
    "WeightDecay", "ClipGrad", "FreezeParam", "ParamState", "lr_scheduler",
]
