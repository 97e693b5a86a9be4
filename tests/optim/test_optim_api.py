"""Constructing optimizers: DeZero's defaults and names, both call styles, targets, misuse."""
import math
import warnings

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
import gradcore.optim as optim
from gradcore.optim import SGD, AdaDelta, AdaGrad, Adam, AdamW, MomentumSGD, Optimizer
from conftest import DEVICE1, STRICT


def param(values=(1.0, -2.0)):
    return gradcore.Parameter(np.array(values))


def with_grad(p, values):
    p.grad = gradcore.Variable(np.array(values), requires_grad=False)
    return p


class Model:
    """PyTorch-style: parameters()."""

    def __init__(self):
        self.W, self.b = param(), param([0.5])

    def parameters(self):
        yield self.W
        yield self.b


class DezeroLayer:
    """DeZero-style: params() only; a parameter may be added after setup."""

    def __init__(self):
        self.ps = [param()]

    def params(self):
        yield from self.ps


def test_dezero_defaults_and_attribute_names():
    assert SGD().lr == 0.01
    m = MomentumSGD()
    assert (m.lr, m.momentum) == (0.01, 0.9)
    a = AdaGrad()
    assert (a.lr, a.eps) == (0.001, 1e-8)
    d = AdaDelta()
    assert (d.rho, d.eps, d.lr) == (0.95, 1e-6, 1.0)
    adam = Adam()
    assert (adam.alpha, adam.beta1, adam.beta2, adam.eps, adam.t) == (0.001, 0.9, 0.999, 1e-8, 0)
    w = AdamW()
    assert (w.alpha, w.weight_decay) == (0.001, 0.01)
    for o in (SGD(), adam):
        assert o.target is None and o.hooks == []
    assert repr(m) == "MomentumSGD(lr=0.01, momentum=0.9)"


def test_dezero_positional_hyperparameters():
    m = MomentumSGD(0.1, 0.8)
    assert (m.lr, m.momentum) == (0.1, 0.8)
    assert AdaDelta(0.9).rho == 0.9
    a = Adam(0.01, 0.5, 0.6, 1e-3)
    assert (a.alpha, a.beta1, a.beta2, a.eps) == (0.01, 0.5, 0.6, 1e-3)
    assert SGD(np.float32(0.5)).lr == 0.5 and type(SGD(np.float32(0.5)).lr) is float


def test_pytorch_style_parameters_first():
    model = Model()
    assert SGD(model.parameters(), lr=0.1).target == [model.W, model.b]
    assert SGD(model, 0.1).target is model
    assert SGD(model.W).target == [model.W]
    assert MomentumSGD(model.parameters(), 0.2, 0.5).momentum == 0.5
    adam = Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9), eps=1e-6)
    assert (adam.alpha, adam.beta1, adam.beta2, adam.eps) == (0.01, 0.8, 0.9, 1e-6)
    assert AdamW(model.parameters(), 3e-4, weight_decay=0.1).alpha == 3e-4
    assert AdaDelta([model.W], lr=0.5).lr == 0.5


def test_setup_returns_self_and_accepts_models_and_iterables():
    model = Model()
    optimizer = SGD(lr=1.0)
    assert optimizer.setup(model) is optimizer and optimizer.target is model
    with_grad(model.W, [1.0, 1.0])
    optimizer.update()
    np.testing.assert_array_equal(model.W.data, [0.0, -3.0])
    assert SGD().setup(p for p in [model.W]).target == [model.W]


def test_a_model_is_asked_for_its_parameters_at_every_update():
    layer = DezeroLayer()
    optimizer = SGD(lr=1.0).setup(layer)
    layer.ps.append(with_grad(param([5.0]), [1.0]))  # e.g. a lazily created weight
    optimizer.update()
    np.testing.assert_array_equal(layer.ps[1].data, [4.0])


def test_a_shared_parameter_is_updated_once():
    W = with_grad(param(), [1.0, 1.0])
    optimizer = SGD([W, W], lr=1.0)
    assert optimizer.target == [W]
    optimizer.step()
    np.testing.assert_array_equal(W.data, [0.0, -3.0])


def test_adam_lr_is_the_bias_corrected_step_size():
    W = param()
    adam = Adam(alpha=0.1, beta1=0.5, beta2=0.75).setup([W])
    assert adam.lr == pytest.approx(0.1 * math.sqrt(1 - 0.75) / (1 - 0.5))  # of the first update
    with_grad(W, [1.0, 1.0])
    adam.update()
    adam.update()
    assert adam.t == 2
    assert adam.lr == pytest.approx(0.1 * math.sqrt(1 - 0.75 ** 2) / (1 - 0.5 ** 2))
    with pytest.raises(AttributeError, match="set alpha instead"):
        adam.lr = 0.1


def test_zero_grad_and_step_with_a_closure():
    model = Model()
    optimizer = SGD(model.parameters(), lr=0.5)

    def closure():
        optimizer.zero_grad()
        loss = gradcore.functions.sum(model.W ** 2)
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    assert loss.item() == 5.0
    np.testing.assert_array_equal(model.W.data, [0.0, 0.0])  # W - 0.5 * 2W
    assert model.b.grad is None
    optimizer.zero_grad()
    assert model.W.grad is None


def test_a_dezero_style_subclass_works():
    class Halve(Optimizer):
        def __init__(self, lr=0.5):
            super().__init__()
            self.lr = lr

        def update_one(self, param):
            param.data -= self.lr * param.grad.data

    W = with_grad(param(), [2.0, 2.0])
    Halve().setup([W]).update()
    np.testing.assert_array_equal(W.data, [0.0, -3.0])
    with pytest.raises(NotImplementedError, match="must define update_one"):
        Optimizer([W]).update()


def test_the_dezero_module_name_and_the_package_exports():
    from gradcore.optimizers import Adam as DezeroAdam
    from gradcore.optimizers import ClipGrad, FreezeParam, WeightDecay

    assert DezeroAdam is Adam
    assert (WeightDecay, ClipGrad, FreezeParam) == (optim.WeightDecay, optim.ClipGrad,
                                                    optim.FreezeParam)
    assert gradcore.optim is optim
    assert {"optim", "optimizers"} <= set(gradcore.__all__)
    for name in gradcore.optimizers.__all__:
        assert getattr(gradcore.optimizers, name) is getattr(optim, name)


@pytest.mark.parametrize("make, error, message", [
    (lambda: SGD(lr=0.1, momentum=0.9),
     TypeError, "unexpected keyword argument 'momentum'.*MomentumSGD"),
    (lambda: Adam(weight_decay=0.1), TypeError, r"WeightDecay\(rate\)\), or AdamW"),
    (lambda: Adam(0.1, lr=0.2), TypeError,
     "got 'alpha' twice \\(by position, and as 'lr'; 'lr' is its alias\\)"),
    (lambda: Adam(lr=0.1, alpha=0.2), TypeError,
     "got 'alpha' twice \\(as 'lr', and as 'alpha'; 'lr' is its alias\\)"),
    (lambda: Adam(betas=(0.9, 0.99), beta1=0.9), TypeError, "either betas"),
    (lambda: Adam(betas=0.9), TypeError, r"betas must be a pair"),
    (lambda: SGD(0.1, 0.2),
     TypeError, r"SGD takes at most 1 hyperparameter\(s\) positionally \(lr\)"),
    (lambda: SGD(0.1, [param()]), TypeError, "the parameters to optimize come first"),
    (lambda: SGD(lr=-0.1), ValueError, "SGD: lr must be a finite number >= 0, got -0.1"),
    (lambda: SGD(lr=math.nan), ValueError, "lr must be a finite number"),
    (lambda: Adam(beta1=1.0), ValueError, "beta1 must be a finite number >= 0 and < 1"),
    (lambda: AdaDelta(rho=1.5), ValueError, "rho must be a finite number >= 0 and <= 1"),
    (lambda: SGD(lr="0.1"), TypeError, "lr must be a real number, got str"),
    (lambda: SGD([]), ValueError, "empty list of parameters"),
    (lambda: SGD([param(), np.zeros(2)]), TypeError, "item 1 is a ndarray"),
    (lambda: SGD([{"params": [param()], "lr": 0.1}]), TypeError, "parameter groups"),
    (lambda: SGD(np.zeros(2)), TypeError, "expected the parameters to optimize.*got ndarray"),
    (lambda: SGD(True), TypeError, "expected the parameters to optimize.*got bool"),
    (lambda: SGD().setup("model"), TypeError, "SGD.setup: expected the parameters"),
    (lambda: SGD().setup(Model), TypeError,
     r"SGD.setup: got the class Model, not a model; create the model first \(model = Model"),
    (lambda: Adam(gradcore.nn.MLP, lr=0.1), TypeError, "Adam: got the class MLP, not a model"),
])
def test_misuse_is_explained(make, error, message):
    with pytest.raises(error, match=message):
        make()


@pytest.mark.parametrize("make", [
    lambda model: SGD(0.1).setup(model),
    lambda model: Adam(model, lr=0.1),
])
def test_a_step_on_a_model_with_no_parameters_at_all_is_refused(make):
    class Hidden(gradcore.nn.Module):  # its layer in a dict: not registered
        def __init__(self):
            super().__init__()
            self.by_name = {"fc": gradcore.nn.Linear(1, in_size=1)}

    model = Hidden()
    optimizer = make(model)
    message = (r"got an empty list of parameters: Hidden.parameters\(\) gives none.*"
               "nn.ModuleList or nn.ModuleDict")
    with pytest.raises(ValueError, match=message), pytest.warns(
            UserWarning, match=r"Hidden\.by_name is a dict holding 1 Module\(s\) not registered"):
        optimizer.update()
    with pytest.raises(ValueError, match=message):
        optimizer.step()
    if isinstance(optimizer, Adam):
        assert optimizer.t == 0  # refused before the count moved


def test_a_model_whose_weights_are_plain_variables_is_told_to_make_them_parameters():
    class Net(gradcore.nn.Module):
        def __init__(self):
            super().__init__()
            self.W = gradcore.Variable(np.ones((2, 2)))  # a newcomer's weight: not a Parameter
            self.head = gradcore.nn.Module()
            self.head.b = gradcore.Variable(np.zeros(2))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net = Net()
    assert [str(w.message).split(",")[0] for w in caught] == [
        "Net.W is a Variable that requires grad but is not a Parameter",
        "Module.b is a Variable that requires grad but is not a Parameter"]
    with pytest.raises(ValueError, match=r"Net\.W, Net\.head\.b are Variables, not a Parameter: "
                                         r"only Parameters are trained"):
        SGD(0.1).setup(net).update()
    with pytest.raises(ValueError, match="or a model whose weights are plain Variables"):
        SGD(Net().parameters())

    class Slotted:  # a target of the user's own, with __slots__ and nothing to train
        __slots__ = ()

        def params(self):
            return []

    with pytest.raises(ValueError, match=r"Slotted\.parameters\(\) gives none"):
        SGD(0.1).setup(Slotted()).update()


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1), lambda ps: Adam(ps, lr=0.1)])
def test_a_read_only_parameter_is_refused_before_any_parameter_is_stepped(make):
    first = gradcore.Parameter(np.zeros(3), name="q")
    frozen = gradcore.Parameter(np.broadcast_to(np.ones(1), (3,)), name="W")  # read-only
    optimizer = make([first, frozen])
    gradcore.functions.sum(first * 2.0 + frozen * 3.0).backward()
    with pytest.raises(ValueError, match=r"parameter \(W, shape \(3,\)\) holds a read-only array "
                                         r".*param\.data = param\.data\.copy\(\)"):
        optimizer.step()
    assert (first.data == 0.0).all() and first.version == 0  # nothing stepped, not half a step
    assert getattr(optimizer, "t", 0) == 0
    optimizer.add_hook(gradcore.optim.FreezeParam(frozen))  # frozen: never written, so allowed
    optimizer.step()
    # SGD: 0.1 x 2; Adam's first step: alpha times about 1 (m / sqrt(v) with eps)
    np.testing.assert_allclose(first.data, [-0.2] * 3 if isinstance(optimizer, SGD)
                               else [-0.1] * 3, rtol=1e-6)
    np.testing.assert_array_equal(frozen.data, [1.0] * 3)


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1), lambda ps: Adam(ps, lr=0.1)])
def test_an_integer_parameter_with_a_gradient_is_refused_before_any_parameter_is_stepped(make):
    # NumPy's UFuncTypeError came after the float parameter was stepped and Adam's t counted
    first = with_grad(param(), [1.0, 1.0])
    table = gradcore.Parameter(np.array([1, 2]), name="idx")  # an index table
    optimizer = make([first, table])
    table.grad = gradcore.Variable(np.array([1, 1]))  # set by hand: backward gives it none
    with pytest.raises(TypeError, match=r"parameter \(idx, shape \(2,\)\) holds int64 data and "
                                        r"has a gradient; only floating-point parameters are "
                                        r"trained .* Set its grad to None"):
        optimizer.step()
    np.testing.assert_array_equal(first.data, [1.0, -2.0])
    assert first.version == 0 and getattr(optimizer, "t", 0) == 0 and not optimizer.state
    optimizer.add_hook(gradcore.optim.FreezeParam(table))  # frozen: never written, so allowed
    optimizer.step()
    np.testing.assert_allclose(first.data, [0.9, -2.1], rtol=1e-6)  # SGD: 0.1 x 1; Adam: 0.1
    np.testing.assert_array_equal(table.data, [1, 2])


def test_a_read_only_array_api_parameter_is_refused_before_any_parameter_is_stepped():
    read_only = np.ones(3)
    read_only.flags.writeable = False  # as numpy.load(mmap_mode='r') gives
    first = gradcore.Parameter(STRICT.asarray(np.zeros(3), device=DEVICE1), name="q")
    frozen = gradcore.Parameter(STRICT.asarray(read_only, device=DEVICE1), name="W")  # shared
    optimizer = SGD([first, frozen], lr=0.1)
    gradcore.functions.sum(first * 2.0 + frozen * 3.0).backward()
    with pytest.raises(ValueError, match=r"parameter \(W, shape \(3,\)\) holds a read-only array "
                                         r".*param\.xp\.asarray\(param\.data, copy=True\)"):
        optimizer.step()
    assert first.version == 0
    np.testing.assert_array_equal(STRICT.to_numpy(first.data), [0.0] * 3)
    frozen.data = frozen.xp.asarray(frozen.data, copy=True)  # the fix the message gives
    optimizer.step()
    np.testing.assert_allclose(STRICT.to_numpy(first.data), [-0.2] * 3)
    np.testing.assert_allclose(STRICT.to_numpy(frozen.data), [0.7] * 3)


def test_a_model_whose_lazy_layers_have_no_data_yet_still_steps():
    model = gradcore.nn.Linear(2)  # W and b: Parameters without data until the first call
    optimizer = SGD(lr=0.5).setup(model)
    optimizer.update()  # no gradients yet: nothing to do, and no error
    F = gradcore.functions
    F.sum(model(np.ones((1, 3)))).backward()
    before = model.b.data.copy()
    optimizer.update()
    np.testing.assert_allclose(model.b.data, before - 0.5)  # d sum / d b = 1


@pytest.mark.parametrize("make, name, bad, error, message", [
    (SGD, "lr", "0.2", TypeError, "SGD: lr must be a real number, got str '0.2'"),
    (SGD, "lr", -0.1, ValueError, "SGD: lr must be a finite number >= 0, got -0.1"),
    (SGD, "lr", math.nan, ValueError, "SGD: lr must be a finite number >= 0, got nan"),
    (MomentumSGD, "momentum", math.inf, ValueError, "momentum must be a finite number"),
    (Adam, "alpha", None, TypeError, "Adam: alpha must be a real number, got NoneType"),
    (Adam, "beta1", 1.0, ValueError, "beta1 must be a finite number >= 0 and < 1"),
])
def test_a_hyperparameter_assigned_later_is_checked_as_the_constructor_checks_it(
        make, name, bad, error, message):
    optimizer = make([param()])
    before = getattr(optimizer, name)
    with pytest.raises(error, match=message):
        setattr(optimizer, name, bad)
    assert getattr(optimizer, name) == before  # unchanged
    setattr(optimizer, name, np.float32(0.5))  # what a schedule or a user may assign
    assert getattr(optimizer, name) == 0.5 and type(getattr(optimizer, name)) is float


def test_a_step_size_read_back_from_an_npz_file_is_accepted_as_its_float(tmp_path):
    np.savez(tmp_path / "hyper.npz", lr=0.05, alpha=0.002, momentum=3, flag=True, lrs=[0.1])
    saved = np.load(tmp_path / "hyper.npz")  # 0-d arrays, as numpy.load gives them
    sgd = SGD([with_grad(param(), [1.0, 1.0])])
    adam, momentum = Adam([param()]), MomentumSGD([param()])
    sgd.lr, adam.alpha, momentum.momentum = saved["lr"], saved["alpha"], saved["momentum"]
    assert (sgd.lr, adam.alpha, momentum.momentum) == (0.05, 0.002, 3.0)
    assert type(sgd.lr) is float and type(adam.alpha) is float and type(momentum.momentum) is float
    sgd.update()
    np.testing.assert_allclose(sgd.target[0].data, [1.0 - 0.05, -2.0 - 0.05], rtol=1e-15)
    with pytest.raises(TypeError, match=r"lr must be a real number, got ndarray array\(True\)"):
        sgd.lr = saved["flag"]
    with pytest.raises(TypeError, match=r"lr must be a real number, got ndarray array\(\[0\.1\]\)"):
        sgd.lr = saved["lrs"]  # one value per group is not a step size
    assert sgd.lr == 0.05


def test_update_checks_come_before_any_change():
    with pytest.raises(RuntimeError, match=r"call setup\(model\) first"):
        SGD().update()
    W = with_grad(param(), [1.0, 1.0])
    W.data = np.array([1.0, -2.0, 3.0])  # the parameter changed shape after its gradient was made
    adam = Adam([W])
    with pytest.raises(ValueError, match=r"has shape \(2,\); it must have the parameter's shape"):
        adam.update()
    assert adam.t == 0 and W not in adam.state
    W._grad = np.ones(3)  # past the grad setter, which would make it a Variable
    with pytest.raises(TypeError, match="the grad of parameter .* is a ndarray"):
        adam.update()


def test_a_computed_variable_is_refused_as_a_parameter():
    w = gradcore.Variable(np.ones(3)) * 0.01  # PyTorch users' `randn(...) * 0.01`: not a leaf
    message = r"item 0, parameter \(shape \(3,\)\), is not a leaf.*computed by mul.*detach\(\)"
    with pytest.raises(ValueError, match=message):
        SGD([w], lr=0.1)
    with pytest.raises(ValueError, match=message):
        Adam(w)
    with pytest.raises(ValueError, match="not a leaf"):
        SGD().setup([param(), w])

    class Holder:  # a model handing out a computed Variable: refused at the update
        def parameters(self):
            yield w

    optimizer = SGD(lr=0.1).setup(Holder())
    w.grad = gradcore.Variable(np.ones(3))
    with pytest.raises(ValueError, match=r"Holder.parameters\(\): item 0.*not a leaf"):
        optimizer.update()

    leaf = w.detach().requires_grad_()  # as the message says
    optimizer = SGD([leaf], lr=0.5)
    gradcore.functions.sum(leaf * leaf).backward()
    optimizer.step()
    np.testing.assert_allclose(leaf.data, [0.0, 0.0, 0.0])


def test_zero_grad_set_to_none_or_to_zeros():
    model = Model()
    optimizer = Adam(model.parameters(), lr=0.1)
    with_grad(model.W, [1.0, 2.0])
    optimizer.zero_grad(set_to_none=True)
    assert model.W.grad is None and model.b.grad is None

    grad = with_grad(model.W, [1.0, 2.0]).grad
    array = grad.data
    optimizer.zero_grad(set_to_none=False)
    assert model.W.grad is grad and grad.data is array  # filled in place, as PyTorch's
    np.testing.assert_array_equal(array, [0.0, 0.0])
    assert model.b.grad is None  # no gradient: nothing to fill
    optimizer.step()  # a zero gradient is a gradient: W takes a (zero) step, and it counts
    np.testing.assert_array_equal(model.W.data, [1.0, -2.0])
    assert optimizer.param_counts(model.W) == {"step": 1}

    shared = np.broadcast_to(np.ones(2), (2,))  # read-only: zeroed by a new gradient instead
    model.W.grad = gradcore.Variable(shared, requires_grad=False)
    optimizer.zero_grad(False)
    np.testing.assert_array_equal(model.W.grad.data, [0.0, 0.0])
    np.testing.assert_array_equal(shared, [1.0, 1.0])


def test_zeros_filled_into_a_gradient_with_a_graph_drop_the_graph_first():
    """After backward(create_graph=True), zero_grad(set_to_none=False) wrote zeros into the
    grad but left its creator: differentiating it raised of a write after mul ran, and the next
    backward added into a grad with a graph. As PyTorch's detach_(): a leaf of zeros."""
    x = gradcore.Parameter(np.array([0.3, -1.2, 2.0]))
    opt = SGD([x], lr=0.1)
    F.sum(x ** 3).backward(create_graph=True)
    g = x.grad
    assert g.creator is not None
    opt.zero_grad(set_to_none=False)
    assert x.grad is g and g.creator is None and not g.requires_grad
    np.testing.assert_array_equal(g.data, [0.0, 0.0, 0.0])
    F.sum(x ** 2).backward()
    np.testing.assert_array_equal(x.grad.data, 2 * x.data)
    assert x.grad.creator is None


def test_adam_counts_a_numpy_step_that_raised_after_changing_a_parameter():
    # under errstate(over="raise") the second parameter's g * g overflows after the first was
    # updated in place: t counts updates that changed a parameter, and the first's count is 1
    p1, p2 = (gradcore.Parameter(np.ones(3, np.float32)) for _ in range(2))
    opt = Adam([p1, p2])
    p1.grad = gradcore.Variable(np.full(3, 0.5, np.float32), requires_grad=False)
    p2.grad = gradcore.Variable(np.full(3, 3e30, np.float32), requires_grad=False)
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        opt.update()
    assert p1.data.tolist() == [np.float32(0.999)] * 3 and p2.data.tolist() == [1.0] * 3
    assert opt.param_counts(p1)["step"] == 1 and opt.t == 1


def test_adam_does_not_count_a_step_whose_hook_raised():
    p = gradcore.Parameter(np.ones(3))
    opt = Adam([p])

    def failing(params):
        raise RuntimeError("hook")

    opt.add_hook(failing)
    p.grad = gradcore.Variable(np.ones(3), requires_grad=False)
    with pytest.raises(RuntimeError, match="hook"):
        opt.update()
    assert opt.t == 0 and p.data.tolist() == [1.0] * 3


# ============================================================ found by a review: silent settings
def steps_of(optimizer, W, n=5):
    """W's values after `n` steps of `optimizer` with gradients [1, -2] * k."""
    for k in range(1, n + 1):
        with_grad(W, [1.0 * k, -2.0 * k])
        optimizer.step()
    return W.data.copy()


@pytest.mark.parametrize("make, name, value, message", [
    (Adam, "weight_decay", 0.5, r"Adam has no hyperparameter 'weight_decay'.*WeightDecay\(rate\)"),
    (SGD, "momentum", 0.9, "SGD has no hyperparameter 'momentum'.*use MomentumSGD"),
    (Adam, "momentum", 0.9, "Adam's momentum is beta1"),
    (SGD, "nesterov", True, "it accepts lr$"),
    (AdaGrad, "rho", 0.9, "AdaGrad has no hyperparameter 'rho'.*rho is AdaDelta's"),
    (MomentumSGD, "betas", (0.9, 0.99), "betas is Adam and AdamW's"),
    (Adam, "amsgrad", True, "it accepts alpha, beta1, beta2, eps, lr, betas"),
    (AdaDelta, "lr_decay", 0.1, "lr_scheduler"),
    (SGD, "max_norm", 1.0, r"add_hook\(ClipGrad\(max_norm\)\)"),
])
def test_setting_a_hyperparameter_the_optimizer_does_not_have_raises(make, name, value, message):
    # before, the attribute was set and never read: the steps were those of the defaults
    W = param()
    optimizer = make([W], lr=0.1)
    with pytest.raises(AttributeError, match=message):
        setattr(optimizer, name, value)
    assert name not in vars(optimizer)
    untouched = param()
    np.testing.assert_array_equal(steps_of(optimizer, W), steps_of(make([untouched], lr=0.1),
                                                                  untouched))


def test_adam_betas_set_later_set_beta1_and_beta2_as_the_constructor_does():
    W, V = param(), param()
    optimizer = Adam([W], lr=0.1)
    optimizer.betas = (0.0, 0.5)
    assert (optimizer.beta1, optimizer.beta2, optimizer.betas) == (0.0, 0.5, (0.0, 0.5))
    np.testing.assert_array_equal(steps_of(optimizer, W),
                                  steps_of(Adam([V], lr=0.1, betas=(0.0, 0.5)), V))
    with pytest.raises(ValueError, match="beta2 must be a finite number >= 0 and < 1"):
        optimizer.betas = (0.3, 1.0)
    with pytest.raises(TypeError, match=r"betas must be a pair \(beta1, beta2\), got 0.5"):
        optimizer.betas = 0.5
    assert optimizer.betas == (0.0, 0.5)  # neither changed
    assert optimizer.state_dict()["hyperparameters"]["beta2"] == 0.5
    with pytest.raises(AttributeError, match="set alpha instead"):
        optimizer.lr = 0.5  # Adam's lr is the bias-corrected step size


def test_hyperparameters_is_read_only_and_state_dict_holds_a_plain_dict():
    import pickle

    optimizer = Adam([param()], lr=0.1)
    with pytest.raises(TypeError, match="does not support item assignment"):
        optimizer.hyperparameters["alpha"] = 1.0
    assert optimizer.alpha == 0.1 and "set one as an attribute" in type(
        optimizer).hyperparameters.__doc__
    saved = optimizer.state_dict()["hyperparameters"]
    assert type(saved) is dict and pickle.loads(pickle.dumps(saved)) == saved
    assert optimizer.hyperparameters == {"alpha": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}


def test_a_users_subclass_still_sets_attributes_of_its_own():
    class Momentum(Optimizer):  # DeZero's MomentumSGD as the book writes it (step 46)
        def __init__(self, lr=0.1, momentum=0.9):
            super().__init__()
            self.lr, self.momentum, self.vs = lr, momentum, {}

        def update_one(self, param):
            v = self.vs.setdefault(id(param), np.zeros_like(param.data))
            v *= self.momentum
            v -= self.lr * param.grad.data
            param.data += v

    class DecayingSGD(SGD):  # a subclass of gradcore's: sets another optimizer's name
        def __init__(self, *args, weight_decay=0.5, **kwargs):
            super().__init__(*args, **kwargs)
            self.weight_decay = weight_decay

        def update_one(self, param):
            param.data -= self.lr * (param.grad.data + self.weight_decay * param.data)

    W = with_grad(param([1.0]), [1.0])
    optimizer = Momentum().setup([W])
    optimizer.update()
    optimizer.update()
    np.testing.assert_allclose(W.data, [1.0 - 0.1 - 0.19])
    optimizer.momentum = 0.5
    assert optimizer.momentum == 0.5
    V = with_grad(param([1.0]), [1.0])
    DecayingSGD([V], lr=0.1).step()
    np.testing.assert_allclose(V.data, [1.0 - 0.1 * 1.5])


@pytest.mark.parametrize("make, message", [
    (lambda p: AdaDelta(p, 1.0),
     r"AdaDelta\(params, 1.0\): hyperparameter 1 after the parameters is rho in AdaDelta's "
     r"positional order \(rho, eps, lr, DeZero's\) but lr in PyTorch's \(lr, rho, eps, "
     r"weight_decay\); pass it by keyword: rho=1.0, or lr=1.0 as PyTorch reads it"),
    (lambda p: AdaGrad(p, 0.1, 0.01), "hyperparameter 2 after the parameters is eps in AdaGrad's"
     r" positional order \(lr, eps, DeZero's\) but lr_decay in PyTorch's"),
    (lambda p: Adam(p, 0.01, 0.5), "hyperparameter 2 .* is beta1 .* but betas in PyTorch's"),
    (lambda p: AdamW(p, 0.01, 0.5, 0.6), "is beta1 .* but betas in PyTorch's"),
])
def test_hyperparameters_after_the_parameters_that_pytorch_reads_otherwise_are_refused(
        make, message):
    # AdaDelta(params, 1.0) read 1.0 as rho, where PyTorch's Adadelta reads lr: 4.7 off after
    # 20 steps, silently
    with pytest.raises(TypeError, match=message):
        make([param()])


def test_hyperparameters_after_the_parameters_that_pytorch_reads_alike_are_kept():
    W = param()
    assert SGD([W], 0.1).lr == 0.1
    momentum = MomentumSGD([W], 0.1, 0.5)
    assert (momentum.lr, momentum.momentum) == (0.1, 0.5)
    assert Adam([W], 0.01).alpha == AdamW([W], 0.01).alpha == 0.01
    assert AdaGrad([W], 0.1).lr == 0.1
    assert AdaDelta([W], lr=0.5, rho=0.8).rho == 0.8
    # DeZero's style (no parameters first) keeps DeZero's order
    assert (AdaDelta(0.8, 1e-5).rho, AdaGrad(0.1, 0.01).eps) == (0.8, 0.01)


def test_every_keyword_the_constructor_accepts_is_listed():
    with pytest.raises(TypeError, match="'amsgrad'; it accepts alpha, beta1, beta2, eps, lr, "
                                        "betas$"):
        Adam(amsgrad=True)
    with pytest.raises(TypeError, match="it accepts alpha, beta1, beta2, eps, weight_decay, lr, "
                                        "betas$"):
        AdamW(nesterov=True)
