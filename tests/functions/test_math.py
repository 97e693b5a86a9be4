"""gradcore.functions.math: arithmetic with broadcasting, pow, exp, log, trigonometry, tanh, sqrt,
abs, maximum, minimum, clip, where. One row per op; tests/harness.py checks each."""
import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from float16_backends import float16_backends
from harness import Case, check_case, ids

POS = (0.5, 2.0)
NEG = (-2.0, -0.5)
MASK = np.array([[True, False, True], [False, False, True]])

# fmt: off
CASES = [
    Case("add",                F.add,                                np.add, ((2, 3), (2, 3))),
    Case("add-broadcast",      F.add,                                np.add, ((2, 1), (1, 3))),
    Case("add-rank",           F.add,                                np.add, ((3,), (2, 3))),
    Case("sub",                F.sub,                                np.subtract, ((2, 3), (2, 1))),
    Case("mul",                F.mul,                                np.multiply, ((2, 3), (3,))),
    Case("div",                F.div,                                np.divide, ((2, 3), (2, 3)), POS),
    Case("div-broadcast",      F.div,                                np.divide, ((2, 3), (1, 3)), POS),
    Case("neg",                F.neg,                                np.negative, ((2, 3),)),
    Case("copy",               F.copy,                               np.copy, ((2, 3),)),
    Case("copy-0-d",           F.copy,                               np.copy, ((),)),
    Case("pow-3",              lambda x: F.pow(x, 3),                lambda x: x ** 3, ((2, 3),)),
    Case("pow-half",           lambda x: F.pow(x, 0.5),              np.sqrt, ((4,),), POS),
    Case("pow-neg",            lambda x: F.pow(x, -2),               lambda x: x ** -2.0, ((4,),), POS),
    Case("power_of",           lambda x: 2.5 ** x,                   lambda x: 2.5 ** x, ((2, 3),)),
    Case("power_of-half",      lambda x: F.power_of(0.5, x),         lambda x: 0.5 ** x, ((4,),)),
    Case("square",             F.square,                             np.square, ((2, 3),)),
    Case("exp",                F.exp,                                np.exp, ((2, 3),)),
    Case("log",                F.log,                                np.log, ((2, 3),), POS),
    Case("sin",                F.sin,                                np.sin, ((2, 3),)),
    Case("sin_grad",           F.sin_grad,                           lambda x, gy: gy * np.cos(x), ((2, 3), (2, 3))),
    Case("sin_grad-broadcast", F.sin_grad,                           lambda x, gy: gy * np.cos(x), ((3,), (2, 3))),
    Case("cos",                F.cos,                                np.cos, ((2, 3),)),
    Case("tanh",               F.tanh,                               np.tanh, ((2, 3),)),
    Case("tanh_grad",          F.tanh_grad,                          lambda y, gy: gy * (1 - y * y), ((2, 3), (2, 3))),
    Case("tanh_grad-broadcast", F.tanh_grad,                         lambda y, gy: gy * (1 - y * y), ((2, 3), (3,))),
    Case("0-d",                lambda x: F.tanh(x) * x,              lambda x: np.tanh(x) * x, ((),)),
    Case("sqrt",               F.sqrt,                               np.sqrt, ((2, 3),), POS),
    Case("sqrt-0-d",           F.sqrt,                               np.sqrt, ((),), POS),
    # abs, maximum, minimum, clip: random data, so no sample sits on a kink or a tie
    Case("abs",                F.abs,                                np.abs, ((2, 3),), POS),
    Case("abs-neg",            F.abs,                                np.abs, ((2, 3),), NEG),
    Case("abs-mixed",          lambda x: F.abs(x - 1.2),             lambda x: np.abs(x - 1.2), ((4, 5),), POS),
    Case("maximum",            F.maximum,                            np.maximum, ((2, 3), (2, 3))),
    Case("maximum-broadcast",  F.maximum,                            np.maximum, ((2, 1), (1, 3))),
    Case("maximum-scalar",     lambda x: F.maximum(x, 0.0),          lambda x: np.maximum(x, 0.0), ((3, 4),)),
    Case("maximum-0-d",        F.maximum,                            np.maximum, ((), (3,))),
    Case("minimum",            F.minimum,                            np.minimum, ((2, 3), (3,))),
    Case("minimum-scalar",     lambda x: F.minimum(0.5, x),          lambda x: np.minimum(0.5, x), ((3, 4),)),
    Case("clip",               lambda x: F.clip(x, -1.0, 1.0),       lambda x: np.clip(x, -1.0, 1.0), ((4, 5),)),
    Case("clip-open",          lambda x: F.clip(x, None, 0.5),       lambda x: np.minimum(x, 0.5), ((4, 5),)),
    Case("clip-int-bounds",    lambda x: F.clip(x, -1, 1),           lambda x: np.clip(x, -1, 1), ((4, 5),)),
    Case("where",              lambda a, b, c: F.where(c, a, b),     lambda a, b, c: np.where(c, a, b), ((2, 3), (2, 3)), args=(MASK,)),
    Case("where-broadcast",    lambda a, b, c: F.where(c, a, b),     lambda a, b, c: np.where(c, a, b), ((2, 1), (3,)), args=(MASK,)),
    Case("where-scalar",       lambda a, c: F.where(c, a, 0.0),      lambda a, c: np.where(c, a, 0.0), ((2, 3),), args=(MASK,)),
    Case("where-scalar-first", lambda a, c: F.where(c, 1.5, a),      lambda a, c: np.where(c, 1.5, a), ((3,),), args=(MASK,)),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_op(case, xp):
    check_case(case, xp)


# =============================================================================== special cases
def test_maximum_and_minimum_split_a_tie(xp):
    x0 = gradcore.Variable(xp.asarray([1.0, 2.0, 3.0]))
    x1 = gradcore.Variable(xp.asarray([1.0, 5.0, 0.0]))
    F.maximum(x0, x1).backward()
    np.testing.assert_array_equal(xp.numpy(x0.grad.data), [0.5, 0.0, 1.0])
    np.testing.assert_array_equal(xp.numpy(x1.grad.data), [0.5, 1.0, 0.0])
    x0.cleargrad(), x1.cleargrad()
    F.minimum(x0, x1).backward()
    np.testing.assert_array_equal(xp.numpy(x0.grad.data), [0.5, 1.0, 0.0])
    np.testing.assert_array_equal(xp.numpy(x1.grad.data), [0.5, 0.0, 1.0])


@pytest.mark.parametrize("name", ["exp", "log", "sin", "cos", "tanh", "sqrt", "abs"])
def test_table_ops_are_ordinary_classes(name):
    """The one-line ops are made by a factory: still named, picklable by name and reported in
    errors as any class-per-op Function."""
    import pickle
    cls = getattr(F, name.capitalize())
    assert (cls.__name__, cls.__qualname__, cls.__module__) == (
        name.capitalize(), name.capitalize(), "gradcore.functions.math")
    assert pickle.loads(pickle.dumps(cls)) is cls
    op = cls()
    op(gradcore.Variable(np.ones(2)))
    with pytest.raises(TypeError, match=rf"^{name}: unsupported input"):
        op("a")


def test_abs_and_clip_gradients_at_their_kinks(xp):
    x = gradcore.Variable(xp.asarray([-2.0, -1.0, 0.0, 1.0, 2.0]))
    F.abs(x).backward()
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [-1.0, -1.0, 0.0, 1.0, 1.0])
    x.cleargrad()
    F.clip(x, -1.0, 1.0).backward()  # inclusive bounds, as in DeZero
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [0.0, 1.0, 1.0, 1.0, 0.0])


def test_clip_keeps_float32_with_numpy_scalar_bounds(xp):
    x = gradcore.Variable(xp.asarray([-2.0, 0.25, 2.0], dtype="float32"))
    y = F.clip(x, np.float64(-1.0), np.float64(1.0))
    assert y.dtype == xp.float32
    np.testing.assert_array_equal(xp.numpy(y.data), [-1.0, 0.25, 1.0])
    with pytest.raises(TypeError, match="clip: x_max must be a number or None, got str"):
        F.clip(x, 0.0, "1")


def test_where_takes_a_condition_from_anywhere(xp):
    """A NumPy mask or a Variable works on every device; the gradient is split by the mask."""
    a = gradcore.Variable(xp.asarray([1.0, 2.0, 3.0]))
    b = gradcore.Variable(xp.asarray([10.0, 20.0, 30.0]))
    for condition in (np.array([True, False, True]), [True, False, True],
                      gradcore.Variable(xp.asarray(np.array([True, False, True])))):
        a.cleargrad(), b.cleargrad()
        y = F.where(condition, a, b)
        assert y.device == a.device
        np.testing.assert_array_equal(xp.numpy(y.data), [1.0, 20.0, 3.0])
        y.backward(grad=xp.asarray([1.0, 2.0, 3.0]))
        np.testing.assert_array_equal(xp.numpy(a.grad.data), [1.0, 0.0, 3.0])
        np.testing.assert_array_equal(xp.numpy(b.grad.data), [0.0, 2.0, 0.0])


def test_where_rejects_a_non_boolean_condition(xp):
    a = gradcore.Variable(xp.asarray([1.0, 2.0]))
    with pytest.raises(TypeError, match=r"where: the condition must be a boolean array, got .*64"):
        F.where(xp.asarray([1.0, 0.0]), a, 0.0)
    with pytest.raises(ValueError, match=r"where: .*\(inputs: \(2,\), \(3,\)\)"):
        F.where(np.array([True, False]), a, gradcore.Variable(xp.asarray([1.0, 2.0, 3.0])))
    assert a.grad is None and a.creator is None


def test_sqrt_second_derivative(xp):
    x = gradcore.Variable(xp.asarray([4.0]))
    (g,) = gradcore.grad(F.sqrt(x), [x], create_graph=True)
    (gg,) = gradcore.grad(g, [x])
    np.testing.assert_allclose(xp.numpy(g.data), [0.25])            # 1 / (2 sqrt 4)
    np.testing.assert_allclose(xp.numpy(gg.data), [-1.0 / 32.0])    # -1 / (4 x^1.5)


def test_pow_derivatives_at_zero_are_zero_not_nan_to_any_order(xp):
    # x**0 is 1 everywhere; the k-th derivative of x**(k-1) is 0: none is 0 * inf
    for c, order in ((0, 1), (1, 2), (2, 3), (3, 4)):
        x = gradcore.Variable(xp.asarray([0.0, 2.0]))
        g = F.sum(F.pow(x, c))
        for _ in range(order):
            (g,) = gradcore.grad(F.sum(g) if g.ndim else g, [x], create_graph=True)
        np.testing.assert_array_equal(xp.numpy(g.data), [0.0, 0.0])


def check_div_derivatives(xp, x0, x1, dtype):
    """d/dx1 of x0 / x1, and d2/dx1^2 and d2/dx0 dx1 (create_graph), at x0, x1 rounded to
    `dtype`: each against -x0 / x1^2, 2 x0 / x1^3, -1 / x1^2 worked out in float64, where that
    lies in the dtype's normal range (else the dtype cannot hold the true value either)."""
    x0 = gradcore.Variable(xp.asarray([x0], dtype=dtype))
    x1 = gradcore.Variable(xp.asarray([x1], dtype=dtype))
    with np.errstate(over="ignore"):  # where the true value overflows (2e39 in float32)
        (g1,) = gradcore.grad(x0 / x1, [x1], create_graph=True)
        g11, g10 = gradcore.grad(g1, [x1, x0])
    a, b = float(xp.numpy(x0.data)[0]), float(xp.numpy(x1.data)[0])
    info = np.finfo(dtype)
    # the first derivative to a few roundings; the second ones pass through -1 / x1^2, which
    # is subnormal where x1 * x1 overflows, so to the square root of eps
    # CuPy compiles its kernels with -ftz=true: a float32 subnormal is 0 there, so the second
    # ones, through a subnormal -1 / x1^2, lose that part of them (NumPy keeps it)
    flushed = xp.name == "cupy" and dtype == "float32" and 1 / b ** 2 < float(info.tiny)
    for g, want, rtol in ((g1, -a / b ** 2, 4 * info.eps), (g11, 2 * a / b ** 3, info.eps ** 0.5),
                          (g10, -1 / b ** 2, info.eps ** 0.5)):
        assert g.dtype == x1.dtype
        if g is not g1 and flushed:
            assert np.isfinite(xp.numpy(g.data)).all()
        elif float(info.tiny) <= abs(want) <= float(info.max):
            np.testing.assert_allclose(xp.numpy(g.data), [want], rtol=rtol)


@pytest.mark.parametrize("dtype, x0, x1", [
    ("float64", 3.0, 2.0),
    ("float32", 1e30, 1e20),    # x1 * x1 is inf: -x0 / (x1 * x1) would be -0
    ("float32", 1e-30, 1e-23),  # x1 * x1 is 0: -x0 / (x1 * x1) would be -inf
])
def test_div_gradient_for_the_denominator_does_not_square_it(xp, dtype, x0, x1):
    check_div_derivatives(xp, x0, x1, dtype)


@float16_backends
def test_div_gradient_for_the_denominator_in_float16(xp):
    check_div_derivatives(xp, 1000.0, 300.0, "float16")  # 300 * 300 is inf in float16
    x = gradcore.Variable(xp.asarray([300.0], dtype="float16"))
    (1.0 / x).backward()  # the reflected form, through the same op
    # -1.1e-5 is a float16 subnormal, held to within 6e-8
    np.testing.assert_allclose(xp.numpy(x.grad.data), [-1 / 300 ** 2], atol=6e-8)


def test_a_number_to_the_power_of_a_variable_keeps_float32_and_refuses_bad_bases(xp):
    x = gradcore.Variable(xp.asarray([1.0, 2.0], dtype="float32"))
    y = 2 ** x
    assert y.dtype == x.dtype
    F.sum(y).backward()
    np.testing.assert_allclose(xp.numpy(x.grad.data), [2 * np.log(2), 4 * np.log(2)], rtol=1e-6)
    with pytest.raises(ValueError, match="pow: c \\*\\* x needs a positive c"):
        (-2.0) ** x
    with pytest.raises(TypeError, match="needs a number c, got list"):
        F.power_of([2.0], x)


def test_float32_arithmetic_with_integer_constants_stays_float32(xp):
    # as PyTorch's integer tensors do; NumPy alone would give float64 (twice the memory)
    x = gradcore.Variable(xp.asarray([1.0, 2.0, 3.0], dtype="float32"))
    ints = xp.asarray([1, 2, 3])
    for y in (x * ints, F.add(ints, x), x - ints, F.div(ints, x)):
        assert y.dtype == x.dtype
    # the ops that combine values likewise (they gave float64: NumPy's promotion)
    mask = xp.asarray([True, False, True])
    for y in (F.maximum(x, ints), F.minimum(ints, x), F.where(mask, x, ints),
              F.concatenate([x, ints]), F.stack([ints, x])):
        assert y.dtype == x.dtype
    np.testing.assert_array_equal(xp.numpy(F.where(mask, ints, x).data), [1.0, 2.0, 3.0])
    F.sum(x * ints).backward()
    assert x.grad.dtype == x.dtype
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [1.0, 2.0, 3.0])
    if xp.name == "numpy":  # NumPy's own scalars and arrays on the left, and bool masks
        for y in (x * np.int64(3), np.array([1, 2, 3]) + x, x * np.array([True, False, True])):
            assert y.dtype == np.float32


def test_where_hint_for_a_non_boolean_condition_can_be_followed(xp):
    # a Variable has no comparisons: the hint compares its data
    x = gradcore.Variable(xp.asarray([-1.0, 2.0]))
    with pytest.raises(TypeError, match=r"e\.g\. where\(x\.data > 0, x, 0\.0\)"):
        F.where(xp.asarray([1, 0]), x, 0.0)
    y = F.where(x.data > 0, x, 0.0)  # the hint, as written
    np.testing.assert_array_equal(xp.numpy(y.data), [0.0, 2.0])


@pytest.mark.parametrize("op", [F.maximum, F.minimum])
def test_maximum_and_minimum_pass_the_gradient_of_a_nan_to_both_inputs(xp, op):
    # the result is NaN there; PyTorch gives gy to both inputs (torch.maximum and
    # torch.minimum: a.grad = b.grad = [1, 1, 0.5, 1] here), whatever the argument order
    nan = np.nan
    for first, second in (([nan, 1.0, 2.0, nan], [1.0, nan, 2.0, nan]),
                          ([1.0, nan, 2.0, nan], [nan, 1.0, 2.0, nan])):
        a = gradcore.Variable(xp.asarray(first))
        b = gradcore.Variable(xp.asarray(second))
        F.sum(op(a, b)).backward()
        for x in (a, b):
            np.testing.assert_array_equal(xp.numpy(x.grad.data), [1.0, 1.0, 0.5, 1.0])
    a = gradcore.Variable(xp.asarray([nan, 3.0, -3.0]))
    F.sum(op(a, 0.0)).backward()  # beside a number: NaN passes, otherwise the picked side
    np.testing.assert_array_equal(xp.numpy(a.grad.data),
                                  [1.0, 1.0, 0.0] if op is F.maximum else [1.0, 0.0, 1.0])


@pytest.mark.parametrize("op, expected", [
    ("<", [False, False, True]), ("<=", [False, True, True]),
    (">", [True, False, False]), (">=", [True, True, False])])
def test_comparisons_give_bool_variables_that_take_no_part_in_gradients(xp, op, expected):
    x = gradcore.Variable(xp.asarray(np.array([1.0, 0.0, -2.0], np.float32)))
    compare = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
               ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}[op]
    for y in (compare(x, 0.0), compare(x, gradcore.Variable(xp.asarray(np.zeros(3, np.float32))))):
        assert xp.numpy(y.data).tolist() == expected
        assert xp.numpy(y.data).dtype == np.bool_
        assert not y.requires_grad and y.creator is None
    reflected = {"<": lambda a, b: b > a, "<=": lambda a, b: b >= a,
                 ">": lambda a, b: b < a, ">=": lambda a, b: b <= a}[op]
    assert xp.numpy(reflected(x, 0.0).data).tolist() == expected  # 0.0 > x: x.__lt__(0.0)
    F.sum(F.where(x > 0.0, x * 2.0, x * 0.0)).backward()
    assert xp.numpy(x.grad.data).tolist() == [2.0, 0.0, 0.0]


def test_a_comparison_in_a_compiled_step_replays():
    def step(x0):
        x = gradcore.Variable(x0)
        y = F.sum(x * (x > 0.0))
        y.backward()
        return y, x.grad

    compiled = gradcore.compile(step)
    for i in range(4):
        x0 = np.array([1.0, -1.0, 2.0]) * (i - 1.5)
        got, grad = compiled(x0)
        assert float(got.data) == float(np.sum(x0 * (x0 > 0)))
        np.testing.assert_array_equal(grad.data, (x0 > 0).astype(float))
    assert compiled.stats()["replays"] == 3
