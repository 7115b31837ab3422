"""Which row-kernel build brings the fused rows to copy bandwidth: loop or not, register cap.

``row_kernel_variants.py`` found a standalone block-per-row softmax at 94% of
copy on an H200 where ours, with the same block and elements held, ran 58%:
ours took 43 registers a thread against 32, so 2 blocks of 512 threads fit a
multiprocessor instead of 4.  Compiled here (nvcc 13.0, sm_90), the
block-per-row loop over rows (``for r = blockIdx.x; r < rows; r +=
gridDim.x``) is what costs them: without it softmax's kernel takes 31
registers, cross-entropy's 37 (from 58), LayerNorm's forward 45 (from 48).

This times the fused rows of ``python -m benchmarks reductions`` (softmax,
softmax with cross-entropy and its gradient, LayerNorm forward and backward;
its first two shapes, all three with ``--all-shapes``), ours only, each
variant in its own process, with this tree's planner:

* ``NAME`` for each ``--kernels NAME=DIR``: the row kernels built from the
  kernel sources in DIR (another tree's ``handlers/cuda/kernels``: the tree
  before a change);
* ``tree``: this tree's kernels;
* ``tree+cap``: this tree's, the block-per-row kernels of ops without summed
  outputs compiled for 2 resident blocks of ROW_BLOCK threads
  (``__launch_bounds__(1024, 2)``: 32 registers a thread; the compiler
  spills what does not fit: LayerNorm's forward 32 bytes, cross-entropy 12).

Each result is checked against float64 NumPy as the suite checks it.  Run by
hand from the project root on a GPU machine:
``python benchmarks/results/diagnostics/row_occupancy.py --kernels before=DIR``.
With ``--all-shapes`` each variant takes about 170 s on an H200 (float64
references at (4096, 50257) and a cold compile); on two shapes about 20 s.

Its run (``row_occupancy-NVIDIA-H200.log``, 2026-11-27, at 6e415ba with the
cap then on by default, variants then named before, no-loop+cap and no-loop):
``before`` over the three shapes, then the other two over the first two only
(the device time ran out).  Softmax went
from 111.5 to 88.1 us at 8192x4096 (93.2 to 87.5 at 32768x1000),
cross-entropy with its gradient 159.8 to 143.0 (145.6 to 138.5), LayerNorm's
backward at 32768x1000 167.8 to 151.7; the cap helped LayerNorm's forward at
4096 columns (105.0 to 95.4 us) and hurt it at 1000 (87.1 to 95.8), and left
the others within noise, so the tree keeps no cap.  Ours still trails the
standalone block-per-row softmax of ``row_kernel_variants`` (67-70 us) at the
same registers: what is left is not occupancy.
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
from types import SimpleNamespace

# Run as a script, this file's directory is on sys.path, not the project root.
ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

REPS = 10


def _patch(kernels, cap):
    """Make this process build its row kernels from ``kernels`` (a directory
    of kernel sources; None: this tree's), capped to 32 registers where
    ``cap`` (see the module's docstring)."""
    from handlers.cuda import fused_source, kernel_loader
    if kernels is not None:
        kernel_loader.KERNEL_DIR = str(kernels)
    if cap:
        source = fused_source.row_kernel_source

        def capped(op, dtype, block):
            text = source(op, dtype, block)
            if op.sums:
                return text
            name = fused_source.kernel_name(op, dtype)
            return text.replace(f"__launch_bounds__({block}) {name}_block(",
                                f"__launch_bounds__({block}, 2) {name}_block(")
        fused_source.row_kernel_source = capped


def run_variant(name, kernels, cap, all_shapes):
    """Time one variant's fused rows; print one JSON line of results."""
    _patch(kernels, cap)
    import numpy as np

    from benchmarks import reductions as RD
    from benchmarks.gpu import EventTimer, cuda_handler
    from benchmarks.ops import copy_spread, inputs_beyond_l2
    h = cuda_handler("row_occupancy", np.float32)
    if h is None:
        return
    env = SimpleNamespace(h32=h, torch=None, tput=None, inputs=inputs_beyond_l2,
                          timer=EventTimer("pycuda", h.stream), torch_timer=None)
    env.copy_Bps = copy_spread(h, (128 << 20) // 4, 7)["median"]
    checks = []
    shapes = RD.FUSED_SHAPES if all_shapes else RD.FUSED_SHAPES[:2]
    rows = RD.fused_rows(env, shapes, 7, REPS, False, checks)
    out = [dict(op=r["op"], shape=list(r["shape"]), us=r["ms"]["ours"]["median"] * 1e3,
                frac=r["fraction_of_copy"]["ours"]) for r in rows]
    bad = [c.get("what") for c in checks if not c.get("ok")]
    print("RESULT " + json.dumps(dict(variant=name, rows=out, failed=bad)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", action="append", default=[], metavar="NAME=DIR",
                   help="a variant built from the kernel sources in DIR (repeatable)")
    p.add_argument("--all-shapes", action="store_true", help="the third shape too")
    p.add_argument("--run", nargs=3, metavar=("NAME", "DIR", "CAP"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.run:
        name, kernels, cap = a.run
        return run_variant(name, None if kernels == "-" else pathlib.Path(kernels).resolve(),
                           cap == "1", a.all_shapes)
    variants = [(k.split("=", 1)[0], k.split("=", 1)[1], "0") for k in a.kernels]
    variants += [("tree", "-", "0"), ("tree+cap", "-", "1")]
    results = {}
    for v, kernels, cap in variants:
        done = subprocess.run([sys.executable, __file__, "--run", v, kernels, cap]
                              + ["--all-shapes"] * a.all_shapes, capture_output=True, text=True)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            print(f"{v}: FAILED\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}")
            continue
        results[v] = json.loads(lines[-1][7:])
        print(f"{v}: " + "; ".join(f"{x['op'][:12]} {x['shape'][1]} {x['us']:.1f} us"
                                   for x in results[v]["rows"])
              + (f"; checks failed: {results[v]['failed']}" if results[v]["failed"]
                 else "; every check ok"), flush=True)
    if not results:
        return
    first = next(iter(results.values()))["rows"]
    print("\nus per call (fraction of copy), ours only; median of", REPS)
    head = f"{'op':45s} {'shape':15s}" + "".join(f" {v:>18s}" for v in results)
    print(head)
    for i, r in enumerate(first):
        cells = []
        for v in results:
            x = results[v]["rows"][i]
            cells.append(f" {x['us']:9.1f} ({x['frac']:.3f})")
        print(f"{r['op']:45s} {str(tuple(r['shape'])):15s}" + "".join(cells))
    for v in results:
        print(f"{v}: median fraction of copy "
              f"{statistics.median(x['frac'] for x in results[v]['rows']):.3f}")


if __name__ == "__main__":
    main()
