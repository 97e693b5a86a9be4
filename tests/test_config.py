"""Grad mode and train mode: context managers, nesting, restoring, and one setting per thread."""
import asyncio
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


# ======================================================================= reuse and decorators
@pytest.mark.parametrize("make, read, inside", [
    (gradcore.no_grad, gradcore.is_grad_enabled, False),
    (gradcore.test_mode, lambda: Config.train, False),
    (lambda: gradcore.using_config("enable_backprop", False), gradcore.is_grad_enabled, False),
])
def test_one_switch_object_can_be_entered_again_and_nested(make, read, inside):
    switch = make()
    for _ in range(2):
        with switch:
            assert read() is inside
        assert read() is True
    with switch:
        with switch:  # nested: each exit restores what its own entry found
            assert read() is inside
        assert read() is inside
    assert read() is True


def test_enable_grad_object_reused_inside_no_grad():
    on = gradcore.enable_grad()
    with gradcore.no_grad():
        for _ in range(2):
            with on:
                assert (Variable(np.array(2.0)) * 3).creator is not None
            assert not gradcore.is_grad_enabled()
    assert gradcore.is_grad_enabled()


def test_switches_decorate_functions_with_and_without_parentheses():
    x = Variable(np.array([1.0, 2.0]))

    @gradcore.no_grad
    def bare(v):
        return v * 2

    @gradcore.no_grad()
    def called(v):
        return v * 2

    @gradcore.test_mode
    def train_flag():
        return Config.train

    @gradcore.enable_grad
    def records(v):
        return (v * 2).creator is not None

    assert bare(x).creator is None and called(x).creator is None
    assert bare.__name__ == "bare" and gradcore.is_grad_enabled()
    assert train_flag() is False and Config.train is True
    with gradcore.no_grad():
        assert records(x) is True and not gradcore.is_grad_enabled()
    np.testing.assert_array_equal(bare(x).data, [2.0, 4.0])


def test_a_decorated_function_restores_the_setting_when_it_raises():
    @gradcore.no_grad
    def fails():
        raise KeyError("inside")

    with pytest.raises(KeyError):
        fails()
    assert gradcore.is_grad_enabled()


def test_a_decorated_generator_or_coroutine_runs_each_step_under_the_setting():
    x = Variable(np.array([1.0, 2.0]))
    log = []

    @gradcore.no_grad()
    def predictions(batches):
        try:
            for b in batches:
                got = yield b * 2
                log.append((got, gradcore.is_grad_enabled()))
        finally:
            log.append(("closed", gradcore.is_grad_enabled()))
        return "done"

    @gradcore.using_config("train", False)
    def evaluating():
        try:
            yield Config.train
        except KeyError:
            yield ("caught", Config.train)

    assert predictions.__name__ == "predictions"
    outputs = predictions([x, x, x])
    first = next(outputs)
    assert first.creator is None and gradcore.is_grad_enabled()  # back while it is suspended
    assert (x * 2).creator is not None
    np.testing.assert_array_equal(outputs.send("sent").data, [2.0, 4.0])
    outputs.close()  # its finally block runs under the setting too
    assert log == [("sent", False), ("closed", False)] and gradcore.is_grad_enabled()
    one = predictions([x])
    next(one)
    with pytest.raises(StopIteration) as stop:
        one.send(None)
    assert stop.value.value == "done"  # what the generator returned
    steps = evaluating()
    assert next(steps) is False and Config.train is True
    assert steps.throw(KeyError("k")) == ("caught", False) and Config.train is True

    @gradcore.no_grad
    async def infer(v):
        before = (v * 2).creator
        await asyncio.sleep(0.01)  # another task runs meanwhile, in grad mode
        return before, (v * 3).creator

    async def other():
        await asyncio.sleep(0.005)
        return gradcore.is_grad_enabled(), (x * 4).creator is not None

    async def main():
        return await asyncio.gather(infer(x), other())

    (before, after), seen = asyncio.run(main())
    assert before is None and after is None and seen == (True, True)


def test_an_async_generator_is_refused_naming_the_public_spelling():
    async def numbers():
        yield Variable(np.array(1.0)) * 2

    with pytest.raises(TypeError, match=r"no_grad\(\) cannot decorate .*numbers, an async "
                       r"generator function; put `with gradcore\.no_grad\(\):` inside it"):
        gradcore.no_grad(numbers)
    with pytest.raises(TypeError, match=r"`with gradcore\.using_config\('train', False\):`"):
        gradcore.using_config("train", False)(numbers)
    with pytest.raises(TypeError, match="as a decorator it takes a function, got int"):
        gradcore.test_mode()(3)


def test_one_switch_object_shared_by_asyncio_tasks_restores_each_tasks_setting():
    inference = gradcore.no_grad()
    seen = {}

    async def handler(name, delay_before, hold):
        await asyncio.sleep(delay_before)
        with inference:
            await asyncio.sleep(hold)  # the other task enters and leaves meanwhile
            seen[name] = gradcore.is_grad_enabled()
        seen[name + " after"] = gradcore.is_grad_enabled()

    async def main():
        # the first to enter leaves first, and the one that entered second leaves last
        await asyncio.gather(handler("a", 0, 0.01), handler("b", 0.001, 0.05),
                             handler("c", 0.02, 0.001))

    asyncio.run(main())
    assert seen == {"a": False, "a after": True, "b": False, "b after": True, "c": False,
                    "c after": True}
    assert gradcore.is_grad_enabled()


def test_one_switch_object_entered_in_two_threads_at_once_restores_each():
    switch = gradcore.no_grad()
    inside = threading.Barrier(2, timeout=10)
    seen = {}

    def worker():
        with switch:
            inside.wait()  # 1: both threads inside the same object
            inside.wait()  # 2: the main thread has left it
            seen["worker_inside"] = gradcore.is_grad_enabled()
        seen["worker_after"] = gradcore.is_grad_enabled()

    thread, errors = _run_in_thread(worker)
    with switch:
        inside.wait()
    inside.wait()
    assert gradcore.is_grad_enabled()
    thread.join(timeout=10)
    assert not errors, errors
    assert seen == {"worker_inside": False, "worker_after": True}


def test_anomaly_mode_switched_inside_a_reused_no_grad_comes_back_with_grad_mode():
    switch = gradcore.no_grad()
    with switch:
        gradcore.set_detect_anomaly(True)
    try:
        assert gradcore.is_anomaly_enabled() and gradcore.config.recording() == "anomaly"
    finally:
        gradcore.set_detect_anomaly(False)
    assert gradcore.config.recording() is True


def test_grad_mode_switched_inside_detect_anomaly_stays_switched_after_it():
    recording, ANOMALY = gradcore.config.recording, gradcore.config.ANOMALY
    x = Variable(np.array([1.0, 2.0]))
    try:
        with gradcore.detect_anomaly():
            Config.enable_backprop = False  # DeZero's spelling
            assert recording() is False
        # as after set_detect_anomaly(True)'s block and PyTorch's detect_anomaly: only the
        # anomaly mode is put back
        assert recording() is False and not gradcore.is_anomaly_enabled()
        assert F.exp(x).creator is None
        with pytest.raises(KeyError):  # left by an exception
            with gradcore.detect_anomaly():
                Config.enable_backprop = True
                raise KeyError("inside")
        assert recording() is True and not gradcore.is_anomaly_enabled()
        with gradcore.detect_anomaly():  # nested: the outer one gets the inner's grad mode
            with gradcore.detect_anomaly(False):
                Config.enable_backprop = False
            assert recording() is False and gradcore.is_anomaly_enabled()
            Config.enable_backprop = True
            assert recording() == ANOMALY
        assert recording() is True

        @gradcore.detect_anomaly
        def switch_off():
            Config.enable_backprop = False
            return recording()

        @gradcore.detect_anomaly()
        def steps():
            yield recording()
            Config.enable_backprop = True
            yield recording()

        assert switch_off() is False and recording() is False
        assert list(steps()) == [False, ANOMALY] and recording() is True
        assert F.exp(x).creator is not None
        with gradcore.detect_anomaly():  # grad mode unchanged: as before the block
            assert F.exp(x).creator._anomaly is not None
        assert recording() is True and "_anomaly" not in vars(F.exp(x).creator)
    finally:
        Config.enable_backprop = True
    assert recording() is True and not gradcore.is_anomaly_enabled()


def test_detect_anomaly_left_after_the_no_grad_it_was_entered_in_leaves_grad_mode_on():
    recording = gradcore.config.recording

    def steps():
        with gradcore.detect_anomaly():
            yield

    with gradcore.no_grad():
        suspended = steps()
        next(suspended)  # its block entered inside no_grad() ...
    assert recording() == gradcore.config.ANOMALY
    next(suspended, None)  # ... and left after it: grad mode as no_grad() left it
    try:
        assert recording() is True and not gradcore.is_anomaly_enabled()
        assert F.exp(Variable(np.array([1.0]))).creator is not None
    finally:
        Config.enable_backprop = True
