"""What the training-step workloads (mlp, conv) share: one SGD step three ways, and its checks.

A workload module describes its network four times over the same parameters (a dict of float32
arrays, made on the host from a fixed seed): `gradcore_loss` (Parameters -> loss Variable),
`floor_grads` (hand-written forward and backward on raw arrays of `xp`: loss and gradients),
`torch_loss`, and `init`. `training_workload` turns that into the factories and the `verify` of a
Workload. One run is one step: clear gradients, forward, backward, `p -= LR * grad` in place.

Checks, outside the clock: each implementation's first step (made by its factory) must give the
loss, the gradients and the updated parameters of the floor's arithmetic redone in float64 on the
host; after the timed runs, the loss must have gone down (every step trains on the same batch),
for gradcore and the floor every parameter and gradient must still be float32, and the last
loss and the parameters must be those of the floor's model trained as many steps
(`verify_steps`): a replay that stopped computing after its warm-up, or a later step gone wrong,
is caught.

Memory (`step_memory`): the peak of one step above the process's baseline, each implementation
in a fresh process (benchmarks/memory.py), after the steps its factory takes, no gradient held.
"""
import functools
import math

import numpy

import backends
import gradcore

from .common import Memory, on_device, ratio_target, replayed

LR = 0.01
RTOL = 2e-3  # float32 against the float64 reference, relative to the largest entry


def host(a):
    """A NumPy copy of a gradcore Variable, an array of any backend, or a torch tensor."""
    if isinstance(a, gradcore.Variable):
        a = a.data
    if type(a).__module__.partition(".")[0] == "torch":
        return a.detach().cpu().numpy()
    return backends.backend_of(a).to_numpy(a)


def assert_close(what, got, want, rtol, atol=0.0):
    """AssertionError unless `got` (NumPy, or anything numpy.asarray takes) has the shape of `want`
    and is within rtol times want's largest entry, plus atol, of it everywhere."""
    got, want = numpy.asarray(got, dtype=numpy.float64), numpy.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {got.shape}, expected {want.shape}")
    error = float(numpy.max(numpy.abs(got - want), initial=0.0))
    scale = float(numpy.max(numpy.abs(want), initial=0.0))
    if not error <= rtol * scale + atol:
        raise AssertionError(f"{what} off by {error:.3g} (largest entry {scale:.3g})")


def probe(run, meter):
    """One step from the baseline (parameters and batch made, the factory's steps and one more
    taken, no gradient held): its peak above it."""
    # The step right after the factory's float64 check finds the heap laid out by chance: the
    # gradients landed on pages the meter's trim had given back, or not (mlp: 9 or 13 MiB, the
    # same bytes in use). Later steps reuse the previous step's memory, as a training loop does
    forget_gradients(run())
    meter.start()
    result = run()
    return {"peak_mib": meter.peak_mib()}, result


def forget_gradients(result):
    """Drop the gradients a step's `result` leaves on its parameters (gradcore's and PyTorch's)."""
    # gradcore and PyTorch keep a step's gradients on the parameters until the next step clears
    # them; the floor's go with its result. Kept through the baseline, autodiff's new gradients
    # would fit under it while the floor's are counted (mlp: gradcore/floor 0.46x, against
    # 1.15-1.19x from the same state). Cleared, every implementation starts from parameters and
    # batch alone, and every figure counts all its step makes, the gradients included. The other
    # way to one state, the floor keeping its gradients between steps as autodiff does, would
    # change the floor's step (no longer the least a step needs) and leave every figure to whether
    # the allocator puts new gradients where the old ones were freed.
    for p in result[1].values():
        if isinstance(p, gradcore.Variable):
            p.cleargrad()
        elif type(p).__module__.partition(".")[0] == "torch":
            p.grad = None


# What every training workload's record says the same way: a step, timed in ms
STEP = {"count": 1, "unit": "step", "time_unit": "ms",
        "convention": "one step = clear gradients, forward, backward, update every parameter"}
# The replay's goals on a training step: no slower than the floor, no more memory than eager
REPLAY_TARGETS = (
    ratio_target("replay <= 1.0x the floor", "replay/floor", 1.0, row="replay"),
    ratio_target("replay peak memory <= gradcore's", "memory replay/gradcore", 1.0,
                 row="replay peak_mib"))


def step_memory(name, parameters):
    """The Memory figure of a training workload `name` with `parameters` float32 parameters."""
    return Memory(
        summary=("peak memory of one step above the process's baseline (libraries imported, "
                 "parameters and batch made, after the factory's first step, one more, and, for "
                 "the replay, its recording and warm-up; no gradient held), in a fresh process "
                 f"per implementation; the parameters are {parameters * 4 / 2 ** 20:.2f} MiB"),
        probe=probe,
        rows=((f"{name}, peak memory", "peak_mib", True),),
    )


def _float32(kind, arrays):
    wrong = {name: str(a.dtype) for name, a in arrays.items() if str(a.dtype) != "float32"}
    if wrong:
        raise AssertionError(f"{kind}: not float32: {wrong}")


def training_workload(init, gradcore_loss, floor_grads, torch_loss):
    """(make_gradcore, make_floor, make_torch, make_replay, verify, verify_steps) for a Workload.

    `init()` -> (params: dict of float32 NumPy arrays, x: float32 NumPy array, t: int labels);
    `gradcore_loss(params: dict of Parameters, x, t)` -> loss Variable;
    `floor_grads(xp, params, x, t)` -> (loss 0-d array, dict of gradients, same keys);
    `torch_loss(torch, params: dict of tensors, x, t)` -> loss tensor.
    """

    @functools.lru_cache(maxsize=None)
    def reference():
        """Loss, gradients and updated parameters of the first step, in float64 on the host."""
        params, x, t = init()
        params = {k: v.astype(numpy.float64) for k, v in params.items()}
        loss, grads = floor_grads(numpy, params, x.astype(numpy.float64), t)
        updated = {k: params[k] - LR * grads[k] for k in params}
        return float(loss), grads, updated

    def check(kind, result, first_step):
        """A step's `result`, (loss, params) or the floor's (loss, params, grads), on the host:
        after the first step, against the reference; after the last, its loss below the first's.
        gradcore's and the floor's arrays must be float32 after both."""
        loss, params = float(host(result[0])), {k: host(p) for k, p in result[1].items()}
        grads = result[2] if kind == "floor" else {k: p.grad for k, p in result[1].items()}
        grads = {k: host(g) for k, g in grads.items()}
        ref_loss, ref_grads, ref_updated = reference()
        if not first_step and not (math.isfinite(loss) and loss < ref_loss):
            raise AssertionError(f"{kind}: the loss went from {ref_loss:.4g} to {loss:.4g}; "
                                 "training on one batch should lower it")
        if kind != "torch":
            _float32(kind, {**params, **{f"grad {k}": g for k, g in grads.items()}})
        if first_step:
            assert_close(f"{kind}: first-step loss", loss, ref_loss, RTOL, 1e-6)
            for name in ref_grads:
                assert_close(f"{kind}: first-step gradient of {name}", grads[name],
                             ref_grads[name], RTOL, 1e-6)
                assert_close(f"{kind}: {name} after the first step", params[name],
                             ref_updated[name], RTOL, 1e-6)

    trained = {}  # str(device) -> [steps taken, the floor's step there, its last result]

    def floor_after(device, steps):
        """The last loss and the parameters, on the host, of the floor's model on `device` after
        `steps` steps. Kept, to go on from for a later count."""
        state = trained.get(str(device))
        if state is None or state[0] > steps:
            state = trained[str(device)] = [0, floor_step(device), None]
        while state[0] < steps:
            state[2] = state[1]()
            state[0] += 1
        return float(host(state[2][0])), {k: host(p) for k, p in state[2][1].items()}

    def verify_steps(kind, result, calls, device):
        """After the timed runs: the model has taken 1 + `calls` steps (its factory's first, then
        one a call); its last loss and parameters must be those of the floor's model (float32,
        on `device`) after as many, within float32's tolerance. One step more or fewer moves the
        loss by 1-5% at the suite's step counts."""
        steps = 1 + calls
        want_loss, want = floor_after(device, steps)
        assert_close(f"{kind}: loss of step {steps} (the floor's model's)", float(host(result[0])),
                     want_loss, RTOL, 1e-6)
        for name in want:
            assert_close(f"{kind}: {name} after {steps} steps (the floor's model's)",
                         host(result[1][name]), want[name], RTOL, 1e-6)

    def on(device, arrays):
        backend = backends.backend_for_device(device)
        return {k: backend.asarray(v, device=device) for k, v in arrays.items()}

    # ---------------------------------------------------------------- gradcore
    def make_gradcore(device):
        params, x, t = init()
        params = {k: gradcore.Parameter(v, name=k) for k, v in on(device, params).items()}
        data = on(device, {"x": x, "t": t})
        x, t = data["x"], data["t"]

        def step():
            for p in params.values():
                p.cleargrad()
            loss = gradcore_loss(params, x, t)
            loss.backward()
            for p in params.values():
                p.data -= LR * p.grad.data
            return loss, params

        check("gradcore", step(), first_step=True)
        return step

    # ---------------------------------------------------------------- gradcore, replayed
    def make_replay(device):
        step = make_gradcore(device)  # its first step, eager, checked
        return replayed(step)

    # ---------------------------------------------------------------- floor
    def floor_step(device):
        """The floor's step on `device`, on a model of its own made by `init`."""
        params, x, t = init()
        params = on(device, params)
        data = on(device, {"x": x, "t": t})
        xp = backends.backend_for_device(device).xp

        def step():
            loss, grads = floor_grads(xp, params, data["x"], data["t"])
            for name, g in grads.items():
                params[name] -= LR * g
            return loss, params, grads
        return on_device(device, step)

    def make_floor(device):
        step = floor_step(device)
        check("floor", step(), first_step=True)
        return step

    # ---------------------------------------------------------------- PyTorch
    def make_torch(torch, device):
        params, x, t = init()
        params = {k: torch.tensor(v, device=device, requires_grad=True)
                  for k, v in params.items()}
        x = torch.tensor(x, device=device)
        t = torch.tensor(t, dtype=torch.int64, device=device)

        def step():
            for p in params.values():
                p.grad = None
            loss = torch_loss(torch, params, x, t)
            loss.backward()
            with torch.no_grad():
                for p in params.values():
                    p.sub_(p.grad, alpha=LR)  # p -= LR * grad, in place
            return loss, params

        check("torch", step(), first_step=True)
        return step

    verify = functools.partial(check, first_step=False)  # after the timed runs
    return make_gradcore, make_floor, make_torch, make_replay, verify, verify_steps
