"""gradcore.functions.reduce: sum. One row per op; tests/harness.py checks each."""
import numpy as np
import pytest

import gradcore.functions as F
from harness import Case, check_case, ids


# fmt: off
CASES = [
    Case("sum",                F.sum,                                np.sum, ((2, 3),)),
    Case("sum-axis",           lambda x: F.sum(x, axis=1),           lambda x: x.sum(axis=1), ((2, 3, 4),)),
    Case("sum-neg-axis",       lambda x: F.sum(x, axis=-1),          lambda x: x.sum(axis=-1), ((2, 3),)),
    Case("sum-keepdims",       lambda x: F.sum(x, (0, 2), True),     lambda x: x.sum((0, 2), keepdims=True), ((2, 3, 4),)),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_op(case, xp):
    check_case(case, xp)
