"""Differentiable ops, DeZero's names (`import gradcore.functions as F`). Each is a Function or a
composition of Functions; every backward is written with these same ops."""
# -- math, shape, reduce, linalg, device
from .device import ToDevice, to
from .linalg import MatMul, matmul
from .math import (Add, Cos, Div, Exp, Log, Mul, Neg, Pow, Sin, Square, Sub, Tanh, add, cos, div,
                   exp, log, mul, neg, pow, sin, square, sub, tanh)
from .reduce import Sum, sum
from .shape import (BroadcastTo, GetItem, GetItemGrad, Reshape, SumTo, Transpose, broadcast_to,
                    get_item, reshape, sum_to, transpose)
# -- end math, shape, reduce, linalg, device

# -- activation, loss
# -- end activation, loss

# -- neural-net ops: dropout, batch_norm, embed_id, conv
# -- end neural-net ops

__all__ = [
    # -- names: math, shape, reduce, linalg, device
    "add", "sub", "mul", "div", "neg", "pow", "square", "exp", "log", "sin", "cos", "tanh",
    "reshape", "transpose", "broadcast_to", "sum_to", "get_item", "sum", "matmul", "to",
    "Add", "Sub", "Mul", "Div", "Neg", "Pow", "Square", "Exp", "Log", "Sin", "Cos", "Tanh",
    "Reshape", "Transpose", "BroadcastTo", "SumTo", "GetItem", "GetItemGrad", "Sum", "MatMul",
    "ToDevice",
    # -- names: activation, loss
    # -- names: neural-net ops
]
