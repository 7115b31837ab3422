"""CUDA graphs through the driver API: stream capture, instantiation, launch.

pycuda has no graph API, so these calls go through the ``handlers.cuda._launch``
extension (``kernel_loader.require()``).  A failed capture call raises
``CaptureError`` (the capture cannot go on); a failed launch or memset raises
``CudaError``; both name the call and the driver's status.  Capture uses
relaxed mode: the handler itself refuses every call that a graph cannot
record (see ``handlers.graphs``), and relaxed mode lets the memory pool hand
out scratch memory while a capture is in progress, which the graph then owns.
"""
import contextlib

from ..graphs import CaptureError
from . import kernel_loader
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
