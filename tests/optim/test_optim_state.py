"""Per-parameter state: identity-keyed, on the parameter's device (following it when it moves),
saved and restored with state_dict / load_state_dict."""
import copy
import gc
import pickle

import numpy as np
import pytest

import backends
import gradcore
from conftest import CASES, DEVICE1, DEVICE2
from gradcore.optim import (SGD, AdaDelta, AdaGrad, Adam, AdamW, FreezeParam, MomentumSGD,
                            ParamState, RMSprop)

STATEFUL = [
    (MomentumSGD, {"lr": 0.1}, ("v",)),
    (AdaGrad, {"lr": 0.1}, ("h",)),
    (AdaDelta, {"eps": 1e-2}, ("msg", "msdx")),
    (Adam, {"lr": 0.1}, ("m", "v")),
    (AdamW, {"lr": 0.1, "weight_decay": 0.1}, ("m", "v")),
    (RMSprop, {"lr": 0.1}, ("v",)),
    (RMSprop, {"lr": 0.1, "momentum": 0.5, "centered": True}, ("v", "m", "b")),
]
IDS = [row[0].__name__ for row in STATEFUL]
ALL = [(SGD, {"lr": 0.1})] + [row[:2] for row in STATEFUL]
NUMPY = CASES["numpy"]()
GRADS = ([0.5, -1.0], [1.0, 2.0], [-0.25, 0.75], [2.0, -0.5])


def device_of(array):
    return backends.backend_of(array).device_of(array)


def set_grad(p, values):
    """A gradient on p's device."""
    data = backends.to_device(np.asarray(values), p.device)
    p.grad = gradcore.Variable(data, requires_grad=False)


def move(p, device):
    """What Module.to(device) does to a parameter: data and grad move, the Parameter stays."""
    p.data = backends.to_device(p.data, device)
    if p.grad is not None:
        p.grad = gradcore.Variable(backends.to_device(p.grad.data, device), requires_grad=False)


@pytest.mark.parametrize("cls, hyper, names", STATEFUL, ids=IDS)
def test_state_is_made_on_the_parameter_device_and_follows_it(cls, hyper, names):
    reference = gradcore.Parameter(np.array([1.0, -2.0]))
    optimizer = cls([reference], **hyper)
    for g in GRADS[:3]:
        set_grad(reference, g)
        optimizer.step()

    W = gradcore.Parameter(np.array([1.0, -2.0]))
    optimizer = cls([W], **hyper)
    set_grad(W, GRADS[0])
    optimizer.step()
    assert sorted(optimizer.state[W]) == sorted(names)
    assert all(type(a) is np.ndarray for a in optimizer.state[W].values())
    for device, g in ((DEVICE1, GRADS[1]), (DEVICE2, GRADS[2])):  # NumPy -> device1 -> device2
        move(W, device)
        data = W.data
        set_grad(W, g)
        optimizer.step()
        assert W.data is data and W.device == device
        assert all(device_of(a) == device for a in optimizer.state[W].values())
    np.testing.assert_allclose(W.numpy(), reference.data, rtol=1e-12)


def test_state_follows_a_dtype_change():
    W = gradcore.Parameter(np.array([1.0, -2.0]))
    optimizer = Adam([W])
    set_grad(W, GRADS[0])
    optimizer.step()
    W.data = W.data.astype(np.float32)
    W.grad = gradcore.Variable(np.array(GRADS[1], np.float32), requires_grad=False)
    optimizer.step()
    assert W.dtype == np.float32
    assert all(a.dtype == np.float32 for a in optimizer.state[W].values())


def test_state_is_keyed_by_identity_and_held_weakly():
    a = gradcore.Parameter(np.array([1.0, 2.0]))
    b = gradcore.Parameter(np.array([1.0, 2.0]))  # equal data, another parameter
    optimizer = MomentumSGD([a, b], lr=0.1)
    set_grad(a, [1.0, 1.0])
    set_grad(b, [-1.0, -1.0])
    optimizer.step()
    np.testing.assert_array_equal(optimizer.state[a]["v"], [-0.1, -0.1])
    np.testing.assert_array_equal(optimizer.state[b]["v"], [0.1, 0.1])
    assert len(optimizer.state) == 2 and set(map(id, optimizer.state)) == {id(a), id(b)}

    state = ParamState()
    p = gradcore.Parameter(np.zeros(2))
    state[p] = {"v": np.ones(2)}
    assert p in state and len(state) == 1
    del p
    gc.collect()
    assert len(state) == 0 and state.items() == []
    with pytest.raises(KeyError, match="no optimizer state"):
        state[gradcore.Parameter(np.zeros(1))]


def test_a_dropped_optimizer_frees_its_state_at_once_while_its_parameters_live():
    """Reference counting alone frees it (a new optimizer per fine-tuning phase): the pairs'
    weak-reference callbacks hold the state weakly, so no cycle waits for the collector."""
    import weakref

    a = gradcore.Parameter(np.array([1.0, 2.0]))
    optimizer = MomentumSGD([a], lr=0.1)
    set_grad(a, [1.0, 1.0])
    optimizer.step()
    state, v = weakref.ref(optimizer.state), weakref.ref(optimizer.state[a]["v"])
    gc.disable()
    try:
        del optimizer
        assert state() is None and v() is None
    finally:
        gc.enable()
    b = gradcore.Parameter(np.zeros(2))  # and a parameter dying after its state still goes
    states = ParamState()
    states[b] = {"v": np.ones(2)}
    del b
    assert len(states._entries) == 0


def test_a_parameter_that_changed_shape_is_refused_before_anything_changes():
    W = gradcore.Parameter(np.array([1.0, -2.0]))
    optimizer = Adam([W])
    set_grad(W, GRADS[0])
    optimizer.step()
    W.data = np.zeros(3)
    set_grad(W, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"changed shape since its state 'm' was made"):
        optimizer.step()
    assert optimizer.t == 1
    np.testing.assert_array_equal(W.data, np.zeros(3))
    del optimizer.state[W]
    optimizer.step()
    assert optimizer.state[W]["m"].shape == (3,)


def test_a_gradient_on_another_device_is_refused():
    W = gradcore.Parameter(np.array([1.0, -2.0]))
    with pytest.raises(ValueError, match=r"device array_api_strict:device1, not cpu"):
        W.grad = gradcore.Variable(backends.to_device(np.array([1.0, 1.0]), DEVICE1))
    W.grad = gradcore.Variable(np.array([1.0, 1.0]))
    W.grad.data = backends.to_device(W.grad.data, DEVICE1)  # the gradient moved on its own
    with pytest.raises(ValueError, match=r"is on cpu but its grad is on array_api_strict:device1"):
        SGD([W]).step()
    np.testing.assert_array_equal(W.data, [1.0, -2.0])


# ---------------------------------------------------------------------------- state_dict
def params_on(xp):
    return [gradcore.Parameter(xp.asarray([1.0, -2.0])), gradcore.Parameter(xp.asarray([[0.5]]))]


def run(optimizer, params, xp, steps):
    for g in steps:
        set_grad(params[0], g)
        set_grad(params[1], [[g[0] * g[1]]])
        optimizer.step()


@pytest.mark.parametrize("cls, hyper", ALL, ids=["SGD"] + IDS)
def test_state_dict_round_trip_reproduces_the_next_step_exactly(xp2, cls, hyper):
    first = params_on(xp2)
    optimizer = cls(first, **hyper)
    run(optimizer, first, xp2, GRADS[:2])
    saved = optimizer.state_dict()
    snapshot = {i: {k: xp2.numpy(a).copy() for k, a in s.items() if k != "step"}
                for i, s in saved["state"].items()}

    second = [gradcore.Parameter(xp2.asarray(xp2.numpy(p.data))) for p in first]
    restored = cls(second)  # other hyperparameters: the state_dict brings them back
    restored.load_state_dict(saved)
    assert restored.hyperparameters == optimizer.hyperparameters
    if cls in (Adam, AdamW):
        assert restored.t == optimizer.t == 2
    for extra in GRADS[2:]:
        run(optimizer, first, xp2, [extra])
        run(restored, second, xp2, [extra])
        for a, b in zip(first, second):
            np.testing.assert_array_equal(xp2.numpy(a.data), xp2.numpy(b.data))
            assert b.device == xp2.device
    for i, s in saved["state"].items():  # state_dict holds copies: later steps leave it alone
        for k, a in snapshot[i].items():
            np.testing.assert_array_equal(xp2.numpy(s[k]), a)
        if cls in (Adam, AdamW):
            assert s["step"] == 2


def test_state_dict_layout():
    params = params_on(NUMPY)
    optimizer = Adam(params, lr=0.1)
    run(optimizer, params, NUMPY, GRADS[:1])
    saved = optimizer.state_dict()
    assert saved["type"] == "Adam"
    assert saved["hyperparameters"] == {"alpha": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
    assert saved["counters"] == {"t": 1}
    assert saved["initial_lr"] is None  # no schedule recorded one
    assert saved["shapes"] == [(2,), (1, 1)]
    # as PyTorch's Adam: each parameter's own count of steps beside its arrays
    assert sorted(saved["state"]) == [0, 1] and sorted(saved["state"][0]) == ["m", "step", "v"]
    assert saved["state"][0]["step"] == 1 and type(saved["state"][0]["step"]) is int
    np.testing.assert_allclose(saved["state"][0]["m"], [0.05, -0.1], rtol=1e-12)


def test_host_state_loads_onto_the_parameters_device():
    host = params_on(NUMPY)
    optimizer = Adam(host, lr=0.1)
    run(optimizer, host, NUMPY, GRADS[:2])
    saved = optimizer.state_dict()

    device1 = [gradcore.Parameter(backends.to_device(p.data, DEVICE1)) for p in host]
    restored = Adam(device1)
    restored.load_state_dict(saved)
    for p in device1:
        assert all(device_of(a) == DEVICE1 for a in restored.state[p].values())
    run(optimizer, host, NUMPY, GRADS[2:3])
    run(restored, device1, NUMPY, GRADS[2:3])
    for a, b in zip(host, device1):
        np.testing.assert_array_equal(a.data, b.numpy())


def loaded_state():
    params = params_on(NUMPY)
    optimizer = Adam(params, lr=0.1)
    run(optimizer, params, NUMPY, GRADS[:1])
    return params, optimizer


@pytest.mark.parametrize("change, error, message", [
    (lambda d: d.update(type="SGD"), ValueError, "this state_dict is from a SGD optimizer"),
    (lambda d: d.pop("state"), TypeError, "expected a dict from optimizer.state_dict"),
    (lambda d: d.update(shapes=[(2,)]),
     ValueError, r"the state_dict is for 1 parameter\(s\), this optimizer has 2"),
    (lambda d: d.update(shapes=[(3,), (1, 1)]),
     ValueError, r"parameter 0 has shape \(3,\) in the state_dict but \(2,\) here"),
    (lambda d: d["state"][0].update(v=np.zeros(3)),
     ValueError, r"state 'v' of parameter 0 has shape \(3,\), the parameter \(2,\)"),
    (lambda d: d["state"][0].update(w=np.zeros(2)),
     ValueError, "state names of parameter 0 do not match this optimizer: unexpected w"),
    (lambda d: d["state"][1].pop("v"), ValueError, "missing v"),
    (lambda d: d["state"].update({5: {}}), ValueError, r"state key 5 is not a parameter position"),
    (lambda d: d["state"][0].update(m=[0.0, 0.0]), TypeError, "state 'm' of parameter 0 is a list"),
    (lambda d: d["hyperparameters"].update(beta1=1.0),
     ValueError, "beta1 must be a finite number >= 0 and < 1"),
    (lambda d: d["hyperparameters"].pop("eps"), ValueError, "hyperparameters do not match"),
    (lambda d: d["counters"].update(t=-1), ValueError, "counter t must be an integer >= 0"),
])
def test_loading_checks_everything_before_changing_anything(change, error, message):
    params, optimizer = loaded_state()
    saved = optimizer.state_dict()
    change(saved)
    target = Adam(params, lr=0.5)
    target.t = 7
    target.state[params[0]] = before = {"m": np.ones(2), "v": np.ones(2)}
    with pytest.raises(error, match=message):
        target.load_state_dict(saved)
    assert target.alpha == 0.5 and target.t == 7
    assert target.state[params[0]] is before and params[1] not in target.state


def test_state_that_does_not_fit_the_parameters_dtype_is_refused():
    # Adam's v = 1e40 from a float64 model would be inf in float32 (Module.load_state_dict
    # refuses the same value); a v that fits loads, cast
    saved = Adam([gradcore.Parameter(np.zeros(2))]).state_dict()
    saved["state"] = {0: {"m": np.zeros(2), "v": np.array([1.0, 1e40]), "step": 1}}
    W = gradcore.Parameter(np.zeros(2, np.float32))
    target = Adam([W])
    with pytest.raises(ValueError, match=r"float64 value 1e\+40 in state 'v' of parameter 0 "
                                         r"does not fit the model's float32 .* Nothing was loaded"):
        target.load_state_dict(saved)
    assert W not in target.state
    saved["state"][0]["v"] = np.array([1, 3])  # integers: as Module.load_state_dict refuses
    with pytest.raises(ValueError, match=r"state 'v' of parameter 0 holds int64 values, where "
                                         r"the optimizer keeps float32 ones.*Nothing was loaded"):
        target.load_state_dict(saved)
    saved["state"][0]["v"] = np.array([1.0, 3e38])
    target.load_state_dict(saved)
    assert target.state[W]["v"].dtype == np.float32
    np.testing.assert_array_equal(target.state[W]["v"], np.array([1.0, 3e38], np.float32))


def test_a_float16_parameters_state_is_saved_and_loaded_in_float32():
    # v = 1e5 is past float16's largest (65504) but is the state of a float16 parameter, kept
    # in float32; a state saved in float16 (by an older gradcore) loads, widened exactly
    W = gradcore.Parameter(np.zeros(2, np.float16))
    W.grad = gradcore.Variable(np.array([1e-3, 300.0], np.float16))
    optimizer = Adam([W])
    optimizer.step()
    saved = optimizer.state_dict()
    assert saved["state"][0]["v"].dtype == np.float32
    g = np.array([1e-3, 300.0], np.float16).astype(np.float32)
    np.testing.assert_array_equal(saved["state"][0]["v"], (1 - 0.999) * (g * g))  # float32
    saved["state"][0]["v"] = np.array([1.0, 1e5])
    target = Adam([W])
    target.load_state_dict(saved)
    assert target.state[W]["v"].dtype == np.float32
    np.testing.assert_array_equal(target.state[W]["v"], [1.0, 1e5])
    saved["state"][0] = {"m": np.array([0.5, 2.0], np.float16),
                         "v": np.array([6e-8, 6e4], np.float16), "step": 3}
    target.load_state_dict(saved)
    assert target.state[W]["v"].dtype == np.float32
    np.testing.assert_array_equal(target.state[W]["v"],
                                  np.array([6e-8, 6e4], np.float16).astype(np.float32))


def test_loading_a_non_dict_says_what_is_expected():
    with pytest.raises(TypeError, match="expected a dict from optimizer.state_dict.*got list"):
        SGD(params_on(NUMPY)).load_state_dict([1, 2])


def test_an_older_adam_state_dict_without_step_counts_falls_back_to_t():
    params, optimizer = loaded_state()
    run(optimizer, params, NUMPY, GRADS[1:2])
    older = optimizer.state_dict()
    for s in older["state"].values():
        del s["step"]  # as saved before each parameter had its own count
    copies = [gradcore.Parameter(p.data.copy()) for p in params]
    restored = Adam(copies)
    restored.load_state_dict(older)
    assert [restored.param_counts(p) for p in copies] == [{"step": 2}, {"step": 2}]
    run(optimizer, params, NUMPY, GRADS[2:3])
    run(restored, copies, NUMPY, GRADS[2:3])
    for a, b in zip(params, copies):
        np.testing.assert_array_equal(a.data, b.data)


@pytest.mark.parametrize("bad", [-1, 2.0, True, np.array(2.0), np.array([2]), np.True_])
def test_a_bad_step_count_is_refused(bad):
    params, optimizer = loaded_state()
    saved = optimizer.state_dict()
    saved["state"][0]["step"] = bad
    with pytest.raises(ValueError, match="count 'step' of parameter 0 must be an integer >= 0"):
        Adam(params).load_state_dict(saved)
    saved = optimizer.state_dict()
    saved["counters"]["t"] = bad
    with pytest.raises(ValueError, match="counter t must be an integer >= 0"):
        Adam(params).load_state_dict(saved)


def test_counts_read_back_from_an_npz_file_load(tmp_path):
    params, optimizer = loaded_state()
    run(optimizer, params, NUMPY, GRADS[1:2])
    saved = optimizer.state_dict()
    np.savez(tmp_path / "optimizer.npz", t=saved["counters"]["t"],
             **{f"{position}/{name}": np.asarray(a) for position, s in saved["state"].items()
                for name, a in s.items()})
    state = {}
    with np.load(tmp_path / "optimizer.npz") as arrays:  # counts come back as 0-d int64 arrays
        counters = {"t": arrays["t"]}
        for key in arrays.files:
            if "/" in key:
                position, name = key.split("/")
                state.setdefault(int(position), {})[name] = arrays[key]
    assert state[0]["step"].shape == () and state[0]["step"].dtype == np.int64
    copies = [gradcore.Parameter(p.data.copy()) for p in params]
    restored = Adam(copies, lr=0.1)
    restored.load_state_dict(dict(saved, counters=counters, state=state))
    assert type(restored.t) is int and restored.t == 2
    assert [restored.param_counts(p) for p in copies] == [{"step": 2}, {"step": 2}]
    assert all(type(restored.param_counts(p)["step"]) is int for p in copies)
    restored.load_state_dict(dict(saved, counters={"t": np.int64(2)}))  # a NumPy integer
    assert type(restored.t) is int and restored.t == 2
    run(optimizer, params, NUMPY, GRADS[2:3])
    run(restored, copies, NUMPY, GRADS[2:3])
    for a, b in zip(params, copies):
        np.testing.assert_array_equal(a.data, b.data)


# ---------------------------------------------------------------- names
class TwoLayers(gradcore.nn.Module):
    """Two layers of the same shapes: their states can be swapped without a shape to tell."""

    def __init__(self, first_assigned="l0"):
        super().__init__()
        for name in (first_assigned, "l1" if first_assigned == "l0" else "l0"):
            setattr(self, name, gradcore.nn.Linear(3, in_size=3, dtype="float64"))

    def forward(self, x):
        return self.l1(self.l0(x))


def trained_adam(model, steps=2):
    optimizer = Adam(model, lr=0.1)
    x = gradcore.Variable(np.random.RandomState(0).randn(4, 3))
    for _ in range(steps):
        optimizer.zero_grad()
        gradcore.functions.sum(model(x) ** 2).backward()
        optimizer.step()
    return optimizer


def test_a_models_optimizer_saves_its_parameters_names_and_loads_by_them():
    gradcore.manual_seed(0)
    model = TwoLayers()
    optimizer = trained_adam(model)
    saved = optimizer.state_dict()
    assert saved["names"] == ["l0.W", "l0.b", "l1.W", "l1.b"]
    assert "names" not in Adam(list(model.parameters())).state_dict()  # a list has none
    twin = copy.deepcopy(model)
    restored = Adam(twin, lr=0.1)
    restored.load_state_dict(saved)
    for name, p in twin.named_parameters():
        np.testing.assert_array_equal(restored.state[p]["m"],
                                      optimizer.state[dict(model.named_parameters())[name]]["m"])


def test_state_for_parameters_in_another_order_is_refused_by_name():
    gradcore.manual_seed(0)
    saved = trained_adam(TwoLayers()).state_dict()
    reordered = TwoLayers(first_assigned="l1")  # the same shapes, its l1 listed first
    target = Adam(reordered, lr=0.1)
    with pytest.raises(ValueError, match=r"parameter 0 is l1.W here but l0.W in the "
                                         r"state_dict .*load it into an optimizer of the same "
                                         r"model"):
        target.load_state_dict(saved)
    assert len(target.state) == 0 and target.t == 0  # nothing changed
    l0, l1 = reordered.l0, reordered.l1
    listed = Adam([l1.W, l1.b, l0.W, l0.b], lr=0.1)  # no names to compare with
    with pytest.raises(ValueError, match=r"names its parameters \(l0.W, l0.b, l1.W, \.\.\.\) "
                                         r"but this optimizer was given its parameters without "
                                         r"names .*Adam\(model\).*state_dict.pop\('names'\)"):
        listed.load_state_dict(saved)
    assert len(listed.state) == 0


def test_a_state_dict_without_names_loads_by_position():
    gradcore.manual_seed(0)
    model = TwoLayers()
    optimizer = trained_adam(model)
    older = optimizer.state_dict()
    del older["names"]  # as saved by an older gradcore, or from a list of parameters
    for target in (model, list(model.parameters())):
        restored = Adam(target, lr=0.1)
        restored.load_state_dict(older)
        for p in model.parameters():
            np.testing.assert_array_equal(restored.state[p]["v"], optimizer.state[p]["v"])
            assert restored.param_counts(p) == {"step": 2}


def test_dropping_a_parameters_state_restarts_its_count():
    W = gradcore.Parameter(np.array([1.0, -2.0]))
    optimizer = Adam([W])
    for g in GRADS[:3]:
        set_grad(W, g)
        optimizer.step()
    del optimizer.state[W]
    set_grad(W, GRADS[3])
    optimizer.step()
    assert optimizer.param_counts(W) == {"step": 1} and optimizer.t == 4


# ---------------------------------------------------------------- copies
class Model:
    def __init__(self):
        self.W = gradcore.Parameter(np.array([1.0, -2.0]))
        self.b = gradcore.Parameter(np.array([[0.5]]))

    def parameters(self):
        yield self.W
        yield self.b


def train(model, optimizer, steps):
    for g in steps:
        set_grad(model.W, g)
        set_grad(model.b, [[g[0] * g[1]]])
        optimizer.step()


def copied_by_deepcopy(model, optimizer):
    return copy.deepcopy((model, optimizer))


def copied_by_pickle(model, optimizer):
    return pickle.loads(pickle.dumps((model, optimizer)))


@pytest.mark.parametrize("copied", [copied_by_deepcopy, copied_by_pickle])
@pytest.mark.parametrize("cls, hyper", ALL, ids=["SGD"] + IDS)
def test_a_copy_of_model_and_optimizer_keeps_the_state(copied, cls, hyper):
    model = Model()
    optimizer = cls(model.parameters(), **hyper)
    optimizer.add_hook(FreezeParam(model.b))
    train(model, optimizer, GRADS[:2])
    model2, optimizer2 = copied(model, optimizer)
    assert optimizer2.target == [model2.W, model2.b]
    assert optimizer2.hooks[0].freeze_params == [model2.b]
    assert len(optimizer2.state) == len(optimizer.state)  # 1: b is frozen (0 for SGD)
    for name, a in optimizer.state.get(model.W, {}).items():  # the copy's, for the copied W
        assert optimizer2.state[model2.W][name] is not a and model.W not in optimizer2.state
        np.testing.assert_array_equal(optimizer2.state[model2.W][name], a)
    if cls in (Adam, AdamW):
        assert optimizer2.param_counts(model2.W) == {"step": 2} and optimizer2.t == 2
    train(model, optimizer, GRADS[2:])  # the same steps: the copy has the state it needs
    train(model2, optimizer2, GRADS[2:])
    for a, b in zip(model.parameters(), model2.parameters()):
        np.testing.assert_array_equal(a.data, b.data)
        assert a is not b


class _DezeroMomentum(gradcore.optim.Optimizer):
    """As in the DeZero book (step 46): hyperparameters and velocities of its own."""

    def __init__(self, lr=0.01, momentum=0.9):
        super().__init__()
        self.lr, self.momentum, self.vs = lr, momentum, {}

    def update_one(self, param):
        v = self.vs.setdefault(id(param), np.zeros_like(param.data))
        v *= self.momentum
        v -= self.lr * param.grad.data
        param.data += v


def test_an_optimizer_whose_state_is_its_own_refuses_to_save_or_resume_without_it():
    # its state_dict would hold neither lr nor the velocities: a run resumed from it would
    # silently restart from lr=0.01 and v=0
    W = gradcore.Parameter(np.zeros(2))
    optimizer = _DezeroMomentum(lr=0.1).setup([W])
    W.grad = gradcore.Variable(np.array([1.0, -2.0]))
    optimizer.update()
    with pytest.raises(TypeError, match=r"_DezeroMomentum.state_dict: this optimizer keeps lr, "
                                        r"momentum, vs as attributes of its own.*"
                                        r"Declare hyperparameters in the class's `defaults`"):
        optimizer.state_dict()
    saved = MomentumSGD().setup([gradcore.Parameter(np.zeros(2))]).state_dict()
    saved["type"] = "_DezeroMomentum"
    target = _DezeroMomentum().setup([gradcore.Parameter(np.zeros(2))])
    with pytest.raises(TypeError, match=r"keeps lr, momentum, vs as attributes of its own"):
        target.load_state_dict(saved)
    assert target.lr == 0.01 and target.vs == {}


def test_a_name_or_a_callback_on_an_optimizer_is_no_state_it_must_save():
    optimizer = MomentumSGD().setup([gradcore.Parameter(np.zeros(2))])
    optimizer.label, optimizer.on_step, optimizer.note = "run 3", print, None
    assert optimizer.state_dict()["hyperparameters"]["lr"] == 0.01


def test_a_subclass_that_declares_its_state_saves_and_loads():
    class Declared(gradcore.optim.Optimizer):
        defaults = {"lr": 0.01, "momentum": 0.9}
        state_names = ("v",)

        def update_one(self, param):
            v = self.param_state(param)["v"]
            v *= self.momentum
            v -= self.lr * param.grad.data
            param.data += v

    W = gradcore.Parameter(np.zeros(2))
    optimizer = Declared([W], lr=0.1)
    optimizer.add_hook(gradcore.optim.WeightDecay(0.1))
    gradcore.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)  # initial_lr: saved too
    W.grad = gradcore.Variable(np.array([1.0, -2.0]))
    optimizer.step()
    W2 = gradcore.Parameter(W.data.copy())
    target = Declared([W2])
    target.load_state_dict(optimizer.state_dict())
    assert (target.lr, target.initial_lr) == (0.1, 0.1)
    np.testing.assert_array_equal(target.state[W2]["v"], [-0.1, 0.2])


def test_a_flag_in_defaults_is_taken_as_a_bool_by_the_constructor_the_setter_and_loading():
    class NAG(MomentumSGD):  # a flag, as PyTorch's nesterov
        defaults = {**MomentumSGD.defaults, "nesterov": True}

    W = gradcore.Parameter(np.ones(2))
    optimizer = NAG([W], nesterov=False)
    assert optimizer.nesterov is False
    W.grad = gradcore.Variable(np.ones(2))
    optimizer.step()
    saved = optimizer.state_dict()
    assert saved["hyperparameters"]["nesterov"] is False
    target = NAG([gradcore.Parameter(W.data.copy())])
    target.load_state_dict(saved)  # refused before: "nesterov must be a real number, got bool"
    assert target.nesterov is False
    target.load_state_dict(dict(saved, hyperparameters=dict(saved["hyperparameters"],
                                                            nesterov=np.asarray(True))))
    assert target.nesterov is True  # a 0-d array, as numpy.load gives it back
    target.nesterov = False
    for wrong in (1, 0.0, "yes"):
        with pytest.raises(TypeError, match=r"nesterov is a flag \(its default is True\): it "
                                            r"must be True or False"):
            target.nesterov = wrong
        with pytest.raises(TypeError, match="nesterov is a flag"):
            NAG([W], nesterov=wrong)
    with pytest.raises(TypeError, match="nesterov is a flag"):
        target.load_state_dict(dict(saved, hyperparameters=dict(saved["hyperparameters"],
                                                                nesterov=1.0)))
    assert target.nesterov is False
    with pytest.raises(TypeError, match="lr must be a real number, got bool"):
        NAG([W], lr=True)  # a number's default: no bool
