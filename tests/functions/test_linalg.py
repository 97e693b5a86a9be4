"""gradcore.functions.linalg: matmul. One row per op; tests/harness.py checks each."""
import numpy as np
import pytest

import gradcore.functions as F
from harness import Case, check_case, ids


def mm(a, b):
    return np.matmul(a, b)


# fmt: off
CASES = [
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


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_op(case, xp):
    check_case(case, xp)
