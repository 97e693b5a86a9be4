"""DeZero's `dezero.core` names, for code that imports them from there (DeZero's own modules open
with `from dezero.core import Function, Variable, as_variable, as_array`): gradcore's objects
under those names. DeZero's rsub, rdiv and array_types have no gradcore counterpart."""
from . import setup_variable
from .config import Config, no_grad, test_mode, using_config
from .function import Function
from .functions.math import Add, Div, Mul, Neg, Pow, Sub, add, div, mul, neg, pow, sub
from .variable import Parameter, Variable, as_array, as_variable

__all__ = [
    "Config", "using_config", "no_grad", "test_mode",
    "Variable", "Parameter", "as_variable", "as_array", "Function", "setup_variable",
    "Add", "add", "Sub", "sub", "Mul", "mul", "Div", "div", "Neg", "neg", "Pow", "pow",
]
