"""Moving between devices and dtypes, differentiably."""
import backends

from ..function import Function
from ..variable import Variable, dtype_kind


class ToDevice(Function):
    """y = x moved to the `device` given; gx = gy moved back to x's device."""

    def __init__(self, device):
        self.target = device

    def forward(self, x):
        self.source = self.backend.device_of(x)
        return backends.to_device(x, self.target)

    def backward(self, gy):
        return to(gy, self.source)  # the gradient goes back where the input lives


def to(x, device):
    """x on `device` ("cpu", "cuda", "cuda:1", a Device); x itself if it is there already."""
    device = backends.parse_device(device)
    if isinstance(x, Variable) and x.device == device:
        return x
    return ToDevice(device)(x)


class AsType(Function):
    """y = x cast to `dtype`; gx = gy cast back to x's dtype."""
    op_name = "astype"

    def __init__(self, dtype):
        self.dtype = dtype

    def forward(self, x):
        return self.xp.astype(x, self.dtype)

    def backward(self, gy):
        x, = self.inputs
        return astype(gy, x.dtype)  # the gradient keeps the input's dtype


def astype(x, dtype):
    """x converted to `dtype` (a dtype of x's array library, or a name such as "float64", or a
    NumPy dtype, on every backend); x itself if it has it already.
    Differentiable between real floating dtypes; to an integer or bool dtype the result is a
    constant (an integer cannot carry a gradient, as in PyTorch); to a complex one: TypeError."""
    if not isinstance(x, Variable):
        x = Variable(x, requires_grad=False)  # a raw array is a constant, as in every op
    if x.dtype is dtype:
        return x
    dtype = _resolve(x.backend, dtype)
    if x.dtype == dtype:
        return x
    kind = dtype_kind(x.backend, dtype)
    if kind == "integral":  # integers, bool: no graph through the cast, no gradient
        x = x.detach()
    elif kind == "complex":
        raise TypeError(
            f"astype: gradcore does not differentiate complex numbers (asked for {dtype}); "
            "compute with the real and imaginary parts as two real Variables")
    return AsType(dtype)(x)


def _resolve(backend, dtype):
    """`dtype` (a dtype of the backend's library, a name such as "float64", a NumPy dtype or
    type) as that library's dtype object: the dtype of an empty array made with it (NumPy takes
    names and Python types, which numpy.isdtype refuses; array-api backends map them)."""
    try:
        return backend.empty((0,), dtype, None).dtype
    except (TypeError, ValueError) as e:
        raise TypeError(f"astype: {dtype!r} is not a dtype {backend.name} has ({e}); pass one "
                        "of its dtypes or a name such as 'float32'") from None


# (xp, dtype) -> what accumulator_dtype gives: finfo costs microseconds, a sum less
_ACCUMULATORS = {}


def accumulator_dtype(xp, dtype):
    """float32 for float16 data, else None (the data's own dtype): what a sum of many values is
    accumulated in, as NumPy's mean and PyTorch do. In float16 a sum past 65,504 is inf, and so
    is a count of 65,520 or more."""
    key = (xp, dtype)
    if key not in _ACCUMULATORS:
        # float16 known by its width, not by name: the Dask namespace has no xp.float16
        half = xp.isdtype(dtype, "real floating") and xp.finfo(dtype).bits == 16
        _ACCUMULATORS[key] = xp.float32 if half else None
    return _ACCUMULATORS[key]


def wide_sum(xp, x, axis, keepdims=False):
    """xp.sum of the array `x` over `axis`, in x's dtype, accumulated as accumulator_dtype says:
    in float16 NumPy adds along a strided axis one value at a time, so 10,000 times 0.1 would
    come out 256."""
    wide = accumulator_dtype(xp, x.dtype)
    if wide is None:
        return xp.sum(x, axis=axis, keepdims=keepdims)
    return xp.astype(xp.sum(x, axis=axis, keepdims=keepdims, dtype=wide), x.dtype)
