"""DistributedOptimizer: each gradient replaced by its mean over the ranks, then the step.

Gradients travel in flat buckets: runs of consecutive parameters (last layers first, the order
backward finishes them) of one dtype and device, up to `bucket_size` bytes each, so a small
parameter does not cost a message of its own. Buckets are started in the same fixed order on
every rank, whatever order their gradients become final in, so no rank ever waits on a
collective another has not started. Each optimizer sums on a channel of its own (with MPI, a
communicator duplicated when it is made), apart from the others' and the program's
collectives: which optimizer's buckets start first in a backward may differ between the ranks,
and MPI pairs each rank's n-th collective on a communicator with the others' n-th. With
`overlap`, a bucket starts while backward goes on, as soon as its last parameter's gradient is
final (Variable.register_post_accumulate_grad_hook); parameters this rank had no gradient for
at the last step are not waited for (if one gets a gradient after all, the step sums every
bucket again, so the result is the same). Which buckets start in backward differs between
ranks; the step makes every rank start the same ones, in the same order, and the ranks vote on
summing again, so that every rank does or none does.

The plan follows the optimizer: a step that finds its parameters changed (a layer replaced, a
bias added, setup(other)), or resized or cast (p.data = a larger array, model.to(dtype=...)), or
the buffers resized or cast, plans the buckets again, and the ranks compare them anew. The first
step after a plan also compares the ranks' settings (bucket_size, overlap, buffers), whose
differences would otherwise pair sums of different lengths.

Buffers (BatchNorm's running statistics) are no gradients: each rank's forward moves its own.
At each step they are brought into agreement too, in one more all-reduce started after the
buckets (see `buffers=`).
"""
import functools
import hashlib
import itertools
import operator
import os
import sys
import warnings
import weakref

import numpy

import backends

from .. import variable as _variables
from ..config import enable_grad
from ..nn.module import Module, registry_changes
from ..optim.optimizer import Optimizer, _eager_in_replay
from ..variable import Variable, dtype_kind, note_write
from . import parameters as _broadcast
from .communicator import DistributedError

__all__ = ["DistributedOptimizer", "DEFAULT_BUCKET_SIZE", "LocalGradientWarning"]

DEFAULT_BUCKET_SIZE = 4 * 2 ** 20  # bytes
BUFFER_MODES = ("mean", "root", None)
# what a plan depends on, per parameter: a change of any makes the step plan again
_layout = operator.attrgetter("size", "dtype", "backend")


class LocalGradientWarning(UserWarning):
    """A gradient was set anew between backward and the averaging (`p.grad = p.grad * 0.5`
    before step()): each rank changed its own gradient, not the mean one process would have
    had, so training may differ from one process on the whole batch (it does not for a change
    that commutes with the mean, such as every rank dividing by the same loss scale)."""


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
    for keeps None; one that some ranks lack counts as zeros there; an integer or bool one
    (which has none) is left out of the averaging. Every other attribute
    (lr, state_dict, add_hook, `defaults`, where learning-rate schedules look for lr or Adam's
    alpha, ...) is the optimizer's.

    `bucket_size`: bytes per bucket (a parameter larger than that gets one of its own).
    `overlap`: start each bucket while backward goes on (else all at the step). Every rank must
    be given the same bucket_size, overlap and buffers: the first step compares them, and that
    every rank holds the same parameters (a digest of each), and raises DistributedError naming
    what differs (see broadcast_parameters). Parameters the optimizer gains later (a layer
    replaced the same way on every rank), or resized or cast later (p.data = a larger array,
    model.to(dtype=...)), are planned and compared at the step that finds them.
    Making one is a collective (with MPI, it sums on a communicator of its own, duplicated
    here): every rank makes each DistributedOptimizer, in the same order.

    clip_grad_norm_ and clip_grad_value_ average the gradients first (synchronize(); the step
    then sums nothing again, unless a backward ran since on some rank: the ranks vote on it), so
    `loss.backward(); clip_grad_norm_(model.parameters(), 1.0); opt.step()` clips the mean
    gradient, as one process on the whole batch would: call them on every rank. To change the
    averaged gradients otherwise, call synchronize() first; an optimizer hook (ClipGrad) sees
    them too. A gradient set anew between backward and synchronize() (or a step) is this rank's
    own: it is averaged as it is, and with overlap a LocalGradientWarning says so once; a write
    into a gradient's array may come after it was sent. In a step gradcore.compile records,
    synchronize() and the averaging of a clip run as Python at every replay, as the step does;
    a backward it replays calls no hook, so one line of its tape tells the optimizer that a
    backward ran, and the next step sums again.

    `buffers`: how the model's buffers (BatchNorm's running mean and variance), which each
    rank's forward moves on its own data, are made to agree at each step (step, update,
    synchronize), in one all-reduce of them all: "mean" (the default) averages the
    floating-point ones over the ranks and gives every rank rank 0's integer and bool ones;
    "root" gives every rank all of rank 0's; None leaves each rank its own (they drift apart,
    and save_on_root saves rank 0's). The model is the optimizer's target when it was given the
    model (`optim.SGD(model, lr=...)`, `setup(model)`), else `model=`; given only parameters and
    no `model`, there are no buffers to see. The buffers sized at the first step are the ones
    kept in agreement (the ranks check they have the same names, shapes and dtypes; one
    resized or cast later is planned and compared again); a buffer registered, removed,
    replaced or sized after it raises DistributedError. PyTorch's
    DDP instead broadcasts rank 0's buffers at every forward (broadcast_buffers=True): each
    rank's batch statistics are then used for normalising but only rank 0's enter the running
    ones; "mean" lets every rank's data count, at the step.
    """

    def __init__(self, optimizer, comm, bucket_size=DEFAULT_BUCKET_SIZE, overlap=True,
                 buffers="mean", model=None):
        if not callable(getattr(optimizer, "update", None)):
            raise TypeError(f"DistributedOptimizer wraps an optimizer (gradcore.optim), got "
                            f"{type(optimizer).__name__}")
        if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size < 1:
            raise ValueError(f"bucket_size must be a positive number of bytes, got "
                             f"{bucket_size!r}")
        if buffers not in BUFFER_MODES:
            raise ValueError(f"buffers must be 'mean', 'root' or None, got {buffers!r}")
        if model is not None and not callable(getattr(model, "named_buffers", None)):
            raise TypeError(f"DistributedOptimizer: model= is the model whose buffers to keep in "
                            f"agreement (a Module), got {type(model).__name__}")
        self.optimizer = optimizer
        self.comm = comm
        # a collective: every rank makes its optimizers, in the same order
        self._channel = comm.reducer.channel()
        if self._channel is not None:
            # freed with the optimizer: MPI has a few thousand communicators at most, and a
            # program may make optimizers in a loop
            weakref.finalize(self, comm.reducer.release, self._channel)
        self.bucket_size = bucket_size
        self.overlap = bool(overlap)
        self.buffers = buffers
        self.model = model
        self._buffers = None  # planned with the buckets
        self._params = []
        self._buckets = None  # planned at the first gradients
        self._layouts = None  # _layout of each parameter, as planned
        self._bucket_of = {}
        self._started = 0  # buckets started this step: they start in order
        self._stale = False  # a gradient changed after its bucket had started
        self._checked = False
        self._names = None  # id(parameter) -> its name in the target, for messages
        self._target = None  # the optimizer's target that _params were read from
        self._hook_handles = []
        # synchronize() ran and no backward reached a parameter since: the step sums nothing
        self._synced = False
        # synchronize() (or a clip) ran outside a step once, on every rank alike: from then on
        # whether to sum at the step is voted on, since one rank may have run a backward since
        # and another not (see _average)
        self._averaged_early = False
        # without overlap, the hooks stay from one step to the next: set once gradcore.compile
        # recorded an averaging (see _average) or a backward that reached them (_note_in_tape)
        self._hooks_stay = False
        # the Recorder of a compiled step whose tape already says that a backward reached the
        # parameters since the last averaging (see _ready); None once one averaged since
        self._noted = None
        # registry_changes when _params were read from a Module target; None: read them again
        # at every step (a list may change in place; a target of its own may list them its way)
        self._read_at = None
        self._number = next(_numbers)  # creation order: the same on every rank
        # id(parameter) -> a weak reference to its gradient as backward left it (the hooks
        # record it): one set anew before the averaging was changed on this rank alone
        self._final = {}
        self._warned = False  # LocalGradientWarning given
        weakref.finalize(self, _remove_all, self._hook_handles)
        _live.add(self)
        if optimizer.target is not None:
            self._attach()

    _own = frozenset(("optimizer", "comm", "bucket_size", "overlap", "buffers", "model",
                      "_params", "_buckets", "_bucket_of", "_started", "_stale", "_checked",
                      "_names", "_target", "_hook_handles", "_buffers", "_synced",
                      "_averaged_early", "_hooks_stay", "_noted", "_read_at", "_number",
                      "_final", "_warned", "_channel", "_layouts", "__weakref__"))

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
        """DeZero's style: optimize `target`'s parameters. Returns self. After a step, a
        collective with overlap (the ranks agree on the buckets a backward started): call it on
        every rank."""
        self.optimizer.setup(target)
        self._attach()
        return self

    # ---------------------------------------------------------------- steps
    @_eager_in_replay
    def update(self):
        """Average the gradients over the ranks, then the optimizer's update (DeZero's name)."""
        self._average_for_step()
        self.optimizer.update()

    @functools.partial(_eager_in_replay, closure_first=True)
    def step(self, closure=None):
        """Average the gradients over the ranks, then the optimizer's step (PyTorch's name)."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        self._average_for_step()
        self.optimizer.update()
        return loss

    def zero_grad(self, *args, **kwargs):
        """The optimizer's zero_grad (with its arguments). Buckets a backward started for the
        gradients now dropped are let go of at the next step, on every rank together, and the
        step sums every bucket again."""
        if self._started:
            # not finished here: a backward this rank alone ran (for logging, say) started them
            # on this rank only, and MPI would pair them with the others' next sums. The step's
            # vote on stale buckets makes every rank let go of its own and sum again
            self._stale = True
        elif self._buckets is not None:
            for bucket in self._buckets:
                bucket.ready.clear()
        self._step_taken()
        self.optimizer.zero_grad(*args, **kwargs)

    def synchronize(self):
        """Replace every gradient with its mean over the ranks, and bring the buffers into
        agreement (see `buffers`), now. step() and update() do this themselves, unless
        synchronize() ran since the last backward on every rank: call it before the step to
        change the averaged gradients (clip_grad_norm_ calls it), and the step uses them as they
        are. A backward between the two, on any rank, is summed again at the step. In a step
        gradcore.compile records, it runs as Python at every replay, as the step does."""
        _python_in_replays(functools.partial(self._average, unless_averaged=False))

    def _average(self, unless_averaged, in_compiled_step=False, stepping=False):
        """synchronize(); with `unless_averaged` (a step, a clip), nothing when no rank ran a
        backward since the last averaging. Each rank knows only its own backwards: once the
        program has averaged outside a step, the ranks vote on it (in the vote on stale
        buckets, with overlap), so that every rank sums or none does. Before that no rank has
        averaged since its last step, and every rank sums.

        `in_compiled_step`: run by a line of a step gradcore.compile recorded. Without overlap
        the hooks then stay on from step to step: a replayed backward calls none (keeping them
        costs nothing there), whereas adding them here and removing them at each step changes
        the parameters' hooks, after which gradcore.compile records the step again.
        `stepping`: called by step() or update(), which take it from there."""
        self._follow_parameters()
        if self._buckets is None:
            self._plan()
        if not self._checked:
            self._check_same_parameters()
            self._checked = True
        if _broadcast.random_states_lent() and _variables.step_recorder is None:
            # lazy layers broadcast before their first call draw root's weights: once all are
            # sized, each rank draws from its own generators again (not while gradcore.compile
            # records a step, whose draws must lead where the recording ends)
            _broadcast.restore_random_states()
        self._warn_if_set_here()
        # a gradient changed after its bucket started (it came late, came in a second
        # backward, or was set anew, `p.grad = ...`) on some rank, perhaps not on
        # this one: every rank sums them all again
        stale = self._stale or self._set_after_start()
        needed = not (unless_averaged and self._synced)
        vote = unless_averaged and self._averaged_early
        if self.comm.size > 1 and (self.overlap or vote):
            stale, needed = self.comm.any_ranks([stale, needed], "the gradient all-reduce")
        if not stepping:
            self._averaged_early = True  # every rank's program averages here alike
        if not needed:  # no rank ran a backward since: no bucket has started either
            return
        if stale:
            self._abandon()
        self._persist_lazy()
        while self._started < len(self._buckets):  # the rest, in the same order on every rank
            self._start(self._buckets[self._started])
        handles = [b.handle for b in self._buckets if b.handle is not None]
        if self._buffers is not None:  # after every bucket: the same order on every rank
            handle = self._buffers.start(self.comm, self._channel)
            if handle is not None:
                handles.append(handle)
        self.comm.reducer.wait(handles)
        for bucket in self._buckets:
            self._unpack(bucket)
        if self._buffers is not None and self._buffers.buffer is not None:
            self._buffers.unpack(self.comm)
        self._started = 0
        self._final.clear()
        self._synced = True
        self._noted = None  # a backward a step records from here on says so again
        if not stepping:
            self._hooks_stay = self._hooks_stay or in_compiled_step
            self._hook()  # without overlap, only until the step: to see a backward before it

    def _average_for_step(self):
        """Average for the step, unless the program did since the last backward (to clip the
        averaged gradients): summing them again would cost a second all-reduce."""
        self._average(unless_averaged=True, stepping=True)
        self._step_taken()

    def _step_taken(self):
        """The next step averages again; without overlap, no hooks until then (each backward
        pays a pass over its graph while a leaf has one)."""
        self._synced = False
        self._final.clear()
        if _variables.step_recorder is not None:  # a step or zero_grad compiled: _note_in_tape
            self._hooks_stay = True
        if not self.overlap and not self._hooks_stay:
            _remove_all(self._hook_handles)

    # ---------------------------------------------------------------- buckets
    def _attach(self):
        self._end_round()
        _remove_all(self._hook_handles)
        self._target = self.optimizer.target
        count = registry_changes[0]  # before the walk: a change during it is seen next time
        self._params = list(self.optimizer._parameters())
        self._read_at = count if _lists_registered(self.optimizer, self._target) else None
        self._buckets = None
        self._bucket_of = {}
        self._checked = False  # other parameters: the ranks compare them again
        self._names = None
        self._synced = False
        self._final.clear()
        if self.overlap:
            self._hook()

    def _hook(self):
        """Call _ready for each parameter as backward finishes its gradient (once hooked)."""
        if self._hook_handles:
            return
        ready = weakref.WeakMethod(self._ready)  # the hooks must not keep self alive
        hook = lambda p: ready() is not None and ready()(p)  # noqa: E731
        # an integer or bool parameter (an index table) never has a gradient to wait for
        self._hook_handles.extend(p.register_post_accumulate_grad_hook(hook) for p in self._params
                                  if p.data is None or dtype_kind(p.backend, p.dtype) == "float")

    def _end_round(self):
        """Let go of the buckets a backward started, before the plan is dropped: with overlap
        they may have started on some ranks only, so every rank finishes them, in the same
        order, or none does."""
        round_open = self._round_open()
        if self._checked and self.overlap and self.comm.size > 1:
            round_open = self.comm.any_rank(round_open, "the gradient all-reduce")
        if round_open:
            self._abandon()

    def _follow_parameters(self):
        """Plan again if the optimizer's parameters are others than those planned (setup(other),
        a layer replaced, a bias added): its step reads them anew each time, and a parameter
        left out of the buckets would be trained on each rank's own gradient. Also if one was
        resized or cast, or a buffer kept in agreement was (model.to(dtype=...)): the buckets'
        offsets and dtypes are the plan's."""
        if self._current_parameters() is self._params and not self._layout_changed():
            return
        self._attach()

    def _layout_changed(self):
        """Whether a planned parameter or buffer has another size, dtype or backend now, or a
        parameter none (p.data = None: the plan then says it is not initialised)."""
        if self._buckets is None:
            return False
        try:
            layouts = list(map(_layout, self._params))
        except AttributeError:  # None has no size
            return True
        return layouts != self._layouts or self._buffers is not None and self._buffers.changed()

    def _current_parameters(self):
        """The optimizer's parameters as its step reads them now: `_params` itself while they
        are the same ones. A model's are walked again only once a Module somewhere registered
        or removed something (registry_changes): a walk of 100 parameters took 74 us, a fifth
        of SGD's update of them, at every step and twice more for a clip."""
        if self.optimizer.target is not self._target:
            return self.optimizer._parameters()
        count = registry_changes[0]
        if self._read_at == count:
            return self._params
        params = self.optimizer._parameters()
        if len(params) != len(self._params) or not all(map(operator.is_, params, self._params)):
            return params
        if self._read_at is not None:
            self._read_at = count  # another module changed, or this one and back
        return self._params

    def _plan(self):
        """Buckets of the parameters, last first, each of one backend, device and dtype."""
        unsized = [self._name(p) for p in self._params if p.data is None]
        if unsized:
            raise DistributedError(f"DistributedOptimizer: {', '.join(unsized)} not initialised "
                                   "yet: the first step comes after a forward and backward "
                                   "(a layer the forward never calls is never sized: leave its "
                                   "parameters out of the optimizer)")
        # an integer or bool parameter (an index table) never has a gradient
        floating = [p for p in self._params if dtype_kind(p.backend, p.dtype) == "float"]
        buckets, run, size = [], [], 0
        for p in reversed(floating):
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
        self._layouts = list(map(_layout, self._params))
        model = self.model if self.model is not None else self.optimizer.target
        named = getattr(model, "named_buffers", None)
        self._buffers = None
        if self.buffers is not None and callable(named):  # also with none yet: one may come
            self._buffers = _Buffers(named, self.buffers, self.comm)

    def _ready(self, p):
        """p's gradient is final for this backward: noted, and with overlap the buckets that
        are complete start."""
        self._synced = False  # a backward since synchronize(): the step sums again
        recorder = _variables.step_recorder
        recording = recorder is not None and recorder.is_active()
        if recording:
            self._note_in_tape(recorder)
        if p.grad is not None:
            self._final[id(p)] = weakref.ref(p.grad)  # not kept alive once replaced
        if not self.overlap:
            return
        if not self._checked or recording:
            return  # the first step checks the ranks first; a recorded step sums at the step
        if p.backend.lazy:
            return  # Dask: the step computes every gradient together (see _persist_lazy)
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

    def _note_in_tape(self, recorder):
        """A backward that gradcore.compile records reached the parameters. A replay calls no
        hook: a line of the tape clears _synced instead (one per averaging is enough). Without
        overlap the hooks stay from now on: removed at the step and added again by the next
        synchronize() or clip, they would change at every call, and a step whose Variables'
        hooks changed records again instead of replaying."""
        self._hooks_stay = True
        if self._noted is not recorder:
            self._noted = recorder
            recorder.opaque(functools.partial(_backward_ran, weakref.ref(self)), ())

    def _persist_lazy(self):
        """Work out the lazy (Dask) gradients of the buckets still to start, and the lazy
        buffers, in one pass: packing reads each array on its own, and each read would run the
        forward and backward again (ClipGrad does the same)."""
        grads = [p for bucket in self._buckets[self._started:] if bucket.backend.lazy
                 for p in bucket.params if p.grad is not None]
        buffers = [] if self._buffers is None else [v for _, v in self._buffers.named
                                                     if v.backend.lazy and v.data is not None]
        if not grads and not buffers:
            return
        backend = (grads or buffers)[0].backend
        done = iter(backend.persist([p.grad.data for p in grads] + [v.data for v in buffers]))
        for p in grads:  # the same values: the gradient, not one set anew
            p.grad = Variable(next(done), requires_grad=False)
        for v in buffers:
            v._data = next(done)

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
        for k, (p, start, end) in enumerate(zip(bucket.params, bucket.offsets,
                                                bucket.offsets[1:])):
            g = p.grad
            packed.append(g)
            # another size: p was resized since the plan (in backward, before the step saw it),
            # and the step plans again before any sum of this plan is used
            if g is None or g.size != end - start:
                buffer[start:end] = 0
                buffer[n + k] = 0
                bucket.idle.add(id(p))
                continue
            data = g.data if reducer.on_device else p.backend.to_numpy(g.data)
            xp.multiply(data.reshape(-1), share, out=buffer[start:end])
            buffer[n + k] = 1  # summed: how many ranks had a gradient for p
        bucket.buffer = buffer
        bucket.handle = reducer.start(buffer, self._channel)
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
        (set anew after backward: p.grad = ...)."""
        return any(p.grad is not g for bucket in self._buckets[:self._started]
                   for p, g in zip(bucket.params, bucket.packed))

    # ---------------------------------------------------------------- checks
    def _warn_if_set_here(self):
        """LocalGradientWarning (once) if a gradient was set anew since backward left it, before
        the averaging: each rank then changed its own."""
        if self._warned or not self._final or self.comm.size == 1:
            return
        final = self._final
        changed = [self._name(p) for p in self._params
                   if id(p) in final and p.grad is not None and p.grad is not final[id(p)]()]
        if not changed:
            return
        self._warned = True
        warnings.warn(
            f"DistributedOptimizer: the gradient{'s' if len(changed) > 1 else ''} of "
            f"{_few(changed)} {'were' if len(changed) > 1 else 'was'} set anew after backward, "
            "before the ranks' gradients were averaged: each rank changed its own, so training "
            "may differ from one process on the whole batch (it does not where every rank "
            "makes a change that commutes with the mean, such as dividing by the same loss "
            "scale). To change the averaged gradients instead, and silence this warning, call "
            "opt.synchronize() after backward and before the change; the step then sums "
            "nothing again. If each rank's own change is what you want, filter "
            "gradcore.distributed.LocalGradientWarning", LocalGradientWarning,
            stacklevel=_program_level())

    def _check_same_parameters(self):
        """Raise DistributedError on every rank if the ranks' settings (bucket_size, overlap,
        buffers, and the buckets planned from them), parameters, or the names, shapes and
        dtypes of the buffers they keep in agreement differ: before any bucket starts, since
        sums of different lengths would wait for each other until the deadline."""
        settings = {"bucket_size": self.bucket_size, "overlap": self.overlap,
                    "buffers": self.buffers}
        plan = [len(bucket.params) for bucket in self._buckets]
        mine = [[self._name(p), list(p.shape), str(p.dtype), _digest(p)] for p in self._params]
        buffers = [] if self._buffers is None else self._buffers.described()
        everyone = self.comm.allgather_json([settings, plan, mine, buffers],
                                            "the parameter check")
        _check_same_settings([s for s, _, _, _ in everyone])
        plans = [p for _, p, _, _ in everyone]
        theirs_buffers = [b for _, _, _, b in everyone]
        everyone = [m for _, _, m, _ in everyone]
        differ = [rank for rank, b in enumerate(theirs_buffers) if b != theirs_buffers[0]]
        if differ:
            raise DistributedError(
                f"DistributedOptimizer: the ranks' models have different buffers (rank "
                f"{differ[0]} has {_listed(theirs_buffers[differ[0]])}, rank 0 "
                f"{_listed(theirs_buffers[0])}): build the same model on every rank and run "
                "the same forward before the first step, or pass buffers=None")
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
            given_back = (
                ". The ranks draw from their own random generators again since an earlier step "
                "(every lazy model broadcast before it was sized by then): a layer sized after "
                "that, in a model not broadcast again before its first call, draws other "
                "weights on each rank" if _broadcast._given_back[0] else "")
            raise DistributedError(
                "DistributedOptimizer: the ranks start from different parameters (" +
                "; ".join(problems) + "): call dist.broadcast_parameters(model, comm) once the "
                "model is built, on every rank, before training (and change the model the same "
                "way on every rank)" + given_back)
        if any(p != plans[0] for p in plans):  # follows from the above: a last safeguard
            raise DistributedError(
                "DistributedOptimizer: the ranks planned different buckets (parameters per "
                f"bucket: {_by_rank(plans)}): give every rank the same model, on the same kind "
                "of device, in the same dtypes")

    def _name(self, p):
        names = self._names
        if names is None:
            target = self.optimizer.target
            named = getattr(target, "named_parameters", None)
            names = {id(v): k for k, v in named()} if callable(named) else {}
            self._names = names
        shape = "" if p.data is None else f" {tuple(p.shape)}"  # a lazy layer's, not sized yet
        return names.get(id(p)) or f"parameter {self._params.index(p)}{shape}"


class _Buffers:
    """A model's buffers sized at the plan, brought into agreement over the ranks at each step
    in one all-reduce of float64 (exact for float16/32 and for integers up to 2**53): each rank
    sends its share (1 / size) of a buffer averaged, and rank 0 its values of a buffer taken
    from it, where the others send zeros. `source` is the model's named_buffers: each step
    checks that the model still has the buffers planned, and no others."""

    def __init__(self, source, mode, comm):
        # registry_changes when the model's buffers were last found as planned; None: look at
        # every step (a model that lists its buffers its own way)
        self.read_at = registry_changes[0] if _walks_own(source, Module.named_buffers) else None
        named = list(source())
        self.source = source
        self.planned = dict(named)  # name -> Variable, sized or not
        self.named = [(name, v) for name, v in named if v.data is not None]
        self.unsized = [(name, v) for name, v in named if v.data is None]
        self.kinds = [(tuple(v.shape), v.dtype) for _, v in self.named]
        self.averaged = [mode == "mean" and dtype_kind(v.backend, v.dtype) == "float"
                         for _, v in self.named]
        self.offsets = numpy.cumsum([0] + [v.size for _, v in self.named]).tolist()
        self.buffer = None
        self.host_dtypes = None
        if comm.reducer.on_device and self.named:
            first = self.named[0][1]
            elsewhere = [n for n, v in self.named if (v.backend, v.device) != (first.backend,
                                                                              first.device)]
            if elsewhere:
                raise DistributedError(
                    f"DistributedOptimizer: the buffers {', '.join(elsewhere)} are not on "
                    f"{first.device} with {self.named[0][0]}: NCCL sums them on one GPU; move "
                    "the model with model.to(dist.local_device(comm))")

    def _check_same_buffers(self):
        """DistributedError if the model gained, lost or replaced a buffer since the plan: the
        ranks agree on the buffers planned, and a new one would drift apart unseen."""
        count = registry_changes[0]
        if self.read_at == count:  # no Module registered or removed anything since
            return
        planned, now = self.planned, dict(self.source())
        if now.keys() == planned.keys() and all(v is planned[n] for n, v in now.items()):
            if self.read_at is not None:
                self.read_at = count
            return
        changes = [f"{n} registered" for n in now if n not in planned]
        changes += [f"{n} removed" for n in planned if n not in now]
        changes += [f"{n} replaced by another Variable" for n in now
                    if n in planned and now[n] is not planned[n]]
        raise DistributedError(
            f"DistributedOptimizer: the model's buffers changed after the first step "
            f"({', '.join(changes)}): the ranks keep the buffers they had then in agreement; "
            "register every buffer before the first step (set .data to change one's values), "
            "or pass buffers=None")

    def described(self):
        """[name, shape, dtype] of each buffer: the ranks compare them."""
        return [[name, list(shape), str(dtype)] for (name, _), (shape, dtype)
                in zip(self.named, self.kinds)]

    def changed(self):
        """Whether a planned buffer has another shape or dtype now (model.to(dtype=...)): the
        optimizer plans again, and the ranks compare the buffers anew."""
        return any(v.data is not None and (tuple(v.shape), v.dtype) != kind
                   for (_, v), kind in zip(self.named, self.kinds))

    def start(self, comm, channel):
        """Pack the buffers and start their all-reduce on `channel` (the optimizer's); returns
        its handle (None: none is sized)."""
        self._check_same_buffers()
        for (name, v), (shape, dtype) in zip(self.named, self.kinds):
            if v.data is None:
                raise DistributedError(
                    f"DistributedOptimizer: the buffer {name} was emptied since the first step "
                    f"(it was {shape} {dtype}): the ranks keep the buffers they had then in "
                    "agreement; give it data again (the same on every rank), or pass "
                    "buffers=None")
        for name, v in self.unsized:
            if v.data is not None:
                raise DistributedError(
                    f"DistributedOptimizer: the buffer {name} was sized after the first step: "
                    "run a forward through every layer before the first step, so the ranks "
                    "agree on the buffers, or pass buffers=None")
        if not self.named:
            return None
        on_device = comm.reducer.on_device
        n = self.offsets[-1]
        if on_device:
            backend, device = self.named[0][1].backend, self.named[0][1].device
            with backend.device_context(device):
                self._pack(backend.xp, backend.xp.empty(n, dtype="float64"), comm, True)
        else:
            self._pack(numpy, numpy.empty(n, dtype=numpy.float64), comm, False)
        return comm.reducer.start(self.buffer, channel)

    def _pack(self, xp, buffer, comm, on_device):
        share = 1 / comm.size
        self.host_dtypes = []
        for (_, v), start, averaged in zip(self.named, self.offsets, self.averaged):
            data = v.data if on_device else v.backend.to_numpy(v.data)
            self.host_dtypes.append(data.dtype)
            part = buffer[start:start + v.size]
            if averaged:
                # in float64 (a float32 buffer times a Python float computes in float32): a
                # share rounded to the buffer's dtype makes the mean of equal values differ
                part[...] = data.reshape(-1)
                part *= share
            elif comm.rank == 0:
                part[...] = data.reshape(-1)
            else:
                part[...] = 0
        self.buffer = buffer

    def unpack(self, comm):
        """Each buffer's new values from the summed buffer (after the all-reduce's wait),
        written into its array as BatchNorm writes them: whoever holds the array sees them."""
        buffer, self.buffer = self.buffer, None
        for (_, v), start, dtype in zip(self.named, self.offsets, self.host_dtypes):
            part = buffer[start:start + v.size].reshape(v.shape).astype(dtype)
            if not comm.reducer.on_device:
                part = backends.asarray_on(part, v.device, v.dtype)
            with v.backend.device_context(v.device):
                v.backend.assign(v.data, part)  # Dask: persisted with the step's parameters
            note_write(v)


def _check_same_settings(everyone):
    """DistributedError naming each setting whose value differs between the ranks, given each
    rank's dict of settings."""
    differ = [key for key in everyone[0] if any(s[key] != everyone[0][key] for s in everyone)]
    if differ:
        raise DistributedError(
            "DistributedOptimizer: the ranks were given different settings (" +
            "; ".join(f"{key} {_by_rank([s[key] for s in everyone])}" for key in differ) +
            "): give DistributedOptimizer the same bucket_size, overlap and buffers on every "
            "rank")


def _by_rank(values):
    """'40 on rank 0, 1000000 on ranks 1, 2': each value with the ranks that have it."""
    groups = {}
    for rank, value in enumerate(values):
        groups.setdefault(repr(value), []).append(rank)
    return ", ".join(f"{value} on rank{'s' if len(ranks) > 1 else ''} {_few(ranks)}"
                     for value, ranks in groups.items())


def _few(items, most=5):
    """'a, b, c' or 'a, b, c, d, e and 7 more', for messages."""
    shown = ", ".join(map(str, items[:most]))
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def _program_level():
    """warnings.warn's stacklevel, called where it is, for the program's line that led here
    (the first frame outside gradcore): step() and synchronize() reach it at other depths."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1  # warn's caller (our caller) is stacklevel 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _listed(described):
    """Buffers as the ranks describe them, for a message."""
    return ", ".join(f"{name} {tuple(shape)} {dtype}" for name, shape, dtype in described) \
        or "none"


def _itemsize(p):
    """Bytes per element of p (a floating dtype of any backend)."""
    return p.backend.xp.finfo(p.dtype).bits // 8


def _complete(bucket):
    """Whether every parameter of `bucket` has its gradient, or had none at the last step."""
    return len(bucket.ready) + len(bucket.idle - bucket.ready) == len(bucket.params)


def _digest(p):
    return hashlib.blake2b(numpy.ascontiguousarray(p.numpy()).tobytes(),
                           digest_size=8).hexdigest()


_live = weakref.WeakSet()  # every DistributedOptimizer, for average_before_reading
_numbers = itertools.count()  # DistributedOptimizer._number: the order they were made in


def average_before_reading(params):
    """Average the gradients of each DistributedOptimizer of several ranks over some of
    `params` (a list), unless no rank ran a backward since it last did: clip_grad_norm_ and
    clip_grad_value_ call this, so that `backward(); clip_grad_norm_(...); step()` clips the
    mean gradient, as one process on the whole batch would (and as PyTorch's DDP, whose
    backward leaves the mean). A collective: every rank must call them."""
    if not _live:
        return
    ids = {id(p) for p in params}
    # in the order they were made, the same on every rank: MPI pairs each rank's n-th sum with
    # the others' n-th (a WeakSet's order follows addresses, which differ between processes)
    averaging = [opt for opt in sorted(list(_live), key=operator.attrgetter("_number"))
                 if opt.comm.size > 1 and opt.optimizer.target is not None
                 and any(id(p) in ids for p in opt._current_parameters())]
    if not averaging:
        return
    _python_in_replays(functools.partial(_average_each, averaging))


def _average_each(optimizers, in_compiled_step=False):
    for opt in optimizers:
        opt._average(unless_averaged=True, in_compiled_step=in_compiled_step)


def _backward_ran(optimizer):
    """What _ready notes of a backward, at a replay of a step gradcore.compile recorded (the
    weak reference `optimizer`: a tape must not keep it alive): the next step sums again."""
    optimizer = optimizer()
    if optimizer is not None:
        optimizer._synced = False


def _python_in_replays(average):
    """Call `average` (a partial taking in_compiled_step=) now. In a step gradcore.compile
    records, as one opaque line of its tape, which runs it as Python at every replay, as the
    optimizer's step: the all-reduce reads the gradients on the host, which a tape cannot, and
    the ops after it (a clip's) replay with the averaged gradients."""
    recorder = _variables.step_recorder
    if recorder is not None and recorder.is_active():
        recorder.opaque(functools.partial(average, in_compiled_step=True), ())
    else:
        average()


def _lists_registered(optimizer, target):
    """Whether `optimizer`'s parameters are what Module's own walk of `target` yields, which
    changes only with registry_changes: not for a list (it may change in place), a target
    that is no Module, or one (or an optimizer) that lists them its own way."""
    return (isinstance(target, Module)
            and getattr(optimizer._parameters, "__func__", None) is Optimizer._parameters
            and _walks_own(target.parameters, Module.parameters)
            and _walks_own(target.named_parameters, Module.named_parameters))


def _walks_own(method, function):
    """Whether the bound `method` is Module's `function`, walking Module's own registry
    (neither it nor Module._entries overridden)."""
    owner = getattr(method, "__self__", None)
    return (getattr(method, "__func__", None) is function and isinstance(owner, Module)
            and getattr(owner._entries, "__func__", None) is Module._entries)


def _remove_all(handles):
    for handle in handles:
        handle.remove()
    handles.clear()
