"""The Handler contract: one op interface for every backend.

A handler owns memory and performs operations; layers call nothing else.  This
class *is* the documentation of the interface: each public op below validates its
arguments (cheaply, before any work) and then calls the backend's ``_op``
implementation.  Concrete handlers implement only the underscored methods.

Conventions shared by every op:

* Op names carry the shapes they take: ``_t`` any tensor, ``_m`` a matrix
  (2-D), ``_v`` a vector stored as an (n, 1) matrix, ``_s`` a scalar.
* Outputs come last and are written in place; ops return ``None``.  The
  exceptions return what their names say: the allocators and
  ``create_from_*`` a handler array, ``get_numpy_copy``/``is_fully_finite``/
  ``empty_pinned``/``pin`` host values, ``get_numpy_copy_async`` a handle
  (``done()``, ``result()``), ``record_event`` an event (``query()``,
  ``synchronize()``), ``with_streams`` a view and ``prefetch`` an iterator.
* Arrays must be C-contiguous, of the handler's ``array_type`` and ``dtype``.
  A wrong type or dtype raises ``TypeError``; a shape mismatch, a bad axis or a
  non-contiguous array raises ``ValueError``.  Messages name the op and the
  shapes.  Outputs are untouched when an op raises.
* Aliasing: elementwise ops allow ``out`` to be one of their inputs (the very
  same array); a partial overlap between an input and ``out`` is undefined.
  ``dot_mm``, ``dot_add_mm`` and ``sum_t`` forbid any overlap between ``out``
  and their inputs and raise ``ValueError`` when they see one.
* Streams: ops on one stream group run in issue order; ops on different groups
  may overlap and are ordered only by ``record_event``/``wait_event``,
  ``wait_for`` and the synchronize calls.  ``with_streams(k)`` returns a view
  of the handler whose ops run on group ``k``.
* Graphs: ``with h.capture() as g:`` records the ops issued in the block
  instead of running them; ``g.replay()`` runs them all again, with one
  launch on a GPU.  Calls that wait for the device or allocate raise
  ``CaptureError`` inside a capture (see ``capture``).
"""
from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod, update_abstractmethods
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from . import attention, closed, dtypes, hooks
from .activations import DOT_ACTS, bias_body
from .checks import (
    check_arrays,
    check_shape_arg,
    check_writable,
    fail_type,
    fail_value,
)
from .fused import fused_op
from .graphs import SHADOWED, CaptureError, Graph, own_methods
from .optable import OPS, PUBLIC, _method
from .shape_rules import reduced_size

#: Stands for a handler array in signatures.  It is an instance of the
#: handler's ``array_type`` (``numpy.ndarray`` on NumpyHandler,
#: ``pycuda.gpuarray.GPUArray`` on PyCudaHandler), C-contiguous and of the
#: handler's ``dtype``.
Array = Any
#: Stands for a shape argument in signatures, an int or a tuple of
#: non-negative ints.
Shape = int | tuple[int, ...]


_VIEW_CLASSES = {}   # handler class -> its view class


def _view_class(cls):
    """The class of ``cls``'s stream-group views: ``cls`` plus slots for the
    per-group attributes (``cls._VIEW_ATTRS``) and the hooks a capture shadows."""
    view_cls = _VIEW_CLASSES.get(cls)
    if view_cls is None:
        ns = {"__slots__": tuple(dict.fromkeys(cls._VIEW_ATTRS + SHADOWED)),
              "__module__": cls.__module__, "__qualname__": cls.__qualname__,
              "__doc__": f"A stream-group view of a {cls.__name__} (see with_streams)."}
        view_cls = _VIEW_CLASSES[cls] = type(cls)(cls.__name__, (cls,), ns)
    return view_cls


def install_ops(cls):
    """Class decorator: give ``cls`` (the contract) a method per row of the
    op table with a ``shape``: the functions of ``handlers/generated_ops.py``.
    A row that file lacks (one just added) is built from its source in
    memory, with a warning to write the file out again."""
    try:
        from . import generated_ops
    except ImportError:   # not written yet
        generated_ops = None
    missing = [name for name in PUBLIC if not hasattr(generated_ops, name)]
    if missing:
        warnings.warn(f"handlers/generated_ops.py lacks {missing[:3]}{'...' if missing[3:] else ''}"
                      f": run python -m handlers.generate to write it", stacklevel=2)
    for name, op in PUBLIC.items():
        if name in vars(cls):
            raise TypeError(f"{cls.__name__}.{name} is written by hand and in the op table")
        fn = _method(op) if name in missing else getattr(generated_ops, name)
        fn.__qualname__ = f"{cls.__name__}.{name}"
        fn.__module__ = cls.__module__
        setattr(cls, name, fn)
    return cls


@install_ops   # the array ops, one method per row of handlers.optable
class Handler(ABC):
    """Abstract base of all handlers.

    The ops that take arrays and issue work (``dot_mm``, ``sum_t``,
    ``add_tt``, ``relu``, ...) are made from the rows of
    :data:`handlers.optable.OPS`, which holds their signatures, docstrings
    and rules; memory, transfers, streams and graphs are written below.
    A subclass must implement every backend hook marked abstract (it cannot
    be instantiated otherwise).

    Args:
        dtype: ``np.float32`` (default), ``np.float64``, and on handlers
            that hold them (``supported_dtypes``) ``np.float16`` or
            bfloat16 (``ml_dtypes.bfloat16`` or ``"bfloat16"``; see
            :mod:`handlers.dtypes`); every array the handler creates or
            accepts has this dtype.
        seed: seed of the handler's random generator, None (a random seed)
            or an int >= 0 (NumPy integers too); the same seed gives the
            same sequence of ``fill_gaussian`` and ``generate_probability_mask``
            results on the same handler class.  Anything else raises
            TypeError (ValueError for a negative int) naming the handler.
        num_stream_groups: number of stream groups (group 0 is the default).
            A group is one stream on a GPU: no op uses more than one.
    """

    #: The class of arrays this handler accepts and returns.
    array_type = None
    #: Subclasses of ``array_type`` that ops refuse (their semantics differ:
    #: ``numpy.matrix`` is always 2-D and multiplies as matrices).
    refused_array_types = ()
    #: True where an array of ``array_type`` may be read-only memory: the ops
    #: then check that their outputs are writeable (before writing any).
    read_only_arrays = False
    #: The names of the formats this handler holds (``numpy.dtype.name``).
    supported_dtypes = ("float32", "float64")
    #: True where replaying a captured step costs less host time than
    #: issuing its ops (a GPU handler); ``Trainer`` captures by default there.
    prefers_graphs = False
    #: What carries collectives on this handler's arrays between processes
    #: (``handlers.process_group``): "mpi", "nccl", or None (none).
    collective_backend = None

    def __init__(self, dtype: DTypeLike = np.float32, seed: int | None = None,
                 num_stream_groups: int = 4) -> None:
        dt = self._held_format(type(self).__name__, dtype)
        v = num_stream_groups
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{type(self).__name__}: num_stream_groups must be a positive int, "
                             f"got {v!r}")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
                raise TypeError(f"{type(self).__name__}: seed must be None or an int >= 0, "
                                f"got {seed!r}")
            if seed < 0:
                raise ValueError(f"{type(self).__name__}: seed must be None or an int >= 0, "
                                 f"got {seed!r}")
            seed = int(seed)
        self.dtype = dt
        self.seed = seed
        self.num_stream_groups = int(num_stream_groups)
        #: index of the stream group this handler (or view) issues work on
        self.group = 0
        self._views = {0: self}
        self._c_strides = {}   # shape -> C-contiguous strides, for the checks' fast path
        self._sum_shapes = {}  # (a.shape, axis, out.shape) -> axis, checked (sum_t)
        # Shared by every view (views copy this dict): the capture in
        # progress (a graphs.Recording) and whether close() was called.
        self._capture_box = [None]
        self._closed_box = [False]
        # format name -> the twin of that format (twin), shared by all twins
        self._twins = {dt.name: self}

    @classmethod
    def _held_format(cls, who, dtype):
        """``dtype`` resolved (``dtypes.resolve``), or TypeError naming ``who``
        if it is not a format or not one the class holds (``supported_dtypes``)."""
        try:
            dt = dtypes.resolve(dtype)
        except TypeError as e:
            raise TypeError(f"{who}: {e}") from None
        if dt.name not in cls.supported_dtypes:
            raise TypeError(f"{who} does not support {dt} yet; it takes "
                            f"{', '.join(cls.supported_dtypes)}")
        return dt

    def __repr__(self):
        return f"{type(self).__name__}(dtype={self.dtype.name}, group={self.group})"

    # ------------------------------------------------------------------ streams
    def with_streams(self, k: int) -> Handler:
        """Return a view of this handler whose ops run on stream group ``k``.

        The view shares memory, kernels and state with the handler and has the
        same op interface and validation.  It is also a context manager that
        yields itself.  Views are cached, so the call is cheap.  Raises
        ``ValueError`` if ``k`` is not in ``range(num_stream_groups)``.
        """
        root = self._views[0]
        # Validate before the cache lookup: True and 1.0 hash like 1.
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) \
                or not 0 <= k < root.num_stream_groups:
            raise ValueError(f"with_streams: stream group {k!r} is not in "
                             f"range({root.num_stream_groups})")
        view = root._views.get(k)
        if view is None:
            view = root._make_view(int(k))
            root._views[int(k)] = view
        return view

    def twin(self, dtype: DTypeLike) -> Handler:
        """A handler of format ``dtype`` on this handler's device and memory,
        which issues its ops on the same stream group as this one.

        Twins exist for mixed precision: float32 master weights on the twin
        of a bfloat16 handler, say, with ``cast_t`` carrying values between
        the two formats.  Work on a twin is ordered with this handler's work
        on the same group, as if one handler had issued both.  A handler's
        twin of its own format is itself; twins are made once and cached, and
        ``twin`` on a twin returns the same family.  Closing one closes all.
        A capture begun on any of them records the work of all (one capture
        at a time in a family).  TypeError for a format the class does not
        hold (``supported_dtypes``).
        """
        dt = self._held_format(f"twin: {type(self).__name__}", dtype)
        root = self._twins.get(dt.name)
        if root is None:
            self._not_capturing("twin")
            root = self._views[0]._make_twin(dt)
            root._twins = self._twins
            root._closed_box = self._closed_box
            root._capture_box = self._capture_box   # one capture covers the family
            self._twins[dt.name] = root
        return root.with_streams(self.group)

    def _make_twin(self, dtype):
        """A new handler of ``dtype`` sharing this one's device and streams
        (``twin`` then shares the twin registry and the closed state)."""
        raise NotImplementedError(f"{type(self).__name__} cannot make a twin of another format "
                                  f"yet (one that shares its streams)")

    #: Attributes a stream-group view has of its own (the rest is the handler's).
    _VIEW_ATTRS = ("group",)

    def _family_views(self):
        """Every view made so far of this handler and of its twins (a
        handler is its own group-0 view)."""
        return [v for m in self._twins.values() for v in m._views.values()]

    def _make_view(self, k):
        # A view is the handler's state seen from group k: it shares the
        # handler's __dict__ (nothing copied, nothing to keep in step) and
        # holds in slots only what differs per group, plus its own bound
        # hooks, which a capture shadows view by view.
        view = object.__new__(_view_class(type(self)))
        view.__dict__ = self.__dict__
        view.group = k
        own_methods(view)
        return view

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def record_event(self) -> Any:
        """Record an event on this group and return it; returns without waiting.

        The event completes when all work issued on this group before the call
        has finished.  Pass it to ``wait_event`` on another group.
        """
        return self._record_event()

    def wait_event(self, event: Any) -> None:
        """Make work issued later on this group wait for ``event``.

        Returns without blocking the host; only future operations on this group
        are affected.
        """
        self._wait_event(event)

    def wait_for(self, other: Handler) -> None:
        """Make later work on this group wait for all work issued so far on
        ``other`` (a handler view of the same handler).  Does not block the host."""
        if getattr(other, "_views", None) is not self._views:
            fail_value("wait_for", "other must be a view of the same handler")
        if other.group != self.group:
            self._wait_for(other)

    def _wait_for(self, other):
        self._wait_event(other._record_event())

    def synchronize(self) -> None:
        """Block the host until all work issued on this group has finished."""
        self._not_capturing("synchronize")
        self._synchronize()

    def synchronize_all_streams(self) -> None:
        """Block the host until all work issued on every group has finished."""
        self._not_capturing("synchronize_all_streams")
        self._synchronize_all()

    # ------------------------------------------------------------------ graphs
    def capture(self, fn: Any = None) -> Graph:
        """Record work once to replay it many times: ``with h.capture() as g:
        <ops>``, then ``g.replay()``; or ``g = h.capture(fn)``, which records
        what ``fn()`` issues.

        Ops issued inside the capture are validated as usual but not run; a
        ``Graph`` holds them, and ``g.replay()`` queues them all on this
        handler's group (one launch on a GPU) and returns without waiting.
        The capture begins on this view's group.  Other groups take part by
        forking from it (``wait_event`` on an event recorded inside the
        capture, or ``wait_for`` a group already in it) and must join back
        (this group waits for each of them) before the capture ends;
        otherwise ``CaptureError`` names the group, and nothing is recorded.

        A graph reads and writes the very arrays its ops were given, so feed
        a replay by writing into the arrays the capture read (``copy_to`` from
        a prefetched batch, or ``set_from_numpy``) and read its results from
        the arrays it wrote.  Values fixed at capture time: scalar
        arguments and shapes.  A value that must change between replays is
        passed as a device scalar where the op accepts one (``axpby``'s
        ``alpha``/``beta``: a one-element array, read when the op runs).
        Random ops draw fresh values on every replay, the same sequence as
        eager calls would with the same seed.

        Inside a capture these raise ``CaptureError`` before doing anything:
        calls that wait for the device (``get_numpy_copy``,
        ``get_numpy_copy_async``, ``is_fully_finite``, ``synchronize``,
        ``synchronize_all_streams``, ``set_from_numpy``, ``prefetch``, an
        event's ``query``/``synchronize``), calls that allocate
        (``allocate``, ``zeros``, ``ones``, ``create_from_numpy``,
        ``create_from_device_array``, ``pin``), waiting on an event recorded
        outside the capture, work on a group that has not forked from the
        capture, and a second capture.  A capture belongs to the thread
        that began it: while it is in progress, any call from another thread
        that would issue work on the handler, its views or its twins (an op,
        an event, one of the calls above) raises ``CaptureError`` naming
        that thread, and does nothing.  Allocate the arrays a step needs
        before capturing it (running it once eagerly does that).  An
        exception inside the ``with`` block discards the recording and
        leaves the handler as it was before the capture.
        """
        g = Graph(self)
        if fn is None:
            return g
        with g:
            fn()
        return g

    def close(self) -> None:
        """Finish the work issued so far and release the handler's device
        resources (streams' library handles, events); graphs of this handler
        cannot be replayed afterwards.  Safe to call twice.

        Closing closes the handler's views and twins too.  Afterwards every
        op of any of them raises ``CaptureError`` (a ``RuntimeError``)
        "<op>: the handler is closed" before touching memory, on every
        handler class (``handlers.closed``); an open handler's ops pay
        nothing for this."""
        self._not_capturing("close")
        if not self._closed_box[0]:
            self._closed_box[0] = True
            self._close()
            closed.install(self)

    # ------------------------------------------------------------------ random state
    def random_state(self) -> dict:
        """The state of the generator that ``fill_gaussian`` and
        ``generate_probability_mask`` draw from, as a dict of plain values
        (ints and str, JSON-serializable): ``{"generator": name, ...}``.

        One generator serves a handler, its views and its twins, so this is
        the state of all of them.  ``set_random_state`` on a handler of the
        same class restores it, after which the draws repeat those that
        followed the call (what a checkpoint needs to resume bit for bit).
        Issued draws count at once (a GPU handler reserves its values on
        the host when it issues the op): nothing here waits for the device.
        Not inside a capture (``CaptureError``)."""
        self._not_capturing("random_state")
        return self._random_state()

    def set_random_state(self, state: dict) -> None:
        """Restore a ``random_state()`` of a handler of the same class (of
        any format or seed: the state holds the seed).  ValueError, with
        nothing changed, for a state of another generator (another handler
        class) or one that is not such a dict."""
        self._not_capturing("set_random_state")
        mine = self._random_state()["generator"]
        theirs = state.get("generator") if isinstance(state, dict) else None
        if theirs != mine:
            raise ValueError(f"set_random_state: {type(self).__name__} draws from the generator "
                             f"{mine!r}; the state given is of {theirs!r}"
                             if theirs is not None else
                             f"set_random_state: expected a dict from random_state(), got "
                             f"{type(state).__name__}")
        self._set_random_state(state)

    def _random_state(self):
        raise NotImplementedError(f"{type(self).__name__} does not expose its random state")

    def _set_random_state(self, state):
        raise NotImplementedError(f"{type(self).__name__} does not expose its random state")

    def _run_fused(self, op, args, kwargs):
        """A fused op's call (``handlers.fused.FusedOp``): the checks its
        declaration derives, then ``_fused`` on this group."""
        return op._method(self, *args, **kwargs)

    def _bind_fused(self, op, args, kwargs):
        """``FusedOp.bind``: the checks now, then ``_fused`` on the checked
        arguments at each call (PyCudaHandler prepares the launch itself)."""
        checked = op._checks(self, *args, **kwargs)
        # self._fused looked up at each call: a capture shadows it to record.
        return lambda: self._fused(op, *checked)

    def _not_capturing(self, op):
        """Raise ``CaptureError`` if a capture is in progress (``op`` waits
        for the device or allocates, which a graph cannot record)."""
        rec = self._capture_box[0]
        if rec is not None:
            rec.check_thread(op)   # another thread's call: say so
            raise CaptureError(f"{op} is not allowed inside a capture: it waits for the device "
                               f"or allocates memory; do it before the capture or after a "
                               f"replay", op)

    def _check_open(self, op):
        if self._closed_box[0]:
            raise CaptureError(f"{op}: the handler is closed", op)

    # ------------------------------------------------------------------ memory
    def allocate(self, shape: Shape) -> Array:
        """Return a new array of ``shape`` with undefined contents.

        The array is ready for use on every stream group when returned.  A
        shape of more than 2**63 - 1 bytes, which no machine holds, raises
        ValueError naming the shape and the bytes (as ``zeros``, ``ones``
        and ``empty_pinned`` do); one too big for the memory at hand raises
        the backend's ``MemoryError``.
        """
        self._not_capturing("allocate")
        return self._allocate(check_shape_arg("allocate", shape, self.dtype.itemsize))

    def zeros(self, shape: Shape) -> Array:
        """Return a new array of ``shape`` filled with 0, ready on every group."""
        self._not_capturing("zeros")
        a = self._allocate(check_shape_arg("zeros", shape, self.dtype.itemsize))
        self._fill(a, 0.0)
        self._ready(a)
        return a

    def ones(self, shape: Shape) -> Array:
        """Return a new array of ``shape`` filled with 1, ready on every group."""
        self._not_capturing("ones")
        a = self._allocate(check_shape_arg("ones", shape, self.dtype.itemsize))
        self._fill(a, 1.0)
        self._ready(a)
        return a

    def create_from_numpy(self, arr: np.ndarray) -> Array:
        """Return a new handler array holding a copy of the NumPy array ``arr``.

        ``arr`` may have any real dtype and layout; it is converted to the
        handler's dtype.  The result is ready on every stream group.
        """
        self._not_capturing("create_from_numpy")
        arr = self._host_input("create_from_numpy", arr)
        a = self._allocate(arr.shape)
        self._set_from_numpy(a, arr)
        self._ready(a)
        return a

    def create_from_device_array(self, obj: Any) -> Array:
        """Wrap an array of another library as a handler array, without a copy.

        On PyCudaHandler ``obj`` exposes ``__cuda_array_interface__`` (a CuPy
        array, a PyTorch CUDA tensor, ...); on NumpyHandler it exposes the
        NumPy array interface.  It must be C-contiguous and of the handler's
        dtype (``ValueError``/``TypeError`` otherwise).  The result shares
        memory with ``obj`` and keeps it alive.  Work the other library queued
        on ``obj`` is finished first when ``obj`` names a stream (PyCudaHandler
        then synchronizes the device); otherwise order it yourself, e.g. with
        ``torch.cuda.synchronize()``.  The other way round, handler arrays
        expose the same interfaces, so ``torch.as_tensor(a, device="cuda")``
        or ``cupy.asarray(a)`` wrap them without a copy once the handler's
        work on them is done (``synchronize_all_streams``).
        """
        self._not_capturing("create_from_device_array")
        return self._wrap(obj)

    def reshape_t(self, a: Array, shape: Shape) -> Array:
        """A view of ``a`` with ``shape``: the same elements in C order, the
        same memory.  One dimension may be -1 (inferred).  Writes through either
        array change both, and ops treat them as the same memory (so aliasing
        rules apply to them as to ``a``).  No work is issued."""
        check_arrays(self, "reshape_t", a)
        if isinstance(shape, tuple) and shape.count(-1) == 1:
            known = math.prod(d for d in shape if d != -1)
            if known and a.size % known == 0:
                shape = tuple(a.size // known if d == -1 else d for d in shape)
        shape = check_shape_arg("reshape_t", shape)
        if math.prod(shape) != a.size:
            fail_value("reshape_t", f"cannot view {a.shape} ({a.size} elements) as {shape}")
        return self._view(a, 0, shape)

    def view_t(self, a: Array, offset: int, shape: Shape) -> Array:
        """A view of ``shape`` over elements ``[offset, offset + size)`` of
        ``a`` taken flat in C order: the same memory, as ``reshape_t``.  Layers
        cut their weights out of one flat parameter buffer this way."""
        check_arrays(self, "view_t", a)
        shape = check_shape_arg("view_t", shape)
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
            fail_type("view_t", f"offset must be an int, got {type(offset).__name__}")
        size = math.prod(shape)
        if offset < 0 or offset + size > a.size:
            fail_value("view_t", f"[{offset}, {offset + size}) is outside an array of "
                                 f"{a.size} elements (shape {a.shape})")
        return self._view(a, int(offset), shape)

    def get_numpy_copy(self, a: Array) -> np.ndarray:
        """Return a NumPy copy of ``a``, including all work issued before the call
        on any stream group.  Blocks the host until the data is available."""
        self._not_capturing("get_numpy_copy")
        check_arrays(self, "get_numpy_copy", a)
        return self._get_numpy_copy(a)

    def set_from_numpy(self, a: Array, arr: np.ndarray) -> None:
        """Copy the NumPy array ``arr`` (same shape, any real dtype) into ``a``.

        The copy is ordered after work already issued on this group.
        """
        self._not_capturing("set_from_numpy")
        check_arrays(self, "set_from_numpy", a)
        if self.read_only_arrays:
            check_writable("set_from_numpy", ("a",), a)
        arr = self._host_input("set_from_numpy", arr)
        if arr.shape != a.shape:
            fail_value("set_from_numpy", f"shapes differ: {a.shape} and host {arr.shape}")
        self._set_from_numpy(a, arr)

    def _host_input(self, op, arr):
        if isinstance(arr, np.ma.MaskedArray):
            raise TypeError(f"{op}: a numpy.ma.MaskedArray's mask would be ignored; pass "
                            f"arr.filled(value) or arr.data")
        if not isinstance(arr, np.ndarray):
            if isinstance(arr, (list, tuple)) or np.isscalar(arr):
                arr = np.asarray(arr)
            else:
                raise TypeError(f"{op}: expected a numpy.ndarray, got {type(arr).__name__}")
        if not dtypes.is_real(arr.dtype):
            raise TypeError(f"{op}: expected a real numeric array, got dtype {arr.dtype}")
        # Not np.ascontiguousarray: it turns a 0-d array into shape (1,).  A
        # number beyond the format's range becomes inf (documented), not a warning.
        with np.errstate(over="ignore"):
            return np.asarray(arr, dtype=self.dtype, order="C")

    # ------------------------------------------------------------------ input pipeline
    def prefetch(self, batches: Iterable[Any], depth: int = 2,
                 into: Sequence[Any] | None = None) -> Iterator[Any]:
        """Iterate over ``batches`` as handler arrays, preparing the next ones
        while the current one is being used.

        ``batches`` is any iterable of NumPy arrays or tuples of them (rank >=
        1, any real dtype; the last batch may be smaller).  Yields a handler
        array, or a tuple of them, per item.  A background thread copies the
        next batches into staging memory (page-locked on a GPU) and up to
        ``depth`` uploads run ahead on a dedicated upload stream; this group
        waits for each upload before its later work.  A yielded batch stays
        valid until the next one is requested.  An exception raised by
        ``batches`` is re-raised here; ``break`` or ``close()`` stops and joins
        the thread.  Items that are C-contiguous slices of an array returned by
        ``pin`` (in the handler's dtype) are uploaded with no host copy.

        ``into`` (optional) names where batches land: a list of at least
        ``depth`` destinations, each a handler array or a tuple of them (one
        per array of an item).  A batch whose arrays have exactly the
        destination's shapes is uploaded into a free destination, and that
        destination's own arrays are yielded, so work captured on them
        (``capture``) replays on every such batch with no device copy.  Other
        batches (a smaller last one, say) go to buffers of prefetch's own.
        Destinations must not overlap one another nor be used for anything
        else during the iteration.
        """
        self._not_capturing("prefetch")
        from .prefetch import destinations, prefetch
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
            fail_value("prefetch", f"depth must be a positive int, got {depth!r}")
        dests = None if into is None else destinations(self, into, int(depth))
        return prefetch(self, batches, int(depth), self._transfer(), dests)

    def pin(self, array: np.ndarray) -> np.ndarray:
        """Page-lock the memory of ``array`` (C-contiguous NumPy) in place and
        return ``array``, so that uploads from it, and from its slices, need no
        staging copy.

        Use it (or slices of it) as the source of ``prefetch`` and as ``out``
        of ``get_numpy_copy_async``.  The memory stays page-locked, and the
        array referenced, for the life of the process's CUDA context; pin a
        data set once, not a batch per step.  On NumpyHandler it only returns
        ``array``.
        """
        self._not_capturing("pin")
        if not isinstance(array, np.ndarray):
            raise TypeError(f"pin: expected a numpy.ndarray, got {type(array).__name__}")
        if not array.flags.c_contiguous:
            fail_value("pin", f"array of shape {array.shape} is not C-contiguous")
        return self._pin(array)

    def empty_pinned(self, shape: Shape) -> np.ndarray:
        """Return a new NumPy array of ``shape`` and the handler's dtype in
        page-locked host memory (plain memory on NumpyHandler): the ``out`` to
        give ``get_numpy_copy_async`` for copies that do not block the host."""
        return self._empty_pinned(check_shape_arg("empty_pinned", shape, self.dtype.itemsize))

    def get_numpy_copy_async(self, a: Array, out: np.ndarray | None = None) -> Any:
        """Start copying ``a`` to the host and return a handle whose
        ``result()`` blocks until the copy is done and returns the NumPy array
        (``done()`` says, without blocking, whether it is).

        The copy is ordered after the work issued before it on this group.
        ``out``, if given, is a C-contiguous NumPy array of ``a``'s shape and
        the handler's dtype that receives the data; make it with
        ``empty_pinned`` (or ``pin``) so the copy does not block the host.  Do
        not read ``out`` before ``result()``.
        """
        self._not_capturing("get_numpy_copy_async")
        check_arrays(self, "get_numpy_copy_async", a)
        if out is None:
            out = np.empty(a.shape, self.dtype)
        elif not isinstance(out, np.ndarray):
            raise TypeError(f"get_numpy_copy_async: out must be a numpy.ndarray, "
                            f"got {type(out).__name__}")
        elif out.dtype != self.dtype:
            raise TypeError(f"get_numpy_copy_async: out dtype {out.dtype} is not {self.dtype}")
        elif out.shape != a.shape or not out.flags.c_contiguous:
            fail_value("get_numpy_copy_async", f"out must be C-contiguous with shape "
                                               f"{a.shape}, got {out.shape}")
        return self._copy_async(a, out)

    # ------------------------------------------------------------------ backend hooks
    # Concrete handlers implement these.  Arguments are already validated.

    # Graphs (handlers.graphs).  The defaults record the backend calls and
    # replay them in order, which is a complete implementation for a handler
    # whose ops run at once (NumpyHandler).  _graph_defers_calls says whether
    # a call inside a capture is only recorded (True) or also issued on a
    # capturing stream (False).
    _graph_defers_calls = True

    def _graph_begin(self, recording):
        """Start capturing on this view's group (its hooks are already shadowed)."""

    def _graph_end(self, recording):
        """Finish the capture; return what ``_graph_replay`` runs."""
        return recording.calls

    def _graph_abort(self, recording):
        """Discard a capture that failed; the handler must stay usable."""

    def _graph_replay(self, exe, graph):
        """Run a finished capture again."""
        for impl, view, args in exe:
            impl(view, *args)

    def _graph_free(self, exe):
        """Release a finished capture."""

    def _dot_bias_act(self, a, b, bias, out, act):
        """dot_bias_act's work: the product, then the bias and activation
        (:data:`EPILOGUES`) in place."""
        self._dot(a, b, out, False, False, 0.0)
        self._fused(EPILOGUES[act], out, bias, out)

    def _attention_forward(self, q, k, v, out, lse, causal, scale):
        """attention_forward's work: batched products and a fused softmax
        (``handlers.attention.forward``)."""
        attention.forward(self, q, k, v, out, lse, causal, scale)

    def _attention_backward(self, q, k, v, out, lse, dout, dq, dk, dv, causal, scale):
        """attention_backward's work (``handlers.attention.backward``)."""
        attention.backward(self, q, k, v, out, lse, dout, dq, dk, dv, causal, scale)

    def _conv2d_bias_act(self, x, w, bias, out, stride, padding, dilation, act):
        """conv2d_bias_act's work: the convolution, then the bias and
        activation (:data:`CONV_EPILOGUES`) in place, one image at a time
        (each image's (K, P*Q) planes as rows, the bias a column)."""
        self._conv2d("forward", x, w, out, stride, padding, dilation)
        n, k = out.shape[:2]
        plane = out.size // (n * k)
        col = self._view(bias, 0, (k, 1))
        for i in range(n):
            rows = self._view(out, i * k * plane, (k, plane))
            self._fused(CONV_EPILOGUES[act], rows, col, rows)

    def _mean_t(self, a, axis, out):
        """mean_t's work: the sum, then one scaling (NaN over an empty axis)."""
        self._sum_t(a, axis, out)
        n = reduced_size(a.shape, axis)
        if n == 0:
            self._fill(out, math.nan)
        elif n != 1:
            self._elementwise(OPS["mult_st"], 1.0 / n, out, out)

    def _view(self, a, offset, shape):
        """A view of ``shape`` at element ``offset`` of ``a`` (checked)."""
        flat = a if len(a.shape) == 1 else a.reshape(a.size)
        return flat[offset:offset + math.prod(shape)].reshape(shape)

    def _close(self):
        """Release device resources (``close``)."""

    def _ready(self, a):
        """Make a freshly created array safe to use from every stream group."""

    # The hooks every backend must implement.
    @abstractmethod
    def _overlaps(self, a, b):
        """True if the memory of arrays ``a`` and ``b`` may overlap."""

    @abstractmethod
    def _span(self, a):
        """(first byte, end byte) of the C-contiguous array ``a``'s memory;
        (0, 0) for an empty array, which overlaps nothing."""

    def _check_overlaps(self, op, names, disjoint, exact, *arrays):
        """The overlap rules of an op with many of them (the made methods of
        ``handlers.optable`` call this beyond a few rules): ``arrays`` named
        ``names``; ``disjoint`` index pairs must not overlap at all, ``exact``
        pairs may overlap only as the very same memory.  Raises ValueError
        naming the first broken rule."""
        spans = [self._span(a) for a in arrays]
        for i, j in disjoint:
            (a0, a1), (b0, b1) = spans[i], spans[j]
            if a0 < b1 and b0 < a1:
                fail_value(op, f"{names[i]} must not overlap {names[j]}")
        for i, j in exact:
            (a0, a1), (b0, b1) = spans[i], spans[j]
            if a0 < b1 and b0 < a1 and spans[i] != spans[j]:
                fail_value(op, f"{names[i]} must be {names[j]} or not overlap it")

    def _same_memory(self, a, b):
        """True if ``a`` and ``b`` (C-contiguous) are the very same memory:
        same start and same size, whether or not they are one object."""
        return a is b or self._span(a) == self._span(b)

    @abstractmethod
    def _elementwise(self, op, *args):
        """Run the elementwise row ``op`` (an ``optable.Op``) on ``args``,
        the public method's arguments in order, scalars as floats."""

    def _strides_of(self, shape):
        """The strides of a C-contiguous array of ``shape`` and this dtype (cached)."""
        strides = self._c_strides.get(shape)
        if strides is None:
            step, out = self.dtype.itemsize, []
            for dim in reversed(shape):
                out.append(step)
                step *= dim
            strides = self._c_strides[shape] = tuple(reversed(out))
        return strides

    def _c_contiguous(self, a):
        """True if ``a`` (already of ``array_type``) is C-contiguous."""
        # Comparing strides is much cheaper than GPUArray.flags (~0.5 us per
        # access); arrays with other strides (size-1 dimensions, say) take the
        # exact test.
        return a.strides == self._strides_of(a.shape) or a.flags.c_contiguous


#: act -> the fused op (z, b, y) of ``dot_bias_act``'s epilogue, y = act(z + b)
#: with b a row (1, n), run after a plain product
EPILOGUES = {act: fused_op(f"dot_bias_{act}" if act else "dot_bias", inputs="z b:row",
                           outputs="y", body=bias_body(act)) for act in DOT_ACTS}
#: act -> the same for ``conv2d_bias_act``, over one image's (K, P*Q) planes
#: with b one value per plane, (K, 1)
CONV_EPILOGUES = {act: fused_op(f"conv2d_bias_{act}" if act else "conv2d_bias",
                                inputs="z b:col", outputs="y", body=bias_body(act))
                  for act in DOT_ACTS}


def _abstract_hook(name, doc):
    def hook(self, *args):
        raise NotImplementedError(name)
    hook.__name__, hook.__qualname__, hook.__doc__ = name, f"Handler.{name}", doc
    return abstractmethod(hook)


for _name, _doc in hooks.ABSTRACT:   # the hooks every backend writes
    setattr(Handler, _name, _abstract_hook(_name, _doc))
del _name, _doc
update_abstractmethods(Handler)
