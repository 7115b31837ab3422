"""Finite-difference gradient checks of every layer, loss and a whole network,
for inputs and parameters, per handler.

Method: central differences, (L(p + eps) - L(p - eps)) / (2 eps) with
eps = 1e-6, one element at a time, against the layer's backward.  A layer's
scalar loss is L = sum(R * y) for a fixed random R, so backward gets dy = R.

Tolerance: the normwise relative error max|num - ana| / max(max|num|, max|ana|)
must be below 1e-6.  In float64, the central difference is off by about
eps^2 * |L'''| ~ 1e-12 (truncation) plus 1e-16 * |L| / eps ~ 1e-10
(rounding), so 1e-6 has a wide margin yet catches any wrong term (those give
errors of order 1e-2 and more).  Float32 handlers skip: with 7 digits the
rounding term alone would be about 1e-1.
"""
import numpy as np
import pytest

from handlers.testing import assert_normwise_close, central_differences, check_layer_gradients
from layers import (
    ELU,
    GELU,
    LSTM,
    Dropout,
    Embedding,
    Flatten,
    FullyConnected,
    LayerNorm,
    ReLU,
    Sequential,
    Sigmoid,
    SiLU,
    SoftmaxCrossEntropy,
    SquaredError,
    Tanh,
)

EPS = 1e-6
RTOL = 1e-6


@pytest.fixture
def h64(handler):
    if np.dtype(handler.dtype) != np.float64:
        pytest.skip("gradient checks run on float64 handlers only (float32 central "
                    "differences have rounding errors near 1e-1)")
    return handler


def assert_grad(num, ana, what):
    assert_normwise_close(num, ana, RTOL, what, "central difference", "backward")


def numeric_grad(f, values):
    """Central differences of the scalar f() (the kit's, with step EPS)."""
    return central_differences(f, values, EPS)


def param_slices(ps):
    """(name, flat index array) of every parameter element of a ParameterSet."""
    return [(f"{type(layer).__name__}.{name}", np.arange(off, off + int(np.prod(shape))))
            for layer, name, off, shape in ps.entries]


LAYERS = {
    "fc": (lambda: FullyConnected(5, 4), (3, 5)),
    **{f"fc-{act}": (lambda act=act: FullyConnected(5, 4, activation=act), (3, 5))
       for act in ("relu", "tanh", "sigmoid", "elu", "gelu", "gelu_tanh", "silu")},
    "fc-relu-3d-input": (lambda: FullyConnected(4, 3, activation="relu"), (2, 3, 4)),
    "fc-odd-1row": (lambda: FullyConnected(3, 7), (1, 3)),
    "fc-3d-input": (lambda: FullyConnected(4, 3), (2, 3, 4)),
    "sigmoid": (Sigmoid, (4, 6)),
    "tanh": (Tanh, (4, 6)),
    "relu": (ReLU, (4, 6)),
    "elu": (ELU, (4, 6)),
    "elu-3d": (ELU, (2, 3, 5)),
    "gelu": (GELU, (4, 6)),
    "gelu-tanh": (lambda: GELU(approximate="tanh"), (4, 6)),
    "silu-3d": (SiLU, (2, 3, 5)),
    "lstm-seq": (lambda: LSTM(3, 4, return_sequences=True), (4, 3, 3)),
    "lstm-last": (lambda: LSTM(3, 5, return_sequences=False), (5, 2, 3)),
    "lstm-1step": (lambda: LSTM(2, 3, return_sequences=True), (1, 2, 2)),
    "flatten": (Flatten, (2, 3, 2, 2)),
    "flatten-3d": (Flatten, (3, 1, 4)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_gradients(handler, rng, name):
    """Backward against float64 central differences, and this handler's
    forward and backward against float64 (handlers.testing)."""
    make, shape = LAYERS[name]
    check_layer_gradients(handler, make(), shape, rng)


@pytest.mark.parametrize("d,shape", [(5, (3, 5)), (4, (2, 3, 4)), (7, (1, 7)), (1, (3, 1))],
                         ids=["2d", "3d-sequence", "one-row", "d1"])
def test_layernorm_gradients(handler, rng, d, shape):
    """Random gain and bias (a gain of 1 would hide a missing factor)."""
    check_layer_gradients(handler, LayerNorm(d, eps=1e-3), shape, rng,
                          x=rng.uniform(-2, 2, shape), params="random")


@pytest.mark.parametrize("ids", [[3.0, 0.0, 3.0, 1.0, 3.0], [[2.0], [2.0]], [0.0]],
                         ids=["repeats-and-unused-rows", "n1-column", "one-id"])
def test_embedding_gradients(handler, rng, ids):
    """dL/dW through gather and scatter-add: repeated ids add up, rows no id
    names get 0.  Ids have no gradient."""
    layer = Embedding(4, 3)
    check_layer_gradients(handler, layer, None, rng, x=np.array(ids), x_grad=False)
    assert layer.backward(handler.create_from_numpy(np.ones((len(ids), 3)))) is None


def test_dropout_gradient_with_fixed_mask(h64, rng):
    """A frozen mask (float64 only: each handler draws its own mask)."""
    layer = Dropout(0.4)

    def freeze(layer):
        layer.resample = False
    check_layer_gradients(h64, layer, (6, 7), rng, prepare=freeze, on_handler=True)
    mask = h64.get_numpy_copy(next(iter(layer._cache.values())).mask)
    assert set(np.unique(mask)) <= {0.0, 1 / 0.6}, "mask is not 0 or 1/(1-p)"


def check_loss(h, loss, y_host, t_host):
    loss.bind(h)
    y, t = h.create_from_numpy(y_host), h.create_from_numpy(t_host)
    loss.forward(y, t)
    ana = h.get_numpy_copy(loss.backward())
    yv = y_host.copy()

    def f():
        h.set_from_numpy(y, yv)
        return float(h.get_numpy_copy(loss.forward(y, t))[0])
    assert_grad(numeric_grad(f, yv), ana, f"{type(loss).__name__} dL/dy")


def test_softmax_cross_entropy_indices(h64, rng):
    t = rng.integers(0, 5, (6, 1)).astype(np.float64)
    check_loss(h64, SoftmaxCrossEntropy(), rng.uniform(-2, 2, (6, 5)), t)


def test_softmax_cross_entropy_distributions(h64, rng):
    t = rng.uniform(0, 1, (4, 3))
    t /= t.sum(axis=1, keepdims=True)
    check_loss(h64, SoftmaxCrossEntropy(), rng.uniform(-2, 2, (4, 3)), t)


@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 4)], ids=["2d", "3d"])
def test_squared_error(h64, rng, shape):
    check_loss(h64, SquaredError(), rng.uniform(-1, 1, shape), rng.uniform(-1, 1, shape))


def test_loss_values(h64, rng):
    """The losses' values themselves, against NumPy."""
    y, t = rng.uniform(-2, 2, (6, 4)), rng.integers(0, 4, (6, 1)).astype(np.float64)
    ce = SoftmaxCrossEntropy()
    ce.bind(h64)
    got = h64.get_numpy_copy(ce.forward(h64.create_from_numpy(y), h64.create_from_numpy(t)))
    p = np.exp(y - y.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = -np.mean(np.log(p[np.arange(6), t[:, 0].astype(int)]))
    np.testing.assert_allclose(got, [want], rtol=1e-12)
    se = SquaredError()
    se.bind(h64)
    got = h64.get_numpy_copy(se.forward(h64.create_from_numpy(y), h64.create_from_numpy(y + 1)))
    np.testing.assert_allclose(got, [0.5 * 4], rtol=1e-12)


@pytest.mark.parametrize("kind", ["lstm-fc-ce", "lstm-seq-fc-se", "mlp"])
def test_network_gradients(h64, rng, kind):
    """A whole network: every parameter view of the flat buffers and dL/dx."""
    T, B = 3, 2
    if kind == "lstm-fc-ce":
        layers = [LSTM(3, 4, return_sequences=False), FullyConnected(4, 3)]
        loss, x = SoftmaxCrossEntropy(), rng.uniform(-1, 1, (T, B, 3))
        t = rng.integers(0, 3, (B, 1)).astype(np.float64)
    elif kind == "lstm-seq-fc-se":
        layers = [LSTM(2, 3), Tanh(), FullyConnected(3, 2)]
        loss, x = SquaredError(), rng.uniform(-1, 1, (T, B, 2))
        t = rng.uniform(-1, 1, (T, B, 2))
    else:
        layers = [FullyConnected(4, 5), ELU(), FullyConnected(5, 5), Sigmoid(),
                  FullyConnected(5, 3)]
        loss, x = SoftmaxCrossEntropy(), rng.uniform(-1, 1, (4, 4))
        t = rng.integers(0, 3, (4, 1)).astype(np.float64)
    h = h64
    net = Sequential(h, layers, loss, seed=int(rng.integers(2**31)), input_grad=True)
    hx, ht = h.create_from_numpy(x), h.create_from_numpy(t)
    net.train_step(hx, ht)
    ana_x = h.get_numpy_copy(net.backward(net.loss.backward()))
    ana_p = h.get_numpy_copy(net.grads)

    def f():
        return float(h.get_numpy_copy(net.evaluate_batch(hx, ht)[0])[0])
    xv = x.copy()

    def fx():
        h.set_from_numpy(hx, xv)
        return f()
    assert_grad(numeric_grad(fx, xv), ana_x, f"{kind} dL/dx")
    h.set_from_numpy(hx, x)
    pv = net.parameters.get()
    used = np.concatenate([idx for _, idx in param_slices(net.parameters)])
    sub = pv[used]

    def fp():
        full = pv.copy()
        full[used] = sub
        net.parameters.set(full)
        return f()
    assert_grad(numeric_grad(fp, sub), ana_p[used], f"{kind} dL/dparams")
    # the alignment padding between parameters gets no gradient
    pad = np.setdiff1d(np.arange(pv.size), used)
    assert not ana_p[pad].any()
