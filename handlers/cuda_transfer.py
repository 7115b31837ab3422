"""Host-device movement for PyCudaHandler: prefetch uploads, pinning and
asynchronous downloads.

Uploads run on one upload stream per handler.  Each upload records an event;
the consuming group's stream waits on it, and the staging slot goes back to
the reader thread only once the event has completed.  A device buffer is
overwritten only after the upload stream has waited for the event recorded
when its previous batch's consumer moved on.
"""
import bisect

import numpy as np

from .prefetch import Transfer, fits


class PinnedRegistry:
    """Host ranges page-locked through ``PyCudaHandler.pin``.

    The reader thread of ``prefetch`` queries it while ``pin`` may add to it,
    so the sorted table is replaced whole rather than edited in place.
    """

    def __init__(self):
        self._table = ((), ())   # (sorted starts, matching (start, end, owner))

    def add(self, start, end, owner):
        ranges = sorted(self._table[1] + ((start, end, owner),), key=lambda r: r[0])
        self._table = (tuple(r[0] for r in ranges), tuple(ranges))

    def contains(self, a):
        """True if the whole of array ``a`` lies in one pinned range."""
        starts, ranges = self._table
        start = a.__array_interface__["data"][0]
        i = bisect.bisect(starts, start) - 1
        return i >= 0 and start + a.nbytes <= ranges[i][1]


class CudaTransfer(Transfer):
    """Uploads staged batches to device buffers on the handler's upload stream."""

    def __init__(self, handler):
        super().__init__(handler)
        self.drv = handler._drv
        self.stream = handler._upload_stream()
        self.consumer = handler.stream
        self.device_slots = []    # [arrays, consumed event or None, busy]
        self.host_slots = []

    def new_slot(self, arrays):
        slot = tuple(self.drv.pagelocked_empty(a.shape, self.dtype) for a in arrays)
        self.host_slots.append(slot)
        return slot

    def is_direct(self, arrays):
        registry = self.handler._pinned
        return all(a.dtype == self.dtype and a.flags.c_contiguous and registry.contains(a)
                   for a in arrays)

    def _device_slot(self, views):
        for slot in self.device_slots:
            if not slot[2] and fits(slot[0], views):
                return slot
        slot = [tuple(self.handler.allocate(v.shape) for v in views), None, False]
        self.device_slots.append(slot)
        return slot

    def start(self, views, slot):
        dslot = self._device_slot(views)
        dslot[2] = True
        if dslot[1] is not None:   # its last consumer must be done with it
            self.stream.wait_for_event(dslot[1])
        dev = tuple(d[:v.shape[0]] for d, v in zip(dslot[0], views))
        for d, v in zip(dev, views):
            if v.size:
                self.drv.memcpy_htod_async(d.gpudata, v, self.stream)
        ev = self.drv.Event(flags=self.drv.event_flags.DISABLE_TIMING)
        ev.record(self.stream)
        return dev, ev, dslot

    def finish(self, token):
        dev, ev, _ = token
        self.consumer.wait_for_event(ev)
        return dev

    def slot_reusable(self, token):
        return token[1].query()

    def wait_slot(self, token):
        token[1].synchronize()

    def release(self, token):
        dslot = token[2]
        ev = self.drv.Event(flags=self.drv.event_flags.DISABLE_TIMING)
        ev.record(self.consumer)
        dslot[1], dslot[2] = ev, False

    def close(self):
        self.stream.synchronize()
        for slot in self.device_slots:
            if slot[1] is not None:
                slot[1].synchronize()
        self.device_slots = []
        for slot in self.host_slots:
            for a in slot:
                a.base.free()
        self.host_slots = []


class PendingCopy:
    """Handle of an asynchronous device-to-host copy."""

    def __init__(self, out, event):
        self._out, self._event = out, event

    def done(self):
        """Return True if the copy has finished; never blocks."""
        return self._event.query()

    def result(self):
        """Block until the copy has finished and return the NumPy array."""
        self._event.synchronize()
        return self._out


def copy_async(handler, a, out):
    """Issue the copy of ``a`` into ``out`` on the handler's group stream."""
    drv = handler._drv
    stream = handler.stream
    if a.size:
        drv.memcpy_dtoh_async(out, a.gpudata, stream)
    ev = drv.Event(flags=drv.event_flags.DISABLE_TIMING)
    ev.record(stream)
    return PendingCopy(out, ev)


def pin(handler, array):
    """Page-lock ``array`` in place and remember its range."""
    registry = handler._pinned
    if registry.contains(array):
        return array
    pinned = handler._drv.register_host_memory(array)
    start = pinned.__array_interface__["data"][0]
    registry.add(start, start + pinned.nbytes, pinned.base)
    return pinned
