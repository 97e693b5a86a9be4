"""Layers (DeZero's names and defaults): Linear, Conv2d, Deconv2d, BatchNorm, Dropout, EmbedID,
activations, and the containers Sequential, ModuleList and MLP."""
import numbers
import operator

import numpy

import backends

from .. import functions as F
from ..functions.conv import pair
from ..variable import Parameter, Variable, as_variable
from .module import (_MODULE, Module, _float_name, _held_by_a_module, _lazy_dtype,
                     _namespace_dtype)


# =============================================================================== helpers
def _size(value, what, where):
    """`value` as a positive int, or a ValueError/TypeError naming `what` in `where`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {what} must be a positive int, got {value!r}")
    if value < 1:
        raise ValueError(f"{where}: {what} must be a positive int, got {value}")
    return int(value)


def _optional_size(value, what, where):
    """None, or `value` checked by _size."""
    return None if value is None else _size(value, what, where)


# The dtype layers give their parameters when none is named: one setting for the process (as
# PyTorch's), read when a layer is built
_default_dtype = ["float32"]


def set_default_dtype(dtype):
    """Make `dtype` ("float16", "float32", "float64", or a NumPy dtype) the one new layers give
    their parameters when their `dtype` is not given (float32 by default, as in DeZero)."""
    _default_dtype[0] = _float_name(dtype, "set_default_dtype")


def get_default_dtype():
    """The dtype new layers give their parameters when none is named ("float32" unless set)."""
    return _default_dtype[0]


def _numpy_dtype(dtype, where):
    """A floating dtype as the NumPy dtype of the same name (the layers' `dtype` attribute);
    None: gradcore's default (float32 unless gradcore.set_default_dtype changed it)."""
    return numpy.dtype(_float_name(_default_dtype[0] if dtype is None else dtype, where))


def _normal(backend, device, shape, dtype, scale):
    """randn(*shape) * scale from the backend's global generator (numpy.random.seed reproduces
    a NumPy run), on `device` in `dtype`."""
    with backend.device_context(device):
        w = backend.random_normal(shape, dtype, device)
        return w if scale == 1.0 else w * scale


def _placement(x, layer, where):
    """(backend, device, dtype) for the parameters `layer` creates at its first call on input
    `x`: x's backend and device, and in x's namespace the dtype of the layer's last
    to(dtype=), else its own `dtype`: a float64 input meets float32 weights, as in DeZero and
    PyTorch, unless the layer says otherwise."""
    x = as_variable(x)
    if x.data is None:
        raise ValueError(f"{where}: the input has no data (data is None)")
    return x.backend, x.device, _namespace_dtype(x.backend, x.device, _lazy_dtype(layer), where)


def _input_shape(x, where):
    """The shape of a layer's input `x`, a Variable, an array or a Python scalar; TypeError for
    anything else, as the ops refuse it (a list among them: numpy.asarray(x) first)."""
    if isinstance(x, Variable):
        if x.data is None:
            raise ValueError(f"{where}: the input has no data (data is None)")
        return tuple(x.shape)
    if backends.is_array(x):
        return tuple(x.shape)
    if isinstance(x, numbers.Number):
        return ()
    hint = " (convert it first: numpy.asarray(x, dtype=numpy.float32))" if isinstance(
        x, (list, tuple)) else ""
    raise TypeError(f"{where}: unsupported input of type {type(x).__module__}."
                    f"{type(x).__qualname__}{hint}; pass a Variable or an array of a registered "
                    "backend (numpy, cupy, array-API), as the ops take")


def _numpy_on_cpu():
    """(backend, device) of eagerly created parameters: NumPy on the CPU (move them with
    Module.to)."""
    return backends.NUMPY, backends.CPU


def _declare_weight_and_bias(layer, nobias, dtype, where):
    """Check and set layer.dtype and layer.nobias, and give the layer W and (unless nobias) b
    as Parameters with no data yet: its _initialize fills them."""
    layer.dtype = _numpy_dtype(dtype, where)
    layer.W = Parameter(None, name="W")
    layer.nobias = nobias  # b: a Parameter with no data yet, or None


def _set_nobias(layer, nobias):
    """nobias=True removes b (b = None); nobias=False gives a layer without one a b with no
    data yet (the Parameter it had, if any: see _emptied), filled with zeros at the next call."""
    if not isinstance(nobias, (bool, numpy.bool_)):
        raise TypeError(f"{type(layer).__name__}: nobias must be True or False, got {nobias!r}")
    if nobias:
        layer.b = None
    elif layer.__dict__.get("b") is None:
        layer.b = _emptied(layer, "b")


# Linear's and the convolutions' `nobias`: whether b is None, so that it, extra_repr and what
# state_dict saves agree whichever was set (b = None, DeZero's way of dropping a bias, or nobias)
_NOBIAS = property(lambda layer: layer.__dict__.get("b") is None, _set_nobias,
                   doc="Whether the layer has no bias (b is None); set it to add or drop one.")


def _unfilled(layer):
    """True where W, or b if the layer has one, has no data yet: a lazy layer, a partial load,
    or W set to None (a lazy slot, created again at the next call). b set to None is no bias,
    as in DeZero: it stays None."""
    W, b = layer.W, layer.b
    return W is None or W.data is None or (b is not None and b.data is None)


def _learnt_size(layer, axis, given):
    """The input size of a Linear or convolution `layer`: the length of `axis` of its W when W
    has data (so a load that fills W sets it too), else `given`, the constructor's."""
    W = layer.__dict__.get("W")
    return given if W is None or W.data is None else int(W.shape[axis])


def _given_size(layer, axis, value, what):
    """`value` checked as an input size to keep for `layer` (None: learn it from the first
    input): once W has data its shape decides, so a size that contradicts it is refused, as a
    load of another shape into W is."""
    value = _optional_size(value, what, type(layer).__name__)
    learnt = _learnt_size(layer, axis, None)
    if value is not None and learnt is not None and value != learnt:
        raise ValueError(
            f"{type(layer).__name__}: cannot set {what} to {value}: W has shape "
            f"{tuple(layer.W.shape)}, so {what} is {learnt}; set W to None first (it is made "
            f"again at the next call, sized by that input), or load a W of that size")
    return value


def _refill_slots(layer, shape):
    """Put a lazy Parameter for `shape` back into W where it was set to None (b = None stays:
    no bias)."""
    if layer.W is None:
        layer.W = _emptied(layer, "W", shape)


def _setattr_setting_aside(layer, name, value):
    """Module.__setattr__ for a layer that makes its parameter slots (`_refilled`) again after
    they were set to None: the Parameter that None replaced is set aside for _emptied."""
    old = layer.__dict__.get(name)
    Module.__setattr__(layer, name, value)
    if name in layer._refilled:
        if value is None and isinstance(old, Parameter):
            layer.__dict__.setdefault("_set_aside", {})[name] = old
        else:
            layer.__dict__.get("_set_aside", {}).pop(name, None)


def _emptied(layer, name, shape=None):
    """A Parameter with no data or grad for the slot `name` of `layer`, to be filled at its next
    call with an array of `shape` (None: the slot's shape cannot change, as b's): the one the
    slot held before it was set to None, so that an optimizer given it (as a list:
    Adam(model.parameters())) goes on updating it; a new one if it held none, if that one has
    another shape (its optimizer state, made for the old shape, stays with it), or if a module
    still holds it (b.W = a.W, an EmbedID tied to it, a copy's other layer: emptying it would
    wipe that module's weight)."""
    p = layer.__dict__.get("_set_aside", {}).get(name)
    if (p is None or shape is not None and p.data is not None and tuple(p.shape) != shape
            or _held_by_a_module(p)):
        return Parameter(None, name=name)
    p.data = None
    p.cleargrad()
    return p


# =============================================================================== linear
def _linear_sizes(sizes, in_size, out_size):
    """(in_size, out_size) from Linear's positional `sizes` (out_size, or in_size and out_size)
    and its keywords, each given once; in_size None when it is to be learnt from the input."""
    if len(sizes) > 2:
        raise TypeError(f"Linear takes out_size, or in_size and out_size; got {len(sizes)} "
                        "positional arguments (pass nobias and dtype by keyword)")
    if len(sizes) == 2:
        if isinstance(sizes[1], bool):
            raise TypeError(f"Linear({sizes[0]!r}, {sizes[1]!r}): pass nobias by keyword "
                            "(Linear(out_size, nobias=True))")
        if in_size is not None or out_size is not None:
            raise TypeError("Linear(in_size, out_size) got in_size or out_size by keyword "
                            "as well; give each once")
        in_size, out_size = sizes
    elif len(sizes) == 1:
        if out_size is not None:
            raise TypeError("Linear: out_size given twice (positionally and by keyword)")
        out_size = sizes[0]
    elif out_size is None:
        raise TypeError("Linear needs out_size: Linear(out_size) or Linear(in_size, out_size)")
    return _optional_size(in_size, "in_size", "Linear"), _size(out_size, "out_size", "Linear")


class Linear(Module):
    """A fully connected layer: y = x @ W + b for x (N, in_size), W (in_size, out_size),
    b (out_size,).

    `Linear(out_size)` (DeZero) learns in_size from the first input, and creates W and b then on
    that input's device in the layer's dtype (that of its last `to(dtype=)`, else `dtype`); W
    set to None is created again so at the next call: as the same Parameter where it keeps its
    shape and no other module holds it (so an optimizer given it as a list goes on updating
    it), else as a new one (with new optimizer state under `setup(model)`; another module tied
    to the old one, a layer or an EmbedID given it, keeps it). `Linear(in_size, out_size)` or
    `Linear(out_size, in_size=...)` creates them now, on the CPU. `dtype`: float32 unless
    gradcore.set_default_dtype says otherwise (a float64 input then gives a float64 result, as
    NumPy computes it, and float32 gradients for W and b). W is drawn as
    randn(in_size, out_size) * sqrt(1 / in_size) (seed with numpy.random.seed or
    gradcore.manual_seed), b is zeros. `nobias=True` leaves b out (b is None); so does setting
    b to None later, as in DeZero: the layer has no bias from then on (nobias reads True, and
    state_dict has no "b"); `layer.nobias = False` gives it a zero bias at the next call (the
    Parameter b it had, unless another module holds it). To make W anew whatever its shape,
    assign a new one: layer.W = gradcore.Parameter(None).
    """

    nobias = _NOBIAS
    __setattr__ = _setattr_setting_aside
    _refilled = ("W", "b")

    def __init__(self, *sizes, out_size=None, nobias=False, dtype=None, in_size=None):
        super().__init__()
        self._in_size, self.out_size = _linear_sizes(sizes, in_size, out_size)
        _declare_weight_and_bias(self, nobias, dtype, "Linear")
        if self._in_size is not None:
            self._initialize(*_numpy_on_cpu(), self.dtype, self._in_size)

    @property
    def in_size(self):
        """The input size: W's first axis once W has data (made at the first call, or
        loaded), else the size given to the constructor or assigned (None: learnt from the
        first input). Assigning one that contradicts W's data is refused."""
        return _learnt_size(self, 0, self._in_size)

    @in_size.setter
    def in_size(self, value):  # DeZero's Linear and code ported from it assign in_size
        self._in_size = _given_size(self, 0, value, "in_size")

    def _shapes(self, size=None):
        """W (in_size, out_size) and b (out_size,) for in_size `size` (see Module._shapes)."""
        return {"W": (size, self.out_size), "b": (self.out_size,)}

    def _initialize(self, backend, device, dtype, in_size):
        """Fill W and b where they have no data yet (lazy creation, or a partial load)."""
        shapes = self._shapes(in_size)
        _refill_slots(self, shapes["W"])
        if self.W.data is None:
            self.W.data = _normal(backend, device, shapes["W"], dtype, (1.0 / in_size) ** 0.5)
        if self.b is not None and self.b.data is None:
            self.b.data = backend.zeros(shapes["b"], dtype, device)

    def _lazy_init(self, x, in_size=None):
        """Create the missing parameters on input `x`'s device (in_size from x unless given)."""
        if in_size is None:
            if self.W is not None and self.W.data is not None:
                in_size = self.W.shape[0]
            else:
                shape = _input_shape(x, "Linear")
                if len(shape) != 2:
                    raise ValueError(f"Linear: x must be 2-d (batch, in_size), got shape {shape}; "
                                     "flatten it first (e.g. F.reshape(x, (len(x), -1)))")
                in_size = shape[1]
        self._initialize(*_placement(x, self, "Linear"), in_size)

    def forward(self, x):
        if _unfilled(self):
            self._lazy_init(x)
        return F.linear(x, self.W, self.b)

    def extra_repr(self):
        return f"in_size={self.in_size}, out_size={self.out_size}, nobias={self.nobias}"


# =============================================================================== convolution
class _ConvBase(Module):
    """Shared by Conv2d and Deconv2d: sizes, W and b, lazy in_channels."""

    _name = None
    _in_axis = None  # the axis of W that runs over the input channels
    nobias = _NOBIAS  # b = None drops the bias, as Linear's
    __setattr__ = _setattr_setting_aside
    _refilled = ("W", "b")

    def __init__(self, out_channels, kernel_size, stride=1, pad=0, nobias=False,
                 dtype=None, in_channels=None):
        super().__init__()
        where = self._name
        self.out_channels = _size(out_channels, "out_channels", where)
        self._in_channels = _optional_size(in_channels, "in_channels", where)
        for name, value, low in (("kernel_size", kernel_size, 1), ("stride", stride, 1),
                                 ("pad", pad, 0)):
            try:
                ok = min(pair(value)) >= low
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"{where}: {name} must be an int >= {low} or a pair of them, "
                                 f"got {value!r}")
        self.kernel_size, self.stride, self.pad = kernel_size, stride, pad
        _declare_weight_and_bias(self, nobias, dtype, where)
        if self._in_channels is not None:
            self._initialize(*_numpy_on_cpu(), self.dtype, self._in_channels)

    @property
    def in_channels(self):
        """The input channels: read from W once it has data (made at the first call, or
        loaded), else the number given to the constructor or assigned (None: learnt from the
        first input). Assigning one that contradicts W's data is refused."""
        return _learnt_size(self, self._in_axis, self._in_channels)

    @in_channels.setter
    def in_channels(self, value):  # as Linear.in_size: DeZero's layers assign it
        self._in_channels = _given_size(self, self._in_axis, value, "in_channels")

    def _w_shape(self, C):
        raise NotImplementedError

    def _shapes(self, size=None):
        """W as _w_shape(size) and b (out_channels,), `size` the input channels (see
        Module._shapes)."""
        return {"W": self._w_shape(size), "b": (self.out_channels,)}

    def _initialize(self, backend, device, dtype, C):
        KH, KW = pair(self.kernel_size)
        shapes = self._shapes(C)
        _refill_slots(self, shapes["W"])
        if self.W.data is None:
            self.W.data = _normal(backend, device, shapes["W"], dtype,
                                  (1.0 / (C * KH * KW)) ** 0.5)
        if self.b is not None and self.b.data is None:
            self.b.data = backend.zeros(shapes["b"], dtype, device)

    def _prepare(self, x):
        if _unfilled(self):
            if self.W is not None and self.W.data is not None:
                C = self.W.shape[self._in_axis]
            else:
                shape = _input_shape(x, self._name)
                if len(shape) != 4:
                    raise ValueError(f"{self._name}: x must be 4-d (N, C, H, W), got shape "
                                     f"{shape}")
                C = shape[1]
            self._initialize(*_placement(x, self, self._name), C)

    def extra_repr(self):
        return (f"in_channels={self.in_channels}, out_channels={self.out_channels}, "
                f"kernel_size={self.kernel_size}, stride={self.stride}, pad={self.pad}, "
                f"nobias={self.nobias}")


class Conv2d(_ConvBase):
    """2-D convolution: x (N, C, H, W) -> (N, out_channels, OH, OW), with W (out_channels, C,
    KH, KW) drawn as randn * sqrt(1 / (C * KH * KW)) and b zeros (out_channels,).

    `in_channels=None` (the default, as DeZero) learns C from the first input and creates W and
    b then on its device; otherwise they are created now on the CPU in `dtype`. W set to None
    is created again at the next call (the same Parameter where Linear's W would be); b set to
    None (or nobias=True) means no bias, as Linear's.
    """

    _name = "Conv2d"
    _in_axis = 1

    def _w_shape(self, C):
        return (self.out_channels, C) + pair(self.kernel_size)

    def forward(self, x):
        self._prepare(x)
        return F.conv2d(x, self.W, self.b, self.stride, self.pad)


class Deconv2d(_ConvBase):
    """2-D transposed convolution: x (N, C, H, W) -> (N, out_channels, OH, OW), with W (C,
    out_channels, KH, KW) drawn as randn * sqrt(1 / (C * KH * KW)) and b zeros; same arguments
    and lazy in_channels as Conv2d."""

    _name = "Deconv2d"
    _in_axis = 0

    def _w_shape(self, C):
        return (C, self.out_channels) + pair(self.kernel_size)

    def forward(self, x):
        self._prepare(x)
        return F.deconv2d(x, self.W, self.b, self.stride, self.pad)


# =============================================================================== normalisation
class BatchNorm(Module):
    """Batch normalisation over axis 1 of x (N, C) or (N, C, H, W) (F.batch_norm).

    gamma (ones) and beta (zeros) are parameters; the running statistics avg_mean (zeros) and
    avg_var (ones) are buffers (saved and moved, not trained). All four are created at the first
    call (and any set to None at the next, gamma and beta as the same Parameters where Linear's
    W would be: none can be left out, unlike Linear's b), shaped
    (C,) on the input's device in the layer's dtype (that of its last `to(dtype=)`, else
    `dtype`: float32, or what gradcore.set_default_dtype set). In train mode the batch
    statistics are used and the running ones updated (decay); in eval / test mode the running
    ones are used.
    """

    # slot -> (value it starts at, a parameter rather than a buffer)
    _SLOTS = {"avg_mean": (0.0, False), "avg_var": (1.0, False), "gamma": (1.0, True),
              "beta": (0.0, True)}
    __setattr__ = _setattr_setting_aside
    _refilled = ("gamma", "beta")

    def __init__(self, decay=0.9, eps=2e-5, dtype=None):
        super().__init__()
        self.dtype = _numpy_dtype(dtype, "BatchNorm")
        for name, value in (("decay", decay), ("eps", eps)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"BatchNorm: {name} must be a number, got {value!r}")
        if not 0.0 <= decay < 1.0 or eps <= 0:
            raise ValueError(f"BatchNorm: need 0 <= decay < 1 and eps > 0, got decay={decay}, "
                             f"eps={eps}")
        self.decay, self.eps = float(decay), float(eps)
        self.register_buffer("avg_mean")
        self.register_buffer("avg_var")
        self.gamma = Parameter(None, name="gamma")
        self.beta = Parameter(None, name="beta")

    def forward(self, x):
        if any(v is None or v.data is None
               for v in (self.avg_mean, self.avg_var, self.gamma, self.beta)):
            self._lazy_init(x)
        return F.batch_norm(x, self.gamma, self.beta, self.avg_mean, self.avg_var,
                            self.decay, self.eps)

    def _shapes(self, size=None):
        """All four (C,), C = `size` the channels (see Module._shapes)."""
        return {name: (size,) for name in self._SLOTS}

    def _lazy_init(self, x):
        """Create the statistics and parameters that have no data yet (all at the first call;
        a slot set to None is re-created), shaped (C,) on x's device."""
        shape = _input_shape(x, "BatchNorm")
        if len(shape) < 2:
            raise ValueError(f"BatchNorm: x must be (N, C) or (N, C, ...) with channels on "
                             f"axis 1, got shape {shape}")
        backend, device, dtype = _placement(x, self, "BatchNorm")
        shapes = self._shapes(shape[1])
        with backend.device_context(device):
            for name, (fill, is_parameter) in self._SLOTS.items():
                v = getattr(self, name)
                if v is None:
                    v = _emptied(self, name, shapes[name]) if is_parameter else Variable(
                        None, name=name, requires_grad=False)
                    setattr(self, name, v)
                if v.data is None:
                    zeros = backend.zeros(shapes[name], dtype, device)
                    v.data = zeros + fill if fill else zeros

    def extra_repr(self):
        C = None if self.gamma is None or self.gamma.data is None else self.gamma.shape[0]
        return f"channels={C}, decay={self.decay}, eps={self.eps}"


class Dropout(Module):
    """F.dropout(x, dropout_ratio) in train mode, x unchanged in eval / test mode."""

    def __init__(self, dropout_ratio=0.5):
        super().__init__()
        if isinstance(dropout_ratio, bool) or not isinstance(dropout_ratio, numbers.Real) or not (
                0.0 <= dropout_ratio < 1.0):
            raise ValueError(f"Dropout: dropout_ratio must be a number in [0, 1), "
                             f"got {dropout_ratio!r}")
        self.dropout_ratio = float(dropout_ratio)

    def forward(self, x):
        return F.dropout(x, self.dropout_ratio)

    def extra_repr(self):
        return f"dropout_ratio={self.dropout_ratio}"


# =============================================================================== embedding
class EmbedID(Module):
    """A lookup table: integer ids x (any shape) -> rows of W (in_size, out_size), shaped
    x.shape + (out_size,). W is randn(in_size, out_size), created on the CPU in `dtype`
    (DeZero keeps float64; float32 here like the other layers)."""

    def __init__(self, in_size, out_size, dtype=None):
        super().__init__()
        self.in_size = _size(in_size, "in_size", "EmbedID")
        self.out_size = _size(out_size, "out_size", "EmbedID")
        self.dtype = _numpy_dtype(dtype, "EmbedID")
        W = _normal(*_numpy_on_cpu(), (self.in_size, self.out_size), self.dtype, 1.0)
        self.W = Parameter(W, name="W")

    def forward(self, x):
        return F.embed_id(x, self.W)

    def extra_repr(self):
        return f"in_size={self.in_size}, out_size={self.out_size}"


Embedding = EmbedID  # PyTorch's name


# =============================================================================== activations
class ReLU(Module):
    """F.relu as a module."""

    def forward(self, x):
        return F.relu(x)


class Sigmoid(Module):
    """F.sigmoid as a module."""

    def forward(self, x):
        return F.sigmoid(x)


class Tanh(Module):
    """F.tanh as a module."""

    def forward(self, x):
        return F.tanh(x)


# =============================================================================== containers
def _not_a_class(layer, where):
    """`layer`, unless it is a Module class given for an instance (nn.ReLU for nn.ReLU()), which
    forward would call with the input as its argument: a TypeError naming `where` then."""
    if isinstance(layer, type) and issubclass(layer, Module):
        name = layer.__qualname__
        if layer.__module__.startswith("gradcore.nn"):
            name = "nn." + name
        raise TypeError(f"{where}: got the class {name}; pass an instance, {name}()")
    return layer


class _Call(Module):
    """A plain callable (F.relu) as a layer of Sequential: registered like the Module layers,
    so that forward walks the registered sub-modules alone."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *inputs):
        return self.fn(*inputs)

    def __repr__(self):
        return repr(self.fn)


class Sequential(Module):
    """Layers called one after another: Sequential(Linear(10), ReLU(), Linear(1))(x).

    Layers are registered as "0", "1", ... (so parameters are named "0.W"); plain callables
    (e.g. F.relu) may sit between them. forward runs the registered sub-modules in assignment
    order, so replacing one (setattr(seq, "1", layer)) or deleting one (delattr(seq, "1"))
    changes what runs, what parameters() lists and what state_dict saves alike; a layer set to
    None is skipped. Indexable (an int gives a layer, a slice a new Sequential of the same
    layers), len() and iteration; `append` adds a layer.
    """

    def __init__(self, *layers):
        super().__init__()
        for layer in layers:
            self.append(layer)

    def append(self, layer):
        """Add `layer` (a Module or a callable) at the end, under the next free number."""
        _not_a_class(layer, "Sequential")
        if not callable(layer):
            raise TypeError(f"Sequential: a layer must be a Module or a callable, got "
                            f"{type(layer).__name__}")
        setattr(self, _next_number(self), layer if isinstance(layer, Module) else _Call(layer))
        return self

    def forward(self, x):
        # the registered sub-modules themselves (not _layers(), whose list costs a step more)
        attributes = self.__dict__
        for name, kind in self._registered.items():
            if kind == _MODULE:
                layer = attributes[name]
                if layer is not None:
                    x = layer(x)
        return x

    def _layers(self):
        """The layers in order, plain callables unwrapped."""
        return [layer.fn if type(layer) is _Call else layer for _, layer in self._child_items()]

    def __getitem__(self, index):
        layers = self._layers()
        if isinstance(index, slice):
            return Sequential(*layers[index])
        try:
            return layers[index]
        except IndexError:
            raise IndexError(f"Sequential index {index} is out of range for "
                             f"{len(layers)} layers") from None

    def __len__(self):
        return len(self._child_items())

    def __iter__(self):
        return iter(self._layers())

    def __repr__(self):
        items = self._child_items()
        if not items:
            return "Sequential()"
        lines = [f"({name}): " + repr(layer).replace("\n", "\n  ") for name, layer in items]
        return "Sequential(\n  " + "\n  ".join(lines) + "\n)"


def _next_number(container):
    """The name of the next item of a Sequential or ModuleList: its count of registered names,
    or the first free number after it."""
    index = len(container._registered)
    while str(index) in container.__dict__:  # after a deletion, a number may be taken further on
        index += 1
    return str(index)


class ModuleList(Module):
    """Modules kept in a list and registered, as "0", "1", ... (so parameters() trains them and
    state_dict saves them as "0.W", "1.W"): self.blocks = ModuleList([Linear(4), Linear(3)])
    (PyTorch's name). A plain list of layers is not registered (Module warns about one).

    append, extend, len(), iteration, indexing (an int gives a module, a slice a new ModuleList
    of the same modules), item assignment (replaces the module at that position) and `del`
    (an int or a slice; those left are numbered again from "0", as in PyTorch). It has no
    forward: the model holding it calls its modules (for block in self.blocks: x = block(x)).
    """

    def __init__(self, modules=()):
        super().__init__()
        self.extend(modules)

    def append(self, module):
        """Add `module` at the end, under the next free number; returns self."""
        setattr(self, _next_number(self), _list_item(module))
        return self

    def extend(self, modules):
        """append each of `modules` (an iterable of Modules); returns self."""
        try:
            modules = list(modules)
        except TypeError:
            raise TypeError(f"ModuleList: expected an iterable of Modules, got "
                            f"{type(modules).__name__} (for one module: append)") from None
        for module in modules:
            _list_item(module)  # every item checked before any is added
        for module in modules:
            self.append(module)
        return self

    def _position(self, index):
        """The registered name at position `index` (negative counts from the end)."""
        names = [name for name, _ in self._child_items()]
        try:
            return names[operator.index(index)]
        except IndexError:
            raise IndexError(f"ModuleList index {index} is out of range for {len(names)} "
                             "modules") from None

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._fresh([module for _, module in self._child_items()][index])
        return self.__dict__[self._position(index)]

    @staticmethod
    def _fresh(modules):
        """A new ModuleList of `modules`, registered without counting a structure change: a
        container no model holds yet changes no model (assigning it to one counts), and a
        compiled step whose forward slices self.blocks replays rather than recording again."""
        fresh = ModuleList()
        for i, module in enumerate(modules):
            fresh._registered[str(i)] = _MODULE
            object.__setattr__(fresh, str(i), module)
        return fresh

    def __setitem__(self, index, module):
        setattr(self, self._position(index), _list_item(module))

    def __delitem__(self, index):
        """Remove the module at `index` (a slice: those it selects); the ones left are numbered
        again from "0", as PyTorch's are, so that state_dict names them as a ModuleList of them
        would."""
        if not isinstance(index, slice):
            self._position(index)  # an IndexError that says how many there are
        modules = [module for _, module in self._child_items()]
        del modules[index]
        for name, _ in self._child_items():
            delattr(self, name)
        for i, module in enumerate(modules):
            setattr(self, str(i), module)

    def __len__(self):
        return len(self._child_items())

    def __iter__(self):
        return iter([module for _, module in self._child_items()])

    def forward(self, *inputs):
        raise NotImplementedError(
            "ModuleList has no forward: call its modules in your model's forward (for block in "
            "self.blocks: x = block(x)), or use Sequential to run them one after another")


def _list_item(module):
    """`module`, once it is a Module (what a ModuleList may hold)."""
    _not_a_class(module, "ModuleList")
    if not isinstance(module, Module):
        hint = (" (a function such as F.relu: call it in forward, or use Sequential, which "
                "takes callables)") if callable(module) else ""
        raise TypeError(f"ModuleList: an item must be a Module, got "
                        f"{type(module).__name__}{hint}")
    return module


def _layer_index(name):
    """i for MLP's layer names l0, l1, ... (decimal, no leading zeros: "l01" is not one), else
    None."""
    digits = name[1:]
    if name[:1] == "l" and digits.isascii() and digits.isdigit() and str(int(digits)) == digits:
        return int(digits)
    return None


class _IndexedLayers(Module):
    """Layers kept as DeZero's MLP and Sequential keep them: sub-modules named l0, l1, ...
    (plain callables wrapped), run in index order, with a `layers` list beside them. Subclasses
    set `_where`, the name errors give them."""

    def _layer_items(self):
        """(name, layer) for the sub-modules named l<i>, by index i; None ones skipped."""
        attributes = self.__dict__
        found = []
        for name, kind in self._registered.items():
            if kind == _MODULE and attributes.get(name) is not None:
                index = _layer_index(name)
                if index is not None:
                    found.append((index, name))
        return [(name, attributes[name]) for _, name in sorted(found)]

    @property
    def layers(self):
        """The layers forward runs, in order: the sub-modules l0, l1, ... by index (one deleted
        or set to None skipped), plain callables as given. A new list at each read: change the
        layers by assigning model.l1, or the whole list.

        Assigning a list (DeZero's MLP and Sequential keep `self.layers`, and a subclass may set
        it, e.g. self.layers = [self.l0, self.l1, self.head]) makes its items l0, l1, ...
        (those already there stay as they are) and removes any l<i> past its end, so the list
        is what runs, trains and is saved."""
        return [layer.fn if type(layer) is _Call else layer for _, layer in self._layer_items()]

    @layers.setter
    def layers(self, layers):
        try:
            layers = list(layers)
        except TypeError:
            raise TypeError(f"{self._where}.layers must be a list of layers, got "
                            f"{type(layers).__name__}") from None
        for i, layer in enumerate(layers):
            _not_a_class(layer, f"{self._where}.layers[{i}]")
            if not callable(layer):
                raise TypeError(f"{self._where}.layers[{i}]: a layer must be a Module or a "
                                f"callable, got {type(layer).__name__}")
        for i, layer in enumerate(layers):
            current = self.__dict__.get(f"l{i}")
            if current is not layer and not (type(current) is _Call and current.fn is layer):
                setattr(self, f"l{i}", layer if isinstance(layer, Module) else _Call(layer))
        for name, _ in self._layer_items():
            if _layer_index(name) >= len(layers):
                delattr(self, name)


class MLP(_IndexedLayers):
    """DeZero's multi-layer perceptron: one lazy Linear per entry of `fc_output_sizes`
    (attributes l0, l1, ...), with `activation` between them and none after the last.

    forward runs the sub-modules named l0, l1, ... in index order (see `layers`), as DeZero's
    runs its list of them: replacing or deleting mlp.l1 changes what runs and what is saved
    alike, and a layer a subclass adds under another name (self.head = Linear(2)) is its own
    to call, never run by MLP.forward.
    """

    _where = "MLP"

    def __init__(self, fc_output_sizes, activation=F.sigmoid):
        super().__init__()
        try:
            sizes = list(fc_output_sizes)
        except TypeError:
            raise TypeError(f"MLP: fc_output_sizes must be a sequence of ints, e.g. (10, 1), got "
                            f"{fc_output_sizes!r}") from None
        if not sizes:
            raise ValueError("MLP: fc_output_sizes is empty; give at least one layer size")
        _not_a_class(activation, "MLP: activation")
        if not callable(activation):
            raise TypeError(f"MLP: activation must be callable, got {type(activation).__name__}")
        self.activation = activation
        for i, size in enumerate(sizes):
            setattr(self, f"l{i}", Linear(_size(size, f"fc_output_sizes[{i}]", "MLP")))

    def forward(self, x):
        layers = self._layer_items()
        if not layers:
            raise ValueError("MLP: no layers l0, l1, ... left (all were deleted or set to None); "
                             "assign one, e.g. mlp.l0 = Linear(10)")
        for _, layer in layers[:-1]:
            x = self.activation(layer(x))
        return layers[-1][1](x)


__all__ = ["Linear", "Conv2d", "Deconv2d", "BatchNorm", "Dropout", "EmbedID", "Embedding",
           "ReLU", "Sigmoid", "Tanh", "Sequential", "ModuleList", "MLP"]
