"""What PyCudaHandler's streams own, and what a handler releases when it closes.

A ``Stream`` is one CUDA stream; a ``StreamSlot`` is one stream with its
scratch memory, its event and its cuDNN handle, shared by the twins of every
format; ``Resources`` releases a handler's slots, cuBLAS objects, cuDNN plans,
events, streams and pool without holding the handler itself; ``GpuEvent`` is
what ``record_event`` returns.  Streams, events, copies and the cuDNN calls go
through the ``handlers.cuda._launch`` extension (``kernel_loader.events()``
and ``kernel_loader.require()``).
"""
import math
import threading

import numpy as np

from . import context as cuda_context
from . import kernel_loader
from . import transfer as cuda_transfer


class Stream:
    """A CUDA stream that does not wait for the legacy NULL stream
    (``CU_STREAM_NON_BLOCKING``): ``handle`` is the driver's ``CUstream`` (an
    int, what launches, events, copies and cuBLAS take), ``synchronize()``
    blocks the host (letting other Python threads run) until its work has
    finished, and ``close()`` destroys it (``Resources`` does, after its work
    and the library handles bound to it).  Closed, its handle is 0 and
    ``synchronize`` has nothing to wait for."""

    __slots__ = ("handle", "_sync", "_free")

    def __init__(self):
        ext = kernel_loader.require()
        self._sync, self._free = ext.stream_sync, ext.stream_free
        self.handle = ext.stream_new()

    def synchronize(self):
        """Block until the work issued on this stream has finished."""
        if self.handle:
            self._sync(self.handle)

    def close(self):
        """Destroy the stream (once; work still queued on it completes first)."""
        handle, self.handle = self.handle, 0
        if handle:
            self._free(handle)


class Scratch:
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


class StreamSlot:
    """One stream with what belongs to it: scratch memory and a cuDNN handle,
    shared by the twins of every format (a handler holds its own cuBLAS
    objects, bound to the slots' streams).  ``sum_scratch`` is (bytes,
    counters) of the fixed scratch of the one-call path's chunked
    reductions (``reductions.one_call_scratch``)."""

    def __init__(self, pool, blas_workspace, sum_scratch):
        self.stream = Stream()
        self.handle = self.stream.handle   # the driver handle, for launches and events
        self.event = kernel_loader.events().new()
        # Held by every op's Python path for the whole op: an op that issues
        # several launches through this stream's scratch (a sum in passes, a
        # half-format product, chunked extrema) must not have another
        # thread's op queued between them on the same stream.  The compiled
        # path (one_call) issues one launch an op and uses no scratch but its
        # own fixed one (sum_scratch, below).
        self.lock = threading.RLock()
        # cuBLAS's scratch, ours rather than its own, so that it allocates
        # nothing while a graph is being captured.  The GEMM objects of every
        # format on this stream (twins) share it: their calls are stream-ordered.
        self.blas_work = pool.allocate(blas_workspace)
        self.blas_bytes = blas_workspace
        self.flag = pool.allocate(4)               # is_fully_finite's result
        self.host_flag = cuda_transfer.empty_pinned((1,), np.uint32)
        # The one-call path's chunked reductions (OneCall.sum): a workspace
        # and counters of their own, allocated once and never grown, moved
        # or freed while the slot lives, so that the addresses its OneCall
        # objects hold stay valid.  No other code uses them: the Python
        # path's scratch (workspace(), counters()) may grow, and a capture
        # keeps what it grew; the one-call path runs no captured op.  Its
        # launches on this stream run one after another, each leaving its
        # counters at zero as it finishes (reduce.cu), so one set serves
        # them all, from every thread and twin; the memset below, queued on
        # this stream, zeroes them before the first.
        nbytes, ncount = sum_scratch
        self._sum_blocks = (pool.allocate(max(1, nbytes)), pool.allocate(4 * max(1, ncount)))
        #: (workspace address, bytes, counters address, counters) for OneCall
        self.sum_scratch = (int(self._sum_blocks[0]), nbytes, int(self._sum_blocks[1]), ncount)
        if ncount:
            kernel_loader.require().memset_d32(self.sum_scratch[2], 0, ncount, self.handle)
        self._work = Scratch(pool)                          # workspace()
        self._counts = Scratch(pool)                        # counters()
        self._between = (Scratch(pool), Scratch(pool))      # intermediate()
        # cuDNN's workspace: its own, so that a convolution's size never
        # grows (and strands) the block the reductions use.
        self._cudnn_work = Scratch(pool)
        self.cudnn = 0   # this stream's cuDNN handle, made at first use (convolution)
        #: every growable scratch of this slot (a capture keeps what it grew
        #: and gives the slot its blocks back: handlers.cuda.graph)
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
            kernel_loader.require().memset_d32(int(self._counts.get(4 * n)), 0, n,
                                               self.handle)
        return self._counts.block


class Resources:
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
        # reader's too); what is held here is then released on a thread
        # where the context is current, later.
        cuda_context.run_with_context(self._release)

    def _release(self):
        if self.slots is None:               # asked twice while deferred
            return
        slots, self.slots = self.slots, None
        streams = [getattr(s, "stream", s) for s in slots + self.uploads]
        try:
            ev = kernel_loader.events()
            # The extension: where a slot has a cuDNN handle or a plan exists,
            # convolution.load_cudnn has loaded cuDNN into it.
            ext = kernel_loader.require()
            for stream in streams:
                stream.synchronize()
            for gemm in self.gemms:
                gemm.close()
            for slot in slots:
                ev.free(slot.event)
                if slot.cudnn:
                    ext.cudnn_destroy(slot.cudnn)
                    slot.cudnn = 0
            while self.conv_plans:
                ext.cudnn_plan_free(self.conv_plans.popitem()[1][0])
            # Events of GpuEvents still alive stay theirs (and leak if never
            # collected before the next release); recycled ones are freed here.
            while self.events:
                ev.free(self.events.pop())
        finally:
            # Whatever failed above (a sticky CUDA error fails every call), the
            # streams and the pool are let go.  Streams last of the device
            # objects: every call above that used one (and the cuBLAS and
            # cuDNN handles bound to them) is done with it.
            try:
                for stream in streams:
                    stream.close()
            finally:
                # Arrays still alive at exit are freed after the context is
                # popped.  A pool that starts holding blocks then needs a
                # current context and aborts the process; a pool that stops
                # holding frees them directly.
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
        return kernel_loader.events().query(self.event)

    def synchronize(self):
        """Block the host until the work before the event has finished."""
        kernel_loader.events().synchronize(self.event)


class ClosedGemm:
    """Stands in for a closed handler's cuBLAS handles."""

    def __call__(self, *args):
        raise RuntimeError("PyCudaHandler: the handler is closed")

    batched = __call__
