"""Grad mode, train mode and anomaly mode, per thread (context variables: per asyncio task too)."""
import contextlib
import contextvars
import functools
import inspect
import types

# What Function.__call__ reads once per call: False (record nothing), True (record), or ANOMALY
# (record, and keep what anomaly mode checks at backward). Grad mode and anomaly mode are folded
# into one value so that anomaly mode costs the hot path nothing while it is off.
ANOMALY = "anomaly"

# A new thread starts from the defaults: no_grad() in one thread never reaches another.
_recording = contextvars.ContextVar("gradcore.recording", default=True)
_anomaly = contextvars.ContextVar("gradcore.anomaly", default=False)
_train = contextvars.ContextVar("gradcore.train", default=True)
# True while Config.train is False because Module.__call__ set it for an eval-mode module's
# forward: that test mode is the module's own, which a train-mode sub-module called in it leaves
# (see Module._forward_in_mode). Every other way of setting Config.train (assigned, a switch
# entered or decorating, a decorated generator's steps) sets it False with the setting: test
# mode set so is explicit and puts every module in it in test mode.
_module_test_mode = contextvars.ContextVar("gradcore.module_test_mode", default=False)
in_module_test_mode = _module_test_mode.get

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
anomaly_on = _anomaly.get  # is_anomaly_enabled, read the same way (a compiled step, every call)


def is_grad_enabled():
    """True if ops record graphs in this thread."""
    return _recording.get() is not False


def is_anomaly_enabled():
    """True if anomaly mode (see gradcore.detect_anomaly) is on in this thread."""
    return _anomaly.get()


def _set_train(value):
    """Config.train = value, set explicitly: a module's own test mode in force ends. Returns
    what _reset_train takes to put both back."""
    # no token for _module_test_mode: Module._forward_in_mode, which set it, resets it by its
    # own; left unset elsewhere (most sets), the context stays smaller and later sets cheaper
    own = _module_test_mode.get()
    if own:
        _module_test_mode.set(False)
    return _train.set(value), own


def _reset_train(tokens):
    """Put Config.train back, and the module's own test mode that _set_train ended, if any."""
    token, own = tokens
    _train.reset(token)
    if own:
        _module_test_mode.set(True)


def _set_grad(value):
    return _recording.set((ANOMALY if _anomaly.get() else True) if value else False)


def _sync_anomaly():
    if _recording.get() is not False and (_recording.get() is ANOMALY) != _anomaly.get():
        _recording.set(ANOMALY if _anomaly.get() else True)


def _set_anomaly(value):
    # grad mode and anomaly mode share the variable the hot path reads (see ANOMALY): switching
    # anomaly mode switches that variable too, unless grad mode is off
    token = _anomaly.set(bool(value))
    recording = _recording.get() is not False and (ANOMALY if value else True)
    return token, _recording.set(recording), recording


class _Config:
    """The switches, DeZero-style: `Config.enable_backprop` (record graphs) and `Config.train`
    (dropout and batch norm in train mode). Reading or assigning them acts on this thread only."""

    __slots__ = ()

    enable_backprop = property(lambda self: is_grad_enabled(),
                               lambda self, value: _set_grad(value))
    train = property(lambda self: _train.get(),
                     lambda self, value: _set_train(bool(value)))

    def __repr__(self):
        return f"Config(enable_backprop={self.enable_backprop}, train={self.train})"


Config = _Config()


# The switches entered in this context and not left yet, innermost first: [switch, its setting's
# token, the entries below, the token of this variable's own set], or unset. A context variable,
# so that asyncio tasks (or threads) sharing a switch object each leave it by their own token,
# set in their own context; left in order, it is reset to unset again: an empty context keeps
# later sets of the settings cheaper (a decorated call costs ~40 ns more beside one variable).
_entered = contextvars.ContextVar("gradcore.entered", default=None)
_entered_get, _entered_set, _entered_reset = _entered.get, _entered.set, _entered.reset


class _Switch:
    """Sets one setting of this thread for a block (`with no_grad():`) or a function (as a
    decorator). Reusable: one object may be entered again, nested, or from several threads or
    asyncio tasks at once (each restores its own setting); an exception in the block restores it
    too."""

    __slots__ = ("_value",)
    value = None  # what each public switch sets (no_grad: False)

    def __new__(cls, func=None):
        switch = object.__new__(cls)
        switch._value = cls.value
        return switch if func is None else switch(func)  # `@no_grad`, without parentheses

    def __repr__(self):
        """The public spelling: `no_grad()`, `using_config('train', False)`."""
        if type(self).value is None:
            return f"using_config({self._name!r}, {self._value!r})"
        return f"{type(self).__name__}()"

    def __enter__(self):
        entry = [self, self._set(self._value), _entered_get(), None]
        entry[3] = _entered_set(entry)
        return self

    def __exit__(self, *exc):
        entry = _entered_get()
        if entry is not None and entry[0] is self:
            _entered_reset(entry[3])
        else:
            entry = self._left_out_of_order(entry)
        self._reset(entry[1])
        return False

    def _left_out_of_order(self, entry):
        """Take this switch's innermost entry out of the stack and return it, the entries above
        it kept in place: blocks interleaved by a generator suspended inside one."""
        above = []
        while entry is not None and entry[0] is not self:
            above.append(entry)
            entry = entry[2]
        if entry is None:
            raise RuntimeError(f"{self!r} left in a context that did not enter it (a generator "
                               f"holding `with {self!r}:` resumed in another thread or task?)")
        _entered_reset(entry[3])
        for switch, token, _, _ in reversed(above):  # pushed again, each with a token of its own
            moved = [switch, token, _entered_get(), None]
            moved[3] = _entered_set(moved)
        return entry

    def __call__(self, func):
        """`func` running with this setting (the decorator form). A generator or coroutine runs
        each step under it, and the caller's setting is back while it is suspended."""
        if not callable(func):
            raise TypeError(f"{type(self).__name__}: as a decorator it takes a function, got "
                            f"{type(func).__name__}")
        if inspect.isasyncgenfunction(func):
            raise TypeError(f"{self!r} cannot decorate {func.__qualname__}, an async generator "
                            f"function; put `with gradcore.{self!r}:` inside it instead")
        if inspect.isgeneratorfunction(func):
            @functools.wraps(func)
            def switched(*args, **kwargs):
                return (yield from _stepped(self, func(*args, **kwargs)))
        elif inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def switched(*args, **kwargs):
                return await _stepped(self, func(*args, **kwargs))
        else:
            @functools.wraps(func)
            def switched(*args, **kwargs):
                token = self._set(self._value)  # a token per call: threads calling it share none
                try:
                    return func(*args, **kwargs)
                finally:
                    self._reset(token)
        try:  # func's own: it takes what func takes (gradcore.compile binds keywords by it);
            # not followed through func's own wrapper, which may take other arguments than it
            switched.__signature__ = inspect.signature(func, follow_wrapped=False)
        except (TypeError, ValueError):  # a callable without one
            pass
        return switched


@types.coroutine  # a generator still, that an async def may also await
def _stepped(switch, steps):
    """Run the generator or coroutine `steps`, each resume (send, throw, close) under the
    switch's setting; while it is suspended, its caller's setting is in force."""
    resume, arg = steps.send, None
    while True:
        token = switch._set(switch._value)
        try:
            out = resume(arg)
        except StopIteration as stop:
            return stop.value
        finally:
            switch._reset(token)
        try:
            arg = yield out
            resume = steps.send
        except GeneratorExit:
            token = switch._set(switch._value)  # its finally blocks run under the setting too
            try:
                steps.close()
            finally:
                switch._reset(token)
            raise
        except BaseException as exc:  # noqa: BLE001 -- thrown into `steps`, as `yield from` does
            resume, arg = steps.throw, exc


def _reset_grad(token):
    _recording.reset(token)
    _sync_anomaly()  # anomaly mode may have been switched inside the block


class _GradSwitch(_Switch):
    __slots__ = ()
    _name = "enable_backprop"
    _set = staticmethod(_set_grad)
    _reset = staticmethod(_reset_grad)


class _TrainSwitch(_Switch):
    __slots__ = ()
    _name = "train"
    _set = staticmethod(_set_train)
    _reset = staticmethod(_reset_train)


def using_config(name, value):
    """Set `Config.<name>` to `value` in this thread for a block (`with using_config("train",
    False):`) or a decorated function; reusable like no_grad()."""
    if name == "enable_backprop":
        switch = _GradSwitch()
    elif name == "train":
        switch = _TrainSwitch()
    else:
        raise AttributeError(f"Config has no setting {name!r}; it has 'enable_backprop' and 'train'")
    switch._value = value
    return switch


class no_grad(_GradSwitch):
    """Block or function in which ops record no graph (cheaper forward; nothing to
    backpropagate): `with gradcore.no_grad():`, `@gradcore.no_grad` or `@gradcore.no_grad()`."""

    __slots__ = ()
    value = False


class enable_grad(_GradSwitch):
    """Block or function in which ops record a graph again, e.g. inside `no_grad()`."""

    __slots__ = ()
    value = True


class test_mode(_TrainSwitch):
    """Block or function in which `Config.train` is False (dropout off, batch norm uses running
    statistics)."""

    __slots__ = ()
    value = False


class set_detect_anomaly:
    """Switch anomaly mode on or off for this thread (see detect_anomaly), from this call on. As
    in PyTorch it is also a context manager: `with gradcore.set_detect_anomaly(True):` puts the
    mode back as it was before the call when the block is left."""

    __slots__ = ("_before",)

    def __init__(self, mode):
        self._before = _anomaly.get()
        _set_anomaly(mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        # by value, not by token: grad mode switched in the block (Config.enable_backprop = False)
        # stays as it was left
        _set_anomaly(self._before)
        return False


def _reset_anomaly(tokens):
    anomaly, token, recording = tokens
    _anomaly.reset(anomaly)
    if _recording.get() is recording:  # grad mode as the block found it: left unset if it was,
        _recording.reset(token)        # which keeps later sets cheaper (see _entered)
    else:  # grad mode switched in the block (Config.enable_backprop = False) stays switched,
        _sync_anomaly()  # as after set_detect_anomaly's block and PyTorch's detect_anomaly


class detect_anomaly(_Switch):
    """Anomaly mode for a block (`with gradcore.detect_anomaly():`) or a function (as a
    decorator). Ops record where they were called and fingerprints of the arrays their backward
    reads; backward then raises, naming the op and where it was created, when such an array was
    changed after forward (also by a direct write, `x.data[...] = 0`, which the version counters
    cannot see), and, for a backward run inside the mode (as PyTorch's), when a gradient is NaN or
    infinite. A backward it refuses (or that raises otherwise) leaves every .grad as it was, the
    retained ones included; hooks that ran are not undone (see gradcore.anomaly). Slow: for
    debugging. Off, it costs nothing. Reusable as no_grad() is: nested, or from several threads
    at once."""

    __slots__ = ()
    _set = staticmethod(_set_anomaly)
    _reset = staticmethod(_reset_anomaly)

    def __new__(cls, mode=True):
        switch = object.__new__(cls)
        switch._value = True if callable(mode) else bool(mode)
        return switch(mode) if callable(mode) else switch  # `@detect_anomaly` too

    @property
    def mode(self):
        return self._value

    def __repr__(self):
        return "detect_anomaly()" if self._value else "detect_anomaly(False)"
