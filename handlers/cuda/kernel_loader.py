"""Compile the CUDA sources in ``handlers/cuda/kernels`` once per process, load
them into the driver and launch them, all through the ``handlers.cuda._launch``
extension: the one way from this package to libcuda.

Each ``.cu`` file is plain CUDA C++ (templates instantiated for float and
double behind ``extern "C"`` names ending in ``_f32``/``_f64``), so it also
compiles standalone with nvcc.  pycuda's nvcc front end compiles them, and
this module keeps the binaries on disk (:func:`kernel_cache_dir`), so a warm
start does not invoke nvcc again.

The extension is built at install time (it needs only a C compiler, no CUDA
headers) and opens libcuda at run time.  PyCudaHandler requires it
(:func:`require`).  Kernel launches, streams, events, copies, page-locked
host memory, module loading, kernels' occupancy, graphs, host page-locking
and the cuBLAS calls of the fast path all go through it, and every failure
of the driver or cuBLAS is a :class:`CudaError`.  pycuda stays the array
library (GPUArray, its memory pool and the context they need) and nvcc's
front end.
"""
import hashlib
import importlib
import os
import tempfile
import warnings

KERNEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
#: CUdevice_attribute numbers (cuda.h) that the extension's device_attribute reads
MULTIPROCESSOR_COUNT = 16
COMPUTE_CAPABILITY_MAJOR = 75
MAX_THREADS_PER_MULTIPROCESSOR = 39
L2_CACHE_SIZE = 38
_cubins = {}
_modules = {}
_launch = None
_events = None


class CudaError(RuntimeError):
    """A CUDA driver or cuBLAS call failed.

    Attributes: ``op`` the call that failed (``cuLaunchKernel``,
    ``cublasSgemm_v2``, ...; the handler op as well where it is known),
    ``status`` the driver's or cuBLAS's status name (``CUDA_ERROR_...``,
    ``CUBLAS_STATUS_...``) and ``code`` its number."""

    def __init__(self, op, status, code):
        super().__init__(f"{op} failed: {status} ({code})")
        self.op, self.status, self.code = op, status, code


#: cublasStatus_t -> its name (cublas_api.h).
CUBLAS_STATUS = {0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED",
                 3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
                 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
                 13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
                 15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR"}


def check_blas(what, status):
    """Raise ``CudaError`` if the cuBLAS call ``what`` returned ``status``."""
    if status:
        raise CudaError(what, CUBLAS_STATUS.get(status, "CUBLAS_STATUS_UNKNOWN"), status)


class Kernel:
    """One compiled kernel: its argument format (struct codes, see
    ``handlers/cuda/_launch.c``) and its driver function handle (an int)."""

    __slots__ = ("name", "fmt", "handle")

    def __init__(self, name, fmt, handle):
        self.name = name
        self.fmt = fmt.encode()
        self.handle = handle


def extension():
    """The ``handlers.cuda._launch`` extension module, libcuda not loaded:
    for what needs no driver (its constants, ``grid``, ``pack``).
    ImportError naming the fix where it is not built."""
    try:
        return importlib.import_module(f"{__package__}._launch")
    except ImportError as e:
        raise ImportError(
            "PyCudaHandler needs the compiled extension handlers.cuda._launch, which is not "
            "built here (it needs only a C compiler): reinstall with one present "
            "(pip install -e '.[gpu]') or build it in place (python setup.py "
            f"build_ext --inplace) ({e})") from e


def require():
    """The ``handlers.cuda._launch`` extension with libcuda loaded; ImportError
    naming the fix where it is not built, RuntimeError without a driver."""
    global _launch
    if _launch is None:
        ext = extension()
        if not ext.load():
            raise RuntimeError("PyCudaHandler: libcuda.so.1 could not be opened (no NVIDIA "
                               "driver here?)")
        ext.set_error_type(CudaError, CUBLAS_STATUS)
        _launch = ext
    return _launch


def launch_function():
    """``launch(kernel.handle, stream.handle, grid, block, kernel.fmt, *args)``:
    runs a kernel with ``grid`` x ``block`` threads (1-D) on ``stream``."""
    return require().launch


class Events:
    """CUDA events (without timing) through the extension: ``new()``,
    ``record(event, stream)``, ``wait(stream, event)`` (later work on the
    stream waits for the event), ``query(event)`` (has it completed? never
    blocks), ``synchronize(event)`` (block the host, letting other Python
    threads run) and ``free(event)``; events and streams are driver handles
    (ints).  They cost about half the host time of pycuda's methods, and a
    stream-group fork or join is several."""

    def __init__(self, ext):
        self.new, self.record, self.wait = ext.event_new, ext.record, ext.wait
        self.query, self.synchronize = ext.query, ext.event_sync
        self.free = ext.event_free


def events():
    """The ``Events`` calls (one object per process)."""
    global _events
    if _events is None:
        _events = Events(require())
    return _events


#: The suffix of a compiled kernel's file in the disk cache (a temporary one
#: being written ends otherwise: ``_store``)
CACHE_SUFFIX = ".cubin"


def kernel_cache_dir():
    """The folder where compiled kernels are kept between processes:
    ``$STREAMHANDLERS_KERNEL_CACHE`` where it is set (empty: no disk cache,
    every process compiles its kernels), else ``streamhandlers/kernels`` in
    the user's cache folder (``$XDG_CACHE_HOME`` or ``~/.cache``).  None
    when there is none."""
    folder = os.environ.get("STREAMHANDLERS_KERNEL_CACHE")
    if folder is None:
        home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        folder = os.path.join(home, "streamhandlers", "kernels")
    return folder or None


def _headers_digest():
    """The names and contents of the headers in ``kernels/``, which sources
    include: part of every cached kernel's key."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(KERNEL_DIR)):
        if name.endswith((".cuh", ".h")):
            with open(os.path.join(KERNEL_DIR, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read() + b"\0")
    return digest.hexdigest()


def _store(path, data):
    """Write ``data`` to ``path`` whole or not at all: to a temporary file
    beside it, then renamed over it.  Several processes compile the same
    kernel at once (data-parallel ranks starting together, test runners):
    written in place, a file another process opens mid-write is a partial
    binary, which the driver refuses (CUDA_ERROR_INVALID_IMAGE); a rename
    shows either the whole file or none.  A disk that cannot take it costs
    only the next process's compile, with a warning."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".part")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        warnings.warn(f"compiled kernel not kept in {os.path.dirname(path)} ({e}): "
                      "later processes compile it again", stacklevel=3)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def compile_source(source):
    """The compiled binary of CUDA C++ ``source`` (text): nvcc through
    pycuda's front end, with ``kernels/`` on the include path.  The one
    compile path: the ``.cu`` files and generated sources (fused ops) both
    come through here.  Kept per process by the source's hash, and on disk
    (:func:`kernel_cache_dir`) by a key of the source, the options, the
    target architecture, nvcc's version and the headers of ``kernels/``
    (not their folder: copies of the tree share binaries), each file
    written whole (``_store``)."""
    key = hashlib.sha256(source.encode()).hexdigest()
    data = _cubins.get(key)
    if data is None:
        data = _cubins[key] = _compile(source)
    return data


def _compile(source):
    """``compile_source`` past the process's own cache: the disk's, else nvcc."""
    from pycuda import compiler

    from .context import compile_target
    options, (arch, debugging) = ["-std=c++17"], compile_target()
    folder = kernel_cache_dir()
    path = None
    if folder and not debugging:
        digest = hashlib.sha256()
        for part in (source, " ".join(options), str(arch), compiler.get_nvcc_version("nvcc"),
                     _headers_digest()):
            digest.update(part.encode() + b"\0")
        path = os.path.join(folder, digest.hexdigest() + CACHE_SUFFIX)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            pass
    data = compiler.compile(source, no_extern_c=True, options=options, arch=arch,
                            include_dirs=[KERNEL_DIR], cache_dir=False)
    if path is not None:
        _store(path, data)
    return data


def cubin(name):
    """The compiled binary of ``kernels/<name>.cu`` (see :func:`compile_source`)."""
    with open(os.path.join(KERNEL_DIR, name + ".cu")) as f:
        return compile_source(f.read())


def error_name(rc):
    """The driver's name of status ``rc`` (``CUDA_ERROR_...``)."""
    return require().error_name(rc)


def check(what, rc):
    """Raise ``CudaError`` if the driver call ``what`` returned status ``rc``."""
    if rc:
        raise CudaError(what, error_name(rc), rc)


def module(name):
    """The loaded module of ``kernels/<name>.cu`` in the current context: a
    driver ``CUmodule`` handle (an int)."""
    mod = _modules.get(name)
    if mod is None:
        mod = _modules[name] = require().module_load(cubin(name))
    return mod


def source_function(source, name, arg_format):
    """Return kernel ``name`` of the CUDA source text ``source`` (a generated
    fused op) as a ``Kernel``; the module is compiled and loaded once per
    process and source."""
    key = "source:" + hashlib.sha256(source.encode()).hexdigest()
    mod = _modules.get(key)
    if mod is None:
        mod = _modules[key] = require().module_load(compile_source(source))
    return Kernel(name, arg_format, handle=require().module_function(mod, name))


def blocks_per_sm(kernel, block, sm_threads, dynamic_smem=0):
    """Blocks of ``block`` threads of ``kernel`` (a ``Kernel``) that one
    multiprocessor of ``sm_threads`` threads holds at once, with
    ``dynamic_smem`` bytes of dynamic shared memory each: the driver's
    occupancy of the compiled kernel (the extension's ``occupancy``: the
    least that its registers, its shared memory and the multiprocessor's
    threads and blocks allow; 4 blocks of 256 threads at 64 registers a
    thread, where the threads alone allow 8), at least 1.  Where the
    extension predates that call, the thread limit alone: ``sm_threads //
    block``, all the planners assumed before.  A driver call, for a loaded
    kernel's handle only: the planners' CPU tests, whose kernels have
    made-up handles, give occupancies of their own (``reductions.plan``
    takes None for the threads' limit).  The handler caches it per kernel
    (``reductions.blocks_per_sm``)."""
    query = getattr(require(), "occupancy", None)
    if query is None:
        return max(1, sm_threads // block)
    return max(1, query(kernel.handle, block, dynamic_smem))


def function(file, name, suffix, arg_format):
    """Return kernel ``name + '_' + suffix`` from ``file`` as a ``Kernel`` whose
    arguments follow ``arg_format`` (struct codes, e.g. ``"PPq"``)."""
    full = f"{name}_{suffix}"
    return Kernel(full, arg_format, handle=require().module_function(module(file), full))
