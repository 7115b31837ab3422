"""Should a slab that fills a short tile alone go to the column kernel?
The reductions suite's random set of seed 2124786021 (2026-11-28, at
e6045f9) had one case below 0.95x torch: ``mean_t`` of (2048, 2, 809) over
axis 1, 20.1 us against torch's 16.2 (12.6 MB, 24% of copy).  Its slabs
(n * inner = 1618 elements) go to ``*_short`` (``plan_cols``: n * inner <=
SHORT_TILE = 2048), where a tile then holds one slab: each block loads
6.5 KB, waits for it at a barrier, reduces it and waits again, four such
blocks a multiprocessor, so little is in flight.  ``*_short`` is meant
for tiles of many slabs; ``*_cols`` keeps a thread's loads of several
columns in flight and its blocks retire and refill independently.

This times each case with the tree's threshold (slabs of up to 2048
elements to ``*_short``) and with ``two`` (up to 1024: a tile holds at
least two slabs) and ``four`` (up to 512), setting ``reductions.SHORT_TILE``
in the process (the kernel's own tile is unchanged: the Python constant
only chooses the plan and sizes its grid, and the kernel strides over
whatever tiles it finds), a fresh handler each (plans are cached per
handler), beside torch, inputs read from DRAM (``inputs_beyond_l2``); us
per call, torch's time over ours, each result checked against NumPy
(float64; exact for the extremes and argmax).

Run from the project root on a GPU machine with torch: ``python
benchmarks/results/diagnostics/short_slabs.py``; ``--scan`` (no GPU)
counts the random sets' cases (seeds 0-59) each threshold moves.
"""
import pathlib
import sys

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import variants  # noqa: E402  (this folder's, beside the script)

REPS, CALLS = 15, 10
#: tile thresholds: the most elements of a slab that goes to ``*_short``
RULES = {"tree": 2048, "two": 1024, "four": 512}
#: (op, shape, axis): the slow case, slabs of one, two and four to a tile
#: in each family, small inputs where latency rules, and random-set cases
#: (seeds 0-59) that ``two`` moves
CASES = [("mean_t", (2048, 2, 809), 1), ("sum_t", (2048, 2, 809), 1),
         ("sum_t", (20000, 40, 30), 1), ("max_t", (20000, 40, 30), 1),
         ("argmax_t", (20000, 40, 30), 1), ("sum_t", (8192, 3, 400), 1),
         ("sum_t", (40000, 10, 70), 1), ("argmax_t", (40000, 10, 70), 1),
         ("sum_t", (100000, 5, 100), 1), ("min_t", (100000, 5, 100), 1),
         ("sum_t", (60000, 600, 3), 1), ("max_t", (30, 50), 0),
         ("sum_t", (300, 1700, 1), 0), ("mean_t", (64, 7, 7, 200), (1, 2)),
         ("min_t", (4451, 2, 673), 1), ("sum_t", (5501, 997, 1, 2), 1),
         ("max_t", (1492, 864, 1, 2), 1), ("min_t", (3251, 4, 1024, 2), 2)]


def scan(seeds=range(60)):
    """Print how many of the random sets' plans each rule moves off
    ``*_short`` (132 multiprocessors, 4 blocks each assumed)."""
    from benchmarks.reductions import RANDOM_BYTES, draw_cases
    from handlers.cuda import reductions as R
    moved = {name: [] for name in RULES}
    total = 0
    for seed in seeds:
        for c in draw_cases(seed, 48, RANDOM_BYTES):
            shape, axis = tuple(c["shape"]), c["axis"]
            axes = R._axes(len(shape), tuple(axis) if isinstance(axis, list) else axis)
            total += 1
            kernels = {}
            for name, tile in RULES.items():
                R.SHORT_TILE = tile
                p = R.plan(shape, axes, True, 4, variants.REDUCTION_FAMILY[c["op"]], 132, 2048,
                           blocks_per_sm=lambda kernel, block: 4)
                kernels[name] = p.launch.kernel if p else None
            for name in RULES:
                if kernels[name] != kernels["tree"]:
                    moved[name].append((c["op"], shape, axes, kernels["tree"], kernels[name]))
    R.SHORT_TILE = RULES["tree"]
    for name, cases in moved.items():
        print(f"{name}: {len(cases)} of {total} plans move; first: {cases[:8]}")


def main():
    if "--scan" in sys.argv[1:]:
        return scan()
    from handlers.cuda import reductions as R

    def tile(n):
        def apply():
            R.SHORT_TILE = n
        return apply
    variants.compare_rules("slabs of a short tile: the tree's threshold against two and four "
                           "slabs a tile", CASES, {name: tile(n) for name, n in RULES.items()},
                           tile(RULES["tree"]), REPS, CALLS)


if __name__ == "__main__":
    main()
