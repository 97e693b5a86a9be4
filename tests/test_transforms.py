"""gradcore.transforms: per-example transforms on host arrays."""
import re
import sys

import numpy as np
import pytest

from gradcore.transforms import (AsType, CenterCrop, Compose, Convert, Flatten, Normalize,
                                 RandomHorizontalFlip, Resize, ToArray, ToFloat, ToInt, ToPIL)


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


def test_integer_casts_refuse_values_the_dtype_cannot_hold_instead_of_wrapping():
    # NumPy's cast would give [44, 255] and [0, 232, 255, 0]
    with pytest.raises(ValueError, match=r"^ToInt: float32 value 300.0 \(and 1 more\) does not "
                                         r"fit uint8 \(0 to 255\), and a cast would wrap it; clip "
                                         r"or rescale the values first, or cast to a dtype that "
                                         r"holds them$"):
        ToInt(np.uint8)(np.float32([300.0, -1.0]))
    with pytest.raises(ValueError, match=r"^AsType: int64 value 1000 \(and 1 more\) does not fit "
                                         r"uint8 \(0 to 255\)"):
        AsType(np.uint8)(np.array([0, 1000, 65535, 255]))
    with pytest.raises(ValueError, match=r"float64 value nan does not fit int64 "
                                         r"\(-9223372036854775808 to 9223372036854775807\); NaN "
                                         r"and infinities fit no integer dtype"):
        ToInt()(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match=r"value 9.223372036854776e\+18 does not fit int64"):
        ToInt()(np.array([2.0 ** 63]))  # one past int64's largest: float64 rounds the bound up
    with pytest.raises(ValueError, match=r"int16 value -1 does not fit uint16"):
        ToInt(np.uint16)(np.array([-1, 5], np.int16))
    # what fits once the fraction is cut passes, as the cast gives it; widening casts too
    assert ToInt(np.uint8)(np.array([-0.5, 255.9])).tolist() == [0, 255]
    assert ToInt(np.int8)(np.array([-128.0, 127.0])).tolist() == [-128, 127]
    assert ToInt()(np.array([-(2.0 ** 63)])).tolist() == [-(2 ** 63)]
    assert ToInt(np.int16)(np.array([255], np.uint8)).dtype == np.int16
    assert AsType(np.uint8)(np.array([], np.float32)).shape == (0,)


def test_casts_of_complex_values_to_real_dtypes_refuse_to_drop_the_imaginary_part():
    # NumPy's cast keeps the real part with a ComplexWarning: [1+5j] gave [1], [300+0j] as uint8
    # wrapped to [44], past the bounds check, which skipped complex input
    for cast, x in ((ToInt(), [1 + 5j]), (AsType(np.uint8), [300 + 0j]),
                    (ToInt(np.int8), np.array([1 + 1j], np.complex64)), (ToFloat(), [0.5 + 2j]),
                    (AsType(np.float64), [1 + 0j])):
        x = np.asarray(x)
        with pytest.raises(TypeError, match=rf"^{type(cast).__name__}: cannot cast {x.dtype} to "
                                            rf"{cast.dtype.name} without dropping the imaginary "
                                            r"part; take x.real or abs\(x\) first "
                                            r"\(Compose\(\[np.abs, \.\.\.\]\)\)$"):
            cast(x)
    assert Compose([np.abs, ToInt(np.uint8)])(np.array([3 + 4j])).tolist() == [5]
    assert AsType(np.complex64)(np.array([1 + 5j])).tolist() == [1 + 5j]
    assert AsType(bool)(np.array([0j, 1j])).tolist() == [False, True]
    with pytest.raises(TypeError, match=r"^Normalize: got complex128 values, and would drop "
                                        r"their imaginary part"):  # [0, 1] for [1j, 1-2j]
        Normalize(0.0, 1.0)(np.array([1j, 1 - 2j]))


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


# =============================================================================== Compose
def test_compose_of_none_gives_the_example_back():
    x = np.arange(6.0).reshape(2, 3)
    assert Compose(None)(x) is x  # as DeZero's Compose with no transforms


@pytest.mark.parametrize("transforms", [Flatten(), 3], ids=["one transform", "an int"])
def test_compose_of_something_not_a_list_says_what_it_takes(transforms):
    with pytest.raises(TypeError, match=r"Compose: transforms must be a list of callables .*got "
                                        rf"{type(transforms).__name__}"):
        Compose(transforms)


# =============================================================================== PIL images
def test_a_transform_class_without_parentheses_is_refused():
    for cls in (Normalize, ToFloat, Flatten):
        with pytest.raises(TypeError, match=rf"^Compose: a transform must be a transform object "
                                            rf"or a function, got the class {cls.__name__}; did "
                                            rf"you mean {cls.__name__}\(\)\?$"):
            Compose([Flatten(), cls])
    # classes called as conversions make no transform object of the example: they pass
    assert Compose([np.float32, float])(np.array(2)) == 2.0


Image = pytest.importorskip("PIL.Image")  # Pillow comes with matplotlib; gradcore needs neither


def rgb(width, height):
    """An RGB image whose pixel (row r, column c) is (10 r + c, 100 + c, 200 - r)."""
    r, c = np.mgrid[:height, :width]
    return Image.fromarray(np.stack([10 * r + c, 100 + c, 200 - r], axis=-1).astype(np.uint8))


def test_to_array_gives_channels_first_unscaled_float32():
    x = ToArray()(rgb(3, 2))
    assert x.shape == (3, 2, 3) and x.dtype == np.float32
    np.testing.assert_array_equal(x[0], [[0, 1, 2], [10, 11, 12]])
    np.testing.assert_array_equal(x[1], [[100, 101, 102], [100, 101, 102]])
    np.testing.assert_array_equal(x[2], [[200, 200, 200], [199, 199, 199]])
    grey = ToArray(np.uint8)(Image.fromarray(np.array([[1, 2], [3, 4]], np.uint8)))
    assert grey.dtype == np.uint8 and grey.tolist() == [[[1, 2], [3, 4]]]
    row = np.ones((1, 2, 2))
    assert ToArray()(row).tolist() == row.tolist() and not np.shares_memory(ToArray()(row), row)
    with pytest.raises(TypeError, match="ToArray: expected a PIL image or a NumPy array, got list"):
        ToArray()([[1, 2]])


def test_to_array_gives_a_palette_images_colours():
    colours = np.array([[[255, 0, 0], [0, 255, 0]], [[0, 0, 255], [255, 0, 0]]], np.uint8)
    palette = Image.fromarray(colours).convert("P", palette=Image.Palette.ADAPTIVE, colors=4)
    assert palette.mode == "P"
    x = ToArray()(palette)
    assert x.shape == (3, 2, 2) and x.dtype == np.float32
    np.testing.assert_array_equal(x[0], [[255, 0], [0, 255]])  # red
    np.testing.assert_array_equal(x[1], [[0, 255], [0, 0]])  # green
    np.testing.assert_array_equal(x[2], [[0, 0], [255, 0]])  # blue
    with_alpha = palette.convert("PA")
    with_alpha.putalpha(Image.fromarray(np.array([[10, 20], [30, 40]], np.uint8)))
    assert with_alpha.mode == "PA"
    y = ToArray(np.uint8)(with_alpha)
    assert y.shape == (4, 2, 2)
    np.testing.assert_array_equal(y[:3], x)
    np.testing.assert_array_equal(y[3], [[10, 20], [30, 40]])


def test_to_pil_takes_channels_first_arrays():
    img = ToPIL()(np.array([[[0, 1]], [[2, 3]], [[4, 5]]], np.uint8))  # (3, 1, 2)
    assert img.mode == "RGB" and img.size == (2, 1)
    assert img.getpixel((0, 0)) == (0, 2, 4) and img.getpixel((1, 0)) == (1, 3, 5)
    grey = ToPIL()(np.array([[[7, 8]]], np.uint8))  # one channel
    assert grey.mode == "L" and np.asarray(grey).tolist() == [[7, 8]]
    assert ToPIL()(ToArray(np.uint8)(rgb(3, 2))).tobytes() == rgb(3, 2).tobytes()
    with pytest.raises(TypeError, match=r"^ToPIL: PIL cannot make an image of a int64 array of "
                                        r"shape \(3, 1, 2\) .*cast with AsType\(np.uint8\) first "
                                        r"\(it refuses values outside 0 to 255\)$"):
        ToPIL()(np.zeros((3, 1, 2), np.int64))


def test_to_pil_keeps_every_integer_grey_value_or_refuses():
    # PIL reads int8 as unsigned bytes: -1 became 255 and -128 became 128; a uint32 value
    # above 2**31 - 1 wrapped in mode I (2**32 - 1 became -1)
    img = ToPIL()(np.array([[[-1, 5, -128, 127]]], np.int8))
    assert img.mode == "I" and np.asarray(img).tolist() == [[-1, 5, -128, 127]]
    assert ToArray(np.int64)(img).tolist() == [[[-1, 5, -128, 127]]]
    img = ToPIL()(np.array([[0, 2 ** 31 - 1]], np.uint32))
    assert img.mode == "I" and np.asarray(img).tolist() == [[0, 2 ** 31 - 1]]
    with pytest.raises(ValueError, match=r"^ToPIL: uint32 value 4294967295 \(and 1 more\) does "
                                         r"not fit int32 \(-2147483648 to 2147483647\), the "
                                         r"range of PIL's mode I \(32-bit signed pixels\), and "
                                         r"PIL would wrap it; clip or rescale the values first "
                                         r"\(for an 8-bit image, to 0\.\.255 and "
                                         r"AsType\(np.uint8\)\)$"):
        ToPIL()(np.array([[5, 2 ** 32 - 1, 2 ** 31]], np.uint32))
    for dtype, mode in ((np.int16, "I"), (np.uint16, "I;16"), (np.int32, "I")):  # as they were
        info = np.iinfo(dtype)
        img = ToPIL()(np.array([[info.min, info.max]], dtype))
        assert img.mode == mode and np.asarray(img).tolist() == [[info.min, info.max]]
    with pytest.raises(TypeError, match=r"^ToPIL: PIL cannot make an image of a int8 array of "
                                        r"shape \(3, 1, 2\) "):
        ToPIL()(np.zeros((3, 1, 2), np.int8))  # several channels: no PIL mode


@pytest.mark.parametrize("shape", [(3, 4, 4), (1, 4, 4), (4, 4)], ids=["colour", "grey", "2-d"])
def test_to_pil_refuses_floats_saying_how_to_make_pixels_of_them(shape):
    from gradcore.datasets import CIFAR10
    x = np.random.default_rng(0).integers(0, 256, shape).astype(np.uint8)
    scaled = CIFAR10.default_transform()(x)  # float32 in [0, 1]
    # AsType(np.uint8) of it, the old advice, gives a black image; a grey one became mode "F",
    # which Convert("L") turned black too
    with pytest.raises(TypeError, match=rf"^ToPIL: got a float32 array of shape "
                                        rf"{re.escape(str(shape))}; PIL images hold integer "
                                        r"pixels \(uint8, 0 to 255\). For floats in \[0, 1\] "
                                        r"\(what the data sets' default transforms give\), put "
                                        r"ToPIL\(\) first, on the uint8 images "
                                        r"\(transform=Compose\(\[ToPIL\(\), \.\.\., ToArray\(\), "
                                        r"Normalize\(0, 255\)\]\)\), or scale them to 0\.\.255 and "
                                        r"round before the cast: Compose\(\[lambda x: "
                                        r"np\.rint\(x \* 255\)\.astype\(np\.uint8\), "
                                        r"ToPIL\(\)\]\)$"):
        ToPIL()(scaled)
    # either way it says gives the image back
    image = Compose([lambda x: np.rint(x * 255).astype(np.uint8), ToPIL()])(scaled)
    pixels = x if x.ndim == 2 else x[0] if len(x) == 1 else np.moveaxis(x, 0, -1)  # PIL's
    assert image.mode == ("RGB" if len(shape) == 3 and shape[0] == 3 else "L")
    assert np.asarray(image).tolist() == pixels.tolist()
    if x.ndim == 3:
        first = Compose([ToPIL(), ToArray(), Normalize(0, 255)])(x)
        assert first.dtype == np.float32 and np.array_equal(first, scaled)


def test_to_array_refuses_an_integer_dtype_that_cannot_hold_the_pixels():
    deep = Image.fromarray(np.array([[0, 1000, 65535]], np.uint16))  # a 16-bit grey image
    with pytest.raises(ValueError, match=r"^ToArray: the I;16 image's uint16 value 1000 \(and 1 "
                                         r"more\) does not fit uint8 \(0 to 255\): ToArray does "
                                         r"not rescale pixel values; pass a dtype that holds them "
                                         r"\(ToArray\(\) gives float32\) and scale after it "
                                         r"\(Normalize\)$"):
        ToArray(np.uint8)(deep)  # NumPy's cast would give [0, 232, 255]
    assert ToArray(np.int32)(deep).tolist() == [[[0, 1000, 65535]]]
    assert ToArray()(deep).tolist() == [[[0.0, 1000.0, 65535.0]]]
    assert ToArray(np.uint8)(rgb(2, 1)).tolist() == [[[0, 1]], [[100, 101]], [[200, 200]]]


def test_convert_to_a_mode_and_to_bgr():
    img = rgb(2, 1)
    assert Convert("L")(img).mode == "L"
    grey = Image.fromarray(np.array([[9, 10]], np.uint8))
    assert Convert()(grey).mode == "RGB" and Convert()(grey).getpixel((1, 0)) == (10, 10, 10)
    bgr = Convert("BGR")(img)
    assert bgr.mode == "RGB" and bgr.getpixel((1, 0)) == (200, 101, 1)  # red and blue swapped


def test_resize_to_width_and_height_bilinear_by_default():
    line = Image.fromarray(np.array([[0, 255]], np.uint8))
    # the centres of 4 pixels fall at -0.25, 0.25, 0.75, 1.25 of the old ones: interpolated
    # linearly between 0 and 255, held at the ends (PIL's own default, bicubic, gives 53 and 202)
    assert np.asarray(Resize((4, 1))(line)).tolist() == [[0, 64, 191, 255]]
    square = Resize(2, mode=Image.NEAREST)(rgb(4, 4))
    assert square.size == (2, 2)
    # each new pixel's centre falls at old pixel 1 or 3 (from the left and from the top)
    np.testing.assert_array_equal(ToArray()(square)[0], [[11, 13], [31, 33]])
    with pytest.raises(ValueError, match=r"Resize: size must be a positive int or a pair "
                                         r"\(width, height\) of them, got \(0, 3\)"):
        Resize((0, 3))


def test_center_crop_takes_the_middle():
    x = ToArray()(CenterCrop((2, 1))(rgb(5, 4)))  # margins 1 left, 2 right; 1 top, 2 bottom
    assert x.shape == (3, 1, 2)
    np.testing.assert_array_equal(x[0], [[11, 12]])
    assert ToArray()(CenterCrop(2)(rgb(4, 4)))[0].tolist() == [[11, 12], [21, 22]]


def test_random_horizontal_flip_draws_from_numpy_global_generator():
    x = np.arange(12).reshape(1, 2, 6)
    np.random.seed(0)
    flips = np.random.random(8) < 0.5  # the draws the transform will see after the same seed
    np.random.seed(0)
    f = RandomHorizontalFlip()
    out = [f(x) for _ in range(8)]
    assert flips.any() and not flips.all()
    for y, flipped in zip(out, flips):
        np.testing.assert_array_equal(y, x[..., ::-1] if flipped else x)
        assert not np.shares_memory(y, x)
    assert ToArray()(RandomHorizontalFlip(p=1.0)(rgb(3, 1)))[0].tolist() == [[2, 1, 0]]
    assert RandomHorizontalFlip(p=0)(rgb(3, 1)).tobytes() == rgb(3, 1).tobytes()
    with pytest.raises(ValueError, match="RandomHorizontalFlip: p must be a probability"):
        RandomHorizontalFlip(p=1.5)


def test_image_transforms_refuse_what_is_not_an_image_naming_themselves():
    array = np.zeros((3, 8, 8), np.float32)
    for t in (Resize(4), CenterCrop(4), Convert("L"), Convert("BGR"), Compose([ToArray(),
                                                                                Resize(4)])):
        name = type(t.transforms[-1] if isinstance(t, Compose) else t).__name__
        with pytest.raises(TypeError, match=rf"^{name}: expected a PIL image, got ndarray; put "
                                            r"ToPIL\(\) before it to make one of an array$"):
            t(array)
    with pytest.raises(TypeError, match=r"^CenterCrop: expected a PIL image, got list$"):
        CenterCrop(2)([[1, 2]])


def test_convert_refuses_a_mode_pil_does_not_know():
    for mode in ("rgb", "RBG", "", None):
        with pytest.raises(ValueError, match=rf"^Convert: unknown mode {mode!r}; use one of "
                                             r"PIL's modes \('RGB', .*case matters\) or 'BGR'$"):
            Convert(mode)
    assert Convert("LA")(rgb(2, 1)).mode == "LA"  # a mode beyond the first few named


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_random_horizontal_flip_refuses_what_is_neither_image_nor_array(p):
    for value in ([1.0, 2.0, 3.0], (1.0, 2.0), np.float32(1.0)):
        with pytest.raises(TypeError, match=rf"^RandomHorizontalFlip: expected a PIL image or a "
                                            rf"NumPy array, got {type(value).__name__}$"):
            RandomHorizontalFlip(p)(value)


def test_image_transforms_say_to_install_pillow_when_it_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)  # as if Pillow were not installed
    with pytest.raises(ImportError, match="Pillow is not installed: pip install pillow"):
        Resize(2)(object())
    convert = Convert("RGB")  # made without Pillow; its first image says to install it
    with pytest.raises(ImportError, match="Pillow is not installed"):
        convert(object())
    # no Pillow, so no PIL image: a list is the wrong input, not a missing package
    with pytest.raises(TypeError, match="RandomHorizontalFlip: expected a PIL image or a NumPy "
                                        "array, got list"):
        RandomHorizontalFlip(1.0)([1.0])
    assert RandomHorizontalFlip(1.0)(np.arange(3)).tolist() == [2, 1, 0]


def test_array_transforms_refuse_a_pil_image():
    """ToFloat, Normalize, Flatten... made a PIL image (H, W, C) raw pixels, a palette image's
    indices (15 for its colours 0 and 255), which a batch stacked channels last."""
    palette = Image.new("P", (6, 4), 15)
    for transform in (ToFloat(), ToInt(), AsType(np.float64), Normalize(0.0, 255.0), Flatten()):
        name = type(transform).__name__
        for img in (Image.new("RGB", (6, 4), (255, 0, 0)), palette):
            with pytest.raises(TypeError, match=rf"^{name}: got a PIL image \(mode {img.mode}, "
                                                r"6x4\); put ToArray\(\) before it"):
                transform(img)
        with pytest.raises(TypeError, match=rf"^{name}: got a PIL image \(mode P, 6x4\) in a "
                                            r"list; put ToArray"):
            transform([palette, palette])
    assert Compose([ToArray(), Normalize(0.0, 255.0)])(Image.new("L", (6, 4), 255)).shape == (
        1, 4, 6)
