"""gradcore.functions.math: arithmetic with broadcasting, pow, exp, log, trigonometry, tanh. One row per op; tests/harness.py checks each."""
import numpy as np
import pytest

import gradcore.functions as F
from harness import Case, check_case, ids

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
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_op(case, xp):
    check_case(case, xp)
