"""DeZero's `dezero.core_simple` names (its steps 23 to 32): those of gradcore.core."""
from .core import *  # noqa: F401,F403
