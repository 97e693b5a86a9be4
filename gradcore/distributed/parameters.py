"""broadcast_parameters: every rank starts from rank 0's model; save_on_root: one writer."""
import weakref

import numpy

import backends

from .communicator import DistributedError

__all__ = ["broadcast_parameters", "save_on_root"]

# this rank's own random generator states, kept while it draws from root's for its lazy layers
# (see _share_random_states): None (NumPy's global generator) or a CuPy device -> its state
_own_states = {}
# the lazy models broadcast since the generators were last given back: they are given back once
# every one is sized (held weakly: a model dropped before its first call holds nothing up)
_lazy_models = weakref.WeakSet()
# whether this process gave its generators back after a lazy broadcast (for the check's error)
_given_back = [False]


def broadcast_parameters(model, comm, root=0):
    """Give every rank `root`'s parameters and buffers (BatchNorm's running statistics), after
    checking that the ranks' models have the same names, shapes and dtypes (else
    DistributedError on every rank, saying which differ where). Call it on every rank once the
    model is built.

    Layers not sized yet (sized at their first call) cannot be sent; instead every rank gets
    root's state of the random generators they draw their weights from, so that they draw the
    same weights; the first step of a DistributedOptimizer checks that they did. Once every
    model so broadcast is sized, the next step of a DistributedOptimizer (after its first
    check) gives each rank its own generators back, as they were before the first of those
    broadcasts (until then, dropout and shuffles draw alike on every rank). If reading root's
    arrays raises there (a device error, a lazy array's computation), every rank raises at
    once: root its exception, the others DistributedError naming root and it."""
    entries = list(model.named_parameters()) + list(model.named_buffers())
    mine = [[name, None, None] if v.data is None else [name, list(v.shape), str(v.dtype)]
            for name, v in entries]
    sized = [v for _, v in entries if v.data is not None]
    groups = {dtype: [v for v in sized if str(v.dtype) == dtype]
              for dtype in sorted({str(v.dtype) for v in sized})}
    # root reads its arrays before the check, whose all-gather carries word if it could not:
    # the others would otherwise wait for its broadcast until the deadline
    packed, failure = {}, None
    if comm.rank == root:
        try:
            packed = {dtype: numpy.concatenate([v.numpy().reshape(-1) for v in group])
                      for dtype, group in groups.items()}
        except Exception as e:
            failure = e
    said = None if failure is None else f"{type(failure).__name__}: {failure}"
    everyone = comm.allgather_json([mine, said], "broadcast_parameters' check")
    if failure is not None:
        raise failure
    if everyone[root][1] is not None:
        raise DistributedError(f"broadcast_parameters: rank {root} could not read its "
                               f"parameters ({everyone[root][1]}); every rank stops there")
    problems = _differences([m for m, _ in everyone], root)
    if problems:
        raise DistributedError(f"broadcast_parameters: the ranks' models differ: "
                               f"{'; '.join(problems)}. Build the same model on every rank.")
    for dtype, group in groups.items():
        flat = packed[dtype] if comm.rank == root \
            else numpy.empty(sum(v.size for v in group), dtype=group[0].numpy().dtype)
        comm.broadcast(flat, root, "broadcast_parameters")
        start = 0
        for v in group:
            part = flat[start:start + v.size].reshape(v.shape)
            v.data = backends.asarray_on(part, v.device, v.dtype)
            start += v.size
    if len(sized) < len(entries):
        _share_random_states(model, comm, root)
        _lazy_models.add(model)


def _differences(everyone, root):
    """What differs between each rank's [name, shape, dtype] list and root's."""
    expected = {name: (shape, dtype) for name, shape, dtype in everyone[root]}
    problems = []
    for rank, theirs in enumerate(everyone):
        if rank == root:
            continue
        found = {name: (shape, dtype) for name, shape, dtype in theirs}
        for name in expected.keys() - found.keys():
            problems.append(f"rank {rank} has no {name}")
        for name in found.keys() - expected.keys():
            problems.append(f"rank {rank} has {name}, which rank {root} has not")
        for name in expected.keys() & found.keys():
            (shape, dtype), (their_shape, their_dtype) = expected[name], found[name]
            if shape is not None and their_shape is not None and shape != their_shape:
                problems.append(f"{name} is {tuple(their_shape)} on rank {rank} but "
                                f"{tuple(shape)} on rank {root}")
            elif dtype != their_dtype and shape is not None and their_shape is not None:
                problems.append(f"{name} is {their_dtype} on rank {rank} but {dtype} on "
                                f"rank {root}")
            elif (shape is None) != (their_shape is None):
                problems.append(f"{name} is {'not ' if their_shape is None else ''}sized on "
                                f"rank {rank} but {'not ' if shape is None else ''}on rank "
                                f"{root}")
        # the values travel in list order: the same names in another order would swap them
        order = [entry[0] for entry in everyone[root]]
        their_order = [entry[0] for entry in theirs]
        if found.keys() == expected.keys() and their_order != order:
            at = next(i for i, (a, b) in enumerate(zip(order, their_order)) if a != b)
            problems.append(f"rank {rank} lists {their_order[at]} where rank {root} lists "
                            f"{order[at]} (the same names in another order)")
    return sorted(problems)


def _share_random_states(model, comm, root):
    """Root's state of NumPy's global generator (which lazy layers draw from on the CPU and on
    array-API devices) on every rank, and for CuPy devices the model uses, a seed from root.
    The other ranks keep their own states, for restore_random_states: those from before the
    first lazy broadcast since the last restore (a later one finds root's in place)."""
    state = numpy.random.get_state()
    sent = [state[0], state[1].tolist(), *state[2:]] if comm.rank == root else None
    name, keys, *rest = comm.broadcast_json(sent, root, "broadcast_parameters")
    if comm.rank != root:
        _own_states.setdefault(None, state)
    numpy.random.set_state((name, numpy.asarray(keys, dtype=numpy.uint32), *rest))
    devices = {v.device for v in model.parameters() if v.data is not None}
    devices |= {model._device} if getattr(model, "_device", None) is not None else set()
    for device in sorted(devices, key=str):
        backend = backends.backend_for_device(device)
        if backend.name == "cupy":
            own = backend.random_state(device)  # root's is the seed sent
            seed = comm.broadcast_json(own, root, "a seed")
            if comm.rank != root:
                _own_states.setdefault(device, own)
            backend.set_random_state(device, seed)


def random_states_lent():
    """Whether this rank may still draw from root's generators for lazy layers (see
    restore_random_states)."""
    return bool(_own_states or _lazy_models)


def restore_random_states():
    """Give this rank back the random generator states broadcast_parameters replaced with
    root's for lazy layers, once every lazy model it broadcast is sized (one not yet sized
    would draw other weights on each rank). A DistributedOptimizer calls it at its steps, after
    its first check, while random_states_lent(); otherwise every rank would draw the same
    dropout masks and shuffles, whatever seed each was given."""
    for model in list(_lazy_models):
        if all(p.data is not None for _, p in model.named_parameters()):
            _lazy_models.discard(model)
    if _lazy_models:
        return
    for device, state in _own_states.items():
        if device is None:
            numpy.random.set_state(state)
        else:
            backends.backend_for_device(device).set_random_state(device, state)
    _own_states.clear()
    _given_back[0] = True


def save_on_root(model, path, comm, root=0):
    """`model.save(path)` on rank `root` only; every rank returns once the file is written,
    with the path written (".npz" appended if missing), or None where root's `path` is a binary
    file object (written into where it is; the other ranks' `path` is not used). If the save
    raises, every rank raises at once: `root` its exception, the others DistributedError naming
    root and it."""
    def save():
        written = model.save(path)
        return written if isinstance(written, str) else None  # a file object stays on root
    return comm.from_root(save, root, "save_on_root")
