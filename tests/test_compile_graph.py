"""gradcore.compile's device graphs (graph.py), on NumPy with a stand-in for CUDA graphs.

Every test of test_compile.py runs here again with the stand-in on and runs of one device line
or more captured: a replay through graphs must give what eager code gives, bit for bit, in every
case those tests cover. The tests below are about graphs themselves.
"""
import functools

import numpy as np
import pytest

import backends
import gradcore
import gradcore.functions as F
from conftest import run_in_threads
from gradcore import optim
from gradcore.compile import graph as graphs_module
from test_compile import *  # noqa: F401,F403 (collected again, with graphs on)
from test_compile import _batches, _training, same


class StandInGraphs:
    """Stands in for CUDA graphs on NumPy (NumPy has none: CuPy's role).

    CUDA computes nothing while capturing and everything at each launch; the stand-in computes
    at the capture and skips the first launch, which the caller sees alike. Later launches run
    the captured work again on the same arrays: what it read, as they are then; its results
    written into the first results' memory (a graph's results are the same memory at every
    launch: a NumPy scalar among them becomes a 0-d array); the random numbers of the capture
    drawn again, and the generator left where it was (a graph repeats its draws)."""

    def __init__(self, backend=backends.NUMPY):
        self.backend = backend  # whose arrays it captures
        self.captures = 0
        self.launches = 0
        self.refuse = None  # a message: the next capture fails with it, as CUDA refuses a wait
        self.allowed = None  # how many captures succeed before the refusals start

    def capture(self, run):
        if self.refuse is not None and (self.allowed is None or self.captures >= self.allowed):
            raise RuntimeError(self.refuse)
        self.captures += 1
        state = np.random.get_state()  # NumPy's generator: the array-API backend's too
        results = tuple(np.array(r) if isinstance(r, np.generic) else r for r in run())
        return _StandInGraph(self, run, results, state), results


class _StandInGraph:
    def __init__(self, owner, run, results, state):
        self.owner, self.run, self.results, self.state = owner, run, results, state
        self.captured = True  # the capture computed what the first launch would

    def launch(self, copies=()):
        backend = self.owner.backend
        self.owner.launches += 1
        for buffer, value in copies:
            backend.assign(buffer, value)
        if self.captured:
            self.captured = False
            return
        now = np.random.get_state()
        np.random.set_state(self.state)
        try:
            results = self.run()
        finally:
            np.random.set_state(now)
        for static, result in zip(self.results, results):
            if backend.owns(static):
                backend.assign(static, result)


@pytest.fixture(autouse=True)
def graph_stand_in(monkeypatch):
    """A StandInGraphs as NumPy's graphs, capturing runs of any length, for every test here."""
    stand_in = StandInGraphs()
    monkeypatch.setattr(backends.NUMPY, "captures_graphs", True, raising=False)
    monkeypatch.setattr(backends.NUMPY, "capture", stand_in.capture, raising=False)
    monkeypatch.setattr(graphs_module, "GRAPH_MIN_LINES", 1)
    return stand_in


def test_a_training_step_replays_through_graphs(graph_stand_in):
    eager_model, _, eager_step = _training(optim.Adam)
    model, _, step = _training(optim.Adam)
    compiled = gradcore.compile(step)
    kept = []
    for i, (x, t) in enumerate(_batches(8)):
        np.random.seed(i)  # the lazy weights draw from it
        expected = eager_step(x, t)
        np.random.seed(i)
        got = compiled(x, t)
        kept.append((got, expected))
        for p, q in zip(model.params(), eager_model.params()):
            assert same(p.data, q.data) and same(p.grad, q.grad)
    # a result is the caller's: the launches after it changed nothing in it
    assert all(same(got, expected) for got, expected in kept)
    stats = compiled.stats()
    assert stats["graphs"][0] >= 1 and stats["why not graphs"] == []
    assert graph_stand_in.captures == stats["graphs"][0]
    # weights made, recorded, 2 replays as lines, then 4 through the graphs
    assert graph_stand_in.launches == 4 * graph_stand_in.captures


def test_new_arguments_are_copied_in_and_grads_copied_out(graph_stand_in):
    def step(x0):
        x = gradcore.Variable(x0)
        y = F.sum(F.tanh(x) * x)
        y.backward()
        return y, x.grad

    compiled = gradcore.compile(step)
    rng = np.random.default_rng(0)
    results = []
    for _ in range(6):
        x0 = rng.standard_normal(5)
        results.append((x0, compiled(x0)))
    assert graph_stand_in.launches > 0
    for x0, got in results:  # each kept its values through the launches after it
        assert same(got, step(x0))


def test_a_parameter_replaced_between_calls_is_read_as_it_is_now(graph_stand_in):
    w = gradcore.Parameter(np.ones(3))

    def step(x0):
        return F.sum(gradcore.Variable(x0) * w * 2.0 + 1.0)

    compiled = gradcore.compile(step)
    x0 = np.arange(3.0)
    for _ in range(4):
        assert same(compiled(x0), step(x0))
    captures = graph_stand_in.captures
    w.data = np.full(3, 5.0)  # another array: the graph read the old one
    assert same(compiled(x0), step(x0))
    assert same(compiled(x0), step(x0))
    assert graph_stand_in.captures == captures + 1  # captured again, the new array staged
    w.data[...] = 7.0  # in place, read as it is at the next launch
    assert same(compiled(x0), step(x0))
    w.data = np.full(3, 2.0)  # staged now: copied in, no capture
    assert same(compiled(x0), step(x0)) and graph_stand_in.captures == captures + 1


def test_a_step_updating_weights_by_assignment_replays_through_graphs(graph_stand_in):
    w0 = np.random.default_rng(0).standard_normal((3, 2))
    w, eager_w = gradcore.Parameter(w0.copy()), gradcore.Parameter(w0.copy())

    def make(w):
        def step(x0):
            loss = F.sum(F.matmul(gradcore.Variable(x0), w) ** 2)
            w.cleargrad()
            loss.backward()
            w.data = w.data - 0.1 * w.grad.data  # a new array at every call: staged
            return loss
        return step

    compiled, eager = gradcore.compile(make(w)), make(eager_w)
    rng = np.random.default_rng(1)
    for _ in range(6):
        x0 = rng.standard_normal((4, 3))
        assert same(compiled(x0), eager(x0))
        assert same(w.data, eager_w.data)
    assert graph_stand_in.launches > 0 and compiled.stats()["why not graphs"] == []


def test_random_draws_stay_out_of_graphs_and_differ_at_every_call(graph_stand_in):
    def step(x0):
        return F.dropout(gradcore.Variable(x0) * 2.0, 0.5) + 1.0

    compiled = gradcore.compile(step)
    x0 = np.ones(64)
    masks = []
    for i in range(6):
        np.random.seed(i)
        got = compiled(x0)
        np.random.seed(i)
        assert same(got, step(x0))
        masks.append(got.data.tobytes())
    assert len(set(masks)) == 6 and graph_stand_in.launches > 0


def test_a_step_writing_into_its_argument_keeps_the_run_as_lines(graph_stand_in):
    def step(x0):
        x = gradcore.Variable(x0)
        y = x * 2.0
        np.multiply(x.data, 3.0, out=x.data)  # the caller's array, in place
        return y + 1.0

    compiled = gradcore.compile(step)
    for i in range(5):
        a, b = np.full(3, float(i)), np.full(3, float(i))
        assert same(compiled(a), step(b)) and same(a, b)
    why = compiled.stats()["why not graphs"]
    assert why and "writes in place into an array that is new at every call" in why[0]


def test_a_run_the_library_refuses_to_capture_runs_as_lines(graph_stand_in):
    graph_stand_in.refuse = "operation not permitted when stream is capturing"
    kept = []
    compiled = gradcore.compile(lambda x0: F.exp(gradcore.Variable(x0)) * 3.0)
    for i in range(7):  # captures tried at the 4th, 5th and 6th calls
        x0 = np.full(2, float(i))
        kept.append(compiled(x0))
        assert same(kept[-1], F.exp(gradcore.Variable(x0)) * 3.0)
    stats = compiled.stats()
    assert stats["graphs"] == [0] and graph_stand_in.launches == 0
    assert "the capture failed: RuntimeError: operation not permitted" in stats[
        "why not graphs"][0]
    assert "(3 captures)" in stats["why not graphs"][0]


def test_a_capture_the_library_refused_once_is_tried_again(graph_stand_in):
    # refused while, say, another thread waited for the whole GPU: the next call captures
    graph_stand_in.refuse, graph_stand_in.allowed = "capture invalidated", 0
    compiled = gradcore.compile(lambda x0: F.exp(gradcore.Variable(x0)) * 3.0)
    for i in range(6):
        if i == 3:
            graph_stand_in.refuse = None
        x0 = np.full(2, float(i))
        assert same(compiled(x0), F.exp(gradcore.Variable(x0)) * 3.0)
    stats = compiled.stats()
    assert stats["graphs"] == [1] and stats["why not graphs"] == [] and graph_stand_in.launches


def _graphed_calls(compiled):
    """The names of what the lines inside the compiled step's graphs call."""
    return {getattr(line.target, "__name__", line.target) for tape in compiled.tapes()
            for run in tape.graphed if run.graph is not None for line in run.lines}


@pytest.mark.parametrize("refused", [False, True])
def test_calls_the_library_refuses_to_capture_run_between_graphs(monkeypatch, refused):
    # CuPy refuses cuBLAS while a stream captures: a training step's matrix products run as
    # Python between the graphs of the elementwise work around them
    if refused:
        monkeypatch.setattr(backends.NUMPY, "refused_in_graphs",
                            lambda name, module: name == "matmul", raising=False)
    eager_model, _, eager_step = _training(optim.SGD, layers=(8, 8, 3))
    model, _, step = _training(optim.SGD, layers=(8, 8, 3))
    compiled = gradcore.compile(step)
    for i, (x, t) in enumerate(_batches(6)):
        np.random.seed(i)
        expected = eager_step(x, t)
        np.random.seed(i)
        assert same(compiled(x, t), expected)
        for p, q in zip(model.params(), eager_model.params()):
            assert same(p.data, q.data) and same(p.grad, q.grad)
    stats = compiled.stats()
    assert stats["graphs"][0] >= 2 and stats["why not graphs"] == [], stats
    assert ("matmul" in _graphed_calls(compiled)) is not refused


def test_graphs_false_launches_every_line(graph_stand_in):
    compiled = gradcore.compile(lambda x0: F.exp(gradcore.Variable(x0)) * 3.0, graphs=False)
    for i in range(5):
        compiled(np.full(2, float(i)))
    assert compiled.stats()["graphs"] == [0] and graph_stand_in.captures == 0


def test_a_bad_label_still_runs_eagerly_and_raises(graph_stand_in):
    model, _, step = _training(optim.SGD)
    compiled = gradcore.compile(step)
    for x, t in _batches(5):
        compiled(x, t)
    assert graph_stand_in.launches > 0
    x, t = _batches(1)[0]
    t[0] = 7  # 3 classes
    with pytest.raises(IndexError):
        compiled(x, t)


def test_the_source_calls_each_graph_in_its_runs_place(graph_stand_in):
    compiled = gradcore.compile(lambda x0: F.tanh(gradcore.Variable(x0) * 2.0))
    for i in range(4):
        compiled(np.full(2, float(i)))
    tape, = compiled.tapes()
    assert len(tape.graphed) == 1 and tape.graphed[0].graph is not None
    assert "f0(" in tape.source or "f1(" in tape.source


def test_small_runs_are_left_as_lines(graph_stand_in, monkeypatch):
    monkeypatch.setattr(graphs_module, "GRAPH_MIN_LINES", 4)
    compiled = gradcore.compile(lambda x0: F.tanh(gradcore.Variable(x0) * 2.0))
    for i in range(4):
        compiled(np.full(2, float(i)))
    assert compiled.tapes()[0].graphed == [] and graph_stand_in.captures == 0


def test_an_array_made_from_host_values_is_made_outside_graphs(graph_stand_in):
    def step(x0):
        x = gradcore.Variable(x0)
        w = x.xp.asarray([1.0, 2.0, 3.0])  # copied from the host: not in a graph
        return F.tanh(x * w) * 2.0

    compiled = gradcore.compile(step)
    for i in range(5):
        x0 = np.full(3, float(i))
        assert same(compiled(x0), step(x0))
    tape, = compiled.tapes()
    inside = [getattr(line.target, "__name__", "") for g in tape.graphed for line in g.lines]
    assert inside and "asarray" not in inside and graph_stand_in.launches > 0


def test_a_staged_argument_keeps_its_layout(graph_stand_in):
    # a transposed argument's buffer stays transposed: the graph's kernels and matrix products
    # are then those the step ran eagerly
    def step(x0):
        return F.tanh(gradcore.Variable(x0) * 2.0) * 3.0

    compiled = gradcore.compile(step)
    for i in range(4):
        x0 = np.asfortranarray(np.arange(12.0).reshape(3, 4) * i)
        assert same(compiled(x0), step(x0))
    tape, = compiled.tapes()
    (_, buffer), = tape.graphed[0]._buffers
    assert buffer.flags.f_contiguous and not buffer.flags.c_contiguous


def test_an_index_arrays_bounds_check_stays_out_of_graphs(graph_stand_in):
    # the check reads the index array's extremes on the host: a wait for the device, which a
    # capture refuses (and the run would then stay lines for good). The key it makes is new at
    # every call: its index arrays are copied into the graphs' own, the rest compared by value
    W = gradcore.Parameter(np.random.default_rng(0).standard_normal((50, 8)))

    def step(x0, t):
        loss = F.sum(F.tanh(W[t] * 2.0 + 1.0) * 3.0 * x0)
        W.cleargrad()
        loss.backward()
        return loss, W.grad

    compiled = gradcore.compile(step)
    rng = np.random.default_rng(1)
    for _ in range(12):  # past the captures a run makes before it stays lines
        x0, t = rng.standard_normal((16, 8)), rng.integers(0, 50, 16)
        assert same(compiled(x0, t), step(x0, t))
    tape, = compiled.tapes()
    inside = [getattr(line.target, "__name__", "") for g in tape.graphed for line in g.lines]
    assert "get_item" in inside and "normalize_key" not in inside
    assert compiled.stats()["why not graphs"] == []
    # recorded, 2 replays as lines, then 9 through the graphs: each captured once
    assert [(g.captures, g.launches) for g in tape.graphed] == [(1, 9)] * len(tape.graphed)
    with pytest.raises(IndexError):
        compiled(x0, np.full(16, 50))  # still checked at every call


def test_check_compares_replays_through_graphs_with_the_eager_step(graph_stand_in):
    model, _, step = _training(optim.Adam)
    compiled = gradcore.compile(step, check=True)
    for i, (x, t) in enumerate(_batches(7)):
        np.random.seed(i)
        compiled(x, t)  # each replay agrees with the eager step run from the same state
    stats = compiled.stats()
    assert stats["checked replays"] == 5 and stats["graphs"][0] >= 1
    # the state was put back into the same arrays: the graphs read them where they are
    assert stats["why not graphs"] == [] and graph_stand_in.captures == stats["graphs"][0]


def _one_graph(x0):
    return F.tanh(gradcore.Variable(x0) * 2.0 + 1.0) * 3.0


def _two_graphs(x0):
    # a draw splits the runs: the second graph reads the first's result where it is
    x = gradcore.Variable(x0)
    h = F.tanh(x * 2.0 + 1.0) * 3.0
    noise = F.dropout(x, 0.5) * 0.0
    return F.tanh(h * 0.5 + noise) * 2.0


@pytest.mark.parametrize("step, want, graphs", [
    (_one_graph, lambda x0: np.tanh(x0 * 2.0 + 1.0) * 3.0, 1),
    (_two_graphs, lambda x0: np.tanh(np.tanh(x0 * 2.0 + 1.0) * 3.0 * 0.5 + 0.0) * 2.0, 2)])
def test_calls_from_two_threads_each_get_their_own_results(graph_stand_in, step, want, graphs):
    compiled = gradcore.compile(step)
    for i in range(4):
        compiled(np.full(64, float(i)))
    assert compiled.stats()["graphs"] == [graphs]
    wrong = []

    def calls(start):
        for i in range(start, start + 300):
            x0 = np.full(64, i / 100.0)
            if not same(compiled(x0).data, want(x0)):
                wrong.append(i)

    # threads switch between any two steps of a launch
    run_in_threads([functools.partial(calls, start) for start in (0, 1000)])
    assert wrong == [] and graph_stand_in.launches > 600 * graphs


def test_a_run_left_as_lines_hands_out_no_view_of_a_graphs_memory(graph_stand_in):
    def step(x0):
        x = gradcore.Variable(x0)
        h = F.tanh(x * 2.0 + 1.0)  # a run, captured
        w = x.xp.asarray([1.0, 2.0, 3.0])  # from the host: between runs
        return F.reshape(h, (3, 1)), w  # a run refused: as lines, a view of the graph's h

    graph_stand_in.refuse, graph_stand_in.allowed = "not permitted", 1
    compiled = gradcore.compile(step)
    kept = [(x0, compiled(x0)[0]) for x0 in (np.full(3, i / 10.0) for i in range(6))]
    assert graph_stand_in.captures == 1 and len(compiled.stats()["why not graphs"]) == 1
    for x0, got in kept:  # each as it was when returned
        assert same(got.data, np.tanh(x0 * 2.0 + 1.0).reshape(3, 1))


@pytest.mark.parametrize("labels", ["strict", "numpy"])
def test_a_training_step_on_a_device_of_another_library_replays_through_graphs(monkeypatch,
                                                                               labels):
    # NumPy labels are moved to device1 by the loss: a copy from the host, between graphs
    from conftest import DEVICE1, STRICT
    stand_in = StandInGraphs(STRICT)  # array-api-strict's device1 captures graphs here
    monkeypatch.setattr(STRICT, "captures_graphs", True, raising=False)
    monkeypatch.setattr(STRICT, "capture", stand_in.capture, raising=False)
    eager_model, _, eager_step = _training(optim.SGD)
    model, _, step = _training(optim.SGD)
    compiled = gradcore.compile(step)
    kept = []
    for i, (x, t) in enumerate(_batches(6)):
        x = STRICT.asarray(x, device=DEVICE1)
        t = STRICT.asarray(t, device=DEVICE1) if labels == "strict" else t
        np.random.seed(i)
        expected = eager_step(x, t)
        np.random.seed(i)
        got = compiled(x, t)
        assert got.device == DEVICE1
        kept.append((got, STRICT.to_numpy(expected.data)))
        for p, q in zip(model.params(), eager_model.params()):
            assert p.device == DEVICE1
            np.testing.assert_array_equal(STRICT.to_numpy(p.data), STRICT.to_numpy(q.data))
    for got, expected in kept:  # the caller's: later launches changed none
        np.testing.assert_array_equal(STRICT.to_numpy(got.data), expected)
    stats = compiled.stats()
    assert stats["graphs"][0] >= 1 and stand_in.launches > 0, stats["why not graphs"]
    assert stats["why not graphs"] == [] and stats["replays"] == 4
    tape, = compiled.tapes()
    moves = [line for line in tape.lines if line.target is backends.to_device]
    assert len(moves) == (labels == "numpy")
    assert not any(line.target is backends.to_device for g in tape.graphed for line in g.lines)


@pytest.mark.parametrize("read_after", [False, True])
def test_a_run_may_write_into_a_fresh_array_only_it_reads(graph_stand_in, read_after):
    def step(x0):
        x = gradcore.Variable(x0)
        w = x.xp.asarray([1.0, 2.0, 3.0])  # from the host: made outside graphs, fresh
        h = F.tanh(x * 2.0)
        w *= h.data  # in place, in the run after it
        y = F.exp(h) * 3.0
        return (y, w) if read_after else y

    compiled = gradcore.compile(step)
    kept = []
    for i in range(6):
        x0 = np.full(3, i / 10.0)
        kept.append((compiled(x0), step(x0)))
    assert all(same(got, expected) for got, expected in kept)
    why = compiled.stats()["why not graphs"]
    if read_after:  # the caller gets w: the write must land in its own array
        assert len(why) == 1 and "writes in place into an array that is new" in why[0]
    else:
        assert why == [] and graph_stand_in.launches > 0


def test_cupy_graph_memory_is_the_devices_own_and_the_gpus_are_counted_once():
    import contextlib
    import types
    import weakref

    from backends.cupy_backend import CupyBackend

    counted = []
    runtime = types.SimpleNamespace(getDevice=lambda: 0,
                                    getDeviceCount=lambda: counted.append(2) or 2)
    backend = object.__new__(CupyBackend)  # no GPU here: __init__ would look for one
    backend.xp = types.SimpleNamespace(cuda=types.SimpleNamespace(
        runtime=runtime, Device=lambda id: contextlib.nullcontext()))
    backend._graphs = weakref.WeakSet()

    class Graph:  # a CudaGraph: the GPU it was captured on, its pool
        def __init__(self, device, size):
            self.device, self.pool = device, types.SimpleNamespace(total_bytes=lambda: size)

    graphs = [Graph(0, 1024), Graph(1, 512)]
    backend._graphs.update(graphs)
    assert backend.graph_memory(backends.Device("cuda", 1)) == 512
    assert backend.graph_memory(backends.Device("cuda", 0)) == 1024
    assert backend.graph_memory(None) == 1024  # the current GPU's
    for _ in range(3):
        backend.device_context(backends.Device("cuda", 1))
    with pytest.raises(backends.DeviceUnavailableError, match="cuda:2 does not exist"):
        backend.device_context(backends.Device("cuda", 2))
    assert counted == [2]  # asked once: the count is fixed for the process
