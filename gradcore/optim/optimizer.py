"""Optimizer: the base class (target, hooks, per-parameter state, both call styles, saving)."""
import functools
import numbers
import types
from collections.abc import Mapping

import backends

from .. import variable as _variables
from ..config import enable_grad
from ..function import add_note
from ..nn.module import _host_array, _numpy_dtype, _unfit, _zero_grads
from ..variable import Parameter, Variable, note_write
from .hooks import ClipGrad, FreezeParam, WeightDecay
from .hyperparameters import _is_number, as_integer, checked_hyperparameter, checked_value
from .param_state import ParamState
from .params import (_as_target, _check_leaves, _describe, _unique_params, grad_array, set_data,
                     update_dtype)

# Importable from here too, as before the hooks and helpers had modules of their own.
__all__ = ["Optimizer", "ParamState", "WeightDecay", "ClipGrad", "FreezeParam",
           "checked_hyperparameter", "grad_array", "set_data"]


def _eager_in_replay(method, closure_first=False):
    """`method` (a step) made one opaque line of a tape gradcore.compile records: it runs as
    Python at every replay, reading the learning rate and counters as they are then. With
    `closure_first` (a step that calls its closure once, first: the base class's and
    DistributedOptimizer's), a closure it is given runs first, recorded like the rest of the
    compiled step, and the step without it is the line. Another step given a closure may call
    it several times (SAM's does), between its own updates: that step runs eagerly."""
    @functools.wraps(method)
    def step(self, *args, **kwargs):
        recorder = _variables.step_recorder
        if recorder is not None and recorder.is_active():
            closure = _closure(method, args, kwargs)
            if closure is not None and closure_first:
                # what step(closure) does: the closure's loss (grad mode on), then the step
                with enable_grad():
                    loss = closure()
                recorder.opaque(_this_step(self, step, method, recorder), (), self)
                return loss
            if closure is not None:
                recorder.give_up(
                    f"{type(self).__name__}.step(closure): a step of its own may call the "
                    "closure any number of times, between updates, which a tape cannot know: "
                    "call the closure and then step() without it in the compiled step")
                return method(self, *args, **kwargs)
            run = _this_step(self, step, method, recorder)
            return recorder.opaque(functools.partial(run, *args, **kwargs), (), self)
        return method(self, *args, **kwargs)
    step._eager_in_replay = True
    return step


def _this_step(self, wrapper, method, recorder):
    """The step a replay runs: self's own (wrapped: it checks for a recording) where `wrapper`
    is self's; else `method` itself, which a subclass's step called (super().step()): not
    the subclass's step again. A subclass's step that is not wrapped (a DistributedOptimizer
    subclass's) would then never run at replays: the step runs eagerly instead."""
    bound = getattr(self, method.__name__)
    own = getattr(bound, "__func__", None)
    if own is wrapper:
        return bound
    if not getattr(own, "_eager_in_replay", False):
        recorder.give_up(f"{type(self).__name__}.{method.__name__} of its own, which a replay "
                         "would skip: it runs eagerly")
    return functools.partial(method, self)


def _closure(method, args, kwargs):
    """The closure of a call step(closure) (positional or by keyword), else None."""
    if method.__name__ != "step" or len(args) + len(kwargs) != 1:
        return None
    closure = args[0] if args else kwargs.get("closure")
    return closure if callable(closure) else None


class Optimizer:
    """Base class: updates the parameters of a target from their gradients.

    Two ways to call it, told apart by the first positional argument:

    - a number, or nothing (DeZero): the hyperparameters, positionally in DeZero's order or by
      keyword; then `setup(model)` and `update()` after each backward.
    - anything else (PyTorch): the parameters to optimize (a model with `parameters()`, one
      Variable, or an iterable of Variables), then the hyperparameters as above; then
      `zero_grad()`, backward, `step()`.

    Where the parameters come first, a hyperparameter after them goes by keyword wherever this
    class's positional order (DeZero's) is not PyTorch's for that position (AdaDelta(params, 1.0):
    PyTorch reads lr, DeZero rho): TypeError, saying so.

    `lr=` works for every optimizer (Adam's `lr=` sets `alpha`). Parameters whose grad is None are
    skipped. Updates run in place on the parameter's own array (no graph is recorded), and each
    parameter's state lives on its device, following it when it moves. The parameters must be
    leaf Variables (ValueError otherwise: backward gives a computed Variable no gradient).

    `initial_lr` is None until a learning-rate schedule (optim.lr_scheduler) records the step
    size it started from there (PyTorch keeps it in the param group); it is saved with
    `state_dict()`, so a schedule resumed with `last_epoch=` finds it.

    A float16 parameter's state is float32 and its update is computed in float32, rounded to
    float16 once, as it is written (update_arrays, set_data). A parameter that is not floating
    (an index table) with a gradient is refused before anything is updated.

    A subclass lists its hyperparameters in `defaults` (a bool default makes a flag, which takes
    True or False only), its per-parameter arrays in `state_names` (and integer counts in
    `state_counters`), and writes `update_one(param)`; a DeZero-style subclass that sets its own
    attributes in `__init__` and keeps its own state works too, but its state_dict() cannot
    hold them, so its load_state_dict refuses. gradcore's own optimizers refuse to have another
    optimizer's hyperparameter set on them (SGD().momentum = 0.9, Adam().weight_decay = 0.5:
    AttributeError, with the constructor's hints), which would change nothing; a subclass of
    the user's sets what it likes. Optimizers can be copied with copy.deepcopy (the
    copy's state belongs to the copied parameters) and pickled; to save one to a file, use
    state_dict().
    """

    defaults = {}         # hyperparameter -> default, in DeZero's positional order
    aliases = {}          # another keyword (PyTorch's) -> the hyperparameter it sets
    keywords = ()         # other keywords the constructor takes (Adam's betas)
    # PyTorch's positional order after the parameters (None: no check, a user's class)
    pytorch_order = None
    state_names = ()      # per-parameter arrays, zeros like the parameter at its first update
    # arrays a parameter's state may hold beyond state_names (RMSprop's momentum buffer, kept
    # while its momentum is 0, as PyTorch keeps it)
    kept_state_names = ()
    state_counters = ()   # per-parameter integer counts, 0 at its first update (Adam's "step")
    counters = ()         # integer attributes saved with the state (Adam's count of steps t)
    # a per-parameter count missing from an older state_dict -> the counter it is taken from
    counter_fallback = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in ("update", "step"):
            if name in cls.__dict__:
                setattr(cls, name, _eager_in_replay(cls.__dict__[name]))
        # the names __setattr__ looks at beyond `defaults`: aliases (set what they stand for)
        # and, on gradcore's own classes, other optimizers' hyperparameters (refused). A name
        # with a property of its own (Adam's lr, betas) is the property's
        named = set(cls.aliases) | (_OTHER_HYPERPARAMETERS if cls.__module__.startswith(
            "gradcore.") else set())
        cls._redirected = frozenset(name for name in named - set(cls.defaults)
                                    if not _has_setter(cls, name))

    def __init__(self, *args, **kwargs):
        where = type(self).__name__
        target = None
        if args and not _is_number(args[0]):
            target, args = _as_target(args[0], where), args[1:]
            if args and self.pytorch_order is not None:
                self._check_pytorch_order(args)
        values = self._bind(args, kwargs)
        self.target = target
        self.hooks = []
        self.state = ParamState()
        self.state_counts = ParamState()  # parameter -> {name in state_counters: int}
        self.initial_lr = None  # set by the first learning-rate schedule
        for name, value in values.items():
            # _bind checked what was given; a default is the class's own (not checked)
            object.__setattr__(self, name, value)
        for name in self.counters:
            setattr(self, name, 0)
        recorder = _variables.step_recorder
        if recorder is not None and recorder.is_active():
            recorder.made_optimizers[id(self)] = self  # made in a compiled step: _made_optimizer

    def __setattr__(self, name, value):
        # a hyperparameter set later (by hand, or by a schedule at every step) is checked as the
        # constructor checks it: one dict lookup, and one set lookup for any other attribute
        if name in self.defaults:
            value = checked_value(type(self).__name__, name, value, self.defaults[name])
        elif name in self._redirected:
            target = self.aliases.get(name)
            if target is None:  # another optimizer's: it would change nothing here
                raise AttributeError(
                    f"{type(self).__name__} has no hyperparameter {name!r}, so setting it would "
                    f"change nothing; {_accepts(type(self), name)}")
            name, value = target, checked_value(type(self).__name__, target, value,
                                                self.defaults[target])
        object.__setattr__(self, name, value)

    def _check_pytorch_order(self, args):
        """TypeError unless each of `args` (hyperparameters given positionally after the
        parameters) is at a position PyTorch's class reads as the same hyperparameter: there
        PyTorch's order, not DeZero's, is what the caller expects."""
        where = type(self).__name__
        names, order = list(self.defaults), self.pytorch_order
        for position, value in enumerate(args[:len(names)]):
            theirs = order[position] if position < len(order) else None
            if self.aliases.get(theirs, theirs) != names[position]:
                raise TypeError(
                    f"{where}(params, {', '.join(map(repr, args))}): hyperparameter "
                    f"{position + 1} after the parameters is {names[position]} in {where}'s "
                    f"positional order ({', '.join(names)}, DeZero's) but "
                    + (f"{theirs} in PyTorch's ({', '.join(order)})" if theirs else
                       f"PyTorch's takes {len(order)} ({', '.join(order)})")
                    + f"; pass it by keyword: {names[position]}={value!r}"
                    + (f", or {theirs}={value!r} as PyTorch reads it"
                       if theirs in self.defaults or theirs in self.aliases else ""))

    def _bind(self, args, kwargs):
        """The hyperparameters from positional `args` and keyword `kwargs`, checked."""
        where = type(self).__name__
        names = list(self.defaults)
        if len(args) > len(names):
            given = ", ".join(type(a).__name__ for a in args)
            raise TypeError(
                f"{where} takes at most {len(names)} hyperparameter(s) positionally "
                f"({', '.join(names) or 'none'}), got {len(args)} ({given}); the parameters to "
                f"optimize come first, if at all: {where}(model.parameters(), ...)")
        values = dict(self.defaults)
        given, spelled = {}, {}  # name -> its value, and the keyword it was given by
        for name, value in zip(names, args):
            given[name] = value
        for key, value in kwargs.items():
            name = self.aliases.get(key, key)
            if name not in values:
                raise TypeError(f"{where} got an unexpected keyword argument {key!r}; "
                                f"{_accepts(type(self), key)}")
            if name in given:
                first = spelled.get(name)
                how = "by position" if first is None else f"as {first!r}"
                alias = next((k for k in (first, key) if k is not None and k != name), None)
                raise TypeError(f"{where} got {name!r} twice" + (
                    f" ({how}, and as {key!r}; {alias!r} is its alias)" if alias else ""))
            given[name] = value
            spelled[name] = key
        for name, value in given.items():
            values[name] = checked_value(where, name, value, self.defaults[name])
        return values

    @property
    def hyperparameters(self):
        """The current hyperparameters, name -> value, read-only: set one as an attribute
        (optimizer.lr = 0.05), which checks it as the constructor does."""
        return types.MappingProxyType({name: getattr(self, name) for name in self.defaults})

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.hyperparameters.items())
        return f"{type(self).__name__}({args})"

    # ---------------------------------------------------------------- target and hooks
    def setup(self, target):
        """Optimize `target`: a model (an object with `parameters()`, or DeZero's `params()`), one
        Variable or an iterable of Variables. Returns self."""
        self.target = _as_target(target, f"{type(self).__name__}.setup")
        return self

    def add_hook(self, f):
        """Call `f(params)` before each update, with the parameters that have a gradient
        (WeightDecay, ClipGrad, FreezeParam, or any callable). Hooks run in the order added,
        except that FreezeParam hooks run first, so that no other hook sees a frozen gradient
        (ClipGrad would count it in its norm); a parameter whose grad a hook set to None is not
        passed to the hooks after it, nor updated. Where a hook raises, the gradients keep what
        the hooks before it set (the error's note says so; a Dask parameter's are put back):
        run backward again before trying the step again."""
        if not callable(f):
            raise TypeError(f"add_hook expects a callable taking the list of parameters, got "
                            f"{type(f).__name__}")
        self.hooks.append(f)

    def _parameters(self):
        """Every parameter of the target, once each, in order."""
        target = self.target
        if target is None:
            where = type(self).__name__
            raise RuntimeError(f"{where}: nothing to optimize: call setup(model) first, or pass "
                               f"the parameters, as in {where}(model.parameters(), ...)")
        if isinstance(target, list):
            return target
        get = getattr(target, "parameters", None)
        if not callable(get):
            get = target.params
        where = f"{type(self).__name__}: {type(target).__name__}.parameters()"
        return _check_leaves(_unique_params(get(), where), where)

    # ---------------------------------------------------------------- steps
    def update(self):
        """One step (DeZero's name): the hooks, then `update_one` on every parameter that has a
        gradient."""
        self._apply(self._ready())

    def step(self, closure=None):
        """One step (PyTorch's name). `closure`, if given, recomputes the loss (grad mode on)
        before the step and its value is returned."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        self.update()
        return loss

    def zero_grad(self, set_to_none=True):
        """Forget every parameter's gradient: grad = None, so it is skipped until its next
        backward (PyTorch's default, set_to_none=True); with set_to_none=False each gradient is
        filled with zeros instead, in place where its array is its own (else a new zero
        gradient), and the parameter still takes part in the next step."""
        _zero_grads(self._parameters(), set_to_none, type(self).__name__)

    def update_one(self, param):
        """Update `param.data` in place from `param.grad` (subclasses write this)."""
        raise NotImplementedError(f"{type(self).__name__} must define update_one(param)")

    def _ready(self):
        """The parameters that have a gradient, checked before anything changes. ValueError if
        the target has no parameters at all: the step could never change anything."""
        params = self._parameters()
        if not params:
            target = self.target
            plain = _plain_variables(target)
            cause = (f"{', '.join(plain)} {'is a Variable' if len(plain) == 1 else 'are Variables'}"
                     ", not a Parameter: only Parameters are trained; make it one (self.W = "
                     "gradcore.Parameter(...))" if plain else
                     "Layers kept in a plain list or dict are not registered: assign each to an "
                     "attribute of the model (self.l1 = Linear(10)) or hold them in an "
                     "nn.ModuleList or nn.ModuleDict")
            raise ValueError(
                f"{type(self).__name__}: got an empty list of parameters: "
                f"{type(target).__name__}.parameters() gives none, so no step can change "
                f"anything. {cause}")
        params = [p for p in params if p.grad is not None]
        # a frozen parameter is never written: read-only weights may be frozen (FreezeParam)
        frozen = {id(q) for hook in self.hooks if isinstance(hook, FreezeParam)
                  for q in hook.freeze_params}
        for p in params:
            self._check(p, id(p) not in frozen)
        return params

    def _apply(self, params):
        self._update_params(*self._run_hooks(params))

    def _run_hooks(self, params):
        """Run the hooks (FreezeParam's first) on `params`; returns those that still have a
        gradient, and the grad each lazy (Dask) one of `params` had before (for _update_params).
        A hook that raises leaves a lazy parameter's grad as it was: the hooks before it set new
        ones (WeightDecay, ClipGrad), which a step tried again would hook again. Not an eager
        one's: holding its old gradient through the hooks would hold the step's gradients twice
        (a Dask gradient is a recipe, which costs no memory until it is worked out)."""
        before = [(p, p._grad) for p in params if p.backend.lazy]
        hooks = ([h for h in self.hooks if isinstance(h, FreezeParam)]
                 + [h for h in self.hooks if not isinstance(h, FreezeParam)])
        ran = 0
        try:
            for hook in hooks:
                hook(params)
                ran += 1
                # a hook may drop a gradient (FreezeParam): the hooks after it never see None
                params = [p for p in params if p.grad is not None]
        except BaseException as error:
            _put_back_grads(before)
            eager = sum(1 for p in params if not p.backend.lazy)
            if ran and eager:  # said, as a retry would hook the hooked gradients again
                names = ", ".join(getattr(h, "__qualname__", None) or type(h).__name__
                                  for h in hooks[:ran])
                add_note(error, f"the optimizer's hooks before the one that raised ({names}) "
                         f"ran on the gradients of {eager} parameter{'s' if eager > 1 else ''}, "
                         "which keep what those hooks set: run backward again before trying "
                         "the step again")
            raise
        return params, before

    def _update_params(self, params, before=()):
        """`update_one` on each of `params`, counted as a write; Dask results persisted. Dask
        raises only when it works a step out (an out-of-range label, say): then the lazy
        parameters, their state and counts are put back as they were, and the error re-raised,
        with their grads as `before` ((parameter, grad) before the hooks) holds them: a lazy
        step is undone whole, and tried again it sees the gradients backward left, not those the
        hooks made of them."""
        lazy = [p for p in params if p.backend.lazy]
        kept = [self._kept(p) for p in lazy]
        try:
            for p in params:
                version = p.version
                with p.backend.device_context(p.device):
                    self.update_one(p)
                if p.version == version:  # updated in place, not through the data setter: count it
                    note_write(p)
                    if _variables.blocks_running[0]:  # a checkpointed block would step twice
                        _variables.note_block_write(p, "in place")
            if lazy:  # Dask: else each step's parameters would hold the graph of every step before
                self._persist(lazy, kept)
        except BaseException:
            for k in kept:
                self._put_back(*k)
            _put_back_grads(before)
            raise
        if not params:
            # nothing updated (every parameter frozen): what forwards queued to be worked out
            # with the parameters (BatchNorm's running statistics) is worked out now, else its
            # graph would grow with every forward
            for backend in backends.registered():
                if backend.lazy:
                    backend.persist([])

    def _kept(self, p):
        """(p, its array, copies of its state and counts or None): what a step changes of p."""
        state, counts = self.state.get(p), self.state_counts.get(p)
        return (p, p._data, None if state is None else dict(state),
                None if counts is None else dict(counts))

    def _put_back(self, p, data, state, counts):
        """p's array, state and counts as `_kept` kept them (state made since is dropped)."""
        p._data = data
        for held, old in ((self.state, state), (self.state_counts, counts)):
            live = held.get(p)
            if old is None:
                held.pop(p, None)
            elif live is None:
                held[p] = old
            else:  # the same dict, which whoever read it before the step still holds
                live.clear()
                live.update(old)

    def _persist(self, params, kept):
        """Work out the lazy parameters and their state arrays now, all in one pass (the
        same values: not a write), so a training loop's graph does not grow step after step.
        Each in the layout (Dask: chunks) the parameter had before the step (`kept`): its
        gradient may come in others, which the update takes on."""
        backend = params[0].backend
        states = [self.state.get(p) or {} for p in params]
        for p, state, (_, data, _, _) in zip(params, states, kept):
            layout = backend.layout(data)
            p._data = backend.laid_out(p._data, layout)
            for name, a in state.items():
                if backend.owns(a):
                    state[name] = backend.laid_out(a, layout)
        arrays = [p.data for p in params] + [a for state in states for a in state.values()
                                             if backend.owns(a)]
        done = iter(backend.persist(arrays))
        for p in params:
            p._data = next(done)
        for state in states:
            for name, a in state.items():
                if backend.owns(a):
                    state[name] = next(done)

    def _check(self, p, written=True):
        where = type(self).__name__
        g = p.grad
        if not isinstance(g, Variable):
            raise TypeError(f"{where}: the grad of {_describe(p)} is a {type(g).__name__}; "
                            "gradients are Variables (as backward leaves them)")
        if p.data is None or g.data is None:
            raise ValueError(f"{where}: {_describe(p)} has a gradient but no data" if p.data is None
                             else f"{where}: the grad of {_describe(p)} has no data (grad.data is "
                             "None); set grad to None instead")
        if g.shape != p.shape:
            raise ValueError(f"{where}: the grad of {_describe(p)} has shape {tuple(g.shape)}; "
                             "it must have the parameter's shape")
        if written and update_dtype(p) is None:
            raise TypeError(f"{where}: {_describe(p)} holds {p.dtype} data and has a gradient; "
                            "only floating-point parameters are trained (a step would be "
                            "truncated to integers). Set its grad to None, leave it out of the "
                            "optimizer (or freeze it: FreezeParam), or cast it to a float dtype")
        if written and not p.backend.writable(p.data):
            raise ValueError(f"{where}: {_describe(p)} holds a read-only array (from "
                             "numpy.load(mmap_mode='r'), broadcast_to or frombuffer, say), which "
                             "a step writes in place; give it a copy first: "
                             "param.data = param.data.copy() (array API: "
                             "param.xp.asarray(param.data, copy=True))")
        if g.backend is not p.backend or (not p.backend.single_device and g.device != p.device):
            raise ValueError(f"{where}: {_describe(p)} is on {p.device} but its grad is on "
                             f"{g.device}; move both together (param.to_gpu()/to_cpu() move "
                             "the grad too) or call zero_grad() after moving the model")
        state = self.state.get(p)
        if state:
            for name, a in state.items():
                if a.shape != p.shape:
                    raise ValueError(
                        f"{where}: {_describe(p)} changed shape since its state {name!r} was "
                        f"made (shape {tuple(a.shape)}); drop the old state with "
                        "`del optimizer.state[param]`")

    def state_names_with(self, hyperparameters):
        """The state_names this optimizer keeps with these hyperparameters (name -> value):
        its state_names, but where a subclass's depend on them (RMSprop's momentum buffer)."""
        return self.state_names

    def param_state(self, param):
        """The state arrays of `param` (a dict name -> array, see `state_names`): zeros on the
        parameter's device, in its update_dtype (float32 for a float16 parameter), at its first
        update; moved (and cast) to follow the parameter when it has moved to another device
        since (e.g. model.to(device)) or been cast."""
        state = self.state.get(param)
        if state is None:
            backend, device = param.backend, param.device
            shape, dtype = param.shape, update_dtype(param) or param.dtype
            state = {name: backend.zeros(shape, dtype, device) for name in self.state_names}
            self.state[param] = state
            if self.state_counters:  # new state, counted from 0 (after `del optimizer.state[p]`)
                self.state_counts[param] = dict.fromkeys(self.state_counters, 0)
        elif state:
            a = next(iter(state.values()))
            backend = backends.backend_of(a)
            # the parameter's own dtype first: update_dtype is looked up for float16 ones only
            if (backend is not param.backend
                    or a.dtype != param.dtype and a.dtype != update_dtype(param)
                    or not backend.single_device and backend.device_of(a) != param.device):
                for name, a in state.items():
                    state[name] = _on_param(a, param)
        return state

    def param_counts(self, param):
        """The per-parameter counts of `param` (a dict name -> int, see `state_counters`): 0 with
        new state; for state given without them, the counter `counter_fallback` names."""
        counts = self.state_counts.get(param)
        if counts is None:
            counts = {name: int(getattr(self, self.counter_fallback[name], 0))
                      if name in self.counter_fallback else 0 for name in self.state_counters}
            self.state_counts[param] = counts
        return counts

    # ---------------------------------------------------------------- saving and loading
    def state_dict(self):
        """Hyperparameters and per-parameter state (copies), PyTorch-style:
        {"type", "hyperparameters", "counters", "initial_lr", "shapes",
        "state": {position: {name: array or count}}}, where a position is the parameter's index
        in the target's parameter order; with "names" too (each parameter's, "l1.W" style) when
        the target is a model, so that loading can tell the parameters apart. An optimizer
        holding state in attributes of its own (a DeZero-style subclass's self.lr, self.vs)
        raises TypeError naming them: the dict could not resume it."""
        _check_saved_everything(f"{type(self).__name__}.state_dict", self._unsaved_attributes())
        params = self._parameters()
        names = self._parameter_names(params)
        state = {}
        for position, p in enumerate(params):
            s = self.state.get(p)
            if s:
                state[position] = {name: backends.copy(a) for name, a in s.items()}
                if self.state_counters:
                    state[position].update(self.param_counts(p))
        initial_lr = getattr(self, "initial_lr", None)
        saved = {
            "type": type(self).__name__,
            "hyperparameters": dict(self.hyperparameters),
            "counters": {name: int(getattr(self, name)) for name in self.counters},
            "initial_lr": None if initial_lr is None else float(initial_lr),
            "shapes": [None if p.data is None else tuple(p.shape) for p in params],
            "state": state,
        }
        if names is not None:
            saved["names"] = names
        return saved

    def _unsaved_attributes(self):
        """The names of the attributes holding state (numbers, arrays, containers) that
        state_dict() cannot save: neither the base class's own nor a declared hyperparameter or
        counter. A name, a callback or another object of the user's is no state."""
        return sorted(name for name, value in vars(self).items()
                      if name not in _SAVED_ATTRIBUTES and name not in self.defaults
                      and name not in self.counters and _holds_state(value))

    def _parameter_names(self, params):
        """The name of each of `params` in the target (a model with named_parameters()), or None
        when the target cannot name every one (a list of parameters)."""
        named = getattr(self.target, "named_parameters", None)
        if not callable(named):
            return None
        name_of = {}
        for name, p in named():
            name_of.setdefault(id(p), name)  # a shared parameter: its first name
        names = [name_of.get(id(p)) for p in params]
        return None if None in names else names

    def load_state_dict(self, state_dict):
        """Restore what `state_dict()` returned (arrays may be on any backend or device; they
        are copied onto each parameter's device and dtype). Everything is checked first: the
        optimizer type, the hyperparameter and state names, the number of parameters and each
        shape, and each parameter's name where the state_dict has names (saved from an
        optimizer of a model); on a mismatch nothing changes. A state_dict without names (saved
        from an optimizer given a list of parameters, or by an older gradcore) loads by position.
        A state_dict from before per-parameter counts (Adam's "step") were saved gives each
        parameter the optimizer counter they fall back to (Adam's t)."""
        where = f"{type(self).__name__}.load_state_dict"
        _check_format(where, state_dict, type(self).__name__)
        _check_saved_everything(where, self._unsaved_attributes())
        hyper = _checked_hyperparameters(where, state_dict["hyperparameters"], self.defaults)
        counters = _checked_counters(where, state_dict["counters"], self.counters)
        has_initial_lr = "initial_lr" in state_dict  # absent from older state_dicts
        initial_lr = state_dict.get("initial_lr")
        if initial_lr is not None:
            initial_lr = checked_hyperparameter(where, "initial_lr", initial_lr, rule="lr")
        params = self._parameters()
        if state_dict.get("names") is not None:  # first: a name says more than a shape
            _check_names(where, state_dict["names"], self._parameter_names(params))
        _check_shapes(where, state_dict["shapes"], params)
        loaded = _checked_state(where, state_dict["state"], params,
                                self.state_names_with(hyper), self.state_counters,
                                self.kept_state_names)

        new_state, new_counts = ParamState(), ParamState()
        for p, arrays, counts in loaded:  # copies on the parameter's device and dtype
            new_state[p] = {name: _on_param(a, p, copy=True) for name, a in arrays.items()}
            if self.state_counters:
                new_counts[p] = {
                    name: int(counts[name]) if name in counts
                    else int(counters.get(self.counter_fallback.get(name), 0))
                    for name in self.state_counters}
        for name, value in hyper.items():
            setattr(self, name, value)
        for name, value in counters.items():
            setattr(self, name, int(value))
        if has_initial_lr:
            self.initial_lr = initial_lr
        self.state, self.state_counts = new_state, new_counts



# The attributes every optimizer has, which state_dict() saves or which are the caller's to set
# up again (the target and the hooks)
_SAVED_ATTRIBUTES = frozenset({"target", "hooks", "state", "state_counts", "initial_lr"})

# Hyperparameters of other optimizers, gradcore's and PyTorch's (and the ClipGrad hook's), which
# gradcore's own optimizers refuse as attributes where they have no such hyperparameter
_OTHER_HYPERPARAMETERS = frozenset({
    "lr", "alpha", "momentum", "rho", "eps", "beta1", "beta2", "betas", "weight_decay",
    "dampening", "nesterov", "maximize", "foreach", "differentiable", "fused", "capturable",
    "amsgrad", "decoupled_weight_decay", "lr_decay", "initial_accumulator_value", "centered",
    "lambd", "t0", "etas", "step_sizes", "momentum_decay", "beta2_decay", "max_norm",
})


def _has_setter(cls, name):
    """True if `cls` has a property (a data descriptor) called `name`: its setter decides."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return hasattr(type(vars(klass)[name]), "__set__")
    return False


def _accepted(cls):
    """Every keyword `cls`'s constructor takes: the hyperparameters, their aliases, and others
    (Adam's betas)."""
    names = list(cls.defaults)
    return names + [a for a in (*cls.aliases, *cls.keywords) if a not in names]


def _accepts(cls, key):
    """'it accepts ...' and a hint for `key`, a hyperparameter `cls` does not have: the end of
    the error of the constructor given it, and of setting it later."""
    hint = ""
    if key == "weight_decay":
        hint = "; for L2 weight decay use optimizer.add_hook(WeightDecay(rate)), or AdamW"
    elif key == "momentum":
        hint = ("; Adam's momentum is beta1 (betas[0])" if "beta1" in cls.defaults
                else "; use MomentumSGD for momentum")
    elif key == "max_norm":
        hint = "; for gradient clipping use optimizer.add_hook(ClipGrad(max_norm))"
    elif key == "lr_decay":
        hint = "; for a decaying lr use a schedule from gradcore.optim.lr_scheduler"
    elif key == "maximize":
        hint = "; to maximize, minimize the negated objective"
    else:
        owners = sorted(k.__name__ for k in _gradcore_optimizers() if key in _accepted(k))
        if owners:
            hint = f"; {key} is {' and '.join(owners)}'s"
    return f"it accepts {', '.join(_accepted(cls)) or 'none'}{hint}"


def _gradcore_optimizers():
    """gradcore's own optimizer classes (subclasses of Optimizer defined in gradcore)."""
    found, todo = [], [Optimizer]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("gradcore."):
                found.append(sub)
    return found


Optimizer._redirected = frozenset()  # a user's subclass of the base sets what it likes


# the base class's own steps too (__init_subclass__ wraps the subclasses')
Optimizer.update = _eager_in_replay(Optimizer.update)
Optimizer.step = _eager_in_replay(Optimizer.step, closure_first=True)


def _put_back_grads(grads):
    """Each (parameter, grad) of `grads`: the parameter's grad set back to that Variable (or
    None)."""
    for p, g in grads:
        p.grad = g


def nonzero_eps(xp, dtype, eps):
    """`eps` (a float), or the smallest positive number of `dtype` where eps would round to 0 in
    it (float16: 1e-8 does), so that sqrt(v) + eps is never 0 and a zero gradient's step is 0,
    not 0 / 0. float32 and float64 hold 1e-8: eps as given. In float16, sqrt(v) + 1e-8 is
    sqrt(v) for any sqrt(v) above its subnormals, so only the 0 / 0 changes."""
    info = xp.finfo(dtype)
    smallest = float(info.smallest_normal) * float(info.eps)  # the array API names no subnormal
    return eps if eps >= smallest else smallest


def _on_param(array, param, copy=False):
    """`array` (a state array) on `param`'s device, in its update_dtype; a new array if `copy`."""
    moved = backends.to_device(array, param.device)
    dtype = update_dtype(param) or param.dtype  # an integer parameter's: its own
    if moved.dtype != dtype:
        with param.backend.device_context(param.device):
            return param.xp.astype(moved, dtype)  # astype copies
    return backends.copy(moved) if copy else moved


# ================================================== load_state_dict's checks, in the order it runs
def _check_format(where, state_dict, kind_here):
    """TypeError unless `state_dict` is a dict with state_dict()'s keys; ValueError if it is
    from another type of optimizer."""
    keys = ("type", "hyperparameters", "counters", "shapes", "state")
    if not isinstance(state_dict, Mapping) or any(k not in state_dict for k in keys):
        raise TypeError(f"{where}: expected a dict from optimizer.state_dict() with keys "
                        f"{', '.join(keys)}; got {type(state_dict).__name__}"
                        + (f" with keys {sorted(map(str, state_dict))}"
                           if isinstance(state_dict, Mapping) else ""))
    kind = state_dict["type"]
    if kind != kind_here:
        raise ValueError(f"{where}: this state_dict is from a {kind} optimizer; load it into "
                         f"a {kind}")


def _holds_state(value):
    """True for what training may change and a resumed run would need: a number, an array, or a
    dict, list or tuple (DeZero's self.vs)."""
    return (isinstance(value, (numbers.Number, dict, list, tuple)) and not isinstance(value, bool)
            or backends.is_array(value))


def _check_saved_everything(where, unsaved):
    """TypeError if the optimizer holds attributes of its own, `unsaved`, that state_dict() could
    not save: resuming without them would silently start them anew (lr from its default, a
    velocity from zeros)."""
    if unsaved:
        raise TypeError(
            f"{where}: this optimizer keeps {', '.join(unsaved)} as attributes of its own, which "
            "state_dict() cannot save, so a state_dict cannot resume it. Declare hyperparameters "
            "in the class's `defaults` (defaults = {'lr': 0.01, 'momentum': 0.9}), per-parameter "
            "arrays in `state_names` (kept by self.param_state(param)) and integer counters in "
            "`counters` (see help(gradcore.optim.Optimizer)); or save and restore these "
            "attributes yourself")


def _checked_hyperparameters(where, given, defaults):
    """The saved hyperparameters as floats (bools where the default is one), once their names
    are those in `defaults`."""
    hyper = dict(given)
    _same_names(where, "hyperparameters", hyper, defaults)
    return {name: checked_value(where, name, v, defaults[name]) for name, v in hyper.items()}


def _checked_counters(where, given, names):
    """The saved counters as ints, once their names are `names` and each is an integer >= 0."""
    counters = dict(given)
    _same_names(where, "counters", counters, names)
    for name, value in counters.items():
        counters[name] = _checked_count(where, f"counter {name}", value)
    return counters


def _checked_count(where, what, value):
    """`value` as an int, once it is an integer >= 0: a Python or NumPy integer, or a 0-d
    integer array (what numpy.load gives back for a count saved to an .npz)."""
    count = as_integer(value)
    if count is None or count < 0:
        raise ValueError(f"{where}: {what} must be an integer >= 0, got {value!r}")
    return count


def _check_shapes(where, saved, params):
    """ValueError unless `saved` has one shape per parameter, each the parameter's own."""
    shapes = list(saved)
    if len(shapes) != len(params):
        raise ValueError(f"{where}: the state_dict is for {len(shapes)} parameter(s), this "
                         f"optimizer has {len(params)}; load it into an optimizer of the same "
                         "model")
    for position, (p, shape) in enumerate(zip(params, shapes)):
        current = None if p.data is None else tuple(p.shape)
        shape = None if shape is None else tuple(shape)
        if shape != current:
            hint = (" (not initialized yet: run one forward pass first)"
                    if current is None else "")
            raise ValueError(f"{where}: parameter {position} has shape {shape} in the "
                             f"state_dict but {current} here{hint}")


def _check_names(where, saved, here):
    """ValueError unless the saved parameter names are those of this optimizer's parameters, in
    the same order (`here`: None when its parameters have no names to compare)."""
    saved = [str(name) for name in saved]
    if here is None:
        kind = where.split(".")[0]
        raise ValueError(
            f"{where}: the state_dict names its parameters ({', '.join(saved[:3])}"
            f"{', ...' if len(saved) > 3 else ''}) but this optimizer was given its parameters "
            "without names (a list), so it cannot tell that each state goes to its own "
            f"parameter: give the optimizer the model (as when it was saved: {kind}(model)), "
            "or to load by position, in the order saved, drop the names first "
            "(state_dict.pop('names'))")
    if len(saved) != len(here):
        return  # _check_shapes says how many each has
    for position, (name, own) in enumerate(zip(saved, here)):
        if name != own:
            raise ValueError(
                f"{where}: parameter {position} is {own} here but {name} in the state_dict "
                "(the model's parameters are in another order, or it is another model): load "
                "it into an optimizer of the same model, built the same way (if only the names "
                "changed and the order is the same, drop them: state_dict.pop('names'))")


def _checked_state(where, state, params, state_names, state_counters=(), kept=()):
    """[(parameter, its saved arrays, its saved counts)], once each position, state name, array,
    shape and count is checked (counts may be missing: older state_dicts have none; arrays
    named in `kept` may be there beside state_names)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"{where}: 'state' must be a dict position -> dict of arrays, got "
                        f"{type(state).__name__}")
    loaded = []
    for position, arrays in state.items():
        if not isinstance(position, numbers.Integral) or not 0 <= position < len(params):
            raise ValueError(f"{where}: state key {position!r} is not a parameter position "
                             f"(0 to {len(params) - 1})")
        p = params[position]
        if not isinstance(arrays, Mapping):
            raise TypeError(f"{where}: the state of parameter {position} must be a dict "
                            f"name -> array, got {type(arrays).__name__}")
        counts = {name: n for name, n in arrays.items() if name in state_counters}
        arrays = {name: a for name, a in arrays.items() if name not in state_counters}
        _same_names(where, f"state names of parameter {position}",
                    [name for name in arrays if name not in kept or name in state_names],
                    state_names)
        counts = {name: _checked_count(where, f"count {name!r} of parameter {position}", n)
                  for name, n in counts.items()}
        for name, a in arrays.items():
            if not backends.is_array(a):
                raise TypeError(f"{where}: state {name!r} of parameter {position} is a "
                                f"{type(a).__name__}, not an array")
            if tuple(a.shape) != tuple(p.shape):
                raise ValueError(f"{where}: state {name!r} of parameter {position} has "
                                 f"shape {tuple(a.shape)}, the parameter {tuple(p.shape)}")
            _check_fits(where, f"state {name!r} of parameter {position}", a, p)
        loaded.append((p, arrays, counts))
    return loaded


def _check_fits(where, what, array, param):
    """ValueError if a value of `array` does not fit the dtype of `param`'s state, which it is
    cast to (1e40 into float32 would be inf), as Module.load_state_dict checks a model's
    values."""
    target, dtype = _numpy_dtype(update_dtype(param) or param.dtype), _numpy_dtype(array.dtype)
    if dtype == target:
        return  # no cast: no copy to the host
    if target.kind == "f" and dtype.kind != "f":
        raise ValueError(f"{where}: {what} holds {dtype} values, where the optimizer keeps "
                         f"{target} ones: integers and booleans are not loaded as floats (state "
                         "saved for another parameter?); convert them first if they are the "
                         "state. Nothing was loaded.")
    problem = _unfit(_host_array(array), target, what)
    if problem is not None:
        raise ValueError(f"{where}: {problem}. Nothing was loaded.")


def _same_names(where, what, given, expected):
    """ValueError unless the names in `given` are those in `expected`."""
    extra = sorted(set(map(str, given)) - set(expected))
    missing = [n for n in expected if n not in given]
    if extra or missing:
        raise ValueError(f"{where}: {what} do not match this optimizer: "
                         + "; ".join(filter(None, [
                             f"unexpected {', '.join(extra)}" if extra else "",
                             f"missing {', '.join(missing)}" if missing else ""])))


def _plain_variables(model):
    """'Net.W'-style names of the Variables (not Parameters) that `model` and its sub-modules
    hold as attributes: weights a newcomer made with Variable(...), which no optimizer sees."""
    modules = model.named_modules() if callable(getattr(model, "named_modules", None)) else (
        ("", model),)
    return [f"{type(model).__name__}.{prefix + '.' if prefix else ''}{name}"
            for prefix, module in modules
            for name, value in getattr(module, "__dict__", {}).items()  # none with __slots__
            if isinstance(value, Variable) and not isinstance(value, Parameter)]
