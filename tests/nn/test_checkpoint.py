"""state_dict / load_state_dict and .npz checkpoints (save / load): round trips across devices,
and every bad file refused with the model left as it was."""
import numpy as np
import pytest

import gradcore.functions as F
import gradcore.nn as nn
from conftest import DEVICE1, STRICT


class ConvNet(nn.Module):
    """Conv -> BatchNorm -> relu -> Linear: parameters and buffers, all lazy."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, pad=1)
        self.bn = nn.BatchNorm()
        self.fc = nn.Linear(2)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        return self.fc(F.reshape(h, (len(h), -1)))


def built(seed, device=None):
    np.random.seed(seed)
    model = ConvNet()
    x = np.random.default_rng(seed).standard_normal((4, 1, 3, 3)).astype(np.float32)
    model(x)  # lazy parameters; BatchNorm's running stats move away from 0 and 1
    if device is not None:
        model.to(device)
    return model


def snapshot(model):
    return {name: np.array(STRICT.to_numpy(a) if not isinstance(a, np.ndarray) else a)
            for name, a in model.state_dict().items()}


def variables(model):
    return list(model.parameters()) + list(model.buffers())


def assert_same(a, b):
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


# =============================================================================== state_dict
def test_state_dict_names_order_and_buffers():
    model = built(0)
    state = model.state_dict()
    assert list(state) == ["conv.W", "conv.b", "bn.avg_mean", "bn.avg_var", "bn.gamma", "bn.beta",
                           "fc.W", "fc.b"]
    assert state["conv.W"] is model.conv.W.data  # the arrays themselves
    assert [n for n, _ in model.named_buffers()] == ["bn.avg_mean", "bn.avg_var"]
    assert not np.allclose(state["bn.avg_mean"], 0.0)  # updated by the forward


def test_load_state_dict_copies_and_converts_dtype():
    source, target = built(0), built(1)
    state = {k: np.asarray(v, dtype=np.float64) for k, v in source.state_dict().items()}
    target.load_state_dict(state)
    assert target.conv.W.dtype == np.float32  # the parameter's own dtype
    assert_same(snapshot(target), snapshot(source))
    state["conv.W"][...] = 5.0  # the model holds copies
    assert not np.any(target.conv.W.data == 5.0)


@pytest.mark.parametrize("src_device, dst_device", [(None, DEVICE1), (DEVICE1, None)],
                         ids=["numpy-to-device1", "device1-to-numpy"])
def test_save_load_round_trip_across_devices(tmp_path, src_device, dst_device):
    source = built(0, src_device)
    target = built(1, dst_device)
    expected = snapshot(source)
    path = source.save(tmp_path / "model")
    assert path == str(tmp_path / "model.npz")
    # saving went through the host and left the model where it was
    assert all(v.device == (src_device or "cpu") for v in variables(source))
    target.load(tmp_path / "model")  # ".npz" found without being named
    assert_same(snapshot(target), expected)
    for v in variables(target):
        assert v.device == (dst_device or "cpu")
    x = np.random.default_rng(2).standard_normal((3, 1, 3, 3)).astype(np.float32)
    ys = []
    for model, device in ((source, src_device), (target, dst_device)):
        xd = x if device is None else STRICT.asarray(x, device=device)
        ys.append(model.eval()(xd).numpy())
    np.testing.assert_array_equal(ys[0], ys[1])


def test_dezero_names_and_a_lazy_model(tmp_path):
    source = nn.MLP((4, 2))
    x = np.ones((3, 5), dtype=np.float32)
    y = source(x)
    source.save_weights(str(tmp_path / "w.npz"))
    fresh = nn.MLP((4, 2))  # never called: its parameters have no data yet
    with pytest.raises(ValueError, match=r"l0\.W, l0\.b, l1\.W, l1\.b not initialised.*forward"):
        fresh.save(tmp_path / "lazy.npz")
    fresh.load_weights(str(tmp_path / "w.npz"))  # DeZero's pattern: load, then use
    np.testing.assert_array_equal(fresh(x).data, y.data)
    assert fresh.l0.W.dtype == np.float32


def test_lazy_slots_load_onto_the_device_of_the_last_to(tmp_path):
    source = nn.MLP((4, 2))
    source(np.ones((3, 5), dtype=np.float32))
    source.save(tmp_path / "w.npz")
    fresh = nn.MLP((4, 2)).to(DEVICE1)
    fresh.load(tmp_path / "w.npz")
    assert all(p.device == DEVICE1 for p in fresh.parameters())
    assert fresh(STRICT.asarray(np.ones((3, 5), np.float32), device=DEVICE1)).device == DEVICE1


# =============================================================================== bad input
def test_missing_extra_and_misshapen_keys_are_listed_and_nothing_changes():
    model = built(0)
    before = snapshot(model)
    good = {k: v + 1.0 for k, v in built(1).state_dict().items()}

    missing = dict(good)
    del missing["bn.gamma"], missing["fc.b"]
    with pytest.raises(ValueError, match=r"missing from the state: bn\.gamma, fc\.b.*Nothing was"):
        model.load_state_dict(missing)
    extra = dict(good, **{"fc.V": np.ones(2)})
    with pytest.raises(ValueError, match=r"not in the model: fc\.V"):
        model.load_state_dict(extra)
    wrong = dict(good, **{"fc.W": np.ones((7, 2))})
    with pytest.raises(ValueError, match=r"fc\.W: shape \(7, 2\) in the state, \(18, 2\) in the"):
        model.load_state_dict(wrong)
    text = dict(good, **{"conv.b": np.array(["a", "b", "c"])})
    with pytest.raises(ValueError, match=r"conv\.b: holds <U1 values, not numbers"):
        model.load_state_dict(text)
    with pytest.raises(TypeError, match="mapping"):
        model.load_state_dict([("conv.W", 1)])
    assert_same(snapshot(model), before)


def test_strict_false_skips_and_reports():
    model = built(0)
    state = dict(built(1).state_dict())
    del state["conv.W"]
    state["extra"] = np.ones(1)
    result = model.load_state_dict(state, strict=False)
    assert result.missing_keys == ["conv.W"] and result.unexpected_keys == ["extra"]
    np.testing.assert_array_equal(model.fc.W.data, state["fc.W"])
    with pytest.raises(ValueError, match="shape"):  # shapes are checked even then
        model.load_state_dict({"conv.b": np.ones(9)}, strict=False)


def test_file_errors_leave_the_model_unchanged(tmp_path):
    model = built(0)
    before = snapshot(model)
    model.save(tmp_path / "good.npz")
    state = dict(np.load(tmp_path / "good.npz"))

    np.savez(tmp_path / "plain.npz", **{k: v for k, v in state.items() if k != "__gradcore__"})
    with pytest.raises(ValueError, match=r"not a gradcore checkpoint: it has no '__gradcore__'"):
        model.load(tmp_path / "plain.npz")

    (tmp_path / "text.npz").write_text("hello, not an archive")
    with pytest.raises(ValueError, match="not a gradcore checkpoint: NumPy cannot read it"):
        model.load(tmp_path / "text.npz")

    np.save(tmp_path / "single.npy", np.ones(3))
    with pytest.raises(ValueError, match=r"single array \(\.npy\)"):
        model.load(tmp_path / "single.npy")

    np.savez(tmp_path / "future.npz", **dict(state, __gradcore__=np.asarray(99)))
    with pytest.raises(ValueError, match="version 99 gradcore checkpoint.*upgrade"):
        model.load(tmp_path / "future.npz")

    np.savez(tmp_path / "short.npz", **{k: v for k, v in state.items() if k != "bn.beta"})
    with pytest.raises(ValueError, match=r"missing from the state: bn\.beta"):
        model.load(tmp_path / "short.npz")

    np.savez(tmp_path / "shape.npz", **dict(state, **{"conv.W": np.ones((1, 1, 1, 1))}))
    with pytest.raises(ValueError, match=r"conv\.W: shape \(1, 1, 1, 1\)"):
        model.load(tmp_path / "shape.npz")

    with pytest.raises(FileNotFoundError):
        model.load(tmp_path / "absent.npz")
    assert_same(snapshot(model), before)


UNPICKLED = []


def _record_unpickling():
    UNPICKLED.append(True)
    return 0


class Payload:
    """Unpickling this object would call _record_unpickling: it must never happen."""

    def __reduce__(self):
        return _record_unpickling, ()


def test_a_pickle_bearing_npz_is_refused_without_unpickling(tmp_path):
    model = built(0)
    before = snapshot(model)
    state = {k: np.asarray(v) for k, v in model.state_dict().items()}
    objects = np.array([Payload(), Payload()], dtype=object)
    np.savez(tmp_path / "pickled.npz", **dict(state, __gradcore__=np.asarray(1),
                                              **{"conv.b": objects}))
    np.savez(tmp_path / "extra_pickle.npz", **dict(state, __gradcore__=np.asarray(1),
                                                   payload=objects))
    for name in ("pickled.npz", "extra_pickle.npz"):
        with pytest.raises(ValueError, match="cannot be read without pickle.*refused"):
            model.load(tmp_path / name)
    assert UNPICKLED == []
    assert_same(snapshot(model), before)


def test_save_replaces_a_file_whole(tmp_path):
    model = built(0)
    path = tmp_path / "m.npz"
    path.write_text("old")
    model.save(path)
    assert sorted(np.load(path).files) == sorted(["__gradcore__"] + list(model.state_dict()))
    assert [p.name for p in tmp_path.iterdir()] == ["m.npz"]  # no partial file left behind
