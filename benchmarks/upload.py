"""``python -m benchmarks upload``: the m·x+b loop with data moving each step.

y = m·x + b, 1000x1000 float32, m and b resident on the device, a fresh x
uploaded and y downloaded every iteration, 500 iterations.  Rows:

(a) naive synchronous copies through the handler;
(b) ``prefetch`` from pre-pinned data (``h.pin``), asynchronous downloads;
(c) ``prefetch`` from ordinary NumPy arrays, asynchronous downloads;
(d) the bound B = iterations x max(upload, gemm, download), each measured
    with CUDA events in this run;
(e) PyTorch naive; (f) PyTorch with pinned buffers, ``non_blocking`` copies,
    three streams and events.

Each loop runs once to warm up, then RUNS times; the median is reported.
Targets: (b) <= 1.10 x B; (c) <= 1.25 x max(B, iterations x one 4 MB host
copy into pinned memory: one thread, a cold source, cycling over the distinct
inputs as the loop does); (b) and (c) faster than (f).
"""
import argparse
import statistics
import time

import numpy as np

from benchmarks.common import gpu_name, print_table, result_name, save_results
from benchmarks.gpu import EventTimer, cuda_handler, optional_peers

F32 = np.float32
DISTINCT = 32   # distinct inputs, cycled: every iteration uploads new bytes


RUNS = 5   # timed runs of each loop after a warm-up run; the median is reported


def _timed(fn, sync, runs=RUNS):
    """Median seconds of ``fn()`` over ``runs`` calls after a warm-up call
    (buffers, pinned staging, kernels); ``sync()`` waits for the device
    before and after each."""
    fn()
    times = []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def naive(h, m, b, xs, iters):
    x, y = h.allocate(xs[0].shape), h.allocate(xs[0].shape)
    for i in range(iters):
        h.set_from_numpy(x, xs[i % DISTINCT])
        h.dot_mm(m, x, y)
        h.add_mv(y, b, y)
        h.get_numpy_copy(y)


def pipelined(h, m, b, source, ys, outs, iters, phases=None, depth=3):
    """Upload through prefetch on the upload stream, compute on group 0,
    download on group 1; y is double-buffered so a download never holds up
    the next step's compute.  Step i overwrites ys[k] (k = i % 2) only after
    the download of step i - 2 has read it: the compute group waits on the
    event recorded after that download, not on all work of the download group
    (which would include the previous step's download and, through it, the
    previous gemm).  The host waits for that download only because outs[k] is
    reused.  ``phases``, if given, collects host seconds per phase (next
    batch, compute issue, download issue, download wait)."""
    clock = time.perf_counter
    t = phases if phases is not None else {}
    for key in ("next", "compute", "download", "wait"):
        t.setdefault(key, 0.0)
    down = h.with_streams(1)
    pending = [None, None]
    read = [None, None]   # per buffer k: event recorded after ys[k]'s last download
    batches = iter(h.prefetch(source(iters), depth=depth))
    t0 = clock()
    for i, x in enumerate(batches):
        t1 = clock()
        t["next"] += t1 - t0
        k = i % 2
        if pending[k] is not None:
            h.wait_event(read[k])        # ys[k] may be overwritten on the device
            pending[k].result()          # outs[k] may be overwritten by the next download
        t2 = clock()
        h.dot_mm(m, x, ys[k])
        h.add_mv(ys[k], b, ys[k])
        t3 = clock()
        down.wait_for(h)
        pending[k] = down.get_numpy_copy_async(ys[k], out=outs[k])
        read[k] = down.record_event()
        t0 = clock()
        t["wait"] += t2 - t1
        t["compute"] += t3 - t2
        t["download"] += t0 - t3
    for p in pending:
        if p is not None:
            p.result()


def parts(h, m, b, xs_pinned, timer):
    """Device time (s) of one upload, one gemm + bias, one download, and of
    an upload and a download running at once on two streams (the two copy
    directions share the PCIe link: requests for one travel beside the data
    of the other)."""
    import pycuda.driver as drv
    x, y = h.allocate(xs_pinned[0].shape), h.allocate(xs_pinned[0].shape)
    out = h.empty_pinned(xs_pinned[0].shape)
    up = timer.time(lambda i: drv.memcpy_htod_async(x.gpudata, xs_pinned[i % DISTINCT], h.stream))
    gemm = timer.time(lambda i: (h.dot_mm(m, x, y), h.add_mv(y, b, y)))
    dn = timer.time(lambda i: drv.memcpy_dtoh_async(out, y.gpudata, h.stream))
    side = h.with_streams(1)
    pairs = 20

    def both(i):
        # `pairs` uploads on one stream beside `pairs` downloads on another,
        # joined once: the sustained time of one upload and one download
        # sharing the link, as in the pipelined loop.
        side.wait_for(h)
        for j in range(pairs):
            drv.memcpy_htod_async(x.gpudata, xs_pinned[(i + j) % DISTINCT], h.stream)
            drv.memcpy_dtoh_async(out, y.gpudata, side.stream)
        h.wait_for(side)
    pair = timer.time(both, reps=7) / pairs
    return up / 1e3, gemm / 1e3, dn / 1e3, pair / 1e3


HOST_COPY = "host copy into pinned, one thread, cold source"


def host_copy_time(xs, rounds=3, copy=None):
    """Median seconds of one single-threaded ``np.copyto`` of an input into
    page-locked memory (like a staging slot), cycling over the distinct
    inputs ``xs`` as the loop does, so that each source is cold in the caches.
    ``copy(dst, src)`` replaces ``np.copyto`` (prefetch's parallel stager)."""
    import pycuda.driver as drv
    dst = drv.pagelocked_empty(xs[0].shape, xs[0].dtype)
    copy = copy or np.copyto
    times = []
    for i in range(rounds * len(xs)):
        src = xs[i % len(xs)]
        t0 = time.perf_counter()
        copy(dst, src)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def stager_copy_time(xs, threads=None):
    """As ``host_copy_time``, through the stager that ``prefetch`` uses (with
    its default thread count, or ``threads``)."""
    from handlers.prefetch import Stager
    stager = Stager() if threads is None else Stager(threads=threads)
    try:
        return host_copy_time(xs, copy=lambda d, s: stager((d,), (s,))), stager.threads
    finally:
        stager.close()


def torch_rows(t, m_h, b_h, xs, iters):
    m, b = t.from_numpy(m_h).cuda(), t.from_numpy(b_h).cuda()

    def naive_loop():
        for i in range(iters):
            x = t.from_numpy(xs[i % DISTINCT]).cuda()
            (t.mm(m, x) + b).cpu()
        t.cuda.synchronize()

    up_s, comp_s, down_s = t.cuda.Stream(), t.cuda.Stream(), t.cuda.Stream()
    pinned = [t.from_numpy(x).pin_memory() for x in xs]
    outs = [t.empty(xs[0].shape).pin_memory() for _ in range(2)]
    xd = [t.empty(xs[0].shape, device="cuda") for _ in range(2)]
    yd = [t.empty(xs[0].shape, device="cuda") for _ in range(2)]

    def pinned_loop():
        up_ev = [t.cuda.Event() for _ in range(2)]
        used_ev = [t.cuda.Event() for _ in range(2)]   # yd[k] written, xd[k] read
        down_ev = [t.cuda.Event() for _ in range(2)]   # outs[k] written, yd[k] read
        with t.cuda.stream(up_s):
            xd[0].copy_(pinned[0], non_blocking=True)
            up_ev[0].record(up_s)
        for i in range(iters):
            k = i % 2
            if i + 1 < iters:            # upload the next x while this one computes
                with t.cuda.stream(up_s):
                    if i >= 1:
                        up_s.wait_event(used_ev[1 - k])
                    xd[1 - k].copy_(pinned[(i + 1) % DISTINCT], non_blocking=True)
                    up_ev[1 - k].record(up_s)
            if i >= 2:
                down_ev[k].synchronize()  # outs[k] and yd[k] are free
            with t.cuda.stream(comp_s):
                comp_s.wait_event(up_ev[k])
                t.mm(m, xd[k], out=yd[k])
                yd[k].add_(b)
                used_ev[k].record(comp_s)
            with t.cuda.stream(down_s):
                down_s.wait_event(used_ev[k])
                outs[k].copy_(yd[k], non_blocking=True)
                down_ev[k].record(down_s)
        t.cuda.synchronize()

    return {name: _timed(fn, t.cuda.synchronize)
            for name, fn in (("naive", naive_loop), ("pinned", pinned_loop))}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks upload", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--depth", type=int, default=3,
                        help="prefetch depth of (b) and (c) (default 3: one more batch in "
                             "flight than the library default absorbs jitter between the "
                             "upload and download copy engines)")
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args(argv)
    h = cuda_handler("upload", F32)
    if h is None:
        return 0
    n, iters = args.n, args.iters
    rng = np.random.default_rng(0)
    m_h = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(F32)
    b_h = rng.standard_normal((n, 1)).astype(F32)
    xs = [rng.standard_normal((n, n)).astype(F32) for _ in range(DISTINCT)]
    pinned = h.pin(np.stack(xs))
    m, b = h.create_from_numpy(m_h), h.create_from_numpy(b_h)
    ys = [h.allocate((n, n)) for _ in range(2)]
    outs = [h.empty_pinned((n, n)) for _ in range(2)]

    def timed(fn):
        return _timed(fn, h.synchronize_all_streams)

    res = {}
    res["a"] = timed(lambda: naive(h, m, b, xs, iters))
    phases = {"b": {}, "c": {}}
    res["b"] = timed(lambda: pipelined(h, m, b, lambda k: (pinned[i % DISTINCT] for i in range(k)),
                                       ys, outs, iters, phases["b"], args.depth))
    res["c"] = timed(lambda: pipelined(h, m, b, lambda k: (xs[i % DISTINCT] for i in range(k)),
                                       ys, outs, iters, phases["c"], args.depth))
    # correctness of the pipelined result: the last y equals m x + b
    last = xs[(iters - 1) % DISTINCT]
    got = outs[(iters - 1) % 2]
    err = np.abs(got - (m_h.astype(np.float64) @ last + b_h)).max()
    up, gemm, dn, pair = parts(h, m, b, pinned, EventTimer("pycuda", h.stream))
    bound = iters * max(up, gemm, dn)
    hcopy = host_copy_time(xs)
    scopy, sthreads = stager_copy_time(xs)
    scaling = {k: stager_copy_time(xs, k)[0] for k in (2, 8, 12)}
    res["d"] = bound
    t = optional_peers().get("torch")
    if t is not None:
        tr = torch_rows(t, m_h, b_h, xs, iters)
        res["e"], res["f"] = tr["naive"], tr["pinned"]
    c_bound = max(bound, iters * hcopy)
    f = res.get("f")
    rows = [
        ["(a) handler, naive synchronous copies", res["a"], res["a"] / bound, ""],
        ["(b) prefetch from pinned data", res["b"], res["b"] / bound,
         f"<= 1.10 x B: {'yes' if res['b'] <= 1.10 * bound else 'NO'}; faster than (f): "
         f"{'yes' if f and res['b'] < f else 'NO'}"],
        ["(c) prefetch from NumPy arrays", res["c"], res["c"] / bound,
         f"<= 1.25 x max(B, host copies) = {1.25 * c_bound:.4f}: "
         f"{'yes' if res['c'] <= 1.25 * c_bound else 'NO'}; faster than (f): "
         f"{'yes' if f and res['c'] < f else 'NO'}"],
        ["(d) bound B = iters x max(up, gemm, down)", bound, 1.0,
         f"up {up*1e6:.0f} us, gemm+bias {gemm*1e6:.0f} us, down {dn*1e6:.0f} us"],
        ["iters x max(upload and download at once, gemm)", iters * max(pair, gemm),
         iters * max(pair, gemm) / bound,
         f"an upload and a download at once, sustained: {pair*1e6:.0f} us"],
        [f"iters x {HOST_COPY}", iters * hcopy, iters * hcopy / bound,
         f"{hcopy*1e6:.0f} us per 4 MB copy (median)"],
        [f"iters x the same copy by prefetch's stager ({sthreads} threads)", iters * scopy,
         iters * scopy / bound, f"{scopy*1e6:.0f} us per 4 MB copy (median)"],
    ]
    if t is not None:
        rows += [["(e) PyTorch naive", res["e"], res["e"] / bound, ""],
                 ["(f) PyTorch pinned, non_blocking, 3 streams", res["f"], res["f"] / bound, ""]]
    print(f"\nm·x+b with uploads and downloads, {n}x{n} float32, {iters} iterations; "
          f"GPU {gpu_name()}; prefetch depth {args.depth}; {HOST_COPY} {hcopy*1e6:.0f} us; "
          f"max error {err:.2e}")
    print_table(["variant", "seconds", "x B", "target"], rows)
    print("host copy of one 4 MB input into pinned memory by thread count: "
          + ", ".join(f"{k} {v*1e6:.0f} us" for k, v in
                      sorted({1: hcopy, sthreads: scopy, **scaling}.items())))
    for key in ("b", "c"):   # warm-up and timed runs together
        per = {p: v / ((RUNS + 1) * iters) * 1e6 for p, v in phases[key].items()}
        print(f"({key}) host us per step: " + ", ".join(f"{p} {v:.0f}" for p, v in per.items()))
    if args.save:
        saved = dict(seconds=res, depth=args.depth, up_s=up, gemm_s=gemm, down_s=dn,
                     up_and_down_at_once_s=pair, runs=RUNS,
                     host_copy_s=hcopy, host_copy=HOST_COPY,
                     stager_copy_s=scopy, stager_threads=sthreads,
                     host_copy_s_by_threads={1: hcopy, sthreads: scopy, **scaling},
                     max_error=float(err), host_phases_s=phases)
        print("saved", save_results(result_name("upload", gpu_name()), saved))
    return 0
