"""Grad mode, train mode and anomaly mode, per thread (context variables: per asyncio task too)."""
import contextlib
import contextvars

# What Function.__call__ reads once per call: False (record nothing), True (record), or ANOMALY
# (record, and keep what anomaly mode checks at backward). Grad mode and anomaly mode are folded
# into one value so that anomaly mode costs the hot path nothing while it is off.
ANOMALY = "anomaly"

# A new thread starts from the defaults: no_grad() in one thread never reaches another.
_recording = contextvars.ContextVar("gradcore.recording", default=True)
_anomaly = contextvars.ContextVar("gradcore.anomaly", default=False)
_train = contextvars.ContextVar("gradcore.train", default=True)

# True while gradcore.checkpoint runs a block again during backward: what the block did besides
# computing its results (batch norm's running statistics) it did when it first ran
_recomputing = contextvars.ContextVar("gradcore.recomputing", default=False)
recomputing = _recomputing.get


@contextlib.contextmanager
def recomputation():
    """Block in which `recomputing()` is True (gradcore.checkpoint's second run of a block)."""
    token = _recomputing.set(True)
    try:
        yield
    finally:
        _recomputing.reset(token)

# False, True or ANOMALY for this thread. A bound C method: the hot path reads it with no frame.
recording = _recording.get
training = _train.get  # Config.train, read the same way (a compiled step's key, at every call)


def is_grad_enabled():
    """True if ops record graphs in this thread."""
    return _recording.get() is not False


def is_anomaly_enabled():
    """True if anomaly mode (see gradcore.detect_anomaly) is on in this thread."""
    return _anomaly.get()


def _set_grad(value):
    return _recording.set((ANOMALY if _anomaly.get() else True) if value else False)


def _sync_anomaly():
    if _recording.get() is not False and (_recording.get() is ANOMALY) != _anomaly.get():
        _recording.set(ANOMALY if _anomaly.get() else True)


def _set_anomaly(value):
    token = _anomaly.set(bool(value))
    return token, _recording.set(_recording.get() is not False and (ANOMALY if value else True))


class _Config:
    """The switches, DeZero-style: `Config.enable_backprop` (record graphs) and `Config.train`
    (dropout and batch norm in train mode). Reading or assigning them acts on this thread only."""

    __slots__ = ()

    enable_backprop = property(lambda self: is_grad_enabled(),
                               lambda self, value: _set_grad(value))
    train = property(lambda self: _train.get(),
                     lambda self, value: _train.set(bool(value)))

    def __repr__(self):
        return f"Config(enable_backprop={self.enable_backprop}, train={self.train})"


Config = _Config()


@contextlib.contextmanager
def using_config(name, value):
    """Set `Config.<name>` to `value` in this thread for the duration of the block."""
    if name == "enable_backprop":
        token, setting = _set_grad(value), _recording
    elif name == "train":
        token, setting = _train.set(value), _train
    else:
        raise AttributeError(f"Config has no setting {name!r}; it has 'enable_backprop' and 'train'")
    try:
        yield
    finally:
        setting.reset(token)
        if setting is _recording:  # anomaly mode may have been switched inside the block
            _sync_anomaly()


def no_grad():
    """Block in which ops record no graph (cheaper forward; nothing to backpropagate)."""
    return using_config("enable_backprop", False)


def enable_grad():
    """Block in which ops record a graph again, e.g. inside `no_grad()`."""
    return using_config("enable_backprop", True)


def test_mode():
    """Block in which `Config.train` is False (dropout off, batch norm uses running statistics)."""
    return using_config("train", False)


def set_detect_anomaly(mode):
    """Switch anomaly mode on or off for this thread (see detect_anomaly)."""
    _set_anomaly(mode)


class detect_anomaly(contextlib.ContextDecorator):
    """Anomaly mode for a block (`with gradcore.detect_anomaly():`) or a function (as a
    decorator). Ops record where they were called and fingerprints of the arrays their backward
    reads; backward then raises, naming the op and where it was created, when a gradient is NaN
    or infinite or when such an array was changed after forward (also by a direct write,
    `x.data[...] = 0`, which the version counters cannot see). Slow: for debugging. Off, it costs
    nothing."""

    def __init__(self, mode=True):
        self.mode = bool(mode)
        self._tokens = []  # one pair per block entered: `with` may nest the same instance

    def _recreate_cm(self):  # as a decorator: a fresh instance per call (and per thread)
        return type(self)(self.mode)

    def __enter__(self):
        self._tokens.append(_set_anomaly(self.mode))
        return self

    def __exit__(self, *exc):
        anomaly, recording_token = self._tokens.pop()
        _recording.reset(recording_token)
        _anomaly.reset(anomaly)
        return False
