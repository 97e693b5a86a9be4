"""gradcore.models: each architecture's output shape and its published parameter count;
SqueezeNet against a PyTorch build of it; loading weights from a URL, checked by SHA-256."""
import functools
import hashlib
import http.server
import re
import threading

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
import gradcore.nn as nn
from gradcore import models
from gradcore.models import _adaptive_average_pooling, _max_pooling_ceil
from gradcore.utils.download import DownloadError

# Parameter counts as published (the torchvision models of the same architectures)
PUBLISHED = {"VGG16": 138_357_544, "ResNet18": 11_689_512, "ResNet34": 21_797_672,
             "ResNet50": 25_557_032, "ResNet101": 44_549_160, "ResNet152": 60_192_808,
             "SqueezeNet-1.0": 1_248_424, "SqueezeNet-1.1": 1_235_496}


def built(name, **kwargs):
    """models.<name>(), or models.SqueezeNet(version=...) for "SqueezeNet-<version>"."""
    name, _, version = name.partition("-")
    if version:
        kwargs["version"] = version
    return getattr(models, name)(**kwargs)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_forward_shape_and_the_published_parameter_count(name):
    np.random.seed(0)
    model = built(name)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with gradcore.test_mode(), gradcore.no_grad():
        y = model(x)
    assert y.shape == (2, 1000) and y.dtype == np.float32
    assert np.isfinite(y.data).all()
    assert sum(p.size for p in model.params()) == PUBLISHED[name]


def test_a_resnet_trains_and_saves_without_pickle(tmp_path):
    np.random.seed(0)
    model = models.ResNet18(num_classes=3)
    opt = gradcore.optim.SGD(lr=0.05).setup(model)
    x = np.random.default_rng(1).standard_normal((4, 3, 32, 32)).astype(np.float32)
    t = np.array([0, 1, 2, 1])
    losses = []
    for _ in range(3):
        loss = gradcore.functions.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        opt.update()
        losses.append(float(loss.data))
    assert losses[-1] < losses[0]
    model.save(tmp_path / "resnet18.npz")
    clone = models.ResNet18(num_classes=3)
    clone.load(tmp_path / "resnet18.npz")
    with gradcore.test_mode(), gradcore.no_grad():
        np.testing.assert_array_equal(clone(x).data, model(x).data)


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_layers must be one of"):
        models.ResNet(20)


# =============================================================================== DeZero's calls
def test_dezero_calls_build_the_models_and_pretrained_true_says_how_to_load_weights():
    np.random.seed(0)
    resnet = models.ResNet(18, False)  # DeZero's ResNet(n_layers, pretrained)
    assert resnet.fc.W.shape == (512, 1000) and resnet.conv1.W.shape == (64, 3, 7, 7)
    assert models.ResNet18(pretrained=False, num_classes=3).fc.W.shape == (512, 3)
    assert models.ResNet(34, pretrained=False, num_classes=5).fc.W.shape == (512, 5)
    vgg = models.VGG16(pretrained=False, num_classes=3)
    assert vgg.fc8.out_size == 3
    for make, where in ((lambda: models.VGG16(pretrained=True), "VGG16"),
                        (lambda: models.ResNet(50, True), "ResNet"),
                        (lambda: models.ResNet50(True), "ResNet50")):
        with pytest.raises(ValueError, match=where + r"\(pretrained=True\): gradcore bundles "
                           r"and downloads no weights.*model\.load\(path\)"):
            make()
    # where DeZero's pretrained goes, a number of classes is refused, not taken as a flag
    for make, where in ((lambda: models.ResNet(50, 10), "ResNet"),
                        (lambda: models.VGG16(10), "VGG16"),
                        (lambda: models.ResNet152(10), "ResNet152")):
        with pytest.raises(TypeError, match=where + r": pretrained must be True or False .*got "
                           r"10; pass num_classes by keyword \(num_classes=10\)"):
            make()


def test_squeezenet_takes_dezero_s_pretrained_by_keyword():
    """DeZero's SqueezeNet(pretrained=False): here num_classes comes first, so a bool there is
    DeZero's pretrained, refused with the others' messages, never built as a number of
    classes."""
    assert models.SqueezeNet(pretrained=False, num_classes=3).classifier.W.shape == (3, 512, 1, 1)
    for make in (lambda: models.SqueezeNet(True), lambda: models.SqueezeNet(np.True_),
                 lambda: models.SqueezeNet(pretrained=True)):
        with pytest.raises(ValueError, match=r"SqueezeNet\(pretrained=True\): gradcore bundles "
                           r"and downloads no weights.*model\.load\(path\)"):
            make()
    for value in (False, np.False_):
        with pytest.raises(TypeError, match=r"SqueezeNet: num_classes must be a positive int, "
                           rf"got {re.escape(repr(value))} .*pass pretrained=False$"):
            models.SqueezeNet(value)
    with pytest.raises(TypeError, match=r"SqueezeNet: pretrained must be True or False .*got "
                       r"10; pass num_classes by keyword \(num_classes=10\)"):
        models.SqueezeNet(pretrained=10)


def test_pretrained_0_or_none_is_false_as_dezero_s_if_pretrained_takes_it():
    # neither can be a number of classes, so taking them reopens no VGG16(10) ambiguity
    for value in (0, None, np.int64(0)):
        assert models.ResNet18(pretrained=value, num_classes=2).fc.W.shape == (512, 2)
        assert models.ResNet(18, value, num_classes=2).fc.W.shape == (512, 2)
    assert models.VGG16(None, num_classes=2).fc8.out_size == 2
    # a positive int may be num_classes: refused with that hint; other values without it
    for value, hint in ((1, r"; pass num_classes by keyword \(num_classes=1\)$"), (-1, "$"),
                        (0.0, "$"), ("", "$")):
        with pytest.raises(TypeError, match=rf"ResNet18: pretrained must be True or False "
                                            rf".*got {value!r}{hint}"):
            models.ResNet18(pretrained=value)


def test_sequential_is_dezero_s_its_layers_l0_l1_and_loads_a_dezero_file(tmp_path):
    import gradcore.layers as L
    # what DeZero's Sequential(L.Linear(3), L.Linear(2)).save_weights writes, in_size 4
    W0, W1 = np.arange(12.0).reshape(4, 3) / 10, np.arange(6.0).reshape(3, 2) / 10
    path = tmp_path / "dezero.npz"
    np.savez_compressed(path, **{"l0/W": W0.astype(np.float32), "l0/b": np.ones(3, np.float32),
                                 "l1/W": W1.astype(np.float32), "l1/b": np.zeros(2, np.float32)})
    model = models.Sequential(L.Linear(3), F.relu, L.Linear(2))
    assert model.layers == [model.l0, F.relu, model.l2] and model.l1.fn is F.relu
    model = models.Sequential(L.Linear(3), L.Linear(2))
    assert model.layers == [model.l0, model.l1]
    model.load_weights(path)  # lazy: sized by the file
    x = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(model(x).data, (x @ W0 + 1) @ W1, rtol=1e-6)
    # and back: what gradcore saves loads into a fresh one
    saved = model.save(tmp_path / "gradcore.npz")
    assert sorted(nn.read_checkpoint(saved)) == ["l0.W", "l0.b", "l1.W", "l1.b"]
    clone = models.Sequential(L.Linear(3), L.Linear(2))
    clone.load_weights(saved)
    np.testing.assert_array_equal(clone(x).data, model(x).data)
    # DeZero's Sequential holds `self.layers`: a subclass setting it gets those as l0, l1
    model.layers = [model.l1]
    assert model.layers == [model.l0] and list(model.state_dict()) == ["l0.W", "l0.b"]
    # gradcore.nn's is PyTorch's, and the models built of it keep their names
    assert list(nn.Sequential(nn.Linear(2, in_size=1)).state_dict()) == ["0.W", "0.b"]
    assert "blocks.0.conv1.W" in dict(models.ResNet18().named_parameters())
    assert "fires.0.squeeze.W" in dict(models.SqueezeNet().named_parameters())


def test_sequential_loads_what_nn_sequential_saved_with_numbered_names(tmp_path):
    # an nn.Sequential's file ("0.W", "2.W"), as models.Sequential also saved before it became
    # DeZero's: its layers are models.Sequential's l0, l2
    np.random.seed(0)
    old = nn.Sequential(nn.Linear(3, in_size=4), nn.ReLU(), nn.Linear(2, in_size=3))
    saved = old.save(tmp_path / "old.npz")
    x = np.ones((1, 4))
    for load in ("file", "state"):
        model = models.Sequential(nn.Linear(3), nn.ReLU(), nn.Linear(2))
        if load == "file":
            model.load(saved)
        else:
            model.load_state_dict(old.state_dict())
        np.testing.assert_array_equal(model(x).data, old(x).data)
        assert list(model.state_dict()) == ["l0.W", "l0.b", "l2.W", "l2.b"]
    # an nn.Sequential inside keeps its numbers: "0.0.W" is the model's "l0.0.W"
    inner = nn.Sequential(nn.Sequential(nn.Linear(3, in_size=4)), nn.Linear(2, in_size=3))
    model = models.Sequential(nn.Sequential(nn.Linear(3)), nn.Linear(2))
    model.load(inner.save(tmp_path / "nested.npz"))
    np.testing.assert_array_equal(model(x).data, inner(x).data)


def test_vgg16_preprocess_makes_bgr_minus_the_imagenet_mean_channels_first():
    rgb = np.array([[[10, 20, 30], [40, 50, 60]],
                    [[70, 80, 90], [250, 0, 128]]], np.uint8)  # (H, W, 3) = (2, 2, 3)
    mean = np.array([103.939, 116.779, 123.68], np.float32)
    expected = (rgb[:, :, ::-1].astype(np.float32) - mean).transpose(2, 0, 1)
    x = models.VGG16.preprocess(rgb, size=None)
    assert x.shape == (3, 2, 2) and x.dtype == np.float32
    np.testing.assert_array_equal(x, expected)
    np.testing.assert_allclose(x[:, 1, 0], [90 - 103.939, 80 - 116.779, 70 - 123.68], rtol=1e-6)
    assert models.VGG16.preprocess(rgb, size=None, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError, match=r"must be \(H, W, 3\) RGB, got shape \(2, 2\)"):
        models.VGG16.preprocess(np.zeros((2, 2)))


def test_vgg16_preprocess_takes_a_pil_image_as_dezero_does_and_resizes_to_224():
    Image = pytest.importorskip("PIL.Image")
    rows, columns = np.mgrid[0:40, 0:60]
    rgb = np.stack([rows * 5, columns * 4, rows + columns], axis=2).astype(np.uint8)  # smooth
    image = Image.fromarray(rgb)
    x = models.VGG16.preprocess(image)
    assert x.shape == (3, 224, 224) and x.dtype == np.float32
    resized = np.asarray(image.resize((224, 224)), np.float32)
    mean = np.array([103.939, 116.779, 123.68], np.float32)
    np.testing.assert_array_equal(x, (resized[:, :, ::-1] - mean).transpose(2, 0, 1))
    np.testing.assert_array_equal(models.VGG16.preprocess(image.convert("L"), size=None)[0],
                                  np.asarray(image.convert("L"), np.float32) - mean[0])
    np.testing.assert_array_equal(models.VGG16.preprocess(rgb), x)  # the same as an array
    assert models.VGG16.preprocess(rgb, size=(30, 20)).shape == (3, 20, 30)


def test_vgg16_preprocess_resizes_a_uint8_array_as_its_pil_image_and_floats_unrounded():
    # channel by channel as float images, a detailed picture would come out up to ~33 from the
    # PIL path, where Pillow rounds and clips to 8 bits after each pass
    Image = pytest.importorskip("PIL.Image")
    rgb = np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8)
    image = Image.fromarray(rgb)
    for size in ((224, 224), (30, 20)):
        for dtype in (np.float32, np.float64):
            np.testing.assert_array_equal(models.VGG16.preprocess(rgb, size, dtype),
                                          models.VGG16.preprocess(image, size, dtype))
    floats = rgb.astype(np.float32)  # no 8-bit image: each channel a float image, unrounded
    resized = np.stack([np.asarray(Image.fromarray(floats[:, :, c]).resize((224, 224)))
                        for c in range(3)], axis=2)
    mean = np.array([103.939, 116.779, 123.68], np.float32)
    np.testing.assert_array_equal(models.VGG16.preprocess(floats),
                                  (resized[:, :, ::-1] - mean).transpose(2, 0, 1))
    assert np.ptp(resized - np.asarray(image.resize((224, 224)), np.float32)) > 2.0


def test_vgg16_preprocess_takes_an_array_without_pillow(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "PIL", None)  # import PIL fails
    rgb = np.full((224, 224, 3), 100.0)
    x = models.VGG16.preprocess(rgb)  # already 224x224: nothing to resize
    np.testing.assert_allclose(x[:, 0, 0], [100 - 103.939, 100 - 116.779, 100 - 123.68],
                               rtol=1e-6)
    with pytest.raises(ImportError, match=r"resizing an array of 60x40 to 224x224 needs Pillow"):
        models.VGG16.preprocess(np.zeros((40, 60, 3)))


# =============================================================================== VGG16
@pytest.mark.parametrize("shape", [(2, 3, 1, 1), (1, 2, 2, 3), (2, 2, 4, 4), (1, 2, 6, 9),
                                   (1, 1, 7, 7), (2, 1, 14, 14), (1, 2, 13, 8)])
def test_adaptive_average_pooling_is_pytorchs(shape):
    """Values and gradient against torch's adaptive_avg_pool2d: bins that repeat (H < 7),
    overlap (7 does not divide H), tile (14) or are single pixels (7)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = gradcore.Variable(rng.standard_normal(shape))
    y = _adaptive_average_pooling(x, 7)
    gy = rng.standard_normal(y.shape)
    y.backward(gy)
    tx = torch.tensor(x.data, requires_grad=True)
    ty = torch.nn.functional.adaptive_avg_pool2d(tx, 7)
    ty.backward(torch.tensor(gy))
    np.testing.assert_allclose(y.data, ty.detach().numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(x.grad.data, tx.grad.numpy(), rtol=1e-12, atol=1e-15)
    x32 = gradcore.Variable(x.data.astype(np.float32))
    assert _adaptive_average_pooling(x32, 7).dtype == np.float32


def test_vgg16_draws_its_weights_at_the_first_call_in_dezero_s_order():
    """fc6-fc8 were made with the model: 120M draws (4.6 s) before any input, and under one
    seed every convolution got other weights than DeZero's VGG16 (conv1_1.W[0, 0, 0] [-0.0295,
    0.1954, 0.1785] for [0.3126, -0.1177, -0.1016])."""
    np.random.seed(1)
    model = models.VGG16(num_classes=3)
    state = np.random.get_state()[1].copy()
    np.random.seed(1)
    assert np.array_equal(np.random.get_state()[1], state)  # building drew nothing
    x = np.ones((1, 3, 32, 32), np.float32)
    np.random.seed(1)
    with gradcore.test_mode(), gradcore.no_grad():
        model(x)
    np.random.seed(1)
    first = nn.Conv2d(64, kernel_size=3, pad=1)
    first(x)
    np.testing.assert_array_equal(model.conv1_1.W.data, first.W.data)
    assert model.fc6.W.shape == (512 * 7 * 7, 4096) and model.fc8.W.shape == (4096, 3)


def test_vgg16_takes_any_size_from_32_and_runs_a_replaced_convolution():
    model = models.VGG16(num_classes=3)
    for hw in [(64, 64), (96, 80), (32, 64)]:  # reach the pooling as 2x2, 3x2, 1x2
        with gradcore.test_mode(), gradcore.no_grad():
            assert model(np.ones((1, 3) + hw, np.float32)).shape == (1, 3)
    calls = []
    model.conv5_3 = nn.Conv2d(512, 3, pad=1)
    model.conv5_3.register_forward_hook(lambda module, inputs, y: calls.append(y.shape))
    with gradcore.test_mode(), gradcore.no_grad():
        model(np.ones((1, 3, 32, 32), np.float32))
    assert calls == [(1, 512, 2, 2)] and "conv5_3.W" in model.state_dict()
    with pytest.raises(ValueError, match=r"VGG16: images must be \(N, 3, H, W\) with H and W of "
                       r"32 or more .*got shape \(1, 3, 32, 16\)"):
        model(np.zeros((1, 3, 32, 16), np.float32))


# =============================================================================== SqueezeNet
@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_squeezenet_computes_what_the_pytorch_one_does(version):
    """torchvision's squeezenet1_0 / 1_1 rebuilt from torch.nn (ceil-mode pooling) with our
    weights: the same outputs. 64x66 images make some poolings round up in each version."""
    torch = pytest.importorskip("torch")
    tnn = torch.nn
    np.random.seed(0)
    model = models.SqueezeNet(num_classes=10, version=version)

    def conv(layer, **kwargs):
        c = tnn.Conv2d(layer.W.shape[1], layer.W.shape[0], layer.W.shape[2:], **kwargs)
        c.weight.data = torch.from_numpy(layer.W.data.copy())
        c.bias.data = torch.from_numpy(layer.b.data.copy())
        return c

    class Fire(tnn.Module):
        def __init__(self, fire):
            super().__init__()
            self.squeeze = conv(fire.squeeze)
            self.expand1x1 = conv(fire.expand1x1)
            self.expand3x3 = conv(fire.expand3x3, padding=1)

        def forward(self, x):
            x = torch.relu(self.squeeze(x))
            return torch.cat([torch.relu(self.expand1x1(x)), torch.relu(self.expand3x3(x))], 1)

    def pool():
        return tnn.MaxPool2d(3, 2, ceil_mode=True)

    fires = [Fire(fire) for fire in model.fires]
    if version == "1.0":
        features = [conv(model.conv1, stride=2), tnn.ReLU(), pool(), *fires[:3], pool(),
                    *fires[3:7], pool(), fires[7]]
    else:
        features = [conv(model.conv1, stride=2), tnn.ReLU(), pool(), *fires[:2], pool(),
                    *fires[2:4], pool(), *fires[4:]]
    reference = tnn.Sequential(*features, tnn.Dropout(0.5), conv(model.classifier), tnn.ReLU(),
                               tnn.AdaptiveAvgPool2d(1), tnn.Flatten()).eval()
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 66)).astype(np.float32)
    with gradcore.test_mode(), gradcore.no_grad():
        y = model(x)
    with torch.no_grad():
        expected = reference(torch.from_numpy(x)).numpy()
    assert y.shape == (2, 10)
    np.testing.assert_allclose(y.data, expected, rtol=1e-4, atol=1e-6)


def test_squeezenet_pools_round_up_as_published():
    """A 224x224 image reaches the classifier as 13x13 in both versions (12x12 if the
    poolings rounded down)."""
    for version in ("1.0", "1.1"):
        model = models.SqueezeNet(num_classes=3, version=version)
        seen = []
        model.classifier.register_forward_pre_hook(lambda module, inputs: seen.append(
            inputs[0].shape))
        with gradcore.test_mode(), gradcore.no_grad():
            model(np.zeros((1, 3, 224, 224), np.float32))
        assert seen == [(1, 512, 13, 13)]


@pytest.mark.parametrize("shape", [(2, 3, 7, 7), (2, 3, 8, 8), (1, 2, 8, 9), (1, 2, 9, 10)])
def test_max_pooling_ceil_is_ceil_mode_pooling(shape):
    x = np.random.default_rng(0).standard_normal(shape)
    h, w = shape[2:]
    oh, ow = -(-(h - 3) // 2) + 1, -(-(w - 3) // 2) + 1  # ceil((size - 3) / 2) + 1
    expected = np.empty(shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            expected[:, :, i, j] = x[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(2, 3))
    np.testing.assert_array_equal(_max_pooling_ceil(gradcore.Variable(x)).data, expected)
    gradcore.utils.gradcheck(_max_pooling_ceil, x)


def test_public_functions_have_docstrings():
    import inspect
    for name in models.__all__:
        obj = getattr(models, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert obj.__doc__, f"gradcore.models.{name} has no docstring"


def test_squeezenet_bad_version():
    with pytest.raises(ValueError, match=r"version must be one of 1.0, 1.1 .*got 1.2"):
        models.SqueezeNet(version=1.2)


# =============================================================================== weights by URL
def small_model():
    """Conv -> BatchNorm -> relu -> Linear, every layer sized lazily at the first call."""
    return nn.Sequential(nn.Conv2d(3, 3, pad=1), nn.BatchNorm(), F.relu, F.flatten, nn.Linear(2))


def serve(folder):
    """A real HTTP server on 127.0.0.1 serving `folder`, in a thread; returns it."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def path_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def test_load_from_a_url_checked_by_sha256_then_from_the_cache(tmp_path, monkeypatch):
    np.random.seed(0)
    model = small_model()
    x = np.random.default_rng(0).standard_normal((4, 2, 3, 3)).astype(np.float32)
    model(x)  # sizes the layers; BatchNorm's running statistics move
    served = tmp_path / "served"
    served.mkdir()
    path = model.save(served / "small.npz")
    digest = hashlib.sha256(path_bytes(path)).hexdigest()
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path / "cache"))
    httpd = serve(served)
    url = f"http://127.0.0.1:{httpd.server_address[1]}/small.npz"
    try:
        with pytest.raises(ValueError, match="needs sha256=.*sha256sum"):
            small_model().load(url)
        with pytest.raises(DownloadError, match="SHA-256"):
            small_model().load(url, sha256="0" * 64, progress=False)
        assert not list((tmp_path / "cache" / "weights").rglob("small.npz*"))
        fresh = small_model()  # never called: its layers take their sizes from the file
        fresh.load(url, sha256=digest.upper(), progress=False)
    finally:
        httpd.shutdown()
        httpd.server_close()
    expected = model.state_dict()
    for clone in (fresh, small_model()):
        if clone is not fresh:  # the server is gone: the cached file serves
            clone.load_weights(url, sha256=digest, progress=False)
        state = clone.state_dict()
        assert list(state) == list(expected)
        for name, value in expected.items():
            np.testing.assert_array_equal(state[name], value)
        with gradcore.test_mode(), gradcore.no_grad():
            np.testing.assert_array_equal(clone(x).data, model(x).data)
    cached = tmp_path / "cache" / "weights" / digest[:16] / "small.npz"
    assert cached.read_bytes() == path_bytes(path)
    with pytest.raises(DownloadError, match="could not download"):  # another file: not cached
        small_model().load(url, sha256="f" * 64, progress=False)
    cached.write_bytes(cached.read_bytes()[:-1])  # damaged in the cache
    with pytest.raises(DownloadError, match="is there but its SHA-256"):
        small_model().load(url, sha256=digest, progress=False)


def test_two_urls_ending_in_the_same_file_name_are_cached_apart(tmp_path, monkeypatch):
    served = {}
    for folder, seed in (("a", 0), ("b", 1)):
        np.random.seed(seed)
        model = nn.MLP((3, 2))
        model(np.ones((1, 4), np.float32))
        (tmp_path / folder).mkdir()
        path = model.save(tmp_path / folder / "model.npz")
        served[folder] = (model, hashlib.sha256(path_bytes(path)).hexdigest())
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path / "cache"))
    httpd = serve(tmp_path)
    try:
        for folder, (model, digest) in served.items():
            clone = nn.MLP((3, 2))
            clone.load(f"http://127.0.0.1:{httpd.server_address[1]}/{folder}/model.npz",
                       sha256=digest, progress=False)
            for a, b in zip(clone.parameters(), model.parameters()):
                np.testing.assert_array_equal(a.data, b.data)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_sha256_checks_a_local_file_too(tmp_path):
    np.random.seed(0)
    model = nn.MLP((3, 2))
    model(np.ones((1, 4), np.float32))
    path = model.save(tmp_path / "mlp.npz")
    digest = hashlib.sha256(path_bytes(path)).hexdigest()
    nn.MLP((3, 2)).load(path, sha256=digest)
    fresh = nn.MLP((3, 2))
    with pytest.raises(gradcore.CheckpointError, match="its SHA-256 is .* not 0000"):
        fresh.load(path, sha256="0" * 64)
    assert fresh.l0.W.data is None  # nothing was loaded
    with pytest.raises(ValueError, match="64 hex digits"):
        fresh.load(path, sha256="abc")
    with pytest.raises(ValueError, match="names no file"):
        fresh.load("https://example.invalid/weights/", sha256=digest)
