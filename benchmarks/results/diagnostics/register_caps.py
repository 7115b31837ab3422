"""The fused row programs under register caps: occupancy against spills.

After cross-entropy took its picked logit beside the max (commit 8962470's
parent), its block kernel grew from 39 registers to 44, which leaves 2
blocks of 512 threads a multiprocessor where 39 left 3 (softmax: 32, 4);
LayerNorm's backward holds 52.  This times the layer's programs over
8192x4096 and 32768x1000, ours only, with each row kernel's registers
capped (``__maxnreg__``, in place of its ``__launch_bounds__``) at 48, 40
and 32, beside the tree's kernels, each variant in a process of its own
(kernels are built once a process), every result checked against float64
NumPy.  Run on the GPU machine from the project root::

    python benchmarks/results/diagnostics/register_caps.py
"""
import pathlib
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import variants  # noqa: E402  (this folder's, beside the script)

REPS, CALLS = 10, 10
SHAPES = [(8192, 4096), (32768, 1000)]
CAPS = [None, 48, 40, 32]
EPS = 1e-5


def _patch(cap):
    from handlers.cuda import fused_source
    source = fused_source.row_kernel_source

    def capped(op, dtype, block):
        text = source(op, dtype, block)
        name = fused_source.kernel_name(op, dtype)
        for way in ("block", "stream"):
            text = text.replace(f"__launch_bounds__({block}) {name}_{way}(",
                                f"__maxnreg__({cap}) {name}_{way}(")
        return text
    fused_source.row_kernel_source = capped


def row_cases(h, rng, n, c):
    """[(name, call(i), k inputs, check())] of the programs over (n, c)."""
    from benchmarks.ops import inputs_beyond_l2
    from handlers.fused_rows import SOFTMAX
    from layers.layernorm import _BACKWARD, _FORWARD
    from layers.losses import _CROSS_ENTROPY
    y = rng.standard_normal((n, c)).astype(np.float32)
    k = inputs_beyond_l2(y.nbytes)
    ys = [h.create_from_numpy(y) for _ in range(k)]
    y64 = y.astype(np.float64)
    z = y64 - y64.max(axis=1, keepdims=True)
    p64 = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    labels = rng.integers(0, c, n)
    dy64 = p64.copy()
    dy64[np.arange(n), labels] -= 1
    dy64 /= n
    t = h.create_from_numpy(labels.astype(np.float32).reshape(n, 1))
    loss, dy, p = h.allocate((n, 1)), h.allocate((n, c)), h.allocate((n, c))
    gain = (1 + 0.1 * rng.standard_normal((1, c))).astype(np.float32)
    bias = (0.1 * rng.standard_normal((1, c))).astype(np.float32)
    hg, hb = h.create_from_numpy(gain), h.create_from_numpy(bias)
    mu64 = y64.mean(axis=1, keepdims=True)
    r64 = 1 / np.sqrt(((y64 - mu64) ** 2).mean(axis=1, keepdims=True) + EPS)
    xhat = (y64 - mu64) * r64
    out, mu, r = h.allocate((n, c)), h.allocate((n, 1)), h.allocate((n, 1))
    g64 = (0.1 * rng.standard_normal((n, c)))
    gs = [h.create_from_numpy(g64.astype(np.float32)) for _ in range(k)]
    gg = g64 * gain
    dx64 = r64 * (gg - gg.mean(axis=1, keepdims=True)
                  - xhat * (gg * xhat).mean(axis=1, keepdims=True))
    dx, dgain, dbias = h.allocate((n, c)), h.allocate((1, c)), h.allocate((1, c))
    hmu = h.create_from_numpy(mu64.astype(np.float32))
    hr = h.create_from_numpy(r64.astype(np.float32))

    def err(got, want):
        got = h.get_numpy_copy(got)
        return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    ce = _CROSS_ENTROPY[("labels", True)]
    return [
        ("softmax", lambda i: SOFTMAX(h, ys[i % k], p), lambda: err(p, p64)),
        ("cross-entropy", lambda i: ce(h, ys[i % k], t, 1.0 / n, float(c), loss, dy),
         lambda: err(dy, dy64)),
        ("LayerNorm forward", lambda i: _FORWARD(h, ys[i % k], hg, hb, EPS, out, mu, r),
         lambda: err(out, xhat * gain + bias)),
        ("LayerNorm backward", lambda i: _BACKWARD(h, gs[i % k], ys[0], hg, hmu, hr, dx, dgain,
                                                   dbias),
         lambda: max(err(dx, dx64), err(dgain, (g64 * xhat).sum(axis=0, keepdims=True)))),
    ]


def run_variant(cap):
    """Time every case with row kernels capped at ``cap`` registers (None:
    the tree's); print one JSON line (``variants.time_cases``)."""
    if cap is not None:
        _patch(cap)
    variants.time_cases("register_caps", row_cases, SHAPES, 5, REPS, CALLS)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--run":
        return run_variant(None if sys.argv[2] == "-" else int(sys.argv[2]))
    results = variants.collect(__file__, [(cap, str(cap or "-")) for cap in CAPS])
    if not results:
        return
    heads = [f"cap {c}" if c else "tree" for c in results]
    print(f"row programs under register caps, us per call (median of {REPS} samples of "
          f"{CALLS} calls, inputs from DRAM); check: max |error| / max |reference| vs float64")
    variants.print_results(results, heads)

if __name__ == "__main__":
    main()
