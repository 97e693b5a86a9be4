"""manual_seed: one call seeds the global generator of every backend in use. draw: how ops draw
from those generators, so that gradcore.checkpoint draws a block's numbers again exactly; noted:
how ops read other state that may change before backward, so that it reads the same again."""
import os
import sys
import threading

import backends
from backends.base import HostRandom

_METHODS = {"normal": "random_normal", "uniform": "random_uniform"}
# Held around every draw of an op: a noted draw's reading of the generator's state, its draw and
# its reading of where that left the generator come in one piece
_lock = threading.Lock()
_local = threading.local()  # .logs: the DrawLogs open on this thread; .replays: its replays
# The DrawLogs and replays open on any thread: each learns whether another thread's op drew from
# its generator while it was open
_watching = []
# Held by a replay that sets a global generator back, from its start to its end, so one thread
# at a time does (two would each put the generator "back" where the other had set it); the
# other threads' ops draw meanwhile from where the generator stands for them (_drawn_aside)
_setting_back = threading.RLock()
_WAIT = 60  # seconds a replay waits for another thread's to end before it raises


def _after_fork():
    """In the child of an os.fork (multiprocessing's workers on Linux): the parent's other
    threads are not there, so neither are their logs and replays, and a lock one of them held
    would never be released; the forking thread keeps what it holds."""
    global _lock, _setting_back
    me = threading.get_ident()
    _watching[:] = [watcher for watcher in _watching if watcher.thread == me]
    _lock = threading.Lock()  # held around a draw only: never by the thread that forks
    if not _setting_back._is_owned():
        _setting_back = threading.RLock()


os.register_at_fork(after_in_child=_after_fork)


def manual_seed(seed):
    """Seed the global random generator of every backend in use: NumPy's (np.random.seed, which
    array-API backends draw from too) and, when CuPy is already imported and sees a GPU, CuPy's
    on every GPU. Dropout masks then repeat from run to run. Any integer in [0, 2**32) is
    taken (a NumPy one too, as np.random.seed takes it); a bool is not. Never imports CuPy."""
    from .optim.hyperparameters import as_integer  # not at the top: optim imports this module
    value = as_integer(seed)  # an int, np.int64...; None for a bool, a float, a string
    if value is None or not 0 <= value < 2 ** 32:
        raise ValueError(f"manual_seed: the seed must be an int in [0, 2**32), got {seed!r}")
    seed = value
    if sys.modules.get("cupy") is not None:
        backends.cuda_available()  # registers the CuPy backend when a GPU is there
    for backend in backends.registered():
        backend.manual_seed(seed)


def draw(backend, kind, shape, dtype, device):
    """`kind` ("normal" or "uniform") samples from `backend`'s global generator for `device`,
    as ops draw them. While a DrawLog is open on this thread the draw is noted with the
    generator's state; while it is replayed, the same numbers come again from that state."""
    local = _local.__dict__
    logs, replays = local.get("logs"), local.get("replays")
    if not logs and not replays:
        with _lock:
            if _watching:
                replay = _seen_by_others(backend, device)
                if replay is not None:
                    return _drawn_aside(replay, backend, kind, shape, dtype, device)[0]
            return getattr(backend, _METHODS[kind])(shape, dtype, device)
    replay, logs = _replay_and_logs(logs, replays)
    if replay is not None:
        samples, noted = replay.draw(backend, kind, shape, dtype, device)
    else:
        samples, noted = _noted_draw(backend, kind, shape, dtype, device)
    for log in logs:
        log.draws.append(noted)
    return samples


def noted(what, read, *args):
    """read(*args): an op's reading of state that may change in place before backward (batch
    norm's running statistics), as arrays of its own; `what` names it. While a DrawLog is open on
    this thread the result is noted with the draws; while one is replayed, the results noted come
    back instead, in order, so that a checkpointed block computed again reads what it first read."""
    local = _local.__dict__
    logs, replays = local.get("logs"), local.get("replays")
    if not logs and not replays:
        return read(*args)
    replay, logs = _replay_and_logs(logs, replays)
    value = read(*args) if replay is None else replay.read(what, args)
    for log in logs:
        log.reads.append((what, args, value))
    return value


def _replay_and_logs(logs, replays):
    """The replay open innermost on this thread (None if none), and the DrawLogs that note what an
    op takes now: every open one (the logs of enclosing blocks too), or under a replay only those
    opened since (what it hands back again is new to them alone)."""
    if not replays:
        return None, logs
    replay = replays[-1]
    return replay, logs[replay.depth:] if logs else ()


def _seen_by_others(backend, device, set_back=False):
    """Tell the logs and replays of other threads on this generator that an op drew from it
    (`set_back`: that a replay set it back, so their blocks' own numpy.random draws come from
    numbers it hands out again). Returns the replay among them that has set it back, if one
    has (see _set_back_elsewhere)."""
    me, replay, generator = threading.get_ident(), None, _generator(backend, device)
    for watcher in _watching:  # the outermost first, should that thread nest replays
        if watcher.thread != me and watcher.generator == generator:
            watcher.others = True
            watcher.beside = watcher.beside or set_back
            if watcher.sets_back and replay is None:
                replay = watcher
    return replay


def _set_back_elsewhere(backend, device):
    """The replay of another thread that has set this generator back, if one is open: it holds
    where the generator stands for this thread (`now`). Called under _lock."""
    me, generator = threading.get_ident(), _generator(backend, device)
    for watcher in _watching:
        if watcher.sets_back and watcher.thread != me and watcher.generator == generator:
            return watcher
    return None


def _drawn_aside(replay, backend, kind, shape, dtype, device):
    """(samples, state, state after) drawn from where `replay`, of another thread, put this
    generator aside, moving it on there: numbers the replay hands out again are not handed to
    this thread's ops too. Called under _lock."""
    state = replay.now
    with backend.random_lock(device):  # the replaying block's numpy.random calls wait
        set_back = backend.random_state(device)
        backend.set_random_state(device, state)
        samples = getattr(backend, _METHODS[kind])(shape, dtype, device)
        replay.now = backend.random_state(device)
        backend.set_random_state(device, set_back)
    return samples, state, replay.now


def _state_here(backend, device):
    """(the state of this generator as this thread's ops draw from it, whether another thread's
    replay has set the generator itself back). Called under _lock."""
    replay = _set_back_elsewhere(backend, device)
    return (backend.random_state(device), False) if replay is None else (replay.now, True)


class Draw:
    """One noted draw: what was drawn, the generator's state before and after it, and its
    positions there (None where the backend cannot read them)."""

    __slots__ = ("backend", "kind", "shape", "dtype", "device", "state", "state_after",
                 "position", "position_after")

    def __init__(self, backend, kind, shape, dtype, device, state, state_after):
        self.backend, self.kind, self.shape, self.dtype = backend, kind, tuple(shape), dtype
        self.device, self.state, self.state_after = device, state, state_after
        self.position = backend.random_position(device, state)
        self.position_after = backend.random_position(device, state_after)

    def is_like(self, backend, kind, shape, dtype, device):
        return (backend is self.backend and kind == self.kind and tuple(shape) == self.shape
                and dtype == self.dtype and device == self.device)

    def __str__(self):
        return f"{self.kind} samples of shape {self.shape}, {self.dtype}, on {self.device}"


def _noted_draw(backend, kind, shape, dtype, device):
    # the generator's own lock too: numpy.random called by any thread waits for the three steps
    with _lock, backend.random_lock(device):
        replay = _seen_by_others(backend, device) if _watching else None
        if replay is None:
            state = backend.random_state(device)
            samples = getattr(backend, _METHODS[kind])(shape, dtype, device)
            state_after = backend.random_state(device)
        else:
            samples, state, state_after = _drawn_aside(replay, backend, kind, shape, dtype, device)
    return samples, Draw(backend, kind, shape, dtype, device, state, state_after)


def _generator(backend, device):
    """What tells the generator `backend` draws from for `device`: every backend that draws on
    the host (NumPy, array-API libraries, Dask), on every device, draws from numpy.random's one
    generator; another has one per device unless it has one device (ops give the device None
    there)."""
    if isinstance(backend, HostRandom):
        return HostRandom
    return backend if backend.single_device else (backend, device)


class _Watcher:
    """Open on one thread, for one generator: `others` turns True when an op of another thread
    draws from it, `beside` when a replay of another thread sets it back."""

    sets_back = False  # True while a replay has set the generator back

    def __init__(self, backend, device):
        self.backend, self.device = backend, device
        self.generator = _generator(backend, device)
        self.thread, self.others, self.beside = threading.get_ident(), False, False

    def drawn_from(self, backend, device):
        """True if `backend` draws for `device` from this generator."""
        return _generator(backend, device) == self.generator


class DrawLog(_Watcher):
    """A context manager noting the draws ops make on this thread while it is open, and where
    `backend`'s generator for `device` (the block's) was as it opened and closed, and what else
    they read that may change (see noted); `replay()` draws the same numbers again and hands back
    what they read."""

    def __init__(self, backend, device):
        super().__init__(backend, device)
        self.draws = []
        self.reads = []  # (what, args, value) for each call of noted, in order
        self.state = self.start = self.end = None
        self.untracked = True

    def __enter__(self):
        with _lock:
            self.state, self.beside = _state_here(self.backend, self.device)
            self.others = self.beside
            _watching.append(self)
        self.start = self.backend.random_position(self.device, self.state)
        _local.__dict__.setdefault("logs", []).append(self)
        return self

    def __exit__(self, *exc):
        _local.logs.remove(self)
        with _lock:
            _watching.remove(self)
            end = _state_here(self.backend, self.device)[0]
        self.end = self.backend.random_position(self.device, end)
        self.untracked = self.others or self._moved_otherwise()
        return False

    def _moved_otherwise(self):
        """True unless the block's generator moved by the noted draws alone while the log was
        open (always True where its position cannot be read)."""
        at = self.start
        if at is None or self.end is None:
            return True
        for d in self.draws:
            if self.drawn_from(d.backend, d.device):
                if d.position != at:
                    return True
                at = d.position_after
        return at != self.end

    def replay(self):
        """A context manager under which ops draw the noted numbers again, in order."""
        return _Replay(self)


class _Replay(_Watcher):
    """The noted draws again, each from a generator of its own started at its noted state. If
    nothing but them moved the block's generator the first time, the global generator is left
    alone. Otherwise the block drew past the ops (numpy.random in its own code), or another
    thread's ops drew meanwhile, maybe work the block handed them: the global generator is put
    back where it was as the block began and moved on as then, so the block's own draws repeat
    too; it must have moved, between noted draws, as the first time or not at all, and no other
    thread's op may draw from it meanwhile (their draws could be the block's, in another order);
    afterwards it is put back where it is now. One thread at a time sets a generator back; other
    threads' ops draw meanwhile from where it stands for them. A block that ran the first time
    while another thread's replay had set the generator back drew its own numpy.random numbers
    from there: only its noted draws may move the generator now."""

    def __init__(self, log):
        super().__init__(log.backend, log.device)
        self.log, self.taken, self.read_count = log, 0, 0
        self.at = log.start  # where the generator is when nothing but noted draws moved it
        self.now = self.depth = None

    def __enter__(self):
        log = self.log
        if log.untracked:
            if not _setting_back.acquire(timeout=_WAIT):
                raise RuntimeError(
                    f"checkpoint: waited {_WAIT} s for another thread's checkpointed block, "
                    "computed again, to end: one thread at a time may set the global random "
                    "generator back to where its block began (does that block wait for this "
                    "thread?). Blocks whose random numbers come from gradcore's ops (F.dropout) "
                    "in their own threads alone are computed again without setting it back")
            try:
                with _lock:
                    _seen_by_others(log.backend, log.device, set_back=True)
                    self.now = log.backend.random_state(log.device)
                    log.backend.set_random_state(log.device, log.state)
                    self.sets_back = True
                    _watching.append(self)
            except BaseException:
                _setting_back.release()
                raise
        self.depth = len(_local.__dict__.get("logs") or ())
        _local.__dict__.setdefault("replays", []).append(self)
        return self

    def draw(self, backend, kind, shape, dtype, device):
        log, i = self.log, self.taken
        if i == len(log.draws) or not log.draws[i].is_like(backend, kind, shape, dtype, device):
            first = f"{log.draws[i]}" if i < len(log.draws) else "nothing more"
            raise RuntimeError(
                f"checkpoint: computed again, the block drew other random numbers than the "
                f"first time (draw {i + 1}: {kind} samples of shape {tuple(shape)}, {dtype}, on "
                f"{device}, where it first drew {first}): what a checkpointed block draws must "
                "depend on its inputs alone")
        noted = log.draws[i]
        self.taken += 1
        if not log.untracked:
            return backend.random_draw(kind, shape, dtype, device, noted.state), noted
        own = log.drawn_from(backend, device)
        with _lock:
            _seen_by_others(backend, device)
            if own:
                self._check(backend.random_position(device), noted.position)
            samples = backend.random_draw(kind, shape, dtype, device, noted.state)
            backend.set_random_state(device, noted.state_after)
        if own:
            self.at = noted.position_after
        return samples, noted

    def read(self, what, args):
        """The value the next noted read of the first run got: of `what`, with `args`."""
        reads, i = self.log.reads, self.read_count
        if i == len(reads) or reads[i][:2] != (what, args):
            first = f"{reads[i][0]} {reads[i][1]}" if i < len(reads) else "nothing more"
            raise RuntimeError(
                f"checkpoint: computed again, the block read other state than the first time "
                f"(read {i + 1}: {what} {args}, where it first read {first}): what a "
                "checkpointed block does must depend on its inputs alone")
        self.read_count += 1
        return reads[i][2]

    def _check(self, position, first):
        """The generator must be where it was the first time, or where the noted draws left it
        (nothing drew since): other moves mean other draws mixed in, then or now. Where the
        block first ran beside another thread's replay, only the latter."""
        if self.log.beside:
            first = self.at
        if self.others or position is not None and position != first and position != self.at:
            raise RuntimeError(
                "checkpoint: the block's random numbers cannot be drawn again as it drew them: "
                "something drew from the generator past the block's own ops while it ran (the "
                "first time or now): numpy.random in the block's code, or another thread, "
                "perhaps with work the block handed it. The block's ops are drawn again exactly "
                "but such draws are not: draw the block's random numbers through gradcore's ops "
                "(F.dropout) in the block's own thread, or run it while no other thread draws")

    def __exit__(self, kind, error, traceback):
        log = self.log
        _local.replays.remove(self)
        try:
            if error is None and self.taken != len(log.draws):
                raise RuntimeError(
                    f"checkpoint: computed again, the block drew {self.taken} times where it "
                    f"first drew {len(log.draws)} times: what a checkpointed block draws must "
                    "depend on its inputs alone")
            if error is None and self.read_count != len(log.reads):  # fewer: more raise in read
                raise RuntimeError(
                    f"checkpoint: computed again, the block's ops read state that may change "
                    f"({log.reads[self.read_count][0]}) {self.read_count} times where they first "
                    f"read it {len(log.reads)} times: what a checkpointed block does must depend "
                    "on its inputs alone")
            if error is None and log.untracked:
                self._check(log.backend.random_position(log.device), log.end)
        finally:
            if log.untracked:
                try:
                    with _lock:
                        _watching.remove(self)
                        self.sets_back = False
                        _seen_by_others(log.backend, log.device)
                        log.backend.set_random_state(log.device, self.now)
                finally:
                    _setting_back.release()
        return False
