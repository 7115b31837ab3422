"""LayerNorm's backward: which part of the generated row kernel costs the
gap to a standalone kernel of its structure?

``summed_rows_pipeline`` (H200, 2026-11-28) timed a standalone float32
kernel of LayerNorm's backward, one row a block's trip with an L2 prefetch
of the next (the library's structure), at 122.9 us over 8192x4096, where
the library's program took 167.8 (and 156-159 since its row kernels hold
the gain beside the elements, 55c5ca8).  The two differ in how they
compute, not in what they load: the generated kernel rounds every product
on its own (``fx::mul``: no fused multiply-add, as NumPy rounds), pins each
reduction's terms (``s.keep``) so that the outputs' pass reuses them,
folds a term only on the row's own slots (``ok ? ... : ...``), divides
each mean by ``cols`` (two IEEE divisions a row), and asks the L2 for the
next row.

This times the layer's program (``layers.layernorm._BACKWARD``) with its
generated source changed one way at a time, each variant in a process of
its own (kernels are built once a process), every result checked against
float64 NumPy, beside the tree's source, and prints each variant's block
kernel's registers and spills (nvcc, sm_90):

* ``fma``: products as plain ``*`` (the compiler may contract them into
  multiply-adds, as the standalone kernel's were);
* ``nokeep``: terms not pinned;
* ``unmasked``: every slot folded (exact here: a slot past the row holds
  zeros, whose terms are zero);
* ``noprefetch``: no L2 prefetch of the next row;
* ``nodiv``: each mean as its sum times 1/cols (rounded differently from
  NumPy's sum / n where cols is no power of two);
* ``exact``: ``nokeep`` and ``unmasked``, the two that keep the results
  bit for bit;
* ``lean``: ``fma``, ``nokeep``, ``unmasked`` and ``nodiv`` (the prefetch
  kept), as near the standalone kernel's arithmetic as the source goes;
* ``held8``: 8 elements a thread (``fused_source.held_elements`` forced;
  blocks of 512 over 4096 columns), on the planner's grid;
* ``held8res``: 8 elements a thread on a grid of every resident block
  (``fused_source.SUM_SPREAD`` forced near 0): at 64 registers (nvcc 13)
  two blocks of 512 share a multiprocessor, two rows in flight where the
  tree has one (``held_counts`` forced 8 on the planner's grid, whose
  square-root rule gave one block a multiprocessor: 191 us);
* ``held8res_exact``: ``held8res`` with ``exact``'s changes.

The log beside this script is its run of ``DEFAULT`` at 5975c92
(2026-11-28); the diagnostics README has the first version's figures too.

Run on the GPU machine from the project root::

    python benchmarks/results/diagnostics/summed_rows_variants.py [--all]

(``--all``: every variant above; else ``DEFAULT``'s.)
"""
import pathlib
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import variants  # noqa: E402  (this folder's, beside the script)

REPS, CALLS = 10, 10
SHAPES = [(8192, 4096), (32768, 1000), (4096, 4096)]
EPS = 1e-5
#: variant -> the changes it makes (``variants.CHANGES``, or ``KNOBS``)
VARIANTS = {"tree": [], "fma": ["fma"], "nokeep": ["nokeep"], "unmasked": ["unmasked"],
            "noprefetch": ["noprefetch"], "nodiv": ["nodiv"],
            "exact": ["nokeep", "unmasked"], "lean": ["fma", "nokeep", "unmasked", "nodiv"],
            "held8": ["held8"], "held8res": ["held8", "resident"],
            "held8res_exact": ["held8", "resident", "nokeep", "unmasked"]}
#: the variants run without ``--all`` (the single changes of the first run's
#: log are left out: measured)
DEFAULT = ["tree", "nodiv", "exact", "lean", "held8", "held8res", "held8res_exact"]
#: the changes made to the planner, not to the source
KNOBS = ("held8", "resident")
def _knobs(variant):
    """Set ``variant``'s planner changes (``KNOBS``) in ``fused_source``;
    returns a function that restores the tree's."""
    from handlers.cuda import fused_source
    from layers.layernorm import _BACKWARD
    held, spread = fused_source.held_elements, fused_source.SUM_SPREAD
    if "held8" in VARIANTS[variant]:
        fused_source.held_elements = lambda op, dtype: 8 if op is _BACKWARD else held(op, dtype)
    if "resident" in VARIANTS[variant]:
        fused_source.SUM_SPREAD = 1e-12
        fused_source.plan_rows.cache_clear()

    def restore():
        fused_source.held_elements, fused_source.SUM_SPREAD = held, spread
        fused_source.plan_rows.cache_clear()
    return restore


def _patch(variant):
    from layers.layernorm import _BACKWARD
    _knobs(variant)
    variants.patch_sources((_BACKWARD,), VARIANTS[variant])


def registers(variant):
    """The registers of ``variant``'s float32 block kernel (``variants.block_registers``)."""
    from layers.layernorm import _BACKWARD
    restore = _knobs(variant)
    try:
        return variants.block_registers(_BACKWARD, VARIANTS[variant])
    finally:
        restore()


def _cases(h, rng, n, c):
    """[(name, call(i), check())] of LayerNorm's backward over (n, c)."""
    from layers.layernorm import _BACKWARD
    x = rng.standard_normal((n, c))
    gain = 1 + 0.1 * rng.standard_normal((1, c))
    dy = rng.standard_normal((n, c))
    x32, g32, dy32 = (a.astype(np.float32) for a in (x, gain, dy))
    t = variants.layer_norm_backward_case(h, dy32, x32, g32, EPS)
    return [("LayerNorm backward",
             lambda i: _BACKWARD(h, t.dys[i % t.k], *t.args, *t.outs), t.check)]


def run_variant(variant):
    """Time every case with ``variant``'s source; one JSON line."""
    if variant != "tree":
        _patch(variant)
    variants.time_cases("summed_rows_variants", _cases, SHAPES, 7, REPS, CALLS)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--run":
        return run_variant(sys.argv[2])
    run = list(VARIANTS) if "--all" in sys.argv[1:] else DEFAULT
    regs = {v: registers(v) for v in run}
    results = variants.collect(__file__, [(v, v) for v in run])
    print(f"LayerNorm's backward, float32, its generated source changed one way at a time; "
          f"us per call (median of {REPS} samples of {CALLS} calls, inputs from DRAM); "
          f"check: max |error| / max |reference| against float64")
    for v in run:
        print(f"  {v:14s} block kernel: {regs[v]}")
    if not results:
        return
    variants.print_results(results, list(results))

if __name__ == "__main__":
    main()
