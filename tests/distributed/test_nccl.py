"""NcclReducer against stand-ins for cupy.cuda.nccl, cupy.cuda and the Communicator: the calls it
makes (who makes the unique id, how it travels, what allReduce gets), in one process, without a
GPU or MPI. Two tests marked `gpu` run it on a real GPU (skipped without one)."""
import json
import sys
import types

import numpy as np
import pytest

from backends import DeviceUnavailableError
from gradcore.distributed.communicator import DistributedError
from gradcore.distributed.nccl import NcclReducer

# NCCL's own values (nccl.h): stand-ins that a wrong constant cannot match by accident
NCCL_SUM, NCCL_INT8, NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 0, 0, 6, 7, 8
UNIQUE_ID = bytes(range(100, 228))  # CuPy 14 returns the id as 128 bytes
OLD_UNIQUE_ID = tuple(range(-64, 64))  # CuPy 13 and older: a tuple of 128 signed chars


# ---------------------------------------------------------------- stand-ins
class NcclError(RuntimeError):
    pass


def fake_nccl(unique_id=UNIQUE_ID, async_error=None):
    """A stand-in for cupy.cuda.nccl that records its calls in `.calls`. Its allReduce is a
    job of one rank: the sum is the send buffer, written to the receive buffer, both found by
    their pointers in `.memory`."""
    calls, memory = [], {}

    def get_unique_id():
        calls.append(("get_unique_id",))
        return unique_id

    class NcclCommunicator:
        def __init__(self, ndev, commId, rank):
            calls.append(("NcclCommunicator", ndev, commId, rank))

        def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
            calls.append(("allReduce", sendbuf, recvbuf, count, datatype, op, stream))
            memory[recvbuf][:count] = memory[sendbuf][:count].copy()

        def check_async_error(self):
            if async_error is not None:
                raise NcclError(async_error)

        def abort(self):
            calls.append(("abort",))

    return types.SimpleNamespace(
        get_unique_id=get_unique_id, NcclCommunicator=NcclCommunicator, NcclError=NcclError,
        NCCL_SUM=NCCL_SUM, NCCL_INT8=NCCL_INT8, NCCL_FLOAT16=NCCL_FLOAT16,
        NCCL_FLOAT32=NCCL_FLOAT32, NCCL_FLOAT64=NCCL_FLOAT64, calls=calls, memory=memory)


class FakeEvent:
    def __init__(self, stream, done=True):
        self.stream = stream
        self.done = done


class FakeCuda:
    """A stand-in for cupy.cuda with `count` GPUs: Device (with-block and use), the current
    stream of the current device (stream of device d has ptr 0x5000 + d), events."""

    def __init__(self, count=2, events_done=True):
        self.count = count
        self.current = 0
        self.log = []
        self.events_done = events_done
        self.runtime = types.SimpleNamespace(getDeviceCount=lambda: self.count)
        cuda = self

        class Device:
            def __init__(self, device_id):
                self.id = device_id

            def use(self):
                cuda.log.append(("use", self.id))
                cuda.current = self.id

            def __enter__(self):
                self.previous, cuda.current = cuda.current, self.id

            def __exit__(self, *exc):
                cuda.current = self.previous

        self.Device = Device

    def is_available(self):
        return self.count > 0

    def get_current_stream(self):
        device = self.current
        stream = types.SimpleNamespace(ptr=0x5000 + device, device=device)
        stream.record = lambda: FakeEvent(stream, self.events_done)
        return stream


class FakeComm:
    """What NcclReducer uses of a Communicator. On rank 0, from_root returns what its argument
    makes; on another rank, `root_sent` (what rank 0 made)."""

    def __init__(self, rank=0, size=1, local_rank=0, root_sent=None, failure=None, timeout=5.0):
        self.rank, self.size, self.local_rank = rank, size, local_rank
        self.root_sent = root_sent
        self.failure = failure
        self.timeout = timeout
        self.sent = []
        self.checked = []

    def from_root(self, make, root=0, what="a broadcast"):
        made = make() if self.rank == root else None
        self.sent.append(made)
        json.dumps(made)  # JSON must be able to carry it
        return made if self.rank == root else self.root_sent

    def check_notices(self, what="the job", since=None):
        self.checked.append(what)
        if self.failure:
            raise DistributedError(f"rank 1 failed ({self.failure}); rank {self.rank} stops in "
                                   f"{what}")


class FakeBuffer:
    """What NcclReducer reads of a CuPy array, over a NumPy array at the same address."""

    def __init__(self, array, nccl, device=0):
        self.array = array
        self.data = types.SimpleNamespace(ptr=array.ctypes.data)
        self.size, self.dtype, self.flags = array.size, array.dtype, array.flags
        self.device = types.SimpleNamespace(id=device)
        nccl.memory[self.data.ptr] = array.reshape(-1)


# ---------------------------------------------------------------- making the communicator
def test_rank_0_makes_the_unique_id_and_sends_it():
    nccl, cuda, comm = fake_nccl(), FakeCuda(), FakeComm(rank=0, size=1)
    reducer = NcclReducer(comm, nccl=nccl, cuda=cuda)
    assert nccl.calls == [("get_unique_id",), ("NcclCommunicator", 1, UNIQUE_ID, 0)]
    assert len(comm.sent) == 1 and comm.sent[0] is not None  # rank 0 sent the id
    assert reducer.on_device and reducer.device == 0
    assert cuda.log == [("use", 0)]  # the device is current before NCCL binds to it


@pytest.mark.parametrize("unique_id", [UNIQUE_ID, OLD_UNIQUE_ID], ids=["bytes", "tuple"])
def test_another_rank_takes_rank_0s_id_over_mpi(unique_id):
    rank0 = FakeComm(rank=0, size=2, local_rank=0)
    NcclReducer(rank0, nccl=fake_nccl(unique_id), cuda=FakeCuda())
    from_root = json.loads(json.dumps(rank0.sent[0]))  # as MPI carries it

    nccl, cuda = fake_nccl(unique_id=None), FakeCuda()
    rank1 = FakeComm(rank=1, size=2, local_rank=1, root_sent=from_root)
    reducer = NcclReducer(rank1, nccl=nccl, cuda=cuda)
    assert nccl.calls == [("NcclCommunicator", 2, unique_id, 1)]  # no get_unique_id here
    assert type(nccl.calls[0][2]) is type(unique_id)  # what this CuPy's NcclCommunicator takes
    assert rank1.sent == [None]
    assert reducer.device == 1 and cuda.log == [("use", 1)]


def test_the_device_is_local_rank_modulo_the_gpus():
    cuda = FakeCuda(count=2)
    reducer = NcclReducer(FakeComm(local_rank=3), nccl=fake_nccl(), cuda=cuda)
    assert reducer.device == 1 and cuda.current == 1


def test_no_gpu_is_a_clear_error_before_any_nccl_call():
    nccl = fake_nccl()
    with pytest.raises(DeviceUnavailableError, match=r"rank 0 sees no CUDA device.*'mpi'"):
        NcclReducer(FakeComm(), nccl=nccl, cuda=FakeCuda(count=0))
    assert nccl.calls == []


# ---------------------------------------------------------------- summing
@pytest.mark.parametrize("dtype, constant", [
    ("float16", NCCL_FLOAT16), ("float32", NCCL_FLOAT32), ("float64", NCCL_FLOAT64)])
def test_start_sums_in_place_on_the_current_stream_of_the_buffers_gpu(dtype, constant):
    nccl, cuda, comm = fake_nccl(), FakeCuda(count=2), FakeComm(local_rank=1)
    reducer = NcclReducer(comm, nccl=nccl, cuda=cuda)
    cuda.Device(0).use()  # the program moved on to another device meanwhile
    values = np.arange(7, dtype=dtype)
    buffer = FakeBuffer(values.copy(), nccl, device=1)

    event = reducer.start(buffer)
    pointer = buffer.data.ptr
    assert nccl.calls[-1] == ("allReduce", pointer, pointer, 7, constant, NCCL_SUM, 0x5001)
    assert event.stream.device == 1  # recorded on the stream the sum was queued on
    assert cuda.current == 0  # the with-block gave the device back
    reducer.progress([event])
    reducer.wait([event])
    np.testing.assert_array_equal(buffer.array, values)  # the sum over one rank
    assert comm.checked == ["the gradient all-reduce"]


def test_a_dtype_it_cannot_sum_is_a_type_error_naming_it():
    nccl = fake_nccl()
    reducer = NcclReducer(FakeComm(), nccl=nccl, cuda=FakeCuda())
    with pytest.raises(TypeError, match=r"cannot sum int8 gradients; it sums float16, float32"):
        reducer.start(FakeBuffer(np.zeros(3, dtype=np.int8), nccl))
    assert not any(call[0] == "allReduce" for call in nccl.calls)


def test_a_buffer_on_another_gpu_is_refused():
    nccl = fake_nccl()
    reducer = NcclReducer(FakeComm(local_rank=1), nccl=nccl, cuda=FakeCuda(count=2))
    with pytest.raises(ValueError, match=r"on cuda:0, but rank 0 sums on cuda:1.*local_device"):
        reducer.start(FakeBuffer(np.zeros(3, dtype=np.float32), nccl, device=0))


# ---------------------------------------------------------------- waiting and failures
def test_wait_reports_a_failed_rank_and_aborts_nccl():
    nccl, comm = fake_nccl(), FakeComm()
    reducer = NcclReducer(comm, nccl=nccl, cuda=FakeCuda())
    comm.failure = "ValueError: bad batch"
    with pytest.raises(DistributedError, match=r"rank 1 failed \(ValueError: bad batch\); rank 0 "
                                               r"stops in the gradient all-reduce"):
        reducer.wait([])
    assert nccl.calls[-1] == ("abort",)
    with pytest.raises(DistributedError, match="earlier failure"):
        reducer.start(FakeBuffer(np.zeros(2, dtype=np.float32), nccl))


def test_wait_gives_up_after_the_timeout():
    nccl, cuda = fake_nccl(), FakeCuda(events_done=False)
    reducer = NcclReducer(FakeComm(timeout=0.05), nccl=nccl, cuda=cuda)
    event = reducer.start(FakeBuffer(np.zeros(2, dtype=np.float32), nccl))
    with pytest.raises(DistributedError, match=r"did not complete within 0.05 s"):
        reducer.wait([event])
    assert nccl.calls[-1] == ("abort",)


def test_an_nccl_error_becomes_a_distributed_error():
    nccl = fake_nccl(async_error="unhandled system error")
    reducer = NcclReducer(FakeComm(), nccl=nccl, cuda=FakeCuda())
    with pytest.raises(DistributedError, match=r"NCCL failed in the gradient all-reduce "
                                               r"\(unhandled system error\)"):
        reducer.wait([])
    assert nccl.calls[-1] == ("abort",)


# ---------------------------------------------------------------- missing libraries
def test_without_nccl_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", None)  # importing it now fails
    with pytest.raises(ImportError, match=r"needs NCCL.*pip install nvidia-nccl-cu12.*"
                                          r"cupyx\.tools\.install_library --library nccl"):
        NcclReducer(FakeComm())


def test_cupy_14_without_libnccl_is_the_same_error(monkeypatch):
    # CuPy 14 imports cupy.cuda.nccl without libnccl, with available = False and no bindings
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    stub = types.ModuleType("cupy.cuda.nccl")
    stub.available = False
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", stub)
    with pytest.raises(ImportError, match=r"needs NCCL.*nvidia-nccl-cu12.*could not load"):
        NcclReducer(FakeComm())


def test_without_cupy_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(ImportError, match=r"needs CuPy.*gradcore\[gpu\].*cupy-cudaXXx wheel "
                                          r"that matches your CUDA driver"):
        NcclReducer(FakeComm())


# ---------------------------------------------------------------- on a real GPU
def _real_reducer(comm):
    try:
        return NcclReducer(comm)
    except ImportError as e:
        pytest.skip(f"NCCL is not installed: {e}")


@pytest.mark.gpu
def test_one_rank_sums_a_cupy_buffer_in_place():
    import cupy
    reducer = _real_reducer(FakeComm())
    for dtype in ("float16", "float32", "float64"):
        buffer = cupy.arange(1000, dtype=dtype)
        event = reducer.start(buffer)
        buffer *= 2  # queued after the sum on the same stream: sees it
        reducer.wait([event])
        np.testing.assert_array_equal(buffer.get(), np.arange(1000, dtype=dtype) * 2)


@pytest.mark.gpu
def test_one_rank_of_nccl_trains_as_the_optimizer_alone():
    pytest.importorskip("mpi4py", reason="needs the mpi extra: pip install 'gradcore[mpi]'")
    import backends
    import gradcore
    import gradcore.distributed as dist
    import gradcore.functions as F
    from gradcore import nn, optim
    try:
        comm = dist.init("nccl")
    except ImportError as e:
        pytest.skip(f"NCCL is not installed: {e}")
    device = dist.local_device(comm)
    x = np.random.RandomState(0).randn(16, 4).astype(np.float32)
    t = np.arange(16) % 3
    finals = []
    for wrap in (False, True):
        gradcore.manual_seed(0)
        model = nn.MLP((8, 3))
        model(gradcore.Variable(x[:1]))
        model.to(device)
        opt = optim.Adam(model.parameters(), lr=0.01)
        if wrap:
            opt = dist.DistributedOptimizer(opt, comm, bucket_size=64)
        xs, ts = backends.to_device(x, device), backends.to_device(t, device)
        for _ in range(5):
            loss = F.softmax_cross_entropy(model(gradcore.Variable(xs)), ts)
            opt.zero_grad()
            loss.backward()
            opt.step()
        finals.append([p.numpy() for p in model.parameters()])
    for a, b in zip(*finals):
        np.testing.assert_array_equal(a, b)
