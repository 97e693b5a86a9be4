"""Learning-rate schedules: PyTorch's values (alone, composed, after a change by hand), closed
forms, both optimizer styles, state_dict and resuming, OneCycleLR's momentum."""
import math
import re

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from gradcore import nn, optim
from gradcore.optim import lr_scheduler as sched

STEPS = 300
SCHEDULES = {  # PyTorch's name (ours too) -> keyword arguments; each stepped STEPS times
    "StepLR": {"step_size": 7, "gamma": 0.5},
    "MultiStepLR": {"milestones": [5, 12, 30, 30, 100], "gamma": 0.3},  # 30 twice: gamma**2
    "ExponentialLR": {"gamma": 0.99},
    "CosineAnnealingLR": {"T_max": 15, "eta_min": 0.001},  # up and down again many times
    "LinearLR": {"start_factor": 0.25, "total_iters": 9},
    "OneCycleLR": {"max_lr": 0.5, "total_steps": STEPS + 1},
}
CHAINABLE = [name for name in SCHEDULES if name != "OneCycleLR"]


def rates(scheduler, optimizer, name, steps=40):
    seen = [getattr(optimizer, name)]
    for _ in range(steps):
        scheduler.step()
        seen.append(getattr(optimizer, name))
    return seen


def ours(names, steps=STEPS, by_hand=None, cls=optim.SGD):
    """The step sizes of a `cls` with the schedules `names`, all stepped at each step;
    by_hand=(step, lr) sets the step size before that step."""
    opt = cls(nn.Linear(2, in_size=3).parameters(), lr=0.1)
    name = "alpha" if issubclass(cls, optim.Adam) else "lr"
    schedulers = [getattr(sched, n)(opt, **SCHEDULES[n]) for n in names]
    seen = [getattr(opt, name)]
    for i in range(steps):
        if by_hand and i == by_hand[0]:
            setattr(opt, name, by_hand[1])
        for s in schedulers:
            s.step()
        seen.append(getattr(opt, name))
    return seen


def pytorchs(torch, names, steps=STEPS, by_hand=None):
    """The same with torch.optim.SGD and torch.optim.lr_scheduler."""
    topt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    schedulers = [getattr(torch.optim.lr_scheduler, n)(topt, **SCHEDULES[n]) for n in names]
    group = topt.param_groups[0]
    seen = [group["lr"]]
    for i in range(steps):
        if by_hand and i == by_hand[0]:
            group["lr"] = by_hand[1]
        topt.step()
        for s in schedulers:
            s.step()
        seen.append(group["lr"])
    return seen


@pytest.mark.parametrize("name", SCHEDULES)
def test_schedules_agree_with_pytorch(name):
    torch = pytest.importorskip("torch")
    np.testing.assert_allclose(ours([name]), pytorchs(torch, [name]), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ours([name], cls=optim.Adam), pytorchs(torch, [name]),
                               rtol=1e-12, atol=1e-15)  # Adam's alpha is PyTorch's lr


@pytest.mark.parametrize("first, second", [
    ("LinearLR", "ExponentialLR"), ("LinearLR", "CosineAnnealingLR"), ("StepLR", "MultiStepLR"),
    ("CosineAnnealingLR", "StepLR"), ("ExponentialLR", "LinearLR"), ("LinearLR", "OneCycleLR"),
    ("OneCycleLR", "ExponentialLR")])
def test_two_schedules_on_one_optimizer_compose_as_in_pytorch(first, second):
    torch = pytest.importorskip("torch")
    np.testing.assert_allclose(ours([first, second], 100), pytorchs(torch, [first, second], 100),
                               rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", CHAINABLE)
def test_a_step_size_set_by_hand_is_kept_as_in_pytorch(name):
    torch = pytest.importorskip("torch")
    np.testing.assert_allclose(ours([name], 100, by_hand=(20, 0.5)),
                               pytorchs(torch, [name], 100, by_hand=(20, 0.5)),
                               rtol=1e-12, atol=1e-15)


def test_a_linear_decay_to_zero_ends_at_zero_where_pytorch_rounds_below_it():
    torch = pytest.importorskip("torch")
    model = nn.Linear(1, in_size=2)
    below = 0
    for total in (3, 4, 5, 10):
        for start in (1.0, 0.5, 1 / 3, 0.1):
            kwargs = {"start_factor": start, "end_factor": 0.0, "total_iters": total}
            opt = optim.SGD(model.parameters(), lr=0.1)
            scheduler = sched.LinearLR(opt, **kwargs)
            topt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
            tscheduler = torch.optim.lr_scheduler.LinearLR(topt, **kwargs)
            for _ in range(total + 2):
                model.cleargrads()
                F.sum(model(np.ones((1, 2), np.float32))).backward()
                opt.step()  # trains on: a step size of 0 updates nothing
                scheduler.step()
                topt.step()
                tscheduler.step()
                theirs = topt.param_groups[0]["lr"]
                below += theirs < 0.0
                assert opt.lr == max(theirs, 0.0) and scheduler.get_last_lr() == [opt.lr]
            assert 0.0 <= opt.lr < 1e-15  # zero, or a rounding error above it as PyTorch's
    assert below > 0  # PyTorch's recursion did land below zero: the case is exercised
    older = scheduler.state_dict()  # as an older gradcore saved it: the last step size alone
    del older["optimizer_lr"]
    older["last_lr"] = -1.8503717077085946e-18
    sched.LinearLR(opt, **kwargs).load_state_dict(older)
    assert opt.lr == 0.0
    with pytest.raises(ValueError, match="lr must be a finite number >= 0"):
        sched.LinearLR(optim.SGD(model.parameters(), lr=0.1))._set(-1e-3)  # a real negative


def test_warm_up_then_decay_multiply_and_share_the_initial_lr():
    opt = optim.SGD(nn.Linear(2, in_size=3).parameters(), lr=0.1)
    warm = sched.LinearLR(opt, start_factor=0.1, total_iters=5)
    decay = sched.ExponentialLR(opt, gamma=0.9)
    assert opt.initial_lr == warm.base_lr == decay.base_lr == 0.1  # not the warmed-up 0.01
    seen = [opt.lr]
    for _ in range(10):
        warm.step()
        decay.step()
        seen.append(opt.lr)
    factors = [0.1 + 0.9 * min(k, 5) / 5 for k in range(11)]
    assert seen == pytest.approx([0.1 * f * 0.9 ** k for k, f in enumerate(factors)], rel=1e-12)


def test_a_step_size_set_by_hand_is_decayed_from():
    opt = optim.SGD(lr=0.1).setup(nn.Linear(2, in_size=3))
    step = sched.StepLR(opt, step_size=10, gamma=0.1)
    seen = []
    for epoch in range(12):
        if epoch == 3:
            opt.lr = 0.5
        step.step()
        seen.append(opt.lr)
    assert seen == pytest.approx([0.1] * 3 + [0.5] * 6 + [0.05] * 3, rel=1e-12)
    assert step.get_last_lr() == [opt.lr]


def test_closed_forms_without_pytorch():
    # one schedule alone, its step size never set by hand: the same as the closed form
    opt = optim.MomentumSGD(lr=1.0).setup(nn.Linear(2, in_size=3))
    assert rates(sched.StepLR(opt, step_size=2, gamma=0.5), opt, "lr", 5) == [
        1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    opt.lr = 1.0
    cos = rates(sched.CosineAnnealingLR(opt, T_max=4), opt, "lr", 4)
    assert cos == pytest.approx([1.0, (1 + math.cos(math.pi / 4)) / 2, 0.5,
                                 (1 + math.cos(3 * math.pi / 4)) / 2, 0.0])


def test_adam_schedules_alpha_in_either_style():
    model = nn.Linear(2, in_size=3)
    for opt in (optim.Adam(alpha=0.01).setup(model), optim.Adam(model.parameters(), lr=0.01)):
        scheduler = sched.ExponentialLR(opt, gamma=0.5)
        scheduler.step()
        assert opt.alpha == 0.005 and scheduler.get_last_lr() == [0.005]


def test_state_dict_resumes_the_schedule():
    opt = optim.SGD(lr=0.2).setup(nn.Linear(2, in_size=3))
    first = sched.StepLR(opt, step_size=3, gamma=0.1)
    for _ in range(4):
        first.step()
    saved = first.state_dict()
    opt2 = optim.SGD(lr=0.2).setup(nn.Linear(2, in_size=3))
    second = sched.StepLR(opt2, step_size=3, gamma=0.1)
    second.load_state_dict(saved)
    assert opt2.lr == opt.lr == pytest.approx(0.02)
    first.step(), second.step()
    assert opt2.lr == opt.lr
    with pytest.raises(KeyError, match="unknown keys"):
        second.load_state_dict({"milestones": [1]})


def test_one_cycle_linear_ends_at_its_floor_after_the_last_batch():
    """The step after the last batch (PyTorch allows it) goes past the end of the line: the step
    size stays at the floor instead of going below zero, which the optimizer refuses."""
    opt = optim.SGD(lr=0.1).setup(nn.Linear(2, in_size=3))
    scheduler = sched.OneCycleLR(opt, max_lr=1.0, total_steps=40, anneal_strategy="linear")
    seen = rates(scheduler, opt, "lr", 40)
    peak = 0.3 * 40 - 1
    line = [0.04 + (1 - 0.04) * k / peak if k <= peak else
            1 + (4e-6 - 1) * (k - peak) / (39 - peak) for k in range(40)]
    assert seen[:40] == pytest.approx(line, rel=1e-12)
    assert seen[40] == pytest.approx(4e-6, rel=1e-12)


@pytest.mark.parametrize("mode, first", [("min", math.nan), ("min", math.inf),
                                         ("max", -math.inf), ("max", math.nan)])
def test_reduce_on_plateau_counts_a_nan_or_infinite_first_metric_as_no_improvement(mode, first):
    """As PyTorch's: NaN is never better, nor the infinity the best starts at."""
    opt = optim.SGD(lr=0.1).setup(nn.Linear(2, in_size=3))
    plateau = sched.ReduceLROnPlateau(opt, mode=mode, factor=0.5, patience=1)
    seen = []
    for metric in [first] + [math.nan] * 5:
        plateau.step(metric)
        seen.append(opt.lr)
    assert seen == pytest.approx([0.1, 0.05, 0.05, 0.025, 0.025, 0.0125], rel=1e-12)


def test_reduce_on_plateau():
    opt = optim.SGD(lr=1.0).setup(nn.Linear(2, in_size=3))
    plateau = sched.ReduceLROnPlateau(opt, factor=0.5, patience=2, cooldown=1, min_lr=0.2)
    seen = []
    for metric in [5, 4, 4, 4, 4, 4, 4, 4, 4, 3, 3, 3, 3, 3, 3, 3]:
        plateau.step(gradcore.Variable(np.array(float(metric))))
        seen.append(opt.lr)
    # as torch.optim.lr_scheduler.ReduceLROnPlateau gives for the same metrics: 3 steps without
    # improvement halve the rate, the cooldown step counts none, and 0.2 is the floor
    assert seen == [1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25, 0.2, 0.2, 0.2, 0.2]


def test_a_schedule_changes_a_compiled_steps_rate():
    model = nn.Linear(1, in_size=1)
    opt = optim.SGD(lr=0.5).setup(model)
    scheduler = sched.StepLR(opt, step_size=1, gamma=0.5)

    @gradcore.compile
    def step(x):
        loss = gradcore.functions.sum(model(x))
        model.cleargrads()
        loss.backward()
        opt.update()
        return loss

    x = np.ones((1, 1))
    moves = []
    for _ in range(5):
        before = float(model.b.data[0])
        step(x)
        moves.append(before - float(model.b.data[0]))  # lr * d loss / d b = lr
        scheduler.step()
    assert moves == [0.5, 0.25, 0.125, 0.0625, 0.03125]
    assert step.stats()["replays"] == 4


def test_bad_arguments():
    opt = optim.SGD(lr=1.0).setup(nn.Linear(2, in_size=3))
    with pytest.raises(ValueError, match="step_size must be a positive int"):
        sched.StepLR(opt, step_size=0)
    with pytest.raises(ValueError, match="anneal_strategy"):
        sched.OneCycleLR(opt, max_lr=1, total_steps=10, anneal_strategy="exp")
    one = sched.OneCycleLR(opt, max_lr=1, total_steps=3)
    for _ in range(3):
        one.step()
    with pytest.raises(ValueError, match="total_steps"):
        one.step()
    assert one.last_epoch == 3  # the refused step is not counted


@pytest.mark.parametrize("name, arguments, message", [
    ("StepLR", {"step_size": 2, "gamma": -0.5}, "gamma must be a finite number >= 0, got -0.5"),
    ("MultiStepLR", {"milestones": [2], "gamma": -1}, "gamma must be a finite number >= 0, got "
                                                       "-1.0"),
    ("ExponentialLR", {"gamma": -0.5}, "gamma must be a finite number >= 0, got -0.5"),
    ("ExponentialLR", {"gamma": math.nan}, "gamma must be a finite number >= 0, got nan"),
    ("CosineAnnealingLR", {"T_max": 4, "eta_min": -0.05}, "eta_min must be a finite number >= 0, "
                                                          "got -0.05")])
def test_a_gamma_or_eta_min_below_zero_is_refused_by_the_constructor(name, arguments, message):
    # a later step would make a step size below zero, which the optimizer refuses
    opt = optim.SGD(lr=0.1).setup(nn.Linear(2, in_size=3))
    with pytest.raises(ValueError, match=f"{name}: {re.escape(message)}"):
        getattr(sched, name)(opt, **arguments)
    assert opt.initial_lr is None and opt.lr == 0.1


def test_a_step_the_optimizer_refuses_is_not_counted():
    opt = optim.SGD(lr=0.1).setup(nn.Linear(2, in_size=3))
    growth = sched.ExponentialLR(opt, gamma=1e300)
    growth.step()
    assert opt.lr == pytest.approx(1e299) and growth.last_epoch == 1
    with pytest.raises(ValueError, match="lr must be a finite number >= 0, got inf"):
        growth.step()  # 1e299 * 1e300 is inf
    assert growth.last_epoch == 1 and opt.lr == growth.get_last_lr()[0] == pytest.approx(1e299)
    opt.lr = 1e-300  # set by hand: the schedule goes on from it, at the step it was at
    growth.step()
    assert growth.last_epoch == 2 and opt.lr == pytest.approx(1.0)


@pytest.mark.parametrize("milestones", [[2.5], [3, -1], ["2"], [True], [float("inf")]])
def test_a_milestone_that_is_not_a_step_count_is_refused(milestones):
    # int(2.5) would put a milestone at step 2, where PyTorch's count never reaches 2.5
    opt = optim.SGD(lr=0.1).setup(nn.Linear(2, in_size=3))
    bad = next(m for m in milestones if not isinstance(m, int) or isinstance(m, bool) or m < 0)
    with pytest.raises(ValueError, match=re.escape(
            f"MultiStepLR: each milestone must be an int >= 0 (a step count), got {bad!r}")):
        sched.MultiStepLR(opt, milestones, gamma=0.5)
    assert opt.initial_lr is None and opt.lr == 0.1


def test_a_milestone_may_be_an_integral_float_as_epochs_times_a_fraction():
    # MultiStepLR(opt, [epochs * 0.5, epochs * 0.75]): 2.0 and 3.0 count as steps 2 and 3
    opt = optim.SGD(lr=1.0).setup(nn.Linear(2, in_size=3))
    decay = sched.MultiStepLR(opt, [4 * 0.5, np.float64(4 * 0.75)], gamma=0.5)
    lrs = [opt.lr]
    for _ in range(3):
        decay.step()
        lrs.append(opt.lr)
    assert lrs == [1.0, 1.0, 0.5, 0.25]


def test_milestones_may_be_numpy_integers():
    opt = optim.SGD(lr=0.1).setup(nn.Linear(2, in_size=3))
    decay = sched.MultiStepLR(opt, np.array([2, 0]), gamma=0.5)  # 0: applies at once
    assert decay.milestones == [0, 2] and all(type(m) is int for m in decay.milestones)
    assert rates(decay, opt, "lr", 3) == pytest.approx([0.05, 0.05, 0.025, 0.025])


@pytest.mark.parametrize("arguments, message", [
    ({"max_lr": math.nan}, "max_lr must be a finite number >= 0, got nan"),
    ({"max_lr": -1.0}, "max_lr must be a finite number >= 0, got -1.0"),
    ({"max_lr": 1.0, "div_factor": 0}, "div_factor must be > 0, got 0"),
    ({"max_lr": 1.0, "final_div_factor": 0.0}, "final_div_factor must be > 0, got 0.0")])
def test_a_refused_one_cycle_names_its_argument_and_leaves_the_optimizer_as_it_was(arguments,
                                                                                   message):
    opt = optim.SGD(lr=0.1).setup(nn.Linear(2, in_size=3))
    with pytest.raises(ValueError, match=f"OneCycleLR: {re.escape(message)}"):
        sched.OneCycleLR(opt, total_steps=10, **arguments)
    assert opt.initial_lr is None and opt.lr == 0.1
    # a later schedule starts from the optimizer's own step size, not the refused one's
    assert rates(sched.CosineAnnealingLR(opt, T_max=2), opt, "lr", 5) == pytest.approx(
        [0.1, 0.05, 0.0, 0.05, 0.1, 0.05])


def test_a_schedule_refused_at_its_first_step_records_no_initial_lr():
    class Negative(sched.LRScheduler):
        def rate(self, step):
            return -self.base_lr  # the optimizer refuses it at the constructor's first step

    opt = optim.SGD(lr=0.1).setup(nn.Linear(2, in_size=3))
    with pytest.raises(ValueError, match="lr must be a finite number >= 0"):
        Negative(opt)
    assert opt.initial_lr is None and opt.lr == 0.1


def test_a_one_cycle_refused_at_its_first_step_keeps_the_earlier_initial_lr():
    opt = optim.MomentumSGD(lr=0.1).setup(nn.Linear(2, in_size=3))
    sched.StepLR(opt, step_size=1, gamma=0.5)  # records initial_lr = 0.1
    with pytest.raises(ValueError, match="lr must be a finite number >= 0, got inf"):
        # max_lr / div_factor is inf: the first step size is refused
        sched.OneCycleLR(opt, max_lr=1.0, total_steps=10, div_factor=1e-310)
    assert opt.initial_lr == 0.1 and opt.lr == 0.1
    assert sched.StepLR(opt, step_size=1, gamma=0.5).base_lr == 0.1



@pytest.mark.parametrize("name", SCHEDULES)
def test_stepped_alone_a_schedule_follows_its_closed_form(name):
    opt = optim.SGD(nn.Linear(2, in_size=3).parameters(), lr=0.1)
    scheduler = getattr(sched, name)(opt, **SCHEDULES[name])
    np.testing.assert_allclose(rates(scheduler, opt, "lr", STEPS),
                               [scheduler.rate(k) for k in range(STEPS + 1)], rtol=1e-9)


# ---------------------------------------------------------------- resuming
def trained_for(steps, name="StepLR", **kwargs):
    """An optimizer and its schedule after `steps` steps."""
    opt = optim.SGD(nn.Linear(2, in_size=3).parameters(), lr=0.1)
    scheduler = getattr(sched, name)(opt, **(kwargs or SCHEDULES[name]))
    for _ in range(steps):
        scheduler.step()
    return opt, scheduler


def test_resuming_with_last_epoch_starts_from_the_saved_initial_lr():
    opt, _ = trained_for(15, "StepLR", step_size=10, gamma=0.1)
    saved = opt.state_dict()
    assert saved["initial_lr"] == 0.1
    resumed = optim.SGD(nn.Linear(2, in_size=3).parameters(), lr=0.1)
    resumed.load_state_dict(saved)
    scheduler = sched.StepLR(resumed, step_size=10, gamma=0.1, last_epoch=14)
    assert scheduler.base_lr == resumed.initial_lr == 0.1
    assert resumed.lr == pytest.approx(0.01)  # as saved: not decayed again
    for _ in range(5):
        scheduler.step()
    assert resumed.lr == pytest.approx(0.001) and scheduler.last_epoch == 20


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("steps", [7, 12, 30])  # 7, 30: a step or milestone just passed
def test_a_resumed_schedule_goes_on_as_one_never_stopped(name, steps):
    opt, scheduler = trained_for(steps, name)
    resumed = optim.SGD(nn.Linear(2, in_size=3).parameters(), lr=0.3)
    resumed.load_state_dict(opt.state_dict())
    again = getattr(sched, name)(resumed, **SCHEDULES[name], last_epoch=steps - 1)
    # PyTorch's StepLR and MultiStepLR decay once more at a resumed step or milestone here;
    # every other schedule of PyTorch's agrees with these
    assert rates(again, resumed, "lr", 20) == pytest.approx(rates(scheduler, opt, "lr", 20),
                                                            rel=1e-12)


def torch_resumed(torch, name, steps, by_hand, more):
    """PyTorch's step sizes after a save at `steps` with lr set `by_hand` just before it, resumed
    in the documented order: optimizer.load_state_dict, make the schedule, its load_state_dict."""
    import copy

    def made():
        topt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
        return topt, getattr(torch.optim.lr_scheduler, name)(topt, **SCHEDULES[name])
    topt, tsched = made()
    for _ in range(steps):
        topt.step()
        tsched.step()
    topt.param_groups[0]["lr"] = by_hand
    saved = copy.deepcopy((topt.state_dict(), tsched.state_dict()))
    topt, tsched = made()
    topt.load_state_dict(saved[0])
    tsched.load_state_dict(saved[1])
    seen = [topt.param_groups[0]["lr"]]
    for _ in range(more):
        topt.step()
        tsched.step()
        seen.append(topt.param_groups[0]["lr"])
    return seen


@pytest.mark.parametrize("cls", [optim.SGD, optim.Adam])
@pytest.mark.parametrize("name", CHAINABLE)
def test_a_step_size_set_by_hand_before_the_save_is_kept_by_either_resume(name, cls):
    rate = "alpha" if cls is optim.Adam else "lr"
    opt = cls(nn.Linear(2, in_size=3).parameters(), lr=0.1)
    scheduler = getattr(sched, name)(opt, **SCHEDULES[name])
    for _ in range(12):
        scheduler.step()
    setattr(opt, rate, 0.7)  # by hand, after the schedule's last step
    saved = opt.state_dict(), scheduler.state_dict()
    by_state = cls(nn.Linear(2, in_size=3).parameters(), lr=0.3)
    by_state.load_state_dict(saved[0])
    again = getattr(sched, name)(by_state, **SCHEDULES[name])  # LinearLR: lr * start_factor
    again.load_state_dict(saved[1])
    by_epoch = cls(nn.Linear(2, in_size=3).parameters(), lr=0.3)
    by_epoch.load_state_dict(saved[0])
    again_by_epoch = getattr(sched, name)(by_epoch, **SCHEDULES[name],
                                          last_epoch=saved[1]["last_epoch"] - 1)
    uninterrupted = rates(scheduler, opt, rate, 20)
    assert uninterrupted[0] == 0.7
    assert rates(again, by_state, rate, 20) == pytest.approx(uninterrupted, rel=1e-12)
    assert rates(again_by_epoch, by_epoch, rate, 20) == pytest.approx(uninterrupted, rel=1e-12)
    torch = pytest.importorskip("torch")
    if name != "LinearLR":  # PyTorch's LinearLR resumed so is start_factor times too low
        assert uninterrupted == pytest.approx(torch_resumed(torch, name, 12, 0.7, 20),
                                              rel=1e-12)


def test_several_schedules_on_one_optimizer_load_in_any_order():
    opt, first = trained_for(6, "LinearLR")
    second = sched.ExponentialLR(opt, gamma=0.9)
    for _ in range(3):
        first.step()
        second.step()
    saved = opt.state_dict(), first.state_dict(), second.state_dict()
    resumed = optim.SGD(nn.Linear(2, in_size=3).parameters(), lr=0.3)
    resumed.load_state_dict(saved[0])
    again = [sched.LinearLR(resumed, **SCHEDULES["LinearLR"]),
             sched.ExponentialLR(resumed, gamma=0.9)]
    again[1].load_state_dict(saved[2])  # the second one first
    again[0].load_state_dict(saved[1])
    assert resumed.lr == opt.lr
    for _ in range(5):
        for scheduler in (first, second, *again):
            scheduler.step()
        assert resumed.lr == pytest.approx(opt.lr, rel=1e-12)


def test_last_epoch_and_sizes_may_be_numpy_integers():
    opt, _ = trained_for(15, "StepLR", step_size=10, gamma=0.1)
    for last_epoch in (np.int64(14), np.array(14), np.int32(14)):  # read back from a file
        resumed = optim.SGD(nn.Linear(2, in_size=3).parameters(), lr=0.1)
        resumed.load_state_dict(opt.state_dict())
        scheduler = sched.StepLR(resumed, step_size=np.int64(10), gamma=0.1,
                                 last_epoch=last_epoch)
        assert type(scheduler.last_epoch) is int and scheduler.last_epoch == 15
        assert type(scheduler.step_size) is int and resumed.lr == pytest.approx(0.01)
    for bad in (True, 14.0, np.array(14.0), np.array([14])):
        with pytest.raises(ValueError, match="last_epoch must be an int >= -1"):
            sched.StepLR(resumed, step_size=10, last_epoch=bad)


def test_the_constructor_takes_the_first_step_through_a_subclasss_step():
    def logged(base):
        class Logged(base):
            def __init__(self, *args, **kwargs):
                self.history = []
                super().__init__(*args, **kwargs)

            def step(self, *args):
                super().step(*args)
                self.history.append(self.get_last_lr()[0])
        return Logged

    opt = optim.SGD(nn.Linear(2, in_size=3).parameters(), lr=1.0)
    ours = logged(sched.LinearLR)(opt, start_factor=0.5, total_iters=2)
    assert ours.history == [0.5] and ours.last_epoch == 0  # the first step: start_factor
    ours.step()
    assert ours.history == [0.5, 0.75]
    assert "_initial" not in ours.state_dict() and not ours._initial
    torch = pytest.importorskip("torch")
    topt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
    theirs = logged(torch.optim.lr_scheduler.LinearLR)(topt, start_factor=0.5, total_iters=2)
    topt.step()
    theirs.step()
    assert theirs.history == pytest.approx(ours.history, rel=1e-12)


def test_resuming_without_an_initial_lr_says_what_to_do():
    opt = optim.SGD(nn.Linear(2, in_size=3).parameters(), lr=0.01)
    with pytest.raises(KeyError, match="no initial_lr.*Load the optimizer's state_dict"):
        sched.StepLR(opt, step_size=10, last_epoch=14)
    assert opt.lr == 0.01 and opt.initial_lr is None
    opt.initial_lr = 0.1  # or say where it started
    assert sched.StepLR(opt, step_size=10, last_epoch=14).base_lr == 0.1
    with pytest.raises(ValueError, match="last_epoch must be an int >= -1"):
        sched.StepLR(opt, step_size=10, last_epoch=-2)


def test_the_initial_lr_survives_the_optimizers_state_dict():
    opt, _ = trained_for(3, "ExponentialLR")
    other = optim.SGD(nn.Linear(2, in_size=3).parameters(), lr=0.5)
    other.load_state_dict(opt.state_dict())
    assert other.initial_lr == 0.1 and other.lr == opt.lr
    older = opt.state_dict()
    del older["initial_lr"]  # a state_dict from before initial_lr was saved: left as it is
    other.load_state_dict(older)
    assert other.initial_lr == 0.1


def test_loading_a_schedule_sets_the_step_size_it_set_last():
    opt, first = trained_for(4, "LinearLR")
    opt2, second = trained_for(0, "LinearLR")
    second.load_state_dict(first.state_dict())
    assert opt2.lr == opt.lr == second.get_last_lr()[0]
    older = first.state_dict()
    del older["last_lr"]  # saved by an older gradcore: the closed form
    opt3, third = trained_for(0, "LinearLR")
    third.load_state_dict(older)
    assert opt3.lr == pytest.approx(opt.lr, rel=1e-12)


# ---------------------------------------------------------------- OneCycleLR
@pytest.mark.parametrize("cls, name, theirs", [
    (optim.Adam, "beta1", "Adam"), (optim.AdamW, "beta1", "AdamW"),
    (optim.MomentumSGD, "momentum", "SGD")])
def test_one_cycle_cycles_momentum_as_pytorch(cls, name, theirs):
    torch = pytest.importorskip("torch")
    opt = cls(nn.Linear(2, in_size=3).parameters(), lr=0.1)
    scheduler = sched.OneCycleLR(opt, max_lr=1.0, total_steps=30)
    extra = {"momentum": 0.9} if theirs == "SGD" else {}
    topt = getattr(torch.optim, theirs)([torch.nn.Parameter(torch.zeros(2))], lr=0.1, **extra)
    tscheduler = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=1.0, total_steps=30)
    group = topt.param_groups[0]

    def theirs_now():
        return group["betas"][0] if name == "beta1" else group["momentum"]

    seen, expected = [getattr(opt, name)], [theirs_now()]
    for _ in range(30):
        scheduler.step()
        topt.step()
        tscheduler.step()
        seen.append(getattr(opt, name))
        expected.append(theirs_now())
    np.testing.assert_allclose(seen, expected, rtol=1e-12)


@pytest.mark.parametrize("arguments", [
    {"epochs": 6, "steps_per_epoch": 5}, {"total_steps": 30, "three_phase": True},
    {"total_steps": 37, "three_phase": True, "pct_start": 0.25, "anneal_strategy": "linear"},
    {"total_steps": 50, "three_phase": True, "pct_start": 0.45},
    {"total_steps": 13, "three_phase": True, "pct_start": 0.55}])  # its trough past the end
def test_one_cycle_takes_pytorchs_epochs_and_three_phases(arguments):
    """OneCycleLR(opt, max_lr, epochs=, steps_per_epoch=) and three_phase=True raised TypeError;
    the step size and momentum of each step are PyTorch's."""
    torch = pytest.importorskip("torch")
    opt = optim.MomentumSGD(nn.Linear(2, in_size=3).parameters(), lr=0.1)
    scheduler = sched.OneCycleLR(opt, 1.0, **arguments)
    topt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, momentum=0.9)
    tscheduler = torch.optim.lr_scheduler.OneCycleLR(topt, 1.0, **arguments)
    group = topt.param_groups[0]
    for _ in range(scheduler.total_steps - 1):
        assert (opt.lr, opt.momentum) == (group["lr"], group["momentum"])
        scheduler.step()
        topt.step()
        tscheduler.step()
    state = scheduler.state_dict()  # one saved before three_phase was: two phases
    del state["three_phase"]
    scheduler.load_state_dict(state)
    assert scheduler.three_phase is False


@pytest.mark.parametrize("arguments, message", [
    ({}, "give total_steps, or epochs and steps_per_epoch"),
    ({"total_steps": 10, "epochs": 2}, "not both")])
def test_one_cycle_refuses_a_length_it_cannot_tell(arguments, message):
    opt = optim.MomentumSGD(nn.Linear(2, in_size=3).parameters(), lr=0.1)
    with pytest.raises(ValueError, match=message):
        sched.OneCycleLR(opt, 1.0, **arguments)
    assert opt.lr == 0.1


def test_one_cycle_momentum_goes_down_to_the_peak_and_back():
    opt = optim.Adam(nn.Linear(2, in_size=3).parameters(), lr=0.1)
    scheduler = sched.OneCycleLR(opt, max_lr=1.0, total_steps=11, pct_start=0.5)  # peak: 4.5
    betas = [opt.beta1] + [scheduler.step() or opt.beta1 for _ in range(10)]
    assert betas[0] == pytest.approx(0.95) and betas[-1] == pytest.approx(0.95)
    # steps 4 and 5 are either side of the peak: 0.5 / 5.5 of the way down from it at step 5
    assert min(betas) == betas[5] == pytest.approx(0.85 + 0.1 * (1 - math.cos(math.pi / 11)) / 2)
    assert betas[:6] == sorted(betas[:6], reverse=True) and betas[5:] == sorted(betas[5:])
    assert opt.beta2 == 0.999

    kept = optim.Adam(nn.Linear(2, in_size=3).parameters(), lr=0.1)
    scheduler = sched.OneCycleLR(kept, max_lr=1.0, total_steps=11, cycle_momentum=False)
    scheduler.step()
    assert kept.beta1 == 0.9
    plain = optim.SGD(nn.Linear(2, in_size=3).parameters())  # no momentum: the lr only
    sched.OneCycleLR(plain, max_lr=1.0, total_steps=11).step()
    with pytest.raises(ValueError, match="max_momentum must be .* < 1"):
        sched.OneCycleLR(optim.Adam(lr=0.1), max_lr=1.0, total_steps=11, max_momentum=1.0)


@pytest.mark.parametrize("total_steps, pct_start", [(10, 0.1), (20, 0.05), (10, 0.05)])
def test_one_cycle_with_a_warm_up_of_at_most_one_step_starts_at_or_under_max_lr(total_steps,
                                                                              pct_start):
    opt = optim.MomentumSGD(nn.Linear(2, in_size=3).parameters(), lr=0.1)
    scheduler = sched.OneCycleLR(opt, max_lr=1.0, total_steps=total_steps, pct_start=pct_start)
    first_momentum = opt.momentum
    seen = rates(scheduler, opt, "lr", total_steps - 1)
    peak = pct_start * total_steps - 1  # at or before step 0: no warm-up
    down = [(k - peak) / (total_steps - 1 - peak) for k in range(total_steps)]
    min_lr = 1.0 / 25 / 1e4
    assert seen == pytest.approx([min_lr + (1 - min_lr) * (1 + math.cos(math.pi * d)) / 2
                                  for d in down], rel=1e-12)
    if peak == 0:  # at the peak from the start
        assert seen[0] == 1.0 and first_momentum == 0.85
    assert seen[-1] == pytest.approx(min_lr)


def test_a_schedule_written_as_a_closed_form_only_still_works():
    class Halving(sched.LRScheduler):  # the extension point before schedules were chainable
        def rate(self, step):
            return self.base_lr / 2 ** step

    opt = optim.SGD(lr=1.0).setup(nn.Linear(2, in_size=3))
    assert rates(Halving(opt), opt, "lr", 3) == [1.0, 0.5, 0.25, 0.125]


def read_back_through_npz(state, tmp_path):
    """`state` written with numpy.savez and read with numpy.load: every value an array."""
    np.savez(tmp_path / "state.npz", **state)
    with np.load(tmp_path / "state.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.mark.parametrize("name", SCHEDULES)  # OneCycleLR on SGD: a momentum_name of ""
def test_a_schedule_resumes_from_its_state_read_back_through_npz(name, tmp_path):
    opt, first = trained_for(4, name)
    opt2, second = trained_for(0, name)
    second.load_state_dict(read_back_through_npz(first.state_dict(), tmp_path))
    assert second.state_dict() == first.state_dict()
    assert {k: type(v) for k, v in vars(second).items()} == {k: type(v) for k, v in
                                                            vars(first).items()}
    assert rates(second, opt2, "lr", 5) == rates(first, opt, "lr", 5)


def test_reduce_on_plateau_resumes_from_its_state_read_back_through_npz(tmp_path):
    opt = optim.SGD(nn.Linear(2, in_size=3).parameters(), lr=1.0)
    first = sched.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    for metric in (3.0, 2.0, 2.0):
        first.step(metric)
    second = sched.ReduceLROnPlateau(optim.SGD(nn.Linear(2, in_size=3).parameters(), lr=1.0))
    second.load_state_dict(read_back_through_npz(first.state_dict(), tmp_path))
    assert second.state_dict() == first.state_dict() and type(second.best) is float


def test_a_refused_state_leaves_the_schedule_as_it_was():
    opt, scheduler = trained_for(4, "StepLR")
    before, lr = dict(vars(scheduler)), opt.lr
    _, exponential = trained_for(2, "ExponentialLR")
    with pytest.raises(KeyError, match=r"missing keys \['step_size'\]; was this saved by "
                       "another kind of scheduler"):
        scheduler.load_state_dict(exponential.state_dict())
    with pytest.raises(ValueError, match="the state schedules the optimizer's 'alpha'"):
        scheduler.load_state_dict(dict(scheduler.state_dict(), name="alpha", last_epoch=9))
    with pytest.raises(ValueError, match=r"step_size must be an int, got ndarray array\(2.5\)"):
        scheduler.load_state_dict(dict(scheduler.state_dict(), step_size=np.asarray(2.5),
                                       last_epoch=9))
    plateau = sched.ReduceLROnPlateau(opt)
    plateau_before = dict(vars(plateau))
    with pytest.raises(ValueError, match="patience must be an int, got str 'x'"):
        plateau.load_state_dict(dict(plateau.state_dict(), patience="x", best=1.0))
    assert vars(scheduler) == before and opt.lr == lr and vars(plateau) == plateau_before


def test_a_state_the_optimizer_refuses_changes_neither_it_nor_the_schedule():
    opt, scheduler = trained_for(4, "StepLR")
    before, lr = dict(vars(scheduler)), opt.lr
    older = dict(scheduler.state_dict(), last_lr=-0.5, last_epoch=9)  # a step size below 0
    del older["optimizer_lr"]
    with pytest.raises(ValueError, match="lr must be a finite number >= 0, got -0.5"):
        scheduler.load_state_dict(older)
    assert vars(scheduler) == before and opt.lr == lr
    momentum = optim.MomentumSGD(nn.Linear(2, in_size=3).parameters(), lr=0.1)
    cycle = sched.OneCycleLR(momentum, **SCHEDULES["OneCycleLR"])
    rates(cycle, momentum, "lr", 4)
    before, lr, beta = dict(vars(cycle)), momentum.lr, momentum.momentum
    with pytest.raises(ValueError, match=r"OneCycleLR: stepped 900 times for total_steps=301"):
        cycle.load_state_dict(dict(cycle.state_dict(), last_epoch=900, optimizer_lr=0.3))
    assert vars(cycle) == before and (momentum.lr, momentum.momentum) == (lr, beta)


def test_a_subclass_loads_its_own_state_whatever_its_attributes_hold():
    class Custom(sched.LRScheduler):
        def __init__(self, optimizer, extra):
            self.extra, self.seen = extra, None  # seen: a float once the schedule has run
            super().__init__(optimizer)

        def rate(self, step):
            if step > 0:
                self.seen = 0.5
            return self.base_lr

    for extra in (3, True, (2, 4), {"a": 1}, [0.5, 0.25]):
        ran = Custom(optim.SGD(lr=0.1).setup(nn.Linear(1, in_size=1)), extra)
        ran.step()
        fresh = Custom(optim.SGD(lr=0.1).setup(nn.Linear(1, in_size=1)), extra)
        fresh.load_state_dict(ran.state_dict())
        assert fresh.extra == extra and fresh.seen == 0.5 and fresh.last_epoch == 1


REFUSED_STATES = [  # (schedule, its arguments, a saved value its constructor refuses)
    ("StepLR", {"step_size": 2, "gamma": 0.5}, {"gamma": -0.5}),
    ("StepLR", {"step_size": 2, "gamma": 0.5}, {"step_size": -3}),
    ("StepLR", {"step_size": 2, "gamma": 0.5}, {"step_size": 0}),
    ("ExponentialLR", {"gamma": 0.5}, {"gamma": math.inf}),
    ("CosineAnnealingLR", {"T_max": 5}, {"eta_min": -0.05}),
    ("CosineAnnealingLR", {"T_max": 5}, {"T_max": 0}),
    ("LinearLR", {"start_factor": 0.5, "total_iters": 4}, {"end_factor": 5.0}),
    ("LinearLR", {"start_factor": 0.5, "total_iters": 4}, {"start_factor": 0.0}),
    ("MultiStepLR", {"milestones": [2], "gamma": 0.5}, {"milestones": [-1, 3]}),
    ("OneCycleLR", {"max_lr": 0.5, "total_steps": 10}, {"anneal_strategy": "cubic"}),
    ("OneCycleLR", {"max_lr": 0.5, "total_steps": 10}, {"min_lr": -1.0}),
    ("ReduceLROnPlateau", {}, {"patience": -2}),
    ("ReduceLROnPlateau", {}, {"mode": "avg"}),
    ("ReduceLROnPlateau", {}, {"factor": -1.0}),
    ("ReduceLROnPlateau", {}, {"min_lr": math.nan}),
    ("ReduceLROnPlateau", {}, {"cooldown_counter": -1}),
]


@pytest.mark.parametrize("name, arguments, change", REFUSED_STATES,
                         ids=[f"{n}-{next(iter(c))}" for n, _, c in REFUSED_STATES])
def test_a_state_with_a_value_the_constructor_refuses_is_refused(name, arguments, change):
    # checked as the constructor checks its arguments, before anything changes: else the
    # schedule changes silently (step_size=-3) or fails at a later step (T_max=0)
    opt = optim.SGD([gradcore.Parameter(np.zeros(2))], lr=0.1)
    scheduler = getattr(sched, name)(opt, **arguments)
    state = dict(scheduler.state_dict(), **change)
    before, lr = dict(vars(scheduler)), opt.lr
    key = next(iter(change)).rstrip("s")  # "each milestone must be"
    with pytest.raises(ValueError, match=rf"{name}.load_state_dict: .*{key}.*"
                                         "the schedule was left as it was"):
        scheduler.load_state_dict(state)
    assert vars(scheduler) == before and opt.lr == lr


@pytest.mark.parametrize("arguments, message", [
    ({"min_lr": -1.0}, "min_lr must be a finite number >= 0, got -1.0"),
    ({"min_lr": math.nan}, "min_lr must be a finite number >= 0, got nan"),
    ({"eps": math.nan}, "eps must be a finite number >= 0, got nan"),
    ({"eps": -1.0}, "eps must be a finite number >= 0, got -1.0"),
    ({"threshold": math.nan}, "threshold must be a finite number >= 0, got nan"),
    ({"threshold": -0.5}, "threshold must be a finite number >= 0, got -0.5"),
    ({"patience": -1}, "patience must be an int >= 0, got -1"),
    ({"patience": 2.5}, "patience must be an int >= 0, got 2.5"),
    ({"cooldown": -3}, "cooldown must be an int >= 0, got -3"),
])
def test_reduce_on_plateau_refuses_what_would_never_or_always_reduce(arguments, message):
    # eps=nan never reduces, threshold=nan reduces while the metric improves, patience=-1
    # reduces at every step: refused as the other schedules refuse such values
    opt = optim.SGD([gradcore.Parameter(np.zeros(2))], lr=0.1)
    with pytest.raises(ValueError, match=re.escape(message)):
        sched.ReduceLROnPlateau(opt, **arguments)
    plateau = sched.ReduceLROnPlateau(opt, patience=0, threshold=0.0, cooldown=2)
    assert (plateau.patience, plateau.threshold, plateau.cooldown) == (0, 0.0, 2)
