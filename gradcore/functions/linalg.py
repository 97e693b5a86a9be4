"""Linear algebra: matmul (batched, broadcasting)."""
from ..function import Function
from .shape import reshape, sum_to, transpose


def _swap_last(x):
    """x with its last two axes swapped."""
    axes = list(range(x.ndim))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return transpose(x, axes)


class MatMul(Function):
    op_name = "matmul"

    def forward(self, x, W):
        return self.xp.matmul(x, W)

    def backward(self, gy):
        x, W = self.inputs
        n0, n1 = self.needs_input_grad
        # a 1-d x acts as a row, a 1-d W as a column; gy lacks those axes: put them back
        x2 = x if x.ndim > 1 else reshape(x, (1,) + x.shape)
        W2 = W if W.ndim > 1 else reshape(W, W.shape + (1,))
        batch = max(x2.ndim, W2.ndim) - 2
        gy2 = reshape(gy, gy.shape[:batch] + (x2.shape[-2], W2.shape[-1]))
        gx = reshape(sum_to(matmul(gy2, _swap_last(W2)), x2.shape), x.shape) if n0 else None
        gW = reshape(sum_to(matmul(_swap_last(x2), gy2), W2.shape), W.shape) if n1 else None
        return gx, gW


def matmul(x, W):
    """Matrix product x @ W; batched over leading axes, which broadcast."""
    return MatMul()(x, W)
