"""gradcore.datasets: the Dataset base, Spiral, SinCurve, Shapes, MNIST (a local .npz, or its
published IDX files), FashionMNIST, CIFAR10, CIFAR100 and TinyShakespeare, their files served in
the original formats from an HTTP server on the loopback address."""
import contextlib
import functools
import hashlib
import http.server
import io
import tarfile
import threading

import numpy as np
import pytest

import gradcore
from gradcore.datasets import (CIFAR10, CIFAR100, MNIST, Dataset, FashionMNIST, Shapes, SinCurve,
                               Shakespear, Spiral, TinyShakespeare, get_spiral)
from gradcore.utils.download import cache_folder, fetch


# =============================================================================== Dataset base
class Squares(Dataset):
    def prepare(self):
        self.data = np.arange(5, dtype=np.float32)
        self.label = self.data ** 2 if self.train else None


def test_dataset_applies_its_transforms_per_example():
    ds = Squares(transform=lambda x: x + 1, target_transform=lambda t: -t)
    assert len(ds) == 5 and ds.train is True
    assert ds[2] == (3.0, -4.0)
    assert ds[-1] == (5.0, -16.0)  # negative indices count from the end
    assert gradcore.Dataset is Dataset


def test_dataset_without_labels_gives_none():
    x, t = Squares(train=False)[3]
    assert x == 3.0 and t is None


def test_dataset_index_errors():
    ds = Squares()
    with pytest.raises(TypeError, match=r"Squares: an index is an int, got slice"):
        ds[1:3]
    with pytest.raises(IndexError, match=r"Squares: index 5 is out of range for 5 examples"):
        ds[5]
    with pytest.raises(IndexError, match="index -6"):
        ds[-6]
    assert ds[np.int64(1)] == (1.0, 1.0)  # NumPy integers are indices too


def test_dataset_argument_errors():
    with pytest.raises(TypeError, match=r"Squares: train must be True or False.*transform="):
        Squares(lambda x: x)  # a transform passed where train goes
    with pytest.raises(TypeError, match=r"Squares: target_transform must be callable"):
        Squares(target_transform=3)


def test_dataset_refuses_a_transform_class_without_parentheses():
    with pytest.raises(TypeError, match=r"^Squares: transform must be a transform object or a "
                                        r"function, got the class Normalize; did you mean "
                                        r"Normalize\(\)\?$"):
        Squares(transform=gradcore.transforms.Normalize)
    with pytest.raises(TypeError, match=r"^Squares: target_transform .* got the class AsType"):
        Squares(target_transform=gradcore.transforms.ToFloat)
    ds = Squares(target_transform=int)  # a class called as a conversion is a fine transform
    assert ds[3] == (3.0, 9) and type(ds[3][1]) is int


def test_dataset_whose_prepare_sets_nothing():
    ds = Dataset()
    with pytest.raises(TypeError, match=r"Dataset has no data: its prepare\(\) must set self.data"):
        len(ds)
    assert repr(ds) == "Dataset(train, no data)"


# =============================================================================== Spiral
def dezero_style_spiral(seed):
    """The spiral built point by point from the global generator, as DeZero's get_spiral does."""
    np.random.seed(seed)
    x = np.zeros((300, 2), dtype=np.float32)
    t = np.zeros(300, dtype=np.int64)
    for j in range(3):
        for i in range(100):
            rate = i / 100
            theta = j * 4.0 + 4.0 * rate + np.random.randn() * 0.2
            x[100 * j + i] = [rate * np.sin(theta), rate * np.cos(theta)]
            t[100 * j + i] = j
    order = np.random.permutation(300)
    return x[order], t[order]


@pytest.mark.parametrize("train, seed", [(True, 1984), (False, 2020)])
def test_spiral_is_dezeros_spiral(train, seed):
    x, t = get_spiral(train)
    x_ref, t_ref = dezero_style_spiral(seed)
    np.testing.assert_array_equal(x, x_ref)
    np.testing.assert_array_equal(t, t_ref)


def test_spiral_shapes_dtypes_labels():
    ds = Spiral()
    assert ds.data.shape == (300, 2) and ds.data.dtype == np.float32
    assert ds.label.shape == (300,) and ds.label.dtype == np.int64
    np.testing.assert_array_equal(np.bincount(ds.label), [100, 100, 100])
    # radius i/100 for the i-th point of every class
    radius = np.linalg.norm(ds.data.astype(np.float64), axis=1)
    for c in range(3):
        np.testing.assert_allclose(np.sort(radius[ds.label == c]), np.arange(100) / 100, atol=1e-6)
    x, t = ds[0]
    assert x.shape == (2,) and t == ds.label[0]


def test_spiral_is_deterministic_and_leaves_the_global_generator_alone():
    np.random.seed(7)
    expected = np.random.rand(3)
    np.random.seed(7)
    a, b = Spiral(), Spiral()
    np.testing.assert_array_equal(np.random.rand(3), expected)
    np.testing.assert_array_equal(a.data, b.data)
    test = Spiral(train=False)
    assert not np.array_equal(a.data, test.data)
    assert repr(test) == "Spiral(test, 300 examples)"


# =============================================================================== SinCurve
def test_sin_curve():
    train, test = SinCurve(), SinCurve(train=False)
    for ds in (train, test):
        assert ds.data.shape == ds.label.shape == (999, 1)
        assert ds.data.dtype == ds.label.dtype == np.float32
        np.testing.assert_array_equal(ds.label[:-1], ds.data[1:])  # the label is the next value
    x = np.linspace(0, 2 * np.pi, 1000)
    noise = train.data[:, 0] - np.sin(x[:-1])
    assert np.abs(noise).max() <= 0.05 + 1e-6 and noise.std() > 0.02
    np.testing.assert_allclose(test.data[:, 0], np.cos(x[:-1]), atol=1e-6)
    np.testing.assert_array_equal(SinCurve().data, train.data)  # the noise is seeded


def test_sin_curve_data_and_label_are_arrays_of_their_own():
    # standardizing both in place, as for a regression target, shifts each once
    ref, train = SinCurve(), SinCurve()
    train.data -= 0.5
    train.label -= 0.5
    np.testing.assert_array_equal(train.data, ref.data - np.float32(0.5))
    np.testing.assert_array_equal(train.label, ref.label - np.float32(0.5))
    assert not np.shares_memory(train.data, train.label)


# =============================================================================== Shapes
def test_shapes_shapes_dtypes_labels():
    ds = Shapes()
    assert ds.data.shape == (400, 1, 16, 16) and ds.data.dtype == np.float32
    assert ds.label.shape == (400,) and ds.label.dtype == np.int64
    np.testing.assert_array_equal(np.bincount(ds.label), [100] * 4)
    assert Shapes.labels()[3] == "cross"
    big = Shapes(train=False, size=32, num_per_class=3)
    assert big.data.shape == (12, 1, 32, 32)


def test_shapes_are_deterministic_per_seed():
    a, b = Shapes(num_per_class=5), Shapes(num_per_class=5)
    np.testing.assert_array_equal(a.data, b.data)
    np.testing.assert_array_equal(a.label, b.label)
    assert not np.array_equal(a.data, Shapes(train=False, num_per_class=5).data)
    assert not np.array_equal(a.data, Shapes(num_per_class=5, seed=5).data)
    for train in (True, False):  # seed=None is 0, for either split
        np.testing.assert_array_equal(Shapes(train=train, num_per_class=5).data,
                                      Shapes(train=train, num_per_class=5, seed=0).data)


def test_shapes_train_and_test_sets_differ_for_every_seed():
    # one seed passed to both splits "for reproducibility" must not test on the training data
    sets = {(train, seed): Shapes(train=train, num_per_class=3, seed=seed)
            for train in (True, False) for seed in (0, 1, 2, 42)}
    for (train, seed), ds in sets.items():
        for (other_train, other_seed), other in sets.items():
            if (train, seed) != (other_train, other_seed):
                assert not np.array_equal(ds.data, other.data), (train, seed, other_train,
                                                                 other_seed)
    assert sets[True, 42].seed == sets[False, 42].seed == 42
    # the default sets (the demo's) are the ones seed=None gave before the split was part of
    # the seed: labels in the order the default generators (seeds 0 and 1) shuffle them
    assert Shapes(num_per_class=3).label.tolist() == [1, 1, 0, 0, 2, 3, 2, 1, 2, 0, 3, 3]
    assert Shapes(train=False, num_per_class=3).label.tolist() == [1, 0, 2, 0, 1, 0, 3, 3, 1, 3,
                                                                   2, 2]


def test_other_generated_sets_have_a_test_set_apart_from_the_train_set():
    assert not np.array_equal(Spiral().data, Spiral(train=False).data)
    assert not np.array_equal(SinCurve().data, SinCurve(train=False).data)


def test_shapes_draw_their_class():
    ds = Shapes(num_per_class=20, noise=0.0)
    for image, c in zip(ds.data[:, 0], ds.label):
        on = image > 0
        rows, cols = np.nonzero(on.any(axis=1))[0], np.nonzero(on.any(axis=0))[0]
        assert 0.7 <= image[on].min() and image.max() <= 1.0  # one brightness per image
        solid = on[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1].all()
        if c == 0:    # horizontal bar: a solid 1-2 rows, at least half the width
            assert solid and len(rows) <= 2 and len(cols) >= 8
        elif c == 1:  # vertical bar
            assert solid and len(cols) <= 2 and len(rows) >= 8
        elif c == 2:  # square outline: the box's border lit, its inside dark
            r0, r1, c0, c1 = rows[0], rows[-1], cols[0], cols[-1]
            assert r1 - r0 == c1 - c0
            assert on[r0, c0:c1 + 1].all() and on[r1, c0:c1 + 1].all()
            assert on[r0:r1 + 1, c0].all() and on[r0:r1 + 1, c1].all()
            assert not on[r0 + 1:r1, c0 + 1:c1].any()
        else:         # cross: a full row and a full column of its box lit, the corners dark
            r0, r1, c0, c1 = rows[0], rows[-1], cols[0], cols[-1]
            assert on[:, c0:c1 + 1].all(axis=1).any() and on[r0:r1 + 1].all(axis=0).any()
            assert not (on[r0, c0] or on[r0, c1] or on[r1, c0] or on[r1, c1])


@pytest.mark.parametrize("kwargs, match", [
    ({"size": 4}, r"size must be an int >= 8, got 4"),
    ({"num_per_class": 0}, r"num_per_class must be an int >= 1"),
    ({"noise": -1.0}, r"noise must be a number >= 0"),
    ({"noise": True}, r"noise must be a number >= 0, got True"),  # as size=True is refused
    ({"seed": "a"}, r"seed must be None or an int >= 0"),
])
def test_shapes_argument_errors(kwargs, match):
    with pytest.raises(ValueError, match="Shapes: " + match):
        Shapes(**kwargs)


@pytest.mark.parametrize("noise", [np.int64(0), np.float32(0.0)], ids=["int64", "float32"])
def test_shapes_take_numpy_numbers_for_noise(noise):
    # as for size= and num_per_class=; noise 0 leaves each image its shape times one brightness
    a, b = Shapes(noise=0, num_per_class=2), Shapes(noise=noise, num_per_class=2)
    assert b.noise == 0.0 and type(b.noise) is float
    np.testing.assert_array_equal(a.data, b.data)


# =============================================================================== MNIST
def write_mnist(path, n_train=5, n_test=3):
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "y_train": np.arange(n_train, dtype=np.uint8) % 10,
        "x_test": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "y_test": np.array([7, 2, 1][:n_test], dtype=np.uint8),
    }
    np.savez(path, **arrays)
    return arrays


def test_mnist_reads_a_local_npz(tmp_path):
    arrays = write_mnist(tmp_path / "mnist.npz")
    train = MNIST(path=tmp_path / "mnist.npz")
    assert train.data.shape == (5, 1, 28, 28) and train.data.dtype == np.uint8
    assert train.label.dtype == np.int64
    np.testing.assert_array_equal(train.label, [0, 1, 2, 3, 4])
    x, t = train[1]  # DeZero's default transform: flattened, float32, in [0, 1]
    assert x.shape == (784,) and x.dtype == np.float32 and t == 1
    np.testing.assert_allclose(x, arrays["x_train"][1].reshape(-1) / 255.0, rtol=1e-6)

    test = MNIST(train=False, transform=None, path=str(tmp_path / "mnist.npz"))
    assert len(test) == 3
    x, t = test[0]
    np.testing.assert_array_equal(x[0], arrays["x_test"][0])
    assert t == 7
    assert MNIST.labels()[7] == "7"


def test_mnist_default_path_from_gradcore_data(tmp_path, monkeypatch):
    write_mnist(tmp_path / "mnist.npz")
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    assert len(MNIST()) == 5


def test_mnist_missing_file_says_where_to_put_it(tmp_path):
    path = tmp_path / "nowhere" / "mnist.npz"
    with pytest.raises(FileNotFoundError) as info:
        MNIST(path=path)
    message = str(info.value)
    assert f"no file at {path}" in message and "download the published files" in message
    assert "x_train, y_train, x_test, y_test" in message and "MNIST(path=...)" in message


def test_mnist_bad_files(tmp_path):
    np.savez(tmp_path / "partial.npz", x_train=np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(ValueError, match=r"partial.npz has no y_train; it holds x_train"):
        MNIST(path=tmp_path / "partial.npz")
    (tmp_path / "text.npz").write_text("not an archive")
    with pytest.raises(ValueError, match=r"text.npz is not a readable .npz file"):
        MNIST(path=tmp_path / "text.npz")
    np.save(tmp_path / "one.npy", np.zeros(3))
    with pytest.raises(ValueError, match=r"holds one array, not an .npz archive"):
        MNIST(path=tmp_path / "one.npy")
    np.savez(tmp_path / "objects.npz", x_train=np.array([None, 1], dtype=object), y_train=[1, 2])
    with pytest.raises(ValueError, match=r"cannot read x_train and y_train"):  # no pickle, ever
        MNIST(path=tmp_path / "objects.npz")
    np.savez(tmp_path / "labels.npz", x_train=np.zeros((2, 28, 28), np.uint8),
             y_train=np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"y_train .* must be 2 integer labels"):
        MNIST(path=tmp_path / "labels.npz")


def idx_gz(path, array, magic):
    """`array` (uint8) written as MNIST writes it: a gzipped IDX file."""
    import gzip
    import struct
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">II", magic, len(array)))
        if magic == 2051:
            f.write(struct.pack(">II", *array.shape[1:]))
        f.write(array.astype(np.uint8).tobytes())


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """A file server's handler that logs no request: a test's output stays its own."""

    def log_message(self, format, *args):
        pass


@contextlib.contextmanager
def served(folder):
    """The files of `folder` served over HTTP on the loopback address; yields the base URL."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


def sha256s(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def served_class(base, tmp_path, monkeypatch, write):
    """A class of the data set `base` (one FILE, from URLS, checked by SHA256) whose file, as
    `write(path)` makes it, the loopback server has sent to the cache (from its second URL: the
    first is down)."""
    folder = tmp_path / "served"
    folder.mkdir()
    write(folder / base.FILE)
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path / "cache"))
    with served(folder) as url:
        class Served(base):
            URLS = ("http://127.0.0.1:1/down", url + base.FILE)
            SHA256 = sha256s(folder)[base.FILE]

        Served(progress=False)  # downloads it
    return Served


@pytest.mark.parametrize("cls", [MNIST, FashionMNIST])
def test_idx_sets_download_their_files_once(cls, tmp_path, monkeypatch):
    served_folder = tmp_path / "served"
    served_folder.mkdir()
    rng = np.random.default_rng(0)
    images = {"train": rng.integers(0, 256, (6, 28, 28)), "t10k": rng.integers(0, 256, (3, 28, 28))}
    for prefix, x in images.items():
        idx_gz(served_folder / f"{prefix}-images-idx3-ubyte.gz", x, 2051)
        idx_gz(served_folder / f"{prefix}-labels-idx1-ubyte.gz", np.arange(len(x)) % 10, 2049)
    files = sha256s(served_folder)
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path / "cache"))
    with served(served_folder) as url:
        class Served(cls):
            MIRRORS = ("http://127.0.0.1:1/down/", url)  # a mirror that is down: the next serves
            FILES = files

        train = Served(transform=None, progress=False)
        assert train.data.shape == (6, 1, 28, 28) and train.data.dtype == np.uint8
        np.testing.assert_array_equal(train.data[:, 0], images["train"])
        np.testing.assert_array_equal(train.label, np.arange(6) % 10)
        test = Served(train=False, progress=False)
        assert len(test) == 3 and test[0][0].shape == (784,) and test[0][0].dtype == np.float32
    again = Served(transform=None, progress=False)  # the server is gone: the cache serves
    np.testing.assert_array_equal(again.data, train.data)
    assert sorted(p.name for p in (tmp_path / "cache" / cls.NAME).iterdir()) == sorted(files)


def test_an_idx_set_downloads_the_two_files_of_its_split(tmp_path, monkeypatch):
    served_folder = tmp_path / "served"
    served_folder.mkdir()
    for prefix, n in (("train", 4), ("t10k", 2)):
        idx_gz(served_folder / f"{prefix}-images-idx3-ubyte.gz", np.zeros((n, 28, 28)), 2051)
        idx_gz(served_folder / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n), 2049)
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path / "cache"))
    with served(served_folder) as url:
        class Served(MNIST):
            MIRRORS = (url,)
            FILES = sha256s(served_folder)

        assert len(Served(progress=False)) == 4
        cached = sorted(p.name for p in (tmp_path / "cache" / "mnist").iterdir())
        assert cached == ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"]
        assert len(Served(train=False, progress=False)) == 2  # the test split's, when made
    assert len(list((tmp_path / "cache" / "mnist").iterdir())) == 4


def test_each_instance_has_a_default_transform_of_its_own(tmp_path, monkeypatch):
    write_mnist(tmp_path / "mnist.npz")
    train = MNIST(path=tmp_path / "mnist.npz")
    test = MNIST(train=False, path=tmp_path / "mnist.npz")
    before = test[0][0].copy()
    train.transform.transforms.append(lambda x: x + 0.5)  # a train-only augmentation
    np.testing.assert_array_equal(test[0][0], before)
    assert train.transform is not test.transform and train[0][0].max() >= 0.5
    assert MNIST(train=False, transform=None, path=tmp_path / "mnist.npz")[0][0].dtype == np.uint8

    cifar_tar(tmp_path / "cifar.tar.gz", cifar_batches(np.random.default_rng(0)))
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar.tar.gz").rename(tmp_path / "cifar10" / CIFAR10.FILE)
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))

    class Cached(CIFAR10):
        URLS = ()
        SHA256 = sha256s(tmp_path / "cifar10")[CIFAR10.FILE]

    first, second = Cached(progress=False), Cached(train=False, progress=False)
    assert first.transform is not second.transform
    assert second[0][0].dtype == np.float32 and second[0][0].max() <= 1.0


def test_fashion_mnist_labels():
    assert FashionMNIST.labels()[0] == "T-shirt/top" and FashionMNIST.labels()[9] == "Ankle boot"


def test_a_file_that_is_not_idx_is_refused(tmp_path):
    from gradcore.datasets import read_idx
    idx_gz(tmp_path / "labels.gz", np.arange(3), 2049)
    with pytest.raises(ValueError, match="not an IDX file of images"):
        read_idx(tmp_path / "labels.gz", 2051)


# =============================================================================== CIFAR-10
def tar_gz(path, folder, members):
    """A tar.gz holding each (name, bytes) of `members` as folder/name."""
    with tarfile.open(path, "w:gz") as tar:
        for name, raw in members:
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))


def records(*columns):
    """CIFAR records: the label columns' bytes, then each image's, one record per row."""
    *labels, x = columns
    return np.concatenate([*(t[:, None] for t in labels), x.reshape(len(x), -1)],
                          axis=1).astype(np.uint8).tobytes()


def cifar_tar(path, batches, extra=()):
    """A tar.gz laid out as CIFAR-10's binary archive: {member name: (images, labels)}."""
    tar_gz(path, "cifar-10-batches-bin", [("batches.meta.txt", b"airplane\nautomobile\n"),
                                          *((name, records(t, x)) for name, (x, t) in
                                            batches.items()), *extra])


def cifar_batches(rng, sizes=(2, 3, 1, 2, 2), test=3):
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    return {name: (rng.integers(0, 256, (n, 3, 32, 32)), rng.integers(0, 10, n))
            for name, n in zip(names, (*sizes, test))}


def test_cifar10_downloads_and_reads_the_binary_archive(tmp_path, monkeypatch):
    batches = cifar_batches(np.random.default_rng(0))
    Served = served_class(CIFAR10, tmp_path, monkeypatch, lambda path: cifar_tar(path, batches))
    train = Served(transform=None, progress=False)  # the server is gone: the cache serves
    assert train.data.shape == (10, 3, 32, 32) and train.data.dtype == np.uint8
    assert train.label.dtype == np.int64
    np.testing.assert_array_equal(train.data, np.concatenate(
        [batches[f"data_batch_{i}.bin"][0] for i in range(1, 6)]))  # in the batches' order
    np.testing.assert_array_equal(train.label, np.concatenate(
        [batches[f"data_batch_{i}.bin"][1] for i in range(1, 6)]))
    test = Served(train=False, progress=False)  # the server is gone: the cached archive serves
    x, t = test[2]
    assert x.shape == (3, 32, 32) and x.dtype == np.float32 and t == batches["test_batch.bin"][1][2]
    np.testing.assert_allclose(x, batches["test_batch.bin"][0][2] / 255.0, rtol=1e-6)
    assert CIFAR10.labels()[9] == "truck"


def test_cifar10_record_layout_is_label_then_red_green_blue_planes(tmp_path):
    from gradcore.datasets import read_cifar_binary
    record = np.zeros(3073, np.uint8)
    record[0] = 7
    record[1 + 1024 + 5 * 32 + 9] = 200  # green plane, row 5, column 9
    with tarfile.open(tmp_path / "a.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("cifar-10-batches-bin/test_batch.bin")
        info.size = 3073
        tar.addfile(info, io.BytesIO(record.tobytes()))
    x, t = read_cifar_binary(tmp_path / "a.tar.gz", CIFAR10.TEST)
    assert t.tolist() == [7] and x[0, 1, 5, 9] == 200 and x.sum() == 200


def test_cifar10_bad_archives(tmp_path):
    from gradcore.datasets import read_cifar_binary
    batches = cifar_batches(np.random.default_rng(1))
    del batches["test_batch.bin"]
    cifar_tar(tmp_path / "no_test.tar.gz", batches)
    with pytest.raises(ValueError, match=r"has no cifar-10-batches-bin/test_batch.bin"):
        read_cifar_binary(tmp_path / "no_test.tar.gz", CIFAR10.TEST)
    cifar_tar(tmp_path / "short.tar.gz", {}, extra=[("test_batch.bin", bytes(3073 + 100))])
    with pytest.raises(ValueError, match=r"holds 3173 bytes, not a whole number of 3073-byte"):
        read_cifar_binary(tmp_path / "short.tar.gz", CIFAR10.TEST)
    cifar_tar(tmp_path / "label.tar.gz", {}, extra=[("test_batch.bin", bytes([12]) + bytes(3072))])
    with pytest.raises(ValueError, match=r"has a label of 12"):
        read_cifar_binary(tmp_path / "label.tar.gz", CIFAR10.TEST)


@pytest.mark.parametrize("cls, urls, file, sha", [
    (MNIST, "MIRRORS", "mnist.train-images-idx3-ubyte.gz", "440fcabf"),
    (FashionMNIST, "MIRRORS", "fashion-mnist.train-images-idx3-ubyte.gz", "3aede38d"),
    (CIFAR10, "URLS", "cifar10.cifar-10-binary.tar.gz", "c4a38c50"),
    (CIFAR100, "URLS", "cifar100.cifar-100-binary.tar.gz", "58a81ae1"),
    (TinyShakespeare, "URLS", "tinyshakespeare.input.txt", "86c4e6aa")])
def test_offline_the_error_names_the_file_to_put_where(cls, urls, file, sha, tmp_path,
                                                       monkeypatch):
    from gradcore.utils.download import DownloadError
    offline = type("Offline", (cls,), {urls: ("http://127.0.0.1:1/",)})
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    with pytest.raises(DownloadError, match=rf"Offline, put the file at .*{file} \(SHA-256 {sha}"):
        offline(progress=False)


# =============================================================================== CIFAR-100
def cifar100_tar(path, splits, extra=()):
    """A tar.gz laid out as CIFAR-100's binary archive: {"train"/"test": (images, coarse, fine)}."""
    tar_gz(path, "cifar-100-binary", [("coarse_label_names.txt", b"aquatic_mammals\nfish\n"),
                                      ("fine_label_names.txt", b"apple\naquarium_fish\n"),
                                      *((f"{split}.bin", records(coarse, fine, x)) for
                                        split, (x, coarse, fine) in splits.items()), *extra])


def cifar100_splits(rng, train=5, test=3):
    return {split: (rng.integers(0, 256, (n, 3, 32, 32)), rng.integers(0, 20, n),
                    rng.integers(0, 100, n)) for split, n in (("train", train), ("test", test))}


def test_cifar100_downloads_and_reads_the_binary_archive(tmp_path, monkeypatch):
    splits = cifar100_splits(np.random.default_rng(0))
    Served = served_class(CIFAR100, tmp_path, monkeypatch,
                          lambda path: cifar100_tar(path, splits))
    train = Served(transform=None, progress=False)  # the server is gone: the cache serves
    assert train.data.shape == (5, 3, 32, 32) and train.data.dtype == np.uint8
    assert train.label.shape == (5,) and train.label.dtype == np.int64
    np.testing.assert_array_equal(train.data, splits["train"][0])
    np.testing.assert_array_equal(train.label, splits["train"][2])  # fine, by default
    assert [p.name for p in (tmp_path / "cache" / "cifar100").iterdir()] == [CIFAR100.FILE]
    test = Served(train=False, progress=False, label="coarse")  # the cached archive serves
    x, t = test[1]
    assert x.shape == (3, 32, 32) and x.dtype == np.float32 and t == splits["test"][1][1]
    np.testing.assert_allclose(x, splits["test"][0][1] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(test.label, splits["test"][1])


def test_cifar100_record_is_coarse_then_fine_then_red_green_blue_planes(tmp_path, monkeypatch):
    from gradcore.datasets import read_cifar_binary
    record = np.zeros(3074, np.uint8)
    record[:2] = 13, 45  # coarse 13 (non-insect_invertebrates), fine 45 (lobster)
    record[2 + 2048 + 31 * 32 + 0] = 77  # blue plane, row 31, column 0
    (tmp_path / "cifar100").mkdir()
    cifar100_tar(tmp_path / "cifar100" / CIFAR100.FILE, {}, extra=[("test.bin", record.tobytes())])
    x, coarse, fine = read_cifar_binary(tmp_path / "cifar100" / CIFAR100.FILE, CIFAR100.TEST,
                                        CIFAR100.LABELS)
    assert coarse.tolist() == [13] and fine.tolist() == [45]
    assert x.shape == (1, 3, 32, 32) and x[0, 2, 31, 0] == 77 and x.sum() == 77
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))

    class Cached(CIFAR100):
        URLS = ()
        SHA256 = sha256s(tmp_path / "cifar100")[CIFAR100.FILE]

    fine_set = Cached(train=False, transform=None, progress=False)
    coarse_set = Cached(train=False, transform=None, progress=False, label="coarse")
    assert fine_set[0][1] == 45 and coarse_set[0][1] == 13
    assert fine_set.labels()[45] == "lobster"  # each set names its own kind of label
    assert coarse_set.labels()[13] == "non-insect_invertebrates"
    assert coarse_set.labels("fine")[45] == "lobster"


def test_cifar100_label_must_be_fine_or_coarse(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    for label in ("superclass", "Fine", None):
        with pytest.raises(ValueError, match=r"^CIFAR100: label must be 'fine' \(100 classes\) or "
                                             rf"'coarse' \(20 superclasses\), got {label!r}$"):
            CIFAR100(label=label)  # refused before any download
    assert not (tmp_path / "cifar100").exists()
    with pytest.raises(ValueError, match=r"CIFAR100.labels: label must be 'fine' .* got 'fin'"):
        CIFAR100.labels("fin")


def test_cifar100_labels_names():
    fine, coarse = CIFAR100.labels(), CIFAR100.labels(label="coarse")
    assert len(fine) == 100 and len(coarse) == 20 and CIFAR100.labels("fine") == fine
    assert (fine[0], fine[1], fine[41], fine[58], fine[99]) == (
        "apple", "aquarium_fish", "lawn_mower", "pickup_truck", "worm")
    assert (coarse[0], coarse[9], coarse[13], coarse[19]) == (
        "aquatic_mammals", "large_man-made_outdoor_things", "non-insect_invertebrates",
        "vehicles_2")
    for names in (fine, coarse):  # the archive lists them in alphabetical order, each once
        assert list(names) == list(range(len(names)))
        assert list(names.values()) == sorted(set(names.values()))


def test_a_cifar100_sets_labels_pickle_without_the_set(tmp_path, monkeypatch):
    # a set's labels was a closure, which pickle refused: a DataLoader's worker processes could
    # not be sent it. Each kind's is sent by name (a few bytes, not the set's arrays), and names
    # the set's own kind by default, as its signature shows
    import inspect
    import pickle
    splits = cifar100_splits(np.random.default_rng(2))
    Served = served_class(CIFAR100, tmp_path, monkeypatch,
                          lambda path: cifar100_tar(path, splits))
    for label, other, t, name in (("fine", "coarse", 45, "lobster"),
                                  ("coarse", "fine", 13, "non-insect_invertebrates")):
        ds = Served(train=False, progress=False, label=label)
        sent = pickle.dumps(ds.labels)
        assert len(sent) < 100
        names = pickle.loads(sent)
        assert names() == ds.labels() == CIFAR100.labels(label) and names()[t] == name
        assert names(other) == CIFAR100.labels(other) and len(names(other)) == 120 - len(names())
        assert str(inspect.signature(names)) == f"(label={label!r})"


def test_cifar100_bad_archives(tmp_path, monkeypatch):
    from gradcore.datasets import read_cifar_binary

    def read(name, **splits_or_extra):
        cifar100_tar(tmp_path / name, **splits_or_extra)
        return read_cifar_binary(tmp_path / name, CIFAR100.TEST, CIFAR100.LABELS,
                                 CIFAR100.ARCHIVE)

    splits = cifar100_splits(np.random.default_rng(1))
    del splits["test"]
    with pytest.raises(ValueError, match=r"has no cifar-100-binary/test.bin: not CIFAR-100's "
                                         r"binary archive\?"):
        read("no_test.tar.gz", splits=splits)
    with pytest.raises(ValueError, match=r"test.bin in .*short.tar.gz holds 3173 bytes, not a "
                                         r"whole number of 3074-byte records"):
        read("short.tar.gz", splits={}, extra=[("test.bin", bytes(3073 + 100))])  # CIFAR-10's
    (tmp_path / "cifar100").mkdir()  # through the class: a cached archive, read as CIFAR-100
    cifar100_tar(tmp_path / "cifar100" / CIFAR100.FILE, {},
                 extra=[("test.bin", bytes([20, 5]) + bytes(3072))])
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    cached = type("Cached", (CIFAR100,), {
        "URLS": (), "SHA256": sha256s(tmp_path / "cifar100")[CIFAR100.FILE]})
    with pytest.raises(ValueError, match=r"test.bin in .*cifar-100-binary.tar.gz has a coarse "
                                         r"label of 20; CIFAR-100's are 0 to 19"):
        cached(train=False, label="fine", progress=False)  # checked whichever label is kept
    with pytest.raises(ValueError, match=r"has a fine label of 100; CIFAR-100's are 0 to 99"):
        read("fine.tar.gz", splits={}, extra=[("test.bin", bytes([19, 100]) + bytes(3072))])
    x, coarse, fine = read("edge.tar.gz", splits={},
                           extra=[("test.bin", bytes([19, 99]) + bytes(3072))])
    assert (coarse.tolist(), fine.tolist()) == ([19], [99])


# =============================================================================== Tiny Shakespeare
SPEECH = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
          "\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved"
          ". resolved.\n\nFirst Citizen:\nFirst, you know Caius Marcius is chief enemy to the "
          "people.\n\nAll:\nWe know't, we know't.\nZ")  # Z: a character of the test set only


def served_text(tmp_path, monkeypatch, raw):
    """A TinyShakespeare class whose text, `raw`, the loopback server has sent to the cache."""
    return served_class(TinyShakespeare, tmp_path, monkeypatch, lambda path: path.write_bytes(raw))


def test_tiny_shakespeare_pairs_each_character_with_the_next(tmp_path, monkeypatch):
    cls = served_text(tmp_path, monkeypatch, SPEECH.encode())
    train = cls(progress=False)  # the server is gone: the cached text serves
    n = int(0.9 * len(SPEECH))
    assert (len(SPEECH), n) == (279, 251)
    assert train.data.shape == train.label.shape == (n - 1,)
    assert train.data.dtype == train.label.dtype == np.int64
    vocabulary = train.vocabulary()
    assert "".join(vocabulary[i] for i in train.data[:14]) == "First Citizen:"
    assert "".join(vocabulary[i] for i in train.label[:14]) == "irst Citizen:\n"
    np.testing.assert_array_equal(train.label[:-1], train.data[1:])
    assert not np.shares_memory(train.data, train.label)
    assert train[0] == (train.char_to_index["F"], train.char_to_index["i"])


def test_tiny_shakespeare_splits_90_percent_and_shares_one_vocabulary(tmp_path, monkeypatch):
    cls = served_text(tmp_path, monkeypatch, SPEECH.encode())
    train, test = cls(progress=False), cls(train=False, progress=False)
    n = int(0.9 * len(SPEECH))
    vocabulary = test.vocabulary()
    assert vocabulary == train.vocabulary() == dict(enumerate(sorted(set(SPEECH))))
    assert len(vocabulary) == 38 and vocabulary[0] == "\n" and vocabulary[37] == "z"
    assert train.char_to_index == {c: i for i, c in vocabulary.items()}
    assert "Z" not in SPEECH[:n] and train.char_to_index["Z"] == 16  # from the test part's text
    decode = lambda ds: "".join(vocabulary[i] for i in ds.data) + vocabulary[ds.label[-1]]
    assert decode(train) == SPEECH[:n] and decode(test) == SPEECH[n:]
    assert len(test) == len(SPEECH) - n - 1 == 27 and repr(test) == "Served(test, 27 examples)"


def test_tiny_shakespeare_in_a_seq_data_loader(tmp_path, monkeypatch):
    from gradcore.dataloaders import SeqDataLoader
    ds = served_text(tmp_path, monkeypatch, SPEECH.encode())(progress=False)
    loader, jump, chars = SeqDataLoader(ds, batch_size=4), len(ds) // 4, ds.vocabulary()
    for i, (x, t) in enumerate(loader):  # stream k reads the text from k * jump on
        assert x.shape == t.shape == (4,) and x.dtype == t.dtype == np.int64
        assert [chars[j] + chars[k] for j, k in zip(x, t)] == [
            SPEECH[p:p + 2] for p in (np.arange(4) * jump + i) % len(ds)]
    assert (i, jump) == (62, 62)


def test_dezero_s_shakespear_numbers_characters_as_they_first_appear(tmp_path, monkeypatch):
    """DeZero's datasets.Shakespear: the whole text, ids in order of first appearance, its
    char_to_id and id_to_char; a DeZero program ported by its import found no such class."""
    cls = served_class(Shakespear, tmp_path, monkeypatch,
                       lambda path: path.write_bytes(SPEECH.encode()))
    ds = cls(progress=False)
    first = list(dict.fromkeys(SPEECH))  # the characters as they first appear
    assert ds.char_to_id == {c: i for i, c in enumerate(first)} == ds.char_to_index
    assert ds.id_to_char == dict(enumerate(first)) and ds.char_to_id["F"] == 0
    assert ds.data.dtype == ds.label.dtype == np.int64 and len(ds) == len(SPEECH) - 1
    assert "".join(ds.id_to_char[i] for i in ds.data) + ds.id_to_char[ds.label[-1]] == SPEECH
    np.testing.assert_array_equal(ds.label[:-1], ds.data[1:])
    np.testing.assert_array_equal(cls(train=False, progress=False).data, ds.data)


def test_tiny_shakespeare_refuses_a_file_that_is_not_text(tmp_path, monkeypatch):
    raw = SPEECH.encode()[:100] + b"\xff\xfe" + SPEECH.encode()[100:]
    (tmp_path / "cache" / "tinyshakespeare").mkdir(parents=True)
    (tmp_path / "cache" / "tinyshakespeare" / "input.txt").write_bytes(raw)
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path / "cache"))
    cls = type("Cached", (TinyShakespeare,), {"URLS": (),
                                               "SHA256": hashlib.sha256(raw).hexdigest()})
    with pytest.raises(ValueError, match=r"^Cached: .*input.txt is not UTF-8 text \(byte 100 is "
                                         r"b'\\xff'\): not the published file\?$"):
        cls(progress=False)
    (tmp_path / "cache" / "tinyshakespeare" / "input.txt").write_bytes(b"To be")
    cls.SHA256 = hashlib.sha256(b"To be").hexdigest()
    with pytest.raises(ValueError, match=r"input.txt holds 5 characters, too few for a pair"):
        cls(progress=False)
    (tmp_path / "cache" / "tinyshakespeare" / "input.txt").write_bytes("Ay — me! ".encode() * 3)
    cls.SHA256 = hashlib.sha256("Ay — me! ".encode() * 3).hexdigest()
    text = cls(progress=False)  # UTF-8: the dash's three bytes are one character
    assert text.vocabulary() == dict(enumerate(" !Aemy—")) and len(text) == 23


# =============================================================================== damaged files
def cached_mnist(cache, files):
    """A class reading `files` {name: bytes} from the cache folder `cache` (as downloaded
    already: their SHA-256s are the expected ones), with no mirror to fall back on."""
    (cache / "mnist").mkdir(parents=True)
    for name, raw in files.items():
        (cache / "mnist" / name).write_bytes(raw)
    return type("Cached", (MNIST,), {"MIRRORS": ("http://127.0.0.1:1/",), "FILES": {
        name: hashlib.sha256(raw).hexdigest() for name, raw in files.items()}})


def idx_bytes(tmp_path, array, magic):
    idx_gz(tmp_path / "tmp.gz", array, magic)
    raw = (tmp_path / "tmp.gz").read_bytes()
    (tmp_path / "tmp.gz").unlink()
    return raw


def test_idx_labels_out_of_range_are_refused(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    cls = cached_mnist(tmp_path, {
        "train-images-idx3-ubyte.gz": idx_bytes(tmp_path, rng.integers(0, 256, (3, 28, 28)), 2051),
        "train-labels-idx1-ubyte.gz": idx_bytes(tmp_path, np.array([1, 10, 2]), 2049)})
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte.gz has a label of 10; the "
                                         r"classes are 0 to 9"):
        cls(progress=False)


def test_damaged_idx_files_are_refused_naming_the_file(tmp_path):
    import gzip
    import struct

    from gradcore.datasets import read_idx
    cases = {  # file: (its uncompressed bytes, the message)
        "short.gz": (struct.pack(">II", 2051, 3) + b"\0\0", r"short.gz: its IDX header is cut"),
        "none.gz": (struct.pack(">IIII", 2051, 0, 28, 28), r"none.gz: its header gives a shape of "
                                                          r"\(0, 28, 28\): no images"),
        "flat.gz": (struct.pack(">IIII", 2051, 2, 0, 28), r"shape of \(2, 0, 28\): no images"),
        "long.gz": (struct.pack(">IIII", 2051, 1, 2, 2) + bytes(5), r"holds 5 values .*too long"),
    }
    for name, (raw, match) in cases.items():
        with gzip.open(tmp_path / name, "wb") as f:
            f.write(raw)
        with pytest.raises(ValueError, match=match):
            read_idx(tmp_path / name, 2051)
    idx_gz(tmp_path / "whole.gz", np.random.default_rng(0).integers(0, 256, (5, 28, 28)), 2051)
    whole = (tmp_path / "whole.gz").read_bytes()
    (tmp_path / "cut.gz").write_bytes(whole[:len(whole) // 2])
    (tmp_path / "text.gz").write_text("not gzip")
    for name in ("cut.gz", "text.gz"):
        with pytest.raises(ValueError, match=rf"{name} is not a whole gzip file"):
            read_idx(tmp_path / name, 2051)


def test_npz_labels_out_of_range_and_pixels_not_uint8_are_refused(tmp_path):
    np.savez(tmp_path / "labels.npz", x_train=np.zeros((2, 28, 28), np.uint8),
             y_train=np.array([3, -1]))
    with pytest.raises(ValueError, match=r"y_train in .*labels.npz has a label of -1; the classes "
                                         r"are 0 to 9"):
        MNIST(path=tmp_path / "labels.npz")
    np.savez(tmp_path / "scaled.npz", x_train=np.zeros((2, 28, 28), np.float32),
             y_train=np.array([3, 1]))
    with pytest.raises(ValueError, match=r"x_train in .*scaled.npz must be images of uint8 "
                                         r"pixels .* dtype float32"):
        MNIST(path=tmp_path / "scaled.npz")  # else divided by 255 a second time, silently


def test_cifar10_empty_or_damaged_archives_are_refused(tmp_path):
    from gradcore.datasets import read_cifar_binary
    cifar_tar(tmp_path / "empty.tar.gz", {}, extra=[("test_batch.bin", b"")])
    with pytest.raises(ValueError, match=r"test_batch.bin in .*empty.tar.gz holds 0 bytes"):
        read_cifar_binary(tmp_path / "empty.tar.gz", CIFAR10.TEST)
    cifar_tar(tmp_path / "whole.tar.gz", cifar_batches(np.random.default_rng(2)))
    whole = (tmp_path / "whole.tar.gz").read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(whole[:len(whole) // 2])
    (tmp_path / "junk.tar.gz").write_bytes(b"junk")
    for name in ("cut.tar.gz", "junk.tar.gz"):
        with pytest.raises(ValueError, match=rf"{name} is not a whole tar.gz archive"):
            read_cifar_binary(tmp_path / name, CIFAR10.TEST)
    with pytest.raises(FileNotFoundError):  # still itself, not "damaged"
        read_cifar_binary(tmp_path / "absent.tar.gz", CIFAR10.TEST)


# =============================================================================== offline
def test_offline_mnist_names_every_file_and_the_npz(tmp_path, monkeypatch):
    from gradcore.utils.download import DownloadError
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    offline = type("Offline", (MNIST,), {"MIRRORS": ("http://127.0.0.1:1/",)})
    with pytest.raises(DownloadError) as info:
        offline(train=False, progress=False)
    message = str(info.value)
    for name, sha256 in MNIST.FILES.items():  # the test set's, and the train set's
        assert f"{tmp_path / 'mnist' / name}  (SHA-256 {sha256})" in message
    assert f"one {tmp_path / 'mnist.npz'} holding the arrays x_train" in message
    # GRADCORE_DATA names the folder above mnist/, not the one holding the file
    assert "set GRADCORE_DATA to a folder holding it as mnist/t10k-images-idx3-ubyte.gz" in message


# =============================================================================== the cache
def test_gradcore_data_with_a_tilde_is_under_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GRADCORE_DATA", "~/data")  # as a quoted shell profile line leaves it
    monkeypatch.chdir(tmp_path)  # a literal "~" would be a folder here
    (tmp_path / "data").mkdir()
    write_mnist(tmp_path / "data" / "mnist.npz")
    offline = type("Offline", (MNIST,), {"MIRRORS": ("http://127.0.0.1:1/",)})
    assert len(offline()) == 5
    assert cache_folder() == tmp_path / "data"
    monkeypatch.setattr("gradcore.utils.download._relative_folders", {})  # as a new process
    monkeypatch.setenv("GRADCORE_DATA", "relative")  # taken from the current folder, now
    assert cache_folder() == tmp_path / "relative" and cache_folder().is_absolute()


def test_a_cache_folder_that_cannot_be_made_still_gets_the_offline_help(tmp_path, monkeypatch):
    from gradcore.utils.download import DownloadError
    (tmp_path / "data").write_text("a file where the cache folder should be")
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path / "data"))
    offline = type("Offline", (MNIST,), {"MIRRORS": ("http://127.0.0.1:1/",)})
    with pytest.raises(DownloadError, match=r"(?s)cannot create the folder .*data.mnist .*set "
                                            r"GRADCORE_DATA to a folder that is writable\n"
                                            r"Offline reads these files"):
        offline(progress=False)


def test_fetch_takes_one_url_as_a_string(tmp_path):
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "a.bin").write_bytes(b"abc")
    digest = hashlib.sha256(b"abc").hexdigest()
    with served(tmp_path / "served") as url:
        path = fetch("a.bin", url + "a.bin", digest, folder=tmp_path / "cache", progress=False)
    assert path.read_bytes() == b"abc"
    with pytest.raises(TypeError, match=r"fetch\('b.bin'\): urls must be a str URL or a list of "
                       r"them, got bytes"):
        fetch("b.bin", b"http://127.0.0.1:1/b.bin", digest, folder=tmp_path, progress=False)


# =============================================================================== docstrings
def test_public_functions_have_docstrings():
    import inspect

    from gradcore import datasets
    for module in (datasets,):
        for name, obj in vars(module).items():
            if (not name.startswith("_") and inspect.isfunction(obj)
                    and obj.__module__ == module.__name__):
                assert obj.__doc__, f"{module.__name__}.{name} has no docstring"
