"""scatter_dataset: this rank's equal share of a data set."""
import secrets

import numpy

from ..datasets import Dataset, rows_of_arrays

__all__ = ["scatter_dataset", "Share", "IndexedShare"]


class Share(Dataset):
    """Rows `indices` of an in-memory `dataset` (arrays `data` and `label` read by the base
    Dataset.__getitem__), copied, with its transforms: a DataLoader gathers a batch of them
    with one fancy index."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = numpy.asarray(indices, dtype=numpy.int64)
        super().__init__(dataset.train, dataset.transform, dataset.target_transform)

    def prepare(self):
        self.data = self.dataset.data[self.indices]
        label = self.dataset.label
        self.label = None if label is None else label[self.indices]


class IndexedShare(Dataset):
    """Examples `indices` of any `dataset`: share[i] is dataset[indices[i]], read through the
    dataset's own __getitem__ (its transforms, files, augmentation) when asked for."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = numpy.asarray(indices, dtype=numpy.int64)
        super().__init__(getattr(dataset, "train", True))

    def __getitem__(self, index):
        return self.dataset[int(self.indices[index])]

    def __len__(self):
        return len(self.indices)


def scatter_dataset(dataset, comm, shuffle=False, seed=0):
    """This rank's share of `dataset`: `ceil(len / size)` examples on every rank, so that every
    rank takes the same number of steps (a rank with fewer would leave the others waiting in
    the all-reduce). Rank r takes the r-th block of the examples in order (`shuffle`: in an
    order drawn from `seed`, the same on every rank; seed=None: a fresh seed drawn by rank 0
    and sent to the others, so a collective then); when the length does not divide evenly,
    the last shares are made up with examples from the start again, the fewest needed
    (size - len % size of them). Every rank builds `dataset` itself; nothing else is sent.

    share[i] is always dataset[j] for its example j. A Dataset whose examples are rows of the
    arrays `data` and `label` (the base class's __getitem__) gives a Share: its rows copied,
    batched by one fancy index; any other (its own __getitem__, lists) an IndexedShare, which
    reads each example through dataset[j]."""
    n = len(dataset)
    if n == 0:
        raise ValueError("scatter_dataset: the dataset is empty")
    if shuffle and seed is None:
        # each rank's own fresh seed would shuffle differently: some examples on two ranks,
        # others on none
        seed = comm.from_root(lambda: secrets.randbits(32), 0, "scatter_dataset's seed")
    order = numpy.random.RandomState(seed).permutation(n) if shuffle else numpy.arange(n)
    per_rank = -(-n // comm.size)
    padded = order[numpy.arange(per_rank * comm.size) % n]
    mine = padded[comm.rank * per_rank:(comm.rank + 1) * per_rank]
    return Share(dataset, mine) if rows_of_arrays(dataset) else IndexedShare(dataset, mine)
