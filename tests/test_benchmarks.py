"""The benchmark suite's implementations: each builds on the CPU, runs once and passes its own
`verify`, so a workload that rots (a renamed op, a changed factory) fails here, not in `make bench`."""
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import benchmarks
from benchmarks import stripped, wide
from benchmarks.common import candidates, resolve_device, torch_device
from benchmarks.report import reference_figure

ROWS = [(workload.name, key) for workload in benchmarks.load()
        for key, factory in candidates(workload) if factory is not None]


@pytest.mark.parametrize("name, key", ROWS, ids=[f"{name}-{key}" for name, key in ROWS])
def test_each_implementation_runs_and_passes_verify(name, key):
    workload, = benchmarks.load([name])
    factory = dict(candidates(workload))[key]
    if key == "torch":
        factory = _torch_factory(factory)
    result = factory(resolve_device("cpu"))()
    workload.verify(key, result)


def _torch_factory(factory):
    torch = pytest.importorskip("torch")
    return lambda device: factory(torch, torch_device(torch, device))


def test_verify_rejects_a_wrong_gradient():
    result = wide.make_gradcore(resolve_device("cpu"))()
    wide.verify("gradcore", result)
    with pytest.raises(AssertionError, match="wide/gradcore: gradient off"):
        wide.verify("gradcore", np.asarray(result) * 1.001)


def test_every_workload_has_a_verify_and_a_floor():
    for workload in benchmarks.load():
        assert workload.verify is not None and workload.floor is not None, workload.name


@pytest.mark.parametrize("raw", [False, True], ids=["ops", "raw"])
def test_the_stripped_engine_gets_wides_gradient(raw):
    wide.verify("stripped", stripped.wide_stripped(wide._x(), wide.BRANCHES, raw))
    assert stripped.Op.grad_mode  # the walk turned grad mode back on


@pytest.mark.parametrize("freeze", [0, 1])
def test_the_collector_script_measures_in_a_child_process(freeze):
    child = subprocess.run([sys.executable, "-m", "benchmarks.collector", "--runs", "2",
                            "--child", "0", str(freeze)], capture_output=True, text=True,
                           cwd=pathlib.Path(__file__).parent.parent)
    assert child.returncode == 0, child.stderr
    figures = json.loads(child.stdout)
    assert figures["mean_ms"] > 0 and figures["median_ms"] > 0
    if freeze:  # gc.freeze() leaves the passes nothing of start-up to walk
        assert figures["tracked"] == 0
    else:  # NumPy and gradcore alone: thousands of objects
        assert figures["tracked"] > 5_000


def test_a_reference_line_gives_its_ratio_to_pytorch_when_pytorch_ran():
    record = {"time_unit": "us", "unit": "branch",
              "results": {"torch": {"status": "ok", "median_s_per_run": 0.020}}}
    entry = {"status": "ok", "label": "the bare design", "median_us_per_branch": 13.0,
             "median_s_per_run": 0.013}
    assert reference_figure(entry, record) == "the bare design: 13.0 µs/branch (0.650x PyTorch)"
    record["results"]["torch"] = {"status": "skipped", "reason": "no PyTorch"}
    assert reference_figure(entry, record) == "the bare design: 13.0 µs/branch"
