"""The benchmark suite: each implementation builds on the CPU, runs once and passes its own
`verify`, so a workload that rots (a renamed op, a changed factory) fails here, not in `make
bench`; and what a run leaves behind (where its files go, the table, the chart, the progress)."""
import argparse
import collections
import dataclasses
import io
import json
import pathlib
import re
import shutil
import subprocess
import sys
import weakref

import numpy as np
import pytest

import benchmarks
import gradcore
from benchmarks import __main__ as suite
from benchmarks import common, memory, stripped, wide
from benchmarks.common import (KINDS, REPLAY, Contender, Memory, Progress, Target, Unavailable,
                               Workload, candidates, gradcore_ratios, graphs_wanted, prepare,
                               progress_line, ratio_target, resolve_device, run_child,
                               run_workload, thread_environment, torch_device)
from benchmarks.report import (LOCAL, bandwidth, chart_panels, print_table, reference_figure, rows,
                               shared_machine, table, targets_of, upgraded, write_all)
from gradcore.compile.tape import INTERPRETED_REPLAYS

REPO = pathlib.Path(__file__).parent.parent
PUBLISHED_JSON = REPO / "benchmarks" / "results" / "cpu.json"
PUBLISHED_CUDA_JSON = REPO / "benchmarks" / "results" / "cuda.json"
# A results file as the suite wrote it before workloads had several targets (one "target" per
# record, its row an index): what --only keeps from an older file must still be read
ONE_TARGET_JSON = REPO / "tests" / "data" / "bench_cpu_one_target.json"

CPU = resolve_device("cpu")
ROWS = [(workload.name, key) for workload in benchmarks.load()
        for key, factory in candidates(workload) if factory is not None]


@pytest.mark.parametrize("name, key", ROWS, ids=[f"{name}-{key}" for name, key in ROWS])
def test_each_implementation_runs_and_passes_verify(name, key):
    workload, = benchmarks.load([name])
    factory = dict(candidates(workload))[key]
    if key == "torch":
        factory = _torch_factory(factory)
    try:
        run = factory(CPU)
    except Unavailable as reason:  # what the suite shows as n/a: big without Dask, for one
        pytest.skip(str(reason))
    # what the suite checks after its runs (a training model's steps counted): here, after one
    contender = Contender(key, run, lambda: None, {}, result=run(),
                          calls=getattr(run, "facts", {}).get("calls", 0) + 1)
    assert common.wrong_result(workload, contender, CPU) is None


def test_torch_compile_is_timed_in_a_process_of_its_own():
    pytest.importorskip("torch")
    from benchmarks import torch_compiled
    entry = run_child("torch_compiled", ["conv", "cpu", 1, 2, 1],  # the quickest to compile
                      env=thread_environment(1), timeout=torch_compiled.TIMEOUT_S)
    assert entry["status"] == "ok", entry
    assert entry["compile_s"] > 0 and len(entry["samples_s_per_run"]) == 2
    assert entry["graphs"] >= 1
    assert entry["median_s_per_run"] > 0 and entry["torch_eager_median_s_per_run"] > 0
    assert (entry["torch_device"], entry["torch_threads"]) == ("cpu", 1)


def test_torch_compile_that_compiles_no_graph_is_not_a_figure():
    """hod calls torch.autograd.grad, where Dynamo skips the frame: the run is PyTorch eager."""
    pytest.importorskip("torch")
    from benchmarks import torch_compiled
    entry = run_child("torch_compiled", ["hod", "cpu", 1, 2, 1], env=thread_environment(1),
                      timeout=torch_compiled.TIMEOUT_S)
    assert entry["status"] == "skipped", entry
    assert entry["reason"].startswith("ran eagerly: torch.compile compiled no graph, 1 graph "
                                      "break(s) (the first: ")
    assert "torch.autograd.grad" in entry["reason"]


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


def test_the_collector_and_stripped_scripts_refuse_zero_runs(capsys):
    from benchmarks import collector
    for main, option in ((collector.main, "--runs"), (stripped.main, "--repeat")):
        with pytest.raises(SystemExit) as info:
            main([option, "0"])
        assert info.value.code == 2
        assert (f"argument {option}: must be a whole number >= 1, got '0'"
                in capsys.readouterr().err)


def test_the_collector_script_fails_when_a_child_fails(monkeypatch, capsys):
    from benchmarks import collector
    monkeypatch.setattr(collector, "run_child",
                        lambda module, args: {"status": "error", "error": "child exited with 1"})
    assert collector.main(["--runs", "1"]) == 1
    assert capsys.readouterr().out.count("n/a: child exited with 1") == len(collector.SETTINGS)


def test_a_number_has_three_significant_digits_and_no_exponent():
    shown = {7.99: "7.99", 0.673: "0.673", 11.9: "11.9", 125.0: "125", 1234.0: "1234",
             999.7: "1000", 9.996: "10.0", 0.000238: "0.000238", 4.2e-05: "0.0000420",
             0.00099996: "0.00100", -999.7: "-1000"}
    assert {value: common.number(value) for value in shown} == shown


def test_a_reference_line_gives_its_ratio_to_pytorch_when_pytorch_ran():
    record = {"time_unit": "us", "unit": "branch",
              "results": {"torch": {"status": "ok", "median_s_per_run": 0.020}}}
    entry = {"status": "ok", "label": "the bare design", "median_us_per_branch": 13.0,
             "median_s_per_run": 0.013}
    assert reference_figure(entry, record) == "the bare design: 13.0 µs/branch (0.650x PyTorch)"
    record["results"]["torch"] = {"status": "skipped", "reason": "no PyTorch"}
    assert reference_figure(entry, record) == "the bare design: 13.0 µs/branch"


def test_graphs_are_wanted_unless_the_environment_says_0():
    assert graphs_wanted({}) is True and graphs_wanted({"GRADCORE_BENCH_GRAPHS": "1"}) is True
    assert graphs_wanted({"GRADCORE_BENCH_GRAPHS": " 0 "}) is False
    with pytest.raises(ValueError, match="GRADCORE_BENCH_GRAPHS: expected 0 or 1, got 'no'"):
        graphs_wanted({"GRADCORE_BENCH_GRAPHS": "no"})


def test_a_gpu_run_of_deep_says_the_bandwidth_each_implementation_reached():
    record = {"name": "deep", "results": {
        "gradcore": {"status": "ok", "median_s_per_run": 0.008},
        "replay": {"status": "ok", "median_s_per_run": 0.002},
        "torch": {"status": "skipped", "reason": "no PyTorch"}}}
    report = {"device": "cuda:0", "machine": {"gpu_peak_bytes_per_s": 4e12}}
    # 100 layers, 5 passes each over 1e6 float32: 2 GB a run
    assert bandwidth(record, report).startswith("memory traffic: at least 2 GB a run (")
    assert bandwidth(record, report).endswith(
        "reached: gradcore 0.25 TB/s, replay 1 TB/s; the GPU's peak by its specification: "
        "4 TB/s, replay at 25% of it")
    assert bandwidth(record, {"device": "cpu", "machine": {}}) is None  # the CPU's: not counted
    assert bandwidth({**record, "name": "mlp"}, report) is None  # no traffic declared


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
                               "chain", "--repeat", "1", "--warmup", "0", "--no-torch-compile",
                               *args],
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
    assert list(new) == list(old) and new["wide"] == upgraded(old["wide"])
    assert "target" not in new["wide"] and new["wide"]["targets"][0]["row"] == "time"
    assert new["chain"]["run_started"] != old["chain"]["run_started"]
    assert [target["row"] for target in new["chain"]["targets"]] == ["time", "replay"]


def test_the_default_folder_is_ignored_by_git_and_the_published_files_are_tracked():
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True).returncode

    if shutil.which("git") is None or git("rev-parse") != 0:
        pytest.skip("not a git checkout")
    assert git("check-ignore", "-q", f"{pathlib.Path(LOCAL).relative_to(REPO)}/cpu.json") == 0
    assert git("ls-files", "--error-unmatch", "benchmarks/RESULTS.md", str(PUBLISHED_JSON)) == 0


def test_the_terminal_says_when_the_machine_was_shared(capsys):
    report = json.loads(PUBLISHED_JSON.read_text())
    for record in report["workloads"].values():
        record["load_average_at_start"] = [0.2, 0.1, 0.1]
    print_table(report, "µs")
    assert "shared" not in capsys.readouterr().out
    report["workloads"]["chain"]["load_average_at_start"] = [2.31, 1.5, 1.2]
    report["machine"]["usable_cpus"] = 2
    print_table(report, "µs")
    out = " ".join(capsys.readouterr().out.split())
    assert ("Figures were taken on a shared 2-core VM while other jobs ran on it (1-minute load "
            "average up to 2.31 as the workloads started), so they are noisy") in out


def test_the_recorded_command_names_the_variables_that_change_what_runs():
    environ = {"GRADCORE_BENCH_BIG_SIZE": "1e9", "GRADCORE_BENCH_GRAPHS": "0", "HOME": "/root",
               "OMP_NUM_THREADS": "1"}
    assert common.command_line(["--only", "big"], environ) == (
        "GRADCORE_BENCH_BIG_SIZE=1e9 GRADCORE_BENCH_GRAPHS=0 python -m benchmarks --only big")
    assert common.command_line(["--only", "mlp"], {"GRADCORE_BENCH_MLP_BATCH": "4096"}) == (
        "GRADCORE_BENCH_MLP_BATCH=4096 python -m benchmarks --only mlp")
    assert common.command_line([], {}) == "python -m benchmarks"


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
    other = next(title for title in titles if not title.startswith("chain"))  # wide's
    assert other.endswith("\n2026-01-02 03:04 UTC, commit aaaaaaaaaa")


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


def _tiny(**fields):
    """A workload of one trivial run per implementation, for tests of the suite's machinery."""
    def builds(device):
        return lambda: 1

    return Workload("tiny", "a run", 1, "run", "one run", gradcore=builds, floor=builds,
                    verify=lambda kind, result: None, **fields)


@pytest.mark.parametrize("option", ["--repeat", "--warmup", "--threads"])
def test_a_count_that_is_no_whole_number_is_named_so(option, capsys):
    with pytest.raises(SystemExit):
        suite.parse_args(["--device", "cpu", option, "abc"])
    minimum = 0 if option == "--warmup" else 1
    assert (f"argument {option}: must be a whole number >= {minimum}, got 'abc'"
            in capsys.readouterr().err)
    with pytest.raises(SystemExit):
        suite.parse_args(["--device", "cpu", option, "-1"])
    assert f"must be a whole number >= {minimum}, got '-1'" in capsys.readouterr().err


@pytest.mark.parametrize("variable, value, module", [("GRADCORE_BENCH_GRAPHS", "2", None),
                                                     ("GRADCORE_BENCH_MLP_BATCH", "abc", "mlp"),
                                                     ("GRADCORE_BENCH_BIG_SIZE", "x", "big")])
def test_a_bad_setting_variable_is_a_usage_error_before_anything_runs(variable, value, module,
                                                                       monkeypatch, capsys):
    monkeypatch.setenv(variable, value)
    if module:  # imported already: a workload reads its variable as it loads
        monkeypatch.delitem(sys.modules, f"benchmarks.{module}")
    for argv in (["--help"], ["--write-results"], ["--device", "cpu", "--only", "chain"]):
        with pytest.raises(SystemExit) as info:
            suite.parse_args(argv)
        assert info.value.code == 2
        assert f"error: {variable}: expected " in capsys.readouterr().err


def test_help_names_every_workload_with_its_own_runs(capsys):
    assert suite._own_defaults("repeat") == "; 5 for deep, deep_checkpoint and big"
    assert suite._own_defaults("warmup") == "; 1 for deep, deep_checkpoint and big"
    with pytest.raises(SystemExit):
        suite.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default 20; 5 for deep, deep_checkpoint and big)" in text
    assert "(default 3; 1 for deep, deep_checkpoint and big)" in text


def test_an_out_folder_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    for out, problem in ((afile, "not a folder: name a folder for the results"),
                         (afile / "sub", "cannot make that folder (")):
        with pytest.raises(SystemExit) as info:
            suite.parse_args(["--device", "cpu", "--out", str(out)])
        assert info.value.code == 2
        assert f"error: --out {out}: {problem}" in capsys.readouterr().err
    made = tmp_path / "new" / "folder"
    assert suite.parse_args(["--device", "cpu", "--out", str(made)]).out == str(made)
    assert made.is_dir()


def test_the_table_is_printed_before_the_files_are_written(tmp_path, monkeypatch, capsys):
    def cannot_write(report, folder):
        raise OSError(28, "No space left on device")

    argv = ["--device", "cpu", "--out", str(tmp_path), "--repeat", "1", "--warmup", "0"]
    args = suite.parse_args(argv)
    monkeypatch.setattr(suite, "load", lambda names: [_tiny()])
    monkeypatch.setattr(suite, "write_json", cannot_write)
    assert suite.run_suite(args, argv) == 1
    out, err = capsys.readouterr()
    assert re.search(r"^tiny +\S+/run ", out, re.MULTILINE)  # the table's row
    assert "the results were not saved: [Errno 28] No space left on device" in err


def test_the_progress_bar_ends_full_after_timing_torch_compile_and_memory(monkeypatch):
    """Each memory child counts MEMORY_WEIGHT units, a torch.compile child its rounds."""
    figures = {"status": "ok", "peak_mib": 1.0}
    monkeypatch.setattr(memory, "run_child", lambda *args, **kwargs: figures)
    monkeypatch.setattr(suite, "run_child", lambda *args, **kwargs: {"status": "skipped",
                                                                     "reason": "test"})
    monkeypatch.setattr(common, "time_once", _untimed)
    workload = _tiny(torch=lambda torch, where: lambda: 1, memory=Memory(
        "peak", None, (("tiny, peak", "peak_mib", True),)))
    for compiles in (True, False):
        args = argparse.Namespace(repeat=3, warmup=1, threads=1, no_torch_compile=not compiles)
        total = suite._units(workload, args)
        assert total == 4 + 4 * compiles + 3 * memory.MEMORY_WEIGHT
        progress = Progress(total, io.StringIO())
        suite.run_one(workload, CPU, args, "python -m benchmarks", "2026-01-02T03:04:00+00:00",
                      {"git": None, "versions": {}}, progress)
        assert progress.done == total


def test_distributed_refuses_zero_steps_and_reps(capsys):
    from benchmarks import distributed
    for argv in (["--steps", "0"], ["--reps", "0"], ["--quick", "--steps", "0"]):
        with pytest.raises(SystemExit):
            distributed.parse_args(argv)
        assert "--steps, --reps and --threads must be at least 1" in capsys.readouterr().err
    args = distributed.parse_args(["--quick"])
    assert (args.steps, args.reps) == (distributed.QUICK_STEPS, distributed.QUICK_REPS)


def test_the_suites_own_load_is_no_sign_of_a_shared_machine():
    """The suite keeps one CPU busy: on 2 CPUs a load of 1.0 is the suite alone."""
    def report(load):
        return {"machine": {"usable_cpus": 2, "virtual_machine": True},
                "workloads": {"chain": {"load_average_at_start": [0.02, 0.0, 0.0]},
                              "hod": {"load_average_at_start": [load, 0.6, 0.3]}}}

    assert shared_machine(report(1.0), "see below") == ""
    assert shared_machine(report(1.99), "see below") == ""
    assert shared_machine(report(2.0), "see below").startswith(
        "Figures were taken on a shared 2-core VM while other jobs ran on it (see below)")


def test_results_md_leaves_out_a_json_file_that_is_no_report(tmp_path, capsys):
    shutil.copy(PUBLISHED_JSON, tmp_path / "cpu.json")
    (tmp_path / "package.json").write_text('{"name": "not a benchmark report"}')
    (tmp_path / "list.json").write_text("[1, 2]")
    written = write_all(str(tmp_path), str(tmp_path / "RESULTS.md"))
    assert str(tmp_path / "RESULTS.md") in written
    assert "## cpu:" in (tmp_path / "RESULTS.md").read_text()
    out = capsys.readouterr().out
    for name in ("package.json", "list.json"):
        assert f"note: {tmp_path / name} is left out of the results: it is no report" in out


def test_results_md_checks_the_targets_again_on_the_reports_device(tmp_path):
    """The published cuda.json's mlp record names no device and holds a CPU-only target as
    NOT met, checked by an older rule: the markdown says what the rule says now."""
    report = json.loads(PUBLISHED_CUDA_JSON.read_text())
    mlp = report["workloads"]["mlp"]
    assert "device" not in mlp and mlp["targets"][0]["met"] is False
    (tmp_path / "cuda.json").write_text(json.dumps(report))
    write_all(str(tmp_path), str(tmp_path / "RESULTS.md"))
    line, = [line for line in (tmp_path / "RESULTS.md").read_text().splitlines()
             if line.startswith("| mlp |")]
    assert line.endswith("| ≤ 1.15x the floor (NumPy on a CPU): not measured |")


def test_results_md_says_each_merged_runs_own_threads_and_versions(tmp_path):
    """--only runs merged into one file: its machine facts are the last run's, so where the runs
    differ, each run's line says the threads and versions it had."""
    report = json.loads(PUBLISHED_JSON.read_text())
    versions = report["machine"]["versions"]
    chain = report["workloads"]["chain"]
    chain["run_started"] = "2026-01-02T03:04:00+00:00"
    chain["settings"]["threads"] = 2
    chain["versions"] = {**versions, "torch": None}
    (tmp_path / "cpu.json").write_text(json.dumps(report))
    write_all(str(tmp_path), str(tmp_path / "RESULTS.md"))
    lines = (tmp_path / "RESULTS.md").read_text().splitlines()
    assert any(line.startswith("Versions and threads: each run's, below. Floor = ")
               for line in lines)
    libraries = (f"NumPy {versions['numpy']}, PyTorch {{}}, CuPy {versions['cupy']}, "
                 f"Python {versions['python']}, BLAS {report['machine']['numpy_blas']}")
    line, = [line for line in lines if line.startswith("- chain: taken 2026-01-02 03:04 UTC")]
    assert line.endswith(f"; {libraries.format('not installed')}; 2 threads for the BLAS and "
                         "for PyTorch.")
    line, = [line for line in lines if line.startswith("- wide, hod, ")]
    assert line.endswith(f"; {libraries.format(versions['torch'])}; 1 thread for the BLAS and "
                         "for PyTorch.")


def test_nothing_in_benchmarks_cites_an_issue():
    for path in [*(REPO / "benchmarks").glob("*.py"), REPO / "benchmarks" / "RESULTS.md"]:
        assert not re.search(r"\bissue\b", path.read_text(), re.IGNORECASE), path


# ============================================================================ targets and rows
def _record(workload, times, memory_figures=None):
    """A record of `workload` as a run writes it: `times` {kind: seconds a run}, and
    `memory_figures` {kind: MiB} for every memory row of the implementations it names."""
    def entry(figures):
        return {"status": "ok", **figures} if figures is not None else {"status": "none",
                                                                         "reason": "none"}

    per_unit = f"median_{workload.time_unit}_per_{workload.unit}"
    kinds = (*KINDS, REPLAY) if workload.replay is not None else KINDS
    results = {kind: entry({per_unit: times[kind], "median_s_per_run": times[kind]}
                           if kind in times else None) for kind in kinds}
    times = {kind: time for kind, time in times.items() if kind in kinds}
    record = {"name": workload.name, "timed": workload.timed, "time_unit": workload.time_unit,
              "unit": workload.unit, "results": results, "ratios": gradcore_ratios(times)}
    if workload.memory:
        specs = [{"label": label, "key": key, "ratios": with_ratios}
                 for label, key, with_ratios in workload.memory.rows]
        record["memory"] = {"unit": "MiB", "rows": specs, "ratios": gradcore_ratios(memory_figures),
                            "results": {kind: entry({spec["key"]: figure for spec in specs})
                                        for kind, figure in memory_figures.items()}}
    return record


TIMES = {"gradcore": 2.0, "floor": 1.0, "torch": 4.0, REPLAY: 0.5}
PEAKS = {"gradcore": 400.0, "floor": 390.0, "torch": 440.0, REPLAY: 380.0}


@pytest.mark.parametrize("workload", benchmarks.load(), ids=lambda workload: workload.name)
def test_every_target_names_a_row_the_table_gives_its_workload(workload):
    figures = {kind: PEAKS[kind] for kind in memory.measured_kinds(workload)}
    ids = [row["id"] for row in rows(_record(workload, TIMES, figures))]
    assert ids == workload.row_ids() and len(set(ids)) == len(ids)
    assert workload.targets and all(target.row in ids for target in workload.targets)


def test_a_target_on_a_row_the_workload_lacks_is_refused():
    with pytest.raises(ValueError, match=r"chain: no row 'peak_mib' for a target; its rows: "
                                         r"time, replay"):
        Workload("chain", "", 1, "op", "", gradcore=print, floor=print, verify=print,
                 replay=print, targets=(ratio_target("t", "gradcore/torch", 1, row="peak_mib"),))


def test_gradcore_ratios_give_the_replays_ratio_to_gradcore_too():
    assert gradcore_ratios({"gradcore": 2.0, "floor": 1.0, "torch": 4.0}) == {
        "gradcore/torch": 0.5, "gradcore/floor": 2.0}
    assert gradcore_ratios({**TIMES, "torch": None}) == {
        "gradcore/torch": None, "gradcore/floor": 2.0, "replay/torch": None,
        "replay/floor": 0.5, "replay/gradcore": 0.25}


def test_a_replay_memory_row_sits_under_its_memory_row_with_its_own_ratios():
    workload, = benchmarks.load(["deep"])
    table_rows = rows(_record(workload, TIMES, PEAKS))
    assert [(row["id"], row["label"]) for row in table_rows] == [
        ("time", "deep"), ("replay", "  replay"), ("peak_mib", "deep, peak memory"),
        ("replay peak_mib", "  replay")]
    assert table_rows[2]["cells"][2:] == ["400", "390", "440", "0.909x", "1.03x"]
    # the replay's figure in gradcore's column, its ratios to PyTorch and the floor beside it
    assert table_rows[3]["cells"] == ["  replay", "MiB", "380", "", "", "0.864x", "0.974x"]
    assert table_rows[3]["replay"] and not table_rows[2]["replay"]
    no_replay = {kind: PEAKS[kind] for kind in KINDS}
    assert [row["id"] for row in rows(_record(workload, TIMES, no_replay))][2:] == ["peak_mib"]


def test_chains_replay_row_is_compared_with_the_scalar_loop_it_computes_like():
    """chain's tape runs on numpy.float64 scalars, the floor on 0-d arrays: the replay's floor
    is the numpy_scalars reference where it ran (the CPU), else the floor (CuPy keeps arrays)."""
    workload, = benchmarks.load(["chain"])
    record = {**_record(workload, TIMES), "references": {"numpy_scalars": {
        "status": "ok", "label": "the literal loop", "median_us_per_op": 0.25,
        "median_s_per_run": 0.25}}}
    replay = rows(record)[1]
    assert replay["cells"] == ["  replay", "µs/op", "0.500", "0.250", "", "0.125x", "2.00x"]
    assert replay["floor_key"] == "numpy_scalars"
    record["references"]["numpy_scalars"] = {"status": "skipped", "reason": "NumPy only",
                                             "label": "the literal loop"}
    assert rows(record)[1]["cells"] == ["  replay", "µs/op", "0.500", "", "", "0.125x", "0.500x"]
    assert "eager gradcore" in workload.floor_label


def test_memory_measures_the_replay_in_a_child_of_its_own_when_there_is_one(monkeypatch):
    asked = []

    def child(module, args, env=None, timeout=None):
        asked.append(args[1])
        return {"status": "ok", "peak_mib": PEAKS[args[1]]}

    monkeypatch.setattr(memory, "run_child", child)
    mlp, leak = benchmarks.load(["mlp", "leak"])
    record = memory.measure(mlp, "cpu", 1, Progress(40, io.StringIO()))
    assert asked == ["gradcore", "floor", "torch", REPLAY]
    assert record["ratios"]["replay/gradcore"] == pytest.approx(0.95)
    assert record["ratios"]["gradcore/torch"] == pytest.approx(400 / 440)
    monkeypatch.setattr(memory, "run_child", lambda *args, **kwargs: {"status": "ok"})
    assert REPLAY not in memory.measure(leak, "cpu", 1, Progress(30, io.StringIO()))["results"]


def test_a_replays_memory_child_measures_a_steady_state_step():
    """The child gets the replay after its recording and warm-up (in the factory) and still
    sees the step's own peak: memory malloc kept from the warm-up is no part of the baseline."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.memory", "mlp", REPLAY, "cpu", "1"],
                          cwd=REPO, env=thread_environment(1), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.splitlines()[-1])
    assert figures["status"] == "ok" and figures["tape_ops"] > 0
    assert figures["peak_mib"] > 1.0  # a step's activations and gradients: several MiB
    # started by hand, without the malloc settings the suite gives it, it starts itself again
    assert figures["meter"].endswith("; MALLOC_MMAP_THRESHOLD_=131072")


def test_every_memory_child_runs_with_the_same_malloc_settings(monkeypatch):
    environments = []

    def child(module, args, env=None, timeout=None):
        environments.append(env)
        return {"status": "ok", "peak_mib": 1.0}

    monkeypatch.setattr(memory, "run_child", child)
    mlp, = benchmarks.load(["mlp"])
    record = memory.measure(mlp, CPU, 1, Progress(40, io.StringIO()))
    assert len(environments) == 4 and all(
        env["MALLOC_MMAP_THRESHOLD_"] == "131072" and env["OMP_NUM_THREADS"] == "1"
        for env in environments)
    assert "(MALLOC_MMAP_THRESHOLD_=131072)" in record["summary"]
    assert "MALLOC" not in memory.measure(mlp, "cuda:0", 1, Progress(40, io.StringIO()))["summary"]


LEAKING_PROBE = """
import sys
from benchmarks import leak
from benchmarks.common import prepare, resolve_device
from benchmarks.memory import Meter
cpu = resolve_device("cpu")
contender = prepare("floor", leak.WORKLOAD.floor, cpu, 1)
kept = []
for size in map(int, sys.argv[1:]):
    def run():
        kept.append(bytearray(b"1" * size))
        return contender.run()
    figures, _ = leak.probe(run, Meter("floor", cpu))
    print(leak._independent({"memory": {"results": {"gradcore": {"status": "ok", **figures}}}})[1])
"""


def test_the_leak_target_sees_a_leak_smaller_than_one_iterations_arrays():
    """1,200 bytes an iteration leak 2.06 MiB between 200 and 2,000 iterations, twice the
    tolerance, but less than an iteration's arrays (~5 MiB) per 200: a baseline above them
    would hide it."""
    done = subprocess.run([sys.executable, "-c", LEAKING_PROBE, "1200", "0"], cwd=REPO,
                          env=memory.memory_environment(1), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]  # leaking: NOT met; then no leak: met


@pytest.mark.parametrize("kind", ["gradcore", "floor", "torch", REPLAY])
def test_a_training_steps_memory_baseline_holds_no_gradient(kind):
    """gradcore and PyTorch keep a step's gradients on the parameters, the floor drops its with
    the result: the probe starts them all from parameters alone, and counts the gradients the
    measured step makes."""
    workload, = benchmarks.load(["mlp"])
    if kind == "torch":
        pytest.importorskip("torch")
    contender = prepare(kind, getattr(workload, kind), CPU, 1)
    model = contender.run()[1]
    held = []

    class Meter:
        def start(self):
            held.append([name for name, p in model.items() if getattr(p, "grad", None) is not None])

        def peak_mib(self):
            return 0.0

    _, result = workload.memory.probe(contender.run, Meter())
    assert held == [[]]
    grads = result[2].values() if kind == "floor" else [p.grad for p in result[1].values()]
    assert all(g is not None for g in grads)


def test_a_replay_that_stops_computing_after_its_warm_up_is_reported(monkeypatch):
    compile = gradcore.compile

    class Frozen:
        """A compiled step that works through replayed()'s warm-up, then returns its last result."""

        def __init__(self, fn, **options):
            self.compiled, self.last = compile(fn, **options), None
            self.calls = 0

        def __call__(self):
            self.calls += 1
            if self.calls <= 2 + INTERPRETED_REPLAYS:  # the recording and the warm-up
                self.last = self.compiled()
            return self.last

        def stats(self):
            return self.compiled.stats()

    monkeypatch.setattr(gradcore, "compile", Frozen)
    workload, = benchmarks.load(["mlp"])
    workload = dataclasses.replace(workload, gradcore=None, floor=None, torch=None)  # the replay
    entry = run_workload(workload, CPU, 2, 0, 1, Progress(1, io.StringIO()))["results"][REPLAY]
    assert entry["status"] == "error", entry
    assert entry["error"].startswith("wrong result: replay: loss of step "), entry


@pytest.mark.parametrize("name", ["mlp", "conv"])
@pytest.mark.parametrize("kind", ["gradcore", "floor", "torch"])
def test_a_training_run_is_checked_against_the_floors_model_after_as_many_steps(name, kind):
    workload, = benchmarks.load([name])
    factory = getattr(workload, kind)
    run = (_torch_factory(factory) if kind == "torch" else factory)(CPU)  # one step taken
    for _ in range(3):
        result = run()
    workload.verify_steps(kind, result, 3, CPU)
    for calls in (2, 4):  # one step off is caught
        with pytest.raises(AssertionError, match=f"{kind}: loss of step {calls + 1} "):
            workload.verify_steps(kind, result, calls, CPU)


def test_ratio_targets_read_time_and_memory_ratios():
    workload, = benchmarks.load(["mlp"])
    record = _record(workload, TIMES, PEAKS)
    checks = {target.text: target.check(record)[:2] for target in workload.targets}
    assert checks == {"<= 1.15x the floor (NumPy on a CPU)": ("2.00x", False),
                      "replay <= 1.0x the floor": ("0.500x", True),
                      "replay peak memory <= gradcore's": ("0.950x", True)}
    record["memory"]["ratios"]["replay/gradcore"] = None
    assert workload.targets[2].check(record) == ("n/a", None)
    # the floor on a GPU is CuPy's: the target about NumPy's is not measured there
    assert workload.targets[0].check({**record, "device": "cpu"}) == ("2.00x", False)
    assert workload.targets[0].check({**record, "device": "cuda:0"}) == ("n/a on cuda:0", None)
    assert workload.targets[1].check({**record, "device": "cuda:0"})[1] is True


def test_a_run_records_each_target_with_its_row(monkeypatch):
    def builds(value):
        return lambda device: lambda: value

    workload = Workload("tiny", "a run", 1, "run", "one run", gradcore=builds(1),
                        floor=builds(1), replay=builds(1), verify=lambda kind, result: None,
                        targets=(ratio_target("fast", "gradcore/floor", 1e9),
                                 ratio_target("faster", "gradcore/floor", 0.0),
                                 Target("replayed", lambda record: ("once", True), row="replay")))
    args = argparse.Namespace(repeat=1, warmup=0, threads=1)
    versions = {"numpy": "2.4.6", "torch": None}
    record = suite.run_one(workload, resolve_device("cpu"), args, "python -m benchmarks",
                           "2026-01-02T03:04:00+00:00", {"git": None, "versions": versions},
                           Progress(1, io.StringIO()))
    assert record["versions"] == versions  # its own: a later --only run may have others
    assert [(t["text"], t["met"], t["row"]) for t in record["targets"]] == [
        ("fast", True, "time"), ("faster", False, "time"), ("replayed", True, "replay")]
    assert record["targets"][0]["measured"].endswith("x")
    lines = table([record], targets=True)
    assert lines[1][-1] == "fast: met; faster: **NOT met**"
    assert lines[2][0] == "  replay" and lines[2][-1] == "replayed: met"


def test_the_suites_thread_pools_sleep_when_idle_so_turns_do_not_slow_each_other():
    environment = thread_environment(2)
    assert environment["OMP_NUM_THREADS"] == environment["OPENBLAS_NUM_THREADS"] == "2"
    assert environment["OMP_WAIT_POLICY"] == "PASSIVE"
    assert environment["OPENBLAS_THREAD_TIMEOUT"] == "4"


def _successions(order):
    """{(before, after): how often `after` ran right after `before`} in the run order `order`."""
    return collections.Counter(zip(order, order[1:]))


def _untimed(run, sync):
    """common.time_once without its gc.collect(), which takes 0.2 s in a test process that holds
    PyTorch and more: for tests of the order of the runs, not their times."""
    return 0.0, run()


def test_each_implementation_runs_after_every_other_as_often(monkeypatch):
    monkeypatch.setattr(common, "time_once", _untimed)
    order = []

    def builds(key):
        return lambda device: lambda: order.append(key)

    # four implementations, as most workloads have, and the default rounds: 3 warm-up, 20 timed
    workload = Workload("tiny", "a run", 1, "run", "one run", gradcore=builds("gradcore"),
                        floor=builds("floor"), replay=builds("replay"),
                        references=(("other", "a reference", builds("other")),),
                        verify=lambda kind, result: None)
    args = argparse.Namespace(repeat=20, warmup=3, threads=1)
    suite.run_one(workload, CPU, args, "python -m benchmarks", "2026-01-02T03:04:00+00:00",
                  {"git": None, "versions": {}}, Progress(1, io.StringIO()))
    keys = ("gradcore", "floor", "replay", "other")
    assert all(sorted(order[i:i + 4]) == sorted(keys) for i in range(0, len(order), 4))
    done = _successions(order)
    assert not any(done[key, key] for key in keys)
    counts = [done[a, b] for a in keys for b in keys if a != b]
    assert max(counts) - min(counts) <= 1, done


@pytest.mark.parametrize("count", range(1, 7))
def test_turns_balance_the_successions_after_any_number_of_rounds(count):
    rounds = common.turns(count, 40)
    assert common.turns(count, 0) == [] and common.turns(0, 2) == [[], []]
    assert all(sorted(order) == list(range(count)) for order in rounds)
    assert rounds == common.turns(count, 40)  # the same every run
    runs = []
    for order in rounds:  # after every round: as balanced as whole rounds allow
        runs += order
        done = _successions(runs)
        counts = [done[a, b] for a in range(count) for b in range(count) if a != b]
        assert max(counts, default=0) - min(counts, default=0) <= 1, (len(runs), done)
        assert count == 1 or not any(done[a, a] for a in range(count))


def test_a_result_is_let_go_before_any_other_run_and_the_last_is_checked(monkeypatch):
    monkeypatch.setattr(common, "time_once", _untimed)
    alive, results, checked = [], [], []

    class Result:
        pass

    def builds(key):
        def run():
            alive.append(sum(ref() is not None for ref in results))
            result = Result()
            results.append(weakref.ref(result))
            return result
        return lambda device: run

    workload = Workload("tiny", "a run", 1, "run", "one run", gradcore=builds("gradcore"),
                        floor=builds("floor"), replay=builds("replay"),
                        verify=lambda kind, result: checked.append((kind, type(result))))
    record = run_workload(workload, CPU, 3, 1, 1, Progress(1, io.StringIO()))
    assert alive == [0] * 12  # gradcore's result holds its whole graph
    assert sorted(checked) == [(kind, Result) for kind in ("floor", "gradcore", "replay")]
    assert record["results"]["gradcore"]["status"] == "ok"


def test_a_wrong_last_result_is_reported_and_not_timed():
    def builds(value):
        return lambda device: lambda: value

    def verify(kind, result):
        if result != 1:
            raise AssertionError(f"{kind}: got {result}")

    workload = Workload("tiny", "a run", 1, "run", "one run", gradcore=builds(2),
                        floor=builds(1), verify=verify)
    results = run_workload(workload, CPU, 2, 0, 1, Progress(1, io.StringIO()))["results"]
    assert results["gradcore"] == {"status": "error", "error": "wrong result: gradcore: got 2"}
    assert results["floor"]["status"] == "ok"


def test_an_older_records_target_index_becomes_a_row_id():
    report = json.loads(ONE_TARGET_JSON.read_text())
    old = report["workloads"]
    assert old["deep"]["target"]["row"] == 1 and "targets" not in old["deep"]
    assert [t["row"] for t in targets_of(old["chain"])] == ["time"]
    assert [t["row"] for t in targets_of(old["deep"])] == ["peak_mib"]  # memory row 1
    assert [t["row"] for t in targets_of(old["leak"])] == ["growth_2000_mib"]  # no time row
    assert targets_of(old["conv"]) == []
    assert upgraded(old["deep"])["targets"] == targets_of(old["deep"])
    assert "target" not in upgraded(old["deep"]) and upgraded(old["conv"]) is old["conv"]
    # a record with a replay row and the old index: the target still goes on the memory row
    old["deep"]["results"][REPLAY] = {"status": "ok", "median_ms_per_run": 200.0,
                                      "median_s_per_run": 0.2}
    goals = {cells[0]: cells[-1] for cells in table(old.values(), targets=True)[1:]}
    assert goals["deep, peak memory"] == "peak memory ≤ PyTorch's: met"
    assert goals["  replay"] == "" and goals["deep"] == ""
    assert goals["leak, 2,000 iterations"].endswith(": met") and goals["leak, 200 iterations"] == ""


def test_results_md_renders_from_an_older_json_file(tmp_path):
    shutil.copy(ONE_TARGET_JSON, tmp_path / "cpu.json")
    written = write_all(str(tmp_path), str(tmp_path / "RESULTS.md"))
    assert str(tmp_path / "RESULTS.md") in written
    text = (tmp_path / "RESULTS.md").read_text()
    assert "| deep, peak memory | MiB |" in text
    line, = [line for line in text.splitlines() if line.startswith("| deep, peak memory")]
    assert line.endswith("| peak memory ≤ PyTorch's: met |")


def test_the_terminal_lists_every_target_of_a_workload(capsys):
    report = json.loads(ONE_TARGET_JSON.read_text())
    chain = report["workloads"]["chain"]
    del chain["target"]
    chain["targets"] = [
        {"text": "<= 0.6x PyTorch, time per op", "measured": "0.478x", "met": True,
         "row": "time"},
        {"text": "replay <= 0.25x PyTorch", "measured": "n/a", "met": None, "row": "replay"}]
    print_table(report, "µs")
    out = capsys.readouterr().out
    section = out.split("\ntargets:\n")[1].split("\n\n")[0].splitlines()
    assert section[:3] == ["  chain: <= 0.6x PyTorch, time per op: 0.478x, met",
                           "  chain: replay <= 0.25x PyTorch: n/a, not measured",
                           "  wide: <= 0.6x PyTorch: 0.862x, NOT met"]
    assert max(map(len, out.splitlines())) <= 100
