"""Version counters: every write gradcore makes to a Variable's data is counted, and backward
refuses a graph whose inputs or outputs were written after it was recorded."""
import warnings

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from conftest import DEVICE1, STRICT
from gradcore import Function, Parameter, Variable, nn, optim

MODIFIED = r"was written after {op} ran in forward: it is at version {now}, and {op} used version {then}"


def var(xp, values):
    return Variable(xp.asarray(values, dtype="float64"))


def test_a_new_variable_is_at_version_0(xp):
    x = var(xp, [1.0, 2.0])
    assert x.version == 0 and x._version == 0
    assert (x * 2).version == 0


@pytest.mark.parametrize("watch", ["post-accumulate hook", "retain_grad"])
def test_a_refused_backward_changes_no_gradient_and_runs_no_hook(xp, watch):
    """x's op runs first in backward, w's (written after forward) last: the refusal comes
    before x's post-accumulate hook or any retained gradient."""
    x, w = var(xp, [1.0, 2.0]), var(xp, [0.5, 0.5])
    calls = []
    if watch == "post-accumulate hook":
        x.register_post_accumulate_grad_hook(calls.append)
    u = F.sin(w)
    x3 = x * 3.0
    loss = F.sum(u) + F.sum(x3)
    w.data = xp.asarray([9.0, 9.0])
    with pytest.raises(RuntimeError, match="sin: its input 0"):
        loss.backward(retain_grad=watch == "retain_grad")
    assert calls == [] and x.grad is None and x3.grad is None and loss.grad is None


def test_a_data_assignment_after_forward_is_refused_at_backward(xp):
    x = var(xp, [1.0, 2.0])
    y = (x * x).sum()
    x.data = xp.asarray([5.0, 5.0])
    assert x.version == 1
    with pytest.raises(RuntimeError, match="mul: its input 0, .*" + MODIFIED.format(
            op="mul", now=1, then=0)):
        y.backward()
    assert x.grad is None


def test_the_message_gives_the_version_the_op_used(xp):
    x = var(xp, [1.0, 2.0])
    x.data = xp.asarray([1.0, 3.0])
    x.data = xp.asarray([1.0, 4.0])
    y = F.exp(x)
    x.data = xp.asarray([0.0, 0.0])
    with pytest.raises(RuntimeError, match=MODIFIED.format(op="exp", now=3, then=2)):
        y.backward()


def test_an_output_written_after_forward_is_refused(xp):
    x = var(xp, [1.0, 2.0])
    y = F.exp(x)  # exp's backward reads its output
    y.data = xp.asarray([0.0, 0.0])
    with pytest.raises(RuntimeError, match="exp: its output 0, .*" + MODIFIED.format(
            op="exp", now=1, then=0)):
        y.backward()


# ================================================== data released after forward (t.data = None)
def test_dezeros_linear_simple_releasing_an_intermediate_still_differentiates(xp):
    # book step 43: add's backward reads neither input, matmul's not its output
    x = var(xp, [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    W = var(xp, [[1.0, 0.0, -1.0, 2.0], [0.5, 1.0, 0.0, -2.0]])
    b = var(xp, [0.0, 0.0, 0.0, 0.0])
    t = F.matmul(x, W)
    y = t + b
    t.data = None
    F.sum(y).backward()
    np.testing.assert_array_equal(W.grad.numpy(), [[9.0] * 4, [12.0] * 4])  # x.T @ ones
    np.testing.assert_array_equal(x.grad.numpy(), [[2.0, -0.5]] * 3)  # ones @ W.T
    np.testing.assert_array_equal(b.grad.numpy(), [3.0] * 4)


def test_a_released_input_gets_its_gradient_summed_to_the_shape_it_had():
    a = Variable(np.ones(4))
    t = a * 2.0
    y = t + Variable(np.ones((3, 4)))  # t broadcast
    t.retain_grad()
    t.data = None
    y.sum().backward()
    np.testing.assert_array_equal(t.grad.data, [3.0] * 4)
    np.testing.assert_array_equal(a.grad.data, [6.0] * 4)


@pytest.mark.parametrize("make", [lambda x: F.exp(x), lambda x: (x * 2.0) * x],
                         ids=["output_read", "input_read"])
def test_a_backward_reading_released_data_says_so_naming_the_op(make):
    x = Variable(np.array([1.0, 2.0]))
    t = make(x)
    y = (t + 1.0).sum()
    released = t if t.creator.inputs[0] is x else t.creator.inputs[0]
    released.data = None
    op = t.creator._name()
    with pytest.raises(RuntimeError, match=rf"{op}.backward failed .*, and its (output|input) 0 "
                                           r"is the Variable whose data was released \(set to "
                                           r"None\) after"):
        y.backward()
    assert x.grad is None


def test_released_data_given_an_array_again_is_a_write_as_any():
    x = Variable(np.array([1.0, 2.0]))
    t = x * 2.0
    y = t + 1.0
    t.data = None
    t.data = np.zeros(2)
    with pytest.raises(RuntimeError, match=MODIFIED.format(op="add", now=2, then=0)):
        y.sum().backward()


def test_a_write_after_forward_then_a_release_is_still_refused():
    """Released data was exempt from the version check: a reshape written after forward, then
    the release, gave "add.backward returned a gradient of shape (2, 4) for its input 0, of
    shape (8,)", blaming add."""
    x, b = Variable(np.ones((2, 4))), Variable(np.ones((2, 4)))
    t = x * 2.0
    y = t + b
    t.data = t.data.reshape(-1)
    t.data = None
    with pytest.raises(RuntimeError, match=r"add: its input 0, the Variable whose data was "
                                           r"released \(set to None\), was written after add"):
        F.sum(y).backward()
    assert x.grad is None


def test_releasing_data_twice_is_one_release():
    # the second release keeps the shape the first noted, and is no write
    a = Variable(np.ones(4))
    t = a * 2.0
    y = t + Variable(np.ones((3, 4)))
    t.data = None
    t.data = None
    assert t.version == 1
    y.sum().backward()
    np.testing.assert_array_equal(a.grad.data, [6.0] * 4)


def test_writes_before_forward_and_after_backward_are_fine(xp):
    x = var(xp, [1.0, 2.0])
    x.data = xp.asarray([3.0, 4.0])
    y = (x * x).sum()
    y.backward()
    x.data = xp.asarray([0.0, 0.0])
    np.testing.assert_array_equal(x.grad.numpy(), [6.0, 8.0])


def test_a_write_to_a_variable_outside_the_graph_changes_nothing(xp):
    x, other = var(xp, [1.0, 2.0]), var(xp, [1.0])
    y = (x * x).sum()
    other.data = xp.asarray([9.0])
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])


def test_in_place_moves_count_as_writes():
    x = Variable(STRICT.xp.asarray([1.0, 2.0], dtype=STRICT.xp.float64))
    y = (x * x).sum()
    x.to_gpu(DEVICE1)  # DeZero's in-place move: data is assigned again
    assert x.version == 1
    with pytest.raises(RuntimeError, match="mul: its input 0"):
        y.backward()


def test_a_move_to_where_the_data_is_writes_nothing():
    x = Variable(np.array([1.0, 2.0]))
    model = nn.Linear(2, in_size=2)
    y = (x * x).sum() + model(x[None]).sum()
    version = model.W.version
    x.to_cpu()
    model.to("cpu")
    assert x.version == 0 and model.W.version == version
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.array([1.0, 2.0]) + model.W.data.sum(1),
                               rtol=1e-6)


def test_a_grad_setter_write_is_not_a_data_write(xp):
    x = var(xp, [1.0, 2.0])
    y = (x * x).sum()
    x.grad = var(xp, [0.0, 0.0])
    assert x.version == 0
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])


OPTIMIZERS = [optim.SGD, optim.MomentumSGD, optim.AdaGrad, optim.AdaDelta, optim.Adam, optim.AdamW]


@pytest.mark.parametrize("cls", OPTIMIZERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("style", ["step", "update"])
def test_an_optimizer_step_between_forward_and_backward_is_refused(xp2, cls, style):
    W = Parameter(xp2.asarray([1.0, -2.0], dtype="float64"))
    loss = (W * W).sum()
    W.grad = Variable(xp2.asarray([1.0, 1.0], dtype="float64"))
    if style == "step":
        cls([W]).step()
    else:
        cls().setup([W]).update()
    assert W.version == 1
    with pytest.raises(RuntimeError, match=MODIFIED.format(op="mul", now=1, then=0)):
        loss.backward()


VIEWS = {
    "detach().T": lambda W: W.detach().T,
    "detach()[:]": lambda W: W.detach()[:],
    "detach().reshape twice": lambda W: W.detach().reshape(4).reshape(2, 2),
    "split of detach()": lambda W: F.split(W.detach(), 2)[1],
    "T under no_grad": lambda W: _under_no_grad(lambda: W.T),
    "[0:2] under no_grad": lambda W: _under_no_grad(lambda: W[0:2]),
    "T, recorded, then detach()": lambda W: W.T.detach(),
}


def _under_no_grad(make):
    with gradcore.no_grad():
        return make()


@pytest.mark.parametrize("make_view", VIEWS.values(), ids=VIEWS.keys())
def test_a_view_made_without_a_graph_shares_the_version_of_its_base(xp, make_view):
    """An optimizer writes W in place: a view of W that a graph saved changed with it."""
    W = Parameter(xp.asarray([[1.0, 2.0], [3.0, 4.0]], dtype="float64"))
    x = var(xp, [[1.0, 1.0], [1.0, 1.0]])[:make_view(W).shape[0]]
    loss = F.sum(x * make_view(W))
    W.grad = Variable(xp.ones_like(W.data))
    optim.SGD([W], lr=1.0).step()
    with pytest.raises(RuntimeError, match="mul: its input 1"):
        loss.backward()


def test_a_view_of_memmap_data_shares_its_version(tmp_path):
    """W over a memmap (np.load with mmap_mode): a view of it was taken for an immutable NumPy
    scalar, shared no version, and backward computed with the new values (x.grad [-9, -8])."""
    np.save(tmp_path / "w.npy", np.array([1.0, 2.0]))
    W = Variable(np.load(tmp_path / "w.npy", mmap_mode="r+"))
    x = Variable(np.array([1.0, 1.0]))
    with gradcore.no_grad():
        Wt = W.T
    y = F.sum(Wt * x)
    W.data -= 10.0
    with pytest.raises(RuntimeError, match="mul: its input 0"):
        y.backward()
    assert x.grad is None


def test_a_reshape_that_copies_shares_no_version_with_its_input():
    """h.T.reshape(-1) is a copy in NumPy (of a view: its base is set), taken for a view of h:
    writing into it in place refused backward through h ("matmul: its output 0 ... was
    written"), which h was not; PyTorch's runs."""
    class ReLUInPlace(gradcore.Function):
        def forward(self, x):
            self.mask = x > 0
            x *= self.mask
            self.mark_dirty(x)
            return x

        def backward(self, gy):
            return gy * self.mask
    a = Variable(np.arange(15.0).reshape(3, 5) - 7)
    W = Parameter(np.linspace(-1, 1, 20).reshape(5, 4))
    h = a @ W
    copied = h.T.reshape(-1)
    assert not np.shares_memory(copied.data, h.data)
    r = ReLUInPlace()(copied.detach()).reshape(4, 3).T
    F.sum(h * h * r).backward()
    np.testing.assert_allclose(W.grad.data, a.data.T @ (2 * h.data * np.maximum(h.data, 0)))
    with gradcore.no_grad():  # views still share, a view of a view too
        assert h[0]._writes is h._writes and h.T[0]._writes is h._writes

    def step(a):  # compiled, where the traced arrays are asked the same (it raised)
        W.grad = None
        h = a @ W
        r = ReLUInPlace()(h.T.reshape(-1).detach()).reshape(4, 3).T
        F.sum(h * h * r).backward()
        return W.grad
    expected = step(a).data
    compiled = gradcore.compile(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it runs eagerly: mark_dirty
        assert all(np.array_equal(compiled(a).data, expected) for _ in range(3))


def _tells_memory_apart(xp):
    """True if xp's library says whether two arrays share memory (NumPy, CuPy); the data setter
    takes any other (array-api-strict) to share it, and keeps one version for both."""
    return hasattr(xp.namespace, "may_share_memory")


def test_a_variable_given_another_array_leaves_the_views_of_the_old_one_alone(xp):
    """mem.data = new array: the views of the old array (read by the graph) were not written."""
    W = Parameter(xp.asarray([[0.5, -1.0], [2.0, 0.25]], dtype="float64"))
    mem = Variable(xp.asarray([[1.0, 2.0], [3.0, 4.0]], dtype="float64"), requires_grad=False)
    loss = 0
    for _ in range(3):
        h = F.tanh(mem[-1:] @ W)
        mem.data = xp.concat([mem.data[1:, ...], h.data], axis=0)  # another array, DeZero style
        loss = loss + F.sum(h)
    if not _tells_memory_apart(xp):  # the new array might be over the old one's memory
        with pytest.raises(RuntimeError, match="matmul: its input 0"):
            loss.backward()
        return
    loss.backward()
    assert mem.version == 3
    view = mem.T
    mem.data = mem.data * 2  # again another array: the view keeps its version
    assert view.version == 3 and mem.version == 4
    again = mem.T
    mem.data = mem.data  # the same array: a write, which the views of this array share
    assert again.version == mem.version == 5 and view.version == 3


def test_a_view_of_an_op_result_shares_its_version(xp):
    """h.data -= 10 writes h's memory, which the view v (saved by mul) is over: refused, by
    backward and by gradcore.grad, rather than a gradient from the new values."""
    x = var(xp, [1.0, 2.0, 3.0])
    h = x * 1.0  # not a leaf
    v = h[0:2]
    t = F.transpose(F.reshape(h, (3, 1)))  # views of views
    assert v.version == t.version == h.version == 0
    y = F.sum(v * v)
    gv, = gradcore.grad(y, v)  # before the write: 2 * v
    np.testing.assert_array_equal(xp.numpy(gv.data), [2.0, 4.0])
    h.data -= 10.0
    assert v.version == t.version == h.version == 1
    with pytest.raises(RuntimeError, match=MODIFIED.format(op="mul", now=1, then=0)):
        gradcore.grad(y, v)
    with pytest.raises(RuntimeError, match="mul: its input 0"):
        y.backward()
    assert x.grad is None


class Same(Function):
    """An author's op that returns its input's array as it is."""

    def forward(self, x):
        return x

    def backward(self, gy):
        return gy


def test_an_authors_output_over_an_op_results_array_shares_its_version(xp):
    x = var(xp, [1.0, 2.0])
    h = x * 1.0
    s = Same()(h)
    y = F.sum(s * s)
    h.data -= 1.0
    assert s.version == 1
    with pytest.raises(RuntimeError, match="mul: its input 0"):
        y.backward()


def test_a_data_assignment_over_the_old_memory_keeps_the_views_version(xp):
    """x.data = x.data.reshape(...): the new array is over the old memory, so a later write
    through x reaches the graph that saved x.detach() (as it would with x.data -= 10 alone)."""
    x = var(xp, [1.0, 2.0])
    d = x.detach()
    w = var(xp, [3.0, 4.0])
    y = F.sum(d * w)
    x.data = xp.reshape(x.data, (2,))  # NumPy: a view; a library that cannot tell: taken as one
    x.data -= 10.0
    assert d.version == x.version == 2
    with pytest.raises(RuntimeError, match="mul: its input 0"):
        y.backward()
    assert w.grad is None
    x.data = x.data * 1.0  # a new array: the old one's views keep their version
    if _tells_memory_apart(xp):
        assert d.version == 2 and x.version == 3


def test_a_view_of_a_gradient_zeroed_in_place_is_refused():
    p = Parameter(np.array([[1.0, 2.0], [3.0, 4.0]]))
    F.sum(p * p).backward()
    w = Variable(np.ones((2, 2)))
    z = F.sum(w * p.grad.T)  # a view of a leaf that needs no grad: the gradient
    optim.SGD([p]).zero_grad(set_to_none=False)  # written in place
    with pytest.raises(RuntimeError, match="mul: its input 1"):
        z.backward()


def test_a_copy_made_by_indexing_keeps_a_version_of_its_own():
    W = Parameter(np.array([[1.0, 2.0], [3.0, 4.0]]))
    with gradcore.no_grad():
        picked = W[np.array([1, 0])]  # advanced indexing copies
    x = var(np, [[1.0, 1.0], [1.0, 1.0]])
    loss = F.sum(x * picked)
    W.grad = Variable(np.ones((2, 2)))
    optim.SGD([W], lr=1.0).step()
    loss.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[3.0, 4.0], [1.0, 2.0]])


class Updater(optim.Optimizer):
    """A DeZero-style optimizer of a user's that writes into the array itself."""

    defaults = {"lr": 0.1}

    def update_one(self, param):
        param.data[...] -= self.lr * param.grad.data  # no .data assignment: the base class counts


def test_an_optimizer_that_writes_in_place_is_counted_once():
    W = Parameter(np.array([1.0, -2.0]))
    W.grad = np.array([1.0, 1.0])
    Updater([W]).step()
    assert W.version == 1
    optim.SGD([W]).step()  # gradcore's own: one write per update too
    assert W.version == 2


def test_the_gan_bug_is_caught():
    """Generator and discriminator: a discriminator step, then backward through the generator's
    loss built before it, would silently use the updated discriminator."""
    np.random.seed(0)
    generator, discriminator = nn.Linear(4, in_size=3), nn.Linear(1, in_size=4)
    d_optimizer = optim.SGD(discriminator.parameters(), lr=0.1)
    fake = generator(Variable(np.random.randn(8, 3)))
    d_loss = F.sum(discriminator(fake.detach()))
    g_loss = -F.sum(discriminator(fake))  # through the same discriminator weights
    d_loss.backward()
    before = discriminator.W.version  # 1: the layer wrote its initial values
    d_optimizer.step()
    with pytest.raises(RuntimeError, match=r'linear: its input 1, the Variable "W" .* '
                                           + MODIFIED.format(op="linear", now=before + 1,
                                                             then=before)):
        g_loss.backward()


def test_load_state_dict_counts_as_a_write(xp):
    model = nn.Linear(2, in_size=3)
    model.to(xp.device)
    y = F.sum(model(Variable(xp.asarray(np.ones((1, 3)), dtype="float32"))))
    before = model.W.version, model.b.version
    model.load_state_dict(model.state_dict())
    assert (model.W.version, model.b.version) == (before[0] + 1, before[1] + 1)
    with pytest.raises(RuntimeError, match=MODIFIED.format(op="linear", now=before[0] + 1,
                                                           then=before[0])):
        y.backward()


def test_module_to_counts_as_a_write():
    model = nn.Linear(2, in_size=3)
    y = F.sum(model(Variable(np.ones((1, 3), np.float32))))
    before = model.W.version
    model.to(DEVICE1)
    assert model.W.version == before + 1
    with pytest.raises(RuntimeError, match=MODIFIED.format(op="linear", now=before + 1,
                                                           then=before)):
        y.backward()


def test_create_graph_and_grad_check_versions_too(xp):
    x = var(xp, [1.0, 2.0])
    y = (x * x * x).sum()
    gx, = gradcore.grad(y, x, create_graph=True)
    x.data = xp.asarray([0.0, 0.0])
    with pytest.raises(RuntimeError, match="mul: its input"):
        gradcore.grad(gx.sum(), x)


@pytest.mark.parametrize("how", ["backward", "backward(retain_grad=True)", "grad"])
def test_a_write_by_a_hook_on_an_ops_output_is_refused_before_that_op_runs(xp, how):
    """A hook on h = x * W runs before mul(x, W).backward, which reads W: a write to W in the
    hook was not seen, and x.grad was [12, 20], from the new W (at forward's W: [9, 16])."""
    x, W = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])
    h = x * W
    k = h * W

    def step(g):
        W.data = W.data + 1.0
    h.register_hook(step)
    with pytest.raises(RuntimeError, match=MODIFIED.format(op="mul", now=1, then=0)) as info:
        if how == "grad":
            gradcore.grad(F.sum(k), x)
        else:  # the walk's short path, and its general one
            F.sum(k).backward(retain_grad=how != "backward")
    assert "the write was made by a hook on" in info.value.__notes__[-1]
    assert x.grad is None


def test_a_hook_writing_what_its_op_does_not_read_is_fine(xp):
    x, W, other = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0]), var(xp, [0.0, 0.0])
    h = x * W

    def step(g):
        other.data = other.data + 1.0
    h.register_hook(step)
    F.sum(h * W).backward()
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [9.0, 16.0])  # W ** 2
    assert other.version == 1


def test_a_write_in_another_thread_cannot_switch_the_check_off():
    """Backward checks versions only for ops recorded before the latest write anywhere: a thread
    that took its write's stamp and published it after a newer write would switch the check off
    for the newer write's graph. Here thread A pauses in the middle of its write (its stamps'
    append) while thread B writes x, which a graph used: the refusal must stand."""
    import collections
    import threading

    from gradcore import variable

    paused, resume = threading.Event(), threading.Event()

    class PausingStamps(collections.deque):
        def append(self, stamp):
            super().append(stamp)
            paused.set()
            resume.wait(10)

    a = Variable(np.zeros(3))
    a.data = a.data[:]  # a has a write log now; the next write goes through PausingStamps
    a._writes.stamps = PausingStamps(a._writes.stamps, maxlen=64)
    x, w = Variable(np.full(4, 2.0)), Variable(np.full(4, 3.0))
    y = F.sum(x * w)
    writer_a = threading.Thread(target=lambda: setattr(a, "data", a.data[:]))
    writer_a.start()
    assert paused.wait(10)
    writer_b = threading.Thread(target=lambda: setattr(x, "data", np.full(4, 5.0)))
    writer_b.start()
    writer_b.join(0.2)  # it waits for A's write to be whole, or (unsafely) overtakes it
    resume.set()
    writer_a.join(10)
    writer_b.join(10)
    assert variable.latest_write[0] == x._writes.stamps[-1]
    with pytest.raises(RuntimeError, match=MODIFIED.format(op="mul", now=1, then=0)):
        gradcore.grad(y, [w])
