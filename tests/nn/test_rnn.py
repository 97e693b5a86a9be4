"""RNN and LSTM: values against NumPy, state carried across calls, reset_state, lazy devices,
truncated backprop, a batch of another size refused."""
import numpy as np
import pytest

import gradcore
import gradcore.functions as F
import gradcore.nn as nn
from conftest import DEVICE1, STRICT


def _np(xp, v):
    return None if v is None else xp.numpy(v.data)


def np_rnn_step(rnn, xp, x, h):
    W, b = _np(xp, rnn.x2h.W), _np(xp, rnn.x2h.b)
    y = x @ W + b
    if h is not None:
        y = y + h @ _np(xp, rnn.h2h.W)
    return np.tanh(y)


def np_lstm_step(lstm, xp, x, h, c):
    def pre(x2, h2):
        y = x @ _np(xp, x2.W) + _np(xp, x2.b)
        return y if h is None else y + h @ _np(xp, h2.W)

    def sigmoid(a):
        return 1 / (1 + np.exp(-a))

    f = sigmoid(pre(lstm.x2f, lstm.h2f))
    i = sigmoid(pre(lstm.x2i, lstm.h2i))
    o = sigmoid(pre(lstm.x2o, lstm.h2o))
    u = np.tanh(pre(lstm.x2u, lstm.h2u))
    c = i * u if c is None else f * c + i * u
    return o * np.tanh(c), c


def test_rnn_state_carries_and_resets(xp2):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 3)) for _ in range(3)]
    rnn = nn.RNN(4)
    h = None
    outputs = []
    for x in xs:
        y = rnn(xp2.asarray(x))
        assert y.device == xp2.device and y.shape == (2, 4)
        h = np_rnn_step(rnn, xp2, x, h)
        np.testing.assert_allclose(xp2.numpy(y.data), h, rtol=1e-12)
        outputs.append(h)
    assert rnn.h is y
    # every parameter exists, on the input's device, after the first call
    assert all(p.data is not None and p.device == xp2.device for p in rnn.parameters())
    assert [n for n, _ in rnn.named_parameters()] == ["x2h.W", "x2h.b", "h2h.W"]

    rnn.reset_state()
    assert rnn.h is None
    y = rnn(xp2.asarray(xs[0]))
    np.testing.assert_allclose(xp2.numpy(y.data), outputs[0], rtol=1e-12)
    assert not np.allclose(outputs[0], outputs[1])


def test_lstm_state_carries_and_resets(xp2):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((2, 3)) for _ in range(3)]
    lstm = nn.LSTM(4)
    h = c = None
    first = None
    for x in xs:
        y = lstm(xp2.asarray(x))
        assert y.device == xp2.device and y.shape == (2, 4)
        h, c = np_lstm_step(lstm, xp2, x, h, c)
        np.testing.assert_allclose(xp2.numpy(y.data), h, rtol=1e-12)
        np.testing.assert_allclose(xp2.numpy(lstm.c.data), c, rtol=1e-12)
        first = h if first is None else first
    assert len(list(lstm.parameters())) == 12  # 4 x2* (W, b) and 4 h2* (W)
    assert all(p.device == xp2.device for p in lstm.parameters())

    lstm.reset_state()
    assert lstm.h is None and lstm.c is None
    np.testing.assert_allclose(xp2.numpy(lstm(xp2.asarray(xs[0])).data), first, rtol=1e-12)


def test_eager_sizes_create_everything_on_the_cpu():
    rnn = nn.RNN(4, in_size=3)
    assert rnn.x2h.W.shape == (3, 4) and rnn.h2h.W.shape == (4, 4) and rnn.h2h.b is None
    lstm = nn.LSTM(4, in_size=3)
    assert lstm.x2u.W.shape == (3, 4) and lstm.h2o.W.shape == (4, 4)
    assert all(isinstance(p.data, np.ndarray) for p in lstm.parameters())


def test_truncated_backprop_through_the_state():
    rnn = nn.RNN(3, in_size=2)
    x = np.ones((1, 2))
    loss = F.sum(rnn(x)) + F.sum(rnn(x))
    loss.backward()
    assert rnn.h2h.W.grad is not None  # the second step went through h
    loss.unchain_backward()  # cut the graph behind: the state stays, without its history
    rnn.cleargrads()
    h3 = rnn(x)
    F.sum(h3).backward()
    # only the last step contributes: dW = x^T (1 - h3^2), nothing from the earlier steps
    np.testing.assert_allclose(rnn.x2h.W.grad.data, x.T @ (1 - h3.data ** 2), rtol=1e-6)


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_parameter_as_the_state_is_refused_saying_how_to_learn_a_first_state(
        kind, checkpointed):
    """rnn.h = Parameter(h0) registered h as a weight, and the first call then failed to set
    the new state ("cannot assign a Variable to RNN.h, which holds a parameter: assign a
    Parameter"), advice that cannot work. The route the message gives trains h0."""
    np.random.seed(0)
    layer = getattr(nn, kind)(4, in_size=3)
    layer.to(dtype="float64")
    with pytest.raises(TypeError, match=rf"cannot assign a Parameter to {kind}\.h: it is the "
                       rf"state carried from call to call.*{kind.lower()}\.reset_state\(\); "
                       rf"{kind.lower()}\.h = F\.broadcast_to\(self\.h0, \(batch, 4\)\)"):
        layer.h = nn.Parameter(np.zeros((1, 4)))
    assert layer.h is None and [n for n, _ in layer.named_parameters() if "." not in n] == []
    h0 = nn.Parameter(np.random.randn(1, 4))
    x = np.random.randn(2, 3)
    step = (lambda x: gradcore.checkpoint(layer, x)) if checkpointed else layer
    layer.h = F.broadcast_to(h0, (2, 4))
    F.sum(step(x)).backward()
    # the same first state as a leaf: its gradient, summed over the batch, is h0's
    layer.reset_state()
    layer.h = gradcore.Variable(np.broadcast_to(h0.data, (2, 4)).copy())
    first = layer.h
    F.sum(layer(x)).backward()
    np.testing.assert_allclose(h0.grad.data, first.grad.data.sum(axis=0, keepdims=True),
                               rtol=1e-13)
    if kind == "RNN":  # d/dh sum(tanh(x W + b + h Wh)) = (1 - y^2) Wh^T
        y = np.tanh(x @ layer.x2h.W.data + layer.x2h.b.data + first.data @ layer.h2h.W.data)
        np.testing.assert_allclose(first.grad.data, (1 - y ** 2) @ layer.h2h.W.data.T,
                                   rtol=1e-13)
    assert np.abs(h0.grad.data).max() > 0.01


def test_a_batch_of_another_size_needs_reset_state():
    for layer in (nn.RNN(4), nn.LSTM(4)):
        name = type(layer).__name__
        layer(np.ones((8, 3), np.float32))
        for rows in (1, 5):  # a state of 8 rows would broadcast against 1, or 5 fail deep inside
            with pytest.raises(ValueError, match=rf"{name}: the input has a batch of {rows}, the "
                               r"state carried from the last call a batch of 8: call "
                               r"reset_state\(\)"):
                layer(np.ones((rows, 3), np.float32))
        layer.reset_state()
        layer(np.ones((1, 3), np.float32))
        with pytest.raises(ValueError, match="a batch of 1: call reset_state"):
            layer(np.ones((5, 3), np.float32))  # a state of 1 row would broadcast against 5
        assert layer(np.ones((1, 3), np.float32)).shape == (1, 4)


@pytest.mark.parametrize("make", [nn.RNN, nn.LSTM])
def test_an_input_of_another_size_is_refused_naming_the_layer_and_its_order(make):
    # PyTorch's nn.LSTM(input_size=10, hidden_size=20) is LSTM(hidden_size=10, in_size=20) here
    name = make.__name__
    layer = make(10, 20)
    with pytest.raises(ValueError, match=(
            rf"^{name}: the input has 10 features, but this {name} was built for in_size=20 "
            rf"\(hidden_size=10\): gradcore's {name} takes \(hidden_size, in_size\), DeZero's "
            rf"order, the reverse of PyTorch's. It looks like PyTorch's order "
            rf"{name}\(input_size=10, hidden_size=20\): write {name}\(20, in_size=10\) here, or "
            rf"{name}\(20\) to learn in_size from the first input$")) as caught:
        layer(np.ones((2, 10), np.float32))
    assert "do not match" in str(caught.value.__cause__)  # linear's own error, kept as the cause
    assert layer.h is None  # nothing carried from the refused call
    with pytest.raises(ValueError, match=rf"the input has 7 features, but this {name} was built "
                       rf"for in_size=20 .*If you meant PyTorch's {name}\(input_size=7, "
                       rf"hidden_size=10\), write {name}\(10, in_size=7\) here"):
        layer(np.ones((2, 7), np.float32))
    for layer in (make(10, 20), make(10)):  # PyTorch's (length, batch, features) at once
        with pytest.raises(ValueError, match=rf"{name}: x must be 2-d \(batch, in_size\), one "
                           r"time step per call, got shape \(5, 2, 20\)"):
            layer(np.ones((5, 2, 20), np.float32))
        # one example, no batch axis: taken at the first call, its state (20,) refused the
        # second's as "a batch of 10, the state a batch of 20"
        with pytest.raises(ValueError, match=rf"got shape \(10,\); one example is a batch of "
                                             rf"one: {name.lower()}\(x\[None\]\)"):
            layer(np.ones(10, np.float32))
        assert layer.h is None
    assert make(20, in_size=10)(np.ones((2, 10), np.float32)).shape == (2, 20)


@pytest.mark.parametrize("make, h2h", [(nn.RNN, "h2h.W"), (nn.LSTM, "h2u.W")])
def test_a_lazy_layer_refuses_a_state_weight_not_hidden_by_hidden(make, h2h):
    """h2*.W reads the state h, so it is (hidden_size, hidden_size) before any call too."""
    source = make(3)
    for _ in range(2):  # an RNN makes h2h at its second step
        source(np.ones((2, 4), np.float32))
    state = dict(source.state_dict(), **{h2h: np.zeros((4, 3), np.float32)})
    lazy = make(3)
    before = {name: p.data for name, p in lazy.named_parameters()}
    with pytest.raises(ValueError, match=rf"{h2h}: shape \(4, 3\) in the state, \(3, 3\) in "
                       r"the model\. Nothing was loaded"):
        lazy.load_state_dict(state)
    assert all(p.data is before[name] for name, p in lazy.named_parameters())


def test_a_lazy_lstm_refuses_gates_that_disagree_on_the_input_size():
    """The four x2* read one x, so they must take one in_size from a state: else every later
    call would fail in one gate's matmul."""
    source = nn.LSTM(3, in_size=5)
    bad = dict(source.state_dict(), **{"x2o.W": np.zeros((6, 3), np.float32)})
    lazy = nn.LSTM(3)
    with pytest.raises(ValueError, match=r"x2f\.W \(5, 3\) in the state, .*x2o\.W \(6, 3\) in "
                       r"the state, .*: the LSTM learns one size from its input for every \? of its "
                       r"shapes, so these must agree\. Nothing was loaded"):
        lazy.load_state_dict(bad)
    assert all(p.data is None for name, p in lazy.named_parameters() if name.startswith("x2"))
    # one gate filled first (a partial load): a later load must agree with it
    lazy.load_state_dict({"x2f.W": source.x2f.W.data}, strict=False)
    with pytest.raises(ValueError, match=r"x2f\.W \(5, 3\) in the model, x2i\.W \(6, 3\) in "
                       r"the state.*must agree"):
        lazy.load_state_dict({"x2i.W": np.zeros((6, 3), np.float32)}, strict=False)
    lazy.load_state_dict(source.state_dict())  # one in_size: loads, and runs as the source
    x = np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)
    np.testing.assert_array_equal(lazy(x).data, source(x).data)


def _linear_draw(in_size, out_size):
    """What a Linear draws for W from NumPy's global generator: randn(in, out) * sqrt(1 / in),
    in float32 (DeZero's initialisation, and gradcore's)."""
    return np.random.randn(in_size, out_size).astype(np.float32) * np.float32(np.sqrt(1 / in_size))


def test_rnn_draws_its_weights_in_dezero_order():
    """DeZero makes a lazy RNN's x2h at the first call and h2h at the second (the first with a
    state), so a Linear after the RNN draws between them: np.random.seed gives its weights."""
    np.random.seed(0)
    rnn, fc = nn.RNN(3), nn.Linear(1)
    x = np.ones((1, 1), np.float32)
    fc(rnn(x))
    assert rnn.h2h.W.data is None  # not drawn yet
    fc(rnn(x))
    np.random.seed(0)
    x2h, w_fc, h2h = _linear_draw(1, 3), _linear_draw(3, 1), _linear_draw(3, 3)
    np.testing.assert_allclose(rnn.x2h.W.data, x2h, rtol=1e-6)
    np.testing.assert_allclose(fc.W.data, w_fc, rtol=1e-6)
    np.testing.assert_allclose(rnn.h2h.W.data, h2h, rtol=1e-6)
    assert list(rnn.state_dict()) == ["x2h.W", "x2h.b", "h2h.W"]
    # with in_size both are made at once, x2h first; h2h reads the state: (hidden, hidden)
    np.random.seed(1)
    eager = nn.RNN(3, in_size=2)
    np.random.seed(1)
    np.testing.assert_allclose(eager.x2h.W.data, _linear_draw(2, 3), rtol=1e-6)
    np.testing.assert_allclose(eager.h2h.W.data, _linear_draw(3, 3), rtol=1e-6)


def test_a_lazy_rnn_of_one_step_sequences_saves_and_loads(tmp_path):
    """An RNN that only sees one-step sequences never reaches the second call that makes h2h:
    state_dict() (and save()) makes it then, as that call would have (its shape is known)."""
    x = np.random.RandomState(1).rand(3, 4).astype(np.float32)
    np.random.seed(0)
    rnn = nn.RNN(5)
    with pytest.raises(ValueError, match=r"x2h\.W, x2h\.b, h2h\.W not initialised yet"):
        rnn.state_dict()  # before any call: nothing is sized, nothing is drawn
    assert rnn.h2h.W.data is None
    for _ in range(3):
        rnn.reset_state()
        rnn(x)
    assert rnn.h2h.W.data is None
    state = rnn.state_dict()
    assert list(state) == ["x2h.W", "x2h.b", "h2h.W"]
    np.random.seed(0)
    _linear_draw(4, 5)  # x2h.W, drawn at the first call; h2h.W comes next, as at a second call
    np.testing.assert_allclose(state["h2h.W"], _linear_draw(5, 5), rtol=1e-6)
    assert state["h2h.W"].dtype == np.float32

    # into a fresh lazy RNN, whose second call then uses the loaded h2h.W
    rnn.reset_state()
    expected = [rnn(x).data, rnn(x).data]
    loaded = nn.RNN(5)
    loaded.load_state_dict(state)
    np.testing.assert_array_equal(loaded.h2h.W.data, state["h2h.W"])
    np.testing.assert_allclose(loaded(x).data, expected[0], rtol=1e-6)
    np.testing.assert_allclose(loaded(x).data, expected[1], rtol=1e-6)
    np.testing.assert_array_equal(loaded.h2h.W.data, state["h2h.W"])  # not drawn again

    # save() after the first call too (it reads state_dict), and load() into a fresh one
    np.random.seed(2)
    once = nn.RNN(5)
    once(x)
    path = once.save(tmp_path / "rnn")
    fresh = nn.RNN(5)
    fresh.load(path)
    for name, p in once.named_parameters():
        np.testing.assert_array_equal(dict(fresh.named_parameters())[name].data, p.data)


def test_lstm_draws_its_weights_in_dezero_order():
    """DeZero makes the h2* (hidden, hidden) in the constructor, f, i, o, u, and a lazy LSTM's
    x2* at its first call, in the same gate order."""
    np.random.seed(0)
    lstm = nn.LSTM(2)
    lstm(np.ones((1, 3), np.float32))
    np.random.seed(0)
    for gate in "fiou":
        np.testing.assert_allclose(getattr(lstm, f"h2{gate}").W.data, _linear_draw(2, 2),
                                   rtol=1e-6)
    for gate in "fiou":
        np.testing.assert_allclose(getattr(lstm, f"x2{gate}").W.data, _linear_draw(3, 2),
                                   rtol=1e-6)
    np.random.seed(0)
    eager = nn.LSTM(2, in_size=3)  # with in_size: the x2* first, then the h2*
    np.random.seed(0)
    for name in ("x2f", "x2i", "x2o", "x2u", "h2f", "h2i", "h2o", "h2u"):
        shape = (3, 2) if name.startswith("x") else (2, 2)
        np.testing.assert_allclose(getattr(eager, name).W.data, _linear_draw(*shape), rtol=1e-6)


def test_a_lazy_lstm_moves_its_h2_weights_to_the_input_device(xp2):
    lstm = nn.LSTM(2)
    h2f = lstm.h2f.W.numpy().copy()
    lstm(xp2.asarray(np.ones((1, 3), np.float32)))
    assert all(p.device == xp2.device for p in lstm.parameters())
    np.testing.assert_array_equal(xp2.numpy(lstm.h2f.W.data), h2f)  # moved, not drawn again
    assert lstm(xp2.asarray(np.ones((1, 3), np.float32))).device == xp2.device


@pytest.mark.parametrize("make", [nn.RNN, nn.LSTM])
def test_to_moves_the_carried_state_with_the_layer(make):
    """Moved mid-sequence (itself or in a model holding it), the layer goes on with its state
    where its weights went, as the same steps taken there all along."""
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2)]
    model = nn.Sequential(make(4, in_size=3))
    layer = model[0]
    reference = make(4, in_size=3).to(DEVICE1, dtype="float64")
    reference.load_state_dict(layer.state_dict())
    layer(xs[0]).unchain_backward()  # truncated backprop: the graph behind is done with
    model.to(DEVICE1, dtype="float64")
    states = [layer.h] + ([layer.c] if make is nn.LSTM else [])
    assert all(s.device == DEVICE1 and s.dtype == STRICT.xp.float64 for s in states)
    for x in xs:
        expected = reference(STRICT.asarray(x.astype(np.float64), device=DEVICE1))
    y = layer(STRICT.asarray(xs[1].astype(np.float64), device=DEVICE1))
    np.testing.assert_allclose(y.numpy(), expected.numpy(), atol=1e-6)  # step 1 in float32
    F.sum(y).backward()
    assert all(p.grad.device == DEVICE1 for p in layer.parameters())
    h = layer.h
    model.to(DEVICE1, dtype="float64")  # where it is: the state stays as it is
    assert layer.h is h


@pytest.mark.parametrize("make", [nn.RNN, nn.LSTM])
@pytest.mark.parametrize("move", [{"device": DEVICE1}, {"dtype": "float32"}])
def test_a_layer_moved_mid_sequence_trains_on_from_its_state(make, move):
    """to() writes every parameter, so no backward could go through the graph behind the
    carried state: the state moves detached (as after unchain_backward()), and training goes
    on from it with the gradients of the steps taken since the move."""
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((2, 3)) for _ in range(4)]
    layer = make(4, in_size=3).to(dtype="float64")
    layer(xs[0])
    layer(xs[1])  # the state carries the graph of both calls
    names = ["h", "c"] if make is nn.LSTM else ["h"]
    held = {name: getattr(layer, name).data for name in names}
    reference = make(4, in_size=3).to(dtype="float64")  # on the host, from the same state
    reference.load_state_dict({k: v.copy() for k, v in layer.state_dict().items()})
    for name in names:
        setattr(reference, name, gradcore.Variable(held[name]))
    layer.to(**move)
    for name in names:
        state = getattr(layer, name)
        assert state.creator is None and not state.requires_grad
        np.testing.assert_allclose(state.numpy(), held[name], rtol=1e-6)
    device, dtype = move.get("device", "cpu"), move.get("dtype", "float64")
    ys = [layer(gradcore.Variable(x.astype(dtype)).to(device)) for x in xs[2:]]
    expected = [reference(x) for x in xs[2:]]  # the second step's graph runs into the first's
    F.sum(ys[0] + ys[1]).backward()
    F.sum(expected[0] + expected[1]).backward()
    for (name, p), q in zip(layer.named_parameters(), reference.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-4, err_msg=name)
    gradcore.optim.SGD(layer, lr=0.1).step()
    for p, q in zip(layer.parameters(), reference.parameters()):
        np.testing.assert_allclose(p.numpy(), q.data - 0.1 * q.grad.data, rtol=1e-5)


@pytest.mark.parametrize("make", [nn.RNN, nn.LSTM])
def test_to_that_writes_the_weights_cuts_a_state_already_in_that_dtype(make):
    """A float64 input gives a float32 layer a float64 state: to(dtype="float64") leaves the
    state's array as it is but writes the weights its graph read, so the state is cut all the
    same, and training goes on from it as after unchain_backward()."""
    rng = np.random.default_rng(4)
    x0, x1 = rng.standard_normal((2, 2, 3))
    layer = make(4, in_size=3)
    layer(x0)
    names = ["h", "c"] if make is nn.LSTM else ["h"]
    held = {name: getattr(layer, name) for name in names}
    assert all(s.dtype == np.float64 and s.creator is not None for s in held.values())
    layer.to(dtype="float64")
    for name in names:
        state = getattr(layer, name)
        assert state.creator is None and not state.requires_grad
        assert state.data is held[name].data  # cut, not copied
    reference = make(4, in_size=3).to(dtype="float64")
    reference.load_state_dict({k: v.copy() for k, v in layer.state_dict().items()})
    for name in names:
        setattr(reference, name, gradcore.Variable(held[name].data))
    F.sum(layer(x1)).backward()
    F.sum(reference(x1)).backward()
    for (name, p), q in zip(layer.named_parameters(), reference.parameters()):
        np.testing.assert_allclose(p.grad.data, q.grad.data, rtol=1e-12, err_msg=name)
    if make is nn.RNN:  # by hand: dy/da = 1 - tanh(a)**2, a = x1 W + h0 U + b
        h0, W, U = held["h"].data, layer.x2h.W.data, layer.h2h.W.data
        g = 1 - np.tanh(x1 @ W + h0 @ U + layer.x2h.b.data) ** 2
        np.testing.assert_allclose(layer.x2h.W.grad.data, x1.T @ g, rtol=1e-12)
        np.testing.assert_allclose(layer.h2h.W.grad.data, h0.T @ g, rtol=1e-12)


def test_a_model_that_writes_another_layer_cuts_the_state():
    """The state's graph reads the layers before the RNN too: to() writing only theirs cuts it."""
    x = np.random.default_rng(5).standard_normal((2, 3))
    model = nn.Sequential(nn.Linear(3, in_size=3), nn.RNN(4, in_size=3).to(dtype="float64"))
    model(x)
    model.to(dtype="float64")  # writes the Linear's weights, not the RNN's
    assert model[1].h.creator is None
    F.sum(model(x)).backward()
    assert model[0].W.grad is not None


def test_a_model_holding_an_rnn_saves_after_its_first_call(tmp_path):
    """A model's state_dict lets each of its layers finish what it makes later (RNN's h2h)."""
    x = np.random.RandomState(1).rand(3, 4).astype(np.float32)
    model = nn.Sequential(nn.RNN(5), nn.Linear(2))
    model(x)
    assert model[0].h2h.W.data is None
    state = model.state_dict()
    assert list(state) == ["0.x2h.W", "0.x2h.b", "0.h2h.W", "1.W", "1.b"]
    assert state["0.h2h.W"].shape == (5, 5)
    fresh = nn.Sequential(nn.RNN(5), nn.Linear(2))
    fresh.load(model.save(tmp_path / "model"))
    np.testing.assert_array_equal(fresh[0].h2h.W.data, state["0.h2h.W"])


def test_saving_a_lazy_rnn_after_one_call_changes_no_later_draw():
    """state_dict() draws h2h ahead of the second call with the generator put back, and the
    second call moves the generator past that draw: what is drawn after it is what a run that
    does not save draws, and so is h2h where nothing draws in between."""
    x = np.random.RandomState(1).rand(2, 3).astype(np.float32)

    def run(save, layers):
        np.random.seed(0)
        model = nn.Sequential(*layers())
        model(x)
        saved = model.state_dict()[f"{len(model) - 1 if layers is first else 0}.h2h.W"].copy() \
            if save else None
        second = model(x).data
        rnn = model[len(model) - 1] if layers is first else model[0]
        return second, rnn.h2h.W.data, np.random.rand(3), saved

    def first():  # dropout draws before the RNN at every call
        return [nn.Dropout(0.5), nn.RNN(4)]

    def after():  # the RNN's draws come first
        return [nn.RNN(4), nn.Dropout(0.5)]

    plain, saved = run(False, after), run(True, after)
    for a, b in zip(saved[:3], plain[:3]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(saved[3], saved[1])  # the model goes on with what was saved
    plain, saved = run(False, first), run(True, first)
    np.testing.assert_array_equal(saved[2], plain[2])  # the generator where it would be
    np.testing.assert_array_equal(saved[3], saved[1])
