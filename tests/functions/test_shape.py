"""gradcore.functions.shape: reshape, expand_dims, squeeze, flatten, transpose, broadcast_to, sum_to,
concatenate, stack, split, get_item. One row per op; tests/harness.py checks each."""
import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from float16_backends import float16_backends
from harness import Case, check_case, ids

REPEATED = np.array([0, 2, 0, 3, 0])          # rows of a (4, 3) array, 0 three times
ROWS, COLS = np.array([0, 1, 2, 0, 0]), np.array([1, 1, 0, 1, 2])  # (0, 1) twice
MASK = np.array([[True, False, True], [False, False, True], [True, True, False], [False, True, True]])


def split_ref(x, points, axis):
    return np.split(x, points, axis)


# fmt: off
CASES = [
    Case("reshape",            lambda x: F.reshape(x, (3, 2)),       lambda x: x.reshape(3, 2), ((2, 3),)),
    Case("reshape-flat",       lambda x: F.reshape(x, -1),           lambda x: x.reshape(-1), ((2, 3, 2),)),
    Case("transpose",          F.transpose,                          np.transpose, ((2, 3),)),
    Case("transpose-axes",     lambda x: F.transpose(x, (1, 2, 0)),  lambda x: x.transpose(1, 2, 0), ((2, 3, 4),)),
    Case("sum_to",             lambda x: F.sum_to(x, (1, 3)),        lambda x: x.sum(0, keepdims=True), ((2, 3),)),
    Case("sum_to-lead",        lambda x: F.sum_to(x, (3, 1)),        lambda x: x.sum((0, 2))[:, None], ((2, 3, 4),)),
    Case("sum_to-scalar",      lambda x: F.sum_to(x, ()),            np.sum, ((2, 3),)),
    Case("broadcast_to",       lambda x: F.broadcast_to(x, (2, 3)),  lambda x: np.broadcast_to(x, (2, 3)), ((1, 3),)),
    Case("broadcast_to-lead",  lambda x: F.broadcast_to(x, (4, 2, 3)), lambda x: np.broadcast_to(x, (4, 2, 3)), ((2, 1),)),
    Case("get_item",           lambda x: x[1:, ::2],                 lambda x: x[1:, ::2], ((3, 4),)),
    Case("get_item-int",       lambda x: x[1, ..., None],            lambda x: x[1, ..., None], ((3, 4),)),
    Case("get_item-0-d",       lambda x: x[2, -1],                   lambda x: x[2, -1], ((3, 4),)),
    # integer arrays and masks: repeated indices must add up in the gradient
    Case("get_item-array",     lambda x, i: x[i],                    lambda x, i: x[i], ((4, 3),), args=(REPEATED,)),
    Case("get_item-array-2d",  lambda x, i: x[i],                    lambda x, i: x[i], ((4, 3),), args=(np.array([[0, 1], [1, -1]]),)),
    Case("get_item-list",      lambda x: F.get_item(x, [0, 0, -1]),  lambda x: x[[0, 0, -1]], ((4, 3),)),
    Case("get_item-pairs",     lambda x, i, j: x[i, j],              lambda x, i, j: x[i, j], ((4, 3),), args=(ROWS, COLS)),
    Case("get_item-slice-arr", lambda x, j: x[1:, j],                lambda x, j: x[1:, j], ((4, 3),), args=(COLS,)),
    Case("get_item-apart",     lambda x, i, j: x[i, :, j],           lambda x, i, j: x[i, :, j], ((3, 2, 4),), args=(ROWS[:3], COLS[:3])),
    Case("get_item-int-arr",   lambda x, j: x[:, 1, j],              lambda x, j: x[:, 1, j], ((2, 3, 4),), args=(COLS,)),
    Case("get_item-newaxis",   lambda x, i: x[None, i, ..., None],   lambda x, i: x[None, i, ..., None], ((4, 3),), args=(REPEATED,)),
    Case("get_item-mask",      lambda x, m: x[m],                    lambda x, m: x[m], ((4, 3),), args=(MASK,)),
    Case("get_item-mask-rows", lambda x, m: x[m],                    lambda x, m: x[m], ((4, 3),), args=(MASK[:, 0],)),
    # bounds past the ends, clipped as NumPy clips them (the last batch of x[i:i + B])
    Case("get_item-past-end",  lambda x: x[2:10, -5:2],              lambda x: x[2:10, -5:2], ((4, 3),)),
    Case("get_item-past-rev",  lambda x: x[-1:-6:-1, 9::-2],         lambda x: x[-1:-6:-1, 9::-2], ((4, 3),)),
    Case("get_item-past-arr",  lambda x, j: x[:10, j],               lambda x, j: x[:10, j], ((4, 3),), args=(COLS,)),
    Case("expand_dims",        lambda x: F.expand_dims(x, 1),        lambda x: np.expand_dims(x, 1), ((2, 3),)),
    Case("expand_dims-neg",    lambda x: F.expand_dims(x, -1),       lambda x: np.expand_dims(x, -1), ((2, 3),)),
    Case("expand_dims-tuple",  lambda x: F.expand_dims(x, (0, 3)),   lambda x: np.expand_dims(x, (0, 3)), ((2, 3),)),
    Case("expand_dims-0-d",    lambda x: F.expand_dims(x, 0),        lambda x: np.expand_dims(x, 0), ((),)),
    Case("squeeze",            F.squeeze,                            np.squeeze, ((2, 1, 3, 1),)),
    Case("squeeze-axis",       lambda x: F.squeeze(x, -1),           lambda x: np.squeeze(x, -1), ((2, 1, 3, 1),)),
    Case("squeeze-tuple",      lambda x: F.squeeze(x, (0, 2)),       lambda x: np.squeeze(x, (0, 2)), ((1, 3, 1),)),
    Case("flatten",            F.flatten,                            lambda x: x.reshape(2, -1), ((2, 3, 4),)),
    Case("flatten-1d",         F.flatten,                            lambda x: x.reshape(3, 1), ((3,),)),
    Case("concatenate",        lambda a, b: F.concatenate([a, b]),   lambda a, b: np.concatenate([a, b]), ((2, 3), (1, 3))),
    Case("concatenate-axis",   lambda a, b, c: F.concatenate((a, b, c), axis=-1), lambda a, b, c: np.concatenate((a, b, c), -1), ((2, 3), (2, 1), (2, 2))),
    Case("concatenate-one",    lambda a: F.concatenate([a], 1),      lambda a: a, ((2, 3),)),
    Case("stack",              lambda a, b: F.stack([a, b]),         lambda a, b: np.stack([a, b]), ((2, 3), (2, 3))),
    Case("stack-axis",         lambda a, b, c: F.stack([a, b, c], axis=-1), lambda a, b, c: np.stack([a, b, c], -1), ((2, 3), (2, 3), (2, 3))),
    Case("stack-0-d",          lambda a, b: F.stack([a, b]),         lambda a, b: np.stack([a, b]), ((), ())),
    Case("split",              lambda x: F.split(x, 2)[0] * F.split(x, 2)[1], lambda x: np.split(x, 2)[0] * np.split(x, 2)[1], ((4, 3),)),
    Case("split-points",       lambda x: F.concatenate(F.split(x, [1, 3], 1)[::-1], 1), lambda x: np.concatenate(split_ref(x, [1, 3], 1)[::-1], 1), ((2, 5),)),
    Case("split-one-used",     lambda x: F.split(x, [-1], axis=-1)[0], lambda x: x[..., :-1], ((2, 3, 4),)),
    Case("split-reversed",     lambda x: F.stack(F.split(x, 3, 1)[::-1]), lambda x: np.stack(np.split(x, 3, 1)[::-1]), ((2, 3),)),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_op(case, xp):
    check_case(case, xp)


# =============================================================================== shape errors
@pytest.mark.parametrize("op, shape, message", [
    (F.sum_to, (3, 2), r"sum_to: cannot sum shape \(2, 3\) to shape \(3, 2\)"),
    (F.sum_to, (4, 2, 3), r"sum_to: cannot sum shape \(2, 3\) to the larger shape \(4, 2, 3\)"),
    (F.broadcast_to, (3, 3), r"broadcast_to: .*\(inputs: \(2, 3\)\)"),
    (F.reshape, (4, 2), r"reshape: .*\(inputs: \(2, 3\)\)"),
])
def test_shape_ops_reject_impossible_shapes(xp, op, shape, message):
    x = gradcore.Variable(xp.asarray(np.ones((2, 3))))
    with pytest.raises(ValueError, match=message):
        op(x, shape)
    assert x.creator is None and x.grad is None


# =============================================================================== axis errors
@pytest.mark.parametrize("op, message", [
    (lambda x: F.expand_dims(x, 3), r"expand_dims: axis 3 is out of range for the result of 3 dimension"),
    (lambda x: F.expand_dims(x, (0, 0)), r"expand_dims: repeated axis in \(0, 0\)"),
    (lambda x: F.squeeze(x, 1), r"squeeze: cannot squeeze axis 1 of size 3"),
    (lambda x: F.squeeze(x, -3), r"squeeze: axis -3 is out of range for an array of 2 dimension"),
    (lambda x: F.concatenate([x, x], axis=2), r"concatenate: axis 2 is out of range for an array of 2"),
    (lambda x: F.concatenate([x, x[:, :2]], axis=0), r"concatenate: input shapes must match except along the joined axis: got \(2, 3\) and \(2, 2\)"),
    (lambda x: F.concatenate([x, x[0]]), r"concatenate: input shapes must match .* \(2, 3\) and \(3,\)"),
    (lambda x: F.stack([x, x], axis=3), r"stack: axis 3 is out of range for the result of 3 dimension"),
    (lambda x: F.stack([x, x[:, :2]]), r"stack: input shapes must match exactly: got \(2, 3\) and \(2, 2\)"),
    (lambda x: F.split(x, 2, axis=1), r"split: axis 1 of size 3 cannot be split into 2 equal sections"),
    (lambda x: F.split(x, 0, axis=1), r"split: axis 1 of size 3 cannot be split into 0 equal sections"),
    (lambda x: F.split(x, 1, axis=2), r"split: axis 2 is out of range"),
])
def test_shape_ops_name_themselves_in_errors(xp, op, message):
    x = gradcore.Variable(xp.asarray(np.ones((2, 3))))
    with pytest.raises(ValueError, match=message):
        op(x)
    assert x.creator is None and x.grad is None


def test_joining_needs_a_list(xp):
    x = gradcore.Variable(xp.asarray(np.ones((2, 3))))
    with pytest.raises(TypeError, match="concatenate: expects a list or tuple of arrays, got Variable"):
        F.concatenate(x)
    with pytest.raises(ValueError, match="stack: needs at least one array"):
        F.stack([])
    with pytest.raises(ValueError, match="flatten: the input needs at least one axis"):
        F.flatten(gradcore.Variable(xp.asarray(1.0)))


def test_split_returns_pieces_and_a_dead_piece_gets_zeros(xp):
    x = gradcore.Variable(xp.asarray(np.arange(12.0).reshape(3, 4)))
    pieces = F.split(x, [1, 3], axis=1)
    assert isinstance(pieces, tuple) and [p.shape for p in pieces] == [(3, 1), (3, 2), (3, 1)]
    np.testing.assert_array_equal(xp.numpy(pieces[1].data), [[1, 2], [5, 6], [9, 10]])
    y = pieces[1] * 2.0
    del pieces  # the other pieces die: their gradient is zero
    y.backward()
    expected = np.zeros((3, 4))
    expected[:, 1:3] = 2.0
    np.testing.assert_array_equal(xp.numpy(x.grad.data), expected)


# =============================================================================== get_item
def test_get_item_repeated_indices_add_up(xp):
    x = gradcore.Variable(xp.asarray(np.arange(12.0).reshape(4, 3)))
    y = x[np.array([0, 2, 0, 0])]
    np.testing.assert_array_equal(xp.numpy(y.data), np.arange(12.0).reshape(4, 3)[[0, 2, 0, 0]])
    y.backward()
    np.testing.assert_array_equal(xp.numpy(x.grad.data)[:, 0], [3.0, 0.0, 1.0, 0.0])
    x.cleargrad()
    x[np.array([1, 1, 3]), np.array([2, 2, 0])].backward()
    expected = np.zeros((4, 3))
    expected[1, 2], expected[3, 0] = 2.0, 1.0
    np.testing.assert_array_equal(xp.numpy(x.grad.data), expected)


def test_get_item_moves_the_index_to_the_data(xp):
    """NumPy arrays, lists, Variables and backend arrays on another device all index device data."""
    x = gradcore.Variable(xp.asarray(np.arange(6.0).reshape(3, 2)))
    indices = [np.array([2, 0, 2]), [2, 0, 2], gradcore.Variable(np.array([2, 0, 2])),
               xp.asarray(np.array([2, 0, 2]))]
    if xp.name.startswith("strict"):
        from conftest import DEVICE2
        indices.append(xp.backend.asarray(np.array([2, 0, 2]), device=DEVICE2))
    for index in indices:
        x.cleargrad()
        y = F.get_item(x, index)
        assert y.device == x.device
        np.testing.assert_array_equal(xp.numpy(y.data), [[4, 5], [0, 1], [4, 5]])
        y.backward()
        assert x.grad.device == x.device
        np.testing.assert_array_equal(xp.numpy(x.grad.data), [[1, 1], [0, 0], [2, 2]])


def test_get_item_with_an_empty_index(xp):
    x = gradcore.Variable(xp.asarray(np.ones((3, 2))))
    for index in ([], np.array([], dtype=np.int64), np.zeros(3, dtype=bool)):
        x.cleargrad()
        y = F.get_item(x, index)
        assert y.shape == (0, 2)
        y.backward()
        np.testing.assert_array_equal(xp.numpy(x.grad.data), np.zeros((3, 2)))


@pytest.mark.parametrize("index, error, message", [
    (np.array([0, 3]), IndexError, r"get_item: index 3 is out of bounds for axis 0 with size 3 \(inputs: \(3, 4\)\)"),
    (np.array([-4, 0]), IndexError, r"get_item: index -4 is out of bounds for axis 0 with size 3"),
    ([5], IndexError, r"get_item: index 5 is out of bounds for axis 0 with size 3"),
    ((slice(None), np.array([[1], [4]])), IndexError, r"get_item: index 4 is out of bounds for axis 1 with size 4"),
    ((0, 7), IndexError, r"get_item: index 7 is out of bounds for axis 1 with size 4"),
    (np.array([0.0, 1.0]), TypeError, r"get_item: index arrays must have an integer or boolean dtype, got .*float"),
    ([0.5], TypeError, r"get_item: index arrays must have an integer or boolean dtype, got .*float"),
    (1.5, TypeError, r"get_item: indices must be ints, slices, None, Ellipsis, .*got 1.5"),
    (np.array([True, False]), IndexError, r"get_item: a boolean index of shape \(2,\) does not match the shape \(3,\)"),
    ((0, 0, 0), IndexError, r"get_item: too many indices: 3 for an array of 2 dimension"),
    (([0, 1], [0, 1, 2]), IndexError, r"get_item: index arrays could not be broadcast together, shapes \(2,\) and \(3,\)"),
    ((Ellipsis, 0, Ellipsis), IndexError, r"get_item: an index can only have a single ellipsis"),
])
def test_get_item_rejects_bad_indices_on_every_backend(xp, index, error, message):
    """CuPy would wrap an out-of-range index silently: get_item checks bounds itself."""
    x = gradcore.Variable(xp.asarray(np.ones((3, 4))))
    with pytest.raises(error, match=message):
        F.get_item(x, index)
    assert x.creator is None and x.grad is None


def test_get_item_second_derivative_through_repeated_indices(xp):
    """d/dx sum(w * x[i]**2) = 2 * scatter(w * x[i]); its derivative in x again adds the repeats."""
    x = gradcore.Variable(xp.asarray(np.array([1.0, 2.0, 3.0])))
    i = np.array([0, 0, 2])
    (g,) = gradcore.grad(F.sum(x[i] ** 2), [x], create_graph=True)
    # within a few ulp, not equal: the backward of x**2 computes 2 * x**1, and CUDA's pow is
    # accurate to 2 ulp, not exact (on a GPU, index 2 came out 5.999999999999999)
    np.testing.assert_allclose(xp.numpy(g.data), [4.0, 0.0, 6.0], rtol=1e-15)
    (gg,) = gradcore.grad(F.sum(g * g), [x])  # sum(g**2) = 16 x0**2 + 4 x2**2
    np.testing.assert_allclose(xp.numpy(gg.data), [32.0, 0.0, 24.0], rtol=1e-15)


def test_numpy_integers_are_taken_as_axes_sections_and_numbers(xp):
    # as NumPy and PyTorch take them (an axis read back from an array is a NumPy integer)
    a = np.arange(12.0).reshape(3, 4)
    x = gradcore.Variable(xp.asarray(a))
    one, two = np.int64(1), np.int64(2)
    np.testing.assert_array_equal(xp.numpy(F.sum(x, one).data), a.sum(1))
    np.testing.assert_array_equal(xp.numpy(F.sum(x, (np.int32(0), one)).data), a.sum())
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(xp.numpy(F.softmax(x, one).data), e / e.sum(1, keepdims=True))
    np.testing.assert_array_equal(xp.numpy(F.concatenate([x, x], one).data),
                                  np.concatenate([a, a], 1))
    np.testing.assert_array_equal(xp.numpy(F.stack([x, x], np.int64(-1)).data),
                                  np.stack([a, a], -1))
    for piece, expected in zip(F.split(x, two, one), np.split(a, 2, 1)):
        np.testing.assert_array_equal(xp.numpy(piece.data), expected)
    np.testing.assert_array_equal(xp.numpy((x ** two).data), a ** 2)
    np.testing.assert_array_equal(xp.numpy(F.leaky_relu(x - 6.0, np.float32(0.5)).data),
                                  np.where(a > 6, a - 6, 0.5 * (a - 6)))


def test_get_item_takes_0_d_boolean_masks(xp):
    # NumPy: a 0-d mask adds an axis of length 1 (True) or 0 (False) where it stands, and
    # indexes it as an index array would (placed and broadcast with the others)
    a = np.arange(12.0).reshape(3, 4)
    positions = np.arange(12).reshape(3, 4)
    keys = [np.array(True), np.False_, (slice(None), np.True_, [0, 1]), (0, np.True_),
            (np.True_, Ellipsis, np.True_), (np.True_, None, 1), (np.True_, a > 5)]
    for key in keys:
        x = gradcore.Variable(xp.asarray(a))
        there = tuple(xp.asarray(k) if isinstance(k, np.ndarray) and k.ndim else k
                      for k in (key if isinstance(key, tuple) else (key,)))
        y = x[there]
        np.testing.assert_array_equal(xp.numpy(y.data), a[key])
        w = np.random.default_rng(0).standard_normal(a[key].shape)
        F.sum(y * xp.asarray(w)).backward()
        expected = np.zeros(12)
        np.add.at(expected, positions[key], w)
        np.testing.assert_array_equal(xp.numpy(x.grad.data), expected.reshape(3, 4))


def test_split_reads_its_points_as_np_split_does(xp):
    # negative points count from the end, all are clipped to the axis, and a point before the
    # previous one gives an empty piece and pieces that overlap (each adds its gradient)
    a = np.arange(10.0).reshape(5, 2)
    for points in ([-10, 2], [-2], [3, 1], [4, -3, 2, 7, 1]):
        x = gradcore.Variable(xp.asarray(a))
        pieces = F.split(x, points)
        expected = np.split(a, points)
        assert len(pieces) == len(expected)
        for piece, e in zip(pieces, expected):
            np.testing.assert_array_equal(xp.numpy(piece.data), e)
        F.sum(F.concatenate([p * (i + 1.0) for i, p in enumerate(pieces)])).backward()
        rows = np.zeros(5)
        for i, rows_taken in enumerate(np.split(np.arange(5), points)):
            rows[rows_taken] += i + 1.0
        np.testing.assert_array_equal(xp.numpy(x.grad.data), np.repeat(rows[:, None], 2, 1))


@float16_backends
def test_sum_to_of_float16_accumulates_in_float32(xp):
    # the engine sums every broadcast gradient with sum_to: here the bias gradient of x + b
    gy = xp.asarray(np.full((10_000, 2), 0.1), dtype="float16")
    x = gradcore.Variable(xp.asarray(np.zeros((10_000, 2)), dtype="float16"))
    b = gradcore.Variable(xp.asarray(np.zeros(2), dtype="float16"))
    (x + b).backward(gy)
    assert b.grad.dtype == xp.float16
    np.testing.assert_array_equal(xp.numpy(b.grad.data), [1000.0, 1000.0])  # not 256
    y = F.sum_to(gradcore.Variable(gy), (1, 2))
    assert y.dtype == xp.float16
    np.testing.assert_array_equal(xp.numpy(y.data), [[1000.0, 1000.0]])
