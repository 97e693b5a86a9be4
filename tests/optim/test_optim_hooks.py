"""Optimizer hooks: WeightDecay, ClipGrad, FreezeParam, and hooks in general."""
import math
import weakref

import numpy as np
import pytest

import gradcore
from conftest import CASES
from gradcore.optim import SGD, Adam, ClipGrad, FreezeParam, MomentumSGD, WeightDecay


def param(xp, values):
    return gradcore.Parameter(xp.asarray(values))


def give_grad(p, xp, values):
    p.grad = gradcore.Variable(xp.asarray(values), requires_grad=False)
    return p.grad


def test_weight_decay_adds_rate_times_param_to_the_gradient(xp2):
    W = param(xp2, [1.0, -2.0])
    g = give_grad(W, xp2, [0.5, -1.0])
    optimizer = SGD(lr=0.5).setup([W])
    optimizer.add_hook(WeightDecay(0.1))
    optimizer.update()
    # grad + 0.1 * W = [0.6, -1.2];  W - 0.5 * [0.6, -1.2] = [0.7, -1.4]
    np.testing.assert_allclose(xp2.numpy(W.grad.data), [0.6, -1.2], rtol=1e-12)
    np.testing.assert_allclose(xp2.numpy(W.data), [0.7, -1.4], rtol=1e-12)
    np.testing.assert_array_equal(xp2.numpy(g.data), [0.5, -1.0])  # the old grad untouched


def test_weight_decay_leaves_a_shared_gradient_alone():
    # backward of a + b may hand both inputs one gradient object: decaying a's must not change b's
    a = gradcore.Parameter(np.array([1.0, 2.0]))
    b = gradcore.Parameter(np.array([3.0, 4.0]))
    shared = gradcore.Variable(np.array([1.0, 1.0]), requires_grad=False)
    a.grad = b.grad = shared
    optimizer = SGD([a], lr=1.0)
    optimizer.add_hook(WeightDecay(0.5))
    optimizer.step()
    np.testing.assert_array_equal(a.data, [1.0 - 1.5, 2.0 - 2.0])
    np.testing.assert_array_equal(b.grad.data, [1.0, 1.0])


@pytest.mark.parametrize("hook", ["WeightDecay", "ClipGrad"])
def test_hooks_on_float16_round_their_gradient_once(hook):
    """A float16 parameter's new gradient is computed in float32, as its update is, and rounded
    once: grad + rate * p in float16 rounded rate * p first, and 46,151 of 100,000 sums came
    out otherwise than the float64 sum rounded to float16 (rate 0.37; rounded from float32,
    none)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(10000) * 10).astype(np.float16)
    g = rng.standard_normal(10000).astype(np.float16)
    p = gradcore.Parameter(w.copy())
    p.grad = gradcore.Variable(g.copy(), requires_grad=False)
    if hook == "WeightDecay":
        WeightDecay(0.37)([p])
        want = g.astype(np.float32) + np.float32(0.37) * w.astype(np.float32)
    else:
        norm = float(np.sqrt(np.sum(np.square(g.astype(np.float32)))))  # clip_grad_norm_'s
        ClipGrad(0.37 * norm)([p])
        want = g.astype(np.float32) * np.float32(0.37 * norm / (norm + 1e-6))
    assert p.grad.dtype == np.float16
    np.testing.assert_array_equal(p.grad.data, want.astype(np.float16))


def test_clip_grad_scales_all_gradients_to_max_norm(xp2):
    W, b = param(xp2, [0.0, 0.0]), param(xp2, [0.0, 0.0])
    give_grad(W, xp2, [3.0, 0.0])
    give_grad(b, xp2, [0.0, 4.0])  # global norm 5
    optimizer = SGD([W, b], lr=1.0)
    optimizer.add_hook(ClipGrad(1.0))
    optimizer.step()
    rate = 1.0 / (5.0 + 1e-6)  # DeZero's max_norm / (norm + 1e-6)
    np.testing.assert_allclose(xp2.numpy(W.grad.data), [3.0 * rate, 0.0], rtol=1e-12)
    np.testing.assert_allclose(xp2.numpy(b.grad.data), [0.0, 4.0 * rate], rtol=1e-12)
    np.testing.assert_allclose(xp2.numpy(W.data), [-3.0 * rate, 0.0], rtol=1e-12)
    np.testing.assert_allclose(xp2.numpy(b.data), [0.0, -4.0 * rate], rtol=1e-12)


def test_clip_grad_leaves_small_gradients_alone(xp2):
    W = param(xp2, [0.0, 0.0])
    g = give_grad(W, xp2, [3.0, 4.0])
    optimizer = SGD([W], lr=1.0)
    optimizer.add_hook(ClipGrad(10.0))
    optimizer.step()
    assert W.grad is g
    np.testing.assert_array_equal(xp2.numpy(W.data), [-3.0, -4.0])


def test_clip_grad_with_a_nan_gradient_makes_every_gradient_nan(xp2):
    """As clip_grad_norm_ does: the norm is NaN, and the other gradients were applied unclipped
    (a step of norm 5 for max_norm 1), the NaN unseen in them."""
    W, b = param(xp2, [0.0, 0.0]), param(xp2, [0.0, 0.0])
    give_grad(W, xp2, [3.0, 4.0])
    give_grad(b, xp2, [float("nan"), 1.0])
    optimizer = SGD([W, b], lr=1.0)
    optimizer.add_hook(ClipGrad(1.0))
    optimizer.step()
    assert np.isnan(xp2.numpy(W.data)).all() and np.isnan(xp2.numpy(b.data)).all()


def test_clip_grad_norm_spans_devices():
    device1 = CASES["strict-device1"]()
    cpu = CASES["numpy"]()
    W, b = param(cpu, [0.0]), param(device1, [0.0])
    give_grad(W, cpu, [3.0])
    give_grad(b, device1, [4.0])
    optimizer = SGD([W, b], lr=1.0)
    optimizer.add_hook(ClipGrad(2.5))  # norm 5 -> half
    optimizer.step()
    np.testing.assert_allclose(W.data, [-1.5], rtol=1e-6)
    np.testing.assert_allclose(device1.numpy(b.data), [-2.0], rtol=1e-6)
    assert b.device == device1.device


def test_clip_grad_sums_a_float32_gradient_beside_float64_ones_in_float64(xp2):
    # 1e20 ** 2 overflows float32: the norm would be inf and both gradients zeroed
    W = gradcore.Parameter(xp2.asarray([0.0], "float32"))
    W.grad = gradcore.Variable(xp2.asarray([1e20], "float32"), requires_grad=False)
    b = param(xp2, [0.0])
    give_grad(b, xp2, [1.0])
    optimizer = SGD([W, b], lr=1.0)
    optimizer.add_hook(ClipGrad(1.0))
    optimizer.step()
    np.testing.assert_allclose(xp2.numpy(W.grad.data), [1.0], rtol=1e-6)
    np.testing.assert_allclose(xp2.numpy(b.grad.data), [1e-20], rtol=1e-6)
    assert W.grad.dtype == xp2.float32


def test_clip_grad_keeps_float32(xp2):
    W = gradcore.Parameter(xp2.asarray([0.0, 0.0], "float32"))
    W.grad = gradcore.Variable(xp2.asarray([30.0, 40.0], "float32"), requires_grad=False)
    optimizer = SGD([W], lr=1.0)
    optimizer.add_hook(ClipGrad(np.float64(1.0)))
    optimizer.add_hook(WeightDecay(np.float64(0.1)))
    optimizer.step()
    assert W.grad.dtype == xp2.float32 and W.dtype == xp2.float32


class Layer:
    def __init__(self, xp, values):
        self.W = param(xp, values)

    def parameters(self):
        yield self.W


@pytest.mark.parametrize("cls", [SGD, MomentumSGD, Adam])
def test_freeze_param_leaves_frozen_parameters_unchanged(xp2, cls):
    frozen_layer = Layer(xp2, [1.0, 2.0])
    frozen = param(xp2, [3.0])
    free = param(xp2, [4.0])
    optimizer = cls([frozen_layer.W, frozen, free], lr=0.1)
    optimizer.add_hook(FreezeParam(frozen_layer, frozen))
    for _ in range(2):
        for p, g in ((frozen_layer.W, [1.0, 1.0]), (frozen, [1.0]), (free, [1.0])):
            give_grad(p, xp2, g)
        optimizer.step()
    np.testing.assert_array_equal(xp2.numpy(frozen_layer.W.data), [1.0, 2.0])
    np.testing.assert_array_equal(xp2.numpy(frozen.data), [3.0])
    assert xp2.numpy(free.data)[0] < 4.0
    assert frozen not in optimizer.state  # no state made for a frozen parameter


def test_hooks_run_in_order_on_the_parameters_that_have_a_gradient(xp2):
    W, b = param(xp2, [1.0]), param(xp2, [2.0])
    give_grad(W, xp2, [10.0])
    seen = []
    optimizer = SGD([W, b], lr=1.0)
    optimizer.add_hook(lambda params: seen.append(("first", list(params))))
    optimizer.add_hook(WeightDecay(1.0))   # grad 10 + 1 = 11
    optimizer.add_hook(ClipGrad(1.1))      # scaled to ~1.1
    optimizer.step()
    assert seen == [("first", [W])]
    np.testing.assert_allclose(xp2.numpy(W.data), [1.0 - 11.0 * 1.1 / (11.0 + 1e-6)], rtol=1e-12)
    assert optimizer.hooks[1].rate == 1.0


def test_hook_arguments_are_checked():
    with pytest.raises(TypeError, match="add_hook expects a callable"):
        SGD().add_hook(0.1)
    with pytest.raises(ValueError, match="WeightDecay: rate must be a finite number >= 0"):
        WeightDecay(-1.0)
    with pytest.raises(ValueError, match="ClipGrad: max_norm must be a finite number >= 0"):
        ClipGrad(-1.0)
    with pytest.raises(TypeError, match="FreezeParam: argument 0 is a float"):
        FreezeParam(1.0)


@pytest.mark.parametrize("later", [lambda: WeightDecay(0.1), lambda: ClipGrad(1.0)],
                         ids=["WeightDecay", "ClipGrad"])
@pytest.mark.parametrize("freeze_first", [True, False])
def test_a_frozen_parameter_is_out_of_every_hook(later, freeze_first):
    frozen, free = param(np, [0.0, 0.0, 0.0]), param(np, [0.0, 0.0, 0.0])
    optimizer = SGD([frozen, free], lr=1.0)
    hooks = [FreezeParam(frozen), later()]
    for hook in hooks if freeze_first else hooks[::-1]:
        optimizer.add_hook(hook)
    give_grad(frozen, np, [100.0, 100.0, 100.0])  # would dominate ClipGrad's norm
    give_grad(free, np, [0.6, 0.8, 0.0])  # norm 1: ClipGrad(1.0) leaves it (nearly) alone
    optimizer.step()
    np.testing.assert_array_equal(frozen.data, [0.0, 0.0, 0.0])
    np.testing.assert_allclose(free.data, [-0.6, -0.8, 0.0], rtol=1e-5)


def test_a_gradient_a_hook_drops_is_not_seen_by_the_next_hooks():
    W, b = param(np, [1.0]), param(np, [2.0])
    give_grad(W, np, [1.0])
    give_grad(b, np, [1.0])
    seen = []

    def drop_b(params):
        b.grad = None

    optimizer = SGD([W, b], lr=1.0)
    optimizer.add_hook(drop_b)
    optimizer.add_hook(lambda params: seen.append(list(params)))
    optimizer.add_hook(WeightDecay(1.0))
    optimizer.step()
    assert seen == [[W]]
    np.testing.assert_array_equal(W.data, [1.0 - 2.0])
    np.testing.assert_array_equal(b.data, [2.0])


def test_a_gradient_a_hook_replaces_is_let_go_during_the_step():
    # kept to be put back if a later hook raised, each old gradient stayed alive through the
    # hooks: a step's gradients twice in memory (8 parameters of 32 MB: +288 MB peak for +32)
    W = param(np, [3.0, 4.0])
    gone = weakref.ref(give_grad(W, np, [30.0, 40.0]))
    seen = []
    optimizer = SGD([W], lr=0.1)
    optimizer.add_hook(WeightDecay(0.5))
    optimizer.add_hook(lambda params: seen.append(gone() is None))
    optimizer.step()
    assert seen == [True]
    np.testing.assert_allclose(W.data, [3.0 - 0.1 * 31.5, 4.0 - 0.1 * 42.0], rtol=1e-12)


def float16_grads():
    W = gradcore.Parameter(np.zeros(4, np.float16))
    W.grad = gradcore.Variable(np.full(4, 300.0, np.float16), requires_grad=False)
    return W  # norm 600: its square, 360000, is past float16's largest, 65504


def test_clip_grad_sums_float16_squares_in_float32():
    W = float16_grads()
    optimizer = SGD([W], lr=1.0)
    optimizer.add_hook(ClipGrad(1.0))
    optimizer.step()
    assert W.dtype == W.grad.dtype == np.float16
    np.testing.assert_allclose(W.data, [-0.5] * 4, rtol=1e-3)  # not zeroed by a norm of inf


@pytest.mark.parametrize("norm_type", [2.0, 3.0, math.inf])
def test_clip_grad_norm_sums_float16_in_float32(norm_type):
    # gradcore.nn.utils.clip_grad_norm_, which shares ClipGrad's arithmetic
    from gradcore.nn.utils import clip_grad_norm_

    W = float16_grads()
    total = clip_grad_norm_([W], 1.0, norm_type=norm_type)
    expected = 300.0 if norm_type == math.inf else 300.0 * 4 ** (1 / norm_type)
    # returned in float32, the dtype it was summed in: a float16 norm past 65504 would read inf
    assert total.dtype == np.float32 and float(total.data) == pytest.approx(expected, rel=1e-3)
    assert W.grad.dtype == np.float16
    np.testing.assert_allclose(W.grad.data, [300.0 / expected] * 4, rtol=1e-3)


def test_a_hook_that_raises_after_others_ran_says_the_gradients_keep_what_they_set():
    # on NumPy the grads WeightDecay replaced are not put back (holding them would hold every
    # gradient twice): the error says so, as a retry would decay them again
    W = param(np, [1.0, -2.0])
    give_grad(W, np, [3.0, 3.0])
    optimizer = SGD(lr=0.1).setup([W])
    optimizer.add_hook(WeightDecay(0.5))

    def refuse(params):
        raise ValueError("no")
    optimizer.add_hook(refuse)
    with pytest.raises(ValueError) as raised:
        optimizer.update()
    assert raised.value.__notes__ == [
        "the optimizer's hooks before the one that raised (WeightDecay) ran on the gradients of "
        "1 parameter, which keep what those hooks set: run backward again before trying the step "
        "again"]
    np.testing.assert_array_equal(W.grad.data, [3.5, 2.0])
    np.testing.assert_array_equal(W.data, [1.0, -2.0])  # not updated


def test_a_first_hook_that_raises_gets_no_note():
    W = param(np, [1.0, -2.0])
    give_grad(W, np, [3.0, 3.0])
    optimizer = SGD(lr=0.1).setup([W])

    def refuse(params):
        raise ValueError("no")
    optimizer.add_hook(refuse)
    optimizer.add_hook(WeightDecay(0.5))
    with pytest.raises(ValueError) as raised:
        optimizer.update()
    assert getattr(raised.value, "__notes__", None) is None
    np.testing.assert_array_equal(W.grad.data, [3.0, 3.0])


# ============================================================ found by a review
def test_clip_grad_takes_the_norm_of_float32_gradients_whose_squares_overflow(xp2):
    # 3e19 ** 2 is past float32's largest: the norm was inf and both gradients zeroed
    W = gradcore.Parameter(xp2.asarray([0.0, 0.0], "float32"))
    W.grad = gradcore.Variable(xp2.asarray([3e19, 4e19], "float32"), requires_grad=False)
    b = gradcore.Parameter(xp2.asarray([0.0], "float32"))
    b.grad = gradcore.Variable(xp2.asarray([1.0], "float32"), requires_grad=False)
    optimizer = SGD([W, b], lr=1.0)
    optimizer.add_hook(ClipGrad(1.0))
    optimizer.step()
    np.testing.assert_allclose(xp2.numpy(W.data), [-0.6, -0.8], rtol=1e-6)
    np.testing.assert_allclose(xp2.numpy(b.data), [-2e-20], rtol=1e-6)


def test_clip_grad_scales_a_norm_past_float32s_range():
    W = gradcore.Parameter(np.zeros(2, np.float32))
    W.grad = gradcore.Variable(np.full(2, 3e38, np.float32), requires_grad=False)
    optimizer = SGD([W], lr=1.0)
    optimizer.add_hook(ClipGrad(1.0))
    optimizer.step()
    np.testing.assert_allclose(W.data, [-(2 ** -0.5)] * 2, rtol=1e-6)
