"""Layers (DeZero's names and defaults): Linear, Conv2d, Deconv2d, BatchNorm, Dropout, EmbedID,
activations, and the containers Sequential, ModuleList, ModuleDict, ParameterList,
ParameterDict and MLP."""
import numbers
import operator
import warnings

import numpy

import backends

from .. import functions as F
from ..functions.conv import pair
from ..variable import Parameter, Variable, as_variable
from .module import (_MODULE, _PARAMETER, Module, _check_name, _float_name, _held_by_a_module,
                     _lazy_dtype, _namespace_dtype, _note_holder)


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
    `x`: the device of the layer's last to(device), else x's, and in that namespace the dtype
    of its last to(dtype=), else its own `dtype`: a float64 input meets float32 weights, as in
    DeZero and PyTorch, unless the layer says otherwise. A model moved to a device builds there,
    as PyTorch's lazy modules do: an input left elsewhere is refused by the op, where making the
    weights on the input's device would undo the move without a word. Such an input is refused
    here, before any weight is made, naming both devices (the op would name them too, but not
    that the model was moved)."""
    x = as_variable(x)
    if x.data is None:
        raise ValueError(f"{where}: the input has no data (data is None)")
    if layer._device is not None:
        backend, device = backends.backend_for_device(layer._device), layer._device
    else:
        backend, device = x.backend, x.device
    dtype = _namespace_dtype(backend, device, _lazy_dtype(layer), where)
    if layer._device is not None and (x.backend is not backend or x.device != device):
        _refuse_elsewhere(x, backend, device, dtype, where)
    return backend, device, dtype


def _refuse_elsewhere(x, backend, device, dtype, where):
    """Raise where the input `x` of a lazy layer moved to `device` (with Module.to) is elsewhere:
    TypeError for another array library, ValueError for another device of it, as the ops. A
    device named without its index ("cuda": the current GPU) is the one an array made there
    lands on."""
    if x.backend is backend and x.device == backend.device_of(backend.zeros((0,), dtype, device)):
        return
    error = TypeError if x.backend is not backend else ValueError
    raise error(
        f"{where}: the model was moved to {device} (with .to()), and its input is on {x.device}: "
        f"move the input to the model's device (x.to('{device}')) or the model to the input's "
        f"(model.to('{x.device}')) first")


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
        name = type(layer).__name__
        hint = ""
        if isinstance(layer, _ConvBase) and isinstance(nobias, numbers.Integral):
            # Conv2d(3, 64, 7, 2, 3): PyTorch's (in, out, kernel, stride, padding)
            hint = (f" (a number as the fifth argument: PyTorch's {_TORCH_NAMES.get(name, name)}"
                    f"(in_channels, out_channels, kernel_size, stride, padding)? gradcore's is "
                    f"DeZero's {name}(out_channels, kernel_size, stride, pad, nobias): write "
                    f"{name}(out_channels, kernel_size, stride=..., pad=..., in_channels=...))")
        raise TypeError(f"{name}: nobias must be True or False, got {nobias!r}{hint}")
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


# PyTorch's keywords for Linear -> what gradcore's Linear takes instead
_TORCH_LINEAR_KEYWORDS = {
    "bias": "nobias= (nobias=True for PyTorch's bias=False)",
    "in_features": "in_size=",
    "out_features": "out_size=",
    "device": "no device=: build it, then move it with .to(device) (a lazy Linear is made "
              "where its first input is)",
}


class Linear(Module):
    """A fully connected layer: y = x @ W + b for x (N, in_size), or (..., in_size) as
    PyTorch's (a sequence's every step), W (in_size, out_size), b (out_size,).

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

    def __init__(self, *sizes, out_size=None, nobias=False, dtype=None, in_size=None, **kwargs):
        _only_gradcore_keywords("Linear", kwargs, _TORCH_LINEAR_KEYWORDS,
                                "out_size, in_size, nobias and dtype")
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
                if len(shape) < 1:
                    raise ValueError(f"Linear: x must be (in_size,), (batch, in_size) or (..., "
                                     f"in_size), got shape {shape}")
                in_size = shape[-1]
        self._initialize(*_placement(x, self, "Linear"), in_size)

    def forward(self, x):
        if _unfilled(self):
            self._lazy_init(x)
        return F.linear(x, self.W, self.b)

    def extra_repr(self):
        return f"in_size={self.in_size}, out_size={self.out_size}, nobias={self.nobias}"


# =============================================================================== convolution
def _conv_options(stride=1, pad=0, nobias=False, dtype=None, in_channels=None):
    """The convolutions' arguments after kernel_size, as DeZero orders them."""
    return stride, pad, nobias, dtype, in_channels


# PyTorch's keywords for Conv2d / ConvTranspose2d -> what gradcore takes instead
_TORCH_CONV_KEYWORDS = {
    "padding": "pad= (pad=1 for PyTorch's padding=1)",
    "bias": "nobias= (nobias=True for PyTorch's bias=False)",
    "dilation": "no dilation (gradcore's convolutions have none)",
    "groups": "no groups (gradcore's convolutions have none)",
    "padding_mode": "no padding_mode (gradcore pads with zeros)",
    "output_padding": "no output_padding",
    "device": "no device=: build it, then move it with .to(device) (a lazy layer is made where "
              "its first input is)",
}


_TORCH_NAMES = {"Deconv2d": "ConvTranspose2d"}  # gradcore's (DeZero's) layer -> PyTorch's


def _conv_signature(where):
    """The convolution `where`'s signature, DeZero's, for messages."""
    return (f"{where}(out_channels, kernel_size, stride=1, pad=0, nobias=False, dtype=None, "
            "in_channels=None)")


def _refuse_torch_keywords(where, kwargs, torch_keywords, *given):
    """A TypeError naming gradcore's keyword for the first of `kwargs` that is one of PyTorch's
    (in `torch_keywords`), with DeZero's order spelt out where the positional arguments `given`
    (out_channels, kernel_size, and the others) are likely PyTorch's."""
    for name in kwargs:
        if name in torch_keywords:
            order = ""
            if given and given[2]:  # three or more by position: PyTorch's (in, out, kernel, ...)?
                out, k, rest = given
                torch_name = _TORCH_NAMES.get(where, where)
                order = (f"; and the order of the arguments is DeZero's, {_conv_signature(where)}:"
                         f" PyTorch's {torch_name}({out}, {k}, {rest[0]}, ...) is {where}({k}, "
                         f"{rest[0]}, ..., in_channels={out}) here")
            raise TypeError(f"{where} got PyTorch's keyword {name}=; gradcore's {where} takes "
                            f"{torch_keywords[name]}{order}")


def _only_gradcore_keywords(where, kwargs, torch_keywords, takes):
    """TypeError for the first keyword in `kwargs` (all a layer did not take by name): PyTorch's
    answered with gradcore's (_refuse_torch_keywords), any other with what `where` takes."""
    _refuse_torch_keywords(where, kwargs, torch_keywords)
    if kwargs:
        raise TypeError(f"{where} got an unexpected keyword argument {next(iter(kwargs))!r} "
                        f"(it takes {takes})")


def _refuse_torch_order(where, args, kwargs):
    """TypeError for PyTorch's Conv2d(in_channels, out_channels, kernel_size=k, ...): Python's
    own says only that kernel_size came twice. Names what to write instead."""
    in_channels, out_channels = args[0], args[1]
    options = [repr(a) for a in args[2:]]  # stride, PyTorch's and DeZero's third
    for name, value in kwargs.items():
        if name == "padding":
            options.append(f"pad={value!r}")
        elif name == "bias":
            options.append(f"nobias={not value!r}")
        elif name != "kernel_size":
            options.append(f"{name}={value!r}")
    written = ", ".join([repr(out_channels), repr(kwargs["kernel_size"]), *options,
                         f"in_channels={in_channels!r}"])
    raise TypeError(
        f"{where}({in_channels!r}, {out_channels!r}, kernel_size=...) is PyTorch's order "
        f"(in_channels, out_channels, kernel_size); gradcore's {where} is DeZero's, "
        f"{_conv_signature(where)}: write {where}({written})")


def _conv_heads(out_channels, kernel_size, *args, **kwargs):
    """The convolutions' arguments as DeZero orders them: the first two, and the others."""
    return out_channels, kernel_size, args, kwargs


class _ConvBase(Module):
    """Shared by Conv2d and Deconv2d: sizes, W and b, lazy in_channels."""

    _name = None
    _in_axis = None  # the axis of W that runs over the input channels
    nobias = _NOBIAS  # b = None drops the bias, as Linear's
    __setattr__ = _setattr_setting_aside
    _refilled = ("W", "b")

    def __init__(self, *args, **kwargs):
        # (out_channels, kernel_size, stride=1, pad=0, nobias=False, dtype=None,
        # in_channels=None), DeZero's, all of them positional or keyword: read by hand, to
        # know whether stride came by position (see _check_order) and to answer PyTorch's
        # order and keywords with gradcore's
        where = self._name
        signature = _conv_signature(where)
        if len(args) >= 2 and "kernel_size" in kwargs:
            _refuse_torch_order(where, args, kwargs)
        try:
            out_channels, kernel_size, args, kwargs = _conv_heads(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{signature}: {str(e).replace('_conv_heads() ', '')}") from None
        _refuse_torch_keywords(where, kwargs, _TORCH_CONV_KEYWORDS, out_channels, kernel_size,
                               args)
        if len(args) > 5:
            raise TypeError(f"{signature} takes at most 7 arguments by position, got "
                            f"{len(args) + 2}")
        try:
            stride, pad, nobias, dtype, in_channels = _conv_options(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{signature}: {str(e).replace('_conv_options() ', '')}") from None
        super().__init__()
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
        # Conv2d(3, 16, 3), PyTorch's (in, out, kernel) read as (out, kernel, stride): checked
        # against the first input (see _check_order). Only three by position: a fourth is
        # DeZero's pad or PyTorch's stride, and DeZero's own models write all four
        # (ResNet's Conv2d(64, 3, 1, 1)), so that case cannot tell them apart
        self._order_unsure = len(args) == 1 and self._in_channels is None
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
                if self.__dict__.get("_order_unsure"):
                    self._check_order(C, shape[2:])
            self._initialize(*_placement(x, self, self._name), C)

    def _check_order(self, C, size):
        """Warn (once: at the first input) where exactly out_channels, kernel_size and stride
        came by position, the input has out_channels channels, and DeZero's reading of them is
        implausible where PyTorch's is not: likely PyTorch's Conv2d(in_channels, out_channels,
        kernel_size), which here reads as Conv2d(out_channels, kernel_size, stride) and builds a
        layer that runs (out_channels=3, a 16x16 kernel, stride 3). `size`: the input's (H, W).

        DeZero's reading (out, k, s) is taken as implausible where its kernel is larger than 11
        (AlexNet's first, the largest in common use; PyTorch's out_channels, read as k, is
        mostly 16 or more), where its stride is larger than its kernel (input pixels skipped)
        or larger than 4 without equalling it (common strides are 1, 2, AlexNet's 4, or the
        kernel itself for patches: PyTorch's LeNet Conv2d(3, 6, 5) reads as k=6, s=5), or,
        for Conv2d, where the kernel is larger than the padded input (the op could not run).
        On an image's channels (1: grayscale, 3: RGB), the input of a network's first layer,
        where PyTorch's order is most often written, it is implausible too where its kernel is
        even and not its stride: a layer keeping an image's channels, with a kernel neither odd
        as kernels are (1 to 11) nor a patch's; PyTorch's out_channels are mostly even (6, 8,
        16): Conv2d(3, 8, 3) reads as k=8, s=3. PyTorch's reading is implausible where its
        kernel (s here) is larger than the input (Conv2d). DeZero's own forms (Conv2d(64, 3,
        1), Deconv2d(8, 4, 2), Conv2d(3, 3, 1), Conv2d(3, 4, 4)) pass all of these."""
        self._order_unsure = False
        if C != self.out_channels:
            return
        k, s, p = pair(self.kernel_size), pair(self.stride), pair(self.pad)
        padded = [n + 2 * q for n, q in zip(size, p)]
        convolves = self._name == "Conv2d"
        dezero_unlikely = (max(k) > 11 or any(si > ki or (si > 4 and si != ki)
                                              for si, ki in zip(s, k))
                           or (convolves and any(ki > n for ki, n in zip(k, padded)))
                           or (C in (1, 3) and any(ki % 2 == 0 and ki != si
                                                   for si, ki in zip(s, k))))
        torch_unlikely = convolves and any(si > n for si, n in zip(s, size))
        if not dezero_unlikely or torch_unlikely:
            return
        name, out, k, stride = self._name, self.out_channels, self.kernel_size, self.stride
        warnings.warn(
            f"{name}({out}, {k}, {stride}) reads as DeZero's {name}(out_channels={out}, "
            f"kernel_size={k}, stride={stride}), and its first input has {C} channels, as many as "
            f"out_channels: if you meant PyTorch's {_TORCH_NAMES.get(name, name)}(in_channels, "
            f"out_channels, kernel_size), write it {name}({k}, {stride}, in_channels={out}) here "
            "(out_channels and kernel_size first; in_channels, stride and pad by keyword). Pass "
            f"stride by keyword ({name}({out}, {k}, stride={stride})) to silence this warning",
            UserWarning, stacklevel=5)

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
# PyTorch's keywords for BatchNorm1d/2d -> what gradcore's BatchNorm takes instead
_TORCH_BATCH_NORM_KEYWORDS = {
    "num_features": "no size: it learns the channel count from its first input (BatchNorm())",
    "momentum": "decay= (decay = 1 - momentum: PyTorch's momentum=0.1 is decay=0.9, the default)",
    "affine": "no affine= (gamma and beta are always there; freeze them with "
              "requires_grad_(False))",
    "track_running_stats": "no track_running_stats= (it always keeps them)",
    "device": "no device=: it is made where its first input is",
}


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

    def __init__(self, decay=0.9, eps=2e-5, dtype=None, **kwargs):
        _refuse_torch_keywords("BatchNorm", kwargs, _TORCH_BATCH_NORM_KEYWORDS)
        if kwargs:
            raise TypeError(f"BatchNorm(decay=0.9, eps=2e-5, dtype=None) got an unexpected "
                            f"keyword argument {next(iter(kwargs))!r}")
        super().__init__()
        self.dtype = _numpy_dtype(dtype, "BatchNorm")
        for name, value in (("decay", decay), ("eps", eps)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"BatchNorm: {name} must be a number, got {value!r}")
        if decay >= 1 and float(decay).is_integer():
            raise ValueError(
                f"BatchNorm({decay}): BatchNorm's first argument is decay, DeZero's (the running "
                "statistics keep decay of their old value at each step), not PyTorch's "
                "num_features: gradcore's BatchNorm learns its channel count from its first "
                "input, so give none: BatchNorm(). PyTorch's momentum m is decay = 1 - m here "
                "(momentum=0.1 is the default decay=0.9)")
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


_TORCH_DROPOUT_KEYWORDS = {
    "p": "dropout_ratio= (PyTorch's p=0.2 is dropout_ratio=0.2)",
    "inplace": "no inplace= (it makes a new array)",
}


class Dropout(Module):
    """F.dropout(x, dropout_ratio) in train mode, x unchanged in eval / test mode."""

    def __init__(self, dropout_ratio=0.5, **kwargs):
        _only_gradcore_keywords("Dropout", kwargs, _TORCH_DROPOUT_KEYWORDS, "dropout_ratio")
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
_TORCH_EMBEDDING_KEYWORDS = {
    "num_embeddings": "in_size= (the number of ids)",
    "embedding_dim": "out_size=",
    "padding_idx": "no padding_idx (every id's row learns)",
    "max_norm": "no max_norm",
    "sparse": "no sparse= (its gradient is dense)",
    "device": "no device=: build it, then move it with .to(device)",
}


class EmbedID(Module):
    """A lookup table: integer ids x (any shape) -> rows of W (in_size, out_size), shaped
    x.shape + (out_size,). W is randn(in_size, out_size), created on the CPU in `dtype`
    (DeZero keeps float64; float32 here like the other layers)."""

    def __init__(self, in_size=None, out_size=None, dtype=None, **kwargs):
        _only_gradcore_keywords("EmbedID", kwargs, _TORCH_EMBEDDING_KEYWORDS,
                                "in_size (the number of ids), out_size and dtype")
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

    def __init__(self, **kwargs):
        _only_gradcore_keywords("ReLU", kwargs, {"inplace": "no inplace= (it makes a new array)"},
                                "no arguments")
        super().__init__()

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
    layers under the same names: seq[1:]'s first parameter is "1.W"), len() and iteration;
    `append` adds a layer.
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
        if isinstance(index, slice):
            part = Sequential()
            for name, layer in self._child_items()[index]:
                setattr(part, name, layer)  # under its name here, as PyTorch's slice keeps keys
            return part
        layers = self._layers()
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


class _NumberedList(Module):
    """A list whose items are registered as "0", "1", ... (ModuleList, ParameterList): what
    they share. Subclasses set `_kind` (module's registry kind of an item) and `_item` (the
    check of one)."""

    _kind = None
    _noun = None  # "Module", "Parameter"

    def __init__(self, items=()):
        super().__init__()
        self.extend(items)

    def _items(self):
        """(name, item) of each item, in order."""
        attributes, kind = self.__dict__, self._kind
        return [(name, attributes[name]) for name, k in self._registered.items()
                if k == kind and attributes.get(name) is not None]

    def append(self, item):
        """Add `item` at the end, under the next free number; returns self."""
        setattr(self, _next_number(self), self._item(item))
        return self

    def extend(self, items):
        """append each of `items` (an iterable); returns self."""
        where = type(self).__name__
        try:
            items = list(items)
        except TypeError:
            raise TypeError(f"{where}: expected an iterable of {self._noun}s, got "
                            f"{type(items).__name__} (for one {self._noun.lower()}: "
                            "append)") from None
        for item in items:
            self._item(item)  # every item checked before any is added
        for item in items:
            self.append(item)
        return self

    def _position(self, index):
        """The registered name at position `index` (negative counts from the end)."""
        names = [name for name, _ in self._items()]
        try:
            return names[operator.index(index)]
        except IndexError:
            raise IndexError(f"{type(self).__name__} index {index} is out of range for "
                             f"{len(names)} {self._noun.lower()}s") from None

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._fresh([item for _, item in self._items()][index])
        return self.__dict__[self._position(index)]

    def _fresh(self, items):
        """A new list of `items`, registered without counting a structure change: a container
        no model holds yet changes no model (assigning it to one counts), and a compiled step
        whose forward slices self.blocks replays rather than recording again."""
        fresh = type(self)()
        for i, item in enumerate(items):
            fresh._registered[str(i)] = self._kind
            object.__setattr__(fresh, str(i), item)
            if isinstance(item, Parameter):
                _note_holder(fresh, item)
        return fresh

    def __setitem__(self, index, item):
        setattr(self, self._position(index), self._item(item))

    def __delitem__(self, index):
        """Remove the item at `index` (a slice: those it selects); the ones left are numbered
        again from "0", as PyTorch's are, so that state_dict names them as a list of them
        would."""
        if not isinstance(index, slice):
            self._position(index)  # an IndexError that says how many there are
        items = [item for _, item in self._items()]
        del items[index]
        for name, _ in self._items():
            delattr(self, name)
        for i, item in enumerate(items):
            setattr(self, str(i), item)

    def __len__(self):
        return len(self._items())

    def __iter__(self):
        return iter([item for _, item in self._items()])


class ModuleList(_NumberedList):
    """Modules kept in a list and registered, as "0", "1", ... (so parameters() trains them and
    state_dict saves them as "0.W", "1.W"): self.blocks = ModuleList([Linear(4), Linear(3)])
    (PyTorch's name). A plain list of layers is not registered (Module warns about one).

    append, extend, len(), iteration, indexing (an int gives a module, a slice a new ModuleList
    of the same modules), item assignment (replaces the module at that position) and `del`
    (an int or a slice; those left are numbered again from "0", as in PyTorch). It has no
    forward: the model holding it calls its modules (for block in self.blocks: x = block(x)).
    """

    _kind = _MODULE
    _noun = "Module"

    def __init__(self, modules=()):
        super().__init__(modules)

    @staticmethod
    def _item(module):
        return _list_item(module)

    def forward(self, *inputs):
        raise NotImplementedError(
            "ModuleList has no forward: call its modules in your model's forward (for block in "
            "self.blocks: x = block(x)), or use Sequential to run them one after another")


class ParameterList(_NumberedList):
    """Parameters kept in a list and registered, as "0", "1", ... (trained by parameters(),
    saved by state_dict as "ps.0", moved by to()): self.ps = ParameterList([Parameter(w)])
    (PyTorch's name). Holds Parameters only. Methods as ModuleList's; no forward: the model's
    forward reads them (self.ps[0])."""

    _kind = _PARAMETER
    _noun = "Parameter"

    def __init__(self, parameters=()):
        super().__init__(parameters)

    @staticmethod
    def _item(p):
        return _parameter_item(p, "ParameterList")

    def forward(self, *inputs):
        raise NotImplementedError("ParameterList has no forward: use its Parameters in your "
                                  "model's forward (self.ps[0])")

    def extra_repr(self):
        return ", ".join(f"{name}: {_shape_of(p)}" for name, p in self._items())


def _list_item(module):
    """`module`, once it is a Module (what a ModuleList may hold)."""
    _not_a_class(module, "ModuleList")
    if not isinstance(module, Module):
        hint = (" (a function such as F.relu: call it in forward, or use Sequential, which "
                "takes callables)") if callable(module) else ""
        if isinstance(module, Parameter):
            hint = " (hold Parameters in an nn.ParameterList)"
        raise TypeError(f"ModuleList: an item must be a Module, got "
                        f"{type(module).__name__}{hint}")
    return module


def _parameter_item(p, where):
    """`p`, once it is a Parameter (what a ParameterList or ParameterDict may hold)."""
    if not isinstance(p, Parameter):
        container = "nn.ModuleDict" if where == "ParameterDict" else "nn.ModuleList"
        if isinstance(p, Module) or isinstance(p, type) and issubclass(p, Module):
            hint = f" (hold Modules in an {container})"
        elif isinstance(p, Variable) or backends.is_array(p):
            hint = " (make it one: nn.Parameter(array))"
        else:
            hint = ""
        item = "a value" if where == "ParameterDict" else "an item"
        raise TypeError(f"{where}: {item} must be a Parameter, got {type(p).__name__}{hint}")
    return p


def _shape_of(p):
    return "no data yet" if p.data is None else tuple(p.shape)


class _NamedDict(Module):
    """A dict whose values are registered under their keys (ModuleDict, ParameterDict): what
    they share. Subclasses set `_kind` (the registry kind of a value) and `_item` (the check of
    one). A key is an attribute name of the container, so it must be a string without "." and
    not the name of one of its methods or attributes ("train", "keys")."""

    _kind = None

    def __init__(self, items=None):
        super().__init__()
        if items is not None:
            self.update(items)

    def _check_key(self, key):
        where = type(self).__name__
        _check_name(self, key, "cannot use the key")
        if self._registered.get(key) != self._kind and (hasattr(type(self), key)
                                                        or key in self.__dict__):
            raise KeyError(f"{where}: the key {key!r} is the name of an attribute of {where} "
                           "(a method or its own state); pick another key")
        return key

    def _items(self):
        attributes, kind = self.__dict__, self._kind
        return [(name, attributes[name]) for name, k in self._registered.items()
                if k == kind and attributes.get(name) is not None]

    def __getitem__(self, key):
        if key not in self:
            raise KeyError(f"{type(self).__name__} has no key {key!r} (its keys: "
                           f"{', '.join(map(repr, self.keys())) or 'none'})")
        return self.__dict__[key]

    def __setitem__(self, key, value):
        setattr(self, self._check_key(key), self._item(value))

    def __delitem__(self, key):
        self[key]  # a KeyError that lists the keys
        delattr(self, key)

    def __contains__(self, key):
        return (isinstance(key, str) and self._registered.get(key) == self._kind
                and self.__dict__.get(key) is not None)

    def __len__(self):
        return len(self._items())

    def __iter__(self):
        return iter(self.keys())

    def keys(self):
        """The keys, in insertion order."""
        return [name for name, _ in self._items()]

    def values(self):
        """The values, in insertion order."""
        return [value for _, value in self._items()]

    def items(self):
        """(key, value) pairs, in insertion order."""
        return self._items()

    def update(self, items):
        """Add or replace the entries of `items` (a mapping, or an iterable of (key, value)
        pairs), every one checked before any is set."""
        where = type(self).__name__
        pairs = items.items() if hasattr(items, "keys") else items
        try:
            pairs = [(key, value) for key, value in pairs]
        except (TypeError, ValueError):
            raise TypeError(f"{where}: expected a mapping or (key, value) pairs, got "
                            f"{type(items).__name__}") from None
        for key, value in pairs:
            self._check_key(key)
            self._item(value)
        for key, value in pairs:
            self[key] = value

    def pop(self, key):
        """Remove the entry `key` and return its value."""
        value = self[key]
        delattr(self, key)
        return value


class ModuleDict(_NamedDict):
    """Modules kept by name and registered under it (trained by parameters(), saved by
    state_dict as "heads.a.W", moved by to()): self.heads = ModuleDict({"a": Linear(1), "b":
    Linear(1)}) (PyTorch's name). A plain dict of layers is not registered (Module warns about
    one). Indexing by key, assignment, `del`, `in`, len(), iteration over the keys, keys(),
    values(), items(), update() and pop(); no forward: the model holding it calls its modules
    (self.heads["a"](h))."""

    _kind = _MODULE

    @staticmethod
    def _item(module):
        _not_a_class(module, "ModuleDict")
        if not isinstance(module, Module):
            hint = " (hold Parameters in an nn.ParameterDict)" if isinstance(
                module, Parameter) else ""
            raise TypeError(f"ModuleDict: a value must be a Module, got "
                            f"{type(module).__name__}{hint}")
        return module

    def forward(self, *inputs):
        raise NotImplementedError("ModuleDict has no forward: call its modules in your model's "
                                  "forward (self.heads['a'](x))")


class ParameterDict(_NamedDict):
    """Parameters kept by name and registered under it (trained by parameters(), saved by
    state_dict as "extra.scale", moved by to()): self.extra = ParameterDict({"scale":
    Parameter(w)}) (PyTorch's name). Holds Parameters only; methods as ModuleDict's."""

    _kind = _PARAMETER

    @staticmethod
    def _item(p):
        return _parameter_item(p, "ParameterDict")

    def forward(self, *inputs):
        raise NotImplementedError("ParameterDict has no forward: use its Parameters in your "
                                  "model's forward (self.extra['scale'])")

    def extra_repr(self):
        return ", ".join(f"{name}: {_shape_of(p)}" for name, p in self._items())


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
           "ReLU", "Sigmoid", "Tanh", "Sequential", "ModuleList", "ModuleDict", "ParameterList",
           "ParameterDict", "MLP"]
