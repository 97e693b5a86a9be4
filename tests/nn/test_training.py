"""A DeZero-style training loop (MLP, mean squared error, manual SGD) lowers the loss, and runs
the same on NumPy and on array-api-strict device1."""
import numpy as np

import gradcore
import gradcore.functions as F
from gradcore.models import MLP


def train(xp, steps=300, lr=0.2):
    """DeZero step 45's loop on y = sin(2 pi x) + noise; returns the losses."""
    rng = np.random.default_rng(0)
    x_np = rng.random((100, 1))
    y_np = np.sin(2 * np.pi * x_np) + rng.random((100, 1))
    x, y = xp.asarray(x_np), xp.asarray(y_np)
    gradcore.manual_seed(0)  # NumPy's generator, and CuPy's: the weights are drawn on xp's device
    model = MLP((10, 1))
    losses = []
    for _ in range(steps):
        loss = F.mean_squared_error(model(x), y)
        model.cleargrads()
        loss.backward()
        for p in model.params():
            p.data -= lr * p.grad.data
        losses.append(float(xp.numpy(loss.data)))
    assert all(p.device == xp.device for p in model.params())
    return losses


def test_training_lowers_the_loss(xp2):
    losses = train(xp2)
    assert losses[-1] < 0.5 * losses[0]
    assert all(b <= a + 1e-12 for a, b in zip(losses[::50], losses[50::50]))  # steadily down


def test_training_is_the_same_on_every_device():
    from conftest import CASES

    np.testing.assert_allclose(train(CASES["numpy"](), steps=20),
                               train(CASES["strict-device1"](), steps=20), rtol=1e-12)
