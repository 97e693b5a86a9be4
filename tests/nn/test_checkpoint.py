"""state_dict / load_state_dict and .npz checkpoints (save / load): round trips across devices,
and every bad file refused with the model left as it was."""
import contextlib
import hashlib
import io
import os
import pathlib
import re
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import warnings
import zipfile

import numpy as np
import pytest

import gradcore
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


def test_save_and_load_take_file_objects_as_numpy_savez_does(tmp_path):
    source, target = built(0), built(1)
    expected = snapshot(source)
    buffer = io.BytesIO()
    assert source.save(buffer) is buffer and not buffer.closed
    path = source.save(tmp_path / "model")
    assert buffer.getvalue() == pathlib.Path(path).read_bytes()  # the file save writes
    buffer.seek(0)
    target.load(buffer)
    assert_same(snapshot(target), expected)
    assert_same(nn.read_checkpoint(io.BytesIO(buffer.getvalue())), expected)
    # an open file: checked as its path is, its SHA-256 too, and left open
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    with open(path, "rb") as f:
        built(2).load(f, sha256=digest)
        assert not f.closed
        f.seek(0)
        with pytest.raises(nn.CheckpointError, match=f"{re.escape(path)}: its SHA-256 is "
                                                     f"{digest}, not 0+: a different"):
            built(2).load(f, sha256="0" * 64)
    with pytest.raises(nn.CheckpointError, match="the BytesIO given is not a gradcore checkpoint"):
        target.load(io.BytesIO(b"PK not a zip archive"))
    with pytest.raises(TypeError, match=r"from the RawIOBase given: it cannot seek.*io\.BytesIO"):
        target.load(io.RawIOBase())
    assert_same(snapshot(target), expected)


def test_a_file_object_is_read_from_where_it_is_and_left_after_the_checkpoint():
    source = built(0)
    one = io.BytesIO()
    source.save(one)
    size = len(one.getvalue())
    stream = io.BytesIO(b"head" + one.getvalue() + b"tail")
    stream.seek(4)
    target = built(1)
    target.load(stream)
    assert_same(snapshot(target), snapshot(source))
    assert stream.tell() == 4 + size and stream.read() == b"tail"
    stream.seek(4)
    assert_same(nn.read_checkpoint(stream), snapshot(source))
    assert stream.tell() == 4 + size


def test_two_checkpoints_in_one_stream_are_refused_not_read_as_the_last(tmp_path):
    # zipfile finds the directory at the end of a stream: the second checkpoint's
    first, second, target = built(0), built(1), built(2)
    stream = io.BytesIO()
    first.save(stream)
    size = stream.tell()
    second.save(stream)
    stream.seek(0)
    before = snapshot(target)
    message = (rf"the BytesIO given is not one whole checkpoint from byte 0, where reading "
               rf"began: the zip archive found begins at byte {size} \(another archive")
    for load in (target.load, nn.read_checkpoint):
        with pytest.raises(nn.CheckpointError, match=message):
            load(stream)
        assert stream.tell() == 0
    assert_same(snapshot(target), before)
    # a file with bytes before its archive is no whole checkpoint either
    path = tmp_path / "prefixed.npz"
    path.write_bytes(b"junk" + stream.getvalue()[:size])
    with pytest.raises(nn.CheckpointError, match="begins at byte 4"):
        target.load(path)
    assert_same(snapshot(target), before)

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


def test_lazy_slots_take_the_layers_dtype_not_the_files(tmp_path):
    def three_layers(dtype=None):
        return nn.Sequential(nn.Linear(4, dtype=dtype), nn.BatchNorm(dtype=dtype),
                             nn.Linear(2, in_size=4, dtype=dtype))

    source = three_layers("float64")
    source(np.random.default_rng(0).standard_normal((5, 3)))
    path = source.save(tmp_path / "f64")
    fresh = three_layers()  # float32 layers: the lazy ones as well as the eager one
    fresh.load(path)
    assert {str(a.dtype) for a in fresh.state_dict().values()} == {"float32"}
    assert fresh(np.ones((2, 3), np.float32)).dtype == np.float32
    wide = three_layers().to(dtype="float64")  # the last to() decides over the layer's dtype
    wide.load(path)
    assert {str(a.dtype) for a in wide.state_dict().values()} == {"float64"}

    lazy = nn.Linear(2)
    lazy.load_state_dict({"W": np.full((3, 2), 5.0, np.float32), "b": np.array([1.0, 2.0])})
    assert lazy.b.dtype == np.float32 and lazy.b.data.tolist() == [1.0, 2.0]


class Lazy(nn.Module):
    """Two lazy parameters and a lazy buffer in a module that declares no dtype."""

    def __init__(self):
        super().__init__()
        self.w = gradcore.Parameter(None)
        self.s = gradcore.Parameter(None)
        self.register_buffer("steps")


def test_integers_for_a_lazy_parameter_of_no_declared_dtype_are_refused_before_any_load(
        tmp_path):
    model = Lazy()
    state = {"w": np.ones(2), "s": np.array([1, 2]), "steps": np.asarray(3)}
    with pytest.raises(ValueError, match=r"s: holds int64 values in the state.* must be floating "
                       r"point.*to\(dtype=...\)\. Nothing was loaded"):
        model.load_state_dict(state)
    path = str(tmp_path / "ints.npz")
    np.savez(path, **{nn.FORMAT_KEY: np.asarray(nn.FORMAT_VERSION)}, **state)
    with pytest.raises(nn.CheckpointError, match="s: holds int64 values in the file"):
        model.load(path)
    assert model.w.data is None and model.s.data is None and model.steps.data is None
    model.load_state_dict(dict(state, s=np.ones(2, np.float16)))  # else the values' own dtype
    assert (model.w.dtype, model.s.dtype, model.steps.dtype) == (np.float64, np.float16, np.int64)


def lazy_slots_are_empty(model):
    return all(v.data is None for v in variables(model))


def test_a_lazy_model_refuses_a_file_of_other_sizes_before_any_load(tmp_path):
    x = np.ones((2, 5), np.float32)
    three = nn.MLP((4, 3))
    three(x)
    path = three.save(tmp_path / "three_classes")
    lazy = nn.MLP((4, 2))  # never called, but it knows out_size 2
    with pytest.raises(nn.CheckpointError, match=r"l1\.W: shape \(4, 3\) in the file, \(\?, 2\) "
                       r"in the model \(a Linear not built yet: \? is learnt from its first "
                       r"input\); l1\.b: shape \(3,\) in the file, \(2,\) in the model\. Nothing"):
        lazy.load(path)
    assert lazy_slots_are_empty(lazy)

    conv5 = nn.Conv2d(8, kernel_size=5)
    conv5(np.zeros((1, 1, 9, 9), np.float32))
    path = conv5.save(tmp_path / "conv5")
    conv3 = nn.Conv2d(8, kernel_size=3)
    with pytest.raises(nn.CheckpointError, match=r"W: shape \(8, 1, 5, 5\) in the file, "
                       r"\(8, \?, 3, 3\) in the model"):
        conv3.load(path)
    assert lazy_slots_are_empty(conv3)
    deconv = nn.Deconv2d(4, 3)  # W is (C, out_channels, KH, KW): C is the first axis
    with pytest.raises(ValueError, match=r"W: shape \(2, 5, 3, 3\) in the state, "
                       r"\(\?, 4, 3, 3\) in the model"):
        deconv.load_state_dict({"W": np.zeros((2, 5, 3, 3)), "b": np.zeros(4)})
    deconv.load_state_dict({"W": np.zeros((2, 4, 3, 3)), "b": np.zeros(4)})
    assert deconv(np.ones((1, 2, 4, 4), np.float32)).shape == (1, 4, 6, 6)

    # W and b that disagree with each other: the in-size is free, b must match out_size
    path = str(tmp_path / "bad.npz")
    np.savez(path, **{nn.FORMAT_KEY: np.asarray(nn.FORMAT_VERSION)},
             W=np.zeros((5, 4), np.float32), b=np.zeros(7, np.float32))
    linear = nn.Linear(4)
    with pytest.raises(nn.CheckpointError, match=r"b: shape \(7,\) in the file, \(4,\) in the "
                       r"model\. Nothing was loaded"):
        linear.load(path)
    assert lazy_slots_are_empty(linear)


def test_a_lazy_layers_learnt_size_must_be_one_size_across_its_entries(tmp_path):
    state = {"avg_mean": np.zeros(3), "avg_var": np.ones(3), "gamma": np.ones(5),
             "beta": np.zeros(3)}
    bn = nn.BatchNorm()
    with pytest.raises(ValueError, match=r"avg_mean \(3,\) in the state, .*gamma \(5,\) in the "
                       r"state.*: the BatchNorm learns one size from its input .* must agree"):
        bn.load_state_dict(state)
    path = str(tmp_path / "bn.npz")
    np.savez(path, **{nn.FORMAT_KEY: np.asarray(nn.FORMAT_VERSION)}, **state)
    with pytest.raises(nn.CheckpointError, match=r"gamma \(5,\) in the file"):
        bn.load(path)
    assert lazy_slots_are_empty(bn)
    # a slot made lazy again must agree with those still filled
    bn(np.ones((2, 3), np.float32))
    bn.avg_mean.data = None
    with pytest.raises(ValueError, match=r"avg_mean \(5,\) in the state, avg_var \(3,\) in "
                       r"the model"):
        bn.load_state_dict({"avg_mean": np.zeros(5)}, strict=False)
    bn.load_state_dict({"avg_mean": np.zeros(3)}, strict=False)
    # Linear learns its in-size from W alone: any W of the right out_size loads
    linear = nn.Linear(2)
    linear.load_state_dict({"W": np.ones((7, 2)), "b": np.zeros(2)})
    assert linear(np.ones((1, 7), np.float32)).shape == (1, 2)


@pytest.mark.parametrize("make, x", [
    (lambda: nn.Linear(3, nobias=True), (2, 5)),
    (lambda: nn.Conv2d(4, kernel_size=(3, 2), pad=1), (1, 2, 5, 5)),
    (lambda: nn.Deconv2d(4, kernel_size=3, stride=2), (1, 2, 3, 3)),
    (lambda: nn.BatchNorm(), (4, 3, 2, 2)),
    (lambda: nn.RNN(3), (2, 5)),
    (lambda: nn.LSTM(3), (2, 5)),
], ids=["linear", "conv", "deconv", "batchnorm", "rnn", "lstm"])
def test_a_lazy_layer_loads_what_the_same_layer_built(make, x):
    """The shapes a layer declares for its lazy slots are those it creates."""
    source = make()
    for _ in range(2):  # an RNN makes h2h at its second step
        source(np.ones(x, np.float32))
    fresh = make()
    fresh.load_state_dict(source.state_dict())
    assert_same(snapshot(fresh), snapshot(source))


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
    with pytest.raises(ValueError, match=r"conv\.b: holds <U1 values, not real numbers"):
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


# =============================================================================== mismatches
def npy_bytes(a):
    """The .npy file of the array `a`, as bytes (object arrays pickled, as NumPy would)."""
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.asanyarray(a), allow_pickle=True)
    return buffer.getvalue()


def write_zip(path, entries, compression=zipfile.ZIP_STORED):
    """A zip archive at `path` holding `entries`, (name, bytes or an array stored as .npy)
    pairs, in their order; a name given twice is written twice."""
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w", compression=compression) as zf:
        warnings.simplefilter("ignore")  # zipfile warns about a duplicate name
        for name, value in entries:
            zf.writestr(name, value if isinstance(value, bytes) else npy_bytes(value))


def checkpoint_entries(model, **replaced):
    """The (name, array) entries a checkpoint of `model` holds, "conv.W.npy" style, with
    `replaced` (name -> array, or None to drop the entry; "__gradcore__" is the marker)."""
    entries = {name: np.asarray(a) for name, a in model.state_dict().items()}
    entries["__gradcore__"] = np.asarray(1)
    entries.update(replaced)
    return [(name + ".npy", a) for name, a in entries.items() if a is not None]


class Stepper(nn.Module):
    """A float32 parameter and an integer buffer."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(np.ones(2, np.float32))
        self.register_buffer("steps", np.zeros((), np.int64))


def test_a_file_that_does_not_match_the_model_is_refused_and_nothing_changes(tmp_path):
    model = built(0)
    before = snapshot(model)
    cases = [
        ({"bn.beta": None}, r"missing from the file: bn\.beta"),
        ({"fc.V": np.ones(2)}, r"not in the model: fc\.V"),
        ({"conv.W": np.ones((1, 1, 1, 1), np.float32)},
         r"conv\.W: shape \(1, 1, 1, 1\) in the file, \(2, 1, 3, 3\) in the model"),
    ]
    for replaced, match in cases:
        path = tmp_path / "bad.npz"
        write_zip(path, checkpoint_entries(model, **replaced), zipfile.ZIP_DEFLATED)
        with pytest.raises(nn.CheckpointError, match=match) as error:
            model.load(path)
        assert str(error.value).startswith(f"{path} does not match ConvNet: ")
        assert str(error.value).endswith("Nothing was loaded.")
    with pytest.raises(FileNotFoundError):  # not corruption: the error for a missing file
        model.load(tmp_path / "absent.npz")
    assert_same(snapshot(model), before)


def test_dtypes_convert_within_their_kind_only(tmp_path):
    model = Stepper()
    write_zip(tmp_path / "wider.npz", [("w.npy", np.full(2, 3.0)),  # float64 into float32
                                       ("steps.npy", np.asarray(7, np.int32)),
                                       ("__gradcore__.npy", np.asarray(1))])
    model.load(tmp_path / "wider.npz")
    assert model.w.dtype == np.float32 and model.steps.dtype == np.int64
    assert model.w.data.tolist() == [3.0, 3.0] and model.steps.data == 7

    write_zip(tmp_path / "float_steps.npz", [("w.npy", np.zeros(2)),
                                             ("steps.npy", np.asarray(7.5)),
                                             ("__gradcore__.npy", np.asarray(1))])
    with pytest.raises(nn.CheckpointError,
                       match=r"steps: float64 in the file does not convert to the model's int64"):
        model.load(tmp_path / "float_steps.npz")
    with pytest.raises(ValueError, match=r"steps: float64 in the state does not convert"):
        model.load_state_dict({"w": np.zeros(2), "steps": np.asarray(7.5)})
    assert model.w.data.tolist() == [3.0, 3.0] and model.steps.data == 7


@pytest.fixture
def read(monkeypatch):
    """The names of the .npy entries whose data NumPy reads, in order."""
    names = []
    read_array = np.lib.format.read_array

    def recording(f, *args, **kwargs):
        names.append(f.name)
        return read_array(f, *args, **kwargs)

    monkeypatch.setattr(np.lib.format, "read_array", recording)
    return names


def test_names_shapes_and_dtypes_are_checked_before_any_data_is_read(tmp_path, read):
    model = built(0)
    before = snapshot(model)
    for replaced in ({"conv.W": np.ones((1, 1, 1, 1), np.float32)}, {"bn.beta": None},
                     {"fc.V": np.ones(2)}, {"conv.b": np.zeros(3, np.complex64)}):
        path = tmp_path / "bad.npz"
        write_zip(path, checkpoint_entries(model, **replaced), zipfile.ZIP_DEFLATED)
        read.clear()
        with pytest.raises(nn.CheckpointError):
            model.load(path)
        assert set(read) <= {"__gradcore__.npy"}, read  # the marker (a few bytes), nothing else
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
        with pytest.raises(nn.CheckpointError, match="cannot be read without pickle.*refused"):
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


# =============================================================================== damaged files
HUGE = 400_000_000  # float64 values: 3.2 GB, declared by a file of a few kilobytes


def huge_npy():
    """An .npy header declaring HUGE float64 values, followed by 16 bytes of them."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f8", "fortran_order": False, "shape": (HUGE,)})
    return buffer.getvalue() + bytes(16)


def data_span(path, entry):
    """(offset, size) of the compressed bytes of `entry` in the zip file `path`."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(entry)
    local = path.read_bytes()[info.header_offset:info.header_offset + 30]
    name_size, extra_size = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + name_size + extra_size, info.compress_size


def flip_byte(path, entry, at=0.5):
    """Invert one byte of `entry`'s compressed data, `at` (a fraction) of the way through it."""
    offset, size = data_span(path, entry)
    raw = bytearray(path.read_bytes())
    raw[offset + int(size * at)] ^= 0xFF
    path.write_bytes(bytes(raw))


def declare_size(path, entry, size):
    """Rewrite the uncompressed size that the zip headers (local and central) declare for
    `entry`, as a forged file would (no zip64 fields: archives written by write_zip)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(entry)
    raw = bytearray(path.read_bytes())
    raw[info.header_offset + 22:info.header_offset + 26] = struct.pack("<I", size)
    name = entry.encode()
    record = raw.find(b"PK\x01\x02")
    while raw[record + 46:record + 46 + len(name)] != name:
        record = raw.find(b"PK\x01\x02", record + 1)
        assert record != -1
    raw[record + 24:record + 28] = struct.pack("<I", size)
    path.write_bytes(bytes(raw))


def cut(keep):
    """A maker writing the good checkpoint cut to `keep(size)` bytes."""
    return lambda path, good, model: path.write_bytes(good.read_bytes()[:keep(good.stat().st_size)])


def entries_with(compression=zipfile.ZIP_STORED, **replaced):
    """A maker writing the model's checkpoint with entries replaced (see checkpoint_entries)."""
    return lambda path, good, model: write_zip(path, checkpoint_entries(model, **replaced),
                                               compression)


def raw_entries(*extra, **replaced):
    """A maker like entries_with, plus `extra` (name, bytes) entries."""
    return lambda path, good, model: write_zip(
        path, checkpoint_entries(model, **replaced) + list(extra))


def forged_size(compression):
    """A maker: fc.W's .npy header declares HUGE values, and so do the zip headers."""
    def make(path, good, model):
        entries_with(compression, **{"fc.W": None})(path, good, model)
        with zipfile.ZipFile(path, "a", compression=compression) as zf:
            zf.writestr("fc.W.npy", huge_npy())
        declare_size(path, "fc.W.npy", len(huge_npy()) - 16 + HUGE * 8)
    return make


def flipped(path, good, model):
    path.write_bytes(good.read_bytes())
    flip_byte(path, "conv.W.npy")


def bad_npy(shape, data):
    """.npy bytes whose header says float32 `shape`, followed by `data`."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buffer.getvalue() + data


NOT_A_ZIP = r"not a gradcore checkpoint: it is not a readable \.npz \(zip\) archive"
DAMAGED = [  # (id, maker(path, good, model), what the message says)
    ("random-bytes", lambda p, g, m: p.write_bytes(np.random.default_rng(0).bytes(3000)),
     NOT_A_ZIP),
    ("empty", lambda p, g, m: p.write_bytes(b""), NOT_A_ZIP),
    ("text", lambda p, g, m: p.write_text("hello, not an archive"), NOT_A_ZIP),
    ("npy", lambda p, g, m: p.write_bytes(npy_bytes(np.ones(3))), r"single array \(\.npy\)"),
    ("cut-to-a-quarter", cut(lambda n: n // 4), NOT_A_ZIP),
    ("cut-in-half", cut(lambda n: n // 2), NOT_A_ZIP),
    ("cut-10-bytes-short", cut(lambda n: n - 10), NOT_A_ZIP),
    ("cut-1-byte-short", cut(lambda n: n - 1), NOT_A_ZIP),
    ("flipped-byte", flipped, r"entry 'conv\.W'.*damaged"),
    ("not-npy", raw_entries(("conv.W", b"raw bytes"), **{"conv.W": None}),
     r"entry 'conv\.W' is not an \.npy array"),
    ("object-array", entries_with(**{"conv.b": np.array([1, "x", None], dtype=object)}),
     r"entry 'conv\.b' holds object values, which cannot be read without pickle.*refused"),
    ("no-marker", entries_with(__gradcore__=None),
     r"not a gradcore checkpoint: it has no '__gradcore__' entry \(its entries: conv\.W, "),
    ("future-version", entries_with(__gradcore__=np.asarray(99)),
     r"version 99 gradcore checkpoint.*upgrade gradcore"),
    ("version-0", entries_with(__gradcore__=np.asarray(0)), "not a format version number"),
    ("float-marker", entries_with(__gradcore__=np.asarray(1.0)), "not a format version number"),
    ("marker-shape", entries_with(__gradcore__=np.asarray([1])), "not a format version number"),
    ("complex", entries_with(**{"conv.b": np.zeros(3, np.complex128)}),
     r"entry 'conv\.b' holds complex128 values, not real numbers"),
    ("strings", entries_with(**{"conv.b": np.array(["a", "b", "c"])}),
     r"entry 'conv\.b' holds <U1 values, not real numbers"),
    ("structured", entries_with(**{"conv.b": np.zeros(3, [("x", "f4"), ("y", "i4")])}),
     r"entry 'conv\.b' holds .* values, not real numbers"),
    ("duplicate", raw_entries(("conv.b.npy", npy_bytes(np.zeros(3, np.float32)))),
     r"entry 'conv\.b' appears twice"),
    ("extra-bytes", raw_entries(("conv.b.npy", bad_npy((3,), bytes(16))), **{"conv.b": None}),
     r"entry 'conv\.b': its \.npy header describes \(3,\) float32 values .*declares"),
    ("missing-bytes", raw_entries(("conv.b.npy", bad_npy((3,), bytes(8))), **{"conv.b": None}),
     r"entry 'conv\.b': its \.npy header describes \(3,\) float32 values .*declares"),
    ("negative-shape", raw_entries(("conv.b.npy", bad_npy((-1, -3), bytes(12))),
                                   **{"conv.b": None}),
     r"entry 'conv\.b': its \.npy header declares the shape \(-1, -3\)"),
    ("npy-version-9", raw_entries(("conv.b.npy", b"\x93NUMPY\x09\x00" + bytes(120)),
                                  **{"conv.b": None}),
     r"entry 'conv\.b': its \.npy header cannot be read"),
    ("not-npy-data", raw_entries(("conv.b.npy", b"PK\x03\x04 not an array at all"),
                                 **{"conv.b": None}),
     r"entry 'conv\.b': its \.npy header cannot be read"),
    ("bzip2", entries_with(zipfile.ZIP_BZIP2), "compression method 12"),
    ("huge-header", raw_entries(("fc.W.npy", huge_npy()), **{"fc.W": None}),
     r"entry 'fc\.W': its \.npy header describes \(400000000,\) float64 values"),
    ("huge-stored", forged_size(zipfile.ZIP_STORED), r"entry 'fc\.W'.*declares 3200000128 bytes"),
    ("huge-deflated", forged_size(zipfile.ZIP_DEFLATED),
     r"entry 'fc\.W'.*declares 3200000128 bytes"),
]


@pytest.mark.parametrize("make, match", [case[1:] for case in DAMAGED],
                         ids=[case[0] for case in DAMAGED])
def test_a_damaged_or_foreign_file_raises_checkpoint_error(tmp_path, make, match):
    model = built(0)
    before = snapshot(model)
    good = tmp_path / "good.npz"
    model.save(good)
    path = tmp_path / "bad.npz"
    make(path, good, model)
    def from_open_file(load):
        def loading(path):
            with open(path, "rb") as f:
                return load(f)
        return loading

    tracemalloc.start()
    try:
        # with a model and without, and from an open file (named by its path)
        for load in (model.load, nn.read_checkpoint, from_open_file(model.load)):
            with pytest.raises(nn.CheckpointError, match=match) as error:
                load(path)
            assert str(path) in str(error.value)
            assert "allow_pickle" not in str(error.value)  # NumPy's advice is not ours to give
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50e6  # the huge declarations were refused, not allocated
    assert_same(snapshot(model), before)


class Wide(nn.Module):
    """A small parameter, then a large one (its compressed data spans many zip blocks)."""

    def __init__(self, seed):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.a = nn.Parameter(rng.standard_normal(3))
        self.b = nn.Parameter(rng.standard_normal(20_000))


def test_damaged_data_in_the_last_entry_leaves_every_parameter_as_it_was(tmp_path, read):
    path = tmp_path / "m.npz"
    Wide(0).save(path)
    flip_byte(path, "b.npy", at=0.9)  # past its header: the headers read fine
    model = Wide(1)
    before = snapshot(model)
    with pytest.raises(nn.CheckpointError, match=r"entry 'b': its data is damaged"):
        model.load(path)
    assert "a.npy" in read and read[-1] == "b.npy"  # `a` was read: the failure came after it
    assert_same(snapshot(model), before)


def test_every_flipped_byte_and_every_cut_is_refused_or_loads_whole(tmp_path):
    source = nn.Linear(2, 1)  # a small checkpoint: every byte of it is tried
    good = tmp_path / "good.npz"
    source.save(good)
    raw = good.read_bytes()
    expected = snapshot(source)
    model = nn.Linear(2, 1)
    before = snapshot(model)
    path = tmp_path / "bad.npz"
    variants = [raw[:n] for n in range(len(raw))]
    variants += [raw[:i] + bytes([raw[i] ^ 0xFF]) + raw[i + 1:] for i in range(len(raw))]
    loaded = 0
    for data in variants:
        path.write_bytes(data)
        try:
            model.load(path)
        except nn.CheckpointError:
            assert_same(snapshot(model), before)
            continue
        assert_same(snapshot(model), expected)  # a byte nothing reads (a date, an attribute)
        model.load_state_dict(before)
        loaded += 1
    assert loaded < len(raw) // 2  # most flips are caught (about a third load: zip metadata)


# =============================================================================== saving
def saver(seed):
    """A model holding 20,000 random float64 values (its save takes a few milliseconds)."""
    model = nn.Module()
    model.w = nn.Parameter(np.random.default_rng(seed).standard_normal(20_000))
    return model


WRITER = """
import sys, threading, time
import numpy as np
import gradcore.nn as nn
path, seed = sys.argv[1], int(sys.argv[2])
model = nn.Module()
model.w = nn.Parameter(np.random.default_rng(seed).standard_normal(20_000))
print("ready", flush=True)
sys.stdin.readline()  # every writer starts at once
told = threading.Event()  # to stop: a line, or stdin closed (the test's communicate)
threading.Thread(target=lambda: (sys.stdin.readline(), told.set()), daemon=True).start()
model.save(path)
print("saving", flush=True)
deadline = time.monotonic() + 60  # a test that never says stop does not leave it running
while not told.is_set() and time.monotonic() < deadline:
    model.save(path)
"""


def read_until(path, expected, done):
    """Load `path` into a fresh model until `done(loads so far)`; each time, its values must be
    one of the `expected` arrays. Returns the number of loads."""
    reader = saver(3)
    loads = 0
    while not done(loads):
        reader.load(path)
        assert any(np.array_equal(reader.w.data, w) for w in expected), "a mixed checkpoint"
        loads += 1
    return loads


def test_concurrent_saves_from_threads_never_leave_a_broken_file(tmp_path):
    path = tmp_path / "m.npz"
    models = [saver(1), saver(2)]
    expected = [m.w.data for m in models]
    models[0].save(path)
    barrier = threading.Barrier(2)
    errors = []

    def save_rounds(model):
        try:
            for _ in range(50):
                barrier.wait()  # both saves of a round start together
                model.save(path)
        except BaseException as e:  # reported below, from the test's thread
            errors.append(e)
            barrier.abort()

    writers = [threading.Thread(target=save_rounds, args=(m,)) for m in models]
    for w in writers:
        w.start()
    try:
        loads = read_until(path, expected, lambda _: not any(w.is_alive() for w in writers))
    finally:
        for w in writers:
            w.join()
    assert errors == []
    assert loads > 0
    assert os.listdir(tmp_path) == ["m.npz"]  # no temporary file left behind


def test_concurrent_saves_from_processes_never_leave_a_broken_file(tmp_path):
    path = tmp_path / "m.npz"
    expected = [saver(1).w.data, saver(2).w.data]
    saver(1).save(path)
    root = os.path.dirname(os.path.dirname(os.path.abspath(gradcore.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(seed)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=root, env=env)
               for seed in (1, 2)]
    try:
        for w in writers:
            assert w.stdout.readline() == "ready\n", w.communicate()[1]
        for w in writers:
            w.stdin.write("go\n")
            w.stdin.flush()
        for w in writers:
            assert w.stdout.readline() == "saving\n", w.communicate()[1]
        # every load while both save, however late the reader runs: they stop when told
        loads = read_until(path, expected, lambda loads: loads == 200 or any(
            w.poll() is not None for w in writers))
        for w in writers:
            _, err = w.communicate(timeout=60)  # closes its stdin: the word to stop
            assert w.returncode == 0, err
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.communicate()
    assert loads == 200  # none of the writers stopped first (at its deadline)
    assert os.listdir(tmp_path) == ["m.npz"]


def test_save_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    model = built(0)
    path = tmp_path / "m.npz"
    model.save(path)
    created = tmp_path / "created"
    created.touch()  # the mode a new file gets here (0o666 less the umask)
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(created.stat().st_mode)
    for mode in (0o640, 0o600, 0o664):
        path.chmod(mode)
        model.save(path)
        assert stat.S_IMODE(path.stat().st_mode) == mode


def test_save_through_a_symlink_replaces_its_target(tmp_path):
    (tmp_path / "store").mkdir()
    target = tmp_path / "store" / "real.npz"
    built(0).save(target)
    link = tmp_path / "link.npz"
    link.symlink_to(os.path.join("store", "real.npz"))  # relative, as links often are
    other = built(1)
    assert other.save(link) == str(link)
    assert link.is_symlink() and os.readlink(link) == os.path.join("store", "real.npz")
    assert_same(nn.read_checkpoint(target), snapshot(other))
    assert sorted(os.listdir(tmp_path)) == ["link.npz", "store"]
    assert os.listdir(tmp_path / "store") == ["real.npz"]  # written beside the target


def test_a_failed_save_keeps_the_old_file_and_removes_its_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "m.npz"
    built(0).save(path)
    old = path.read_bytes()
    calls = []
    write_array = np.lib.format.write_array

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # not only Exceptions: Ctrl-C mid-save too
        return write_array(*args, **kwargs)

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(np.lib.format, "write_array", interrupted)
        with pytest.raises(KeyboardInterrupt):
            built(1).save(path)
    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", disk_full)
        with pytest.raises(OSError, match="No space left"):
            built(1).save(path)
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["m.npz"]


def test_saving_into_a_missing_folder_names_the_folder(tmp_path):
    folder = tmp_path / "not" / "there"
    with pytest.raises(FileNotFoundError) as error:
        built(0).save(folder / "m.npz")
    message = str(error.value)
    assert f"the folder {folder} does not exist" in message
    assert ".partial" not in message and ".tmp" not in message
    assert not (tmp_path / "not").exists()


PROTECTED = """
import os, sys
import gradcore.nn as nn
# made first: after the switch, modules imported lazily (numpy.random) may be out of reach
model = nn.Linear(2, in_size=3)
if os.geteuid() == 0:  # root may write any file: save as the user nobody instead
    try:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    except OSError:
        sys.exit("cannot run as the user nobody")
try:
    model.save("best.npz")
    print("saved")
except PermissionError as e:
    print(e)
"""


def test_a_write_protected_checkpoint_is_refused_and_left_as_it_was(tmp_path):
    # the rename needs only the folder to be writable: save checks the file first, as open()
    # and numpy.savez refuse it. Root saves as nobody, in a folder of /tmp (tmp_path's parents
    # are root's only)
    with tempfile.TemporaryDirectory() if os.geteuid() == 0 else contextlib.nullcontext(
            tmp_path) as folder:
        folder = pathlib.Path(folder)
        folder.chmod(0o777)  # writable for the saving user: only the file forbids
        path = folder / "best.npz"
        built(0).save(path)
        root = os.path.dirname(os.path.dirname(os.path.abspath(gradcore.__file__)))
        env = dict(os.environ,
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))

        def save_in_a_process():
            done = subprocess.run([sys.executable, "-c", PROTECTED], cwd=folder, env=env,
                                  capture_output=True, text=True, timeout=120)
            if "cannot run as the user nobody" in done.stderr:
                pytest.skip("running as root, and cannot switch to another user to be refused")
            assert done.returncode == 0, done.stderr
            return done.stdout.strip()

        path.chmod(0o444)
        old = path.read_bytes()
        assert save_in_a_process() == (
            "[Errno 13] save: best.npz is write-protected (mode 0o444); it was left as it was. "
            "Make it writable (chmod u+w) to replace it, or save under another name")
        assert path.read_bytes() == old and stat.S_IMODE(path.stat().st_mode) == 0o444
        assert os.listdir(folder) == ["best.npz"]  # refused before any temporary file
        path.chmod(0o666)  # writable by that user: replaced
        assert save_in_a_process() == "saved" and path.read_bytes() != old


@pytest.mark.parametrize("name", ["run_" + "x" * 236 + ".npz", "模" * 80 + ".npz", "m.npz",
                                  "y" * 90 + ".npz"],
                         ids=["244-ascii-bytes", "240-utf8-bytes", "short", "94-bytes"])
def test_any_name_the_file_system_takes_can_be_saved(tmp_path, name):
    path = tmp_path / name
    path.touch()  # the file system takes the name
    path.unlink()
    opened = []
    real_open = os.open

    def recording_open(file, *args, **kwargs):
        opened.append(os.path.basename(os.fsencode(file)))
        return real_open(file, *args, **kwargs)

    model = built(0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "open", recording_open)
        assert model.save(path) == str(path)
    assert_same(nn.read_checkpoint(path), snapshot(model))
    assert os.listdir(tmp_path) == [name]
    temporary = opened[-1]
    assert temporary.endswith(b".tmp") and len(temporary) <= max(len(os.fsencode(name)), 100)
    temporary.decode("utf-8")  # cut at a whole character
    if len(os.fsencode(name)) + 22 <= 100:
        assert temporary.startswith(b"." + os.fsencode(name) + b".")  # short names stay whole


def test_a_name_too_long_for_the_file_system_says_so(tmp_path):
    name = "z" * 300 + ".npz"
    with pytest.raises(OSError, match=r"its name is 304 bytes long, more than the file system "
                                      r"allows \(255 bytes on most\); choose a shorter name"):
        built(0).save(tmp_path / name)
    assert os.listdir(tmp_path) == []


def test_load_reads_the_file_that_save_wrote_under_the_same_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir("exp1")  # a run's folder beside its checkpoint
    model = built(0)
    assert model.save("exp1") == "exp1.npz"
    fresh = built(1)
    fresh.load("exp1")
    assert_same(snapshot(fresh), snapshot(model))
    assert_same(nn.read_checkpoint("exp1"), snapshot(model))

    built(1).save("plain.npz")
    os.rename("plain.npz", "plain")  # a checkpoint named without .npz, and no plain.npz
    assert_same(nn.read_checkpoint("plain"), snapshot(built(1)))

    built(1).save("model")
    os.rename("model.npz", "model")  # an old copy named "model"...
    model.save("model")  # ...and the checkpoint just saved, model.npz
    fresh = built(2)
    before = snapshot(fresh)
    for load in (fresh.load, nn.read_checkpoint):
        with pytest.raises(nn.CheckpointError, match=r"the checkpoint name 'model' is ambiguous: "
                                                     r"both model and model.npz are files"):
            load("model")
    assert_same(snapshot(fresh), before)
    fresh.load("model.npz")  # the full name decides
    assert_same(snapshot(fresh), snapshot(model))


# =============================================================================== DeZero's files
def dezero_weights(path, **arrays):
    """What dezero's Model.save_weights writes: np.savez_compressed of '/'-joined names, with no
    gradcore marker."""
    np.savez_compressed(path, **arrays)
    return path


def test_load_weights_reads_a_file_dezero_wrote(tmp_path):
    from gradcore import models
    W0, W1 = np.arange(12.0).reshape(3, 4) / 10, np.arange(8.0).reshape(4, 2) / 10
    path = dezero_weights(tmp_path / "dezero.npz", **{
        "l0/W": W0.astype(np.float32), "l0/b": np.ones(4, np.float32),
        "l1/W": W1, "l1/b": np.zeros(2)})  # float64 entries: converted to the model's float32
    model = models.MLP((4, 2))  # lazy: sized by the file, no forward pass first
    model.load_weights(path)
    np.testing.assert_array_equal(model.l0.W.data, W0.astype(np.float32))
    np.testing.assert_array_equal(model.l0.b.data, np.ones(4))
    np.testing.assert_allclose(model.l1.W.data, W1, rtol=1e-7)
    assert model.l1.W.dtype == np.float32
    x = np.ones((1, 3), np.float32)  # by hand: h = sigmoid(x @ W0 + 1), y = h @ W1
    h = 1 / (1 + np.exp(-(x @ W0 + 1)))
    np.testing.assert_allclose(model(x).data, h @ W1, rtol=1e-6)
    assert sorted(nn.read_checkpoint(path)) == ["l0.W", "l0.b", "l1.W", "l1.b"]
    # the arrays numpy.load reads from it load too, under DeZero's names
    model.load_state_dict(dict(np.load(path)))


def test_a_dezero_file_is_checked_as_a_gradcore_one(tmp_path):
    from gradcore import models
    model = models.MLP((4, 2))
    model(np.ones((1, 3), np.float32))
    before = snapshot(model)
    wrong = dezero_weights(tmp_path / "wrong.npz", **{
        "l0/W": np.zeros((5, 4), np.float32), "l0/b": np.zeros(4, np.float32),
        "l1/W": np.zeros((4, 2), np.int64), "l1/b": np.zeros(2, np.float32)})
    with pytest.raises(nn.CheckpointError, match=r"wrong\.npz does not match MLP: l0\.W: shape "
                       r"\(5, 4\) in the file, \(3, 4\) in the model.*l1\.W: .*int64.*Nothing "
                       r"was loaded"):
        model.load_weights(wrong)
    # DeZero saves a Parameter not made yet (a lazy layer never called) as a pickled None
    unmade = tmp_path / "unmade.npz"
    np.savez(unmade, **{"l0/W": np.array(None, dtype=object), "l0/b": np.zeros(4, np.float32)})
    with pytest.raises(nn.CheckpointError, match=r"entry 'l0/W' holds object values, which "
                       r"cannot be read without pickle"):
        model.load_weights(unmade)
    missing = dezero_weights(tmp_path / "missing.npz", **{"l0/W": np.zeros((3, 4), np.float32)})
    with pytest.raises(nn.CheckpointError, match=r"missing from the file: l0\.b, l1\.W, l1\.b"):
        model.load_weights(missing)
    assert_same(snapshot(model), before)


def test_a_foreign_file_names_both_formats_and_advice_that_works(tmp_path):
    from gradcore import models
    W = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    path = tmp_path / "torchish.npz"
    np.savez(path, **{"layer.0.weight": W, "layer.0.bias": np.zeros(4, np.float32)})
    model = models.MLP((4,))
    with pytest.raises(nn.CheckpointError, match=r"no '__gradcore__' entry \(its entries: "
                       r"layer\.0\.weight, layer\.0\.bias\), and those are not the names "
                       r"DeZero's save_weights writes .*numpy\.load\(path\) and pass "
                       r"load_state_dict a dict of them under the model's state_dict\(\) names"):
        model.load(path)
    f = np.load(path)  # the advice, followed
    model.load_state_dict({"l0.W": f["layer.0.weight"], "l0.b": f["layer.0.bias"]})
    np.testing.assert_array_equal(model.l0.W.data, W)


def test_load_state_dict_takes_a_slash_name_for_a_dotted_one_of_the_model():
    from gradcore import models
    model = models.MLP((2,))
    W = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    model.load_state_dict({"l0/W": W, "l0/b": np.ones(2, np.float32)})
    np.testing.assert_array_equal(model.l0.W.data, W)
    np.testing.assert_array_equal(model.l0.b.data, [1.0, 1.0])
    # not when the state has the model's own name too, nor for a name the model lacks
    with pytest.raises(ValueError, match=r"not in the model: l0/W, x/W\. Nothing was loaded"):
        model.load_state_dict({"l0.W": W, "l0.b": np.ones(2), "l0/W": W, "x/W": W})


CLASHING = {"l0/W": np.full((2, 2), 1.0, np.float32), "0.W": np.full((2, 2), 2.0, np.float32),
            "l0.b": np.zeros(2, np.float32)}  # "l0/W" and "0.W" are both the model's "l0.W"


def test_two_keys_of_a_state_taken_as_one_name_of_the_model_are_refused_naming_both():
    from gradcore import models
    model = models.MLP((2,))
    model(np.zeros((1, 2), np.float32))
    before = model.l0.W.data.copy()
    with pytest.raises(ValueError, match=r"load_state_dict into MLP: 'l0/W' and '0\.W' are both "
                                         r"taken as the model's 'l0\.W'; keep one of them\. "
                                         r"Nothing was loaded"):
        model.load_state_dict(CLASHING)
    np.testing.assert_array_equal(model.l0.W.data, before)


def test_two_entries_of_a_file_taken_as_one_name_of_the_model_are_refused_naming_both(tmp_path):
    from gradcore import models
    # nested numbered names, "0.0.W" and "l0.0.W", are both the model's "l0.l0.W"
    nested = models.Sequential(models.Sequential(nn.Linear(2, in_size=2)))
    before = nested.l0.l0.W.data.copy()
    path = tmp_path / "clash.npz"
    np.savez(path, **{nn.FORMAT_KEY: np.asarray(nn.FORMAT_VERSION), "0.0.W": CLASHING["l0/W"],
                      "l0.0.W": CLASHING["0.W"], "l0.l0.b": CLASHING["l0.b"]})
    with pytest.raises(nn.CheckpointError, match=r"'0\.0\.W' and 'l0\.0\.W' are both taken as "
                                                 r"the model's 'l0\.l0\.W'"):
        nested.load(path)
    np.testing.assert_array_equal(nested.l0.l0.W.data, before)


class SharedLayer(nn.Module):
    """One Linear under two names, as DeZero and PyTorch allow; b.W ties a Parameter too."""

    def __init__(self):
        super().__init__()
        self.l1 = self.l2 = nn.Linear(2, 2)
        self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)
        self.b.W = self.a.W


W_SHARED = np.arange(4, dtype=np.float32).reshape(2, 2)
# what DeZero's save_weights writes for SharedLayer: each name reaching a Parameter
SHARED_FILE = {"l1/W": W_SHARED, "l1/b": np.ones(2, np.float32), "l2/W": W_SHARED,
               "l2/b": np.ones(2, np.float32), "a/W": W_SHARED + 1, "a/b": np.zeros(2, np.float32),
               "b/W": W_SHARED + 1, "b/b": np.full(2, 2.0, np.float32)}


def test_a_dezero_file_of_a_layer_held_under_two_names_loads_once(tmp_path):
    model = SharedLayer()
    assert list(model.state_dict()) == ["l1.W", "l1.b", "a.W", "a.b", "b.b"]  # each once
    model.load_weights(dezero_weights(tmp_path / "shared.npz", **SHARED_FILE))
    assert model.l2 is model.l1 and model.b.W is model.a.W
    np.testing.assert_array_equal(model.l2.W.data, W_SHARED)
    np.testing.assert_array_equal(model.l1.b.data, [1.0, 1.0])
    np.testing.assert_array_equal(model.b.W.data, W_SHARED + 1)
    np.testing.assert_array_equal(model.b.b.data, [2.0, 2.0])
    # load_state_dict alike, with either name alone or both (PyTorch's state_dict keeps both)
    fresh = SharedLayer()
    fresh.load_state_dict({k.replace("/", "."): v * 2 for k, v in SHARED_FILE.items()})
    np.testing.assert_array_equal(fresh.l1.W.data, W_SHARED * 2)
    only_aliases = {"l2.W": W_SHARED, "l2.b": np.ones(2, np.float32), "a.b": np.zeros(2),
                    "b.W": W_SHARED + 1, "b.b": np.zeros(2)}  # l2.W and b.W fill l1.W and a.W
    assert fresh.load_state_dict(only_aliases) == ([], [])
    np.testing.assert_array_equal(fresh.l1.W.data, W_SHARED)
    np.testing.assert_array_equal(fresh.a.W.data, W_SHARED + 1)


def test_the_two_names_of_one_layer_holding_different_values_are_refused(tmp_path):
    model = SharedLayer()
    before = {name: v.copy() for name, v in model.state_dict().items()}
    unequal = dict(SHARED_FILE, **{"l2/W": W_SHARED + 5})
    message = (r"'l1(/|\.)W' and 'l2(/|\.)W' in the {} are one entry of the model, l1\.W \(a "
               r"module or Parameter it holds under two names\), but hold different values; "
               r"keep the one to load\. Nothing was loaded")
    with pytest.raises(nn.CheckpointError, match=message.format("file")):
        model.load_weights(dezero_weights(tmp_path / "unequal.npz", **unequal))
    with pytest.raises(ValueError, match=message.format("state")):
        model.load_state_dict(unequal)
    for name, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[name])


class SkipBlock(nn.Module):
    """A Linear, and the two blocks before it kept as attributes (skip connections)."""

    def __init__(self, prev=None, prev2=None):
        super().__init__()
        self.lin = nn.Linear(2, in_size=2)
        if prev is not None:
            self.prev = prev
        if prev2 is not None:
            self.prev2 = prev2


def test_a_model_of_blocks_holding_earlier_blocks_loads_an_alias_deep_in_it():
    """30 blocks, each holding the two before it, reach block 0 by about Fibonacci(30) = 832,040
    paths: a name in the state is followed one attribute at a time, not every path listed."""
    blocks = []
    for _ in range(30):
        blocks.append(SkipBlock(*reversed(blocks[-2:])))
    model = nn.Sequential(*blocks)
    state = model.state_dict()
    assert len(state) == 60  # each Linear once, under its first name
    W = np.arange(4, dtype=np.float32).reshape(2, 2)
    alias = "29.prev2.prev.prev2.prev.lin.W"  # 29 -> 27 -> 26 -> 24 -> 23
    del state["23.lin.W"]
    state[alias] = W
    start = time.perf_counter()
    assert model.load_state_dict(state) == ([], [])
    assert time.perf_counter() - start < 10  # a hang guard: milliseconds
    np.testing.assert_array_equal(model[23].lin.W.data, W)
    with pytest.raises(ValueError, match=r"'23\.lin\.W' and '29\.prev2\.prev\.prev2\.prev\.lin\.W'"
                                         r" in the state are one entry of the model, 23\.lin\.W"):
        model.load_state_dict(dict(state, **{"23.lin.W": W + 1}))
    assert model.load_state_dict({"1.prev.prev.lin.W": W}, strict=False).unexpected_keys == [
        "1.prev.prev.lin.W"]  # block 0 holds no earlier block


# =============================================================================== misuse
def test_a_file_object_is_left_where_it_was_when_a_check_after_reading_refuses_it(tmp_path):
    """Values that do not fit the model's dtype, the two names of a shared layer holding
    different values, or a failing load_state_dict: all refused while the archive is open."""
    source = nn.Linear(2, in_size=2)
    source.W.data[...] = 1e5  # inf in float16
    stream = io.BytesIO(b"head")
    stream.seek(4)
    source.save(stream)
    stream.seek(4)
    with pytest.raises(nn.CheckpointError, match=r"float32 value 100000\.0 in the file .* does "
                                                 r"not fit the model's float16"):
        nn.Linear(2, in_size=2, dtype=np.float16).load(stream)
    assert stream.tell() == 4
    path = dezero_weights(tmp_path / "unequal.npz", **dict(SHARED_FILE, **{"l2/W": W_SHARED + 5}))
    with open(path, "rb") as f:
        with pytest.raises(nn.CheckpointError, match="but hold different values"):
            SharedLayer().load_weights(f)
        assert f.tell() == 0
    target = nn.Linear(2, in_size=2)

    def failing_load_state_dict(state, strict=True):
        raise ValueError("refused")

    target.load_state_dict = failing_load_state_dict
    stream.seek(4)
    with pytest.raises(ValueError, match="refused"):
        target.load(stream)
    assert stream.tell() == 4


def _holding(name):
    """A model with one parameter, [0, 1, 2], under the attribute `name`."""
    model = nn.Module()
    setattr(model, name, gradcore.Parameter(np.arange(3, dtype=np.float32)))
    return model


@pytest.mark.parametrize("name, reason", [
    ("a\x00b", r"'a\\x00b' cannot be saved: its name holds a NUL character"),
    ("x" * 65532, r"'x{40}'\.\.\. \(65532 characters\) cannot be saved: its name is 65532 bytes "
                  r"long in UTF-8, more than the 65531 a zip entry's name can hold"),
    ("w\udcff", r"'w\\udcff' cannot be saved: its name holds '\\udcff', a lone surrogate")],
    ids=["nul", "too-long", "surrogate"])
def test_a_name_no_npz_archive_can_hold_is_refused_before_anything_is_written(tmp_path, name,
                                                                               reason):
    # zipfile would cut 'a\x00b.npy' to 'a' (a file that never loads back), and crash on the
    # others with struct.error or UnicodeEncodeError, halfway into a stream
    model = _holding(name)
    stream = io.BytesIO()
    for target in (stream, tmp_path / "m.npz"):
        with pytest.raises(ValueError, match=r"save: the parameter or buffer " + reason
                                             + r".*; nothing was written\. Rename the attribute"):
            model.save(target)
    assert stream.getvalue() == b"" and os.listdir(tmp_path) == []


def test_the_longest_name_a_zip_entry_holds_and_names_beyond_ascii_round_trip():
    for name in ["x" * 65531, "模" * 21843 + "ab", "fc 2", "a/b"]:  # 65531 UTF-8 bytes: the limit
        stream = io.BytesIO()
        _holding(name).save(stream)
        stream.seek(0)
        target = _holding(name)
        target.__dict__[name].data[...] = -1
        target.load(stream)
        np.testing.assert_array_equal(target.__dict__[name].data, [0, 1, 2])


def test_saving_over_a_folder_is_refused_naming_it_before_anything_is_written(tmp_path):
    (tmp_path / "ckpt.npz").mkdir()
    path = tmp_path / "ckpt"
    with pytest.raises(IsADirectoryError) as error:
        built(0).save(path)
    assert str(error.value) == (f"[Errno 21] save: cannot write {path}.npz: it is a folder; save "
                                "under another name, or to a file inside that folder")
    assert os.listdir(tmp_path) == ["ckpt.npz"] and os.listdir(tmp_path / "ckpt.npz") == []


def test_a_text_mode_file_object_is_refused_asking_for_binary_mode(tmp_path):
    model = built(0)
    path = model.save(tmp_path / "m")
    with open(path) as f:  # text mode: reads str, which no archive is
        for load in (model.load, nn.read_checkpoint):
            with pytest.raises(TypeError, match=rf"cannot read a checkpoint from {re.escape(path)}"
                                                r": it is open in text mode, and a checkpoint is "
                                                r"binary; open it in binary mode, open\(path, "
                                                r"'rb'\), or pass the path"):
                load(f)
            assert f.tell() == 0
    with pytest.raises(TypeError, match=r"from the StringIO given: it is open in text mode"):
        model.load(io.StringIO())
    text = tmp_path / "t.npz"
    with open(text, "w") as f:
        with pytest.raises(TypeError, match=rf"cannot write a checkpoint into "
                                            rf"{re.escape(str(text))}: it is open in text mode, "
                                            r".*open\(path, 'wb'\)"):
            model.save(f)
    assert text.read_bytes() == b""


def test_loading_keeps_a_dask_parameters_chunks():
    """As backward, the optimizer and nn.init keep them: a load fills the chunks chosen for
    larger-than-memory work, not one chunk of the whole array."""
    da = pytest.importorskip("dask.array")
    pytest.importorskip("array_api_compat")
    W = np.arange(12, dtype=np.float32).reshape(4, 3)
    target = _holding("W")
    target.W = gradcore.Parameter(da.zeros((4, 3), chunks=(2, 3), dtype=np.float32))
    source = _holding("W")
    source.W = gradcore.Parameter(W)
    stream = io.BytesIO()
    source.save(stream)
    stream.seek(0)
    target.load(stream)
    assert target.W.data.chunks == ((2, 2), (3,))
    np.testing.assert_array_equal(np.asarray(target.W.data), W)
    target.load_state_dict({"W": W + 1})
    assert target.W.data.chunks == ((2, 2), (3,))
    np.testing.assert_array_equal(np.asarray(target.W.data), W + 1)
