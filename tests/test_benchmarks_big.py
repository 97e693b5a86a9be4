"""The `big` workload (benchmarks/big.py): its closed forms, a whole run at a tiny N (times,
memory children, errors within 1e-9, its targets), and the suite without Dask (a note, no crash)."""
import argparse
import dataclasses
import importlib
import io
import json
import math
import sys

import numpy as np
import pytest

import benchmarks
from benchmarks import __main__ as suite
from benchmarks import big, memory
from benchmarks.common import Progress, Unavailable, resolve_device, run_workload
from benchmarks.report import _notes

TINY = 100_000
CPU = resolve_device("cpu")
# what `import dask` and gradcore's Dask backend need: None in sys.modules fails their import
DASK_MODULES = ("dask", "dask.array", "array_api_compat", "array_api_compat.dask",
                "array_api_compat.dask.array")


def needs_dask():
    pytest.importorskip("dask.array", reason="needs the dask extra: pip install 'gradcore[dask]'")
    pytest.importorskip("array_api_compat", reason="needs the dask extra")


# ============================================================================ the reference
@pytest.mark.parametrize("n", [2, 3, 10, 1000, TINY, 1_000_000])
def test_the_closed_forms_are_the_sums_of_the_runs_values(n):
    x = np.arange(n, dtype=np.float64) * (1.0 / n)  # the x_k every run makes
    value = math.fsum(np.sin(x) * x)
    grad_sum = math.fsum(np.sin(x) + x * np.cos(x))
    assert big.relative_errors(n, (value, grad_sum)) == pytest.approx((0, 0), abs=1e-14)


@pytest.mark.parametrize("n", [10 ** 7, 10 ** 9, 10 ** 10])
def test_the_closed_forms_keep_their_digits_at_large_n(n):
    """Where no sum can check them: the same formulas in 50-digit arithmetic."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(50):
        h = mpmath.mpf(1.0 / n)  # the float64 h, exactly
        s = mpmath.sin(h / 2)
        one_minus_zn = -2j * mpmath.sin(n * h / 2) * mpmath.exp(0.5j * n * h)
        z_minus_one = 2j * s * mpmath.exp(0.5j * h)
        weighted = -(one_minus_zn + n * mpmath.exp(1j * (n - 1) * h) * z_minus_one) / (4 * s * s)
        value = h * weighted.imag
        grad_sum = mpmath.sin(n * h / 2) * mpmath.sin((n - 1) * h / 2) / s + h * weighted.real
    assert big.relative_errors(n, (float(value), float(grad_sum))) == pytest.approx(
        (0, 0), abs=1e-15)


def test_the_size_comes_from_the_environment():
    assert big.size_from({}) == big.DEFAULT_SIZE == 10_000_000
    assert big.size_from({big.SIZE_VARIABLE: "1e9"}) == 10 ** 9
    assert big.size_from({big.SIZE_VARIABLE: " 200000000 "}) == 2 * 10 ** 8
    for bad in ("abc", "1.5", "1", "0", "-5", "inf", "nan"):
        with pytest.raises(ValueError, match=f"GRADCORE_BENCH_BIG_SIZE: .*got '{bad}'"):
            big.size_from({big.SIZE_VARIABLE: bad})


def test_numpy_is_skipped_where_it_would_not_fit_comfortably(monkeypatch):
    gib = 2 ** 30
    assert big.floor_fits(2 * 10 ** 8, available=23 * gib) is None
    assert "about 22.4 GiB (3 arrays of 1,000,000,000 float64) and 23.0 GiB is available" in (
        big.floor_fits(10 ** 9, available=23 * gib))
    monkeypatch.setattr(big, "available_bytes", lambda: 1000)
    with pytest.raises(Unavailable, match="NumPy in memory would hold"):
        big.make_workload(TINY).floor(CPU)


# ============================================================================ with Dask
def test_the_seed_of_sums_backward_keeps_xs_chunks():
    needs_dask()
    x, y = big.lazy_gradcore(TINY, chunk_size="64KiB")
    assert x.data.numblocks[0] > 1
    assert x.grad.data.chunks == x.data.chunks  # no rechunk between x and its gradient


def test_a_run_at_a_tiny_size_is_within_1e_9_with_positive_times(monkeypatch):
    """The suite's own path, memory children included (they read N from the environment)."""
    needs_dask()
    monkeypatch.setenv(big.SIZE_VARIABLE, str(TINY))
    workload = big.make_workload(TINY)
    args = argparse.Namespace(repeat=2, warmup=0, threads=1)
    record = suite.run_one(workload, CPU, args, "python -m benchmarks --only big",
                           "2026-01-02T03:04:00+00:00", {"git": None, "versions": {}},
                           Progress(1, io.StringIO()))
    for kind in ("gradcore", "floor"):
        entry = record["results"][kind]
        assert entry["status"] == "ok", entry
        assert entry["median_s_per_run"] > 0 and len(entry["samples_s_per_run"]) == 2
        measured = record["memory"]["results"][kind]
        assert measured["status"] == "ok", measured
        assert measured["size"] == TINY and measured["peak_mib"] >= 0
        assert max(measured["value_rel_error"], measured["grad_sum_rel_error"]) <= 1e-9
    assert record["results"]["gradcore"]["chunks"] >= 1
    assert record["results"]["torch"]["status"] == "none"  # no PyTorch version
    accurate, bounded = record["targets"]
    assert accurate["met"] is True and accurate["row"] == "time"
    assert bounded["met"] is None and bounded["row"] == "peak_mib"  # the target is for N = 1e9
    assert bounded["measured"].endswith("at N = 100,000 (the target is for N = 1e9: "
                                        "GRADCORE_BENCH_BIG_SIZE=1e9)")


def test_verify_rejects_a_value_off_by_more_than_1e_9():
    workload = big.make_workload(TINY)
    value, grad_sum = big.exact(TINY)
    workload.verify("floor", (value * (1 + 5e-10), grad_sum))
    with pytest.raises(AssertionError, match="big/floor: relative errors 2e-09 .value."):
        workload.verify("floor", (value * (1 + 2e-9), grad_sum))


def test_the_memory_target_reads_gradcores_peak_at_1e9():
    accurate, bounded = big.WORKLOAD.targets
    record = {"memory": {"results": {"gradcore": {
        "status": "ok", "size": 10 ** 9, "peak_mib": 300.0, "value_rel_error": 1e-16,
        "grad_sum_rel_error": 2e-9}}}}
    assert bounded.check(record) == ("300 MiB at N = 1,000,000,000", True)
    assert accurate.check(record) == ("1e-16 (value), 2e-09 (gradient sum)", False)
    record["memory"]["results"]["gradcore"]["peak_mib"] = 2049.0
    assert bounded.check(record)[1] is False
    assert bounded.check({}) == accurate.check({}) == ("n/a", None)


# ============================================================================ without Dask
@pytest.fixture
def no_dask(monkeypatch):
    for name in DASK_MODULES:
        monkeypatch.setitem(sys.modules, name, None)


def test_without_dask_the_workload_is_listed_and_gradcore_skipped_with_a_note(no_dask,
                                                                             monkeypatch):
    assert "big" in benchmarks.WORKLOADS
    # the module imports without Dask
    monkeypatch.setattr(benchmarks, "big", big)  # put back after the fresh import below
    monkeypatch.delitem(sys.modules, "benchmarks.big")
    fresh = importlib.import_module("benchmarks.big")
    assert fresh is not big and fresh.WORKLOAD.name == "big"
    workload = big.make_workload(TINY)  # timed here; its memory children would find Dask
    workload = dataclasses.replace(workload, memory=None, targets=workload.targets[:1])
    args = argparse.Namespace(repeat=1, warmup=0, threads=1)
    record = suite.run_one(workload, CPU, args, "python -m benchmarks --only big",
                           "2026-01-02T03:04:00+00:00", {"git": None, "versions": {}},
                           Progress(1, io.StringIO()))
    gradcore = record["results"]["gradcore"]
    assert gradcore["status"] == "skipped"
    assert "needs Dask: pip install 'gradcore[dask]'" in gradcore["reason"]
    assert record["results"]["floor"]["status"] == "ok"  # NumPy's floor still runs
    notes = "\n".join(_notes(record, "NumPy", {"device": "cpu", "machine": {}}))
    assert "    gradcore: n/a: needs Dask: pip install 'gradcore[dask]'" in notes


def test_without_dask_the_memory_child_reports_a_skip(no_dask, capsys):
    assert memory.child(["big", "gradcore", "cpu", "1"]) == 0
    entry = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert entry["status"] == "skipped" and "needs Dask" in entry["reason"]
