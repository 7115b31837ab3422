"""The trainer fails loudly and keeps its books right, per handler.

Bad inputs raise before any step (parameters untouched); a non-finite loss
stops training naming the step, or skips it on request; the epoch loss,
``evaluate``'s loss, an underflowing softmax and the LSTM's forget-gate bias
are pinned against float64 NumPy computations written here, independently of
the layers' code.
"""
import numpy as np
import pytest

from layers import (
    LSTM,
    SGD,
    Adam,
    AdamW,
    FullyConnected,
    Layer,
    NonFiniteLossError,
    Sequential,
    SoftmaxCrossEntropy,
    SquaredError,
    Tanh,
    Trainer,
    accuracy,
)

NAN, INF = float("nan"), float("inf")


def mlp(h, seed=0, first=()):
    return Sequential(h, [*first, FullyConnected(4, 8), Tanh(), FullyConnected(8, 3)],
                      SoftmaxCrossEntropy(), seed=seed)


def data(rng, n=40):
    return rng.standard_normal((n, 4)), rng.integers(0, 3, n)


def tol(h):
    # float64: a small atol too, since an output near 0 (an LSTM's hidden
    # state can be 7e-6) carries the rounding of the O(1) terms it came from
    # (seen on the GPU: 2e-17 absolute, 3e-12 relative).
    return dict(rtol=2e-5, atol=2e-6) if h.dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------ NumPy references
def logsumexp(z):
    m = z.max(axis=1, keepdims=True)
    return m + np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def cross_entropy(z, y):
    """Mean softmax cross-entropy in float64: y class labels (n,) or rows (n, c)."""
    logp = z - logsumexp(z)
    if y.ndim == 1:
        return float(-logp[np.arange(len(y)), y].mean())
    return float(-(y * logp).sum(axis=1).mean())


def mlp_outputs(h, net, x):
    """The MLP's logits computed in float64 NumPy from the network's parameters."""
    fc1, fc2 = (lay for lay in net.layers if isinstance(lay, FullyConnected))
    p = [h.get_numpy_copy(lay.params[k]).astype(np.float64) for lay in (fc1, fc2)
         for k in ("W", "b")]
    return np.tanh(x @ p[0] + p[1]) @ p[2] + p[3]


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def lstm_last_hidden(Wx, Wh, b, x):
    """An LSTM written from the equations, gates in the documented order
    (i, f, g, o): c = f * c' + i * g, h = o * tanh(c)."""
    T, B, _ = x.shape
    H = Wh.shape[1]
    hs, c = np.zeros((B, H)), np.zeros((B, H))
    for t in range(T):
        a = [x[t] @ Wx[k] + hs @ Wh[k] + b[k] for k in range(4)]
        i, f, g, o = sigmoid(a[0]), sigmoid(a[1]), np.tanh(a[2]), sigmoid(a[3])
        c = f * c + i * g
        hs = o * np.tanh(c)
    return hs


# ------------------------------------------------------------ a planted fault
class Poison(Layer):
    """Passes x through, but turns it to NaN on training call ``at`` (1-based),
    and records the flat parameters seen at the start of every training step."""

    def __init__(self, at):
        super().__init__()
        self.at, self.calls, self.seen = at, 0, []

    def forward(self, x, training=True):
        if not training:
            return x
        self.calls += 1
        self.seen.append(self.net.parameters.get().copy())
        b = self.buffers(x.shape, y=x.shape)
        if self.calls == self.at:
            self.h.mult_st(float("nan"), x, b.y)
        else:
            self.h.copy_to(x, b.y)
        return b.y

    def backward(self, dy):
        return None      # the first layer: no input gradient wanted


def poisoned_net(h, at):
    poison = Poison(at)
    net = mlp(h, first=[poison])
    poison.net = net
    return net, poison


class NanUpdate:
    """An optimizer whose every update turns the parameters to NaN while the
    loss and the gradients stay finite: what ``SGD(lr=nan)`` did before SGD
    refused a NaN rate."""

    def __init__(self, parameters):
        self.parameters = parameters

    def step(self, gate=None):
        p = self.parameters.params
        self.parameters.h.mult_st(NAN, p, p)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kwargs, exc, match", [
    ({"batch_size": 0}, ValueError, "batch_size must be >= 1, got 0"),
    ({"batch_size": -3}, ValueError, "batch_size must be >= 1"),
    ({"batch_size": True}, TypeError, "batch_size must be an int, got bool"),
    ({"batch_size": 8.0}, TypeError, "batch_size must be an int, got float"),
    ({"batch_size": "8"}, TypeError, "batch_size must be an int, got str"),
    ({"batch_axis": -1}, ValueError, "batch_axis must be >= 0"),
    ({"log_every": -1}, ValueError, "log_every must be >= 0"),
    ({"check_every": 0}, ValueError, "check_every must be >= 1"),
    ({"on_nonfinite": "ignore"}, ValueError, "on_nonfinite must be 'raise' or 'skip'"),
    ({"on_nonfinite": "skip", "graph": True}, ValueError, "graph=False"),
])
def test_bad_constructor_arguments(handler, kwargs, exc, match):
    net = mlp(handler)
    with pytest.raises(exc, match=match):
        Trainer(net, SGD(net.parameters), progress=False, **kwargs)


def bad_fit_calls(rng):
    """(name, args of fit, exception, message) for every kind of bad call."""
    x, y = data(rng)
    nan_x, inf_x = x.copy(), x.copy()
    nan_x[7, 2], inf_x[3, 0] = np.nan, -np.inf
    high, low, half = y.copy(), y.copy(), y.astype(float)
    high[5], low[9], half[4] = 3, -1, 0.5
    return [
        ("x list", (x.tolist(), y, 1), TypeError, r"x must be a numpy.ndarray, got list"),
        ("y list", (x, list(y), 1), TypeError, r"y must be a numpy.ndarray.*np.asarray\(y\)"),
        ("x strings", (x.astype(str), y, 1), TypeError, "x must hold real numbers"),
        ("y bool", (x, y > 0, 1), TypeError, "y must hold real numbers"),
        ("epochs -1", (x, y, -1), ValueError, "epochs must be >= 0"),
        ("epochs float", (x, y, 2.0), TypeError, "epochs must be an int"),
        ("epochs bool", (x, y, True), TypeError, "epochs must be an int"),
        ("sample counts", (x, y[:-1], 1), ValueError, "x has 40 samples along axis 0 but y has 39"),
        ("empty", (x[:0], y[:0], 1), ValueError, r"x is empty \(shape \(0, 4\)\)"),
        ("x scalar", (np.float64(1.0), y, 1), TypeError, "numpy.ndarray"),
        ("nan x", (nan_x, y, 1), ValueError, r"x holds 1 non-finite.*nan at index \(7, 2\)"),
        ("inf x", (inf_x, y, 1), ValueError, r"x holds 1 non-finite.*index \(3, 0\)"),
        ("nan y", (x, np.eye(3)[y] * np.nan, 1), ValueError, "y holds 120 non-finite"),
        ("label 3", (x, high, 1), ValueError, r"labels must be in \[0, 3\).*y\[5\] = 3"),
        ("label -1", (x, low, 1), ValueError, r"labels must be in \[0, 3\).*y\[9\] = -1"),
        ("label 3 (n, 1)", (x, high.reshape(-1, 1).astype(float), 1), ValueError,
         r"labels must be in \[0, 3\)"),
        ("label 0.5", (x, half.reshape(-1, 1), 1), ValueError,
         r"whole numbers; y\[4\] is 0.5"),
        ("y (n, 2)", (x, np.eye(3)[y][:, :2], 1), ValueError,
         r"distributions \(n, 3\).*got shape \(40, 2\)"),
        ("y (n, 1, 3)", (x, np.eye(3)[y][:, None], 1), ValueError, "got shape"),
        ("x features", (x[:, :3], y, 1), ValueError, r"x of shape \(40, 3\) does not fit"),
        ("eval_data not a pair", (x, y, 1, x), TypeError, "eval_data must be a pair"),
        ("eval_data labels", (x, y, 1, (x, high)), ValueError, "eval_data: class labels"),
    ]


@pytest.mark.parametrize("case", range(22))
def test_bad_fit_raises_before_training(handler, rng, case):
    name, args, exc, match = bad_fit_calls(rng)[case]
    net = mlp(handler)
    opt = SGD(net.parameters, lr=0.5, momentum=0.9)
    before = net.parameters.get().copy()
    trainer = Trainer(net, opt, batch_size=16, progress=False)
    with pytest.raises(exc, match=match):
        trainer.fit(*args)
    np.testing.assert_array_equal(net.parameters.get(), before, err_msg=name)


def test_bad_metrics_are_refused(handler):
    net = mlp(handler)
    for metrics, match in [
            ("accuracy", r"metrics must be a mapping \{name: f\(outputs, targets\)\}.*"
                         r"got str 'accuracy'"),
            (["accuracy"], "metrics must be a mapping.*got list"),
            (accuracy, "metrics must be a mapping.*got function"),
            ({"accuracy": "accuracy"}, "metrics\\['accuracy'\\] must be callable.*got str"),
            ({1: accuracy}, "metrics names must be str, got int 1")]:
        with pytest.raises(TypeError, match=match):
            Trainer(net, SGD(net.parameters), progress=False, metrics=metrics)
    for metrics in (None, {}, {"accuracy": accuracy}):
        Trainer(net, SGD(net.parameters), progress=False, metrics=metrics)


def test_bad_fit_calls_are_all_run():
    assert len(bad_fit_calls(np.random.default_rng(0))) == 22


def test_bad_evaluate_raises(handler, rng):
    net = mlp(handler)
    trainer = Trainer(net, SGD(net.parameters), batch_size=16, progress=False)
    x, y = data(rng)
    with pytest.raises(TypeError, match="Trainer.evaluate: x must be a numpy.ndarray"):
        trainer.evaluate(list(x), y)
    with pytest.raises(ValueError, match=r"Trainer.evaluate: class labels must be in \[0, 3\)"):
        trainer.evaluate(x, y + 3)
    with pytest.raises(ValueError, match="Trainer.evaluate: x is empty"):
        trainer.evaluate(x[:0], y[:0])


def test_squared_error_target_shape(handler, rng):
    net = Sequential(handler, [FullyConnected(4, 2)], SquaredError(), seed=0)
    trainer = Trainer(net, SGD(net.parameters), batch_size=8, progress=False)
    x = rng.standard_normal((20, 4))
    with pytest.raises(ValueError, match=r"y must have the network output's shape \(n,\) \+ "
                                         r"\(2,\).*got shape \(20, 3\)"):
        trainer.fit(x, rng.standard_normal((20, 3)), 1)
    with pytest.raises(ValueError, match="got shape"):
        trainer.fit(x, rng.standard_normal(20), 1)


# ------------------------------------------------------------------ labels
@pytest.mark.parametrize("graph", [False, True])
def test_1d_int_labels_train_like_float_column(handler, rng, graph):
    x, y = data(rng, n=45)
    params = []
    for labels in (y, y.reshape(-1, 1).astype(np.float64), y.reshape(-1, 1).astype(np.int32)):
        net = mlp(handler, seed=3)
        trainer = Trainer(net, SGD(net.parameters, lr=0.3, momentum=0.5), batch_size=16,
                          seed=1, progress=False, graph=graph)
        hist = trainer.fit(x, labels, epochs=3)
        params.append(net.parameters.get().copy())
        assert trainer.evaluate(x, labels)["loss"] < hist.epochs[0]["train_loss"]
    np.testing.assert_array_equal(params[0], params[1])
    np.testing.assert_array_equal(params[0], params[2])
    assert not np.array_equal(params[0], mlp(handler, seed=3).parameters.get())


# ------------------------------------------------------------------ non-finite
@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("check_every, step, steps, match", [
    (1, None, (1, 1), "the parameters became non-finite at epoch 1 during step 1,"),
    (2, 2, (1, 2), "the loss became nan at epoch 1, step 2 "),
    (50, 2, (1, 3), "the loss became nan at epoch 1, step 2 "),
])
def test_nan_update_stops_at_the_step(handler, rng, graph, check_every, step, steps, match):
    """Step 1's loss is finite but its update poisons the parameters (seen
    by a check right after it), so step 2's loss is NaN; the error names
    epoch 1, the first bad step and the steps checked."""
    x, y = data(rng, n=40)
    net = mlp(handler)
    trainer = Trainer(net, NanUpdate(net.parameters), batch_size=16, progress=False,
                      graph=graph, check_every=check_every)
    with pytest.raises(NonFiniteLossError, match=match) as e:
        trainer.fit(x, y, epochs=2)
    assert isinstance(e.value, FloatingPointError)
    assert (e.value.epoch, e.value.step, e.value.steps) == (1, step, steps)


def test_nan_update_one_step(handler, rng):
    """A single step: the loss stays finite, the parameters do not."""
    x, y = data(rng, n=10)
    net = mlp(handler)
    trainer = Trainer(net, NanUpdate(net.parameters), batch_size=16, progress=False)
    with pytest.raises(NonFiniteLossError, match="parameters became non-finite at epoch 1 "
                                                 "during step 1") as e:
        trainer.fit(x, y, epochs=1)
    assert e.value.step is None


@pytest.mark.parametrize("at, check_every, where", [
    (8, 2, (2, 3, (3, 4))),       # epoch 2, step 3, seen by the check after step 4
    (5, 2, (1, 5, (5, 5))),       # the last step of epoch 1, seen at its end
    (3, 50, (1, 3, (1, 5))),
])
def test_planted_nan_stops_at_the_step(handler, rng, at, check_every, where):
    x, y = data(rng, n=80)        # 5 steps of 16 per epoch
    net, poison = poisoned_net(handler, at)
    trainer = Trainer(net, SGD(net.parameters, lr=0.1), batch_size=16, progress=False,
                      graph=False, check_every=check_every)
    epoch, step, steps = where
    with pytest.raises(NonFiniteLossError, match=f"epoch {epoch}, step {step} ") as e:
        trainer.fit(x, y, epochs=3)
    assert (e.value.epoch, e.value.step, e.value.steps) == where
    assert poison.calls == (epoch - 1) * 5 + steps[1]   # no step after the check


def test_skip_mode_skips_the_poisoned_step(handler, rng):
    x, y = data(rng, n=70)        # steps of 32, 32 and 6
    net, poison = poisoned_net(handler, at=2)
    trainer = Trainer(net, SGD(net.parameters, lr=0.3, momentum=0.9), batch_size=32,
                      progress=False, on_nonfinite="skip")
    assert not trainer.graph
    hist = trainer.fit(x, y, epochs=2)
    seen = poison.seen + [net.parameters.get()]
    assert hist.skipped_steps == [(1, 2)]
    np.testing.assert_array_equal(seen[2], seen[1])     # the poisoned step changed nothing
    for k in (0, 2, 3, 4, 5):                           # every other step trained
        assert not np.array_equal(seen[k + 1], seen[k])
    losses = np.array(hist.step_losses)
    assert np.isnan(losses[1]) and np.isfinite(np.delete(losses, 1)).all()
    # epoch 1's loss: steps 1 and 3 only, weighted by their sizes 32 and 6
    want = (32 * losses[0] + 6 * losses[2]) / 38
    assert hist.epochs[0]["train_loss"] == pytest.approx(want, rel=1e-12)


def test_skip_mode_still_raises_for_nan_parameters(handler, rng):
    x, y = data(rng, n=40)
    net = mlp(handler)
    trainer = Trainer(net, NanUpdate(net.parameters), batch_size=16, progress=False,
                      on_nonfinite="skip")
    with pytest.raises(NonFiniteLossError, match="parameters became non-finite"):
        trainer.fit(x, y, epochs=1)


# ------------------------------------------------------------------ bookkeeping
def test_epoch_loss_weights_the_partial_batch(handler, rng):
    """With lr=0 the parameters never move, so the epoch's loss must be the
    loss of the whole data set, which only a batch-size-weighted mean of the
    steps' losses gives (70 samples: batches of 32, 32 and 6)."""
    # The unweighted mean of the three steps differs from the weighted one by
    # 0.25 * (loss of the 6 - mean loss of the two 32s), which a random draw
    # can make tiny: draw until it is not (the check would be vacuous), then
    # check the weighting on that draw.
    for _ in range(20):
        x, y = data(rng, n=70)
        net = mlp(handler, seed=4)
        trainer = Trainer(net, SGD(net.parameters, lr=0.0), batch_size=32, progress=False)
        hist = trainer.fit(x, y, epochs=2)
        want = cross_entropy(mlp_outputs(handler, net, x), y)
        if abs(np.mean(hist.step_losses[:3]) - want) > 1e-3 * want:
            break
    else:
        pytest.fail("20 draws of data did not tell the weighted and unweighted means apart")
    for e in hist.epochs:
        np.testing.assert_allclose(e["train_loss"], want, **tol(handler))


@pytest.mark.parametrize("labels", ["1-D", "column", "soft"])
def test_evaluate_matches_full_batch_numpy_loss(handler, rng, labels):
    x, y = data(rng, n=70)
    net = mlp(handler, seed=5)
    trainer = Trainer(net, SGD(net.parameters, lr=0.3), batch_size=32, progress=False)
    trainer.fit(x, y, epochs=2)             # parameters away from their start
    targets = {"1-D": y, "column": y.reshape(-1, 1).astype(float),
               "soft": rng.dirichlet(np.ones(3), size=70)}[labels]
    ref = targets if labels == "soft" else y
    want = cross_entropy(mlp_outputs(handler, net, x), ref)
    np.testing.assert_allclose(trainer.evaluate(x, targets)["loss"], want, **tol(handler))


def test_underflowing_softmax_gives_the_exact_finite_loss(handler):
    """Logits [0, -800]: p = exp(-800) underflows to 0 in both dtypes, yet
    -log p is exactly 800 + log(1 + e^-800) = 800, and must come out so."""
    z = np.array([[0.0, -800.0], [0.0, -800.0], [-800.0, 0.0]])
    y = np.array([1, 0, 0])
    want = cross_entropy(z, y)
    assert want == pytest.approx(1600 / 3, rel=1e-15)
    net = Sequential(handler, [], SoftmaxCrossEntropy(), seed=0)
    trainer = Trainer(net, SGD(net.parameters), batch_size=2, progress=False)
    got = trainer.evaluate(z, y)["loss"]
    np.testing.assert_allclose(got, want, **tol(handler))
    assert np.isfinite(handler.get_numpy_copy(net.loss.backward())).all()


def test_lstm_forget_gate_bias_starts_at_one(handler, rng):
    """The bias is 1 on the forget gate's slice and 0 elsewhere, and that
    slice is the forget gate: the layer's output matches an LSTM written
    from the equations with the documented gate order (i, f, g, o)."""
    lstm = LSTM(3, 5, return_sequences=False)
    Sequential(handler, [lstm], SquaredError(), seed=2)
    b = handler.get_numpy_copy(lstm.params["b"]).astype(np.float64)
    assert b.shape == (4, 1, 5)
    want = np.zeros((4, 1, 5))
    want[1] = 1.0                           # i, f, g, o: the second slice
    np.testing.assert_array_equal(b, want)
    Wx, Wh = (handler.get_numpy_copy(lstm.params[k]).astype(np.float64) for k in ("Wx", "Wh"))
    x = rng.standard_normal((6, 4, 3))
    got = handler.get_numpy_copy(lstm.forward(handler.create_from_numpy(x)))
    np.testing.assert_allclose(got, lstm_last_hidden(Wx, Wh, b, x), **tol(handler))
    # The check can tell the gates apart: the bias on another slice differs.
    other = np.roll(b, 1, axis=0)
    assert not np.allclose(lstm_last_hidden(Wx, Wh, other, x), got, rtol=1e-3)


# ------------------------------------------------------------------ optimizer hyperparameters
BAD_REALS = [(NAN, ValueError), (INF, ValueError), (-INF, ValueError), (None, TypeError),
             ("0.1", TypeError), (True, TypeError), (1 + 1j, TypeError),
             (np.array([0.1]), TypeError)]
BAD_IDS = ["nan", "inf", "-inf", "None", "str", "bool", "complex", "array"]


def _message_names(msg, owner, name, value, exc):
    """The message names the optimizer, the hyperparameter, the value (and
    its type, for a TypeError)."""
    assert msg.startswith(f"{owner}: {name} must be "), msg
    got = f"got {type(value).__name__} {value!r}" if exc is TypeError else f"got {value!r}"
    assert msg.endswith(got), msg


def _refused(make, exc, owner, name, value):
    with pytest.raises(exc) as info:
        make()
    assert info.type is exc
    _message_names(str(info.value), owner, name, value, exc)


@pytest.mark.parametrize("value, exc", BAD_REALS + [(-0.1, ValueError)],
                         ids=BAD_IDS + ["negative"])
def test_sgd_refuses_a_bad_lr_before_anything_is_written(handler, rng, value, exc):
    """SGD(lr=nan) used to be accepted: the first fit step turned the
    parameters and the velocity to NaN before NonFiniteLossError."""
    net = mlp(handler)
    before = net.parameters.get().copy()
    _refused(lambda: SGD(net.parameters, lr=value), exc, "SGD", "lr", value)
    np.testing.assert_array_equal(net.parameters.get(), before)


@pytest.mark.parametrize("value, exc", BAD_REALS + [(-0.1, ValueError), (1.0, ValueError)],
                         ids=BAD_IDS + ["negative", "1"])
def test_sgd_refuses_a_bad_momentum(handler, value, exc):
    net = mlp(handler)
    _refused(lambda: SGD(net.parameters, momentum=value), exc, "SGD", "momentum", value)


def test_sgd_refuses_another_kind_of_parameters(handler):
    net = mlp(handler)
    with pytest.raises(TypeError, match=r"SGD: parameters must be a ParameterSet "
                                        r"\(net.parameters\), got Sequential"):
        SGD(net)


def _one_step_update(h, net, opt, rng):
    """p after one opt.step() from known gradients, and p and g before it."""
    p0 = net.parameters.get().copy()
    g = rng.standard_normal(p0.shape)
    h.set_from_numpy(net.parameters.grads, g)
    g = h.get_numpy_copy(net.parameters.grads).astype(np.float64)
    opt.step()
    return p0.astype(np.float64), g, net.parameters.get().astype(np.float64)


@pytest.mark.parametrize("name", ["lr", "momentum"])
def test_sgd_setters_refuse_and_keep_the_old_value(handler, rng, name):
    """A schedule setting a bad value raises and changes nothing: the device
    scalars the step reads keep the old value."""
    net = mlp(handler)
    opt = SGD(net.parameters, lr=0.5, momentum=0.0)
    for value, exc in BAD_REALS + [(-0.1, ValueError)]:
        _refused(lambda: setattr(opt, name, value), exc, "SGD", name, value)
    assert (opt.lr, opt.momentum) == (0.5, 0.0)
    p0, g, p1 = _one_step_update(handler, net, opt, rng)
    np.testing.assert_allclose(p1, p0 - 0.5 * g, **tol(handler))


@pytest.mark.parametrize("cls", [Adam, AdamW])
@pytest.mark.parametrize("kwargs, exc, name, value", [
    *[({"lr": v}, e, "lr", v) for v, e in BAD_REALS],
    ({"eps": NAN}, ValueError, "eps", NAN), ({"eps": INF}, ValueError, "eps", INF),
    ({"eps": "1e-8"}, TypeError, "eps", "1e-8"), ({"eps": None}, TypeError, "eps", None),
    ({"weight_decay": NAN}, ValueError, "weight_decay", NAN),
    ({"weight_decay": INF}, ValueError, "weight_decay", INF),
    ({"weight_decay": None}, TypeError, "weight_decay", None),
    ({"betas": (NAN, 0.999)}, ValueError, "beta1", NAN),
    ({"betas": (0.9, INF)}, ValueError, "beta2", INF),
    ({"betas": ("0.9", 0.999)}, TypeError, "beta1", "0.9"),
    ({"betas": (0.9, True)}, TypeError, "beta2", True),
    ({"betas": (None, 0.999)}, TypeError, "beta1", None)],
    ids=[*(f"lr={i}" for i in BAD_IDS), "eps=nan", "eps=inf", "eps=str", "eps=None",
         "wd=nan", "wd=inf", "wd=None", "beta1=nan", "beta2=inf", "beta1=str", "beta2=bool",
         "beta1=None"])
def test_adam_refuses_bad_hyperparameters(handler, cls, kwargs, exc, name, value):
    net = mlp(handler)
    before = net.parameters.get().copy()
    _refused(lambda: cls(net.parameters, **kwargs), exc, cls.__name__, name, value)
    np.testing.assert_array_equal(net.parameters.get(), before)


@pytest.mark.parametrize("cls", [Adam, AdamW])
def test_adam_lr_setter_refuses_and_keeps_the_old_value(handler, rng, cls):
    net = mlp(handler)
    opt = cls(net.parameters, lr=0.01, weight_decay=0.0)
    for value, exc in BAD_REALS + [(-0.1, ValueError)]:
        _refused(lambda: setattr(opt, "lr", value), exc, cls.__name__, "lr", value)
    assert opt.lr == 0.01
    p0, g, p1 = _one_step_update(handler, net, opt, rng)
    # the first Adam step moves each parameter by lr * g / (|g| + eps): about lr
    np.testing.assert_allclose(p1, p0 - 0.01 * g / (np.abs(g) + 1e-8), rtol=1e-3, atol=1e-6)
    with pytest.raises(TypeError, match=f"{cls.__name__}: parameters must be a ParameterSet"):
        cls(net)
