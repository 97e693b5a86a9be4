"""CuPy computes on the *current* GPU, not the array's: every forward and backward of a Function
must run inside its inputs' device context. With one GPU (or none) that cannot be seen on CuPy,
so a stand-in backend with two devices records which device each computation ran under."""
import contextlib

import numpy as np
import pytest

import array_api_strict
import backends
import gradcore
import gradcore.functions as F
from backends.array_api_backend import ArrayAPIBackend


class ContextRecordingBackend(ArrayAPIBackend):
    """array-api-strict under another name, needing a device context as CuPy does."""

    needs_device_context = True

    def __init__(self):
        super().__init__(array_api_strict, type(array_api_strict.asarray(0.0)), name="ctxstrict")
        self.current = None  # the device whose context is entered, like CUDA's current device
        self.entered = []

    @contextlib.contextmanager
    def device_context(self, device):
        previous, self.current = self.current, device
        self.entered.append(device)
        try:
            yield
        finally:
            self.current = previous


class CurrentDeviceCheck(gradcore.Function):
    """x * 2, asserting in forward and backward that the current device is x's device."""

    def forward(self, x):
        assert self.backend.current == self.backend.device_of(x), "forward outside its device"
        return x * 2

    def backward(self, gy):
        backend = self.backend
        assert backend.current == backend.device_of(gy.data), "backward outside its device"
        return gy * 2


@pytest.fixture
def ctx_backend(monkeypatch):
    backend = ContextRecordingBackend()
    # registered for this test only: the array type must keep mapping to array-api-strict after
    monkeypatch.setitem(backends._by_name, backend.name, backend)
    monkeypatch.setitem(backends._by_device_type, backend.device_type, backend)
    monkeypatch.setitem(backends._by_type, backend.array_type, backend)
    return backend


@pytest.mark.parametrize("device", ["device1", "device2"])
def test_forward_and_backward_run_under_the_inputs_device(ctx_backend, device):
    dev = backends.Device(ctx_backend.device_type, device)
    x = gradcore.Variable(ctx_backend.asarray(np.array([1.0, 2.0]), device=dev))
    y = F.sum(CurrentDeviceCheck()(F.tanh(x)))
    assert ctx_backend.current is None and ctx_backend.entered
    assert set(ctx_backend.entered) == {dev}  # every forward ran under dev
    ctx_backend.entered.clear()
    y.backward()
    assert set(ctx_backend.entered) == {dev}  # and every backward too
    expected = 2 * (1 - np.tanh([1.0, 2.0]) ** 2)
    np.testing.assert_allclose(ctx_backend.to_numpy(x.grad.data), expected)


def test_two_graphs_on_two_devices_each_keep_their_own_context(ctx_backend):
    d1 = backends.Device(ctx_backend.device_type, "device1")
    d2 = backends.Device(ctx_backend.device_type, "device2")
    a = gradcore.Variable(ctx_backend.asarray(np.array([0.5]), device=d1))
    b = gradcore.Variable(ctx_backend.asarray(np.array([1.5]), device=d2))
    ya = CurrentDeviceCheck()(F.sin(a))
    yb = CurrentDeviceCheck()(F.sin(b))
    ctx_backend.entered.clear()
    (ya.sum() + yb.sum().to(d1)).backward()  # one walk crosses both devices
    assert set(ctx_backend.entered) == {d1, d2}
    np.testing.assert_allclose(ctx_backend.to_numpy(a.grad.data), 2 * np.cos([0.5]))
    np.testing.assert_allclose(ctx_backend.to_numpy(b.grad.data), 2 * np.cos([1.5]))
