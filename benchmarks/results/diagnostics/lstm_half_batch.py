"""The dp suite's LSTM training step (5 stream groups, captured, no all-reduce) on one GPU at
the global batch 512 and at one rank's half, 256: ms per step, and their ratio, the two-GPU
scaling that a free all-reduce would give.

A diagnostic (run by hand from the project root on a GPU machine:
``python benchmarks/results/diagnostics/lstm_half_batch.py``; put another checkout's
``layers`` first on PYTHONPATH to time it instead).  Its output on an H200 is
``lstm_half_batch-NVIDIA-H200.log``: the layers of db8d7c1, which summed the Wx and Wh
gradients in four chunks of steps on side groups while the recurrence ran, against those of
e150977 (one batched product each after it, as now).  The chunks made both steps slower and
the bound worse (1.713x against 1.787x), so db8d7c1 was reverted.
"""
import numpy as np

import layers
from benchmarks import dp
from handlers import PyCudaHandler
from handlers.cuda import kernel_loader
from layers import SGD

print("layers from", layers.__file__)
cfg = dict(dp.MODELS["lstm"][0])
h = PyCudaHandler(np.float32, num_stream_groups=5)
ms = {}
for n in (512, 256):
    c = dict(cfg, batch=n)
    net = dp.our_net(h, "lstm", c)
    opt = SGD(net.parameters, lr=dp.LR, momentum=dp.MOMENTUM)
    x, y = dp.batch("lstm", c, 0, 1)
    xb, yb = h.create_from_numpy(x), h.create_from_numpy(y)

    def step():
        net.train_step(xb, yb)
        opt.step()
    step()
    g = h.capture(step)
    for _ in range(3):
        g.replay()
    ext = kernel_loader.require()
    e0, e1 = ext.timing_event_new(), ext.timing_event_new()
    ts = []
    for _ in range(15):
        ext.record(e0, h.stream.handle)
        for _ in range(5):
            g.replay()
        ext.record(e1, h.stream.handle)
        ext.event_sync(e1)
        ts.append(ext.event_elapsed(e0, e1) / 5)
    ms[n] = float(np.median(ts))
    print(f"batch {n}: {ms[n]:.3f} ms per step (min {min(ts):.3f})", flush=True)
print(f"ratio 512/256 (2-GPU scaling with a free all-reduce): {ms[512] / ms[256]:.3f}x")
