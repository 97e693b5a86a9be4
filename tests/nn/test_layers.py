"""Layers: forward shapes and values, lazy creation (device, dtype, seed), a gradient check of
each on a tiny instance (input and every parameter) on NumPy and array-api-strict device1."""
import copy
import pickle

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
import gradcore.nn as nn
from conftest import DEVICE1, STRICT
from layer_check import check_module


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _seeded_dropout(m, x):
    gradcore.manual_seed(3)  # the same mask for backward and both central-difference points
    return m(x)


def _rnn_two_steps(m, x):
    m.reset_state()
    m(x)
    return m(x * 0.5)


# name, module factory, input shape (or integer ids), run
GRAD_CASES = [
    ("linear", lambda: nn.Linear(3), (2, 4), None),
    ("linear-eager-nobias", lambda: nn.Linear(4, 3, nobias=True), (2, 4), None),
    ("conv2d", lambda: nn.Conv2d(2, 3, stride=2, pad=1), (2, 2, 5, 5), None),
    ("deconv2d", lambda: nn.Deconv2d(2, (2, 3), stride=2, pad=1), (1, 2, 3, 3), None),
    ("batchnorm-2d", lambda: nn.BatchNorm(), (5, 3), None),
    ("batchnorm-4d", lambda: nn.BatchNorm(), (3, 2, 2, 2), None),
    ("batchnorm-eval", lambda: nn.BatchNorm().eval(), (4, 3), None),
    ("dropout", lambda: nn.Dropout(0.3), (3, 4), _seeded_dropout),
    ("embed_id", lambda: nn.EmbedID(5, 3), np.array([[0, 4, 4], [2, 0, 1]]), None),
    ("relu", lambda: nn.ReLU(), (3, 4), None),
    ("sigmoid", lambda: nn.Sigmoid(), (3, 4), None),
    ("tanh", lambda: nn.Tanh(), (3, 4), None),
    ("sequential", lambda: nn.Sequential(nn.Linear(3), nn.Tanh(), F.relu, nn.Linear(2)),
     (4, 3), None),
    ("mlp", lambda: nn.MLP((4, 3, 2)), (5, 3), None),
    ("rnn", lambda: nn.RNN(3), (2, 4), _rnn_two_steps),
    ("lstm", lambda: nn.LSTM(3), (2, 4), _rnn_two_steps),
]


@pytest.mark.parametrize("name, make, shape, run", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradient_check(xp2, rng, name, make, shape, run):
    x = shape if isinstance(shape, np.ndarray) else rng.uniform(-2.0, 2.0, size=shape)
    if name == "relu":
        x = np.where(np.abs(x) < 0.1, 0.5, x)  # away from the kink
    np.random.seed(1)
    check_module(make(), x, xp2, rng, run)


SHAPE_CASES = [
    (lambda: nn.Linear(5), (4, 3), (4, 5)),
    (lambda: nn.Linear(3, 5), (4, 3), (4, 5)),
    (lambda: nn.Linear(out_size=5, in_size=3), (4, 3), (4, 5)),
    (lambda: nn.Conv2d(4, 3), (2, 1, 6, 6), (2, 4, 4, 4)),
    (lambda: nn.Conv2d(4, 3, stride=2, pad=1, in_channels=1), (2, 1, 6, 6), (2, 4, 3, 3)),
    (lambda: nn.Conv2d(4, (1, 3)), (2, 3, 5, 6), (2, 4, 5, 4)),
    (lambda: nn.Deconv2d(4, 3), (2, 1, 4, 4), (2, 4, 6, 6)),
    (lambda: nn.Deconv2d(4, 4, stride=2, pad=1), (2, 3, 4, 4), (2, 4, 8, 8)),
    (lambda: nn.BatchNorm(), (4, 3, 2, 2), (4, 3, 2, 2)),
    (lambda: nn.Dropout(), (4, 3), (4, 3)),
    (lambda: nn.RNN(6), (4, 3), (4, 6)),
    (lambda: nn.LSTM(6, in_size=3), (4, 3), (4, 6)),
    (lambda: nn.MLP((7, 2)), (4, 3), (4, 2)),
]


@pytest.mark.parametrize("make, x_shape, y_shape", SHAPE_CASES)
def test_forward_shapes_and_dtype(xp2, make, x_shape, y_shape):
    layer = make().to(xp2.device)
    for _ in range(2):  # an RNN makes h2h at its second step, as DeZero's
        y = layer(xp2.asarray(np.ones(x_shape, dtype=np.float32)))
    assert y.shape == y_shape and y.dtype == xp2.float32 and y.device == xp2.device
    for name, p in layer.named_parameters():
        assert p.device == xp2.device and p.dtype == xp2.float32, name


def test_embedding_forward(xp2):
    emb = nn.Embedding(10, 4).to(xp2.device)
    ids = xp2.asarray(np.array([[1, 9], [1, 0]]))
    y = emb(ids)
    assert y.shape == (2, 2, 4) and y.device == xp2.device and y.dtype == xp2.float32
    W = xp2.numpy(emb.W.data)
    np.testing.assert_array_equal(xp2.numpy(y.data), W[[[1, 9], [1, 0]]])
    assert nn.EmbedID is nn.Embedding and emb.W.shape == (10, 4)


def test_linear_values():
    lin = nn.Linear(2, 3)
    lin.W.data[...] = np.arange(6.0).reshape(2, 3)
    lin.b.data[...] = [1.0, 2.0, 3.0]
    y = lin(np.array([[1.0, -1.0]], dtype=np.float32))
    np.testing.assert_array_equal(y.data, [[-2.0, -1.0, 0.0]])
    assert nn.Linear(2, 3, nobias=True).b is None
    assert [n for n, _ in nn.Linear(2, 3, nobias=True).named_parameters()] == ["W"]


# =============================================================================== lazy creation
def test_linear_lazy_init_reproduces_with_numpy_seed():
    np.random.seed(42)
    expected = np.random.randn(3, 4) * np.sqrt(1 / 3)  # DeZero: randn(in, out) * sqrt(1 / in)
    np.random.seed(42)
    lin = nn.Linear(4)
    assert lin.W.data is None and lin.in_size is None
    lin(np.zeros((2, 3), dtype=np.float32))
    assert lin.in_size == 3 and lin.W.dtype == np.float32
    np.testing.assert_allclose(lin.W.data, expected, rtol=1e-6)
    np.testing.assert_array_equal(lin.b.data, np.zeros(4))

    gradcore.manual_seed(42)  # the same generator; and on device1 the same numbers
    lazy = nn.Linear(4)
    lazy(STRICT.asarray(np.zeros((2, 3), np.float32), device=DEVICE1))
    assert lazy.W.device == DEVICE1 and lazy.b.device == DEVICE1
    np.testing.assert_array_equal(lazy.W.numpy(), lin.W.data)

    np.random.seed(42)
    eager = nn.Linear(3, 4)  # drawn at construction, the same way
    np.testing.assert_array_equal(eager.W.data, lin.W.data)


def test_lazy_parameters_take_the_layers_dtype_float32_by_default():
    lin = nn.Linear(2)
    y = lin(np.ones((1, 3)))  # float64 input, float32 parameters (DeZero's and PyTorch's way)
    assert lin.W.dtype == np.float32 and lin.b.dtype == np.float32 and y.dtype == np.float64
    lin = nn.Linear(2, dtype=np.float64)
    lin(np.ones((1, 3), dtype=np.int64))
    assert lin.W.dtype == np.float64
    conv = nn.Conv2d(2, 1)
    conv(STRICT.asarray(np.ones((1, 3, 2, 2), np.float32), device=DEVICE1))
    assert conv.W.shape == (2, 3, 1, 1) and conv.W.device == DEVICE1 and conv.in_channels == 3
    bn = nn.BatchNorm()
    bn(STRICT.asarray(np.ones((2, 3)), device=DEVICE1))
    for v in (bn.gamma, bn.beta, bn.avg_mean, bn.avg_var):
        assert v.device == DEVICE1 and v.dtype == STRICT.xp.float32 and v.shape == (3,)


def test_set_default_dtype_changes_new_layers_only():
    old = nn.Linear(2, in_size=3)
    assert gradcore.get_default_dtype() == "float32"
    gradcore.set_default_dtype(np.float64)
    try:
        new, lazy = nn.Linear(2, in_size=3), nn.Linear(2)
        lazy(np.ones((1, 3), np.float32))
        assert new.W.dtype == lazy.W.dtype == np.float64 and old.W.dtype == np.float32
        assert nn.BatchNorm().dtype == np.float64
    finally:
        gradcore.set_default_dtype("float32")
    with pytest.raises(ValueError, match="a floating dtype"):
        gradcore.set_default_dtype("int32")


def test_batchnorm_eval_uses_running_statistics(xp2):
    bn = nn.BatchNorm(dtype=np.float64)
    x = np.random.default_rng(1).normal(2.0, 3.0, size=(16, 2))
    bn(xp2.asarray(x))
    mean, var = xp2.numpy(bn.avg_mean.data), xp2.numpy(bn.avg_var.data)
    np.testing.assert_allclose(mean, 0.1 * x.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(var, 0.9 + 0.1 * x.var(axis=0, ddof=1), rtol=1e-12)
    bn.eval()
    y = xp2.numpy(bn(xp2.asarray(x)).data)
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 2e-5), rtol=1e-12)
    np.testing.assert_array_equal(xp2.numpy(bn.avg_mean.data), mean)  # no update in eval


def test_batchnorm_train_mode_refuses_backward_of_a_graph_that_read_its_statistics():
    # the running statistics are updated in place: a loss on avg_mean from before would take
    # the new values. BatchNorm's own train-mode graph reads none of them and still runs
    x0 = np.arange(12.0).reshape(4, 3)  # channel means 4.5, 5.5, 6.5
    weights = np.array([[1.0, -2.0, 0.5], [0.0, 1.0, 3.0], [2.0, 0.0, -1.0], [1.0, 1.0, 0.0]])
    grads = []
    for later_call in (False, True):
        bn = nn.BatchNorm(dtype=np.float64)
        x = gradcore.Variable(x0)
        h = bn(x)
        np.testing.assert_allclose(bn.avg_mean.data, [0.45, 0.55, 0.65], rtol=1e-12)
        w = gradcore.Variable(np.array([1.0, 2.0, 3.0]))
        y = F.sum(bn.avg_mean * w)
        if later_call:
            versions = bn.avg_mean.version, bn.avg_var.version
            bn(gradcore.Variable(x0 * 2.0))
            assert (bn.avg_mean.version, bn.avg_var.version) == (versions[0] + 1, versions[1] + 1)
            with pytest.raises(RuntimeError, match=r'mul: its input 0, the Variable "avg_mean" '
                                                   r"of shape \(3,\) .* was written after mul"):
                y.backward()
        else:
            y.backward()
            np.testing.assert_allclose(w.grad.data, [0.45, 0.55, 0.65], rtol=1e-12)
        F.sum(h * h * weights).backward()
        grads.append(x.grad.data)
    np.testing.assert_array_equal(grads[1], grads[0])
    assert np.abs(grads[0]).max() > 0.1


def test_a_checkpointed_batchnorm_counts_its_update_once():
    # the recomputation during backward leaves the statistics (and so their versions) alone
    bn = nn.BatchNorm(dtype=np.float64)
    x = gradcore.Variable(np.arange(12.0).reshape(4, 3))
    bn(x)
    version = bn.avg_mean.version
    y = gradcore.checkpoint(lambda h: bn(h * 2.0), x)
    assert bn.avg_mean.version == version + 1
    F.sum(y * y * np.array([1.0, -2.0, 0.5])).backward()
    assert bn.avg_mean.version == version + 1 and x.grad is not None


def test_dezeros_batch_nrom_spelling_is_batch_norm():
    # DeZero's BatchNorm layer calls F.batch_nrom (sic): code ported from it finds the name
    assert F.batch_nrom is F.batch_norm
    x = np.random.default_rng(0).normal(2.0, 3.0, size=(16, 2))
    mean, var = np.zeros(2), np.ones(2)
    y = F.batch_nrom(x, np.ones(2), np.zeros(2), mean, var).data
    np.testing.assert_allclose(y, (x - x.mean(axis=0)) / np.sqrt(x.var(axis=0) + 2e-5))
    np.testing.assert_allclose(mean, 0.1 * x.mean(axis=0))


# =============================================================================== containers
def test_sequential_indexing_len_and_names():
    seq = nn.Sequential(nn.Linear(2, 3), F.relu, nn.Linear(3, 1))
    assert len(seq) == 3 and seq[1] is F.relu and seq[-1] is seq[2]
    assert [n for n, _ in seq.named_parameters()] == ["0.W", "0.b", "2.W", "2.b"]
    head = seq[:2]
    assert isinstance(head, nn.Sequential) and head[0] is seq[0] and len(head) == 2
    # a slice keeps the names, as PyTorch's keeps its keys (it renumbered: "0.W" for "2.W")
    tail = seq[1:]
    assert [n for n, _ in tail.named_parameters()] == ["2.W", "2.b"]
    assert tail(np.ones((4, 3), np.float32)).shape == (4, 1)
    assert list(seq) == [seq[0], F.relu, seq[2]]
    assert seq(np.ones((4, 2), np.float32)).shape == (4, 1)
    with pytest.raises(IndexError, match="out of range for 3 layers"):
        seq[3]
    with pytest.raises(TypeError, match="Module or a callable"):
        nn.Sequential(nn.Linear(2), 3)
    assert nn.Sequential()(5.0) == 5.0


def test_module_list_registers_its_modules_as_numbered_children():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4), nn.Linear(3)])

        def forward(self, x):
            for block in self.blocks:
                x = F.relu(block(x))
            return x

    net = Net()
    blocks = net.blocks
    assert len(blocks) == 2 and blocks[-1] is blocks[1] and blocks[1].out_size == 3
    assert net(np.ones((2, 5), np.float32)).shape == (2, 3)
    assert list(net.state_dict()) == ["blocks.0.W", "blocks.0.b", "blocks.1.W", "blocks.1.b"]
    assert [p.shape for p in net.parameters()] == [(5, 4), (4,), (4, 3), (3,)]
    head = blocks[:1]
    assert isinstance(head, nn.ModuleList) and len(head) == 1 and head[0] is blocks[0]
    tanh, relu = nn.Tanh(), nn.ReLU()
    blocks.append(tanh).extend([relu])
    assert list(blocks) == [blocks[0], blocks[1], tanh, relu]
    blocks[2] = sigmoid = nn.Sigmoid()  # replaced in place: same name, same position
    assert list(dict(blocks.named_children())) == ["0", "1", "2", "3"] and blocks[2] is sigmoid


def test_slicing_a_module_list_in_forward_lets_a_compiled_step_replay():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, in_size=3), nn.Linear(4, in_size=4),
                                         nn.Linear(1, in_size=4)])

        def forward(self, x):
            for block in self.blocks[:-1]:
                x = F.relu(block(x))
            return self.blocks[-1](x)

    model = Net()
    eager = Net()
    eager.load_state_dict(model.state_dict())
    opt, eager_opt = (gradcore.optim.SGD(m.parameters(), lr=0.01) for m in (model, eager))

    def train_step(model, opt, x, t):
        opt.zero_grad()
        loss = F.mean_squared_error(model(x), t)
        loss.backward()
        opt.step()
        return loss

    step = gradcore.compile(lambda x, t: train_step(model, opt, x, t))
    x, t = np.ones((5, 3), np.float32), np.ones((5, 1), np.float32)
    for _ in range(6):
        np.testing.assert_allclose(step(x, t).data, train_step(eager, eager_opt, x, t).data,
                                   rtol=1e-6)
    stats = step.stats()
    assert (stats["recordings"], stats["replays"]) == (1, 5)
    head = model.blocks[:2]  # still the same modules, numbered from 0
    assert list(dict(head.named_children())) == ["0", "1"] and head[1] is model.blocks[1]
    assert list(head.state_dict()) == ["0.W", "0.b", "1.W", "1.b"]
    assert len(head.append(nn.ReLU())) == 3 and len(model.blocks) == 3


def test_module_list_refuses_what_is_not_a_module():
    blocks = nn.ModuleList([nn.Linear(2)])
    with pytest.raises(TypeError, match="an item must be a Module, got function .*Sequential"):
        blocks.append(F.relu)
    with pytest.raises(TypeError, match="an item must be a Module, got int"):
        blocks.extend([nn.Linear(3), 3])
    assert len(blocks) == 1  # extend checked every item first
    with pytest.raises(TypeError, match=r"iterable of Modules, got Linear \(for one module: "
                       r"append\)"):
        nn.ModuleList(nn.Linear(3))
    with pytest.raises(IndexError, match="index 1 is out of range for 1 modules"):
        blocks[1]
    with pytest.raises(NotImplementedError, match="ModuleList has no forward"):
        blocks(np.ones((1, 2)))


def test_del_of_a_module_list_item_renumbers_the_rest_as_pytorch_does():
    a, b, c, d = (nn.Linear(2, in_size=2) for _ in range(4))
    blocks = nn.ModuleList([a, b, c, d])
    del blocks[0]
    assert list(blocks) == [b, c, d]
    assert list(blocks.state_dict()) == ["0.W", "0.b", "1.W", "1.b", "2.W", "2.b"]
    assert blocks.state_dict()["0.W"] is b.W.data  # "0" is b now
    del blocks[-1]
    del blocks[:1]
    assert list(blocks) == [c] and list(dict(blocks.named_children())) == ["0"]
    assert len(blocks.append(a)) == 2 and blocks[1] is a  # the next number is "1"
    with pytest.raises(IndexError, match="ModuleList index 2 is out of range for 2 modules"):
        del blocks[2]
    assert list(blocks) == [c, a]


@pytest.mark.parametrize("build", [
    lambda cls: nn.Sequential(nn.Linear(4), cls, nn.Linear(2)),
    lambda cls: nn.Sequential().append(cls),
    lambda cls: nn.ModuleList([nn.Linear(4), cls]),
    lambda cls: nn.ModuleList().append(cls),
    lambda cls: nn.MLP((4, 2), activation=cls),
], ids=["Sequential", "Sequential.append", "ModuleList", "ModuleList.append", "MLP activation"])
def test_a_layer_class_given_for_an_instance_is_refused_naming_both(build):
    with pytest.raises(TypeError, match=r"got the class nn\.ReLU; pass an instance, "
                                        r"nn\.ReLU\(\)"):
        build(nn.ReLU)


def test_a_class_among_dezero_layers_is_refused_naming_its_place():
    from gradcore import models

    class Block(nn.Module):
        def forward(self, x):
            return x

    model = models.Sequential(nn.Linear(2))
    with pytest.raises(TypeError, match=r"^Sequential\.layers\[1\]: got the class .*Block; "
                                        r"pass an instance, .*Block\(\)"):
        model.layers = [model.l0, Block]
    assert model.layers == [model.l0]  # nothing changed


def test_mlp_is_dezero_shaped():
    mlp = nn.MLP((10, 1))
    assert mlp.activation is F.sigmoid and mlp.layers == [mlp.l0, mlp.l1]
    x = np.random.default_rng(0).standard_normal((3, 2))
    y = mlp(x)
    expected = F.sigmoid(x @ mlp.l0.W.data + mlp.l0.b.data).data @ mlp.l1.W.data + mlp.l1.b.data
    np.testing.assert_allclose(y.data, expected, rtol=1e-12)
    relu_mlp = nn.MLP([3, 2], activation=F.relu)
    assert relu_mlp(x).shape == (3, 2)


def test_a_replaced_or_deleted_layer_is_the_one_forward_runs_trains_and_saves():
    x = np.ones((1, 3), np.float32)
    seq = nn.Sequential(nn.Linear(3, 2), F.relu, nn.Linear(2, 1))
    new = nn.Linear(2, 4)
    setattr(seq, "2", new)  # the Module way of replacing a child
    assert seq(x).shape == (1, 4) and seq[2] is new and len(seq) == 3
    assert list(seq.parameters())[2:] == [new.W, new.b]
    delattr(seq, "0")
    h = np.array([[-1.0, 2.0]], np.float32)
    np.testing.assert_array_equal(seq(h).data, new(F.relu(h)).data)
    assert len(seq) == 2 and seq[0] is F.relu and list(seq.state_dict()) == ["2.W", "2.b"]
    seq.append(nn.Linear(5))  # "2" is taken: the next free number, not len(seq)
    assert [name for name, _ in seq.named_children()] == ["1", "2", "3"] and seq[1] is new
    assert seq(h).shape == (1, 5)
    setattr(seq, "3", None)  # a None slot is skipped, as parameters() skips it
    assert seq(h).shape == (1, 4) and len(seq) == 2

    mlp = nn.MLP((4, 2))
    mlp(x)
    old = mlp.l1
    mlp.l1 = nn.Linear(3)
    assert mlp.layers == [mlp.l0, mlp.l1] and mlp(x).shape == (1, 3)
    optim = gradcore.optim.SGD(lr=1.0).setup(mlp)
    before = [p.data.copy() for p in mlp.l1.params()]
    mlp.cleargrads()
    F.sum(mlp(x)).backward()
    optim.update()
    assert old.W.grad is None  # the replaced layer neither runs nor trains
    assert all(not np.array_equal(b, p.data) for b, p in zip(before, mlp.l1.params()))
    del mlp.l1
    assert mlp(x).shape == (1, 4) and list(mlp.state_dict()) == ["l0.W", "l0.b"]

    relu_mlp = nn.MLP((4, 2), activation=nn.ReLU())  # a Module activation is not a layer
    assert relu_mlp.layers == [relu_mlp.l0, relu_mlp.l1] and relu_mlp(x).shape == (1, 2)


def test_mlp_runs_l0_l1_by_index_and_never_a_layer_a_subclass_adds():
    """DeZero's MLP.forward runs its list of l0, l1, ...: a subclass's own layers are its own
    to call, whatever their names and wherever they were registered."""
    x = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)

    class WithNorm(nn.MLP):  # a BatchNorm on the input, before the MLP
        def __init__(self):
            super().__init__((10, 3), activation=F.relu)
            self.norm = nn.BatchNorm()

        def forward(self, x):
            return super().forward(self.norm(x))

    model = WithNorm()
    assert model(x).shape == (6, 3) and model.layers == [model.l0, model.l1]
    assert model.norm.gamma.shape == (4,)

    class Classifier(nn.MLP):  # a second head, used by another method only
        def __init__(self):
            super().__init__((16, 8))
            self.aux = nn.Linear(2)

        def aux_logits(self, x):
            return self.aux(F.sigmoid(self.l0(x)))

    model = Classifier()
    assert model(x).shape == (6, 8) and model.aux.W.data is None  # aux never ran
    assert model.aux_logits(x).shape == (6, 2)

    mlp = nn.MLP((5, 2))
    del mlp.l0
    mlp.l0 = nn.Linear(5)  # registered after l1, still run first
    assert mlp.layers == [mlp.l0, mlp.l1] and mlp(x).shape == (6, 2)
    mlp.l2, mlp.l10, mlp.l01 = nn.Linear(7), nn.Linear(9), nn.Linear(11)
    assert mlp.layers == [mlp.l0, mlp.l1, mlp.l2, mlp.l10]  # by number; "l01" is not one
    mlp.l1 = None  # skipped, as deleted
    assert mlp.layers == [mlp.l0, mlp.l2, mlp.l10] and mlp(x).shape == (6, 9)


def test_a_dezero_subclass_may_assign_mlp_layers():
    """DeZero's MLP keeps self.layers beside l0, l1, ...; a subclass setting it gets those
    layers as l0, l1, ..., and only those run, train and are saved."""
    x = np.ones((2, 4), np.float32)

    class Legacy(nn.MLP):
        def __init__(self):
            super().__init__((5, 2))
            self.layers = [self.l0, self.l1]  # what DeZero's MLP holds already: no change

    model = Legacy()
    assert model.layers == [model.l0, model.l1] and model(x).shape == (2, 2)
    assert list(model.state_dict()) == ["l0.W", "l0.b", "l1.W", "l1.b"]

    class Deeper(nn.MLP):
        def __init__(self):
            super().__init__((5, 2))
            self.head = nn.Linear(3)
            self.built = (self.l0, self.l1)  # a tuple: not registered
            self.layers = [self.l0, F.tanh, self.l1, self.head]

    model = Deeper()
    first, second = model.built
    assert model.layers == [first, F.tanh, second, model.head]
    assert (model.l0, model.l2, model.l3) == (first, second, model.head)
    assert model(x).shape == (2, 3)
    # head's parameters once, under its first name
    assert [name for name, _ in model.named_parameters()] == [
        "l0.W", "l0.b", "head.W", "head.b", "l2.W", "l2.b"]
    model.layers = [model.l0]  # shorter: l1 ... are gone
    assert model.layers == [model.l0] and model(x).shape == (2, 5)
    with pytest.warns(UserWarning, match="Deeper.built is a tuple holding 1 Module"):
        state = model.state_dict()  # `built` still holds the old l1, no longer in the model
    assert list(state) == ["l0.W", "l0.b", "head.W", "head.b"] and model.l0 is first
    with pytest.raises(TypeError, match=r"MLP.layers\[1\]: a layer must be a Module or a "
                       "callable, got int"):
        model.layers = [nn.Linear(3), 3]
    assert model.layers == [model.l0]  # refused before anything changed

    class Copied(nn.MLP):  # DeZero's MLP.__init__ copied into a subclass
        def __init__(self, sizes):
            nn.Module.__init__(self)
            self.activation = F.relu
            self.layers = []
            for i, size in enumerate(sizes):
                layer = nn.Linear(size)
                setattr(self, "l" + str(i), layer)
                self.layers.append(layer)

    model = Copied((3, 2))
    assert model.layers == [model.l0, model.l1] and model(x).shape == (2, 2)


def test_a_weight_or_batch_norm_slot_set_to_none_is_created_again_at_the_next_call():
    """Module: assigning None keeps the name registered; W and BatchNorm's four are lazy slots."""
    for layer, x, slots in (
            (nn.Linear(3, 2), np.ones((1, 3), np.float32), ("W",)),
            (nn.Conv2d(2, 3, in_channels=1), np.ones((1, 1, 4, 4), np.float32), ("W",)),
            (nn.BatchNorm(), np.ones((2, 3), np.float32),
             ("gamma", "beta", "avg_mean", "avg_var"))):
        layer(x)
        names = list(layer.state_dict())
        for slot in slots:
            setattr(layer, slot, None)
            assert slot not in layer.state_dict()
            y = layer(x)
            assert getattr(layer, slot).data is not None and list(layer.state_dict()) == names
            assert y.dtype == np.float32
    assert isinstance(layer.gamma, gradcore.Parameter)
    assert not isinstance(layer.avg_mean, gradcore.Parameter)  # a buffer again, not trained
    assert not layer.avg_mean.requires_grad
    nobias = nn.Linear(3, 2, nobias=True)
    nobias.W = None
    nobias(np.ones((1, 3), np.float32))
    assert nobias.b is None and list(nobias.state_dict()) == ["W"]


@pytest.mark.parametrize("make, x, slots", [
    (lambda: nn.Linear(2), np.ones((2, 3), np.float32), ("W",)),
    (lambda: nn.Conv2d(2, 1, in_channels=1), np.ones((2, 1, 3, 3), np.float32), ("W",)),
    (lambda: nn.BatchNorm(), np.arange(6, dtype=np.float32).reshape(3, 2), ("gamma", "beta")),
])
def test_a_slot_set_to_none_comes_back_as_the_parameter_a_list_built_optimizer_holds(make, x,
                                                                                      slots):
    layer = make()
    layer(x)
    optimizer = gradcore.optim.SGD(list(layer.parameters()), lr=0.5)
    held = {name: getattr(layer, name) for name in slots}
    for name in slots:
        setattr(layer, name, None)
    layer(x)
    optimizer.zero_grad()
    F.sum((layer(x) - 1) ** 2).backward()
    before = {name: p.data.copy() for name, p in held.items()}
    optimizer.step()
    for name, p in held.items():
        assert getattr(layer, name) is p
        np.testing.assert_allclose(p.data, before[name] - 0.5 * p.grad.data)
        assert np.abs(p.grad.data).max() > 0  # so the step moved it


def test_a_weight_made_again_keeps_its_parameter_in_its_old_shape():
    lin = nn.Linear(3, 2)
    x = np.ones((2, 3), np.float32)
    W = lin.W
    lin.W = None
    assert lin.W is None and list(lin.state_dict()) == ["b"]  # empty until the next call
    lin(np.ones((2, 3), np.float32))
    assert lin.W is W and W.grad is None
    # the same weights by hand: W and b, both 1, step by SGD; d sum(x @ W + b) / dW = x.T @ 1
    lin.W.data[...], lin.b.data[...] = 1, 1
    sgd = gradcore.optim.SGD(lin.parameters(), lr=0.25)
    lin.W = None
    lin.nobias = True
    lin.nobias = False  # the same b, as zeros again
    lin(x)
    lin.W.data[...] = 1
    F.sum(lin(x)).backward()
    sgd.step()
    np.testing.assert_array_equal(W.data, np.full((3, 2), 0.5, np.float32))  # 1 - 0.25 * 2
    np.testing.assert_array_equal(lin.b.data, [-0.5, -0.5])  # 0 - 0.25 * 2
    # in another shape W is a new Parameter: the list-built SGD keeps the old one, untouched
    lin.W = None
    lin(np.ones((2, 5), np.float32))
    assert lin.W is not W and lin.W.shape == (5, 2)
    np.testing.assert_array_equal(W.data, np.full((3, 2), 0.5, np.float32))
    # a Parameter assigned by hand is the layer's from then on, with its values
    new = gradcore.Parameter(np.ones((5, 2), np.float32))
    lin.W = None
    lin.W = new
    lin(np.ones((2, 5), np.float32))
    assert lin.W is new and new.data.sum() == 10


@pytest.mark.parametrize("name", ["MomentumSGD", "AdaGrad", "AdaDelta", "Adam"])
def test_a_weight_made_again_in_another_shape_gets_new_state_from_setup(name):
    # setup(model) reads the model's parameters at each update: the new W gets its own state
    lin = nn.Linear(2)
    optimizer = getattr(gradcore.optim, name)().setup(lin)
    F.sum(lin(np.ones((1, 3), np.float32))).backward()
    optimizer.update()
    old = lin.W
    lin.W = None
    lin.cleargrads()
    F.sum(lin(np.ones((1, 4), np.float32))).backward()
    W = lin.W.data.copy()
    optimizer.update()
    assert lin.W is not old and lin.W.shape == (4, 2)
    np.testing.assert_array_equal(lin.W.grad.data, np.ones((4, 2), np.float32))
    if name == "MomentumSGD":  # a fresh v: the first step is -lr * grad
        np.testing.assert_allclose(lin.W.data, W - 0.01, rtol=1e-6)
    else:
        assert np.all(lin.W.data < W)  # every gradient is 1: each weight goes down


@pytest.mark.parametrize("make, x, slot", [
    (lambda: nn.Linear(3, in_size=3), np.ones((2, 3), np.float32), "W"),
    (lambda: nn.Conv2d(2, 3, in_channels=1), np.ones((1, 1, 4, 4), np.float32), "W"),
    (lambda: nn.BatchNorm(), np.arange(6, dtype=np.float32).reshape(3, 2), "gamma"),
])
def test_a_slot_set_to_none_leaves_the_parameter_another_layer_holds(make, x, slot):
    a, b = make(), make()
    a(x)
    shared = getattr(a, slot)
    shared.data = shared.data + 1  # b's values, not a fresh draw of a's
    setattr(b, slot, shared)  # b ties itself to a's weight
    kept, y = shared.data.copy(), b(x).data.copy()
    setattr(a, slot, None)  # a gets a new one at its next call; b keeps its own
    a(x)
    assert getattr(a, slot) is not shared and getattr(b, slot) is shared
    np.testing.assert_array_equal(shared.data, kept)
    np.testing.assert_array_equal(b(x).data, y)


def test_a_bias_brought_back_leaves_the_one_another_layer_holds():
    a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    b.b = a.b
    a.b.data[...] = [1, 2]
    a.nobias = True
    a.nobias = False
    a(np.ones((1, 3), np.float32))
    np.testing.assert_array_equal(b.b.data, [1, 2])
    np.testing.assert_array_equal(a.b.data, [0, 0])


class _TiedPair(nn.Module):  # at module level, so that pickle finds it
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 2), nn.Linear(3, 2)
        self.b.W = self.a.W


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))],
                         ids=["deepcopy", "pickle"])
def test_a_copy_keeps_the_weight_its_other_layer_holds(copier):
    model = copier(_TiedPair())
    shared = model.b.W
    assert model.a.W is shared
    kept = shared.data.copy()
    model.a.W = None  # a gets a new W at its next call; the copy's b keeps the one it had
    model.a(np.ones((1, 3), np.float32))
    assert model.a.W is not shared and model.b.W is shared
    np.testing.assert_array_equal(shared.data, kept)


class _Holder(nn.Module):
    def __init__(self, W):
        super().__init__()
        self.W = W


def _embedding_holding(W):
    emb = nn.EmbedID(3, 3)
    emb.W = W  # weight tying
    return emb


@pytest.mark.parametrize("holding", [_embedding_holding, _Holder], ids=["EmbedID", "custom"])
def test_a_weight_an_embedding_or_a_custom_module_holds_is_left_to_it(holding):
    lin = nn.Linear(3, 3)
    shared = lin.W
    holder = holding(shared)
    kept = shared.data.copy()
    lin.W = None
    lin(np.ones((1, 3), np.float32))
    assert lin.W is not shared and holder.W is shared
    np.testing.assert_array_equal(shared.data, kept)
    # a holder that has let go of it no longer counts: W = None refills the same Parameter
    current = lin.W
    holder.W = current
    holder.W = gradcore.Parameter(np.zeros((3, 3), np.float32))
    lin.W = None
    lin(np.ones((1, 3), np.float32))
    assert lin.W is current


@pytest.mark.parametrize("make, x", [
    (lambda: nn.Linear(3, 2), np.ones((4, 3), np.float32)),
    (lambda: nn.Linear(2), np.ones((4, 3), np.float32)),  # b = None before the first call
    (lambda: nn.Conv2d(2, 3, pad=1), np.ones((1, 2, 4, 4), np.float32)),
    (lambda: nn.Deconv2d(2, 3, in_channels=2), np.ones((1, 2, 3, 3), np.float32)),
])
def test_a_bias_set_to_none_is_no_bias_from_then_on(make, x):
    """DeZero's idiom (its Linear and Conv2d pass self.b, None meaning no bias): b = None is not
    created again; nobias, extra_repr, parameters, state_dict and saving agree."""
    layer = make()
    layer.b = None
    for _ in range(2):
        y = layer(x)
    assert layer.b is None and layer.nobias and "nobias=True" in repr(layer)
    assert list(layer.state_dict()) == ["W"] and list(layer.parameters()) == [layer.W]
    expected = nn.Linear(3, 2, nobias=True) if isinstance(layer, nn.Linear) else None
    if expected is not None:
        expected.W.data = layer.W.data
        np.testing.assert_array_equal(y.data, expected(x).data)
    F.sum(y).backward()
    assert layer.W.grad is not None
    layer.nobias = False  # a bias again: zeros, created at the next call
    assert isinstance(layer.b, gradcore.Parameter) and layer.b.data is None
    np.testing.assert_array_equal(layer(x).data, y.data)
    assert layer.b.data is not None and not layer.nobias and list(layer.state_dict()) == ["W", "b"]
    layer.nobias = True
    assert layer.b is None and list(layer.state_dict()) == ["W"]


def test_a_bias_with_no_data_yet_is_still_filled():
    """A lazy layer never called, or a load that filled W only: b exists, with data None."""
    lin = nn.Linear(2)
    assert not lin.nobias and lin.b.data is None
    lin(np.ones((1, 3), np.float32))
    assert lin.b.shape == (2,)
    partial = nn.Linear(2)
    partial.load_state_dict({"W": np.ones((3, 2), np.float32)}, strict=False)
    partial(np.ones((1, 3), np.float32))
    np.testing.assert_array_equal(partial.b.data, np.zeros(2, np.float32))


def test_a_model_whose_bias_was_set_to_none_trains_and_saves_without_it(tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(4)
            self.l2 = nn.Linear(1)
            self.l2.b = None  # no bias on the output layer

        def forward(self, x):
            return self.l2(F.relu(self.l1(x)))

    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((8, 3)), rng.standard_normal((8, 1)) + 3.0
    model = Net()
    optim = gradcore.optim.SGD(lr=0.1).setup(model)
    for _ in range(3):
        loss = F.mean_squared_error(model(x), t)
        model.cleargrads()
        loss.backward()
        optim.update()
    assert model.l2.b is None
    assert [name for name, _ in model.named_parameters()] == ["l1.W", "l1.b", "l2.W"]
    model.save(tmp_path / "net")
    clone = Net()
    clone.load(tmp_path / "net")
    np.testing.assert_array_equal(clone(x).data, model(x).data)


def test_lazy_layers_take_the_dtype_given_to_to():
    model = nn.Sequential(nn.Linear(4), nn.BatchNorm(), nn.Conv2d(2, 1)).to(dtype="float64")
    model[0](np.ones((8, 3), np.float32))
    model[1](np.ones((8, 4), np.float32))
    model[2](np.ones((1, 4, 2, 2), np.float32))
    assert {str(v.dtype) for v in model.state_dict().values()} == {"float64"}
    rnn = nn.RNN(3).to(dtype=np.float16)
    rnn(np.ones((2, 5), np.float32))
    rnn(np.ones((2, 5), np.float32))  # h2h is made at the second step
    assert {str(v.dtype) for v in rnn.parameters()} == {"float16"}


@pytest.mark.parametrize("make, shape", [
    (lambda: nn.Linear(2, dtype="float16"), (1, 3)),
    (lambda: nn.Conv2d(1, 1, dtype="float16"), (1, 1, 2, 2)),
    (lambda: nn.BatchNorm(dtype="float16"), (2, 3)),
])
def test_a_lazy_layer_in_a_dtype_the_inputs_device_lacks_says_so(make, shape):
    layer = make()
    x = STRICT.asarray(np.ones(shape, np.float32), device=DEVICE1)  # array-api-strict: no float16
    with pytest.raises(ValueError, match=rf"^{type(layer).__name__}: {STRICT.device_type}:device1 "
                       r"has no float16 \(its floating dtypes: float32, float64\)"):
        layer(x)
    assert all(v.data is None for v in layer.parameters())


def test_numpy_integers_are_sizes():
    k, one = np.int64(3), np.int32(1)
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 5)).astype(np.float32)
    for layer in (nn.Conv2d, nn.Deconv2d):
        np.random.seed(0)
        expected = layer(2, 3, stride=1, pad=1)(x).data
        np.random.seed(0)
        np.testing.assert_array_equal(layer(2, k, stride=one, pad=(one, 1))(x).data, expected)
    np.testing.assert_array_equal(F.pooling(x, k, np.int64(2)).data, F.pooling(x, 3, 2).data)
    with pytest.raises(ValueError, match="kernel_size must be an int >= 1"):
        nn.Conv2d(2, np.True_)


# =============================================================================== bad arguments
@pytest.mark.parametrize("make, error, match", [
    (lambda: nn.Linear(), TypeError, "needs out_size"),
    (lambda: nn.Linear(0), ValueError, "out_size must be a positive int"),
    (lambda: nn.Linear(2.5), TypeError, "out_size must be a positive int"),
    (lambda: nn.Linear(3, True), TypeError, "pass nobias by keyword"),
    (lambda: nn.Linear(3, 4, in_size=3), TypeError, "give each once"),
    (lambda: nn.Linear(3, out_size=4), TypeError, "out_size given twice"),
    (lambda: nn.Linear(3, 4, 5), TypeError, "3 positional arguments"),
    (lambda: nn.Linear(3, nobias="yes"), TypeError, "nobias must be True or False"),
    (lambda: nn.Linear(3, dtype=np.int32), ValueError, "floating dtype"),
    (lambda: nn.Conv2d(3, 0), ValueError, "kernel_size must be an int >= 1"),
    (lambda: nn.Conv2d(3, 2, pad=-1), ValueError, "pad must be an int >= 0"),
    (lambda: nn.Deconv2d(3, 2, stride=(1, 2, 3)), ValueError, "stride must be"),
    (lambda: nn.Deconv2d(3, 2, nobias=1), TypeError, "Deconv2d: nobias must be True or False"),
    (lambda: nn.Conv2d(3, 64, 7, 2, 3), TypeError, r"Conv2d: nobias must be True or False, got 3 "
     r"\(a number as the fifth argument: PyTorch's Conv2d\(in_channels, out_channels, "
     r"kernel_size, stride, padding\)\? gradcore's is DeZero's Conv2d\(out_channels, "
     r"kernel_size, stride, pad, nobias\)"),
    (lambda: nn.Dropout(1.0), ValueError, r"dropout_ratio must be a number in \[0, 1\)"),
    (lambda: nn.BatchNorm(decay=1.5), ValueError, "0 <= decay < 1"),
    (lambda: nn.BatchNorm(4), ValueError, r"BatchNorm\(4\): BatchNorm's first argument is "
     r"decay, DeZero's .*not PyTorch's num_features: gradcore's BatchNorm learns its channel "
     r"count from its first input, so give none: BatchNorm\(\). PyTorch's momentum m is "
     r"decay = 1 - m here"),
    (lambda: nn.BatchNorm(num_features=4), TypeError, "BatchNorm got PyTorch's keyword "
     r"num_features=; .* learns the channel count from its first input"),
    (lambda: nn.BatchNorm(momentum=0.1), TypeError, r"takes decay= \(decay = 1 - momentum"),
    (lambda: nn.BatchNorm(0.9, size=3), TypeError, "unexpected keyword argument 'size'"),
    (lambda: nn.Linear(3, 16, bias=False), TypeError, r"Linear got PyTorch's keyword bias=; "
     r"gradcore's Linear takes nobias= \(nobias=True for PyTorch's bias=False\)"),
    (lambda: nn.Linear(out_features=3), TypeError, "takes out_size="),
    (lambda: nn.Linear(3, size=2), TypeError, "unexpected keyword argument 'size'"),
    (lambda: nn.Conv2d(16, 3, padding=1), TypeError, r"Conv2d got PyTorch's keyword padding=; "
     r"gradcore's Conv2d takes pad= \(pad=1 for PyTorch's padding=1\)$"),
    (lambda: nn.Conv2d(3, 16, 3, padding=1), TypeError, r"takes pad= .*; and the order of the "
     r"arguments is DeZero's, Conv2d\(out_channels, kernel_size, stride=1, pad=0, nobias=False, "
     r"dtype=None, in_channels=None\): PyTorch's Conv2d\(3, 16, 3, ...\) is "
     r"Conv2d\(16, 3, ..., in_channels=3\) here"),
    (lambda: nn.Conv2d(16, 3, bias=False), TypeError, r"takes nobias= \(nobias=True"),
    (lambda: nn.Conv2d(16, 3, dilation=2), TypeError, "takes no dilation"),
    (lambda: nn.Deconv2d(3, 16, 3, groups=2), TypeError, r"Deconv2d got PyTorch's keyword "
     r"groups=; .* PyTorch's ConvTranspose2d\(3, 16, 3, ...\) is Deconv2d\(16, 3, ..., "
     r"in_channels=3\)"),
    (lambda: nn.Conv2d(16, 3, 1, stride=2), TypeError, r"Conv2d\(out_channels, kernel_size, "
     r".*\): got multiple values for argument 'stride'"),
    (lambda: nn.Conv2d(16, 3, 1, 0, False, None, 3, 1), TypeError, "takes at most 7 arguments "
     "by position, got 8"),
    (lambda: nn.Conv2d(16, 3, size=2), TypeError, "unexpected keyword argument 'size'"),
    # PyTorch's most common spelling: Python's own error said 'got multiple values for
    # argument kernel_size', naming a private class
    (lambda: nn.Conv2d(3, 16, kernel_size=3, padding=1), TypeError, r"^Conv2d\(3, 16, "
     r"kernel_size=\.\.\.\) is PyTorch's order \(in_channels, out_channels, kernel_size\); "
     r"gradcore's Conv2d is DeZero's, .*: write Conv2d\(16, 3, pad=1, in_channels=3\)$"),
    (lambda: nn.Deconv2d(16, 3, kernel_size=4, stride=2, padding=1, bias=False), TypeError,
     r"write Deconv2d\(3, 4, stride=2, pad=1, nobias=True, in_channels=16\)$"),
    # the other layers' PyTorch keywords got Python's bare 'unexpected keyword argument'
    (lambda: nn.Dropout(p=0.2), TypeError, r"Dropout got PyTorch's keyword p=; gradcore's "
     r"Dropout takes dropout_ratio= \(PyTorch's p=0\.2 is dropout_ratio=0\.2\)"),
    (lambda: nn.Dropout(ratio=0.2), TypeError, r"unexpected keyword argument 'ratio' \(it "
     r"takes dropout_ratio\)"),
    (lambda: nn.LSTM(input_size=3, hidden_size=10), TypeError, "LSTM got PyTorch's keyword "
     "input_size=; gradcore's LSTM takes in_size="),
    (lambda: nn.RNN(10, batch_first=True), TypeError, r"takes no batch_first=: a call takes "
     r"one time step, x \(N, in_size\)"),
    (lambda: nn.Embedding(num_embeddings=10, embedding_dim=4), TypeError, r"EmbedID got "
     r"PyTorch's keyword num_embeddings=; gradcore's EmbedID takes in_size= \(the number"),
    (lambda: nn.ReLU(inplace=True), TypeError, "ReLU got PyTorch's keyword inplace="),
    (lambda: nn.EmbedID(0, 3), ValueError, "in_size must be a positive int"),
    (lambda: nn.RNN(0), ValueError, "hidden_size must be a positive int"),
    (lambda: nn.LSTM(3, in_size="4"), TypeError, "in_size must be a positive int"),
    (lambda: nn.MLP(()), ValueError, "fc_output_sizes is empty"),
    (lambda: nn.MLP(5), TypeError, "sequence of ints"),
    (lambda: nn.MLP((5,), activation=3), TypeError, "activation must be callable"),
])
def test_bad_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("layer, torch_name, shape", [
    (nn.Conv2d, "Conv2d", (1, 16, 30, 30)), (nn.Deconv2d, "ConvTranspose2d", (1, 16, 34, 34))])
def test_a_convolution_in_pytorch_s_order_is_warned_about_at_its_first_input(
        layer, torch_name, shape, recwarn):
    # Linear(3, 16) takes PyTorch's (in, out): Conv2d(3, 16, 3), PyTorch's (in, out, kernel),
    # reads as DeZero's (out_channels=3, kernel_size=16, stride=3) and runs
    x = np.zeros((1, 3, 32, 32), np.float32)
    name = layer.__name__
    conv = layer(3, 16, 3)
    with pytest.warns(UserWarning) as caught:
        y = conv(x)
    assert y.shape[1] == 3 and conv.W.shape[2:] == (16, 16) and conv.stride == 3
    assert len(caught) == 1 and caught[0].filename == __file__  # the line that called it
    assert str(caught[0].message) == (
        f"{name}(3, 16, 3) reads as DeZero's {name}(out_channels=3, kernel_size=16, stride=3), "
        "and its first input has 3 channels, as many as out_channels: if you meant PyTorch's "
        f"{torch_name}(in_channels, out_channels, kernel_size), write it {name}(16, 3, "
        "in_channels=3) here (out_channels and kernel_size first; in_channels, stride and pad "
        f"by keyword). Pass stride by keyword ({name}(3, 16, stride=3)) to silence this warning")
    conv(x)  # once per layer
    assert layer(16, 3, in_channels=3)(x).shape == shape  # PyTorch's meaning, written here
    layer(3, 16, stride=3)(x)  # stride by keyword: DeZero's meaning, said plainly
    layer(4, 3, 1)(x)  # 3 channels in, not as many as out_channels
    layer(3, 3, 1, 1, False, None, 3)(x)  # DeZero's arguments, all by position
    assert [str(w.message) for w in recwarn] == []


@pytest.mark.parametrize("make, x", [
    (lambda: nn.Conv2d(64, 3, 1, 1, nobias=True), (1, 64, 8, 8)),  # DeZero's ResNet bottleneck
    (lambda: nn.Conv2d(64, 3, 1), (1, 64, 8, 8)),  # its (out, kernel, stride), pad left out
    (lambda: nn.Conv2d(64, 7, 2, 3), (1, 64, 16, 16)),  # ResNet's first, on 64 channels
    (lambda: nn.Conv2d(8, 4, 4), (1, 8, 16, 16)),  # patches: stride = kernel
    (lambda: nn.Conv2d(16, 11, 4), (1, 16, 32, 32)),  # AlexNet's kernel and stride
    (lambda: nn.Deconv2d(8, 4, 2, 1), (1, 8, 5, 5)),  # a DCGAN-style upsampling
    (lambda: nn.Deconv2d(8, 4, 2), (1, 8, 5, 5)),
    (lambda: nn.Conv2d(3, 16, 40), (1, 3, 32, 32)),  # PyTorch's kernel 40 > 32: not PyTorch's
    (lambda: nn.Conv2d(3, 16, 3, 0), (1, 3, 32, 32)),  # a fourth by position: ambiguous
])
def test_dezero_s_convolutions_by_position_are_not_warned_about(make, x, recwarn):
    # out_channels equal to the input's channels, stride by position, as PyTorch's (in, out,
    # kernel) would have it: but read as DeZero's they are ordinary layers
    make()(np.ones(x, np.float32))
    assert [str(w.message) for w in recwarn] == []


@pytest.mark.parametrize("make, x, reading", [
    (lambda: nn.Conv2d(3, 6, 5), (1, 3, 32, 32), "out_channels=3, kernel_size=6, stride=5"),
    (lambda: nn.Conv2d(1, 6, 5), (1, 1, 28, 28), "out_channels=1, kernel_size=6, stride=5"),
    (lambda: nn.Conv2d(16, 32, 3), (1, 16, 64, 64), "out_channels=16, kernel_size=32, stride=3"),
    (lambda: nn.Conv2d(8, 10, 3), (1, 8, 9, 9), "out_channels=8, kernel_size=10, stride=3"),
    (lambda: nn.Conv2d(4, 2, 3), (1, 4, 8, 8), "out_channels=4, kernel_size=2, stride=3"),
    (lambda: nn.Deconv2d(64, 32, 4), (1, 64, 8, 8), "out_channels=64, kernel_size=32, stride=4"),
])
def test_pytorch_s_convolutions_are_warned_about_where_dezero_s_reading_is_unlikely(
        make, x, reading):
    # LeNet's Conv2d(3, 6, 5): stride 5 and not the kernel; a kernel over 11, or over the input
    # (a 10x10 kernel on 9x9: the op could not run); a stride over the kernel
    layer = make()
    with pytest.warns(UserWarning, match="reads as DeZero's") as caught:
        try:
            layer(np.ones(x, np.float32))
        except ValueError:  # the kernel larger than the input: the op refuses it after
            pass
    assert len(caught) == 1 and f"DeZero's {type(layer).__name__}({reading})" in str(
        caught[0].message)


# fmt: off
@pytest.mark.parametrize("layer, args, channels, warns", [
    # PyTorch's order on an image: (in=3, out=8, kernel=3) reads as out=3, an 8x8 kernel, stride 3
    (nn.Conv2d,   (3, 8, 3),     3,  True),
    (nn.Conv2d,   (3, 6, 3),     3,  True),
    (nn.Conv2d,   (3, 10, 3),    3,  True),
    (nn.Conv2d,   (3, 4, 2),     3,  True),
    (nn.Conv2d,   (1, 8, 3),     1,  True),   # grayscale
    (nn.Deconv2d, (3, 8, 3),     3,  True),
    (nn.Conv2d,   (3, 8, 3),     16, False),  # the input is not PyTorch's in_channels
    # DeZero's (out, kernel, stride[, pad]): the book's, gradcore.models', and kernels odd or
    # a patch's on an image
    (nn.Conv2d,   (16, 3, 1, 1), 16, False),
    (nn.Conv2d,   (64, 3, 1, 1), 64, False),  # VGG16's, ResNet's
    (nn.Conv2d,   (64, 7, 2, 3), 3,  False),  # ResNet's first
    (nn.Conv2d,   (64, 3, 1),    64, False),
    (nn.Conv2d,   (64, 4, 2),    64, False),  # an even kernel on hidden channels
    (nn.Conv2d,   (3, 3, 1),     3,  False),
    (nn.Conv2d,   (1, 3, 1),     1,  False),
    (nn.Conv2d,   (3, 5, 2),     3,  False),
    (nn.Conv2d,   (3, 1, 1),     3,  False),
    (nn.Conv2d,   (3, 4, 4),     3,  False),  # patches: stride = kernel
    (nn.Deconv2d, (3, 2, 2),     3,  False),
])
# fmt: on
def test_pytorch_s_order_on_an_image_is_warned_about_where_dezero_s_kernel_is_even(
        layer, args, channels, warns, recwarn):
    # a layer keeping an image's channels with an even kernel that is not its stride: the
    # kernel is PyTorch's out_channels (6, 8, 16...), DeZero's are odd or a patch's
    layer(*args)(np.ones((1, channels, 32, 32), np.float32))
    messages = [str(w.message) for w in recwarn]
    if not warns:
        assert messages == []
        return
    name, (out, k, stride) = layer.__name__, args
    assert len(messages) == 1 and f"write it {name}({k}, {stride}, in_channels={out}) here" in (
        messages[0])


def test_bad_first_inputs_leave_lazy_layers_unset():
    lin = nn.Linear(3)
    with pytest.raises(ValueError, match=r"x must be \(in_size,\), \(batch, in_size\) or "
                                         r"\(\.\.\., in_size\), got shape \(\)"):
        lin(np.float64(4.0))
    assert lin.W.data is None and lin.b.data is None
    one = nn.Linear(3)(np.ones(4))  # one example (in,), as PyTorch's: (out,)
    assert one.shape == (3,)
    conv = nn.Conv2d(2, 3)
    with pytest.raises(ValueError, match=r"x must be 4-d \(N, C, H, W\)"):
        conv(np.ones((2, 3)))
    assert conv.W.data is None
    bn = nn.BatchNorm()
    with pytest.raises(ValueError, match="channels on axis 1"):
        bn(np.ones(3))
    assert bn.gamma.data is None
    lin = nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"linear: x \(1, 4\) and W \(3, 2\) do not match"):
        lin(np.ones((1, 4), np.float32))


@pytest.mark.parametrize("make, x", [
    (lambda: nn.Linear(3), [[1.0, 2.0]]),
    (lambda: nn.Conv2d(2, 3), np.ones((1, 1, 4, 4)).tolist()),
    (lambda: nn.BatchNorm(), ((1.0, 2.0),)),
])
def test_a_lazy_layer_refuses_a_list_input_as_the_ops_do(make, x):
    layer = make()
    name = type(layer).__name__
    with pytest.raises(TypeError, match=rf"{name}: unsupported input of type "
                       r"builtins\.(list|tuple) \(convert it first: numpy\.asarray"):
        layer(x)
    assert all(p.data is None for p in layer.parameters())  # nothing was created
    with pytest.raises(TypeError, match="unsupported input of type builtins.list"):
        F.linear([[1.0, 2.0]], nn.Linear(3, in_size=2).W)  # the op's own refusal


def test_a_partial_load_into_a_lazy_layer_is_completed_by_the_first_call():
    for layer, W, x_shape, y_shape in (
            (nn.Conv2d(4, 3), np.ones((4, 2, 3, 3)), (1, 2, 5, 5), (1, 4, 3, 3)),
            (nn.Deconv2d(4, 3), np.ones((2, 4, 3, 3)), (1, 2, 3, 3), (1, 4, 5, 5)),
            (nn.Linear(4), np.ones((2, 4)), (3, 2), (3, 4))):
        result = layer.load_state_dict({"W": W}, strict=False)
        assert result.missing_keys == ["b"]
        y = layer(np.ones(x_shape))
        assert y.shape == y_shape and layer.b.shape == (4,)
        np.testing.assert_array_equal(layer.W.data, W)


def test_a_lazy_layer_filled_by_a_load_reads_its_input_size_from_the_weights(tmp_path):
    rng = np.random.default_rng(0)
    for make, x_shape, size_of in (
            (lambda: nn.Linear(3), (2, 5), lambda m: m.in_size),
            (lambda: nn.Conv2d(4, 3), (1, 2, 5, 5), lambda m: m.in_channels),
            (lambda: nn.Deconv2d(4, 3), (1, 6, 3, 3), lambda m: m.in_channels),
            (lambda: nn.RNN(3), (2, 7), lambda m: m.x2h.in_size)):
        x = rng.standard_normal(x_shape).astype(np.float32)
        built = make()
        built(x)
        built(x)  # an RNN makes h2h at its second step
        built.save(tmp_path / "built")
        by_state, by_file = make(), make()
        assert size_of(by_state) is None  # not learnt yet
        by_state.load_state_dict(built.state_dict())
        by_file.load(tmp_path / "built")
        for layer in (by_state, by_file):
            assert size_of(layer) == x_shape[1] == size_of(built)  # before any forward pass
            assert f"in_{'size' if len(x_shape) == 2 else 'channels'}={x_shape[1]}" in repr(layer)
            layer(x)
            assert size_of(layer) == x_shape[1]


def test_a_weight_assigned_by_hand_gives_the_input_size():
    lin = nn.Linear(3)
    lin.W = gradcore.Parameter(np.ones((6, 3), np.float32))
    assert lin.in_size == 6
    np.testing.assert_array_equal(lin(np.ones((1, 6), np.float32)).data, [[6.0, 6.0, 6.0]])
    lin.W = None  # created again at the next call, from that input
    assert lin.in_size is None
    lin(np.ones((1, 2), np.float32))
    assert lin.in_size == 2 and lin.W.shape == (2, 3)


class _DeZeroLinear(nn.Linear):  # DeZero's Linear.__init__ and forward, ported as they are
    def __init__(self, out_size, in_size=None):
        super().__init__(out_size, in_size=in_size)
        self.in_size = in_size

    def forward(self, x):
        if self.W.data is None:
            self.in_size = x.shape[1]
            self._initialize(*nn.layers._placement(x, self, "Linear"), self.in_size)
        return F.linear(x, self.W, self.b)


def test_the_input_size_may_be_assigned_as_dezero_does():
    lazy = _DeZeroLinear(3)
    assert lazy.in_size is None
    assert lazy(np.ones((2, 5), np.float32)).shape == (2, 3)
    assert lazy.in_size == 5 and lazy.W.shape == (5, 3)
    assert _DeZeroLinear(3, in_size=4).in_size == 4
    for layer, name, size in ((nn.Linear(3), "in_size", 2), (nn.Conv2d(4, 3), "in_channels", 2),
                              (nn.Deconv2d(4, 3), "in_channels", 2)):
        setattr(layer, name, size)
        assert getattr(layer, name) == size and layer.W.data is None
        setattr(layer, name, size)  # the same size again is no contradiction
        with pytest.raises(TypeError, match=f"{name} must be a positive int"):
            setattr(layer, name, "2")
    # once W has data its shape is the size: another one is refused, as a load of that shape
    for layer, name, size in ((nn.Linear(3, in_size=4), "in_size", 4),
                              (nn.Conv2d(4, 3, in_channels=2), "in_channels", 2),
                              (nn.Deconv2d(4, 3, in_channels=2), "in_channels", 2)):
        setattr(layer, name, size)
        with pytest.raises(ValueError, match=rf"cannot set {name} to 7: W has shape .*set W to "
                                             "None first"):
            setattr(layer, name, 7)
        assert getattr(layer, name) == size
    lin = nn.Linear(3, in_size=4)
    lin.W = None
    lin.in_size = 7  # W has no data: taken, and W is made at the next call from that input
    assert lin.in_size == 7
    lin(np.ones((1, 2), np.float32))
    assert lin.in_size == 2
