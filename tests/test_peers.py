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
    peers, notes = train.make_peers("lstm", small("lstm"), {"compile", "jax"}, None,
                                    (None, None, "jax not importable (x)"))
    assert peers == {}
    assert notes[train.COMPILE] == "not run: PyTorch not available"
    assert notes[train.JAX_JIT] == notes[train.JAX_UNROLLED] == "not run: jax not importable (x)"
    _, notes = train.make_peers("mlp", small("mlp"), {"jax"}, None, (None, None, "no"))
    assert list(notes) == [train.JAX_JIT]       # the MLP has no scan to unroll


@pytest.mark.parametrize("model", ["mlp", "lstm"])
def test_jax_jit_agrees(model, jax_cpu):
    """JAX jit (and for the LSTM the unrolled scan): the first two losses and
    the first update, through the suite's checks and against float64."""
    cfg = small(model)
    peers, notes = train.make_peers(model, cfg, {"jax"}, None, jax_cpu)
    assert notes == {}
    assert set(peers) == ({train.JAX_JIT, train.JAX_UNROLLED} if model == "lstm"
                          else {train.JAX_JIT})
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
    peer = train.make_peers("mlp", cfg, {"jax"}, None, jax_cpu)[0][train.JAX_JIT]
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
    peers, notes = train.make_peers(model, cfg, {"compile"}, torch, device="cpu")
    assert notes == {} and list(peers) == [train.COMPILE]
    checked(model, dict(peers))
    assert peers[train.COMPILE].compile_s > 0
    p0, batches, ref = reference_losses(model, cfg)
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = two_losses(peers[train.COMPILE], p0, batches)
    assert got == pytest.approx(ref, rel=TOL)
