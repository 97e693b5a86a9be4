"""DeZero's `dezero.functions_conv` names, from gradcore.functions (`from gradcore.functions_conv
import conv2d`)."""
from .functions.conv import (average_pooling, col2im, conv2d, conv2d_simple, deconv2d,
                             get_conv_outsize, get_deconv_outsize, im2col, pair, pooling,
                             pooling_simple)

__all__ = ["conv2d", "conv2d_simple", "deconv2d", "pooling", "pooling_simple",
           "average_pooling", "im2col", "col2im", "get_conv_outsize", "get_deconv_outsize",
           "pair"]
