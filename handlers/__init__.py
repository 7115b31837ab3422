"""streamhandlers: write neural-network layers once, run them on NumPy or CUDA.

``import handlers`` and ``from handlers import PyCudaHandler`` work without
pycuda: the GPU side loads when a ``PyCudaHandler`` is constructed, which
raises an ``ImportError`` naming what is missing when pycuda is absent
(``python -m handlers.doctor`` lists what this machine has).
"""
from .base import Handler
from .cuda.kernel_loader import CudaError
from .debug_handler import DebugHandler, StreamHazardError
from .fused import FusedOp, fused_op
from .graphs import CaptureError, Graph
from .numpy_handler import NumpyHandler

__all__ = ["CaptureError", "CudaError", "DebugHandler", "FusedOp", "Graph", "Handler",
           "NumpyHandler", "PyCudaHandler", "StreamHazardError", "fused_op"]


def __getattr__(name):
    # Imported on first use so that `import handlers` never needs pycuda.
    if name == "PyCudaHandler":
        from .cuda.handler import PyCudaHandler
        return PyCudaHandler
    raise AttributeError(f"module 'handlers' has no attribute {name!r}")
