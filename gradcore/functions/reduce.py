"""Reductions: sum, average (mean), max, min, logsumexp."""
import math

from ..function import Function
from ..variable import Variable, dtype_kind
from .device import accumulator_dtype, astype, wide_sum
from .math import as_floating, exp
from .shape import broadcast_like, normalize_axis, reshape


def _kept_shape(shape, axes):
    """`shape` with the reduced `axes` as size 1: where a reduction's gradient broadcasts from."""
    return tuple(1 if a in axes else n for a, n in enumerate(shape))


# =============================================================================== sum, average
class Sum(Function):
    """y = the sum of x over `axis` (None: all; float16 accumulates in float32); gx = gy
    broadcast back to x.shape."""

    def __init__(self, axis=None, keepdims=False, dtype=None):
        self.axis = axis
        self.keepdims = keepdims
        self.dtype = dtype  # of the sum, and what it accumulates in; None: x's

    def forward(self, x):
        xp = self.xp
        axis = self.axis if self.axis is None else normalize_axis(self.axis, x.ndim)
        if self.dtype is not None:
            return xp.sum(x, axis=axis, keepdims=self.keepdims, dtype=self.dtype)
        return wide_sum(xp, x, axis, self.keepdims)  # float16: summed in float32

    def backward(self, gy):
        x, = self.inputs
        if self.dtype is not None:
            gy = astype(gy, x.dtype)  # cast while it is small, before it is broadcast
        if not self.keepdims:  # put back the summed axes as size 1, then broadcast
            gy = reshape(gy, _kept_shape(x.shape, normalize_axis(self.axis, x.ndim)))
        return broadcast_like(gy, x)  # on Dask, in x's chunks


def sum(x, axis=None, keepdims=False):
    """Sum of the elements over `axis` (None: all; int or tuple)."""
    return Sum(axis, keepdims)(x)


def average(x, axis=None, keepdims=False):
    """Mean of the elements over `axis` (None: all; int or tuple, negatives allowed); nan over an
    empty axis, as in NumPy. Integers and bools are averaged in float64, as NumPy's mean does."""
    if not isinstance(x, Variable):
        x = Variable(x, requires_grad=False)  # a raw array is a constant, as in every op
    try:
        axes = normalize_axis(axis, x.ndim)
    except (TypeError, ValueError) as e:
        shape = str(tuple(x.shape)) if x.ndim else "0-d"  # as Function._explain writes it
        raise type(e)(f"average: {e} (inputs: {shape})") from None
    dtype = x.dtype
    if dtype_kind(x.backend, dtype) == "integral":
        # cast first, as NumPy's mean: the array API refuses an integer sum times a float
        x = astype(x, "float64")
        dtype = x.dtype
    count = math.prod(x.shape[a] for a in axes)
    # a Python float: float32 stays float32. The mean of nothing is nan, as in NumPy (without its
    # warning): the empty sum, 0, times nan; its gradient is empty (no element was averaged)
    scale = 1.0 / count if count else math.nan
    wide = accumulator_dtype(x.xp, dtype)
    if wide is None:
        if count and getattr(dtype, "itemsize", 0) > 8:
            # longdouble: divided, as 1 / count, a Python float, is rounded to double (the mean
            # of three ones would be 0.99999999999999994449); complex128 takes this path too
            return sum(x, axes, keepdims) / count
        return sum(x, axes, keepdims) * scale
    return astype(Sum(axes, keepdims, wide)(x) * scale, dtype)  # float16: summed in float32


def mean(x, axis=None, keepdims=False):
    """Mean of the elements over `axis`: the same op as `average`."""
    return average(x, axis, keepdims)


# =============================================================================== max, min
class Max(Function):
    """y = the largest element of x over `axis` (None: all); gy goes to the positions that
    hold it (a NaN: the NaNs), split equally among ties (a constant share: the second
    derivative is 0), as PyTorch's max() splits it, where DeZero's gives each tied position
    all of gy."""

    def __init__(self, axis=None, keepdims=False):
        self.axis = axis
        self.keepdims = keepdims

    def forward(self, x):
        self.axes = normalize_axis(self.axis, x.ndim)
        if any(x.shape[a] == 0 for a in self.axes):
            raise ValueError(f"cannot take the {self._name()} over an empty axis")
        if x.size == 0:  # another axis is empty: an empty result (Dask's max of it would raise),
            # in x's dtype as a max is (a sum of integers or bools would widen to int64)
            xp = self.xp
            return xp.astype(xp.sum(x, axis=self.axes, keepdims=self.keepdims), x.dtype)
        return self._extreme(x, self.keepdims)

    def _extreme(self, x, keepdims):
        return self.xp.max(x, axis=self.axes, keepdims=keepdims)

    def backward(self, gy):
        # to the positions that hold the extreme; ties share it equally (a valid subgradient
        # whose parts add up to gy). The share is a constant, so the second derivative is 0.
        x, = self.inputs
        y = self.outputs[0]()
        xp = self.xp
        kept = _kept_shape(x.shape, self.axes)
        y_data = xp.reshape(self._extreme(x.data, True) if y is None else y.data, kept)
        # a NaN extreme is held by the NaNs of its slice, as in torch.max() (x == y is false
        # for them); a slice with no NaN has a finite extreme, so isnan adds no hit there
        hit = xp.logical_or(x.data == y_data, xp.isnan(x.data))
        # ties counted in float32 for float16: in float16 a count stops at 2048 along a strided
        # axis (NumPy adds one at a time there) and is inf past 65,504
        wide = accumulator_dtype(xp, gy.dtype)
        hits = xp.astype(hit, gy.dtype if wide is None else wide)
        # 1 / ties per slice: divided on the reduced shape, not x's (every slice has a hit)
        share = 1 / xp.sum(hits, axis=self.axes, keepdims=True)
        if wide is not None:
            share, hits = xp.astype(share, gy.dtype), xp.astype(hits, gy.dtype)
        gy = reshape(gy, kept) * Variable(share, requires_grad=False)
        return broadcast_like(gy, x) * Variable(hits, requires_grad=False)


class Min(Max):
    """y = the smallest element of x over `axis` (None: all); gy goes to the positions that
    hold it, split equally among ties, as in Max."""

    def _extreme(self, x, keepdims):
        return self.xp.min(x, axis=self.axes, keepdims=keepdims)


def max(x, axis=None, keepdims=False):
    """Largest element over `axis` (None: all; int or tuple). The gradient goes to the position
    of the maximum; tied maxima share it equally (a NaN maximum: the NaNs share it)."""
    return Max(axis, keepdims)(x)


def min(x, axis=None, keepdims=False):
    """Smallest element over `axis` (None: all; int or tuple). The gradient goes to the position
    of the minimum; tied minima share it equally (a NaN minimum: the NaNs share it)."""
    return Min(axis, keepdims)(x)


# =============================================================================== logsumexp
class LogSumExp(Function):
    """y = log(sum(exp(x))) over `axis`, shifted by the max for stability (reduced axes
    kept as size 1 by default); gx = gy * softmax(x) over those axes."""
    op_name = "logsumexp"

    def __init__(self, axis=1, keepdims=True):
        self.axis = axis
        self.keepdims = keepdims
        self.wide = None  # float32 for float16 x: what forward summed in

    def forward(self, x):
        xp = self.xp
        self.axes = normalize_axis(self.axis, x.ndim)
        x = as_floating(self.backend, x)  # integers: x - m would wrap around in their dtype
        if x.size == 0:  # max has no identity; the log of an empty sum is -inf (scipy, torch)
            self.shift = zeros = xp.sum(x, axis=self.axes, keepdims=True)  # on x's device
            y = xp.full_like(zeros, -math.inf)  # (empty where another axis of x is empty)
        else:
            # log sum exp(x) = m + log sum exp(x - m): no overflow for large x; a row of -inf (or
            # +inf) would give inf - inf, so such an m is replaced by 0
            m = xp.max(x, axis=self.axes, keepdims=True)
            self.shift = m = xp.where(xp.isfinite(m), m, xp.zeros_like(m))
            self.wide = wide = accumulator_dtype(xp, x.dtype)
            s = xp.sum(xp.exp(x - m), axis=self.axes, keepdims=True, dtype=wide)
            y = (xp.log(s) if wide is None else xp.astype(xp.log(s), x.dtype)) + m
        return y if self.keepdims else xp.reshape(y, tuple(
            n for a, n in enumerate(x.shape) if a not in self.axes))

    def backward(self, gy):
        # d logsumexp = softmax(x), as exp(x - m) / sum(exp(x - m)) with the forward's shift m:
        # exact in float32 for large x (exp(x - y) would carry y's rounding), and written with
        # ops so it differentiates again (m is a constant: softmax does not depend on it)
        x, = self.inputs
        e = exp(x - Variable(self.shift, requires_grad=False))
        if self.wide is None:
            p = e / sum(e, self.axes, keepdims=True)
        else:  # float16: normalised in float32, as forward summed
            e = astype(e, self.wide)
            p = astype(e / sum(e, self.axes, keepdims=True), x.dtype)
        return broadcast_like(reshape(gy, _kept_shape(x.shape, self.axes)), x) * p


def logsumexp(x, axis=1, keepdims=True):
    """log(sum(exp(x), axis)), computed stably for large x; -inf over an empty axis. DeZero's
    default axis=1, and as in DeZero the reduced axes are kept (size 1), so `x - logsumexp(x)`
    broadcasts."""
    return LogSumExp(axis, keepdims)(x)
