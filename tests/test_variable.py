"""Variable: construction, properties, operators, indexing, shape methods, dtypes and devices."""
import dataclasses
import gc
import weakref

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
import gradcore.variable as variable_module
from conftest import DEVICE1, DEVICE2, STRICT, forked_child_takes
from gradcore import Parameter, Variable, as_array, as_variable


def var(xp, values, dtype="float64"):
    return Variable(xp.asarray(values, dtype=dtype))


# =============================================================================== construction
def test_wraps_an_array_without_copying(xp):
    a = xp.asarray([1.0, 2.0])
    x = Variable(a, name="x")
    assert x.data is a
    assert x.name == "x" and x.grad is None and x.creator is None and x.generation == 0
    assert x.requires_grad is True and x.is_leaf
    assert x.backend is xp.backend and x.xp is xp.namespace
    assert Variable(a, requires_grad=False).requires_grad is False


def test_every_way_of_making_a_variable_sets_its_slots(xp):
    """Variable(), an op's result (one output or several, recorded or not) and a gradient sum
    the walk makes all start with the same slots set."""
    x = var(xp, [1.0, 2.0])
    made = [x, x * 2.0, F.sum(x), *F.split(x, 2), Variable(xp.asarray(1.0), requires_grad=False)]
    with gradcore.no_grad():
        made.append(x * 2.0)
    y = x * x  # x reaches y twice: the walk sums its two gradients
    y.backward()
    made.append(x.grad)
    for v in made:
        for slot in ("_data", "_backend", "name", "_grad", "creator", "generation",
                     "_requires_grad", "_hooks"):
            getattr(v, slot)  # AttributeError if a maker left it unset
        assert v._backend is x._backend
        assert v._requires_grad == (v.creator is not None or v is x)
    assert made[1].generation == 1 and made[1].creator is not None
    assert made[-2].creator is None and made[-2].generation == 0  # no_grad


@pytest.mark.parametrize("data, dtype, shape", [
    (2.5, np.float64, ()), (3, np.int64, ()), (True, np.bool_, ()),
    ([1.0, 2.0], np.float64, (2,)), ((1, 2, 3), np.int64, (3,)),
    ([[1.0], [2.0]], np.float64, (2, 1)),
    (np.float32(1.5), np.float32, ()),  # a NumPy scalar becomes a 0-d array
])
def test_python_values_become_numpy_arrays(data, dtype, shape):
    x = Variable(data)
    assert type(x.data) is np.ndarray
    assert x.dtype == dtype and x.shape == shape
    np.testing.assert_array_equal(x.data, np.asarray(data))


@pytest.mark.parametrize("data", [{"a": 1}, "text", {1.0, 2.0}, object(), b"bytes"])
def test_unsupported_data_is_a_type_error_naming_the_type(data):
    with pytest.raises(TypeError, match=type(data).__qualname__) as info:
        Variable(data)
    assert "registered backend" in str(info.value)  # and says what is accepted


def test_a_variable_is_not_valid_data():
    with pytest.raises(TypeError, match="gradcore.variable.Variable"):
        Variable(Variable(1.0))


def test_setting_bad_data_changes_nothing():
    x = Variable(np.arange(3.0))
    old = x.data
    with pytest.raises(TypeError, match="dict"):
        x.data = {}
    assert x.data is old and x.backend.name == "numpy" and x.shape == (3,)


def test_as_variable_and_as_array(xp):
    x = var(xp, [1.0])
    assert as_variable(x) is x
    wrapped = as_variable(xp.asarray([1.0]))
    assert isinstance(wrapped, Variable) and wrapped.backend is xp.backend
    a = xp.asarray([1.0, 2.0])
    assert as_array(a) is a
    s = as_array(np.float64(2.0))
    assert type(s) is np.ndarray and s.shape == () and s == 2.0
    assert isinstance(Parameter(a), Variable)


# =============================================================================== properties
def test_properties(xp):
    x = var(xp, np.arange(6.0).reshape(2, 3), "float32")
    assert x.shape == (2, 3) and x.ndim == 2 and x.size == 6
    assert x.dtype == xp.float32
    assert x.device == xp.device
    t = x.T
    assert isinstance(t, Variable) and t.shape == (3, 2)
    np.testing.assert_array_equal(t.numpy(), np.arange(6.0).reshape(2, 3).T)
    n = x.numpy()
    assert type(n) is np.ndarray and n.dtype == np.float32
    np.testing.assert_array_equal(n, np.arange(6.0).reshape(2, 3))


def test_a_0d_result_reads_back_as_an_array_that_stays_put(xp):
    x = var(xp, 2.0)
    y = x * 3.0 + 1.0  # NumPy computes this on scalars
    d = y.data
    assert type(d) is type(x.data) and d.shape == () and float(d) == 7.0
    assert y.data is d  # the same array every time: writes through it stay
    d[...] = 5.0
    assert y.item() == 5.0
    y.backward()
    assert type(x.grad.data) is type(x.data) and x.grad.item() == 3.0


def test_a_0d_float32_result_stays_float32(xp):
    x = var(xp, 2.0, dtype="float32")
    y = F.exp(x * 0.5) - 1
    assert y.dtype == xp.float32 and y.data.dtype == xp.float32
    y.backward()
    assert x.grad.dtype == xp.float32


def test_len(xp):
    assert len(var(xp, np.zeros((4, 2)))) == 4
    assert len(var(xp, [1.0, 2.0, 3.0])) == 3


def test_len_of_a_0d_variable_is_an_error():
    with pytest.raises(TypeError):
        len(Variable(1.0))


def test_iterating_gives_the_rows_in_the_graph(xp):
    x = var(xp, [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    rows = list(x)
    assert len(rows) == 3 and all(r.creator is not None for r in rows)
    np.testing.assert_array_equal(xp.numpy(rows[2].data), [5.0, 6.0])
    a, b, c = x
    (a * 1.0 + b * 2.0 + c * 3.0).backward()
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])


def test_iterating_a_0d_variable_is_an_error():
    """As NumPy and PyTorch: not an empty iteration (sum(loss) would be 0, silently)."""
    loss = Variable(np.array(3.0))
    for consume in (iter, list, sum):
        with pytest.raises(TypeError, match="iteration over a 0-d Variable"):
            consume(loss)


def test_in_is_an_error_not_always_false():
    """== is identity, so `value in x` would be False for every value."""
    x = Variable(np.array([-1.0, 0.5]))
    with pytest.raises(TypeError, match="test the values instead"):
        0.5 in x
    assert x in [x] and Variable(np.array(0.5)) not in [x]  # lists of Variables: by identity


def test_item(xp):
    value = var(xp, 3.5).item()
    assert value == 3.5 and type(value) is float
    assert var(xp, [[7.0]]).item() == 7.0
    with pytest.raises(ValueError):
        var(xp, [1.0, 2.0]).item()


def test_repr():
    assert repr(Variable(np.array([1.0, 2.0]))) == "variable([1. 2.])"
    assert repr(Variable(np.array(3.0))) == "variable(3.0)"
    assert repr(Variable(None)) == "variable(None)"
    # continuation lines line up under the first row
    assert repr(Variable(np.array([[1.0, 2.0], [3.0, 4.0]]))) == (
        "variable([[1. 2.]\n"
        "          [3. 4.]])")


def test_repr_names_a_device_other_than_cpu():
    x = Variable(STRICT.asarray(np.array([1.0, 2.0]), device=DEVICE1))
    assert repr(x) == "variable([1. 2.], device=array_api_strict:device1)"


# =============================================================================== operators
SCALAR_OPS = [
    # (name, f(x), value at x, derivative at x)
    ("x + 2", lambda x: x + 2, lambda a: a + 2, lambda a: np.ones_like(a)),
    ("2 + x", lambda x: 2 + x, lambda a: 2 + a, lambda a: np.ones_like(a)),
    ("x - 2", lambda x: x - 2, lambda a: a - 2, lambda a: np.ones_like(a)),
    ("2 - x", lambda x: 2 - x, lambda a: 2 - a, lambda a: -np.ones_like(a)),
    ("x * 3", lambda x: x * 3, lambda a: a * 3, lambda a: 3 * np.ones_like(a)),
    ("3 * x", lambda x: 3 * x, lambda a: 3 * a, lambda a: 3 * np.ones_like(a)),
    ("x / 2", lambda x: x / 2, lambda a: a / 2, lambda a: 0.5 * np.ones_like(a)),
    ("2 / x", lambda x: 2 / x, lambda a: 2 / a, lambda a: -2 / a ** 2),
    ("-x", lambda x: -x, lambda a: -a, lambda a: -np.ones_like(a)),
    ("+x", lambda x: +x, lambda a: a, lambda a: np.ones_like(a)),  # x itself (it raised)
    ("x ** 3", lambda x: x ** 3, lambda a: a ** 3, lambda a: 3 * a ** 2),
    ("x ** 0.5", lambda x: x ** 0.5, np.sqrt, lambda a: 0.5 / np.sqrt(a)),
]


@pytest.mark.parametrize("name, f, value, derivative", SCALAR_OPS, ids=[o[0] for o in SCALAR_OPS])
def test_operators_with_python_scalars(xp, name, f, value, derivative):
    a = np.array([0.5, 1.0, 2.0])
    x = var(xp, a)
    y = f(x)
    assert isinstance(y, Variable) and y.device == xp.device
    np.testing.assert_allclose(y.numpy(), value(a), rtol=1e-14)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), derivative(a), rtol=1e-14)


def test_operators_between_variables(xp):
    a, b = np.array([1.0, 2.0]), np.array([3.0, 5.0])
    x, w = var(xp, a), var(xp, b)
    y = (x + w) * (x - w) / w
    y.backward()
    np.testing.assert_allclose(y.numpy(), (a + b) * (a - b) / b, rtol=1e-14)
    np.testing.assert_allclose(x.grad.numpy(), 2 * a / b, rtol=1e-14)  # (a^2 - b^2)/b
    np.testing.assert_allclose(w.grad.numpy(), -a ** 2 / b ** 2 - 1, rtol=1e-14)


def test_matmul_operator(xp):
    A = np.arange(6.0).reshape(2, 3)
    B = np.arange(12.0).reshape(3, 4) / 10
    x, W = var(xp, A), var(xp, B)
    y = x @ W
    np.testing.assert_allclose(y.numpy(), A @ B, rtol=1e-14)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.ones((2, 4)) @ B.T, rtol=1e-14)
    np.testing.assert_allclose(W.grad.numpy(), A.T @ np.ones((2, 4)), rtol=1e-14)


def test_pow_takes_a_number_or_a_0d_array_only():
    x = Variable(2.0)
    with pytest.raises(TypeError, match="exponent must be a (Python )?number"):
        x ** x
    with pytest.raises(TypeError, match=r"got ndarray of shape \(2,\); for an array"):
        x ** np.array([2.0, 3.0])
    assert x.creator is None and x.grad is None
    y = x ** np.array(3)  # a 0-d array, as DeZero takes it: x ** 3
    y.backward()
    assert y.data == 8.0 and x.grad.data == 12.0 and y.dtype == np.float64


def test_ndarray_op_variable_reaches_the_reflected_operator():
    """`__array_ufunc__ = None`: NumPy returns NotImplemented, so Python calls the Variable."""
    calls = []

    class Probe(Variable):
        __slots__ = ()

        def __radd__(self, other):
            calls.append(("radd", other))
            return "radd"

        def __rmul__(self, other):
            calls.append(("rmul", other))
            return "rmul"

        def __rmatmul__(self, other):
            calls.append(("rmatmul", other))
            return "rmatmul"

    p = Probe(np.ones(2))
    a = np.array([1.0, 2.0])
    assert a + p == "radd"
    assert a * p == "rmul"
    assert a @ p == "rmatmul"
    assert [c[0] for c in calls] == ["radd", "rmul", "rmatmul"]
    assert all(c[1] is a for c in calls)


def test_ndarray_op_variable_gives_a_variable():
    a = np.array([1.0, 2.0])
    x = Variable(np.array([3.0, 4.0]))
    y = a * x + a - a / x
    assert isinstance(y, Variable)
    np.testing.assert_allclose(y.data, a * x.data + a - a / x.data)
    y.backward()
    np.testing.assert_allclose(x.grad.data, a + a / x.data ** 2)
    z = np.ones((2, 2)) @ x
    assert isinstance(z, Variable)


def test_numpy_asarray_gives_the_values_of_host_data_that_needs_no_grad():
    y = Variable(np.array([[0.1, 0.9], [0.8, 0.2]]), requires_grad=False)
    a = np.asarray(y)
    assert a is y.data  # no copy: NumPy's own asarray contract
    np.testing.assert_array_equal(np.argmax(y, axis=1), [1, 0])
    np.testing.assert_array_equal(np.concatenate([y, y]).ravel(), [0.1, 0.9, 0.8, 0.2] * 2)
    copied = np.array(y)
    assert copied is not y.data and copied.dtype == np.float64
    np.testing.assert_array_equal(copied, y.data)
    assert np.asarray(y, dtype=np.float32).dtype == np.float32
    with pytest.raises(ValueError, match="copy"):
        np.array(y, dtype=np.float32, copy=False)  # a copy is needed: NumPy 2's rule
    assert np.asarray(F.sum(y)) == pytest.approx(2.0)  # a 0-d result held as a NumPy scalar
    with pytest.raises(TypeError, match=r"no data \(data is None\)"):
        np.asarray(Variable(None))


def test_numpy_asarray_of_data_off_the_host_says_to_use_numpy():
    x = Variable(np.array([1.0, 2.0]), requires_grad=False).to(DEVICE1)
    with pytest.raises(TypeError, match=r"not a NumPy array on the host; use x.numpy\(\) for a "
                       r"host copy, or x.to_cpu\(\)"):
        np.asarray(x)
    np.testing.assert_array_equal(x.numpy(), [1.0, 2.0])


def test_numpy_functions_on_a_variable_that_requires_grad_raise_rather_than_drop_the_graph():
    w = Variable(np.array([1.0, 2.0, 3.0]))  # a leaf requiring grad
    x = Variable(np.array([4.0, 5.0, 6.0]), requires_grad=False)
    loss1, loss2 = F.sum(w * 2.0), F.sum(w ** 2)  # results with a graph
    message = (r"requires grad .*drop its graph: use x\.data or x\.numpy\(\) for the values, or "
               r"gradcore ops \(F\.matmul, F\.sum, F\.stack")
    for call in (lambda: np.dot(w, x), lambda: np.dot(x, w), lambda: np.sum([loss1, loss2]),
                 lambda: np.asarray(loss1), lambda: np.array(w), lambda: np.inner(w, x)):
        with pytest.raises(TypeError, match=message):
            call()
    # the spellings the message names give the values, or keep the graph
    assert np.dot(w.data, x.numpy()) == 32.0
    total = F.sum(F.stack([loss1, loss2]))
    assert total.item() == 26.0
    total.backward()
    np.testing.assert_array_equal(w.grad.data, [4.0, 6.0, 8.0])  # 2 + 2 w
    with gradcore.no_grad():
        assert np.dot(w * 1.0, x) == 32.0  # computed with no graph: values, as PyTorch's


def test_numpy_operators_with_a_variable_still_give_variables():
    x = Variable(np.array([1.0, 2.0]))
    for y in (np.ones(2) + x, np.float64(2.0) * x, np.float32(1.0) - x, np.ones((2, 2)) @ x):
        assert isinstance(y, Variable)
    np.testing.assert_array_equal((np.float64(2.0) * x).data, [2.0, 4.0])


def test_numpy_asarray_in_a_compiled_step_reads_the_values_of_each_call():
    scale = Variable(np.array(2.0), requires_grad=False)

    def step(x):
        return Variable(x) * float(np.asarray(scale))

    compiled = gradcore.compile(step)
    with pytest.warns(RuntimeWarning, match="copied to the host"):  # that step runs eagerly
        for value in (2.0, 2.0, 4.0):
            scale.data[...] = value  # changed in place between calls
            np.testing.assert_array_equal(compiled(np.ones(2)).data, [value, value])


def test_variable_op_array_treats_the_array_as_a_constant(xp):
    c = xp.asarray([2.0, 3.0])
    x = var(xp, [1.0, 4.0])
    y = F.add(x * c, c)
    np.testing.assert_array_equal(y.numpy(), [4.0, 15.0])
    assert y.creator.next_functions[1] == (None, 0)  # the constant is a leaf of nothing
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 3.0])


def test_ops_on_raw_arrays_only_record_nothing(xp):
    y = F.add(xp.asarray([1.0, 2.0]), xp.asarray([3.0, 4.0]))
    assert isinstance(y, Variable) and y.creator is None and not y.requires_grad
    np.testing.assert_array_equal(y.numpy(), [4.0, 6.0])


# =============================================================================== indexing
@pytest.mark.parametrize("index, shape", [
    ((slice(1, None), slice(None, None, 2)), (2, 2)),
    ((1, slice(None)), (4,)),
    ((Ellipsis, 2), (3,)),
    ((slice(None, None, -1), slice(0, 1)), (3, 1)),
    ((None, 0, Ellipsis), (1, 4)),
])
def test_getitem_and_its_gradient(xp, index, shape):
    a = np.arange(12.0).reshape(3, 4)
    x = var(xp, a)
    y = x[index]
    assert y.shape == shape
    np.testing.assert_array_equal(y.numpy(), a[index])
    y.backward()
    expected = np.zeros_like(a)
    expected[index] = 1.0
    np.testing.assert_array_equal(x.grad.numpy(), expected)
    assert x.grad.device == xp.device


def test_overlapping_slices_add_up(xp):
    x = var(xp, [1.0, 2.0, 3.0, 4.0])
    y = x[0:3] * x[1:4]  # x0 x1 + x1 x2 + x2 x3
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0, 6.0, 3.0])


# =============================================================================== shape methods
def test_reshape_method_forms(xp):
    a = np.arange(6.0)
    x = var(xp, a)
    for y in (x.reshape(2, 3), x.reshape((2, 3)), x.reshape([2, 3])):
        assert y.shape == (2, 3)
        np.testing.assert_array_equal(y.numpy(), a.reshape(2, 3))
    assert x.reshape(6) is x  # same shape: no op recorded
    y = x.reshape(3, -1) * var(xp, [[1.0, 2.0]])
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 2.0] * 3)


def test_transpose_method_forms(xp):
    a = np.arange(24.0).reshape(2, 3, 4)
    x = var(xp, a)
    assert x.transpose().shape == (4, 3, 2) and x.transpose(None).shape == (4, 3, 2)
    for y in (x.transpose(1, 2, 0), x.transpose((1, 2, 0)), x.transpose([1, 2, 0])):
        np.testing.assert_array_equal(y.numpy(), a.transpose(1, 2, 0))
    y = x.transpose(2, 0, 1) * var(xp, np.arange(4.0).reshape(4, 1, 1))
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.broadcast_to(np.arange(4.0), (2, 3, 4)))


def test_sum_method(xp):
    a = np.arange(6.0).reshape(2, 3)
    x = var(xp, a)
    np.testing.assert_array_equal(x.sum().numpy(), a.sum())
    np.testing.assert_array_equal(x.sum(axis=0).numpy(), a.sum(axis=0))
    np.testing.assert_array_equal(x.sum(axis=[0, 1]).numpy(), a.sum())
    k = x.sum(axis=1, keepdims=True)
    assert k.shape == (2, 1)
    (k * var(xp, [[1.0], [2.0]])).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[1.0] * 3, [2.0] * 3])
    with pytest.raises(ValueError, match=r"sum: .*axis 2.*\(inputs: \(2, 3\)\)"):
        x.sum(axis=2)


# =============================================================================== detach, unchain
def test_detach(xp):
    x = var(xp, [1.0, 2.0])
    y = x * 2
    d = y.detach()
    assert d.data is y.data and d.creator is None and d.requires_grad is False
    z = d * 3
    assert z.creator is None  # nothing requires grad: nothing recorded
    with pytest.raises(RuntimeError, match="no graph"):
        z.backward()
    (y + d).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])  # no gradient through d


def test_unchain(xp):
    x = var(xp, 2.0)
    y = x * 3
    z = y * y
    assert not y.is_leaf
    y.unchain()
    assert y.is_leaf and y.creator is None
    z.backward()
    assert x.grad is None  # the link to x is cut
    assert y.grad.item() == 12.0  # y is a leaf now, so it keeps its gradient


@pytest.mark.parametrize("anomaly", [False, True])
@pytest.mark.parametrize("cut", ["unchain", "unchain_backward"])
def test_a_variable_that_retained_its_grad_gets_it_once_when_cut_to_a_leaf(xp, cut, anomaly):
    """Cut from its graph after retain_grad(), t was a leaf that still retained: backward stored
    its gradient, then added it again as a leaf's (t.grad [6, 6] for [3, 3]), and gradcore.grad
    set the .grad it leaves alone."""
    x = var(xp, [1.0, 2.0])
    t = x * 2.0
    t.retain_grad()
    u = t * 1.0
    if cut == "unchain":
        t.unchain()
    else:
        u.unchain_backward()  # every link behind u: t's to x
    assert t.is_leaf and not t.retains_grad
    with gradcore.detect_anomaly() if anomaly else gradcore.enable_grad():
        gt, = gradcore.grad(F.sum(u * 3.0), t)
        assert t.grad is None
        np.testing.assert_array_equal(gt.numpy(), [3.0, 3.0])
        F.sum(u * 3.0).backward()
        np.testing.assert_array_equal(t.grad.numpy(), [3.0, 3.0])
        F.sum(u * 3.0).backward()  # accumulates once per backward, as a leaf's
        np.testing.assert_array_equal(t.grad.numpy(), [6.0, 6.0])
    assert x.grad is None
    t.retain_grad()  # on a leaf: nothing
    assert not t.retains_grad


# =============================================================================== float32
FLOAT32_OPS = {
    "x * 2.0": lambda x, W: x * 2.0,
    "1 / x": lambda x, W: 1 / x,
    "x ** 2": lambda x, W: x ** 2,
    "x ** 0.5": lambda x, W: x ** 0.5,
    "x - 0.5": lambda x, W: 0.5 - x + x / 3.0,
    "sum": lambda x, W: x.sum(),
    "sum-axis": lambda x, W: F.sum(x, axis=0),
    "exp": lambda x, W: F.exp(x),
    "tanh": lambda x, W: F.tanh(x),
    "log-sin-cos": lambda x, W: F.log(x) + F.sin(x) * F.cos(x),
    "matmul": lambda x, W: x @ W,
    "broadcast": lambda x, W: x + W[0:2, 0:1],
}


@pytest.mark.parametrize("name", list(FLOAT32_OPS))
def test_float32_stays_float32(xp, name):
    x = var(xp, [[0.5, 1.0, 2.0], [1.5, 2.5, 3.0]], "float32")
    W = var(xp, np.ones((3, 4)) / 4, "float32")
    y = FLOAT32_OPS[name](x, W)
    assert y.dtype == xp.float32
    y.backward()
    assert x.grad.dtype == xp.float32
    assert W.grad is None or W.grad.dtype == xp.float32


def test_float32_higher_order_stays_float32(xp):
    x = var(xp, [0.5, 1.0], "float32")
    g, = gradcore.grad(F.tanh(x) * x ** 3, x, create_graph=True)
    gg, = gradcore.grad(g, x)
    assert g.dtype == xp.float32 and gg.dtype == xp.float32


# =============================================================================== devices
def test_to_is_differentiable_from_cpu():
    a = np.array([1.0, 2.0, 3.0])
    x = Variable(a)
    y = x.to(DEVICE1)
    assert y.device == DEVICE1 and y.backend is STRICT
    z = (y * y).sum()
    assert z.device == DEVICE1
    z.backward()
    assert type(x.grad.data) is np.ndarray and x.grad.device == "cpu"
    np.testing.assert_array_equal(x.grad.data, 2 * a)


def test_to_is_differentiable_between_devices(xp2):
    target = DEVICE2 if xp2.device == DEVICE1 else DEVICE1
    a = np.array([1.0, 2.0, 3.0])
    x = var(xp2, a)
    assert x.to(xp2.device) is x  # already there
    y = x.to(str(target))  # a string works as well as a Device
    assert y.device == target
    F.exp(y).backward()
    assert x.grad.device == xp2.device
    np.testing.assert_allclose(x.grad.numpy(), np.exp(a), rtol=1e-14)
    home = y.to(xp2.device)
    np.testing.assert_array_equal(home.numpy(), a)


def test_to_rejects_bad_devices(xp):
    x = var(xp, [1.0, 2.0])
    with pytest.raises(ValueError, match="invalid device 'nonsense:'"):
        x.to("nonsense:")
    with pytest.raises(ValueError, match="unknown device tpu"):
        x.to("tpu")
    with pytest.raises(TypeError, match="got int"):
        x.to(3)
    assert x.device == xp.device and x.grad is None


def test_to_casts_to_a_dtype_differentiably_as_pytorchs_to(xp2):
    """x.to(dtype=...), x.to(dtype) (PyTorch's tensor.to(torch.float32)) and x.to(device,
    dtype): F.astype, so the gradient comes back in x's dtype and place."""
    target = DEVICE2 if xp2.device == DEVICE1 else DEVICE1
    x = var(xp2, [1.5, -2.0])
    # a dtype's name where the device goes too ("unknown device float32" before)
    for y in (x.to(dtype="float32"), x.to(np.float32), x.to("float32"),
              x.to(str(target), "float32")):
        assert str(y.dtype).endswith("float32") and y.numpy().tolist() == [1.5, -2.0]
        x.cleargrad()
        (y * y).sum().backward()
        assert str(x.grad.dtype).endswith("float64") and x.grad.device == xp2.device
        assert x.grad.numpy().tolist() == [3.0, -4.0]
    assert x.to(dtype="float64") is x and x.to() is x
    with pytest.raises(TypeError, match="astype: 3 is not a dtype"):
        x.to(dtype=3)
    with pytest.raises(ValueError, match=r"x\.to\('floot32'\): unknown device floot32: known "
                                         r"device types are .*cpu, .*; nor is 'floot32' a dtype of"):
        x.to("floot32")


def test_to_a_dtype_name_the_library_lacks_says_so():
    import array_api_strict as strict
    x = Variable(strict.asarray([1.0, 2.0]))
    # array-api-strict has no float16: "unknown device float16" before
    with pytest.raises(ValueError, match=r"unknown device float16.*; nor is 'float16' a dtype "
                                         r"of array_api_strict"):
        x.to("float16")


def test_to_cpu_moves_a_leaf_and_its_grad_in_place():
    x = Variable(STRICT.asarray(np.array([1.0, 2.0]), device=DEVICE1))
    (x * 3).backward()
    assert x.grad.device == DEVICE1
    assert x.to_cpu() is x
    assert type(x.data) is np.ndarray and type(x.grad.data) is np.ndarray
    assert x.device == "cpu" and x.grad.device == "cpu"
    np.testing.assert_array_equal(x.data, [1.0, 2.0])
    np.testing.assert_array_equal(x.grad.data, [3.0, 3.0])
    (x * 2).backward()  # still differentiable, now on the CPU
    np.testing.assert_array_equal(x.grad.data, [5.0, 5.0])


def test_to_cpu_on_the_cpu_is_a_no_op():
    a = np.ones(2)
    x = Variable(a)
    assert x.to_cpu() is x and x.data is a


@pytest.mark.gpu
def test_to_gpu_and_back():
    a = np.array([1.0, 2.0])
    x = Variable(a)
    (x * 3).backward()
    assert x.to_gpu() is x
    assert x.device.type == "cuda" and x.grad.device.type == "cuda"
    (x * 2).backward()
    x.to_cpu()
    np.testing.assert_array_equal(x.grad.data, [5.0, 5.0])


@pytest.mark.gpu
def test_to_cuda_is_differentiable():
    x = Variable(np.array([1.0, 2.0]))
    y = x.to("cuda")
    assert y.device.type == "cuda"
    (y * y).backward()
    assert type(x.grad.data) is np.ndarray
    np.testing.assert_array_equal(x.grad.data, [2.0, 4.0])


def test_deepcopy_and_pickle_keep_the_backend(xp):
    import copy
    import pickle

    x = Variable(xp.asarray([1.0, 2.0]), name="x")
    for y in (copy.deepcopy(x), pickle.loads(pickle.dumps(x))):
        assert y is not x and y.backend is x.backend and y.name == "x"
        assert y.device == x.device
        np.testing.assert_array_equal(xp.numpy(y.data), [1.0, 2.0])


def test_a_shallow_copy_of_a_computed_variable_passes_its_gradient_on(xp):
    """copy.copy joins the copy to the graph by an identity op over the same data (PyTorch's
    clone, without copying); before, backward through it blamed a reused Function instance,
    or raised AttributeError once the original was gone."""
    import copy

    x = var(xp, [1.0, 2.0])
    h = x * x
    y = copy.copy(h)
    assert y is not h and y.creator is not h.creator and y.version == h.version
    F.sum(y * 3.0).backward()
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [6.0, 12.0])  # 3 * 2x
    x.cleargrad()
    copy.copy(x * x).backward()  # the original a temporary
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [2.0, 4.0])
    with gradcore.no_grad():
        assert copy.copy(h).creator is None
    assert copy.copy(x).creator is None  # a leaf: a leaf of its own


def test_a_copy_keeps_the_gradient_hooks_and_not_the_post_accumulate_ones():
    # the post-accumulate hooks step or send this leaf's own gradient: a copy does without
    import copy
    import pickle

    x = Variable(np.array([1.0, 2.0]), name="x")
    calls = []
    x.register_hook(_double)
    x.register_post_accumulate_grad_hook(lambda p: calls.append(p.grad.data.tolist()))
    for y in (copy.copy(x), copy.deepcopy(x), pickle.loads(pickle.dumps(x))):
        assert not hasattr(y, "_post_hooks") and y not in gradcore.engine.hooked_leaves
        F.sum(y * 3.0).backward()
        assert y.grad.data.tolist() == [6.0, 6.0] and calls == []  # doubled, no post hook
    F.sum(x * 3.0).backward()
    assert calls == [[6.0, 6.0]]


def test_a_shallow_copy_of_a_leaf_never_written_shares_its_version():
    """The write log is made at a leaf's first write: a copy of one never written had none to
    share, so a write to the original let a backward through the copy run on the new values."""
    import copy

    a = Variable(np.array([1.0, 2.0]))
    b = copy.copy(a)
    y = F.sin(b)
    a.data -= 1
    assert a.version == b.version == 1
    with pytest.raises(RuntimeError, match="was written after sin ran"):
        y.backward()


def test_a_shallow_copy_of_a_leaf_has_hooks_and_a_gradient_of_its_own():
    """copy.copy of a leaf shared its hook list and its .grad: a hook registered on the copy
    ran on the original's gradient too (x.grad [100, 100] for [1, 1])."""
    import copy

    x = Variable(np.array([1.0, 2.0]))
    x.register_hook(_double)
    (x * 1.0).sum().backward()  # x.grad = [2, 2]
    c = copy.copy(x)
    c.register_hook(lambda g: g * 100.0)
    assert c._hooks is not x._hooks and c.data is x.data  # the data is shared, as promised
    assert c.grad is not x.grad and not np.shares_memory(c.grad.data, x.grad.data)
    np.testing.assert_array_equal(c.grad.data, [2.0, 2.0])  # with the same values
    c.grad.data *= 0.5  # in place: the original's gradient stays as it was
    x.cleargrad()
    (x * 1.0).sum().backward()
    np.testing.assert_array_equal(x.grad.data, [2.0, 2.0])  # _double only
    (c * 1.0).sum().backward()
    np.testing.assert_array_equal(c.grad.data, [201.0, 201.0])  # 1 + 1 * 2 * 100


def _double(g):  # a gradient hook that pickles: a module-level function
    return g * 2.0


def _copied_whole(how, obj):
    """copy.deepcopy or a pickle round trip of `obj`, which must leave the recursion limit be."""
    import copy
    import pickle
    import sys

    limit = sys.getrecursionlimit()
    copied = copy.deepcopy(obj) if how == "deepcopy" else pickle.loads(pickle.dumps(obj))
    assert sys.getrecursionlimit() == limit
    return copied


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_deep_chain_is_copied_with_its_graph(how):
    """Copied op by op as the copier meets them, 500 ops took ~7000 frames (RecursionError
    past ~70): the graph is copied oldest op first, a few frames deep whatever its length."""
    x = Variable(np.array([1.0, 2.0, 3.0]))
    y = x
    for _ in range(500):
        y = y * 1.01
    x2, y2 = _copied_whole(how, (x, y))
    np.testing.assert_array_equal(y2.data, y.data)
    F.sum(y2).backward()
    assert x.grad is None
    np.testing.assert_allclose(x2.grad.data, [1.01 ** 500] * 3, rtol=1e-12)
    F.sum(y).backward()
    np.testing.assert_array_equal(x2.grad.data, x.grad.data)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_long_recurrence_is_copied_with_its_graph(how):
    """An RNN's state 300 steps into truncated BPTT, h = tanh(h @ W + x_t): backward through
    the copy gives the gradients of backpropagation through time written in NumPy."""
    rng = np.random.default_rng(0)
    W = Variable(rng.standard_normal((3, 3)) * 0.5)
    xs = [Variable(rng.standard_normal((1, 3))) for _ in range(300)]
    h = Variable(np.zeros((1, 3)), requires_grad=False)
    for x in xs:
        h = F.tanh(h @ W + x)
    W2, xs2, h2 = _copied_whole(how, (W, xs, h))
    F.sum(h2).backward()
    F.sum(h).backward()
    np.testing.assert_array_equal(W2.grad.data, W.grad.data)
    np.testing.assert_array_equal(xs2[0].grad.data, xs[0].grad.data)

    hs = [np.zeros((1, 3))]
    for x in xs:
        hs.append(np.tanh(hs[-1] @ W.data + x.data))
    gh, gW = np.ones((1, 3)), np.zeros((3, 3))
    for t in reversed(range(300)):
        ga = gh * (1 - hs[t + 1] ** 2)  # d tanh = 1 - y**2
        gW += hs[t].T @ ga
        gx0, gh = ga, ga @ W.data.T
    np.testing.assert_allclose(W2.grad.data, gW, rtol=1e-10)
    np.testing.assert_allclose(xs2[0].grad.data, gx0, rtol=1e-10)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_deep_graph_with_branches_is_copied_with_it(how):
    """200 steps of a diamond (h feeds sin and cos, added) and an op with two outputs (split),
    1200 ops: the copy's gradient is the Jacobians' product, worked out in NumPy."""
    x = Variable(np.array([0.1, 0.2, 0.3, 0.4]))
    h = x
    for _ in range(200):
        a, b = F.split(F.sin(h) + F.cos(h), 2)
        h = F.concatenate([b, a * 0.5])
    x2, h2 = _copied_whole(how, (x, h))
    F.sum(h2).backward()
    F.sum(h).backward()
    np.testing.assert_array_equal(x2.grad.data, x.grad.data)

    P = np.array([[0, 0, 1, 0], [0, 0, 0, 1], [0.5, 0, 0, 0], [0, 0.5, 0, 0]])  # dh'/du
    hs = [x.data]
    for _ in range(200):
        hs.append(P @ (np.sin(hs[-1]) + np.cos(hs[-1])))
    g = np.ones(4)
    for v in reversed(hs[:-1]):
        g = (P.T @ g) * (np.cos(v) - np.sin(v))
    np.testing.assert_allclose(x2.grad.data, g, rtol=1e-10)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_each_op_of_a_copied_graph_is_listed_once(monkeypatch, how):
    """The states of a recurrence, first to last (an RNN's outputs a model keeps): each op is
    put in order once, not again for every state behind which it lies (quadratic time)."""
    listed = []

    def ops_to_copy(y, begun):
        ops = real(y, begun)
        listed.extend(ops)
        return ops

    real = variable_module._ops_to_copy
    monkeypatch.setattr(variable_module, "_ops_to_copy", ops_to_copy)
    x = Variable(np.array([1.0, 2.0]))
    states = [x]
    for _ in range(200):
        states.append(F.tanh(states[-1] * 0.5))
    copied = _copied_whole(how, states)
    assert len(listed) == len(set(listed)) == 400
    F.sum(copied[-1]).backward()
    F.sum(states[-1]).backward()
    np.testing.assert_array_equal(copied[0].grad.data, x.grad.data)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_gradient_with_a_deep_graph_is_copied_with_it(how):
    """create_graph: x.grad carries the graph of a 300-op backward, which reaches back into the
    forward graph; the copy differentiates it again. L = sum((c x)**2), c = 1.01**300:
    dL/dx = 2 c**2 x, and its derivative 2 c**2."""
    x = Variable(np.array([0.3, -0.2]))
    h = x
    for _ in range(300):
        h = h * 1.01
    F.sum(h * h).backward(create_graph=True)
    x2 = _copied_whole(how, x)
    c2 = 1.01 ** 600
    np.testing.assert_allclose(x2.grad.data, 2 * c2 * x.data, rtol=1e-12)
    gg, = gradcore.grad(F.sum(x2.grad), [x2])
    np.testing.assert_allclose(gg.data, [2 * c2] * 2, rtol=1e-12)
    ggx, = gradcore.grad(F.sum(x.grad), [x])
    np.testing.assert_array_equal(gg.data, ggx.data)


# =============================================================================== dtypes
def test_data_in_the_other_byte_order_is_held_in_the_native_one():
    """From a .npy file of another machine, say: the gradients, computed in the native order,
    then match the Variable's dtype (a hook's result, a .grad set by hand)."""
    x = Variable(np.array([1.0, 2.0], dtype=">f8"))
    assert x.dtype == np.float64 and x.dtype.isnative
    x.register_hook(lambda g: g * 10.0)
    F.sum(x * 2.0).backward()
    np.testing.assert_array_equal(x.grad.data, [20.0, 20.0])
    x.grad = np.array([1.0, 1.0])
    x.data = np.frombuffer(np.array([3.0, 4.0], dtype=">f8").tobytes(), dtype=">f8")
    assert x.dtype.isnative and x.data.tolist() == [3.0, 4.0]
    i = Variable(np.array([3, 4], dtype=">i4"))
    assert i.dtype == np.int32 and i.data.tolist() == [3, 4]


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8", "bool"])
def test_integer_and_bool_variables_do_not_require_grad(xp, dtype):
    x = Variable(xp.asarray([1, 0, 1], dtype=dtype))
    assert not x.requires_grad
    assert F.exp(F.astype(x, xp.float64)).creator is None  # no input requires grad: no node
    with pytest.raises(TypeError, match=f"holds (array_api_strict.)?{dtype} data .*cast it to a "
                                        "float dtype first"):
        Variable(xp.asarray([1, 2], dtype=dtype), requires_grad=True)
    with pytest.raises(TypeError, match="cast it to a float dtype first"):
        x.requires_grad = True


def test_integer_data_gives_no_truncated_gradient():
    """exp of [1 2 3] gave [2 7 20] and x * 0.5 zeros: such a graph is now refused as having
    nothing to differentiate."""
    x = Variable(np.array([1, 2, 3]))
    with pytest.raises(RuntimeError, match="no graph"):
        F.exp(x).backward()


def test_python_ints_make_a_constant_and_floats_a_leaf():
    assert not Variable(3).requires_grad and not Variable([1, 2]).requires_grad
    assert Variable(3.0).requires_grad and Variable([1.0, 2]).requires_grad


def test_float_data_cannot_be_replaced_by_integers_while_requiring_grad():
    x = Variable(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="holds int64 data"):
        x.data = np.array([1, 2])
    np.testing.assert_array_equal(x.data, [1.0, 2.0])
    assert x.version == 0
    x.requires_grad = False
    x.data = np.array([1, 2])  # a constant may hold anything numeric


@pytest.mark.parametrize("data, dtype", [
    (np.array(["a", "b"]), "<U1"),
    (np.array([object(), None]), "object"),
    (np.array(["2026-01-01"], dtype="datetime64[D]"), r"datetime64\[D\]"),
    (np.array([(1, 2.0)], dtype="i4,f8"), r"\[\('f0'"),
    (["a", "b"], "<U1"),
])
def test_non_numeric_data_is_refused_naming_its_dtype(data, dtype):
    with pytest.raises(TypeError, match=f"Variable: {dtype}.* data is not numbers"):
        Variable(data)
    x = Variable(np.array([1.0]))
    with pytest.raises(TypeError, match="data is not numbers"):
        x.data = data


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_data_is_refused(xp, dtype):
    with pytest.raises(TypeError, match=f"{dtype} data is not supported: gradcore differentiates "
                                        "real numbers only"):
        Variable(xp.asarray([1 + 2j], dtype=dtype))
    with pytest.raises(TypeError, match="not supported"):
        Variable(xp.asarray([1.0, 2.0])) * xp.asarray([1j, 1j], dtype=dtype)  # a constant too


def test_a_complex_gradient_for_a_real_input_is_an_error():
    class Complexify(gradcore.Function):  # an op's result is not checked: it may be complex
        def forward(self, x):
            return x + 1j

    class Twice(gradcore.Function):
        def forward(self, x):
            return x * 2.0

        def backward(self, gy):
            return Complexify()(gy) * 2.0  # a bug: a complex gradient for a real input

    x = Variable(np.array([1.0, 2.0]))
    with pytest.raises(RuntimeError, match="twice.backward returned a complex gradient for a real "
                                           "input of dtype float64"):
        Twice()(x).backward()
    with pytest.raises(TypeError, match="complex128 data is not supported"):
        (x * 1.0).backward(np.array([1j, 1j]))  # a complex seed


# =============================================================================== small holes
def test_requires_grad_of_a_non_leaf_cannot_change(xp):
    x = Variable(xp.asarray([1.0, 2.0]))
    y = x * 2.0
    with pytest.raises(RuntimeError, match="requires_grad can only be changed on a leaf.*"
                                           "computed by mul.*detach"):
        y.requires_grad = False
    y.requires_grad = True  # no change: allowed
    assert y.requires_grad and y.creator is not None
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])


def test_a_leaf_can_stop_requiring_grad(xp):
    x = Variable(xp.asarray([1.0, 2.0]))
    assert x.requires_grad_(False) is x and not x.requires_grad
    assert (x * 2.0).creator is None
    x.requires_grad_()
    assert x.requires_grad


@pytest.mark.parametrize("bad, problem", [
    (lambda xp: xp.asarray([1.0, 2.0, 3.0]), r"shape \(3,\), not \(2,\)"),
    (lambda xp: xp.asarray([1.0, 2.0], dtype="float32"), "dtype .*float32, not .*float64"),
    (lambda xp: Variable(xp.asarray([[1.0, 2.0]])), r"shape \(1, 2\), not \(2,\)"),
])
def test_assigning_a_wrong_gradient_is_refused(xp, bad, problem):
    x = Variable(xp.asarray([1.0, 2.0]))
    with pytest.raises(ValueError, match=problem):
        x.grad = bad(xp)
    assert x.grad is None


def test_assigning_a_gradient_on_another_device_or_of_another_type_is_refused():
    x = Variable(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="device array_api_strict:device1, not cpu"):
        x.grad = Variable(np.array([1.0, 2.0])).to(DEVICE1)
    with pytest.raises(TypeError, match="grad must be a Variable, an array or None, got str"):
        x.grad = "zero"
    x.grad = np.array([3.0, 4.0])  # an array becomes a constant Variable
    assert isinstance(x.grad, Variable) and not x.grad.requires_grad


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
def test_ndarray_subclasses_become_plain_arrays_over_the_same_memory(tmp_path):
    """np.matrix was kept: x * x was a matrix product ([[7, 10], [15, 22]]) and x.sum() raised
    inside matrix.sum; np.memmap data is used in place, as a plain array over the file."""
    m = np.matrix([[1.0, 2.0], [3.0, 4.0]])
    x = Variable(m)
    assert type(x.data) is np.ndarray and np.shares_memory(x.data, m)
    np.testing.assert_array_equal((x * x).data, [[1.0, 4.0], [9.0, 16.0]])  # elementwise
    s = x.sum()
    assert s.shape == () and s.item() == 10.0
    s.backward()
    np.testing.assert_array_equal(x.grad.data, np.ones((2, 2)))
    y = Variable(np.ones((2, 2)))
    for z in (y * m, m * y):  # a matrix constant in an op
        assert type(z.data) is np.ndarray
        np.testing.assert_array_equal(z.data, [[1.0, 2.0], [3.0, 4.0]])
    y.data = m
    assert type(y.data) is np.ndarray and np.shares_memory(y.data, m)
    np.save(tmp_path / "w.npy", np.array([1.0, 2.0]))
    mapped = np.load(tmp_path / "w.npy", mmap_mode="r+")
    w = Variable(mapped)
    assert type(w.data) is np.ndarray and np.shares_memory(w.data, mapped)


def test_a_masked_array_is_refused_saying_what_to_do():
    """A masked array's sum skipped the masked element (4) while its gradient did not ([1, 1,
    1]): gradcore's ops read every element, so the mask is refused."""
    a = np.ma.array([1.0, 2.0, 3.0], mask=[0, 1, 0])
    x = Variable(np.zeros(3))
    for make in (lambda: Variable(a), lambda: setattr(x, "data", a), lambda: x * a):
        with pytest.raises(TypeError, match=r"MaskedArray .*filled\(.*numpy\.asarray"):
            make()
    assert type(x.data) is np.ndarray and x.version == 0
    np.testing.assert_array_equal(Variable(a.filled(0.0)).sum().data, 4.0)


@pytest.mark.parametrize("release", [False, True], ids=["Variable(None)", "released"])
def test_a_variable_with_no_data_says_so(release):
    """bool(x) was False, len(x), x.shape, x.item() ... raised "'NoneType' object has no
    attribute ...", blaming nothing."""
    x = Variable(None)
    if release:
        x = Variable(np.array([1.0, 2.0])) * 2.0
        x.data = None
    message = r"this Variable has no data \(data is None\); give it an array first"
    for call in (bool, len, iter, lambda x: x.item(), lambda x: x.numpy(), lambda x: x.to("cpu"),
                 np.asarray):
        with pytest.raises(TypeError, match=message):
            call(x)
    for name in ("shape", "ndim", "size", "dtype", "device", "xp"):
        with pytest.raises(AttributeError, match=rf"x\.{name}: {message}"):
            getattr(x, name)
        assert not hasattr(x, name)  # probes still read "no such attribute"
    assert repr(x) == "variable(None)" and x.data is None and x.backend is None


# =============================================================================== PyTorch spellings
def test_retain_grad_keeps_one_intermediate_gradient(xp):
    x = Variable(xp.asarray([1.0, 2.0]))
    h = x * 3.0
    k = h * 1.0
    h.retain_grad()
    assert h.retains_grad and not k.retains_grad
    (k * k).sum().backward()
    np.testing.assert_array_equal(h.grad.numpy(), [6.0, 12.0])
    assert k.grad is None
    h.retain_grad()  # twice is once
    (k * k).sum().backward()
    np.testing.assert_array_equal(h.grad.numpy(), [12.0, 24.0])  # accumulates like a leaf's
    x.retain_grad()  # a leaf keeps its gradient anyway
    assert not x.retains_grad


@pytest.mark.parametrize("register", ["register_hook", "register_post_accumulate_grad_hook"])
def test_a_handle_kept_after_its_variable_died_keeps_no_hook_alive(register):
    # kept in a list of handles, it held the Variable's hook list, and each hook's closure
    # (a mask, a buffer) with it, for as long as the list lived
    class Mask:  # what a hook's closure holds
        pass

    mask = Mask()
    gone = weakref.ref(mask)
    x = Variable(np.ones(2))
    handle = getattr(x, register)(lambda g, mask=mask: None)
    del mask, x
    gc.collect()
    assert gone() is None
    handle.remove()  # harmless now


def test_a_kept_handle_lets_its_variable_and_graph_die_when_the_hook_refers_to_it():
    """A handle held the hook, whose closure refers to its Variable: with the handles kept in a
    list, every Variable and the input behind it (8 MB each in the report) stayed alive."""
    handles, alive = [], []
    for _ in range(3):
        W = Variable(np.ones(4))
        t = W * 2.0
        handles.append(t.register_hook(lambda g, t=t: g * 2.0))
        alive += [weakref.ref(t), weakref.ref(W)]
    del t, W
    gc.collect()
    assert [r() for r in alive] == [None] * 6
    for handle in handles:
        handle.remove()  # the Variable gone: nothing to do


def test_a_kept_handle_lets_a_leaf_die_when_its_post_hook_is_a_method_of_its_owner():
    """A post-accumulate hook bound to an object that holds the leaf (a module, an optimizer):
    a kept handle kept the object and the leaf alive."""
    class Owner:
        def __init__(self, p):
            self.p = p
            self.seen = []

        def step(self, p):
            self.seen.append(p.grad.data.tolist())

    handles, alive = [], []
    for _ in range(3):
        owner = Owner(Variable(np.ones(2)))
        handles.append(owner.p.register_post_accumulate_grad_hook(owner.step))
        alive += [weakref.ref(owner), weakref.ref(owner.p)]
    hooked = len(gradcore.engine.hooked_leaves)
    del owner
    gc.collect()
    assert [r() for r in alive] == [None] * 6
    assert len(gradcore.engine.hooked_leaves) == hooked - 3
    for handle in handles:
        handle.remove()


def test_a_handle_held_weakly_still_removes_its_hook_while_its_variable_lives():
    import copy

    w = Variable(np.array([1.0, 2.0]))
    seen = []
    double = w.register_hook(lambda g, w=w: g * 2.0)  # refers to w: a cycle the handle is not in
    post = w.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.data.tolist()))
    c = copy.copy(w)  # the gradient hooks copied: a list of its own, without handles
    gc.collect()
    F.sum(w * 1.0).backward()
    assert w.grad.data.tolist() == [2.0, 2.0] and seen == [[2.0, 2.0]]
    double.remove()
    post.remove()
    assert w._hooks == [] and not hasattr(w, "_post_hooks")
    w.cleargrad()
    F.sum(w * 1.0).backward()
    assert w.grad.data.tolist() == [1.0, 1.0] and seen == [[2.0, 2.0]]
    triple = c.register_hook(lambda g: g * 3.0)  # the copy's own: the original's still runs
    F.sum(c * 1.0).backward()
    assert c.grad.data.tolist() == [6.0, 6.0]
    triple.remove()
    c.cleargrad()
    F.sum(c * 1.0).backward()
    assert c.grad.data.tolist() == [2.0, 2.0]


def test_a_handle_removes_its_own_hook_not_an_equal_one_registered_before():
    """Hooks that compare equal by value (a dataclass's __eq__): removing the second
    registration keeps the first, and the order the remaining hooks run in."""
    @dataclasses.dataclass
    class Scale:
        k: float

        def __call__(self, g):
            return g * self.k

    def clip(g):
        return F.clip(g, -1.0, 1.0)

    x = Variable(np.array([1.0]))
    x.register_hook(Scale(2.0))
    x.register_hook(clip)
    x.register_hook(Scale(2.0)).remove()
    (x * 1.0).sum().backward()
    assert x.grad.item() == 1.0  # clip(2 * 1); with the first removed, 2 * clip(1) = 2

    @dataclasses.dataclass
    class Count:
        calls: list

        def __call__(self, p):
            self.calls.append(p.grad.item())

    first, second = [], []
    kept = Count(first)
    x.register_post_accumulate_grad_hook(kept)
    x.register_post_accumulate_grad_hook(Count(second)).remove()  # equal to kept: [] == []
    assert x._post_hooks == [kept] and x._post_hooks[0] is kept
    x.cleargrad()
    (x * 1.0).sum().backward()
    assert first == [1.0] and second == []


def test_hooks_and_retain_grad_on_a_variable_without_grad_are_refused():
    x = Variable(np.array([1.0, 2.0]))
    with gradcore.no_grad():
        h = x * 2  # no graph: requires_grad False
    constant = Variable(np.array([1.0, 2.0]), requires_grad=False)
    integers = Variable(np.array([1, 2]))
    for v in (h, constant, integers):
        with pytest.raises(RuntimeError, match="register_hook: this Variable does not require "
                           "grad.*the hook would never run"):
            v.register_hook(print)
        with pytest.raises(RuntimeError, match="retain_grad: this Variable does not require grad"):
            v.retain_grad()
        assert v._hooks is None  # nothing was added
    x.retain_grad()  # a leaf that requires grad: nothing to do, as in PyTorch
    assert not x.retains_grad
    seen = []
    x.register_hook(lambda g: seen.append(g.numpy().tolist()))
    (x * 3.0).sum().backward()
    assert seen == [[3.0, 3.0]]


def test_retain_grad_stores_the_gradient_after_hooks(xp):
    x = Variable(xp.asarray([1.0, 2.0]))
    h = x * 1.0
    h.retain_grad()
    h.register_hook(lambda g: g * 10.0)
    h.sum().backward()
    np.testing.assert_array_equal(h.grad.numpy(), [10.0, 10.0])


def test_retain_graph_is_accepted_and_the_graph_stays_usable(xp):
    x = Variable(xp.asarray([1.0, 2.0]))
    y = (x * x).sum()
    y.backward(retain_graph=False)
    y.backward(retain_graph=True)
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 8.0])
    g, = gradcore.grad(y, x, retain_graph=True)
    np.testing.assert_array_equal(g.numpy(), [2.0, 4.0])


def test_float_and_int_of_one_element(xp):
    assert float(Variable(xp.asarray([2.5]))) == 2.5
    assert int(Variable(xp.asarray(3.7))) == 3
    assert int(Variable(xp.asarray([[7]], dtype="int64"))) == 7
    with pytest.raises(TypeError, match=r"float\(\) needs a Variable holding one value; this one "
                                        r"has shape \(2,\)"):
        float(Variable(xp.asarray([1.0, 2.0])))


def test_a_list_of_variables_is_refused_as_data_naming_stack():
    v = Variable(np.ones(2))
    for data in ([v, v], ([1.0, 2.0], (v,))):
        with pytest.raises(TypeError, match=r"F\.stack"):
            Variable(data)
    assert Variable([[1.0, 2.0], (3.0, 4.0)]).shape == (2, 2)  # numbers only: as before
    with pytest.raises(TypeError, match=r"F\.stack"):
        Variable([Variable(np.ones(2)), [1.0, 2.0, 3.0]])  # ragged: NumPy fails first


def test_a_list_of_numbers_becomes_data_without_its_items_walked_in_python(monkeypatch):
    walked = []
    monkeypatch.setattr(variable_module, "_holds_variable",
                        lambda items: walked.append(items) or False)
    rows = [[float(i + j) for j in range(3)] for i in range(4)]
    x = Variable(rows)
    np.testing.assert_array_equal(x.data, np.add.outer(np.arange(4.0), np.arange(3.0)))
    assert x.dtype == np.float64 and walked == []  # NumPy's conversion alone, in C
    monkeypatch.undo()
    with pytest.raises(TypeError, match=r"F\.stack"):  # the walk, only for an object array
        Variable([1.0, Variable(np.array(2.0), requires_grad=False), None])


# =============================================================================== DeZero's surface
def test_backward_refuses_a_bool_seed_and_names_the_keywords():
    """DeZero's backward(retain_grad, create_graph) takes flags where gradcore takes the seed:
    y.backward(True) must not run as a seed of ones with the flags lost."""
    x = Variable(np.array(2.0))
    h = x * x
    y = h * 3.0
    for args in ((True,), (True, True), (False,)):
        with pytest.raises(TypeError, match=r"backward\((True|False)\): the first argument is the "
                           r"seed gradient .*y\.backward\(retain_grad=True, create_graph=True\)"):
            y.backward(*args)
        assert x.grad is None and h.grad is None  # refused before anything ran
    y.backward(retain_grad=True)
    assert h.grad.item() == 3.0 and x.grad.item() == 12.0  # dy/dh = 3, dy/dx = 3 * 2x
    x.cleargrad()
    y.backward(2.0)  # a number is still a seed: twice the gradient
    assert x.grad.item() == 24.0
    x.cleargrad()
    y.backward(np.float64(0.5))  # and so is a NumPy number that is not a bool
    assert x.grad.item() == 6.0
    x.cleargrad()
    z = x ** 3
    z.backward(None, False, True)  # create_graph by position, as DeZero's second flag
    assert x.grad.item() == 12.0 and x.grad.creator is not None  # 3x^2, differentiable


def test_backward_refuses_numpy_and_0d_array_bool_seeds(xp):
    # y.backward(step % 10 == 0) with a NumPy step passes np.False_: it ran as a zero seed
    x = Variable(xp.asarray(np.array([1.0, 2.0, 3.0])))
    y = F.sum(x * 2.0)
    for seed in (np.False_, np.True_, np.array(True), xp.asarray(np.array(False)),
                 Variable(xp.asarray(np.array(True)), requires_grad=False)):
        with pytest.raises(TypeError, match=r"the first argument is the seed gradient"):
            y.backward(seed)
        assert x.grad is None
    y.backward(xp.asarray(np.array(0.5)))  # a 0-d float array is a seed
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [1.0, 1.0, 1.0])


def test_max_min_matmul_and_dot_methods():
    a = np.array([[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]])
    x = Variable(a)
    np.testing.assert_array_equal(x.max(axis=1).data, [5.0, 6.0])
    assert x.min().item() == 1.0
    np.testing.assert_array_equal(x.max(axis=0, keepdims=True).data, [[4.0, 5.0, 6.0]])
    x.max(axis=1).sum().backward()
    np.testing.assert_array_equal(x.grad.data, [[0, 1, 0], [0, 0, 1]])  # to each row's max
    x.cleargrad()
    x.min(axis=-1).sum().backward()
    np.testing.assert_array_equal(x.grad.data, [[1, 0, 0], [0, 1, 0]])
    W = Variable(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    expected = [[4.0, 8.0], [10.0, 8.0]]  # x @ W by hand
    np.testing.assert_array_equal(x.matmul(W).data, expected)
    np.testing.assert_array_equal(x.dot(W).data, expected)
    x.cleargrad()
    x.dot(W).sum().backward()
    np.testing.assert_array_equal(x.grad.data, [[1.0, 1.0, 2.0]] * 2)  # ones @ W.T
    np.testing.assert_array_equal(W.grad.data, [[5.0, 5.0], [7.0, 7.0], [9.0, 9.0]])  # x.T @ 1


def test_numpy_sum_max_min_give_values_without_grad_and_refuse_a_graph():
    """np.sum(x), np.max(x), np.min(x) call x.sum/x.max/x.min with NumPy's keywords (out=,
    dtype=): the values of a Variable that needs no grad, as np.asarray(x) gives them; for one
    that requires grad, a TypeError naming the spellings that work."""
    a = np.array([[1.0, 5.0], [3.0, 2.0]])
    c = Variable(a, requires_grad=False)
    assert np.sum(c) == 11.0 and np.max(c) == 5.0 and np.min(c) == 1.0
    np.testing.assert_array_equal(np.max(c, axis=0), [3.0, 5.0])
    np.testing.assert_array_equal(np.sum(c, axis=1, keepdims=True), [[6.0], [5.0]])
    assert np.sum(c, dtype=np.float32).dtype == np.float32
    x = Variable(a)
    for name, f in (("sum", np.sum), ("max", np.max), ("min", np.min)):
        with pytest.raises(TypeError, match=rf"numpy\.{name}\(x\) on a Variable that requires "
                           rf"grad .*x\.{name}\(axis, keepdims\) or F\.{name}\(x, axis, "
                           rf"keepdims\) .*numpy\.{name}\(x\.data\)"):
            f(x)
    with pytest.raises(TypeError, match=r"numpy\.sum\(x\) on a Variable that requires grad"):
        x.sum(dtype=np.float32)
    assert x.sum(0, True).shape == (1, 2)  # axis and keepdims by position, as DeZero's


@pytest.mark.parametrize("requires_grad", [True, False])
def test_pytorchs_reduction_keywords_are_refused_in_gradcores_spelling(requires_grad):
    # not NumPy calling x.sum (whose keywords it takes): the user, with PyTorch's names
    x = Variable(np.ones((2, 3)), requires_grad=requires_grad)
    with pytest.raises(TypeError, match=r"Variable\.sum\(\) got the unexpected keyword dim= "
                                        r"\(gradcore's axis=\); it takes axis= and keepdims="):
        x.sum(dim=0)
    with pytest.raises(TypeError, match=r"Variable\.max\(\) got the unexpected keyword "
                                        r"keepdim= \(gradcore's keepdims=\)"):
        x.max(keepdim=True)


def test_numpy_ufuncs_refuse_every_variable():
    """`__array_ufunc__ = None` (kept: operators with NumPy arrays stay fast): a ufunc given a
    Variable raises NumPy's own TypeError, with or without grad."""
    for requires_grad in (True, False):
        x = Variable(np.array([1.0, 2.0]), requires_grad=requires_grad)
        for ufunc in (np.exp, np.tanh, np.isnan):
            with pytest.raises(TypeError, match="does not support ufuncs"):
                ufunc(x)
        np.testing.assert_allclose(np.exp(x.data), [np.e, np.e ** 2])  # the spelling that works


def test_format_of_a_0d_variable_formats_its_value():
    loss = Variable(np.array(0.123456))
    assert f"{loss:.4f}" == "0.1235"
    assert f"{Variable(np.float32(0.5)):.2f}" == "0.50"
    assert f"{Variable(np.array(3)):d}" == "3"
    assert f"{loss}" == str(loss) == "variable(0.123456)"  # no spec: the repr, as before
    with pytest.raises(TypeError, match=r"format spec '\.4f' needs a 0-d Variable; this one has "
                       r"shape \(1,\): format one value, e\.g\. f'\{float\(x\[0\]\):\.4f\}'"):
        f"{Variable(np.array([0.5])):.4f}"
    with pytest.raises(TypeError, match=r"this one has shape None"):
        f"{Variable(None):.4f}"


def test_abs_is_differentiable():
    x = Variable(np.array([-1.5, 2.0]))
    y = abs(x)
    np.testing.assert_array_equal(y.data, [1.5, 2.0])
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.data, [-1.0, 1.0])  # the sign of x


def test_public_methods_have_docstrings():
    for member in (Variable.sum, Variable.max, Variable.min, Variable.matmul, Variable.dot,
                   Variable.T.fget, Variable.__format__):
        assert (member.__doc__ or "").strip(), member


class _TaggedParameter(gradcore.Parameter):
    """A user's Parameter with a state of its own (a dict, not Python's (dict, slots) pair)."""

    __slots__ = ("tag",)

    def __getstate__(self):
        return {"data": self.data, "tag": self.tag}

    def __setstate__(self, state):
        gradcore.Parameter.__init__(self, state["data"])
        self.tag = state["tag"]


def test_a_subclass_with_its_own_state_copies_with_a_post_accumulate_hook():
    import copy
    import pickle

    p = _TaggedParameter(np.array([1.0, 2.0]))
    p.tag = "w"
    p.register_post_accumulate_grad_hook(lambda v: None)  # as DistributedOptimizer does
    for copied in (copy.copy(p), copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        assert copied.tag == "w"
        np.testing.assert_array_equal(copied.data, [1.0, 2.0])


def test_a_forked_child_takes_the_locks_another_threads_write_or_hook_under():
    """A fork while another thread stamps a write or changes a leaf's post-accumulate hooks (a
    multiprocessing worker started mid-step): the child's writes do not wait for a thread it
    lacks."""
    assert forked_child_takes(variable_module, ["_stamping", "_post_hooks_lock"])


# ======================================================================== augmented assignment
def test_pytorchs_sgd_step_by_hand_writes_into_each_parameter():
    """`with no_grad(): for p in model.parameters(): p -= lr * p.grad` rebound the loop
    variable and left the model as it was: the loss stayed 10.66704 for five steps."""
    model = gradcore.nn.Linear(1, in_size=3)
    x = np.random.default_rng(0).standard_normal((16, 3))
    t = x @ np.array([[1.0], [2.0], [3.0]])
    losses = []
    for _ in range(5):
        loss = F.mean_squared_error(model(x), t)
        model.zero_grad()
        loss.backward()
        before = {id(p): (p.data.copy(), p.grad.data.copy(), p.version)
                  for p in model.parameters()}
        with gradcore.no_grad():
            for p in model.parameters():
                q = p
                q -= 0.1 * p.grad
                assert q is p  # written into, not rebound
        for p in model.parameters():
            data, grad, version = before[id(p)]
            np.testing.assert_array_equal(p.data, data - np.float32(0.1) * grad)
            assert p.dtype == np.float32 and p.version == version + 1 and p.grad is not None
        losses.append(float(loss.data))
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] / 2


@pytest.mark.parametrize("no_graph", ["constant", "no_grad"])
def test_each_augmented_operator_writes_into_x_where_no_graph_is_needed(xp, no_graph):
    """A constant under grad mode, or a leaf that requires grad under no_grad: the result is
    written into x (another name for x sees it), in x's dtype, and x.version goes up."""
    def cases():
        yield "+=", lambda v: v.__iadd__(2.0), [3.0, 4.0]
        yield "-=", lambda v: v.__isub__(xp.asarray([1.0, 1.0])), [0.0, 1.0]
        yield "*=", lambda v: v.__imul__(Variable(xp.asarray([2.0, 3.0]), requires_grad=False)),\
            [2.0, 6.0]
        yield "/=", lambda v: v.__itruediv__(4.0), [0.25, 0.5]
        yield "**=", lambda v: v.__ipow__(2), [1.0, 4.0]

    for symbol, update, want in cases():
        x = Variable(xp.asarray([1.0, 2.0], dtype="float32"), requires_grad=no_graph == "no_grad")
        alias, version = x, x.version
        if no_graph == "no_grad":
            with gradcore.no_grad():
                got = update(x)
            assert got is x, symbol
            assert xp.numpy(alias.data).tolist() == want and str(x.dtype).endswith("float32")
            assert x.version == version + 1 and x.creator is None and x.grad is None
        else:  # a Variable that requires no grad (a gradient, say) rebinds: it may be shared
            got = update(x)
            assert got is not x and xp.numpy(got.data).tolist() == want, symbol
            assert xp.numpy(alias.data).tolist() == [1.0, 2.0] and x.version == version
    m = Parameter(xp.asarray([[1.0, 2.0], [3.0, 4.0]]))
    with gradcore.no_grad():
        m @= xp.asarray([[0.0, 1.0], [1.0, 0.0]])  # square: the shape stays
    assert xp.numpy(m.data).tolist() == [[2.0, 1.0], [4.0, 3.0]]


def test_an_augmented_write_takes_xs_dtype_and_refuses_another_shape(xp):
    h = Parameter(xp.asarray([1.0, 2.0], dtype="float32"))
    with gradcore.no_grad():
        h += xp.asarray([0.25, 2.0 ** -30], dtype="float64")  # float64 sum, cast to float32
    assert xp.numpy(h.data).tolist() == [1.25, 2.0] and str(h.dtype).endswith("float32")
    if xp.name == "numpy":  # an integer Variable requires no grad: rebound, never truncated
        i = Variable(np.array([3, 4]), requires_grad=False)
        j = i
        i += 1.5
        assert i.data.tolist() == [4.5, 5.5] and j.data.tolist() == [3, 4]
    x = Parameter(xp.asarray([1.0, 2.0]))
    with gradcore.no_grad(), pytest.raises(ValueError, match=r"x \+= \.\.\.: the result has shape \(3, 2\) but x "
                       r"has shape \(2,\); writing into x keeps its shape"):
        x += xp.asarray([[1.0], [2.0], [3.0]])
    assert xp.numpy(x.data).tolist() == [1.0, 2.0] and x.version == 0


def test_an_augmented_assignment_to_a_leaf_that_requires_grad_is_refused_under_grad_mode():
    w = Parameter(np.array([1.0, 2.0]))
    with pytest.raises(RuntimeError, match=r"x -= \.\.\.: x is a leaf Variable that requires "
                       r"grad.*`with gradcore.no_grad\(\):`.*x\.data -= "):
        w -= 0.1
    assert w.data.tolist() == [1.0, 2.0] and w.version == 0


def test_an_augmented_assignment_in_the_graph_rebinds_as_in_dezero():
    """x computed in the graph (or the operand in it): x = x op y, recorded, as DeZero does; an
    alias keeps the old Variable and value (PyTorch would change it too)."""
    x = Variable(np.array([1.0, 2.0]))
    y = x * 3.0
    alias = y
    y += x  # y = 4 x
    y *= 2.0  # y = 8 x
    assert y is not alias and alias.data.tolist() == [3.0, 6.0] and alias.version == 0
    y.backward()
    assert x.grad.data.tolist() == [8.0, 8.0]
    c = Variable(np.array([1.0, 1.0]), requires_grad=False)  # a constant, x in the graph
    total = c
    total += x * x
    assert total is not c and c.data.tolist() == [1.0, 1.0]
    x.cleargrad()
    total.backward()
    assert x.grad.data.tolist() == [2.0, 4.0]


def test_an_augmented_assignment_to_a_computed_variable_under_no_grad_rebinds():
    """h = x * x, then `h += 100` under no_grad wrote into h: the graph behind h (reached
    through another name) then backpropagated from values it never computed."""
    x = Variable(np.array([1.0, 2.0]))
    h = x * x
    alias = h
    with gradcore.no_grad():
        h += 100.0
    assert h is not alias and h.data.tolist() == [101.0, 104.0]
    assert alias.data.tolist() == [1.0, 4.0] and alias.version == 0
    F.sum(alias).backward()
    assert x.grad.data.tolist() == [2.0, 4.0]
