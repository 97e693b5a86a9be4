"""Helpers around the core (DeZero's `dezero.utils` names): gradient checks, array comparison,
sum_to, the reductions' backward shapes and logsumexp on raw arrays, graph drawing, the conv size
helpers, and get_file / cache_dir for downloads."""
from ..functions.conv import get_conv_outsize, get_deconv_outsize, pair
from .arrays import array_allclose, array_equal, sum_to
from .dot import get_dot_graph, plot_dot_graph
from .files import files_folder, get_file
from .gradcheck import GradcheckError, gradcheck, gradgradcheck, gradient_check, numerical_grad
from .reductions import logsumexp, max_backward_shape, reshape_sum_backward

__all__ = [
    "numerical_grad", "gradient_check", "gradcheck", "gradgradcheck", "GradcheckError",
    "array_equal", "array_allclose", "sum_to", "reshape_sum_backward", "max_backward_shape",
    "logsumexp",
    "get_dot_graph", "plot_dot_graph", "get_conv_outsize", "get_deconv_outsize", "pair",
    "get_file", "cache_dir",
]


def __getattr__(name):
    # cache_dir is the folder get_file keeps its files in, as DeZero's (~/.dezero) is; read when
    # asked for, so that it follows $GRADCORE_DATA as get_file does
    if name == "cache_dir":
        return str(files_folder())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
