"""benchmarks/distributed.py runs under `mpiexec -n 2` and writes every figure it promises: a
--quick run (figures that mean little), checked for presence and sanity, never for speed."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"
BUCKETS = ("256KiB", "4MiB", "64MiB")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    pytest.importorskip("mpi4py")
    if not MPIEXEC.exists():
        pytest.skip(f"no mpiexec beside {sys.executable} (pip install mpich)")
    path = tmp_path_factory.mktemp("distributed") / "figures.json"
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-m",
                           "benchmarks.distributed", "--quick", "--json", str(path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "[cpu, 2 ranks]" in done.stdout and "[cpu, 1 rank]" in done.stdout, done.stdout
    return json.loads(path.read_text())


def _positive(figure):
    return isinstance(figure["value"], float) and math.isfinite(figure["value"]) \
        and figure["value"] > 0


def test_every_step_figure_is_there_and_positive(report):
    assert (report["device"], report["ranks"]) == ("cpu", 2)
    figures = report["figures"]
    steps = ["step_1_rank", "step_2_ranks_no_communication", "speedup_2_ranks",
             *(f"step_2_ranks_{overlap}_{bucket}" for bucket in BUCKETS
               for overlap in ("overlap", "no_overlap")),
             *(f"{kind}_in_step_{overlap}_{bucket}" for kind in ("allreduce", "synchronize")
               for bucket in BUCKETS for overlap in ("overlap", "no_overlap")),
             *(f"ratio_overlap_over_no_overlap_{bucket}" for bucket in BUCKETS)]
    for key in steps:
        assert key in figures, key
        assert _positive(figures[key]), (key, figures[key])
        assert figures[key]["device"] == "cpu" and figures[key]["what"]
    assert figures["step_1_rank"]["ranks"] == 1 and figures["step_1_rank"]["unit"] == "ms"
    assert figures["step_2_ranks_overlap_4MiB"]["ranks"] == 2
    timed = figures["step_2_ranks_overlap_4MiB"]
    assert timed["median_of"] == report["settings"]["steps"] == len(timed["samples_s"])
    assert len(timed["per_rank"]) == 2 and all(m > 0 for m in timed["per_rank"])
    # the all-reduce is timed inside the steps: each sample, so the median too, is below theirs
    for bucket in BUCKETS:
        assert figures[f"allreduce_in_step_no_overlap_{bucket}"]["value"] <= \
            figures[f"step_2_ranks_no_overlap_{bucket}"]["value"]


def test_the_allreduce_is_compared_with_mpi4py(report):
    figures = report["figures"]
    for bucket in BUCKETS:
        for key in (f"allreduce_gradcore_{bucket}", f"allreduce_synchronize_{bucket}",
                    f"allreduce_reducer_alone_{bucket}", f"allreduce_mpi4py_same_buffers_{bucket}",
                    f"ratio_reducer_alone_over_mpi4py_same_buffers_{bucket}",
                    f"ratio_allreduce_gradcore_over_mpi4py_same_buffers_{bucket}",
                    f"ratio_allreduce_gradcore_over_mpi4py_one_buffer_{bucket}"):
            assert _positive(figures[key]), (key, figures.get(key))
        ratio = figures[f"ratio_reducer_alone_over_mpi4py_same_buffers_{bucket}"]
        assert ratio["unit"] == "x" and ratio["ranks"] == 2
    assert _positive(figures["allreduce_mpi4py_one_buffer"])
    # the buckets hold every gradient once, plus a flag per parameter: 1,796,010 float32 + 6
    sizes = report["bucket_buffers_bytes"]
    assert {bucket: sum(sizes[bucket]) for bucket in BUCKETS} == \
        dict.fromkeys(BUCKETS, (1_796_010 + 6) * 4)
    assert len(sizes["256KiB"]) > len(sizes["4MiB"]) > len(sizes["64MiB"]) == 1


def test_pytorch_ddp_stands_beside_it_or_says_why_not(report):
    figures = report["figures"]
    if "torch_step_2_ranks_ddp" not in figures:
        assert any("PyTorch" in note for note in report["notes"]), report["notes"]
        return
    for key in ("torch_step_1_rank", "torch_step_2_ranks_no_communication",
                "torch_step_2_ranks_ddp", "allreduce_gloo_one_buffer",
                "ratio_step_gradcore_over_torch_ddp_2_ranks"):
        assert _positive(figures[key]), (key, figures.get(key))
    assert isinstance(figures["torch_ddp_overhead_2_ranks"]["value"], float)


def test_a_json_path_that_cannot_be_written_is_refused_before_the_steps(tmp_path, capsys):
    from benchmarks import distributed
    missing = tmp_path / "no_such_folder" / "figures.json"
    for path, problem in ((missing, f"there is no folder {missing.parent}: make it"),
                          (tmp_path, "a folder: name a file for the figures")):
        with pytest.raises(SystemExit) as info:
            distributed.parse_args(["--quick", "--json", str(path)])
        assert info.value.code == 2
        assert f"error: --json {path}: {problem}" in capsys.readouterr().err
    path = tmp_path / "figures.json"
    assert distributed.parse_args(["--json", str(path)]).json == str(path)
    assert not path.exists()  # the check writes nothing
