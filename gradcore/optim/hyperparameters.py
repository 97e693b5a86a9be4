"""Checking hyperparameters: each must be a finite real number in its allowed range, or a bool
where its default is one (a flag)."""
import math
import numbers
import operator

import numpy

# Allowed values of the hyperparameters gradcore's optimizers share: name -> (low, high, is high
# itself allowed). A name not listed (a user subclass's own) only has to be a finite real number.
_RANGES = {
    "lr": (0.0, math.inf, False),
    "alpha": (0.0, math.inf, False),
    "momentum": (0.0, math.inf, False),
    "rho": (0.0, 1.0, True),
    "beta1": (0.0, 1.0, False),
    "beta2": (0.0, 1.0, False),
    "eps": (0.0, math.inf, False),
    "weight_decay": (0.0, math.inf, False),
    "max_norm": (0.0, math.inf, False),
}


def _is_number(x):
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def as_integer(x):
    """`x` as a Python int if it is an integer: a Python int, a NumPy integer, or a 0-d integer
    array (a count or an epoch read back from an .npz), anything with `__index__`; None for
    anything else, bools included (NumPy's have no `__index__`)."""
    if isinstance(x, bool):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def checked_hyperparameter(where, name, value, rule=None):
    """`value` as a Python float (so no NumPy float64 scalar upcasts float32 updates), after
    checking it is a real number in the range that `rule` (default: `name`) allows; TypeError /
    ValueError otherwise. A 0-d NumPy array of a real number (read back from an .npz) counts as
    that number."""
    given = value
    if isinstance(value, numpy.ndarray) and value.ndim == 0:
        value = value[()]  # its NumPy scalar: a float or integer one is a numbers.Real
    if not _is_number(value):
        raise TypeError(f"{where}: {name} must be a real number, got {type(given).__name__} "
                        f"{given!r}")
    value = float(value)
    low, high, high_ok = _RANGES.get(rule or name, (-math.inf, math.inf, False))
    if not (math.isfinite(value) and low <= value and (value < high or high_ok and value == high)):
        bound = f"<= {high:g}" if high_ok else f"< {high:g}" if math.isfinite(high) else ""
        wanted = f"a finite number >= {low:g}" if math.isfinite(low) else "a finite number"
        raise ValueError(f"{where}: {name} must be {wanted}{' and ' + bound if bound else ''}, "
                         f"got {value!r}")
    return value


def checked_value(where, name, value, default):
    """`value` for the hyperparameter `name` whose default is `default`: True or False where
    that is a bool (a flag of a subclass's, as PyTorch's nesterov), else a number that
    checked_hyperparameter allows. A 0-d NumPy array (read back from an .npz) counts as its
    value."""
    if not isinstance(default, bool):
        return checked_hyperparameter(where, name, value)
    given = value
    if isinstance(value, numpy.ndarray) and value.ndim == 0:
        value = value[()]
    if not isinstance(value, (bool, numpy.bool_)):
        raise TypeError(f"{where}: {name} is a flag (its default is {default}): it must be True "
                        f"or False, got {type(given).__name__} {given!r}")
    return bool(value)
