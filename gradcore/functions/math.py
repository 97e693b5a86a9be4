"""Elementwise math: arithmetic with broadcasting, pow, exp, log, trigonometry, tanh, sqrt, abs,
maximum, minimum, clip, where."""
import numbers
import operator
from math import log as _log

import backends

from ..config import no_grad
from ..function import Function
from ..variable import Variable, dtype_kind


# =============================================================================== arithmetic
class Add(Function):
    """y = x0 + x1, broadcasting; gx0 = gx1 = gy (the engine sums each to its input's shape)."""
    integers_take_float_dtype = True

    def forward(self, x0, x1):
        return x0 + x1

    def backward(self, gy):
        return gy, gy  # the engine sums a broadcast gradient back to its input's shape


def add(x0, x1):
    """x0 + x1, broadcasting."""
    return Add()(x0, x1)


class Sub(Function):
    """y = x0 - x1, broadcasting; gx0 = gy, gx1 = -gy."""
    integers_take_float_dtype = True

    def forward(self, x0, x1):
        return x0 - x1

    def backward(self, gy):
        return gy, -gy if self.needs_input_grad[1] else None


def sub(x0, x1):
    """x0 - x1, broadcasting."""
    return Sub()(x0, x1)


class Mul(Function):
    """y = x0 * x1, broadcasting; gx0 = gy * x1, gx1 = gy * x0."""
    integers_take_float_dtype = True

    def forward(self, x0, x1):
        return x0 * x1

    def backward(self, gy):
        x0, x1 = self.inputs
        n0, n1 = self.needs_input_grad
        return gy * x1 if n0 else None, gy * x0 if n1 else None


def mul(x0, x1):
    """x0 * x1, broadcasting."""
    return Mul()(x0, x1)


class Div(Function):
    """y = x0 / x1, broadcasting; gx0 = gy / x1, gx1 = -gx0 * (x0 / x1) (no x1 ** 2 to overflow
    or underflow)."""
    integers_take_float_dtype = True

    def forward(self, x0, x1):
        return x0 / x1

    def backward(self, gy):
        x0, x1 = self.inputs
        n0, n1 = self.needs_input_grad
        gx0 = gy / x1
        # d/dx1 = -gy x0 / x1**2, as (gy / x1) (x0 / x1): x1 * x1 would overflow (float16: any
        # |x1| > 256) or underflow where the gradient itself is a finite number
        return gx0 if n0 else None, -gx0 * (x0 / x1) if n1 else None


def div(x0, x1):
    """x0 / x1, broadcasting."""
    return Div()(x0, x1)


class Neg(Function):
    """y = -x; gx = -gy."""

    def forward(self, x):
        return -x

    def backward(self, gy):
        return -gy


def neg(x):
    """-x."""
    return Neg()(x)


class Compare(Function):
    """x0 `compare` x1 (operator.lt, le, gt or ge), element by element: bools, no gradient."""

    def __init__(self, compare):
        self.compare = compare
        self.op_name = compare.__name__

    def forward(self, x0, x1):
        return self.compare(x0, x1)


def compare(op, x0, x1):
    """x0 `op` x1 (operator.lt, le, gt or ge) element by element, broadcasting: a bool Variable
    that takes no part in any gradient (as PyTorch's x > 0)."""
    with no_grad():
        y = Compare(op)(x0, x1)
    return y


class Copy(Function):
    """y = a new array with x's values (PyTorch's clone); gx = gy."""

    def forward(self, x):
        return self.xp.asarray(x, copy=True)

    def backward(self, gy):
        return gy


def copy(x):
    """A new array with x's values (PyTorch's clone): writing into it leaves x alone."""
    return Copy()(x)


def python_number(value):
    """`value` as a Python int or float if it is a real number (a NumPy scalar too: weak, as a
    Python number, where np.float64(2) would turn float32 data into float64), else None."""
    if type(value) in (int, float):  # exactly: np.float64 subclasses float
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return None


class Pow(Function):
    """y = x ** c for a constant number c; gx = gy * c * x ** (c - 1), or 0 for c = 0 (not the
    NaN that formula gives at x = 0)."""

    def __init__(self, c):
        if getattr(c, "shape", None) == () and not isinstance(c, Variable):
            c = c.item() if hasattr(c, "item") else float(c)  # a 0-d array, np.array(2): DeZero's
        self.c = python_number(c)
        if self.c is None:
            shape = getattr(c, "shape", None)
            raise TypeError(
                f"pow: the exponent must be a number, got {type(c).__name__}"
                f"{'' if shape is None else f' of shape {tuple(shape)}'}; for an array or "
                "Variable exponent write exp(c * log(x)) (x > 0)")

    def forward(self, x):
        return x ** self.c

    def backward(self, gy):
        x, = self.inputs
        c = self.c
        if c == 0:  # x ** 0 is 1 everywhere: 0 * x ** -1 would be NaN at 0
            return gy * 0.0
        return gy * (c * x ** (c - 1))


def pow(x, c):
    """x ** c for a constant exponent c."""
    return Pow(c)(x)


class PowerOf(Function):
    """y = c ** x for a constant c > 0; gx = gy * y * log(c), reusing the output."""
    op_name = "pow"

    def __init__(self, c):
        number = None if isinstance(c, bool) else python_number(c)
        if number is None:
            raise TypeError(f"pow: c ** x needs a number c, got {type(c).__name__}; for "
                            "an array base write exp(x * log(c))")
        if not number > 0:
            raise ValueError(f"pow: c ** x needs a positive c (its derivative is c ** x * "
                             f"log(c)), got {c!r}")
        self.c = number

    def forward(self, x):
        return self.c ** x

    def backward(self, gy):
        return gy * self._outputs() * _log(self.c)  # d c**x = c**x ln c: reuse y


def power_of(c, x):
    """c ** x for a positive constant base c (Variable's `2.0 ** x`)."""
    return PowerOf(c)(x)


class Square(Function):
    """y = x * x; gx = gy * 2 * x."""

    def forward(self, x):
        return x * x

    def backward(self, gy):
        x, = self.inputs
        return gy * (2 * x)


def square(x):
    """x ** 2."""
    return Square()(x)


# =============================================================================== exp, log, sin, ...
def _elementwise(name, gradient):
    """A Function class computing xp.<name>(x) elementwise, whose backward is the one line
    `gradient(gy, x, y)` (x the input and y the output, as Variables)."""

    def forward(self, x):
        return getattr(self.backend.xp, name)(x)  # self.xp, without the property's frame

    def backward(self, gy):
        return gradient(gy, self.inputs[0], self._outputs())

    return type(name.capitalize(), (Function,), {
        "forward": forward, "backward": backward, "__module__": __name__,
        "__qualname__": name.capitalize(), "__doc__": f"xp.{name}(x), elementwise."})


# fmt: off
#                   xp name  gradient: gy -> gx, from the input x or the output y
Exp  = _elementwise("exp",  lambda gy, x, y: gy * y)                 # d exp = exp: reuse y
Log  = _elementwise("log",  lambda gy, x, y: gy / x)
Sin  = _elementwise("sin",  lambda gy, x, y: SinGrad()(x, gy))       # gy * cos(x), one node
Cos  = _elementwise("cos",  lambda gy, x, y: gy * -sin(x))
Tanh = _elementwise("tanh", lambda gy, x, y: TanhGrad()(y, gy))      # gy * (1 - y**2)
Sqrt = _elementwise("sqrt", lambda gy, x, y: gy / (2 * y))           # 1 / (2 sqrt(x))
Abs  = _elementwise("abs",  lambda gy, x, y: gy * _constant(x.xp.sign(x.data)))  # 0 at the kink
# fmt: on


def exp(x):
    """e ** x."""
    return Exp()(x)


def log(x):
    """Natural logarithm."""
    return Log()(x)


def sin(x):
    """Sine, elementwise (x in radians)."""
    return Sin()(x)


def cos(x):
    """Cosine, elementwise (x in radians)."""
    return Cos()(x)


def tanh(x):
    """Hyperbolic tangent, elementwise."""
    return Tanh()(x)


def sqrt(x):
    """Square root, elementwise."""
    return Sqrt()(x)


def abs(x):
    """|x|, elementwise; the gradient at 0 is 0."""
    return Abs()(x)


# (backend, integer or bool dtype) -> the floating dtype that backend's exp gives for it
_EXP_DTYPES = {}


def as_floating(backend, x):
    """The array x as it is if it is floating-point; integer or bool x cast to the floating dtype
    the backend's exp gives it (NumPy, CuPy: uint8 -> float16, int16 -> float32, int64 ->
    float64). For ops whose stable forms subtract or negate (x - max(x), -|x|): in x's own
    integer dtype those wrap around (uint8: 0 - 200 is 56). A backend whose exp refuses integers
    (array-api-strict) raises its TypeError here, as F.exp does."""
    if dtype_kind(backend, x.dtype) != "integral":
        return x
    dtype = _EXP_DTYPES.get((backend, x.dtype))
    if dtype is None:
        # asked of the array library itself: a recording step's backend would record the probe
        xp = (backend.inner or backend).xp
        dtype = _EXP_DTYPES[backend, x.dtype] = xp.exp(xp.empty((0,), dtype=x.dtype)).dtype
    return backend.xp.astype(x, dtype)


class SinGrad(Function):
    """gy * cos(x): sin's backward as one node instead of two (cos, then a product)."""

    def forward(self, x, gy):
        return gy * self.backend.xp.cos(x)  # self.xp, without the property's frame

    def backward(self, ggx):
        x, gy = self.inputs
        n_x, n_gy = self.needs_input_grad
        return ggx * gy * -sin(x) if n_x else None, ggx * cos(x) if n_gy else None


def sin_grad(x, gy):
    """gy * cos(x): the gradient of sin."""
    return SinGrad()(x, gy)


class TanhGrad(Function):
    """gy * (1 - y**2): tanh's backward as one node, so each order of create_graph records one
    Function here instead of three (the composite stays as the test oracle)."""

    def forward(self, y, gy):
        return gy * (1 - y * y)

    def backward(self, ggx):
        y, gy = self.inputs
        n_y, n_gy = self.needs_input_grad
        return ggx * gy * (-2 * y) if n_y else None, ggx * (1 - y * y) if n_gy else None


def tanh_grad(y, gy):
    """gy * (1 - y**2): the gradient of tanh through its output y."""
    return TanhGrad()(y, gy)


def _constant(array):
    """A mask or sign computed from data: a constant in the graph (no gradient flows into it)."""
    return Variable(array, requires_grad=False)


def _data(x):
    return x.data if isinstance(x, Variable) else x


# =============================================================================== maximum, minimum
class Maximum(Function):
    """y = xp.maximum(x0, x1), broadcasting; gy goes to the larger input, half to each at a
    tie, and all of it to both where either is NaN (as PyTorch)."""

    integers_take_float_dtype = True  # x32 beside an int64 array stays float32, as in + - * /

    def forward(self, x0, x1):
        return self.xp.maximum(x0, x1)

    def backward(self, gy):
        return _pick_backward(self, gy, operator.lt)  # an input loses where it is the smaller


class Minimum(Function):
    """y = xp.minimum(x0, x1), broadcasting; gy goes to the smaller input, half to each at a
    tie, and all of it to both where either is NaN (as PyTorch)."""

    integers_take_float_dtype = True  # x32 beside an int64 array stays float32, as in + - * /

    def forward(self, x0, x1):
        return self.xp.minimum(x0, x1)

    def backward(self, gy):
        return _pick_backward(self, gy, operator.gt)  # an input loses where it is the larger


def _pick_backward(f, gy, loses):
    """The gradient of maximum or minimum: to the input picked; a tie splits it half and half
    (both sides of the kink average to that, and the two halves sum to gy). Each input gets gy
    except where it loses (`loses(a, b)`: a mask), so at a NaN, which loses no comparison, both
    inputs get gy, as in PyTorch."""
    x0, x1 = f.inputs
    n0, n1 = f.needs_input_grad
    a0, a1 = _data(x0), _data(x1)
    xp = f.xp
    ties = xp.astype(a0 == a1, gy.dtype) * 0.5
    gx0 = gy * _constant(1 - xp.astype(loses(a0, a1), gy.dtype) - ties) if n0 else None
    gx1 = gy * _constant(1 - xp.astype(loses(a1, a0), gy.dtype) - ties) if n1 else None
    return gx0, gx1


def maximum(x0, x1):
    """The larger of x0 and x1, elementwise, broadcasting. The gradient goes to the larger; a tie
    gives each input half; where either is NaN (the result is NaN), both get it, as in PyTorch."""
    return Maximum()(x0, x1)


def minimum(x0, x1):
    """The smaller of x0 and x1, elementwise, broadcasting. The gradient goes to the smaller; a
    tie gives each input half; where either is NaN (the result is NaN), both get it."""
    return Minimum()(x0, x1)


# =============================================================================== clip, where
def _bound(name, bound):
    """A clip bound as a Python int or float (weak: it keeps float32 float32), or None."""
    number = python_number(bound)
    if number is None and bound is not None:
        raise TypeError(f"clip: {name} must be a number or None, got {type(bound).__name__}")
    return number


class Clip(Function):
    """y = x limited to [x_min, x_max] (None: that side open); gx = gy where
    x_min <= x <= x_max (inclusive), 0 outside."""

    def __init__(self, x_min, x_max):
        self.x_min = _bound("x_min", x_min)
        self.x_max = _bound("x_max", x_max)

    def forward(self, x):
        return self.xp.clip(x, self.x_min, self.x_max)

    def backward(self, gy):
        x, = self.inputs
        inside = None  # bounds are inclusive, as in DeZero
        if self.x_min is not None:
            inside = x.data >= self.x_min
        if self.x_max is not None:
            below = x.data <= self.x_max
            inside = below if inside is None else inside & below
        return gy if inside is None else gy * _constant(self.backend.as_factor(inside, gy.dtype))


def clip(x, x_min, x_max):
    """x limited to [x_min, x_max] (numbers; None leaves that side open). The gradient passes
    where x_min <= x <= x_max and is 0 outside."""
    return Clip(x_min, x_max)(x)


class Where(Function):
    """y = x0 where `condition` (a constant boolean array) is True, else x1, broadcasting;
    gy goes to the side picked, 0 to the other."""

    integers_take_float_dtype = True  # x32 beside an int64 array stays float32, as in + - * /

    def __init__(self, condition):
        self.condition = _data(condition)

    def forward(self, x0, x1):
        condition = self._condition_here(self.condition, x0, x1)
        if condition is self.condition:  # the caller's array, which backward must not see change
            condition = self.xp.asarray(condition, copy=True)
        self.condition = condition
        return self.xp.where(condition, x0, x1)

    def _condition_here(self, condition, x0, x1):
        """The condition as a boolean array of this backend, on the inputs' device."""
        device = self.backend.device_of(x0 if hasattr(x0, "shape") else x1)
        condition = backends.asarray_on(condition, device)  # a list, a bool, any array
        if not self.xp.isdtype(condition.dtype, "bool"):
            raise TypeError(f"the condition must be a boolean array, got {condition.dtype}; "
                            "compare the data first, e.g. where(x.data > 0, x, 0.0)")
        return condition

    def backward(self, gy):
        x0, x1 = self.inputs
        n0, n1 = self.needs_input_grad
        gx0 = where(self.condition, gy, 0.0) if n0 else None
        gx1 = where(self.condition, 0.0, gy) if n1 else None
        return gx0, gx1


def where(condition, x0, x1):
    """x0 where `condition` is True, else x1, broadcasting. `condition` is a boolean array (any
    backend; moved to the inputs' device) or Variable, a constant; x0 and x1 are Variables,
    arrays or Python scalars."""
    return Where(condition)(x0, x1)
