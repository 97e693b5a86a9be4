"""gradcore.distributed on real processes: each test launches `mpiexec -n K` on
tests/distributed/worker.py (MPICH from the `mpi` extra) and checks what every rank wrote."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mpi4py", reason="needs the mpi extra: pip install 'gradcore[mpi]'")
MPIEXEC = Path(sys.executable).parent / "mpiexec"
if not MPIEXEC.exists():
    pytest.skip(f"no mpiexec beside {sys.executable}: pip install 'gradcore[mpi]'",
                allow_module_level=True)
WORKER = Path(__file__).with_name("worker.py")


def launch(scenario, tmp_path, ranks=2, timeout=60.0, expect_failure=False, limit=120):
    """Run `scenario` on `ranks` processes (`timeout`: dist.init's; `limit`: seconds the job
    may take); the ranks' results, or (for a failure) the output."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([str(MPIEXEC), "-n", str(ranks), sys.executable, str(WORKER),
                           scenario, str(tmp_path), str(timeout)],
                          capture_output=True, text=True, timeout=limit, env=env)
    if expect_failure:
        assert done.returncode != 0
        return done.stdout + done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)]


def test_ranks_know_who_they_are(tmp_path):
    ranks = launch("shares", tmp_path, ranks=3)
    assert [(r["rank"], r["size"]) for r in ranks] == [(0, 3), (1, 3), (2, 3)]
    assert sorted(r["local_rank"] for r in ranks) == [0, 1, 2]  # one machine


@pytest.mark.parametrize("ranks", [2, 3])
def test_shares_are_equal_and_cover_every_example(tmp_path, ranks):
    results = launch("shares", tmp_path, ranks=ranks)
    for kind in ("plain", "mixed", "fresh"):  # fresh: seed=None, rank 0's seed on every rank
        shares = [r[kind] for r in results]
        assert len({len(s) for s in shares}) == 1  # every rank takes as many steps
        everything = [i for s in shares for i in s]
        assert sorted(set(everything)) == list(range(100))
        assert len(everything) - 100 == (-100) % ranks  # the fewest made up from the start
    assert results[0]["plain"][:3] == [0, 1, 2] and results[0]["mixed"][:3] != [0, 1, 2]
    assert results[0]["fresh"] != results[0]["mixed"]


def test_both_optimizer_styles_end_bit_identical_on_every_rank(tmp_path):
    first, second = launch("spiral", tmp_path)
    for style in ("step", "update"):
        assert first[style]["digests"] == second[style]["digests"]
        # the optimizer's hooks ran after the averaging: they saw the same gradients
        assert first[style]["hook_saw"] == second[style]["hook_saw"]
        assert len(first[style]["hook_saw"]) == 4 * 10  # 4 epochs of 150 / 15 batches
        assert first[style]["share"] == 150 and first[style]["buckets"] > 1


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_train_as_one_process_on_the_union(tmp_path, ranks):
    results = launch("equivalence", tmp_path, ranks=ranks)
    assert all(r["digests"] == results[0]["digests"] for r in results)  # bit-identical
    assert results[0]["share"] == 300 // ranks
    assert results[0]["max_difference"] < 1e-5  # float32 rounding of a different sum order


def test_buckets_overlap_and_two_backwards_give_the_same_sums(tmp_path):
    results = launch("buckets", tmp_path)
    for r in results:
        reference = r["one"]["grads"]
        for name in ("many", "no_overlap", "twice"):
            for key, grad in r[name]["grads"].items():
                if grad is None:
                    assert reference[key] is None
                else:
                    np.testing.assert_allclose(grad, reference[key], rtol=1e-6, atol=1e-6)
        # 48 bytes: (2.b, 2.W) and (1.b, 1.W) share one; each of the 6 others has its own
        assert r["one"]["buckets"] == 1 and r["many"]["buckets"] == 8
        assert r["one"]["started_in_backward"] == 0  # the first step checks the ranks first
        assert r["many"]["started_in_second_backward"] > 0  # then buckets start in backward
        assert r["no_overlap"]["started_in_second_backward"] == 0
        for name in ("one", "many", "no_overlap", "twice"):  # a parameter idle last step
            np.testing.assert_allclose(r[name]["spare_b_everyone"], [8.0, 8.0], rtol=1e-6)
    assert results[0]["one"]["grads"] == results[1]["one"]["grads"]
    grads = results[0]["one"]["grads"]
    assert grads["2.W"] is None and grads["2.b"] is None  # no rank used it: no gradient
    # only rank 0 used `spare`: its gradient is rank 0's, averaged with rank 1's zeros
    np.testing.assert_allclose(grads["1.b"], [8 / 2, 8 / 2], rtol=1e-6)


def test_buckets_started_at_different_moments_on_the_ranks_give_the_same_sums(tmp_path):
    results = launch("uneven", tmp_path, timeout=10.0)
    for r in results:
        for step, (early, late) in enumerate(zip(r["overlap"]["grads"],
                                                 r["no_overlap"]["grads"])):
            assert early.keys() == late.keys()
            for key in early:
                if late[key] is None:
                    assert early[key] is None, (step, key)
                else:
                    np.testing.assert_allclose(early[key], late[key], rtol=1e-6, atol=1e-6,
                                               err_msg=f"step {step}, {key}")
    for name in ("overlap", "no_overlap"):
        assert results[0][name]["digests"] == results[1][name]["digests"]
    assert results[0]["overlap"]["grads"][2]["1.b"] == [4.0, 4.0]  # rank 1's, halved


def test_buffers_are_averaged_over_the_ranks_at_each_step(tmp_path):
    first, second = launch("buffers", tmp_path)
    assert first["mean"]["after"] == second["mean"]["after"]  # bit-identical
    for name in ("1.avg_mean", "1.avg_var"):
        assert first["mean"]["own"][name] != second["mean"]["own"][name]  # their own data
        np.testing.assert_allclose(
            first["mean"]["after"][name],
            np.mean([first["mean"]["own"][name], second["mean"]["own"][name]], axis=0),
            rtol=1e-6)
        # buffers=None: each rank keeps its own
        assert first["None"]["after"][name] == first["None"]["own"][name]
        assert first["None"]["after"][name] != second["None"]["after"][name]


def test_a_buffer_registered_after_the_first_step_raises_on_every_rank(tmp_path):
    for r in launch("late_buffer", tmp_path):
        assert r["step"] == 1
        assert "the model's buffers changed after the first step (stat registered)" in r["error"]


def test_different_models_are_named_at_broadcast_on_every_rank(tmp_path):
    for r in launch("mismatch", tmp_path):
        assert "0.W is (2, 4) on rank 1 but (2, 3) on rank 0" in r["error"]
        assert "Build the same model on every rank" in r["error"]


def test_forgetting_the_broadcast_is_caught_at_the_first_step(tmp_path):
    for r in launch("forgot_broadcast", tmp_path):
        assert "rank 1 differs from rank 0 in parameter 0 (2, 3)" in r["error"]
        assert "dist.broadcast_parameters(model, comm)" in r["error"]


@pytest.fixture(scope="module")
def changes_and_settings(tmp_path_factory):
    """One job of 2 ranks for the scenarios below; a 20 s deadline, so that a wait on ranks
    that disagree fails the tests in seconds, not minutes."""
    return launch("changes_and_settings", tmp_path_factory.mktemp("changes"), timeout=20.0)


@pytest.mark.parametrize("setting, values", [("bucket_size", "1048576 on rank 0, 40 on rank 1"),
                                             ("overlap", "True on rank 0, False on rank 1"),
                                             ("buffers", "'mean' on rank 0, 'root' on rank 1")])
def test_ranks_given_different_settings_raise_at_once_naming_them(changes_and_settings,
                                                                  setting, values):
    for r in changes_and_settings:
        result = r["settings"][setting]
        assert (f"the ranks were given different settings ({setting} {values}): give "
                "DistributedOptimizer the same bucket_size, overlap and buffers") in result["error"]
        assert result["seconds"] < 5  # at the check, not at the all-reduce's deadline


@pytest.mark.parametrize("overlap", ["True", "False"])
def test_a_layer_replaced_after_the_first_step_is_averaged(changes_and_settings, overlap):
    first, second = (r["changes"][overlap] for r in changes_and_settings)
    assert first["digests"] == second["digests"]
    assert first["planned"] == ["0.W", "0.b", "1.W", "1.b"]  # the new layer's included
    # float64: as one process on the mean of the ranks' losses, to the last bit here
    assert first["max_difference"] < 1e-14


@pytest.mark.parametrize("form", ["synchronize", "plain"])
@pytest.mark.parametrize("overlap", ["True", "False"])
def test_clipping_before_the_step_clips_the_mean_with_one_all_reduce(changes_and_settings,
                                                                     overlap, form):
    """backward(); [opt.synchronize();] clip_grad_norm_(); step(): as one process on the whole
    batch (clip_grad_norm_ averages first, where synchronize() was not called)."""
    first, second = (r["clip"][f"{overlap} {form}"] for r in changes_and_settings)
    assert first["norms"] == second["norms"]  # the norm of the mean, the same on every rank
    np.testing.assert_allclose(first["norms"], first["alone_norms"], rtol=1e-12)
    assert first["max_difference"] < 1e-14  # one process on the whole batch, clipped
    assert first["started"] == [1, 1, 1, 1]  # the step summed nothing again


@pytest.mark.parametrize("overlap", ["True", "False"])
def test_a_gradient_set_anew_before_the_averaging_warns_with_overlap(changes_and_settings,
                                                                     overlap):
    warned = changes_and_settings[0]["clip"][f"{overlap} warnings"]
    if overlap == "False":  # no hooks in backward to see it
        assert warned == []
        return
    assert len(warned) == 1
    assert ("the gradients of 0.W, 0.b, 1.W, 1.b were set anew after backward, before the "
            "ranks' gradients were averaged") in warned[0]
    assert "so training may differ from one process on the whole batch" in warned[0]
    assert ("To change the averaged gradients instead, and silence this warning, call "
            "opt.synchronize() after backward and before the change") in warned[0]


def test_one_clip_over_two_optimizers_averages_each_with_itself(changes_and_settings):
    """The ranks keep the optimizers in opposite orders: each is still summed with itself."""
    for r in changes_and_settings:
        assert r["two"]["max_difference"] < 1e-12  # the mean of the ranks' gradients, float64


@pytest.mark.parametrize("form", ["clip", "clip twice", "synchronize"])
@pytest.mark.parametrize("overlap", ["True", "False"])
def test_a_backward_on_one_rank_after_the_averaging_is_summed_on_every_rank(
        changes_and_settings, overlap, form):
    """Rank 0 runs one more backward after the clip (or synchronize, or between two clips):
    every rank sums again, as without the clip, and nothing waits out the deadline."""
    first, second = (r["uneven"][f"{overlap} {form}"] for r in changes_and_settings)
    assert first["digests"] == second["digests"]
    assert first["max_difference"] < 1e-15  # as training without the clip, float64


@pytest.mark.parametrize("overlap", ["True", "False"])
def test_a_compiled_step_that_clips_replays_and_trains_as_one_process(changes_and_settings,
                                                                     overlap):
    for r in changes_and_settings:
        result = r["compiled"][overlap]
        # without overlap the first call registers the hooks that stay: the next records again
        assert (result["recordings"], result["replays"]) == ((1, 4) if overlap == "True"
                                                             else (2, 3))
        assert result["max_difference"] < 1e-14  # one process on the whole batch, clipped


@pytest.mark.parametrize("program", ["backward compiled", "whole step compiled",
                                     "a clip after the step"])
@pytest.mark.parametrize("overlap", ["True", "False"])
def test_a_replayed_backward_after_an_averaging_is_summed_on_every_rank(changes_and_settings,
                                                                        overlap, program):
    """A backward gradcore.compile replays after a clip (between two micro-batches, or after a
    compiled step to log the norm) is summed at the next step: a replay calls no hook."""
    first, second = (r["compiled_after_averaging"][f"{overlap} {program}"]
                     for r in changes_and_settings)
    assert first["digests"] == second["digests"]
    assert first["max_difference"] < 1e-14  # one process on the whole batch, float64
    # one recording for each set of hooks and of grads present it meets, then replays; without
    # overlap, the first call registers the hooks that stay, and the next records again
    assert first["tapes"] <= 3 and first["replays"] >= 3
    assert first["recordings"] == first["tapes"] + (overlap == "False"
                                                    and program == "whole step compiled")


@pytest.mark.parametrize("then", ["zero_grad", "setup"])
def test_a_backward_on_one_rank_then_dropped_leaves_training_as_it_was(changes_and_settings,
                                                                        then):
    """Rank 0 alone runs a backward (overlap: its buckets start), then zero_grad on rank 0 or
    setup(model) on every rank drops it."""
    first, second = (r["one_rank_backward"] for r in changes_and_settings)
    assert first[then] == second[then] == first["nothing"]  # float64, to the bit


def test_each_optimizer_sums_with_itself_whatever_order_backward_finishes_them(tmp_path):
    """Two optimizers whose buckets start in backward in opposite orders on the ranks, and the
    program's own collectives between backward and the steps: each is the mean of the ranks'
    gradients. Before each optimizer had a communicator of its own, MPI paired one's sums with
    the other's (off by 2.0 here) or with the program's all-gather (a wait to the deadline)."""
    for r in launch("own_channels", tmp_path, timeout=20.0, limit=90):
        assert max(r["worst"]) < 1e-12, r["worst"]  # float64, at each step
        assert r["made"] == 2100  # each optimizer's communicator freed with it


def test_a_root_that_cannot_save_or_read_its_parameters_stops_every_rank_at_once(tmp_path):
    first, second = launch("root_fails", tmp_path, timeout=20.0, limit=90)
    assert first["save"].startswith("FileNotFoundError: ")  # rank 0's own
    assert second["save"].startswith(
        "DistributedError: rank 0 failed in save_on_root (FileNotFoundError: ")
    assert str(tmp_path / "missing") in second["save"]
    # a result no JSON carries fails on every rank too, not at the deadline
    assert first["unsent"] == "TypeError: Object of type set is not JSON serializable"
    assert second["unsent"] == ("DistributedError: rank 0 failed in a set (TypeError: Object "
                                "of type set is not JSON serializable); every rank stops there")
    assert first["broadcast"] == "RuntimeError: the device is gone, on purpose"
    assert second["broadcast"] == (
        "DistributedError: broadcast_parameters: rank 0 could not read its parameters "
        "(RuntimeError: the device is gone, on purpose); every rank stops there")
    for r in (first, second):
        assert r["seconds"] < 10  # at once, not at the deadline (20 s)
        assert r["saved"] == str(tmp_path / "model.npz")  # the next collectives pair


def test_a_rank_that_calls_sys_exit_stops_the_others_with_its_name_and_status(tmp_path):
    start = time.monotonic()
    output = launch("exits", tmp_path, timeout=30.0, expect_failure=True, limit=90)
    assert ("DistributedError: rank 1 exited (status 2) without taking part; rank 0 stops in "
            "the gradient all-reduce") in output
    assert time.monotonic() - start < 20  # within EXIT_GRACE (2 s), not at the deadline


def test_ranks_that_end_at_different_times_end_without_error(tmp_path):
    start = time.monotonic()
    first, second = launch("ends_apart", tmp_path)
    assert first["heard"] == {"1": "its program ended"} and second["heard"] == {}
    assert time.monotonic() - start < 20  # no rank waits for the others' word at its end


def test_lazy_layers_broadcast_before_their_first_call_agree(tmp_path):
    first, second = launch("lazy", tmp_path)
    assert first["digests"] == second["digests"]
    # the head, first called after the encoder's first step, drew root's weights too: the
    # generators came back only once both models were sized
    assert first["head"] == second["head"]
    assert first["between"] == second["between"]
    # then each rank draws its own numbers: rank 1 from its seed (1), where it was at the
    # first broadcast; rank 0 goes on from where the lazy layers left its generator
    assert second["drawn"] == np.random.RandomState(1).rand(3).tolist()
    assert first["drawn"] != second["drawn"]
    for r in (first, second):  # a lazy model never broadcast: the error says why it differs
        assert "rank 1 differs from rank 0 in parameter 0 (2, 2)" in r["late"]
        assert "draw from their own random generators again since an earlier step" in r["late"]


def test_save_on_root_writes_once_and_every_rank_sees_it(tmp_path):
    for r in launch("save", tmp_path):
        assert r["path"] == str(tmp_path / "model.npz") and r["exists"] and r["same"]
        assert r["into_file"] is None and r["same_from_file"]  # rank 0's file object


@pytest.mark.parametrize("scenario, ranks", [("fails", 2), ("fails_slowly", 2),
                                             ("two_fail_slowly", 3)])
def test_a_rank_that_raises_stops_the_others_with_its_name(tmp_path, scenario, ranks):
    start = time.monotonic()
    output = launch(scenario, tmp_path, ranks=ranks, expect_failure=True)
    assert "ValueError: a bad batch, on purpose" in output
    assert re.search(r"DistributedError: rank [12] failed \(ValueError: a bad batch, on "
                     r"purpose\); rank 0 stops in the gradient all-reduce", output)
    assert time.monotonic() - start < 30


def test_a_wait_after_a_failure_was_heard_raises_at_once(tmp_path):
    output = launch("fails_then_waits_again", tmp_path, expect_failure=True)
    seconds = re.search(r"second error after ([\d.]+) s: rank 1 failed earlier \(ValueError: "
                        r"a bad batch, on purpose\); rank 0 stops in a barrier after the "
                        r"failure", output)
    assert seconds and float(seconds.group(1)) < 5  # not at rank 1's abort, 30 s on


def test_an_exception_that_cannot_be_printed_is_still_a_failure(tmp_path):
    output = launch("fails_unprintably", tmp_path, expect_failure=True)
    assert "Error in sys.excepthook" not in output
    assert ("DistributedError: rank 1 failed (Unprintable: <exception str() failed>); rank 0 "
            "stops in the gradient all-reduce") in output


def test_a_rank_that_stops_taking_part_times_the_others_out(tmp_path):
    start = time.monotonic()
    output = launch("stuck", tmp_path, timeout=1.0, expect_failure=True)
    assert "rank 0: the gradient all-reduce did not complete within 1 s" in output
    assert time.monotonic() - start < 30


def test_a_rank_that_raises_ends_the_job_while_the_others_are_busy_elsewhere(tmp_path):
    # MPICH's MPI_Finalize, which mpi4py calls at exit, waits for every rank: without its
    # MPI_Abort the failing rank would wait there, and mpiexec end nothing, for rank 0's 60 s
    start = time.monotonic()
    output = launch("fails_elsewhere", tmp_path, expect_failure=True, limit=30)
    assert "ValueError: a bad batch, on purpose" in output
    assert time.monotonic() - start < 15


def test_a_rank_that_raises_before_init_stops_the_others_at_its_deadline(tmp_path):
    start = time.monotonic()
    # a deadline the healthy ranks meet on a loaded 2-core machine (importing takes seconds)
    output = launch("fails_before_init", tmp_path, ranks=3, timeout=8.0, expect_failure=True,
                    limit=40)
    assert "FileNotFoundError: rank 1 could not read its data, on purpose" in output
    # Either rank 1 exits (MPICH's finalize does not always wait) and mpiexec ends the job, or
    # it waits in finalize and rank 0 raises at the deadline, and its abort ends the job
    if "DistributedError" in output:
        assert ("DistributedError: rank 0: not every rank of 3 reached dist.init within 8 s: "
                "one may have failed before (its output then shows the error)") in output
    assert time.monotonic() - start < 30  # no rank waits for ever


def test_init_takes_none_of_the_programs_own_messages(tmp_path):
    first = launch("receives_before_init", tmp_path, ranks=3)[0]
    assert first["got"] == ["hello from 1", "hello from 2"]


def test_a_compiled_step_with_a_closure_sums_at_every_replay(tmp_path):
    first, second = launch("compiled_closure", tmp_path)
    for r in (first, second):  # replayed training is eager training, to the bit
        assert r["compiled"] == dict(r["eager"], replays=3)
    assert first["compiled"]["losses"] != second["compiled"]["losses"]  # their own batches
    assert first["compiled"]["digests"] == second["compiled"]["digests"]  # the same model
    assert first["compiled"]["buffers"] == second["compiled"]["buffers"]


def test_the_demo_trains_the_spiral_on_two_ranks(tmp_path):
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-m", "gradcore.demo",
                           "--distributed", "--no-plot", "--epochs", "40"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2])))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2  # rank 0 speaks for the job
    assert lines[0].startswith("MLP (2-30-30-3, relu) on 150 spiral points, on each of 2 ranks")
    accuracy = float(lines[1].split("train accuracy ")[1].split("%")[0])
    assert accuracy > 90
