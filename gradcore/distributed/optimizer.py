"""DistributedOptimizer: each gradient replaced by its mean over the ranks, then the step.

Gradients travel in flat buckets: runs of consecutive parameters (last layers first, the order
backward finishes them) of one dtype and device, up to `bucket_size` bytes each, so a small
parameter does not cost a message of its own. Buckets are started in the same fixed order on
every rank, whatever order their gradients become final in, so no rank ever waits on a
collective another has not started. With `overlap`, a bucket starts while backward goes on, as
soon as its last parameter's gradient is final (Variable.register_post_accumulate_grad_hook);
parameters this rank had no gradient for at the last step are not waited for (if one gets a
gradient after all, the step sums every bucket again, so the result is the same). Which buckets
start in backward differs between ranks; the step makes every rank start the same ones, in the
same order, and the ranks vote on summing again, so that every rank does or none does.
"""
import hashlib
import sys
import weakref

import numpy

import backends

from .. import variable as _variables
from ..config import enable_grad
from ..optim.optimizer import _eager_in_replay
from ..variable import Variable
from .communicator import DistributedError

__all__ = ["DistributedOptimizer", "DEFAULT_BUCKET_SIZE"]

DEFAULT_BUCKET_SIZE = 4 * 2 ** 20  # bytes


class _Bucket:
    """Parameters summed as one flat array: their gradients one after another, then one flag per
    parameter (1 where this rank has a gradient for it), which sum to how many ranks had one."""

    def __init__(self, params):
        self.params = params
        self.offsets = numpy.cumsum([0] + [p.size for p in params]).tolist()
        self.dtype = params[0].dtype
        self.device = params[0].device
        self.backend = params[0].backend
        self.host_dtype = numpy.dtype(f"float{8 * _itemsize(params[0])}")  # MPI's buffers
        self.ready = set()  # ids of the parameters whose gradient is final in this backward
        # ids of those this rank had no gradient for at the last step: not waited for (a
        # gradient that comes after all makes the step sum every bucket again)
        self.idle = set()
        self.handle = None  # the reducer's handle once started
        self.packed = None  # once started: each parameter's grad (Variable or None) as packed
        self.buffer = None
        self.spare = None  # the last step's buffer, reused when nothing holds a view of it


class DistributedOptimizer:
    """`optimizer` (either style: step() or DeZero's update()) whose steps first replace every
    parameter's gradient with its mean over the ranks of `comm`; the optimizer's hooks
    (WeightDecay, ClipGrad, ...) run after that averaging. A parameter no rank has a gradient
    for keeps None; one that some ranks lack counts as zeros there. Every other attribute
    (lr, state_dict, add_hook, ...) is the optimizer's.

    `bucket_size`: bytes per bucket (a parameter larger than that gets one of its own).
    `overlap`: start each bucket while backward goes on (else all at the step). To change a
    gradient between backward and the step, set `p.grad` anew (clip_grad_norm_ does) or use an
    optimizer hook: a write into the gradient's array may come after it was sent. The first
    step checks that every rank holds the same parameters (a digest of each), and raises
    DistributedError naming the ones that differ: see broadcast_parameters.
    """

    def __init__(self, optimizer, comm, bucket_size=DEFAULT_BUCKET_SIZE, overlap=True):
        if not callable(getattr(optimizer, "update", None)):
            raise TypeError(f"DistributedOptimizer wraps an optimizer (gradcore.optim), got "
                            f"{type(optimizer).__name__}")
        if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size < 1:
            raise ValueError(f"bucket_size must be a positive number of bytes, got "
                             f"{bucket_size!r}")
        self.optimizer = optimizer
        self.comm = comm
        self.bucket_size = bucket_size
        self.overlap = bool(overlap)
        self._params = []
        self._buckets = None  # planned at the first gradients
        self._bucket_of = {}
        self._started = 0  # buckets started this step: they start in order
        self._stale = False  # a gradient changed after its bucket had started
        self._checked = False
        self._names = None  # id(parameter) -> its name in the target, for messages
        self._target = None  # the optimizer's target that _params were read from
        self._hook_handles = []
        weakref.finalize(self, _remove_all, self._hook_handles)
        if optimizer.target is not None:
            self._attach()

    _own = frozenset(("optimizer", "comm", "bucket_size", "overlap", "_params", "_buckets",
                      "_bucket_of", "_started", "_stale", "_checked", "_names", "_target",
                      "_hook_handles", "__weakref__"))

    def __getattr__(self, name):  # what is not ours is the optimizer's
        if name in DistributedOptimizer._own:
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __setattr__(self, name, value):  # opt.lr = 0.01 sets the optimizer's, as it reads
        if name in DistributedOptimizer._own:
            object.__setattr__(self, name, value)
        else:
            setattr(self.optimizer, name, value)

    def __repr__(self):
        return (f"DistributedOptimizer({self.optimizer!r}, rank {self.comm.rank} of "
                f"{self.comm.size}, bucket_size={self.bucket_size})")

    def setup(self, target):
        """DeZero's style: optimize `target`'s parameters. Returns self."""
        self.optimizer.setup(target)
        self._attach()
        return self

    # ---------------------------------------------------------------- steps
    @_eager_in_replay
    def update(self):
        """Average the gradients over the ranks, then the optimizer's update (DeZero's name)."""
        self.synchronize()
        self.optimizer.update()

    @_eager_in_replay
    def step(self, closure=None):
        """Average the gradients over the ranks, then the optimizer's step (PyTorch's name)."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        self.synchronize()
        self.optimizer.update()
        return loss

    def zero_grad(self, *args, **kwargs):
        """The optimizer's zero_grad (with its arguments); buckets started for gradients now
        dropped are let go."""
        if self._round_open():
            self._abandon()
        self.optimizer.zero_grad(*args, **kwargs)

    def synchronize(self):
        """Replace every gradient with its mean over the ranks now (step and update do this)."""
        if self.optimizer.target is not self._target:  # optimizer.setup(...) since we looked
            self._attach()
        if self._buckets is None:
            self._plan()
        if not self._checked:
            self._check_same_parameters()
            self._checked = True
        # a gradient changed after its bucket started (it came late, came in a second
        # backward, or was set anew, as clip_grad_norm_ does) on some rank, perhaps not on
        # this one: every rank sums them all again
        stale = self._stale or self._set_after_start()
        if self.overlap and self.comm.size > 1:
            stale = self.comm.any_rank(stale, "the gradient all-reduce")
        if stale:
            self._abandon()
        while self._started < len(self._buckets):  # the rest, in the same order on every rank
            self._start(self._buckets[self._started])
        self.comm.reducer.wait([b.handle for b in self._buckets if b.handle is not None])
        for bucket in self._buckets:
            self._unpack(bucket)
        self._started = 0

    # ---------------------------------------------------------------- buckets
    def _attach(self):
        if self._round_open():
            self._abandon()
        _remove_all(self._hook_handles)
        self._target = self.optimizer.target
        self._params = list(self.optimizer._parameters())
        self._buckets = None
        self._bucket_of = {}
        self._checked = False  # other parameters: the ranks compare them again
        self._names = None
        if self.overlap:
            ready = weakref.WeakMethod(self._ready)  # the hooks must not keep self alive
            hook = lambda p: ready() is not None and ready()(p)  # noqa: E731
            self._hook_handles.extend(p.register_post_accumulate_grad_hook(hook)
                                      for p in self._params)

    def _plan(self):
        """Buckets of the parameters, last first, each of one backend, device and dtype."""
        unsized = [self._name(p) for p in self._params if p.data is None]
        if unsized:
            raise DistributedError(f"DistributedOptimizer: {', '.join(unsized)} not initialised "
                                   "yet: the first step comes after a forward and backward")
        buckets, run, size = [], [], 0
        for p in reversed(self._params):
            nbytes = p.size * _itemsize(p)
            if run and ((p.backend, p.device, p.dtype) != (run[0].backend, run[0].device,
                                                            run[0].dtype)
                        or size + nbytes > self.bucket_size):
                buckets.append(_Bucket(run))
                run, size = [], 0
            run.append(p)
            size += nbytes
        if run:
            buckets.append(_Bucket(run))
        self._buckets = buckets
        self._bucket_of = {id(p): b for b in buckets for p in b.params}

    def _ready(self, p):
        """p's gradient is final for this backward: start the buckets that are complete."""
        recorder = _variables.step_recorder
        if not self._checked or recorder is not None and recorder.is_active():
            return  # the first step checks the ranks first; a recorded step sums at the step
        bucket = self._bucket_of.get(id(p))
        if bucket is None:
            return
        if bucket.handle is not None:  # a second backward before the step
            self._stale = True
            return
        bucket.ready.add(id(p))
        buckets = self._buckets
        while self._started < len(buckets) and _complete(buckets[self._started]):
            self._start(buckets[self._started])
        self.comm.reducer.progress([b.handle for b in buckets[:self._started]])

    def _start(self, bucket):
        reducer = self.comm.reducer
        n = bucket.offsets[-1]
        buffer, bucket.spare = bucket.spare, None
        # last step's buffer again, unless a gradient handed out then (a view of it) is still
        # held: new multi-MB buffers every step cost page faults, and the all-reduce of a 64 MiB
        # bucket took 2.6 ms instead of mpi4py's 1.2 ms. 2: `buffer` and getrefcount's argument
        if buffer is None or sys.getrefcount(buffer) > 2:
            if reducer.on_device:
                with bucket.backend.device_context(bucket.device):
                    buffer = bucket.backend.xp.empty(n + len(bucket.params), dtype=bucket.dtype)
            else:
                buffer = numpy.empty(n + len(bucket.params), dtype=bucket.host_dtype)
        bucket.idle.clear()
        xp = bucket.backend.xp if reducer.on_device else numpy
        # each rank sends its share of the mean, so the sum is the mean: one pass over the
        # gradients instead of a copy and a division of the sums; synchronize() of the MLP's
        # 6.85 MiB took 2.7-2.9 ms instead of 4.1-4.3 (benchmarks.distributed, 2 ranks)
        share = 1 / self.comm.size
        packed = bucket.packed = []
        for k, (p, start) in enumerate(zip(bucket.params, bucket.offsets)):
            g = p.grad
            packed.append(g)
            if g is None:
                buffer[start:start + p.size] = 0
                buffer[n + k] = 0
                bucket.idle.add(id(p))
                continue
            data = g.data if reducer.on_device else p.backend.to_numpy(g.data)
            xp.multiply(data.reshape(-1), share, out=buffer[start:start + p.size])
            buffer[n + k] = 1  # summed: how many ranks had a gradient for p
        bucket.buffer = buffer
        bucket.handle = reducer.start(buffer)
        self._started += 1

    def _unpack(self, bucket):
        if self.comm.reducer.on_device:
            with bucket.backend.device_context(bucket.device):
                self._unpack_on(bucket)
        else:
            self._unpack_on(bucket)

    def _unpack_on(self, bucket):
        buffer, n = bucket.buffer, bucket.offsets[-1]
        flags = buffer[n:]
        if not self.comm.reducer.on_device:
            flags = flags.tolist()
        else:
            flags = bucket.backend.to_numpy(flags).tolist()
        for k, (p, start) in enumerate(zip(bucket.params, bucket.offsets)):
            if flags[k] == 0:  # no rank had a gradient for it
                p.grad = None
                continue
            mean = buffer[start:start + p.size].reshape(p.shape)
            if not self.comm.reducer.on_device:
                mean = backends.asarray_on(mean, p.device, p.dtype)
            p.grad = Variable(mean, requires_grad=False)
        bucket.spare = buffer
        bucket.buffer = bucket.handle = bucket.packed = None
        bucket.ready.clear()

    def _round_open(self):
        """Whether a backward since the last step has reached the parameters' hooks."""
        return self._buckets is not None and bool(
            self._started or self._stale or any(b.ready for b in self._buckets))

    def _abandon(self):
        """Sum the buckets not started yet, wait for all and let go of the sums (not used):
        another rank may have started more buckets in backward than this one, and MPI pairs
        each rank's n-th sum with the n-th of the others."""
        while self._started < len(self._buckets):
            self._start(self._buckets[self._started])
        self.comm.reducer.wait([b.handle for b in self._buckets])
        for bucket in self._buckets:
            bucket.spare, bucket.buffer, bucket.handle = bucket.buffer, None, None
            bucket.packed = None
            bucket.ready.clear()
        self._started = 0
        self._stale = False

    def _set_after_start(self):
        """Whether some parameter's gradient is another object than its started bucket holds
        (set anew after backward: clip_grad_norm_, p.grad = ...)."""
        return any(p.grad is not g for bucket in self._buckets[:self._started]
                   for p, g in zip(bucket.params, bucket.packed))

    # ---------------------------------------------------------------- checks
    def _check_same_parameters(self):
        """Raise DistributedError on every rank if the ranks' parameters differ."""
        mine = [[self._name(p), list(p.shape), str(p.dtype), _digest(p)] for p in self._params]
        everyone = self.comm.allgather_json(mine, "the parameter check")
        problems = []
        for rank, theirs in enumerate(everyone[1:], 1):
            if len(theirs) != len(everyone[0]):
                problems.append(f"rank {rank} has {len(theirs)} parameters, rank 0 "
                                f"{len(everyone[0])}")
                continue
            differ = [a[0] for a, b in zip(everyone[0], theirs) if a != b]
            if differ:
                problems.append(f"rank {rank} differs from rank 0 in {', '.join(differ[:5])}"
                                + (f" and {len(differ) - 5} more" if len(differ) > 5 else ""))
        if problems:
            raise DistributedError(
                "DistributedOptimizer: the ranks start from different parameters (" +
                "; ".join(problems) + "): call dist.broadcast_parameters(model, comm) once the "
                "model is built, on every rank, before training")

    def _name(self, p):
        names = self._names
        if names is None:
            target = self.optimizer.target
            named = getattr(target, "named_parameters", None)
            names = {id(v): k for k, v in named()} if callable(named) else {}
            self._names = names
        return names.get(id(p)) or f"parameter {self._params.index(p)} {tuple(p.shape)}"


def _itemsize(p):
    """Bytes per element of p (a floating dtype of any backend)."""
    return p.backend.xp.finfo(p.dtype).bits // 8


def _complete(bucket):
    """Whether every parameter of `bucket` has its gradient, or had none at the last step."""
    return len(bucket.ready) + len(bucket.idle - bucket.ready) == len(bucket.params)


def _digest(p):
    return hashlib.blake2b(numpy.ascontiguousarray(p.numpy()).tobytes(),
                           digest_size=8).hexdigest()


def _remove_all(handles):
    for handle in handles:
        handle.remove()
    handles.clear()
