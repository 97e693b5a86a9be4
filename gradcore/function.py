"""Function: one node of the graph. __call__ unwraps, runs forward, wraps, and records."""
import itertools
import re
import weakref

import backends

from .config import is_grad_enabled
from .variable import _SCALARS, Variable

_sequence = itertools.count()  # creation order: the heap's tie-break within a generation
_new_variable = object.__new__
_weakref = weakref.ref
_needs_cache = {}  # needs_input_grad tuples, interned


def _snake_case(name):
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _output(data, backend, creator, generation):
    """A Variable for a Function output, built without Variable.__init__'s checks."""
    y = _new_variable(Variable)
    y._data = data
    y._backend = backend
    y.name = None
    y.grad = None
    y.creator = creator
    y.generation = generation
    y.requires_grad = creator is not None
    y._hooks = None
    return y


class Function:
    """Subclass with `forward(*arrays)` -> array(s) and `backward(*gys)` -> gradient(s).

    `forward` works on raw arrays (use `self.xp`); `backward` takes and returns Variables and is
    written with gradcore ops, so differentiating it again (create_graph) just works.
    """

    __slots__ = ("inputs", "outputs", "generation", "sequence", "backend",
                 "needs_input_grad", "_output_meta", "__weakref__", "__dict__")
    _saved = ()  # save_for_backward's values; read per call only when NumPy returns a scalar
    device = None  # set per call for backends with several devices (NumPy has one)
    op_name = None  # the name errors use; by default the class name in snake case

    def __call__(self, *inputs):
        xs = []     # what forward gets: each Variable's array, Python scalars as they are
        needs = []  # which inputs require grad
        generation = 0
        backend = None
        for x in inputs:
            if isinstance(x, Variable):
                if x._backend is not backend:
                    if backend is not None or x._backend is None:
                        self._raise_mixed(inputs)
                    backend = x._backend
                xs.append(x._data)
                needs.append(x.requires_grad)
                if x.generation > generation:
                    generation = x.generation
            elif x.__class__ in _SCALARS:
                xs.append(x)
                needs.append(False)
            else:  # a raw array (a constant) or something unsupported: wrap, then start again
                return self(*[self._constant(i) for i in inputs])
        if backend is None:
            raise TypeError(f"{self._name()}: needs at least one Variable or array input, "
                            f"got {', '.join(type(x).__name__ for x in inputs) or 'none'}")
        self.backend = backend
        if not backend.single_device:
            self.device = self._common_device(backend, inputs)

        try:
            if backend.needs_device_context:  # the flag spares NumPy a no-op context per op
                with backend.device_context(self.device):
                    ys = self.forward(*xs)
            elif len(xs) == 1:  # plain calls: CPython's f(*args) costs about twice as much
                ys = self.forward(xs[0])
            elif len(xs) == 2:
                ys = self.forward(xs[0], xs[1])
            else:
                ys = self.forward(*xs)
        except (ValueError, TypeError, IndexError) as e:
            raise self._explain(e, inputs) from e

        creator = None
        if True in needs and is_grad_enabled():  # become a node of the graph
            creator = self
            self.inputs = inputs
            needs = tuple(needs)  # shared copies: one long-lived object less per node
            self.needs_input_grad = _needs_cache.setdefault(needs, needs)
            self.generation = generation
            self.sequence = next(_sequence)
            generation += 1
        else:
            generation = 0

        if ys.__class__ is not backend.array_type:
            if ys.__class__ in backend.scalar_types and not self._saved:
                ys = backend.xp.asarray(ys)  # NumPy's 0-d ops and reductions give scalars
            elif ys.__class__ is tuple:
                return self._wrap_outputs(ys, backend, creator, generation)
            else:
                ys, backend = self._wrap_output(ys, backend)
        y = _new_variable(Variable)  # one output, the common case: Variable.__init__'s checks
        y._data = ys                 # are not needed for a forward result
        y._backend = backend
        y.name = y.grad = y._hooks = None
        y.creator = creator
        y.generation = generation
        if creator is None:
            y.requires_grad = False
        else:
            y.requires_grad = True
            self.outputs = (_weakref(y),)
        return y

    def _wrap_outputs(self, ys, backend, creator, generation):
        """Variables for the outputs of a forward that returned a tuple."""
        outputs = []
        for y in ys:
            b = backend
            if y.__class__ is not b.array_type:
                y, b = self._wrap_output(y, b)
            outputs.append(_output(y, b, creator, generation))
        if creator is not None:
            self.outputs = tuple([_weakref(y) for y in outputs])
            # shapes and dtypes, to make zeros for an output that dies before backward
            self._output_meta = [(y.shape, y.dtype) for y in outputs]
        return tuple(outputs)

    def forward(self, *xs):
        raise NotImplementedError(f"{type(self).__name__} must define forward(*xs)")

    def backward(self, *gys):
        raise NotImplementedError(f"{type(self).__name__} must define backward(*gys)")

    # ---------------------------------------------------------------- helpers for authors
    @property
    def xp(self):
        """The array namespace of this call's inputs (numpy, cupy, ...)."""
        return self.backend.xp

    def save_for_backward(self, *values):
        """Keep arrays (or Variables) for backward; read them back with `saved_tensors`."""
        self._saved = values

    @property
    def saved_tensors(self):
        """The saved values as Variables: an input's or output's array comes back as that
        Variable (so backward stays differentiable); any other array as a constant."""
        known = {id(x._data): x for x in self.inputs if isinstance(x, Variable)}
        for ref in self.outputs:
            y = ref()
            if y is not None:
                known[id(y._data)] = y
        return tuple(v if isinstance(v, Variable) or v is None or v.__class__ in _SCALARS
                     else known[id(v)] if id(v) in known else Variable(v, requires_grad=False)
                     for v in self._saved)

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

    # ---------------------------------------------------------------- the slow paths of __call__
    def _name(self):
        """The op's name in messages: `op_name`, else the class name in snake case."""
        return self.op_name or _snake_case(type(self).__name__)

    def _constant(self, x):
        """Variables and scalars as they are; a raw array as a constant Variable."""
        if isinstance(x, Variable) or x.__class__ in _SCALARS:
            return x
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
        """The error from forward again, saying which op failed and on what shapes."""
        shapes = [str(tuple(x.shape)) if isinstance(x, Variable) else repr(x) for x in inputs]
        message = f"{self._name()}: {error} (inputs: {', '.join(shapes)})"
        try:
            return type(error)(message)
        except Exception:
            return ValueError(message)

    def _wrap_output(self, y, backend):
        """(array, backend) for a forward result that is not an array of the inputs' backend:
        a NumPy scalar from a 0-d op or a reduction, or another backend's array (to())."""
        array = backend.ensure_array(y)
        if array.__class__ is not backend.array_type:
            backend = backends.backend_of(y)
            if backend is None:
                raise TypeError(f"{self._name()}.forward returned {type(y).__name__}, not an array")
            array = backend.ensure_array(y)
        if array is not y and self._saved:  # a saved scalar must come back as this output
            self._saved = tuple(array if v is y else v for v in self._saved)
        return array, backend
