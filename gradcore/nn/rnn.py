"""Recurrent layers that keep their state between calls: RNN and LSTM (DeZero's names)."""
from .. import functions as F
from ..variable import Parameter, Variable
from .layers import Linear, _normal, _only_gradcore_keywords, _optional_size, _size, _unfilled
from .module import Module, _converted


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


def _moved_state(h, device, dtype_name, wrote):
    """The carried state h on `device` in `dtype_name` (None: as it is), as Module.to moved the
    layer: detached, as after h.unchain_backward(), where to() `wrote` a parameter or buffer
    (the graph behind h read them, so no backward could go through it), even if h itself was
    already there; h itself, with its graph, where to() wrote nothing."""
    if h is None:
        return None
    data = _converted(h.data, device, dtype_name)
    if data is h.data and not wrote:
        return h
    return Variable(data, name=h.name, requires_grad=False)


def _setattr_refusing_a_parameter_state(layer, name, value):
    """Module.__setattr__ for RNN and LSTM, refusing a Parameter as the carried state: each call
    replaces the state with a computed Variable, which a slot registered for a Parameter does
    not take, so the first call would fail (a learned initial state is kept elsewhere)."""
    if name in layer._gradcore_carried and isinstance(value, Parameter):
        kind = type(layer).__name__
        me, size = kind.lower(), getattr(layer, "hidden_size", "hidden_size")
        raise TypeError(
            f"cannot assign a Parameter to {kind}.{name}: it is the state carried from call to "
            "call, which each call replaces with a computed Variable. For a learned initial "
            f"state, keep the Parameter on your model (self.{name}0 = Parameter(...), which "
            "the optimizer updates with the other weights) and start each sequence from a "
            f"Variable computed from it, which carries its gradient back: {me}.reset_state(); "
            f"{me}.{name} = F.broadcast_to(self.{name}0, (batch, {size})). For a fixed first "
            f"state, assign a Variable: {me}.{name} = Variable(array)")
    Module.__setattr__(layer, name, value)


# PyTorch's keywords for RNN / LSTM -> what gradcore takes instead
_TORCH_RNN_KEYWORDS = {
    "input_size": "in_size=",
    "num_layers": "no num_layers= (stack layers, each taking the last one's h)",
    "batch_first": "no batch_first=: a call takes one time step, x (N, in_size), and the state "
                   "carries over, as in DeZero: loop over the sequence",
    "bidirectional": "no bidirectional=",
    "dropout": "no dropout= (put a Dropout between stacked layers)",
    "bias": "no bias= (the x2* Linears have biases, the h2* none)",
    "nonlinearity": "no nonlinearity= (RNN's is tanh)",
    "proj_size": "no proj_size=",
    "device": "no device=: build it, then move it with .to(device)",
}


def _preactivation(layer, x2h, h2h, x, h):
    """x2h(x) + h2h(h), or x2h(x) alone at the first step (h None). A lazy h2h is created at
    its first use, the second step, on h's device and dtype: the order DeZero draws in, so
    numpy.random.seed gives DeZero's weights. An input x2h refuses for its size is refused
    again naming `layer` (see _refuse_input), and so is an x that is not 2-d, which x2h takes
    as PyTorch's Linear takes (..., in_size) and (in_size,)."""
    if len(getattr(x, "shape", (0, 0))) != 2:  # (in_size,) too: its state would be (H,), and
        _refuse_input(layer, x2h, x, None)     # the next call's size read as a batch's
    try:
        y = x2h(x)
    except ValueError as e:
        _refuse_input(layer, x2h, x, e)
        raise
    return y if h is None else y + h2h(h)


def _refuse_input(layer, x2h, x, error):
    """A ValueError naming the RNN or LSTM `layer` and its (hidden_size, in_size) order, from
    `error`, where x2h refused the input `x` for its shape (a Linear built for another in_size,
    or an x that is not 2-d); nothing otherwise. PyTorch's RNN(input_size, hidden_size) takes
    its sizes the other way round, so nn.LSTM(10, 20) meets 10 features with in_size 20."""
    shape = getattr(x, "shape", None)
    if shape is None:
        return
    where, H, in_size = type(layer).__name__, layer.hidden_size, x2h.in_size
    shape = tuple(shape)
    if len(shape) != 2:
        how = (f"one example is a batch of one: {where.lower()}(x[None])" if len(shape) < 2
               else "PyTorch's whole sequence (length, batch, features) is fed here one step "
               f"at a time: for x_t in xs: h = {where.lower()}(x_t)")
        raise ValueError(f"{where}: x must be 2-d (batch, in_size), one time step per call, got "
                         f"shape {shape}; {how}") from error
    if in_size is None or shape[1] == in_size:
        return
    hint = (f" If you meant PyTorch's {where}(input_size={shape[1]}, hidden_size={H}), write "
            f"{where}({H}, in_size={shape[1]}) here, or {where}({H}) to learn in_size from the "
            "first input")
    if shape[1] == H:  # nn.LSTM(10, 20) given 10 features: the sizes swapped
        hint = (f" It looks like PyTorch's order {where}(input_size={H}, "
                f"hidden_size={in_size}): write {where}({in_size}, in_size={H}) here, or "
                f"{where}({in_size}) to learn in_size from the first input")
    raise ValueError(
        f"{where}: the input has {shape[1]} features, but this {where} was built for "
        f"in_size={in_size} (hidden_size={H}): gradcore's {where} takes (hidden_size, in_size), "
        f"DeZero's order, the reverse of PyTorch's.{hint}") from error


class RNN(Module):
    """An Elman RNN: h = tanh(x2h(x) + h2h(h_prev)), x (N, in_size) -> h (N, hidden_size).

    The state `h` carries over from call to call (the graph through it too: cut it with
    `h.unchain_backward()` for truncated backprop), and `to()` moves it with the layer, cut
    from its graph (to() writes the parameters that graph read); `reset_state()` starts a new
    sequence, and must come before a batch of another size (ValueError otherwise).
    x2h is Linear(hidden_size, in_size=in_size) and h2h Linear(hidden_size, no bias). With
    in_size given both are made here; without it, as in DeZero, x2h is made at the first call
    and h2h at the second, the first to read a state, or at a state_dict() (or save()) of this
    RNN before that: after one call h2h.W has no data yet.
    """

    _gradcore_carried = ("h",)  # a first state set by hand (rnn.h = Variable(h0)) is no weight
    __setattr__ = _setattr_refusing_a_parameter_state

    def __init__(self, hidden_size=None, in_size=None, **kwargs):
        _only_gradcore_keywords("RNN", kwargs, _TORCH_RNN_KEYWORDS, "hidden_size and in_size")
        super().__init__()
        H = self.hidden_size = _size(hidden_size, "hidden_size", "RNN")
        in_size = _optional_size(in_size, "in_size", "RNN")
        self.x2h = Linear(H, in_size=in_size)
        # h2h reads the state, so its in_size is H (DeZero passes in_size, a wrong shape unless
        # in_size == H); lazy alongside a lazy x2h, so that it is drawn where DeZero draws it
        self.h2h = Linear(H, in_size=None if in_size is None else H, nobias=True)
        self.h = None

    def _shapes(self, size=None):
        """h2h.W is (hidden_size, hidden_size) while lazy too: it reads the state, not x."""
        return {"h2h.W": (self.hidden_size, self.hidden_size)}

    def reset_state(self):
        """Forget the hidden state: the next call starts a new sequence."""
        self.h = None

    def _after_moving(self, device, dtype_name, wrote):
        self.h = _moved_state(self.h, device, dtype_name, wrote)

    def _before_saving(self):
        """h2h drawn now if x2h has been made but h2h not yet (its shape, (hidden_size,
        hidden_size), is known then): an RNN saved after its first call, or one that only ever
        sees one-step sequences, never reaches the second call that would make h2h. The draw
        leaves the random generator where it was, and the second call moves it past the same
        draw, where DeZero draws h2h: the numbers drawn after it are those of a run that does
        not save (h2h itself differs from that run's only where something drew in between)."""
        if _unfilled(self.x2h) or not _unfilled(self.h2h):
            return
        W = self.x2h.W  # where x2h's weights are, in the dtype h2h would take at its first call
        backend, device = W.backend, W.device
        state = backend.random_state(device)
        try:
            self.h2h._lazy_init(W, in_size=self.hidden_size)
        finally:
            backend.set_random_state(device, state)
        self._drawn_ahead = True

    def forward(self, x):
        _check_batch(self, x, self.h)
        if self.h is not None and getattr(self, "_drawn_ahead", None) is not None:
            self._drawn_ahead = None
            W = self.h2h.W  # the saved weights stay: a checkpoint is what the model goes on with
            _normal(W.backend, W.device, W.shape, W.dtype, 1.0)  # the draw the save skipped
        self.h = F.tanh(_preactivation(self, self.x2h, self.h2h, x, self.h))
        return self.h

    def extra_repr(self):
        return f"hidden_size={self.hidden_size}, in_size={self.x2h.in_size}"


class LSTM(Module):
    """A long short-term memory layer, x (N, in_size) -> h (N, hidden_size), with gates
    f, i, o = sigmoid(x2g(x) + h2g(h)), candidate u = tanh(x2u(x) + h2u(h)),
    c = f * c_prev + i * u, h = o * tanh(c).

    The state (`h`, `c`) carries over from call to call (`to()` moves it with the layer, cut
    from its graph, as RNN's); `reset_state()` clears it, and must
    come before a batch of another size (ValueError otherwise). The x2*
    Linears have biases (lazy if in_size is None), the h2* ones none (DeZero's layout). The h2*
    read the state, so they are made here, (hidden_size, hidden_size), as in DeZero (its
    order of draws: x2* before h2* with in_size given, after them without).
    """

    _gradcore_carried = ("h", "c")
    __setattr__ = _setattr_refusing_a_parameter_state

    def __init__(self, hidden_size=None, in_size=None, **kwargs):
        _only_gradcore_keywords("LSTM", kwargs, _TORCH_RNN_KEYWORDS, "hidden_size and in_size")
        super().__init__()
        H = self.hidden_size = _size(hidden_size, "hidden_size", "LSTM")
        I = _optional_size(in_size, "in_size", "LSTM")  # noqa: E741
        self.x2f = Linear(H, in_size=I)
        self.x2i = Linear(H, in_size=I)
        self.x2o = Linear(H, in_size=I)
        self.x2u = Linear(H, in_size=I)
        self.h2f = Linear(H, in_size=H, nobias=True)
        self.h2i = Linear(H, in_size=H, nobias=True)
        self.h2o = Linear(H, in_size=H, nobias=True)
        self.h2u = Linear(H, in_size=H, nobias=True)
        self.reset_state()

    def _shapes(self, size=None):
        """The four x2*.W are (in_size, hidden_size), one in_size for all: they read the same x."""
        return {f"x2{gate}.W": (size, self.hidden_size) for gate in "fiou"}

    def reset_state(self):
        """Forget h and c: the next call starts a new sequence."""
        self.h = None
        self.c = None

    def _after_moving(self, device, dtype_name, wrote):
        self.h = _moved_state(self.h, device, dtype_name, wrote)
        self.c = _moved_state(self.c, device, dtype_name, wrote)

    def forward(self, x):
        h = self.h
        _check_batch(self, x, h)
        f = F.sigmoid(_preactivation(self, self.x2f, self.h2f, x, h))
        i = F.sigmoid(_preactivation(self, self.x2i, self.h2i, x, h))
        o = F.sigmoid(_preactivation(self, self.x2o, self.h2o, x, h))
        u = F.tanh(_preactivation(self, self.x2u, self.h2u, x, h))
        if h is None:
            self._h2_to(self.x2f.W)
        c = i * u if self.c is None else f * self.c + i * u
        self.h, self.c = o * F.tanh(c), c
        return self.h

    def _h2_to(self, w):
        """Move the h2* to w's device if they are elsewhere: made on the CPU in __init__, they
        follow a lazy x2*, made where its first input is (as lazy weights are)."""
        for layer in (self.h2f, self.h2i, self.h2o, self.h2u):
            if layer.W.device != w.device:
                layer.to(w.device)

    def extra_repr(self):
        return f"hidden_size={self.hidden_size}, in_size={self.x2f.in_size}"
