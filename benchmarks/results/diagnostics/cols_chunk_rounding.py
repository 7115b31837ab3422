"""Do column reductions of a long axis over few columns lose their chunks
to rounding?  The reductions suite's random sets of 2026-11-28 each had one
case below 0.95x torch, both an ``argmax_t`` over axis 0 with few columns:
(22229, 13) at 0.86x and (1173013, 4, 1) at 0.63x (40.0 us against 25.0,
17.9 MB: 12% of copy).  ``_chunking`` (reductions.py) splits the rows of
too few tiles into up to a wave of chunks, then rounds each chunk *up* to
whole trips of the block (ty * trip rows), which can halve the chunks:
(22229, 13) asks for 86 chunks of 259 rows, rounds them to 512 and runs 44
blocks on 132 multiprocessors; (1173013, 4) 286 chunks of 4102 rows, to
8192, 144 blocks.

``fit`` keeps whole trips but takes the fewest trips a chunk that keep the
chunks within the wave: chunk = ceil(n / (cap * ty * trip)) * ty * trip,
cap = ceil(target / tiles) (87 and 287 blocks for the two above).  Over
the random sets of seeds 0-59 (2880 cases, ``--scan``), 187 plans change,
nearly all to about twice the blocks.

This times ours on the tree's rule and on ``fit`` (a fresh handler each:
plans are cached per handler) beside torch, every input read from DRAM
(inputs cycled, ``inputs_beyond_l2``): us per call, fraction of copy,
torch's time over ours; each result checked against NumPy (float64 for
sums, exact for the extremes and argmax).  Nothing in the library changes:
the process swaps ``reductions._chunking``.

Run from the project root: ``python
benchmarks/results/diagnostics/cols_chunk_rounding.py`` on a GPU machine
with torch; ``--scan`` (no GPU) lists the random sets' changed plans.
"""
import pathlib
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import variants  # noqa: E402  (this folder's, beside the script)

REPS, CALLS = 15, 10
#: (op, shape, axis): the two slow cases, random-set cases whose plan
#: ``fit`` changes (``--scan``, seeds 0-59), the pinned plan it moves
#: (tests/test_reduction_plans.py), and tuned shapes it leaves alone
CASES = [("argmax_t", (1173013, 4, 1), 0), ("argmax_t", (22229, 13), 0),
         ("max_t", (1173013, 4, 1), 0), ("sum_t", (22229, 13), 0),
         ("argmax_t", (3433, 149, 2), 0), ("argmax_t", (2998, 173), 0),
         ("argmax_t", (245281, 3), 0), ("argmax_t", (106087, 2, 2, 3), 0),
         ("argmax_t", (28388, 2), 0), ("mean_t", (397027, 3), 0),
         ("mean_t", (5501, 282), 0), ("mean_t", (48912, 2, 4), (0, 1)),
         ("max_t", (3, 439, 293), 1), ("min_t", (29, 6726, 7), 1),
         ("sum_t", (887, 1806), 0), ("sum_t", (127, 1, 4, 4049), (0, 1, 2)),
         ("mean_t", (593, 4, 11, 11), (0, 2)),
         ("max_t", (54728, 4), 0), ("min_t", (4691, 47), 0),
         ("sum_t", (1048576, 16), 0), ("max_t", (8192, 4096), 0),
         ("sum_t", (42, 322763), 0)]


def fit(base, n, ty, trip, sms, sm_threads, per_sm, deep=True):
    """``_chunking`` with the fewest whole trips a chunk that keep the
    chunks within the wave (the tree's rounds each chunk up instead)."""
    from handlers.cuda import reductions as R
    target = sms * min(per_sm, sm_threads // R.BLOCK // 2)
    if base >= target or not deep:
        return n, 1
    step = ty * trip
    chunk = -(-n // (-(-target // base) * step)) * step
    return chunk, -(-n // chunk)


def scan(seeds=range(60)):
    """Print how many of the random sets' plans ``fit`` changes (4 blocks
    a multiprocessor assumed, 132 multiprocessors) and the first 30."""
    from handlers.cuda import reductions as R
    changed, total = {}, 0
    for op, shape, _, axes, (tree, fitted) in variants.random_plans(seeds, (R._chunking, fit)):
        total += 1
        if tree != fitted:
            changed[(op, shape, axes)] = (tree.launch.kernel, tree.launch.grid, fitted.launch.grid)
    print(f"{total} cases, {len(changed)} plans change (kernel, tree's grid, fit's grid):")
    for case, grids in list(changed.items())[:30]:
        print(" ", case, grids)


def main():
    if "--scan" in sys.argv[1:]:
        return scan()
    from benchmarks.gpu import optional_peers
    from benchmarks.ops import copy_bandwidth, inputs_beyond_l2
    from handlers.cuda import reductions as R
    from handlers.cuda.handler import PyCudaHandler

    tree = R._chunking
    torch = optional_peers().get("torch")
    rng = np.random.default_rng(0)
    h0 = PyCudaHandler(np.float32)
    copy = copy_bandwidth(h0, (128 << 20) // 4)
    print(f"column reductions, the tree's chunking against fit's: copy {copy / 1e12:.3f} "
          f"TB/s; us per call, median of {REPS} samples of {CALLS} calls, inputs from DRAM")
    print(f"{'op':9s} {'shape':20s} {'axis':10s} {'MB':>6s} {'torch':>8s} "
          f"{'tree':>8s} {'grid':>5s} {'fit':>8s} {'grid':>5s} {'copy':>6s} "
          f"{'t/tree':>6s} {'t/fit':>6s}  check")
    for op, shape, axis in CASES:
        host = rng.standard_normal(shape).astype(np.float32)
        k = inputs_beyond_l2(host.nbytes)
        ref = variants.reduction_reference(op, host, axis)
        t_us = variants.torch_reduction_us(torch, op, host, axis, ref, k, REPS, CALLS)
        cells, checks = [], []
        for rule in (tree, fit):
            R._chunking = rule
            us, err, plan = variants.ours_reduction(op, host, axis, ref, k, REPS, CALLS)
            checks.append(f"{err:.0e}")
            cells.append((us, plan.launch.grid if plan else 0))
        R._chunking = tree
        (tu, tg), (fu, fg) = cells
        print(f"{op:9s} {str(shape):20s} {str(axis):10s} {host.nbytes / 1e6:6.2f} {t_us:8.2f} "
              f"{tu:8.2f} {tg:5d} {fu:8.2f} {fg:5d} {host.nbytes / (fu * 1e-6) / copy:6.1%} "
              f"{t_us / tu:6.3f} {t_us / fu:6.3f}  {' '.join(checks)}")

if __name__ == "__main__":
    main()
