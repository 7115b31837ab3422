"""CUDA graphs through the driver API: stream capture, instantiation, launch.

pycuda has no graph API, so these few driver calls go through ctypes on
``libcuda`` (``kernel_loader.driver()``), each checked by one function
that names the call and the driver's status.  Capture uses relaxed mode: the
handler itself refuses every call that a graph cannot record (see
``handlers.graphs``), and relaxed mode lets the memory pool hand out scratch
memory while a capture is in progress, which the graph then owns.
"""
import ctypes

from ..graphs import CaptureError
from . import kernel_loader

_CAPTURE_MODE_RELAXED = 2
_CAPTURE_STATUS_ACTIVE = 1
_lib = None


def _driver():
    global _lib
    if _lib is None:
        lib = kernel_loader.driver()
        p, u64 = ctypes.c_void_p, ctypes.c_ulonglong
        signatures = {
            "cuStreamBeginCapture_v2": (p, ctypes.c_int),
            "cuStreamEndCapture": (p, ctypes.POINTER(p)),
            "cuStreamIsCapturing": (p, ctypes.POINTER(ctypes.c_int)),
            "cuGraphInstantiateWithFlags": (ctypes.POINTER(p), p, u64),
            "cuGraphLaunch": (p, p),
            "cuGraphExecDestroy": (p,),
            "cuGraphDestroy": (p,),
            "cuGraphGetNodes": (p, ctypes.POINTER(p), ctypes.POINTER(ctypes.c_size_t)),
            "cuMemsetD32Async": (u64, ctypes.c_uint, ctypes.c_size_t, p),
            "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
        }
        for name, args in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        _lib = lib
    return _lib


def _check(call, rc):
    """A failed capture call: CaptureError (the capture cannot go on)."""
    if rc:
        raise CaptureError(f"{call} failed: {kernel_loader.error_name(rc)} ({rc})", call)


def begin(stream):
    """Start capturing the work issued on ``stream`` (a driver handle, int)."""
    _check("cuStreamBeginCapture", _driver().cuStreamBeginCapture_v2(stream,
                                                                    _CAPTURE_MODE_RELAXED))


def end(stream):
    """End the capture on ``stream`` and return the graph (a driver handle)."""
    graph = ctypes.c_void_p()
    _check("cuStreamEndCapture", _driver().cuStreamEndCapture(stream, ctypes.byref(graph)))
    return graph.value


def abort(stream):
    """End a capture that failed, ignoring the driver's verdict, and free
    whatever graph it produced."""
    graph = ctypes.c_void_p()
    if _driver().cuStreamEndCapture(stream, ctypes.byref(graph)) == 0 and graph.value:
        _driver().cuGraphDestroy(graph.value)


def is_capturing(stream):
    """Whether ``stream`` is part of an active capture (not one invalidated)."""
    status = ctypes.c_int(0)
    _check("cuStreamIsCapturing", _driver().cuStreamIsCapturing(stream, ctypes.byref(status)))
    return status.value == _CAPTURE_STATUS_ACTIVE


def node_count(graph):
    """The number of nodes of ``graph``."""
    n = ctypes.c_size_t(0)
    _check("cuGraphGetNodes", _driver().cuGraphGetNodes(graph, None, ctypes.byref(n)))
    return n.value


def instantiate(graph):
    """The executable form of ``graph`` (a driver handle)."""
    exe = ctypes.c_void_p()
    _check("cuGraphInstantiate", _driver().cuGraphInstantiateWithFlags(ctypes.byref(exe),
                                                                      graph, 0))
    return exe.value


def launch(exe, stream):
    """Queue one run of the executable graph ``exe`` on ``stream``."""
    kernel_loader.check("cuGraphLaunch", _driver().cuGraphLaunch(exe, stream))


def set_u64(address, value, stream):
    """Queue writing the 64-bit ``value`` at device ``address`` on ``stream``
    (two 32-bit memsets: no host buffer has to outlive the call)."""
    lib = _driver()
    kernel_loader.check("cuMemsetD32Async",
                        lib.cuMemsetD32Async(address, value & 0xFFFFFFFF, 1, stream))
    kernel_loader.check("cuMemsetD32Async",
                        lib.cuMemsetD32Async(address + 4, value >> 32, 1, stream))


def destroy(exe, graph):
    """Free an executable graph and its graph."""
    lib = _driver()
    if exe:
        lib.cuGraphExecDestroy(exe)
    if graph:
        lib.cuGraphDestroy(graph)
