"""The fused row programs where a block's slots all fall in the row: what
do the slot test and the pinned terms cost?

A block row's thread holds R elements of the row (16 for softmax, the
cross-entropy and LayerNorm's forward in float32) and folds each
reduction's term only where its slot is in the row (``ok ? op(rd, k) :
rd``); each term is pinned (``s.keep``) so that the outputs' pass reuses
it.  nvcc 13 (sm_90) gives their block kernels 58, 59 and 51 registers, so
4 blocks of 256 threads share a multiprocessor (registers go to a warp 256
at a time); without the slot test 46, 47 and 34 (5, 5 and 6 blocks).
Where the block's slots are all in the row (cols = block * R: 4096, 2048
and 1024 columns here), folding every slot gives the same bits.
``summed_rows_variants`` found the same two changes worth 4-6 us each on
LayerNorm's backward.

This times softmax, the cross-entropy with its gradient, LayerNorm's
forward and backward (``register_caps.row_cases``) over such shapes, with
their generated sources changed (``variants.CHANGES``): ``unmasked``,
``nokeep``, and both (``exact``), each variant in a process of its own,
each result checked against float64 NumPy, and prints each program's
block kernel's registers per variant.  Run on the GPU machine from the
project root::

    python benchmarks/results/diagnostics/full_rows_variants.py
"""
import pathlib
import sys

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import register_caps  # noqa: E402  (this folder's, beside the script)
import variants  # noqa: E402

REPS, CALLS = 10, 10
SHAPES = [(8192, 4096), (16384, 2048), (32768, 1024)]
VARIANTS = {"tree": [], "unmasked": ["unmasked"], "nokeep": ["nokeep"],
            "exact": ["unmasked", "nokeep"]}


def _ops():
    from handlers.fused_rows import SOFTMAX
    from layers.layernorm import _BACKWARD, _FORWARD
    from layers.losses import _CROSS_ENTROPY
    return {"softmax": SOFTMAX, "cross-entropy": _CROSS_ENTROPY[("labels", True)],
            "LayerNorm forward": _FORWARD, "LayerNorm backward": _BACKWARD}


def run_variant(variant):
    """Time every case with ``variant``'s sources; one JSON line."""
    variants.patch_sources(tuple(_ops().values()), VARIANTS[variant])
    variants.time_cases("full_rows_variants", register_caps.row_cases, SHAPES, 5, REPS, CALLS)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--run":
        return run_variant(sys.argv[2])
    print(f"fused row programs on rows a block holds whole, their sources changed; us per "
          f"call (median of {REPS} samples of {CALLS} calls, inputs from DRAM); check: max "
          f"|error| / max |reference| against float64")
    for name, op in _ops().items():
        print(f"  {name:20s} block kernel: " + "; ".join(
            f"{v} {variants.block_registers(op, changes)}" for v, changes in VARIANTS.items()))
    results = variants.collect(__file__, [(v, v) for v in VARIANTS])
    if results:
        variants.print_results(results, list(results))


if __name__ == "__main__":
    main()
