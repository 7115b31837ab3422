"""Elements a thread holds in the row kernels with summed outputs, in the
half formats: does holding a whole 16-byte packet pay?

The step breakdown at c62ef88 (``step_breakdown-NVIDIA-H200.log``) timed
the mixed bfloat16 MLP's bias-and-ReLU backward (dz = dy * (y > 0) and its
column sums, a row kernel with a summed output) at 83 us over 4096x4096,
where reading dy and y and writing dz alone would take about 24 us at copy
bandwidth; in float32 the same op took 66 us over twice the bytes
(``summed_rows_grid``).  ``fused_source.held_elements`` gives that op 5
elements a thread (16 float registers over 2 arrays read and 1 summed
output): a multiple of float32's 4-element packet once rounded down (4),
but short of a half format's 8, so the half kernel loads element by
element, 2 bytes at a time.  LayerNorm's backward (2 arrays, 2 summed
outputs: 4) is in the same place.

This times those ops over a few shapes in bfloat16 and float32, each on a
fresh handler (kernels are cached per handler) with ``held_elements``
forced to 4, 5 and 8 and as the tree plans it, inputs cycled beyond the L2,
each result checked against float64 NumPy on the same rounded inputs.
Run on the GPU machine from the project root::

    python benchmarks/results/diagnostics/half_rows_held.py
"""
import pathlib
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import variants  # noqa: E402  (this folder's, beside the script)

from benchmarks.gpu import EventTimer  # noqa: E402
from handlers.cuda import fused_source  # noqa: E402
from layers import epilogues  # noqa: E402
from layers.layernorm import _BACKWARD as LN_BACKWARD  # noqa: E402

REPS, CALLS = 10, 10
HELD = (None, 4, 5, 8)
FORMATS = ("bfloat16", "float32")
CASES = [("bias_relu_backward", (4096, 4096)), ("bias_relu_backward", (256, 1024)),
         ("layer_norm_backward", (8192, 4096)), ("layer_norm_backward", (4096, 1024))]


def case_data(name, shape, dt, rng):
    """(host inputs in ``dt``, output shapes, float64 references) of one case."""
    rows, cols = shape
    def rnd(*s):
        return rng.standard_normal(s).astype(dt)
    if name == "bias_relu_backward":
        dy, y = rnd(rows, cols), rnd(rows, cols)
        g = dy.astype(np.float64) * (y.astype(np.float64) > 0)
        return [dy, y], [(rows, cols), (1, cols)], [g, g.sum(axis=0, keepdims=True)]
    dy, x, gain = rnd(rows, cols), rnd(rows, cols), rnd(1, cols)
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=1, keepdims=True).astype(dt)
    r = (1 / np.sqrt(x64.var(axis=1, keepdims=True) + 1e-5)).astype(dt)
    d64, m64, r64, g64 = dy.astype(np.float64), mu.astype(np.float64), r.astype(np.float64), \
        gain.astype(np.float64)
    xhat = (x64 - m64) * r64
    g = d64 * g64
    dx = r64 * (g - g.mean(axis=1, keepdims=True)
                - xhat * (g * xhat).mean(axis=1, keepdims=True))
    refs = [dx, (d64 * xhat).sum(axis=0, keepdims=True), d64.sum(axis=0, keepdims=True)]
    return [dy, x, gain, mu, r], [(rows, cols), (1, cols), (1, cols)], refs


def run(fmt, held, rng_seed=0):
    """{case: (us, max error relative to the largest reference, held, block)}
    on a fresh handler of ``fmt`` with held_elements forced to ``held``."""
    with variants.held_handler("half_rows_held", fmt, held) as h:
        if h is None:
            return None
        dt = h.dtype
        timer = EventTimer("pycuda", h.stream)
        rng = np.random.default_rng(rng_seed)
        ops = {"bias_relu_backward": epilogues.OPS["relu"][1],
               "layer_norm_backward": LN_BACKWARD}
        rows = {}
        for name, shape in CASES:
            hosts, out_shapes, refs = case_data(name, shape, dt, rng)
            op = ops[name]
            ms, err = variants.time_op(h, timer, op, hosts, out_shapes, refs, (), REPS, CALLS)
            used = fused_source.held_elements(op, dt)
            rows[(name, shape)] = (ms * 1e3, err, used,
                                   fused_source.row_block(shape[1], used))
        return rows


def main():
    print(f"row kernels with summed outputs; us per call, median of {REPS} samples of "
          f"{CALLS} calls, inputs from DRAM; error: max |ours - float64| / max |float64|")
    print(f"{'op':22s} {'shape':14s} {'format':9s} {'held':>6s} {'block':>6s} {'us':>9s} "
          f"{'error':>9s}")
    for fmt in FORMATS:
        for held in HELD:
            rows = run(fmt, held)
            if rows is None:
                return
            for (name, shape), (us, err, used, block) in rows.items():
                tol = 2e-2 if fmt != "float32" else 1e-4
                label = f"{used}" + ("" if held is not None else "*")
                print(f"{name:22s} {str(shape):14s} {fmt:9s} {label:>6s} {block:6d} "
                      f"{us:9.2f} {err:9.1e}" + ("" if err < tol else "  BAD"))


if __name__ == "__main__":
    main()
