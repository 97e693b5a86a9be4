"""gradcore.functions.shape: reshape, transpose, broadcast_to, sum_to, get_item. One row per op; tests/harness.py checks each."""
import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from harness import Case, check_case, ids


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
