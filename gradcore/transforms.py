"""Per-example transforms for datasets (DeZero's names): Compose, Normalize, Flatten, AsType,
ToFloat, ToInt. They take one host (NumPy) array and return a new one, never a view of the
dataset's row, so that a transform after them may work in place (x += noise) as in DeZero: a
dataset applies them in `__getitem__`, before a DataLoader stacks the examples and moves the batch
to its device."""
import numpy as np

__all__ = ["Compose", "Normalize", "Flatten", "AsType", "ToFloat", "ToInt"]


def _check_callable(owner, f):
    if not callable(f):
        raise TypeError(f"{owner}: a transform must be callable (a function or a transform "
                        f"object), got {type(f).__name__}")


class Compose:
    """Apply `transforms` one after the other: Compose([Flatten(), ToFloat()])(x)."""

    def __init__(self, transforms=()):
        transforms = list(transforms)
        for f in transforms:
            _check_callable("Compose", f)
        self.transforms = transforms

    def __call__(self, x):
        for f in self.transforms:
            x = f(x)
        return x

    def __repr__(self):
        return f"Compose({self.transforms!r})"


class Normalize:
    """(x - mean) / std. `mean` and `std` are scalars or one value per channel, the channels
    being axis 0 of the example (C, H, W). The result keeps x's dtype when x is floating."""

    def __init__(self, mean=0.0, std=1.0):
        self.mean = self._values("mean", mean)
        self.std = self._values("std", std)
        if np.any(self.std == 0):
            raise ValueError(f"Normalize: std must be non-zero, got {std!r}")

    @staticmethod
    def _values(name, v):
        v = np.asarray(v, dtype=np.float64)
        if v.ndim > 1 or v.size == 0 or not np.all(np.isfinite(v)):
            raise ValueError(f"Normalize: {name} must be a finite number or a flat sequence of "
                             f"them (one per channel), got {v.tolist()!r}")
        return v

    def _per_channel(self, name, v, x):
        """v shaped to broadcast along x's axis 0."""
        if v.ndim == 0 or v.size == 1:
            return v.reshape(())
        if x.ndim == 0 or x.shape[0] != v.size:
            raise ValueError(f"Normalize: {v.size} {name} values (one per channel) but the "
                             f"example has shape {x.shape}; channels are axis 0")
        return v.reshape((v.size,) + (1,) * (x.ndim - 1))

    def __call__(self, x):
        x = np.asarray(x)
        dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
        mean = self._per_channel("mean", self.mean, x).astype(dtype)
        std = self._per_channel("std", self.std, x).astype(dtype)
        return ((x - mean) / std).astype(dtype, copy=False)

    def __repr__(self):
        return f"Normalize(mean={self.mean.tolist()!r}, std={self.std.tolist()!r})"


class Flatten:
    """The example as a new 1-d array (C, H, W) -> (C*H*W,)."""

    def __call__(self, x):
        return np.asarray(x).flatten()  # a copy even when a view would do (see the module note)

    def __repr__(self):
        return "Flatten()"


class AsType:
    """The example cast to `dtype` (float32 by default), as a new array even when it has that
    dtype already."""

    def __init__(self, dtype=np.float32):
        self.dtype = np.dtype(dtype)

    def __call__(self, x):
        return np.asarray(x).astype(self.dtype)  # a copy even when the dtype is already right

    def __repr__(self):
        return f"{type(self).__name__}({self.dtype.name})"


ToFloat = AsType


class ToInt(AsType):
    """The example cast to an integer dtype (int64 by default)."""

    def __init__(self, dtype=np.int64):
        super().__init__(dtype)
        if not np.issubdtype(self.dtype, np.integer):
            raise ValueError(f"ToInt: dtype must be an integer dtype, got {self.dtype.name}; "
                             "use AsType for other dtypes")
