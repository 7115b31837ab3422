"""Adam and AdamW: the fused ``adam_update`` op against an independent float64
NumPy reference written here (PyTorch's formulas), the optimizers over a
network's flat buffers, and a captured step replayed k times equal, bit for
bit, to k eager steps (the step count and lr live on the device)."""
import numpy as np
import pytest

from helpers import assert_close, rand, rand_input
from layers import Adam, AdamW, FullyConnected, Sequential, SquaredError, Tanh

SHAPES = [(1,), (7,), (3, 5), (1031,), (1048583,)]


def adam_ref(p, g, m, v, t, lr, beta1, beta2, eps, wd, decoupled):
    """One Adam/AdamW step in float64 (torch.optim.Adam / AdamW); returns p, m, v."""
    if decoupled:
        p = p * (1.0 - lr * wd)
    else:
        g = g + wd * p
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    m_hat = m / (1.0 - beta1 ** t)
    v_hat = v / (1.0 - beta2 ** t)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def tol(handler):
    return (2e-5, 2e-6) if handler.dtype == np.float32 else (1e-11, 1e-13)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
@pytest.mark.parametrize("device_lr", [False, True], ids=["lr", "lr-dev"])
def test_adam_update_op(handler, rng, shape, decoupled, device_lr):
    lr, beta1, beta2, eps, wd = 0.01, 0.8, 0.95, 1e-3, 0.1
    g, rg = rand_input(handler, shape, rng)
    m, rm = rand_input(handler, shape, rng)
    v, rv = rand_input(handler, shape, rng, 0.0, 2.0)
    p, rp = rand_input(handler, shape, rng)
    step, rstep = rand_input(handler, (1,), rng, 2.0, 5.0)
    rstep = np.floor(rstep)
    handler.set_from_numpy(step, rstep)
    lr_arg = handler.create_from_numpy(np.array([lr])) if device_lr else lr
    lr_ref = float(np.asarray(lr, handler.dtype))
    handler.adam_update(g, lr_arg, beta1, beta2, eps, wd, step, m, v, p, decoupled=decoupled)
    ep, em, ev = adam_ref(rp, rg, rm, rv, rstep[0] + 1, lr_ref, beta1, beta2, eps, wd,
                          decoupled)
    rtol, atol = tol(handler)
    assert_close(handler, m, em, rtol=rtol, atol=atol)
    assert_close(handler, v, ev, rtol=rtol, atol=atol)
    assert_close(handler, p, ep, rtol=rtol, atol=atol)
    assert_close(handler, step, rstep + 1, rtol=0, atol=0)
    assert_close(handler, g, rg, rtol=0, atol=0)


def test_adam_update_rejects_bad_hyperparameters(handler):
    a = [handler.zeros((3,)) for _ in range(4)]
    step = handler.zeros((1,))
    for kw, bad in [("lr", -1.0), ("beta1", 1.0), ("beta2", -0.1), ("eps", 0.0),
                    ("weight_decay", -0.5)]:
        args = dict(lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0)
        args[kw] = bad
        with pytest.raises(ValueError, match="adam_update"):
            handler.adam_update(a[0], args["lr"], args["beta1"], args["beta2"], args["eps"],
                                args["weight_decay"], step, a[1], a[2], a[3])
    lr = handler.zeros((1,))
    with pytest.raises(ValueError, match="lr"):   # a device lr inside an output
        handler.adam_update(a[0], handler.view_t(a[3], 0, (1,)), 0.9, 0.99, 1e-8, 0.0, step,
                            a[1], a[2], a[3])
    handler.adam_update(a[0], lr, 0.9, 0.99, 1e-8, 0.0, step, a[1], a[2], a[3])


def _net(h, seed=3):
    return Sequential(h, [FullyConnected(5, 7), Tanh(), FullyConnected(7, 3)], SquaredError(),
                      seed=seed)


@pytest.mark.parametrize("cls,wd", [(Adam, 0.0), (Adam, 0.05), (AdamW, 0.05)])
def test_optimizer_steps_match_reference(handler, rng, cls, wd):
    net = _net(handler)
    opt = cls(net.parameters, lr=0.02, betas=(0.85, 0.99), eps=1e-6, weight_decay=wd)
    p = net.parameters.get().astype(np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    rtol, atol = tol(handler)
    for t in range(1, 6):
        x = handler.create_from_numpy(rand((4, 5), rng))
        y = handler.create_from_numpy(rand((4, 3), rng))
        net.train_step(x, y)
        g = handler.get_numpy_copy(net.grads).astype(np.float64)
        p = net.parameters.get().astype(np.float64)   # rounding of the handler's own p
        opt.step()
        p, m, v = adam_ref(p, g, m, v, t, 0.02, 0.85, 0.99, 1e-6, wd, cls is AdamW)
        np.testing.assert_allclose(net.parameters.get(), p, rtol=rtol * 10, atol=atol * 10)
        m = handler.get_numpy_copy(opt.m).astype(np.float64)
        v = handler.get_numpy_copy(opt.v).astype(np.float64)
    assert opt.steps == 5


@pytest.mark.parametrize("cls", [Adam, AdamW])
def test_captured_step_replays_like_eager_steps(make_handler, handler_id, rng, cls):
    x_host, y_host = rand((4, 5), rng), rand((4, 3), rng)
    results = []
    for captured in (False, True):
        h = make_handler(handler_id, seed=1)
        net = _net(h)
        opt = cls(net.parameters, lr=0.05, weight_decay=0.01)
        x, y = h.create_from_numpy(x_host), h.create_from_numpy(y_host)

        def step():
            net.train_step(x, y)
            opt.step()
        step()                            # warm-up: allocates every buffer
        if captured:
            graph = h.capture(step)
            for k in range(4):
                if k == 2:
                    opt.lr = 0.01         # a new lr reaches the replays
                graph.replay()
        else:
            for k in range(4):
                if k == 2:
                    opt.lr = 0.01
                step()
        results.append((net.parameters.get(), h.get_numpy_copy(opt.m),
                        h.get_numpy_copy(opt.v), opt.steps))
    (p0, m0, v0, s0), (p1, m1, v1, s1) = results
    assert s0 == s1 == 5
    np.testing.assert_array_equal(p1, p0)
    np.testing.assert_array_equal(m1, m0)
    np.testing.assert_array_equal(v1, v0)


@pytest.mark.parametrize("kwargs", [{"lr": -0.1}, {"betas": (1.0, 0.9)}, {"betas": (0.9, -0.1)},
                                    {"eps": 0.0}, {"weight_decay": -1.0}, {"betas": 0.9}])
@pytest.mark.parametrize("cls", [Adam, AdamW])
def test_optimizer_rejects_bad_hyperparameters(handler, cls, kwargs):
    net = _net(handler)
    with pytest.raises(ValueError, match=cls.__name__):
        cls(net.parameters, **kwargs)
    opt = cls(net.parameters)
    with pytest.raises(ValueError):
        opt.lr = -1.0


@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
def test_adam_update_accepts_zero_lr_and_zero_betas(handler, rng, decoupled):
    """The edges of the documented ranges are accepted: lr = 0 (p unchanged
    exactly, the moments and step still advance as the reference says) and
    beta1 = beta2 = 0 (m = g, v = g * g)."""
    shape = (3, 7)
    g, rg = rand_input(handler, shape, rng)
    m, rm = rand_input(handler, shape, rng)
    v, rv = rand_input(handler, shape, rng, 0.0, 2.0)
    p, rp = rand_input(handler, shape, rng)
    step = handler.create_from_numpy(np.array([2.0]))
    handler.adam_update(g, 0.0, 0.0, 0.0, 1e-3, 0.1, step, m, v, p, decoupled=decoupled)
    _, em, ev = adam_ref(rp, rg, rm, rv, 3, 0.0, 0.0, 0.0, 1e-3, 0.1, decoupled)
    rtol, atol = tol(handler)
    assert_close(handler, p, rp, rtol=0, atol=0)
    assert_close(handler, m, em, rtol=rtol, atol=atol)
    assert_close(handler, v, ev, rtol=rtol, atol=atol)
    assert_close(handler, step, [3.0], rtol=0, atol=0)
    lr = handler.create_from_numpy(np.array([0.0]))          # a device lr of 0 too
    handler.adam_update(g, lr, 0.5, 0.5, 1e-3, 0.0, step, m, v, p, decoupled=decoupled)
    assert_close(handler, p, rp, rtol=0, atol=0)


@pytest.mark.parametrize("cls", [Adam, AdamW])
def test_optimizers_accept_zero_betas_and_zero_lr(handler, rng, cls):
    """``Adam``/``AdamW`` with betas (0, 0) are accepted and step as the
    float64 reference; ``lr = 0`` is accepted (at construction and set
    later) and a step then leaves the parameters exactly as they were."""
    net = _net(handler, seed=int(rng.integers(2**31)))
    opt = cls(net.parameters, lr=0.05, betas=(0.0, 0.0), eps=1e-6, weight_decay=0.02)
    assert opt.betas == (0.0, 0.0)
    x = handler.create_from_numpy(rand((4, 5), rng))
    y = handler.create_from_numpy(rand((4, 3), rng))
    net.train_step(x, y)
    g = handler.get_numpy_copy(net.grads).astype(np.float64)
    p = net.parameters.get().astype(np.float64)
    opt.step()
    want, _, _ = adam_ref(p, g, 0.0, 0.0, 1, 0.05, 0.0, 0.0, 1e-6, 0.02, cls is AdamW)
    rtol, atol = tol(handler)
    np.testing.assert_allclose(net.parameters.get(), want, rtol=rtol * 10, atol=atol * 10)
    opt.lr = 0.0                                  # set later
    for still in (opt, cls(net.parameters, lr=0.0)):   # and at construction
        assert still.lr == 0.0
        before = net.parameters.get()
        net.train_step(x, y)
        still.step()
        np.testing.assert_array_equal(net.parameters.get(), before)


def test_adamw_default_weight_decay_is_one_hundredth(handler, rng):
    """AdamW's documented default ``weight_decay`` is 0.01: a step with the
    default equals the float64 reference with 0.01, and differs from a step
    with decay 0 (same parameters and gradients) by -lr * 0.01 * p."""
    seed, lr = int(rng.integers(2**31)), 0.1
    x = handler.create_from_numpy(rand((4, 5), rng))
    y = handler.create_from_numpy(rand((4, 3), rng))
    after = []
    for kwargs in ({}, {"weight_decay": 0.0}):
        net = _net(handler, seed=seed)
        opt = AdamW(net.parameters, lr=lr, **kwargs)
        net.train_step(x, y)
        g = handler.get_numpy_copy(net.grads).astype(np.float64)
        p = net.parameters.get().astype(np.float64)
        opt.step()
        after.append(net.parameters.get().astype(np.float64))
    want, _, _ = adam_ref(p, g, 0.0, 0.0, 1, lr, 0.9, 0.999, 1e-8, 0.01, True)
    rtol, atol = tol(handler)
    np.testing.assert_allclose(after[0], want, rtol=rtol * 10, atol=atol * 10)
    ulp = np.finfo(handler.dtype).eps * np.abs(p).max()
    np.testing.assert_allclose(after[0] - after[1], -lr * 0.01 * p, rtol=0, atol=8 * ulp)
    assert np.abs(lr * 0.01 * p).max() > 1000 * ulp     # the difference is visible
