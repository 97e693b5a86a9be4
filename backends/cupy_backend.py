"""CuPy: the GPU backend. Imported only when a CuPy array or a "cuda" device is first seen."""
import contextlib
import gc
import importlib
import threading
import weakref

from .base import Backend, DeviceUnavailableError, ViewsByBase
from .device import Device


def import_cupy():
    """The cupy module, or a DeviceUnavailableError that says what is missing."""
    try:
        cupy = importlib.import_module("cupy")
    except ImportError as e:
        raise DeviceUnavailableError(
            "a CUDA device was requested but CuPy is not installed: "
            "pip install 'gradcore[gpu]' (or the cupy-cudaXXx wheel matching your CUDA)") from e
    try:
        available = cupy.cuda.is_available()
    except Exception:  # a broken driver or runtime reads as "no GPU"
        available = False
    if not available:
        raise DeviceUnavailableError(
            f"a CUDA device was requested but no CUDA device was found (CuPy {cupy.__version__} "
            "is installed; check nvidia-smi and CUDA_VISIBLE_DEVICES)")
    return cupy


# cupy.add.at with an index array needs CUDA's atomicAdd, which exists for these only
ATOMIC_ADD_DTYPES = frozenset(["float16", "float32", "float64", "int32", "uint32", "uint64"])


def scatter_add_converted(scatter_add, xp, target, index, values):
    """`scatter_add` (one that takes ATOMIC_ADD_DTYPES only) for any other dtype, exactly.

    Integers go through uint64: two's-complement addition wraps mod 2**64 the same way, and a
    narrower type wraps the same way again when cast back (as np.add.at does). bool is a logical
    or (np.add on bools); complex adds its real and imaginary parts separately.
    """
    values = xp.asarray(values)
    kind = target.dtype.kind
    if kind in "iub":
        total = xp.zeros(target.shape, dtype=xp.uint64)
        scatter_add(total, index, values.astype(xp.int64).astype(xp.uint64))
        if kind == "b":
            target |= total != 0
        else:
            target += total.astype(xp.int64).astype(target.dtype)
        return target
    if kind == "c":
        real = xp.zeros(target.shape, dtype=target.real.dtype)
        imag = xp.zeros(target.shape, dtype=target.real.dtype)
        scatter_add(real, index, values.real.astype(real.dtype))
        scatter_add(imag, index, values.imag.astype(real.dtype))
        target += real + 1j * imag
        return target
    raise TypeError(f"scatter_add: CuPy cannot scatter-add {target.dtype} arrays; use one of "
                    + ", ".join(sorted(ATOMIC_ADD_DTYPES)))


def _refusing_in(thread, allocator):
    """A pinned memory allocator that refuses in `thread` (capturing a CUDA graph) and is
    `allocator` elsewhere. CuPy copies an array from the host through pinned memory it reuses as
    soon as the copy looks done: captured, the copy would be made again at every launch from
    whatever that memory holds by then. Refused, the capture fails and the run stays op by op."""
    def allocate(size):
        if threading.get_ident() == thread:
            raise RuntimeError("an array copied from host memory inside the capture of a CUDA "
                               "graph (CuPy reuses the pinned buffer it goes through)")
        return allocator(size)
    return allocate


def _failing_plainly(malloc, cuda_error):
    """The allocator of a capture's pool: `malloc`, with a CUDA error raised as a RuntimeError.
    A CuPy pool that runs out of memory frees its cached blocks and tries again (it catches
    CUDA's errors only); during a capture those blocks are memory the kernels captured so far
    use, which a later array could then be given. Raised plainly, the capture fails instead."""
    def allocate(size):
        try:
            return malloc(size)
        except cuda_error as e:
            raise RuntimeError(f"out of GPU memory while capturing a CUDA graph ({e})") from e
    return allocate


# Held while a CUDA graph is captured and by CupyBackend.synchronize: a device-wide wait from
# another thread during a capture fails it (CUDA refuses), and two captures at once would each
# swap CuPy's pinned memory allocator (it is one per process) under the other
_CAPTURING = threading.RLock()


# CuPy's functions (and methods, and the @ operator) that call cuBLAS
_CUBLAS_CALLS = frozenset(("matmul", "dot", "vdot", "inner", "tensordot", "einsum", "vecdot",
                           "matvec", "vecmat"))


class CudaGraph:
    """A captured CUDA graph with what it needs alive: the memory pool its arrays came from."""

    def __init__(self, cupy, graph, pool, stream):
        self.cupy, self.graph, self.pool, self.stream = cupy, graph, pool, stream
        self.device = cupy.cuda.runtime.getDevice()  # where it was captured
        self._last = None  # the stream of the last launch

    def launch(self, copies=()):
        """Copy each (buffer, value) of `copies` into its buffer, then run the captured work, on
        the current stream of the GPU it was captured on: after what was queued there, and after
        the last launch if that went to another stream (the graph's memory is the same)."""
        cuda = self.cupy.cuda
        if cuda.runtime.getDevice() != self.device:
            with cuda.Device(self.device):
                return self.launch(copies)
        stream = cuda.get_current_stream()
        last = self._last
        if last is not None and last.ptr != stream.ptr:
            stream.wait_event(last.record())  # on the device: the host goes on
        for buffer, value in copies:
            self.cupy.copyto(buffer, value)
        self.graph.launch(stream)
        self._last = stream


class CupyBackend(ViewsByBase, Backend):
    name = "cupy"
    device_type = "cuda"
    needs_device_context = True
    captures_graphs = True
    multiplies_bool = True
    reproducible = False  # cupyx.scatter_add and add.at add with atomics
    _count = None  # the GPUs CUDA sees, once asked: fixed for the process from CUDA's start

    def __init__(self):
        cupy = import_cupy()
        self.xp = cupy
        self.array_type = cupy.ndarray
        self._devices = {}  # id -> Device; cupy.cuda.Device is unhashable, so key on .id
        self._graphs = weakref.WeakSet()  # the CudaGraphs still alive (their memory counted)
        self._capture_streams = {}  # GPU index -> the stream captures run on

    def _device(self, id):
        device = self._devices.get(id)
        if device is None:
            device = self._devices[id] = Device("cuda", id)
        return device

    def _id(self, device):
        """The GPU index of a "cuda" Device; "cuda" alone means the current GPU."""
        if device is None or device.index is None:
            return self.xp.cuda.runtime.getDevice()
        count = self._count
        if count is None:  # asked once: _id runs at every device_context and creation
            count = self._count = self.xp.cuda.runtime.getDeviceCount()
        if not 0 <= device.index < count:
            raise DeviceUnavailableError(
                f"{device} does not exist: {count} CUDA device(s) found (cuda:0 to cuda:{count - 1})")
        return device.index

    def owns_memory(self, array):
        return array.base is None  # CuPy arrays are always writable

    def writable(self, array):
        return True

    def device_of(self, array):
        return self._device(array.device.id)

    def device_context(self, device):
        return self.xp.cuda.Device(self._id(device))

    def ensure_array(self, obj):
        return obj  # results are always arrays, 0-d included

    def asarray(self, obj, dtype=None, device=None):
        # CuPy creation functions take no device=: create under the device instead
        with self.xp.cuda.Device(self._id(device)):
            return self.xp.asarray(obj, dtype=dtype)

    def zeros(self, shape, dtype, device):
        with self.xp.cuda.Device(self._id(device)):
            return self.xp.zeros(shape, dtype=dtype)

    def empty(self, shape, dtype, device):
        with self.xp.cuda.Device(self._id(device)):
            return self.xp.empty(shape, dtype=dtype)

    def to_device(self, array, device):
        id = self._id(device)
        if array.device.id == id:
            return array
        with self.xp.cuda.Device(id):
            return self.xp.asarray(array)  # peer copy onto the current device

    def to_numpy(self, array):
        return array.get()  # numpy.asarray(cupy_array) raises by design

    def add_at(self, target, key, values):
        if target.dtype.name == "float16":
            # float16 atomics round at every add (20,000 x 0.1 into one element stop at 256):
            # added up in float32, then rounded once, as on NumPy
            total = target.astype(self.xp.float32)
            self.xp.add.at(total, key, self.xp.asarray(values, dtype=self.xp.float32))
            target[...] = total
            return target
        if target.dtype.name in ATOMIC_ADD_DTYPES:
            self.xp.add.at(target, key, values)
            return target
        with self.xp.cuda.Device(target.device.id):
            return scatter_add_converted(self.xp.add.at, self.xp, target, key, values)

    def random_normal(self, shape, dtype, device):
        with self.xp.cuda.Device(self._id(device)):
            return self.xp.random.standard_normal(shape, dtype=dtype)

    def random_uniform(self, shape, dtype, device):
        with self.xp.cuda.Device(self._id(device)):
            return self.xp.random.random_sample(shape, dtype=dtype)

    def manual_seed(self, seed):
        for id in range(self.xp.cuda.runtime.getDeviceCount()):
            with self.xp.cuda.Device(id):
                self.xp.random.seed(seed)

    def random_state(self, device):
        # CuPy's generators cannot be copied: draw a seed from the device's generator and start
        # it again from that seed, which set_random_state can do once more
        with self.xp.cuda.Device(self._id(device)):
            seed = int(self.xp.random.randint(0, 2 ** 31 - 1, size=()).get())
            self.xp.random.seed(seed)
        return seed

    def set_random_state(self, device, state):
        with self.xp.cuda.Device(self._id(device)):
            self.xp.random.seed(state)

    def random_draw(self, kind, shape, dtype, device, state):
        with self.xp.cuda.Device(self._id(device)):
            generator = self.xp.random.RandomState(state)  # what seed(state) makes the global
            draw = generator.standard_normal if kind == "normal" else generator.random_sample
            return draw(shape, dtype=dtype)

    def capture(self, run):
        cuda = self.xp.cuda
        # The arrays made while capturing come from a pool of the graph's own: every launch
        # writes them again, so no other array may be given their memory while the graph lives
        # (freed into the default pool, they would be). The capture runs on a stream of its own
        # (CUDA captures none on the legacy default stream), one per GPU, used again by later
        # captures; launches run on the current one. The collector waits: an array it freed
        # meanwhile would go back to CuPy's pools from inside the capture.
        pool = cuda.MemoryPool(_failing_plainly(cuda.memory._malloc,
                                                cuda.runtime.CUDARuntimeError))
        with _CAPTURING:
            device = cuda.runtime.getDevice()
            if device not in self._capture_streams:
                self._capture_streams[device] = cuda.Stream(non_blocking=True)
            stream = self._capture_streams[device]
            pinned = self._pinned_allocator()
            cuda.set_pinned_memory_allocator(_refusing_in(threading.get_ident(), pinned))
            collecting = gc.isenabled()
            gc.disable()
            try:
                with stream, cuda.using_allocator(pool.malloc):
                    stream.begin_capture()  # relaxed mode: the pool may call cudaMalloc
                    try:
                        results = run()
                    except BaseException:
                        with contextlib.suppress(Exception):  # a failure invalidates it
                            stream.end_capture()
                        raise
                    graph = stream.end_capture()
            finally:
                if collecting:
                    gc.enable()
                cuda.set_pinned_memory_allocator(pinned)
        captured = CudaGraph(self.xp, graph, pool, stream)
        self._graphs.add(captured)
        return captured, results

    def _pinned_allocator(self):
        """CuPy's pinned memory allocator now, as set_pinned_memory_allocator takes it back:
        the default pool's malloc, or the plain one. One of the user's own cannot be read back:
        a RuntimeError, so that no capture runs without the check below."""
        cuda = self.xp.cuda
        memory = cuda.alloc_pinned_memory(1).mem
        pool = self.xp.get_default_pinned_memory_pool()
        if memory.__class__ is cuda.pinned_memory.PooledPinnedMemory and memory.pool() is pool:
            return pool.malloc
        if memory.__class__ is cuda.pinned_memory.PinnedMemory:
            return cuda.pinned_memory._malloc
        raise RuntimeError("a pinned memory allocator of the user's own is set, which a CUDA "
                           "graph's capture cannot put back after refusing host copies")

    def refused_in_graphs(self, name, module):
        # CuPy raises NotImplementedError for cuBLAS and cuSOLVER calls while a stream
        # captures: matrix products and linear algebra
        return name in _CUBLAS_CALLS or "linalg" in module.split(".")

    def graph_memory(self, device):
        id = self._id(device)
        return sum(graph.pool.total_bytes() for graph in list(self._graphs) if graph.device == id)

    def synchronize(self, device):
        with _CAPTURING:  # not while another thread captures a graph: CUDA would refuse
            self.xp.cuda.Device(self._id(device)).synchronize()

    def memory_in_use(self, device):
        with self.xp.cuda.Device(self._id(device)):
            return self.xp.get_default_memory_pool().used_bytes()
