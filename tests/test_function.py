"""Function: recording the graph, authoring helpers, and errors raised before anything changes."""
import collections
import functools

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from conftest import DEVICE1, DEVICE2, STRICT
from gradcore import Function, Variable
from gradcore.function import View


def var(xp, values, dtype="float64", **kwargs):
    return Variable(xp.asarray(values, dtype=dtype), **kwargs)


class SumAndProduct(Function):
    """Two inputs, two outputs: (a + b, a * b)."""

    def forward(self, a, b):
        return a + b, a * b

    def backward(self, gs, gp):
        a, b = self.inputs
        return gs + gp * b, gs + gp * a


# =============================================================================== recording
def test_variable_length_inputs_and_outputs(xp):
    a, b = var(xp, 2.0), var(xp, 3.0)
    s, p = SumAndProduct()(a, b)
    assert (s.item(), p.item()) == (5.0, 6.0)
    assert s.creator is p.creator and isinstance(s.creator, SumAndProduct)
    f = s.creator
    assert f.inputs == (a, b)
    assert [ref() for ref in f.outputs] == [s, p]
    (s + p).backward()  # d/da (a + b + ab) = 1 + b
    assert (a.grad.item(), b.grad.item()) == (4.0, 3.0)


def test_a_forward_returning_a_tuple_of_one_gives_the_variable(xp):
    """DeZero's `return (y,)`: its __call__ gives outputs[0]; a tuple of one Variable made
    `y * 2` a tuple of two and `y.backward()` an AttributeError."""
    class Double(Function):
        def forward(self, x):
            return (x * 2,)

        def backward(self, gy):
            return gy * 2

    x = var(xp, 3.0)
    y = Double()(x)
    assert isinstance(y, Variable) and y.item() == 6.0
    (y * 2).backward()
    assert x.grad.item() == 4.0
    assert isinstance(SumAndProduct()(x, x), tuple)


def test_generations(xp):
    x = var(xp, 1.0)
    a = F.square(x)
    b = F.exp(a)
    c = F.add(a, b)
    assert (x.generation, a.generation, b.generation, c.generation) == (0, 1, 2, 3)
    assert (a.creator.generation, b.creator.generation, c.creator.generation) == (0, 1, 2)
    assert a.creator.sequence < b.creator.sequence < c.creator.sequence


def test_is_leaf_grad_fn_and_next_functions(xp):
    x = var(xp, 2.0)
    t = F.square(x)
    c = var(xp, 5.0, requires_grad=False)
    y = t * c
    assert x.is_leaf and c.is_leaf and not t.is_leaf and not y.is_leaf
    assert x.grad_fn is None and t.grad_fn is t.creator and isinstance(t.grad_fn, F.Square)
    assert y.grad_fn.next_functions == ((t.creator, 0), (None, 0))
    assert t.grad_fn.next_functions == ((None, 0),)
    z = y * 2  # a Python scalar is a constant as well
    assert z.grad_fn.next_functions == ((y.creator, 0), (None, 0))


def test_next_functions_names_the_output_index(xp):
    s, p = SumAndProduct()(var(xp, 2.0), var(xp, 3.0))
    z = F.add(p, s)
    assert z.grad_fn.next_functions == ((p.creator, 1), (s.creator, 0))


def test_nothing_is_recorded_when_no_input_requires_grad(xp):
    x = var(xp, [1.0, 2.0], requires_grad=False)
    y = F.exp(x) * 2
    assert y.creator is None and y.generation == 0 and y.requires_grad is False
    with pytest.raises(RuntimeError, match="no graph"):
        y.backward()


def test_a_constant_input_never_receives_a_gradient(xp):
    x = var(xp, [1.0, 2.0])
    c = var(xp, [3.0, 4.0], requires_grad=False)
    y = x * c
    assert y.creator.needs_input_grad == (True, False)
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 4.0])
    assert c.grad is None


# =============================================================================== authoring helpers
class ScaledProduct(Function):
    """y = k a b the PyTorch way: save_for_backward, saved_tensors, needs_input_grad."""

    def __init__(self, k):
        self.k = k

    def forward(self, a, b):
        y = self.k * a * b
        self.save_for_backward(a, b, y, self.k)
        return y

    def backward(self, gy):
        a, b, y, k = self.saved_tensors
        self.seen = (a, b, y, k, self.needs_input_grad)
        ga = gy * k * b if self.needs_input_grad[0] else None
        gb = gy * k * a if self.needs_input_grad[1] else None
        return ga, gb


def test_custom_function_with_saved_tensors(xp):
    a = var(xp, 3.0)
    b = var(xp, 4.0, requires_grad=False)
    f = ScaledProduct(2.0)
    y = f(a, b)
    assert y.item() == 24.0
    y.backward()
    assert a.grad.item() == 8.0 and b.grad is None
    sa, sb, sy, k, needs = f.seen
    assert sa is a and sb is b  # saved input arrays come back as the input Variables
    assert isinstance(sy, Variable) and sy.item() == 24.0
    assert k == 2.0 and needs == (True, False)


def test_a_saved_output_comes_back_as_the_output_variable(xp):
    a, b = var(xp, 3.0), var(xp, 4.0)
    f = ScaledProduct(2.0)
    y = f(a, b)
    y.backward()
    assert f.seen[2] is y


def test_saved_values_survive_reading_data_first(xp):
    # On NumPy a 0-d result is kept as a NumPy scalar until .data makes it an array; what
    # forward saved must still come back as the input and output Variables after that
    a, b = var(xp, 3.0), var(xp, 4.0)
    f = ScaledProduct(2.0)
    y = f(a, b)
    assert y.data.shape == () and a.data.shape == ()
    y.backward()
    assert f.seen[0] is a and f.seen[2] is y


def test_custom_function_is_differentiable_twice(xp):
    a, b = var(xp, 3.0), var(xp, 4.0)
    y = ScaledProduct(2.0)(a, b) * a  # 2 a^2 b
    ga, = gradcore.grad(y, a, create_graph=True)  # 4 a b
    assert ga.item() == 48.0
    gab, = gradcore.grad(ga, b)  # 4 a
    assert gab.item() == 12.0


@pytest.mark.parametrize("a, b", [(0.0, 5.0), ([2.0, 3.0], [5.0, 6.0])], ids=["zero", "vector"])
def test_saved_inputs_come_back_whatever_their_values(xp2, a, b):
    a, b = var(xp2, a), var(xp2, b)
    f = ScaledProduct(1.0)
    f(a, b).backward()
    assert f.seen[0] is a and f.seen[1] is b
    np.testing.assert_array_equal(a.grad.numpy(), b.numpy())


def test_a_function_without_forward_or_backward_says_so():
    class Empty(Function):
        pass

    with pytest.raises(NotImplementedError, match="Empty must define forward"):
        Empty()(Variable(1.0))

    class NoBackward(Function):
        def forward(self, x):
            return x * 2

    y = NoBackward()(Variable(1.0))
    with pytest.raises(NotImplementedError, match="NoBackward must define backward"):
        y.backward()


def test_backward_returning_the_wrong_number_of_gradients():
    class Bad(Function):
        def forward(self, a, b):
            return a + b

        def backward(self, gy):
            return gy

    x = Variable(1.0)
    with pytest.raises(RuntimeError, match="returned 1 gradient.*for 2 input"):
        Bad()(x, Variable(2.0)).backward()
    assert x.grad is None


def test_backward_returning_a_wrongly_shaped_gradient():
    class Bad(Function):
        def forward(self, x):
            return x * 2

        def backward(self, gy):
            return F.sum(gy)

    x = Variable(np.ones(3))
    with pytest.raises(RuntimeError, match=r"shape \(\) for its input 0, of shape \(3,\)"):
        Bad()(x).backward()
    assert x.grad is None


def test_a_broadcast_gradient_is_summed_back_to_its_input_shape(xp):
    class Spread(Function):
        """y = x0 + x1 for x0 of shape (3,) and x1 of shape (2, 3), backward left unreduced."""

        def forward(self, x0, x1):
            return x0 + x1

        def backward(self, gy):
            return gy, gy  # (2, 3) for both: the engine sums x0's over the broadcast axis

    a = var(xp, [1.0, 2.0, 3.0])
    b = var(xp, [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    y = Spread()(a, b)
    (y * y).backward()  # d/da sum((a + b)^2) = 2 sum_i (a + b_i)
    np.testing.assert_allclose(a.grad.numpy(), [2 * (2 + 3), 2 * (3 + 4), 2 * (4 + 5)])
    np.testing.assert_allclose(b.grad.numpy(), 2 * (b.numpy() + a.numpy()))
    ga, = gradcore.grad(F.sum(y * y), a, create_graph=True)  # the reduction is recorded too
    gaa, = gradcore.grad(F.sum(ga), a)  # 2 for each of the two rows
    np.testing.assert_allclose(gaa.numpy(), [4.0, 4.0, 4.0])


def test_a_gradient_that_does_not_broadcast_to_the_input_is_an_error():
    class Bad(Function):
        def forward(self, x):
            return x * 2

        def backward(self, gy):
            return F.concatenate([gy, gy])  # (6,) for an input of (3,)

    x = Variable(np.ones(3))
    with pytest.raises(RuntimeError, match=r"bad.backward returned a gradient of shape \(6,\) "
                                           r"for its input 0, of shape \(3,\): return one "
                                           r"gradient per input, shaped like that input"):
        Bad()(x).backward()
    assert x.grad is None


# =============================================================================== __call__
def test_each_function_class_runs_its_own_copy_of_call():
    class Twice(Function):
        def forward(self, x):
            return x * 2

        def backward(self, gy):
            return gy * 2

    class Thrice(Twice):
        def forward(self, x):
            return x * 3

    class Own(Function):
        def __call__(self, *inputs):
            return "own"

    class OwnChild(Own):
        pass

    # an author's Function runs its copy inside the checks gradcore's own ops need not pay for
    calls = {F.Mul.__call__, F.Add.__call__, Twice._plain_call, Thrice._plain_call,
             Function._plain_call}
    assert len(calls) == 5
    assert Twice.__call__ is Thrice.__call__ is Function._checked_call
    assert F.Mul.__call__ is not Function._checked_call
    assert Twice._plain_call.__code__ is not Function._plain_call.__code__
    assert Twice._plain_call.__code__.co_code == Function._plain_call.__code__.co_code
    assert Own()(1.0) == "own" and OwnChild()(1.0) == "own"  # an author's __call__ is kept
    x = Variable(np.array(2.0))
    y = Thrice()(Twice()(x))
    y.backward()
    assert (y.item(), x.grad.item()) == (12.0, 4.0)


def test_call_with_the_wrong_number_of_inputs_names_the_op(xp):
    x = var(xp, [1.0, 2.0])
    with pytest.raises(TypeError, match="mul: .*forward.* missing 1 required positional"):
        F.Mul()(x)
    with pytest.raises(TypeError, match="sin: .*forward.* takes 2 positional arguments"):
        F.Sin()(x, x)
    with pytest.raises(TypeError, match="exp: needs at least one Variable or array input, got none"):
        F.Exp()()


def test_numpy_scalars_are_weak_like_python_numbers(xp):
    # as in PyTorch: np.float64(2) beside float32 data keeps it float32, as 2.0 does
    x = var(xp, [1.0, 4.0], dtype="float32")
    cases = [(x * np.float64(2.0), [2.0, 8.0]), (np.float64(2.0) - x, [1.0, -2.0]),
             (x / np.sqrt(4.0), [0.5, 2.0]), (x + np.int64(1), [2.0, 5.0]),
             (x ** np.float64(2.0), [1.0, 16.0]), (np.float32(2.0) ** x, [2.0, 16.0])]
    for y, expected in cases:
        assert y.dtype == x.dtype
        np.testing.assert_array_equal(xp.numpy(y.data), expected)
    F.sum(x * np.float64(3.0)).backward()
    assert x.grad.dtype == x.dtype
    np.testing.assert_array_equal(xp.numpy(x.grad.data), [3.0, 3.0])
    if xp.name != "numpy":  # NumPy's integer data: see the tests below
        i = var(xp, [1, 2], dtype="int32")
        assert (i * np.int64(3)).dtype == i.dtype
        np.testing.assert_array_equal(xp.numpy((i * np.int64(3)).data), [3, 6])
    y = F.exp(np.float64(0.0))  # with no array beside it, a NumPy scalar is the array
    assert y.dtype == np.float64 and y.item() == 1.0


def test_numpy_integer_scalars_beside_integer_data_keep_numpys_dtype_rule():
    # as a Python int, np.int64(1000) does not fit int8 data (NumPy 2: OverflowError); as a
    # NumPy scalar it promotes, as NumPy computes it
    i8 = Variable(np.array([1, 2], np.int8))
    cases = [(i8 + np.int64(1000), np.int64, [1001, 1002]),
             (Variable(np.array([1, 2], np.uint8)) * np.int64(-1), np.int64, [-1, -2]),
             (F.maximum(np.array([1, 2], np.int8), np.int64(1000)), np.int64, [1000, 1000]),
             (F.minimum(i8, np.int64(-1000)), np.int64, [-1000, -1000]),
             (F.where(np.array([True, False]), i8, np.int64(300)), np.int64, [1, 300]),
             (Variable(np.array([1, 2], np.int32)) * np.int64(3), np.int64, [3, 6]),
             (i8 + np.uint64(2**63 + 5), np.float64, [2.0**63 + 6, 2.0**63 + 7])]
    for y, dtype, expected in cases:
        assert y.dtype == dtype
        np.testing.assert_array_equal(y.data, np.array(expected, dtype))


def test_numpy_float_scalars_beside_small_integer_or_bool_data_keep_their_dtype():
    # np.float32(1.5) * int8 data is float32 in NumPy (and PyTorch), not float64 as 1.5 gives;
    # np.float16 gives float16 beside int8, uint8 and bool, float32 beside int16 (NumPy's table)
    for dtype, of_float16 in ((np.int8, np.float16), (np.int16, np.float32),
                              (np.uint8, np.float16), (np.bool_, np.float16)):
        x = Variable(np.array([1, 0], dtype))
        for s, result in ((np.float32(1.5), np.float32), (np.float16(1.5), of_float16)):
            for y, expected in ((x * s, [1.5, 0.0]), (x + s, [2.5, 1.5]),
                                (F.maximum(x, s), [1.5, 1.5]),
                                (F.where(np.array([True, False]), x, s), [1.0, 1.5])):
                assert y.dtype == result
                np.testing.assert_array_equal(y.data, np.array(expected, result))


# =============================================================================== errors
def _assert_untouched(*xs):
    for x in xs:
        assert x.grad is None and x.creator is None and x.generation == 0


def test_inputs_on_two_devices_are_a_value_error():
    a = Variable(STRICT.asarray(np.ones(3), device=DEVICE1))
    b = Variable(STRICT.asarray(np.ones(3), device=DEVICE2))
    for op in (F.add, F.mul, F.matmul):
        with pytest.raises(ValueError) as info:
            op(a, b)
        message = str(info.value)
        assert message.startswith(op.__name__ + ":")
        assert "array_api_strict:device1" in message and "array_api_strict:device2" in message
    _assert_untouched(a, b)


def test_mixing_array_libraries_is_a_type_error():
    a = Variable(STRICT.asarray(np.ones(3), device=DEVICE1))
    b = Variable(np.ones(3))
    with pytest.raises(TypeError, match=r"add: inputs are on array_api_strict:device1 and cpu"):
        a + b
    with pytest.raises(TypeError, match=r"mul: inputs are on cpu and array_api_strict:device1"):
        b * a
    _assert_untouched(a, b)


def test_mixing_array_libraries_in_a_non_leaf():
    x = Variable(np.ones(3))
    t = x * 2
    a = Variable(STRICT.asarray(np.ones(3), device=DEVICE1))
    with pytest.raises(TypeError, match="sub: inputs are on"):
        t - a
    t.backward()  # the failed op left nothing behind: the graph is still x -> t
    np.testing.assert_array_equal(x.grad.data, [2.0, 2.0, 2.0])


def test_shape_mismatch_in_add_names_the_op_and_both_shapes(xp):
    a = var(xp, np.ones(3))
    b = var(xp, np.ones(4))
    with pytest.raises(ValueError) as info:
        a + b
    message = str(info.value)  # the array library's error, saying the op and shapes
    assert message.startswith("add:") and "(3,)" in message and "(4,)" in message
    _assert_untouched(a, b)


def test_shape_mismatch_in_matmul_names_the_op_and_both_shapes(xp):
    a = var(xp, np.ones((2, 3)))
    t = a * 1.0
    b = var(xp, np.ones((4, 3)))
    with pytest.raises(ValueError) as info:
        t @ b
    message = str(info.value)
    assert message.startswith("matmul:") and "(2, 3)" in message and "(4, 3)" in message
    _assert_untouched(a, b)
    t.backward()
    np.testing.assert_array_equal(a.grad.numpy(), np.ones((2, 3)))


def test_unsupported_input_to_an_op():
    x = Variable(np.ones(2))
    with pytest.raises(TypeError, match="add: unsupported input of type builtins.str"):
        F.add("1", x)
    with pytest.raises(TypeError, match="needs at least one Variable or array input"):
        F.add(1, 2)
    _assert_untouched(x)


def test_unsupported_second_input_is_named():
    x = Variable(np.ones(2))
    with pytest.raises(TypeError, match="add: unsupported input of type builtins.str"):
        F.add(x, "1")


def test_backward_of_a_graph_computed_under_no_grad(xp):
    x = var(xp, [1.0, 2.0])
    with gradcore.no_grad():
        y = F.square(x)
    with pytest.raises(RuntimeError, match="no graph.*no_grad"):
        y.backward()
    with pytest.raises(RuntimeError, match="no graph"):
        gradcore.grad(y, x)
    assert x.grad is None


@pytest.mark.gpu
def test_mixing_cpu_and_cuda_is_a_type_error():
    a = Variable(np.ones(3))
    b = Variable(np.ones(3)).to("cuda:0")
    with pytest.raises(TypeError, match="add: inputs are on cpu and cuda:0"):
        a + b
    assert a.grad is None and a.creator is None


# =============================================================================== one call per instance
def test_a_second_call_of_an_instance_runs_on_a_copy_and_keeps_the_first_graph(xp):
    # DeZero's step 4: numerical_diff(f, x) calls one Square instance twice
    x = Variable(xp.asarray([1.0, 2.0]))
    square = F.Square()
    y = square(x)
    z = square(y)  # x ** 4
    assert z.creator is not square and y.creator is square and square.inputs[0] is x
    with gradcore.no_grad():
        w = square(x)
    np.testing.assert_array_equal(w.numpy(), [1.0, 4.0])
    z.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 32.0])  # 4 x^3
    x.cleargrad()
    y.sum().backward()  # the first call's node is intact
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])


def test_numerical_diff_with_one_function_instance_as_in_dezero_step_4():
    class Square(Function):  # the book's, with a backward on raw arrays
        def forward(self, x):
            return x ** 2

        def backward(self, gy):
            return 2 * self.inputs[0].data * gy

    def numerical_diff(f, x, eps=1e-4):
        y0, y1 = f(Variable(x.data - eps)), f(Variable(x.data + eps))
        return (y1.data - y0.data) / (2 * eps)

    f = Square()
    assert abs(numerical_diff(f, Variable(np.array(2.0))) - 4.0) < 1e-8
    y = f(Variable(np.array(3.0)))
    y.backward()
    assert y.creator.inputs[0].grad.item() == 6.0


def test_the_copy_a_second_call_runs_on_shares_settings_not_what_a_call_saved():
    # ScaleBy's w (an __init__ argument) goes to the copy; what forward saved, the inputs and
    # the outputs stay the first call's
    x1, x2 = Variable(np.array([1.0, 2.0])), Variable(np.array([5.0]))
    scale = ScaleBy(Variable(np.array(3.0)))
    y1 = scale(x1)
    y2 = scale(x2)
    assert y2.creator.w is scale.w and y2.creator.inputs[0] is x2
    y1.sum().backward()
    y2.sum().backward()
    np.testing.assert_array_equal(x1.grad.numpy(), [3.0, 3.0])
    np.testing.assert_array_equal(x2.grad.numpy(), [3.0])


def test_an_authors_own_call_called_again_while_its_graph_lives_is_refused():
    # on the instance, its __call__ would overwrite what the first call's backward reads; on a
    # copy, what it sets (self.factor, a counter) would never reach the instance the author holds
    class Scaled(Function):
        def __call__(self, x, factor):
            self.factor = factor  # read by backward: must stay the first call's
            return super().__call__(x)

        def forward(self, x):
            return x * self.factor

        def backward(self, gy):
            return gy * self.factor

    x = Variable(np.array([1.0, 2.0]))
    f = Scaled()
    y1 = f(x, 2.0)
    with pytest.raises(RuntimeError, match=r"scaled: this Scaled instance was called already.*"
                                           r"your __call__ would run on a copy of it.*"
                                           r"Scaled\(\)\(\.\.\.\)"):
        f(x, 10.0)
    assert f.factor == 2.0
    y1.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])


def test_an_instance_called_without_recording_may_be_called_again(xp):
    x = Variable(xp.asarray([1.0, 2.0]))
    square = F.Square()
    with gradcore.no_grad():
        square(x)
    y = square(x)  # nothing was recorded by the first call
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])


class Cached(Function):
    """x ** 2, keeping x in a dict made by __init__ that every call fills in place."""

    def __init__(self, kind=dict):
        self.cache = kind()

    def forward(self, x):
        self.cache["x"] = x
        return x ** 2

    def backward(self, gy):
        return 2 * self.cache["x"] * gy


@pytest.mark.parametrize("kind", [dict, collections.OrderedDict,
                                  functools.partial(collections.defaultdict, list)],
                         ids=["dict", "OrderedDict", "defaultdict"])
def test_a_second_call_runs_on_a_copy_whose_containers_are_its_own(kind):
    # a copy sharing self.cache would overwrite the x the first call's backward reads: a.grad
    # [10, 14] (2b) where 2a = [2, 4] is right
    a, b = Variable(np.array([1.0, 2.0])), Variable(np.array([5.0, 7.0]))
    f = Cached(kind)
    ya = f(a)
    yb = f(b)
    ya.sum().backward()
    yb.sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [2.0, 4.0])
    np.testing.assert_array_equal(b.grad.numpy(), [10.0, 14.0])


def test_a_second_call_copies_an_array_it_keeps_on_every_backend(xp):
    # DeZero's style: forward keeps its input's array on the instance (array-api-strict's arrays
    # have no .copy method)
    class Square(Function):
        def forward(self, x):
            self.x_saved = x
            return x * x

        def backward(self, gy):
            return gy * 2 * self.x_saved

    f = Square()
    a, b = Variable(xp.asarray([2.0])), Variable(xp.asarray([5.0]))
    ya, yb = f(a), f(b)
    ya.backward()
    yb.backward()
    assert a.grad.numpy().tolist() == [4.0] and b.grad.numpy().tolist() == [10.0]


def test_a_second_call_copies_the_arrays_inside_the_containers_it_keeps():
    # forward writes into arrays held in a dict and a list made by __init__: sharing them, the
    # second call would change what the first call's backward reads (x1.grad 5 where 2 is right)
    class Scale(Function):
        def __init__(self):
            self.cache = collections.OrderedDict(s=np.zeros(1))
            self.saved = [np.zeros(1), (np.zeros(1),)]

        def forward(self, x):
            self.cache["s"][...] = x[0]
            self.saved[1][0][...] = x[0]
            return x * x[0]

        def backward(self, gy):
            return gy * self.cache["s"] + gy * self.saved[1][0]

    f = Scale()
    x1, x2 = Variable(np.array([2.0])), Variable(np.array([5.0]))
    y1 = f(x1)
    y2 = f(x2)
    y1.backward()
    y2.backward()
    assert x1.grad.numpy().tolist() == [4.0] and x2.grad.numpy().tolist() == [10.0]


@pytest.mark.parametrize("setting, shared", [
    ((2, "mean", None, 0.5, slice(1, None)), True), (np.float32, True), (np.dtype("float32"), True),
    (np.ones(2), False), ([1, 2], False), ((1, [2]), False), (object(), True)],
    ids=["tuple", "class", "dtype", "array", "list", "tuple_of_a_list", "object"])
def test_a_copy_for_a_second_call_copies_containers_and_arrays(setting, shared):
    # DeZero's programs call one instance twice: numerical_diff(f, x), a Function holding its
    # weights (self.W) in a loop, forward setting self.mask; the copy gets what a call could
    # change in place as its own, and shares the rest (an object of the author's own too)
    class Holding(Function):
        def __init__(self, setting):
            self.setting = setting

        def forward(self, x):
            return x * 3.0

        def backward(self, gy):
            return gy * 3.0

    x = Variable(np.array([1.0, 2.0]))
    f = Holding(setting)
    y1 = f(x)
    got = f(x).creator.setting
    assert (got is setting) == shared
    assert repr(got) == repr(setting)  # the same values
    del y1  # no backward can reach the first call now: the next one runs on f itself
    y = f(x)
    assert y.creator is f and f.inputs == (x,)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


def test_dezero_s_numerical_diff_of_a_function_setting_a_mask_in_forward():
    class ReLU(Function):
        def forward(self, x):
            self.mask = x > 0
            return x * self.mask

        def backward(self, gy):
            return gy * self.mask

    f, x = ReLU(), Variable(np.array([1.0, -1.0, 2.0]))
    y = f(x)
    y0, y1 = f(Variable(x.data - 1e-4)), f(Variable(x.data + 1e-4))  # y still alive
    np.testing.assert_allclose((y1.data - y0.data) / 2e-4, [1.0, 0.0, 1.0])
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 0.0, 1.0])


def test_once_no_output_of_the_first_call_lives_the_instance_runs_the_next_one_itself():
    # what the call sets reaches the instance its author holds: a counter counts every call
    class Counted(Function):
        def __init__(self):
            self.calls = 0

        def __call__(self, x):
            self.calls += 1
            return super().__call__(x)

        def forward(self, x):
            return x * 2.0

        def backward(self, gy):
            return gy * 2.0

    a, b = Variable(np.array([1.0])), Variable(np.array([4.0]))
    g = Counted()
    g(a)
    yb = g(b)
    assert g.calls == 2 and yb.creator is g and g.inputs == (b,)
    yb.backward()
    np.testing.assert_array_equal(b.grad.numpy(), [2.0])
    assert a.grad is None
    f = Cached()  # the same for a Function holding a container
    f(a)
    yb = f(b)
    yb.backward()
    np.testing.assert_array_equal(b.grad.numpy(), [2.0 + 8.0])


def test_an_instance_reused_after_anomaly_mode_checks_only_its_last_call():
    # the first call's fingerprints (of a, written into since) go with that call
    a, b = Variable(np.array([1.0])), Variable(np.array([3.0]))
    square = F.Square()
    with gradcore.detect_anomaly():
        square(a)
    a.data[...] = 2.0
    y = square(b)
    y.backward()
    np.testing.assert_array_equal(b.grad.numpy(), [6.0])


def test_apply_makes_one_instance_per_call(xp):
    x = Variable(xp.asarray([3.0]))
    y = F.Square.apply(F.Square.apply(x))
    assert isinstance(y.creator, F.Square) and y.creator is not y.creator.inputs[0].creator
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [108.0])  # d x^4 = 4 x^3


# =============================================================================== copies
def _copied(how, obj):
    import copy
    import pickle

    return copy.deepcopy(obj) if how == "deepcopy" else pickle.loads(pickle.dumps(obj))


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_graph_leads_to_its_own_outputs(xp, how):
    """The copy of a computed Variable brings its graph: backward through it fills the copied
    leaves' .grad with the original's gradients and leaves the original be."""
    W = var(xp, [[0.5, -1.0], [2.0, 0.25]])
    x = var(xp, [[1.0, 2.0]], requires_grad=False)
    a, b = F.split(F.tanh(F.matmul(x, W)), 2, axis=1)  # two outputs
    h = a * b
    h.retain_grad()
    y = F.sum(h * h)
    y2 = _copied(how, y)
    h2 = y2.creator.inputs[0].creator.inputs[0]
    W2 = h2.creator.inputs[0].creator.inputs[0].creator.inputs[0].creator.inputs[1]
    assert W2 is not W and h2.retains_grad
    y2.backward()
    assert W.grad is None and h.grad is None

    y.backward()  # the original's graph is its own still, and gives the same gradients
    np.testing.assert_array_equal(xp.numpy(W2.grad.data), xp.numpy(W.grad.data))
    np.testing.assert_array_equal(xp.numpy(h2.grad.data), xp.numpy(h.grad.data))
    # by hand: u = x W = (4.5, -0.5), h = tanh(u0) tanh(u1), dy/dh = 2h
    t0, t1 = np.tanh(4.5), np.tanh(-0.5)
    np.testing.assert_allclose(xp.numpy(h2.grad.data), [[2 * t0 * t1]], rtol=1e-12)
    g0, g1 = 2 * t0 * t1 * t1 * (1 - t0 ** 2), 2 * t0 * t1 * t0 * (1 - t1 ** 2)
    np.testing.assert_allclose(xp.numpy(W2.grad.data), [[g0, g1], [2 * g0, 2 * g1]], rtol=1e-12)


def test_a_copied_function_whose_other_output_died_gives_it_zeros():
    x = Variable(np.array([1.0, 2.0, 3.0, 4.0]))
    a, b = F.split(x * 1.0, 2)
    del b
    a2 = _copied("deepcopy", a)
    assert a2.creator.outputs[1]() is None
    F.sum(a2 * a2).backward()
    x2 = a2.creator.inputs[0].creator.inputs[0]
    np.testing.assert_array_equal(x2.grad.data, [2.0, 4.0, 0.0, 0.0])


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_module_carrying_a_computed_state_is_copied_with_its_graph(how):
    """An RNN's hidden state holds the graph of the steps so far: the copy's next step
    backpropagates through the copied steps, as the original's does."""
    from gradcore import nn

    rng = np.random.default_rng(0)
    rnn = nn.RNN(3, in_size=2).to(dtype="float64")
    x0, x1 = rng.standard_normal((1, 2)), rng.standard_normal((1, 2))
    rnn(x0)
    copied = _copied(how, rnn)
    F.sum(rnn(x1)).backward()
    F.sum(copied(x1)).backward()
    for p, q in zip(rnn.params(), copied.params()):
        assert q is not p
        np.testing.assert_array_equal(q.grad.data, p.grad.data)


def test_two_copies_of_a_graph_in_one_backward():
    """Two copies of one graph have the same generations and sequence numbers: the walk's heap
    meets equal keys, and either may run first (neither feeds the other)."""
    W = Variable(np.array([0.5, -1.5]))
    y = F.tanh(F.exp(W * 2.0))
    y1, y2 = _copied("deepcopy", y), _copied("deepcopy", y)
    assert y1.creator.sequence == y2.creator.sequence
    W1, W2 = (c.creator.inputs[0].creator.inputs[0].creator.inputs[0] for c in (y1, y2))
    F.sum(y + y1 + y2).backward()
    expected = (1 - np.tanh(np.exp(2 * W.data)) ** 2) * np.exp(2 * W.data) * 2
    np.testing.assert_allclose(W.grad.data, expected, rtol=1e-14)
    np.testing.assert_array_equal(W1.grad.data, W.grad.data)
    np.testing.assert_array_equal(W2.grad.data, W.grad.data)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_graph_keeps_the_order_of_its_writes(how):
    """A write before forward, copied with the graph, stays before it; one after forward stays
    after it; one made to the copy after copying comes after the whole copied graph."""
    a = Variable(np.array([0.3, 1.1]))
    a.data = a.data * 1.0  # before forward: backward may run
    y = F.sin(a)
    a2, y2 = _copied(how, (a, y))
    F.sum(y2).backward()
    np.testing.assert_allclose(a2.grad.data, np.cos([0.3, 1.1]), rtol=1e-15)

    a.data = a.data + 1.0  # after forward, before copying: the copy refuses too
    a2, y2 = _copied(how, (a, y))
    with pytest.raises(RuntimeError, match="was written after sin ran in forward"):
        F.sum(y2).backward()

    b = Variable(np.array([0.3, 1.1]))
    b2, z2 = _copied(how, (b, F.sin(b)))
    b2.data = b2.data + 1.0  # after copying
    with pytest.raises(RuntimeError, match="was written after sin ran in forward"):
        F.sum(z2).backward()


_OTHER_PROCESS = """
import pickle, sys
import gradcore.functions as F
a, y = pickle.load(open(sys.argv[1], "rb"))
a.data = a.data + 1.0  # written after y's forward
try:
    F.sum(y).backward()
    print("ran")
except RuntimeError:
    print("refused")
a, y = pickle.load(open(sys.argv[1], "rb"))
y.register_hook(lambda g: g * g)  # sees y's whole gradient, 2 + 3 = 5, only if run last
F.sum(y * 2.0 + y * 3.0).backward()
print(repr(a.grad.data.tolist()))
"""


def test_a_graph_unpickled_in_another_process_comes_before_what_that_process_does(tmp_path):
    """The saving process's clock ran far ahead of the loading one's: the unpickled graph still
    comes before a write and the ops recorded there, so the write is refused and a hook on the
    unpickled y sees the gradients of both later ops."""
    import pickle
    import subprocess
    import sys

    for _ in range(1000):  # the saving process has run for a while
        F.sin(Variable(np.ones(1)))
    a = Variable(np.array([0.3, 1.1]))
    path = tmp_path / "graph.pkl"
    path.write_bytes(pickle.dumps((a, F.sin(a))))
    done = subprocess.run([sys.executable, "-c", _OTHER_PROCESS, str(path)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    write, grad = done.stdout.split("\n")[:2]
    assert write == "refused"
    np.testing.assert_allclose(eval(grad), 25 * np.cos([0.3, 1.1]), rtol=1e-14)


# ======================================================================= an author's Function
# users' own Functions (each compared with PyTorch)
def _sgd_step(*params):
    """An optimizer step: an in-place write to each parameter, counted in its version."""
    from gradcore.optim import SGD
    for p in params:
        p.grad = Variable(np.ones_like(p.data))
    SGD(list(params), lr=1.0).step()


class Row(Function):
    """x[0]: a view of the input."""

    def forward(self, x):
        return x[0]

    def backward(self, gy):
        x, = self.inputs
        g = np.zeros(x.shape)
        g[0] = gy.data
        return Variable(g)


class Identity(Function):
    def forward(self, x):
        return x  # the input's own array

    def backward(self, gy):
        return gy


class Tail(Function):
    """b[1:]: a view of the second input."""

    def forward(self, a, b):
        return b[1:]

    def backward(self, gy):
        b = self.inputs[1]
        return None, F.concatenate([Variable(np.zeros((1,) + b.shape[1:])), gy])


@pytest.mark.parametrize("make", [lambda W: Row.apply(W), lambda W: Identity.apply(W),
                                  lambda W: Tail.apply(Variable(np.ones(2)), W),
                                  lambda W: W[0], lambda W: W.reshape(4)],
                         ids=["view", "identity", "view-of-input-1", "builtin-getitem",
                              "builtin-reshape"])
def test_an_output_that_is_an_input_or_a_view_of_one_shares_its_version(make):
    # torch: "one of the variables needed for gradient computation has been modified by an
    # inplace operation"; before, the author's Functions silently used W's new values
    W = gradcore.Parameter(np.array([[1.0, 2.0], [3.0, 4.0]]))
    y = make(W)
    a = gradcore.Parameter(np.ones(y.shape))
    z = F.sum(y * a)  # mul saves y for a's gradient
    assert y.version == W.version == 0
    ga, = gradcore.grad(z, [a])
    np.testing.assert_array_equal(ga.data, y.data)
    assert np.shares_memory(y.data, W.data)
    _sgd_step(W)  # W's array written in place: y's memory with it
    assert y.version == W.version == 1
    with pytest.raises(RuntimeError, match=r"mul: its input 0, .* was written after mul ran"):
        gradcore.grad(z, [a])


def test_an_output_of_its_own_memory_keeps_a_version_of_its_own():
    class Twice(Function):
        def forward(self, x):
            return x * 2

        def backward(self, gy):
            return gy * 2

    W = gradcore.Parameter(np.array([1.0, 2.0]))
    y = Twice.apply(W)
    a = gradcore.Parameter(np.ones(2))
    z = F.sum(y * a)
    _sgd_step(W)
    assert y.version == 0
    ga, = gradcore.grad(z, [a])  # y's values are as they were: nothing to refuse
    np.testing.assert_array_equal(ga.data, [2.0, 4.0])


class RoundToInt(Function):
    """Straight-through rounding to int64."""

    def forward(self, x):
        return self.xp.round(x).astype(np.int64)

    def backward(self, gy):
        return gy


def test_an_integer_output_is_not_differentiable():
    # README: integer and bool Variables never require grad; torch marks such outputs
    # non-differentiable. Before, the rounded y was recorded and x got trunc(w) = [0, 0, 1]
    x = Variable(np.array([0.2, 1.7, 2.6]))
    w = Variable(np.array([0.4, 0.9, 1.5]))
    y = RoundToInt.apply(x)
    assert y.dtype == np.int64 and not y.requires_grad and y.creator is None
    np.testing.assert_array_equal(y.data, [0, 2, 3])
    F.sum(y * w).backward()
    assert x.grad is None
    np.testing.assert_array_equal(w.grad.data, [0.0, 2.0, 3.0])


def test_backward_gets_zeros_for_an_integer_output():
    class MaxAndIndex(Function):
        """(max(x), argmax(x)); torch.max(x, dim) as one op."""

        def forward(self, x):
            i = self.xp.argmax(x)
            return x[i], self.xp.asarray(i)

        def backward(self, gv, gi):
            self.seen = gi
            x, = self.inputs
            mask = np.zeros(x.shape)
            mask[int(self.outputs[1]().data)] = 1.0
            return gv * Variable(mask)

    x = Variable(np.array([0.5, 3.0, 2.0]))
    f = MaxAndIndex()
    v, i = f(x)
    assert v.requires_grad and v.creator is f and not i.requires_grad and i.creator is None
    (v * 2.0).backward()
    np.testing.assert_array_equal(x.grad.data, [0.0, 2.0, 0.0])  # torch: [0, 2, 0]
    assert f.seen.dtype == i.dtype and f.seen.data == 0


class ExpPair(Function):
    """(exp(x), 2 exp(x)), saving output 0."""

    def forward(self, x):
        e = self.xp.exp(x)
        self.save_for_backward(e)
        return e, 2 * e

    def backward(self, ge, ge2):
        e, = self.saved_tensors
        self.seen = e
        return (ge + 2 * ge2) * e


def test_a_saved_output_the_caller_dropped_stays_differentiable():
    # torch keeps a saved output differentiable whether or not the caller kept it: second
    # derivative [8.24, 16.31] here, where gradcore gave [6.59, 10.87] (the path through e lost)
    x = Variable(np.array([0.5, 1.0]))
    f = ExpPair()
    e2 = f(x)[1]  # output 0 dies at once
    z = F.sum(e2 * x)  # sum(2 x e^x)
    g1, = gradcore.grad(z, x, create_graph=True)
    e = np.exp(x.data)
    np.testing.assert_allclose(g1.data, 2 * e * (1 + x.data), rtol=1e-15)
    g2, = gradcore.grad(F.sum(g1), x)
    np.testing.assert_allclose(g2.data, 2 * e * (2 + x.data), rtol=1e-15)
    np.testing.assert_allclose(g2.data, [8.24360635, 16.30969097], rtol=1e-8)  # torch's
    revived = f.seen  # made again as f's output 0, as it was recorded
    assert revived.creator is f and revived.generation == e2.generation
    assert revived._sequence == f.sequence and f.outputs[0]() is revived
    assert f.saved_tensors[0] is revived  # while it lives, the same Variable


class MulSaved(Function):
    """a * b, saving both arrays (the README's save_for_backward pattern)."""

    def forward(self, a, b):
        self.save_for_backward(a, b)
        return a * b

    def backward(self, gy):
        a, b = self.saved_tensors
        return gy * b, gy * a


def test_saved_arrays_of_two_inputs_over_one_array_come_back_as_their_own_variables(xp):
    # y = sum(stop(x) x x): g = 2 stop(x) x = [18, 32], d(sum g)/dx = 2 stop(x) = [6, 8] (torch);
    # before, both saved arrays came back as x, and the second derivative was 3x = [9, 12]
    x = var(xp, [3.0, 4.0])
    y = F.sum(MulSaved()(x.detach(), x) * x)
    g, = gradcore.grad(y, x, create_graph=True)
    np.testing.assert_array_equal(xp.numpy(g.data), [18.0, 32.0])
    h, = gradcore.grad(F.sum(g), x)
    np.testing.assert_array_equal(xp.numpy(h.data), [6.0, 8.0])

    array = xp.asarray([1.0, 2.0])
    x0, x1 = Variable(array), Variable(array)  # two leaves over one array
    f = MulSaved()
    f(x0, x1)
    assert f.saved_tensors[0] is x0 and f.saved_tensors[1] is x1
    assert x0.data is array and x1.data is array  # each holds its array again after the call


class ScaleBy(Function):
    """x * w for a weight w the Function holds, saved as a Variable."""

    def __init__(self, w):
        self.w = w

    def forward(self, x):
        self.save_for_backward(self.w)
        return x * self.w.data

    def backward(self, gy):
        w, = self.saved_tensors
        return gy * w


def test_a_saved_variable_that_is_no_input_is_version_checked():
    W = gradcore.Parameter(np.array([2.0, 3.0]))
    x = Variable(np.array([1.0, 1.0]))
    ScaleBy(W)(x).backward()
    np.testing.assert_array_equal(x.grad.data, [2.0, 3.0])
    x.cleargrad()
    y = ScaleBy(W)(x)
    _sgd_step(W)  # torch: "modified by an inplace operation"; before, x.grad was [1, 2]
    with pytest.raises(RuntimeError, match=r"scale_by: its saved value 0, .* was written after "
                                           r"scale_by ran in forward: it is at version 1, and "
                                           r"scale_by used version 0"):
        y.backward()
    assert x.grad is None


class AddOneInPlace(Function):
    """x += 1, announced (torch: x.add_(1); ctx.mark_dirty(x); return x) unless `announce` is
    False."""

    def __init__(self, announce=True):
        self.announce = announce

    def forward(self, x):
        x += 1
        if self.announce:
            self.mark_dirty(x)
        return x

    def backward(self, gy):
        return gy


def test_mark_dirty_counts_a_write_forward_makes_into_its_input():
    x = Variable(np.array([1.0, 2.0]), requires_grad=False)  # data: in-place is for such leaves
    w = Variable(np.array([2.0, 2.0]))
    a = x * w  # saves x = [1, 2]
    b = AddOneInPlace.apply(x)
    assert x.version == 1 and b.version == 1  # b is x's array: it shares x's version
    np.testing.assert_array_equal(b.data, [2.0, 3.0])
    with pytest.raises(RuntimeError, match=r"mul: its input 0, .* was written after mul ran"):
        F.sum(a + b).backward()  # torch refuses the same way
    F.sum(AddOneInPlace.apply(x) * w).backward()  # nothing saved x before: the op's own
    np.testing.assert_array_equal(w.grad.data, [3.0, 4.0])  # check passes


class SquareInPlace(Function):
    def forward(self, x):
        x *= x
        self.mark_dirty(x)
        return x

    def backward(self, gy):
        x, = self.inputs
        return 2 * x * gy


def test_mark_dirty_on_a_leaf_that_requires_grad_is_refused():
    """x *= x on a leaf that requires grad gave x.grad 18 for d(x^2)/dx = 6 at 3: backward read
    the new values. Refused, as PyTorch refuses an in-place op on such a leaf; under no_grad,
    or on a leaf that requires none, it runs."""
    x = Variable(np.array([3.0]))
    with pytest.raises(RuntimeError, match=r"square_in_place.forward wrote into the Variable of "
                                           r"shape \(1,\) and dtype float64, a leaf that requires "
                                           r"grad \(mark_dirty\).*Give the Function x.detach\(\)"):
        SquareInPlace.apply(x)
    assert x.grad is None
    with gradcore.no_grad():
        SquareInPlace.apply(x)
    y = SquareInPlace.apply(x.detach())
    np.testing.assert_array_equal(x.data, [6561.0])  # 3 ** 2 ** 3: each wrote into x's array
    assert y.creator is None
    # gradcore.func differentiates a copy of x (an op's output): gave 18 where backward refused
    with pytest.raises(RuntimeError, match=r"square_in_place.forward wrote into .* which copy "
                                           r"computed \(mark_dirty\)"):
        gradcore.func.grad(lambda v: F.sum(SquareInPlace.apply(v)))(Variable(np.array([3.0])))


class ReLUInPlace(Function):
    def forward(self, x):
        self.xp.maximum(x, 0, out=x)
        self.mark_dirty(x)
        return x

    def backward(self, gy):
        y = self.outputs[0]()
        return gy * F.astype(y.data > 0, y.dtype)


def test_mark_dirty_on_an_ops_output_is_refused_naming_it():
    """An in-place activation on matmul's output: the output's Variable would go on standing for
    matmul's result with the new values, so a later use (y * 2) sends matmul the gradient of
    the wrong values (W.grad [[2, 2], ...] for PyTorch's [[0, 2], ...]). Refused at the call
    (it was at backward, which gradcore.grad(..., [y]) never reached: it gave the gradient of
    the new values), naming mark_dirty and what to write instead; a write that forward did not
    announce is still refused at backward."""
    x = Variable(np.array([[1.0, -2.0, 3.0]]))
    W = Variable(np.array([[1.0, 0.5], [2.0, -1.0], [0.5, 1.0]]))
    y = F.matmul(x, W)
    with pytest.raises(RuntimeError, match=r"re_luin_place.forward wrote into the Variable of "
                                           r"shape \(1, 2\) and dtype float64, which matmul "
                                           r"computed \(mark_dirty\).*return a new array"):
        ReLUInPlace.apply(y)
    with pytest.raises(RuntimeError, match=r"^matmul: its output 0, .* was written after matmul "
                                           r"ran.*in-place Function \(mark_dirty\) given an "
                                           r"op's output.*return a new array instead"):
        F.sum(y * 2.0).backward()  # forward wrote y before mark_dirty refused
    assert W.grad is None and x.grad is None


def test_mark_dirty_outside_forward_or_with_another_array_says_so():
    f = AddOneInPlace()
    with pytest.raises(RuntimeError, match="add_one_in_place: mark_dirty is for forward"):
        f.mark_dirty(np.ones(2))

    class MarksCopy(Function):
        def forward(self, x):
            y = x + 1
            self.mark_dirty(y)
            return y

    with pytest.raises(ValueError, match="marks_copy: mark_dirty got an array that is none "
                                         "of the inputs' arrays"):
        MarksCopy.apply(Variable(np.ones(2)))


@pytest.mark.parametrize("op", [lambda v, x: v + x, lambda v, x: x + v, lambda v, x: v * 2.0,
                                lambda v, x: F.exp(v), lambda v, x: F.add(v, np.ones(2))],
                         ids=["first", "second", "scalar", "unary", "array"])
def test_an_op_on_a_variable_with_no_data_says_so_whichever_input(op):
    v = Variable(None)  # DeZero's placeholder
    with pytest.raises(ValueError, match=r"an input Variable has no data \(data is None\)"):
        op(v, Variable(np.ones(2)))


class Flatten(Function):
    def forward(self, x):
        self.save_for_backward(x.shape, "note", None, 2.5, x)
        return x.reshape(-1)

    def backward(self, gy):
        shape, note, nothing, number, x = self.saved_tensors
        self.seen = (shape, note, nothing, number, x)
        return F.reshape(gy, shape)


def test_saved_values_that_are_not_arrays_come_back_as_they_were_saved():
    # torch refuses them in save_for_backward; gradcore always handed None and numbers back as
    # they were, and now anything that is not an array (before: a shape came back as an int
    # Variable, and reshape failed far from the cause)
    x = Variable(np.ones((2, 3)))
    f = Flatten()
    (f(x) * np.arange(6.0)).backward()
    np.testing.assert_array_equal(x.grad.data, np.arange(6.0).reshape(2, 3))
    assert f.seen[:4] == ((2, 3), "note", None, 2.5) and f.seen[4] is x


class OutOfRange(ValueError):
    def __init__(self, name, value):
        super().__init__(f"{name} out of range: {value}")
        self.name, self.value = name, value


def test_an_error_from_forward_keeps_its_type_and_says_the_op():
    class Checked(Function):
        def forward(self, x):
            raise OutOfRange("x", 3)

    with pytest.raises(OutOfRange) as info:  # before: a plain ValueError, without .value
        Checked.apply(Variable(np.ones(2)))
    assert info.value.value == 3
    assert str(info.value) == "checked: x out of range: 3 (inputs: (2,))"

    class Described(ValueError):  # a message of its own making: the op's goes in a note
        def __str__(self):
            return f"described {self.args}"

    class Raising(Function):
        def forward(self, x):
            raise Described(1, 2)

    with pytest.raises(Described) as info:
        Raising.apply(Variable(np.ones(2)))
    assert info.value.args == (1, 2)
    assert info.value.__notes__ == ["raising: described (1, 2) (inputs: (2,))"]
    a, b = Variable(np.ones(3)), Variable(np.ones(4))
    with pytest.raises(ValueError, match=r"^add: operands could not be broadcast.*"
                                         r"\(inputs: \(3,\), \(4,\)\)$"):
        a + b  # NumPy's own error, a plain message: the op and shapes go into it


@pytest.mark.parametrize("error", [FloatingPointError("divide by zero encountered in divide"),
                                   ZeroDivisionError("division by zero"), KeyError("w"),
                                   RuntimeError("no solution")],
                         ids=["floating_point", "zero_division", "key", "runtime"])
def test_any_error_from_forward_says_the_op_and_the_shapes(error):
    class Ratio(Function):
        def forward(self, x):
            raise error

    with pytest.raises(type(error)) as info:
        Ratio.apply(Variable(np.ones(3)))
    assert info.value is error
    said = str(error) + " ".join(getattr(error, "__notes__", []))
    assert "ratio: " in said and "(inputs: (3,))" in said


def test_a_device_error_from_forward_goes_on_as_it_was_said():
    # it says what the machine lacks and what to do; "to_device: ... (inputs: ())" added nothing
    import backends

    class Moving(Function):
        def forward(self, x):
            raise backends.DeviceUnavailableError("cuda:3 does not exist; use cuda:0")

    with pytest.raises(backends.DeviceUnavailableError) as info:
        Moving.apply(Variable(np.array(1.0)))
    assert str(info.value) == "cuda:3 does not exist; use cuda:0"
    assert getattr(info.value, "__notes__", None) is None


def test_x_to_cuda_without_cupy_says_only_what_is_missing(monkeypatch):
    import backends
    import sys
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` now raises ImportError
    monkeypatch.delitem(backends._by_name, "cupy", raising=False)
    monkeypatch.delitem(backends._by_device_type, "cuda", raising=False)
    with pytest.raises(backends.DeviceUnavailableError) as info:
        Variable(np.array(2.0)).to("cuda")
    assert str(info.value) == ("a CUDA device was requested but CuPy is not installed: pip "
                               "install 'gradcore[gpu]' (or the cupy-cudaXXx wheel matching your "
                               "CUDA)")


def test_an_error_from_forward_shows_a_0d_input_as_such():
    x = Variable(np.array(2.0))
    with pytest.raises(ValueError, match=r"^sum: axis 2 .*\(inputs: 0-d\)$"):
        F.sum(x, axis=2)
    with pytest.raises(ValueError, match=r"^matmul: .*\(inputs: \(2,\), 0-d\)$"):
        F.matmul(Variable(np.ones(2)), x)


def test_numpys_floating_point_error_from_forward_names_the_op():
    class Ratio(Function):
        def forward(self, x):
            with np.errstate(all="raise"):
                return x / (x - x)

    with pytest.raises(FloatingPointError, match=r"^ratio: divide by zero.*\(inputs: \(3,\)\)$"):
        Ratio.apply(Variable(np.ones(3)))


# ================================================ users' own Functions: 0-d inputs
class LeakyReLU(Function):
    """dezero/functions.py's forward: item assignment into a copy of its input."""

    def forward(self, x):
        y = x.copy()
        y[x <= 0] *= 0.2
        return y

    def backward(self, gy):
        return gy * np.where(self.inputs[0].data > 0, 1.0, 0.2)


@pytest.mark.parametrize("make", [lambda: Variable(np.array(-1.0)),
                                  lambda: Variable(np.array(-0.5)) * 2.0],  # held as a scalar
                         ids=["leaf", "op_result"])
def test_an_authors_forward_gets_a_0d_input_as_a_0d_array_as_in_dezero(make):
    x = make()
    y = LeakyReLU()(x)
    y.backward()
    assert y.item() == pytest.approx(-0.2) and y.data.shape == ()
    leaf = x if x.creator is None else x.creator.inputs[0]
    assert leaf.grad.item() == pytest.approx(0.2 * (1.0 if x.creator is None else 2.0))


def test_an_in_place_forward_writes_a_0d_input_as_any_other():
    class AddOne_(Function):  # the README's recipe
        def forward(self, x):
            x += 1
            self.mark_dirty(x)
            return x

        def backward(self, gy):
            return gy

    for shape in [(1,), ()]:
        b = Variable(np.zeros(shape), requires_grad=False) * 1.0
        before = b.version
        AddOne_()(b)
        np.testing.assert_array_equal(b.data, np.ones(shape))
        assert b.version == before + 1


def test_gradcores_own_ops_still_compute_0d_inputs_as_numpy_scalars():
    y = Variable(np.array(2.0)) * 3.0
    assert y._data.__class__ is np.float64 and y.item() == 6.0


# ================================================ users' own Functions: create_graph, compile, errors
class RawSquare(Function):
    """DeZero's first Square: backward on raw arrays, first derivatives only."""

    def forward(self, x):
        return x ** 2

    def backward(self, gy):
        return 2 * self.inputs[0].data * gy.data


class Scale23(Function):
    """(2 x0, 3 x1), its backward written with gradcore's ops."""

    def forward(self, x0, x1):
        return 2 * x0, 3 * x1

    def backward(self, ga, gb):
        return 2 * ga, 3 * gb


def test_a_raw_backward_still_gives_first_derivatives_where_a_graph_is_recorded():
    x, w = Variable(np.array([0.5, 1.0])), Variable(np.array([2.0, 3.0]))
    F.sum(RawSquare()(x) * w).backward(create_graph=True)
    np.testing.assert_array_equal(x.grad.data, [2.0, 6.0])
    with pytest.raises(RuntimeError, match="RawSquare.backward is not differentiable"):
        F.sum(x.grad).backward()  # the second derivative it cannot give
    x = Variable(np.array([0.5, 1.0]))
    _, pullback = gradcore.func.vjp(lambda v: RawSquare()(v), x)
    np.testing.assert_array_equal(pullback(Variable(np.ones(2)))[0].data, [1.0, 2.0])
    x = Variable(np.array([0.5, 1.0]))
    RawSquare()(x).backward(Variable(np.ones(2)), create_graph=True)
    np.testing.assert_array_equal(x.grad.data, [1.0, 2.0])


def test_a_raw_backward_is_refused_at_second_order_from_the_seed_of_ones_too():
    """The seed (ones) has no graph, so the gradient reaching RawSquare has none: its raw result
    is joined to the input, and a hessian or a gradient penalty raises instead of giving 0."""
    with pytest.raises(RuntimeError, match="RawSquare.backward is not differentiable"):
        gradcore.func.hessian(lambda v: F.sum(RawSquare()(v)), np.array([1.0, 2.0]))
    x = Variable(np.array([1.0, 2.0]))
    g, = gradcore.grad(F.sum(RawSquare()(x)), x, create_graph=True)
    np.testing.assert_array_equal(g.data, [2.0, 4.0])  # first derivatives as they are
    with pytest.raises(RuntimeError, match="RawSquare.backward is not differentiable"):
        gradcore.grad(F.sum(g * g) + F.sum(x * x), x)  # the true value, [10, 20], needs d(g)/dx


class Logged(Function):
    """A Function with a __call__ of its own (logging, say) that reaches Function's through
    super(): its subclasses below keep the checks of an author's Function."""

    def __call__(self, *inputs):
        self.called = True
        return super().__call__(*inputs)


class LoggedSquare(Logged):
    def forward(self, x):
        return x ** 2

    def backward(self, gy):  # on raw arrays, as RawSquare's
        return 2 * self.inputs[0].data * gy.data


class LoggedRound(Logged):
    forward, backward = RoundToInt.forward, RoundToInt.backward


class LoggedAddOne(Logged):
    announce = True
    forward, backward = AddOneInPlace.forward, AddOneInPlace.backward


class LoggedView(View):
    forward, backward = Row.forward, Row.backward

    def __call__(self, x):
        return super().__call__(x)


class LoggedRow(Row):
    """Row's checked __call__ reached from an own one: the checks run once."""

    def __call__(self, x):
        return super().__call__(x)


def test_a_functions_own_call_keeps_the_checks_of_an_authors_function():
    x = Variable(np.array(3.0))
    f = LoggedSquare()
    g, = gradcore.grad(f(x), x, create_graph=True)
    assert f.called and g.item() == 6.0
    with pytest.raises(RuntimeError, match="LoggedSquare.backward is not differentiable"):
        gradcore.grad(g * x, x)  # 12 by hand; 6 before, the raw gradient taken as a constant

    y = LoggedRound()(Variable(np.array([0.2, 1.7])))
    assert y.dtype == np.int64 and not y.requires_grad and y.creator is None

    x = Variable(np.array([1.0, 2.0]), requires_grad=False)
    w = Variable(np.array([1.0, 1.0]))
    a = x * w
    b = LoggedAddOne()(x)  # mark_dirty in forward works, and b shares x's version
    assert x.version == b.version == 1
    with pytest.raises(RuntimeError, match=r"mul: its input 0, .* was written after mul ran"):
        F.sum(a + b).backward()

    for cls in (LoggedView, LoggedRow):  # under View's __call__, under an author's
        W = gradcore.Parameter(np.array([[1.0, 2.0], [3.0, 4.0]]))
        row = cls()(W)
        _sgd_step(W)
        assert row.version == W.version == 1


def test_a_raw_gradient_of_another_library_or_device_is_refused_naming_the_op():
    class ToNumPy(Function):  # a CuPy op's backward written with np. by mistake, say
        def forward(self, x):
            return x * 2

        def backward(self, gy):
            return np.asarray(STRICT.to_numpy(gy.data)) * 2

    x = Variable(STRICT.asarray(np.array([1.0, 2.0]), device=DEVICE1))
    with pytest.raises(RuntimeError, match="to_num_py.backward returned a gradient on cpu for "
                                           "an input on array_api_strict:device1"):
        F.sum(ToNumPy()(x)).backward()
    assert x.grad is None


@pytest.mark.parametrize("place", ["device2", "numpy_for_strict", "strict_for_numpy"])
def test_a_variable_gradient_of_another_library_or_device_is_refused_naming_the_op(place):
    from conftest import DEVICE2

    x_device, g_device = {"device2": (DEVICE1, DEVICE2), "numpy_for_strict": (DEVICE1, None),
                          "strict_for_numpy": (None, DEVICE1)}[place]

    def make(device):
        values = np.array([1.0, 2.0])
        return Variable(values if device is None else STRICT.asarray(values, device=device),
                        requires_grad=False)

    class Elsewhere(Function):
        def forward(self, x):
            return x * 2

        def backward(self, gy):
            return make(g_device)

    for compute in (lambda x: F.sum(Elsewhere()(x)).backward(),
                    lambda x: gradcore.grad(F.sum(Elsewhere()(x)), x)):
        x = make(x_device)
        x.requires_grad = True
        with pytest.raises(RuntimeError, match=f"elsewhere.backward returned a gradient on "
                                               f"{make(g_device).device} for an input on "
                                               f"{x.device}"):
            compute(x)
        assert x.grad is None


def test_an_authors_backward_is_checked_for_the_device_where_it_returns():
    # the walk's own test of a gradient's shape and dtype lets a same-dtype gradient on another
    # device by where dtypes are singletons (NumPy's, CuPy's: GPU 1 for GPU 0): the checked
    # backward of an author's Function refuses it as it returns
    from conftest import DEVICE2

    class Elsewhere(Function):
        def forward(self, x):
            return x * 2

        def backward(self, gy):
            return Variable(STRICT.asarray(np.ones(2), device=DEVICE2), requires_grad=False)

    x = Variable(STRICT.asarray(np.ones(2), device=DEVICE1))
    y = Elsewhere()(x)
    with pytest.raises(RuntimeError, match="elsewhere.backward returned a gradient on "
                                           "array_api_strict:device2 for an input on "
                                           "array_api_strict:device1"):
        y.creator.backward(Variable(STRICT.asarray(np.ones(2), device=DEVICE1)))


def test_a_gradient_of_another_library_reaching_the_walk_is_refused_naming_the_op():
    from gradcore.engine import _conform  # the walk's own check: gradcore's ops, say

    class Twice(Function):
        def forward(self, x):
            return x * 2

        def backward(self, gy):
            return gy * 2

    x = Variable(np.array([1.0, 2.0]))
    y = Twice()(x)
    gx = Variable(STRICT.asarray(np.array([[1.0, 1.0]]), device=DEVICE1), requires_grad=False)
    with pytest.raises(RuntimeError, match="twice.backward returned a gradient on "
                                           "array_api_strict:device1 for an input on cpu"):
        _conform(y.creator, gx, x)


def test_a_gradient_with_no_graph_from_an_output_that_got_none_is_not_refused():
    x0, x1 = Variable(np.array([1.0, 2.0])), Variable(np.array([3.0, 4.0]))
    a, b = Scale23()(x0, x1)
    loss = F.sum(a * Variable(np.array([5.0, 6.0]))) + F.sum(b)
    g0, g1 = gradcore.grad(loss, [x0, x1], create_graph=True)
    np.testing.assert_array_equal(g0.data, [10.0, 12.0])
    np.testing.assert_array_equal(g1.data, [3.0, 3.0])


def test_an_exception_raised_again_names_the_op_once():
    error = ValueError("unsupported layout")

    class Bad(Function):
        def forward(self, x):
            raise error

    for _ in range(3):
        with pytest.raises(ValueError) as info:
            Bad.apply(Variable(np.ones(2)))
    assert str(info.value) == "bad: unsupported layout (inputs: (2,))"


class Dirty(Function):
    """Adds 1 into its input in place, and says so."""

    def forward(self, x):
        x += 1
        self.mark_dirty(x)
        return x * 2

    def backward(self, gy):
        return gy * 2


class Transposed(Function):
    def forward(self, x):
        return x.T

    def backward(self, gy):
        return gy.T


def test_user_functions_in_a_compiled_step():
    """mark_dirty's write is one a replay would not count: that step runs eagerly; a Function
    returning a view replays."""
    import warnings
    buffer = Variable(np.zeros(3), requires_grad=False)
    dirty = gradcore.compile(lambda x: Dirty.apply(buffer) + x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            dirty(np.ones(3))
    assert buffer.version == 4 and buffer.data.tolist() == [4.0] * 3
    assert dirty.stats()["replays"] == 0 and any("mark_dirty" in str(w.message) for w in caught)
    W = gradcore.Parameter(np.arange(6.0).reshape(2, 3))

    def step(x):
        y = F.sum(Transposed.apply(W) * x)
        W.cleargrad()
        y.backward()
        return y, W.grad

    compiled = gradcore.compile(step)
    for i in range(4):
        x = np.full((3, 2), float(i))
        got, grad = compiled(x)
        assert float(got.data) == float(np.sum(W.data.T * x))
        np.testing.assert_array_equal(grad.data, x.T)
    assert compiled.stats()["replays"] == 3


def test_a_raw_backward_on_a_0d_input_under_create_graph_gives_its_first_derivative():
    class RawCube0(Function):
        def forward(self, x):
            return x ** 3

        def backward(self, gy):
            return 3 * self.inputs[0].data ** 2 * gy.data

    x, w = Variable(np.array(1.0)), Variable(np.array(2.0))
    (RawCube0()(x) * w).backward(create_graph=True)
    assert float(x.grad.data) == 6.0


def test_a_raw_array_kept_by_the_function_is_copied_into_grad_under_create_graph_too():
    class Kept(Function):
        def forward(self, x):
            self.jac = 2 * x
            return x * x

        def backward(self, gy):
            return self.jac * gy.data

    x, w = Variable(np.array([1.0, 2.5])), Variable(np.array([1.0, 1.0]))
    f = Kept()
    F.sum(f(x) * w).backward(create_graph=True)
    x.grad.data[...] = 0.0  # clipping or zeroing the grad in place
    np.testing.assert_array_equal(f.jac, [2.0, 5.0])


def test_forward_and_backward_say_what_they_get_and_return():
    """help(Function.forward) and help(Function.backward) tell an author the contract."""
    forward, backward = Function.forward.__doc__ or "", Function.backward.__doc__ or ""
    assert "raw arrays" in forward and "returns an array" in forward
    assert "Variable" in backward and "one gradient per input" in backward


# =============================================================================== a newcomer's slips
class _Double(Function):
    def forward(self, x):
        return x * 2

    def backward(self, gy):
        gx = gy * 2  # noqa: F841 (the slip: no return)


def test_a_backward_that_returns_none_is_refused_naming_the_function():
    """A missing return left x.grad None, silently."""
    x = Variable(np.ones(3))
    y = _Double()(x)
    with pytest.raises(RuntimeError, match=r"^_double\.backward returned None \(a missing "
                       r"return\?\) while its input 0 needs a gradient: return one gradient per "
                       r"input \(1 here; a tuple for several\), None for an input that has none"):
        y.sum().backward()
    assert x.grad is None

    class NoneInItsPlace(Function):  # None for an input, in a tuple, stays accepted
        def forward(self, a, b):
            return a * b

        def backward(self, gy):
            return None, gy * self.inputs[0]

    a, b = Variable(np.array([2.0])), Variable(np.array([3.0]))
    NoneInItsPlace()(a, b).backward()
    assert a.grad is None and b.grad.data.tolist() == [2.0]


class _HalfDeZeroStyle(Function):
    """y = x / 2, its backward written as DeZero's SoftmaxCrossEntropy's: `gy *= ...`."""

    def forward(self, x):
        return x * 0.5

    def backward(self, gy):
        gy *= 0.5
        return gy


@pytest.mark.parametrize("create_graph", [False, True])
def test_gy_op_equals_in_an_authors_backward_rebinds_leaving_the_gradient_it_got(create_graph):
    """The gradient an author's backward gets may be another op's too (add hands one gy to
    both inputs) or the caller's seed: `gy *= 0.5` there makes a new Variable, as in DeZero.
    Written into, gy (here the seed itself, handed to both halves) would end at 0.25, and x.grad
    at 0.5."""
    x = Variable(np.array([1.0, 2.0]))
    s = x * 1.0
    y = _HalfDeZeroStyle()(s) + _HalfDeZeroStyle()(s)
    seed = Variable(np.ones(2), requires_grad=False)
    y.backward(seed, create_graph=create_graph)
    assert x.grad.data.tolist() == [1.0, 1.0] and seed.data.tolist() == [1.0, 1.0]
    assert seed.version == 0


def test_calling_a_function_with_keywords_says_settings_go_to_its_constructor():
    class Scale(Function):
        def forward(self, x, k=2.0):
            return x * k

        def backward(self, gy):
            return gy * 2.0

    with pytest.raises(TypeError, match=r"^Scale\(\)\(\.\.\.\) got the keyword argument\(s\) k: "
                       r"a Function is called with its inputs only; settings go to its "
                       r"constructor, Scale\(k=3\.0\)\(x\)"):
        Scale()(Variable(np.ones(2)), k=3.0)


def test_a_forward_returning_a_list_or_a_number_says_what_to_return(xp):
    """A number is taken as DeZero's as_array takes it, on NumPy (float64, as DeZero's); on
    another library, where the device would be guessed, it is refused."""
    class Two(Function):
        def forward(self, x):
            return [x * 2, x * 3]

    class Number(Function):
        def forward(self, x):
            return float(self.xp.sum(x))

        def backward(self, gy):
            return gy * self.xp.ones(2)

    with pytest.raises(TypeError, match=r"two\.forward returned list, not an array; for several "
                       r"outputs return a tuple of arrays \(return y0, y1\)"):
        Two()(Variable(xp.asarray(np.ones(2))))
    x = Variable(xp.asarray(np.ones(2)))
    if xp.name != "numpy":
        with pytest.raises(TypeError, match=r"number\.forward returned float, not an array; "
                           r"return an array: self\.xp\.asarray\(value\)"):
            Number()(x)
        return
    y = Number()(x)
    assert y.dtype == np.float64 and y.item() == 2.0
    y.backward()
    np.testing.assert_array_equal(x.grad.data, [1.0, 1.0])


def test_a_backward_taking_fewer_gradients_than_outputs_is_told_it_gets_one_per_output():
    class SinCos(Function):
        def forward(self, x):
            return np.sin(x), np.cos(x)

        def backward(self, gy):  # DeZero's one-output habit on a two-output forward
            return gy

    s, _ = SinCos()(Variable(np.ones(2)))
    with pytest.raises(TypeError, match="takes 2 positional arguments but 3 were given") as caught:
        s.sum().backward()
    assert ("SinCos.backward gets one gradient per output of forward, 2 here: define "
            "backward(self, gy0, gy1)") in caught.value.__notes__

    class Fits(Function):  # a TypeError from inside a backward that fits: no such note
        def forward(self, x):
            return np.sin(x), np.cos(x)

        def backward(self, gy0, gy1):
            return len(1)

    s, _ = Fits()(Variable(np.ones(2)))
    with pytest.raises(TypeError, match="has no len") as caught:
        s.sum().backward()
    assert not any("one gradient per output" in note for note in caught.value.__notes__)


def test_dezeros_self_input_and_self_output_say_what_to_use():
    class Step6(Function):  # DeZero's step 6
        def forward(self, x):
            return x * 2

        def backward(self, gy):
            return 2 * self.input.data * 0 + gy * 2

    f = Step6()
    y = f(Variable(np.ones(2)))
    with pytest.raises(AttributeError, match=r"'Step6' object has no attribute 'input': .*"
                       r"DeZero's self\.input is self\.inputs\[0\]") as caught:
        y.backward()
    assert caught.value.name == "input" and caught.value.obj is f
    with pytest.raises(AttributeError, match=r"DeZero's self\.output is self\.outputs\[0\]\(\)"):
        f.output
    assert not hasattr(f, "input")

    class OwnOutput(Function):  # an author's own attribute of that name is found first
        def forward(self, x):
            self.output = "kept"
            return x * 2

        def backward(self, gy):
            return gy * 2

    g = OwnOutput()
    g(Variable(np.ones(2)))
    assert g.output == "kept"


def test_dezeros_core_names_import_from_gradcore_core():
    """DeZero's modules import from dezero.core (and its steps 23-32 from dezero.core_simple):
    each name dezero.core defines that gradcore has."""
    import gradcore.core
    import gradcore.core_simple
    from gradcore.core import Function as CoreFunction, as_variable  # DeZero's functions.py line

    assert CoreFunction is Function and as_variable is gradcore.as_variable
    names = {"Config": gradcore.Config, "using_config": gradcore.using_config,
             "no_grad": gradcore.no_grad, "test_mode": gradcore.test_mode,
             "Variable": Variable, "Parameter": gradcore.Parameter, "Function": Function,
             "as_array": gradcore.as_array, "as_variable": gradcore.as_variable,
             "setup_variable": gradcore.setup_variable,
             "Add": F.Add, "add": F.add, "Sub": F.Sub, "sub": F.sub, "Mul": F.Mul, "mul": F.mul,
             "Div": F.Div, "div": F.div, "Neg": F.Neg, "neg": F.neg, "Pow": F.Pow, "pow": F.pow}
    for module in (gradcore.core, gradcore.core_simple):
        for name, obj in names.items():
            assert getattr(module, name) is obj, (module.__name__, name)
    assert sorted(gradcore.core.__all__) == sorted(names)
    x = gradcore.core.Variable(np.array(3.0))
    gradcore.core.pow(gradcore.core.add(x, 1.0), 2).backward()
    assert x.grad.data == 8.0


def test_gy_op_equals_in_a_helper_a_backward_calls_leaves_the_other_branchs_gradient():
    """A gradient requires no grad, so `g *= c` rebinds wherever it is written: add hands one
    gradient to both its inputs, and writing into it would halve exp's too."""
    def scale(g, c):
        g *= c
        return g

    class Half(gradcore.Function):
        def forward(self, x):
            return x * 0.5

        def backward(self, gy):
            return scale(gy, 0.5)

    v, x = Variable(np.array([1.0, 2.0])), Variable(np.array([1.0, 2.0]))
    F.sum(F.exp(v) + Half()(x)).backward()
    np.testing.assert_allclose(v.grad.data, np.exp([1.0, 2.0]))
    np.testing.assert_array_equal(x.grad.data, [0.5, 0.5])
