"""Middle axes of few columns through the general kernel?  ``short_slabs``
(2026-11-28) found reductions over the middle axis of an (outer, n, inner)
view with few columns (inner) and many slabs (outer) 2-4x slower than
torch: ``sum_t`` of (20000, 40, 30) over axis 1 123 us against 31.  Both
kernels that take the layout today, ``*_short`` and ``*_cols``, give a task
one slab, so a block pays its fixed costs per few elements a thread.  The
general kernel (``plan_gen``, ``*_gen*``) sees the outputs of every slab
as one row of columns: a warp's lanes take 32 consecutive outputs, each
thread walks its output's n rows, and a block's tile spans slabs, as
torch's reduction does for this layout.

This times each case with the tree's plan and with ``gen``, which sends
every ``cols`` layout of more than one slab (outer > 1) to ``plan_gen``
where it accepts (swapping ``reductions.plan_cols`` in the process; a
fresh handler each: plans are cached per handler), beside torch, inputs
read from DRAM; us per call, the plan's kernel and grid, torch's time over
each, each result checked against NumPy (float64 for sums, exact for the
extremes and argmax).  ``plan_gen`` takes max, min and argmax only with
``gen_families.patch`` applied (the kernels ``max_gen*``, ``min_gen*``,
``pick_gen*``); without it their ``gen`` column repeats the tree's plan.
The general kernel has more arguments than the one-call path takes, so
its calls go through Python: the times include that host cost.

Run on a GPU machine with torch from the root of a snapshot with the
patch applied (``git apply
benchmarks/results/diagnostics/gen_families.patch``): ``python
benchmarks/results/diagnostics/middle_axis_gen.py``.
"""
import pathlib
import statistics
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

REPS, CALLS = 15, 10
#: (op, shape, axis): short_slabs' slow cases, cols layouts of the random
#: sets and of the tuned shapes (their slabs many or few, their columns
#: few or many), small ones where the host path shows
CASES = [("sum_t", (20000, 40, 30), 1), ("max_t", (20000, 40, 30), 1),
         ("argmax_t", (20000, 40, 30), 1), ("sum_t", (40000, 10, 70), 1),
         ("argmax_t", (40000, 10, 70), 1), ("sum_t", (100000, 5, 100), 1),
         ("min_t", (100000, 5, 100), 1), ("sum_t", (60000, 600, 3), 1),
         ("sum_t", (8192, 3, 400), 1), ("mean_t", (2048, 2, 809), 1),
         ("min_t", (4451, 2, 673), 1), ("sum_t", (5501, 997, 1, 2), 1),
         ("max_t", (1492, 864, 1, 2), 1), ("min_t", (3251, 4, 1024, 2), 2),
         ("argmax_t", (6119, 2, 149), 1), ("argmax_t", (2, 9, 4, 1243), 1),
         ("sum_t", (61, 4, 37, 3), 2), ("min_t", (4, 17, 28, 67), 1),
         ("max_t", (4, 2, 457, 3557), 2), ("argmax_t", (479, 2, 4, 3259), 2),
         ("min_t", (4, 8192, 256, 2), 2), ("sum_t", (12, 11135, 344), 1),
         ("sum_t", (64, 4096, 64), 1), ("argmax_t", (64, 4096, 64), 1),
         ("max_t", (16, 8192, 1024), 1), ("sum_t", (512, 512, 8), 1)]
FAMILY = {"sum_t": "sum", "mean_t": "sum", "max_t": "max", "min_t": "min", "argmax_t": "pick"}
PEER = {"sum_t": "sum", "mean_t": "mean", "max_t": "amax", "min_t": "amin", "argmax_t": "argmax"}


def reference(op, host, axis):
    x = host.astype(np.float64)
    if op == "argmax_t":
        return np.argmax(host, axis=axis)
    return {"sum_t": np.sum, "mean_t": np.mean, "max_t": np.max, "min_t": np.min}[op](
        x, axis=axis)


def gen_rule(tree_cols):
    """``plan_cols`` sending layouts of more than one slab to ``plan_gen``."""
    from handlers.cuda import reductions as R

    def plan_cols(outer, n, inner, aligned, width, family, sms, sm_threads, div=1, kind=0,
                  suffix="", blocks_per_sm=None):
        if outer > 1:
            p = R.plan_gen((outer, n, inner), (1,), aligned, width, family, sms, sm_threads,
                           div, kind, suffix, blocks_per_sm)
            if p is not None:
                return p
        return tree_cols(outer, n, inner, aligned, width, family, sms, sm_threads, div, kind,
                         suffix, blocks_per_sm)
    return plan_cols


def main():
    from benchmarks.gpu import EventTimer, optional_peers
    from benchmarks.ops import copy_bandwidth, inputs_beyond_l2
    from handlers.cuda import reductions as R
    from handlers.cuda.handler import PyCudaHandler

    rules = {"tree": R.plan_cols, "gen": gen_rule(R.plan_cols)}
    torch = optional_peers().get("torch")
    rng = np.random.default_rng(0)
    h0 = PyCudaHandler(np.float32)
    copy = copy_bandwidth(h0, (128 << 20) // 4)
    print(f"middle axes through the general kernel: the tree's plans against gen; copy "
          f"{copy / 1e12:.3f} TB/s; us per call, median of {REPS} samples of {CALLS} calls, "
          f"inputs from DRAM; each plan's kernel and grid; t/x: torch's time over x's")
    print(f"{'op':9s} {'shape':20s} {'axis':6s} {'MB':>7s} {'torch':>7s} "
          + " ".join(f"{name:>22s}" for name in rules) + "  t/tree   t/gen  check")
    for op, shape, axis in CASES:
        host = rng.standard_normal(shape).astype(np.float32)
        k = inputs_beyond_l2(host.nbytes)
        ref = reference(op, host, axis)
        t_us = float("nan")
        if torch is not None:
            ts = [torch.from_numpy(host).cuda() for _ in range(k)]
            fn = getattr(torch, PEER[op])
            o = torch.empty(ref.shape, device="cuda",
                            dtype=torch.int64 if op == "argmax_t" else torch.float32)
            tt = EventTimer("torch", module=torch)
            t_us = statistics.median(
                tt.sample(lambda i: fn(ts[i % k], dim=axis, out=o), 0, CALLS)
                for _ in range(REPS)) * 1e3
        cells, times, checks = [], [], []
        for rule in rules.values():
            R.plan_cols = rule
            h = PyCudaHandler(np.float32)
            xs = [h.create_from_numpy(host) for _ in range(k)]
            out = h.allocate(ref.shape if ref.ndim else (1,))
            red = getattr(h, op)
            red(xs[0], axis, out)
            got = h.get_numpy_copy(out).astype(np.float64).reshape(ref.shape)
            err = float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
            checks.append(f"{err:.0e}")
            plan = R.plan(shape, R._axes(len(shape), axis), True, 4, FAMILY[op], h._sms,
                          h._sm_threads, blocks_per_sm=h._blocks_per_sm("TT"))
            timer = EventTimer("pycuda", h.stream)
            us = statistics.median(
                timer.sample(lambda i: red(xs[i % k], axis, out), 0, CALLS)
                for _ in range(REPS)) * 1e3
            name = plan.launch.kernel if plan else "-"
            cells.append(f"{us:8.2f} {name:>8s} {plan.launch.grid if plan else 0:5d}")
            times.append(us)
            h.close()
        R.plan_cols = rules["tree"]
        print(f"{op:9s} {str(shape):20s} {str(axis):6s} {host.nbytes / 1e6:7.2f} {t_us:7.2f} "
              + " ".join(f"{c:>22s}" for c in cells)
              + f"  {t_us / times[0]:6.3f}  {t_us / times[1]:6.3f}  {' '.join(checks)}")


if __name__ == "__main__":
    main()
