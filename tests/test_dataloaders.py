"""gradcore.dataloaders: DataLoader and SeqDataLoader batches, order, shuffling, devices."""
import collections
import os
import signal
import threading
import time

import numpy as np
import pytest

import backends
import gradcore
from conftest import DEVICE1, STRICT, run_in_threads
from gradcore.dataloaders import DataLoader, SeqDataLoader
from gradcore.datasets import Dataset, SinCurve, Spiral


class Counting(Dataset):
    """Example i is (i, i + 100) as float32 / int64: batches show which examples they hold."""

    def __init__(self, n, **kwargs):
        self.n = n
        super().__init__(**kwargs)

    def prepare(self):
        self.data = np.arange(self.n, dtype=np.float32)
        self.label = np.arange(self.n, dtype=np.int64) + 100


def epoch(loader):
    return [(np.asarray(x), None if t is None else np.asarray(t)) for x, t in loader]


# =============================================================================== batches
def test_batches_in_order_with_a_partial_last_batch():
    loader = DataLoader(Counting(10), batch_size=4, shuffle=False)
    assert loader.max_iter == len(loader) == 3 and loader.data_size == 10
    batches = epoch(loader)
    assert [x.tolist() for x, _ in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [t.tolist() for _, t in batches] == [[100, 101, 102, 103], [104, 105, 106, 107],
                                                 [108, 109]]
    assert batches[0][0].dtype == np.float32 and batches[0][1].dtype == np.int64
    assert loader.iteration == 0  # the epoch's end reset it: the next loop is a new epoch
    assert [x.tolist() for x, _ in epoch(loader)] == [x.tolist() for x, _ in batches]


def test_dezero_iteration_protocol():
    loader = DataLoader(Counting(5), batch_size=2, shuffle=False)
    x, t = loader.next()
    assert x.tolist() == [0, 1] and loader.iteration == 1
    assert next(loader)[0].tolist() == [2, 3]
    assert next(loader)[0].tolist() == [4]
    with pytest.raises(StopIteration):
        next(loader)
    assert loader.iteration == 0
    loader.next()
    loader.reset()
    assert loader.iteration == 0 and next(loader)[0].tolist() == [0, 1]


def test_a_loop_left_with_break_leaves_the_rest_of_the_epoch_to_the_next():
    # DeZero's loader is its own iterator: every loop and next() share one position
    loader = DataLoader(Counting(6), batch_size=2, shuffle=False)
    for x, _ in loader:
        break
    assert [x.tolist() for x, _ in epoch(loader)] == [[2, 3], [4, 5]]
    assert next(iter(loader))[0].tolist() == [0, 1]  # a peek takes a batch too
    loader.reset()  # a whole epoch from here
    assert [x.tolist() for x, _ in epoch(loader)] == [[0, 1], [2, 3], [4, 5]]
    loader, taken = DataLoader(Counting(8), batch_size=2, shuffle=False), []
    for x, _ in loader:
        taken.append(x.tolist())
        taken.append(loader.next()[0].tolist())  # next() inside a loop: DeZero code does it
    assert taken == [[0, 1], [2, 3], [4, 5], [6, 7]] and loader.iteration == 0


def test_iter_of_a_loader_has_dezero_loader_surface():
    # DeZero's iter(loader) is the loader: programs call it.next(), it.reset(), read it.iteration
    loader = DataLoader(Counting(5), batch_size=2, shuffle=False)
    it = iter(loader)
    assert it.next()[0].tolist() == [0, 1] and it.iteration == loader.iteration == 1
    assert it.max_iter == 3 and it.data_size == 5 and it.batch_size == 2
    assert it.dataset is loader.dataset and it.shuffle is False and it.gpu is False
    assert it.index.tolist() == [0, 1, 2, 3, 4] and it.to_cpu() is loader
    it.reset()
    assert it.iteration == 0 and [x.tolist() for x, _ in it] == [[0, 1], [2, 3], [4]]
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        it.nothing


def test_iter_of_a_loader_sets_the_loaders_attributes():
    # DeZero's iter(loader) is the loader: it.batch_size = 3 sets the loader's
    loader = DataLoader(Counting(5), batch_size=2, shuffle=False)
    it = iter(loader)
    it.batch_size = 3
    assert (loader.batch_size, len(loader)) == (3, 2)
    assert [x.tolist() for x, _ in it] == [[0, 1, 2], [3, 4]]
    it.dataset = Counting(2)
    it.shuffle = True
    assert (loader.data_size, len(loader), loader.shuffle) == (2, 1, True)
    it.next()
    with pytest.raises(RuntimeError, match=r"mid-epoch \(1 of 1 batches taken\)"):
        it.batch_size = 1  # the loader's own checks
    taken = loader._taken
    with pytest.raises(AttributeError, match="no attribute '_taken'; set it on the loader"):
        it._taken = 0
    assert loader._taken == taken and loader.batch_size == 3


def test_iter_of_a_loader_reused_across_epochs_and_loops():
    # DeZero code keeps it = iter(loader) across epochs: each epoch is whole, even with
    # another loop over the loader in between
    loader = DataLoader(Counting(4), batch_size=2, shuffle=False)
    it = iter(loader)
    assert [x.tolist() for x, _ in it] == [[0, 1], [2, 3]]
    assert len(epoch(loader)) == 2
    assert [x.tolist() for x, _ in it] == [[0, 1], [2, 3]]
    it.next()
    with pytest.raises(RuntimeError, match="another loop over this loader"):
        for _ in loader:
            it.next()  # two loops at once are still caught through it.next()
    with pytest.raises(StopIteration):
        it.next()  # a loop that lost its place stays stopped...
    it.reset()  # ...until reset()
    assert [x.tolist() for x, _ in it] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("loader_class", [DataLoader, SeqDataLoader])
def test_loops_over_one_loader_at_once_raise_instead_of_never_ending(loader_class):
    loader = loader_class(Counting(6), batch_size=2)
    outer = 0
    with pytest.raises(RuntimeError, match=rf"{loader_class.__name__}: another loop over this "
                                           r"loader took batches.*nested loops, "
                                           r"zip\(loader, loader\).*of its own"):
        for _ in loader:  # without the check, each inner epoch's reset restarted this one
            outer += 1
            assert outer < 10, "the outer loop does not end"
            for _ in loader:
                pass
    assert outer == 1
    loader.reset()
    with pytest.raises(RuntimeError, match="another loop over this loader"):
        list(zip(loader, loader))
    loader.reset()
    assert len(epoch(loader)) == 3  # a loop after those is a whole epoch
    inner = loader_class(loader.dataset, batch_size=2)  # what the error says to do
    assert sum(len(epoch(inner)) for _ in loader) == 9


@pytest.mark.parametrize("loader_class", [DataLoader, SeqDataLoader])
def test_a_loop_nested_on_the_outer_loops_last_batch_is_caught_too(loader_class):
    # the inner loop takes no batch, it only ends the epoch: the outer one must not go on
    # through the new epoch
    loader = loader_class(Counting(6), batch_size=2)
    outer, inner = 0, 0
    with pytest.raises(RuntimeError, match="another loop over this loader"):
        for _ in loader:
            outer += 1
            assert outer <= 3, "the outer loop went on into a second epoch"
            if outer == 3:
                for _ in loader:
                    inner += 1
    assert (outer, inner) == (3, 0)
    assert len(epoch(loader)) == 3 and len(epoch(loader)) == 3  # later loops: whole epochs


def test_loops_in_two_threads_take_each_batch_once_or_raise():
    """A loop in each of two threads: one of them gets the RuntimeError and every batch of the
    epoch goes to one loop, once, even when the other loop comes in while a batch is made."""
    making, taken_meanwhile = threading.Event(), threading.Event()

    class Slow:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            if i == 1 and not making.is_set():  # the first loop, making its second batch
                making.set()
                taken_meanwhile.wait(0.5)  # the other loop would take a batch now
            return np.float64(i), np.int64(i)

    loader = DataLoader(Slow(), batch_size=1, shuffle=False)
    got, errors = [], []

    def loop(first):
        if not first:
            making.wait()
        try:
            for _, t in loader:
                got.append(int(t[0]))
                if not first:
                    taken_meanwhile.set()
                elif t[0] == 1:  # the other loop takes a batch before this one's next
                    taken_meanwhile.wait(5)
        except RuntimeError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=loop, args=(first,)) for first in (True, False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(got) == [0, 1, 2, 3, 4, 5]
    assert len(errors) == 1 and "a loop in another thread" in errors[0]
    assert loader.iteration == 0  # the epoch ended once


def test_next_from_threads_hands_each_batch_out_once():
    loader = DataLoader(Counting(4000), batch_size=1, shuffle=False)
    got = []

    def take():
        for _ in range(1000):
            got.append(int(next(loader)[0][0]))

    run_in_threads([take] * 4)  # threads switch inside next() often
    assert sorted(got) == list(range(4000))


def test_a_copied_loader_has_a_lock_of_its_own():
    import copy
    import pickle
    loader = DataLoader(Counting(4), batch_size=2, shuffle=False)
    next(loader)
    for twin in (copy.deepcopy(loader), pickle.loads(pickle.dumps(loader))):
        assert twin._lock is not loader._lock
        assert [x.tolist() for x, _ in epoch(twin)] == [[2, 3]]


def test_spiral_batches():
    loader = DataLoader(Spiral(), batch_size=32)
    batches = epoch(loader)
    assert len(batches) == 10
    assert [len(x) for x, _ in batches] == [32] * 9 + [12]
    assert batches[0][0].shape == (32, 2) and batches[0][0].dtype == np.float32
    assert batches[0][1].shape == (32,) and batches[0][1].dtype == np.int64
    assert isinstance(batches[0][0], np.ndarray)  # the default device is the CPU: NumPy
    assert loader.device == "cpu" and loader.gpu is False


# =============================================================================== shuffling
def test_shuffle_is_np_random_permutation():
    np.random.seed(3)
    expected = np.random.permutation(10)
    np.random.seed(3)
    loader = DataLoader(Counting(10), batch_size=4)
    np.testing.assert_array_equal(loader.index, expected)
    xs = np.concatenate([x for x, _ in epoch(loader)])
    np.testing.assert_array_equal(xs, expected)  # every example once, in that order


def test_shuffle_reproduces_with_np_random_seed():
    def two_epochs():
        np.random.seed(0)
        loader = DataLoader(Counting(20), batch_size=6)
        return [np.concatenate([x for x, _ in epoch(loader)]) for _ in range(2)]

    first, second = two_epochs()
    np.testing.assert_array_equal(np.sort(first), np.arange(20))
    assert not np.array_equal(first, second)  # each epoch draws a new order
    again = two_epochs()
    np.testing.assert_array_equal(again[0], first)
    np.testing.assert_array_equal(again[1], second)


def test_shuffled_labels_stay_with_their_examples():
    np.random.seed(1)
    for x, t in DataLoader(Counting(50), batch_size=16):
        np.testing.assert_array_equal(t, x.astype(np.int64) + 100)


# =============================================================================== devices
def test_batches_on_the_requested_device(xp2):
    ds = Counting(7)
    loader = DataLoader(ds, batch_size=3, shuffle=False, device=xp2.device)
    assert loader.device == xp2.device
    batches = list(loader)
    assert len(batches) == 3
    for x, t in batches:
        for a in (x, t):
            assert backends.backend_of(a) is xp2.backend
            assert xp2.backend.device_of(a) == xp2.device
    x, t = batches[2]
    assert x.dtype == xp2.float32 and t.dtype == xp2.int64
    np.testing.assert_array_equal(xp2.numpy(x), [6.0])
    np.testing.assert_array_equal(xp2.numpy(t), [106])


def test_device_strings_and_moves():
    loader = DataLoader(Counting(4), batch_size=2, shuffle=False, device=str(DEVICE1))
    x, _ = next(loader)
    assert STRICT.device_of(x) == DEVICE1
    assert loader.to_cpu() is loader and loader.device == "cpu"
    x, t = next(loader)  # the move applies from the next batch on
    assert isinstance(x, np.ndarray) and isinstance(t, np.ndarray) and x.tolist() == [2.0, 3.0]
    assert loader.to(DEVICE1) is loader
    x, t = next(DataLoader(Counting(4), 2, device=DEVICE1))
    assert STRICT.device_of(x) == DEVICE1 and STRICT.device_of(t) == DEVICE1


@pytest.mark.parametrize("make", [lambda ds, flag: DataLoader(ds, 2, False, flag),
                                  lambda ds, flag: SeqDataLoader(ds, 2, flag)],
                         ids=["DataLoader", "SeqDataLoader"])
def test_dezero_gpu_flag_by_position(make):
    # DeZero: DataLoader(dataset, batch_size, shuffle=True, gpu=False), SeqDataLoader(dataset,
    # batch_size, gpu=False)
    for flag in (False, np.False_):
        loader = make(Counting(6), flag)
        assert loader.device == "cpu" and loader.gpu is False
        x, t = next(loader)
        assert isinstance(x, np.ndarray) and x.tolist()[0] == 0.0 and t.tolist()[0] == 100
    if not gradcore.cuda_available():  # True is gpu=True: the CUDA device
        with pytest.raises(backends.DeviceUnavailableError, match=r"Loader: .*CUDA"):
            make(Counting(6), True)
    with pytest.raises(ValueError, match=r"gpu=True, but False in device's place is DeZero's gpu=False"):
        DataLoader(Counting(6), 2, False, False, gpu=True)
    with pytest.raises(TypeError, match=r"a device is a gradcore Device"):
        make(Counting(6), False).to(False)  # only the constructor takes DeZero's flag


def test_bad_devices_are_refused_up_front():
    with pytest.raises(ValueError, match=r"DataLoader: unknown device nowhere:1"):
        DataLoader(Counting(4), 2, device="nowhere:1")
    with pytest.raises(backends.DeviceUnavailableError,
                       match=r"DataLoader: array_api_strict:device9 does not exist"):
        DataLoader(Counting(4), 2, device="array_api_strict:device9")
    with pytest.raises(TypeError, match=r"DataLoader: a device is a gradcore Device or a string"):
        DataLoader(Counting(4), 2, device=0)
    with pytest.raises(ValueError, match=r"gpu=True asks for 'cuda' but device='cpu'"):
        DataLoader(Counting(4), 2, device="cpu", gpu=True)
    loader = DataLoader(Counting(4), 2, device=DEVICE1)
    with pytest.raises(ValueError, match="unknown device"):
        loader.to("nowhere:1")
    assert loader.device == DEVICE1  # unchanged by the failed move


@pytest.mark.skipif(gradcore.cuda_available(), reason="a GPU is present")
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(backends.DeviceUnavailableError, match=r"DataLoader: .*CUDA"):
        DataLoader(Counting(4), 2, gpu=True)
    loader = DataLoader(Counting(4), 2)
    with pytest.raises(backends.DeviceUnavailableError, match=r"DataLoader: .*CUDA"):
        loader.to_gpu()
    assert loader.device == "cpu"


@pytest.mark.gpu
def test_cuda_batches():
    loader = DataLoader(Counting(4), 2, shuffle=False).to_gpu()
    x, t = next(loader)
    assert loader.gpu and type(x).__module__.startswith("cupy")
    assert x.get().tolist() == [0.0, 1.0] and t.get().tolist() == [100, 101]


# =============================================================================== datasets
def test_transforms_run_per_example():
    ds = Counting(6, transform=lambda x: np.array([x, -x]), target_transform=lambda t: t - 100)
    x, t = next(DataLoader(ds, batch_size=4, shuffle=False))
    np.testing.assert_array_equal(x, [[0, 0], [1, -1], [2, -2], [3, -3]])
    assert x.dtype == np.float32
    np.testing.assert_array_equal(t, [0, 1, 2, 3])


def test_any_sequence_of_pairs_and_unlabelled_sets():
    pairs = [(np.full(2, i, np.float32), i % 2) for i in range(5)]
    x, t = next(DataLoader(pairs, batch_size=5, shuffle=False))
    assert x.shape == (5, 2) and t.tolist() == [0, 1, 0, 1, 0]

    class Unlabelled(Dataset):
        def prepare(self):
            self.data = np.ones((3, 2), np.float32)

    x, t = next(DataLoader(Unlabelled(), batch_size=2))
    assert x.shape == (2, 2) and t is None


def test_examples_as_lists_batch_as_pairs_do():
    # DeZero indexes example[0] and example[1], so datasets returning [x, t] exist
    class Listed(Counting):
        def __getitem__(self, index):
            return list(super().__getitem__(index))

    for shuffle in (False, True):
        np.random.seed(2)
        rows = epoch(DataLoader(Counting(7), 3, shuffle=shuffle))  # one fancy index a batch
        np.random.seed(2)
        listed = epoch(DataLoader(Listed(7), 3, shuffle=shuffle))  # example by example
        assert len(rows) == len(listed) == 3
        for (x0, t0), (x1, t1) in zip(rows, listed):
            assert x0.dtype == x1.dtype == np.float32 and t0.dtype == t1.dtype == np.int64
            np.testing.assert_array_equal(x0, x1)
            np.testing.assert_array_equal(t0, t1)
    x, t = next(DataLoader([[np.full(2, i, np.float32), i] for i in range(3)], 3, False))
    np.testing.assert_array_equal(x, [[0, 0], [1, 1], [2, 2]])
    assert t.tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match=r"dataset\[0\] must be an \(x, t\) pair.*got a list of 3 "
                                        r"items; pack the inputs into one array"):
        next(DataLoader([[1.0, 2, 3]], 1, shuffle=False))


def test_an_example_of_three_parts_is_counted_in_the_message():
    three = [(np.ones(2, np.float32), np.zeros(3, np.float32), 1)]
    with pytest.raises(TypeError, match=r"^DataLoader: dataset\[0\] must be an \(x, t\) pair "
                                        r"\(t None when there is no label\), got a tuple of 3 "
                                        r"items; pack the inputs into one array$"):
        next(DataLoader(three, 1, shuffle=False))
    with pytest.raises(TypeError, match=r"got a tuple of 1 item$"):
        next(DataLoader([(np.ones(2),)], 1, shuffle=False))


def test_examples_that_are_not_arrays_or_numbers_are_refused_not_batched_as_objects():
    # a transform that gives each example as some object: np.stack would make an object array
    ds = Counting(4, transform=lambda x: {"x": x})
    with pytest.raises(TypeError, match=r"^DataLoader: cannot stack the inputs of a batch into "
                                        r"one array of numbers, got a dict; the dataset's "
                                        r"examples must be host arrays or numbers of one shape$"):
        next(DataLoader(ds, 2, shuffle=False))
    labels = Counting(4, target_transform=lambda t: object())
    with pytest.raises(TypeError, match=r"cannot stack the labels .* got a object"):
        next(DataLoader(labels, 2, shuffle=False))


class Pictures(Dataset):
    """Six 3x6x6 uint8 images, labelled 0 or 1."""

    def prepare(self):
        self.data = np.random.default_rng(0).integers(0, 256, (6, 3, 6, 6)).astype(np.uint8)
        self.label = np.arange(6, dtype=np.int64) % 2


def test_pil_images_are_refused_saying_to_end_the_transform_with_to_array():
    pytest.importorskip("PIL.Image")
    from gradcore.transforms import Compose, Convert, RandomHorizontalFlip, Resize, ToArray, ToPIL
    # np.asarray would make each image (H, W, C): a channels-last batch (4, 4, 4, 3), or a
    # palette image's indices, that a lazy Conv2d takes with no error
    for last, mode in ((RandomHorizontalFlip(), "RGB"), (Convert("P"), "P")):
        ds = Pictures(transform=Compose([ToPIL(), Resize(4), last]))
        with pytest.raises(TypeError, match=rf"^DataLoader: the inputs of a batch include a PIL "
                                            rf"image \(mode {mode}, 4x4\), which would stack as "
                                            r"an array of raw pixels, channels last; end the "
                                            r"dataset's transform with ToArray\(\) "
                                            r"\(gradcore.transforms\) to make each a \(C, H, W\) "
                                            r"array$"):
            next(DataLoader(ds, 4, shuffle=False))
    labels = Pictures(transform=None, target_transform=lambda t: ToPIL()(np.full((1, 2, 2), t,
                                                                                 np.uint8)))
    with pytest.raises(TypeError, match=r"the labels of a batch include a PIL image \(mode L, "
                                        r"2x2\).*end the dataset's target_transform with"):
        next(DataLoader(labels, 4, shuffle=False))
    ds = Pictures(transform=Compose([ToPIL(), Resize(4), ToArray()]))
    x, t = next(DataLoader(ds, 4, shuffle=False))
    assert x.shape == (4, 3, 4, 4) and x.dtype == np.float32 and t.tolist() == [0, 1, 0, 1]


def test_other_examples_that_convert_through_array_are_batched():
    class Wrapped:  # as a torch CPU tensor: np.asarray gives the values it holds, in its layout
        def __init__(self, x):
            self.x = x

        def __array__(self, dtype=None, copy=None):
            return self.x

    x, t = next(DataLoader(Counting(4, transform=lambda x: Wrapped(np.full(2, x))), 3,
                           shuffle=False))
    assert x.tolist() == [[0, 0], [1, 1], [2, 2]] and t.tolist() == [100, 101, 102]


def test_bad_datasets_and_arguments():
    with pytest.raises(TypeError, match=r"DataLoader: dataset must support len\(\)"):
        DataLoader(5, 2)
    for bad in (0, -1, 2.0, True, "4"):
        with pytest.raises(ValueError, match=r"batch_size must be a positive int"):
            DataLoader(Counting(4), bad)
    with pytest.raises(TypeError, match=r"shuffle must be True or False"):
        DataLoader(Counting(4), 2, shuffle="yes")
    with pytest.raises(TypeError, match=r"dataset\[0\] must be an \(x, t\) pair"):
        next(DataLoader([1, 2], 2, shuffle=False))
    ragged = [(np.zeros(2), 0), (np.zeros(3), 1)]
    with pytest.raises(ValueError, match=r"cannot stack the inputs of a batch.*shapes"):
        next(DataLoader(ragged, 2, shuffle=False))
    with pytest.raises(ValueError, match=r"some examples of a batch have a label and some"):
        next(DataLoader([(1.0, 1), (2.0, None)], 2, shuffle=False))


def test_examples_made_of_parts_of_different_shapes_get_the_loaders_message():
    # NumPy cannot give such an example a shape: describing it must not raise NumPy's error
    two_inputs = [((np.ones(2) * i, np.ones(3) * i), i) for i in range(4)]
    with pytest.raises(ValueError, match=r"^DataLoader: cannot stack the inputs of a batch .*"
                                         r"got an example made of parts of different shapes"):
        next(DataLoader(two_inputs, 2, shuffle=False))
    x, t = next(DataLoader([((np.ones(2) * i, np.ones(2)), i) for i in range(4)], 2,
                           shuffle=False))  # parts of one shape still stack
    assert x.shape == (2, 2, 2) and np.array_equal(x[1], [[1.0, 1.0], [1.0, 1.0]])
    assert np.array_equal(t, [0, 1])


def test_batch_size_or_dataset_set_between_epochs_gives_whole_epochs():
    loader = DataLoader(Counting(7), 3, shuffle=False)
    assert len(loader) == 3
    loader.batch_size = 2
    assert (len(loader), loader.max_iter, loader.data_size) == (4, 4, 7)
    assert [x.tolist() for x, _ in epoch(loader)] == [[0, 1], [2, 3], [4, 5], [6]]
    loader.batch_size = np.int64(5)  # after a whole epoch: iteration is 0 again
    assert loader.batch_size == 5 and type(loader.batch_size) is int
    assert [x.tolist() for x, _ in epoch(loader)] == [[0, 1, 2, 3, 4], [5, 6]]
    loader.dataset = Counting(3)
    assert (len(loader), loader.data_size) == (1, 3)
    assert [t.tolist() for _, t in epoch(loader)] == [[100, 101, 102]]
    np.random.seed(0)
    shuffled = DataLoader(Counting(4), 4)
    shuffled.dataset = Counting(6)  # a new order, of the new dataset's 6 examples
    assert sorted(np.concatenate([x for x, _ in epoch(shuffled)]).tolist()) == [0, 1, 2, 3, 4, 5]


def test_batch_size_set_after_the_dataset_changed_length_batches_its_examples_once():
    # the order drawn for the old length gave empty batches (grown) or an IndexError (shrunk)
    dataset = Counting(6)
    loader = DataLoader(dataset, 2, shuffle=False)
    dataset.n = 12
    dataset.prepare()
    loader.batch_size = 3
    assert [x.tolist() for x, _ in epoch(loader)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8],
                                                      [9, 10, 11]]
    dataset.n = 4
    dataset.prepare()
    loader.batch_size = 2
    assert [x.tolist() for x, _ in epoch(loader)] == [[0, 1], [2, 3]]
    # shuffled: the same length keeps the order drawn (no draw, as in DeZero); a new length
    # draws one for it
    np.random.seed(0)
    draws = np.random.RandomState(0)
    shuffled = DataLoader(Counting(5), 2)
    shuffled.batch_size = 3
    assert np.concatenate([x for x, _ in epoch(shuffled)]).tolist() == \
        draws.permutation(5).tolist()
    draws.permutation(5)  # the one the epoch's end drew
    shuffled.dataset.n = 8
    shuffled.dataset.prepare()
    shuffled.batch_size = 4
    assert np.concatenate([x for x, _ in epoch(shuffled)]).tolist() == \
        draws.permutation(8).tolist()


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_dataset_grown_in_place_is_batched_whole_from_the_next_epoch(shuffle):
    # a replay buffer: len() was read once, so examples 6-9 were never batched
    dataset = Counting(6)
    loader = DataLoader(dataset, 4, shuffle=shuffle)
    assert sorted(np.concatenate([x for x, _ in epoch(loader)]).tolist()) == list(range(6))
    dataset.n = 10
    dataset.prepare()
    assert (len(loader), loader.max_iter, loader.data_size) == (3, 3, 10)
    batches = epoch(loader)
    assert [len(x) for x, _ in batches] == [4, 4, 2]
    assert sorted(np.concatenate([x for x, _ in batches]).tolist()) == list(range(10))
    assert sorted(np.concatenate([t for _, t in batches]).tolist()) == list(range(100, 110))
    # grown mid-epoch: this epoch keeps its order, the next has every example once
    next(loader)
    dataset.n = 13
    dataset.prepare()
    rest = [x for x, _ in epoch(loader)]
    assert len(rest) == 2 and len(np.concatenate(rest)) == 6
    assert sorted(np.concatenate([x for x, _ in epoch(loader)]).tolist()) == list(range(13))
    # reset() reads the length too
    dataset.n = 15
    dataset.prepare()
    next(loader)
    loader.reset()
    assert sorted(np.concatenate([x for x, _ in epoch(loader)]).tolist()) == list(range(15))


def test_a_grown_dataset_with_dezeros_next_and_max_iter():
    dataset = Counting(5)
    loader = DataLoader(dataset, 2, shuffle=False)
    assert [x.tolist() for x, _ in epoch(loader)] == [[0, 1], [2, 3], [4]]
    dataset.n = 7
    dataset.prepare()
    # DeZero code: for i in range(loader.max_iter): x, t = loader.next()
    assert [loader.next()[0].tolist() for _ in range(loader.max_iter)] == \
        [[0, 1], [2, 3], [4, 5], [6]]
    with pytest.raises(StopIteration):
        next(loader)
    dataset.n = 8
    dataset.prepare()
    assert next(loader)[0].tolist() == [0, 1] and loader.max_iter == 4  # first batch reads it
    it = iter(loader)
    assert [x.tolist() for x, _ in it] == [[2, 3], [4, 5], [6, 7]]


def test_a_dataset_shrunk_in_place_raises_mid_epoch_and_batches_whole_between_epochs():
    dataset = Counting(6)
    loader = DataLoader(dataset, 2, shuffle=False)
    next(loader)
    dataset.n = 3
    dataset.prepare()
    # was an IndexError from NumPy at a later batch
    with pytest.raises(RuntimeError, match=r"^DataLoader: the dataset shrank from 6 to 3 "
                                           r"examples mid-epoch \(1 of 3 batches taken\); "
                                           r"call loader.reset\(\)"):
        next(loader)
    assert loader.iteration == 1  # nothing changed
    loader.reset()
    assert [x.tolist() for x, _ in epoch(loader)] == [[0, 1], [2]]
    dataset.n = 1  # between epochs: the next is over the examples left
    dataset.prepare()
    assert [x.tolist() for x, _ in epoch(loader)] == [[0]]
    dataset.n = 0
    dataset.prepare()
    assert len(loader) == 0 and epoch(loader) == []


def test_seq_loader_follows_a_dataset_grown_or_shrunk_in_place():
    dataset = Counting(6)
    loader = SeqDataLoader(dataset, batch_size=2)
    assert [x.tolist() for x, _ in epoch(loader)] == [[0, 3], [1, 4], [2, 5]]
    dataset.n = 8
    dataset.prepare()  # jump 4 from the next epoch
    assert [x.tolist() for x, _ in epoch(loader)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    next(loader)
    dataset.n = 5
    dataset.prepare()
    with pytest.raises(RuntimeError, match="shrank from 8 to 5 examples mid-epoch"):
        next(loader)
    loader.reset()
    assert [x.tolist() for x, _ in epoch(loader)] == [[0, 2], [1, 3], [2, 4]]
    dataset.n = 1
    dataset.prepare()
    with pytest.raises(ValueError, match=r"batch_size \(2\) is the number of parallel streams "
                                         r"and cannot exceed the 1 examples"):
        next(loader)


def test_a_subclass_may_set_dataset_and_batch_size_before_dataloaders_init():
    class DeZeroStyle(DataLoader):  # DeZero's DataLoader.__init__ starts so
        def __init__(self, dataset, batch_size):
            self.dataset = dataset
            self.batch_size = batch_size
            super().__init__(dataset, batch_size, shuffle=False)

    loader = DeZeroStyle(Counting(10), 3)
    assert [x.tolist() for x, _ in epoch(loader)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_batch_size_or_dataset_set_mid_epoch_is_refused_and_changes_nothing():
    loader = DataLoader(Counting(7), 3, shuffle=False)
    next(loader)
    for name, value in (("batch_size", 2), ("dataset", Counting(4))):
        with pytest.raises(RuntimeError, match=r"^DataLoader: cannot change dataset or "
                                               r"batch_size mid-epoch \(1 of 3 batches taken\); "
                                               r"call loader.reset\(\) first"):
            setattr(loader, name, value)
    assert (loader.batch_size, len(loader), loader.data_size) == (3, 3, 7)
    assert [x.tolist() for x, _ in epoch(loader)] == [[3, 4, 5], [6]]
    next(loader)
    loader.reset()
    loader.batch_size = 4
    assert [x.tolist() for x, _ in epoch(loader)] == [[0, 1, 2, 3], [4, 5, 6]]
    with pytest.raises(ValueError, match=r"batch_size must be a positive int, got 0"):
        loader.batch_size = 0
    with pytest.raises(TypeError, match=r"dataset must support len\(\)"):
        loader.dataset = 5
    assert (loader.batch_size, len(loader), loader.data_size) == (4, 2, 7)


# =============================================================================== SeqDataLoader
def test_seq_loader_streams():
    loader = SeqDataLoader(Counting(10), batch_size=3)
    assert loader.max_iter == 4 and loader.shuffle is False
    batches = epoch(loader)
    # three streams starting at 0, 3 and 6 (jump 10 // 3), one step each batch
    assert [x.tolist() for x, _ in batches] == [[0, 3, 6], [1, 4, 7], [2, 5, 8], [3, 6, 9]]
    assert [t.tolist() for _, t in batches][0] == [100, 103, 106]
    assert loader.iteration == 0


@pytest.mark.parametrize("n, batch_size, twice, never", [
    (10, 4, [2, 4, 6], [9]), (10, 3, [3, 6], []), (11, 3, [3, 6], [10]), (12, 4, [], [])])
def test_seq_loader_epoch_repeats_where_streams_meet_and_skips_the_tail(n, batch_size, twice,
                                                                        never):
    counts = collections.Counter(int(i) for x, _ in epoch(SeqDataLoader(Counting(n), batch_size))
                                 for i in x)
    assert sorted(i for i, c in counts.items() if c == 2) == twice  # DeZero's, as documented
    assert sorted(set(range(n)) - set(counts)) == never and max(counts.values()) <= 2
    doc = SeqDataLoader.__doc__
    assert "twice" in doc and "never yields examples b * jump + 1 to n - 1" in doc


def test_seq_loader_follows_sin_curve():
    ds = SinCurve()
    loader = SeqDataLoader(ds, batch_size=4)
    jump = 999 // 4
    assert loader.max_iter == 250
    for i, (x, t) in enumerate(loader):
        assert x.shape == t.shape == (4, 1)
        positions = (np.arange(4) * jump + i) % 999
        np.testing.assert_array_equal(x, ds.data[positions])
        np.testing.assert_array_equal(t, ds.label[positions])
    assert i == 249 and positions.tolist() == [249, 498, 747, 996]


def test_seq_loader_device(xp2):
    loader = SeqDataLoader(Counting(6), batch_size=2, device=xp2.device)
    x, t = next(loader)
    assert xp2.backend.device_of(x) == xp2.device and xp2.backend.device_of(t) == xp2.device
    np.testing.assert_array_equal(xp2.numpy(x), [0, 3])


def test_seq_loader_needs_enough_examples():
    with pytest.raises(ValueError, match=r"batch_size \(7\) is the number of parallel streams"):
        SeqDataLoader(Counting(6), batch_size=7)
    loader = SeqDataLoader(Counting(6), batch_size=2)
    with pytest.raises(ValueError, match=r"batch_size \(7\) is the number of parallel streams"):
        loader.batch_size = 7
    assert (loader.batch_size, len(loader)) == (2, 3)


def test_seq_loader_batch_size_set_between_epochs():
    loader = SeqDataLoader(Counting(10), batch_size=2)
    loader.batch_size = 3  # jump 3 and max_iter 4, as SeqDataLoader(Counting(10), 3) has
    assert len(loader) == 4
    assert [x.tolist() for x, _ in epoch(loader)] == [[0, 3, 6], [1, 4, 7], [2, 5, 8], [3, 6, 9]]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_batches_while_another_thread_of_the_parent_makes_one():
    """A thread of the parent holds the loader's lock mid-batch as the process forks: the child
    (a multiprocessing worker) gets its batch instead of waiting forever on that lock."""
    started, release = threading.Event(), threading.Event()

    class Slow(list):
        def __getitem__(self, i):
            if threading.current_thread() is not threading.main_thread():
                started.set()
                release.wait(10)
            return super().__getitem__(i)

    loader = DataLoader(Slow((np.float32(i), np.int64(i)) for i in range(8)), 4, shuffle=False)
    thread = threading.Thread(target=loader.next)
    thread.start()
    assert started.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: its batch must come at once
        code = 1
        try:
            x, t = loader.next()
            code = 0 if len(x) == 4 else 1
        finally:
            os._exit(code)
    release.set()
    thread.join()
    for _ in range(100):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the child waited on a lock held by a thread it does not have")
    assert os.waitstatus_to_exitcode(status) == 0
