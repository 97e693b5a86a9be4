"""Helpers around the core (DeZero's `dezero.utils` names): gradient checks, array comparison,
sum_to on raw arrays, graph drawing, and the conv size helpers."""
from ..functions.conv import get_conv_outsize, get_deconv_outsize, pair
from .arrays import array_allclose, array_equal, sum_to
from .dot import get_dot_graph, plot_dot_graph
from .gradcheck import GradcheckError, gradcheck, gradgradcheck, gradient_check, numerical_grad

__all__ = [
    "numerical_grad", "gradient_check", "gradcheck", "gradgradcheck", "GradcheckError", "array_equal", "array_allclose", "sum_to",
    "get_dot_graph", "plot_dot_graph", "get_conv_outsize", "get_deconv_outsize", "pair",
]
