"""Optimizers on Dask parameters: a step keeps each parameter's chunks, a step that fails when
Dask works it out changes nothing, and a step that updates nothing still works out what the
forwards queued."""
import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from gradcore import nn
from gradcore.optim import (SGD, AdaDelta, AdaGrad, Adam, AdamW, ClipGrad, FreezeParam,
                            MomentumSGD, WeightDecay)

da = pytest.importorskip("dask.array", reason="needs the dask extra: pip install 'gradcore[dask]'")
pytest.importorskip("array_api_compat", reason="needs the dask extra")

W0 = np.arange(48.0).reshape(6, 8) / 10
G = [np.cos(np.arange(48.0)).reshape(6, 8), np.sin(np.arange(48.0)).reshape(6, 8)]
CHUNKS = ((2, 2, 2), (4, 4))
OPTIMIZERS = [(SGD, {"lr": 0.1}), (MomentumSGD, {"lr": 0.1}), (AdaGrad, {}), (AdaDelta, {}),
              (Adam, {}), (AdamW, {})]
IDS = [cls.__name__ for cls, _ in OPTIMIZERS]


def _steps(cls, hyper, grads, chunks=None, dtype=np.float64):
    """W0 in `dtype` after a step with each of `grads` (arrays, or Dask arrays for a Dask W); the
    optimizer and W."""
    w = W0.astype(dtype)
    W = gradcore.Parameter(w if chunks is None else da.from_array(w, chunks=chunks))
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


def _failing_grad(g, dtype):
    return gradcore.Variable(da.from_array(g.astype(dtype), chunks=CHUNKS).map_blocks(
        _fails, meta=np.array((), dtype)), requires_grad=False)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("cls, hyper", OPTIMIZERS, ids=IDS)
def test_a_step_that_fails_when_worked_out_changes_nothing(cls, hyper, dtype):
    # on Dask a bad label raises only when the step is worked out (persisted): the parameter
    # and its state then held the failing recipe, and every later read, step or save raised.
    # A float16 parameter's update was assigned into its own array, which the step could not
    # put back (and whose failing recipe every later persist worked out again); Adam's t
    # stayed one ahead (2 where NumPy's is 1: its lr and state_dict said so)
    grads = [G[0].astype(dtype), G[1].astype(dtype)]
    optimizer, W = _steps(cls, hyper, [da.from_array(grads[0], chunks=CHUNKS)], CHUNKS, dtype)
    data = W.data.compute()
    state = {name: a.compute() for name, a in optimizer.state.get(W, {}).items()}
    counts = dict(optimizer.state_counts.get(W) or {})
    counters = optimizer.state_dict()["counters"]
    W.grad = _failing_grad(grads[1], dtype)
    with pytest.raises(IndexError, match="this block fails"):
        optimizer.step()
    assert W.dtype == dtype
    np.testing.assert_array_equal(W.data.compute(), data)
    assert optimizer.state.get(W, {}).keys() == state.keys()
    for name, a in optimizer.state.get(W, {}).items():
        np.testing.assert_array_equal(a.compute(), state[name])
    assert dict(optimizer.state_counts.get(W) or {}) == counts
    assert optimizer.state_dict()["counters"] == counters  # reads every state array too
    W.grad = gradcore.Variable(da.from_array(grads[1], chunks=CHUNKS), requires_grad=False)
    optimizer.step()  # the good step goes on as if the failed one had never been
    expected, reference = _steps(cls, hyper, grads, dtype=dtype)
    saved, expected_saved = optimizer.state_dict(), expected.state_dict()
    assert saved["counters"] == expected_saved["counters"]  # Adam's t: 2, as on NumPy
    assert W.dtype == dtype
    np.testing.assert_array_equal(W.data.compute(), reference.data)
    for name, a in expected_saved["state"].get(0, {}).items():
        np.testing.assert_array_equal(saved["state"][0][name], a)


@pytest.mark.parametrize("cls, hyper", OPTIMIZERS, ids=IDS)
def test_a_step_that_fails_when_worked_out_leaves_the_gradients_its_hooks_changed(cls, hyper):
    # the hooks' grads (weight decay added, clipped) stayed: a step tried again with the
    # gradients mended in place of the failing ones would have seen them decayed twice
    W = gradcore.Parameter(da.from_array(W0, chunks=CHUNKS))
    frozen = gradcore.Parameter(da.from_array(W0, chunks=CHUNKS))
    optimizer = cls([W, frozen], **hyper)
    for hook in (WeightDecay(0.5), ClipGrad(1.0), FreezeParam(frozen)):
        optimizer.add_hook(hook)
    grads = [_failing_grad(G[0], np.float64),
             gradcore.Variable(da.from_array(G[1], chunks=CHUNKS), requires_grad=False)]
    W.grad, frozen.grad = grads
    with pytest.raises(IndexError, match="this block fails"):
        optimizer.step()
    assert W.grad is grads[0] and frozen.grad is grads[1]
    np.testing.assert_array_equal(W.data.compute(), W0)


@pytest.mark.parametrize("cls", [SGD, Adam])
def test_a_hook_that_raises_leaves_every_gradient_as_backward_left_it(cls):
    # WeightDecay, ClipGrad and FreezeParam had set new grads before the failing hook raised:
    # a step tried again decayed and clipped them twice
    W, b, frozen = (gradcore.Parameter(da.from_array(np.asarray(v), chunks=1))
                    for v in ([3.0, 4.0], [1.0], [5.0]))
    grads = [gradcore.Variable(da.from_array(np.asarray(v), chunks=1), requires_grad=False)
             for v in ([30.0, 40.0], [2.0], [7.0])]
    W.grad, b.grad, frozen.grad = grads

    def failing(params):
        raise RuntimeError("this hook fails")

    optimizer = cls([W, b, frozen])
    for hook in (WeightDecay(0.5), ClipGrad(1.0), failing, FreezeParam(frozen)):
        optimizer.add_hook(hook)
    with pytest.raises(RuntimeError, match="this hook fails"):
        optimizer.step()
    assert all(p.grad is g for p, g in zip((W, b, frozen), grads))  # the Variables themselves
    assert [p.data.compute().tolist() for p in (W, b, frozen)] == [[3.0, 4.0], [1.0], [5.0]]
    assert getattr(optimizer, "t", 0) == 0


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_a_first_step_that_fails_leaves_no_state(dtype):
    W = gradcore.Parameter(da.from_array(W0.astype(dtype), chunks=CHUNKS))
    optimizer = Adam([W])
    W.grad = _failing_grad(G[0], dtype)
    with pytest.raises(IndexError, match="this block fails"):
        optimizer.step()
    assert optimizer.state.get(W) is None and optimizer.state_counts.get(W) is None
    assert optimizer.t == 0
    np.testing.assert_array_equal(W.data.compute(), W0.astype(dtype))


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
