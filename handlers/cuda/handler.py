"""PyCudaHandler: the Handler contract on a CUDA GPU with pycuda and cuBLAS.

Arrays are ``pycuda.gpuarray.GPUArray`` backed by a device memory pool.  Every
piece of device work (kernels, fills, copies, cuBLAS) is issued on the
handler's own non-blocking streams, never on the legacy NULL stream, which
would serialise against everything.  Kernels come from ``handlers/cuda/kernels``,
are loaded once per process and launched with one C call through the
``handlers.cuda._launch`` extension, which PyCudaHandler requires (an ImportError
names the fix where it is not built); a failed driver or cuBLAS call raises
``handlers.cuda.kernel_loader.CudaError``.

Products run on a simple kernel (``kernels/small_gemm.cu``) when small
enough that cuBLAS's own host work would dominate, else on cuBLAS through the
chosen binding (``handlers.cuda.products`` decides).

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

from .. import dtypes, optable
from ..base import Handler
from ..checks import fail_type
from ..graphs import WORK_HOOKS
from . import attention as cuda_attention
from . import context as cuda_context
from . import convolution, elementwise, kernel_loader, launch, one_call, products, reductions, rows
from . import graph as cuda_graph
from . import transfer as cuda_transfer
from .blas import KINDS, make_gemm
from .lt import LtProducts
from .resources import ClosedGemm, GpuEvent, Resources, Stream, StreamSlot

_BLOCK = launch.BLOCK
# kernel_loader.launch_function(), bound when the first handler is created:
# launch(kernel.handle, slot.handle, grid, block, kernel.fmt, *args)
_launch_kernel = None
_ev = None       # kernel_loader.events(), bound with _launch_kernel
# Makes the device's context current on the calling thread (once per thread).
# Every hook that calls pycuda or cuBLAS starts with it; the driver calls of
# handlers.cuda._launch (launches, events, graphs, ...) do the same in C.
_enter = cuda_context.enter


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
        # pycuda is the array library (GPUArray and its memory pool, with the
        # context they need: handlers.cuda.context); every other driver call
        # goes through the extension.
        cuda_context.load_driver()   # ImportError or RuntimeError, naming why
        from pycuda.gpuarray import GPUArray
        from pycuda.tools import DeviceMemoryPool
        global _launch_kernel, _ev
        _launch_kernel = kernel_loader.launch_function()   # ImportError if not built
        _ev = kernel_loader.events()
        type(self).array_type = GPUArray
        _, context = cuda_context.acquire(device)
        ext = kernel_loader.require()
        # Launches on a thread without a current context make this one current.
        ext.set_context(context.handle)
        self.blas = blas
        sms = ext.device_attribute(kernel_loader.MULTIPROCESSOR_COUNT, device)
        self._sms = sms
        self._sm_threads = ext.device_attribute(kernel_loader.MAX_THREADS_PER_MULTIPROCESSOR,
                                                device)
        self._l2_bytes = ext.device_attribute(kernel_loader.L2_CACHE_SIZE, device)
        self._pool = DeviceMemoryPool()
        # cuBLAS's recommended workspace: 32 MiB on Hopper and later, else 4 MiB.
        major = ext.device_attribute(kernel_loader.COMPUTE_CAPABILITY_MAJOR, device)
        blas_ws = (32 if major >= 9 else 4) << 20
        # One stream (slot) per group: no op uses more than one.
        scratch = reductions.one_call_scratch(sms, self._sm_threads)
        self._slots = [StreamSlot(self._pool, blas_ws, scratch)
                       for _ in range(self.num_stream_groups)]
        self._all_slots = self._slots
        self._max_blocks = launch.MAX_BLOCKS_PER_SM * sms
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
        self._resources = Resources(self)
        weakref.finalize(self, self._resources).atexit = False
        cuda_context.at_exit(self._resources)
        self._bind_format()

    #: What twins share (Handler.twin): the device, memory pool, streams and
    #: their scratch, random counter, cuDNN plans and the release hook.
    _FAMILY = ("blas", "deterministic", "_sms", "_sm_threads", "_l2_bytes", "_pool", "_slots",
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
        # (kernel handle, block) -> resident blocks per SM (reductions.blocks_per_sm)
        self._occupancy = {}
        # checked combinations of each reduction for OneCall.sum (see reductions.remember)
        self._reduce_launches = {op: {} for op in reductions.ONE_CALL_OPS}
        self._grids = {}         # elements -> blocks, for _grid
        self._dot_plans = {}     # products.dot_key -> products.DotPlan
        self._dot_launches = {}  # the same keys -> the plan's record for OneCall.dot
        self._load_kernels()
        self._gemms = [make_gemm(self.blas, self.dtype, s.stream, self.tf32) for s in self._slots]
        for s, gemm in zip(self._slots, self._gemms):
            gemm.set_workspace(int(s.blas_work), s.blas_bytes)
        self._resources.gemms += self._gemms
        # cuBLASLt, for dot_bias_act: one handle per format (not bound to a
        # stream), on each slot's cuBLAS workspace (ops of a slot run in turn)
        self._lt = LtProducts(dtypes.short_name(self.dtype), self.tf32,
                              self._slots[0].blas_bytes)
        self._resources.gemms.append(self._lt)
        self._slot, self._gemm = self._slots[0], self._gemms[0]
        self._one_call = one_call.make(self, self._slot, self._gemm, _BLOCK)

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
        """The stream this handler (or view) issues its ops on: a
        ``handlers.cuda.resources.Stream`` (``.handle`` is the driver's
        ``CUstream``, for other libraries)."""
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
            view._one_call = one_call.make(self, view._slot, view._gemm, _BLOCK)
        return view

    # kernels ------------------------------------------------------------------
    def _load_kernels(self):
        # Every kernel of the op table, with its argument format for this dtype.
        # Scalars (T in a format) are passed in the compute format: float for
        # the halves and float32, double for float64.  The one place that
        # decides it: OneCall packs each scalar as its kernel's fmt says.
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
        """Blocks for a grid-stride kernel over n elements (VEC per thread):
        the extension's ``grid``, the formula OneCall's launches use."""
        grid = self._grids.get(n)
        if grid is None:   # cached: finding the extension costs ~0.5 us
            grid = self._grids[n] = kernel_loader.extension().grid(
                n, _BLOCK * self._vec, self._max_blocks)
        return grid

    def _run(self, kernel, grid, *args, block=_BLOCK):
        """Launch ``kernel`` (a ``kernel_loader.Kernel``) with ``grid`` blocks of
        ``block`` threads on this group's stream."""
        _launch_kernel(kernel.handle, self._slot.handle, grid, block, kernel.fmt, *args)

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
            self._uploads.append(Stream())
        return self._uploads[0]

    def _transfer(self):
        return cuda_transfer.CudaTransfer(self)

    def _pin(self, array):
        _enter()
        return cuda_transfer.pin(array)

    def _empty_pinned(self, shape):
        _enter()
        return cuda_transfer.empty_pinned(shape, self.dtype)

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
            # The producer names a stream of its own, whose handle may not be
            # ours to wait on; a context synchronize orders its work first.
            kernel_loader.require().context_sync()
        return self.array_type(shape, dtype, gpudata=int(cai["data"][0]), base=obj)

    def _fill(self, a, value):
        _enter()
        self._launch("fill", a.size, a.gpudata, value, a.size)

    def _set_from_numpy(self, a, arr):
        _enter()
        if a.size:
            cuda_transfer.host_copy_to_device(a.gpudata, arr, self._slot.stream)

    def _get_numpy_copy(self, a):
        _enter()
        out = np.empty(a.shape, self.dtype)
        if a.size:
            self._synchronize_all()
            finish = cuda_transfer.device_copy_to_host(out, a.gpudata, self._slot.stream)
            self._slot.stream.synchronize()
            if finish is not None:
                finish()
        return out

    def _copy_to(self, src, dest):
        _enter()
        if src.size and int(src.gpudata) != int(dest.gpudata):
            kernel_loader.require().copy_dtod(int(dest.gpudata), int(src.gpudata), src.nbytes,
                                              self._slot.handle)

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

    # products: handlers.cuda.products
    _dot = products.dot
    _dot_bias_act = products.dot_bias_act

    # elementwise, optimizers and layout: handlers.cuda.elementwise
    _axpby = elementwise.axpby
    _adam_update = elementwise.adam_update
    _scale_finite = elementwise.scale_finite
    _update_loss_scale = elementwise.update_loss_scale
    _cast_t = elementwise.cast_t
    _transpose_m = elementwise.transpose_m
    _permute_t = elementwise.permute_t
    _cut = elementwise.cut
    _concat_t = elementwise.concat_t
    _split_t = elementwise.split_t
    _elementwise = elementwise.elementwise
    _fused = elementwise.fused
    _fused_arguments = elementwise.fused_arguments
    _bind_fused = elementwise.bind_fused
    _broadcast_t = elementwise.broadcast_t
    _mv = elementwise.mv

    # reduction ----------------------------------------------------------------
    # Each op tries the one-call path (a combination seen before), else the
    # contract's checks, the engine's plan and launch, and then remembers it.
    sum_t = reductions.one_call_op("sum_t")
    mean_t = reductions.one_call_op("mean_t")
    max_t = reductions.one_call_op("max_t")
    min_t = reductions.one_call_op("min_t")
    argmax_t = reductions.one_call_op("argmax_t")

    # sums, means and extrema: the reduction engine (handlers.cuda.reductions)
    _extreme_t = reductions.extreme_t
    _sum_t = reductions.sum_t
    _mean_t = reductions.mean_t
    _sum_kernels = reductions.sum_kernels
    _blocks_per_sm = reductions.blocks_per_sm
    _resident = reductions.resident
    _sum_passes = reductions.sum_passes
    _run_reduction = reductions.run

    # rows, indexing and masks: handlers.cuda.rows
    _index_m_by_v = rows.index_m_by_v
    _binarize_v = rows.binarize_v
    _gather_rows = rows.gather_rows
    _scatter_add_rows = rows.scatter_add_rows

    # attention: fused kernels for the halves, else the composed work
    _attention_forward = cuda_attention.forward
    _attention_backward = cuda_attention.backward

    def _is_fully_finite(self, a):
        _enter()
        if not a.size:
            return True
        slot, ext = self._slot, kernel_loader.require()
        ext.memset_d32(int(slot.flag), 0, 1, slot.handle)
        self._launch("all_finite", a.size, a.gpudata, a.size, slot.flag)
        ext.copy_dtoh(slot.host_flag, int(slot.flag), slot.handle)
        slot.stream.synchronize()
        return slot.host_flag[0] == 0

    # convolution and pooling: handlers.cuda.convolution plans and runs them
    _conv2d = convolution.conv2d
    _conv2d_bias_act = convolution.conv2d_bias_act
    _pool2d = convolution.pool2d

    def conv_engines(self):
        """The cuDNN engine chosen for each convolution planned so far, as
        plain values: ``[pass, format, x, w, y, stride, padding, dilation,
        engine]`` per convolution (pass 0 forward, 1 backward data, 2
        backward filter, 3 and 4 ``conv2d_bias_act``'s forward with its
        bias, and ReLU for 4; the arrays' shapes).  The choice is timed, so two
        processes may choose differently, and differ in the last bits:
        ``prefer_conv_engines`` in another process makes it choose these
        (``Trainer.save`` keeps them, so that a resumed run repeats the
        saved run bit for bit)."""
        return convolution.engines(self._conv_plans)

    def prefer_conv_engines(self, engines):
        """Plan each convolution listed in ``engines`` (a ``conv_engines()``
        list) with its engine, where cuDNN offers it among the candidates,
        instead of timing them; convolutions planned already keep their
        plans.  Shared by the views and twins.  ValueError for a list that
        is not of ``conv_engines``, with nothing changed."""
        self._conv_pins.update(convolution.engine_pins(engines))

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

    # graphs: handlers.cuda.graph captures and replays them on this view's stream
    _graph_defers_calls = False
    _graph_begin = cuda_graph.capture_begin
    _graph_end = cuda_graph.capture_end
    _graph_abort = cuda_graph.capture_abort
    _graph_replay = cuda_graph.replay
    _graph_free = cuda_graph.release

    def _close(self):
        _enter()
        self._resources()
        closed = ClosedGemm()
        for m in self._twins.values():   # the twins' streams are closed too
            m._gemms = [closed] * len(m._gemms)
        for v in self._family_views():
            v._gemm, v._one_call = closed, one_call.Declined()


def _whole_on_its_stream(hook):
    """``hook`` run holding its stream's lock (``StreamSlot.lock``), so that
    its launches are not interleaved with another thread's on that stream."""
    @functools.wraps(hook)
    def run(self, *args):
        with self._slot.lock:
            return hook(self, *args)
    return run


for _name in WORK_HOOKS + ("_is_fully_finite",):
    setattr(PyCudaHandler, _name, _whole_on_its_stream(getattr(PyCudaHandler, _name)))
del _name
