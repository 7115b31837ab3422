"""Host-device movement for PyCudaHandler: prefetch uploads, pinning,
page-locked host arrays and asynchronous downloads.

Uploads run on one upload stream per handler.  Each upload records an event;
the consuming group's stream waits on it, and the staging slot goes back to
the reader thread only once the event has completed.  A device buffer is
overwritten only after the upload stream has waited for the event recorded
when its previous batch's consumer moved on.  ``pin`` page-locks host memory
in place and ``empty_pinned`` allocates it; copies, like every driver call,
go through the ``handlers.cuda._launch`` extension.
"""
import bisect
import contextlib
import functools
import math
import mmap
import weakref

import numpy as np

from ..prefetch import Transfer, fits, matches
from . import context as cuda_context
from . import kernel_loader


class PinnedBlock:
    """Page-locked host memory from ``cuMemHostAlloc``, the ``base`` under
    the arrays of ``empty_pinned`` (NumPy's views keep it alive through
    their bases).  Freed once collected, or at ``free()``; the free waits
    for a thread with the context current and for the end of a graph
    capture (``context.run_with_context``), as ``Resources`` does."""

    __slots__ = ("__array_interface__", "free", "__weakref__")

    def __init__(self, nbytes):
        ext = kernel_loader.require()
        address = ext.host_alloc(max(nbytes, 1))   # the driver refuses 0 bytes
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (address, False), "version": 3}
        #: free the memory now (once): nothing may use the arrays over it after
        self.free = weakref.finalize(self, cuda_context.run_with_context,
                                     functools.partial(_free_host, ext.host_free, address))
        # Freed by the process's end anyway, and at exit the context may be gone.
        self.free.atexit = False


def _free_host(host_free, address):
    # At the end of the process the context may be gone first: nothing to free then.
    with contextlib.suppress(kernel_loader.CudaError):
        host_free(address)


def empty_pinned(shape, dtype):
    """A C-contiguous host array of ``shape`` and ``dtype`` in page-locked
    memory (contents undefined), freed when it and its views are collected
    (or at ``free_pinned``)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.asarray(PinnedBlock(nbytes))
    return raw.view(dtype).reshape(shape)


def free_pinned(a):
    """Free the page-locked memory under ``a`` (an ``empty_pinned`` array)
    now; nothing may use ``a`` or its views after."""
    base = a
    while not isinstance(base, PinnedBlock):
        base = base.base
    base.free()


class PinnedRegistry:
    """Host pages page-locked through ``PyCudaHandler.pin``.

    The driver locks whole pages, refuses a range that overlaps pages it has
    locked before, and refuses a copy whose host range spans two
    registrations; two small arrays can share a page.  So the pieces here are
    page-aligned, disjoint and never touching (``pin`` merges a new range with
    those it meets into one registration), and an array counts as pinned when
    every one of its bytes lies in one piece.  The reader thread of
    ``prefetch`` queries the table while ``pin`` may add to it, so the sorted
    table is replaced whole rather than edited in place.
    """

    def __init__(self):
        self._table = ((), ())   # (sorted starts, matching (start, end) pieces)
        self._owners = []        # arrays kept alive while their pages are locked
        self.driver = None       # (register, unregister) once loaded

    def ranges(self):
        """The registered page-aligned (start, end) pieces."""
        return self._table[1]

    def _last_before(self, hi):
        """The piece with the largest start below ``hi``, or None."""
        starts, pieces = self._table
        i = bisect.bisect_left(starts, hi) - 1
        return pieces[i] if i >= 0 else None

    def covered(self, lo, hi):
        """True if every byte of [lo, hi) lies in one registered piece."""
        p = self._last_before(hi)
        return p is not None and p[0] <= lo and hi <= p[1]

    def touches(self, lo, hi):
        """True if some byte of [lo, hi) lies in a registered piece."""
        p = self._last_before(hi)
        return p is not None and p[1] > lo

    def replace(self, old, piece, owner):
        """Swap the registered pieces ``old`` for ``piece``, which covers them
        (see ``pin``); ``owner`` is kept alive while the pages are locked."""
        merged = sorted(set(self._table[1]) - set(old) | {piece})
        self._table = (tuple(p[0] for p in merged), tuple(merged))
        self._owners.append(owner)

    def contains(self, a):
        """True if the whole of array ``a`` lies in page-locked memory."""
        start = a.__array_interface__["data"][0]
        return self.covered(start, start + a.nbytes)

    def mixed(self, a):
        """True if array ``a`` lies partly in registered pages and partly not.

        The driver refuses a copy from or to such a range ("invalid
        argument"): it happens to an ordinary array that shares a page with
        a pinned one, which heap allocation makes likely for small arrays."""
        if not self._table[1] or not a.nbytes:
            return False
        lo = a.__array_interface__["data"][0]
        hi = lo + a.nbytes
        return self.touches(lo, hi) and not self.covered(lo, hi)


#: One registry per process: page-locking is per process, and a range that two
#: handlers pinned would otherwise be registered twice (the driver refuses).
REGISTRY = PinnedRegistry()


def host_copy_to_device(dest, arr, stream):
    """``cuMemcpyHtoDAsync`` of host array ``arr`` to device address ``dest``
    on ``stream`` (a ``resources.Stream``), through a temporary page-locked
    buffer when ``arr`` straddles pinned pages (then the host waits for the
    copy, so that the buffer may be freed: a rare path)."""
    copy = kernel_loader.require().copy_htod
    if not REGISTRY.mixed(arr):
        copy(int(dest), arr, stream.handle)
        return
    tmp = empty_pinned(arr.shape, arr.dtype)
    tmp[...] = arr
    copy(int(dest), tmp, stream.handle)
    stream.synchronize()
    free_pinned(tmp)


def device_copy_to_host(out, src, stream):
    """``cuMemcpyDtoHAsync`` from device address ``src`` into host array
    ``out`` on ``stream`` (a ``resources.Stream``); returns a function that
    completes the copy once the stream has passed it (a no-op unless ``out``
    straddles pinned pages, when the data lands in a temporary page-locked
    buffer first)."""
    copy = kernel_loader.require().copy_dtoh
    if not REGISTRY.mixed(out):
        copy(out, int(src), stream.handle)
        return None
    tmp = empty_pinned(out.shape, out.dtype)
    copy(tmp, int(src), stream.handle)

    def finish():
        out[...] = tmp
        free_pinned(tmp)
    return finish


class _DeviceSlot:
    """Device buffers for one batch, with the two events that guard them.

    The events are kept for the slot's life (creating an event costs more than
    recording one).  Re-recording is safe: a stream wait captures the event as
    it was when the wait was issued, and a later upload on the same in-order
    stream completes only after the earlier one, so a token whose event was
    re-recorded still answers ``slot_reusable`` correctly."""

    __slots__ = ("arrays", "uploaded", "consumed", "busy", "used")

    def __init__(self, arrays, make_event):
        self.arrays = arrays
        self.uploaded = make_event()   # recorded after the upload into it
        self.consumed = make_event()   # recorded when its consumer moved on
        self.busy = False              # between start and release
        self.used = False              # consumed has been recorded at least once


class CudaTransfer(Transfer):
    """Uploads staged batches to device buffers on the handler's upload stream."""

    def __init__(self, handler):
        super().__init__(handler)
        self.copy = kernel_loader.require().copy_htod
        self.ev = kernel_loader.events()
        self.stream = handler._upload_stream()
        self.upload = self.stream.handle   # the driver handle, for events
        self.consumer = handler._slot.handle
        self.device_slots = []
        self.dest_slots = []      # over the arrays of ``into`` (see use)
        self.host_slots = []

    def new_slot(self, arrays):
        slot = tuple(empty_pinned(a.shape, self.dtype) for a in arrays)
        self.host_slots.append(slot)
        return slot

    def is_direct(self, arrays):
        return all(a.dtype == self.dtype and a.flags.c_contiguous and REGISTRY.contains(a)
                   for a in arrays)

    def use(self, dests):
        super().use(dests)
        self.dest_slots = [_DeviceSlot(d, self.ev.new) for d in dests]
        for slot in self.dest_slots:
            # Work already issued on the consuming group may read a
            # destination (a replay from the last iteration): uploads wait.
            self.ev.record(slot.consumed, self.consumer)
            slot.used = True

    def _device_slot(self, views):
        if self.dest_slots and matches(self.dest_slots[0].arrays, views):
            # In turn, so the set chosen is the one released longest ago and
            # its upload waits the least for that set's last consumer.
            n = len(self.dest_slots)
            for k in range(n):
                slot = self.dest_slots[(self._turn + k) % n]
                if not slot.busy:
                    self._turn += k + 1
                    return slot
        for slot in self.device_slots:
            if not slot.busy and fits(slot.arrays, views):
                return slot
        slot = _DeviceSlot(tuple(self.handler.allocate(v.shape) for v in views), self.ev.new)
        self.device_slots.append(slot)
        return slot

    def start(self, views, slot):
        dslot = self._device_slot(views)
        dslot.busy = True
        if dslot.used:   # its last consumer must be done with it
            self.ev.wait(self.upload, dslot.consumed)
        # The slot's own arrays when the batch fills them: the identity that
        # work captured on a destination of ``into`` relies on.
        dev = tuple(d if d.shape[0] == v.shape[0] else d[:v.shape[0]]
                    for d, v in zip(dslot.arrays, views))
        for d, v in zip(dev, views):
            if v.size:
                self.copy(int(d.gpudata), v, self.upload)
        self.ev.record(dslot.uploaded, self.upload)
        return dev, dslot.uploaded, dslot

    def finish(self, token):
        dev, ev, _ = token
        self.ev.wait(self.consumer, ev)
        return dev

    def slot_reusable(self, token):
        return self.ev.query(token[1])

    def wait_slot(self, token):
        self.ev.synchronize(token[1])

    def release(self, token):
        dslot = token[2]
        self.ev.record(dslot.consumed, self.consumer)
        dslot.busy, dslot.used = False, True

    def close(self):
        self.stream.synchronize()
        for slot in self.device_slots + self.dest_slots:
            if slot.used:
                self.ev.synchronize(slot.consumed)
            self.ev.free(slot.uploaded)
            self.ev.free(slot.consumed)
        self.device_slots, self.dest_slots = [], []
        for slot in self.host_slots:
            for a in slot:
                free_pinned(a)
        self.host_slots = []


class PendingCopy:
    """Handle of an asynchronous device-to-host copy."""

    def __init__(self, out, event, finish=None):
        self._out, self._event, self._finish = out, event, finish   # event: a GpuEvent

    def done(self):
        """Return True if the copy has finished; never blocks."""
        return self._event.query()

    def result(self):
        """Block until the copy has finished and return the NumPy array."""
        self._event.synchronize()
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()
        return self._out


def copy_async(handler, a, out):
    """Issue the copy of ``a`` into ``out`` on the handler's group stream."""
    stream = handler.stream
    finish = device_copy_to_host(out, a.gpudata, stream) if a.size else None
    # A recycled event (GpuEvent): no event is created per copy, and none is
    # destroyed wherever the handle happens to be garbage collected.
    return PendingCopy(out, handler._record_event(), finish)


def pin(array):
    """Page-lock ``array``'s memory in place; its pages stay locked (and the
    array referenced) until the process exits.  The pages are locked through
    the extension's ``host_register``/``host_unregister`` (cuMemHostRegister
    and cuMemHostUnregister), which leave the array as it is."""
    registry = REGISTRY
    if not array.nbytes or registry.contains(array):
        return array
    if registry.driver is None:
        ext = kernel_loader.require()
        registry.driver = (ext.host_register, ext.host_unregister)
        cuda_context.at_exit(_unpin_all)
    reg, unreg = registry.driver
    start = array.__array_interface__["data"][0]
    lo = start - start % mmap.PAGESIZE
    hi = -(-(start + array.nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE
    # A copy must lie within one registration: the driver refuses a host range
    # that spans two, even adjacent ones.  So the new pages and every piece
    # they overlap or touch become one registration (two arrays can share a
    # page).  Re-registering a piece needs the copies from it to be finished.
    victims = [p for p in registry.ranges() if p[0] <= hi and p[1] >= lo]
    if victims:
        kernel_loader.require().context_sync()
        lo, hi = min(lo, victims[0][0]), max(hi, victims[-1][1])
        for a, _ in victims:
            # A piece that stays registered makes the registration below fail,
            # which puts the pieces back: the table stays true either way.
            with contextlib.suppress(kernel_loader.CudaError):
                unreg(a)
    try:
        reg(lo, hi - lo, 0)
    except kernel_loader.CudaError as e:
        for a, b in victims:      # put back what was there
            with contextlib.suppress(kernel_loader.CudaError):
                reg(a, b - a, 0)
        raise kernel_loader.CudaError(f"pin: cuMemHostRegister (an array of shape {array.shape})",
                                      e.status, e.code) from e
    registry.replace(victims, (lo, hi), array)
    return array


def _unpin_all():
    """Unregister every pinned range (at exit, once no copy is in flight)."""
    kernel_loader.require().context_sync()
    for start, _ in REGISTRY.ranges():
        with contextlib.suppress(kernel_loader.CudaError):
            REGISTRY.driver[1](start)
    REGISTRY.__init__()
