"""Dense layers with their activation fused after the bias (layers.epilogues):
``Sequential`` pairs them without the user asking, and a fused network
trains as the layers written out do, against float64 NumPy."""
import math

import numpy as np
import pytest

from handlers import NumpyHandler
from handlers.testing import assert_normwise_close
from layers import (
    ELU,
    GELU,
    SGD,
    Conv2D,
    Flatten,
    FullyConnected,
    ReLU,
    Sequential,
    Sigmoid,
    SiLU,
    SoftmaxCrossEntropy,
    Tanh,
)
from layers.network import fuse_layers

ACTIVATIONS = {"relu": ReLU, "tanh": Tanh, "sigmoid": Sigmoid, "elu": ELU, "gelu": GELU,
               "gelu_tanh": lambda: GELU(approximate="tanh"), "silu": SiLU}


def net_of(h, act, fuse, seed=3):
    """Two pairs to fuse: a convolution and a dense layer, each with ``act``."""
    layers = [Conv2D(2, 3, 3, padding=1), ACTIVATIONS[act](), Flatten(), FullyConnected(27, 8),
              ACTIVATIONS[act](), FullyConnected(8, 4)]
    return Sequential(h, layers, SoftmaxCrossEntropy(), seed=seed, fuse=fuse)


def tolerance(h):
    return {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 2e-5}.get(h.dtype, 2e-2)


@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_fused_network_trains_as_float64_layers(handler, rng, act):
    """Two SGD steps of the fused network on this handler against the
    unfused layers on float64 NumPy: the losses, gradients and parameters."""
    h64 = NumpyHandler(np.float64)
    fused, ref = net_of(handler, act, True), net_of(h64, act, False)
    assert fused.fused_pairs == 2 and ref.fused_pairs == 0
    ref.parameters.set(fused.parameters.get().astype(np.float64))
    opts = SGD(fused.parameters, lr=0.1, momentum=0.5), SGD(ref.parameters, lr=0.1, momentum=0.5)
    x = rng.uniform(-2, 2, (11, 2, 3, 3))
    t = rng.integers(0, 4, (11, 1)).astype(np.float64)
    for step in range(2):
        losses = []
        for net, opt, h in zip((fused, ref), opts, (handler, h64)):
            xs = h.create_from_numpy(x.astype(h.dtype))
            ts = net.loss.h.create_from_numpy(t.astype(net.loss.h.dtype))
            losses.append(float(net.loss.h.get_numpy_copy(net.train_step(xs, ts))[0]))
            opt.step()
        tol = tolerance(handler)
        assert abs(losses[0] - losses[1]) <= 10 * tol * abs(losses[1]), (step, losses)
        assert_normwise_close(h64.get_numpy_copy(ref.grads),
                              handler.get_numpy_copy(fused.grads).astype(np.float64),
                              10 * tol, f"{act} gradients, step {step}")
    assert_normwise_close(ref.parameters.get().astype(np.float64),
                          fused.parameters.get().astype(np.float64), 10 * tolerance(handler),
                          f"{act} parameters")


def test_what_is_fused():
    """A dense or convolution layer and the activation right after it; not
    an activation first, after another activation, or after a subclass of
    the dense layer, and nothing with fuse=False."""
    class MyDense(FullyConnected):
        pass

    layers = [ReLU(), FullyConnected(3, 4), Tanh(), Sigmoid(), MyDense(4, 4), ReLU(),
              FullyConnected(4, 2), ELU()]
    assert fuse_layers(layers) == 2
    assert [getattr(layer, "activation", None) for layer in layers] == [
        None, "tanh", None, None, None, None, "elu", None]
    assert [getattr(layer, "fused", None) for layer in layers] == [
        False, None, True, False, None, False, None, True]
    h = NumpyHandler(np.float64)
    net = Sequential(h, [FullyConnected(3, 4), ReLU()], SoftmaxCrossEntropy(), fuse=False)
    assert net.fused_pairs == 0 and net.layers[0].activation is None
    fused = Sequential(h, [FullyConnected(3, 4), ReLU()], SoftmaxCrossEntropy())
    assert fused.fused_pairs == 1 and repr(fused) == repr(net)   # the layers as written
    # a dense layer given its activation is not paired again
    assert fuse_layers([FullyConnected(3, 4, activation="relu"), Tanh()]) == 0
    conv = [Conv2D(1, 2, 3), Sigmoid()]
    assert fuse_layers(conv) == 1 and conv[0].activation == "sigmoid" and conv[1].fused
    with pytest.raises(ValueError, match="activation must be None or one of"):
        Conv2D(1, 2, 3, activation="softmax")
    with pytest.raises(ValueError, match="activation must be None or one of"):
        FullyConnected(3, 4, activation="swish")


def test_fused_pair_takes_sequences(handler, rng):
    """A (T, B, F) input through a fused pair: every time step as a row."""
    h64 = NumpyHandler(np.float64)
    nets = [Sequential(h, [FullyConnected(5, 6), Tanh()], SoftmaxCrossEntropy(), seed=2,
                       fuse=f) for h, f in ((handler, True), (h64, False))]
    nets[1].parameters.set(nets[0].parameters.get().astype(np.float64))
    x = rng.uniform(-1, 1, (3, 4, 5))
    ys = [net.forward(h.create_from_numpy(x.astype(h.dtype)))
          for net, h in zip(nets, (handler, h64))]
    assert_normwise_close(h64.get_numpy_copy(ys[1]),
                          handler.get_numpy_copy(ys[0]).astype(np.float64),
                          10 * tolerance(handler), "tanh over a sequence")


#: float64 references of the activations with no contract op
REFERENCES = {
    "gelu": np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2)))),
    "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                  * (v + 0.044715 * v ** 3))),
    "silu": lambda v: v / (1 + np.exp(-v)),
}


@pytest.mark.parametrize("act", list(REFERENCES))
def test_gelu_and_silu_against_float64(handler, rng, act):
    """GELU (both forms) and SiLU, and their derivatives (against central
    differences of the float64 reference), on this handler."""
    layer = ACTIVATIONS[act]()
    layer.bind(handler)
    x = np.concatenate([rng.uniform(-6, 6, 200), [0.0, -0.0, 1e-3, -1e-3, 30.0, -30.0]])
    x = x.astype(handler.dtype).astype(np.float64).reshape(2, -1)
    y = layer.forward(handler.create_from_numpy(x.astype(handler.dtype)))
    tol = tolerance(handler)
    assert_normwise_close(REFERENCES[act](x), handler.get_numpy_copy(y).astype(np.float64),
                          10 * tol, f"{act} forward")
    dy = rng.uniform(-1, 1, x.shape)
    dx = layer.backward(handler.create_from_numpy(dy.astype(handler.dtype)))
    eps = 1e-6
    dy_held = dy.astype(handler.dtype).astype(np.float64)
    want = dy_held * (REFERENCES[act](x + eps) - REFERENCES[act](x - eps)) / (2 * eps)
    assert_normwise_close(want, handler.get_numpy_copy(dx).astype(np.float64), 10 * tol + 1e-8,
                          f"{act} backward")


def test_fused_pairs_bind_once(rng):
    """A network's fused ops are bound at its first step only: later steps
    pass the same buffers, so their bound calls are reused (an eager step
    would otherwise pay a bind, about an unbound call's checks, per op)."""
    h = NumpyHandler(np.float32)
    net = net_of(h, "relu", True)
    opt = SGD(net.parameters, lr=0.1, momentum=0.5)
    binds = []
    real = h._bind_fused
    h._bind_fused = lambda op, args, kwargs: binds.append(op.name) or real(op, args, kwargs)
    x = h.create_from_numpy(rng.uniform(-2, 2, (11, 2, 3, 3)).astype(np.float32))
    t = net.loss.h.create_from_numpy(rng.integers(0, 4, (11, 1)).astype(np.float32))
    counts = []
    for _ in range(3):
        net.train_step(x, t)
        opt.step()
        counts.append(len(binds))
    assert counts[0] > 0 and counts[1] == counts[2] == counts[0], (counts, binds)
