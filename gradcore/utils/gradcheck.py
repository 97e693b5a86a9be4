"""Gradient checks: a central-difference gradient, and backward compared against it."""
import itertools

import numpy

import backends

from ..cuda import as_numpy
from ..variable import Variable, as_variable
from .arrays import array_allclose

EPS = 1e-4  # DeZero's step; in float64 the truncation error is O(EPS**2)


def _call(f, x, backend, args, kwargs):
    """f(x, *args, **kwargs) on a fresh Variable holding the array `x`, as a raw array."""
    y = f(Variable(x), *args, **kwargs)
    y = y.data if isinstance(y, Variable) else y
    if backends.backend_of(y) is not backend:
        raise TypeError(f"numerical_grad: f must return a Variable or an array of the input's "
                        f"backend ({backend.name}), got {type(y).__qualname__}")
    return y


def numerical_grad(f, x, *args, **kwargs):
    """d sum(f(x, *args, **kwargs)) / dx by central differences, one element of x at a time.

    `x` is a Variable or an array of any backend; the computation stays on its device and in its
    dtype (use float64 for a useful answer: gradient_check does). f receives a Variable wrapping
    the perturbed copy; `x` itself is never modified. Returns an array shaped like x.
    """
    data = x.data if isinstance(x, Variable) else x
    backend = backends.backend_of(data)
    if backend is None:
        raise TypeError(f"numerical_grad: x must be a Variable or an array, got "
                        f"{type(x).__qualname__}")
    xp = backend.xp
    if not xp.isdtype(data.dtype, "real floating"):
        raise TypeError(f"numerical_grad: x has dtype {data.dtype}; a gradient needs a real "
                        "floating dtype (cast x to float64 first)")
    device = backend.device_of(data)
    with backend.device_context(device):
        work = xp.astype(data, data.dtype, copy=True)  # the perturbed copy f sees
        grad = backend.zeros(data.shape, data.dtype, device)
        for index in itertools.product(*[range(n) for n in data.shape]):
            work[index] = data[index] + EPS
            # copied: f may return a view of `work` (identity, reshape), which changes next
            y_plus = _call(f, work, backend, args, kwargs)
            y_plus = xp.astype(y_plus, y_plus.dtype, copy=True)
            work[index] = data[index] - EPS
            y_minus = _call(f, work, backend, args, kwargs)
            grad[index] = xp.sum(y_plus - y_minus) / (2 * EPS)
            work[index] = data[index]
    return grad


def gradient_check(f, x, *args, rtol=1e-4, atol=1e-5, **kwargs):
    """True if backward's gradient of sum(f(x, *args, **kwargs)) matches numerical_grad.

    Both are computed in float64 on x's device, on a copy: the caller's `x` keeps its data and
    its grad. On a mismatch, prints both gradients and the worst element, as DeZero does, and
    returns False.
    """
    x = as_variable(x)
    if x.data is None:
        raise ValueError("gradient_check: x has no data")
    xp = x.xp
    with x.backend.device_context(x.device):
        x64 = Variable(xp.astype(x.data, xp.float64, copy=True))
    expected = numerical_grad(f, x64, *args, **kwargs)
    y = f(x64, *args, **kwargs)
    if not isinstance(y, Variable):
        raise TypeError(f"gradient_check: f must return a Variable (the output of gradcore ops), "
                        f"got {type(y).__qualname__}")
    y.backward()
    numeric = as_numpy(expected)
    analytic = (numpy.zeros_like(numeric) if x64.grad is None  # f does not depend on x
                else as_numpy(x64.grad.data))
    if array_allclose(analytic, numeric, rtol=rtol, atol=atol):
        return True
    _report(numeric, analytic, rtol, atol)
    return False


def _report(numeric, analytic, rtol, atol):
    error = numpy.abs(analytic - numeric) - rtol * numpy.abs(numeric)
    worst = numpy.unravel_index(numpy.argmax(error), error.shape) if error.size else ()
    print()
    print("========== gradient_check FAILED ==========")
    print(f"shape {numeric.shape}, rtol={rtol}, atol={atol}")
    print(f"numerical grad: {_head(numeric)}")
    print(f"backward grad:  {_head(analytic)}")
    print(f"worst element {tuple(int(i) for i in worst)}: numerical {float(numeric[worst]):.6g}, "
          f"backward {float(analytic[worst]):.6g}")


def _head(a, count=10):
    """The first `count` values of `a`, flattened."""
    values = numpy.array2string(a.reshape(-1)[:count], precision=6, separator=", ")
    return values + (" ..." if a.size > count else "")
