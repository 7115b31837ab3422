"""Where the fused-row layers' time goes beyond their one kernel.

The reductions suite times ``SoftmaxCrossEntropy`` (forward and gradient)
and ``LayerNorm`` (forward; backward) as a user calls them, back to back
between CUDA events.  At 55c5ca8 (H200) the cross-entropy took 110.2 us over
8192x4096 where ``held_counts`` times its fused program alone at 84-87 us:
the layer also sums the rows' losses (``sum_t``), and its Python path runs
on the host between launches.  This times, per layer and shape, inputs
cycled beyond the L2:

* ``eager``: the layer's calls back to back, as the suite does (each
  sample's first call is issued after its start event, so the device
  waits for the host to issue it);
* ``lead``: the same with one more call issued before each sample's start
  event, untimed: the device is busy with it while the host issues the
  timed calls, as in a long loop;
* ``captured``: the same calls recorded once per input as a CUDA graph and
  replayed back to back (no host work between the kernels);
* ``program``: the layer's fused program alone, captured the same way
  (cross-entropy only: ``_run``);
* ``host``: the host's time to issue one eager call, the device not waited
  for (perf_counter over 50 calls, then one synchronize).

Each result is checked against float64 NumPy.  Run on the GPU machine from
the project root::

    python benchmarks/results/diagnostics/layer_rows_path.py
"""
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import variants  # noqa: E402  (this folder's, beside the script)

from benchmarks.gpu import EventTimer, cuda_handler  # noqa: E402
from benchmarks.ops import inputs_beyond_l2  # noqa: E402

REPS, CALLS = 10, 10
SHAPES = [(8192, 4096), (32768, 1000)]


class LeadTimer(EventTimer):
    """An EventTimer whose samples each issue one untimed call first."""

    def sample(self, fn, i=0, inner=1):
        fn(i)
        return super().sample(fn, i + 1, inner)


def _copy_Bps(h, timer):
    src, dst = h.allocate((32 << 20,)), h.allocate((32 << 20,))
    ms = timer.measure(lambda i: h.copy_to(src, dst), reps=REPS, warmup=2, inner=CALLS)
    return 2 * src.nbytes / (ms["median"] * 1e-3)


def _times(h, timer, calls, graphs, programs=None):
    """{what: us} of the eager calls, their captured graphs, the program's
    graphs (optional), and the host time per eager call."""
    k = len(calls)
    out = {"eager": timer.measure(lambda i: calls[i % k](), reps=REPS, warmup=2,
                                  inner=CALLS)["median"] * 1e3,
           "lead": LeadTimer("pycuda", h.stream).measure(
               lambda i: calls[i % k](), reps=REPS, warmup=2, inner=CALLS)["median"] * 1e3,
           "captured": timer.measure(lambda i: graphs[i % k].replay(), reps=REPS, warmup=2,
                                     inner=CALLS)["median"] * 1e3}
    if programs:
        out["program"] = timer.measure(lambda i: programs[i % k].replay(), reps=REPS,
                                       warmup=2, inner=CALLS)["median"] * 1e3
    h.synchronize()
    start = time.perf_counter()
    for i in range(50):
        calls[i % k]()
    out["host"] = (time.perf_counter() - start) / 50 * 1e6
    h.synchronize()
    return out


def cross_entropy(h, n, c, rng):
    from layers import SoftmaxCrossEntropy
    y = rng.standard_normal((n, c)).astype(np.float32)
    labels = rng.integers(0, c, n)
    k = inputs_beyond_l2(y.nbytes)
    loss = SoftmaxCrossEntropy()
    loss.bind(h)
    ys = [h.create_from_numpy(y) for _ in range(k)]
    t = h.create_from_numpy(labels.astype(np.float32).reshape(n, 1))

    def call(i):
        loss.forward(ys[i], t)
        return loss.backward()
    calls = [lambda i=i: call(i) for i in range(k)]
    for f in calls:
        f()
    graphs = [h.capture(f) for f in calls]

    def program(i):
        loss.forward(ys[i], t)   # sets the layer's logits to ys[i]
        return lambda: loss._run(True)
    programs = [h.capture(program(i)) for i in range(k)]
    # check the last captured replay: mean loss and dL/dy against float64
    graphs[0].replay()
    y64 = y.astype(np.float64)
    e = np.exp(y64 - y64.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    ref_loss = -np.log(p[np.arange(n), labels]).mean()
    p[np.arange(n), labels] -= 1
    got = h.get_numpy_copy(loss.backward()).astype(np.float64)
    err = max(abs(float(h.get_numpy_copy(loss._b.loss)[0]) - ref_loss) / abs(ref_loss),
              float(np.abs(got - p / n).max() / np.abs(p / n).max()))
    moved = (2 * n * c + n + 1) * 4
    return _times(h, timer_of(h), calls, graphs, programs), err, moved


def layer_norm(h, n, d, rng, backward):
    from layers import LayerNorm, ParameterSet
    x = rng.standard_normal((n, d)).astype(np.float32)
    gain = rng.standard_normal((1, d)).astype(np.float32)
    bias = rng.standard_normal((1, d)).astype(np.float32)
    dy = rng.standard_normal((n, d)).astype(np.float32)
    layer = LayerNorm(d, eps=1e-5)
    layer.bind(h)
    ParameterSet(h, [layer])
    h.set_from_numpy(layer.params["gain"], gain)
    h.set_from_numpy(layer.params["bias"], bias)
    k = inputs_beyond_l2(x.nbytes)
    if backward:
        layer.forward(h.create_from_numpy(x))
        dys = [h.create_from_numpy(dy) for _ in range(k)]
        calls = [lambda i=i: layer.backward(dys[i]) for i in range(k)]
    else:
        xs = [h.create_from_numpy(x) for _ in range(k)]
        calls = [lambda i=i: layer.forward(xs[i]) for i in range(k)]
    for f in calls:
        f()
    graphs = [h.capture(f) for f in calls]
    graphs[0].replay()
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=1, keepdims=True)
    r = 1 / np.sqrt(x64.var(axis=1, keepdims=True) + 1e-5)
    xhat = (x64 - mu) * r
    if backward:
        ref = variants.layer_norm_backward64(dy, x, gain, mu, r)[0]
        got = h.get_numpy_copy(layer.backward(dys[0]))
        moved = (3 * n * d + 3 * d + 2 * n) * 4
    else:
        ref = xhat * gain + bias
        got = h.get_numpy_copy(layer.forward(xs[0]))
        moved = (2 * n * d + 2 * d) * 4
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    return _times(h, timer_of(h), calls, graphs), err, moved


_TIMERS = {}


def timer_of(h):
    return _TIMERS.setdefault(id(h), EventTimer("pycuda", h.stream))


def main():
    h = cuda_handler("layer_rows_path", np.float32, what="tool")
    if h is None:
        return
    copy = _copy_Bps(h, timer_of(h))
    rng = np.random.default_rng(0)
    print(f"fused-row layers: us per call, median of {REPS} samples of {CALLS} calls, inputs "
          f"from DRAM; of copy: minimal bytes at the device copy's {copy / 1e12:.3f} TB/s; "
          f"host: us to issue one eager call")
    print(f"{'layer':24s} {'shape':14s} {'eager':>8s} {'lead':>8s} {'captured':>9s} "
          f"{'program':>8s} "
          f"{'host':>7s} {'eager/copy':>10s} {'capt/copy':>9s} {'error':>8s}")
    cases = [("cross-entropy f+g", lambda n, c: cross_entropy(h, n, c, rng)),
             ("LayerNorm forward", lambda n, c: layer_norm(h, n, c, rng, False)),
             ("LayerNorm backward", lambda n, c: layer_norm(h, n, c, rng, True))]
    for name, case in cases:
        for n, c in SHAPES:
            t, err, moved = case(n, c)
            frac = [moved / (t[w] * 1e-6) / copy for w in ("eager", "captured")]
            prog = f"{t['program']:8.1f}" if "program" in t else f"{'-':>8s}"
            print(f"{name:24s} {str((n, c)):14s} {t['eager']:8.1f} {t['lead']:8.1f} "
                  f"{t['captured']:9.1f} "
                  f"{prog} {t['host']:7.1f} {frac[0]:10.1%} {frac[1]:9.1%} {err:8.1e}"
                  + ("" if err < 1e-4 else "  BAD"), flush=True)
    h.close()


if __name__ == "__main__":
    main()
