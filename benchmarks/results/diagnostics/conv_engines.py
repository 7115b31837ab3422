"""Walk cuDNN's engines for the conv suite's backward passes, float32.

A diagnostic, not a suite (``python benchmarks/results/diagnostics/
conv_engines.py`` on a GPU machine with PyTorch): for each layer (the two
LeNet layers, the first ResNet-block layer), pass (1 backward data, 2
backward filter) and ``deterministic`` setting, plan the convolution, time
the engine chosen and measure its error; then deny that engine (through
``handlers.cuda.convolution.DENIED_ENGINES``) and plan again, until cuDNN
offers no more.  The error is the largest of |ours - float64| / (2^-24 *
sum of the products' magnitudes): a float32 sum of positive terms in any
order stays near or below 1; the same pass on the absolute values gives
the denominators.

``conv_engines-NVIDIA-H200.log`` here is its output at commit 6e16483 (the
code of ab5ef54), where a plan keeps the fastest of the first six engines
the policy allows, so each walk lists engines fastest first.  (A first
version of this walk at a1ada5e, when a plan took the heuristics' first
allowed engine, listed them in the heuristics' order; for the ResNet layer's
backward filter: 17, 1, 0, FFT engine 18, 67.)  The log shows why
backward-filter engine 17 is denied (an error of 506 at the first LeNet
layer, 16.4 at the ResNet layer) and why the choice is timed: FFT engine
18, ranked behind slow engines, is the fastest accurate one.  One anomaly
this log shows and nobody has explained yet: the deterministic walk of the
ResNet layer's backward filter never met engine 18 (the non-deterministic
walk did, first), yet the conv suite's deterministic handler chose 18 for
that layer in every run.  The walk makes a fresh handler per step and closes
none; whether cuDNN ranks differently with less free memory is a guess.
"""
import numpy as np
import torch

import handlers.cuda.convolution as cm
from handlers.cuda.convolution import cudnn_note_names
from handlers.cuda.handler import PyCudaHandler

U32 = 2.0 ** -24
#: layer: (x shape, w shape, padding)
CASES = {"lenet1": ((64, 1, 28, 28), (6, 1, 5, 5), 0),
         "lenet2": ((64, 6, 12, 12), (16, 6, 5, 5), 0),
         "resnet": ((64, 64, 56, 56), (64, 64, 3, 3), 1)}


def walk(case, kind, deterministic, x, w, dy, ref, mag, pad):
    """Print each engine cuDNN offers for one pass, best first, denying each."""
    denied, saved = [], dict(cm.DENIED_ENGINES)
    try:
        for _ in range(8):
            cm.DENIED_ENGINES = {**saved, kind: tuple(denied)}
            h = PyCudaHandler(np.float32, seed=0, deterministic=deterministic)
            a, b, wd = h.create_from_numpy(x), h.create_from_numpy(dy), h.create_from_numpy(w)
            out = h.allocate(w.shape if kind == 2 else x.shape)

            def run():
                if kind == 1:
                    h.conv2d_backward_data(b, wd, out, 1, pad)
                else:
                    h.conv2d_backward_filter(a, b, out, 1, pad)
            try:
                run()
            except RuntimeError as e:
                print(f"{case} kind {kind} det {deterministic}: no more engines ({str(e)[:60]})")
                return
            engine, notes = [(p[2], p[3]) for k, p in h._conv_plans.items() if k[0] == kind][0]
            stream = torch.cuda.ExternalStream(int(h.stream.handle))
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            times = []
            for _ in range(7):
                start.record(stream)
                for _ in range(10):
                    run()
                end.record(stream)
                end.synchronize()
                times.append(start.elapsed_time(end) / 10)
            got = torch.from_numpy(h.get_numpy_copy(out).astype(np.float64)).cuda()
            err = ((got - ref).abs() / (U32 * mag)).max().item()
            print(f"{case} kind {kind} det {deterministic}: engine {engine:3d} "
                  f"{cudnn_note_names(notes)} {np.median(times[2:]):.4f} ms  "
                  f"err/(u32 sum|t|) {err:.1f}", flush=True)
            denied.append(engine)
    finally:
        cm.DENIED_ENGINES = saved


def main():
    torch.backends.cudnn.allow_tf32 = False
    rng = np.random.default_rng(2)
    for case, (xs, ws, pad) in CASES.items():
        ys = (xs[0], ws[0], xs[2] - ws[2] + 1 + 2 * pad, xs[3] - ws[3] + 1 + 2 * pad)
        x, w, dy = (rng.uniform(-1, 1, s).astype(np.float32) for s in (xs, ws, ys))
        X, W, DY = (torch.from_numpy(v.astype(np.float64)).cuda() for v in (x, w, dy))
        refs = {1: (torch.nn.grad.conv2d_input(xs, W, DY, padding=pad),
                    torch.nn.grad.conv2d_input(xs, W.abs(), DY.abs(), padding=pad)),
                2: (torch.nn.grad.conv2d_weight(X, ws, DY, padding=pad),
                    torch.nn.grad.conv2d_weight(X.abs(), ws, DY.abs(), padding=pad))}
        for kind in (1, 2):
            for deterministic in (True, False):
                walk(case, kind, deterministic, x, w, dy, *refs[kind], pad)


if __name__ == "__main__":
    main()
