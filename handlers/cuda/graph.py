"""CUDA graphs through the driver API: stream capture, instantiation, launch.

These calls, like every driver call of the package, go through the
``handlers.cuda._launch`` extension (``kernel_loader.require()``).  A failed capture call raises
``CaptureError`` (the capture cannot go on); a failed launch or memset raises
``CudaError``; both name the call and the driver's status.  Capture uses
relaxed mode: the handler itself refuses every call that a graph cannot
record (see ``handlers.graphs``), and relaxed mode lets the memory pool hand
out scratch memory while a capture is in progress, which the graph then owns.

After the driver calls come PyCudaHandler's graph hooks (``_graph_begin``
and the others of ``handlers.base``), functions of the handler assigned in
its class body, and the ``Executable`` that a capture returns.
"""
import contextlib
import weakref

from ..graphs import CaptureError
from . import context as cuda_context
from . import kernel_loader, one_call
from .kernel_loader import CudaError

_CAPTURE_MODE_RELAXED = 2
_CAPTURE_STATUS_ACTIVE = 1


def _capture_call(fn, *args):
    """``fn(*args)``, a failed driver call raised as CaptureError."""
    try:
        return fn(*args)
    except CudaError as e:
        raise CaptureError(str(e), e.op) from e


def begin(stream):
    """Start capturing the work issued on ``stream`` (a driver handle, int)."""
    _capture_call(kernel_loader.require().capture_begin, stream, _CAPTURE_MODE_RELAXED)


def end(stream):
    """End the capture on ``stream`` and return the graph (a driver handle)."""
    return _capture_call(kernel_loader.require().capture_end, stream)


def abort(stream):
    """End a capture that failed, ignoring the driver's verdict, and free
    whatever graph it produced."""
    ext = kernel_loader.require()
    with contextlib.suppress(CudaError):
        graph = ext.capture_end(stream)
        if graph:
            ext.graph_destroy(graph)


def is_capturing(stream):
    """Whether ``stream`` is part of an active capture (not one invalidated)."""
    status = _capture_call(kernel_loader.require().capture_status, stream)
    return status == _CAPTURE_STATUS_ACTIVE


def node_count(graph):
    """The number of nodes of ``graph``."""
    return _capture_call(kernel_loader.require().graph_node_count, graph)


def instantiate(graph):
    """The executable form of ``graph`` (a driver handle)."""
    return _capture_call(kernel_loader.require().graph_instantiate, graph)


def launch(exe, stream):
    """Queue one run of the executable graph ``exe`` on ``stream``."""
    kernel_loader.require().graph_launch(exe, stream)


def set_u64(address, value, stream):
    """Queue writing the 64-bit ``value`` at device ``address`` on ``stream``
    (two 32-bit memsets: no host buffer has to outlive the call)."""
    memset = kernel_loader.require().memset_d32
    memset(address, value & 0xFFFFFFFF, 1, stream)
    memset(address + 4, value >> 32, 1, stream)


def destroy(exe, graph):
    """Free an executable graph and its graph (either may be 0).  A failed
    free is not reported: this runs from finalizers and after other errors,
    where raising would hide the first failure."""
    ext = kernel_loader.require()
    if exe:
        with contextlib.suppress(CudaError):
            ext.graph_exec_destroy(exe)
    if graph:
        with contextlib.suppress(CudaError):
            ext.graph_destroy(graph)


class Executable:
    """A captured CUDA graph, ready to launch, and what it needs alive."""

    def __init__(self, exe, graph, origin, others, cell, draws, keep):
        self.exe, self.graph = exe, graph
        self.origin, self.stream, self.others = origin, origin.stream.handle, others
        self.cell, self.draws = cell, draws    # the graph's random counter, values per replay
        self.cell_value = None                 # what the counter holds after the last replay
        self.keep = keep                       # the recorded calls' arrays, scratch memory
        self._free = GraphFree(exe, graph)
        weakref.finalize(self, self._free).atexit = False
        cuda_context.at_exit(self._free)

    def free(self):
        self._free()
        self.keep = None


class GraphFree:
    """Destroys a graph once, on the thread that owns the context."""

    def __init__(self, exe, graph):
        self.handles = (exe, graph)

    def __call__(self):
        if self.handles is not None:
            cuda_context.run_with_context(self._destroy)

    def _destroy(self):
        if self.handles is not None:
            handles, self.handles = self.handles, None
            destroy(*handles)


# PyCudaHandler's hooks --------------------------------------------------------
# The capture runs on the view's stream; groups forked into it add their
# streams.  Every op then takes its Python path (the one-call C path would
# launch without the recording seeing its arrays) and is issued on a
# capturing stream, so the driver records it instead of running it.

def capture_begin(h, rec):
    """``_graph_begin``: start capturing on ``h``'s stream."""
    cuda_context.enter()
    views = h._family_views()   # a capture records the twins' work too
    slots = h._all_slots
    rec.backend = {
        "one_call": [(v, v._one_call) for v in views],
        # Scratch that ops allocate during the capture belongs to the
        # graph; the slots get their own back at the end (_capture_done).
        "scratch": [(sc, sc.block, sc.nbytes) for s in slots for sc in s.scratches],
        "rng_cell": h._pool.allocate(8),
    }
    cuda_context.capture_began()
    for v in views:
        v._one_call = one_call.Declined()
    try:
        begin(h._slot.stream.handle)
    except BaseException:
        _capture_done(rec)
        raise


def _capture_done(rec):
    """Restore what capture_begin changed; return the scratch the capture
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


def capture_end(h, rec):
    """``_graph_end``: end the capture and return its ``Executable``."""
    cuda_context.enter()
    stream = h._slot.stream.handle
    cell = rec.backend["rng_cell"]
    try:
        if rec.rng_used:   # last node: move the graph's counter past its draws
            h._run(h._k["rng_advance"], 1, cell, rec.rng_used)
        graph = end(stream)
    except BaseException:
        abort(stream)
        _capture_done(rec)
        raise
    owned = _capture_done(rec)
    try:
        exe = instantiate(graph)
    except BaseException:
        destroy(0, graph)
        raise
    others = [h._slots[g] for g in sorted(rec.groups) if g != rec.origin]
    return Executable(exe, graph, h._slot, others, cell, rec.rng_used,
                      (rec.calls, owned, [s.blas_work for s in h._all_slots]))


def capture_abort(h, rec):
    """``_graph_abort``: end a failed capture and restore ``h``."""
    cuda_context.enter()
    ev = kernel_loader.events()
    origin = h._slot
    # Join the branches still capturing first: ending a capture with
    # unjoined work is an error status the driver (and compute-sanitizer)
    # reports, where this abort is an expected path.
    for g in sorted(rec.groups - {rec.origin}):
        s = h._slots[g]
        if is_capturing(s.handle):
            ev.record(s.event, s.handle)
            ev.wait(origin.handle, s.event)
    abort(origin.stream.handle)
    _capture_done(rec)


def replay(h, exe, graph):
    """``_graph_replay``: queue one run of ``exe`` (an ``Executable``)."""
    cuda_context.enter()
    ev = kernel_loader.events()
    origin = exe.origin
    # Order the replay after the work issued so far on every group the
    # graph uses, and their later work after it, as for eager ops.
    for s in exe.others:
        ev.record(s.event, s.handle)
        ev.wait(origin.handle, s.event)
    if exe.draws:
        with h._rng_lock:
            offset = h._rng[1]
            h._rng[1] = offset + exe.draws
        if exe.cell_value != offset:   # other random work since the last replay
            set_u64(int(exe.cell), offset, exe.stream)
        exe.cell_value = offset + exe.draws
    launch(exe.exe, exe.stream)
    if exe.others:
        ev.record(origin.event, origin.handle)
        for s in exe.others:
            ev.wait(s.handle, origin.event)


def release(h, exe):
    """``_graph_free``: free ``exe`` (an ``Executable``) now."""
    exe.free()
