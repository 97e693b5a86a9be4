"""gradcore.demo: the spiral MLP and the Shapes conv net learn on every device; the command line,
its PNGs, its progress bar and its errors."""
import io
import subprocess
import sys
import types

import numpy as np
import pytest

import backends
import gradcore
from conftest import DEVICE1
from gradcore import demo
from gradcore.datasets import Shapes


# =============================================================================== training
def test_spiral_reaches_95_percent(xp2):
    result = demo.train_spiral(device=xp2.device, epochs=30, progress=False)
    assert result["accuracy"] > 0.95 and result["test_accuracy"] > 0.93
    assert len(result["loss"]) == 30 and result["loss"][-1] < result["loss"][0] / 5
    assert result["device"] == xp2.device and result["files"] == []
    for p in result["model"].parameters():
        assert p.backend is xp2.backend and p.device == xp2.device


def test_spiral_runs_repeat_with_the_seed():
    a = demo.train_spiral(device="cpu", epochs=3, progress=False)
    b = demo.train_spiral(device="cpu", epochs=3, progress=False)
    assert a["loss"] == b["loss"]
    c = demo.train_spiral(device="cpu", epochs=3, seed=1, progress=False)
    assert c["loss"] != a["loss"]


def test_conv_net_learns_the_shapes(xp2):
    result = demo.train_conv(device=xp2.device, epochs=8, lr=0.01, num_per_class=80,
                             progress=False)
    assert result["examples"] == 320
    assert result["accuracy"] > 0.95 and result["test_accuracy"] > 0.9
    assert result["loss"][-1] < result["loss"][0] / 2


def digits_npz(folder, n_train=600, n_test=200):
    """An mnist.npz of 28x28 uint8 'digits': each class a fixed random stroke pattern, each image
    that pattern shifted by up to a pixel, dimmed and noised, so an MLP has something to learn."""
    rng = np.random.default_rng(0)
    patterns = (rng.random((10, 28, 28)) < 0.15) * 200.0
    arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        y = rng.integers(0, 10, n)
        shifts = rng.integers(-1, 2, (n, 2))
        x = np.stack([np.roll(patterns[c], tuple(s), axis=(0, 1)) for c, s in zip(y, shifts)])
        x = x * rng.uniform(0.6, 1.0, (n, 1, 1)) + rng.normal(0, 30, x.shape)
        arrays[f"x_{split}"] = np.clip(x, 0, 255).astype(np.uint8)
        arrays[f"y_{split}"] = y.astype(np.uint8)
    np.savez(folder / "mnist.npz", **arrays)


def test_mnist_mlp_learns_from_the_cache(tmp_path, monkeypatch):
    digits_npz(tmp_path)
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    result = demo.train_mnist(device="cpu", epochs=8, lr=0.003, hidden=64, progress=False)
    assert result["examples"] == 600 and result["task"] == "mnist"
    assert result["accuracy"] > 0.95 and result["test_accuracy"] > 0.9
    assert result["loss"][-1] < result["loss"][0] / 3
    assert result["model"].l0.W.shape == (784, 64)


def test_mnist_unavailable_says_which_files_to_put_where(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    monkeypatch.setattr(gradcore.datasets.MNIST, "MIRRORS", ("http://127.0.0.1:1/",))
    assert demo.main(["--task", "mnist", "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert "--task mnist needs MNIST" in err
    assert f"put the file at {tmp_path / 'mnist' / 'train-images-idx3-ubyte.gz'}" in err


def test_mnist_unreadable_is_a_message_not_a_traceback(tmp_path, monkeypatch, capsys):
    (tmp_path / "mnist.npz").write_text("not an archive")
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    assert demo.main(["--task", "mnist", "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert f"--task mnist could not read MNIST: MNIST: {tmp_path / 'mnist.npz'} is not a readable" \
        in err
    (tmp_path / "file").write_text("")  # a cache folder that cannot be made
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path / "file" / "data"))
    assert demo.main(["--task", "mnist", "--no-plot"]) == 2
    assert ("--task mnist needs MNIST, which is not in the cache folder and could not be "
            "downloaded. cannot download train-images-idx3-ubyte.gz: cannot create "
            "the folder") in capsys.readouterr().err


def test_mnist_unavailable_names_all_four_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    monkeypatch.setattr(gradcore.datasets.MNIST, "MIRRORS", ("http://127.0.0.1:1/",))
    assert demo.main(["--task", "mnist", "--no-plot"]) == 2
    err = capsys.readouterr().err
    for name in gradcore.datasets.MNIST.FILES:  # fixing one file at a time needs no four runs
        assert str(tmp_path / "mnist" / name) in err


# =============================================================================== command line
def test_main_writes_the_pngs(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert demo.main(["--epochs", "2", "--device", "cpu", "--out", str(tmp_path)]) == 0
    assert demo.main(["--task", "conv", "--epochs", "1", "--device", "cpu",
                      "--out", str(tmp_path)]) == 0
    names = ["spiral_boundary.png", "spiral_loss.png", "conv_loss.png", "conv_predictions.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    for name in names:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out, err = capsys.readouterr()
    assert "MLP (2-30-30-3, relu) on 300 spiral points: 2 epochs on cpu" in out
    assert "conv net on 800 Shapes images" in out
    assert f"wrote {tmp_path / 'spiral_boundary.png'}" in out
    assert "epoch 2/2 [" in err and "epoch 1/1 [" in err


def test_spiral_boundary_names_its_axes(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    figures = {}  # the figures by file name, never drawn
    monkeypatch.setattr(demo, "_save", lambda fig, out, name: figures.setdefault(name, fig))
    demo.train_spiral(device="cpu", epochs=1, out=str(tmp_path), progress=False)
    ax, = figures["spiral_boundary.png"].axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("x1", "x2")


def test_help_names_the_four_shapes(capsys):
    with pytest.raises(SystemExit) as info:
        demo.main(["--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    for name in Shapes.labels().values():
        assert name in text


def test_missing_matplotlib_is_named_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    assert demo.main(["--device", "cpu", "--out", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert "matplotlib, which is not installed: pip install 'gradcore[demo]'" in err
    assert "--no-plot" in err and "Traceback" not in err
    assert "epoch" not in err and out == ""  # nothing was trained
    assert not (tmp_path / "out").exists()
    assert demo.main(["--device", "cpu", "--epochs", "1", "--no-plot"]) == 0


def test_an_out_folder_that_cannot_be_made_is_named_before_training(tmp_path, capsys,
                                                                     monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", types.ModuleType("matplotlib"))  # importable
    afile = tmp_path / "afile"
    afile.write_text("")
    for out in (afile, afile / "sub"):
        assert demo.main(["--device", "cpu", "--epochs", "1", "--out", str(out)]) == 2
        out_text, err = capsys.readouterr()
        assert err.startswith(f"gradcore.demo: error: --out {out}: cannot make the folder for "
                              "the PNGs (")
        assert err.endswith("name another folder, or run with --no-plot\n")
        assert "epoch" not in err and "Traceback" not in err and out_text == ""
    for train in (demo.train_conv, demo.train_mnist):  # every task checks before training
        with pytest.raises(demo.DemoError, match=r"^--out .*afile: cannot make the folder"):
            train(device="cpu", out=str(afile), progress=False)


def test_bad_devices_are_reported(capsys):
    assert demo.main(["--device", "nowhere:1", "--no-plot"]) == 2
    assert "gradcore.demo: error: --device nowhere:1: unknown device" in capsys.readouterr().err
    assert demo.main(["--device", "array_api_strict:device9", "--no-plot"]) == 2
    assert "array_api_strict:device9 does not exist" in capsys.readouterr().err
    assert demo.resolve_device("array_api_strict:device1") == DEVICE1


@pytest.mark.skipif(gradcore.cuda_available(), reason="a GPU is present")
def test_cuda_without_a_gpu(capsys):
    assert demo.resolve_device(None) == "cpu"  # the best device here
    assert demo.main(["--device", "cuda", "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda:" in err and "CUDA" in err and "Traceback" not in err


def test_missing_array_api_strict_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "array_api_strict", None)
    with pytest.raises(demo.DemoError, match=r"pip install array-api-strict"):
        demo._register_array_api_strict()


def test_distributed_is_for_the_spiral(capsys):
    assert demo.main(["--distributed", "--task", "conv", "--no-plot"]) == 2
    assert "--distributed trains the spiral" in capsys.readouterr().err


def test_distributed_loss_is_the_mean_over_every_ranks_examples(monkeypatch):
    """With a communicator, each epoch's loss sums every rank's: here a second rank's 3.0 over
    10 examples, from a stand-in for gradcore.distributed's Communicator."""
    import gradcore.distributed

    class TwoRanks:
        def allgather_json(self, obj, what):
            return [obj, [3.0, 10]]

    def fit(comm):
        gradcore.random.manual_seed(0)
        model = gradcore.nn.MLP((10, 3))
        loader = gradcore.dataloaders.DataLoader(gradcore.datasets.Spiral(), 30)
        return demo._fit(model, loader, 2, 0.01, False, comm=comm)

    monkeypatch.setattr(gradcore.distributed, "DistributedOptimizer", lambda opt, comm: opt)
    alone, ranks = fit(None), fit(TwoRanks())
    assert ranks == pytest.approx([(mean * 300 + 3.0) / 310 for mean in alone], rel=1e-12)


def test_bad_arguments_exit_with_usage(capsys):
    with pytest.raises(SystemExit) as info:
        demo.main(["--epochs", "0"])
    assert info.value.code == 2
    assert "--epochs: must be a positive int, got '0'" in capsys.readouterr().err
    for args, message in ((["--lr", "nan"], "--lr: must be a positive float, got 'nan'"),
                          (["--epochs", "x"], "--epochs: must be a positive int, got 'x'"),
                          (["--seed", "-1"], "--seed: must be an int in [0, 2**32), got '-1'")):
        with pytest.raises(SystemExit):
            demo.main(args)
        assert message in capsys.readouterr().err


def test_command_registers_array_api_strict_itself(tmp_path):
    # a fresh process, where nothing has registered array-api-strict yet
    run = subprocess.run(
        [sys.executable, "-m", "gradcore.demo", "--device", "array_api_strict:device1",
         "--epochs", "10", "--no-plot"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "10 epochs on array_api_strict:device1" in run.stdout
    accuracy = float(run.stdout.split("train accuracy ")[1].split("%")[0])
    assert accuracy > 95
    assert "epoch 10/10 [##############################] loss" in run.stderr
    assert list(tmp_path.iterdir()) == []


# =============================================================================== progress bar
def test_progress_bar_in_a_log_writes_about_ten_lines():
    stream = io.StringIO()
    bar = demo.ProgressBar(100, stream, width=10)
    for epoch in range(1, 101):
        bar.update(epoch, 1.0 / epoch)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 11
    assert lines[0].startswith("epoch   1/100 [..........] loss 1.0000")
    assert lines[5].startswith("epoch  50/100 [#####.....] loss 0.0200")
    assert lines[-1].startswith("epoch 100/100 [##########] loss 0.0100")


def test_progress_bar_on_a_terminal_redraws_one_line():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    bar = demo.ProgressBar(3, stream, width=3)
    for epoch in (1, 2, 3):
        bar.update(epoch, 0.5)
    text = stream.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
    assert "\repoch 2/3 [##.] loss 0.5000" in text


def test_best_device():
    assert demo.best_device() == ("cuda" if backends.cuda_available() else "cpu")
