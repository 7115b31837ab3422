"""How should a row kernel with summed (``:row``) outputs choose its grid and
its combine?  A dense layer's bias-and-ReLU backward (256 rows of 1024, the
train suite's MLP; 64 rows of 84 and of 120, the conv suite's LeNet) took
about 10 us on an H200 where its forward takes 5-6; LayerNorm's backward
trails torch.compile at 4096 and 1000 columns, and is 3x its time over rows
of 50257 (streamed rows: the grid is capped so that the partial rows take
at most half the L2).  Their time is mostly the
blocks' partial rows and the two-level, in-launch combine of
``finish_sums`` (kernels/fused.cuh), planned by ``fused_source.plan_rows``
(the grid: every row, at most the resident blocks) and
``fused_source.sum_groups`` (about sqrt(grid) blocks a group).

For each case this times the op (``REPS`` samples of ``CALLS`` calls back to
back between CUDA events, the median, us per call) on the planner's grid and
on forced grids, each with the planner's groups and with one group (a single
level: the last block adds every partial row), and checks every variant's
outputs against float64 NumPy (max |error| / max |reference|).  Nothing is
changed in the library: the process wraps ``plan_rows`` and ``sum_groups``.

With ``--dtype bfloat16`` (or float16), the large shapes only, in that
format, on grids up to 32 blocks a multiprocessor (more than are resident:
the blocks that wait for a slot start when others finish), inputs
rounded to the format first.

Run by hand from the project root on a GPU machine, on a tree whose
kernels take any grid for summed outputs (every tree since the row
kernels' loops over rows with sums, 2026-11):
``python benchmarks/results/diagnostics/summed_rows_grid.py [--quick]
[--dtype bfloat16] [--shapes 8192x512]``.

``--shapes 8192x512`` (2026-11-28; run in bfloat16 with 8192x2048 too,
``summed_rows_grid_narrow_bf16-NVIDIA-H200.log``): the gpt suite's LayerNorm
backward takes 66 us a call in bfloat16 (13 calls a step, 0.86 ms of
6.4), where its bytes take about 6 us at copy bandwidth.  The planner's
grid there is about sms * sqrt(8192 / (2 * 512)) = 373 blocks, and a
512-column row is one block of 64 threads (bfloat16, 8 held) or 128
(float32): some 6 warps a multiprocessor, too few loads in flight.  The
square-root rule was fitted on rows held by blocks of up to 1024
threads; this sweep says whether narrow rows want more blocks.
"""
import argparse
import pathlib
import statistics
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

REPS, CALLS, TOL = 10, 20, 1e-4


def _cases():
    """[(name, op, build, shapes)]: the fused op and its argument builder
    (float64 inputs and the outputs' shapes; ``_references`` gives the
    outputs from them)."""
    from layers.epilogues import _declare
    from layers.layernorm import _BACKWARD, _PARAM_GRADS

    dense = _declare("relu", "row")[1]     # dy y -> g db:row: g = dy * (y > 0), db = sum of g

    def dense_args(rng, rows, cols):
        dy = rng.standard_normal((rows, cols))
        y = np.maximum(rng.standard_normal((rows, cols)), 0)
        return [dy, y], [(rows, cols), (1, cols)]

    def ln_args(rng, rows, cols):
        dy, x = rng.standard_normal((rows, cols)), rng.standard_normal((rows, cols))
        gain = 1 + 0.1 * rng.standard_normal((1, cols))
        mu = x.mean(axis=1, keepdims=True)
        r = 1 / np.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + 1e-5)
        return [dy, x, gain, mu, r], [(rows, cols), (1, cols), (1, cols)]

    def grads_args(rng, rows, cols):
        (dy, x, _, mu, r), shapes = ln_args(rng, rows, cols)
        return [dy, x, mu, r], shapes[1:]

    return [("bias_relu_backward", dense, dense_args, [(256, 1024), (64, 84), (64, 120),
                                                        (4096, 4096)]),
            ("layer_norm_backward", _BACKWARD, ln_args, [(8192, 4096), (32768, 1000),
                                                          (4096, 256), (1024, 50257)]),
            # the parameters' sums alone (ln_split.py: 39-59 us over 8192 x 512
            # where their bytes need 4-8): no reduction along the row, so the
            # sums' own path, partial rows and combine, by grid
            ("layer_norm_param_grads", _PARAM_GRADS, grads_args, [(8192, 512), (8192, 4096)])]


def _references(inputs):
    """The float64 outputs of either builder's op on its ``inputs`` (as
    drawn, or rounded to the handler's half format)."""
    if len(inputs) == 2:   # the dense layer's bias-and-ReLU backward
        dy, y = inputs
        g = dy * (y > 0)
        return [g, g.sum(axis=0, keepdims=True)]
    if len(inputs) == 4:   # LayerNorm's parameters' sums alone
        dy, x, mu, r = inputs
        return [(dy * (x - mu) * r).sum(axis=0, keepdims=True), dy.sum(axis=0, keepdims=True)]
    dy, x, gain, mu, r = inputs
    xhat = (x - mu) * r
    g = dy * gain
    dx = r * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return [dx, (dy * xhat).sum(axis=0, keepdims=True), dy.sum(axis=0, keepdims=True)]


def main(argv=None):
    """Print, per case, us per call and the check of each grid and combine."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the first shape of each op only")
    p.add_argument("--dtype", default="float32", help="the handler's format")
    p.add_argument("--shapes", default="",
                   help="comma-separated ROWSxCOLS instead of each op's own shapes, "
                        "on grids of 1 to 32 blocks a multiprocessor (e.g. 8192x512: "
                        "the gpt suite's LayerNorm)")
    args = p.parse_args(argv)
    only = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]

    from benchmarks.gpu import EventTimer
    from handlers.cuda import fused_source
    from handlers.cuda.handler import PyCudaHandler

    plan_rows, sum_groups = fused_source.plan_rows, fused_source.sum_groups
    force = {"grid": None, "one_level": False, "planned": None}

    def forced_plan(*a, **k):
        grid, block = plan_rows(*a, **k)
        force["planned"] = grid   # the library's own choice, at the kernel's occupancy
        return (force["grid"] or grid), block

    def forced_groups(grid):
        return (grid, 2) if force["one_level"] else sum_groups(grid)

    fused_source.plan_rows, fused_source.sum_groups = forced_plan, forced_groups

    from handlers import dtypes
    dt = dtypes.resolve(args.dtype)
    half = dtypes.is_half(dt)
    tol = 2e-2 if half else TOL
    h = PyCudaHandler(dt)
    timer = EventTimer("pycuda", h.stream)
    rng = np.random.default_rng(0)
    print(f"summed rows: {h._sms} SMs; us per call, median of {REPS} samples of "
          f"{CALLS} calls; {dt}; check: max |error| / max |reference| against float64 "
          f"(tol {tol})")
    for name, op, build, shapes in _cases():
        if only:
            shapes = only
        elif half:
            shapes = [s for s in shapes if s[0] * s[1] >= 2 ** 24]
        for rows, cols in shapes[:1] if args.quick else shapes:
            inputs, out_shapes = build(rng, rows, cols)
            if half:   # the references of the rounded inputs
                inputs = [a.astype(dt).astype(np.float64) for a in inputs]
            refs = _references(inputs)
            dev_in = [h.create_from_numpy(a.astype(dt)) for a in inputs]
            dev_out = [h.zeros(s) for s in out_shapes]
            force["grid"], force["one_level"] = None, False
            op(h, *dev_in, *dev_out)        # compiles, and records the planned grid
            planned = force["planned"]
            grids = sorted({planned, 1, 8, 32, 66, 132, 264, 528, rows} - {0})
            if half or only:
                grids = sorted({planned} | {h._sms * k for k in (1, 2, 4, 8, 16, 32)})
            grids = [g for g in grids if g <= max(rows, 1)]
            print(f"\n{name} ({rows}, {cols}), planned grid {planned}")
            print(f"{'grid':>6} {'groups':>10} {'us':>9} {'check':>9}")
            for grid in grids:
                for one in (False, True):
                    force["grid"], force["one_level"] = grid, one
                    for o in dev_out:
                        h.fill(o, np.nan)
                    op(h, *dev_in, *dev_out)
                    err = max(float(np.max(np.abs(h.get_numpy_copy(o).astype(np.float64) - r))
                                    / np.max(np.abs(r))) for o, r in zip(dev_out, refs))
                    samples = [timer.sample(lambda i: op(h, *dev_in, *dev_out), 0, CALLS)
                               for _ in range(REPS)]
                    us = statistics.median(samples) * 1e3
                    groups = "one level" if one else f"{sum_groups(grid)[0]} a group"
                    ok = "ok" if err <= tol else "FAILED"
                    print(f"{grid:>6} {groups:>10} {us:>9.2f} {err:>9.1e} {ok}")
            force["grid"], force["one_level"] = None, False
    fused_source.plan_rows, fused_source.sum_groups = plan_rows, sum_groups


if __name__ == "__main__":
    main()
