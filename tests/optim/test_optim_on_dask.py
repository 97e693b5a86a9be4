"""Optimizers on Dask parameters: a step keeps each parameter's chunks, a step that fails when
Dask works it out changes nothing, and a step that updates nothing still works out what the
forwards queued."""
import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from gradcore import nn
from gradcore.optim import SGD, AdaGrad, Adam, FreezeParam, MomentumSGD

da = pytest.importorskip("dask.array", reason="needs the dask extra: pip install 'gradcore[dask]'")
pytest.importorskip("array_api_compat", reason="needs the dask extra")

W0 = np.arange(48.0).reshape(6, 8) / 10
G = [np.cos(np.arange(48.0)).reshape(6, 8), np.sin(np.arange(48.0)).reshape(6, 8)]
CHUNKS = ((2, 2, 2), (4, 4))
OPTIMIZERS = [(SGD, {"lr": 0.1}), (MomentumSGD, {"lr": 0.1}), (AdaGrad, {}), (Adam, {})]
IDS = [cls.__name__ for cls, _ in OPTIMIZERS]


def _steps(cls, hyper, grads, chunks=None):
    """W0 after a step with each of `grads` (arrays, or Dask arrays for a Dask W); the
    optimizer and W."""
    W = gradcore.Parameter(W0.copy() if chunks is None else da.from_array(W0, chunks=chunks))
    optimizer = cls([W], **hyper)
    for g in grads:
        W.grad = gradcore.Variable(g, requires_grad=False)
        optimizer.step()
    return optimizer, W


@pytest.mark.parametrize("cls, hyper", OPTIMIZERS, ids=IDS)
def test_a_step_keeps_the_parameters_chunks_whatever_its_gradients(cls, hyper):
    # the update took Dask's common refinement of the parameter's and the gradient's chunks:
    # ((2, 1, 1, 2), (3, 1, 2, 2)) here after one step, finer with each other gradient
    grads = [da.from_array(G[0], chunks=(3, (3, 3, 2))), da.from_array(G[1], chunks=(4, 5))]
    optimizer, W = _steps(cls, hyper, grads, CHUNKS)
    assert W.data.chunks == CHUNKS
    assert all(a.chunks == CHUNKS for a in optimizer.state.get(W, {}).values())
    expected, reference = _steps(cls, hyper, G)
    np.testing.assert_allclose(W.data.compute(), reference.data, rtol=1e-12)
    for name, a in optimizer.state.get(W, {}).items():
        np.testing.assert_allclose(a.compute(), expected.state[reference][name], rtol=1e-12)


def _fails(block):
    raise IndexError("worked out, this block fails")


@pytest.mark.parametrize("cls, hyper", OPTIMIZERS, ids=IDS)
def test_a_step_that_fails_when_worked_out_changes_nothing(cls, hyper):
    # on Dask a bad label raises only when the step is worked out (persisted): the parameter
    # and its state then held the failing recipe, and every later read, step or save raised
    optimizer, W = _steps(cls, hyper, [da.from_array(G[0], chunks=CHUNKS)], CHUNKS)
    data = W.data.compute()
    state = {name: a.compute() for name, a in optimizer.state.get(W, {}).items()}
    counts = dict(optimizer.state_counts.get(W) or {})
    W.grad = gradcore.Variable(
        da.from_array(G[1], chunks=CHUNKS).map_blocks(_fails, meta=np.array((), float)),
        requires_grad=False)
    with pytest.raises(IndexError, match="this block fails"):
        optimizer.step()
    np.testing.assert_array_equal(W.data.compute(), data)
    assert optimizer.state.get(W, {}).keys() == state.keys()
    for name, a in optimizer.state.get(W, {}).items():
        np.testing.assert_array_equal(a.compute(), state[name])
    assert dict(optimizer.state_counts.get(W) or {}) == counts
    optimizer.state_dict()  # reads every state array
    W.grad = gradcore.Variable(da.from_array(G[1], chunks=CHUNKS), requires_grad=False)
    optimizer.step()  # the good step goes on as if the failed one had never been
    expected, reference = _steps(cls, hyper, G)
    np.testing.assert_allclose(W.data.compute(), reference.data, rtol=1e-12)


def test_a_first_step_that_fails_leaves_no_state():
    W = gradcore.Parameter(da.from_array(W0, chunks=CHUNKS))
    optimizer = Adam([W])
    W.grad = gradcore.Variable(
        da.from_array(G[0], chunks=CHUNKS).map_blocks(_fails, meta=np.array((), float)),
        requires_grad=False)
    with pytest.raises(IndexError, match="this block fails"):
        optimizer.step()
    assert optimizer.state.get(W) is None and optimizer.state_counts.get(W) is None
    np.testing.assert_array_equal(W.data.compute(), W0)


def test_a_step_that_updates_nothing_works_out_the_running_statistics():
    # every parameter frozen: the statistics were persisted only with an updated Dask
    # parameter, so their graph grew by a forward at each step (49, 107, 167 tasks at 1, 30, 60)
    x = np.random.RandomState(1).randn(24, 6)
    norms = []
    for device, data in (("cpu", x), ("dask", da.from_array(x, chunks=(6, 3)))):
        gradcore.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, in_size=6), nn.BatchNorm()).to(device)
        optimizer = SGD(model.parameters(), lr=0.1)
        optimizer.add_hook(FreezeParam(model))
        for _ in range(4):
            loss = F.sum(model(data) ** 2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        norms.append(model[1])
    for stat in (norms[1].avg_mean, norms[1].avg_var):
        assert len(stat.data.__dask_graph__()) == 1
    np.testing.assert_allclose(norms[1].avg_mean.numpy(), norms[0].avg_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(norms[1].avg_var.numpy(), norms[0].avg_var.numpy(), rtol=1e-12)
