"""The transformer's layers per handler (``MultiHeadAttention``, ``RMSNorm``,
``PositionEmbedding``, ``Reshape``, ``Embedding`` over (B, T) ids): gradients
against float64 central differences and each handler against float64
(``check_layer_gradients``), the causal mask seen from the outside, and a
small GPT that learns."""
import numpy as np
import pytest

from handlers.testing import check_layer_gradients
from layers import (
    GELU,
    SGD,
    Embedding,
    FullyConnected,
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
    """A character GPT of ``layers`` blocks (pre-norm attention and MLP)."""
    blocks = []
    for _ in range(layers):
        blocks += [Residual([LayerNorm(d), MultiHeadAttention(d, heads, causal=True)]),
                   Residual([LayerNorm(d), FullyConnected(d, 4 * d), GELU(),
                             FullyConnected(4 * d, d)])]
    return Sequential(h, [Embedding(vocab, d), PositionEmbedding(context, d), *blocks,
                          LayerNorm(d), FullyConnected(d, vocab), Reshape(-1, vocab)],
                      SoftmaxCrossEntropy(), seed=seed)


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
