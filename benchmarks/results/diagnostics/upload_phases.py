"""Where the host time of an upload loop from ordinary NumPy arrays goes.

Issue 44 asks for ``benchmarks upload``'s (c), ``prefetch`` from NumPy
arrays, at >= 1.0x the speed of (g), PyTorch copying the same arrays
through pinned staging tensors.  In the last upload run (2069ae4, H200) (c)
took 494 us a step against (g)'s 221, and the consumer's ``next`` 427 us a
step, where the stager's 4 MB copy into page-locked memory takes 219 us
alone (four threads; one thread 451).  So about 200 us a step go elsewhere
in the reader's pipeline.  This times the pipeline's parts per step, in the
reader thread (the source, waiting for a free staging slot, the staged
copy, waiting for room in the ready queue) and in the consumer (waiting for
a staged batch, starting its upload), for the (c) loop of
``benchmarks/upload.py`` (``pipelined``), under variants:

* ``base``: the library as it is;
* ``threads=K``: the stager's copy split over K threads (1, 2, 6, 8, 12);
* ``switch``: ``sys.setswitchinterval(1e-4)`` instead of 5 ms, to see
  whether threads wait for the GIL (a diagnosis, not a fix: it is the
  process's setting);
* ``switch=10us``: the same at 1e-5;
* ``yield``: the consumer drops the GIL before each op it issues;
* ``probe``: as ``base``, with a thread that measures how long it waits
  for the GIL (written 2026-11-28, fourth session, after the stager's
  copies moved to C threads: the reader still seemed to wait for the GIL
  after each copy);
* ``slots+2``: two more staging slots than ``depth + 1``;
* ``stream``, ``stream,t=8``: ``handlers._hostcopy`` built with non-temporal stores
  (``stage_copy.py``'s variant), on the default threads and on 8.

Nothing in the library is changed: the process wraps ``prefetch``'s
functions.  Each variant runs ``REPEATS`` loops of ``--iters`` steps; the
figures are medians over the loops of microseconds per step.

Run on a GPU machine from the project root (``--handler numpy`` runs the
same loop on NumpyHandler, whose prefetch stages through the same reader,
to try the script anywhere):
``python benchmarks/results/diagnostics/upload_phases.py [--iters 300]``.
"""
import argparse
import collections
import contextlib
import pathlib
import statistics
import sys
import threading
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from benchmarks.upload import DISTINCT, pipelined  # noqa: E402
from handlers import prefetch as P  # noqa: E402

REPEATS = 5


class Clock:
    """Seconds spent in named parts, summed across threads."""

    def __init__(self):
        self.sums = collections.Counter()

    def wrap(self, name, fn):
        """``fn``, timed into ``name``."""
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sums[name] += time.perf_counter() - t
        return timed


def instrument(clock, slots_extra=0):
    """Wrap the reader's and the consumer's parts; return an undo."""
    saved = {}

    def patch(owner, name, new):
        saved[(owner, name)] = getattr(owner, name)
        setattr(owner, name, new)

    stage_call = P.Stager.__call__
    patch(P.Stager, "__call__", lambda self, slot, arrays:
          clock.wrap("reader: staged copy", stage_call)(self, slot, arrays))
    slot_for = P._Reader._slot_for
    patch(P._Reader, "_slot_for", lambda self, arrays:
          clock.wrap("reader: wait for a slot", slot_for)(self, arrays))
    put = P._Reader._put
    patch(P._Reader, "_put", lambda self, msg:
          clock.wrap("reader: wait for room", put)(self, msg))
    init = P._Reader.__init__

    def reader_init(self, source, depth, direct, stage):
        init(self, _timed(source, clock), depth, direct, stage)
        self.budget += slots_extra
    patch(P._Reader, "__init__", reader_init)
    get = P._Channel.get
    patch(P._Channel, "get", lambda self, block=True, timeout=None:
          clock.wrap("consumer: wait for a batch", get)(self, block, timeout)
          if block and timeout is None else get(self, block, timeout))

    def undo():
        for (owner, name), value in saved.items():
            setattr(owner, name, value)
    return undo


def _timed(items, clock):
    """``items``, the time each takes to come counted as the reader's source."""
    items = iter(items)
    while True:
        t = time.perf_counter()
        try:
            item = next(items)
        except StopIteration:
            return
        finally:
            clock.sums["reader: source"] += time.perf_counter() - t
        yield item


def _yielding(h):
    """The consumer drops the GIL (``time.sleep(0)``) before each op it
    issues in the loop: if the reader waits for the GIL while the consumer
    runs Python, this shortens the wait (a diagnosis, not a fix)."""
    for op in ("dot_mm", "add_mv"):
        issue = getattr(h, op)

        def wrapped(*args, _issue=issue, **kwargs):
            time.sleep(0)
            return _issue(*args, **kwargs)
        setattr(h, op, wrapped)


class GilProbe:
    """A thread that asks for the GIL over and over (``time.sleep(0)``
    releases it and takes it back) and counts, per step of the loop, the
    time it waited beyond an idle machine's hand-back: how long the other
    threads hold the GIL at a stretch (``probe: GIL waits``, summed: us per
    step).  It asks every 0.1 ms, so it samples the stretches, and it is one
    more thread wanting the GIL."""

    def __init__(self, clock):
        self.clock = clock

    def __enter__(self):
        self.stop = False
        floor = min(self._once() for _ in range(200))

        def run():
            while not self.stop:
                self.clock.sums["probe: GIL waits"] += max(0.0, self._once() - floor)
                time.sleep(1e-4)
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        return self

    @staticmethod
    def _once():
        t = time.perf_counter()
        time.sleep(0)
        return time.perf_counter() - t

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join()


def _streaming_build():
    """``handlers._hostcopy`` built with non-temporal stores (``stage_copy.py``'s
    variant; x86-64 only), or None."""
    import platform
    import tempfile
    if platform.machine() != "x86_64" or P._hostcopy is None:
        return None
    import stage_copy  # this folder's, beside the script
    here = pathlib.Path(__file__).resolve().parent
    return stage_copy.build(here.parents[2] / "handlers" / "_hostcopy.c",
                            pathlib.Path(tempfile.mkdtemp(prefix="upload_phases")) / "streaming",
                            ("-include", str(here / "hostcopy_stream.h")))


def make_handler(name):
    if name == "numpy":
        from handlers import NumpyHandler
        return NumpyHandler(np.float32)
    from handlers import PyCudaHandler
    return PyCudaHandler(np.float32)


def run_variant(h, m, b, xs, ys, outs, iters, depth, clock):
    """Medians over REPEATS loops: {part: us per step}."""
    per_loop = []
    for _ in range(REPEATS + 1):        # the first loop warms up
        clock.sums.clear()
        phases = {}
        h.synchronize_all_streams()
        t = time.perf_counter()
        pipelined(h, m, b, lambda k: (xs[i % len(xs)] for i in range(k)), ys, outs, iters,
                  phases, depth)
        h.synchronize_all_streams()
        total = time.perf_counter() - t
        row = {"step": total}
        row.update({f"loop: {k}": v for k, v in phases.items()})
        row.update(clock.sums)
        per_loop.append({k: v / iters * 1e6 for k, v in row.items()})
    per_loop = per_loop[1:]
    return {k: statistics.median(r.get(k, 0.0) for r in per_loop) for k in per_loop[0]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--handler", default="pycuda", choices=("pycuda", "numpy"))
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--depth", type=int, default=3)
    args = p.parse_args(argv)
    h = make_handler(args.handler)
    rng = np.random.default_rng(0)
    n = args.n
    m = h.create_from_numpy((rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32))
    b = h.create_from_numpy(rng.standard_normal((n, 1)).astype(np.float32))
    xs = [rng.standard_normal((n, n)).astype(np.float32) for _ in range(DISTINCT)]
    ys = [h.allocate((n, n)) for _ in range(2)]
    outs = [h.empty_pinned((n, n)) for _ in range(2)]
    variants = {"base": {}, "threads=1": {"threads": 1}, "threads=2": {"threads": 2},
                "threads=6": {"threads": 6}, "threads=8": {"threads": 8},
                "threads=12": {"threads": 12}, "switch": {"switch": 1e-4},
                "switch=10us": {"switch": 1e-5}, "yield": {"yield": True},
                "probe": {"probe": True}, "slots+2": {"slots": 2}}
    streaming = _streaming_build()
    if streaming is not None:
        variants["stream"] = {"module": streaming}
        variants["stream,t=8"] = {"module": streaming, "threads": 8}
    results = {}
    for name, v in variants.items():
        clock = Clock()
        undo = instrument(clock, v.get("slots", 0))
        threads, interval = P.COPY_THREADS, sys.getswitchinterval()
        hostcopy = P._hostcopy
        try:
            if "threads" in v:
                P.Stager.__init__.__defaults__ = (v["threads"], P.PARALLEL_BYTES)
            if "switch" in v:
                sys.setswitchinterval(v["switch"])
            if "module" in v:
                P._hostcopy = v["module"]
            if "yield" in v:
                _yielding(h)
            probe = GilProbe(clock) if "probe" in v else contextlib.nullcontext()
            with probe:
                results[name] = run_variant(h, m, b, xs, ys, outs, args.iters, args.depth,
                                            clock)
        finally:
            for op in ("dot_mm", "add_mv"):
                h.__dict__.pop(op, None)
            P.Stager.__init__.__defaults__ = (threads, P.PARALLEL_BYTES)
            sys.setswitchinterval(interval)
            P._hostcopy = hostcopy
            undo()
        print(f"{name}: {results[name]['step']:.0f} us a step", flush=True)
    parts = sorted({k for r in results.values() for k in r})
    print(f"\nupload loop (c) from NumPy arrays, {n}x{n} float32, depth {args.depth}, "
          f"{args.iters} steps, median of {REPEATS} loops; us per step "
          f"({type(h).__name__})")
    width = max(len(k) for k in parts)
    print(" " * width + "".join(f"{k:>12}" for k in results))
    for part in ["step"] + [k for k in parts if k != "step"]:
        print(f"{part:<{width}}" + "".join(f"{r.get(part, 0.0):>12.1f}"
                                           for r in results.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
