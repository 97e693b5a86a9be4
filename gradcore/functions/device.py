"""Moving between devices and dtypes, differentiably."""
import backends

from ..function import Function
from ..variable import Variable


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
    """x converted to `dtype` (a dtype of x's array library); x itself if it has it already."""
    if isinstance(x, Variable) and x.dtype == dtype:
        return x
    return AsType(dtype)(x)
