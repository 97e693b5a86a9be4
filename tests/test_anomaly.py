"""Anomaly mode: NaN and infinite gradients named with the forward call's stack, arrays changed
behind gradcore's back, the switches, and nothing recorded while it is off."""
import threading
import warnings

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from conftest import run_in_threads
from gradcore import Variable, engine
from test_function import AddOneInPlace, ScaleBy  # Functions of a user's own


def test_a_nan_gradient_names_the_op_and_where_it_was_called(xp):
    x = Variable(xp.asarray([0.0, 1.0]))
    with gradcore.detect_anomaly():
        y = F.sqrt(x)  # the gradient 1 / (2 sqrt(x)) is infinite at 0
        with pytest.raises(RuntimeError, match=r"(?s)anomaly: sqrt.backward returned a gradient "
                                               r"holding NaN or infinity for input 0\. sqrt was "
                                               r"called at:.*test_anomaly.py.*y = F.sqrt\(x\)"):
            y.sum().backward()
    assert x.grad is None


def test_without_anomaly_mode_the_same_gradient_goes_through(xp):
    x = Variable(xp.asarray([0.0, 1.0]))
    with np.errstate(divide="ignore"):
        F.sqrt(x).sum().backward()
    assert np.isinf(x.grad.numpy()[0])


def test_an_op_recorded_outside_anomaly_mode_says_how_to_see_where(xp):
    x = Variable(xp.asarray([0.0, 1.0]))
    y = F.sqrt(x)
    with gradcore.detect_anomaly():
        with pytest.raises(RuntimeError, match=r"run the forward pass inside "
                                               r"gradcore.detect_anomaly\(\) as well"):
            y.sum().backward()


@pytest.mark.parametrize("what, write", [
    ("input 0", lambda x, y: x.data.__setitem__(0, 7.0)),
    ("output 0", lambda x, y: y.data.__setitem__(1, 7.0)),
])
def test_a_direct_write_into_an_array_backward_reads_is_caught(what, write):
    """x.data[...] = v writes into the array: the version counter cannot see it, a fingerprint
    taken at forward does."""
    x = Variable(np.array([1.0, 2.0]))
    with gradcore.detect_anomaly():
        y = F.exp(x)  # exp's backward reads its output
        write(x, y)
        assert x.version == 0 and y.version == 0
        with pytest.raises(RuntimeError, match=f"anomaly: exp: its {what} changed after exp ran "
                                               "in forward"):
            y.backward()


@pytest.mark.parametrize("backward", [lambda y, x: y.sum().backward(),
                                      lambda y, x: gradcore.grad(y.sum(), x)],
                         ids=["backward", "grad"])
def test_a_direct_write_is_caught_when_only_forward_ran_in_anomaly_mode(backward):
    x = Variable(np.array([1.0]))
    with gradcore.detect_anomaly():
        y = F.sin(x)  # fingerprints what sin's backward reads, cos(x)
    x.data[...] = 0.0
    with pytest.raises(RuntimeError, match="anomaly: sin: its input 0 changed after sin ran"):
        backward(y, x)
    assert x.grad is None


def test_a_counted_write_is_refused_naming_where_the_op_was_called():
    x = Variable(np.array([1.0, 2.0]))
    with gradcore.detect_anomaly():
        y = F.sin(x)  # sin reads x
        x.data = np.array([3.0, 4.0])  # counted: the version check refuses it, not the hash
        with pytest.raises(RuntimeError, match=r"(?s)sin: its input 0, .* was written after sin "
                                               r"ran in forward.*sin was called at:.*"
                                               r"test_anomaly.py.*y = F.sin\(x\)"):
            y.sum().backward()


def test_a_direct_write_is_refused_before_a_post_accumulate_hook_steps_a_parameter():
    """W's gradient is final before the walk reaches sin (whose input was written into): its
    hook, an optimizer step, must not have run when backward refuses the graph."""
    x, W = Variable(np.array([0.3, 0.7])), Variable(np.array([1.0, 2.0]))
    W.register_post_accumulate_grad_hook(lambda p: setattr(p, "data", p.data - p.grad.data))
    with gradcore.detect_anomaly():
        loss = F.sum(F.sin(x) * W)
    x.data[...] = 5.0  # a direct write: the version counter cannot see it
    with pytest.raises(RuntimeError, match="anomaly: sin: its input 0 changed after sin ran"):
        loss.backward()
    np.testing.assert_array_equal(W.data, [1.0, 2.0])
    assert W.grad is None and x.grad is None


def test_a_direct_write_is_refused_before_a_hook_on_the_way_runs():
    x = Variable(np.array([0.3, 0.7]))
    calls = []
    with gradcore.detect_anomaly():
        h = F.sin(x)
        y = h * 2.0
    y.register_hook(lambda g: calls.append(1))
    x.data[...] = 5.0
    with gradcore.detect_anomaly():
        with pytest.raises(RuntimeError, match="anomaly: sin: its input 0 changed after sin"):
            gradcore.grad(F.sum(y), x)
    assert calls == []


@pytest.mark.parametrize("make, how", [
    # mul's backward returns a finite float64 gradient, 1e200, cast to x's float32
    (lambda x: x * np.array([1e200, 1.0]), "cast to the input's dtype float32"),
    # add's gradient, 3e38 twice, summed back to x's shape (1,): 6e38 overflows float32
    (lambda x: (x + np.zeros(2, np.float32)) * np.float32(3e38),
     "summed over the axes it was broadcast along"),
], ids=["cast", "broadcast"])
def test_a_gradient_that_overflows_as_the_walk_conforms_it_is_caught(make, how):
    x = Variable(np.array([1.0] if "summed" in how else [1.0, 2.0], dtype=np.float32))
    with gradcore.detect_anomaly(), np.errstate(over="ignore"):
        y = make(x)
        with pytest.raises(RuntimeError, match=r"(?s)anomaly: (mul|add).backward returned a finite "
                                               r"gradient for input 0, which holds NaN or "
                                               f"infinity once {how}: it overflows float32.*"
                                               r"was called at:.*test_anomaly.py"):
            y.backward()
    assert x.grad is None


def test_two_finite_gradients_that_sum_to_infinity_are_caught():
    x = Variable(np.array([1.0], dtype=np.float32))
    seed = np.array([1e38], np.float32)
    with gradcore.detect_anomaly(), np.errstate(over="ignore"):
        y = x * np.float32(2.0) + x * np.float32(2.0)  # 2e38 + 2e38 overflows float32
        for backward in (lambda: y.backward(seed), lambda: gradcore.grad(y, x, seed),
                         lambda: y.backward(seed, create_graph=True)):
            with pytest.raises(RuntimeError, match="anomaly: mul.backward returned a finite "
                                                   "gradient for input 0, but its sum with the "
                                                   "gradient that input got from other ops holds "
                                                   "NaN or infinity: it overflows float32"):
                backward()
    assert x.grad is None


def test_a_grad_that_overflows_as_backward_adds_to_it_is_refused_and_kept():
    x = Variable(np.array([1.0], dtype=np.float32))
    w = Variable(np.array([1.0], dtype=np.float32))
    seed = np.array([2e38], np.float32)
    with gradcore.detect_anomaly(), np.errstate(over="ignore"):
        (x * w).backward(seed)
        w.cleargrad()
        with pytest.raises(RuntimeError, match=r"anomaly: backward: the Variable of shape \(1,\) "
                                               r"and dtype float32 has a .grad from earlier "
                                               r"backward calls, and adding this backward's "
                                               r"gradient to it gives NaN or infinity"):
            (w * x).backward(seed)  # w first: all checked before any .grad is set
    np.testing.assert_array_equal(x.grad.data, seed)
    assert w.grad is None


def test_ops_recorded_in_anomaly_mode_are_checked_after_it_only_while_they_live():
    import gc
    import weakref

    from gradcore import anomaly

    x = Variable(np.array([1.0]))
    with gradcore.detect_anomaly():
        y = F.sin(x)
    assert y.creator in anomaly.recorded
    x.data[...] = 0.5  # a direct write, after an unrecorded forward: not seen, as before
    z = F.sin(x)
    assert z.creator not in anomaly.recorded
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.cos(0.5))
    creator = weakref.ref(y.creator)
    del y
    gc.collect()
    assert creator() is None  # gone from anomaly.recorded: walks take their short path again


def test_a_saved_array_written_into_is_caught():
    class Scale(gradcore.Function):
        def forward(self, x):
            self.factor = self.xp.full_like(x, 3.0)
            self.save_for_backward(self.factor)
            return x * self.factor

        def backward(self, gy):
            factor, = self.saved_tensors
            return gy * factor

    x = Variable(np.array([1.0, 2.0]))
    with gradcore.detect_anomaly():
        f = Scale()
        y = f(x)
        f.factor[0] = 0.0
        with pytest.raises(RuntimeError, match="its saved value 0 changed"):
            y.sum().backward()


def test_an_unchanged_graph_passes_in_anomaly_mode(xp):
    x = Variable(xp.asarray([1.0, 2.0]))
    with gradcore.detect_anomaly():
        y = (F.tanh(x) * x).sum()
        y.backward(create_graph=True)
        gx = x.grad
        x.cleargrad()
        gx.sum().backward()
    t = np.tanh([1.0, 2.0])
    np.testing.assert_allclose(x.grad.numpy(), 2 * (1 - t * t) * (1 - t * np.array([1.0, 2.0])),
                               rtol=1e-12)


def test_the_switches():
    recording = gradcore.config.recording
    assert not gradcore.is_anomaly_enabled() and recording() is True

    @gradcore.detect_anomaly()
    def inside():
        return gradcore.is_anomaly_enabled(), recording()

    assert inside() == (True, gradcore.config.ANOMALY)
    assert not gradcore.is_anomaly_enabled() and recording() is True
    gradcore.set_detect_anomaly(True)
    try:
        with gradcore.no_grad():
            assert recording() is False and gradcore.is_anomaly_enabled()
        assert recording() == gradcore.config.ANOMALY
        with gradcore.detect_anomaly(False):
            assert recording() is True
        seen = []
        thread = threading.Thread(target=lambda: seen.append(gradcore.is_anomaly_enabled()))
        thread.start()
        thread.join()
        assert seen == [False]  # per thread
    finally:
        gradcore.set_detect_anomaly(False)
    assert recording() is True


def test_set_detect_anomaly_is_also_a_context_manager_that_puts_the_mode_back():
    recording = gradcore.config.recording
    with gradcore.set_detect_anomaly(True):
        assert gradcore.is_anomaly_enabled() and recording() == gradcore.config.ANOMALY
        with gradcore.set_detect_anomaly(False):
            assert not gradcore.is_anomaly_enabled() and recording() is True
        assert gradcore.is_anomaly_enabled()
        gradcore.Config.enable_backprop = False  # a grad mode set in the block stays set
    try:
        assert not gradcore.is_anomaly_enabled() and recording() is False
    finally:
        gradcore.Config.enable_backprop = True
    gradcore.set_detect_anomaly(True)  # called plainly: switched till switched back
    try:
        assert gradcore.is_anomaly_enabled()
    finally:
        gradcore.set_detect_anomaly(False)
    assert not gradcore.is_anomaly_enabled() and recording() is True


def test_one_detect_anomaly_object_is_entered_from_several_threads_at_once():
    shared = gradcore.detect_anomaly()
    errors, inside, after = [], [], []
    entered = threading.Barrier(4)

    def block():
        try:
            with shared:
                entered.wait()  # all four inside at once: each must leave its own entry
                inside.append(gradcore.is_anomaly_enabled())
            after.append(gradcore.is_anomaly_enabled())
        except Exception as error:  # noqa: BLE001 -- reported below, with the thread's others
            errors.append(error)

    run_in_threads([block] * 4)
    assert errors == [] and inside == [True] * 4 and after == [False] * 4

    @gradcore.detect_anomaly  # without parentheses, as no_grad
    def steps():
        yield gradcore.is_anomaly_enabled()
        yield gradcore.is_anomaly_enabled()

    assert list(steps()) == [True, True] and not gradcore.is_anomaly_enabled()


def test_nothing_is_recorded_while_it_is_off():
    y = F.exp(Variable(np.array([1.0])))
    assert "_anomaly" not in vars(y.creator)
    with gradcore.detect_anomaly():
        y = F.exp(Variable(np.array([1.0])))
    assert "_anomaly" in vars(y.creator)


def test_anomaly_mode_reports_an_infinite_gradient_without_numpys_warning_first():
    x = gradcore.Variable(np.array([0.0, 1.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NumPy's "divide by zero" would be an error here
        with gradcore.detect_anomaly():
            y = F.sum(F.sqrt(x))
            with pytest.raises(RuntimeError, match="sqrt.backward returned a gradient holding"):
                y.backward()


# ================================================ users' own Functions
def test_a_saved_variable_that_is_no_input_is_fingerprinted():
    W = Variable(np.array([2.0, 3.0]))
    x = Variable(np.array([1.0, 1.0]))
    with gradcore.detect_anomaly():
        y = ScaleBy(W)(x)
        W.data[...] = 0.0  # a direct write: no version to count
        with pytest.raises(RuntimeError, match="anomaly: scale_by: its saved value 0 changed "
                                               "after scale_by ran in forward"):
            y.backward()
    assert x.grad is None


class AddOne(AddOneInPlace):
    """x + 1, written into x; `announce`: with mark_dirty, as PyTorch's in-place ops."""


def test_a_forward_writing_into_its_input_unannounced_is_caught():
    x, w = Variable(np.array([1.0, 2.0]), requires_grad=False), Variable(np.array([1.0, 1.0]))
    with gradcore.detect_anomaly():
        a = x * w  # saves x = [1, 2]
        with pytest.raises(RuntimeError, match=r"anomaly: add_one: forward wrote into its input "
                                               r"0 without saying so.*self.mark_dirty\(x\)"):
            AddOne(False)(x)
        assert x.version == 1  # counted all the same: the graph that saved x refuses now
        with pytest.raises(RuntimeError, match="mul: its input 0, .* was written after mul"):
            F.sum(a).backward()
        y = AddOne(True)(x)  # announced: no error
        assert x.version == 2 and y.version == 2
        np.testing.assert_array_equal(x.data, [3.0, 4.0])
    AddOne(False)(x)  # outside anomaly mode nothing looks (see Function's rules)
    assert x.version == 2


@pytest.mark.parametrize("make", [float, lambda a: a.tolist()], ids=["float", "list"])
def test_a_gradient_that_is_a_number_or_a_list_is_checked_as_the_walk_takes_it(make):
    class Square(gradcore.Function):
        def forward(self, x):
            return x * x

        def backward(self, gy):
            x, = self.inputs
            return make(gy.data * 2 * x.data)

    x = Variable(np.array(3.0) if make is float else np.array([3.0, -1.0]))
    Square.apply(x).backward()
    plain = x.grad.data
    x.cleargrad()
    with gradcore.detect_anomaly():  # before: AttributeError from anomaly.py
        Square.apply(x).backward()
    np.testing.assert_array_equal(x.grad.data, plain)
    np.testing.assert_array_equal(plain, 2 * x.data)
    x = Variable(np.array(np.inf) if make is float else np.array([np.inf, 1.0]))
    with gradcore.detect_anomaly(), np.errstate(invalid="ignore"):
        y = Square.apply(x)
        with pytest.raises(RuntimeError, match="anomaly: square.backward returned a gradient "
                                               "holding NaN or infinity for input 0"):
            y.backward()


@pytest.mark.parametrize("dtype, value", [(np.float16, 4e4), (np.float32, 2e38)])
@pytest.mark.parametrize("how", ["retain_grad()", "backward(retain_grad=True)", "grad"])
def test_a_retained_grad_that_overflows_as_backward_adds_to_it_is_refused_and_kept(
        how, dtype, value):
    x = Variable(np.array([1.0], dtype=dtype))
    t = x * dtype(1e-3)
    t.name = "t"
    if how != "backward(retain_grad=True)":
        t.retain_grad()
    y = t * dtype(value)  # t.grad is `value` per backward; y's and x's gradients stay small
    if how == "grad":
        def backward():
            return gradcore.grad(y, x)
    else:
        def backward():
            return y.backward(retain_grad=how != "retain_grad()")
    backward()
    t_grad = t.grad.data.copy()
    x_grad = None if x.grad is None else x.grad.data.copy()
    np.testing.assert_array_equal(t_grad, np.array([value], dtype))
    with gradcore.detect_anomaly(), np.errstate(over="ignore"):
        with pytest.raises(RuntimeError, match=r"anomaly: backward: the Variable \"t\" of shape "
                                               rf"\(1,\) and dtype {np.dtype(dtype)}, computed by "
                                               r"mul and retaining its gradient, has a .grad from "
                                               r"earlier backward calls, and adding this "
                                               r"backward's gradient to it gives NaN or infinity: "
                                               rf"it overflows {np.dtype(dtype)}\. Call cleargrad"):
            backward()
    # checked before it is set: t.grad as it was, and the leaf's .grad (set after the walk)
    np.testing.assert_array_equal(t.grad.data, t_grad)
    if x_grad is None:
        assert x.grad is None
    else:
        np.testing.assert_array_equal(x.grad.data, x_grad)
    t.cleargrad()  # as the message says: then the same backward goes through
    with gradcore.detect_anomaly():
        backward()
    np.testing.assert_array_equal(t.grad.data, t_grad)


def test_a_grad_already_infinite_from_outside_anomaly_mode_is_named_as_such():
    # nothing overflows here: x.grad holds inf from before (a backward outside anomaly mode)
    x = gradcore.Variable(np.array([1.0], np.float32), name="x")
    x.grad = gradcore.Variable(np.array([np.inf], np.float32), requires_grad=False)
    with gradcore.detect_anomaly(), pytest.raises(RuntimeError, match="already holds NaN or "
                                                  "infinity, and this backward would add to it"):
        (x * 1).backward()
    assert x.grad.data.tolist() == [np.inf]


# ================================================ a refused backward changes no .grad
# sqrt(x) at x = 0: its gradient is infinite. It is recorded first, so the walk reaches it last,
# after the .grads the walk sets on its way (hooked leaves released, retained gradients)
REFUSED = r"anomaly: sqrt.backward returned a gradient holding NaN or infinity"
PUT_BACK = "anomaly mode: every .grad this backward set was put back"


@pytest.mark.parametrize("create_graph", [False, True], ids=["plain", "create_graph"])
@pytest.mark.parametrize("earlier", [False, True], ids=["no-grad-before", "grad-before"])
def test_a_refused_backward_leaves_the_grad_of_a_leaf_released_for_its_hooks(earlier,
                                                                             create_graph):
    A, B = Variable(np.array([4.0]), name="A"), Variable(np.array([1.0]), name="B")
    calls = []

    def double(p):  # changes the .grad the walk set: put back all the same
        calls.append("A")
        p.grad = p.grad * 2.0

    A.register_post_accumulate_grad_hook(double)
    B.register_post_accumulate_grad_hook(lambda p: calls.append("B"))
    if earlier:
        F.sum(A * 3.0 + B * 7.0).backward()
        np.testing.assert_array_equal(A.grad.data, [6.0])  # 3, doubled
        np.testing.assert_array_equal(B.grad.data, [7.0])
        calls.clear()
    a_grad, b_grad = A.grad, B.grad
    x = Variable(np.array([0.0]))
    with gradcore.detect_anomaly(), np.errstate(divide="ignore"):
        s = F.sqrt(x)
        loss = F.sum(A * 10.0 + B * 100.0 + s)
        with pytest.raises(RuntimeError, match=REFUSED) as caught:
            loss.backward(create_graph=create_graph)
    assert calls == ["B", "A"]  # both released, hooks run, before sqrt's backward
    assert A.grad is a_grad and B.grad is b_grad and x.grad is None
    if earlier:
        np.testing.assert_array_equal(A.grad.data, [6.0])
        np.testing.assert_array_equal(B.grad.data, [7.0])
    assert caught.value.__notes__[-1] == (f"{PUT_BACK}; what the hooks that ran (2 calls) did "
                                          "is not undone")
    # the input fixed, the same backward adds its gradient once: with a .grad before, (6 + 10) * 2
    x = Variable(np.array([1.0]))
    with gradcore.detect_anomaly():
        F.sum(A * 10.0 + B * 100.0 + F.sqrt(x)).backward(create_graph=create_graph)
    np.testing.assert_array_equal(A.grad.data, [32.0] if earlier else [20.0])
    np.testing.assert_array_equal(B.grad.data, [107.0] if earlier else [100.0])


@pytest.mark.parametrize("how", ["retain_grad()", "backward(retain_grad=True)",
                                 "create_graph", "grad"])
@pytest.mark.parametrize("earlier", [False, True], ids=["no-grad-before", "grad-before"])
def test_a_refused_backward_leaves_a_retained_grad_summed_on_its_way(earlier, how):
    x = Variable(np.array([0.0]), name="x")
    s = F.sqrt(x)
    t = x * 3.0
    if how != "backward(retain_grad=True)":
        t.retain_grad()

    def backward(y):
        if how == "grad":
            return gradcore.grad(y, x)
        return y.backward(retain_grad=how == "backward(retain_grad=True)",
                          create_graph=how == "create_graph")

    if earlier:
        backward(F.sum(t * 2.0))  # no sqrt on this one: t.grad = 2
        np.testing.assert_array_equal(t.grad.data, [2.0])
    t_grad, x_grad = t.grad, x.grad
    with gradcore.detect_anomaly(), np.errstate(divide="ignore"):
        u = t * 5.0
        loss = F.sum(u + s)
        with pytest.raises(RuntimeError, match=REFUSED) as caught:
            backward(loss)  # t.grad was 2 + 5 when sqrt's backward ran
    assert t.grad is t_grad and x.grad is x_grad and u.grad is None
    if earlier:
        np.testing.assert_array_equal(t.grad.data, [2.0])
        if how != "grad":  # gradcore.grad leaves the leaves' .grad alone
            np.testing.assert_array_equal(x.grad.data, [6.0])
    assert caught.value.__notes__[-1] == PUT_BACK  # no hook ran
    # the same sums without the refused op: t.grad gets this backward's 5 once
    with gradcore.detect_anomaly():
        backward(F.sum(t * 5.0))
    np.testing.assert_array_equal(t.grad.data, [7.0] if earlier else [5.0])


def test_a_refused_backward_says_which_grads_another_writer_changed_since():
    """A post-accumulate hook on B rewrites A's .grad after the walk set it (as another thread's
    backward into A would): putting A's back would lose that, so it stays and the error says so."""
    A, B = Variable(np.array([4.0])), Variable(np.array([1.0]))
    mine = Variable(np.array([-1.0]), requires_grad=False)
    A.register_post_accumulate_grad_hook(lambda p: None)
    B.register_post_accumulate_grad_hook(lambda p: setattr(A, "grad", mine))
    x = Variable(np.array([0.0]))
    with gradcore.detect_anomaly(), np.errstate(divide="ignore"):
        s = F.sqrt(x)
        loss = F.sum(B * 100.0 + A * 10.0 + s)  # A is released first, then B
        with pytest.raises(RuntimeError, match=REFUSED) as caught:
            loss.backward()
    assert A.grad is mine and B.grad is None
    assert caught.value.__notes__[-1] == ("anomaly mode: every .grad this backward set was put "
                                          "back but 1, changed since by a hook or another "
                                          "thread; what the hooks that ran (2 calls) did is "
                                          "not undone")


def test_a_refused_backward_counts_the_gradient_hooks_that_ran():
    # a gradient hook set another Variable's .grad, which stays: the note said "no .grad was
    # changed" and counted post-accumulate hooks only
    C = Variable(np.array([5.0]))
    x, w = Variable(np.array([0.0])), Variable(np.array([2.0]))
    hooks_grad = Variable(np.array([123.0]), requires_grad=False)
    with gradcore.detect_anomaly(), np.errstate(divide="ignore"):
        s = F.sqrt(x)
        t = w * 3.0
        t.register_hook(lambda g: setattr(C, "grad", hooks_grad))
        with pytest.raises(RuntimeError, match=REFUSED) as caught:
            F.sum(t * 2.0 + s).backward()
    assert C.grad is hooks_grad and w.grad is None
    assert caught.value.__notes__[-1] == (f"{PUT_BACK}; what the hooks that ran (1 call) did "
                                          "is not undone")


class Interrupted(gradcore.Function):
    """Stands for Ctrl-C arriving while this op's backward runs."""

    def forward(self, x):
        return x * 1.0

    def backward(self, gy):
        raise KeyboardInterrupt


@pytest.mark.parametrize("how", ["backward", "grad"])
@pytest.mark.parametrize("released", [False, True], ids=["kept", "input-released"])
def test_an_interrupted_backward_puts_back_every_grad_and_goes_on_as_an_interrupt(how,
                                                                                 released):
    # KeyboardInterrupt is no Exception: it skipped the put-back (A.grad [30.], t.grad [10.])
    A, x = Variable(np.array([4.0]), name="A"), Variable(np.array([1.0]), name="x")
    calls = []
    A.register_post_accumulate_grad_hook(lambda p: calls.append(p.grad.data.copy()))
    with gradcore.detect_anomaly():
        s = Interrupted()(x)  # recorded first: its backward runs last
        t = A * 3.0
        t.retain_grad()
        loss = F.sum(t * 10.0 + s)
        if released:  # a failed backward that reads released data is re-raised as such...
            x.data = None
        with pytest.raises(KeyboardInterrupt) as caught:  # ...but an interrupt as it is
            loss.backward() if how == "backward" else gradcore.grad(loss, [A, x])
    assert A.grad is None and t.grad is None and x.grad is None
    if how == "backward":  # A was released and its hook ran before the interrupt
        np.testing.assert_array_equal(calls, [[30.0]])
        assert caught.value.__notes__[-1] == (f"{PUT_BACK}; what the hooks that ran (1 call) "
                                              "did is not undone")
    else:
        assert calls == [] and caught.value.__notes__[-1] == PUT_BACK
    assert "raised in interrupted.backward (Interrupted)" in caught.value.__notes__[0]
    assert not engine._watched


def test_a_refused_backward_keeps_the_sum_another_thread_made_while_its_hook_ran():
    """Thread a's post-accumulate hook on W waits while thread b's backward adds into W.grad;
    then a's walk is refused. a's put-back took b's sum for a's own and erased it (W.grad None,
    the note saying every .grad was put back): now W.grad stays, counted in the note."""
    W = Variable(np.zeros(3), name="W")
    in_hook, b_done = threading.Event(), threading.Event()
    notes, errors = [], []

    def hook(p):
        if threading.current_thread().name == "a":
            in_hook.set()
            assert b_done.wait(10)  # a slow hook (an all-reduce): b's backward happens meanwhile

    def a():
        try:
            with gradcore.detect_anomaly(), np.errstate(divide="ignore"):
                s = F.sqrt(Variable(np.array([0.0])))  # recorded first: its backward runs last
                loss = F.sum(W * 10.0) + F.sum(s)
                with pytest.raises(RuntimeError, match=REFUSED) as caught:
                    loss.backward()
            notes.append(caught.value.__notes__[-1])
        except BaseException as error:  # noqa: BLE001 -- reported below
            errors.append(error)
            in_hook.set()

    def b():
        try:
            assert in_hook.wait(10)
            F.sum(W * 1.0).backward()  # outside anomaly mode; succeeds
            np.testing.assert_array_equal(W.grad.data, [11.0, 11.0, 11.0])
        except BaseException as error:  # noqa: BLE001 -- reported below
            errors.append(error)
        finally:
            b_done.set()

    W.register_post_accumulate_grad_hook(hook)
    threads = [threading.Thread(target=a, name="a"), threading.Thread(target=b, name="b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    np.testing.assert_array_equal(W.grad.data, [11.0, 11.0, 11.0])  # b's 1 and a's 10: left
    assert notes == ["anomaly mode: every .grad this backward set was put back but 1, changed "
                     "since by a hook or another thread; what the hooks that ran (1 call) did "
                     "is not undone"]
    assert not engine._watched


def test_a_refused_backward_keeps_the_sum_a_backward_in_its_hook_made():
    # a post-accumulate hook on W runs a backward of its own into W: that walk's sum stays
    W = Variable(np.zeros(1), name="W")
    busy = []

    def hook(p):
        if not busy:
            busy.append(True)
            with gradcore.enable_grad():
                F.sum(W * 1.0).backward()
            busy.clear()

    W.register_post_accumulate_grad_hook(hook)
    with gradcore.detect_anomaly(), np.errstate(divide="ignore"):
        s = F.sqrt(Variable(np.array([0.0])))
        with pytest.raises(RuntimeError, match=REFUSED) as caught:
            (F.sum(W * 10.0) + F.sum(s)).backward()
    np.testing.assert_array_equal(W.grad.data, [11.0])
    assert caught.value.__notes__[-1] == ("anomaly mode: every .grad this backward set was put "
                                          "back but 1, changed since by a hook or another "
                                          "thread; what the hooks that ran (1 call) did is not "
                                          "undone")  # the inner backward's call is its own
    assert not engine._watched


def test_a_refused_backward_runs_the_post_hook_of_a_leaf_that_stopped_requiring_grad():
    # the walk sets no .grad on it (as in PyTorch) but still calls its hook: nothing to note
    A = Variable(np.array([4.0]))
    calls = []
    A.register_post_accumulate_grad_hook(lambda p: calls.append(p.grad))
    with gradcore.detect_anomaly(), np.errstate(divide="ignore"):
        s = F.sqrt(Variable(np.array([0.0])))
        loss = F.sum(A * 10.0 + s)
        A.requires_grad = False
        with pytest.raises(RuntimeError, match=REFUSED) as caught:
            loss.backward()
    assert calls == [None] and A.grad is None
    assert caught.value.__notes__[-1] == (f"{PUT_BACK}; what the hooks that ran (1 call) did "
                                          "is not undone")


# ================================================ NaN or infinity brought in by a hook or a seed
def _nan_hook(g):
    return g * np.nan


def test_a_hook_returning_nan_on_a_leaf_is_named_and_the_grad_left_alone():
    # backward went through, silently: x.grad = [nan nan]
    x, w = Variable(np.array([1.0, 2.0]), name="x"), Variable(np.array([3.0]))
    w.grad = Variable(np.array([7.0]), requires_grad=False)
    before = w.grad
    with gradcore.detect_anomaly():
        x.register_hook(_nan_hook)
        with pytest.raises(RuntimeError) as caught:
            F.sum(F.sin(x) * w).backward()
    line = _nan_hook.__code__.co_firstlineno
    assert str(caught.value) == (
        f'anomaly: the hook _nan_hook (defined at {__file__}:{line}) registered on the Variable '
        '"x" of shape (2,) and dtype float64 returned a gradient holding NaN (in 2 of its 2 '
        'values), where the gradient backward handed it was finite: the hook is the cause')
    assert caught.value.__notes__[-1] == (f"{PUT_BACK}; what the hooks that ran (1 call) did "
                                          "is not undone")
    assert x.grad is None and w.grad is before


@pytest.mark.parametrize("retained", [False, True], ids=["hooked", "hooked-and-retained"])
def test_a_hook_returning_infinity_on_the_way_is_named_not_the_op_after_it(retained):
    # the error blamed mul.backward, whose math is fine
    x = Variable(np.array([1.0, 2.0]))
    with gradcore.detect_anomaly():
        h = x * 2.0
        h.name = "h"
        h.register_hook(lambda g: g * np.inf)
        if retained:
            h.retain_grad()
        with pytest.raises(RuntimeError, match=r'^anomaly: the hook .*<lambda> \(defined at '
                                               r'.*test_anomaly.py:\d+\) registered on the '
                                               r'Variable "h" of shape \(2,\) and dtype float64 '
                                               r'returned a gradient holding infinity'):
            F.sin(h).sum().backward()
    assert x.grad is None and h.grad is None


def test_a_hook_writing_nan_into_its_gradient_in_place_is_named():
    def in_place(g):
        g.data[...] = np.nan

    x = Variable(np.array([1.0, 2.0]))
    with gradcore.detect_anomaly():
        h = x * 2.0
        h.register_hook(in_place)
        with pytest.raises(RuntimeError, match=r"the hook .*in_place .*returned None but wrote "
                                               r"into the gradient it was handed, which now "
                                               r"holds NaN \(in 2 of its 2 values\)"):
            F.sin(h).sum().backward()


def test_a_post_accumulate_hook_leaving_infinity_in_grad_is_named_and_undone():
    w = Variable(np.array([1.0, 2.0]), name="w")
    w.grad = Variable(np.array([5.0, 5.0]), requires_grad=False)
    before = w.grad
    w.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", p.grad * np.inf))
    with gradcore.detect_anomaly():
        with pytest.raises(RuntimeError, match=r'^anomaly: the post-accumulate hook .*<lambda> '
                                               r'\(defined at .*test_anomaly.py:\d+\) registered '
                                               r'on the Variable "w" .* left its .grad holding '
                                               r"infinity \(in 2 of its 2 values\), where the "
                                               r".grad backward set was finite") as caught:
            F.sin(w).sum().backward()
    assert w.grad is before
    np.testing.assert_array_equal(w.grad.numpy(), [5.0, 5.0])
    assert caught.value.__notes__[-1] == (f"{PUT_BACK}; what the hooks that ran (1 call) did "
                                          "is not undone")


def test_hooks_that_return_finite_gradients_pass_in_anomaly_mode():
    x = Variable(np.array([1.0, 2.0]))
    with gradcore.detect_anomaly():
        h = x * 2.0
        h.register_hook(lambda g: g * 3.0)
        x.register_hook(lambda g: None)
        F.sum(h).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [6.0, 6.0])


def test_without_anomaly_mode_a_hooks_nan_goes_through():
    x = Variable(np.array([1.0, 2.0]))
    x.register_hook(_nan_hook)
    F.sin(x).sum().backward()
    assert np.isnan(x.grad.numpy()).all()


@pytest.mark.parametrize("how", ["grad", "hand-set", "grad_outputs"])
def test_a_nan_seed_is_named_not_the_first_op(how):
    # the error blamed sin.backward
    x = Variable(np.array([1.0, 2.0]))
    x.grad = Variable(np.array([4.0, 4.0]), requires_grad=False)
    before = x.grad
    seed = np.array([np.nan, 1.0])
    with gradcore.detect_anomaly():
        y = F.sin(x)
        with pytest.raises(RuntimeError) as caught:
            if how == "grad":
                y.backward(grad=seed)
            elif how == "hand-set":
                y.grad = Variable(seed, requires_grad=False)
                y.backward()
            else:
                gradcore.grad([F.cos(x), y], x, grad_outputs=[None, seed])
    what = {"grad": "backward: the seed passed as grad",
            "hand-set": "backward: the seed, the .grad set by hand on the output (y.grad = v),",
            "grad_outputs": "grad: the seed passed as grad_outputs[1], for output 1,"}[how]
    assert str(caught.value) == (
        f"anomaly: {what} holds NaN (in 1 of its 2 values): the NaN or infinity comes from the "
        "seed, not from an op's backward; look at how the seed was computed.")
    assert caught.value.__notes__[-1] == PUT_BACK
    assert x.grad is before
    if how == "hand-set":  # the seed is given back
        np.testing.assert_array_equal(y.grad.numpy(), seed)


def test_a_seed_computed_in_anomaly_mode_says_where_and_one_made_infinite_by_its_cast_says_so():
    x = Variable(np.array([1.0, 2.0], dtype=np.float32))
    with gradcore.detect_anomaly(), np.errstate(divide="ignore", over="ignore"):
        v = F.log(Variable(np.array([0.0, 1.0], dtype=np.float32)))
        with pytest.raises(RuntimeError, match=r"(?s)holds infinity \(in 1 of its 2 values\): "
                                               r".* The seed was computed by log: log was called "
                                               r"at:.*v = F.log"):
            F.sin(x).backward(grad=v)
        with pytest.raises(RuntimeError, match=r"seed passed as grad holds infinity \(in 1 of "
                                               r"its 2 values\) once cast to the output's dtype "
                                               r"float32: it is finite as given, but overflows "
                                               r"float32"):
            F.sin(x).backward(grad=np.array([1e300, 1.0]))
