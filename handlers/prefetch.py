"""Double-buffered input: batches are prepared while the device computes.

``Handler.prefetch(batches, depth)`` runs :func:`prefetch` below.  The work is
split in two so that the background thread never calls CUDA:

* a reader thread pulls items from ``batches`` and copies each into a free
  host *staging slot* (page-locked memory on the GPU handler);
* the consumer's thread (the one iterating) hands filled slots to the
  handler's :class:`Transfer` hooks, which upload them asynchronously and make
  the consuming stream group wait for the upload, and yields the batch.

Slots are created once per batch shape (the first ``depth + 1`` batches are
staged by the consumer's thread while the reader has no slot yet) and reused;
a smaller last batch uses the leading rows of a slot.  A slot returns to the
reader only once the transfer that read it says so, and a yielded batch stays
valid until the next one is requested.  An exception raised by ``batches``
reaches the consumer with its traceback; leaving the loop early (``break``,
``close()``) stops and joins the thread and releases the slots.

Big batches are copied into their slot by a few threads at once (see
:class:`Stager`), none of which calls CUDA: the ``handlers._hostcopy``
extension's, started once and kept asleep between copies for the process's
life, or Python workers that belong to one ``prefetch`` call and are joined
when it ends.
"""
import collections
import concurrent.futures
import os
import queue
import threading

import numpy as np

from . import dtypes
from .checks import check_arrays

try:
    from . import _hostcopy
except ImportError:   # the optional extension is not built: Python threads copy
    _hostcopy = None

_POLL = 0.05   # seconds between checks of the stop flag while blocked


def as_batch(item, op="prefetch"):
    """Return ``(arrays, single)``: the item's arrays as a tuple and whether the
    item was a single array rather than a tuple."""
    single = not isinstance(item, (tuple, list))
    arrays = (item,) if single else tuple(item)
    out = []
    for a in arrays:
        if isinstance(a, np.ma.MaskedArray):
            raise TypeError(f"{op}: a numpy.ma.MaskedArray's mask would be ignored; pass "
                            f"a.filled(value) or a.data")
        a = np.asarray(a)
        if not dtypes.is_real(a.dtype):
            raise TypeError(f"{op}: batches must hold real numeric arrays, got dtype {a.dtype}")
        if a.ndim == 0:
            raise ValueError(f"{op}: batch arrays must have rank >= 1, got shape ()")
        out.append(a)
    return tuple(out), single


def destinations(handler, into, depth):
    """``into`` of ``Handler.prefetch`` checked and normalized: a list of
    tuples of handler arrays, at least ``depth`` of them, all of one
    structure, none overlapping another."""
    if isinstance(into, (str, bytes)) or not hasattr(into, "__len__"):
        raise TypeError(f"prefetch: into must be a list of destinations, got "
                        f"{type(into).__name__}")
    dests = [tuple(d) if isinstance(d, (tuple, list)) else (d,) for d in into]
    if len(dests) < depth:
        raise ValueError(f"prefetch: into has {len(dests)} destination(s) for depth {depth}; "
                         f"each batch in flight needs its own")
    for d in dests:
        if not d or len(d) != len(dests[0]):
            raise ValueError("prefetch: every destination in into must hold as many arrays "
                             f"as the first ({len(dests[0])})")
        check_arrays(handler, "prefetch", *d)
    flat = [a for d in dests for a in d]
    for i, a in enumerate(flat):
        for b in flat[i + 1:]:
            if handler._overlaps(a, b):
                raise ValueError(f"prefetch: destinations in into overlap (shapes {a.shape} "
                                 f"and {b.shape})")
    return dests


def matches(dest, arrays):
    """True if ``arrays`` have exactly the shapes of the destination ``dest``."""
    return len(dest) == len(arrays) and all(d.shape == a.shape for d, a in zip(dest, arrays))


def fits(slot, arrays):
    """True if ``arrays`` fit the leading rows of the staging ``slot``."""
    return len(slot) == len(arrays) and all(
        s.shape[1:] == a.shape[1:] and a.shape[0] <= s.shape[0] for s, a in zip(slot, arrays))


#: A copy into a staging slot is split across threads from this many
#: destination bytes on; below it a thread handoff (tens of us) costs more
#: than it saves.
PARALLEL_BYTES = 1 << 20
#: Threads sharing one big byte copy (the C extension's), the calling thread
#: included.  H200 machine, 16 CPUs, a 4 MB copy into page-locked memory: 4
#: threads 160 us, 6: 117, 8: 94, 12: 85; the upload loop's step 249, 203,
#: 210, 245 us (``benchmarks/results/diagnostics/stage_copy.py``).
COPY_THREADS = min(8, os.cpu_count() or 1)
#: Threads sharing one converting copy (Python workers, which take the GIL to
#: start and end their part: more than four copied slower).
PY_COPY_THREADS = 4


def _copy_rows(dst, src, lo, hi):
    np.copyto(dst[lo:hi], src[lo:hi], casting="unsafe")


class Stager:
    """Copies batches into the leading rows of staging slots.

    One thread copies 7-9 GB/s into page-locked memory on the H200 machines
    (~450-550 us for a 4 MB batch from a cold source), which made the reader
    thread the bottleneck of an upload loop.  So a copy of at least
    ``min_bytes`` is shared by ``threads`` threads copying at once:

    * a plain byte copy (same dtype, both C-contiguous: the common case) by
      the ``handlers._hostcopy`` extension, which releases the GIL once and
      copies on POSIX threads that never take it (started once, asleep
      between copies).  Python workers must take the GIL to start and end
      their part, and inside an upload loop, whose consumer runs Python most
      of the time, that doubled the reader's copy (H200: 517 us a step
      against 237 alone, four threads);
    * a converting or strided copy (``np.copyto`` with a cast, which
      releases the GIL) on up to ``PY_COPY_THREADS - 1`` Python workers and
      the calling thread, split along the first axis; also the byte copies
      where the extension is not built.  The workers are started on the
      first such copy and joined by :meth:`close`.

    Both the reader and the consumer may call the stager.
    """

    def __init__(self, threads=None, min_bytes=None):
        # The module's constants as they are now (a test may change them).
        self.threads = COPY_THREADS if threads is None else threads
        self.py_threads = min(self.threads, PY_COPY_THREADS)
        self.min_bytes = PARALLEL_BYTES if min_bytes is None else min_bytes
        self._pool = None
        self._lock = threading.Lock()

    def __call__(self, slot, arrays):
        """Copy ``arrays`` into the leading rows of ``slot``; return the views."""
        views = tuple(s[:a.shape[0]] for s, a in zip(slot, arrays))
        for v, a in zip(views, arrays):
            byte_copy = _hostcopy is not None and a.dtype == v.dtype and a.flags.c_contiguous
            parts = min(self.threads if byte_copy else self.py_threads, a.shape[0])
            if parts < 2 or v.nbytes < self.min_bytes:
                _copy_rows(v, a, 0, a.shape[0])
            elif byte_copy:
                # ``v`` is a slot's leading rows: C-contiguous, and not ``a``
                _hostcopy.copy(v.ctypes.data, a.ctypes.data, v.nbytes, self.threads)
            else:
                self._split_copy(v, a, parts)
        return views

    def _split_copy(self, dst, src, parts):
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self.py_threads - 1, thread_name_prefix="streamhandlers-stage")
            pool = self._pool
        bounds = [src.shape[0] * i // parts for i in range(parts + 1)]
        futures = [pool.submit(_copy_rows, dst, src, lo, hi)
                   for lo, hi in zip(bounds[1:-1], bounds[2:])]
        try:
            _copy_rows(dst, src, 0, bounds[1])
        finally:   # no copy may still write into the slot once we return
            concurrent.futures.wait(futures)
        for f in futures:
            f.result()   # re-raises a worker's exception with its traceback

    def close(self):
        """Join the worker threads (after the last call)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def _signal():
    """A wake-up signal: a lock held while no wake-up is pending."""
    lock = threading.Lock()
    lock.acquire()
    return lock


def _wake(signal):
    # One thread ever wakes a given signal, so nothing releases it between
    # the test and the release.
    if signal.locked():
        signal.release()


class _Channel:
    """A FIFO from one thread to one other (reader to consumer or back).

    ``queue.Queue`` hands each item over through condition variables written in
    Python, tens of microseconds per batch under the GIL.  Here the deque's
    append and popleft are atomic, and a side touches a lock only when it must
    block (empty, or full at ``maxsize``); wake-ups may be spurious, so both
    sides re-check in a loop.  ``queue.Empty``/``queue.Full`` on timeout."""

    def __init__(self, maxsize=0):
        self._items = collections.deque()
        self._maxsize = maxsize
        self._nonempty, self._nonfull = _signal(), _signal()

    def put(self, item, timeout=None):
        while self._maxsize and len(self._items) >= self._maxsize:
            if not self._nonfull.acquire(timeout=-1 if timeout is None else timeout):
                raise queue.Full
        self._items.append(item)
        _wake(self._nonempty)

    def get(self, block=True, timeout=None):
        while True:
            try:
                item = self._items.popleft()
            except IndexError:
                if not block or not self._nonempty.acquire(
                        timeout=-1 if timeout is None else timeout):
                    raise queue.Empty from None
                continue
            _wake(self._nonfull)
            return item

    def get_nowait(self):
        return self.get(block=False)


class _Reader(threading.Thread):
    """Pulls items from the source and stages them; never calls CUDA."""

    def __init__(self, source, depth, direct, stage):
        super().__init__(name="streamhandlers-prefetch", daemon=True)
        self.source = source
        self.direct = direct          # arrays -> True if they need no staging
        self.stage = stage            # (slot, arrays) -> views
        self.free = _Channel()        # staging slots the reader may fill
        self.ready = _Channel(maxsize=depth)
        self.stop = threading.Event()
        self.budget = depth + 1       # slots the consumer may still create

    def _put(self, msg):
        while not self.stop.is_set():
            try:
                self.ready.put(msg, timeout=_POLL)
                return True
            except queue.Full:
                pass
        return False

    def _slot_for(self, arrays):
        """A free slot that fits, or None to let the consumer stage (and create
        a slot) itself."""
        while not self.stop.is_set():
            try:
                slot = self.free.get_nowait()
            except queue.Empty:
                if self.budget > 0:
                    self.budget -= 1
                    return None
                try:
                    slot = self.free.get(timeout=_POLL)
                except queue.Empty:
                    continue
            if fits(slot, arrays):
                return slot
            # Shapes changed: this slot is dropped and a new one may be made.
            self.budget += 1
        return None

    def run(self):
        try:
            for item in self.source:
                if self.stop.is_set():
                    return
                arrays, single = as_batch(item)
                if self.direct(arrays):
                    msg = ("direct", arrays, single, None)
                else:
                    slot = self._slot_for(arrays)
                    if self.stop.is_set():
                        return
                    if slot is None:
                        msg = ("raw", arrays, single, None)
                    else:
                        msg = ("staged", self.stage(slot, arrays), single, slot)
                if not self._put(msg):
                    return
            self._put(("end",))
        except BaseException as e:  # handed to the consumer, which re-raises it
            self._put(("error", e))


class Transfer:
    """How a handler moves staged host batches to where its ops can read them.

    The default (NumpyHandler) yields the staged host arrays themselves.
    """

    def __init__(self, handler):
        self.handler = handler
        self.dtype = handler.dtype
        self.dests = []     # Handler.prefetch's ``into``: tuples of handler arrays
        self._turn = 0

    def use(self, dests):
        """Upload batches of the destinations' shapes into ``dests`` (tuples
        of handler arrays) rather than buffers of the transfer's own."""
        self.dests = dests

    def new_slot(self, arrays):
        """Allocate a staging slot for arrays of these shapes (consumer thread)."""
        return tuple(np.empty(a.shape, self.dtype) for a in arrays)

    def is_direct(self, arrays):
        """True if ``arrays`` can be used without staging (reader thread)."""
        return False

    def start(self, views, slot):
        """Begin moving ``views`` (staged in ``slot``, or direct arrays when slot
        is None); return a token for ``finish``/``done``."""
        if self.dests and matches(self.dests[0], views):
            # In turn: with at least depth destinations, the one `depth`
            # batches back has been released by its consumer.
            dest = self.dests[self._turn % len(self.dests)]
            self._turn += 1
            for d, v in zip(dest, views):
                np.copyto(d, v)
            return dest
        return views

    def finish(self, token):
        """Make the consumer's group wait for the transfer; return the batch."""
        return token

    def slot_reusable(self, token):
        """True once the staging slot behind ``token`` may be refilled."""
        return True

    def wait_slot(self, token):
        """Block until the staging slot behind ``token`` may be refilled."""

    def release(self, token):
        """The consumer has issued all its work on the batch of ``token``."""

    def close(self):
        """Wait for transfers in flight and release device buffers."""


def prefetch(handler, batches, depth, transfer, dests=None):
    """Generator behind ``Handler.prefetch``; see the module docstring.
    ``dests``: checked ``into`` (:func:`destinations`) or None."""
    if dests:
        transfer.use(dests)
    stager = Stager()
    reader = _Reader(iter(batches), depth, transfer.is_direct, stager)
    reader.start()
    inflight = collections.deque()   # (token, single, slot) uploads started
    pending = []                     # (token, slot) staging slots not yet back
    ended = False
    failure = None
    try:
        while True:
            # Hand back staging slots whose transfer has read them.
            still = []
            for token, slot in pending:
                if transfer.slot_reusable(token):
                    reader.free.put(slot)
                else:
                    still.append((token, slot))
            pending = still
            # Keep up to `depth` transfers in flight.
            while not ended and len(inflight) < depth:
                if inflight:
                    try:
                        msg = reader.ready.get_nowait()
                    except queue.Empty:
                        break
                else:
                    for token, slot in pending:   # the reader may wait for these
                        transfer.wait_slot(token)
                        reader.free.put(slot)
                    pending = []
                    msg = reader.ready.get()
                kind = msg[0]
                if kind == "end":
                    ended = True
                    break
                if kind == "error":   # raised once the batches before it are used
                    failure = msg[1]
                    ended = True
                    break
                _, arrays, single, slot = msg
                if kind == "raw":   # the reader had no slot: make one here
                    slot = transfer.new_slot(arrays)
                    arrays = stager(slot, arrays)
                token = transfer.start(arrays, slot)
                inflight.append((token, single, slot))
            if not inflight:
                if failure is not None:
                    raise failure
                return
            token, single, slot = inflight.popleft()
            batch = transfer.finish(token)
            yield batch[0] if single else batch
            # The consumer may have closed the handler meanwhile: its streams
            # and events are gone, so nothing more is issued on them.
            handler._check_open("prefetch")
            transfer.release(token)
            if slot is not None:
                pending.append((token, slot))
    finally:
        reader.stop.set()
        reader.join()
        stager.close()       # before transfer.close() frees the staging slots
        transfer.close()
