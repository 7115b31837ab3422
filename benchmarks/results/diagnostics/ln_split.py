"""LayerNorm's backward as one kernel, or as two: which is faster, where?

``LayerNorm.backward`` runs one fused op (``layers/layernorm.py``'s
``_BACKWARD``): dx, which reduces along each row, and the gain's and the
bias's gradients, which sum over the rows (``:row`` outputs).  A kernel
with summed outputs loops its blocks over the rows and adds each block's
partial row at the end (``handlers/cuda/fused_source.plan_rows``), so it
keeps fewer rows in flight than a kernel without: over the gpt suite's 8192
x 512 it took 68 us a call in bfloat16 and 45 in float32 (13 calls a
step), where its bytes take about 6 and 12 at copy bandwidth, and the
forward, a block a row and no loop, 11 and 14
(``step_breakdown_gpt-NVIDIA-H200.log``).  In two ops, dx comes from a
row kernel without sums (a block a row, as the forward's) and the
gradients from ``_PARAM_GRADS``, which reduces nothing along the row (its
rows loop has no barrier; ``half_trip.patch`` gives it two rows a trip in
the half formats), at the cost of reading dy and x twice.

This times, per format and shape, the fused op, the two ops in turn
(``split``) and each alone, ours only, every output checked against float64
NumPy; the inputs stay where the previous call left them (in L2 where
they fit, as in a training step, whose ops hand each other their
arrays).  The split's op for dx is declared here (``INPUT_GRAD``), the
same program as ``_BACKWARD`` less its sums.  If the split wins on some
shapes, ``LayerNorm.backward`` could take it there (a rule in one place,
with this log as its measurement).

Run on a GPU machine from the project root: ``python
benchmarks/results/diagnostics/ln_split.py [--shapes 8192x512,...]
[--dtypes float32,bfloat16]``.
"""
import argparse
import pathlib
import statistics
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

from handlers import fused_op  # noqa: E402

REPS, CALLS = 10, 20
SHAPES = "8192x512,8192x2048,8192x4096,32768x1000"
#: dx alone: ``_BACKWARD``'s program without its summed outputs
INPUT_GRAD = fused_op("layer_norm_input_grad_probe", inputs="dy x gain:row mu:col r:col",
                      outputs="dx", body="""
xhat = (x - mu) * r
g = dy * gain
dx = r * (g - mean(g) - xhat * mean(g * xhat))
""")


def _inputs(rng, rows, cols):
    dy, x = rng.standard_normal((rows, cols)), rng.standard_normal((rows, cols))
    gain = 1 + 0.1 * rng.standard_normal((1, cols))
    mu = x.mean(axis=1, keepdims=True)
    r = 1 / np.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    return dy, x, gain, mu, r


def _references(dy, x, gain, mu, r):
    xhat = (x - mu) * r
    g = dy * gain
    dx = r * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0, keepdims=True), dy.sum(axis=0, keepdims=True)


def main(argv=None):
    """Print, per format and shape, us per call of each way and its check."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=SHAPES, help="comma-separated ROWSxCOLS")
    p.add_argument("--dtypes", default="float32,bfloat16", help="the handlers' formats")
    args = p.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]

    from benchmarks.gpu import EventTimer
    from handlers import dtypes
    from handlers.cuda.handler import PyCudaHandler
    from layers.layernorm import _BACKWARD, _PARAM_GRADS

    rng = np.random.default_rng(0)
    for name in args.dtypes.split(","):
        dt = dtypes.resolve(name)
        tol = 2e-2 if dtypes.is_half(dt) else 1e-4
        h = PyCudaHandler(dt)
        timer = EventTimer("pycuda", h.stream)
        print(f"\nLayerNorm backward, {dt}; us per call, median of {REPS} samples of {CALLS} "
              f"calls; check: max |error| / max |reference| against float64 (tol {tol})")
        print(f"{'shape':>14} {'fused':>9} {'split':>9} {'dx alone':>9} {'grads':>9} "
              f"{'split/fused':>11}  check")
        for rows, cols in shapes:
            host = _inputs(rng, rows, cols)
            if dtypes.is_half(dt):   # the references of the rounded inputs
                host = tuple(a.astype(dt).astype(np.float64) for a in host)
            refs = _references(*host)
            dy, x, gain, mu, r = (h.create_from_numpy(a.astype(dt)) for a in host)
            dx, dg, db = h.zeros((rows, cols)), h.zeros((1, cols)), h.zeros((1, cols))
            ways = {
                "fused": lambda i: _BACKWARD(h, dy, x, gain, mu, r, dx, dg, db),
                "split": lambda i: (INPUT_GRAD(h, dy, x, gain, mu, r, dx),
                                    _PARAM_GRADS(h, dy, x, mu, r, dg, db)),
                "dx alone": lambda i: INPUT_GRAD(h, dy, x, gain, mu, r, dx),
                "grads": lambda i: _PARAM_GRADS(h, dy, x, mu, r, dg, db),
            }
            times, checks = {}, []
            for way, fn in ways.items():
                for o in (dx, dg, db):
                    h.fill(o, np.nan)
                fn(0)   # compiles, and gives the outputs to check
                outs = {"fused": (dx, dg, db), "split": (dx, dg, db), "dx alone": (dx,),
                        "grads": (dg, db)}[way]
                want = {"fused": refs, "split": refs, "dx alone": refs[:1],
                        "grads": refs[1:]}[way]
                err = max(float(np.max(np.abs(h.get_numpy_copy(o).astype(np.float64) - w))
                                / np.max(np.abs(w))) for o, w in zip(outs, want))
                checks.append(f"{way} {err:.0e} {'ok' if err <= tol else 'FAILED'}")
                times[way] = statistics.median(timer.sample(fn, 0, CALLS)
                                               for _ in range(REPS)) * 1e3
            print(f"{str((rows, cols)):>14} {times['fused']:9.2f} {times['split']:9.2f} "
                  f"{times['dx alone']:9.2f} {times['grads']:9.2f} "
                  f"{times['split'] / times['fused']:11.3f}  " + "; ".join(checks))
        h.close()


if __name__ == "__main__":
    main()
