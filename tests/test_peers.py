"""The compiled peers of the train suite (benchmarks/peers.py) on the CPU.

Each peer's first two losses (two steps on the suite's two batches) against
an independent float64 NumPy computation of those steps and against our
handler's, and its first parameter update against ``reference_step``, the
latter through the suite's own ``run_checks``.  torch and jax are not project
dependencies: the tests that need them skip where they are absent (as on CI).
The CUDA parts (events, the graph capture of the compiled step) run only in
the suite on a GPU.
"""
import numpy as np
import pytest

from benchmarks import peers as P
from benchmarks import train
from handlers import NumpyHandler

#: the suite's tolerance of float32 against float64
TOL = train.CHECK_TOL


def small(model):
    """The suite's ``--small`` sizes of ``model``."""
    return train.MODELS[model][1]


def reference_losses(model, cfg):
    """(initial params, batches, the first two losses in float64 NumPy): the
    loss of step 1 is the reference loss at the parameters step 0 left (its
    update is plain SGD, the momentum buffer starting at 0)."""
    h = NumpyHandler(np.float32)
    net, batches, _ = train.build(h, model, cfg)
    p0 = train.our_params(net)
    losses, p = [], p0
    for x, y in batches:
        x32 = np.asarray(x, np.float32).astype(np.float64)   # the batch every peer gets
        loss, p = train.reference_step(model, p, x32, y[:, 0])
        losses.append(loss)
    return p0, batches, losses


def two_losses(peer, p0, batches):
    """The first two losses of a fresh copy of ``peer``."""
    copy = peer.copy(p0, batches)
    return [float(copy.step(0)), float(copy.step(1))]


def checked(model, peers):
    """Run the suite's checks with ``peers`` on NumpyHandler; return the
    records (each asserted ok) and the peers' notes (asserted empty)."""
    notes = {}
    checks = train.run_checks(NumpyHandler(np.float32), model, small(model), None, peers, notes)
    assert notes == {}
    assert [c["what"].split(" ", 1)[1] for c in checks] == [
        "loss of one step", "parameter update of one SGD step",
        "first two losses of the compiled peers"]
    for c in checks:
        assert c["ok"], c
        assert set(peers) <= set(c["errors"]), c
    return checks


@pytest.fixture(scope="module")
def jax_cpu():
    """(jax, its CPU device, None), as the suite's ``import_jax`` sets it up."""
    pytest.importorskip("jax")
    jx = P.import_jax(gpu=False)
    assert jx[0] is not None, jx[2]
    return jx


def test_layout_round_trip():
    """Peer layout and back gives our parameters (float32 values)."""
    for model in ("mlp", "lstm"):
        net, _, _ = train.build(NumpyHandler(np.float32), model, small(model))
        p0 = train.our_params(net)
        back = P.from_peer_layout(model, P.peer_layout(model, p0))
        assert [a.shape for a in back] == [a.shape for a in p0]
        for a, b in zip(back, p0):
            np.testing.assert_array_equal(a, b)


def test_missing_peers_are_noted():
    """Without torch or jax, ``make_peers`` returns no peer and says why per row."""
    peers, notes = P.make_peers("lstm", small("lstm"), {"compile", "jax"}, train.LR,
                                train.MOMENTUM, None, (None, None, "jax not importable (x)"))
    assert peers == {}
    assert notes[P.COMPILE] == "not run: PyTorch not available"
    assert notes[P.JAX_JIT] == notes[P.JAX_UNROLLED] == "not run: jax not importable (x)"
    _, notes = P.make_peers("mlp", small("mlp"), {"jax"}, train.LR, train.MOMENTUM, None,
                            (None, None, "no"))
    assert list(notes) == [P.JAX_JIT]       # the MLP has no scan to unroll


@pytest.mark.parametrize("model", ["mlp", "lstm"])
def test_jax_jit_agrees(model, jax_cpu):
    """JAX jit (and for the LSTM the unrolled scan): the first two losses and
    the first update, through the suite's checks and against float64."""
    cfg = small(model)
    peers, notes = P.make_peers(model, cfg, {"jax"}, train.LR, train.MOMENTUM, None, jax_cpu)
    assert notes == {}
    assert set(peers) == ({P.JAX_JIT, P.JAX_UNROLLED} if model == "lstm"
                          else {P.JAX_JIT})
    checks = checked(model, dict(peers))
    p0, batches, ref = reference_losses(model, cfg)
    for label, peer in peers.items():
        assert peer.compile_s is not None and peer.compile_s > 0
        got = two_losses(peer, p0, batches)      # a second copy: compiled already
        assert checks[-1]["losses"][label] == pytest.approx(got, rel=1e-6)
        assert got == pytest.approx(ref, rel=TOL), label


def test_host_clock_timer(jax_cpu):
    """The timer of the JAX rows, through the suite's interleaved loop."""
    from benchmarks.gpu import interleaved
    cfg = small("mlp")
    peer = P.make_peers("mlp", cfg, {"jax"}, train.LR, train.MOMENTUM, None,
                        jax_cpu)[0][P.JAX_JIT]
    p0, batches, _ = reference_losses("mlp", cfg)
    copy = peer.copy(p0, batches)
    ms = interleaved({"jax": (P.HostClockTimer(copy.sync, steps=3), copy.step)}, reps=2,
                     warmup=1)["jax"]
    assert ms["n"] == 2 and ms["median"] > 0


@pytest.mark.parametrize("model", ["mlp", "lstm"])
def test_torch_functional_step_agrees(model):
    """The step torch.compile compiles, run eagerly: the same losses and update."""
    torch = pytest.importorskip("torch")
    cfg = small(model)
    fn = P.torch_step_fn(torch, model, cfg, train.LR, train.MOMENTUM, compile=False)
    peer = P.PeerStep("torch", torch, model, fn, torch.device("cpu"))
    checked(model, {"torch eager, functional": peer})
    p0, batches, ref = reference_losses(model, cfg)
    assert two_losses(peer, p0, batches) == pytest.approx(ref, rel=TOL)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("model", ["mlp", "lstm"])
def test_torch_compile_agrees(model):
    """torch.compile of the whole step (about 10-20 s of compiling each on
    two CPU cores): the suite's checks, the two losses against float64, and
    a second copy that runs the compiled step without compiling again (as
    the suite's "torch.compile" and "torch.compile, graphed" rows do)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch._inductor")
    cfg = small(model)
    peers, notes = P.make_peers(model, cfg, {"compile"}, train.LR, train.MOMENTUM, torch,
                                device="cpu")
    assert notes == {} and list(peers) == [P.COMPILE]
    checked(model, dict(peers))
    assert peers[P.COMPILE].compile_s > 0
    p0, batches, ref = reference_losses(model, cfg)
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = two_losses(peers[P.COMPILE], p0, batches)
    assert got == pytest.approx(ref, rel=TOL)


# ------------------------------------------------ the conv and half suites
#: a small LeNet-style net (``benchmarks.conv.LENET``'s keys): a padded and
#: an unpadded convolution, each side divisible by the pool
LENET_SMALL = {"batch": 4, "side": 12, "convs": ((1, 3, 3, 1), (3, 4, 3, 0)), "pool": 2,
               "dense": (16, 8, 10)}
#: a tiny MLP of the half suite's ``MLP`` keys
MLP_TINY = dict(width=32, batch=16, layers=3, lr=1e-3)


def lenet_reference(cfg, params, x, labels, lr=train.LR):
    """One training step of the LeNet-style net in float64 NumPy, independent
    of the handlers and the peers: (loss, updated params), the first
    SGD-momentum update being ``p - lr * g``."""
    from benchmarks.conv import _conv_ref
    params = [np.asarray(p, np.float64) for p in params]
    a = np.asarray(x, np.float64)
    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    nc, q = len(cfg["convs"]), cfg["pool"]
    cache = []
    for k, (_, _, _, pad) in enumerate(cfg["convs"]):
        W, b = params[2 * k], params[2 * k + 1]
        z = _conv_ref(a, W, pad) + b[None, :, None, None]
        r = np.maximum(z, 0.0)
        n, c, s, _ = r.shape
        pooled = r.reshape(n, c, s // q, q, s // q, q).max(axis=(3, 5))
        # the gradient goes to the window's maximum (ties only at ReLU's 0,
        # where the gradient is 0 whichever element takes it)
        up = pooled.repeat(q, axis=2).repeat(q, axis=3)
        cache.append((a, z, r == up, pad))
        a = pooled
    shape = a.shape
    acts, zs = [a.reshape(shape[0], -1)], []
    dense = params[2 * nc:]
    for k in range(len(dense) // 2):
        z = acts[-1] @ dense[2 * k] + dense[2 * k + 1]
        zs.append(z)
        acts.append(np.maximum(z, 0.0) if k < len(dense) // 2 - 1 else z)
    loss, d = train._softmax_ce(acts[-1], labels)
    grads = [None] * len(params)
    for k in reversed(range(len(dense) // 2)):
        grads[2 * nc + 2 * k] = acts[k].T @ d
        grads[2 * nc + 2 * k + 1] = d.sum(axis=0, keepdims=True)
        d = d @ dense[2 * k].T
        if k:
            d = d * (zs[k - 1] > 0)
    d = d.reshape(shape)
    for k in reversed(range(nc)):
        a_in, z, mask, pad = cache[k]
        W = params[2 * k]
        dz = mask * d.repeat(q, axis=2).repeat(q, axis=3) * (z > 0)
        ap = np.pad(a_in, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        win = np.lib.stride_tricks.sliding_window_view(ap, dz.shape[2:], axis=(2, 3))
        grads[2 * k] = np.einsum("ncrspq,nkpq->kcrs", win, dz)
        grads[2 * k + 1] = dz.sum(axis=(0, 2, 3))
        kk = W.shape[2]
        d = _conv_ref(dz, W[:, :, ::-1, ::-1].transpose(1, 0, 2, 3), kk - 1 - pad)
    return loss, [p - lr * g for p, g in zip(params, grads)]


def lenet_setup(cfg=LENET_SMALL):
    """(our initial params, the batch, the first two losses and the first
    update in float64): both steps on the suite's one batch."""
    from benchmarks import conv
    net, _ = conv._lenet(NumpyHandler(np.float32), cfg)
    p0 = train.our_params(net)
    x, y = conv.lenet_batch(cfg)
    loss0, p1 = lenet_reference(cfg, p0, x, y[:, 0])
    loss1, _ = lenet_reference(cfg, p1, x, y[:, 0])
    return p0, [(x, y)], [loss0, loss1], p1


def assert_lenet_agrees(peer, cfg=LENET_SMALL):
    """``peer``'s first two losses and first update against float64, and its
    two losses against ours through the suite's own check."""
    from benchmarks import conv
    p0, batches, ref, ref_p1 = lenet_setup(cfg)
    copy = peer.copy(p0, batches)
    first = float(copy.step(0))
    update = np.concatenate([(a - b).ravel() for a, b in zip(copy.to_ours(), p0)])
    ref_update = np.concatenate([(a - b).ravel() for a, b in zip(ref_p1, p0)])
    assert train.rel_error(update, ref_update) < conv.CONV_TOL
    got = [first, float(copy.step(1))]
    assert got == pytest.approx(ref, rel=conv.CONV_TOL)
    notes, checks = {}, []
    conv.check_lenet_peers(NumpyHandler(np.float32), {"peer": peer}, notes, checks, cfg)
    assert notes == {} and len(checks) == 1 and checks[0]["ok"], checks
    return got, ref


def test_lenet_layout_and_reference():
    """The LeNet-style parameters round-trip through the peer layout, and the
    float64 reference step agrees with our float32 step on NumpyHandler."""
    from benchmarks import conv
    h = NumpyHandler(np.float32)
    net, opt = conv._lenet(h, LENET_SMALL)
    p0 = train.our_params(net)
    back = P.from_peer_layout("convnet", P.peer_layout("convnet", p0))
    assert [a.shape for a in back] == [a.shape for a in p0]
    for a, b in zip(back, p0):
        np.testing.assert_array_equal(a, b)
    _, batches, ref, ref_p1 = lenet_setup()
    x, y = batches[0]
    loss = float(h.get_numpy_copy(net.train_step(h.create_from_numpy(x),
                                                 h.create_from_numpy(y)))[0])
    opt.step()
    assert loss == pytest.approx(ref[0], rel=conv.CONV_TOL)
    ours = np.concatenate([(a - b).ravel() for a, b in zip(train.our_params(net), p0)])
    want = np.concatenate([(a - b).ravel() for a, b in zip(ref_p1, p0)])
    assert train.rel_error(ours, want) < conv.CONV_TOL


def test_lenet_torch_functional_step_agrees():
    """The LeNet-style step torch.compile compiles, run eagerly."""
    torch = pytest.importorskip("torch")
    fn = P.torch_step_fn(torch, "convnet", LENET_SMALL, train.LR, train.MOMENTUM, compile=False)
    assert_lenet_agrees(P.PeerStep("torch", torch, "convnet", fn, torch.device("cpu")))


def test_lenet_jax_jit_agrees(jax_cpu):
    """JAX jit of the LeNet-style step (conv_general_dilated, reduce_window)."""
    peers, notes = P.make_peers("convnet", LENET_SMALL, {"jax"}, train.LR, train.MOMENTUM,
                                jax=jax_cpu)
    assert notes == {} and list(peers) == [P.JAX_JIT]
    assert_lenet_agrees(peers[P.JAX_JIT])
    assert peers[P.JAX_JIT].compile_s > 0


@pytest.mark.timeout(240)
def test_lenet_torch_compile_agrees():
    """torch.compile of the LeNet-style step, and a second copy without a
    second compile (as the conv suite's two rows)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch._inductor")
    peers, notes = P.make_peers("convnet", LENET_SMALL, {"compile"}, train.LR, train.MOMENTUM,
                                torch=torch, device="cpu")
    assert notes == {} and list(peers) == [P.COMPILE]
    got, ref = assert_lenet_agrees(peers[P.COMPILE])        # compiles
    assert peers[P.COMPILE].compile_s > 0
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert assert_lenet_agrees(peers[P.COMPILE])[0] == got


def half_peers(torch=None, jax=None, which=("compile", "jax"), compute="bfloat16",
               compile=False):
    """The half suite's peers of ``MLP_TINY`` on the CPU (compute format
    ``compute``; torch's step eager unless ``compile``)."""
    from benchmarks import half
    cfg = dict(half.peer_cfg(MLP_TINY), compute=compute)
    lr = MLP_TINY["lr"]
    peers, notes = P.make_peers("mlp", cfg, set(which), lr, 0.0, torch, jax, device="cpu")
    assert notes == {}
    if P.COMPILE in peers and not compile:
        fn = P.torch_step_fn(torch, "mlp", cfg, lr, 0.0, compile=False)
        peers[P.COMPILE] = P.PeerStep("torch", torch, "mlp", fn, torch.device("cpu"))
    return peers


def autocast_update(torch, p0, batch):
    """The first update (``-lr * g``) of the mixed step as the half suite's
    PyTorch peer computes it: eager, ``torch.autocast(bfloat16)``."""
    x = torch.tensor(batch[0], dtype=torch.float32)
    y = torch.tensor(batch[1][:, 0]).long()
    ps = [torch.tensor(a, requires_grad=True) for a in P.peer_layout("mlp", p0)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = x
        for k in range(len(ps) // 2):
            z = torch.nn.functional.linear(z, ps[2 * k].T, ps[2 * k + 1])
            z = torch.relu(z) if k < len(ps) // 2 - 1 else z
        loss = torch.nn.functional.cross_entropy(z.float(), y)
    loss.backward()
    g = P.from_peer_layout("mlp", [p.grad.numpy() for p in ps])
    return np.concatenate([(-MLP_TINY["lr"] * a).ravel() for a in g])


def assert_half_agrees(peers, f32_peers, torch=None):
    """Each bfloat16 peer: its first two losses against the same step in
    float32 (bfloat16 tolerance, ``half._tol``); its first update against
    our mixed step's on NumpyHandler (and with ``torch`` against autocast's),
    not float32's: at this width bfloat16 moves the first layers' gradients
    by up to a third of their largest element, ours and autocast's alike;
    and its two losses against ours through the suite's own check."""
    from benchmarks import half
    h = NumpyHandler(np.float32)
    notes, checks = {}, []
    p0, batches = half.check_mlp_peers(h, peers, notes, checks, MLP_TINY)
    assert notes == {} and len(checks) == 1 and checks[0]["ok"], checks
    tol = half._tol(MLP_TINY["width"])
    net, step, _ = half._mlp_net(h, "bfloat16", MLP_TINY)
    step(0)
    ours = np.concatenate([(a - b).ravel() for a, b in zip(train.our_params(net), p0)])
    out = {}
    for label, peer in peers.items():
        runs = {}
        for name, pk in (("bf16", peer), ("f32", f32_peers[label])):
            copy = pk.copy(p0, batches)
            first = float(copy.step(0))
            upd = np.concatenate([(a - b).ravel() for a, b in zip(copy.to_ours(), p0)])
            runs[name] = ([first, float(copy.step(1))], upd)
        assert runs["bf16"][0] == pytest.approx(runs["f32"][0], rel=tol), label
        assert train.rel_error(runs["bf16"][1], ours) < tol, label
        if torch is not None:
            assert train.rel_error(runs["bf16"][1], autocast_update(torch, p0, batches[0])) < tol
        out[label] = (runs["bf16"][0], runs["f32"][0], checks[0]["losses"]["ours"])
    return out


def test_half_torch_functional_step_agrees():
    """The mixed bfloat16 MLP step torch.compile compiles, run eagerly."""
    torch = pytest.importorskip("torch")
    assert_half_agrees(half_peers(torch=torch, which=("compile",)),
                       half_peers(torch=torch, which=("compile",), compute=None), torch)


def test_half_jax_jit_agrees(jax_cpu):
    """JAX jit of the mixed bfloat16 MLP step."""
    assert_half_agrees(half_peers(jax=jax_cpu, which=("jax",)),
                       half_peers(jax=jax_cpu, which=("jax",), compute=None))


@pytest.mark.timeout(240)
def test_half_torch_compile_agrees():
    """torch.compile of the mixed bfloat16 MLP step."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch._inductor")
    peers = half_peers(torch=torch, which=("compile",), compile=True)
    f32 = half_peers(torch=torch, which=("compile",), compute=None)
    got = assert_half_agrees(peers, f32, torch)                # compiles
    assert peers[P.COMPILE].compile_s > 0
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert assert_half_agrees(peers, f32) == got


def test_suite_options():
    """--peers and --compile-limit parse in the conv and half suites."""
    import argparse
    p = argparse.ArgumentParser()
    P.add_options(p)
    assert P.chosen(p, p.parse_args([])) == {"compile", "jax"}
    assert P.chosen(p, p.parse_args(["--peers", "none"])) == set()
    assert P.chosen(p, p.parse_args(["--peers", "autotune,jax"])) == {"autotune", "jax"}
    with pytest.raises(SystemExit):
        P.chosen(p, p.parse_args(["--peers", "tf"]))
    # max-autotune is opt-in, a row of its own and its graphed row a strongest peer
    _, notes = P.make_peers("mlp", small("mlp"), {"autotune"}, 0.1, 0.9, None)
    assert notes == {P.AUTOTUNE: "not run: PyTorch not available"}
    assert P.compiled_of(P.AUTOTUNE_GRAPHED) == P.AUTOTUNE
    assert P.compiled_of(P.COMPILE_GRAPHED) == P.COMPILE
    assert P.compiled_of(P.JAX_JIT) == P.JAX_JIT
    assert set(P.strongest({P.AUTOTUNE_GRAPHED: 1.0, P.AUTOTUNE: 0.5, "ours": 0.1})) \
        == {P.AUTOTUNE_GRAPHED}
    peers, notes = P.make_peers("convnet", LENET_SMALL, {"compile", "jax"}, 0.1, 0.9, None,
                                (None, None, "no"))
    assert peers == {} and notes == {P.COMPILE: "not run: PyTorch not available",
                                     P.JAX_JIT: "not run: no"}


# ------------------------------------------------------------------ the GPT
def _gpt_case(precision="f32"):
    """(params, batches, our first two losses, the peers' cfg) of the gpt
    suite's small GPT on NumpyHandler float32."""
    from benchmarks import gpt as G
    batches = G.make_batches(G.SMALL)
    net = G.build(NumpyHandler(np.float32), G.SMALL, precision)
    params = train.our_params(net)
    step = G.our_step(net, batches)
    ours = [float(net.h.get_numpy_copy(step(i))[0]) for i in range(2)]
    cfg = dict(G.SMALL, compute="bfloat16") if precision == "bf16" else dict(G.SMALL)
    return params, batches, ours, cfg


def test_gpt_layout_round_trip():
    params, *_ = _gpt_case()
    back = P.from_peer_layout("gpt", P.peer_layout("gpt", params))
    for a, b in zip(back, params):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_gpt_peers_agree_with_ours(precision, jax_cpu):
    """PyTorch eager (SDPA) and JAX jit on the CPU: the first two losses of
    the suite's small GPT equal ours (float32: to rounding; bf16 mixed
    precision: to bfloat16's)."""
    torch = pytest.importorskip("torch")
    params, batches, ours, cfg = _gpt_case(precision)
    peers = {"torch": P.PeerStep("torch", torch, "gpt", P.torch_step_fn(
                 torch, "gpt", cfg, train.LR, train.MOMENTUM, compile=False),
                 torch.device("cpu")),
             "jax": P.jax_peer(jax_cpu[0], "gpt", cfg, train.LR, train.MOMENTUM, jax_cpu[1])}
    notes = {}
    two = P.first_two_losses(peers, params, batches, notes)
    assert notes == {}
    for label, losses in two.items():
        assert losses == pytest.approx(ours, rel=1e-5 if precision == "f32" else 3e-2), label
