"""manual_seed: one call seeds the global generator of every backend in use. draw: how ops draw
from those generators, so that gradcore.checkpoint draws a block's numbers again exactly."""
import sys
import threading

import backends

_METHODS = {"normal": "random_normal", "uniform": "random_uniform"}
# Held around every draw of an op, and around a noted draw's reading, drawing and moving on of
# the global generator: no op of another thread draws in between
_lock = threading.Lock()
_local = threading.local()  # .logs: the DrawLogs open on this thread; .replays: its replays
# While any DrawLog is open (`_open` of them, on any thread), every op's draw in every thread,
# in the order made, with the generator's positions around it: a log tells from it whether
# only ops moved its generator while it was open
_journal = []
_open = 0


def manual_seed(seed):
    """Seed the global random generator of every backend in use: NumPy's (np.random.seed, which
    array-API backends draw from too) and, when CuPy is already imported and sees a GPU, CuPy's
    on every GPU. Dropout masks then repeat from run to run. Never imports CuPy."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32:
        raise ValueError(f"manual_seed: the seed must be an int in [0, 2**32), got {seed!r}")
    if sys.modules.get("cupy") is not None:
        backends.cuda_available()  # registers the CuPy backend when a GPU is there
    for backend in backends.registered():
        backend.manual_seed(seed)


def draw(backend, kind, shape, dtype, device):
    """`kind` ("normal" or "uniform") samples from `backend`'s global generator for `device`,
    as ops draw them. While a DrawLog is open on this thread the draw is noted with where the
    generator was; while it is replayed, the same numbers come again from there, drawn by a
    generator of their own, whatever other threads drew meanwhile."""
    local = _local.__dict__
    logs, replays = local.get("logs"), local.get("replays")
    if not logs and not replays:
        with _lock:
            if not _open:
                return getattr(backend, _METHODS[kind])(shape, dtype, device)
            position = backend.random_position(device)
            samples = getattr(backend, _METHODS[kind])(shape, dtype, device)
            _journal.append(Draw(backend, kind, shape, dtype, device, None, None, position,
                                 backend.random_position(device)))
            return samples
    if replays:
        samples, noted = replays[-1].draw(backend, kind, shape, dtype, device)
    else:
        samples, noted = _noted_draw(backend, kind, shape, dtype, device)
    for log in logs or ():  # the open logs of enclosing blocks note it too
        log.draws.append(noted)
    return samples


class Draw:
    """One noted draw: what was drawn, the generator's state before and after it, and its
    positions (None where the backend cannot read them)."""

    __slots__ = ("backend", "kind", "shape", "dtype", "device", "state", "state_after",
                 "position", "position_after")

    def __init__(self, backend, kind, shape, dtype, device, state, state_after, position,
                 position_after):
        self.backend, self.kind, self.shape, self.dtype = backend, kind, tuple(shape), dtype
        self.device, self.state, self.state_after = device, state, state_after
        self.position, self.position_after = position, position_after

    def is_like(self, backend, kind, shape, dtype, device):
        return (backend is self.backend and kind == self.kind and tuple(shape) == self.shape
                and dtype == self.dtype and device == self.device)

    def __str__(self):
        return f"{self.kind} samples of shape {self.shape}, {self.dtype}, on {self.device}"


def _noted_draw(backend, kind, shape, dtype, device):
    # drawn by a generator of its own from the global one's state, which then moves on past
    # it: the numbers are those of the noted state whatever draws without the lock
    with _lock:
        position = backend.random_position(device)
        state = backend.random_state(device)
        samples, state_after = backend.random_draw(kind, shape, dtype, device, state)
        backend.set_random_state(device, state_after)
        position_after = backend.random_position(device)
        noted = Draw(backend, kind, shape, dtype, device, state, state_after, position,
                     position_after)
        if _open:
            _journal.append(noted)
    return samples, noted


class DrawLog:
    """A context manager noting the draws ops make on this thread while it is open, and where
    `backend`'s generator for `device` (the block's) was as it opened and closed; `replay()`
    draws the same numbers again."""

    def __init__(self, backend, device):
        self.backend, self.device = backend, device
        self.draws = []
        self.state = self.start = self.end = None
        self.untracked = True

    def __enter__(self):
        global _open
        with _lock:
            self.state = self.backend.random_state(self.device)
            self.start = self.backend.random_position(self.device)
            _open += 1
            self._first = len(_journal)
        _local.__dict__.setdefault("logs", []).append(self)
        return self

    def __exit__(self, *exc):
        global _open
        _local.logs.remove(self)
        with _lock:
            self.end = self.backend.random_position(self.device)
            journal = _journal[self._first:]
            _open -= 1
            if not _open:
                _journal.clear()
        self.untracked = self._moved_otherwise(journal)
        return False

    def _moved_otherwise(self, journal):
        """True unless the block's generator moved by ops' draws alone (the block's, noted, and
        other threads') while the log was open; always True where its position cannot be
        read."""
        at = self.start
        if at is None or self.end is None:
            return True
        for d in journal:
            if self.drawn_from(d.backend, d.device):
                if d.position != at:
                    return True
                at = d.position_after
        return at != self.end

    def drawn_from(self, backend, device):
        """True if `backend` draws for `device` from the log's generator (ops give the device
        None where their backend has one device)."""
        return backend is self.backend and (backend.single_device or device == self.device)

    def replay(self):
        """A context manager under which ops draw the noted numbers again, in order."""
        return _Replay(self)


class _Replay:
    """The noted draws again. If nothing but them moved the block's generator, they come from
    generators of their own and the global one is left alone. Otherwise the block drew past the
    ops too (numpy.random in its own code), or another thread drew meanwhile: the global
    generator is put back where it was as the block began and moved on as then, so the block's
    own draws repeat too, and is checked, between noted draws, to have moved as the first time
    or not at all; afterwards it is put back where it is now."""

    def __init__(self, log):
        self.log, self.taken = log, 0
        self.at = log.start  # where the generator is when nothing but noted draws moved it
        self.now = None

    def __enter__(self):
        log = self.log
        if log.untracked:
            with _lock:
                self.now = log.backend.random_state(log.device)
                log.backend.set_random_state(log.device, log.state)
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
            return backend.random_draw(kind, shape, dtype, device, noted.state)[0], noted
        own = log.drawn_from(backend, device)
        with _lock:
            if own:
                self._check(backend.random_position(device), noted.position)
            samples = backend.random_draw(kind, shape, dtype, device, noted.state)[0]
            backend.set_random_state(device, noted.state_after)
        if own:
            self.at = noted.position_after
        return samples, noted

    def _check(self, position, first):
        """The generator must be where it was the first time, or where the noted draws left it
        (nothing drew since): other moves mean other draws mixed in, then or now."""
        if position is not None and position != first and position != self.at:
            raise RuntimeError(
                "checkpoint: the block's random numbers cannot be drawn again as it drew them: "
                "it draws from numpy.random (or the backend's generator) past gradcore's ops, "
                "and the generator moved by another amount than when the block first ran, most "
                "likely because another thread drew random numbers meanwhile (then or now). "
                "Draw the block's random numbers through gradcore (F.dropout), or run it while "
                "no other thread draws")

    def __exit__(self, kind, error, traceback):
        log = self.log
        _local.replays.remove(self)
        try:
            if error is None and self.taken != len(log.draws):
                raise RuntimeError(
                    f"checkpoint: computed again, the block drew {self.taken} times where it "
                    f"first drew {len(log.draws)} times: what a checkpointed block draws must "
                    "depend on its inputs alone")
            if error is None and log.untracked:
                self._check(log.backend.random_position(log.device), log.end)
        finally:
            if log.untracked:
                with _lock:
                    log.backend.set_random_state(log.device, self.now)
        return False
