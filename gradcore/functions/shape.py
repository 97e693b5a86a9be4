"""Shape ops: reshape, transpose, broadcast_to, sum_to, get_item."""
from ..function import Function
from ..variable import Variable, as_variable


def _normalize_shape(shape):
    return (shape,) if isinstance(shape, int) else tuple(shape)


# =============================================================================== reshape
class Reshape(Function):
    def __init__(self, shape):
        self.shape = shape

    def forward(self, x):
        return self.xp.reshape(x, self.shape)

    def backward(self, gy):
        x, = self.inputs
        return reshape(gy, x.shape)


def reshape(x, shape):
    """x with a new shape (same number of elements); returns x itself if the shape is unchanged."""
    shape = _normalize_shape(shape)
    if isinstance(x, Variable) and x.shape == shape:
        return x
    return Reshape(shape)(x)


# =============================================================================== transpose
class Transpose(Function):
    def __init__(self, axes=None):
        self.axes = axes

    def forward(self, x):
        axes = self.axes if self.axes is not None else tuple(range(x.ndim))[::-1]
        return self.xp.permute_dims(x, axes)

    def backward(self, gy):
        if self.axes is None:
            return transpose(gy)
        inverse = [0] * len(self.axes)
        for i, axis in enumerate(self.axes):
            inverse[axis % len(self.axes)] = i
        return transpose(gy, tuple(inverse))


def transpose(x, axes=None):
    """Reverse the axes of x, or permute them by `axes`."""
    return Transpose(None if axes is None else tuple(axes))(x)


# =============================================================================== broadcasting
class BroadcastTo(Function):
    def __init__(self, shape):
        self.shape = shape

    def forward(self, x):
        return self.xp.broadcast_to(x, self.shape)

    def backward(self, gy):
        x, = self.inputs
        return sum_to(gy, x.shape)


def broadcast_to(x, shape):
    """x repeated along new or size-1 axes to `shape`."""
    shape = _normalize_shape(shape)
    if isinstance(x, Variable) and x.shape == shape:
        return x
    return BroadcastTo(shape)(x)


class SumTo(Function):
    def __init__(self, shape):
        self.shape = shape

    def forward(self, x):
        lead = x.ndim - len(self.shape)
        if lead < 0:
            raise ValueError(f"cannot sum shape {x.shape} to the larger shape {self.shape}")
        if any(n != 1 and n != x.shape[lead + i] for i, n in enumerate(self.shape)):
            # each target axis must be 1 or match: (2, 3) cannot become (3, 2)
            raise ValueError(f"cannot sum shape {tuple(x.shape)} to shape {self.shape}: "
                             "it does not broadcast to the input shape")
        axes = tuple(range(lead)) + tuple(
            lead + i for i, n in enumerate(self.shape) if n == 1 and x.shape[lead + i] != 1)
        y = self.xp.sum(x, axis=axes, keepdims=True)
        return self.xp.reshape(y, self.shape) if lead else y

    def backward(self, gy):
        x, = self.inputs
        return broadcast_to(gy, x.shape)


def sum_to(x, shape):
    """Sum x over broadcast axes so it has `shape` (the reverse of broadcast_to)."""
    if shape.__class__ is not tuple:
        shape = _normalize_shape(shape)
    if x.shape == shape:
        return x if isinstance(x, Variable) else as_variable(x)
    return SumTo(shape)(x)


# =============================================================================== indexing
class GetItem(Function):
    def __init__(self, slices):
        self.slices = slices

    def forward(self, x):
        return x[self.slices]

    def backward(self, gy):
        x, = self.inputs
        return GetItemGrad(self.slices, x.shape)(gy)


class GetItemGrad(Function):
    def __init__(self, slices, in_shape):
        self.slices = slices
        self.in_shape = in_shape

    def forward(self, gy):
        gx = self.backend.zeros(self.in_shape, gy.dtype, self.device)
        return self.backend.scatter_add(gx, self.slices, gy)

    def backward(self, ggx):
        return get_item(ggx, self.slices)


def get_item(x, slices):
    """x[slices] (basic slicing: ints, slices, None, Ellipsis)."""
    return GetItem(slices)(x)
