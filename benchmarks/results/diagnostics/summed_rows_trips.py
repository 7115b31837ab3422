"""Rows a trip in the summed row kernels: with ``rows_a_trip.patch``
applied, how many rows should a block's trip take, in which kernel, and
should it hold its ``:row`` inputs?

The patch gives the full rows' kernel (cols = block * held) of an op with
summed outputs two rows a trip (``fused_source.trip_rows``) and leaves the
kernel that tests each slot at one: there, two rows a trip spilled 88
bytes (nvcc 13, sm_90) for LayerNorm's backward in float32.  Not holding
the gain beside the elements (read where used, from cache) keeps that
kernel at 64 registers with no spill at two rows a trip, but the held gain
saved 5-8% at one row (``held_counts_row_inputs``).  Only a GPU can weigh
these, so this times LayerNorm's backward in float32 (the cases of
``summed_rows_variants``, checked against float64) with:

* ``one``: one row a trip everywhere (the tree's kernels, in the patch's
  code);
* ``full2``: the patch's rule (two rows a trip in the full kernel);
* ``full2free``: the same, the gain read where used;
* ``all2free``: two rows a trip in both block kernels, the gain read
  where used;
* ``all2``: two rows a trip in both, the gain held (the block kernel
  spills);
* ``full4free``: four rows a trip in the full kernel, the gain read where
  used (spills 84 bytes);

each in a process of its own, and prints each variant's block and full
kernels' registers.  Run on the GPU machine from the root of a snapshot
with the patch applied (``benchmarks/results/diagnostics/README.md``)::

    python benchmarks/results/diagnostics/summed_rows_trips.py
"""
import pathlib
import re
import sys

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import summed_rows_variants  # noqa: E402  (this folder's, beside the script)
import variants  # noqa: E402

REPS, CALLS = 10, 10
SHAPES = [(8192, 4096), (32768, 1000), (32768, 1024), (4096, 4096)]
#: variant -> (rows a trip, in the block kernel too, the gain held)
VARIANTS = {"one": (1, False, True), "full2": (2, False, True), "full2free": (2, False, False),
            "all2free": (2, True, False), "all2": (2, True, True),
            "full4free": (4, False, False)}


def _set(variant):
    """Make ``variant``'s choices in ``fused_source`` for LayerNorm's backward
    (its trips, which kernels take them, whether the gain is held)."""
    from handlers.cuda import fused_source as fs
    from layers.layernorm import _BACKWARD
    if not hasattr(fs, "trip_rows"):
        raise SystemExit("summed_rows_trips: apply rows_a_trip.patch first")
    trip, block_too, held = VARIANTS[variant]
    trips, holds, source = fs.trip_rows, fs.holds_row_inputs, fs.row_kernel_source
    fs.trip_rows = lambda op, dtype: trip if op is _BACKWARD else trips(op, dtype)
    fs.holds_row_inputs = lambda op, dtype: held and holds(op, dtype)

    def generated(op, dtype, block, formats=None):
        text = source(op, dtype, block, formats)
        if block_too and op is _BACKWARD:
            text = re.sub(r"STRATEGY == 3 \? (\d+) : 1>", r"\1>", text)
        return text
    fs.row_kernel_source = generated
    fs.plan_rows.cache_clear()


def registers(variant):
    """'block <regs, spill>; full <regs, spill>' of ``variant``'s float32
    kernels (nvcc, sm_90), in a process of its own (``_set`` stays)."""
    import subprocess
    done = subprocess.run([sys.executable, __file__, "--registers", variant],
                          capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip()[-300:]


def _print_registers(variant):
    import numpy as np

    from handlers.cuda import fused_source as fs
    from layers.layernorm import _BACKWARD
    _set(variant)
    text = fs.row_kernel_source(_BACKWARD, np.float32, fs.ROW_BLOCK)
    cells = []
    for way in ("block", "full"):
        name = fs.kernel_name(_BACKWARD, np.float32) + "_" + way
        cells.append(f"{way} {_regs(text, name)}")
    print("; ".join(cells))


def _regs(text, name):
    """'<registers> regs, <bytes> B stack, <bytes> B spilled' of kernel ``name``
    in ``text`` (``variants.kernel_resources``), or '?'."""
    found = variants.kernel_resources(text, name)
    if found is None:
        return "?"
    return f"{found['registers']} regs, {found['stack']} B stack, {found['spilled']} B spilled"


def run_variant(variant):
    """Time every case with ``variant``'s choices; one JSON line."""
    _set(variant)
    variants.time_cases("summed_rows_trips", summed_rows_variants._cases, SHAPES, 7, REPS,
                        CALLS)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--run":
        return run_variant(sys.argv[2])
    if len(sys.argv) > 2 and sys.argv[1] == "--registers":
        return _print_registers(sys.argv[2])
    print(f"LayerNorm's backward, float32, rows a trip; us per call (median of {REPS} samples "
          f"of {CALLS} calls, inputs from DRAM); check: max |error| / max |reference| "
          f"against float64")
    for v in VARIANTS:
        print(f"  {v:10s} {registers(v)}")
    results = variants.collect(__file__, [(v, v) for v in VARIANTS])
    if results:
        variants.print_results(results, list(results))


if __name__ == "__main__":
    main()
