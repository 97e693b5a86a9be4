"""gradcore.func against torch.func (when installed) and against finite differences."""
from collections import OrderedDict, defaultdict, namedtuple

import numpy as np
import pytest

import backends
import gradcore
import gradcore.func as gf
import gradcore.functions as F

W = np.random.default_rng(7).uniform(-1, 1, (4, 4))


def _ops(ns):
    """The ops a recipe draws from, spelled in a namespace of either library."""
    return {
        "sin": ns["sin"], "cos": ns["cos"], "tanh": ns["tanh"],
        "exp": lambda a: ns["exp"](a * 0.3),
        "square": lambda a: a * a,
        "log": lambda a: ns["log"](1 + a * a),
        "matmul": lambda a: ns["matmul"](a, ns["W"]),
        "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    }


GRADCORE = {"sin": F.sin, "cos": F.cos, "tanh": F.tanh, "exp": F.exp, "log": F.log,
            "matmul": F.matmul, "sum": F.sum, "W": W}


def _torch_namespace(torch):
    return {"sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "exp": torch.exp,
            "log": torch.log, "matmul": torch.matmul, "sum": torch.sum,
            "W": torch.tensor(W)}


def recipe(seed, length=8):
    rng = np.random.default_rng(seed)
    steps = []
    for i in range(length):
        op = str(rng.choice(["sin", "cos", "tanh", "exp", "square", "log", "matmul", "add",
                             "sub", "mul"]))
        steps.append((op, *(int(j) for j in rng.integers(2 + i, size=2))))
    return steps


def function(steps, ns, vector=False):
    """f(x, y) from a recipe in namespace `ns`: a number, or (vector=True) a (1, 4) array."""
    ops = _ops(ns)

    def f(x, y):
        nodes = [x, y]
        for op, i, j in steps:
            nodes.append(ops[op](nodes[i], nodes[j]) if op in ("add", "sub", "mul")
                         else ops[op](nodes[i]))
        last = nodes[-1] + nodes[2] * 0.5
        return last if vector else ns["sum"](last * nodes[len(nodes) // 2])
    return f


def point(seed):
    rng = np.random.default_rng(100 + seed)
    return rng.uniform(-1, 1, (1, 4)), rng.uniform(-1, 1, (1, 4))


def numeric_gradient(f, x, eps=1e-6):
    """Central differences of a number-valued f of one array."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[i] = eps
        g[i] = (float(f(x + step)) - float(f(x - step))) / (2 * eps)
    return g


def host(a):
    return np.asarray(a.data if isinstance(a, gradcore.Variable) else a)


# ================================================================================ torch.func
@pytest.mark.parametrize("seed", range(12))
def test_first_and_second_order_agree_with_torch_func(seed):
    torch = pytest.importorskip("torch")
    steps = recipe(seed)
    f, ft = function(steps, GRADCORE), function(steps, _torch_namespace(torch))
    fv, fvt = (function(steps, GRADCORE, vector=True),
               function(steps, _torch_namespace(torch), vector=True))
    x, y = point(seed)
    xt, yt = torch.tensor(x), torch.tensor(y)
    close = dict(rtol=1e-10, atol=1e-12)

    np.testing.assert_allclose(gf.grad(f, argnums=(0, 1))(x, y)[1],
                               torch.func.grad(ft, argnums=(0, 1))(xt, yt)[1].numpy(), **close)
    np.testing.assert_allclose(gf.hessian(lambda a: f(a, y), x),
                               torch.func.hessian(lambda a: ft(a, yt))(xt).numpy(), **close)
    np.testing.assert_allclose(gf.jacobian(lambda a: fv(a, y), x),
                               torch.func.jacrev(lambda a: fvt(a, yt))(xt).numpy(), **close)
    np.testing.assert_allclose(gf.jacfwd(lambda a: fv(a, y), x),
                               torch.func.jacfwd(lambda a: fvt(a, yt))(xt).numpy(), **close)
    v = np.random.default_rng(seed).uniform(-1, 1, (1, 4))
    _, tangent = gf.jvp(fv, (x, y), (v, v * 0.5))
    _, tangent_t = torch.func.jvp(fvt, (xt, yt), (torch.tensor(v), torch.tensor(v * 0.5)))
    np.testing.assert_allclose(tangent, tangent_t.numpy(), **close)
    out, vjp_fn = gf.vjp(fv, x, y)
    out_t, vjp_fn_t = torch.func.vjp(fvt, xt, yt)
    np.testing.assert_allclose(out, out_t.numpy(), **close)
    for got, want in zip(vjp_fn(v), vjp_fn_t(torch.tensor(v))):
        np.testing.assert_allclose(got, want.numpy(), **close)
    np.testing.assert_allclose(gf.hvp(lambda a: f(a, y), x, v),
                               torch.func.vjp(torch.func.grad(lambda a: ft(a, yt)), xt)[1](
                                   torch.tensor(v))[0].numpy(), **close)


# ================================================================================ without torch
@pytest.mark.parametrize("seed", range(6))
def test_transforms_agree_with_finite_differences_and_each_other(seed):
    steps = recipe(seed)
    f, fv = function(steps, GRADCORE), function(steps, GRADCORE, vector=True)
    x, y = point(seed)
    of_x = lambda a: f(a, y)  # noqa: E731
    g = gf.grad(of_x)(x)
    np.testing.assert_allclose(g, numeric_gradient(of_x, x), rtol=1e-6, atol=1e-8)
    value, g2 = gf.value_and_grad(of_x)(x)
    assert float(value) == float(of_x(x)) and np.array_equal(g, g2)
    H = gf.hessian(of_x, x)
    assert H.shape == (1, 4, 1, 4)
    np.testing.assert_allclose(H.reshape(4, 4), H.reshape(4, 4).T, rtol=1e-10, atol=1e-12)
    for i in range(4):  # a Hessian row is the finite difference of the gradient
        step = np.zeros((1, 4))
        step[0, i] = 1e-6
        column = (gf.grad(of_x)(x + step) - gf.grad(of_x)(x - step)) / 2e-6
        np.testing.assert_allclose(H.reshape(4, 4)[:, i], column.reshape(4), rtol=1e-5,
                                   atol=1e-7)
    v = np.random.default_rng(seed).uniform(-1, 1, (1, 4))
    np.testing.assert_allclose(gf.hvp(of_x, x, v).reshape(4), H.reshape(4, 4) @ v.reshape(4),
                               rtol=1e-10, atol=1e-12)
    J = gf.jacobian(lambda a: fv(a, y), x)
    np.testing.assert_allclose(gf.jacfwd(lambda a: fv(a, y), x), J, rtol=1e-10, atol=1e-12)
    _, tangent = gf.jvp(lambda a: fv(a, y), (x,), (v,))
    np.testing.assert_allclose(tangent.reshape(4), J.reshape(4, 4) @ v.reshape(4),
                               rtol=1e-10, atol=1e-12)
    # composes: the Jacobian of the gradient is the Hessian
    np.testing.assert_allclose(gf.jacobian(gf.grad(of_x), x), H, rtol=1e-12, atol=1e-14)


def test_several_arguments_give_a_tuple(xp2):
    x = xp2.asarray([[0.5, -0.2]])
    y = xp2.asarray([[1.5, 0.3]])
    f = lambda a, b: F.sum(a * a * b)  # noqa: E731
    gx, gy = gf.grad(f, argnums=(0, 1))(x, y)
    np.testing.assert_allclose(xp2.numpy(gx), [[2 * 0.5 * 1.5, 2 * -0.2 * 0.3]], rtol=1e-15)
    np.testing.assert_allclose(xp2.numpy(gy), [[0.25, 0.04]], rtol=1e-15)
    Jx, Jy = gf.jacobian(lambda a, b: a * b, (x, y))
    np.testing.assert_allclose(xp2.numpy(Jx).reshape(2, 2), np.diag([1.5, 0.3]), rtol=1e-15)
    np.testing.assert_allclose(xp2.numpy(Jy).reshape(2, 2), np.diag([0.5, -0.2]), rtol=1e-15)
    H = gf.hessian(lambda a: F.sum(F.sin(a)), x)
    assert backends_device(H) == xp2.device
    np.testing.assert_allclose(xp2.numpy(H).reshape(2, 2), np.diag(-np.sin([0.5, -0.2])),
                               rtol=1e-12)


def backends_device(array):
    import backends
    backend = backends.backend_of(array)
    return backend.device_of(array)


def test_arrays_in_give_arrays_out_and_variables_stay_differentiable():
    f = lambda a: F.sum(a * a * a)  # noqa: E731
    g = gf.grad(f)(np.array([1.0, 2.0]))
    assert isinstance(g, np.ndarray) and np.array_equal(g, [3.0, 12.0])
    x = gradcore.Variable(np.array([1.0, 2.0]))
    g = gf.grad(f)(x)
    assert isinstance(g, gradcore.Variable) and g.creator is not None
    F.sum(g).backward()  # d/dx sum(3x^2) = 6x
    assert np.array_equal(x.grad.data, [6.0, 12.0])
    # grad of grad of a number: d2/dx2 x^3 = 6x
    second = gf.grad(gf.grad(lambda a: a * a * a))(gradcore.Variable(np.array(2.0)))
    assert float(second.data) == 12.0


def test_a_function_of_nothing_it_is_given_has_zero_derivatives():
    zero = gf.grad(lambda a, b: F.sum(b * 2.0))(np.ones(3), np.ones(3))
    assert np.array_equal(zero, np.zeros(3))
    _, tangent = gf.jvp(lambda a: a * 0 + 1.0, (np.ones(2),), (np.ones(2),))
    assert np.array_equal(tangent, np.zeros(2))


def test_errors_say_what_to_do():
    with pytest.raises(ValueError, match="one number.*F.sum.*jacobian"):
        gf.grad(lambda a: a * 2)(np.ones(3))
    with pytest.raises(IndexError, match="argnums 2"):
        gf.grad(lambda a, b: F.sum(a), argnums=2)(np.ones(1), np.ones(1))
    with pytest.raises(ValueError, match="1 tangents for 2 primals"):
        gf.jvp(lambda a, b: a, (np.ones(1), np.ones(1)), (np.ones(1),))
    with pytest.raises(TypeError, match="Variables or arrays"):
        gf.vjp(lambda a: "text", np.ones(1))
    with pytest.raises(TypeError, match="at least one primal"):
        gf.vjp(lambda: 1.0)


def test_one_variable_at_two_positions_and_nested_transforms_are_not_confused():
    # each position has a variable of its own (torch.func's figures)
    a = gradcore.Variable(np.array([1.0, 2.0]))
    ga, gb = gf.grad(lambda u, v: F.sum(u * v * v), argnums=(0, 1))(a, a)
    np.testing.assert_array_equal(ga.data, [1.0, 4.0])
    np.testing.assert_array_equal(gb.data, [2.0, 8.0])
    # d/dx [x * (d/dy x*y)] = d/dx x*x = 2x: the inner y is not the outer x
    outer = gf.grad(lambda x: F.sum(x * gf.grad(lambda y: F.sum(x * y))(x)))
    np.testing.assert_array_equal(outer(np.array([3.0])), [6.0])


def test_an_inner_transform_keeps_what_it_read_of_an_outer_one():
    """d/dx sum(x * d/dy sum(x * y)) = d/dx sum(x * x) = 2x, whatever the inner point is."""
    x = np.array([0.5, -1.2, 2.0])
    for inner_point in (np.ones(3), gradcore.Variable(np.ones(3), requires_grad=False)):
        outer = gf.grad(lambda x: F.sum(x * gf.grad(lambda y: F.sum(x * y))(inner_point)))
        np.testing.assert_array_equal(outer(x), 2 * x)
    # and through jvp: the inner tangent of x * y along y is x; d/dx sum(x * x) again
    outer = gf.grad(lambda x: F.sum(x * gf.jvp(lambda y: x * y, (np.ones(3),),
                                               (np.ones(3),))[1]))
    np.testing.assert_array_equal(outer(x), 2 * x)


def test_an_integer_point_is_refused_rather_than_given_zero_derivatives():
    for call, where in ((lambda: gf.grad(lambda v: F.sum(v * v))(np.array([1, 2])), "grad"),
                        (lambda: gf.grad(lambda v: v * v)(3), "grad"),
                        (lambda: gf.jacobian(lambda v: v * v, np.array([1, 2])), "jacobian"),
                        (lambda: gf.jacfwd(lambda v: v * v, np.array([1, 2])), "jacfwd"),
                        (lambda: gf.hessian(lambda v: F.sum(v * v), np.array([1, 2])), "hessian"),
                        (lambda: gf.value_and_grad(lambda v: F.sum(v * v))(np.array([1, 2])),
                         "value_and_grad"),
                        (lambda: gf.hvp(lambda v: F.sum(v * v), np.array([1, 2]), np.ones(2)),
                         "hvp")):
        with pytest.raises(TypeError, match=f"^{where}: argument 0 has dtype int64.*floating"):
            call()


def test_the_integer_point_refused_is_shown_how_to_write_as_floating_point():
    square = lambda v: F.sum(v * v)  # noqa: E731
    for point, hint in ((3, "(3.0, not 3)"), (True, "(1.0, not True)"),
                        (np.array([1, 2]), "(x.astype(float))"),
                        (gradcore.Variable(np.array([1, 2])), '(F.astype(x, "float64"))')):
        for call in (lambda: gf.grad(square)(point), lambda: gf.hvp(square, point, 1.0)):
            with pytest.raises(TypeError) as error:
                call()
            assert str(error.value).endswith("differentiate at a floating-point point " + hint)


def test_a_transform_built_on_another_names_itself_in_its_errors():
    """hessian and hvp are built on grad, grad on value_and_grad, hvp on vjp's pullback: an
    error names the transform the user called."""
    x, vector = np.ones(2), lambda a: a * a  # noqa: E731
    for call, where in ((lambda: gf.value_and_grad(vector)(x), "value_and_grad"),
                        (lambda: gf.hessian(vector, x), "hessian"),
                        (lambda: gf.hvp(vector, x, x), "hvp"),
                        (lambda: gf.hvp(vector, (x,), (x,)), "hvp")):
        with pytest.raises(ValueError, match=rf"^{where}: f must return one number \(size 1\)"):
            call()
    with pytest.raises(TypeError, match=r"^hvp: needs at least one primal"):
        gf.hvp(lambda: 1.0, (), ())
    with pytest.raises(TypeError, match=r"^hessian: f must return Variables or arrays"):
        gf.hessian(lambda a: "text", x)
    with pytest.raises(IndexError, match=r"^value_and_grad: argnums 2 for a function called "
                                         r"with 1 argument\(s\)"):
        gf.value_and_grad(F.sum, argnums=2)(x)
    with pytest.raises(TypeError, match=r"^value_and_grad: with has_aux=True, f must return a "
                                        r"pair"):
        gf.value_and_grad(F.sum, has_aux=True)(x)


def test_labels_beside_logits_get_zero_derivatives_from_vjp():
    logits, labels = np.linspace(-1, 1, 6).reshape(2, 3), np.array([2, 0])
    loss, vjp_fn = gf.vjp(F.softmax_cross_entropy, logits, labels)
    g_logits, g_labels = vjp_fn(1.0)
    expected, = gf.grad(F.softmax_cross_entropy, argnums=(0,))(logits, labels)
    np.testing.assert_array_equal(g_logits, expected)
    assert g_labels.shape == (2,) and not g_labels.any()


def test_an_inner_transform_that_reads_nothing_of_the_outer_gives_arrays():
    def outer(x):
        inner = gf.grad(lambda y: F.sum(y * y))(np.array([1.0, 3.0]))  # no outer variable
        assert isinstance(inner, np.ndarray)
        return F.sum(x * float(np.linalg.norm(inner)))
    np.testing.assert_allclose(gf.grad(outer)(np.ones(2)), [2 * 10 ** 0.5] * 2)


def test_jacobians_of_a_function_with_several_results_are_one_per_result():
    def f(a, b):
        return a * b, F.sum(a * b)
    a, b = np.array([1.0, 2.0]), np.array([3.0, 5.0])
    for jac in (gf.jacobian, gf.jacfwd):
        (da_y, db_y), (da_s, db_s) = jac(f, (a, b))
        np.testing.assert_array_equal(da_y, np.diag(b))
        np.testing.assert_array_equal(db_y, np.diag(a))
        np.testing.assert_array_equal(da_s, b)
        np.testing.assert_array_equal(db_s, a)
        y_of_a, s_of_a = jac(lambda a: f(a, b), a)
        np.testing.assert_array_equal(y_of_a, np.diag(b))
        np.testing.assert_array_equal(s_of_a, b)


def test_has_aux_hands_back_what_f_returns_beside_its_result():
    def loss_and_prediction(w):
        prediction = w * 3.0
        return F.sum(prediction * prediction), prediction
    w = np.array([1.0, 2.0])
    g, prediction = gf.grad(loss_and_prediction, has_aux=True)(w)
    np.testing.assert_array_equal(g, 18 * w)
    assert isinstance(prediction, np.ndarray)  # arrays in, arrays out: aux too
    np.testing.assert_array_equal(prediction, 3 * w)
    (value, aux), g = gf.value_and_grad(loss_and_prediction, has_aux=True)(w)
    assert float(value) == 45.0 and aux is not None
    with pytest.raises(TypeError, match="has_aux=True, f must return a pair"):
        gf.grad(lambda w: F.sum(w), has_aux=True)(w)


@pytest.mark.parametrize("argnums", [[0, 1], (), 1.0, True])
def test_argnums_must_be_an_int_or_a_tuple_of_them(argnums):
    with pytest.raises(TypeError, match="argnums must be an int or a non-empty tuple of ints"):
        gf.grad(lambda a, b: F.sum(a * b), argnums=argnums)


def test_an_aux_that_depends_on_the_outer_transform_stays_differentiable():
    def inner(y, x):
        return F.sum(y * y), x * 3.0

    def outer(x):
        _, aux = gf.grad(lambda y: inner(y, x), has_aux=True)(np.ones(1))
        return F.sum(aux) + F.sum(x)
    np.testing.assert_array_equal(gf.grad(outer)(np.array([2.0])), [4.0])


def test_a_transform_called_under_no_grad_gives_constants():
    """torch.func: a transform respects a no_grad around it; d/dx [x * stop(2x)] at 2 is 4."""
    x = gradcore.Variable(np.array(2.0))
    with gradcore.no_grad():
        c = gf.grad(lambda y: y * y)(x)
        H = gf.hessian(lambda y: y * y * y, x)  # still differentiates f: 6x
    assert float(c.data) == 4.0 and c.creator is None and not c.requires_grad
    assert float(H.data) == 12.0 and H.creator is None
    (x * c).backward()
    assert float(x.grad.data) == 4.0

    def f(x):
        with gradcore.no_grad():
            c = gf.grad(lambda y: y * y)(x)
        return x * c
    assert float(gf.grad(f)(np.array(2.0))) == 4.0


def test_vjp_fn_follows_the_grad_mode_in_force_when_it_runs():
    """torch.func: vjp_fn(ct) in no_grad gives constants; vjp() in no_grad and vjp_fn in grad
    mode gives 2x, differentiable with respect to x (d sum(2x)/dx = 2)."""
    x = gradcore.Variable(np.array([1.0, 2.0]))
    out, vjp_fn = gf.vjp(lambda a: a ** 2, x)
    assert out.creator is not None
    with gradcore.no_grad():
        (g,) = vjp_fn(np.ones(2))
    np.testing.assert_array_equal(g.data, [2.0, 4.0])
    assert g.creator is None and not g.requires_grad
    with gradcore.no_grad():
        out, vjp_fn = gf.vjp(lambda a: a ** 2, x)
    assert out.creator is None and not out.requires_grad
    np.testing.assert_array_equal(out.data, [1.0, 4.0])
    (g,) = vjp_fn(np.ones(2))
    np.testing.assert_array_equal(g.data, [2.0, 4.0])
    assert g.creator is not None
    F.sum(g).backward()
    np.testing.assert_array_equal(x.grad.data, [2.0, 2.0])


def test_a_tangent_or_cotangent_that_requires_grad_keeps_its_graph():
    """At an array point, d sum(J v)/dv = J^T 1: J = diag(x cos x + sin x) for sin(x) x, and
    the Hessian of sum(x^2 sin x) is diag(-x^2 sin x + 4x cos x + 2 sin x)."""
    x = np.array([0.5, 1.2])
    f = lambda y: F.sin(y) * y  # noqa: E731
    jacobian_diagonal = x * np.cos(x) + np.sin(x)
    hessian_diagonal = -x * x * np.sin(x) + 4 * x * np.cos(x) + 2 * np.sin(x)
    for product, want in (
            (lambda v: gf.jvp(f, (x,), (v,))[1], jacobian_diagonal),
            (lambda v: gf.vjp(f, x)[1](v)[0], jacobian_diagonal),
            (lambda v: gf.hvp(lambda y: F.sum(F.sin(y) * y * y), x, v), hessian_diagonal)):
        v = gradcore.Variable(np.array([1.0, -2.0]))
        out = product(v)
        assert isinstance(out, gradcore.Variable)
        np.testing.assert_allclose(out.data, want * v.data, rtol=1e-14)
        F.sum(out).backward()
        np.testing.assert_allclose(v.grad.data, want, rtol=1e-14)


def test_repeated_argnums_are_refused():
    f = lambda a, b: F.sum(a * a * b)  # noqa: E731
    for argnums in ((0, 0), (1, -1)):
        with pytest.raises(ValueError, match="argnums elements must be unique"):
            gf.grad(f, argnums=argnums)(np.ones(2), np.ones(2))


def test_the_hessian_of_several_arguments_has_every_block():
    a, b = np.array([0.3, 0.4]), np.array([1.1, -0.5])
    (Haa, Hab), (Hba, Hbb) = gf.hessian(lambda a, b: F.sum(a * a * b + F.sin(a * b)), (a, b))
    mixed = np.diag(2 * a + np.cos(a * b) - a * b * np.sin(a * b))
    np.testing.assert_allclose(Haa, np.diag(2 * b - b * b * np.sin(a * b)), rtol=1e-14)
    np.testing.assert_allclose(Hab, mixed, rtol=1e-14)
    np.testing.assert_allclose(Hba, mixed, rtol=1e-14)
    np.testing.assert_allclose(Hbb, np.diag(-a * a * np.sin(a * b)), rtol=1e-14)
    np.testing.assert_allclose(Hbb, [[-0.02916387255553815, 0.0], [0.0, 0.0317870929272098]],
                               rtol=1e-14)  # torch.func.hessian's figures


def test_empty_inputs_and_results_give_empty_jacobians():
    """Shaped f(x).shape + x.shape, as torch.func gives them."""
    assert gf.jacobian(F.sin, np.zeros(0)).shape == (0, 0)
    assert gf.jacfwd(F.sin, np.zeros(0)).shape == (0, 0)
    assert gf.jacobian(lambda x: x[:0], np.ones(3)).shape == (0, 3)
    assert gf.jacfwd(lambda x: x[:0], np.ones(3)).shape == (0, 3)
    assert gf.jacfwd(lambda x: F.sum(x) + 1.0, np.zeros((0, 2))).shape == (0, 2)
    assert gf.hessian(lambda x: F.sum(x), np.zeros(0)).shape == (0, 0)
    doubled, empty = gf.jacobian(lambda x: (x * 2, x[:0]), np.ones(2))
    np.testing.assert_array_equal(doubled, 2 * np.eye(2))
    assert empty.shape == (0, 2) and empty.dtype == np.float64
    ja, jb = gf.jacfwd(lambda a, b: F.sum(a) + F.sum(b * b), (np.zeros(0), np.ones(2)))
    assert ja.shape == (0,)
    np.testing.assert_array_equal(jb, [2.0, 2.0])


def test_hvp_of_several_arguments_gives_a_tuple():
    """f = sum(a^2 b): H v = (2b va + 2a vb, 2a va)."""
    a, b = np.array([0.3, 0.4]), np.array([1.1, -0.5])
    va, vb = np.ones(2), np.array([1.0, 2.0])
    ha, hb = gf.hvp(lambda a, b: F.sum(a * a * b), (a, b), (va, vb))
    np.testing.assert_allclose(ha, [2.8, 0.6], rtol=1e-14)
    np.testing.assert_allclose(hb, [0.6, 0.8], rtol=1e-14)
    with pytest.raises(ValueError, match="hvp: 1 vectors in v for 2 arguments in x"):
        gf.hvp(lambda a, b: F.sum(a * a * b), (a, b), (va,))


@pytest.mark.parametrize("number", [2.0, 2, np.float64(2.0), np.float32(2.0), np.int64(2)],
                         ids=["float", "int", "np.float64", "np.float32", "np.int64"])
def test_a_number_as_tangent_or_cotangent_is_spread_over_its_array(number):
    """Any real number, Python's or a NumPy scalar, stands for an array of it (np.float32 and
    NumPy's integers were refused, float and np.float64 taken); the result keeps its dtype."""
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    _, vjp_fn = gf.vjp(lambda z: z * z, x)
    gx, = vjp_fn(number)
    assert gx.dtype == np.float32
    np.testing.assert_array_equal(gx, [4.0, 8.0, 12.0])
    _, t = gf.jvp(lambda z: z * z, (x,), (number,))
    np.testing.assert_array_equal(t, [4.0, 8.0, 12.0])
    np.testing.assert_array_equal(gf.hvp(lambda z: F.sum(z ** 3), x, number), [12.0, 24.0, 36.0])


def test_a_bool_or_a_0d_array_tangent_is_refused():
    """True was taken as 1; a 0-d array is an array, shaped otherwise than the result."""
    x = np.array([1.0, 2.0, 3.0])
    _, vjp_fn = gf.vjp(lambda z: z * z, x)
    with pytest.raises(TypeError, match=r"^vjp_fn: the cotangent is True, of bools; pass a "):
        vjp_fn(True)
    with pytest.raises(TypeError, match=r"^jvp: tangents\[0\] is False, of bools"):
        gf.jvp(lambda z: z * z, (x,), (False,))
    for flags in (np.True_, np.array([True, False, True]), gradcore.Variable(np.ones(3, bool))):
        with pytest.raises(TypeError, match=r"^vjp_fn: the cotangent is .*, of bools"):
            vjp_fn(flags)  # taken as 1 (np.True_: 9.0 at 1.5 for 3 v**2)
    with pytest.raises(ValueError, match=r"^vjp_fn: the cotangent has shape \(\) but"):
        vjp_fn(np.array(2.0))


def test_a_number_result_is_refused_as_a_cut_graph():
    """.item() or float() cuts the graph: the derivatives came out as zeros (grad [0, 0, 0] for
    2x = [1, -2, 4]). A constant returned on purpose cannot be told from that: refused too, as
    torch.func refuses a result that is not a Tensor."""
    x = np.array([0.5, -1.0, 2.0])
    message = r"^{}: f returned a number{}, {}.*cut.*return the Variable itself"
    with pytest.raises(TypeError, match=message.format("grad", "", "float 5.25")):
        gf.grad(lambda a: F.sum(a * a).item())(x)
    with pytest.raises(TypeError, match=message.format("value_and_grad", "", "float 5.25")):
        gf.value_and_grad(lambda a: float(F.sum(a * a)))(x)
    with pytest.raises(TypeError, match=message.format("hessian", "", "float 5.25")):
        gf.hessian(lambda a: F.sum(a * a).item(), x)
    with pytest.raises(TypeError, match=message.format("jacobian", "", "float64 np.float64")):
        gf.jacobian(lambda a: np.sum(a.data * a.data), x)
    with pytest.raises(TypeError, match=message.format("grad", "", "float 3.0")):
        gf.grad(lambda a: 3.0)(x)
    with pytest.raises(TypeError, match=message.format("value_and_grad", "", "int 2")):
        gf.value_and_grad(lambda a, b: 2, argnums=(0, 1))(x, x)
    with pytest.raises(TypeError, match=message.format("vjp", " at position 1", "float 5.25")):
        gf.vjp(lambda a: (a * 2.0, F.sum(a * a).item()), x)
    with pytest.raises(TypeError, match=message.format("jvp", "", "float 5.25")):
        gf.jvp(lambda a: F.sum(a * a).item(), (x,), (np.ones(3),))
    np.testing.assert_array_equal(gf.grad(lambda a: F.sum(a * a))(x), [1.0, -2.0, 4.0])


def test_an_aux_in_a_dict_or_list_comes_back_as_arrays_as_in_a_tuple():
    def f(x):
        return F.sum(x * x), {"double": x * 2, "parts": [x * 3, (x * 4,)], "label": "x"}
    g, aux = gf.grad(f, has_aux=True)(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(g, [2.0, 4.0])
    assert isinstance(aux["double"], np.ndarray) and isinstance(aux["parts"][1][0], np.ndarray)
    np.testing.assert_array_equal(aux["double"], [2.0, 4.0])
    np.testing.assert_array_equal(aux["parts"][0], [3.0, 6.0])
    np.testing.assert_array_equal(aux["parts"][1][0], [4.0, 8.0])
    assert aux["label"] == "x"


def test_an_aux_dict_comes_back_as_the_dict_type_f_returned():
    def f(w):
        metrics = defaultdict(float)
        metrics["loss"] = F.sum(w ** 2)
        return metrics["loss"], metrics
    g, aux = gf.grad(f, has_aux=True)(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(g, [2.0, 4.0])
    assert type(aux) is defaultdict and aux.default_factory is float
    assert float(aux["loss"]) == 5.0 and aux["accuracy"] == 0.0  # a missing key: the default
    _, ordered = gf.grad(lambda w: (F.sum(w), OrderedDict(b=w * 2, a=w)), has_aux=True)(
        gradcore.Variable(np.array([1.0])))
    assert type(ordered) is OrderedDict and list(ordered) == ["b", "a"]
    assert ordered["b"].creator is not None and ordered["b"].item() == 2.0


def test_a_namedtuple_result_comes_back_as_that_namedtuple():
    Pair = namedtuple("Pair", "square total")
    x = np.array([1.0, 2.0])
    f = lambda v: Pair(v * v, F.sum(v))  # noqa: E731
    _, tangent = gf.jvp(f, (x,), (np.array([1.0, 3.0]),))
    assert type(tangent) is Pair
    np.testing.assert_array_equal(tangent.square, [2.0, 12.0])  # 2 x t
    assert float(tangent.total) == 4.0
    for jac in (gf.jacobian, gf.jacfwd):
        J = jac(f, x)
        assert type(J) is Pair
        np.testing.assert_array_equal(J.square, np.diag(2 * x))
        np.testing.assert_array_equal(J.total, [1.0, 1.0])


def test_vjp_fn_of_several_results_wants_one_cotangent_per_result():
    # an array has a len too: taken as the tuple, it would be split into numbers
    x = np.array([1.0, 2.0])
    _, vjp_fn = gf.vjp(lambda a: (a * 2.0, a * a), x)
    with pytest.raises(TypeError, match="f returned a tuple of 2 results, so the cotangent must "
                                        "be a tuple of 2.*got ndarray"):
        vjp_fn(np.array([1.0, 2.0]))
    g, = vjp_fn([np.array([1.0, 0.0]), np.array([0.0, 1.0])])  # a list will do
    np.testing.assert_array_equal(g, [2.0, 4.0])  # 2 * (1, 0) + 2 x * (0, 1)


def test_a_stacked_cotangent_for_several_results_is_refused_with_how_to_pass_it():
    # refused as torch.func.vjp refuses it, but the message says what to pass instead
    x = np.array([1.0, 2.0, 3.0])
    _, vjp_fn = gf.vjp(lambda a: (a * 2.0, F.sin(a)), x)
    stacked = np.stack([np.ones(3), np.full(3, 0.5)])
    with pytest.raises(TypeError, match=r"got ndarray of shape \(2, 3\): an array stacked "
                                        r"along its first axis is not split; pass "
                                        r"tuple\(cotangent\), one row per result"):
        vjp_fn(stacked)
    g, = vjp_fn(tuple(stacked))  # as the message says
    np.testing.assert_allclose(g, 2.0 + 0.5 * np.cos(x), rtol=1e-15)
    with pytest.raises(TypeError, match=r"got ndarray of shape \(3,\)$"):
        vjp_fn(np.ones(3))  # not stacked: no such advice


def test_a_tangent_cotangent_or_v_of_the_wrong_shape_is_named():
    x = np.array([1.0, 2.0, 3.0])
    cube = lambda a: F.sum(a * a * a)  # noqa: E731
    with pytest.raises(ValueError, match=r"^hvp: v has shape \(2,\) but x has shape \(3,\)"):
        gf.hvp(cube, x, np.ones(2))
    with pytest.raises(ValueError, match=r"^hvp: v\[1\] has shape \(3,\) but x\[1\] has "
                                         r"shape \(2,\)"):
        gf.hvp(lambda a, b: cube(a) + cube(b), (x, x[:2]), (x, x))
    with pytest.raises(ValueError, match=r"^jvp: tangents\[1\] has shape \(2,\) but "
                                         r"primals\[1\] has shape \(3,\)"):
        gf.jvp(lambda a, b: a * b, (x, x), (x, np.ones(2)))
    _, vjp_fn = gf.vjp(lambda a: a * a, x)
    with pytest.raises(ValueError, match=r"^vjp_fn: the cotangent has shape \(2,\) but f's "
                                         r"result has shape \(3,\)"):
        vjp_fn(np.ones(2))
    _, vjp_fn = gf.vjp(lambda a: (a, F.sum(a)), x)
    with pytest.raises(ValueError, match=r"^vjp_fn: cotangent\[1\] has shape \(3,\) but "
                                         r"result 1 has shape \(\)"):
        vjp_fn((x, x))
    np.testing.assert_array_equal(gf.hvp(cube, x, 1.0), 6 * x)  # a number is spread over x
    np.testing.assert_array_equal(vjp_fn((x, 2.0))[0], x + 2.0)


# ================================================ users' own Functions
class RawCube(gradcore.Function):
    """x**3 with a DeZero-style backward, on raw arrays: right, but not differentiable again."""

    def forward(self, x):
        return x ** 3

    def backward(self, gy):
        x = self.inputs[0].data
        return 3 * x ** 2 * gy.data


class Cube(gradcore.Function):
    """The same, its backward written with gradcore's ops."""

    def forward(self, x):
        return x ** 3

    def backward(self, gy):
        x, = self.inputs
        return 3 * x ** 2 * gy


def test_forward_mode_through_a_backward_on_raw_arrays_is_refused_not_zero():
    # jvp is two reverse passes: the second differentiates backward. Before, a backward on raw
    # arrays was read as "f does not depend on x": jvp and jacfwd gave zeros, silently
    x = np.array([0.5, -1.2])
    message = (r"RawCube.backward is not differentiable: its gradient for input 0 was computed "
               r"on raw arrays .* write the backward with gradcore's ops")
    with pytest.raises(RuntimeError, match=message):
        gf.jvp(RawCube.apply, (x,), (np.ones(2),))
    with pytest.raises(RuntimeError, match=message):
        gf.jacfwd(RawCube.apply, x)
    with pytest.raises(RuntimeError, match=message):  # a backward recorded through it
        gf.hessian(lambda v: F.sum(RawCube.apply(v) ** 2), x)
    np.testing.assert_allclose(np.diag(gf.jacobian(RawCube.apply, x)), 3 * x ** 2, rtol=1e-15)
    _, tangent = gf.jvp(Cube.apply, (x,), (np.ones(2),))  # written with gradcore's ops
    np.testing.assert_allclose(tangent, 3 * x ** 2, rtol=1e-15)  # torch.func.jvp: 3 x^2
    np.testing.assert_allclose(gf.jacfwd(Cube.apply, x), np.diag(3 * x ** 2), rtol=1e-15)
    np.testing.assert_allclose(gf.hessian(lambda v: F.sum(Cube.apply(v) ** 2), x),
                               np.diag(30 * x ** 4), rtol=1e-14)  # d2 sum(x^6) = 30 x^4
    v = gradcore.Variable(x)  # first derivatives alone still come from the raw backward
    RawCube.apply(v).backward()
    np.testing.assert_allclose(v.grad.data, 3 * x ** 2, rtol=1e-15)


# ================================================ what f reads beside its point
def test_a_gradient_stays_differentiable_with_respect_to_what_f_reads_beside_its_point():
    """A gradient penalty: g = d/da sum(sin(a w)) = w cos(a w), and d/dw sum(g^2) =
    2w cos^2(aw) - 2a w^2 cos(aw) sin(aw) (torch.func.grad agrees), whether w is an argument
    not differentiated or a parameter f reads, and whatever the point a is."""
    a, w0 = np.array([0.3, -0.7, 1.1]), np.array([0.5, 2.0, -1.0])
    c, s = np.cos(a * w0), np.sin(a * w0)
    want = 2 * w0 * c ** 2 - 2 * a * w0 ** 2 * c * s
    f = lambda a, w: F.sum(F.sin(a * w))  # noqa: E731
    for point in (a, gradcore.Variable(a, requires_grad=False)):
        for gradient_at in (lambda w: gf.grad(f)(point, w),
                            lambda w: gf.value_and_grad(f)(point, w)[1],
                            lambda w: gf.grad(lambda a: f(a, w))(point),
                            lambda w: gf.grad(lambda a: (f(a, w), w), has_aux=True)(point)[0]):
            w = gradcore.Parameter(w0.copy())
            g = gradient_at(w)
            assert isinstance(g, gradcore.Variable)
            np.testing.assert_allclose(g.data, w0 * c, rtol=1e-14)
            F.sum(g * g).backward()
            np.testing.assert_allclose(w.grad.data, want, rtol=1e-12)
    # the value and an aux that depend on w stay differentiable: d/dw [f + sum(3w)] = a c + 3
    w = gradcore.Parameter(w0.copy())
    (value, aux), _ = gf.value_and_grad(lambda a: (f(a, w), w * 3.0), has_aux=True)(a)
    (value + F.sum(aux)).backward()
    np.testing.assert_allclose(w.grad.data, a * c + 3.0, rtol=1e-14)


def test_grad_passes_keyword_arguments_to_f_undifferentiated():
    """As torch.func.grad and jax.grad: d/da sum(sin(a) s) = s cos(a), and (a Variable among
    them) d/ds sum(s cos(a)) = sum(cos(a))."""
    x = np.array([0.3, -0.7])
    f = lambda a, scale=1.0: F.sum(F.sin(a) * scale)  # noqa: E731
    np.testing.assert_allclose(gf.grad(f)(x, scale=2.0), 2 * np.cos(x), rtol=1e-15)
    value, g = gf.value_and_grad(f)(x, scale=2.0)
    assert float(value) == pytest.approx(2 * np.sin(x).sum(), rel=1e-15)
    np.testing.assert_allclose(g, 2 * np.cos(x), rtol=1e-15)
    g, aux = gf.grad(lambda a, *, k: (F.sum(a * k), k), has_aux=True)(x, k=3.0)
    np.testing.assert_array_equal(g, [3.0, 3.0])
    assert aux == 3.0
    scale = gradcore.Variable(np.array(2.0))
    g = gf.grad(f)(x, scale=scale)
    assert isinstance(g, gradcore.Variable)
    F.sum(g).backward()
    np.testing.assert_allclose(scale.grad.data, np.cos(x).sum(), rtol=1e-15)


# ================================================ Jacobians: one evaluation, no identity
def test_jacfwd_evaluates_f_once():
    """Its columns come from one evaluation of f, as jacobian's rows do: one dropout mask, so
    row i of the Jacobian of dropout(broadcast(sum(a))) is all 2 m_i (torch.func.jacfwd
    refuses randomness instead)."""
    calls = []

    def f(a):
        calls.append(a)
        return F.dropout(F.broadcast_to(F.sum(a), (8,)), 0.5)
    gradcore.manual_seed(0)
    J = gf.jacfwd(f, np.linspace(0.1, 1.0, 6))
    assert len(calls) == 1
    assert J.shape == (8, 6) and set(np.unique(J)) <= {0.0, 2.0}
    np.testing.assert_array_equal(J, J[:, :1] * np.ones(6))  # each row one value
    calls.clear()
    ja, jb = gf.jacfwd(lambda a, b: F.sin(a) * b, (np.ones(2), np.full(2, 3.0)))
    np.testing.assert_allclose(ja, np.diag(3 * np.cos([1.0, 1.0])), rtol=1e-15)
    np.testing.assert_allclose(jb, np.diag(np.sin([1.0, 1.0])), rtol=1e-15)
    # through a Variable point it composes: the forward Jacobian of the gradient is the Hessian
    x = gradcore.Variable(np.array([0.5, -0.2]))
    H = gf.jacfwd(gf.grad(lambda a: F.sum(F.sin(a) * a)), x)
    np.testing.assert_allclose(H.data, np.diag(2 * np.cos(x.data) - x.data * np.sin(x.data)),
                               rtol=1e-14)
    F.sum(H).backward()  # d/dx (2 cos x - x sin x) = -3 sin x - x cos x
    np.testing.assert_allclose(x.grad.data, -3 * np.sin(x.data) - x.data * np.cos(x.data),
                               rtol=1e-14)


def test_jacobians_take_their_unit_vectors_one_at_a_time():
    """No identity matrix of f(x).size (or x.size) squared elements: 18 MB here, for a
    Jacobian of 12 kB."""
    import tracemalloc
    m = 1500
    c = np.linspace(0, 1, m)
    tracemalloc.start()
    try:
        J = gf.jacobian(lambda a: F.sin(a * c), np.array([0.5]))
        g = gf.jacfwd(lambda w: F.sum(F.sin(w)), c)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_allclose(J[:, 0], c * np.cos(0.5 * c), rtol=1e-14)
    np.testing.assert_allclose(g, np.cos(c), rtol=1e-14)
    assert peak < m * m * 8 / 4, f"peak {peak / 1e6:.1f} MB"


def test_a_jacobian_row_walks_no_graph_and_scatters_nothing(monkeypatch):
    """Per row, a backward pass and little else: a pass not recorded makes no graph, so none is
    walked to ask whether it reaches a Variable outside (f's result is walked once), and the
    unit vector is one item written into zeros, not an add_at."""
    walks = []
    walk = gf._reaches_outside
    monkeypatch.setattr(gf, "_reaches_outside", lambda *a: walks.append(a) or walk(*a))
    def add_at(*args):
        raise AssertionError("add_at called")
    monkeypatch.setattr(type(backends.NUMPY), "add_at", add_at)
    x = np.array([0.5, -0.2, 1.0, 2.0])
    for jac in (gf.jacobian, gf.jacfwd):
        walks.clear()
        np.testing.assert_allclose(jac(lambda a: F.sin(a) * 2.0, x), np.diag(2 * np.cos(x)),
                                   rtol=1e-15)
        assert len(walks) == 1, jac.__name__
    walks.clear()
    np.testing.assert_allclose(gf.grad(lambda a: F.sum(F.sin(a)))(x), np.cos(x), rtol=1e-15)
    assert len(walks) == 1


def test_jacobians_keep_the_dtype_and_device(xp):
    x = xp.asarray([0.5, -0.2, 1.0], dtype="float32")
    for jac in (gf.jacobian, gf.jacfwd):
        J = jac(lambda a: F.sin(a) * 2.0, x)
        assert backends_device(J) == xp.device and J.dtype == x.dtype
        np.testing.assert_allclose(xp.numpy(J), np.diag(2 * np.cos([0.5, -0.2, 1.0])),
                                   rtol=1e-6)


def test_misuse_is_refused_with_what_to_do_instead():
    x = np.array([0.3, -0.7])
    nested = lambda a: ((a, a * 2.0), a * 3.0)  # noqa: E731
    for call, where in ((lambda: gf.jacobian(nested, x), "jacobian"),
                        (lambda: gf.jacfwd(nested, x), "jacfwd"),
                        (lambda: gf.vjp(nested, x), "vjp"),
                        (lambda: gf.jvp(nested, (x,), (x,)), "jvp")):
        with pytest.raises(TypeError, match=rf"^{where}: f must return Variables or arrays, or "
                                            r"a flat tuple of them; got a tuple holding a tuple "
                                            r"at position 0: flatten it"):
            call()
    # None for a result or a primal one does not care about: refused, as torch.func does
    _, vjp_fn = gf.vjp(lambda a: (a, F.sum(a)), x)
    with pytest.raises(TypeError, match=r"^vjp_fn: cotangent\[1\] is None; pass an array "
                                        r"shaped like result 1, \(\) \(zeros where it "
                                        r"contributes nothing\)$"):
        vjp_fn((np.ones(2), None))
    with pytest.raises(TypeError, match=r"^jvp: tangents\[1\] is None; pass an array shaped "
                                        r"like primals\[1\], \(2,\) \(zeros"):
        gf.jvp(lambda a, b: a * b, (x, x), (np.ones(2), None))
    with pytest.raises(TypeError, match=r"^hvp: v is None"):
        gf.hvp(lambda a: F.sum(a * a), x, None)
    with pytest.raises(TypeError, match=r"f must return a pair \(result, aux\), got a tuple of "
                                        r"3; put the extra values in aux"):
        gf.grad(lambda a: (F.sum(a), a, a), has_aux=True)(x)


def test_vjp_fn_refuses_a_primal_written_after_f_ran_as_backward_does():
    """A Variable primal that requires no grad, written through gradcore (a.data -= 1: its
    version counts it): vjp_fn would compute d(a*b)/db with the new a, [0, 1]."""
    a = gradcore.Variable(np.array([1.0, 2.0]), requires_grad=False)
    _, vjp_fn = gf.vjp(lambda a, b: a * b, a, np.array([3.0, 4.0]))
    np.testing.assert_array_equal(vjp_fn(np.ones(2))[1], [1.0, 2.0])
    a.data -= 1
    with pytest.raises(RuntimeError, match=r"^mul: its input 0.*was written after mul ran"):
        vjp_fn(np.ones(2))
    assert not a.requires_grad  # the caller's Variable is left as it was


def test_transforming_is_true_while_a_transform_evaluates_f():
    """gradcore.compile reads it to run eagerly there, a tape's results holding no graph."""
    seen = []

    def f(a):
        seen.append(gf.transforming())
        return F.sum(a * a)
    assert not gf.transforming()
    gf.grad(f)(np.ones(2))
    gf.jacfwd(lambda a: gf.grad(f)(a), np.ones(2))
    assert seen == [True, True] and not gf.transforming()
    with pytest.raises(ZeroDivisionError):
        gf.vjp(lambda a: 1 / 0, np.ones(2))
    assert not gf.transforming()


def test_a_point_holding_no_data_is_refused_naming_the_transform():
    sum_of = lambda a: F.sum(a)  # noqa: E731
    for call, where in ((lambda p: gf.grad(sum_of)(p), "grad"),
                        (lambda p: gf.value_and_grad(sum_of)(p), "value_and_grad"),
                        (lambda p: gf.jacobian(F.sin, p), "jacobian"),
                        (lambda p: gf.jacfwd(F.sin, p), "jacfwd"),
                        (lambda p: gf.hessian(sum_of, p), "hessian"),
                        (lambda p: gf.hvp(sum_of, p, np.ones(2)), "hvp"),
                        (lambda p: gf.vjp(F.sin, p), "vjp"),
                        (lambda p: gf.jvp(F.sin, (p,), (np.ones(2),)), "jvp")):
        with pytest.raises(TypeError, match=rf"^{where}: argument 0 holds no data \(it is "
                                            r"None\); pass an array or a Variable holding one$"):
            call(None)
        with pytest.raises(TypeError, match=rf"^{where}: argument 0 holds no data \(a "
                                            r"Variable whose data is None\)"):
            call(gradcore.Variable(None))


def test_nested_transforms_of_arrays_give_arrays():
    """The inner grad's own variable for w (an array) is no Variable outside the outer
    transform: its results are arrays, d/dx 2 w sin(x) = diag(2 w cos(x))."""
    x, w = np.array([0.3, 0.7]), np.array([2.0, 3.0])
    f = lambda a, w: F.sum(F.sin(a) * w * w)  # noqa: E731
    d_dw = lambda a: gf.grad(f, 1)(a, w)  # noqa: E731
    expected = np.diag(2 * w * np.cos(x))
    for result, want in ((gf.jacobian(d_dw, x), expected), (gf.jacfwd(d_dw, x), expected),
                         (gf.grad(lambda a: F.sum(d_dw(a)))(x), expected.sum(0)),
                         (gf.hessian(lambda a: F.sum(d_dw(a) * a), x),
                          np.diag(2 * w * (2 * np.cos(x) - x * np.sin(x))))):
        assert type(result) is np.ndarray
        np.testing.assert_allclose(result, want, rtol=1e-14)


def test_an_f_returning_none_is_refused_naming_the_transform():
    x = np.array([0.3, 0.7])

    def forgot_return(a):
        F.sin(a)
    for call, where in ((lambda: gf.jacobian(forgot_return, x), "jacobian"),
                        (lambda: gf.jacfwd(forgot_return, x), "jacfwd"),
                        (lambda: gf.jvp(forgot_return, (x,), (x,)), "jvp"),
                        (lambda: gf.vjp(forgot_return, x), "vjp"),
                        (lambda: gf.grad(forgot_return)(x), "grad"),
                        (lambda: gf.jacobian(lambda a: (a, None), x), "jacobian")):
        with pytest.raises(TypeError, match=rf"^{where}: f must return Variables or arrays \(or "
                                            r"a tuple of them\), got NoneType; does it lack a "
                                            r"return statement\?$"):
            call()


def test_a_seed_on_another_device_is_refused_naming_the_transform_and_argument():
    from conftest import DEVICE1, STRICT
    x = STRICT.asarray(np.array([0.3, 0.7]), device=DEVICE1)
    on = "is on cpu but {} is on array_api_strict:device1; move it there first, e.g. "
    for call, message in (
            (lambda: gf.vjp(F.sin, x)[1](np.ones(2)), "vjp_fn: the cotangent " + on.format(
                "f's result") + "gradcore.Variable(cotangent).to('array_api_strict:device1')"),
            (lambda: gf.vjp(lambda a: (a, a), x)[1]((x, np.ones(2))),
             "vjp_fn: cotangent[1] " + on.format("result 1")
             + "gradcore.Variable(cotangent[1]).to('array_api_strict:device1')"),
            (lambda: gf.jvp(F.sin, (x,), (np.ones(2),)), "jvp: tangents[0] " + on.format(
                "primals[0]") + "gradcore.Variable(tangents[0]).to('array_api_strict:device1')"),
            (lambda: gf.hvp(lambda a: F.sum(F.sin(a)), x, np.ones(2)), "hvp: v " + on.format(
                "x") + "gradcore.Variable(v).to('array_api_strict:device1')")):
        with pytest.raises(ValueError) as error:
            call()
        assert str(error.value) == message


def test_a_seed_made_with_numpy_in_a_compiled_step_is_taken_and_replayed():
    """While a step records, f's result is a traced array: a cotangent, tangent or v the step
    made with NumPy is on its device all the same. With t = tanh x: d(2 t)/dx = 2 (1 - t^2),
    and the Hessian of sum(t^3) is diagonal, d2(t^3)/dx2 = 6 t (1 - t^2)^2 - 6 t^3 (1 - t^2)."""
    def steps():
        yield (lambda x: gf.vjp(lambda a: F.tanh(a) * 2.0, x)[1](np.ones(3))[0],
               lambda t: 2 * (1 - t * t))
        yield (lambda x: gf.jvp(lambda a: F.tanh(a) * 2.0, (x,), (np.ones(3),))[1],
               lambda t: 2 * (1 - t * t))
        for v in (lambda: np.ones(3), lambda: gradcore.Variable(np.ones(3))):
            yield (lambda x, v=v: gf.hvp(lambda a: F.sum(F.tanh(a) ** 3), x, v()),
                   lambda t: 6 * t * (1 - t * t) ** 2 - 6 * t ** 3 * (1 - t * t))
    for step, derivative in steps():
        compiled = gradcore.compile(step)
        for i in range(3):
            x = np.array([0.1, -0.5, 2.0]) + i
            got = compiled(x)
            np.testing.assert_allclose(getattr(got, "data", got), derivative(np.tanh(x)),
                                       rtol=1e-12)
        assert compiled.stats()["replays"] == 2 and compiled.stats()["eager calls"] == 0


def test_a_seed_of_another_library_on_a_device_of_the_same_name_names_both_libraries():
    """The message tells the two apart where their devices print alike."""
    class Other(type(backends.get_backend("numpy"))):
        name = "other"
    x = np.array([0.3, 0.7])
    cotangent = gradcore.Variable(np.ones(2))
    cotangent._backend = Other()
    with pytest.raises(ValueError) as error:
        gf.vjp(F.sin, x)[1](cotangent)
    assert str(error.value) == (
        "vjp_fn: the cotangent is on cpu (other) but f's result is on cpu (numpy); move it "
        "there first, e.g. gradcore.Variable(cotangent).to('cpu')")


def test_tuples_lists_and_dicts_of_arrays_are_refused_as_points():
    """Pytrees are not supported: NumPy would stack a tuple of arrays into one point."""
    a = np.array([1.0, 2.0])
    for call, where, kind, how in (
            (lambda: gf.grad(lambda p: F.sum(p[0] * p[1]))((a, a)), "grad", "tuple",
             "f(a, b) with argnums=(0, 1)"),
            (lambda: gf.grad(lambda p: F.sum(p["w"]))({"w": a}), "grad", "dict",
             "f(a, b) with argnums=(0, 1)"),
            (lambda: gf.jacobian(F.sin, [a, a]), "jacobian", "list", "f(a, b) with x=(a, b)"),
            (lambda: gf.vjp(F.sin, (a, a)), "vjp", "tuple", "vjp(f, a, b)"),
            (lambda: gf.jvp(F.sin, ((a, a),), (a,)), "jvp", "tuple", "jvp(f, (a, b), (ta, tb))")):
        with pytest.raises(TypeError) as error:
            call()
        assert str(error.value) == (
            f"{where}: argument 0 is a {kind}; a transform takes arrays and Variables, not "
            f"tuples, lists or dicts of them: pass each array as its own argument, {how}")
    # a list of numbers is one array's values, as NumPy reads it
    np.testing.assert_array_equal(gf.grad(lambda p: F.sum(p ** 3))([1.0, 2.0]), [3.0, 12.0])
    np.testing.assert_array_equal(gf.jacobian(lambda p: p ** 2, [[1.0], [2.0]]),
                                  np.diag([2.0, 4.0]).reshape(2, 1, 2, 1))


def test_backward_inside_a_transformed_function_is_refused():
    """It wrote the .grad of a closed-over Parameter ([0.5, -1, 2] where None) and of a Variable
    point; torch.func raises too. gradcore.grad inside f, and backward after, work."""
    W = gradcore.Parameter(np.ones(3))
    x = np.array([0.5, -1.0, 2.0])

    def loss(a):
        y = F.sum(a * W)
        y.backward()
        return y
    point = gradcore.Variable(x.copy())
    for call in (lambda: gf.grad(loss)(x), lambda: gf.grad(loss)(point),
                 lambda: gf.vjp(loss, x), lambda: gf.jvp(loss, (x,), (np.ones(3),)),
                 lambda: gf.jacobian(loss, x), lambda: gf.hessian(loss, x),
                 lambda: gf.grad(lambda a: F.sum(gf.grad(loss)(a)))(x)):
        with pytest.raises(RuntimeError, match=r"^backward: called inside a function that a "
                                               r"gradcore.func transform .*use gradcore.grad"):
            call()
        assert W.grad is None and point.grad is None and not gf.transforming()

    def inner_grad(a):
        y = F.sum(a * W)
        (gw,) = gradcore.grad(y, [W], create_graph=True)  # a
        return y + F.sum(gw)
    # W + 1; a Variable: it reaches W
    np.testing.assert_array_equal(gf.grad(inner_grad)(x).data, [2.0, 2.0, 2.0])
    assert W.grad is None
    F.sum(point * W).backward()
    np.testing.assert_array_equal(W.grad.data, x)


def test_a_checkpoint_inside_a_transform_computes_again_and_differentiates():
    """Its recomputation runs in the transform's walk, not a backward(): first and second order
    as without the checkpoint."""
    x = np.array([0.5, -1.0, 2.0])
    f = lambda a: F.sum(gradcore.checkpoint(lambda h: F.sin(h) * h, a))  # noqa: E731
    np.testing.assert_allclose(gf.grad(f)(x), np.sin(x) + x * np.cos(x), rtol=1e-14)
    np.testing.assert_allclose(gf.hessian(f, x), np.diag(2 * np.cos(x) - x * np.sin(x)),
                               rtol=1e-14)
