"""DeZero's `dezero.functions_conv` names, from gradcore.functions (`from gradcore.functions_conv
import conv2d`), and its array forms of im2col and col2im."""
from .config import no_grad
from .functions.conv import (average_pooling, col2im, conv2d, conv2d_simple, deconv2d,
                             get_conv_outsize, get_deconv_outsize, im2col, pair, pooling,
                             pooling_simple)

__all__ = ["conv2d", "conv2d_simple", "deconv2d", "pooling", "pooling_simple",
           "average_pooling", "im2col", "col2im", "im2col_array", "col2im_array",
           "get_conv_outsize", "get_deconv_outsize", "pair"]


def im2col_array(img, kernel_size, stride=1, pad=0, to_matrix=True):
    """DeZero's im2col on an array: the windows of `img` (N, C, H, W) as a new array, laid out as
    `im2col` lays them out; no graph is recorded."""
    with no_grad():
        return im2col(img, kernel_size, stride, pad, to_matrix).data


def col2im_array(col, img_shape, kernel_size, stride=1, pad=0, to_matrix=True):
    """DeZero's col2im on an array: windows `col` summed back into a new array of `img_shape`
    (N, C, H, W), as `col2im` does; no graph is recorded."""
    with no_grad():
        return col2im(col, img_shape, kernel_size, stride, pad, to_matrix).data
