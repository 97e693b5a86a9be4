"""Learning-rate schedules: each sets its optimizer's step size from a count of steps.

    scheduler = StepLR(optimizer, step_size=30, gamma=0.1)
    for epoch in range(100):
        train(...)              # optimizer.update() or optimizer.step() inside
        scheduler.step()

The step size is the optimizer's `lr` (SGD, MomentumSGD, AdaGrad, AdaDelta) or `alpha` (Adam,
AdamW, whose `lr` is the bias-corrected size computed from it), for either optimizer style. Each
schedule is a closed form of the step count, as PyTorch's are, so `state_dict()` (the count and
the starting rates) is all it needs to resume; ReduceLROnPlateau, which follows a metric, keeps
its best value and counters too.
"""
import bisect
import math

from .. import variable as _variables

__all__ = ["LRScheduler", "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
           "LinearLR", "OneCycleLR", "ReduceLROnPlateau"]


def _not_replayed(scheduler):
    """A step of a schedule inside a step gradcore.compile records: Python state a replay would
    not change again, so that step runs eagerly (with a warning saying where)."""
    if _variables.step_recorder is not None:
        _variables.step_recorder.not_replayed(f"{type(scheduler).__name__}.step()")


def _rate_name(optimizer):
    """The optimizer's step-size hyperparameter: "lr", or "alpha" for Adam's family."""
    defaults = getattr(type(optimizer), "defaults", {})
    for name in ("lr", "alpha"):
        if name in defaults:
            return name
    if hasattr(optimizer, "lr"):  # a DeZero-style optimizer that sets its own attributes
        return "lr"
    raise TypeError(f"{type(optimizer).__name__} has no step size (lr or alpha) to schedule")


class LRScheduler:
    """Base class: `rate(step)` gives the step size after `step` calls of `step()`."""

    def __init__(self, optimizer, last_epoch=-1):
        self.optimizer = optimizer
        self.name = _rate_name(optimizer)
        self.base_lr = float(getattr(optimizer, self.name))
        self.last_epoch = last_epoch
        self.step()

    def rate(self, step):
        raise NotImplementedError(f"{type(self).__name__} must define rate(step)")

    def step(self):
        """Count a step (an epoch, or a batch for per-step schedules) and set the step size."""
        _not_replayed(self)
        self.last_epoch += 1
        setattr(self.optimizer, self.name, self.rate(self.last_epoch))

    def get_last_lr(self):
        """The step size set last, in a list (PyTorch's form: one per parameter group)."""
        return [float(getattr(self.optimizer, self.name))]

    def state_dict(self):
        """What resuming needs: every attribute but the optimizer."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state):
        """Resume from `state_dict()`; the optimizer's step size is set to match."""
        unknown = set(state) - set(self.state_dict())
        if unknown:
            raise KeyError(f"{type(self).__name__}.load_state_dict: unknown keys "
                           f"{sorted(unknown)}; was this saved by another scheduler?")
        self.__dict__.update(state)
        setattr(self.optimizer, self.name, self.rate(self.last_epoch))


class StepLR(LRScheduler):
    """base * gamma ** (step // step_size)."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size, self.gamma = _positive_int("step_size", step_size), float(gamma)
        super().__init__(optimizer, last_epoch)

    def rate(self, step):
        return self.base_lr * self.gamma ** (step // self.step_size)


class MultiStepLR(LRScheduler):
    """base * gamma ** (how many milestones have been reached)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones, self.gamma = sorted(int(m) for m in milestones), float(gamma)
        super().__init__(optimizer, last_epoch)

    def rate(self, step):
        return self.base_lr * self.gamma ** bisect.bisect_right(self.milestones, step)


class ExponentialLR(LRScheduler):
    """base * gamma ** step."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def rate(self, step):
        return self.base_lr * self.gamma ** step


class CosineAnnealingLR(LRScheduler):
    """From base down to eta_min along half a cosine over T_max steps (and back up after)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max, self.eta_min = _positive_int("T_max", T_max), float(eta_min)
        super().__init__(optimizer, last_epoch)

    def rate(self, step):
        return self.eta_min + (self.base_lr - self.eta_min) * (
            1 + math.cos(math.pi * step / self.T_max)) / 2


class LinearLR(LRScheduler):
    """base times a factor going linearly from start_factor to end_factor over total_iters."""

    def __init__(self, optimizer, start_factor=1 / 3, end_factor=1.0, total_iters=5,
                 last_epoch=-1):
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ValueError(f"LinearLR: start_factor must be in (0, 1] and end_factor in "
                             f"[0, 1], got {start_factor} and {end_factor}")
        self.start_factor, self.end_factor = float(start_factor), float(end_factor)
        self.total_iters = _positive_int("total_iters", total_iters)
        super().__init__(optimizer, last_epoch)

    def rate(self, step):
        done = min(step, self.total_iters) / self.total_iters
        return self.base_lr * (self.start_factor + (self.end_factor - self.start_factor) * done)


class OneCycleLR(LRScheduler):
    """Up from max_lr / div_factor to max_lr over the first pct_start of total_steps, then down
    to max_lr / (div_factor * final_div_factor), along a cosine (or a line: anneal_strategy=
    "linear"). Stepped once per batch. Past total_steps it raises, as a schedule that ran out."""

    def __init__(self, optimizer, max_lr, total_steps, pct_start=0.3, anneal_strategy="cos",
                 div_factor=25.0, final_div_factor=1e4, last_epoch=-1):
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got "
                             f"{anneal_strategy!r}")
        if not 0 < pct_start < 1:
            raise ValueError(f"OneCycleLR: pct_start must be in (0, 1), got {pct_start}")
        self.max_lr, self.total_steps = float(max_lr), _positive_int("total_steps", total_steps)
        self.initial_lr = self.max_lr / div_factor
        self.min_lr = self.initial_lr / final_div_factor
        self.peak_step = float(pct_start * total_steps) - 1
        self.anneal_strategy = anneal_strategy
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start, end, fraction):
        if self.anneal_strategy == "linear":
            return start + (end - start) * fraction
        return end + (start - end) * (1 + math.cos(math.pi * fraction)) / 2

    def rate(self, step):
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {step} times for total_steps="
                             f"{self.total_steps}; make total_steps the number of batches of the "
                             "whole run")
        if step <= self.peak_step:
            return self._anneal(self.initial_lr, self.max_lr, step / self.peak_step)
        down = (step - self.peak_step) / (self.total_steps - 1 - self.peak_step)
        return self._anneal(self.max_lr, self.min_lr, down)


class ReduceLROnPlateau:
    """Multiply the step size by `factor` when a metric has not improved for `patience` steps
    (mode "min": lower is better; "max": higher), then wait `cooldown` steps; never below min_lr.
    Call step(metric) after each evaluation."""

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4,
                 threshold_mode="rel", cooldown=0, min_lr=0.0, eps=1e-8):
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: mode must be 'min' or 'max' and threshold_mode "
                             f"'rel' or 'abs', got {mode!r} and {threshold_mode!r}")
        if not 0 < factor < 1:
            raise ValueError(f"ReduceLROnPlateau: factor must be in (0, 1), got {factor}")
        self.optimizer, self.name = optimizer, _rate_name(optimizer)
        self.mode, self.factor, self.patience = mode, float(factor), int(patience)
        self.threshold, self.threshold_mode = float(threshold), threshold_mode
        self.cooldown, self.min_lr, self.eps = int(cooldown), float(min_lr), float(eps)
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = self.cooldown_counter = 0
        self.last_epoch = 0

    def _better(self, value):
        if not math.isfinite(self.best):
            return True
        margin = self.best * self.threshold if self.threshold_mode == "rel" else self.threshold
        return value < self.best - margin if self.mode == "min" else value > self.best + margin

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

    get_last_lr = LRScheduler.get_last_lr
    state_dict = LRScheduler.state_dict

    def load_state_dict(self, state):
        """Resume from `state_dict()` (the optimizer's step size is its own, saved with it)."""
        unknown = set(state) - set(self.state_dict())
        if unknown:
            raise KeyError(f"ReduceLROnPlateau.load_state_dict: unknown keys {sorted(unknown)}")
        self.__dict__.update(state)


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value
