"""GPU timing helpers shared by the GPU benchmark suites.

Device time is measured with CUDA events of each library on the stream that
library issues to, after warm-up; host overhead per call with
``time.perf_counter_ns``.  Both keep every sample's spread (count, median,
quartiles, extremes), and both take the libraries of one figure in
interleaved order (:func:`interleaved`, :func:`host_overhead`).
"""
import time

from benchmarks.common import spread


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

    ``lib`` is ``"pycuda"`` (PyCudaHandler: give ``stream``, a handler's
    ``stream``; timing events of the ``handlers.cuda._launch`` extension),
    ``"torch"`` or ``"cupy"`` (their current stream).
    """

    def __init__(self, lib, stream=None, module=None):
        self.lib, self.stream, self.module = lib, stream, module
        if lib == "pycuda":
            from handlers.cuda import kernel_loader
            ext = self._ext = kernel_loader.require()
            self._pair = lambda: (ext.timing_event_new(), ext.timing_event_new())
        elif lib == "torch":
            ev = module.cuda.Event
            self._pair = lambda: (ev(enable_timing=True), ev(enable_timing=True))
        else:
            self._pair = lambda: (module.cuda.Event(), module.cuda.Event())

    def _record(self, ev):
        if self.lib == "pycuda":
            self._ext.record(ev, self.stream.handle)
        else:
            ev.record()

    def _elapsed(self, start, end):
        if self.lib == "pycuda":
            self._ext.event_sync(end)
            return self._ext.event_elapsed(start, end)
        end.synchronize()
        if self.lib == "torch":
            return start.elapsed_time(end)
        return self.module.cuda.get_elapsed_time(start, end)

    def sample(self, fn, i=0, inner=1):
        """Milliseconds per call of ``inner`` calls ``fn(i), fn(i+1), ...``
        between two events: one sample."""
        if not hasattr(self, "_events"):    # one pair per timer, reused
            self._events = self._pair()
        start, end = self._events
        self._record(start)
        for j in range(inner):
            fn(i + j)
        self._record(end)
        return self._elapsed(start, end) / inner

    def measure(self, fn, reps=20, warmup=3, inner=1):
        """Spread (ms per call) of ``fn(i)`` over ``reps`` timed groups of
        ``inner`` calls; ``i`` counts calls so inputs can be rotated."""
        return interleaved({"fn": (self, fn)}, reps, warmup, inner)["fn"]

    def time(self, fn, reps=20, warmup=3, inner=1):
        """The median of :meth:`measure`, in ms per call."""
        return self.measure(fn, reps, warmup, inner)["median"]


def interleaved(cases, reps=20, warmup=3, inner=1):
    """Time several libraries' versions of one figure in interleaved order.

    ``cases`` is ``{label: (timer, fn)}`` (timers of any library).  Each fn
    is warmed up, then the ``reps`` samples are taken round-robin, the
    starting case rotating each round, so that a drifting clock or a slow
    spell favours none of them.  Returns ``{label: spread of ms per call}``.
    """
    labels = list(cases)
    calls = {k: 0 for k in labels}
    for k in labels:
        timer, fn = cases[k]
        for _ in range(warmup):
            fn(calls[k])
            calls[k] += 1
    samples = {k: [] for k in labels}
    for r in range(reps):
        for j in range(len(labels)):
            k = labels[(r + j) % len(labels)]
            timer, fn = cases[k]
            samples[k].append(timer.sample(fn, calls[k], inner))
            calls[k] += inner
    return {k: spread(v) for k, v in samples.items()}


def host_overhead(cases, calls=10000, warmup=500, rounds=10):
    """Host time per call in microseconds, interleaved across libraries.

    ``cases`` is ``{label: (fn, sync)}``: ``fn()`` is one call, ``sync()``
    waits for that library's device work (or None).  After a warm-up, each
    case runs ``calls // rounds`` timed calls per round, cases taking turns
    (the first rotating), with a ``sync()`` between turns outside the clock.
    Returns ``{label: spread of per-call microseconds}`` (``n`` = calls)."""
    clock = time.perf_counter_ns
    labels = list(cases)
    for k in labels:
        fn, sync = cases[k]
        for _ in range(warmup):
            fn()
        if sync:
            sync()
    samples = {k: [] for k in labels}
    per = max(1, calls // rounds)
    for r in range(rounds):
        for j in range(len(labels)):
            k = labels[(r + j) % len(labels)]
            fn, sync = cases[k]
            append = samples[k].append
            for _ in range(per):
                t0 = clock()
                fn()
                append(clock() - t0)
            if sync:
                sync()
    return {k: spread([x / 1000.0 for x in v]) for k, v in samples.items()}


def host_overhead_us(fn, calls=10000, warmup=500, sync=None):
    """Median host time in microseconds of one ``fn()`` call over ``calls``."""
    return host_overhead({"fn": (fn, sync)}, calls, warmup, rounds=1)["fn"]["median"]


def our_captured(h, step):
    """fn(i): one replay of ``step(0)`` captured with ``Handler.capture``,
    after one eager ``step(0)`` (layers allocate their buffers on first use,
    and allocation is refused inside a capture)."""
    step(0)
    graph = h.capture(lambda: step(0))
    return lambda i: graph.replay()


def torch_graphed(torch, step):
    """fn(i): one replay of PyTorch's ``step(0)`` captured in ``torch.cuda.graph``,
    after three warm-up calls on a side stream, as PyTorch's documentation
    shows (its caching allocator and cuBLAS settle there).

    The returned function keeps ``step`` (and so the parameters, optimizer
    state and inputs the graph reads) alive: a torch graph holds only device
    addresses, and the next ``torch.cuda.graph`` empties PyTorch's cache, so
    tensors dropped here would be unmapped under a graph that still uses them
    (its replays then fail with an illegal memory access)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(0)

    def replay(i, step=step):      # holds step: see above
        graph.replay()
    return replay
