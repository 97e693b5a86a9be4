"""Function: one node of the graph. __call__ unwraps, runs forward, wraps, and records."""
import copy
import copyreg
import functools
import inspect
import numbers
import operator
import re
import types
import weakref

import backends

from . import anomaly
from . import variable as _variables
from .config import is_anomaly_enabled, recording
from .variable import (_SCALARS, Variable, _init_slots, backward_codes, dtype_kind, elsewhere,
                       has_graph, note_write, sequence as _sequence, share_versions)
_new_variable = object.__new__
_weakref = weakref.ref
_NO_INPUT = object()  # __call__'s default for x0 and x1: fewer inputs were given
# What a call sets in an instance's __dict__ (Function's slots are set per call as well): not
# carried over to the copy a second call runs on (Function._twin)
_SET_PER_CALL = frozenset(("sequence", "device", "_anomaly", "_given"))


def _snake_case(name):
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _given_inputs(x0, x1, more):
    """_plain_call's arguments as the tuple of inputs given."""
    return (x0, x1, *more) if x1 is not _NO_INPUT else (x0,) if x0 is not _NO_INPUT else ()


class _SavedOutput:
    """A saved value that is output `index` of its Function: saved_tensors gives the output
    Variable, made again from `array` if it has died (Function._revive)."""

    __slots__ = ("index", "array")

    def __init__(self, index, array):
        self.index = index
        self.array = array


def add_note(error, message):
    """Add `message` to `error` as a note, its type, message and attributes kept; once only (an
    error raised again, or by a nested walk, has it already). Never raises: the error it notes
    is the one its caller re-raises."""
    notes = getattr(error, "__notes__", None)
    if notes is not None and message in notes:
        return
    try:
        if notes is None or notes.__class__ is list:
            notes = error.__notes__ = [] if notes is None else notes
            notes.append(message)  # what 3.11's add_note does; 3.10 has none
        else:  # a tuple someone set: 3.11's add_note refuses it
            error.__notes__ = [*notes, message]
    except Exception:
        pass  # an error that takes no attributes: it goes on without the note


class _DeZeroName:
    """`self.input` or `self.output`, which DeZero's early steps give a Function and gradcore's
    does not: reading it raises an AttributeError saying what to use. Not a data descriptor, so
    an attribute of that name set on the instance (an author's own) is found first; a class
    attribute, read only when the instance has none, costs the other attributes nothing (a
    __getattr__ would make every attribute read on a Function slower)."""

    def __init__(self, instead):
        self.instead = instead

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, f, owner=None):
        if f is None:
            return self
        raise AttributeError(
            f"{type(f).__name__!r} object has no attribute {self.name!r}: a gradcore Function "
            f"keeps its inputs in self.inputs, a tuple of Variables, and its outputs in "
            f"self.outputs, weak references; DeZero's self.{self.name} is {self.instead}",
            name=self.name, obj=f)


class Function:
    """Subclass with `forward(*arrays)` -> array(s) and `backward(*gys)` -> gradient(s).

    `forward` works on raw arrays (use `self.xp`); `backward` takes and returns Variables and is
    written with gradcore ops, so differentiating it again (create_graph) just works. A gradient
    may come back broadcast (the shape of the op's result): the engine sums it to the input's.

    On NumPy, gradcore's own ops get a 0-d input as a NumPy scalar (NumPy's arithmetic on scalars
    is several times faster than on 0-d arrays); an author's forward gets the input's 0-d array,
    as in DeZero. A scalar result is kept as it is; Variable.data still hands out a 0-d array.

    An instance records one call. Called again while that call's graph lives, it runs the new
    call on a copy of itself (_twin: its containers and arrays copied one level), so the graph
    keeps the first call as it was (DeZero's numerical_diff(f, x) calls f twice).

    Rules for a Function of your own (the checks run around its calls only, _checked_call and
    _checked_backward: gradcore's own ops pay nothing for them):
    - forward may return an input's array or a view of it: that output then shares the input's
      version, so an in-place write to the input (an optimizer step) stops a backward that saved
      the output. An output that is not floating-point (integers, bools) is not differentiable:
      it has requires_grad=False and no creator, and backward gets zeros for it.
    - forward must not write into its inputs' arrays, or must say so: `self.mark_dirty(x)` for
      each array x it wrote into (PyTorch's ctx.mark_dirty) counts the write in that input's
      version, so a backward through an op that saved the input before refuses to run. A
      write into a leaf that requires grad is refused (recording: its gradient would be taken
      at values it no longer holds). An unannounced write goes unseen, except in anomaly mode
      (detect_anomaly), which refuses it.
    - backward must not write into the gradients it gets: one may be another op's too, or the
      caller's seed. `gy *= c` written in backward rebinds gy (a new Variable, as in DeZero) in
      any grad mode; in a helper it calls, write gy = gy * c.
    - backward must return new arrays or Variables, not ones the Function keeps (a gradient
      computed in forward, say): a leaf's .grad may become that very object. A raw array backward
      returns is copied before it becomes a .grad; a Variable is not.
    - backward written on raw arrays (DeZero's first steps) gives first derivatives only (with
      create_graph too): differentiating its gradient again (jvp, jacfwd, hessian) raises
      rather than give zero.
    """

    __slots__ = ("inputs", "_outputs", "generation", "backend",
                 "needs_input_grad", "_output_meta", "_saved", "__weakref__", "__dict__")
    # _saved: save_for_backward's values (resolved by _resolve_saved), () set before each forward.
    # A slot written per call reads cheaper than a class default (callgrind: chain 0.7% and wide
    # 0.8% fewer instructions)
    # The creation order, set when the call is recorded: the heap's tie-break within a generation.
    # Not a slot, so that a new instance reads None: __call__ sends a second call of an instance
    # already recorded to _again (a copy, or refused), before forward can overwrite what the
    # first call's backward reads. The price, measured: ~430 of the ~25,000 instructions per op
    # of `chain` (a class default read and an instance dict per node); every cheaper form tried
    # left some second call undetected
    sequence = None
    device = None  # set per call for backends with several devices (NumPy has one)
    op_name = None  # the name errors use; by default the class name in snake case
    input = _DeZeroName("self.inputs[0]")
    output = _DeZeroName("self.outputs[0]() (None once the output is gone)")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # An author's Function: each call checked after it runs (_checked_call), and its backward
        # when recorded (_checked_backward). gradcore's own ops need neither: their outputs are
        # fresh floating-point arrays, views come from View, and their backwards are written
        # with gradcore's ops; so they pay nothing for the checks
        author = not cls.__module__.startswith("gradcore.")
        backward = cls.__dict__.get("backward")
        code = getattr(inspect.unwrap(backward), "__code__", None) if backward else None
        if code is not None:  # `gy *= c` written there rebinds (variable._augmented)
            backward_codes.add(code)
        if author:
            if backward is not None and not getattr(backward, "_checked", False):
                cls.backward = _checked_backward(backward)
            # an author's forward gets 0-d arrays, as in DeZero: item assignment and in-place
            # writes (x += 1; self.mark_dirty(x)) work on them as on any other shape
            cls._operand = _array_operand
            call_of_its_own = cls.__dict__.get("__call__")
            if call_of_its_own is not None:  # it may set attributes: never on a copy (_again)
                cls.__call__ = _again_before_own_call(call_of_its_own)
        inherited = cls.__call__
        own = not any(getattr(inherited, mark, False)
                      for mark in ("_template", "_view", "_checked"))
        # A copy of _plain_call's code per subclass: CPython specialises attribute access per
        # code object and type, and one copy shared by Mul, Add, ... sees a new type each call
        # (callgrind: without it 3.8% more instructions per op of `chain`, 3.3% per branch of
        # `wide`)
        call = Function._plain_call
        copy = types.FunctionType(call.__code__.replace(), call.__globals__, "__call__",
                                  call.__defaults__)
        copy.__qualname__, copy.__doc__ = f"{cls.__qualname__}.__call__", call.__doc__
        copy._template = True
        if own:
            # a __call__ of the author's own, kept: it reaches this copy through
            # super().__call__ (Function's and View's run self._plain_call), inside the checks
            cls._plain_call = _inside_checks(copy) if author else copy
        elif author:
            cls._plain_call = copy
            cls.__call__ = Function._checked_call
        elif getattr(inherited, "_view", False):
            cls._plain_call = copy  # View.__call__ runs it, then shares the version
        else:
            cls.__call__ = copy

    def __call__(self, *inputs):
        """Run forward on the inputs' arrays; record this call in the graph if grad mode is on
        and an input requires grad. Inputs: Variables, arrays (constants), Python scalars."""
        # Each subclass runs its own copy of _plain_call instead (__init_subclass__): this runs
        # only as super().__call__ in an author's own __call__
        return self._plain_call(*inputs)

    __call__._template = True  # gradcore's: a subclass that inherits it gets a copy of _plain_call

    def _plain_call(self, x0=_NO_INPUT, x1=_NO_INPUT, *more):
        """Run forward on the inputs' arrays; record this call in the graph if grad mode is on
        and an input requires grad. Inputs: Variables, arrays (constants), Python scalars."""
        if self.sequence is not None:  # called before: on a copy, or refused (_again)
            return self._again()._plain_call(*_given_inputs(x0, x1, more))
        # The common case in line: one or two inputs, Variables or a Variable and a Python
        # scalar, on a backend with one device and no device context (NumPy). The rest: _call.
        c0 = x0.__class__
        if c0 is Variable:
            backend = x0._backend
        elif c0 in _SCALARS and x1.__class__ is Variable:  # 2 - x
            backend = x1._backend
        else:
            backend = None
        if backend is None or not backend.plain or more:
            return self._call(_given_inputs(x0, x1, more))
        if c0 is Variable:
            d0 = x0._data
            if d0.ndim == 0 and d0.__class__ is backend.array_type:
                d0 = self._operand(d0, backend)
            r0 = x0._requires_grad
            generation = x0.generation if r0 else -1  # -1: no input requires grad
        else:
            d0 = x0
            r0 = False
            generation = -1
        if x1 is _NO_INPUT:
            r1 = None
        elif x1.__class__ is Variable and x1._backend is backend:
            d1 = x1._data
            if d1.ndim == 0 and d1.__class__ is backend.array_type:
                d1 = self._operand(d1, backend)
            r1 = x1._requires_grad
            if r1 and x1.generation > generation:
                generation = x1.generation
        elif x1.__class__ in _SCALARS and c0 is Variable:
            d1 = x1
            r1 = False
        else:  # an array (a constant), a Parameter, another backend
            return self._call((x0, x1))

        self.backend = backend
        self._saved = ()
        try:
            ys = self.forward(d0) if r1 is None else self.forward(d0, d1)
        except Exception as e:
            self._explain(e, (x0,) if r1 is None else (x0, x1))
            raise
        if self._saved:  # forward called save_for_backward
            self._resolve_saved((x0,) if r1 is None else (x0, x1),
                                (d0,) if r1 is None else (d0, d1), ys)
        # A NumPy scalar (from 0-d arithmetic or a reduction) is kept as it is: Variable.data
        # makes it a 0-d array when it is read, and the next op computes on it as a scalar
        if ys.__class__ is not backend.array_type and ys.__class__ not in backend.scalar_types:
            return self._finish(ys, backend, (x0,) if r1 is None else (x0, x1),
                                (r0,) if r1 is None else (r0, r1), generation)

        # _finish in line, for one output (callgrind: calling it costs chain 10% more
        # instructions per op, wide 7% more per branch)
        if generation >= 0 and (mode := recording()):  # become a node of the graph
            if r1 is None:
                self.inputs = (x0,)
                self.needs_input_grad = (r0,)
            else:
                self.inputs = (x0, x1)
                self.needs_input_grad = (r0, r1)
            self.generation = generation
            y = _init_slots(_new_variable(Variable), ys, backend, self, generation + 1, True)
            self.sequence = y._sequence = next(_sequence)
            self._outputs = _weakref(y)  # a bare reference: one tracked object less per node
            if mode is not True:
                anomaly.record(self)
            return y
        return _init_slots(_new_variable(Variable), ys, backend, None, 0, False)

    _plain_call._template = True  # __init_subclass__ copies it for each subclass

    def _operand(self, data, backend):
        """An input's 0-d array as gradcore's own forward gets it: a scalar where the backend has
        them (NumPy's arithmetic on scalars is ~4x faster than on 0-d arrays), else the array."""
        return data[()] if backend.scalar_types else data

    def _again(self, own_call=False):
        """The instance another call of this recorded one runs on. The first call's graph gone
        (no output alive): this one, cleared of that call, so what the call sets stays on the
        instance its author holds. Else a copy (_twin), as DeZero runs one instance twice (its
        step 4's numerical_diff(f, x)) while the graph keeps the first call; refused where a
        __call__ of its own (`own_call`) would set what then never reaches the author."""
        if not any(ref() is not None for ref in self.outputs):
            self._forget_call()
            return self
        if own_call:
            raise self._reused("your __call__ would run on a copy of it, and what it sets would "
                               "not reach the instance you hold")
        return self._twin()

    def _settings(self):
        """(name, value) for each attribute a copy for another call shares (_twin): what
        __init__ set, and what forward set as it was after the first call."""
        for name, value in self.__dict__.items():
            if name not in _SET_PER_CALL:
                yield name, value
        for name in copyreg._slotnames(type(self)):  # slots of an author's subclass
            if name not in Function.__slots__ and hasattr(self, name):
                yield name, getattr(self, name)

    def _twin(self):
        """A copy of this instance for another call: what a call sets (the graph's fields, the
        saved values, the anomaly record) starts empty, and the containers and arrays among its
        other attributes are copied, nested ones too (_own_copy), so the copy's forward cannot
        overwrite what this instance's backward reads (self.cache[...] = x)."""
        twin = object.__new__(type(self))
        for name, value in self._settings():
            object.__setattr__(twin, name, _own_copy(value))
        return twin

    def _forget_call(self):
        """Clear what the recorded call set, as on a new instance (what __init__ set stays): for
        another call once no output of the first lives, so no backward can reach it."""
        for name in _SET_PER_CALL:
            self.__dict__.pop(name, None)
        for name in Function.__slots__:
            if not name.startswith("__") and hasattr(self, name):
                delattr(self, name)
        anomaly.recorded.discard(self)

    def _call(self, inputs):
        """__call__ for any inputs on any backend; raw arrays become constants."""
        if _variables.step_recorder is not None:  # gradcore.compile is recording a step
            _variables.step_recorder.adopt_inputs(inputs)
        xs = []
        needs = []
        generation = -1
        backend = _NO_INPUT  # no Variable seen yet (a Variable with no data has backend None)
        for x in inputs:
            if isinstance(x, Variable):
                data = x._data
                if x._backend is not backend:
                    if backend is not _NO_INPUT or data is None:
                        self._raise_mixed(inputs)
                    backend = x._backend
                if data.ndim == 0 and data.__class__ is backend.array_type:
                    data = self._operand(data, backend)
                xs.append(data)
                needs.append(x._requires_grad)
                if x._requires_grad and x.generation > generation:
                    generation = x.generation
            elif x.__class__ in _SCALARS:
                xs.append(x)
                needs.append(False)
            else:  # a raw array (a constant), a NumPy scalar, or something unsupported
                weak = any(map(_weakens_scalars, inputs))
                constants = tuple([self._constant(x, weak) for x in inputs])
                if self.integers_take_float_dtype:
                    constants = _integers_as_float(constants, inputs)
                return self._call(constants)
        if backend is _NO_INPUT:
            raise TypeError(f"{self._name()}: needs at least one Variable or array input, "
                            f"got {', '.join(type(x).__name__ for x in inputs) or 'none'}")
        if not backend.single_device:
            self.device = self._common_device(backend, inputs)
        self.backend = backend
        self._saved = ()
        try:
            if backend.needs_device_context:  # the flag spares NumPy a no-op context
                with backend.device_context(self.device):
                    ys = self.forward(*xs)
            else:
                ys = self.forward(*xs)
        except Exception as e:
            self._explain(e, inputs)
            raise
        if self._saved:
            self._resolve_saved(inputs, xs, ys)
        return self._finish(ys, backend, inputs, tuple(needs), generation)

    def _finish(self, ys, backend, inputs, needs, generation):
        """The output Variable(s) for forward's result `ys`; the node recorded if generation >= 0
        (an input requires grad) and grad mode is on."""
        if ys.__class__ is tuple:
            return self._wrap_outputs(ys, backend, inputs, needs, generation)
        if ys.__class__ is not backend.array_type and ys.__class__ not in backend.scalar_types:
            ys, backend = self._wrap_output(ys)
        if generation >= 0 and (mode := recording()):
            y = _init_slots(_new_variable(Variable), ys, backend,
                            self._record(inputs, needs, generation), generation + 1, True)
            y._sequence = self.sequence
            self._outputs = _weakref(y)
            if mode is not True:
                anomaly.record(self)
            return y
        return _init_slots(_new_variable(Variable), ys, backend, None, 0, False)

    def _record(self, inputs, needs, generation):
        """Become a node of the graph; returns self."""
        self.inputs = inputs
        self.needs_input_grad = needs
        self.generation = generation
        self.sequence = next(_sequence)
        return self

    def _resolve_saved(self, inputs, xs, ys):
        """Saved values that are an input's array (as forward got it) become that input Variable,
        and one that is an output (ys, or an element of a tuple ys) a _SavedOutput: resolved now,
        while identities hold, so saved_tensors can hand back Variables that stay differentiable."""
        by_id = {}
        if ys.__class__ is tuple:
            by_id.update((id(y), _SavedOutput(i, y)) for i, y in enumerate(ys))
        else:
            by_id[id(ys)] = _SavedOutput(0, ys)
        for x, a in zip(inputs, xs):
            if isinstance(x, Variable):
                by_id[id(x._data)] = by_id[id(a)] = x
        self._saved = tuple(by_id.get(id(v), v) for v in self._saved)

    def _wrap_outputs(self, ys, backend, inputs, needs, generation):
        """Variables for the outputs of a forward that returned a tuple."""
        creator = None
        if generation >= 0 and (mode := recording()):
            creator = self._record(inputs, needs, generation)
            generation += 1
        else:
            generation = 0
        outputs = []
        for y in ys:
            b = backend
            if y.__class__ is not b.array_type and y.__class__ not in b.scalar_types:
                y, b = self._wrap_output(y)
            outputs.append(_init_slots(_new_variable(Variable), y, b, creator, generation,
                                       creator is not None))
        if creator is not None:
            self._outputs = tuple([_weakref(y) for y in outputs])
            # shapes and dtypes, to make zeros for an output that dies before backward
            self._output_meta = [(y.shape, y.dtype) for y in outputs]
            if mode is not True:
                anomaly.record(self)
        return tuple(outputs)

    def forward(self, *xs):
        """The op on raw arrays: gets each input's array (a constant's too), computes with
        `self.xp`, and returns an array, or a tuple of arrays for several outputs."""
        raise NotImplementedError(f"{type(self).__name__} must define forward(*xs)")

    def backward(self, *gys):
        """The gradients: gets one upstream gradient per output as a Variable (`gy`), returns
        one gradient per input as a Variable (or None for an input that needs none), written
        with gradcore's ops so that create_graph=True can differentiate it again."""
        raise NotImplementedError(f"{type(self).__name__} must define backward(*gys)")

    @classmethod
    def apply(cls, *inputs):
        """`cls()(*inputs)`: a new instance for the call (PyTorch's spelling; an instance records
        one call)."""
        return cls()(*inputs)

    # ---------------------------------------------------------------- an author's Function
    def _checked_call(self, *inputs, **settings):
        """__call__ of an author's Function (see the class's rules): the plain call, a copy per
        class as for every Function, then what gradcore's own ops need not check."""
        if settings:
            raise self._settings_given(settings)
        return self._run_checked(type(self)._plain_call, inputs)

    _checked_call._checked = True  # __init_subclass__ recognises it as gradcore's __call__

    def _run_checked(self, plain, inputs):
        """`plain(self, *inputs)` (a class's copy of _plain_call) inside the checks of an
        author's Function; inside them already (an author's __call__ reached another's through
        super()), the plain call alone."""
        _arrays_for_author(inputs)
        if getattr(self, "_given", None) is not None:
            return plain(self, *inputs)
        if self.sequence is not None:  # called before: on a copy, or refused (_again)
            return self._again()._run_checked(plain, inputs)
        self._given = inputs  # what mark_dirty looks the arrays up in
        before = anomaly.before_forward(inputs) if is_anomaly_enabled() else None
        lent = _lend_views(inputs) if len(inputs) > 1 else None
        try:
            ys = plain(self, *inputs)
        finally:
            del self._given
            if lent:
                for x, data in lent:
                    x._data = data
        if before:
            anomaly.check_forward_writes(self, before)
        for y in ys if ys.__class__ is tuple else (ys,):
            if y.creator is not None and dtype_kind(y._backend, y._data.dtype) != "float":
                # integers and bools carry no gradient (as PyTorch's non-differentiable outputs):
                # nothing reaches this Function through y; backward gets zeros for it
                y.creator, y.generation, y._requires_grad = None, 0, False
            x = _base_of(y, inputs)
            if x is not None:  # as View's outputs
                share_versions(x, y)
        if ys.__class__ is tuple and len(ys) == 1:
            return ys[0]  # forward's `return (y,)`: the Variable, as DeZero's __call__ gives
        return ys

    def _settings_given(self, settings):
        """The TypeError for keyword arguments given to a call, MyFunction()(x, k=3.0)."""
        name = type(self).__name__
        first = next(iter(settings))
        return TypeError(
            f"{name}()(...) got the keyword argument(s) {', '.join(settings)}: a Function is "
            f"called with its inputs only; settings go to its constructor, "
            f"{name}({first}={settings[first]!r})(x), whose __init__ keeps them "
            f"(self.{first} = {first}) for forward and backward")

    def mark_dirty(self, *arrays):
        """In forward: say that forward wrote into these arrays, inputs it got (PyTorch's
        ctx.mark_dirty). Each such input's version goes up, so a backward through an op that
        saved the input before this call refuses to run instead of using the new values."""
        given = getattr(self, "_given", None)
        if given is None:
            raise RuntimeError(f"{self._name()}: mark_dirty is for forward, with arrays forward "
                               "got: call it there, after writing into them")
        recorder = _variables.step_recorder
        if recorder is not None and recorder.is_active():  # a replay would not count the write
            recorder.give_up(f"{self._name()}.forward writes into an input (mark_dirty), a "
                             "write a replay would not count in the input's version")
        for a in arrays:
            for x in given:
                if x is a:  # a raw array, a constant: it has no version to count
                    break
                if isinstance(x, Variable) and x._data is a:
                    note_write(x)
                    if _variables.blocks_running[0]:
                        _variables.note_block_write(x, "in place")
                    if (x.creator is not None or x._requires_grad) and recording():
                        from .engine import _describe  # the engine imports this module
                        what = ("a leaf that requires grad" if x.creator is None else
                                f"which {x.creator._name()} computed")
                        raise RuntimeError(
                            f"{self._name()}.forward wrote into {_describe(x)}, {what} "
                            "(mark_dirty): its gradient would be taken at values it no longer "
                            "holds (a backward reading the input gets the new ones; an op's "
                            "output would go on standing for its result), so this is refused "
                            "(PyTorch refuses it on a leaf that requires grad). It holds what "
                            "forward wrote. Give the Function x.detach() (or call it under "
                            "no_grad()), or return a new array")
                    break
            else:
                if self.backend.owns(a):  # a Python number (a constant) is never written into
                    raise ValueError(f"{self._name()}: mark_dirty got an array that is none of "
                                     "the inputs' arrays; pass the arrays forward received")

    # ---------------------------------------------------------------- helpers for authors
    @property
    def xp(self):
        """The array namespace of this call's inputs (numpy, cupy, ...)."""
        return self.backend.xp

    def save_for_backward(self, *values):
        """Keep values for backward; read them back with `saved_tensors`. Arrays come back as
        Variables; anything else (a shape, a number, None) as it was saved."""
        self._saved = values

    @property
    def outputs(self):
        """The outputs as weak references, one per output: `self.outputs[0]()` is the Variable
        (None once it is gone)."""
        outputs = self._outputs
        return (outputs,) if outputs.__class__ is _weakref else outputs

    @property
    def saved_tensors(self):
        """The saved values: an input's or output's array comes back as that Variable (so
        backward stays differentiable, also through an output the caller dropped), any other
        array as a constant Variable, a Variable or anything else as it was saved."""
        values = []
        for v in self._saved:
            if v.__class__ is _SavedOutput:
                y = self.outputs[v.index]()
                v = self._revive(v) if y is None else y
            elif not isinstance(v, Variable) and backends.backend_of(v) is not None:
                v = Variable(v, requires_grad=False)
            values.append(v)
        return tuple(values)

    def _revive(self, saved):
        """A dead output that backward reads (a _SavedOutput), made again as this Function's
        output, as recorded (creator, generation, sequence), and put back among the outputs, so
        that the graph backward records through it leads here (create_graph). Held weakly as
        every output: a later read while it lives gets the same Variable."""
        backend = backends.backend_of(saved.array)
        if dtype_kind(backend, saved.array.dtype) != "float":  # it carried no gradient (above)
            return Variable(saved.array, requires_grad=False)
        y = _init_slots(_new_variable(Variable), saved.array, backend, self,
                        self.generation + 1, True)
        y._sequence = self.sequence
        if self._outputs.__class__ is tuple:
            outputs = list(self._outputs)
            outputs[saved.index] = _weakref(y)
            self._outputs = tuple(outputs)
        else:
            self._outputs = _weakref(y)
        return y

    def _variables_read(self):
        """(role, Variable) for each Variable input, each live output and each other saved
        Variable ("input 0", "output 1", "saved value 2"): what backward may read, and what the
        version and anomaly checks look at."""
        for i, x in enumerate(self.inputs):
            if isinstance(x, Variable):
                yield f"input {i}", x
        for i, ref in enumerate(self.outputs):
            y = ref()
            if y is not None:
                yield f"output {i}", y
        for i, v in enumerate(self._saved):
            if isinstance(v, Variable) and not any(v is x for x in self.inputs):
                yield f"saved value {i}", v

    @property
    def next_functions(self):
        """One `(creator, output_index)` per input; `(None, 0)` for a leaf or a constant."""
        pairs = []
        for x in self.inputs:
            f = x.creator if isinstance(x, Variable) else None
            index = 0
            if f is not None:
                index = next(i for i, ref in enumerate(f.outputs) if ref() is x)
            pairs.append((f, index))
        return tuple(pairs)

    def zeros_for_output(self, i):
        """A zero gradient for output `i` (used when that output is dead or got no gradient)."""
        shape, dtype = self._output_meta[i]
        return Variable(self.backend.zeros(shape, dtype, self.device), requires_grad=False)

    def __repr__(self):
        return f"<{type(self).__name__} generation={getattr(self, 'generation', None)}>"

    # ---------------------------------------------------------------- copies
    def __getstate__(self):
        """copy.deepcopy and pickle (a model that holds a computed Variable, an RNN's state):
        the state, with the outputs as the Variables themselves (None for a dead one). Held
        weakly, they would be copied as they are, leading the copied graph to the original's
        outputs (and pickle refuses weak references)."""
        _variables.begin_pickling(self)  # a graph being pickled: see variable._OpsFirst
        # copyreg._slotnames: the slots of the whole class chain, as pickle itself finds them
        state = {name: getattr(self, name) for name in copyreg._slotnames(type(self))
                 if hasattr(self, name)}
        state.update(self.__dict__)
        outputs = state.get("_outputs")
        if outputs.__class__ is tuple:
            state["_outputs"] = [ref() for ref in outputs]
        elif outputs is not None:
            state["_outputs"] = outputs()
        return state

    def __setstate__(self, state):
        outputs = state.pop("_outputs", None)
        if state.get("sequence") is not None:  # recorded, perhaps by another process's clock
            state["sequence"] = _variables.restored(state["sequence"])
        for name, value in state.items():
            object.__setattr__(self, name, value)
        if "_anomaly" in state:  # its fingerprints are checked as the original's
            anomaly.recorded.add(self)
        if outputs.__class__ is list:  # outputs of a forward that returned a tuple
            self._outputs = tuple([_dead_output if y is None else _weakref(y) for y in outputs])
        elif "generation" in state:  # recorded: one output, alive or not
            self._outputs = _dead_output if outputs is None else _weakref(outputs)

    def __lt__(self, other):
        """Only the walk's heap compares Functions, and only two with the same generation and
        sequence: one of a graph and its copy in a deep copy of that graph. They are unrelated
        (neither feeds the other), so either may run first."""
        return id(self) < id(other)

    # ---------------------------------------------------------------- the slow paths of __call__
    def _name(self):
        """The op's name in messages: `op_name`, else the class name in snake case."""
        return self.op_name or _snake_case(type(self).__name__)

    def _reused(self, why):
        return RuntimeError(
            f"{self._name()}: this {type(self).__name__} instance was called already, and an "
            f"output of that call is still alive; {why}: create one instance per call, "
            f"{self._new_instance_spelling()}")

    def _new_instance_spelling(self):
        """How to make a new instance per call, for the reuse errors: `Name()(...)`, or with
        __init__ arguments `Name(...)(...)`, which apply cannot pass."""
        name = type(self).__name__
        try:
            parameters = inspect.signature(type(self)).parameters
        except (TypeError, ValueError):  # a signature Python cannot read: assume arguments
            parameters = (None,)
        if parameters:
            return f"{name}(...)(...), with its arguments"
        return f"{name}()(...), or use {name}.apply(...)"

    # Set by arithmetic (add, sub, mul, div): an integer array constant takes the floating dtype
    # of the Variable it meets, as PyTorch's integer tensors do (NumPy would make float32 times
    # an int64 array float64: twice the memory, silently)
    integers_take_float_dtype = False

    def _constant(self, x, weak):
        """Variables and scalars as they are; a raw array as a constant Variable. With `weak`
        (floating-point data among the inputs, or another library's: _weakens_scalars), a real
        NumPy scalar as a Python number: weak, as PyTorch takes it (float32 data times
        np.float64(2) stays float32, as times 2.0). Beside NumPy's integer and bool data only, a
        NumPy scalar keeps its dtype, as in NumPy: as a Python int, np.int64(1000) would not fit
        int8 data (OverflowError), and as a Python float np.float32(1.5) would make int8 data
        float64 where NumPy and PyTorch give float32."""
        if isinstance(x, Variable) or x.__class__ in _SCALARS:
            return x
        if weak and isinstance(x, numbers.Number):
            if isinstance(x, numbers.Integral):
                return int(x)  # a float array takes any int (float16: inf past 65504)
            if isinstance(x, numbers.Real):
                return float(x)
        if backends.backend_of(x) is None:
            raise TypeError(
                f"{self._name()}: unsupported input of type {type(x).__module__}."
                f"{type(x).__qualname__}; pass a Variable, an array of a registered backend "
                f"(numpy, cupy, array-API) or a Python int/float/bool")
        return Variable(x, requires_grad=False)

    def _raise_mixed(self, inputs):
        variables = [x for x in inputs if isinstance(x, Variable)]
        if any(x._data is None for x in variables):
            raise ValueError(f"{self._name()}: an input Variable has no data (data is None)")
        devices = []
        for x in variables:
            if x.device not in devices:
                devices.append(x.device)
        names = " and ".join(str(d) for d in devices)
        raise TypeError(
            f"{self._name()}: inputs are on {names} (different array libraries); "
            f"move them to one device first, e.g. x.to('{devices[0]}')")

    def _common_device(self, backend, inputs):
        device = None
        for x in inputs:
            if isinstance(x, Variable):
                d = backend.device_of(x._data)
                if device is None:
                    device = d
                elif d != device:
                    raise ValueError(
                        f"{self._name()}: inputs are on {device} and {d}; "
                        f"move them to one device first, e.g. x.to('{device}')")
        return device

    def _explain(self, error, inputs):
        """Say in the error from forward which op failed and on what shapes; the same exception
        goes on (its type and attributes kept, so `except YourError` still catches it)."""
        if isinstance(error, backends.DeviceUnavailableError):
            return  # it says what this machine lacks and what to do; the shapes bear not on it
        if str(error).startswith(f"{self._name()}: "):
            return  # said already: the same exception raised again
        # a 0-d input as "0-d": "(inputs: ())" would read as no input at all
        shapes = [(str(tuple(x.shape)) if x.ndim else "0-d") if isinstance(x, Variable)
                  else repr(x) for x in inputs]
        message = f"{self._name()}: {error} (inputs: {', '.join(shapes)})"
        if len(error.args) == 1 and isinstance(error.args[0], str) and (
                str(error) == error.args[0]):  # a plain message: it becomes the explained one
            error.args = (message,)
        else:  # a message of the exception's own making: a note
            add_note(error, message)

    def _wrap_output(self, y):
        """(array, backend) for a forward result that is neither an array nor a scalar of the
        inputs' backend: another backend's array (to())."""
        backend = backends.backend_of(y)
        if backend is None:
            backend = self.backend
            if y.__class__ in (int, float) and backend is not None and backends.NUMPY in (
                    backend, backend.inner):
                # `return float(x.sum())`: a 0-d array of it, as DeZero's as_array makes (it
                # knows NumPy alone; elsewhere the device is the inputs', which a number lacks).
                # Recording (gradcore.compile), the traced library's: a constant of the tape
                return backend.asarray(y), backend
            if isinstance(y, (list, tuple)):
                fix = "; for several outputs return a tuple of arrays (return y0, y1)"
            elif isinstance(y, numbers.Number):
                fix = "; return an array: self.xp.asarray(value)"
            else:
                fix = ""
            raise TypeError(f"{self._name()}.forward returned {type(y).__name__}, not an "
                            f"array{fix}")
        return backend.ensure_array(y), backend


class _Gone:
    """An output that was dead when its Function was copied (Function.__setstate__)."""


_dead_output = _weakref(_Gone())  # the _Gone is freed at once: a reference to nothing


class View(Function):
    """A Function whose outputs can be views of its first input's array (reshape, transpose,
    basic indexing). An output that is one shares the input's version, recorded or not (under
    no_grad, of a detached input): an in-place write to the input, such as an optimizer step,
    then stops a backward that saved the view, which would otherwise compute with the new
    values."""

    # Around the plain __call__ (a copy per subclass, as every Function's) rather than inside
    # it: a check there costs every op of every kind (chain: 0.5% more instructions per op)
    def __call__(self, *inputs):
        ys = self._plain_call(*inputs)
        x = inputs[0]
        # Any Variable may be written in place through gradcore later (a leaf by an optimizer,
        # an op's result by `h.data -= 1`), so its views share its version whatever made it:
        # one owns_memory test per output, and a _WriteLog per base that has views
        if isinstance(x, Variable):
            for y in ys if ys.__class__ is tuple else (ys,):
                backend = y._backend
                if not backend.owns_memory(y._data) and backend.may_view(y._data, x._data):
                    share_versions(x, y)
        return ys

    __call__._view = True


def _lend_views(inputs):
    """For the call of an author's Function: each input Variable whose array object an earlier
    input Variable holds too (x.detach() and x, two leaves over one array) holds a view of it
    instead, so that forward gets one object per Variable and an array it saves comes back as
    the Variable it came from (_resolve_saved). Returns [(Variable, its array)] to put back.
    Not while a step is recorded: each Variable is given its own traced array there."""
    lent = []
    if _variables.step_recorder is not None:
        return lent
    holders = {}
    for x in inputs:
        if isinstance(x, Variable) and x._data is not None:
            data = x._data
            if holders.setdefault(id(data), x) is not x:
                lent.append((x, data))
                x._data = x._backend.xp.reshape(data, data.shape)  # a view: a new object
    return lent


def _array_operand(self, data, backend):
    """Function._operand of an author's Function: the 0-d array itself."""
    return data


def _arrays_for_author(inputs):
    """Each input Variable's NumPy scalar (an op's 0-d result, kept as a scalar) made the 0-d
    array that Variable.data gives, and kept: an author's forward gets that very array."""
    for x in inputs:
        if isinstance(x, Variable):
            data = x._data
            if data is not None and data.__class__ is not x._backend.array_type:
                x._data = x._backend.ensure_array(data)


def _again_before_own_call(call):
    """An author's own __call__, run on the instance itself when it was called before and no
    output of that call lives (Function._again), else refused: what it sets (a counter, an
    attribute backward reads) would otherwise land on a copy, out of the author's sight."""
    @functools.wraps(call)
    def again(self, *args, **kwargs):
        if self.sequence is not None:
            self._again(own_call=True)
        return call(self, *args, **kwargs)
    return again


def _own_copy(value, seen=None):
    """An attribute for the copy of a Function another call runs on (Function._twin): a dict,
    list, set or array (their subclasses too: an OrderedDict, a defaultdict) copied, and so the
    containers and arrays inside a copied container or tuple (self.cache["s"][...] = x writes
    into the copy's own); a tuple itself only where something in it was copied; anything else (a
    number, a Variable, an object of the author's own) shared. `seen`: id -> the copy of each
    container copied so far (a container holding itself is copied once)."""
    if isinstance(value, (dict, list, set, bytearray)):
        seen = {} if seen is None else seen
        if id(value) in seen:
            return seen[id(value)]
        copied = seen[id(value)] = copy.copy(value)
        if isinstance(copied, dict):
            for key, item in copied.items():
                copied[key] = _own_copy(item, seen)
        elif isinstance(copied, list):
            copied[:] = [_own_copy(item, seen) for item in copied]
        return copied
    if hasattr(value, "__array_namespace__") and not isinstance(value, type):
        return backends.copy(value)  # an array-API array may have no .copy (array-api-strict)
    if value.__class__ is tuple:
        items = tuple(_own_copy(item, seen) for item in value)
        return value if all(map(operator.is_, items, value)) else items
    return value


def _inside_checks(plain):
    """`plain` (a class's copy of _plain_call) run inside the checks of an author's Function:
    the _plain_call of an author's class with a __call__ of its own."""
    def checked(self, *inputs):
        return self._run_checked(plain, inputs)
    return checked


def gradient_elsewhere(f, where, device):
    """The RuntimeError for f's backward returning a gradient on `where` (a device, or a type's
    name) for an input on `device`: it would become that input's .grad as it is."""
    return RuntimeError(
        f"{f._name()}.backward returned a gradient on {where} for an input on {device}: "
        "compute it with the input's array library (self.xp) and on its device, or return a "
        "Variable made with gradcore's ops from the gradients and inputs backward got")


def _check_places(f, gxs):
    """RuntimeError if an author's backward returned a Variable on another library or device
    than its input (the walk checks raw arrays, and shapes and dtypes, itself)."""
    backend = f.backend  # the inputs': one library, one device
    for gx, x, need in zip(gxs if gxs.__class__ is tuple else (gxs,), f.inputs,
                           f.needs_input_grad):
        if need and isinstance(gx, Variable) and (
                gx._backend is not backend or not backend.single_device):
            if gx._data is not None and x._data is not None and elsewhere(
                    gx, backend, x.device):
                raise gradient_elsewhere(f, gx.device, x.device)


def _checked_backward(backward):
    """An author's `backward`, checked while its result is recorded (create_graph): a gradient
    with no graph for an input that needs one, from gradients that have one, may be the mark of
    a backward computed on raw arrays, whose derivative would come out zero (jvp, hessian). It
    is handed on joined to those gradients by a node that raises if differentiated again; first
    derivatives, all such a backward can give, are unchanged (PyTorch's once_differentiable)."""
    @functools.wraps(backward)
    def checked(self, *gys):
        try:
            gxs = backward(self, *gys)
        except TypeError as error:
            _note_gradients_given(self, backward, gys, error)
            raise
        if gxs is None and any(getattr(self, "needs_input_grad", ())):
            raise _returned_none(self)
        backend = self.backend
        # one gradient of the inputs' library, which has one device: in line (0.3 us a call less)
        if gxs.__class__ is tuple or not backend.single_device or (
                isinstance(gxs, Variable) and gxs._backend is not backend):
            _check_places(self, gxs)
        if not recording() or self.sequence is None:
            return gxs
        graphed = [g for g in gys if isinstance(g, Variable) and has_graph(g)]
        several = gxs.__class__ is tuple
        results = list(gxs if several else (gxs,))
        # a raw array (or number) was surely computed on raw arrays, whose derivative in the
        # inputs would come out zero too (a hessian of zeros with the seed of ones, which has no
        # graph): joined to the inputs that need a gradient as well
        inputs = None
        for i, (gx, need) in enumerate(zip(results, self.needs_input_grad)):
            if not need or gx is None or isinstance(gx, Variable) and has_graph(gx):
                continue
            joined = graphed
            if not isinstance(gx, Variable):
                if inputs is None:
                    inputs = [x for x, needs in zip(self.inputs, self.needs_input_grad)
                              if needs and isinstance(x, Variable)]
                joined = graphed + inputs
            if not joined:
                continue
            data = gx.data if isinstance(gx, Variable) else gx
            if not self.backend.owns(data):  # a Python number or NumPy scalar: an array
                data = self.backend.asarray(data, device=self.device)
            results[i] = _OnceDifferentiable(type(self).__name__, i)(
                Variable(data, requires_grad=False), *joined)
        return tuple(results) if several else results[0]
    checked._checked = True
    return checked


def _note_gradients_given(f, backward, gys, error):
    """Note on a TypeError from calling f's `backward` with `gys`, where backward's signature
    does not take that many gradients (DeZero's backward(self, gy) on a forward with two
    outputs): it gets one per output."""
    try:
        inspect.signature(backward).bind(f, *gys)
        return  # it fits: the error came from inside backward
    except TypeError:
        pass
    except ValueError:  # no signature to read
        return
    n = len(gys)
    names = ", ".join(f"gy{i}" for i in range(n)) if n > 1 else "gy"
    add_note(error, f"{type(f).__name__}.backward gets one gradient per output of forward, "
                    f"{n} here: define backward(self, {names})")


def _returned_none(f):
    """The RuntimeError for f's backward returning None while an input needs a gradient."""
    needing = [str(i) for i, need in enumerate(f.needs_input_grad) if need]
    inputs = (f"input {needing[0]} needs" if len(needing) == 1
              else f"inputs {', '.join(needing)} need")
    return RuntimeError(
        f"{f._name()}.backward returned None (a missing return?) while its {inputs} a "
        f"gradient: return one gradient per input ({len(f.inputs)} here; a tuple for several), "
        "None for an input that has none")


class _OnceDifferentiable(Function):
    """A gradient an author's backward gave with no graph, joined to the gradients it got: its
    value as it is; differentiating it again raises (see _checked_backward)."""

    def __init__(self, name, index):
        self.name, self.index = name, index

    def forward(self, gx, *gys):
        # a copy: the array may be one the author's Function keeps, and this becomes a .grad
        return self.xp.asarray(gx, copy=True)

    def backward(self, gy):
        raise RuntimeError(
            f"{self.name}.backward is not differentiable: its gradient for input {self.index} "
            "was computed on raw arrays (no graph), so its derivative would come out zero; "
            "write the backward with gradcore's ops (F.*) to differentiate it again (a gradient "
            "that is zero: None in its place)")


def _base_of(y, inputs):
    """The input Variable whose array y's is, or may be a view of; None if there is none."""
    data = y._data
    variables = [x for x in inputs if isinstance(x, Variable)]
    for x in variables:
        if x._data is data:
            return x
    if not variables or y._backend.owns_memory(data):
        return None
    recorder = _variables.step_recorder
    if recorder is not None and recorder.is_active():
        return None  # traced arrays: asking NumPy about their memory would end the recording
    overlaps = getattr(y.xp, "may_share_memory", None)  # NumPy's and CuPy's: bounds only
    for x in variables:
        if x._backend is y._backend and (overlaps is None or overlaps(x._data, data)):
            return x
    return None


def _weakens_scalars(x):
    """True for a Variable or an array beside which a NumPy scalar becomes a Python number
    (Function._constant): floating-point data, or data of another library than NumPy, where a
    NumPy scalar kept as it is would be refused as a mix of libraries."""
    if isinstance(x, Variable):
        backend, data = x._backend, x._data
    elif isinstance(x, numbers.Number):  # Python's and NumPy's scalars
        return False
    else:
        backend, data = backends.backend_of(x), x
    if backend is None or data is None:
        return False
    return ((backend.inner or backend) is not backends.NUMPY
            or backend.xp.isdtype(data.dtype, "real floating"))


def _integers_as_float(constants, inputs):
    """`constants` with each integer array made from a raw array cast to the dtype of the first
    floating Variable among `inputs` (bool masks stay bool: a multiply takes them as they are)."""
    floating = next((x for x in inputs if isinstance(x, Variable) and x._data is not None
                     and _variables.dtype_kind(x._backend, x._data.dtype) == "float"), None)
    if floating is None:
        return constants
    backend, dtype = floating._backend, floating._data.dtype
    ours = (backend, backend.inner)  # while a step records, its backend wraps the constants'
    cast = []
    for c, x in zip(constants, inputs):
        # dtype_kind is a cached lookup, where isdtype costs microseconds at every call
        if c is not x and isinstance(c, Variable) and c._backend in ours and (
                _variables.dtype_kind(c._backend, c._data.dtype) == "integral"
                and not backend.xp.isdtype(c._data.dtype, "bool")):
            c = Variable(backend.xp.astype(c._data, dtype), requires_grad=False)
        cast.append(c)
    return tuple(cast)
