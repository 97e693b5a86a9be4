"""gradcore.distributed in one process (a job of one rank, no launcher): what it promises that
does not need several processes, and its errors."""
import copy
import gc
import sys
import time
import warnings
import weakref

import numpy as np
import pytest

import backends
import gradcore
import gradcore.distributed as dist
import gradcore.functions as F
from gradcore import nn, optim
from gradcore.dataloaders import DataLoader
from gradcore.datasets import Dataset, Spiral

pytest.importorskip("mpi4py", reason="needs the mpi extra: pip install 'gradcore[mpi]'")


@pytest.fixture(scope="module")
def comm():
    return dist.init()


def test_one_process_is_a_job_of_one_rank(comm):
    assert (comm.rank, comm.size, comm.local_rank, comm.backend) == (0, 1, 0, "mpi")
    assert dist.init() is comm  # made once
    assert dist.local_device(comm) == ("cuda:0" if backends.cuda_available() else "cpu")
    assert repr(comm) == "Communicator(rank=0, size=1, local_rank=0, backend='mpi')"


def test_one_rank_trains_as_the_optimizer_alone(comm, xp):
    x = gradcore.Variable(np.random.RandomState(0).randn(16, 4).astype(np.float32)).to(xp.device)
    t = gradcore.Variable(np.arange(16) % 3).to(xp.device)
    finals = []
    for wrap in (False, True):
        gradcore.manual_seed(0)
        model = nn.MLP((8, 3)).to(xp.device)
        model(x)
        opt = optim.Adam(model.parameters(), lr=0.01)
        if wrap:
            dist.broadcast_parameters(model, comm)
            opt = dist.DistributedOptimizer(opt, comm, bucket_size=64)
        for _ in range(5):
            loss = F.softmax_cross_entropy(model(x), t)
            opt.zero_grad()
            loss.backward()
            opt.step()
        finals.append([p.numpy() for p in model.parameters()])
        assert all(p.device == xp.device and p.grad.device == xp.device
                   for p in model.parameters())
    for a, b in zip(*finals):
        np.testing.assert_array_equal(a, b)


def test_distributed_optimizer_passes_the_rest_to_its_optimizer(comm):
    model = nn.Linear(2, in_size=3)
    inner = optim.SGD(model.parameters(), lr=0.25)
    opt = dist.DistributedOptimizer(inner, comm)
    assert opt.lr == 0.25 and opt.state_dict() == inner.state_dict()
    opt.lr = 0.5  # a schedule written against the optimizer works on the wrapper
    assert inner.lr == 0.5 and opt.lr == 0.5
    scheduler = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scheduler.step()
    assert inner.lr == 0.25
    assert "DistributedOptimizer(SGD(" in repr(opt) and "rank 0 of 1" in repr(opt)


@pytest.mark.parametrize("style", ["step", "update"])
def test_a_schedule_on_a_wrapped_adam_schedules_alpha(comm, style):
    # schedules find the step size in optimizer.defaults: the wrapper's are Adam's
    x = gradcore.Variable(np.arange(6.0).reshape(2, 3))
    finals = []
    for wrap in (False, True):
        gradcore.manual_seed(0)
        model = nn.Linear(2, in_size=3, dtype="float64")
        opt = optim.Adam(model.parameters(), alpha=0.1)
        if wrap:
            opt = dist.DistributedOptimizer(opt, comm)
            assert opt.defaults is optim.Adam.defaults
        scheduler = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
        assert scheduler.name == "alpha"
        for _ in range(3):
            opt.zero_grad()
            F.sum(model(x) ** 2).backward()
            opt.step() if style == "step" else opt.update()
            scheduler.step()
        assert abs(opt.alpha - 1e-4) < 1e-16
        finals.append(model.W.numpy())
    np.testing.assert_array_equal(*finals)


def test_a_compiled_step_sums_at_every_replay(comm):
    x = np.random.RandomState(1).randn(8, 3).astype(np.float32)
    results = []
    for compiled in (False, True):
        gradcore.manual_seed(0)
        model = nn.Linear(2, in_size=3)
        opt = dist.DistributedOptimizer(optim.SGD(model.parameters(), lr=0.1), comm)

        def step(x):
            loss = F.sum(model(x) ** 2)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss
        if compiled:
            step = gradcore.compile(step)
        losses = [step(gradcore.Variable(x)).item() for _ in range(5)]
        results.append((losses, model.W.numpy()))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_argument_errors(comm):
    model = nn.Linear(2, in_size=3)
    with pytest.raises(TypeError, match="wraps an optimizer"):
        dist.DistributedOptimizer(model, comm)
    with pytest.raises(ValueError, match="bucket_size must be a positive number of bytes"):
        dist.DistributedOptimizer(optim.SGD(model.parameters()), comm, bucket_size=0)
    with pytest.raises(ValueError, match="backend must be 'mpi' or 'nccl'"):
        dist.init("gloo")
    with pytest.raises(ValueError, match="the dataset is empty"):
        dist.scatter_dataset([], comm)


class _Scaled(Dataset):
    """Raw rows in `data`, served scaled by its own __getitem__."""

    def prepare(self):
        self.data = np.arange(6, dtype=np.float32)[:, None]
        self.label = np.arange(6)

    def __getitem__(self, i):
        return self.data[i] * 100, int(self.label[i]) + 1000


class _Listed(Dataset):
    """The base __getitem__ over Python lists."""

    def prepare(self):
        self.data = [np.array([i], np.float32) for i in range(5)]
        self.label = list(range(5))


@pytest.mark.parametrize("make", [_Scaled, _Listed, Spiral])
def test_a_share_serves_what_the_dataset_serves(comm, make):
    dataset = make()
    share = dist.scatter_dataset(dataset, comm)  # one rank: every example, in order
    assert len(share) == len(dataset)
    for i in (0, 4):
        (x, t), (x_share, t_share) = dataset[i], share[i]
        np.testing.assert_array_equal(x_share, x)
        assert t_share == t
    batch, share_batch = (next(iter(DataLoader(d, 3, shuffle=False))) for d in (dataset, share))
    for a, b in zip(batch, share_batch):
        np.testing.assert_array_equal(b, a)
    # rows of arrays through the base __getitem__ are copied, to be batched by one fancy index
    assert type(share).__name__ == ("Share" if make is Spiral else "IndexedShare")


def test_without_mpi4py_the_error_says_what_to_install(monkeypatch):
    from gradcore.distributed import communicator
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(ImportError, match=r"pip install 'gradcore\[mpi\]'.*mpiexec -n 2"):
        communicator._import_mpi()


def test_bucket_buffers_are_reused_only_when_no_gradient_from_them_is_held(comm):
    model = nn.Linear(2, in_size=3)
    opt = dist.DistributedOptimizer(optim.SGD(model.parameters(), lr=0.1), comm)
    x = gradcore.Variable(np.ones((4, 3), np.float32))

    def step(scale):
        opt.zero_grad()
        F.sum(model(x) * scale).backward()
        opt.step()
    step(1.0)
    bucket, = opt._buckets
    held = model.W.grad  # a view of this step's buffer, kept by the program
    kept = held.numpy().copy()
    first = bucket.spare
    step(2.0)
    np.testing.assert_array_equal(held.numpy(), kept)  # not overwritten by the next step
    assert bucket.spare is not first
    del held
    second = weakref.ref(bucket.spare)  # watched, not held
    step(3.0)  # nothing holds the last step's gradients: its buffer serves again
    assert bucket.spare is second()
    np.testing.assert_array_equal(model.W.grad.numpy(), np.full((3, 2), 12.0))


class _RankOfThree:
    """The one-rank communicator posing as rank 0 of 3 whose two other ranks send the same
    buckets: the all-reduce triples each buffer (on the host, or "on the device" as NCCL's
    reducer sums, with the bucket's own array library)."""

    size = 3

    def __init__(self, comm, on_device):
        self._comm = comm
        self.reducer = self
        self.on_device = on_device

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def channel(self):
        return None

    def release(self, channel):
        pass

    def start(self, buffer, channel=None):
        buffer *= 3
        return "started"

    def progress(self, handles):
        pass

    def wait(self, handles, what=None):
        pass


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "device"])
def test_gradients_are_averaged_and_a_gradient_no_rank_had_stays_none(comm, on_device):
    model = nn.MLP((5, 2))
    x = gradcore.Variable(np.random.RandomState(1).randn(4, 3).astype(np.float32))
    model(x)
    opt = dist.DistributedOptimizer(optim.SGD(model.parameters(), lr=0.1),
                                    _RankOfThree(comm, on_device), bucket_size=64)
    F.sum(model.l0(x)).backward()  # the last layer gets no gradient on any rank
    own = {name: p.grad.numpy().copy() for name, p in model.named_parameters()
           if p.grad is not None}
    opt.synchronize()
    for name, p in model.named_parameters():
        if name in own:  # each rank sent a third of the same gradient: 2 roundings in float32
            np.testing.assert_allclose(p.grad.numpy(), own[name], rtol=2.4e-7, atol=0)
        else:
            assert p.grad is None, name
    assert sorted(own) == ["l0.W", "l0.b"]


class _RankOfThreeAlone(_RankOfThree):
    """Rank 0 of 3 whose two other ranks send no gradients: each mean is a third of rank 0's."""

    def start(self, buffer, channel=None):
        return "started"


class _Counting(_RankOfThree):
    """_RankOfThree counting the sums it starts."""

    def __init__(self, comm, on_device):
        super().__init__(comm, on_device)
        self.started = 0

    def start(self, buffer, channel=None):
        self.started += 1
        return super().start(buffer, channel)


def _closure_step(model, opt, compiled):
    """A training step through opt.step(closure), compiled or not."""
    def step(x):
        def closure():
            opt.zero_grad()
            loss = F.sum(model(x) ** 2)
            loss.backward()
            return loss
        return opt.step(closure)
    return gradcore.compile(step) if compiled else step


def test_a_compiled_step_with_a_closure_records_it_and_sums_at_every_replay(comm):
    x = np.random.RandomState(1).randn(8, 3).astype(np.float32)
    results = []
    for compiled in (False, True):
        gradcore.manual_seed(0)
        model = nn.Linear(2, in_size=3)
        counting = _Counting(comm, on_device=False)
        # 16 bytes: W and b in buckets of their own
        opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1), counting, bucket_size=16)

        step = _closure_step(model, opt, compiled)
        losses = [step(gradcore.Variable(x)).item() for _ in range(5)]
        results.append((losses, model.W.numpy(), counting.started))
    assert step.stats()["replays"] == 4
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])
    assert results[0][2] == results[1][2] == 2 * 5  # both buckets at every step


def test_a_distributed_optimizers_subclass_with_a_step_of_its_own_runs_eagerly_compiled(comm):
    """Its step is not one a tape knows to replay (it decays the step size here): the compiled
    step runs eagerly, and trains as the eager one."""
    x = np.random.RandomState(1).randn(8, 3).astype(np.float32)

    class Decaying(dist.DistributedOptimizer):
        def step(self, closure=None):
            self.optimizer.lr *= 0.5
            return super().step(closure)

    results = []
    for compiled in (False, True):
        gradcore.manual_seed(0)
        model = nn.Linear(2, in_size=3)
        opt = Decaying(optim.SGD(model, lr=0.1), comm)

        step = _closure_step(model, opt, compiled)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the compiled step's: it runs eagerly
            losses = [step(gradcore.Variable(x)).item() for _ in range(5)]
        results.append((losses, model.W.numpy(), opt.optimizer.lr))
    assert step.stats()["replays"] == 0
    assert results[0][0] == results[1][0] and results[0][2] == results[1][2] == 0.1 / 2 ** 5
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_a_dask_model_is_computed_once_per_step(comm):
    da = pytest.importorskip("dask.array", reason="needs the dask extra")
    pytest.importorskip("array_api_compat", reason="needs the dask extra")
    import dask
    reads = [0]

    def read(block):  # stands for reading a chunk of a data set larger than memory
        reads[0] += 1
        return block
    raw = np.random.RandomState(0).randn(64, 5)
    x = gradcore.Variable(da.from_array(raw, chunks=16).map_blocks(read, dtype=raw.dtype))
    finals = []
    with dask.config.set(scheduler="synchronous"):
        for wrap in (False, True):
            gradcore.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, in_size=5), nn.BatchNorm(), nn.Linear(3, in_size=8))
            model.to("dask")
            opt = optim.SGD(model, lr=0.1)
            if wrap:
                opt = dist.DistributedOptimizer(opt, comm)
            for i in range(2):  # from the second step on, buckets could start in backward
                reads[0] = 0
                opt.zero_grad()
                F.sum(model(x) ** 2).backward()
                opt.step()
                # each chunk read once: forward, backward, the gradients and the buffers
                assert reads[0] == 4, (wrap, i)
            finals.append([v.numpy() for v in list(model.parameters()) + list(model.buffers())])
    for a, b in zip(*finals):
        np.testing.assert_array_equal(a, b)


def test_setup_after_wrapping_gives_the_parameters_to_average(comm):
    x = gradcore.Variable(np.ones((4, 3), np.float32))
    for wrapped_setup in (True, False):
        model = nn.Linear(2, in_size=3)
        inner = optim.SGD(lr=0.1)
        opt = dist.DistributedOptimizer(inner, _RankOfThreeAlone(comm, on_device=False))
        (opt if wrapped_setup else inner).setup(model)  # inner: DeZero's order, setup last
        F.sum(model(x)).backward()
        own = model.b.grad.numpy().copy()
        opt.synchronize()
        np.testing.assert_allclose(model.b.grad.numpy(), own / 3, rtol=1e-6)


class _Counted(nn.Module):
    """A BatchNorm beside an integer buffer."""

    def __init__(self):
        super().__init__()
        self.l0 = nn.Linear(3, in_size=2)
        self.bn = nn.BatchNorm()
        self.register_buffer("seen", np.array([5, 7]))

    def forward(self, x):
        return self.bn(self.l0(x))


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("mode", ["mean", "root", None])
def test_buffers_are_averaged_or_taken_from_rank_0(comm, mode, on_device):
    x = gradcore.Variable(np.random.RandomState(0).randn(4, 2).astype(np.float32))
    for given in ("target", "model="):  # the optimizer's target, or parameters and model=
        model = _Counted()
        inner = optim.SGD(model if given == "target" else model.parameters(), lr=0.1)
        opt = dist.DistributedOptimizer(inner, _RankOfThreeAlone(comm, on_device),
                                        buffers=mode, model=model if given == "model=" else None)
        F.sum(model(x)).backward()
        own = {name: b.numpy().copy() for name, b in model.named_buffers()}
        held = model.bn.avg_mean.data
        opt.step()
        assert model.bn.avg_mean.data is held  # written into, as BatchNorm writes it
        for name, b in model.named_buffers():
            # the two other ranks send zeros: a mean is a third of rank 0's; taken, rank 0's
            expected = own[name] / 3 if mode == "mean" and name != "seen" else own[name]
            np.testing.assert_allclose(b.numpy(), expected, rtol=2.4e-7, err_msg=name)
            assert b.dtype == own[name].dtype
    assert sorted(own) == ["bn.avg_mean", "bn.avg_var", "seen"]


def test_buffer_errors_say_what_to_do(comm):
    model = _Counted()
    with pytest.raises(ValueError, match="buffers must be 'mean', 'root' or None, got 'sum'"):
        dist.DistributedOptimizer(optim.SGD(model), comm, buffers="sum")
    with pytest.raises(TypeError, match="model= is the model whose buffers"):
        dist.DistributedOptimizer(optim.SGD(model), comm, model=model.parameters())
    class RankOfTwoWithoutBuffers(_RankOfThreeAlone):
        size = 2

        def allgather_json(self, obj, what=None):
            settings, plan, parameters, _ = obj
            return [obj, [settings, plan, parameters, []]]
    opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1),
                                    RankOfTwoWithoutBuffers(comm, on_device=False))
    F.sum(model(gradcore.Variable(np.ones((4, 2), np.float32)))).backward()
    with pytest.raises(dist.DistributedError, match=r"different buffers \(rank 1 has none, rank 0 "
                                                    r"bn.avg_mean \(3,\) float32, .*seen \(2,\) "
                                                    r"int64\): build the same model"):
        opt.step()
    model.register_buffer("late")  # sized after the first step
    opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1), comm)
    x = gradcore.Variable(np.ones((4, 2), np.float32))
    F.sum(model(x)).backward()
    opt.step()
    model.late.data = np.zeros(2)
    with pytest.raises(dist.DistributedError, match="the buffer late was sized after the first "
                                                    "step: run a forward through every layer"):
        opt.step()


def test_buffers_replaced_or_removed_after_the_first_step_raise(comm):
    x = gradcore.Variable(np.ones((4, 2), np.float32))
    for change, said in [(lambda m: setattr(m, "seen", gradcore.Variable(np.zeros(2))),
                          "seen replaced by another Variable"),
                         (lambda m: delattr(m, "seen"), "seen removed")]:
        model = _Counted()
        opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1), comm)
        F.sum(model(x)).backward()
        opt.step()
        model.seen.data[...] = 3  # new values in the same buffer: fine
        opt.step()
        change(model)
        with pytest.raises(dist.DistributedError, match=f"buffers changed after the first "
                                                        f"step \\({said}\\)"):
            opt.step()


def test_setup_again_after_steps_plans_and_checks_the_new_parameters(comm):
    x = gradcore.Variable(np.ones((4, 3), np.float32))
    model = nn.Linear(2, in_size=3)
    opt = dist.DistributedOptimizer(optim.SGD(model.parameters(), lr=0.1), comm)
    for _ in range(2):
        opt.zero_grad()
        F.sum(model(x)).backward()
        opt.step()
    other = nn.Linear(5, in_size=3)
    opt.setup(other)
    assert not opt._checked  # the ranks compare the new parameters at the next step
    for _ in range(2):
        opt.zero_grad()
        F.sum(other(x)).backward()  # its parameters' hooks find no bucket of the old model
        opt.step()
    assert opt._params == list(other.parameters()) and opt._checked
    np.testing.assert_array_equal(other.b.grad.numpy(), np.full(5, 4.0))


def test_zero_grad_passes_its_arguments_to_the_optimizer(comm):
    class ZeroingSGD(optim.SGD):
        def zero_grad(self, set_to_none=True):
            for p in self._parameters():
                p.grad = None if set_to_none else gradcore.Variable(np.zeros_like(p.numpy()))

    model = nn.Linear(2, in_size=3)
    opt = dist.DistributedOptimizer(ZeroingSGD(model.parameters(), lr=0.1), comm)
    opt.zero_grad(set_to_none=False)
    assert model.W.grad is not None and not model.W.grad.numpy().any()
    opt.zero_grad()
    assert model.W.grad is None


@pytest.mark.parametrize("overlap", [True, False])
def test_a_gradient_set_anew_after_backward_is_the_one_averaged(comm, overlap):
    x = gradcore.Variable(np.ones((4, 3), np.float32))
    model = nn.Linear(2, in_size=3)
    opt = dist.DistributedOptimizer(optim.SGD(model.parameters(), lr=0.1),
                                    _RankOfThree(comm, on_device=False), overlap=overlap)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):  # from the second step on, buckets start in backward (overlap)
            opt.zero_grad()
            F.sum(model(x)).backward()
            for p in model.parameters():  # each p.grad set anew, clipped to 0.5, on this rank
                p.grad = gradcore.Variable(np.minimum(p.grad.numpy(), 0.5))
            opt.synchronize()
            np.testing.assert_allclose(model.b.grad.numpy(), np.full(2, 0.5), rtol=1e-6)
            opt.optimizer.update()
    said = [w for w in caught if issubclass(w.category, dist.LocalGradientWarning)]
    if overlap:  # the hooks saw what backward left: said once, at the program's line
        assert len(said) == 1 and said[0].filename == __file__
        assert str(said[0].message).startswith(
            "DistributedOptimizer: the gradients of parameter 0 (3, 2), parameter 1 (2,) were "
            "set anew after backward, before the ranks' gradients were averaged: each rank "
            "changed its own, so training may differ from one process")


class _CountingAlone(_RankOfThreeAlone):
    """_RankOfThreeAlone counting the sums it starts."""

    started = 0

    def start(self, buffer, channel=None):
        self.started += 1
        return super().start(buffer, channel)


@pytest.mark.parametrize("overlap", [True, False])
def test_a_step_after_synchronize_sums_again_only_after_another_backward(comm, overlap):
    x = gradcore.Variable(np.ones((4, 3), np.float32))
    model = nn.Linear(2, in_size=3)
    ranks = _CountingAlone(comm, on_device=False)  # each mean is a third of this rank's
    opt = dist.DistributedOptimizer(optim.SGD(model.parameters(), lr=0.1), ranks,
                                    overlap=overlap)
    for _ in range(2):  # the second: buckets start in backward (overlap)
        opt.zero_grad()
        F.sum(model(x)).backward()  # b's gradient: 4 in each element
        opt.synchronize()
        np.testing.assert_allclose(model.b.grad.numpy(), np.full(2, 4 / 3), rtol=1e-6)
        nn.utils.clip_grad_value_(model.parameters(), 0.5)
        started = ranks.started
        before = model.b.numpy().copy()
        opt.step()
        assert ranks.started == started  # nothing summed again
        np.testing.assert_allclose(model.b.numpy(), before - 0.1 * 0.5, rtol=1e-6)
    opt.zero_grad()
    F.sum(model(x)).backward()
    opt.synchronize()
    F.sum(model(x)).backward()  # a backward after synchronize(): summed at the step
    opt.step()
    np.testing.assert_allclose(model.b.grad.numpy(), np.full(2, (4 / 3 + 4) / 3), rtol=1e-6)


# ways to change a Sequential(Linear(4, in_size=3), Linear(2, in_size=4)) the same on every rank
_CHANGES = {
    "replaced": lambda model: setattr(model, "1", nn.Linear(2, in_size=4)),
    "appended": lambda model: model.append(nn.Linear(3, in_size=2)),
    "deleted and appended": lambda model: (delattr(model, "1"),
                                           model.append(nn.Linear(2, in_size=4))),
    "bias removed": lambda model: setattr(model[0], "nobias", True),
    "bias set to None and added again": lambda model: (setattr(model[0], "b", None),
                                                       setattr(model[0], "nobias", False)),
    "W made again at the next call": lambda model: setattr(model[1], "W", None),
}


@pytest.mark.parametrize("change", list(_CHANGES))
@pytest.mark.parametrize("overlap", [True, False])
def test_a_model_changed_after_the_first_step_is_planned_and_averaged(comm, overlap, change):
    x = gradcore.Variable(np.ones((4, 3), np.float32))
    model = nn.Sequential(nn.Linear(4, in_size=3), nn.Linear(2, in_size=4))
    opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1),
                                    _RankOfThreeAlone(comm, on_device=False), overlap=overlap)
    for step in range(3):
        if step == 1:
            _CHANGES[change](model)  # the optimizer trains what the model holds now
        opt.zero_grad()
        F.sum(model(x)).backward()
        own = {name: p.grad.numpy().copy() for name, p in model.named_parameters()}
        opt.synchronize()
        for name, p in model.named_parameters():
            np.testing.assert_allclose(p.grad.numpy(), own[name] / 3, rtol=2.4e-7,
                                       err_msg=f"step {step}, {name}")
        opt.step()
    assert [id(p) for p in opt._params] == [id(p) for p in model.parameters()]


class _Pair(nn.Module):
    """Two float64 parameters, a (3,) and b (4,): the loss sum(a * xa) + sum(b * xb) gives them
    the gradients xa and xb."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(np.zeros(3))
        self.b = nn.Parameter(np.zeros(4))

    def forward(self, xa, xb):
        return F.sum(self.a * xa) + F.sum(self.b * xb)


@pytest.mark.parametrize("overlap", [True, False])
def test_a_parameter_resized_or_cast_after_the_first_step_is_planned_again(comm, overlap):
    """The buckets' offsets and dtypes are the plan's: a parameter given a larger array, or a
    model cast, after the first step (the same on every rank) is planned again."""
    model = _Pair().to(dtype="float32")
    # the two other ranks send zeros: each mean is a third of this rank's gradient
    opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.0),
                                    _RankOfThreeAlone(comm, on_device=False), overlap=overlap)
    for _ in range(2):  # from the second step on, buckets start in backward (overlap)
        opt.zero_grad()
        model(np.ones(3, np.float32), np.ones(4, np.float32)).backward()
        opt.step()
    model.a.data = np.zeros(5, np.float32)  # a's gradient would have run over into the flags
    xa, xb = np.arange(5, dtype=np.float32) + 10, np.arange(4, dtype=np.float32) + 100
    for _ in range(2):
        opt.zero_grad()
        model(xa, xb).backward()
        opt.step()
        np.testing.assert_allclose(model.a.grad.numpy(), xa / 3, rtol=2.4e-7)
        np.testing.assert_allclose(model.b.grad.numpy(), xb / 3, rtol=2.4e-7)
    model.to(dtype="float64")  # float32 buckets would round 1 + 1e-10 to 1
    for _ in range(2):
        opt.zero_grad()
        model(np.full(5, 1 + 1e-10), np.ones(4)).backward()
        opt.step()
        assert model.a.grad.dtype == np.float64
        np.testing.assert_allclose(model.a.grad.numpy(), np.full(5, (1 + 1e-10) / 3),
                                   rtol=1e-15)


def test_buffers_cast_after_the_first_step_are_planned_again(comm):
    x = np.random.RandomState(0).randn(4, 2).astype(np.float32)
    model = _Counted()
    opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1),
                                    _RankOfThreeAlone(comm, on_device=False))
    for step in range(3):
        if step == 1:
            model.to(dtype="float64")  # was: every later step raised for BatchNorm's buffers
            x = x.astype(np.float64)
        opt.zero_grad()
        F.sum(model(x)).backward()
        own = {name: b.numpy().copy() for name, b in model.named_buffers()}
        opt.step()
        for name, b in model.named_buffers():  # a third of this rank's; rank 0's integers
            expected = own[name] if name == "seen" else own[name] / 3
            assert b.dtype == expected.dtype
            np.testing.assert_allclose(b.numpy(), expected, rtol=1e-15, err_msg=name)
    assert model.bn.avg_mean.dtype == np.float64


class _Table(nn.Module):
    """A Linear beside float32 and float16 buffers that no forward changes."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, in_size=4)
        table = np.random.RandomState(0).rand(1000) + 0.5
        self.register_buffer("t32", table.astype(np.float32))
        self.register_buffer("t16", table.astype(np.float16))

    def forward(self, x):
        return self.lin(x)


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "device"])
def test_the_mean_of_buffers_equal_on_every_rank_is_that_buffer(comm, on_device):
    """Each rank's share (1 / 3) is taken in float64: rounded to float32 (float16), about a
    quarter of the elements came back an ulp off."""
    model = _Table()
    before = {name: b.numpy().copy() for name, b in model.named_buffers()}
    opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1), _RankOfThree(comm, on_device))
    F.sum(model(np.ones((2, 4), np.float32))).backward()
    opt.step()
    for name, b in model.named_buffers():
        np.testing.assert_array_equal(b.numpy(), before[name], err_msg=name)


def test_an_integer_parameter_is_left_out_of_the_averaging(comm):
    """An index table kept as a Parameter has no gradient: planning a bucket for it failed
    (NumPy's finfo of an integer dtype)."""
    class Indexed(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(np.ones(3))
            self.index = nn.Parameter(np.arange(2), requires_grad=False)

        def forward(self, x):
            return F.sum(self.w * x)

    model = Indexed()
    opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.5), comm)
    model(np.full(3, 2.0)).backward()
    opt.step()
    np.testing.assert_array_equal(model.w.numpy(), np.zeros(3))  # 1 - 0.5 * 2
    np.testing.assert_array_equal(model.index.numpy(), [0, 1])
    assert [p for bucket in opt._buckets for p in bucket.params] == [model.w]


def test_a_step_walks_the_model_only_where_a_module_changed(comm, monkeypatch):
    """The optimizer's own update reads the parameters (one walk of the model); the averaging
    reads them again, and the buffers, only after some Module registered or removed something:
    each walk of a 100-parameter model costs about 70 us."""
    walks = []
    entries = nn.Module._entries

    def counted(module):
        walks.append(module)
        return entries(module)
    monkeypatch.setattr(nn.Module, "_entries", counted)
    x = gradcore.Variable(np.ones((4, 3), np.float32))
    model = nn.Sequential(nn.Linear(4, in_size=3), nn.BatchNorm(), nn.Linear(2, in_size=4))
    opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1),
                                    _RankOfThreeAlone(comm, on_device=False))

    def walks_in_step():
        opt.zero_grad()
        F.sum(model(x)).backward()
        walks.clear()
        opt.step()
        return len(walks)
    walks_in_step()  # the first plans and checks
    assert walks_in_step() == 1  # the optimizer's own
    model.note = "not a parameter"
    nn.Linear(3)  # another model's module
    assert walks_in_step() == 3  # parameters and buffers found the same: 1 again from here
    assert walks_in_step() == 1
    model[0].nobias = True
    assert walks_in_step() > 1
    assert [id(p) for p in opt._params] == [id(p) for p in model.parameters()]
    assert walks_in_step() == 1


class _Listing(nn.Module):
    """A model that lists its own parameters: only those that require grad."""

    def __init__(self):
        super().__init__()
        self.l0 = nn.Linear(2, in_size=3)
        self.l1 = nn.Linear(2, in_size=2)

    def forward(self, x):
        return self.l1(self.l0(x))

    def parameters(self):
        return [p for p in super().parameters() if p.requires_grad]


def test_a_model_that_lists_its_own_parameters_is_read_at_every_step(comm):
    x = gradcore.Variable(np.ones((4, 3), np.float32))
    model = _Listing()
    opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1),
                                    _RankOfThreeAlone(comm, on_device=False))
    for step in range(3):
        if step == 1:
            model.l0.W.requires_grad = False  # no Module registered anything: still followed
        opt.zero_grad()
        F.sum(model(x)).backward()
        opt.step()
        assert [id(p) for p in opt._params] == [id(p) for p in model.parameters()]
    assert len(opt._params) == 3


def _seeded_linear_with_counted_sums(comm, overlap):
    """A Linear(3 -> 2, float64) from seed 0, its _CountingAlone communicator (each mean a third
    of this rank's) and a DistributedOptimizer of SGD(lr=0.1) over it."""
    gradcore.manual_seed(0)
    model = nn.Linear(2, in_size=3, dtype="float64")
    counting = _CountingAlone(comm, on_device=False)
    opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1), counting, overlap=overlap)
    return model, counting, opt


@pytest.mark.parametrize("form", ["clip", "synchronize and clip"])
@pytest.mark.parametrize("overlap", [True, False])
def test_a_compiled_step_that_averages_before_the_step_replays(comm, overlap, form):
    """clip_grad_norm_ (or synchronize()) in a compiled step: the averaging runs as Python at
    every replay, as the step does, and the clip's ops replay after it; as the eager step."""
    xs = np.random.RandomState(1).randn(5, 8, 3)
    results = []
    for compiled in (False, True):
        model, counting, opt = _seeded_linear_with_counted_sums(comm, overlap)

        def step(x):
            opt.zero_grad()
            F.sum(model(x) ** 2).backward()
            if form == "synchronize and clip":
                opt.synchronize()
            norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            return norm
        if compiled:
            step = gradcore.compile(step)
            # an earlier test's optimizer collected mid-test would remove its hooks, a change
            # that makes every compiled step record again
            gc.collect()
        norms = [float(step(x).item()) for x in xs]
        results.append((norms, model.W.numpy(), counting.started))
    # without overlap the first call registers the hooks that stay: the next records again
    assert step.stats()["recordings"] == 2 - overlap and step.stats()["replays"] == 3 + overlap
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])
    assert results[0][2] == results[1][2] == 5  # one sum a step: the step sums nothing again


def _averaging_between_compiled_calls(model, opt, program, compiled):
    """`program` as a function of one step's two batches (x0, x1): a backward after an
    averaging outside the compiled call (or in it), so a replayed backward must make the next
    step sum again. Returns it and the compiled function whose replays count."""
    clip = nn.utils.clip_grad_norm_
    loss = lambda x: F.sum(model(x) ** 2)  # noqa: E731
    wrap = gradcore.compile if compiled else (lambda f: f)

    @wrap
    def backward(x):
        loss(x).backward()

    @wrap
    def train_step(x):
        opt.zero_grad()
        loss(x).backward()
        opt.step()

    @wrap
    def micro_batches(x0, x1):
        opt.zero_grad()
        loss(x0).backward()
        clip(model.parameters(), 1e9)  # averages; never clips
        loss(x1).backward()  # the second micro-batch: summed at the step
        opt.step()

    def backward_compiled(x0, x1):
        opt.zero_grad()
        backward(x0)
        clip(model.parameters(), 1e9)
        backward(x1)
        opt.step()

    def step_then_a_logging_clip(x0, x1):
        train_step(x0)
        clip(model.parameters(), float("inf"))  # the norm, for a log: never clips

    return {"backward compiled": (backward_compiled, backward),
            "whole step compiled": (micro_batches, micro_batches),
            "a clip after the step": (step_then_a_logging_clip, train_step)}[program]


@pytest.mark.parametrize("program", ["backward compiled", "whole step compiled",
                                     "a clip after the step"])
@pytest.mark.parametrize("overlap", [True, False])
def test_a_replayed_backward_after_an_averaging_is_summed_at_the_step(comm, overlap, program):
    """A replay calls no post-accumulate hook: its tape says that a backward ran, so a
    backward after an averaging (a clip, outside the compiled call or in it) is summed at the
    next step as eagerly, and a clip outside the compiled step lets it replay."""
    xs = np.random.RandomState(2).randn(6, 2, 4, 3)
    results = []
    for compiled in (False, True):
        model, counting, opt = _seeded_linear_with_counted_sums(comm, overlap)
        run, replayed = _averaging_between_compiled_calls(model, opt, program, compiled)
        gc.collect()  # an earlier test's optimizer, collected mid-test, would remove its hooks
        for x0, x1 in xs:
            run(x0, x1)
        results.append((model.W.numpy(), model.b.numpy(), counting.started))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    assert results[0][2] == results[1][2]  # as many sums as eagerly
    # one recording for each set of hooks and of grads present it meets, then replays; without
    # overlap, the first call registers the hooks that stay, and the next records again
    stats = replayed.stats()
    assert stats["tapes"] <= 3 and stats["recordings"] == stats["tapes"] + (
        not overlap and program == "whole step compiled")


def test_a_wrapped_optimizers_state_dict_names_the_parameters_and_loads(comm):
    x = gradcore.Variable(np.random.RandomState(0).randn(4, 3).astype(np.float32))
    model = nn.MLP((5, 2))
    model(x)
    twin = copy.deepcopy(model)
    opt = dist.DistributedOptimizer(optim.Adam(model, lr=0.01), comm)

    def step(model, opt):
        opt.zero_grad()
        F.sum(model(x) ** 2).backward()
        opt.step()
    for _ in range(2):
        step(model, opt)
    saved = opt.state_dict()
    assert saved["names"] == ["l0.W", "l0.b", "l1.W", "l1.b"]
    twin.load_state_dict(model.state_dict())
    restored = dist.DistributedOptimizer(optim.Adam(twin, lr=0.01), comm)
    restored.load_state_dict(saved)
    step(model, opt)
    step(twin, restored)
    for a, b in zip(model.parameters(), twin.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    listed = dist.DistributedOptimizer(optim.Adam(twin.parameters()), comm)
    with pytest.raises(ValueError, match="the state_dict names its parameters"):
        listed.load_state_dict(saved)


def test_init_again_with_a_timeout_sets_it(comm):
    before = comm.timeout
    try:
        assert dist.init(timeout=12.5) is comm and comm.timeout == 12.5
        assert dist.init() is comm and comm.timeout == 12.5  # not given: kept
        with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
            dist.init(timeout=0)
    finally:
        comm.timeout = before


def test_word_that_a_rank_exited_stops_a_wait_once_the_grace_has_passed(comm):
    """A collective whose part on the exited rank was done completes within EXIT_GRACE: a wait
    raises only once that has passed both since it began and since this rank read the word."""
    grace = dist.communicator.EXIT_GRACE
    now = time.monotonic()
    try:
        comm._exited[1] = ("status 2", now - 2 * grace)  # read long ago
        comm.check_notices("a wait")  # not waiting
        comm.check_notices("a wait", since=now)  # begun just now
        with pytest.raises(dist.DistributedError, match=r"rank 1 exited \(status 2\) without "
                                                        r"taking part; rank 0 stops in a wait"):
            comm.check_notices("a wait", since=now - 2 * grace)
        comm._exited[1] = ("status 2", now)  # read just now
        comm.check_notices("a wait", since=now - 2 * grace)
    finally:
        comm._exited.clear()


def test_from_root_gives_roots_result_or_raises_its_error(comm):
    assert comm.from_root(lambda: {"path": "a.npz"}) == {"path": "a.npz"}
    with pytest.raises(ZeroDivisionError):  # the root's own
        comm.from_root(lambda: 1 / 0)
    assert comm.from_root(lambda: 3) == 3  # the next broadcast pairs as before


def test_the_same_parameters_in_another_order_are_a_difference():
    from gradcore.distributed.parameters import _differences
    root = [["l0.W", [3, 4], "float32"], ["l1.W", [4, 4], "float32"], ["l2.W", [4, 4], "float32"]]
    swapped = [root[0], root[2], root[1]]
    assert _differences([root, list(root)], 0) == []
    assert _differences([root, swapped], 0) == [
        "rank 1 lists l2.W where rank 0 lists l1.W (the same names in another order)"]


def test_a_lazy_model_broadcast_holds_the_generators_until_it_is_sized_or_dropped(comm):
    from gradcore.distributed.parameters import random_states_lent, restore_random_states
    sized, dropped = nn.Linear(2), nn.Linear(2)
    dist.broadcast_parameters(sized, comm)
    dist.broadcast_parameters(dropped, comm)
    restore_random_states()
    assert random_states_lent()  # neither is sized: both would draw other weights per rank
    sized(gradcore.Variable(np.ones((1, 3), np.float32)))
    restore_random_states()
    assert random_states_lent()  # `dropped` is not sized yet
    del dropped
    gc.collect()
    restore_random_states()
    assert not random_states_lent()  # held weakly: a model dropped unsized holds nothing up


def test_a_layer_the_forward_never_calls_is_named_as_not_sized(comm):
    model = nn.MLP((8, 3))
    model.spare = nn.Linear(5)  # lazy, and no forward calls it
    dist.broadcast_parameters(model, comm)
    for target, names in ((model, "spare.W, spare.b"), (model.parameters(), "parameter 4, "
                                                                            "parameter 5")):
        opt = dist.DistributedOptimizer(optim.SGD(target, lr=0.1), comm)
        F.sum(model(np.ones((4, 3), np.float32))).backward()
        with pytest.raises(dist.DistributedError, match=f"{names} not initialised yet: .* "
                                                        "leave its parameters out"):
            opt.step()
        model.cleargrads()


def test_a_users_optimizer_inside_a_distributed_one_reading_a_number_the_step_sets(comm):
    """An SGD subclass of the user's reading model.n, wrapped in DistributedOptimizer (gradcore's
    class, so its step was taken for gradcore's code): a replay ran it before setting n
    (last loss 0.4988 for eager's 0.516)."""
    from test_compile import counted_twins_agree, scaled_by_n

    counted_twins_agree(lambda model: dist.DistributedOptimizer(scaled_by_n(model), comm))
