"""Devices as values: "cpu", "cuda", "cuda:1", "array_api_strict:device1"."""


class Device:
    """Where an array lives: a `type` ("cpu", "cuda", a backend's name) and an optional `index`.

    `index` is an int for GPUs, a name for devices of other array-API libraries, and None for
    "cpu" and for "cuda" meaning the current GPU. `str(device)` round-trips through `parse_device`.
    """

    __slots__ = ("type", "index", "_str", "_hash")

    def __init__(self, type, index=None):
        if not isinstance(type, str) or not type or ":" in type:
            raise ValueError(f"Device type must be a non-empty string without ':', got {type!r}")
        if isinstance(index, str) and index.isascii() and index.isdigit():  # "²".isdigit() too
            index = int(index)
        if index is not None and not isinstance(index, (int, str)):
            raise TypeError(f"Device index must be an int, a str or None, got {index!r}")
        self.type = type
        self.index = index
        self._str = type if index is None else f"{type}:{index}"
        self._hash = hash(self._str)

    def __str__(self):
        return self._str

    def __repr__(self):
        return f"Device({self._str!r})"

    def __eq__(self, other):
        if isinstance(other, str):
            try:
                other = parse_device(other)
            except ValueError:
                return False
        return isinstance(other, Device) and other._str == self._str

    def __hash__(self):
        return self._hash


CPU = Device("cpu")


def parse_device(device):
    """A `Device` from a Device, a string such as "cpu", "cuda", "cuda:1", or None (= "cpu")."""
    if isinstance(device, Device):
        return device
    if device is None:
        return CPU
    if isinstance(device, str):
        kind, sep, index = device.strip().partition(":")
        if kind and (not sep or index):
            if kind == "cpu" and sep:
                raise ValueError(f"invalid device {device!r}: 'cpu' takes no index")
            if kind == "cuda" and sep and not (index.isascii() and index.isdigit()):
                raise ValueError(f"invalid device {device!r}: a GPU index is a non-negative "
                                 f"integer, as in 'cuda:1'")
            return CPU if kind == "cpu" and not sep else Device(kind, index or None)
        raise ValueError(
            f"invalid device {device!r}: expected 'cpu', 'cuda', 'cuda:N' or 'BACKEND:NAME'")
    raise TypeError(
        f"a device is a gradcore Device or a string such as 'cpu' or 'cuda:0', "
        f"got {type(device).__name__}")
