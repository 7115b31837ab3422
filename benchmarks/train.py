"""``python -m benchmarks train``: samples per second of a training step.

Models, float32:

* MLP 784-1024-1024-10 (ReLU), softmax cross-entropy, batch 256;
* LSTM T=32, B=64, F=128, H=512, its last hidden state into a 512-10 fully
  connected layer, softmax cross-entropy.

A step is forward, loss (mean over the batch), backward and the SGD update
(lr 0.01, momentum 0.9), with the batches resident on the device (two,
alternated).  Measured in one process on PyCudaHandler and on the same models
in PyTorch eager, all starting from our initial parameters (TF32 off;
``torch.optim.SGD`` fused, or multi-tensor ``foreach`` where fused is
unavailable; ``zero_grad(set_to_none=True)``; ``CrossEntropyLoss``):

* MLP: "PyTorch eager", ``nn.Sequential`` of ``Linear`` and ``ReLU``;
* LSTM: "PyTorch eager", the same cell as ours written out step by step;
  "nn.LSTMCell loop", ``nn.LSTMCell`` called T times; and
  "torch.nn.LSTM (cuDNN)".  Both take our bias as ``bias_ih`` and start
  ``bias_hh`` at 0.

Compiled peers (``--peers``, both by default; :mod:`benchmarks.peers`), each
one functional step from our initial parameters (the "PyTorch eager" cell's
layout), SGD with momentum written out (``buf = 0.9 buf + g; p -= 0.01 buf``):

* "torch.compile": ``torch.func.grad_and_value`` of the loss and the in-place
  update, compiled whole (default mode, ``dynamic=False``,
  ``fullgraph=True``); "torch.compile, graphed": the same compiled step
  captured whole in ``torch.cuda.graph`` as the ", graphed" rows below are,
  and replayed on one fixed batch.  Both run one compiled function (no second
  compile), timed like the other PyTorch rows.  With ``--peers autotune``
  (not by default: minutes of compiling a model), "torch.compile
  max-autotune" and its graphed row, the same in the mode
  ``max-autotune-no-cudagraphs``;
* "JAX jit": ``jax.value_and_grad`` of the loss and the update in one
  ``jax.jit``, parameters and momentum buffers donated, float32 matmuls at
  "highest" precision (no TF32), no GPU memory preallocation; for the LSTM
  the time loop is ``jax.lax.scan``, and "JAX jit, scan unrolled" unrolls it
  fully.  JAX issues to its own streams, where we have no CUDA events: its
  ``ms`` is host time of 10 steps issued back to back, waited for
  (``block_until_ready``) before the clock starts and before it stops,
  divided by 10 (no ``host_issue_ms`` / ``device_ms``).

Each row's notes give its compile time (host seconds of its first step, which
traces, compiles and runs one step); a peer that is missing (no torch, no
JAX GPU backend), fails to compile, run or be captured, or whose first step
takes longer than ``--compile-limit`` seconds (checked afterwards: a compile
cannot be interrupted) is left out of the timing, its row saying why.  Saved
under each model's ``peers`` (figures and ``compile_s``) and ``peer_notes``,
apart from ``torch``.

Figures per library, each a spread over ``--reps`` samples:

* ``ms``: device time of one step (CUDA events of each library on the stream
  it issues to; for ours the handler's group-0 stream, which waits for the
  other groups at the end of a step), all libraries of a model in one
  interleaved loop so that none is favoured by a slow spell;
* ``host_issue_ms``: host time to issue K steps back to back, without
  waiting for the device (synchronized before the clock starts and after it
  stops, outside the clock), divided by K;
* ``device_ms``: device time of one step while the host is far ahead: a long
  GPU job (big gemms, sized from ``host_issue_ms``) is queued first, then the
  events and K steps, so the device runs the K steps back to back without
  waiting for launches.  Where issuing still outlasted the long job (the host
  blocked on a full launch queue) ``device_gapless`` is False and
  ``device_ms`` is an upper bound.

A library is launch-bound when ``host_issue_ms`` exceeds ``device_ms``: the
device then waits on the host, so fewer, larger ops would pay, faster kernels
not.  K is 5, fewer for steps of many ops (the launch queue is finite).

Correctness: for each model one training step of fresh copies (ours and each
PyTorch peer, same initial parameters and batch) is compared with an
independent float64 NumPy implementation of the step (:func:`reference_step`):
the loss, and the parameter update ``p1 - p0`` (relative to its largest
element, so a wrong gradient cannot hide behind the parameters' size).  The
compiled peers join both, and also take a second step on the second batch:
their first two losses against our first two (the tolerance of the others).
Their first step there is the one that compiles them.

Captured steps (on the GPU unless ``--no-graphs``): "ours, captured" is the
same step captured once with ``Handler.capture`` (after an eager warm-up) and
replayed; each PyTorch peer gains a ", graphed" row, its whole step
(``zero_grad``, forward, loss, backward, ``opt.step()``) captured in
``torch.cuda.graph`` after three warm-up steps on a side stream, as PyTorch's
documentation shows.  Both replay on one fixed batch.  Their ``host_issue_ms``
is the host time of one replay.  Checked: three replays of our captured step
leave the parameters bit for bit where three eager steps leave them
(:func:`capture_check`).

Where the step's time goes: one step's ops are recorded, then replayed by
category on stream group 0 (gemm, elementwise, ``sum_t`` (bias gradients and
the loss), the optimizer's update) and timed.  On the GPU each category is
captured once (``Handler.capture``) and its graph replayed, so a figure is
the device's time for those ops, without the host's gaps between eager
launches (which made the gemms' figure move from 0.130 to 0.173 ms between
runs, and with it the MLP step's ratio to its gemms); a category that cannot
be captured is re-issued eagerly and marked so.  The replays run serially
and back to back, so their sum differs from the step's time by what stream
overlap and idle gaps add or save.

Without a GPU this prints that it skipped and returns 0; ``--handler numpy``
times NumpyHandler instead (host clock; no peers, no host issue / device
split, the checks against the reference still run), and ``--small`` shrinks
the models (smoke tests).  ``--save`` writes one run
(``benchmarks/results/runs/``).
"""
import argparse
import math
import time
from collections import namedtuple

import numpy as np

from benchmarks import peers as P
from benchmarks.common import (
    Run,
    check_line,
    gpu_name,
    med,
    print_table,
    rel_error,
    spread,
    suite_parser,
)
from benchmarks.gpu import (
    EventTimer,
    interleaved,
    optional_peers,
    our_captured,
    torch_graphed,
)
from benchmarks.peers import GEMM_RATIO
from layers import LSTM, SGD, FullyConnected, ReLU, Sequential, SoftmaxCrossEntropy

F32 = np.float32
LR, MOMENTUM = 0.01, 0.9
MODELS = {
    # name: (sizes, small sizes)
    "mlp": ({"batch": 256, "sizes": (784, 1024, 1024, 10)},
            {"batch": 16, "sizes": (32, 48, 48, 10)}),
    "lstm": ({"T": 32, "B": 64, "F": 128, "H": 512, "classes": 10},
             {"T": 4, "B": 8, "F": 16, "H": 24, "classes": 10}),
}
#: op name -> category of the breakdown (anything else is "elementwise"); a
#: product with its bias and activation in the epilogue (dot_bias_act, one
#: cuBLASLt call on a GPU) counts as a gemm, as XLA's fused GEMMs would
CATEGORY = {"dot_mm": "gemm", "dot_add_mm": "gemm", "dot_bias_act": "gemm",
            "sum_t": "sum_t (bias, loss)"}
#: ops that order or allocate rather than compute: not replayed
NOT_COMPUTE = {"record_event", "wait_event", "wait_for", "synchronize",
               "synchronize_all_streams", "with_streams", "allocate", "zeros", "ones",
               "create_from_numpy", "get_numpy_copy", "set_from_numpy"}
#: steps issued back to back for host_issue_ms and device_ms (at most)
ISSUE_STEPS = 5
#: ops a launch queue is taken to hold: K = ISSUE_STEPS, or fewer steps of many ops
QUEUE_OPS = 1000
#: side of the square matrices of the busy gemm that keeps the device occupied
BUSY_N = 4096
#: relative error allowed in the checks (float32 against float64)
CHECK_TOL = 1e-3
OURS = "ours"
OURS_CAPTURED = "ours, captured"
#: the LSTM layer before issue 20's fusion (benchmarks/unfused_lstm.py), eager
OURS_UNFUSED = "ours, unfused LSTM"
#: the compiled peers (benchmarks/peers.py)
NEW_PEERS = P.LABELS


# -------------------------------------------------------------------- models
def build(h, model, cfg, seed=0, lstm=LSTM):
    """(network, host batches (x, y) x 2, samples per step) of ``model``
    (``lstm``: the LSTM layer class)."""
    rng = np.random.default_rng(seed)
    if model == "mlp":
        s = cfg["sizes"]
        layers = []
        for k in range(len(s) - 1):
            layers += [FullyConnected(s[k], s[k + 1]), ReLU()]
        layers.pop()                       # no ReLU after the last layer
        n = cfg["batch"]
        xs = [rng.standard_normal((n, s[0])) for _ in range(2)]
        classes = s[-1]
    else:
        T, B, F, H = cfg["T"], cfg["B"], cfg["F"], cfg["H"]
        layers = [lstm(F, H, return_sequences=False), FullyConnected(H, cfg["classes"])]
        n = B
        xs = [rng.standard_normal((T, B, F)) for _ in range(2)]
        classes = cfg["classes"]
    ys = [rng.integers(0, classes, (n, 1)).astype(np.float64) for _ in range(2)]
    net = Sequential(h, layers, SoftmaxCrossEntropy(), seed=seed)
    return net, list(zip(xs, ys)), n


def handler_step(h, net, batches):
    """fn(i): one training step on resident batch i % 2; returns the loss array."""
    opt = SGD(net.parameters, lr=LR, momentum=MOMENTUM)
    dev = [(h.create_from_numpy(x), h.create_from_numpy(y)) for x, y in batches]

    def step(i):
        x, y = dev[i % len(dev)]
        loss = net.train_step(x, y)
        opt.step()
        return loss
    return step


def our_params(net):
    """Float64 host copies of the network's parameters, in ``ParameterSet``
    order (MLP: W, b per layer; LSTM: Wx (4, F, H), Wh (4, H, H), b (4, 1, H),
    then the output layer's W (H, C), b (1, C))."""
    flat = np.asarray(net.parameters.get(), np.float64)
    return [flat[off:off + math.prod(shape)].reshape(shape).copy()
            for _, _, off, shape in net.parameters.entries]


# ----------------------------------------------------------------- reference
def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def _softmax_ce(logits, labels):
    """Mean cross-entropy of softmax(logits) and its gradient."""
    n = len(labels)
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    rows = np.arange(n)
    loss = float(-np.log(p[rows, labels]).mean())
    d = p
    d[rows, labels] -= 1.0
    return loss, d / n


def reference_step(model, params, x, labels, lr=LR):
    """One training step in float64 NumPy, independent of the handlers:
    forward, mean softmax cross-entropy, backward and the first SGD-momentum
    update (the velocity starts at 0, so it is ``p - lr * g``).

    ``params`` are in :func:`our_params` order, ``x`` the batch ((n, F) or
    (T, B, F)), ``labels`` integer classes.  Returns (loss, updated params)."""
    params = [np.asarray(p, np.float64) for p in params]
    x = np.asarray(x, np.float64)
    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    if model == "mlp":
        Ws, bs = params[0::2], params[1::2]
        acts, zs = [x], []
        for k, (W, b) in enumerate(zip(Ws, bs)):
            z = acts[-1] @ W + b
            zs.append(z)
            acts.append(np.maximum(z, 0.0) if k < len(Ws) - 1 else z)
        loss, d = _softmax_ce(acts[-1], labels)
        grads = [None] * len(params)
        for k in reversed(range(len(Ws))):
            grads[2 * k] = acts[k].T @ d
            grads[2 * k + 1] = d.sum(axis=0, keepdims=True)
            if k:
                d = (d @ Ws[k].T) * (zs[k - 1] > 0)
    else:
        Wx, Wh, b, W, bo = params
        T, B, _ = x.shape
        H = Wh.shape[-1]
        h, c = np.zeros((B, H)), np.zeros((B, H))
        cache = []
        for t in range(T):
            z = [x[t] @ Wx[k] + b[k] + h @ Wh[k] for k in range(4)]
            i, f, g, o = _sigmoid(z[0]), _sigmoid(z[1]), np.tanh(z[2]), _sigmoid(z[3])
            c_prev, h_prev = c, h
            c = f * c_prev + i * g
            tc = np.tanh(c)
            h = o * tc
            cache.append((i, f, g, o, c_prev, tc, h_prev))
        loss, d = _softmax_ce(h @ W + bo, labels)
        gW, gbo = h.T @ d, d.sum(axis=0, keepdims=True)
        dh, dc = d @ W.T, np.zeros((B, H))
        gWx, gWh, gb = np.zeros_like(Wx), np.zeros_like(Wh), np.zeros_like(b)
        for t in reversed(range(T)):
            i, f, g, o, c_prev, tc, h_prev = cache[t]
            do = dh * tc
            dc = dc + dh * o * (1.0 - tc * tc)
            dz = [dc * g * i * (1.0 - i), dc * c_prev * f * (1.0 - f),
                  dc * i * (1.0 - g * g), do * o * (1.0 - o)]
            for k in range(4):
                gWx[k] += x[t].T @ dz[k]
                gWh[k] += h_prev.T @ dz[k]
                gb[k] += dz[k].sum(axis=0, keepdims=True)
            dh = sum(dz[k] @ Wh[k].T for k in range(4))
            dc = dc * f
        grads = [gWx, gWh, gb, gW, gbo]
    return loss, [p - lr * g for p, g in zip(params, grads)]


# ------------------------------------------------------------------ PyTorch
def torch_sgd(torch, params):
    """``torch.optim.SGD`` (lr 0.01, momentum 0.9), fused where this torch
    has it, else multi-tensor (``foreach``)."""
    try:
        return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, fused=True)
    except (TypeError, RuntimeError, ValueError):
        return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, foreach=True)


def torch_models(torch, model, cfg, params, dtype):
    """``{label: (parameters, forward(x), to_ours())}`` of the PyTorch peers
    of ``model`` on the GPU in ``dtype``, starting from ``params`` (ours, in
    :func:`our_params` order); ``to_ours()`` returns their current parameters
    as float64 NumPy arrays in that order."""
    nn = torch.nn
    kw = {"device": "cuda", "dtype": dtype}

    def tensor(a):
        return torch.tensor(np.ascontiguousarray(a), **kw)

    def npy(t):
        return t.detach().double().cpu().numpy()

    def linear(W, b):
        lin = nn.Linear(W.shape[0], W.shape[1], **kw)
        with torch.no_grad():
            lin.weight.copy_(tensor(W.T))
            lin.bias.copy_(tensor(b[0]))
        return lin

    def linear_back(lin):
        return [npy(lin.weight).T.copy(), npy(lin.bias)[None]]

    if model == "mlp":
        lins = [linear(params[2 * k], params[2 * k + 1]) for k in range(len(params) // 2)]
        mods = []
        for lin in lins:
            mods += [lin, nn.ReLU()]
        m = nn.Sequential(*mods[:-1])
        return {"PyTorch eager": (list(m.parameters()), m,
                                  lambda: [a for lin in lins for a in linear_back(lin)])}

    T, B, F, H = cfg["T"], cfg["B"], cfg["F"], cfg["H"]
    Wx, Wh, b, W, bo = params

    def cat(A):        # (4, rows, H) per gate -> (rows, 4H), gates i, f, g, o side by side
        return A.transpose(1, 0, 2).reshape(A.shape[1], 4 * H)

    def split(M):      # the inverse of cat
        return M.reshape(M.shape[0], 4, H).transpose(1, 0, 2).copy()

    out = {}
    # the same cell as ours, written out: input projection of all steps at
    # once, then one fused (B, 4H) gemm per step
    wx, wh = nn.Parameter(tensor(cat(Wx))), nn.Parameter(tensor(cat(Wh)))
    bb, fc = nn.Parameter(tensor(b.reshape(4 * H))), linear(W, bo)

    def cell_forward(x):
        xp = (x.reshape(T * B, F) @ wx + bb).view(T, B, 4 * H)
        h = torch.zeros(B, H, **kw)
        c = torch.zeros(B, H, **kw)
        for t in range(T):
            i, f, g, o = (xp[t] + h @ wh).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        return fc(h)
    out["PyTorch eager"] = (
        [wx, wh, bb, *fc.parameters()], cell_forward,
        lambda: [split(npy(wx)), split(npy(wh)), npy(bb).reshape(4, 1, H), *linear_back(fc)])

    def load(w_ih, w_hh, b_ih, b_hh):
        """Our weights into torch's (4H, in) layout; our bias is bias_ih."""
        with torch.no_grad():
            w_ih.copy_(tensor(cat(Wx).T))
            w_hh.copy_(tensor(cat(Wh).T))
            b_ih.copy_(tensor(b.reshape(4 * H)))
            b_hh.zero_()

    def back(w_ih, w_hh, b_ih, lin):
        return [split(npy(w_ih).T), split(npy(w_hh).T), npy(b_ih).reshape(4, 1, H),
                *linear_back(lin)]

    cell, fc_cell = nn.LSTMCell(F, H, **kw), linear(W, bo)
    load(cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)

    def cell_loop(x):
        h = torch.zeros(B, H, **kw)
        c = torch.zeros(B, H, **kw)
        for t in range(T):
            h, c = cell(x[t], (h, c))
        return fc_cell(h)
    out["nn.LSTMCell loop"] = (
        [*cell.parameters(), *fc_cell.parameters()], cell_loop,
        lambda: back(cell.weight_ih, cell.weight_hh, cell.bias_ih, fc_cell))

    lstm, fc_lstm = nn.LSTM(F, H, **kw), linear(W, bo)
    load(lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0)
    out["torch.nn.LSTM (cuDNN)"] = (
        [*lstm.parameters(), *fc_lstm.parameters()], lambda x: fc_lstm(lstm(x)[0][-1]),
        lambda: back(lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, fc_lstm))
    return out


def torch_batches(torch, batches, dtype):
    """The host batches as GPU tensors: (x in ``dtype``, long class labels)."""
    return [(torch.tensor(x, dtype=dtype, device="cuda"),
             torch.tensor(y[:, 0], dtype=torch.long, device="cuda")) for x, y in batches]


def torch_step(torch, params, forward, tb):
    """fn(i): one PyTorch training step on batch i % 2; returns the loss tensor."""
    opt = torch_sgd(torch, params)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(i):
        x, y = tb[i % len(tb)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(forward(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


# ------------------------------------------------------------ compiled peers
# -------------------------------------------------------------------- checks
def run_checks(h, model, cfg, torch=None, peers=None, notes=None):
    """Check one training step of fresh models against :func:`reference_step`:
    returns the check records ``{"what", "errors", "tol", "ok"}`` (printed)
    of the loss and of the parameter update, ours and every PyTorch peer.

    ``peers`` (``{label: PeerStep}`` of :func:`make_peers`) join both checks,
    and each also takes a second step on the second batch: its first two
    losses against our first two (a third check).  Their first step compiles
    them (``compile_s``).  A peer that raises is removed from ``peers``, the
    reason written to ``notes[label]``."""
    peers = {} if peers is None else peers
    notes = {} if notes is None else notes
    net, batches, _ = build(h, model, cfg)
    p0 = our_params(net)                        # float32 values, as float64
    x, y = batches[0]
    x_in = np.asarray(x, h.dtype).astype(np.float64)   # the batch ours computes with
    ref_loss, ref_p1 = reference_step(model, p0, x_in, y[:, 0])
    step = handler_step(h, net, batches)
    loss = float(h.get_numpy_copy(step(0))[0])
    got = {OURS: (loss, our_params(net))}
    if peers:                                   # our second loss, for the peers' two
        our_two = (loss, float(h.get_numpy_copy(step(1))[0]))
    if torch is not None:
        tb = torch_batches(torch, batches, torch.float32)
        for label, (params, forward, to_ours) in torch_models(
                torch, model, cfg, p0, torch.float32).items():
            t_loss = torch_step(torch, params, forward, tb)(0)
            got[label] = (float(t_loss.item()), to_ours())
    two = {}
    for label in list(peers):
        try:
            copy = peers[label].copy(p0, batches)
            first = float(copy.step(0))         # compiles
            got[label] = (first, copy.to_ours())
            two[label] = (first, float(copy.step(1)))
        except Exception as e:   # any failure (compile, capture, run): left out, noted
            notes[label] = "not run: " + P.why(e)
            got.pop(label, None)
            del peers[label]

    def update(p1):
        return np.concatenate([(a - b).ravel() for a, b in zip(p1, p0)])

    ref_update = update(ref_p1)
    checks = []
    for what, errors in (
            (f"{model} loss of one step", {k: rel_error(v[0], ref_loss) for k, v in got.items()}),
            (f"{model} parameter update of one SGD step",
             {k: rel_error(update(v[1]), ref_update) for k, v in got.items()})):
        ok = check_line(what, errors, CHECK_TOL)
        checks.append({"what": what, "errors": errors, "tol": CHECK_TOL, "ok": ok})
    if two:
        what = f"{model} first two losses of the compiled peers"
        errors = {k: max(rel_error(v[j], our_two[j]) for j in range(2)) for k, v in two.items()}
        ok = check_line(what, errors, CHECK_TOL, against="our first two losses")
        checks.append({"what": what, "errors": errors, "tol": CHECK_TOL, "ok": ok,
                       "losses": {OURS: list(our_two), **{k: list(v) for k, v in two.items()}}})
    return checks


def capture_check(h, model, cfg, steps=3):
    """Our captured step against our eager step, bit for bit: two fresh
    copies of ``model`` take one eager step (the capture's warm-up); then one
    takes ``steps`` eager steps, the other ``steps`` replays of the captured
    step, all on batch 0.  Returns the check record (printed); tolerance 0."""
    params = {}
    for label in ("eager", "captured"):
        net, batches, _ = build(h, model, cfg)
        step = handler_step(h, net, batches)
        if label == "captured":
            run = our_captured(h, step)      # warms up with one eager step
        else:
            step(0)
            run = step
        for _ in range(steps):
            run(0)
        params[label] = np.concatenate([p.ravel() for p in our_params(net)])
    what = f"{model} parameters after {steps} captured replays"
    errors = {OURS_CAPTURED: rel_error(params["captured"], params["eager"])}
    ok = check_line(what, errors, 0.0, against="our eager steps")
    return {"what": what, "errors": errors, "tol": 0.0, "ok": ok}


# ------------------------------------------------------------------ recording
class _Recorder:
    """Forwards every op to a handler (view) and appends (name, args, kwargs,
    phase) to a shared log; ``with_streams`` and ``twin`` return a recorder
    of the view or twin, and a fused op's bound call logs each call."""

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
            if name in ("with_streams", "twin"):   # the loss runs on a twin
                return _Recorder(out, self._log, self._phase)
            return out
        return call

    def _bind_fused(self, op, args, kwargs):
        # FusedOp.bind asks the layer's handler for a bound call, which then
        # launches without passing here: log each call of it as the op it
        # runs (``_run_fused``, which replay calls), and the bind not at all
        bound = self._h._bind_fused(op, args, kwargs)

        def call():
            self._log.append(("_run_fused", (op, args, kwargs), {}, self._phase[0]))
            bound()
        return call


def record_step(h, model, cfg):
    """The compute ops of one training step: [(category, name, args, kwargs)].

    A second copy of the model runs on a recording handler, so the timed
    model pays nothing for the recording."""
    log, phase = [], ["step"]
    rec = _Recorder(h, log, phase)
    net, batches, _ = build(rec, model, cfg)
    opt = SGD(net.parameters, lr=LR, momentum=MOMENTUM)
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


#: The breakdown's row of every op of the step, replayed together
SERIAL = "all ops, serial on group 0"


def replay(h, ops):
    """fn(i) that issues ``ops`` again, all on ``h`` (group 0)."""
    calls = [(getattr(h, name), args, kwargs) for _, name, args, kwargs in ops]

    def run(i):
        for fn, args, kwargs in calls:
            fn(*args, **kwargs)
    return run


def replayed(h, ops, gpu):
    """fn(i) that replays ``ops`` captured once in a graph on ``h`` (the
    device's time for them, no host gaps), or None where that is not to be
    had: off the GPU, or where the capture fails (then the caller re-issues
    them eagerly)."""
    if not gpu:
        return None
    try:
        return our_captured(h, replay(h, ops))
    except Exception:   # any op that refuses capture: the eager figure instead
        return None


# ------------------------------------------------------------------- timing
class HostTimer:
    """Host time (ms) per call, for handlers that run ops at once; the same
    interface as :class:`benchmarks.gpu.EventTimer`, so :func:`interleaved`
    takes it."""

    def __init__(self, h):
        self.h = h

    def sample(self, fn, i=0, inner=1):
        """Milliseconds per call of ``fn(i), ..., fn(i + inner - 1)``, up to
        the handler's synchronize: one sample."""
        t0 = time.perf_counter()
        for j in range(inner):
            fn(i + j)
        self.h.synchronize_all_streams()
        return (time.perf_counter() - t0) * 1e3 / inner

    def measure(self, fn, reps=20, warmup=3, inner=1):
        """Spread of ms per call over ``reps`` samples."""
        return interleaved({"fn": (self, fn)}, reps, warmup, inner)["fn"]

    def time(self, fn, reps=20, warmup=3, inner=1):
        """The median of :meth:`measure`."""
        return self.measure(fn, reps, warmup, inner)["median"]


#: one library's step for the launch figures: its event timer, fn(i) of one
#: step, sync() that waits for its device work, busy(n) that queues n busy gemms
Side = namedtuple("Side", "timer step sync busy")


def host_issue(sides, reps, k):
    """``{label: spread of host ms per step}`` of issuing ``k`` steps back to
    back without waiting for the device; synchronized before the clock starts
    and after it stops (outside the clock); libraries interleaved."""
    labels = list(sides)
    samples = {lab: [] for lab in labels}
    for r in range(reps):
        for j in range(len(labels)):
            lab = labels[(r + j) % len(labels)]
            s = sides[lab]
            s.sync()
            t0 = time.perf_counter()
            for i in range(k):
                s.step(i)
            t1 = time.perf_counter()
            s.sync()
            samples[lab].append((t1 - t0) * 1e3 / k)
    return {lab: spread(v) for lab, v in samples.items()}


def device_time(sides, issue, reps, k):
    """``({label: spread of device ms per step}, {label: gapless})``: the
    device time of ``k`` steps queued behind a busy job that outlasts their
    issuing (sized from ``issue``, :func:`host_issue`'s spreads), so the
    device runs them back to back.  ``gapless`` is False where issuing took
    longer than the busy job in some sample (the device may have waited)."""
    labels = list(sides)
    count = {}
    for lab, s in sides.items():     # calibrate: device ms of one busy gemm
        one = s.timer.time(lambda i, s=s: s.busy(1), reps=3, warmup=1)
        count[lab] = max(1, math.ceil((2.0 * k * med(issue[lab]) + 1.0) / one)), one
    samples = {lab: [] for lab in labels}
    gapless = {lab: True for lab in labels}
    for r in range(reps):
        for j in range(len(labels)):
            lab = labels[(r + j) % len(labels)]
            s, (n_busy, one) = sides[lab], count[lab]
            marks = []

            def fn(i, step=s.step):
                step(i)
                marks.append(time.perf_counter())
            s.sync()
            t0 = time.perf_counter()
            s.busy(n_busy)
            samples[lab].append(s.timer.sample(fn, 0, k))
            if (marks[-1] - t0) * 1e3 > n_busy * one:
                gapless[lab] = False
            s.sync()
    return {lab: spread(v) for lab, v in samples.items()}, gapless


def our_side(h, step):
    """The :class:`Side` of our handler's step (busy gemms on group 0)."""
    a, c = h.zeros((BUSY_N, BUSY_N)), h.zeros((BUSY_N, BUSY_N))

    def busy(n):
        for _ in range(n):
            h.dot_mm(a, a, c)
    return Side(EventTimer("pycuda", h.stream), step, h.synchronize_all_streams, busy)


def torch_side(torch, step):
    """The :class:`Side` of a PyTorch step (busy gemms on the current stream)."""
    a = torch.zeros(BUSY_N, BUSY_N, device="cuda")
    c = torch.empty_like(a)

    def busy(n):
        for _ in range(n):
            torch.mm(a, a, out=c)
    return Side(EventTimer("torch", module=torch), step, torch.cuda.synchronize, busy)


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


def handler_or_skip(suite, choice):
    """(handler, timer) of ``make_handler``, or (None, None) after printing
    that ``suite`` skipped for want of a GPU (its ``--handler numpy`` runs
    on NumpyHandler instead)."""
    h, timer, reason = make_handler(choice)
    if h is None:
        print(f"{suite}: skipped, this suite needs a GPU (PyCudaHandler unavailable: "
              f"{reason}); '--handler numpy' times NumpyHandler instead")
    return h, timer


def _figures(ms, n, issue=None, device=None, gapless=None):
    """A library's result dict: spreads of ms, samples/s from the median."""
    out = {"ms": ms, "samples_per_s": n / med(ms) * 1e3}
    if issue is not None:
        out.update(host_issue_ms=issue, device_ms=device, device_gapless=gapless)
    return out


def main(argv=None):
    """Run the suite (options: ``--help``); returns the exit status."""
    p = suite_parser("train", __doc__)
    p.add_argument("--handler", choices=("pycuda", "numpy"), default="pycuda",
                   help="pycuda (default; skips without a GPU) or numpy")
    p.add_argument("--models", default="mlp,lstm", help="comma separated: mlp, lstm")
    p.add_argument("--small", action="store_true", help="tiny models (smoke test)")
    p.add_argument("--reps", type=int, default=20, help="timed samples of each figure")
    p.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="captured rows: ours (Handler.capture) and each PyTorch peer "
                        "graphed (torch.cuda.graph), and torch.compile graphed; on by "
                        "default, GPU only")
    P.add_options(p)
    args = p.parse_args(argv)
    which = P.chosen(p, args)
    h, timer = handler_or_skip("train", args.handler)
    if h is None:
        return 0
    gpu = args.handler == "pycuda"
    device = gpu_name() if gpu else "CPU"
    run = Run("train", device, vars(args))
    torch = optional_peers().get("torch") if gpu else None
    print(f"training step, float32, {device}; {type(h).__name__}"
          f"{' vs PyTorch (TF32 off)' if torch else ' (PyTorch not available)'}; "
          f"{args.reps} samples per figure")
    jax = P.import_jax(gpu=True) if gpu and "jax" in which else None
    if gpu and which:
        print(P.describe(which, torch, jax))
    reps = args.reps
    rows, breakdown, results = [], [], {"device": device, "models": {}, "checks": []}
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        cfg = MODELS[model][1 if args.small else 0]
        peers, notes = (P.make_peers(model, cfg, which, LR, MOMENTUM, torch, jax) if gpu
                        else ({}, {}))
        results["checks"] += run_checks(h, model, cfg, torch, peers, notes)
        P.drop_over_limit(peers, notes, args.compile_limit)   # the checks compiled them
        if gpu and args.graphs:
            results["checks"].append(capture_check(h, model, cfg))
        ops, keep = record_step(h, model, cfg)
        net, batches, n = build(h, model, cfg)
        step = handler_step(h, net, batches)
        cases, sides = {OURS: (timer, step)}, {}
        if gpu:
            sides[OURS] = our_side(h, step)
        if model == "lstm":   # the same-run baseline of issue 20's eager target
            from benchmarks.unfused_lstm import UnfusedLSTM
            fn = handler_step(h, build(h, model, cfg, lstm=UnfusedLSTM)[0], batches)
            cases[OURS_UNFUSED] = (timer, fn)
            if gpu:
                sides[OURS_UNFUSED] = our_side(h, fn)
        if gpu and args.graphs:
            fn = our_captured(h, handler_step(h, build(h, model, cfg)[0], batches))
            sides[OURS_CAPTURED] = our_side(h, fn)
            cases[OURS_CAPTURED] = (timer, fn)
        if torch is not None:
            tb = torch_batches(torch, batches, torch.float32)
            for label, (params, forward, _) in torch_models(
                    torch, model, cfg, our_params(net), torch.float32).items():
                fn = torch_step(torch, params, forward, tb)
                sides[label] = torch_side(torch, fn)
                cases[label] = (sides[label].timer, fn)
                if args.graphs:
                    params2, forward2, _ = torch_models(torch, model, cfg, our_params(net),
                                                        torch.float32)[label]
                    graphed = torch_graphed(torch, torch_step(torch, params2, forward2, tb))
                    sides[label + ", graphed"] = torch_side(torch, graphed)
                    cases[label + ", graphed"] = (sides[label + ", graphed"].timer, graphed)
        # one compiled step, its copies: no second compile; PyTorch's rows also
        # get their host issue and device time (sides), JAX's a host clock
        for lab, (peer_timer, fn) in P.timed_cases(peers, our_params(net), batches, notes,
                                                   args.graphs).items():
            if P.compiled_of(lab) in P.TORCH_MODES:
                sides[lab] = torch_side(torch, fn)
                peer_timer = sides[lab].timer
            cases[lab] = (peer_timer, fn)
        ms = interleaved(cases, reps)
        k = max(1, min(ISSUE_STEPS, QUEUE_OPS // max(1, len(ops))))
        issue = host_issue(sides, reps, k) if sides else {}
        dev, gapless = device_time(sides, issue, reps, k) if sides else ({}, {})
        figs = {lab: _figures(ms[lab], n, issue.get(lab), dev.get(lab), gapless.get(lab))
                for lab in cases}
        entry = {"config": cfg, "samples": n, "ops_per_step": len(ops), "ours": figs[OURS]}
        if OURS_CAPTURED in figs:
            entry["ours_captured"] = figs[OURS_CAPTURED]
        if OURS_UNFUSED in figs:
            entry["ours_unfused"] = figs[OURS_UNFUSED]
        if torch is not None:
            entry["torch"] = {lab: f for lab, f in figs.items()
                              if lab not in (OURS, OURS_CAPTURED, OURS_UNFUSED, *NEW_PEERS)}
        if gpu and which:         # apart from "torch": the report's graphed peers stay as were
            for lab in NEW_PEERS:
                if lab in figs:
                    pk = peers[P.compiled_of(lab)]
                    figs[lab]["compile_s"] = pk.compile_s
            entry["peers"] = {lab: figs[lab] for lab in NEW_PEERS if lab in figs}
            entry["peer_notes"] = dict(notes)
        if sides:
            entry["issue_steps"] = k

        eager = med(ms["PyTorch eager"]) if "PyTorch eager" in ms else None
        for lab, f in figs.items():
            t = med(f["ms"])
            name = {OURS: type(h).__name__,
                    OURS_CAPTURED: type(h).__name__ + ", captured",
                    OURS_UNFUSED: type(h).__name__ + ", unfused LSTM"}.get(lab, lab)
            if "host_issue_ms" in f:
                hi, dv = med(f["host_issue_ms"]), med(f["device_ms"])
                verdict = "launch-bound" if hi > dv else "device-bound"
                extra = [hi, dv, verdict + ("" if f["device_gapless"] else " (?)")]
            else:
                extra = ["-", "-", "-"]
            note = P.note(lab, peers) if lab in NEW_PEERS else ""
            rows.append([model, name, t, f["samples_per_s"], *extra,
                         f"{eager / t:.2f}x" if eager else "-", note])
        for lab in NEW_PEERS:     # the peers that did not run: the row says why
            if lab in notes and lab not in figs:
                rows.append([model, lab, "-", "-", "-", "-", "-", "-", notes[lab]])

        cats = {}
        for op in ops:
            cats.setdefault(op[0], []).append(op)
        sub = max(3, reps // 2)
        parts, eager_parts = {}, set()
        for c, o in list(cats.items()) + [(SERIAL, ops)]:
            fn = replayed(h, o, gpu)
            if fn is None:
                fn = replay(h, o)
                if gpu:   # off the GPU every figure is the host's
                    eager_parts.add(c)
            parts[c] = timer.time(fn, reps=sub)
        serial = parts.pop(SERIAL)
        entry["breakdown_ms"] = parts
        entry["breakdown_serial_ms"] = serial
        # how the figures were taken: the report judges the gemm ratio on graphs only
        entry["breakdown_replay"] = "graph" if gpu and not eager_parts else "eager"
        ours_ms = med(ms[OURS])
        for c in ("gemm", "elementwise", "sum_t (bias, loss)", "update"):
            if c in parts:
                breakdown.append((model, c + (" (eager)" if c in eager_parts else ""),
                                  len(cats[c]), parts[c], f"{100 * parts[c] / ours_ms:.0f}%"))
        breakdown.append((model, SERIAL + (" (eager)" if SERIAL in eager_parts else ""),
                          len(ops), serial, f"{100 * serial / ours_ms:.0f}%"))
        results["models"][model] = entry
        del keep
        desc = ", ".join(f"{key}={v}" for key, v in cfg.items())
        line = f"  {model}: {desc}; {len(ops)} ops per step"
        if sides:
            line += f"; host issue and device time over {k} step(s) back to back"
        print(line)

    print()
    headers = ["model", "library", "ms / step", "samples / s", "host issue ms",
               "device ms", "verdict", "speed vs PyTorch eager", "notes"]
    if not any(r[-1] for r in rows):      # no compiled peers: the table as it was
        headers, rows = headers[:-1], [r[:-1] for r in rows]
    print_table(headers, rows)
    for model, entry in results["models"].items():
        cap = entry.get("ours_captured")
        graphed = {**(entry.get("torch") or {}), **(entry.get("peers") or {})}
        for lab, f in graphed.items():
            if cap is not None and lab.endswith(", graphed"):
                print(f"{model}: ours captured / {lab}: "
                      f"{med(cap['ms']) / med(f['ms']):.3f}x the time per step")
        if cap is not None and entry.get("peers"):
            P.judge_strongest(model, med(cap["ms"]), {k: med(f["ms"]) for k, f in graphed.items()})
    if any(r[6].endswith("(?)") for r in rows):
        print("(?): issuing outlasted the busy job that held the device (full launch "
              "queue?); device ms is an upper bound")
    print()
    print("where a step's time goes (each category replayed alone, serially, from a graph "
          "on the GPU):")
    print_table(["model", "category", "ops", "ms", "% of step"], breakdown)
    for model, entry in results["models"].items():
        cap, gemm = entry.get("ours_captured"), entry.get("breakdown_ms", {}).get("gemm")
        if cap is not None and gemm:
            ratio = med(cap["ms"]) / gemm
            target = "" if model != "mlp" else \
                f" (target <= {GEMM_RATIO}x: {'yes' if ratio <= GEMM_RATIO else 'NO'})"
            print(f"{model}: ours captured / its gemms replayed alone ({gemm:.4f} ms): "
                  f"{ratio:.3f}x{target}")
    if args.save:
        run.save(results)
    return 0
