"""The benchmark suite: each implementation builds on the CPU, runs once and passes its own
`verify`, so a workload that rots (a renamed op, a changed factory) fails here, not in `make
bench`; and what a run leaves behind (where its files go, the table, the chart, the progress)."""
import io
import json
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import benchmarks
from benchmarks import stripped, wide
from benchmarks.common import (Progress, candidates, progress_line, resolve_device,
                               thread_environment, torch_device)
from benchmarks.report import LOCAL, chart_panels, print_table, reference_figure

REPO = pathlib.Path(__file__).parent.parent
PUBLISHED_JSON = REPO / "benchmarks" / "results" / "cpu.json"

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
                           cwd=REPO)
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


# ============================================================================ what a run leaves
def test_a_run_writes_only_to_its_folder_and_publish_writes_the_committed_files(tmp_path):
    """In a copy of benchmarks/: a plain run touches nothing but results/local/; --publish
    rewrites the committed figures, the workloads it did not run kept from before."""
    shutil.copytree(REPO / "benchmarks", tmp_path / "benchmarks",
                    ignore=shutil.ignore_patterns("local", "__pycache__"))

    def files():
        return {str(path.relative_to(tmp_path)): path.read_bytes()
                for path in tmp_path.rglob("*")
                if path.is_file() and "__pycache__" not in path.parts}

    def run(*args):
        before = files()
        done = subprocess.run([sys.executable, "-m", "benchmarks", "--device", "cpu", "--only",
                               "chain", "--repeat", "1", "--warmup", "0", *args],
                              cwd=tmp_path, env=thread_environment(1), capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr
        return {path for path, data in files().items() if before.get(path) != data}

    local = "benchmarks/results/local/"
    assert run() == {local + "cpu.json", local + "cpu.png", local + "RESULTS.md"}
    assert list(json.loads((tmp_path / local / "cpu.json").read_text())["workloads"]) == ["chain"]
    assert run("--publish") == {"benchmarks/results/cpu.json", "benchmarks/results/cpu.png",
                                "benchmarks/RESULTS.md"}
    old = json.loads(PUBLISHED_JSON.read_text())["workloads"]
    new = json.loads((tmp_path / "benchmarks/results/cpu.json").read_text())["workloads"]
    assert list(new) == list(old) and new["wide"] == old["wide"]
    assert new["chain"]["run_started"] != old["chain"]["run_started"]


def test_the_default_folder_is_ignored_by_git_and_the_published_files_are_tracked():
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True).returncode

    if shutil.which("git") is None or git("rev-parse") != 0:
        pytest.skip("not a git checkout")
    assert git("check-ignore", "-q", f"{pathlib.Path(LOCAL).relative_to(REPO)}/cpu.json") == 0
    assert git("ls-files", "--error-unmatch", "benchmarks/RESULTS.md", str(PUBLISHED_JSON)) == 0


def test_the_terminal_report_fits_100_columns(capsys):
    report = json.loads(PUBLISHED_JSON.read_text())
    report["workloads"]["chain"]["results"]["torch"] = {"status": "error",
                                                        "error": "RuntimeError: " + "why " * 60}
    print_table(report, "µs")
    lines = capsys.readouterr().out.splitlines()
    assert "FAILED" in "".join(lines) and max(map(len, lines)) <= 100


def test_chart_panels_name_their_run_when_the_panels_come_from_several():
    report = json.loads(PUBLISHED_JSON.read_text())
    for record in report["workloads"].values():
        record.update(run_started="2026-01-02T03:04:00+00:00", git={"commit": "a" * 40})
    panels, runs = chart_panels(report)
    assert len(runs) == 1 and not any("\n" in title for _, title in panels)
    report["workloads"]["chain"].update(run_started="2026-01-05T06:07:00+00:00",
                                        git={"commit": "b" * 40, "dirty": True})
    titles = [title for _, title in chart_panels(report)[0]]
    assert titles[0].endswith("\n2026-01-05 06:07 UTC, commit bbbbbbbbbb (modified)")
    assert titles[1].endswith("\n2026-01-02 03:04 UTC, commit aaaaaaaaaa")


def test_the_progress_line_has_a_bar_and_the_time_left():
    assert (progress_line(6, 24, 30.0, "wide: round 8/23", bar=8)
            == "[bench] [##......]  25%  0:30, ~1:30 left  wide: round 8/23")
    assert (progress_line(0, 24, 2.0, "chain", bar=8)
            == "[bench] [........]   0%  0:02, ? left  chain")
    assert progress_line(24, 24, 75.0, "done", bar=0) == "[bench] 100%  1:15, ~0:00 left  done"


def test_progress_in_a_log_prints_only_the_messages_as_plain_lines():
    log = io.StringIO()
    progress = Progress(4, log)
    progress.advance("round 1/4", 2)
    progress.say("chain: FAILED")
    progress.close()
    assert re.fullmatch(r"\[bench\]  50%  0:0\d, ~0:0\d left  chain: FAILED\n", log.getvalue())


def test_nothing_in_benchmarks_cites_an_issue():
    for path in [*(REPO / "benchmarks").glob("*.py"), REPO / "benchmarks" / "RESULTS.md"]:
        assert not re.search(r"\bissue\b", path.read_text(), re.IGNORECASE), path
