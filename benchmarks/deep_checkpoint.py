"""deep_checkpoint: deep's 100 nested `sin` with gradcore.checkpoint every 10 layers.

The same computation and check as `deep`; the blocks' intermediate arrays are dropped after the
forward and computed again in backward, so about 10 block inputs are held instead of 100
arrays, for one more forward's worth of time. The floor is deep's (it keeps every layer's input,
as eager autodiff does: deep shows gradcore within 2% of it), so the ratios to it read as
"against no checkpoints". PyTorch does the same with torch.utils.checkpoint.
"""
import dataclasses

import gradcore
import gradcore.functions as F

from . import deep
from .common import Workload, one_input, ratio_target
from .deep import DEPTH, SIZE, _x, deep_floor, verify

EVERY = 10  # layers per checkpointed block


def _block(h):
    for _ in range(EVERY):
        h = F.sin(h)
    return h


def checkpointed_gradcore(x0):
    """gradcore: DEPTH sin in blocks of EVERY, each block a gradcore.checkpoint; x's grad."""
    x = gradcore.Variable(x0)
    y = x
    for _ in range(DEPTH // EVERY):
        y = gradcore.checkpoint(_block, y)
    y.backward()
    return x.grad.data


def checkpointed_torch(torch, x0):
    from torch.utils.checkpoint import checkpoint

    def block(h):
        for _ in range(EVERY):
            h = torch.sin(h)
        return h
    x = x0.detach().requires_grad_()
    y = x
    for _ in range(DEPTH // EVERY):
        y = checkpoint(block, y, use_reentrant=False)
    y.backward(torch.ones_like(y))
    return x.grad


make_gradcore, make_floor, make_torch, _ = one_input(
    _x, checkpointed_gradcore, deep_floor, checkpointed_torch)


WORKLOAD = Workload(
    name="deep_checkpoint",
    summary=(f"deep's {DEPTH} nested sin on a {SIZE:,}-vector (float32), a checkpoint every "
             f"{EVERY} layers, forward + backward"),
    count=1,
    unit="run",
    convention=f"one run = {DEPTH} sin forward, their recomputation block by block, backward",
    gradcore=make_gradcore,
    floor=make_floor,
    floor_label=("deep's floor, without checkpoints: the forward keeps every sin's input (as "
                 "eager autodiff does), the backward multiplies by each cos"),
    torch=make_torch,
    verify=verify,
    time_unit="ms",
    repeat=5,
    warmup=1,
    memory=dataclasses.replace(deep.WORKLOAD.memory,
                               rows=(("deep_checkpoint, peak memory", "peak_mib", True),)),
    targets=(ratio_target("<= 1.5x the time without checkpoints (the floor)", "gradcore/floor",
                          1.5),
             ratio_target("peak memory <= 0.25x without checkpoints (the floor)",
                          "memory gradcore/floor", 0.25, row="peak_mib")),
)
