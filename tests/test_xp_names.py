"""Every `xp.<name>` the ops read at run time on NumPy exists in CuPy, and takes the keywords
they pass it.

tests/test_backends.py scans the source for `xp.<name>`; this test catches what a scan cannot see
(`xp = self.xp; xp.foo(...)`, `getattr(xp, name)`, names reached through helpers, the engine's
own calls). It swaps the NumPy backend's `xp` for a recording stand-in, runs every row of the op
tables (tests/functions/test_*.py) through the whole harness, plus the utils, nn.init and
gradient clipping, and checks each name read against the cupy module, which imports without a
GPU, and each keyword passed against the CuPy function's signature where it has one (CuPy's
`clip` has no `max=`, its `linalg` no `diagonal`: both broke on the first GPU run before this
check looked at them).
"""
import contextlib
import importlib
import inspect
import math
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
# names gradcore reads with getattr(..., None) and, where a library lacks them, replaces by
# another (nn.init.orthogonal_): each is fine if the library has the one or the other
FALLBACKS = {"linalg.diagonal": "diagonal"}


class NameLog(dict):
    """name -> the labels of the runs that read it; `.keywords`: name -> {keyword: labels} for
    the keywords passed to the functions read."""

    def __init__(self):
        super().__init__()
        self.keywords = {}


class RecordingNamespace:
    """Forwards attribute reads to `module` and logs each name (dotted for submodules:
    `linalg.norm`) in `log` (a NameLog), and the keywords each function read is called with."""

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
        if callable(value) and not isinstance(value, (type, np.ufunc)):  # a function, not a dtype
            return self._logging_keywords(value, path)
        return value

    def _logging_keywords(self, function, path):
        def call(*args, **kwargs):
            for keyword in kwargs:
                labels = self._log.keywords.setdefault(path, {}).setdefault(keyword, set())
                labels.add(self._label[0])
            return function(*args, **kwargs)
        return call


@contextlib.contextmanager
def recording_numpy_xp():
    """Within the block, backends.NUMPY.xp logs every name read; yields (log, label), where
    label[0] is the name attached to reads (set it before each run). Restored on exit."""
    backend = backends.NUMPY
    saved = vars(backend).get("xp", None)
    own = "xp" in vars(backend)  # normally a class attribute: put it back the same way
    log, label = NameLog(), ["?"]
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
    """{dotted name: runs that read it} for every logged name `module` lacks, and {"name(kw=)":
    runs} for every keyword passed that `module`'s function of that name does not take."""
    missing = {}
    for path, labels in log.items():
        if _find(module, path) is None and (
                path not in FALLBACKS or _find(module, FALLBACKS[path]) is None):
            missing[path] = sorted(labels)
    for path, keywords in getattr(log, "keywords", {}).items():
        parameters = _parameters(_find(module, path))
        for keyword, labels in keywords.items():
            if parameters is not None and keyword not in parameters:
                missing[f"{path}({keyword}=)"] = sorted(labels)
    return missing


def _find(module, path):
    target = module
    for part in path.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return target


def _parameters(function):
    """The names `function` takes by keyword; None if it takes any (**kwargs) or has no
    signature to read (a ufunc, a compiled function)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


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


def run_nn_utils():
    """nn.init's fills and the gradient clippers: array code outside the op tables."""
    from gradcore.nn import init, utils
    for fill in (init.zeros_, init.ones_, init.normal_, init.uniform_, init.xavier_uniform_,
                 init.xavier_normal_, init.kaiming_uniform_, init.kaiming_normal_,
                 init.orthogonal_):
        fill(gradcore.Parameter(np.zeros((6, 4), np.float32)))
    init.constant_(gradcore.Parameter(np.zeros(3, np.float32)), 0.5)
    for norm_type in (2.0, 1.0, math.inf):
        p = gradcore.Parameter(np.ones(3, np.float32))
        p.grad = gradcore.Variable(np.full(3, 4.0, np.float32))
        utils.clip_grad_norm_([p], 1.0, norm_type)
    utils.clip_grad_value_([p], 0.1)


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
        label[0] = "nn.init, nn.utils"
        run_nn_utils()
    assert xp_state() == before and backends.NUMPY.xp is np
    assert {"sum", "matmul", "exp", "reshape", "broadcast_to", "ones_like", "clip"} <= set(log)
    assert "linalg.qr" in log and log.keywords
    assert missing_in(cupy, log) == {}


class _VecdotSum(gradcore.Function):
    def forward(self, x):
        return self.xp.vecdot(x, x)


def test_the_recording_catches_a_name_cupy_lacks():
    cupy = pytest.importorskip("cupy")
    # made outside the block: the first float64 Variable of a process reads xp.isdtype (dtype_kind
    # caches it), which the log would hold only when this test runs first
    x = gradcore.Variable(np.ones((2, 3)))
    before = xp_state()
    with recording_numpy_xp() as (log, label):
        label[0] = "vecdot-op"
        y = _VecdotSum()(x)
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


def test_a_keyword_the_other_library_does_not_take_is_caught():
    log = NameLog()
    log["clip"] = {"clip-op"}
    log.keywords["clip"] = {"max": {"clip-op"}}
    positional = types.SimpleNamespace(clip=lambda a, a_min, a_max, out=None: None)  # CuPy's
    assert missing_in(positional, log) == {"clip(max=)": ["clip-op"]}
    assert missing_in(types.SimpleNamespace(clip=lambda x, min=None, max=None: None), log) == {}
    assert missing_in(types.SimpleNamespace(clip=lambda *args, **kwargs: None), log) == {}
