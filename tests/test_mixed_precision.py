"""Mixed precision: a network computing in bfloat16 on a twin handler while its
master parameters, gradients and optimizer stay in float32 (or float64).

Checked against NumPy: the working copy is the master rounded once, the master
gradients are the half gradients exactly, an SGD step is float32 arithmetic on
them, counts and sums of evaluation stay exact past the format's integers, and
training in mixed precision reaches the accuracy of float32 training.
"""
import ml_dtypes
import numpy as np
import pytest

from handlers import NumpyHandler
from layers import (
    SGD,
    Adam,
    Conv2D,
    Flatten,
    FullyConnected,
    MaxPool2D,
    ReLU,
    Sequential,
    SoftmaxCrossEntropy,
    Tanh,
    Trainer,
    accuracy,
)
from layers.metrics import DeviceAccuracy, device_accuracy

BF16 = np.dtype(ml_dtypes.bfloat16)


def _mlp(h, seed=0, loss=None):
    """A 6-16-3 tanh MLP (softmax cross-entropy unless ``loss``)."""
    return Sequential(h, [FullyConnected(6, 16), Tanh(), FullyConnected(16, 3)],
                      loss or SoftmaxCrossEntropy(), seed=seed)


def _blobs(n, rng, spread=0.7, centers=None):
    """Three Gaussian blobs in 6-D around ``centers`` (3, 6), random by
    default: (x, labels as (n, 1) floats)."""
    centers = rng.normal(0.0, 1.0, (3, 6)) if centers is None else centers
    labels = rng.integers(0, 3, n)
    x = centers[labels] + rng.normal(0.0, spread, (n, 6))
    return x, labels.astype(np.float64).reshape(-1, 1)


@pytest.mark.parametrize("master", [np.float32, np.float64])
def test_working_copy_and_gradients(master):
    rng = np.random.default_rng(1)
    h = NumpyHandler(master, seed=0)
    net = _mlp(h)
    before = h.get_numpy_copy(net.params).copy()
    net.mixed_precision("bfloat16")
    hc = net.h
    assert hc.dtype == BF16 and hc is h.twin("bfloat16")
    assert net.parameters.h is h and net.params.dtype == master
    x, y = _blobs(10, rng)
    net.train_step(hc.create_from_numpy(x), hc.create_from_numpy(y))
    params16, grads16 = (hc.get_numpy_copy(a) for a in net.compute)
    # the working copy is the master rounded once (through float32)
    np.testing.assert_array_equal(params16.view(np.uint16),
                                  before.astype(np.float32).astype(BF16).view(np.uint16))
    np.testing.assert_array_equal(h.get_numpy_copy(net.params), before)   # untouched
    # the master gradients hold the half gradients exactly
    np.testing.assert_array_equal(h.get_numpy_copy(net.grads), grads16.astype(master))
    assert np.abs(grads16.astype(np.float64)).max() > 0


def test_sgd_step_updates_the_master_in_its_format():
    rng = np.random.default_rng(2)
    h = NumpyHandler(np.float32, seed=0)
    net = _mlp(h)
    opt = SGD(net.parameters, lr=0.1, momentum=0.0)
    net.mixed_precision("bf16")
    x, y = _blobs(8, rng)
    p0 = h.get_numpy_copy(net.params).copy()
    net.train_step(net.h.create_from_numpy(x), net.h.create_from_numpy(y))
    g = h.get_numpy_copy(net.grads).copy()
    opt.step()
    want = p0 + (np.float32(-0.1) * g)   # axpby in float32: v = -lr g; p += v
    np.testing.assert_array_equal(h.get_numpy_copy(net.params), want.astype(np.float32))
    # the next forward rounds the new master into the working copy
    net.forward(net.h.create_from_numpy(x))
    np.testing.assert_array_equal(net.h.get_numpy_copy(net.compute[0]).view(np.uint16),
                                  want.astype(np.float32).astype(BF16).view(np.uint16))


def test_mixed_precision_refuses_bad_formats_and_a_second_call():
    h = NumpyHandler(np.float32)
    net = _mlp(h)
    for bad in (np.float32, np.float64):
        with pytest.raises(ValueError, match="float16 or bfloat16"):
            net.mixed_precision(bad)
    with pytest.raises(TypeError):
        net.mixed_precision(np.int32)
    net.mixed_precision("bfloat16")
    with pytest.raises(ValueError, match="already computes in bfloat16"):
        net.mixed_precision("float16")


@pytest.mark.parametrize("kw, match", [({"precision": "half"}, "precision must be"),
                                       ({"precision": np.float32}, "precision must be")])
def test_trainer_refuses_what_it_cannot_do(kw, match):
    h = NumpyHandler(np.float32)
    net = _mlp(h)
    with pytest.raises(ValueError, match=match):
        Trainer(net, SGD(net.parameters), progress=False, **kw)
    assert net.compute is None and net.h is h   # nothing changed


def test_counts_and_sums_stay_exact_past_the_formats_integers():
    # 600 rows, 300-odd correct: a bfloat16 count would round (8 significant bits)
    rng = np.random.default_rng(3)
    h = NumpyHandler("bfloat16")
    outputs = rng.normal(size=(600, 4))
    labels = rng.integers(0, 4, (600, 1)).astype(np.float64)
    o, t = h.create_from_numpy(outputs), h.create_from_numpy(labels)
    held = outputs.astype(BF16).astype(np.float64)
    hits = int((held.argmax(axis=1) == labels[:, 0]).sum())
    counter = DeviceAccuracy(h)
    assert counter.acc.dtype == np.float32
    assert counter.acc.get_numpy_copy(counter.count(o, t))[0] == hits
    frac = counter.acc.get_numpy_copy(device_accuracy(h, o, t))[0]
    assert frac == np.float32(np.float32(1 / 600) * np.float32(hits))


def test_trainer_bf16_matches_float32_training_and_evaluates_exactly():
    rng = np.random.default_rng(4)
    xa, ya = _blobs(1100, rng, spread=1.2)   # overlapping: a loss far from 0
    x, y, xt, yt = xa[:700], ya[:700], xa[700:], ya[700:]
    results = {}
    for precision in (None, "bf16"):
        h = NumpyHandler(np.float32, seed=0)
        net = _mlp(h)
        tr = Trainer(net, SGD(net.parameters, lr=0.1), batch_size=50, seed=0, progress=False,
                     metrics={"accuracy": accuracy}, precision=precision)
        hist = tr.fit(x, y, 5)
        assert hist.epochs[-1]["train_loss"] < hist.epochs[0]["train_loss"]
        res = tr.evaluate(xt, yt)
        # against the host: the outputs of the same inference forward passes
        out = net.forward(net.h.create_from_numpy(xt))
        assert res["accuracy"] == accuracy(net.h.get_numpy_copy(out), yt)
        results[precision] = res
        assert net.params.dtype == np.float32
    assert abs(results["bf16"]["accuracy"] - results[None]["accuracy"]) <= 0.01
    assert results[None]["accuracy"] > 0.6 and results[None]["loss"] > 0.1
    assert abs(results["bf16"]["loss"] - results[None]["loss"]) <= 0.05 * results[None]["loss"]


def test_adam_keeps_its_state_in_the_master_format():
    rng = np.random.default_rng(6)
    h = NumpyHandler(np.float32, seed=0)
    net = _mlp(h)
    opt = Adam(net.parameters, lr=1e-2)
    x, y = _blobs(300, rng)
    tr = Trainer(net, opt, batch_size=30, progress=False, precision="bf16")
    hist = tr.fit(x, y, 3)
    assert hist.epochs[-1]["train_loss"] < hist.epochs[0]["train_loss"]
    assert opt.m.dtype == opt.v.dtype == np.float32 and opt.steps == 30
    # the moments hold float32 values, not bfloat16 ones
    m = h.get_numpy_copy(opt.m)
    assert (m.astype(BF16).astype(np.float32) != m).any()


def test_conv_net_on_28x28_images_trains_in_bfloat16():
    """Max pooling over 28x28 planes: its indices count within the window,
    so bfloat16 holds them (a plane index would pass 256)."""
    rng = np.random.default_rng(7)
    h = NumpyHandler(np.float32, seed=0)
    net = Sequential(h, [Conv2D(1, 4, 3, padding=1), ReLU(), MaxPool2D(2), Flatten(),
                         FullyConnected(4 * 14 * 14, 2)], SoftmaxCrossEntropy())
    labels = rng.integers(0, 2, 64)
    x = rng.normal(0.0, 0.3, (64, 1, 28, 28))
    x[:, :, :14] += labels[:, None, None, None] * 1.0     # class 1: a bright top half
    y = labels.reshape(-1, 1).astype(np.float64)
    tr = Trainer(net, SGD(net.parameters, lr=0.05), batch_size=16, progress=False,
                 metrics={"accuracy": accuracy}, precision="bf16")
    tr.fit(x, y, 4)
    assert tr.evaluate(x, y)["accuracy"] > 0.9


def test_a_captured_mixed_precision_step_matches_the_eager_one_bit_for_bit():
    """The step's work is on two handlers (the bfloat16 twin computes, the
    float32 master updates); a capture begun on either records both."""
    rng = np.random.default_rng(8)
    x, y = _blobs(200, rng)
    params = {}
    for graph in (False, True):
        h = NumpyHandler(np.float32, seed=0)
        net = _mlp(h)
        tr = Trainer(net, SGD(net.parameters, lr=0.1), batch_size=20, seed=1, progress=False,
                     precision="bf16", graph=graph)
        tr.fit(x, y, 2)
        assert len(tr._step.captured) == (2 if graph else 0)
        params[graph] = h.get_numpy_copy(net.params)
    np.testing.assert_array_equal(params[True], params[False])


def _bf16_twin(handler):
    """``handler``'s bfloat16 twin, for a float32 handler that has one."""
    if handler.dtype != np.float32:
        pytest.skip("a float32 master and its bfloat16 twin")
    if "bfloat16" not in type(handler).supported_dtypes:
        pytest.skip(f"{type(handler).__name__} holds no bfloat16")
    pytest.importorskip("ml_dtypes", reason="bfloat16 arrays need ml_dtypes")
    return handler.twin("bfloat16")   # any other failure fails the test


def test_sgd_steps_by_half_gradients_read_as_they_are(handler, rng):
    """``SGD.step(grads=...)`` with bfloat16 gradients: two momentum steps
    against float64 NumPy on the gradients as bfloat16 holds them."""
    h16 = _bf16_twin(handler)
    net = _mlp(handler)
    opt = SGD(net.parameters, lr=0.1, momentum=0.9)
    n = net.params.shape
    p = handler.get_numpy_copy(net.params).astype(np.float64)
    v = np.zeros(n)
    for _ in range(2):
        g16 = h16.create_from_numpy(rng.normal(0.0, 1.0, n))
        opt.step(grads=g16)
        v = 0.9 * v - 0.1 * h16.get_numpy_copy(g16).astype(np.float64)
        p = p + v
    np.testing.assert_allclose(handler.get_numpy_copy(net.params), p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(handler.get_numpy_copy(opt.velocity), v, rtol=1e-5, atol=1e-6)


def test_sgd_writes_the_working_copy_rounded_from_the_new_parameters(handler, rng):
    """``SGD.step(working=...)``: two momentum steps by bfloat16 gradients
    against float64 NumPy, and the bfloat16 working copy holds the new
    float32 parameters as NumPy rounds them to bfloat16, bit for bit."""
    h16 = _bf16_twin(handler)
    net = _mlp(handler)
    opt = SGD(net.parameters, lr=0.1, momentum=0.9)
    n = net.params.shape
    working = h16.zeros(n)
    p = handler.get_numpy_copy(net.params).astype(np.float64)
    v = np.zeros(n)
    for _ in range(2):
        g16 = h16.create_from_numpy(rng.normal(0.0, 1.0, n))
        opt.step(grads=g16, working=working)
        v = 0.9 * v - 0.1 * h16.get_numpy_copy(g16).astype(np.float64)
        p = p + v
    got = handler.get_numpy_copy(net.params)
    np.testing.assert_allclose(got, p, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(h16.get_numpy_copy(working).view(np.uint16),
                                  got.astype(BF16).view(np.uint16))


def test_sgd_refuses_gradients_of_another_shape_and_writes_nothing(handler):
    net = _mlp(handler)
    opt = SGD(net.parameters, lr=0.1)
    before = handler.get_numpy_copy(net.params).copy()
    with pytest.raises(ValueError, match="grads must have the parameters' shape"):
        opt.step(grads=handler.zeros((net.params.shape[0] - 1,)))
    working = handler.zeros((net.params.shape[0] + 1,))
    with pytest.raises(ValueError, match="working must have the parameters' shape"):
        opt.step(working=working)
    np.testing.assert_array_equal(handler.get_numpy_copy(net.params), before)
    assert not np.any(handler.get_numpy_copy(working))


def test_train_step_without_master_gradients_leaves_them_alone():
    rng = np.random.default_rng(9)
    h = NumpyHandler(np.float32, seed=0)
    net = _mlp(h)
    net.mixed_precision("bf16")
    h.fill(net.grads, 7.0)
    x, y = _blobs(8, rng)
    net.train_step(net.h.create_from_numpy(x), net.target_h.create_from_numpy(y),
                   master_grads=False)
    assert np.all(h.get_numpy_copy(net.grads) == 7.0)
    assert np.any(net.h.get_numpy_copy(net.compute[1]) != 0)
    fp16 = _mlp(NumpyHandler(np.float32))
    fp16.mixed_precision("fp16")
    with pytest.raises(ValueError, match="nothing for the loss scaler"):
        fp16.train_step(fp16.h.create_from_numpy(x), fp16.target_h.create_from_numpy(y),
                        master_grads=False)


def test_trainer_steps_by_the_half_gradients_only_where_nothing_reads_the_master_ones():
    def half(precision="bf16", opt=SGD, **kw):
        net = _mlp(NumpyHandler(np.float32))
        tr = Trainer(net, opt(net.parameters), progress=False, precision=precision, **kw)
        return tr._step.half_grads is not None and tr._step.half_grads is net.compute[1]
    assert half()
    assert not half(precision=None) and not half(precision="fp16") and not half(opt=Adam)
    assert not half(on_nonfinite="skip", graph=False)


def test_trainer_with_half_gradients_matches_the_cast_path_bit_for_bit(handler, make_handler,
                                                                       handler_id, rng):
    """bfloat16 widens into float32 exactly, so stepping by the half
    gradients directly, with the updates writing the working copy that the
    forward passes then take as it is, changes no bit against casting both
    ways (the paths checked above against NumPy).  An ``on_epoch`` callback
    that changes the master parameters is seen by the next epoch's steps
    (the trainer refreshes the working copy at every epoch's start)."""
    _bf16_twin(handler)
    x, y = _blobs(120, rng)
    params = []

    def shrink(record):   # a change of the master parameters between epochs
        h = net.parameters.h
        h.mult_st(0.5, net.params, net.params)
    for direct in (True, False):
        net = _mlp(make_handler(handler_id, seed=0))
        tr = Trainer(net, SGD(net.parameters, lr=0.1), batch_size=20, seed=1, progress=False,
                     precision="bf16")
        assert tr._step.half_grads is net.compute[1]
        if not direct:
            tr._step.half_grads = None
        tr.fit(x, y, 3, on_epoch=shrink)
        working = net.h.get_numpy_copy(net.compute[0]).view(np.uint16).copy()
        net.refresh_working()
        current = net.h.get_numpy_copy(net.compute[0]).view(np.uint16)
        if direct:   # the last update wrote it: the master parameters rounded, shrunk
            halved = net.parameters.h.get_numpy_copy(net.params) * 2
            np.testing.assert_array_equal(
                working, halved.astype(BF16).view(np.uint16))
        params += [current.copy(), net.parameters.h.get_numpy_copy(net.params)]
    np.testing.assert_array_equal(params[0], params[2])
    np.testing.assert_array_equal(params[1], params[3])
