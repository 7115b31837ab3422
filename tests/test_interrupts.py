"""Ctrl-C never tears an optimizer step.

A SIGINT raised in the middle of a step (inside SGD's fused op, after the
velocity is written and before the parameters are; inside NumpyHandler's
Adam, after m and v are written and before p is) is delivered
after the step, so the parameters and the optimizer's state always agree;
``Trainer.fit`` stops between two steps.  Each test checks the state after
the interrupt against a float64 NumPy computation of the whole step.
"""
import signal

import numpy as np
import pytest

import handlers.fused
import handlers.numpy_handler
from layers import (
    SGD,
    Adam,
    FullyConnected,
    Sequential,
    SoftmaxCrossEntropy,
    Tanh,
    Trainer,
    interrupts,
)


def mlp(h, seed=0):
    return Sequential(h, [FullyConnected(4, 8), Tanh(), FullyConnected(8, 3)],
                      SoftmaxCrossEntropy(), seed=seed)


def tol(h):
    return dict(rtol=2e-5, atol=2e-6) if h.dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)


def host(h, a):
    return h.get_numpy_copy(a).astype(np.float64)


def with_gradients(h, rng):
    """A network whose gradient buffer holds random values."""
    net = mlp(h)
    h.set_from_numpy(net.grads, rng.standard_normal(net.grads.shape))
    return net


class _CopytoInterrupts:
    """numpy, except that the first copyto raises SIGINT after it has run:
    inside a fused op on NumpyHandler (handlers.fused), after its first
    output (SGD's velocity) is written and before the next (the parameters)."""

    def __init__(self):
        self.calls = 0

    def __getattr__(self, name):
        return getattr(np, name)

    def copyto(self, *args, **kwargs):
        np.copyto(*args, **kwargs)
        self.calls += 1
        if self.calls == 1:
            signal.raise_signal(signal.SIGINT)


def test_sgd_step_is_whole(handler, rng, monkeypatch):
    """SIGINT after the velocity's update, inside the step's one op: the
    parameters move too, then KeyboardInterrupt is raised."""
    if handler.array_type is not np.ndarray:
        pytest.skip("SGD's step is one kernel on a GPU: nothing to tear inside it")
    net = with_gradients(handler, rng)
    opt = SGD(net.parameters, lr=0.1, momentum=0.9)
    v0 = rng.standard_normal(opt.velocity.shape)
    handler.set_from_numpy(opt.velocity, v0)
    v0, p0, g = host(handler, opt.velocity), host(handler, net.params), host(handler, net.grads)
    fake = _CopytoInterrupts()
    monkeypatch.setattr(handlers.fused, "np", fake)
    with pytest.raises(KeyboardInterrupt):
        opt.step()
    monkeypatch.undo()
    assert fake.calls == 2
    v1 = 0.9 * v0 - 0.1 * g
    np.testing.assert_allclose(host(handler, opt.velocity), v1, **tol(handler))
    np.testing.assert_allclose(host(handler, net.params), p0 + v1, **tol(handler))


class _SqrtInterrupts:
    """numpy, except that sqrt raises SIGINT first: inside NumpyHandler's
    adam_update, after m and v are written and before p is."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def sqrt(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)
        return np.sqrt(*args, **kwargs)


def test_adam_step_is_whole(handler, rng, monkeypatch):
    """SIGINT inside the update: m, v, the step count and p all advance by
    one whole step, then KeyboardInterrupt is raised."""
    if handler.array_type is not np.ndarray:
        pytest.skip("one adam_update is one kernel on a GPU: nothing to tear inside it")
    net = with_gradients(handler, rng)
    opt = Adam(net.parameters, lr=0.01)
    p0, g = host(handler, net.params), host(handler, net.grads)
    monkeypatch.setattr(handlers.numpy_handler, "np", _SqrtInterrupts())
    with pytest.raises(KeyboardInterrupt):
        opt.step()
    monkeypatch.undo()
    m = 0.1 * g
    v = 0.001 * g * g
    p = p0 - 0.01 * (m / 0.1) / (np.sqrt(v / 0.001) + 1e-8)
    np.testing.assert_allclose(host(handler, opt.m), m, **tol(handler))
    np.testing.assert_allclose(host(handler, opt.v), v, **tol(handler))
    np.testing.assert_allclose(host(handler, net.params), p, rtol=1e-4, atol=1e-5)
    assert opt.steps == 1


def test_fit_stops_between_steps(handler, rng):
    """Ctrl-C during fit's third step: fit raises KeyboardInterrupt after
    that step has finished whole (p = p before it + its velocity) and before
    a fourth begins."""
    net = mlp(handler)
    opt = SGD(net.parameters, lr=0.1, momentum=0.9)
    x, y = rng.standard_normal((64, 4)), rng.integers(0, 3, 64)
    trainer = Trainer(net, opt, batch_size=8, progress=False, graph=False)
    real_step, seen = opt._step, []

    def step(*args):
        seen.append(host(handler, net.params))
        if len(seen) == 3:   # inside the step's deferred block, before its one op
            signal.raise_signal(signal.SIGINT)
        real_step(*args)
    opt._step = step
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(x, y, epochs=1)
    assert len(seen) == 3
    np.testing.assert_allclose(host(handler, net.params), seen[2] + host(handler, opt.velocity),
                               **tol(handler))


def test_sigint_handler_is_restored(monkeypatch):
    """After a deferred block the previous SIGINT handler is back; a held
    interrupt goes to it once the block ends."""
    got = []
    monkeypatch.setattr(signal, "SIGINT", signal.SIGINT)
    previous = signal.signal(signal.SIGINT, lambda s, f: got.append(s))
    try:
        mine = signal.getsignal(signal.SIGINT)
        with interrupts.deferred():
            signal.raise_signal(signal.SIGINT)
            assert got == []
        assert got == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, previous)
