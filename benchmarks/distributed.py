"""distributed: an MLP's training step over MPI ranks (gradcore.distributed), its all-reduce
against mpi4py's own, overlap and bucket sizes, and PyTorch DDP (gloo) beside it.

    mpiexec -n 2 python -m benchmarks.distributed [--steps N] [--quick] [--json PATH]

The model is the mlp workload's 784-1000-1000-10 relu network (nn.MLP((1000, 1000, 10)), its
parameters from mlp.init), float32, global batch 256, SGD (lr 0.01), on the CPU. Figures:

- the step (clear gradients, forward, backward, optimizer step) at 1 rank: rank 0 alone with the
  whole batch and a plain SGD, while the other ranks wait in MPI_Barrier (MPICH polls there, so
  their cores stay busy, but with no memory traffic); at N ranks: each rank 1/N of the batch,
  DistributedOptimizer, for overlap on and off and three bucket sizes; and at N ranks with no
  communication at all (plain SGD on 1/N of the batch: the compute the all-reduce adds to);
- the all-reduce inside those steps: seconds in comm.reducer's start, progress and wait (the
  reducer's methods wrapped from outside), and in DistributedOptimizer.synchronize as a whole;
- that all-reduce on its own (synchronize() with fresh gradients in place, its reducer time;
  and the reducer alone on buffers packed before the barrier) against mpi4py's blocking
  Allreduce(IN_PLACE) of buffers of the same sizes, and of one buffer of all the bytes, in
  turns, a barrier before each;
- PyTorch's DistributedDataParallel (gloo, over TCP on 127.0.0.1) when torch imports: its step,
  the same step without DDP on 1/N of the batch, and gloo's all_reduce of all the bytes.

Every step is timed as the suite times a run (common.time_once: a collection, then a barrier
before and after), so a step ends when every rank has finished it; all steps take turns, one
each per round, as the suite's implementations do. gc.freeze() after set-up keeps PyTorch's
objects out of those collections. Rank 0 prints and writes the JSON; figures are rank 0's (the
JSON also has every rank's median). Without mpiexec, only the 1-rank figures.
"""
import argparse
import dataclasses
import datetime
import gc
import hashlib
import json
import os
import platform
import random
import shlex
import socket
import statistics
import sys
import time
from typing import Callable, Optional

import numpy

import gradcore
import gradcore.functions as F
from gradcore import nn, optim
from gradcore.distributed import DEFAULT_BUCKET_SIZE  # imports without mpi4py

from . import mlp
from .common import (Progress, Unavailable, import_torch, load_average, number,
                     thread_environment, time_once)

GLOBAL_BATCH = 256
LR = 0.01
SEED = 1  # the batch's; the parameters are mlp.init's
BUCKETS = (256 * 2 ** 10, DEFAULT_BUCKET_SIZE, 64 * 2 ** 20)  # bytes
DEFAULT_STEPS, DEFAULT_WARMUP, DEFAULT_REPS = 40, 3, 200
QUICK_STEPS, QUICK_WARMUP, QUICK_REPS = 3, 1, 10
TARGET = 1.1  # the goal: gradcore's all-reduce (the reducer) <= 1.1x mpi4py's Allreduce


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="mpiexec -n 2 python -m benchmarks.distributed",
        description="Time data-parallel training steps of an MLP over MPI ranks.")
    parser.add_argument("--steps", type=int, metavar="N",
                        help=f"timed steps per figure, the median is reported (default "
                             f"{DEFAULT_STEPS}, after {DEFAULT_WARMUP} warm-up steps)")
    parser.add_argument("--reps", type=int, metavar="N",
                        help=f"repetitions of each all-reduce in the comparison (default "
                             f"{DEFAULT_REPS})")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_STEPS} steps after {QUICK_WARMUP} warm-up, {QUICK_REPS} "
                             "repetitions: checks that it runs, the figures mean little")
    parser.add_argument("--threads", type=int, default=1, metavar="N",
                        help="BLAS and PyTorch threads per rank (default 1: one core per rank)")
    parser.add_argument("--no-torch", action="store_true", help="leave PyTorch DDP out")
    parser.add_argument("--json", metavar="PATH", help="rank 0 writes the figures there")
    args = parser.parse_args(argv)
    args.warmup = QUICK_WARMUP if args.quick else DEFAULT_WARMUP
    if args.steps is None:  # not `or`: an explicit 0 must reach the check below
        args.steps = QUICK_STEPS if args.quick else DEFAULT_STEPS
    if args.reps is None:
        args.reps = QUICK_REPS if args.quick else DEFAULT_REPS
    if min(args.steps, args.reps, args.threads) < 1:
        parser.error("--steps, --reps and --threads must be at least 1")
    problem = _unwritable(args.json) if args.json else ""
    if problem:  # checked before the steps, which take minutes, not after them
        parser.error(f"--json {args.json}: {problem}")
    return args


def _unwritable(path):
    """Why rank 0 could not write the file `path`; "" if it can."""
    folder = os.path.dirname(path) or os.curdir
    if os.path.isdir(path):
        return "a folder: name a file for the figures"
    if not os.path.isdir(folder):
        return f"there is no folder {folder}: make it, or name a file in another folder"
    if not os.access(path if os.path.exists(path) else folder, os.W_OK):
        return "cannot write there: name another file"
    return ""


# ================================================================================ the job
class Job:
    """The ranks, or this process alone when mpi4py is missing: rank, size, barrier()."""

    def __init__(self):
        try:
            import gradcore.distributed as dist
            self.comm = dist.init()
        except ImportError as e:
            self.comm, self.why_alone = None, str(e)
            self.rank, self.size, self.mpi = 0, 1, None
            return
        self.why_alone = "launched without mpiexec: the job has one process"
        self.rank, self.size = self.comm.rank, self.comm.size
        self.mpi = self.comm.MPI

    def barrier(self):
        """MPI's blocking barrier (not gradcore's polling one): what every timing waits at."""
        if self.comm is not None:
            self.comm.mpi.Barrier()

    def gather(self, obj):
        """[obj of rank 0, obj of rank 1, ...] (JSON-able) on every rank."""
        return [obj] if self.comm is None else self.comm.allgather_json(obj)

    def same_everywhere(self, arrays, what):
        """AssertionError unless `arrays` (a list of NumPy arrays) are equal on every rank."""
        digest = hashlib.blake2b(digest_size=8)
        for a in arrays:
            digest.update(numpy.ascontiguousarray(a).tobytes())
        digests = self.gather(digest.hexdigest())
        if len(set(digests)) > 1:
            raise AssertionError(f"{what}: the ranks' parameters differ after the steps")


class ReducerClock:
    """Seconds spent in comm.reducer's start, progress and wait (it wraps those methods on the
    reducer), and in the synchronize of optimizers of its `optimizer_class`, since the last
    reset; the bytes of each buffer started. gradcore's code is left as it is."""

    def __init__(self, reducer):
        self.reset()
        for name in ("start", "progress", "wait"):
            setattr(reducer, name, self._timed(getattr(reducer, name), name))

    def reset(self):
        self.seconds = dict.fromkeys(("start", "progress", "wait", "synchronize"), 0.0)
        self.sizes = []

    def reducer_s(self):
        """The all-reduce's seconds: in the reducer's start, progress and wait."""
        return self.seconds["start"] + self.seconds["progress"] + self.seconds["wait"]

    def optimizer_class(self, dist):
        """DistributedOptimizer with its synchronize (which step calls) timed by this clock."""
        clock = self

        class Timed(dist.DistributedOptimizer):
            def _average(self, *args, **kwargs):  # what synchronize() and step() run
                start = time.perf_counter()
                try:
                    return super()._average(*args, **kwargs)
                finally:
                    clock.seconds["synchronize"] += time.perf_counter() - start
        return Timed

    def _timed(self, method, name):
        def timed(*args):
            if name == "start":
                self.sizes.append(args[0].nbytes)
            start = time.perf_counter()
            try:
                return method(*args)
            finally:
                self.seconds[name] += time.perf_counter() - start
        return timed


@dataclasses.dataclass
class Step:
    """One training step to time: `run()` does it on this rank and returns the loss (None on a
    rank that only waits)."""

    key: str
    what: str                           # what the printed line says
    ranks: int                          # the ranks that compute in it
    run: Callable
    check: Callable                     # check(): AssertionError if the steps went wrong
    opt: object = None                  # its DistributedOptimizer, if it has one
    bucket: Optional[int] = None        # its bucket size in bytes
    overlap: Optional[bool] = None
    samples: list = dataclasses.field(default_factory=list)      # seconds per step
    reducer: list = dataclasses.field(default_factory=list)      # seconds in the reducer
    synchronize: list = dataclasses.field(default_factory=list)  # seconds in synchronize()
    losses: list = dataclasses.field(default_factory=list)


def batch(rank, ranks):
    """Rank `rank`'s share of the global batch split over `ranks`: float32 x, int64 labels."""
    rng = numpy.random.default_rng(SEED)
    x = rng.standard_normal((GLOBAL_BATCH, mlp.SIZES[0])).astype(numpy.float32)
    t = rng.integers(0, mlp.SIZES[-1], GLOBAL_BATCH)
    share = GLOBAL_BATCH // ranks
    return x[rank * share:(rank + 1) * share], t[rank * share:(rank + 1) * share]


def bucket_label(nbytes):
    return f"{nbytes // 2 ** 20} MiB" if nbytes >= 2 ** 20 else f"{nbytes // 2 ** 10} KiB"


def bucket_key(nbytes):
    return bucket_label(nbytes).replace(" ", "")


def _check_losses(key, losses):
    if not (all(numpy.isfinite(losses)) and losses[-1] < losses[0]):
        raise AssertionError(f"{key}: the loss went from {losses[0]:.4g} to {losses[-1]:.4g}; "
                             "training on one batch should lower it")


# ================================================================================ gradcore
def gradcore_model():
    """nn.MLP((1000, 1000, 10)) with relu, sized, holding mlp.init's parameters (the same on
    every rank)."""
    model = nn.MLP(mlp.SIZES[1:], activation=F.relu)
    model(numpy.zeros((1, mlp.SIZES[0]), dtype=numpy.float32))  # the layers size themselves
    params = mlp.init()[0]
    for i, layer in enumerate(model.layers, 1):
        layer.W.data = params[f"W{i}"].copy()
        layer.b.data = params[f"b{i}"].copy()
    return model


def gradcore_step(job, key, what, ranks, clock=None, bucket=None, overlap=None, alone=False):
    """A Step of gradcore: a fresh model trained by SGD, wrapped in a DistributedOptimizer
    (`bucket`, `overlap`) timed by `clock` when one is given; this rank's share of the batch
    when `ranks` > 1, else all of it. `alone`: only rank 0 computes."""
    model = gradcore_model()
    opt = optim.SGD(model.parameters(), lr=LR)
    if clock is not None:
        import gradcore.distributed as dist
        dist.broadcast_parameters(model, job.comm)  # as a user would (they are equal already)
        opt = clock.optimizer_class(dist)(opt, job.comm, bucket_size=bucket, overlap=overlap)
    x, t = batch(job.rank, ranks) if ranks > 1 else batch(0, 1)
    computes = not alone or job.rank == 0

    def run():
        if not computes:
            return None
        opt.zero_grad()
        loss = F.softmax_cross_entropy(model(x), t)
        loss.backward()
        opt.step()
        return float(loss.data)

    def check():
        if computes:
            _check_losses(key, step.losses)
        if clock is not None:
            job.same_everywhere([p.data for p in model.parameters()], key)

    step = Step(key, what, ranks, run, check, bucket=bucket, overlap=overlap)
    if clock is not None:
        step.opt = opt
        _check_first_step(model, opt, x, t, key)
    return step


def _check_first_step(model, opt, x, t, key):
    """One step by hand: after synchronize, every gradient is the whole batch's (the shares are
    equal, so the mean of the ranks' mean gradients is the mean over the whole batch)."""
    whole, (wx, wt) = gradcore_model(), batch(0, 1)
    F.softmax_cross_entropy(whole(wx), wt).backward()
    opt.zero_grad()
    F.softmax_cross_entropy(model(x), t).backward()
    opt.synchronize()
    for (name, p), want in zip(model.named_parameters(), whole.parameters()):
        want = want.grad.data
        error = float(numpy.max(numpy.abs(p.grad.data - want)))
        if not error <= 1e-4 * float(numpy.max(numpy.abs(want))) + 1e-7:
            raise AssertionError(f"{key}: the averaged gradient of {name} is off by {error:.3g} "
                                 "from the whole batch's")
    opt.optimizer.update()


def gradcore_steps(job, clock):
    """gradcore's Steps: 1 rank; at the job's ranks, without communication, and with a
    DistributedOptimizer (timed by `clock`) for each bucket size, overlap on and off."""
    steps = [gradcore_step(job, "step_1_rank", f"gradcore step, rank 0 alone, batch "
                           f"{GLOBAL_BATCH}, plain SGD", 1, alone=True)]
    if job.size == 1:
        return steps
    n = job.size
    steps.append(gradcore_step(job, f"step_{n}_ranks_no_communication",
                               f"gradcore step, batch {GLOBAL_BATCH // n} per rank, plain SGD, "
                               "no communication", n))
    for bucket in BUCKETS:
        for overlap in (True, False):
            steps.append(gradcore_step(
                job, f"step_{n}_ranks_{'overlap' if overlap else 'no_overlap'}_"
                f"{bucket_key(bucket)}", f"gradcore step, batch {GLOBAL_BATCH // n} per rank, "
                f"DistributedOptimizer overlap={overlap}, bucket {bucket_label(bucket)}", n,
                clock, bucket, overlap))
    return steps


# ================================================================================ PyTorch
def torch_steps(job, threads):
    """(PyTorch's Steps: 1 rank, and at the job's ranks without communication and with DDP over
    gloo; torch.distributed, None at 1 rank). Unavailable without PyTorch."""
    torch = import_torch()
    torch.set_num_threads(threads)
    params = mlp.init()[0]

    def model():
        layers = []
        for i, (fan_in, fan_out) in enumerate(zip(mlp.SIZES[:-1], mlp.SIZES[1:]), 1):
            linear = torch.nn.Linear(fan_in, fan_out)
            with torch.no_grad():  # the same parameters as gradcore's (weight: out, in)
                linear.weight.copy_(torch.from_numpy(params[f"W{i}"].T.copy()))
                linear.bias.copy_(torch.from_numpy(params[f"b{i}"]))
            layers += [linear, torch.nn.ReLU()]
        return torch.nn.Sequential(*layers[:-1])

    def step(key, what, ranks, module, alone=False, ddp=False):
        x, t = batch(job.rank, ranks) if ranks > 1 else batch(0, 1)
        x, t = torch.from_numpy(x), torch.from_numpy(t)
        opt = torch.optim.SGD(module.parameters(), lr=LR)
        computes = not alone or job.rank == 0

        def run():
            if not computes:
                return None
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(module(x), t)
            loss.backward()
            opt.step()
            return loss.item()

        def check():
            if computes:
                _check_losses(key, step.losses)
            if ddp:
                job.same_everywhere([p.detach().numpy() for p in module.parameters()], key)

        step = Step(key, what, ranks, run, check)
        return step

    steps = [step("torch_step_1_rank", f"PyTorch step, rank 0 alone, batch {GLOBAL_BATCH}, "
                  "no DDP", 1, model(), alone=True)]
    if job.size == 1:
        return steps, None
    n = job.size
    port = job.comm.broadcast_json(_free_port() if job.rank == 0 else None, what="the port")
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=job.rank, world_size=n)
    steps.append(step(f"torch_step_{n}_ranks_no_communication", f"PyTorch step, batch "
                      f"{GLOBAL_BATCH // n} per rank, no DDP, no communication", n, model()))
    steps.append(step(f"torch_step_{n}_ranks_ddp", f"PyTorch DDP step (gloo), batch "
                      f"{GLOBAL_BATCH // n} per rank, its default buckets (25 MiB)", n,
                      torch.nn.parallel.DistributedDataParallel(model()), ddp=True))
    return steps, torch.distributed


def _free_port():
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ================================================================================ timing
def time_steps(job, steps, clock, args, progress):
    """Every Step in turn, one each per round: `warmup` rounds, then `steps` timed ones; then
    each Step's check."""
    rounds = args.warmup + args.steps
    for round in range(rounds):
        for step in steps:
            if clock is not None:
                clock.reset()
            seconds, loss = time_once(step.run, job.barrier)
            step.losses.append(loss)
            if round >= args.warmup:
                step.samples.append(seconds)
                if step.opt is not None:
                    step.reducer.append(clock.reducer_s())
                    step.synchronize.append(clock.seconds["synchronize"])
        if progress:
            progress.advance(f"steps: round {round + 1}/{rounds}")
    for step in steps:
        step.check()


def time_allreduces(job, steps, clock, gloo, args, progress):
    """({name: [seconds per repetition]}, {bucket size: [bytes of each buffer it sends]}).

    gradcore's all-reduce for each bucket size: synchronize() of a DistributedOptimizer
    (overlap off), its parameters given gradients of their own first, as a backward leaves
    them: the reducer's seconds inside it ("gradcore_<bucket>", which include waiting for the
    other rank to finish packing) and its own ("synchronize_<bucket>"); the reducer alone on
    buffers of the same sizes packed before the barrier ("reducer_alone_<bucket>"). mpi4py's blocking Allreduce of buffers of the same sizes, one
    after another ("mpi4py_same_buffers_<bucket>"), and of one buffer of all the bytes; gloo's
    all_reduce of that one buffer. Every buffer is written just before, outside the clock (as
    synchronize packs its buckets just before it starts them). They take turns in an order
    shuffled each repetition (what runs just before changes a figure: the caches, the memory
    allocator's state), a barrier before each, the clock around the calls alone."""
    MPI = job.mpi
    world = MPI.COMM_WORLD
    syncing = {s.bucket: s.opt for s in steps if s.opt is not None and not s.overlap}
    sizes = {}
    for bucket, opt in syncing.items():
        clock.reset()
        opt.synchronize()
        sizes[bucket] = list(clock.sizes)
    total = sum(sizes[DEFAULT_BUCKET_SIZE])
    timings = {}

    def gradcore(bucket, opt):
        def run():
            clock.reset()
            start = time.perf_counter()
            opt.synchronize()
            timings[f"synchronize_{bucket_key(bucket)}"].append(time.perf_counter() - start)
            return clock.reducer_s()
        return run

    def buffers(nbytes, reduce):
        """(prepare, run): `reduce(arrays)` of float32 buffers of `nbytes` each, written just
        before."""
        arrays = [numpy.empty(n // 4, dtype=numpy.float32) for n in nbytes]

        def prepare():
            for a in arrays:
                a[...] = 1.0

        def run():
            start = time.perf_counter()
            reduce(arrays)
            return time.perf_counter() - start
        return prepare, run

    def mpi4py(arrays):  # one blocking Allreduce after another
        for a in arrays:
            world.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)

    def reducer(arrays):  # as synchronize drives it: start them all, then wait for them all
        job.comm.reducer.wait([job.comm.reducer.start(a) for a in arrays])

    def fresh_gradients(opt):
        """Each parameter given a gradient array of its own, as a backward leaves them (the
        last synchronize's are views of its buckets, which would keep them from being reused)."""
        def prepare():
            for p in opt._params:
                p.grad = type(p)(p.grad.data.copy(), requires_grad=False)
        return prepare

    contenders = []  # (name, prepare outside the clock, run() -> seconds)
    for bucket, opt in syncing.items():
        label = bucket_key(bucket)
        contenders += [
            (f"gradcore_{label}", fresh_gradients(opt), gradcore(bucket, opt)),
            (f"reducer_alone_{label}", *buffers(sizes[bucket], reducer)),
            (f"mpi4py_same_buffers_{label}", *buffers(sizes[bucket], mpi4py))]
        timings[f"synchronize_{label}"] = []
    contenders.append(("mpi4py_one_buffer", *buffers([total], mpi4py)))
    if gloo is not None:
        import torch
        tensor = torch.empty(total // 4, dtype=torch.float32)

        def gloo_run():
            start = time.perf_counter()
            gloo.all_reduce(tensor)
            return time.perf_counter() - start
        contenders.append(("gloo_one_buffer", lambda: tensor.fill_(1.0), gloo_run))
    timings.update({name: [] for name, _, _ in contenders})
    for rep in range(args.reps):
        order = list(contenders)
        random.Random(rep).shuffle(order)  # the same order on every rank
        for name, prepare, run in order:
            prepare()
            job.barrier()
            timings[name].append(run())
        if progress and (rep + 1) % max(1, args.reps // 10) == 0:
            progress.advance(f"all-reduce: repetition {rep + 1}/{args.reps}")
    return timings, sizes


# ================================================================================ figures
class Figures:
    """The figures in the order they are printed: key -> what, value, unit, device, ranks, and
    the median each rank measured (`per_rank`) for those with samples."""

    def __init__(self, job, device):
        self.job, self.device = job, device
        self.entries = {}
        self.lines = []  # (section title or None, key)

    def section(self, title):
        self.lines.append((title, None))

    def add(self, key, what, value, unit, ranks, samples=None):
        entry = {"what": what, "value": value, "unit": unit, "device": self.device,
                 "ranks": ranks}
        if samples is not None:
            entry["median_of"] = len(samples)
            entry["samples_s"] = samples
        self.entries[key] = entry
        self.lines.append((None, key))

    def median(self, key, what, samples, ranks):
        """A figure in ms: the median of `samples` (seconds)."""
        self.add(key, what, statistics.median(samples) * 1e3, "ms", ranks, samples)

    def ratio(self, key, what, numerator, denominator, ranks, target=None):
        """The figure `numerator` / the figure `denominator`, if both are there; `target`: the
        most it should be (the line says whether it is met)."""
        a, b = self.entries.get(numerator), self.entries.get(denominator)
        if a is not None and b is not None and b["value"] > 0:
            self.add(key, what, a["value"] / b["value"], "x", ranks)
            if target is not None:
                self.entries[key]["target"] = {"at_most": target,
                                               "met": self.entries[key]["value"] <= target}

    def gather(self):
        """Every rank's median of each figure with samples, into `per_rank` (all ranks call)."""
        mine = {key: statistics.median(e["samples_s"]) * 1e3 for key, e in self.entries.items()
                if "samples_s" in e}
        everyone = self.job.gather(mine)
        for key in mine:
            self.entries[key]["per_rank"] = [theirs.get(key) for theirs in everyone]

    def print(self):
        for title, key in self.lines:
            if key is None:
                print(f"\n{title}")
                continue
            e = self.entries[key]
            value = f"{number(e['value'])} {e['unit']}" if e["unit"] != "x" else \
                f"{number(e['value'])}x"
            goal = e.get("target")
            goal = f"  (target <= {goal['at_most']}x: {'met' if goal['met'] else 'NOT met'})" \
                if goal else ""
            print(f"  {e['what']}: {value}  [{e['device']}, {e['ranks']} "
                  f"rank{'' if e['ranks'] == 1 else 's'}]{goal}")


def figures_of(job, device, steps, timings, sizes, args):
    """The Figures of the timed steps and all-reduces."""
    fig = Figures(job, device)
    n = job.size
    fig.section(f"Training step (clear gradients, forward, backward, SGD step), ms per step, "
                f"median of {args.steps} after {args.warmup} warm-up, rank 0's clock:")
    for step in steps:
        fig.median(step.key, step.what, step.samples, step.ranks)
    if n == 1:
        return fig
    default = f"step_{n}_ranks_overlap_{bucket_key(DEFAULT_BUCKET_SIZE)}"
    fig.ratio(f"speedup_{n}_ranks", f"speedup at {n} ranks, DistributedOptimizer with its "
              f"defaults (1 rank's step time / {n} ranks')", "step_1_rank", default, n)
    fig.ratio(f"speedup_{n}_ranks_no_communication", f"speedup at {n} ranks without "
              "communication (the most the compute allows here)", "step_1_rank",
              f"step_{n}_ranks_no_communication", n)

    fig.section(f"All-reduce inside the {n}-rank steps, ms per step, median of {args.steps}, "
                "rank 0's (reducer = comm.reducer's start + progress + wait; synchronize() = "
                "packing, the reducer's start and wait, unpacking):")
    for step in steps:
        if step.opt is None:
            continue
        label = f"overlap={step.overlap}, bucket {bucket_label(step.bucket)}"
        fig.median(f"allreduce_in_step_{step.key.split('ranks_', 1)[1]}",
                   f"all-reduce in the step (reducer), {label}", step.reducer, n)
        fig.median(f"synchronize_in_step_{step.key.split('ranks_', 1)[1]}",
                   f"synchronize() in the step, {label}", step.synchronize, n)

    total = sum(sizes[DEFAULT_BUCKET_SIZE])
    fig.section(f"All-reduce alone, ms, median of {args.reps} in turns, a barrier before each; "
                f"the gradients: {total:,} bytes of float32 ({number(total / 2 ** 20)} MiB) "
                f"with the buckets' flags; target gradcore/mpi4py <= {TARGET}x:")
    for bucket in sizes:
        label, count = bucket_key(bucket), len(sizes[bucket])
        buffers = f"{count} buffer{'s' if count > 1 else ''}"
        fig.median(f"allreduce_gradcore_{label}", f"gradcore reducer in synchronize(), bucket "
                   f"{bucket_label(bucket)} ({buffers})", timings[f"gradcore_{label}"], n)
        fig.median(f"allreduce_synchronize_{label}", f"gradcore synchronize() whole, bucket "
                   f"{bucket_label(bucket)}", timings[f"synchronize_{label}"], n)
        fig.median(f"allreduce_reducer_alone_{label}", f"gradcore reducer alone (start all, "
                   f"wait), {buffers} packed before the barrier, bucket {bucket_label(bucket)}",
                   timings[f"reducer_alone_{label}"], n)
        shown = ", ".join(f"{b:,}" for b in sizes[bucket][:4]) + (", ..." if count > 4 else "")
        fig.median(f"allreduce_mpi4py_same_buffers_{label}", f"mpi4py Allreduce of the same "
                   f"{buffers} ({shown} bytes)", timings[f"mpi4py_same_buffers_{label}"], n)
    fig.median("allreduce_mpi4py_one_buffer", f"mpi4py Allreduce of one buffer of {total:,} "
               "bytes", timings["mpi4py_one_buffer"], n)
    if "gloo_one_buffer" in timings:
        fig.median("allreduce_gloo_one_buffer", f"PyTorch gloo all_reduce of one buffer of "
                   f"{total:,} bytes", timings["gloo_one_buffer"], n)
    for bucket in sizes:
        label = bucket_key(bucket)
        fig.ratio(f"ratio_reducer_alone_over_mpi4py_same_buffers_{label}",
                  f"gradcore reducer alone / mpi4py same buffers, bucket "
                  f"{bucket_label(bucket)}", f"allreduce_reducer_alone_{label}",
                  f"allreduce_mpi4py_same_buffers_{label}", n, target=TARGET)
        fig.ratio(f"ratio_allreduce_gradcore_over_mpi4py_same_buffers_{label}",
                  f"gradcore reducer in synchronize() / mpi4py same buffers, bucket "
                  f"{bucket_label(bucket)}", f"allreduce_gradcore_{label}",
                  f"allreduce_mpi4py_same_buffers_{label}", n)
        fig.ratio(f"ratio_allreduce_gradcore_over_mpi4py_one_buffer_{label}",
                  f"gradcore reducer / mpi4py one buffer, bucket {bucket_label(bucket)}",
                  f"allreduce_gradcore_{label}", "allreduce_mpi4py_one_buffer", n)
        fig.ratio(f"ratio_synchronize_over_mpi4py_same_buffers_{label}",
                  f"gradcore synchronize() whole / mpi4py same buffers, bucket "
                  f"{bucket_label(bucket)}", f"allreduce_synchronize_{label}",
                  f"allreduce_mpi4py_same_buffers_{label}", n)

    fig.section(f"Overlap: {n}-rank step time with overlap=True / with overlap=False (below 1: "
                "starting buckets during backward helps):")
    for bucket in BUCKETS:
        label = bucket_key(bucket)
        fig.ratio(f"ratio_overlap_over_no_overlap_{label}", f"bucket {bucket_label(bucket)}",
                  f"step_{n}_ranks_overlap_{label}", f"step_{n}_ranks_no_overlap_{label}", n)
    fig.ratio(f"ratio_step_{n}_ranks_over_no_communication", f"{n}-rank step, defaults, / the "
              "same without communication", default, f"step_{n}_ranks_no_communication", n)

    ddp = f"torch_step_{n}_ranks_ddp"
    if ddp in fig.entries:
        fig.section("PyTorch DDP beside it:")
        nocomm = fig.entries[f"torch_step_{n}_ranks_no_communication"]["value"]
        fig.add(f"torch_ddp_overhead_{n}_ranks", "PyTorch DDP step - the same step without DDP "
                "(its communication share, ms per step)", fig.entries[ddp]["value"] - nocomm,
                "ms", n)
        ours = fig.entries[default]["value"] - fig.entries[f"step_{n}_ranks_no_communication"][
            "value"]
        fig.add(f"gradcore_dist_overhead_{n}_ranks", "gradcore step, defaults, - the same step "
                "without communication (ms per step)", ours, "ms", n)
        fig.ratio(f"ratio_step_gradcore_over_torch_ddp_{n}_ranks", "gradcore step, defaults, / "
                  "PyTorch DDP step", default, ddp, n)
        fig.ratio(f"torch_speedup_{n}_ranks", f"PyTorch speedup of {n} ranks (DDP) over 1 rank",
                  "torch_step_1_rank", ddp, n)
    return fig


# ================================================================================ the run
def cpu_name():
    """The processor's model name, from /proc/cpuinfo where there is one."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown processor"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    environment = thread_environment(args.threads)
    if environment != os.environ:
        # The BLAS reads its thread count once, when NumPy loads: start again with it set (each
        # rank, before MPI starts; mpiexec's hand-over survives the exec)
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.distributed", *argv],
                  environment)
    job = Job()
    root = job.rank == 0
    device = "cpu"  # the MPI reducer sums host arrays; the model runs on NumPy
    say = print if root else (lambda *a, **k: None)
    notes = []
    if job.size == 1:
        notes.append(f"1 rank only ({job.why_alone}): the figures at 2 ranks (DistributedOptimizer"
                     "'s steps, the all-reduces, overlap, PyTorch DDP) need `mpiexec -n 2 python "
                     "-m benchmarks.distributed`")
    clock = ReducerClock(job.comm.reducer) if job.size > 1 else None
    steps = gradcore_steps(job, clock)
    gloo = None
    if args.no_torch:
        notes.append("PyTorch left out: --no-torch")
    else:
        try:
            more, gloo = torch_steps(job, args.threads)
            steps += more
        except Unavailable as e:
            notes.append(f"PyTorch DDP skipped: {e}")
    gc.collect()
    gc.freeze()  # what set-up made (PyTorch's ~150,000 objects) is left out of the collections
    progress = Progress(args.warmup + args.steps + (10 if job.size > 1 else 0)) if root else None
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_at_start = load_average()
    try:
        time_steps(job, steps, clock, args, progress)
        timings, sizes = time_allreduces(job, steps, clock, gloo, args, progress) \
            if job.size > 1 else ({}, {})
    finally:
        if progress:
            progress.close()
    fig = figures_of(job, device, steps, timings, sizes, args)
    fig.gather()
    if gloo is not None:
        gloo.destroy_process_group()
    mpi = " ".join(job.mpi.Get_library_version().split()[:3]) if job.mpi else "no MPI"
    say(f"gradcore.distributed benchmark on device {device} ({cpu_name()}, {os.cpu_count()} "
        f"logical CPUs), {job.size} rank{'s' if job.size > 1 else ''} ({mpi}), {args.threads} "
        f"BLAS/PyTorch thread(s) per rank")
    say(f"model: nn.MLP((1000, 1000, 10)), relu, on {mlp.SIZES[0]} float32 features "
        f"({sum(a.size for a in mlp.init()[0].values()):,} parameters); global batch "
        f"{GLOBAL_BATCH}; SGD lr {LR}; 1 rank = rank 0 alone with the whole batch while the "
        "others wait at a barrier; each step timed between barriers (it ends when every rank "
        "has finished it)")
    if root:
        fig.print()
    for note in notes:
        say(f"\nnote: {note}")
    if root and args.json:
        report = {
            "benchmark": "distributed",
            "date": started,
            "command": shlex.join(["mpiexec", "-n", str(job.size), "python", "-m",
                                   "benchmarks.distributed", *argv]),
            "device": device,
            "ranks": job.size,
            "machine": {"cpu": cpu_name(), "logical_cpus": os.cpu_count(), "mpi": mpi,
                        "load_average_1_5_15_min_at_start": load_at_start,
                        "load_average_1_5_15_min_at_end": load_average(),
                        "versions": {"python": platform.python_version(),
                                     "gradcore": gradcore.__version__,
                                     "numpy": numpy.__version__,
                                     "torch": _torch_version()}},
            "settings": {"steps": args.steps, "warmup": args.warmup, "reps": args.reps,
                         "threads_per_rank": args.threads, "global_batch": GLOBAL_BATCH,
                         "bucket_sizes": list(BUCKETS), "statistic": "median",
                         "clock": "time.perf_counter; steps between MPI barriers (time_once), "
                                  "all-reduces after a barrier, around the calls alone"},
            "bucket_buffers_bytes": {bucket_key(b): s for b, s in sizes.items()},
            "figures": fig.entries,
            "notes": notes,
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        say(f"\nwritten: {args.json}")
    return 0


def _torch_version():
    return sys.modules["torch"].__version__ if "torch" in sys.modules else None


if __name__ == "__main__":
    sys.exit(main())
