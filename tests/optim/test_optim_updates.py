"""Each optimizer's update rule: two steps computed by hand, convergence on a convex loss,
both call styles, in-place updates that record no graph, float32 kept."""
import math
import re

import numpy as np
import pytest

import backends
import gradcore
import gradcore.functions as F
from gradcore.optim import SGD, AdaDelta, AdaGrad, Adam, AdamW, MomentumSGD, RMSprop

W0 = [1.0, -2.0]
G1 = [0.5, -1.0]  # the gradient given at the first step
G2 = [1.0, 2.0]   # and at the second

# (optimizer, hyperparameters, W after step 1, W after step 2), each worked out from the formula
HAND = [
    # W <- W - lr * g
    (SGD, {"lr": 0.1}, [0.95, -1.9], [0.85, -2.1]),
    # v1 = -0.1 * g1 = [-0.05, 0.1];  v2 = 0.9 * v1 - 0.1 * g2 = [-0.145, -0.11];  W += v
    (MomentumSGD, {"lr": 0.1, "momentum": 0.9}, [0.95, -1.9], [0.805, -2.01]),
    # h1 = g1**2 = [0.25, 1]: W1 = W0 - 0.1 * g1 / (sqrt(h1) + 0.5) = [1 - 0.05/1, -2 + 0.1/1.5]
    # h2 = [1.25, 5]:         W2 = W1 - 0.1 * g2 / (sqrt(h2) + 0.5)
    #                            = [0.95 - 0.1/1.6180339887, -1.93333 - 0.2/2.7360679775]
    (AdaGrad, {"lr": 0.1, "eps": 0.5}, [0.95, -1.9333333333333333],
     [0.8881966011250104, -2.006430932385956]),
    # msg1 = 0.5 * g1**2 = [0.125, 0.5]; dx1 = sqrt(0.25 / (msg1 + 0.25)) * g1
    #      = [sqrt(2/3) * 0.5, -sqrt(1/3)] = [0.4082482905, -0.5773502692]; W1 = W0 - 0.5 * dx1
    # msdx1 = 0.5 * dx1**2 = [1/12, 1/6]; msg2 = 0.5 * msg1 + 0.5 * g2**2 = [0.5625, 2.25]
    # dx2 = sqrt((msdx1 + 0.25) / (msg2 + 0.25)) * g2 = [sqrt((1/3) / 0.8125), 2 * sqrt(1/6)]
    #     = [0.6405126152, 0.8164965809];  W2 = W1 - 0.5 * dx2
    (AdaDelta, {"rho": 0.5, "eps": 0.25, "lr": 0.5}, [0.7958758547680684, -1.7113248654051871],
     [0.4756195471578942, -2.11957315586905]),
    # m1 = 0.5 * g1 = [0.25, -0.5], v1 = 0.25 * g1**2 = [0.0625, 0.25]
    # lr1 = 0.1 * sqrt(1 - 0.75) / (1 - 0.5) = 0.1; W1 = W0 - 0.1 * m1 / (sqrt(v1) + 1e-8)
    # m2 = m1 + 0.5 * (g2 - m1) = [0.625, 0.75], v2 = v1 + 0.25 * (g2**2 - v1) = [0.296875, 1.1875]
    # lr2 = 0.1 * sqrt(1 - 0.75**2) / (1 - 0.5**2) = 0.0881917104
    # W2 = W1 - lr2 * m2 / (sqrt(v2) + 1e-8)
    (Adam, {"alpha": 0.1, "beta1": 0.5, "beta2": 0.75, "eps": 1e-8},
     [0.9000000039999998, -1.900000002], [0.7988371760788534, -1.9606976993096883]),
    # as Adam, each step first W *= 1 - 0.1 * 0.5:  W1 = 0.95 * W0 - 0.1 * m1 / (sqrt(v1) + 1e-8)
    (AdamW, {"alpha": 0.1, "beta1": 0.5, "beta2": 0.75, "eps": 1e-8, "weight_decay": 0.5},
     [0.8500000039999998, -1.800000002], [0.7063371758788534, -1.7706976992096881]),
    # v1 = 0.5 * g1**2 = [0.125, 0.5]: W1 = W0 - 0.1 * g1 / (sqrt(v1) + 0.5)
    #    = [1 - 0.1 * 0.5857864376, -2 + 0.1 * 0.8284271247]
    # v2 = 0.5 * v1 + 0.5 * g2**2 = [0.5625, 2.25]: W2 = W1 - 0.1 * g2 / ([0.75, 1.5] + 0.5)
    #    = W1 - 0.1 * [0.8, 1.0]
    (RMSprop, {"lr": 0.1, "alpha": 0.5, "eps": 0.5}, [0.9414213562373095, -1.917157287525381],
     [0.8614213562373094, -2.017157287525381]),
]


def constant(xp, values, dtype="float64"):
    return gradcore.Variable(xp.asarray(values, dtype), requires_grad=False)


@pytest.mark.parametrize("cls, hyper, w1, w2", HAND, ids=[row[0].__name__ for row in HAND])
def test_first_two_steps_match_the_formula(xp2, cls, hyper, w1, w2):
    W = gradcore.Parameter(xp2.asarray(W0))
    optimizer = cls(**hyper).setup([W])
    for g, expected in ((G1, w1), (G2, w2)):
        W.grad = constant(xp2, g)
        optimizer.update()
        np.testing.assert_allclose(xp2.numpy(W.data), expected, rtol=1e-12)
        assert W.device == xp2.device


CONVEX = [  # hyperparameters that bring sum((W - T)**2) down within 60 steps
    (SGD, {"lr": 0.1}),
    (MomentumSGD, {"lr": 0.05}),
    (AdaGrad, {"lr": 0.5}),
    (AdaDelta, {"eps": 1e-2}),
    (Adam, {"alpha": 0.1}),
    (AdamW, {"alpha": 0.1}),
    (RMSprop, {"lr": 0.05}),
]


@pytest.mark.parametrize("cls, hyper", CONVEX, ids=[row[0].__name__ for row in CONVEX])
def test_a_convex_loss_goes_down(xp2, cls, hyper):
    target = xp2.asarray([[1.0, -2.0, 3.0], [0.5, 0.0, -1.5]])
    W = gradcore.Parameter(xp2.asarray(np.zeros((2, 3))))
    optimizer = cls([W], **hyper)
    losses = []
    for _ in range(60):
        loss = F.sum((W - target) ** 2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    assert losses[-1] < 0.05 * losses[0]
    assert W.device == xp2.device


class TwoParams:
    """A stand-in for a model: anything with parameters()."""

    def __init__(self, xp):
        self.W = gradcore.Parameter(xp.asarray([[0.5, -1.0], [2.0, 0.25]]))
        self.b = gradcore.Parameter(xp.asarray([0.1, -0.3]))

    def parameters(self):
        yield self.W
        yield self.b

    def loss(self, x):
        return F.sum((F.matmul(x, self.W) + self.b) ** 2)


@pytest.mark.parametrize("cls, hyper", CONVEX, ids=[row[0].__name__ for row in CONVEX])
def test_dezero_and_pytorch_styles_give_the_same_steps(xp2, cls, hyper):
    x = xp2.asarray([[1.0, 2.0], [-1.0, 0.5]])
    dezero, pytorch = TwoParams(xp2), TwoParams(xp2)
    first = cls(**hyper)  # DeZero: hyperparameters, setup(model), cleargrads, backward, update
    first.setup(dezero)
    if cls in (Adam, AdamW):  # PyTorch's name for Adam's alpha
        hyper = {("lr" if k == "alpha" else k): v for k, v in hyper.items()}
    second = cls(pytorch.parameters(), **hyper)
    for _ in range(3):
        for p in dezero.parameters():
            p.cleargrad()
        dezero.loss(x).backward()
        first.update()
        second.zero_grad()
        pytorch.loss(x).backward()
        second.step()
    for a, b in zip(dezero.parameters(), pytorch.parameters()):
        np.testing.assert_array_equal(xp2.numpy(a.data), xp2.numpy(b.data))
    assert xp2.numpy(dezero.W.data)[0, 0] != 0.5  # it did move


ALL = [row[:2] for row in HAND]


@pytest.mark.parametrize("cls, hyper", ALL, ids=[row[0].__name__ for row in ALL])
def test_updates_run_in_place_and_record_no_graph(xp2, cls, hyper, monkeypatch):
    W = gradcore.Parameter(xp2.asarray(W0))
    optimizer = cls([W], **hyper)
    before = W.data
    calls = []
    original = gradcore.Function.__call__

    def counting(self, *inputs):
        calls.append(type(self).__name__)
        return original(self, *inputs)

    monkeypatch.setattr(gradcore.Function, "__call__", counting)
    W.grad = grad = constant(xp2, G1)
    with gradcore.enable_grad():
        optimizer.step()
        optimizer.step()
    assert calls == []             # no Function ran: nothing recorded
    assert W.creator is None and W.is_leaf
    assert W.grad is grad          # the gradient is left as it was
    np.testing.assert_array_equal(xp2.numpy(grad.data), G1)
    assert W.data is before        # the same array object, updated in place
    assert not np.array_equal(xp2.numpy(W.data), W0)


@pytest.mark.parametrize("cls, hyper", ALL, ids=[row[0].__name__ for row in ALL])
def test_float32_stays_float32(xp2, cls, hyper):
    # NumPy float64 scalars as hyperparameters must not upcast float32 updates (NEP 50)
    hyper = {k: np.float64(v) for k, v in hyper.items()}
    W = gradcore.Parameter(xp2.asarray(W0, "float32"))
    optimizer = cls([W], **hyper)
    for g in (G1, G2):
        W.grad = constant(xp2, g, "float32")
        optimizer.step()
    assert W.dtype == xp2.float32
    for array in optimizer.state.get(W, {}).values():
        assert array.dtype == xp2.float32
    float64 = gradcore.Parameter(xp2.asarray(W0))  # the same steps in float64, as a reference
    reference = cls([float64], **hyper)
    for g in (G1, G2):
        float64.grad = constant(xp2, g)
        reference.step()
    np.testing.assert_allclose(xp2.numpy(W.data), xp2.numpy(float64.data), rtol=1e-5)


@pytest.mark.parametrize("cls, hyper", [(Adam, {}), (AdamW, {}), (AdaGrad, {}),
                                        (AdaDelta, {"eps": 1e-8}), (RMSprop, {})],
                         ids=["Adam", "AdamW", "AdaGrad", "AdaDelta", "RMSprop"])
def test_float16_takes_no_nan_step_where_the_gradient_is_zero(cls, hyper):
    # float16 cannot hold eps = 1e-8: sqrt(0) + eps would be 0 there, and the step 0 / 0 = NaN
    W = gradcore.Parameter(np.array([1.0, 2.0], np.float16))
    optimizer = cls([W], **hyper)
    W.grad = gradcore.Variable(np.array([0.0, 1.0], np.float16))
    optimizer.step()
    float64 = gradcore.Parameter(np.array([1.0, 2.0]))  # the same step in float64, as a reference
    reference = cls([float64], **hyper)
    float64.grad = gradcore.Variable(np.array([0.0, 1.0]))
    reference.step()
    assert W.dtype == np.float16
    np.testing.assert_allclose(W.data, float64.data, rtol=1e-3)


SMALL = [[1e-3, -1e-4], [2e-4, 3e-3]]  # gradients whose squares are 0 in float16


@pytest.mark.parametrize("cls, hyper", [(cls, {"lr": 1.0} if cls in (SGD, MomentumSGD) else {})
                                        for cls, _ in ALL], ids=[row[0].__name__ for row in ALL])
@pytest.mark.parametrize("device", ["cpu", "dask"])
def test_float16_steps_are_the_float32_steps_rounded_at_the_write(cls, hyper, device):
    # mixed precision: state in float32 and the update computed in float32, rounded to float16
    # once, as it is written (in float16 Adam's v underflowed to 0 and the step was m / 6e-8)
    if device == "dask":
        pytest.importorskip("dask.array")
        pytest.importorskip("array_api_compat")
    xp = backends.get_backend("numpy" if device == "cpu" else device).xp
    W = gradcore.Parameter(xp.asarray(np.array(W0, np.float16)))
    optimizer = cls([W], **hyper)
    reference = gradcore.Parameter(np.array(W0, np.float32))  # from each step's rounded start
    expected = cls([reference], **hyper)
    for g in SMALL:
        W.grad = gradcore.Variable(xp.asarray(np.array(g, np.float16)), requires_grad=False)
        reference.grad = gradcore.Variable(np.array(g, np.float16).astype(np.float32))
        optimizer.step()
        expected.step()
        step = reference.data.astype(np.float16)
        assert W.dtype == np.float16
        np.testing.assert_array_equal(np.asarray(W.data), step)
        reference.data[...] = step  # the float16 run goes on from the rounded values
        for name, array in optimizer.state.get(W, {}).items():
            assert array.dtype == np.float32
            np.testing.assert_array_equal(np.asarray(array), expected.state[reference][name])
    assert not np.array_equal(np.asarray(W.data), np.array(W0, np.float16))


def test_a_float64_gradient_is_applied_in_the_parameter_dtype(xp2):
    W = gradcore.Parameter(xp2.asarray(W0, "float32"))
    with pytest.raises(ValueError, match="dtype"):
        W.grad = constant(xp2, G1, "float64")
    W.grad = constant(xp2, G1, "float32")
    W.grad.data = constant(xp2, G1, "float64").data  # the gradient's own array changed dtype
    Adam([W]).step()
    assert W.dtype == xp2.float32


def test_parameters_without_a_gradient_are_skipped(xp2):
    W = gradcore.Parameter(xp2.asarray(W0))
    b = gradcore.Parameter(xp2.asarray([3.0]))
    optimizer = Adam([W, b], lr=0.1)
    W.grad = constant(xp2, G1)
    optimizer.step()
    np.testing.assert_array_equal(xp2.numpy(b.data), [3.0])
    assert b not in optimizer.state and W in optimizer.state
    assert optimizer.t == 1


# ---------------------------------------------------------------- Adam's count of steps
@pytest.mark.parametrize("cls", [Adam, AdamW])
def test_adam_counts_the_steps_of_each_parameter(xp2, cls):
    hyper = dict(HAND[4][1], **({"weight_decay": 0.5} if cls is AdamW else {}))
    w1 = next(row[2] for row in HAND if row[0] is cls)
    early = gradcore.Parameter(xp2.asarray([5.0, 5.0]))
    late = gradcore.Parameter(xp2.asarray(W0))
    optimizer = cls([early, late], **hyper)
    for _ in range(20):
        early.grad = constant(xp2, [1.0, -1.0])
        optimizer.step()
    for _ in range(5):  # nothing has a gradient: nothing counted
        early.grad = None
        optimizer.step()
    assert optimizer.t == 20 and optimizer.param_counts(early) == {"step": 20}
    late.grad = constant(xp2, G1)
    optimizer.step()  # its first step is a first step, bias correction and all
    np.testing.assert_allclose(xp2.numpy(late.data), w1, rtol=1e-12)
    assert optimizer.param_counts(late) == {"step": 1} and optimizer.t == 21
    assert optimizer.lr == pytest.approx(optimizer._step_size(21))


def test_adam_after_empty_steps_takes_the_same_first_step(xp2):
    W = gradcore.Parameter(xp2.asarray(W0))
    optimizer = Adam(**HAND[4][1]).setup([W])
    for _ in range(50):
        optimizer.update()
    W.grad = constant(xp2, G1)
    optimizer.update()
    np.testing.assert_allclose(xp2.numpy(W.data), HAND[4][2], rtol=1e-12)
    assert optimizer.t == 1


def test_adam_hooks_see_the_count_and_step_size_of_this_step():
    W, b = gradcore.Parameter(np.zeros(2)), gradcore.Parameter(np.zeros(1))
    optimizer = Adam([W, b], lr=0.1)
    seen = []
    optimizer.add_hook(lambda params: seen.append((optimizer.t, optimizer.lr)))
    for _ in range(3):
        W.grad = constant(np, [1.0, -1.0])
        optimizer.step()
    # counted before the hooks, as DeZero's Adam (t += 1, then the base class's hooks)
    assert seen == [(k, optimizer._step_size(k)) for k in (1, 2, 3)]
    W.grad = None
    optimizer.step()  # nothing has a gradient: not counted
    assert seen[-1][0] == optimizer.t == 3

    def fails(params):
        raise RuntimeError("a hook that fails")
    optimizer.add_hook(fails)
    W.grad = constant(np, [1.0, -1.0])
    with pytest.raises(RuntimeError, match="a hook that fails"):
        optimizer.step()
    assert optimizer.t == 3 and optimizer.param_counts(W) == {"step": 3}
    assert b not in optimizer.state_counts


def test_adam_does_not_count_a_frozen_parameters_step():
    from gradcore.optim import FreezeParam

    a, b = gradcore.Parameter(np.zeros(2)), gradcore.Parameter(np.zeros(2))
    optimizer = Adam([a, b], lr=0.1)
    freeze = FreezeParam(a)
    optimizer.add_hook(freeze)
    for _ in range(3):
        a.grad = constant(np, [1.0, 1.0])
        optimizer.step()  # only a had a gradient, and it is frozen: an empty step
    assert optimizer.t == 0 and a not in optimizer.state_counts
    np.testing.assert_array_equal(a.data, [0.0, 0.0])


@pytest.mark.parametrize("cls, theirs, hyper", [
    (Adam, "Adam", {}), (AdamW, "AdamW", {"weight_decay": 0.1})])
def test_adam_counts_steps_as_pytorch(cls, theirs, hyper):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    start = [rng.standard_normal(4) for _ in range(3)]
    ours = [gradcore.Parameter(w.copy()) for w in start]
    pytorchs = [torch.nn.Parameter(torch.tensor(w.copy())) for w in start]
    # a tiny eps: DeZero's eps sits before the bias correction, PyTorch's after
    optimizer = cls(ours, lr=0.01, eps=1e-12, **hyper)
    reference = getattr(torch.optim, theirs)(pytorchs, lr=0.01, eps=1e-12, **hyper)
    for step in range(200):
        has = [step % 50 != 7, step >= 100 and step % 50 != 7, step % 3 == 0]
        for p, q, given in zip(ours, pytorchs, has):
            g = rng.standard_normal(4)
            p.grad = gradcore.Variable(g) if given else None
            q.grad = torch.tensor(g) if given else None
        optimizer.step()
        reference.step()
    for p, q in zip(ours, pytorchs):
        assert optimizer.param_counts(p)["step"] == int(reference.state[q]["step"])
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-8, atol=1e-10)


def test_adam_docstring_states_the_cost_of_dezeros_eps():
    # DeZero's eps sits before the bias correction: a first step is PyTorch's with eps replaced by
    # k * eps, k = 1 / sqrt(1 - beta2). Each "P% where eps = r |g|" of the docstring, measured
    torch = pytest.importorskip("torch")
    quoted = re.findall(r"(\d+(?:\.\d+)?)% where eps = ([\d.e-]+) \|g\|",
                        " ".join(Adam.__doc__.split()))
    assert len(quoted) == 4
    k = 1 / math.sqrt(1 - 0.999)
    for percent, ratio in quoted:
        for g in (1e-7, -3.0):
            eps = float(ratio) * abs(g)
            ours = gradcore.Parameter(np.zeros(1))
            theirs = torch.zeros(1, dtype=torch.float64, requires_grad=True)
            optimizer, reference = Adam([ours], eps=eps), torch.optim.Adam([theirs], eps=eps)
            ours.grad = gradcore.Variable(np.array([g]))
            theirs.grad = torch.tensor([g], dtype=torch.float64)
            optimizer.step()
            reference.step()
            shorter = 1 - ours.data[0] / theirs.item()
            assert shorter == pytest.approx((k - 1) * eps / (abs(g) + k * eps), rel=1e-9)
            assert shorter == pytest.approx(float(percent) / 100, rel=0.05)


@pytest.mark.parametrize("hyper", [{}, {"momentum": 0.9}, {"centered": True},
                                   {"centered": True, "momentum": 0.5, "alpha": 0.9, "eps": 1e-3}])
def test_rmsprop_steps_as_pytorchs(hyper):
    """30 steps against torch.optim.RMSprop in float64; then momentum and centered switched on
    (PyTorch's step raises KeyError there) make their state at once, and off keep it: a
    state_dict taken then loads (it held names its hyperparameters did not keep: "missing b",
    as after OneCycleLR set the momentum). A momentum OneCycleLR brings to 0 and back goes on
    with its buffer, as PyTorch's (a new one made the parameters drift 0.007 from torch's)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4))
    ours = gradcore.Parameter(w.copy())
    theirs = torch.nn.Parameter(torch.tensor(w.copy()))
    optimizer = RMSprop([ours], lr=0.02, **hyper)
    reference = torch.optim.RMSprop([theirs], lr=0.02, **hyper)
    for _ in range(30):
        g = rng.standard_normal((3, 4))
        ours.grad = gradcore.Variable(g.copy())
        theirs.grad = torch.tensor(g.copy())
        optimizer.step()
        reference.step()
        np.testing.assert_allclose(ours.data, theirs.detach().numpy(), rtol=0, atol=1e-14)
    for momentum, centered in ((0.5, True), (0.0, False)):  # kept at 0, as PyTorch keeps them
        names = ["b", "m", "v"]
        optimizer.momentum, optimizer.centered = momentum, centered
        assert sorted(optimizer.state[ours]) == names
        RMSprop([gradcore.Parameter(w.copy())]).load_state_dict(optimizer.state_dict())
        before = ours.data.copy()
        optimizer.step()
        assert sorted(optimizer.state[ours]) == names and np.isfinite(ours.data).all()
        assert not np.array_equal(ours.data, before)


def test_rmsprop_keeps_its_momentum_buffer_through_a_momentum_of_zero_as_pytorch():
    """OneCycleLR with base_momentum=0 sets RMSprop's momentum to 0 at its peak: the buffer was
    dropped there and made anew, and the parameters drifted 0.007 from torch's."""
    torch = pytest.importorskip("torch")
    from gradcore.optim import lr_scheduler
    rng = np.random.default_rng(1)
    w = rng.standard_normal(3)
    ours, theirs = gradcore.Parameter(w.copy()), torch.nn.Parameter(torch.tensor(w.copy()))
    optimizer = RMSprop([ours], lr=0.01, momentum=0.9)
    reference = torch.optim.RMSprop([theirs], lr=0.01, momentum=0.9)
    schedules = (lr_scheduler.OneCycleLR(optimizer, 0.1, total_steps=20, base_momentum=0.0),
                 torch.optim.lr_scheduler.OneCycleLR(reference, 0.1, total_steps=20,
                                                     base_momentum=0.0))
    for _ in range(19):
        g = rng.standard_normal(3)
        ours.grad, theirs.grad = gradcore.Variable(g.copy()), torch.tensor(g.copy())
        optimizer.step(), reference.step()
        for schedule in schedules:
            schedule.step()
        np.testing.assert_allclose(ours.data, theirs.detach().numpy(), rtol=0, atol=1e-13)
