"""`python -m gradcore.demo`: train an MLP on the spiral (or, with --task conv, a small conv net on
synthetic images; with --task mnist, an MLP on MNIST) on any device, with a progress bar, and draw
the result.

    python -m gradcore.demo                            # spiral MLP on the best device here
    python -m gradcore.demo --device array_api_strict:device1 --no-plot
    python -m gradcore.demo --task conv --out /tmp/demo
    python -m gradcore.demo --task mnist               # downloads MNIST once (~11 MB)

The PNGs (decision boundary and loss curve; for conv, loss curve and test predictions) need
matplotlib: pip install 'gradcore[demo]'. Everything else needs only gradcore.
"""
import argparse
import math
import os
import sys
import time

import numpy as np

import backends

from . import functions as F
from .compile import compile
from .config import no_grad, test_mode
from .dataloaders import DataLoader
from .datasets import MNIST, Shapes, Spiral
from .nn import MLP, Conv2d, Linear, Module
from .optim import Adam
from .random import manual_seed
from .utils.download import DownloadError

__all__ = ["main", "train_spiral", "train_conv", "train_mnist", "resolve_device", "ProgressBar",
           "DemoError"]

SPIRAL_DEFAULTS = {"epochs": 100, "batch_size": 30, "lr": 0.01, "hidden": 30}
CONV_DEFAULTS = {"epochs": 10, "batch_size": 32, "lr": 0.005, "num_per_class": 200}
MNIST_DEFAULTS = {"epochs": 5, "batch_size": 100, "lr": 0.001, "hidden": 256}


class DemoError(Exception):
    """A problem the user can fix (a missing package, a device that is not there)."""


# =============================================================================== devices
def best_device():
    """"cuda" when CuPy sees a GPU, else "cpu"."""
    return "cuda" if backends.cuda_available() else "cpu"


def _register_array_api_strict():
    try:
        import array_api_strict
    except ImportError:
        raise DemoError("array_api_strict devices need the array-api-strict package, which is "
                        "not installed: pip install array-api-strict") from None
    from backends.array_api_backend import ArrayAPIBackend

    array_api_strict.set_array_api_strict_flags(api_version="2024.12")
    array_type = type(array_api_strict.asarray(0.0))  # not exported by name
    backends.register(ArrayAPIBackend(array_api_strict, array_type))


def resolve_device(device):
    """`device` ("cpu", "cuda", "cuda:1", "array_api_strict:device1", a Device, or None for the
    best one here) as a Device that exists. array-api-strict is registered when asked for."""
    if device is None:
        device = best_device()
    try:
        device = backends.parse_device(device)
        try:
            backend = backends.backend_for_device(device)
        except ValueError:
            if device.type != "array_api_strict":
                raise
            _register_array_api_strict()
            backend = backends.backend_for_device(device)
        backend.asarray(np.zeros(0, np.float32), device=device)  # a device the backend lacks
    except (TypeError, ValueError, backends.DeviceUnavailableError) as e:
        raise DemoError(f"--device {device}: {e}") from None
    return device


def _require_plotting(out):
    """Check, before any training, that the PNGs can be drawn (matplotlib) and written: the
    folder `out`, made here if need be. DemoError says what to do otherwise."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise DemoError("the demo draws its PNGs with matplotlib, which is not installed: "
                        "pip install 'gradcore[demo]' (or pip install matplotlib), or run with "
                        "--no-plot") from None
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:  # a file of that name, no permission...
        raise DemoError(f"--out {out}: cannot make the folder for the PNGs ({e.strerror}): "
                        "name another folder, or run with --no-plot") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise DemoError(f"--out {out}: cannot write to that folder: name another folder, or run "
                        "with --no-plot")


# =============================================================================== progress
class ProgressBar:
    """A one-line text bar (epoch, bar, loss, seconds) on `stream` (stderr by default). On a
    terminal the line is redrawn each epoch; elsewhere (a log file) about ten lines are written."""

    def __init__(self, total, stream=None, width=30):
        self.total = total
        self.stream = sys.stderr if stream is None else stream
        self.width = width
        self.start = time.perf_counter()
        isatty = getattr(self.stream, "isatty", None)
        self.interactive = bool(isatty and isatty())

    def update(self, epoch, loss):
        """Show that `epoch` (1-based) ended with mean loss `loss`."""
        last = epoch == self.total
        step = max(1, self.total // 10)
        if not self.interactive and not (epoch == 1 or last or epoch % step == 0):
            return
        filled = self.width * epoch // self.total
        digits = len(str(self.total))
        bar = "#" * filled + "." * (self.width - filled)
        line = (f"epoch {epoch:>{digits}}/{self.total} [{bar}]"
                f" loss {loss:.4f}  {time.perf_counter() - self.start:.1f}s")
        if self.interactive:
            self.stream.write("\r" + line + ("\n" if last else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


# =============================================================================== training
def _fit(model, loader, epochs, lr, progress, compiled=False, comm=None):
    """Train with Adam and softmax cross entropy; the mean loss of each epoch. `compiled`: run
    the step through gradcore.compile (recorded once per batch shape, then replayed). `comm`:
    average the gradients over its ranks at each step (gradcore.distributed), and the loss over
    every rank's examples."""
    optimizer = Adam(lr=lr).setup(model)
    if comm is not None:
        from .distributed import DistributedOptimizer
        optimizer = DistributedOptimizer(optimizer, comm)
    bar = ProgressBar(epochs, progress) if progress is not False else None

    def step(x, t):
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        optimizer.update()
        return loss
    if compiled:
        step = compile(step)
    history = []
    for epoch in range(1, epochs + 1):
        total = 0.0  # summed on the device (gradcore ops: CuPy's device context is kept)
        for x, t in loader:
            loss = step(x, t)
            total = total + loss.detach() * t.shape[0]
        total, count = total.item(), loader.data_size  # one host read per epoch
        if comm is not None:  # each rank trained on its share: the mean is over all of them
            shares = comm.allgather_json([total, count], "the epoch's loss")
            total, count = sum(s[0] for s in shares), sum(s[1] for s in shares)
        history.append(total / count)
        if bar is not None:
            bar.update(epoch, history[-1])
    return history


def _predict(model, x, batch_size=4096):
    """Class scores of `x` (host array) as a host array, in test mode, without a graph."""
    scores = []
    with no_grad(), test_mode():
        for i in range(0, len(x), batch_size):
            xb = backends.to_device(x[i:i + batch_size], _model_device(model))
            scores.append(model(xb).numpy())
    return np.concatenate(scores)


def _model_device(model):
    """The device of the model's first parameter."""
    for p in model.parameters():
        if p.data is not None:
            return p.device
    return backends.CPU


def _accuracy(model, dataset):
    """The model's accuracy on the whole of `dataset`."""
    device = _model_device(model)
    x, t = backends.to_device(dataset.data, device), backends.to_device(dataset.label, device)
    with no_grad(), test_mode():
        return F.accuracy(model(x), t).item()


def _train(task, model, train, test, device, epochs, batch_size, lr, progress, compiled,
           comm=None):
    """Fit `model` on `train` and measure it: the result dict of train_spiral / train_conv."""
    loader = DataLoader(train, batch_size, device=device)
    start = time.perf_counter()
    history = _fit(model, loader, epochs, lr, progress, compiled, comm)
    seconds = time.perf_counter() - start
    return {"task": task, "device": device, "examples": len(train), "epochs": epochs,
            "seconds": seconds, "loss": history, "accuracy": _accuracy(model, train),
            "test_accuracy": _accuracy(model, test), "model": model, "files": []}


def train_spiral(device=None, epochs=SPIRAL_DEFAULTS["epochs"],
                 batch_size=SPIRAL_DEFAULTS["batch_size"], lr=SPIRAL_DEFAULTS["lr"],
                 hidden=SPIRAL_DEFAULTS["hidden"], seed=0, out=None, progress=None,
                 compiled=False, distributed=False):
    """Train MLP((hidden, hidden, 3), relu) on the spiral with Adam on `device`.

    Returns a dict: task, device, examples, epochs, seconds, loss (per epoch), accuracy (train),
    test_accuracy, model, and files (the PNGs written to the folder `out`; none when out is
    None). `progress`: a stream for the progress bar (stderr when None; False for none).
    `compiled`: replay the training step with gradcore.compile (the same figures, faster).
    `distributed`: one rank of a job launched by mpiexec (gradcore.distributed): each rank
    trains on its share with batch_size / ranks examples per step, the gradients averaged over
    the ranks; only rank 0 shows progress and writes files. The result also has rank and ranks.
    """
    comm = None
    if distributed:
        from . import distributed as dist
        comm = dist.init()
        device = device if device is not None else dist.local_device(comm)
        if comm.rank != 0:
            progress, out = False, None
    device = resolve_device(device)
    if out is not None:
        _require_plotting(out)
    manual_seed(seed)  # the initial weights and the shuffling
    train, test = Spiral(train=True), Spiral(train=False)
    model = MLP((hidden, hidden, 3), activation=F.relu)
    if comm is not None:
        dist.broadcast_parameters(model, comm)
        full, train = train, dist.scatter_dataset(train, comm)
        batch_size = max(1, batch_size // comm.size)
    result = _train("spiral", model, train, test, device, epochs, batch_size, lr, progress,
                    compiled, comm)
    if comm is not None:  # measured on the whole set, as without ranks
        result.update(rank=comm.rank, ranks=comm.size, accuracy=_accuracy(model, full))
        train = full
    if out is not None:
        result["files"] = _plot_spiral(model, train, result, out)
    return result


class ConvNet(Module):
    """Two 3x3 conv + relu + 2x2 max-pool stages, then a linear classifier."""

    def __init__(self, num_class, channels=(8, 16)):
        super().__init__()
        self.conv1 = Conv2d(channels[0], kernel_size=3, pad=1)
        self.conv2 = Conv2d(channels[1], kernel_size=3, pad=1)
        self.fc = Linear(num_class)

    def forward(self, x):
        x = F.pooling(F.relu(self.conv1(x)), 2, stride=2)
        x = F.pooling(F.relu(self.conv2(x)), 2, stride=2)
        return self.fc(F.reshape(x, (x.shape[0], -1)))


def train_conv(device=None, epochs=CONV_DEFAULTS["epochs"], batch_size=CONV_DEFAULTS["batch_size"],
               lr=CONV_DEFAULTS["lr"], num_per_class=CONV_DEFAULTS["num_per_class"], seed=0,
               out=None, progress=None, compiled=False):
    """Train ConvNet on Shapes (1x16x16 images, 4 classes) with Adam on `device`.

    Returns a dict as train_spiral does; files are a loss curve and a grid of test predictions.
    `compiled`: replay the training step with gradcore.compile.
    """
    device = resolve_device(device)
    if out is not None:
        _require_plotting(out)
    manual_seed(seed)
    train = Shapes(train=True, num_per_class=num_per_class)
    test = Shapes(train=False, num_per_class=max(1, num_per_class // 2))
    model = ConvNet(Shapes.num_class)
    result = _train("conv", model, train, test, device, epochs, batch_size, lr, progress,
                    compiled)
    if out is not None:
        result["files"] = _plot_conv(model, test, result, out)
    return result


def train_mnist(device=None, epochs=MNIST_DEFAULTS["epochs"], batch_size=MNIST_DEFAULTS["batch_size"],
                lr=MNIST_DEFAULTS["lr"], hidden=MNIST_DEFAULTS["hidden"], seed=0, out=None,
                progress=None, compiled=False):
    """Train MLP((hidden, hidden, 10), relu) on MNIST's 60,000 training images with Adam on
    `device`; test accuracy on its 10,000 test images. MNIST is read from the cache folder or
    downloaded there once (gradcore.datasets.MNIST); when it can be neither, DemoError says
    which files to put where.

    Returns a dict as train_spiral does; files are a loss curve and a grid of test predictions.
    """
    device = resolve_device(device)
    if out is not None:
        _require_plotting(out)
    try:
        train, test = MNIST(train=True, transform=None), MNIST(train=False, transform=None)
    except DownloadError as e:
        raise DemoError(f"--task mnist needs MNIST, which is not in the cache folder and could "
                        f"not be downloaded. {e}") from None
    except (OSError, ValueError) as e:  # a damaged mnist.npz
        raise DemoError(f"--task mnist could not read MNIST: {e}") from None
    for dataset in (train, test):  # flattened and scaled to [0, 1] once, not per example
        dataset.data = dataset.data.reshape(len(dataset), -1).astype(np.float32) / 255
    manual_seed(seed)
    model = MLP((hidden, hidden, 10), activation=F.relu)
    result = _train("mnist", model, train, test, device, epochs, batch_size, lr, progress,
                    compiled)
    if out is not None:
        result["files"] = _plot_mnist(model, test, result, out)
    return result


# =============================================================================== pictures
CLASS_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")


def _figure(size):
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    return Figure(figsize=size, dpi=100, layout="constrained")


def _save(fig, out, name):
    """Write `fig` as out/name (the folder made by _require_plotting); the path."""
    path = os.path.join(out, name)
    try:
        fig.savefig(path)
    except OSError as e:  # the folder went away or filled up during training
        raise DemoError(f"cannot write {path} ({e.strerror or e}): name another folder with "
                        "--out, or run with --no-plot") from None
    return path


def _loss_figure(result, out, name):
    fig = _figure((6, 4))
    ax = fig.add_subplot()
    epochs = np.arange(1, len(result["loss"]) + 1)
    ax.plot(epochs, result["loss"], color=CLASS_COLORS[0])
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("mean training loss (softmax cross entropy)")
    ax.set_title(f"{result['task']}: loss per epoch on {result['device']}")
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, out, name)


def _plot_spiral(model, train, result, out):
    from matplotlib.colors import ListedColormap

    n = 300
    grid = np.linspace(-1.1, 1.1, n, dtype=np.float32)
    gx, gy = np.meshgrid(grid, grid)
    points = np.stack([gx.ravel(), gy.ravel()], axis=1)
    region = _predict(model, points).argmax(axis=1).reshape(n, n)

    fig = _figure((6, 6))
    ax = fig.add_subplot()
    ax.contourf(gx, gy, region, levels=[-0.5, 0.5, 1.5, 2.5], alpha=0.3,
                cmap=ListedColormap(CLASS_COLORS[:3]))
    for c, marker in zip(range(3), "oxs"):
        points = train.data[train.label == c]
        ax.scatter(points[:, 0], points[:, 1], s=18, marker=marker, color=CLASS_COLORS[c],
                   label=f"class {c}")
    ax.set_aspect("equal")
    ax.set_xlabel("x1")  # a spiral point's two coordinates: data[:, 0] and data[:, 1]
    ax.set_ylabel("x2")
    ax.set_xlim(-1.1, 1.1)
    ax.set_ylim(-1.1, 1.1)
    ax.legend(loc="upper right")
    ax.set_title(f"spiral: decision boundary, train accuracy {result['accuracy']:.1%}")
    return [_save(fig, out, "spiral_boundary.png"), _loss_figure(result, out, "spiral_loss.png")]


def _plot_conv(model, test, result, out):
    count = 16
    scores = _predict(model, test.data[:count])
    names = Shapes.labels()
    fig = _figure((7, 7.5))
    for k in range(count):
        ax = fig.add_subplot(4, 4, k + 1)
        ax.imshow(test.data[k, 0], cmap="gray")
        guess, truth = int(scores[k].argmax()), int(test.label[k])
        title = names[guess] if guess == truth else f"{names[guess]}\n(is {names[truth]})"
        ax.set_title(title, fontsize=9, color="black" if guess == truth else "red")
        ax.axis("off")
    fig.suptitle(f"Shapes test set: predicted class (red: wrong), test accuracy "
                 f"{result['test_accuracy']:.1%}")
    return [_loss_figure(result, out, "conv_loss.png"), _save(fig, out, "conv_predictions.png")]


def _plot_mnist(model, test, result, out):
    count = 16
    scores = _predict(model, test.data[:count])
    fig = _figure((7, 7.5))
    for k in range(count):
        ax = fig.add_subplot(4, 4, k + 1)
        ax.imshow(test.data[k].reshape(28, 28), cmap="gray")
        guess, truth = int(scores[k].argmax()), int(test.label[k])
        title = str(guess) if guess == truth else f"{guess} (is {truth})"
        ax.set_title(title, fontsize=9, color="black" if guess == truth else "red")
        ax.axis("off")
    fig.suptitle(f"MNIST test set: predicted digit (red: wrong), test accuracy "
                 f"{result['test_accuracy']:.1%}")
    return [_loss_figure(result, out, "mnist_loss.png"), _save(fig, out, "mnist_predictions.png")]


# =============================================================================== command line
def _positive(kind):
    """An argparse type: a positive (finite) int or float."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0 or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a positive {kind.__name__}, got {text!r}")
        return value
    return parse


def _seed(text):
    """An argparse type: a seed for manual_seed."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2 ** 32:
        raise argparse.ArgumentTypeError(f"must be an int in [0, 2**32), got {text!r}")
    return value


TASKS = {  # --task: (trainer, its defaults, what it trains on what)
    "spiral": (train_spiral, SPIRAL_DEFAULTS, "MLP (2-30-30-3, relu) on {} spiral points"),
    "conv": (train_conv, CONV_DEFAULTS, "conv net on {} Shapes images (1x16x16, 4 classes)"),
    "mnist": (train_mnist, MNIST_DEFAULTS, "MLP (784-256-256-10, relu) on {} MNIST images"),
}


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m gradcore.demo",
        description="Train a small network with gradcore on any device and draw the result.")
    p.add_argument("--task", choices=tuple(TASKS), default="spiral",
                   help="spiral: an MLP on 3 interleaved spirals (default); conv: a small conv "
                        "net on noisy 16x16 images of 4 shapes: horizontal bar, vertical bar, "
                        "square (outline) and cross; mnist: an MLP (784-256-256-10) on MNIST, "
                        "downloaded once into $GRADCORE_DATA (else ~/.gradcore)")
    p.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:N, array_api_strict:device1, ... (default: cuda when a "
                        "GPU is present, else cpu)")
    p.add_argument("--epochs", type=_positive(int),
                   help="default: 100 (spiral), 10 (conv), 5 (mnist)")
    p.add_argument("--batch-size", type=_positive(int),
                   help="default: 30 (spiral), 32 (conv), 100 (mnist)")
    p.add_argument("--lr", type=_positive(float), help="Adam's step size; default: 0.01 "
                   "(spiral), 0.005 (conv), 0.001 (mnist)")
    p.add_argument("--seed", type=_seed, default=0, help="seeds the weights and the shuffling")
    p.add_argument("--out", default=os.path.join(".", "demo_out"),
                   help="folder for the PNGs (default: ./demo_out)")
    p.add_argument("--no-plot", action="store_true", help="write no PNGs (needs no matplotlib)")
    p.add_argument("--compile", action="store_true",
                   help="replay the training step with gradcore.compile")
    p.add_argument("--distributed", action="store_true",
                   help="spiral only, under mpiexec -n K: each rank trains on its share, the "
                        "gradients averaged over the ranks (needs pip install 'gradcore[mpi]')")
    return p


def main(argv=None):
    """The command line; returns the exit status (0, or 2 for a problem the user can fix)."""
    args = _parser().parse_args(argv)
    train, defaults, what = TASKS[args.task]
    options = {name: getattr(args, name) if getattr(args, name) is not None else defaults[name]
               for name in ("epochs", "batch_size", "lr")}
    if args.distributed:
        if args.task != "spiral":
            print("gradcore.demo: error: --distributed trains the spiral (--task spiral)",
                  file=sys.stderr)
            return 2
        options["distributed"] = True
    try:
        result = train(device=args.device, seed=args.seed, compiled=args.compile,
                       out=None if args.no_plot else args.out, **options)
    except DemoError as e:
        print(f"gradcore.demo: error: {e}", file=sys.stderr)
        return 2
    except ImportError as e:  # --distributed without mpi4py: the error says what to install
        if not args.distributed:
            raise
        print(f"gradcore.demo: error: {e}", file=sys.stderr)
        return 2
    if result.get("rank", 0) != 0:
        return 0  # rank 0 speaks for the job
    if "ranks" in result:
        what += f", on each of {result['ranks']} ranks (gradcore.distributed)"
    print(f"{what.format(result['examples'])}: {result['epochs']} epochs on {result['device']} in {result['seconds']:.1f}s")
    print(f"final loss {result['loss'][-1]:.4f}, train accuracy {result['accuracy']:.1%}, "
          f"test accuracy {result['test_accuracy']:.1%}")
    for path in result["files"]:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
