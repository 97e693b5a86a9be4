"""Variable (a node holding an array and its gradient), Parameter, as_variable, as_array."""
import operator
import weakref

import numpy

import backends
from backends import backend_of

_SCALARS = frozenset((int, float, bool))  # `x.__class__ in _SCALARS`: a hash lookup, no comparisons


def _check_data(data):
    """(array, backend) for what `Variable(data)` accepts; TypeError naming anything else."""
    if data is None:
        return None, None
    backend = backend_of(data)
    if backend is None:
        if isinstance(data, (*_SCALARS, list, tuple)):
            return numpy.asarray(data), backends.NUMPY
        raise TypeError(
            f"Variable data must be an array of a registered backend (numpy.ndarray, cupy.ndarray, "
            f"an __array_namespace__ array), a Python scalar, a list or a tuple; got "
            f"{type(data).__module__}.{type(data).__qualname__}")
    if type(data) is not backend.array_type:
        data = backend.ensure_array(data)  # NumPy scalars become 0-d arrays
    return data, backend


class Variable:
    """An array in the graph: `data`, its `grad` (a Variable or None) and its `creator` Function.

    `requires_grad=True` (the default, as in DeZero) makes backward fill `grad`; raw arrays passed
    straight into an op are constants and never receive one.
    """

    __slots__ = ("_data", "_backend", "name", "grad", "creator", "generation", "requires_grad",
                 "_hooks", "__weakref__")
    __array_priority__ = 200
    __array_ufunc__ = None  # `ndarray <op> Variable` defers to the Variable's reflected operator

    def __init__(self, data, name=None, requires_grad=True):
        self._data, self._backend = _check_data(data)
        self.name = name
        self.grad = None
        self.creator = None
        self.generation = 0
        self.requires_grad = requires_grad
        self._hooks = None

    # ---------------------------------------------------------------- data and its properties
    @property
    def data(self):
        """The array. An op result that NumPy computed as a scalar (0-d arithmetic, reductions)
        is stored as that scalar, ops being faster on it; read here, it becomes a 0-d array."""
        data = self._data
        if data is not None and data.__class__ is not self._backend.array_type:
            data = self._data = self._backend.ensure_array(data)
        return data

    @data.setter
    def data(self, value):
        self._data, self._backend = _check_data(value)

    # attrgetter runs in C: these are read in every backward, so no Python frame per access
    shape = property(operator.attrgetter("_data.shape"), doc="The shape of `data`.")
    ndim = property(operator.attrgetter("_data.ndim"), doc="The number of axes of `data`.")
    size = property(operator.attrgetter("_data.size"), doc="The number of elements of `data`.")
    dtype = property(operator.attrgetter("_data.dtype"), doc="The dtype of `data`.")

    @property
    def backend(self):
        """The backends.Backend owning `data`."""
        return self._backend

    @property
    def xp(self):
        """The array namespace of `data` (numpy, cupy, ...)."""
        return self._backend.xp

    @property
    def device(self):
        """The backends.Device that `data` lives on."""
        return self._backend.device_of(self._data)

    @property
    def is_leaf(self):
        """True if no recorded Function created this Variable."""
        return self.creator is None

    @property
    def grad_fn(self):
        """PyTorch's name for `creator`."""
        return self.creator

    @property
    def T(self):
        return transpose(self)

    def __len__(self):
        if not self._data.ndim:
            raise TypeError("len() of a 0-d Variable")
        return self._data.shape[0]

    def __bool__(self):
        return bool(self._data)

    def __repr__(self):
        if self._data is None:
            return "variable(None)"
        text = str(self._backend.to_numpy(self._data)).replace("\n", "\n" + " " * 9)
        device = self.device
        if device != backends.CPU:
            text += f", device={device}"
        return f"variable({text})"

    def item(self):
        """The single value as a Python scalar (a device-to-host copy on a GPU)."""
        return self._data.item() if hasattr(self._data, "item") else self.numpy().item()

    def numpy(self):
        """`data` as a NumPy array (copied to the host if it lives elsewhere)."""
        return self._backend.to_numpy(self._data)

    # ---------------------------------------------------------------- graph
    def backward(self, grad=None, retain_grad=False, create_graph=False):
        """Fill `.grad` of the leaves this Variable depends on.

        `grad` is the seed (array or Variable shaped like this one); by default ones, i.e. the
        gradient of `sum(self)`. `retain_grad` keeps gradients of intermediate Variables too;
        `create_graph` records the backward pass so gradients can be differentiated again.
        """
        engine.backward(self, grad, retain_grad, create_graph)

    def cleargrad(self):
        """Forget the accumulated gradient (DeZero's name; PyTorch zeroes `grad` instead)."""
        self.grad = None

    def unchain(self):
        """Cut the link to the creator: this Variable becomes a leaf."""
        self.creator = None

    def unchain_backward(self):
        """Cut every link in the graph behind this Variable (iteratively, however deep)."""
        stack = [self.creator] if self.creator is not None else []
        seen = set()
        while stack:
            f = stack.pop()
            for x in f.inputs:
                if isinstance(x, Variable) and x.creator is not None:
                    if id(x.creator) not in seen:
                        seen.add(id(x.creator))
                        stack.append(x.creator)
                    x.unchain()

    def detach(self):
        """A new leaf sharing `data`, with requires_grad=False."""
        return Variable(self._data, name=self.name, requires_grad=False)

    def register_hook(self, hook):
        """Call `hook(grad)` when this Variable's total gradient is known; a returned Variable
        replaces the gradient. Returns a handle whose `.remove()` unregisters the hook."""
        if not callable(hook):
            raise TypeError(f"register_hook expects a callable, got {type(hook).__name__}")
        if self._hooks is None:
            self._hooks = []
        self._hooks.append(hook)
        return _HookHandle(self, hook)

    # ---------------------------------------------------------------- devices
    def to(self, device):
        """This Variable on `device` ("cpu", "cuda", "cuda:1", a Device). Differentiable:
        the gradient flows back to the source device. Returns self if already there."""
        return to(self, device)

    def to_cpu(self):
        """Move `data` (and `grad`) to the CPU in place, as DeZero does; returns self."""
        return self._move("cpu")

    def to_gpu(self, device=None):
        """Move `data` (and `grad`) to a GPU in place ("cuda" = the current one); returns self."""
        return self._move("cuda" if device is None else device)

    def _move(self, device):
        if self._data is not None:
            self.data = backends.to_device(self._data, device)
        if self.grad is not None:
            self.grad._move(device)
        return self

    # ---------------------------------------------------------------- shape methods
    def reshape(self, *shape):
        """`reshape(2, 3)` or `reshape((2, 3))`."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        return reshape(self, tuple(shape))

    def transpose(self, *axes):
        """Reverse the axes, or permute them: `transpose(1, 0, 2)` or `transpose((1, 0, 2))`."""
        if not axes:
            axes = None
        elif len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
            axes = axes[0]
        return transpose(self, axes)

    def sum(self, axis=None, keepdims=False):
        return sum(self, axis, keepdims)

    # ---------------------------------------------------------------- operators
    def __add__(self, other):
        return Add()(self, other)

    def __radd__(self, other):
        return Add()(other, self)

    def __sub__(self, other):
        return Sub()(self, other)

    def __rsub__(self, other):
        return Sub()(other, self)

    def __mul__(self, other):
        return Mul()(self, other)

    def __rmul__(self, other):
        return Mul()(other, self)

    def __truediv__(self, other):
        return Div()(self, other)

    def __rtruediv__(self, other):
        return Div()(other, self)

    def __neg__(self):
        return Neg()(self)

    def __pow__(self, c):
        return pow(self, c)

    def __matmul__(self, other):
        return matmul(self, other)

    def __rmatmul__(self, other):
        return matmul(other, self)

    def __getitem__(self, slices):
        return get_item(self, slices)


class Parameter(Variable):
    """A Variable that a Module registers as one of its parameters."""

    __slots__ = ()


class _HookHandle:
    """Returned by `register_hook`; `remove()` unregisters the hook (twice is harmless)."""

    __slots__ = ("_variable", "_hook")

    def __init__(self, variable, hook):
        self._variable = weakref.ref(variable)
        self._hook = hook

    def remove(self):
        variable = self._variable()
        if variable is not None and variable._hooks and self._hook in variable._hooks:
            variable._hooks.remove(self._hook)


def as_variable(obj):
    """`obj` if it is a Variable, else `Variable(obj)`."""
    return obj if isinstance(obj, Variable) else Variable(obj)


def as_array(x, array_module=None):
    """`x` as an array: arrays pass through, scalars become 0-d arrays of `array_module` (NumPy)."""
    if backend_of(x) is not None and not isinstance(x, numpy.generic):
        return x
    xp = numpy if array_module is None else array_module
    return xp.asarray(x)


# Bound at the end: the operators above call these, and they import Variable.
from . import engine  # noqa: E402
from .functions.math import Add, Div, Mul, Neg, Sub, pow  # noqa: E402
from .functions.linalg import matmul  # noqa: E402
from .functions.device import to  # noqa: E402
from .functions.shape import get_item, reshape, transpose  # noqa: E402
from .functions.reduce import sum  # noqa: E402
