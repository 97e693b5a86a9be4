"""DeZero's module name for the optimizers: `from gradcore.optimizers import Adam` (the same
classes as gradcore.optim)."""
from .optim import (
    SGD, AdaDelta, AdaGrad, Adam, AdamW, ClipGrad, FreezeParam, MomentumSGD, Optimizer,
    ParamState, WeightDecay,
)

__all__ = [
    "Optimizer", "SGD", "MomentumSGD", "AdaGrad", "AdaDelta", "Adam", "AdamW",
    "WeightDecay", "ClipGrad", "FreezeParam", "ParamState",
]
