"""Conv2D, MaxPool2D and AvgPool2D: finite-difference gradients (float64, per
handler, as tests/test_layers_gradients.py), forward passes against direct
float64 loops written here, bad configurations, and Conv2D's initial weights
against the documented Glorot rule."""
import math

import numpy as np
import pytest

from handlers.testing import check_layer_gradients
from layers import AvgPool2D, Conv2D, MaxPool2D, ParameterSet, Sequential, SquaredError

LAYERS = {
    "conv-3x3-pad1": (lambda: Conv2D(2, 3, 3, padding=1), (2, 2, 5, 5)),
    "conv-stride2-dil2-nonsquare": (
        lambda: Conv2D(1, 2, (2, 3), stride=2, padding=(1, 0), dilation=(1, 2)), (1, 1, 6, 7)),
    "conv-1x1": (lambda: Conv2D(3, 2, 1), (2, 3, 3, 2)),
    # the bias and activation fused after the convolution (layers.epilogues)
    **{f"conv-{act}": (lambda act=act: Conv2D(2, 3, 3, padding=1, activation=act), (2, 2, 4, 5))
       for act in ("relu", "tanh", "sigmoid", "elu", "gelu", "silu")},
    "conv-relu-strided": (lambda: Conv2D(1, 2, (2, 3), stride=2, padding=(1, 0),
                                         activation="relu"), (3, 1, 6, 7)),
    "maxpool-2": (lambda: MaxPool2D(2), (2, 2, 4, 4)),
    "maxpool-3-stride2-pad1": (lambda: MaxPool2D(3, stride=2, padding=1), (1, 2, 5, 5)),
    "avgpool-2": (lambda: AvgPool2D(2), (2, 2, 4, 4)),
    "avgpool-3-stride2-pad1": (lambda: AvgPool2D(3, stride=2, padding=1), (1, 2, 5, 5)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_conv_layer_gradients(handler, rng, name):
    """Backward against float64 central differences, and this handler's
    forward and backward against float64 (handlers.testing)."""
    make, shape = LAYERS[name]
    check_layer_gradients(handler, make(), shape, rng)


def _loop_conv(x, W, b, stride, pad, dil):
    """y[n, k, p, q] = b[k] + sum over c, r, s of x[n, c, p*sh + r*dh - ph,
    q*sw + s*dw - pw] * W[k, c, r, s], zero outside the image."""
    n_, c_, hh, ww = x.shape
    k_, _, rr, ss = W.shape
    p_ = (hh + 2 * pad[0] - dil[0] * (rr - 1) - 1) // stride[0] + 1
    q_ = (ww + 2 * pad[1] - dil[1] * (ss - 1) - 1) // stride[1] + 1
    y = np.zeros((n_, k_, p_, q_))
    for n in range(n_):
        for k in range(k_):
            for p in range(p_):
                for q in range(q_):
                    acc = b[k]
                    for c in range(c_):
                        for r in range(rr):
                            for s in range(ss):
                                i = p * stride[0] + r * dil[0] - pad[0]
                                j = q * stride[1] + s * dil[1] - pad[1]
                                if 0 <= i < hh and 0 <= j < ww:
                                    acc += x[n, c, i, j] * W[k, c, r, s]
                    y[n, k, p, q] = acc
    return y


def _loop_pool(x, kind, window, stride, pad):
    n_, c_, hh, ww = x.shape
    p_ = (hh + 2 * pad[0] - window[0]) // stride[0] + 1
    q_ = (ww + 2 * pad[1] - window[1]) // stride[1] + 1
    y = np.zeros((n_, c_, p_, q_))
    for n in range(n_):
        for c in range(c_):
            for p in range(p_):
                for q in range(q_):
                    i0, j0 = p * stride[0] - pad[0], q * stride[1] - pad[1]
                    vals = [x[n, c, i, j] for i in range(i0, i0 + window[0])
                            for j in range(j0, j0 + window[1]) if 0 <= i < hh and 0 <= j < ww]
                    y[n, c, p, q] = max(vals) if kind == "max" else sum(vals) / len(vals)
    return y


def _tol(h):
    return 1e-12 if np.dtype(h.dtype) == np.float64 else 1e-5


def test_conv2d_forward_against_loops(handler, rng):
    layer = Conv2D(2, 3, (3, 2), stride=(2, 1), padding=(1, 1), dilation=(1, 2))
    layer.bind(handler)
    ps = ParameterSet(handler, [layer], seed=int(rng.integers(2**31)))
    b_host = rng.standard_normal(3)
    flat = ps.get().astype(np.float64)
    _, _, off, _ = ps.entries[1]
    flat[off:off + 3] = b_host
    ps.set(flat)
    x = rng.standard_normal((2, 2, 7, 6))
    y = handler.get_numpy_copy(layer.forward(handler.create_from_numpy(x)))
    W = ps.get().astype(np.float64)[:3 * 2 * 3 * 2].reshape(3, 2, 3, 2)
    ref = _loop_conv(x, W, b_host, (2, 1), (1, 1), (1, 2))
    np.testing.assert_allclose(y, ref, rtol=_tol(handler) * 10, atol=_tol(handler) * 10)


@pytest.mark.parametrize("kind, cls", [("max", MaxPool2D), ("avg", AvgPool2D)])
def test_pool_forward_against_loops(handler, rng, kind, cls):
    layer = cls((3, 2), stride=(2, 1), padding=(1, 1))
    layer.bind(handler)
    x = rng.standard_normal((2, 3, 6, 5))
    y = handler.get_numpy_copy(layer.forward(handler.create_from_numpy(x)))
    ref = _loop_pool(x, kind, (3, 2), (2, 1), (1, 1))
    np.testing.assert_allclose(y, ref, rtol=_tol(handler) * 10, atol=_tol(handler) * 10)


@pytest.mark.parametrize("make", [
    lambda: Conv2D(0, 3, 3), lambda: Conv2D(2, 3, 0), lambda: Conv2D(2, 3, 3, stride=0),
    lambda: Conv2D(2, 3, 3, padding=-1), lambda: Conv2D(2, 3, (3, 3, 3)),
    lambda: MaxPool2D(0), lambda: AvgPool2D(2, stride=(1, 0)),
])
def test_bad_configurations_raise(make):
    with pytest.raises(ValueError):
        make()


def test_wrong_input_raises_naming_the_layer(handler, rng):
    layer = Conv2D(2, 3, 3)
    layer.bind(handler)
    ParameterSet(handler, [layer], seed=0)
    with pytest.raises(ValueError, match="Conv2D"):
        layer.forward(handler.create_from_numpy(rng.standard_normal((1, 4, 5, 5))))   # channels
    with pytest.raises(ValueError, match="Conv2D"):
        layer.forward(handler.create_from_numpy(rng.standard_normal((1, 2, 2, 2))))   # too small
    with pytest.raises(ValueError, match="MaxPool2D"):
        pool = MaxPool2D(3)
        pool.bind(handler)
        pool.forward(handler.create_from_numpy(rng.standard_normal((1, 2, 2, 2))))


def test_conv2d_initial_weights_are_glorot_uniform_over_the_kernel_fans(handler, rng):
    """Conv2D's W starts U(-a, a) with a = sqrt(6 / (c_in*R*S + c_out*R*S))
    (the documented Glorot rule, fans counted over the whole kernel), b at 0.

    With 3600 draws the largest |W| lies within 3% of a (a miss has
    probability 0.97^3600) and the standard deviation within 6% of a/sqrt(3)
    (4 standard errors); a fan that drops a kernel side, counts one channel
    count twice or uses R*R for R*S moves a by 13% or more."""
    c_in, c_out, kernel = 12, 20, (3, 5)
    net = Sequential(handler, [Conv2D(c_in, c_out, kernel)], SquaredError(),
                     seed=int(rng.integers(2**31)))
    layer = net.layers[0]
    w = handler.get_numpy_copy(layer.params["W"]).astype(np.float64)
    b = handler.get_numpy_copy(layer.params["b"])
    assert w.shape == (c_out, c_in) + kernel
    area = kernel[0] * kernel[1]
    a = math.sqrt(6.0 / (c_in * area + c_out * area))
    top = np.abs(w).max()
    assert top <= a * (1 + 1e-6), f"max |W| {top} beyond the bound {a}"
    assert top >= 0.97 * a, f"max |W| {top} well inside the bound {a}"
    std = w.std()
    assert abs(std / (a / math.sqrt(3.0)) - 1) < 0.06, f"std {std}, want {a / math.sqrt(3.0)}"
    assert abs(w.mean()) < 4 * std / math.sqrt(w.size)
    assert (b == 0).all()
