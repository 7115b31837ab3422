"""How fast can a batch be copied into page-locked staging memory, and by what?

``upload_phases.py`` (H200, 2026-11-28) found the reader's staged copy of a
4 MB batch taking 281 us a step inside the (c) upload loop on the
``handlers._hostcopy`` threads of 2133c52 (started per copy), 224 alone,
while PyTorch's whole (g) step takes 286 us with its copy inside.  Eight
threads made the loop slower than four.  This times one 4 MB copy (1000 x
1000 float32) from 32 distinct NumPy sources, cycled (cold, as in the
loop), into 4 page-locked slots, cycled, by several means:

* ``numpy``: one ``np.copyto`` (one thread);
* ``pool K``: the tree's ``handlers._hostcopy`` (worker threads kept
  asleep between copies) on K threads, through the stager;
* ``pool streaming K``: the same source built with non-temporal stores
  (``hostcopy_stream.h`` forced in front; x86-64 only);
* ``spawn K``: the extension of 2133c52 (threads started per copy), built
  from ``--spawn-source`` if given (its file from git: ``git show
  2133c52:handlers/_hostcopy.c``);
* ``torch K``: ``Tensor.copy_`` between the same arrays on K intra-op
  threads (PyTorch's default count first);

each alone, then beside a second Python thread that spins in bytecode (as
the consumer of a loop does while it issues work), then with the GPU's copy
engine reading another pinned slot all the while.  Figures: median
microseconds per copy over ``REPS`` copies (after warm-up).  The variants
are built into a temporary folder with the C compiler; nothing in the
library is changed.

Run on a GPU machine from the project root (the extension built):
``python benchmarks/results/diagnostics/stage_copy.py [--spawn-source F]``.
"""
import argparse
import importlib.util
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from handlers import prefetch as P  # noqa: E402

REPS = 200
N = 1000
DISTINCT = 32
HERE = pathlib.Path(__file__).resolve().parent


def build(source, folder, extra=()):
    """``source`` (a copy of ``handlers/_hostcopy.c``) built as a module of
    its own in ``folder``, loaded; None if it cannot be built."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / ("_hostcopy" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = [os.environ.get("CC", "cc"), "-O2", "-fPIC", "-shared", "-pthread",
           "-I" + sysconfig.get_paths()["include"], *extra, str(source), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        print(f"  (cannot build {source} {' '.join(extra)}: {done.stderr.strip()[:300]})")
        return None
    spec = importlib.util.spec_from_file_location(f"{folder.name}._hostcopy", out)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    asynchronous uploads queued on the handler's stream to outlast the timed
    copies."""

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
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--spawn-source", help="handlers/_hostcopy.c of 2133c52")
    args = p.parse_args()
    from handlers import PyCudaHandler
    from handlers.cuda import kernel_loader
    h = PyCudaHandler()
    ext = kernel_loader.require()
    rng = np.random.default_rng(0)
    srcs = [rng.standard_normal((N, N), dtype=np.float32) for _ in range(DISTINCT)]
    pinned = [h.empty_pinned((N, N)) for _ in range(4)]
    for d in pinned:
        d[...] = 0
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="stage_copy"))
    lib = ROOT / "handlers" / "_hostcopy.c"
    mods = {"pool": P._hostcopy}
    if platform.machine() in ("x86_64", "AMD64"):
        mods["pool streaming"] = build(lib, tmp / "streaming",
                                       ("-include", str(HERE / "hostcopy_stream.h")))
    if args.spawn_source:
        mods["spawn"] = build(pathlib.Path(args.spawn_source), tmp / "spawn")
    mods = {k: m for k, m in mods.items() if m is not None}
    for name, mod in mods.items():   # every variant copies exactly
        for threads in (1, 3, 8):
            src = rng.integers(0, 256, 4_000_037, dtype=np.uint8)
            dst = np.zeros_like(src)
            mod.copy(dst.ctypes.data, src.ctypes.data, src.nbytes, threads)
            assert np.array_equal(dst, src), (name, threads)

    def copier(mod, k):
        def copy(d, s):
            mod.copy(d.ctypes.data, s.ctypes.data, s.nbytes, k)
        return copy

    def row(label, us):
        print(f"  {label:<40} {us:8.1f} us  {4e6 / us / 1e3:6.1f} GB/s", flush=True)

    print(f"one {N}x{N} float32 copy (4 MB) into page-locked memory; median of {REPS}; "
          f"{os.cpu_count()} CPUs ({platform.machine()})")
    row("numpy", timed(np.copyto, srcs, pinned))
    counts = (2, 4, 6, 8, 12)
    for name, mod in mods.items():
        for k in counts:
            row(f"{name} {k}", timed(copier(mod, k), srcs, pinned))
    stager = P.Stager(threads=4)
    row("stager 4 (pool, through Python)", timed(lambda d, s: stager((d,), (s,)), srcs, pinned))
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
    loaded = [(f"{name} {k}", copier(mod, k)) for name, mod in mods.items() for k in (4, 8)]
    if tcopy is not None:
        loaded.append((f"torch {default} threads", tcopy))
    with Spinner():
        for label, copy in loaded:
            args_ = (tsrcs, tdsts) if copy is tcopy else (srcs, pinned)
            row(f"{label}, a spinning thread", timed(copy, *args_))
    other = h.empty_pinned((N, N))
    other[...] = 1
    # 500 uploads of 4 MB (~40 ms) outlast 100 copies of a few hundred us
    for label, copy in [("numpy", np.copyto)] + loaded:
        args_ = (tsrcs, tdsts) if copy is tcopy else (srcs, pinned)
        with Uploads(h, ext, other):
            row(f"{label}, uploads running", timed(copy, *args_, 100))
    stager.close()


if __name__ == "__main__":
    main()
