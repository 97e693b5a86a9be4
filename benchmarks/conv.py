"""conv: one SGD step of a small CNN on a batch of 32 RGB 32x32 images, float32.

conv 3x3 (3 -> 16, pad 1), relu, 2x2 max pooling, conv 3x3 (16 -> 32, pad 1), relu, 2x2 max
pooling, linear (2048 -> 10), softmax cross entropy; backward; `p -= 0.01 * grad` in place.
The floor writes convolution as im2col + one matrix product, as gradcore and DeZero do.
"""
import numpy

import gradcore.functions as F

from .common import Workload
from .mlp import softmax_cross_entropy_floor
from .training import LR, training_workload

BATCH = 32
CHANNELS = (3, 16, 32)
SIZE = 32      # input height and width
KERNEL = 3
PAD = 1
POOL = 2
CLASSES = 10
SEED = 0
FLAT = CHANNELS[-1] * (SIZE // POOL ** 2) ** 2


def init():
    """He-initialised float32 filters (out, in, kh, kw) and weights, small random biases, a batch."""
    rng = numpy.random.default_rng(SEED)
    params = {}
    for i, (c_in, c_out) in enumerate(zip(CHANNELS[:-1], CHANNELS[1:]), 1):
        fan_in = c_in * KERNEL * KERNEL
        params[f"W{i}"] = (rng.standard_normal((c_out, c_in, KERNEL, KERNEL))
                           * (2.0 / fan_in) ** 0.5).astype(numpy.float32)
        params[f"b{i}"] = (0.01 * rng.standard_normal(c_out)).astype(numpy.float32)
    params["W3"] = (rng.standard_normal((FLAT, CLASSES)) * (2.0 / FLAT) ** 0.5).astype(numpy.float32)
    params["b3"] = (0.01 * rng.standard_normal(CLASSES)).astype(numpy.float32)
    x = rng.standard_normal((BATCH, CHANNELS[0], SIZE, SIZE)).astype(numpy.float32)
    t = rng.integers(0, CLASSES, BATCH)
    return params, x, t


# ================================================================================ gradcore
def gradcore_loss(params, x, t):
    """gradcore, written as a DeZero user would: F.conv2d, F.relu, F.pooling, F.linear."""
    h = x
    for i in (1, 2):
        h = F.relu(F.conv2d(h, params[f"W{i}"], params[f"b{i}"], stride=1, pad=PAD))
        h = F.pooling(h, POOL, stride=POOL)
    h = F.reshape(h, (h.shape[0], -1))
    return F.softmax_cross_entropy(F.linear(h, params["W3"], params["b3"]), t)


# ================================================================================ the floor
def im2col(xp, x, k, pad):
    """(N, C, H, W) -> (N * OH * OW, C * k * k) patches, stride 1."""
    n, c, h, w = x.shape
    padded = xp.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - k + 1, w + 2 * pad - k + 1
    col = xp.empty((n, oh, ow, c, k, k), dtype=x.dtype)
    for i in range(k):
        for j in range(k):
            col[:, :, :, :, i, j] = padded[:, :, i:i + oh, j:j + ow].transpose(0, 2, 3, 1)
    return col.reshape(n * oh * ow, c * k * k), (oh, ow)


def col2im(xp, gcol, shape, k, pad, out):
    """The adjoint of im2col: patches' gradients summed back into an (N, C, H, W) array."""
    n, c, h, w = shape
    oh, ow = out
    gcol = gcol.reshape(n, oh, ow, c, k, k)
    padded = xp.zeros((n, c, h + 2 * pad, w + 2 * pad), dtype=gcol.dtype)
    for i in range(k):
        for j in range(k):
            padded[:, :, i:i + oh, j:j + ow] += gcol[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    return padded[:, :, pad:pad + h, pad:pad + w]


def conv_forward(xp, x, W, b):
    n = x.shape[0]
    col, (oh, ow) = im2col(xp, x, KERNEL, PAD)
    y = col @ W.reshape(W.shape[0], -1).T + b  # (N * OH * OW, OC)
    return y.reshape(n, oh, ow, -1).transpose(0, 3, 1, 2), col


def conv_backward(xp, gy, x_shape, W, col, need_gx):
    gy = gy.transpose(0, 2, 3, 1).reshape(-1, W.shape[0])  # (N * OH * OW, OC)
    gW = (gy.T @ col).reshape(W.shape)
    gb = xp.sum(gy, axis=0)
    gx = None
    if need_gx:
        gx = col2im(xp, gy @ W.reshape(W.shape[0], -1), x_shape, KERNEL, PAD, x_shape[2:])
    return gx, gW, gb


def pool_forward(xp, x):
    """2x2 max pooling, stride 2; returns the output and the one-hot position of each max."""
    n, c, h, w = x.shape
    windows = x.reshape(n, c, h // 2, 2, w // 2, 2).transpose(0, 1, 2, 4, 3, 5)
    windows = windows.reshape(n, c, h // 2, w // 2, 4)
    where = xp.argmax(windows, axis=-1)
    onehot = xp.arange(4) == where[..., None]
    return xp.max(windows, axis=-1), onehot


def pool_backward(gy, onehot):
    n, c, oh, ow, _ = onehot.shape
    g = (onehot * gy[..., None]).reshape(n, c, oh, ow, 2, 2).transpose(0, 1, 2, 4, 3, 5)
    return g.reshape(n, c, oh * 2, ow * 2)


def floor_grads(xp, params, x, t):
    """The same step by hand: forward keeping what backward needs, then backward."""
    saved = []
    h = x
    for i in (1, 2):
        x_shape = h.shape
        a, col = conv_forward(xp, h, params[f"W{i}"], params[f"b{i}"])
        h, onehot = pool_forward(xp, xp.maximum(a, 0))
        saved.append((x_shape, col, a > 0, onehot))
    pooled_shape = h.shape
    flat = h.reshape(h.shape[0], -1)
    y = flat @ params["W3"] + params["b3"]
    loss, gy = softmax_cross_entropy_floor(xp, y, t)

    grads = {"W3": flat.T @ gy, "b3": xp.sum(gy, axis=0)}
    g = (gy @ params["W3"].T).reshape(pooled_shape)
    for i in (2, 1):
        x_shape, col, mask, onehot = saved[i - 1]
        g = pool_backward(g, onehot)
        g *= mask
        # the image (conv 1's input) needs no gradient
        g, grads[f"W{i}"], grads[f"b{i}"] = conv_backward(
            xp, g, x_shape, params[f"W{i}"], col, need_gx=i > 1)
    return loss, {k: grads[k] for k in ("W1", "b1", "W2", "b2", "W3", "b3")}


# ================================================================================ PyTorch
def torch_loss(torch, params, x, t):
    nnf = torch.nn.functional
    h = x
    for i in (1, 2):
        h = nnf.max_pool2d(torch.relu(nnf.conv2d(h, params[f"W{i}"], params[f"b{i}"], padding=PAD)),
                           POOL)
    h = h.reshape(h.shape[0], -1)
    return nnf.cross_entropy(h @ params["W3"] + params["b3"], t)


make_gradcore, make_floor, make_torch, verify = training_workload(
    init, gradcore_loss, floor_grads, torch_loss)

WORKLOAD = Workload(
    name="conv",
    summary=(f"one SGD step (lr {LR}) of conv{KERNEL}x{KERNEL}({CHANNELS[0]}->{CHANNELS[1]})-"
             f"relu-maxpool-conv({CHANNELS[1]}->{CHANNELS[2]})-relu-maxpool-linear({FLAT}->"
             f"{CLASSES}) on {BATCH}x{CHANNELS[0]}x{SIZE}x{SIZE}, float32"),
    count=1,
    unit="step",
    convention="one step = clear gradients, forward, backward, update every parameter",
    gradcore=make_gradcore,
    floor=make_floor,
    floor_label=("the same step by hand in float32: im2col convolution, max pooling by "
                 "reshape, backward written out (no gradient for the input), in-place update"),
    torch=make_torch,
    torch_threads=None,
    verify=verify,
    time_unit="ms",
)
