"""Gradient checks: a central-difference gradient, and backward compared against it."""
import itertools
import math

import numpy

import backends

from ..cuda import as_numpy
from ..variable import Variable, as_variable, has_graph, variables_returned
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
    the perturbed copy; `x` itself is never modified. Each difference is divided by the step
    between the two points as rounded in x's dtype. Returns an array shaped like x.
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
            # the points as rounded in x's dtype: the step taken is their difference, not
            # 2 * EPS (float32 at 1000 steps 2.44e-4, and 2e-4 would give 2500 for d x*x = 2000)
            plus, minus = data[index] + EPS, data[index] - EPS
            work[index] = plus
            # copied: f may return a view of `work` (identity, reshape), which changes next
            y_plus = _call(f, work, backend, args, kwargs)
            y_plus = xp.astype(y_plus, y_plus.dtype, copy=True)
            work[index] = minus
            y_minus = _call(f, work, backend, args, kwargs)
            grad[index] = xp.sum(y_plus - y_minus) / (plus - minus)
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


# ================================================================================ gradcheck
class GradcheckError(AssertionError):
    """gradcheck found backward's derivative and the finite differences apart."""


# gradcheck's step and tolerances per dtype, when not given. The central differences are
# always taken in float64 (for float32, on float64 copies of the point), so the step is
# float64's; the tolerances allow for the rounding of backward in the dtype checked only.
# float32's own differences cannot: the rounding of a sum of 50 values (~1e-5 of ~150) over a
# step of 2e-3 is ~5e-3 of the derivative, as large as a backward 1% wrong on small values
DEFAULTS_BY_DTYPE = {"float64": (1e-6, 1e-5, 1e-8),  # eps, rtol, atol
                     "float32": (1e-6, 1e-4, 1e-5)}
FLOATING = ("float64", "float32", "float16")  # the dtypes gradcheck accepts

# elements mode seeds backward with this times a unit vector, and divides it out again: a
# backward that forgets to multiply by gy is then caught, also for an output of one element
SEED_SCALE = 1.75


def gradcheck(fn, inputs, *, eps=None, rtol=None, atol=None, mode="elements", seed=0,
              dtype="float64", raise_exception=True):
    """Check backward against central differences for `fn` (Variables -> a Variable or a tuple
    of them) at `inputs` (an array or Variable, or a tuple or list of them, one input each as in
    PyTorch: one input written as a list of numbers goes in numpy.array; at least one floating).

    mode="elements" compares every entry of every Jacobian d output / d input: a backward pass
    per output element, two calls of fn per input element. mode="directional" compares, for
    random directions v_i of the inputs and random weightings u_k of the outputs, u_k . J_ki v_i
    for each output k and input i, each pair against its own tolerance: a backward pass per
    output and two calls of fn per input, whatever the sizes.

    fn and backward run in `dtype` on the inputs' devices: float64 (the default), float32 or
    float16, given as a name, a NumPy type or dtype, or a dtype of the inputs' array library.
    The central differences are taken in float64 whatever `dtype`: for float32, fn is called
    on float64 copies of the (float32) point, so fn should compute in its inputs' dtype (a
    result cast back to float32 makes them as coarse as float32's own). eps (positive), rtol
    and atol default by dtype: float64 1e-6, 1e-5, 1e-8; float32 1e-6, 1e-4, 1e-5, which allow
    for float32's rounding of backward only (float16: pass them). On a mismatch, raises
    GradcheckError (or, with raise_exception=False, returns False) naming the worst element:
    which input and index, which output and index, backward's value and the finite difference.
    As in PyTorch, a NaN matches nothing (a NaN from backward, or from fn near the point,
    fails) and an infinity only the same infinity.

    As in PyTorch, an output with no graph (computed under no_grad: a running statistic) is
    not checked; if no output has one, the finite differences must find every output constant.
    """
    if mode not in ("elements", "directional"):
        raise ValueError(f"gradcheck: mode must be 'elements' or 'directional', got {mode!r}")
    dtype = _dtype_name(dtype, inputs, "gradcheck")
    eps, rtol, atol = _tolerances(dtype, eps, rtol, atol)
    xs = _checked_inputs(inputs, dtype, "gradcheck")
    outputs = _call_outputs(fn, xs)
    checked = [k for k, y in enumerate(outputs) if has_graph(y)] or range(len(outputs))
    points = xs if dtype == "float64" else _in_float64(xs)  # where the differences are taken
    if mode == "directional":
        problem = _directional(fn, xs, points, outputs, checked, eps, rtol, atol, seed)
    else:
        problem = _elements(fn, xs, points, outputs, checked, eps, rtol, atol)
    return _verdict(problem, raise_exception)


def _dtype_name(dtype, inputs, where):
    """`dtype` as its name ("float64"): given as a name ("float64", "f8"), a NumPy type or dtype
    (numpy.float64, CuPy's too), or a dtype of the inputs' array library (array_api_strict's
    float64). Anything but a real floating dtype is a ValueError naming those accepted."""
    name = None
    if isinstance(dtype, (str, type, numpy.dtype)):
        try:
            name = numpy.dtype(dtype).name
        except TypeError:  # not a dtype NumPy knows
            pass
    else:  # another library's dtype object: the name under which the inputs' namespace has it
        for x in _as_tuple(inputs):
            backend = backends.backend_of(x.data if isinstance(x, Variable) else x)
            xp = None if backend is None else backend.xp
            own = {n: getattr(xp, n, None) for n in FLOATING}
            name = next((n for n, d in own.items()
                         if d is not None and type(d) is type(dtype) and d == dtype), None)
            if name is not None:
                break
    if name not in FLOATING:
        raise ValueError(f"{where}: dtype must be a real floating dtype, one of "
                         f"{', '.join(map(repr, FLOATING))} (a name, a NumPy type such as "
                         f"numpy.float64, or a dtype), got {dtype!r}")
    return name


def _tolerances(dtype, eps, rtol, atol, where="gradcheck"):
    """eps, rtol and atol, those not given taken from DEFAULTS_BY_DTYPE for `dtype` (a name);
    eps must be a positive finite step (0 divides by zero; a negative one swaps the points)."""
    if eps is not None:
        try:
            positive = math.isfinite(eps) and eps > 0
        except TypeError:  # not a number
            positive = False
        if not positive:
            raise ValueError(f"{where}: eps (the finite-difference step) must be a positive "
                             f"finite number, got {eps!r}; the default is "
                             f"{DEFAULTS_BY_DTYPE['float64'][0]}")
    given = (eps, rtol, atol)
    if None not in given:
        return given
    if dtype not in DEFAULTS_BY_DTYPE:
        raise ValueError(f"{where}: no default eps, rtol and atol for dtype {dtype!r}; pass "
                         "them (or use 'float64' or 'float32')")
    return tuple(d if g is None else g for g, d in zip(given, DEFAULTS_BY_DTYPE[dtype]))


def _verdict(problem, raise_exception):
    """True if there is no `problem` (a report); else GradcheckError, or False after printing
    it."""
    if problem is None:
        return True
    if raise_exception:
        raise GradcheckError(problem)
    print(problem)
    return False


def gradgradcheck(fn, inputs, grad_outputs=None, **options):
    """gradcheck of the first derivative: the function (inputs, cotangents) -> the gradients of
    sum(fn(inputs) * cotangents) with respect to the inputs, its backward recorded
    (create_graph). `grad_outputs`: the cotangents (random if None). Options as gradcheck's.
    A first derivative that cannot be differentiated again (a backward on raw arrays) fails
    the check."""
    # checked before anything runs; gradcheck, given the same options, finds them as here
    dtype = _dtype_name(options.get("dtype", "float64"), inputs, "gradgradcheck")
    _tolerances(dtype, options.get("eps"), options.get("rtol"), options.get("atol"),
                "gradgradcheck")
    xs = _checked_inputs(inputs, dtype, "gradgradcheck")
    outputs = _call_outputs(fn, xs)
    if grad_outputs is None:
        rng = numpy.random.default_rng(options.get("seed", 0))
        grad_outputs = tuple(_on(y, rng.uniform(-1, 1, tuple(y.shape))) for y in outputs)
    else:
        grad_outputs = _as_tuple(grad_outputs)
    count = len(xs)

    def first_derivative(*args):
        floating = [x for x in args[:count] if x.requires_grad]  # not labels, masks
        gs = _backward(_call_outputs(fn, args[:count]), floating, args[count:],
                       create_graph=True)
        return tuple(g if g is not None else x * 0.0 for x, g in zip(floating, gs))

    points = _checked_inputs((*xs, *grad_outputs), dtype, "gradgradcheck")
    gs = first_derivative(*points)
    try:  # the engine refuses a derivative it cannot take: that is this check's failure
        _backward(gs, points, [_on(g, numpy.ones(tuple(g.shape))) for g in gs])
    except RuntimeError as e:
        return _verdict(f"gradgradcheck FAILED: the first derivative cannot be differentiated "
                        f"again: {e}", options.get("raise_exception", True))
    return gradcheck(first_derivative, (*xs, *grad_outputs), **options)


def _checked_inputs(inputs, dtype, where):
    """The inputs as new leaf Variables (copies: the caller's stay as they are), the floating
    ones in `dtype`; integer and bool ones (labels, indices, masks), and a Variable given with
    requires_grad=False (a temperature, a float target), are constants: nothing is
    differentiated or perturbed along them, as PyTorch's gradcheck skips such a tensor."""
    xs = []
    for i, x in enumerate(_as_tuple(inputs)):
        if isinstance(x, (tuple, str, bytes, dict, type(None))):
            raise TypeError(
                f"{where}: input {i} is a {type(x).__name__} ({x!r}): the inputs are the point "
                "fn is differentiated at (arrays, Variables, numbers); pass other arguments "
                f"through a closure: {where}(lambda v: fn(v, {x!r}), x)")
        constant = isinstance(x, Variable) and not x.requires_grad
        x = as_variable(x)
        if x.data is None:
            raise ValueError(f"{where}: input {i} has no data")
        xp = x.xp
        floating = xp.isdtype(x.data.dtype, "real floating")
        target = getattr(xp, dtype, None) if floating else x.data.dtype
        if target is None:  # array-api-strict has no float16
            raise ValueError(f"{where}: input {i}'s array library ({x.backend.name}) has no "
                             f"{dtype}; choose another dtype")
        with x.backend.device_context(x.device):
            data = xp.astype(x.data, target, copy=True)
        xs.append(Variable(data, requires_grad=floating and not constant))
    if not any(x.requires_grad for x in xs):  # nothing would be compared: a vacuous pass
        dtypes = ", ".join(str(x.dtype) for x in xs)
        raise TypeError(f"{where}: no input is floating-point and requires grad (dtypes: "
                        f"{dtypes}), so there is nothing to differentiate; differentiate at a "
                        "floating-point point (1.0, not 1; or x.astype(float)) that requires "
                        "grad")
    return tuple(xs)


def _as_tuple(values):
    """A tuple or list as a tuple, anything else as a tuple of one (PyTorch's reading of
    gradcheck's inputs: a list, stacked into one array, would check another function)."""
    return tuple(values) if isinstance(values, (tuple, list)) else (values,)


def _in_float64(xs):
    """The inputs with the floating ones as float64 copies (the same point, exactly)."""
    widened = []
    for x in xs:
        if x.requires_grad:
            with x.backend.device_context(x.device):
                x = Variable(x.xp.astype(x.data, x.xp.float64))
        widened.append(x)
    return tuple(widened)


def _call_outputs(fn, xs):
    return variables_returned(fn(*xs), "gradcheck: fn must return Variables (a tuple of them for "
                                       "several outputs)")


def _backward(outputs, xs, cotangents, create_graph=False):
    """d(outputs . cotangents)/d(xs), one gradient (or None) per input, the outputs with no
    graph left out."""
    from ..engine import grad

    pairs = [(y, c) for y, c in zip(outputs, cotangents) if has_graph(y)]
    if not pairs:
        return [None] * len(xs)
    return grad([y for y, _ in pairs], list(xs), grad_outputs=[c for _, c in pairs],
                create_graph=create_graph, allow_unused=True)


def _on(like, array):
    """A NumPy array as an array shaped, typed and placed like the Variable `like`."""
    return like.backend.asarray(array, dtype=like.dtype, device=like.device)


def _values(fn, xs):
    """fn's outputs for the inputs `xs` (arrays), as host arrays."""
    return [as_numpy(y.data).astype(numpy.float64) for y in _call_outputs(
        fn, tuple(Variable(x) for x in xs))]


def _elements(fn, xs, points, outputs, checked, eps, rtol, atol):
    """Every Jacobian entry of the outputs numbered in `checked`, backward at `xs` against
    central differences at `points` (xs, in float64); the report, or None."""
    worst = None
    for k in checked:
        y = outputs[k]
        analytic = []  # one row of d y / d inputs per element of y
        host_y = as_numpy(y.data)
        for j in range(host_y.size):
            seed = numpy.zeros(host_y.size)
            seed[j] = SEED_SCALE
            # by position, not identity: fn returning (y, y) has two outputs, y seeded once
            cotangents = [_on(o, seed.reshape(host_y.shape)) if n == k else _on(o, numpy.zeros(
                tuple(o.shape))) for n, o in enumerate(outputs)]
            gs = _backward(outputs, xs, cotangents)
            analytic.append([numpy.zeros(tuple(x.shape)) if g is None
                             else as_numpy(g.data) / SEED_SCALE for x, g in zip(xs, gs)])
        for i, x in enumerate(xs):
            if not x.requires_grad:
                continue
            host_x = as_numpy(x.data)
            for index in itertools.product(*[range(n) for n in host_x.shape]):
                numeric = _difference(fn, points, i, index, eps)[k].reshape(-1)
                for j in range(host_y.size):
                    got = float(analytic[j][i][index])
                    error = _excess(got, numeric[j], rtol, atol)
                    if error is not None and (worst is None or error > worst[0]):
                        worst = (error, i, index, k, j, got, float(numeric[j]))
    if worst is None:
        return None
    _, i, index, k, j, got, numeric = worst
    return (f"gradcheck FAILED: d output {k}[{j}] / d input {i}{list(index)}: backward gives "
            f"{got:.10g}, central differences {numeric:.10g} (rtol={rtol}, atol={atol})")


def _excess(got, numeric, rtol, atol):
    """How far backward's `got` lies outside |got - numeric| <= atol + rtol |numeric| (> 0), or
    None inside it. Non-finite values as numpy.isclose and torch.allclose (PyTorch's gradcheck)
    take them: equal infinities agree; a NaN agrees with nothing, not even a NaN (fn undefined
    near the point checks nothing there), and ranks worst, as any infinite excess does."""
    if got == numeric:  # equal infinities, where the difference below is NaN
        return None
    error = abs(got - numeric) - rtol * abs(numeric)
    if error <= atol:
        return None
    return math.inf if math.isnan(error) else error


def _difference(fn, xs, i, index, eps):
    """(fn(x + eps e) - fn(x - eps e)) / step per output, e the unit vector at input i, index,
    and step the difference of the two points as rounded: 2 eps only where x is small (at
    x = 1e5 in float64 it is 1.999986e-6, and over 2 eps d 3x came out 2.99996, failing a
    right backward of 3 at rtol=1e-5)."""
    arrays = [as_numpy(x.data).copy() for x in xs]
    plus, minus = [a.copy() for a in arrays], [a.copy() for a in arrays]
    plus[i][index] += eps
    minus[i][index] -= eps
    step = float(plus[i][index] - minus[i][index])
    if step == 0:
        raise ValueError(
            f"gradcheck: eps={eps} is below the spacing of {arrays[i].dtype} at input {i}"
            f"{list(index)} = {float(arrays[i][index])}: x + eps and x - eps round to x, so no "
            "difference can be taken; pass a larger eps")
    on = [lambda a, x=x: _on(x, a) for x in xs]
    up = _values(fn, [f(a) for f, a in zip(on, plus)])
    down = _values(fn, [f(a) for f, a in zip(on, minus)])
    return [(u - d) / step for u, d in zip(up, down)]


def _directional(fn, xs, points, outputs, checked, eps, rtol, atol, seed):
    """u_k . J_ki v_i for each output k numbered in `checked` and each floating input i, u and v
    random, backward at `xs` against central differences at `points` (xs, in float64), each
    pair on its own (summed, a small output's error would hide behind a large one's value);
    the report on the worst, or None."""
    rng = numpy.random.default_rng(seed)
    v = [rng.uniform(-1, 1, tuple(x.shape)) if x.requires_grad else numpy.zeros(tuple(x.shape))
         for x in xs]
    u = [rng.uniform(-1, 1, tuple(y.shape)) for y in outputs]
    inputs = [i for i, x in enumerate(xs) if x.requires_grad]
    host = [as_numpy(x.data) for x in points]
    along = {}  # input i -> J_ki v_i for every output k, by central differences
    for i in inputs:
        d = [w if j == i else numpy.zeros_like(w) for j, w in enumerate(v)]
        up = [h + eps * e for h, e in zip(host, d)]
        down = [h - eps * e for h, e in zip(host, d)]
        if up[i].size and not numpy.any(up[i] != down[i]):  # else u . J 0 = 0 checks nothing
            raise ValueError(
                f"gradcheck: eps={eps} is below the spacing of {up[i].dtype} at input {i}: every "
                "x + eps v and x - eps v round to x, so no difference can be taken; pass a "
                "larger eps")
        values_up = _values(fn, [_on(x, a) for x, a in zip(points, up)])
        values_down = _values(fn, [_on(x, a) for x, a in zip(points, down)])
        along[i] = [(a - b) / (2 * eps) for a, b in zip(values_up, values_down)]
        # the direction as taken: the points are rounded, so their difference is 2 eps v only
        # where x is small; backward is compared along the same direction
        v[i] = (up[i] - down[i]) / (2 * eps)
    worst = None
    for k in checked:
        cotangents = [_on(y, u[k] if n == k else numpy.zeros(tuple(y.shape)))
                      for n, y in enumerate(outputs)]
        gs = _backward(outputs, xs, cotangents)
        for i in inputs:
            got = 0.0 if gs[i] is None else float(numpy.sum(as_numpy(gs[i].data) * v[i]))
            numeric = float(numpy.sum(along[i][k] * u[k]))
            error = _excess(got, numeric, rtol, atol)
            if error is not None and (worst is None or error > worst[0]):
                worst = (error, k, i, got, numeric)
    if worst is None:
        return None
    _, k, i, got, numeric = worst
    return (f"gradcheck FAILED (directional, seed {seed}): for output {k} and input {i}, u . J v "
            f"is {got:.10g} by backward and {numeric:.10g} by central differences (rtol={rtol}, "
            f"atol={atol}); run with mode='elements' to find the entry")
