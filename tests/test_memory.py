"""Memory: graphs are freed by reference counting alone (no cycles); memory stays flat in a loop."""
import gc
import resource
import sys
import weakref

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from gradcore import Variable, nn, optim


def _one_graph(x_data):
    """Build y = square(square(square(x))) and backpropagate. Returns x and weak references to
    the graph (every Function, output and output array) and to x's gradient and its array."""
    x = Variable(x_data)
    a = F.square(x)
    b = F.square(a)
    y = F.square(b)
    y.backward()
    graph = [a.creator, b.creator, y.creator, a, b, y, a.data, b.data, y.data]
    assert all(v.grad is None for v in (a, b, y))  # retain_grad=False: nothing else holds arrays
    return x, [weakref.ref(o) for o in graph], [weakref.ref(x.grad), weakref.ref(x.grad.data)]


def _alive(refs):
    return [i for i, r in enumerate(refs) if r() is not None]


def _collected_by_refcount(run):
    """Run `run()` with the cycle collector off; returns what it returns."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        return run()
    finally:
        if was_enabled:
            gc.enable()


def test_graphs_die_by_reference_counting(xp2):
    data = xp2.asarray(np.linspace(-1.0, 1.0, 1000))

    def run():
        for _ in range(20):
            x, graph, grad = _one_graph(data)
            # y went out of scope: outputs are held weakly, so the whole graph went with it
            assert _alive(graph) == [], "graph objects outlived the output"
            assert _alive(grad) == [0, 1]  # x.grad is x's until x goes
            expected = 8 * np.linspace(-1.0, 1.0, 1000) ** 7  # d/dx x^8
            np.testing.assert_allclose(xp2.numpy(x.grad.data), expected, rtol=1e-14)
            del x
            assert _alive(grad) == []

    _collected_by_refcount(run)


def _peak_mb():
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2 ** 20 if sys.platform == "darwin" else peak / 2 ** 10  # bytes vs KiB


@pytest.mark.skipif(sys.platform == "win32", reason="resource is POSIX only")
def test_a_1000_graph_loop_frees_everything_and_memory_stays_flat():
    data = np.linspace(-1.0, 1.0, 100_000)  # 0.8 MB per array; a leak of one adds 800 MB

    def run():
        peaks = {}
        for i in range(1, 1001):
            x, graph, grad = _one_graph(data)
            del x
            alive = _alive(graph + grad)
            assert alive == [], f"iteration {i}: objects {alive} outlived their graph"
            if i in (100, 1000):
                peaks[i] = _peak_mb()
        return peaks

    peaks = _collected_by_refcount(run)
    growth = peaks[1000] - peaks[100]
    assert growth < 8, f"peak RSS grew from {peaks[100]:.1f} to {peaks[1000]:.1f} MB"


# ====================================================================== what the library keeps
def test_an_optimizer_stepping_in_a_post_accumulate_hook_goes_with_its_model():
    """PyTorch's optimizer in backward: a hook stepping its parameter's optimizer refers to the
    parameter (through `opts`). That cycle is the user's; the library adds no root that keeps
    it, so the collector frees model and optimizers once dropped."""
    def train():
        model = nn.Linear(2, 1)
        model.W.data = np.array([[1.0], [2.0]])
        opts = {p: optim.SGD([p], lr=0.5) for p in model.parameters()}

        def step(p):
            opts[p].step()
            p.cleargrad()
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(step)
        F.sum(model(np.array([[1.0, 3.0]]))).backward()
        assert model.W.data.tolist() == [[0.5], [0.5]] and model.W.grad is None  # stepped
        return [weakref.ref(o) for o in (*model.parameters(), *opts.values())]

    refs = _collected_by_refcount(train)
    gc.collect()
    assert _alive(refs) == []


def test_a_post_accumulate_hook_holds_no_reference_to_its_leaf():
    def run():
        w = Variable(np.array([1.0, 2.0]))
        seen = []
        handle = w.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.data.tolist()))
        F.sum(w * w).backward()
        hooked = len(gradcore.engine.hooked_leaves)
        assert seen == [[2.0, 4.0]] and w in gradcore.engine.hooked_leaves
        ref = weakref.ref(w)
        del w
        assert ref() is None and len(gradcore.engine.hooked_leaves) == hooked - 1
        handle.remove()  # its leaf gone: nothing to do

    _collected_by_refcount(run)
