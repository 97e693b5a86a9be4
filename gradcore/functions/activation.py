"""Activations: sigmoid, relu, leaky_relu, softmax, log_softmax, and their composite twins."""
from ..function import Function
from .device import accumulator_dtype, astype
from .math import as_floating, div, exp, neg, python_number
from .reduce import Sum, sum
from .shape import normalize_axis


# how softmax and log_softmax name their input when an axis is out of range, and the hint after
_INPUT = "a {}-d input"
_AXIS_HINT = (" (the default axis=1 expects (N, C) rows); pass axis=-1 to normalise over the "
              "last axis")


# =============================================================================== sigmoid
class Sigmoid(Function):
    """y = 1 / (1 + exp(-x)), elementwise, stable for any |x|; gx = gy * y * (1 - y),
    reusing the output."""

    def forward(self, x):
        xp = self.xp
        x = as_floating(self.backend, x)  # integers: -|x| would wrap around in their dtype
        e = xp.exp(-xp.abs(x))  # in (0, 1]: exp never overflows, whatever the sign of x
        d = 1 + e
        return xp.where(x >= 0, 1 / d, e / d)

    def backward(self, gy):
        y = self.outputs[0]()  # d sigmoid = y (1 - y): reuse the output
        return gy * y * (1 - y)


def sigmoid(x):
    """1 / (1 + exp(-x)), elementwise; stable for any |x|: no overflow, and outputs near 0
    (x around -700) keep their full relative precision."""
    return Sigmoid()(x)


def sigmoid_simple(x):
    """sigmoid as a plain composition of ops (the oracle for `sigmoid`; overflows for x < -709)."""
    return 1 / (1 + exp(neg(x)))


# =============================================================================== relu
class ReLU(Function):
    """y = max(x, 0), elementwise; gx = gy where y != 0: 0 where x <= 0, gy at NaN
    (as PyTorch)."""
    op_name = "relu"

    def forward(self, x):
        return self.xp.maximum(x, self.backend.zeros((), x.dtype, self.device))

    def backward(self, gy):
        y = self.outputs[0]()
        # the slope, a constant (relu'' = 0): 1 where y > 0, and at a NaN (y != 0, as PyTorch)
        mask = self.backend.as_factor(y.data != 0, y.dtype)
        return gy * mask


def relu(x):
    """max(x, 0), elementwise; the gradient at 0 is 0, at NaN 1 (as in PyTorch)."""
    return ReLU()(x)


class LeakyReLU(Function):
    """y = x where x > 0, else slope * x; gx = gy times the same factor (1 or slope),
    saved in forward."""
    op_name = "leaky_relu"

    def __init__(self, slope=0.2):
        self.slope = slope

    def forward(self, x):
        xp = self.xp
        if not xp.isdtype(x.dtype, "real floating"):  # the factor, in x's dtype, would truncate
            raise TypeError(f"x must be a floating-point array, got {x.dtype} (a slope of "
                            f"{self.slope} would be truncated to an integer); cast it first, "
                            "e.g. F.astype(x, 'float32')")
        factor = xp.where(x > 0, xp.ones_like(x), xp.full_like(x, self.slope))  # the slope
        self.save_for_backward(factor)
        return x * factor  # x * 1 is exact

    def backward(self, gy):
        factor, = self.saved_tensors
        return gy * factor


def leaky_relu(x, slope=0.2):
    """x where x > 0, else slope * x, elementwise, for floating-point x (integer x: TypeError,
    as in PyTorch)."""
    number = python_number(slope)
    if number is None:
        raise TypeError(f"leaky_relu: slope must be a number, got {type(slope).__name__}")
    return LeakyReLU(number)(x)


# =============================================================================== softmax
class Softmax(Function):
    """y = exp(x) / sum(exp(x)) over `axis`, shifted by the max for stability;
    gx = y * (gy - sum(y * gy)) over that axis."""

    def __init__(self, axis=1):
        self.axis = axis

    def forward(self, x):
        xp = self.xp
        self.axes = axes = normalize_axis(self.axis, x.ndim, _INPUT, _AXIS_HINT)
        x = as_floating(self.backend, x)  # integers: x - max(x) would wrap around in their dtype
        if x.size == 0:  # nothing to normalise, and the max below would raise (no identity)
            return xp.empty_like(x)
        # shifting by the max changes nothing mathematically and keeps exp <= 1
        y = xp.exp(x - xp.max(x, axis=axes, keepdims=True))
        wide = accumulator_dtype(xp, x.dtype)
        if wide is None:
            return y / xp.sum(y, axis=axes, keepdims=True)
        # float16: summed and divided in float32 (over a wide axis the sum passes 65,504)
        return xp.astype(y / xp.sum(y, axis=axes, keepdims=True, dtype=wide), x.dtype)

    def backward(self, gy):
        y = self.outputs[0]()
        # dx = y * (gy - sum(y * gy)) along the axis
        gx = y * gy
        return gx - y * sum(gx, axis=self.axes, keepdims=True)


def softmax(x, axis=1):
    """exp(x) / sum(exp(x)) along `axis` (int, tuple, or None for all axes), computed stably for
    any magnitude (x - max(x) is exponentiated)."""
    return Softmax(axis)(x)


def softmax_simple(x, axis=1):
    """softmax as a plain composition of ops (the oracle for `softmax`; overflows for x > 709)."""
    y = exp(x)
    return div(y, sum(y, axis=axis, keepdims=True))


class LogSoftmax(Function):
    """y = x - logsumexp(x) over `axis`, computed stably; gx = gy - exp(y) * sum(gy)
    over that axis."""

    def __init__(self, axis=1):
        self.axis = axis

    def forward(self, x):
        xp = self.xp
        self.axes = axes = normalize_axis(self.axis, x.ndim, _INPUT, _AXIS_HINT)
        x = as_floating(self.backend, x)  # as in softmax
        if x.size == 0:  # as in softmax: an empty result of x's shape
            return xp.empty_like(x)
        shifted = x - xp.max(x, axis=axes, keepdims=True)
        wide = accumulator_dtype(xp, x.dtype)  # float16: the sum in float32, as in softmax
        log_z = xp.log(xp.sum(xp.exp(shifted), axis=axes, keepdims=True, dtype=wide))
        return shifted - (log_z if wide is None else xp.astype(log_z, x.dtype))

    def backward(self, gy):
        y = self.outputs[0]()
        # softmax = exp(y): dx = gy - softmax * sum(gy) along the axis
        wide = accumulator_dtype(self.xp, y.dtype)
        if wide is None:
            return gy - exp(y) * sum(gy, axis=self.axes, keepdims=True)
        # float16: in float32 until the product, as sum(gy) passes 65,504 over a wide axis
        # (70,000 classes) where softmax times it does not
        total = Sum(self.axes, True, wide)(gy)
        return gy - astype(exp(astype(y, wide)) * total, y.dtype)


def log_softmax(x, axis=1):
    """log(softmax(x, axis)), computed stably (no log of 0, no overflow) for any magnitude."""
    return LogSoftmax(axis)(x)
