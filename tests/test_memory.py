"""Memory: graphs are freed by reference counting alone (no cycles); memory stays flat in a loop."""
import gc
import resource
import sys
import weakref

import numpy as np
import pytest

import gradcore.functions as F
from gradcore import Variable


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
