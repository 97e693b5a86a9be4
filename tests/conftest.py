"""The `xp` fixture: every test that takes it runs on each backend and device gradcore supports.

NumPy; array-api-strict on its default device and on its fake `device1` (default-device arrays
still convert silently to NumPy, so `device1` is what proves nothing leaks to the host); CuPy when
a GPU is present (marked `gpu`, skipped cleanly without one).
"""
import glob
import os
import time

import numpy as np
import pytest

import array_api_strict
import backends
from backends.array_api_backend import ArrayAPIBackend

array_api_strict.set_array_api_strict_flags(api_version="2024.12")
# array-api-strict 2.6 does not export its array class by name: take it from an instance
STRICT_ARRAY = type(array_api_strict.asarray(0.0))
STRICT = backends.register(ArrayAPIBackend(array_api_strict, STRICT_ARRAY))
DEVICE1 = backends.Device(STRICT.device_type, "device1")
DEVICE2 = backends.Device(STRICT.device_type, "device2")


class Case:
    """One backend and device: `xp.asarray(...)` puts data there; other names are the namespace's."""

    def __init__(self, name, backend, device):
        self.name = name
        self.backend = backend
        self.device = device
        self.namespace = backend.xp

    def asarray(self, obj, dtype=None):
        """`obj` (NumPy array, list, scalar) as an array of this case; dtype a NumPy dtype name."""
        obj = np.asarray(obj, dtype=dtype)
        return self.backend.asarray(obj, device=self.device)

    def numpy(self, array):
        return self.backend.to_numpy(array)

    def __getattr__(self, name):
        return getattr(self.namespace, name)

    def __repr__(self):
        return self.name


def _cupy_case():
    backend = backends.get_backend("cupy")
    return Case("cupy", backend, backends.Device("cuda", 0))


def _dask_case():
    pytest.importorskip("dask.array", reason="needs the dask extra: pip install 'gradcore[dask]'")
    pytest.importorskip("array_api_compat", reason="needs the dask extra")
    return Case("dask", backends.get_backend("dask"), backends.Device("dask"))


CASES = {
    "numpy": lambda: Case("numpy", backends.NUMPY, backends.CPU),
    "dask": _dask_case,
    "strict": lambda: Case("strict", STRICT, backends.Device(STRICT.device_type, "CPU_DEVICE")),
    "strict-device1": lambda: Case("strict-device1", STRICT, DEVICE1),
    "cupy": _cupy_case,
}


_STARTED = time.time()


def pytest_sessionfinish(session, exitstatus):
    """Remove the topology files MPICH's mpiexec left in /tmp for this session's jobs that
    aborted (the tests of a failing rank): hydra writes /tmp/hydra_hwloc_xmlfile_* for its
    proxies and removes it as it exits, but not after an abort (9 a run, piling up on a CI
    machine). Only this user's, made since the session began and 5 seconds old: a job's
    proxies read the file as they start, so one starting elsewhere keeps its own, and one
    running loses nothing it still reads."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller cleans up
        return
    now = time.time()
    for path in glob.glob("/tmp/hydra_hwloc_xmlfile_*"):
        try:
            made = os.stat(path)
            if made.st_uid == os.getuid() and _STARTED <= made.st_mtime <= now - 5:
                os.remove(path)
        except OSError:  # gone already, or not ours to remove
            pass


def pytest_collection_modifyitems(config, items):
    if backends.cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=[
    "numpy", "strict", "strict-device1", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request):
    return CASES[request.param]()


@pytest.fixture(params=["numpy", "strict-device1", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp2(request):
    """The shorter list for costlier tests: NumPy, array-api-strict device1, CuPy."""
    return CASES[request.param]()


def run_in_threads(targets, switch_interval=1e-6):
    """Run each callable of `targets` in a thread of its own and wait for them all, Python
    switching threads every `switch_interval` seconds meanwhile (a race shows at once)."""
    import sys
    import threading

    interval = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval)
    try:
        threads = [threading.Thread(target=target) for target in targets]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)


def forked_while(holding, child):
    """True if `child()` comes out true in the child of an os.fork made while another thread is
    inside `holding(inside, release)`, which sets the Event `inside` once there and then waits
    for `release` (a multiprocessing worker started mid-work). The child leaves by os._exit
    whatever happens, killed after 10 s. Skips where os.fork does not exist."""
    import os
    import signal
    import threading

    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    inside, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=holding, args=(inside, release))
    thread.start()
    assert inside.wait(10)
    try:
        pid = os.fork()
        if pid == 0:
            right = False
            try:  # never back into the parent's tests
                signal.alarm(10)
                right = child()
            finally:
                os._exit(0 if right else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join()
    return os.waitstatus_to_exitcode(status) == 0


def forked_child_takes(module, names):
    """Fork while another thread holds the locks `module.<name>`: True if the child takes each
    at once, as it must, that thread not existing there."""
    def hold(inside, release):
        locks = [getattr(module, name) for name in names]
        for lock in locks:
            lock.acquire()
        inside.set()
        release.wait(10)
        for lock in locks:
            lock.release()

    return forked_while(hold, lambda: all(getattr(module, name).acquire(timeout=2)
                                          for name in names))
