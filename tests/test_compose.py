"""Layers that hold layers (``Chain``, ``Residual``, ``Graph`` with ``Add``
and ``Concat``), per handler: gradients against float64 central
differences (``check_layer_gradients``), a residual network's training step
against the same network written out in float64 NumPy, names in the flat
buffer and in checkpoints, fusion inside a chain, captured and mixed
precision steps, and the errors of a badly built container."""
import numpy as np
import pytest

from handlers import NumpyHandler
from handlers.testing import check_layer_gradients
from layers import (
    SGD,
    Add,
    Chain,
    Concat,
    FullyConnected,
    Graph,
    LayerNorm,
    ReLU,
    Residual,
    Sequential,
    SoftmaxCrossEntropy,
    Tanh,
    Trainer,
)

CONTAINERS = {
    "chain": (lambda: Chain([FullyConnected(5, 4), Tanh(), FullyConnected(4, 3)]), (3, 5)),
    "residual-one-layer": (lambda: Residual(FullyConnected(5, 5)), (3, 5)),
    "residual-block": (lambda: Residual([FullyConnected(5, 6), Tanh(), FullyConnected(6, 5)]),
                       (4, 5)),
    "residual-3d": (lambda: Residual([LayerNorm(4), FullyConnected(4, 4)]), (2, 3, 4)),
    "nested-residuals": (lambda: Chain([Residual(FullyConnected(4, 4)), Tanh(),
                                        Residual([Residual(FullyConnected(4, 4)), Tanh()])]),
                         (3, 4)),
    # the input feeds three nodes, "a" two: their gradients add up
    "graph-branches": (lambda: Graph([
        ("a", FullyConnected(5, 4), "input"),
        ("b", Chain([FullyConnected(5, 4), Tanh()]), "input"),
        ("sum", Add(), ["a", "b"]),
        ("cat", Concat(), ["sum", "a"]),
        ("skip", FullyConnected(5, 3), "input"),
        ("out", FullyConnected(8, 3), "cat"),
        ("total", Add(), ["out", "skip", "skip"]),
    ]), (3, 5)),
    "graph-concat-three": (lambda: Graph([
        ("a", FullyConnected(3, 2), "input"),
        ("b", FullyConnected(3, 4), "input"),
        ("c", Concat(), ["a", "input", "b"]),
        ("out", FullyConnected(9, 2), "c"),
    ]), (4, 3)),
}


@pytest.mark.parametrize("name", list(CONTAINERS))
def test_container_gradients(handler, rng, name):
    """Backward against float64 central differences (every parameter of
    every held layer and dL/dx), and this handler against float64."""
    make, shape = CONTAINERS[name]
    check_layer_gradients(handler, make(), shape, rng, params="random")


def _residual_net(h, seed, n_in=6, width=8, classes=3, fuse=True):
    return Sequential(h, [FullyConnected(n_in, width), ReLU(),
                          Residual([FullyConnected(width, width), Tanh(),
                                    FullyConnected(width, width)]),
                          ReLU(), FullyConnected(width, classes)],
                      SoftmaxCrossEntropy(), seed=seed, input_grad=True, fuse=fuse)


def _reference(P, x, labels):
    """The residual network of ``_residual_net`` in float64 NumPy: the mean
    cross-entropy and the gradients of every parameter and of x."""
    W0, b0, W1, b1, W2, b2, W3, b3 = P
    z0 = x @ W0 + b0
    a0 = np.maximum(z0, 0)
    h1 = np.tanh(a0 @ W1 + b1)
    r = a0 + h1 @ W2 + b2
    a1 = np.maximum(r, 0)
    z = a1 @ W3 + b3
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    n = len(x)
    loss = -np.mean(np.log(p[np.arange(n), labels]))
    dz = p.copy()
    dz[np.arange(n), labels] -= 1
    dz /= n
    dW3, db3 = a1.T @ dz, dz.sum(0, keepdims=True)
    dr = (dz @ W3.T) * (r > 0)
    dW2, db2 = h1.T @ dr, dr.sum(0, keepdims=True)
    dh = (dr @ W2.T) * (1 - h1 ** 2)
    dW1, db1 = a0.T @ dh, dh.sum(0, keepdims=True)
    da0 = dr + dh @ W1.T
    dz0 = da0 * (z0 > 0)
    dW0, db0 = x.T @ dz0, dz0.sum(0, keepdims=True)
    return loss, [dW0, db0, dW1, db1, dW2, db2, dW3, db3], dz0 @ W0.T


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_residual_step_equals_a_float64_numpy_reference(handler, rng, fuse):
    """One step's loss, every gradient and dL/dx of a residual network on
    this handler against the same network written out in float64 NumPy,
    from the handler's own initial parameters and inputs."""
    net = _residual_net(handler, int(rng.integers(2**31)), fuse=fuse)
    assert net.fused_pairs == (2 if fuse else 0)   # FC+ReLU outside, FC+Tanh in the block
    x = rng.uniform(-1, 1, (7, 6))
    labels = rng.integers(0, 3, 7)
    hx = handler.create_from_numpy(x)
    loss = net.train_step(hx, handler.create_from_numpy(labels[:, None].astype(np.float64)))
    dx = net.backward(net.loss.backward())
    P = [a.astype(np.float64) for a in net.state_dict().values()]
    want_loss, want_grads, want_dx = _reference(P, handler.get_numpy_copy(hx).astype(np.float64),
                                                labels)
    tol = {np.float64: 1e-10, np.float32: 2e-5}.get(np.dtype(handler.dtype).type, 3e-2)
    np.testing.assert_allclose(handler.get_numpy_copy(loss)[0], want_loss, rtol=tol)
    grads = net.parameters.split(handler.get_numpy_copy(net.grads).astype(np.float64))
    for (name, got), want in zip(grads.items(), want_grads):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max(),
                                   err_msg=name)
    got_dx = handler.get_numpy_copy(dx).astype(np.float64)
    np.testing.assert_allclose(got_dx, want_dx, rtol=tol, atol=tol * np.abs(want_dx).max())


def test_names_follow_the_holders(handler):
    net = _residual_net(handler, 0)
    assert net.parameters.names == [
        "0.FullyConnected.W", "0.FullyConnected.b",
        "2.Residual.0.Chain.0.FullyConnected.W", "2.Residual.0.Chain.0.FullyConnected.b",
        "2.Residual.0.Chain.2.FullyConnected.W", "2.Residual.0.Chain.2.FullyConnected.b",
        "4.FullyConnected.W", "4.FullyConnected.b"]
    assert net.parameters.owners == [0, 0, 2, 2, 2, 2, 4, 4]
    assert repr(net).startswith("Sequential([FullyConnected(6, 8), ReLU(), Residual(Chain(["
                                "FullyConnected(8, 8), Tanh(), FullyConnected(8, 8)]))")


def test_state_moves_between_handlers(handler, rng, tmp_path):
    """A residual network saved on this handler loads into a float64
    NumpyHandler network and computes the same output."""
    net = _residual_net(handler, 3)
    x = rng.uniform(-1, 1, (4, 6))
    y = handler.get_numpy_copy(net.forward(handler.create_from_numpy(x))).astype(np.float64)
    net.save(tmp_path / "res.safetensors")
    h64 = NumpyHandler(np.float64)
    other = _residual_net(h64, 99)
    other.load(tmp_path / "res.safetensors")
    got = h64.get_numpy_copy(other.forward(h64.create_from_numpy(
        handler.get_numpy_copy(handler.create_from_numpy(x)).astype(np.float64))))
    tol = 1e-12 if handler.dtype == np.float64 else 1e-4 if handler.dtype == np.float32 else 5e-2
    np.testing.assert_allclose(got, y, rtol=tol, atol=tol)


def _fit(h, graph, epochs=3):
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (64, 6))
    y = (x[:, :1] + x[:, 1:2] > 0).astype(np.float64) + (x[:, 2:3] > 0.5)
    net = _residual_net(h, 11)
    trainer = Trainer(net, SGD(net.parameters, lr=0.2, momentum=0.9), batch_size=16,
                      progress=False, graph=graph)
    history = trainer.fit(x, y, epochs=epochs)
    return np.array(history.step_losses), h.get_numpy_copy(net.params)


def test_captured_steps_equal_eager_ones(make_handler, handler_id):
    """The trainer's captured steps of a residual network leave the
    parameters where eager steps do, and it learns."""
    eager, p_eager = _fit(make_handler(handler_id), graph=False)
    captured, p_captured = _fit(make_handler(handler_id), graph=True)
    np.testing.assert_array_equal(p_captured, p_eager)
    np.testing.assert_array_equal(captured, eager)
    assert eager[-1] < eager[0]


def test_mixed_precision_residual_network(handler, rng):
    """Under bfloat16 mixed precision a residual network's first loss
    agrees with float32's to bfloat16's precision, and the master
    gradients land in the float32 buffer."""
    if handler.dtype != np.float32:
        pytest.skip("mixed precision keeps float32 master parameters")
    h = handler
    x = rng.uniform(-1, 1, (8, 6))
    t = rng.integers(0, 3, (8, 1)).astype(np.float64)
    losses = []
    for mixed in (False, True):
        net = _residual_net(h, 4)
        if mixed:
            net.mixed_precision("bfloat16")
        loss = net.train_step(net.input_h.create_from_numpy(x),
                              net.target_h.create_from_numpy(t))
        losses.append(float(net.h.get_numpy_copy(loss)[0]))
        assert np.abs(h.get_numpy_copy(net.grads)).max() > 0
    np.testing.assert_allclose(losses[1], losses[0], rtol=3e-2)


def test_bad_containers_raise():
    fc = FullyConnected(3, 3)
    with pytest.raises(ValueError, match="appears twice"):
        Sequential(NumpyHandler(), [fc, Residual(fc)], SoftmaxCrossEntropy())
    with pytest.raises(TypeError, match="non-empty list of layers"):
        Residual([])
    with pytest.raises(TypeError, match="non-empty list of layers"):
        Chain([FullyConnected(2, 2), "relu"])
    with pytest.raises(ValueError, match="not an earlier node"):
        Graph([("a", FullyConnected(2, 2), "b"), ("b", FullyConnected(2, 2), "input")])
    with pytest.raises(ValueError, match="merge"):
        Graph([("a", Add(), "input")])
    with pytest.raises(ValueError, match="merge"):
        Graph([("a", FullyConnected(2, 2), ["input", "input"])])
    with pytest.raises(ValueError, match="do not lead to the output"):
        Graph([("a", FullyConnected(2, 2), "input"), ("b", FullyConnected(2, 2), "input")])
    with pytest.raises(ValueError, match="names must be new"):
        Graph([("input", FullyConnected(2, 2), "input")])
    h = NumpyHandler()
    res = Residual(FullyConnected(3, 4))
    Sequential(h, [res], SoftmaxCrossEntropy())
    with pytest.raises(ValueError, match="same shape"):
        res.forward(h.create_from_numpy(np.ones((2, 3))))
    cat = Graph([("c", Concat(), ["input", "input"])])
    Sequential(h, [cat], SoftmaxCrossEntropy())
    assert cat.forward(h.create_from_numpy(np.ones((2, 3)))).shape == (2, 6)


def test_data_parallel_buckets_hold_a_residual_block_whole():
    """Data parallel all-reduces a container's parameters (its held
    layers') as one top-level layer's: a bucket per top-level layer with
    parameters, in backward's order, each after that layer's backward."""
    from layers.data_parallel import DataParallel
    from test_data_parallel import FakeGroup
    h = NumpyHandler(np.float64, num_stream_groups=3)
    net = _residual_net(h, 0)
    p = net.parameters
    starts = [min(off for top, (_, _, off, _) in zip(p.owners, p.entries) if top == i)
              for i in (0, 2, 4)]
    regions = [b - a for a, b in zip(starts, starts[1:] + [p.size])]
    group = FakeGroup(0, 2)
    dp = DataParallel(net, process_group=group, bucket_bytes=8)
    assert [r.size for r in dp.buckets] == regions[::-1]
    group.log.clear()
    dp.train_step(h.create_from_numpy(np.ones((4, 6))), h.create_from_numpy(np.zeros((4, 1))))
    assert group.log == [("allreduce", 2, n) for n in regions[::-1]] + [("allreduce", 2, 1)]
