"""Convolution and pooling on (N, C, H, W) arrays: im2col/col2im, conv2d, deconv2d, pooling."""
import numbers

from ..config import is_grad_enabled
from ..function import Function
from .device import wide_sum
from .linalg import matmul
from .reduce import average, max, sum
from .shape import laid_out_like, reshape, transpose


# =============================================================================== helpers
def pair(x):
    """(x, x) for an integer (a Python or NumPy int, not a bool); a pair (tuple or list of two
    integers) as a tuple of Python ints."""
    if _integral(x):
        return (int(x), int(x))
    if isinstance(x, (tuple, list)) and len(x) == 2 and all(_integral(v) for v in x):
        return (int(x[0]), int(x[1]))
    raise ValueError(f"expected an int or a pair of ints, got {x!r}")


def _integral(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def get_conv_outsize(input_size, kernel_size, stride, pad):
    """Length of a convolution's output along one axis."""
    return (input_size + 2 * pad - kernel_size) // stride + 1


def get_deconv_outsize(size, k, s, p):
    """Length of a transposed convolution's output along one axis (the inverse of the above)."""
    return s * (size - 1) + k - 2 * p


def _params(op, kernel_size, stride, pad):
    """(kernel, stride, pad) as pairs, checked; ValueError naming `op` otherwise."""
    try:
        kernel, stride, pad = pair(kernel_size), pair(stride), pair(pad)
    except ValueError as e:
        raise ValueError(f"{op}: kernel_size, stride and pad must each be an int or a pair of "
                         f"ints: {e}") from None
    if min(kernel) < 1 or min(stride) < 1 or min(pad) < 0:
        raise ValueError(f"{op}: need kernel_size >= 1, stride >= 1 and pad >= 0, got "
                         f"kernel_size={kernel}, stride={stride}, pad={pad}")
    return kernel, stride, pad


def _check_image(name, shape):
    if len(shape) != 4:
        raise ValueError(f"{name} must be 4-D (N, C, H, W), got {len(shape)}-D shape "
                         f"{tuple(shape)}" + ("; add a batch axis with x[None] or reshape it"
                                              if name == "x" else ""))


def _outsize(shape, kernel, stride, pad):
    """(OH, OW) of a window walk over an image of `shape`; ValueError if the kernel does not fit."""
    _check_image("x", shape)
    H, W = shape[2:]
    if kernel[0] > H + 2 * pad[0] or kernel[1] > W + 2 * pad[1]:
        raise ValueError(f"the kernel {kernel} is larger than the padded input "
                         f"({H + 2 * pad[0]}, {W + 2 * pad[1]}); use a smaller kernel or more pad")
    return (get_conv_outsize(H, kernel[0], stride[0], pad[0]),
            get_conv_outsize(W, kernel[1], stride[1], pad[1]))


def _pad(backend, device, x, pad):
    """x (N, C, H, W) inside a border of `pad` (height, width) zeros, on `device` (where x
    lives); x itself when pad is 0."""
    (PH, PW), (N, C, H, W) = pad, x.shape
    if not (PH or PW):
        return x
    padded = backend.zeros((N, C, H + 2 * PH, W + 2 * PW), x.dtype, device)
    padded[:, :, PH:PH + H, PW:PW + W] = x
    return padded


def _offsets(kernel, stride, outsize):
    """One (i, j, index) per kernel offset, row-major: `index` picks, from a padded image, the
    pixel at offset (i, j) of every window, rows i, i + SH, ..., i + SH*(OH-1): a basic (strided)
    index, so reading it is a view and `+=` through it works in place on every backend."""
    (KH, KW), (SH, SW), (OH, OW) = kernel, stride, outsize
    return [(i, j, (slice(None), slice(None), slice(i, i + SH * (OH - 1) + 1, SH),
                    slice(j, j + SW * (OW - 1) + 1, SW)))
            for i in range(KH) for j in range(KW)]


def _offset_views(backend, device, x, kernel, stride, pad, outsize):
    """Per kernel offset, row-major, the view (N, C, OH, OW) of padded x that it sees."""
    x = _pad(backend, device, x, pad)
    return [x[index] for _, _, index in _offsets(kernel, stride, outsize)]


def _windows(backend, device, x, kernel, stride, pad):
    """The kernel windows of x (N, C, H, W) as an array (N, C, KH, KW, OH, OW)."""
    outsize = _outsize(x.shape, kernel, stride, pad)
    N, C = x.shape[:2]
    x = _pad(backend, device, x, pad)
    col = backend.empty((N, C) + kernel + outsize, x.dtype, device)  # each element set below
    for i, j, index in _offsets(kernel, stride, outsize):
        col[:, :, i, j, ...] = x[index]
    return col


def _overlap_add(backend, device, col, shape, kernel, stride, pad):
    """The adjoint of _windows: each window of col (N, C, KH, KW, OH, OW) added back into an
    image of `shape` (N, C, H, W); overlapping windows add up, the padding is cut away."""
    N, C, H, W = shape
    (PH, PW), outsize = pad, tuple(col.shape[4:])
    img = backend.zeros((N, C, H + 2 * PH, W + 2 * PW), col.dtype, device)
    for i, j, index in _offsets(kernel, stride, outsize):
        img[index] += col[:, :, i, j, ...]
    return img[:, :, PH:PH + H, PW:PW + W] if PH or PW else img


# =============================================================================== im2col / col2im
class Im2col(Function):
    """y = the kernel windows of x (N, C, H, W): (N*OH*OW, C*KH*KW) with to_matrix, else
    (N, C, KH, KW, OH, OW); gx = col2im(gy), overlapping windows adding up."""

    def __init__(self, kernel_size, stride, pad, to_matrix):
        self.kernel, self.stride, self.pad = kernel_size, stride, pad
        self.to_matrix = to_matrix

    def forward(self, x):
        col = _windows(self.backend, self.device, x, self.kernel, self.stride, self.pad)
        if self.to_matrix:
            N, C, KH, KW, OH, OW = col.shape
            col = self.xp.permute_dims(col, (0, 4, 5, 1, 2, 3))
            col = self.xp.reshape(col, (N * OH * OW, C * KH * KW))
        return col

    def backward(self, gy):
        x, = self.inputs
        return col2im(gy, x.shape, self.kernel, self.stride, self.pad, self.to_matrix)


def im2col(x, kernel_size, stride=1, pad=0, to_matrix=True):
    """The kernel windows of x (N, C, H, W): (N*OH*OW, C*KH*KW) with `to_matrix`, else
    (N, C, KH, KW, OH, OW). kernel_size, stride and pad are ints or (height, width) pairs."""
    return Im2col(*_params("im2col", kernel_size, stride, pad), to_matrix)(x)


class Col2im(Function):
    """y = windows `col` (laid out as Im2col's) summed back into an image (N, C, H, W),
    overlaps adding up; gx = im2col(gy)."""

    def __init__(self, input_shape, kernel_size, stride, pad, to_matrix):
        self.input_shape = input_shape
        self.kernel, self.stride, self.pad = kernel_size, stride, pad
        self.to_matrix = to_matrix

    def forward(self, col):
        N, C, H, W = self.input_shape
        (KH, KW), (OH, OW) = self.kernel, _outsize(self.input_shape, self.kernel, self.stride,
                                                    self.pad)
        expected = (N * OH * OW, C * KH * KW) if self.to_matrix else (N, C, KH, KW, OH, OW)
        if tuple(col.shape) != expected:
            raise ValueError(f"col has shape {tuple(col.shape)} but an image of shape "
                             f"{self.input_shape} with these kernel, stride and pad needs "
                             f"{expected}")
        if self.to_matrix:
            col = self.xp.reshape(col, (N, OH, OW, C, KH, KW))
            col = self.xp.permute_dims(col, (0, 3, 4, 5, 1, 2))
        return _overlap_add(self.backend, self.device, col, self.input_shape, self.kernel,
                            self.stride, self.pad)

    def backward(self, gy):
        return im2col(gy, self.kernel, self.stride, self.pad, self.to_matrix)


def col2im(x, input_shape, kernel_size, stride=1, pad=0, to_matrix=True):
    """The adjoint of im2col: windows (as im2col lays them out) summed back into an image of
    `input_shape` (N, C, H, W); where windows overlap their values add up."""
    input_shape = tuple(input_shape)
    _check_image("col2im: input_shape", input_shape)
    return Col2im(input_shape, *_params("col2im", kernel_size, stride, pad), to_matrix)(x)


# =============================================================================== convolution
def _check_conv(x, W, b, x_channels, w_channels, what):
    """Shape checks shared by conv2d and deconv2d (x already checked to be 4-D)."""
    if W.ndim != 4:
        raise ValueError(f"W must be 4-D {what}, got shape {tuple(W.shape)}")
    if x.shape[1] != W.shape[x_channels]:
        raise ValueError(f"x has {x.shape[1]} channels but W {tuple(W.shape)} expects "
                         f"{W.shape[x_channels]} (axis {x_channels} of W)")
    if b is not None and tuple(b.shape) != (W.shape[w_channels],):
        raise ValueError(f"b must have shape ({W.shape[w_channels]},), one value per output "
                         f"channel, got {tuple(b.shape)}")


class Conv2d(Function):
    """y = cross-correlation of x (N, C, H, W) with W (OC, C, KH, KW), plus b (OC,):
    (N, OC, OH, OW); gx = deconv2d(gy, W), gW from x's windows kept by forward."""

    def __init__(self, stride, pad):
        self.stride, self.pad = stride, pad

    def forward(self, x, W, b=None):
        _check_image("x", x.shape)
        _check_conv(x, W, b, 1, 0, "(OC, C, KH, KW)")
        xp = self.xp
        N, (OC, C, KH, KW) = x.shape[0], W.shape
        # (N, C, KH, KW, OH, OW)
        col = _windows(self.backend, self.device, x, (KH, KW), self.stride, self.pad)
        OH, OW = col.shape[4:]
        # (OC, C*KH*KW) @ (N, C*KH*KW, OH*OW): both reshapes are free, the result is NCHW as is
        K = C * KH * KW
        col = xp.reshape(col, (N, K, OH * OW))
        y = xp.matmul(xp.reshape(W, (OC, K)), col)
        if b is not None and b.dtype == y.dtype:
            y += xp.reshape(b, (OC, 1))  # y is new: adding in place saves a copy
        elif b is not None:
            y = y + xp.reshape(b, (OC, 1))
        self.col = col  # W's gradient needs these windows again: kept (KH*KW times x's size)
        return xp.reshape(y, (N, OC, OH, OW))

    def backward(self, gy):
        x, W = self.inputs[:2]
        needs = self.needs_input_grad
        gx = gW = gb = None
        # Dask: each in its input's chunks (the reshapes and sums make others), so that an
        # optimizer step leaves a parameter in the chunks it had, as matmul's
        if needs[0]:
            gx = laid_out_like(deconv2d(gy, W, None, self.stride, self.pad, outsize=x.shape[2:]),
                               x)
        if needs[1]:
            gW = laid_out_like(Conv2dGradW(W.shape[2:], self.stride, self.pad, self.col)(x, gy), W)
        self.col = None  # used once: a second backward (retained graph) rebuilds them
        if len(needs) == 3 and needs[2]:
            gb = laid_out_like(sum(gy, axis=(0, 2, 3)), self.inputs[2])
        return (gx, gW, gb)[:len(needs)]


def conv2d(x, W, b=None, stride=1, pad=0):
    """2-D convolution (cross-correlation): x (N, C, H, W), W (OC, C, KH, KW), b (OC,) or None
    -> (N, OC, OH, OW). stride and pad are ints or (height, width) pairs."""
    _, stride, pad = _params("conv2d", 1, stride, pad)
    f = Conv2d(stride, pad)
    return f(x, W) if b is None else f(x, W, b)


class Conv2dGradW(Function):
    """The gradient of conv2d with respect to W, as a function of (x, gy): twice differentiable."""

    def __init__(self, kernel, stride, pad, col=None):
        self.kernel, self.stride, self.pad = tuple(kernel), stride, pad
        self.col = col  # x's windows (N, C*KH*KW, OH*OW) when the caller has them

    def forward(self, x, gy):
        xp = self.xp
        N, C, OC = x.shape[0], x.shape[1], gy.shape[1]
        P = gy.shape[2] * gy.shape[3]
        col, self.col = self.col, None
        if col is None:
            # (N, C, KH, KW, OH, OW)
            col = _windows(self.backend, self.device, x, self.kernel, self.stride, self.pad)
        col = xp.reshape(col, (N, C * self.kernel[0] * self.kernel[1], P))
        # sum over n of gy[n] (OC, P) @ col[n].T (P, C*KH*KW)
        per_sample = xp.matmul(xp.reshape(gy, (N, OC, P)), xp.permute_dims(col, (0, 2, 1)))
        gW = wide_sum(xp, per_sample, 0)  # float16: summed over the batch in float32, as Sum
        return xp.reshape(gW, (OC, C) + self.kernel)

    def backward(self, ggW):
        x, gy = self.inputs
        gx = deconv2d(gy, ggW, None, self.stride, self.pad, outsize=x.shape[2:])
        ggy = conv2d(x, ggW, None, self.stride, self.pad)
        return gx, ggy


class Deconv2d(Function):
    """y = transposed convolution of x (N, C, H, W) with W (C, OC, KH, KW), plus b (OC,):
    (N, OC, OH, OW), the adjoint of conv2d; gx = conv2d(gy, W)."""

    def __init__(self, stride, pad, outsize):
        self.stride, self.pad, self.outsize = stride, pad, outsize

    def forward(self, x, W, b=None):
        _check_image("x", x.shape)
        _check_conv(x, W, b, 0, 1, "(C, OC, KH, KW)")
        N, _, H, Wx = x.shape
        C, OC, KH, KW = W.shape
        (SH, SW), (PH, PW) = self.stride, self.pad
        if self.outsize is None:
            out = (get_deconv_outsize(H, KH, SH, PH), get_deconv_outsize(Wx, KW, SW, PW))
        else:
            out = self.outsize
        try:
            back = _outsize((N, OC) + out, (KH, KW), self.stride, self.pad)  # conv2d(y)'s size
        except ValueError:  # the kernel does not fit in out: conv2d takes no y of that size
            back = None
        if out[0] < 1 or out[1] < 1 or back != (H, Wx):
            fix = ("pass outsize=None or a size that does" if self.outsize is not None else
                   "use a smaller pad")
            raise ValueError(f"an output of size {out} does not give back the input size "
                             f"{(H, Wx)} under conv2d with kernel {(KH, KW)}, stride "
                             f"{self.stride}, pad {self.pad}; {fix}")
        xp = self.xp
        # (OC*KH*KW, C) @ (N, C, H*W): the windows' values, laid out as _windows gives them
        gcol = xp.matmul(xp.permute_dims(xp.reshape(W, (C, OC * KH * KW)), (1, 0)),
                         xp.reshape(x, (N, C, H * Wx)))
        gcol = xp.reshape(gcol, (N, OC, KH, KW, H, Wx))
        y = _overlap_add(self.backend, self.device, gcol, (N, OC) + out, (KH, KW), self.stride,
                         self.pad)
        if b is not None:
            y = y + xp.reshape(b, (1, OC, 1, 1))
        return y

    def backward(self, gy):
        x, W = self.inputs[:2]
        needs = self.needs_input_grad
        gx = gW = gb = None
        # Dask: each in its input's chunks, as conv2d's
        if needs[0]:
            gx = laid_out_like(conv2d(gy, W, None, self.stride, self.pad), x)
        if needs[1]:
            gW = laid_out_like(Conv2dGradW(W.shape[2:], self.stride, self.pad)(gy, x), W)
        if len(needs) == 3 and needs[2]:
            gb = laid_out_like(sum(gy, axis=(0, 2, 3)), self.inputs[2])
        return (gx, gW, gb)[:len(needs)]


def deconv2d(x, W, b=None, stride=1, pad=0, outsize=None):
    """Transposed convolution (the gradient of conv2d with respect to its input): x (N, C, H, W),
    W (C, OC, KH, KW), b (OC,) or None -> (N, OC, OH, OW). `outsize` (OH, OW) picks the size when
    stride > 1 leaves a choice; by default stride * (H - 1) + KH - 2 * pad."""
    _, stride, pad = _params("deconv2d", 1, stride, pad)
    if outsize is not None:
        try:
            outsize = pair(outsize)
        except ValueError:
            raise ValueError(f"deconv2d: outsize must be None, an int or a pair of ints, "
                             f"got {outsize!r}") from None
    f = Deconv2d(stride, pad, outsize)
    return f(x, W) if b is None else f(x, W, b)


def conv2d_simple(x, W, b=None, stride=1, pad=0):
    """conv2d written as im2col + matmul (the test oracle for the fused conv2d)."""
    N, _, H, Wx = x.shape
    OC, C, KH, KW = W.shape
    (SH, SW), (PH, PW) = pair(stride), pair(pad)
    OH, OW = get_conv_outsize(H, KH, SH, PH), get_conv_outsize(Wx, KW, SW, PW)
    col = im2col(x, (KH, KW), stride, pad, to_matrix=True)   # (N*OH*OW, C*KH*KW)
    y = matmul(col, transpose(reshape(W, (OC, C * KH * KW))))
    if b is not None:
        y = y + b
    return transpose(reshape(y, (N, OH, OW, OC)), (0, 3, 1, 2))


# =============================================================================== pooling
class Pooling(Function):
    """y = the max of each window of x (N, C, H, W): (N, C, OH, OW), padding as zeros;
    gy goes to each window's first maximum only (none where that is NaN)."""

    def __init__(self, kernel, stride, pad):
        self.kernel, self.stride, self.pad = kernel, stride, pad

    def forward(self, x):
        xp = self.xp
        outsize = _outsize(x.shape, self.kernel, self.stride, self.pad)
        # a running maximum over the kernel offsets, each a strided view: no copy of the windows
        views = _offset_views(self.backend, self.device, x, self.kernel, self.stride, self.pad,
                              outsize)
        y = xp.maximum(views[0], views[min(1, len(views) - 1)])  # new even for a 1x1 kernel
        for view in views[2:]:
            y = xp.maximum(y, view)
        # where backward will send the gradient: found now, while x is still in the CPU's cache
        # (not under no_grad(), which needs no backward)
        self.masks = _first_maximum(xp, views, y) if is_grad_enabled() else None
        return y

    def backward(self, gy):
        x, = self.inputs
        masks = [self.backend.as_factor(mask, gy.dtype) for mask in self.masks]
        return PoolingGrad(x.shape, self.kernel, self.stride, self.pad, masks)(gy)


def pooling(x, kernel_size, stride=1, pad=0):
    """Max pooling: the largest value of each window of x (N, C, H, W) -> (N, C, OH, OW).
    Padding counts as zeros (DeZero's convention)."""
    return Pooling(*_params("pooling", kernel_size, stride, pad))(x)


def _first_maximum(xp, views, y):
    """Per view (one per kernel offset), a boolean array like y: True where that offset holds
    the first maximum y of its window (the one argmax picks). A window whose maximum is NaN has
    no True: it passes no gradient (telling NaNs apart would double the cost)."""
    masks, taken = [], None
    for n, view in enumerate(views, 1):
        hit = view == y
        if taken is None:
            mask = taken = hit
        else:
            mask = xp.logical_and(hit, xp.logical_not(taken))
            if n < len(views):
                taken = xp.logical_or(taken, mask)
        masks.append(mask)
    return masks


class PoolingGrad(Function):
    """Max pooling's backward, gy (N, C, OH, OW) -> gx (N, C, H, W): each gy value goes to the
    pixel of its window that `masks` (one 0/1 array per kernel offset) marks; linear in gy."""

    def __init__(self, input_shape, kernel, stride, pad, masks):
        self.input_shape, self.kernel, self.stride, self.pad = input_shape, kernel, stride, pad
        self.masks = masks

    def forward(self, gy):
        N, C, H, W = self.input_shape
        (KH, KW), (SH, SW), (PH, PW) = self.kernel, self.stride, self.pad
        overlap = SH < KH or SW < KW  # else each pixel is in one window at most: assign
        # windows that tile the padded image set every pixel of gx: no zeros to write first
        tiled = (SH, SW) == (KH, KW) and (KH * gy.shape[2], KW * gy.shape[3]) == (
            H + 2 * PH, W + 2 * PW)
        make = self.backend.empty if tiled else self.backend.zeros
        gx = make((N, C, H + 2 * PH, W + 2 * PW), gy.dtype, self.device)
        for (_, _, index), mask in zip(_offsets(self.kernel, self.stride, gy.shape[2:]),
                                       self.masks):
            if overlap:
                gx[index] += gy * mask
            else:
                gx[index] = gy * mask
        return gx[:, :, PH:PH + H, PW:PW + W] if PH or PW else gx

    def backward(self, ggx):
        return PoolingSelect(self.kernel, self.stride, self.pad, self.masks)(ggx)


class PoolingSelect(Function):
    """x (N, C, H, W) -> (N, C, OH, OW): the pixel of each window that `masks` marks (max
    pooling with the choice of pixels fixed); the adjoint of PoolingGrad."""

    def __init__(self, kernel, stride, pad, masks):
        self.kernel, self.stride, self.pad, self.masks = kernel, stride, pad, masks

    def forward(self, x):
        y = None
        views = _offset_views(self.backend, self.device, x, self.kernel, self.stride, self.pad,
                              tuple(self.masks[0].shape[2:]))
        for view, mask in zip(views, self.masks):
            y = view * mask if y is None else y + view * mask
        return y

    def backward(self, gy):
        x, = self.inputs
        return PoolingGrad(x.shape, self.kernel, self.stride, self.pad, self.masks)(gy)


def pooling_simple(x, kernel_size, stride=1, pad=0):
    """Max pooling written as im2col + max (the test oracle for the fused pooling); tied maxima
    share the gradient here, where pooling gives it to the first."""
    kernel, stride, pad = _params("pooling_simple", kernel_size, stride, pad)
    N, C, H, W = x.shape
    OH, OW = _outsize(x.shape, kernel, stride, pad)
    col = im2col(x, kernel, stride, pad, to_matrix=True)   # (N*OH*OW, C*KH*KW)
    y = max(reshape(col, (N * OH * OW * C, kernel[0] * kernel[1])), axis=1)
    return transpose(reshape(y, (N, OH, OW, C)), (0, 3, 1, 2))


def average_pooling(x, kernel_size, stride=1, pad=0):
    """Average pooling: the mean of each window of x (N, C, H, W) -> (N, C, OH, OW); padded
    zeros count in the mean."""
    kernel, stride, pad = _params("average_pooling", kernel_size, stride, pad)
    col = im2col(x, kernel, stride, pad, to_matrix=False)   # (N, C, KH, KW, OH, OW)
    return average(col, axis=(2, 3))  # for float16 it sums in float32: 4 x 30,000 > 65,504
