"""Layers' ops that depend on train mode or hold state: dropout, batch_norm; and embed_id."""
import numbers

import backends

from .. import variable as _variables
from ..config import Config, recomputing
from ..function import Function
from ..random import draw, noted
from ..variable import Variable, note_write
from .device import accumulator_dtype, astype
from .loss import _backend_and_device, _in_range
from .reduce import average, sum
from .shape import layout, reshape


# =============================================================================== dropout
class Dropout(Function):
    """y = x * mask, the mask zeroing each element with probability `ratio` and scaling
    the rest by 1 / (1 - ratio); gx = gy * the same mask."""
    op_name = "dropout"

    def __init__(self, dropout_ratio):
        self.ratio = dropout_ratio

    def forward(self, x):
        if not self.xp.isdtype(x.dtype, "real floating"):
            raise TypeError(f"x must be a floating-point array, got {x.dtype}")
        u = draw(self.backend, "uniform", x.shape, x.dtype, self.device)
        if self.backend.lazy:  # Dask: drawn in x's chunks, not in chunks of its own
            u = self.backend.laid_out(u, self.backend.layout(x))
        # keep each element with probability 1 - ratio, scaled so the expectation stays x
        mask = self.xp.astype(u > self.ratio, x.dtype) * (1.0 / (1.0 - self.ratio))
        self.save_for_backward(mask)
        return x * mask

    def backward(self, gy):
        mask, = self.saved_tensors  # a constant: the same mask again for every order
        return gy * mask


def dropout(x, dropout_ratio=0.5):
    """In train mode (`Config.train`), zero each element with probability `dropout_ratio` and
    scale the rest by 1 / (1 - dropout_ratio); in test mode return x unchanged. The mask comes
    from the backend's global generator (seed it with gradcore.manual_seed)."""
    if isinstance(dropout_ratio, bool) or not isinstance(dropout_ratio, numbers.Real) or not (
            0.0 <= dropout_ratio < 1.0):
        raise ValueError(
            f"dropout: dropout_ratio must be a number in [0, 1), got {dropout_ratio!r}")
    if not isinstance(x, Variable):
        x = Variable(x, requires_grad=False)  # a raw array is a constant, as in every op
    if not Config.train:
        return x
    return Dropout(float(dropout_ratio))(x)


# =============================================================================== batch_norm
def _stat_axes(ndim):
    """The axes batch_norm averages over: every axis but the channel axis 1."""
    return (0,) + tuple(range(2, ndim))


class BatchNorm(Function):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta per channel (axis 1): the batch's statistics
    in train mode (updating the running ones; gx flows through them), the running ones in test."""
    op_name = "batch_norm"

    def __init__(self, mean, var, decay, eps, train, holders=()):
        self.running_mean, self.running_var = mean, var
        self.holders = holders  # the Variables whose data mean and var are: their writes count
        self.decay, self.eps, self.train = decay, eps, train

    def forward(self, x, gamma, beta):
        self._check(x, gamma, beta)
        xp = self.xp
        axes = _stat_axes(x.ndim)
        shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)   # per channel, broadcasting against x
        # float16: the statistics, x_hat and the output in float32, cast back at the end: a
        # variance past 65,504 (a spread of 256) is inf in float16, and NumPy's var of float16
        # sums its squares in float16, which goes wrong long before that
        self.wide = wide = accumulator_dtype(xp, x.dtype)
        xw = x if wide is None else xp.astype(x, wide)
        if self.train:
            mean = xp.mean(xw, axis=axes, keepdims=True)
            var = xp.var(xw, axis=axes, keepdims=True)
            if not recomputing():  # a checkpointed block's second run: updated already
                self._update(xp.reshape(mean, (-1,)), xp.reshape(var, (-1,)),
                             x.size // x.shape[1])
        else:
            # copies, kept for backward: a train-mode call before it updates the running
            # statistics in place. noted: a checkpointed block computed again during backward
            # gets the copies its first run made, not the statistics as they are by then
            mean, var = self.statistics = noted(
                "batch_norm's running statistics", self._statistics, xw.dtype, shape)
        x_hat = (xw - mean) / xp.sqrt(var + self.eps)
        y = xp.reshape(gamma, shape) * x_hat + xp.reshape(beta, shape)
        return y if wide is None else xp.astype(y, x.dtype)

    def _statistics(self, dtype, shape):
        """Copies (astype) of the running mean and variance, as `dtype`, of shape `shape`."""
        xp = self.xp
        return (xp.reshape(xp.astype(self.running_mean, dtype), shape),
                xp.reshape(xp.astype(self.running_var, dtype), shape))

    def _check(self, x, gamma, beta):
        if x.ndim < 2:
            raise ValueError(f"x must be (N, C) or (N, C, ...) with channels on axis 1, got shape "
                             f"{tuple(x.shape)}")
        C = x.shape[1]
        for name, a in (("gamma", gamma), ("beta", beta),
                        ("mean", self.running_mean), ("var", self.running_var)):
            if tuple(a.shape) != (C,):
                raise ValueError(f"{name} must have shape ({C},), one value per channel of x, "
                                 f"got {tuple(a.shape)}")
        for name, a in (("mean", self.running_mean), ("var", self.running_var)):
            if backends.backend_of(a) is not self.backend or (
                    self.device is not None and self.backend.device_of(a) != self.device):
                raise ValueError(f"the running {name} must be an array on x's device "
                                 f"({self.backend.device_of(x)}); move it there first")
        if self.train and x.size <= C:
            raise ValueError(
                f"x of shape {tuple(x.shape)} has {'no' if x.size == 0 else 'one'} value per "
                "channel to take batch statistics from (the output would be beta whatever x "
                "is, and the running variance would decay to 0): train with a batch of more "
                "than one, or call model.eval() to use the running statistics")

    def _update(self, mean, var, m):
        """running = decay * running + (1 - decay) * batch, in place, with the unbiased batch
        variance (times m / (m - 1), m values per channel) as DeZero and Chainer do."""
        xp, decay = self.xp, self.decay
        rm, rv = self.running_mean, self.running_var
        adjust = m / (m - 1) if m > 1 else 1.0
        if _variables.blocks_running[0] and _variables.block_writes.get() is not None:
            # in a checkpointed block's first run: what a refused one puts back
            for a in (rm, rv):
                _variables.note_block_write(None, "statistics",
                                            (self.backend, a, xp.asarray(a, copy=True)))
        # assigned whole: a Dask array has no in-place arithmetic (`*=` makes a new one), and
        # an assigned lazy one is worked out by the optimizer's next step with the parameters.
        # Scaled before the cast: float16 statistics hold a tenth of a variance of 90,000
        self.backend.assign(rm, rm * decay + xp.astype(mean * (1 - decay), rm.dtype))
        self.backend.assign(rv, rv * decay + xp.astype(var * ((1 - decay) * adjust), rv.dtype))
        for v in self.holders:  # so a graph that read them before refuses to run backward
            _count_write(v)

    def backward(self, gy):
        x, gamma, beta = self.inputs
        if self.wide is None:
            return self._gradients(x, gamma, gy)
        # float16: computed in float32, as forward was, and each gradient cast to its input's
        # dtype (xc * xc in float16 is inf past |x - mean| = 256, and then inv_std is 0)
        wide = self.wide
        grads = self._gradients(astype(x, wide), astype(gamma, wide), astype(gy, wide))
        return tuple(None if g is None else astype(g, v.dtype)
                     for g, v in zip(grads, (x, gamma, beta)))

    def _gradients(self, x, gamma, gy):
        """(gx, ggamma, gbeta) for x, gamma and gy of one dtype; None where none is needed."""
        n_x, n_gamma, n_beta = self.needs_input_grad
        axes = _stat_axes(x.ndim)
        shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
        if self.train:  # the statistics depend on x: recompute them as a graph
            m = x.size // x.shape[1]
            mean = average(x, axes, keepdims=True)
            xc = x - mean
            inv_std = (average(xc * xc, axes, keepdims=True) + self.eps) ** -0.5
        else:
            mean, var = self.statistics  # those forward used
            mean = Variable(mean, requires_grad=False)
            inv_std = Variable(1.0 / self.xp.sqrt(var + self.eps), requires_grad=False)
            xc = x - mean
        x_hat = xc * inv_std
        gbeta = sum(gy, axis=axes) if n_beta or (n_x and self.train) else None
        ggamma = sum(gy * x_hat, axis=axes) if n_gamma or (n_x and self.train) else None
        gx = None
        if n_x:
            g = gy
            if self.train:  # minus the parts that flow through the batch mean and variance
                g = gy - (reshape(gbeta, shape) + x_hat * reshape(ggamma, shape)) * (1.0 / m)
            gx = g * (reshape(gamma, shape) * inv_std)
        return gx, ggamma if n_gamma else None, gbeta if n_beta else None


def _count_write(v):
    """Count a write gradcore made into v's array (v.version goes up), in a step that
    gradcore.compile records too, as the data setter does: each replay counts it again."""
    recorder = _variables.step_recorder
    if recorder is not None:
        recorder.writing(v, data=True)
    note_write(v)


def batch_norm(x, gamma, beta, mean, var, decay=0.9, eps=2e-5):
    """Batch normalisation per channel (axis 1) of x (N, C) or (N, C, H, W):
    gamma * (x - mu) / sqrt(sigma2 + eps) + beta, with gamma, beta of shape (C,).

    Train mode (`Config.train`): mu, sigma2 are the batch's mean and (biased) variance over every
    axis but 1, and the running statistics `mean`, `var` (arrays of shape (C,), or Variables whose
    data is used) are updated in place: mean = decay * mean + (1 - decay) * mu, and likewise var
    with the unbiased batch variance sigma2 * m / (m - 1), m = values per channel (as DeZero).
    A Variable's version goes up with the update, so backward through a graph that read it before
    refuses to run, as after any in-place write.
    Test mode: mu, sigma2 are the running `mean` and `var`, which stay unchanged.
    """
    holders = tuple(v for v in (mean, var) if isinstance(v, Variable))
    mean = mean.data if isinstance(mean, Variable) else mean
    var = var.data if isinstance(var, Variable) else var
    for name, a in (("mean", mean), ("var", var)):
        if backends.backend_of(a) is None:
            raise TypeError(f"batch_norm: the running {name} must be an array (it is updated in "
                            f"place), got {type(a).__name__}")
    f = BatchNorm(mean, var, decay, eps, Config.train, holders)
    y = f(x, gamma, beta)
    if f.train and f.backend.lazy and y.creator is None:
        # Dask: with no graph recorded (no_grad, or nothing requires grad) no optimizer step
        # comes from this call to work out the statistics with the parameters: worked out now,
        # else each forward's would hold every earlier one's
        f.backend.persist([])
    return y


# =============================================================================== embed_id
class EmbedID(Function):
    """y = W[x], rows of W (V, D) picked by integer ids x: x.shape + (D,); gW adds gy's
    rows into the rows named (repeated ids add up), x gets none."""
    op_name = "embed_id"

    def forward(self, x, W):
        xp = self.xp
        if not xp.isdtype(x.dtype, "integral"):
            raise TypeError(f"x must hold integer ids, got {x.dtype}")
        if W.ndim < 1:
            raise ValueError("W must have at least one axis (the ids pick along axis 0)")
        V = W.shape[0]
        # checked here, as W[x] would: CuPy's take wraps out-of-range ids silently. In int64,
        # as they are wrapped: a narrow dtype cannot hold V (uint8 bytes for 256 rows, int16 ids
        # for 50,257), so `x + V` would overflow in it
        low = 0 if x.dtype == xp.uint64 else -V  # a uint64 past int64's range turns negative
        ids = _in_range(self.backend, x, low, V, "embed_id", f"ids must be in [-{V}, {V}) for a "
                        f"W of {V} rows; got ids from {{lowest}} to {{highest}}")
        self.ids = xp.where(ids < 0, ids + V, ids)
        # take needs 1-d ids; array-API indexing cannot spell W[x] for a 2-d W
        y = xp.take(W, xp.reshape(self.ids, (-1,)), axis=0)
        return xp.reshape(y, tuple(x.shape) + tuple(W.shape[1:]))

    def backward(self, gy):
        W = self.inputs[1]
        return None, EmbedIDGrad(W.shape, layout(W))(self.ids, gy)


class EmbedIDGrad(Function):
    """The gradient of embed_id with respect to W: gy's rows added into the rows of a zero W
    named by the ids (repeated ids add up). Linear in gy; its backward is embed_id again."""
    op_name = "embed_id_grad"

    def __init__(self, shape, layout=None):
        self.shape = tuple(shape)
        self.layout = layout  # W's, on a lazy backend

    def forward(self, ids, gy):
        gW = self.backend.zeros(self.shape, gy.dtype, self.device)
        if self.layout is not None:
            gW = self.backend.laid_out(gW, self.layout)
        rows = self.xp.reshape(gy, (-1,) + self.shape[1:])
        return self.backend.scatter_add(gW, self.xp.reshape(ids, (-1,)), rows)

    def backward(self, ggW):
        ids = self.inputs[0]
        return None, embed_id(ids, ggW)


def embed_id(x, W):
    """Rows of W (V, D) picked by the integer ids x (an array of any shape, or an int or list):
    W[x], of shape x.shape + (D,). Repeated ids add their gradients into the same row. Ids on
    another device (NumPy ids for a W on the GPU) are moved to W's, as W[x] moves an index.
    Negative ids count from the end, as in W[x] and DeZero (-1 is the last row, not padding:
    PyTorch raises); ids outside [-V, V) raise IndexError."""
    _, device = _backend_and_device("embed_id", W)
    if isinstance(x, Variable):
        x = x.data  # integer ids carry no gradient
    source = backends.backend_of(x)
    if source is not None:
        # a NumPy scalar (np.int64(3)) stays a scalar on NumPy, which the op would take for a
        # number: a 0-d array, as 3 becomes
        x = source.ensure_array(x)
    if source is not None or isinstance(x, (numbers.Number, list, tuple)):
        x = backends.asarray_on(x, device)
    return EmbedID()(x, W)
