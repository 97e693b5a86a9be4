"""Linear algebra: matmul (batched, broadcasting), linear (fused) and linear_simple."""
from ..function import Function
from .shape import laid_out_like, reshape, sum_to, transpose


def _shape(a):
    """a's shape as a tuple; () for a Python number."""
    return tuple(getattr(a, "shape", ()))


def _swap_last(x):
    """x with its last two axes swapped."""
    axes = list(range(x.ndim))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return transpose(x, axes)


# =============================================================================== matmul
class MatMul(Function):
    """y = x @ W for x (..., n, k) and W (..., k, m), batched (leading axes broadcast; a 1-d
    x acts as a row, a 1-d W as a column); gx, gW are summed over broadcast axes."""
    op_name = "matmul"
    integers_take_float_dtype = True  # x32 @ an int64 array stays float32, as in + - * /

    def forward(self, x, W):
        if not getattr(x, "ndim", 0) or not getattr(W, "ndim", 0):  # a Python number: 0-d
            raise ValueError("matmul needs inputs of at least one dimension; use mul for scalars")
        k = W.shape[-2] if W.ndim > 1 else W.shape[0]
        if x.shape[-1] != k:
            raise ValueError(f"shapes {tuple(x.shape)} and {tuple(W.shape)} do not match: the "
                             f"last axis of x ({x.shape[-1]}) must equal the "
                             f"{'second-to-last' if W.ndim > 1 else 'only'} axis of W ({k})")
        return self.xp.matmul(x, W)

    def backward(self, gy):
        x, W = self.inputs
        n0, n1 = self.needs_input_grad
        # a 1-d x acts as a row, a 1-d W as a column; gy lacks those axes: put them back
        x2 = x if x.ndim > 1 else reshape(x, (1,) + x.shape)
        W2 = W if W.ndim > 1 else reshape(W, W.shape + (1,))
        batch = max(x2.ndim, W2.ndim) - 2
        gy2 = reshape(gy, gy.shape[:batch] + (x2.shape[-2], W2.shape[-1]))
        gx = gW = None
        # Dask: each in its input's chunks (matmul's come in others), so that an optimizer step
        # leaves a parameter in the chunks it had
        if n0:
            gx = laid_out_like(reshape(sum_to(matmul(gy2, _swap_last(W2)), x2.shape), x.shape), x)
        if n1:
            gW = laid_out_like(reshape(sum_to(matmul(_swap_last(x2), gy2), W2.shape), W.shape), W)
        return gx, gW


def matmul(x, W):
    """Matrix product x @ W; batched over leading axes, which broadcast."""
    return MatMul()(x, W)


# =============================================================================== linear
class Linear(Function):
    """y = x @ W + b for x (N, in), or (..., in) or one example (in,) as PyTorch's, W (in, out)
    and b (out,) or absent, as one fused op; gW and gb sum over every axis but the last."""
    op_name = "linear"
    integers_take_float_dtype = True  # an int64 x to a float32 layer stays float32, as in + - * /

    def forward(self, x, W, b=None):
        # x or W may be a Python number (a NumPy scalar input becomes one): 0-d
        if getattr(x, "ndim", 0) < 1 or getattr(W, "ndim", 0) != 2:
            raise ValueError(f"x must be (in,), (batch, in) or (..., in) and W 2-d (in, out); "
                             f"got x {_shape(x)} and W {_shape(W)} (reshape x, e.g. flatten)")
        if x.shape[-1] != W.shape[0]:
            raise ValueError(f"x {tuple(x.shape)} and W {tuple(W.shape)} do not match: "
                             f"x.shape[-1] ({x.shape[-1]}) must equal W.shape[0] ({W.shape[0]})")
        y = self.xp.matmul(x, W)
        if b is None:
            return y
        out = (*x.shape[:-1], W.shape[1])
        shape = _shape(b)  # b may be a Python number
        if len(shape) > len(out) or any(n not in (1, m) for n, m in zip(shape[::-1],
                                                                        out[::-1])):
            raise ValueError(f"b {shape} does not broadcast to the output {out}; "
                             f"use shape ({W.shape[1]},)")
        return y + b

    def backward(self, gy):
        x, W = self.inputs[:2]
        needs = self.needs_input_grad
        # Dask: each in its input's chunks, as matmul's
        gx = laid_out_like(matmul(gy, W.T), x) if needs[0] else None
        gW = None
        if needs[1]:
            if x.ndim != 2:  # the rows of every leading axis (one row: x 1-d), as one batch
                x, gy_rows = reshape(x, (-1, x.shape[-1])), reshape(gy, (-1, gy.shape[-1]))
            else:
                gy_rows = gy
            gW = laid_out_like(matmul(x.T, gy_rows), W)
        if len(self.inputs) == 2:
            return gx, gW
        b = self.inputs[2]
        # summed over the batch
        return gx, gW, laid_out_like(sum_to(gy, b.shape), b) if needs[2] else None


def linear(x, W, b=None):
    """x @ W + b for a batch x (N, in), or (..., in), W (in, out), b (out,) or None; one fused
    op."""
    return Linear()(x, W) if b is None else Linear()(x, W, b)


def linear_simple(x, W, b=None):
    """linear as a composition of matmul and add (the reference the fused op is tested against)."""
    y = matmul(x, W)
    return y if b is None else y + b
