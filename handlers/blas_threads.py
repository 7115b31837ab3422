"""How many threads NumpyHandler's products take from BLAS.

NumPy's OpenBLAS splits any product above about 2^18 multiply-adds across
all cores, and its threads spin while they wait for work.  For the small
products of a layer (an LSTM's gates over a batch of 32, a conv net's
im2col of 8x8 digits) the split gains little on an idle machine and loses
badly on a busy one: on a 2-core CPU with one other process keeping a core
busy, ``python -m examples.digits`` took 9.9 s with OpenBLAS's two threads
and 3.3 s with one (``docs/numpy_handler.rst`` has the other demos).

So a product below ``SMALL_PRODUCT`` multiply-adds puts BLAS on one thread,
and a larger one gives BLAS back the thread count it had.  The count
changes only when the size class changes, not around each product: raising
it wakes OpenBLAS's threads, which then spin beside the handler's other
work, and restoring it after every small product made the same example
take 4.4-4.6 s against 2.8-3.2.  So while the handler's products are small, other NumPy
code of the process runs its BLAS on one thread too; ``restore()`` gives
BLAS its count back, and ``SMALL_PRODUCT = 0`` turns this off.

Only OpenBLAS is steered (the BLAS of NumPy's wheels on Linux and Windows,
and of many other builds): every copy the process has loaded, since each
keeps threads of its own (SciPy's wheels bring a second).  With another
BLAS, or where no library is found, products run as BLAS decides.
"""
import ctypes
import glob
import os
import sys
import threading

#: products of fewer multiply-adds than this run on one BLAS thread: about
#: 256 x 256 x 256, below which a second thread gained at most 1.25x on an
#: idle 2-core machine (and lost up to 6x on a busy one)
SMALL_PRODUCT = 1 << 24

# (get, set) symbol pairs of the OpenBLAS builds NumPy is found with: NumPy's
# own wheels (scipy-openblas, 64-bit integers), then plain builds.
_SYMBOLS = (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
            ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
            ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
            ("openblas_get_num_threads", "openblas_set_num_threads"))


def _candidate_paths():
    """Paths of the OpenBLAS libraries this process may use: those it has
    loaded (Linux; NumPy's, and SciPy's own copy where SciPy is imported),
    then those NumPy's wheels ship beside it, each once."""
    paths = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                if "openblas" in os.path.basename(path).lower():
                    paths.append(path)
    except OSError:
        pass
    import numpy
    root = os.path.dirname(os.path.dirname(numpy.__file__))
    for folder in ("numpy.libs", os.path.join("numpy", ".dylibs")):
        paths += sorted(glob.glob(os.path.join(root, folder, "*openblas*")))
    unique = []
    for path in paths:
        if os.path.realpath(path) not in map(os.path.realpath, unique):
            unique.append(path)
    return unique


class OpenBLAS:
    """The thread counts of the OpenBLAS libraries in the process, through
    their own get and set functions.  Each library keeps its own threads, so
    each is set: NumPy's runs the handler's products, and a second copy
    (SciPy's) would otherwise keep spinning threads of its own."""

    def __init__(self, libraries):
        self.libraries = libraries   # [(get, set)]

    def get(self):
        """Each library's thread count."""
        return [get() for get, _ in self.libraries]

    def set(self, counts):
        """Set each library's thread count (a list, as ``get`` gives)."""
        for (_, set_), n in zip(self.libraries, counts):
            set_(n)


def find():
    """The process's OpenBLAS libraries as an ``OpenBLAS``, or None where
    there is none to steer (another BLAS, or no library found)."""
    import numpy  # noqa: F401  (loads BLAS, so that its library is mapped)
    mode = ctypes.RTLD_GLOBAL if sys.platform != "win32" else 0
    found = []
    for path in _candidate_paths():
        try:
            lib = ctypes.CDLL(path, mode=mode)
        except OSError:
            continue
        for get_name, set_name in _SYMBOLS:
            get, set_ = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get is not None and set_ is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                found.append((get, set_))
                break
    return OpenBLAS(found) if found else None


_lib = None
_found = False
# Whether the last product was small: BLAS then runs on one thread, put
# there by it or already there.  Apart from the counts, so that a BLAS on one
# thread already is asked for them once, not before every small product.
_small = False
# The thread counts BLAS had before a small product put it on one thread;
# None while BLAS runs with its own counts, or was on one thread already.
_saved = None
# Threads of the process may run products at once: one at a time changes the
# counts, so that none saves the one thread another has set.
_lock = threading.Lock()


def _library():
    global _lib, _found
    if not _found:
        _lib, _found = find(), True
    return _lib


def product(fn, macs, *args, **kwargs):
    """``fn(*args, **kwargs)``, a BLAS product of ``macs`` multiply-adds: on
    one BLAS thread when it is small (``SMALL_PRODUCT``), with BLAS's own
    thread counts when it is large (the module docstring says why)."""
    small = macs < SMALL_PRODUCT
    if small != _small:
        _switch(small)
    return fn(*args, **kwargs)


def _switch(small):
    """Put BLAS on one thread (``small``), or give it back its counts."""
    global _saved, _small
    lib = _library()
    with _lock:
        if small == _small:   # another thread switched first
            return
        _small = small
        if lib is None:
            return
        if small:
            counts = lib.get()
            if max(counts) > 1:
                lib.set([1] * len(counts))
                _saved = counts
        elif _saved is not None:
            lib.set(_saved)
            _saved = None


def restore():
    """Give BLAS back the thread counts it had before the handler's small
    products put it on one thread (nothing if they did not)."""
    _switch(False)
