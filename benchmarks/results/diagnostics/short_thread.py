"""Small slabs whose reduced axis is short: a thread an output, or tiles?

The random set of seed 760760110 (2026-11-28) missed on ``sum_t`` of
(19054, 3, 3, 41) over axis 2 (28 us against torch's 20): an (outer, n,
inner) view of small slabs (n * inner at most ``SHORT_TILE``) went to
``*_short``, which copies a tile of whole slabs into shared memory, waits
at a barrier, then reduces each output, one tile after another.  Where the
reduced axis is as short as the rows ``*_thread`` takes (n at most
``THREAD_ROW``), a thread per output that reads its n elements ``inner``
apart needs no tile and no barrier: a warp's load reads 32 adjacent
outputs' elements (adjacent columns are adjacent elements), and every load
of its outputs is in flight before any is added.

``short_stride.patch`` (beside this script) sends those columns to
``*_stride``, a thread per output reading its n elements ``inner`` apart;
rows keep ``*_thread``.  This times each case under the tree's plan
(``tree``) and with every small slab sent to ``*_short`` (``tiles``,
swapping ``reductions._plan_short`` in the process), beside torch, inputs
read from DRAM, each result checked against NumPy (float64 sums, exact
extremes and argmax).  Without the patch both rules are main's.  Rows
(inner 1) run ``*_thread`` under both: their times compare the kernel of
two trees when the script runs in both (``.ci/gpu-ab``).

Run on a GPU machine with torch from the root of a tree with the patch
applied (``git apply benchmarks/results/diagnostics/short_stride.patch``),
and of main for the rows: ``python
benchmarks/results/diagnostics/short_thread.py``.  The first call of a
fresh machine compiles the kernels (minutes); warm it first.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import variants  # noqa: E402  (this folder's, beside the script)

REPS, CALLS = 15, 10
#: (op, shape, axis): small slabs of a short reduced axis (the random sets'
#: cases and misses among them), then rows of up to THREAD_ROW elements
CASES = [("sum_t", (19054, 3, 3, 41), 2), ("mean_t", (2048, 2, 809), 1),
         ("argmax_t", (13, 8069, 4, 4), 2), ("argmax_t", (1515808, 2, 2), 1),
         ("max_t", (81, 16960, 3, 5), 2), ("sum_t", (8192, 3, 400), 1),
         ("min_t", (100000, 5, 100), 1), ("argmax_t", (6119, 2, 149), 1),
         ("min_t", (4451, 2, 673), 1), ("sum_t", (40000, 8, 60), 1),
         ("mean_t", (100000, 7, 250), 1), ("sum_t", (3000000, 2, 3), 1),
         ("max_t", (500, 6, 300), 1),
         ("sum_t", (400, 70348, 2), 2), ("argmax_t", (1048576, 8), 1),
         ("max_t", (10000000, 3), 1), ("mean_t", (81, 1, 16960, 3), 3)]


def tiles(outer, n, inner, family, sms, sm_threads, div, kind, suffix, blocks_per_sm):
    """Every small slab on ``*_short`` (the plan before a short reduced axis
    took ``*_thread``)."""
    from handlers.cuda import reductions as R
    kernel = f"{family}_short{suffix}"
    count = -(-outer // (R.SHORT_TILE // (n * inner)))
    grid = max(1, min(count, sms * R._per_sm(blocks_per_sm, kernel, R.BLOCK, sm_threads)))
    return R.Plan(R.Launch(kernel, grid, (outer, n, inner, 1, div, kind), R.BLOCK), 0, 0)


def main():
    from handlers.cuda import reductions as R
    tree = R._plan_short
    use = variants.swapper(R, "_plan_short")
    variants.compare_rules("small slabs of a short reduced axis: the tree's plans against "
                           "tiles", CASES, {"tree": use(tree), "tiles": use(tiles)},
                           use(tree), REPS, CALLS)


if __name__ == "__main__":
    main()
