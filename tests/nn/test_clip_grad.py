"""clip_grad_norm_ and clip_grad_value_: PyTorch's results, on every backend."""
import math

import numpy as np
import pytest

import gradcore
from conftest import CASES
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


def param_with_grad(xp, values, dtype):
    p = gradcore.Parameter(xp.asarray(np.zeros(len(values)), dtype))
    p.grad = gradcore.Variable(xp.asarray(values, dtype), requires_grad=False)
    return p


@pytest.mark.parametrize("float64_first", [False, True])
def test_clip_grad_norm_sums_in_the_widest_dtype_in_either_order(xp2, float64_first):
    # [1e20] squared overflows float32: summed in float64 the norm is 1e20, the scale 1e-20
    small = param_with_grad(xp2, [3e-10, 4e-10], "float32")
    big = param_with_grad(xp2, [1e20], "float64")
    total = clip_grad_norm_([big, small] if float64_first else [small, big], 1.0)
    assert total.dtype == xp2.float64 and total.device == xp2.device
    np.testing.assert_allclose(float(xp2.numpy(total.data)), 1e20, rtol=1e-12)
    np.testing.assert_allclose(xp2.numpy(big.grad.data), [1.0], rtol=1e-12)
    np.testing.assert_allclose(xp2.numpy(small.grad.data), [3e-30, 4e-30], rtol=1e-5)
    assert small.grad.dtype == xp2.float32 and big.grad.dtype == xp2.float64


def test_a_float32_gradient_past_float32s_square_beside_a_float64_one_is_not_zeroed(xp2):
    # 1e20 ** 2 overflows float32 before the sum: each part is taken in the total's dtype
    big = param_with_grad(xp2, [1e20], "float32")
    other = param_with_grad(xp2, [1.0], "float64")
    total = clip_grad_norm_([big, other], 1.0)
    np.testing.assert_allclose(float(xp2.numpy(total.data)), 1e20, rtol=1e-6)
    np.testing.assert_allclose(xp2.numpy(big.grad.data), [1.0], rtol=1e-6)
    np.testing.assert_allclose(xp2.numpy(other.grad.data), [1e-20], rtol=1e-6)


def test_clip_grad_norm_scales_float64_by_a_float64_factor(xp2):
    # a float32 gradient first: the float64 one is still scaled by 2.5 / (5 + 1e-6) in float64
    # (a float32-rounded factor is 3.7e-8 off)
    params = [param_with_grad(xp2, [3.0], "float32"), param_with_grad(xp2, [4.0], "float64")]
    clip_grad_norm_(params, 2.5)
    np.testing.assert_allclose(xp2.numpy(params[1].grad.data), [4.0 * 2.5 / (5.0 + 1e-6)],
                               rtol=1e-15)


@pytest.mark.parametrize("names", [("strict", "strict-device1"), ("strict-device1", "strict")])
def test_clip_grad_norm_over_devices_and_dtypes(names):
    first, second = (CASES[name]() for name in names)
    params = [param_with_grad(first, [3.0], "float32"), param_with_grad(second, [4.0], "float64")]
    total = clip_grad_norm_(params, 2.5)
    assert total.device == first.device and total.dtype == first.float64
    assert float(first.numpy(total.data)) == 5.0
    for p, case, g in zip(params, (first, second), (3.0, 4.0)):
        assert p.grad.device == case.device
        np.testing.assert_allclose(case.numpy(p.grad.data), [g * 2.5 / (5.0 + 1e-6)], rtol=1e-7)


# ============================================================ found by a review
def test_a_parameter_listed_twice_counts_once(xp2):
    # a tied weight in list(enc.parameters()) + list(dec.parameters()): counted twice, the norm
    # was 7.07 for 5 and the gradient scaled twice (|P.grad| 0.1 for max_norm 1)
    P, Q = param_with_grad(xp2, [3.0, 4.0], "float64"), param_with_grad(xp2, [0.0], "float64")
    total = clip_grad_norm_([P, Q, P], 1.0)
    assert float(xp2.numpy(total.data)) == 5.0
    np.testing.assert_allclose(xp2.numpy(P.grad.data), [3 / (5 + 1e-6), 4 / (5 + 1e-6)],
                               rtol=1e-15)
    P = param_with_grad(xp2, [3.0, -4.0], "float64")
    clip_grad_value_([P, P], 1.0)
    np.testing.assert_array_equal(xp2.numpy(P.grad.data), [1.0, -1.0])


@pytest.mark.parametrize("max_norm", [-1.0, math.nan])
def test_a_negative_or_nan_max_norm_is_refused(max_norm):
    # -1 reversed every gradient, NaN made them NaN
    P = param_with_grad(np, [3.0, 4.0], "float64")
    with pytest.raises(ValueError, match=f"max_norm must be >= 0 .*, got {max_norm}"):
        clip_grad_norm_([P], max_norm)
    np.testing.assert_array_equal(P.grad.data, [3.0, 4.0])
    with pytest.raises(ValueError, match="clip_value must be >= 0, got nan"):
        clip_grad_value_([P], math.nan)


def test_max_norm_inf_returns_the_norm_and_scales_nothing():
    P = param_with_grad(np, [3.0, np.inf], "float64")
    assert float(clip_grad_norm_([P], math.inf).data) == math.inf
    np.testing.assert_array_equal(P.grad.data, [3.0, np.inf])  # not [nan, nan]


def test_a_model_or_one_variable_is_accepted_and_anything_else_is_told_what_to_pass():
    model = gradcore.nn.Linear(2, in_size=3)
    model.W.grad = gradcore.Variable(np.full((3, 2), 10.0, np.float32), requires_grad=False)
    total = clip_grad_norm_(model, 1.0)
    np.testing.assert_allclose(float(total.data), np.sqrt(6) * 10, rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(model.W.grad.data), 1.0, rtol=1e-5)
    clip_grad_value_(model, 0.1)
    np.testing.assert_array_equal(model.W.grad.data, np.full((3, 2), 0.1, np.float32))

    class Dezero:  # DeZero's params()
        def __init__(self):
            self.P = param_with_grad(np, [3.0, 4.0], "float64")

        def params(self):
            yield self.P
    layer = Dezero()
    assert float(clip_grad_norm_(layer, 1.0).data) == 5.0
    P = param_with_grad(np, [3.0, 4.0], "float64")
    assert float(clip_grad_norm_(P, 1.0).data) == 5.0
    np.testing.assert_allclose(P.grad.data, [3 / (5 + 1e-6), 4 / (5 + 1e-6)], rtol=1e-15)
    for bad, message in [(1.0, "a model .* a Variable, or an iterable of Variables.*got float"),
                         (np.ones(2), "got ndarray"),
                         (gradcore.nn.Linear, "got the class Linear, not a model"),
                         ([P, np.ones(2)], "item 1 is a ndarray")]:
        with pytest.raises(TypeError, match=message):
            clip_grad_norm_(bad, 1.0)
        with pytest.raises(TypeError, match=message):
            clip_grad_value_(bad, 1.0)


@pytest.mark.parametrize("norm_type", [2.0, 3.0])
def test_float32_gradients_whose_powers_overflow_still_give_their_norm(xp2, norm_type):
    # 3e19 ** 2 is past float32's largest: the norm was inf and every gradient zeroed
    P = param_with_grad(xp2, [3e19, 4e19], "float32")
    other = param_with_grad(xp2, [0.0], "float32")
    total = clip_grad_norm_([P, other], 1.0, norm_type=norm_type)
    expected = (3.0 ** norm_type + 4.0 ** norm_type) ** (1 / norm_type) * 1e19
    assert total.dtype == xp2.float32
    np.testing.assert_allclose(float(xp2.numpy(total.data)), expected, rtol=1e-6)
    np.testing.assert_allclose(xp2.numpy(P.grad.data), [3e19 / expected, 4e19 / expected],
                               rtol=1e-6)


def test_float16_gradients_give_their_p_norm():
    P = param_with_grad(np, [300.0, 400.0], "float16")
    total = clip_grad_norm_([P], 1.0, norm_type=3.0)
    expected = (300.0 ** 3 + 400.0 ** 3) ** (1 / 3)
    np.testing.assert_allclose(float(total.data), expected, rtol=1e-6)
    np.testing.assert_allclose(P.grad.data.astype(np.float64), [300 / expected, 400 / expected],
                               rtol=1e-3)


def test_a_norm_past_float32s_range_comes_back_inf_with_the_gradients_still_scaled():
    P = param_with_grad(np, [3e38, 3e38], "float32")
    with pytest.warns(RuntimeWarning, match="overflow"):
        total = clip_grad_norm_([P], 1.0)
    assert float(total.data) == math.inf
    np.testing.assert_allclose(P.grad.data, [2 ** -0.5] * 2, rtol=1e-6)


def test_tiny_and_zero_gradients_keep_their_norm():
    # scaled by the largest magnitude, a subnormal one neither overflows nor becomes 0 / 0
    P = param_with_grad(np, [1e-45, 0.0], "float32")
    assert float(clip_grad_norm_([P], 1.0).data) == float(np.float32(1e-45))
    Z = param_with_grad(np, [0.0, 0.0], "float32")
    assert float(clip_grad_norm_([Z], 1.0).data) == 0.0
    np.testing.assert_array_equal(Z.grad.data, [0.0, 0.0])
    empty = param_with_grad(np, [], "float32")
    full = param_with_grad(np, [3.0, -4.0], "float32")
    assert float(clip_grad_norm_([empty, full], 10.0, norm_type=math.inf).data) == 4.0
