"""conv: one SGD step of a small CNN on a batch of 32 RGB 32x32 images, float32.

conv 3x3 (3 -> 16, pad 1), relu, 2x2 max pooling, conv 3x3 (16 -> 32, pad 1), relu, 2x2 max
pooling, linear (2048 -> 10), softmax cross entropy; backward; `p -= 0.01 * grad` in place.
The floor writes convolution as its windows (im2col) times the filters, one matrix product per
image; max pooling as the maximum of the four strided views of the 2x2 windows.
"""
import numpy

import gradcore.functions as F

from .common import Workload
from .mlp import softmax_cross_entropy_floor
from .training import LR, REPLAY_TARGETS, STEP, step_memory, training_workload

BATCH = 32
CHANNELS = (3, 16, 32)
SIZE = 32      # input height and width
KERNEL = 3
PAD = 1
POOL = 2
CLASSES = 10
SEED = 0
FLAT = CHANNELS[-1] * (SIZE // POOL ** 2) ** 2
PARAMETERS = (sum(c_out * c_in * KERNEL * KERNEL + c_out
                  for c_in, c_out in zip(CHANNELS[:-1], CHANNELS[1:])) + FLAT * CLASSES + CLASSES)


def init():
    """He-initialised float32 filters (out, in, kh, kw), a LeCun-scaled classifier, small random
    biases, a batch of random images and labels: with these, lr 0.01 brings the loss down."""
    rng = numpy.random.default_rng(SEED)
    params = {}
    for i, (c_in, c_out) in enumerate(zip(CHANNELS[:-1], CHANNELS[1:]), 1):
        fan_in = c_in * KERNEL * KERNEL
        params[f"W{i}"] = (rng.standard_normal((c_out, c_in, KERNEL, KERNEL))
                           * (2.0 / fan_in) ** 0.5).astype(numpy.float32)
        params[f"b{i}"] = (0.01 * rng.standard_normal(c_out)).astype(numpy.float32)
    params["W3"] = (rng.standard_normal((FLAT, CLASSES))
                    * (1.0 / FLAT) ** 0.5).astype(numpy.float32)
    params["b3"] = (0.01 * rng.standard_normal(CLASSES)).astype(numpy.float32)
    x = rng.random((BATCH, CHANNELS[0], SIZE, SIZE)).astype(numpy.float32)  # pixels in [0, 1)
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
def windows(xp, x, k, pad):
    """(N, C, H, W) -> (N, C*k*k, OH*OW): every k x k window (stride 1), one matrix per image."""
    n, c, h, w = x.shape
    oh, ow = h + 2 * pad - k + 1, w + 2 * pad - k + 1
    padded = xp.zeros((n, c, h + 2 * pad, w + 2 * pad), dtype=x.dtype)
    padded[:, :, pad:pad + h, pad:pad + w] = x
    col = xp.empty((n, c, k, k, oh, ow), dtype=x.dtype)
    for i in range(k):
        for j in range(k):
            col[:, :, i, j] = padded[:, :, i:i + oh, j:j + ow]
    return col.reshape(n, c * k * k, oh * ow)


def overlap_add(xp, gcol, shape, k, pad):
    """The adjoint of `windows`: (N, C*k*k, OH*OW) summed back into an (N, C, H, W) image."""
    n, c, h, w = shape
    oh, ow = h + 2 * pad - k + 1, w + 2 * pad - k + 1
    gcol = gcol.reshape(n, c, k, k, oh, ow)
    padded = xp.zeros((n, c, h + 2 * pad, w + 2 * pad), dtype=gcol.dtype)
    for i in range(k):
        for j in range(k):
            padded[:, :, i:i + oh, j:j + ow] += gcol[:, :, i, j]
    return padded[:, :, pad:pad + h, pad:pad + w]


def conv_forward(xp, x, W, b):
    """(OC, C*k*k) @ (N, C*k*k, OH*OW): the product is (N, OC, OH*OW), already NCHW."""
    n, _, h, w = x.shape
    col = windows(xp, x, KERNEL, PAD)
    y = xp.matmul(W.reshape(W.shape[0], -1), col) + b[:, None]
    return y.reshape(n, W.shape[0], h + 2 * PAD - KERNEL + 1, w + 2 * PAD - KERNEL + 1), col


def conv_backward(xp, gy, x_shape, W, col, need_gx):
    n, oc = gy.shape[:2]
    gy = gy.reshape(n, oc, -1)                                   # (N, OC, OH*OW)
    gW = xp.sum(xp.matmul(gy, col.transpose(0, 2, 1)), axis=0).reshape(W.shape)
    gb = xp.sum(gy, axis=(0, 2))
    gx = None
    if need_gx:
        gx = overlap_add(xp, xp.matmul(W.reshape(oc, -1).T, gy), x_shape, KERNEL, PAD)
    return gx, gW, gb


CORNERS = ((0, 0), (0, 1), (1, 0), (1, 1))  # a 2x2 window's positions, in row-major order


def pool_forward(xp, x):
    """2x2 max pooling, stride 2, as the maximum of four strided views; returns the output and,
    per window position, a mask of where it holds the maximum (the first one on ties, as argmax
    picks it)."""
    parts = [x[:, :, i::2, j::2] for i, j in CORNERS]
    y = xp.maximum(xp.maximum(parts[0], parts[1]), xp.maximum(parts[2], parts[3]))
    masks = [parts[0] == y]
    taken = masks[0].copy()
    for part in parts[1:]:
        mask = part == y
        mask &= ~taken
        taken |= mask
        masks.append(mask)
    return y, masks


def pool_backward(xp, gy, masks, shape):
    gx = xp.empty(shape, dtype=gy.dtype)
    for (i, j), mask in zip(CORNERS, masks):
        xp.multiply(gy, mask, out=gx[:, :, i::2, j::2])
    return gx


def floor_grads(xp, params, x, t):
    """The same step by hand: forward keeping what backward needs, then backward."""
    saved = []
    h = x
    for i in (1, 2):
        x_shape = h.shape
        a, col = conv_forward(xp, h, params[f"W{i}"], params[f"b{i}"])
        relu = xp.maximum(a, 0)
        h, masks = pool_forward(xp, relu)
        saved.append((x_shape, col, a > 0, masks, relu.shape))
    pooled_shape = h.shape
    flat = h.reshape(h.shape[0], -1)
    y = flat @ params["W3"] + params["b3"]
    loss, gy = softmax_cross_entropy_floor(xp, y, t)

    grads = {"W3": flat.T @ gy, "b3": xp.sum(gy, axis=0)}
    g = (gy @ params["W3"].T).reshape(pooled_shape)
    for i in (2, 1):
        x_shape, col, positive, masks, shape = saved[i - 1]
        g = pool_backward(xp, g, masks, shape)
        g *= positive
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


make_gradcore, make_floor, make_torch, make_replay, verify, verify_steps = training_workload(
    init, gradcore_loss, floor_grads, torch_loss)

WORKLOAD = Workload(
    name="conv",
    summary=(f"one SGD step (lr {LR}) of conv{KERNEL}x{KERNEL}({CHANNELS[0]}->{CHANNELS[1]})-"
             f"relu-maxpool-conv({CHANNELS[1]}->{CHANNELS[2]})-relu-maxpool-linear({FLAT}->"
             f"{CLASSES}) on {BATCH}x{CHANNELS[0]}x{SIZE}x{SIZE}, float32"),
    **STEP,
    gradcore=make_gradcore,
    replay=make_replay,
    floor=make_floor,
    floor_label=("the same step by hand in float32: convolution as windows (im2col) times "
                 "filters, max pooling as the maximum of four strided views, backward written "
                 "out (no gradient for the input), in-place update"),
    torch=make_torch,
    verify=verify,
    verify_steps=verify_steps,
    memory=step_memory("conv", PARAMETERS),
    targets=REPLAY_TARGETS,
)
