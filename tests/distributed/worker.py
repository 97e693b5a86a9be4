"""Run under `mpiexec -n K python worker.py SCENARIO OUT`: each rank runs SCENARIO and writes what
it measured to OUT/rank<r>.json for tests/distributed/test_distributed.py to check."""
import gc
import hashlib
import io
import json
import os
import sys
import time
import warnings
import weakref

import numpy as np

import gradcore
import gradcore.distributed as dist
import gradcore.distributed.optimizer as distributed_optimizer
import gradcore.functions as F
from gradcore import nn, optim
from gradcore.dataloaders import DataLoader
from gradcore.datasets import Dataset, Spiral


def digests(model):
    return {name: hashlib.blake2b(p.numpy().tobytes(), digest_size=8).hexdigest()
            for name, p in model.named_parameters()}


def train(comm, model, opt, dataset, epochs, batch_size, style="step"):
    for _ in range(epochs):
        for x, t in DataLoader(dataset, batch_size, shuffle=False):
            loss = F.softmax_cross_entropy(model(x), t)
            if style == "step":
                opt.zero_grad()
                loss.backward()
                opt.step()
            else:
                model.cleargrads()
                loss.backward()
                opt.update()
    return loss


def union_batches(dataset, size, per_rank, batch_size):
    """The examples of every rank's i-th batch, rank by rank, for i = 0, 1, ...: one process
    training on this order with size * batch_size per batch sees the ranks' global batches."""
    order = []
    for start in range(0, per_rank, batch_size):
        for rank in range(size):
            order.extend(range(rank * per_rank + start,
                               rank * per_rank + min(start + batch_size, per_rank)))
    return order


class Subset(Dataset):
    def __init__(self, data, label):
        self.source = data, label
        super().__init__()

    def prepare(self):
        self.data, self.label = self.source


# =============================================================================== scenarios
def spiral(comm, out):
    """Both styles of optimizer on the spiral, with an optimizer hook."""
    results = {}
    for style, make in (("step", lambda m: optim.SGD(m.parameters(), lr=0.5)),
                        ("update", lambda m: optim.MomentumSGD(lr=0.1).setup(m))):
        gradcore.manual_seed(100 + comm.rank)  # the ranks' own weights, until the broadcast
        model = nn.MLP((30, 3), activation=F.relu)
        dist.broadcast_parameters(model, comm)
        inner = make(model)
        seen = []
        inner.add_hook(lambda params: seen.append(
            hashlib.blake2b(params[0].grad.numpy().tobytes()).hexdigest()))
        opt = dist.DistributedOptimizer(inner, comm, bucket_size=256)  # several buckets
        share = dist.scatter_dataset(Spiral(train=True), comm)
        train(comm, model, opt, share, epochs=4, batch_size=15, style=style)
        results[style] = {"digests": digests(model), "hook_saw": seen, "share": len(share),
                          "buckets": len(opt._buckets)}
    return results


def equivalence(comm, out):
    """K ranks vs one process on the union of the shares, the same global batches, SGD."""
    gradcore.manual_seed(7)
    model = nn.MLP((30, 3), activation=F.relu)
    model(gradcore.Variable(np.zeros((1, 2), np.float32)))  # sized: the same on every rank
    initial = {k: v.copy() for k, v in model.state_dict().items()}
    dist.broadcast_parameters(model, comm)
    opt = dist.DistributedOptimizer(optim.SGD(model.parameters(), lr=0.5), comm)
    share = dist.scatter_dataset(Spiral(train=True), comm)
    train(comm, model, opt, share, epochs=3, batch_size=10)
    result = {"digests": digests(model), "share": len(share)}
    if comm.rank == 0:
        alone = nn.MLP((30, 3), activation=F.relu)
        alone(gradcore.Variable(np.zeros((1, 2), np.float32)))
        alone.load_state_dict(initial)
        data = Spiral(train=True)
        order = union_batches(data, comm.size, len(share), 10)
        union = Subset(data.data[order], data.label[order])
        train(comm, alone, optim.SGD(alone.parameters(), lr=0.5), union, epochs=3,
              batch_size=10 * comm.size)
        result["max_difference"] = max(
            float(np.abs(a.numpy() - b.numpy()).max())
            for a, b in zip(model.parameters(), alone.parameters()))
    return result


def shares(comm, out):
    """scatter_dataset on 100 examples: equal lengths, every example somewhere (seed=None: a
    seed of rank 0's)."""
    data = Subset(np.arange(100, dtype=np.float32)[:, None], np.arange(100))
    plain = dist.scatter_dataset(data, comm)
    mixed = dist.scatter_dataset(data, comm, shuffle=True, seed=3)
    fresh = dist.scatter_dataset(data, comm, shuffle=True, seed=None)
    return {"plain": plain.label.tolist(), "mixed": mixed.label.tolist(),
            "fresh": fresh.label.tolist()}


def buckets(comm, out):
    """Bucket sizes, overlap on and off, and two backwards before a step, give the same sums;
    a parameter without a gradient on one rank counts as zeros there; on none, stays None."""
    results = {}
    x = np.random.RandomState(comm.rank).randn(8, 5).astype(np.float32)
    for name, kwargs, twice in (("one", {"bucket_size": 1 << 30}, False),
                                ("many", {"bucket_size": 48}, False),
                                ("no_overlap", {"overlap": False}, False),
                                ("twice", {}, True)):
        gradcore.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, in_size=5), nn.Linear(4, in_size=6),
                              nn.Linear(3, in_size=4))
        spare = nn.Linear(2, in_size=5)  # rank 0 uses it; no one uses spare2
        spare2 = nn.Linear(2, in_size=5)
        holder = nn.Sequential(model, spare, spare2)
        dist.broadcast_parameters(holder, comm)
        opt = dist.DistributedOptimizer(optim.SGD(holder.parameters(), lr=0.1), comm, **kwargs)
        opt.zero_grad()
        loss = F.sum(model(gradcore.Variable(x)) ** 2)
        if comm.rank == 0:
            loss = loss + F.sum(spare(gradcore.Variable(x)))
        if twice:  # the same loss as two halves: buckets started by the first go stale
            (loss * 0.5).backward()
            started_after_first = opt._started
            (loss * 0.5).backward()
        else:
            loss.backward()
            started_after_first = opt._started
        opt.synchronize()
        results[name] = {
            "grads": {k: None if p.grad is None else p.grad.numpy().tolist()
                      for k, p in holder.named_parameters()},
            "buckets": len(opt._buckets), "started_in_backward": started_after_first}
        # a second step: now the hooks start buckets during backward (after the first check)
        opt.zero_grad()
        F.sum(model(gradcore.Variable(x)) ** 2).backward()
        results[name]["started_in_second_backward"] = opt._started
        opt.step()
        # now rank 1 uses `spare` too: its bucket may have started with rank 1's zeros
        opt.zero_grad()
        F.sum(spare(gradcore.Variable(x))).backward()
        opt.synchronize()
        results[name]["spare_b_everyone"] = spare.b.grad.numpy().tolist()
    return results


def uneven(comm, out):
    """Steps where the ranks' buckets start at different moments in backward give the sums of
    overlap=False on every rank: a parameter that only rank 1 uses at step 2 after no rank used
    it at step 1 (its bucket started early, with zeros, on rank 1 only); two backwards where
    only rank 0 uses `spare` (so only rank 0 has buckets started by the first); a backward
    dropped by zero_grad where only rank 0 started buckets."""
    x = gradcore.Variable(np.random.RandomState(comm.rank).randn(8, 5).astype(np.float32))
    # per step: the ranks that use `spare`, backwards before the step, whether the step is kept
    steps = (((), 1, True), ((), 1, True), ((1,), 1, True), ((0, 1), 1, True),
             ((0,), 2, True), ((0,), 1, False), ((0, 1), 1, True))
    results = {}
    for overlap in (True, False):
        gradcore.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, in_size=5), nn.Linear(3, in_size=6))
        spare = nn.Linear(2, in_size=5)
        holder = nn.Sequential(model, spare)
        dist.broadcast_parameters(holder, comm)
        opt = dist.DistributedOptimizer(optim.SGD(holder.parameters(), lr=0.01), comm,
                                        bucket_size=48, overlap=overlap)
        grads = []
        for using_spare, backwards, kept in steps:
            opt.zero_grad()
            loss = F.sum(model(x) ** 2)
            if comm.rank in using_spare:
                loss = loss + F.sum(spare(x))
            for _ in range(backwards):
                (loss * (1 / backwards)).backward()
            if not kept:
                opt.zero_grad()
                continue
            opt.step()
            grads.append({k: None if p.grad is None else p.grad.numpy().tolist()
                          for k, p in holder.named_parameters()})
        results["overlap" if overlap else "no_overlap"] = {"grads": grads,
                                                           "digests": digests(holder)}
    return results


def buffers(comm, out):
    """BatchNorm on each rank's own data: its running statistics, before and after a step, with
    buffers="mean" (the model found as the optimizer's target) and buffers=None."""
    results = {}
    x = gradcore.Variable(np.random.RandomState(comm.rank).randn(8, 3).astype(np.float32)
                          + comm.rank)
    for mode in ("mean", None):
        gradcore.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, in_size=3), nn.BatchNorm(), nn.Linear(2, in_size=4))
        dist.broadcast_parameters(model, comm)
        opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1), comm, buffers=mode)
        for _ in range(3):
            opt.zero_grad()
            F.sum(model(x) ** 2).backward()
            own = {k: b.numpy().tolist() for k, b in model.named_buffers()}
            opt.step()
        results[str(mode)] = {"own": own, "after": {k: b.numpy().tolist()
                                                    for k, b in model.named_buffers()}}
    return results


def late_buffer(comm, out):
    """A buffer registered after the first step (on every rank): the next step raises, on every
    rank, instead of leaving the ranks' values of it apart."""
    model = nn.Linear(2, in_size=3)  # no buffer at the first step
    dist.broadcast_parameters(model, comm)
    opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1), comm)
    x = gradcore.Variable(np.full((4, 3), comm.rank, np.float32))
    for step in range(2):
        if step == 1:
            model.register_buffer("stat", gradcore.Variable(np.full(2, float(comm.rank))))
        opt.zero_grad()
        F.sum(model(x)).backward()
        try:
            opt.step()
        except dist.DistributedError as e:
            return {"error": str(e), "step": step}
    return {"error": None}


def mismatch(comm, out):
    """Different models on the ranks: broadcast_parameters raises on every rank."""
    width = 3 if comm.rank == 0 else 4
    model = nn.Sequential(nn.Linear(width, in_size=2), nn.Linear(2, in_size=width))
    try:
        dist.broadcast_parameters(model, comm)
    except dist.DistributedError as e:
        return {"error": str(e)}
    return {"error": None}


def forgot_broadcast(comm, out):
    """No broadcast, different weights: the first step raises on every rank."""
    gradcore.manual_seed(comm.rank)
    model = nn.Linear(3, in_size=2)
    opt = dist.DistributedOptimizer(optim.SGD(model.parameters(), lr=0.1), comm)
    F.sum(model(gradcore.Variable(np.ones((2, 2), np.float32)))).backward()
    try:
        opt.step()
    except dist.DistributedError as e:
        return {"error": str(e)}
    return {"error": None}


def lazy(comm, out):
    """Two models sized at their first call, broadcast before: the ranks draw the same weights
    for both, though the first trains a step before the second's first call; then each rank's
    own numbers again (from its seed, where it left it, apart from rank 0). A lazy model not
    broadcast, sized after that, differs: its first step says the generators were given back."""
    gradcore.manual_seed(comm.rank)
    encoder, head = nn.MLP((8, 4)), nn.MLP((5, 3))
    dist.broadcast_parameters(encoder, comm)
    dist.broadcast_parameters(head, comm)
    opt = dist.DistributedOptimizer(optim.SGD(encoder.parameters(), lr=0.1), comm)
    x = gradcore.Variable(np.random.RandomState(comm.rank).randn(4, 2).astype(np.float32))
    F.sum(encoder(x)).backward()
    opt.step()  # the check at the first step passes only if the weights agree
    between = np.random.rand(2).tolist()  # the head is not sized yet: still root's numbers
    head_opt = dist.DistributedOptimizer(optim.SGD(head.parameters(), lr=0.1), comm)
    F.sum(head(encoder(x))).backward()
    head_opt.step()
    drawn = np.random.rand(3).tolist()
    late = nn.Linear(2)
    late_opt = dist.DistributedOptimizer(optim.SGD(late.parameters(), lr=0.1), comm)
    F.sum(late(x)).backward()
    try:
        late_opt.step()
        error = None
    except dist.DistributedError as e:
        error = str(e)
    return {"digests": digests(encoder), "head": digests(head), "between": between,
            "drawn": drawn, "late": error}


def save(comm, out):
    model = nn.Linear(3, in_size=2)
    dist.broadcast_parameters(model, comm)
    path = dist.save_on_root(model, os.path.join(out, "model"), comm)
    exists = os.path.exists(path)  # every rank returns after the file is written
    clone = nn.Linear(3, in_size=2)
    clone.load(path)
    # a file object on rank 0 (the others' path is not used): written into, None returned
    written = io.BytesIO() if comm.rank == 0 else None
    into_file = dist.save_on_root(model, written, comm)
    if comm.rank == 0:
        from_file = nn.Linear(3, in_size=2)
        from_file.load(io.BytesIO(written.getvalue()))
    return {"path": path, "exists": exists,
            "same": all(np.array_equal(a.numpy(), b.numpy())
                        for a, b in zip(model.parameters(), clone.parameters())),
            "into_file": into_file,
            "same_from_file": comm.rank != 0 or all(
                np.array_equal(a.numpy(), b.numpy())
                for a, b in zip(model.parameters(), from_file.parameters()))}


def small_job(comm):
    """A Linear layer, broadcast and wrapped: its training step, for the fault scenarios."""
    model = nn.Linear(3, in_size=2)
    dist.broadcast_parameters(model, comm)
    opt = dist.DistributedOptimizer(optim.SGD(model.parameters(), lr=0.1), comm)

    def step():
        F.sum(model(gradcore.Variable(np.ones((2, 2), np.float32)))).backward()
        opt.step()
    return step


def fails(comm, out, failing=(1,)):
    """Rank 1 (the `failing` ranks) raises in its third step: the other ranks stop with an
    error naming it."""
    step = small_job(comm)
    for i in range(5):
        if i == 2 and comm.rank in failing:
            raise ValueError("a bad batch, on purpose")
        step()
    return {}


def fails_slowly(comm, out, failing=(1,)):
    """`fails`, with rank 0 slow to say why it stops (as printing a traceback can be on a loaded
    machine): the failing ranks wait for its word before they end the job."""
    try:
        return fails(comm, out, failing)
    except dist.DistributedError:
        time.sleep(3.0)  # past the 2 s a failing rank waits for a rank that did not answer
        raise


def two_fail_slowly(comm, out):
    """`fails_slowly` with ranks 1 and 2 raising in the same step: rank 0 reads one's notice
    first, the other's may still be on its way, and both wait for rank 0's word."""
    return fails_slowly(comm, out, failing=(1, 2))


def fails_then_waits_again(comm, out):
    """`fails`, with rank 0 catching its DistributedError and going on to another collective
    (a barrier, as a save would): that wait raises at once, rank 1 known to have failed."""
    try:
        return fails(comm, out)
    except dist.DistributedError:
        start = time.monotonic()
        try:
            comm.barrier("a barrier after the failure")
        except dist.DistributedError as e:
            print(f"second error after {time.monotonic() - start:.1f} s: {e}", flush=True)
        raise


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("this exception cannot be printed")


def fails_unprintably(comm, out):
    """Rank 1 raises an exception whose str() raises: the others still hear that it failed."""
    step = small_job(comm)
    for i in range(5):
        if i == 2 and comm.rank == 1:
            raise Unprintable()
        step()
    return {}


def stuck(comm, out):
    """Rank 1 stops taking part for longer than the timeout: rank 0 raises at the deadline."""
    step = small_job(comm)
    for i in range(3):
        if i == 1 and comm.rank == 1:
            time.sleep(3 * comm.timeout)
        step()
    return {}


def fails_elsewhere(comm, out):
    """Rank 1 raises while rank 0 is busy outside gradcore (here: asleep): the job still ends."""
    if comm.rank == 1:
        raise ValueError("a bad batch, on purpose")
    time.sleep(60)
    return {}


def compiled_closure(comm, out):
    """Each rank's own batches, step(closure) eager and under gradcore.compile, from the same
    start: a replay sums the gradients (and the BatchNorm buffers) as an eager step does."""
    results = {}
    for compiled in (False, True):
        gradcore.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, in_size=3), nn.BatchNorm(), nn.Linear(2, in_size=4))
        model(gradcore.Variable(np.zeros((2, 3), np.float32)))  # sized before the broadcast
        dist.broadcast_parameters(model, comm)
        opt = dist.DistributedOptimizer(optim.MomentumSGD(model, lr=0.1), comm)

        def step(x, t):
            def closure():
                opt.zero_grad()
                loss = F.mean_squared_error(model(x), t)
                loss.backward()
                return loss
            return opt.step(closure)
        if compiled:
            step = gradcore.compile(step)
        rng = np.random.RandomState(comm.rank)  # the ranks' batches differ
        losses = [float(step(rng.randn(5, 3).astype(np.float32),
                             rng.randn(5, 2).astype(np.float32)).item()) for _ in range(4)]
        results["compiled" if compiled else "eager"] = {
            "losses": losses, "digests": digests(model),
            "buffers": {k: b.numpy().tolist() for k, b in model.named_buffers()},
            "replays": step.stats()["replays"] if compiled else None}
    return results


def two_layers(comm=None):
    """Two float64 Linear layers, the same on every rank (broadcast when given `comm`)."""
    gradcore.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, in_size=3, dtype="float64"),
                          nn.Linear(2, in_size=4, dtype="float64"))
    if comm is not None:
        dist.broadcast_parameters(model, comm)
    return model


def settings_differ(comm, out):
    """Ranks given different bucket_size, overlap or buffers: the first step raises on every
    rank, at once, naming the setting and each rank's value."""
    results = {}
    x = gradcore.Variable(np.random.RandomState(comm.rank).randn(5, 3))
    for name, values in (("bucket_size", (1 << 20, 40)), ("overlap", (True, False)),
                         ("buffers", ("mean", "root"))):
        model = two_layers(comm)
        opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1), comm,
                                        **{name: values[comm.rank]})
        start = time.monotonic()
        F.sum(model(x) ** 2).backward()
        try:
            opt.step()
            results[name] = {"error": None}
        except dist.DistributedError as e:
            results[name] = {"error": str(e), "seconds": time.monotonic() - start}
    return results


def model_changes(comm, out):
    """A layer replaced the same way on every rank after the first step, overlap on and off
    (buckets of the old plan may have started in backward): the new layer's gradients are
    averaged; the ranks train as one process on the mean of their losses."""
    xs = [gradcore.Variable(np.random.RandomState(r).randn(5, 3)) for r in range(comm.size)]
    results = {}

    def train(model, opt, loss):
        for step in range(4):
            if step == 1:  # the same new layer on every rank
                gradcore.manual_seed(1)
                setattr(model, "1", nn.Linear(2, in_size=4, dtype="float64"))
            opt.zero_grad()
            loss(model).backward()
            opt.step()
    for overlap in (True, False):
        model = two_layers(comm)
        opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.05), comm, bucket_size=48,
                                        overlap=overlap)
        train(model, opt, lambda m: F.sum(m(xs[comm.rank]) ** 2))
        alone = two_layers()
        train(alone, optim.SGD(alone, lr=0.05),
              lambda m: sum(F.sum(m(x) ** 2) for x in xs) / comm.size)
        results[str(overlap)] = {
            "digests": digests(model),
            "planned": [name for name, p in model.named_parameters() if id(p) in opt._bucket_of],
            "max_difference": max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in
                                  zip(model.parameters(), alone.parameters()))}
    return results


def clip_averaged(comm, out):
    """backward, clip_grad_norm_, step(), with and without synchronize() before the clipping:
    one process's training on the whole batch, one all-reduce per step. A gradient set anew by
    the program itself before the averaging warns (with overlap, whose hooks see it)."""
    rng = np.random.RandomState(0)
    xs, ts = rng.randn(comm.size, 8, 3), rng.randn(comm.size, 8, 2)
    xs[1] *= 5  # rank 1's gradients are larger: clipping each rank's differs

    def loss(model, x, t):
        return F.mean_squared_error(model(gradcore.Variable(x)), gradcore.Variable(t))
    alone = two_layers()
    solo = optim.SGD(alone, lr=0.05)
    alone_norms = []
    for _ in range(4):
        solo.zero_grad()
        (sum(loss(alone, x, t) for x, t in zip(xs, ts)) / comm.size).backward()
        alone_norms.append(float(nn.utils.clip_grad_norm_(alone.parameters(), 1.0).item()))
        solo.step()
    results = {}
    for overlap in (True, False):
        for form in ("synchronize", "plain"):
            model = two_layers(comm)
            opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.05), comm, overlap=overlap)
            started = []
            start = comm.reducer.start

            def counted(buffer, channel=None):
                started[-1] += 1
                return start(buffer, channel)
            comm.reducer.start = counted
            norms = []
            try:
                for _ in range(4):
                    started.append(0)
                    opt.zero_grad()
                    loss(model, xs[comm.rank], ts[comm.rank]).backward()
                    if form == "synchronize":
                        opt.synchronize()
                    norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()))
                    opt.step()
            finally:
                del comm.reducer.start
            difference = max(float(np.abs(a.numpy() - b.numpy()).max())
                             for a, b in zip(model.parameters(), alone.parameters()))
            results[f"{overlap} {form}"] = {"norms": norms, "alone_norms": alone_norms,
                                            "started": started, "max_difference": difference}
        # each rank changing its own gradient before the averaging
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                opt.zero_grad()
                loss(model, xs[comm.rank], ts[comm.rank]).backward()
                for p in model.parameters():
                    p.grad = p.grad * 0.5
                opt.step()
        results[f"{overlap} warnings"] = [str(w.message) for w in caught
                                          if issubclass(w.category, dist.LocalGradientWarning)]
    return results


class _InOrder(weakref.WeakSet):
    """A WeakSet that iterates in the order its items were added, or in the opposite order
    (`backwards`): processes whose addresses order the same items differently."""

    def __init__(self, backwards):
        super().__init__()
        self.backwards = backwards
        self.added = []

    def add(self, item):
        super().add(item)
        self.added.append(weakref.ref(item))

    def __iter__(self):
        items = [ref() for ref in self.added if ref() is not None]
        return iter(items[::-1] if self.backwards else items)


def two_optimizers_clipped(comm, out):
    """One clip_grad_norm_ over the parameters of two DistributedOptimizers of models of the
    same shapes (a GAN's two, say): each is averaged with itself on the other ranks, although
    odd ranks keep the optimizers in the opposite order (as their addresses may)."""
    xs = np.random.RandomState(0).randn(comm.size, 4, 3)

    def make(seed, comm=None):
        gradcore.manual_seed(seed)
        model = nn.Sequential(nn.Linear(2, in_size=3, dtype="float64"))
        if comm is not None:
            dist.broadcast_parameters(model, comm)
        return model

    def loss(a, b, x):
        x = gradcore.Variable(x)
        return F.sum(a(x) ** 2) + 10 * F.sum(b(x) ** 2)
    live = distributed_optimizer._live
    distributed_optimizer._live = _InOrder(backwards=comm.rank % 2 == 1)
    try:
        a, b = make(0, comm), make(1, comm)
        opts = [dist.DistributedOptimizer(optim.SGD(m, lr=0.1), comm, overlap=False)
                for m in (a, b)]
        loss(a, b, xs[comm.rank]).backward()
        for opt in opts:  # the first step of each compares the ranks
            opt.step()
            opt.zero_grad()
        loss(a, b, xs[comm.rank]).backward()
        nn.utils.clip_grad_norm_(list(a.parameters()) + list(b.parameters()), 1e9)
    finally:
        distributed_optimizer._live = live
    alone_a, alone_b = make(0), make(1)
    alone_a.load_state_dict(a.state_dict())
    alone_b.load_state_dict(b.state_dict())
    (sum(loss(alone_a, alone_b, x) for x in xs) / comm.size).backward()
    pairs = zip((*a.parameters(), *b.parameters()), (*alone_a.parameters(),
                                                     *alone_b.parameters()))
    return {"max_difference": max(float(np.abs(p.grad.numpy() - q.grad.numpy()).max())
                                  for p, q in pairs)}


def uneven_accumulation(comm, out):
    """Rank 0 runs one more backward than the others after the clip, or between two clips
    (uneven shares): the step, or the second clip, sums again on every rank, as training
    without the clip does (max_norm too large to clip: only the averaging differs)."""
    x = gradcore.Variable(np.random.RandomState(comm.rank).randn(5, 3))
    results = {}
    for overlap in (True, False):
        trained = {}
        for form in ("plain", "clip", "clip twice", "synchronize"):
            model = two_layers(comm)
            opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.01), comm, overlap=overlap)
            for step in range(3):
                opt.zero_grad()
                F.sum(model(x) ** 2).backward()
                if form == "synchronize":
                    opt.synchronize()
                elif form != "plain":
                    nn.utils.clip_grad_norm_(model.parameters(), 1e9)
                if comm.rank == 0 and step == 0:
                    F.sum(model(x) ** 2).backward()  # one more batch on rank 0
                if form == "clip twice":
                    nn.utils.clip_grad_norm_(model.parameters(), 1e9)
                opt.step()
            trained[form] = model
        for form, model in trained.items():
            results[f"{overlap} {form}"] = {
                "digests": digests(model),
                "max_difference": max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in
                                      zip(model.parameters(), trained["plain"].parameters()))}
    return results


def compiled_clip(comm, out):
    """backward, clip_grad_norm_ and step() in a step under gradcore.compile: the averaging runs
    as Python at every replay, the clip's ops replay after it, as one process on the whole
    batch would train."""
    rng = np.random.RandomState(0)
    xs, ts = rng.randn(5, comm.size, 8, 3), rng.randn(5, comm.size, 8, 2)
    xs[:, 1] *= 3  # rank 1's gradients are larger: clipping each rank's differs

    def loss(model, x, t):
        return F.mean_squared_error(model(gradcore.Variable(x)), gradcore.Variable(t))
    alone = two_layers()
    solo = optim.SGD(alone, lr=0.05)
    for x, t in zip(xs, ts):
        solo.zero_grad()
        (sum(loss(alone, x[r], t[r]) for r in range(comm.size)) / comm.size).backward()
        nn.utils.clip_grad_norm_(alone.parameters(), 0.5)
        solo.step()
    results = {}
    for overlap in (True, False):
        model = two_layers(comm)
        opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.05), comm, overlap=overlap)

        @gradcore.compile
        def step(x, t):
            opt.zero_grad()
            loss(model, x, t).backward()
            norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            return norm
        for x, t in zip(xs, ts):
            step(x[comm.rank], t[comm.rank])
        stats = step.stats()
        results[str(overlap)] = {
            "recordings": stats["recordings"], "replays": stats["replays"],
            "max_difference": max(float(np.abs(a.numpy() - b.numpy()).max())
                                  for a, b in zip(model.parameters(), alone.parameters()))}
    return results


def compiled_after_averaging(comm, out):
    """A backward gradcore.compile replays after an averaging (a clip between two micro-batches,
    outside the compiled call or in it; a clip after a compiled step, to log the norm): the
    next step sums it, as one process on the whole batch trains, and the calls replay."""
    rng = np.random.RandomState(3)
    xs = rng.randn(5, comm.size, 2, 6, 3)  # step, rank, micro-batch

    def loss(model, x):
        return F.sum(model(gradcore.Variable(x)) ** 2) / 6
    programs = {"backward compiled": 2, "whole step compiled": 2, "a clip after the step": 1}
    results = {}
    for overlap in (True, False):
        for program, micro in programs.items():
            # the last program's optimizer, collected mid-program, would remove its hooks: a
            # change that makes every compiled step record again
            gc.collect()
            model = two_layers(comm)
            opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.02), comm, overlap=overlap)
            clip = nn.utils.clip_grad_norm_

            @gradcore.compile
            def backward(x):
                loss(model, x).backward()

            @gradcore.compile
            def micro_batches(x0, x1):
                opt.zero_grad()
                loss(model, x0).backward()
                clip(model.parameters(), 1e9)  # averages; never clips
                loss(model, x1).backward()
                opt.step()

            @gradcore.compile
            def train_step(x):
                opt.zero_grad()
                loss(model, x).backward()
                opt.step()
            alone = two_layers()
            solo = optim.SGD(alone, lr=0.02)
            for x in xs:
                if program == "backward compiled":
                    opt.zero_grad()
                    backward(x[comm.rank, 0])
                    clip(model.parameters(), 1e9)
                    backward(x[comm.rank, 1])
                    opt.step()
                elif program == "whole step compiled":
                    micro_batches(*x[comm.rank])
                else:
                    train_step(x[comm.rank, 0])
                    clip(model.parameters(), float("inf"))  # the norm, for a log
                solo.zero_grad()
                (sum(loss(alone, x[r, k]) for r in range(comm.size) for k in range(micro))
                 / comm.size).backward()
                solo.step()
            compiled = {"backward compiled": backward, "whole step compiled": micro_batches,
                        "a clip after the step": train_step}[program]
            stats = compiled.stats()
            results[f"{overlap} {program}"] = {
                "digests": digests(model), "recordings": stats["recordings"],
                "tapes": stats["tapes"], "replays": stats["replays"],
                "max_difference": max(float(np.abs(a.numpy() - b.numpy()).max())
                                      for a, b in zip(model.parameters(), alone.parameters()))}
    return results


def two_models(comm):
    """Two float64 Linear layers of the same shape, broadcast: two models to train at once."""
    gradcore.manual_seed(0)
    models = [nn.Linear(3, in_size=3, dtype="float64") for _ in range(2)]
    for model in models:
        dist.broadcast_parameters(model, comm)
    return models


def deepened(x, depth):
    for _ in range(depth):
        x = F.tanh(x)
    return x


def own_channels(comm, out):
    """Two DistributedOptimizers (overlap) of models that backward finishes in opposite orders
    on rank 0 and the others: each optimizer's sums pair with its own on the other ranks. At
    the last step, an all-gather and a barrier of the program's come between backward and the
    steps, and only rank 0 uses `b` (so only it has started b's bucket by then). Then more
    optimizers made and dropped than MPI has communicators."""
    a, b = two_models(comm)
    opts = [dist.DistributedOptimizer(optim.SGD(m, lr=0.0), comm) for m in (a, b)]
    params = [*a.parameters(), *b.parameters()]
    own, averaged = [], []
    for step in range(4):
        x = gradcore.Variable(np.random.RandomState(10 * step + comm.rank).randn(4, 3))
        for opt in opts:
            opt.zero_grad()
        deep_a, deep_b = (3, 0) if comm.rank == 0 else (0, 3)
        loss = F.sum(a(deepened(x, deep_a)))
        if step < 3 or comm.rank == 0:
            loss = loss + 2 * F.sum(b(deepened(x, deep_b)))
        loss.backward()
        own.append([None if p.grad is None else p.grad.numpy().tolist() for p in params])
        if step == 3:
            comm.allgather_json("the program's own")
            comm.barrier()
        for opt in opts:
            opt.step()
        averaged.append([p.grad.numpy() for p in params])
    everyone = comm.allgather_json(own)
    worst = []
    for step, grads in enumerate(averaged):
        expected = [sum(np.zeros(p.shape) if rank[step][k] is None else np.array(rank[step][k])
                        for rank in everyone) / comm.size for k, p in enumerate(params)]
        worst.append(max(float(np.abs(g - e).max()) for g, e in zip(grads, expected)))
    made = 2100  # MPICH has 2046 communicators to give
    for _ in range(made):
        dist.DistributedOptimizer(optim.SGD(a, lr=0.0), comm)
    return {"worst": worst, "made": made}


def root_fails(comm, out):
    """Rank 0 cannot save (the folder does not exist), then cannot read its parameters in
    broadcast_parameters: every rank raises at once, naming it, and the collectives after
    pair as before."""
    model = nn.Linear(3, in_size=2)
    dist.broadcast_parameters(model, comm)
    results = {}
    start = time.monotonic()
    try:
        dist.save_on_root(model, os.path.join(out, "missing", "model"), comm)
    except Exception as e:
        results["save"] = f"{type(e).__name__}: {e}"
    try:
        comm.from_root(lambda: {1, 2}, what="a set")  # made, but no JSON can carry it
    except Exception as e:
        results["unsent"] = f"{type(e).__name__}: {e}"
    numpy_of = gradcore.Variable.numpy
    if comm.rank == 0:
        def unreadable(v):
            raise RuntimeError("the device is gone, on purpose")
        gradcore.Variable.numpy = unreadable
    try:
        dist.broadcast_parameters(model, comm)
    except Exception as e:
        results["broadcast"] = f"{type(e).__name__}: {e}"
    finally:
        gradcore.Variable.numpy = numpy_of
    results["seconds"] = time.monotonic() - start
    results["saved"] = dist.save_on_root(model, os.path.join(out, "model"), comm)
    return results


def exits(comm, out):
    """Rank 1 calls sys.exit(2) in its second step: rank 0 raises, naming it and its status."""
    step = small_job(comm)
    for i in range(3):
        if i == 1 and comm.rank == 1:
            sys.exit(2)
        step()
    return {}


def ends_apart(comm, out):
    """Every rank trains, then rank 0 goes on alone for longer than an exited rank is waited
    for: the others' word that they exited makes no error at the end, and no wait."""
    step = small_job(comm)
    for _ in range(3):
        step()
    comm.barrier()
    if comm.rank == 0:
        time.sleep(dist.communicator.EXIT_GRACE + 0.5)
        until = time.monotonic() + 5
        while not comm._exited and time.monotonic() < until:  # MPI moves it on in its calls
            comm.check_notices("the end")
    return {"heard": {str(rank): how for rank, (how, _) in comm._exited.items()}}


def backward_on_one_rank(comm, out):
    """Rank 0 alone runs a backward between two steps (for logging), overlap on, then drops its
    gradients with zero_grad, or every rank calls setup(model): the buckets it started are let
    go of on every rank together, and training goes on as without it (they were paired with
    rank 1's next sums)."""
    x = np.random.RandomState(0).randn(8, 3)
    results = {}
    for then in ("nothing", "zero_grad", "setup"):
        model = two_layers(comm)
        opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1), comm, bucket_size=48)
        try:
            for step in range(4):
                opt.zero_grad()
                F.sum(model(x[4 * comm.rank:4 * comm.rank + 4]) ** 2).backward()
                opt.step()
                if then != "nothing" and step == 1:
                    if comm.rank == 0:
                        F.sum(model(x[:1])).backward()
                    if then == "setup":
                        opt.setup(model)
                    elif comm.rank == 0:
                        opt.zero_grad()
            results[then] = digests(model)
        except dist.DistributedError as e:  # a rank waits for sums the other never starts
            results[then] = str(e)
    return results


def changes_and_settings(comm, out):
    """The scenarios above in one job (each launch costs seconds on a loaded machine)."""
    return {"settings": settings_differ(comm, out), "changes": model_changes(comm, out),
            "clip": clip_averaged(comm, out), "two": two_optimizers_clipped(comm, out),
            "uneven": uneven_accumulation(comm, out), "compiled": compiled_clip(comm, out),
            "compiled_after_averaging": compiled_after_averaging(comm, out),
            "one_rank_backward": backward_on_one_rank(comm, out)}


# scenarios that run before dist.init: they get the timeout instead of the communicator
def fails_before_init(timeout, out):
    """Rank 1 raises before it calls dist.init: the others raise at init's deadline, and the
    job ends."""
    from mpi4py import MPI
    if MPI.COMM_WORLD.Get_rank() == 1:
        raise FileNotFoundError("rank 1 could not read its data, on purpose")
    dist.init(timeout=timeout)
    return {}


def receives_before_init(timeout, out):
    """The program's own messages before dist.init: rank 0 takes one from each other rank, from
    any source with any tag, while those that sent theirs already wait in dist.init."""
    import time
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    if world.Get_rank() == 0:
        return {"got": sorted(world.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
                              for _ in range(world.Get_size() - 1))}
    time.sleep(world.Get_rank() - 1)  # rank 1 is in dist.init while rank 2 still sleeps
    world.send(f"hello from {world.Get_rank()}", dest=0)
    return {}


BEFORE_INIT = {"fails_before_init", "receives_before_init"}

if __name__ == "__main__":
    scenario, out = sys.argv[1], sys.argv[2]
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
    before = globals()[scenario](timeout, out) if scenario in BEFORE_INIT else None
    comm = dist.init(timeout=timeout)
    result = before if before is not None else globals()[scenario](comm, out)
    result["rank"], result["size"], result["local_rank"] = comm.rank, comm.size, comm.local_rank
    with open(os.path.join(out, f"rank{comm.rank}.json"), "w") as f:
        json.dump(result, f)
