"""Module: parameters, buffers and sub-modules registered by assignment; modes, hooks, devices,
state dicts, and save/load through checkpoint.py."""
import collections
import collections.abc
import itertools
import os
import threading
import types
import warnings
import weakref

import numpy

import backends

from ..config import _module_test_mode, _train, in_module_test_mode, recomputing, training
from .. import recompute as _recompute
from ..random import noted
from .. import variable as _variables
from ..utils import plot_dot_graph
from ..utils.download import (_checked_sha256, cache_folder, fetch, sha256_folder, sha256_of_file,
                              url_file_name)
from ..variable import Parameter, Variable, note_write
from .checkpoint import (FORMAT_KEY, FORMAT_VERSION, CheckpointError, _check_binary,
                         _check_entry_names, _checkpoint_source, _is_file_object,
                         _open_checkpoint, _read_arrays, _read_headers, _write_archive,
                         _write_atomically)

_PARAMETER, _BUFFER, _MODULE = "parameter", "buffer", "module"
_FLOAT_NAMES = ("float16", "float32", "float64")
# attributes Module.__init__ sets: reading one that is missing means __init__ never ran
_INTERNALS = frozenset({"_registered", "_forward_pre_hooks", "_forward_hooks", "training",
                        "_device", "_dtype", "_gradcore_list_names"})
_hook_ids = itertools.count()


# not None while a checkpointed block first runs (gradcore.recompute.states_set): read once per
# setting of an attribute that is not registered
_in_block = _recompute.states_set.get
# Parameter -> {id(module): weak reference} of each module given it as an attribute (by
# __setattr__, or by __setstate__ in a copy), the Parameter held weakly too: whether another
# module still holds a Parameter a layer is about to empty (W = None, see layers._emptied) is
# found without walking every module alive. An entry outlives its module, or the module letting
# go of the Parameter: _held_by_a_module looks again.
_holders = weakref.WeakKeyDictionary()
# Bumped whenever a Module gains, loses or replaces a Parameter, buffer or sub-Module (and
# when a requires_grad or a hook changes): see gradcore.variable
structure_changes = _variables.structure_changes
# Bumped whenever any Module registers, replaces, empties (b = None) or unregisters a Parameter,
# buffer or sub-Module: only then can what a Module's parameters() and buffers() yield change,
# so a walk made at one count still holds while the count stays (DistributedOptimizer reads its
# parameters and buffers again only when it moved). Unlike structure_changes, hooks and
# requires_grad leave it alone.
registry_changes = [0]
# The modules in eval mode now, as a number that comes back when they do (training and
# evaluating by turns finds the tapes of each again): a step gradcore.compile recorded ran each
# module in the mode it had then, so another mode means another tape
mode_key = [0]
# id -> a weak reference to each live module in eval mode (a module may be unhashable); a
# module's entry goes when it dies
_in_eval = {}
# frozenset of the ids of the modules in eval mode -> its number, the most recently used last;
# none in eval mode, as at the start, is 0. Only the MODE_NUMBERS_KEPT most recent are kept (a
# loop that makes a model per trial and evaluates it makes a set per model); a set forgotten
# gets a new number when it comes back, never one handed out before, so no tape keyed by an old
# number can match another set
MODE_NUMBERS_KEPT = 64
_mode_numbers = collections.OrderedDict({frozenset(): 0})
_new_mode_number = itertools.count(1).__next__


# id -> a weak reference to each live Module a recorded step reached (gradcore.compile): a tape
# took the numbers and objects in its attributes as they were (`dropout_ratio`, `eps`, a plain
# Variable), so replacing one there counts as a change (structure_changes)
_watched = {}
# values of these kinds set again equal to what an attribute holds are no change (a ratio a
# schedule computes anew at each step); gradcore.compile keys arguments of these kinds by value
_BY_VALUE = frozenset((int, float, bool, str, type(None)))
_ABSENT = object()


class _Carried:
    """A name in a Module class's `_gradcore_carried` (an RNN's `h`): kept in the module's
    __dict__ as any attribute is, its reads told to a gradcore.compile recording, so that a tape
    that read the state before the step set it replays only where the state is the one it read
    (Recorder.module_state_read), and one that set it first replays whatever eager code left
    there between calls."""

    __slots__ = ("name", "default")

    def __init__(self, name, default):
        self.name, self.default = name, default

    def __get__(self, module, kind=None):
        if module is None:
            return self
        value = module.__dict__.get(self.name, self.default)
        if _variables.step_recorder is not None:  # absent: read as None (getattr(m, "h", None))
            _variables.step_recorder.module_state_read(
                module, self.name, None if value is _NO_DEFAULT else value)
        if value is _NO_DEFAULT:
            raise AttributeError(f"{type(module).__name__!r} object has no attribute "
                                 f"{self.name!r}")
        return value

    def __set__(self, module, value):
        module.__dict__[self.name] = value

    def __delete__(self, module):
        try:
            del module.__dict__[self.name]
        except KeyError:
            raise AttributeError(self.name) from None


_NO_DEFAULT = object()  # a carried name with no class default


def _made_in_recording(module):
    """Whether `module` was made in a step gradcore.compile records now, in this thread."""
    recorder = _variables.step_recorder
    return recorder is not None and recorder.is_active() and recorder.made_module(module)


def _structure_changed(module):
    """`module` registered, replaced or unregistered a Parameter, buffer or sub-Module: the
    walks of parameters() made before no longer hold (registry_changes), nor, unless the
    module was made in the step being recorded (no tape can have read a module made since it
    began, and a Sequential the step builds at each call would key every call anew), the
    tapes of compiled steps (structure_changes)."""
    registry_changes[0] += 1
    if not _made_in_recording(module):
        structure_changes[0] += 1


def _reads_noted(cls, name):
    """Whether `name` is carried on a `cls` module and read through a _Carried (so telling a
    recording): not where _gradcore_carried was assigned after the class was made."""
    if name not in cls._gradcore_carried:
        return False
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return isinstance(klass.__dict__[name], _Carried)
    return False


def watch(modules):
    """Replacing an attribute of one of these Modules (a recorded step's) counts as a change: see
    Module.__setattr__."""
    for module in modules:
        i = id(module)
        _watched[i] = weakref.ref(module, lambda ref: _watched.get(i) is ref and _watched.pop(i))


def _in_slot(module, name):
    """Whether module.name is held in a __slots__ slot of its class (not in its __dict__)."""
    return isinstance(getattr(type(module), name, None), types.MemberDescriptorType)


def _replaces(module, name, value):
    """Whether `module.name = value` changes what a tape that read module.name took."""
    watched = _watched.get(id(module))
    if watched is None or watched() is not module:
        return False
    old = module.__dict__.get(name, _ABSENT)
    return old is not value and not (old.__class__ is value.__class__
                                     and value.__class__ in _BY_VALUE
                                     and _variables.same_value(old, value))  # -0.0 is not 0.0


def _resumes_train():
    """Whether a train-mode module called in test mode runs in train mode: where that test mode
    is an eval-mode module's around it (see Module._forward_in_mode), not one set explicitly. A
    checkpointed block notes the answer with its draws, so that computed again in backward
    (under the Config.train it was called with; the module's own test mode around it gone) it
    runs each module as it first ran."""
    if _in_block() is None and not recomputing():
        return in_module_test_mode()
    return noted("a train-mode module's mode", in_module_test_mode)


def _note_mode(module, training):
    if training:
        _in_eval.pop(id(module), None)
    else:
        i = id(module)
        _in_eval[i] = weakref.ref(module, lambda ref: _in_eval.get(i) is ref and _died_in_eval(i))


# ids of modules that died in eval mode, not yet taken out of _mode_numbers' sets: appended by
# the weak reference's callback, which may run in the middle of _modes_changed (a collection)
_died = []
# train() and eval() called in several threads at once take turns in _modes_changed: draining
# _died (a test, then a pop) and rebuilding _mode_numbers from a copy are not atomic. Reentrant:
# a finalizer that calls eval(), run by a collection inside it, must not deadlock.
_modes_lock = threading.RLock()


def _died_in_eval(i):
    _in_eval.pop(i, None)
    _died.append(i)


def _forget_dead():
    """Take the ids in _died out of every set in _mode_numbers, each set keeping its number: the
    modes in force do not change when a module in eval mode dies, so neither does mode_key (a
    new number would make gradcore.compile record the step again, at a time set by the garbage
    collector). Where two sets become one, the number in force (mode_key's) wins, else the
    later. Called under _modes_lock."""
    dead = set()
    while _died:  # only the lock's holder pops; the weak references' callbacks only append
        dead.add(_died.pop())
    current, renamed = mode_key[0], collections.OrderedDict()
    for ids, number in list(_mode_numbers.items()):
        kept = ids - dead
        if renamed.get(kept) != current:
            renamed.pop(kept, None)
            renamed[kept] = number
    _mode_numbers.clear()
    _mode_numbers.update(renamed)


def _modes_changed():
    with _modes_lock:
        if _died:
            _forget_dead()
        # not one a recording step made: eagerly each call makes another, which dies with it
        # (the next call's modes are those it found), and modes key compiled steps' tapes
        alive = frozenset(i for i, module in [(i, ref()) for i, ref in list(_in_eval.items())]
                          if module is not None and not _made_in_recording(module))
        number = _mode_numbers.pop(alive, None)
        if number is None:
            number = _new_mode_number()
            while len(_mode_numbers) >= MODE_NUMBERS_KEPT:
                _mode_numbers.popitem(last=False)
        _mode_numbers[alive] = number
        mode_key[0] = number


class IncompatibleKeys(collections.namedtuple("IncompatibleKeys",
                                              ["missing_keys", "unexpected_keys"])):
    """What `load_state_dict(strict=False)` skipped: names the model has that the state lacked,
    and names the state has that the model lacks."""


class _Hooks(dict):
    """A module's forward (pre-)hooks by id, in the order registered. Its handles hold it
    weakly: a handle kept in a list keeps no hook alive, nor the module a hook's closure
    refers to."""

    __slots__ = ("__weakref__",)


class RemovableHandle:
    """Returned by the `register_*_hook` methods; `remove()` unregisters the hook (twice, or
    after the module died, is harmless)."""

    __slots__ = ("_hooks", "_id")

    def __init__(self, hooks, hook_id):
        self._hooks = weakref.ref(hooks)
        self._id = hook_id

    def remove(self):
        hooks = self._hooks()
        if hooks is not None and hooks.pop(self._id, None) is not None:
            _variables.settings_changed()


class Module:
    """A layer or a model (DeZero's `Layer` and `Model` are this class).

    Assigning a `Parameter` or a `Module` to an attribute registers it, in assignment order:
    reassigning keeps its position, assigning None keeps the name registered (an empty slot,
    skipped by parameters() and state_dict; what it means is the layer's: Linear's and the
    convolutions' W and BatchNorm's four are created again at the next call, while b = None
    means no bias, as in DeZero), `del` unregisters it. Buffers (state that is saved and moved
    but not trained, such as BatchNorm's running mean) are registered with `register_buffer`.
    Any name will do for these but "" and names holding "." (which could clash with the
    qualified names of state_dict, "l1.W"), as in PyTorch.

    Layers or Parameters in a plain list, tuple, dict, set or deque (or a subclass: OrderedDict,
    defaultdict, a namedtuple) are not registered: hold them in an nn.ModuleList, nn.ModuleDict,
    nn.ParameterList or nn.ParameterDict, or also assign each to an attribute as DeZero's MLP
    does. Such an attribute holding a Module or Parameter (also in a container inside it, as
    [{"fc": layer}]) registered nowhere in the model is warned about (once per class and attribute)
    when its parameters are collected (an optimizer's first step, state_dict, save, to()); so
    is, when assigned, a Variable that is a leaf requiring grad but not a Parameter (it would
    get a .grad and never be trained or saved).

    Train mode: each module has a `training` flag (`train()` / `eval()` set it on the whole
    subtree), and each module's own flag decides how it runs, as in PyTorch: a module in eval
    mode runs its forward under `gradcore.test_mode()` (its functional ops, such as `F.dropout`
    in its forward, run in test mode, and so do its sub-modules in eval mode), and a sub-module
    switched back to train mode (`model.eval(); model.dropout.train()`, MC dropout) runs in train
    mode even when an eval-mode parent calls it: a module's own train() wins over its parents'
    eval() only. `with gradcore.test_mode():` or `using_config("train", False)` (or either
    decorating a function, or Config.train = False), around a call or inside a forward, puts
    every module in it into test mode, training ones too, as in DeZero. Modes apply through
    `module(x)`: calling `module.forward(x)` directly skips them (and the forward hooks), so an
    F.dropout in it follows Config.train alone.
    """

    # attributes that carry state from one call to the next (RNN's h), which a user may set to
    # a Variable of their own (a first state): not warned about as an unregistered weight, and
    # read through a _Carried (see __init_subclass__)
    _gradcore_carried = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # a class's carried names add to its bases' (an RNN subclass carrying s carries h too),
        # a mixin's among them
        cls._gradcore_carried = tuple(dict.fromkeys(
            name for klass in reversed(cls.__mro__)
            for name in klass.__dict__.get("_gradcore_carried", ())))
        for name in cls._gradcore_carried:
            if not _reads_noted(cls, name):
                # a class default (h = None) is what a module without its own value reads
                setattr(cls, name, _Carried(name, getattr(cls, name, _NO_DEFAULT)))

    def __new__(cls, *args, **kwargs):
        module = super().__new__(cls)
        recorder = _variables.step_recorder
        if recorder is not None and recorder.is_active():
            # made in a step gradcore.compile records: what it registers and sets is the
            # step's own, and changes no other step's key (_structure_changed)
            recorder.modules_made[id(module)] = weakref.ref(module)
        return module

    def __init__(self):
        set_ = object.__setattr__
        set_(self, "_registered", {})         # name -> "parameter" | "buffer" | "module"
        registry_changes[0] += 1  # a module initialised again loses what it registered
        set_(self, "_forward_pre_hooks", _Hooks())  # id -> hook(module, inputs)
        set_(self, "_forward_hooks", _Hooks())      # id -> hook(module, inputs, output)
        set_(self, "training", True)
        set_(self, "_device", None)  # where the last .to() put it: for loading into lazy slots
        set_(self, "_dtype", None)
        # names given a container, a list or a dict... (see _warn_listed); a long name: a
        # subclass's own attributes, `_lists` among them, are the user's
        set_(self, "_gradcore_list_names", set())

    # ---------------------------------------------------------------- registration
    def __setattr__(self, name, value):
        registered = self.__dict__.get("_registered")
        if isinstance(value, (Parameter, Module)):
            if registered is None:
                raise AttributeError(
                    f"cannot assign {type(value).__name__} {name!r} before Module.__init__() ran: "
                    f"call super().__init__() at the start of {type(self).__name__}.__init__")
            if name not in registered:
                _check_name(self, name, f"cannot register {type(value).__name__}")
            # a new name goes last; an old one (a buffer included) keeps its place, takes this kind
            if isinstance(value, Module):
                registered[name] = _MODULE
            else:
                registered[name] = _PARAMETER
                _note_holder(self, value)
            _structure_changed(self)
            if _watched and _replaces(self, name, value):
                _variables.settings_changed()
            object.__setattr__(self, name, value)  # registered: none of the looks below applies
            return
        if registered is not None and name in registered:
            # another value where one is registered; None empties the slot (b = None: no bias),
            # which parameters() and state_dict then skip
            kind = registered[name]
            _structure_changed(self)
            if value is None:
                if _variables.step_recorder is not None and isinstance(self.__dict__.get(name),
                                                                       Variable):
                    _variables.step_recorder.module_state(self, name)
            elif kind == _BUFFER:
                if not isinstance(value, Variable):
                    raise TypeError(
                        f"cannot assign a {type(value).__name__} to {type(self).__name__}.{name}, "
                        f"a buffer: assign a Variable or None, or set .{name}.data to new values")
            else:
                raise TypeError(
                    f"cannot assign a {type(value).__name__} to {type(self).__name__}.{name}, "
                    f"which holds a {kind}: assign a Parameter or a Module (or None), set "
                    f".{name}.data to change a parameter's values, or `del` the attribute first")
        elif name == "training":
            _note_mode(self, value)
            object.__setattr__(self, name, value)
            _modes_changed()
            return
        elif (_variables.step_recorder is not None or _in_block() is not None) and (
                isinstance(value, Variable) or isinstance(self.__dict__.get(name), Variable)
                or name in type(self)._gradcore_carried):
            # a Variable kept on the module from one call to the next (an RNN's hidden state)
            if _variables.step_recorder is not None:
                _variables.step_recorder.module_state(self, name, _reads_noted(type(self), name))
            _recompute.note_state(self, name)  # for checkpoint's recomputation
        elif _variables.step_recorder is not None:
            # a Python value (a counter, a flag) a recording step sets: a replay would not
            if (_in_slot(self, name) and _variables.step_recorder.is_active()
                    and not _made_in_recording(self)):
                # not in __dict__, where a tape compares values
                _variables.step_recorder.give_up(
                    f"the step set {type(self).__name__}.{name}, held in __slots__, which a "
                    "replay would not set: keep it in the module's __dict__ (drop it from "
                    "__slots__)")
            _variables.step_recorder.python_state(self, name)
        if (_watched and _replaces(self, name, value)
                and not _reads_noted(type(self), name)):
            # outside a recording: the next call records again. Not for carried state, which
            # eager code between calls sets (an RNN used for a sample): a tape that read it
            # checks it at its start instead (_Carried); nor for a Python value (a number, a
            # string) in __dict__, which the tapes that took it compare when it changed
            # (value_changes)
            if not (_variables.is_python_value(value)
                    and _variables.is_python_value(self.__dict__.get(name))) or _in_slot(
                        self, name):
                _variables.settings_changed()
            elif _variables.step_recorder is None or not _variables.step_recorder.is_active():
                if value.__class__ not in _PLAIN:
                    _note_attribute(self, name, value)
                object.__setattr__(self, name, value)
                # told once stored: a tape that looked in between would take the old value as
                # the one it saw, and replay it for good
                _variables.value_changed(self, name)
                return
        if value.__class__ not in _PLAIN:  # one look for the values that need none
            _note_attribute(self, name, value)
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        value = self.__dict__.get(name, _ABSENT)
        told = None
        if value is not _ABSENT and not isinstance(value, (Variable, Module)):
            recorder = _variables.step_recorder
            if recorder is not None and recorder.is_active():
                recorder.python_state(self, name)  # a value it leaves unset: records again
            elif _watched and _watched.get(id(self)) is not None and (
                    _watched[id(self)]() is self):
                # a tape took it as it was (getattr(self, "boost", 1.0) reads the default now):
                # told once deleted, as __setattr__ tells once stored
                told = _variables.is_python_value(value)
        object.__delattr__(self, name)
        if told:
            _variables.value_changed(self, name)
        elif told is not None:
            _variables.settings_changed()
        registered = self.__dict__.get("_registered")
        if registered is not None and registered.pop(name, None) is not None:
            _structure_changed(self)

    def __setstate__(self, state):
        """Restore a module made by copy.copy, copy.deepcopy or pickle, entering its mode in
        the table gradcore.compile keys on (these fill __dict__ without __setattr__ or train(),
        so a copy made in eval mode would otherwise be unknown to it). A copy made while
        gradcore.compile records is not taken as made in the step: what it holds is another
        module's (an RNN's hidden state), which the tape must take as read."""
        slots = None
        if isinstance(state, tuple) and len(state) == 2:
            # a subclass with __slots__: Python's default __getstate__ gives (__dict__, slots)
            state, slots = state
        recorder = _variables.step_recorder
        if recorder is not None and recorder.is_active():
            recorder.modules_made.pop(id(self), None)
        if state:
            self.__dict__.update(state)
            registered = state.get("_registered")
            if registered.__class__ is dict:  # copy.copy's state is the original's __dict__:
                self.__dict__["_registered"] = dict(registered)  # registering here leaves it
        for name, value in (slots or {}).items():
            object.__setattr__(self, name, value)  # as Python restores slots: no registering
        for value in self.__dict__.values():
            if isinstance(value, Parameter):  # a copy's Parameters are held by it too
                _note_holder(self, value)
        registry_changes[0] += 1  # a restore into a live module (its __setstate__) changes it
        training = self.__dict__.get("training")
        if isinstance(training, bool):
            _note_mode(self, training)
            _modes_changed()

    def __getattr__(self, name):
        # only reached when normal lookup fails
        if name in _INTERNALS:
            raise AttributeError(
                f"{type(self).__name__} has no attribute {name!r}: its __init__ did not call "
                "super().__init__(); call it first")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def register_buffer(self, name, data=None):
        """Register `data` (an array, a Variable, or None for a lazy one) as the buffer `name`:
        state that state_dict saves and `to()` moves, but that is not a parameter. Stored as a
        Variable with requires_grad=False (reachable as `self.<name>`, its array as `.data`): a
        Variable given is that one, its requires_grad set to False (a DeZero Variable requires
        grad by default, and a buffer is not trained: backward leaves it no gradient). One an op
        computed is refused: pass x.detach(), a leaf sharing its data."""
        if "_registered" not in self.__dict__:
            raise AttributeError(
                f"register_buffer({name!r}) before Module.__init__() ran: call "
                f"super().__init__() at the start of {type(self).__name__}.__init__")
        _check_name(self, name, "register_buffer: cannot register buffer")
        if self._registered.get(name, _BUFFER) != _BUFFER or (
                name not in self._registered and hasattr(self, name)):
            raise KeyError(f"register_buffer: {type(self).__name__} already has an attribute "
                           f"{name!r}; pick another name")
        if isinstance(data, Variable):
            if data.creator is not None:
                raise ValueError(
                    f"register_buffer({name!r}): the Variable was computed by "
                    f"{data.creator._name()}, so a buffer holding it would keep that graph, "
                    "and backward would reach through it; pass data.detach() (a leaf sharing "
                    "its array), or its array data.data")
            value = data.requires_grad_(False)
        else:
            value = Variable(data, name=name, requires_grad=False)
        self._registered[name] = _BUFFER
        object.__setattr__(self, name, value)
        _structure_changed(self)  # a compiled step that reads the module's buffers records again
        return value

    # ---------------------------------------------------------------- traversal
    def named_modules(self, prefix=""):
        """(name, module) for this module ("") and every sub-module ("l1", "block.fc"), depth
        first in assignment order; a module reachable twice comes once, under its first name."""
        seen = set()
        stack = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            children = [((name + "." if name else "") + attr, value)
                        for attr, value in module._child_items()]
            stack.extend(reversed(children))

    def modules(self):
        """This module and every sub-module (see named_modules)."""
        for _, module in self.named_modules():
            yield module

    def named_children(self):
        """(name, module) for the direct sub-modules, in assignment order."""
        seen = set()
        for name, module in self._child_items():
            if id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self):
        """The direct sub-modules, in assignment order."""
        for _, module in self.named_children():
            yield module

    def _child_items(self):
        return [(name, self.__dict__[name]) for name, kind in self._registered.items()
                if kind == _MODULE and self.__dict__.get(name) is not None]

    def _entries(self):
        """(qualified name, owner, kind, Variable) for each parameter and buffer, in assignment
        order through the sub-modules (depth first); shared ones once, under their first name.
        Once the walk is done, warns about layers kept in plain lists (see _warn_listed)."""
        seen_modules = {id(self)}
        seen = set()
        listed = [self] if _list_names(self) else []
        stack = [("", self, iter(list(self._registered.items())))]
        while stack:
            prefix, owner, items = stack[-1]
            for attr, kind in items:
                value = owner.__dict__.get(attr)
                if value is None:
                    continue
                if kind == _MODULE:
                    if id(value) not in seen_modules:
                        seen_modules.add(id(value))
                        if _list_names(value):
                            listed.append(value)
                        stack.append((prefix + attr + ".", value,
                                      iter(list(value._registered.items()))))
                        break
                elif id(value) not in seen:
                    seen.add(id(value))
                    yield prefix + attr, owner, kind, value
            else:
                stack.pop()
        if listed:
            _warn_listed(listed, seen_modules, seen)

    def named_parameters(self):
        """(name, Parameter) for every parameter, "l1.W" style, in assignment order through the
        sub-modules; lazy ones (data still None) included."""
        for name, _, kind, value in self._entries():
            if kind == _PARAMETER:
                yield name, value

    def parameters(self):
        """Every Parameter (see named_parameters)."""
        for _, p in self.named_parameters():
            yield p

    params = parameters  # DeZero's name

    def named_buffers(self):
        """(name, Variable) for every buffer, "bn.avg_mean" style."""
        for name, _, kind, value in self._entries():
            if kind == _BUFFER:
                yield name, value

    def buffers(self):
        """Every buffer Variable (see named_buffers)."""
        for _, b in self.named_buffers():
            yield b

    def zero_grad(self, set_to_none=True):
        """Forget every parameter's gradient (`.grad` = None, PyTorch's default); with
        set_to_none=False fill each with zeros instead, as Optimizer.zero_grad does."""
        _zero_grads(self.parameters(), set_to_none, type(self).__name__)

    cleargrads = zero_grad  # DeZero's name

    def requires_grad_(self, requires_grad=True):
        """Set `requires_grad` on every parameter (False freezes the model: backward computes
        no gradient for them); returns self."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def apply(self, fn):
        """Call `fn(module)` on every sub-module, children before their parent, then on this
        module (PyTorch's order; a module reachable twice is called once); returns self."""
        if not callable(fn):
            raise TypeError(f"apply expects a callable taking a module, got {type(fn).__name__}")
        seen, order = set(), []
        stack = [(self, False)]
        while stack:  # a walk, not recursion: depth first, each module after its children
            module, children_done = stack.pop()
            if children_done:
                order.append(module)
            elif id(module) not in seen:
                seen.add(id(module))
                stack.append((module, True))
                stack.extend((child, False) for child in reversed(list(module.children())))
        for module in order:  # the modules as they were: fn may replace sub-modules
            fn(module)
        return self

    # ---------------------------------------------------------------- modes
    def train(self, mode=True):
        """Set the `training` flag of this module and every sub-module; returns self."""
        if not isinstance(mode, bool):
            raise TypeError(f"train(mode): mode must be True or False, got {mode!r}")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
            _note_mode(module, mode)
        _modes_changed()
        return self

    def eval(self):
        """train(False): forward runs under test_mode (see the class docstring); returns self."""
        return self.train(False)

    # ---------------------------------------------------------------- calling
    def __call__(self, *inputs, **kwargs):
        if _variables.step_recorder is not None:  # gradcore.compile: its numbers are compared
            _variables.step_recorder.module_called(self)
        if self._forward_pre_hooks:
            for hook in list(self._forward_pre_hooks.values()):
                result = hook(self, inputs)
                if result is not None:
                    inputs = result if isinstance(result, tuple) else (result,)
        if self.training:
            # _in_eval first: with no module in eval mode anywhere, nothing more to read
            if _in_eval and not training() and _resumes_train():
                y = self._forward_in_mode(True, False, inputs, kwargs)
            else:
                y = self.forward(*inputs, **kwargs)
        elif training():
            y = self._forward_in_mode(False, True, inputs, kwargs)
        else:  # test mode already: the caller's (explicit), or a module's around this one
            y = self._forward_in_mode(False, in_module_test_mode(), inputs, kwargs)
        if self._forward_hooks:
            for hook in list(self._forward_hooks.values()):
                result = hook(self, inputs, y)
                if result is not None:
                    y = result
        return y

    def _forward_in_mode(self, train, own, inputs, kwargs):
        """forward with Config.train = train, a test mode noted as an eval-mode module's own
        where `own` (config._module_test_mode): a train-mode sub-module called in it runs in
        train mode again, each module's own flag deciding, as in PyTorch. Test mode set any
        other way (test_mode() or using_config("train", False), entered or decorating, or
        Config.train = False; around the call or inside a forward) is explicit and puts every
        module in it in test mode, as in DeZero. Both are put back after (also after a forward
        that assigned Config.train)."""
        train_token, own_token = _train.set(train), _module_test_mode.set(own)
        try:
            return self.forward(*inputs, **kwargs)
        finally:
            _module_test_mode.reset(own_token)
            _train.reset(train_token)

    def forward(self, *inputs):
        raise NotImplementedError(f"{type(self).__name__} must define forward(self, *inputs)")

    def register_forward_pre_hook(self, hook):
        """Call `hook(module, inputs)` before each forward; a returned value (a tuple, or one
        input) replaces the inputs. Returns a handle whose `remove()` unregisters it."""
        return self._add_hook("_forward_pre_hooks", hook, "register_forward_pre_hook")

    def register_forward_hook(self, hook):
        """Call `hook(module, inputs, output)` after each forward; a returned value other than
        None replaces the output. Returns a handle whose `remove()` unregisters it."""
        return self._add_hook("_forward_hooks", hook, "register_forward_hook")

    def _add_hook(self, name, hook, where):
        if not callable(hook):
            raise TypeError(f"{where} expects a callable, got {type(hook).__name__}")
        hooks = self.__dict__[name]
        if hooks.__class__ is not _Hooks:  # a plain dict: a module pickled by an older gradcore
            hooks = _Hooks(hooks)
            object.__setattr__(self, name, hooks)
        hook_id = next(_hook_ids)
        hooks[hook_id] = hook
        _variables.settings_changed()
        return RemovableHandle(hooks, hook_id)

    # ---------------------------------------------------------------- devices and dtypes
    def to(self, device=None, dtype=None):
        """Move every parameter (with its gradient) and buffer to `device` ("cpu", "cuda:1",
        "array_api_strict:device1", a Device) and/or cast the floating-point ones to `dtype`
        (a floating dtype or its name, e.g. numpy.float64 or "float64"), in place; returns self.
        Lazy parameters and buffers created later (at the first call, or by a load) take this
        dtype too."""
        if device is not None:
            given = device
            try:
                device = backends.parse_device(given)
                backends.backend_for_device(device)  # an unknown or unavailable device fails here
            except (TypeError, ValueError) as e:
                _refuse_dtype_as_device(given, e)
                raise
        name = None if dtype is None else _float_name(dtype, "Module.to")
        variables = self._variables()
        if device is not None and name is not None:  # said even where nothing has data yet
            _namespace_dtype(backends.backend_for_device(device), device, name, "Module.to")
        elif device is not None:  # a move alone keeps each floating dtype: has the device it?
            kept = {str(v.data.dtype).rpartition(".")[2] for v in variables if v.data is not None}
            for kept_name in _FLOAT_NAMES:
                if kept_name in kept:
                    _namespace_dtype(backends.backend_for_device(device), device, kept_name,
                                     "Module.to")
        moves = []  # everything is computed first: a failure leaves the model as it was
        for v in variables:
            for target in (v, v.grad):
                if target is not None and target.data is not None:
                    moves.append((target, _converted(target.data, device, name)))
        wrote = False  # grads count too, harmlessly: one moves only where its parameter does
        for target, data in moves:
            if data is not target.data:  # there already: no write, graphs that saved it stay
                target.data = data
                wrote = True
        for module in self.modules():
            if device is not None:
                object.__setattr__(module, "_device", device)
            if name is not None:
                object.__setattr__(module, "_dtype", name)
            module._after_moving(device, name, wrote)
        return self

    def _after_moving(self, device, dtype_name, wrote):
        """Called on every module of a model by its to(), once the parameters and buffers are
        on `device` (None: where they were) in the floating dtype `dtype_name` (None: as they
        were); `wrote`: whether that wrote any of them, anywhere in the model. A layer that
        carries other state between calls (RNN's h) moves it here."""

    def to_cpu(self):
        """DeZero's name for to("cpu"); returns self."""
        return self.to("cpu")

    def to_gpu(self, device=None):
        """DeZero's name for to("cuda") (the current GPU, or `device`); returns self."""
        return self.to("cuda" if device is None else device)

    def _variables(self):
        return [value for _, _, _, value in self._entries()]

    # ---------------------------------------------------------------- state
    def state_dict(self):
        """An ordered dict name -> array of every parameter and buffer ("l1.W", "bn.avg_mean"),
        the arrays themselves (not copies), on their devices. Raises ValueError if a lazy
        parameter has no data yet."""
        for module in self.modules():
            module._before_saving()
        state = collections.OrderedDict()
        lazy = []
        for name, _, _, v in self._named_entries("state_dict"):
            if v.data is None:
                lazy.append(name)
            else:
                state[name] = v.data
        if lazy:
            raise ValueError(
                f"state_dict: {', '.join(lazy)} not initialised yet (lazy layers learn their "
                "input size at the first call): run the model forward first")
        return state

    def _before_saving(self):
        """Called on every module of a model by its state_dict (save too) before it collects
        the arrays: a layer that makes some parameters later than its first call (RNN's h2h)
        makes them here."""

    def load_state_dict(self, state, strict=True):
        """Copy the arrays of `state` (a mapping name -> array of any backend, Variable, or
        anything numpy.asarray takes) into the parameters and buffers, each converted to that
        parameter's own device and dtype. A lazy parameter (no data yet) takes the array's shape
        (where its layer declares one, see _shapes, the sizes the layer knows must match),
        on the device given to the last `to()` (else the CPU), in the dtype given to the last
        `to()`, else its layer's `dtype` (gradcore's layers have one), else the array's own (a
        parameter's must then be floating point).

        `strict`: names missing from `state` or not in the model are errors; with strict=False
        they are skipped and returned as IncompatibleKeys(missing_keys, unexpected_keys). The
        format marker of a file `save` wrote is skipped, so numpy.load(path) of one will do;
        a name joined by '/' as DeZero's save_weights writes it ("l0/W"), or numbered as
        nn.Sequential's ("0.W"), is taken as the model's "l0.W" when that is one of the model's
        names and the state has no "l0.W"; two keys taken as one name are an error. A module
        or Parameter the model holds under two names (net.l2 = net.l1) is in state_dict once,
        under its first name ("l1.W"); the state may name it by either, or by both (as DeZero's
        save_weights and PyTorch's state_dict write it), with the same values, loaded once.
        Values must be real numbers that convert within their kind (float64 into float32 does;
        floats into an integer buffer, and integers or booleans into a floating one, do not)
        and that the model's dtype holds (300 does not fit int8, 1e5 is inf in float16).
        Errors (all of them listed in one ValueError) are raised before anything changes.
        """
        if not isinstance(state, collections.abc.Mapping):
            raise TypeError(f"load_state_dict expects a mapping name -> array (e.g. from "
                            f"state_dict()), got {type(state).__name__}")
        entries = self._named_entries("load_state_dict")
        known = _KnownNames(self, entries)
        renamed = []  # (key in `state`, its name in the model's terms)
        for key in state:
            if key == FORMAT_KEY and key not in known:
                continue
            name = key
            if isinstance(key, str) and "/" in key and key not in known:
                dotted = key.replace("/", ".")
                if dotted in known and dotted not in state:
                    name = dotted
            renamed.append((key, _indexed_name(name, known, state)))
        keys, clashes = _keyed_by_name(renamed)
        keys, twins = _unaliased(keys, known)
        names = dict.fromkeys(keys)
        hosts = {}
        unreadable = []
        for name, _, _, _ in entries:
            if name in names:
                try:
                    hosts[name] = _host_array(state[keys[name]])
                except (TypeError, ValueError) as e:
                    unreadable.append(f"{name}: {e}")
        twin_hosts = {}
        for _, key in twins:
            try:
                twin_hosts[key] = _host_array(state[key])
            except (TypeError, ValueError) as e:
                unreadable.append(f"{key}: {e}")
        specs = {name: (host.shape, host.dtype) for name, host in hosts.items()}
        problems, missing, unexpected = self._compare(names, specs, strict, "the state", hosts)
        problems = (clashes + problems + unreadable
                    + _unequal_twins(twins, keys, hosts, twin_hosts, "the state"))
        if problems:
            raise ValueError(f"load_state_dict into {type(self).__name__}: "
                             + "; ".join(problems) + ". Nothing was loaded.")
        new = []  # every array placed first: a failure leaves the model as it was
        for name, owner, _, v in entries:
            if name not in hosts:
                continue
            if v.data is not None:  # Dask: in its old chunks too
                new.append((v, _placed(hosts[name], v.backend, v.device, v.dtype, v.data)))
            else:
                device = owner._device or backends.CPU
                backend = backends.backend_for_device(device)
                dtype_name = _lazy_dtype(owner) or hosts[name].dtype.name
                dtype = _namespace_dtype(backend, device, dtype_name, "load_state_dict")
                new.append((v, _placed(hosts[name], backend, device, dtype)))
        for v, data in new:
            v.data = data
        return IncompatibleKeys(missing, unexpected)

    def _compare(self, names, specs, strict, source, arrays=None):
        """Check arrays against this model before any is loaded: `names` are every name `source`
        ("the state", "the file") holds, `specs` name -> (shape, NumPy dtype) those to compare,
        and `arrays` name -> NumPy array their values, once read (None: not yet), checked to fit
        the dtypes they load into. Returns (problems as phrases, missing names, unexpected
        names)."""
        entries = self._named_entries("load")
        known = {name for name, _, _, _ in entries}
        missing = [name for name, _, _, _ in entries if name not in names]
        unexpected = [name for name in names if name not in known]
        problems = []
        if strict and missing:
            problems.append(f"missing from {source}: {', '.join(missing)}")
        if strict and unexpected:
            problems.append(f"not in the model: {', '.join(map(str, unexpected))}")
        for name, owner, _, v in entries:
            if name in specs:
                problem = _mismatch(*specs[name], v, owner, source,
                                    None if arrays is None else arrays[name])
                if problem:
                    problems.append(f"{name}: {problem}")
        problems += _lazy_shape_problems(self, entries, specs, source)
        return problems, missing, unexpected

    def _named_entries(self, where):
        """_entries() as a list, refusing two entries under one qualified name (only possible
        around __setattr__) rather than saving or loading one in place of the other."""
        entries = list(self._entries())
        names = collections.Counter(name for name, _, _, _ in entries)
        twice = [name for name, count in names.items() if count > 1]
        if twice:
            raise ValueError(
                f"{where}: {', '.join(map(repr, twice))} names more than one parameter or buffer "
                f"of {type(self).__name__} (an attribute name holding a '.', set around "
                "Module.__setattr__?); rename one so that each has its own name")
        return entries

    def _shapes(self, size=None):
        """The shapes this module gives its lazy parameters and buffers, by name relative to it
        ("W", or "h2h.W" for a sub-module's), when the size it learns from its first input is
        `size`; None in a shape stands for that size while unknown, one size for every None of
        the module. Loading into a lazy slot is checked against them (see load). {}: nothing
        declared, a lazy slot takes any shape."""
        return {}

    def save(self, path):
        """Write every parameter and buffer to the .npz file `path` (".npz" is appended if
        missing) through the host, whatever device the model is on; the model stays where it
        is. No pickle: arrays only, plus a format marker entry. Returns the path written.
        `path` may be a binary file object (io.BytesIO, open(p, "wb")), as numpy.savez takes: the
        archive is written into it where it is (the whole-file replace below is for paths), it
        stays open, and it is returned.

        The file is replaced whole: readers and concurrent saves (threads or processes) see the
        old checkpoint or a new one, never a mix. An existing file keeps its permissions; a
        symlink stays a link to the file it names, which is replaced. Errors are OSErrors (a
        folder that does not exist: FileNotFoundError naming it; a name that is a folder:
        IsADirectoryError); the old file is then left as it was, and no temporary file behind.
        Refused before anything is written: a parameter or buffer name an .npz archive cannot
        hold (ValueError: a NUL, a lone surrogate, over 65531 UTF-8 bytes), and a file object
        open in text mode (TypeError). `load` raises CheckpointError for what it reads."""
        arrays = {name: _to_host(a) for name, a in self.state_dict().items()}
        _check_entry_names(arrays)
        arrays[FORMAT_KEY] = numpy.asarray(FORMAT_VERSION)
        if _is_file_object(path):  # the caller's file: no atomic rename to make
            _check_binary(path, _checkpoint_source(path)[1], "wb")
            _write_archive(path, arrays)
            return path
        path = os.fsdecode(path)  # bytes too, as load takes them
        if not path.endswith(".npz"):
            path += ".npz"
        _write_atomically(path, arrays)
        return path

    def load(self, path, strict=True, sha256=None, progress=None):
        """Load a checkpoint written by `save` (the file `save(path)` wrote: `path` + ".npz"
        where that exists, unless `path` itself is a file; both files: an error): each array
        goes to its parameter's device and dtype. Returns load_state_dict's IncompatibleKeys.
        Lazy layers not sized yet (VGG16's convolutions, BatchNorm) take the shapes in the file,
        so a fresh model loads without a forward pass first; the sizes they already know
        (out_size, kernel_size) must match it. A file written by DeZero's save_weights loads
        too: its names ("l0/W") are read as gradcore's ("l0.W"), with the same checks; so is a
        file of nn.Sequential's numbered names ("0.W") loaded into models.Sequential ("l0.W").
        A layer the model holds under two names may be in the file under both (DeZero writes
        "l1/W" and "l2/W" for net.l2 = net.l1), with the same values (see load_state_dict).
        `path` may be a binary file object (io.BytesIO, open(p, "rb")) that can seek, read
        from where it is and left open; `sha256` is then that of everything it holds.

        `path` may be an http:// or https:// URL: the file is downloaded once (resumed if
        broken, shown on `progress`, a stream: stderr when None, False for none) into
        cache_folder() / "weights" / <the first 16 hex digits of sha256> / <the URL's last path
        component> ($GRADCORE_DATA, else ~/.gradcore; see gradcore.utils.download.fetch) and
        loaded from there, offline later.
        A URL needs `sha256`, the file's SHA-256 as 64 hex digits (`sha256sum file`, or
        hashlib.sha256 of its bytes): a download, or a cached file, with another one raises
        DownloadError (an OSError) and nothing is loaded. With a local path, `sha256` is
        checked too; a mismatch raises CheckpointError.

        Raises CheckpointError (a ValueError) for a file that is not a readable gradcore
        checkpoint (damaged, truncated, foreign, holding pickled objects: never unpickled) and
        for one whose names, shapes or dtypes do not match the model (see load_state_dict);
        these are checked from the archive's headers before any array is decompressed. A missing
        file raises FileNotFoundError. On any error the model is left unchanged."""
        sha256 = _checked_sha256(sha256)
        if _is_url(path):
            path, pinned = _fetched(path, sha256, progress), None  # fetch checked the SHA-256
            source = path
        else:
            (source, path), pinned = _checkpoint_source(path), sha256
        with _open_checkpoint(source, path) as (archive, size):
            if pinned is not None:
                # hashed through the handle the archive is read from (ZipFile.fp), not by name
                # again: a checkpoint saved over `path` meanwhile (an atomic rename) is a new
                # file, and this handle still reads the one whose SHA-256 this is
                found = sha256_of_file(archive.fp)
                if found != pinned:
                    raise CheckpointError(f"{path}: its SHA-256 is {found}, not {pinned}: a "
                                          "different or damaged file. Nothing was loaded.")
            in_file = _read_headers(path, archive, size)
            known = _KnownNames(self, list(self._entries()))
            keys, clashes = _keyed_by_name((name, _indexed_name(name, known, in_file))
                                           for name in in_file)
            keys, twins = _unaliased(keys, known)
            headers = {name: in_file[key] for name, key in keys.items()}
            specs = {name: (header.shape, header.dtype) for name, header in headers.items()}
            _refuse(path, self, clashes + self._compare(headers, specs, strict, "the file")[0])
            arrays = _read_arrays(path, archive, headers)
            twin_arrays = _read_arrays(path, archive, {key: in_file[key] for _, key in twins})
            # the values, now read, against the dtypes they load into (300 does not fit int8);
            # inside the with block: a file object is then left where it was on an error
            _refuse(path, self, self._compare(headers, specs, strict, "the file", arrays)[0]
                    + _unequal_twins(twins, keys, arrays, twin_arrays, "the file"))
            return self.load_state_dict(arrays, strict=strict)

    save_weights = save  # DeZero's names
    load_weights = load

    # ---------------------------------------------------------------- drawing and printing
    def plot(self, *inputs, to_file="model.png"):
        """Run one forward on `inputs` and draw its graph into `to_file` with
        gradcore.utils.plot_dot_graph (needs Graphviz's `dot` unless to_file ends in .dot)."""
        y = self(*inputs)
        return plot_dot_graph(list(y) if isinstance(y, tuple) else y, verbose=True,
                              to_file=to_file)

    def extra_repr(self):
        """The text inside this module's parentheses in repr (layers describe their sizes)."""
        return ""

    def __repr__(self):
        children = list(self.named_children())
        extra = self.extra_repr()
        if not children:
            return f"{type(self).__name__}({extra})"
        lines = [extra] if extra else []
        lines += [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in children]
        return type(self).__name__ + "(\n  " + "\n  ".join(lines) + "\n)"


# =============================================================================== helpers
def _note_holder(module, p):
    """Record that `module` holds the Parameter `p` (see _holders)."""
    holders = _holders.get(p)
    if holders is None:
        holders = _holders[p] = {}
    holders[id(module)] = weakref.ref(module)  # by id: a module may be unhashable


def _held_by_a_module(p):
    """Whether a live Module has the Parameter `p` as one of its attributes."""
    for ref in list(_holders.get(p, {}).values()):
        module = ref()
        if module is not None and any(value is p for value in module.__dict__.values()):
            return True
    return False


_warned_lists = set()  # (class, attribute) whose list or dict _warn_listed has warned about
_warned_variables = set()  # (class, attribute) _note_attribute has warned about
# containers that may hold layers the registry never sees (and their subclasses: OrderedDict,
# defaultdict, Counter, a namedtuple); a dict's values are looked at
_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)
# The classes of attribute values that need no look (neither containers nor Variables), told
# by Module.__setattr__ with one set lookup: numbers, strings, None, arrays, and each other class
# _note_attribute has seen (a function, a CuPy array), up to _PLAIN_KEPT of them, so that a
# value assigned at every step pays the isinstance of a first look once
_PLAIN = {int, float, bool, complex, str, bytes, type(None), numpy.ndarray, numpy.float64,
          numpy.float32, numpy.float16, numpy.int64, numpy.int32, numpy.bool_}
_PLAIN_KEPT = 1024


def _note_attribute(module, name, value):
    """Module.__setattr__'s look at a value whose class is not in _PLAIN: a container (its name
    kept for _warn_listed, which reads it when parameters are collected: it may be filled later)
    or a plain Variable (warned about now if it is a leaf that requires grad, unless `name` is a
    buffer's or one of its class's `_gradcore_carried`). Any other class joins _PLAIN."""
    kind = value.__class__
    if kind is not Variable:
        if isinstance(value, _CONTAINERS):
            names = _list_names(module)
            if names is not None:
                names.add(name)
        elif not issubclass(kind, Variable) and len(_PLAIN) < _PLAIN_KEPT:
            _PLAIN.add(kind)
    elif value.creator is None and value.requires_grad:
        registered = module.__dict__.get("_registered")
        key = (type(module), name)
        if ((registered is None or name not in registered) and key not in _warned_variables
                and name not in type(module)._gradcore_carried):
            _warned_variables.add(key)
            _warn_variable(module, name)


def _warn_variable(module, name):
    """Warn that the leaf Variable (requires_grad=True, not a Parameter) just assigned to
    `module.name` is not registered: backward gives it a .grad, but parameters() (and so the
    optimizers), state_dict, save and to() never see it. A PyTorch habit (a tensor made with
    requires_grad=True beside the layers) and a DeZero one (a Variable for a weight: DeZero's
    Variable requires grad by default, and so does gradcore's). A computed Variable (an RNN's
    carried state) or one with requires_grad=False is not warned about."""
    where = type(module).__name__
    warnings.warn(
        f"{where}.{name} is a Variable that requires grad but is not a Parameter, so it is not "
        "registered: backward gives it a .grad, but parameters() (and the optimizers), "
        "state_dict, save and to() do not see it, so it is not trained, saved or moved. To "
        f"train and save it, make it a Parameter (self.{name} = nn.Parameter(...)); if it is a "
        f"constant, give it requires_grad=False, or register it as a buffer "
        f"(self.register_buffer({name!r}, ...): saved and moved, not trained)",
        UserWarning, stacklevel=4)


def _list_names(module):
    """The set of names `module` was given a container under (see _CONTAINERS), or None: before
    Module.__init__ ran, for a module pickled before gradcore kept it, or if something else
    took the name."""
    names = module.__dict__.get("_gradcore_list_names")
    return names if names.__class__ is set else None


def _warn_listed(modules, module_ids, variable_ids):
    """Warn, once per class and attribute, about the Modules and Parameters that a container
    attribute of one of `modules` (a list, tuple, dict, set or deque, or a subclass of one)
    holds (a dict: as its values), or a container among its items holds, and that are
    registered nowhere in the model (their ids are not among `module_ids` / `variable_ids`):
    parameters() (and so the optimizers), state_dict, save and to() never see them. The warning
    names the container that registers what it holds: nn.ModuleDict or nn.ParameterDict for a
    dict, nn.ModuleList or nn.ParameterList for the others.

    A warning, not an error: DeZero's own MLP keeps its layers in a list *and* registers each
    with setattr (no warning then), and a list is also the known way to keep a module out of
    parameters() on purpose (a frozen teacher network), which must go on working. The first
    _LOOKED_AT items are looked at, and those of containers among them ([F.relu, Linear(2)],
    [[...]], [{...}]): a long list of numbers costs that many looks."""
    for module in modules:
        for attr in _list_names(module):
            value = module.__dict__.get(attr)
            items = _items_of(value)
            key = (type(module), attr)
            if items is None or key in _warned_lists:
                continue
            if not any(isinstance(item, (Module, Parameter)) for item in _looked_at(items)):
                continue
            items = list(items)
            inner = [x for item in items if item.__class__ not in _PLAIN
                     for x in (_items_of(item) or ())]
            hidden = [item for item in items + inner if isinstance(item, (Module, Parameter))
                      and id(item) not in (module_ids if isinstance(item, Module)
                                           else variable_ids)]
            if hidden:
                _warned_lists.add(key)
                kinds = sorted({"Module" if isinstance(item, Module) else "Parameter"
                                for item in hidden})
                kind = type(value).__name__
                article = "an" if kind[0].lower() in "aeiou" else "a"
                top = {id(item) for item in items}
                nested = any(id(item) not in top for item in hidden)
                warnings.warn(
                    f"{type(module).__name__}.{attr} is {article} {kind} holding {len(hidden)} "
                    f"{' and '.join(kinds)}(s) not registered with the model, so parameters() "
                    "(and the optimizers), state_dict, save and to() do not see them: they are "
                    f"not trained, saved or moved. {_container_hint(attr, value, kinds, nested)}",
                    UserWarning, stacklevel=2)


_LOOKED_AT = 16  # items of a container attribute _warn_listed reads: enough for a model's layers


def _items_of(value):
    """What _warn_listed looks at in `value`: a dict's values, a list's (tuple's, set's, deque's)
    items, or None for anything else (a Module among them: ModuleList registers its own)."""
    if isinstance(value, dict):
        return value.values()
    if isinstance(value, _CONTAINERS):
        return value
    return None


def _looked_at(items):
    """The first _LOOKED_AT of `items`, and the first _LOOKED_AT of containers among them."""
    first = list(itertools.islice(items, _LOOKED_AT))
    return [*first, *(x for item in first if item.__class__ not in _PLAIN
                      for x in itertools.islice(_items_of(item) or (), _LOOKED_AT))]


def _container_hint(attr, value, kinds, nested=False):
    """How to register what a container attribute `attr` holds (`kinds`: "Module", "Parameter"
    or both; `nested`: some in a container inside it): the nn container for it, as PyTorch
    names them (one for a dict, a list's for the others: a set's order, hash-seeded, would not
    do for state_dict's names)."""
    shape = "Dict" if isinstance(value, dict) else "List"
    brackets = "{...}" if shape == "Dict" else "[...]"
    containers = [f"nn.{k}{shape}" for k in kinds]
    if len(containers) == 1:
        hint = f"Hold them in an {containers[0]} (self.{attr} = {containers[0]}({brackets}))"
    else:
        hint = (f"Hold the Modules in an {containers[0]} and the Parameters in an "
                f"{containers[1]}, one attribute each")
    if nested:
        hint += " (a list or dict inside it as an nn.ModuleList or nn.ModuleDict too)"
    return hint + (", or also assign each to an attribute of its own, as DeZero's MLP does its "
                   "layers (setattr(self, f'l{i}', layer))")


def _check_name(module, name, where):
    """Refuse a name for a parameter, buffer or sub-module that can clash in state_dict, as
    PyTorch's add_module and register_buffer do: one holding "." ("l1.W" beside a sub-module
    l1 gives two entries one qualified name, and state_dict could keep only one of them), or
    "" (no name of its own: a parameter saved as "", a sub-module's W as ".W"). Any other
    string may be registered ("block-1", "fc 2", "0"), and load_state_dict takes it; save
    refuses one an .npz archive cannot hold (see checkpoint._check_entry_names: a NUL, a lone
    surrogate, over 65531 UTF-8 bytes), and state_dict refuses duplicates."""
    if not isinstance(name, str):
        raise TypeError(f"{where} {name!r} on {type(module).__name__}: the name must be a "
                        f"string, got {type(name).__name__}")
    if "." in name:
        raise ValueError(
            f"{where} {name!r} on {type(module).__name__}: the name holds '.', which joins the "
            "parts of state_dict's names (\"l1.W\" is l1's W), so two entries could share one "
            "name; use another, e.g. 'l1_W'")
    if not name:
        raise ValueError(f"{where} '' on {type(module).__name__}: the name is empty; give it one")


def _indexed_name(name, known, names):
    """`name`, or the model's "l0.W" for a "0.W" (as nn.Sequential, and models.Sequential before
    it was DeZero's, saved what models.Sequential and MLP name "l0.W") where that is one of the
    model's names (`known`) and not among the saved `names`."""
    if not isinstance(name, str) or name in known:
        return name
    parts = name.split(".")
    digits = [i for i, part in enumerate(parts) if part.isdigit()]
    # which numbered parts are models.Sequential's: an nn.Sequential inside keeps its numbers
    found = set()
    for chosen in itertools.product((False, True), repeat=min(len(digits), 8)):
        renamed = list(parts)
        for i, rename in zip(digits, chosen):
            if rename:
                renamed[i] = "l" + parts[i]
        candidate = ".".join(renamed)
        if candidate != name and candidate in known and candidate not in names:
            found.add(candidate)
    return found.pop() if len(found) == 1 else name


def _keyed_by_name(renamed):
    """(name -> key, clashes) from `renamed`, pairs (key, the model's name it is taken as): a
    phrase in `clashes` for each name two keys are taken as (DeZero's "l0/W" and nn.Sequential's
    "0.W" are both "l0.W"), where one would silently be loaded in place of the other."""
    keys, clashes = {}, []
    for key, name in renamed:
        if name in keys:
            clashes.append(f"{keys[name]!r} and {key!r} are both taken as the model's {name!r}; "
                           "keep one of them")
        else:
            keys[name] = key
    return keys, clashes


class _KnownNames:
    """The qualified names a model's parameters and buffers answer to on load: the one _entries
    lists each under, and each alias, a further path reaching it (net.l2 = net.l1 makes "l2.W"
    one of "l1.W", b.W = a.W makes "b.W" one of "a.W"), as DeZero's save_weights and PyTorch's
    state_dict write them. Each (module, attribute) edge is recorded once and a name resolved
    when asked: blocks holding earlier blocks (skip connections) make exponentially many paths."""

    def __init__(self, model, entries):
        first = {id(v): name for name, _, _, v in entries}
        self._root = id(model)
        self._modules = {"": id(model)}  # a module's prefix (one path to it) -> its id
        self._children = {}  # a module's prefix + attribute + "." -> that child's prefix
        self._leaves = {}  # a module's prefix + attribute -> the entry's name
        prefixes = {id(model): ""}
        stack = [("", model)]
        while stack:
            prefix, module = stack.pop()
            for attr, kind in module._registered.items():
                value = module.__dict__.get(attr)
                if value is None:
                    continue
                if kind != _MODULE:
                    self._leaves[prefix + attr] = first[id(value)]
                    continue
                if id(value) not in prefixes:
                    prefixes[id(value)] = prefix + attr + "."
                    self._modules[prefix + attr + "."] = id(value)
                    stack.append((prefix + attr + ".", value))
                self._children[prefix + attr + "."] = prefixes[id(value)]

    def name(self, alias):
        """The entry's name `alias` reaches (itself for an entry's name), or None for none.
        A path does not enter a module again below itself (net.me = net: no "me.l1.W")."""
        if not isinstance(alias, str):
            return None
        *path, attr = alias.split(".")
        prefix, above = "", {self._root}
        for part in path:
            prefix = self._children.get(prefix + part + ".")
            if prefix is None or self._modules[prefix] in above:
                return None
            above.add(self._modules[prefix])
        return self._leaves.get(prefix + attr)

    def __contains__(self, alias):
        return self.name(alias) is not None


def _unaliased(keys, known):
    """(name -> key, twins) from `keys`, the model's name -> key in the source, with each alias
    (see _KnownNames) taken as the name it stands for, unless the source has that name too:
    the alias's (name, key) is then a twin, whose values must be those loaded into the name."""
    names = {alias: known.name(alias) for alias in keys}
    unaliased = {name: key for name, key in keys.items() if names[name] in (None, name)}
    twins = []
    for alias, key in keys.items():
        name = names[alias]
        if name not in (None, alias):
            if name in unaliased:
                twins.append((name, key))
            else:
                unaliased[name] = key
    return unaliased, twins


def _unequal_twins(twins, keys, arrays, twin_arrays, source):
    """A phrase for each of `twins` (see _unaliased) whose NumPy array (in `twin_arrays`, by
    key) differs from the one loaded into its name (in `arrays`, by name; its key in `keys`)."""
    problems = []
    for name, key in twins:
        first, twin = arrays.get(name), twin_arrays.get(key)
        if first is None or twin is None:
            continue  # unreadable or refused already
        floating = first.dtype.kind == "f" and twin.dtype.kind == "f"
        if not numpy.array_equal(first, twin, equal_nan=floating):
            problems.append(
                f"{keys[name]!r} and {key!r} in {source} are one entry of the model, {name} (a "
                "module or Parameter it holds under two names), but hold different values; "
                "keep the one to load")
    return problems


def _refuse(path, model, problems):
    """Raise CheckpointError for the checkpoint at `path` listing `problems` (phrases from
    Module._compare) when there are any."""
    if problems:
        raise CheckpointError(f"{path} does not match {type(model).__name__}: "
                              + "; ".join(problems) + ". Nothing was loaded.")


def _is_url(path):
    return isinstance(path, str) and path[:8].lower().startswith(("http://", "https://"))


def _fetched(url, sha256, progress):
    """The cached path of the checkpoint at `url`, downloaded if it is not there yet."""
    if sha256 is None:
        raise ValueError(
            f"load({url!r}): a URL needs sha256=, the SHA-256 of the file it serves, so that a "
            "damaged or replaced download is never loaded. Get it from whoever publishes the "
            "file, or from a copy you trust: `sha256sum file`, or in Python "
            "hashlib.sha256(open(file, 'rb').read()).hexdigest()")
    name = url_file_name(url)
    if name in ("", ".", ".."):
        raise ValueError(f"load({url!r}): the URL names no file (its path ends with {name!r}); "
                         "give the URL of the .npz file itself")
    # a folder per SHA-256: two URLs ending in the same file name (model.npz) never collide
    folder = sha256_folder(cache_folder() / "weights", sha256)
    return str(fetch(name, [url], sha256, folder=folder, progress=progress))


def _float_name(dtype, where):
    """The name of a floating dtype given as a NumPy dtype, a name, or a namespace's dtype."""
    try:
        name = numpy.dtype(dtype).name
    except TypeError:
        name = str(dtype).rpartition(".")[2]  # array_api_strict.float32 and the like
    if name not in _FLOAT_NAMES:
        raise ValueError(f"{where}: dtype must be a floating dtype ({', '.join(_FLOAT_NAMES)}), "
                         f"got {dtype!r}")
    return name


def _refuse_dtype_as_device(device, error):
    """A TypeError (from `error`, parse_device's) where the `device` Module.to refused is a
    dtype (PyTorch's model.to(torch.float64) takes one in that place); nothing otherwise."""
    try:
        name = numpy.dtype(device).name
    except TypeError:
        name = str(device).rpartition(".")[2]  # array_api_strict.float32 and the like
        if name not in _FLOAT_NAMES:
            return
    if name not in _FLOAT_NAMES:
        raise TypeError(f"Module.to: {device!r} is a dtype, not a device, and to() casts to a "
                        f"floating dtype only ({', '.join(_FLOAT_NAMES)}), given by keyword: "
                        "to(dtype='float64')") from error
    raise TypeError(f"Module.to: {device!r} is a dtype, not a device: pass it by keyword, "
                    f"to(dtype={name!r}) (or to(device, dtype={name!r}) to move it too)") from error


def _namespace_dtype(backend, device, dtype_name, where):
    """The dtype named `dtype_name` (one of _FLOAT_NAMES) in `backend`'s namespace; a ValueError
    naming `device` and the floating dtypes it has where it has none of that name
    (array-api-strict has no float16)."""
    dtype = getattr(backend.xp, dtype_name, None)
    if dtype is None:
        has = [name for name in _FLOAT_NAMES if hasattr(backend.xp, name)]
        raise ValueError(f"{where}: {device} has no {dtype_name} (its floating dtypes: "
                         f"{', '.join(has)}); use one of those, or a device that has "
                         f"{dtype_name}, such as 'cpu'")
    return dtype


def _converted(data, device, dtype_name):
    """`data` on `device` (None: where it is) with floating dtype `dtype_name` (None: as it is)."""
    if device is not None:
        data = backends.to_device(data, device)
    if dtype_name is not None:
        backend = backends.backend_of(data)
        xp = backend.xp
        on = backend.device_of(data)
        dtype = _namespace_dtype(backend, on, dtype_name, "Module.to")
        # astype copies even to the dtype the array has (NumPy): a new array would bump the
        # version and break a pending backward, and unlink the arrays state_dict handed out
        if xp.isdtype(data.dtype, "real floating") and data.dtype != dtype:
            with backend.device_context(on):
                data = xp.astype(data, dtype)
    return data


def _zero_grads(params, set_to_none, where):
    """Forget the gradient of each of `params` (grad = None), or with set_to_none=False fill it
    with zeros: in place where its array is its own, else a new zero gradient (a view or a
    read-only array may share its memory with another). `where` names the caller's class for
    gradcore.compile. Module.zero_grad and Optimizer.zero_grad share it."""
    if set_to_none:
        for p in params:
            p.grad = None
        return
    recorder = _variables.step_recorder
    if recorder is not None and recorder.is_active():
        # writes into the grads' arrays, which a tape would not see: such steps run eagerly
        recorder.give_up(f"{where}.zero_grad(set_to_none=False) writes zeros into the grads "
                         "in place, which a replay would not do: zero_grad() (set_to_none=True, "
                         "PyTorch's default) gives the same results and replays")
    for p in params:
        g = p.grad
        if g is None:
            continue
        if g.creator is not None:
            # made by backward(create_graph=True): its graph goes first, as PyTorch's detach_()
            # (the zeros written in would otherwise stand for the op's result in it)
            g.unchain()
            g.requires_grad = False
        backend = g.backend
        with backend.device_context(g.device):
            if backend.owns_memory(g.data):
                g._data = backend.assign(g.data, 0)
                note_write(g)
            else:
                p.grad = Variable(backend.zeros(g.shape, g.dtype, g.device), requires_grad=False)


def _to_host(array):
    return backends.backend_of(array).to_numpy(array)


def _host_array(value):
    """A state entry as a NumPy array (TypeError/ValueError for what NumPy cannot take)."""
    if isinstance(value, Variable):
        value = value.data
    backend = backends.backend_of(value)
    return backend.to_numpy(value) if backend is not None else numpy.asarray(value)


def _numpy_dtype(dtype):
    """The NumPy dtype of a NumPy, CuPy or array-API namespace's dtype."""
    try:
        return numpy.dtype(dtype)
    except TypeError:
        return numpy.dtype(str(dtype).rpartition(".")[2])  # array_api_strict.float32 and the like


def _lazy_dtype(owner):
    """The dtype name a lazy parameter or buffer of `owner` is created in (at its first call, or
    by a load): that of the last to(dtype=), else the layer's own `dtype` (a NumPy dtype, as
    gradcore's layers declare), else None."""
    if owner._dtype is not None:
        return owner._dtype
    declared = owner.__dict__.get("dtype")
    return declared.name if isinstance(declared, numpy.dtype) else None


def _mismatch(shape, dtype, v, owner, source, values=None):
    """Why values of `shape` and NumPy `dtype` from `source` cannot go into the Variable `v` of
    `owner` (None if they can); `values`, the NumPy array itself when read, is checked to fit
    the dtype it is cast to."""
    if dtype.kind not in "biuf":
        return f"holds {dtype} values, not real numbers (bool, integer or floating point)"
    if v.data is None:  # lazy: the dtype of _lazy_dtype; its shape against Module._shapes
        name = _lazy_dtype(owner)
        if name is None and isinstance(v, Parameter) and dtype.kind != "f":
            return (f"holds {dtype} values in {source}, and a parameter with no data yet takes "
                    "their dtype, but a parameter must be floating point: convert them first, "
                    "or give the model a dtype with to(dtype=...)")
        target = None if name is None else numpy.dtype(name)
    else:
        if tuple(shape) != tuple(v.shape):
            return f"shape {tuple(shape)} in {source}, {tuple(v.shape)} in the model"
        target = _numpy_dtype(v.dtype)
    if target is None:
        return None
    if target.kind == "f" and dtype.kind != "f":  # same_kind casting would take them
        return (f"holds {dtype} values in {source} where the model's {target} takes floating "
                "point ones: integers and booleans are not loaded as floats (a weight saved as "
                "integer codes, or labels under a weight's name?); convert them first "
                f"(.astype('{target}')) if they are the weights")
    if not numpy.can_cast(dtype, target, "same_kind"):
        return (f"{dtype} in {source} does not convert to the model's {target} within its kind "
                "(same_kind casting); convert the values first")
    return None if values is None else _unfit(values, target, source)


def _unfit(values, target, source):
    """Why the NumPy array `values` from `source` does not fit the dtype `target` of its own
    kind that it is cast to (an integer out of its range would wrap, 300 into int8 giving 44; a
    finite float past its largest would become inf), naming the first such value; None if every
    value fits."""
    if values.size == 0 or numpy.can_cast(values.dtype, target, "safe"):
        return None  # a widening cast: every value fits
    if target.kind == "f":
        with numpy.errstate(over="ignore"):
            unfit = numpy.isfinite(values) & ~numpy.isfinite(values.astype(target))
        holds = f"finite values up to {numpy.finfo(target).max} in magnitude"
    else:
        info = numpy.iinfo(target)
        unfit = (values < info.min) | (values > info.max)
        holds = f"{info.min} to {info.max}"
    count = int(numpy.count_nonzero(unfit))
    if not count:
        return None
    value = values[unfit].flat[0]
    more = f" (and {count - 1} more)" if count > 1 else ""
    return (f"{values.dtype} value {value} in {source}{more} does not fit the model's {target} "
            f"({holds}); clip or rescale the values first, or give the model a dtype that "
            "holds them")


def _shown(shape):
    """A declared shape as text, "?" for a size learnt from the input: "(?, 2)"."""
    sizes = ["?" if size is None else str(size) for size in shape]
    return "(" + ", ".join(sizes) + ("," if len(sizes) == 1 else "") + ")"


def _declared(module, relative):
    """The Variable at `relative` ("W", "h2h.W") under `module`, or None."""
    value = module
    for attr in relative.split("."):
        value = value.__dict__.get(attr) if isinstance(value, Module) else None
    return value if isinstance(value, Variable) else None


def _lazy_shape_problems(model, entries, specs, source):
    """The lazy slots that arrays of `specs` (name -> (shape, dtype)) from `source` would fill,
    checked against the shapes their modules declare (Module._shapes): sizes the module knows
    must match, and its learnt size (each None) must be one size across its entries, those the
    source fills and those already filled. Returns problems as phrases."""
    names = {id(v): name for name, _, _, v in entries}
    problems = []
    for _, module in model.named_modules():
        shown = {}  # name -> (shape, where) of each entry that gives the learnt size
        learnt = set()
        lazy = False  # whether the source fills one of them
        for relative, expected in module._shapes().items():
            v = _declared(module, relative)
            name = None if v is None else names.get(id(v))
            if name is None:
                continue
            if v.data is not None:
                shape, where = tuple(v.shape), "the model"
            elif name in specs:
                shape, where = tuple(specs[name][0]), source
            else:
                continue
            fits = len(shape) == len(expected) and all(
                e is None or e == size for e, size in zip(expected, shape))
            if not fits:
                if v.data is None:
                    unknown = (f" (a {type(module).__name__} not built yet: ? is learnt from its "
                               "first input)") if None in expected else ""
                    problems.append(f"{name}: shape {shape} in {source}, {_shown(expected)} in "
                                    f"the model{unknown}")
                continue
            sizes = {size for e, size in zip(expected, shape) if e is None}
            if sizes:
                shown[name] = (shape, where)
                learnt |= sizes
                lazy = lazy or v.data is None
        if len(learnt) > 1 and lazy:
            listed = ", ".join(f"{name} {shape} in {where}" for name, (shape, where) in
                               shown.items())
            problems.append(f"{listed}: the {type(module).__name__} learns one size from its "
                            "input for every ? of its shapes, so these must agree")
    return problems


def _placed(host, backend, device, dtype, like=None):
    """A fresh copy of the NumPy array `host` on `device` of `backend` with `dtype`: never shared
    with the state it came from (parameters are updated in place); on a lazy backend in the
    layout of the array `like` of its shape (Dask: its chunks), where one is given."""
    data = backend.asarray(numpy.array(host, copy=True), dtype=dtype, device=device)
    if like is not None and backend.lazy:
        data = backend.laid_out(data, backend.layout(like))
    return data
