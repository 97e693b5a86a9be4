"""Grad mode and train mode: context managers, nesting, restoring, and one setting per thread."""
import threading

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from gradcore import Config, Variable


def test_no_grad_and_enable_grad_nest(xp):
    x = Variable(xp.asarray([1.0, 2.0]))
    assert gradcore.is_grad_enabled()
    with gradcore.no_grad():
        assert not gradcore.is_grad_enabled()
        assert F.exp(x).creator is None
        with gradcore.enable_grad():
            assert gradcore.is_grad_enabled()
            y = F.exp(x)
            assert y.creator is not None
        assert not gradcore.is_grad_enabled()
    assert gradcore.is_grad_enabled()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp([1.0, 2.0]), rtol=1e-14)


def test_settings_are_restored_after_an_exception():
    with pytest.raises(KeyError):
        with gradcore.no_grad():
            with gradcore.test_mode():
                raise KeyError("inside")
    assert Config.enable_backprop is True and Config.train is True


def test_test_mode_and_using_config():
    assert Config.train is True
    with gradcore.test_mode():
        assert Config.train is False
        assert gradcore.is_grad_enabled()  # test mode is not no_grad
    assert Config.train is True
    with gradcore.using_config("enable_backprop", False):
        assert (Variable(1.0) * 2).creator is None and not gradcore.is_grad_enabled()
    assert gradcore.is_grad_enabled()


def test_using_config_rejects_unknown_settings():
    with pytest.raises(AttributeError, match="no setting 'enable_grad'"):
        with gradcore.using_config("enable_grad", False):
            pass
    assert not hasattr(Config, "enable_grad")


def _run_in_thread(target):
    errors = []

    def wrapped():
        try:
            target()
        except BaseException as e:  # noqa: BLE001 -- re-raised in the main thread
            errors.append(e)

    thread = threading.Thread(target=wrapped)
    thread.start()
    return thread, errors


def test_no_grad_in_one_thread_does_not_reach_another():
    x = Variable(np.array([1.0, 2.0]))
    inside = threading.Event()   # the worker is inside no_grad()
    checked = threading.Event()  # the main thread has recorded a graph meanwhile
    seen = {}

    def worker():
        with gradcore.no_grad():
            inside.set()
            seen["worker_records"] = F.square(x).creator is not None
            assert checked.wait(timeout=10), "the main thread never checked"
            seen["worker_still_off"] = not gradcore.is_grad_enabled()
        seen["worker_after"] = gradcore.is_grad_enabled()

    thread, errors = _run_in_thread(worker)
    assert inside.wait(timeout=10)
    # the worker sits inside no_grad() now; this thread must still record
    assert gradcore.is_grad_enabled()
    y = F.square(x)
    assert y.creator is not None and y.generation == 1
    checked.set()
    thread.join(timeout=10)
    assert not thread.is_alive() and not errors, errors
    assert seen == {"worker_records": False, "worker_still_off": True, "worker_after": True}


def test_no_grad_in_the_main_thread_does_not_reach_a_worker():
    x = Variable(np.array(3.0))
    barrier = threading.Barrier(2, timeout=10)
    seen = {}

    def worker():
        barrier.wait()  # 1: the main thread is inside no_grad()
        y = x * x
        seen["creator"] = y.creator is not None
        seen["grad"] = gradcore.grad(y, x)[0].item()
        barrier.wait()  # 2: done while the main thread is still inside no_grad()

    thread, errors = _run_in_thread(worker)
    with gradcore.no_grad():
        barrier.wait()
        barrier.wait()
        assert (x * x).creator is None
    thread.join(timeout=10)
    assert not errors, errors
    assert seen == {"creator": True, "grad": 6.0}


def test_a_new_thread_starts_with_the_defaults():
    seen = {}

    def worker():
        seen["grad"] = Config.enable_backprop
        seen["train"] = Config.train

    with gradcore.no_grad(), gradcore.test_mode():
        thread, errors = _run_in_thread(worker)
        thread.join(timeout=10)
    assert not errors and seen == {"grad": True, "train": True}
