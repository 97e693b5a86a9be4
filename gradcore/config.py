"""Grad mode and train mode, per thread (context variables: per asyncio task too)."""
import contextlib
import contextvars

# A new thread starts from the defaults: no_grad() in one thread never reaches another.
_settings = {
    "enable_backprop": contextvars.ContextVar("gradcore.enable_backprop", default=True),
    "train": contextvars.ContextVar("gradcore.train", default=True),
}


class _Config:
    """The switches, DeZero-style: `Config.enable_backprop` (record graphs) and `Config.train`
    (dropout and batch norm in train mode). Reading or assigning them acts on this thread only."""

    __slots__ = ()

    enable_backprop = property(lambda self: _settings["enable_backprop"].get(),
                               lambda self, value: _settings["enable_backprop"].set(bool(value)))
    train = property(lambda self: _settings["train"].get(),
                     lambda self, value: _settings["train"].set(bool(value)))

    def __repr__(self):
        return f"Config(enable_backprop={self.enable_backprop}, train={self.train})"


Config = _Config()

# True if ops record graphs in this thread. A bound C method: the hot path reads it with no frame.
is_grad_enabled = _settings["enable_backprop"].get


@contextlib.contextmanager
def using_config(name, value):
    """Set `Config.<name>` to `value` in this thread for the duration of the block."""
    setting = _settings.get(name)
    if setting is None:
        raise AttributeError(f"Config has no setting {name!r}; it has 'enable_backprop' and 'train'")
    token = setting.set(value)
    try:
        yield
    finally:
        setting.reset(token)


def no_grad():
    """Block in which ops record no graph (cheaper forward; nothing to backpropagate)."""
    return using_config("enable_backprop", False)


def enable_grad():
    """Block in which ops record a graph again, e.g. inside `no_grad()`."""
    return using_config("enable_backprop", True)


def test_mode():
    """Block in which `Config.train` is False (dropout off, batch norm uses running statistics)."""
    return using_config("train", False)
