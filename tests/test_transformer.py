"""The transformer's layers per handler (``MultiHeadAttention``, ``RMSNorm``,
``PositionEmbedding``, ``Reshape``, ``Embedding`` over (B, T) ids): gradients
against float64 central differences and each handler against float64
(``check_layer_gradients``), the causal mask seen from the outside, and a
small GPT that learns."""
import numpy as np
import pytest

from examples.gpt import build as build_gpt
from handlers.testing import check_layer_gradients
from layers import (
    SGD,
    Embedding,
    LayerNorm,
    MultiHeadAttention,
    PositionEmbedding,
    Reshape,
    Residual,
    RMSNorm,
    Sequential,
    SoftmaxCrossEntropy,
)

LAYERS = {
    "mha": (lambda: MultiHeadAttention(8, 2), (2, 5, 8)),
    "mha-causal": (lambda: MultiHeadAttention(6, 3, causal=True), (3, 4, 6)),
    "mha-one-head-one-step": (lambda: MultiHeadAttention(4, 1, causal=True), (2, 1, 4)),
    "rmsnorm": (lambda: RMSNorm(5), (3, 5)),
    "rmsnorm-3d": (lambda: RMSNorm(4, eps=1e-3), (2, 3, 4)),
    "position": (lambda: PositionEmbedding(7, 4), (2, 5, 4)),
    "position-full": (lambda: PositionEmbedding(3, 2), (4, 3, 2)),
    "reshape": (lambda: Reshape(-1, 4), (2, 3, 4)),
    "block": (lambda: Residual([LayerNorm(8), MultiHeadAttention(8, 2, causal=True)]),
              (2, 4, 8)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_gradients(handler, rng, name):
    make, shape = LAYERS[name]
    check_layer_gradients(handler, make(), shape, rng, params="random")


def test_attention_layer_is_causal(handler, rng):
    """With ``causal``, position t's output ignores the inputs after t."""
    net = Sequential(handler, [MultiHeadAttention(8, 2, causal=True)], SoftmaxCrossEntropy(),
                     seed=1)
    x = rng.uniform(-1, 1, (2, 6, 8))
    first = handler.get_numpy_copy(net.forward(handler.create_from_numpy(x))).copy()
    x[:, 4:] += 3.0
    second = handler.get_numpy_copy(net.forward(handler.create_from_numpy(x)))
    np.testing.assert_array_equal(first[:, :4], second[:, :4])
    assert not np.allclose(first[:, 4:], second[:, 4:])


def test_embedding_of_sequences(handler, rng):
    """(B, T) ids give (B, T, d) rows, the table's rows; the gradient of a
    repeated id adds up."""
    emb = Embedding(5, 3)
    net = Sequential(handler, [emb, Reshape(-1, 3)], SoftmaxCrossEntropy(), seed=2)
    ids = np.array([[0, 4, 4], [2, 0, 1]], dtype=np.float64)
    y = handler.get_numpy_copy(emb.forward(handler.create_from_numpy(ids)))
    table = handler.get_numpy_copy(emb.params["W"])
    np.testing.assert_array_equal(y, table[ids.astype(int)])
    dy = rng.uniform(-1, 1, (2, 3, 3))
    emb.backward(handler.create_from_numpy(dy))
    want = np.zeros((5, 3))
    np.add.at(want, ids.astype(int).ravel(), dy.astype(handler.dtype).reshape(-1, 3))
    np.testing.assert_allclose(handler.get_numpy_copy(emb.grads["W"]), want,
                               rtol=1e-5 if handler.dtype == np.float32 else 1e-12)
    assert net.parameters.names == ["0.Embedding.W"]


def tiny_gpt(h, vocab=11, context=8, d=16, heads=2, layers=2, seed=0):
    """A character GPT of ``layers`` blocks: the demo's network
    (``examples.gpt.build``: pre-norm attention and MLP blocks)."""
    return build_gpt(h, vocab, layers, d, heads, context, seed)


def test_a_tiny_gpt_learns_to_count(handler):
    """Sequences that count up modulo 11 from a random start: after a few
    hundred steps the next token is predicted well."""
    rng = np.random.default_rng(0)
    net = tiny_gpt(handler)
    opt = SGD(net.parameters, lr=0.3, momentum=0.9)
    losses = []
    for _ in range(150):
        start = rng.integers(0, 11, (16, 1))
        seq = (start + np.arange(9)) % 11
        x = handler.create_from_numpy(seq[:, :8].astype(np.float64))
        t = handler.create_from_numpy(seq[:, 1:].reshape(-1, 1).astype(np.float64))
        losses.append(float(handler.get_numpy_copy(net.train_step(x, t))[0]))
        opt.step()
    assert np.mean(losses[-10:]) < 0.2 * np.mean(losses[:10]), losses[::15]


def test_bad_arguments():
    with pytest.raises(ValueError, match="multiple of heads"):
        MultiHeadAttention(10, 3)
    with pytest.raises(TypeError, match="causal"):
        MultiHeadAttention(8, 2, causal=1)
    with pytest.raises(ValueError, match="eps"):
        RMSNorm(4, eps=0.0)
    with pytest.raises(ValueError, match="at most one -1"):
        Reshape(-1, -1)
    with pytest.raises(ValueError, match="context"):
        from handlers import NumpyHandler
        h = NumpyHandler()
        pos = PositionEmbedding(3, 2)
        Sequential(h, [pos], SoftmaxCrossEntropy())
        pos.forward(h.create_from_numpy(np.zeros((1, 4, 2))))


def _gpt_reference(P, ids, targets, blocks, heads):
    """tiny_gpt's mean loss in float64 NumPy from its state dict ``P``."""
    from math import erf
    erf_v = np.vectorize(erf)

    def norm(x, prefix):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * P[prefix + "gain"] + P[prefix + "bias"]

    x = P["0.Embedding.W"][ids.astype(int)]
    b, t, d = x.shape
    x = x + P["1.PositionEmbedding.P"][:t]
    dh = d // heads
    for i in range(blocks):
        a, m = f"{2 + 2 * i}.Residual.0.Chain.", f"{3 + 2 * i}.Residual.0.Chain."
        n = norm(x, a + "0.LayerNorm.")
        qkv = n @ P[a + "1.MultiHeadAttention.W_qkv"] + P[a + "1.MultiHeadAttention.b_qkv"]
        q, k, v = (qkv[..., j * d:(j + 1) * d].reshape(b, t, heads, dh).transpose(0, 2, 1, 3)
                   for j in range(3))
        z = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
        z = np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, z)
        p = np.exp(z - z.max(-1, keepdims=True))
        att = (p / p.sum(-1, keepdims=True)) @ v
        joined = att.transpose(0, 2, 1, 3).reshape(b, t, d)
        x = x + joined @ P[a + "1.MultiHeadAttention.W_o"] + P[a + "1.MultiHeadAttention.b_o"]
        n = norm(x, m + "0.LayerNorm.")
        hid = n @ P[m + "1.FullyConnected.W"] + P[m + "1.FullyConnected.b"]
        hid = 0.5 * hid * (1 + erf_v(hid / np.sqrt(2)))
        x = x + hid @ P[m + "3.FullyConnected.W"] + P[m + "3.FullyConnected.b"]
    last = 2 + 2 * blocks
    logits = (norm(x, f"{last}.LayerNorm.") @ P[f"{last + 1}.FullyConnected.W"]
              + P[f"{last + 1}.FullyConnected.b"]).reshape(b * t, -1)
    logits = logits - logits.max(1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return -logp[np.arange(b * t), targets.astype(int).ravel()].mean()


def test_gpt_step_equals_a_float64_numpy_reference(handler, rng):
    """A 2-block GPT's loss on this handler against the model written out
    in float64 NumPy from the handler's own parameters, and its gradients
    against central differences of that reference at 40 random
    parameters."""
    net = tiny_gpt(handler, vocab=7, context=6, d=8, heads=2, layers=2,
                   seed=int(rng.integers(2**31)))
    ids = rng.integers(0, 7, (3, 6)).astype(np.float64)
    targets = rng.integers(0, 7, (18, 1)).astype(np.float64)
    loss = net.train_step(handler.create_from_numpy(ids), handler.create_from_numpy(targets))
    P = {k: a.astype(np.float64) for k, a in net.state_dict().items()}
    want = _gpt_reference(P, ids, targets, 2, 2)
    exact = handler.dtype == np.float64
    np.testing.assert_allclose(handler.get_numpy_copy(loss)[0], want,
                               rtol=1e-12 if exact else 1e-5)
    grads = net.parameters.split(handler.get_numpy_copy(net.grads).astype(np.float64))
    names = list(P)
    picks = [(names[i], tuple(rng.integers(0, s) for s in P[names[i]].shape))
             for i in rng.integers(0, len(names), 40)]
    num, ana = [], []
    for name, at in picks:
        old = P[name][at]
        P[name][at] = old + 1e-6
        plus = _gpt_reference(P, ids, targets, 2, 2)
        P[name][at] = old - 1e-6
        minus = _gpt_reference(P, ids, targets, 2, 2)
        P[name][at] = old
        num.append((plus - minus) / 2e-6)
        ana.append(grads[name][at])
    num, ana = np.array(num), np.array(ana)
    err = np.abs(num - ana).max() / np.abs(num).max()
    assert err < (1e-6 if exact else 1e-3), (err, picks[int(np.abs(num - ana).argmax())])


def test_gpt_in_mixed_precision(handler, rng):
    """A tiny GPT under bfloat16 mixed precision: its (B, T) ids come in the
    master format (``input_h``), and its first loss is float32's to
    bfloat16's precision."""
    if handler.dtype != np.float32:
        pytest.skip("mixed precision keeps float32 master parameters")
    ids = rng.integers(0, 11, (4, 8)).astype(np.float64)
    t = rng.integers(0, 11, (32, 1)).astype(np.float64)
    losses = []
    for mixed in (False, True):
        net = tiny_gpt(handler, seed=5)
        if mixed:
            net.mixed_precision("bfloat16")
        loss = net.train_step(net.input_h.create_from_numpy(ids),
                              net.target_h.create_from_numpy(t))
        losses.append(float(net.h.get_numpy_copy(loss)[0]))
    np.testing.assert_allclose(losses[1], losses[0], rtol=3e-2)


def test_trainer_fits_a_gpt_on_sequence_labels(make_handler, handler_id):
    """Trainer takes (n, T) next-token labels for a GPT's (B * T, vocab)
    rows, with the schedule and the clip; captured and eager steps agree
    bit for bit, the loss falls, and evaluate's accuracy counts positions."""
    from layers import Trainer, accuracy
    from layers.schedules import WarmupCosine
    rng = np.random.default_rng(3)
    seq = (rng.integers(0, 11, (96, 1)) + np.arange(9)) % 11
    x, y = seq[:, :8].astype(np.float64), seq[:, 1:]
    runs = []
    for graph in (False, True):
        h = make_handler(handler_id)
        net = tiny_gpt(h, seed=4)
        trainer = Trainer(net, SGD(net.parameters, lr=0.3, momentum=0.9), batch_size=16,
                          progress=False, graph=graph, clip_norm=1.0,
                          schedule=WarmupCosine(0.3, warmup=6, total=60), seed=1)
        history = trainer.fit(x, y, 10)
        runs.append((h.get_numpy_copy(net.params), history.train_loss))
        out = h.get_numpy_copy(net.forward(h.create_from_numpy(x)))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    assert runs[0][1][-1] < 0.5 * runs[0][1][0], runs[0][1]
    assert accuracy(out, y) > 0.5
    with pytest.raises(ValueError, match=r"\(n, T\) labels"):
        Trainer(tiny_gpt(make_handler(handler_id)), SGD(net.parameters)).fit(x, y[:, :5], 1)
