"""gradcore's benchmarks: each workload timed in gradcore, by hand in NumPy/CuPy, and in PyTorch.

Run them with `python -m benchmarks` (or `make bench`). A workload is one module here that
declares `WORKLOAD = common.Workload(...)`; to add one, write the module and name it below.
"""
import importlib

from .common import Workload

# The suite, in the order it runs and prints.
WORKLOADS = ("chain", "wide", "hod", "mlp", "conv", "deep", "deep_checkpoint", "leak", "big")


def load(names=None):
    """The Workload records named in `names` (default: all), in suite order."""
    names = list(WORKLOADS) if not names else list(dict.fromkeys(names))
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s): {', '.join(unknown)}; "
                         f"known: {', '.join(WORKLOADS)}")
    workloads = []
    for name in WORKLOADS:
        if name in names:
            workload = importlib.import_module(f"{__name__}.{name}").WORKLOAD
            assert isinstance(workload, Workload) and workload.name == name, name
            workloads.append(workload)
    return workloads
