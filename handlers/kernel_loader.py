"""Compile the CUDA sources in ``handlers/kernels`` once per process, and load
them for one of two launch paths.

Each ``.cu`` file is plain CUDA C++ (templates instantiated for float and
double behind ``extern "C"`` names ending in ``_f32``/``_f64``), so it also
compiles standalone with nvcc.  pycuda compiles and caches the binaries on
disk, so a warm start does not invoke nvcc again.

Launch paths (``launcher()`` says which one this process uses):

* ``"c"``: the ``handlers._launch`` extension, built at install time where a C
  compiler is present, loads the module through the driver and launches with
  one C call per kernel (about 2 us less host time than pycuda's launch).
* ``"pycuda"``: pycuda's prepared launch, where the extension is not built or
  ``STREAMHANDLERS_LAUNCH=pycuda`` is set in the environment.
"""
import ctypes
import os

KERNEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
_cubins = {}
_modules = {}
_launcher = None
_driver = None
_events = None


class Kernel:
    """One compiled kernel: its argument format (pycuda struct codes) and the
    handle that ``launch_function()`` takes: a driver function handle (int)
    for the C launcher, a pycuda Function for pycuda's."""

    __slots__ = ("name", "fmt", "handle")

    def __init__(self, name, fmt, handle):
        self.name = name
        self.fmt = fmt.encode()
        self.handle = handle


def launch_function():
    """The launch callable of this process's path:
    ``launch(kernel.handle, stream_arg(stream), grid, block, kernel.fmt, *args)``
    runs a kernel with ``grid`` x ``block`` threads (1-D) on ``stream``."""
    if launcher() == "c":
        from ._launch import launch
        return launch
    from pycuda._pvt_struct import pack

    def launch(function, stream, grid, block, fmt, *args):
        # What prepared_async_call does, minus its per-call argument handling.
        function._launch_kernel((grid, 1), (block, 1, 1), pack(fmt, *args), 0, stream)
    return launch


def stream_arg(stream):
    """What ``launch_function()``'s launch and ``events()``' calls take for a
    pycuda ``Stream``."""
    return stream.handle if launcher() == "c" else stream


class Events:
    """CUDA events (without timing) on this process's launch path.

    ``new()`` returns an event; ``record(event, stream)``, ``wait(stream,
    event)`` (later work on the stream waits for the event), ``query(event)``
    (has it completed? never blocks), ``synchronize(event)`` (block the host,
    letting other Python threads run) and ``free(event)``, with streams as
    ``stream_arg`` gives them.  On the C path events are driver handles
    (ints) that must be freed; on pycuda's they are ``pycuda.driver.Event``
    objects, freed when collected.  The C calls cost about half as much host
    time as pycuda's methods, and a stream-group fork or join is several."""

    def __init__(self, c):
        if c:
            from . import _launch
            self.new, self.record, self.wait = _launch.event_new, _launch.record, _launch.wait
            self.query, self.synchronize = _launch.query, _launch.event_sync
            self.free = _launch.event_free
            return
        import pycuda.driver as drv
        flags = drv.event_flags.DISABLE_TIMING
        self.new = lambda: drv.Event(flags=flags)
        self.record = lambda event, stream: event.record(stream)
        self.wait = lambda stream, event: stream.wait_for_event(event)
        self.query = lambda event: event.query()
        self.synchronize = lambda event: event.synchronize()
        self.free = lambda event: None


def events():
    """The ``Events`` of this process's launch path."""
    global _events
    if _events is None:
        _events = Events(launcher() == "c")
    return _events


def launcher():
    """``"c"`` if kernels launch through the ``handlers._launch`` extension, else
    ``"pycuda"`` (extension not built, no driver, or ``STREAMHANDLERS_LAUNCH=pycuda``)."""
    global _launcher
    if _launcher is None:
        _launcher = "pycuda"
        if os.environ.get("STREAMHANDLERS_LAUNCH", "c") != "pycuda":
            try:
                from . import _launch
            except ImportError:
                pass
            else:
                if _launch.load():
                    _launcher = "c"
    return _launcher


def cubin(name):
    """The compiled binary of ``kernels/<name>.cu`` (nvcc through pycuda, cached)."""
    data = _cubins.get(name)
    if data is None:
        from pycuda.compiler import compile as nvcc_compile
        with open(os.path.join(KERNEL_DIR, name + ".cu")) as f:
            source = f.read()
        data = _cubins[name] = nvcc_compile(source, no_extern_c=True, options=["-std=c++17"],
                                            include_dirs=[KERNEL_DIR])
    return data


def driver():
    """``libcuda`` through ctypes, opened once per process (the C launcher's
    module loading and ``handlers.cuda_graph`` share it)."""
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
    return _driver


def _check(what, rc):
    if rc:
        name = ctypes.c_char_p()
        driver().cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: {(name.value or b'?').decode()} ({rc})")


def module(name):
    """The loaded module of ``kernels/<name>.cu`` in the current context: a
    driver ``CUmodule`` handle (int) for the C launcher, else a pycuda Module."""
    mod = _modules.get(name)
    if mod is None:
        data = cubin(name)
        if launcher() == "c":
            handle = ctypes.c_void_p()
            _check("cuModuleLoadData", driver().cuModuleLoadData(ctypes.byref(handle), data))
            mod = handle.value
        else:
            import pycuda.driver as drv
            mod = drv.module_from_buffer(data)
        _modules[name] = mod
    return mod


def function(file, name, suffix, arg_format):
    """Return kernel ``name + '_' + suffix`` from ``file`` as a ``Kernel`` whose
    arguments follow ``arg_format`` (pycuda struct codes, e.g. ``"PPq"``)."""
    full = f"{name}_{suffix}"
    mod = module(file)
    if launcher() == "c":
        handle = ctypes.c_void_p()
        _check(f"cuModuleGetFunction({full})",
               driver().cuModuleGetFunction(ctypes.byref(handle), ctypes.c_void_p(mod),
                                           full.encode()))
        return Kernel(full, arg_format, handle=handle.value)
    fn = mod.get_function(full)
    fn.prepare(arg_format)
    return Kernel(full, arg_format, fn)
