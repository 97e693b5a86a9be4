"""NcclReducer: gradient buckets summed over the ranks by NCCL on the GPUs (CuPy's bindings).

MPI still carries everything else: NCCL's unique id goes from rank 0 to the others with
`Communicator.broadcast_json`, and failure notices arrive as they do for MpiReducer.
"""
import importlib
import time

from backends import DeviceUnavailableError

from .communicator import DistributedError

__all__ = ["NcclReducer"]

# the dtypes a gradient bucket can have, and the name of NCCL's constant for each
_DATATYPES = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64"}


def _import_nccl():
    """cupy.cuda.nccl, or an ImportError that says what to install."""
    try:
        importlib.import_module("cupy")
    except ImportError as e:
        raise ImportError(
            "dist.init('nccl') needs CuPy: pip install 'gradcore[gpu]', or the cupy-cudaXXx wheel "
            "that matches your CUDA driver (cupy-cuda12x for CUDA 12, cupy-cuda13x for CUDA 13; "
            f"nvidia-smi shows the driver's CUDA version) ({e})") from None
    try:
        nccl = importlib.import_module("cupy.cuda.nccl")
    except ImportError as e:  # older CuPy: the module itself fails without libnccl
        reason = str(e)
    else:
        # CuPy 14 imports the module without libnccl and says so in `available`
        if getattr(nccl, "available", True) and hasattr(nccl, "NcclCommunicator"):
            return nccl
        reason = "CuPy could not load libnccl"
    raise ImportError(
        "dist.init('nccl') needs NCCL, which CuPy's wheels do not include: pip install "
        "nvidia-nccl-cu12 (nvidia-nccl-cu13 with cupy-cuda13x); older CuPy releases fetch it "
        "with `python -m cupyx.tools.install_library --library nccl --cuda 12.x`. "
        "`python -c 'import cupy.cuda.nccl'` prints the exact command for your CuPy. "
        f"Or sum on the host with dist.init('mpi') ({reason})") from None


def _id_to_json(unique_id):
    """NCCL's unique id as JSON can carry it: bytes in CuPy 14, a tuple of ints before."""
    return {"bytes": isinstance(unique_id, bytes), "id": list(unique_id)}


def _id_from_json(sent):
    return bytes(sent["id"]) if sent["bytes"] else tuple(sent["id"])


def _rank_device(comm, cuda):
    """This rank's GPU: local_rank modulo the GPUs it sees, as dist.local_device picks it."""
    count = cuda.runtime.getDeviceCount() if cuda.is_available() else 0
    if count == 0:
        raise DeviceUnavailableError(
            f"dist.init('nccl'): rank {comm.rank} sees no CUDA device (check nvidia-smi and "
            "CUDA_VISIBLE_DEVICES); dist.init('mpi') sums the gradients on the host")
    return comm.local_rank % count


class NcclReducer:
    """Sums gradient buckets (CuPy arrays on this rank's GPU) over the ranks with NCCL, in
    place, on the GPU's current stream: the kernels queued after it on that stream see the sum.

    Making it makes this rank's GPU (dist.local_device's choice) the process's current CUDA
    device, and builds the NCCL communicator there; every rank must make one, in the same
    order. `nccl` and `cuda` stand for cupy.cuda.nccl and cupy.cuda (tests pass stand-ins)."""

    on_device = True

    def __init__(self, comm, nccl=None, cuda=None):
        if nccl is None:
            nccl = _import_nccl()
        if cuda is None:
            cuda = importlib.import_module("cupy").cuda
        self.comm = comm
        self.nccl = nccl
        self.cuda = cuda
        self.datatypes = {dtype: getattr(nccl, name) for dtype, name in _DATATYPES.items()}
        self.device = _rank_device(comm, cuda)
        # NCCL binds a communicator to the device current when it is made; the buckets are
        # allocated on the current device too
        cuda.Device(self.device).use()
        # rank 0 alone makes the id: should it fail there, every rank raises at once
        sent = comm.from_root(lambda: _id_to_json(nccl.get_unique_id()), 0, "dist.init('nccl')")
        self.nccl_comm = nccl.NcclCommunicator(comm.size, _id_from_json(sent), comm.rank)
        self.aborted = False

    def __repr__(self):
        return f"NcclReducer(rank {self.comm.rank} of {self.comm.size} on cuda:{self.device})"

    def channel(self):
        """What one DistributedOptimizer sums on: None, this reducer's one NCCL communicator,
        shared. NCCL too pairs each rank's n-th sum on a communicator with the others' n-th,
        but one communicator per optimizer would not make sums started in different orders
        safe: their kernels, queued on the one current stream in those orders, would each
        wait for a kernel queued behind the other on another rank. So where several
        DistributedOptimizers sum here, give every one overlap=False: each then starts its
        buckets in its own step, in the program's order, the same on every rank."""
        return None

    def release(self, channel):
        """Nothing to free (see `channel`)."""

    def start(self, buffer, channel=None):
        """Start summing `buffer` (a contiguous CuPy array on this rank's GPU) over the ranks,
        in place; returns a CUDA event that completes with the sum. `channel`: see
        `channel`."""
        if self.aborted:
            raise DistributedError(f"rank {self.comm.rank}: NCCL was stopped by an earlier "
                                   "failure; no more sums can start")
        datatype = self.datatypes.get(buffer.dtype.name)
        if datatype is None:
            raise TypeError(f"NcclReducer: cannot sum {buffer.dtype.name} gradients; it sums "
                            f"{', '.join(self.datatypes)}")
        if buffer.device.id != self.device:
            raise ValueError(
                f"NcclReducer: gradients on cuda:{buffer.device.id}, but rank {self.comm.rank} "
                f"sums on cuda:{self.device}: move the model with "
                "model.to(dist.local_device(comm))")
        if not buffer.flags.c_contiguous:
            raise ValueError("NcclReducer: the buffer must be contiguous")
        with self.cuda.Device(self.device):
            stream = self.cuda.get_current_stream()
            pointer = buffer.data.ptr  # send and receive the same memory: NCCL sums in place
            self.nccl_comm.allReduce(pointer, pointer, buffer.size, datatype,
                                     self.nccl.NCCL_SUM, stream.ptr)
            return stream.record()

    def progress(self, handles):
        """Nothing to do: NCCL moves its sums on by itself, on the GPU."""

    def wait(self, handles):
        """Return once every sum in `handles` (start's events) is complete. Raises
        DistributedError if another rank reports a failure, if NCCL reports an error, or after
        the communicator's `timeout` seconds; the NCCL communicator is then aborted, so that
        no GPU keeps waiting for a rank that is gone."""
        what = "the gradient all-reduce"
        pending = list(handles)
        began = time.monotonic()
        deadline = began + self.comm.timeout
        while True:
            pending = [event for event in pending if not event.done]
            self._check(what, began if pending else None)
            if not pending:
                return
            if time.monotonic() > deadline:
                self._abort()
                raise DistributedError(
                    f"rank {self.comm.rank}: {what} did not complete within "
                    f"{self.comm.timeout:g} s: another rank stopped taking part (it may be "
                    "stuck, or it ended without word). Set dist.init(timeout=...) for longer "
                    "steps.")
            time.sleep(0.0001)  # the GPU works meanwhile: leave the core to others

    def _check(self, what, since=None):
        """Raise DistributedError for another rank's failure notice (or exit notice: see
        Communicator.check_notices, `since`) or an NCCL error."""
        try:
            self.comm.check_notices(what, since)
            if not self.aborted:
                self.nccl_comm.check_async_error()
        except DistributedError:
            self._abort()
            raise
        except self.nccl.NcclError as e:
            self._abort()
            raise DistributedError(f"rank {self.comm.rank}: NCCL failed in {what} ({e})") from e

    def _abort(self):
        """Stop this rank's NCCL work, queued and running (once)."""
        if not self.aborted:
            self.aborted = True
            self.nccl_comm.abort()
