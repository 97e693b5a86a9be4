"""Every `xp.<name>` the ops read at run time on NumPy exists in CuPy.

tests/test_backends.py scans the source for `xp.<name>`; this test catches what a scan cannot see
(`xp = self.xp; xp.foo(...)`, `getattr(xp, name)`, names reached through helpers, the engine's
own calls). It swaps the NumPy backend's `xp` for a recording stand-in, runs every row of the op
tables (tests/functions/test_*.py) through the whole harness, plus the utils, and checks each
name read against the cupy module, which imports without a GPU.
"""
import contextlib
import importlib
import pathlib
import types

import numpy as np
import pytest

import backends
import gradcore
import gradcore.functions as F
from conftest import CASES
from harness import check_case

TABLES = pathlib.Path(__file__).parent / "functions"


class RecordingNamespace:
    """Forwards attribute reads to `module` and logs each name (dotted for submodules:
    `linalg.norm`) in `log`: name -> the labels of the runs that read it."""

    def __init__(self, module, log, label, prefix=""):
        self._module = module
        self._log = log
        self._label = label  # a one-item list, so submodule wrappers see the current label
        self._prefix = prefix

    def __getattr__(self, name):
        value = getattr(self._module, name)
        if name.startswith("__") and name.endswith("__"):
            return value
        path = self._prefix + name
        self._log.setdefault(path, set()).add(self._label[0])
        if isinstance(value, types.ModuleType):
            return RecordingNamespace(value, self._log, self._label, path + ".")
        return value


@contextlib.contextmanager
def recording_numpy_xp():
    """Within the block, backends.NUMPY.xp logs every name read; yields (log, label), where
    label[0] is the name attached to reads (set it before each run). Restored on exit."""
    backend = backends.NUMPY
    saved = vars(backend).get("xp", None)
    own = "xp" in vars(backend)  # normally a class attribute: put it back the same way
    log, label = {}, ["?"]
    backend.xp = RecordingNamespace(np, log, label)
    try:
        yield log, label
    finally:
        if own:
            backend.xp = saved
        else:
            del backend.xp


def xp_state():
    """How backends.NUMPY holds its xp: (an instance attribute?, the value read)."""
    return "xp" in vars(backends.NUMPY), backends.NUMPY.xp


def missing_in(module, log):
    """{dotted name: runs that read it} for every logged name `module` lacks."""
    missing = {}
    for path, labels in log.items():
        target = module
        for part in path.split("."):
            target = getattr(target, part, None)
            if target is None:
                missing[path] = sorted(labels)
                break
    return missing


def table_cases():
    """Every Case row of tests/functions/test_*.py (any module with a CASES list)."""
    rows = []
    for path in sorted(TABLES.glob("test_*.py")):
        module = importlib.import_module(path.stem)
        rows.extend(getattr(module, "CASES", ()))
    return rows


def run_utils():
    """The utils' own array calls: numerical_grad, gradient_check, sum_to, comparisons."""
    x = gradcore.Variable(np.linspace(0.5, 1.5, 6).reshape(2, 3).astype(np.float32))
    assert gradcore.utils.gradient_check(lambda v: F.sum(F.tanh(v) * v, axis=1), x)
    gradcore.utils.sum_to(np.ones((4, 2, 3)), (2, 1))
    gradcore.utils.array_allclose(x, x.data)


def test_every_xp_name_read_at_run_time_exists_in_cupy(monkeypatch):
    cupy = pytest.importorskip("cupy")
    monkeypatch.syspath_prepend(str(TABLES))
    rows = table_cases()
    assert len(rows) > 40
    case = CASES["numpy"]()  # made outside the block: the harness's own reads are not logged
    before = xp_state()
    with recording_numpy_xp() as (log, label):
        for row in rows:
            label[0] = row.name
            try:
                check_case(row, case)
            except AssertionError:
                pass  # a wrong value is the table's own test's business; the names were read
        label[0] = "utils"
        run_utils()
    assert xp_state() == before and backends.NUMPY.xp is np
    assert {"sum", "matmul", "exp", "reshape", "broadcast_to", "ones_like"} <= set(log)
    assert missing_in(cupy, log) == {}


class _VecdotSum(gradcore.Function):
    def forward(self, x):
        return self.xp.vecdot(x, x)


def test_the_recording_catches_a_name_cupy_lacks():
    cupy = pytest.importorskip("cupy")
    before = xp_state()
    with recording_numpy_xp() as (log, label):
        label[0] = "vecdot-op"
        y = _VecdotSum()(gradcore.Variable(np.ones((2, 3))))
        np.testing.assert_array_equal(y.data, [3.0, 3.0])
        gradcore.Variable(np.ones(2)).xp.linalg.norm  # a submodule's name is dotted
    assert xp_state() == before
    assert set(log) == {"vecdot", "linalg", "linalg.norm"}
    expected = {} if hasattr(cupy, "vecdot") else {"vecdot": ["vecdot-op"]}
    assert missing_in(cupy, log) == expected
    assert missing_in(types.SimpleNamespace(linalg=types.SimpleNamespace()), log) == {
        "vecdot": ["vecdot-op"], "linalg.norm": ["vecdot-op"]}


@pytest.mark.parametrize("own", [True, False], ids=["instance-attribute", "class-attribute"])
def test_the_namespace_is_restored_when_a_run_fails(own, monkeypatch):
    # backends.register may copy xp onto the instance (a faster read) or leave it on the class
    if own:
        monkeypatch.setitem(vars(backends.NUMPY), "xp", np)
    else:
        monkeypatch.delitem(vars(backends.NUMPY), "xp", raising=False)
    before = xp_state()
    with pytest.raises(ZeroDivisionError):
        with recording_numpy_xp():
            assert isinstance(backends.NUMPY.xp, RecordingNamespace)
            1 / 0
    assert xp_state() == before and backends.NUMPY.xp is np
