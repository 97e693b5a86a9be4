"""gradcore on Dask: Variables holding chunked, lazy arrays differentiate like any other, keep
sane chunks, train as on NumPy without growing their task graphs, and run unchanged on a
dask.distributed cluster. (Every op of the tables on Dask: tests/functions/test_ops_on_dask.py.)"""
import numpy as np
import pytest

import backends
import gradcore
import gradcore.functions as F
from gradcore import nn, optim
from gradcore.dataloaders import DataLoader
from gradcore.datasets import Spiral

da = pytest.importorskip("dask.array", reason="needs the dask extra: pip install 'gradcore[dask]'")
pytest.importorskip("array_api_compat", reason="needs the dask extra")
import dask  # noqa: E402


def test_a_dask_variable_differentiates_lazily_with_its_chunks():
    data = np.linspace(0.0, 3.0, 100_000)
    x = gradcore.Variable(da.from_array(data, chunks=10_000))
    assert x.backend.name == "dask" and x.device == "dask"
    y = F.sum(F.sin(x) * x)
    y.backward()
    assert isinstance(y.data, da.Array) and isinstance(x.grad.data, da.Array)  # not computed
    assert x.grad.data.chunks == x.data.chunks  # sum's backward did not make one chunk
    value, grad_sum = dask.compute(y.data, x.grad.data.sum())
    np.testing.assert_allclose(value, np.sum(np.sin(data) * data), rtol=1e-12)
    np.testing.assert_allclose(grad_sum, np.sum(np.sin(data) + data * np.cos(data)), rtol=1e-12)


def test_broadcasts_chunk_the_axes_they_make():
    xp = backends.get_backend("dask").xp
    big = xp.broadcast_to(da.ones((1, 4), chunks=(1, 2)), (10 ** 9, 4))
    assert big.chunks[1] == (2, 2)  # an axis the input has at full size keeps its chunks
    assert len(big.chunks[0]) > 1 and max(big.chunks[0]) * 4 * 8 <= 512 * 2 ** 20


def test_dask_is_a_device_for_to_modules_and_loaders():
    v = gradcore.Variable(np.arange(6.0)).to("dask")
    assert isinstance(v.data, da.Array) and v.device == "dask"
    model = nn.Linear(3, in_size=2).to("dask")
    assert all(isinstance(p.data, da.Array) for p in model.parameters())
    x, t = next(iter(DataLoader(Spiral(), 30, device="dask")))
    assert isinstance(x, da.Array) and isinstance(t, da.Array)
    np.testing.assert_array_equal(v.to("cpu").data, np.arange(6.0))


def spiral_losses(device, steps, optimizer=optim.SGD, client=None):
    """Losses of `steps` training steps of the spiral MLP on `device`, float64."""
    previous = gradcore.get_default_dtype()
    gradcore.set_default_dtype("float64")
    try:
        gradcore.manual_seed(0)
        model = nn.Sequential(nn.Linear(10, in_size=2), nn.BatchNorm(), nn.ReLU(),
                              nn.Linear(3, in_size=10)).to(device)
        opt = optimizer(model.parameters(), lr=0.1)
        losses = []
        for _, (x, t) in zip(range(steps), DataLoader(Spiral(), 30, shuffle=False,
                                                       device=device)):
            loss = F.softmax_cross_entropy(model(x), t)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, model, opt
    finally:
        gradcore.set_default_dtype(previous)


@pytest.mark.parametrize("optimizer", [optim.SGD, optim.MomentumSGD, optim.Adam])
def test_training_on_dask_matches_numpy_and_its_graphs_stay_small(optimizer):
    on_numpy, reference, _ = spiral_losses("cpu", 8, optimizer)
    on_dask, model, opt = spiral_losses("dask", 8, optimizer)
    np.testing.assert_allclose(on_dask, on_numpy, rtol=0, atol=1e-10)
    for p, q in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=0, atol=1e-10)
    # parameters and optimizer state are persisted at each step: one task each, not a history
    assert all(len(p.data.__dask_graph__()) == 1 for p in model.parameters())
    for state in (opt.state.get(p) or {} for p in model.parameters()):
        assert all(len(a.__dask_graph__()) == 1 for a in state.values())
    norm, ref_norm = model[1], reference[1]  # BatchNorm's running statistics moved on Dask too
    np.testing.assert_allclose(norm.avg_mean.numpy(), ref_norm.avg_mean.numpy(), atol=1e-12)
    assert not np.allclose(norm.avg_mean.numpy(), 0.0)


def test_it_runs_unchanged_on_a_distributed_cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client, \
            distributed.get_task_stream(client) as tasks:
        client.wait_for_workers(2, timeout=60)  # a worker still starting would not be listed
        workers = set(client.scheduler_info()["workers"])
        on_cluster, _, _ = spiral_losses("dask", 4)
    # the steps' tasks ran on the cluster's two workers, not in this process (read before the
    # steps: on a loaded machine the scheduler has listed none at the end, as they shut down)
    assert len(tasks.data) > 100 and len(workers) == 2
    assert {task["worker"] for task in tasks.data} <= workers
    on_numpy, _, _ = spiral_losses("cpu", 4)
    np.testing.assert_allclose(on_cluster, on_numpy, rtol=0, atol=1e-10)


def test_dask_is_imported_only_when_it_is_used():
    import subprocess
    import sys
    code = ("import sys, numpy, gradcore, gradcore.functions as F\n"
            "y = F.sum(F.sin(gradcore.Variable(numpy.ones(3))))\n"
            "y.backward()\n"
            "assert 'dask' not in sys.modules, 'imported without a Dask array in sight'\n"
            "gradcore.Variable(numpy.ones(3)).to('dask')\n"
            "assert 'dask' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_without_dask_the_device_says_what_to_install(monkeypatch):
    import sys
    from backends import dask_backend
    monkeypatch.setitem(sys.modules, "dask.array", None)
    with pytest.raises(backends.DeviceUnavailableError, match=r"pip install 'gradcore\[dask\]'"):
        dask_backend.import_dask()


def test_batchnorms_running_statistics_are_persisted_with_the_step():
    # written through [...] each forward, they held the graph of every batch before: after n
    # steps a recipe of ~50 n tasks that recomputed every earlier forward when read
    _, model, _ = spiral_losses("dask", 6)
    norm = model[1]
    for stat in (norm.avg_mean, norm.avg_var):
        assert len(stat.data.__dask_graph__()) == 1
    _, reference, _ = spiral_losses("cpu", 6)
    np.testing.assert_allclose(norm.avg_var.numpy(), reference[1].avg_var.numpy(), atol=1e-12)


def test_large_random_draws_are_made_by_dask_chunk_by_chunk():
    dask_device = backends.backend_for_device("dask")
    with dask.config.set({"array.chunk-size": "64KiB"}):
        gradcore.manual_seed(0)
        small = dask_device.random_normal((100,), "float64", None)  # NumPy's numbers
        large = dask_device.random_uniform((100_000,), "float32", None)  # Dask's, when computed
        gradcore.manual_seed(0)
        np.testing.assert_array_equal(small.compute(), np.random.randn(100))
        again = dask_device.random_uniform((100_000,), "float32", None)
        x = gradcore.Variable(da.ones((1000, 100), chunks=(100, 100)))
        with gradcore.using_config("train", True):
            kept = F.dropout(x, 0.5).data
    assert large.numblocks[0] > 1 and large.dtype == np.float32
    values = large.compute()
    assert 0 <= values.min() and values.max() < 1 and abs(values.mean() - 0.5) < 0.01
    np.testing.assert_array_equal(again.compute(), values)  # manual_seed decides them too
    assert kept.numblocks[0] > 1 and set(np.unique(kept.compute())) == {0.0, 2.0}


def test_printing_a_dask_variable_shows_its_recipe_without_computing_it():
    x = gradcore.Variable(da.ones(10 ** 12, chunks=10 ** 6))  # 8 TB if it were computed
    text = repr(F.sin(x))
    assert text.startswith("variable(dask.array<sin, shape=(1000000000000,)")
    assert "chunksize=(1000000,)" in text


def test_the_dask_device_takes_no_index():
    with pytest.raises(ValueError, match=r"'dask' is one device and takes no index; use 'dask'"):
        gradcore.Variable(np.ones(2)).to("dask:3")


def test_clip_grad_computes_a_step_once():
    reads = []

    def counted(block):
        if block.size:  # not Dask's probe for the result's type
            reads.append(block.shape)
        return block
    x = da.from_array(np.random.RandomState(0).randn(40, 3), chunks=(10, 3))
    x = gradcore.Variable(x.map_blocks(counted, dtype=x.dtype))
    model = nn.Linear(2, in_size=3).to("dask")
    opt = optim.SGD(model.parameters(), lr=0.1)
    opt.add_hook(optim.ClipGrad(1e-3))  # small: the gradients are scaled
    loss = F.sum(model(x) ** 2)
    loss.backward()
    opt.step()
    # the norm is read on the host and the parameters persisted: one pass over x for both
    assert len(reads) == 4, reads  # its 4 blocks, once each
    norm = np.sqrt(sum(float((p.grad.numpy() ** 2).sum()) for p in model.parameters()))
    assert abs(norm - 1e-3) < 1e-6


def _grads_on_numpy_and_dask(f, data, chunks):
    """[(f(x), x.grad as NumPy, x.grad's array)] on NumPy, then on Dask with x in `chunks`;
    f(x, c) makes its constants with c(array): on x's device."""
    results = []
    for x in (gradcore.Variable(data), gradcore.Variable(da.from_array(data, chunks=chunks))):
        y = f(x, lambda a: backends.asarray_on(np.asarray(a), x.device))
        y.backward()
        results.append((y.numpy(), x.grad.numpy(), x.grad.data))
    return results


A = np.arange(35.0).reshape(7, 5) / 10


@pytest.mark.parametrize("name, f", [
    ("rows", lambda x, c: F.sum(x[c([6, 0, 6])] ** 2 * c(np.arange(5.0)))),
    ("columns", lambda x, c: F.sum(x[:, c([4, 4, 0])] ** 2)),
    ("two arrays", lambda x, c: F.sum(x[c([6, 6, 1]), c([4, 4, 0])] ** 3)),
    ("row mask", lambda x, c: F.sum(x[c(np.array([1, 0, 0, 1, 0, 0, 1], bool))] ** 2)),
    ("embed_id", lambda w, c: F.sum(F.embed_id(c([[1, 1, 6], [0, 6, 6]]), w) ** 2)),
    ("double backward", lambda x, c: F.sum(gradcore.grad(
        F.sum(x[c([0, 0, 6])] ** 3), [x], create_graph=True)[0] ** 2)),
])
def test_index_array_gradients_of_arrays_chunked_along_every_axis(name, f):
    # scatter_add sums by bincount, which pairs blocks: the values flattened from a (3, 2)
    # chunking must be chunked as the positions
    (y, gx, _), (y_dask, gx_dask, grad) = _grads_on_numpy_and_dask(f, A, chunks=(3, 2))
    np.testing.assert_allclose(y_dask, y, rtol=1e-12)
    np.testing.assert_allclose(gx_dask, gx, rtol=1e-12)
    assert isinstance(grad, da.Array)


@pytest.mark.parametrize("shape", [(5, 7), (-1, 7), (35,), (5, 1, 7)])
def test_reshape_of_a_multi_chunk_array_is_any_reshape(shape):
    # Dask alone reshapes (7, 5) in chunks of (3, 2) only by merging or splitting axes evenly
    (y, gx, _), (y_dask, gx_dask, _) = _grads_on_numpy_and_dask(
        lambda x, c: F.sum(F.reshape(x, shape) ** 2 * c(np.arange(35.0).reshape(shape))),
        A, chunks=(3, 2))
    np.testing.assert_allclose(y_dask, y, rtol=1e-12)
    np.testing.assert_allclose(gx_dask, gx, rtol=1e-12)


def test_reshape_keeps_the_chunks_when_dask_can():
    xp = backends.get_backend("dask").xp
    x = da.ones((8, 6), chunks=(2, 3))
    assert xp.reshape(x, (8, 2, 3)).chunks == ((2, 2, 2, 2), (1, 1), (3,))  # a split
    assert xp.reshape(x, (4, 2, 6)).numblocks[0] == 4  # a split of the chunked leading axis
    assert xp.reshape(x, (6, 8)).numblocks[0] > 1  # through the flat array: not one chunk
