"""The device's primary CUDA context, shared with PyTorch and CuPy.

pycuda needs a current context.  We retain the device's *primary* context (the
one the CUDA runtime, and so PyTorch and CuPy, use) and push it once; a private
context would break launches once another library loads, and a context left
pushed at exit makes pycuda abort.  At exit, registered cleanups (cuBLAS
handles, memory pools) run first, then the context is popped.
"""
import atexit
import importlib.util
import threading

_state = {}      # device index -> (device, context)
_cleanups = []   # callables run at exit, before the context is popped
_deferred = []   # releases asked for on other threads (see run_on_owner)
_owner = [None]  # ident of the thread that pushed the context
_capturing = [0]  # graph captures in progress (see capturing)


def load_driver():
    """Import and initialise ``pycuda.driver``; raise a clear error if impossible.

    Raises ImportError when pycuda is not installed and RuntimeError when the
    CUDA driver cannot be loaded or no GPU is present.
    """
    if importlib.util.find_spec("pycuda") is None:
        raise ImportError("PyCudaHandler needs pycuda, which is not installed "
                          "(pip install 'streamhandlers[gpu]')")
    try:
        import pycuda.driver as drv
    except ImportError as e:  # pycuda present, libcuda missing
        raise RuntimeError(f"PyCudaHandler: pycuda is installed but the CUDA driver "
                           f"could not be loaded (no GPU here?): {e}") from e
    try:
        drv.init()
        count = drv.Device.count()
    except Exception as e:
        raise RuntimeError(f"PyCudaHandler: CUDA could not be initialised "
                           f"(no GPU here?): {e}") from e
    if count == 0:
        raise RuntimeError("PyCudaHandler: no CUDA GPU found")
    return drv


def acquire(device_index=0):
    """Return ``(device, context)`` for ``device_index``, pushing its primary
    context the first time.  Only one device per process is supported."""
    drv = load_driver()
    if device_index in _state:
        if threading.get_ident() == _owner[0]:
            _run_deferred()
        return _state[device_index]
    if _state:
        raise RuntimeError("PyCudaHandler: handlers on several devices in one "
                           "process are not supported")
    if not 0 <= device_index < drv.Device.count():
        raise ValueError(f"PyCudaHandler: device {device_index} does not exist "
                         f"({drv.Device.count()} found)")
    device = drv.Device(device_index)
    context = device.retain_primary_context()
    context.push()
    _owner[0] = threading.get_ident()
    _state[device_index] = (device, context)
    atexit.register(_release)
    return _state[device_index]


def run_on_owner(fn):
    """Run ``fn()`` now if this is the thread that made the context current,
    else at the next handler creation or at exit, on that thread.  Releasing
    pycuda objects on another thread (where the garbage collector may run)
    leaks them with a warning, as pycuda cannot make the context current.
    While a graph capture is in progress releases wait for its end too: a
    handler collected then would destroy cuBLAS handles and free memory,
    calls that wait for the device and so invalidate the capture."""
    if threading.get_ident() == _owner[0] and not _capturing[0]:
        fn()
    else:
        _deferred.append(fn)


def capture_began():
    """A graph capture started: releases wait for its end (``run_on_owner``)."""
    _capturing[0] += 1


def capture_ended():
    """A graph capture ended: run the releases that waited for it."""
    _capturing[0] -= 1
    if not _capturing[0]:
        release_deferred()


def release_deferred():
    """Run the releases deferred by ``run_on_owner`` if this is the owner thread
    (cheap when there are none)."""
    if _deferred and threading.get_ident() == _owner[0]:
        _run_deferred()


class OwnedBlock:
    """Keeps a pycuda pool allocation alive for an array (its ``base``).

    Dropped on the owner thread, the allocation goes back to its pool at once.
    Dropped on any other thread, which the garbage collector may do to an
    array caught in a reference cycle (on prefetch's reader thread, say), the
    allocation is handed to the owner thread instead (``run_on_owner``): a
    pycuda pool that receives a block while it holds none needs a current
    context, and without one the process aborts ("explicit_context_dependent
    failed ... no currently active context")."""

    __slots__ = ("mem",)

    def __init__(self, mem):
        self.mem = mem

    def __int__(self):
        return int(self.mem)

    def __del__(self):
        if threading.get_ident() != _owner[0]:
            # The closure keeps the allocation alive until the owner runs it.
            _deferred.append(lambda mem=self.mem: None)


def _run_deferred():
    while _deferred:
        try:
            _deferred.pop()()
        except Exception:  # one failed release must not stop the others
            pass


def at_exit(fn):
    """Run ``fn()`` at interpreter exit while the context is still current."""
    _cleanups.append(fn)


def _release():
    _run_deferred()
    while _cleanups:
        try:
            _cleanups.pop()()
        except Exception:  # a failed cleanup must not keep the context pushed
            pass
    for _, context in _state.values():
        context.synchronize()
        context.pop()
    _state.clear()
    try:
        from pycuda.tools import clear_context_caches
        clear_context_caches()
    except ImportError:
        pass
