"""Elementwise math: arithmetic with broadcasting, pow, exp, log, trigonometry, tanh."""
from ..function import Function
from ..variable import Variable
from .shape import sum_to


# =============================================================================== arithmetic
class Add(Function):
    def forward(self, x0, x1):
        return x0 + x1

    def backward(self, gy):
        x0, x1 = self.inputs
        n0, n1 = self.needs_input_grad
        return sum_to(gy, x0.shape) if n0 else None, sum_to(gy, x1.shape) if n1 else None


def add(x0, x1):
    """x0 + x1, broadcasting."""
    return Add()(x0, x1)


class Sub(Function):
    def forward(self, x0, x1):
        return x0 - x1

    def backward(self, gy):
        x0, x1 = self.inputs
        n0, n1 = self.needs_input_grad
        return sum_to(gy, x0.shape) if n0 else None, sum_to(-gy, x1.shape) if n1 else None


def sub(x0, x1):
    """x0 - x1, broadcasting."""
    return Sub()(x0, x1)


class Mul(Function):
    def forward(self, x0, x1):
        return x0 * x1

    def backward(self, gy):
        x0, x1 = self.inputs
        n0, n1 = self.needs_input_grad
        gx0 = sum_to(gy * x1, x0.shape) if n0 else None
        gx1 = sum_to(gy * x0, x1.shape) if n1 else None
        return gx0, gx1


def mul(x0, x1):
    """x0 * x1, broadcasting."""
    return Mul()(x0, x1)


class Div(Function):
    def forward(self, x0, x1):
        return x0 / x1

    def backward(self, gy):
        x0, x1 = self.inputs
        n0, n1 = self.needs_input_grad
        gx0 = sum_to(gy / x1, x0.shape) if n0 else None
        gx1 = sum_to(-gy * x0 / (x1 * x1), x1.shape) if n1 else None
        return gx0, gx1


def div(x0, x1):
    """x0 / x1, broadcasting."""
    return Div()(x0, x1)


class Neg(Function):
    def forward(self, x):
        return -x

    def backward(self, gy):
        return -gy


def neg(x):
    """-x."""
    return Neg()(x)


class Pow(Function):
    def __init__(self, c):
        if isinstance(c, Variable) or not isinstance(c, (int, float)):
            raise TypeError(f"pow: the exponent must be a Python number, got {type(c).__name__}; "
                            "for a Variable exponent write exp(c * log(x))")
        self.c = c

    def forward(self, x):
        return x ** self.c

    def backward(self, gy):
        x, = self.inputs
        c = self.c
        return gy * (c * x ** (c - 1))


def pow(x, c):
    """x ** c for a constant exponent c."""
    return Pow(c)(x)


class Square(Function):
    def forward(self, x):
        return x * x

    def backward(self, gy):
        x, = self.inputs
        return gy * (2 * x)


def square(x):
    """x ** 2."""
    return Square()(x)


# =============================================================================== exp and log
class Exp(Function):
    def forward(self, x):
        return self.xp.exp(x)

    def backward(self, gy):
        y = self.outputs[0]()  # d exp = exp: reuse the output
        return gy * y


def exp(x):
    """e ** x."""
    return Exp()(x)


class Log(Function):
    def forward(self, x):
        return self.xp.log(x)

    def backward(self, gy):
        x, = self.inputs
        return gy / x


def log(x):
    """Natural logarithm."""
    return Log()(x)


# =============================================================================== trigonometry
class Sin(Function):
    def forward(self, x):
        return self.xp.sin(x)

    def backward(self, gy):
        x, = self.inputs
        return gy * cos(x)


def sin(x):
    return Sin()(x)


class Cos(Function):
    def forward(self, x):
        return self.xp.cos(x)

    def backward(self, gy):
        x, = self.inputs
        return gy * -sin(x)


def cos(x):
    return Cos()(x)


class Tanh(Function):
    def forward(self, x):
        return self.xp.tanh(x)

    def backward(self, gy):
        y = self.outputs[0]()  # d tanh = 1 - y**2: reuse the output
        return gy * (1 - y * y)


def tanh(x):
    return Tanh()(x)
