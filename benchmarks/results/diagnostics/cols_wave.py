"""Do column reductions over a long axis and a few hundred columns want
more chunks, or fewer?  The reductions suite's random set of 2026-11-28
(seed 580685406, at 25872a9) had one case below 0.95x torch: ``sum_t`` of
(100929, 233) over axis 0, 35.5 us against torch's 33.2 (66% of copy).
Its plan (``reductions.plan_cols``): rows not 16-byte aligned, so
``sum_cols`` with four scalar columns a thread, 59 thread columns in 2
tiles of 32, and ``_chunking`` splits the rows into 263 chunks of 384
(a wave of 4 blocks a multiprocessor: 526 blocks); the last block of each
tile then combines its 263 partial rows alone.

This times ours with ``_chunking``'s wave at 1, 2, 4 (the tree's rule: at
most half the blocks the threads allow, and the column kernels' 4 resident
blocks, on an H200) and 8 blocks a multiprocessor (two waves), over that
case, its neighbours (aligned, wider, narrower, longer), the tuned
column shapes and four ``sum_gen`` layouts, beside torch, every input
read from DRAM, each result checked against NumPy (float64 for sums).
Nothing in the library changes: the process swaps
``reductions._chunking``.

Run from the project root on a GPU machine with torch: ``python
benchmarks/results/diagnostics/cols_wave.py [--all]`` (waves of 2 and 4
beside the tree's rule; ``--all``: of 1, 2, 4 and 8); with ``--random SEED ...``,
the tree's rule beside waves of 4 and 2 over the random sets' cases (the
reductions suite's ``draw_cases``) whose plan a wave of 2 changes from one
of 4, at most 24.  (The log's first table, of 25872a9, names the waves
of 1, 2 and 8 ``cap1``, ``cap2`` and ``cap8``, its second ``cap2``; the
tree's rule there is the wave of 4.)
"""
import pathlib
import sys

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import variants  # noqa: E402  (this folder's, beside the script)

from handlers.cuda import reductions  # noqa: E402

#: the library's chunking, before any rule is swapped in for it
LIBRARY_CHUNKING = reductions._chunking

REPS, CALLS = 15, 10
CASES = [("sum_t", (100929, 233), 0), ("sum_t", (100929, 232), 0),
         ("max_t", (100929, 233), 0), ("argmax_t", (100929, 233), 0),
         ("sum_t", (200000, 117), 0), ("sum_t", (50000, 461), 0),
         ("sum_t", (25000, 999), 0), ("sum_t", (400000, 61), 0),
         ("sum_t", (17, 307, 2198), 1), ("mean_t", (5501, 282), 0),
         ("sum_t", (887, 1806), 0), ("sum_t", (42, 322763), 0),
         ("sum_t", (1048576, 16), 0), ("max_t", (8192, 4096), 0),
         # sum_gen (plan_gen), which _chunking chunks too
         ("sum_t", (7, 300, 5, 400), (1, 3)), ("sum_t", (300, 20, 400, 7), (0, 2)),
         ("sum_t", (2000, 6, 300, 5), (0, 2)), ("mean_t", (40, 500, 3, 900), (1, 3))]


def capped(cap):
    """The library's ``_chunking`` with a wave of ``cap`` blocks a
    multiprocessor, past the kernel's resident blocks too (8 is two waves
    on an H200), whatever the library's own wave (at 25872a9: at most half
    the blocks the threads allow and at most those resident, 4 on an H200):
    ``cap`` as the kernel's resident blocks, and threads enough that their
    share never binds first."""
    def rule(base, n, ty, trip, sms, sm_threads, per_sm, deep=True):
        return LIBRARY_CHUNKING(base, n, ty, trip, sms, 64 * cap * reductions.BLOCK, cap, deep)
    return rule


def changed_cases(seeds, most=24):
    """The reductions suite's random cases (``draw_cases`` of ``seeds``)
    whose plan a wave of 2 blocks a multiprocessor changes from a wave of 4
    (132 multiprocessors, 4 resident blocks assumed), at most ``most``."""
    found = [(op, shape, axis) for op, shape, axis, _, (four, two)
             in variants.random_plans(seeds, (capped(4), capped(2))) if four != two]
    return found[:most]


def main():
    tree = LIBRARY_CHUNKING
    use = variants.swapper(reductions, "_chunking")
    rules = {"tree": use(tree)}
    if "--random" in sys.argv[1:]:   # --random SEED [SEED ...]
        seeds = [int(a) for a in sys.argv[sys.argv.index("--random") + 1:]]
        for wave in (4, 2):
            rules[f"wave{wave}"] = use(capped(wave))
        variants.compare_rules(f"random-set cases (seeds {seeds}) whose plan a wave of 2 "
                               "changes from one of 4; the tree's rule beside both",
                               changed_cases(seeds), rules, use(tree), REPS, CALLS)
        return
    waves = (1, 2, 4, 8) if "--all" in sys.argv[1:] else (2, 4)
    for wave in waves:
        rules[f"wave{wave}"] = use(capped(wave))
    variants.compare_rules(f"column reductions, _chunking's wave at {waves} blocks a "
                           "multiprocessor beside the tree's rule", CASES, rules,
                           use(tree), REPS, CALLS)


if __name__ == "__main__":
    main()
