"""``python -m benchmarks half``: bfloat16 on the GPU against PyTorch (issue 21).

Sections, measured in one process on one GPU, each library timed in
interleaved order (:func:`benchmarks.gpu.interleaved`), every result checked
against NumPy in float64 (``checks`` in the saved run):

* elementwise ops on 64M bfloat16 elements against the device-to-device copy
  bandwidth, every library credited with the same minimal bytes (inputs read
  once, the output written once); target >= 85% of copy;
* ``dot_mm`` at 1024^3 and 4096^3 against ``torch.matmul`` in bfloat16 (both
  on tensor cores, accumulating in float32); target >= 0.95x PyTorch's speed;
* ``sum_t`` on bfloat16 (accumulating in float32); target >= 70% of copy.
  Each case cycles through enough inputs to hold twice the L2 cache, so it
  is timed from DRAM, as the copy is.  Beside the bias-gradient shape, the
  bound on any sum of its bytes: a kernel that only reads them, launched the
  same way (``benchmarks.ops.read_only_ms``);
* a compute-bound MLP training step (4096 wide, batch 4096, SGD): our
  mixed-precision step (bfloat16 compute on a PyCudaHandler twin, float32
  master parameters, ``precision="bf16"``) against our float32 step and
  against PyTorch eager under ``torch.autocast(bfloat16)`` (float32
  parameters); targets >= 2x our float32 step and >= 1.0x PyTorch.  Our
  loss computes in float32 on the cast logits, with float32 labels (4096
  classes: bfloat16 labels would name other classes), as autocast runs
  ``log_softmax`` and ``nll_loss`` in float32.  Printed
  beside them, without targets: our step with bfloat16 parameters (no master
  copy) and PyTorch's like it, and the float16 steps with dynamic loss
  scaling (ours decided on the device; PyTorch's ``GradScaler``).  Also
  without targets, the compiled peers of the mixed bfloat16 step
  (``--peers``, both by default; :mod:`benchmarks.peers`), from our initial
  parameters and batch: autocast's recipe written out (float32 master
  parameters and batch cast to bfloat16 inside the step, logits to float32
  for the loss, gradients back to float32, plain SGD in float32):
  "torch.compile" (whole step, default mode, ``dynamic=False``,
  ``fullgraph=True``), "torch.compile, graphed" (that step captured in
  ``torch.cuda.graph``) and "JAX jit" (host clock over 10 steps).  Their
  first two losses are checked against our mixed step's within the suite's
  bfloat16 tolerance ``_tol(4096)``; the notes give each compile time; a
  peer that is missing, fails, or compiles longer than ``--compile-limit``
  is left out, noted (saved under ``mlp_step`` as ``peers`` and
  ``peer_notes``).  Issue 42's target: "ours mixed bf16, captured" (the
  step captured with ``Handler.capture``) at <= 1.0x the fastest of
  "torch autocast bf16, graphed" (``torch.cuda.graph``) and the compiled
  peers (:func:`benchmarks.peers.judge_strongest`).
"""
import math

import numpy as np

from benchmarks import peers as P
from benchmarks.common import (
    Run,
    check_line,
    derive,
    finish,
    gpu_name,
    print_table,
    rel_error,
    suite_parser,
)
from benchmarks.gpu import EventTimer, cuda_handler, interleaved, optional_peers
from benchmarks.ops import LOOP, copy_spread, inputs_beyond_l2, read_only_ms
from handlers import dtypes

BANDWIDTH_TARGET, GEMM_TARGET, SUM_TARGET = 0.85, 0.95, 0.70
STEP_OVER_F32, STEP_OVER_TORCH = 2.0, 1.0
#: name: (our call on (inputs..., out), PyTorch's on (inputs..., out), inputs, NumPy)
ELEMENTWISE = {
    "add_tt": (lambda h, a, b, o: h.add_tt(a, b, o), lambda t, a, b, o: t.add(a, b, out=o), 2,
               lambda a, b: a + b),
    "mult_tt": (lambda h, a, b, o: h.mult_tt(a, b, o), lambda t, a, b, o: t.mul(a, b, out=o), 2,
                lambda a, b: a * b),
    "sigmoid": (lambda h, a, o: h.sigmoid(a, o), lambda t, a, o: t.sigmoid(a, out=o), 1,
                lambda a: 1 / (1 + np.exp(-a))),
    "relu": (lambda h, a, o: h.relu(a, o), lambda t, a, o: t.clamp_min(a, 0, out=o), 1,
             lambda a: np.maximum(a, 0)),
}
SUMS = [((8192, 4096), 0), ((8192, 4096), 1), ((64, 128, 32, 32), (0, 2, 3))]
GEMM_SIZES = (1024, 4096)
MLP = dict(width=4096, batch=4096, layers=3, lr=1e-3)


def _tol(k=1):
    """Relative error allowed against float64 for a bfloat16 result (inputs
    rounded to bfloat16 first, so only the output's rounding and float32
    accumulation count): a few units of bfloat16's roundoff."""
    return 4 * dtypes.unit_roundoff("bfloat16") + 1e-6 * np.sqrt(k)


def elementwise(h, torch, copy_bw, checks, reps, n=1 << 26):
    rng = np.random.default_rng(1)
    bf = dtypes.bfloat16()
    hosts = [[rng.standard_normal(n).astype(np.float32).astype(bf) for _ in range(2)]
             for _ in range(2)]
    ours = [[h.create_from_numpy(a) for a in s] for s in hosts]
    out = h.allocate((n,))
    theirs = [[torch.from_numpy(a.astype(np.float32)).cuda().bfloat16() for a in s]
              for s in hosts] if torch else None
    tout = torch.empty(n, dtype=torch.bfloat16, device="cuda") if torch else None
    rows, results = [], []
    for name, (f, g, k, ref) in ELEMENTWISE.items():
        cases = {"ours": (EventTimer("pycuda", h.stream),
                          lambda i, f=f, k=k: f(h, *ours[i % 2][:k], out))}
        if torch:
            cases["torch"] = (EventTimer("torch", module=torch),
                              lambda i, g=g, k=k: g(torch, *theirs[i % 2][:k], tout))
        ms = interleaved(cases, reps=reps, inner=LOOP)
        nbytes = (k + 1) * n * 2
        bps = {lib: derive(v, lambda t: nbytes / (t * 1e-3)) for lib, v in ms.items()}
        frac = bps["ours"]["median"] / copy_bw
        tb = bps["torch"]["median"] if torch else float("nan")
        rows.append([name, bps["ours"]["median"] / 1e12, frac, tb / 1e12, tb / copy_bw,
                     "yes" if frac >= BANDWIDTH_TARGET else "NO"])
        results.append(dict(op=name, ours_Bps=bps["ours"], torch_Bps=bps.get("torch"),
                            fraction_of_copy=frac, target=BANDWIDTH_TARGET))
        f(h, *ours[0][:k], out)
        want = ref(*(a.astype(np.float64) for a in hosts[0][:k]))
        errors = {"ours": rel_error(h.get_numpy_copy(out), want)}
        if torch:
            g(torch, *theirs[0][:k], tout)
            errors["torch"] = rel_error(tout.float().cpu().numpy(), want)
        checks.append(dict(what=f"{name} bf16", errors=errors, tol=_tol(),
                           ok=check_line(f"{name} bf16", errors, _tol())))
    print(f"\nElementwise, bfloat16, {n:,} elements (TB/s, minimal bytes); copy = "
          f"{copy_bw / 1e12:.3f} TB/s; target >= {BANDWIDTH_TARGET:.0%} of copy")
    print_table(["op", "ours", "ours/copy", "torch", "torch/copy", "ok"], rows)
    return results


def gemms(h, torch, checks, reps):
    rng = np.random.default_rng(2)
    bf = dtypes.bfloat16()
    rows, results = [], []
    for n in GEMM_SIZES:
        host = [rng.standard_normal((n, n)).astype(np.float32).astype(bf) for _ in range(2)]
        a, b = (h.create_from_numpy(x) for x in host)
        o = h.allocate((n, n))
        cases = {"ours": (EventTimer("pycuda", h.stream), lambda i: h.dot_mm(a, b, o))}
        if torch:
            ta, tb = (torch.from_numpy(x.astype(np.float32)).cuda().bfloat16() for x in host)
            to = torch.empty((n, n), dtype=torch.bfloat16, device="cuda")
            cases["torch"] = (EventTimer("torch", module=torch),
                              lambda i: torch.matmul(ta, tb, out=to))
        ms = interleaved(cases, reps=reps, inner=LOOP if n <= 1024 else 2)
        flops = 2 * n ** 3
        tf = {lib: derive(v, lambda t: flops / (t * 1e-3)) for lib, v in ms.items()}
        ratio = (ms["torch"]["median"] / ms["ours"]["median"]) if torch else float("nan")
        rows.append([f"{n}^3", tf["ours"]["median"] / 1e12,
                     tf["torch"]["median"] / 1e12 if torch else float("nan"), ratio,
                     "yes" if ratio >= GEMM_TARGET else "NO"])
        results.append(dict(n=n, ours_flops=tf["ours"], torch_flops=tf.get("torch"),
                            torch_over_ours=ratio, target=GEMM_TARGET))
        h.dot_mm(a, b, o)
        want = host[0].astype(np.float64) @ host[1].astype(np.float64)
        errors = {"ours": rel_error(h.get_numpy_copy(o), want)}
        if torch:
            errors["torch"] = rel_error(torch.matmul(ta, tb).float().cpu().numpy(), want)
        checks.append(dict(what=f"dot_mm bf16 {n}^3", errors=errors, tol=_tol(n),
                           ok=check_line(f"dot_mm bf16 {n}^3", errors, _tol(n))))
    print(f"\ndot_mm, bfloat16 (TFLOP/s); target: torch time / ours >= {GEMM_TARGET}")
    print_table(["size", "ours", "torch", "torch/ours", "ok"], rows)
    return results


def sums(h, torch, copy_bw, checks, reps):
    rng = np.random.default_rng(3)
    bf = dtypes.bfloat16()
    rows, results = [], []
    for shape, axis in SUMS:
        # enough inputs that no call finds its input in L2 (inputs_beyond_l2)
        n_in = inputs_beyond_l2(math.prod(shape) * 2)
        host = [rng.standard_normal(shape).astype(np.float32).astype(bf) for _ in range(n_in)]
        xs = [h.create_from_numpy(x) for x in host]
        want = host[0].astype(np.float64).sum(axis)
        o = h.allocate(want.shape)
        cases = {"ours": (EventTimer("pycuda", h.stream),
                          lambda i: h.sum_t(xs[i % n_in], axis, o))}
        if torch:
            tx = [torch.from_numpy(x.astype(np.float32)).cuda().bfloat16() for x in host]
            cases["torch"] = (EventTimer("torch", module=torch),
                              lambda i: tx[i % n_in].sum(dim=axis))
        ms = interleaved(cases, reps=reps, inner=LOOP)
        nbytes = 2 * (host[0].size + want.size)
        bps = {lib: derive(v, lambda t: nbytes / (t * 1e-3)) for lib, v in ms.items()}
        frac = bps["ours"]["median"] / copy_bw
        tb = bps["torch"]["median"] if torch else float("nan")
        rows.append([str(shape), str(axis), bps["ours"]["median"] / 1e12, frac, tb / 1e12,
                     "yes" if frac >= SUM_TARGET else "NO"])
        results.append(dict(shape=list(shape), axis=axis, inputs=n_in, ours_Bps=bps["ours"],
                            torch_Bps=bps.get("torch"), fraction_of_copy=frac,
                            target=SUM_TARGET))
        if isinstance(axis, tuple):   # the bias shape: what reading its bytes alone reaches
            bound = derive(read_only_ms(h, 2 * host[0].size, reps, n_in),
                           lambda t: nbytes / (t * 1e-3))
            results[-1]["read_only_Bps"] = bound
            rows.append(["  read-only kernel, same input", "", bound["median"] / 1e12,
                         bound["median"] / copy_bw, float("nan"), "bound"])
        h.sum_t(xs[0], axis, o)
        k = host[0].size // want.size
        errors = {"ours": rel_error(h.get_numpy_copy(o), want)}
        if torch:
            errors["torch"] = rel_error(tx[0].sum(dim=axis).float().cpu().numpy(), want)
        checks.append(dict(what=f"sum_t bf16 {shape} {axis}", errors=errors, tol=_tol(k),
                           ok=check_line(f"sum_t bf16 {shape} {axis}", errors, _tol(k))))
    print(f"\nsum_t, bfloat16 (TB/s, input read once + output written once); target >= "
          f"{SUM_TARGET:.0%} of copy")
    print_table(["shape", "axis", "ours", "ours/copy", "torch", "ok"], rows)
    return results


def _mlp_net(h, precision=None, mlp=MLP):
    """(network, fn(i) of one SGD training step returning the loss array,
    host batch (x, y as (n, 1) classes)) of the MLP ``mlp`` on handler ``h``,
    in mixed precision with ``precision`` ("bfloat16" or "float16") if
    given."""
    from layers import SGD, FullyConnected, ReLU, Sequential, SoftmaxCrossEntropy
    from layers.trainer import half_grads, update
    w, n = mlp["width"], mlp["batch"]
    layers = []
    for _ in range(mlp["layers"]):
        layers += [FullyConnected(w, w), ReLU()]
    layers[-1:] = []
    net = Sequential(h, layers, SoftmaxCrossEntropy(), seed=0)
    opt = SGD(net.parameters, lr=mlp["lr"])
    if precision:
        net.mixed_precision(precision)
    rng = np.random.default_rng(4)
    hx = rng.standard_normal((n, w))
    # labels in the loss's format (float32 for every case): 4096 classes, past
    # the whole numbers bfloat16 (256) and float16 (2048) hold exactly
    hy = rng.integers(0, w, (n, 1)).astype(np.float64)
    x, y = net.input_h.create_from_numpy(hx), net.target_h.create_from_numpy(hy)
    half = half_grads(net, opt)   # the Trainer's choice: bf16 steps by the half gradients
    net.refresh_working()         # the half steps' forward passes skip it (update writes it)

    def step(i):
        loss = net.train_step(x, y, master_grads=half is None, refresh=half is None)
        update(net, opt, half)
        return loss
    return net, step, (hx, hy)


def _our_mlp(h, precision=None):
    """fn(i): one SGD training step of the MLP on handler ``h`` (:func:`_mlp_net`)."""
    return _mlp_net(h, precision)[1]


def peer_cfg(mlp=MLP):
    """The compiled peers' description (:mod:`benchmarks.peers`) of our mixed
    bfloat16 step of ``mlp``."""
    return {"sizes": (mlp["width"],) * (mlp["layers"] + 1), "batch": mlp["batch"],
            "compute": "bfloat16"}


def check_mlp_peers(h32, peers, notes, checks, mlp=MLP):
    """The compiled peers' first two losses (two steps on the batch, each
    peer a fresh copy from our initial parameters; the first compiles it)
    against two steps of our mixed bfloat16 step, within the suite's
    bfloat16 tolerance ``_tol(width)`` (the gemms' depth); a record
    appended to ``checks``.  A peer that fails is removed from ``peers``,
    noted.  Returns (our initial parameters, the host batches) for the
    timed copies."""
    from benchmarks.train import our_params
    net, step, batch = _mlp_net(h32, "bfloat16", mlp)
    p0 = our_params(net)                 # the float32 master copy
    # the loss is an array of the compute handler (rounded to bfloat16)
    ours = [float(net.h.get_numpy_copy(step(i))[0]) for i in range(2)]
    two = P.first_two_losses(peers, p0, [batch], notes)
    if two:
        what = "MLP mixed bf16 step: first two losses of the compiled peers"
        checks.append(P.check_two_losses(what, two, ours, _tol(mlp["width"])))
    return p0, [batch]


def _torch_mlp(torch, dtype, autocast):
    """fn(i): the same step in PyTorch: float32 parameters under autocast to
    ``dtype`` (float16 with a ``GradScaler``), or ``dtype`` parameters
    throughout."""
    w, n = MLP["width"], MLP["batch"]
    mods = []
    for _ in range(MLP["layers"]):
        mods += [torch.nn.Linear(w, w), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods[:-1]).cuda()
    if not autocast:
        model = model.to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=MLP["lr"])
    x = torch.randn(n, w, device="cuda", dtype=torch.float32 if autocast else dtype)
    y = torch.randint(0, w, (n,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler("cuda", enabled=autocast and dtype == torch.float16)

    def step(i):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype, enabled=autocast):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return step


def mlp_step(hb, h32, torch, reps, checks=None, peers=None, notes=None, compile_limit=600.0):
    """The MLP step: ours in mixed bfloat16 (the target row), float32,
    pure bfloat16 and mixed float16; PyTorch's likewise; and the compiled
    ``peers`` of the mixed bfloat16 step (``{label: PeerStep}`` of
    :func:`benchmarks.peers.make_peers`; checked first, see
    :func:`check_mlp_peers`)."""
    peers = {} if peers is None else peers
    notes = {} if notes is None else notes
    from benchmarks.gpu import our_captured, torch_graphed
    ours, captured = "ours mixed bf16", "ours mixed bf16, captured"
    cases = {ours: (EventTimer("pycuda", h32.stream), _our_mlp(h32, "bfloat16")),
             "ours f32": (EventTimer("pycuda", h32.stream), _our_mlp(h32)),
             "ours bf16 params": (EventTimer("pycuda", hb.stream), _our_mlp(hb)),
             "ours mixed fp16": (EventTimer("pycuda", h32.stream), _our_mlp(h32, "float16"))}
    cases[captured] = (EventTimer("pycuda", h32.stream),
                       our_captured(h32, _our_mlp(h32, "bfloat16")))
    if torch:
        t = EventTimer("torch", module=torch)
        cases["torch autocast bf16"] = (t, _torch_mlp(torch, torch.bfloat16, True))
        cases["torch autocast bf16, graphed"] = (
            t, torch_graphed(torch, _torch_mlp(torch, torch.bfloat16, True)))
        cases["torch bf16 params"] = (t, _torch_mlp(torch, torch.bfloat16, False))
        cases["torch autocast fp16"] = (t, _torch_mlp(torch, torch.float16, True))
    compiled = {}
    if peers:
        p0, batches = check_mlp_peers(h32, peers, notes, [] if checks is None else checks)
        P.drop_over_limit(peers, notes, compile_limit)
        compiled = P.timed_cases(peers, p0, batches, notes)
    ms = interleaved({**cases, **compiled}, reps=reps, inner=1)
    med = {k: v["median"] for k, v in ms.items()}
    over_f32 = med["ours f32"] / med[ours]
    over_torch = med.get("torch autocast bf16", float("nan")) / med[ours]
    print(f"\nMLP training step, width {MLP['width']}, batch {MLP['batch']}, "
          f"{MLP['layers']} layers, SGD (ms per step)")
    rows = [[k, v, v / med[ours], P.note(k, peers) if k in compiled else ""]
            for k, v in med.items()]
    rows += [[k, float("nan"), float("nan"), notes[k]]
             for k in P.LABELS if k in notes and k not in med]
    headers = ["library", "ms", f"its time / {ours}", "notes"]
    if not any(r[-1] for r in rows):       # no compiled peers: the table as it was
        headers, rows = headers[:-1], [r[:-1] for r in rows]
    print_table(headers, rows)
    print(f"{ours} vs ours f32: {over_f32:.2f}x (target >= {STEP_OVER_F32}x: "
          f"{'yes' if over_f32 >= STEP_OVER_F32 else 'NO'}); vs torch autocast: "
          f"{over_torch:.2f}x (target >= {STEP_OVER_TORCH}x: "
          f"{'yes' if over_torch >= STEP_OVER_TORCH else 'NO'})")
    out = dict(ms={k: v for k, v in ms.items() if k not in compiled}, over_f32=over_f32,
               over_torch_autocast=over_torch, mode="mixed",
               targets=dict(over_f32=STEP_OVER_F32, over_torch=STEP_OVER_TORCH))
    if compiled:
        out["strongest"] = P.judge_strongest("MLP mixed bf16 step", med[captured], med)
    if compiled or notes:
        out["peers"] = {k: dict(ms=ms[k], compile_s=peers[P.compiled_of(k)].compile_s)
                        for k in compiled}
        out["peer_notes"] = dict(notes)
    return out


def main(argv=None):
    """Run the suite (options: ``--help``); returns the exit status."""
    parser = suite_parser("half", __doc__)
    parser.add_argument("--quick", action="store_true", help="few repeats")
    P.add_options(parser)
    args = parser.parse_args(argv)
    which = P.chosen(parser, args)
    h = cuda_handler("half", "bfloat16")
    if h is None:
        return 0
    h32 = cuda_handler("half", np.float32)
    run = Run("half", gpu_name(), vars(args))
    torch = optional_peers().get("torch")
    print(f"peer: {'PyTorch' if torch else 'none'}")
    jax = P.import_jax(gpu=True) if "jax" in which else None
    if which:
        print(P.describe(which, torch, jax) + " (the MLP step, mixed bfloat16)")
    reps = 5 if args.quick else 15
    checks = []
    results = {"gpu": run.device, "checks": checks}
    copy_bw = copy_spread(h, 1 << 26, reps)["median"]
    results["copy_Bps"] = copy_bw
    results["elementwise"] = elementwise(h, torch, copy_bw, checks, reps)
    results["dot_mm"] = gemms(h, torch, checks, reps)
    results["sum_t"] = sums(h, torch, copy_bw, checks, reps)
    peers, notes = P.make_peers("mlp", peer_cfg(), which, MLP["lr"], 0.0, torch, jax)
    results["mlp_step"] = mlp_step(h, h32, torch, max(3, reps // 3), checks, peers, notes,
                                   args.compile_limit)
    return finish(run, results, checks, args.save)
