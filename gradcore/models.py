"""Models under DeZero's names (`from gradcore.models import VGG16, ResNet50`), with DeZero's
MLP and Model from gradcore.nn, and DeZero's Sequential (layers l0, l1, ..., not the "0", "1"
of gradcore.nn.Sequential).

VGG16 and the ResNets follow the published architectures (Simonyan & Zisserman 2014; He et al.
2015, with the stride of a bottleneck in its 3x3 convolution, as torchvision's ResNets have it),
so their parameter counts are the published ones: VGG16 138,357,544; ResNet18 11,689,512,
ResNet34 21,797,672, ResNet50 25,557,032, ResNet101 44,549,160, ResNet152 60,192,808; and
SqueezeNet v1.0 and v1.1 (Iandola et al. 2016): 1,248,424 and 1,235,496. They take images
(N, 3, H, W), any H and W of 32 or more (VGG16's and the ResNets' layers size themselves from the
first one; SqueezeNet's are sized at construction). No weights are bundled or downloaded
(DeZero's `pretrained=True` is refused, saying so): `model.load(path)` reads an .npz written by
`model.save` (never a pickle), and `model.load(url, sha256=...)` downloads one first, into the
cache folder.
"""
import numbers

import numpy

from . import functions as F
from . import nn
from .nn import MLP, BatchNorm, Conv2d, Linear, Model, Module
from .nn.layers import _IndexedLayers

__all__ = ["Model", "MLP", "Sequential", "VGG16", "ResNet", "ResNet18", "ResNet34", "ResNet50",
           "ResNet101", "ResNet152", "SqueezeNet"]


class Sequential(_IndexedLayers):
    """DeZero's Sequential: layers (Modules, or callables such as F.relu) called one after
    another, registered as l0, l1, ... as DeZero names them (parameters "l0.W"; a file DeZero's
    save_weights wrote loads), with DeZero's `layers` list (see MLP.layers): forward runs the
    sub-modules l0, l1, ... by index. gradcore.nn.Sequential is PyTorch's, its layers "0", "1".
    """

    _where = "Sequential"

    def __init__(self, *layers):
        super().__init__()
        self.layers = layers

    def forward(self, x):
        for _, layer in self._layer_items():
            x = layer(x)
        return x


def _check_pretrained(pretrained, where):
    """Refuse DeZero's pretrained=True (gradcore fetches no weights: say how to load some), and
    anything but a bool, 0 or None, such as num_classes given where DeZero's signature has
    pretrained. 0 and None are False, as DeZero's `if pretrained:` takes them: neither can be a
    number of classes."""
    if pretrained is None or (isinstance(pretrained, numbers.Integral) and pretrained == 0):
        return
    if not isinstance(pretrained, (bool, numpy.bool_)):
        hint = (f"; pass num_classes by keyword (num_classes={pretrained!r})"
                if isinstance(pretrained, numbers.Integral) and pretrained >= 1 else "")
        raise TypeError(f"{where}: pretrained must be True or False (DeZero's argument order), "
                        f"got {pretrained!r}{hint}")
    if pretrained:
        raise ValueError(
            f"{where}(pretrained=True): gradcore bundles and downloads no weights. Build the "
            "model with pretrained=False, then load an .npz of its parameters: model.load(path) "
            "reads a file model.save wrote, model.load(url, sha256=...) downloads one first "
            "(see Module.load)")


def _bin_averages(n_in, n_out, like):
    """The (n_out, n_in) matrix whose row i averages bin i of adaptive average pooling, from
    floor(i * n_in / n_out) to ceil((i + 1) * n_in / n_out) as PyTorch defines the bins (they
    overlap where n_out does not divide n_in), in the backend, device and dtype of `like`."""
    rows = []
    for i in range(n_out):
        start, end = (i * n_in) // n_out, -(-(i + 1) * n_in // n_out)
        rows.append([1.0 / (end - start) if start <= j < end else 0.0 for j in range(n_in)])
    return like.backend.asarray(rows, dtype=like.dtype, device=like.device)


def _adaptive_average_pooling(x, size):
    """The Variable x (N, C, H, W) averaged to (N, C, size, size) over PyTorch's adaptive bins,
    for any H and W (smaller than `size` too: values are then repeated). A bin is a rectangle
    of rows and columns, so the average is separable: Ph @ x @ Pw.T, two matmuls with constant
    averaging matrices, through which gradients flow."""
    height, width = x.shape[2:]
    if height == width == size:
        return x
    rows, columns = _bin_averages(height, size, x), _bin_averages(width, size, x)
    return F.matmul(F.matmul(rows, x), columns.T)


class VGG16(Module):
    """VGG16: 13 3x3 convolutions (with biases) in 5 stages each ending in 2x2 max pooling,
    the features averaged to 7x7 (adaptive average pooling, as torchvision's), then fully
    connected 4096, 4096 and `num_classes`, with ReLU and dropout (0.5) between. Images
    (N, 3, H, W) of any H, W >= 32 (`VGG16.preprocess` makes one from a picture). The
    convolutions are conv1_1 ... conv5_3; forward calls them by name, so one replaced by
    assignment is the one that runs. `pretrained` is DeZero's: True raises, as no weights are
    downloaded (load some with model.load)."""

    CHANNELS = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))
    # the names of each stage's convolutions, in order
    STAGES = tuple(tuple(f"conv{stage}_{i}" for i in range(1, len(channels) + 1))
                   for stage, channels in enumerate(CHANNELS, 1))

    # the ImageNet mean of each channel, in preprocess's order (B, G, R)
    MEAN_BGR = (103.939, 116.779, 123.68)

    def __init__(self, pretrained=False, *, num_classes=1000):
        _check_pretrained(pretrained, "VGG16")
        super().__init__()
        for names, channels in zip(self.STAGES, self.CHANNELS):
            for name, out in zip(names, channels):
                setattr(self, name, Conv2d(out, kernel_size=3, pad=1))
        # lazy, as the convolutions and DeZero's: the weights are drawn at the first call, in
        # DeZero's order (conv1_1 first), and building the model draws none of its 138M
        self.fc6 = Linear(4096)
        self.fc7 = Linear(4096)
        self.fc8 = Linear(num_classes)

    def forward(self, x):
        shape = tuple(getattr(x, "shape", ()))
        if len(shape) != 4 or min(shape[2:]) < 32:
            raise ValueError(f"VGG16: images must be (N, 3, H, W) with H and W of 32 or more "
                             f"(its five 2x2 poolings halve them to 1x1 at least), got shape "
                             f"{shape}")
        for names in self.STAGES:
            for name in names:
                x = F.relu(getattr(self, name)(x))
            x = F.pooling(x, 2, 2)
        x = _adaptive_average_pooling(x, 7)
        x = F.reshape(x, (x.shape[0], -1))
        x = F.dropout(F.relu(self.fc6(x)))
        x = F.dropout(F.relu(self.fc7(x)))
        return self.fc8(x)

    @staticmethod
    def preprocess(image, size=(224, 224), dtype=numpy.float32):
        """A picture as VGG16 takes it (DeZero's VGG16.preprocess): resized to `size` (width,
        height, as PIL's resize; None keeps its size), its channels turned from RGB to BGR,
        MEAN_BGR subtracted, and laid out (3, H, W) as a NumPy array of `dtype` (add the batch
        axis with x[numpy.newaxis]).

        `image` is a PIL image (converted to RGB first), or an (H, W, 3) array of RGB values
        from 0 to 255. Resizing an array to another size than its own needs Pillow (pass
        size=None to keep it): a uint8 array, as numpy.asarray(image) gives, is resized as that
        PIL image, so both give the same result; any other array (floats) channel by channel as
        32-bit float images: the same filter, without Pillow's rounding and clipping to 0..255
        after each pass."""
        if hasattr(image, "convert"):  # a PIL image
            image = image.convert("RGB")
            if size is not None:
                image = image.resize(tuple(size))
            rgb = numpy.asarray(image, dtype=dtype)
        else:
            array = numpy.asarray(image)
            if array.ndim != 3 or array.shape[2] != 3:
                raise ValueError(f"VGG16.preprocess: an array image must be (H, W, 3) RGB, got "
                                 f"shape {array.shape}")
            if size is not None and tuple(size) != (array.shape[1], array.shape[0]):
                rgb = _resized(array, tuple(size), dtype)
            else:
                rgb = array.astype(dtype, copy=False)
        bgr = rgb[:, :, ::-1] - numpy.asarray(VGG16.MEAN_BGR, dtype=dtype)
        return numpy.ascontiguousarray(bgr.transpose(2, 0, 1))


def _resized(rgb, size, dtype):
    """The (H, W, 3) array `rgb` resized to `size` (width, height) by Pillow's resize, with its
    default filter, as an array of `dtype`: a uint8 array as the RGB image it is (exactly as
    the PIL image's own resize), any other channel by channel as 32-bit float images."""
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            f"VGG16.preprocess: resizing an array of {rgb.shape[1]}x{rgb.shape[0]} to "
            f"{size[0]}x{size[1]} needs Pillow (pip install pillow); or resize it first and "
            "pass size=None") from None
    if rgb.dtype == numpy.uint8:
        # Pillow rounds and clips to 0..255 after each of its two passes: only the RGB image
        # itself gives what the PIL path gives
        return numpy.asarray(Image.fromarray(numpy.ascontiguousarray(rgb)).resize(size),
                             dtype=dtype)
    channels = [numpy.asarray(Image.fromarray(numpy.ascontiguousarray(
        rgb[:, :, c], dtype=numpy.float32)).resize(size)) for c in range(3)]
    return numpy.stack(channels, axis=2).astype(dtype, copy=False)


class _Residual(Module):
    """A residual block: `shortcut` is None (the identity) or a 1x1 projection."""

    def _joined(self, h, x):
        """relu(h + the shortcut of x): the block's output."""
        return F.relu(h + (x if self.shortcut is None else self.shortcut(x)))


class _Basic(_Residual):
    """Two 3x3 convolutions with batch norm, and the identity (or a 1x1 projection) added."""

    expansion = 1

    def __init__(self, in_channels, channels, stride):
        super().__init__()
        self.conv1 = Conv2d(channels, 3, stride, 1, nobias=True, in_channels=in_channels)
        self.bn1 = BatchNorm()
        self.conv2 = Conv2d(channels, 3, 1, 1, nobias=True, in_channels=channels)
        self.bn2 = BatchNorm()
        self.shortcut = _projection(in_channels, channels, stride)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return self._joined(h, x)


class _Bottleneck(_Residual):
    """1x1 down to `channels`, 3x3 (with the stride), 1x1 up to 4 * channels, each with batch
    norm, and the identity (or a 1x1 projection) added."""

    expansion = 4

    def __init__(self, in_channels, channels, stride):
        super().__init__()
        out = channels * 4
        self.conv1 = Conv2d(channels, 1, 1, 0, nobias=True, in_channels=in_channels)
        self.bn1 = BatchNorm()
        self.conv2 = Conv2d(channels, 3, stride, 1, nobias=True, in_channels=channels)
        self.bn2 = BatchNorm()
        self.conv3 = Conv2d(out, 1, 1, 0, nobias=True, in_channels=channels)
        self.bn3 = BatchNorm()
        self.shortcut = _projection(in_channels, out, stride)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return self._joined(h, x)


def _projection(in_channels, out_channels, stride):
    """The shortcut where the shape changes: a strided 1x1 convolution and batch norm."""
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(Conv2d(out_channels, 1, stride, 0, nobias=True,
                                in_channels=in_channels), BatchNorm())


class ResNet(Module):
    """A residual network of `n_layers` (18, 34, 50, 101 or 152): a 7x7 stride-2 convolution and
    3x3 max pooling, four stages of residual blocks (64, 128, 256, 512 channels; the later
    three halve the size), global average pooling and a fully connected layer to
    `num_classes`. `pretrained` is DeZero's: True raises, as no weights are downloaded (load
    some with model.load)."""

    CONFIGS = {18: (_Basic, (2, 2, 2, 2)), 34: (_Basic, (3, 4, 6, 3)),
               50: (_Bottleneck, (3, 4, 6, 3)), 101: (_Bottleneck, (3, 4, 23, 3)),
               152: (_Bottleneck, (3, 8, 36, 3))}

    def __init__(self, n_layers=152, pretrained=False, *, num_classes=1000):
        _check_pretrained(pretrained, "ResNet")
        super().__init__()
        if n_layers not in self.CONFIGS:
            raise ValueError(f"ResNet: n_layers must be one of {sorted(self.CONFIGS)}, got "
                             f"{n_layers!r}")
        block, counts = self.CONFIGS[n_layers]
        self.conv1 = Conv2d(64, 7, 2, 3, nobias=True, in_channels=3)
        self.bn1 = BatchNorm()
        blocks, in_channels = [], 64
        for stage, (channels, count) in enumerate(zip((64, 128, 256, 512), counts)):
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(block(in_channels, channels, stride))
                in_channels = channels * block.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = Linear(num_classes, in_size=in_channels)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.pooling(x, 3, 2, 1)
        x = self.blocks(x)
        x = F.mean(x, axis=(2, 3))  # global average pooling
        return self.fc(x)


def ResNet18(pretrained=False, *, num_classes=1000):
    """The 18-layer ResNet: ResNet(18, pretrained, num_classes=num_classes)."""
    _check_pretrained(pretrained, "ResNet18")
    return ResNet(18, pretrained, num_classes=num_classes)


def ResNet34(pretrained=False, *, num_classes=1000):
    """The 34-layer ResNet: ResNet(34, pretrained, num_classes=num_classes)."""
    _check_pretrained(pretrained, "ResNet34")
    return ResNet(34, pretrained, num_classes=num_classes)


def ResNet50(pretrained=False, *, num_classes=1000):
    """The 50-layer ResNet: ResNet(50, pretrained, num_classes=num_classes)."""
    _check_pretrained(pretrained, "ResNet50")
    return ResNet(50, pretrained, num_classes=num_classes)


def ResNet101(pretrained=False, *, num_classes=1000):
    """The 101-layer ResNet: ResNet(101, pretrained, num_classes=num_classes)."""
    _check_pretrained(pretrained, "ResNet101")
    return ResNet(101, pretrained, num_classes=num_classes)


def ResNet152(pretrained=False, *, num_classes=1000):
    """The 152-layer ResNet: ResNet(152, pretrained, num_classes=num_classes)."""
    _check_pretrained(pretrained, "ResNet152")
    return ResNet(152, pretrained, num_classes=num_classes)


# =============================================================================== SqueezeNet
class _Fire(Module):
    """SqueezeNet's Fire module: a 1x1 `squeeze` convolution, then 1x1 and 3x3 `expand`
    convolutions side by side, concatenated along the channels (expand1x1 + expand3x3 of them);
    each convolution (with bias) is followed by ReLU."""

    def __init__(self, in_channels, squeeze, expand1x1, expand3x3):
        super().__init__()
        self.squeeze = Conv2d(squeeze, 1, in_channels=in_channels)
        self.expand1x1 = Conv2d(expand1x1, 1, in_channels=squeeze)
        self.expand3x3 = Conv2d(expand3x3, 3, pad=1, in_channels=squeeze)

    def forward(self, x):
        x = F.relu(self.squeeze(x))
        return F.concatenate([F.relu(self.expand1x1(x)), F.relu(self.expand3x3(x))], axis=1)


def _max_pooling_ceil(x):
    """3x3 stride-2 max pooling that rounds the output size up, as the published SqueezeNet
    (Caffe; torchvision's ceil_mode=True): where the last window would run one pixel past the
    edge, the edge row or column is repeated. A repeated pixel lies in the same window as its
    original, so the maxima, and where their gradients go, are those of ceil-mode pooling.
    (F.pooling itself rounds down.)"""
    for axis in (2, 3):
        if (x.shape[axis] - 3) % 2:  # an even size: one window short when rounding down
            edge = x[:, :, -1:] if axis == 2 else x[:, :, :, -1:]
            x = F.concatenate([x, edge], axis=axis)
    return F.pooling(x, 3, 2)


class SqueezeNet(Module):
    """SqueezeNet (Iandola et al. 2016), `version` "1.0" or "1.1" as torchvision's squeezenet1_0
    and squeezenet1_1: a first convolution (v1.0: 96 7x7 stride 2; v1.1: 64 3x3 stride 2) with
    ReLU, eight Fire modules with three 3x3 stride-2 max poolings between (v1.0 after the
    convolution and Fires 3 and 7; v1.1 after the convolution and Fires 2 and 4), then dropout
    (0.5), a 1x1 convolution to `num_classes`, ReLU and global average pooling: (N, 3, H, W) ->
    (N, num_classes). Pooling rounds sizes up as published (a 224x224 image ends 13x13).

    Every layer is sized at construction. Initialisation is gradcore's Conv2d default (randn *
    sqrt(1 / fan_in), zero biases), not torchvision's; parameters and shapes are the same, so its
    weights load once converted to an .npz of these names. `pretrained` is DeZero's, here by
    keyword (num_classes comes first): True raises, as no weights are downloaded (load some
    with model.load).
    """

    # (squeeze, expand 1x1, expand 3x3) channels of each Fire
    FIRES = ((16, 64, 64), (16, 64, 64), (32, 128, 128), (32, 128, 128), (48, 192, 192),
             (48, 192, 192), (64, 256, 256), (64, 256, 256))
    # version -> ((channels, kernel size) of conv1, the Fires (1-based) a max pooling follows)
    VERSIONS = {"1.0": ((96, 7), (3, 7)), "1.1": ((64, 3), (2, 4))}

    def __init__(self, num_classes=1000, version="1.0", *, pretrained=False):
        # a bool here is DeZero's SqueezeNet(pretrained): True gets VGG16's and the ResNets'
        # message, False is refused too rather than built with 1000 classes
        if isinstance(num_classes, (bool, numpy.bool_)):
            _check_pretrained(num_classes, "SqueezeNet")
            raise TypeError(f"SqueezeNet: num_classes must be a positive int, got {num_classes!r} "
                            "(DeZero's pretrained is the first argument there, a keyword here): "
                            "leave it out, or pass pretrained=False")
        _check_pretrained(pretrained, "SqueezeNet")
        super().__init__()
        if version not in self.VERSIONS:
            raise ValueError(f"SqueezeNet: version must be one of {', '.join(self.VERSIONS)} "
                             f"(a string), got {version!r}")
        self.version = version
        (channels, kernel), pool_after = self.VERSIONS[version]
        self.conv1 = Conv2d(channels, kernel, 2, in_channels=3)
        self.pool_after = pool_after
        fires, in_channels = [], channels
        for squeeze, expand1x1, expand3x3 in self.FIRES:
            fires.append(_Fire(in_channels, squeeze, expand1x1, expand3x3))
            in_channels = expand1x1 + expand3x3
        self.fires = nn.Sequential(*fires)
        self.classifier = Conv2d(num_classes, 1, in_channels=in_channels)

    def forward(self, x):
        x = _max_pooling_ceil(F.relu(self.conv1(x)))
        for i, fire in enumerate(self.fires, 1):
            x = fire(x)
            if i in self.pool_after:
                x = _max_pooling_ceil(x)
        x = F.relu(self.classifier(F.dropout(x, 0.5)))
        return F.mean(x, axis=(2, 3))  # global average pooling
