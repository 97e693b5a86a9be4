"""Optimizers on real gradcore.nn modules: lazy DeZero layers, and Module.to moving the state."""
import numpy as np

import backends
import gradcore
import gradcore.functions as F
import gradcore.nn as nn
from conftest import DEVICE1
from gradcore.optim import Adam, MomentumSGD

X = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
Y = X.sum(axis=1, keepdims=True)


def train(model, optimizer, x, y, steps):
    for _ in range(steps):
        loss = F.mean_squared_error(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.item())


def test_linear_trained_on_numpy_then_moved_to_device1_keeps_its_adam_state():
    gradcore.manual_seed(0)
    reference, model = nn.Linear(3, 1), nn.Linear(3, 1)
    model.W.data[...] = reference.W.data  # the same start; b is zeros in both
    expected = train(reference, Adam(reference.parameters(), lr=0.05), X, Y, 6)

    optimizer = Adam(model.parameters(), lr=0.05)
    train(model, optimizer, X, Y, 3)
    model.to(DEVICE1)  # parameters and gradients move; the optimizer's state follows them
    x, y = backends.to_device(X, DEVICE1), backends.to_device(Y, DEVICE1)
    last = train(model, optimizer, x, y, 3)
    assert abs(last - expected) <= 1e-5 * abs(expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert p.device == DEVICE1 and p.numpy().dtype == np.float32
        for a in optimizer.state[p].values():
            assert backends.backend_of(a).device_of(a) == DEVICE1 and a.dtype == p.dtype
        np.testing.assert_allclose(p.numpy(), q.data, rtol=1e-5, atol=1e-7)


def test_dezero_style_setup_before_a_lazy_layer_has_its_weights():
    gradcore.manual_seed(1)
    model = nn.Linear(1)  # in_size learned from the first input
    optimizer = MomentumSGD(lr=0.05).setup(model)
    losses = [train(model, optimizer, X, Y, 1) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    assert len(optimizer.state) == 2
