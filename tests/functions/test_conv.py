"""gradcore.functions.conv: im2col, col2im, conv2d, deconv2d, pooling, average_pooling. One row per op; tests/harness.py checks each against the direct NumPy loops below."""
import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from gradcore.functions.conv import get_conv_outsize, get_deconv_outsize, pair
from float16_backends import float16_backends
from harness import Case, check_case, ids


# =============================================================================== NumPy references
def np_pad(x, pad):
    ph, pw = pair(pad)
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))


def np_im2col(x, kernel, stride=1, pad=0, to_matrix=True):
    """col[n, c, ki, kj, i, j] = padded x[n, c, i * SH + ki, j * SW + kj], element by element."""
    (KH, KW), (SH, SW) = pair(kernel), pair(stride)
    xp = np_pad(x, pad)
    N, C, H, W = xp.shape
    OH, OW = (H - KH) // SH + 1, (W - KW) // SW + 1
    col = np.zeros((N, C, KH, KW, OH, OW))
    for ki in range(KH):
        for kj in range(KW):
            for i in range(OH):
                for j in range(OW):
                    col[:, :, ki, kj, i, j] = xp[:, :, i * SH + ki, j * SW + kj]
    if to_matrix:
        col = col.transpose(0, 4, 5, 1, 2, 3).reshape(N * OH * OW, -1)
    return col


def np_col2im(col, shape, kernel, stride=1, pad=0, to_matrix=True):
    """Each window value added back at the pixel it came from (the adjoint of np_im2col)."""
    (KH, KW), (SH, SW), (PH, PW) = pair(kernel), pair(stride), pair(pad)
    N, C, H, W = shape
    OH, OW = get_conv_outsize(H, KH, SH, PH), get_conv_outsize(W, KW, SW, PW)
    if to_matrix:
        col = col.reshape(N, OH, OW, C, KH, KW).transpose(0, 3, 4, 5, 1, 2)
    img = np.zeros((N, C, H + 2 * PH, W + 2 * PW))
    for ki in range(KH):
        for kj in range(KW):
            for i in range(OH):
                for j in range(OW):
                    img[:, :, i * SH + ki, j * SW + kj] += col[:, :, ki, kj, i, j]
    return img[:, :, PH:PH + H, PW:PW + W]


def np_conv2d(x, W, b=None, stride=1, pad=0):
    (SH, SW) = pair(stride)
    xp = np_pad(x, pad)
    OC, _, KH, KW = W.shape
    OH, OW = (xp.shape[2] - KH) // SH + 1, (xp.shape[3] - KW) // SW + 1
    y = np.zeros((x.shape[0], OC, OH, OW))
    for i in range(OH):
        for j in range(OW):
            patch = xp[:, :, i * SH:i * SH + KH, j * SW:j * SW + KW]
            y[:, :, i, j] = np.einsum("nckl,ockl->no", patch, W)
    return y if b is None else y + b[None, :, None, None]


def np_deconv2d(x, W, b=None, stride=1, pad=0, outsize=None):
    """Every input pixel spreads x[n, c, i, j] * W[c] over the output window it maps to."""
    (SH, SW), (PH, PW) = pair(stride), pair(pad)
    N, C, H, Wx = x.shape
    _, OC, KH, KW = W.shape
    if outsize is None:
        outsize = (SH * (H - 1) + KH - 2 * PH, SW * (Wx - 1) + KW - 2 * PW)
    OH, OW = outsize
    y = np.zeros((N, OC, max(OH + 2 * PH, SH * (H - 1) + KH), max(OW + 2 * PW, SW * (Wx - 1) + KW)))
    for i in range(H):
        for j in range(Wx):
            y[:, :, i * SH:i * SH + KH, j * SW:j * SW + KW] += np.einsum(
                "nc,cokl->nokl", x[:, :, i, j], W)
    y = y[:, :, PH:PH + OH, PW:PW + OW]
    return y if b is None else y + b[None, :, None, None]


def np_pool(x, kernel, stride=1, pad=0, reduce=np.max):
    (KH, KW), (SH, SW) = pair(kernel), pair(stride)
    xp = np_pad(x, pad)
    OH, OW = (xp.shape[2] - KH) // SH + 1, (xp.shape[3] - KW) // SW + 1
    y = np.zeros(x.shape[:2] + (OH, OW))
    for i in range(OH):
        for j in range(OW):
            y[:, :, i, j] = reduce(xp[:, :, i * SH:i * SH + KH, j * SW:j * SW + KW], axis=(2, 3))
    return y


IMG = (2, 3, 5, 4)

# fmt: off
CASES = [
    Case("im2col",                lambda x: F.im2col(x, 3, 1, 1),                      lambda x: np_im2col(x, 3, 1, 1), (IMG,)),
    Case("im2col-tensor",         lambda x: F.im2col(x, (2, 3), (2, 1), (1, 0), False), lambda x: np_im2col(x, (2, 3), (2, 1), (1, 0), False), (IMG,)),
    Case("col2im",                lambda c: F.col2im(c, IMG, 3, 2, 1),                 lambda c: np_col2im(c, IMG, 3, 2, 1), ((12, 27),)),
    Case("col2im-tensor",         lambda c: F.col2im(c, IMG, (2, 3), (2, 1), (1, 0), False), lambda c: np_col2im(c, IMG, (2, 3), (2, 1), (1, 0), False), ((2, 3, 2, 3, 3, 2),)),
    Case("conv2d",                lambda x, W, b: F.conv2d(x, W, b, 1, 1),             lambda x, W, b: np_conv2d(x, W, b, 1, 1), (IMG, (4, 3, 3, 3), (4,))),
    Case("conv2d-stride",         lambda x, W: F.conv2d(x, W, stride=2),               lambda x, W: np_conv2d(x, W, stride=2), ((2, 3, 6, 5), (2, 3, 2, 3))),
    Case("conv2d-pair",           lambda x, W, b: F.conv2d(x, W, b, (2, 1), (1, 2)),   lambda x, W, b: np_conv2d(x, W, b, (2, 1), (1, 2)), (IMG, (2, 3, 3, 2), (2,))),
    Case("conv2d_simple",         lambda x, W, b: F.conv2d_simple(x, W, b, 2, 1),      lambda x, W, b: np_conv2d(x, W, b, 2, 1), (IMG, (4, 3, 3, 3), (4,))),
    Case("deconv2d",              lambda x, W, b: F.deconv2d(x, W, b, 2, 1),           lambda x, W, b: np_deconv2d(x, W, b, 2, 1), ((2, 3, 3, 2), (3, 2, 3, 3), (2,))),
    Case("deconv2d-outsize",      lambda x, W: F.deconv2d(x, W, None, 2, 1, (6, 4)),   lambda x, W: np_deconv2d(x, W, None, 2, 1, (6, 4)), ((2, 3, 3, 2), (3, 2, 3, 3))),
    Case("deconv2d-pair",         lambda x, W: F.deconv2d(x, W, stride=(1, 2), pad=(0, 1)), lambda x, W: np_deconv2d(x, W, None, (1, 2), (0, 1)), ((1, 2, 3, 3), (2, 3, 2, 3))),
    Case("pooling",               lambda x: F.pooling(x, 2, 2),                        lambda x: np_pool(x, 2, 2), ((2, 3, 4, 4),)),
    Case("pooling-pad",           lambda x: F.pooling(x, 3, 2, 1),                     lambda x: np_pool(x, 3, 2, 1), (IMG,), (0.5, 2.0)),
    Case("pooling-overlap",       lambda x: F.pooling(x, (2, 3), 1),                   lambda x: np_pool(x, (2, 3), 1), (IMG,)),
    Case("pooling_simple",        lambda x: F.pooling_simple(x, 3, 2, 1),              lambda x: np_pool(x, 3, 2, 1), (IMG,), (0.5, 2.0)),
    Case("average_pooling",       lambda x: F.average_pooling(x, 2, 2),                lambda x: np_pool(x, 2, 2, 0, np.mean), ((2, 3, 4, 4),)),
    Case("average_pooling-pad",   lambda x: F.average_pooling(x, 3, 2, 1),             lambda x: np_pool(x, 3, 2, 1, np.mean), (IMG,)),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_op(case, xp):
    check_case(case, xp)


# =============================================================================== helpers
def test_pair_and_output_sizes():
    assert pair(3) == (3, 3) and pair((2, 1)) == (2, 1) and pair([1, 4]) == (1, 4)
    for bad in ((1, 2, 3), 1.5, "2", True):
        with pytest.raises(ValueError, match="int or a pair"):
            pair(bad)
    assert get_conv_outsize(5, 3, 2, 1) == 3
    assert get_conv_outsize(4, 2, 2, 0) == 2
    assert get_deconv_outsize(3, 3, 2, 1) == 5
    assert get_deconv_outsize(3, 4, 2, 1) == 6  # inverts: conv of 6 with (4, 2, 1) gives 3
    assert get_conv_outsize(6, 4, 2, 1) == 3


def test_im2col_and_col2im_are_adjoint(xp):
    """<im2col(x), c> == <x, col2im(c)>: col2im is im2col's backward, and the other way round."""
    rng = np.random.default_rng(0)
    x, c = rng.standard_normal(IMG), rng.standard_normal((2, 3, 2, 3, 3, 2))
    args = ((2, 3), (2, 1), (1, 0), False)
    col = F.im2col(xp.asarray(x), *args)
    img = F.col2im(xp.asarray(c), IMG, *args)
    left = np.sum(xp.numpy(col.data) * c)
    np.testing.assert_allclose(left, np.sum(x * xp.numpy(img.data)), rtol=1e-12)


def test_dezero_array_forms_of_im2col_and_col2im():
    """functions_conv.im2col_array / col2im_array: arrays in and out, no graph, a new array. A
    1x1x3x3 image with 2x2 windows, stride 1: four windows, and col2im counts each pixel as often
    as windows cover it (the middle one 4 times)."""
    from gradcore.functions_conv import col2im_array, im2col_array
    img = np.arange(9.0).reshape(1, 1, 3, 3)
    col = im2col_array(img, 2)
    assert type(col) is np.ndarray
    np.testing.assert_array_equal(col, [[0, 1, 3, 4], [1, 2, 4, 5], [3, 4, 6, 7], [4, 5, 7, 8]])
    assert not np.shares_memory(col, img)
    back = col2im_array(np.ones_like(col), img.shape, 2)
    np.testing.assert_array_equal(back[0, 0], [[1, 2, 1], [2, 4, 2], [1, 2, 1]])
    assert im2col_array(img, 2, to_matrix=False).shape == (1, 1, 2, 2, 2, 2)


def test_conv2d_backward_matches_conv2d_simple(xp):
    """The fused conv2d against its composition oracle, gradients of every input included."""
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s) for s in (IMG, (4, 3, 2, 3), (4,))]
    results = []
    for op in (F.conv2d, F.conv2d_simple):
        x, W, b = (gradcore.Variable(xp.asarray(a)) for a in arrays)
        y = op(x, W, b, stride=(1, 2), pad=1)
        (y * y).sum().backward()
        results.append([xp.numpy(v.data) for v in (y, x.grad, W.grad, b.grad)])
    for fused, simple in zip(*results):
        np.testing.assert_allclose(fused, simple, rtol=1e-10, atol=1e-12)


def test_pooling_matches_pooling_simple(xp):
    rng = np.random.default_rng(3)
    a = rng.standard_normal(IMG)
    results = []
    for op in (F.pooling, F.pooling_simple):
        x = gradcore.Variable(xp.asarray(a))
        y = op(x, (2, 3), (1, 2), (1, 0))
        (y * y).sum().backward()
        results.append((xp.numpy(y.data), xp.numpy(x.grad.data)))
    for fused, simple in zip(*results):
        np.testing.assert_array_equal(fused, simple)


def test_max_pooling_sends_the_gradient_to_the_first_maximum(xp):
    x = gradcore.Variable(xp.asarray(np.array([[[[1.0, 3.0], [3.0, 0.0]]]])))
    y = F.pooling(x, 2)
    y.backward()
    np.testing.assert_array_equal(xp.numpy(y.data), [[[[3.0]]]])
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [[[[0.0, 1.0], [0.0, 0.0]]]])


def np_first_max_grad(x, kernel, stride, pad):
    """d sum(max pooling)/dx by loops: each window's first maximum (NumPy argmax) gets a 1."""
    (KH, KW), (SH, SW), (PH, PW) = pair(kernel), pair(stride), pair(pad)
    xp = np_pad(x, pad)
    g = np.zeros_like(xp)
    for i in range((xp.shape[2] - KH) // SH + 1):
        for j in range((xp.shape[3] - KW) // SW + 1):
            for n in range(x.shape[0]):
                for c in range(x.shape[1]):
                    k = np.argmax(xp[n, c, i * SH:i * SH + KH, j * SW:j * SW + KW])
                    g[n, c, i * SH + k // KW, j * SW + k % KW] += 1
    return g[:, :, PH:PH + x.shape[2], PW:PW + x.shape[3]]


@pytest.mark.parametrize("kernel, stride, pad", [(2, 2, 0), (3, 1, 1), ((2, 3), (1, 2), (1, 0))])
def test_max_pooling_ties_go_to_the_first_maximum_in_every_window(xp, kernel, stride, pad):
    """Small integers: many ties, in overlapping windows and against the zero padding too."""
    a = np.random.default_rng(4).integers(-1, 2, size=(2, 3, 6, 5)).astype(np.float64)
    x = gradcore.Variable(xp.asarray(a))
    y = F.pooling(x, kernel, stride, pad)
    y.backward()
    np.testing.assert_array_equal(xp.numpy(y.data), np_pool(a, kernel, stride, pad))
    np.testing.assert_array_equal(xp.numpy(x.grad.data), np_first_max_grad(a, kernel, stride, pad))


@pytest.mark.parametrize("size, kernel, stride, pad", [
    (4, 2, 2, 0),   # windows tile the image: backward fills its gradient without zeroing it
    (5, 2, 2, 0),   # the last row and column are in no window: their gradient must be 0
    (4, 2, 2, 1),   # padding: windows tile the padded image
    (5, 2, 2, 1),   # ... except its last row and column
])
def test_max_pooling_pixels_in_no_window_get_a_zero_gradient(xp, size, kernel, stride, pad):
    # freed NaNs of the gradient's size first: uninitialised memory would likely show them
    a = np.random.default_rng(5).standard_normal((1, 1, size, size))
    for _ in range(3):
        junk = xp.asarray(np.full((1, 1, size + 2 * pad, size + 2 * pad), np.nan))
        del junk
    x = gradcore.Variable(xp.asarray(a))
    F.pooling(x, kernel, stride, pad).backward()
    np.testing.assert_array_equal(xp.numpy(x.grad.data), np_first_max_grad(a, kernel, stride, pad))


def test_max_pooling_double_backward_keeps_the_choice_of_pixels(xp):
    """gx = pooling_grad(gy) is linear in gy; its gradient with respect to gy picks, from each
    window, the pixel that got the gradient (the first maximum), whatever the values there."""
    a = np.array([[[[1.0, 3.0, 0.0], [3.0, 2.0, 5.0], [0.0, 5.0, 4.0]]]])
    x = gradcore.Variable(xp.asarray(a))
    gy = gradcore.Variable(xp.asarray(np.array([[[[1.0, 2.0], [3.0, 4.0]]]])))
    y = F.pooling(x, 2, 1)
    gx, = gradcore.grad(y, [x], grad_outputs=gy, create_graph=True)
    np.testing.assert_array_equal(xp.numpy(gx.data), [[[[0, 1, 0], [0, 0, 6], [0, 3, 0]]]])
    r = gradcore.Variable(xp.asarray(np.arange(9.0).reshape(1, 1, 3, 3)), requires_grad=False)
    (gx * r).sum().backward()
    np.testing.assert_array_equal(xp.numpy(gy.grad.data), [[[[1.0, 5.0], [7.0, 5.0]]]])


def test_max_pooling_nan_window_passes_no_gradient(xp):
    x = gradcore.Variable(xp.asarray(np.array([[[[1.0, np.nan, 2.0, 0.0]]]])))
    y = F.pooling(x, (1, 2), (1, 2))
    y.backward()
    out = xp.numpy(y.data)
    assert np.isnan(out[0, 0, 0, 0]) and out[0, 0, 0, 1] == 2.0
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [[[[0.0, 0.0, 1.0, 0.0]]]])


def test_max_pooling_pads_with_zeros_as_dezero(xp):
    """The README's rule (PyTorch pads with -inf: [-1, -2, -5, -6], a gradient to each)."""
    x = gradcore.Variable(xp.asarray(-np.arange(1.0, 17.0).reshape(1, 1, 4, 4)))
    y = F.pooling(x, 3, 2, 1)
    F.sum(y).backward()
    np.testing.assert_array_equal(xp.numpy(y.data).ravel(), [0.0, 0.0, 0.0, -6.0])
    assert xp.numpy(x.grad.data).sum() == 1.0 and xp.numpy(x.grad.data)[0, 0, 1, 1] == 1.0


def test_pooling_without_grad_records_nothing(xp):
    a = np.random.default_rng(5).standard_normal(IMG)
    x = gradcore.Variable(xp.asarray(a))
    with gradcore.no_grad():
        y = F.pooling(x, 2, 1, 1)
    assert y.creator is None
    np.testing.assert_array_equal(xp.numpy(y.data), np_pool(a, 2, 1, 1))


def test_pooling_with_a_1x1_kernel_returns_a_new_array(xp):
    x = gradcore.Variable(xp.asarray(np.arange(4.0).reshape(1, 1, 2, 2)))
    y = F.pooling(x, 1)
    y.data += 10.0
    np.testing.assert_array_equal(xp.numpy(x.data), [[[[0.0, 1.0], [2.0, 3.0]]]])


def test_conv2d_backward_twice_gives_the_same_gradients(xp):
    """conv2d keeps its windows of x for W's gradient and frees them after the first backward:
    a second walk over the same graph rebuilds them."""
    rng = np.random.default_rng(6)
    x, W, b = (gradcore.Variable(xp.asarray(rng.standard_normal(s)))
               for s in (IMG, (4, 3, 3, 3), (4,)))
    y = (F.conv2d(x, W, b, stride=(2, 1), pad=1) ** 2).sum()
    y.backward()
    first = [xp.numpy(v.grad.data) for v in (x, W, b)]
    y.backward()
    for v, g in zip((x, W, b), first):
        np.testing.assert_allclose(xp.numpy(v.grad.data), 2 * g, rtol=1e-12, atol=1e-12)


def test_conv2d_bias_of_another_dtype_promotes(xp):
    """The bias is added in place only when its dtype is the result's: a float64 bias on float32
    data gives float64, as x @ W + b would."""
    x = gradcore.Variable(xp.asarray(np.ones(IMG), dtype="float32"))
    W = gradcore.Variable(xp.asarray(np.ones((2, 3, 1, 1)), dtype="float32"))
    b = gradcore.Variable(xp.asarray(np.array([0.5, 1e-9])))
    y = F.conv2d(x, W, b)
    assert y.dtype == xp.float64
    np.testing.assert_array_equal(xp.numpy(y.data)[0, :, 0, 0], [3.5, 3.0 + 1e-9])


def test_conv2d_without_grad_records_nothing(xp):
    x = gradcore.Variable(xp.asarray(np.ones(IMG)))
    W = gradcore.Variable(xp.asarray(np.ones((2, 3, 3, 3))))
    with gradcore.no_grad():
        y = F.conv2d(x, W, pad=1)
    assert y.creator is None
    np.testing.assert_array_equal(xp.numpy(y.data)[0, 0, 1:-1, 1:-1], 27.0)  # interior: 3*3*3 ones


# =============================================================================== errors
def _v(xp, shape):
    return gradcore.Variable(xp.asarray(np.ones(shape)))


@pytest.mark.parametrize("call, message", [
    (lambda xp: F.conv2d(_v(xp, IMG), _v(xp, (4, 2, 3, 3))),
     r"conv2d: x has 3 channels but W \(4, 2, 3, 3\) expects 2"),
    (lambda xp: F.conv2d(_v(xp, (3, 5, 4)), _v(xp, (4, 3, 3, 3))),
     r"conv2d: x must be 4-D \(N, C, H, W\), got 3-D shape \(3, 5, 4\); add a batch axis"),
    (lambda xp: F.conv2d(_v(xp, IMG), _v(xp, (4, 3, 6, 3))),
     r"conv2d: the kernel \(6, 3\) is larger than the padded input \(5, 4\)"),
    (lambda xp: F.conv2d(_v(xp, IMG), _v(xp, (4, 3, 3))),
     r"conv2d: W must be 4-D"),
    (lambda xp: F.conv2d(_v(xp, IMG), _v(xp, (4, 3, 3, 3)), _v(xp, (3,))),
     r"conv2d: b must have shape \(4,\)"),
    (lambda xp: F.deconv2d(_v(xp, IMG), _v(xp, (2, 4, 3, 3))),
     r"deconv2d: x has 3 channels but W \(2, 4, 3, 3\) expects 2"),
    (lambda xp: F.deconv2d(_v(xp, IMG), _v(xp, (3, 4, 3, 3)), stride=2, outsize=(20, 20)),
     r"deconv2d: an output of size \(20, 20\) does not give back the input size \(5, 4\)"),
    (lambda xp: F.deconv2d(_v(xp, (1, 2, 4, 4)), _v(xp, (2, 1, 3, 3)), outsize=(1, 1)),
     r"deconv2d: an output of size \(1, 1\) does not give back the input size \(4, 4\) .*; "
     r"pass outsize=None or a size that does"),
    (lambda xp: F.deconv2d(_v(xp, (1, 1, 1, 1)), _v(xp, (1, 1, 3, 3)), pad=2),
     r"deconv2d: an output of size \(-1, -1\) does not give back .*; use a smaller pad"),
    (lambda xp: F.pooling(_v(xp, (2, 3, 2, 2)), 3),
     r"pooling: the kernel \(3, 3\) is larger than the padded input \(2, 2\)"),
    (lambda xp: F.pooling(_v(xp, IMG), 2, stride=0),
     r"pooling: need kernel_size >= 1, stride >= 1 and pad >= 0"),
    (lambda xp: F.im2col(_v(xp, (5, 4)), 2),
     r"im2col: x must be 4-D"),
    (lambda xp: F.average_pooling(_v(xp, IMG), (2, 2, 2)),
     r"average_pooling: kernel_size, stride and pad must each be an int or a pair"),
    (lambda xp: F.col2im(_v(xp, (12, 27)), IMG[1:], 3, 2, 1),
     r"col2im: input_shape must be 4-D \(N, C, H, W\), got 3-D shape \(3, 5, 4\)$"),
    (lambda xp: F.deconv2d(_v(xp, IMG), _v(xp, (3, 4, 3, 3)), outsize=(1, 2, 3)),
     r"deconv2d: outsize must be None, an int or a pair of ints, got \(1, 2, 3\)"),
    (lambda xp: F.col2im(_v(xp, (12, 26)), IMG, 3, 2, 1),
     r"col2im: col has shape \(12, 26\) but an image of shape \(2, 3, 5, 4\) .* needs \(12, 27\)"),
])
def test_misuse_names_the_op(xp, call, message):
    with pytest.raises(ValueError, match=message):
        call(xp)


@float16_backends
def test_average_pooling_of_float16_sums_in_float32(xp):
    # four values of 30,000 add up past float16's 65,504: summed in float16 the mean is inf
    x = gradcore.Variable(xp.asarray(np.full((1, 1, 4, 4), 30_000.0), dtype="float16"))
    y = F.average_pooling(x, 2, stride=2)
    assert y.dtype == xp.float16
    np.testing.assert_array_equal(xp.numpy(y.data), np.full((1, 1, 2, 2), 30_000.0))
    y.backward()
    np.testing.assert_array_equal(xp.numpy(x.grad.data), np.full((1, 1, 4, 4), 0.25))


@float16_backends
@pytest.mark.parametrize("op", [F.conv2d, F.deconv2d])
def test_weight_gradient_of_float16_sums_the_batch_in_float32(xp, op):
    # NumPy adds along the batch axis one value at a time: in float16, 20,000 times 0.1 is 256
    # (two channels: with one, the batch axis of the products is contiguous and summed pairwise)
    x = gradcore.Variable(xp.asarray(np.full((20_000, 2, 1, 1), 0.1), dtype="float16"))
    W = gradcore.Variable(xp.ones((2, 2, 1, 1), dtype=xp.float16))
    op(x, W).backward()
    assert W.grad.dtype == xp.float16
    np.testing.assert_array_equal(xp.numpy(W.grad.data), np.full((2, 2, 1, 1), 2_000.0))
