"""nn.init: shapes, bounds and statistics, on the parameter's device, repeatable by seed."""
import math

import numpy as np
import pytest

import gradcore
from gradcore.nn import init


def parameter(xp, shape, dtype="float32"):
    return gradcore.Parameter(xp.asarray(np.zeros(shape), dtype=dtype))


def test_constants(xp2):
    p = parameter(xp2, (3, 4))
    assert init.ones_(p) is p and np.array_equal(xp2.numpy(p.data), np.ones((3, 4)))
    init.constant_(p, 2.5)
    assert np.array_equal(xp2.numpy(p.data), np.full((3, 4), 2.5)) and p.version == 2
    init.zeros_(p)
    assert not xp2.numpy(p.data).any() and p.device == xp2.device
    assert xp2.numpy(p.data).dtype == np.float32


@pytest.mark.parametrize("fill, check", [
    (lambda p: init.uniform_(p, -2.0, 3.0), lambda a: -2 <= a.min() and a.max() < 3),
    (lambda p: init.normal_(p, 1.0, 0.5), lambda a: abs(a.mean() - 1) < 0.01
     and abs(a.std() - 0.5) < 0.01),
    # W is (in, out): fan_in 400, fan_out 100
    (lambda p: init.xavier_uniform_(p), lambda a: abs(a).max() <= math.sqrt(6 / 500)
     and abs(a.std() - math.sqrt(2 / 500)) < 0.002),
    (lambda p: init.xavier_normal_(p, gain=2.0), lambda a: abs(a.std() - 2 * math.sqrt(2 / 500))
     < 0.003),
    (lambda p: init.kaiming_uniform_(p, nonlinearity="relu"),
     lambda a: abs(a).max() <= math.sqrt(6 / 400) and abs(a.std() - math.sqrt(2 / 400)) < 0.002),
    (lambda p: init.kaiming_normal_(p, mode="fan_out", nonlinearity="relu"),
     lambda a: abs(a.std() - math.sqrt(2 / 100)) < 0.003),
])
def test_random_fills_have_their_distribution(xp2, fill, check):
    p = parameter(xp2, (400, 100))
    fill(p)
    a = xp2.numpy(p.data).astype(np.float64)
    assert a.shape == (400, 100) and p.device == xp2.device
    assert xp2.numpy(p.data).dtype == np.float32
    assert check(a)


def test_orthogonal(xp2):
    for shape in ((6, 4), (4, 6), (8, 2, 3)):
        p = init.orthogonal_(parameter(xp2, shape, "float64"), gain=1.5)
        q = xp2.numpy(p.data).reshape(shape[0], -1) / 1.5
        small = min(q.shape)
        gram = q.T @ q if q.shape[0] >= q.shape[1] else q @ q.T
        np.testing.assert_allclose(gram, np.eye(small), atol=1e-12)


def test_a_seed_repeats_the_draw():
    a, b = parameter(np, (5, 5)), parameter(np, (5, 5))
    gradcore.manual_seed(3)
    init.kaiming_uniform_(a)
    gradcore.manual_seed(3)
    init.kaiming_uniform_(b)
    assert np.array_equal(a.data, b.data)


def test_fans_follow_gradcores_layouts_and_errors_say_what_to_do():
    conv = parameter(np, (8, 3, 3, 3), "float64")  # out, in, kh, kw: fan_in 27, fan_out 72
    init.kaiming_normal_(conv, nonlinearity="relu")
    assert abs(conv.data.std() - math.sqrt(2 / 27)) < 0.1
    assert init.calculate_gain("leaky_relu", 0.2) == math.sqrt(2 / 1.04)
    with pytest.raises(ValueError, match="no data yet.*call the model once"):
        init.normal_(gradcore.Parameter(None))
    with pytest.raises(ValueError, match="2 or more axes"):
        init.xavier_uniform_(parameter(np, (4,)))
    with pytest.raises(ValueError, match="unknown nonlinearity 'swish'"):
        init.calculate_gain("swish")
