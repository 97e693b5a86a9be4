"""backends: Device values, type-keyed dispatch, moves between devices, and the CUDA errors."""
import gc
import itertools
import pathlib
import re
import subprocess
import sys
import threading
import types
import warnings
import weakref

import numpy as np
import pytest

import array_api_strict
import backends
import gradcore
import gradcore.functions as F
from backends import CPU, Device, DeviceUnavailableError, indexing, parse_device
import conftest
from backends.array_api_backend import ArrayAPIBackend
from conftest import CASES, DEVICE1, DEVICE2, STRICT


# =============================================================================== Device values
@pytest.mark.parametrize("text, type, index", [
    ("cpu", "cpu", None),
    ("cuda", "cuda", None),
    ("cuda:0", "cuda", 0),
    ("cuda:1", "cuda", 1),
    ("array_api_strict:device1", "array_api_strict", "device1"),
])
def test_device_string_round_trip(text, type, index):
    device = parse_device(text)
    assert (device.type, device.index) == (type, index)
    assert str(device) == text
    assert parse_device(str(device)) == device
    assert device == text and text == device  # equal to its string, both ways round
    assert hash(device) == hash(text)
    assert repr(device) == f"Device({text!r})"


def test_device_equality_and_hashing():
    assert Device("cuda", 1) == Device("cuda", "1") == "cuda:1"
    assert Device("cuda", 1) != Device("cuda", 0)
    assert Device("cuda") != Device("cuda", 0)  # "the current GPU" is not a fixed index
    assert CPU != "cuda" and CPU != DEVICE1
    assert CPU != "not a device:" and CPU != 3  # no exception, just unequal
    table = {parse_device("cuda:1"): "gpu1", CPU: "host"}
    assert table[Device("cuda", 1)] == "gpu1"
    assert table["cpu"] == "host"  # a string finds the Device key
    assert len({Device("cpu"), CPU, parse_device("cpu")}) == 1
    assert parse_device(CPU) is CPU and parse_device(None) is CPU
    assert DEVICE1 != DEVICE2 and DEVICE1 == "array_api_strict:device1"


@pytest.mark.parametrize("text", ["", ":1", "cuda:", "cpu:0", "cuda:x", "cuda:-1", "gpu:"])
def test_invalid_device_strings_raise_value_error(text):
    with pytest.raises(ValueError, match="invalid device"):
        parse_device(text)


@pytest.mark.parametrize("text", ["cuda:-1", "cuda:x", "cuda:1.5", "cuda:²"])
def test_a_gpu_index_must_be_a_non_negative_integer(text):
    message = f"invalid device '{text}': a GPU index is a non-negative integer, as in 'cuda:1'"
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_device(text)


def test_invalid_device_objects():
    with pytest.raises(TypeError, match="got int"):
        parse_device(0)
    with pytest.raises(ValueError, match="without ':'"):
        Device("cuda:0")
    with pytest.raises(TypeError, match="index"):
        Device("cuda", 1.5)


# =============================================================================== dispatch
def test_backend_of_is_keyed_on_the_exact_type():
    assert backends.backend_of(np.ones(2)) is backends.NUMPY
    assert backends._by_type[np.ndarray] is backends.NUMPY

    class Sub(np.ndarray):
        pass

    sub = np.ones(2).view(Sub)
    assert Sub not in backends._by_type
    assert backends.backend_of(sub) is backends.NUMPY  # first sight: the slow path fills the dict
    assert backends._by_type[Sub] is backends.NUMPY

    strict = array_api_strict.asarray([1.0], device=STRICT.native(DEVICE1))
    assert backends.backend_of(strict) is STRICT
    assert backends._by_type[type(strict)] is STRICT


def test_backend_of_rejects_what_no_backend_owns():
    for obj in (3.0, [1.0], "text", object(), None):
        assert backends.backend_of(obj) is None
        assert not backends.is_array(obj)
    assert backends.is_array(np.zeros(()))


def test_registries_and_lookups():
    assert backends.get_backend("numpy") is backends.NUMPY
    assert backends.get_backend(STRICT.name) is STRICT
    assert backends.backend_for_device("cpu") is backends.NUMPY
    assert backends.backend_for_device(DEVICE1) is STRICT
    assert backends.backend_for_device("array_api_strict:device2") is STRICT
    with pytest.raises(ValueError, match="no backend named 'nope'"):
        backends.get_backend("nope")
    with pytest.raises(ValueError, match="unknown device tpu"):
        backends.backend_for_device("tpu")
    with pytest.raises(DeviceUnavailableError, match="array_api_strict:nowhere does not exist"):
        STRICT.asarray(np.ones(2), device=Device("array_api_strict", "nowhere"))


def test_registering_an_equal_backend_again_returns_the_registered_one(monkeypatch):
    # the README's register line run twice (a re-run notebook cell), or after gradcore
    # registered the library on first sight of its array: one backend, so arrays made before
    # and after mix (two objects would split device1 in two that ops refuse to mix)
    array_type = conftest.STRICT_ARRAY
    a = gradcore.Variable(STRICT.asarray(np.array([1.0, 2.0]), device=DEVICE1))
    again = backends.register(ArrayAPIBackend(array_api_strict, array_type))
    assert again is STRICT
    assert backends.backend_of(array_api_strict.asarray(0.0)) is STRICT
    assert backends.get_backend(STRICT.name) is STRICT and backends.backend_for_device(DEVICE1) is STRICT
    b = gradcore.Variable(STRICT.asarray(np.array([3.0, 4.0]), device=DEVICE1))
    np.testing.assert_array_equal(STRICT.to_numpy((a + b).data), [4.0, 6.0])

    # a registry that has not met array-api-strict yet: it registers it on first sight
    for name in ("_by_type", "_by_name", "_by_device_type"):
        monkeypatch.setattr(backends, name, {k: v for k, v in getattr(backends, name).items()
                                             if v is not STRICT})
    seen = backends.backend_of(array_api_strict.asarray([1.0], device=STRICT.native(DEVICE1)))
    assert seen is not STRICT and seen.name == STRICT.name
    assert backends.register(ArrayAPIBackend(array_api_strict, array_type)) is seen


@pytest.mark.parametrize("make, message", [
    # same name, another library
    (lambda: ArrayAPIBackend(np, np.ndarray, name="array_api_strict"),
     r"the array type numpy\.ndarray belongs to the registered <NumpyBackend 'numpy'>"),
    (lambda: ArrayAPIBackend(np, type("Other", (), {}), name="array_api_strict"),
     r"the name 'array_api_strict' belongs to the registered <ArrayAPIBackend "
     r"'array_api_strict'>, and <ArrayAPIBackend 'array_api_strict'> differs from it in "
     r"library: numpy vs array_api_strict; array type: .*Other vs "
     r"array_api_strict\._array_object\.Array \(new vs registered\).* Give it a name of its own"),
    # the same library's arrays under a second name
    (lambda: ArrayAPIBackend(array_api_strict, conftest.STRICT_ARRAY, name="strict2"),
     r"the array type array_api_strict\._array_object\.Array belongs to the registered "
     r"<ArrayAPIBackend 'array_api_strict'>, and <ArrayAPIBackend 'strict2'> differs from it "
     r"in name: 'strict2' vs 'array_api_strict'; device type: 'strict2' vs 'array_api_strict' "
     r"\(new vs registered\).*An array type has one backend: use the registered one: "
     r"backends\.get_backend\('array_api_strict'\)"),
])
def test_a_registration_that_would_replace_another_backend_says_what_differs(make, message):
    before = [dict(r) for r in (backends._by_type, backends._by_name, backends._by_device_type)]
    with pytest.raises(ValueError, match="backends.register: " + message):
        backends.register(make())
    assert [backends._by_type, backends._by_name, backends._by_device_type] == before


def test_import_gradcore_does_not_import_cupy():
    code = "import gradcore, sys; assert 'cupy' not in sys.modules, 'cupy was imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# =============================================================================== backend members
def test_case_arrays_live_where_asked(xp):
    a = xp.asarray([[1.0, 2.0], [3.0, 4.0]], dtype="float32")
    assert xp.backend.device_of(a) == xp.device
    assert backends.backend_of(a) is xp.backend
    back = xp.numpy(a)
    assert isinstance(back, np.ndarray) and back.dtype == np.float32
    np.testing.assert_array_equal(back, [[1.0, 2.0], [3.0, 4.0]])
    z = xp.backend.zeros((2, 3), a.dtype, xp.device)
    assert xp.backend.device_of(z) == xp.device and z.dtype == a.dtype
    np.testing.assert_array_equal(xp.numpy(z), np.zeros((2, 3)))
    e = xp.backend.empty((2, 3), a.dtype, xp.device)
    assert xp.backend.device_of(e) == xp.device and e.dtype == a.dtype and e.shape == (2, 3)


@pytest.mark.parametrize("kind", ["normal", "uniform"])
def test_random_draw_gives_the_global_generators_numbers_from_a_state_and_leaves_it_alone(
        xp, kind):
    backend, device = xp.backend, xp.device
    draw = backend.random_normal if kind == "normal" else backend.random_uniform
    gradcore.manual_seed(11)
    state = backend.random_state(device)
    expected = xp.numpy(draw((3, 4), "float32", device))
    gradcore.manual_seed(2)
    position = backend.random_position(device)
    for _ in range(2):  # the same numbers every time
        samples = backend.random_draw(kind, (3, 4), "float32", device, state)
        assert backend.device_of(samples) == device and xp.numpy(samples).dtype == np.float32
        np.testing.assert_array_equal(xp.numpy(samples), expected)
    assert backend.random_position(device) == position  # the global generator did not move
    if position is not None:
        assert backend.random_position(device, state) != position
        assert backend.random_position(device, backend.random_state(device)) == position


def test_writable_tells_a_read_only_array_without_copying_it(xp):
    read_only = np.ones(3)
    read_only.flags.writeable = False
    backend = xp.backend
    assert backend.writable(xp.asarray(np.ones(3)))
    # NumPy and array-api-strict share the read-only memory; CuPy copies it to the GPU
    assert backend.writable(xp.asarray(read_only)) is (xp.name == "cupy")
    assert read_only.flags.writeable is False


def test_dask_arrays_are_writable_as_they_are_never_written_in_place():
    read_only = np.ones(3)
    read_only.flags.writeable = False
    dask = CASES["dask"]()
    assert dask.backend.writable(dask.asarray(read_only))


def test_ensure_array_rewraps_scalars(xp):
    a = xp.asarray([1.0, 2.0])
    s = xp.backend.ensure_array(xp.sum(a))
    assert backends.backend_of(s) is xp.backend and s.shape == ()
    assert backends.NUMPY.ensure_array(np.float64(2.5)).__class__ is np.ndarray


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
def test_numpy_ensure_array_gives_a_subclass_as_a_plain_array_over_its_memory(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(4.0))
    for a in (np.matrix([[1.0, 2.0]]), np.load(tmp_path / "a.npy", mmap_mode="r+")):
        plain = backends.NUMPY.ensure_array(a)
        assert plain.__class__ is np.ndarray and np.shares_memory(plain, a)  # a view: no copy
    with pytest.raises(TypeError, match=r"numpy\.ma\.MaskedArray .*filled"):
        backends.NUMPY.ensure_array(np.ma.array([1.0, 2.0], mask=[0, 1]))
    a = np.ones(2)
    assert backends.NUMPY.ensure_array(a) is a


def test_numpy_owns_memory_of_scalars_and_plain_arrays_only(tmp_path):
    """A memmap (a subclass) was taken for an immutable NumPy scalar: memory no other shares."""
    np.save(tmp_path / "a.npy", np.arange(4.0))
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r+")
    owns = backends.NUMPY.owns_memory
    assert not owns(mapped) and not owns(mapped[1:]) and not owns(mapped.T)
    assert owns(np.float64(1.0)) and owns(np.ones(2)) and not owns(np.ones(2)[1:])


def test_as_factor_gives_a_mask_that_multiplies_like_its_float_cast(xp):
    gy = xp.asarray([-1.5, 2.0, 3.0, -0.0], dtype="float32")
    mask = gy > 0
    factor = xp.backend.as_factor(mask, gy.dtype)
    if xp.backend.multiplies_bool:  # NumPy, CuPy: the bool array itself, no float copy
        assert factor is mask
    else:  # the array API mixes no bool with float
        assert factor.dtype == gy.dtype
    product = gy * factor
    assert product.dtype == gy.dtype
    want = np.float32([-1.5, 2.0, 3.0, -0.0]) * np.float32([0, 1, 1, 0])
    np.testing.assert_array_equal(xp.numpy(product), want)
    assert np.signbit(xp.numpy(product)).tolist() == np.signbit(want).tolist()  # -1.5 * 0 is -0


def test_scatter_add_basic_indices(xp):
    target = xp.backend.zeros((3, 4), xp.asarray(0.0).dtype, xp.device)
    values = xp.asarray(np.arange(4.0).reshape(2, 2))
    out = xp.backend.scatter_add(target, (slice(1, None), slice(None, None, 2)), values)
    expected = np.zeros((3, 4))
    expected[1:, ::2] += np.arange(4.0).reshape(2, 2)
    np.testing.assert_array_equal(xp.numpy(out), expected)


def test_scatter_add_with_a_new_axis(xp):
    target = xp.backend.zeros((3, 4), xp.asarray(0.0).dtype, xp.device)
    values = xp.asarray(np.ones((4, 1)))  # what x[1, ..., None] looks like
    out = xp.backend.scatter_add(target, (1, Ellipsis, None), values)
    expected = np.zeros((3, 4))
    expected[1] = 1.0
    np.testing.assert_array_equal(xp.numpy(out), expected)


def test_numpy_scatter_add_repeats_add_up():
    target = np.zeros(3)
    backends.NUMPY.scatter_add(target, np.array([0, 2, 0, 0]), np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_array_equal(target, [8.0, 0.0, 2.0])


# keys for scatter_add into a (4, 3) target: repeated indices, integer arrays mixed with slices,
# ints and None, masks; each is checked against np.add.at
SCATTER_KEYS = {
    "rows": (np.array([0, 2, 0, 0]),),
    "rows-negative": (np.array([-1, 3, 0, -4]),),
    "pairs": (np.array([1, 1, 3, 1]), np.array([2, 2, 0, 2])),
    "slice-and-array": (slice(1, None), np.array([[0, 0], [2, 0]])),
    "int-and-array": (2, np.array([1, 1, 1])),
    "apart": (np.array([0, 0]), None, np.array([1, 1])),
    "newaxis": (None, np.array([3, 3, 3]), Ellipsis),
    "mask": (np.array([[True, False, True]] * 4),),
    "mask-rows": (np.array([True, False, True, True]),),
    "basic": (slice(None, None, 2), 1),
    "slice-past-ends": (slice(-9, 2), slice(1, 10)),
    "slice-past-and-array": (slice(-1, -9, -1), np.array([0, 2, 0])),
}


@pytest.mark.parametrize("name", SCATTER_KEYS)
def test_scatter_add_with_index_arrays_adds_repeats_like_np_add_at(xp, name):
    key = SCATTER_KEYS[name]
    rng = np.random.default_rng(len(name))
    start = rng.standard_normal((4, 3))
    values = rng.standard_normal(np.zeros((4, 3))[key].shape)
    expected = start.copy()
    np.add.at(expected, key, values)
    target = xp.asarray(start)
    device_key = tuple(xp.asarray(k) if isinstance(k, np.ndarray) else k for k in key)
    out = xp.backend.scatter_add(target, device_key, xp.asarray(values))
    assert out is target and xp.backend.device_of(out) == xp.device
    np.testing.assert_allclose(xp.numpy(out), expected, rtol=1e-14)


@pytest.mark.parametrize("name", SCATTER_KEYS)
def test_get_item_with_a_normalized_key_reads_like_numpy(xp, name):
    key = SCATTER_KEYS[name]
    start = np.arange(12.0).reshape(4, 3)
    device_key = tuple(xp.asarray(k) if isinstance(k, np.ndarray) else k for k in key)
    checked = xp.backend.normalize_key(device_key, start.shape)
    assert xp.backend.normalize_key(checked, start.shape) is checked  # checked once
    np.testing.assert_array_equal(xp.numpy(xp.backend.get_item(xp.asarray(start), checked)),
                                  start[key])


def test_normalize_key_puts_slice_bounds_in_range_picking_what_numpy_picks():
    """The array API leaves bounds past an end unspecified (array-api-strict refuses them):
    every slice of a small axis comes out with bounds in [-n, n] and NumPy's elements."""
    bounds = [None, *range(-8, 9)]
    for n in range(5):
        a = np.arange(n)
        for start, stop, step in itertools.product(bounds, bounds, [None, 1, 2, -1, -3]):
            k = slice(start, stop, step)
            clipped, = indexing.normalize_key(np, k, (n,))
            assert all(b is None or -n <= b <= n for b in (clipped.start, clipped.stop)), (n, k)
            np.testing.assert_array_equal(a[clipped], a[k], err_msg=f"{k} of {n}")


def test_scatter_add_checks_bounds(xp):
    target = xp.backend.zeros((3,), xp.asarray(0.0).dtype, xp.device)
    with pytest.raises(IndexError, match="index 3 is out of bounds for axis 0 with size 3"):
        xp.backend.scatter_add(target, (xp.asarray(np.array([0, 3])),), xp.asarray(1.0))


@pytest.mark.parametrize("big", [2**64 - 1, 2**63])
def test_an_unsigned_index_past_int64_is_out_of_bounds_as_given(xp, big):
    # NumPy's cast to intp wraps 2**64 - 1 to -1 (the last element) and 2**63 to -2**63
    x = gradcore.Variable(xp.asarray(np.arange(5.0)))
    index = xp.asarray(np.array([1, big], dtype=np.uint64))
    bounds = f"index {big} is out of bounds for axis 0 with size 5"
    with pytest.raises(IndexError, match=f"get_item: {bounds}"):
        x[index]
    target = xp.backend.zeros((5,), x.dtype, xp.device)
    with pytest.raises(IndexError, match=bounds):
        xp.backend.scatter_add(target, (index,), xp.asarray(1.0))
    np.testing.assert_array_equal(xp.numpy(target), np.zeros(5))


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64"])
def test_unsigned_index_arrays_in_range_read_and_scatter_like_int64(xp, dtype):
    x = gradcore.Variable(xp.asarray(np.arange(5.0)))
    y = x[xp.asarray(np.array([4, 0, 4], dtype=dtype))]
    y.backward()
    np.testing.assert_array_equal(xp.numpy(y.data), [4.0, 0.0, 4.0])
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [1.0, 0.0, 0.0, 0.0, 2.0])


def test_a_0_d_mask_in_a_backend_key_is_refused_with_a_message_that_says_so(xp):
    # the backend's keys spell out the indexed array's axes, and a 0-d mask adds one; get_item
    # takes it (tests/functions/test_shape.py). The message must not list it as accepted
    target = xp.backend.zeros((3,), xp.asarray(0.0).dtype, xp.device)
    with pytest.raises(TypeError, match=r"boolean arrays of at least one axis \(get_item takes "
                                        r"0-d ones too\); got .*True"):
        xp.backend.scatter_add(target, (xp.asarray(True),), xp.asarray(1.0))


def test_scatter_add_broadcasts_values_and_keeps_float32(xp):
    target = xp.backend.zeros((3, 2), xp.asarray(np.float32(0)).dtype, xp.device)
    out = xp.backend.scatter_add(target, (xp.asarray(np.array([0, 0, 2])),), xp.asarray(
        np.array([1.0, 2.0], dtype=np.float32)))
    assert out.dtype == xp.float32
    np.testing.assert_array_equal(xp.numpy(out), [[2.0, 4.0], [0.0, 0.0], [1.0, 2.0]])


def test_generic_scatter_add_does_not_lose_a_small_sum_beside_a_large_one():
    """The segment sum adds within each run; a running total and a difference would round 1e-3
    away next to 1e9 in float32."""
    target = STRICT.zeros((2,), array_api_strict.float32, DEVICE1)
    index = STRICT.asarray(np.array([0] * 1000 + [1]), device=DEVICE1)
    values = STRICT.asarray(np.array([1e6] * 1000 + [1e-3], dtype=np.float32), device=DEVICE1)
    STRICT.scatter_add(target, (index,), values)
    np.testing.assert_allclose(STRICT.to_numpy(target), [1e9, 1e-3], rtol=1e-6)


@pytest.mark.parametrize("dtype", ["int64", "int8", "uint16", "bool", "complex64", "float32"])
def test_cupy_scatter_add_converts_dtypes_atomic_add_lacks(dtype):
    """cupy.add.at takes ATOMIC_ADD_DTYPES only; the conversion, run here on NumPy with a
    stand-in that refuses the others, must give np.add.at's result (wrapping included)."""
    from backends.cupy_backend import ATOMIC_ADD_DTYPES, scatter_add_converted

    def atomic_only(target, index, values):
        assert target.dtype.name in ATOMIC_ADD_DTYPES, target.dtype
        np.add.at(target, index, values)

    index = np.array([0, 0, 3, 0, 1])
    values = np.array([100, 100, -7, 100, 0]).astype(dtype)
    start = np.array([5, 0, 1, 2]).astype(dtype)
    if dtype == "complex64":
        values = values * np.complex64(1 - 2j)
    expected = start.copy()
    np.add.at(expected, index, values)
    if dtype == "float32":
        assert dtype in ATOMIC_ADD_DTYPES
        return
    out = scatter_add_converted(atomic_only, np, start, index, values)
    assert out is start and out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, expected)


def test_the_key_helpers_use_names_cupy_has():
    """normalize_key, gather and flat_positions run on CuPy arrays too (get_item, scatter_add)."""
    cupy = pytest.importorskip("cupy")
    source = (pathlib.Path(backends.__file__).parent / "indexing.py").read_text()
    names = set(re.findall(r"\bxp\.([A-Za-z_]\w*)", source))
    assert {"take", "nonzero", "isdtype"} <= names
    assert sorted(n for n in names if not hasattr(cupy, n)) == []


def test_to_device_moves_within_and_across_backends():
    a = np.arange(3.0)
    on1 = backends.to_device(a, DEVICE1)
    assert backends.backend_of(on1) is STRICT and STRICT.device_of(on1) == DEVICE1
    on2 = backends.to_device(on1, "array_api_strict:device2")
    assert STRICT.device_of(on2) == DEVICE2
    home = backends.to_device(on2, "cpu")
    assert type(home) is np.ndarray
    np.testing.assert_array_equal(home, a)
    assert backends.to_device(a, CPU) is a  # already there: no copy


def test_a_dtype_the_device_lacks_is_a_value_error_naming_the_device_and_its_dtypes():
    # array-api-strict has no float16: its own message names neither, after 13 UserWarnings
    lacks = (r"array_api_strict:device1 has no float16 \(its floating dtypes: float32, "
             r"float64\); use one of those, or a device that has float16, such as 'cpu'")
    half = np.ones(3, np.float16)
    x = gradcore.Variable(half)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=lacks):
            backends.to_device(half, DEVICE1)
        with pytest.raises(ValueError, match=lacks):
            STRICT.asarray(np.float16(1.0), device=DEVICE1)  # a NumPy scalar too
        with pytest.raises(ValueError, match=r"to_device: " + lacks):
            x.to(DEVICE1)
        with pytest.raises(ValueError, match=lacks.replace("device1", "CPU_DEVICE")):
            STRICT.zeros((2,), "float16", None)
    assert x.device == CPU and x.creator is None and x.dtype == np.float16


@pytest.mark.parametrize("device", ["array_api_strict:device1", "dask"])
def test_a_move_across_libraries_in_host_memory_is_a_copy(device):
    # array-api-strict's asarray and Dask's from_array would wrap NumPy's memory as it is: a
    # write to the moved Variable would rewrite x behind its version, and x's gradient with it
    if device == "dask":
        pytest.importorskip("dask")
    x = gradcore.Variable(np.array([1.0, 2.0, 3.0]))
    moved = x.to(device)
    y = F.sum(x * x)
    moved.data -= 1.0
    y.backward()
    np.testing.assert_array_equal(x.data, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(x.grad.data, [2.0, 4.0, 6.0])
    back = backends.to_device(backends.to_device(x.data, device), "cpu")
    back[0] = 10.0
    assert x.data[0] == 1.0


# =============================================================================== CUDA errors
def test_cuda_without_a_gpu_is_one_clear_error():
    pytest.importorskip("cupy")
    if backends.cuda_available():
        pytest.skip("a GPU is present")
    with pytest.raises(DeviceUnavailableError, match="no CUDA device"):
        backends.backend_for_device("cuda")
    x = gradcore.Variable(np.arange(3.0))
    with pytest.raises(DeviceUnavailableError, match="no CUDA device"):
        x.to("cuda:0")
    with pytest.raises(DeviceUnavailableError, match="no CUDA device"):
        x.to_gpu()
    assert type(x.data) is np.ndarray and x.device == "cpu"  # nothing moved
    assert gradcore.DeviceUnavailableError is DeviceUnavailableError
    assert issubclass(DeviceUnavailableError, RuntimeError)


def test_cuda_without_cupy_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` now raises ImportError
    monkeypatch.delitem(backends._by_name, "cupy", raising=False)
    monkeypatch.delitem(backends._by_device_type, "cuda", raising=False)
    assert not backends.cuda_available()
    with pytest.raises(DeviceUnavailableError, match=r"pip install 'gradcore\[gpu\]'"):
        backends.get_backend("cupy")
    x = gradcore.Variable(np.arange(3.0))
    with pytest.raises(DeviceUnavailableError, match="CuPy is not installed"):
        x.to("cuda")
    with pytest.raises(DeviceUnavailableError, match=r"gradcore\[gpu\]"):
        x.to_gpu()
    assert type(x.data) is np.ndarray


@pytest.mark.gpu
def test_cuda_device_values_on_a_gpu():
    cupy_backend = backends.get_backend("cupy")
    a = cupy_backend.asarray(np.arange(3.0), device=Device("cuda", 0))
    assert backends.backend_of(a) is cupy_backend
    assert cupy_backend.device_of(a) == "cuda:0"
    np.testing.assert_array_equal(cupy_backend.to_numpy(a), np.arange(3.0))
    count = cupy_backend.xp.cuda.runtime.getDeviceCount()
    with pytest.raises(DeviceUnavailableError, match="does not exist"):
        cupy_backend.asarray(np.ones(2), device=Device("cuda", count))


def test_every_xp_name_the_ops_use_exists_in_cupy():
    """CuPy's main namespace is not all of the array API (no vecdot, no unstack): every `xp.<name>`
    written in gradcore must exist there. CuPy imports without a GPU, so this runs in CI."""
    cupy = pytest.importorskip("cupy")
    root = pathlib.Path(gradcore.__file__).parent
    names = set()
    for path in root.rglob("*.py"):
        names.update(re.findall(r"\bxp\.([A-Za-z_]\w*)", path.read_text()))
    assert {"exp", "matmul", "sum"} <= names  # the scan finds the ops' calls
    dask_only = {"checked"}  # Dask's namespace adds it; ops call it only where backend.lazy
    # NumPy's floating-point error modes: compile's blocked pairs, only where loops_on_host
    host_only = {"errstate", "geterr"}
    assert sorted(n for n in names - dask_only - host_only if not hasattr(cupy, n)) == []


def test_asarray_on_puts_lists_and_other_devices_arrays_on_the_device():
    on1 = backends.asarray_on([1, 2, 3], DEVICE1)
    assert backends.backend_of(on1) is STRICT and STRICT.device_of(on1) == DEVICE1
    moved = backends.asarray_on(np.array([1.0, 2.0]), DEVICE1, dtype=STRICT.xp.float32)
    assert STRICT.device_of(moved) == DEVICE1 and moved.dtype == STRICT.xp.float32
    a = np.arange(3)
    assert backends.asarray_on(a, "cpu") is a  # already there: no copy
    np.testing.assert_array_equal(backends.asarray_on(on1, "cpu"), [1, 2, 3])


class _StandInCuda:
    """Stands in for cupy.cuda in CupyBackend.capture: notes what the capture did, in order."""

    def __init__(self, fail_end=False):
        self.events, self.allocator, self.current, self.stream_made = [], None, 0, 0
        self.fail_end = fail_end
        outer = self

        class CUDARuntimeError(RuntimeError):
            pass

        class MemoryPool:
            """Frees its cached blocks and tries again where its allocator raises a CUDA error,
            as CuPy's pools do."""

            def __init__(self, allocator):
                self.bytes, self.allocator = 1024, allocator

            def malloc(self, size):
                try:
                    return self.allocator(size)
                except CUDARuntimeError:
                    outer.events.append("cached blocks freed")
                    return self.allocator(size)

            def total_bytes(self):
                return self.bytes

        class Stream:
            def __init__(self, non_blocking=False):
                assert non_blocking  # never the legacy default stream, which syncs with all
                outer.stream_made += 1

            def __enter__(self):
                outer.events.append("stream")

            def __exit__(self, *exc):
                outer.events.append("stream done")

            def begin_capture(self):
                outer.events.append("begin")

            def end_capture(self):
                outer.events.append("end")
                if outer.fail_end:
                    raise RuntimeError("capture invalidated")
                return types.SimpleNamespace(launch=lambda stream: outer.events.append(
                    f"launch on {outer.current}, stream {stream.ptr}"))

        class using_allocator:
            def __init__(self, allocator):
                self.allocator = allocator

            def __enter__(self):
                outer.allocator = self.allocator

            def __exit__(self, *exc):
                outer.allocator = None

        class Device:
            def __init__(self, id):
                self.id = id

            def synchronize(self):
                outer.events.append(f"device {self.id} synchronized")

            def __enter__(self):
                self.previous, outer.current = outer.current, self.id

            def __exit__(self, *exc):
                outer.current = self.previous

        class Current:
            """A stream launches go to (cupy.cuda.get_current_stream's)."""

            def __init__(self, ptr):
                self.ptr = ptr

            def record(self):
                return f"event on stream {self.ptr}"

            def wait_event(self, event):
                outer.events.append(f"stream {self.ptr} waits for the {event}")

        class PinnedMemory:
            pass

        class PooledPinnedMemory(PinnedMemory):
            def __init__(self, pool):
                self.pool = weakref.ref(pool)

        class PinnedPool:
            def malloc(self, size):
                return types.SimpleNamespace(mem=PooledPinnedMemory(self))

        self.pinned_pool = PinnedPool()
        self.pinned_memory = types.SimpleNamespace(
            PinnedMemory=PinnedMemory, PooledPinnedMemory=PooledPinnedMemory,
            _malloc=lambda size: types.SimpleNamespace(mem=PinnedMemory()))
        self.pinned = self.pinned_pool.malloc  # CuPy's default: its pinned pool

        def set_pinned_memory_allocator(allocator):
            self.pinned = allocator

        self.set_pinned_memory_allocator = set_pinned_memory_allocator
        self.alloc_pinned_memory = lambda size: self.pinned(size)
        self.MemoryPool, self.Stream, self.using_allocator, self.Device = (
            MemoryPool, Stream, using_allocator, Device)
        self.runtime = types.SimpleNamespace(getDevice=lambda: outer.current,
                                             getDeviceCount=lambda: 2,
                                             CUDARuntimeError=CUDARuntimeError)
        self.out_of_memory = False  # cudaMalloc fails

        def malloc(size):
            if outer.out_of_memory:
                raise CUDARuntimeError("cudaErrorMemoryAllocation: out of memory")
            return size

        self.memory = types.SimpleNamespace(_malloc=malloc)
        self.streams = {ptr: Current(ptr) for ptr in (7, 8)}
        self.stream = 7
        self.get_current_stream = lambda: self.streams[self.stream]


def _stand_in_cupy_backend(cuda):
    from backends.cupy_backend import CupyBackend

    backend = object.__new__(CupyBackend)  # no GPU here: __init__ would look for one
    backend.xp = types.SimpleNamespace(
        cuda=cuda, get_default_pinned_memory_pool=lambda: cuda.pinned_pool,
        copyto=lambda buffer, value: cuda.events.append(f"copy {value} into {buffer}"))
    backend._graphs = weakref.WeakSet()
    backend._devices = {}
    backend._capture_streams = {}
    return backend


def test_cupy_capture_runs_the_step_in_a_capture_with_a_pool_of_its_own():
    cuda = _StandInCuda()
    backend = _stand_in_cupy_backend(cuda)

    def run():
        cuda.events.append("run")
        assert cuda.allocator is not None  # arrays made while capturing: the graph's own pool
        # a copy from the host goes through pinned memory: refused in the capturing thread,
        # served as before in any other
        with pytest.raises(RuntimeError, match="copied from host memory inside the capture"):
            cuda.alloc_pinned_memory(8)
        elsewhere = []
        thread = threading.Thread(target=lambda: elsewhere.append(cuda.alloc_pinned_memory(8)))
        thread.start()
        thread.join()
        assert elsewhere[0].mem.pool() is cuda.pinned_pool
        return ("result",)

    graph, results = backend.capture(run)
    assert results == ("result",) and cuda.pinned == cuda.pinned_pool.malloc  # put back
    assert cuda.events == ["stream", "begin", "run", "end", "stream done"]
    assert gc.isenabled()  # off while capturing (see below), on again after
    assert backend.graph_memory(None) == 1024  # its pool, while the graph lives
    with cuda.Device(1):
        graph.launch([("buffer", "x")])  # on the GPU it was captured on, its inputs copied first
    assert cuda.events[-2:] == ["copy x into buffer", "launch on 0, stream 7"]
    graph.launch()
    cuda.stream = 8  # another stream: the last launch's work is waited for, the buffers shared
    graph.launch()
    assert cuda.events[-3:] == ["launch on 0, stream 7", "stream 8 waits for the event on stream 7",
                                "launch on 0, stream 8"]
    del graph
    gc.collect()
    assert backend.graph_memory(None) == 0


def test_a_failed_cupy_capture_is_ended_and_its_error_raised():
    cuda = _StandInCuda(fail_end=True)
    backend = _stand_in_cupy_backend(cuda)

    def run():
        raise RuntimeError("operation not permitted when stream is capturing")

    cuda.set_pinned_memory_allocator(cuda.pinned_memory._malloc)  # no pool: CuPy's other way
    with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
        backend.capture(run)
    assert cuda.events == ["stream", "begin", "end", "stream done"]
    assert cuda.allocator is None and backend.graph_memory(None) == 0
    assert cuda.pinned is cuda.pinned_memory._malloc
    cuda.set_pinned_memory_allocator(lambda size: types.SimpleNamespace(mem=object()))
    with pytest.raises(RuntimeError, match="pinned memory allocator of the user's own"):
        backend.capture(run)  # one that cannot be put back: no capture at all
    assert cuda.events.count("begin") == 1


def test_a_cupy_capture_keeps_out_collections_waits_and_block_reuse():
    cuda = _StandInCuda()
    backend = _stand_in_cupy_backend(cuda)
    streams, waited = [], []

    def run():
        assert not gc.isenabled()  # an array the collector freed would go back to a pool
        streams.append(cuda.stream_made)
        # a device-wide wait from another thread waits for the capture to end (CUDA would
        # refuse it and fail the capture)
        thread = threading.Thread(target=lambda: waited.append(backend.synchronize(None)))
        thread.start()
        thread.join(0.2)
        assert waited == [] and "device 0 synchronized" not in cuda.events
        streams.append(thread)
        # out of memory: the pool must not free its cached blocks (memory captured kernels
        # use) to try again; the capture fails plainly instead
        cuda.out_of_memory = True
        with pytest.raises(RuntimeError, match="out of GPU memory while capturing") as raised:
            cuda.allocator(64)
        assert type(raised.value) is RuntimeError and "cached blocks freed" not in cuda.events
        cuda.out_of_memory = False
        return ()

    backend.capture(run)
    streams.pop().join()
    assert waited == [None] and cuda.events[-1] == "device 0 synchronized"
    backend.capture(lambda: streams.append(cuda.stream_made) or ())
    assert streams == [1, 1]  # one capture stream per GPU, used again


def test_the_cuda_graph_names_capture_uses_exist_in_cupy():
    cupy = pytest.importorskip("cupy")
    for name in ("MemoryPool", "Stream", "using_allocator", "Device", "alloc_pinned_memory",
                 "set_pinned_memory_allocator"):
        assert hasattr(cupy.cuda, name), name
    for name in ("begin_capture", "end_capture", "record", "wait_event"):
        assert hasattr(cupy.cuda.Stream, name), name
    assert hasattr(cupy.cuda.MemoryPool, "total_bytes") and hasattr(cupy.cuda.Graph, "launch")
    assert hasattr(cupy.cuda.runtime, "getDevice") and hasattr(cupy, "may_share_memory")
    assert hasattr(cupy.cuda.runtime, "CUDARuntimeError") and hasattr(cupy.cuda.memory, "_malloc")
    assert issubclass(cupy.cuda.runtime.CUDARuntimeError, Exception)
    assert hasattr(cupy.cuda, "get_current_stream") and hasattr(cupy, "copyto")
    pinned = cupy.cuda.pinned_memory
    assert all(hasattr(pinned, name) for name in ("PinnedMemory", "PooledPinnedMemory", "_malloc"))
    assert hasattr(cupy, "get_default_pinned_memory_pool")


# ============================================================ random generators (found by a review)
def test_manual_seed_takes_numpy_integers_and_refuses_bools():
    for seed in (np.int64(3), np.uint32(2 ** 32 - 1), np.int8(3)):
        gradcore.manual_seed(seed)
        got = np.random.rand(4)
        np.random.seed(int(seed))
        np.testing.assert_array_equal(got, np.random.rand(4))
    for seed in (True, np.True_, np.int64(-1), np.uint64(2 ** 32), np.float64(3.0)):
        with pytest.raises(ValueError, match=r"manual_seed: the seed must be an int in \[0, "):
            gradcore.manual_seed(seed)


@pytest.mark.parametrize("device", ["device1", "device2", "numpy"])
def test_dropout_in_another_thread_on_any_host_device_draws_past_a_set_back_block(device):
    """Every host-drawn backend and device draws from numpy.random's one generator: while a
    checkpointed block on device1 is computed again with that generator set back (its own
    np.random draw), another thread's dropout, on device1, device2 or NumPy, draws from where
    the generator stands for it (numbers 100..150), not the block's numbers again (50..100)."""
    ones = {"device1": STRICT.asarray(np.ones(50), device=DEVICE1),
            "device2": STRICT.asarray(np.ones(50), device=DEVICE2), "numpy": np.ones(50)}[device]
    go, done, got, calls = threading.Event(), threading.Event(), [], [0]

    def other_thread():
        go.wait(30)
        y = F.dropout(gradcore.Variable(ones), 0.5).data
        got.append(backends.backend_of(y).to_numpy(y) / 2)
        done.set()

    def block(x):
        calls[0] += 1
        own = np.random.rand(50)  # numbers 0..50, the block's own
        if calls[0] == 2:  # computed again in backward: the other thread draws now
            go.set()
            done.wait(30)
        own = gradcore.Variable(STRICT.asarray(own, device=DEVICE1), requires_grad=False)
        return F.dropout(x * own, 0.5)  # numbers 50..100

    thread = threading.Thread(target=other_thread)
    thread.start()
    gradcore.manual_seed(0)
    y = gradcore.checkpoint(block, gradcore.Variable(STRICT.asarray(np.ones(50), device=DEVICE1)))
    with pytest.raises(RuntimeError, match="something drew from the generator past the block"):
        F.sum(y).backward()  # the block's own np.random draw cannot be placed again: refused
    thread.join()
    np.random.seed(0)
    stream = np.random.rand(150)
    np.testing.assert_array_equal(got[0], stream[100:150] > 0.5)
