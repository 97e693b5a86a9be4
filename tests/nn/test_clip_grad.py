"""clip_grad_norm_ and clip_grad_value_: PyTorch's results, on every backend."""
import math

import numpy as np
import pytest

import gradcore
from gradcore.nn.utils import clip_grad_norm_, clip_grad_value_


def params_with_grads(xp, scale):
    rng = np.random.default_rng(0)
    params = []
    for shape in ((3, 4), (4,), (2, 2)):
        p = gradcore.Parameter(xp.asarray(rng.standard_normal(shape)))
        p.grad = gradcore.Variable(xp.asarray(rng.standard_normal(shape) * scale))
        params.append(p)
    return params


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("scale", [0.01, 10.0])
def test_clip_grad_norm_scales_all_gradients_together(xp2, norm_type, scale):
    params = params_with_grads(xp2, scale)
    grads = [xp2.numpy(p.grad.data) for p in params]
    flat = np.concatenate([g.reshape(-1) for g in grads])
    expected_norm = np.max(np.abs(flat)) if norm_type == math.inf else np.sum(
        np.abs(flat) ** norm_type) ** (1 / norm_type)
    total = clip_grad_norm_(params, max_norm=1.0, norm_type=norm_type)
    assert total.device == xp2.device
    np.testing.assert_allclose(float(xp2.numpy(total.data)), expected_norm, rtol=1e-12)
    factor = min(1.0 / (expected_norm + 1e-6), 1.0)
    for p, g in zip(params, grads):
        np.testing.assert_allclose(xp2.numpy(p.grad.data), g * factor, rtol=1e-12)


def test_clip_grad_norm_agrees_with_pytorch():
    torch = pytest.importorskip("torch")
    params = params_with_grads(np, 10.0)
    tensors = [torch.nn.Parameter(torch.tensor(p.data)) for p in params]
    for t, p in zip(tensors, params):
        t.grad = torch.tensor(p.grad.data)
    total = clip_grad_norm_(params, 2.5)
    expected = torch.nn.utils.clip_grad_norm_(tensors, 2.5)
    np.testing.assert_allclose(total.data, expected.numpy(), rtol=1e-12)
    for p, t in zip(params, tensors):
        np.testing.assert_allclose(p.grad.data, t.grad.numpy(), rtol=1e-12)


def test_clip_grad_value_and_the_errors(xp2):
    params = params_with_grads(xp2, 3.0)
    before = [xp2.numpy(p.grad.data) for p in params]
    clip_grad_value_(params, 0.5)
    for p, g in zip(params, before):
        np.testing.assert_array_equal(xp2.numpy(p.grad.data), np.clip(g, -0.5, 0.5))
    bad = params_with_grads(xp2, 1.0)
    bad[0].grad = gradcore.Variable(xp2.asarray(np.full((3, 4), np.nan)))
    with pytest.raises(RuntimeError, match="total norm of the gradients is nan"):
        clip_grad_norm_(bad, 1.0, error_if_nonfinite=True)
    with pytest.raises(ValueError, match="norm_type must be positive"):
        clip_grad_norm_(params, 1.0, norm_type=0)
    assert float(clip_grad_norm_([gradcore.Parameter(np.ones(2))], 1.0).data) == 0.0
