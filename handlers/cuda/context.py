"""The device's primary CUDA context, shared with PyTorch and CuPy.

The one place besides the extension that calls the driver, through
``pycuda.driver``: pycuda's arrays (GPUArray) and memory pool need pycuda's
own context object and its per-thread context stack, so the context is
retained, pushed and popped here with pycuda.  Every other driver call goes
through ``handlers.cuda._launch``, which makes this context current on a
thread that has none (``set_context``).

pycuda needs a current context.  We retain the device's *primary* context (the
one the CUDA runtime, and so PyTorch and CuPy, use); a private context would
break launches once another library loads.  The thread that creates the first
handler pushes it; any other thread that uses a handler pushes it once, on its
first call (``enter``), and pops it when the thread ends, since a context left
pushed on a thread's pycuda stack when the thread (or the process) ends makes
pycuda abort.  At exit, registered cleanups (cuBLAS handles, memory pools) run
first, then the owner's context is popped.
"""
import atexit
import importlib.util
import threading

_state = {}      # device index -> (device, context)
_cleanups = []   # callables run at exit, before the context is popped
_deferred = []   # releases asked for where no context is current (run_with_context)
_owner = [None]  # ident of the thread that pushed the context first
_capturing = [0]  # graph captures in progress (see capturing)
_here = threading.local()   # .entry: this thread's _Entry, once it pushed the context


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


def compile_target():
    """(nvcc's ``-arch`` for the current context's device, else for device 0,
    the one a handler takes by default, else None: nvcc's default; whether
    pycuda debugs kernels: it adds ``-g -G`` then), for ``kernel_loader``'s
    compiles and the keys of its disk cache.  Without the fallback to
    device 0, a process that compiles before any handler exists (the GPU
    machine's warm-up, .ci/gpu-warm) compiled for nvcc's default target,
    under keys no handler's process ever asked for: every test process
    then compiled every kernel file again, all at once."""
    try:
        import pycuda.driver as drv
    except ImportError:
        return None, False
    debugging = getattr(drv, "CUDA_DEBUGGING", False)
    try:
        device = drv.Context.get_device()
    except drv.Error:   # no current context
        try:
            drv.init()
            device = drv.Device(0)
        except drv.Error:
            return None, debugging
    return "sm_%d%d" % device.compute_capability(), debugging


def acquire(device_index=0):
    """Return ``(device, context)`` for ``device_index``, pushing its primary
    context the first time.  Only one device per process is supported."""
    drv = load_driver()
    if device_index in _state:
        enter()
        release_deferred()
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
    _here.entry = _OWNER_ENTRY   # popped by _release at exit, not per thread
    _state[device_index] = (device, context)
    atexit.register(_release)
    return _state[device_index]


class _Entry:
    """The context pushed on one thread other than the owner; popped when the
    thread ends (CPython clears a thread's locals on that thread, before
    pycuda's own per-thread cleanup would abort on a non-empty stack)."""

    def __init__(self, context):
        self.context = context
        context.push()

    def __del__(self):
        try:
            self.context.pop()
        except Exception:   # the process is ending and CUDA is gone: nothing to undo
            pass


_OWNER_ENTRY = object()


def enter():
    """Make the primary context current on the calling thread (once per
    thread: later calls cost an attribute lookup).  Every PyCudaHandler entry
    point that calls pycuda or the driver calls this first, so a handler works
    from any thread."""
    if getattr(_here, "entry", None) is None and _state:
        _, context = next(iter(_state.values()))
        _here.entry = _Entry(context)


def held():
    """``(device index, context handle)`` of the device the handlers use (an
    int and the driver's ``CUcontext`` as an int), or None before the first
    handler.  For libraries that need the raw context, NCCL's watchdog say."""
    for index, (_, context) in _state.items():
        return index, int(context.handle)
    return None


def entered():
    """True if the primary context is current on this thread through ``enter``
    or ``acquire``."""
    return getattr(_here, "entry", None) is not None


def run_with_context(fn):
    """Run ``fn()`` now if the context is current on this thread (``enter``),
    else later on a thread where it is: at the next allocation or handler
    creation, or at exit.  Releasing pycuda objects on a thread without the
    context (the garbage collector may run anywhere, on prefetch's reader
    too) leaks them with a warning, as pycuda cannot make it current there.
    While a graph capture is in progress releases wait for its end too: a
    handler collected then would destroy cuBLAS handles and free memory,
    calls that wait for the device and so invalidate the capture."""
    if entered() and not _capturing[0]:
        fn()
    else:
        _deferred.append(fn)


def capture_began():
    """A graph capture started: releases wait for its end (``run_with_context``)."""
    _capturing[0] += 1


def capture_ended():
    """A graph capture ended: run the releases that waited for it."""
    _capturing[0] -= 1
    if not _capturing[0]:
        release_deferred()


def release_deferred():
    """Run the releases deferred by ``run_with_context`` if the context is
    current on this thread (cheap when there are none)."""
    if _deferred and entered() and not _capturing[0]:
        _run_deferred()


class OwnedBlock:
    """Keeps a pycuda pool allocation alive for an array (its ``base``).

    Dropped on a thread where the context is current, the allocation goes back
    to its pool at once.  Dropped on any other thread, which the garbage
    collector may do to an array caught in a reference cycle (on prefetch's
    reader thread, say), it is handed to such a thread (``run_with_context``): a
    pycuda pool that receives a block while it holds none needs a current
    context, and without one the process aborts ("explicit_context_dependent
    failed ... no currently active context")."""

    __slots__ = ("mem",)

    def __init__(self, mem):
        self.mem = mem

    def __int__(self):
        return int(self.mem)

    def __del__(self):
        if not entered():
            # The closure keeps the allocation alive until it runs.
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
