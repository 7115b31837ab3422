"""Accuracy counted on the device (``layers.metrics``) against NumPy, and the
trainer's evaluation using it."""
import numpy as np
import pytest

from helpers import rand
from layers import FullyConnected, Sequential, SoftmaxCrossEntropy, Trainer
from layers.metrics import DeviceAccuracy, accuracy, device_accuracy


def _reference(out, labels):
    return float(np.mean(np.argmax(out, axis=1) == labels))


@pytest.mark.parametrize("n,c", [(1, 1), (1, 5), (7, 3), (300, 10)])
@pytest.mark.parametrize("form", ["indices", "column", "one-hot"])
def test_device_accuracy_matches_numpy(handler, rng, n, c, form):
    out = rand((n, c), rng)
    out[0, :] = 0.25                                  # a tie: the first largest wins
    labels = rng.integers(0, c, n)
    labels[: n // 2] = np.argmax(out[: n // 2], axis=1)   # some rows right for sure
    if form == "indices":
        t = labels.astype(float)
    elif form == "column":
        t = labels.astype(float).reshape(n, 1)
    else:
        if c == 1:
            pytest.skip("one-hot needs c > 1")
        t = np.eye(c)[labels]
    o, ta = handler.create_from_numpy(out), handler.create_from_numpy(t)
    held = np.asarray(out, handler.dtype).astype(np.float64)
    expected = _reference(held, labels)
    got = handler.get_numpy_copy(device_accuracy(handler, o, ta))
    assert got.shape == (1,)
    np.testing.assert_allclose(got[0], expected, rtol=1e-6)
    count = DeviceAccuracy(handler).count(o, ta)
    assert handler.get_numpy_copy(count)[0] == round(expected * n)
    assert accuracy(held, t) == pytest.approx(expected)


def test_device_accuracy_rejects_bad_shapes(handler):
    acc = DeviceAccuracy(handler)
    with pytest.raises(ValueError, match="DeviceAccuracy"):
        acc.count(handler.zeros((4, 3)), handler.zeros((5, 1)))
    with pytest.raises(ValueError, match="DeviceAccuracy"):
        acc.count(handler.zeros((4, 3, 2)), handler.zeros((4, 1)))
    assert not acc.supports(handler.zeros((4, 3)), handler.zeros((4, 2)))


def test_trainer_accuracy_on_device_equals_host(handler, rng):
    x = rand((50, 6), rng)
    y = rng.integers(0, 4, 50)
    net = Sequential(handler, [FullyConnected(6, 4)], SoftmaxCrossEntropy(), seed=2)
    host = lambda o, t: accuracy(o, t)   # noqa: E731  (not the function itself: host path)
    trainer = Trainer(net, None, batch_size=16, progress=False,
                      metrics={"acc": accuracy, "acc_host": host})
    result = trainer.evaluate(x, y)
    assert result["acc"] == pytest.approx(result["acc_host"], abs=1e-12)
    out = handler.get_numpy_copy(net.forward(handler.create_from_numpy(x)))
    assert result["acc"] == pytest.approx(_reference(out.astype(np.float64), y))
