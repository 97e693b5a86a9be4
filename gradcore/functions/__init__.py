"""Differentiable ops, DeZero's names (`import gradcore.functions as F`). Each is a Function or a
composition of Functions; every backward is written with these same ops."""
# -- math, shape, reduce, linalg, device
from .device import ToDevice, to
from .linalg import Linear, MatMul, linear, linear_simple, matmul
from .math import (Abs, Add, Clip, Copy, Cos, Div, Exp, Log, Maximum, Minimum, Mul, Neg, Pow,
                   PowerOf, Sin, Sqrt, Square, Sub, Tanh, Where, abs, add, clip, copy, cos, div,
                   exp, log, maximum, minimum, mul, neg, pow, power_of, sin, sqrt, square, sub,
                   tanh, where)
from .math import SinGrad, TanhGrad, sin_grad, tanh_grad
from .reduce import LogSumExp, Max, Min, Sum, average, logsumexp, max, mean, min, sum
from .shape import (BroadcastTo, Concatenate, ExpandDims, GetItem, GetItemGrad, Reshape, Split,
                    Squeeze, Stack, SumTo, Transpose, broadcast_to, concatenate, expand_dims,
                    flatten, get_item, reshape, split, squeeze, stack, sum_to, transpose)
# -- end math, shape, reduce, linalg, device

# -- activation, loss
from .activation import (LeakyReLU, LogSoftmax, ReLU, Sigmoid, Softmax, leaky_relu, log_softmax,
                         relu, sigmoid, sigmoid_simple, softmax, softmax_simple)
from .loss import (BinaryCrossEntropy, MeanSquaredError, SigmoidCrossEntropy, SoftmaxCrossEntropy,
                   accuracy, binary_cross_entropy, mean_squared_error, mean_squared_error_simple,
                   sigmoid_cross_entropy, softmax_cross_entropy, softmax_cross_entropy_simple)
# -- end activation, loss

# -- neural-net ops: dropout, batch_norm, embed_id, conv
from .conv import (Col2im, Conv2d, Conv2dGradW, Deconv2d, Im2col, Pooling, average_pooling,
                   col2im, conv2d, conv2d_simple, deconv2d, im2col, pooling, pooling_simple)
from .nn import BatchNorm, Dropout, EmbedID, EmbedIDGrad, batch_norm, dropout, embed_id
# DeZero's only spelling of batch_norm (its BatchNorm layer calls it); the same function, so
# not listed again in __all__, where each op has its test row
batch_nrom = batch_norm
# -- end neural-net ops

from .device import AsType, astype  # the engine casts gradients to their input's dtype with it

__all__ = [
    # -- names: math, shape, reduce, linalg, device
    "add", "sub", "mul", "div", "neg", "copy", "pow", "power_of", "square", "exp", "log", "sin",
    "cos", "tanh", "sqrt", "abs", "maximum", "minimum", "clip", "where",
    "reshape", "transpose", "broadcast_to", "sum_to", "get_item", "expand_dims", "squeeze",
    "flatten", "concatenate", "stack", "split",
    "sum", "average", "mean", "max", "min", "logsumexp", "matmul", "linear", "linear_simple", "to",
    "Add", "Sub", "Mul", "Div", "Neg", "Copy", "Pow", "PowerOf", "Square", "Exp", "Log", "Sin",
    "Cos", "Tanh",
    "tanh_grad", "TanhGrad", "sin_grad", "SinGrad",
    "Sqrt", "Abs", "Maximum", "Minimum", "Clip", "Where",
    "Reshape", "Transpose", "BroadcastTo", "SumTo", "GetItem", "GetItemGrad", "ExpandDims",
    "Squeeze", "Concatenate", "Stack", "Split",
    "Sum", "Max", "Min", "LogSumExp", "MatMul", "Linear", "ToDevice",
    # -- names: activation, loss
    "sigmoid", "sigmoid_simple", "relu", "leaky_relu", "softmax", "softmax_simple", "log_softmax",
    "mean_squared_error", "mean_squared_error_simple", "softmax_cross_entropy",
    "softmax_cross_entropy_simple", "sigmoid_cross_entropy", "binary_cross_entropy", "accuracy",
    "Sigmoid", "ReLU", "LeakyReLU", "Softmax", "LogSoftmax", "MeanSquaredError",
    "SoftmaxCrossEntropy", "SigmoidCrossEntropy", "BinaryCrossEntropy",
    # -- names: neural-net ops
    "im2col", "col2im", "conv2d", "conv2d_simple", "deconv2d", "pooling", "pooling_simple",
    "average_pooling", "dropout", "batch_norm", "embed_id",
    "Im2col", "Col2im", "Conv2d", "Conv2dGradW", "Deconv2d", "Pooling", "Dropout", "BatchNorm",
    "EmbedID", "EmbedIDGrad",
    "astype", "AsType",
]
