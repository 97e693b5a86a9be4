"""gradcore.transforms: per-example transforms on host arrays."""
import numpy as np
import pytest

from gradcore.transforms import AsType, Compose, Flatten, Normalize, ToFloat, ToInt


def test_compose_flatten_tofloat_normalize():
    image = np.arange(12, dtype=np.uint8).reshape(1, 3, 4)
    f = Compose([Flatten(), ToFloat(), Normalize(0.0, 255.0)])
    y = f(image)
    assert y.shape == (12,) and y.dtype == np.float32
    np.testing.assert_allclose(y, np.arange(12) / 255.0, rtol=1e-6)
    assert Compose()(image) is image


def test_normalize_per_channel():
    x = np.ones((2, 2, 2), dtype=np.float32)
    x[1] *= 3
    y = Normalize(mean=[1.0, 1.0], std=[1.0, 2.0])(x)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y[0], 0.0)
    np.testing.assert_array_equal(y[1], 1.0)
    assert Normalize(1, 2)(np.array([5])).tolist() == [2.0]  # integers become float64
    with pytest.raises(ValueError, match=r"Normalize: 3 mean values \(one per channel\) but the "
                                         r"example has shape \(2, 2, 2\)"):
        Normalize(mean=[0, 0, 0])(x)


def test_normalize_and_casts_refuse_bad_arguments():
    with pytest.raises(ValueError, match="Normalize: std must be non-zero"):
        Normalize(0.0, [1.0, 0.0])
    with pytest.raises(ValueError, match="Normalize: mean must be a finite number"):
        Normalize(float("nan"))
    with pytest.raises(ValueError, match="ToInt: dtype must be an integer dtype, got float32"):
        ToInt(np.float32)
    with pytest.raises(TypeError, match="Compose: a transform must be callable"):
        Compose([Flatten(), 3])


def test_astype_and_toint():
    assert AsType(np.float64)(np.ones(2, np.float32)).dtype == np.float64
    assert ToFloat is AsType and ToFloat()(np.ones(2, np.int64)).dtype == np.float32
    assert ToInt()(np.array([1.7, 2.2])).tolist() == [1, 2]


def jitter(x):
    """An augmentation that works in place, as DeZero's transforms allow after a cast."""
    x += 0.5
    return x


@pytest.mark.parametrize("first", [ToFloat(), Flatten()], ids=["ToFloat", "Flatten"])
def test_an_in_place_transform_after_a_cast_or_flatten_leaves_the_dataset_alone(first):
    from gradcore.dataloaders import DataLoader
    from gradcore.datasets import Shapes
    ds = Shapes(transform=Compose([first, jitter]), num_per_class=5)  # float32 rows already
    before = ds.data.copy()
    for epoch in range(3):
        batches = list(DataLoader(ds, batch_size=4, shuffle=False))
    np.testing.assert_array_equal(ds.data, before)
    x = np.concatenate([x for x, t in batches])
    np.testing.assert_array_equal(x.reshape(before.shape), before + 0.5)  # one jitter, not three
    row = ds.data[0]
    assert not np.shares_memory(first(row), row)
