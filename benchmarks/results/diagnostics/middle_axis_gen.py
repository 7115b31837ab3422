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

This times each case with the tree's plan, with ``gen``, which sends
every ``cols`` layout of more than one slab (outer > 1) to ``plan_gen``
where it accepts, and with ``narrow``, which sends only those of fewer
than 32 thread columns (a warp of the column kernel cannot span them),
swapping ``reductions.plan_cols`` in the process (a fresh handler each:
plans are cached per handler), beside torch, inputs read from DRAM; us
per call, the plan's kernel and grid, torch's time over each, each result
checked against NumPy (float64 for sums, exact for the extremes and
argmax).  ``plan_gen`` takes max, min and argmax only with
``gen_families.patch`` applied (the kernels ``max_gen*``, ``min_gen*``,
``pick_gen*``); without it their columns repeat the tree's plan.
The general kernel has more arguments than the one-call path takes, so
its calls go through Python: the times include that host cost.

Run on a GPU machine with torch from the root of a snapshot with the
patch applied (``git apply
benchmarks/results/diagnostics/gen_families.patch``): ``python
benchmarks/results/diagnostics/middle_axis_gen.py``; ``--scan`` (no GPU;
the patch applied, or the non-sums stay on the tree's plans) counts the
random sets' plans each rule moves.
"""
import pathlib
import sys

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import variants  # noqa: E402  (this folder's, beside the script)

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
         ("max_t", (16, 8192, 1024), 1), ("sum_t", (512, 512, 8), 1),
         # the random sets' misses in the runs of 2becae8 and 2133c52
         ("min_t", (8192, 909, 2), 1), ("sum_t", (19054, 3, 3, 41), 2)]


def gen_rule(tree_cols, narrow=False):
    """``plan_cols`` sending layouts of more than one slab to ``plan_gen``;
    with ``narrow`` only those whose columns are fewer than a warp's lanes
    in the column kernel (fewer than 32 thread columns: packets, or
    ``scalar_cols`` columns a thread)."""
    from handlers.cuda import reductions as R

    def plan_cols(outer, n, inner, aligned, width, family, sms, sm_threads, div=1, kind=0,
                  suffix="", blocks_per_sm=None):
        vec = aligned and inner % width == 0
        per = width if vec else R.scalar_cols(width)
        if outer > 1 and (not narrow or -(-inner // per) < 32):
            p = R.plan_gen((outer, n, inner), (1,), aligned, width, family, sms, sm_threads,
                           div, kind, suffix, blocks_per_sm)
            if p is not None:
                return p
        return tree_cols(outer, n, inner, aligned, width, family, sms, sm_threads, div, kind,
                         suffix, blocks_per_sm)
    return plan_cols


def main():
    from handlers.cuda import reductions as R
    if "--scan" in sys.argv[1:]:
        return scan()
    tree = R.plan_cols
    use = variants.swapper(R, "plan_cols")
    variants.compare_rules("middle axes through the general kernel: the tree's plans against "
                           "gen and narrow", CASES,
                           {"tree": use(tree), "gen": use(gen_rule(tree)),
                            "narrow": use(gen_rule(tree, narrow=True))}, use(tree), REPS, CALLS)


def scan(seeds=range(60)):
    """Print how many of the random sets' plans (seeds 0-59; 132
    multiprocessors, 4 blocks each assumed) ``gen`` and ``narrow`` move, by
    the kernel they leave and take."""
    from benchmarks.reductions import RANDOM_BYTES, draw_cases
    from handlers.cuda import reductions as R
    tree = R.plan_cols
    rules = {"gen": gen_rule(tree), "narrow": gen_rule(tree, narrow=True)}
    moved = {name: {} for name in rules}
    total = 0
    for seed in seeds:
        for c in draw_cases(seed, 48, RANDOM_BYTES):
            shape, axis = tuple(c["shape"]), c["axis"]
            axes = R._axes(len(shape), tuple(axis) if isinstance(axis, list) else axis)
            family = variants.REDUCTION_FAMILY[c["op"]]
            total += 1
            kernels = {}
            for name, rule in (("tree", tree), *rules.items()):
                R.plan_cols = rule
                p = R.plan(shape, axes, True, 4, family, 132, 2048,
                           blocks_per_sm=lambda kernel, block: 4)
                kernels[name] = p.launch.kernel.split("_")[1] if p else None
            R.plan_cols = tree
            for name in rules:
                if kernels[name] != kernels["tree"]:
                    key = f"{kernels['tree']} -> {kernels[name]}"
                    moved[name][key] = moved[name].get(key, 0) + 1
    for name, kinds in moved.items():
        print(f"{name}: {sum(kinds.values())} of {total} plans move: {kinds}")


if __name__ == "__main__":
    main()
