"""gradcore.utils.numerical_grad and gradient_check, on every backend."""
import numpy as np
import pytest

import backends
import gradcore
import gradcore.functions as F
from gradcore.utils import gradient_check, numerical_grad


# =============================================================================== numerical_grad
def test_numerical_grad_of_a_cube(xp):
    data = np.array([[-1.5, 0.5, 2.0], [1.0, -0.25, 3.0]])
    x = xp.asarray(data)
    g = numerical_grad(lambda v: F.sum(v * v * v), x)
    assert backends.backend_of(g) is xp.backend and xp.backend.device_of(g) == xp.device
    assert g.dtype == x.dtype and tuple(g.shape) == (2, 3)
    np.testing.assert_allclose(xp.numpy(g), 3 * data ** 2, rtol=1e-7)
    np.testing.assert_array_equal(xp.numpy(x), data)  # x itself is never modified


def test_numerical_grad_of_a_variable_and_a_0d_input(xp):
    x = gradcore.Variable(xp.asarray(0.5))
    g = numerical_grad(F.exp, x)
    assert tuple(g.shape) == ()
    np.testing.assert_allclose(xp.numpy(g), np.exp(0.5), rtol=1e-8)
    assert x.grad is None


def test_numerical_grad_passes_args_and_kwargs():
    def f(x, w, axis=None, scale=1.0):
        return F.sum(x * w, axis=axis) * scale

    x = np.arange(6.0).reshape(2, 3)
    w = np.array([1.0, 2.0, 3.0])
    g = numerical_grad(f, x, w, axis=0, scale=2.0)
    np.testing.assert_allclose(g, np.broadcast_to(2 * w, (2, 3)), rtol=1e-8)


def test_numerical_grad_copes_with_f_returning_a_view_of_its_input():
    # identity and reshape hand back arrays sharing memory with the perturbed copy
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(numerical_grad(lambda v: v, x), np.ones((2, 3)), rtol=1e-8)
    np.testing.assert_allclose(numerical_grad(lambda v: v.data.reshape(3, 2), x),
                               np.ones((2, 3)), rtol=1e-8)


def test_numerical_grad_keeps_float32():
    x = np.array([1.0, 2.0], dtype=np.float32)
    g = numerical_grad(lambda v: v * v, x)
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, [2.0, 4.0], rtol=1e-2)


def test_numerical_grad_divides_by_the_step_taken_in_x_dtype():
    # float32 at 1000 holds 1000 +- 1e-4 as points 2.44e-4 apart, not 2e-4: dividing by 2e-4
    # gave 1.2207 for the identity and 2500 for d x*x = 2000
    x = np.array([1000.0, 3.0, 0.1], dtype=np.float32)
    np.testing.assert_array_equal(numerical_grad(lambda v: v, x), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(numerical_grad(lambda v: v * 2.0, x), [2.0, 2.0, 2.0])
    g = numerical_grad(lambda v: v * v, x)  # what is left is float32's rounding of x * x
    np.testing.assert_allclose(g, 2 * x, rtol=0.03)
    assert g[0] == 2048.0


def test_numerical_grad_errors():
    with pytest.raises(TypeError, match="real floating dtype"):
        numerical_grad(F.exp, np.arange(3))
    with pytest.raises(TypeError, match="must be a Variable or an array, got list"):
        numerical_grad(F.exp, [1.0, 2.0])
    with pytest.raises(TypeError, match="f must return a Variable or an array"):
        numerical_grad(lambda v: 3.0, np.ones(2))


# =============================================================================== gradient_check
def test_gradient_check_passes_for_correct_ops(xp):
    rng = np.random.default_rng(0)
    x = gradcore.Variable(xp.asarray(rng.uniform(0.5, 2.0, (2, 3)), dtype="float32"))
    w = xp.asarray(rng.standard_normal((3, 4)))
    assert gradient_check(F.tanh, x) is True
    assert gradient_check(lambda v: F.matmul(F.log(v), w), x) is True
    assert gradient_check(lambda v: F.sum(v * v, axis=1), x) is True
    # the check runs on a float64 copy: the caller's Variable is untouched
    assert x.dtype == xp.float32 and x.grad is None


def test_gradient_check_accepts_arrays_args_and_kwargs():
    x = np.linspace(-1.0, 1.0, 5)
    assert gradient_check(lambda v, c, power=2: F.pow(v + c, power), x, 3.0, power=3)
    assert gradient_check(lambda v: F.sum(v), np.array(2.0))


def test_gradient_check_ignores_x_when_f_does_not_use_it():
    c = gradcore.Variable(np.ones(3))
    assert gradient_check(lambda v: c * 2.0, np.ones(3)) is True


class _WrongTanh(F.Tanh):
    """tanh whose backward forgets the square."""

    def backward(self, gy):
        y = self.outputs[0]()
        return gy * (1 - y)


def test_gradient_check_fails_and_says_why(xp, capsys):
    x = gradcore.Variable(xp.asarray(np.array([[0.5, -1.0], [1.5, 0.25]])))
    assert gradient_check(lambda v: _WrongTanh()(v), x) is False
    out = capsys.readouterr().out
    assert "gradient_check FAILED" in out
    assert "numerical grad:" in out and "backward grad:" in out
    assert "worst element (0, 1): numerical 0.419974, backward 1.76159" in out


def test_gradient_check_tolerances_are_used():
    # a gradient off by a relative 1e-3 passes with rtol=1e-2 and fails with the default
    class Scaled(F.Square):
        def backward(self, gy):
            x, = self.inputs
            return gy * x * 2.002

    x = np.array([1.0, 2.0])
    assert gradient_check(lambda v: Scaled()(v), x, rtol=1e-2) is True
    assert gradient_check(lambda v: Scaled()(v), x) is False


def test_gradient_check_needs_a_variable_from_f():
    with pytest.raises(TypeError, match="f must return a Variable"):
        gradient_check(lambda v: v.data * 2.0, np.ones(2))
