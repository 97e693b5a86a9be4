"""gradcore.functions: one row per op; forward against NumPy, backward by a directional check."""
from typing import Callable, NamedTuple

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from gradcheck import directional_check


class Case(NamedTuple):
    name: str
    fn: Callable          # Variables -> Variable
    ref: Callable         # NumPy arrays -> NumPy array
    shapes: tuple         # one shape per input
    domain: tuple = (-2.0, 2.0)  # inputs are drawn uniformly from here


def mm(a, b):
    return np.matmul(a, b)


POS = (0.5, 2.0)
# fmt: off
CASES = [
    Case("add",                F.add,                                np.add, ((2, 3), (2, 3))),
    Case("add-broadcast",      F.add,                                np.add, ((2, 1), (1, 3))),
    Case("add-rank",           F.add,                                np.add, ((3,), (2, 3))),
    Case("sub",                F.sub,                                np.subtract, ((2, 3), (2, 1))),
    Case("mul",                F.mul,                                np.multiply, ((2, 3), (3,))),
    Case("div",                F.div,                                np.divide, ((2, 3), (2, 3)), POS),
    Case("div-broadcast",      F.div,                                np.divide, ((2, 3), (1, 3)), POS),
    Case("neg",                F.neg,                                np.negative, ((2, 3),)),
    Case("pow-3",              lambda x: F.pow(x, 3),                lambda x: x ** 3, ((2, 3),)),
    Case("pow-half",           lambda x: F.pow(x, 0.5),              np.sqrt, ((4,),), POS),
    Case("pow-neg",            lambda x: F.pow(x, -2),               lambda x: x ** -2.0, ((4,),), POS),
    Case("square",             F.square,                             np.square, ((2, 3),)),
    Case("exp",                F.exp,                                np.exp, ((2, 3),)),
    Case("log",                F.log,                                np.log, ((2, 3),), POS),
    Case("sin",                F.sin,                                np.sin, ((2, 3),)),
    Case("cos",                F.cos,                                np.cos, ((2, 3),)),
    Case("tanh",               F.tanh,                               np.tanh, ((2, 3),)),
    Case("0-d",                lambda x: F.tanh(x) * x,              lambda x: np.tanh(x) * x, ((),)),
    Case("reshape",            lambda x: F.reshape(x, (3, 2)),       lambda x: x.reshape(3, 2), ((2, 3),)),
    Case("reshape-flat",       lambda x: F.reshape(x, -1),           lambda x: x.reshape(-1), ((2, 3, 2),)),
    Case("transpose",          F.transpose,                          np.transpose, ((2, 3),)),
    Case("transpose-axes",     lambda x: F.transpose(x, (1, 2, 0)),  lambda x: x.transpose(1, 2, 0), ((2, 3, 4),)),
    Case("sum",                F.sum,                                np.sum, ((2, 3),)),
    Case("sum-axis",           lambda x: F.sum(x, axis=1),           lambda x: x.sum(axis=1), ((2, 3, 4),)),
    Case("sum-neg-axis",       lambda x: F.sum(x, axis=-1),          lambda x: x.sum(axis=-1), ((2, 3),)),
    Case("sum-keepdims",       lambda x: F.sum(x, (0, 2), True),     lambda x: x.sum((0, 2), keepdims=True), ((2, 3, 4),)),
    Case("sum_to",             lambda x: F.sum_to(x, (1, 3)),        lambda x: x.sum(0, keepdims=True), ((2, 3),)),
    Case("sum_to-lead",        lambda x: F.sum_to(x, (3, 1)),        lambda x: x.sum((0, 2))[:, None], ((2, 3, 4),)),
    Case("sum_to-scalar",      lambda x: F.sum_to(x, ()),            np.sum, ((2, 3),)),
    Case("broadcast_to",       lambda x: F.broadcast_to(x, (2, 3)),  lambda x: np.broadcast_to(x, (2, 3)), ((1, 3),)),
    Case("broadcast_to-lead",  lambda x: F.broadcast_to(x, (4, 2, 3)), lambda x: np.broadcast_to(x, (4, 2, 3)), ((2, 1),)),
    Case("get_item",           lambda x: x[1:, ::2],                 lambda x: x[1:, ::2], ((3, 4),)),
    Case("get_item-int",       lambda x: x[1, ..., None],            lambda x: x[1, ..., None], ((3, 4),)),
    Case("matmul",             F.matmul,                             mm, ((2, 3), (3, 4))),
    Case("matmul-batched",     F.matmul,                             mm, ((2, 3, 4), (2, 4, 5))),
    Case("matmul-broadcast",   F.matmul,                             mm, ((2, 1, 3, 4), (5, 4, 2))),
    Case("matmul-1d-left",     F.matmul,                             mm, ((3,), (3, 4))),
    Case("matmul-1d-right",    F.matmul,                             mm, ((3, 4), (4,))),
    Case("matmul-1d-both",     F.matmul,                             mm, ((3,), (3,))),
    Case("matmul-1d-batched",  F.matmul,                             mm, ((4,), (2, 4, 3))),
    Case("matmul-batched-1d",  F.matmul,                             mm, ((2, 3, 4), (4,))),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op(case, xp):
    rng = np.random.default_rng(sum(map(ord, case.name)))
    lo, hi = case.domain
    arrays = [rng.uniform(lo, hi, size=shape) for shape in case.shapes]
    y = directional_check(case.fn, arrays, xp, rng)
    expected = case.ref(*arrays)
    assert y.shape == np.shape(expected)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)


def test_the_table_covers_every_op():
    """A new op in gradcore.functions needs a row (or an entry here saying where it is tested)."""
    tested_elsewhere = {"to", "get_item"}  # to: test_variable.py, device moves
    covered = {c.name.split("-")[0] for c in CASES} | tested_elsewhere
    ops = {name for name in F.__all__ if name[0].islower()}
    assert ops - covered == set()


class _WrongTanh(F.Tanh):
    """tanh whose backward forgets the square: 1 - y instead of 1 - y**2."""

    def backward(self, gy):
        y = self.outputs[0]()
        return gy * (1 - y)


def test_the_check_catches_a_wrong_gradient(xp):
    rng = np.random.default_rng(0)
    arrays = [rng.uniform(-2, 2, size=(2, 3))]
    with pytest.raises(AssertionError, match="directional derivative"):
        directional_check(lambda x: _WrongTanh()(x), arrays, xp, rng)


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
