"""Per-example transforms for datasets (DeZero's names): Compose, Normalize, Flatten, AsType,
ToFloat, ToInt on arrays; Convert, Resize, CenterCrop, ToArray, ToPIL on PIL images (Pillow is
imported when one of them first runs); RandomHorizontalFlip on either. Those that give an array
take one host (NumPy) array and return a new one, never a view of the dataset's row, so that a
transform after them may work in place (x += noise) as in DeZero: a dataset applies them in
`__getitem__`, before a DataLoader stacks the examples and moves the batch to its device."""
import math
import sys

import numpy as np

from .functions.conv import pair

__all__ = ["Compose", "Normalize", "Flatten", "AsType", "ToFloat", "ToInt", "Convert", "Resize",
           "CenterCrop", "ToArray", "ToPIL", "RandomHorizontalFlip"]


def _check_callable(owner, f, what="a transform"):
    """Refuse `f` where a transform belongs: not callable, or a transform class (the
    parentheses forgotten), which would turn each example into a transform object. Classes
    called as conversions (int, np.float32) are callable and pass."""
    if isinstance(f, type) and any("__call__" in vars(c) for c in f.__mro__):
        raise TypeError(f"{owner}: {what} must be a transform object or a function, got the "
                        f"class {f.__name__}; did you mean {f.__name__}()?")
    if not callable(f):
        raise TypeError(f"{owner}: {what} must be callable (a function or a transform "
                        f"object), got {type(f).__name__}")


# (source dtype, integer dtype) -> the integer dtype's (min, max), or None where every value
# of the source fits: looked up once per pair, as the check runs on every example
_BOUNDS = {}


def _unfit_integers(x, dtype):
    """Why casting the host array `x` to the integer dtype `dtype` would wrap some of its values
    (300.0 into uint8 gives 44, 1000 gives 232; NaN gives anything), naming the first such value;
    None when every value fits (fractions are cut toward zero, as astype cuts them)."""
    if x.dtype.kind not in "biuf" or x.size == 0:
        return None
    key = (x.dtype, dtype)
    if key not in _BOUNDS:
        info = np.iinfo(dtype)
        _BOUNDS[key] = None if np.can_cast(x.dtype, dtype, "safe") else (info.min, info.max)
    bounds = _BOUNDS[key]
    if bounds is None:
        return None  # a widening cast: every value fits
    low, high = bounds
    if x.size == 1:  # one label: no reductions
        lo = hi = x.item()
    else:
        lo, hi = x.min(), x.max()  # a NaN comes out of either, and fails the test below
    if x.dtype.kind == "f":
        lo, hi = float(lo), float(hi)
        if (math.isfinite(lo) and math.isfinite(hi) and low <= math.trunc(lo)
                and math.trunc(hi) <= high):
            return None
        cut = np.trunc(x.astype(np.float64))
        unfit = ~((cut >= low) & (cut < high + 1))  # bounds exact in float64; NaN unfit
    else:
        if low <= int(lo) and int(hi) <= high:
            return None
        unfit = (x < low) | (x > high)
    count = int(np.count_nonzero(unfit))
    value = x[unfit].flat[0]
    more = f" (and {count - 1} more)" if count > 1 else ""
    never = "; NaN and infinities fit no integer dtype" if not np.isfinite(value) else ""
    return (f"{x.dtype} value {value}{more} does not fit {np.dtype(dtype).name} ({low} to "
            f"{high}){never}")


class Compose:
    """Apply `transforms` one after the other: Compose([Flatten(), ToFloat()])(x)."""

    def __init__(self, transforms=()):
        if transforms is None:  # DeZero's Compose(None) gives each example back as it is
            transforms = ()
        if callable(transforms) or not hasattr(transforms, "__iter__"):
            raise TypeError(f"Compose: transforms must be a list of callables "
                            f"(Compose([Flatten(), ToFloat()])), got {type(transforms).__name__}; "
                            "put a single transform in a list, or use it without Compose")
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
        x = _array("Normalize", x)
        if x.dtype.kind == "c":  # the cast to float64 would keep the real part, warning only
            raise TypeError(f"Normalize: got {x.dtype} values, and would drop their imaginary "
                            "part; take x.real or abs(x) first (Compose([np.abs, ...]))")
        dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
        mean = self._per_channel("mean", self.mean, x).astype(dtype)
        std = self._per_channel("std", self.std, x).astype(dtype)
        return ((x - mean) / std).astype(dtype, copy=False)

    def __repr__(self):
        return f"Normalize(mean={self.mean.tolist()!r}, std={self.std.tolist()!r})"


class Flatten:
    """The example as a new 1-d array (C, H, W) -> (C*H*W,)."""

    def __call__(self, x):
        return _array("Flatten", x).flatten()  # a copy even where a view would do (module note)

    def __repr__(self):
        return "Flatten()"


class AsType:
    """The example cast to `dtype` (float32 by default), as a new array even when it has that
    dtype already. To an integer dtype, fractions are cut toward zero (1.7 -> 1), and a value
    the dtype cannot hold (300 for uint8, NaN) raises ValueError instead of wrapping. Complex
    input to an integer or float dtype raises TypeError: the cast would drop its imaginary
    part."""

    def __init__(self, dtype=np.float32):
        self.dtype = np.dtype(dtype)

    def __call__(self, x):
        x = _array(type(self).__name__, x)
        if x.dtype.kind == "c" and self.dtype.kind in "iuf":
            # NumPy keeps the real part with only a ComplexWarning; _unfit_integers's bounds
            # would not see the imaginary part either
            raise TypeError(f"{type(self).__name__}: cannot cast {x.dtype} to {self.dtype.name} "
                            "without dropping the imaginary part; take x.real or abs(x) first "
                            "(Compose([np.abs, ...]))")
        if self.dtype.kind in "iu":
            problem = _unfit_integers(x, self.dtype)
            if problem is not None:
                raise ValueError(f"{type(self).__name__}: {problem}, and a cast would wrap it; "
                                 "clip or rescale the values first, or cast to a dtype that "
                                 "holds them")
        return x.astype(self.dtype)  # a copy even when the dtype is already right

    def __repr__(self):
        return f"{type(self).__name__}({self.dtype.name})"


ToFloat = AsType


class ToInt(AsType):
    """The example cast to an integer dtype (int64 by default), fractions cut toward zero; a
    value the dtype cannot hold raises ValueError (see AsType)."""

    def __init__(self, dtype=np.int64):
        super().__init__(dtype)
        if not np.issubdtype(self.dtype, np.integer):
            raise ValueError(f"ToInt: dtype must be an integer dtype, got {self.dtype.name}; "
                             "use AsType for other dtypes")


# =============================================================================== PIL images
def _pil():
    """PIL.Image, imported here: Pillow is needed only by the image transforms."""
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("gradcore.transforms: Convert, Resize, CenterCrop, ToArray and ToPIL "
                          "work on PIL images, and Pillow is not installed: pip install "
                          "pillow") from None
    return Image


def first_image(values):
    """The first PIL image among `values`, or None (also where Pillow is not imported yet: then
    no image can exist). np.asarray makes one an (H, W, C) array of raw pixels (a palette
    image's indices, not its colours), channels last, with no error."""
    image = getattr(sys.modules.get("PIL.Image"), "Image", None)
    return None if image is None else next((v for v in values if isinstance(v, image)), None)


def _array(owner, x):
    """x as a NumPy array; a PIL image refused (see first_image)."""
    img = first_image(x if isinstance(x, (list, tuple)) else (x,))  # [img, img] too
    if img is not None:
        raise TypeError(f"{owner}: got a PIL image (mode {img.mode}, {img.width}x"
                        f"{img.height}){'' if img is x else ' in a list'}; put ToArray() "
                        "before it, which makes it a (C, H, W) array")
    return np.asarray(x)


def _image(owner, img):
    """img, refused unless it is a PIL image (importing Pillow)."""
    if not isinstance(img, _pil().Image):
        hint = "; put ToPIL() before it to make one of an array" \
            if isinstance(img, np.ndarray) else ""
        raise TypeError(f"{owner}: expected a PIL image, got {type(img).__name__}{hint}")
    return img


def _is_image(img):
    """Whether img is a PIL image; without Pillow nothing is."""
    try:
        return isinstance(img, _pil().Image)
    except ImportError:
        return False


def _is_mode(mode):
    """Whether PIL knows the image mode `mode`; any mode passes without Pillow (the first image
    then says to install it)."""
    try:
        from PIL import ImageMode
    except ImportError:
        return True
    try:
        ImageMode.getmode(mode)
    except (KeyError, TypeError):
        return False
    return True


def _size(owner, size):
    """`size` (an int, or a pair (width, height)) as a pair of positive ints."""
    try:
        width, height = pair(size)
    except ValueError:
        width = height = 0
    if width < 1 or height < 1:
        raise ValueError(f"{owner}: size must be a positive int or a pair (width, height) of "
                         f"them, got {size!r}")
    return width, height


class Convert:
    """The image in PIL mode `mode` ("RGB", "L", ...); "BGR" gives an RGB image whose red and
    blue channels are swapped (as Caffe's VGG16 weights expect)."""

    def __init__(self, mode="RGB"):
        if mode != "BGR" and not _is_mode(mode):
            raise ValueError(f"Convert: unknown mode {mode!r}; use one of PIL's modes ('RGB', "
                             "'RGBA', 'L', 'LA', '1', 'I', 'F', 'CMYK', ...; case matters) or "
                             "'BGR'")
        self.mode = mode

    def __call__(self, img):
        Image = _pil()
        _image("Convert", img)
        if self.mode == "BGR":
            r, g, b = img.convert("RGB").split()
            return Image.merge("RGB", (b, g, r))
        return img.convert(self.mode)

    def __repr__(self):
        return f"Convert({self.mode!r})"


class Resize:
    """The image resized to `size`: an int (a square) or a pair (width, height), as PIL's
    sizes are. `mode`: a PIL filter (Image.NEAREST, ...); None is Image.BILINEAR, DeZero's."""

    def __init__(self, size, mode=None):
        self.size = _size("Resize", size)
        self.mode = mode

    def __call__(self, img):
        _image("Resize", img)
        mode = _pil().BILINEAR if self.mode is None else self.mode
        return img.resize(self.size, mode)

    def __repr__(self):
        return f"Resize({self.size!r}, mode={self.mode!r})"


class CenterCrop:
    """The middle `size` of the image: an int (a square) or a pair (width, height); where the
    margins cannot be equal, the right and bottom ones are the larger by a pixel. A size larger
    than the image pads it with black (PIL's crop)."""

    def __init__(self, size):
        self.size = _size("CenterCrop", size)

    def __call__(self, img):
        width, height = _image("CenterCrop", img).size
        left, top = (width - self.size[0]) // 2, (height - self.size[1]) // 2
        return img.crop((left, top, left + self.size[0], top + self.size[1]))

    def __repr__(self):
        return f"CenterCrop({self.size!r})"


class ToArray:
    """A PIL image as an array (C, H, W) of `dtype` (float32 by default), the pixel values
    unscaled (0 to 255 for 8-bit images); a grey image gives one channel. A palette image ("P",
    "PA") gives its colours: it is converted to RGB (RGBA) first. An integer `dtype` that cannot
    hold a pixel value (uint8 for a 16-bit image's 1000) raises ValueError. An array is given
    back as it is (a copy)."""

    def __init__(self, dtype=np.float32):
        self.dtype = np.dtype(dtype)

    def __call__(self, img):
        if isinstance(img, np.ndarray):
            return img.copy()
        if not isinstance(img, _pil().Image):
            raise TypeError(f"ToArray: expected a PIL image or a NumPy array, got "
                            f"{type(img).__name__}")
        if img.mode in ("P", "PA"):  # its pixels are indices into the palette, not colours
            img = img.convert("RGB" if img.mode == "P" else "RGBA")
        x = np.asarray(img)
        if self.dtype.kind in "iu":
            problem = _unfit_integers(x, self.dtype)
            if problem is not None:
                raise ValueError(f"ToArray: the {img.mode} image's {problem}: ToArray does not "
                                 "rescale pixel values; pass a dtype that holds them (ToArray() "
                                 "gives float32) and scale after it (Normalize)")
        x = x[None] if x.ndim == 2 else x.transpose(2, 0, 1)  # (H, W, C) -> (C, H, W)
        return x.astype(self.dtype)

    def __repr__(self):
        return f"ToArray({self.dtype.name})"


class ToPIL:
    """An array (C, H, W) (or (H, W)) as a PIL image: uint8 with 3 channels is RGB, 4 RGBA,
    1 a grey image. A float array is refused, grey too: PIL would keep its values unscaled (a
    mode "F" image, which Convert("L") turns black for values in [0, 1]). Other integer grey
    images keep their values (int8, int16, int32 and uint32 as mode "I", 32-bit signed; uint16
    as "I;16"); a uint32 value above 2**31 - 1, which mode "I" cannot hold, raises ValueError."""

    def __call__(self, x):
        x = np.asarray(x)
        shape, dtype = x.shape, x.dtype  # as passed, for the errors
        if dtype.kind == "f":
            raise TypeError(
                f"ToPIL: got a {x.dtype} array of shape {shape}; PIL images hold integer pixels "
                "(uint8, 0 to 255). For floats in [0, 1] (what the data sets' default transforms "
                "give), put ToPIL() first, on the uint8 images (transform=Compose([ToPIL(), ..., "
                "ToArray(), Normalize(0, 255)])), or scale them to 0..255 and round before the "
                "cast: Compose([lambda x: np.rint(x * 255).astype(np.uint8), ToPIL()])")
        if x.ndim == 3:
            x = x[0] if x.shape[0] == 1 else x.transpose(1, 2, 0)  # (C, H, W) -> (H, W, C)
        # grey images only: PIL has no mode for several channels of these, and says so below
        if x.ndim == 2 and dtype.kind == "i" and dtype.itemsize == 1:
            # PIL reads int8 as unsigned bytes into mode I (-1 -> 255): int32 is mode I's own
            x = x.astype(np.int32)
        elif x.ndim == 2 and dtype.kind == "u" and dtype.itemsize == 4:  # 2**32 - 1 gave -1
            problem = _unfit_integers(x, np.int32)
            if problem is not None:
                raise ValueError(f"ToPIL: {problem}, the range of PIL's mode I (32-bit signed "
                                 "pixels), and PIL would wrap it; clip or rescale the values "
                                 "first (for an 8-bit image, to 0..255 and AsType(np.uint8))")
            x = x.astype(np.int32)
        try:
            return _pil().fromarray(x)
        except (TypeError, ValueError) as e:
            raise TypeError(f"ToPIL: PIL cannot make an image of a {dtype} array of shape "
                            f"{shape} ({e}); colour images are uint8 arrays (C, H, W): cast "
                            "with AsType(np.uint8) first (it refuses values outside 0 to "
                            "255)") from None

    def __repr__(self):
        return "ToPIL()"


class RandomHorizontalFlip:
    """The image (PIL) or array (..., H, W) mirrored left to right with probability `p`. Draws
    from NumPy's global generator, as DataLoader's shuffle: np.random.seed(n) (or
    gradcore.manual_seed(n)) repeats the flips."""

    def __init__(self, p=0.5):
        if isinstance(p, bool) or not (isinstance(p, (int, float, np.integer, np.floating))
                                       and 0 <= p <= 1):
            raise ValueError(f"RandomHorizontalFlip: p must be a probability in [0, 1], "
                             f"got {p!r}")
        self.p = float(p)

    def __call__(self, img):
        # checked before the draw: a wrong input fails at once, not at the first flip
        if isinstance(img, np.ndarray):
            return img[..., ::-1].copy() if np.random.random() < self.p else img.copy()
        if not _is_image(img):
            raise TypeError(f"RandomHorizontalFlip: expected a PIL image or a NumPy array, got "
                            f"{type(img).__name__}")
        return img.transpose(_pil().FLIP_LEFT_RIGHT) if np.random.random() < self.p else img

    def __repr__(self):
        return f"RandomHorizontalFlip(p={self.p})"
