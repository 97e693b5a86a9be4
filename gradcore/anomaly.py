"""Anomaly mode: what a Function records at forward while it is on, and what backward checks.

A backward that raises in anomaly mode (a check here refused it, say, or Ctrl-C) leaves every .grad
as it was before it: the leaves', and also those the walk set before it ended, retained gradients
and leaves released early for their post-accumulate hooks (each .grad object itself put back, and
the error says so; one that another backward added to since, another thread's or one a hook ran,
or that another Variable's hook changed, stays, and the error counts it: putting it back would
lose that; a leaf's own hooks changing its .grad is the walk's change). What hooks that already
ran did is not undone (an optimizer step in a post-accumulate hook, a .grad a gradient hook set):
the error says how many hook calls ran. Off, the mode costs the walk nothing."""
import hashlib
import os
import traceback
import weakref

import numpy

import backends

from .variable import Variable, note_write

_HERE = (os.path.join("gradcore", "function.py"), os.path.join("gradcore", "anomaly.py"))

# The Functions recorded in anomaly mode, held weakly: backward checks their fingerprints
# whatever the mode it runs in (a forward inside detect_anomaly(), its backward after it). While
# none lives, a walk pays one truth test for it
recorded = weakref.WeakSet()


class _Record:
    """Where a Function was called, and fingerprints of the arrays its backward reads."""

    __slots__ = ("stack", "fingerprints")

    def __init__(self, stack, fingerprints):
        self.stack = stack
        self.fingerprints = fingerprints


def record(f):
    """At forward, in anomaly mode: keep the call's stack and fingerprint what f's backward reads."""
    stack = traceback.extract_stack()
    while stack and stack[-1].filename.endswith(_HERE):  # __call__ and this function
        stack.pop()
    f._anomaly = _Record(stack, [(what, _fingerprint(a)) for what, a in _read_by_backward(f)])
    recorded.add(f)


def _read_by_backward(f):
    """(description, array) for each array f's backward may read: inputs, outputs, saved values
    (a saved Variable among the inputs and outputs: _variables_read)."""
    for role, x in f._variables_read():
        if x._data is not None:  # released since (x.data = None): reading it fails anyway
            yield role, x._data
    for i, v in enumerate(f._saved):
        if backends.backend_of(v) is not None and not isinstance(v, numpy.generic):
            yield f"saved value {i}", v


def _fingerprint(array):
    host = numpy.ascontiguousarray(backends.backend_of(array).to_numpy(array))
    return host.shape, host.dtype.str, hashlib.blake2b(host.view(numpy.uint8), digest_size=16).digest()


def where_created(f):
    """The stack of f's forward call as text, or how to get it."""
    record = getattr(f, "_anomaly", None)
    if record is None:
        return (f"(run the forward pass inside gradcore.detect_anomaly() as well to see where "
                f"{f._name()} was called)")
    return f"{f._name()} was called at:\n" + "".join(traceback.format_list(record.stack))


def check_unchanged(f):
    """Before f's backward: RuntimeError if an array it reads changed since forward."""
    record = getattr(f, "_anomaly", None)
    if record is None:
        return
    now = dict((what, _fingerprint(a)) for what, a in _read_by_backward(f))
    for what, fingerprint in record.fingerprints:
        if what in now and now[what] != fingerprint:
            raise RuntimeError(
                f"anomaly: {f._name()}: its {what} changed after {f._name()} ran in forward, so "
                f"its gradient would be computed from other values (a direct write such as "
                f"x.data[...] = 0, which the version counter cannot see). Write into a copy "
                f"instead, or run forward again after the change. {where_created(f)}")


def before_forward(inputs):
    """Before the forward of an author's Function: (index, Variable, version, fingerprint) of
    each input Variable, for check_forward_writes."""
    return [(i, x, x.version, _fingerprint(x._data)) for i, x in enumerate(inputs)
            if isinstance(x, Variable) and x._data is not None]


def check_forward_writes(f, before):
    """After it: RuntimeError if forward wrote into an input without mark_dirty (counted first,
    so that the graphs that saved the input refuse to run, whatever the caller does next)."""
    for i, x, version, fingerprint in before:
        if x.version == version and _fingerprint(x._data) != fingerprint:
            note_write(x)
            raise RuntimeError(
                f"anomaly: {f._name()}: forward wrote into its input {i} without saying so: an "
                f"op that saved it would compute its gradient from the new values. Call "
                f"self.mark_dirty(x) in forward for each input array x it writes into, or write "
                f"into a copy (x = x.copy())")


def check_finite(f, gxs):
    """After f's backward: RuntimeError if a gradient it returned holds NaN or infinity."""
    for i, gx in enumerate(gxs):
        if gx is not None and not is_finite(gx._data if isinstance(gx, Variable) else gx):
            raise RuntimeError(
                f"anomaly: {f._name()}.backward returned a gradient holding NaN or infinity for "
                f"input {i}. {where_created(f)}")


def check_conformed(f, x, gx, conformed):
    """After the walk shaped and typed gx, what f's backward returned for its input x, like x:
    RuntimeError if that made NaN or infinity (a sum over broadcast axes, a cast to float32)."""
    if is_finite(conformed._data):
        return
    how = []
    if gx._data.shape != conformed._data.shape:
        how.append("summed over the axes it was broadcast along")
    if gx._data.dtype != conformed._data.dtype:
        how.append(f"cast to the input's dtype {conformed.dtype}")
    raise RuntimeError(
        f"anomaly: {f._name()}.backward returned a finite gradient for input {_index(f, x)}, "
        f"which holds NaN or infinity once {' and '.join(how)}: it overflows {conformed.dtype}. "
        f"Scale the values down (the loss, say) or compute in a wider dtype. {where_created(f)}")


def check_sum(f, x, total):
    """After the walk added the gradient f's backward returned for x to the one x had from other
    ops: RuntimeError if the sum holds NaN or infinity (two finite terms can overflow)."""
    if not is_finite(total._data):
        raise RuntimeError(
            f"anomaly: {f._name()}.backward returned a finite gradient for input {_index(f, x)}, "
            f"but its sum with the gradient that input got from other ops holds NaN or "
            f"infinity: it overflows {total.dtype}. Scale the values down (the loss, say) or "
            f"compute in a wider dtype. {where_created(f)}")


def check_seed(seed, given, index=None):
    """Before the walk: RuntimeError if `seed`, the seed gradient as the walk takes it from
    `given` (what the caller passed: grad, grad_outputs[index], or a .grad set by hand on the
    output), holds NaN or infinity. The first op's backward would hand it on and be blamed."""
    if is_finite(seed._data):
        return
    if index is not None:
        what = f"grad: the seed passed as grad_outputs[{index}], for output {index},"
    elif given is None:  # backward() took the .grad set by hand on the output as its seed
        what = "backward: the seed, the .grad set by hand on the output (y.grad = v),"
    else:
        what = "backward: the seed passed as grad"
    given_data = given._data if isinstance(given, Variable) else given
    if given is not None and is_finite(given_data):  # finite as given: the cast overflowed
        raise RuntimeError(
            f"anomaly: {what} holds {nonfinite(seed._data)} once cast to the output's dtype "
            f"{seed.dtype}: it is finite as given, but overflows {seed.dtype}. Scale the seed "
            f"down, or pass it in {seed.dtype}")
    creator = getattr(given, "creator", None)
    made = "" if creator is None else (
        f" The seed was computed by {creator._name()}: {where_created(creator)}")
    raise RuntimeError(
        f"anomaly: {what} holds {nonfinite(seed._data)}: the NaN or infinity comes from the "
        f"seed, not from an op's backward; look at how the seed was computed.{made}")


def defined_at(fn):
    """' (defined at file:line)' for a function, lambda, method, functools.partial or callable
    object `fn`; '' where Python keeps no source position (a builtin)."""
    fn = getattr(fn, "func", fn)  # functools.partial
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:  # an object with a __call__ of its own
        call = getattr(type(fn), "__call__", None)
        code = getattr(getattr(call, "__func__", call), "__code__", None)
    return "" if code is None else f" (defined at {code.co_filename}:{code.co_firstlineno})"


def nonfinite(data):
    """What `data`, an array that is not finite, holds: "NaN", "infinity" or both, and where."""
    host = numpy.asarray(backends.backend_of(data).to_numpy(data))  # an error path: no hurry
    nan, bad = int(numpy.isnan(host).sum()), int((~numpy.isfinite(host)).sum())
    what = "NaN" if nan == bad else "infinity" if not nan else "NaN and infinity"
    size = host.size
    return what if size == 1 else f"{what} (in {bad} of its {size} values)"


def _index(f, x):
    """The position of x among f's inputs (the first, if f took it twice)."""
    return next(i for i, y in enumerate(f.inputs) if y is x)


def is_finite(data):
    """True if the array (or number, or list) `data` holds neither NaN nor infinity."""
    backend = backends.backend_of(data)
    if backend is None:  # a Python number or list: as the walk takes it (or refuses it)
        data = Variable(data, requires_grad=False)._data
        backend = backends.backend_of(data)
    xp = backend.xp
    with backend.device_context(backend.device_of(data)):
        return bool(xp.all(xp.isfinite(xp.asarray(data))))
