"""Datasets (DeZero's `dezero.datasets`): the Dataset base, generated sets that need no download
(Spiral, SinCurve, Shapes), and MNIST, FashionMNIST, CIFAR10, CIFAR100 and TinyShakespeare,
downloaded once from their published files (gradcore.utils.download.fetch) and read from those
files' own formats.

Datasets hold host data: NumPy arrays made or read here. A DataLoader moves each batch to the
device it is asked for. Generated sets draw from their own seeded generators, never from NumPy's
global one, so building a dataset does not disturb np.random.seed reproducibility elsewhere.
"""
import gzip
import operator
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path

import numpy as np

from .transforms import Compose, Flatten, Normalize, ToFloat, _check_callable
from .utils.download import DownloadError, cache_folder, fetch

__all__ = ["Dataset", "Spiral", "get_spiral", "SinCurve", "Shapes", "MNIST", "FashionMNIST",
           "CIFAR10", "CIFAR100", "TinyShakespeare", "Shakespear"]


def _identity(x):
    return x


class _Default:
    """The `transform` a dataset class has when given none: its `default_transform()`, made
    anew for each instance, so that changing one set's (train.transform.transforms.append)
    changes no other. transform=None still means none, as in DeZero."""

    def __repr__(self):
        return "<the class's default_transform()>"


_DEFAULT = _Default()


def rows_of_arrays(dataset):
    """Whether dataset[i] is (transform(data[i]), target_transform(label[i])) on host arrays:
    the base Dataset's examples, which a batch or a share can take as rows of the arrays."""
    return (isinstance(dataset, Dataset) and type(dataset).__getitem__ is Dataset.__getitem__
            and isinstance(dataset.data, np.ndarray)
            and (dataset.label is None or isinstance(dataset.label, np.ndarray)))


class Dataset:
    """A list of examples: `dataset[i]` is `(transform(data[i]), target_transform(label[i]))`,
    or `(x, None)` when the set has no labels; `len(dataset)` is the number of examples.

    Subclasses write `prepare()`, which sets `self.data` (examples along axis 0) and
    `self.label` (or leaves it None); it runs at the end of `__init__` and may read `self.train`.
    """

    def __init__(self, train=True, transform=None, target_transform=None):
        name = type(self).__name__
        if not isinstance(train, (bool, np.bool_)):
            raise TypeError(f"{name}: train must be True or False, got {train!r} (pass "
                            "transforms by keyword: transform=...)")
        for what, f in (("transform", transform), ("target_transform", target_transform)):
            if f is not None:
                _check_callable(name, f, what)
        self.train = bool(train)
        self.transform = _identity if transform is None else transform
        self.target_transform = _identity if target_transform is None else target_transform
        self.data = None
        self.label = None
        self.prepare()

    def prepare(self):
        """Set `self.data` and `self.label`. The base class holds nothing."""

    def __getitem__(self, index):
        try:
            index = operator.index(index)
        except TypeError:
            raise TypeError(f"{type(self).__name__}: an index is an int, got "
                            f"{type(index).__name__}; use a DataLoader for batches") from None
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"{type(self).__name__}: index {index} is out of range for "
                             f"{n} examples")
        x = self.transform(self.data[index])
        if self.label is None:
            return x, None
        return x, self.target_transform(self.label[index])

    def __len__(self):
        if self.data is None:
            raise TypeError(f"{type(self).__name__} has no data: its prepare() must set "
                            "self.data (or the class must define __len__ and __getitem__)")
        return len(self.data)

    def __repr__(self):
        split = "train" if self.train else "test"
        try:
            size = f"{len(self)} examples"
        except TypeError:
            size = "no data"
        return f"{type(self).__name__}({split}, {size})"


# =============================================================================== generated sets
def get_spiral(train=True):
    """DeZero's spiral: 3 classes of 100 points each winding out from the origin, shuffled.

    Returns x (300, 2) float32 and t (300,) int64. Point i of class j sits at radius
    r = i / 100 and angle 4j + 4r + 0.2 * noise. The train and test sets use DeZero's seeds
    (1984 and 2020) in a generator of their own, so the points are DeZero's and the global
    NumPy generator is left alone.
    """
    rng = np.random.RandomState(1984 if train else 2020)
    num_data, num_class = 100, 3
    rate = np.arange(num_data) / num_data
    noise = rng.randn(num_class, num_data)  # drawn class by class, point by point, as DeZero
    theta = np.arange(num_class)[:, None] * 4.0 + 4.0 * rate + noise * 0.2
    x = np.stack([rate * np.sin(theta), rate * np.cos(theta)], axis=-1)
    x = x.reshape(num_class * num_data, 2).astype(np.float32)
    t = np.repeat(np.arange(num_class, dtype=np.int64), num_data)
    order = rng.permutation(num_class * num_data)
    return x[order], t[order]


class Spiral(Dataset):
    """The spiral of `get_spiral`: data (300, 2) float32, label (300,) int64 in {0, 1, 2}."""

    def prepare(self):
        self.data, self.label = get_spiral(self.train)


class SinCurve(Dataset):
    """A time series: 1000 samples of sin over one period plus uniform noise in [-0.05, 0.05]
    (the test set: cos, without noise). Example i is (y[i],), its label the next value
    (y[i+1],): data and label (999, 1) float32. The noise is seeded: the same every time."""

    num_data = 1000

    def prepare(self):
        x = np.linspace(0, 2 * np.pi, self.num_data)
        if self.train:
            noise = np.random.RandomState(0).uniform(-0.05, 0.05, size=x.shape)
            y = np.sin(x) + noise
        else:
            y = np.cos(x)
        y = y.astype(np.float32)
        # copies: views of one buffer would overlap, so an in-place edit of one (data -= m)
        # would shift the other too
        self.data = y[:-1, None].copy()
        self.label = y[1:, None].copy()


class Shapes(Dataset):
    """Small noisy images of four shapes, for conv nets: data (N, 1, size, size) float32,
    label (N,) int64; N = 4 * num_per_class, shuffled.

    Classes (see `Shapes.labels()`): 0 horizontal bar, 1 vertical bar, 2 square outline,
    3 cross. Each image draws its shape's length, thickness, position and brightness at random,
    then adds Gaussian noise of standard deviation `noise`. Deterministic for a given `seed`
    (None means 0), and the split is part of what decides the images: the train and test sets
    of one seed differ, and no seed's test set is another seed's train set.
    """

    num_class = 4

    def __init__(self, train=True, transform=None, target_transform=None, size=16,
                 num_per_class=100, noise=0.2, seed=None):
        for name, value, low in (("size", size, 8), ("num_per_class", num_per_class, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"Shapes: {name} must be an int >= {low}, got {value!r}")
        if isinstance(noise, bool) or not (isinstance(noise, (int, float, np.integer, np.floating))
                                           and 0 <= noise < float("inf")):
            raise ValueError(f"Shapes: noise must be a number >= 0, got {noise!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                                 or seed < 0):
            raise ValueError(f"Shapes: seed must be None or an int >= 0, got {seed!r}")
        self.size = int(size)
        self.num_per_class = int(num_per_class)
        self.noise = float(noise)
        self.seed = 0 if seed is None else int(seed)
        super().__init__(train, transform, target_transform)

    @staticmethod
    def labels():
        """Class index -> name."""
        return {0: "horizontal bar", 1: "vertical bar", 2: "square", 3: "cross"}

    def prepare(self):
        # the split is part of the seed: train draws from 2s, test from 2s + 1, so no two
        # (split, seed) pairs share a generator (seed 0, the default: 0 and 1)
        rng = np.random.default_rng(2 * self.seed + (not self.train))
        n, s = self.num_per_class, self.size
        images = np.zeros((self.num_class * n, 1, s, s), dtype=np.float32)
        label = np.repeat(np.arange(self.num_class, dtype=np.int64), n)
        for image, c in zip(images[:, 0], label):
            image[...] = _draw(rng, int(c), s) * rng.uniform(0.7, 1.0)
        images += rng.normal(0.0, self.noise, size=images.shape).astype(np.float32)
        order = rng.permutation(len(label))
        self.data, self.label = images[order], label[order]


def _draw(rng, c, s):
    """One s x s image of class c: 1 on the shape, 0 elsewhere."""
    image = np.zeros((s, s), dtype=np.float32)
    if c in (0, 1):  # a bar: long in one direction, 1-2 pixels thick in the other
        length = rng.integers(s // 2, s - 1)
        width = rng.integers(1, 3)
        r = rng.integers(0, s - width + 1)
        start = rng.integers(0, s - length + 1)
        image[r:r + width, start:start + length] = 1.0
        return image if c == 0 else image.T
    if c == 2:  # a square outline, one pixel thick
        side = rng.integers(s // 3 + 1, 3 * s // 4 + 1)
        r, col = rng.integers(0, s - side + 1, size=2)
        image[r:r + side, col:col + side] = 1.0
        image[r + 1:r + side - 1, col + 1:col + side - 1] = 0.0
        return image
    # a cross: a horizontal and a vertical arm through one centre
    arm = rng.integers(s // 4, s // 2 - 1)
    cr, cc = rng.integers(arm, s - arm, size=2)
    width = rng.integers(1, 3)
    image[cr:cr + width, cc - arm:cc + arm + 1] = 1.0
    image[cr - arm:cr + arm + 1, cc:cc + width] = 1.0
    return image


# =============================================================================== MNIST
def read_idx(path, magic):
    """The array in a gzipped IDX file (MNIST's format: a big-endian header, then uint8 data);
    `magic` 2051 for images (N, rows, cols), 2049 for labels (N,)."""
    what, sizes = ("images", ">III") if magic == 2051 else ("labels", ">I")
    length = 4 + struct.calcsize(sizes)  # the magic number, then the sizes
    try:
        with gzip.open(path, "rb") as f:
            head = f.read(length)
            found = struct.unpack(">I", head[:4])[0] if len(head) >= 4 else None
            if found != magic:
                raise ValueError(f"{path} is not an IDX file of {what} (its header reads "
                                 f"{found}, expected {magic})")
            if len(head) < length:
                raise ValueError(f"{path}: its IDX header is cut short ({len(head)} bytes)")
            shape = struct.unpack(sizes, head[4:])
            data = np.frombuffer(f.read(), dtype=np.uint8)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:  # not gzip, or a stream cut short
        raise ValueError(f"{path} is not a whole gzip file ({e}): damaged or cut short?") from None
    if 0 in shape:
        raise ValueError(f"{path}: its header gives a shape of {shape}: no {what}")
    if data.size != np.prod(shape):
        raise ValueError(f"{path} holds {data.size} values for a shape of {shape} (its header): "
                         f"{'cut short' if data.size < np.prod(shape) else 'too long'}")
    return data.reshape(shape)


def _checked_labels(labels, num_classes, where):
    """`labels` (integers) as int64, checked to lie in [0, num_classes)."""
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        bad = labels.min() if labels.min() < 0 else labels.max()
        raise ValueError(f"{where} has a label of {bad}; the classes are 0 to {num_classes - 1}")
    return labels.astype(np.int64)


class MNIST(Dataset):
    """MNIST: 28x28 handwritten digits, 60,000 for training and 10,000 for testing.

    Read from a local .npz holding x_train, y_train, x_test, y_test when `path` names one, or
    when $GRADCORE_DATA/mnist.npz (else ~/.gradcore/mnist.npz) exists; else the split's two
    original IDX files (train-images and train-labels for train=True, t10k-images and
    t10k-labels for train=False) are downloaded once into that folder's mnist/ from the first
    mirror that has them, each checked by its SHA-256 (gradcore.utils.download.fetch:
    resumable, atomic; offline, the error says which files to put where). The other split's
    files are fetched when that split is first made: to use both offline, make both once
    online. data (N, 1, 28, 28) uint8 and label (N,) int64; the default transform
    (default_transform()), as in DeZero, flattens each image and scales it to float32 in
    [0, 1]; transform=None gives the uint8 images as they are.
    """

    NAME = "mnist"  # the cache's subfolder, and the default .npz's name
    MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/",
               "https://storage.googleapis.com/cvdf-datasets/mnist/",
               "http://yann.lecun.com/exdb/mnist/")
    # the published files and their SHA-256
    FILES = {
        "train-images-idx3-ubyte.gz":
            "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
        "train-labels-idx1-ubyte.gz":
            "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
        "t10k-images-idx3-ubyte.gz":
            "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
        "t10k-labels-idx1-ubyte.gz":
            "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    }

    def __init__(self, train=True, transform=_DEFAULT, target_transform=None, path=None,
                 progress=None):
        self.path = Path(path) if path is not None else None
        self.progress = progress
        if transform is _DEFAULT:
            transform = self.default_transform()
        super().__init__(train, transform, target_transform)

    @staticmethod
    def default_transform():
        """DeZero's: each image flattened to 784 values, float32 in [0, 1]."""
        return Compose([Flatten(), ToFloat(), Normalize(0.0, 255.0)])

    @staticmethod
    def labels():
        """Class index -> name."""
        return {i: str(i) for i in range(10)}

    def prepare(self):
        default = cache_folder() / f"{self.NAME}.npz"
        if self.path is not None or default.is_file():
            return self._read_npz(self.path or default)
        prefix = "train" if self.train else "t10k"
        paths = {}
        for kind in ("images-idx3", "labels-idx1"):
            name = f"{prefix}-{kind}-ubyte.gz"
            try:
                paths[kind] = fetch(name, [m + name for m in self.MIRRORS], self.FILES[name],
                                    folder=cache_folder() / self.NAME, progress=self.progress)
            except DownloadError as e:
                raise DownloadError(f"{e}\n{self._offline_help(default)}") from None
        x = read_idx(paths["images-idx3"], 2051)
        y = read_idx(paths["labels-idx1"], 2049)
        if len(x) != len(y):
            raise ValueError(f"{type(self).__name__}: {len(x)} images but {len(y)} labels")
        self.data = x.reshape(len(x), 1, x.shape[1], x.shape[2])
        self.label = _checked_labels(y, 10, paths["labels-idx1"])

    def _offline_help(self, default):
        """Every file this set can be read from, and where each goes."""
        folder = cache_folder() / self.NAME
        names = [f"{prefix}-{kind}-ubyte.gz" for prefix in ("train", "t10k")
                 for kind in ("images-idx3", "labels-idx1")]
        files = "".join(f"\n  {folder / name}  (SHA-256 {self.FILES[name]})" for name in names)
        return (f"{type(self).__name__} reads these files (train-* for train=True, t10k-* for "
                f"train=False), from {self.MIRRORS[0]} or its mirrors:{files}\nor instead one "
                f"{default} holding the arrays x_train, y_train, x_test, y_test")

    def _read_npz(self, path):
        name = type(self).__name__
        if not path.is_file():
            raise FileNotFoundError(
                f"{name}: no file at {path}: pass {name}(path=...) a {self.NAME}.npz with the "
                "arrays x_train, y_train, x_test, y_test, or no path to download the published "
                "files")
        kx, ky = ("x_train", "y_train") if self.train else ("x_test", "y_test")
        try:
            f = np.load(path, allow_pickle=False)  # a data file never runs code
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            raise ValueError(f"{name}: {path} is not a readable .npz file ({e})") from None
        if not isinstance(f, np.lib.npyio.NpzFile):
            raise ValueError(f"{name}: {path} holds one array, not an .npz archive of x_train, "
                             "y_train, x_test, y_test")
        with f:
            missing = [k for k in (kx, ky) if k not in f.files]
            if missing:
                raise ValueError(f"{name}: {path} has no {' or '.join(missing)}; it holds "
                                 f"{', '.join(f.files) or 'nothing'}")
            try:
                x, y = f[kx], f[ky]
            except (OSError, ValueError, zipfile.BadZipFile) as e:
                raise ValueError(f"{name}: cannot read {kx} and {ky} from {path} ({e})") from None
        if x.ndim not in (3, 4) or (x.ndim == 4 and x.shape[1] != 1):
            raise ValueError(f"{name}: {kx} in {path} must have shape (N, H, W) or (N, 1, H, W), "
                             f"got {x.shape}")
        if x.dtype != np.uint8 or 0 in x.shape:
            raise ValueError(f"{name}: {kx} in {path} must be images of uint8 pixels (0 to 255, "
                             f"as published), got {len(x)} of dtype {x.dtype}")
        if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"{name}: {ky} in {path} must be {len(x)} integer labels (one per "
                             f"image of {kx}), got shape {y.shape} and dtype {y.dtype}")
        self.data = x.reshape(len(x), 1, x.shape[-2], x.shape[-1])
        self.label = _checked_labels(y, 10, f"{name}: {ky} in {path}")


class FashionMNIST(MNIST):
    """Fashion-MNIST (Xiao, Rasul & Vollgraf 2017): 28x28 grey images of 10 kinds of clothing,
    60,000 for training and 10,000 for testing, in MNIST's format and shapes. Everything MNIST
    says holds, with fashion-mnist in place of mnist (the cache's subfolder, the default .npz)."""

    NAME = "fashion-mnist"
    MIRRORS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
               "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/"
               "fashion/")
    FILES = {
        "train-images-idx3-ubyte.gz":
            "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
        "train-labels-idx1-ubyte.gz":
            "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
        "t10k-images-idx3-ubyte.gz":
            "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
        "t10k-labels-idx1-ubyte.gz":
            "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
    }

    @staticmethod
    def labels():
        """Class index -> name."""
        return dict(enumerate(("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                               "Shirt", "Sneaker", "Bag", "Ankle boot")))


# =============================================================================== CIFAR-10
class CIFAR10(Dataset):
    """CIFAR-10 (Krizhevsky 2009): 32x32 colour images of 10 classes, 50,000 for training and
    10,000 for testing.

    The binary version of the published archive is downloaded once into $GRADCORE_DATA/cifar10
    (else ~/.gradcore/cifar10), checked by its SHA-256 (resumable, atomic; offline, the error
    says which file to put where), and its batch files are read from the archive in memory:
    nothing is unpacked to disk, and the Python version (a pickle) is never used. data
    (N, 3, 32, 32) uint8 and label (N,) int64; the default transform (default_transform())
    scales each image to float32 in [0, 1] (DeZero's applies Normalize(0.5, 0.5) to the 0-255
    values instead); transform=None gives the uint8 images as they are.
    """

    URLS = ("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",)
    FILE = "cifar-10-binary.tar.gz"
    SHA256 = "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd"
    TRAIN = tuple(f"cifar-10-batches-bin/data_batch_{i}.bin" for i in range(1, 6))
    TEST = ("cifar-10-batches-bin/test_batch.bin",)
    LABELS = (("label", 10),)  # (name, number of classes) for each label byte of a record
    ARCHIVE = "CIFAR-10"  # the data set, as errors name it

    def __init__(self, train=True, transform=_DEFAULT, target_transform=None, progress=None):
        self.progress = progress
        if transform is _DEFAULT:
            transform = self.default_transform()
        super().__init__(train, transform, target_transform)

    @staticmethod
    def default_transform():
        """Each image as float32 in [0, 1]."""
        return Compose([ToFloat(), Normalize(0.0, 255.0)])

    @staticmethod
    def labels():
        """Class index -> name."""
        return dict(enumerate(("airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                               "horse", "ship", "truck")))

    def prepare(self):
        archive = fetch(self.FILE, self.URLS, self.SHA256, folder=cache_folder() / "cifar10",
                        progress=self.progress)
        self.data, self.label = read_cifar_binary(archive, self.TRAIN if self.train else self.TEST,
                                                  self.LABELS, self.ARCHIVE)


def read_cifar_binary(path, members, labels=(("label", 10),), archive="CIFAR-10"):
    """Images (N, 3, 32, 32) uint8, then one array of labels (N,) int64 per label byte, from the
    batch files `members` of the tar.gz archive at `path`, in that order. A record is its label
    bytes, one per entry of `labels` ((name, number of classes) pairs: CIFAR-10's one label,
    CIFAR-100's coarse then fine), then 3,072 pixel bytes: the red, green and blue planes of
    32x32 each, row by row. `archive` names the data set in errors."""
    heads = len(labels)
    record = heads + 3 * 32 * 32
    found = {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            for member in tar:  # one pass through the stream; only the named files are read
                if member.name in members and member.isfile():
                    found[member.name] = tar.extractfile(member).read()
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ValueError(f"{path} is not a whole tar.gz archive ({e}): damaged or cut "
                         "short?") from None
    missing = [m for m in members if m not in found]
    if missing:
        raise ValueError(f"{path} has no {', '.join(missing)}: not {archive}'s binary archive?")
    images, columns = [], [[] for _ in labels]
    for name in members:
        raw = np.frombuffer(found[name], dtype=np.uint8)
        if raw.size == 0 or raw.size % record:
            raise ValueError(f"{name} in {path} holds {raw.size} bytes, not a whole number of "
                             f"{record}-byte records: cut short?")
        raw = raw.reshape(-1, record)
        for j, (what, num_classes) in enumerate(labels):
            top = raw[:, j].max()
            if top >= num_classes:
                raise ValueError(f"{name} in {path} has a {what} of {top}; {archive}'s are 0 to "
                                 f"{num_classes - 1}")
            columns[j].append(raw[:, j].astype(np.int64))
        images.append(raw[:, heads:].reshape(-1, 3, 32, 32))
    return (np.concatenate(images), *(np.concatenate(column) for column in columns))


# =============================================================================== CIFAR-100
# The class names as the archive's fine_label_names.txt and coarse_label_names.txt list them
_CIFAR100_NAMES = {
    "fine": (
        "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle",
        "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle",
        "caterpillar", "cattle", "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch",
        "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish", "forest", "fox",
        "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard",
        "lion", "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain", "mouse",
        "mushroom", "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck",
        "pine_tree", "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray",
        "road", "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail",
        "snake", "spider", "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank",
        "telephone", "television", "tiger", "tractor", "train", "trout", "tulip", "turtle",
        "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm"),
    "coarse": (
        "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables",
        "household_electrical_devices", "household_furniture", "insects", "large_carnivores",
        "large_man-made_outdoor_things", "large_natural_outdoor_scenes",
        "large_omnivores_and_herbivores", "medium_mammals", "non-insect_invertebrates", "people",
        "reptiles", "small_mammals", "trees", "vehicles_1", "vehicles_2"),
}


def _checked_label_kind(owner, label):
    """`label` if it is one of CIFAR-100's two kinds of label, else a ValueError naming them."""
    if not isinstance(label, str) or label not in _CIFAR100_NAMES:
        raise ValueError(f"{owner}: label must be 'fine' (100 classes) or 'coarse' (20 "
                         f"superclasses), got {label!r}")
    return label


def _cifar100_labels(label="fine"):
    """Class index -> name: the 100 fine classes (label="fine") or the 20 coarse ones."""
    return dict(enumerate(_CIFAR100_NAMES[_checked_label_kind("CIFAR100.labels", label)]))


def _cifar100_coarse_labels(label="coarse"):
    """Class index -> name: the 20 coarse classes unless `label` says which (a coarse set's)."""
    return _cifar100_labels(label)


class _LabelsOfItsKind:
    """CIFAR100.labels(label="fine") on the class; on a data set, its own kind of label by
    default, so that ds.labels()[t] names a label t of ds. Module functions, not a closure:
    ds.labels pickles by name (a DataLoader's worker processes are sent it), without the set."""

    def __get__(self, obj, cls=None):
        if obj is None or obj.label_mode == "fine":
            return _cifar100_labels
        return _cifar100_coarse_labels


class CIFAR100(CIFAR10):
    """CIFAR-100 (Krizhevsky 2009): 32x32 colour images of 100 classes grouped into 20
    superclasses, 50,000 for training and 10,000 for testing.

    The binary version of the published archive is downloaded once into $GRADCORE_DATA/cifar100
    (else ~/.gradcore/cifar100), checked by its SHA-256 (resumable, atomic; offline, the error
    says which file to put where), and train.bin or test.bin is read from the archive in memory,
    as for CIFAR10. A record is a coarse label byte, a fine label byte, then CIFAR-10's 3,072
    pixel bytes. `label="fine"` (the default, as torchvision's) gives the 100 classes,
    `label="coarse"` the 20 superclasses; `labels()` names them (on a data set, its own kind).
    data (N, 3, 32, 32) uint8 and label (N,) int64; the default transform is CIFAR10's (float32
    in [0, 1]); transform=None gives the uint8 images as they are.
    """

    URLS = ("https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",)
    FILE = "cifar-100-binary.tar.gz"
    SHA256 = "58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec"
    TRAIN = ("cifar-100-binary/train.bin",)
    TEST = ("cifar-100-binary/test.bin",)
    LABELS = (("coarse label", 20), ("fine label", 100))
    ARCHIVE = "CIFAR-100"

    labels = _LabelsOfItsKind()

    def __init__(self, train=True, transform=_DEFAULT, target_transform=None, progress=None,
                 label="fine"):
        # checked before the download, which a wrong spelling would otherwise wait for
        self.label_mode = _checked_label_kind(type(self).__name__, label)
        super().__init__(train, transform, target_transform, progress)

    def prepare(self):
        archive = fetch(self.FILE, self.URLS, self.SHA256, folder=cache_folder() / "cifar100",
                        progress=self.progress)
        self.data, coarse, fine = read_cifar_binary(
            archive, self.TRAIN if self.train else self.TEST, self.LABELS, self.ARCHIVE)
        self.label = fine if self.label_mode == "fine" else coarse


# =============================================================================== Tiny Shakespeare
class TinyShakespeare(Dataset):
    """Tiny Shakespeare (Karpathy's char-rnn): 1,115,394 characters of Shakespeare's plays, for
    next-character prediction.

    The text is downloaded once into $GRADCORE_DATA/tinyshakespeare (else
    ~/.gradcore/tinyshakespeare), checked by its SHA-256 (resumable, atomic; offline, the error
    says which file to put where), and read as UTF-8. The first 90% of its characters are the
    training set, the rest the test set. Within a set, data[i] is the index of character i and
    label[i] that of character i + 1, as SinCurve pairs each value with the next: data and label
    (N,) int64, N one less than the set's characters, ready for an Embedding and a
    SeqDataLoader. `vocabulary()` maps index -> character and `char_to_index` the reverse; the
    indices are those of the whole text's characters in sorted order, so both sets share them.
    """

    URLS = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
            "input.txt",
            "https://raw.githubusercontent.com/karpathy/char-rnn/"
            "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e/data/tinyshakespeare/input.txt")
    FILE = "input.txt"
    SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    train_fraction = 0.9

    def __init__(self, train=True, transform=None, target_transform=None, progress=None):
        self.progress = progress
        self.char_to_index = {}
        super().__init__(train, transform, target_transform)

    def vocabulary(self):
        """Index -> character."""
        return {i: c for c, i in self.char_to_index.items()}

    def _text(self):
        """The text, downloaded once, checked and decoded; its path."""
        path = fetch(self.FILE, self.URLS, self.SHA256, folder=cache_folder() / "tinyshakespeare",
                     progress=self.progress)
        try:
            return path.read_bytes().decode("utf-8"), path
        except UnicodeDecodeError as e:
            raise ValueError(f"{type(self).__name__}: {path} is not UTF-8 text (byte "
                             f"{e.start} is {e.object[e.start:e.start + 1]!r}): not the "
                             "published file?") from None

    def prepare(self):
        text, path = self._text()
        n = int(self.train_fraction * len(text))
        if min(n, len(text) - n) < 2:
            raise ValueError(f"{type(self).__name__}: {path} holds {len(text)} characters, too "
                             "few for a pair of characters in each of the train and test sets")
        # code points, fast; np.unique sorts them as Python sorts the characters
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        chars, index = np.unique(codes, return_inverse=True)
        self.char_to_index = {chr(c): i for i, c in enumerate(chars.tolist())}
        index = index.astype(np.int64).reshape(-1)
        part = index[:n] if self.train else index[n:]
        # copies: views of one buffer would overlap, as SinCurve's would
        self.data = part[:-1].copy()
        self.label = part[1:].copy()


class Shakespear(TinyShakespeare):
    """DeZero's name and form of Tiny Shakespeare, for its programs: the whole text as one set
    (`train` changes nothing, as in DeZero), each character numbered in the order it first
    appears, with DeZero's `char_to_id` and `id_to_char` (`char_to_index` and `vocabulary()`
    give the same). Downloaded and checked as TinyShakespeare."""

    def prepare(self):
        text, path = self._text()
        if len(text) < 2:
            raise ValueError(f"{type(self).__name__}: {path} holds {len(text)} characters, too "
                             "few for a pair of characters")
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        chars, first, index = np.unique(codes, return_index=True, return_inverse=True)
        order = np.argsort(first)  # the characters by where each first appears
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        ids = rank[index.reshape(-1)].astype(np.int64)
        self.char_to_id = self.char_to_index = {chr(chars[k]): i
                                                for i, k in enumerate(order.tolist())}
        self.id_to_char = self.vocabulary()
        self.data, self.label = ids[:-1].copy(), ids[1:].copy()
