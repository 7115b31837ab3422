"""The column kernels' tile and grid on the random set's misses.

The reductions suite on an H200 (2026-11-27, commit 43a71e0, seed
1685489423) had 3 of 48 random cases below 0.95x torch, each over a middle
axis of few rows and long, unaligned inner runs (``*_cols``, scalar
columns): ``min_t`` over axis 1 of (3, 13, 809705, 2) at 0.80x, ``mean_t``
over axis 1 of (2, 17, 155759, 1) at 0.81x, ``argmax_t`` over axis 1 of
(127, 137, 398) at 0.86x; ``sum_t`` over axis 0 of (2, 2, 1102663) and of
(42, 322763) sat at 0.96-0.97x.  The run at c62ef88 (seed 139803149) had
4 of 48 below, three over a short middle axis (``sum_t`` of (3382, 11, 29)
over 1 at 0.93x, ``min_t`` of (4397, 16, 307) over 1 at 0.87x, ``mean_t``
of (21992, 2, 499) over 1 at 0.81x) and ``argmax_t`` of (245270, 4) over 0
at 0.51x, whose 4 columns the planner splits into only 30 chunks (each
whole trips of a 256-row block).  This times each, ours only beside torch,
on the planner's tile (tx threads across the columns, 256 / tx down the
rows), grid (at most 32 blocks a multiprocessor, the kernel striding) and
chunks, then on forced tiles, grids and chunk counts (a chunked plan's
chunk rounded to whole block rows, not whole trips) and the column kernel
where the planner takes ``*_short``, inputs from DRAM,
each result checked against NumPy (float64 for the sums).  Run on the GPU
machine from the project root::

    python benchmarks/results/diagnostics/cols_tiles.py
"""
import pathlib
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

REPS, CALLS = 10, 10
CASES = [("min_t", (3, 13, 809705, 2), 1), ("mean_t", (2, 17, 155759, 1), 1),
         ("argmax_t", (127, 137, 398), 1), ("sum_t", (2, 2, 1102663), 0),
         ("sum_t", (42, 322763), 0), ("sum_t", (3382, 11, 29), 1),
         ("min_t", (4397, 16, 307), 1), ("mean_t", (21992, 2, 499), 1),
         ("argmax_t", (245270, 4), 0)]
#: tx to force (None: the planner's)
TILES = [None, 32, 64, 128, 256]
#: grid caps in blocks a multiprocessor (None: the planner's 32)
GRIDS = [None, 4, 8, 16, 64]
#: chunk counts to force on a plan the planner chunks (None: the planner's)
CHUNKS = [None, 64, 132, 264, 528]


def main():
    from benchmarks.gpu import EventTimer, cuda_handler
    from benchmarks.ops import inputs_beyond_l2
    from handlers.cuda import reductions as R
    h = cuda_handler("cols_tiles", np.float32, what="tool")
    if h is None:
        return
    try:
        import torch
    except ImportError:
        torch = None
    timer = EventTimer("pycuda", h.stream)
    force = {"tx": None, "per_sm": None, "chunks": None}
    tile, plan_cols = R._tile, R.plan_cols

    def forced_tile(cols, n, trip, rows_first=False):
        if force["tx"] is None:
            return tile(cols, n, trip, rows_first)
        return force["tx"], R.BLOCK // force["tx"]

    def forced_cols(outer, n, inner, *args, **kw):
        p = plan_cols(outer, n, inner, *args, **kw)
        if p.launch.kernel.endswith("_short"):
            return p
        if force["chunks"] is not None:
            return rechunk(p, force["chunks"])
        if force["per_sm"] is None:
            return p
        chunks, tx = p.launch.args[4], p.launch.args[6]
        per = 4 if "_vec" in p.launch.kernel else R.scalar_cols(4)   # float32's packet
        tasks = outer * -(-(-(-inner // per)) // tx) * chunks
        grid = max(1, min(tasks, h._sms * force["per_sm"]))
        return p._replace(launch=p.launch._replace(grid=grid))

    def rechunk(p, want):
        """``p`` split into about ``want`` chunks of whole block rows (the
        workspace scaled to match), or ``p`` where it is not chunked."""
        args = list(p.launch.args)
        n, chunks, tx = args[1], args[4], args[6]
        rows = R.BLOCK // tx
        base = p.counters
        if chunks == 1:   # unchunked: every tile a task, the workspace as plan_cols sizes it
            outer, inner = args[0], args[2]
            per = 4 if "_vec" in p.launch.kernel else R.scalar_cols(4)
            base = outer * -(-(-(-inner // per)) // tx)
            family = p.launch.kernel.split("_")[0]
            p = p._replace(workspace=outer * inner * R._state(family, 4), counters=base)
        chunk = -(-n // want)
        chunk += -chunk % rows
        new = -(-n // chunk)
        args[3], args[4] = chunk, new
        tasks = base * new
        launch = p.launch._replace(args=tuple(args), grid=max(1, min(tasks, h._sms * 32)))
        return p._replace(launch=launch, workspace=p.workspace // chunks * new)

    R._tile, R.plan_cols = forced_tile, forced_cols
    # Cases named on the command line (op:extents:axis, e.g. argmax_t:547,2467,2:1)
    # replace the list above.
    cases = [(op, tuple(map(int, ext.split(","))), int(ax))
             for op, ext, ax in (a.split(":") for a in sys.argv[1:])] or CASES
    rng = np.random.default_rng(7)
    print(f"column tiles: {h._sms} SMs; us per call, median of {REPS} samples of {CALLS} "
          f"calls, inputs from DRAM")
    for op, shape, axis in cases:
        if op == "argmax_t":
            host = rng.standard_normal(shape).astype(np.float32)
            want = np.argmax(host, axis=axis)
        else:
            host = rng.standard_normal(shape).astype(np.float32)
            want = getattr(np, {"min_t": "min", "mean_t": "mean", "sum_t": "sum",
                                "max_t": "max"}[op])(
                host.astype(np.float64), axis=axis)
        k = inputs_beyond_l2(host.nbytes)
        xs = [h.create_from_numpy(host) for _ in range(k)]
        oshape = tuple(1 if i == axis else s for i, s in enumerate(shape))
        out = h.allocate(oshape)
        line = f"\n{op} {shape} axis {axis}: {host.nbytes / 1e6:.1f} MB, {k} inputs cycled"
        if torch is not None:
            fn = {"min_t": torch.amin, "mean_t": torch.mean, "sum_t": torch.sum,
                  "argmax_t": torch.argmax, "max_t": torch.amax}[op]
            ts = [torch.from_numpy(host).cuda() for _ in range(k)]
            tt = EventTimer("torch", module=torch)
            us = tt.measure(lambda i: fn(ts[i % k], axis), reps=REPS, warmup=2,
                            inner=CALLS)["median"] * 1e3
            line += f"; torch {us:.2f} us"
        print(line)
        variants = [(tx, per_sm, None) for tx in TILES for per_sm in GRIDS
                    if tx is None or per_sm is None]   # forced tiles on the planner's grid
        variants += [(None, None, c) for c in CHUNKS[1:] + [2, 4, 8]]
        variants += [(tx, None, "noshort") for tx in TILES]   # *_cols where *_short plans
        short_tile = R.SHORT_TILE
        for tx, per_sm, chunks in variants:
            R.SHORT_TILE = 0 if chunks == "noshort" else short_tile
            force.update(tx=tx, per_sm=per_sm, chunks=None if chunks == "noshort" else chunks)
            h._sum_plans.clear()
            for launches in h._reduce_launches.values():
                launches.clear()
            red = getattr(h, op)
            try:
                red(xs[0], axis, out)
            except Exception as e:   # a forced tile the kernel refuses
                print(f"  tx {tx} grid {per_sm} chunks {chunks}: {type(e).__name__}: {e}")
                continue
            p = next(iter(h._sum_plans.values()))
            us = timer.measure(lambda i: red(xs[i % k], axis, out), reps=REPS, warmup=2,
                               inner=CALLS)["median"] * 1e3
            got = h.get_numpy_copy(out).reshape(np.shape(want))
            if op == "argmax_t":
                err = float(np.mean(got != want))
            else:
                err = float(np.max(np.abs(got - want)) / max(1e-30, np.max(np.abs(want))))
            print(f"  tx {str(tx or 'plan'):>4s} grid/SM {str(per_sm or 'plan'):>4s} "
                  f"chunks {str(chunks or 'plan'):>4s}: "
                  f"{us:8.2f} us  ({p.launch.kernel}, grid {p.launch.grid}, "
                  f"args {p.launch.args})  err {err:.1e} "
                  f"{'ok' if err < 1e-5 else 'WRONG'}")
        R.SHORT_TILE = short_tile


if __name__ == "__main__":
    main()
