"""Moving between devices, differentiably."""
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
