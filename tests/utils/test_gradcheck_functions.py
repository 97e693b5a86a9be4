"""gradcheck and gradgradcheck on users' own Functions: right ones pass, wrong ones are named."""
import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from gradcore import Function
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
    with pytest.raises(GradcheckError, match=r"d output 1\[1\] / d input 0\[1\]: backward gives 0, "
                                             r"central differences 1" if mode == "elements"
                       else "u . J v is 0 by backward"):
        gradcheck(lambda v: (constant * 2.0, _sin_and_statistic(v)[1]), x, mode=mode)
