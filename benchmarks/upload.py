"""``python -m benchmarks upload``: the m·x+b loop with data moving each step.

y = m·x + b, 1000x1000 float32, m and b resident on the device, a fresh x
uploaded and y downloaded every iteration, 500 iterations.  Rows:

(a) naive synchronous copies through the handler;
(b) ``prefetch`` from pre-pinned data (``h.pin``), asynchronous downloads;
(c) ``prefetch`` from ordinary NumPy arrays, asynchronous downloads;
(d) the bound B = iterations x max(upload, gemm, download), each measured
    with CUDA events in this run (medians);
(e) PyTorch naive;
(f) PyTorch from pinned tensors, ``non_blocking`` copies, three streams and
    events;
(g) PyTorch from ordinary NumPy arrays: each input copied on the host into a
    pinned staging tensor, then uploaded ``non_blocking`` as in (f) (beside (c)).

The same buffer depth for ours and PyTorch.  ``prefetch(batches, depth)``
(``handlers/prefetch.py``, ``handlers/cuda_transfer.py``) keeps at most
``depth`` uploads in flight, into ``depth`` device buffers: when the loop
takes batch i, the uploads of batches i .. i + depth - 1 have been issued,
and batch j goes into the device buffer that batch j - depth used, once the
work issued on that batch has run (the upload stream waits on an event).  Its
reader thread stages NumPy batches into at most ``depth + 1`` page-locked
slots, each refilled once the upload that read it has finished.  (f) and (g)
get the same: ``depth`` device input buffers, batch j uploaded into buffer
j mod depth after the upload stream waits for the compute of batch j - depth,
and the uploads of batches i .. i + depth - 1 issued before the compute of
batch i; (g) stages into ``depth + 1`` pinned tensors, slot s refilled after
the host waits for the event recorded after its previous upload.  The output
y is double-buffered (two device buffers, two pinned host outputs) in (b),
(c), (f) and (g) alike.

Each loop runs once to warm up, then RUNS times; the runs are taken
round-robin across (a), (b), (c), (e), (f), (g), the first rotating each
round, so that a slow spell of the machine favours none.  A run is timed on
the host clock, the device synchronized before it (outside the clock) and at
its end (inside); each variant's seconds are a spread.

Targets: (b) <= 1.10 x B; (c) <= 1.25 x max(B, iterations x one 4 MB host
copy into pinned memory: one thread, a cold source, cycling over the distinct
inputs as the loop does); (b) and (c) faster than (f).

Check: the last output of (b), (c), (f) and (g) (of each one's last run)
against ``m @ x + b`` in float64 NumPy on the same float32 inputs: max
relative error within 1e-4.  ``main`` returns 1 if it fails.

Saved results (``--save``): ``seconds``: ``{a, b, c, e, f, g}`` spreads of
seconds per loop (e, f, g only with PyTorch) and ``d``, the bound B (a plain
number, from the medians); spreads of seconds: ``up_s``, ``gemm_s``,
``down_s`` (one upload, gemm + bias, one download; device time),
``up_and_down_at_once_s`` (an upload and a download sharing the link,
sustained, per pair), ``host_copy_s`` (one 4 MB copy into pinned memory, one
thread), ``stager_copy_s`` (the same by prefetch's stager) and
``host_copy_s_by_threads`` (``{threads: spread}``); ``host_copy`` (what the
host copy is), ``stager_threads``, ``depth``, ``staging_buffers`` (of (g):
depth + 1), ``runs``; ``host_phase_us_per_step``: ``{b, c: {next, compute,
download, wait: spread over the timed runs of host microseconds per step}}``;
``checks``: ``[{"what", "errors": {variant: max relative error}, "tol",
"ok"}]``.
"""
import time

import numpy as np

from benchmarks.common import (
    Run,
    check_line,
    derive,
    gpu_name,
    med,
    print_table,
    rel_error,
    spread,
    suite_parser,
)
from benchmarks.gpu import EventTimer, cuda_handler, optional_peers

F32 = np.float32
DISTINCT = 32   # distinct inputs, cycled: every iteration uploads new bytes
RUNS = 5        # timed runs of each loop after a warm-up run
TOL = 1e-4      # relative error allowed in the check (float32 gemm, K = n)
PHASES = ("next", "compute", "download", "wait")


def round_robin(variants, sync_all, runs=RUNS):
    """``{label: spread of seconds}`` of whole loops on the host clock.

    ``variants`` is ``{label: (fn, sync)}``: ``fn()`` issues one loop and
    ``sync()`` waits for its library's device work.  Each runs once to warm
    up, then ``runs`` times, the labels taking turns (the first rotating each
    round); ``sync_all()`` idles the device before each run, off the clock."""
    labels = list(variants)
    for k in labels:   # warm-up: buffers, staging memory, kernels, cuBLAS
        fn, sync = variants[k]
        sync_all()
        fn()
        sync()
    samples = {k: [] for k in labels}
    for r in range(runs):
        for j in range(len(labels)):
            k = labels[(r + j) % len(labels)]
            fn, sync = variants[k]
            sync_all()
            t0 = time.perf_counter()
            fn()
            sync()
            samples[k].append(time.perf_counter() - t0)
    return {k: spread(v) for k, v in samples.items()}


def naive(h, m, b, xs, iters):
    """(a): upload, compute and download with synchronous copies."""
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
    for key in PHASES:
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


def to_s(ms):
    """A spread of milliseconds as seconds."""
    return derive(ms, lambda v: v / 1e3)


def parts(h, m, b, xs_pinned, timer):
    """Spreads of the device time (s) of one upload, one gemm + bias, one
    download, and of an upload and a download running at once on two streams
    (the two copy directions share the PCIe link: requests for one travel
    beside the data of the other)."""
    from handlers.cuda import kernel_loader
    ext = kernel_loader.require()
    x, y = h.allocate(xs_pinned[0].shape), h.allocate(xs_pinned[0].shape)
    out = h.empty_pinned(xs_pinned[0].shape)
    up = timer.measure(
        lambda i: ext.copy_htod(int(x.gpudata), xs_pinned[i % DISTINCT], h.stream.handle))
    gemm = timer.measure(lambda i: (h.dot_mm(m, x, y), h.add_mv(y, b, y)))
    dn = timer.measure(lambda i: ext.copy_dtoh(out, int(y.gpudata), h.stream.handle))
    side = h.with_streams(1)
    pairs = 20

    def both(i):
        # `pairs` uploads on one stream beside `pairs` downloads on another,
        # joined once: the sustained time of one upload and one download
        # sharing the link, as in the pipelined loop.
        side.wait_for(h)
        for j in range(pairs):
            ext.copy_htod(int(x.gpudata), xs_pinned[(i + j) % DISTINCT], h.stream.handle)
            ext.copy_dtoh(out, int(y.gpudata), side.stream.handle)
        h.wait_for(side)
    pair = derive(timer.measure(both, reps=7), lambda v: v / pairs / 1e3)
    return to_s(up), to_s(gemm), to_s(dn), pair


HOST_COPY = "host copy into pinned, one thread, cold source"


def host_copy_time(xs, rounds=3, copy=None):
    """Spread of seconds of one single-threaded ``np.copyto`` of an input into
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
    return spread(times)


def stager_copy_time(xs, threads=None):
    """As ``host_copy_time``, through the stager that ``prefetch`` uses (with
    its default thread count, or ``threads``); returns (spread, threads)."""
    from handlers.prefetch import Stager
    stager = Stager() if threads is None else Stager(threads=threads)
    try:
        return host_copy_time(xs, copy=lambda d, s: stager((d,), (s,))), stager.threads
    finally:
        stager.close()


def torch_pipeline(t, m, b, xs, iters, depth, pinned=None):
    """(f) or (g): PyTorch's m·x+b loop pipelined over three streams (upload,
    compute, download) with ``depth`` device input buffers, as the module
    docstring describes.  With ``pinned`` (pinned tensors of the inputs) it
    uploads from them (f); without, from the NumPy arrays ``xs`` through
    ``depth + 1`` pinned staging tensors (g).  Returns ``(loop, outs)``:
    ``loop()`` issues the whole loop (the caller synchronizes); ``outs`` are
    the two pinned host outputs, y of iteration i in ``outs[i % 2]``."""
    shape = xs[0].shape
    up_s, comp_s, down_s = t.cuda.Stream(), t.cuda.Stream(), t.cuda.Stream()
    xd = [t.empty(shape, device="cuda") for _ in range(depth)]
    yd = [t.empty(shape, device="cuda") for _ in range(2)]
    outs = [t.empty(shape, pin_memory=True) for _ in range(2)]
    uploaded = [t.cuda.Event() for _ in range(depth)]   # xd[k] holds its batch
    used = [t.cuda.Event() for _ in range(depth)]       # the compute reading xd[k] is done
    downloaded = [t.cuda.Event() for _ in range(2)]     # outs[k] written, yd[k] read
    slots = depth + 1
    staging = [] if pinned is not None else [t.empty(shape, pin_memory=True)
                                             for _ in range(slots)]
    staged = [t.cuda.Event() for _ in staging]           # staging[s]'s upload is done

    def upload(j):
        k = j % depth
        if pinned is not None:
            src = pinned[j % DISTINCT]
        else:
            s = j % slots
            if j >= slots:
                staged[s].synchronize()    # the upload that last read staging[s] is done
            src = staging[s]
            src.copy_(t.from_numpy(xs[j % DISTINCT]))
        with t.cuda.stream(up_s):
            if j >= depth:
                up_s.wait_event(used[k])   # the batch j - depth in xd[k] has been read
            xd[k].copy_(src, non_blocking=True)
            uploaded[k].record(up_s)
            if pinned is None:
                staged[j % slots].record(up_s)

    def loop():
        for j in range(min(depth - 1, iters)):   # as prefetch: depth - 1 batches ahead
            upload(j)
        for i in range(iters):
            if i + depth - 1 < iters:
                upload(i + depth - 1)
            k, o = i % depth, i % 2
            if i >= 2:
                downloaded[o].synchronize()      # outs[o] and yd[o] are free
            with t.cuda.stream(comp_s):
                comp_s.wait_event(uploaded[k])
                t.mm(m, xd[k], out=yd[o])
                yd[o].add_(b)
                used[k].record(comp_s)
            with t.cuda.stream(down_s):
                down_s.wait_event(used[k])
                outs[o].copy_(yd[o], non_blocking=True)
                downloaded[o].record(down_s)
    return loop, outs


def torch_variants(t, m_h, b_h, xs, iters, depth):
    """``{label: (loop, last)}`` of (e), (f) and (g): ``loop()`` issues one
    loop; ``last()`` returns the loop's last y (None for (e))."""
    m, b = t.from_numpy(m_h).cuda(), t.from_numpy(b_h).cuda()

    def naive_loop():
        for i in range(iters):
            x = t.from_numpy(xs[i % DISTINCT]).cuda()
            (t.mm(m, x) + b).cpu()

    pinned = [t.from_numpy(x).pin_memory() for x in xs]
    f, outs_f = torch_pipeline(t, m, b, xs, iters, depth, pinned)
    g, outs_g = torch_pipeline(t, m, b, xs, iters, depth)
    last = (iters - 1) % 2
    return {"e": (naive_loop, None),
            "f": (f, lambda: outs_f[last].numpy()),
            "g": (g, lambda: outs_g[last].numpy())}


def main(argv=None):
    """Time the variants, print the table and the check; 1 if the check failed."""
    parser = suite_parser("upload", __doc__)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--depth", type=int, default=3,
                        help="prefetch depth of (b) and (c), and the device input buffers of "
                             "(f) and (g) (default 3: one more batch in flight than the "
                             "library default absorbs jitter between the upload and download "
                             "copy engines)")
    args = parser.parse_args(argv)
    run = Run("upload", gpu_name(), vars(args))
    h = cuda_handler("upload", F32)
    if h is None:
        return 0
    n, iters, depth = args.n, args.iters, args.depth
    rng = np.random.default_rng(0)
    m_h = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(F32)
    b_h = rng.standard_normal((n, 1)).astype(F32)
    xs = [rng.standard_normal((n, n)).astype(F32) for _ in range(DISTINCT)]
    pinned = h.pin(np.stack(xs))
    m, b = h.create_from_numpy(m_h), h.create_from_numpy(b_h)
    t = optional_peers().get("torch")

    def sync_all():
        h.synchronize_all_streams()
        if t is not None:
            t.cuda.synchronize()

    # (b) and (c) have buffers of their own, so that each one's last output
    # survives the other's runs for the check.
    sources = {"b": lambda k: (pinned[i % DISTINCT] for i in range(k)),
               "c": lambda k: (xs[i % DISTINCT] for i in range(k))}
    ys = {k: [h.allocate((n, n)) for _ in range(2)] for k in sources}
    outs = {k: [h.empty_pinned((n, n)) for _ in range(2)] for k in sources}
    phase_runs = {k: [] for k in sources}   # per run: {phase: host seconds}

    def ours_loop(key):
        def loop():
            phases = {}
            phase_runs[key].append(phases)
            pipelined(h, m, b, sources[key], ys[key], outs[key], iters, phases, depth)
        return loop

    ours_sync = h.synchronize_all_streams
    variants = {"a": (lambda: naive(h, m, b, xs, iters), ours_sync),
                "b": (ours_loop("b"), ours_sync),
                "c": (ours_loop("c"), ours_sync)}
    last = {"ours (b)": lambda: outs["b"][(iters - 1) % 2],
            "ours (c)": lambda: outs["c"][(iters - 1) % 2]}
    if t is not None:
        tv = torch_variants(t, m_h, b_h, xs, iters, depth)
        for key in "efg":
            variants[key] = (tv[key][0], t.cuda.synchronize)
        last["torch (f)"], last["torch (g)"] = tv["f"][1], tv["g"][1]
    res = round_robin(variants, sync_all)

    # The check: each variant's last y against float64, on the inputs timed.
    x_last = xs[(iters - 1) % DISTINCT].astype(np.float64)
    ref = m_h.astype(np.float64) @ x_last + b_h.astype(np.float64)
    errors = {k: rel_error(fn(), ref) for k, fn in last.items()}
    what = f"last y = m x + b (iteration {iters}) of (b), (c), (f), (g)"
    checks = [dict(what=what, errors=errors, tol=TOL, ok=check_line(what, errors, TOL))]

    up, gemm, dn, pair = parts(h, m, b, pinned, EventTimer("pycuda", h.stream))
    step = max(med(up), med(gemm), med(dn))
    bound = iters * step
    hcopy = host_copy_time(xs)
    scopy, sthreads = stager_copy_time(xs)
    by_threads = {1: hcopy, sthreads: scopy}
    for k in (2, 8, 12):
        by_threads.setdefault(k, stager_copy_time(xs, k)[0])
    res["d"] = bound
    sec = {k: med(v) for k, v in res.items()}
    c_bound = max(bound, iters * med(hcopy))
    f, g = sec.get("f"), sec.get("g")

    def rng_text(k):
        return f"{res[k]['min']:.4f}-{res[k]['max']:.4f}"

    pair_s, hcopy_s, scopy_s = med(pair), med(hcopy), med(scopy)
    rows = [
        ["(a) handler, naive synchronous copies", sec["a"], rng_text("a"), sec["a"] / bound, ""],
        ["(b) prefetch from pinned data", sec["b"], rng_text("b"), sec["b"] / bound,
         f"<= 1.10 x B: {'yes' if sec['b'] <= 1.10 * bound else 'NO'}; faster than (f): "
         f"{'yes' if f and sec['b'] < f else 'NO'}"],
        ["(c) prefetch from NumPy arrays", sec["c"], rng_text("c"), sec["c"] / bound,
         f"<= 1.25 x max(B, host copies) = {1.25 * c_bound:.4f}: "
         f"{'yes' if sec['c'] <= 1.25 * c_bound else 'NO'}; faster than (f): "
         f"{'yes' if f and sec['c'] < f else 'NO'}"],
        ["(d) bound B = iters x max(up, gemm, down)", bound, "", 1.0,
         f"up {med(up)*1e6:.0f} us, gemm+bias {med(gemm)*1e6:.0f} us, "
         f"down {med(dn)*1e6:.0f} us"],
        ["iters x max(upload and download at once, gemm)", iters * max(pair_s, med(gemm)), "",
         iters * max(pair_s, med(gemm)) / bound,
         f"an upload and a download at once, sustained: {pair_s*1e6:.0f} us"],
        [f"iters x {HOST_COPY}", iters * hcopy_s, "", iters * hcopy_s / bound,
         f"{hcopy_s*1e6:.0f} us per 4 MB copy (median)"],
        [f"iters x the same copy by prefetch's stager ({sthreads} threads)", iters * scopy_s, "",
         iters * scopy_s / bound, f"{scopy_s*1e6:.0f} us per 4 MB copy (median)"],
    ]
    if t is not None:
        rows += [["(e) PyTorch naive", sec["e"], rng_text("e"), sec["e"] / bound, ""],
                 [f"(f) PyTorch pinned, non_blocking, 3 streams, {depth} buffers", f,
                  rng_text("f"), f / bound, ""],
                 [f"(g) PyTorch from NumPy via {depth + 1} pinned staging, as (f)", g,
                  rng_text("g"), g / bound, f"(c) takes {sec['c'] / g:.2f}x the time of (g)"]]
    print(f"\nm·x+b with uploads and downloads, {n}x{n} float32, {iters} iterations; "
          f"GPU {gpu_name()}; depth {depth}; seconds: median of {RUNS} runs (min-max), taken "
          f"round-robin; {HOST_COPY} {hcopy_s*1e6:.0f} us")
    print_table(["variant", "seconds", "range", "x B", "target"], rows)
    print("host copy of one 4 MB input into pinned memory by thread count: "
          + ", ".join(f"{k} {med(v)*1e6:.0f} us" for k, v in sorted(by_threads.items())))
    # Host time per step in each phase, over the timed runs (the first run of
    # each variant was the warm-up).
    phase_us = {key: {p: spread([r[p] / iters * 1e6 for r in runs[1:]]) for p in PHASES}
                for key, runs in phase_runs.items()}
    for key, per in phase_us.items():
        print(f"({key}) host us per step (median): "
              + ", ".join(f"{p} {med(v):.0f}" for p, v in per.items()))
    results = dict(seconds=res, depth=depth, staging_buffers=depth + 1, up_s=up, gemm_s=gemm,
                   down_s=dn, up_and_down_at_once_s=pair, runs=RUNS,
                   host_copy_s=hcopy, host_copy=HOST_COPY,
                   stager_copy_s=scopy, stager_threads=sthreads,
                   host_copy_s_by_threads=by_threads,
                   host_phase_us_per_step=phase_us, checks=checks)
    if args.save:
        run.save(results)
    return 0 if all(c["ok"] for c in checks) else 1
