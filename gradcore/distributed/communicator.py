"""The ranks of one job: MPI through mpi4py, with a deadline and failure notices on every wait.

Every collective here is started non-blocking and waited for by `Communicator.wait`, which
polls: it returns when the requests complete, raises DistributedError when another rank has
sent word that it failed (an exception no one caught: see `init`) or that it exited (and the
requests still do not complete), and raises one when the deadline passes (a rank that died
without word, or stopped calling the collectives). So a job ends with a message naming the
failing rank instead of hanging. Making the communicators waits so too (see `_meet`).

Metadata (parameter names, random generator states) travels as JSON, never as pickles.
"""
import atexit
import json
import os
import sys
import threading
import time

import numpy

__all__ = ["Communicator", "DistributedError", "init", "local_device"]

DEFAULT_TIMEOUT = 300.0
# the tags of the notices, on a communicator of their own: a rank failed; a rank's program ended;
# a rank read a failure notice and stops (it sends its own once it has said why)
_FAILED, _EXITED, _STOPPING = 7001, 7002, 7003
# seconds a wait goes on after word that a rank exited: a collective whose part on that rank was
# done before it exited completes meanwhile (at the end of a program, the last one); one it never
# started cannot
EXIT_GRACE = 2.0
# seconds a failing rank waits, at most, for word back from a rank that read its notice and stops:
# printing a traceback can take seconds on a loaded machine, and the job ends when the failing
# rank stops waiting (a rank that never read the notice is waited for `grace` seconds only)
STOPPING_GRACE = 30.0
# seconds a failing rank waits before it ends the job: see _report_failures
FORWARD_PAUSE = 1.0


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
        self._heard = {}  # rank -> the failure its notice reported, for the notices read
        self._stopping = set()  # the ranks that read a failure notice and stop
        self._exited = {}  # rank -> (how it exited, when this rank read that), from its notice
        # votes apart from the data: at a vote the ranks may have started different numbers of
        # sums, and MPI pairs one communicator's collectives in the order started
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
        the collective in errors. Raises DistributedError if another rank reports a failure,
        if one reports that it exited and the requests do not complete within EXIT_GRACE
        seconds, or after `timeout` seconds."""
        test_all = self.MPI.Request.Testall
        if test_all(requests):
            return
        self._check_heard(what)
        began = time.monotonic()
        deadline = began + self.timeout
        polls = 0
        # MPI moves a transfer on only inside MPI calls: keep testing (a pause between tests
        # would slow the transfer itself once it starts), as MPI's own blocking wait does
        while not test_all(requests):
            polls += 1
            if polls % 64 == 0:  # the notices and the clock now and then, not on every poll
                self.check_notices(what, since=began)
                if time.monotonic() > deadline:
                    raise DistributedError(
                        f"rank {self.rank}: {what} did not complete within {self.timeout:g} s: "
                        "another rank stopped taking part (it may be stuck, or it ended without "
                        "word). Set dist.init(timeout=...) for longer steps.")
                if polls > 20000:  # a long wait: let another process have the core a moment
                    time.sleep(0)

    def check_notices(self, what="the job", since=None):
        """Raise DistributedError if another rank has sent word that it failed. `since`: when
        the caller began waiting (time.monotonic()) for requests still pending; then also if
        another rank has sent word that it exited, EXIT_GRACE seconds or more both after
        `since` and after this rank read that word."""
        while (notice := self._notice()) is not None:
            source, tag, message = notice
            if tag == _FAILED:
                # say at once that this rank stops, so that a failing rank waits for the word
                # this rank sends once it has printed why: to every rank, as another may fail
                # too, its notice still on its way
                self._send_notice(_STOPPING, "", 1.0)
                raise DistributedError(f"rank {source} failed ({message}); "
                                       f"rank {self.rank} stops in {what}")
        self._check_heard(what)
        if since is None or not self._exited:
            return
        now = time.monotonic()
        gone = [(rank, how) for rank, (how, heard) in sorted(self._exited.items())
                if now > max(since, heard) + EXIT_GRACE]
        if gone:
            rank, how = gone[0]
            raise DistributedError(
                f"rank {rank} exited ({how}) without taking part; rank {self.rank} stops in "
                f"{what}: every rank must take part in every collective (as many steps on "
                "every rank: dist.scatter_dataset gives every rank an equal share)")

    def _check_heard(self, what):
        """Raise DistributedError if a failure notice was read before (a program that caught
        the first DistributedError and goes on to another collective, a save or a barrier):
        the failed rank takes part in nothing more, so the wait could only end at its abort."""
        if self._heard:
            source, message = next(iter(self._heard.items()))
            raise DistributedError(f"rank {source} failed earlier ({message}); rank "
                                   f"{self.rank} stops in {what}")

    def _notice(self):
        """(rank, tag, message) of a notice that has arrived, read and noted; None if none
        has."""
        status = self.MPI.Status()
        if not self._notices.Iprobe(source=self.MPI.ANY_SOURCE, tag=self.MPI.ANY_TAG,
                                    status=status):
            return None
        source, tag = status.Get_source(), status.Get_tag()
        message = numpy.empty(status.Get_count(self.MPI.BYTE), dtype=numpy.uint8)
        self._notices.Recv([message, self.MPI.BYTE], source=source, tag=tag)
        message = message.tobytes().decode()
        if tag == _EXITED:
            self._exited.setdefault(source, (message, time.monotonic()))
        elif tag == _STOPPING:
            self._stopping.add(source)
        else:
            self._heard.setdefault(source, message)
        return source, tag, message

    def _send_notice(self, tag, message, grace):
        """Send `message` with `tag` to every other rank, and wait until MPI has sent it (small
        messages go at once), `grace` seconds at most; returns when that wait had to end
        (time.monotonic())."""
        data = numpy.frombuffer(f"{message}".encode(), dtype=numpy.uint8).copy()
        requests = [self._notices.Isend([data, self.MPI.BYTE], dest=r, tag=tag)
                    for r in range(self.size) if r != self.rank]
        deadline = time.monotonic() + grace
        while not self.MPI.Request.Testall(requests) and time.monotonic() < deadline:
            time.sleep(0.001)
        return deadline

    def notify_failure(self, message, grace=2.0):
        """Send word of this rank's failure (`message`) to every other rank, then wait for word
        back from each rank not heard from yet. A rank that reads the notice says at once that
        it stops, and once it has printed why, sends its own failure notice: mpiexec ends every
        rank as soon as one exits with an error, and without the wait the others could be ended
        before saying why they stop. A rank that has not read the notice within `grace` seconds
        (busy outside gradcore, or exited) is not waited for; one that said it stops is, for
        STOPPING_GRACE seconds at most."""
        deadline = self._send_notice(_FAILED, message, grace)
        last = deadline - grace + STOPPING_GRACE
        waiting = set(range(self.size)) - set(self._heard) - set(self._exited) - {self.rank}
        while waiting:
            now = time.monotonic()
            if now > last or (now > deadline and not waiting & self._stopping):
                return
            notice = self._notice()
            if notice is None:
                time.sleep(0.001)
            elif notice[1] != _STOPPING:
                waiting.discard(notice[0])

    def notify_exit(self, how, grace=1.0):
        """Send word that this rank's program is ending (`how`: "status 2", say) to every other
        rank: one left waiting for it in a collective raises, naming it, instead of waiting out
        its deadline. A rank that finished every collective with it never reads the word."""
        self._send_notice(_EXITED, how, grace)

    # ---------------------------------------------------------------- collectives
    def allreduce_start(self, buffer, channel=None):
        """Start summing the host array `buffer` over the ranks, in place, on `channel` (one
        made by `duplicate`; None: this Communicator's own); returns a request."""
        mpi = self.mpi if channel is None else channel
        return mpi.Iallreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)

    def duplicate(self, what="a duplicate"):
        """An MPI communicator of the same ranks whose collectives pair only with each other's:
        MPI pairs each rank's n-th collective on a communicator with the others' n-th, so sums
        started in an order that differs between the ranks (as backward finishes gradients)
        need one of their own. Every rank must ask, in the same order; `release` frees it."""
        channel, request = self.mpi.Idup()
        self.wait([request], what)
        return channel

    def release(self, channel):
        """Free `channel` (made by `duplicate`), unless MPI has ended already. Its sums still
        pending complete; freeing is local to this rank."""
        if not self.MPI.Is_finalized():
            channel.Free()

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

    def from_root(self, make, root=0, what="a broadcast"):
        """`make()`, called on `root` only, on every rank (its result JSON-able). If it raises
        there, or its result is not JSON-able, every rank raises at once, not at the deadline:
        `root` its exception, the others DistributedError naming it."""
        made = failure = None
        if self.rank == root:
            try:
                made = make()
                json.dumps(made)  # here, so that the others hear of a result that cannot go
            except Exception as e:
                made, failure = None, e
        sent = self.broadcast_json(
            [made, None if failure is None else f"{type(failure).__name__}: {failure}"],
            root, what)
        if failure is not None:
            raise failure
        result, error = sent
        if error is not None:
            raise DistributedError(f"rank {root} failed in {what} ({error}); every rank stops "
                                   "there")
        return result

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
    and then ends the job (MPI_Abort), so no rank is left waiting for it. So does this rank's
    exit (sys.exit, or the end of the program) where another rank waits for it in vain: that
    wait raises within EXIT_GRACE seconds, naming it and sys.exit's status."""
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
        try:
            comm.reducer = NcclReducer(comm)
        except BaseException:
            # kept for a failure of this rank to reach ranks waiting in it, but told last: a
            # program that falls back (init("mpi")) waits in the Communicator made next
            _reporting.remove(comm)
            _reporting.insert(0, comm)
            raise
    else:
        comm.reducer = MpiReducer(comm)
    _communicators[backend] = comm
    return comm


class MpiReducer:
    """Sums gradient buckets over the ranks with MPI, on host arrays (NumPy)."""

    on_device = False

    def __init__(self, comm):
        self.comm = comm

    def channel(self):
        """What one DistributedOptimizer sums on (give it to `start`): an MPI communicator of
        its own (Communicator.duplicate), so that no other optimizer's sums and no collective
        of the program's pair with its own. A job of one rank sums alone: None there. Every
        rank must ask, in the same order; `release` frees it."""
        if self.comm.size == 1:
            return None
        return self.comm.duplicate("making a DistributedOptimizer (every rank makes each one, "
                                   "in the same order)")

    def release(self, channel):
        """Free what `channel` made."""
        self.comm.release(channel)

    def start(self, buffer, channel=None):
        """Start summing `buffer` (a host array) over the ranks, in place, on `channel` (see
        `channel`; None: the Communicator's own); returns a request."""
        return self.comm.allreduce_start(buffer, channel)

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
    ends the job once a rank exits with an error) would see no rank end.

    In a job of several ranks, also send word when the program exits (`_report_exit`), which
    sys.excepthook never hears of (SystemExit: sys.exit, argparse's errors)."""
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
        try:
            text = str(value)
        except Exception:  # as traceback prints it: the failure still goes out
            text = "<exception str() failed>"
        try:
            for comm in reversed(_reporting):  # the one made last first: see init
                comm.notify_failure(f"{kind.__name__}: {text}")
        finally:  # the job ends whatever happened above: MPI_Finalize would wait forever
            # MPI_Abort ends every rank at once, and mpiexec drops output it has not forwarded
            # yet: a moment for what this rank (and one whose word just came) printed to get out
            time.sleep(FORWARD_PAUSE)
            MPI.COMM_WORLD.Abort(1)

    sys.excepthook = excepthook
    if MPI.COMM_WORLD.Get_size() > 1:
        sys.exit = _noting_status(sys.exit)
        # Python runs atexit's functions before mpi4py's MPI_Finalize (registered with
        # Py_AtExit, which runs last), so MPI still works there
        atexit.register(_report_exit, MPI, os.getpid())


_exit_status = []  # the argument of the last sys.exit on the main thread, if one was called


def _noting_status(exit):
    """sys.exit (`exit`), noting its status for `_report_exit`: by the time Python runs the
    atexit functions, it has let go of the SystemExit and its status."""
    def noted_exit(status=None, /):
        if threading.current_thread() is threading.main_thread():
            _exit_status[:] = [status]
        exit(status)
    noted_exit.__doc__ = exit.__doc__
    return noted_exit


def _report_exit(MPI, pid):
    """Send every other rank word that this rank's program ends, with sys.exit's status where
    it was called: a rank left waiting for this one raises, naming it, instead of waiting out
    its deadline. Not from a forked child, which shares the parent's MPI state."""
    if os.getpid() != pid or MPI.Is_finalized():
        return
    how = "its program ended"  # no sys.exit: the end of the program, or SystemExit raised
    if _exit_status:  # the exit status as Python makes it of sys.exit's argument
        status = _exit_status[0]
        how = ("status 0" if status is None else f"status {int(status)}"
               if isinstance(status, int) else f"status 1: {str(status)[:200]}")
    sys.stdout.flush()  # mpiexec may end this rank in MPI_Finalize once another reads the word
    sys.stderr.flush()
    for comm in _reporting:
        comm.notify_exit(how)


def local_device(comm=None):
    """The device for this rank: "cuda:<local_rank modulo the GPUs here>" when CuPy sees a GPU,
    else "cpu". Give it to `Module.to` and the DataLoader."""
    import backends
    if not backends.cuda_available():
        return "cpu"
    comm = comm if comm is not None else init()
    import cupy
    return f"cuda:{comm.local_rank % cupy.cuda.runtime.getDeviceCount()}"

