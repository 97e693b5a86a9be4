"""Functional transforms: vjp, jvp, grad, value_and_grad, jacobian, jacfwd, hessian, hvp.

Each takes a function `f` of Variables or arrays and differentiates it with the engine: the
transforms are loops around `gradcore.grad`, nothing more. Arrays in give arrays out; Variables
in give Variables out. A result whose graph reaches a Variable that requires grad other than the
point (a Variable argument, a model's parameter or an outer transform's variable that f read)
stays differentiable with respect to it (the backward passes are recorded), so transforms
compose: `jacobian(grad(f), x)` is a Hessian, and a gradient penalty reaches the parameters.

    import gradcore.func as gf
    gf.grad(lambda x: F.sum(F.sin(x)))(x)          # cos(x)
    gf.jacobian(lambda x: x * x, x)                # diag(2x)
    gf.hvp(f, x, v)                                # the Hessian of f at x times v
"""
from copy import copy as shallow_copy
import numbers
import weakref

import backends

from . import engine
from .config import enable_grad, recording
from .function import elsewhere
from .functions.math import copy
from .functions.shape import reshape, stack, transpose
from .variable import Variable, dtype_kind, has_graph

__all__ = ["vjp", "jvp", "grad", "value_and_grad", "jacobian", "jacfwd", "hessian", "hvp"]

# The Variables the transforms made for their primals, and jvp's dummies. Such a leaf is
# "outside" (see _reaches_outside) only for the transforms nested in the one that made it, while
# that one evaluates f: once it has, nothing but that transform differentiates with respect to it
_made = weakref.WeakSet()


# Per thread, `stack`: the Variables of each transform evaluating f now, outermost first. The
# engine's, which refuses a backward() while f runs (it would write the .grad of what f reads)
_evaluating = engine.transforms


def transforming():
    """Whether a transform is evaluating its f in this thread (gradcore.compile runs eagerly
    there: a tape's results hold no graph to differentiate)."""
    return bool(_evaluating.stack)


# ================================================================================ helpers
class _Inputs:
    """The primals as Variables the engine can differentiate with respect to, one of its own
    per position: for a Variable that requires grad, a copy made by an op (the caller, or an
    outer transform, differentiates through it; the same Variable at two positions, or an outer
    transform's variable read inside f, is then not confused with this position's); anything
    else, a new leaf that shares its array (an integer one requires no grad: its derivatives
    are zeros). `arrays`: True when neither a primal nor one of `others` (the arguments not
    differentiated) holds a Variable, so results go back as arrays.

    The backward passes are recorded (`create_graph`) when f's result reaches a Variable that
    requires grad other than these (see `evaluate`): something outside may differentiate the
    results with respect to it.

    In no_grad(), the transform still differentiates f, but its results are constants to the
    caller and to any outer transform (torch.func: a transform respects a no_grad inside f, not
    one around it): no recorded backward passes. The grad mode that decides it is the one when
    the results go out: vjp's when it returns, vjp_fn's when that runs (see `under`)."""

    def __init__(self, primals, where, others=()):
        if not primals:
            raise TypeError(f"{where}: needs at least one primal (the point to differentiate at)")
        for n, p in enumerate(primals):
            _check_point(p, n, where)
        self.arrays = _no_variable(primals) and not _variables_in(list(others))
        # copies even in no_grad: a vjp_fn called later in grad mode differentiates through them
        with enable_grad():
            self.variables = tuple(map(_own_variable, primals))
        _made.update(self.variables)
        # the leaves the transform differentiates with respect to: never "outside"
        self.own = list(self.variables)
        self.reaches = False
        self._set_mode(recording() is not False)

    def evaluate(self, f):
        """f at these inputs, with grad on (a no_grad around the transform cuts off its results,
        not f's graph), noting whether its result reaches a Variable outside (a caller's
        argument, a parameter f reads, an outer transform's variable)."""
        stack = _evaluating.stack
        stack.append(self.variables)
        try:
            with enable_grad():
                out = f(*self.variables)
        finally:
            stack.pop()
        self.reaches = _reaches_outside(out, self.own)
        self._set_mode(self.recording)
        return out

    def _set_mode(self, recording):
        self.recording = recording
        self.create_graph = recording and self.reaches

    def under(self, recording):
        """These inputs, their results going out in grad mode `recording` (vjp_fn's when it
        runs, as torch.func's)."""
        if recording == self.recording:
            return self
        inputs = object.__new__(_Inputs)
        inputs.__dict__.update(self.__dict__)
        inputs._set_mode(recording)
        return inputs

    def seeded(self, seeds):
        """Whether a backward pass seeded with `seeds` (tangents, cotangents) gives results that
        depend on one of them, a Variable that requires grad: it is then recorded, and its
        results go back as Variables whatever the primals were."""
        if self.recording:
            for s in seeds:
                if isinstance(s, Variable) and s.requires_grad:
                    return True
        return False

    def export(self, value, variables=False, reaches=None):
        """`value` as the caller's kind (Variables if `variables`); with arrays in, a result
        that depends on a Variable outside stays a Variable, so that the caller (or an outer
        transform) can differentiate it. `reaches`: whether it does, where known (f's result:
        `evaluate` walked its graph already). Under no_grad, constants (see the class)."""
        arrays = self.arrays and not variables
        if arrays and self.recording and (
                _reaches_outside(value, self.own) if reaches is None else reaches):
            return value
        return _export(value, arrays, detach=not self.recording)

    def export_derivatives(self, value, variables=False):
        """`export` for what backward passes of these inputs gave (gradients, and Jacobians
        stacked from them): recorded only with `create_graph` (or when `variables`, seeded), so
        without it they have no graph, and none is walked for each of a Jacobian's rows."""
        return self.export(value, variables, reaches=None if self.create_graph else False)


def _own_variable(p):
    """The primal p as a Variable of a transform's own: for a Variable that requires grad, a
    copy made by an op (see _Inputs); else a new leaf sharing p's array, which requires grad
    if it holds floating-point numbers."""
    if not isinstance(p, Variable):
        return Variable(p)
    if p.requires_grad:
        return copy(p)
    # detach() shares p's write log: a write to p (p.data -= 1) stops vjp_fn, as it stops
    # backward, instead of vjp_fn computing with the new values
    x = p.detach()
    x.requires_grad = dtype_kind(x._backend, x.dtype) == "float"
    return x


def _variables_in(value):
    """The Variables in `value`: a Variable, or tuples, lists and dicts nesting them."""
    if isinstance(value, Variable):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [v for item in value for v in _variables_in(item)]
    return []


def _reaches_outside(value, own):
    """Whether the graph behind the Variables in `value` reaches a leaf that requires grad other
    than the Variables `own` and the leaves of the transforms nested in this one (see _made)."""
    own = set(map(id, own))
    enclosing = {id(x) for xs in _evaluating.stack for x in xs}
    stack = _variables_in(value)
    seen = set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.creator is None:
            if x.requires_grad and id(x) not in own and (x not in _made or id(x) in enclosing):
                return True
        else:
            stack.extend(v for v in x.creator.inputs if isinstance(v, Variable))
    return False


def _export(value, arrays, detach=False):
    """`value` (a Variable, or tuples, lists and dicts nesting them; anything else is left as
    it is) as the caller's kind: arrays if `arrays` (no primal was a Variable), else Variables,
    cut from the graph that computed them if `detach`."""
    if isinstance(value, Variable):
        if arrays:
            return value.data
        if detach and has_graph(value):
            return value.detach()
        return value
    if isinstance(value, dict):
        exported = shallow_copy(value)  # its type: a defaultdict keeps its default_factory
        for k, v in value.items():
            exported[k] = _export(v, arrays, detach)
        return exported
    if isinstance(value, (tuple, list)):
        items = [_export(v, arrays, detach) for v in value]
        if type(value) is not tuple and hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*items)
        return type(value)(items)
    return value


def _no_variable(primals):
    return not any(isinstance(p, Variable) for p in primals)


def _outputs(out, where):
    """f's result as a flat list of Variables and a function giving that shape back."""
    if isinstance(out, (tuple, list)):
        for k, o in enumerate(out):
            if isinstance(o, (tuple, list, dict)):
                raise TypeError(
                    f"{where}: f must return Variables or arrays, or a flat tuple of them; got a "
                    f"{type(out).__name__} holding a {type(o).__name__} at position {k}: flatten "
                    "it, ((a, b), c) -> (a, b, c)")
            _check_not_number(o, where, f" at position {k}")
        flat = [_output(o, where) for o in out]
        kind = type(out)
        if kind is not tuple and hasattr(out, "_fields"):  # a namedtuple
            return flat, lambda values: kind(*values)
        return flat, lambda values: kind(values)
    _check_not_number(out, where, "")
    return [_output(out, where)], lambda values: values[0]


def _check_not_number(value, where, at):
    """TypeError for a Python number or NumPy scalar that f returned as a result (`at`: its
    position, in words): the graph behind it was cut (.item(), float()), and its derivatives
    would come out as zeros. A constant returned on purpose cannot be told from that, so it is
    refused too, as torch.func refuses any result that is not a Tensor."""
    if isinstance(value, Variable):
        return
    backend = backends.backend_of(value)
    if isinstance(value, numbers.Number) or (backend is not None
                                             and value.__class__ in backend.scalar_types):
        raise TypeError(
            f"{where}: f returned a number{at}, {type(value).__name__} {value!r}, which has no "
            "graph to differentiate (.item(), float() or a NumPy function of a Variable cuts "
            "it off; the derivatives would come out as zeros); return the Variable itself, "
            "e.g. F.sum(x * x), not F.sum(x * x).item()")


def _output(value, where):
    if isinstance(value, Variable):
        return value
    if value is not None:  # Variable() takes None (released data): not a result
        try:
            return Variable(value, requires_grad=False)
        except TypeError:
            pass
    raise TypeError(f"{where}: f must return Variables or arrays (or a tuple of them), got "
                    f"{type(value).__name__}"
                    + ("; does it lack a return statement?" if value is None else ""))


def _like(x, value):
    """`value` (an array, a Variable, a number) as a Variable shaped, typed and placed like x."""
    if isinstance(value, Variable):
        return value
    number = _number(value)
    if number is not None:
        return Variable(_zeros(x) + number, requires_grad=False)
    return Variable(value, requires_grad=False)


def _number(value):
    """A real number that is not an array, Python's or a NumPy scalar (np.float32(2.0) as 2.0),
    as a Python number, which _like spreads over its primal or result in its dtype; None for
    anything else."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):  # no array is Real
        return int(value) if isinstance(value, numbers.Integral) else float(value)
    return None


def _variable_of(value):
    """`value` (a Variable, an array, a list) as a Variable; None for a number (it is broadcast
    and placed like its primal or result: see _like) or anything that is not one."""
    if value is None or _number(value) is not None:
        return None
    try:
        return _output(value, "")
    except TypeError:
        return None


def _shape(value):
    """The shape `value` has as a Variable (see _variable_of), or None."""
    v = _variable_of(value)
    return None if v is None else tuple(v.shape)


def _check_shape(where, value, what, like, of):
    """ValueError, naming the transform and its argument, unless `value` (a tangent, cotangent
    or v) is shaped and placed like `like` (the primal or result it goes with); TypeError for
    None (as torch.func refuses it: a zero derivative is spelled out)."""
    if value is None:
        raise TypeError(f"{where}: {what} is None; pass an array shaped like {of}, "
                        f"{_shape(like)} (zeros where it contributes nothing)")
    if isinstance(value, bool) or str(getattr(value, "dtype", "")) == "bool":
        # a number to Python and NumPy, a slip more often than a 1
        raise TypeError(f"{where}: {what} is {value!r}, of bools; pass a number, or an array "
                        f"of numbers shaped like {of}, {_shape(like)}")
    given, expected = _variable_of(value), _variable_of(like)
    if given is None or expected is None:
        return
    if given._data is None:
        raise ValueError(f"{where}: {what} holds no data (data is None); pass one holding an "
                         f"array shaped like {of}")
    if tuple(given.shape) != tuple(expected.shape):
        raise ValueError(f"{where}: {what} has shape {tuple(given.shape)} but {of} has shape "
                         f"{tuple(expected.shape)}; pass one shaped like {of}")
    if elsewhere(given, expected._backend, expected.device):
        placed, wanted = str(given.device), str(expected.device)
        if placed == wanted:  # one device string, two array libraries
            placed += f" ({_library(given)})"
            wanted += f" ({_library(expected)})"
        raise ValueError(f"{where}: {what} is on {placed} but {of} is on {wanted}; move it "
                         f"there first, e.g. "
                         f"gradcore.Variable({what.removeprefix('the ')}).to('{expected.device}')")


def _library(v):
    """The name of the array library of the Variable v's data (the real one while a step is
    recorded: a traced array wraps it)."""
    return (v._backend.inner or v._backend).name


def _zeros(x, shape=None):
    """An array of zeros typed and placed like the Variable x, shaped like it or `shape`."""
    return x._backend.zeros(tuple(x.shape) if shape is None else shape, x.dtype, x.device)


def _zeros_like(x):
    return Variable(_zeros(x), requires_grad=False)


def _unit(x, i):
    """The i-th unit vector among x's elements (in C order), shaped, typed and placed like x.
    Made one at a time, a new array each (a recorded backward pass keeps its seed), rather
    than taken from an identity matrix of x.size squared elements."""
    flat = _zeros(x, (x.size,))
    # one item assigned: the array API allows it with an int index (every backend's add_at
    # writes so too), at a quarter of add_at's cost on NumPy
    flat[i] = 1
    return x.xp.reshape(flat, tuple(x.shape))


def _gradients(outputs, inputs, cotangents, create_graph):
    """d(outputs . cotangents)/d(inputs), a Variable per input (zeros where none flows)."""
    pairs = [(y, c) for y, c in zip(outputs, cotangents) if has_graph(y)]  # a constant: nothing
    gs = [None] * len(inputs)
    if pairs:
        gs = engine.grad([y for y, _ in pairs], list(inputs),
                         grad_outputs=[c for _, c in pairs], create_graph=create_graph,
                         allow_unused=True)
    return tuple(_zeros_like(x) if g is None else g for x, g in zip(inputs, gs))


# ================================================================================ vjp, jvp
def vjp(f, *primals):
    """`(f(*primals), vjp_fn)`: vjp_fn(cotangent) gives, for each primal, the gradient of
    sum(f(*primals) * cotangent) with respect to it (a tuple, one per primal). The cotangent is
    shaped like f's result (a tuple of them if f returns a tuple)."""
    inputs, out, vjp_fn = _pullback(f, primals, "vjp")
    return inputs.export(out, reaches=inputs.reaches), vjp_fn


def _pullback(f, primals, where, others=()):
    """vjp's work: the _Inputs (which export whatever else f gave, such as an aux), f's result
    as f gave it, and vjp_fn. `others`: f's arguments not differentiated (a Variable among them
    gives Variables out)."""
    inputs = _Inputs(primals, where, others)
    out = inputs.evaluate(f)
    outputs, _ = _outputs(out, where)

    several = isinstance(out, (tuple, list))

    def vjp_fn(cotangent):
        # an array has a len too: taking one for the tuple would split it into numbers
        if several and not isinstance(cotangent, (tuple, list)):
            raise TypeError(f"vjp_fn: f returned a {type(out).__name__} of {len(outputs)} "
                            f"results, so the cotangent must be a tuple of {len(outputs)}, one "
                            f"shaped like each result (as torch.func.vjp's); got "
                            f"{_stacked_hint(cotangent, outputs)}")
        cotangents = cotangent if several else (cotangent,)
        if len(cotangents) != len(outputs):
            raise ValueError(f"vjp_fn: {len(cotangents)} cotangents for {len(outputs)} outputs")
        for k, (y, c) in enumerate(zip(outputs, cotangents)):
            what, of = (f"cotangent[{k}]", f"result {k}") if several else ("the cotangent",
                                                                            "f's result")
            _check_shape("vjp_fn", c, what, y, of)
        now = inputs.under(recording() is not False)
        seeded = now.seeded(cotangents)
        with enable_grad():
            gs = _gradients(outputs, now.variables,
                            [_like(y, c) for y, c in zip(outputs, cotangents)],
                            now.create_graph or seeded)
        return now.export_derivatives(gs, variables=seeded)
    return inputs, out, vjp_fn


def _stacked_hint(cotangent, outputs):
    """What the cotangent given for several results is, and for an array stacked along its
    first axis (one row per result, all of one shape), how to pass it."""
    shape = getattr(cotangent, "shape", None)
    if shape is None:
        return type(cotangent).__name__
    got = f"{type(cotangent).__name__} of shape {tuple(shape)}"
    if len(shape) >= 1 and shape[0] == len(outputs) and all(
            tuple(y.shape) == tuple(shape[1:]) for y in outputs):
        got += (": an array stacked along its first axis is not split; pass "
                "tuple(cotangent), one row per result")
    return got


def jvp(f, primals, tangents):
    """`(f(*primals), J t)`: f's result and its derivative along `tangents` (one per primal).

    Forward mode by two reverse passes (the double-vjp construction): the vjp u -> J^T u is linear
    in u, so differentiating u . (J^T u)... with respect to u, seeded with t, gives J t. It costs
    one backward pass recorded as a graph and one backward through that graph: about three times
    f, independently of the number of outputs."""
    primals = tuple(primals) if isinstance(primals, (tuple, list)) else (primals,)
    tangents = tuple(tangents) if isinstance(tangents, (tuple, list)) else (tangents,)
    if len(primals) != len(tangents):
        raise ValueError(f"jvp: {len(tangents)} tangents for {len(primals)} primals")
    inputs = _Inputs(primals, "jvp")
    for n, (x, t) in enumerate(zip(inputs.variables, tangents)):
        _check_shape("jvp", t, f"tangents[{n}]", x, f"primals[{n}]")
    out, _, rebuild, push = _pushforward(f, inputs, "jvp")
    seeded = inputs.seeded(tangents)
    tangent_out = push(tangents, inputs.create_graph or seeded)
    return (inputs.export(out, reaches=inputs.reaches),
            inputs.export_derivatives(rebuild(tangent_out), variables=seeded))


def _pushforward(f, inputs, where):
    """jvp's work, f evaluated once at `inputs` (_Inputs): f's result as f gave it and as a
    flat list of Variables, a function giving that shape back, and push(tangents,
    create_graph): J t, a Variable per result, for tangents one per primal (None for a zero
    one). Each push is one backward pass through the pullback, which is recorded once here."""
    out = inputs.evaluate(f)
    with enable_grad():
        outputs, rebuild = _outputs(out, where)
        dummies = [Variable(_zeros(y)) for y in outputs]
        _made.update(dummies)
        inputs.own.extend(dummies)  # the pullback's graph reaches them: not "outside"
        pullback = _gradients(outputs, inputs.variables, dummies, create_graph=True)

    def push(tangents, create_graph):
        # the pullback is linear in the dummies, which require grad: a gradient with no graph
        # does not depend on them (an author's backward on raw arrays raises instead of giving
        # one: see Function's rules)
        used = [(g, x, t) for g, x, t in zip(pullback, inputs.variables, tangents)
                if g.creator is not None and t is not None]
        if not used:  # f does not depend on these inputs: the derivative is zero
            return [_zeros_like(y) for y in outputs]
        with enable_grad():
            result = engine.grad([g for g, _, _ in used], dummies,
                                 grad_outputs=[_like(x, t) for _, x, t in used],
                                 create_graph=create_graph, allow_unused=True)
        return [_zeros_like(y) if r is None else r for y, r in zip(outputs, result)]
    return out, outputs, rebuild, push


# ================================================================================ grad
def _check_one_number(y, where):
    # f's result: a Variable or an array (a Python number is refused by _outputs)
    if getattr(y, "size", None) != 1:
        got = f"shape {tuple(y.shape)}" if hasattr(y, "shape") else type(y).__name__
        raise ValueError(f"{where}: f must return one number (size 1) to take its gradient, "
                         f"got {got}; reduce it first (F.sum) or use jacobian")


# How a transform is given several arrays, for the error refusing a tuple, list or dict of them
_SEVERAL = {
    "grad": "f(a, b) with argnums=(0, 1)",
    "value_and_grad": "f(a, b) with argnums=(0, 1)",
    "jacobian": "f(a, b) with x=(a, b)",
    "jacfwd": "f(a, b) with x=(a, b)",
    "hessian": "f(a, b) with x=(a, b)",
    "hvp": "f(a, b) with x=(a, b), v=(va, vb)",
    "vjp": "vjp(f, a, b)",
    "jvp": "jvp(f, (a, b), (ta, tb))",
}


def _check_point(arg, n, where):
    """TypeError for an argument to differentiate with respect to that holds no array: None, a
    Variable whose data is None, or a dict, tuple or list of arrays (pytrees are not supported:
    NumPy would stack a tuple of arrays into one); a list of numbers is one array's values."""
    if arg is None or isinstance(arg, Variable) and arg._data is None:
        what = "it is None" if arg is None else "a Variable whose data is None"
        raise TypeError(f"{where}: argument {n} holds no data ({what}); pass an array or a "
                        "Variable holding one")
    if isinstance(arg, dict) or isinstance(arg, (tuple, list)) and not _numbers_only(arg):
        raise TypeError(f"{where}: argument {n} is a {type(arg).__name__}; a transform takes "
                        "arrays and Variables, not tuples, lists or dicts of them: pass each "
                        f"array as its own argument, {_SEVERAL.get(where, 'f(a, b)')}")


def _numbers_only(value):
    """Whether `value` (a tuple or list) nests Python numbers only: one array's values, as NumPy
    reads [1.0, 2.0], where arrays or Variables in it would be a pytree."""
    return all(_numbers_only(v) if isinstance(v, (tuple, list)) else
               isinstance(v, (int, float)) for v in value)


def _check_floating(arg, n, where):
    """TypeError for an argument to differentiate with respect to that holds integers: its
    derivatives would come out as zeros (vjp and jvp give those, for labels beside logits);
    or no array at all (_check_point)."""
    _check_point(arg, n, where)
    x = arg if isinstance(arg, Variable) else Variable(arg, requires_grad=False)
    if dtype_kind(x.backend, x.dtype) != "float":
        raise TypeError(
            f"{where}: argument {n} has dtype {x.dtype}, which cannot carry a gradient; "
            f"differentiate at a floating-point point ({_floating(arg)})")


def _floating(arg):
    """How to write `arg`, an integer point, as a floating-point one."""
    if isinstance(arg, int):  # a Python number (a bool too)
        return f"{float(arg)!r}, not {arg!r}"
    return 'F.astype(x, "float64")' if isinstance(arg, Variable) else "x.astype(float)"


def _is_index(n):
    return isinstance(n, int) and not isinstance(n, bool)


def _check_pair(out, where):
    """TypeError unless `out`, what an f with has_aux returned, is a pair (result, aux)."""
    if isinstance(out, (tuple, list)) and len(out) == 2:
        return
    got = (f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list))
           else type(out).__name__)
    raise TypeError(f"{where}: with has_aux=True, f must return a pair (result, aux), got {got}"
                    + ("; put the extra values in aux, as a tuple or a dict"
                       if isinstance(out, (tuple, list)) and len(out) > 2 else ""))


def value_and_grad(f, argnums=0, has_aux=False):
    """A function returning `(f(*args, **kwargs), gradient)`: the gradient of f's (one-number)
    result with respect to args[argnums] (a tuple of gradients when argnums is a tuple); the
    other arguments and keyword arguments go to f as they are. With `has_aux`, f returns
    `(result, aux)` and this returns `((result, aux), gradient)`, aux as f gave it."""
    return _value_and_grad(f, argnums, has_aux, "value_and_grad")


def _value_and_grad(f, argnums, has_aux, where):
    """value_and_grad, its errors naming `where`: the transform the user called (grad, hessian
    and hvp are built on it)."""
    if not (_is_index(argnums) or isinstance(argnums, tuple) and argnums
            and all(_is_index(n) for n in argnums)):
        raise TypeError(f"{where}: argnums must be an int or a non-empty tuple of ints, got "
                        f"{argnums!r}")

    def value_and_gradient(*args, **kwargs):
        numbers = argnums if isinstance(argnums, tuple) else (argnums,)
        for n in numbers:
            if not -len(args) <= n < len(args):
                raise IndexError(f"{where}: argnums {n} for a function called with {len(args)} "
                                 "argument(s)")
        chosen = [n % len(args) for n in numbers]
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"{where}: argnums elements must be unique, got {argnums!r} for a "
                             f"function called with {len(args)} argument(s)")
        for n in chosen:
            _check_floating(args[n], n, where)
        aux = []

        def of_chosen(*picked):
            full = list(args)
            for n, value in zip(chosen, picked):
                full[n] = value
            out = f(*full, **kwargs)
            if not has_aux:
                return out
            _check_pair(out, where)
            aux.append(out[1])
            return out[0]
        others = [a for n, a in enumerate(args) if n not in chosen] + list(kwargs.values())
        inputs, out, vjp_fn = _pullback(of_chosen, [args[n] for n in chosen], where, others)
        y = inputs.export(out, reaches=inputs.reaches)
        _check_one_number(y, where)
        gs = vjp_fn(1.0)
        gs = gs if isinstance(argnums, tuple) else gs[0]
        if has_aux:  # aux goes back as a result does
            y = (y, inputs.export(aux[0]))
        return y, gs
    return value_and_gradient


def grad(f, argnums=0, has_aux=False):
    """A function returning the gradient of f's (one-number) result with respect to
    args[argnums] (a tuple of them when argnums is a tuple); keyword arguments go to f as they
    are. Composes: grad(grad(f)). With `has_aux`, f returns `(result, aux)` and this returns
    `(gradient, aux)`."""
    return _grad(f, argnums, has_aux, "grad")


def _grad(f, argnums, has_aux, where):
    """grad, its errors naming `where` (see _value_and_grad)."""
    both = _value_and_grad(f, argnums, has_aux, where)

    def gradient(*args, **kwargs):
        value, g = both(*args, **kwargs)
        return (g, value[1]) if has_aux else g
    return gradient


# ================================================================================ Jacobians
def jacobian(f, x):
    """The Jacobian of f at x by reverse mode: f evaluated once, then one backward pass per
    element of f's result. Shaped f(x).shape + x.shape; with x a tuple of arguments, a tuple of
    Jacobians, one per argument."""
    return _jacobian(f, x, "jacobian")


def _jacobian(f, x, where):
    primals = x if isinstance(x, tuple) else (x,)
    for n, p in enumerate(primals):
        _check_floating(p, n, where)
    inputs, out, vjp_fn = _pullback(f, primals, where)
    outputs, rebuild = _outputs(out, where)
    points = [_output(p, where) for p in primals]
    per_output = []
    for k, y in enumerate(outputs):
        rows = [[] for _ in primals]
        for i in range(y.size):
            gs = vjp_fn(rebuild([_unit(y, i) if j == k else _zeros(o)
                                 for j, o in enumerate(outputs)]))
            for row, g in zip(rows, gs):
                row.append(_output(g, where))
        jacobians = tuple(_stack(row, y.shape, p) for row, p in zip(rows, points))
        per_output.append(jacobians if isinstance(x, tuple) else jacobians[0])
    return inputs.export_derivatives(rebuild(per_output))


def jacfwd(f, x):
    """The Jacobian of f at x by forward mode: f evaluated once (its random draws and side
    effects happen once), its pullback recorded once, then one backward pass through the
    pullback per element of x. Shaped f(x).shape + x.shape; with x a tuple, a tuple of
    Jacobians. A pass costs about twice one of jacobian's (it walks the pullback's graph and
    f's behind it), so jacfwd is the cheaper when x has under half as many elements as f's
    result."""
    primals = x if isinstance(x, tuple) else (x,)
    for n, p in enumerate(primals):
        _check_floating(p, n, "jacfwd")
    inputs = _Inputs(primals, "jacfwd")
    _, outputs, rebuild, push = _pushforward(f, inputs, "jacfwd")
    columns_per_input = []  # for each input, its columns: each a list, one per output of f
    for k, px in enumerate(inputs.variables):
        columns_per_input.append([
            push([_unit(px, j) if i == k else None for i in range(len(primals))],
                 inputs.create_graph) for j in range(px.size)])
    per_output = []
    for o, y in enumerate(outputs):
        jacobians = tuple(_stack_columns([c[o] for c in columns], p, y)
                          for columns, p in zip(columns_per_input, inputs.variables))
        per_output.append(jacobians if isinstance(x, tuple) else jacobians[0])
    return inputs.export_derivatives(rebuild(per_output))


def hessian(f, x):
    """The Hessian of f's (one-number) result at x: the Jacobian of its gradient (reverse over
    reverse), shaped x.shape + x.shape. With x a tuple of arguments, every block, as
    ((H_00, H_01, ...), (H_10, H_11, ...), ...), H_ij = d2f/dx_i dx_j shaped
    x[i].shape + x[j].shape."""
    return _jacobian(_grad(f, _every_argnum(x), False, "hessian"), x, "hessian")


def hvp(f, x, v):
    """The Hessian of f at x times v, without forming the Hessian: one gradient recorded as a
    graph, and one backward pass through it. With x a tuple of arguments, v and the result are
    tuples shaped like x."""
    primals = x if isinstance(x, tuple) else (x,)
    for n, p in enumerate(primals):  # as the caller gave them: grad sees them as Variables
        _check_floating(p, n, "hvp")
    # the Hessian is symmetric: the vjp of the gradient is the Hessian's product with v
    if not isinstance(x, tuple):
        _check_shape("hvp", v, "v", x, "x")
        _, _, vjp_fn = _pullback(_grad(f, 0, False, "hvp"), primals, "hvp")
        return vjp_fn(v)[0]
    v = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    if len(v) != len(x):
        raise ValueError(f"hvp: {len(v)} vectors in v for {len(x)} arguments in x")
    for n, (vn, xn) in enumerate(zip(v, x)):
        _check_shape("hvp", vn, f"v[{n}]", xn, f"x[{n}]")
    _, _, vjp_fn = _pullback(_grad(f, _every_argnum(x), False, "hvp"), x, "hvp")
    return vjp_fn(v)


def _every_argnum(x):
    """grad's argnums for every argument in x if it is a tuple, else 0 (x itself; an empty
    tuple too, for _Inputs to refuse as no primal)."""
    return tuple(range(len(x))) if isinstance(x, tuple) and x else 0


def _stack(rows, shape, x):
    """Rows (one gradient with respect to the Variable x per element of a result of `shape`)
    as one Variable shaped shape + x.shape."""
    if not rows:  # an empty result
        return Variable(_zeros(x, tuple(shape) + tuple(x.shape)), requires_grad=False)
    inner = tuple(rows[0].shape)
    return reshape(stack(rows), tuple(shape) + inner)


def _stack_columns(columns, x, y):
    """Columns (one derivative shaped like f's result y per element of x) as one Variable
    shaped y.shape + x.shape."""
    outer = tuple(y.shape)
    if not columns:  # an empty x
        return Variable(_zeros(y, outer + tuple(x.shape)), requires_grad=False)
    stacked = stack(columns)  # x.size, *outer
    flat = reshape(stacked, (len(columns), -1) if outer else (len(columns), 1))
    shape_x = tuple(x.shape)
    return reshape(transpose(flat), outer + shape_x)
