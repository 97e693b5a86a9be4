"""gradcore.nn.Module: registration and order, traversal, modes, hooks, devices, aliases."""
import collections
import copy
import gc
import hashlib
import os
import pickle
import subprocess
import sys
import warnings
import weakref

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
import gradcore.nn as nn
import gradcore.nn.module as modules
from conftest import DEVICE1, DEVICE2, STRICT, run_in_threads
from gradcore import Parameter, Variable
from gradcore.utils import download


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 3)
        self.scale = Parameter(np.ones(3))

    def forward(self, x):
        return self.fc(x) * self.scale


class Net(nn.Module):
    """Parameters and modules interleaved, one lazy layer."""

    def __init__(self):
        super().__init__()
        self.z = Parameter(np.zeros(1), name="z")
        self.block = Block()
        self.a = Parameter(np.zeros(2), name="a")
        self.head = nn.Linear(1)  # lazy

    def forward(self, x):
        return self.head(self.block(x))


def names(module):
    return [name for name, _ in module.named_parameters()]


# =============================================================================== registration
def test_parameters_in_assignment_order_through_nested_modules():
    net = Net()
    assert names(net) == ["z", "block.fc.W", "block.fc.b", "block.scale", "a", "head.W", "head.b"]
    params = list(net.parameters())
    assert params[0] is net.z and params[1] is net.block.fc.W and params[-2] is net.head.W
    assert all(isinstance(p, Parameter) for p in params)
    assert net.head.W.data is None  # lazy: listed before it has data
    net(np.ones((4, 2)))
    assert names(net)[-2:] == ["head.W", "head.b"] and net.head.W.shape == (3, 1)


def test_order_does_not_depend_on_names():
    class M(nn.Module):
        def __init__(self, order):
            super().__init__()
            for name in order:
                setattr(self, name, Parameter(np.zeros(1)))

    order = ["zeta", "alpha", "mu", "b", "W", "x0"]
    assert names(M(order)) == order
    assert names(M(order[::-1])) == order[::-1]


def test_reassign_keeps_position_delete_unregisters_none_keeps_registered():
    net = Net()
    net.z = Parameter(np.ones(1))             # reassigned: same place
    assert names(net)[0] == "z" and net.z.data[0] == 1
    net.block = None                          # None keeps the slot (lazy, as DeZero)
    assert names(net) == ["z", "a", "head.W", "head.b"]
    assert list(net.children()) == [net.head]
    net.block = Block()                       # filled again: back in its old place
    assert names(net)[:3] == ["z", "block.fc.W", "block.fc.b"]
    del net.a
    assert "a" not in names(net) and not hasattr(net, "a")
    net.a = Parameter(np.zeros(2))            # a new registration goes last
    assert names(net)[-1] == "a"


def _registry(*models):
    """What each model's parameters() and buffers() yield: names and identities."""
    return [[(name, id(v)) for name, v in (*m.named_parameters(), *m.named_buffers())]
            for m in models]


def test_registry_changes_moves_with_every_change_to_the_parameters_and_buffers_listed():
    """A DistributedOptimizer walks the model again only once registry_changes moved: each way
    of changing what parameters() or buffers() yield must move it (one missed would train a
    new layer on each rank's own gradient), and what changes none of it need not."""
    from gradcore.nn.module import registry_changes
    x = Variable(np.ones((4, 2)))
    seq = nn.Sequential(nn.Linear(3, in_size=2), nn.BatchNorm(), nn.Linear(1, in_size=3))
    blocks = nn.ModuleList([nn.Linear(2, in_size=2)])
    mlp = nn.MLP((3, 1))
    counter = Counter()
    seq(x), mlp(x)
    changes = {
        "layer replaced": lambda: setattr(seq, "2", nn.Linear(1, in_size=3)),
        "layer appended": lambda: seq.append(nn.Linear(2, in_size=1)),
        "layer deleted": lambda: delattr(seq, "3"),
        "item assigned": lambda: blocks.__setitem__(0, nn.Linear(2, in_size=2)),
        "item appended": lambda: blocks.append(nn.Linear(1)),
        "MLP layer replaced": lambda: setattr(mlp, "l1", nn.Linear(1)),
        "MLP layers assigned": lambda: setattr(mlp, "layers", [mlp.l0]),
        "bias removed (nobias)": lambda: setattr(seq[0], "nobias", True),
        "bias added (nobias)": lambda: setattr(seq[0], "nobias", False),
        "bias set to None": lambda: setattr(seq[2], "b", None),
        "W set to None": lambda: setattr(seq[2], "W", None),
        "W made again at the call": lambda: seq(x),
        "BatchNorm slot set to None": lambda: setattr(seq[1], "gamma", None),
        "BatchNorm slot made again": lambda: seq(x),
        "buffer registered": lambda: counter.register_buffer("steps", np.zeros(1)),
        "buffer replaced": lambda: setattr(counter, "steps", Variable(np.ones(1))),
        "buffer set to None": lambda: setattr(counter, "steps", None),
        "parameter deleted": lambda: delattr(counter, "w"),
        "module initialised again": lambda: nn.Module.__init__(counter),
        "state restored into it": lambda: mlp.__setstate__(
            dict(mlp.__dict__, l0=nn.Linear(3, in_size=2))),
    }
    for what, change in changes.items():
        before, count = _registry(seq, blocks, mlp, counter), registry_changes[0]
        change()
        assert _registry(seq, blocks, mlp, counter) != before, what  # a change, to be seen
        assert registry_changes[0] != count, what
    unchanged = {
        "plain attribute": lambda: setattr(seq, "note", 1),
        "forward": lambda: seq(x),
        "values set": lambda: setattr(seq[0].W, "data", np.zeros((2, 3))),
        "requires_grad": lambda: seq[0].W.requires_grad_(False),
        "eval": seq.eval,
    }
    for what, keep in unchanged.items():
        count = registry_changes[0]
        keep()
        assert registry_changes[0] == count, what


def test_a_registered_name_refuses_other_values():
    net = Net()
    before = net.z
    with pytest.raises(TypeError, match=r"Net\.z.*holds a parameter.*\.z\.data"):
        net.z = np.ones(1)
    with pytest.raises(TypeError, match="holds a module"):
        net.block = Variable(np.ones(1))
    assert net.z is before and names(net)[0] == "z"
    net.z = Block()  # a Parameter may become a Module and keep its place
    assert names(net)[:3] == ["z.fc.W", "z.fc.b", "z.scale"]


def test_a_name_holding_a_dot_or_empty_is_refused_for_parameters_modules_and_buffers():
    """"l1.W" beside a sub-module l1 would give two parameters one qualified name."""
    net = Net()
    before = names(net)
    for value in (Parameter(np.zeros(2)), nn.Linear(2, 2)):
        with pytest.raises(ValueError, match=r"'block\.fc' on Net: the name holds '\.', which "
                           r"joins the parts of state_dict's names.*use another"):
            setattr(net, "block.fc", value)
    with pytest.raises(ValueError, match="'' on Net: the name is empty"):
        setattr(net, "", Parameter(np.zeros(2)))
    for name in ("a.b", ""):
        with pytest.raises(ValueError, match="register_buffer: cannot register buffer"):
            net.register_buffer(name, np.zeros(1))
    with pytest.raises(TypeError, match="the name must be a string, got int"):
        net.register_buffer(1, np.zeros(1))
    assert names(net) == before and "block.fc" not in vars(net) and list(net.buffers()) == []
    seq = nn.Sequential()
    setattr(seq, "0", nn.Linear(2, 2))  # numbers stay fine: Sequential names its layers so
    assert [n for n, _ in seq.named_parameters()] == ["0.W", "0.b"]


def test_names_that_are_not_identifiers_register_save_and_load(tmp_path):
    """Only "." and "" can clash (PyTorch's rule): "block-1", "fc 2", "-1" or a non-ASCII digit
    worked before names were checked at all, and checkpoints may hold them."""
    odd = ("block-1", "fc 2", "conv3x3/1", "-1", "\u0661")

    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            for name in odd:
                setattr(self, name, nn.Linear(2, 2))
            self.register_buffer("running-count", np.zeros(1))

        def forward(self, x):
            for name in odd:
                x = getattr(self, name)(x)
            return x

    model = Odd()
    expected = [f"{name}.{slot}" for name in odd for slot in ("W", "b")] + ["running-count"]
    assert list(model.state_dict()) == expected
    model.save(tmp_path / "odd")
    clone = Odd()
    clone.load(tmp_path / "odd")
    x = np.ones((1, 2), np.float32)
    np.testing.assert_array_equal(clone(x).data, model(x).data)


def test_state_dict_refuses_two_entries_under_one_name(tmp_path):
    net = Net()
    net(np.ones((1, 2), np.float32))
    # only reachable around __setattr__: an attribute named like block's parameter
    object.__setattr__(net, "block.scale", Parameter(np.full(3, 7.0)))
    net._registered["block.scale"] = "parameter"
    for call in (net.state_dict, lambda: net.save(tmp_path / "dup"),
                 lambda: net.load_state_dict({})):
        with pytest.raises(ValueError, match=r"'block\.scale' names more than one parameter or "
                           "buffer of Net.*rename one"):
            call()
    assert not (tmp_path / "dup.npz").exists()


@pytest.fixture
def fresh_list_warnings(monkeypatch):
    """Each (class, attribute) is warned about once per process: start each test afresh."""
    monkeypatch.setattr(gradcore.nn.module, "_warned_lists", set())


def test_plain_attributes_are_not_registered(fresh_list_warnings, fresh_variable_warnings):
    m = nn.Module()
    with pytest.warns(UserWarning, match="Module.v is a Variable that requires grad"):
        m.v = Variable(np.ones(2))  # a Variable that is not a Parameter
    m.arr = np.ones(2)
    m.layers = [nn.Linear(2, 2)]    # a list is not searched (DeZero's models.MLP keeps one)
    with pytest.warns(UserWarning, match="Module.layers is a list holding 1 Module"):
        assert list(m.parameters()) == []
    assert list(m.children()) == []


def test_layers_only_in_a_list_are_warned_about_when_parameters_are_collected(
        fresh_list_warnings):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = [nn.Linear(4), nn.Linear(3)]

    net = Net()
    opt = gradcore.optim.SGD(lr=0.1).setup(net)
    with pytest.warns(UserWarning) as caught:
        with pytest.raises(ValueError, match="empty list of parameters"):
            opt.update()
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith("Net.blocks is a list holding 2 Module(s) not registered")
    assert "nn.ModuleList" in message and "setattr" in message
    assert list(net.parameters()) == []  # still not registered, and warned about once only


def test_a_list_filled_after_init_is_warned_about_when_parameters_are_collected(
        fresh_list_warnings):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.kept = []
            self.fc = nn.Linear(2, in_size=2)

    net = Net()  # an empty list: nothing to say yet
    net.kept.append(net.fc)  # registered already: fine
    assert [p.shape for p in net.parameters()] == [(2, 2), (2,)]
    net.kept.append(Parameter(np.ones(3)))
    with pytest.warns(UserWarning, match=r"Net.kept is a list holding 1 Parameter\(s\)"):
        assert len(net.state_dict()) == 2


def test_dezero_style_layer_lists_registered_by_setattr_give_no_warning(fresh_list_warnings,
                                                                        recwarn):
    class DezeroMLP(nn.Module):  # DeZero's MLP: a list, and setattr for each layer
        def __init__(self, sizes):
            super().__init__()
            self.layers = []
            for i, size in enumerate(sizes):
                layer = nn.Linear(size)
                setattr(self, "l" + str(i), layer)
                self.layers.append(layer)

        def forward(self, x):
            for layer in self.layers[:-1]:
                x = F.sigmoid(layer(x))
            return self.layers[-1](x)

    class ListFirst(nn.Module):  # the list made first, its layers registered after
        def __init__(self):
            super().__init__()
            self.pair = (nn.Linear(3), nn.Linear(2))
            self.l0, self.l1 = self.pair
            self.numbers = [1.0, 2.0]

    class Outer(nn.Module):  # a sub-module's list that holds layers the outer one registers
        def __init__(self):
            super().__init__()
            self.inner = nn.Module()
            self.inner.shared = [nn.Linear(2)]
            self.l0 = self.inner.shared[0]

    model = DezeroMLP((3, 2))
    model(np.ones((1, 2)))
    assert list(model.state_dict()) == ["l0.W", "l0.b", "l1.W", "l1.b"]
    assert [n for n, _ in ListFirst().named_parameters()] == ["l0.W", "l0.b", "l1.W", "l1.b"]
    assert [n for n, _ in Outer().named_parameters()] == ["l0.W", "l0.b"]
    assert [str(w.message) for w in recwarn] == []


def test_a_subclass_may_keep_its_own_attribute_named_lists(fresh_list_warnings):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self._lists = [[1, 2], [3]]  # the user's own data
            self.l1 = nn.Linear(2, in_size=3)
            self.sizes = [4, 2]
            self.hidden = [nn.Linear(5)]  # still warned about: gradcore's names are its own

    net = Net()
    assert net._lists == [[1, 2], [3]] and net.sizes == [4, 2]
    with pytest.warns(UserWarning, match="Net.hidden is a list holding 1 Module"):
        assert [n for n, _ in net.named_parameters()] == ["l1.W", "l1.b"]
    net._gradcore_list_names = "replaced"  # even gradcore's name taken: no crash, no warning
    net.more = [nn.Linear(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [p.shape for p in net.parameters()] == [(3, 2), (2,)]


def test_layers_and_parameters_in_a_dict_are_warned_about_naming_the_container_that_fits(
        fresh_list_warnings):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Linear(2, in_size=3)
            self.heads = {"a": nn.Linear(1), "b": nn.Linear(1)}
            self.extra = {"scale": Parameter(np.ones(1))}
            self.ps = [Parameter(np.ones(2))]
            self.mixed = (nn.Linear(1), Parameter(np.ones(3)))
            self.names = {"a": 1}  # no Module or Parameter: nothing to say

    with pytest.warns(UserWarning) as caught:
        assert list(Net().state_dict()) == ["trunk.W", "trunk.b"]
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 4
    extra, heads, mixed, ps = messages
    assert heads.startswith("Net.heads is a dict holding 2 Module(s) not registered")
    assert "Hold them in an nn.ModuleDict (self.heads = nn.ModuleDict({...}))" in heads
    assert extra.startswith("Net.extra is a dict holding 1 Parameter(s) not registered")
    assert "nn.ParameterDict (self.extra = nn.ParameterDict({...}))" in extra
    assert "nn.ParameterList (self.ps = nn.ParameterList([...]))" in ps
    assert mixed.startswith("Net.mixed is a tuple holding 2 Module and Parameter(s)")
    assert "the Modules in an nn.ModuleList and the Parameters in an nn.ParameterList" in mixed
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per class and attribute
        assert len(Net().state_dict()) == 2


def test_layers_after_a_function_or_in_a_nested_list_are_warned_about(fresh_list_warnings):
    """DeZero-style [F.relu, Linear(2)] and [[Linear(2)]]: not only a first item is read."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Linear(2, in_size=3)
            self.after_function = [F.relu, nn.Linear(1)]
            self.nested = [[nn.Linear(1), nn.Linear(1)]]
            self.numbers = list(range(100))

    with pytest.warns(UserWarning) as caught:
        assert list(Net().state_dict()) == ["trunk.W", "trunk.b"]
    after_function, nested = sorted(str(w.message) for w in caught)
    assert after_function.startswith("Net.after_function is a list holding 1 Module(s)")
    assert nested.startswith("Net.nested is a list holding 2 Module(s)")


def test_layers_in_other_containers_and_subclasses_are_warned_about(fresh_list_warnings):
    """OrderedDict, defaultdict, a set, a deque, a namedtuple, a list subclass, a list of dicts:
    not registered either, so warned about as a plain list or dict, naming the container that
    fits; such containers of numbers alone are not."""
    class Blocks(list):
        pass

    Pair = collections.namedtuple("Pair", "a b")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Linear(2, in_size=3)
            self.ordered = collections.OrderedDict(a=nn.Linear(1), b=nn.Linear(1))
            self.default = collections.defaultdict(list, scale=Parameter(np.ones(1)))
            self.unordered = {nn.Linear(1)}
            self.frozen = frozenset([Parameter(np.ones(2))])
            self.queue = collections.deque([F.relu, nn.Linear(1)])
            self.pair = Pair(nn.Linear(1), nn.Linear(1))
            self.blocks = Blocks([nn.Linear(1)])
            self.of_dicts = [{"fc": nn.Linear(1)}]
            self.quiet = [collections.OrderedDict(a=1), collections.deque([1.0]), {2, 3},
                          Pair(1, 2)]
            self.sizes = collections.OrderedDict(a=4)
            self.steps = collections.deque(range(100))

    with pytest.warns(UserWarning) as caught:
        assert list(Net().state_dict()) == ["trunk.W", "trunk.b"]
    messages = {str(w.message).split(" is ")[0]: str(w.message) for w in caught}
    assert sorted(messages) == ["Net.blocks", "Net.default", "Net.frozen", "Net.of_dicts",
                                "Net.ordered", "Net.pair", "Net.queue", "Net.unordered"]
    assert messages["Net.ordered"].startswith(
        "Net.ordered is an OrderedDict holding 2 Module(s) not registered")
    assert "nn.ModuleDict (self.ordered = nn.ModuleDict({...}))" in messages["Net.ordered"]
    assert messages["Net.default"].startswith("Net.default is a defaultdict holding 1 Parameter")
    assert "nn.ParameterDict (self.default = nn.ParameterDict({...}))" in messages["Net.default"]
    assert messages["Net.unordered"].startswith("Net.unordered is a set holding 1 Module(s)")
    assert "nn.ModuleList (self.unordered = nn.ModuleList([...]))" in messages["Net.unordered"]
    assert "nn.ParameterList (self.frozen" in messages["Net.frozen"]
    assert messages["Net.queue"].startswith("Net.queue is a deque holding 1 Module(s)")
    assert messages["Net.pair"].startswith("Net.pair is a Pair holding 2 Module(s)")
    assert messages["Net.blocks"].startswith("Net.blocks is a Blocks holding 1 Module(s)")
    assert messages["Net.of_dicts"].startswith("Net.of_dicts is a list holding 1 Module(s)")
    assert "(a list or dict inside it as an nn.ModuleList or nn.ModuleDict too)" in (
        messages["Net.of_dicts"])
    assert "inside it" not in messages["Net.ordered"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per class and attribute
        assert len(Net().state_dict()) == 2


def test_an_ordered_dict_of_heads_trained_by_hand_is_warned_about_at_the_first_step(
        fresh_list_warnings):
    # the heads get gradients but the optimizer never sees them: their W stays as it was
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(4, in_size=3)
            self.heads = collections.OrderedDict(a=nn.Linear(1, in_size=4))

        def forward(self, x):
            return self.heads["a"](F.relu(self.body(x)))

    net = Net()
    opt = gradcore.optim.SGD(lr=0.1).setup(net)
    F.mean_squared_error(net(np.ones((2, 3))), np.zeros((2, 1))).backward()
    with pytest.warns(UserWarning, match="Net.heads is an OrderedDict holding 1 Module"):
        opt.update()
    assert net.heads["a"].W.grad is not None and list(net.state_dict()) == ["body.W", "body.b"]


def test_setting_an_attribute_looks_at_a_class_once(fresh_list_warnings, monkeypatch):
    # Module.__setattr__ tells the values that need no look (numbers, arrays, and each class
    # seen that is neither a container nor a Variable) by one set lookup; a class first seen is
    # looked at once, a container class every time
    monkeypatch.setattr(modules, "_PLAIN", set(modules._PLAIN))
    looked = []
    note = modules._note_attribute
    monkeypatch.setattr(modules, "_note_attribute", lambda *a: (looked.append(a[1]), note(*a)))

    class Thing:
        pass

    class Heads(collections.OrderedDict):
        pass

    m = nn.Module()
    for _ in range(3):
        m.n, m.x, m.s, m.none, m.a, m.t = 1, 0.5, "s", None, np.ones(2), Thing()
        m.p, m.sub = Parameter(np.ones(1)), nn.Module()
        m.d = Heads()
    assert looked == ["t", "d", "d", "d"]
    assert Thing in modules._PLAIN and Heads not in modules._PLAIN
    assert modules._list_names(m) == {"d"}


def test_module_dict_and_the_parameter_containers_register_what_they_hold():
    class MultiHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Linear(4, in_size=3)
            self.heads = nn.ModuleDict({"a": nn.Linear(1, in_size=4),
                                        "b": nn.Linear(1, in_size=4)})
            self.extra = nn.ParameterDict({"scale": Parameter(np.full(1, 2.0, np.float32))})
            self.ps = nn.ParameterList([Parameter(np.ones(1, np.float32))])

        def forward(self, x):
            h = F.relu(self.trunk(x))
            y = self.heads["a"](h) + self.heads["b"](h)
            return y * self.extra["scale"] * self.ps[0]

    np.random.seed(0)
    m = MultiHead()
    x = np.random.randn(8, 3).astype(np.float32)
    assert list(m.state_dict()) == ["trunk.W", "trunk.b", "heads.a.W", "heads.a.b", "heads.b.W",
                                    "heads.b.b", "extra.scale", "ps.0"]
    assert len(list(m.parameters())) == 8
    copied = copy.deepcopy(m)
    before = {name: a.copy() for name, a in m.state_dict().items()}
    opt = gradcore.optim.SGD(m.parameters(), lr=0.1)
    F.mean(m(x) ** 2).backward()
    opt.step()
    for name, a in m.state_dict().items():  # every one of them trained
        assert not np.array_equal(a, before[name]), name
    assert copied.heads["a"].W is not m.heads["a"].W
    np.testing.assert_array_equal(copied.state_dict()["heads.a.W"], before["heads.a.W"])
    copied.load_state_dict(m.state_dict())
    np.testing.assert_array_equal(copied(x).data, m(x).data)
    m.to(dtype="float64")
    assert {str(a.dtype) for a in m.state_dict().values()} == {"float64"}
    assert m.extra["scale"].dtype == np.float64 and m.ps[0].dtype == np.float64


def test_module_dict_parameter_list_and_parameter_dict_act_as_pytorch_s():
    a, b = nn.Linear(2, in_size=2), nn.Linear(3, in_size=2)
    heads = nn.ModuleDict([("a", a)])
    heads["b"] = b
    assert list(heads) == ["a", "b"] and heads.keys() == ["a", "b"] and len(heads) == 2
    assert heads.values() == [a, b] and heads.items() == [("a", a), ("b", b)]
    assert "a" in heads and "c" not in heads and 1 not in heads
    heads.update({"a": b})  # replaced in place: keeps its position
    assert heads.items() == [("a", b), ("b", b)]
    assert heads.pop("a") is b and list(heads) == ["b"]
    del heads["b"]
    assert len(heads) == 0 and list(heads.parameters()) == []
    with pytest.raises(KeyError, match="ModuleDict has no key 'c' \\(its keys: none\\)"):
        heads["c"]
    with pytest.raises(KeyError, match="the key 'train' is the name of an attribute of "
                       "ModuleDict"):
        heads["train"] = a
    with pytest.raises(ValueError, match="holds '.'"):
        nn.ModuleDict({"a.b": a})
    with pytest.raises(TypeError, match=r"a value must be a Module, got Parameter \(hold "
                       r"Parameters in an nn.ParameterDict\)"):
        heads.update({"ok": a, "p": Parameter(np.ones(1))})
    assert len(heads) == 0  # every entry checked before any was set
    with pytest.raises(NotImplementedError, match="ModuleDict has no forward"):
        heads(1.0)

    p, q = Parameter(np.ones(2)), Parameter(np.zeros(3))
    ps = nn.ParameterList([p]).append(q)
    assert list(ps) == [p, q] and ps[-1] is q and len(ps[:1]) == 1 and ps[:1][0] is p
    assert list(ps.state_dict()) == ["0", "1"]
    del ps[0]
    assert list(ps.state_dict()) == ["0"] and ps[0] is q  # numbered again, as in PyTorch
    assert repr(ps) == "ParameterList(0: (3,))"
    with pytest.raises(TypeError, match=r"ParameterList: an item must be a Parameter, got "
                       r"ndarray \(make it one: nn.Parameter\(array\)\)"):
        ps.append(np.ones(2))
    with pytest.raises(TypeError, match=r"got Linear \(hold Modules in an nn.ModuleList\)"):
        nn.ParameterList([a])
    with pytest.raises(IndexError, match="ParameterList index 3 is out of range for 1 "
                       "parameters"):
        ps[3]
    # what the list warning used to advise for Parameters: ModuleList now points on
    with pytest.raises(TypeError, match=r"ModuleList: an item must be a Module, got "
                       r"Parameter \(hold Parameters in an nn.ParameterList\)"):
        nn.ModuleList([p])
    extra = nn.ParameterDict({"scale": p})
    assert extra["scale"] is p and list(extra.state_dict()) == ["scale"]
    with pytest.raises(TypeError, match="ParameterDict: a value must be a Parameter, got "
                       "Variable"):
        extra["v"] = Variable(np.ones(1))


@pytest.fixture
def fresh_variable_warnings(monkeypatch):
    monkeypatch.setattr(gradcore.nn.module, "_warned_variables", set(), raising=False)


def test_a_leaf_variable_that_requires_grad_set_beside_the_layers_is_warned_about(
        fresh_variable_warnings):
    class M(nn.Module):
        def __init__(self, scale):
            super().__init__()
            self.lin = nn.Linear(2, in_size=3)
            self.scale = scale

        def forward(self, x):
            return self.lin(x) * self.scale

    with pytest.warns(UserWarning) as caught:
        m = M(Variable(np.ones(2, np.float32), requires_grad=True))
    assert len(caught) == 1 and caught[0].filename == __file__  # the line that set it
    message = str(caught[0].message)
    assert message.startswith("M.scale is a Variable that requires grad but is not a "
                              "Parameter, so it is not registered")
    assert "self.scale = nn.Parameter(...)" in message
    assert "requires_grad=False, or register it as a buffer" in message
    assert "scale" not in m.state_dict()  # as before: a warning, not a registration
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        M(Variable(np.ones(2)))  # warned about once per class and attribute
        M(Variable(np.ones(2), requires_grad=False))  # a constant
        M(F.tanh(Variable(np.ones(2))))  # computed: a state, not a weight
        M(Parameter(np.ones(2)))
        rnn = nn.RNN(2, in_size=2)
        rnn.h = Variable(np.zeros((1, 2)))  # a first state set by hand
        lstm = nn.LSTM(2, in_size=2)
        lstm.h, lstm.c = Variable(np.zeros((1, 2))), Variable(np.zeros((1, 2)))
        m.register_buffer("steps", np.zeros(1))
        m.steps = Variable(np.ones(1))  # into a buffer: stays one
        m.note = np.ones(2)
    assert list(m.state_dict()) == ["lin.W", "lin.b", "steps"]


def test_forgetting_super_init_is_explained():
    class Bad(nn.Module):
        def __init__(self):
            self.W = Parameter(np.ones(1))

    with pytest.raises(AttributeError, match=r"super\(\).__init__\(\)"):
        Bad()

    class Quiet(nn.Module):
        def __init__(self):
            self.k = 3

        def forward(self, x):
            return x

    with pytest.raises(AttributeError, match=r"super\(\).__init__\(\)"):
        Quiet()(1.0)


def test_shared_parameters_and_modules_come_once():
    shared = nn.Linear(2, 2)
    m = nn.Module()
    m.first = shared
    m.second = shared
    m.p = shared.W
    assert names(m) == ["first.W", "first.b"]
    assert [n for n, _ in m.named_modules()] == ["", "first"]
    assert list(m.children()) == [shared]


def test_named_modules_children_modules():
    net = Net()
    assert [n for n, _ in net.named_modules()] == ["", "block", "block.fc", "head"]
    assert list(net.modules()) == [net, net.block, net.block.fc, net.head]
    assert [n for n, _ in net.named_children()] == ["block", "head"]
    assert list(net.children()) == [net.block, net.head]


def test_a_module_containing_itself_does_not_loop():
    m = nn.Linear(2, 2)
    outer = nn.Module()
    outer.inner = m
    m.parent = outer
    assert names(outer) == ["inner.W", "inner.b"]
    assert len(list(outer.modules())) == 2


def test_zero_grad_and_cleargrads():
    net = Net()
    F.sum(net(np.ones((4, 2)))).backward()
    assert sum(p.grad is not None for p in net.parameters()) == 5  # all but z and a (unused)
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    F.sum(net(np.ones((4, 2)))).backward()
    net.cleargrads()
    assert all(p.grad is None for p in net.parameters())


def test_zero_grad_set_to_none_false_fills_zeros_in_place():
    net = Block()
    F.sum(net(np.ones((4, 2)))).backward()
    grads = [(p.grad, p.grad.data) for p in net.parameters()]
    assert net.zero_grad(set_to_none=False) is None
    for p, (grad, array) in zip(net.parameters(), grads):
        assert p.grad is grad and grad.data is array  # in place, as Optimizer.zero_grad(False)
        np.testing.assert_array_equal(array, np.zeros(p.shape))
    net.fc.W.grad = Variable(np.broadcast_to(np.ones(3, np.float32), (2, 3)), requires_grad=False)
    net.zero_grad(False)  # read-only: a new zero gradient instead
    np.testing.assert_array_equal(net.fc.W.grad.data, np.zeros((2, 3)))
    net.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in net.parameters())


def test_requires_grad_sets_every_parameter():
    net = Net()  # head lazy: its parameters are set too
    assert net.block.requires_grad_(False) is net.block
    assert [p.requires_grad for p in net.parameters()] == [True, False, False, False, True, True,
                                                           True]
    F.sum(net(np.ones((4, 2)))).backward()
    assert net.block.fc.W.grad is None and net.block.scale.grad is None  # frozen
    np.testing.assert_array_equal(net.head.b.grad.data, [4.0])
    assert net.requires_grad_() is net
    assert all(p.requires_grad for p in net.parameters())


def test_apply_calls_children_before_their_parent():
    net = Net()
    order = {id(m): name for name, m in net.named_modules()}
    called = []
    assert net.apply(lambda m: called.append(order[id(m)])) is net
    assert called == ["block.fc", "block", "head", ""]  # PyTorch's order
    shared = nn.Linear(2, 2)
    outer = nn.Module()
    outer.a = nn.Sequential(shared)
    outer.b = shared
    called = []
    outer.apply(called.append)
    assert called == [shared, outer.a, outer]  # a module reachable twice: called once
    block = Block().apply(lambda m: isinstance(m, nn.Linear) and m.b.data.fill(0.5))
    np.testing.assert_array_equal(block.fc.b.data, [0.5, 0.5, 0.5])  # an initialiser
    with pytest.raises(TypeError, match="apply expects a callable"):
        block.apply("init")


def test_aliases():
    import gradcore.layers as L
    import gradcore.models as models

    assert nn.Layer is nn.Module and nn.Model is nn.Module and gradcore.Model is nn.Module
    assert gradcore.Layer is nn.Module and L.Layer is nn.Module and models.Model is nn.Module
    assert L.Linear is nn.Linear and L.EmbedID is nn.Embedding and L.Parameter is Parameter
    assert models.MLP is nn.MLP and nn.Parameter is Parameter
    lin = nn.Linear(2, 2)
    assert list(lin.params()) == [lin.W, lin.b]


def test_repr():
    text = repr(nn.Sequential(nn.Linear(3), nn.ReLU()))
    assert text == ("Sequential(\n  (0): Linear(in_size=None, out_size=3, nobias=False)\n"
                    "  (1): ReLU()\n)")
    assert repr(Block()).startswith("Block(\n  (fc): Linear(in_size=2, out_size=3")


def test_forward_must_be_defined():
    with pytest.raises(NotImplementedError, match="must define forward"):
        nn.Module()(1.0)


# =============================================================================== modes
def test_train_eval_set_the_flag_on_the_whole_tree():
    net = Net()
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    with pytest.raises(TypeError, match="True or False"):
        net.train("no")


def test_dropout_follows_the_module_mode_and_config():
    drop = nn.Dropout(0.5)
    x = np.ones((200,))
    y = drop(x).data
    assert set(np.unique(y)) == {0.0, 2.0}  # train: dropped or scaled by 1 / (1 - 0.5)
    drop.eval()
    np.testing.assert_array_equal(drop(x).data, x)
    drop.train()
    with gradcore.test_mode():  # the global switch still wins over a training module
        np.testing.assert_array_equal(drop(x).data, x)
    assert set(np.unique(drop(x).data)) == {0.0, 2.0}


def test_eval_reaches_functional_ops_inside_forward():
    class M(nn.Module):
        def forward(self, x):
            return F.dropout(x, 0.5)  # DeZero models call F.dropout directly

    m = M().eval()
    x = np.ones(50)
    np.testing.assert_array_equal(m(x).data, x)
    assert gradcore.Config.train  # only for the duration of the forward


def test_a_train_mode_module_inside_an_eval_mode_parent_runs_in_train_mode():
    # PyTorch's rule, each module's own flag: MC dropout (model.eval(), then dropout.train())
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(50, in_size=10), nn.Dropout(0.5), nn.BatchNorm())
    x = np.ones((4, 10), np.float32)
    model(x)
    model.eval()
    reference = model(x).data
    model[1].train()
    y1, y2 = model(x).data, model(x).data
    assert not np.array_equal(y1, y2)  # dropout on: two samples differ
    hidden = model[0](x).data
    dropped = (model[1](hidden).data == 0).mean()
    assert 0.3 < dropped < 0.7
    avg_mean = model[2].avg_mean.data.copy()
    model(x)
    np.testing.assert_array_equal(model[2].avg_mean.data, avg_mean)  # BatchNorm stays in eval
    assert gradcore.Config.train  # only for the duration of the forward
    with gradcore.test_mode():  # the global switch still wins over every module
        np.testing.assert_array_equal(model(x).data, reference)
    model.eval()
    np.testing.assert_array_equal(model(x).data, reference)

    class Outer(nn.Module):  # eval-mode modules nested, an F.dropout in each forward
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Dropout(0.5))

        def forward(self, x):
            return self.inner(F.dropout(x, 0.5))

    outer = Outer().eval()
    ones = np.ones(400)
    np.testing.assert_array_equal(outer(ones).data, ones)
    outer.inner[0].train()  # its parent and grandparent in eval: it drops, they do not
    assert set(np.unique(outer(ones).data)) == {0.0, 2.0}


@gradcore.test_mode
def _called_in_test_mode(f, x):
    return f(x)


@gradcore.using_config("train", False)
def _called_under_using_config(f, x):
    return f(x)


@gradcore.test_mode()
def _stepped_in_test_mode(f, x):
    yield f(x)


def _assigning_test_mode(f, x):
    gradcore.Config.train = False  # DeZero's way; the module's forward puts it back after
    return f(x)


def _assigning_test_mode_under_no_grad(f, x):
    with gradcore.no_grad():  # leaving no_grad leaves Config.train as assigned
        gradcore.Config.train = False
    return f(x)


@pytest.mark.parametrize("inner", ["test_mode", "using_config", "test_mode under no_grad",
                                   "test_mode around an eval-mode module", "decorated",
                                   "decorated by using_config", "decorated generator",
                                   "assigned", "assigned under no_grad"])
def test_test_mode_entered_inside_an_eval_mode_parent_s_forward_reaches_a_train_mode_child(inner):
    # a child's own train() wins over its parent's eval() only: a test mode written in the
    # forward is explicit, as one around the call, and puts every module in it in test mode,
    # however it was switched on
    calls = {"decorated": _called_in_test_mode,
             "decorated by using_config": _called_under_using_config,
             "decorated generator": lambda f, x: next(_stepped_in_test_mode(f, x)),
             "assigned": _assigning_test_mode,
             "assigned under no_grad": _assigning_test_mode_under_no_grad}

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)
            self.block = nn.Sequential(nn.Dropout(0.5))
            self.explicit = False

        def forward(self, x):
            if not self.explicit:
                return self.block(self.drop(x))
            if inner in calls:
                return calls[inner](lambda h: self.block(self.drop(h)), x)
            if inner == "test_mode":
                with gradcore.test_mode():
                    return self.block(self.drop(x))
            if inner == "using_config":
                with gradcore.using_config("train", False):
                    return self.block(self.drop(x))
            if inner == "test_mode under no_grad":
                with gradcore.test_mode(), gradcore.no_grad():
                    return self.block(self.drop(x))
            with gradcore.test_mode():  # an eval-mode module in it keeps the test mode too
                return self.block(x)

    np.random.seed(0)
    ones = np.ones((1, 1000))
    model = Parent().eval()
    model.drop.train()
    model.block[0].train()  # MC dropout: two train-mode children of eval-mode modules
    dropped = (model(ones).data == 0).mean()
    assert 0.6 < dropped < 0.9  # each drops about half: 3/4 of the ones are zeros
    model.explicit = True
    np.testing.assert_array_equal(model(ones).data, ones)  # no dropout anywhere
    model.explicit = False
    assert 0.6 < (model(ones).data == 0).mean() < 0.9  # and the children drop again after it
    assert gradcore.Config.train


def test_an_eval_mode_parent_s_own_test_mode_is_back_after_an_explicit_one_inside_it_ends():
    class Assigns(nn.Module):  # eval mode too: its assignment ends with its forward
        def forward(self, x):
            gradcore.Config.train = False
            return x

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.assigns, self.drop = Assigns(), nn.Dropout(0.5)

        def forward(self, x):
            with gradcore.test_mode():
                pass
            _called_in_test_mode(lambda h: h, x)
            next(_stepped_in_test_mode(lambda h: h, x))
            return self.drop(self.assigns(x))

    np.random.seed(0)
    model = Parent().eval()
    model.drop.train()
    assert 0.4 < (model(np.ones(1000)).data == 0).mean() < 0.6  # the child still drops
    assert gradcore.Config.train


@pytest.mark.parametrize("switch", [None, gradcore.test_mode])
def test_a_train_mode_module_checkpointed_inside_an_eval_mode_parent_runs_again_as_it_ran(
        switch):
    # computed again in backward, the block is called under the Config.train it was first
    # called with (False: the parent's), without the parent around it: it must still run the
    # BatchNorm in train mode (batch statistics), or, under the caller's test_mode(), in test mode
    class Parent(nn.Module):
        def __init__(self, checkpointed):
            super().__init__()
            self.lin, self.bn, self.checkpointed = nn.Linear(3, in_size=4), nn.BatchNorm(), False
            self(np.ones((2, 4)))  # every weight made outside checkpoint
            self.checkpointed = checkpointed

        def forward(self, x):
            h = self.lin(x)
            return gradcore.checkpoint(self.bn, h) if self.checkpointed else self.bn(h)

    x = np.random.default_rng(0).standard_normal((6, 4)) * 3 + 1
    results = []
    for checkpointed in (False, True):
        np.random.seed(0)
        model = Parent(checkpointed).eval()
        model.bn.train()
        with switch() if switch else gradcore.using_config("train", True):
            y = model(x)
        F.sum(y * y).backward()
        results.append((y.data, model.lin.W.grad.data))
    (y, grad), (y_checkpointed, grad_checkpointed) = results
    np.testing.assert_array_equal(y_checkpointed, y)
    np.testing.assert_allclose(grad_checkpointed, grad, rtol=1e-12)
    if switch is None:  # batch statistics: each column of y has mean 0
        np.testing.assert_allclose(y.mean(axis=0), 0.0, atol=1e-12)


def test_a_module_frozen_in_eval_inside_a_training_model_stays_in_eval():
    np.random.seed(0)
    bn = nn.BatchNorm()
    net = nn.Sequential(nn.Linear(3, in_size=2), bn)
    x = np.random.randn(8, 2).astype(np.float32) * 5 + 3
    net(x)
    bn.eval()
    avg_mean = bn.avg_mean.data.copy()
    net(x)
    np.testing.assert_array_equal(bn.avg_mean.data, avg_mean)


def test_batchnorm_train_and_eval():
    bn = nn.BatchNorm()
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, size=(8, 2))
    y = bn(x).data
    np.testing.assert_allclose(y.mean(axis=0), 0.0, atol=1e-12)  # batch statistics
    mean = bn.avg_mean.data.copy()
    np.testing.assert_allclose(mean, 0.1 * x.mean(axis=0))  # running mean: decay 0.9 from 0
    bn.eval()
    y = bn(x).data  # running statistics, and no update
    expected = (x - mean) / np.sqrt(bn.avg_var.data + 2e-5)
    np.testing.assert_allclose(y, expected)
    np.testing.assert_array_equal(bn.avg_mean.data, mean)


def _pickled(module):
    return pickle.loads(pickle.dumps(module))


def test_a_shallow_copy_of_a_module_registers_on_its_own():
    """copy.copy shared the original's registry: a layer registered on the copy was listed by
    the original, which had no such attribute (a number set there then raised "holds a
    module")."""
    model = nn.Sequential(nn.Linear(2, in_size=3))
    twin = copy.copy(model)
    twin.extra = nn.Linear(2, in_size=2)
    model.extra = 5.0
    assert len(list(twin.parameters())) == 4 and len(list(model.parameters())) == 2
    assert "extra" not in model.state_dict() and "extra.W" in twin.state_dict()


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy, _pickled],
                         ids=["copy", "deepcopy", "pickle"])
def test_a_copy_made_in_eval_mode_replays_in_train_mode_after_train(copier):
    # the copy is entered in the table of eval-mode modules that gradcore.compile keys on: after
    # its train() a compiled step records again, with batch statistics, instead of replaying
    # the eval-mode tape
    rng = np.random.default_rng(0)
    bn = nn.BatchNorm()
    bn(rng.normal(3.0, 2.0, size=(8, 2)))
    bn.eval()
    model = copier(bn)
    compiled = gradcore.compile(lambda x: model(Variable(x)))
    x = rng.normal(3.0, 2.0, size=(8, 2))
    mean, var = model.avg_mean.data.copy(), model.avg_var.data.copy()
    for _ in range(3):
        np.testing.assert_allclose(compiled(x).data, (x - mean) / np.sqrt(var + 2e-5))
    np.testing.assert_array_equal(model.avg_mean.data, mean)
    model.train()
    y = compiled(x).data
    np.testing.assert_allclose(y, (x - x.mean(axis=0)) / np.sqrt(x.var(axis=0) + 2e-5))
    np.testing.assert_allclose(model.avg_mean.data, 0.9 * mean + 0.1 * x.mean(axis=0))
    assert compiled.stats()["recordings"] == 2


@pytest.mark.parametrize("copier", [copy.deepcopy, _pickled], ids=["deepcopy", "pickle"])
def test_a_model_copied_in_eval_mode_drops_out_after_train_in_a_compiled_step(copier):
    np.random.seed(0)
    base = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm(), nn.Dropout(0.5))
    base(np.random.randn(5, 4))
    base.eval()
    model, twin = copier(base), copier(base)  # twin: the eager reference
    compiled = gradcore.compile(lambda x: model(Variable(x)))
    x = np.random.randn(6, 4)
    for _ in range(3):
        np.testing.assert_allclose(compiled(x).data, twin(x).data)
    model.train()
    twin.train()
    for i in range(2):
        gradcore.manual_seed(i)
        want = twin(x).data
        gradcore.manual_seed(i)
        y = compiled(x).data
        np.testing.assert_allclose(y, want)
        assert np.count_nonzero(y == 0) > 0  # dropout is on
    np.testing.assert_allclose(model[1].avg_mean.data, twin[1].avg_mean.data)


def test_the_eval_mode_tables_forget_dead_modules_and_stay_bounded():
    """A loop that makes a model per trial and evaluates it (a hyper-parameter search) leaves
    nothing behind in the tables gradcore.compile keys on: a dead module's entry goes at once,
    and only the most recent sets of modules in eval mode keep their numbers."""
    in_eval = len(modules._in_eval)
    kept = []
    collecting = gc.isenabled()
    gc.disable()
    try:
        for trial in range(3 * modules.MODE_NUMBERS_KEPT):
            model = nn.Sequential(nn.Linear(2, 1, nobias=True), nn.ReLU())
            model[0].W.data = np.array([[1.0], [-2.0]])
            model.eval()
            assert model(np.array([[3.0, 1.0]])).data.tolist() == [[1.0]]
            if trial % 2:
                kept.append(model)  # the others die: every set of modules in eval mode is new
        del model
        assert len(modules._in_eval) == in_eval + 3 * len(kept)  # three modules per model
        assert len(modules._mode_numbers) <= modules.MODE_NUMBERS_KEPT
        del kept
        assert len(modules._in_eval) == in_eval
    finally:
        if collecting:
            gc.enable()


def test_modes_changed_in_several_threads_at_once_forget_the_dead_once(monkeypatch):
    # draining the dead ids (a test, then a pop) and rebuilding the numbered sets from a copy
    # raced: a thread popped from a list another had just emptied (IndexError), or put back a
    # copy taken before another's rebuild, and the set in force got a new number (a compiled
    # step would record again)
    dead = [10**9 + k for k in range(3)]  # ids of modules that died in eval mode
    monkeypatch.setattr(modules, "_in_eval", {})
    monkeypatch.setattr(modules, "_died", [])
    monkeypatch.setattr(modules, "mode_key", [0])
    monkeypatch.setattr(modules, "_mode_numbers", collections.OrderedDict(
        {frozenset({*dead, 7}): 4, frozenset(dead): 3, frozenset(): 0}))
    errors = []

    def change_modes():
        try:
            for _ in range(3000):
                modules._died.extend(dead)  # as the weak references' callbacks do
                modules._modes_changed()  # as train() and eval() do
        except Exception as error:  # noqa: BLE001 -- reported below, from the test's thread
            errors.append(error)

    run_in_threads([change_modes] * 8)
    assert errors == []
    assert modules._died == []
    assert dict(modules._mode_numbers) == {frozenset({7}): 4, frozenset(): 0}
    assert modules.mode_key == [0]


def test_a_set_of_eval_modules_forgotten_comes_back_with_a_number_never_handed_out(monkeypatch):
    monkeypatch.setattr(modules, "MODE_NUMBERS_KEPT", 3)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    compiled = gradcore.compile(lambda x: model(Variable(x)))
    x = np.random.default_rng(0).normal(size=(2, 4))
    model.eval()
    handed = {modules.mode_key[0]}
    for _ in range(3):
        np.testing.assert_array_equal(compiled(x).data, model[0](x).data)  # no dropout
    others = [nn.Linear(2, 2) for _ in range(4)]
    for m in others:  # 4 more sets: the model's alone is forgotten
        m.eval()
        handed.add(modules.mode_key[0])
    for m in reversed(others):
        m.train()
    assert modules.mode_key[0] not in handed  # a new number: no tape is keyed by it
    np.testing.assert_array_equal(compiled(x).data, model[0](x).data)
    assert compiled.stats()["recordings"] == 2


def test_a_module_in_eval_mode_dying_leaves_the_mode_key_of_the_living_as_it_was():
    # the modes in force did not change, so a step compiled before must not record again when
    # the collector happens to run: the key once changed with the dead ids taken out of the set
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    doomed = nn.Dropout(0.5)
    doomed.eval()
    model.eval()
    compiled = gradcore.compile(lambda x: model(Variable(x)))
    x = np.random.default_rng(0).normal(size=(2, 4))
    compiled(x)
    key = modules.mode_key[0]
    del doomed
    gc.collect()
    model.eval()  # the same modes again: the set of the living, now without the dead id
    assert modules.mode_key[0] == key
    np.testing.assert_array_equal(compiled(x).data, model[0](x).data)
    assert compiled.stats()["recordings"] == 1
    other = nn.Linear(2, 2)
    other.eval()  # a real change still gets another number
    assert modules.mode_key[0] != key
    other.train()
    assert modules.mode_key[0] == key


FIRST_EVAL = """
import numpy as np
import gradcore
from gradcore import nn
model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
step = gradcore.compile(lambda x: model(gradcore.Variable(x)))
x = np.ones((2, 4))
step(x); step(x)  # recorded in train mode: dropout on
model.eval()  # the first eval() of the process: another number than train mode's
assert np.array_equal(step(x).data, model[0](x).data), "replayed the train-mode tape"
"""


def test_the_first_eval_of_a_process_does_not_replay_the_train_mode_tape():
    root = os.path.dirname(os.path.dirname(os.path.abspath(gradcore.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", FIRST_EVAL], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


class _Scaled(nn.Module):  # at module level, so that pickle finds it
    __slots__ = ("scale",)

    def __init__(self):
        super().__init__()
        self.scale = 2.0
        self.l = nn.Linear(3, 2)

    def forward(self, x):
        return self.l(x) * self.scale


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy, _pickled],
                         ids=["copy", "deepcopy", "pickle"])
def test_a_subclass_with_slots_copies_and_its_copy_enters_its_mode(copier):
    # its state is (__dict__, slots): both parts come back, and the mode is registered
    model = _Scaled().eval()
    twin = copier(model)
    assert twin.scale == 2.0 and twin.training is False and twin.l is not None
    assert [name for name, _ in twin.named_parameters()] == ["l.W", "l.b"]
    x = np.ones((1, 3), np.float32)
    np.testing.assert_array_equal(twin(x).data, model(x).data)
    compiled = gradcore.compile(lambda x: twin(Variable(x)))
    compiled(x)
    twin.train()
    compiled(x)
    assert compiled.stats()["recordings"] == 2  # the copy's train() is a new mode


# =============================================================================== hooks
def test_forward_hooks_fire_replace_and_remove():
    lin = nn.Linear(2, 2)
    calls = []
    pre = lin.register_forward_pre_hook(lambda m, inputs: calls.append(("pre", m, len(inputs))))
    post = lin.register_forward_hook(lambda m, inputs, y: calls.append(("post", m, y.shape)))
    x = np.ones((3, 2))
    lin(x)
    assert calls == [("pre", lin, 1), ("post", lin, (3, 2))]

    replace = lin.register_forward_hook(lambda m, inputs, y: y * 0.0 + 7.0)
    np.testing.assert_array_equal(lin(x).data, np.full((3, 2), 7.0))
    replace.remove()
    replace.remove()  # twice is harmless
    assert not np.allclose(lin(x).data, 7.0)

    pre.remove()
    post.remove()
    calls.clear()
    lin(x)
    assert calls == []


def test_a_kept_hook_handle_lets_its_module_die_when_the_hook_refers_to_it():
    handles, modules_made = [], []
    for _ in range(3):
        lin = nn.Linear(2, 2)
        handles.append(lin.register_forward_hook(lambda m, inputs, y, lin=lin: y))
        handles.append(lin.register_forward_pre_hook(lambda m, inputs, lin=lin: None))
        modules_made.append(weakref.ref(lin))
    del lin
    gc.collect()
    assert [ref() for ref in modules_made] == [None] * 3
    for handle in handles:
        handle.remove()  # after the module died: nothing to do


def test_a_module_pickled_with_its_hooks_in_a_plain_dict_takes_new_hooks():
    lin = nn.Linear(2, 2)
    object.__setattr__(lin, "_forward_hooks", {})  # as an older gradcore pickled it
    handle = lin.register_forward_hook(lambda m, inputs, y: y * 0.0 + 7.0)
    np.testing.assert_array_equal(lin(np.ones((1, 2))).data, [[7.0, 7.0]])
    handle.remove()
    assert not np.allclose(lin(np.ones((1, 2))).data, 7.0)
    assert pickle.loads(pickle.dumps(lin))._forward_hooks == {}


def test_pre_hook_can_replace_the_inputs():
    lin = nn.Linear(2, 2)
    lin.register_forward_pre_hook(lambda m, inputs: inputs[0] * 0.0)  # one value: one input
    np.testing.assert_array_equal(lin(np.ones((1, 2))).data, lin.b.data[None])
    with pytest.raises(TypeError, match="callable"):
        lin.register_forward_hook("not a function")


def test_hook_output_replacement_keeps_the_graph():
    lin = nn.Linear(2, 1)
    lin.register_forward_hook(lambda m, inputs, y: y * 2.0)
    F.sum(lin(np.ones((1, 2)))).backward()
    np.testing.assert_array_equal(lin.b.grad.data, [2.0])


# =============================================================================== devices and dtypes
def test_to_moves_parameters_gradients_and_buffers_and_back():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm(), nn.Linear(4, 2))
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    F.sum(model(x)).backward()
    values = {n: np.array(a) for n, a in model.state_dict().items()}
    grads = {n: np.array(p.grad.data) for n, p in model.named_parameters()}

    assert model.to(DEVICE1) is model
    for name, v in list(model.named_parameters()) + list(model.named_buffers()):
        assert v.device == DEVICE1, name
        np.testing.assert_array_equal(v.numpy(), values[name])
    for name, p in model.named_parameters():
        assert p.grad.device == DEVICE1
        np.testing.assert_array_equal(p.grad.numpy(), grads[name])
    y = model.eval()(STRICT.asarray(x, device=DEVICE1))  # eval: the running stats stay
    assert y.device == DEVICE1

    model.to("cpu")
    for name, v in list(model.named_parameters()) + list(model.named_buffers()):
        assert isinstance(v.data, np.ndarray)
        np.testing.assert_array_equal(v.data, values[name])
    assert all(isinstance(p.grad.data, np.ndarray) for p in model.parameters())
    assert model.to_cpu() is model


def test_to_dtype_and_device_together():
    lin = nn.Linear(2, 3)
    F.sum(lin(np.ones((1, 2), dtype=np.float32))).backward()
    lin.to(str(DEVICE1), dtype=np.float64)
    assert lin.W.device == DEVICE1 and lin.W.dtype == STRICT.xp.float64
    assert lin.W.grad.dtype == STRICT.xp.float64
    lin.to(dtype="float32")
    assert lin.W.dtype == STRICT.xp.float32 and lin.W.device == DEVICE1


@pytest.mark.parametrize("device", [None, DEVICE1])
def test_to_the_dtype_and_device_it_has_writes_nothing(device):
    lin = nn.Linear(3, in_size=2).to(device)
    x = np.ones((2, 2), np.float32)
    if device is not None:
        x = STRICT.asarray(x, device=device)
    F.sum(lin(x)).backward()  # gradients to move too
    y = F.sum(lin(x))  # a graph recorded before to(): its backward must still run
    state = lin.state_dict()
    variables = [lin.W, lin.b, lin.W.grad, lin.b.grad]
    before = [(v.data, v.version) for v in variables]
    lin.to(device, dtype="float32")
    assert all(v.data is data and v.version == version
               for v, (data, version) in zip(variables, before))
    assert state["W"] is lin.W.data and state["b"] is lin.b.data
    y.backward()


def test_bad_to_raises_and_changes_nothing():
    lin = nn.Linear(2, 3)
    W = lin.W.data
    with pytest.raises(ValueError, match="floating dtype"):
        lin.to(dtype=np.int32)
    with pytest.raises(ValueError, match="unknown device"):
        lin.to("tpu:0")
    with pytest.raises(gradcore.DeviceUnavailableError, match="does not exist"):
        lin.to(f"{STRICT.device_type}:device9")
    assert lin.W.data is W


@pytest.mark.parametrize("dtype", [np.float64, np.dtype("float64"), "float64"])
def test_a_dtype_given_where_the_device_goes_says_to_pass_it_by_keyword(dtype):
    lin = nn.Linear(2, in_size=2)
    with pytest.raises(TypeError, match=r"Module\.to: .* is a dtype, not a device: pass it by "
                       r"keyword, to\(dtype='float64'\)"):
        lin.to(dtype)  # PyTorch's model.to(torch.float64)
    assert lin.W.dtype == np.float32
    with pytest.raises(TypeError, match="to\\(\\) casts to a floating dtype only"):
        lin.to(np.int32)


def test_a_dtype_the_device_lacks_is_refused_naming_both_before_anything_changes():
    # array-api-strict has no float16
    no_float16 = (rf"Module\.to: {STRICT.device_type}:device1 has no float16 \(its floating "
                  r"dtypes: float32, float64\); use one of those, or a device that has float16")
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(2)).to(DEVICE1)  # the second still lazy
    W = model[0].W.data
    with pytest.raises(ValueError, match=no_float16):
        model.to(dtype="float16")
    assert model[0].W.data is W and model[0]._dtype is None
    lazy = nn.Linear(2)
    with pytest.raises(ValueError, match=no_float16):  # said before anything has data
        lazy.to(DEVICE1, dtype=np.float16)
    assert lazy._device is None and lazy._dtype is None
    half = nn.Linear(2, dtype="float16").to(DEVICE1)  # its lazy W and b are made on device1
    with pytest.raises(ValueError, match=no_float16.replace("Module\\.to", "load_state_dict")):
        half.load_state_dict({"W": np.ones((3, 2)), "b": np.ones(2)})
    assert half.W.data is None and half.b.data is None


def test_a_move_alone_to_a_device_lacking_the_models_dtype_is_refused_as_with_the_dtype():
    # the model keeps float16: device1 must have it, and says so as to(DEVICE1, "float16") does
    no_float16 = (rf"Module\.to: {STRICT.device_type}:device1 has no float16 \(its floating "
                  r"dtypes: float32, float64\); use one of those, or a device that has float16")
    model = nn.Sequential(nn.Linear(2, in_size=3), nn.Linear(2)).to(dtype="float16")
    W, b = model[0].W.data, model[0].b.data
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # array-api-strict's dtype comparisons warned 13 times
        with pytest.raises(ValueError, match=no_float16):
            model.to(DEVICE1)
        with pytest.raises(ValueError, match=no_float16):
            model.to_gpu(DEVICE1)
    assert model[0].W.data is W and model[0].b.data is b and W.dtype == np.float16
    assert model[0]._device is None and model[1]._device is None
    single = nn.Linear(2, in_size=3).to(DEVICE1)  # float32: moves, and back to float16 on cpu
    assert single.W.device == DEVICE1 and single.to("cpu", "float16").W.dtype == np.float16


def test_lazy_layers_are_created_on_the_input_device():
    net = Net().to(DEVICE2)  # eager parameters move; the lazy head follows its first input
    y = net(STRICT.asarray(np.ones((2, 2)), device=DEVICE2))
    assert y.device == DEVICE2 and net.head.W.device == DEVICE2


def test_plot_writes_the_graph(tmp_path):
    net = Net()
    out = net.plot(np.ones((2, 2)), to_file=str(tmp_path / "net.dot"))
    text = (tmp_path / "net.dot").read_text()
    assert out.endswith("net.dot") and text.startswith("digraph g {")
    assert '"Linear"' in text and '"W: (2, 3) float32"' in text  # block.fc.W


def test_module_device_checks_come_from_the_ops():
    lin = nn.Linear(2, 2).to(DEVICE1)
    with pytest.raises(ValueError, match="linear: inputs are on"):
        lin(STRICT.asarray(np.ones((1, 2)), device=DEVICE2))


def test_to_gpu_without_a_gpu_says_so_and_changes_nothing():
    if gradcore.cuda_available():
        pytest.skip("a GPU is present")
    lin = nn.Linear(2, 3)
    W = lin.W.data
    with pytest.raises(gradcore.DeviceUnavailableError):
        lin.to_gpu()
    assert lin.W.data is W


# =============================================================================== buffers
class Counter(nn.Module):
    """A module with a buffer of its own."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(np.ones(2))
        self.register_buffer("count", np.zeros(1))

    def forward(self, x):
        self.count.data += 1
        return x * self.w


def test_buffers_are_saved_and_moved_but_not_parameters():
    m = Counter()
    m(np.ones(2))
    assert [n for n, _ in m.named_parameters()] == ["w"]
    assert [n for n, _ in m.named_buffers()] == ["count"]
    assert m.count.requires_grad is False
    assert list(m.state_dict()) == ["w", "count"] and m.state_dict()["count"][0] == 1.0
    m.to(DEVICE1)
    assert m.count.device == DEVICE1
    m.load_state_dict({"w": Variable(np.full(2, 3.0)), "count": np.array([7.0])})
    assert m.count.device == DEVICE1 and m.count.numpy()[0] == 7.0
    np.testing.assert_array_equal(m.w.numpy(), [3.0, 3.0])


def test_bad_buffers():
    m = Counter()
    with pytest.raises(TypeError, match=r"Counter\.count, a buffer: assign a Variable or None"):
        m.count = np.zeros(1)
    with pytest.raises(KeyError, match="already has an attribute 'w'"):
        m.register_buffer("w", np.zeros(1))
    with pytest.raises(ValueError, match="'a.b' on Counter: the name holds '.'"):
        m.register_buffer("a.b", np.zeros(1))
    m.count = None  # a lazy buffer: kept registered, skipped until it has a value
    assert list(m.named_buffers()) == []


def test_a_variable_registered_as_a_buffer_gets_no_gradient():
    lin = nn.Linear(2, 2)
    scale = Variable(np.array([1.0, 2.0], np.float32))  # requires grad, as DeZero's do
    assert lin.register_buffer("scale", scale) is scale and lin.scale is scale
    assert scale.requires_grad is False
    x = np.ones((1, 2), np.float32)
    (lin(x) * lin.scale).sum().backward()
    assert scale.grad is None
    np.testing.assert_array_equal(lin.b.grad.data, [1.0, 2.0])  # d sum(y * scale) / db = scale
    # an op's output, part of a graph, is refused with what to pass instead
    doubled = Variable(np.ones(2, np.float32)) * 2
    with pytest.raises(ValueError, match=r"register_buffer\('doubled'\): the Variable was "
                                         r"computed by mul.*pass data\.detach\(\)"):
        lin.register_buffer("doubled", doubled)
    lin.register_buffer("doubled", doubled.detach())
    assert [n for n, _ in lin.named_buffers()] == ["scale", "doubled"]


def test_a_parameter_or_module_assigned_over_a_buffer_takes_its_place_and_its_kind():
    m = Counter()
    m.register_buffer("steps", np.zeros(1))
    m.count = Parameter(np.ones(1))  # a buffer becomes a parameter, where it was
    assert [n for n, _ in m.named_parameters()] == ["w", "count"]
    assert [n for n, _ in m.named_buffers()] == ["steps"]
    assert list(m.state_dict()) == ["w", "count", "steps"]
    m.steps = Variable(np.ones(1))  # a plain Variable replaces a buffer: still a buffer
    assert [n for n, _ in m.named_buffers()] == ["steps"] and m.steps.data[0] == 1.0
    m.steps = nn.Linear(1, 1)
    assert list(m.named_buffers()) == [] and list(m.named_children()) == [("steps", m.steps)]
    with pytest.raises(TypeError, match="holds a parameter"):
        m.count = Variable(np.ones(1))  # a parameter now: a plain Variable is refused


# =============================================================================== loading values
class Codes(nn.Module):
    """An int8 buffer and a float16 parameter: dtypes narrower than most sources."""

    def __init__(self):
        super().__init__()
        self.register_buffer("codes", np.zeros(3, np.int8))
        self.scale = Parameter(np.ones(2, np.float16))


class Wide(nn.Module):
    """Codes' names in int64 and float64, holding values Codes' dtypes cannot."""

    def __init__(self, codes, scale):
        super().__init__()
        self.register_buffer("codes", np.array(codes, np.int64))
        self.scale = Parameter(np.array(scale, np.float64))


def test_values_that_do_not_fit_the_target_dtype_are_refused_before_any_load(tmp_path):
    model = Codes()
    with pytest.raises(ValueError, match=r"codes: int64 value 300 in the state \(and 1 more\) "
                       r"does not fit the model's int8 \(-128 to 127\)"):
        model.load_state_dict({"codes": np.array([1, 300, -200]), "scale": np.ones(2)})
    with pytest.raises(ValueError, match=r"scale: float64 value 100000.0 in the state does not "
                       r"fit the model's float16"):
        model.load_state_dict({"codes": np.array([1, 2, 3]), "scale": np.array([1.0, 1e5])})
    path = Wide([1, 300, -200], [1.0, 1e5]).save(tmp_path / "wide")
    with pytest.raises(nn.CheckpointError, match=r"wide\.npz does not match Codes: codes: int64 "
                       r"value 300 in the file .*; scale: float64 value 100000\.0 in the file"):
        model.load(path)
    assert model.codes.data.tolist() == [0, 0, 0] and model.scale.data.tolist() == [1.0, 1.0]
    # values that fit load, narrowed; inf and nan stay what they are
    model.load(Wide([1, 127, -128], [np.inf, 65504.0]).save(tmp_path / "fits"))
    assert model.codes.data.tolist() == [1, 127, -128]
    assert model.scale.data.tolist() == [np.inf, 65504.0]


def test_integers_and_booleans_where_floats_belong_are_refused(tmp_path):
    model = nn.Linear(2, in_size=2)
    before = model.W.data.copy(), model.b.data.copy()
    state = {"W": np.array([[1, 2], [3, 4]]), "b": np.array([True, False])}
    with pytest.raises(ValueError, match=r"W: holds int64 values in the state where the model's "
                       r"float32 takes floating point ones.*b: holds bool values"):
        model.load_state_dict(state)
    path = str(tmp_path / "ints.npz")
    np.savez(path, **{nn.FORMAT_KEY: np.asarray(nn.FORMAT_VERSION)}, **state)
    with pytest.raises(nn.CheckpointError, match=r"W: holds int64 values in the file"):
        model.load(path)
    np.testing.assert_array_equal(model.W.data, before[0])
    np.testing.assert_array_equal(model.b.data, before[1])
    lazy = nn.Linear(2)  # a lazy parameter of a layer's dtype (float32) too
    with pytest.raises(ValueError, match=r"b: holds int64 values in the state"):
        lazy.load_state_dict({"W": np.ones((3, 2), np.float32), "b": np.array([1, 2])})
    assert lazy.W.data is None and lazy.b.data is None


def test_load_with_a_sha256_reads_the_file_it_hashed(tmp_path, monkeypatch):
    old, new = nn.Linear(2, in_size=2), nn.Linear(2, in_size=2)
    old.W.data[...], new.W.data[...] = 1.0, 7.0
    path = old.save(tmp_path / "ckpt")
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    sha256 = hashlib.sha256

    class SavedOverOnceHashed:
        """hashlib.sha256 whose digest, once taken, lets another process save over `path`."""

        def __init__(self):
            self.digest = sha256()

        def update(self, data):
            self.digest.update(data)

        def hexdigest(self):
            new.save(path)  # an atomic rename: a new file under the name
            return self.digest.hexdigest()

    monkeypatch.setattr(download.hashlib, "sha256", SavedOverOnceHashed)
    model = nn.Linear(2, in_size=2)
    model.load(path, sha256=digest)
    assert model.W.data.tolist() == [[1.0, 1.0], [1.0, 1.0]]  # the file with this SHA-256


def test_save_takes_a_bytes_path_as_load_does(tmp_path):
    model = nn.Linear(2, in_size=2)
    path = model.save(bytes(tmp_path / "ckpt"))
    assert path == str(tmp_path / "ckpt.npz")
    fresh = nn.Linear(2, in_size=2)
    fresh.load(bytes(tmp_path / "ckpt"))
    np.testing.assert_array_equal(fresh.W.data, model.W.data)


def test_load_state_dict_takes_numpy_load_of_a_checkpoint(tmp_path):
    model = nn.Linear(2, in_size=3)
    path = model.save(tmp_path / "ckpt")
    fresh = nn.Linear(2, in_size=3)
    with np.load(path) as archive:
        assert fresh.load_state_dict(archive) == ([], [])
    np.testing.assert_array_equal(fresh.W.data, model.W.data)
    with np.load(path) as archive:
        skipped = nn.Linear(2).load_state_dict(archive, strict=False)
    assert skipped == ([], [])


def test_a_lazy_model_moved_to_a_device_builds_there_and_refuses_an_input_left_elsewhere():
    """As PyTorch's lazy modules: the first call does not undo the move without a word."""
    device = str(DEVICE1)

    def model():
        return nn.Sequential(nn.Linear(4), nn.BatchNorm(), nn.Linear(2), nn.LSTM(3)).to(device)

    m = model()
    with pytest.raises(TypeError, match=(
            rf"^Linear: the model was moved to {device} \(with \.to\(\)\), and its input is "
            rf"on cpu: move the input to the model's device \(x\.to\('{device}'\)\) or the "
            r"model to the input's \(model\.to\('cpu'\)\) first$")):
        m(np.ones((2, 6), np.float32))
    assert str(m[3].h2f.W.device) == device  # the LSTM's eager weights stayed
    assert m[0].W.data is None  # refused before any weight was made
    # another device of the same library: the model's device named, not only the op's advice
    with pytest.raises(ValueError, match=(
            rf"^Linear: the model was moved to {device} \(with \.to\(\)\), and its input is "
            rf"on {DEVICE2}: move the input to the model's device \(x\.to\('{device}'\)\) or "
            rf"the model to the input's \(model\.to\('{DEVICE2}'\)\) first$")):
        m(STRICT.asarray(np.ones((2, 6), np.float32), device=DEVICE2))
    assert m[0].W.data is None
    conv = nn.Conv2d(4, 3, pad=1).to(device)
    with pytest.raises(ValueError, match=f"^Conv2d: the model was moved to {device}"):
        conv(STRICT.asarray(np.ones((1, 2, 5, 5), np.float32), device=DEVICE2))
    bn = nn.BatchNorm().to(device)
    with pytest.raises(ValueError, match=f"^BatchNorm: the model was moved to {device}"):
        bn(STRICT.asarray(np.ones((2, 3), np.float32), device=DEVICE2))
    assert conv.W.data is None and bn.avg_mean.data is None
    # a device named without its index, as "cuda" (the current GPU): the one its arrays land on
    lin = nn.Linear(2).to("array_api_strict")
    assert str(lin(STRICT.asarray(np.ones((1, 3), np.float32))).device) == str(lin.W.device)
    with pytest.raises(ValueError, match=f"moved to array_api_strict .*input is on {DEVICE1}"):
        nn.Linear(2).to("array_api_strict")(STRICT.asarray(np.ones((1, 3)), device=DEVICE1))
    m = model()
    y = m(STRICT.asarray(np.ones((2, 6), np.float32), device=DEVICE1))
    assert str(y.device) == device
    assert {str(p.device) for p in m.parameters()} == {device}
    assert str(m[1].avg_mean.device) == device
