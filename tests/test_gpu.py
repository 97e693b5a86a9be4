"""CuPy on a real GPU: the cross-device rules, moving models and optimizers, checkpoints across
devices, and the demo. Marked `gpu`: skipped cleanly without CuPy and a CUDA device (the rest of
the suite runs on CuPy through the `xp` fixture as well)."""
import numpy as np
import pytest

import backends
import gradcore
import gradcore.functions as F
from gradcore import Variable, nn, optim
from test_compile import _training

pytestmark = pytest.mark.gpu


def _device(array):
    return backends.backend_of(array).device_of(array)


def test_numpy_and_cupy_inputs_give_the_clear_error():
    x = Variable(np.ones(2))
    y = Variable(np.ones(2)).to("cuda")
    with pytest.raises(TypeError, match=r"add: inputs are on cpu and cuda:0"):
        x + y
    assert x.creator is None and x.grad is None


def test_to_cuda_and_back_carries_gradients_across():
    x = Variable(np.array([1.0, 2.0, 3.0]))
    on_gpu = x.to("cuda")
    assert on_gpu.device == "cuda:0" and on_gpu.backend.name == "cupy"
    back = (on_gpu ** 2).to("cpu")
    assert back.device == "cpu" and type(back.data) is np.ndarray
    F.sum(back * 3.0).backward()
    assert x.grad.device == "cpu"
    np.testing.assert_allclose(x.grad.data, 6.0 * np.array([1.0, 2.0, 3.0]))


def test_to_gpu_and_to_cpu_move_a_leaf_in_place_with_its_grad():
    x = Variable(np.array([1.0, 2.0]))
    (x * x).sum().backward()
    x.to_gpu()
    assert x.device == "cuda:0" and x.grad.device == "cuda:0"
    x.to_cpu()
    assert x.device == "cpu" and type(x.grad.data) is np.ndarray
    np.testing.assert_allclose(x.grad.data, [2.0, 4.0])


def test_module_to_cuda_moves_parameters_gradients_and_optimizer_state():
    np.random.seed(0)
    model = nn.Linear(3, 2)
    opt = optim.MomentumSGD(lr=0.1).setup(model)
    x, t = np.random.randn(4, 3).astype(np.float32), np.random.randn(4, 2).astype(np.float32)
    loss = F.mean_squared_error(model(x), t)
    model.cleargrads()
    loss.backward()
    opt.update()  # the momentum state is made on the CPU
    model.to("cuda")
    for p in model.parameters():
        assert p.device == "cuda:0" and p.grad.device == "cuda:0"
    x_gpu, t_gpu = backends.to_device(x, "cuda"), backends.to_device(t, "cuda")
    model.cleargrads()
    F.mean_squared_error(model(x_gpu), t_gpu).backward()
    opt.update()  # the state follows its parameter
    for p in model.parameters():
        for array in opt.state.get(p).values():
            assert _device(array) == "cuda:0"


def test_save_on_gpu_and_load_on_cpu_round_trips(tmp_path):
    np.random.seed(1)
    model = nn.Linear(3, 2).to("cuda")
    path = tmp_path / "model.npz"
    model.save(path)
    assert all(p.device == "cuda:0" for p in model.parameters())  # saving left it there
    clone = nn.Linear(3, 2)
    clone.load(path)
    for p, q in zip(model.parameters(), clone.parameters()):
        assert q.device == "cpu"
        np.testing.assert_array_equal(q.data, p.numpy())


def test_the_demo_trains_on_cuda_as_on_cpu():
    from gradcore import demo

    on_cpu = demo.train_spiral(device="cpu", epochs=30, progress=False)
    on_gpu = demo.train_spiral(device="cuda", epochs=30, progress=False)
    assert on_gpu["device"] == "cuda" or str(on_gpu["device"]).startswith("cuda")
    assert on_gpu["accuracy"] > 0.95
    assert abs(on_gpu["accuracy"] - on_cpu["accuracy"]) < 0.03


def _batch(rng):
    return (backends.to_device(rng.standard_normal((32, 20)).astype(np.float32), "cuda"),
            backends.to_device(rng.integers(0, 10, 32), "cuda"))


def test_a_compiled_step_replays_through_cuda_graphs_as_the_eager_step():
    # check=True: every replay runs beside the eager step from the same state and must agree
    # bit for bit (check turns fusion off); from the third replay on, through CUDA graphs
    np.random.seed(0)
    _, _, step = _training(optim.Adam, layers=(64, 10))  # weights made on the GPU
    compiled = gradcore.compile(step, check=True)
    rng = np.random.default_rng(0)
    for _ in range(8):
        compiled(*_batch(rng))
    stats = compiled.stats()
    assert stats["graphs"][0] >= 1, stats["why not graphs"]
    assert stats["why not graphs"] == [] and stats["checked replays"] == 6
    cupy_backend = backends.get_backend("cupy")
    assert cupy_backend.graph_memory(backends.parse_device("cuda")) > 0


def test_results_of_cuda_graph_launches_are_the_callers():
    np.random.seed(1)
    _, _, step = _training(optim.Adam, layers=(64, 10))
    compiled = gradcore.compile(step)
    rng = np.random.default_rng(1)
    losses = [compiled(*_batch(rng)) for _ in range(8)]
    kept = [float(loss.data) for loss in losses]
    assert compiled.stats()["graphs"][0] >= 1
    for _ in range(2):
        compiled(*_batch(rng))
    assert [float(loss.data) for loss in losses] == kept  # later launches changed none


def test_dropout_draws_new_masks_at_every_replay_on_cuda():
    def step(x):
        h = F.tanh(F.tanh(Variable(x) * 2.0) * 3.0 + 1.0)
        return F.tanh(F.dropout(h, 0.5) * 2.0 + 1.0) * 3.0

    compiled = gradcore.compile(step)
    x = backends.to_device(np.ones(4096, dtype=np.float32), "cuda")
    masks = {compiled(x).numpy().tobytes() for _ in range(6)}
    assert len(masks) == 6 and compiled.stats()["graphs"][0] >= 1


def test_an_embedding_step_replays_through_cuda_graphs_with_its_bounds_checked():
    # the bounds check of the index array reads it on the host: it stays between graphs, which
    # copy the checked index array in at each launch
    W = gradcore.Parameter(backends.to_device(
        np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32), "cuda"))

    def step(x, t):
        loss = F.sum(F.tanh(W[t] * 2.0 + 1.0) * 3.0 * x)
        W.cleargrad()
        loss.backward()
        return loss

    compiled = gradcore.compile(step, check=True)
    rng = np.random.default_rng(1)
    for _ in range(12):  # past the captures a run makes before it stays lines
        compiled(backends.to_device(rng.standard_normal((16, 8)).astype(np.float32), "cuda"),
                 backends.to_device(rng.integers(0, 50, 16), "cuda"))
    stats = compiled.stats()
    assert stats["graphs"][0] >= 1 and stats["why not graphs"] == [], stats
    tape, = compiled.tapes()
    assert all(g.captures == 1 and g.launches == 9 for g in tape.graphed), [
        (g.captures, g.launches) for g in tape.graphed]
    with pytest.raises(IndexError):
        compiled(backends.to_device(np.ones((16, 8), np.float32), "cuda"),
                 backends.to_device(np.full(16, 50), "cuda"))


def test_two_threads_calling_a_step_of_two_cuda_graphs_get_their_own_results():
    import threading

    def step(x):
        h = F.tanh(Variable(x) * 2.0 + 1.0) * 3.0
        noise = F.dropout(Variable(x), 0.5) * 0.0  # a draw: two graphs, the second reads h
        return F.tanh(h * 0.5 + noise) * 2.0

    compiled = gradcore.compile(step)
    for i in range(4):
        compiled(backends.to_device(np.full(256, float(i), np.float32), "cuda"))
    assert compiled.stats()["graphs"][0] >= 2, compiled.stats()
    wrong = []

    def calls(start):
        for i in range(start, start + 100):
            x = np.full(256, i / 100.0, np.float32)
            want = np.tanh(np.tanh(x * 2.0 + 1.0) * 3.0 * 0.5) * 2.0
            got = compiled(backends.to_device(x, "cuda")).numpy()
            if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
                wrong.append(i)

    threads = [threading.Thread(target=calls, args=(start,)) for start in (0, 1000)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_a_checkpointed_dropout_repeats_its_mask_on_cuda_and_moves_the_generator_on():
    x = Variable(backends.to_device(np.ones(1000), "cuda"))
    gradcore.manual_seed(3)
    y = gradcore.checkpoint(lambda h: F.dropout(h, 0.5), x)
    after = F.dropout(Variable(backends.to_device(np.ones(1000), "cuda")), 0.5)
    F.sum(y).backward()
    mask = y.numpy()
    np.testing.assert_array_equal(x.grad.numpy(), mask)
    assert 300 < np.count_nonzero(mask) < 700
    assert not np.array_equal(after.numpy(), mask)  # the next draw is not the block's again


def _fused_kernels(compiled):
    """How many lines of the compiled step's tapes call a cupy.fuse kernel."""
    return sum(hasattr(line.target, "source") for tape in compiled.tapes() for line in tape.lines)


def test_elementwise_runs_on_large_arrays_fuse_into_kernels_that_agree_with_eager():
    # 2**20 float32 (4 MiB) is over fuse.FUSE_MIN_BYTES: the runs of elementwise lines of the
    # forward and of the backward become cupy.fuse kernels, whose results may differ from eager
    # CuPy's in the last bit (a contracted multiply-add), not more
    rng = np.random.default_rng(4)
    W = gradcore.Parameter(backends.to_device(
        rng.standard_normal(1 << 20).astype(np.float32), "cuda"))

    def step(x):
        h = F.tanh(W * x * 2.0 + 1.0) * 3.0 + F.exp(-(W * W)) - abs(x)
        loss = F.sum(h * h)
        W.cleargrad()
        loss.backward()
        return loss, W.grad

    compiled = gradcore.compile(step)
    for _ in range(6):
        x = backends.to_device(rng.standard_normal(1 << 20).astype(np.float32), "cuda")
        loss, gW = compiled(x)
        want_loss, want_gW = step(x)
        np.testing.assert_allclose(loss.numpy(), want_loss.numpy(), rtol=1e-5)
        np.testing.assert_allclose(gW.numpy(), want_gW.numpy(), rtol=1e-5, atol=1e-5)
    stats = compiled.stats()
    assert stats["replays"] == 5 and stats["fallbacks"] == 0, stats
    assert _fused_kernels(compiled) >= 2, [line.target for line in compiled.tapes()[0].lines]


def test_a_python_number_of_a_higher_kind_than_its_array_stays_unfused_on_cuda():
    # uint8 / 255.0 is float64 in eager CuPy; cupy.fuse would compute it in float16
    rng = np.random.default_rng(5)

    def step(u):
        return F.tanh(Variable(u / 255.0 * 2.0 - 1.0) * 3.0 + 0.5) * 2.0

    compiled = gradcore.compile(step)
    for _ in range(4):
        u = backends.to_device(rng.integers(0, 256, 1 << 19).astype(np.uint8), "cuda")
        got, want = compiled(u), step(u)
        assert got.dtype == want.dtype == np.float64
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
    assert compiled.stats()["replays"] == 3
