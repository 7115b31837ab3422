"""``python -m benchmarks train``: samples per second of a training step.

Models, float32:

* MLP 784-1024-1024-10 (ReLU), softmax cross-entropy, batch 256;
* LSTM T=32, B=64, F=128, H=512, its last hidden state into a 512-10 fully
  connected layer, softmax cross-entropy.

A step is forward, loss, backward and the SGD-with-momentum update, with the
batches resident on the device (two, alternated).  Measured in one process on
PyCudaHandler (CUDA events on the handler's group-0 stream, which waits for
the other groups at the end of a step) and on the same models in PyTorch eager
(TF32 off; the LSTM as the same cell written out step by step, plus
``torch.nn.LSTM`` on cuDNN as a reference).

Where the step's time goes: one step's ops are recorded, then replayed by
category on stream group 0 (gemm, elementwise, ``sum_t`` (bias gradients and
the loss), the optimizer's update) and timed.  The replays run serially and
back to back, so their sum differs from the step's time by what launches,
stream overlap and idle gaps add or save.

Without a GPU this prints that it skipped and returns 0; ``--handler numpy``
times NumpyHandler instead (host clock; no peers), and ``--small`` shrinks the
models (smoke tests).
"""
import argparse
import statistics
import time

import numpy as np

from benchmarks.common import gpu_name, print_table, result_name, save_results
from benchmarks.gpu import EventTimer, optional_peers
from layers import LSTM, SGD, FullyConnected, ReLU, Sequential, SoftmaxCrossEntropy

F32 = np.float32
MODELS = {
    # name: (sizes, small sizes)
    "mlp": ({"batch": 256, "sizes": (784, 1024, 1024, 10)},
            {"batch": 16, "sizes": (32, 48, 48, 10)}),
    "lstm": ({"T": 32, "B": 64, "F": 128, "H": 512, "classes": 10},
             {"T": 4, "B": 8, "F": 16, "H": 24, "classes": 10}),
}
#: op name -> category of the breakdown (anything else is "elementwise")
CATEGORY = {"dot_mm": "gemm", "dot_add_mm": "gemm", "sum_t": "sum_t (bias, loss)"}
#: ops that order or allocate rather than compute: not replayed
NOT_COMPUTE = {"record_event", "wait_event", "wait_for", "synchronize",
               "synchronize_all_streams", "with_streams", "allocate", "zeros", "ones",
               "create_from_numpy", "get_numpy_copy", "set_from_numpy"}


# -------------------------------------------------------------------- models
def build(h, model, cfg, seed=0):
    """(network, host batches (x, y) x 2, samples per step) of ``model``."""
    rng = np.random.default_rng(seed)
    if model == "mlp":
        s = cfg["sizes"]
        layers = [FullyConnected(s[0], s[1]), ReLU(), FullyConnected(s[1], s[2]), ReLU(),
                  FullyConnected(s[2], s[3])]
        n = cfg["batch"]
        xs = [rng.standard_normal((n, s[0])) for _ in range(2)]
        classes = s[3]
    else:
        T, B, F, H = cfg["T"], cfg["B"], cfg["F"], cfg["H"]
        layers = [LSTM(F, H, return_sequences=False), FullyConnected(H, cfg["classes"])]
        n = B
        xs = [rng.standard_normal((T, B, F)) for _ in range(2)]
        classes = cfg["classes"]
    ys = [rng.integers(0, classes, (n, 1)).astype(np.float64) for _ in range(2)]
    net = Sequential(h, layers, SoftmaxCrossEntropy(), seed=seed)
    return net, list(zip(xs, ys)), n


def handler_step(h, net, batches):
    """fn(i): one training step on resident batch i % 2."""
    opt = SGD(net.parameters, lr=0.01, momentum=0.9)
    dev = [(h.create_from_numpy(x), h.create_from_numpy(y)) for x, y in batches]

    def step(i):
        x, y = dev[i % len(dev)]
        net.train_step(x, y)
        opt.step()
    return step


def torch_steps(torch, model, cfg, batches):
    """{label: fn(i)} of PyTorch eager training steps of the same model."""
    nn = torch.nn
    dev = "cuda"
    tb = [(torch.tensor(x, dtype=torch.float32, device=dev),
           torch.tensor(y[:, 0], dtype=torch.long, device=dev)) for x, y in batches]
    loss_fn = nn.CrossEntropyLoss()
    out = {}

    def stepper(params, forward):
        opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)

        def step(i):
            x, y = tb[i % len(tb)]
            opt.zero_grad(set_to_none=True)
            loss_fn(forward(x), y).backward()
            opt.step()
        return step

    if model == "mlp":
        s = cfg["sizes"]
        m = nn.Sequential(nn.Linear(s[0], s[1]), nn.ReLU(), nn.Linear(s[1], s[2]), nn.ReLU(),
                          nn.Linear(s[2], s[3])).to(dev)
        out["PyTorch eager"] = stepper(m.parameters(), m)
        return out
    T, B, F, H, C = cfg["T"], cfg["B"], cfg["F"], cfg["H"], cfg["classes"]
    Wx = nn.Parameter(torch.randn(F, 4 * H, device=dev) * 0.05)
    Wh = nn.Parameter(torch.randn(H, 4 * H, device=dev) * 0.05)
    b = nn.Parameter(torch.zeros(4 * H, device=dev))
    fc = nn.Linear(H, C).to(dev)

    def cell_forward(x):
        # The same cell, written out: input projection of all steps at once,
        # then one fused (B, 4H) gemm per step.
        xp = (x.reshape(T * B, F) @ Wx + b).view(T, B, 4 * H)
        h = torch.zeros(B, H, device=dev)
        c = torch.zeros(B, H, device=dev)
        for t in range(T):
            z = xp[t] + h @ Wh
            i, f, g, o = z.chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        return fc(h)
    out["PyTorch eager"] = stepper([Wx, Wh, b, *fc.parameters()], cell_forward)
    lstm = nn.LSTM(F, H).to(dev)
    fc2 = nn.Linear(H, C).to(dev)
    out["torch.nn.LSTM (cuDNN)"] = stepper([*lstm.parameters(), *fc2.parameters()],
                                           lambda x: fc2(lstm(x)[0][-1]))
    return out


# ------------------------------------------------------------------ recording
class _Recorder:
    """Forwards every op to a handler (view) and appends (name, args, kwargs,
    phase) to a shared log; ``with_streams`` returns a recorder of the view."""

    def __init__(self, h, log, phase):
        self._h, self._log, self._phase = h, log, phase

    def __getattr__(self, name):
        attr = getattr(self._h, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            args = tuple(a._h if isinstance(a, _Recorder) else a for a in args)
            self._log.append((name, args, kwargs, self._phase[0]))
            out = attr(*args, **kwargs)
            if name == "with_streams":
                return _Recorder(out, self._log, self._phase)
            return out
        return call


def record_step(h, model, cfg):
    """The compute ops of one training step: [(category, name, args, kwargs)].

    A second copy of the model runs on a recording handler, so the timed
    model pays nothing for the recording."""
    log, phase = [], ["step"]
    rec = _Recorder(h, log, phase)
    net, batches, _ = build(rec, model, cfg)
    opt = SGD(net.parameters, lr=0.01, momentum=0.9)
    dev = [(h.create_from_numpy(x), h.create_from_numpy(y)) for x, y in batches]
    net.train_step(*dev[0])          # first call allocates; record the second
    del log[:]
    net.train_step(*dev[1])
    phase[0] = "update"
    opt.step()
    ops = []
    for name, args, kwargs, ph in log:
        if name in NOT_COMPUTE:
            continue
        cat = "update" if ph == "update" else CATEGORY.get(name, "elementwise")
        ops.append((cat, name, args, kwargs))
    return ops, (net, dev)           # keep the recorded arrays alive


def replay(h, ops):
    """fn(i) that issues ``ops`` again, all on ``h`` (group 0)."""
    calls = [(getattr(h, name), args, kwargs) for _, name, args, kwargs in ops]

    def run(i):
        for fn, args, kwargs in calls:
            fn(*args, **kwargs)
    return run


# ------------------------------------------------------------------- timing
class HostTimer:
    """Median host time (ms) per call, for handlers that run ops at once."""

    def __init__(self, h):
        self.h = h

    def time(self, fn, reps=20, warmup=3, inner=1):
        for i in range(warmup):
            fn(i)
        times = []
        i = 0
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn(i)
                i += 1
            self.h.synchronize_all_streams()
            times.append((time.perf_counter() - t0) * 1e3 / inner)
        return statistics.median(times)


def host_ms(h, fn, reps):
    """Host wall time (ms) per call when calls are issued back to back."""
    fn(0)
    h.synchronize_all_streams()
    t0 = time.perf_counter()
    for i in range(reps):
        fn(i)
    h.synchronize_all_streams()
    return (time.perf_counter() - t0) * 1e3 / reps


# --------------------------------------------------------------------- main
def make_handler(choice):
    """(handler, timer, None) or (None, None, reason to skip)."""
    if choice == "numpy":
        from handlers import NumpyHandler
        h = NumpyHandler(F32)
        return h, HostTimer(h), None
    try:
        from handlers import PyCudaHandler
        h = PyCudaHandler(F32)
    except (ImportError, RuntimeError) as e:
        return None, None, f"{type(e).__name__}: {e}"
    return h, EventTimer("pycuda", h.stream), None


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--handler", choices=("pycuda", "numpy"), default="pycuda",
                   help="pycuda (default; skips without a GPU) or numpy")
    p.add_argument("--models", default="mlp,lstm", help="comma separated: mlp, lstm")
    p.add_argument("--small", action="store_true", help="tiny models (smoke test)")
    p.add_argument("--reps", type=int, default=20, help="timed repeats; the median counts")
    p.add_argument("--save", action="store_true",
                   help="write benchmarks/results/train-<device>.json")
    args = p.parse_args(argv)
    h, timer, reason = make_handler(args.handler)
    if h is None:
        print(f"train: skipped, this suite needs a GPU (PyCudaHandler unavailable: {reason}); "
              f"'--handler numpy' times NumpyHandler instead")
        return 0
    peers = optional_peers() if args.handler == "pycuda" else {}
    torch = peers.get("torch")
    device = gpu_name() if args.handler == "pycuda" else "CPU"
    print(f"training step, float32, {device}; {type(h).__name__}"
          f"{' vs PyTorch eager (TF32 off)' if torch else ' (PyTorch not available)'}; "
          f"median of {args.reps}")
    reps = args.reps
    rows, breakdown, results = [], [], {"device": device, "models": {}}
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        cfg = MODELS[model][1 if args.small else 0]
        net, batches, n = build(h, model, cfg)
        step = handler_step(h, net, batches)
        ms = timer.time(step, reps=reps)
        wall = host_ms(h, step, reps)
        desc = ", ".join(f"{k}={v}" for k, v in cfg.items())
        entry = {"config": cfg, "samples": n,
                 "ours": {"ms": ms, "samples_per_s": n / ms * 1e3, "host_ms": wall}}
        peer_ms = {}
        if torch is not None:
            for label, fn in torch_steps(torch, model, cfg, batches).items():
                peer_ms[label] = EventTimer("torch", module=torch).time(fn, reps=reps)
            entry["torch"] = {k: {"ms": v, "samples_per_s": n / v * 1e3}
                              for k, v in peer_ms.items()}
        eager = peer_ms.get("PyTorch eager")
        rows.append((model, type(h).__name__, ms, n / ms * 1e3, wall,
                     f"{eager / ms:.2f}x" if eager else "-"))
        for label, v in peer_ms.items():
            rows.append((model, label, v, n / v * 1e3, "-", f"{eager / v:.2f}x"))

        ops, keep = record_step(h, model, cfg)
        cats = {}
        for op in ops:
            cats.setdefault(op[0], []).append(op)
        parts = {c: timer.time(replay(h, o), reps=max(3, reps // 2)) for c, o in cats.items()}
        serial = timer.time(replay(h, ops), reps=max(3, reps // 2))
        entry["breakdown_ms"] = parts
        entry["breakdown_serial_ms"] = serial
        for c in ("gemm", "elementwise", "sum_t (bias, loss)", "update"):
            if c in parts:
                breakdown.append((model, c, len(cats[c]), parts[c], f"{100 * parts[c] / ms:.0f}%"))
        breakdown.append((model, "all ops, serial on group 0", len(ops), serial,
                          f"{100 * serial / ms:.0f}%"))
        results["models"][model] = entry
        del keep
        # When issuing the ops takes as long as the device span, the device
        # waits on the host: fewer, larger ops would pay, faster kernels not.
        line = f"  {model}: {desc}; {len(ops)} ops per step"
        if args.handler == "pycuda":
            bound = "launch-bound" if wall >= 0.9 * ms else "device-bound"
            line += f"; host issue {wall:.3g} ms vs device span {ms:.3g} ms: {bound}"
        print(line)

    print()
    print_table(["model", "library", "ms / step", "samples / s", "host ms / step",
                 "speed vs PyTorch eager"], rows)
    print()
    print("where a step's time goes (each category replayed alone, serially):")
    print_table(["model", "category", "ops", "ms", "% of step"], breakdown)
    if args.save:
        print("saved", save_results(result_name("train", device), results))
    return 0
