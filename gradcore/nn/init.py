"""Initialisers, PyTorch's names: each fills a Parameter's data in place of the old (a counted
write), on the Parameter's own backend, device and dtype, drawing from the backend's global
generator (gradcore.manual_seed repeats them). Returns the Parameter.

Fans follow gradcore's layouts: a Linear weight W is (in, out), as in DeZero (PyTorch's is
(out, in)), so fan_in is its first axis; a convolution's W is (out channels, in channels,
kh, kw), so fan_in = in channels * kh * kw and fan_out = out channels * kh * kw. Any weight of
3 or more axes is read that way, so for Deconv2d's (in channels, out channels, kh, kw) the two
fans come out swapped: fan_in is out channels * kh * kw, as PyTorch's fans of a ConvTranspose
weight are (pass mode="fan_out" to kaiming_* for the input side).

Numeric arguments are taken as Python floats (a NumPy scalar or a 0-d array of a real number is
one; a bool is refused), so a fill computes in the Parameter's dtype: under NumPy 2 float32 data
times np.float64(2) would be float64.
"""
import math
import numbers

import numpy

import backends

from ..functions.device import accumulator_dtype
from .module import _numpy_dtype

__all__ = ["zeros_", "ones_", "constant_", "normal_", "uniform_", "xavier_uniform_",
           "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
           "calculate_gain"]


def _data(p, where):
    if p.data is None:
        raise ValueError(f"{where}: the parameter has no data yet (a lazily sized layer makes it "
                         "at its first call): call the model once, or give the layer its input "
                         "size, then initialise")
    return p.data


def _number(value, name, where, integers=float):
    """`value`, a real number (Python's, NumPy's, or a 0-d array of one), as a Python float;
    an integer as `integers` makes it (int: exact, as a fill of int64 needs)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return integers(value) if isinstance(value, numbers.Integral) else float(value)
    if not isinstance(value, numbers.Number) and getattr(value, "ndim", None) == 0:
        backend = backends.backend_of(value)
        if backend is not None and backend.xp.isdtype(value.dtype, "integral"):
            return integers(value)
        if backend is not None and backend.xp.isdtype(value.dtype, "real floating"):
            return float(value)
    shape = getattr(value, "shape", ())
    got = f"an array of shape {tuple(shape)}" if shape else repr(value)
    raise TypeError(f"{where}: {name} must be a real number, got {got} ({type(value).__name__})")


def _fits(value, dtype, name, where):
    """ValueError unless `dtype` (a parameter's) holds the number `value`, naming both: a finite
    number past a floating dtype's largest would be filled in as inf (NumPy only warns), and an
    integer dtype takes finite numbers in its range only (truncated, as PyTorch's fill_ takes
    them; NumPy refuses others naming neither, CuPy wraps them). inf and NaN, asked for, fill a
    floating parameter as they are."""
    target = _numpy_dtype(dtype)
    if target.kind == "f":
        try:
            wide = float(value)
        except OverflowError:  # a Python int past float64's range
            fits = False
        else:
            with numpy.errstate(over="ignore"):
                fits = not math.isfinite(wide) or bool(numpy.isfinite(numpy.asarray(wide, target)))
        holds = f"finite numbers up to {float(numpy.finfo(target).max):g} in magnitude"
    elif target.kind in "iu":
        info = numpy.iinfo(target)
        fits = (isinstance(value, int) or math.isfinite(value)) and (
            info.min <= math.trunc(value) <= info.max)
        holds = f"{info.min} to {info.max}"
    else:
        return
    if not fits:
        raise ValueError(f"{where}: {name} = {value!r} does not fit the parameter's {target} "
                         f"({holds}); pass a value in its range, or make the parameter of a "
                         "dtype that holds it")


def _fill(p, array):
    """p with data `array` in p's dtype and, on a lazy backend, in its old data's layout (Dask:
    its chunks, as backward and the optimizer keep them): every fill computes in that dtype
    already (its arguments are Python floats), and this cast keeps any that did not from
    changing the parameter."""
    backend, dtype = p.backend, p.data.dtype
    if array.dtype != dtype:
        array = backend.asarray(array, dtype=dtype, device=p.device)
    if backend.lazy:
        array = backend.laid_out(array, backend.layout(p.data))
    p.data = array
    return p


def _floating(p, where):
    """p's data, refused unless floating-point: a random fill of integers would be truncated."""
    data = _data(p, where)
    if not p.xp.isdtype(data.dtype, "real floating"):
        raise TypeError(f"{where}: needs a floating-point parameter, got dtype {data.dtype}")
    return data


def _draw(p, kind, where, dtype=None):
    """Samples shaped and placed like p, of `dtype` (p's by default), uniform in [0, 1) or
    standard normal."""
    data = _floating(p, where)
    backend, device = p.backend, p.device
    with backend.device_context(device):
        draw = backend.random_uniform if kind == "uniform" else backend.random_normal
        samples = draw(tuple(data.shape), dtype or data.dtype, device)
        if backend.lazy:  # drawn in p's chunks, not cut into them afterwards
            samples = backend.laid_out(samples, backend.layout(data))
        return samples


def constant_(p, value):
    """Every entry `value`."""
    return _constant(p, value, "constant_")


def _constant(p, value, where):
    """constant_, its errors naming `where`: the function the user called."""
    value = _number(value, "value", where, integers=int)
    data = _data(p, where)
    _fits(value, data.dtype, "value", where)
    backend, device = p.backend, p.device
    with backend.device_context(device):
        # a 0-d array of p's dtype: rounded once (an integer parameter's truncated, as by
        # PyTorch's fill_), then put in with no type promotion
        fill = backend.asarray(value, dtype=data.dtype, device=device)
        empty = backend.empty(tuple(data.shape), data.dtype, device)
        if backend.lazy:  # made in p's chunks, which assign keeps
            empty = backend.laid_out(empty, backend.layout(data))
        return _fill(p, backend.assign(empty, fill))


def zeros_(p):
    """Every entry 0 (constant_(p, 0.0))."""
    return _constant(p, 0.0, "zeros_")


def ones_(p):
    """Every entry 1 (constant_(p, 1.0))."""
    return _constant(p, 1.0, "ones_")


def uniform_(p, a=0.0, b=1.0):
    """Uniform in [a, b), b itself never drawn in p's dtype (float16 weights are drawn and
    scaled in float32, then cast). a and b must fit p's dtype (ValueError)."""
    return _uniform(p, a, b, "uniform_")


def _uniform(p, a, b, where):
    a, b = _number(a, "a", where), _number(b, "b", where)
    if not a < b:
        raise ValueError(f"{where}: needs a < b, got a={a}, b={b}")
    data = _floating(p, where)
    for name, value in (("a", a), ("b", b)):
        _fits(value, data.dtype, name, where)
    xp, backend, device = p.xp, p.backend, p.device
    wide = accumulator_dtype(xp, data.dtype) or data.dtype  # float16: drawn in float32
    y = _draw(p, "uniform", where, wide)
    with backend.device_context(device):
        if b - a <= float(xp.finfo(wide).max):
            y = y * (b - a) + a
        else:  # b - a itself overflows (-3e38, 3e38 in float32): in two halves, each fits
            half = b / 2 - a / 2
            y = (y * half + a) + y * half
        y = xp.astype(y, data.dtype, copy=False)
        # a draw just below b may round to b, in the scaling or the cast: the largest number of
        # p's dtype below b takes its place (float32 and float64 draws keep their numbers)
        a, b = (backend.asarray(v, dtype=data.dtype, device=device) for v in (a, b))
        return _fill(p, xp.minimum(y, xp.nextafter(b, a)))


def normal_(p, mean=0.0, std=1.0):
    """Normal with `mean` and `std`, which must fit p's dtype, as must every draw (ValueError:
    float16 with std=3e4 would give inf wherever a draw passes 2.2 std)."""
    return _normal(p, mean, std, "normal_")


def _normal(p, mean, std, where):
    mean, std = _number(mean, "mean", where), _number(std, "std", where)
    if std < 0:
        raise ValueError(f"{where}: std must be >= 0, got {std}")
    data = _floating(p, where)
    for name, value in (("mean", mean), ("std", std)):
        _fits(value, data.dtype, name, where)
    largest = float(p.xp.finfo(data.dtype).max)
    # a draw past 16 std (a chance of 1e-57) is all that could pass the dtype's largest
    # otherwise: only where one may is the result read back, to look for one that did
    suspect = math.isfinite(mean) and abs(mean) + 16 * std > largest
    y = _draw(p, "normal", where)
    if not suspect:
        return _fill(p, y * std + mean)
    with p.backend.device_context(p.device), p.backend.arithmetic_warnings_off():
        y = y * std + mean
        if not bool(p.xp.all(p.xp.isfinite(y))):
            raise ValueError(
                f"{where}: draws of mean={mean!r}, std={std!r} pass the largest number of the "
                f"parameter's {_numpy_dtype(data.dtype)} ({largest:g}) and would be inf; use "
                "a smaller std, or make the parameter of a wider dtype")
    return _fill(p, y)


def _fans(shape, where):
    """(fan_in, fan_out) of a weight of `shape`. A fan of 0 means an empty weight, which has
    nothing to draw: it is given as 1, so the initialisers leave the weight as it is (PyTorch's
    no-op) instead of dividing by 0."""
    if len(shape) < 2:
        raise ValueError(f"{where}: needs a weight of 2 or more axes to have fans, got shape "
                         f"{tuple(shape)}")
    if len(shape) == 2:  # Linear's (in, out)
        fan_in, fan_out = shape[0], shape[1]
    else:
        receptive = math.prod(shape[2:])
        fan_in, fan_out = shape[1] * receptive, shape[0] * receptive
    return max(fan_in, 1), max(fan_out, 1)


def calculate_gain(nonlinearity, param=None):
    """The gain PyTorch recommends for `nonlinearity`: 1 for linear, the convolutions (conv1d to
    conv3d, conv_transpose1d to conv_transpose3d) and sigmoid, 5/3 for tanh, sqrt(2) for relu,
    3/4 for selu, sqrt(2 / (1 + slope**2)) for leaky_relu (param: the slope, 0.01)."""
    gains = {"linear": 1.0, "conv1d": 1.0, "conv2d": 1.0, "conv3d": 1.0,
             "conv_transpose1d": 1.0, "conv_transpose2d": 1.0, "conv_transpose3d": 1.0,
             "sigmoid": 1.0, "tanh": 5.0 / 3, "relu": math.sqrt(2.0), "selu": 3.0 / 4}
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else _number(param, "param", "calculate_gain")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity not in gains:
        raise ValueError(f"calculate_gain: unknown nonlinearity {nonlinearity!r}; known: "
                         f"{', '.join(sorted([*gains, 'leaky_relu']))}")
    return gains[nonlinearity]


def xavier_uniform_(p, gain=1.0):
    """Glorot's uniform: bound gain * sqrt(6 / (fan_in + fan_out))."""
    gain = _number(gain, "gain", "xavier_uniform_")
    fan_in, fan_out = _fans(_data(p, "xavier_uniform_").shape, "xavier_uniform_")
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    _fits(bound, p.dtype, "the bound gain * sqrt(6 / (fan_in + fan_out))", "xavier_uniform_")
    return _uniform(p, -bound, bound, "xavier_uniform_")


def xavier_normal_(p, gain=1.0):
    """Glorot's normal: std gain * sqrt(2 / (fan_in + fan_out))."""
    gain = _number(gain, "gain", "xavier_normal_")
    fan_in, fan_out = _fans(_data(p, "xavier_normal_").shape, "xavier_normal_")
    return _normal(p, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), "xavier_normal_")


def _kaiming_std(p, a, mode, nonlinearity, where):
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"{where}: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _fans(_data(p, where).shape, where)
    gain = calculate_gain(nonlinearity, _number(a, "a", where))
    return gain / math.sqrt(fan_in if mode == "fan_in" else fan_out)


def kaiming_uniform_(p, a=0.0, mode="fan_in", nonlinearity="leaky_relu"):
    """He's uniform: bound sqrt(3) * gain / sqrt(fan) (gain sqrt(2) for relu and a=0)."""
    bound = math.sqrt(3.0) * _kaiming_std(p, a, mode, nonlinearity, "kaiming_uniform_")
    _fits(bound, p.dtype, "the bound sqrt(3) * gain / sqrt(fan)", "kaiming_uniform_")
    return _uniform(p, -bound, bound, "kaiming_uniform_")


def kaiming_normal_(p, a=0.0, mode="fan_in", nonlinearity="leaky_relu"):
    """He's normal: std gain / sqrt(fan)."""
    where = "kaiming_normal_"
    return _normal(p, 0.0, _kaiming_std(p, a, mode, nonlinearity, where), where)


def orthogonal_(p, gain=1.0):
    """A (semi-)orthogonal matrix from the QR decomposition of a normal one, the weight seen as
    (first axis, the rest flattened), times `gain`. Drawn and decomposed in float32 for float16
    weights and in float64 for longdouble ones (linalg takes only float32 and float64), then
    cast to the weight's dtype."""
    gain = _number(gain, "gain", "orthogonal_")
    data = _floating(p, "orthogonal_")
    _fits(gain, data.dtype, "gain", "orthogonal_")  # each entry is at most |gain|
    if data.ndim < 2:
        raise ValueError(f"orthogonal_: needs 2 or more axes, got shape {tuple(data.shape)}")
    xp, backend, device = p.xp, p.backend, p.device
    rows, cols = data.shape[0], math.prod(data.shape[1:])
    dtype = xp.float32 if xp.finfo(data.dtype).bits <= 32 else xp.float64  # what linalg takes
    with backend.device_context(device):
        flat = backend.random_normal((max(rows, cols), min(rows, cols)), dtype, device)
        if backend.lazy:  # Dask's qr (tsqr) takes the tall matrix in one column of chunks
            flat = backend.laid_out(flat, flat.rechunk({0: "auto", 1: -1}).chunks)
        q, r = xp.linalg.qr(flat)
        diagonal = getattr(xp.linalg, "diagonal", None) or xp.diagonal  # CuPy: no linalg.diagonal
        q = q * xp.sign(diagonal(r))  # a unique Q: the diagonal of R made positive
        if rows < cols:
            q = xp.matrix_transpose(q)
        return _fill(p, xp.reshape(q * gain, tuple(data.shape)))
