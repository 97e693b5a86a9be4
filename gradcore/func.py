"""Functional transforms: vjp, jvp, grad, value_and_grad, jacobian, jacfwd, hessian, hvp.

Each takes a function `f` of Variables or arrays and differentiates it with the engine: the
transforms are loops around `gradcore.grad`, nothing more. Arrays in give arrays out; Variables
in give Variables out, and where an input requires grad the results stay differentiable (the
backward passes are recorded), so transforms compose: `jacobian(grad(f), x)` is a Hessian.

    import gradcore.func as gf
    gf.grad(lambda x: F.sum(F.sin(x)))(x)          # cos(x)
    gf.jacobian(lambda x: x * x, x)                # diag(2x)
    gf.hvp(f, x, v)                                # the Hessian of f at x times v
"""
import contextlib
import threading

from . import engine
from .config import enable_grad
from .functions.math import copy
from .functions.shape import reshape, stack, transpose
from .variable import Variable, dtype_kind

__all__ = ["vjp", "jvp", "grad", "value_and_grad", "jacobian", "jacfwd", "hessian", "hvp"]


# ================================================================================ helpers
_running = threading.local()  # .depth: how many transforms are evaluating f in this thread


@contextlib.contextmanager
def _evaluating():
    """Around a call of the user's f: a transform called inside it is nested in this one."""
    _running.depth = _nesting() + 1
    try:
        with enable_grad():
            yield
    finally:
        _running.depth -= 1


def _nesting():
    return getattr(_running, "depth", 0)


class _Inputs:
    """The primals as Variables the engine can differentiate with respect to, one of its own
    per position: for a Variable that requires grad, a copy made by an op (an outer transform,
    or the caller, differentiates through it; the same Variable at two positions, or an outer
    transform's variable read inside f, is then not confused with this position's); anything
    else, a new leaf that shares its array (an integer one requires no grad: its derivatives
    are zeros). `arrays`: True when no primal was a Variable, so results go back as arrays."""

    def __init__(self, primals, where):
        if not primals:
            raise TypeError(f"{where}: needs at least one primal (the point to differentiate at)")
        self.arrays = _no_variable(primals)
        with enable_grad():
            self.variables = tuple(copy(p) if isinstance(p, Variable) and p.requires_grad
                                   else Variable(p.data if isinstance(p, Variable) else p)
                                   for p in primals)
        # record the backward passes when something outside may differentiate the results: a
        # caller's Variable, or an outer transform whose variable f may read (a closure)
        self.nested = _nesting() > 0
        self.create_graph = self.nested or not self.arrays and any(
            isinstance(p, Variable) and p.requires_grad for p in primals)

    def export(self, value):
        """`value` as the caller's kind; inside another transform's f, a result that depends on
        a variable of the outer transform's stays a Variable, so that it can differentiate it."""
        if self.arrays and self.nested and _reaches_outside(value, self.variables):
            return value
        return _export(value, self.arrays)


def _reaches_outside(value, own):
    """Whether the graph behind `value` (a Variable, or a tuple/list of them) reaches a leaf that
    requires grad other than the Variables `own`."""
    own = set(map(id, own))
    stack = [v for v in (value if isinstance(value, (tuple, list)) else (value,))
             if isinstance(v, Variable)]
    seen = set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.creator is None:
            if x.requires_grad and id(x) not in own:
                return True
        else:
            stack.extend(v for v in x.creator.inputs if isinstance(v, Variable))
    return False


def _export(value, arrays):
    """`value` (a Variable, or a tuple/list of them) as the caller's kind: arrays if `arrays`
    (no primal was a Variable), else Variables."""
    if isinstance(value, (tuple, list)):
        return type(value)(_export(v, arrays) for v in value)
    if arrays and isinstance(value, Variable):
        return value.data
    return value


def _no_variable(primals):
    return not any(isinstance(p, Variable) for p in primals)


def _computed(values):
    """Whether any of `values` (Variables) has a graph behind it: a transform's result that
    depends on an outer transform's variable (see _Inputs.export)."""
    return any(v.creator is not None for v in values)


def _outputs(out, where):
    """f's result as a flat list of Variables and a function giving that shape back."""
    if isinstance(out, (tuple, list)):
        flat = [_output(o, where) for o in out]
        kind = type(out)
        return flat, lambda values: kind(values)
    return [_output(out, where)], lambda values: values[0]


def _output(value, where):
    if isinstance(value, Variable):
        return value
    try:
        return Variable(value, requires_grad=False)
    except TypeError:
        raise TypeError(f"{where}: f must return Variables or arrays (or a tuple of them), got "
                        f"{type(value).__name__}") from None


def _like(x, value):
    """`value` (an array, a Variable, a number) as a Variable shaped, typed and placed like x."""
    if isinstance(value, Variable):
        return value
    if isinstance(value, (int, float)):
        return Variable(_zeros(x) + value, requires_grad=False)
    return Variable(value, requires_grad=False)


def _zeros(x):
    """An array of zeros shaped, typed and placed like the Variable x."""
    return x._backend.zeros(x.shape, x.dtype, x.device)


def _zeros_like(x):
    return Variable(_zeros(x), requires_grad=False)


def _basis(x):
    """The identity matrix of x.size, typed and placed like x: its rows are unit vectors."""
    backend = x._backend
    with backend.device_context(x.device):
        return backend.to_device(backend.xp.eye(x.size, dtype=x.dtype), x.device)


def _gradients(outputs, inputs, cotangents, create_graph):
    """d(outputs . cotangents)/d(inputs), a Variable per input (zeros where none flows)."""
    pairs = [(y, c) for y, c in zip(outputs, cotangents)  # a constant output adds nothing
             if y.creator is not None or y.requires_grad]
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
    inputs = _Inputs(primals, "vjp")
    with _evaluating():
        out = f(*inputs.variables)
    outputs, _ = _outputs(out, "vjp")

    def vjp_fn(cotangent):
        cotangents = cotangent if isinstance(out, (tuple, list)) else (cotangent,)
        if len(cotangents) != len(outputs):
            raise ValueError(f"vjp_fn: {len(cotangents)} cotangents for {len(outputs)} outputs")
        with enable_grad():
            gs = _gradients(outputs, inputs.variables,
                            [_like(y, c) for y, c in zip(outputs, cotangents)],
                            inputs.create_graph)
        return inputs.export(gs)
    return inputs.export(out), vjp_fn


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
    with _evaluating():
        out = f(*inputs.variables)
    with enable_grad():
        outputs, rebuild = _outputs(out, "jvp")
        dummies = [Variable(_zeros(y)) for y in outputs]
        pullback = _gradients(outputs, inputs.variables, dummies, create_graph=True)
        used = [(g, x, t) for g, x, t in zip(pullback, inputs.variables, tangents)
                if g.creator is not None]
        if not used:  # f does not depend on its inputs: the derivative is zero
            return inputs.export(out), inputs.export(rebuild([_zeros_like(y) for y in outputs]))
        result = engine.grad([g for g, _, _ in used], dummies,
                             grad_outputs=[_like(x, t) for _, x, t in used],
                             create_graph=inputs.create_graph, allow_unused=True)
    tangent_out = [_zeros_like(y) if r is None else r for y, r in zip(outputs, result)]
    return inputs.export(out), inputs.export(rebuild(tangent_out))


# ================================================================================ grad
def _check_one_number(y):
    if getattr(y, "size", None) != 1:
        got = f"shape {tuple(y.shape)}" if hasattr(y, "shape") else type(y).__name__
        raise ValueError(f"grad: f must return one number (size 1) to take its gradient, got "
                         f"{got}; reduce it first (F.sum) or use jacobian")


def _check_floating(arg, n, where="grad"):
    """TypeError for an argument to differentiate with respect to that holds integers: its
    derivatives would come out as zeros (vjp and jvp give those, for labels beside logits)."""
    x = arg if isinstance(arg, Variable) else Variable(arg, requires_grad=False)
    if dtype_kind(x.backend, x.dtype) != "float":
        raise TypeError(
            f"{where}: argument {n} has dtype {x.dtype}, which cannot carry a gradient; "
            "differentiate at a floating-point point (2.0, not 2; or x.astype(float))")


def _is_index(n):
    return isinstance(n, int) and not isinstance(n, bool)


def value_and_grad(f, argnums=0, has_aux=False):
    """A function returning `(f(*args), gradient)`: the gradient of f's (one-number) result with
    respect to args[argnums] (a tuple of gradients when argnums is a tuple). With `has_aux`, f
    returns `(result, aux)` and this returns `((result, aux), gradient)`, aux as f gave it."""
    if not (_is_index(argnums) or isinstance(argnums, tuple) and argnums
            and all(_is_index(n) for n in argnums)):
        raise TypeError(f"grad: argnums must be an int or a non-empty tuple of ints, got "
                        f"{argnums!r}")

    def value_and_gradient(*args):
        numbers = argnums if isinstance(argnums, tuple) else (argnums,)
        for n in numbers:
            if not -len(args) <= n < len(args):
                raise IndexError(f"grad: argnums {n} for a function called with {len(args)} "
                                 "argument(s)")
        chosen = [n % len(args) for n in numbers]
        for n in chosen:
            _check_floating(args[n], n)
        aux, own = [], []

        def of_chosen(*picked):
            own.extend(picked)
            full = list(args)
            for n, value in zip(chosen, picked):
                full[n] = value
            out = f(*full)
            if not has_aux:
                return out
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise TypeError("grad: with has_aux=True, f must return a pair (result, aux), "
                                f"got {type(out).__name__}")
            aux.append(out[1])
            return out[0]
        y, vjp_fn = vjp(of_chosen, *[args[n] for n in chosen])
        _check_one_number(y)
        gs = vjp_fn(1.0)
        gs = gs if isinstance(argnums, tuple) else gs[0]
        if has_aux:  # as a result is given (see _Inputs.export)
            arrays = _no_variable([args[n] for n in chosen])
            keep = not arrays or _nesting() > 0 and _reaches_outside(aux[0], own)
            y = (y, aux[0] if keep else _export(aux[0], True))
        return y, gs
    return value_and_gradient


def grad(f, argnums=0, has_aux=False):
    """A function returning the gradient of f's (one-number) result with respect to
    args[argnums] (a tuple of them when argnums is a tuple). Composes: grad(grad(f)). With
    `has_aux`, f returns `(result, aux)` and this returns `(gradient, aux)`."""
    both = value_and_grad(f, argnums, has_aux)

    def gradient(*args):
        value, g = both(*args)
        return (g, value[1]) if has_aux else g
    return gradient


# ================================================================================ Jacobians
def jacobian(f, x):
    """The Jacobian of f at x by reverse mode: one backward pass per element of f's result.
    Shaped f(x).shape + x.shape; with x a tuple of arguments, a tuple of Jacobians, one per
    argument."""
    primals = x if isinstance(x, tuple) else (x,)
    for n, p in enumerate(primals):
        _check_floating(p, n, "jacobian")
    out, vjp_fn = vjp(f, *primals)
    outputs, rebuild = _outputs(out, "jacobian")
    per_output = []
    computed = False  # a row that depends on an outer transform's variable (see export)
    for k, y in enumerate(outputs):
        rows = [[] for _ in primals]
        basis = _basis(y)
        for i in range(y.size):
            unit = y.xp.reshape(basis[i, ...], y.shape)
            gs = vjp_fn(rebuild([unit if j == k else _zeros(o) for j, o in enumerate(outputs)]))
            for row, g in zip(rows, gs):
                row.append(_output(g, "jacobian"))
        computed = computed or any(_computed(row) for row in rows)
        jacobians = tuple(_stack(row, y.shape) for row in rows)
        per_output.append(jacobians if isinstance(x, tuple) else jacobians[0])
    return _export(rebuild(per_output), _no_variable(primals) and not computed)


def jacfwd(f, x):
    """The Jacobian of f at x by forward mode (jvp): one pass per element of x. Shaped
    f(x).shape + x.shape; with x a tuple, a tuple of Jacobians. Cheaper than jacobian when x has
    fewer elements than f's result."""
    primals = x if isinstance(x, tuple) else (x,)
    for n, p in enumerate(primals):
        _check_floating(p, n, "jacfwd")
    columns_per_input = []  # for each input, its columns: each a list, one per output of f
    points = [_output(p, "jacfwd") for p in primals]
    rebuild = None
    for k, px in enumerate(points):
        basis = _basis(px)
        columns = []
        for j in range(px.size):
            tangents = [q.xp.reshape(basis[j, ...], q.shape) if i == k else _zeros(q)
                        for i, q in enumerate(points)]
            _, column = jvp(f, primals, tangents)
            column, rebuild = _outputs(column, "jacfwd")
            columns.append(column)
        columns_per_input.append(columns)
    per_output = []
    for o in range(len(columns_per_input[0][0])):
        jacobians = tuple(_stack_columns([c[o] for c in columns], p)
                          for columns, p in zip(columns_per_input, primals))
        per_output.append(jacobians if isinstance(x, tuple) else jacobians[0])
    computed = any(_computed(column) for columns in columns_per_input for column in columns)
    return _export(rebuild(per_output), _no_variable(primals) and not computed)


def hessian(f, x):
    """The Hessian of f's (one-number) result at x: the Jacobian of its gradient (reverse over
    reverse), shaped x.shape + x.shape."""
    return jacobian(grad(f), x)


def hvp(f, x, v):
    """The Hessian of f at x times v, without forming the Hessian: one gradient recorded as a
    graph, and one backward pass through it."""
    _, vjp_fn = vjp(grad(f), x)  # the Hessian is symmetric: its vjp is its product with v
    return vjp_fn(v)[0]


def _stack(rows, shape):
    """Rows (one gradient per element of a result of `shape`) as one Variable shaped
    shape + the gradient's shape."""
    inner = tuple(rows[0].shape)
    return reshape(stack(rows), tuple(shape) + inner)


def _stack_columns(columns, x):
    """Columns (one f-shaped derivative per element of x) as one Variable shaped
    f.shape + x.shape."""
    outer = tuple(columns[0].shape)
    stacked = stack(columns)  # x.size, *outer
    flat = reshape(stacked, (len(columns), -1) if outer else (len(columns), 1))
    shape_x = tuple(x.shape)
    return reshape(transpose(flat), outer + shape_x)
