"""Networks, the flat parameter buffers, the optimizer, the trainer, stream
groups in the LSTM backward, and a user-defined layer; per handler."""
import builtins
import inspect
import warnings

import numpy as np
import pytest

from handlers import NumpyHandler
from helpers import Scale
from layers import (
    ELU,
    LSTM,
    SGD,
    Dropout,
    FullyConnected,
    ReLU,
    Sequential,
    Sigmoid,
    SoftmaxCrossEntropy,
    SquaredError,
    Tanh,
    Trainer,
    accuracy,
)
from layers.params import ALIGN, ParameterSet


class Recorder:
    """A handler stand-in that forwards every op to ``h`` and records
    (stream group, op name) of each call."""

    def __init__(self, h, log=None):
        self._h, self.log = h, ([] if log is None else log)

    def __getattr__(self, name):
        attr = getattr(self._h, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            args = [a._h if isinstance(a, Recorder) else a for a in args]
            self.log.append((self._h.group, name))
            out = attr(*args, **kwargs)
            return Recorder(out, self.log) if name == "with_streams" else out
        return call


def mlp(h, seed=0, layers=None):
    layers = layers or [FullyConnected(6, 8), Tanh(), FullyConnected(8, 3)]
    return Sequential(h, layers, SoftmaxCrossEntropy(), seed=seed)


def lstm_net(h, seed=0):
    return Sequential(h, [LSTM(4, 6, return_sequences=False), FullyConnected(6, 3)],
                      SoftmaxCrossEntropy(), seed=seed)


def toy_sequences(rng, n=60, T=5, F=4):
    """Time-major sequences whose class is the sign pattern of their mean."""
    x = rng.standard_normal((T, n, F))
    m = x.mean(axis=0)
    y = ((m[:, 0] > 0).astype(int) + (m[:, 1] > 0).astype(int)).astype(float).reshape(-1, 1)
    return x, y


# ------------------------------------------------------------- flat parameters
def test_parameters_live_in_one_flat_buffer(handler):
    net = Sequential(handler, [LSTM(3, 4), FullyConnected(4, 5), ReLU(), FullyConnected(5, 2)],
                     SquaredError(), seed=1)
    ps = net.parameters
    assert ps.params.shape == ps.grads.shape == (ps.size,)
    assert ps.count == 4 * (3 * 4 + 4 * 4 + 4) + (4 * 5 + 5) + (5 * 2 + 2)
    # Write a pattern through the flat buffers; every view must read its slice.
    pattern = np.arange(ps.size, dtype=np.float64)
    handler.set_from_numpy(ps.params, pattern)
    handler.set_from_numpy(ps.grads, -pattern)
    for layer, name, off, shape in ps.entries:
        assert off % ALIGN == 0
        want = pattern[off:off + int(np.prod(shape))].reshape(shape)
        np.testing.assert_array_equal(handler.get_numpy_copy(layer.params[name]), want)
        np.testing.assert_array_equal(handler.get_numpy_copy(layer.grads[name]), -want)


def test_seeded_initialization(handler):
    a, b, c = (mlp(handler, seed=s).parameters.get() for s in (7, 7, 8))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # the same seed gives the same start on another handler too
    ref = mlp(NumpyHandler(np.float64), seed=7).parameters.get()
    np.testing.assert_allclose(a, ref, rtol=1e-6 if handler.dtype == np.float32 else 0)


@pytest.mark.parametrize("n_layers", [1, 3, 7])
def test_sgd_step_is_one_fused_op(handler, n_layers, rng):
    """One op per step over the flat buffers, whatever the number of layers."""
    layers = [FullyConnected(4, 4) for _ in range(n_layers)]
    net = Sequential(handler, layers, SquaredError(), seed=0)
    opt = SGD(net.parameters, lr=0.1, momentum=0.5)
    x = handler.create_from_numpy(rng.uniform(-1, 1, (3, 4)))
    t = handler.create_from_numpy(rng.uniform(-1, 1, (3, 4)))
    p0 = net.parameters.get().astype(np.float64)
    net.train_step(x, t)
    g = handler.get_numpy_copy(net.grads).astype(np.float64)
    rec = Recorder(handler)
    net.parameters.h = rec
    opt.step()
    opt.step()        # same gradients again: v = 0.5 * v - 0.1 g
    net.parameters.h = handler
    # one fused op, bound at the first step (layers.base.run_bound); the
    # second step runs the same bound call, which goes to the backend directly
    assert rec.log == [(0, "_bind_fused")], rec.log
    v1 = -0.1 * g
    v2 = 0.5 * v1 - 0.1 * g
    tol = 1e-6 if handler.dtype == np.float32 else 1e-13
    np.testing.assert_allclose(net.parameters.get(), p0 + v1 + v2, rtol=tol, atol=tol)


# ------------------------------------------------------------------- layers
def test_buffers_cached_per_batch_size(handler, rng):
    """A smaller (last) batch gets its own buffers and the right result; the
    full-size batch afterwards still reuses its first buffers."""
    net = lstm_net(handler)
    x = rng.standard_normal((3, 5, 4))
    full = handler.get_numpy_copy(net.forward(handler.create_from_numpy(x)))
    out_full = net.forward(handler.create_from_numpy(x))
    small = handler.get_numpy_copy(net.forward(handler.create_from_numpy(x[:, :2].copy())))
    again = net.forward(handler.create_from_numpy(x))
    assert again is out_full
    tol = 1e-5 if handler.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(small, full[:2], rtol=tol, atol=tol)
    assert sum(isinstance(k, tuple) for k in net.layers[0]._cache) == 2


def test_wrong_input_shapes_raise(handler):
    net = lstm_net(handler)
    with pytest.raises(ValueError, match="LSTM"):
        net.forward(handler.zeros((3, 2, 5)))          # 5 features, LSTM wants 4
    with pytest.raises(ValueError, match="FullyConnected"):
        fc = FullyConnected(3, 2)
        Sequential(handler, [fc], SquaredError()).forward(handler.zeros((2, 4)))
    with pytest.raises(ValueError, match="targets"):
        net.loss.forward(handler.zeros((2, 3)), handler.zeros((2, 2)))


def test_dropout(make_handler, handler_id):
    h = make_handler(handler_id, seed=3)
    d = Dropout(0.25)
    Sequential(h, [d], SquaredError(), input_grad=True)
    x = h.ones((200, 50))
    assert d.forward(x, training=False) is x
    y = h.get_numpy_copy(d.forward(x, training=True))
    assert np.all((y == 0) | np.isclose(y, 1 / 0.75, rtol=1e-6))
    assert abs((y == 0).mean() - 0.25) < 0.02
    dx = h.get_numpy_copy(d.backward(h.ones((200, 50))))
    np.testing.assert_array_equal(dx, y)            # same mask forward and backward


def test_lstm_weight_gradients_run_on_side_stream_groups(handler, rng):
    """The backward issues the weight-gradient products (one batched product
    each for Wx and Wh, one bias sum) on groups other than 0, after waiting
    for group 0, and group 0 waits for them after."""
    rec = Recorder(handler)
    net = Sequential(rec, [LSTM(4, 6), FullyConnected(6, 2)], SquaredError(), seed=0)
    x = handler.create_from_numpy(rng.standard_normal((3, 5, 4)))
    t = handler.create_from_numpy(rng.standard_normal((3, 5, 2)))
    net.train_step(x, t)
    log = rec.log
    groups = handler.num_stream_groups
    side = [(i, g) for i, (g, op) in enumerate(log) if g != 0]
    if groups == 1:
        assert not side
        return
    side_ops = [log[i][1] for i, _ in side]
    assert side_ops.count("dot_mm") == 2 and side_ops.count("sum_t") == 1
    used = {g for _, g in side}
    assert len(used) == min(3, groups - 1)
    for g in used:   # each side group waits for group 0 before its first gemm
        first = next(i for i, (gg, _) in enumerate(log) if gg == g)
        assert log[first][1] == "wait_event"
    last_side = max(i for i, _ in side)
    waits = [i for i, (g, op) in enumerate(log) if g == 0 and op == "wait_for"]
    assert len(waits) == len(used) and min(waits) > last_side


# --------------------------------------------------- training and trajectories
def trajectory_net(h, seed):
    return Sequential(h, [LSTM(4, 8), Tanh(), FullyConnected(8, 8), ELU(),
                          LSTM(8, 6, return_sequences=False), FullyConnected(6, 3)],
                      SoftmaxCrossEntropy(), seed=seed)


def train_losses(h, seed, steps, x, y, lr=0.3, momentum=0.9):
    """Losses of ``steps`` SGD steps of ``trajectory_net`` on (x, y), and the
    parameters it started from (float64, by (layer index, name))."""
    net = trajectory_net(h, seed)
    flat = net.parameters.get().astype(np.float64)
    index = {id(layer): i for i, layer in enumerate(net.layers)}
    start = {(index[id(layer)], name): flat[off:off + int(np.prod(shape))].reshape(shape)
             for layer, name, off, shape in net.parameters.entries}
    opt = SGD(net.parameters, lr=lr, momentum=momentum)
    hx, hy = h.create_from_numpy(x), h.create_from_numpy(y)
    out = []
    for _ in range(steps):
        out.append(float(h.get_numpy_copy(net.train_step(hx, hy))[0]))
        opt.step()
    return np.array(out), start


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _lstm_forward(x, Wx, Wh, b):
    """All hidden states (T, B, H) of an LSTM (gates i, f, g, o; states 0 at
    first), and what the backward pass needs."""
    T, B, _ = x.shape
    H = Wh.shape[-1]
    hs, cs = np.zeros((T + 1, B, H)), np.zeros((T + 1, B, H))
    gates = []
    for t in range(T):
        pre = [x[t] @ Wx[k] + hs[t] @ Wh[k] + b[k] for k in range(4)]
        i, f, g, o = _sigmoid(pre[0]), _sigmoid(pre[1]), np.tanh(pre[2]), _sigmoid(pre[3])
        cs[t + 1] = f * cs[t] + i * g
        hs[t + 1] = o * np.tanh(cs[t + 1])
        gates.append((i, f, g, o))
    return hs[1:], (x, Wx, Wh, hs, cs, gates)


def _lstm_backward(dh_out, cache):
    """Gradients (dx, dWx, dWh, db) of an LSTM from dL/dh of every step."""
    x, Wx, Wh, hs, cs, gates = cache
    dx = np.zeros_like(x)
    dWx, dWh = np.zeros_like(Wx), np.zeros_like(Wh)
    db = np.zeros((4, 1, Wh.shape[-1]))
    dh_next, dc_next = np.zeros_like(hs[0]), np.zeros_like(cs[0])
    for t in reversed(range(len(gates))):
        i, f, g, o = gates[t]
        tc = np.tanh(cs[t + 1])
        dh = dh_out[t] + dh_next
        dc = dc_next + dh * o * (1 - tc * tc)
        dpre = [dc * g * i * (1 - i), dc * cs[t] * f * (1 - f), dc * i * (1 - g * g),
                dh * tc * o * (1 - o)]
        dh_next = np.zeros_like(dh)
        for k in range(4):
            dWx[k] += x[t].T @ dpre[k]
            dWh[k] += hs[t].T @ dpre[k]
            db[k] += dpre[k].sum(axis=0)
            dx[t] += dpre[k] @ Wx[k].T
            dh_next += dpre[k] @ Wh[k].T
        dc_next = dc * f
    return dx, dWx, dWh, db


def reference_step(P, x, labels):
    """Loss and gradients of ``trajectory_net`` in float64 NumPy, written out
    by hand: LSTM(4, 8), tanh, dense(8, 8), ELU, LSTM(8, 6) (last step),
    dense(6, 3), mean softmax cross-entropy over the batch.  ``P`` maps
    (layer index, name) to parameters."""
    h1, c1 = _lstm_forward(x, P[0, "Wx"], P[0, "Wh"], P[0, "b"])
    a1 = np.tanh(h1)
    z2 = a1 @ P[2, "W"] + P[2, "b"]
    a2 = np.where(z2 > 0, z2, np.expm1(np.minimum(z2, 0)))
    h3, c3 = _lstm_forward(a2, P[4, "Wx"], P[4, "Wh"], P[4, "b"])
    z4 = h3[-1] @ P[5, "W"] + P[5, "b"]
    n = z4.shape[0]
    shifted = z4 - z4.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    rows = np.arange(n)
    loss = -logp[rows, labels].mean()
    dz4 = np.exp(logp)
    dz4[rows, labels] -= 1
    dz4 /= n
    G = {(5, "W"): h3[-1].T @ dz4, (5, "b"): dz4.sum(axis=0, keepdims=True)}
    dh3 = np.zeros_like(h3)
    dh3[-1] = dz4 @ P[5, "W"].T
    da2, G[4, "Wx"], G[4, "Wh"], G[4, "b"] = _lstm_backward(dh3, c3)
    dz2 = da2 * np.where(z2 > 0, 1.0, np.exp(np.minimum(z2, 0)))
    G[2, "W"] = a1.reshape(-1, 8).T @ dz2.reshape(-1, 8)
    G[2, "b"] = dz2.reshape(-1, 8).sum(axis=0, keepdims=True)
    dh1 = (dz2 @ P[2, "W"].T) * (1 - a1 * a1)
    _, G[0, "Wx"], G[0, "Wh"], G[0, "b"] = _lstm_backward(dh1, c1)
    return loss, G


def test_same_trajectory_as_a_float64_numpy_reference(handler):
    """An LSTM/dense network trained by SGD with momentum on this handler
    follows, loss after loss for 15 steps, the same network written out by
    hand in float64 NumPy (forward, backward, SGD) from the same starting
    parameters (float32: rtol 1e-4, about 100 times what NumpyHandler
    needs; float64: 1e-10), and it learns."""
    rng = np.random.default_rng(0)
    x, y = toy_sequences(rng, n=16)
    lr, momentum, steps = 0.3, 0.9, 15
    got, P = train_losses(handler, 5, steps, x, y, lr, momentum)
    xs = x.astype(handler.dtype).astype(np.float64)        # the inputs as the handler holds
    labels = y[:, 0].astype(int)
    V = {k: np.zeros_like(p) for k, p in P.items()}
    ref = []
    for _ in range(steps):
        loss, G = reference_step(P, xs, labels)
        ref.append(loss)
        for k in P:
            V[k] = momentum * V[k] - lr * G[k]
            P[k] = P[k] + V[k]
    ref = np.array(ref)
    assert ref[-1] < 0.5 * ref[0], "the reference does not learn: the check is vacuous"
    rtol = 1e-4 if handler.dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, ref, rtol=rtol)


def test_trainer_fits_and_evaluates(handler):
    rng = np.random.default_rng(0)
    x, y = toy_sequences(rng, n=70)          # 70 = 2 batches of 32 and one of 6
    xt, yt = toy_sequences(rng, n=40)
    net = lstm_net(handler, seed=1)
    trainer = Trainer(net, SGD(net.parameters, lr=0.3), batch_size=32, batch_axis=1,
                      seed=0, log_every=1, progress=True, metrics={"accuracy": accuracy})
    seen = []
    hist = trainer.fit(x, y, epochs=12, eval_data=(xt, yt), on_epoch=seen.append)
    assert len(hist.epochs) == 12 and len(hist.step_losses) == 12 * 3
    assert seen == hist.epochs
    assert hist.train_loss[-1] < 0.6 * hist.train_loss[0]
    last = hist.epochs[-1]
    assert last["seconds"] > 0 and 0 <= last["eval_accuracy"] <= 1
    res = trainer.evaluate(xt, yt)
    assert res["loss"] == pytest.approx(last["eval_loss"], rel=1e-5)
    assert res["accuracy"] > 0.6


def test_trainer_without_tqdm(handler, monkeypatch):
    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name == "tqdm" or name.startswith("tqdm."):
            raise ImportError("No module named 'tqdm'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((20, 6))
    y = rng.integers(0, 3, (20, 1)).astype(float)
    net = mlp(handler)
    # asked for a bar it cannot draw: a warning, and training goes on
    with pytest.warns(UserWarning, match="tqdm"):
        hist = Trainer(net, SGD(net.parameters), batch_size=8, progress=True).fit(x, y, epochs=2)
    assert len(hist.step_losses) == 6
    # by default, where no bar would be drawn (not a terminal), no warning either
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hist = Trainer(net, SGD(net.parameters), batch_size=8).fit(x, y, epochs=1)
    assert len(hist.step_losses) == 3


# ------------------------------------------------------- a user-defined layer
def test_user_defined_layer_trains(handler):
    assert len(inspect.getsource(Scale).splitlines()) < 30
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (64, 5))
    scale = np.array([[3.0, -2.0, 0.5, 1.5, -1.0]])
    net = Sequential(handler, [Scale(5)], SquaredError(), seed=0)
    hist = Trainer(net, SGD(net.parameters, lr=0.5, momentum=0.5), batch_size=16,
                   progress=False).fit(x, x * scale, epochs=30)
    assert hist.train_loss[-1] < 1e-4 * hist.train_loss[0]
    np.testing.assert_allclose(handler.get_numpy_copy(net.layers[0].params["s"]), scale,
                               rtol=1e-2)


def test_mlp_with_every_activation_trains(handler):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((96, 6))
    y = (np.argmax(x[:, :3], axis=1)).astype(float).reshape(-1, 1)
    net = mlp(handler, layers=[FullyConnected(6, 16), ReLU(), Dropout(0.1), FullyConnected(16, 16),
                               ELU(), FullyConnected(16, 16), Sigmoid(), FullyConnected(16, 3)])
    trainer = Trainer(net, SGD(net.parameters, lr=0.2), batch_size=16, progress=False,
                      metrics={"accuracy": accuracy})
    hist = trainer.fit(x, y, epochs=40)
    assert hist.train_loss[-1] < 0.5 * hist.train_loss[0]
    assert trainer.evaluate(x, y)["accuracy"] > 0.8


def _lstm_reference(x, Wx, Wh, b):
    """The LSTM forward in float64 NumPy, step by step (gates i, f, g, o)."""
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    T, B, _ = x.shape
    H = Wh.shape[-1]
    hs, c, hprev = [], np.zeros((B, H)), np.zeros((B, H))
    for t in range(T):
        z = [x[t] @ Wx[k] + hprev @ Wh[k] + b[k] for k in range(4)]
        i, f, g, o = sig(z[0]), sig(z[1]), np.tanh(z[2]), sig(z[3])
        c = f * c + i * g
        hprev = o * np.tanh(c)
        hs.append(hprev)
    return np.stack(hs)


@pytest.mark.parametrize("shape", [(5, 3, 4), (1, 2, 3), (7, 1, 5)])
def test_lstm_forward_against_a_float64_loop(handler, rng, shape):
    """The fused-step LSTM's outputs equal a plain float64 NumPy loop's."""
    T, B, F = shape
    H = 6
    layer = LSTM(F, H)
    layer.bind(handler)
    ps = ParameterSet(handler, [layer], seed=int(rng.integers(2**31)))
    flat = rng.uniform(-0.5, 0.5, ps.params.shape[0])
    ps.set(flat)
    got = {name: np.asarray(flat[off:off + int(np.prod(s))], np.float64).reshape(s)
           for _, name, off, s in ps.entries}
    x = rng.standard_normal(shape)
    y = handler.get_numpy_copy(layer.forward(handler.create_from_numpy(x)))
    ref = _lstm_reference(x, got["Wx"], got["Wh"], got["b"])
    tol = 1e-12 if np.dtype(handler.dtype) == np.float64 else 2e-5
    np.testing.assert_allclose(y, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("return_sequences", [True, False])
def test_fused_lstm_equals_the_unfused_layer(handler, rng, return_sequences):
    """The fused-step LSTM (issue 20) gives the loss and every gradient of the
    layer it replaced, kept as benchmarks/unfused_lstm.py, to float tolerance."""
    from benchmarks.unfused_lstm import UnfusedLSTM
    x = handler.create_from_numpy(rng.standard_normal((6, 4, 5)))
    shape = (6, 4, 3) if return_sequences else (4, 3)
    t = handler.create_from_numpy(rng.standard_normal(shape))
    got = []
    for cls in (LSTM, UnfusedLSTM):
        net = Sequential(handler, [cls(5, 7, return_sequences=return_sequences),
                                   FullyConnected(7, 3)], SquaredError(), seed=3,
                         input_grad=True)
        loss = handler.get_numpy_copy(net.train_step(x, t))
        got.append((loss, handler.get_numpy_copy(net.parameters.grads)))
    tol = 1e-12 if np.dtype(handler.dtype) == np.float64 else 1e-5
    np.testing.assert_allclose(got[0][0], got[1][0], rtol=tol, atol=tol)
    np.testing.assert_allclose(got[0][1], got[1][1], rtol=tol, atol=tol * 10)
