"""Recurrent layers that keep their state between calls: RNN and LSTM (DeZero's names)."""
from .. import functions as F
from .layers import Linear, _optional_size, _size, _unfilled
from .module import Module


def _check_batch(layer, x, h):
    """Refuse an input whose batch differs from that of the carried state h (else the two
    would broadcast: one row of state shared by a whole batch, or one input row given many)."""
    if h is None:
        return
    shape = getattr(x, "shape", None)
    if shape is None:  # a list of rows
        shape = (len(x),)
    if shape and shape[0] != h.shape[0]:
        raise ValueError(
            f"{type(layer).__name__}: the input has a batch of {shape[0]}, the state carried from "
            f"the last call a batch of {h.shape[0]}: call reset_state() before a sequence with "
            "another batch size")


def _preactivation(x2h, h2h, x, h, hidden_size):
    """x2h(x) + h2h(h), or x2h(x) alone at the first step (h None). At the first step a lazy h2h
    is created as well, on x2h(x)'s device and dtype, so every parameter exists after one call."""
    y = x2h(x)
    if h is None:
        if _unfilled(h2h):
            h2h._lazy_init(y, in_size=hidden_size)
        return y
    return y + h2h(h)


class RNN(Module):
    """An Elman RNN: h = tanh(x2h(x) + h2h(h_prev)), x (N, in_size) -> h (N, hidden_size).

    The state `h` carries over from call to call (the graph through it too: cut it with
    `h.unchain_backward()` for truncated backprop); `reset_state()` starts a new sequence, and
    must come before a batch of another size (ValueError otherwise).
    x2h is Linear(hidden_size, in_size=in_size), lazy if in_size is None; h2h has no bias.
    """

    def __init__(self, hidden_size, in_size=None):
        super().__init__()
        H = self.hidden_size = _size(hidden_size, "hidden_size", "RNN")
        in_size = _optional_size(in_size, "in_size", "RNN")
        self.x2h = Linear(H, in_size=in_size)
        self.h2h = Linear(H, in_size=None if in_size is None else H, nobias=True)
        self.h = None

    def _shapes(self, size=None):
        """h2h.W is (hidden_size, hidden_size) while lazy too: h2h reads the state, so
        _preactivation gives it in_size=hidden_size, not a size learnt from x."""
        return {"h2h.W": (self.hidden_size, self.hidden_size)}

    def reset_state(self):
        """Forget the hidden state: the next call starts a new sequence."""
        self.h = None

    def forward(self, x):
        _check_batch(self, x, self.h)
        self.h = F.tanh(_preactivation(self.x2h, self.h2h, x, self.h, self.hidden_size))
        return self.h

    def extra_repr(self):
        return f"hidden_size={self.hidden_size}, in_size={self.x2h.in_size}"


class LSTM(Module):
    """A long short-term memory layer, x (N, in_size) -> h (N, hidden_size), with gates
    f, i, o = sigmoid(x2g(x) + h2g(h)), candidate u = tanh(x2u(x) + h2u(h)),
    c = f * c_prev + i * u, h = o * tanh(c).

    The state (`h`, `c`) carries over from call to call; `reset_state()` clears it, and must
    come before a batch of another size (ValueError otherwise). The x2*
    Linears have biases (lazy if in_size is None), the h2* ones none (DeZero's layout).
    """

    def __init__(self, hidden_size, in_size=None):
        super().__init__()
        H = self.hidden_size = _size(hidden_size, "hidden_size", "LSTM")
        I = _optional_size(in_size, "in_size", "LSTM")  # noqa: E741
        HH = None if I is None else H
        self.x2f = Linear(H, in_size=I)
        self.x2i = Linear(H, in_size=I)
        self.x2o = Linear(H, in_size=I)
        self.x2u = Linear(H, in_size=I)
        self.h2f = Linear(H, in_size=HH, nobias=True)
        self.h2i = Linear(H, in_size=HH, nobias=True)
        self.h2o = Linear(H, in_size=HH, nobias=True)
        self.h2u = Linear(H, in_size=HH, nobias=True)
        self.reset_state()

    def _shapes(self, size=None):
        """Each h2*.W is (hidden_size, hidden_size) while lazy too (as RNN's h2h.W)."""
        H = self.hidden_size
        return {f"h2{gate}.W": (H, H) for gate in "fiou"}

    def reset_state(self):
        """Forget h and c: the next call starts a new sequence."""
        self.h = None
        self.c = None

    def forward(self, x):
        h, H = self.h, self.hidden_size
        _check_batch(self, x, h)
        f = F.sigmoid(_preactivation(self.x2f, self.h2f, x, h, H))
        i = F.sigmoid(_preactivation(self.x2i, self.h2i, x, h, H))
        o = F.sigmoid(_preactivation(self.x2o, self.h2o, x, h, H))
        u = F.tanh(_preactivation(self.x2u, self.h2u, x, h, H))
        c = i * u if self.c is None else f * self.c + i * u
        self.h, self.c = o * F.tanh(c), c
        return self.h

    def extra_repr(self):
        return f"hidden_size={self.hidden_size}, in_size={self.x2f.in_size}"
