"""gradcore.functions.nn: dropout, batch_norm, embed_id; and gradcore.manual_seed. One row per op; tests/harness.py checks each."""
import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from float16_backends import float16_backends
from harness import Case, check_case, ids


# =============================================================================== NumPy references
def _stat_shape(x):
    return (0,) + tuple(range(2, x.ndim)), (1, x.shape[1]) + (1,) * (x.ndim - 2)


def np_batch_norm(x, gamma, beta, mean=None, var=None, eps=2e-5):
    """Train mode (no mean/var): the batch's statistics per channel; test mode: the given ones."""
    axes, shape = _stat_shape(x)
    if mean is None:
        mean, var = x.mean(axis=axes), x.var(axis=axes)
    return (gamma.reshape(shape) * (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
            + beta.reshape(shape))


def np_dropout(x, ratio, seed):
    """DeZero's dropout after np.random.seed(seed)."""
    np.random.seed(seed)
    mask = np.random.rand(*x.shape) > ratio
    return x * mask / (1.0 - ratio)


# =============================================================================== row helpers
def bn_train(x, gamma, beta):
    """batch_norm in train mode with fresh running statistics (updated in place, then dropped)."""
    C = x.shape[1]
    mean = x.backend.zeros((C,), x.dtype, x.device)
    var = x.backend.zeros((C,), x.dtype, x.device) + 1.0
    return F.batch_norm(x, gamma, beta, mean, var)


def bn_test(x, gamma, beta, mean, var):
    with gradcore.test_mode():
        return F.batch_norm(x, gamma, beta, mean, var)


def dropout_seeded(x, ratio=0.3, seed=7):
    gradcore.manual_seed(seed)  # the same mask on every call: forward is deterministic
    return F.dropout(x, ratio)


def dropout_test(x):
    with gradcore.test_mode():
        return F.dropout(x) * 1.0  # a graph node, so the row also checks that backward reaches x


MEAN3, VAR3 = np.array([0.5, -1.0, 0.25]), np.array([0.5, 2.0, 1.5])
IDS = np.array([[1, 3, 1], [0, 1, 4]])  # 1 three times: its row's gradient adds up
BYTE_IDS = np.array([[0, 65, 255], [7, 7, 1]], np.uint8)  # into 256 rows, which uint8 cannot hold
INT8_IDS = np.array([[-1, 127], [5, -128]], np.int8)      # into 200 rows: -1 + 200 overflows int8

# fmt: off
CASES = [
    Case("dropout",             dropout_seeded,                    lambda x: np_dropout(x, 0.3, 7), ((4, 5),)),
    Case("dropout-0-d",         lambda x: dropout_seeded(x, 0.5, 1), lambda x: np_dropout(x, 0.5, 1), ((),)),
    Case("dropout-test",        dropout_test,                      lambda x: x, ((2, 3),)),
    Case("batch_norm",          bn_train,                          np_batch_norm, ((5, 3), (3,), (3,))),
    Case("batch_norm-4d",       bn_train,                          np_batch_norm, ((2, 3, 2, 3), (3,), (3,))),
    Case("batch_norm-3d",       bn_train,                          np_batch_norm, ((3, 2, 4), (2,), (2,))),
    Case("batch_norm-test",     bn_test,                           np_batch_norm, ((4, 3), (3,), (3,)), args=(MEAN3, VAR3)),
    Case("batch_norm-test-4d",  bn_test,                           np_batch_norm, ((2, 3, 2, 2), (3,), (3,)), args=(MEAN3, VAR3)),
    Case("embed_id",            lambda W, x: F.embed_id(x, W),     lambda W, x: W[x], ((5, 3),), args=(IDS,)),
    Case("embed_id-uint8",      lambda W, x: F.embed_id(x, W),     lambda W, x: W[x], ((256, 2),), args=(BYTE_IDS,)),
    Case("embed_id-int8",       lambda W, x: F.embed_id(x, W),     lambda W, x: W[x], ((200, 2),), args=(INT8_IDS,)),
]
# fmt: on


def drawn_as_dropout_draws(xp, ratio, seed):
    """dropout's reference with the mask drawn from the generator dropout uses on `xp`'s device:
    CuPy's gives other numbers than NumPy's for one seed."""
    def ref(x):
        gradcore.manual_seed(seed)
        u = xp.numpy(xp.backend.random_uniform((x.size,), x.dtype.name, xp.device))
        return x * (u.reshape(x.shape) > ratio) / (1.0 - ratio)
    return ref


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_op(case, xp):
    if xp.name == "cupy" and case.name in ("dropout", "dropout-0-d"):
        ratio, seed = (0.3, 7) if case.name == "dropout" else (0.5, 1)
        case = case._replace(ref=drawn_as_dropout_draws(xp, ratio, seed))
    check_case(case, xp)


# =============================================================================== dropout
def test_dropout_train_mode_zeroes_and_scales(xp):
    gradcore.manual_seed(0)
    x = gradcore.Variable(xp.asarray(np.ones((100, 100))))
    y = F.dropout(x, 0.2)
    values = xp.numpy(y.data)
    kept = values != 0
    assert 0.75 < kept.mean() < 0.85
    np.testing.assert_allclose(values[kept], 1.25)  # 1 / (1 - 0.2)
    y.backward()
    np.testing.assert_array_equal(xp.numpy(x.grad.data), values)  # gy * mask, gy = ones


def test_dropout_test_mode_returns_x(xp):
    x = gradcore.Variable(xp.asarray(np.arange(6.0)))
    with gradcore.test_mode():
        assert F.dropout(x, 0.9) is x
    raw = xp.asarray(np.arange(3.0))
    with gradcore.test_mode():
        y = F.dropout(raw)
    assert isinstance(y, gradcore.Variable) and y.data is raw


@pytest.mark.parametrize("xp_name", ["numpy", "strict-device1"])
def test_dropout_masks_repeat_after_manual_seed_and_np_random_seed(xp_name):
    from conftest import CASES as BACKENDS

    xp = BACKENDS[xp_name]()
    x = gradcore.Variable(xp.asarray(np.ones((6, 7)), dtype="float32"))

    def mask():
        return xp.numpy(F.dropout(x).data)

    gradcore.manual_seed(42)
    first = mask()
    second = mask()
    gradcore.manual_seed(42)
    again = mask()
    np.random.seed(42)  # NumPy's global generator: a DeZero program's seeding works unchanged
    dezero = mask()
    assert first.dtype == np.float32
    assert not np.array_equal(first, second)  # the generator moves on
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, dezero)
    np.random.seed(42)
    np.testing.assert_array_equal(first, (np.random.rand(6, 7) > 0.5) * 2.0)


@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5, "0.5", True])
def test_dropout_rejects_bad_ratios(ratio):
    with pytest.raises(ValueError, match=r"dropout: dropout_ratio must be a number in \[0, 1\)"):
        F.dropout(gradcore.Variable(np.ones(3)), ratio)


def test_dropout_takes_numpy_scalar_ratios():
    x = gradcore.Variable(np.ones(4, dtype=np.float32))
    gradcore.manual_seed(0)
    y = F.dropout(x, np.float32(0.25))
    assert y.dtype == np.float32
    assert set(np.unique(y.data)) <= {0.0, np.float32(1 / 0.75)}


def test_dropout_rejects_integer_input():
    with pytest.raises(TypeError, match="dropout: x must be a floating-point array, got int64"):
        F.dropout(gradcore.Variable(np.arange(3)))


def test_manual_seed_rejects_bad_seeds():
    for seed in (-1, 2 ** 32, 1.5, "3", None):
        with pytest.raises(ValueError, match="manual_seed: the seed must be an int"):
            gradcore.manual_seed(seed)


# =============================================================================== batch_norm
@pytest.mark.parametrize("shape", [(6, 3), (2, 3, 4, 5)])
def test_batch_norm_updates_the_running_statistics_in_place(xp, shape):
    rng = np.random.default_rng(0)
    x = rng.normal(1.0, 2.0, shape)
    gamma, beta = rng.uniform(0.5, 1.5, 3), rng.uniform(-1, 1, 3)
    mean0, var0 = np.array([0.1, 0.2, 0.3]), np.array([1.0, 1.5, 2.0])
    mean, var = xp.asarray(mean0.copy()), xp.asarray(var0.copy())
    y = F.batch_norm(gradcore.Variable(xp.asarray(x)), xp.asarray(gamma), xp.asarray(beta),
                     mean, var, decay=0.8)

    axes, _ = _stat_shape(x)
    m = x.size // 3
    np.testing.assert_allclose(xp.numpy(mean), 0.8 * mean0 + 0.2 * x.mean(axis=axes), rtol=1e-12)
    # the running variance takes the unbiased batch variance (divided by m - 1), as DeZero
    np.testing.assert_allclose(xp.numpy(var), 0.8 * var0 + 0.2 * x.var(axis=axes, ddof=1),
                               rtol=1e-12)
    assert m > 1 and not np.allclose(x.var(axis=axes, ddof=1), x.var(axis=axes))
    np.testing.assert_allclose(xp.numpy(y.data), np_batch_norm(x, gamma, beta), rtol=1e-12)


def test_batch_norm_test_mode_uses_and_keeps_the_running_statistics(xp):
    rng = np.random.default_rng(1)
    x, gamma, beta = rng.standard_normal((4, 3)), rng.uniform(0.5, 1.5, 3), np.zeros(3)
    mean, var = xp.asarray(MEAN3.copy()), xp.asarray(VAR3.copy())
    with gradcore.test_mode():
        y = F.batch_norm(xp.asarray(x), xp.asarray(gamma), xp.asarray(beta), mean, var)
    np.testing.assert_array_equal(xp.numpy(mean), MEAN3)
    np.testing.assert_array_equal(xp.numpy(var), VAR3)
    np.testing.assert_allclose(xp.numpy(y.data), np_batch_norm(x, gamma, beta, MEAN3, VAR3),
                               rtol=1e-12)


def test_batch_norm_train_then_test_mode(xp):
    """Many steps on one batch: the running mean approaches the batch mean; test mode then
    normalises with it."""
    x = np.array([[1.0, 10.0], [3.0, 20.0], [5.0, 30.0]])
    mean, var = xp.asarray(np.zeros(2)), xp.asarray(np.ones(2))
    gamma = gradcore.Variable(xp.asarray(np.ones(2)))
    beta = gradcore.Variable(xp.asarray(np.zeros(2)))
    for _ in range(200):
        F.batch_norm(xp.asarray(x), gamma, beta, mean, var, decay=0.9)
    np.testing.assert_allclose(xp.numpy(mean), [3.0, 20.0], rtol=1e-8)
    np.testing.assert_allclose(xp.numpy(var), [4.0, 100.0], rtol=1e-8)  # unbiased: /(m - 1)
    with gradcore.test_mode():
        y = F.batch_norm(xp.asarray(x), gamma, beta, mean, var)
    expected = (x - [3.0, 20.0]) / np.sqrt(np.array([4.0, 100.0]) + 2e-5)
    np.testing.assert_allclose(xp.numpy(y.data), expected, rtol=1e-7, atol=1e-7)


def test_batch_norm_running_statistics_as_variables_and_in_another_dtype(xp):
    """Variables' data is updated in place; float32 x keeps float64 running statistics float64."""
    x = xp.asarray(np.array([[0.0, 1.0], [2.0, 5.0]]), dtype="float32")
    mean = gradcore.Variable(xp.asarray(np.zeros(2)), requires_grad=False)
    var = gradcore.Variable(xp.asarray(np.ones(2)), requires_grad=False)
    gamma = gradcore.Variable(xp.asarray(np.ones(2), dtype="float32"))
    y = F.batch_norm(x, gamma, xp.asarray(np.zeros(2), dtype="float32"), mean, var, decay=0.5)
    assert y.dtype == xp.float32 and mean.dtype == xp.float64
    np.testing.assert_allclose(xp.numpy(mean.data), [0.5, 1.5])
    np.testing.assert_allclose(xp.numpy(var.data), [0.5 + 0.5 * 2.0, 0.5 + 0.5 * 8.0])
    np.testing.assert_allclose(xp.numpy(y.data), [[-1.0, -1.0], [1.0, 1.0]], rtol=1e-4)


def test_batch_norm_counts_its_update_of_running_statistics_given_as_variables(xp):
    """A train-mode call writes the Variables' data in place: each version goes up once, so a
    graph that read them before refuses backward (it would take the new values); test mode
    writes nothing."""
    x = xp.asarray(np.array([[0.0, 1.0], [2.0, 5.0]]))
    gamma, beta = xp.asarray(np.ones(2)), xp.asarray(np.zeros(2))
    mean = gradcore.Variable(xp.asarray(np.zeros(2)), requires_grad=False)
    var = gradcore.Variable(xp.asarray(np.ones(2)), requires_grad=False)
    w = gradcore.Variable(xp.asarray(np.array([2.0, 3.0])))
    y = F.sum(mean * w)  # w's gradient is mean as it is now
    with gradcore.test_mode():
        F.batch_norm(x, gamma, beta, mean, var)
    assert (mean.version, var.version) == (0, 0)
    F.batch_norm(x, gamma, beta, mean, var, decay=0.5)
    assert (mean.version, var.version) == (1, 1)
    np.testing.assert_allclose(xp.numpy(mean.data), [0.5, 1.5])
    with pytest.raises(RuntimeError, match=r"mul: its input 0, .* was written after mul ran in "
                                           r"forward: it is at version 1, and mul used version 0"):
        y.backward()
    assert w.grad is None


def test_a_compiled_step_counts_batch_norms_update_at_every_replay():
    # the tape writes the running statistics without Python: it must count each write too
    mean = gradcore.Variable(np.zeros(2), requires_grad=False)
    var = gradcore.Variable(np.ones(2), requires_grad=False)

    def step(x):
        return F.batch_norm(x, np.ones(2), np.zeros(2), mean, var)

    compiled = gradcore.compile(step)
    x = np.array([[0.0, 1.0], [2.0, 5.0]])
    for calls in range(1, 5):
        compiled(x)
        assert (mean.version, var.version) == (calls, calls)
    assert compiled.stats()["replays"] >= 2
    # the mean after four updates towards [1, 3] with decay 0.9: (1 - 0.9 ** 4) * [1, 3]
    np.testing.assert_allclose(mean.data, (1 - 0.9 ** 4) * np.array([1.0, 3.0]), rtol=1e-12)


def test_batch_norm_gradients_sum_to_zero_over_the_batch(xp):
    """In train mode the output is invariant to shifting a channel: d/dx sums to 0 per channel."""
    rng = np.random.default_rng(2)
    x = gradcore.Variable(xp.asarray(rng.standard_normal((2, 3, 4, 4))))
    gamma = gradcore.Variable(xp.asarray(np.ones(3)))
    beta = gradcore.Variable(xp.asarray(np.zeros(3)))
    y = F.batch_norm(x, gamma, beta, xp.asarray(np.zeros(3)), xp.asarray(np.ones(3)))
    (y * xp.asarray(rng.standard_normal(y.shape))).sum().backward()
    np.testing.assert_allclose(xp.numpy(x.grad.data).sum(axis=(0, 2, 3)), 0.0, atol=1e-12)
    assert gamma.grad.shape == (3,) and beta.grad.shape == (3,)


@pytest.mark.parametrize("args, error, message", [
    (((4,), (4,), (4,), (4,), (4,)), ValueError,
     r"batch_norm: x must be \(N, C\) or \(N, C, \.\.\.\) with channels on axis 1, got "
     r"shape \(4,\)"),
    (((4, 3), (2,), (3,), (3,), (3,)), ValueError, r"batch_norm: gamma must have shape \(3,\)"),
    (((4, 3), (3,), (3,), (3,), (4,)), ValueError, r"batch_norm: var must have shape \(3,\)"),
    (((0, 3), (3,), (3,), (3,), (3,)), ValueError,
     r"batch_norm: x of shape \(0, 3\) has no value per channel"),
    (((1, 3), (3,), (3,), (3,), (3,)), ValueError,
     r"batch_norm: x of shape \(1, 3\) has one value per channel .* model.eval\(\)"),
])
def test_batch_norm_misuse_changes_nothing(xp, args, error, message):
    arrays = [xp.asarray(np.ones(s)) for s in args]
    before = [xp.numpy(a).copy() for a in arrays[3:]]
    with pytest.raises(error, match=message):
        F.batch_norm(gradcore.Variable(arrays[0]), *arrays[1:])
    for a, b in zip(arrays[3:], before):
        np.testing.assert_array_equal(xp.numpy(a), b)


def test_batch_norm_needs_arrays_for_the_running_statistics():
    with pytest.raises(TypeError, match="batch_norm: the running mean must be an array"):
        F.batch_norm(np.ones((2, 3)), np.ones(3), np.zeros(3), [0.0, 0.0, 0.0], np.ones(3))


def test_batch_norm_running_statistics_on_another_device():
    from conftest import CASES as BACKENDS

    xp = BACKENDS["strict-device1"]()
    with pytest.raises(ValueError, match="batch_norm: the running mean must be an array on x's"):
        F.batch_norm(xp.asarray(np.ones((2, 3))), xp.asarray(np.ones(3)), xp.asarray(np.zeros(3)),
                     np.zeros(3), np.ones(3))


# =============================================================================== embed_id
def test_embed_id_accumulates_repeated_ids(xp):
    W = gradcore.Variable(xp.asarray(np.arange(12.0).reshape(4, 3)))
    x = xp.asarray(np.array([[1, 1], [3, 1]]))
    y = F.embed_id(x, W)
    assert y.shape == (2, 2, 3)
    np.testing.assert_array_equal(xp.numpy(y.data)[1, 0], [9.0, 10.0, 11.0])
    y.backward()
    np.testing.assert_array_equal(xp.numpy(W.grad.data), [[0.0] * 3, [3.0] * 3, [0.0] * 3,
                                                          [1.0] * 3])


def test_embed_id_takes_negative_ids_and_python_ids(xp):
    W = gradcore.Variable(xp.asarray(np.arange(12.0).reshape(4, 3)))
    np.testing.assert_array_equal(xp.numpy(F.embed_id(xp.asarray(np.array([-1, 0])), W).data),
                                  [[9.0, 10.0, 11.0], [0.0, 1.0, 2.0]])
    np.testing.assert_array_equal(xp.numpy(F.embed_id(2, W).data), [6.0, 7.0, 8.0])
    y = F.embed_id([3, -1], W)
    y.backward()
    np.testing.assert_array_equal(xp.numpy(W.grad.data)[3], [2.0, 2.0, 2.0])


def test_embed_id_moves_numpy_ids_to_the_device_of_W(xp):
    # as W[ids] moves an index array, and the losses move NumPy labels (to a GPU, say)
    W = gradcore.Variable(xp.asarray(np.arange(6.0).reshape(3, 2)))
    y = F.embed_id(np.array([2, 0, 2]), W)
    assert y.device == W.device
    np.testing.assert_array_equal(xp.numpy(y.data), [[4.0, 5.0], [0.0, 1.0], [4.0, 5.0]])
    y.backward()
    np.testing.assert_array_equal(xp.numpy(W.grad.data), [[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]])
    ids = gradcore.Variable(np.array([1]), requires_grad=False)  # in a Variable, too
    np.testing.assert_array_equal(xp.numpy(F.embed_id(ids, W).data), [[2.0, 3.0]])


def test_embed_id_takes_a_numpy_scalar_id_as_it_takes_an_int(xp):
    # NumPy keeps np.int64(3) a scalar, which the op took for a number (AttributeError)
    W = gradcore.Variable(xp.asarray(np.arange(10.0).reshape(5, 2)))
    y = F.embed_id(np.int64(3), W)
    assert y.shape == F.embed_id(3, W).shape == (2,) and y.device == W.device
    np.testing.assert_array_equal(xp.numpy(y.data), [6.0, 7.0])
    y.backward()
    np.testing.assert_array_equal(xp.numpy(W.grad.data)[3], [1.0, 1.0])


@float16_backends
def test_embed_id_adds_repeated_float16_ids_up_in_float32(xp):
    # np.add.at (and CuPy's float16 atomics) add one value at a time in W's dtype: 20,000 x 0.1
    # into one float16 row came to 256
    W = gradcore.Variable(xp.asarray(np.zeros((3, 2)), dtype="float16"))
    y = F.embed_id(np.zeros(20_000, np.int64), W)
    y.backward(gradcore.Variable(xp.asarray(np.full((20_000, 2), 0.1), dtype="float16")))
    assert W.grad.dtype == np.float16
    exact = np.float16(20_000 * float(np.float16(0.1)))  # 1999.5, rounded once
    np.testing.assert_array_equal(xp.numpy(W.grad.data), [[exact, exact], [0.0, 0.0], [0.0, 0.0]])


def test_embed_id_adds_repeated_float32_ids_up_in_float64(xp):
    # np.add.at adds one value at a time in W's dtype: 200,000 x 0.1 into one float32 row came
    # to 19,959.5 (2,000,000 to 197,025: 1.5% off, PyTorch's figure too), where the Dask and
    # array-API backends gave the exact sum; ids repeated 256 times or fewer keep np.add.at
    n = 200_000
    W = gradcore.Variable(xp.asarray(np.zeros((3, 2)), dtype="float32"))
    ids = np.zeros(n, np.int64)
    ids[-300:] = 2  # 300 repeats: over FLOAT32_REPEATS too
    y = F.embed_id(ids, W)
    y.backward(gradcore.Variable(xp.asarray(np.full((n, 2), 0.1), dtype="float32")))
    tenth = float(np.float32(0.1))
    first, third = np.float32((n - 300) * tenth), np.float32(300 * tenth)  # each rounded once
    np.testing.assert_array_equal(xp.numpy(W.grad.data),
                                  [[first, first], [0.0, 0.0], [third, third]])


def test_an_array_api_index_gradient_of_float16_adds_up_in_float32():
    # the array API names no float16, but a library behind it may: its segment sum rounded each
    # run's partial sums to float16 at every step of the scan (811 for a total of 810.5)
    from backends.array_api_backend import ArrayAPIBackend
    float16_namespace = ArrayAPIBackend(np, np.ndarray, name="numpy_as_array_api")
    rng = np.random.RandomState(0)
    values = rng.rand(5000).astype(np.float16)
    rows = rng.randint(0, 3, 5000)
    total = float16_namespace.scatter_add(np.zeros(3, np.float16), (rows,), values)
    exact = np.bincount(rows, values.astype(np.float64), minlength=3)
    assert total.dtype == np.float16
    np.testing.assert_array_equal(total, exact.astype(np.float16))  # [810.5, 825, 849.5]


@pytest.mark.parametrize("ids, error, message", [
    (np.array([0, 4]), IndexError,
     r"embed_id: ids must be in \[-4, 4\) for a W of 4 rows; got ids from 0 to 4"),
    (np.array([-5, 1]), IndexError, r"embed_id: ids must be in \[-4, 4\)"),
    # past int64's range: no negative id (the last row) once compared in int64
    (np.array([0, 2**64 - 1], np.uint64), IndexError, r"got ids from 0 to 18446744073709551615"),
    (np.array([0.0, 1.0]), TypeError, r"embed_id: x must hold integer ids, got .*float64"),
])
def test_embed_id_rejects_bad_ids(xp, ids, error, message):
    W = gradcore.Variable(xp.asarray(np.ones((4, 3))))
    with pytest.raises(error, match=message):
        F.embed_id(xp.asarray(ids), W)


def test_manual_seed_with_cupy_imported_but_no_gpu_seeds_numpy():
    cupy = pytest.importorskip("cupy")
    gradcore.manual_seed(5)  # with a GPU this seeds CuPy too; without one it must not fail
    first = np.random.rand(3)
    gradcore.manual_seed(5)
    np.testing.assert_array_equal(np.random.rand(3), first)
    if gradcore.cuda_available():
        gradcore.manual_seed(5)
        a = cupy.random.random_sample(3)
        gradcore.manual_seed(5)
        np.testing.assert_array_equal(cupy.random.random_sample(3).get(), a.get())


def test_an_eval_mode_batch_norm_graph_keeps_the_statistics_it_used():
    # a train-mode call after it updates the running statistics in place: backward of the
    # eval-mode graph must use those its forward used
    rng = np.random.default_rng(0)
    mean, var = rng.standard_normal(3), rng.uniform(0.5, 2.0, 3)
    gamma, beta = gradcore.Variable(np.ones(3)), gradcore.Variable(np.zeros(3))

    def eval_grad(later_train_call):
        running_mean, running_var = mean.copy(), var.copy()
        x = gradcore.Variable(rng.standard_normal((4, 3)))
        with gradcore.test_mode():
            y = F.batch_norm(x, gamma, beta, running_mean, running_var)
        if later_train_call:
            F.batch_norm(gradcore.Variable(rng.standard_normal((4, 3)) * 5.0), gamma, beta,
                         running_mean, running_var)
        F.sum(y * y).backward()
        return x.grad.data

    rng = np.random.default_rng(1)
    want = eval_grad(False)
    rng = np.random.default_rng(1)
    np.testing.assert_array_equal(eval_grad(True), want)


def test_batch_norm_of_a_large_float16_batch_keeps_its_statistics_and_gradient():
    # 70,000 rows: float16 cannot hold m = 70,000 (sum / m would be inf, the gradient nan), and
    # NumPy's var of float16 sums its squares in float16 (0.27 for a variance of 1)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((70_000, 2))
    gy = rng.standard_normal((70_000, 2))
    x = gradcore.Variable(a.astype(np.float16))
    gamma = gradcore.Variable(np.array([1.0, 2.0], np.float16))
    beta = gradcore.Variable(np.zeros(2, np.float16))
    mean, var = np.zeros(2, np.float16), np.ones(2, np.float16)
    y = F.batch_norm(x, gamma, beta, mean, var, eps=2e-5)
    y.backward(gy.astype(np.float16))
    a16 = a.astype(np.float16).astype(np.float64)  # the reference, in float64 from x's values
    x_hat = (a16 - a16.mean(0)) / np.sqrt(a16.var(0) + 2e-5)
    gx = [1.0, 2.0] / np.sqrt(a16.var(0) + 2e-5) * (
        gy - gy.mean(0) - x_hat * (gy * x_hat).mean(0))
    assert y.dtype == x.grad.dtype == np.float16
    np.testing.assert_allclose(y.data, x_hat * [1.0, 2.0], atol=1e-2)
    np.testing.assert_allclose(x.grad.data, gx, atol=1e-2)
    np.testing.assert_allclose(var, 0.9 + 0.1 * a16.var(0, ddof=1), atol=1e-3)


@float16_backends
def test_batch_norm_of_float16_with_a_wide_spread_computes_in_float32(xp):
    # a spread of 300: the variance, 90,000, is inf in float16 (the output would be beta), and
    # so is (x - mean)^2 past 256 (inv_std would be 0, and so the gradients of x and gamma);
    # over 10,000 rows the sum of gy, 1,000, comes out 256 when added up in float16
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((10_000, 2)) * 300.0).astype(np.float16).astype(np.float64)
    gy = (0.1 + 0.05 * rng.standard_normal((10_000, 2))).astype(np.float16).astype(np.float64)
    x = gradcore.Variable(xp.asarray(a, dtype="float16"))
    gamma = gradcore.Variable(xp.asarray([1.0, 2.0], dtype="float16"))
    beta = gradcore.Variable(xp.asarray([0.0, 0.5], dtype="float16"))
    running_var = xp.asarray(np.ones(2), dtype="float16")
    y = F.batch_norm(x, gamma, beta, xp.asarray(np.zeros(2), dtype="float16"), running_var,
                     eps=2e-5)
    y.backward(xp.asarray(gy, dtype="float16"))
    inv_std = 1 / np.sqrt(a.var(0) + 2e-5)  # the reference, in float64 from x's values
    x_hat = (a - a.mean(0)) * inv_std
    gx = [1.0, 2.0] * inv_std * (gy - gy.mean(0) - x_hat * (gy * x_hat).mean(0))
    assert y.dtype == x.grad.dtype == gamma.grad.dtype == beta.grad.dtype == xp.float16
    np.testing.assert_allclose(xp.numpy(y.data), x_hat * [1.0, 2.0] + [0.0, 0.5], atol=1e-2)
    np.testing.assert_allclose(xp.numpy(x.grad.data), gx, atol=1e-5)  # |gx| ~ 2e-4
    np.testing.assert_allclose(xp.numpy(gamma.grad.data), (gy * x_hat).sum(0), rtol=1e-2)
    np.testing.assert_allclose(xp.numpy(beta.grad.data), gy.sum(0), rtol=1e-3)
    # 0.9 + 0.1 * 90,000 fits in float16, though 90,000 does not
    np.testing.assert_allclose(xp.numpy(running_var), 0.9 + 0.1 * a.var(0, ddof=1), rtol=1e-3)

    # eval mode, with running statistics (float32) that float16 cannot hold
    x = gradcore.Variable(xp.asarray([[300.0, -600.0]], dtype="float16"))
    with gradcore.test_mode():
        y = F.batch_norm(x, gamma, beta, xp.asarray(np.zeros(2), dtype="float32"),
                         xp.asarray(np.full(2, 90_000.0), dtype="float32"))
    y.backward()
    assert y.dtype == x.grad.dtype == xp.float16
    np.testing.assert_allclose(xp.numpy(y.data), [[1.0, -3.5]], rtol=1e-3)
    np.testing.assert_allclose(xp.numpy(x.grad.data), [[1 / 300, 2 / 300]], rtol=1e-3)


def test_raw_arrays_stay_constants_in_dropout_and_sum_to(xp):
    # a raw array passed to an op is a constant: no graph, no gradient (as in every op)
    a = xp.asarray(np.ones((2, 3)))
    for y in (F.dropout(a, 0.5), F.sum_to(a, (2, 3))):
        assert not y.requires_grad and y.creator is None
    with gradcore.test_mode():
        y = F.dropout(a, 0.5)
    assert not y.requires_grad and y.creator is None
    np.testing.assert_array_equal(xp.numpy(y.data), np.ones((2, 3)))
