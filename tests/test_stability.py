"""Resource stability of a long training run, per handler: 10,000 training
steps of a small network fed through ``prefetch``; after warm-up, thread count
and live Python objects stay flat, and on the GPU so do device memory (the
handler's pool and ``cuMemGetInfo``) and page-locked staging memory."""
import gc
import itertools
import threading

from layers import SGD, FullyConnected, Sequential, SoftmaxCrossEntropy, Tanh

STEPS = 10_000
WARMUP = 500


def _snapshot(h):
    h.synchronize_all_streams()
    gc.collect()
    snap = {"threads": threading.active_count(), "objects": len(gc.get_objects())}
    if type(h).__name__ == "PyCudaHandler":
        import pycuda.driver as drv
        snap["device_free"] = drv.mem_get_info()[0]
        snap["pool_active"] = h._pool.active_blocks
        snap["pool_held"] = h._pool.held_blocks
        snap["pinned_ranges"] = len(h._pinned.ranges())
    return snap


def test_ten_thousand_training_steps_stay_flat(handler, rng, record_property):
    h = handler
    net = Sequential(h, [FullyConnected(12, 16), Tanh(), FullyConnected(16, 4)],
                     SoftmaxCrossEntropy(), seed=3)
    opt = SGD(net.parameters, lr=0.05)
    xs = [rng.standard_normal((32, 12)) for _ in range(8)]
    ys = [rng.integers(0, 4, (32, 1)).astype(float) for _ in range(8)]

    # One long run, measured at two points inside it (the same batch slot
    # state at both): flat after warm-up, not across separate runs.
    snaps = {}
    # (an endless source: the reader thread is still running at both points)
    source = ((xs[i % 8], ys[i % 8]) for i in itertools.count())
    for step, (xb, yb) in enumerate(h.prefetch(source, depth=2), 1):
        net.train_step(xb, yb)
        opt.step()
        if step in (WARMUP, WARMUP + STEPS):
            snaps[step] = _snapshot(h)
        if step == WARMUP + STEPS:
            break
    before, after = snaps[WARMUP], snaps[WARMUP + STEPS]
    record_property("stability", f"after {WARMUP} steps {before}; "
                                 f"after {WARMUP + STEPS} steps {after}")
    assert h.is_fully_finite(net.parameters.params), "training diverged"
    assert after["threads"] == before["threads"], (before, after)
    # A few objects come and go with caches and the test itself; a leak of
    # one object per step would show as thousands.
    assert abs(after["objects"] - before["objects"]) < 200, (before, after)
    for key in ("pool_active", "pool_held", "pinned_ranges"):
        if key in before:
            assert after[key] == before[key], f"{key}: {before} -> {after}"
    if "device_free" in before:
        assert abs(after["device_free"] - before["device_free"]) < 16 << 20, (before, after)
