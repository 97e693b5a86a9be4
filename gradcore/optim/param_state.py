"""ParamState: an optimizer's per-parameter state, keyed by parameter identity and held weakly."""
import copy
import weakref

from .params import _describe


class ParamState:
    """A mapping from parameter to its state (a dict of arrays), keyed by identity.

    Parameters are held weakly: a parameter that is garbage-collected takes its state with it,
    and its id can never be confused with a newer object's. Keys are never compared with `==`
    (an array-like Variable may one day compare elementwise).

    copy.deepcopy gives the state to the copies of the parameters (copy the model and the
    optimizer in one call, `copy.deepcopy((model, optimizer))`, so that they are the model's);
    pickling keeps the pairs the same way.
    """

    __slots__ = ("_entries", "__weakref__")

    def __init__(self):
        self._entries = {}  # id(param) -> (weakref to param, state)

    @staticmethod
    def _forget(states, ref, key):
        """A parameter died: its pair goes, if `states` (a weak reference) still lives."""
        self = states()
        if self is None:
            return
        entry = self._entries.get(key)
        if entry is not None and entry[0] is ref:
            del self._entries[key]

    def get(self, param, default=None):
        entry = self._entries.get(id(param))
        return entry[1] if entry is not None and entry[0]() is param else default

    def __getitem__(self, param):
        state = self.get(param, self)
        if state is self:
            raise KeyError(f"no optimizer state for {_describe(param)}")
        return state

    def __setitem__(self, param, state):
        key = id(param)
        entries = self._entries
        # the callback holds self weakly: strongly, self -> ref -> callback -> self would be a
        # cycle, keeping a dropped optimizer's state (Adam's m and v) until the collector runs
        states = weakref.ref(self)
        ref = weakref.ref(param, lambda ref: ParamState._forget(states, ref, key))
        entries[key] = (ref, state)

    def __delitem__(self, param):
        self[param]  # KeyError if absent
        del self._entries[id(param)]

    def pop(self, param, *default):
        state = self.get(param, self)
        if state is self:
            if default:
                return default[0]
            raise KeyError(f"no optimizer state for {_describe(param)}")
        del self._entries[id(param)]
        return state

    def __contains__(self, param):
        return self.get(param, self) is not self

    def __len__(self):
        return sum(1 for ref, _ in self._entries.values() if ref() is not None)

    def __iter__(self):
        return iter(self.keys())

    def keys(self):
        return [p for p in (ref() for ref, _ in list(self._entries.values())) if p is not None]

    def items(self):
        out = []
        for ref, state in list(self._entries.values()):
            p = ref()
            if p is not None:
                out.append((p, state))
        return out

    def clear(self):
        self._entries.clear()

    def __deepcopy__(self, memo):
        # ids and weak references are not copied: each pair is made again, its parameter copied
        # through `memo`, so it is the copy that copying the model (in the same call) made
        copied = ParamState()
        memo[id(self)] = copied
        for param, state in self.items():
            copied[copy.deepcopy(param, memo)] = copy.deepcopy(state, memo)
        return copied

    def __getstate__(self):  # pickle: the pairs, with the parameters held strongly meanwhile
        return self.items()

    def __setstate__(self, items):
        self._entries = {}
        for param, state in items:
            self[param] = state

    def __repr__(self):
        return f"<ParamState of {len(self)} parameter(s)>"
