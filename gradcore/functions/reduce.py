"""Reductions: sum."""
from ..function import Function
from .shape import broadcast_to, reshape


def _axes(axis, ndim):
    """`axis` (None, int or tuple) as a sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of range for an array of {ndim} dimension(s)")
    return tuple(sorted(a % ndim for a in axes))


class Sum(Function):
    def __init__(self, axis=None, keepdims=False):
        self.axis = axis
        self.keepdims = keepdims

    def forward(self, x):
        return self.xp.sum(x, axis=self.axis, keepdims=self.keepdims)

    def backward(self, gy):
        x, = self.inputs
        if not self.keepdims:
            # put back the summed axes as size 1, then broadcast
            shape = list(x.shape)
            for a in _axes(self.axis, x.ndim):
                shape[a] = 1
            gy = reshape(gy, tuple(shape))
        return broadcast_to(gy, x.shape)


def sum(x, axis=None, keepdims=False):
    """Sum of the elements over `axis` (None: all; int or tuple)."""
    if isinstance(axis, list):
        axis = tuple(axis)
    return Sum(axis, keepdims)(x)
