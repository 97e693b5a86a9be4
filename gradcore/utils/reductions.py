"""Reductions on raw arrays and the shapes their backward needs (DeZero's dezero.utils names:
reshape_sum_backward, max_backward_shape, logsumexp), for any backend."""
import backends

from ..functions.reduce import _kept_shape, logsumexp as logsumexp_op
from ..functions.shape import normalize_axis
from ..variable import Variable


def max_backward_shape(x, axis):
    """The shape of `x` (an array or a Variable) with the axes that `axis` reduces as size 1:
    where the gradient of a max, min or sum over `axis` broadcasts from."""
    return _kept_shape(tuple(x.shape), normalize_axis(axis, len(x.shape)))


def reshape_sum_backward(gy, x_shape, axis, keepdims):
    """`gy`, the gradient of sum(x, axis, keepdims) for an x of shape `x_shape`, reshaped with
    the summed axes back as size 1, so that it broadcasts to `x_shape`. `gy` is a Variable
    (the result is then differentiable) or an array of any backend."""
    kept = _kept_shape(tuple(x_shape), normalize_axis(axis, len(x_shape)))
    if tuple(gy.shape) == kept:  # keepdims=True gave it this shape already
        return gy
    if isinstance(gy, Variable):
        return gy.reshape(kept)
    return _backend(gy, "reshape_sum_backward").xp.reshape(gy, kept)


def logsumexp(x, axis=1):
    """log(sum(exp(x), axis)) of the raw array `x`, with the reduced axes kept as size 1 (as
    DeZero's dezero.utils.logsumexp), computed stably for large x; an array of x's backend.
    gradcore.functions.logsumexp is the differentiable op for Variables."""
    _backend(x, "logsumexp")
    return logsumexp_op(Variable(x, requires_grad=False), axis, keepdims=True).data


def _backend(x, where):
    """The backend of the raw array `x`; TypeError for a Variable or anything else."""
    backend = backends.backend_of(x)
    if backend is None or isinstance(x, Variable):
        raise TypeError(f"{where}: expected an array, got {type(x).__module__}."
                        f"{type(x).__qualname__} (for a Variable use gradcore.functions)")
    return backend
