"""The harness itself: every op has a row, and a wrong gradient is caught."""
import numpy as np
import pytest

import gradcore.functions as F
import test_activation
import test_conv
import test_linalg
import test_loss
import test_math
import test_nn
import test_reduce
import test_shape
from harness import directional_check

TABLES = [test_math, test_shape, test_reduce, test_linalg, test_conv, test_nn,
          test_activation, test_loss]
TESTED_ELSEWHERE = {
    "to",       # tests/test_variable.py: moves between devices
    "astype",   # tests/test_engine.py: gradients keep their input's dtype
}


def test_the_tables_cover_every_op():
    """A new op in gradcore.functions needs a row (or an entry above saying where it is tested)."""
    covered = {c.name.split("-")[0] for t in TABLES for c in t.CASES} | TESTED_ELSEWHERE
    ops = {name for name in F.__all__ if name[0].islower()}
    assert ops - covered == set()


class _WrongTanh(F.Tanh):
    """tanh whose backward forgets the square: 1 - y instead of 1 - y**2."""

    def backward(self, gy):
        y = self.outputs[0]()
        return gy * (1 - y)


class _WrongSecondTanh(F.Tanh):
    """Right first derivative, wrong second: y is detached, so d(1 - y**2)/dx is lost."""

    def backward(self, gy):
        y = self.outputs[0]().detach()
        return gy * (1 - y * y)


def test_the_check_catches_a_wrong_gradient(xp):
    rng = np.random.default_rng(0)
    arrays = [rng.uniform(-2, 2, size=(2, 3))]
    with pytest.raises(AssertionError, match="directional derivative"):
        directional_check(lambda x: _WrongTanh()(x), arrays, xp, rng)


def test_the_harness_catches_a_wrong_second_derivative(xp):
    from harness import Case, check_case

    case = Case("wrong-second", lambda x: _WrongSecondTanh()(x), np.tanh, ((2, 3),))
    with pytest.raises(AssertionError, match="directional derivative"):
        check_case(case, xp)
