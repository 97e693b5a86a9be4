"""The backward walk: a heap keyed (-generation, -sequence), each Function visited once."""
from heapq import heappop, heappush
import numbers
import operator
import os
import sys
import threading
import warnings
import weakref

import backends

from . import anomaly
from . import variable as _variables
from .config import is_anomaly_enabled, using_config
from .function import add_note, elsewhere, gradient_elsewhere
from .functions.device import astype
from .functions.math import copy
from .functions.shape import LaidOut, laid_out_like, sum_to
from .variable import (RETAIN_GRAD, Variable, _init_slots, dtype_kind, gradient_mismatch,
                       latest_write, version_at)

# Comments below weigh costs on the workloads in benchmarks/ (python -m benchmarks): chain, a
# long chain of scalar ops; wide, many small branches off one input; hod, higher-order
# derivatives (gradcore.grad with create_graph). "callgrind": instructions counted on them.

# Held while gradients are added into leaves' .grad: backward in several threads into one leaf
# must not lose a sum (x.grad = x.grad + g reads, then writes)
_accumulating = threading.Lock()
_new_variable = object.__new__
# one class, one dtype and shape (): comparing two scalars' classes compares shapes and dtypes
_NUMPY_SCALARS = backends.NUMPY.scalar_types


def _after_fork():
    """In the child of an os.fork (multiprocessing's workers on Linux): a sum another thread of
    the parent was adding would never release _accumulating there. The forking thread never
    holds it: nothing under it calls user code."""
    global _accumulating
    _accumulating = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


# The leaves that have post-accumulate hooks (Variable.register_post_accumulate_grad_hook; the
# hooks are in each leaf's _post_hooks slot, so a hook that refers to its own leaf, an optimizer
# stepping it, makes an ordinary cycle the collector frees). Held weakly: while it is empty, a
# backward pays one truth test for the feature; else it first counts each hooked leaf's ops
hooked_leaves = weakref.WeakSet()


def _seed(y, grad, create_graph, index=None):
    """The seed gradient for the output y, checked: `grad` (None: ones) as a Variable shaped,
    typed and placed like y. `index`: y is gradcore.grad's outputs[index] (for messages)."""
    if grad is None:
        return Variable(y.xp.ones_like(y._data), requires_grad=False)
    if not isinstance(grad, Variable):
        if isinstance(grad, (numbers.Number, list, tuple)) or (
                type(grad) in backends.NUMPY.scalar_types):
            # numbers belong to no device: made where y is (2.0 on an array-API device)
            grad = backends.asarray_on(grad, y.device, y.dtype)
        grad = Variable(grad, requires_grad=False)
    if _variables.step_recorder is not None:
        if create_graph and grad._requires_grad:
            # the gradients are differentiated with respect to it: traced where it is, as an
            # op's input is (a leaf the step made: its array a constant of the tape)
            _variables.step_recorder.adopt_inputs([grad])
        else:  # a seed made by the step's own code: a constant
            grad = _variables.step_recorder.constant_for(grad, y)
    if index is None:
        seed, output, given = "backward: the seed gradient", "the output", "a grad"
    else:
        seed = f"grad: grad_outputs[{index}], the seed for output {index},"
        output, given = f"outputs[{index}]", f"grad_outputs[{index}]"
    if grad._data is None:
        raise ValueError(f"{seed} has no data (data is None); pass {given} holding an array")
    if tuple(grad.shape) != tuple(y.shape):
        raise ValueError(f"{seed} has shape {tuple(grad.shape)} but {output} has shape "
                         f"{tuple(y.shape)}; pass {given} shaped like {output}")
    if grad._backend is not y._backend or grad.device != y.device:
        raise ValueError(f"{seed} is on {grad.device} but {output} is on {y.device}; move it "
                         f"there first, e.g. {'grad' if index is None else given}.to('{y.device}')")
    if grad.dtype != y.dtype:  # the seed takes the output's dtype, as float32 stays float32
        if create_graph and grad.requires_grad:
            # recorded as the walk records: the gradients depend on the seed (a double vjp)
            with using_config("enable_backprop", True):
                grad = astype(grad, y.dtype)
        else:
            grad = Variable(y.xp.astype(grad._data, y.dtype), requires_grad=False)
    if grad._requires_grad:
        # the walk hands the seed to backward methods and the helpers they call, where
        # `g *= 2` writes into a Variable that requires grad under no_grad (a Parameter's
        # update): the caller's seed would change, doubling at each reuse. A seed of the walk's
        # own is rebound instead: the same array without grad, or with create_graph a copy
        # recorded in the graph (the gradients still depend on the caller's seed)
        if create_graph:
            with using_config("enable_backprop", True):
                grad = copy(grad)
        else:
            grad = Variable(grad._data, requires_grad=False)
    return grad


def _describe(x):
    """'the Variable "name" of shape (3,) and dtype float32' for messages."""
    name = f'"{x.name}" ' if x.name else ""
    if x._data is None:
        return f"the Variable {name}whose data was released (set to None)"
    return f"the Variable {name}of shape {tuple(x.shape)} and dtype {x.dtype}"


def _run_hooks(x, g, shared, undo=None):
    """x's hooks on its gradient g, in order; a hook may return a replacement. A gradient a hook
    was handed may be kept by it: its array goes into `shared`. Then retain_grad()'s store
    (noted in `undo`, the walk's _Undo in anomaly mode)."""
    retain = False
    for hook in list(x._hooks):
        if hook is RETAIN_GRAD:
            retain = True
            continue
        shared[id(g._data)] = g._data
        if undo is not None:
            undo.hooks_run += 1
        handed = g._data
        hooked = _variables.hooked
        outer = getattr(hooked, "gradient", None)  # a hook's own backward runs hooks too
        outer_handed = getattr(hooked, "handed", None)
        hooked.gradient = hooked.handed = g
        try:
            result = _call_hook(hook, x, g)
        except BaseException:
            _forget_rebound(hooked, g)
            raise
        finally:
            hooked.gradient, hooked.handed = outer, outer_handed
        if g._data is not handed:  # g.data = ...: g may be another input's gradient
            raise RuntimeError(
                f"the hook {_hook_name(hook)} on {_describe(x)} wrote into the gradient it was "
                "handed (g.data = ...): that Variable may be another input's gradient too, or "
                "the seed. Return a new gradient instead (return g * 10)")
        if getattr(hooked, "rebound", None) is g:
            hooked.rebound = hooked.result = None
            if result is None:
                raise RuntimeError(
                    f"the hook {_hook_name(hook)} on {_describe(x)} wrote g op= ... and "
                    "returned None: as in DeZero, g *= 10 makes a new Variable (the one handed "
                    "may be another input's gradient too), so its result was lost. Return it "
                    "(g = g * 10; return g)")
        if result is not None:
            g = _hook_result(hook, x, result)
            shared[id(g._data)] = g._data  # the hook's: it may keep it (another's data, say)
        if undo is not None:  # anomaly mode: g came in finite (the walk checked it)
            _check_hook_gradient(hook, x, g, result is None)
    if retain:
        _retain(x, g, shared, undo)
    return g


def _output_hooks(f, y, g, shared, unchecked_roots, wanted=None, known=None, undo=None):
    """The hooks of y, an output of f, on its gradient g (_run_hooks), just before f's backward
    runs: every op is checked for writes first (_check_before_hooks). A hook that writes (a .data
    assignment, an optimizer step) may write what f's backward reads, so then f is checked again
    (but for an f off gradcore.grad's paths, which _skip_or_check_versions skips too)."""
    if unchecked_roots:
        _check_before_hooks(unchecked_roots, wanted, known)
    written = latest_write[0]
    g = _run_hooks(y, g, shared, undo)
    if latest_write[0] != written and (wanted is None or _behind(f, wanted, known)):
        try:
            _check_versions(f)
        except RuntimeError as error:
            name = f._name()
            add_note(error, f"the write was made by a hook on {_describe(y)}, an output of "
                            f"{name}: its hooks run before {name}.backward. Make the change "
                            "after backward, or in a post-accumulate hook on a leaf")
            raise
    return g


def _retain(y, g, shared, undo):
    """Add g, the gradient the walk hands on from y, into y.grad (retain_grad), as y's own: a
    copy if g's array is one another holds (`shared`: a seed, a hook's argument, another
    retained .grad) or a view of one (a reshape's backward, a broadcast), so that no two .grads
    share memory. Marks g's array shared: whoever else gets g from here gets a copy. In anomaly
    mode (`undo`, the walk's _Undo) the sum is checked first, and y.grad noted as it was."""
    if g._backend.lazy:  # Dask: y.grad in y's chunks; the walk hands on g as it is
        g = _laid_out_as(y, g)
    data = g._data
    kept = copy(g) if id(data) in shared or not g._backend.owns_memory(data) else g
    shared[id(data)] = data
    if y._grad is not None:
        _check_grad_fits(y)
    with _accumulating:  # several threads may retain into one y (a shared graph), as into leaves
        if y._grad is None:
            total = kept
        else:
            total = _grad_plus(y._grad, kept)
            if undo is not None:  # checked before it is set: a refused sum keeps y.grad
                _check_grad_sum(y, total)
        if undo is not None:
            undo.keep(y)
        y._grad = y._retained_grad = total
        if undo is not None:
            undo.set(y)


def _grad_plus(old, g):
    """old + g, the sum a .grad holding `old` becomes. If old has a graph (a .grad that
    create_graph built, or one set by hand that requires grad) the sum is recorded whatever the
    walk's mode, so that a later plain backward keeps it differentiable, as PyTorch's in-place
    add into such a .grad does. One check, paid only where a .grad is there already."""
    if old.creator is None and not old._requires_grad:
        return old + g
    with using_config("enable_backprop", True):
        return old + g


def _check_hook_gradient(hook, x, g, kept):
    """Anomaly mode, after `hook` on x ran on a finite gradient: RuntimeError if g, the gradient
    it returned (or, `kept`, the one it was handed and returned None for), holds NaN or
    infinity. The hook is named: the op that would read g next, or x.grad, is not the cause."""
    if anomaly.is_finite(g._data):
        return
    did = ("returned None but wrote into the gradient it was handed, which now holds" if kept
           else "returned a gradient holding")
    raise RuntimeError(
        f"anomaly: the hook {_hook_name(hook)}{anomaly.defined_at(hook)} registered on "
        f"{_describe(x)} {did} {anomaly.nonfinite(g._data)}, where the gradient backward "
        "handed it was finite: the hook is the cause")


def _check_post_hook(hook, x, was_finite):
    """Anomaly mode, after the post-accumulate `hook` on the leaf x ran: RuntimeError if it left
    x.grad holding NaN or infinity, where it was finite before."""
    grad = x._grad
    if not was_finite or grad is None or anomaly.is_finite(grad._data):
        return
    raise RuntimeError(
        f"anomaly: the post-accumulate hook {_hook_name(hook)}{anomaly.defined_at(hook)} "
        f"registered on {_describe(x)} left its .grad holding {anomaly.nonfinite(grad._data)}, "
        "where the .grad backward set was finite: the hook is the cause")


def _hook_result(hook, x, g):
    """What `hook` returned, as a Variable: RuntimeError unless shaped, typed, placed like x."""
    if not isinstance(g, Variable):
        if backends.backend_of(g) is None:
            raise RuntimeError(f"hook {_hook_name(hook)} on {_describe(x)} returned a "
                               f"{type(g).__name__}; return a Variable or an array, or None to "
                               "keep the gradient")
        g = Variable(g, requires_grad=False)
    problems = gradient_mismatch(x, g)
    if problems:
        raise RuntimeError(f"hook {_hook_name(hook)} on {_describe(x)} returned a gradient of "
                           f"{problems}; a hook must return a gradient with the Variable's shape, "
                           f"dtype and device, or None")
    return g


def _call_hook(hook, x, argument):
    """hook(argument), an exception it raises noted with the hook and x (NumPy's "output array
    is read-only" names neither)."""
    try:
        return hook(argument)
    except Exception as error:
        hint = ""
        if "read-only" in str(error):
            hint = (" (a hook returns a new gradient: the array it is handed may be another's "
                    "gradient too, and must not be written in place)")
        add_note(error, f"raised in the hook {_hook_name(hook)} on {_describe(x)}{hint}")
        raise


def _forget_rebound(hooked, g):
    """A hook that wrote `g op= ...` raised: the result noted for it (_augmented) is dropped, or
    the thread would hold it, and a graph made with create_graph, until the next such write."""
    if g is not None and getattr(hooked, "rebound", None) is g:
        hooked.rebound = hooked.result = None


def _call_post_hook(hook, x):
    """The post-accumulate hook(x). `g = x.grad; g *= 0.5` in it rebinds g, as in DeZero (the
    .grad may be another's array too), leaving x.grad as it was: warned about where the hook
    changed nothing else of x's (not its .grad, its array, or x: an optimizer step using g)."""
    hooked = _variables.hooked
    # a backward in a hook runs hooks too
    outer = getattr(hooked, "gradient", None), getattr(hooked, "stepped", None)
    grad = hooked.gradient = x._grad
    hooked.stepped = x, None  # x, and its values once the hook rebinds g (_augmented)
    data, version = (None if grad is None else grad._data), x.version
    try:
        _call_hook(hook, x, x)
    except BaseException:
        _forget_rebound(hooked, grad)
        raise
    finally:
        before = hooked.stepped[1]
        hooked.gradient, hooked.stepped = outer
    if grad is not None and getattr(hooked, "rebound", None) is grad:
        result, hooked.rebound, hooked.result = hooked.result, None, None
        if (x._grad is grad and grad._data is data and x.version == version
                # kept (in a list, its array elsewhere) or written back: used
                and not any(n > unkept for n, unkept in zip(_references(result), _UNKEPT))
                and not _same_values(result, grad)
                # x stepped with it through its array (p.data[...] -= g.data): used
                and (before is None or _same_values(x, before))):
            warnings.warn(
                f"the post-accumulate hook {_hook_name(hook)} on {_describe(x)} wrote g op= ... "
                "into its .grad and changed nothing with the result: as in DeZero, g *= 0.5 "
                "makes a new Variable, so .grad is as it was. Set it (x.grad = x.grad * 0.5) "
                "or write into the array (x.grad.data *= 0.5)", RuntimeWarning, stacklevel=2)


def _references(v):
    """How many references the Variable v and its array have, as seen from here."""
    return sys.getrefcount(v), sys.getrefcount(v._data)


def _unkept_references():
    """_references of an object held by the caller's name alone, its array by its slot alone,
    asked as _call_post_hook asks (how many a call adds differs between Python versions)."""
    class Probe:
        __slots__ = ("_data",)
    probe = Probe()
    probe._data = object()
    return _references(probe)


_UNKEPT = _unkept_references()


def _same_values(a, b):
    """Whether the Variables a and b hold equal values, NaN equal to NaN (grad.data[...] = g
    wrote the result back); False where that cannot be told."""
    try:
        x, y = a._data, b._data
        same = (x == y) | ((x != x) & (y != y))
        return tuple(a.shape) == tuple(b.shape) and bool(a.xp.all(same))
    except Exception:
        return False


def _hook_name(hook):
    """The hook's qualified name, else its repr, else its type's name (a repr may raise)."""
    try:
        return getattr(hook, "__qualname__", None) or repr(hook)
    except Exception:
        return f"of type {type(hook).__qualname__}"


def _owned(finished, shared, create_graph):
    """(x, g) pairs with each g replaced, where needed, by a copy that x.grad can own: not an array
    someone else was handed (the caller's seed, a hook's argument, a retained .grad) or that goes
    to two Variables here (add's backward hands one gradient to both inputs: each gets a copy, so
    neither depends on the other's), not x's own data, not a view or a read-only array. The sums
    the walk made and most ops' results pass as they are. On a lazy backend each g is first laid
    out as x (_laid_out_as)."""
    seen = set()
    for _, g in finished:
        if id(g._data) in seen:
            shared[id(g._data)] = g._data
        seen.add(id(g._data))
    owned = []
    for x, g in finished:
        if g._backend.lazy:  # Dask: in x's chunks (a new array then, which x.grad owns)
            g = _laid_out_as(x, g)
        data = g._data
        if id(data) in shared or data is x._data or not g._backend.owns_memory(data):
            g = copy(g) if create_graph else Variable(backends.copy(data), requires_grad=False)
        owned.append((x, g))
    return owned


def _laid_out_as(x, g):
    """g, the gradient a .grad or gradcore.grad gets for x, in x's layout on a lazy backend
    (Dask: x's chunks, which x * b with b in other chunks, or a pooling, does not keep): an
    optimizer then updates x in its own chunks, with no rechunk in every step. Gradients inside
    the walk keep the chunks Dask gives them; g itself where it is laid out so already, or x
    holds no data of g's shape (released, or replaced since forward)."""
    data, backend = x._data, g._backend
    if data is None or data.shape != g._data.shape:
        return g
    layout = backend.layout(data)
    if backend.layout(g._data) == layout:
        return g
    return LaidOut(layout)(g)  # recorded with create_graph, as the walk's other ops


def _check_versions(f):
    """RuntimeError if an input or output of f was written through gradcore after f was recorded
    (backward would compute with the new values: PyTorch's "modified by an inplace operation")."""
    for role, x in f._variables_read():
        log = getattr(x, "_writes", None)
        # Releasing data (x.data = None, its latest write) gives backward no new values: one
        # that reads them fails, and the walk says why (_explain_failed_backward). A write
        # before the release and after f ran still counts: f saw other data (another shape,
        # while x's gradient takes the shape the release noted)
        if log is not None and log.stamps and log.stamps[-1] > f.sequence and (
                x._data is not None or len(log.stamps) > 1 and log.stamps[-2] > f.sequence):
            then, exact = version_at(x, f.sequence)
            name = f._name()
            # recorded in anomaly mode: where f was called, as its other errors say
            where = f" {anomaly.where_created(f)}" if getattr(f, "_anomaly", None) else ""
            raise RuntimeError(
                f"{name}: its {role}, {_describe(x)}, was written after {name} ran in forward: it "
                f"is at version {x.version}, and {name} used version {'' if exact else '<= '}"
                f"{then}. Its gradient would be computed from the new values. A .data "
                "assignment, an optimizer step or load_state_dict between forward and backward "
                "does this (run forward again after the change, or backward before it), and so "
                "does an in-place Function (mark_dirty) given an op's output, which the Variable "
                "of that output would go on showing as the op's: write that Function's forward "
                f"to return a new array instead.{where}")


def _skip_or_check_versions(f, wanted, known, grads, captured, shared, unchecked_roots):
    """For an f recorded before some write: True if the walk skips f, else False once f is
    checked. Under gradcore.grad, an f off the paths to the wanted Variables is skipped: its
    outputs' gradients are taken out of `grads` (a wanted output's into `captured`), as running
    it would. Any other f is refused if what its backward reads was written since
    (_check_versions)."""
    if wanted is not None and not _behind(f, wanted, known):
        _output_grads(f, grads, False, wanted, captured, shared, known, unchecked_roots)
        return True
    _check_versions(f)
    return False


def _check_before_hooks(unchecked_roots, wanted, known):
    """Before the first hook a walk runs on a Variable it passes through (a leaf's run at the
    end, or where it is released early for its post-accumulate hooks): refuse now any op that the
    walk would refuse later (_check_versions; with `check_records`, anomaly mode's fingerprints
    too), so that a refused backward has called no hook. `unchecked_roots` is the walk's
    [(roots, boundary, check_records)]; emptied here, so that a walk makes this pass over the
    graph at most once, and only if it meets such a hook."""
    ys, boundary, check_records = unchecked_roots.pop()
    written = latest_write[0]
    for f in _ops_behind(ys, boundary):
        stale = f.sequence < written
        if (stale or check_records) and (wanted is None or _behind(f, wanted, known)):
            if stale:
                _check_versions(f)
            if check_records:
                anomaly.check_unchanged(f)


def _ops_behind(ys, boundary=()):
    """Each op behind `ys` once, reached through the inputs that need a gradient, not past the
    Variables in `boundary`."""
    seen = set()
    stack = [y.creator for y in ys if y.creator is not None and y not in boundary]
    while stack:
        f = stack.pop()
        if f in seen:
            continue
        seen.add(f)
        yield f
        for x, need in zip(f.inputs, f.needs_input_grad):
            if need and x.creator is not None and x not in boundary:
                stack.append(x.creator)


def _reused(f):
    return RuntimeError(f"{f._name()}: a Variable computed by this {type(f).__name__} instance "
                        f"is not among its outputs: the instance was called again after it; "
                        f"create one instance per call, {f._new_instance_spelling()}")


def _check_root(y, where):
    if not isinstance(y, Variable):
        raise TypeError(f"{where}: expected a Variable, got {type(y).__name__}")
    if y._data is None:
        raise RuntimeError(f"{where}: this Variable has no data (data is None), so there is "
                           "nothing to differentiate; give it an array first (x.data = ...)")
    if y.creator is None and not y.requires_grad:
        if dtype_kind(y._backend, y.dtype) != "float":
            raise RuntimeError(
                f"{where}: this Variable holds {y.dtype} data and has no graph: only "
                "floating-point Variables require grad, so nothing computed from integers or "
                "bools is recorded. Create the inputs from floating-point data, e.g. "
                "Variable(np.array(2.0)) rather than Variable(np.array(2))")
        raise RuntimeError(
            f"{where}: this Variable has no graph: it was computed under no_grad(), from inputs "
            "that do not require grad (integer and bool Variables never do: only floating-point "
            "ones, e.g. Variable(np.array(2.0)) and not Variable(np.array(2))), by a function "
            "that is not differentiable (F.accuracy), or returned by a gradcore.compile step "
            "(whose results hold no graph: call backward inside the step). Compute it with grad "
            "mode on and at least one floating-point input that requires grad")


def _count_error(f, gxs):
    if len(gxs) == 1 and _is_list_of_gradients(gxs[0]):
        return _list_error(f, gxs[0])
    return RuntimeError(f"{f._name()}.backward returned {len(gxs)} gradient(s) for "
                        f"{len(f.inputs)} input(s); return one per input (None for a constant)")


def _is_list_of_gradients(gx):
    """Is gx a list holding Variables or arrays, [gx0, gx1] meant as a tuple? A list of numbers
    (nested or not) is one gradient, DeZero's style, and stays accepted."""
    return gx.__class__ is list and any(
        _is_list_of_gradients(item) if item.__class__ is list
        else not isinstance(item, numbers.Number) for item in gx)


def _list_error(f, gxs):
    # a list of gradients would be taken as one gradient (an array of shape (len, ...)) or
    # counted as one: say what was meant instead
    return RuntimeError(
        f"{f._name()}.backward returned a list of {len(gxs)} Variables or arrays: return a tuple "
        f"with one gradient per input (return gx0, gx1), or the gradient itself for one input")


def _raw_gradient(f, gx, x):
    """gx, a raw gradient f's backward returned for x: an array of x's library on x's device as
    it is; a number or a list made one there; another library's array, or one on another device,
    refused (it would become x.grad as it is, a NumPy array for a CuPy parameter)."""
    backend = x._backend
    if backend.owns(gx):
        if backend.device_of(gx) == x.device:
            return gx
        where = backend.device_of(gx)
    elif isinstance(gx, (numbers.Number, list)):  # a Python or NumPy number, a nested list
        if _is_list_of_gradients(gx):
            raise _list_error(f, gx)
        return backend.asarray(gx, device=x.device)
    else:
        other = backends.backend_of(gx)
        where = type(gx).__name__ if other is None else other.device_of(gx)
    raise gradient_elsewhere(f, where, x.device)


def _conform(f, gx, x):
    """gx shaped and typed like x. A gradient of x broadcast to a larger shape (the backward of a
    broadcasting op) is summed back to x's shape, as PyTorch's engine does; any other shape is the
    op's bug: raise. The dtype becomes x's (float32 - a float64 constant gives a float64 result,
    but the float32 input still gets a float32 gradient). A gradient on another library or
    device than x is refused, as a raw array is (_raw_gradient)."""
    if x._data is None:  # released after forward (x.data = None): as it was then
        shape, dtype, backend, device = _released_as(f, x)
    else:
        shape, dtype, backend = x._data.shape, x._data.dtype, x._backend
        device = x.device if not backend.single_device else None
    if elsewhere(gx, backend, device):
        raise gradient_elsewhere(f, gx.device, device or x.device)
    target = gx._data.shape
    if dtype_kind(gx._backend, gx.dtype) == "complex":
        raise RuntimeError(f"{f._name()}.backward returned a complex gradient for a real input of "
                           f"dtype {dtype}; gradcore differentiates real numbers only")
    if target != shape:
        if len(shape) > len(target) or any(
                n != 1 and n != m for n, m in zip(reversed(shape), reversed(target))):
            index = next(i for i, y in enumerate(f.inputs) if y is x)
            raise RuntimeError(f"{f._name()}.backward returned a gradient of shape {tuple(target)} "
                               f"for its input {index}, of shape {tuple(shape)}: return one "
                               "gradient per input, shaped like that input (or of a shape it "
                               "broadcasts to, which is summed back)")
        gx = sum_to(gx, shape)
        if backend.lazy and x._data is not None:  # Dask: in x's chunks (the sum keeps gx's)
            gx = laid_out_like(gx, x)
    return astype(gx, dtype)  # gx itself when the dtypes are equal


def _released_as(f, x):
    """(shape, dtype, backend, device) of the array f's input x held before `x.data = None`."""
    was = _variables.released.get(x)
    if was is None:
        index = next(i for i, y in enumerate(f.inputs) if y is x)
        raise RuntimeError(f"{f._name()}: its input {index} has no data (data is None) at "
                           "backward, so its gradient cannot be shaped; give it its array back")
    return was


def _output_grads(f, grads, retain_grad, wanted, captured, shared, known, unchecked_roots,
                  undo=None):
    """The gradients for f's outputs, after their hooks; zeros for a dead or unused output.
    gradcore.grad (`wanted`) captures a wanted output's gradient, and runs the hooks of f's
    outputs only if f is on a path to a wanted Variable (_on_path). `undo`: see _retain."""
    gys = []
    for i, ref in enumerate(f.outputs):
        y = ref()
        g = None if y is None else grads.pop(y, None)
        if g is None:
            if f._outputs.__class__ is not tuple:  # f was reached through its one output: not y
                raise _reused(f)
            gys.append(f.zeros_for_output(i))
            continue
        if y._hooks and (wanted is None or _on_path(f, wanted, known)):
            g = _output_hooks(f, y, g, shared, unchecked_roots, wanted, known, undo)
        if retain_grad and not y.retains_grad:  # else _run_hooks has just kept it
            _retain(y, g, shared, undo)
        if wanted is not None and y in wanted:
            captured[y] = g
        gys.append(g)
    return gys


_NOTHING = frozenset()
_by_sequence = operator.attrgetter("sequence")
_creator = operator.attrgetter("creator")


def _behind(f, wanted, known):
    """True if one of the Variables gradcore.grad wants lies behind f (through inputs that need a
    gradient). `known`: Function -> that answer, for every Function looked at in this walk, so
    each is looked at once; no recursion.

    Only the Functions behind which a wanted Variable lies are differentiated, as in PyTorch; but
    asking for every Function is a pass over the graph that costs hod (gradcore.grad with
    create_graph, every Function on the path) ~15% more instructions (callgrind). So the walk
    asks only where running an f off the paths could be seen: f would refuse a write made since
    it was recorded, an output of f has hooks, anomaly mode checks f, f's backward raised (the
    walk goes on without it if it is off the paths). Elsewhere such an f may still run: what it
    hands on reaches no wanted Variable, and a leaf that is not wanted gets neither a gradient
    nor a hook call (_finish)."""
    if f in known:
        return known[f]
    found, stack = [], [f]
    while stack:
        g = stack.pop()
        if g in known:
            continue
        known[g] = False  # decided below, after what lies behind it
        found.append(g)
        for x, need in zip(g.inputs, g.needs_input_grad):
            # nothing behind a wanted x changes g's answer (and the walk stops at a boundary)
            if need and x.creator is not None and x not in wanted:
                stack.append(x.creator)
    found.sort(key=_by_sequence)  # creation order: the Functions behind g come before g
    for g in found:
        for x, need in zip(g.inputs, g.needs_input_grad):
            if need and (x in wanted or x.creator is not None and known[x.creator]):
                known[g] = True
                break
    return known[f]


def _on_path(f, wanted, known):
    """True if gradcore.grad differentiates through f: f computed a wanted Variable, or one lies
    behind f (_behind). Decided per Function, as PyTorch's engine decides per node, so the hooks
    of all f's outputs run or none do: a hook on b runs when a, b = split(x) and a is wanted."""
    for ref in f.outputs:
        y = ref()
        if y is not None and y in wanted:
            return True
    return _behind(f, wanted, known)


def _lowest_computed(inputs):
    """The inputs computed by an op at the lowest generation among the inputs. No other input
    can lie behind them (it would have a lower generation): gradcore.grad stops there."""
    lowest = min([x.generation for x in inputs])
    return {x for x in inputs if x.creator is not None and x.generation == lowest}


def _walk(ys, seeds, retain_grad, create_graph, wanted=None, boundary=_NOTHING,
          boundary_hooks=True, undo=None):
    """Propagate `seeds` back from `ys`. With `wanted` (a set of Variables), return their gradients
    in a dict and leave the leaves' `.grad` alone (retain_grad() still stores); without,
    accumulate into the leaves' `.grad`. The Variables in `boundary` (wanted ones) are treated as
    leaves: nothing behind them is visited; without `boundary_hooks`, their hooks are left to the
    walk that goes on from them. `undo`: in anomaly mode, an _Undo: the walk checks its
    gradients and notes there each .grad it sets, which the caller puts back if the walk raises."""
    # Variables hash by identity: grads maps each to its gradient so far (out of place: g = g + gx)
    grads = {}
    # arrays someone outside the walk holds (seeds, hooks' arguments, retained gradients), by id:
    # a leaf's .grad gets a copy of such an array, never the array itself. The arrays are kept
    # till the walk ends so that no new array takes a dead one's id (a sum looked shared: an
    # extra copy, and with create_graph another order of adding, varying with memory layout)
    shared = {}
    leaves = []   # leaf Variables that received a gradient, each once
    captured = {}
    # (-generation, -sequence, f): highest generation first, the newest op first within one;
    # the pair is unique, so f is never compared
    heap = []
    pushed = set()
    # x -> the sum the walk made for x's gradient: it is x's alone until x's creator takes it
    # (then a backward may hand it on, say to both inputs of an add), so later gradients of x
    # may be added into it in place
    sums = {}
    known = None if wanted is None else {}  # see _behind

    for y, g in zip(ys, seeds):
        shared[id(g._data)] = g._data
        if y in grads:  # an output listed twice: its seeds' sum, recorded as the walk records
            with using_config("enable_backprop", create_graph):
                g = grads[y] + g
        grads[y] = g
        f = y.creator
        if f is None or boundary and y in boundary:
            leaves.append(y)
        elif f not in pushed:
            pushed.add(f)
            heappush(heap, (-f.generation, -f.sequence, f))

    # hooked leaf -> how many ops still to run will hand it a gradient; at 0 its .grad is final.
    # Hooks run and gradients are retained during the walk: with either, every op is checked for
    # writes before any runs, so that a refused graph changes nothing. Post-accumulate hooks and
    # retain_grad: _pending checks them first; hooks on the Variables the walk passes through:
    # _check_before_hooks, when the first of them is about to run (a walk with none pays nothing)
    check_anomalies = undo is not None
    # ops recorded in anomaly mode have their fingerprints checked in any mode
    check_records = check_anomalies or bool(anomaly.recorded)
    hooked = hooked_leaves and wanted is None
    pending = _pending(ys, hooked, check_records) if hooked or retain_grad else None
    # the "checked yet?" flag of _check_before_hooks: [(ys, boundary, check_records)] until the
    # ops behind ys are checked for writes; a list, so that its emptying there is seen by every
    # helper handed it. Empty, or None (_pending has checked them): nothing left to check
    unchecked_roots = [(ys, boundary, check_records)] if pending is None else None
    ref = weakref.ref
    # no gradient kept but the leaves', no anomaly checks: the short path below may run
    leaves_only = not retain_grad and wanted is None and not check_records
    written = latest_write
    next_op = None  # the Function to run next without the heap (see _schedule)
    with using_config("enable_backprop", create_graph):
        while next_op is not None or heap:
            if next_op is not None:
                f, next_op = next_op, None
            else:
                f = heappop(heap)[2]
            out = f._outputs  # one output: its weak reference; several: a tuple of them
            backend = f.backend
            array_type = backend.array_type
            if leaves_only and out.__class__ is ref and not backend.needs_device_context:
                y = out()  # the common case, kept short
                # was something written since f was recorded? y._sequence is f.sequence, read
                # from a Variable: the same read on Functions of many types costs ~250
                # instructions more per op (CPython specialises an attribute read per type)
                if y._sequence < written[0]:
                    _check_versions(f)
                try:
                    gy = grads.pop(y)
                except KeyError:  # f's output now is another Variable than the one reaching f
                    raise _reused(f) from None
                if y._hooks:
                    gy = _output_hooks(f, y, gy, shared, unchecked_roots)
                gxs = f.backward(gy)
            else:
                if f.sequence < written[0] and _skip_or_check_versions(
                        f, wanted, known, grads, captured, shared, unchecked_roots):
                    continue
                gys = _output_grads(f, grads, retain_grad, wanted, captured, shared, known,
                                    unchecked_roots, undo)
                if check_records:
                    if wanted is not None and not _behind(f, wanted, known):
                        continue  # off the paths: neither checked nor run
                    anomaly.check_unchanged(f)  # nothing for an op recorded outside the mode
                try:
                    if backend.needs_device_context:
                        with backend.device_context(f.device):
                            gxs = f.backward(*gys)
                    elif check_anomalies:
                        # check_finite reports a NaN or infinity naming the op: NumPy's own
                        # warning of it, naming a line of gradcore, would only come first
                        with backend.arithmetic_warnings_off():
                            gxs = f.backward(*gys)
                    else:  # the flag spares NumPy a no-op context (callgrind: hod 7% fewer)
                        gxs = f.backward(*gys)
                except Exception:
                    # gradcore.grad needs no f off the paths to its inputs (see _behind): its
                    # error (a backward that is not differentiable again) cannot matter
                    if wanted is not None and not _behind(f, wanted, known):
                        continue
                    raise
                if check_anomalies:  # anomaly mode always takes this branch
                    if _is_list_of_gradients(gxs):  # refused before check_finite reads it
                        raise _list_error(f, gxs)
                    anomaly.check_finite(f, gxs if gxs.__class__ is tuple else (gxs,))
            if gxs.__class__ is not tuple:
                gxs = (gxs,)
            inputs = f.inputs
            if len(gxs) != len(inputs):
                raise _count_error(f, gxs)

            for x, gx, need in zip(inputs, gxs, f.needs_input_grad):
                if gx is None or not need:
                    continue
                if gx.__class__ is not Variable and not isinstance(gx, Variable):
                    # a raw array (DeZero's style), perhaps one f keeps (a gradient computed in
                    # forward): as shared, a leaf's .grad gets a copy of it (_owned)
                    gx = Variable(_raw_gradient(f, gx, x), requires_grad=False)
                    shared[id(gx._data)] = gx._data
                # gx needs _conform unless it is shaped and typed like x already. A NumPy scalar
                # of the same class as x's data is: shape and dtype are slow to read on scalars
                # (callgrind: chain 4.6% fewer instructions per op, wide 0.7% more per branch).
                # Otherwise compare shape and dtype (`is not`: NumPy's and CuPy's built-in dtypes
                # are singletons; _conform compares). An x whose data was released (x.data = None)
                # always goes to _conform, which knows its shape
                data, x_data = gx._data, x._data
                data_class = data.__class__
                same_scalar_class = (data_class is not array_type and data_class is x_data.__class__
                                     and data_class in _NUMPY_SCALARS)
                if not same_scalar_class and (x_data is None or data.shape != x_data.shape
                                              or data.dtype is not x_data.dtype):
                    conformed = _conform(f, gx, x)
                    if check_anomalies:  # a cast to x's dtype or a sum can overflow
                        anomaly.check_conformed(f, x, gx, conformed)
                    gx = conformed
                previous = grads.get(x)
                if previous is not None:  # x was reached before: its creator is queued already
                    _accumulate(grads, sums, x, previous, gx, create_graph)
                    if check_anomalies:  # two finite gradients can sum to infinity
                        anomaly.check_sum(f, x, grads[x])
                    continue
                grads[x] = gx
                creator = x.creator
                if creator is None or boundary and x in boundary:
                    leaves.append(x)
                    continue
                if creator._outputs.__class__ is not ref:  # several outputs reach it
                    if creator in pushed:
                        continue
                    pushed.add(creator)
                # _schedule's first cases in line: a chain, or the spine of a wide graph
                if next_op is None and (not heap or creator.generation > -heap[0][0]):
                    next_op = creator
                else:
                    next_op = _schedule(heap, next_op, creator)
            if pending:
                _release(f, gxs, pending, grads, shared, create_graph, undo)

        return _finish(leaves, grads, wanted, captured, shared, create_graph,
                       _NOTHING if boundary_hooks else boundary, undo)


def _accumulate(grads, sums, x, previous, gx, create_graph):
    """Add gx to `previous`, x's gradient so far. Invariant: sums[x] is `previous` only while the
    walk made that sum for x and no backward has seen it yet (x's creator has not run), so it may
    take more in place; any other gradient may be someone else's and is added out of place."""
    if create_graph or not x._backend.plain:
        grads[x] = previous + gx  # recorded; CuPy adds under the device context
    elif sums.get(x) is previous:
        previous._data += gx._data  # (a NumPy scalar gives a new one: kept too)
    else:  # nothing to record: the arrays' sum, with no Function around it
        total = previous._data + gx._data
        grads[x] = sums[x] = _init_slots(_new_variable(Variable), total, x._backend)


def _schedule(heap, next_op, creator):
    """Queue `creator`, whose output has just received its first gradient; return the Function
    to run next without going through the heap, or None.

    Invariant: the heap pops the highest (generation, sequence), and whatever can still add to a
    Function's outputs has a higher generation, or the same and began later, so a popped
    Function's gradients are complete. `next_op` is a Function for which that holds already:
    nothing queued can still add to its outputs (a chain, the spine or a branch of a wide graph).
    """
    if next_op is None:
        if not heap:
            return creator
        # creator runs next if it outranks the heap's top, and also if that top is one generation
        # above it but began before it: whatever adds to creator's outputs has a higher
        # generation and a later sequence, and the top has the highest generation queued and, of
        # those, the latest sequence. Compared as numbers, with no key built: wide's branches
        # take this test twice each (callgrind: 1.7% fewer instructions per branch)
        top_generation, top_sequence = -heap[0][0], -heap[0][1]
        if creator.generation > top_generation or (
                creator.generation >= top_generation - 1 and creator.sequence > top_sequence):
            return creator
        key = (-creator.generation, -creator.sequence, creator)
    else:  # two are done: the higher ranked runs next, the other waits in the heap
        key = (-creator.generation, -creator.sequence, creator)
        other = (-next_op.generation, -next_op.sequence, next_op)
        if key < other:
            next_op, key = creator, other
    heappush(heap, key)
    return next_op


def _pending(ys, hooked, check_records):
    """With `hooked`, for each leaf with post-accumulate hooks behind `ys`: how many of the ops
    behind `ys` take it as an input that needs a gradient. One pass over the graph, which also
    refuses it if an op's input was written after the op ran (_check_versions; with
    `check_records`, anomaly mode's fingerprints too)."""
    pending = {}
    written = latest_write[0]
    for f in _ops_behind(ys):
        if f.sequence < written:
            _check_versions(f)
        if check_records:
            anomaly.check_unchanged(f)
        if hooked:
            for x, need in zip(f.inputs, f.needs_input_grad):
                if need and x.creator is None and hasattr(x, "_post_hooks"):
                    pending[x] = pending.get(x, 0) + 1
    return pending


def _mark_handed_twice(gxs, shared):
    """Mark as shared an array a backward handed to two inputs (add's): a leaf whose .grad is
    set before the walk ends (for its post-accumulate hooks) then gets a copy, so a hook writing
    into it cannot reach the other input's gradient, wherever that one goes on to."""
    seen = set()
    for gx in gxs:
        data = getattr(gx, "_data", gx)
        if gx is not None and id(data) in seen:
            shared[id(data)] = data
        seen.add(id(data))


def _release(f, gxs, pending, grads, shared, create_graph, undo):
    """f has run, handing on `gxs`: a hooked leaf that no op still to run can add to gets its
    .grad now, then its post-accumulate hooks run (while the walk goes on with the rest of the
    graph)."""
    if len(gxs) > 1:
        _mark_handed_twice(gxs, shared)
    for x, need in zip(f.inputs, f.needs_input_grad):
        if not need or x not in pending:
            continue
        pending[x] -= 1
        if pending[x]:
            continue
        del pending[x]
        g = grads.pop(x, None)
        if g is None:  # every op gave it None: nothing was added, no hook runs
            continue
        _add_to_grads([(x, _run_hooks(x, g, shared, undo) if x._hooks else g)], shared,
                      create_graph, undo)


def _finish(leaves, grads, wanted, captured, shared, create_graph, silent, undo):
    """The leaves' gradients, after their hooks (but those of the Variables in `silent`):
    returned (with `wanted`: those and the captured ones) or added into `.grad`, each owning its
    array."""
    finished = []
    for x in leaves:
        g = grads.pop(x, None)
        if g is None:  # listed twice: its gradient is applied already
            continue
        if wanted is None:
            finished.append((x, _run_hooks(x, g, shared, undo) if x._hooks else g))
        elif x in wanted and x._requires_grad:  # the others: no gradient, no hook call
            captured[x] = _run_hooks(x, g, shared, undo) if x._hooks and x not in silent else g
    if grads:  # a gradient reached a Variable whose creator did not count it as an output
        raise _reused(next(iter(grads)).creator)
    if wanted is not None:
        return dict(_owned(captured.items(), shared, create_graph))
    _add_to_grads(finished, shared, create_graph, undo)
    return captured


def _add_to_grads(finished, shared, create_graph, undo):
    """Add each (x, g)'s g to x.grad, each owning its array; then the post-accumulate hooks of
    those x that have some (a leaf the walk did not release earlier, such as a root). A leaf
    whose requires_grad was turned off after forward gets nothing added, as in PyTorch, whose
    engine still calls its post-accumulate hooks (on .grad as it was). In anomaly mode (`undo`,
    the walk's _Undo) a sum with an old .grad holding NaN or infinity is refused, before any
    .grad is set, and what is set and the hooks that run are noted; and a walk that sets a .grad
    another anomaly-mode walk is running hooks on tells it (_Undo.disturb)."""
    adding = [(x, g) for x, g in finished if x._requires_grad]
    for x, _ in adding:
        if x._grad is not None:  # accumulating over backward calls: nothing to check otherwise
            _check_grad_fits(x)
    recorder = _variables.step_recorder
    if recorder is not None:
        # a step being recorded: a leaf an optimizer step in a hook released (gradcore.compile's
        # opaque lines) is the tape's again, so that its new grad is stored as it was set
        recorder.adopt_inputs([x for x, _ in adding])
    with _accumulating:  # the sums only: nothing here calls back into user code
        totals = [(x, g if x._grad is None else _grad_plus(x._grad, g))
                  for x, g in _owned(adding, shared, create_graph)]
        if undo is None:
            for x, total in totals:
                x._grad = total
        else:  # all checked before any is set: a refused sum changes nothing
            _check_grad_sums(totals)
            undo.add(totals)
        if _watched:  # the hooks of an anomaly-mode walk are running (one truth test otherwise)
            _Undo.disturb(totals, undo)
    if hooked_leaves:
        for x, _ in finished:
            for hook in list(getattr(x, "_post_hooks", ())):
                if undo is not None:
                    undo.hooks_run += 1
                    was_finite = x._grad is None or anomaly.is_finite(x._grad._data)
                _call_post_hook(hook, x)
                if undo is not None:  # the .grad the hook left (one that doubles it, say)
                    undo.hook_ran(x)
                    _check_post_hook(hook, x, was_finite)
    if undo is not None:
        undo.unwatch(totals)


# Anomaly mode: leaf -> the _Undo of each walk that set its .grad and is running the
# post-accumulate hooks after that (threads; a backward in a hook). Another walk that sets the
# .grad meanwhile marks it its own (_Undo.disturb), so that the hooks' walk does not take the sum
# for its own and erase it at put_back. Changed under _accumulating; empty but while such
# walks run their hooks
_watched = {}
# in a fork's child the other threads' walks never end: their entries would stay for good
os.register_at_fork(after_in_child=_watched.clear)
# the "after" of a .grad another walk set while this walk's hooks ran: never a .grad
_DISTURBED = object()


class _Undo:
    """Anomaly mode: the .grads a walk sets (retained gradients and leaves released for their
    post-accumulate hooks during it; the other leaves' at its end), so that a refused walk puts
    each back. `changed`: Variable -> [its _grad and _retained_grad before the walk, the _grad
    the walk (or a hook the walk ran on it) left, or _DISTURBED]; `hooks_run`: hook calls made
    (gradient hooks and post-accumulate hooks: what they did is not undone)."""

    __slots__ = ("changed", "hooks_run")

    def __init__(self):
        self.changed = {}
        self.hooks_run = 0

    def keep(self, x):
        """Before the walk first sets x.grad: note it as it is."""
        if x not in self.changed:
            self.changed[x] = [x._grad, getattr(x, "_retained_grad", None), None]

    def set(self, x):
        """After the walk set x.grad (a retained gradient, under _accumulating): note it."""
        self.changed[x][2] = x._grad

    def add(self, totals):
        """Under _accumulating: x.grad = total for each (x, total), noted as it was and as set,
        and watched (see _watched) till unwatch: the hooks the walk runs next may change it."""
        for x, total in totals:
            self.keep(x)
            self.changed[x][2] = x._grad = total
            _watched.setdefault(x, []).append(self)

    def hook_ran(self, x):
        """After a post-accumulate hook the walk ran on x: the .grad it left is the walk's (one
        that doubles it, say), unless another walk set x.grad meanwhile (or this walk set none:
        x does not require grad)."""
        with _accumulating:
            entry = self.changed.get(x)
            if entry is not None and entry[2] is not _DISTURBED:
                entry[2] = x._grad

    def unwatch(self, xs):
        """x.grad for each (x, _) in `xs` no longer watched by this walk."""
        with _accumulating:
            self._unwatch(x for x, _ in xs)

    def _unwatch(self, xs):
        for x in xs:
            walks = _watched.get(x)
            if walks is not None and self in walks:
                walks.remove(self)
                if not walks:
                    del _watched[x]

    @staticmethod
    def disturb(totals, undo):
        """Under _accumulating, a walk (its _Undo `undo`, or None) has set x.grad for each (x, _)
        in `totals`: each other walk watching one takes it as changed since by another."""
        for x, _ in totals:
            for walk in _watched.get(x, ()):
                if walk is not undo:
                    walk.changed[x][2] = _DISTURBED

    def put_back(self):
        """The walk raised: each noted .grad (the object itself) as before the walk, unless
        another thread, another walk or a hook changed it since (putting it back would lose
        that). Returns what it did, for the error's note."""
        left = 0
        with _accumulating:
            self._unwatch(self.changed)  # a hook raised, or an interrupt, while watched
            for x, (grad, retained, after) in self.changed.items():
                if x._grad is after:
                    x._grad, x._retained_grad = grad, retained
                else:
                    left += 1
        message = ("anomaly mode: every .grad this backward set was put back" if not left else
                   f"anomaly mode: every .grad this backward set was put back but {left}, "
                   "changed since by a hook or another thread")
        if self.hooks_run:
            calls = f"{self.hooks_run} call{'s' if self.hooks_run > 1 else ''}"
            message += f"; what the hooks that ran ({calls}) did is not undone"
        return message


def _check_grad_sums(totals):
    """Anomaly mode, before the leaves' .grad are set: _check_grad_sum for each (x, the sum of
    x.grad and this backward's gradient) in `totals` whose x has a .grad."""
    for x, total in totals:
        if x._grad is not None:
            _check_grad_sum(x, total)


def _check_grad_sum(x, total):
    """Anomaly mode, before x.grad is set to `total`, its .grad from earlier backward calls plus
    this backward's gradient (of a leaf, or of a computed x that retains its gradient):
    RuntimeError if that holds NaN or infinity (two finite terms can overflow)."""
    if anomaly.is_finite(total._data):
        return
    what, hint = "", "x.cleargrad() (a model's cleargrads())"
    if x.creator is not None:  # a model's cleargrads() clears only the leaves
        what = f", computed by {x.creator._name()} and retaining its gradient,"
        hint = "cleargrad() on it"
    if not anomaly.is_finite(x._grad._data):  # from a backward outside anomaly mode
        raise RuntimeError(
            f"anomaly: backward: {_describe(x)}{what} has a .grad from earlier backward calls "
            f"that already holds NaN or infinity, and this backward would add to it. Call {hint} "
            "before this backward, and look for where the earlier one went wrong")
    raise RuntimeError(
        f"anomaly: backward: {_describe(x)}{what} has a .grad from earlier backward calls, and "
        f"adding this backward's gradient to it gives NaN or infinity: it overflows "
        f"{x._grad.dtype}. Call {hint} between backward calls, or scale the values down")


def _check_grad_fits(x):
    """RuntimeError if x.grad, from an earlier backward, is not shaped and typed like x's data:
    x.data was given another shape or dtype since, and adding to it would broadcast the old
    gradient over the new data (or keep its old dtype)."""
    old, data = x._grad._data, x._data
    if data is None:  # released (x.data = None): no shape to hold the old gradient against
        return
    # dtypes of two libraries never compare equal (a step being recorded wraps the arrays):
    # there the sum's own op says what is wrong
    same_library = x._grad._backend is x._backend
    if old.shape == data.shape and (not same_library or old.dtype == data.dtype):
        return
    problem = (f"shape {tuple(old.shape)}" if old.shape != data.shape else
               f"dtype {old.dtype}")
    raise RuntimeError(
        f"backward: {_describe(x)} has a .grad of {problem}, left from an earlier backward: "
        "its data was replaced since, and the old gradient cannot be added to the new one. Call "
        "x.cleargrad() (a model's cleargrads()) after giving a Variable data of another shape "
        "or dtype, or convert x.grad with it")


def _failed_backward(error):
    """The op whose backward raised `error` in the walk (a user's, that raised from an inner op
    naming only that one), else None. Read from the traceback once the walk has failed, so that
    the walk itself pays nothing for it."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code is not _walk.__code__:
        tb = tb.tb_next
    if tb is None or tb.tb_next is None:
        return None  # not from the walk, or raised by the walk itself (its messages name the op)
    f = tb.tb_frame.f_locals.get("f")  # the op the walk was running
    # the frame the walk called is f's backward (or the wrapper of one) if its self is f; a
    # hook's, a helper's of the walk, an anomaly check's is not
    if f is None or tb.tb_next.tb_frame.f_locals.get("self") is not f:
        return None
    return f


def _explain_failed_backward(error, undone=None):
    """Note on `error`, from a walk, the op whose backward raised it and where that op was
    called (the caller raises it again); raise a RuntimeError instead (from `error`) if that op
    reads a Variable whose data was released after forward (`t.data = None`), the likely
    cause. Then `undone` (anomaly mode: what _Undo.put_back did) as a note on either. An
    interrupt (KeyboardInterrupt: no Exception) is only noted: it goes on as it is."""
    f = _failed_backward(error)
    if f is not None:
        for role, x in f._variables_read() if isinstance(error, Exception) else ():
            if x._data is None:
                name = f._name()
                released = RuntimeError(
                    f"{name}.backward failed ({type(error).__name__}: {error}), and its {role} "
                    f"is {_describe(x)} after {name} ran in forward: a backward that reads it "
                    "cannot run. Release (x.data = None) only Variables whose ops' backward "
                    "reads neither its inputs nor its outputs (add's: t = matmul(x, W); "
                    "y = t + b; t.data = None), or release after backward")
                if undone is not None:
                    add_note(released, undone)
                raise released from error
        # once: a nested walk (checkpoint) may have noted it
        add_note(error, f"raised in {f._name()}.backward ({type(f).__qualname__}); "
                        f"{anomaly.where_created(f)}")
    if undone is not None:
        add_note(error, undone)


class _Transforms(threading.local):
    """Per thread, `stack`: the Variables of each gradcore.func transform evaluating its f now,
    outermost first (gradcore.func pushes and pops them; empty outside a transform). Set in
    __init__, which runs in each thread: reading an attribute a thread lacks would cost ~0.7 us
    at each backward and each call of a compiled function."""

    def __init__(self):
        self.stack = []


transforms = _Transforms()


def backward(y, grad=None, retain_grad=False, create_graph=False):
    """Backpropagate from `y`, accumulating into `.grad` of the leaves (see Variable.backward)."""
    if transforms.stack:  # one attribute read: nothing measurable outside a transform
        raise RuntimeError(
            "backward: called inside a function that a gradcore.func transform (grad, vjp, "
            "jvp, jacobian, hessian, ...) differentiates; it would write the .grad of the "
            "parameters and Variables f reads, which the transform leaves alone. Inside f, use "
            "gradcore.grad(y, inputs) for gradients; or call backward outside the transform")
    _check_root(y, "backward")
    given = None
    if grad is None and y.creator is not None and y._grad is not None and (
            y._grad is not getattr(y, "_retained_grad", None)):
        # a .grad set by hand on a computed y is the seed, taken off y as DeZero clears it
        given = grad = y.grad
    seed = _seed(y, grad, create_graph)
    if given is not None:
        y.cleargrad()
    undo = _Undo() if is_anomaly_enabled() else None
    try:
        if undo is not None and grad is not None:  # ones need no check
            anomaly.check_seed(seed, None if given is not None else grad)
        _walk([y], [seed], retain_grad, create_graph, undo=undo)
    except BaseException as error:
        # anomaly mode: a refused backward changes no .grad; nor one stopped by an interrupt
        # (Ctrl-C) or by an error of its own
        undone = None if undo is None else undo.put_back()
        if given is not None:  # y as it was: its seed, not what retain_grad kept of it
            y._grad, y._retained_grad = given, None
        _explain_failed_backward(error, undone)
        raise


def grad_within(outputs, inputs, grad_outputs, create_graph):
    """gradcore.grad (allow_unused) that visits nothing behind `inputs`: the gradients that reach
    them from `outputs` directly, for a node that differentiates its own recomputed block
    (gradcore.checkpoint) while the walk around it goes on from its inputs. The inputs' hooks do
    not run here: that walk runs them, once, on the whole gradient it gathers for each input."""
    return _grad(outputs, inputs, grad_outputs, create_graph, True, set(inputs), False)


def grad(outputs, inputs, grad_outputs=None, create_graph=False, allow_unused=False,
         retain_graph=None):
    """The gradients of `outputs` with respect to `inputs`, leaving the leaves' `.grad`
    untouched; as with PyTorch's autograd.grad, a Variable on the way that called retain_grad()
    still gets its gradient added to its `.grad`.

    `outputs` and `inputs` are Variables or sequences of them; `grad_outputs` the seeds (default:
    ones). Returns a tuple, one gradient per input, each owning its array; an input the outputs
    do not depend on raises unless `allow_unused=True`, which gives None for it. `retain_graph`
    is accepted for PyTorch code and changes nothing (backward never frees the graph).
    """
    return _grad(outputs, inputs, grad_outputs, create_graph, allow_unused, _NOTHING)


def _grad(outputs, inputs, grad_outputs, create_graph, allow_unused, boundary,
          boundary_hooks=True):
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif not isinstance(grad_outputs, (list, tuple)):
        grad_outputs = [grad_outputs]
    if len(grad_outputs) != len(outputs):
        raise ValueError(f"grad: {len(grad_outputs)} grad_outputs for {len(outputs)} outputs")
    for y in outputs:
        _check_root(y, "grad")
    for x in inputs:
        if not isinstance(x, Variable):
            raise TypeError(f"grad: inputs must be Variables, got {type(x).__name__}")
    seeds = [_seed(y, g, create_graph, i)
             for i, (y, g) in enumerate(zip(outputs, grad_outputs))]
    if not boundary and any(map(_creator, inputs)):  # C loops: hod's one leaf pays ~nothing
        boundary = _lowest_computed(inputs)
    undo = _Undo() if is_anomaly_enabled() else None
    try:
        if undo is not None:
            for i, (seed, given) in enumerate(zip(seeds, grad_outputs)):
                if given is not None:  # ones need no check
                    anomaly.check_seed(seed, given, i)
        captured = _walk(outputs, seeds, False, create_graph, set(inputs), boundary,
                         boundary_hooks, undo)
    except BaseException as error:  # an interrupt (Ctrl-C) too
        # anomaly mode: retained gradients as they were
        undone = None if undo is None else undo.put_back()
        _explain_failed_backward(error, undone)
        raise
    result = []
    for i, x in enumerate(inputs):
        g = captured.get(x)
        if g is None and not allow_unused:
            if not x.requires_grad:
                raise RuntimeError(
                    f"grad: input {i}, {_describe(x)}, does not require grad (requires_grad "
                    "is False), so it has no gradient; set requires_grad=True before computing "
                    "the outputs, or pass allow_unused=True to get None for it")
            raise RuntimeError(
                f"grad: input {i} was not used to compute the outputs; pass allow_unused=True "
                "to get None for it")
        result.append(g)
    return tuple(result)
