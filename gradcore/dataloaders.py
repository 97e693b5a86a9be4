"""Mini-batches (DeZero's `dezero.dataloaders`): DataLoader and SeqDataLoader yield (x, t) batches
of a dataset as arrays on a device: NumPy on the CPU by default, CuPy on "cuda", or any
registered backend's device. Examples are gathered on the host and each batch is moved once."""
import math
import os
import threading
import weakref

import numpy as np

import backends

from .datasets import _identity, rows_of_arrays
from .transforms import first_image

__all__ = ["DataLoader", "SeqDataLoader"]


def _checked_device(owner, device, gpu=False):
    """`device` as a Device that exists here (errors say so now, not at the first batch)."""
    if gpu:  # DeZero's gpu=True
        if device is not None and backends.parse_device(device).type != "cuda":
            raise ValueError(f"{owner}: gpu=True asks for 'cuda' but device={device!r}; pass one "
                             "of them")
        device = "cuda" if device is None else device
    try:
        device = backends.parse_device(device)
        backend = backends.backend_for_device(device)
        backend.asarray(np.zeros(0, np.float32), device=device)  # a device the backend lacks
    except (TypeError, ValueError, backends.DeviceUnavailableError) as e:
        raise type(e)(f"{owner}: {e}") from None
    return device


def _stack(owner, values, what):
    """The examples' x (or t) values as one NumPy array with a leading batch axis."""
    _refuse_images(owner, values, what)
    try:
        batch = np.stack([np.asarray(v) for v in values])
    except (TypeError, ValueError) as e:
        shapes = {_shape_or_none(v) for v in values}
        if None in shapes:
            got = ", got an example made of parts of different shapes (several inputs in a tuple?)"
        else:
            got = f", got shapes {sorted(shapes)}" if len(shapes) > 1 else ""
        raise ValueError(f"{owner}: cannot stack the {what} of a batch into one array ({e}); "
                         f"the dataset's examples must be host arrays or numbers of one shape"
                         + got) from None
    if batch.dtype == object:  # np.asarray wraps anything that is not numbers in a 0-d array
        odd = next(v for v in values if np.asarray(v).dtype == object)
        raise TypeError(f"{owner}: cannot stack the {what} of a batch into one array of numbers, "
                        f"got a {type(odd).__name__}; the dataset's examples must be host arrays "
                        "or numbers of one shape")
    return batch


def _refuse_images(owner, values, what):
    """Refuse PIL images (see transforms.first_image), which a batch would stack channels last
    with no error. Other objects with __array__ (a torch CPU tensor) convert to what they
    hold, and pass."""
    img = first_image(values)
    if img is not None:
        transform = "transform" if what == "inputs" else "target_transform"
        raise TypeError(f"{owner}: the {what} of a batch include a PIL image (mode {img.mode}, "
                        f"{img.width}x{img.height}), which would stack as an array of raw pixels, "
                        f"channels last; end the dataset's {transform} with ToArray() "
                        "(gradcore.transforms) to make each a (C, H, W) array")


def _shape_or_none(value):
    """value's shape; None for one NumPy cannot give a shape (parts of different shapes)."""
    try:
        return np.shape(value)
    except (TypeError, ValueError):
        return None


def _gather(owner, dataset, index):
    """The examples at `index` (a NumPy integer array) as host arrays (x, t); t is None when
    the dataset has no labels."""
    if (rows_of_arrays(dataset) and dataset.transform is _identity
            and dataset.target_transform is _identity):
        # no transforms: one fancy index instead of len(index) calls to __getitem__
        return dataset.data[index], None if dataset.label is None else dataset.label[index]
    xs, ts = [], []
    for i in index.tolist():
        example = dataset[i]
        # a list too: DeZero reads example[0] and example[1], so [x, t] datasets exist
        if not isinstance(example, (tuple, list)) or len(example) != 2:
            got = type(example).__name__
            if isinstance(example, (tuple, list)):
                n = len(example)
                got = f"a {got} of {n} item{'s' * (n != 1)}"
                got += "; pack the inputs into one array" if n > 2 else ""
            raise TypeError(f"{owner}: dataset[{i}] must be an (x, t) pair (t None when there "
                            f"is no label), got {got}")
        xs.append(example[0])
        ts.append(example[1])
    unlabelled = [t is None for t in ts]
    if any(unlabelled) and not all(unlabelled):
        raise ValueError(f"{owner}: some examples of a batch have a label and some have None")
    return _stack(owner, xs, "inputs"), None if all(unlabelled) else _stack(owner, ts, "labels")



# Every loader, for a forked child (multiprocessing's workers on Linux) to give each a lock of
# its own: the parent's thread that held one mid-batch does not exist there
_loaders = weakref.WeakSet()


def _after_fork():
    for loader in list(_loaders):
        if not loader._lock._is_owned():
            loader._lock = threading.RLock()


os.register_at_fork(after_in_child=_after_fork)

class DataLoader:
    """Iterate over `dataset` in mini-batches: each step yields (x, t), x of shape
    (batch_size, ...) and t of shape (batch_size, ...) (None for an unlabelled dataset), as
    arrays on `device` ("cpu" by default, "cuda", "cuda:1", "array_api_strict:device1", a Device).

    DeZero's protocol: the loader holds one position, `iteration`, that `next(loader)` and
    every `for` loop over it advance; `max_iter` batches make an epoch, the last one partial
    when batch_size does not divide len(dataset); at the end of an epoch it calls `reset()`
    (iteration = 0, a new order) and stops, so the next `for` loop is the next epoch. So a
    `for` loop left with `break` leaves the rest of its epoch to the next loop (call `reset()`
    first for a whole epoch), and two loops over one loader at once (nested, or
    zip(loader, loader), or one loop in each of two threads) would share the position: a loop
    raises RuntimeError at its next step when another took batches, or ended the epoch, since
    its last (the outer one, when nested); use a second DataLoader over the same dataset
    instead. next(loader) from several threads hands each batch to one of them. With
    shuffle=True the order is np.random.permutation (NumPy's global generator):
    np.random.seed(n) before building the loader reproduces every epoch. `batch_size` and `dataset` may be set between
    epochs (len(loader) follows); mid-epoch that raises RuntimeError (reset() first), since the
    batches already taken were cut with the old sizes.

    Each epoch reads len(dataset) when it starts (reset(), or its first batch), so a dataset that
    grows in place (a replay buffer) has each of its examples once in every epoch from the next
    one on; between epochs len(loader), max_iter and data_size read it too. Examples added
    mid-epoch wait for the next epoch; a dataset that shrinks mid-epoch raises RuntimeError at
    the next batch (reset() starts an epoch over the examples left).

    `dataset` is anything with `len()` and `dataset[i] -> (x, t)` holding host data (NumPy
    arrays or numbers); an example may be a list [x, t] too, as in DeZero. `gpu=True` is
    DeZero's spelling of device="cuda", and True or False in device's place is DeZero's gpu
    passed by position: DataLoader(dataset, 10, True, False) is DeZero's call.
    """

    # batches taken, and epochs ended, by `for` loops (_Loop): each checks that no other took one
    _taken = 0

    def __init__(self, dataset, batch_size, shuffle=True, device=None, *, gpu=False):
        name = type(self).__name__
        self.iteration = 0  # read by _set_sizes: none of an epoch is taken yet
        self._set_sizes(dataset, batch_size)
        if not isinstance(shuffle, (bool, np.bool_)):
            raise TypeError(f"{name}: shuffle must be True or False, got {shuffle!r}")
        if isinstance(device, (bool, np.bool_)):  # DeZero's gpu, passed by position
            if gpu and not device:
                raise ValueError(f"{name}: gpu=True, but False in device's place is DeZero's "
                                 "gpu=False; pass one of them")
            device, gpu = None, bool(device)
        self._device = _checked_device(name, device, gpu)
        self.shuffle = bool(shuffle)
        # held while a batch is made: threads sharing the loader take each batch once
        # (reentrant: a `for` loop holds it around next())
        self._lock = threading.RLock()
        _loaders.add(self)
        self.reset()

    def _set_sizes(self, dataset, batch_size):
        """Check and take `dataset` and `batch_size`, and the epoch's length (data_size,
        max_iter) they give: all of them or, on an error, none."""
        name = type(self).__name__
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise TypeError(f"{name}: dataset must support len() and dataset[i] -> (x, t) (a "
                            f"gradcore Dataset, for one), got {type(dataset).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1:
            raise ValueError(f"{name}: batch_size must be a positive int, got {batch_size!r}")
        # the batches taken so far were cut with the old sizes: the rest of the epoch would
        # skip or repeat examples
        if self.iteration:
            raise RuntimeError(f"{name}: cannot change dataset or batch_size mid-epoch "
                               f"({self.iteration} of {self._max_iter} batches taken); call "
                               "loader.reset() first, or set it once the loop over the epoch "
                               "has ended")
        data_size, batch_size = len(dataset), int(batch_size)
        self._check_sizes(data_size, batch_size)
        self._dataset, self._batch_size = dataset, batch_size
        self._data_size = data_size
        self._max_iter = math.ceil(data_size / batch_size)

    def _check_sizes(self, data_size, batch_size):
        """Refuse sizes this kind of loader cannot batch (any will do here)."""

    @property
    def dataset(self):
        """The dataset batched; set it between epochs (iteration 0) to batch another."""
        return self._dataset

    @dataset.setter
    def dataset(self, dataset):
        if "_lock" not in self.__dict__:  # a subclass's __init__ before DataLoader's, as DeZero's
            self._dataset = dataset  # checked there
            return
        with self._lock:
            self._set_sizes(dataset, self._batch_size)
            self.reset()  # an order of the new dataset's examples

    @property
    def batch_size(self):
        """Examples per batch; set it between epochs (iteration 0): len(loader) follows."""
        return self._batch_size

    @batch_size.setter
    def batch_size(self, batch_size):
        if "_lock" not in self.__dict__:  # see the dataset setter
            self._batch_size = batch_size
            return
        with self._lock:
            self._set_sizes(self._dataset, batch_size)
            if len(self.index) != self._data_size:  # the dataset grew or shrank since the order
                self.reset()  # was drawn; the same length keeps it (no draw, as in DeZero)

    def __getstate__(self):  # a copy or an unpickled loader gets a lock of its own
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state, _lock=threading.RLock())
        _loaders.add(self)

    @property
    def device(self):
        """The Device batches are put on."""
        return self._device

    @property
    def gpu(self):
        """True when batches go to a GPU (DeZero's flag)."""
        return self._device.type == "cuda"

    def reset(self):
        """Start a new epoch: iteration 0, len(dataset) read again, and a new order (a
        permutation when shuffling)."""
        with self._lock:
            self.iteration = 0
            self._set_sizes(self._dataset, self._batch_size)
            if self.shuffle:
                self.index = np.random.permutation(self._data_size)
            else:
                self.index = np.arange(self._data_size)

    def _sizes_now(self):
        """Between epochs, start the next one over the dataset's examples now when its length
        changed since the order was drawn (a dataset grown or shrunk in place)."""
        if self.iteration == 0 and len(self._dataset) != self._data_size:
            with self._lock:
                if self.iteration == 0:  # no other thread took the epoch's first batch
                    self.reset()

    @property
    def data_size(self):
        """Examples in an epoch: the current one's, or between epochs len(dataset) now."""
        self._sizes_now()
        return self._data_size

    @property
    def max_iter(self):
        """Batches in an epoch: the current one's, or between epochs those len(dataset) now
        gives."""
        self._sizes_now()
        return self._max_iter

    def __iter__(self):
        return _Loop(self)

    def __len__(self):
        return self.max_iter

    def _batch_index(self):
        i, n = self.iteration, self._batch_size
        return self.index[i * n:(i + 1) * n]

    def __next__(self):
        with self._lock:
            data_size = len(self._dataset)
            if data_size != self._data_size and self.iteration == 0:
                self.reset()  # an epoch starts: over the examples the dataset has now
            if self.iteration >= self._max_iter:
                self.reset()
                raise StopIteration
            if data_size < self._data_size:
                # the epoch's order holds examples the dataset no longer has (an IndexError,
                # or other examples, at some later batch)
                raise RuntimeError(
                    f"{type(self).__name__}: the dataset shrank from {self._data_size} to "
                    f"{data_size} examples mid-epoch ({self.iteration} of {self._max_iter} "
                    "batches taken); call loader.reset() to start an epoch over the examples "
                    "it has now")
            x, t = _gather(type(self).__name__, self._dataset, self._batch_index())
            x = backends.to_device(x, self._device)
            if t is not None:
                t = backends.to_device(t, self._device)
            self.iteration += 1
            return x, t

    def next(self):
        """The next batch (DeZero's name for next(loader))."""
        return self.__next__()

    def to(self, device):
        """Put the following batches on `device`; returns self."""
        self._device = _checked_device(type(self).__name__, device)
        return self

    def to_cpu(self):
        """Put the following batches on the CPU (NumPy); returns self."""
        return self.to("cpu")

    def to_gpu(self, device=None):
        """Put the following batches on a GPU ("cuda" = the current one); returns self."""
        return self.to("cuda" if device is None else device)

    def __repr__(self):
        return (f"{type(self).__name__}({self.dataset!r}, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, device={self._device})")


class _Loop:
    """One `for` loop over a DataLoader: the loader's own batches, from its one position (as
    DeZero's loader, which is its own iterator), but a RuntimeError, not a loop that never
    ends, when another loop over the same loader took batches since this one's last.

    It stands for the loader as DeZero's iter(loader) does: it.next(), it.reset() and the
    loader's attributes (it.iteration, it.max_iter, it.dataset, ...) work on it, and after an
    epoch's StopIteration its next step starts the next epoch."""

    __slots__ = ("loader", "taken", "done")

    def __init__(self, loader):
        self.loader, self.taken, self.done = loader, None, False

    def __iter__(self):
        return self

    def __next__(self):
        loader = self.loader
        if self.done:
            raise StopIteration
        # the check, the batch and the count in one piece: a loop in another thread cannot
        # take a batch in between
        with loader._lock:
            if self.taken is not None and self.taken != loader._taken:
                self.done = True
                name = type(loader).__name__
                raise RuntimeError(
                    f"{name}: another loop over this loader took batches while this one ran "
                    "(nested loops, zip(loader, loader), or a loop in another thread); they "
                    "share one position, so this loop would never end or would skip batches. "
                    f"Give the other loop a {name} of its own over the same dataset: "
                    f"{name}(loader.dataset, batch_size, ...)")
            try:
                batch = loader.__next__()
            except StopIteration:
                # the loader reset itself: this loop's next step starts an epoch, as a new
                # loop's would (DeZero code reuses iter(loader) across epochs). The reset counts
                # as taking: a loop this one is nested in, on its epoch's last batch, must not
                # go on into the new epoch
                loader._taken += 1
                self.taken = None
                raise
            loader._taken += 1
            self.taken = loader._taken
        return batch

    def next(self):
        """The next batch (DeZero's name for next(it))."""
        return self.__next__()

    def reset(self):
        """Start a new epoch of the loader, this loop with it (also after its RuntimeError)."""
        with self.loader._lock:
            self.loader.reset()
            self.taken, self.done = None, False

    def __getattr__(self, name):
        # the rest of the loader's surface: DeZero's iter(loader) is the loader itself. Not
        # private names, nor the slots while unset (copy and pickle probe before filling them)
        if name.startswith("_") or name in _Loop.__slots__:
            raise AttributeError(f"'_Loop' object has no attribute {name!r}")
        return getattr(self.loader, name)

    def __setattr__(self, name, value):
        # it.batch_size = 50 sets the loader's, as __getattr__ reads it; private names are
        # refused, as there
        if name in _Loop.__slots__:
            object.__setattr__(self, name, value)
        elif name.startswith("_"):
            raise AttributeError(f"'_Loop' object has no attribute {name!r}; set it on the "
                                 "loader (it.loader)")
        else:
            setattr(self.loader, name, value)


class SeqDataLoader(DataLoader):
    """Batches of a time series for truncated BPTT: batch_size parallel streams, stream k
    starting at k * jump, jump = len(dataset) // batch_size; step i (0 to max_iter - 1,
    max_iter = ceil(len(dataset) / batch_size) as for DataLoader) yields example k * jump + i of
    every stream k. Never shuffles. x and t have shape (batch_size, ...). `device` and `gpu` as
    for DataLoader: SeqDataLoader(dataset, 30, False) is DeZero's call.

    This is DeZero's formula, kept so that DeZero programs run unchanged. When batch_size
    divides len(dataset), an epoch yields every example once. Otherwise each stream takes
    jump + 1 steps and so runs into the next stream's first example: with n = len(dataset),
    b = batch_size, an epoch yields examples jump, 2 * jump, ..., (b - 1) * jump twice and
    never yields examples b * jump + 1 to n - 1 (none when b * jump = n - 1). 10 examples in
    batches of 4: jump 2, examples 2, 4 and 6 twice, 9 never; in batches of 3: 3 and 6 twice.
    """

    def __init__(self, dataset, batch_size, device=None, *, gpu=False):
        super().__init__(dataset, batch_size, shuffle=False, device=device, gpu=gpu)

    def _check_sizes(self, data_size, batch_size):
        if batch_size > data_size:
            raise ValueError(f"SeqDataLoader: batch_size ({batch_size}) is the number of "
                             f"parallel streams and cannot exceed the {data_size} examples")

    def _batch_index(self):
        jump = self._data_size // self._batch_size
        return (np.arange(self._batch_size) * jump + self.iteration) % self._data_size

    def __repr__(self):
        return (f"SeqDataLoader({self.dataset!r}, batch_size={self.batch_size}, "
                f"device={self._device})")
