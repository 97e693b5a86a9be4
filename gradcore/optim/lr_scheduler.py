"""Learning-rate schedules: each changes its optimizer's step size as it counts steps.

    scheduler = StepLR(optimizer, step_size=30, gamma=0.1)
    for epoch in range(100):
        train(...)              # optimizer.update() or optimizer.step() inside
        scheduler.step()

The step size is the optimizer's `lr` (SGD, MomentumSGD, AdaGrad, AdaDelta) or `alpha` (Adam,
AdamW, whose `lr` is the bias-corrected size computed from it), for either optimizer style.

As in PyTorch, each step() changes the step size the optimizer has now (StepLR multiplies it by
gamma at every step_size-th step; CosineAnnealingLR follows PyTorch's recursive form), so:
- schedules compose: several on one optimizer, all stepped, multiply their factors (a LinearLR
  warm-up with an ExponentialLR decay);
- a step size set by hand (`optimizer.lr = 0.5`) is kept, and decayed from.
The first schedule made on an optimizer records the step size it started from as
`optimizer.initial_lr` (saved in the optimizer's state_dict), and every schedule's `base_lr` is
that; `rate(step)` is a schedule's closed form from base_lr alone (PyTorch's step(epoch)).
OneCycleLR is not chainable, as in PyTorch: it sets the rate from its own closed form.

Resuming: load the optimizer's state_dict, then either make the schedule again and load its
state_dict() (which sets the step size the optimizer had at the save: one set by hand stays),
or make it with last_epoch= its count at the save minus one (PyTorch's "index of the last
epoch"): the constructor counts that one step and keeps the restored step size.

MomentumSGD (DeZero's v <- momentum * v - lr * grad) keeps earlier step sizes inside v: a new lr
takes effect over about 1 / (1 - momentum) steps, where PyTorch's SGD applies it at once (see
MomentumSGD). ReduceLROnPlateau follows a metric and keeps its best value and counters.
"""
import bisect
import copy
import math
import numbers

import numpy

from .. import variable as _variables
from .hyperparameters import as_integer, checked_hyperparameter

__all__ = ["LRScheduler", "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
           "LinearLR", "OneCycleLR", "ReduceLROnPlateau"]


def _not_replayed(scheduler):
    """A step of a schedule inside a step gradcore.compile records: Python state a replay would
    not change again, so that step runs eagerly (with a warning saying where)."""
    if _variables.step_recorder is not None:
        _variables.step_recorder.not_replayed(f"{type(scheduler).__name__}.step()")


def _rate_name(optimizer):
    """The optimizer's step-size hyperparameter: "lr", or "alpha" for Adam's family."""
    defaults = getattr(optimizer, "defaults", {})  # a wrapper's too
    for name in ("lr", "alpha"):
        if name in defaults:
            return name
    if hasattr(optimizer, "lr"):  # a DeZero-style optimizer that sets its own attributes
        return "lr"
    raise TypeError(f"{type(optimizer).__name__} has no step size (lr or alpha) to schedule")


def _momentum_name(optimizer):
    """The optimizer's momentum hyperparameter: "beta1" (Adam's family), "momentum"
    (MomentumSGD), or None."""
    defaults = getattr(optimizer, "defaults", {})  # a wrapper's too
    for name in ("beta1", "momentum"):
        if name in defaults:
            return name
    for name in ("beta1", "momentum"):
        if hasattr(optimizer, name):  # a DeZero-style optimizer that sets its own attributes
            return name
    return None


class LRScheduler:
    """Base class. A subclass writes `rate(step)`, its closed form from `base_lr`, and
    `next_rate(lr)`, the step size after step `last_epoch` from the optimizer's current one
    `lr` (PyTorch's chainable get_lr); and `start_rate(lr)` if making the schedule changes the
    step size. One that writes `rate` only is set from it at every step (as OneCycleLR).
    The constructor takes the first step through `self.step()`, as PyTorch's, so a subclass's
    own step() sees it too."""

    _initial = False  # True while the constructor takes the first step (PyTorch's _initial_step)
    _optional_state = ()  # attributes a state_dict saved by an older gradcore lacks

    def __init__(self, optimizer, last_epoch=-1):
        epoch = as_integer(last_epoch)  # a NumPy integer too (read back from a file)
        if epoch is None or epoch < -1:
            raise ValueError(f"{type(self).__name__}: last_epoch must be an int >= -1 (-1: a new "
                             f"schedule), got {last_epoch!r}")
        self.optimizer = optimizer
        self.name = _rate_name(optimizer)
        initial = getattr(optimizer, "initial_lr", None)
        self.base_lr = self._base_rate(epoch)
        self.last_epoch = epoch
        self.last_lr = None
        self._initial = True
        try:
            self.step()
        except BaseException:
            # a schedule refused at its first step leaves the optimizer as it found it: the
            # initial_lr it recorded (OneCycleLR's, over an earlier one too) would be every
            # later schedule's base_lr
            optimizer.initial_lr = initial
            raise
        finally:
            del self._initial  # not saved by state_dict: the class's False again

    def _base_rate(self, last_epoch):
        """The optimizer's initial_lr, recorded now (the current step size) by the first
        schedule on it; resuming (last_epoch >= 0) needs the recorded one."""
        optimizer = self.optimizer
        initial = getattr(optimizer, "initial_lr", None)
        if initial is None:
            if last_epoch != -1:
                raise KeyError(
                    f"{type(self).__name__}(last_epoch={last_epoch}): the optimizer has no "
                    "initial_lr (the step size its schedule started from) to resume from. Load "
                    "the optimizer's state_dict() saved with the schedule first (it keeps "
                    "initial_lr), or set optimizer.initial_lr to the starting step size; or "
                    "leave last_epoch=-1 to start a new schedule from the current step size")
            initial = optimizer.initial_lr = float(getattr(optimizer, self.name))
        return float(initial)

    @property
    def base_lrs(self):
        """[base_lr] (PyTorch's form: one per parameter group)."""
        return [self.base_lr]

    def rate(self, step):
        """The step size after `step` steps, from base_lr alone (the closed form)."""
        raise NotImplementedError(f"{type(self).__name__} must define rate(step)")

    def next_rate(self, lr):
        """The step size after step `last_epoch` (just counted), from the current one, `lr`."""
        return self.rate(self.last_epoch)

    def start_rate(self, lr):
        """The step size a new schedule starts with (at step 0), from the current one."""
        return lr

    def _check(self):
        """Check (and convert) the schedule's own arguments, as attributes: what the constructor
        refuses, load_state_dict refuses too (subclasses write this)."""

    def step(self):
        """Count a step (an epoch, or a batch for per-step schedules) and set the step size."""
        self._advance(first=self._initial)

    def _advance(self, first):
        _not_replayed(self)
        self.last_epoch += 1  # counted first: rate and next_rate read it
        try:
            now = float(getattr(self.optimizer, self.name))
            if type(self).next_rate is LRScheduler.next_rate:  # not chainable: the closed form
                lr = self.rate(self.last_epoch)
            elif not first:
                lr = self.next_rate(now)
            elif self.last_epoch == 0:
                lr = self.start_rate(now)
            else:  # resumed (last_epoch= given): the restored step size is already this step's
                lr = now
            self._set(lr)
        except BaseException:
            self.last_epoch -= 1  # a step the optimizer (or the schedule) refused is not counted
            raise

    def _set(self, lr):
        lr = self._rounded_to_zero(lr)
        setattr(self.optimizer, self.name, lr)
        self.last_lr = lr

    def _rounded_to_zero(self, lr):
        """`lr`, or 0.0 where it is a rounding error below zero (LinearLR decaying to 0 lands on
        -1.9e-18 from 0.1, as PyTorch's recursion does), which the optimizer would refuse. A
        step size further below zero is a schedule's bug: the optimizer still refuses it."""
        scale = max(self.base_lr, float(getattr(self.optimizer, self.name)))
        return 0.0 if -1e-12 * scale <= lr < 0.0 else lr

    def get_last_lr(self):
        """The step size this schedule set last, in a list (PyTorch's form: one per parameter
        group)."""
        return [self.last_lr]

    def state_dict(self):
        """What resuming needs: every attribute but the optimizer, and the optimizer's step size
        now ("optimizer_lr"), which may have been set by hand since this schedule's last step."""
        state = {k: v for k, v in self.__dict__.items() if k != "optimizer"}
        state["optimizer_lr"] = float(getattr(self.optimizer, self.name))
        return state

    def load_state_dict(self, state):
        """Resume from `state_dict()`. The optimizer's step size becomes the one it had when
        that was taken, which its own state_dict keeps too: making the schedule again may have
        changed it (LinearLR's start_factor), and a step size set by hand stays set, as when
        the run goes on uninterrupted (and as PyTorch resumes). Several schedules on one
        optimizer load in any order. A state_dict from an older gradcore, without it: the step
        size this schedule set last. A state read back through numpy.savez / numpy.load (0-d
        arrays) or JSON will do. Everything is checked before anything changes: a state that
        another kind of schedule saved, or one for another step size (lr, alpha), is refused
        and this schedule left as it was."""
        where = f"{type(self).__name__}.load_state_dict"
        optional = ("optimizer_lr", "last_lr", *self._optional_state)
        state = _checked_state(self, state, where, optional=optional)
        for name in self._optional_state:
            state.setdefault(name, None)  # what the schedule's _check takes as the old default
        lr = state.pop("optimizer_lr", None)
        if lr is not None:
            lr = checked_hyperparameter(where, "optimizer_lr", lr, rule="lr")
        trial = copy.copy(self)  # the state tried on a copy: a refused one changes nothing
        trial.__dict__.update(state)
        _checked_on(trial, where)
        if trial.last_epoch < -1:
            raise ValueError(f"{where}: last_epoch must be an int >= -1, got {trial.last_epoch}")
        trial.base_lr = checked_hyperparameter(where, "base_lr", trial.base_lr, rule="lr")
        if state.get("last_lr") is None:  # saved by an older gradcore: the closed form
            trial.last_lr = trial.rate(trial.last_epoch)
        restored = trial._restored(trial.last_lr if lr is None else lr)
        for name, value in restored.items():
            checked_hyperparameter(where, name, value)
        self.__dict__.update(trial.__dict__)
        for name, value in restored.items():
            setattr(self.optimizer, name, value)

    def _restored(self, lr):
        """The optimizer's hyperparameters that the state just loaded sets, name -> value: its
        step size, to `lr`."""
        return {self.name: self._rounded_to_zero(lr)}


class StepLR(LRScheduler):
    """base * gamma ** (step // step_size): the step size times gamma every step_size steps."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size, self.gamma = step_size, gamma
        self._check()
        super().__init__(optimizer, last_epoch)

    def _check(self):
        self.step_size = _positive_int("step_size", self.step_size)
        self.gamma = checked_hyperparameter("StepLR", "gamma", self.gamma, rule="lr")

    def rate(self, step):
        return self.base_lr * self.gamma ** (step // self.step_size)

    def next_rate(self, lr):
        return lr * self.gamma if self.last_epoch % self.step_size == 0 else lr


class MultiStepLR(LRScheduler):
    """base * gamma ** (how many milestones have been reached): the step size times gamma at
    each milestone (one listed twice counts twice)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones, self.gamma = milestones, gamma
        self._check()
        super().__init__(optimizer, last_epoch)

    def _check(self):
        self.milestones = sorted(_milestone(m) for m in self.milestones)
        self.gamma = checked_hyperparameter("MultiStepLR", "gamma", self.gamma, rule="lr")

    def rate(self, step):
        return self.base_lr * self.gamma ** bisect.bisect_right(self.milestones, step)

    def next_rate(self, lr):
        reached = self.milestones.count(self.last_epoch)
        return lr * self.gamma ** reached if reached else lr

    start_rate = next_rate  # a milestone at 0 applies at once


class ExponentialLR(LRScheduler):
    """base * gamma ** step: the step size times gamma at every step."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        self._check()
        super().__init__(optimizer, last_epoch)

    def _check(self):
        self.gamma = checked_hyperparameter("ExponentialLR", "gamma", self.gamma, rule="lr")

    def rate(self, step):
        return self.base_lr * self.gamma ** step

    def next_rate(self, lr):
        return lr * self.gamma


class CosineAnnealingLR(LRScheduler):
    """From base down to eta_min along half a cosine over T_max steps (and back up after).
    Each step scales the current step size's distance to eta_min by the ratio of successive
    cosines (PyTorch's recursion), so that it composes with other schedules."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max, self.eta_min = T_max, eta_min
        self._check()
        super().__init__(optimizer, last_epoch)

    def _check(self):
        self.T_max = _positive_int("T_max", self.T_max)
        self.eta_min = checked_hyperparameter("CosineAnnealingLR", "eta_min", self.eta_min,
                                              rule="lr")

    def rate(self, step):
        return self.eta_min + (self.base_lr - self.eta_min) * (
            1 + math.cos(math.pi * step / self.T_max)) / 2

    def next_rate(self, lr):
        step, T = self.last_epoch, self.T_max
        if (step - 1 - T) % (2 * T) == 0:  # leaving a trough, where the ratio would be 0 / 0
            return lr + (self.base_lr - self.eta_min) * (1 - math.cos(math.pi / T)) / 2
        return ((1 + math.cos(math.pi * step / T)) / (1 + math.cos(math.pi * (step - 1) / T))
                * (lr - self.eta_min) + self.eta_min)


class LinearLR(LRScheduler):
    """base times a factor going linearly from start_factor to end_factor over total_iters."""

    def __init__(self, optimizer, start_factor=1 / 3, end_factor=1.0, total_iters=5,
                 last_epoch=-1):
        self.start_factor, self.end_factor = start_factor, end_factor
        self.total_iters = total_iters
        self._check()
        super().__init__(optimizer, last_epoch)

    def _check(self):
        start, end = self.start_factor, self.end_factor
        if not 0 < start <= 1 or not 0 <= end <= 1:
            raise ValueError(f"LinearLR: start_factor must be in (0, 1] and end_factor in "
                             f"[0, 1], got {start} and {end}")
        self.start_factor, self.end_factor = float(start), float(end)
        self.total_iters = _positive_int("total_iters", self.total_iters)

    def rate(self, step):
        done = min(step, self.total_iters) / self.total_iters
        return self.base_lr * (self.start_factor + (self.end_factor - self.start_factor) * done)

    def start_rate(self, lr):
        return lr * self.start_factor

    def next_rate(self, lr):
        if self.last_epoch > self.total_iters:
            return lr
        change = self.end_factor - self.start_factor  # times factor(step) / factor(step - 1)
        return lr * (1.0 + change / (self.total_iters * self.start_factor
                                     + (self.last_epoch - 1) * change))


class OneCycleLR(LRScheduler):
    """Up from max_lr / div_factor to max_lr over the first pct_start of total_steps, then down
    to max_lr / (div_factor * final_div_factor), along a cosine (or a line: anneal_strategy=
    "linear"). Stepped once per batch. Past total_steps it raises, as a schedule that ran out.
    When pct_start * total_steps <= 1 there is no warm-up: the first step size is on the way
    down already, just under max_lr (max_lr itself when pct_start * total_steps is 1), as in
    PyTorch.

    With cycle_momentum (the default, as in PyTorch) the momentum goes the other way, from
    max_momentum down to base_momentum at the peak and back up: MomentumSGD's `momentum`, or
    Adam's and AdamW's `beta1`; an optimizer with neither (SGD, AdaGrad, AdaDelta) has only its
    step size scheduled. Not chainable, as in PyTorch: each step sets the closed form.

    total_steps may be given as PyTorch's epochs and steps_per_epoch instead (their product).
    three_phase (PyTorch's): down to max_lr / div_factor again over as many steps as the way
    up took, then to the minimum over the rest (the momentum back up to max_momentum, and
    there); with pct_start past about 0.5 there is no rest, and the minimum is not reached,
    as in PyTorch."""

    _optional_state = ("three_phase",)  # saved since gradcore added it: older states have none

    def __init__(self, optimizer, max_lr, total_steps=None, pct_start=0.3, anneal_strategy="cos",
                 div_factor=25.0, final_div_factor=1e4, last_epoch=-1, cycle_momentum=True,
                 base_momentum=0.85, max_momentum=0.95, *, epochs=None, steps_per_epoch=None,
                 three_phase=False):
        if not 0 < pct_start < 1:
            raise ValueError(f"OneCycleLR: pct_start must be in (0, 1), got {pct_start}")
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise ValueError("OneCycleLR: give total_steps, or epochs and steps_per_epoch "
                                 "(total_steps = epochs * steps_per_epoch)")
            total_steps = (_positive_int("epochs", epochs)
                           * _positive_int("steps_per_epoch", steps_per_epoch))
        elif epochs is not None or steps_per_epoch is not None:
            raise ValueError("OneCycleLR: give total_steps or epochs and steps_per_epoch, not "
                             "both")
        # checked before anything is set: the first step records initial_lr on the optimizer
        self.max_lr = checked_hyperparameter("OneCycleLR", "max_lr", max_lr, rule="lr")
        self.total_steps = _positive_int("total_steps", total_steps)
        self.three_phase = three_phase
        for name, factor in (("div_factor", div_factor), ("final_div_factor", final_div_factor)):
            if checked_hyperparameter("OneCycleLR", name, factor, rule="lr") == 0.0:
                raise ValueError(f"OneCycleLR: {name} must be > 0, got {factor!r}")
        self.initial_lr = self.max_lr / div_factor
        self.min_lr = self.initial_lr / final_div_factor
        # the step at the peak: at or before step 0 when pct_start * total_steps <= 1
        self.peak_step = float(pct_start * total_steps) - 1
        self.anneal_strategy = anneal_strategy
        # "" for none (not None: numpy.savez would keep that as an object array, which
        # numpy.load refuses)
        self.momentum_name = (_momentum_name(optimizer) if cycle_momentum else None) or ""
        self.base_momentum, self.max_momentum = base_momentum, max_momentum
        self._check()
        super().__init__(optimizer, last_epoch)

    def _check(self):
        # what the arguments gave, kept as attributes: a state_dict's are checked the same way
        where = "OneCycleLR"
        if self.anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"{where}: anneal_strategy must be 'cos' or 'linear', got "
                             f"{self.anneal_strategy!r}")
        self.max_lr = checked_hyperparameter(where, "max_lr", self.max_lr, rule="lr")
        self.total_steps = _positive_int("total_steps", self.total_steps)
        self.initial_lr = checked_hyperparameter(where, "initial_lr", self.initial_lr, rule="lr")
        self.min_lr = checked_hyperparameter(where, "min_lr", self.min_lr, rule="lr")
        if not -1 < self.peak_step < self.total_steps - 1:  # pct_start in (0, 1)
            raise ValueError(f"{where}: peak_step must be in (-1, total_steps - 1), got "
                             f"{self.peak_step!r}")
        if self.three_phase is None:  # a state saved before three_phase was: two phases
            self.three_phase = False
        if not isinstance(self.three_phase, bool):
            raise TypeError(f"{where}: three_phase must be True or False, got "
                            f"{self.three_phase!r}")
        if self.momentum_name not in ("", "beta1", "momentum"):
            raise ValueError(f"{where}: momentum_name must be '', 'beta1' or 'momentum', got "
                             f"{self.momentum_name!r}")
        rule = self.momentum_name or "momentum"  # the range the optimizer allows (beta1 < 1)
        self.base_momentum = checked_hyperparameter(where, "base_momentum", self.base_momentum,
                                                    rule=rule)
        self.max_momentum = checked_hyperparameter(where, "max_momentum", self.max_momentum,
                                                   rule=rule)

    def _base_rate(self, last_epoch):
        # the closed form needs only the arguments (resuming too); a new cycle records its start
        # as the optimizer's initial_lr, as PyTorch's does
        if last_epoch == -1:
            self.optimizer.initial_lr = self.initial_lr
        return self.initial_lr

    def _anneal(self, start, end, fraction):
        if self.anneal_strategy == "linear":
            # the step after the last batch goes past the end (fraction > 1): a line would
            # overshoot it, below zero (PyTorch's), where a cosine comes back up
            return start + (end - start) * min(fraction, 1.0)
        return end + (start - end) * (1 + math.cos(math.pi * fraction)) / 2

    def _trough_step(self):
        """three_phase's step back at max_lr / div_factor: as far past the peak as it is from
        step 0, counted as PyTorch counts it."""
        return 2 * (self.peak_step + 1) - 2

    def _phase(self, step):
        """(the phase `step` is in: 0 on the way up, 1 on the way down (to max_lr / div_factor
        where three_phase), 2 three_phase's last; how far along it: 0 to 1)."""
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {step} times for total_steps="
                             f"{self.total_steps}; make total_steps the number of batches of the "
                             "whole run")
        if self.peak_step > 0 and step <= self.peak_step:
            return 0, step / self.peak_step
        end = self._trough_step() if self.three_phase else self.total_steps - 1
        if step <= end or not self.three_phase:
            # pct_start < 1 puts the peak before the last step, and three_phase's trough after
            # it: the denominator is > 0
            return 1, (step - self.peak_step) / (end - self.peak_step)
        last = self.total_steps - 1
        # a trough at the last step (pct_start past 0.5) leaves the step after it at the end
        # of the last phase (where PyTorch's divides by zero)
        return 2, (step - end) / (last - end) if last > end else 1.0

    def rate(self, step):
        phase, fraction = self._phase(step)
        if phase == 0:
            return self._anneal(self.initial_lr, self.max_lr, fraction)
        if phase == 1:
            return self._anneal(self.max_lr, self.initial_lr if self.three_phase else
                                self.min_lr, fraction)
        return self._anneal(self.initial_lr, self.min_lr, fraction)

    def momentum(self, step):
        """The momentum (or beta1) after `step` steps: down while the step size goes up."""
        phase, fraction = self._phase(step)
        if phase == 0:
            return self._anneal(self.max_momentum, self.base_momentum, fraction)
        if phase == 1:
            return self._anneal(self.base_momentum, self.max_momentum, fraction)
        return self.max_momentum

    def _set(self, lr):
        super()._set(lr)
        if self.momentum_name:
            setattr(self.optimizer, self.momentum_name, self.momentum(self.last_epoch))

    def _restored(self, lr):
        restored = super()._restored(lr)
        if self.momentum_name:
            restored[self.momentum_name] = self.momentum(self.last_epoch)
        return restored


class ReduceLROnPlateau:
    """Multiply the step size by `factor` when a metric has not improved for `patience` steps
    (mode "min": lower is better; "max": higher), then wait `cooldown` steps; never below min_lr.
    Call step(metric) after each evaluation."""

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4,
                 threshold_mode="rel", cooldown=0, min_lr=0.0, eps=1e-8):
        self.mode, self.factor, self.patience = mode, factor, patience
        self.threshold, self.threshold_mode = threshold, threshold_mode
        self.cooldown, self.min_lr, self.eps = cooldown, min_lr, eps
        self.num_bad_epochs = self.cooldown_counter = 0
        self.last_epoch = 0
        self._check()
        self.optimizer, self.name = optimizer, _rate_name(optimizer)
        self.best = math.inf if mode == "min" else -math.inf

    def _check(self):
        """Check (and convert) the arguments, as attributes, and the counters: what the
        constructor refuses, load_state_dict refuses too."""
        where = "ReduceLROnPlateau"
        if self.mode not in ("min", "max") or self.threshold_mode not in ("rel", "abs"):
            raise ValueError(f"{where}: mode must be 'min' or 'max' and threshold_mode 'rel' or "
                             f"'abs', got {self.mode!r} and {self.threshold_mode!r}")
        if not 0 < self.factor < 1:
            raise ValueError(f"{where}: factor must be in (0, 1), got {self.factor}")
        self.factor = float(self.factor)
        # >= 0 and finite, as a step size: a NaN threshold or eps would silently never (or
        # always) reduce, a negative patience reduce at every step
        for name in ("threshold", "min_lr", "eps"):
            setattr(self, name, checked_hyperparameter(where, name, getattr(self, name),
                                                       rule="lr"))
        for name in ("patience", "cooldown", "num_bad_epochs", "cooldown_counter",
                     "last_epoch"):
            setattr(self, name, _count(name, getattr(self, name)))

    def _better(self, value):
        # written as products with the best so far (not best - best * threshold): the first
        # best is infinite, and inf - inf would be NaN; a NaN metric is never better
        best, threshold = self.best, self.threshold
        if self.mode == "min":
            return value < (best * (1 - threshold) if self.threshold_mode == "rel"
                            else best - threshold)
        return value > (best * (1 + threshold) if self.threshold_mode == "rel"
                        else best + threshold)

    def step(self, metric):
        """Take this evaluation's `metric` (a number, or a one-element Variable or array)."""
        _not_replayed(self)
        value = float(metric.item() if hasattr(metric, "item") else metric)
        self.last_epoch += 1
        if self._better(value):
            self.best, self.num_bad_epochs = value, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            old = float(getattr(self.optimizer, self.name))
            new = max(old * self.factor, self.min_lr)
            if old - new > self.eps:
                setattr(self.optimizer, self.name, new)
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0

    def get_last_lr(self):
        """The optimizer's step size, in a list (PyTorch's form: one per parameter group)."""
        return [float(getattr(self.optimizer, self.name))]

    def state_dict(self):
        """What resuming needs: every attribute but the optimizer."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state):
        """Resume from `state_dict()` (the optimizer's step size is its own, saved with it). A
        state read back through numpy.savez / numpy.load or JSON will do; one that is refused
        (its values checked as the constructor checks them) leaves this schedule as it was."""
        where = "ReduceLROnPlateau.load_state_dict"
        trial = copy.copy(self)  # the state tried on a copy: a refused one changes nothing
        trial.__dict__.update(_checked_state(self, state, where))
        _checked_on(trial, where)
        self.__dict__.update(trial.__dict__)


def _checked_state(scheduler, state, where, optional=()):
    """`state` (a state_dict) as the attributes it sets on `scheduler`, checked and converted
    before any is set: every key is one of the scheduler's own and each of those is there (but
    the `optional` ones, which older gradcores did not save, and may be None), `name` (the
    optimizer's step size, lr or alpha) is the scheduler's, and each value has the type of the
    scheduler's own (see _converted). KeyError or ValueError naming the key otherwise."""
    own = scheduler.state_dict()
    unknown, missing = set(state) - set(own), set(own) - set(state) - set(optional)
    if unknown or missing:
        listed = "; ".join(f"{what} keys {sorted(keys)}" for what, keys in
                           (("unknown", unknown), ("missing", missing)) if keys)
        raise KeyError(f"{where}: {listed}; was this saved by another kind of scheduler? Load "
                       f"the state_dict() of a {type(scheduler).__name__}")
    converted = {}
    for key, value in state.items():
        if key in optional and value is None:
            converted[key] = None
        elif key == "optimizer_lr":  # not an attribute: the caller checks it as a step size
            converted[key] = value
        else:
            converted[key] = _converted(where, key, own[key], value)
    if converted["name"] != scheduler.name:
        raise ValueError(f"{where}: the state schedules the optimizer's {converted['name']!r}, "
                         f"this {type(scheduler).__name__} its {scheduler.name!r}: it was saved "
                         "for another kind of optimizer (Adam's family schedules alpha, the "
                         "others lr); load it into a schedule of an optimizer of that kind")
    return converted


def _converted(where, key, like, value):
    """`value` of `key` with the type of `like`, the scheduler's own value, where that is one the
    built-in schedules keep: a float, an int, a list of ints (milestones) or a str. A NumPy
    value (numpy.load gives 0-d arrays) becomes a Python number or str, a 1-d array a list.
    Other values (a subclass's own: a bool, a tuple, a dict, None before it has run) come as
    they are. ValueError if it is not such a value."""
    given = value
    if isinstance(value, (numpy.ndarray, numpy.generic)):
        value = value.tolist()
    if isinstance(like, bool) or like is None:
        return value
    if isinstance(like, list) and like and all(isinstance(m, int) for m in like):
        kind = "a list of ints"
        value = [as_integer(m) for m in value] if isinstance(value, (list, tuple)) else [None]
        fits = None not in value
    elif isinstance(like, int):
        kind, value = "an int", as_integer(value)
        fits = value is not None
    elif isinstance(like, float):
        kind = "a real number"
        fits = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if fits else None
    elif isinstance(like, str):
        if value is None and like == "":
            value = ""  # OneCycleLR's "no momentum" as older gradcores saved it
        kind, fits = "a str", isinstance(value, str)
    else:
        return value
    if not fits:
        raise ValueError(f"{where}: {key} must be {kind}, got {type(given).__name__} {given!r}")
    return value


def _checked_on(trial, where):
    """trial._check(): the values of a state_dict loaded on a copy of a schedule, checked as its
    constructor checks its arguments; the error says it was `where` that refused them."""
    try:
        trial._check()
    except (TypeError, ValueError) as error:
        raise type(error)(f"{where}: {error}; the schedule was left as it was") from None


def _positive_int(name, value):
    number = as_integer(value)
    if number is None or number < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return number


def _count(name, value):
    number = as_integer(value)
    if number is None or number < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return number


def _milestone(value):
    # a step count: int() would make 2.5 a milestone at 2, which PyTorch's count never reaches;
    # an integral float (epochs * 0.5 = 2.0) is that count, as PyTorch takes it
    number = as_integer(value)
    if number is None and isinstance(value, numbers.Real) and not isinstance(value, bool) \
            and math.isfinite(value) and float(value).is_integer():
        number = int(value)
    if number is None or number < 0:
        raise ValueError(f"MultiStepLR: each milestone must be an int >= 0 (a step count), got "
                         f"{value!r}")
    return number
