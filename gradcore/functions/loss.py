"""Losses: mean squared error, softmax / sigmoid / binary cross entropy, and accuracy.

Like DeZero, every loss sums over the elements and divides by N = x.shape[0] (the batch size):
for outputs of shape (N,) or (N, 1) that is the mean over all elements.
"""
import functools
import math
import warnings

import backends

from ..function import Function
from ..variable import Variable, dtype_kind
from .activation import sigmoid, softmax
from .device import accumulator_dtype, astype
from .math import as_floating, clip, log, sub
from .reduce import sum
from .shape import get_item


def _batch_size(x):
    """N, the number of samples: x.shape[0] (1 for a 0-d x)."""
    return x.shape[0] if x.ndim else 1


def _sample_weight(n):
    """1 / n, what each of n samples weighs in a batch mean: a Python float (float16 cannot hold
    an n of 65,520 or more, but holds 1 / n). For an empty batch nan, as its mean is: times an
    empty gradient, that gives the empty gradient PyTorch gives."""
    return 1.0 / n if n else math.nan


def _batch_mean(xp, values, n, dtype):
    """sum(values) / n as `dtype`. For float16, summed and divided in float32 (as NumPy's mean
    and PyTorch do): in float16 a sum past 65,504 is inf, and so is an n of 65,520 or more."""
    wide = accumulator_dtype(xp, dtype)
    if wide is None:
        return xp.sum(values) / n
    return xp.astype(xp.sum(values, dtype=wide) / n, dtype)


def _backend_and_device(op, x):
    """(backend, device) of x, a Variable or an array."""
    if isinstance(x, Variable):
        return x.backend, x.device
    backend = backends.backend_of(x)
    if backend is None:
        raise TypeError(f"{op}: expected a Variable or an array, got {type(x).__name__}")
    return backend, backend.device_of(x)


def _labels_on_device(op, t, device, dtype=None):
    """Labels or targets `t` (a Variable, an array of any backend, a list) as an array on
    `device` (NumPy labels go to the GPU, or wherever x lives), cast to `dtype`."""
    if isinstance(t, Variable):
        t = t.data
    try:
        return backends.asarray_on(t, device, dtype)
    except (TypeError, ValueError):
        if backends.backend_of(t) is not None:
            raise
        raise TypeError(f"{op}: labels and targets must be arrays or lists, got "
                        f"{type(t).__name__}") from None


def _float_dtype(x):
    """x's dtype if it is a real floating one, else None."""
    return x.dtype if x.xp.isdtype(x.dtype, "real floating") else None


def _class_labels(backend, t, n, c=None, op=None):
    """t checked as N class indices, flattened from (N, 1) to (N,), as int64; with `c`, also
    checks that every label is in [0, c) (before indexing: CuPy wraps out-of-range indices
    silently), on a lazy backend when t is computed (`op` names where, then)."""
    xp = backend.xp
    if t.ndim == 2 and t.shape[1] == 1:
        t = xp.reshape(t, (t.shape[0],))
    if t.ndim == 2 and c is not None and t.shape == (n, c):
        # one-hot rows or probabilities (PyTorch's cross_entropy takes them): neither the
        # dtype's cast nor a reshape makes them labels
        raise ValueError(f"labels must be N class indices, got an array of shape "
                         f"{tuple(t.shape)}, one row of {c} per example (one-hot targets or "
                         "probabilities?): pass the class of each row, t.argmax(axis=1)")
    if not xp.isdtype(t.dtype, "integral"):
        raise TypeError(f"labels must be integer class indices, got dtype {t.dtype}; "
                        "convert them first, e.g. t.astype(int)")
    if t.ndim != 1:
        raise ValueError(f"labels must be a 1-d array of class indices, got shape "
                         f"{tuple(t.shape)}")
    if t.shape[0] != n:
        raise ValueError(f"got {t.shape[0]} labels for {n} rows of x; pass one class index "
                         "per row (t.shape[0] == x.shape[0])")
    if c is None or not n:
        return t if t.dtype == xp.int64 else xp.astype(t, xp.int64)
    return _in_range(backend, t, 0, c, op, f"labels must lie in [0, {c}) for {c} classes, got "
                     "values from {lowest} to {highest}")


def _in_range(backend, t, low, high, op, message):
    """Integers t as int64, checked to lie in [low, high), else IndexError(`message` formatted
    with t's `lowest` and `highest`). Compared in int64, the dtype of the bounds: uint8 labels
    (raw MNIST files) cannot hold the class 256, and `t >= 256` would overflow in them. On a lazy
    backend (Dask) each block is checked when it is computed, `op` and that block's extremes in
    the message: the values are not computed now, only when asked for."""
    xp = backend.xp
    if backend.lazy:
        check = functools.partial(_checked_range, low=low, high=high, message=f"{op}: {message}")
        return xp.checked(t, check, xp.int64)
    return _checked_range(xp, t, low, high, message)


def _checked_range(xp, t, low, high, message):
    """_in_range's check, on t of namespace `xp` (NumPy for a block of a Dask array)."""
    ids = t if t.dtype == xp.int64 else xp.astype(t, xp.int64)
    if ids.size and bool(xp.any((ids < low) | (ids >= high))):
        raise IndexError(message.format(lowest=int(xp.min(t)), highest=int(xp.max(t))))
    return ids


def _check_loss_operand_shapes(a, b, names, op=None):
    """ValueError unless a and b have one shape (losses do not broadcast)."""
    sa, sb = tuple(getattr(a, "shape", ())), tuple(getattr(b, "shape", ()))
    if sa != sb:
        prefix = f"{op}: " if op else ""  # inside a Function, __call__ adds the op's name
        raise ValueError(f"{prefix}{names[0]} and {names[1]} must have the same shape, got {sa} "
                         f"and {sb}; reshape one to match (e.g. t.reshape(y.shape))")


def _targets_like(op, t, x):
    """Targets for sigmoid / binary cross entropy: on x's device, reshaped to x's shape when only
    the number of axes differs (as DeZero does). A Variable already on x's device stays one (a
    gradient can flow to it); anything else becomes a constant array of x's dtype."""
    if not isinstance(x, Variable):
        x = Variable(x, requires_grad=False)
    if not (isinstance(t, Variable) and t.backend is x.backend and t.device == x.device):
        t = Variable(_labels_on_device(op, t, x.device, _float_dtype(x)), requires_grad=False)
    if t.ndim != x.ndim and t.size == x.size:
        t = t.reshape(x.shape)
    return t


def _move_array_to_variable(op, x0, x1):
    """A raw array (or list) beside a Variable is a constant: it follows the Variable to its
    device and floating dtype, so NumPy targets work on a GPU and float32 stays float32."""
    if isinstance(x0, Variable) and not isinstance(x1, Variable):
        x1 = _labels_on_device(op, x1, x0.device, _float_dtype(x0))
    elif isinstance(x1, Variable) and not isinstance(x0, Variable):
        x0 = _labels_on_device(op, x0, x1.device, _float_dtype(x1))
    return x0, x1


# =============================================================================== mean squared error
class MeanSquaredError(Function):
    """y = sum((x0 - x1) ** 2) / N, N the first axis of x0 - x1, 0-d;
    gx0 = gy * 2 * (x0 - x1) / N, gx1 = -gx0."""

    def forward(self, x0, x1):
        backend = self.backend
        if dtype_kind(backend, x0.dtype) == dtype_kind(backend, x1.dtype) == "integral":
            # integers or bools: in float64, the dtype their mean has anyway (as NumPy's); in
            # their own dtype the difference and its square wrap around (int8: 100**2 is 16)
            xp = self.xp
            x0, x1 = xp.astype(x0, xp.float64), xp.astype(x1, xp.float64)
        diff = x0 - x1  # shapes that do not broadcast raise here, naming the op and both
        self.n = _batch_size(diff)
        return _batch_mean(self.xp, diff * diff, self.n, diff.dtype)

    def backward(self, gy):
        x0, x1 = self.inputs
        n0, n1 = self.needs_input_grad
        # broadcast: the engine sums it back to each shape
        gx0 = gy * (x0 - x1) * (2 * _sample_weight(self.n))
        return gx0 if n0 else None, -gx0 if n1 else None


def _pairs_alike(s0, s1):
    """Whether x0 - x1, of shapes s0 and s1, pairs each element of one with one of the other,
    with the batch size of both: shapes that differ only in axes of 1, (1, 1) and (1,) (a
    DeZero RNN's prediction and its target), where broadcasting changes nothing. (3, 1) and
    (3,) make (3, 3)."""
    ndim = max(len(s0), len(s1))
    a, b = (1,) * (ndim - len(s0)) + s0, (1,) * (ndim - len(s1)) + s1
    if any(m != n and 1 not in (m, n) for m, n in zip(a, b)):
        return False  # no broadcast: warned, then the op raises naming both shapes
    shape = tuple(max(m, n) for m, n in zip(a, b))
    batch = shape[0] if shape else 1
    return all(math.prod(s) == math.prod(shape) and (s[0] if s else 1) == batch
               for s in (s0, s1))


def mean_squared_error(x0, x1):
    """sum((x0 - x1) ** 2) / N, N the first axis of x0 - x1 (DeZero's definition): a 0-d
    Variable. Shapes that differ but broadcast are computed as DeZero does (over the broadcast
    difference) with PyTorch's warning, as that is rarely what was meant; a raw array beside a
    Variable follows it to its device and dtype."""
    x0, x1 = _move_array_to_variable("mean_squared_error", x0, x1)
    s0, s1 = tuple(getattr(x0, "shape", ())), tuple(getattr(x1, "shape", ()))
    if s0 != s1 and not _pairs_alike(s0, s1):
        warnings.warn(f"mean_squared_error: x0 has shape {s0} and x1 {s1}; they broadcast to "
                      "one shape, which is likely not what was meant: make them the same shape",
                      UserWarning, stacklevel=2)
    return MeanSquaredError()(x0, x1)


def mean_squared_error_simple(x0, x1):
    """mean_squared_error as a plain composition of ops (its test oracle)."""
    x0, x1 = _move_array_to_variable("mean_squared_error_simple", x0, x1)
    _check_loss_operand_shapes(x0, x1, ("x0", "x1"), "mean_squared_error_simple")
    diff = sub(x0, x1)
    return sum(diff * diff) / _batch_size(diff)


# ============================================================================ softmax cross entropy
class SoftmaxCrossEntropy(Function):
    """y = the mean over rows of -log softmax(x)[i, t_i] for logits x (N, C) and integer labels
    t (N,), 0-d; gx = (softmax(x) - onehot(t)) * gy / N, and no gradient for t."""

    def forward(self, x, t):
        xp = self.xp
        if x.ndim != 2:
            raise ValueError(f"expects logits of shape (N, C), got shape {tuple(x.shape)}")
        x = as_floating(self.backend, x)  # integers: x - max(x) would wrap around in their dtype
        n, c = x.shape
        labels = _class_labels(self.backend, t, n, c, "softmax_cross_entropy")
        if labels.dtype == t.dtype and not self.backend.lazy:
            # no cast made it new: the caller's labels (or a view of them), which a refill
            # (t[:] = next batch) before backward would change. N integers: a cheap copy
            labels = self.xp.asarray(labels, copy=True)
        t = labels
        if self.backend.lazy and c:
            # Dask: labels in x's row chunks (NumPy labels arrive as one chunk), so that
            # backward's one-hot (t == 0..C-1) is made block by block, not as one (N, C) chunk
            t = self.backend.laid_out(t, self.backend.layout(x[:, 0]))
        self.save_for_backward(t)
        if n == 0:
            # the mean over no rows is nan, as PyTorch's. Not computed: Dask cannot take the
            # max over the classes of no rows (a reduction with no identity fails at compute)
            return self.backend.asarray(math.nan, dtype=x.dtype, device=self.device)
        # -log softmax(x)[i, t_i] = log sum_j exp(x_ij - m_i) - (x_it_i - m_i), m_i = max_j x_ij
        shifted = x - xp.max(x, axis=1, keepdims=True)
        log_z = xp.log(xp.sum(xp.exp(shifted), axis=1, dtype=accumulator_dtype(xp, x.dtype)))
        picked = xp.reshape(xp.take_along_axis(shifted, xp.reshape(t, (n, 1)), axis=1), (n,))
        return _batch_mean(xp, log_z - picked, n, x.dtype)

    def backward(self, gy):
        x = self.inputs[0]
        t, = self.saved_tensors
        n, c = x.shape
        xp = self.xp
        # one-hot of t (int64, as _class_labels made it): compare t with 0..c-1, on x's device
        classes = self.backend.to_device(xp.arange(c, dtype=xp.int64), self.device)
        onehot = xp.astype(xp.reshape(t.data, (n, 1)) == xp.reshape(classes, (1, c)), x.dtype)
        return (softmax(x) - onehot) * (gy * _sample_weight(n)), None


def softmax_cross_entropy(x, t):
    """Mean over the N rows of -log softmax(x)[i, t_i]: x (N, C) logits, t (N,) integer labels
    (NumPy or the backend's; moved to x's device). Stable for any logit magnitude. 0-d result."""
    _, device = _backend_and_device("softmax_cross_entropy", x)
    return SoftmaxCrossEntropy()(x, _labels_on_device("softmax_cross_entropy", t, device))


def softmax_cross_entropy_simple(x, t):
    """softmax_cross_entropy as a composition: softmax, clip to [1e-15, 1], log, and picking
    log p[i, t_i] with integer-array indexing (the oracle; the fused op is stabler)."""
    backend, device = _backend_and_device("softmax_cross_entropy_simple", x)
    t = _labels_on_device("softmax_cross_entropy_simple", t, device)
    n = x.shape[0] if x.ndim == 2 else None
    with backend.device_context(device):
        if n is None:
            raise ValueError(f"softmax_cross_entropy_simple: expects logits of shape (N, C), got "
                             f"shape {tuple(x.shape)}")
        try:
            t = _class_labels(backend, t, n, x.shape[1], "softmax_cross_entropy_simple")
        except (TypeError, ValueError, IndexError) as e:
            raise type(e)(f"softmax_cross_entropy_simple: {e}") from None
        rows = backend.to_device(backend.xp.arange(n, dtype=backend.xp.int64), device)
    p = clip(softmax(x), 1e-15, 1.0)
    return -sum(get_item(log(p), (rows, t))) / n


# ============================================================================ sigmoid cross entropy
class SigmoidCrossEntropy(Function):
    """y = -sum(t log p + (1 - t) log(1 - p)) / N, p = sigmoid(x), from the logits
    (stable), 0-d; gx = (sigmoid(x) - t) * gy / N, gt = -x * gy / N."""

    def forward(self, x, t):
        xp = self.xp
        _check_loss_operand_shapes(x, t, ("x", "t"))
        floating = as_floating(self.backend, x)  # integers: -|x| would wrap in their dtype
        if floating is not x and dtype_kind(self.backend, t.dtype) == "float":
            # integer logits beside soft targets: in the wider of the two (uint8's float16
            # would round float32 targets)
            floating = xp.astype(floating, xp.result_type(floating.dtype, t.dtype))
        x = floating
        self.dtype = x.dtype
        if t.dtype != x.dtype:
            t = xp.astype(t, x.dtype)  # 0/1 integer labels: float32 logits stay float32
        self.save_for_backward(t)
        # -(t log p + (1 - t) log(1 - p)), p = sigmoid(x), is softplus(x) - t x, and
        # softplus(x) = max(x, 0) + log(1 + exp(-|x|)): no overflow, no log(0)
        loss = (xp.where(x > 0, x, xp.zeros_like(x)) - t * x
                + xp.log1p(xp.exp(-xp.abs(x))))
        return _batch_mean(xp, loss, _batch_size(x), x.dtype)

    def backward(self, gy):
        x, t_in = self.inputs
        x = astype(x, self.dtype)  # integer logits as forward computed with them: -x wraps
        t, = self.saved_tensors  # t_in itself, or a cast constant
        if t is not t_in and self.needs_input_grad[1]:
            t = astype(t_in, x.dtype)  # soft targets of another dtype: differentiable too
        g = gy * _sample_weight(_batch_size(x))
        gx = (sigmoid(x) - t) * g if self.needs_input_grad[0] else None
        gt = -x * g if self.needs_input_grad[1] else None
        return gx, gt


def sigmoid_cross_entropy(x, t):
    """-sum(t log p + (1 - t) log(1 - p)) / N with p = sigmoid(x), N = x.shape[0] (DeZero's
    definition: the mean when x is (N,) or (N, 1)). t: 0/1 (or soft) targets shaped like x, or
    with the same elements (reshaped). Computed from the logits: stable for any magnitude."""
    return SigmoidCrossEntropy()(x, _targets_like("sigmoid_cross_entropy", t, x))


# ============================================================================= binary cross entropy
class BinaryCrossEntropy(Function):
    """y = -sum(t log p + (1 - t) log(1 - p)) / N for probabilities p clipped to
    [eps, 1 - eps], 0-d; gp is 0 where the clip is active. p outside [0, 1] gives NaN."""

    def forward(self, p, t):
        xp = self.xp
        _check_loss_operand_shapes(p, t, ("p", "t"))
        if t.dtype != p.dtype:
            t = xp.astype(t, p.dtype)
        eps = float(xp.finfo(p.dtype).eps)
        # p outside [0, 1] (logits, most likely) is no probability: NaN there, in the loss and
        # both gradients (backward computes from pc), rather than a clip that would count it
        # as a perfect prediction. Chosen by where: a check read on the host would stop a
        # compiled step's replay and wait for a GPU
        pc = xp.where((p < 0) | (p > 1), float("nan"), xp.clip(p, eps, 1 - eps))
        # the slope of the clip: 1 inside [eps, 1 - eps], 0 outside
        self.save_for_backward(t, pc, xp.astype((p >= eps) & (p <= 1 - eps), p.dtype))
        return -_batch_mean(xp, t * xp.log(pc) + (1 - t) * xp.log1p(-pc), _batch_size(p), p.dtype)

    def backward(self, gy):
        p, t_in = self.inputs
        t, pc, inside = self.saved_tensors
        if t is not t_in and self.needs_input_grad[1]:
            t = astype(t_in, p.dtype)  # soft targets of another dtype: differentiable too
        # clip(p) written with ops: equal to pc, with the derivative `inside` (for higher order)
        q = p * inside + pc * (1 - inside)
        g = gy * _sample_weight(_batch_size(p))
        gp = (q - t) / (q * (1 - q)) * inside * g if self.needs_input_grad[0] else None
        gt = (log(1 - q) - log(q)) * g if self.needs_input_grad[1] else None
        return gp, gt


def binary_cross_entropy(p, t):
    """-sum(t log p + (1 - t) log(1 - p)) / N for probabilities p, N = p.shape[0] (DeZero's
    definition). p is clipped to [eps, 1 - eps], eps the machine epsilon of p's dtype (2.2e-16
    for float64, 1.2e-7 for float32), so p = 0 or 1 costs at most -log(eps) (36.0 or 15.9) per
    element instead of inf, and the gradient is 0 outside the clip, as for F.clip. (DeZero
    clips to [1e-15, 0.999].) p outside [0, 1] is no probability: the loss and the gradients
    are NaN (PyTorch raises). Logits go to sigmoid_cross_entropy, which needs no clip and is
    stable for any magnitude."""
    return BinaryCrossEntropy()(p, _targets_like("binary_cross_entropy", t, p))


# =============================================================================== accuracy
def accuracy(y, t):
    """The fraction of rows where argmax(y, axis=1) == t, a float64 Variable with no graph (not
    differentiable): y (N, C) scores, t (N,) integer labels (moved to y's device)."""
    backend, device = _backend_and_device("accuracy", y)
    data = y.data if isinstance(y, Variable) else y
    t = _labels_on_device("accuracy", t, device)
    xp = backend.xp
    with backend.device_context(device):
        try:
            if data.ndim != 2:
                raise ValueError(f"expects scores of shape (N, C), got shape {tuple(data.shape)}")
            t = _class_labels(backend, t, data.shape[0])
        except (TypeError, ValueError) as e:
            raise type(e)(f"accuracy: {e}") from None
        pred = xp.argmax(data, axis=1)
        correct = pred == xp.astype(t, pred.dtype)
        # float64 whatever the scores' dtype, as DeZero's (NumPy's mean of bools): float16
        # counted 9,194 of 10,000 where 9,196 were right, float32 9,196.0001
        acc = xp.mean(xp.astype(correct, xp.float64))
    return Variable(backend.ensure_array(acc), requires_grad=False)
