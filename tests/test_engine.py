"""The backward walk and gradcore.grad: DeZero's examples, hooks, higher order, deep graphs."""
import functools
import gc
import warnings
import weakref

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from conftest import DEVICE1, STRICT, forked_child_takes, run_in_threads
from gradcore import Function, Parameter, Variable


def var(xp, values, dtype="float64", **kwargs):
    return Variable(xp.asarray(values, dtype=dtype), **kwargs)


class Scale(Function):
    """x * k, its backward logged by name in `calls`."""

    def __init__(self, name, k, calls):
        self.name, self.k, self.calls = name, k, calls

    def forward(self, x):
        return x * self.k

    def backward(self, gy):
        self.calls.append(self.name)
        return gy * self.k


# =============================================================================== DeZero steps 11-18
def test_same_variable_twice(xp):
    x = var(xp, 3.0)
    F.add(x, x).backward()
    assert x.grad.item() == 2.0


def test_cleargrad_between_two_backward_calls(xp):
    x = var(xp, 3.0)
    F.add(x, x).backward()
    F.add(F.add(x, x), x).backward()
    assert x.grad.item() == 5.0  # without cleargrad, gradients accumulate
    x.cleargrad()
    assert x.grad is None
    F.add(F.add(x, x), x).backward()
    assert x.grad.item() == 3.0


def test_accumulation_is_out_of_place(xp):
    x = var(xp, [1.0, 2.0])
    (x * 2).backward()
    first = x.grad
    kept = first.numpy().copy()
    (x * 3).backward()
    assert x.grad is not first
    np.testing.assert_array_equal(first.numpy(), kept)  # a gradient someone holds is not changed
    np.testing.assert_array_equal(x.grad.numpy(), [5.0, 5.0])


def test_accumulation_leaves_each_gradient_it_was_given_alone(xp):
    # x gets three gradients; the engine sums them into new arrays, never into one of them
    x = var(xp, [1.0, 2.0])
    seen = []
    a, b, c = x * 1.0, x * 2.0, x * 3.0
    for v in (a, b, c):
        v.register_hook(lambda g: seen.append((g, g.numpy().copy())))
    (a + b + c).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [6.0, 6.0])
    assert len(seen) == 3
    for g, kept in seen:
        np.testing.assert_array_equal(g.numpy(), kept)


def test_a_sum_added_to_in_place_is_the_engines_own(xp):
    # x gets one gradient object four times (Add hands gy to both inputs, Pass hands it on): the
    # engine may add in place only into a sum it made itself, never into what a backward returned
    returned = []

    class Pass(Function):
        def forward(self, x):
            return x

        def backward(self, gy):
            returned.append((gy, gy.numpy().copy()))
            return gy

    x = var(xp, [1.0, 2.0])
    (Pass()(x) + Pass()(x) + Pass()(x) + Pass()(x)).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 4.0])
    assert len(returned) == 4
    for g, kept in returned:
        np.testing.assert_array_equal(g.numpy(), kept)
        assert x.grad is not g


def test_a_sum_handed_on_by_a_backward_is_not_added_to_in_place(xp):
    # v gets two gradients, summed by the engine; add's backward hands that one sum to p and q
    # alike; p then gets a third gradient, from r, which must not change q's
    calls = []
    x = var(xp, 1.0)
    p = Scale("p", 2.0, calls)(x)
    q = Scale("q", 3.0, calls)(x)
    r = Scale("r", 5.0, calls)(p)  # made before v: it runs after add's backward
    v = p + q
    (v + v + r).backward()
    assert x.grad.item() == 20.0  # y = 2 (2x + 3x) + 5 (2x)


def test_diamond(xp):
    x = var(xp, 2.0)
    a = F.square(x)
    y = F.add(F.square(a), F.square(a))  # 2 x^4
    y.backward()
    assert y.item() == 32.0
    assert x.grad.item() == 64.0


def test_each_function_runs_once_in_generation_order(xp):
    calls = []
    x = var(xp, 1.0)
    a = Scale("a", 1.0, calls)(x)
    b = Scale("b", 1.0, calls)(a)
    c = Scale("c", 1.0, calls)(a)
    d = Scale("d", 1.0, calls)(b)
    y = F.add(F.add(d, c), F.add(a, b))
    y.backward()
    assert sorted(calls) == ["a", "b", "c", "d"]  # each once, however many consumers
    assert calls[-1] == "a"
    assert calls.index("d") < calls.index("b")
    assert x.grad.item() == 4.0  # four paths: x-a-b-d, x-a-c, x-a, x-a-b


@pytest.mark.parametrize("first", ["low", "high"])
def test_a_function_queued_first_waits_for_a_higher_generation(xp, first):
    # y = a + b with b computed from a: whichever input the add lists first, b's Function must
    # run before a's, or a's gradient would miss the path through b
    calls = []
    x = var(xp, 1.0)
    a = Scale("a", 2.0, calls)(x)
    b = Scale("b", 3.0, calls)(a)
    y = F.add(a, b) if first == "low" else F.add(b, a)
    y.backward()
    assert calls == ["b", "a"]
    assert x.grad.item() == 8.0  # 2 + 3 * 2


def test_a_branch_runs_as_soon_as_nothing_queued_can_add_to_it(xp):
    # y = t1 + t2 + t3, t_i = out_i(in_i(x)): once out_i has run, in_i's gradient is complete
    # (what is still queued began before in_i or is lower), so in_i runs next, not after every out
    calls = []
    x = var(xp, 1.0)
    y = None
    for i in (1, 2, 3):
        t = Scale(f"out{i}", 1.0, calls)(Scale(f"in{i}", float(i), calls)(x))
        y = t if y is None else y + t
    y.backward()
    assert calls == ["out3", "in3", "out2", "in2", "out1", "in1"]
    assert x.grad.item() == 6.0


def test_a_function_waits_for_a_later_consumer_of_the_same_generation(xp):
    # a = c(x) feeds t (queued) and f (run first: same generation, begun later); when f hands a
    # its gradient, c must still wait for t's share
    calls = []
    x = var(xp, 1.0)
    a = Scale("c", 2.0, calls)(x)
    t = Scale("t", 3.0, calls)(a)
    f = Scale("f", 5.0, calls)(a)
    (t + f).backward()
    assert calls == ["f", "t", "c"]
    assert x.grad.item() == 16.0  # 2 * (3 + 5)


def reference_walk(y):
    """The gradients of y for every Variable behind it, micrograd's way: the Functions in a
    depth-first topological order, then each backward once, in reverse. The specification the
    engine's walk (with its heap, shortcuts and in-place sums) must agree with."""
    order, seen, stack = [], set(), [(y.creator, False)]
    while stack:
        f, expanded = stack.pop()
        if expanded:
            order.append(f)
        elif f is not None and f not in seen:
            seen.add(f)
            stack += [(f, True)] + [(x.creator, False) for x in f.inputs if isinstance(x, Variable)]
    grads = {y: Variable(y.xp.ones_like(y.data))}
    with gradcore.no_grad():
        for f in reversed(order):
            gys = [grads.get(ref()) for ref in f.outputs]
            gxs = f.backward(*[f.zeros_for_output(i) if g is None else g for i, g in enumerate(gys)])
            for x, gx in zip(f.inputs, gxs if isinstance(gxs, tuple) else (gxs,)):
                if gx is not None and isinstance(x, Variable) and x.requires_grad:
                    grads[x] = grads[x] + gx if x in grads else gx
    return grads


@pytest.mark.parametrize("mode", ["backward", "grad", "create_graph"])
@pytest.mark.parametrize("seed", range(30))
def test_random_graphs_match_forward_mode_derivatives(xp, seed, mode):
    # Random graphs of scale, add, mul and a two-output split (one output sometimes dropped),
    # each node also carrying its derivatives by forward mode: whatever order the walk picks,
    # whichever Functions it runs early and however it sums, every leaf's gradient must agree
    rng = np.random.default_rng(seed)
    calls = []
    leaves = [var(xp, v) for v in rng.uniform(0.5, 1.2, size=2)]
    nodes = [(x, float(x.item()), np.eye(2)[i]) for i, x in enumerate(leaves)]  # (v, value, d)
    for _ in range(25):
        kind = rng.choice(["scale", "add", "mul", "split"])
        (u, uv, ud), (w, wv, wd) = (nodes[i] for i in rng.integers(len(nodes), size=2))
        if kind == "scale":
            k = float(rng.uniform(-1.2, 1.2))
            nodes.append((Scale("s", k, calls)(u), k * uv, k * ud))
        elif kind == "mul" and abs(uv * wv) < 1e6:
            nodes.append((u * w, uv * wv, uv * wd + wv * ud))
        elif kind == "split":
            first, second = Split()(u)
            nodes.append((first, 2 * uv, 2 * ud))
            if rng.random() < 0.7:  # else the second output dies here: it contributes zeros
                nodes.append((second, uv * uv, 2 * uv * ud))
            del second
        else:
            nodes.append((u + w, uv + wv, ud + wd))
    picked = [nodes[-1]] + [nodes[i] for i in rng.choice(len(nodes), size=3)]
    y, value, derivative = picked[0]
    for v, vv, vd in picked[1:]:
        y, value, derivative = y + v, value + vv, derivative + vd
    seen = []  # every gradient a hook was handed, with its value then: none may change later
    for v, _, _ in nodes:
        if rng.random() < 0.3:
            v.register_hook(lambda g: seen.append((g, g.numpy().copy())))
    if mode == "grad":
        grads = gradcore.grad(y, leaves, allow_unused=True)
        assert all(x.grad is None for x in leaves)
    else:
        y.backward(create_graph=mode == "create_graph")
        grads = [x.grad for x in leaves]
    assert y.item() == pytest.approx(value, rel=1e-12)
    reference = reference_walk(y)
    for x, g, expected in zip(leaves, grads, derivative):
        got = 0.0 if g is None else g.item()
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)
        assert got == pytest.approx(reference[x].item() if x in reference else 0.0, rel=1e-12)
    for g, kept in seen:
        np.testing.assert_array_equal(g.numpy(), kept)


def test_retain_grad_false_keeps_leaf_gradients_only(xp):
    x = var(xp, 1.0)
    t = F.square(x)
    y = F.exp(t)
    y.backward()
    assert y.grad is None and t.grad is None
    np.testing.assert_allclose(x.grad.item(), 2 * np.e, rtol=1e-14)


def test_retain_grad_true_keeps_every_gradient(xp):
    x = var(xp, 1.0)
    t = F.square(x)
    y = F.exp(t)
    y.backward(retain_grad=True)
    assert y.grad.item() == 1.0
    np.testing.assert_allclose(t.grad.item(), np.e, rtol=1e-14)
    np.testing.assert_allclose(x.grad.item(), 2 * np.e, rtol=1e-14)


def test_no_grad_records_nothing(xp):
    x = var(xp, [1.0, 2.0])
    with gradcore.no_grad():
        y = F.square(F.square(x))
        z = x * 2 + 1
    for v in (y, z):
        assert v.creator is None and v.generation == 0 and v.requires_grad is False
    np.testing.assert_array_equal(y.numpy(), [1.0, 16.0])
    w = F.square(x)  # recording again after the block
    assert w.creator is not None and w.generation == 1


def test_backward_from_a_leaf(xp):
    x = var(xp, [1.0, 2.0])
    x.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])


def test_default_seed_is_ones(xp):
    x = var(xp, [1.0, 2.0, 3.0])
    y = x * x
    y.backward()  # the gradient of sum(y)
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0, 6.0])


# =============================================================================== seeds
def test_backward_with_an_array_seed(xp):
    x = var(xp, [1.0, 2.0, 3.0])
    y = x * x
    y.backward(grad=xp.asarray([1.0, 0.0, -2.0]))
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 0.0, -12.0])


def test_backward_with_a_variable_seed(xp):
    x = var(xp, [1.0, 2.0])
    y = F.exp(x)
    y.backward(grad=var(xp, [2.0, 3.0], requires_grad=False), retain_grad=True)
    np.testing.assert_allclose(x.grad.numpy(), [2 * np.e, 3 * np.e ** 2], rtol=1e-14)
    np.testing.assert_array_equal(y.grad.numpy(), [2.0, 3.0])


def test_backward_takes_pytorchs_gradient_keyword_for_the_seed(xp):
    x = var(xp, [1.0, 2.0, 3.0])
    (x * x).backward(gradient=xp.asarray([1.0, 0.0, -2.0]))
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 0.0, -12.0])
    with pytest.raises(TypeError, match="both grad and gradient"):
        (x * x).backward(xp.asarray([1.0, 1.0, 1.0]), gradient=xp.asarray([1.0, 1.0, 1.0]))
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 0.0, -12.0])  # nothing added


def test_backward_with_a_wrongly_shaped_seed(xp):
    x = var(xp, [1.0, 2.0, 3.0])
    y = x * 2
    for seed in (xp.asarray([1.0, 2.0]), var(xp, [[1.0, 2.0, 3.0]])):
        with pytest.raises(ValueError, match=r"seed gradient has shape \(.*\) but the output has "
                                             r"shape \(3,\)"):
            y.backward(grad=seed)
    assert x.grad is None


def test_a_number_or_list_seed_is_made_where_the_output_is():
    """A number is on no device: 2.0 seeds an output on an array-API device as it does on NumPy."""
    for make in (np.asarray, lambda a: STRICT.asarray(a, device=DEVICE1)):
        for seed in (2.0, np.float64(2.0), [2.0, 2.0]):
            x = Variable(make(np.array([1.0, 2.0], dtype=np.float32)))
            y = x * x if isinstance(seed, list) else F.sum(x * x)
            y.backward(grad=seed)
            assert x.grad.dtype == x.dtype and x.grad.device == x.device
            np.testing.assert_array_equal(x.grad.numpy(), [4.0, 8.0])
        g, = gradcore.grad(F.sum(x * x), [x], grad_outputs=[3])
        assert g.device == x.device
        np.testing.assert_array_equal(g.numpy(), [6.0, 12.0])


def test_a_seed_on_another_device_is_rejected_before_anything_changes():
    x = Variable(STRICT.asarray(np.array([1.0, 2.0]), device=DEVICE1))
    y = x + 1
    with pytest.raises((TypeError, ValueError), match="seed"):
        y.backward(grad=np.ones(2))
    assert x.grad is None


def test_a_grad_set_on_the_output_is_the_seed_as_in_dezero(xp):
    x = var(xp, [1.0, 2.0])
    y = x * 3.0
    y.grad = var(xp, [1.0, 10.0], requires_grad=False)  # the book's y.grad = np.array(1.0)
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 30.0])
    assert y.grad is None  # taken, as DeZero clears it: the next backward seeds with ones
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [6.0, 33.0])


def test_a_grad_set_on_an_output_that_retains_its_grad_is_the_seed_once():
    x = Variable(np.array([1.0, 2.0]))
    y = x * 3.0
    y.retain_grad()
    y.grad = np.array([1.0, 10.0])
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 30.0])
    np.testing.assert_array_equal(y.grad.numpy(), [1.0, 10.0])  # kept by retain_grad
    y.backward()  # a retained .grad is no seed: ones, and it adds up
    np.testing.assert_array_equal(x.grad.numpy(), [6.0, 33.0])
    np.testing.assert_array_equal(y.grad.numpy(), [2.0, 11.0])


def test_a_grad_retained_by_an_earlier_backward_is_no_seed():
    x = Variable(np.array([1.0, 2.0]))
    y = x * 3.0
    z = y * y
    z.backward(retain_grad=True)  # y.grad = 2 y = [6, 12]
    x.cleargrad()
    y.backward()  # seeded with ones, not y.grad
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])
    np.testing.assert_array_equal(y.grad.numpy(), [6.0, 12.0])


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_retained_grad_copied_with_its_variable_is_still_no_seed(how):
    """Retained grads were told from hand-set ones by the identity of the object: a copy's
    .grad is a new object, and h2.backward() seeded with it (x2.grad [18, 36])."""
    import copy
    import pickle

    x = Variable(np.array([1.0, 2.0]))
    h = x * 3.0
    F.sum(h * h).backward(retain_grad=True)  # h.grad = 2 h = [6, 12]
    h2 = copy.deepcopy(h) if how == "deepcopy" else pickle.loads(pickle.dumps(h))
    x2 = h2.creator.inputs[0]
    x2.cleargrad()
    h2.backward()  # seeded with ones
    np.testing.assert_array_equal(x2.grad.data, [3.0, 3.0])
    np.testing.assert_array_equal(h2.grad.data, [6.0, 12.0])  # kept as it was


def test_another_variables_retained_grad_set_by_hand_is_the_seed():
    """a.grad = u.grad, where u.grad was retained, was taken for a's own retained grad: a's
    backward seeded with ones (x.grad [2, 2]); DeZero seeds with it."""
    x = Variable(np.array([1.0, 2.0]))
    a = x * 2.0
    u = Variable(a.data.copy()) * 1.0  # the next stage starts from a copy of a
    F.sum(u * u).backward(retain_grad=True)  # u.grad = 2 u = [4, 8]
    a.grad = u.grad
    a.backward()
    np.testing.assert_array_equal(x.grad.data, [8.0, 16.0])
    assert a.grad is None  # taken, as a hand-set seed is


def test_a_grad_set_on_the_output_stays_when_backward_is_refused():
    x = Variable(np.array([1.0, 2.0]))
    y = x * 3.0
    v = Variable(np.array([1.0, 10.0]), requires_grad=False)
    y.grad = v
    x.data = np.array([5.0, 5.0])  # mul's backward would read the new values
    with pytest.raises(RuntimeError, match="written after mul ran"):
        y.backward()
    assert y.grad is v and x.grad is None


def test_a_grad_set_on_an_output_that_retains_its_grad_stays_when_backward_fails():
    """A backward that fails after y retained its hand-set seed (here x's hook raises) left that
    retained copy as y.grad: the retry seeded with ones (x.grad [3, 3])."""
    fail = [True]

    def hook(g):
        if fail[0]:
            raise ValueError("a transient failure")
    x = Variable(np.array([1.0, 2.0]))
    x.register_hook(hook)
    y = x * 3.0
    y.retain_grad()
    v = Variable(np.array([5.0, 5.0]), requires_grad=False)
    y.grad = v
    with pytest.raises(ValueError, match="a transient failure"):
        y.backward()
    assert y.grad is v and x.grad is None
    fail[0] = False
    y.backward()  # the same seed again
    np.testing.assert_array_equal(x.grad.data, [15.0, 15.0])
    np.testing.assert_array_equal(y.grad.data, [5.0, 5.0])  # now kept by retain_grad


def test_a_float64_seed_keeps_float32_gradients(xp):
    x = var(xp, [1.0, 2.0], "float32")
    y = x * 2.0
    y.backward(grad=xp.asarray([1.0, 1.0], dtype="float64"))
    assert x.grad.dtype == xp.float32


# =============================================================================== hooks
def test_hook_doubles_a_gradient_and_remove_undoes_it(xp):
    x = var(xp, [1.0, 2.0])
    handle = x.register_hook(lambda g: g * 2)
    (x * 3).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [6.0, 6.0])
    handle.remove()
    x.cleargrad()
    (x * 3).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])
    handle.remove()  # twice is harmless


def test_a_handle_removed_twice_leaves_the_same_hook_registered_again():
    def double(g):
        return g * 2

    def count(p):
        calls.append(1)

    x, calls = Parameter(np.array([1.0, 2.0])), []
    first, second = x.register_hook(double), x.register_hook(double)
    post_first, post_second = (x.register_post_accumulate_grad_hook(count) for _ in range(2))
    for handle in (first, first, post_first, post_first):
        handle.remove()
    (x * 3).backward()
    np.testing.assert_array_equal(x.grad.data, [6.0, 6.0])  # `second` still doubles
    assert calls == [1]  # `post_second` still counts


def test_each_handle_of_a_hook_registered_twice_takes_off_its_own_registration():
    """double, clip, double on one Variable: the second handle took the first double off, so
    the gradient was clipped, then doubled (x.grad 2.0 for 1.0, not clip(2 * 1.0) = 1.0), and
    a handle whose copy of the hook was taken off by its twin took off a later one."""
    def double(g):
        return g * 2.0

    def clip(g):
        return F.clip(g, -1.0, 1.0)

    def grad_of(x):
        x.cleargrad()
        (x * 1.0).sum().backward()
        return x.grad.item()

    x = Parameter(np.array([1.0]))
    first, _, second = x.register_hook(double), x.register_hook(clip), x.register_hook(double)
    second.remove()
    assert x._hooks == [double, clip] and grad_of(x) == 1.0  # clip(2 * 1.0)
    second.remove()  # twice is harmless
    assert x._hooks == [double, clip]
    x.register_hook(double)  # the handle is dropped: its copy stays
    first.remove()
    assert x._hooks == [clip, double] and grad_of(x) == 2.0
    again = x.register_hook(double)
    first.remove()  # its registration is gone: the same hook registered again stays
    assert x._hooks == [clip, double, double] and grad_of(x) == 4.0
    again.remove()
    assert x._hooks == [clip, double]

    order = []
    w = Parameter(np.array([1.0]))
    post_first = w.register_post_accumulate_grad_hook(order.append)
    w.register_post_accumulate_grad_hook(lambda p: order.append("other"))
    post_second = w.register_post_accumulate_grad_hook(order.append)
    post_second.remove()
    (w * 1.0).sum().backward()
    assert order == [w, "other"]
    post_second.remove()
    post_first.remove()
    order.clear()
    (w * 1.0).sum().backward()
    assert order == ["other"]


def test_hook_on_an_intermediate_changes_what_flows_on(xp):
    x = var(xp, 2.0)
    t = x * 3
    seen = []
    t.register_hook(lambda g: seen.append(g.item()))  # returns None: gradient unchanged
    t.register_hook(lambda g: g * 10)
    y = t * t
    y.backward()
    assert seen == [12.0]  # dy/dt = 2t = 12, seen once, with the total
    assert x.grad.item() == 360.0  # 12 * 10 * 3
    assert t.grad is None


def test_hook_needs_a_callable():
    with pytest.raises(TypeError, match="callable"):
        Variable(1.0).register_hook(3)


def test_hook_runs_in_grad():
    x = Variable(np.array(2.0))
    x.register_hook(lambda g: g + 1)
    g, = gradcore.grad(x * 5, x)
    assert g.item() == 6.0 and x.grad is None


def test_grad_returns_a_computed_variables_gradient_after_its_hooks_as_a_leafs():
    """The README's rule (PyTorch returns h's before its hook: [6, 12])."""
    x = Variable(np.array([1.0, 2.0]))
    h = x * 3
    h.register_hook(lambda g: g * 10)
    gh, gx = gradcore.grad(F.sum(h * h), [h, x])
    np.testing.assert_array_equal(gh.data, [60.0, 120.0])
    np.testing.assert_array_equal(gx.data, [180.0, 360.0])


# =============================================================================== post-accumulate hooks
def two_layers(xp):
    """A small two-layer graph on parameters w1, w2; w2's ops run before w1's in backward."""
    w1, w2 = var(xp, [[0.5, -1.0], [2.0, 0.25]]), var(xp, [[1.5], [-0.5]])
    x = var(xp, [[1.0, 2.0], [3.0, -1.0]])
    h = F.tanh(x @ w1)
    return w1, w2, lambda: F.sum(h @ w2 + (h * 2) @ w2)  # w2 used twice


def test_post_accumulate_hook_fires_once_a_leaf_is_final_before_the_walk_ends(xp):
    w1, w2, loss = two_layers(xp)
    loss().backward()
    expected = {"w1": w1.grad.numpy(), "w2": w2.grad.numpy()}
    w1.cleargrad(), w2.cleargrad()
    seen = []
    for name, w in (("w1", w1), ("w2", w2)):
        w.register_post_accumulate_grad_hook(
            lambda p, name=name: seen.append((name, p.grad.numpy(), w1.grad is None)))
    loss().backward()
    assert [(name, w1_pending) for name, _, w1_pending in seen] == [("w2", True), ("w1", False)]
    for name, grad, _ in seen:  # both of w2's uses were in when its hook ran
        np.testing.assert_array_equal(grad, expected[name])
    loss().backward()  # a second backward: the hook sees the sum
    np.testing.assert_array_equal(seen[-1][1], 2 * expected["w1"])


def test_post_accumulate_hook_on_a_root_leaf_and_removal(xp):
    x = var(xp, [1.0, 2.0])
    calls = []
    handle = x.register_post_accumulate_grad_hook(lambda p: calls.append(p.grad.numpy()))
    x.backward()
    (x * 3).backward()
    np.testing.assert_array_equal(calls[0], [1.0, 1.0])
    np.testing.assert_array_equal(calls[1], [4.0, 4.0])
    handle.remove()
    handle.remove()  # twice is harmless
    (x * 3).backward()
    assert len(calls) == 2 and x not in gradcore.engine.hooked_leaves
    assert not hasattr(x, "_post_hooks")


def test_post_accumulate_hook_sees_the_gradient_after_gradient_hooks_and_not_in_grad(xp):
    x = var(xp, [1.0, -1.0])
    x.register_hook(lambda g: g * 10)
    calls = []
    x.register_post_accumulate_grad_hook(lambda p: calls.append(p.grad.numpy()))
    g, = gradcore.grad(F.sum(x * x), x)  # grad leaves .grad alone: no post-accumulate hook
    assert calls == [] and x.grad is None
    F.sum(x * x).backward()
    np.testing.assert_array_equal(calls[0], [20.0, -20.0])


def test_leaves_released_early_own_their_gradients(xp):
    a, b = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])
    a.register_post_accumulate_grad_hook(lambda p: None)
    (a + b).backward()  # add hands one gradient to both inputs
    a.grad.data[...] = 7.0
    np.testing.assert_array_equal(b.grad.numpy(), [1.0, 1.0])
    b.register_post_accumulate_grad_hook(lambda p: None)
    a.cleargrad(), b.cleargrad()
    (a + b).backward()
    a.grad.data[...] = 7.0
    np.testing.assert_array_equal(b.grad.numpy(), [1.0, 1.0])


def test_a_post_accumulate_hook_writing_into_its_gradient_changes_that_gradient_alone(xp):
    x, y = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])

    def halve(p):
        p.grad.data[...] *= 0.5
    x.register_post_accumulate_grad_hook(halve)
    F.sum((x + y) * 2.0).backward()  # add hands one gradient array to both inputs
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(y.grad.numpy(), [2.0, 2.0])


def test_a_gradient_handed_on_through_another_op_is_not_shared_with_a_hooked_leaf(xp):
    """add hands one array to a and z; a's creator hands it on to x, released early: x gets a
    copy, so writing into x.grad (in its hook or after) leaves z.grad alone."""
    x, z = var(xp, [1.0, 2.0, 3.0]), var(xp, [4.0, 5.0, 6.0])

    def halve(p):
        p.grad.data[...] *= 0.5
    x.register_post_accumulate_grad_hook(halve)
    F.sum(((x + 1.0) + z) * 2.0).backward()
    x.grad.data[...] = 0.0
    np.testing.assert_array_equal(z.grad.numpy(), [2.0, 2.0, 2.0])


def test_a_post_accumulate_hook_whose_g_op_equals_is_lost_is_warned_about(xp):
    """g = p.grad; g *= 0.5 rebinds g (DeZero's rule): .grad stayed [2, 4], the halving lost.
    A hook that uses the result (sets .grad or its array, steps p with it) is not warned."""
    def lost(p):
        g = p.grad
        g *= 0.5

    def set_back(p):
        g = p.grad
        g *= 0.5
        p.grad = g

    def written_back(p):
        g = p.grad
        g *= 0.5
        p.grad.data = g.data

    def written_into(p):
        g = p.grad
        g *= 0.5
        p.grad.data[...] = g.data

    kept = []

    def kept_aside(p):
        g = p.grad
        g *= 0.5
        kept.append(g)

    def stepped(p):  # a scaled update in backward
        g = p.grad
        g *= 0.5
        with gradcore.no_grad():
            p -= g

    def stepped_through_its_array(p):  # the same, writing p's array
        g = p.grad
        g *= 0.5
        p.data[...] -= g.data

    for hook, want_grad, want_w in ((set_back, [1.0, 2.0], [1.0, 2.0]),
                                    (written_back, [1.0, 2.0], [1.0, 2.0]),
                                    (written_into, [1.0, 2.0], [1.0, 2.0]),
                                    (kept_aside, [2.0, 4.0], [1.0, 2.0]),
                                    (stepped, [2.0, 4.0], [0.0, 0.0]),
                                    (stepped_through_its_array, [2.0, 4.0], [0.0, 0.0])):
        w = var(xp, [1.0, 2.0])
        w.register_post_accumulate_grad_hook(hook)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            F.sum(w * w).backward()
        np.testing.assert_array_equal(w.grad.numpy(), want_grad)
        np.testing.assert_array_equal(w.numpy(), want_w)
    np.testing.assert_array_equal(kept[0].numpy(), [1.0, 2.0])
    w = var(xp, [float("nan"), 2.0])  # NaN written back is no NaN lost
    w.register_post_accumulate_grad_hook(written_into)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.sum(w * w).backward()
    w = var(xp, [1.0, 2.0])
    w.register_post_accumulate_grad_hook(lost)
    with pytest.warns(RuntimeWarning, match=r"post-accumulate hook .*lost on .* wrote g op= "
                                            r"\.\.\. .*x\.grad = x\.grad \* 0\.5"):
        F.sum(w * w).backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 4.0])


def test_a_post_accumulate_hook_may_step_and_drop_the_gradient(xp):
    """PyTorch's optimizer step inside backward: the hook updates p and sets p.grad to None."""
    w, x = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])
    opt = gradcore.optim.SGD([w], lr=0.1)

    def step_in_backward(p):
        opt.step()
        opt.zero_grad()
    w.register_post_accumulate_grad_hook(step_in_backward)
    F.sum(w * x).backward()
    np.testing.assert_allclose(w.numpy(), [0.7, 1.6])
    assert w.grad is None


def test_post_accumulate_hook_errors():
    with pytest.raises(TypeError, match="callable"):
        Variable(1.0).register_post_accumulate_grad_hook(3)
    with pytest.raises(RuntimeError, match="only a leaf"):
        (Variable(1.0) * 2).register_post_accumulate_grad_hook(lambda p: None)
    from gradcore import engine
    ids = Variable(np.arange(3))  # integers never get a gradient: the hook could never run
    with pytest.raises(RuntimeError, match="holds int64 data, which never gets a gradient"):
        ids.register_post_accumulate_grad_hook(lambda p: None)
    assert ids not in engine.hooked_leaves  # no backward pays a counting pass for it
    frozen = Variable(np.ones(3), requires_grad=False)  # may require grad again: taken
    frozen.register_post_accumulate_grad_hook(lambda p: None)


# =============================================================================== higher order
def _poly(x):
    return x ** 4 - 2 * x ** 2  # y'' = 12 x^2 - 4 = 44 at x = 2


def test_second_derivative_with_backward_create_graph(xp):
    x = var(xp, 2.0)
    y = _poly(x)
    y.backward(create_graph=True)
    gx = x.grad
    assert gx.item() == pytest.approx(24.0, rel=1e-14)  # 4 x^3 - 4 x
    assert gx.creator is not None  # the backward pass was recorded
    x.cleargrad()
    gx.backward()
    assert x.grad.item() == pytest.approx(44.0, rel=1e-14)


def test_backward_without_create_graph_records_nothing(xp):
    x = var(xp, 2.0)
    _poly(x).backward()
    assert x.grad.creator is None and x.grad.requires_grad is False


def test_second_derivative_with_grad(xp):
    x = var(xp, 2.0)
    gx, = gradcore.grad(_poly(x), x, create_graph=True)
    gxx, = gradcore.grad(gx, x)
    assert (gx.item(), gxx.item()) == pytest.approx((24.0, 44.0), rel=1e-14)
    assert x.grad is None


def _tanh_derivatives(t):
    """d^k/dx^k tanh(x), k = 1..5, as polynomials in t = tanh(x): each is p(t) * (1 - t^2),
    because d/dx p(t) = p'(t) (1 - t^2)."""
    s = 1 - t * t
    return [
        s,
        -2 * t * s,
        (6 * t ** 2 - 2) * s,
        (16 * t - 24 * t ** 3) * s,
        (120 * t ** 4 - 120 * t ** 2 + 16) * s,
    ]


def test_tanh_closed_forms_are_right():
    """Check the closed forms themselves: each against a central difference of the one before,
    and the Taylor series tanh x = x - x^3/3 + 2 x^5/15 at 0 (d3 = -2, d5 = 16)."""
    a = np.array([-1.3, -0.4, 0.2, 0.9, 1.7])
    h = 1e-5
    up, down = _tanh_derivatives(np.tanh(a + h)), _tanh_derivatives(np.tanh(a - h))
    exact = _tanh_derivatives(np.tanh(a))
    for k in range(4):
        np.testing.assert_allclose((up[k] - down[k]) / (2 * h), exact[k + 1], rtol=1e-7, atol=1e-8)
    at0 = _tanh_derivatives(0.0)
    assert at0 == [1.0, 0.0, -2.0, 0.0, 16.0]


def test_tanh_derivatives_up_to_fifth_order(xp):
    a = np.array([-1.3, -0.4, 0.0, 0.2, 0.9, 1.7])
    x = var(xp, a)
    g = F.tanh(x)
    expected = _tanh_derivatives(np.tanh(a))
    for k in range(5):
        g, = gradcore.grad(g, x, create_graph=True)  # elementwise: the seed of ones gives d^k
        np.testing.assert_allclose(g.numpy(), expected[k], rtol=1e-12, atol=1e-12,
                                   err_msg=f"derivative {k + 1}")


def test_tanh_derivatives_with_repeated_backward(xp):
    x = var(xp, [0.5, -1.0])
    y = F.tanh(x)
    y.backward(create_graph=True)
    for k in range(1, 4):
        gx = x.grad
        x.cleargrad()
        gx.backward(create_graph=True)
    np.testing.assert_allclose(x.grad.numpy(), _tanh_derivatives(np.tanh([0.5, -1.0]))[3],
                               rtol=1e-12)


def test_mixed_second_derivative(xp):
    x, w = var(xp, 3.0), var(xp, 2.0)
    y = x ** 2 * F.sin(w)
    gx, = gradcore.grad(y, x, create_graph=True)  # 2 x sin w
    gxw, = gradcore.grad(gx, w)                   # 2 x cos w
    np.testing.assert_allclose(gxw.item(), 6 * np.cos(2.0), rtol=1e-14)


# =============================================================================== gradcore.grad
def test_grad_leaves_every_grad_untouched(xp):
    x, w = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])
    t = x * w
    y = F.sum(t)
    gx, gw = gradcore.grad(y, [x, w])
    np.testing.assert_array_equal(gx.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(gw.numpy(), [1.0, 2.0])
    assert x.grad is None and w.grad is None and t.grad is None and y.grad is None
    x.grad = var(xp, [100.0, 100.0])  # an existing .grad is neither used nor changed
    gx2, = gradcore.grad(y, x)
    np.testing.assert_array_equal(gx2.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(x.grad.numpy(), [100.0, 100.0])


def test_grad_with_respect_to_an_intermediate(xp):
    x = var(xp, 2.0)
    t = x * 3
    y = t * t
    gt, gx = gradcore.grad(y, [t, x])
    assert (gt.item(), gx.item()) == (12.0, 36.0)
    assert t.grad is None and x.grad is None


def test_grad_with_grad_outputs_and_several_outputs(xp):
    x = var(xp, [1.0, 2.0])
    y1, y2 = x * 2, x * x
    g, = gradcore.grad([y1, y2], [x], grad_outputs=[xp.asarray([1.0, 1.0]), xp.asarray([3.0, 0.0])])
    np.testing.assert_array_equal(g.numpy(), [2 + 3 * 2, 2 + 0])
    g, = gradcore.grad(y2, x, grad_outputs=var(xp, [0.5, 0.5]))  # a single seed, unwrapped
    np.testing.assert_array_equal(g.numpy(), [1.0, 2.0])
    with pytest.raises(ValueError, match="1 grad_outputs for 2 outputs"):
        gradcore.grad([y1, y2], x, grad_outputs=[xp.asarray([1.0, 1.0])])


def test_grad_allow_unused(xp):
    x, unused = var(xp, 2.0), var(xp, 5.0)
    y = x * x
    with pytest.raises(RuntimeError, match="input 1 was not used.*allow_unused=True"):
        gradcore.grad(y, [x, unused])
    gx, gu = gradcore.grad(y, [x, unused], allow_unused=True)
    assert gx.item() == 4.0 and gu is None
    frozen = var(xp, 1.0, requires_grad=False)
    _, gf = gradcore.grad(y * frozen, [x, frozen], allow_unused=True)
    assert gf is None


def test_grad_checks_its_arguments():
    x = Variable(np.array(1.0))
    with pytest.raises(TypeError, match="grad: inputs must be Variables"):
        gradcore.grad(x * 2, [x, np.array(1.0)])
    with pytest.raises(TypeError, match="grad: expected a Variable"):
        gradcore.grad(np.array(1.0), x)


def test_grad_create_graph_false_gives_constants(xp):
    x = var(xp, 2.0)
    g, = gradcore.grad(x ** 3, x)
    assert g.creator is None and g.item() == pytest.approx(12.0, rel=1e-14)


# =============================================================================== multi-output
class Split(Function):
    """Two outputs from one input: (2x, x^2)."""

    def forward(self, x):
        return x * 2.0, x * x

    def backward(self, g0, g1):
        x, = self.inputs
        return g0 * 2.0 + g1 * 2 * x


def test_a_dropped_output_contributes_zeros(xp):
    x = var(xp, [1.0, 3.0])
    a, b = Split()(x)
    ref = weakref.ref(b)
    del b
    assert ref() is None  # outputs are held weakly: the second output is really gone
    a.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])


def test_an_unused_output_contributes_zeros(xp):
    x = var(xp, [1.0, 3.0])
    a, b = Split()(x)
    (b * 1.0).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 6.0])
    assert b.creator is a.creator


# =============================================================================== deep graphs
N_DEEP = 100_000


def _chain(n):
    """x and y = x + 1 + 1 ... (n additions), with a weak reference to the first Function."""
    x = Variable(np.array(0.0))
    y = x + 1
    first = weakref.ref(y.creator)
    for _ in range(n - 1):
        y = y + 1
    return x, y, first


def test_a_100k_op_chain_backward_and_free():
    x, y, first = _chain(N_DEEP)
    assert y.item() == N_DEEP and y.generation == N_DEEP
    y.backward()
    assert x.grad.item() == 1.0
    last = weakref.ref(y.creator)
    del y  # frees 100,000 Functions one after another: no RecursionError, no crash
    assert last() is None and first() is None
    assert x.grad.item() == 1.0 and x.creator is None


def test_unchain_backward_on_a_100k_op_chain():
    x, y, first = _chain(N_DEEP)
    before_last = weakref.ref(y.creator.inputs[0].creator)
    y.unchain_backward()
    assert before_last() is None and first() is None  # everything behind y's creator is freed
    last = y.creator
    assert last is not None and last.inputs[0].creator is None
    y.backward()
    assert x.grad is None  # the way back to x is gone
    assert last.inputs[0].grad.item() == 1.0  # y's input is now a leaf


def test_unchain_backward_on_a_diamond(xp):
    x = var(xp, 2.0)
    a = F.square(x)
    b, c = F.exp(a), F.sin(a)
    y = b + c
    y.unchain_backward()
    assert y.creator is not None and b.creator is None and c.creator is None and a.creator is None
    y.backward()
    assert x.grad is None and b.grad.item() == 1.0 and c.grad.item() == 1.0


# =============================================================================== dtypes
def test_a_float64_constant_still_gives_a_float32_input_a_float32_gradient(xp):
    x = var(xp, [1.0, 2.0, 3.0], "float32")
    y = F.sum(x * xp.asarray([2.0, 3.0, 4.0], dtype="float64"))  # promotes the result to float64
    assert y.dtype == xp.float64
    y.backward()
    assert x.grad.dtype == xp.float32
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [2.0, 3.0, 4.0])


def test_a_scalar_gradient_of_another_dtype_is_cast_too(xp):
    # on NumPy h is a float32 scalar and its gradient a float64 one: the walk tells scalars'
    # shapes and dtypes by their class, which must still see the two differ
    x = var(xp, 1.5, "float32")
    h = x * 2.0
    y = h * xp.asarray(3.0, dtype="float64")
    assert y.dtype == xp.float64
    y.backward(retain_grad=True)
    assert h.grad.dtype == xp.float32 and h.grad.item() == 3.0
    assert x.grad.dtype == xp.float32 and x.grad.item() == 6.0


def test_astype_is_differentiable_twice_and_its_gradient_keeps_the_input_dtype(xp):
    x = var(xp, [1.0, 2.0], "float32")
    y = F.sum(F.astype(x, xp.float64) ** 3)
    assert y.dtype == xp.float64
    gx, = gradcore.grad(y, x, create_graph=True)
    assert gx.dtype == xp.float32
    np.testing.assert_allclose(xp.numpy(gx.data), [3.0, 12.0])
    F.sum(gx).backward()
    assert x.grad.dtype == xp.float32
    np.testing.assert_allclose(xp.numpy(x.grad.data), [6.0, 12.0])
    assert F.astype(x, xp.float32) is x  # already that dtype: no node


# =============================================================================== gradient ownership
def test_leaves_never_share_a_gradient_array(xp):
    """add's backward hands one gradient to both inputs: each leaf still owns its own."""
    x, z = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])
    (x + z).backward()
    assert x.grad is not z.grad and x.grad.data is not z.grad.data
    x.grad.data *= 0.5  # DeZero-style hooks edit .grad in place
    np.testing.assert_array_equal(x.grad.numpy(), [0.5, 0.5])
    np.testing.assert_array_equal(z.grad.numpy(), [1.0, 1.0])


def test_the_callers_seed_never_becomes_a_gradient(xp):
    x, z = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])
    seed = xp.asarray([1.0, 2.0], dtype="float64")
    (x + z).backward(seed)
    assert x.grad.data is not seed and z.grad.data is not seed
    x.grad.data *= 0.5
    z.grad.data *= 3.0
    np.testing.assert_array_equal(xp.numpy(seed), [1.0, 2.0])
    np.testing.assert_array_equal(x.grad.numpy(), [0.5, 1.0])
    leaf = var(xp, [1.0, 2.0])
    leaf.backward(seed)  # the root is the leaf itself
    assert leaf.grad.data is not seed


def test_a_memmap_seed_never_becomes_a_gradient(tmp_path):
    """A memmap seed (np.load with mmap_mode) was taken for memory x.grad could own: x.grad
    was the caller's file, and x.grad.data *= 5 wrote into it."""
    np.save(tmp_path / "seed.npy", np.ones(6))
    seed = np.load(tmp_path / "seed.npy", mmap_mode="r+")
    x = Variable(np.zeros((2, 3)))
    F.reshape(x, (6,)).backward(seed)
    x.grad.data *= 5.0
    np.testing.assert_array_equal(seed, np.ones(6))
    np.testing.assert_array_equal(x.grad.data, np.full((2, 3), 5.0))


def test_a_gradient_that_is_a_view_or_read_only_is_copied():
    """sum's backward broadcasts (a read-only view in NumPy); reshape's gives a view of the
    gradient another leaf holds."""
    x = Variable(np.ones((2, 3)))
    F.sum(x).backward()
    assert x.grad.data.flags.writeable and x.grad.data.base is None
    x.grad.data *= 2.0
    np.testing.assert_array_equal(x.grad.data, np.full((2, 3), 2.0))
    a, b = Variable(np.ones(6)), Variable(np.ones((2, 3)))
    (F.reshape(a, (2, 3)) + b).backward()
    assert not np.shares_memory(a.grad.data, b.grad.data)


def test_a_gradient_a_hook_was_handed_stays_as_the_hook_saw_it(xp):
    seen = []
    x, z = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])
    h = x * 1.0
    h.register_hook(lambda g: seen.append(g))
    (h + z).backward()
    x.grad.data *= 0.0
    z.grad.data *= 0.0
    np.testing.assert_array_equal(seen[0].numpy(), [1.0, 1.0])


def test_grad_returns_gradients_that_own_their_arrays(xp):
    x, z = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])
    gx, gz = gradcore.grad(x + z, [x, z])
    assert gx.data is not gz.data
    gx.data *= 0.5
    np.testing.assert_array_equal(gz.numpy(), [1.0, 1.0])


def test_owned_gradients_under_create_graph_stay_differentiable(xp):
    x, w, z = var(xp, [1.0, 2.0]), var(xp, [5.0, 6.0]), var(xp, [3.0, 4.0])
    ((x + w) * z).sum().backward(create_graph=True)  # add hands z to both x and w
    assert x.grad.creator is not None and x.grad.data is not w.grad.data
    x.grad.data *= 0.0
    np.testing.assert_array_equal(w.grad.numpy(), [3.0, 4.0])
    gz, = gradcore.grad(w.grad.sum(), z)  # d/dz of dy/dw = z: ones
    np.testing.assert_array_equal(gz.numpy(), [1.0, 1.0])



def test_a_plain_backward_adding_into_a_grad_with_a_graph_keeps_its_graph(xp):
    # the sum was made under the plain walk's no-grad: x.grad lost its graph, and a penalty on it
    # gave d/dx [9x^4 + x] = [1, 1] where PyTorch gives 36x^3 + 1 = [37, 289]
    x = var(xp, [1.0, 2.0])
    (x ** 3).sum().backward(create_graph=True)  # x.grad = 3x^2, with a graph
    (x * 0.0).sum().backward()  # a plain backward adds zeros into it
    assert x.grad.creator is not None
    penalty = (x.grad * x.grad).sum() + (x * 1.0).sum()
    x.cleargrad()
    penalty.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [37.0, 289.0])
    # x.grad itself can be differentiated: it said "this Variable has no graph: ... no_grad()"
    (x ** 3).sum().backward(create_graph=True)
    (x * 0.0).sum().backward()
    g = x.grad
    x.cleargrad()
    g.sum().backward()  # d(3x^2)/dx
    np.testing.assert_array_equal(x.grad.numpy(), [6.0, 12.0])


def test_a_plain_backward_adding_into_a_retained_grad_with_a_graph_keeps_its_graph(xp):
    x = var(xp, [1.0, 2.0])
    h = x * x
    h.retain_grad()
    (h ** 2).sum().backward(create_graph=True)  # h.grad = 2h, with a graph back to x
    (h * 0.0).sum().backward()  # h.grad.creator was None after this
    assert h.grad.creator is not None
    gx, = gradcore.grad(h.grad.sum(), x)  # d(2x^2)/dx = 4x
    np.testing.assert_array_equal(gx.numpy(), [4.0, 8.0])


def test_a_grad_set_by_hand_that_requires_grad_stays_differentiable_as_backward_adds(xp):
    # as in PyTorch, whose plain backward adds into such a .grad in place: g0.grad = 2 (g0 + 3)
    x, g0 = var(xp, [1.0, 2.0]), var(xp, [1.0, 1.0], requires_grad=True)
    x.grad = g0
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 4.0])
    assert x.grad.requires_grad
    (x.grad * x.grad).sum().backward()
    np.testing.assert_array_equal(g0.grad.numpy(), [8.0, 8.0])
    # one that does not require grad (what backward and the optimizers set) gets a plain sum
    x.grad = var(xp, [1.0, 1.0], requires_grad=False)
    (x * 3.0).sum().backward()
    assert x.grad.creator is None and not x.grad.requires_grad
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 4.0])

def test_accumulation_into_a_shared_leaf_is_atomic_across_threads():
    """Eight threads, each 3,000 backward passes into one leaf: not one sum may be lost."""
    import threading

    x = Variable(np.array([1.0, 2.0]))

    def work():
        for _ in range(3000):
            (x * 2.0).sum().backward()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_array_equal(x.grad.data, [48000.0, 48000.0])


def test_adding_into_a_retained_grad_is_atomic_across_threads():
    """Six threads, 300 backward passes each through one graph whose h retains its gradient
    (without the lock, sums were lost at once)."""
    w = Variable(np.array([1.0, 2.0]))
    h = w * 2.0
    h.retain_grad()

    def work(k):
        for _ in range(300):
            (h * float(k)).sum().backward(retain_graph=True)

    run_in_threads([functools.partial(work, k) for k in range(1, 7)])
    np.testing.assert_array_equal(h.grad.data, [6300.0, 6300.0])  # 300 * (1 + ... + 6)
    np.testing.assert_array_equal(w.grad.data, [12600.0, 12600.0])


# =============================================================================== hooks are checked
@pytest.mark.parametrize("result, problem", [
    (lambda xp, g: var(xp, [1.0, 2.0, 3.0]), r"shape \(3,\)"),
    (lambda xp, g: var(xp, [1.0, 2.0], dtype="float32"), "dtype .*float32"),
    (lambda xp, g: "ten", "returned a str"),
])
def test_a_hook_returning_a_wrong_gradient_is_named(xp, result, problem):
    def my_hook(g):
        return result(xp, g)

    x = Variable(xp.asarray([1.0, 2.0], dtype="float64"), name="weights")
    x.register_hook(my_hook)
    with pytest.raises(RuntimeError, match=r'hook .*my_hook on the Variable "weights" of shape '
                                           r"\(2,\).*" + problem):
        (x * 2.0).sum().backward()
    assert x.grad is None


def test_a_hook_returning_a_gradient_on_another_device_is_named():
    x = Variable(np.array([1.0, 2.0]))
    x.register_hook(lambda g: g.to(DEVICE1))
    with pytest.raises(RuntimeError, match="returned a gradient of device array_api_strict:device1"):
        (x * 2.0).sum().backward()


def test_a_hook_on_an_intermediate_is_checked_too(xp):
    x = var(xp, [1.0, 2.0])
    h = x * 3.0
    h.register_hook(lambda g: var(xp, [[1.0, 2.0]]))  # would have been broadcast and summed
    with pytest.raises(RuntimeError, match=r"returned a gradient of shape \(1, 2\)"):
        (h * h).sum().backward()


def test_a_function_called_twice_before_backward_is_refused_at_backward(xp):
    """An instance reused anyway (here by deleting the mark __call__ checks) is caught by the walk,
    which names the op instead of failing with a KeyError or silently dropping a gradient."""
    x = var(xp, [1.0, 2.0])
    f = F.Square()
    a = f(x)
    del f.sequence  # as if the instance had never been recorded: a second call goes through
    b = f(x * 2.0)
    with pytest.raises(RuntimeError, match="square: a Variable computed by this Square instance"):
        a.sum().backward()
    with pytest.raises(RuntimeError, match="square: a Variable computed by this Square instance"):
        (a + b).sum().backward()
    with pytest.raises(RuntimeError, match="square: a Variable computed by this Square instance"):
        a.sum().backward(retain_grad=True)  # the walk's general path (CuPy's always)


# ============================================================ found by an adversarial review
def test_a_graph_built_on_a_detached_variable_refuses_backward_after_a_step_on_the_original():
    from gradcore import optim
    W = gradcore.Parameter(np.array([1.0, 2.0]))
    a = Variable(np.array([3.0, 4.0]))
    y = F.sum(a * W.detach() * W.detach())  # shares W's array: and now its version
    W.grad = Variable(np.ones(2))
    optim.SGD(lr=5.0).setup([W]).update()  # W's array written in place
    with pytest.raises(RuntimeError, match="was written after mul ran in forward"):
        y.backward()


def test_an_index_array_or_a_where_condition_changed_after_forward_does_not_change_backward():
    x = Variable(np.array([1.0, 2.0, 3.0, 4.0]))
    index = np.array([0, 1])
    y = F.sum(x[index] * np.array([10.0, 20.0]))
    index[...] = [2, 3]  # the caller reuses the buffer
    y.backward()
    np.testing.assert_array_equal(x.grad.data, [10.0, 20.0, 0.0, 0.0])
    x = Variable(np.array([1.0, 2.0, 3.0]))
    condition = np.array([True, False, True])
    y = F.sum(F.where(condition, x, np.zeros(3)))
    condition[...] = False
    y.backward()
    np.testing.assert_array_equal(x.grad.data, [1.0, 0.0, 1.0])


def test_a_hooks_result_and_retained_grads_are_owned_by_their_variable():
    x, z = Variable(np.array([1.0, 2.0])), Variable(np.array([5.0, 6.0]))
    x.register_hook(lambda g: z.data)  # another Variable's array as x's gradient
    F.sum(x * 3.0).backward()
    x.grad.data *= 0.5
    np.testing.assert_array_equal(z.data, [5.0, 6.0])
    a, b = Variable(np.ones(2)), Variable(np.ones(2))
    a2, b2 = a * 1.0, b * 1.0
    a2.retain_grad()
    b2.retain_grad()
    seed = np.ones(2)
    y = a2 + b2
    y.retain_grad()
    y.backward(seed)
    assert a2.grad is not b2.grad and not np.shares_memory(y.grad.data, seed)
    a2.grad.data *= 3.0
    seed[...] = 7.0
    np.testing.assert_array_equal(b2.grad.data, [1.0, 1.0])
    np.testing.assert_array_equal(y.grad.data, [1.0, 1.0])


# ====================================================================== a leaf frozen after forward
def test_a_leaf_whose_requires_grad_is_turned_off_after_forward_gets_no_gradient(xp):
    x, w = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])
    seen = []
    x.register_hook(lambda g: seen.append(g.numpy().copy()))
    y = F.sum(x * w)
    x.requires_grad_(False)  # frozen between forward and backward: PyTorch leaves .grad None
    y.backward()
    assert x.grad is None
    np.testing.assert_array_equal(seen[0], [3.0, 4.0])  # the gradient hook still sees it flow
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 2.0])


def test_a_leaf_frozen_after_forward_still_has_its_post_accumulate_hooks_called(xp):
    # as PyTorch's engine: the hook runs once per backward, on .grad as it was (None, or the
    # gradient of an earlier backward, unchanged)
    for earlier in (None, [7.0, 7.0]):
        x, w = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])
        if earlier is not None:
            x.grad = var(xp, earlier)
        posted = []
        x.register_post_accumulate_grad_hook(
            lambda p: posted.append(None if p.grad is None else p.grad.numpy().tolist()))
        y = F.sum(x * w) + F.sum(x * x)  # x read by two ops: still one call
        x.requires_grad_(False)
        y.backward()
        assert posted == [earlier]
        np.testing.assert_array_equal(w.grad.numpy(), [1.0, 2.0])


def test_grad_gives_no_gradient_for_an_input_frozen_after_forward(xp):
    x, w = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])
    y = F.sum(x * w)
    x.requires_grad_(False)
    gx, gw = gradcore.grad(y, [x, w], allow_unused=True)
    assert gx is None
    np.testing.assert_array_equal(gw.numpy(), [1.0, 2.0])
    with pytest.raises(RuntimeError, match=r"grad: input 0, the Variable of shape \(2,\) and "
                                           r"dtype \S*float64, does not require grad"):
        gradcore.grad(y, [x, w])


# =========================================================================== seeds of another dtype
def test_a_seed_of_another_dtype_that_requires_grad_stays_differentiable(xp):
    # the double-vjp trick: d(sum(vjp(v)))/dv = 2x, through the seed's cast to float32
    x = var(xp, [1.0, 2.0], "float32")
    v = var(xp, [1.0, 3.0])  # float64
    g, = gradcore.grad(x * x, x, grad_outputs=v, create_graph=True)
    assert g.dtype == xp.float32
    np.testing.assert_array_equal(g.numpy(), [2.0, 12.0])  # 2 x v
    gv, = gradcore.grad(F.sum(g), v)
    assert gv.dtype == xp.float64
    np.testing.assert_array_equal(gv.numpy(), [2.0, 4.0])
    (x * x).backward(v, create_graph=True)
    gv, = gradcore.grad(F.sum(x.grad), v)
    np.testing.assert_array_equal(gv.numpy(), [2.0, 4.0])
    g, = gradcore.grad(x * x, x, grad_outputs=v)  # without create_graph: a constant, as before
    assert g.creator is None and g.dtype == xp.float32



class _TwiceByHelper(Function):
    """y = 2x, whose backward scales gy in a helper with `g *= 2` (DeZero's rebinding)."""

    def forward(self, x):
        return x * 2

    def backward(self, gy):
        return _doubled(gy)


def _doubled(g):
    g *= 2
    return g


def test_a_backward_helper_writing_g_op_equals_leaves_the_callers_seed_alone(xp):
    # Variable(...) requires grad by default: under the walk's no_grad `g *= 2` in a helper
    # (not itself a backward method) would have written into it, the seed doubling at each reuse
    w = var(xp, [1.0, 2.0, 3.0])
    seed = var(xp, [1.0, 1.0, 1.0])
    for _ in range(3):
        w.cleargrad()
        _TwiceByHelper()(w).backward(seed)
        np.testing.assert_array_equal(w.grad.numpy(), [2.0, 2.0, 2.0])
        np.testing.assert_array_equal(seed.numpy(), [1.0, 1.0, 1.0])
    g, = gradcore.grad(_TwiceByHelper()(w), w, grad_outputs=seed)
    np.testing.assert_array_equal(g.numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(seed.numpy(), [1.0, 1.0, 1.0])
    # with create_graph the write was refused ("a leaf that requires grad"); now it is recorded
    # and the gradient still depends on the seed: d sum(2 seed) / d seed = 2 per entry
    g, = gradcore.grad(_TwiceByHelper()(w), w, grad_outputs=seed, create_graph=True)
    np.testing.assert_array_equal(g.numpy(), [2.0, 2.0, 2.0])
    gs, = gradcore.grad(F.sum(g), seed)
    np.testing.assert_array_equal(gs.numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(seed.numpy(), [1.0, 1.0, 1.0])


def test_an_output_listed_twice_under_no_grad_keeps_its_seeds_differentiable(xp):
    # its two seeds were summed under the caller's no_grad: d(sum g)/dv was None (PyTorch [4, 8])
    x, v = var(xp, [1.0, 2.0]), var(xp, [3.0, 5.0])
    y = x ** 2
    with gradcore.no_grad():
        g, = gradcore.grad([y, y], x, grad_outputs=[v, v], create_graph=True)  # 2 * 2x * v
    np.testing.assert_array_equal(g.numpy(), [12.0, 40.0])
    gv, = gradcore.grad(g.sum(), v)  # 4x
    np.testing.assert_array_equal(gv.numpy(), [4.0, 8.0])
    g, = gradcore.grad([y, y], x, grad_outputs=[v, v])  # without create_graph: a constant
    assert g.creator is None

# =================================================================================== no graph: why
def test_backward_on_an_integer_result_says_only_floating_point_variables_require_grad():
    x = Variable(np.array(2))
    assert not x.requires_grad
    with pytest.raises(RuntimeError, match=r"backward: this Variable holds int64 data and has no "
                                           r"graph: only floating-point Variables require grad.*"
                                           r"Variable\(np.array\(2.0\)\) rather than "
                                           r"Variable\(np.array\(2\)\)"):
        (x ** 2).backward()
    y = Variable(np.array(2.0))
    (y ** 2).backward()  # the cast the message suggests works
    assert y.grad.item() == 4.0


def test_backward_and_grad_on_a_variable_without_data_say_so():
    empty = Variable(None)
    with pytest.raises(RuntimeError, match=r"backward: this Variable has no data \(data is None\)"):
        empty.backward()
    with pytest.raises(RuntimeError, match=r"grad: this Variable has no data \(data is None\)"):
        gradcore.grad(empty, [Variable(np.array(1.0))])


def test_a_float_result_without_a_graph_names_integer_inputs_and_accuracy():
    with pytest.raises(RuntimeError, match=r"has no graph: .*no_grad\(\).*integer and bool "
                                           r"Variables never do.*Variable\(np.array\(2.0\)\)"):
        F.exp(Variable(np.array([1, 2]))).backward()  # float64, from an integer input
    accuracy = F.accuracy(Variable(np.array([[0.2, 0.8], [0.9, 0.1]])), np.array([1, 1]))
    assert accuracy.item() == 0.5
    with pytest.raises(RuntimeError, match=r"has no graph: .*not differentiable \(F.accuracy\)"):
        accuracy.backward()


# ============================================================================ grad: only the paths
def test_grad_with_respect_to_an_intermediate_runs_nothing_behind_it(xp):
    calls = []
    x = var(xp, [1.0, 2.0])
    a = Scale("a", 2.0, calls)(x)
    h = Scale("h", 3.0, calls)(a)
    y = Scale("y", 5.0, calls)(h)
    gh, = gradcore.grad(y, h)
    np.testing.assert_array_equal(gh.numpy(), [5.0, 5.0])
    assert calls == ["y"]
    calls.clear()
    gh, ga = gradcore.grad(y, [h, a])  # a lies behind h: the walk goes on to a, not past it
    np.testing.assert_array_equal(ga.numpy(), [15.0, 15.0])
    assert calls == ["y", "h"]
    calls.clear()
    gy, = gradcore.grad(y, y)
    np.testing.assert_array_equal(gy.numpy(), [1.0, 1.0])
    assert calls == []


def test_grad_with_respect_to_an_intermediate_ignores_a_write_behind_it(xp):
    x = var(xp, [1.0, 2.0])
    h = x * x
    y = F.sum(h * 3.0)
    x.data = xp.asarray([2.0, 4.0])  # only x * x, behind h, read x
    gh, = gradcore.grad(y, h)
    np.testing.assert_array_equal(gh.numpy(), [3.0, 3.0])
    with pytest.raises(RuntimeError, match="mul: its input 0.*was written after mul ran"):
        gradcore.grad(y, x)  # on the path to x it still refuses


def test_grad_ignores_a_written_branch_that_leads_to_no_input(xp):
    x, w = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])
    y = F.sum(x * x) + F.sum(F.exp(w))
    w.data = xp.asarray([0.0, 0.0])  # an optimizer step on w between forward and grad
    gx, = gradcore.grad(y, x)
    np.testing.assert_array_equal(gx.numpy(), [2.0, 4.0])
    with pytest.raises(RuntimeError, match="exp: its input 0.*was written after exp ran"):
        y.backward()  # backward wants every leaf's gradient: it refuses, as before


def test_grad_calls_no_hook_off_the_paths_to_its_inputs(xp):
    calls = []
    x, w = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])
    w.register_hook(lambda g: calls.append("w"))
    side = w * w
    side.register_hook(lambda g: calls.append("w * w"))
    on_path = x * x
    on_path.register_hook(lambda g: calls.append(("x * x", g.numpy().tolist())) or g * 10.0)
    gx, = gradcore.grad(F.sum(on_path) + F.sum(side), x)
    np.testing.assert_array_equal(gx.numpy(), [20.0, 40.0])  # the on-path hook's gradient
    assert calls == [("x * x", [1.0, 1.0])]


def test_grad_calls_the_hooks_of_every_output_of_an_op_that_computed_a_wanted_variable(xp):
    # as PyTorch: a hook on b, beside the wanted a = split(...)[0], runs; a hook on what split
    # read, off the paths to the wanted Variables, does not
    for deep in (False, True):
        calls = []
        x, z = var(xp, [0.0, 1.0, 2.0, 3.0]), var(xp, [1.0, 1.0])
        source = x * 1.0 if deep else x
        if deep:
            source.register_hook(lambda g: calls.append("source"))
        a, b = F.split(source, 2)
        b.register_hook(lambda g: calls.append(("b", g.numpy().tolist())) or g * 10.0)
        y = F.sum(a * 2.0) + F.sum(b * 3.0) + F.sum(z * 5.0)
        # deep: z, a leaf, is wanted too, so a is not where the walk stops (the lowest computed)
        gradients = gradcore.grad(y, [a, z] if deep else [a])
        assert calls == [("b", [3.0, 3.0])]
        np.testing.assert_array_equal(gradients[0].numpy(), [2.0, 2.0])
        if deep:
            np.testing.assert_array_equal(gradients[1].numpy(), [5.0, 5.0])


def test_func_transforms_call_no_hook_of_the_callers_variable(xp):
    import gradcore.func as gf
    calls = []
    x = var(xp, [1.0, 2.0])
    x.register_hook(lambda g: calls.append("x"))
    g = gf.grad(lambda v: F.sum(v * v))(x)
    jacobian = gf.jacobian(lambda v: v * v, x)
    np.testing.assert_array_equal(g.numpy(), [2.0, 4.0])
    np.testing.assert_array_equal(jacobian.numpy(), [[2.0, 0.0], [0.0, 4.0]])
    assert calls == []
    F.sum(g).backward()  # the caller's own backward through the result still reaches x
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])
    assert calls == ["x"]


def test_grad_in_anomaly_mode_checks_only_the_paths_to_its_inputs(xp):
    x, w = var(xp, [1.0, 2.0]), var(xp, [0.0, 4.0])
    with gradcore.detect_anomaly():
        y = F.sum(x * x) + F.sum(F.sqrt(w))  # sqrt's gradient is infinite at w = 0
        gx, = gradcore.grad(y, x)
        np.testing.assert_array_equal(gx.numpy(), [2.0, 4.0])
        with pytest.raises(RuntimeError, match="anomaly: sqrt.backward returned a gradient "
                                               "holding NaN or infinity"), \
                np.errstate(divide="ignore"):
            gradcore.grad(y, [x, w])


def test_grad_skips_only_what_leads_to_no_input_around_a_written_leaf(xp):
    # both exps read w alone, written since: off the paths to x, skipped. The mul of x by an
    # exp is on one: it runs, reading the exp's result, which no write changed
    x, w = var(xp, [1.0, 2.0]), var(xp, [3.0, 4.0])
    a = F.exp(w)
    b = x * F.exp(w)
    y = F.sum(a) + F.sum(b) + F.sum(x * x)
    w.data = xp.asarray([0.0, 0.0])
    gx, = gradcore.grad(y, x)
    np.testing.assert_allclose(gx.numpy(), np.exp([3.0, 4.0]) + [2.0, 4.0], rtol=1e-15)
    z = F.sum(x * w)
    w.data = xp.asarray([1.0, 1.0])
    with pytest.raises(RuntimeError, match="mul: its input 1.*was written after mul ran"):
        gradcore.grad(z, x)  # mul(x, w) is on the path and read w: refused


class _RawSquare(Function):
    """x ** 2 with DeZero's first backward, on raw arrays: not differentiable again."""

    def forward(self, x):
        return x ** 2

    def backward(self, gy):
        return 2 * self.inputs[0].data * gy.data


def test_grad_goes_on_past_an_op_off_the_paths_whose_backward_raises():
    # z = sum(2x) + sum(3w^2): dz/dw = 6w, as torch gives with once_differentiable. The raw
    # backward's node lies on the path to x only: its error is raised for x, not for w
    x, w = Variable(np.array([1.0, 2.0])), Variable(np.array([3.0, 4.0]))
    y = F.sum(_RawSquare()(x)) + F.sum(w ** 3)
    gx, gw = gradcore.grad(y, [x, w], create_graph=True)
    z = F.sum(gx) + F.sum(gw)
    gw2, = gradcore.grad(z, [w])
    np.testing.assert_array_equal(gw2.data, [18.0, 24.0])
    with pytest.raises(RuntimeError, match="_RawSquare.backward is not differentiable"):
        gradcore.grad(z, [x])


# ================================================ users' own Functions
def test_a_raw_array_a_backward_keeps_never_becomes_a_grad():
    # README: after backward each leaf's .grad owns its array. A backward returning an array
    # the Function keeps (DeZero's softmax-cross-entropy style) made x.grad that very array
    class SumSquaresHalf(Function):
        def forward(self, x):
            self.gx = x.copy()  # d/dx, kept for backward
            return (x * x).sum() / 2

        def backward(self, gy):
            return self.gx if float(gy.data) == 1.0 else gy * self.gx

    x = Variable(np.array([1.0, 2.0]))
    y = SumSquaresHalf.apply(x)
    y.backward()
    assert not np.shares_memory(x.grad.data, y.creator.gx)
    x.grad.data *= 0.5  # changes x.grad alone
    np.testing.assert_array_equal(y.creator.gx, [1.0, 2.0])
    x.cleargrad()
    y.backward()  # the graph is never freed: the same gradient again
    np.testing.assert_array_equal(x.grad.data, [1.0, 2.0])
    g, = gradcore.grad(y, x)  # gradcore.grad's results own their arrays too
    assert not np.shares_memory(g.data, y.creator.gx)


@pytest.mark.parametrize("how", ["backward", "grad"])
def test_no_hook_runs_in_a_backward_refused_for_a_write(how, monkeypatch):
    # README: every op is checked before any hook runs, so a refused backward changes nothing.
    # A hook on a Variable the walk passes through ran before an op behind it was refused
    from gradcore import engine, optim
    # no post-accumulate hooks anywhere (another test's live leaf's would make every backward
    # check every op first)
    monkeypatch.setattr(engine, "hooked_leaves", weakref.WeakSet())
    W = gradcore.Parameter(np.array([1.0, 2.0]))
    x = Variable(np.array([3.0, 4.0]))
    u = W * x  # mul saves W
    a = u * 2.0
    seen = []
    a.register_hook(lambda g: seen.append(g.data.copy()))
    loss = F.sum(a * a)
    W.grad = Variable(np.ones(2))
    optim.SGD([W], lr=0.1).step()  # W written after forward
    with pytest.raises(RuntimeError, match=r"mul: its input 0, .* was written after mul ran"):
        loss.backward() if how == "backward" else gradcore.grad(loss, [W])
    assert seen == [] and W.grad.data.tolist() == [1.0, 1.0] and x.grad is None


def test_hooks_still_run_where_no_write_stops_the_walk():
    # the check before the first hook refuses only what the walk would refuse: gradcore.grad
    # skips a written op off the paths to its inputs, and the hook on the path runs
    x, w = Variable(np.array([1.0, 2.0])), Variable(np.array([3.0, 4.0]))
    h = x * x
    seen = []
    h.register_hook(lambda g: seen.append(g.data.tolist()))
    y = F.sum(h * 3.0) + F.sum(F.exp(w))
    w.data = np.array([0.0, 0.0])  # an update of w, which x's gradient does not read
    gx, = gradcore.grad(y, x)
    np.testing.assert_array_equal(gx.data, [6.0, 12.0])
    assert seen == [[3.0, 3.0]]
    with pytest.raises(RuntimeError, match="exp: its input 0.*was written after exp ran"):
        y.backward()
    assert seen == [[3.0, 3.0]] and x.grad is None


# ==================================================================== gradients left from before
def test_a_grad_of_another_shape_or_dtype_than_the_new_data_is_refused(xp):
    """x.data given another shape (or dtype) after a backward: adding the old .grad would
    broadcast it over the new rows (or keep float64 on float32 data). Refused, x.grad kept."""
    x = var(xp, [[1.0, 1.0, 1.0]])
    F.sum(x * 2.0).backward()
    x.data = xp.asarray([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], dtype="float64")
    with pytest.raises(RuntimeError, match=r"has a \.grad of shape \(1, 3\), left from an "
                                           r"earlier backward.*Call x\.cleargrad\(\)"):
        F.sum(x * 1.0).backward()
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [[2.0, 2.0, 2.0]])
    x.cleargrad()
    F.sum(x * 1.0).backward()
    np.testing.assert_array_equal(xp.numpy(x.grad.data), np.ones((2, 3)))

    y = var(xp, [1.0, 1.0, 1.0])
    F.sum(y * 2.0).backward()
    y.data = xp.asarray([1.0, 1.0, 1.0], dtype="float32")
    with pytest.raises(RuntimeError, match=r"has a \.grad of dtype (array_api_strict\.)?float64"):
        F.sum(y * 1.0).backward()
    y.grad = Variable(xp.astype(y.grad.data, xp.float32))  # converted with the data: it adds
    F.sum(y * 1.0).backward()
    assert y.grad.dtype == y.dtype
    np.testing.assert_array_equal(xp.numpy(y.grad.data), [3.0, 3.0, 3.0])


# ======================================================================== retained gradients owned
@pytest.mark.parametrize("how", ["retain_grad=True", "retain_grad()"])
def test_retained_gradients_own_their_arrays(xp, how):
    """add and reshape hand a gradient on as it is, or as a view of it: each retained .grad is
    still its own array, so zeroing one changes no other."""
    x = var(xp, [[1.0, 1.0], [1.0, 1.0]])
    z = x * 2.0
    s = z + 0.0
    y = F.reshape(s, (4,))
    w = y * 3.0
    if how == "retain_grad()":
        for v in (z, s, y, w):
            v.retain_grad()
    w.backward(retain_grad=how == "retain_grad=True")

    y.grad.data[...] = 0.0  # s's gradient is reshape's backward of y's: a view of it
    np.testing.assert_array_equal(xp.numpy(s.grad.data), np.full((2, 2), 3.0))
    s.grad.data[...] = -1.0  # z's gradient is s's, handed on by add
    np.testing.assert_array_equal(xp.numpy(z.grad.data), np.full((2, 2), 3.0))
    np.testing.assert_array_equal(xp.numpy(y.grad.data), np.zeros(4))
    np.testing.assert_array_equal(xp.numpy(x.grad.data), np.full((2, 2), 6.0))
    np.testing.assert_array_equal(xp.numpy(w.grad.data), np.ones(4))


def test_retain_grad_and_backward_retain_grad_keep_a_gradient_once(xp):
    """h.retain_grad() with backward(retain_grad=True): h's gradient was added twice (h.grad
    [4, 4], y.grad [2, 2])."""
    x = var(xp, [1.0, 2.0])
    h = x * 3.0
    y = h * 2.0
    h.retain_grad()
    y.retain_grad()
    F.sum(y).backward(retain_grad=True)
    np.testing.assert_array_equal(xp.numpy(h.grad.data), [2.0, 2.0])
    np.testing.assert_array_equal(xp.numpy(y.grad.data), [1.0, 1.0])
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [6.0, 6.0])


# ==================================================================== messages of gradcore.grad
def test_a_wrong_grad_outputs_entry_is_named_as_such(xp):
    x = var(xp, [1.0, 2.0])
    a, b = x * 3.0, x * 4.0
    with pytest.raises(ValueError, match=r"^grad: grad_outputs\[1\], the seed for output 1, has "
                                         r"shape \(3,\) but outputs\[1\] has shape \(2,\); pass "
                                         r"grad_outputs\[1\] shaped like outputs\[1\]"):
        gradcore.grad([a, b], x, grad_outputs=[xp.asarray([1.0, 1.0]),
                                               xp.asarray([1.0, 1.0, 1.0])])
    with pytest.raises(ValueError, match=r"^backward: the seed gradient has shape \(3,\)"):
        a.backward(xp.asarray([1.0, 1.0, 1.0]))


def test_a_grad_outputs_entry_on_another_device_is_named_as_such():
    x = Variable(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"^grad: grad_outputs\[0\], the seed for output 0, is "
                                         r"on .*device1 but outputs\[0\] is on cpu; move it "
                                         r"there first, e.g. grad_outputs\[0\]\.to\('cpu'\)"):
        gradcore.grad(x * 2.0, x, grad_outputs=STRICT.asarray(np.ones(2), device=DEVICE1))


def test_grad_stores_the_gradient_of_a_variable_that_retains_it_as_pytorch(xp):
    """gradcore.grad leaves the leaves' .grad alone, but a Variable on the way that called
    retain_grad() gets its gradient, as with torch.autograd.grad."""
    x = var(xp, [1.0, 2.0])
    h = x * 2.0
    h.retain_grad()
    gx, = gradcore.grad(F.sum(h * h), x)
    np.testing.assert_array_equal(xp.numpy(gx.data), [8.0, 16.0])  # d/dx of sum(4x^2)
    np.testing.assert_array_equal(xp.numpy(h.grad.data), [4.0, 8.0])  # 2h
    assert x.grad is None


# =============================================================================== a backward's list
class _MulReturningList(Function):
    def forward(self, a, b):
        return a * b

    def backward(self, gy):
        a, b = self.inputs
        return [gy * b, gy * a]  # meant as a tuple


class _DoubleReturningList(Function):
    def forward(self, x):
        return x * 2

    def backward(self, gy):
        return [gy * 2]  # would become an array of shape (1, 3), summed back to (3,)


@pytest.mark.parametrize("anomaly", [False, True])
def test_a_backward_returning_a_list_of_gradients_is_told_to_return_a_tuple(anomaly):
    a, b = Variable(np.array([1.0, 2.0, 3.0])), Variable(np.array([4.0, 5.0, 6.0]))
    mode = gradcore.detect_anomaly() if anomaly else gradcore.enable_grad()
    with mode:
        y = _MulReturningList()(a, b)
        with pytest.raises(RuntimeError, match=r"backward returned a list of 2 Variables or "
                                               r"arrays: return a tuple"):
            y.sum().backward()
        x = Variable(np.array([1.0, 2.0, 3.0]))
        z = _DoubleReturningList()(x)
        with pytest.raises(RuntimeError, match=r"returned a list of 1 .*return a tuple"):
            z.sum().backward()
    assert x.grad is None


class _BadBroadcastBackward(Function):
    op_name = "bad_broadcast"

    def forward(self, x):
        return x * 2

    def backward(self, gy):
        return gy * Variable(np.ones(5))  # the bug: a constant of the wrong shape


def test_an_error_in_a_users_backward_gets_a_note_naming_the_op_and_where_it_was_called():
    x = Variable(np.ones(3))
    with gradcore.detect_anomaly():
        y = _BadBroadcastBackward()(x)  # the line the note names
        with pytest.raises(ValueError, match=r"^mul: operands could not be broadcast") as info:
            y.sum().backward()
    notes = "".join(info.value.__notes__)
    assert notes.startswith("raised in bad_broadcast.backward (_BadBroadcastBackward); "
                            "bad_broadcast was called at:")
    assert "y = _BadBroadcastBackward()(x)  # the line the note names" in notes
    with pytest.raises(ValueError) as info:  # without anomaly mode: how to see the line
        gradcore.grad(_BadBroadcastBackward()(x).sum(), x)
    assert "inside gradcore.detect_anomaly()" in info.value.__notes__[-1]


def test_an_error_in_a_hook_gets_a_note_naming_the_hook_and_its_variable():
    a, b = Variable(np.array([1.0, 2.0]), name="a"), Variable(np.array([3.0, 4.0]))

    def scale_in_place(g):
        g.data *= 10  # the seed's broadcast, read-only: NumPy's error names no hook

    a.register_hook(scale_in_place)
    with pytest.raises(ValueError) as caught:
        F.sum(a + b).backward()
    note = " ".join(getattr(caught.value, "__notes__", ()))
    assert ("raised in the hook test_an_error_in_a_hook_gets_a_note_naming_the_hook_and_its_"
            "variable.<locals>.scale_in_place on the Variable \"a\" of shape (2,)") in note
    assert "must not be written in place" in note


class _Clipper:
    """A hook object whose repr fails (its attribute is set too late): the note must not hide
    the hook's own error behind that one."""

    def __call__(self, g):
        raise ValueError("gradient exploded")

    def __repr__(self):
        return f"_Clipper({self.limit})"


def test_a_hook_error_is_noted_once_and_never_replaced():
    x = Variable(np.array([1.0, 2.0]))
    x.register_hook(_Clipper())
    with pytest.raises(ValueError, match="gradient exploded") as caught:
        F.sum(x * 2.0).backward()
    assert caught.value.__notes__ == [
        "raised in the hook of type _Clipper on the Variable of shape (2,) and dtype float64"]

    stored = KeyError("kept from an earlier run")
    stored.__notes__ = ("a note someone set as a tuple",)

    def raise_stored(g):
        raise stored

    y = Variable(np.array([1.0, 2.0]))
    y.register_hook(raise_stored)
    for _ in range(3):  # the same exception raised three times: one note from the engine
        with pytest.raises(KeyError):
            F.sum(y * 2.0).backward()
    assert stored.__notes__[0] == "a note someone set as a tuple"
    assert len(stored.__notes__) == 2 and "raise_stored on the Variable" in stored.__notes__[1]


def test_an_error_in_a_post_accumulate_hook_gets_the_note_too():
    w = Parameter(np.array([1.0, 2.0]), name="w")

    def step_in_backward(p):
        raise RuntimeError("optimizer state lost")

    w.register_post_accumulate_grad_hook(step_in_backward)
    with pytest.raises(RuntimeError, match="optimizer state lost") as caught:
        F.sum(w * 3.0).backward()
    note, = caught.value.__notes__
    assert note.startswith("raised in the hook test_an_error_in_a_post_accumulate_hook_gets_the_"
                           "note_too.<locals>.step_in_backward on the Variable \"w\"")
    assert "written in place" not in note  # not a read-only array's error: no such hint


@pytest.mark.parametrize("create_graph", [False, True])
def test_a_hook_that_writes_g_op_equals_and_returns_none_is_told_its_result_was_lost(
        create_graph):
    """g *= 10 rebinds (as in DeZero): a hook that returns None after it would change nothing,
    silently. Returning the new g works; another Variable's augmented assignment in a hook does
    not count."""
    x, w = Variable(np.array([1.0, 2.0])), Variable(np.array([3.0, 4.0]))

    def lost(g):
        g *= 10

    handle = x.register_hook(lost)
    with pytest.raises(RuntimeError, match=r"the hook .*lost on .* wrote g op= \.\.\. and "
                                           r"returned None.*Return it"):
        F.sum(x * w).backward(create_graph=create_graph)
    handle.remove()
    x.cleargrad(), w.cleargrad()
    seen = []

    def returned(g):
        g *= 10
        return g

    def tally(g):
        total = Variable(np.zeros(2), requires_grad=False)
        total += g  # rebinds a Variable of its own: not the gradient's concern
        seen.append(total.data)

    x.register_hook(returned)
    x.register_hook(tally)
    F.sum(x * w).backward(create_graph=create_graph)
    assert np.array_equal(x.grad.data, [30.0, 40.0])
    assert np.array_equal(seen[0], [30.0, 40.0])
    assert np.array_equal(w.grad.data, [1.0, 2.0])


@pytest.mark.parametrize("kind", ["gradient hook", "post-accumulate hook"])
def test_a_hook_that_writes_g_op_equals_then_raises_keeps_nothing_alive(kind):
    """The result of `g *= 10` in a hook that then raised stayed noted for the thread
    (variable.hooked.result) until the next such write: with create_graph, the whole graph
    and its leaf, through del and gc.collect()."""
    x = Variable(np.arange(3.0))
    y = F.sin(x)

    def failing(g):
        g *= 10
        raise ValueError("the hook failed")

    def failing_after(p):
        failing(p.grad)

    if kind == "gradient hook":
        y.register_hook(failing)
    else:
        x.register_post_accumulate_grad_hook(failing_after)
    leaf = weakref.ref(x)
    with pytest.raises(ValueError, match="the hook failed"):
        F.sum(y * y).backward(create_graph=True)
    del x, y
    gc.collect()
    assert leaf() is None and getattr(gradcore.variable.hooked, "result", None) is None


def test_a_forked_child_takes_the_lock_another_threads_sum_into_a_leaf_held():
    """A fork while another thread adds a gradient into a leaf (a multiprocessing worker started
    mid-backward): the child's backward does not wait for a thread it lacks."""
    from gradcore import engine

    assert forked_child_takes(engine, ["_accumulating"])


def test_a_hook_writing_g_data_op_equals_is_refused():
    """g.data *= 10 writes into the array handed (the caller's seed here, [10, 10] after) and
    sets it back: nothing said so, and x.grad came out [20, 20] from a hook returning None."""
    x, seed = Variable(np.array([1.0, 2.0])), Variable(np.array([1.0, 1.0]))

    def hook(g):
        g.data *= 10
    y = x * 2.0
    y.register_hook(hook)
    with pytest.raises(RuntimeError, match=r"a hook wrote into the array of the gradient it was "
                                           r"handed \(g\.data \*= \.\.\.\).*return g \* 10"):
        y.backward(seed)
    assert x.grad is None
    p = Parameter(np.array([1.0, 2.0]))  # a post-accumulate hook's .grad is its own to write

    def halve(p):
        p.grad.data *= 0.5
    p.register_post_accumulate_grad_hook(halve)
    F.sum(p * p).backward()
    np.testing.assert_array_equal(p.grad.data, [1.0, 2.0])


def test_a_hook_writing_into_the_gradient_it_was_handed_is_refused():
    """add hands one gradient to both inputs: g.data = ... in x's hook would change y's too."""
    x, y = Variable(np.array([1.0, 2.0])), Variable(np.array([3.0, 4.0]))

    def hook(g):
        g.data = g.data * 10

    x.register_hook(hook)
    with pytest.raises(RuntimeError, match=r"the hook .*hook on .* wrote into the gradient it "
                                           r"was handed.*return g \* 10"):
        F.sum(x + y).backward()
    assert y.grad is None or np.array_equal(y.grad.data, [1.0, 1.0])
