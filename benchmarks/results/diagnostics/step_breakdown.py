"""Where the LeNet-style step and the mixed bfloat16 MLP step spend their time, op by op.

On an H200 our captured training steps are slower than torch.compile's whole
step captured in a CUDA graph: the LeNet-style step (``benchmarks/conv.py``,
batch 64, float32) 0.205 ms against 0.186 ms, and the mixed-precision MLP
(``benchmarks/half.py``: 3 layers 4096 wide, batch 4096, bfloat16 compute on a
twin of a float32 handler that holds the master parameters) 2.50 ms eager
against 1.81 ms.  The train suite's breakdown ("where a step's time goes")
gives four categories; this gives every op, to find those that hold the
steps back.

For each step, built with the suites' own functions (``conv._lenet`` and
``conv.lenet_batch`` in ``conv.training_step``'s closure; ``half._mlp_net``
with "bfloat16"), on one handler:

* the eager step and the step captured with ``Handler.capture``
  (``benchmarks.gpu.our_captured``), each a fresh copy of the model,
  interleaved, median of STEP_REPS between CUDA events on group 0;
* every op one step issues, recorded on a third copy built on a proxy of the
  handler (``benchmarks.train._Recorder``, extended here to follow twins and
  bound fused calls), after one warm-up step that allocates and binds.  The
  ops are grouped by (the handler that issued them, op name, arguments:
  shapes, scalars, flags), in the order first issued, each with its count per
  step.  Each group's calls of one step are captured in one graph, which is
  replayed alone: median of GROUP_REPS between events.  A group replays on
  inputs its last replay left in L2, so small ops time warmer than in the
  step;
* totals: the sum of the groups, all replayable ops of a step captured in
  order in one graph and replayed (serial, as the step's one stream runs
  them), and the captured step; the difference between the sum and the
  serial replay is what replaying apart changes (a graph launch each, warmer
  or colder caches), between the serial replay and the captured step what
  the recording left out (both are one graph of the same ops on group 0);
* calls that issue no device work (views, binds of fused ops, allocations,
  waits) are listed with their counts, as are groups whose capture fails
  ("not replayable", with the error), rather than failing the run.

In the MLP step every op is labelled with the twin that issued it: "bf16"
(the compute handler: the layers' products and epilogues, the casts into its
format) or "f32" (the master handler: the cast of the gradients into the
master format, the loss, which computes in float32, and the SGD update).
bfloat16 mixed precision has no loss scaler (float16 only): the script says
so rather than show an empty row.

Unlike ``benchmarks.train.record_step`` this records the fused ops that
layers run through bound calls (``FusedOp.bind``, ``layers.base.run_bound``):
the epilogues (bias + activation forward, derivative + bias gradient
backward), the loss's cross-entropy and the optimizer's update.  A bound
call is made once and then called at each step without going through the
handler's attributes, so train's recorder sees only the bind (at the first
step, or again at every step where an argument is a new view) and never the
launches.  A bind recorded here in the timed step is listed as host-only:
it is host time the eager step pays at every step.

Run by hand from the project root on a GPU machine:
``python benchmarks/results/diagnostics/step_breakdown.py`` (expected well
under 60 s on an H200: three copies of each model, their first steps'
cuDNN engine timing and kernel loads, and about 60 small graphs replayed 12
times each).  Needs the built library only (no PyTorch).
``--handler numpy`` runs the same code on NumpyHandler with tiny models and a
host clock (a smoke test of the script, no figures worth reading).
Its run: ``step_breakdown-NVIDIA-H200.log`` (2026-11-27).
``--models gpt-f32,gpt-bf16`` breaks down the gpt suite's step (issue 43)
instead: ``step_breakdown_gpt-NVIDIA-H200.log``.
"""
import argparse
import pathlib
import sys
import traceback
from collections import namedtuple

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from benchmarks import conv as C
from benchmarks import gpt as G
from benchmarks import half as HF
from benchmarks import train as T
from benchmarks.common import gpu_name, med, print_table
from benchmarks.gpu import interleaved, our_captured
from handlers import dtypes

#: samples of the eager and captured steps (interleaved), and of each replay
STEP_REPS, GROUP_REPS, WARMUP = 20, 10, 2
#: calls that issue no device work: train's (ordering, allocation, host
#: copies) and views, twins and binds, which only build host objects
HOST_ONLY = T.NOT_COMPUTE | {"view_t", "reshape_t", "twin", "with_streams", "bind"}
#: the tiny models of ``--handler numpy``
SMOKE_LENET = dict(C.LENET, batch=4)
SMOKE_MLP = dict(width=64, batch=32, layers=3, lr=1e-3)
#: the label of each handler of the mixed MLP step, by format
MIXED_LABELS = {"bfloat16": "bf16", "float32": "f32"}

#: one recorded call: the label and format of the handler that issued it,
#: the name and arguments shown, and what replays it (``fn(*args, **kwargs)``;
#: None for host-only calls)
Op = namedtuple("Op", "label dtype name shown fn args kwargs")


# ------------------------------------------------------------------ recording
class _Log:
    """The log a recorder appends to: turns train's entries (name, args,
    kwargs, phase) into :data:`Op` of the recorder's handler."""

    def __init__(self, ops, h, label):
        self.ops, self.h, self.label = ops, h, label

    def _add(self, name, shown, fn, args, kwargs):
        self.ops.append(Op(self.label, self.h.dtype, name, shown, fn, args, kwargs))

    def append(self, entry):
        name, args, kwargs, _ = entry
        fn = None if name in HOST_ONLY else getattr(self.h, name)
        if name == "_run_fused":          # an unbound fused op, op(h, *args): shown by name
            self._add(args[0].name, args[1], fn, args, kwargs)
        else:
            self._add(name, args, fn, args, kwargs)

    def bind(self, op):
        """The bind of fused op ``op``: host work only."""
        self._add("bind", (op.name,), None, (), {})

    def bound(self, op, args, fn):
        """A call of fused op ``op`` bound to ``args``, ``fn`` its bound call."""
        self._add(op.name, args, fn, (), {})


class Tracer(T._Recorder):
    """``benchmarks.train._Recorder`` (every op forwarded to the handler and
    logged), which also records what train's misses: a twin
    (mixed precision's compute handler, the loss's float32 twin) is another
    tracer of the same log, labelled by ``labels`` (format name -> label);
    a fused op's bound call logs each call, not only its bind."""

    def __init__(self, h, ops, labels):
        label = labels.get(h.dtype.name, h.dtype.name)
        super().__init__(h, _Log(ops, h, label), ["step"])
        self._ops, self._labels = ops, labels

    def twin(self, dtype):
        return Tracer(self._h.twin(dtype), self._ops, self._labels)

    def with_streams(self, k):
        return Tracer(self._h.with_streams(k), self._ops, self._labels)

    def _bind_fused(self, op, args, kwargs):
        # FusedOp.bind looks this hook up on the layer's handler: the bind
        # itself is host work (logged so), each call of what it returns a launch
        log = self._log
        log.bind(op)
        fn = self._h._bind_fused(op, args, kwargs)

        def call():
            log.bound(op, args, fn)
            fn()
        return call


def record(h, build, labels):
    """The ops of one step of ``build(handler)`` (which returns fn(i) of a
    step) on a copy built on a :class:`Tracer` of ``h``, after one warm-up
    step: ``(ops, step)``; keep ``step`` alive while the ops are replayed
    (its model holds the arrays they name)."""
    ops = []
    step = build(Tracer(h, ops, labels))
    step(0)                    # allocates the buffers, binds the fused ops
    del ops[:]
    step(1)
    return ops, step


# ------------------------------------------------------------------- the steps
def lenet_step(cfg):
    """build(h) of the LeNet-style step of ``conv.training_step``: its
    ``_lenet`` network and SGD on ``lenet_batch``, resident on the device."""
    def build(h):
        net, opt = C._lenet(h, cfg)
        x, y = C.lenet_batch(cfg)
        dx, dy = h.create_from_numpy(x), h.create_from_numpy(y)

        def step(i):           # as conv.training_step's closure
            net.train_step(dx, dy)
            opt.step()
        step.net = net
        return step
    return build


def gpt_step(cfg, precision):
    """build(h) of the gpt suite's step (``benchmarks/gpt.py``: its network,
    batches and SGD) in ``precision`` ("f32", or "bf16" mixed on a twin of
    the float32 handler ``h``)."""
    def build(h):
        net = G.build(h, cfg, precision)
        step = G.our_step(net, G.make_batches(cfg))
        step.net = net
        return step
    return build


def mlp_step(mlp):
    """build(h) of the half suite's mixed bfloat16 MLP step (``_mlp_net``);
    ``h`` is the float32 handler that holds the master parameters."""
    def build(h):
        net, step, _ = HF._mlp_net(h, "bfloat16", mlp)
        step.net = net
        return step
    return build


# --------------------------------------------------------------------- timing
def describe(op):
    """The arguments of a call as shown and grouped: array shapes (with the
    format where it is not the issuing handler's), scalars, flags."""
    def one(a):
        shape = getattr(a, "shape", None)
        if shape is not None and hasattr(a, "dtype"):
            text = "x".join(str(s) for s in shape) or "()"
            return text if a.dtype == op.dtype else f"{text} {dtypes.short_name(a.dtype)}"
        if isinstance(a, float):
            return f"{a:g}"
        return repr(a)
    parts = [one(a) for a in op.shown]
    parts += [f"{k}={one(v)}" for k, v in op.kwargs.items()]
    return ", ".join(parts)


def issuer(ops):
    """fn() issuing ``ops`` in order, each as recorded (on its own handler,
    bound calls through their bound function)."""
    calls = [(op.fn, op.args, op.kwargs) for op in ops]

    def issue():
        for fn, args, kwargs in calls:
            fn(*args, **kwargs)
    return issue


def graph_ms(h, timer, ops, reps):
    """Median ms of one replay of ``ops`` captured in one graph; raises
    what the capture raises (an op that cannot be captured)."""
    graph = h.capture(issuer(ops))
    return timer.time(lambda i: graph.replay(), reps=reps, warmup=WARMUP)


def breakdown(h, timer, build, labels, step_reps, reps):
    """Time the step of ``build`` eager and captured (``step_reps`` samples),
    then each group of its ops alone and all its ops serially (``reps``
    replays each); print the tables."""
    eager = build(h)
    captured = our_captured(h, build(h))
    ms = interleaved({"eager": (timer, eager), "captured": (timer, captured)}, reps=step_reps)
    step_eager, step_cap = med(ms["eager"]), med(ms["captured"])
    scaler = getattr(eager.net, "loss_scaler", None)
    print(f"eager step {step_eager:.4f} ms, captured step {step_cap:.4f} ms "
          f"(median of {step_reps}, interleaved)")

    ops, keep = record(h, build, labels)
    device = [op for op in ops if op.name not in HOST_ONLY]
    host = [op for op in ops if op.name in HOST_ONLY]
    groups = {}
    for op in device:
        groups.setdefault((op.label, op.name, describe(op)), []).append(op)
    print(f"{len(ops)} calls per step: {len(device)} ops in {len(groups)} groups, "
          f"{len(host)} host-only")

    rows, failed, total = [], [], 0.0
    for (label, name, args), group in groups.items():
        try:
            t = graph_ms(h, timer, group, reps)
        except Exception as e:     # cannot be captured: listed, not timed
            failed.append((label, name, args, len(group), f"{type(e).__name__}: {e}"))
            continue
        total += t
        rows.append([label, name, args, len(group), t, 1e3 * t / len(group),
                     f"{100 * t / step_cap:.1f}%"])
    print_table(["on", "op", "arguments", "per step", "ms", "us / call", "% of captured"],
                rows)
    replayable = [op for op in device
                  if (op.label, op.name, describe(op)) not in {f[:3] for f in failed}]
    totals = [["sum of the groups, each replayed alone", len(replayable), total,
               f"{100 * total / step_cap:.1f}%"]]
    try:
        serial = graph_ms(h, timer, replayable, reps)
        totals.append(["all ops of a step in one graph, serially", len(replayable), serial,
                       f"{100 * serial / step_cap:.1f}%"])
    except Exception as e:        # every group captured alone, yet not all together
        totals.append(["all ops of a step in one graph, serially", len(replayable),
                       float("nan"), f"failed: {type(e).__name__}: {e}"])
    totals += [["captured step", len(device), step_cap, "100.0%"],
               ["eager step", len(device), step_eager, f"{100 * step_eager / step_cap:.1f}%"]]
    print()
    print_table(["total", "ops", "ms", "% of captured"], totals)
    if failed:
        print("\nnot replayable (left out of the totals above):")
        print_table(["on", "op", "arguments", "per step", "why"], failed)
    if host:
        counts = {}
        for op in host:
            key = (op.label, op.name, op.shown[0] if op.name == "bind" else "")
            counts[key] = counts.get(key, 0) + 1
        print("\nhost-only calls (no device work: not replayed):")
        print_table(["on", "call", "of", "per step"],
                    [[*k, n] for k, n in counts.items()])
    if labels is MIXED_LABELS:
        print(f"loss scaler: {'none (bfloat16 needs none)' if scaler is None else scaler}")
    del keep


# ----------------------------------------------------------------------- main
def main(argv=None):
    """Parse the options, then break down each step, errors printed."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="lenet,mlp",
                   help="comma-separated steps to break down: lenet, mlp, gpt-f32, "
                        "gpt-bf16 (default: lenet,mlp)")
    p.add_argument("--handler", choices=("pycuda", "numpy"), default="pycuda",
                   help="pycuda (default; the figures) or numpy (tiny models, host clock: "
                        "a smoke test)")
    args = p.parse_args(argv)
    h, timer, reason = T.make_handler(args.handler)
    if h is None:
        print(f"step_breakdown: skipped, this tool needs a GPU ({reason}); "
              f"'--handler numpy' runs it on NumpyHandler")
        return 0
    gpu = args.handler == "pycuda"
    step_reps, reps = (STEP_REPS, GROUP_REPS) if gpu else (3, 3)
    lenet = C.LENET if gpu else SMOKE_LENET
    mlp = HF.MLP if gpu else SMOKE_MLP
    print(f"{gpu_name() if gpu else 'CPU'}; {type(h).__name__}; "
          f"{'CUDA events' if gpu else 'host clock'}")
    gpt = G.CFG if gpu else G.SMALL
    gpt_title = ("GPT step (benchmarks/gpt.py), {blocks} blocks, width {d}, {heads} heads, "
                 "context {context}, batch {batch}, ").format(**gpt)
    steps = {
        "lenet": (f"LeNet-style step (benchmarks/conv.py), batch {lenet['batch']}, float32",
                  lenet_step(lenet), {"float32": "f32"}),
        "mlp": (f"mixed bf16 MLP step (benchmarks/half.py), {mlp['layers']} layers "
                f"{mlp['width']} wide, batch {mlp['batch']}", mlp_step(mlp), MIXED_LABELS),
        "gpt-f32": (gpt_title + "float32", gpt_step(gpt, "f32"), {"float32": "f32"}),
        "gpt-bf16": (gpt_title + "bfloat16 mixed", gpt_step(gpt, "bf16"), MIXED_LABELS),
    }
    for name in args.models.split(","):
        if name not in steps:
            p.error(f"unknown step {name!r}: choose from {', '.join(steps)}")
    for title, build, labels in (steps[name] for name in args.models.split(",")):
        print(f"\n== {title} ==", flush=True)
        try:
            breakdown(h, timer, build, labels, step_reps, reps)
        except Exception:         # one model's failure: printed, the next one runs
            traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
