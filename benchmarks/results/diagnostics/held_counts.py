"""Elements a thread holds in the row kernels: does holding 16 pay?

The reductions suite at d73f9f8 (H200) had every fused row below its 85%
of copy: softmax over 8192x4096 at 81.9%, cross-entropy with its gradient
at 50.5%, LayerNorm forward 73.6%, backward 55.5%.  ``row_kernel_variants``
found standalone kernels of a block per row at 94-98% holding 8 floats a
thread at 32 registers, and at 95-97% holding 16 floats at 40-48
registers: with 16, a multiprocessor's resident rows keep more bytes in
flight, and extra registers cost less.  ``fused_source.held_elements``
holds at most 8 (4 for LayerNorm's backward, which sums two outputs over
the rows).

This times the library's fused row programs (softmax, cross-entropy over
labels with its gradient, LayerNorm forward and backward, the dense
layer's bias-and-ReLU backward) in float32 and bfloat16, each format and
held count on a fresh handler (kernels are built per handler), with
``held_elements`` as the tree gives it and forced to 8 and 16, inputs
cycled beyond the L2, each result checked against float64 NumPy on the
same rounded inputs.  Run on the GPU machine from the project root::

    python benchmarks/results/diagnostics/held_counts.py [--tree]

``--tree``: only the tree's held counts, over the dense layers' shapes
(256x1024, 4096x4096) too, to compare two trees (.ci/gpu-ab).
"""
import pathlib
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import variants  # noqa: E402  (this folder's, beside the script)

from benchmarks.gpu import EventTimer  # noqa: E402
from handlers.cuda import fused_source  # noqa: E402
from handlers.fused_rows import SOFTMAX  # noqa: E402
from layers import epilogues  # noqa: E402
from layers.layernorm import _BACKWARD as LN_BACKWARD  # noqa: E402
from layers.layernorm import _FORWARD as LN_FORWARD  # noqa: E402
from layers.losses import _CROSS_ENTROPY  # noqa: E402

REPS, CALLS = 10, 10
EPS = 1e-5
SHAPES = {"float32": [(8192, 4096), (32768, 1000), (4096, 256)],
          "bfloat16": [(8192, 4096), (32768, 1000)]}
HELD = {"float32": (None, 8, 16), "bfloat16": (None, 16)}
OPS = {"softmax": SOFTMAX, "cross_entropy": _CROSS_ENTROPY[("labels", True)],
       "layer_norm": LN_FORWARD, "layer_norm_backward": LN_BACKWARD,
       "bias_relu_backward": epilogues.OPS["relu"][1]}


def case_data(name, shape, dt, rng):
    """(host arrays in call order, output shapes, float64 references, host
    scalars appended after the arrays) of one case."""
    rows, cols = shape

    def rnd(*s):
        return rng.standard_normal(s).astype(dt)
    x = rnd(rows, cols)
    x64 = x.astype(np.float64)
    if name == "softmax":
        e = np.exp(x64 - x64.max(axis=1, keepdims=True))
        return [x], [(rows, cols)], [e / e.sum(axis=1, keepdims=True)], []
    if name == "cross_entropy":
        labels = rng.integers(0, cols, rows)
        e = np.exp(x64 - x64.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
        loss = -np.log(p[np.arange(rows), labels]) / rows
        p[np.arange(rows), labels] -= 1
        t = labels.astype(np.float32).reshape(rows, 1)
        return [x, t], [(rows, 1), (rows, cols)], [loss.reshape(rows, 1), p / rows], \
            [1.0 / rows, float(cols)]
    if name == "bias_relu_backward":
        y = rnd(rows, cols)
        g = x64 * (y.astype(np.float64) > 0)
        return [x, y], [(rows, cols), (1, cols)], [g, g.sum(axis=0, keepdims=True)], []
    gain, bias = rnd(1, cols), rnd(1, cols)
    mu = x64.mean(axis=1, keepdims=True)
    r = 1 / np.sqrt(x64.var(axis=1, keepdims=True) + EPS)
    if name == "layer_norm":
        g64, b64 = gain.astype(np.float64), bias.astype(np.float64)
        return [x, gain, bias], [(rows, cols), (rows, 1), (rows, 1)], \
            [(x64 - mu) * r * g64 + b64, mu, r], [EPS]
    # layer_norm_backward: dy, x, gain, mu, r (mu and r rounded as kept)
    dy = rnd(rows, cols)
    mu, r = mu.astype(dt), r.astype(dt)
    d64, m64, r64 = dy.astype(np.float64), mu.astype(np.float64), r.astype(np.float64)
    xhat = (x64 - m64) * r64
    g = d64 * gain.astype(np.float64)
    dx = r64 * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return [dy, x, gain, mu, r], [(rows, cols), (1, cols), (1, cols)], \
        [dx, (d64 * xhat).sum(axis=0, keepdims=True), d64.sum(axis=0, keepdims=True)], []


def run(fmt, held):
    """{(op, shape): (us, error, held, block, fraction of copy)} on a fresh
    handler of ``fmt`` with held_elements forced to ``held`` (None: the
    tree's)."""
    with variants.held_handler("held_counts", fmt, held) as h:
        if h is None:
            return None
        dt = h.dtype
        timer = EventTimer("pycuda", h.stream)
        rng = np.random.default_rng(0)
        src = h.allocate((32 << 20,))
        dst = h.allocate((32 << 20,))
        copy = timer.measure(lambda i: h.copy_to(src, dst), reps=REPS, warmup=2,
                             inner=CALLS)["median"]
        copy_Bps = 2 * src.nbytes / (copy * 1e-3)
        rows = {}
        for name, op in OPS.items():
            for shape in SHAPES[fmt]:
                hosts, out_shapes, refs, scalars = case_data(name, shape, dt, rng)
                moved = sum(a.nbytes for a in hosts) + sum(
                    np.prod(s) * np.dtype(dt).itemsize for s in out_shapes)
                # The labels stay float32 arrays of a float32 handler's format
                # only where the handler is float32; a bf16 handler takes them
                # in its own format (exact below 257 classes only): skip.
                if name == "cross_entropy" and fmt != "float32":
                    hosts[1] = hosts[1].astype(dt)
                    if shape[1] > 256:
                        continue
                ms, err = variants.time_op(h, timer, op, hosts, out_shapes, refs, scalars,
                                           REPS, CALLS)
                used = fused_source.held_elements(op, dt)
                rows[(name, shape)] = (ms * 1e3, err, used,
                                       fused_source.row_block(shape[1], used),
                                       moved / (ms * 1e-3) / copy_Bps)
        return rows


def main():
    if "--tree" in sys.argv[1:]:
        SHAPES["float32"] += [(4096, 4096), (256, 1024)]
        SHAPES["bfloat16"] += [(4096, 4096)]
        for fmt in HELD:
            HELD[fmt] = (None,)
    print(f"fused row programs by elements held a thread; us per call, median of {REPS} "
          f"samples of {CALLS} calls, inputs from DRAM; of copy: minimal bytes over a "
          f"device copy's bandwidth; error: max |ours - float64| / max |float64|; * the tree's")
    print(f"{'op':22s} {'shape':14s} {'format':9s} {'held':>6s} {'block':>6s} {'us':>9s} "
          f"{'of copy':>8s} {'error':>9s}")
    for fmt, helds in HELD.items():
        for held in helds:
            rows = run(fmt, held)
            if rows is None:
                return
            for (name, shape), (us, err, used, block, frac) in rows.items():
                tol = 2e-2 if fmt != "float32" else 1e-4
                label = f"{used}" + ("" if held is not None else "*")
                print(f"{name:22s} {str(shape):14s} {fmt:9s} {label:>6s} {block:6d} "
                      f"{us:9.2f} {frac:8.1%} {err:9.1e}" + ("" if err < tol else "  BAD"),
                      flush=True)


if __name__ == "__main__":
    main()
