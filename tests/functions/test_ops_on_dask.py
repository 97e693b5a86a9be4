"""Every row of the op tables on Dask (chunked, lazy arrays): forward, first and second order,
float32, by the same harness as on NumPy."""
import importlib

import pytest

from conftest import CASES as BACKENDS
from harness import check_case

TABLES = [t for t in ("activation", "conv", "device", "linalg", "loss", "math", "nn", "reduce", "shape")
          if hasattr(importlib.import_module(f"test_{t}"), "CASES")]
ROWS = [(f"{table}:{case.name}", case) for table in TABLES
        for case in importlib.import_module(f"test_{table}").CASES]


@pytest.fixture(scope="module")
def dask():
    return BACKENDS["dask"]()


@pytest.mark.parametrize("name, case", ROWS, ids=[name for name, _ in ROWS])
def test_op_on_dask(name, case, dask):
    check_case(case, dask)
