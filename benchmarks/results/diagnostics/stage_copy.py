"""How fast can a batch be copied into page-locked staging memory, and by what?

``upload_phases.py`` (H200, 2026-11-28, fourth session) found the reader's
staged copy of a 4 MB batch taking 517 us a step inside the (c) upload loop
(four copy threads), where the same copy alone took 219 us in an earlier
session, and PyTorch's whole (g) step takes 221 us with its copy inside.
This times one 4 MB copy (1000 x 1000 float32) from 32 distinct NumPy
sources, cycled (cold, as in the loop), into 4 page-locked slots, cycled,
by several means:

* ``numpy``: one ``np.copyto``; ``numpy pageable``: into ordinary memory;
  ``numpy warm``: the same source every time;
* ``memmove``: libc's memmove through ctypes (one thread);
* ``stager K``: ``handlers.prefetch.Stager`` with K threads (its C
  extension's threads; then its Python workers, as before 163ae1e);
* ``torch``: ``Tensor.copy_`` between the same arrays, on PyTorch's
  intra-op threads (its default count, then 4 and 8);

each alone, then the stager and torch with a second Python thread that
spins in bytecode (as the consumer of a loop does while it issues work),
then with the GPU's copy engine reading another pinned slot all the while.
Figures: median microseconds per copy over ``REPS`` copies (after warm-up).
Nothing in the library is changed.

Run on a GPU machine from the project root:
``python benchmarks/results/diagnostics/stage_copy.py``.
"""
import ctypes
import pathlib
import statistics
import sys
import threading
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from handlers import prefetch as P  # noqa: E402

REPS = 200
N = 1000
DISTINCT = 32


def timed(copy, srcs, dsts, reps=REPS):
    """Median us per copy of ``copy(dst, src)``, sources and slots cycled."""
    for i in range(20):
        copy(dsts[i % len(dsts)], srcs[i % len(srcs)])
    t = []
    for i in range(reps):
        s, d = srcs[(i * 7) % len(srcs)], dsts[i % len(dsts)]
        t0 = time.perf_counter()
        copy(d, s)
        t.append(time.perf_counter() - t0)
    return statistics.median(t) * 1e6


class Spinner:
    """A Python thread running bytecode (holding the GIL when it can)."""

    def __enter__(self):
        self.stop = False

        def spin():
            x = 0
            while not self.stop:
                for k in range(200):
                    x += k
        self.thread = threading.Thread(target=spin, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join()


class Uploads:
    """The copy engine reading a pinned 4 MB buffer back to back: enough
    asynchronous uploads queued on the handler's stream (from this thread:
    the context is current here) to outlast the timed copies."""

    def __init__(self, h, ext, src, queued=500):
        self.h, self.ext, self.src, self.queued = h, ext, src, queued
        self.dev = h.allocate(src.shape)

    def __enter__(self):
        for _ in range(self.queued):
            self.ext.copy_htod(int(self.dev.gpudata), self.src, self.h.stream.handle)
        return self

    def __exit__(self, *exc):
        self.h.synchronize()


def main():
    from handlers import PyCudaHandler
    from handlers.cuda import kernel_loader
    h = PyCudaHandler()
    ext = kernel_loader.require()
    rng = np.random.default_rng(0)
    srcs = [rng.standard_normal((N, N), dtype=np.float32) for _ in range(DISTINCT)]
    pinned = [h.empty_pinned((N, N)) for _ in range(4)]
    pageable = [np.empty((N, N), np.float32) for _ in range(4)]
    for d in pinned + pageable:
        d[...] = 0
    libc = ctypes.CDLL(None)
    libc.memmove.restype = ctypes.c_void_p
    libc.memmove.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    rows = []

    def row(label, us):
        rows.append((label, us))
        print(f"  {label:<36} {us:8.1f} us  {4e6 / us / 1e3:6.1f} GB/s", flush=True)

    def npcopy(d, s):
        np.copyto(d, s)

    print(f"one {N}x{N} float32 copy (4 MB) into page-locked memory; median of {REPS}")
    row("numpy", timed(npcopy, srcs, pinned))
    row("numpy pageable", timed(npcopy, srcs, pageable))
    row("numpy warm", timed(npcopy, srcs[:1], pinned))
    row("memmove", timed(lambda d, s: libc.memmove(d.ctypes.data, s.ctypes.data, s.nbytes),
                         srcs, pinned))
    stagers = {k: P.Stager(threads=k) for k in (2, 4, 8, 16)}
    for k, st in stagers.items():
        row(f"stager {k}", timed(lambda d, s, st=st: st((d,), (s,)), srcs, pinned))
    hostcopy, P._hostcopy = P._hostcopy, None   # the Python workers' path
    try:
        for k in (2, 4):
            st = P.Stager(threads=k)
            row(f"stager {k}, Python workers", timed(lambda d, s: st((d,), (s,)), srcs, pinned))
            if k == 4:
                with Spinner():
                    row("stager 4, Python workers, a spinning thread",
                        timed(lambda d, s: st((d,), (s,)), srcs, pinned))
            st.close()
    finally:
        P._hostcopy = hostcopy
    print("  (importing torch)", flush=True)
    try:
        import torch
    except ImportError:
        torch = None
    tcopy = None
    if torch is not None:
        tsrcs = [torch.from_numpy(s) for s in srcs]
        tdsts = [torch.from_numpy(d) for d in pinned]

        def tcopy(d, s):
            d.copy_(s)
        default = torch.get_num_threads()
        for k in (default, 4, 8):
            torch.set_num_threads(k)
            row(f"torch {k} threads", timed(tcopy, tsrcs, tdsts))
        torch.set_num_threads(default)
    with Spinner():
        row("numpy, a spinning thread", timed(npcopy, srcs, pinned))
        for k in (2, 4):
            st = stagers[k]
            row(f"stager {k}, a spinning thread",
                timed(lambda d, s, st=st: st((d,), (s,)), srcs, pinned))
        if tcopy is not None:
            row("torch, a spinning thread", timed(tcopy, tsrcs, tdsts))
    other = h.empty_pinned((N, N))
    other[...] = 1
    # 500 uploads of 4 MB (~40 ms) outlast 100 copies of a few hundred us
    with Uploads(h, ext, other):
        row("numpy, uploads running", timed(npcopy, srcs, pinned, 100))
    for k in (2, 4):
        st = stagers[k]
        with Uploads(h, ext, other):
            row(f"stager {k}, uploads running",
                timed(lambda d, s, st=st: st((d,), (s,)), srcs, pinned, 100))
    if tcopy is not None:
        with Uploads(h, ext, other):
            row("torch, uploads running", timed(tcopy, tsrcs, tdsts, 100))
    for st in stagers.values():
        st.close()


if __name__ == "__main__":
    main()
