"""What each part of the fused cross-entropy and LayerNorm backward costs.

The reductions suite's fused rows on an H200 (2026-11-27, commit 43a71e0):
softmax over 8192x4096 at 86% of copy, but softmax cross-entropy with its
gradient, the same bytes, at 52% (129.7 us against 77.9), and LayerNorm's
backward at 59% over 8192x4096 and 14% over 4096x50257 (4472 us against
torch.compile's 1550).  This times, ours only, each program called on the
handler directly (no layer around it) and variants of it with one part
taken out, so that the difference says what that part costs:

* cross-entropy over labels: the layer (forward and backward, as the suite
  times it: the program, then ``sum_t`` of the rows' losses); the program;
  the program with its
  gradient as ``(e / s - hit) * inv_n``, a division an element (the layer
  takes ``e * (inv_n / s) - where(hit, inv_n, 0)``, one a row);
  without its labels check (``sqrt(sum(hit) - 1)``); without the loss (the
  gradient alone); softmax alone;
* LayerNorm's backward: the layer; the program (dx and the summed dgain
  and dbias); dx alone (no summed outputs); dgain and dbias alone
  (``layer_norm_param_grads``).

Inputs cycle beyond L2 (from DRAM); each variant's outputs are checked
against float64 NumPy.  Run on the GPU machine from the project root::

    python benchmarks/results/diagnostics/fused_terms.py
"""
import pathlib
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

REPS, CALLS = 10, 10
CE_SHAPES = [(8192, 4096), (32768, 1000)]
LN_SHAPES = [(8192, 4096), (32768, 1000), (4096, 50257)]
EPS = 1e-5


#: The layer's cross-entropy program over labels (layers/losses.py) but its
#: gradient, for the variants below.
CE_LABELS = ("m = max(y)\nhit = col <= t and t < col + 1\npicked = sum(where(hit, y, 0))\n"
             "e = exp(y - m)\ns = sum(e)\nloss = (log(s) - (picked - m) + "
             "sqrt(where(0 <= t and t < classes, 0, -1))) * inv_n\n")


def _ce_variants():
    """name -> (fused program, its outputs: "loss dy", "dy" or "p")."""
    from handlers import fused_op
    from handlers.fused_rows import SOFTMAX
    from layers.losses import _CROSS_ENTROPY
    head = "m = max(y)\ne = exp(y - m)\ns = sum(e)\nhit = col <= t and t < col + 1\n"
    grad = "dy = (e / s - hit) * inv_n\n"
    args = dict(inputs="y t:col #inv_n #classes", outputs="loss:col dy")
    return {
        "program": (_CROSS_ENTROPY[("labels", True)], "loss dy"),
        "program, dy = (e / s - hit) * n": (fused_op(
            "ce_divide", **args, body=CE_LABELS + "dy = (e / s - hit) * inv_n\n"), "loss dy"),
        "no labels check": (fused_op(
            "ce_no_check", inputs="y t:col #inv_n", outputs="loss:col dy",
            body=head + "loss = (log(s) - sum(where(hit, y - m, 0))) * inv_n\n" + grad),
            "loss dy"),
        "gradient only": (fused_op("ce_grad_only", inputs="y t:col #inv_n", outputs="dy",
                                   body=head + grad), "dy"),
        "softmax alone": (SOFTMAX, "p"),
    }


def _ln_variants():
    from handlers import fused_op
    from layers.layernorm import _BACKWARD, _PARAM_GRADS
    dx_only = fused_op("ln_dx_only", inputs="dy x gain:row mu:col r:col", outputs="dx", body="""
xhat = (x - mu) * r
g = dy * gain
dx = r * (g - mean(g) - xhat * mean(g * xhat))
""")
    return {"program": (_BACKWARD, "dx dg db"), "dx only": (dx_only, "dx"),
            "param grads only": (_PARAM_GRADS, "dg db")}


def _error(got, want):
    return float(np.max(np.abs(got - want)) / max(1e-30, float(np.max(np.abs(want)))))


def _line(name, us, nbytes, copy_Bps, err, tol):
    print(f"  {name:28s} {us:9.2f} ({nbytes / (us * 1e-6) / copy_Bps:.3f})  {err:.1e} "
          f"{'ok' if err < tol else 'WRONG'}")


def _time(timer, k, fn):
    return timer.measure(lambda i: fn(i % k), reps=REPS, warmup=2, inner=CALLS)["median"] * 1e3


def cross_entropy(h, timer, copy_Bps, rng):
    from benchmarks.ops import inputs_beyond_l2
    from layers import SoftmaxCrossEntropy
    variants = _ce_variants()
    for n, c in CE_SHAPES:
        y = rng.standard_normal((n, c)).astype(np.float32)
        labels = rng.integers(0, c, n)
        y64 = y.astype(np.float64)
        z = y64 - y64.max(axis=1, keepdims=True)
        p64 = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        loss64 = (np.log(np.exp(z).sum(axis=1)) - z[np.arange(n), labels]) / n
        dy64 = p64.copy()
        dy64[np.arange(n), labels] -= 1
        dy64 /= n
        want = {"loss": loss64.reshape(n, 1), "dy": dy64, "p": p64}
        k = inputs_beyond_l2(y.nbytes)
        ys = [h.create_from_numpy(y) for _ in range(k)]
        t = h.create_from_numpy(labels.astype(np.float32).reshape(n, 1))
        nbytes = 2 * n * c * 4
        print(f"\nsoftmax cross-entropy over labels, {(n, c)}: {k} inputs cycled; "
              f"us per call (fraction of copy on {nbytes / 1e6:.0f} MB), check")
        layer = SoftmaxCrossEntropy()
        layer.bind(h)

        def whole(i):
            layer.forward(ys[i], t)
            layer.backward()
        us = _time(timer, k, whole)
        layer.forward(ys[0], t)
        err = _error(h.get_numpy_copy(layer.backward()), dy64)
        _line("layer, forward + backward", us, nbytes, copy_Bps, err, 1e-5)
        for name, (op, outs) in variants.items():
            out = {o: h.allocate((n, 1) if o == "loss" else (n, c)) for o in outs.split()}
            if outs == "p":
                def call(i, op=op, out=out):
                    op(h, ys[i], out["p"])
            else:
                # the layer's program takes the classes too (its labels check)
                scalars = (1.0 / n, float(c)) if "classes" in op.scalars else (1.0 / n,)

                def call(i, op=op, out=out, outs=outs, scalars=scalars):
                    op(h, ys[i], t, *scalars, *(out[o] for o in outs.split()))
            us = _time(timer, k, call)
            call(0)
            err = max(_error(h.get_numpy_copy(a), want[o]) for o, a in out.items())
            _line(name, us, nbytes, copy_Bps, err, 1e-5)


def layer_norm_backward(h, timer, copy_Bps, rng):
    from benchmarks.ops import inputs_beyond_l2
    from layers import LayerNorm, ParameterSet
    variants = _ln_variants()
    for n, d in LN_SHAPES:
        x = rng.standard_normal((n, d)).astype(np.float32)
        dy = rng.standard_normal((n, d)).astype(np.float32)
        gain = (1 + 0.1 * rng.standard_normal((1, d))).astype(np.float32)
        x64, dy64, g64 = x.astype(np.float64), dy.astype(np.float64), gain.astype(np.float64)
        mu = x64.mean(axis=1, keepdims=True)
        r = 1 / np.sqrt(((x64 - mu) ** 2).mean(axis=1, keepdims=True) + EPS)
        xhat = (x64 - mu) * r
        g = dy64 * g64
        want = {"dx": r * (g - g.mean(axis=1, keepdims=True)
                           - xhat * (g * xhat).mean(axis=1, keepdims=True)),
                "dg": (dy64 * xhat).sum(axis=0, keepdims=True),
                "db": dy64.sum(axis=0, keepdims=True)}
        k = inputs_beyond_l2(dy.nbytes)
        dys = [h.create_from_numpy(dy) for _ in range(k)]
        hx, hg = h.create_from_numpy(x), h.create_from_numpy(gain)
        hmu = h.create_from_numpy(mu.astype(np.float32))
        hr = h.create_from_numpy(r.astype(np.float32))
        nbytes = 3 * n * d * 4
        print(f"\nLayerNorm backward, {(n, d)}: {k} inputs cycled; "
              f"us per call (fraction of copy on {nbytes / 1e6:.0f} MB), check")
        layer = LayerNorm(d, eps=EPS)
        layer.bind(h)
        ParameterSet(h, [layer])
        h.set_from_numpy(layer.params["gain"], gain)
        layer.forward(hx)
        us = _time(timer, k, lambda i: layer.backward(dys[i]))
        err = _error(h.get_numpy_copy(layer.backward(dys[0])), want["dx"])
        _line("layer backward", us, nbytes, copy_Bps, err, 1e-4)
        for name, (op, outs) in variants.items():
            out = {o: h.allocate((1, d) if o in ("dg", "db") else (n, d)) for o in outs.split()}
            if "dx" in out:
                def call(i, op=op, out=out, outs=outs):
                    op(h, dys[i], hx, hg, hmu, hr, *(out[o] for o in outs.split()))
            else:
                def call(i, op=op, out=out, outs=outs):
                    op(h, dys[i], hx, hmu, hr, *(out[o] for o in outs.split()))
            us = _time(timer, k, call)
            call(0)
            err = max(_error(h.get_numpy_copy(a), want[o]) for o, a in out.items())
            _line(name, us, nbytes, copy_Bps, err, 1e-4)


def main():
    from benchmarks.gpu import EventTimer, cuda_handler
    from benchmarks.ops import copy_spread
    h = cuda_handler("fused_terms", np.float32, what="tool")
    if h is None:
        return
    timer = EventTimer("pycuda", h.stream)
    copy_Bps = copy_spread(h, (128 << 20) // 4, 7)["median"]
    print(f"fused terms: copy {copy_Bps / 1e12:.3f} TB/s; median of {REPS} samples of "
          f"{CALLS} calls; check: max |error| / max |reference| against float64")
    rng = np.random.default_rng(41)
    cross_entropy(h, timer, copy_Bps, rng)
    layer_norm_backward(h, timer, copy_Bps, rng)


if __name__ == "__main__":
    main()
