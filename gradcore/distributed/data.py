"""scatter_dataset: this rank's equal share of a data set."""
import numpy

from ..datasets import Dataset

__all__ = ["scatter_dataset", "Share"]


class Share(Dataset):
    """Examples `indices` of `dataset`, with its transforms."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = numpy.asarray(indices, dtype=numpy.int64)
        super().__init__(getattr(dataset, "train", True), getattr(dataset, "transform", None),
                         getattr(dataset, "target_transform", None))

    def prepare(self):
        data = getattr(self.dataset, "data", None)
        if data is not None:  # in memory: this share's rows, so a DataLoader gathers batches
            self.data = data[self.indices]
            label = getattr(self.dataset, "label", None)
            self.label = None if label is None else label[self.indices]

    def __getitem__(self, index):
        if self.data is not None:
            return super().__getitem__(index)
        return self.dataset[int(self.indices[index])]

    def __len__(self):
        return len(self.indices)


def scatter_dataset(dataset, comm, shuffle=False, seed=0):
    """This rank's share of `dataset`: `ceil(len / size)` examples on every rank, so that every
    rank takes the same number of steps (a rank with fewer would leave the others waiting in
    the all-reduce). Rank r takes the r-th block of the examples in order (`shuffle`: in an
    order drawn from `seed`, the same on every rank); when the length does not divide evenly,
    the last shares are made up with examples from the start again, the fewest needed
    (size - len % size of them). Every rank builds `dataset` itself; nothing is sent."""
    n = len(dataset)
    if n == 0:
        raise ValueError("scatter_dataset: the dataset is empty")
    order = numpy.random.RandomState(seed).permutation(n) if shuffle else numpy.arange(n)
    per_rank = -(-n // comm.size)
    padded = order[numpy.arange(per_rank * comm.size) % n]
    return Share(dataset, padded[comm.rank * per_rank:(comm.rank + 1) * per_rank])
