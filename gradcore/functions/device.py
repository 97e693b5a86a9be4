"""Moving between devices and dtypes, differentiably."""
import backends

from ..function import Function
from ..variable import Variable, dtype_kind


class ToDevice(Function):
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
    op_name = "astype"

    def __init__(self, dtype):
        self.dtype = dtype

    def forward(self, x):
        return self.xp.astype(x, self.dtype)

    def backward(self, gy):
        x, = self.inputs
        return astype(gy, x.dtype)  # the gradient keeps the input's dtype


def astype(x, dtype):
    """x converted to `dtype` (a dtype of x's array library); x itself if it has it already.
    Differentiable between real floating dtypes; to an integer or bool dtype the result is a
    constant (an integer cannot carry a gradient, as in PyTorch); to a complex one: TypeError."""
    if not isinstance(x, Variable):
        x = Variable(x, requires_grad=False)  # a raw array is a constant, as in every op
    if x.dtype == dtype:
        return x
    kind = dtype_kind(x.backend, _resolve(x.xp, dtype))
    if kind == "integral":  # integers, bool: no graph through the cast, no gradient
        x = x.detach()
    elif kind == "complex":
        raise TypeError(
            f"astype: gradcore does not differentiate complex numbers (asked for "
            f"{_resolve(x.xp, dtype)}); compute with the real and imaginary parts as two real "
            "Variables")
    return AsType(dtype)(x)


def _resolve(xp, dtype):
    """`dtype` as a dtype object of `xp`, whatever xp.astype accepted it as (NumPy takes names
    and Python types, which numpy.isdtype refuses): the dtype of an empty array."""
    return xp.empty((0,), dtype=dtype).dtype
