"""gradcore.models: each architecture's output shape and its published parameter count."""
import numpy as np
import pytest

import gradcore
from gradcore import models

# Parameter counts as published (the torchvision models of the same architectures)
PUBLISHED = {"VGG16": 138_357_544, "ResNet18": 11_689_512, "ResNet34": 21_797_672,
             "ResNet50": 25_557_032, "ResNet101": 44_549_160, "ResNet152": 60_192_808}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_forward_shape_and_the_published_parameter_count(name):
    np.random.seed(0)
    model = getattr(models, name)()
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with gradcore.test_mode(), gradcore.no_grad():
        y = model(x)
    assert y.shape == (2, 1000) and y.dtype == np.float32
    assert np.isfinite(y.data).all()
    assert sum(p.size for p in model.params()) == PUBLISHED[name]


def test_a_resnet_trains_and_saves_without_pickle(tmp_path):
    np.random.seed(0)
    model = models.ResNet18(num_classes=3)
    opt = gradcore.optim.SGD(lr=0.05).setup(model)
    x = np.random.default_rng(1).standard_normal((4, 3, 32, 32)).astype(np.float32)
    t = np.array([0, 1, 2, 1])
    losses = []
    for _ in range(3):
        loss = gradcore.functions.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        opt.update()
        losses.append(float(loss.data))
    assert losses[-1] < losses[0]
    model.save(tmp_path / "resnet18.npz")
    clone = models.ResNet18(num_classes=3)
    clone.load(tmp_path / "resnet18.npz")
    with gradcore.test_mode(), gradcore.no_grad():
        np.testing.assert_array_equal(clone(x).data, model(x).data)


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_layers must be one of"):
        models.ResNet(20)
    with pytest.raises(ValueError, match="does not divide"):
        models.VGG16()(np.zeros((1, 3, 96, 96), np.float32))
