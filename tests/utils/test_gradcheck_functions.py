"""gradcheck and gradgradcheck on users' own Functions: right ones pass, wrong ones are named."""
import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from gradcore import Function, Variable
from gradcore.utils import GradcheckError, gradcheck, gradgradcheck


class ScaledProduct(Function):
    """(x * y * 3, x + y): two inputs, two outputs; `wrong` spoils one gradient entry."""

    def __init__(self, wrong=False):
        self.wrong = wrong

    def forward(self, x, y):
        return x * y * 3, x + y

    def backward(self, g0, g1):
        x, y = self.inputs
        gx = g0 * y * 3 + g1
        if self.wrong:  # the gradient of input 0 at its element 2 is off by 0.1
            mask = np.zeros(x.shape)
            mask[2] = 0.1
            gx = gx + g0 * gradcore.Variable(mask, requires_grad=False)
        return gx, g0 * x * 3 + g1


class RawCube(Function):
    """x**3 with a first derivative right but computed on raw arrays: not differentiable again."""

    def forward(self, x):
        return x * x * x

    def backward(self, gy):
        x, = self.inputs
        return gy * gradcore.Variable(3 * x.data * x.data, requires_grad=False)


def point():
    rng = np.random.default_rng(0)
    return rng.uniform(-1, 1, 4), rng.uniform(-1, 1, 4)


@pytest.mark.parametrize("mode", ["elements", "directional"])
def test_a_right_function_passes(mode):
    assert gradcheck(lambda x, y: ScaledProduct()(x, y), point(), mode=mode)
    assert gradcheck(lambda x: F.tanh(F.sin(x) * x), np.linspace(-1, 1, 5), mode=mode)


def test_a_wrong_entry_is_named():
    with pytest.raises(GradcheckError,
                       match=r"d output 0\[2\] / d input 0\[2\]: backward gives .*central"):
        gradcheck(lambda x, y: ScaledProduct(wrong=True)(x, y), point())
    with pytest.raises(GradcheckError, match="directional.*mode='elements'"):
        gradcheck(lambda x, y: ScaledProduct(wrong=True)(x, y), point(), mode="directional")
    assert not gradcheck(lambda x, y: ScaledProduct(wrong=True)(x, y), point(),
                         raise_exception=False)


def test_second_derivatives():
    x = np.linspace(-1, 1, 4)
    assert gradgradcheck(lambda v: F.tanh(v) * F.sin(v), x)
    assert gradcheck(lambda v: RawCube()(v), x)  # the first derivative is right...
    with pytest.raises(GradcheckError, match="d output 0"):
        gradgradcheck(lambda v: RawCube()(v), x)  # ...but backward is not differentiable


def test_inputs_are_left_alone_and_float32_is_checked_in_float64():
    x = gradcore.Variable(np.array([0.5, -0.25], dtype=np.float32))
    assert gradcheck(lambda v: v * v * v, x)
    assert x.grad is None and x.dtype == np.float32


@pytest.mark.parametrize("mode", ["elements", "directional"])
def test_integer_and_bool_inputs_are_constants_of_their_own_dtype(mode):
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    labels, ids, mask = np.array([2, 0]), np.array([1, 1, 0]), np.array([True, False, True])
    assert gradcheck(F.softmax_cross_entropy, (x, labels), mode=mode)
    assert gradcheck(lambda i, w: F.embed_id(i, w), (ids, x), mode=mode)
    assert gradcheck(lambda v, i: v[:, i], (x, ids), mode=mode)
    assert gradcheck(lambda m, v: F.where(m, v, 0.0), (mask, x[0]), mode=mode)
    assert gradgradcheck(lambda v, t: F.softmax_cross_entropy(v, t), (x, labels), mode=mode)
    with pytest.raises(GradcheckError):  # a wrong backward is still caught beside them
        gradcheck(lambda v, m: ScaledProduct(wrong=True)(v, v)[0] * m, (x[0], mask),
                  mode=mode)


def test_gradcheck_checks_its_arguments():
    with pytest.raises(ValueError, match="mode must be"):
        gradcheck(lambda v: v, np.ones(2), mode="fast")
    with pytest.raises(TypeError, match="must return Variables"):
        gradcheck(lambda v: v.data, np.ones(2))
    for check in (gradcheck, gradgradcheck):  # nothing to check is not a check that passed
        with pytest.raises(TypeError, match="got an empty tuple"):
            check(lambda v: (), np.ones(2))


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck])
def test_eps_must_be_a_positive_finite_step(check):
    # eps=0 divided by zero (a NaN, reported as backward's mismatch); a negative eps passed
    for eps in (0, 0.0, -1e-6, float("nan"), float("inf"), "1e-6"):
        with pytest.raises(ValueError, match=rf"^{check.__name__}: eps \(the finite-difference "
                                             r"step\) must be a positive finite number, got "
                                             r".*; the default is 1e-06$"):
            check(F.sin, np.array([0.3, 0.7]), eps=eps)
    assert check(F.sin, np.array([0.3, 0.7]), eps=1e-5)


@pytest.mark.parametrize("mode", ["elements", "directional"])
def test_an_eps_below_the_spacing_at_x_is_named_not_reported_as_nan(mode):
    # 1 + 1e-30 rounds to 1: the central difference was 0/0, "central differences nan"; in
    # the directional mode both sides were u . J 0 = 0 and the check passed having checked nothing
    with pytest.raises(ValueError, match=r"eps=1e-30 is below the spacing of float64 at input 0"
                                         r".*pass a larger eps"):
        gradcheck(F.sin, np.array([1.0, 2.0]), eps=1e-30, mode=mode)
    assert gradcheck(F.sin, np.array([1.0, 2.0]), eps=1e-6, mode=mode)


def _recording(seen):
    def fn(v):
        seen.append(v.dtype)
        return F.sin(v)
    return fn


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck])
def test_dtype_is_a_name_a_numpy_type_or_a_dtype(check):
    # dtype=numpy.float64 said "no default eps, rtol and atol for dtype <class ...>", and with
    # them given, getattr(numpy, numpy.float64) raised "attribute name must be string"
    x = np.array([0.3, 0.7])
    for dtype, name in ((np.float64, "float64"), (np.dtype("float64"), "float64"),
                        ("f8", "float64"), (float, "float64"), (np.float32, "float32"),
                        (np.dtype("float32"), "float32"), ("single", "float32")):
        seen = []
        assert check(_recording(seen), x, dtype=dtype)
        assert seen[0] == np.dtype(name)  # fn's first call: at the point, in `dtype`
    seen = []
    assert check(_recording(seen), x, dtype=np.float16, eps=1e-6, rtol=2e-3, atol=1e-3)
    assert seen[0] == np.float16
    for dtype in ("int32", np.int64, np.complex128, "float128", "bogus", None, 3):
        with pytest.raises(ValueError, match=rf"^{check.__name__}: dtype must be a real "
                                             r"floating dtype, one of 'float64', 'float32', "
                                             r"'float16' \(a name, a NumPy type such as "
                                             r"numpy.float64, or a dtype\), got "):
            check(F.sin, x, dtype=dtype, eps=1e-6, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("mode", ["elements", "directional"])
def test_the_differences_are_divided_by_the_step_taken(mode):
    # at 1e5, x +- 1e-6 in float64 are 1.999986e-6 apart: over 2e-6 a right backward of
    # 3 * x (3) was 2.99996 by central differences, and failed at rtol=1e-5
    x = np.array([1e5, 0.5, -2e5])
    assert gradcheck(lambda v: v * 3.0, x, mode=mode)
    assert gradcheck(lambda v: v * v, x, mode=mode)
    with pytest.raises(GradcheckError):
        gradcheck(lambda v: OffSquare(off=1e-4)(v), x, mode=mode)


# ================================================ outputs with no graph (as PyTorch's gradcheck)
def _sin_and_statistic(v):
    with gradcore.no_grad():
        statistic = v * 1.0  # a running statistic: not differentiated
    return F.sin(v), statistic


@pytest.mark.parametrize("mode", ["elements", "directional"])
def test_an_output_with_no_graph_is_left_out_as_pytorch_does(mode):
    # before: gradcore.grad's "this Variable has no graph" from inside gradcheck
    x = np.array([0.3, 0.7])
    assert gradcheck(_sin_and_statistic, x, mode=mode)
    assert gradgradcheck(_sin_and_statistic, x, mode=mode)
    with pytest.raises(GradcheckError, match="d output 0" if mode == "elements" else "u . J v"):
        # the outputs with a graph are still checked beside it
        gradcheck(lambda v: (ScaledProduct(wrong=True)(v, v)[0], _sin_and_statistic(v)[1]),
                  np.array([0.3, 0.7, 0.2]), mode=mode)


@pytest.mark.parametrize("mode", ["elements", "directional"])
def test_if_no_output_has_a_graph_each_must_be_constant(mode):
    x = np.array([0.3, 0.7])
    constant = gradcore.Variable(np.array([1.0, 2.0]), requires_grad=False)
    assert gradcheck(lambda v: (constant * 2.0, constant), x, mode=mode)
    # both entries are off by exactly 1: the first is named
    with pytest.raises(GradcheckError, match=r"d output 1\[0\] / d input 0\[0\]: backward "
                                             r"gives 0, central differences 1 "
                       if mode == "elements"
                       else "u . J v is 0 by backward"):
        gradcheck(lambda v: (constant * 2.0, _sin_and_statistic(v)[1]), x, mode=mode)


# ================================================ what a check must not let through
class SumOfSquares(Function):
    """sum(x * x); `forgets_gy` leaves gy out of backward (right only for a seed of 1)."""

    def __init__(self, forgets_gy=False):
        self.forgets_gy = forgets_gy

    def forward(self, x):
        return (x * x).sum()

    def backward(self, gy):
        x, = self.inputs
        return 2.0 * x if self.forgets_gy else gy * 2.0 * x


@pytest.mark.parametrize("mode", ["elements", "directional"])
def test_a_backward_that_ignores_its_incoming_gradient_is_caught(mode):
    # seeds of exactly 1 per output element would let it through: elements mode uses 1.75
    x = np.linspace(0.5, 1.5, 4)
    assert gradcheck(lambda v: SumOfSquares()(v), x, mode=mode)
    message = (r"d output 0\[0\] / d input 0\[3\]: backward gives 1.714285714, central "
               r"differences 3\b" if mode == "elements" else "u . J v")  # 2 x / 1.75 against 2 x
    with pytest.raises(GradcheckError, match=message):
        gradcheck(lambda v: SumOfSquares(forgets_gy=True)(v), x, mode=mode)


class LargeAndSmall(Function):
    """(1e4 x, x * x): a large output beside a small one whose backward is `off` (relative)."""

    def __init__(self, off=0.0):
        self.off = off

    def forward(self, x):
        return x * 1e4, x * x

    def backward(self, g0, g1):
        x, = self.inputs
        return g0 * 1e4 + g1 * (2.0 + 2.0 * self.off) * x


class LargeAndSmallInputs(Function):
    """1e4 a + b * b, the gradient of b `off` (relative)."""

    def __init__(self, off=0.0):
        self.off = off

    def forward(self, a, b):
        return a * 1e4 + b * b

    def backward(self, gy):
        a, b = self.inputs
        return gy * 1e4, gy * (2.0 + 2.0 * self.off) * b


def test_directional_mode_checks_each_output_and_input_on_its_own():
    # summed over every output and input, a 1% error in the small one would hide behind the
    # large one's value (torch.autograd.gradcheck's fast mode compares pairs too)
    x = np.linspace(0.5, 1.5, 4)
    assert gradcheck(lambda v: LargeAndSmall()(v), x, mode="directional")
    assert gradcheck(lambda a, b: LargeAndSmallInputs()(a, b), (x, x), mode="directional")
    for seed in range(3):
        with pytest.raises(GradcheckError, match="for output 1 and input 0, u . J v"):
            gradcheck(lambda v: LargeAndSmall(off=0.01)(v), x, mode="directional", seed=seed)
        with pytest.raises(GradcheckError, match="for output 0 and input 1, u . J v"):
            gradcheck(lambda a, b: LargeAndSmallInputs(off=0.01)(a, b), (x, x),
                      mode="directional", seed=seed)


@pytest.mark.parametrize("mode", ["elements", "directional"])
def test_one_variable_returned_twice_is_two_outputs_each_seeded_once(mode):
    # seeded by identity, (y, y) would count y's derivative twice: backward 4, differences 2
    def twice(x, off=None):
        y = x * 2.0 if off is None else OffSquare(off=off)(x)
        return y, y

    x = np.array([0.5, -1.0, 2.0])
    assert gradcheck(twice, x, mode=mode)
    assert gradcheck(lambda v: twice(v, off=0.0), x, mode=mode)
    assert gradgradcheck(lambda v: twice(v * v), x, mode=mode)
    assert not gradcheck(lambda v: twice(v, off=0.01), x, mode=mode, raise_exception=False)


class OffSquare(Function):
    """x * x, its backward `off` (relative): written with xp-neutral ops, for any backend."""

    def __init__(self, off=0.0):
        self.off = off

    def forward(self, x):
        return x * x

    def backward(self, gy):
        x, = self.inputs
        return gy * (2.0 + 2.0 * self.off) * x


@pytest.mark.parametrize("mode", ["elements", "directional"])
def test_float32_is_differenced_in_float64_and_checked_at_its_rounding(mode):
    # float32's own differences would miss a backward 1% wrong and fail a right sum of 50
    # values (the output's rounding over the step): backward runs in float32, the differences
    # at the same point in float64, compared at float32's rounding of backward
    x = np.linspace(-1, 1, 5).astype(np.float32)
    for fn in (F.sin, F.tanh, lambda v: v * v, lambda v: F.tanh(F.sin(v) * v)):
        assert gradcheck(fn, x, dtype="float32", mode=mode)
        assert gradgradcheck(fn, x, dtype="float32", mode=mode)
    big = np.random.default_rng(1).uniform(-3, 3, 50).astype(np.float32)
    assert gradcheck(lambda v: F.sum(v * v), big, dtype="float32", mode=mode)
    a, b = (np.random.default_rng(2).standard_normal(s).astype(np.float32) for s in
            ((4, 64), (64, 3)))
    assert gradcheck(F.matmul, (a, b), dtype="float32", mode=mode)
    seen = []  # the dtype fn is called in: first the point's, then the differences'

    def recorded(v):
        seen.append(v.dtype)
        return OffSquare()(v)
    assert gradcheck(recorded, x, dtype="float32", mode=mode)
    assert seen[0] == np.float32 and set(seen[1:]) == {np.dtype(np.float64)}
    point = np.random.default_rng(0).uniform(0.5, 2.0, 3).astype(np.float32)
    for off in (0.01, -0.001):  # 1% and 0.1% wrong: caught
        with pytest.raises(GradcheckError, match=r"rtol=0.0001, atol=1e-05"):
            gradcheck(lambda v: OffSquare(off=off)(v), point, dtype="float32", mode=mode)
        assert not gradgradcheck(lambda v: OffSquare(off=off)(v) * v, point, dtype="float32",
                                 mode=mode, raise_exception=False)
    with pytest.raises(GradcheckError):  # given tolerances are kept
        gradcheck(F.sin, x, dtype="float32", mode=mode, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="no default eps, rtol and atol for dtype 'float16'"):
        gradcheck(F.sin, x, dtype="float16", mode=mode)
    # any other dtype is differenced in float64 too: float16's backward, checked at its rounding
    assert gradcheck(F.sin, x, dtype="float16", mode=mode, eps=1e-6, rtol=2e-3, atol=1e-3)


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck])
def test_an_integer_point_is_refused_rather_than_checked_vacuously(check):
    for point in ([1, 2], np.array([1, 2, 3]), 3, (np.array([0, 1]), np.array([True, False]))):
        with pytest.raises(TypeError, match=r"no input is floating-point and requires grad "
                                            r"\(dtypes: .*int64.*differentiate at a "
                                            r"floating-point point \(1.0, not 1"):
            check(lambda v, *rest: v * v, point)


class ScaleBy(Function):
    """x * c, c a constant: no gradient for it (None in its place)."""

    def forward(self, x, c):
        return x * c

    def backward(self, gy):
        return gy * self.inputs[1], None


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck])
def test_a_floating_variable_that_requires_no_grad_is_a_constant(check):
    """As PyTorch's gradcheck skips a tensor that requires no grad: gradcheck compared c's
    missing gradient (0) against its central differences (1.2) and failed, where gradgradcheck
    passed."""
    x = np.linspace(0.1, 0.6, 6)
    c = Variable(np.array(2.0), requires_grad=False)
    assert check(ScaleBy.apply, (x, c))
    with pytest.raises(GradcheckError, match=r"d output 0\[\d\] / d input 1\[\]"):
        gradcheck(ScaleBy.apply, (x, Variable(np.array(2.0))))  # differentiated: it fails


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck])
def test_an_input_that_is_no_point_says_to_close_over_it(check):
    x = np.linspace(0.1, 0.6, 6)
    with pytest.raises(TypeError, match=r"input 1 is a tuple \(\(3, 2\)\).*through a closure"):
        check(lambda v, s: F.reshape(v, s), (x, (3, 2)))


class RawSin(Function):
    """sin with a first derivative right but computed on raw arrays: a constant to the engine."""

    def forward(self, x):
        return np.sin(x)

    def backward(self, gy):
        x, = self.inputs
        return gy.data * np.cos(x.data)


def test_gradgradcheck_reports_a_backward_on_raw_arrays_as_its_failure():
    # the engine's "not differentiable" RuntimeError is the check's failure, not an error
    x = np.linspace(-1, 1, 3)
    assert gradcheck(lambda v: RawSin()(v), x)
    for mode in ("elements", "directional"):
        assert gradgradcheck(lambda v: RawSin()(v), x, mode=mode,
                             raise_exception=False) is False
        with pytest.raises(GradcheckError, match="gradgradcheck FAILED: the first derivative "
                                                 "cannot be differentiated again: RawSin.backward "
                                                 "is not differentiable"):
            gradgradcheck(lambda v: RawSin()(v), x, mode=mode)


# ================================================ NaN and infinity, as PyTorch's gradcheck
class SquareOverX(Function):
    """x * x with the backward 2 gy x^2 / x: right except at x = 0, where it is NaN (0 / 0)."""

    def forward(self, x):
        return x * x

    def backward(self, gy):
        x, = self.inputs
        return gy * 2.0 * (x * x) / x


@pytest.mark.parametrize("mode", ["elements", "directional"])
def test_a_nan_from_backward_or_from_fn_fails_and_is_named(mode):
    # `NaN > atol` is False, so a test of `error > atol` would pass a NaN: it matches nothing,
    # as in torch.allclose (equal_nan=False), and is reported as the worst entry
    x = np.array([-1.0, 0.0, 0.5])
    assert gradcheck(lambda v: SquareOverX()(v), x[[0, 2]], mode=mode)  # right off x = 0
    message = (r"d output 0\[0\] / d input 0\[1\]: backward gives nan, central differences 0 "
               if mode == "elements" else r"u \. J v is nan by backward")
    with np.errstate(all="ignore"):  # NumPy's warnings of the 0 / 0
        with pytest.raises(GradcheckError, match=message):
            gradcheck(lambda v: SquareOverX()(v), x, mode=mode)
        with pytest.raises(GradcheckError):
            gradgradcheck(lambda v: SquareOverX()(v), x, mode=mode)
        # NaN on both sides (fn undefined around the point) checks nothing: a failure too
        with pytest.raises(GradcheckError, match="nan"):
            gradcheck(F.sqrt, np.array([4.0, -1.0]), mode=mode)


class Cliff(Function):
    """0 up to x = 0, infinite beyond: the central differences at 0 are infinite; backward
    gives `slope` there."""

    def __init__(self, slope):
        self.slope = slope

    def forward(self, x):
        return np.where(x > 0, np.inf, 0.0)

    def backward(self, gy):
        x, = self.inputs
        return gy * gradcore.Variable(np.where(x.data == 0, self.slope, 0.0), requires_grad=False)


@pytest.mark.parametrize("mode", ["elements", "directional"])
def test_an_infinity_matches_the_same_infinity_only(mode):
    # as numpy.isclose and torch.allclose: equal infinities are close, any other value is not
    x = np.array([0.0])
    with np.errstate(all="ignore"):  # NumPy's warnings of inf - inf
        assert gradcheck(lambda v: Cliff(np.inf)(v), x, mode=mode)
        for slope in (-np.inf, 1e300, np.nan):
            with pytest.raises(GradcheckError):
                gradcheck(lambda v: Cliff(slope)(v), x, mode=mode)
        with pytest.raises(GradcheckError, match="backward gives -inf, central differences inf"):
            gradcheck(lambda v: Cliff(-np.inf)(v), x)


# ================================================ inputs as a list
def test_a_list_of_inputs_is_several_inputs_as_a_tuple_is():
    # as in PyTorch; stacked into one (2, 4) input, fn(a, b) failed with Python's missing
    # argument, and fn(*xs) had another function checked
    x, y = point()
    seen = []

    def product(*xs):
        seen.append(len(xs))
        return ScaledProduct()(*xs)
    assert gradcheck(product, [x, y]) and seen[0] == 2
    with pytest.raises(GradcheckError, match=r"d output 0\[2\] / d input 0\[2\]"):
        gradcheck(lambda a, b: ScaledProduct(wrong=True)(a, b), [x, y])
    assert gradgradcheck(lambda a, b: ScaledProduct()(a, b), [x, y],
                         grad_outputs=[np.ones(4), np.full(4, 0.5)])


# ================================================ every backend
@pytest.mark.parametrize("mode", ["elements", "directional"])
def test_gradcheck_and_gradgradcheck_on_every_backend(xp, mode):
    data = np.linspace(-1, 1, 4)
    for dtype in ("float64", "float32"):
        x = xp.asarray(data, dtype=dtype)
        assert gradcheck(F.tanh, x, mode=mode, dtype=dtype)
        assert gradgradcheck(lambda v: F.tanh(v) * F.sin(v), x, mode=mode, dtype=dtype)
        assert gradcheck(lambda v, t: v[t], (x, xp.asarray([2, 0])), mode=mode, dtype=dtype)
        with pytest.raises(GradcheckError):
            gradcheck(lambda v: OffSquare(off=0.1)(v), x, mode=mode, dtype=dtype)
        np.testing.assert_array_equal(xp.numpy(x), data.astype(dtype))  # left as it was


def test_dtype_may_be_the_inputs_librarys_own(xp):
    x = xp.asarray(np.linspace(-1, 1, 3))
    seen = []
    assert gradcheck(_recording(seen), x, dtype=xp.float32)  # array_api_strict.float32 there
    assert gradgradcheck(F.sin, x, dtype=xp.float64)
    assert seen[0] == xp.float32
    with pytest.raises(ValueError, match="dtype must be a real floating dtype"):
        gradcheck(F.sin, x, dtype=xp.int32)
    if not hasattr(xp.namespace, "float16"):  # array-api-strict
        with pytest.raises(ValueError, match=r"^gradcheck: input 0's array library "
                                             r"\(array_api_strict\) has no float16; choose "
                                             r"another dtype$"):
            gradcheck(F.sin, x, dtype="float16", eps=1e-3, rtol=1e-2, atol=1e-2)
