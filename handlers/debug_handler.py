"""DebugHandler: a wrapper that adds the expensive checks to any handler.

``DebugHandler(inner)`` has the op interface of ``inner`` (and its
``with_streams`` views) and forwards every op to it, after checking:

* argument types, dtypes and contiguity (the inner handler checks shapes,
  axes and scalars, with the same exceptions and messages);
* the aliasing rules of each op's docstring in ``handlers.base``: where ``out``
  may be an input it must be *the very same* memory, and a partial overlap
  raises ``ValueError``; where the docstring forbids overlap, any overlap does;
* cross-group hazards: for every byte range it tracks the group that last wrote
  it and the groups that read it since, and raises ``StreamHazardError`` on a
  read-after-write, write-after-read or write-after-write across two groups
  with no ``record_event``/``wait_event``, ``wait_for`` or synchronize call in
  between.  Views that overlap count as the same memory;
* with ``check_finite=True``, NaN and Inf: inputs before each op and outputs
  after it, raising ``FloatingPointError`` that names the op that produced the
  first non-finite value (or the op it came into).  Each array is checked by
  a handler of its own format (``cast_t``'s source may be a twin's array).

The hazard tracker models the contract, not one implementation: on
``NumpyHandler``, where every schedule is trivially correct, it reports the
same hazards as it would on the GPU, so CI catches a missing wait.

What each op reads and writes comes from the op table,
:data:`handlers.optable.OPS` (re-exported here as ``OPS``);
``tests/test_debug_handler.py`` checks that it covers every public op of
``Handler``.

Limits: only work issued through one ``DebugHandler`` (and its views) is
tracked; work issued on the bare handler or through a second wrapper is
invisible.  Events must be waited on through the wrapper that recorded them.
"""
import functools
import inspect
import threading
import weakref
from bisect import bisect_left, bisect_right

import numpy as np

from .base import Handler
from .checks import check_any_format, check_arrays
from .optable import OPS

__all__ = ["OPS", "DebugEvent", "DebugHandler", "StreamHazardError", "byte_range"]


class StreamHazardError(RuntimeError):
    """A buffer was accessed on two stream groups with nothing ordering them.

    Attributes (None when constructed from a message alone): ``op`` the op
    that found the hazard, ``kind`` ("read-after-write", "write-after-read" or
    "write-after-write"), ``group`` its stream group, ``other_group`` the group
    of the earlier access, ``other_op`` the op of the earlier access and
    ``shape`` the shape of the argument through which the buffer was accessed.
    """

    def __init__(self, message, *, op=None, kind=None, group=None, other_group=None,
                 other_op=None, shape=None):
        super().__init__(message)
        self.op, self.kind, self.group = op, kind, group
        self.other_group, self.other_op, self.shape = other_group, other_op, shape


# Signatures of the contract's ops, to find arguments by name however passed.
_SIGNATURES = {name: inspect.signature(getattr(Handler, name)) for name in OPS}


# =============================================================================== memory ranges
def byte_range(a):
    """Return ``(start, end)``: the device or host addresses spanned by array ``a``.

    Works for NumPy arrays (``__array_interface__``), pycuda ``GPUArray``
    (``int(a.gpudata)``) and anything with ``__cuda_array_interface__`` (CuPy,
    PyTorch).  Strides are honoured, so the span of a strided view covers every
    element it can touch.  A zero-size array gives an empty range.
    """
    if isinstance(a, np.ndarray):
        start = a.__array_interface__["data"][0]
    elif hasattr(a, "gpudata"):     # pycuda GPUArray; gpudata is None when empty
        start = 0 if a.gpudata is None else int(a.gpudata)
    elif hasattr(a, "__cuda_array_interface__"):
        start = a.__cuda_array_interface__["data"][0]
    elif hasattr(a, "__array_interface__"):
        start = a.__array_interface__["data"][0]
    else:
        raise TypeError(f"byte_range: cannot find the memory of a {type(a).__name__}")
    shape = tuple(a.shape)
    itemsize = np.dtype(a.dtype).itemsize
    if any(s == 0 for s in shape):
        return start, start
    strides = getattr(a, "strides", None)
    if strides is None:   # C-contiguous by contract
        return start, start + int(np.prod(shape, dtype=np.int64)) * itemsize
    lo = hi = start
    for n, st in zip(shape, strides):
        if st < 0:
            lo += (n - 1) * st
        else:
            hi += (n - 1) * st
    return lo, hi + itemsize


def _memory_owner(a, array_type):
    """The array object whose lifetime bounds ``a``'s memory: follow ``.base``
    while it is an array of the handler (NumPy and pycuda views keep it)."""
    while True:
        b = getattr(a, "base", None)
        if b is None or not isinstance(b, array_type):
            return a
        a = b


def _owner_ref(a, array_type):
    try:
        return weakref.ref(_memory_owner(a, array_type))
    except TypeError:   # not weak-referenceable: its state lives until reallocated
        return None


# =============================================================================== hazard tracker
class _Segment:
    """A byte range [start, end) with one access state.  ``writer`` is None
    (ready on every group) or (group, position, op, shape); ``readers`` maps a
    group to (position, op, shape) of its latest read since the last write."""

    __slots__ = ("end", "owner", "readers", "start", "writer")

    def __init__(self, start, end, writer=None, readers=None, owner=None):
        self.start, self.end = start, end
        self.writer = writer
        self.readers = readers if readers is not None else {}
        self.owner = owner

    def dead(self):
        # The memory's owner was freed: the bytes may now belong to a new array.
        return self.owner is not None and self.owner() is None


_ORDERING = "record_event/wait_event, wait_for, synchronize or synchronize_all_streams"
_MIN_PRUNE = 1024


class _Tracker:
    """Vector clocks per stream group plus an interval map of buffer states.

    ``_vc[h][g]`` is the number of ops of group ``g`` that group ``h`` is known
    to run after (``_vc[h][h]`` counts ``h``'s own ops); ``_host[g]`` is what
    the host has waited for, which orders every later op of every group.  An
    access by ``h`` to the position ``p`` of group ``g`` is ordered when
    ``g == h`` or ``max(_vc[h][g], _host[g]) >= p``.  Merging whole clocks on
    each wait makes ordering transitive (1 -> 2 -> 3 orders 3 after 1).

    Memory is an ordered list of non-overlapping segments.  An op splits
    segments at its arrays' bounds, so views that partially overlap share
    exactly the bytes they have in common.  Bytes without a segment are fresh
    (ready everywhere).  A segment whose array was freed is fresh again, and
    those are pruned whenever the list has doubled, so its size follows the
    live arrays, not the number of ops.  (A segment remembers the last array
    that touched it; two live arrays over the same memory from different
    owners, e.g. two ``np.frombuffer`` of one buffer, share state only while
    that one lives.)
    """

    def __init__(self, num_groups, array_type):
        self.n = num_groups
        self.array_type = array_type
        self._vc = [[0] * num_groups for _ in range(num_groups)]
        self._host = [0] * num_groups
        self._starts = []   # segment starts, sorted, parallel to _segs
        self._segs = []
        self._prune_at = _MIN_PRUNE

    # ---------------------------------------------------------------- clocks
    def _seen(self, h, g, pos):
        return g == h or self._vc[h][g] >= pos or self._host[g] >= pos

    def clock(self, g):
        """The vector clock of group ``g`` now: per group, how many of its ops
        the work issued so far on ``g`` runs after (``g``'s own count included)."""
        return tuple(max(a, b) for a, b in zip(self._vc[g], self._host))

    def wait(self, h, clock):
        """Group ``h`` now runs after everything ``clock`` covers."""
        vc = self._vc[h]
        for g, p in enumerate(clock):
            vc[g] = max(vc[g], p)

    def host_wait(self, clock):
        """The host waited for everything ``clock`` covers."""
        for g, p in enumerate(clock):
            self._host[g] = max(self._host[g], p)

    def synchronize_all(self):
        """The host waited for every group."""
        self.host_wait([self._vc[g][g] for g in range(self.n)])

    # ---------------------------------------------------------------- segments
    def _overlapping(self, start, end):
        segs = self._segs
        i = max(bisect_right(self._starts, start) - 1, 0)
        while i < len(segs) and segs[i].start < end:
            seg = segs[i]
            if seg.end > start and not seg.dead():
                yield seg
            i += 1

    def _split(self, addr):
        i = bisect_right(self._starts, addr) - 1
        if i >= 0:
            seg = self._segs[i]
            if seg.start < addr < seg.end:
                tail = _Segment(addr, seg.end, seg.writer, dict(seg.readers), seg.owner)
                seg.end = addr
                self._starts.insert(i + 1, addr)
                self._segs.insert(i + 1, tail)

    def _cover(self, start, end, owner):
        """Segments exactly tiling [start, end), created where missing."""
        self._split(start)
        self._split(end)
        starts, segs, out = self._starts, self._segs, []
        i, pos = bisect_left(starts, start), start
        while pos < end:
            if i < len(segs) and segs[i].start == pos:
                seg = segs[i]
                if seg.dead():
                    seg.writer, seg.readers = None, {}
            else:
                nxt = segs[i].start if i < len(segs) and segs[i].start < end else end
                seg = _Segment(pos, nxt)
                starts.insert(i, pos)
                segs.insert(i, seg)
            seg.owner = owner
            out.append(seg)
            pos = seg.end
            i += 1
        return out

    def _maybe_prune(self):
        if len(self._segs) > self._prune_at:
            self._segs = [s for s in self._segs if not s.dead()]
            self._starts = [s.start for s in self._segs]
            self._prune_at = max(_MIN_PRUNE, 2 * len(self._segs))

    # ---------------------------------------------------------------- accesses
    def check(self, op, h, accesses):
        """Raise StreamHazardError if an access of ``accesses`` (a list of
        (name, array, range, is_write), reads first) on group ``h`` is not
        ordered after a conflicting earlier access of another group."""
        for name, arr, (start, end), write in accesses:
            for seg in self._overlapping(start, end):
                w = seg.writer
                if w is not None and not self._seen(h, w[0], w[1]):
                    kind = "write-after-write" if write else "read-after-write"
                    self._fail(op, h, kind, name, arr, w[0], w[2], w[3], "last written")
                if write:
                    for g, (pos, rop, rshape) in seg.readers.items():
                        if not self._seen(h, g, pos):
                            self._fail(op, h, "write-after-read", name, arr, g, rop, rshape,
                                       "read since its last write")

    @staticmethod
    def _fail(op, h, kind, name, arr, g, other_op, other_shape, what):
        shape = tuple(arr.shape)
        raise StreamHazardError(
            f"{op} on stream group {h}: {kind} hazard on {name} (shape {shape}): it was "
            f"{what} on stream group {g} by {other_op} (as shape {other_shape}), and "
            f"nothing orders group {h} after that ({_ORDERING})",
            op=op, kind=kind, group=h, other_group=g, other_op=other_op, shape=shape)

    def commit(self, op, h, accesses):
        """Record the accesses of an op that ran on group ``h``."""
        vc = self._vc[h]
        vc[h] += 1
        pos = vc[h]
        for name, arr, (start, end), write in accesses:
            if start == end:
                continue
            rec = (pos, op, tuple(arr.shape))
            for seg in self._cover(start, end, _owner_ref(arr, self.array_type)):
                if write:
                    seg.writer, seg.readers = (h,) + rec, {}
                else:
                    seg.readers[h] = rec
        self._maybe_prune()

    def fresh(self, arr):
        """A new array: its bytes are ready on every group (whatever freed
        array used them before)."""
        start, end = byte_range(arr)
        if start == end:
            return
        self._split(start)
        self._split(end)
        i, j = bisect_left(self._starts, start), bisect_left(self._starts, end)
        del self._starts[i:j]
        del self._segs[i:j]

    def settle(self, arr):
        """The host read ``arr`` including all earlier work of every group:
        its last write is complete.  Reads pending on other groups stay."""
        start, end = byte_range(arr)
        if start == end:
            return
        for seg in self._cover(start, end, _owner_ref(arr, self.array_type)):
            seg.writer = None
        self._maybe_prune()


# =============================================================================== events
class DebugEvent:
    """An event recorded through a ``DebugHandler``: the inner handler's event
    plus the position of its group that it marks, for the hazard tracker."""

    def __init__(self, event, group, clock, tracker):
        self.event, self.group, self.clock, self._tracker = event, group, clock, tracker

    def query(self):
        """Return True if the work before the event has finished; never blocks.

        Not an ordering point for the tracker, even when True: on NumpyHandler
        it always is, and that verdict would not carry over to the GPU."""
        return self.event.query()

    def synchronize(self):
        """Block the host until the work before the event has finished; later
        work of every group is then ordered after it."""
        self.event.synchronize()
        self._tracker.host_wait(self.clock)


# =============================================================================== the wrapper
class _Shared:
    """State shared by a DebugHandler and all its stream-group views."""

    def __init__(self, inner, check_finite):
        self.tracker = _Tracker(inner.num_stream_groups, inner.array_type)
        self.check_finite = check_finite
        self.views = {}
        # format name -> the _Shared of the DebugHandler twins of that format,
        # which share this tracker and lock (twins issue on the same groups)
        self.twins = {inner.dtype.name: self}
        # One op at a time through the wrapper: the tracker's state is shared
        # by every view, and ops may come from several threads.
        self.lock = threading.RLock()


class DebugHandler:
    """Wrap ``inner`` (any handler or ``with_streams`` view) with the
    expensive checks; see the module docstring.

    Args:
        inner: the handler to wrap.  Wrap it once and issue all work through
            the wrapper: work that bypasses it is invisible to the tracker.
        check_finite: also check inputs and outputs of every op for NaN/Inf
            (one host synchronisation per array on a GPU).

    Raises TypeError if ``inner`` is not a handler or is already a
    DebugHandler.
    """

    def __init__(self, inner, check_finite=False):
        if isinstance(inner, DebugHandler):
            raise TypeError("DebugHandler: inner is already a DebugHandler")
        if not isinstance(inner, Handler):
            raise TypeError(f"DebugHandler: expected a Handler, got {type(inner).__name__}")
        self._inner = inner
        self._shared = _Shared(inner, bool(check_finite))
        self._shared.views[inner.group] = self

    def __repr__(self):
        return (f"DebugHandler({self._inner!r}, "
                f"check_finite={self._shared.check_finite})")

    # ---------------------------------------------------------------- attributes
    @property
    def inner(self):
        """The wrapped handler (or view); work issued on it is not checked."""
        return self._inner

    @property
    def check_finite(self):
        """True if ops check their inputs and outputs for NaN and Inf."""
        return self._shared.check_finite

    @property
    def dtype(self):
        """The inner handler's dtype."""
        return self._inner.dtype

    @property
    def array_type(self):
        """The inner handler's array class."""
        return self._inner.array_type

    @property
    def num_stream_groups(self):
        """The inner handler's number of stream groups."""
        return self._inner.num_stream_groups

    @property
    def group(self):
        """The stream group this wrapper's ops run on."""
        return self._inner.group

    def __getattr__(self, name):
        # Data attributes of the inner handler (seed, num_stream_groups,
        # stream, ...) pass through; methods outside the op table do not,
        # because their memory accesses would escape the checks.
        inner = self.__dict__.get("_inner")
        if inner is None or name.startswith("_"):
            raise AttributeError(name)
        value = getattr(inner, name)
        if callable(value):
            raise AttributeError(  # noqa: TRY004 - __getattr__ must raise AttributeError
                f"DebugHandler does not wrap {name!r}: its memory accesses would not be "
                "checked; call it on .inner to bypass the checks")
        return value

    # ---------------------------------------------------------------- streams
    def with_streams(self, k):
        """Return the DebugHandler view whose ops run on stream group ``k``.

        It wraps ``inner.with_streams(k)``, shares this wrapper's tracker and
        flags, is cached and is a context manager that yields itself.  Raises
        ``ValueError`` for a bad group, as the inner handler does."""
        inner_view = self._inner.with_streams(k)   # validates k
        views = self._shared.views
        view = views.get(inner_view.group)
        if view is None:
            view = object.__new__(DebugHandler)
            view._inner, view._shared = inner_view, self._shared
            views[inner_view.group] = view
        return view

    def twin(self, dtype):
        """The DebugHandler of ``inner.twin(dtype)``, cached: its ops are
        checked by this wrapper's tracker, since a twin issues its work on
        the same stream groups (see ``Handler.twin``)."""
        inner = self._inner.twin(dtype)   # validates dtype
        shared = self._shared.twins.get(inner.dtype.name)
        if shared is None:
            shared = object.__new__(_Shared)
            shared.__dict__.update(self._shared.__dict__)   # tracker, lock, flags, twins
            shared.views = {}
            self._shared.twins[inner.dtype.name] = shared
        view = shared.views.get(inner.group)
        if view is None:
            view = object.__new__(DebugHandler)
            view._inner, view._shared = inner, shared
            shared.views[inner.group] = view
        return view

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def record_event(self):
        """Record an event on this group and return it as a ``DebugEvent``;
        returns without waiting.  Wait on it with ``wait_event`` of a view of
        this wrapper."""
        with self._shared.lock:
            ev = self._inner.record_event()
            tracker = self._shared.tracker
            return DebugEvent(ev, self.group, tracker.clock(self.group), tracker)

    def wait_event(self, event):
        """Make later work on this group wait for ``event``; does not block.

        A bare event of the inner handler is passed through, but the tracker
        cannot know what it orders, so it counts as no ordering."""
        with self._shared.lock:
            if isinstance(event, DebugEvent):
                self._inner.wait_event(event.event)
                if event._tracker is self._shared.tracker:
                    self._shared.tracker.wait(self.group, event.clock)
            else:
                self._inner.wait_event(event)

    def wait_for(self, other):
        """Make later work on this group wait for all work issued so far on
        ``other``: a view of this wrapper or of the inner handler."""
        other_inner = other._inner if isinstance(other, DebugHandler) else other
        with self._shared.lock:
            self._inner.wait_for(other_inner)   # validates: a view of the same handler
            tracker = self._shared.tracker
            tracker.wait(self.group, tracker.clock(other_inner.group))

    def synchronize(self):
        """Block the host until all work issued on this group has finished."""
        with self._shared.lock:
            self._inner.synchronize()
            tracker = self._shared.tracker
            tracker.host_wait(tracker.clock(self.group))

    def synchronize_all_streams(self):
        """Block the host until all work issued on every group has finished."""
        with self._shared.lock:
            self._inner.synchronize_all_streams()
            self._shared.tracker.synchronize_all()

    def capture(self, fn=None):
        """``Handler.capture`` through the wrapper: each op issued inside the
        capture through this wrapper (or its views) is checked as it is
        recorded, like an eager op; the replays are not tracked.  NaN/Inf
        checks (``check_finite``) skip the recorded ops, whose values do not
        exist yet.  After a failed capture the tracker still counts its ops as
        issued, which can only report more hazards, never fewer;
        ``synchronize_all_streams()`` settles them."""
        return self._inner.capture(fn)

    def close(self):
        """``Handler.close`` of the inner handler."""
        self._inner.close()

    # Views issue no work; the accesses made through a view are tracked by
    # memory range, like those made through the array it views.
    def reshape_t(self, a, shape):
        with self._shared.lock:
            return self._inner.reshape_t(a, shape)

    def view_t(self, a, offset, shape):
        with self._shared.lock:
            return self._inner.view_t(a, offset, shape)

    reshape_t.__doc__ = Handler.reshape_t.__doc__
    view_t.__doc__ = Handler.view_t.__doc__

    def random_state(self):
        """The inner handler's ``random_state()`` (no memory is touched)."""
        return self._inner.random_state()

    def set_random_state(self, state):
        """The inner handler's ``set_random_state(state)``."""
        self._inner.set_random_state(state)

    def pin(self, array):
        """Page-lock a host array (see ``Handler.pin``); touches no handler array."""
        return self._inner.pin(array)

    def empty_pinned(self, shape):
        """A page-locked host array (see ``Handler.empty_pinned``)."""
        return self._inner.empty_pinned(shape)

    def prefetch(self, batches, depth=2, into=None):
        """``Handler.prefetch`` through the wrapper: each yielded batch counts as
        written on this group (the group waits for its upload), so reading it
        on another group without an ordering point is a hazard."""
        batches = self._inner.prefetch(batches, depth, into)   # validates now
        return self._tracked_batches(batches)

    def _tracked_batches(self, batches):
        tracker = self._shared.tracker
        for batch in batches:
            arrays = batch if isinstance(batch, tuple) else (batch,)
            with self._shared.lock:
                tracker.commit("prefetch", self.group,
                               [("batch", a, byte_range(a), True) for a in arrays])
            yield batch

    # ---------------------------------------------------------------- ops
    def _call(self, name, args, kwargs):
        with self._shared.lock:
            return self._locked_call(name, args, kwargs)

    def _run_fused(self, op, args, kwargs):
        """A fused op's call (``handlers.fused.FusedOp``), checked like a table
        op: its reads, writes and aliasing come from its declaration's row."""
        def inner_op(*a, **k):
            return self._inner._run_fused(op, a, k)
        with self._shared.lock:
            return self._checked(op.name, op.row, op.method_signature, inner_op, args, kwargs)

    def _bind_fused(self, op, args, kwargs):
        """``FusedOp.bind``: the declaration's checks now (on the inner
        handler, nothing runs), and every call checked and tracked as an
        unbound call is."""
        op._checks(self._inner, *args, **kwargs)
        return functools.partial(self._run_fused, op, args, kwargs)

    def _locked_call(self, name, args, kwargs):
        return self._checked(name, OPS[name], _SIGNATURES[name], getattr(self._inner, name),
                             args, kwargs)

    def _checked(self, name, spec, signature, inner_op, args, kwargs):
        # The checks and tracking of one op: ``spec`` its row, ``signature``
        # its method's (self first), ``inner_op`` the inner handler's call.
        if spec.kind == "alloc":
            a = inner_op(*args, **kwargs)
            self._shared.tracker.fresh(a)
            if spec.finite and self._shared.check_finite:
                self._check_finite(name, [("result", a)], produced=True)
            return a
        try:
            bound = signature.bind(self, *args, **kwargs).arguments
        except TypeError:
            return inner_op(*args, **kwargs)   # wrong arity: the handler's own TypeError
        # Device scalars given as arrays are read when the op runs: inputs too.
        scalars = [n for n in spec.device_scalars
                   if isinstance(bound.get(n), self._inner.array_type)]
        arrays = [(n, bound[n]) for n in spec.arrays + tuple(scalars)]

        def check():
            check_arrays(self._inner, name, *(a for n, a in arrays if n not in spec.any_format))
            for n in spec.any_format:
                check_any_format(self._inner, name, bound[n])
        try:
            check()
        except (TypeError, ValueError):
            bad = True
        else:
            bad = False
        if bad:
            # Let the handler raise its own error, with its own precedence
            # between the arguments; re-check in case it did not.
            inner_op(*args, **kwargs)
            check()
        ranges = {n: byte_range(a) for n, a in arrays}
        self._check_aliasing(name, spec, bound, ranges)

        if spec.kind == "host_read":
            result = inner_op(*args, **kwargs)
            for n in spec.reads:
                self._shared.tracker.settle(bound[n])
            return result

        unread = {n for n, pred in spec.unread_if.items() if pred(bound)}
        reads = [n for n in spec.reads + tuple(scalars) if n not in unread]
        accesses = ([(n, bound[n], ranges[n], False) for n in reads]
                    + [(n, bound[n], ranges[n], True) for n in spec.writes])
        tracker = self._shared.tracker
        tracker.check(name, self.group, accesses)
        finite = (spec.finite and self._shared.check_finite
                  and self._inner._capture_box[0] is None)
        keep = []
        if finite:
            self._check_finite(name, [(n, bound[n]) for n in reads], produced=False)
            # Outputs are untouched when an op raises: keep a device copy of
            # each one to put back if the op produces NaN or Inf.
            keep = [(bound[n], self._format_of(bound[n])) for n in spec.writes]
            keep = [(a, fh, fh.allocate(a.shape)) for a, fh in keep]
            for a, fh, copy in keep:
                fh.copy_to(a, copy)
        result = inner_op(*args, **kwargs)
        tracker.commit(name, self.group, accesses)
        if finite:
            try:
                self._check_finite(name, [(n, bound[n]) for n in spec.writes], produced=True)
            except FloatingPointError:
                for a, fh, copy in keep:
                    fh.copy_to(copy, a)
                raise
        return result

    @staticmethod
    def _check_aliasing(name, spec, bound, ranges):
        for out in spec.writes:
            o_start, o_end = ranges[out]
            for n in spec.arrays:
                if n in spec.writes:
                    continue
                start, end = ranges[n]
                if not (start < o_end and o_start < end):
                    continue   # no common byte (empty arrays never overlap)
                o_shape, shape = tuple(bound[out].shape), tuple(bound[n].shape)
                if n in spec.disjoint:
                    raise ValueError(f"{name}: {out} (shape {o_shape}) must not overlap "
                                     f"{n} (shape {shape})")
                if (start, end) != (o_start, o_end):
                    raise ValueError(
                        f"{name}: {out} (shape {o_shape}) partially overlaps {n} "
                        f"(shape {shape}); {out} may be {n} itself, but a partial "
                        f"overlap is undefined")

    def _format_of(self, a):
        """The inner handler, or its twin of ``a``'s format where that differs
        (``cast_t``'s source, an array of a twin): an array is checked and
        copied by a handler of its own format, on this view's group."""
        inner = self._inner
        return inner if a.dtype == inner.dtype else inner.twin(a.dtype)

    def _check_finite(self, name, arrays, produced):
        # is_fully_finite runs on this view's group, after the op (or before
        # it, on inputs the hazard check found ready here), so it sees the
        # values the op saw.  It is deliberately not an ordering point for the
        # tracker: turning the flag on must not hide a hazard.
        for n, a in arrays:
            if not self._format_of(a).is_fully_finite(a):
                shape = tuple(a.shape)
                if produced:
                    raise FloatingPointError(
                        f"check_finite: {name} on stream group {self.group} produced "
                        f"NaN or Inf in {n} (shape {shape})")
                # Every checked op's outputs were finite, so it came from
                # outside: host data, allocate's undefined contents, or work
                # issued on the bare handler.
                raise FloatingPointError(
                    f"check_finite: input to op {name}: {n} (shape {shape}) holds NaN "
                    f"or Inf, not produced by an op of this DebugHandler")


def _make_method(name):
    base = getattr(Handler, name)

    def method(self, *args, **kwargs):
        return self._call(name, args, kwargs)

    functools.update_wrapper(method, base)   # name, signature (__wrapped__), doc
    method.__qualname__ = f"DebugHandler.{name}"
    method.__doc__ = (inspect.getdoc(base) or "") + "\n\nDebugHandler: " + OPS[name].describe()
    return method


for _name, _spec in OPS.items():
    if _spec.kind not in ("stream", "view"):
        setattr(DebugHandler, _name, _make_method(_name))
del _name, _spec
