"""Dask: chunked, lazy arrays (dask.array), larger than memory, on threads or a cluster.
Imported only when a Dask array or the "dask" device is first seen.

Functions run on array_api_compat's array-API namespace for Dask. Every result is a task graph
until computed (`dask.compute`, `.compute()`, `numpy.asarray`); one device, "dask": where the
chunks run is the Dask scheduler's business (threads by default, or a dask.distributed Client).
"""
import functools
import importlib
import itertools
import math
import threading
import weakref

import numpy

from .base import Backend, DeviceUnavailableError, HostRandom
from .device import Device
from .indexing import flat_positions, index_start, is_advanced, normalize_key

DASK = Device("dask")


def import_dask():
    """(dask.array, the array-API namespace for it), or an error that says what to install."""
    try:
        da = importlib.import_module("dask.array")
        xp = importlib.import_module("array_api_compat.dask.array")
    except ImportError as e:
        raise DeviceUnavailableError(
            f"the dask device needs Dask and array-api-compat: pip install 'gradcore[dask]' ({e})"
        ) from None
    return da, xp


class Namespace:
    """array_api_compat's namespace for Dask, with the functions it lacks, a broadcast_to that
    chunks the axes it makes (Dask's makes each one a single chunk: a gradient broadcast over
    1e9 elements would be one chunk of 8 GB), or takes the chunks asked for (`laid_out`), a
    clip that never broadcasts its bounds to one chunk, a matmul in NumPy's dtype whatever the
    chunks, a reshape that works whatever the chunks (and on the NumPy index arrays of
    `normalize_key`'s keys), and `checked`, which checks values as they are computed."""

    def __init__(self, xp, da):
        self._xp = xp
        self._da = da
        self.__name__ = xp.__name__
        # Dask's arrays take NumPy's dtypes, float16 among them, which the array API (and so
        # array_api_compat's namespace) does not name
        self.float16 = getattr(xp, "float16", numpy.float16)

    def __getattr__(self, name):
        value = getattr(self._xp, name)
        setattr(self, name, value)  # found once
        return value

    def broadcast_to(self, x, shape, chunks=None):
        """x broadcast to `shape`; in `chunks` (normalized ones, as Dask arrays have) if given."""
        shape = tuple(shape)
        x = self._da.asarray(x)
        if not math.prod(shape):
            return self._da.broadcast_to(x, shape)  # nothing to chunk
        lead = len(shape) - x.ndim
        full = [d >= lead and x.shape[d - lead] == n for d, n in enumerate(shape)]
        if chunks is None:
            # an axis x has at full size keeps x's chunks; a new or size-1 one is chunked "auto"
            chunks = tuple(x.chunks[d - lead] if f else "auto" for d, f in enumerate(full))
            chunks = self._da.core.normalize_chunks(chunks, shape, dtype=x.dtype)
            y = self._da.broadcast_to(x, shape, chunks=chunks)
            return y if y is x else _made(y, functools.partial(self.broadcast_to, x, shape))
        # x in those chunks on the axes it has at full size, broadcast block by block
        x = x.rechunk(tuple(chunks[d] if full[d] else -1 for d in range(lead, len(shape))))
        if x.shape == shape:
            return x
        y = _paced_broadcast(self._da, x, shape, chunks)
        return _made(y, functools.partial(self.broadcast_to, x, shape))

    def clip(self, x, /, min=None, max=None):
        # array_api_compat's clip broadcasts each bound with da.broadcast_to, which makes it one
        # chunk of x's whole size. A number needs no array at all, and an array bound meets x
        # block by block in Dask's own elementwise maximum and minimum
        y = x
        if min is not None:
            y = self._da.maximum(y, min)
        if max is not None:
            y = self._da.minimum(y, max)
        # in NumPy's dtype, as on the other backends: integers clipped to 0.5 become floats
        return y

    def matmul(self, x, W, /):
        # Dask adds up the products of several chunks along the contracted axis with a sum that
        # widens small integers (int8 to int64, bool to int64): NumPy's dtype whatever the
        # chunks. float16 is multiplied in float32 and rounded once, as NumPy's float16 matmul
        # accumulates: chunks added in float16 lost up to 3x its error (0.020 for 0.0074)
        dtype = numpy.result_type(x.dtype, W.dtype)
        if dtype == numpy.float16:
            return self._xp.matmul(x.astype(numpy.float32), W.astype(numpy.float32)).astype(dtype)
        y = self._xp.matmul(x, W)
        return y if y.dtype == dtype else y.astype(dtype)

    # Dask's max, min, argmax and argmin raise on an array with an empty chunk (one block's
    # reduction has no identity, or its result does not line up with its neighbours'), and
    # its var and std over several axes are NaN: rows picked by a mask after
    # compute_chunk_sizes(), in chunks (3, 0, 3, 0). Those chunks are merged away first
    def max(self, x, /, **kwargs):
        return self._xp.max(_without_empty_chunks(x), **kwargs)

    def min(self, x, /, **kwargs):
        return self._xp.min(_without_empty_chunks(x), **kwargs)

    def argmax(self, x, /, **kwargs):
        return self._xp.argmax(_without_empty_chunks(x), **kwargs)

    def argmin(self, x, /, **kwargs):
        return self._xp.argmin(_without_empty_chunks(x), **kwargs)

    def var(self, x, /, **kwargs):
        return self._xp.var(_without_empty_chunks(x), **kwargs)

    def std(self, x, /, **kwargs):
        return self._xp.std(_without_empty_chunks(x), **kwargs)

    def checked(self, x, check, dtype):
        """`check(numpy, block)` for each block of x, run when that block is computed, not now:
        a check of the values (raising for bad ones) that leaves them lazy. It returns the block
        (or what it makes of it, of `dtype`)."""
        meta = numpy.empty((0,) * x.ndim, dtype)
        return x.map_blocks(functools.partial(check, numpy), dtype=dtype, meta=meta)

    def reshape(self, x, shape, copy=None):
        if isinstance(x, numpy.ndarray):  # an index array read on the host (normalize_key)
            return numpy.reshape(x, shape)
        if x.size == 0 and x.npartitions > 1:
            # Dask cannot reshape an empty array of several chunks, not even to (-1,); there
            # is nothing in them, so one chunk costs nothing
            x = x.rechunk(-1)
        # Dask reshapes chunked axes only by merging or splitting them evenly ((7, 5) in chunks
        # of (3, 2) cannot become (5, 7) at once); flat first, then split, always can: Dask
        # rechunks as each step needs, never into one chunk
        try:
            return self._xp.reshape(x, shape, copy=copy)
        except NotImplementedError:
            return self._xp.reshape(self._xp.reshape(x, (-1,), copy=copy), shape, copy=copy)

    def take_along_axis(self, x, indices, axis=-1):
        axis = axis % x.ndim
        # each block holds the whole axis, so every pick stays within its block
        x = x.rechunk({axis: -1})
        indices = self._da.asarray(indices).rechunk(
            {d: (-1 if d == axis else x.chunks[d]) for d in range(x.ndim)})
        return self._da.map_blocks(numpy.take_along_axis, x, indices, axis=axis,
                                   dtype=x.dtype, chunks=indices.chunks)


class DaskBackend(HostRandom, Backend):
    name = device_type = "dask"
    single_device = True
    lazy = True

    def __init__(self):
        self.da, xp = import_dask()
        self.dask = importlib.import_module("dask")
        self.xp = Namespace(xp, self.da)
        self.array_type = self.da.Array
        # arrays written whole by `assign` since the last persist, by id (a Dask array's == is
        # elementwise, so it cannot key a WeakSet): the next persist works them out too. Each
        # keeps its recipe from before each of those assigns (_BEFORE): if its value fails, it
        # is put back to the latest that works out
        self._assigned = weakref.WeakValueDictionary()
        self._queue_lock = threading.Lock()  # assigns and persists may come from several threads

    def normalize_key(self, index, shape):
        # an index array or a mask is needed on the host: its values for the bounds check, a
        # mask's true count for the result's shape, and Dask's take with a Dask index array can
        # be wrong ([0] on an axis of one chunk keeps the whole axis in its shape; a slice that
        # leaves an empty chunk adds rows). So every Dask array in the key is computed here, all
        # in one pass, and the key keeps them as NumPy arrays (small: one entry per pick), whose
        # sizes are known when backward scatters into them
        keys = index if isinstance(index, tuple) else (index,)
        lazy = [k for k in keys if isinstance(k, self.da.Array)]
        if lazy:
            done = iter(self.dask.compute(*lazy))
            index = tuple(next(done) if isinstance(k, self.da.Array) else k for k in keys)
        return normalize_key(numpy, index, shape)

    def assign(self, target, value):
        # target[...] = value would make a graph that writes over target's own: each assign
        # would keep every earlier one. The value's graph replaces target's instead (as Dask's
        # __setitem__ puts its result in place), in target's chunks so its cached sizes hold
        value = self.da.asarray(value)
        if value.dtype != target.dtype:
            value = value.astype(target.dtype)
        value = self.da.broadcast_to(value, target.shape).rechunk(target.chunks)
        with self._queue_lock:
            if self._assigned.get(id(target)) is not target:
                target.__dict__[_BEFORE] = []
                self._assigned[id(target)] = target
            target.__dict__[_BEFORE].append(_recipe(target))
            _rebind(target, _recipe(value))
        return target

    def persist(self, arrays):
        with self._queue_lock:
            queued = [(target, _recipe(target), len(target.__dict__[_BEFORE]))
                      for target in self._assigned.values()]
        try:
            # one pass for all: shared work is done once
            done = self.dask.persist(*arrays, *(target for target, _, _ in queued))
        except BaseException as e:
            # an interrupt too (KeyboardInterrupt, SystemExit, any BaseException): left queued,
            # a value that raises one would raise it again at every later persist
            interrupt = None
            if queued and isinstance(e, Exception):
                # once more, all in one pass, from the queued recipes: after a transient error
                # (a read that fails once) the queued values (BatchNorm's statistics) would
                # work out alone below and be kept while the caller's step is undone, so the
                # step tried again would move them a second time. An interrupt is not retried
                try:
                    done = self.dask.persist(
                        *arrays, *(_array(self.da, recipe) for _, recipe, _ in queued))
                except Exception:
                    pass  # failed twice: settled below, e raised
                except BaseException as met:
                    interrupt = met
                else:
                    self._settle(queued, [_recipe(value) for value in done[len(arrays):]])
                    return list(done[:len(arrays)])
            if queued:
                # all in one pass first where that may work: the caller's arrays were in the
                # failed one (only they may have failed), or an interrupt stopped it (Ctrl+C
                # fails no value); the queued values alone failing with an error fail again
                met = self._settle_failed(queued, together=bool(arrays)
                                          or not isinstance(e, Exception))
                interrupt = met if interrupt is None else interrupt
            if interrupt is not None and isinstance(e, Exception):
                raise interrupt  # met while settling: never swallowed, raised once
            raise
        self._settle(queued, [_recipe(value) for value in done[len(arrays):]])
        return list(done[:len(arrays)])

    def _settle_failed(self, queued, together):
        """After a persist that failed: each queued target whose value works out on its own is
        persisted; one whose value fails too, whatever it raises (an interrupt included), is put
        back to its latest value before its queued assigns that works out (_settle), as an
        eager backend raises at the failing assign and writes nothing. Left queued, a failing
        value would fail every later persist, and reading the target would raise. `together`:
        all in one pass first. Returns the first interrupt (a BaseException that is not an
        Exception) met, for persist to raise, or None."""
        alone = [_array(self.da, recipe) for _, recipe, _ in queued]
        interrupts, values = [], None
        if together:
            try:
                values = self.dask.persist(*alone)
            except Exception:
                pass
            except BaseException as e:
                interrupts.append(e)
        if values is None:  # one at a time: those that fail alone are put back
            values = [self._persisted(array, interrupts) for array in alone]
        # worked out before the lock is taken: a value may assign as it is worked out
        recipes = [_recipe(value) if value is not None else
                   self._last_good(target.__dict__.get(_BEFORE, ())[:count], interrupts)
                   for (target, _, count), value in zip(queued, values)]
        self._settle(queued, recipes)
        return interrupts[0] if interrupts else None

    def _persisted(self, array, interrupts):
        """`array` worked out, or None where that fails; an interrupt it raised is appended to
        `interrupts`, to be raised once everything is settled."""
        try:
            return self.dask.persist(array)[0]
        except Exception:
            return None
        except BaseException as e:
            interrupts.append(e)
            return None

    def _settle(self, queued, recipes):
        """Each queued (target, recipe it was persisted with, how many assigns made it) given
        its worked-out recipe (its value's, or the latest before those assigns that works out:
        _last_good), and dropped from the queue; one assigned again meanwhile (by another
        thread) holds a newer recipe and stays queued, to be put back to this one if its own
        fails."""
        with self._queue_lock:
            for (target, (_, _, name, _), count), recipe in zip(queued, recipes):
                if recipe is None or self._assigned.get(id(target)) is not target:
                    continue  # settled meanwhile by another thread's persist
                befores = target.__dict__[_BEFORE]
                if target.name != name:
                    befores[:count] = [recipe]
                    continue
                del target.__dict__[_BEFORE]
                self._assigned.pop(id(target), None)
                _rebind(target, recipe)

    def _last_good(self, befores, interrupts):
        """The recipe of the latest of `befores` (a target's recipes before each of its queued
        assigns) that works out, worked out; the first (from before them all) where none does;
        None where there are none (settled meanwhile by another thread). Interrupts go to
        `interrupts` (_persisted)."""
        if not befores:
            return None
        for recipe in reversed(befores[1:]):
            value = self._persisted(_array(self.da, recipe), interrupts)
            if value is not None:
                return _recipe(value)
        return befores[0]

    def owns_memory(self, array):
        return True  # a Dask array is never written in place: every change is a new graph

    def device_of(self, array):
        return DASK

    def ensure_array(self, obj):
        return obj  # results are always Dask arrays, 0-d included

    def asarray(self, obj, dtype=None, device=None):
        if isinstance(obj, self.da.Array):
            return obj if dtype is None else obj.astype(dtype)
        array = numpy.asarray(obj, dtype=dtype)
        return self.da.from_array(array, chunks="auto" if array.ndim else ())

    def zeros(self, shape, dtype, device):
        return _made(self.da.zeros(shape, dtype=dtype, chunks="auto"),
                     functools.partial(self.da.zeros, shape, dtype=dtype))

    def check_known_shape(self, array):
        if not any(math.isnan(n) for n in array.shape):  # an unknown chunk makes its axis nan
            return
        raise ValueError(
            f"Variable data: a Dask array whose chunk sizes are unknown (shape {array.shape}), "
            "as after selecting with a mask (x[x > 0]), cannot be differentiated: its gradient "
            "is made in its chunks. Call x.compute_chunk_sizes() first (it computes x once to "
            "count them), then pass x")

    def layout(self, array):
        return array.chunks

    def laid_out(self, array, layout):
        if array.chunks == layout:
            return array
        name, make = array.__dict__.get(_MADE, (None, None))
        if name != array.name:  # not made by us, or written since (which gives another name)
            return array.rechunk(layout)
        # made again in those chunks. Rechunked, an array made in larger ones would have each
        # of them computed whole and held while the smaller ones are cut from it: memory would
        # grow with the array's size (by ~128 MiB chunks), not with its chunks'
        return _made(make(chunks=layout), make)

    def to_device(self, array, device):
        return array

    def to_numpy(self, array):
        return numpy.asarray(array.compute())

    def add_at(self, target, key, values):
        if not is_advanced(key):
            return self._add_at_slices(target, key, values)
        # integer-array keys: every value goes to its flat position, added up there block by
        # block (repeated positions add up), then added to the target
        values = self.da.asarray(values)
        positions = flat_positions(self.xp, target.shape, self._chunked_as(key, values))
        if math.prod(positions.shape) == 0:
            return target  # the key picks nothing (an all-False mask): nothing to add
        values = self.xp.broadcast_to(values, positions.shape)
        positions = self.xp.reshape(positions, (-1,))
        # each block of positions meets the block of values at its place: the flat values
        # chunked as the positions (a multi-chunk array flattens in other chunks)
        values = self.xp.reshape(values, (-1,)).rechunk(positions.chunks)
        target[...] = target + _summed(self.da, positions, values, target)
        return target

    def _chunked_as(self, key, values):
        """`key` with its NumPy index arrays (normalize_key's) as Dask arrays in the chunks of
        `values` (x[key], or what broadcasts to it) on the axes they share: the positions made
        from them come in those chunks, not as one chunk of x[key]'s size."""
        start = index_start(key)
        ndim = max(k.ndim for k in key if hasattr(k, "shape"))  # of the index arrays' broadcast
        # x[key] has an axis per slice and None, and the index arrays' broadcast ones
        skip = sum(1 for k in key if k is None or k.__class__ is slice) + ndim - values.ndim
        out = []
        for k in key:
            if isinstance(k, numpy.ndarray):
                # k is right-aligned in the broadcast: its axis a is x[key]'s start + lead + a
                lead = start + ndim - k.ndim - skip  # and values' axis a + lead
                chunks = tuple(values.chunks[a + lead] if a + lead >= 0
                               and values.shape[a + lead] == n else -1
                               for a, n in enumerate(k.shape))
                k = self.da.from_array(k, chunks=chunks)
            out.append(k)
        return tuple(out)

    def _add_at_slices(self, target, key, values):
        """add_at for a key of ints, slices and None. Dask's __setitem__ writes an int beside a
        negative-step slice in reverse order (or fails), and fails on an empty slice: it gets
        one non-empty, positive-step slice per axis, and `values` shaped and flipped to match."""
        slices = []  # one per axis of target, each with a positive step
        picked = []  # the shape target[key] has
        flips = []   # the axes of `values` whose slice ran backwards
        shape = []   # the shape `values` takes for `slices`: 1 where an int was
        for k in key:
            if k is None:
                picked.append(1)  # a new axis: in values, not in target
            elif k.__class__ is int:
                slices.append(slice(k, k + 1))
                shape.append(1)
            elif k is not Ellipsis:  # an empty one covers no axis
                r = range(*k.indices(target.shape[len(slices)]))
                if not r:
                    return target  # nothing picked: nothing to add
                if r.step < 0:
                    flips.append(len(picked))
                    r = r[::-1]
                # bounds in range, stopping at the last element picked
                slices.append(slice(r[0], r[-1] + 1, r.step))
                picked.append(len(r))
                shape.append(len(r))
        # Dask's reshape and __setitem__ fail on an empty chunk, which gy has where x[key] has
        # one (a slice reaching into a chunk it picks nothing from), and so may the target
        values = _without_empty_chunks(self.xp.broadcast_to(values, tuple(picked)))
        if flips:
            values = values[tuple(slice(None, None, -1) if d in flips else slice(None)
                                  for d in range(values.ndim))]
        values = self.xp.reshape(values, tuple(shape)).astype(target.dtype, copy=False)
        slices = tuple(slices)
        total = target[slices] + values  # basic indices never repeat an element
        target[slices] = _without_empty_chunks(total)
        return target

    def host_samples(self, generator, kind, shape, dtype, device):
        """Up to one chunk's worth, drawn on the host from `generator`: the same numbers as on
        NumPy (weights made on either are equal). Beyond that, drawn by Dask chunk by chunk when
        computed, from a seed drawn from `generator`: memory stays bounded. Those numbers
        depend on the chunks too: `laid_out` draws them again from the seed, in its chunks."""
        limit = self.dask.utils.parse_bytes(self.dask.config.get("array.chunk-size"))
        if math.prod(shape) * 8 <= limit:
            return super().host_samples(generator, kind, shape, dtype, device)
        seed = int(generator.randint(2 ** 31))

        def drawn(chunks):
            chunked = self.da.random.RandomState(seed)
            draw = chunked.standard_normal if kind == "normal" else chunked.random_sample
            return draw(shape, chunks=chunks).astype(dtype)
        return _made(drawn("auto"), drawn)


_MADE = "_gradcore_made"  # in a Dask array's __dict__: (its name then, make(chunks=...))
_BEFORE = "_gradcore_before"  # in a queued assigned one's: its _recipe before each of those assigns


def _made(array, make):
    """`array`, noted as what make(chunks=...) makes in its chunks: `laid_out` makes it so in
    others."""
    array.__dict__[_MADE] = array.name, make
    return array


def _paced_broadcast(da, x, shape, chunks):
    """x broadcast to `shape` in `chunks` (x has them, or one, on each of its axes), each block
    a task that also waits on a task of its own that waits on nothing. Waiting on x alone,
    every block would be ready as soon as x is, and Dask's threaded scheduler would make them
    all then, with what follows each (gy * 2 in the backward of x[::2] * 2), and hold them
    until the rest of the computation (the input's blocks) comes: memory would grow with the
    array. Dask orders the tasks that wait on nothing as the computation reads its data, and
    fuses none of them into a block (as it would fuse an empty Blockwise array's)."""
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    token = tokenize(x, shape, chunks)
    name, pace = "broadcast_to-" + token, "pace-" + token
    lead = len(shape) - x.ndim
    graph = {}
    for index in itertools.product(*(range(len(c)) for c in chunks)):
        source = tuple(0 if n == 1 else i for n, i in zip(x.numblocks, index[lead:]))
        block = tuple(c[i] for c, i in zip(chunks, index))
        graph[(pace,) + index] = (_nothing,)
        graph[(name,) + index] = (_broadcast_block, (x.name,) + source, block, (pace,) + index)
    graph = HighLevelGraph.from_collections(name, graph, dependencies=[x])
    return da.Array(graph, name, chunks, dtype=x.dtype, meta=x._meta)


def _nothing():
    return None


def _summed(da, positions, values, like):
    """An array shaped and chunked like `like` whose flat element p sums the `values` at the
    `positions` equal to p (both 1-d, in the same chunks). One running total, which each block
    of positions adds its values into in turn, and whose blocks are read from it: one array of
    `like`'s size (in float64 for float16/32) is held. (Dask's bincount makes one per block of
    positions and sums them in a tree, holding several at once; rechunked, the total would be
    copied piece by piece.)"""
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    token = tokenize(positions, values, like.shape, like.chunks, like.dtype)
    name, step = "scatter_add-" + token, "scatter_add-total-" + token
    size, dtype = math.prod(like.shape), like.dtype
    # numpy.add.at adds one value at a time in the total's dtype: 20,000 x 0.1 into one float16
    # element stop at 256, 2e6 into a float32 one drift 1.5%. So the total is float64 (or
    # complex128), as bincount sums, and each block is rounded to `dtype` once, when read
    total_dtype = numpy.result_type(dtype, numpy.float64) if dtype.kind in "fc" else dtype
    graph, total = {}, None
    for k in range(positions.numblocks[0]):
        graph[(step, k)] = (
            _add_block, total, (positions.name, k), (values.name, k), size, total_dtype)
        total = (step, k)
    starts = [itertools.accumulate(c, initial=0) for c in like.chunks]
    slices = [[slice(a, a + n) for a, n in zip(s, c)] for s, c in zip(starts, like.chunks)]
    for index in itertools.product(*(range(len(c)) for c in like.chunks)):
        where = tuple(s[i] for s, i in zip(slices, index))
        graph[(name,) + index] = (_view, total, like.shape, where, dtype)
    graph = HighLevelGraph.from_collections(name, graph, dependencies=[positions, values])
    return da.Array(graph, name, like.chunks, dtype=dtype, meta=like._meta)


def _add_block(total, positions, values, size, dtype):
    if total is None:
        total = numpy.zeros(size, dtype)
    # in place: the next step of the chain is the only task that reads this one's result
    numpy.add.at(total, positions, values)
    return total


def _view(total, shape, where, dtype):
    return total.reshape(shape)[where].astype(dtype, copy=False)


def _broadcast_block(block, shape, _):
    return numpy.broadcast_to(block, shape)


def _without_empty_chunks(array):
    """`array` with each empty chunk merged into its neighbour; itself where it has none, or
    where it is empty (an empty axis cannot lose its only chunk)."""
    chunks = array.chunks
    if not any(0 in c for c in chunks) or not array.size:
        return array
    return array.rechunk(tuple(tuple(n for n in c if n) for c in chunks))


def _recipe(array):
    """What a Dask array holds, as `_rebind` takes it: (meta, graph, name, chunks)."""
    return array._meta, array.dask, array.name, array.chunks


def _array(da, recipe):
    """A new Dask array holding `recipe` (see _recipe)."""
    meta, graph, name, chunks = recipe
    return da.Array(graph, name, chunks, meta=meta)


def _rebind(target, recipe):
    """The Dask array `target` made to hold `recipe` (same shape and chunks), in place."""
    target._meta, target.dask, target._name, target._chunks = recipe
