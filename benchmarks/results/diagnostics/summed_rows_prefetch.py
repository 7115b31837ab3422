"""Whether the L2 prefetch of row kernels with summed outputs pays.

LayerNorm's backward over 8192x4096 took 167 us on an H200 (2026-11-27,
``fused_terms``), where dx alone (a block per row, no loop) took 106 and
dgain and dbias alone (the summing loop, no row reductions) 107: the
program's rows loop, which asks the L2 for the next row while it reduces
this one (``fx::prefetch_l2``, commit 095be9e, never timed on its own), is
where the time goes.  This times, ours only, the programs with summed
outputs (LayerNorm's backward, its parameter gradients alone, a dense
layer's bias-and-ReLU backward) with and without that prefetch, each
variant in a process of its own (kernels are built once a process), every
result checked against float64 NumPy.  Run on the GPU machine from the
project root::

    python benchmarks/results/diagnostics/summed_rows_prefetch.py
"""
import pathlib
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import variants  # noqa: E402  (this folder's, beside the script)

REPS, CALLS = 10, 10
SHAPES = [(8192, 4096), (32768, 1000), (4096, 256), (1024, 50257)]
EPS = 1e-5


def _no_prefetch():
    """Build this process's row kernels without the L2 prefetch."""
    from handlers.cuda import fused_source
    source = fused_source.row_kernel_source

    def plain(op, dtype, block):
        text = source(op, dtype, block)
        return text.replace("fx::prefetch_l2(", "(void)(")
    fused_source.row_kernel_source = plain


def _cases(h, rng, n, c):
    """[(name, call(i), check())] of the programs with summed outputs over (n, c)."""
    from benchmarks.ops import inputs_beyond_l2
    from layers.epilogues import OPS
    from layers.layernorm import _BACKWARD, _PARAM_GRADS
    x64 = rng.standard_normal((n, c))
    dy64 = 0.1 * rng.standard_normal((n, c))
    gain = (1 + 0.1 * rng.standard_normal((1, c))).astype(np.float32)
    k = inputs_beyond_l2(dy64.size * 4)
    dys = [h.create_from_numpy(dy64.astype(np.float32)) for _ in range(k)]
    dy64 = dy64.astype(np.float32).astype(np.float64)
    hx = h.create_from_numpy(x64.astype(np.float32))
    x64 = x64.astype(np.float32).astype(np.float64)
    mu64 = x64.mean(axis=1, keepdims=True)
    r64 = 1 / np.sqrt(((x64 - mu64) ** 2).mean(axis=1, keepdims=True) + EPS)
    xhat = (x64 - mu64) * r64
    hg = h.create_from_numpy(gain)
    hmu = h.create_from_numpy(mu64.astype(np.float32))
    hr = h.create_from_numpy(r64.astype(np.float32))
    gg = dy64 * gain
    dx64 = r64 * (gg - gg.mean(axis=1, keepdims=True)
                  - xhat * (gg * xhat).mean(axis=1, keepdims=True))
    dgain64 = (dy64 * xhat).sum(axis=0, keepdims=True)
    dx, dgain, dbias = h.allocate((n, c)), h.allocate((1, c)), h.allocate((1, c))
    y = h.create_from_numpy(np.maximum(x64, 0).astype(np.float32))   # a ReLU's output
    g = h.allocate((n, c))
    relu_back = OPS["relu"][1]

    def err(got, want):
        got = h.get_numpy_copy(got).astype(np.float64)
        return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    return [
        ("LayerNorm backward", lambda i: _BACKWARD(h, dys[i % k], hx, hg, hmu, hr, dx, dgain,
                                                   dbias),
         lambda: max(err(dx, dx64), err(dgain, dgain64))),
        ("LayerNorm param grads", lambda i: _PARAM_GRADS(h, dys[i % k], hx, hmu, hr, dgain,
                                                         dbias),
         lambda: max(err(dgain, dgain64), err(dbias, dy64.sum(axis=0, keepdims=True)))),
        ("bias + ReLU backward", lambda i: relu_back(h, dys[i % k], y, g, dbias),
         lambda: err(dbias, (dy64 * (x64 > 0)).sum(axis=0, keepdims=True))),
    ]


def run_variant(prefetch):
    """Time every case, with or without the prefetch; print one JSON line
    (``variants.time_cases``)."""
    if not prefetch:
        _no_prefetch()
    variants.time_cases("summed_rows_prefetch", _cases, SHAPES, 9, REPS, CALLS)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--run":
        return run_variant(sys.argv[2] == "1")
    results = variants.collect(__file__, [("prefetch", "1"), ("none", "0")])
    if len(results) < 2:
        return
    print(f"summed rows with and without the L2 prefetch, us per call (median of {REPS} "
          f"samples of {CALLS} calls, inputs from DRAM); check against float64")
    print(f"{'op':24s} {'shape':15s} {'prefetch':>10s} {'none':>10s}  check")
    for a, b in zip(results["prefetch"], results["none"]):
        ok = "ok" if max(a["err"], b["err"]) < 1e-4 else "BAD"
        print(f"{a['op']:24s} {str(tuple(a['shape'])):15s} {a['us']:10.2f} {b['us']:10.2f}  "
              f"{ok} {max(a['err'], b['err']):.0e}")


if __name__ == "__main__":
    main()
