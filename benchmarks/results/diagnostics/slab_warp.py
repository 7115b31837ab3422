"""Small slabs of few columns: a warp a slab (``*_slab``), or tiles?

Slabs of an (outer, n, inner) view with n * inner at most ``SHORT_TILE``
and n > ``THREAD_ROW`` went to ``*_short``, which copies a tile of whole
slabs to shared memory, waits at a barrier, then gives each output a few
lanes.  Where a slab fills most of a tile, that tile holds one slab, whose
`inner` outputs leave most of the block's lanes idle: the random set of
seed 1402595870 (2026-11-28, H200) missed on ``argmax_t`` of (4774, 709,
2) over axis 1 (37.4 us against torch's 28.0), and ``sum_t`` of (20000,
40, 30) over axis 1 took 123 us against torch's 31 (``short_slabs``).

``*_slab`` gives each slab of at most ``SLAB_COLS`` columns a warp, which
reads the slab as one contiguous run, lane l taking column l % inner
(reduce.cu's slab_impl), and joins the lanes of each column by shuffles.
The tree's rule (``reductions._plan_short``) takes it for slabs of
``SLAB_LEAST`` elements or more, a first guess: smaller slabs give a
warp's lanes fewer loads than a tile's threads.  This times each case
under three rules, beside torch, inputs read from DRAM, each result checked
against NumPy (float64 sums, exact extremes and argmax):

* ``tree``: the tree's plans;
* ``tiles``: every slab of n > THREAD_ROW on ``*_short`` (the rule before
  ``*_slab``);
* ``warps``: every slab of at most SLAB_COLS columns and n > THREAD_ROW on
  ``*_slab``, whatever its size,

so that the sizes around SLAB_LEAST say where the bound belongs.  In a
tree with ``walk.patch`` (``*_walk``: a thread an output walking its
column in trips of THREAD_ROW, the bounds ``WALK_MOST`` and
``WALK_COLS``), a fourth rule:

* ``walks``: every slab of n > THREAD_ROW on ``*_walk``.

2026-11-28 (``slab_warp-NVIDIA-H200.log``, before ``*_walk``): warps won
from 120 elements a slab up, tiles at 24; the tree's bound is now 96.  Both
lost to torch on slabs of 2-5 columns over very many outer indices
((1000000, 12, 2), (200000, 40, 3), (100000, 25, 5)): the walk's cases.
2026-11-28, ninth session (``slab_walk-NVIDIA-H200.log``, main at dfc0d4e
with ``walk.patch`` before its bounds, which sent no slab to a walk): on
slabs of 2-8 columns the walks won at every axis of 9-60 elements (sum_t
(1000000, 12, 2): 34.7 us against the tree's 72.8 and torch's 37.5) and
lost at every axis of 90 or more; on 16-30 columns they lost by 4-7%.
The bounds WALK_MOST 64 and WALK_COLS 8 come from it.

Run on a GPU machine with torch, from the root of a tree that has
``*_slab``: ``python benchmarks/results/diagnostics/slab_warp.py``.  The
first call of a fresh machine compiles the kernels (minutes): warm it
first (``bash .ci/gpu-warm``).
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import variants  # noqa: E402  (this folder's, beside the script)

REPS, CALLS = 15, 10
#: (op, shape, axis): the misses and slow layouts first, then slabs of 16,
#: 3 and 5 columns from below SLAB_LEAST (256) to a whole tile (2048)
CASES = [("argmax_t", (4774, 709, 2), 1), ("sum_t", (20000, 40, 30), 1),
         ("max_t", (5501, 997, 1, 2), 1), ("sum_t", (1492, 864, 1, 2), 1),
         ("mean_t", (2000, 60, 17), 1), ("sum_t", (1000000, 12, 2), 1),
         ("sum_t", (100000, 12, 16), 1), ("sum_t", (100000, 16, 16), 1),
         ("sum_t", (50000, 32, 16), 1), ("sum_t", (30000, 64, 16), 1),
         ("sum_t", (15000, 128, 16), 1), ("sum_t", (200000, 40, 3), 1),
         ("sum_t", (100000, 90, 3), 1), ("sum_t", (40000, 600, 3), 1),
         ("argmax_t", (100000, 25, 5), 1), ("argmax_t", (60000, 60, 5), 1),
         ("min_t", (20000, 400, 5), 1), ("sum_t", (2000000, 9, 2), 1),
         ("sum_t", (300000, 16, 4), 1), ("max_t", (100000, 30, 8), 1)]


def _rules():
    """({name: apply()}, restore()): each rule is the tree's own
    ``_plan_short`` under other bounds (``reductions.SLAB_COLS``,
    ``SLAB_LEAST``, and in a tree with ``*_walk`` ``WALK_MOST`` and
    ``WALK_COLS``, read at each plan): ``tiles`` takes no slab to a warp or
    a walk, ``warps`` every slab of few columns to a warp whatever its size,
    ``walks`` every slab to ``*_walk``."""
    from handlers.cuda import reductions as R
    from handlers.cuda.launch import THREAD_ROW
    cols, least = R.SLAB_COLS, R.SLAB_LEAST
    walk = (R.WALK_MOST, R.WALK_COLS) if hasattr(R, "WALK_MOST") else None

    def bounds(c, n, w=walk):
        def apply():
            R.SLAB_COLS, R.SLAB_LEAST = c, n
            if walk is not None:
                R.WALK_MOST, R.WALK_COLS = w
        return apply
    no_walk = (THREAD_ROW, 0)
    rules = {"tree": bounds(cols, least), "tiles": bounds(0, least, no_walk),
             "warps": bounds(cols, 0, no_walk)}
    if walk is not None:
        rules["walks"] = bounds(cols, least, (R.SHORT_TILE, R.SHORT_TILE))
    return rules, bounds(cols, least)


def main():
    rules, restore = _rules()
    variants.compare_rules("small slabs of few columns: a warp a slab against tiles", CASES,
                           rules, restore, REPS, CALLS)


if __name__ == "__main__":
    main()
