"""PyCudaHandler: the Handler contract on a CUDA GPU with pycuda and cuBLAS.

Arrays are ``pycuda.gpuarray.GPUArray`` backed by a device memory pool.  Every
piece of device work (kernels, fills, copies, cuBLAS) is issued on the
handler's own non-blocking streams, never on the legacy NULL stream, which
would serialise against everything.  Kernels come from ``handlers/cuda/kernels``,
are loaded once per process and launched with one C call through the
``handlers.cuda._launch`` extension, which PyCudaHandler requires (an ImportError
names the fix where it is not built); a failed driver or cuBLAS call raises
``handlers.cuda.kernel_loader.CudaError``.

Products small enough that cuBLAS's own host work would dominate (at most
4096 output elements, inner dimension at most 128) run on a simple kernel
(``kernels/small_gemm.cu``); all others go to cuBLAS through the chosen binding.

Stream groups: group ``k`` owns one stream with its own cuBLAS handle and
scratch workspace; every op of the group runs on it.  A handler works from any
thread: the device's primary context is made current on a thread at its first
call.
"""
import functools
import math
import os
import threading
import weakref

import numpy as np

from .. import dtypes, optable, shape_rules
from ..base import Handler
from ..checks import fail_type
from ..graphs import WORK_HOOKS
from . import context as cuda_context
from . import fused_source, kernel_loader, one_call, reductions
from . import graph as cuda_graph
from . import transfer as cuda_transfer
from .blas import KINDS, make_gemm

_BLOCK = reductions.BLOCK
# Products with at most this many output elements and inner dimension run on
# kernels/small_gemm.cu instead of cuBLAS, whose host work per call (~6 us on
# an H200 host) is more than such a product costs: a 16x16 dot_mm then takes
# about one kernel launch.  Larger products use cuBLAS.
_SMALL_GEMM_OUT, _SMALL_GEMM_K = 4096, 128
# kernel_loader.launch_function(), bound when the first handler is created:
# launch(kernel.handle, slot.handle, grid, block, kernel.fmt, *args)
_launch_kernel = None
_ev = None       # kernel_loader.events(), bound with _launch_kernel
_cudnn = None    # the extension, once it has loaded cuDNN (_load_cudnn)
# A convolution algorithm needing more workspace than this is passed over for
# the next one the heuristics rank (or the small-workspace fallback).
_CUDNN_WORKSPACE_LIMIT = 1 << 30
# How many of the engines cuDNN ranks for a convolution its first call times
# (PyCudaHandler._plan_conv): on an H200 the fastest accurate engine was at
# most fifth of the allowed ones.
_CONV_CANDIDATES = 6
# cuDNN's numerical notes (cudnnBackendNumericalNote_t, each a bit of the
# masks _cudnn takes and returns); _refused_notes says which rule an engine out.
CUDNN_NOTES = ("tensor_core", "down_convert_inputs", "reduced_precision_reduction", "fft",
               "nondeterministic", "winograd", "winograd_tile_4x4", "winograd_tile_6x6",
               "winograd_tile_13x13", "strict_nan_prop")


def _note_mask(*names):
    return sum(1 << CUDNN_NOTES.index(n) for n in names)


def _refused_notes(backward, half, deterministic):
    """The mask of cuDNN numerical notes a convolution engine must not carry.

    Every format: no down-converted inputs and no reduced-precision sums (the
    contract computes in the format, or in float32 for the halves).  Float32
    and float64: no tensor cores (that would be TF32).  The halves: tensor
    cores are theirs (the inputs are half already, the sums float32), but no
    FFT or Winograd engines, whose transforms round to the half format.
    Backward passes: no atomics unless ``deterministic`` is off (float32 and
    float64 only)."""
    refused = _note_mask("down_convert_inputs", "reduced_precision_reduction")
    if half:
        refused |= _note_mask("fft", "winograd", "winograd_tile_4x4", "winograd_tile_6x6",
                              "winograd_tile_13x13")
    else:
        refused |= _note_mask("tensor_core")
    if backward and (deterministic or half):
        refused |= _note_mask("nondeterministic")
    return refused


# Engines (global indices, per pass: 0 forward, 1 backward data, 2 backward
# filter) never chosen, whatever their notes say, because they measured far
# less accurate than their notes allow.  Backward-filter engine 17 (cuDNN 9 on
# an H200, November 2026; PyTorch picks it too): at a LeNet layer (x
# 64x1x28x28, dy 64x6x24x24: sums of 36864 products) its float32 gradient
# was off by up to 0.22 (391 units of 2^-24 times the sum of the products'
# magnitudes; float32 BLAS: 0.1), TF32-like, with no tensor-core note; in
# bfloat16, 2.2 times the tolerance tests/helpers.py derives from the format.
_DENIED_ENGINES = {0: (), 1: (), 2: (17,)}


def cudnn_note_names(mask):
    """The names of the numerical notes in ``mask`` (reports and errors)."""
    return [n for i, n in enumerate(CUDNN_NOTES) if mask >> i & 1]
# Makes the device's context current on the calling thread (once per thread).
# Every hook that calls pycuda or cuBLAS starts with it; the driver calls of
# handlers.cuda._launch (launches, events, graphs, ...) do the same in C.
_enter = cuda_context.enter


def _load_cudnn():
    """The extension with cuDNN 9 loaded: from the ``nvidia.cudnn`` package
    (the ``nvidia-cudnn-cu*`` wheels) if importable, else the plain soname
    ``libcudnn.so.9`` from the loader's path.  ImportError naming what was
    tried if neither opens."""
    global _cudnn
    if _cudnn is None:
        ext = kernel_loader.require()
        tried = []
        try:
            import nvidia.cudnn as pkg
            tried += [os.path.join(d, "lib", "libcudnn.so.9") for d in pkg.__path__]
        except ImportError:
            pass
        tried.append("libcudnn.so.9")
        errors = []
        for path in tried:
            if os.path.sep in path and not os.path.exists(path):
                errors.append(f"{path}: no such file")
                continue
            try:
                ext.cudnn_load(path)
                break
            except RuntimeError as e:
                errors.append(str(e))
        else:
            raise ImportError("PyCudaHandler: the conv2d ops need cuDNN 9 (pip install "
                              "nvidia-cudnn-cu13, or nvidia-cudnn-cu12 for CUDA 12, or a system "
                              "libcudnn9); tried the nvidia.cudnn "
                              "package and the soname libcudnn.so.9: " + "; ".join(errors))
        _cudnn = ext
    return _cudnn


class _Scratch:
    """Memory used only by one stream, grown on demand and kept for later
    ops.  An outgrown block is kept too, never handed back to the pool: work
    queued on the stream may still use it, and the pool could give it to
    another stream meanwhile."""

    __slots__ = ("_pool", "block", "nbytes", "_outgrown")

    def __init__(self, pool):
        self._pool, self.block, self.nbytes, self._outgrown = pool, None, 0, []

    def get(self, nbytes):
        """A block of at least ``nbytes``."""
        if nbytes > self.nbytes:
            if self.block is not None:
                self._outgrown.append(self.block)
            self.block, self.nbytes = self._pool.allocate(nbytes), nbytes
        return self.block


class _StreamSlot:
    """One stream with what belongs to it: scratch memory and a cuDNN handle,
    shared by the twins of every format (a handler holds its own cuBLAS
    objects, bound to the slots' streams)."""

    def __init__(self, drv, pool, blas_workspace):
        self.stream = drv.Stream(flags=1)          # CU_STREAM_NON_BLOCKING
        self.handle = self.stream.handle   # the driver handle, for _launch_kernel and _ev
        self.event = _ev.new()
        # Held by every op's Python path for the whole op: an op that issues
        # several launches through this stream's scratch (a sum in passes, a
        # half-format product, chunked extrema) must not have another
        # thread's op queued between them on the same stream.  The compiled
        # path (one_call) holds the GIL and uses no scratch.
        self.lock = threading.RLock()
        # cuBLAS's scratch, ours rather than its own, so that it allocates
        # nothing while a graph is being captured.  The GEMM objects of every
        # format on this stream (twins) share it: their calls are stream-ordered.
        self.blas_work = pool.allocate(blas_workspace)
        self.blas_bytes = blas_workspace
        self.flag = pool.allocate(4)               # is_fully_finite's result
        self._drv = drv
        self.host_flag = drv.pagelocked_empty(1, np.uint32)
        self._work = _Scratch(pool)                          # workspace()
        self._counts = _Scratch(pool)                        # counters()
        self._between = (_Scratch(pool), _Scratch(pool))     # intermediate()
        # cuDNN's workspace: its own, so that a convolution's size never
        # grows (and strands) the block the reductions use.
        self._cudnn_work = _Scratch(pool)
        self.cudnn = 0             # this stream's cuDNN handle, made at first use (_conv2d)
        #: every growable scratch of this slot (a capture gives them back, _graph_done)
        self.scratches = (self._work, self._counts, *self._between, self._cudnn_work)

    def workspace(self, nbytes):
        """Scratch memory of at least ``nbytes`` used only by this stream."""
        return self._work.get(nbytes)

    def cudnn_workspace(self, nbytes):
        """Scratch of at least ``nbytes`` for cuDNN calls on this stream."""
        return self._cudnn_work.get(nbytes)

    def intermediate(self, which, shape, dtype):
        """Array ``which`` (0 or 1) of ``shape`` over memory used only by this
        stream (``sum_t`` over separate runs of axes)."""
        from pycuda.gpuarray import GPUArray
        block = self._between[which].get(max(1, math.prod(shape)) * dtype.itemsize)
        return GPUArray(shape, dtype, gpudata=block)

    def counters(self, n):
        """``n`` zeroed uint32 counters used only by this stream (chunked
        ``sum_t``); kernels leave them zero again when they finish."""
        if 4 * n > self._counts.nbytes:
            self._drv.memset_d32_async(self._counts.get(4 * n), 0, n, self.stream)
        return self._counts.block


class _Resources:
    """What a handler must release explicitly, without the handler itself."""

    def __init__(self, handler):
        self.slots = handler._all_slots
        self.gemms = []                      # the family's cuBLAS objects (_bind_format)
        self.uploads = handler._uploads      # filled later, by reference
        self.events = handler._free_events   # recycled CUDA events
        self.pool = handler._pool
        self.conv_plans = handler._conv_plans   # cuDNN descriptors, by reference

    def __call__(self):
        if self.slots is None:               # closed already
            return
        # The garbage collector may run this on any thread (the prefetch
        # reader's too); the pycuda objects held here are then released on
        # the thread that owns the context, later.
        cuda_context.run_with_context(self._release)

    def _release(self):
        if self.slots is None:               # asked twice while deferred
            return
        slots, self.slots = self.slots, None
        for s in slots + self.uploads:
            (getattr(s, "stream", s)).synchronize()
        for gemm in self.gemms:
            gemm.close()
        for slot in slots:
            _ev.free(slot.event)
            if slot.cudnn:
                _cudnn.cudnn_destroy(slot.cudnn)
                slot.cudnn = 0
        while self.conv_plans:
            _cudnn.cudnn_plan_free(self.conv_plans.popitem()[1][0])
        # Events of GpuEvents still alive stay theirs (and leak if never
        # collected before the next release); recycled ones are freed here.
        while self.events:
            _ev.free(self.events.pop())
        # Arrays still alive at exit are freed after the context is popped.  A
        # pool that starts holding blocks then needs a current context and
        # aborts the process; a pool that stops holding frees them directly.
        self.pool.stop_holding()
        self.uploads = self.events = self.pool = None


class GpuEvent:
    """A CUDA event recorded on a handler stream (see ``Handler.record_event``).

    When the object is garbage collected its CUDA event goes back to the
    handler's free list, so recording events in a loop creates none after the
    first few (creating one costs more than recording it)."""

    __slots__ = ("event", "_free")

    def __init__(self, event, free=None):
        self.event = event
        self._free = free

    def __del__(self):
        if self._free is not None:
            self._free.append(self.event)   # no CUDA call: safe at any time

    def query(self):
        """Return True if the work before the event has finished; never blocks."""
        return _ev.query(self.event)

    def synchronize(self):
        """Block the host until the work before the event has finished."""
        _ev.synchronize(self.event)


class _ClosedGemm:
    """Stands in for a closed handler's cuBLAS handles."""

    def __call__(self, *args):
        raise RuntimeError("PyCudaHandler: the handler is closed")

    batched = __call__


class _Executable:
    """A captured CUDA graph, ready to launch, and what it needs alive."""

    def __init__(self, exe, graph, origin, others, cell, draws, keep):
        self.exe, self.graph = exe, graph
        self.origin, self.stream, self.others = origin, origin.stream.handle, others
        self.cell, self.draws = cell, draws    # the graph's random counter, values per replay
        self.cell_value = None                 # what the counter holds after the last replay
        self.keep = keep                       # the recorded calls' arrays, scratch memory
        self._free = _GraphFree(exe, graph)
        weakref.finalize(self, self._free).atexit = False
        cuda_context.at_exit(self._free)

    def free(self):
        self._free()
        self.keep = None


class _GraphFree:
    """Destroys a graph once, on the thread that owns the context."""

    def __init__(self, exe, graph):
        self.handles = (exe, graph)

    def __call__(self):
        if self.handles is not None:
            cuda_context.run_with_context(self._destroy)

    def _destroy(self):
        if self.handles is not None:
            handles, self.handles = self.handles, None
            cuda_graph.destroy(*handles)


@one_call.install
class PyCudaHandler(Handler):
    """Handler whose arrays are C-contiguous ``GPUArray`` on one CUDA device.

    Args:
        dtype: ``np.float32``, ``np.float64``, ``np.float16`` or bfloat16
            (``"bfloat16"`` or ``ml_dtypes.bfloat16``).  The half formats
            are stored in 16 bits and computed in float32: each op rounds
            once on store, reductions accumulate in float32, products run
            on tensor cores through ``cublasGemmEx`` with float32
            accumulation, and convolutions on cuDNN engines that compute in
            float32.
        seed: seed of the counter-based random generator (random if None).
        blas: ``"scikit-cuda"`` (default) or ``"nvmath"``: the cuBLAS binding.
        device: CUDA device index.
        num_stream_groups: see ``Handler``.
        tf32: float32 handlers only (ValueError otherwise): let cuBLAS run
            the float32 products (``dot_mm``, ``dot_add_mm``, batched) on
            TF32 tensor cores, which round each input to 10 explicit mantissa
            bits (a relative error of up to 2^-11 per input, against 2^-24)
            and accumulate in float32.  Off by default: products are then
            float32 throughout.  Convolutions and our own kernels never use
            TF32 either way.  ``h.tf32`` says which.
        deterministic: True (default): the convolutions' backward passes
            run only on cuDNN engines that give the same bits on every run.
            False also allows engines that add partial results with atomics
            (in an order that varies from run to run, so results may differ
            in the last bits), which PyTorch uses by default and which are
            faster for some shapes (small LeNet-style layers, say).  Float32
            and float64 only: the half formats keep deterministic engines.
            Shared by twins; ``h.deterministic`` says which.  Either way
            each convolution's engine is the fastest of those allowed, timed
            at its first call outside a capture, and kept: a handler repeats
            its results bit for bit, but two handlers (or processes) may
            pick different engines where two time alike.

    Raises ImportError if pycuda (or the chosen BLAS package) is not installed
    and RuntimeError if no GPU can be used.

    A handler that is garbage collected (or still alive at exit) releases its
    streams' cuBLAS handles, and its memory pool frees blocks as the arrays it
    allocated die.  Memory ``pin`` page-locked stays locked until the process
    exits (page-locking is per process: every handler sees the same pinned
    ranges).  Host arrays that straddle pinned and ordinary pages, which the
    driver refuses to copy, are copied through a temporary page-locked
    buffer.  Handlers share the device's primary context, so several can
    live side by side.
    """

    array_type = None  # set in __init__ once pycuda is importable
    prefers_graphs = True
    collective_backend = "nccl"   # device arrays: NCCL on the handler's streams
    supported_dtypes = ("float32", "float64", "float16", "bfloat16")

    def __init__(self, dtype=np.float32, seed=None, blas="scikit-cuda", device=0,
                 num_stream_groups=4, tf32=False, deterministic=True):
        super().__init__(dtype, seed, num_stream_groups)
        for name, flag in (("tf32", tf32), ("deterministic", deterministic)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"PyCudaHandler: {name} must be a bool, got {flag!r}")
        #: False if cuDNN may run the convolutions' backward passes on engines
        #: that add with atomics (see Args)
        self.deterministic = bool(deterministic)
        if tf32 and self.dtype != np.float32:
            raise ValueError(f"PyCudaHandler: tf32 applies to float32 products, not {self.dtype}")
        #: True if float32 products may run on TF32 tensor cores (see Args)
        self.tf32 = bool(tf32)
        drv = cuda_context.load_driver()
        from pycuda.gpuarray import GPUArray
        from pycuda.tools import DeviceMemoryPool
        global _launch_kernel, _ev
        _launch_kernel = kernel_loader.launch_function()   # ImportError if not built
        _ev = kernel_loader.events()
        type(self).array_type = GPUArray
        self._drv = drv
        self._device, context = cuda_context.acquire(device)
        # Launches on a thread without a current context make this one current.
        kernel_loader.require().set_context(context.handle)
        self.blas = blas
        sms = self._device.get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)
        self._sms = sms
        self._pool = DeviceMemoryPool()
        # cuBLAS's recommended workspace: 32 MiB on Hopper and later, else 4 MiB.
        major = self._device.compute_capability()[0]
        blas_ws = (32 if major >= 9 else 4) << 20
        # One stream (slot) per group: no op uses more than one.
        self._slots = [_StreamSlot(drv, self._pool, blas_ws) for _ in range(self.num_stream_groups)]
        self._all_slots = self._slots
        self._max_blocks = 16 * sms
        self._rng = [int.from_bytes(os.urandom(8), "little") if seed is None
                     else int(seed) & (2**64 - 1), 0]   # [seed, offset], shared by views
        self._rng_lock = threading.Lock()   # reserves offsets: threads never share draws
        # (kind, format, shapes, params, alignment) -> (cuDNN plan, workspace
        # bytes, engine, its notes), shared by twins (released with the slots)
        self._conv_plans = {}
        self._conv_pins = {}   # convolution -> the engine to use (prefer_conv_engines)
        self._pinned = cuda_transfer.REGISTRY   # page-locking is per process
        self._uploads = []       # the upload stream, created on first prefetch
        self._free_events = []   # CUDA events of collected GpuEvents, shared by views
        # Closed when collected or at exit, whichever comes first.  The exit
        # hook holds the resources only, never the handler, so a program that
        # creates and drops many handlers frees each one's streams and cuBLAS
        # handles as it goes.
        self._resources = _Resources(self)
        weakref.finalize(self, self._resources).atexit = False
        cuda_context.at_exit(self._resources)
        self._bind_format()

    #: What twins share (Handler.twin): the device, memory pool, streams and
    #: their scratch, random counter, cuDNN plans and the release hook.
    _FAMILY = ("blas", "deterministic", "_drv", "_device", "_sms", "_pool", "_slots",
               "_all_slots", "_max_blocks", "_rng", "_rng_lock", "_conv_plans", "_conv_pins",
               "_pinned",
               "_uploads", "_free_events", "_resources")

    def _bind_format(self):
        """What is this handler's own in its format: kernels, cuBLAS objects
        bound to the shared streams, launch plans and the one-call path."""
        self._vec = 16 // self.dtype.itemsize   # elements per 16-byte packet
        self._half = dtypes.is_half(self.dtype)
        #: the format's number for the C code (cuBLAS kinds, cuDNN formats)
        self._format = KINDS[dtypes.short_name(self.dtype)]
        #: bytes of the compute format (float32 for the halves: sum partials)
        self._compute_itemsize = dtypes.compute_dtype(self.dtype).itemsize
        self._sum_plans = {}
        self._sum_launches = {}  # checked sum_t combinations for OneCall.sum (see sum_t)
        self._grids = {}         # elements -> blocks, for _grid
        self._load_kernels()
        self._gemms = [make_gemm(self.blas, self.dtype, s.stream, self.tf32) for s in self._slots]
        for s, gemm in zip(self._slots, self._gemms):
            gemm.set_workspace(int(s.blas_work), s.blas_bytes)
        self._resources.gemms += self._gemms
        self._slot, self._gemm = self._slots[0], self._gemms[0]
        self._one_call = one_call.make(self, self._slot, self._gemm, _BLOCK, _SMALL_GEMM_OUT,
                                       _SMALL_GEMM_K)

    def _make_twin(self, dtype):
        if self._resources.slots is None:
            raise RuntimeError("PyCudaHandler: the handler is closed")
        _enter()
        twin = object.__new__(type(self))
        Handler.__init__(twin, dtype, self.seed, self.num_stream_groups)
        for name in self._FAMILY:
            setattr(twin, name, getattr(self, name))
        twin.tf32 = False   # an option of the handler made with it (float32 only)
        twin._bind_format()
        return twin

    @property
    def stream(self):
        """The pycuda ``Stream`` this handler (or view) issues its ops on."""
        return self._slot.stream

    def gemm_raw(self):
        """The bare cuBLAS GEMM callable bound to this group's stream (column-major
        cuBLAS convention, see ``handlers.cuda.blas``); for benchmarks and interop."""
        return self._gemm

    _VIEW_ATTRS = Handler._VIEW_ATTRS + ("_slot", "_gemm", "_one_call")

    def _make_view(self, k):
        view = super()._make_view(k)
        view._slot, view._gemm = self._slots[k], self._gemms[k]
        if self._closed_box[0]:   # close() makes the views it lacks: their cuBLAS is gone,
            view._one_call = one_call.Declined()   # and the Python path's hooks raise
        else:
            view._one_call = one_call.make(self, view._slot, view._gemm, _BLOCK,
                                           _SMALL_GEMM_OUT, _SMALL_GEMM_K)
        return view

    # kernels ------------------------------------------------------------------
    def _load_kernels(self):
        # Every kernel of the op table, with its argument format for this dtype.
        # Scalars (T in a format) are passed in the compute format: float for
        # the halves and float32, double for float64.
        suf = dtypes.short_name(self.dtype)
        T = "d" if self.dtype == np.float64 else "f"
        self._k = {name: kernel_loader.function(file, name, suf, fmt.replace("T", T))
                   for name, (file, fmt) in optable.KERNELS.items()}
        # The halves' later sum passes read float32 partial results: the
        # float32 sum kernels (_sum_kernels).
        self._k32 = {name: kernel_loader.function(file, name, "f32", fmt.replace("T", "f"))
                     for name, (file, fmt) in optable.KERNELS.items()
                     if self._half and file == "reduce"}

    def _grid(self, n):
        """Blocks for a grid-stride kernel over n elements (VEC per thread)."""
        grid = self._grids.get(n)
        if grid is None:   # cached: min/max calls cost ~0.2 us on a hot path
            per = _BLOCK * self._vec
            grid = self._grids[n] = max(1, min((n + per - 1) // per, self._max_blocks))
        return grid

    def _run(self, kernel, grid, *args):
        """Launch ``kernel`` (a ``kernel_loader.Kernel``) with ``grid`` blocks of
        _BLOCK threads on this group's stream."""
        _launch_kernel(kernel.handle, self._slot.handle, grid, _BLOCK, kernel.fmt, *args)

    def _launch(self, name, n, *args):
        """Launch elementwise kernel ``name`` over ``n`` elements (none if 0)."""
        if n:
            kernel = self._k[name]
            _launch_kernel(kernel.handle, self._slot.handle, self._grids.get(n) or self._grid(n),
                           _BLOCK, kernel.fmt, *args)

    # streams ------------------------------------------------------------------
    # record_event and wait_event are overridden, not only their _ hooks: a
    # stream-group fork is one record and a wait per group, and a Python call
    # less on each is ~0.1-0.2 us per call.
    def record_event(self):
        # Re-recording a recycled event is safe: a stream that waited on it
        # captured its state when the wait was issued.
        free = self._free_events
        ev = free.pop() if free else _ev.new()
        _ev.record(ev, self._slot.handle)
        return GpuEvent(ev, free)

    record_event.__doc__ = Handler.record_event.__doc__
    _record_event = record_event

    def wait_event(self, event):
        if type(event) is not GpuEvent and not isinstance(event, GpuEvent):
            fail_type("wait_event", f"expected an event from record_event, "
                                    f"got {type(event).__name__}")
        _ev.wait(self._slot.handle, event.event)

    wait_event.__doc__ = Handler.wait_event.__doc__
    _wait_event = wait_event

    def _wait_for(self, other):
        # The other stream's own event is enough: a wait captures the event's
        # state when it is issued, so re-recording it later is harmless.
        ev = other._slot.event
        _ev.record(ev, other._slot.handle)
        _ev.wait(self._slot.handle, ev)

    def _synchronize(self):
        _enter()
        self._slot.stream.synchronize()

    def _synchronize_all(self):
        _enter()
        for slot in self._all_slots:
            slot.stream.synchronize()

    def _barrier(self):
        """Make every handler stream wait for the work issued so far on every
        other stream (no host blocking)."""
        slots = self._all_slots
        for s in slots:
            _ev.record(s.event, s.handle)
        for s in slots:
            for t in slots:
                if t is not s:
                    _ev.wait(s.handle, t.event)

    def _ready(self, a):
        # The array was written on this stream: let every other stream wait for it.
        ev = self._slot.event
        _ev.record(ev, self._slot.handle)
        for s in self._all_slots:
            if s is not self._slot:
                _ev.wait(s.handle, ev)

    # input pipeline -----------------------------------------------------------
    def _upload_stream(self):
        _enter()
        if not self._uploads:
            self._uploads.append(self._drv.Stream(flags=1))
        return self._uploads[0]

    def _transfer(self):
        return cuda_transfer.CudaTransfer(self)

    def _pin(self, array):
        _enter()
        return cuda_transfer.pin(array)

    def _empty_pinned(self, shape):
        _enter()
        return self._drv.pagelocked_empty(shape, self.dtype)

    def _copy_async(self, a, out):
        _enter()
        return cuda_transfer.copy_async(self, a, out)

    # memory -------------------------------------------------------------------
    def _view(self, a, offset, shape):
        if not math.prod(shape):   # pycuda cannot slice or reshape empty arrays
            return self.array_type(shape, self.dtype)
        return super()._view(a, offset, shape)

    def _allocate(self, shape):
        _enter()
        # The pool may hand back memory that queued work on some stream still
        # uses; a barrier orders all later work after it.
        if self._pool.held_blocks:
            self._barrier()
        nbytes = math.prod(shape) * self.dtype.itemsize
        if not nbytes:
            return self.array_type(shape, self.dtype, allocator=self._pool.allocate)
        # gpudata is the plain address and base keeps the pooled block alive:
        # every launch converts each array's gpudata to an address, which
        # costs ~0.3 us per array for pycuda's allocation objects and nothing
        # for an int.  The block is returned to the pool only on the context's
        # thread (see OwnedBlock); blocks dropped elsewhere are returned here.
        cuda_context.release_deferred()
        mem = self._pool.allocate(nbytes)
        return self.array_type(shape, self.dtype, allocator=self._pool.allocate,
                               gpudata=int(mem), base=cuda_context.OwnedBlock(mem))

    def _wrap(self, obj):
        _enter()
        op = "create_from_device_array"
        cai = getattr(obj, "__cuda_array_interface__", None)
        if cai is None:
            fail_type(op, f"expected an object with __cuda_array_interface__, "
                          f"got {type(obj).__name__}")
        shape, dtype = tuple(cai["shape"]), np.dtype(cai["typestr"])
        if dtype != self.dtype:
            fail_type(op, f"expected dtype {self.dtype}, got {dtype} (shape {shape})")
        strides = cai.get("strides")
        if strides is not None:
            expect = dtype.itemsize
            for dim, stride in zip(reversed(shape), reversed(tuple(strides))):
                if dim > 1 and stride != expect:
                    raise ValueError(f"{op}: array of shape {shape} with strides "
                                     f"{tuple(strides)} is not C-contiguous")
                expect *= dim
        if cai["data"][1]:
            raise ValueError(f"{op}: the array is read-only (its __cuda_array_interface__ "
                             f"says so); ops write their outputs in place, so a handler "
                             f"array must be writeable")
        if cai.get("stream") is not None:
            # The producer names a stream we cannot wait on from pycuda
            # without wrapping it; a device synchronize orders its work first.
            self._drv.Context.synchronize()
        return self.array_type(shape, dtype, gpudata=int(cai["data"][0]), base=obj)

    def _fill(self, a, value):
        _enter()
        self._launch("fill", a.size, a.gpudata, value, a.size)

    def _set_from_numpy(self, a, arr):
        _enter()
        if a.size:
            cuda_transfer.host_copy_to_device(self, a.gpudata, arr, self._slot.stream)

    def _get_numpy_copy(self, a):
        _enter()
        out = np.empty(a.shape, self.dtype)
        if a.size:
            self._synchronize_all()
            finish = cuda_transfer.device_copy_to_host(self, out, a.gpudata, self._slot.stream)
            self._slot.stream.synchronize()
            if finish is not None:
                finish()
        return out

    def _copy_to(self, src, dest):
        _enter()
        if src.size and int(src.gpudata) != int(dest.gpudata):
            self._drv.memcpy_dtod_async(dest.gpudata, src.gpudata, src.nbytes,
                                        self._slot.stream)

    def _overlaps(self, a, b):
        if not a.size or not b.size:
            return False
        pa, pb = int(a.gpudata), int(b.gpudata)
        return pa < pb + b.nbytes and pb < pa + a.nbytes

    def _span(self, a):
        if not a.size:
            return 0, 0
        start = int(a.gpudata)
        return start, start + a.nbytes

    # BLAS ---------------------------------------------------------------------
    def _dot(self, a, b, out, transa, transb, beta):
        _enter()
        if len(out.shape) == 3:
            return self._dot_batched(a, b, out, transa, transb, beta)
        m, n = out.shape
        k = a.shape[0] if transa else a.shape[1]
        if not m or not n:
            return
        if not k:
            if beta == 0.0:
                self._fill(out, 0.0)
            return
        if m * n <= _SMALL_GEMM_OUT and k <= _SMALL_GEMM_K:
            self._run(self._k["small_gemm"], -(-m * n // _BLOCK), a.gpudata, b.gpudata,
                      out.gpudata, m, n, k, transa, transb, beta != 0.0)
            return
        # Row-major out = op(a) op(b) is column-major out^T = op(b)^T op(a)^T:
        # swap the operands, keep each one's transpose flag.
        if beta != 0.0 and self._half:
            return self._dot_add_half(out, lambda tmp: self._gemm(
                int(transb), int(transa), n, m, k, 1.0, b.gpudata, b.shape[1], a.gpudata,
                a.shape[1], 0.0, tmp, n, out_f32=True))
        self._gemm(int(transb), int(transa), n, m, k, 1.0,
                        b.gpudata, b.shape[1], a.gpudata, a.shape[1],
                        beta, out.gpudata, n)

    def _dot_add_half(self, out, product):
        """dot_add_mm in a half format with one rounding: ``product(address)``
        writes op(a) op(b) in float32 there (this stream's workspace), then
        one kernel adds it to out.  cuBLAS's own beta = 1 with a half output
        rounded the product before adding it (seen on an H200, batched and
        not), which the contract's single rounding rules out."""
        tmp = self._slot.workspace(out.size * 4)
        product(int(tmp))
        self._launch("add_compute", out.size, tmp, out.gpudata, out.size)

    def _dot_batched(self, a, b, out, transa, transb, beta):
        """dot_mm/dot_add_mm with out (batch, m, n): a and b are 3-D or one of
        them is 2-D, shared by the whole batch (checked by the shape rule)."""
        batch, m, n = out.shape
        k = a.shape[-2] if transa else a.shape[-1]
        if not batch or not m or not n:
            return
        if not k:
            if beta == 0.0:
                self._fill(out, 0.0)
            return
        if len(b.shape) == 2 and not transa:
            # A stack of untransposed a times one shared b is one tall product,
            # (batch * m, k) @ op(b), in C order: the 2-D path (and its choice
            # of kernel) on 2-D views.
            return self._dot(a.reshape(batch * m, k), b, out.reshape(batch * m, n), False,
                             transb, beta)
        # As in _dot, each row-major product is the column-major op(b_i)^T op(a_i)^T:
        # operands swapped, flags kept.  Matrix i of an operand starts stride * i
        # elements in; a 2-D operand has stride 0, the same matrix for every i.
        def product(c, beta, out_f32):
            self._gemm.batched(int(transb), int(transa), n, m, k, 1.0,
                                    b.gpudata, b.shape[-1], k * n if len(b.shape) == 3 else 0,
                                    a.gpudata, a.shape[-1], m * k if len(a.shape) == 3 else 0,
                                    beta, c, n, m * n, batch, out_f32=out_f32)
        if beta != 0.0 and self._half:
            return self._dot_add_half(out, lambda tmp: product(tmp, 0.0, True))
        product(out.gpudata, beta, False)

    def _axpby(self, alpha, x, beta, y):
        if type(alpha) is float and type(beta) is float:
            self._launch("axpby", y.size, alpha, x.gpudata, beta, y.gpudata, y.size)
            return
        # Device scalars: pass their address, and 0 as the (unused) value.
        ap, alpha = (0, alpha) if type(alpha) is float else (alpha.gpudata, 0.0)
        bp, beta = (0, beta) if type(beta) is float else (beta.gpudata, 0.0)
        self._launch("axpby_dev", y.size, ap, alpha, x.gpudata, bp, beta, y.gpudata, y.size)

    # optimizers ---------------------------------------------------------------
    def _adam_update(self, g, lr, beta1, beta2, eps, weight_decay, step, m, v, p, decoupled,
                     gate):
        _enter()
        n = p.size
        # A device scalar lr or gate: its address, and 0 as the (unused) value.
        lr_p, lr = (0, lr) if type(lr) is float else (lr.gpudata, 0.0)
        gate_p, gate = (0, gate) if type(gate) is float else (gate.gpudata, 0.0)
        arrays = [x.gpudata if n else 0 for x in (m, v, p, g)]   # empty arrays have no memory
        # At least one block even for n == 0: the kernel's last block advances
        # step.  It counts finished blocks in this stream's counter (kernels
        # leave the counters zero), so launches on one stream never share it
        # while running.
        self._run(self._k["adam"], self._grid(n), arrays[3], lr_p, lr, beta1, beta2, eps,
                  weight_decay, step.gpudata, arrays[0], arrays[1], arrays[2], n,
                  int(decoupled), self._slot.counters(1), gate_p, gate)

    def _scale_finite(self, a, factor, flag):
        _enter()
        factor_p, factor = (0, factor) if type(factor) is float else (factor.gpudata, 0.0)
        self._launch("fill", 1, flag.gpudata, 1.0, 1)   # the kernel only ever stores 0 there
        self._launch("scale_finite", a.size, a.gpudata, factor_p, factor, flag.gpudata, a.size)

    def _update_loss_scale(self, flag, state, interval, max_scale):
        _enter()
        # one thread does the work (the kernel returns on the others)
        self._run(self._k["loss_scale"], 1, flag.gpudata, state.gpudata, interval, max_scale)

    # reduction ----------------------------------------------------------------
    def sum_t(self, a, axis, out):
        if self._one_call.sum(self._sum_launches, a, axis, out):
            return
        Handler.sum_t(self, a, axis, out)   # checks (raising on bad input), plans, launches
        if shape_rules.plain_axis(axis):
            self._remember_sum(a, axis, out)

    sum_t.__doc__ = Handler.sum_t.__doc__

    def _remember_sum(self, a, axis, out):
        """Store the launch of a checked sum_t combination for the one-call path,
        or None if it stays in Python (nothing to launch, or a chunked plan,
        which uses this group's workspace); once per combination."""
        aligned = int(a.gpudata) % 16 == 0 if a.size else True
        key = (a.shape, axis, out.shape, aligned)
        if key in self._sum_launches:
            return
        checked_axis = self._sum_shapes[(a.shape, axis, out.shape)]
        # One plan for the whole sum: an int axis, None, or a tuple summed by
        # sum_mid in one pass (other tuples take several passes: no plan here).
        plan = self._sum_plans.get((a.shape, checked_axis, aligned))
        launch = None
        if plan and plan.launch is not None and not plan.counters:
            first = plan.launch
            fn = self._k[first.kernel]
            launch = (fn.handle, first.grid, fn.fmt, first.args, first.block)
        self._sum_launches[key] = launch

    def _cast_t(self, src, dst):
        if src.dtype == self.dtype:
            self._copy_to(src, dst)
        elif dst.size:
            _enter()
            self._launch("cast_from_" + dtypes.short_name(src.dtype), dst.size, src.gpudata,
                         dst.gpudata, dst.size)

    def _transpose_m(self, a, out):
        rows, cols = a.shape
        tiles = -(-rows // 32) * -(-cols // 32)
        if tiles:
            _enter()
            self._run(self._k["transpose"], min(tiles, 16 * self._sms), a.gpudata, out.gpudata,
                      rows, cols)

    def _cut(self, whole, first, second, axis, into):
        """concat_t (``into``) or split_t: each piece is a block of columns of
        the (outer, length * inner) view of the whole, copied by copy2d."""
        _enter()
        outer = math.prod(whole.shape[:axis])
        inner = math.prod(whole.shape[axis + 1:])
        wa, wb = first.shape[axis] * inner, second.shape[axis] * inner
        for piece, width, at in ((first, wa, 0), (second, wb, wa)):
            if into:   # piece -> whole
                self._launch("copy2d", outer * width, piece.gpudata, whole.gpudata, outer, width,
                             width, 0, wa + wb, at)
            else:      # whole -> piece
                self._launch("copy2d", outer * width, whole.gpudata, piece.gpudata, outer, width,
                             wa + wb, at, width, 0)

    def _concat_t(self, a, b, axis, out):
        self._cut(out, a, b, axis, True)

    def _split_t(self, a, axis, out_a, out_b):
        self._cut(a, out_a, out_b, axis, False)

    _EXTREME_KINDS = {"max": 0, "min": 1, "argmax": 2}

    def _extreme_t(self, kind, a, axis, out):
        _enter()
        outer, n, inner = reductions.sum_view(a.shape, axis)
        if not outer * inner:
            return
        code = self._EXTREME_KINDS[kind]
        plan = reductions.plan_extreme(outer, n, inner, self.dtype.itemsize, self._sms)
        if plan.rows:
            self._run(self._k["extreme_rows"], plan.grid, a.gpudata, out.gpudata, outer, n, code)
            return
        ws = wi = 0
        if plan.chunks > 1:   # partial extrema and their indices in this stream's workspace
            ws = self._slot.workspace(plan.workspace)
            wi = int(ws) + plan.index_at
            wi += -wi % 8
        self._run(self._k["extreme_cols"], plan.grid, a.gpudata, out.gpudata, ws, wi, outer, n,
                  inner, plan.chunk, plan.chunks, code)
        if plan.chunks > 1:
            self._run(self._k["extreme_join"], plan.join_grid, ws, wi, out.gpudata,
                      outer * inner, plan.chunks, code)

    def _sum_t(self, a, axis, out):
        if type(axis) is tuple:
            return self._sum_axes(a, axis, out)
        self._sum_pass(a, axis, out)

    def _sum_pass(self, a, axis, out, form="TT"):
        """One sum over ``axis`` (an int or None).  ``form`` says the formats
        of input and output (_sum_kernels): "TT" the handler's both; for the
        halves "TC" writes float32 and "CC" reads and writes float32."""
        _enter()
        key = (a.shape, axis, int(a.gpudata) % 16 == 0 if a.size else True)
        if form != "TT":   # TT keeps the 3-tuple: OneCall.sum's plans are keyed so
            key += (form,)
        plan = self._sum_plans.get(key)
        if plan is None:
            suffix, width = self._sum_kernels(form)
            plan = self._sum_plans[key] = reductions.plan_sum(
                *reductions.sum_view(a.shape, axis), key[2], width, self._sms, suffix)
        self._run_sum(plan, a, out, form)

    def _sum_kernels(self, form):
        """(name suffix, elements per 16-byte packet of the input) of the
        sums of ``form``: "TT" and "TC" read the handler's format and write
        it ("TT") or its compute format ("TC", the _wide kernels); "CC"
        reads and writes float32 (the halves only, from ``_k32``)."""
        if form == "CC":
            return "", 4
        return "_wide" if form == "TC" else "", self._vec

    def _mid_plan(self, a, axes, runs, form="TT"):
        """The plan of the sum over ``runs`` in one pass (sum_mid, for
        _run_sum) where they are one leading and one trailing run and the
        kernel takes the shape, else False.  ``form`` as _sum_pass's."""
        if not (len(runs) == 2 and runs[0][0] == 0 and runs[1][1] == a.ndim):
            return False
        _enter()
        key = (a.shape, axes, int(a.gpudata) % 16 == 0)   # a tuple axis: no clash
        if form != "TT":
            key += (form,)
        plan = self._sum_plans.get(key)
        if plan is None:
            suffix, width = self._sum_kernels(form)
            plan = self._sum_plans[key] = reductions.plan_mid(
                a.shape, runs[0][1], runs[1][0], key[2], width, self._sms, suffix) or False
        return plan

    def _sum_passes(self, a, runs, out=None):
        """The sum over separate runs of axes, last run first, one pass each
        through this stream's two intermediate buffers (alternating: a pass
        never writes what it reads), the last pass into ``out``.  Without
        ``out`` (the halves' "wide" sum) every pass writes float32, the last
        one too, into an intermediate buffer, which is returned for the one
        rounding."""
        wide = out is None
        shape, src, form = list(a.shape), a, "TC" if wide else "TT"
        for i, (lo, hi) in enumerate(reversed(runs)):
            merged = shape[:lo] + [math.prod(shape[lo:hi])] + shape[hi:]
            shape = shape[:lo] + shape[hi:]
            if i == len(runs) - 1 and not wide:
                dst = out
            else:
                dst = self._slot.intermediate(i % 2, tuple(shape),
                                              np.dtype(np.float32) if wide else self.dtype)
            dst = dst.reshape(tuple(shape))
            self._sum_pass(src.reshape(tuple(merged)), lo, dst, form)
            src, form = dst, "CC" if wide else form
        return src

    def _sum_wide(self, a, axis):
        """The sum of non-empty ``a`` over ``axis`` (None, an int or a sorted
        tuple) in float32, in this stream's intermediate buffers: mean_t's in
        the half formats, whose result is then scaled and rounded once (the
        "narrow" kernel)."""
        _enter()
        axes = (tuple(range(a.ndim)) if axis is None else axis if type(axis) is tuple
                else (axis,))
        runs = reductions.runs(axes)
        plan = self._mid_plan(a, axes, runs, "TC")
        if not plan:
            return self._sum_passes(a, runs)
        kept = tuple(n for i, n in enumerate(a.shape) if i not in axes)
        dst = self._slot.intermediate(0, kept, np.dtype(np.float32))
        self._run_sum(plan, a, dst, "TC")
        return dst

    def _mean_t(self, a, axis, out):
        n = shape_rules.reduced_size(a.shape, axis)
        if not self._half or n <= 1 or not out.size:
            return Handler._mean_t(self, a, axis, out)
        # The halves: the float32 sum scaled by 1 / n, rounded once.
        wide = self._sum_wide(a, axis)
        self._launch("narrow", out.size, wide.gpudata, 1.0 / n, out.gpudata, out.size)

    def _run_sum(self, plan, a, out, form="TT"):
        """Run a ``reductions.SumPlan`` of ``form`` (_sum_pass's)."""
        first = plan.launch
        if first is None:          # nothing to add up
            if plan.zero:
                self._fill(out, 0.0)
            return
        fn = (self._k32 if form == "CC" else self._k)[first.kernel]
        ws = cnt = 0
        if plan.counters:          # chunked: partials and per-stream counters
            ws = self._slot.workspace(plan.workspace * self._compute_itemsize)   # float partials
            cnt = self._slot.counters(plan.counters)
        _launch_kernel(fn.handle, self._slot.handle, first.grid, first.block, fn.fmt, a.gpudata,
                       ws, out.gpudata, cnt, *first.args)

    def _sum_axes(self, a, axes, out):
        """sum_t over a sorted tuple of axes.  Each run of adjacent axes is
        one axis of a reshaped view, so (2, 3) of NCHW is one pass; separate
        runs are summed last run first, each pass into this stream's
        intermediate buffers, the last into ``out``."""
        if not a.size:   # nothing to add up (and empty GPUArrays cannot be reshaped)
            if out.size:
                self._fill(out, 0.0)
            return
        runs = reductions.runs(axes)
        plan = self._mid_plan(a, axes, runs)
        if plan:
            self._run_sum(plan, a, out)
            return
        if self._half and len(runs) > 1:   # passes in float32, one rounding at the end
            _enter()
            wide = self._sum_passes(a, runs)
            self._launch("narrow", out.size, wide.gpudata, 1.0, out.gpudata, out.size)
            return
        self._sum_passes(a, runs, out)

    # elementwise --------------------------------------------------------------
    # The ops of one_call.OPS reach this only when
    # OneCall declined their arguments.
    def _elementwise(self, op, *args):
        n = args[op.out].size
        self._launch(op.kernel, n, *[a if type(a) is float else a.gpudata for a in args], n)

    def _fused(self, op, *args):
        n, values = self._fused_arguments(op, args)
        self._launch(op, n, *values)

    def _fused_arguments(self, op, args):
        """(elements, kernel arguments) of fused op ``op`` on the checked
        ``args``.  Its kernel is generated, compiled and loaded at the first
        call (once per process; pycuda's disk cache skips nvcc in later
        processes), then kept under the op in _k."""
        out = args[op.row.out]
        n = out.size
        if n and op not in self._k:
            self._k[op] = kernel_loader.source_function(
                fused_source.kernel_source(op, self.dtype, _BLOCK),
                fused_source.kernel_name(op, self.dtype),
                fused_source.kernel_format(op, self.dtype))
        values = []
        for p, a in zip(op.params, args):
            if p not in op.scalars:
                values.append(a.gpudata)
            elif type(a) is float:
                values += (0, a)                # a number: no address
            else:
                values += (a.gpudata, 0.0)      # a device scalar, read by the kernel
        return n, (*values, n, out.shape[-1] if out.shape else 1)

    def _bind_fused(self, op, args, kwargs):
        # The checks and the argument list once; each call is then a launch,
        # or, while a capture records, the _fused hook that it shadows.
        checked = op._checks(self, *args, **kwargs)
        n, values = self._fused_arguments(op, checked)
        # Once the handler is closed, a call goes to the _fused hook, whose
        # stand-in raises (handlers.closed), as the unbound op would.
        capturing, closed = self._capture_box, self._closed_box
        if not n:
            def nothing():
                if closed[0]:
                    self._fused(op, *checked)
            return nothing
        kernel, grid, launch = self._k[op], self._grid(n), _launch_kernel

        def call():
            if capturing[0] is None and not closed[0]:
                launch(kernel.handle, self._slot.handle, grid, _BLOCK, kernel.fmt, *values)
            else:
                self._fused(op, *checked)
        return call

    def _broadcast_t(self, a, axis, out):
        s = out.shape
        outer = int(np.prod(s[:axis], dtype=np.int64))
        inner = int(np.prod(s[axis + 1:], dtype=np.int64))
        self._launch("broadcast", out.size, a.gpudata, out.gpudata, outer, s[axis], inner)

    def _mv(self, name, m, v, out, orientation):
        side = "row" if orientation == 0 else "col"
        rows, cols = m.shape
        self._launch(f"mv_{name}_{side}", out.size, m.gpudata, v.gpudata, out.gpudata,
                     rows, cols)

    # rows -------------------------------------------------------------------
    def _softmax_m(self, m, out):
        rows, cols = m.shape
        if rows and cols:
            # The kernel strides over rows, so a grid that fills the GPU is
            # enough (and much faster for short rows than a block per row).
            self._run(self._k["softmax_rows"], min(rows, 16 * self._sms),
                      m.gpudata, out.gpudata, rows, cols)

    # indexing and masks -------------------------------------------------------
    def _index_m_by_v(self, m, v, out):
        rows, cols = m.shape
        # With no columns m has no memory (gpudata is None, which the launch
        # refuses); no index is then in [0, 0), so the kernel writes NaN for
        # every row and never reads m: any address does.
        self._launch("index_m_by_v", rows, m.gpudata if m.size else 0, v.gpudata, out.gpudata,
                     rows, cols)

    def _binarize_v(self, v, out):
        rows, cols = out.shape
        self._launch("binarize_v", out.size, v.gpudata, out.gpudata, rows, cols)

    def _gather_rows(self, table, idx, out):
        n, d = out.shape
        # An empty table (vocab 0) has no device pointer; every index is then
        # invalid and the kernel never reads it.
        self._launch("gather_rows", out.size, table.gpudata if table.size else 0, idx.gpudata,
                     out.gpudata, n, table.shape[0], d)

    def _scatter_add_rows(self, a, idx, out):
        n, d = a.shape
        if n and out.size:   # nothing to add, or no row to add into (every index invalid)
            # One thread per column (see rows.cu): the grid covers d, not n * d.
            grid = -(-d // _BLOCK)
            if not self._half:
                self._run(self._k["scatter_add_rows"], grid, a.gpudata, idx.gpudata,
                          out.gpudata, n, out.shape[0], d)
                return
            # The halves add in a float copy of out and round once at the end
            # (as NumPy's float32 ufunc.at on the widened arrays, bit for bit).
            wide = self._slot.workspace(out.size * 4)
            self._launch("widen", out.size, out.gpudata, wide, out.size)
            self._run(self._k["scatter_add_rows_wide"], grid, a.gpudata, idx.gpudata, wide, n,
                      out.shape[0], d)
            self._launch("narrow", out.size, wide, 1.0, out.gpudata, out.size)

    def _normalize_rows(self, x, eps, xhat, rstd):
        rows, d = x.shape
        if rows:   # a warp per row: 256-thread blocks, 8 rows each (see rows.cu)
            self._run(self._k["normalize_rows"], min((rows + 7) // 8, 16 * self._sms),
                      x.gpudata, eps, xhat.gpudata, rstd.gpudata, rows, d)

    def _normalize_rows_backward(self, xhat, rstd, g, dx):
        rows, d = xhat.shape
        if rows:
            self._run(self._k["normalize_rows_backward"], min((rows + 7) // 8, 16 * self._sms),
                      xhat.gpudata, rstd.gpudata, g.gpudata, dx.gpudata, rows, d)

    def _is_fully_finite(self, a):
        _enter()
        if not a.size:
            return True
        slot = self._slot
        self._drv.memset_d32_async(slot.flag, 0, 1, slot.stream)
        self._launch("all_finite", a.size, a.gpudata, a.size, slot.flag)
        self._drv.memcpy_dtoh_async(slot.host_flag, slot.flag, slot.stream)
        slot.stream.synchronize()
        return slot.host_flag[0] == 0

    # convolution and pooling ----------------------------------------------------
    _CONV_KINDS = {"forward": 0, "backward_data": 1, "backward_filter": 2}

    def _conv2d(self, kind, a, b, out, stride, padding, dilation):
        _enter()
        code = self._CONV_KINDS[kind]
        slot = self._slot
        handle = slot.cudnn or self._cudnn_handles()
        # the largest power of two up to 16 that divides every address: cuDNN
        # engines may rely on the alignment a plan declares
        bits = int(a.gpudata) | int(b.gpudata) | int(out.gpudata) | 16
        align = bits & -bits
        key = (code, self._format, a.shape, b.shape, out.shape, stride, padding, dilation, align)
        plan = self._conv_plans.get(key)
        if plan is None:
            # (x, w, y) shapes: (a, b, out) forward, (out, b, a) backward data,
            # (a, out, b) backward filter.
            x, w, y = ((a.shape, b.shape, out.shape), (out.shape, b.shape, a.shape),
                       (a.shape, out.shape, b.shape))[code]
            # A stride past the padded input changes nothing (one output row)
            # but could overflow cuDNN's int: clamp it.
            sh = min(stride[0], x[2] + 2 * padding[0])
            sw = min(stride[1], x[3] + 2 * padding[1])
            dims = (*x, w[0], w[2], w[3], y[2], y[3], sh, sw, *padding, *dilation)
            plan = self._conv_plans[key] = self._plan_conv(code, align, dims, a, b, out, handle,
                                                           self._conv_pins.get(key[:-1]))
        ptr, nbytes = plan[:2]
        ws = int(slot.cudnn_workspace(nbytes)) if nbytes else 0
        _cudnn.cudnn_conv_run(ptr, handle, a.gpudata, b.gpudata, out.gpudata, ws)

    def _plan_conv(self, code, align, dims, a, b, out, handle, pin=None):
        """(plan, workspace bytes, engine, its notes) of one convolution.

        The candidates: cuDNN's engines that the policy allows
        (_refused_notes, _DENIED_ENGINES), in its heuristics' order, up to
        _CONV_CANDIDATES.  Each runs on this call's arrays (twice to warm up,
        then three times between events) and the fastest is kept; the others
        are freed.  Timing, because the heuristics rank some accurate engines
        behind far slower ones: with engine 17 denied, backward filter of a
        3x3x64 ResNet layer (batch 64, 56x56, float32) fell to engine 1 at
        1.28 ms, where FFT engine 18, ranked last, took 0.54 ms with a
        smaller error (an H200, November 2026).  Inside a capture nothing can
        be timed: the heuristics' first pick is kept.  Either way the plan
        lasts for the handler's life and its twins share it, so captured and
        eager steps run the same engines.  Engines compiled at runtime
        (seconds at first use) are a last resort: only when no other engine
        qualifies, and then the first alone.  ``pin``: an engine to take
        without timing where it is among the candidates (the engine another
        process chose: ``prefer_conv_engines``)."""
        slot = self._slot
        refused = _refused_notes(code != 0, self._half, self.deterministic)
        denied, found = list(_DENIED_ENGINES[code]), []

        def plan(rtc):
            return _cudnn.cudnn_conv_plan(handle, code, self._format, _CUDNN_WORKSPACE_LIMIT,
                                          align, refused, tuple(denied), int(rtc), *dims)
        timed = not cuda_graph.is_capturing(slot.handle)
        while len(found) < (_CONV_CANDIDATES if timed or pin is not None else 1):
            got = plan(rtc=False) or (None if found else plan(rtc=True))
            if got is None:
                break
            ptr, engine, notes, nbytes = got
            found.append((ptr, nbytes, engine, notes))
            denied.append(engine)
            if engine == pin:
                break
        pinned = [cand for cand in found if pin is not None and cand[2] == pin]
        if not found:
            raise RuntimeError(
                f"PyCudaHandler: cuDNN offers no engine for this convolution (pass {code}, "
                f"format {self.dtype.name}) within {_CUDNN_WORKSPACE_LIMIT} bytes of workspace "
                f"that is free of the numerical notes {cudnn_note_names(refused)} and not "
                f"one of the engines {list(_DENIED_ENGINES[code])}")
        best = pinned[0] if pinned else found[0]
        try:
            if len(found) > 1 and timed and not pinned:
                times = []
                start, end = self._drv.Event(), self._drv.Event()
                for ptr, nbytes, _, _ in found:
                    ws = int(slot.cudnn_workspace(nbytes)) if nbytes else 0
                    for k in range(5):
                        if k == 2:
                            start.record(slot.stream)
                        _cudnn.cudnn_conv_run(ptr, handle, a.gpudata, b.gpudata, out.gpudata, ws)
                    end.record(slot.stream)
                    end.synchronize()
                    times.append(start.time_till(end))
                best = found[times.index(min(times))]
        except BaseException:
            for cand in found:
                _cudnn.cudnn_plan_free(cand[0])
            raise
        for cand in found:
            if cand is not best:
                _cudnn.cudnn_plan_free(cand[0])
        return best

    def conv_engines(self):
        """The cuDNN engine chosen for each convolution planned so far, as
        plain values: ``[pass, format, x, w, y, stride, padding, dilation,
        engine]`` per convolution (pass 0 forward, 1 backward data, 2
        backward filter; the arrays' shapes).  The choice is timed, so two
        processes may choose differently, and differ in the last bits:
        ``prefer_conv_engines`` in another process makes it choose these
        (``Trainer.save`` keeps them, so that a resumed run repeats the
        saved run bit for bit)."""
        return [[key[0], key[1], *(list(k) for k in key[2:-1]), plan[2]]
                for key, plan in list(self._conv_plans.items())]

    def prefer_conv_engines(self, engines):
        """Plan each convolution listed in ``engines`` (a ``conv_engines()``
        list) with its engine, where cuDNN offers it among the candidates,
        instead of timing them; convolutions planned already keep their
        plans.  Shared by the views and twins.  ValueError for a list that
        is not of ``conv_engines``, with nothing changed."""
        pins = {}
        try:
            for e in engines:
                code, fmt, *shapes, engine = e
                key = (int(code), int(fmt), *(tuple(int(v) for v in s) for s in shapes))
                if len(key) != 8:
                    raise ValueError(f"{len(key)} fields")
                pins[key] = int(engine)
        except (TypeError, ValueError) as err:
            raise ValueError(f"prefer_conv_engines: expected a list from conv_engines(), "
                             f"got {engines!r:.200} ({err})") from None
        self._conv_pins.update(pins)

    def _cudnn_handles(self):
        """Load cuDNN and make every stream's handle (once, so that the first
        convolution, rather than one inside a later capture, makes them);
        return this group's."""
        if self._resources.slots is None:
            raise RuntimeError("PyCudaHandler: the handler is closed")
        ext = _load_cudnn()
        for s in self._all_slots:
            if not s.cudnn:
                s.cudnn = ext.cudnn_create(s.handle)
        return self._slot.cudnn

    _POOL_MODES = {"max": 0, "avg": 1, "max_backward": 0, "avg_backward": 1}

    def _pool2d(self, kind, src, dst, argmax, window, stride, padding):
        backward = kind.endswith("backward")
        big, small = (dst, src) if backward else (src, dst)
        n, c, h, w = big.shape
        p, q = small.shape[2:]
        # A stride past the padded input changes nothing (P or Q is then 1)
        # but would not fit the kernel's int.
        sh, sw = min(stride[0], h + 2 * padding[0]), min(stride[1], w + 2 * padding[1])
        am = 0 if argmax is None else argmax.gpudata
        total = dst.size
        grid = max(1, min(-(-total // _BLOCK), self._max_blocks))
        arrays = (src.gpudata, am, dst.gpudata) if backward else (src.gpudata, dst.gpudata, am)
        self._run(self._k["pool_bwd" if backward else "pool_fwd"], grid, *arrays, n * c, h, w,
                  p, q, *window, sh, sw, *padding, self._POOL_MODES[kind])

    # randomness ---------------------------------------------------------------
    def _next_offset(self, n):
        """(offset, base) of the next ``n`` random values: eagerly the host's
        counter and no base; inside a capture the offset within the graph's
        draws and the address of the graph's counter (see random.cu)."""
        rec = self._capture_box[0]
        if rec is not None:
            return rec.draw(n), int(rec.backend["rng_cell"])
        with self._rng_lock:
            offset = self._rng[1]
            self._rng[1] += n
        return offset, 0

    def _random_state(self):
        with self._rng_lock:
            seed, offset = self._rng
        return {"generator": "philox4x32-10", "seed": seed, "offset": offset}

    def _set_random_state(self, state):
        seed, offset = state.get("seed"), state.get("offset")
        for name, v in (("seed", seed), ("offset", offset)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2 ** 64:
                raise ValueError(f"set_random_state: {name} must be an int in [0, 2^64), "
                                 f"got {v!r}")
        with self._rng_lock:   # in place: the views and twins share the list
            self._rng[:] = [seed, offset]

    def _fill_gaussian(self, mean, std, out):
        n = out.size
        self._launch("fill_gaussian", n, out.gpudata, n, mean, std, self._rng[0],
                     *self._next_offset(n))

    def _probability_mask(self, mask, p):
        n = mask.size
        self._launch("probability_mask", n, mask.gpudata, n, p, self._rng[0],
                     *self._next_offset(n))

    # graphs -------------------------------------------------------------------
    # The capture runs on this view's stream; groups forked into it add their
    # streams.  Every op then takes its Python path (the one-call C path would
    # launch without the recording seeing its arrays) and is issued on a
    # capturing stream, so the driver records it instead of running it.
    _graph_defers_calls = False

    def _graph_begin(self, rec):
        _enter()
        views = self._family_views()   # a capture records the twins' work too
        slots = self._all_slots
        rec.backend = {
            "one_call": [(v, v._one_call) for v in views],
            # Scratch that ops allocate during the capture belongs to the
            # graph; the slots get their own back at the end (_graph_done).
            "scratch": [(sc, sc.block, sc.nbytes) for s in slots for sc in s.scratches],
            "rng_cell": self._pool.allocate(8),
        }
        cuda_context.capture_began()
        for v in views:
            v._one_call = one_call.Declined()
        try:
            cuda_graph.begin(self._slot.stream.handle)
        except BaseException:
            self._graph_done(rec)
            raise

    def _graph_done(self, rec):
        """Restore what _graph_begin changed; return the scratch the capture
        allocated (the graph keeps it)."""
        cuda_context.capture_ended()
        for v, oc in rec.backend["one_call"]:
            v._one_call = oc
        owned = []
        for sc, block, nbytes in rec.backend["scratch"]:
            if sc.block is not block:
                owned.append(sc.block)
                sc.block, sc.nbytes = block, nbytes
        return owned

    def _graph_end(self, rec):
        _enter()
        stream = self._slot.stream.handle
        cell = rec.backend["rng_cell"]
        try:
            if rec.rng_used:   # last node: move the graph's counter past its draws
                self._run(self._k["rng_advance"], 1, cell, rec.rng_used)
            graph = cuda_graph.end(stream)
        except BaseException:
            cuda_graph.abort(stream)
            self._graph_done(rec)
            raise
        owned = self._graph_done(rec)
        try:
            exe = cuda_graph.instantiate(graph)
        except BaseException:
            cuda_graph.destroy(0, graph)
            raise
        others = [self._slots[g] for g in sorted(rec.groups) if g != rec.origin]
        return _Executable(exe, graph, self._slot, others, cell, rec.rng_used,
                           (rec.calls, owned, [s.blas_work for s in self._all_slots]))

    def _graph_abort(self, rec):
        _enter()
        origin = self._slot
        # Join the branches still capturing first: ending a capture with
        # unjoined work is an error status the driver (and compute-sanitizer)
        # reports, where this abort is an expected path.
        for g in sorted(rec.groups - {rec.origin}):
            s = self._slots[g]
            if cuda_graph.is_capturing(s.handle):
                _ev.record(s.event, s.handle)
                _ev.wait(origin.handle, s.event)
        cuda_graph.abort(origin.stream.handle)
        self._graph_done(rec)

    def _graph_replay(self, exe, graph):
        _enter()
        origin = exe.origin
        # Order the replay after the work issued so far on every group the
        # graph uses, and their later work after it, as for eager ops.
        for s in exe.others:
            _ev.record(s.event, s.handle)
            _ev.wait(origin.handle, s.event)
        if exe.draws:
            with self._rng_lock:
                offset = self._rng[1]
                self._rng[1] = offset + exe.draws
            if exe.cell_value != offset:   # other random work since the last replay
                cuda_graph.set_u64(int(exe.cell), offset, exe.stream)
            exe.cell_value = offset + exe.draws
        cuda_graph.launch(exe.exe, exe.stream)
        if exe.others:
            _ev.record(origin.event, origin.handle)
            for s in exe.others:
                _ev.wait(s.handle, origin.event)

    def _graph_free(self, exe):
        exe.free()

    def _close(self):
        _enter()
        self._resources()
        closed = _ClosedGemm()
        for m in self._twins.values():   # the twins' streams are closed too
            m._gemms = [closed] * len(m._gemms)
        for v in self._family_views():
            v._gemm, v._one_call = closed, one_call.Declined()


def _whole_on_its_stream(hook):
    """``hook`` run holding its stream's lock (``_StreamSlot.lock``), so that
    its launches are not interleaved with another thread's on that stream."""
    @functools.wraps(hook)
    def run(self, *args):
        with self._slot.lock:
            return hook(self, *args)
    return run


for _name in WORK_HOOKS + ("_is_fully_finite",):
    setattr(PyCudaHandler, _name, _whole_on_its_stream(getattr(PyCudaHandler, _name)))
del _name
