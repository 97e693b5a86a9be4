"""DeZero's `dezero.models` names, from gradcore.nn (`from gradcore.models import MLP, Model`)."""
from .nn import MLP, Model, Sequential

__all__ = ["Model", "MLP", "Sequential"]
