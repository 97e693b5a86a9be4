"""mlp: one SGD step of a 784-1000-1000-10 ReLU network on a batch of 128, float32.
GRADCORE_BENCH_MLP_BATCH sets the batch (4096 fills a GPU: `GRADCORE_BENCH_MLP_BATCH=4096
python -m benchmarks --device cuda --only mlp`).

Forward (linear, relu, linear, relu, linear, softmax cross entropy), backward, and the update
`p -= 0.01 * grad` in place. Large matrices: the BLAS decides, so gradcore should sit close to
the floor; what is left over is the engine's bookkeeping and any extra copy.
"""
import os

import numpy

import gradcore.functions as F

from .common import Workload, ratio_target, whole_number_from
from .training import LR, REPLAY_TARGETS, STEP, step_memory, training_workload

SIZES = (784, 1000, 1000, 10)
BATCH = whole_number_from(os.environ, "GRADCORE_BENCH_MLP_BATCH", 128, minimum=1,
                          example=4096)
SEED = 0
LAYERS = len(SIZES) - 1
PARAMETERS = sum(fan_in * fan_out + fan_out for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]))


def init():
    """He-initialised float32 weights (in, out), small random biases, a batch and its labels."""
    rng = numpy.random.default_rng(SEED)
    params = {}
    for i, (fan_in, fan_out) in enumerate(zip(SIZES[:-1], SIZES[1:]), 1):
        params[f"W{i}"] = (rng.standard_normal((fan_in, fan_out))
                           * (2.0 / fan_in) ** 0.5).astype(numpy.float32)
        params[f"b{i}"] = (0.01 * rng.standard_normal(fan_out)).astype(numpy.float32)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(numpy.float32)
    t = rng.integers(0, SIZES[-1], BATCH)
    return params, x, t


# ================================================================================ the workload
def gradcore_loss(params, x, t):
    """gradcore, written as a DeZero user would: F.linear, F.relu, F.softmax_cross_entropy."""
    h = x
    for i in range(1, LAYERS):
        h = F.relu(F.linear(h, params[f"W{i}"], params[f"b{i}"]))
    y = F.linear(h, params[f"W{LAYERS}"], params[f"b{LAYERS}"])
    return F.softmax_cross_entropy(y, t)


def softmax_cross_entropy_floor(xp, y, t):
    """Mean cross entropy of softmax(y) against labels t, and its gradient with respect to y."""
    n = y.shape[0]
    rows = xp.arange(n)
    z = y - xp.max(y, axis=1, keepdims=True)
    e = xp.exp(z)
    s = xp.sum(e, axis=1, keepdims=True)
    loss = -xp.mean(z[rows, t] - xp.log(s[:, 0]))
    gy = e / s
    gy[rows, t] -= 1
    gy /= n
    return loss, gy


def floor_grads(xp, params, x, t):
    """The same step by hand: forward keeping what backward needs, then backward."""
    hs, masks = [x], []
    h = x
    for i in range(1, LAYERS):
        a = h @ params[f"W{i}"] + params[f"b{i}"]
        masks.append(a > 0)
        h = xp.maximum(a, 0)
        hs.append(h)
    y = h @ params[f"W{LAYERS}"] + params[f"b{LAYERS}"]
    loss, gy = softmax_cross_entropy_floor(xp, y, t)
    grads = {}
    for i in range(LAYERS, 0, -1):
        grads[f"W{i}"] = hs[i - 1].T @ gy
        grads[f"b{i}"] = xp.sum(gy, axis=0)
        if i > 1:  # the input needs no gradient
            gy = gy @ params[f"W{i}"].T
            gy *= masks[i - 2]
    return loss, grads


def torch_loss(torch, params, x, t):
    h = x
    for i in range(1, LAYERS):
        h = torch.relu(h @ params[f"W{i}"] + params[f"b{i}"])
    y = h @ params[f"W{LAYERS}"] + params[f"b{LAYERS}"]
    return torch.nn.functional.cross_entropy(y, t)


make_gradcore, make_floor, make_torch, make_replay, verify, verify_steps = training_workload(
    init, gradcore_loss, floor_grads, torch_loss)

WORKLOAD = Workload(
    name="mlp",
    summary=(f"one SGD step (lr {LR}) of a {'-'.join(map(str, SIZES))} relu MLP, batch {BATCH}, "
             "float32: forward, softmax cross entropy, backward, in-place update"),
    **STEP,
    gradcore=make_gradcore,
    replay=make_replay,
    floor=make_floor,
    floor_label=("the same step by hand in float32: forward, backward written out (no gradient "
                 "for the input), in-place update"),
    torch=make_torch,
    verify=verify,
    verify_steps=verify_steps,
    memory=step_memory("mlp", PARAMETERS),
    targets=(ratio_target("<= 1.15x the floor (NumPy on a CPU)", "gradcore/floor", 1.15,
                          device_type="cpu"),
             *REPLAY_TARGETS),
)
