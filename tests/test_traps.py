"""Small traps a new user meets (issue 44, part 4), each now caught where
it happens: the progress bar on a stream that is not a terminal, what
``Trainer.evaluate`` returns, ``Layer.buffers`` asked for a key it never
allocated, and a layer whose ``__init__`` skips ``super().__init__()``."""
import copy
import io
import pickle
import sys

import numpy as np
import pytest

import helpers
from handlers import NumpyHandler
from layers import (
    SGD,
    Chain,
    Dropout,
    FullyConnected,
    Layer,
    ReLU,
    Sequential,
    SoftmaxCrossEntropy,
    SquaredError,
    Tanh,
    Trainer,
    accuracy,
)


def small_classifier(h, seed=0):
    return Sequential(h, [FullyConnected(6, 8), Tanh(), FullyConnected(8, 4)],
                      SoftmaxCrossEntropy(), seed=seed)


def classification_data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6))
    return x, x[:, :4].argmax(axis=1)          # class labels, (n,) ints


# ------------------------------------------------------------ 1. progress bar
class Terminal(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self):
        return True


def fit_quietly(progress_kwargs, epochs=2):
    """Train the small classifier (3 steps an epoch) with ``progress_kwargs``
    given to the Trainer; returns the trainer."""
    h = NumpyHandler(np.float32)
    net = small_classifier(h)
    x, y = classification_data()
    trainer = Trainer(net, SGD(net.parameters, lr=0.1), batch_size=16, **progress_kwargs)
    trainer.fit(x, y, epochs=epochs)
    return trainer


def test_default_draws_no_bar_where_stderr_is_captured(capsys):
    assert not sys.stderr.isatty()              # capsys: a capture, no terminal
    trainer = fit_quietly({})
    assert trainer.progress is None
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_progress_true_draws_the_bar_where_stderr_is_captured(capsys):
    fit_quietly({"progress": True})
    err = capsys.readouterr().err
    # tqdm's own text: the description the trainer sets, the final count of
    # the 2 x 3 steps, and the unit
    assert "epoch 2/2" in err and "6/6" in err and "step" in err


def test_default_draws_the_bar_on_a_terminal(monkeypatch):
    tty = Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    fit_quietly({})
    assert "6/6" in tty.getvalue() and "epoch 2/2" in tty.getvalue()


def test_progress_false_draws_nothing_on_a_terminal(monkeypatch):
    tty = Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    fit_quietly({"progress": False})
    assert tty.getvalue() == ""


@pytest.mark.parametrize("stream", [None, "closed", object()], ids=["none", "closed", "bare"])
def test_default_takes_an_odd_stderr_for_no_terminal(monkeypatch, stream):
    # pythonw has sys.stderr None; a closed stream's isatty raises ValueError
    if stream == "closed":
        stream = io.StringIO()
        stream.close()
    monkeypatch.setattr(sys, "stderr", stream)
    fit_quietly({}, epochs=1)                   # no bar, and no error reaching for one


@pytest.mark.parametrize("value,kept", [(None, None), (True, True), (False, False),
                                        (np.bool_(True), True), (1, True), (0, False)])
def test_progress_settings_kept(value, kept):
    h = NumpyHandler(np.float32)
    net = small_classifier(h)
    assert Trainer(net, SGD(net.parameters), progress=value).progress is kept


@pytest.mark.parametrize("value", ["auto", "off", 2, 0.5, [True]])
def test_progress_rejects_other_values(value):
    h = NumpyHandler(np.float32)
    net = small_classifier(h)
    with pytest.raises(TypeError, match="progress must be None"):
        Trainer(net, SGD(net.parameters), progress=value)


# ----------------------------------------------------------- 2. evaluate
def top2(outputs, targets):
    """A host metric: the fraction of rows whose label is among the two
    largest outputs."""
    best2 = np.argsort(outputs, axis=1)[:, -2:]
    return float(np.mean((best2 == np.asarray(targets).reshape(-1, 1)).any(axis=1)))


def reference(net, h, x, labels):
    """Loss, accuracy and top-2 of ``net`` on (x, labels), in NumPy float64
    from its parameters: tanh(x W0 + b0) W1 + b1, then the mean softmax
    cross-entropy."""
    p = {k: np.asarray(v, np.float64) for k, v in net.state_dict().items()}
    x = np.asarray(x, h.dtype).astype(np.float64)     # the data the device sees
    hidden = np.tanh(x @ p["0.FullyConnected.W"] + p["0.FullyConnected.b"])
    z = hidden @ p["2.FullyConnected.W"] + p["2.FullyConnected.b"]
    top = z.max(axis=1, keepdims=True)
    logp = z - top - np.log(np.exp(z - top).sum(axis=1, keepdims=True))
    loss = -np.mean(logp[np.arange(len(labels)), labels])
    order = np.argsort(z, axis=1)
    return z, loss, np.mean(order[:, -1] == labels), np.mean(
        (order[:, -2:] == labels[:, None]).any(axis=1))


def test_evaluate_returns_the_loss_and_every_metric(handler):
    x, labels = classification_data(n=50, seed=3)   # 50: batches of 16, 16, 16, 2
    net = small_classifier(handler, seed=1)
    z, want_loss, want_acc, want_top2 = reference(net, handler, x, labels)
    # where a row's two largest logits (or second and third) are too close
    # for the format to rank them as float64 does, its count is left to chance
    ranked = np.sort(z, axis=1)
    gaps = np.minimum(ranked[:, -1] - ranked[:, -2], ranked[:, -2] - ranked[:, -3])
    assert gaps.min() > 1e-3, "data too close to a tie: pick another seed"
    assert 0.05 < want_acc < 0.95            # neither count degenerate

    trainer = Trainer(net, None, batch_size=16, progress=False,
                      metrics={"accuracy": accuracy, "top2": top2})
    got = trainer.evaluate(x, labels)
    assert list(got) == ["loss", "accuracy", "top2"]
    rtol = 2e-5 if handler.dtype == np.float32 else 1e-12
    assert got["loss"] == pytest.approx(want_loss, rel=rtol)
    assert got["accuracy"] == want_acc       # whole counts of 50: exact
    assert got["top2"] == want_top2
    assert all(isinstance(v, float) for v in got.values())


def test_evaluate_without_metrics_returns_the_loss_alone(handler):
    x, labels = classification_data(n=30, seed=4)
    net = small_classifier(handler, seed=2)
    _, want_loss, _, _ = reference(net, handler, x, labels)
    got = Trainer(net, None, batch_size=8, progress=False).evaluate(x, labels)
    assert list(got) == ["loss"]
    rtol = 2e-5 if handler.dtype == np.float32 else 1e-12
    assert got["loss"] == pytest.approx(want_loss, rel=rtol)


def test_fit_records_what_evaluate_returns():
    h = NumpyHandler(np.float64)
    net = small_classifier(h, seed=5)
    x, labels = classification_data(n=48, seed=6)
    xe, le = classification_data(n=20, seed=7)
    trainer = Trainer(net, SGD(net.parameters, lr=0.2), batch_size=16, progress=False,
                      metrics={"accuracy": accuracy, "top2": top2})
    record = trainer.fit(x, labels, epochs=1, eval_data=(xe, le)).epochs[-1]
    after = trainer.evaluate(xe, le)                 # the parameters the record saw
    assert {f"eval_{k}": v for k, v in after.items()} == {
        k: v for k, v in record.items() if k.startswith("eval_")}


# ----------------------------------------------------------- 3. buffers
class Scale(helpers.Scale):
    """y = x * s (the tutorial's layer): buffers keyed by the input shape in
    forward, asked for by dy.shape, the same, in backward; s starts at 1..n,
    so that every factor differs."""

    def init_params(self, rng, host):
        host["s"][...] = np.arange(1, self.n + 1)


class SumFeatures(Layer):
    """y = the sum of each row, (n, k) -> (n, 1): its backward asks for
    ``self.buffers(dy.shape)``, a key forward never used."""

    def forward(self, x, training=True):
        b = self.buffers(x.shape, y=(x.shape[0], 1), dx=x.shape)
        self.h.sum_t(x, 1, b.y)
        return b.y

    def backward(self, dy):
        b = self.buffers(dy.shape)                  # the trap: (n, 1), not (n, k)
        return b.dx


def test_buffers_of_an_unseen_key_without_shapes_raise_at_the_call():
    h = NumpyHandler(np.float64)
    net = Sequential(h, [FullyConnected(3, 3), SumFeatures()], SquaredError(), seed=0)
    layer = net.layers[1]
    x, y = h.create_from_numpy(np.ones((4, 3))), h.create_from_numpy(np.ones((4, 1)))
    with pytest.raises(TypeError) as info:
        net.train_step(x, y)
    message = str(info.value)
    assert "SumFeatures()" in message and "self.buffers((4, 1))" in message
    assert "the first call with a key must give every buffer's shape" in message
    assert info.traceback[-1].name == "buffers"      # raised in the call itself
    assert info.traceback[-2].name == "backward"
    assert (4, 1) not in layer._cache                # nothing cached under the key
    # ... so that the key is still free for its first real call
    assert layer.buffers((4, 1), y=(4, 1)).y.shape == (4, 1)


def test_buffers_refuse_a_name_the_key_did_not_allocate():
    h = NumpyHandler(np.float64)
    layer = Scale(3)
    layer.bind(h)
    first = layer.buffers((2, 3), y=(2, 3))
    with pytest.raises(TypeError, match=r"asks for dx, but the key's first call allocated "
                                        r"only y"):
        layer.buffers((2, 3), y=(2, 3), dx=(2, 3))
    assert layer.buffers((2, 3)) is first and list(vars(first)) == ["y"]


def test_buffers_in_correct_use_are_unchanged():
    h = NumpyHandler(np.float64)
    net = Sequential(h, [Scale(3)], SquaredError(), seed=0, input_grad=True)
    layer = net.layers[0]
    rng = np.random.default_rng(8)
    x, dy = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    s = np.arange(1.0, 4.0).reshape(1, 3)
    y = layer.forward(h.create_from_numpy(x))
    dx = layer.backward(h.create_from_numpy(dy))
    np.testing.assert_allclose(h.get_numpy_copy(y), x * s, rtol=1e-15)
    np.testing.assert_allclose(h.get_numpy_copy(layer.grads["s"]),
                               (dy * x).sum(axis=0, keepdims=True), rtol=1e-14)
    np.testing.assert_allclose(h.get_numpy_copy(dx), dy * s, rtol=1e-15)
    # one set per key, the same arrays every call, a name subset allowed
    b = layer.buffers((5, 3))
    assert b.y is y and b.dx is dx
    assert layer.buffers((5, 3), y=(5, 3)) is b
    other = layer.buffers((2, 3), y=(2, 3), tmp=(2, 3), dx=(2, 3))
    assert other is not b and other.y.shape == (2, 3)


# --------------------------------------------------- 4. super().__init__()
class Forgetful(Layer):
    """A user's layer whose __init__ forgets super().__init__()."""

    def __init__(self, n):
        self.n = n

    def param_shapes(self):
        return {"W": (self.n, self.n)}

    def forward(self, x, training=True):
        return self.buffers(x.shape, y=x.shape).y


def test_network_refuses_a_layer_that_skipped_super_init_and_touches_nothing():
    h = NumpyHandler(np.float32)
    first, loss = FullyConnected(3, 3), SquaredError()
    with pytest.raises(TypeError) as info:
        Sequential(h, [first, Forgetful(3)], loss)
    message = str(info.value)
    assert message.startswith("Sequential: layer 1.Forgetful: Forgetful.__init__ did not "
                              "call Layer.__init__")
    assert "call super().__init__() first thing in Forgetful.__init__" in message
    # refused before any layer was bound or given parameters: still usable
    assert first.h is None and first.params == {} and loss.h is None
    Sequential(h, [first], loss)


def test_network_refuses_one_held_in_a_container():
    h = NumpyHandler(np.float32)
    with pytest.raises(TypeError, match=r"layer 0\.Chain\.1\.Forgetful: Forgetful\.__init__"):
        Sequential(h, [Chain([FullyConnected(3, 3), Forgetful(3)])], SquaredError())


def test_a_loss_that_skipped_super_init_is_named():
    class MyLoss(SquaredError):
        def __init__(self):
            pass
    with pytest.raises(TypeError, match=r"^Sequential: the loss: MyLoss\.__init__ did not "
                                        r"call Layer\.__init__"):
        Sequential(NumpyHandler(np.float32), [FullyConnected(3, 3)], MyLoss())


def test_using_such_a_layer_alone_names_the_fix():
    layer = Forgetful(3)
    with pytest.raises(AttributeError, match=r"Forgetful has no attribute 'params': "
                                             r"Forgetful\.__init__ did not call "
                                             r"Layer\.__init__; call super\(\)\.__init__\(\)"):
        layer.params
    with pytest.raises(AttributeError, match=r"super\(\)\.__init__\(\)") as info:
        layer.forward(np.ones((2, 3)))              # self.buffers reads self._cache
    assert info.value.name == "_cache"
    assert not hasattr(layer, "grads")


def test_other_missing_attributes_keep_pythons_error():
    layer = Scale(2)
    with pytest.raises(AttributeError) as info:
        layer.nothing_here
    assert str(info.value) == "'Scale' object has no attribute 'nothing_here'"
    assert info.value.name == "nothing_here" and info.value.obj is layer
    assert getattr(layer, "nothing_here", 7) == 7 and not hasattr(layer, "nothing_here")


def test_a_property_that_fails_shows_its_own_error():
    class Broken(Layer):
        @property
        def width(self):
            return self.inner.width                  # no self.inner: the real cause

    with pytest.raises(AttributeError, match="'Broken' object has no attribute 'inner'"):
        Broken().width


def test_layers_still_copy_and_pickle():
    for layer in (FullyConnected(3, 4, activation="relu"), Scale(2), Dropout(0.25)):
        for twin in (copy.copy(layer), copy.deepcopy(layer),
                     pickle.loads(pickle.dumps(layer))):
            assert type(twin) is type(layer) and twin is not layer
            assert repr(twin) == repr(layer) and twin.h is None and twin.params == {}
            assert vars(twin).keys() == vars(layer).keys()
    net = Sequential(NumpyHandler(np.float32), [Scale(2)], SquaredError())
    with pytest.raises(TypeError, match="part of a network"):
        copy.deepcopy(net.layers[0])


def test_the_guard_is_not_on_the_step_path(monkeypatch):
    h = NumpyHandler(np.float32)
    net = Sequential(h, [FullyConnected(6, 8), ReLU(), Dropout(0.2), FullyConnected(8, 4)],
                     SoftmaxCrossEntropy(), seed=0)
    x, labels = classification_data(n=16)
    xb = h.create_from_numpy(x)
    yb = h.create_from_numpy(labels.reshape(-1, 1).astype(np.float64))
    net.train_step(xb, yb)                           # first step: allocates
    calls = []
    real = Layer.__getattr__

    def counting(self, name):
        calls.append((type(self).__name__, name))
        return real(self, name)
    monkeypatch.setattr(Layer, "__getattr__", counting)
    for _ in range(3):
        net.train_step(xb, yb)
        net.evaluate_batch(xb, yb)
    assert calls == []
    with pytest.raises(AttributeError):             # the spy itself does count
        net.layers[0].not_there
    assert calls == [("FullyConnected", "not_there")]
