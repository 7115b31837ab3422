"""GPU timing helpers shared by the GPU benchmark suites.

Device time is measured with CUDA events of each library on the stream that
library issues to, after warm-up, as the median of repeats.  Host overhead is
measured per call with ``time.perf_counter_ns`` as the median over many calls.
"""
import statistics
import time


def cuda_handler(suite, *args, what="suite", **kw):
    """``PyCudaHandler(*args, **kw)``, or None after printing that ``suite``
    (a benchmark suite, or a diagnostic ``what="tool"``) skipped because it
    needs a GPU: pycuda is missing or there is no usable device."""
    try:
        from handlers import PyCudaHandler
        return PyCudaHandler(*args, **kw)
    except (ImportError, RuntimeError) as e:
        print(f"{suite}: skipped, this {what} needs a GPU: {e}")
        return None


def optional_peers():
    """Return ``{"torch": module, "cupy": module}`` for those importable with a GPU."""
    peers = {}
    try:
        import torch
        if torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            peers["torch"] = torch
    except ImportError:
        pass
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
        peers["cupy"] = cupy
    except Exception:  # not installed, or no usable device
        pass
    return peers


class EventTimer:
    """Median device time (ms) of a callable, with the events of ``lib``.

    ``lib`` is ``"pycuda"`` (give ``stream``, a pycuda Stream), ``"torch"`` or
    ``"cupy"`` (their current stream).
    """

    def __init__(self, lib, stream=None, module=None):
        self.lib, self.stream, self.module = lib, stream, module
        if lib == "pycuda":
            import pycuda.driver as drv
            self._pair = lambda: (drv.Event(), drv.Event())
        elif lib == "torch":
            ev = module.cuda.Event
            self._pair = lambda: (ev(enable_timing=True), ev(enable_timing=True))
        else:
            self._pair = lambda: (module.cuda.Event(), module.cuda.Event())

    def _record(self, ev):
        if self.lib == "pycuda":
            ev.record(self.stream)
        else:
            ev.record()

    def _elapsed(self, start, end):
        end.synchronize()
        if self.lib == "pycuda":
            return end.time_since(start)
        if self.lib == "torch":
            return start.elapsed_time(end)
        return self.module.cuda.get_elapsed_time(start, end)

    def time(self, fn, reps=20, warmup=3, inner=1):
        """Median ms per call of ``fn(i)`` over ``reps`` timed groups of
        ``inner`` calls; ``i`` counts calls so inputs can be rotated."""
        for i in range(warmup):
            fn(i)
        start, end = self._pair()
        times = []
        i = 0
        for _ in range(reps):
            self._record(start)
            for _ in range(inner):
                fn(i)
                i += 1
            self._record(end)
            times.append(self._elapsed(start, end) / inner)
        return statistics.median(times)


def host_overhead_us(fn, calls=10000, warmup=500, sync=None):
    """Median host time in microseconds of one ``fn()`` call over ``calls``."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    clock = time.perf_counter_ns
    samples = []
    append = samples.append
    for _ in range(calls):
        t0 = clock()
        fn()
        append(clock() - t0)
    if sync:
        sync()
    return statistics.median(samples) / 1000.0
