"""Learning-rate schedules and clipping by the global gradient norm, per
handler: the schedule's values from its definition, the clipped gradients
against float64 NumPy, a captured clip equal to an eager one, and a new
learning rate reaching a captured step."""
import math

import numpy as np
import pytest

from layers import SGD, FullyConnected, Sequential, SoftmaxCrossEntropy, Tanh
from layers.schedules import WarmupCosine, clip_grad_norm


def test_warmup_cosine_values():
    s = WarmupCosine(2.0, warmup=4, total=12, min_lr=0.5)
    assert [s(i) for i in range(4)] == [0.5, 1.0, 1.5, 2.0]
    for i in range(4, 12):
        want = 0.5 + 0.75 * (1 + math.cos(math.pi * (i - 4) / 8))
        assert s(i) == pytest.approx(want, rel=1e-15)
    assert s(12) == s(100) == 0.5
    with pytest.raises(ValueError, match="warmup"):
        WarmupCosine(1.0, warmup=5, total=5)
    with pytest.raises(ValueError, match="lr"):
        WarmupCosine(float("nan"), warmup=0, total=5)


def _net(h, seed=0):
    return Sequential(h, [FullyConnected(6, 9), Tanh(), FullyConnected(9, 3)],
                      SoftmaxCrossEntropy(), seed=seed)


def _grads(h, net, rng, scale):
    x = h.create_from_numpy(rng.uniform(-scale, scale, (7, 6)))
    t = h.create_from_numpy(rng.integers(0, 3, (7, 1)).astype(np.float64))
    net.train_step(x, t)
    return h.get_numpy_copy(net.grads).astype(np.float64)


@pytest.mark.parametrize("max_norm", [1e-3, 0.5, 1e6], ids=["clips", "clips-less", "no-clip"])
def test_clip_grad_norm_against_float64(handler, rng, max_norm):
    net = _net(handler)
    g = _grads(handler, net, rng, 5.0)
    norm = np.linalg.norm(g)
    got_norm = clip_grad_norm(net.parameters, max_norm)
    factor = min(1.0, max_norm / (norm + 1e-6))
    tol = 1e-12 if handler.dtype == np.float64 else 1e-5
    np.testing.assert_allclose(handler.get_numpy_copy(got_norm)[0], norm, rtol=tol)
    np.testing.assert_allclose(handler.get_numpy_copy(net.grads), g * factor,
                               rtol=tol, atol=tol * np.abs(g * factor).max())


def test_clip_and_a_new_lr_reach_a_captured_step(make_handler, handler_id):
    """A captured step with the clip inside it, replayed after the learning
    rate changed, leaves the parameters where eager steps do."""
    params = []
    for captured in (False, True):
        h = make_handler(handler_id)
        rng = np.random.default_rng(3)
        net = _net(h, seed=1)
        opt = SGD(net.parameters, lr=0.1, momentum=0.9)
        x = h.create_from_numpy(rng.uniform(-3, 3, (8, 6)))
        t = h.create_from_numpy(rng.integers(0, 3, (8, 1)).astype(np.float64))

        def step():
            net.train_step(x, t)
            clip_grad_norm(net.parameters, 0.05)
            opt.step()
        step()
        graph = h.capture(step) if captured else None
        for lr in (0.5, 0.01, 0.2):
            opt.lr = lr
            graph.replay() if captured else step()
        params.append(h.get_numpy_copy(net.params))
    np.testing.assert_array_equal(params[0], params[1])


def test_clip_checks_its_arguments(handler):
    net = _net(handler)
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm(net.parameters, 0.0)
    with pytest.raises(TypeError, match="ParameterSet"):
        clip_grad_norm(net, 1.0)


def test_trainer_takes_a_schedule_and_a_clip(make_handler, handler_id):
    """Trainer with ``schedule`` and ``clip_norm``, captured or not, leaves
    the parameters where the same steps written out by hand do."""
    from layers import Trainer
    rng = np.random.default_rng(4)
    x = rng.uniform(-3, 3, (48, 6))
    y = rng.integers(0, 3, 48)
    sched = WarmupCosine(0.2, warmup=3, total=9)
    results = []
    for graph in (False, True):
        h = make_handler(handler_id)
        net = _net(h, seed=2)
        trainer = Trainer(net, SGD(net.parameters, lr=1.0, momentum=0.5), batch_size=16,
                          progress=False, graph=graph, schedule=sched, clip_norm=0.05, seed=7)
        trainer.fit(x, y, 3)
        results.append(h.get_numpy_copy(net.params))
    # by hand, in the trainer's batch order
    h = make_handler(handler_id)
    net = _net(h, seed=2)
    opt = SGD(net.parameters, lr=1.0, momentum=0.5)
    order_rng = np.random.default_rng(7)
    step = 0
    for _ in range(3):
        order = order_rng.permutation(48)
        for s in range(3):
            idx = order[s * 16:(s + 1) * 16]
            opt.lr = sched(step)
            net.train_step(h.create_from_numpy(x[idx]),
                           h.create_from_numpy(y[idx].reshape(-1, 1).astype(np.float64)))
            clip_grad_norm(net.parameters, 0.05)
            opt.step()
            step += 1
    by_hand = h.get_numpy_copy(net.params)
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], by_hand)
    with pytest.raises(ValueError, match="clip_norm"):
        Trainer(net, opt, clip_norm=-1.0)
    with pytest.raises(TypeError, match="schedule"):
        Trainer(net, opt, schedule=0.1)
