"""LayerNorm, Embedding and Flatten: forward results against an independent
float64 NumPy computation on fresh random data, per handler and dtype; the
view semantics of Flatten; invalid ids; and a captured training step that
replays bit for bit what eager steps compute.

(Their finite-difference gradient checks are in test_layers_gradients.py.)
"""
import numpy as np
import pytest

from handlers import NumpyHandler
from helpers import as_handler_values, assert_close, rand
from layers import (
    SGD,
    Embedding,
    Flatten,
    FullyConnected,
    LayerNorm,
    ParameterSet,
    Sequential,
    SoftmaxCrossEntropy,
    Tanh,
)


def bound(h, layer, rng, random=True):
    """Bind ``layer`` to ``h`` with its parameters in a ParameterSet; with
    ``random``, give every parameter fresh random values.  Returns
    {name: float64 values as the handler holds them}."""
    layer.bind(h)
    ParameterSet(h, [layer], seed=int(rng.integers(2**31)))
    values = {}
    for name, p in layer.params.items():
        if random:
            h.set_from_numpy(p, rand(tuple(p.shape), rng, -1.5, 1.5))
        values[name] = h.get_numpy_copy(p).astype(np.float64)
    return values


def layernorm64(x, gain, bias, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gain.reshape(-1) + bias.reshape(-1)


# ============================================================================ LayerNorm
@pytest.mark.parametrize("shape", [(1, 1), (6, 5), (3, 4, 33), (2, 2, 3, 300), (1000, 17)],
                         ids=lambda s: "x".join(map(str, s)))
def test_layernorm_forward(handler, rng, shape):
    layer = LayerNorm(shape[-1], eps=1e-4)
    p = bound(handler, layer, rng)
    host = rand(shape, rng, -3, 3) + rng.uniform(-5, 5)   # an offset the mean removes
    x = handler.create_from_numpy(host)
    y = layer.forward(x)
    assert tuple(y.shape) == shape
    # rsqrt of a small variance amplifies the inputs' rounding: float32 gets
    # a looser absolute tolerance than elementwise ops.
    tol = 2e-4 if handler.dtype == np.float32 else 1e-10
    assert_close(handler, y, layernorm64(as_handler_values(handler, host), p["gain"],
                                         p["bias"], 1e-4), rtol=tol, atol=tol)


def test_layernorm_starts_as_plain_normalization(handler, rng):
    layer = LayerNorm(8)
    bound(handler, layer, rng, random=False)
    y = handler.get_numpy_copy(layer.forward(handler.create_from_numpy(rand((5, 8), rng))))
    y = y.astype(np.float64)
    np.testing.assert_allclose(y.mean(axis=1), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.var(axis=1), 1.0, rtol=1e-3)   # var / (var + eps)


def test_layernorm_checks_its_input(handler):
    layer = LayerNorm(4)
    layer.bind(handler)
    with pytest.raises(ValueError, match=r"LayerNorm\(4.*last dimension 4"):
        layer.forward(handler.zeros((3, 5)))
    with pytest.raises(ValueError, match="eps"):
        LayerNorm(4, eps=0.0)


# ============================================================================ Embedding
@pytest.mark.parametrize("column", [False, True], ids=["ids-n", "ids-n1"])
@pytest.mark.parametrize("n,vocab,d", [(1, 1, 1), (9, 4, 3), (300, 50, 65)],
                         ids=["1-1-1", "9-4-3", "300-50-65"])
def test_embedding_forward_and_gradient(handler, rng, n, vocab, d, column):
    layer = Embedding(vocab, d)
    p = bound(handler, layer, rng)
    rows = rng.integers(0, vocab, n)
    host_ids = rows + rng.uniform(0, 0.9, n)            # fractions truncate
    ids = handler.create_from_numpy(host_ids.reshape(n, 1) if column else host_ids)
    y = layer.forward(ids)
    assert_close(handler, y, p["W"][rows], rtol=0, atol=0)
    dy = rand((n, d), rng)
    handler.set_from_numpy(layer.grads["W"], np.full((vocab, d), np.nan))   # overwritten
    assert layer.backward(handler.create_from_numpy(dy)) is None
    want = np.zeros((vocab, d))
    np.add.at(want, rows, as_handler_values(handler, dy))
    assert_close(handler, layer.grads["W"], want, n=n)


@pytest.mark.parametrize("bad", [4.0, -1.0, np.nan])
def test_embedding_invalid_id(handler, rng, bad):
    """NumpyHandler raises naming the id; PyCudaHandler gives that sample a row
    of NaN (which the trainer's finite check then reports)."""
    layer = Embedding(4, 3)
    p = bound(handler, layer, rng)
    ids = handler.create_from_numpy(np.array([1.0, bad, 3.0]))
    if isinstance(handler, NumpyHandler):
        with pytest.raises(ValueError, match=r"gather_rows_m: idx\[1\]"):
            layer.forward(ids)
        return
    y = handler.get_numpy_copy(layer.forward(ids)).astype(np.float64)
    np.testing.assert_array_equal(y[[0, 2]], p["W"][[1, 3]])
    assert np.isnan(y[1]).all()


def test_embedding_checks_its_input(handler):
    layer = Embedding(4, 3)
    layer.bind(handler)
    with pytest.raises(ValueError, match=r"ids must have shape \(n,\), \(n, 1\) or \(B, T\)"):
        layer.forward(handler.zeros((3, 2, 1)))


# ============================================================================ Flatten
def test_flatten_is_a_view_both_ways(handler, rng):
    layer = Flatten()
    layer.bind(handler)
    host = rand((2, 3, 4, 5), rng)
    x = handler.create_from_numpy(host)
    y = layer.forward(x)
    assert tuple(y.shape) == (2, 60)
    assert_close(handler, y, as_handler_values(handler, host).reshape(2, 60), rtol=0, atol=0)
    handler.fill(x, 0.5)                        # the output is x's memory
    assert_close(handler, y, np.full((2, 60), 0.5), rtol=0, atol=0)
    assert layer.forward(x) is y                # one view per input array, kept
    dy = handler.create_from_numpy(rand((2, 60), rng))
    dx = layer.backward(dy)
    assert tuple(dx.shape) == (2, 3, 4, 5)
    handler.fill(dy, -2.0)                      # dL/dx is dy's memory
    assert_close(handler, dx, np.full((2, 3, 4, 5), -2.0), rtol=0, atol=0)
    with pytest.raises(ValueError, match="rank >= 2"):
        layer.forward(handler.zeros((4,)))


# ============================================================================ in a network
def _net(h, seed):
    return Sequential(h, [Embedding(11, 6), LayerNorm(6), Tanh(), FullyConnected(6, 3)],
                      SoftmaxCrossEntropy(), seed=seed)


def test_captured_step_replays_eager_bit_for_bit(handler, rng):
    """Embedding and LayerNorm in a captured step: every replay gives the bits
    of the same steps run eagerly (the scatter-add is deterministic)."""
    n = 40
    batches = [(rng.integers(0, 11, n).astype(float), rng.integers(0, 3, (n, 1)).astype(float))
               for _ in range(3)]
    results = []
    for graphed in (False, True):
        net = _net(handler, seed=3)
        opt = SGD(net.parameters, lr=0.3, momentum=0.5)
        x, t = handler.create_from_numpy(batches[0][0]), handler.create_from_numpy(batches[0][1])
        net.train_step(x, t)                    # allocates every buffer
        opt.step()
        graph = None
        if graphed:
            with handler.capture() as graph:
                net.train_step(x, t)
                opt.step()
        for xb, tb in batches:
            handler.set_from_numpy(x, xb)
            handler.set_from_numpy(t, tb)
            if graph is None:
                net.train_step(x, t)
                opt.step()
            else:
                graph.replay()
        results.append(net.parameters.get())
    np.testing.assert_array_equal(results[1], results[0])


def test_embedding_network_learns(handler, rng):
    """Each token's class is learned from its embedding alone."""
    vocab, n = 11, 200
    classes = rng.integers(0, 3, vocab)
    ids = rng.integers(0, vocab, n).astype(float)
    net = _net(handler, seed=1)
    opt = SGD(net.parameters, lr=0.5, momentum=0.5)
    x = handler.create_from_numpy(ids)
    t = handler.create_from_numpy(classes[ids.astype(int)].reshape(n, 1).astype(float))
    first = float(handler.get_numpy_copy(net.train_step(x, t))[0])
    opt.step()
    for _ in range(60):
        net.train_step(x, t)
        opt.step()
    last = float(handler.get_numpy_copy(net.evaluate_batch(x, t)[0])[0])
    assert last < 0.1 * first, (first, last)
