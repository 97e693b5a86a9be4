"""Grad mode and train mode, per thread."""
import contextlib
import threading


class _Config(threading.local):
    """Per-thread switches. `enable_backprop`: record graphs. `train`: dropout/batch-norm train mode."""

    def __init__(self):
        self.enable_backprop = True
        self.train = True


# DeZero spells it `Config.enable_backprop`; here each thread sees its own values.
Config = _Config()


@contextlib.contextmanager
def using_config(name, value):
    """Set `Config.<name>` to `value` in this thread for the duration of the block."""
    if name not in ("enable_backprop", "train"):
        raise AttributeError(f"Config has no setting {name!r}; it has 'enable_backprop' and 'train'")
    old = getattr(Config, name)
    setattr(Config, name, value)
    try:
        yield
    finally:
        setattr(Config, name, old)


def no_grad():
    """Block in which ops record no graph (cheaper forward; nothing to backpropagate)."""
    return using_config("enable_backprop", False)


def enable_grad():
    """Block in which ops record a graph again, e.g. inside `no_grad()`."""
    return using_config("enable_backprop", True)


def test_mode():
    """Block in which `Config.train` is False (dropout off, batch norm uses running statistics)."""
    return using_config("train", False)


def is_grad_enabled():
    """True if ops record graphs in this thread."""
    return Config.enable_backprop
