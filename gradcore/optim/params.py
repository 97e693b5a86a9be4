"""Parameter helpers: gradient and data arrays, a description for errors, what to optimize."""
from collections.abc import Iterable, Mapping

import backends

from ..functions.device import accumulator_dtype
from ..variable import Variable, dtype_kind

# array type -> {dtype: the dtype updates of a parameter of it compute in}, filled on first
# sight; keyed by array type first: array-api-strict's dtypes hash like NumPy's and warn when
# compared with them
_UPDATE_DTYPES = {}
_NONE_SEEN = {}  # an array type not seen yet: none of its dtypes


def grad_array(param):
    """`param.grad`'s array, in `param`'s dtype."""
    g = param.grad.data
    return g if g.dtype == param.dtype else param.xp.astype(g, param.dtype)


def update_grad_array(param):
    """`param.grad`'s array in param's update_dtype (float32 for float16, as the update computes
    it): what a hook computes a new gradient in (WeightDecay's grad + rate * param in float16
    overflows where the float32 update does not, and drops a decay under the gradient's
    spacing); in param's dtype where it has no update dtype (an integer parameter)."""
    wide = update_dtype(param)
    if wide is None:
        return grad_array(param)
    g = param.grad.data
    return g if g.dtype == wide else param.xp.astype(g, wide)


def update_dtype(param):
    """The dtype an optimizer computes `param`'s update in and keeps its state in: float32 for
    float16 (accumulator_dtype, the rule sums follow), as mixed-precision training does, else the
    parameter's own; None for a dtype that is not floating (an integer parameter, which no
    update can change). In float16 the square of a gradient under 2.4e-4 is 0, so Adam's v and
    AdaGrad's h would be 0 and the step m / eps hundreds of times too large."""
    p = param.data
    wide = _UPDATE_DTYPES.get(type(p), _NONE_SEEN).get(p.dtype, False)
    if wide is False:
        dtype = p.dtype
        wide = None if dtype_kind(param.backend, dtype) != "float" else (
            accumulator_dtype(param.xp, dtype) or dtype)
        _UPDATE_DTYPES.setdefault(type(p), {})[dtype] = wide
    return wide


def update_arrays(param):
    """(p, g): the arrays an update of `param` computes on, its data and its gradient, both in
    its update_dtype: the parameter's own array (updated in place) but for a float16 parameter,
    whose float32 copy set_data rounds into the parameter once, at the write."""
    p, g = param.data, param.grad.data
    dtype = p.dtype
    # a float32 parameter costs two dict lookups and two identity tests (dtypes of NumPy, CuPy
    # and Dask are one object per dtype; array-api-strict's equal ones fall to !=)
    wide = _UPDATE_DTYPES.get(type(p), _NONE_SEEN).get(dtype) or update_dtype(param)
    if wide is not dtype and wide != dtype:
        p = param.xp.astype(p, wide)
    if g.dtype is not wide and g.dtype != wide:
        g = param.xp.astype(g, wide)
    return p, g


def set_data(param, data):
    """Store an updated array in `param`: nothing to do when the update ran in place (NumPy, CuPy,
    array-api-strict keep the same array object), an assignment for immutable arrays; a wider
    copy from update_arrays is rounded into the parameter's own array, in place, but on a lazy
    backend (Dask) into a new array, as for any other dtype there."""
    if data is not param.data:
        if param.backend.lazy:
            # in the parameter's own chunks, which an update with a gradient in others leaves
            # (_persist would lay it back out): the data setter sees no other chunks, which it
            # counts as a change that makes a compiled step record again
            data = param.backend.laid_out(data, param.backend.layout(param.data))
        if data.dtype == param.dtype:
            param.data = data
        elif param.backend.lazy:
            # Dask's assign rewrites the array's recipe for every holder (and queues it for the
            # next persist): a step that fails when worked out could not be taken back by
            # putting back the array it kept
            param.data = param.xp.astype(data, param.dtype)
        else:
            param.backend.assign(param.data, data)


def _describe(param):
    """'parameter (W, shape (3, 4))' for error messages."""
    name = f"{param.name}, " if param.name else ""
    shape = None if param.data is None else tuple(param.shape)
    return f"parameter ({name}shape {shape})"


def _unique_params(items, where):
    """`items` as a list of Variables without repeats (a parameter shared by two layers is updated
    once); TypeError for anything that is not a Variable."""
    seen = set()  # ids of the items, which `items` keeps alive for the duration
    params = []
    for position, p in enumerate(items):
        if not isinstance(p, Variable):
            hint = (" (parameter groups, dicts of options per group, are not supported: use one "
                    "optimizer per group)") if isinstance(p, Mapping) else ""
            raise TypeError(f"{where}: the parameters must be Variables/Parameters; item "
                            f"{position} is a {type(p).__name__}{hint}")
        if id(p) not in seen:
            seen.add(id(p))
            params.append(p)
    return params


def _check_leaves(params, where):
    """ValueError for a parameter some op computed: backward leaves gradients on leaves only, so
    it would silently never be trained."""
    for position, p in enumerate(params):
        if p.creator is not None:
            raise ValueError(
                f"{where}: item {position}, {_describe(p)}, is not a leaf Variable: it was "
                f"computed by {p.creator._name()}, so backward leaves it no gradient and it would "
                "never be trained. Make the parameter a leaf: compute on the array and wrap the "
                "result (Parameter(np.random.randn(n) * 0.01)), or cut it from its graph "
                "(w = w.detach().requires_grad_())")
    return params


def _as_target(obj, where):
    """What `setup` stores: an object with `parameters()` (or DeZero's `params()`) as it is, so
    parameters it gains later are optimized too; one Variable or an iterable of them as a list."""
    if isinstance(obj, Variable):
        return _check_leaves([obj], where)
    if isinstance(obj, type):  # MLP for MLP(...): its parameters() would fail at the first step
        raise TypeError(f"{where}: got the class {obj.__name__}, not a model; create the model "
                        f"first (model = {obj.__name__}(...)) and pass that")
    if callable(getattr(obj, "parameters", None)) or callable(getattr(obj, "params", None)):
        return obj
    if backends.is_array(obj) or isinstance(obj, (str, bytes, Mapping)) or not isinstance(
            obj, Iterable):
        raise TypeError(f"{where}: expected the parameters to optimize: a model (an object with a "
                        f"parameters() method), a Variable, or an iterable of Variables; got "
                        f"{type(obj).__name__}. To set a hyperparameter positionally, pass a "
                        "number")
    params = _check_leaves(_unique_params(list(obj), where), where)
    if not params:
        raise ValueError(f"{where}: got an empty list of parameters (a generator such as "
                         "model.parameters() that was already consumed? or a model whose weights "
                         "are plain Variables, not Parameters, which are not trained); pass the "
                         "model itself (its error names such weights) or a fresh "
                         "model.parameters()")
    return params
