"""Learning-rate schedules: closed forms, both optimizer styles, state_dict, and PyTorch's."""
import math

import numpy as np
import pytest

import gradcore
from gradcore import nn, optim
from gradcore.optim import lr_scheduler as sched

SCHEDULES = [  # (ours, PyTorch's name, keyword arguments), stepped 40 times
    (sched.StepLR, "StepLR", {"step_size": 7, "gamma": 0.5}),
    (sched.MultiStepLR, "MultiStepLR", {"milestones": [5, 12, 30], "gamma": 0.3}),
    (sched.ExponentialLR, "ExponentialLR", {"gamma": 0.9}),
    (sched.CosineAnnealingLR, "CosineAnnealingLR", {"T_max": 15, "eta_min": 0.001}),
    (sched.LinearLR, "LinearLR", {"start_factor": 0.25, "total_iters": 9}),
    (sched.OneCycleLR, "OneCycleLR", {"max_lr": 0.5, "total_steps": 41}),
]


def rates(scheduler, optimizer, name, steps=40):
    seen = [getattr(optimizer, name)]
    for _ in range(steps):
        scheduler.step()
        seen.append(getattr(optimizer, name))
    return seen


@pytest.mark.parametrize("ours, theirs, kwargs", SCHEDULES, ids=[s[1] for s in SCHEDULES])
def test_schedules_agree_with_pytorch(ours, theirs, kwargs):
    torch = pytest.importorskip("torch")
    model = nn.Linear(2, in_size=3)
    opt = optim.SGD(model.parameters(), lr=0.1)
    got = rates(ours(opt, **kwargs), opt, "lr")
    weight = torch.nn.Parameter(torch.zeros(2))
    topt = torch.optim.SGD([weight], lr=0.1)
    tsched = getattr(torch.optim.lr_scheduler, theirs)(topt, **kwargs)
    expected = [topt.param_groups[0]["lr"]]
    for _ in range(40):
        topt.step()
        tsched.step()
        expected.append(topt.param_groups[0]["lr"])
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)


def test_closed_forms_without_pytorch():
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
