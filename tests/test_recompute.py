"""gradcore.checkpoint: the same gradients as without it, with less memory."""
import collections
import contextlib
import copy
import gc
import os
import re
import sys
import threading
import tracemalloc
import weakref

import numpy as np
import pytest

import backends
import gradcore
import gradcore.functions as F
from gradcore import Parameter, Variable, nn
from gradcore.config import recomputing


def deep(x, layers=40, every=None):
    """`layers` nested sin; with `every`, each block of that many layers checkpointed."""
    def block(h, count):
        for _ in range(count):
            h = F.sin(h)
        return h
    h = x
    for start in range(0, layers, every or layers):
        count = min(every or layers, layers - start)
        h = gradcore.checkpoint(block, h, count) if every else block(h, count)
    return F.sum(h)


def test_gradients_are_the_eager_ones_bit_for_bit(xp2):
    x0 = xp2.asarray(np.linspace(-2, 2, 50))
    x, y = gradcore.Variable(x0), gradcore.Variable(x0)
    deep(x).backward()
    deep(y, every=10).backward()
    np.testing.assert_array_equal(xp2.numpy(y.grad.data), xp2.numpy(x.grad.data))


def test_a_block_writing_into_a_variable_is_refused_saying_so():
    """An in-place Function on a buffer (or .data set) in the block: its recomputation would
    write again (buf 2 for 1, and w's gradient 2 for 1). Refused, as before, but the error said
    "the block created a weight", sending the user to call the model once first; a counter the
    results do not read was written twice, with no error; and one the block made is refused
    too: Variable(buf), or one it keeps from call to call, would be written twice."""
    from test_function import AddOneInPlace

    buf, w = Variable(np.zeros(3), requires_grad=False), Variable(np.ones(3))
    with pytest.raises(RuntimeError, match=r"wrote into the Variable of shape \(3,\) and dtype "
                                           r"float64 \(by an in-place Function\), not an array the "
                                           r"block's gradcore ops made .*: its recomputation in "
                                           r"backward would write"):
        gradcore.checkpoint(lambda w: F.sum(w * AddOneInPlace()(buf)), w)
    np.testing.assert_array_equal(buf.data, np.ones(3))  # the first run's write, once

    def counts(w):
        buf.data = buf.data + 1
        return F.sum(w * 2.0)
    with pytest.raises(RuntimeError, match=r"\(its \.data set\), not an array the block's"):
        gradcore.checkpoint(counts, w)
    lin = nn.Linear(2, in_size=3)  # a weight it has, clipped: no weight created

    def clips(h):
        lin.W.data = np.clip(lin.W.data, -0.1, 0.1)
        return F.sum(lin(h))
    with pytest.raises(RuntimeError, match=r"wrote into the Variable \"W\" of shape \(3, 2\)"):
        gradcore.checkpoint(clips, np.ones((1, 3)))
    with pytest.raises(RuntimeError, match=r"a Variable the block made: its recomputation would "
                                           r"write again into what the one it reads then holds"):
        gradcore.checkpoint(
            lambda w: F.sum(w * AddOneInPlace()(Variable(buf.data, requires_grad=False))), w)
    np.testing.assert_array_equal(buf.data, [3.0, 3.0, 3.0])  # +1 by `counts`, +1 here, once

    class Clamp(gradcore.Function):
        def forward(self, x):
            np.clip(x, -0.5, 0.5, out=x)
            self.mark_dirty(x)
            return x

        def backward(self, gy):
            return gy

    def detached(x):  # into one of its results, detached as mark_dirty's error advises
        d = (F.sin(x) * 2).detach()
        Clamp()(d)
        return F.sum(x * d)
    grads = []
    for use in (False, True):
        x = Variable(np.array([0.1, 0.3, 1.2, -2.0]))
        (gradcore.checkpoint(detached, x) if use else detached(x)).backward()
        grads.append(x.grad.data)
    np.testing.assert_array_equal(*grads)
    def twice(x):  # detached twice: still its own
        d = (F.sin(x) * 2).detach().detach()
        Clamp()(d)
        return F.sum(x * d)
    x = Variable(np.array([0.1, 0.3, 1.2, -2.0]))
    gradcore.checkpoint(twice, x).backward()
    np.testing.assert_array_equal(x.grad.data, grads[0])

    held = np.zeros(3)

    class Held(gradcore.Function):  # hands out an array it holds (any Function of yours may)
        def forward(self, x):
            return held

        def backward(self, gy):
            return gy * 0.0
    with pytest.raises(RuntimeError, match="returned by a Function of yours"):  # held 2 for 1
        gradcore.checkpoint(lambda x: F.sum(x) + F.sum(AddOneInPlace()(Held()(x).detach())), w)
    with pytest.raises(RuntimeError, match="wrote into the Variable"):  # through a nested block
        gradcore.checkpoint(lambda x: F.sum(x) + F.sum(AddOneInPlace()(
            gradcore.checkpoint(lambda v: Held()(v), x).detach())), w)
    np.testing.assert_array_equal(held, [2.0, 2.0, 2.0])  # each refused call's write, once
    def launders(x):  # its own result given an outside array, then written in place
        t = x * 2.0
        t.data = buf.data
        return F.sum(x * AddOneInPlace()(t.detach()))

    steps = Parameter(np.zeros((2, 2)))

    def releases_after(x):  # a view of an outside Variable written, then released
        t = F.reshape(steps, (4,))
        AddOneInPlace()(t.detach())
        t.data = None
        return F.sum(x)
    def releases_before(x):  # detached from a view of an outside Variable, then released
        t = F.reshape(steps, (4,))
        d = t.detach()
        t.data = None
        AddOneInPlace()(d)
        return F.sum(x)

    def argument_view(x):  # the same on the block's argument
        t = x.T
        d = t.detach()
        t.data = None
        AddOneInPlace()(d)
        return F.sum(x * 2.0)
    def launders_by_data(x):  # its own result given an outside array, then t.data -= 1
        t = x * 2.0
        t.data = buf.data
        t.data -= 1.0
        return F.sum(x * 2.0)
    weight = Parameter(np.zeros(3))
    weight.grad = Variable(np.ones(3))

    def steps_an_optimizer(x):  # an update in place: backward stepped again (W -2 for -1)
        gradcore.optim.SGD([weight], lr=1.0).step()
        return F.sum(x * 2.0)
    for block in (launders, releases_after, releases_before, argument_view, launders_by_data,
                  steps_an_optimizer):
        # each was accepted, and written twice (2 for 1)
        with pytest.raises(RuntimeError, match="wrote into the Variable"):
            gradcore.checkpoint(block, Variable(np.ones(3)))
    for nested in (False, True):  # a nested block's own result: the outer one's own too
        def inner(v):
            return gradcore.checkpoint(lambda v: v * 2.0, v) if nested else v * 2.0

        def writes(x):
            return F.sum(x * AddOneInPlace()(inner(x).detach()))

        def releases(x):  # DeZero's t.data = None, on a nested block's result
            t = inner(x)
            y = t + 1.0
            t.data = None
            return F.sum(y * x)
        def releases_view(x):  # a nested block's view of its argument, released
            t = gradcore.checkpoint(lambda v: v.T, x) if nested else x.T
            y = t.T + 1.0
            t.data = None
            return F.sum(y * x)
        def rebinds(x):  # its own result given another of its own arrays, then written
            h = inner(x)
            t = h + 1.0
            h.data = t.data
            return F.sum(x * 2.0) + F.sum(AddOneInPlace()(t.detach()))
        x = Parameter(np.array([1.0, 2.0, 3.0]))
        gradcore.checkpoint(rebinds, x).backward()
        np.testing.assert_array_equal(x.grad.data, [2.0, 2.0, 2.0])

        def detached_then_set(x):  # its own array, detached before the Variable got another
            t = inner(x)
            d = t.detach()
            t.data = np.ones(3)
            AddOneInPlace()(d)
            return F.sum(d * x)
        def copies(x):  # a copy a View op made of a Variable from outside (fancy indexing)
            AddOneInPlace()(outside_copy[[0, 1, 2]].detach())
            return F.sum(x * x)
        outside_copy = Parameter(np.zeros(3))
        x = Parameter(np.array([1.0, 2.0, 3.0]))
        gradcore.checkpoint(copies, x).backward()
        assert np.array_equal(x.grad.data, [2.0, 4.0, 6.0]) and not outside_copy.data.any()
        for block, grad in ((writes, [3.0, 5.0, 7.0]), (releases, [5.0, 9.0, 13.0]),
                            (releases_view, [3.0, 5.0, 7.0]),
                            (detached_then_set, [3.0, 5.0, 7.0])):
            x = Parameter(np.array([1.0, 2.0, 3.0]))
            gradcore.checkpoint(block, x).backward()
            np.testing.assert_array_equal(x.grad.data, grad)
    cache = {}

    def caches(x):  # its own result, kept in a dict the recomputation reads instead
        if "h" not in cache:
            cache["h"] = F.sin(x)
        return F.sum(x * AddOneInPlace()(cache["h"].detach()))
    y = gradcore.checkpoint(caches, Variable(np.ones(3)))
    with pytest.raises(RuntimeError, match=r"computed again during backward, the block wrote into "
                                           r"the Variable .* which was there before it ran again"):
        y.backward()

    class Second(gradcore.Function):  # returns its array argument (a forward may)
        def forward(self, x, b):
            return b

        def backward(self, gy):
            return gy, None
    with pytest.raises(RuntimeError, match="wrote into the Variable"):  # buf 2 for 1
        gradcore.checkpoint(lambda x: F.sum(x) + F.sum(
            AddOneInPlace()(Second()(x, buf.data).detach())), w)
    outside = Parameter(np.zeros((2, 2)))
    for view in (lambda v: v.T, lambda v: v.reshape(4), lambda v: v[0:1]):
        # a view of a Variable from outside, detached: its memory (written twice: 2 for 1)
        with pytest.raises(RuntimeError, match="wrote into the Variable"):
            gradcore.checkpoint(
                lambda x: F.sum(x) + F.sum(AddOneInPlace()(view(outside).detach())), w)

    def own(w):  # a constant it makes with no data first: its own, made anew by each run
        d = Variable(None)
        d.data = np.full(3, 2.0)
        return F.sum(w * d)
    for use in (False, True):
        w = Variable(np.ones(3))
        y = gradcore.checkpoint(own, w) if use else own(w)
        y.backward()
        assert y.data == 6.0 and np.array_equal(w.grad.data, [2.0, 2.0, 2.0])


def test_a_write_into_a_result_the_block_detached_runs_on_every_library(xp2):
    """On array-api-strict, which cannot say which arrays share memory, the block's own result,
    detached and written in place, was taken for a view of its argument and refused."""
    from test_function import AddOneInPlace

    def block(x):
        return F.sum(x * AddOneInPlace()((x * 3).detach()))
    grads = []
    for use in (False, True):
        x = Variable(xp2.asarray([1.0, 2.0, 3.0]))
        (gradcore.checkpoint(block, x) if use else block(x)).backward()
        grads.append(xp2.numpy(x.grad.data))
    np.testing.assert_array_equal(*grads)


def test_hooks_an_inner_block_registers_run_once_under_an_outer_checkpoint():
    """Nested checkpoints: the inner block's first run, inside the outer one's recomputation,
    kept its hooks (the outer's recomputation took off only its own): the hook ran twice, W's
    gradient 0.25 of the plain run's, and stayed registered twice."""
    grads = []
    for both in (False, True):
        W = Parameter(np.array([0.5, -1.0, 2.0]))

        def inner(h, W=W):
            W.register_hook(lambda g: g * 0.5)
            return F.sin(h * W)

        def outer(h, both=both):
            return F.sum((gradcore.checkpoint(inner, h) if both else inner(h)) ** 2)
        x = Variable(np.array([0.1, 0.2, 0.3]))
        (gradcore.checkpoint(outer, x) if both else outer(x)).backward()
        grads.append(W.grad.data)
        assert len(W._hooks) == 1
    np.testing.assert_array_equal(*grads)


def test_a_block_refused_for_creating_weights_leaves_them_uncreated():
    """A fresh BatchNorm checkpointed: refused after its first run had made gamma and beta and
    counted the batch in its statistics, so the call the error advises counted it twice
    (avg_mean -0.0334 for -0.0176)."""
    x = Variable(np.random.default_rng(3).standard_normal((5, 2)))
    bn, plain = nn.BatchNorm(dtype=np.float64), nn.BatchNorm(dtype=np.float64)
    with pytest.raises(RuntimeError, match="created 2 weights"):
        gradcore.checkpoint(bn, x)
    assert all(v.data is None for v in (bn.gamma, bn.beta, bn.avg_mean, bn.avg_var))
    bn(x), plain(x)
    np.testing.assert_array_equal(bn.avg_mean.data, plain.avg_mean.data)
    np.testing.assert_array_equal(bn.avg_var.data, plain.avg_var.data)
    # an RNN's h is put back, and the generator where its weights' draws began: the advised
    # call is the first step, with the weights a plain first call draws (it drew others, and
    # ran from the refused call's h)
    x = Variable(np.ones((1, 2)), requires_grad=False)
    runs = []
    for use in (True, False):
        np.random.seed(0)
        rnn = nn.RNN(3)
        if use:
            with pytest.raises(RuntimeError, match="created 2 weights"):
                gradcore.checkpoint(rnn, x)
            assert rnn.h is None
        h = rnn(x)
        F.sum(h).backward()
        runs.append((h.data, rnn.x2h.W.data, rnn.x2h.W.grad.data))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    # a BatchNorm that has its weights, beside a lazy Linear: its statistics as they were; a
    # hook the block registered, taken off (it ran twice in each later backward)
    bn = nn.BatchNorm(dtype=np.float64)
    bn(x := Variable(np.random.default_rng(0).standard_normal((5, 3))))
    before = bn.avg_mean.data.copy(), bn.avg_var.data.copy()
    pre = nn.Linear(3, in_size=3, dtype="float64")

    def block(h):
        pre.W.register_hook(lambda g: g)
        return nn.Linear(2)(bn(pre(h)))
    with pytest.raises(RuntimeError, match="created 2 weights"):
        gradcore.checkpoint(block, x)
    from test_compile import same
    assert same([bn.avg_mean.data, bn.avg_var.data], list(before)) and not pre.W._hooks


def test_keyword_arguments_are_passed_to_the_block_as_pytorchs_are():
    """checkpoint(fn, h=x, scale=2.0) raised TypeError (PyTorch passes them on, a Variable
    among them the block's input); its own use_reentrant... are taken, not passed to fn."""
    def block(h, scale, shift=None):
        return F.sin(h) * scale + (0.0 if shift is None else shift)

    for use in (False, True):
        x, shift = Variable(np.array([1.0, 2.0])), Variable(np.array([0.5, 0.25]))
        y = (gradcore.checkpoint(block, h=x, scale=2.0, shift=shift, use_reentrant=False,
                                 determinism_check="default", debug=False)
             if use else block(x, scale=2.0, shift=shift))
        F.sum(y * y).backward()
        if not use:
            want = (y.data, x.grad.data, shift.grad.data)
    np.testing.assert_array_equal(y.data, want[0])
    np.testing.assert_array_equal(x.grad.data, want[1])
    np.testing.assert_array_equal(shift.grad.data, want[2])
    with pytest.raises(ValueError, match="determinism_check must be 'default' or 'none'"):
        gradcore.checkpoint(block, x, scale=2.0, determinism_check="bogus")


def test_parameters_inside_a_block_get_their_gradients_and_dropout_repeats():
    def make():
        np.random.seed(0)
        return nn.Sequential(nn.Linear(8), nn.Tanh(), nn.Linear(8), nn.Tanh(), nn.Linear(2))

    eager, checked = make(), make()
    x = np.random.default_rng(1).standard_normal((5, 3))
    # both weights named, in the order they were made: W drew random numbers, b is zeros
    with pytest.raises(RuntimeError, match=r"created 2 weights \('W', shape \(3, 4\); 'b', "
                                           r"shape \(4,\)\) as it ran.*call the model once"):
        gradcore.checkpoint(lambda h: nn.Linear(4)(h), x)
    with pytest.raises(RuntimeError, match=r"created a weight \('W', shape \(3, 4\)\) as"):
        gradcore.checkpoint(lambda h: nn.Linear(4, nobias=True)(h), x)
    for model in (eager, checked):
        np.random.seed(3)
        model(x)  # the lazy layers make their weights
    for model, use in ((eager, False), (checked, True)):
        np.random.seed(7)  # dropout's masks
        model.cleargrads()

        def block(h, model=model):
            return F.dropout(model[1](model[0](h)), 0.4)
        h = gradcore.checkpoint(block, x) if use else block(x)
        F.sum(model[4](model[3](model[2](h))) ** 2).backward()
    for p, q in zip(checked.params(), eager.params()):
        np.testing.assert_array_equal(p.grad.data, q.grad.data)


def test_batch_norm_in_a_block_updates_its_running_statistics_once():
    x = np.random.default_rng(2).standard_normal((6, 3)) + 1.5
    norms = [nn.BatchNorm(), nn.BatchNorm()]
    for norm, use in zip(norms, (False, True)):
        with gradcore.test_mode():
            norm(x)  # creates gamma and beta, leaves the statistics alone
        for _ in range(3):
            h = gradcore.checkpoint(norm, Variable(x)) if use else norm(Variable(x))
            F.sum(h * h).backward()
    np.testing.assert_array_equal(norms[1].avg_mean.data, norms[0].avg_mean.data)
    np.testing.assert_array_equal(norms[1].avg_var.data, norms[0].avg_var.data)


def teacher_and_student(xp, use, nested=False):
    """x's, gamma's and beta's gradients through a test-mode (teacher) branch of batch norm,
    checkpointed if `use` (inside another checkpoint too if `nested`), and a train-mode branch
    through the same statistics after it, which updates them in place before the one backward."""
    rng = np.random.default_rng(3)
    mean, var = xp.asarray(rng.standard_normal(3)), xp.asarray(rng.random(3) + 0.5)
    gamma = Variable(xp.asarray(rng.random(3) + 0.5))
    beta = Variable(xp.asarray(rng.standard_normal(3)))
    x = Variable(xp.asarray(rng.standard_normal((4, 3))))

    def norm(h):
        return F.batch_norm(h, gamma, beta, mean, var)

    def teacher(h):
        if not use:
            return norm(h) * h
        if nested:
            return gradcore.checkpoint(lambda u: gradcore.checkpoint(norm, u) * u, h)
        return gradcore.checkpoint(lambda u: norm(u) * u, h)

    with gradcore.test_mode():
        y = teacher(x)
    student = norm(Variable(xp.asarray(rng.standard_normal((8, 3)) * 5 + 2)))
    F.sum(y * y + student[:4]).backward()
    return [xp.numpy(v.grad.data) for v in (x, gamma, beta)]


@pytest.mark.parametrize("nested", [False, True])
def test_a_test_mode_block_reads_the_running_statistics_of_its_first_run_again(xp2, nested):
    for checked, plain in zip(teacher_and_student(xp2, True, nested),
                              teacher_and_student(xp2, False)):
        np.testing.assert_array_equal(checked, plain)


def test_a_test_mode_block_reading_its_statistics_otherwise_the_second_time_is_refused():
    rng = np.random.default_rng(4)
    mean, var, gamma, beta = np.zeros(3), np.ones(3), Variable(np.ones(3)), Variable(np.zeros(3))
    for counts, match in (([2, 1], r"running statistics\) 1 times where they first read it 2"),
                          ([1, 2], r"read 2: batch_norm's running statistics.*nothing more")):
        runs = iter(counts)

        def block(h):
            for _ in range(next(runs)):
                h = F.batch_norm(h, gamma, beta, mean, var)
            return h

        with gradcore.test_mode():
            y = gradcore.checkpoint(block, Variable(rng.standard_normal((4, 3))))
        with pytest.raises(RuntimeError, match=match):
            F.sum(y).backward()


def test_another_threads_batch_norm_while_a_block_runs_is_none_of_the_blocks():
    """While a test-mode block waits, another thread reads the same statistics in test mode and
    updates them in train mode: backward reads what the block read, and only that."""
    rng = np.random.default_rng(5)
    norm = nn.BatchNorm()
    norm(rng.standard_normal((8, 3)) * 5)
    started, done = threading.Event(), threading.Event()

    def other():
        started.wait()
        with gradcore.test_mode():
            norm(rng.standard_normal((4, 3)))
        norm(rng.standard_normal((8, 3)) * 50 + 3)
        done.set()

    def block(h):
        h = norm(h) * h
        if not done.is_set():  # the first run only
            started.set()
            done.wait()
        return h

    x = rng.standard_normal((4, 3))
    plain, h = Variable(x), Variable(x)
    with gradcore.test_mode():
        F.sum((norm(plain) * plain) ** 2).backward()  # with the statistics as they are now
    thread = threading.Thread(target=other)
    thread.start()
    with gradcore.test_mode():
        y = gradcore.checkpoint(block, h)
    thread.join()
    F.sum(y * y).backward()
    np.testing.assert_allclose(h.grad.data, plain.grad.data, rtol=1e-12)


def test_a_compiled_step_with_a_checkpointed_test_mode_branch_reads_the_statistics_it_used():
    def make(use):
        norm = nn.BatchNorm(dtype=np.float64)
        norm(np.linspace(-3.0, 5.0, 24).reshape(8, 3))

        def step(x, t):
            h = Variable(x)
            with gradcore.test_mode():
                y = gradcore.checkpoint(norm, h) if use else norm(h)
            loss = F.sum(y * y) + F.sum(norm(t))  # the train-mode branch updates the statistics
            norm.cleargrads()
            loss.backward()
            return h.grad, norm.gamma.grad, norm.beta.grad
        return step, norm

    (compiled, checked), (eager, plain) = make(True), make(False)
    compiled = gradcore.compile(compiled)
    rng = np.random.default_rng(6)
    for i in range(4):
        x, t = rng.standard_normal((4, 3)), rng.standard_normal((8, 3)) * (i + 2) + i
        for got, want in zip(compiled(x, t), eager(x, t)):
            np.testing.assert_allclose(got.data, want.data, rtol=1e-12)
        np.testing.assert_allclose(checked.avg_var.data, plain.avg_var.data, rtol=1e-12)
    assert compiled.stats()["replays"] == 3


def _with_other_draws(when, xp):
    """A block of two dropouts during which another thread draws 50 numbers: in its first run
    between the masks, and, if `when` is "both", in its second run before the first mask (the
    same count in both runs: a check of where the generator ended would not see it)."""
    runs = []

    def let_another_thread_draw():
        drawn, done = threading.Event(), threading.Event()

        def other():
            drawn.wait()
            F.dropout(Variable(xp.asarray(np.ones(50))), 0.5)
            done.set()
        threading.Thread(target=other).start()
        drawn.set()
        done.wait()

    def block(h):
        runs.append(len(runs))
        if len(runs) == 2 and when == "both":
            let_another_thread_draw()
        h = F.dropout(h, 0.5)
        if len(runs) == 1:
            let_another_thread_draw()
        return F.dropout(h, 0.5)
    return block


def test_another_threads_draws_inside_a_block_the_first_time_leave_its_masks_as_they_were(xp2):
    x = Variable(xp2.asarray(np.ones(50)))
    y = gradcore.checkpoint(_with_other_draws("first", xp2), x)
    F.sum(y).backward()
    mask = xp2.numpy(y.data)
    assert 0 < np.count_nonzero(mask) < 50
    np.testing.assert_array_equal(xp2.numpy(x.grad.data), mask)  # y = x * mask1 * mask2


def test_another_threads_draws_inside_a_block_both_times_are_refused(xp2):
    """They could be the block's own, handed to that thread: their numbers are not the block's
    to draw again (the same count both times: the generator's end position cannot tell)."""
    y = gradcore.checkpoint(_with_other_draws("both", xp2), Variable(xp2.asarray(np.ones(50))))
    with pytest.raises(RuntimeError, match="another thread"):
        F.sum(y).backward()


def test_a_block_handing_its_dropout_to_a_thread_pool_is_refused_not_given_new_masks():
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        y = gradcore.checkpoint(lambda h: pool.submit(F.dropout, h, 0.5).result(),
                                Variable(np.ones(40)))
        with pytest.raises(RuntimeError, match="work the block handed it"):
            F.sum(y).backward()


def test_blocks_with_dropout_beside_threads_drawing_all_the_time_never_get_other_masks():
    """Each backward either gives the forward's masks or refuses (when the others drew while
    the block ran again)."""
    stop = threading.Event()

    def draw_on(i):
        while not stop.is_set():
            if i:
                np.random.rand(64)
            else:
                F.dropout(Variable(np.ones(7)), 0.5)

    others = [threading.Thread(target=draw_on, args=(i,)) for i in range(2)]
    for t in others:
        t.start()
    right = 0
    try:
        for _ in range(400):  # until 10 come right (most are refused on a busy machine)
            if right == 10:
                break
            x = Variable(np.ones(64))
            y = gradcore.checkpoint(lambda h: F.dropout(h, 0.3), x)
            try:
                F.sum(y).backward()
            except RuntimeError as e:
                assert "another thread" in str(e)
                continue
            np.testing.assert_array_equal(x.grad.data, y.data)
            right += 1
    finally:
        stop.set()
        for t in others:
            t.join()
    assert right > 0


def test_a_noted_draw_is_one_piece_for_threads_drawing_from_numpy_random():
    """Reading the state, drawing and reading where that left the generator hold NumPy's own
    lock: another thread's numpy.random call cannot draw the block's numbers in between."""
    stop, theirs = threading.Event(), []

    def draw_on():
        while not stop.is_set():
            theirs.append(np.random.rand(64))

    other = threading.Thread(target=draw_on)
    other.start()
    ours = []
    try:
        for _ in range(300):
            log = gradcore.random.DrawLog(backends.NUMPY, backends.CPU)
            with log:
                ours.append(tuple(F.dropout(Variable(np.ones(64)), 0.3).data != 0))
    finally:
        stop.set()
        other.join()
    assert not {tuple(u > 0.3) for u in theirs}.intersection(ours)


def test_a_gradient_penalty_through_a_checkpointed_block_inside_another_is_drawn_again():
    def outer(h):
        y = gradcore.checkpoint(lambda z: F.dropout(z * z, 0.5), h)
        g, = gradcore.grad(F.sum(y), h, create_graph=True)
        return g * y

    results = []
    for use in (False, True):
        gradcore.manual_seed(0)
        x = Variable(np.linspace(0.5, 2.0, 20))
        out = gradcore.checkpoint(outer, x) if use else outer(x)
        F.sum(out).backward()
        results.append((out.data, x.grad.data, np.random.rand(3)))
    for plain, checked in zip(*results):
        np.testing.assert_allclose(checked, plain, rtol=1e-12)


def test_a_block_drawing_from_numpy_itself_while_another_thread_draws_is_refused():
    """The block's own numpy.random draw cannot be placed again when another thread drew in the
    first run: backward raises rather than use other numbers."""
    drawn, done = threading.Event(), threading.Event()

    def other():
        drawn.wait()
        F.dropout(Variable(np.ones(50)), 0.5)
        done.set()

    def block(h):
        h = F.dropout(h, 0.5)
        if not done.is_set():  # the first run only
            drawn.set()
            done.wait()
        return h * Variable(np.random.rand(*h.shape))

    thread = threading.Thread(target=other)
    thread.start()
    x = Variable(np.ones(50))
    y = gradcore.checkpoint(block, x)
    thread.join()
    with pytest.raises(RuntimeError, match="another thread"):
        F.sum(y).backward()


def test_a_block_that_draws_otherwise_the_second_time_is_refused():
    shapes = iter([(50,), (40,)])

    def block(h):
        return h * F.dropout(Variable(np.ones(next(shapes))), 0.5)[:40]

    x = Variable(np.ones(40))
    y = gradcore.checkpoint(block, x)
    with pytest.raises(RuntimeError, match=r"drew other random numbers.*shape \(40,\).*"
                                           r"shape \(50,\)"):
        F.sum(y).backward()


def test_a_block_that_waits_for_threads_drawing_returns():
    import concurrent.futures

    def block(h):
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            a, b = pool.map(lambda _: F.dropout(h, 0.5), range(2))
        return a + b

    done = []
    thread = threading.Thread(target=lambda: done.append(
        gradcore.checkpoint(block, Variable(np.ones(8)))), daemon=True)
    thread.start()
    thread.join(30)
    assert done, "checkpoint did not return: a lock held across the block?"


# --- recomputations that set NumPy's generator back, with other threads at work
def _numpy_position():
    return backends.NUMPY.random_position(backends.CPU)


def _keep_doubled(h, before=None, after=None):
    """h * 2 where the block's own numpy.random draw keeps it (so dy/dx = y / x); before()
    and after() run around the draw."""
    if before:
        before()
    keep = np.random.rand(*h.shape) > 0.5
    if after:
        after()
    return h * keep * 2.0


def _in_threads(target, names):
    threads = [threading.Thread(target=target, name=name) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)


def test_backward_through_one_block_in_two_threads_leaves_numpy_s_generator_where_it_was():
    """Each recomputation sets the generator back to where the block began and, at its end,
    puts it back where it found it: two at once would put it "back" where the other had set it."""
    a_inside, b_inside, a_done = threading.Event(), threading.Event(), threading.Event()

    def block(h):
        name = threading.current_thread().name
        if name == "a":  # b's recomputation would begin meanwhile ...
            a_inside.set()
            b_inside.wait(0.5)
        elif name == "b":  # ... and end after a's
            b_inside.set()
            a_done.wait(0.5)
        return _keep_doubled(h)

    np.random.seed(0)
    x = Variable(np.random.rand(200) + 1)
    y = gradcore.checkpoint(block, x)
    before, grads = _numpy_position(), {}

    def backward():
        name = threading.current_thread().name
        if name == "b":
            a_inside.wait(5)
        grads[name], = gradcore.grad(F.sum(y), [x])
        a_done.set()

    _in_threads(backward, "ab")
    assert _numpy_position() == before
    for name in "ab":
        np.testing.assert_array_equal(grads[name].data, y.data / x.data)


def test_blocks_computed_again_in_two_threads_at_once_get_their_own_numbers():
    """Two blocks drawing from numpy.random themselves, computed again in two threads at once:
    each draws its own numbers again, not numbers from where the other set the generator."""
    a_inside, b_inside, a_drew, b_done = (threading.Event() for _ in range(4))

    def block(h):
        name = threading.current_thread().name
        if name == "a":
            return _keep_doubled(h, lambda: (a_inside.set(), b_inside.wait(0.5)),
                                 lambda: (a_drew.set(), b_done.wait(0.5)))
        if name == "b":
            return _keep_doubled(h, lambda: (b_inside.set(), a_drew.wait(0.5)))
        return _keep_doubled(h)

    np.random.seed(1)
    x = {name: Variable(np.random.rand(200) + 1) for name in "ab"}
    y = {name: gradcore.checkpoint(block, x[name]) for name in "ab"}

    def backward():
        name = threading.current_thread().name
        if name == "b":
            a_inside.wait(5)
        try:
            y[name].backward()
        finally:
            b_done.set()

    _in_threads(backward, "ab")
    for name in "ab":
        np.testing.assert_array_equal(x[name].grad.data, y[name].data / x[name].data)


def test_dropout_in_another_thread_while_a_block_is_computed_again_draws_new_numbers():
    """While the block's recomputation has set the generator back, another thread's dropout
    draws from where the generator is for it, not the block's numbers again."""
    masks = []

    def other():
        masks.append(F.dropout(Variable(np.ones(50)), 0.5).data)

    def block(h):
        if recomputing():  # work handed to a thread, say
            thread = threading.Thread(target=other)
            thread.start()
            thread.join()
        return _keep_doubled(h)

    np.random.seed(2)
    y = gradcore.checkpoint(block, Variable(np.ones(50)))
    generator = np.random.RandomState()
    generator.set_state(np.random.get_state())
    expected = (generator.rand(50) > 0.5) * 2.0
    with pytest.raises(RuntimeError, match="another thread"):  # it may be the block's work
        F.sum(y).backward()
    np.testing.assert_array_equal(masks[0], expected)
    assert _numpy_position() == backends.NUMPY.random_position(backends.CPU,
                                                                generator.get_state())


def test_a_block_drawing_numpy_itself_while_another_threads_block_is_computed_again_is_refused():
    """Its own numpy.random draw came from where the other recomputation had set the generator:
    computed again, it cannot draw that again, even when another thread's dropout moved the
    generator meanwhile by as many numbers as it draws itself."""
    a_inside, b_ran = threading.Event(), threading.Event()

    def block_a(h):
        if threading.current_thread().name == "a":
            a_inside.set()
            b_ran.wait(5)
        return _keep_doubled(h)

    def block_b(h):
        y = _keep_doubled(h)
        if not recomputing():
            thread = threading.Thread(target=lambda: F.dropout(Variable(np.ones(50)), 0.5))
            thread.start()
            thread.join()
        return y

    np.random.seed(3)
    y_a = gradcore.checkpoint(block_a, Variable(np.ones(50)))

    def backward():
        with pytest.raises(RuntimeError, match="another thread"):  # the dropout: maybe a's
            F.sum(y_a).backward()

    thread = threading.Thread(target=backward, name="a")
    thread.start()
    a_inside.wait(5)
    y_b = gradcore.checkpoint(block_b, Variable(np.ones(50)))
    b_ran.set()
    thread.join()
    with pytest.raises(RuntimeError, match="cannot be drawn again"):
        F.sum(y_b).backward()


def test_a_recomputation_waiting_for_another_that_waits_for_it_raises(monkeypatch):
    monkeypatch.setattr(gradcore.random, "_WAIT", 0.2)
    a_inside, b_failed = threading.Event(), threading.Event()

    def block(h):
        if threading.current_thread().name == "a":
            a_inside.set()
            b_failed.wait(5)  # b's backward, say, at a barrier
        return _keep_doubled(h)

    np.random.seed(4)
    x_a, x_b = Variable(np.random.rand(20) + 1), Variable(np.random.rand(20) + 1)
    y_a, y_b = gradcore.checkpoint(block, x_a), gradcore.checkpoint(block, x_b)
    thread = threading.Thread(target=lambda: F.sum(y_a).backward(), name="a")
    thread.start()
    a_inside.wait(5)
    with pytest.raises(RuntimeError, match=r"waited 0\.2 s for another thread's checkpointed"):
        F.sum(y_b).backward()
    b_failed.set()
    thread.join()
    np.testing.assert_array_equal(x_a.grad.data, y_a.data / x_a.data)


def test_a_block_without_random_ops_ignores_other_draws_and_leaves_the_generator_alone():
    x = Variable(np.linspace(-1, 1, 5))
    y = gradcore.checkpoint(F.tanh, x)
    np.random.seed(1)
    np.random.rand(3)  # drawn between forward and backward: no business of the block's
    expected = np.random.rand(2)
    np.random.seed(1)
    np.random.rand(3)
    F.sum(y).backward()
    np.testing.assert_array_equal(np.random.rand(2), expected)
    np.testing.assert_allclose(x.grad.data, 1 - np.tanh(x.data) ** 2)


def test_nested_blocks_and_draws_of_numpy_s_own_repeat_their_numbers():
    def inner(h):
        return F.dropout(h, 0.5)

    def outer(h):
        own = Variable(np.random.rand(*h.shape) < 0.5)  # a DeZero-style mask of the block's
        return gradcore.checkpoint(inner, F.dropout(h, 0.5) * own)

    results = []
    for use in (False, True):
        np.random.seed(4)
        x = Variable(np.ones(16))
        y = gradcore.checkpoint(outer, x) if use else outer(x)
        F.sum(y).backward()
        results.append((y.data.copy(), x.grad.data.copy(), np.random.rand()))
    for plain, checked in zip(*results):
        np.testing.assert_array_equal(checked, plain)


def test_what_comes_after_a_block_draws_what_it_would_without_the_checkpoint():
    x = np.ones(50)
    masks = []
    for use in (False, True):
        np.random.seed(5)
        block = (lambda h: F.dropout(h, 0.5))
        h = gradcore.checkpoint(block, Variable(x)) if use else block(Variable(x))
        masks.append((h.data.copy(), F.dropout(Variable(x), 0.5).data.copy()))
        F.sum(h).backward()
    np.testing.assert_array_equal(masks[0][0], masks[1][0])
    np.testing.assert_array_equal(masks[0][1], masks[1][1])


def test_grad_leaves_every_grad_alone_and_second_order_works():
    w = gradcore.Parameter(np.array([0.3, -0.7, 1.1]))
    x = gradcore.Variable(np.array([0.5, 1.5, -1.0]))

    def block(h):
        return F.tanh(h * w) * h

    def f(use):
        h = gradcore.checkpoint(block, x) if use else block(x)
        return F.sum(h * h)

    expected = gradcore.grad(f(False), [x, w], create_graph=True)
    got = gradcore.grad(f(True), [x, w], create_graph=True)
    assert w.grad is None and x.grad is None
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g.data, e.data, rtol=1e-14)
    second = gradcore.grad(F.sum(got[0]), [x, w])
    second_expected = gradcore.grad(F.sum(expected[0]), [x, w])
    for g, e in zip(second, second_expected):
        np.testing.assert_allclose(g.data, e.data, rtol=1e-13)


def test_checkpoints_nest_and_blocks_with_several_results():
    def inner(h):
        return F.sin(h) * 2.0, F.cos(h)

    def outer(h):
        a, b = gradcore.checkpoint(inner, h)
        return a * b + F.exp(h * 0.1)

    x0 = np.linspace(-1, 1, 7)
    x, y = gradcore.Variable(x0), gradcore.Variable(x0)
    a, b = inner(x)
    F.sum(a * b + F.exp(x * 0.1)).backward()
    F.sum(gradcore.checkpoint(outer, y)).backward()
    np.testing.assert_allclose(y.grad.data, x.grad.data, rtol=1e-15)


def test_the_blocks_intermediate_arrays_are_not_kept():
    x0 = np.linspace(-2, 2, 100_000)
    peaks = {}
    for every in (None, 10):
        x = gradcore.Variable(x0)
        tracemalloc.start()
        deep(x, layers=60, every=every).backward()
        peaks[every] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    # eager keeps 60 layers of 0.8 MB; checkpoints keep 6 inputs and one block at a time
    assert peaks[10] < 0.35 * peaks[None], peaks


def test_checkpoint_checks_its_arguments():
    with pytest.raises(TypeError, match="at least one Variable or array"):
        gradcore.checkpoint(lambda n: n, 3)
    with pytest.raises(TypeError, match="must return a Variable"):
        gradcore.checkpoint(lambda h: "no", np.ones(2))
    with pytest.raises(TypeError, match="got an empty tuple"):
        gradcore.checkpoint(lambda h: (), np.ones(2))
    with pytest.raises(TypeError, match="got a tuple holding tuple; flatten it"):
        gradcore.checkpoint(lambda h: ((h * 2.0,), h * 3.0), np.ones(2))


def test_a_namedtuple_the_block_returns_comes_back_as_one_with_grad_on_and_off():
    Moments = collections.namedtuple("Moments", "mean var")
    x = Variable(np.array([1.0, 2.0, 3.0]))
    block = lambda h: Moments(F.sum(h) / 3.0, F.sum(h * h) / 3.0)  # noqa: E731
    with gradcore.no_grad():
        off = gradcore.checkpoint(block, x)
    on = gradcore.checkpoint(block, x)
    assert type(off) is Moments and type(on) is Moments
    (on.mean + on.var).backward()
    np.testing.assert_allclose(x.grad.data, [1 / 3 + 2 / 3, 1 / 3 + 4 / 3, 1 / 3 + 6 / 3])


# ============================================================ found by an adversarial review
def test_a_variable_at_two_positions_or_also_read_from_outside_gets_its_gradient_once():
    x = Variable(np.array([1.0, 2.0]))
    F.sum(gradcore.checkpoint(lambda a: a * x, x)).backward()  # x passed and read from outside
    np.testing.assert_array_equal(x.grad.data, [2.0, 4.0])
    y = Variable(np.array([1.0, 2.0]))
    F.sum(gradcore.checkpoint(lambda a, b: a * b, y, y)).backward()
    np.testing.assert_array_equal(y.grad.data, [2.0, 4.0])


def test_an_input_handed_back_as_it_is_keeps_its_gradient():
    t = Variable(np.array([1.0, 2.0]))
    a, b = gradcore.checkpoint(lambda u: (u, u * 3.0), t)
    F.sum(a + b).backward()
    np.testing.assert_array_equal(t.grad.data, [4.0, 4.0])
    x = Variable(np.array([1.0, 2.0]))
    F.sum(gradcore.checkpoint(lambda u: u, x) * 2.0).backward()
    np.testing.assert_array_equal(x.grad.data, [2.0, 2.0])


def test_a_constant_read_by_the_block_and_written_before_backward_stops_it():
    x = Variable(np.array([1.0, 2.0]))
    scale = Variable(np.array([2.0, 2.0]), requires_grad=False)
    y = F.sum(gradcore.checkpoint(lambda a: a * a * scale, x))
    scale.data = np.array([5.0, 5.0])  # a counted write: the recompute would use it
    with pytest.raises(RuntimeError, match="checkpoint: its input 1.*was written after"):
        y.backward()


def test_a_hook_on_a_blocks_input_runs_once_per_backward():
    # the outer walk runs it, on the input's whole gradient: not also in the recompute's own
    # differentiation, where the input is where that stops (a hook doubling it doubled twice)
    def block(u, v):
        return F.sin(u) * 3.0 * v

    def run(checkpointed, use_grad):
        calls = []
        x = Variable(np.array([0.1, 0.2, 0.3]))
        w = Variable(np.array([1.0, 2.0, 3.0]))  # a leaf passed to the block
        a = x * 2.0
        a.register_hook(lambda g: calls.append("a") or g * 2.0)
        w.register_hook(lambda g: calls.append("w") or g * 10.0)
        y = F.sum(gradcore.checkpoint(block, a, w) if checkpointed else block(a, w))
        if use_grad:
            return [g.data for g in gradcore.grad(y, [x, w])], sorted(calls)
        y.backward()
        return [x.grad.data, w.grad.data], sorted(calls)

    for use_grad in (False, True):
        eager, checkpointed = run(False, use_grad), run(True, use_grad)
        assert checkpointed[1] == eager[1] == ["a", "w"]
        expected = [12.0 * np.cos([0.2, 0.4, 0.6]) * [1.0, 2.0, 3.0],
                    30.0 * np.sin([0.2, 0.4, 0.6])]
        for got, want, reference in zip(checkpointed[0], expected, eager[0]):
            np.testing.assert_array_equal(got, reference)
            np.testing.assert_allclose(got, want, rtol=1e-14)


def test_a_variable_from_outside_handed_back_as_it_is_gets_its_gradient():
    # a Parameter the block returns without using it comes back as itself, as does a result
    # computed before the block, so both get their gradients (as with torch.utils.checkpoint)
    def run(checkpointed, handed_back):
        w = gradcore.Parameter(np.array([1.0, 2.0, 3.0]))
        x = Variable(np.array([0.5, -1.0, 2.0]))
        h = w * 3.0

        def block(u):
            return u * 2.0, (w if handed_back == "parameter" else h)
        a, b = gradcore.checkpoint(block, x) if checkpointed else block(x)
        F.sum(a + b * b * b).backward()
        return w.grad.data, x.grad.data

    w = np.array([1.0, 2.0, 3.0])
    for handed_back, expected in (("parameter", 3 * w * w), ("result", 81 * w * w)):
        eager, checkpointed = run(False, handed_back), run(True, handed_back)
        np.testing.assert_allclose(eager[0], expected, rtol=1e-15)
        for got, want in zip(checkpointed, eager):
            np.testing.assert_array_equal(got, want)
    p = gradcore.Parameter(np.array([1.0, 2.0]))
    g, = gradcore.grad(F.sum(gradcore.checkpoint(lambda u: (u * 1.0, p), np.ones(2))[1] ** 3),
                       [p], create_graph=True)
    np.testing.assert_array_equal(g.data, [3.0, 12.0])  # 3 p^2
    np.testing.assert_array_equal(gradcore.grad(F.sum(g), [p])[0].data, [6.0, 12.0])  # 6 p
    assert p.grad is None


def test_under_no_grad_a_block_is_a_plain_call_and_may_size_a_lazy_layer():
    x = np.random.default_rng(4).standard_normal((2, 3)).astype(np.float32)
    np.random.seed(0)
    layer = nn.Linear(4)  # its input size comes from its first call
    with gradcore.no_grad():
        y = gradcore.checkpoint(layer, x)
    assert y.shape == (2, 4) and y.creator is None
    np.testing.assert_allclose(y.data, x @ layer.W.data + layer.b.data, rtol=1e-6)
    h = Variable(x)
    F.sum(gradcore.checkpoint(layer, h) ** 2).backward()  # the weight exists: checkpointed
    out = x @ layer.W.data + layer.b.data
    np.testing.assert_allclose(h.grad.data, 2 * out @ layer.W.data.T, rtol=1e-5)
    np.testing.assert_allclose(layer.W.grad.data, 2 * x.T @ out, rtol=1e-5)


def test_under_no_grad_the_block_still_gets_variables_and_must_return_them():
    # the same contract as with grad on: an array argument reaches fn as a Variable, and a
    # result that is not a Variable is refused (a raw array's .data is a memoryview)
    x = np.arange(3.0)
    seen = []
    with gradcore.no_grad():
        y = gradcore.checkpoint(lambda u, k: seen.append(type(u)) or u * k, x, 2.0)
        with pytest.raises(TypeError, match="must return a Variable"):
            gradcore.checkpoint(lambda u: u.data, x)
    assert seen == [Variable]
    assert isinstance(y, Variable) and y.creator is None
    assert isinstance(y.data, np.ndarray)
    np.testing.assert_array_equal(y.data, [0.0, 2.0, 4.0])
    h = Variable(x)
    with gradcore.no_grad():
        assert gradcore.checkpoint(lambda u: u, h) is h  # a plain call: handed back as it is


def test_a_forked_child_takes_the_generator_locks_another_thread_held():
    """A fork while another thread recomputes a block (holding the lock that sets the generator
    back) or draws: the child's draws and recomputations do not wait for a thread it lacks."""
    from conftest import forked_child_takes

    from gradcore import random
    assert forked_child_takes(random, ["_setting_back", "_lock"])


def test_a_result_with_no_graph_in_the_block_has_none_after_it():
    # a detached value the block returns: without the node as its creator, its gradient is
    # refused (not zeros), gradcheck leaves it out, and a write into it stops no backward
    def block(h):
        return F.sin(h), (h * 3.0).detach()
    z = Variable(np.array([0.5, -1.0]))
    y, d = gradcore.checkpoint(block, z)
    assert d.creator is None and not d.requires_grad
    np.testing.assert_array_equal(d.data, [1.5, -3.0])
    with pytest.raises(RuntimeError, match="this Variable has no graph"):
        gradcore.grad(F.sum(d), [z])
    d.data = np.zeros(2)
    F.sum(y).backward()
    np.testing.assert_allclose(z.grad.data, np.cos([0.5, -1.0]), rtol=1e-15)
    assert gradcore.utils.gradcheck(lambda h: gradcore.checkpoint(block, h), z)
    # no result with a graph: nothing to recompute, so no node at all
    alone = gradcore.checkpoint(lambda h: (h * 2.0).detach(), z)
    assert alone.creator is None and not alone.requires_grad


def test_an_argument_only_an_unused_result_reads_gets_no_gradient():
    # the walk hands the node nothing for a result the loss does not use (or a dead one), so
    # the argument only that result reads gets None, as without checkpoint: zeros would be
    # decayed by WeightDecay; a zero gradient that does reach it stays one
    def block(a, b):
        return a * 2.0, b * 3.0
    for checkpointed in (False, True):
        x, w = Variable(np.ones(3)), Variable(np.full(3, 2.0))
        a, b = gradcore.checkpoint(block, x, w) if checkpointed else block(x, w)
        gx, gw = gradcore.grad(F.sum(a), [x, w], allow_unused=True)
        np.testing.assert_array_equal(gx.data, [2.0, 2.0, 2.0])
        assert gw is None
        with pytest.raises(RuntimeError, match="input 1 was not used"):
            gradcore.grad(F.sum(a), [x, w])
        gw, = gradcore.grad(F.sum(a) + F.sum(b * 0.0), [w])
        np.testing.assert_array_equal(gw.data, [0.0, 0.0, 0.0])
        F.sum(a).backward()
        assert w.grad is None
        del b
        F.sum(a).backward()
        assert w.grad is None


# ============================================================ found by the hooks review
def test_an_intermediate_returned_beside_what_the_block_computed_from_it_gets_its_whole_gradient():
    # h's gradient is the one through y = sin(h) and the one from outside: cos(h) + 1. As a
    # sibling output of one node it saw only the outside part ([1, 1]), in gradcore.grad, in
    # retain_grad and in its hooks, while x.grad was right
    def block(a):
        h = a * 2.0
        return F.sin(h), h

    x0 = np.array([0.5, 1.5])
    whole = np.cos(2.0 * x0) + 1.0  # [1.540, 0.010]
    for checkpointed in (False, True):
        def run():
            x = Variable(x0.copy())
            y, h = gradcore.checkpoint(block, x) if checkpointed else block(x)
            return x, h, F.sum(y) + F.sum(h)
        x, h, loss = run()
        np.testing.assert_allclose(gradcore.grad(loss, [h])[0].data, whole, rtol=1e-15)
        x, h, loss = run()
        h.retain_grad()
        loss.backward()
        np.testing.assert_allclose(h.grad.data, whole, rtol=1e-15)
        x, h, loss = run()
        h.register_hook(lambda g: g * 10.0)
        loss.backward()
        np.testing.assert_allclose(x.grad.data, 2.0 * 10.0 * whole, rtol=1e-15)  # [30.81, 0.20]


def test_results_behind_results_in_three_stages_and_an_argument_handed_back_as_itself():
    def block(a):
        h1 = a * 2.0
        h2 = F.sin(h1) * h1
        return F.exp(h2) + h1, h2, h1, h1

    def loss(y, h2, h1, again):
        return F.sum(y) + F.sum(h2 * h2) + F.sum(h1 ** 3) + F.sum(again)

    x0 = np.array([0.5, 1.5])
    grads = []
    for checkpointed in (False, True):
        x = Variable(x0.copy())
        results = gradcore.checkpoint(block, x) if checkpointed else block(x)
        assert results[2] is results[3]  # one result returned twice: one Variable, as without
        g = gradcore.grad(loss(*results), [x, *results[1:3]], create_graph=True)
        grads.append([v.data for v in g] + [gradcore.grad(F.sum(g[0]), [x])[0].data])
    for got, want in zip(*grads):
        np.testing.assert_allclose(got, want, rtol=1e-14)
    h1 = 2.0 * x0
    h2 = np.sin(h1) * h1
    d_h2 = np.exp(h2) + 2.0 * h2  # through y and h2 * h2
    np.testing.assert_allclose(grads[1][1], d_h2, rtol=1e-14)
    np.testing.assert_allclose(grads[1][2], 1.0 + 3.0 * h1 ** 2 + 1.0
                               + d_h2 * (np.cos(h1) * h1 + np.sin(h1)), rtol=1e-14)
    t = Variable(np.array([1.0, 2.0]))
    hooked = []
    a, b = gradcore.checkpoint(lambda u: (u, F.sin(u)), t)
    assert a is t  # the caller's Variable, as without checkpoint: its hooks see the whole gradient
    a.register_hook(lambda g: hooked.append(g.data))
    F.sum(a + b).backward()
    np.testing.assert_allclose(hooked[0], 1.0 + np.cos([1.0, 2.0]), rtol=1e-15)


def test_hooks_a_block_registers_stay_as_its_first_run_left_them():
    # the first run registered a hook on its copy of the argument (lost), and each recompute
    # on the caller's Variable (kept): the 2nd backward reversed the gradient twice; a hook on an
    # outside Parameter was registered twice before the 1st backward ran
    def reversing(a):
        a.register_hook(lambda g: -g)
        return F.sin(a)

    x0 = np.array([0.5, 1.5])
    for checkpointed in (False, True):
        x = Variable(x0.copy())
        h = x * 2.0
        y = F.sum(gradcore.checkpoint(reversing, h) if checkpointed else reversing(h))
        for _ in range(3):
            x.cleargrad()
            y.backward()
            np.testing.assert_allclose(x.grad.data, -2.0 * np.cos(2.0 * x0), rtol=1e-15)
        assert len(h._hooks) == 1

        W = gradcore.Parameter(np.array([0.3, 0.7]))

        def scaled(a, W=W):
            W.register_hook(lambda g: g * 10.0)
            return F.sin(a * W)
        F.sum(gradcore.checkpoint(scaled, Variable(x0.copy())) if checkpointed
              else scaled(Variable(x0.copy()))).backward()
        np.testing.assert_allclose(W.grad.data, 10.0 * x0 * np.cos(x0 * W.data), rtol=1e-15)
        assert len(W._hooks) == 1

        calls = []
        leaf = Variable(x0.copy())

        def counted(a):
            a.register_post_accumulate_grad_hook(lambda v: calls.append(v))
            a.retain_grad()  # on a leaf: nothing to do, with or without checkpoint
            return F.sin(a)
        y = F.sum(gradcore.checkpoint(counted, leaf) if checkpointed else counted(leaf))
        y.backward()
        y.backward()
        assert calls == [leaf, leaf] and len(leaf._post_hooks) == 1


def test_retain_grad_a_block_calls_on_its_argument_keeps_it():
    def block(a):
        a.retain_grad()
        return F.sin(a)
    x = Variable(np.array([0.5, 1.5]))
    h = x * 2.0
    F.sum(gradcore.checkpoint(block, h)).backward()
    np.testing.assert_allclose(h.grad.data, np.cos([1.0, 3.0]), rtol=1e-15)
    assert h.retains_grad and len(h._hooks) == 1


def test_a_handle_the_block_got_removes_the_hook_from_the_callers_variable():
    # the handle was the block's copy's: remove() left the hook on the caller's Variable, which
    # went on scaling its gradient by 10 (x.grad [26.3, 2.1] for a leaf, not [2.63, 0.21])
    def run(checkpointed, leaf, remove_before):
        calls, handles = [], []
        x = Variable(np.array([0.5, 1.5]))
        a = x if leaf else x * 2.0

        def block(u):
            handles.append(u.register_hook(lambda g: calls.append("u") or g * 10.0))
            if leaf:
                handles.append(u.register_post_accumulate_grad_hook(
                    lambda v: calls.append("post")))
            return F.sin(u) * 3.0
        y = F.sum(gradcore.checkpoint(block, a) if checkpointed else block(a))
        first = list(handles)  # the first run's: each recomputation appends its own
        seen = []
        for step in range(2):
            if step == (0 if remove_before else 1):
                for handle in first:
                    handle.remove()
            x.cleargrad()
            y.backward()
            seen.append((x.grad.data, list(calls)))
        return seen

    for leaf in (True, False):
        for remove_before in (True, False):
            eager, checkpointed = run(False, leaf, remove_before), run(True, leaf, remove_before)
            for (want, want_calls), (got, got_calls) in zip(eager, checkpointed):
                np.testing.assert_array_equal(got, want)
                assert got_calls == want_calls
            d = 3.0 * np.cos([0.5, 1.5]) if leaf else 6.0 * np.cos([1.0, 3.0])
            np.testing.assert_allclose(checkpointed[1][0], d, rtol=1e-15)
            hooked = [] if remove_before else ["u", "post"] if leaf else ["u"]
            assert checkpointed[1][1] == hooked


def test_a_blocks_handle_takes_off_its_own_copy_of_a_hook_registered_outside_too():
    """double (outside), clip, double (the block's): the block's handle took off the copy the
    caller registered, and a handle of a recomputation's copy (taken off already) took off one
    of the others (x.grad 0.6 for 0.3 after it: clip, double; not 1.0)."""
    def double(g):
        return g * 2.0

    def clip(g):
        return F.clip(g, -0.5, 0.5)

    handles = []

    def block(u):
        handles.append(u.register_hook(double))
        return u * 0.3

    x = Variable(np.array([1.0]))
    a = x * 1.0
    outside = a.register_hook(double)
    a.register_hook(clip)
    y = F.sum(gradcore.checkpoint(block, a))

    def grad():
        x.cleargrad()
        y.backward(retain_graph=True)
        return x.grad.item()

    assert grad() == 1.0 and len(handles) == 2  # 0.3 doubled, clipped, doubled; recomputed
    assert a._hooks == [double, clip, double]
    handles[1].remove()  # the recomputation's: taken off after it already
    assert a._hooks == [double, clip, double] and grad() == 1.0
    handles[0].remove()
    assert a._hooks == [double, clip] and grad() == 0.5
    outside.remove()
    assert a._hooks == [clip] and grad() == 0.3


def test_what_the_block_asks_of_its_argument_is_asked_of_the_callers_variable_at_once():
    # retain_grad() and a refused register_hook, as without checkpoint: retain_grad waited for
    # the recomputation, the refusal came after the block had run
    h = Variable(np.array([0.5, 1.5])) * 2.0
    gradcore.checkpoint(lambda a: a.retain_grad() or F.sin(a), h)
    assert h.retains_grad
    ran = []

    def hooked(a):
        a.register_hook(lambda g: g)
        ran.append("after")
        return F.sin(a)
    frozen = Variable(np.array([0.5, 1.5]), requires_grad=False)
    with pytest.raises(RuntimeError, match="register_hook: this Variable does not require grad"):
        gradcore.checkpoint(hooked, frozen)
    with pytest.raises(RuntimeError, match="register_post_accumulate_grad_hook: only a leaf"):
        gradcore.checkpoint(lambda a: a.register_post_accumulate_grad_hook(print) or a * 2.0, h)
    assert ran == []


def test_a_computed_result_shares_no_version_with_the_argument(xp):
    # array-api-strict cannot say whether two arrays share memory: a computed result is not
    # taken for a view of the block's argument there either, so writing it leaves x's version
    x = Variable(xp.asarray([0.5, 1.0]))
    y = gradcore.checkpoint(lambda v: F.sin(v) * 2.0, x)
    z = F.exp(x)
    y.data = xp.asarray([0.0, 0.0])
    assert x.version == 0
    z.backward(xp.asarray([1.0, 1.0]))
    np.testing.assert_allclose(xp.numpy(x.grad.data), np.exp([0.5, 1.0]))


def test_a_view_result_shares_the_version_of_what_it_views_on_every_library(xp):
    # array-api-strict cannot say whether two arrays share memory, but its slices are views as
    # NumPy's: writing through v[0:2] changed x under sin, and backward ran on the new values
    # (x.grad [1, 0.54, -0.99], not cos([1, 2, 3])) where NumPy's and an unchecked block refuse
    blocks = {"slice": lambda v: v[0:2], "chain": lambda v: F.reshape(v, (3, 1))[0:2, 0]}
    for name, block in blocks.items():
        x = Variable(xp.asarray([1.0, 2.0, 3.0]))
        s = F.sum(F.sin(x))
        y = gradcore.checkpoint(block, x)
        y.data -= 1.0
        np.testing.assert_array_equal(xp.numpy(x.data), [0.0, 1.0, 3.0])  # a real view
        assert x.version == 1, name
        with pytest.raises(RuntimeError, match="sin: its input 0.*was written after sin ran"):
            s.backward()
    # a view of an outside Variable, and of an earlier result (one node per stage)
    W = gradcore.Parameter(xp.asarray([1.0, 2.0]))
    w, _ = gradcore.checkpoint(lambda a: (W[0:1], a * 2.0), Variable(xp.asarray([1.0])))
    w.data -= 1.0
    assert W.version == 1
    h, g = gradcore.checkpoint(lambda a: (lambda h: (h, h[0:1]))(F.sin(a)),
                               Variable(xp.asarray([1.0, 2.0])))
    t = F.sum(h * h)
    g.data -= 1.0
    assert h.version == 1
    with pytest.raises(RuntimeError, match="mul: its input 0.*was written after mul ran"):
        t.backward()


def test_a_result_that_is_a_view_of_an_argument_or_outside_variable_shares_its_version():
    # a counted write through the view changes W's memory: a backward that saved W must refuse,
    # as with W.T made without checkpoint (it ran, giving W.grad [0, 2, 4, 6])
    def views(a):
        return a.T, a[0], a.reshape(4)
    for k in range(3):
        W = gradcore.Parameter(np.array([[1.0, 2.0], [3.0, 4.0]]))
        v = gradcore.checkpoint(views, W)[k]
        t = F.sum(W * W)
        v.data -= 1.0
        assert W.version == 1
        with pytest.raises(RuntimeError, match="mul: its input 0.*was written after mul ran"):
            t.backward()
    W = gradcore.Parameter(np.array([[1.0, 2.0], [3.0, 4.0]]))
    v, _ = gradcore.checkpoint(lambda a: (W.T, a * 2.0), Variable(np.ones(2)))
    v.data = v.data[::-1]  # a new array over the same memory: still a write into W's memory
    assert W.version == 1
    fresh, _ = gradcore.checkpoint(lambda a: (W * 1.0, a * 2.0), Variable(np.ones(2)))
    fresh.data -= 1.0
    assert W.version == 1  # a result with arrays of its own: no version shared


def test_a_hook_on_a_variable_the_results_do_not_depend_on_is_registered_once():
    # W's gradient comes from outside the block: each recomputation registered the hook again
    # (W.grad 60, then 600 with 5 calls over two backward passes, not 6 with 2)
    for create_graph in (False, True):
        seen = []
        for checkpointed in (False, True):
            calls = []
            W = gradcore.Parameter(np.array([0.3, 0.7]))

            def block(a):
                W.register_hook(lambda g: calls.append("W") or g * 10.0)
                return F.sin(a)
            x = Variable(np.array([0.5, 1.5]))
            y = F.sum(gradcore.checkpoint(block, x) if checkpointed else block(x))
            y = y + F.sum(W * W)
            for _ in range(2):
                W.cleargrad()
                y.backward(create_graph=create_graph)
                np.testing.assert_allclose(W.grad.data, [6.0, 14.0], rtol=1e-15)
            seen.append((W.grad.data, calls, len(W._hooks)))
        np.testing.assert_array_equal(seen[1][0], seen[0][0])
        assert seen[1][1:] == seen[0][1:] == (["W", "W"], 1)


def test_a_hook_the_block_registers_and_removes_itself_leaves_the_callers_copy_on():
    """The caller keeps f on W; the block registers f on W too and takes it off before it
    returns. Its recomputation does the same, and taking off what the recomputation registered
    once took off the caller's copy: f never ran again."""
    W = gradcore.Parameter(np.ones(3))
    calls = []

    def f(g):
        calls.append(g.data.copy())

    W.register_hook(f)

    def block(x):
        handle = W.register_hook(f)
        y = x * W
        handle.remove()
        return y

    for _ in range(3):
        W.cleargrad()
        calls.clear()
        F.sum(gradcore.checkpoint(block, Variable(np.full(3, 2.0)))).backward()
        assert len(calls) == 1 and calls[0].tolist() == [2.0, 2.0, 2.0]
        assert W._hooks.count(f) == 1


# ==================================================== what a block reads from outside it
def rnn_losses(model, xs, checkpointed, loss_on_every_step=True):
    """The loss of a run over `xs`, one step of `model` (an RNN or LSTM) at a time, each step
    checkpointed or not: the sum of h * h over every step's h, or over the last one's."""
    loss = 0
    for x in xs:
        x = Variable(x, requires_grad=False)
        h = gradcore.checkpoint(model, x) if checkpointed else model(x)
        assert h is model.h  # as without checkpoint: the state is the result handed back
        if loss_on_every_step:
            loss = loss + F.sum(h * h)
    return loss if loss_on_every_step else F.sum(h * h)


def float64_rnn(kind, hidden_size, in_size, seed):
    """A float64 RNN or LSTM, its weights drawn after numpy.random.seed(seed)."""
    np.random.seed(seed)
    model = getattr(nn, kind)(hidden_size, in_size=in_size)
    model.to(dtype="float64")
    return model


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_an_rnn_checkpointed_step_by_step_gets_the_plain_runs_gradients_and_keeps_its_state(
        kind):
    """Each step reads the state the last one left on the layer and sets it anew. Computed
    again, a step once read the state as the last step left it, and set it: gradients off by
    up to 2.9, and the state the next forward starts from changed by backward."""
    model0 = float64_rnn(kind, 4, 3, 0)
    xs = [np.random.randn(2, 3) for _ in range(3)]
    runs = {}
    for checkpointed in (False, True):
        for every in (True, False):
            model = copy.deepcopy(model0)
            loss = rnn_losses(model, xs, checkpointed, every)
            state = {name: getattr(model, name).data.copy() for name in ("h", "c")
                     if hasattr(model, name)}
            loss.backward()
            for name, value in state.items():  # backward left the state as it was
                np.testing.assert_array_equal(getattr(model, name).data, value)
                if checkpointed:  # a node's result: the block's graph is not kept
                    assert type(getattr(model, name).creator).__name__ == "Checkpoint"
            runs[checkpointed, every] = float(loss.data), {
                name: p.grad.data for name, p in model.named_parameters()}
    assert runs[True, True][0] == runs[False, True][0]
    for name, g in runs[False, True][1].items():
        # a step's h gets three gradients (h * h twice, the next step), which the walk adds in
        # another order once a step is one node
        np.testing.assert_allclose(runs[True, True][1][name], g, rtol=1e-13, atol=1e-15)
        assert np.abs(g).max() > 0.01
    for name, g in runs[False, False][1].items():
        if kind == "RNN":  # a chain: bit for bit
            np.testing.assert_array_equal(runs[True, False][1][name], g)
        else:  # c reaches h, and the next step, in two ways
            np.testing.assert_allclose(runs[True, False][1][name], g, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
@pytest.mark.parametrize("step_between", [False, True])
def test_truncated_backprop_stops_at_unchain_backward_through_checkpointed_steps(
        kind, step_between):
    """h.unchain_backward() cut the links behind the last step's node, not the block the node
    stands for: the next chunk's backward recomputed that step and gave the weights its
    gradient too (off by 0.51 for an RNN, 0.018 for an LSTM), and after an optimizer
    step raised that W 'was written after checkpoint ran in forward'."""
    model0 = float64_rnn(kind, 4, 3, 3)
    xs = [np.random.randn(2, 3) for _ in range(6)]
    grads = {}
    for checkpointed in (False, True):
        model = copy.deepcopy(model0)
        rnn_losses(model, xs[:3], checkpointed).backward()
        # the states the last step read (an LSTM's c of this step, on the layer, aside)
        states = [weakref.ref(x) for x in model.h.creator.inputs if x.creator is not None
                  and x is not getattr(model, "c", None)] if checkpointed else []
        model.h.unchain_backward()
        kept = [ref for ref in states if ref() is not None]
        if step_between:
            for p in model.params():
                p.data = p.data - 0.1 * p.grad.data
        model.cleargrads()
        rnn_losses(model, xs[3:], checkpointed).backward()
        grads[checkpointed] = {name: p.grad.data for name, p in model.named_parameters()}
    for name, g in grads[False].items():
        np.testing.assert_allclose(grads[True][name], g, rtol=1e-13, atol=1e-15)
        assert np.abs(g).max() > 0.01
    assert states and not kept  # the cut node keeps nothing from before the cut


@pytest.mark.parametrize("block", ["linear last", "tanh last", "two results", "b after a"])
def test_unchain_backward_through_a_checkpoint_leaves_what_a_plain_run_leaves(block):
    """A plain run's a.unchain_backward() keeps a's own op and the ops of other results: a
    weight that a's last op reads, or that a second result reads, still gets a gradient. The
    node was cut whole (W.grad None for [[-1.56, -3.08], [1.56, 3.08]])."""
    def run(checkpointed):
        W = Parameter(np.array([[1.0, 2.0], [3.0, 4.0]]))
        V = Parameter(np.array([[0.5, 0.0], [0.0, 2.0]]))
        b = Parameter(np.array([0.5, -0.5]))
        x = Parameter(np.array([[1.0, -1.0]])) * 1.0  # computed: the cut reaches behind it

        def fn(x):
            if block == "linear last":
                return F.linear(F.tanh(x), W, b)
            if block == "tanh last":
                return F.tanh(F.linear(x, W, b))
            t = F.tanh(x)
            a = F.matmul(t, W)
            return a, F.matmul(a if block == "b after a" else t, V)
        out = gradcore.checkpoint(fn, x) if checkpointed else fn(x)
        a, y = (out, out) if isinstance(out, Variable) else out
        a.unchain_backward()
        F.sum(y * y).backward()
        return [None if p.grad is None else p.grad.data for p in (W, V, b)]
    plain, checkpointed = run(False), run(True)
    for g, want in zip(checkpointed, plain):
        assert (g is None) == (want is None)
        if want is not None:
            np.testing.assert_allclose(g, want, rtol=1e-14)
    assert any(g is not None for g in plain) == (block != "tanh last")


@pytest.mark.parametrize("anomaly", [False, True])
def test_a_result_unchained_behind_another_hands_its_block_nothing(anomaly):
    """a = linear(tanh(x), W), b = a @ V and c = sin(x @ V) from one block; b.unchain_backward()
    makes a a leaf, as in a plain run. a and c come from one node, which the walk still handed
    a's gradient: W.grad [[-1.009, -0.971, 0.356], ...] where a plain run gives None. In anomaly
    mode, the node's inputs, fewer after the cut, failed their fingerprint check."""
    def run(checkpointed):
        rng = np.random.default_rng(0)
        W, V, U = (Parameter(rng.standard_normal((3, 3))) for _ in range(3))

        def fn(t):
            a = F.linear(F.tanh(t), W)
            return a, F.matmul(a, V), F.sin(F.matmul(t, V))
        with gradcore.detect_anomaly() if anomaly else contextlib.nullcontext():
            x = U * 1.0
            a, b, c = gradcore.checkpoint(fn, x) if checkpointed else fn(x)
            b.unchain_backward()
            assert a.creator is None
            F.sum(a * c).backward()
        return W.grad, U.grad, V.grad.data  # x, behind b, is cut from U too
    plain, checkpointed = run(False), run(True)
    assert plain[:2] == checkpointed[:2] == (None, None)
    np.testing.assert_allclose(checkpointed[2], plain[2], rtol=1e-14)


def test_a_cut_block_holds_its_living_results_once_till_backward():
    """Computed again at the cut, the block's results were held twice till backward, once as
    the outputs and once in the graph computed again: 6 arrays where a plain run holds 4."""
    n = 200_000
    W = Parameter(np.full(n, 0.5))

    def block(t):
        h = t
        for _ in range(10):
            h = F.sin(h) * W
        return h, F.cos(h) * W

    def held(checkpointed):
        x = Parameter(np.ones(n)) * 2.0
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        a, y = gradcore.checkpoint(block, x) if checkpointed else block(x)
        del x
        a.unchain_backward()
        gc.collect()
        arrays = (tracemalloc.get_traced_memory()[0] - base) / (8 * n)
        tracemalloc.stop()
        return arrays
    plain = held(False)
    assert 3.5 < plain < 4.5  # a, y, and what their own ops read: sin(h), cos(a)
    # and the block's argument: y's own node (a stage after a's) computes it again from there
    assert held(True) <= plain + 1.1


def test_a_weight_written_before_the_cut_stops_the_gradient_at_a_checkpointed_rnn_step():
    """An optimizer step, then h.unchain_backward() (PyTorch's order: detach at the start of
    the next chunk): the step cannot be computed again as it ran, and a plain run's cut
    leaves it no op reading a weight (tanh last): the next chunk's gradients are the plain
    run's."""
    model0 = float64_rnn("RNN", 4, 3, 4)
    xs = [np.random.randn(2, 3) for _ in range(4)]
    grads = {}
    for checkpointed in (False, True):
        model = copy.deepcopy(model0)
        rnn_losses(model, xs[:2], checkpointed).backward()
        for p in model.params():
            p.data = p.data - 0.1 * p.grad.data
        model.h.unchain_backward()
        model.cleargrads()
        rnn_losses(model, xs[2:], checkpointed).backward()
        grads[checkpointed] = {name: p.grad.data for name, p in model.named_parameters()}
    for name, g in grads[False].items():
        np.testing.assert_allclose(grads[True][name], g, rtol=1e-13, atol=1e-15)


def test_an_rnns_state_reset_or_set_between_forward_and_backward_is_not_what_it_reads_again():
    model0 = float64_rnn("RNN", 3, 2, 1)
    xs = [np.random.randn(2, 2) for _ in range(3)]
    grads = []
    for change in (None, "reset", "set"):
        model = copy.deepcopy(model0)
        loss = rnn_losses(model, xs, checkpointed=change is not None)
        if change == "reset":
            model.reset_state()
        elif change == "set":
            model.h = Variable(np.ones((2, 3)))
        loss.backward()
        assert change != "set" or model.h.data.tolist() == [[1.0] * 3] * 2
        grads.append(model.x2h.W.grad.data)
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-13)
    np.testing.assert_array_equal(grads[2], grads[1])


def test_rnn_steps_checkpointed_inside_a_checkpointed_block_get_the_plain_runs_gradients():
    model0 = float64_rnn("RNN", 3, 2, 2)
    xs = [Variable(np.random.randn(2, 2), requires_grad=False) for _ in range(4)]
    grads = []
    for outer, inner in ((False, False), (True, False), (True, True)):
        model = copy.deepcopy(model0)

        def two(a, b):
            step = (lambda x: gradcore.checkpoint(model, x)) if inner else model
            return step(a), step(b)

        loss = 0
        for a, b in zip(xs[::2], xs[1::2]):
            ha, hb = gradcore.checkpoint(two, a, b) if outer else two(a, b)
            assert hb is model.h
            loss = loss + F.sum(ha * hb)
        h = model.h.data.copy()
        loss.backward()
        np.testing.assert_array_equal(model.h.data, h)
        grads.append([p.grad.data for p in model.params()])
    for got in grads[1:]:
        for g, e in zip(got, grads[0]):
            np.testing.assert_array_equal(g, e)


def test_a_weight_replaced_between_forward_and_backward_is_refused():
    """Computed again, the block read the new W: the old one got no gradient and x.grad was
    all zeros (the new W's), with no error."""
    np.random.seed(0)
    lin = nn.Linear(2, in_size=3, dtype=np.float64)
    lin.W.name = "W"
    x = Variable(np.random.randn(4, 3))
    y = gradcore.checkpoint(lin, x)
    old = lin.W
    lin.W = gradcore.Parameter(np.zeros((3, 2)))  # an EMA copy swapped in, say
    with pytest.raises(RuntimeError, match=r"the block read a Parameter of shape \(3, 2\) where "
                                           r"its first run read a Parameter 'W' of shape \(3, 2\)"):
        F.sum(y * y).backward()
    assert old.grad is None and x.grad is None and lin.W.grad is None
    lin.W = old  # put back: backward goes as it would have
    F.sum(y * y).backward()
    np.testing.assert_allclose(x.grad.data, 2 * y.data @ old.data.T, rtol=1e-14)


def test_state_a_block_changes_on_an_object_that_is_not_a_module_is_refused():
    """Not a Module, so not put back as an RNN's state is: computed again, the block reads the
    state the last step left instead of the one it read."""
    class Cell:
        def __init__(self):
            self.W, self.h = Variable(np.eye(3) * 0.5), None

        def __call__(self, x):
            self.h = F.tanh(x if self.h is None else x + self.h @ self.W)
            return self.h

    cell = Cell()
    loss = 0
    for _ in range(3):
        loss = loss + F.sum(gradcore.checkpoint(cell, Variable(np.ones((2, 3)))))
    with pytest.raises(RuntimeError, match="state kept from one call to the next that it changes "
                                           "itself, on an object that is not a Module"):
        loss.backward()


def test_constants_a_block_makes_anew_pass_and_one_replaced_by_other_values_is_refused(xp2):
    x0 = xp2.asarray(np.array([0.5, -1.0, 2.0]))

    def block(x):
        with gradcore.no_grad():
            m = x * 2.0  # a leaf of its own at each run
        ones = x.data * 0 + 1  # an array passed to an op: a constant made anew
        return x * ones * gradcore.Variable(x.data[:1] * 0 + 3) * m

    x, y = Variable(x0), Variable(x0)
    F.sum(block(x)).backward()
    F.sum(gradcore.checkpoint(block, y)).backward()
    np.testing.assert_array_equal(xp2.numpy(y.grad.data), xp2.numpy(x.grad.data))
    np.testing.assert_array_equal(xp2.numpy(x.grad.data), [3.0, -6.0, 12.0])  # 3 m = 6 x

    held = {"c": Variable(x0 * 0 + 1, requires_grad=False)}
    z = Variable(x0)
    out = F.sum(gradcore.checkpoint(lambda a: a * held["c"], z))
    held["c"] = Variable(x0 * 0 + 1, requires_grad=False)  # the same values: the same gradient
    out.backward()
    np.testing.assert_array_equal(xp2.numpy(z.grad.data), [1.0, 1.0, 1.0])
    out = F.sum(gradcore.checkpoint(lambda a: a * held["c"], z))
    held["c"] = Variable(x0 * 0 + 2, requires_grad=False)
    with pytest.raises(RuntimeError, match=r"read a constant \(a Variable of shape \(3,\), "
                                           r"Variable 1 .* with other values than the first"):
        out.backward()


def test_a_leaf_replaced_by_an_equal_one_before_backward_gets_its_gradient():
    """z, a plain Variable requiring grad, rebound to an equal copy between forward and
    backward: the recomputation read the copy, so z (the first run's) got no gradient, with no
    error. As without checkpoint, z gets sin(x); the copy none."""
    grads = []
    for use in (False, True):
        x, z = Variable(np.array([1.0, 2.0, 3.0])), Variable(np.array([4.0, 5.0, 6.0]))
        held = {"z": z}
        block = lambda h: F.sin(h) * held["z"]  # noqa: E731
        y = gradcore.checkpoint(block, x) if use else block(x)
        held["z"] = Variable(z.data.copy())
        F.sum(y).backward()
        assert held["z"].grad is None
        grads.append((x.grad.data, z.grad.data))
    np.testing.assert_array_equal(grads[1][0], grads[0][0])
    np.testing.assert_array_equal(grads[1][1], np.sin([1.0, 2.0, 3.0]))
    # with create_graph the gradient's graph would reach the new leaf: a second derivative
    # went to it, not to z
    z = Variable(np.array([1.5, 2.0]))
    held = {"z": z}
    y = gradcore.checkpoint(lambda h: F.sum(h * held["z"] ** 3), Variable(np.array([3.0, 4.0])))
    held["z"] = Variable(z.data.copy())
    with pytest.raises(RuntimeError, match="create_graph.*replaced between forward and backward"):
        gradcore.grad(y, [z], create_graph=True)
    # one the block makes and returns: the caller's, as a replaced one (its second derivative
    # came back None)
    x = Variable(np.array([3.0, 4.0]))

    def makes(h):
        w = Variable(np.array([2.0, 3.0]))
        return F.sum(h * h * w), w
    y, w = gradcore.checkpoint(makes, x)
    with pytest.raises(RuntimeError, match=r"the block made a Variable of shape \(2,\) and "
                                           r"returns it; computed again during backward"):
        gradcore.grad(y, [x], create_graph=True)


def test_an_input_batch_that_requires_no_grad_is_a_constant_in_both_runs():
    """An array, or a Variable with requires_grad=False, whose first op reads no parameter (x /
    255, dropout, a reshape): the plain call's gradients, bit for bit, and none for the batch."""
    np.random.seed(0)
    lin = nn.Linear(6, 3, dtype="float64")
    X = np.random.randn(2, 6)
    blocks = {"scale": lambda x: lin(x / 255.0), "dropout": lambda x: lin(F.dropout(x, 0.2)),
              "reshape": lambda x: F.tanh(lin(F.reshape(x, (2, 6))))}
    for name, block in blocks.items():
        for arg in (X, X.reshape(2, 3, 2), Variable(X, requires_grad=False)):
            if name != "reshape" and arg.shape != (2, 6):
                continue
            lin.cleargrads()
            np.random.seed(1)  # dropout's mask
            F.sum(block(arg)).backward()
            expected = lin.W.grad.data
            lin.cleargrads()
            np.random.seed(1)
            F.sum(gradcore.checkpoint(block, arg)).backward()
            np.testing.assert_array_equal(lin.W.grad.data, expected, err_msg=name)
            if isinstance(arg, Variable):
                assert arg.grad is None
    # d sum(x / 255 W + b) / dW = x.T 1 / 255
    lin.cleargrads()
    F.sum(gradcore.checkpoint(blocks["scale"], X)).backward()
    np.testing.assert_allclose(lin.W.grad.data, X.T @ np.ones((2, 3)) / 255.0, rtol=1e-14)


@pytest.mark.parametrize("draw", ["random", "generator", "depth"])
def test_random_numbers_drawn_past_gradcore_in_a_block_are_refused_at_backward(draw):
    """Python's random and a NumPy Generator draw anew in the recomputation: backward would
    differentiate another function (x.grad [1.7492, 1.5428, 0.9498] where the scale the
    forward used gives [1.8352, 1.6186, 0.9965]); the results are compared and it raises."""
    import random
    rng = np.random.default_rng(0)
    W = gradcore.Parameter(np.array([0.3, -0.2, 0.7]))
    blocks = {
        "random": lambda h: F.sin(h) * (1.0 + random.random()),
        "generator": lambda h: F.sin(h) * (1.0 + rng.random()),
        # stochastic depth: the branch kept or dropped at random
        "depth": lambda h: h + F.sin(h * W) * (2.0 if random.random() < 0.5 else 0.0),
    }
    random.seed(0 if draw != "depth" else 1)  # depth, seed 1: kept, then dropped
    x = Variable(np.array([0.1, 0.5, 1.0]))
    y = F.sum(gradcore.checkpoint(blocks[draw], x))
    with pytest.raises(RuntimeError, match=r"gave other values than the first time \(its result "
                                           r"0, a Variable of shape \(3,\).*Python's random, a "
                                           r"NumPy Generator.*pass them as arguments"):
        y.backward()
    assert x.grad is None and W.grad is None


def test_a_random_mask_from_a_generator_is_refused_naming_the_cause():
    """The mask is a constant the block makes (an array passed to an op): its other values are
    named, not a Variable replaced between forward and backward."""
    rng = np.random.default_rng(0)
    x = Variable(np.linspace(0.1, 1, 6))
    y = F.sum(gradcore.checkpoint(lambda h: F.sin(h) * ((rng.random(6) > 0.5) * 2.0), x))
    with pytest.raises(RuntimeError, match=r"read a constant \(a Variable of shape \(6,\).* with "
                                           r"other values than the first time.*NumPy Generator"):
        y.backward()


def test_numpy_random_draws_and_rounding_sized_differences_pass_the_comparison(xp2):
    """numpy.random's draws repeat; a difference of a few units in the last place (MKL's
    kernels by alignment, atomics) is not taken for another function; 1e-6 relative is."""
    import random
    x0 = xp2.asarray(np.array([0.1, 0.5, 1.0]))
    x = Variable(x0)
    y = gradcore.checkpoint(lambda h: F.sin(h) * (1.0 + np.random.rand()), x)
    scale = xp2.numpy(y.data)[0] / np.sin(0.1)
    F.sum(y).backward()
    np.testing.assert_allclose(xp2.numpy(x.grad.data), scale * np.cos([0.1, 0.5, 1.0]),
                               rtol=1e-14)
    random.seed(0)
    x = Variable(x0)
    F.sum(gradcore.checkpoint(lambda h: F.sin(h) * (1.0 + 2.0 ** -48 * random.random()),
                              x)).backward()
    np.testing.assert_allclose(xp2.numpy(x.grad.data), np.cos([0.1, 0.5, 1.0]), rtol=1e-14)
    y = F.sum(gradcore.checkpoint(lambda h: F.sin(h) * (1.0 + 1e-6 * random.random()), x))
    with pytest.raises(RuntimeError, match="gave other values than the first time"):
        y.backward()


def test_a_result_released_before_backward_is_not_compared():
    """DeZero's t.data = None (step 43) on a checkpoint's result: backward runs as without one."""
    x = Variable(np.array([[0.5, 1.0]]))
    W = gradcore.Parameter(np.array([[1.0], [2.0]]))
    t = gradcore.checkpoint(lambda a: F.matmul(a, W), x)
    y = t + 1.0
    t.data = None
    y.backward()
    np.testing.assert_array_equal(W.grad.data, [[0.5], [1.0]])
    np.testing.assert_array_equal(x.grad.data, [[1.0, 2.0]])


def test_a_numpy_scalar_argument_is_passed_as_the_plain_call_sees_it():
    """np.float64(2.0) beside float32 data is a Python number to the ops (weak): float32 stays,
    where a 0-d float64 Variable made the block float64."""
    x = Variable(np.array([0.5, 1.0, 1.5], np.float32))
    seen = []

    def block(h, k):
        seen.append(type(k))
        return F.sin(h) * k
    plain = block(x, np.sqrt(4.0))
    y = gradcore.checkpoint(block, x, np.sqrt(4.0))
    assert y.dtype == np.float32 and seen == [np.float64, np.float64]
    np.testing.assert_array_equal(y.data, plain.data)
    F.sum(y).backward()
    assert seen == [np.float64] * 3 and x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad.data, np.cos(x.data) * np.float32(2.0))


def _stack_shown(error):
    """(file name, line, function) of each frame an anomaly error shows."""
    return [(os.path.basename(path), int(line), name)
            for path, line, name in re.findall(r'File "(.*)", line (\d+), in (\S+)', str(error))]


def test_anomaly_errors_show_where_the_block_was_called_not_its_recomputation():
    here = sys._getframe().f_code

    def inner(h):
        return F.sqrt(h) * 3.0

    def outer(h):
        return gradcore.checkpoint(inner, h * 1.0) + 1.0

    mine = os.path.basename(__file__)
    calls = {}
    for block, kind in [(inner, "one"), (outer, "nested")]:
        x = Variable(np.array([0.0, 1.0]))
        with gradcore.detect_anomaly():
            calls[kind] = sys._getframe().f_lineno + 1
            y = gradcore.checkpoint(block, x)
            with pytest.raises(RuntimeError, match="sqrt.backward returned a gradient holding NaN"
                               ) as error:
                y.sum().backward()
        assert x.grad is None
        shown = _stack_shown(error.value)
        # the forward's stack, as without checkpoint: the test's own line (no backward line, no
        # frame of gradcore.checkpoint's), the blocks' lines, then sqrt
        ours = [frame for frame in shown if frame[0] == mine]
        blocks = [("outer", outer.__code__.co_firstlineno + 1)] if kind == "nested" else []
        blocks.append(("inner", inner.__code__.co_firstlineno + 1))
        assert ours == [(mine, calls[kind], here.co_name),
                        *((mine, line, name) for name, line in blocks)]
        assert shown[-1][2] == "sqrt" and shown[shown.index(ours[-1]) + 1:] == shown[-1:]
        assert not any(name.startswith("recompute") for name, _, _ in shown)
    # the node itself: where checkpoint was called
    x = Variable(np.array([0.5, 1.0]))
    with gradcore.detect_anomaly():
        h = x * 1.0
        line = sys._getframe().f_lineno + 1
        y = gradcore.checkpoint(inner, h)
        h.data[...] = 7.0
        with pytest.raises(RuntimeError, match="checkpoint: its input 0 changed") as error:
            y.sum().backward()
    assert [frame for frame in _stack_shown(error.value) if frame[0] == mine] == [
        (mine, line, here.co_name)]
    assert not any(name.startswith("recompute") for name, _, _ in _stack_shown(error.value))
