"""The ranks of one job: MPI through mpi4py, with a deadline and failure notices on every wait.

Every collective here is started non-blocking and waited for by `Communicator.wait`, which
polls: it returns when the requests complete, raises DistributedError when another rank has
sent word that it failed (an exception no one caught: see `init`), and raises one when the
deadline passes (a rank that died without word, or stopped calling the collectives). So a job
ends with a message naming the failing rank instead of hanging. Making the communicators waits
so too (see `_meet`).

Metadata (parameter names, random generator states) travels as JSON, never as pickles.
"""
import json
import sys
import time

import numpy

__all__ = ["Communicator", "DistributedError", "init", "local_device"]

DEFAULT_TIMEOUT = 300.0
_FAILED = 7001  # the tag of a failure notice, on a communicator of its own


class DistributedError(RuntimeError):
    """A collective could not complete: another rank failed, the deadline passed, or the ranks
    disagree (their models differ)."""

    __module__ = "gradcore.distributed"  # how tracebacks name it


def _import_mpi():
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError(
            "gradcore.distributed needs mpi4py and an MPI library: pip install 'gradcore[mpi]' "
            "(mpi4py with MPICH, both from the package registry); then launch with "
            f"`mpiexec -n 2 python your_script.py` ({e})") from None
    return MPI


class Communicator:
    """The processes of one job (`init()` makes it): `rank` (0 to size - 1), `size`,
    `local_rank` (rank among the processes on this machine), `backend` ("mpi" or "nccl") and
    `timeout` (seconds any wait may take before it raises DistributedError)."""

    def __init__(self, mpi_comm, timeout=DEFAULT_TIMEOUT, backend="mpi"):
        self.MPI = _import_mpi()
        self.timeout = _checked_timeout(timeout)
        self.backend = backend
        # Dup and Split_type block until every rank calls them: the first duplicate is made
        # waiting with the deadline for every rank to get here (one that failed before never
        # will). gradcore's own communicators: its messages never mix with the program's own
        # MPI traffic, and failure notices never mix with data
        self.mpi = _meet(mpi_comm, self.MPI, self.timeout)
        self._notices = mpi_comm.Dup()
        self._heard = set()  # the ranks whose failure notice this rank has read
        # votes apart from the data: at a vote the ranks may have started different numbers of
        # sums on self.mpi, and MPI pairs one communicator's collectives in the order started
        self._votes = mpi_comm.Dup()
        self.rank = self.mpi.Get_rank()
        self.size = self.mpi.Get_size()
        node = self.mpi.Split_type(self.MPI.COMM_TYPE_SHARED)
        self.local_rank = node.Get_rank()
        self.local_size = node.Get_size()
        node.Free()
        self.reducer = None  # set by init: how gradient buckets are summed (MPI or NCCL)

    def __repr__(self):
        return (f"Communicator(rank={self.rank}, size={self.size}, local_rank={self.local_rank}, "
                f"backend={self.backend!r})")

    # ---------------------------------------------------------------- waiting
    def wait(self, requests, what):
        """Block until every request in `requests` (mpi4py Requests) completes; `what` names
        the collective in errors. Raises DistributedError if another rank reports a failure
        or after `timeout` seconds."""
        test_all = self.MPI.Request.Testall
        if test_all(requests):
            return
        deadline = time.monotonic() + self.timeout
        polls = 0
        # MPI moves a transfer on only inside MPI calls: keep testing (a pause between tests
        # would slow the transfer itself once it starts), as MPI's own blocking wait does
        while not test_all(requests):
            polls += 1
            if polls % 64 == 0:  # the notices and the clock now and then, not on every poll
                self.check_notices(what)
                if time.monotonic() > deadline:
                    raise DistributedError(
                        f"rank {self.rank}: {what} did not complete within {self.timeout:g} s: "
                        "another rank stopped taking part (it may be stuck, or it ended without "
                        "word). Set dist.init(timeout=...) for longer steps.")
                if polls > 20000:  # a long wait: let another process have the core a moment
                    time.sleep(0)

    def check_notices(self, what="the job"):
        """Raise DistributedError if another rank has sent word that it failed."""
        notice = self._notice()
        if notice is not None:
            source, message = notice
            raise DistributedError(f"rank {source} failed ({message}); "
                                   f"rank {self.rank} stops in {what}")

    def _notice(self):
        """(rank, message) of a failure notice that has arrived, read; None if none has."""
        status = self.MPI.Status()
        if not self._notices.Iprobe(source=self.MPI.ANY_SOURCE, tag=_FAILED, status=status):
            return None
        source = status.Get_source()
        message = numpy.empty(status.Get_count(self.MPI.BYTE), dtype=numpy.uint8)
        self._notices.Recv([message, self.MPI.BYTE], source=source, tag=_FAILED)
        self._heard.add(source)
        return source, message.tobytes().decode()

    def notify_failure(self, message, grace=2.0):
        """Send word of this rank's failure (`message`) to every other rank, then wait, at most
        `grace` seconds, for word back from each rank not heard from yet. A rank that reads the
        notice stops in turn and, once it has said why, sends its own: mpiexec ends every rank
        as soon as one exits with an error, and without the wait the others could be ended
        before saying why they stop."""
        data = numpy.frombuffer(f"{message}".encode(), dtype=numpy.uint8).copy()
        requests = [self._notices.Isend([data, self.MPI.BYTE], dest=r, tag=_FAILED)
                    for r in range(self.size) if r != self.rank]
        deadline = time.monotonic() + grace
        while not self.MPI.Request.Testall(requests) and time.monotonic() < deadline:
            time.sleep(0.001)
        waiting = set(range(self.size)) - self._heard - {self.rank}
        while waiting and time.monotonic() < deadline:
            notice = self._notice()
            if notice is None:
                time.sleep(0.001)
            else:
                waiting.discard(notice[0])

    # ---------------------------------------------------------------- collectives
    def allreduce_start(self, buffer):
        """Start summing the host array `buffer` over the ranks, in place; returns a request."""
        return self.mpi.Iallreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)

    def any_rank(self, flag, what="a vote"):
        """Whether `flag` is true on at least one rank (every rank must ask, in the same
        order); it may be asked while all-reduces started with `allreduce_start` are pending."""
        return self.any_ranks([flag], what)[0]

    def any_ranks(self, flags, what="a vote"):
        """any_rank for each of `flags` (a list), in one vote: a list of bools."""
        vote = numpy.array([1 if flag else 0 for flag in flags], dtype=numpy.int32)
        self.wait([self._votes.Iallreduce(self.MPI.IN_PLACE, vote, op=self.MPI.MAX)], what)
        return [bool(v) for v in vote]

    def broadcast(self, buffer, root=0, what="a broadcast"):
        """`buffer` (a host array) from `root` into every rank's `buffer`, in place."""
        self.wait([self.mpi.Ibcast(buffer, root=root)], what)

    def barrier(self, what="a barrier"):
        """Return when every rank has reached it."""
        self.wait([self.mpi.Ibarrier()], what)

    def broadcast_json(self, obj, root=0, what="a broadcast"):
        """`obj` (JSON-able) as it is on `root`, on every rank."""
        data = _encoded(obj) if self.rank == root else None
        size = numpy.array([0 if data is None else data.size], dtype=numpy.int64)
        self.broadcast(size, root, what)
        if data is None:
            data = numpy.empty(int(size[0]), dtype=numpy.uint8)
        self.broadcast(data, root, what)
        return json.loads(data.tobytes().decode())

    def allgather_json(self, obj, what="an all-gather"):
        """[obj of rank 0, obj of rank 1, ...] on every rank (obj JSON-able)."""
        data = _encoded(obj)
        sizes = numpy.empty(self.size, dtype=numpy.int64)
        self.wait([self.mpi.Iallgather(numpy.array([data.size], dtype=numpy.int64), sizes)], what)
        gathered = numpy.empty(int(sizes.sum()), dtype=numpy.uint8)
        self.wait([self.mpi.Iallgatherv(data, [gathered, (sizes, None)])], what)
        ends = numpy.cumsum(sizes)
        return [json.loads(gathered[end - n:end].tobytes().decode())
                for n, end in zip(sizes, ends)]


def _checked_timeout(timeout):
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def _encoded(obj):
    return numpy.frombuffer(json.dumps(obj).encode(), dtype=numpy.uint8).copy()


def _meet(world, MPI, timeout):
    """A duplicate of `world`, made once every rank has called this: a non-blocking duplicate
    (MPI_Comm_idup) waited for with the deadline, else DistributedError. Nothing is sent on
    `world`, the program's: a message there could be taken by a receive of the program's own
    (any source, any tag), so the ranks missing at the deadline go unnamed."""
    if world.Get_size() == 1:
        return world.Dup()
    own, request = world.Idup()
    rank, size = world.Get_rank(), world.Get_size()
    # rank 0 raises first (the first rank that raises ends the job), the others a moment later
    deadline = time.monotonic() + timeout + (0 if rank == 0 else 1.0)
    while not request.Test():
        if time.monotonic() > deadline:
            _abandoned.append(request)  # MPI may still complete it
            raise DistributedError(
                f"rank {rank}: not every rank of {size} reached dist.init within {timeout:g} s: "
                "one may have failed before (its output then shows the error), or need longer "
                "to get there (dist.init(timeout=...)); every rank must call dist.init")
        time.sleep(0.001)  # the others may take long to come: leave them the cores
    return own


_abandoned = []  # requests of a meeting that timed out, still pending
_communicators = {}
_reporting = []  # the communicators an uncaught exception sends word through
_hook_installed = False  # sys.excepthook chained (by the first init)


def init(backend="mpi", timeout=None):
    """The Communicator of this job, made once per backend: "mpi" sums gradients with MPI on
    the host; "nccl" with NCCL on the GPUs (CuPy's bindings; MPI still carries the rest).
    Without mpiexec, a job of one process.

    `timeout`: seconds any wait may take before it raises DistributedError (DEFAULT_TIMEOUT
    when not given; given to a later call, it becomes the made Communicator's), this call's own
    wait for every rank to call it included. From here on, an exception no one catches on this
    rank sends word to the others, whose next wait raises DistributedError naming this rank,
    and then ends the job (MPI_Abort), so no rank is left waiting for it."""
    if backend not in ("mpi", "nccl"):
        raise ValueError(f"dist.init: backend must be 'mpi' or 'nccl', got {backend!r}")
    if backend in _communicators:
        comm = _communicators[backend]
        if timeout is not None:  # e.g. local_device() made it first, with the default
            comm.timeout = _checked_timeout(timeout)
        return comm
    MPI = _import_mpi()
    _report_failures(MPI)  # first: a rank failing in what follows ends the job too
    comm = Communicator(MPI.COMM_WORLD, DEFAULT_TIMEOUT if timeout is None else timeout, backend)
    _reporting.append(comm)
    if backend == "nccl":
        from .nccl import NcclReducer
        comm.reducer = NcclReducer(comm)
    else:
        comm.reducer = MpiReducer(comm)
    _communicators[backend] = comm
    return comm


class MpiReducer:
    """Sums gradient buckets over the ranks with MPI, on host arrays (NumPy)."""

    on_device = False

    def __init__(self, comm):
        self.comm = comm

    def start(self, buffer):
        """Start summing `buffer` (a host array) over the ranks, in place; returns a request."""
        return self.comm.allreduce_start(buffer)

    def progress(self, handles):
        """Let MPI move the started sums on (it works only inside MPI calls)."""
        if handles:
            self.comm.MPI.Request.Testall(handles)

    def wait(self, handles):
        self.comm.wait(handles, "the gradient all-reduce")


def _report_failures(MPI):
    """Chain sys.excepthook (once): an uncaught exception, once printed, sends word to the
    other ranks (and waits a moment for theirs: see Communicator.notify_failure), then ends the
    job with MPI_Abort. Without the abort the rank would not exit: mpi4py calls MPI_Finalize at
    exit, and MPICH's waits there until every other rank has called it too, so mpiexec (which
    ends the job once a rank exits with an error) would see no rank end."""
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    previous = sys.excepthook

    def excepthook(kind, value, traceback):
        previous(kind, value, traceback)
        if MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() == 1:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        for comm in _reporting:
            comm.notify_failure(f"{kind.__name__}: {value}")
        MPI.COMM_WORLD.Abort(1)

    sys.excepthook = excepthook


def local_device(comm=None):
    """The device for this rank: "cuda:<local_rank modulo the GPUs here>" when CuPy sees a GPU,
    else "cpu". Give it to `Module.to` and the DataLoader."""
    import backends
    if not backends.cuda_available():
        return "cpu"
    comm = comm if comm is not None else init()
    import cupy
    return f"cuda:{comm.local_rank % cupy.cuda.runtime.getDeviceCount()}"

