"""Class labels and other indices stay exact whatever format a network computes in.

bfloat16 holds whole numbers exactly only up to 256 and float16 up to 2048, so
labels held in such a format name other classes (4081 becomes 4080 in
bfloat16, 4095 becomes 4096, past the last class).  A loss therefore computes
in float32 (``loss.h``, the float32 twin of a half handler) on logits cast from
the network's format and takes its labels there (the loss and dL/dy come back
rounded once into the network's format), and under mixed precision an
``Embedding`` takes its ids in the master format (``net.input_h``).  Checked
against NumPy in float64 on the same logits and labels, with 4096 classes, on
every handler configuration: mixed bfloat16 and float16 over a float32 or
float64 master, and a network of a half handler in its own format.
"""
import numpy as np
import pytest

from handlers import dtypes
from layers import (
    SGD,
    Embedding,
    FullyConnected,
    Sequential,
    SoftmaxCrossEntropy,
    SquaredError,
    Trainer,
    accuracy,
)

HALF_FORMATS = True
C = 4096                        # classes: past bfloat16's 256 and float16's 2048
NEAR_TOP = [4080, 4081, 4095, 2049, 257]   # each rounds to another class in a half format


def _compute_formats(h):
    """The formats a network of ``h`` computes in, with the ``precision`` of
    ``Trainer`` that gives each: mixed bfloat16 and float16 over a float32 or
    float64 master, or the half format of ``h`` itself (precision None)."""
    if dtypes.is_half(h.dtype):
        return [(None, h.dtype)]
    return [("bf16", dtypes.resolve("bfloat16")), ("fp16", np.dtype(np.float16))]


def _labels(rng, n):
    """n labels in [0, C), the classes of NEAR_TOP among them."""
    labels = rng.integers(0, C, n)
    labels[:len(NEAR_TOP)] = NEAR_TOP
    return labels


def _cross_entropy(logits, labels):
    """Mean softmax cross-entropy in float64 and its gradient (p - onehot) / n."""
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    n = len(z)
    onehot = np.zeros_like(z)
    onehot[np.arange(n), labels] = 1.0
    return -logp[np.arange(n), labels].mean(), (np.exp(logp) - onehot) / n


def test_labels_4080_and_4081_give_their_own_losses(handler, rng):
    """A loss bound to a half handler takes labels in its own float32 format:
    4080 and 4081 (one bfloat16 number) give the float64 reference's two
    different losses and one-hot gradients (computed in float32, rounded
    once into the logits' format)."""
    for _, dt in _compute_formats(handler):
        hc = handler.twin(dt)
        loss = SoftmaxCrossEntropy()
        loss.bind(hc)
        logits = rng.normal(0.0, 2.0, (3, C))
        logits[:, 4080], logits[:, 4081] = 3.0, -3.0
        y = hc.create_from_numpy(logits)
        held = hc.get_numpy_copy(y).astype(np.float64)
        u = dtypes.unit_roundoff(dt)
        got = {}
        for label in (4080, 4081):
            t = loss.h.create_from_numpy(np.full((3, 1), float(label)))
            value = float(hc.get_numpy_copy(loss.forward(y, t))[0])
            dy = loss.backward()
            assert dy.dtype == dt and tuple(dy.shape) == (3, C)
            got[label] = value, hc.get_numpy_copy(dy).astype(np.float64)
        assert got[4081][0] - got[4080][0] > 5.0    # 6 apart: class 4081 holds logit -3
        for label, (value, dy) in got.items():
            want, grad = _cross_entropy(held, np.full(3, label))
            assert value == pytest.approx(want, rel=u + 1e-5), (dt, label)
            np.testing.assert_allclose(dy, grad, rtol=2 * u, atol=dtypes.smallest_subnormal(dt))
        assert loss.h.dtype == np.float32


def test_trainer_losses_and_accuracy_are_those_of_the_exact_labels(make_handler, handler_id,
                                                                     rng):
    """Training (lr 0: the parameters stay) and evaluation with 4096 classes,
    in each half format the configuration computes in: every step's loss,
    the epoch's, and the evaluation's loss and accuracy are those of the
    float64 reference on the network's own logits and the exact labels."""
    n = 384
    labels = _labels(rng, n)
    x = rng.integers(-64, 65, (n, 8)).astype(np.float64)   # exact in every format
    for precision, dt in _compute_formats(make_handler(handler_id)):
        h = make_handler(handler_id, seed=0)
        net = Sequential(h, [FullyConnected(8, C)], SoftmaxCrossEntropy(), seed=1)
        tr = Trainer(net, SGD(net.parameters, lr=0.0, momentum=0.0), batch_size=128,
                     progress=False, precision=precision, metrics={"accuracy": accuracy})
        # the network's logits, in batches of the shapes training and evaluation use
        logits = np.concatenate([net.h.get_numpy_copy(net.forward(
            net.input_h.create_from_numpy(x[lo:lo + 128]))) for lo in range(0, n, 128)])
        want, _ = _cross_entropy(logits, labels)
        assert 4.0 < want < 20.0          # logits spread: a wrong class changes the loss
        # each batch's loss is rounded once into the compute format
        tol = dtypes.unit_roundoff(dt) + 1e-4
        history = tr.fit(x, labels, 1)
        assert history.epochs[0]["train_loss"] == pytest.approx(want, rel=tol), precision
        result = tr.evaluate(x, labels)
        assert result["loss"] == pytest.approx(want, rel=tol), precision
        assert result["accuracy"] == accuracy(logits, labels)
        assert net.h.dtype == dt and net.target_h.dtype == np.float32
        # one batch at a time through the network's own step
        for lo in range(0, n, 128):
            xb = net.input_h.create_from_numpy(x[lo:lo + 128])
            tb = net.target_h.create_from_numpy(labels[lo:lo + 128, None].astype(np.float64))
            step = float(net.h.get_numpy_copy(net.train_step(xb, tb))[0])
            assert step == pytest.approx(_cross_entropy(logits[lo:lo + 128],
                                                        labels[lo:lo + 128])[0], rel=tol)


def test_class_counts_no_format_holds_are_refused(make_handler, handler_id):
    """Where labels cannot all be exact, the loss and the trainer raise
    ValueError before any work: half-format labels for more classes than the
    format counts, float32 labels (or float64 ones, which the float32 loss
    reads in float32) for more than 2^24 + 1 classes."""
    h = make_handler(handler_id, seed=0)
    for _, dt in _compute_formats(h):
        hc = h.twin(dt)
        loss = SoftmaxCrossEntropy()
        loss.bind(hc)
        limit = dtypes.exact_integers(dt)
        y = hc.zeros((2, limit + 1))          # labels 0 .. limit: all exact
        loss.forward(y, hc.zeros((2, 1)))
        y = hc.zeros((2, limit + 2))
        with pytest.raises(ValueError, match=f"{limit + 2} classes"):
            loss.forward(y, hc.zeros((2, 1)))
        loss.forward(y, loss.h.zeros((2, 1)))   # in float32 they are exact
    big = 2 ** 24 + 2                         # labels 0 .. 2^24 + 1: 2^24 + 1 is not float32
    hc = h.twin(_compute_formats(h)[0][1])
    loss = SoftmaxCrossEntropy()
    loss.bind(hc)
    y = hc.zeros((1, big))
    for labels_h in (loss.h, hc.twin(np.float64)):   # float64 labels are read in float32
        with pytest.raises(ValueError, match=f"{big} classes, but float32"):
            loss.forward(y, labels_h.zeros((1, 1)))
    net = Sequential(h, [], SoftmaxCrossEntropy())
    tr = Trainer(net, SGD(net.parameters), progress=False, precision=_compute_formats(h)[0][0])
    with pytest.raises(ValueError, match=f"{big} classes"):
        tr.evaluate(np.zeros((1, big), np.float32), np.zeros(1))


def test_embedding_ids_stay_exact(make_handler, handler_id, rng):
    """Mixed precision: ids (4096 of them) reach ``Embedding`` in the master
    format, the rows it gives are the master rows rounded once to the
    compute format, and its gradient adds each dy row into its own id's row.
    A network of a half handler itself refuses a vocabulary its format cannot
    count, and takes one it can."""
    n, d = 64, 3
    ids = _labels(rng, n)
    base = make_handler(handler_id, seed=0)
    if dtypes.is_half(base.dtype):
        limit = dtypes.exact_integers(base.dtype)
        net = Sequential(base, [Embedding(limit + 2, d)], SquaredError(), seed=1)
        with pytest.raises(ValueError, match="exact"):
            net.forward(base.create_from_numpy(np.zeros(n)))
        net = Sequential(base, [Embedding(limit + 1, d)], SquaredError(), seed=1)
        net.forward(base.create_from_numpy(np.full(n, float(limit))))
        return
    for precision, dt in _compute_formats(base):
        h = make_handler(handler_id, seed=0)
        net = Sequential(h, [Embedding(C, d)], SquaredError(), seed=1)
        master = net.parameters.get()[:C * d].reshape(C, d).astype(np.float64)
        rows = master.astype(np.float32).astype(dt).astype(np.float64)[ids]
        t = rng.normal(0.0, 1.0, (n, d))
        tr = Trainer(net, SGD(net.parameters, lr=0.0, momentum=0.0), batch_size=n,
                     progress=False, precision=precision)
        want = 0.5 * ((rows - t.astype(np.float32)) ** 2).sum() / n
        assert tr.evaluate(ids.astype(np.float64), t)["loss"] == pytest.approx(
            want, rel=dtypes.unit_roundoff(dt) + 1e-5)
        assert net.input_h is net.parameters.h
        x = net.input_h.create_from_numpy(ids.astype(np.float64))
        np.testing.assert_array_equal(net.h.get_numpy_copy(net.forward(x)).astype(np.float64),
                                      rows)
        net.train_step(x, net.target_h.create_from_numpy(t))
        dy = (rows - t.astype(np.float32)) / n
        scale = 1.0 if net.loss_scaler is None else net.loss_scaler.loss_scale
        dy = (dy * scale).astype(np.float32).astype(dt).astype(np.float64)
        grad = np.zeros((C, d))
        np.add.at(grad, ids, dy)
        got = net.parameters.h.get_numpy_copy(net.grads)[:C * d].reshape(C, d)
        u = dtypes.unit_roundoff(dt)
        np.testing.assert_allclose(got.astype(np.float64) * scale, grad, rtol=4 * u,
                                   atol=1e-7 * scale)


@pytest.mark.parametrize("op", ["index_m_by_v", "binarize_v", "gather_rows_m",
                                "scatter_add_rows_m"])
def test_index_ops_refuse_more_indices_than_the_format_counts(handler, rng, op):
    """An op that reads indices stored in the handler's format refuses, before
    writing anything, a class or row count whose largest index the format
    cannot hold exactly (bfloat16: 257 and more, float16: 2049 and more)."""
    limit = dtypes.exact_integers(handler.dtype)
    if limit > 4096:
        pytest.skip(f"{handler.dtype} counts indices beyond any size tested here")
    n, c = 3, limit + 2          # index limit + 1 is not exact in the format
    h = handler
    idx = h.create_from_numpy(np.array([[0.0], [1.0], [2.0]]))
    table = h.create_from_numpy(rng.standard_normal((c, 2)))
    args = {"index_m_by_v": (h.create_from_numpy(rng.standard_normal((n, c))), idx,
                             h.create_from_numpy(rng.standard_normal((n, 1)))),
            "binarize_v": (idx, h.create_from_numpy(rng.standard_normal((n, c)))),
            "gather_rows_m": (table, idx, h.create_from_numpy(rng.standard_normal((n, 2)))),
            "scatter_add_rows_m": (h.create_from_numpy(rng.standard_normal((n, 2))), idx,
                                   table)}[op]
    before = [h.get_numpy_copy(a) for a in args]
    with pytest.raises(ValueError, match=rf"{op}: .*too many for {h.dtype} indices"):
        getattr(h, op)(*args)
    for a, b in zip(args, before):
        np.testing.assert_array_equal(h.get_numpy_copy(a).view(np.uint16), b.view(np.uint16))


@pytest.mark.parametrize("bad", [-1.0, -0.5, float(C), C + 0.5, float("nan")])
def test_a_label_outside_the_classes_makes_the_loss_nan(handler, rng, bad):
    """A label that names no class (below 0, at or past C, NaN) gives a NaN
    loss; the same logits with the row's label in range, truncated toward
    zero (0.5 is class 0, C - 0.5 class C - 1), give the float64
    reference's loss and gradient.  The row with no class gets the
    softmax alone as its gradient (no one-hot to take away)."""
    loss = SoftmaxCrossEntropy()
    loss.bind(handler)
    logits = rng.normal(0.0, 2.0, (4, C))
    y = handler.create_from_numpy(logits)
    held = handler.get_numpy_copy(y).astype(np.float64)
    good = [0.5, C - 0.5, 7.0, 4081.0]
    t = loss.h.create_from_numpy(np.array(good).reshape(4, 1))
    value = float(handler.get_numpy_copy(loss.forward(y, t))[0])
    want, grad = _cross_entropy(held, np.array([0, C - 1, 7, 4081]))
    tol = 4 * dtypes.unit_roundoff(handler.dtype) + 1e-6
    tiny = max(1e-12, dtypes.smallest_subnormal(handler.dtype))   # underflow in a half format
    assert value == pytest.approx(want, rel=tol)
    np.testing.assert_allclose(handler.get_numpy_copy(loss.backward()), grad, rtol=tol,
                               atol=tiny)
    t = loss.h.create_from_numpy(np.array([0.5, bad, 7.0, 4081.0]).reshape(4, 1))
    assert np.isnan(float(handler.get_numpy_copy(loss.forward(y, t))[0]))
    dy = handler.get_numpy_copy(loss.backward()).astype(np.float64)
    z = held[1] - held[1].max()
    np.testing.assert_allclose(dy[1], np.exp(z) / np.exp(z).sum() / 4, rtol=tol, atol=tiny)
    np.testing.assert_allclose(dy[[0, 2, 3]], grad[[0, 2, 3]], rtol=tol, atol=tiny)
