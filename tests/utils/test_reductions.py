"""DeZero's dezero.utils helpers for reductions on raw arrays: max_backward_shape,
reshape_sum_backward, logsumexp."""
import numpy as np
import pytest

import gradcore
from gradcore import utils


def test_max_backward_shape_keeps_the_reduced_axes_as_ones():
    x = np.zeros((2, 3, 4))
    assert utils.max_backward_shape(x, 1) == (2, 1, 4)
    assert utils.max_backward_shape(x, (0, -1)) == (1, 3, 1)
    assert utils.max_backward_shape(x, None) == (1, 1, 1)
    assert utils.max_backward_shape(gradcore.Variable(x), [2]) == (2, 3, 1)
    with pytest.raises(ValueError, match="axis 3 is out of range"):
        utils.max_backward_shape(x, 3)


def test_reshape_sum_backward_broadcasts_back_to_the_input(xp):
    gy = xp.asarray([1.0, 2.0])  # the gradient of x.sum(axis=1) for an x of shape (2, 3)
    g = utils.reshape_sum_backward(gy, (2, 3), 1, False)
    assert tuple(g.shape) == (2, 1)
    np.testing.assert_array_equal(xp.numpy(g), [[1.0], [2.0]])
    assert tuple(utils.reshape_sum_backward(xp.asarray([5.0]), (2, 3), (0, 1), False).shape) \
        == (1, 1)  # a tuple of axes (DeZero's helper took it as one axis)
    kept = xp.asarray([[1.0, 2.0, 3.0]])
    assert utils.reshape_sum_backward(kept, (2, 3), 0, True) is kept
    v = gradcore.Variable(np.array([1.0, 2.0, 3.0]))  # a Variable: the reshape is recorded
    w = utils.reshape_sum_backward(v, (2, 3), -2, False)
    assert w.shape == (1, 3) and w.creator is not None
    (w * np.array([[2.0, 3.0, 4.0]])).sum().backward()
    np.testing.assert_array_equal(v.grad.data, [2.0, 3.0, 4.0])


def test_logsumexp_on_a_raw_array_keeps_the_axis(xp):
    x = xp.asarray([[0.0, np.log(3.0)], [1000.0, 1000.0]])
    y = utils.logsumexp(x)  # DeZero's default axis=1
    assert tuple(y.shape) == (2, 1) and not isinstance(y, gradcore.Variable)
    # log(1 + 3) = log 4; log(2 e^1000) = 1000 + log 2, with no overflow
    np.testing.assert_allclose(xp.numpy(y), [[np.log(4.0)], [1000.0 + np.log(2.0)]], rtol=1e-12)
    np.testing.assert_allclose(xp.numpy(utils.logsumexp(x, axis=0)),
                               [[1000.0, 1000.0]], rtol=1e-12)
    with pytest.raises(TypeError, match=r"logsumexp: expected an array, got "
                       r"gradcore\.variable\.Variable \(for a Variable use gradcore\.functions\)"):
        utils.logsumexp(gradcore.Variable(np.ones((2, 2))))
