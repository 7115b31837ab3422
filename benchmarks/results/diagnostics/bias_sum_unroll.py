"""The bias-gradient sum (64, 128, 32, 32) over (0, 2, 3), bfloat16 and float32: where its
time goes, and sum_mid's loads in flight per thread.

A diagnostic (run by hand from the project root on a GPU machine:
``python benchmarks/results/diagnostics/bias_sum_unroll.py``); its output on an H200, at
commit e150977, is ``bias_sum_unroll-NVIDIA-H200.log``.  Two inputs alternate (together they
fit in the H200's L2: these are not DRAM figures).  Per call: the host's time to issue
``sum_t`` (200 calls, no sync); the suites' EventTimer (LOOP calls from an idle GPU); "eager",
the same with pycuda events; "queued", with a large product ahead so every launch is queued
before the first event (the device's time with its gaps between launches); "graph", the LOOP
calls replayed in a CUDA graph.  Variants: sum_mid's packets in flight per thread (``unroll``:
for the halves' 8-element packets; float32's 4-element packets get unroll * 4 / 4) and
``_plan_mid``'s ``blocks_per_sm`` (``bps``).  Finding: the host issues a call in 3.75 us, less
than the device's 5.7 us, so the bfloat16 sum is not host-bound; 8 half packets in flight beat
4 by 0.1 us a call, which float32 loses; 2 blocks per SM lose everywhere.
"""
import re
import time

import ml_dtypes
import numpy as np

from benchmarks.gpu import EventTimer
from benchmarks.ops import copy_spread
from handlers.cuda import kernel_loader
from handlers.cuda.handler import PyCudaHandler

LOOP, REPS = 10, 25
SRC = open("handlers/cuda/kernels/reduce.cu").read()
OLD = re.search(r"constexpr int UNROLL = V == 8 \? \d+ : 16 / V;", SRC).group(0)


def per_call_us(h, issue, pre=None):
    """Median microseconds per call of ``issue()`` (LOOP calls) between two
    events, ``pre()`` issued before the first event of each sample (which
    EventTimer has no place for)."""
    ext = kernel_loader.require()
    e0, e1 = ext.timing_event_new(), ext.timing_event_new()
    ts = []
    for r in range(3 + REPS):
        if pre:
            pre()
        ext.record(e0, h.stream.handle)
        issue()
        ext.record(e1, h.stream.handle)
        ext.event_sync(e1)
        if r >= 3:
            ts.append(ext.event_elapsed(e0, e1) * 1e3 / LOOP)
    return float(np.median(ts))


for dt, name in ((ml_dtypes.bfloat16, "bf16"), (np.float32, "f32")):
    h = PyCudaHandler(dt)
    copy_bw = copy_spread(h, 1 << 26, 15)["median"]
    host = np.random.default_rng(0).standard_normal((64, 128, 32, 32)).astype(np.float32).astype(dt)
    xs = [h.create_from_numpy(host) for _ in range(2)]
    o = h.allocate((128,))
    want = host.astype(np.float64).sum((0, 2, 3))
    big = [h.allocate((4096, 4096)) for _ in range(3)]
    for b in big:
        h.fill(b, 0.01)
    def busy():
        h.dot_mm(big[0], big[1], big[2])
    nb = host.nbytes + 128 * host.itemsize
    h.sum_t(xs[0], (0, 2, 3), o)
    key = ((64, 128, 32, 32), (0, 2, 3), True)
    plan0 = h._sum_plans[key]
    print(f"{name}: copy {copy_bw/1e12:.3f} TB/s; plan {plan0[0][0].name} grid {plan0[0][1]} "
          f"args {plan0[0][2]} block {plan0[0][3]} chunked {bool(plan0[3])}; one-call "
          f"{h._sum_launches.get(((64,128,32,32),(0,2,3),(128,),True)) is not None}", flush=True)
    h.synchronize()
    hs = []
    for _ in range(7):
        t0 = time.perf_counter()
        for i in range(200):
            h.sum_t(xs[i % 2], (0, 2, 3), o)
        hs.append((time.perf_counter() - t0) / 200 * 1e6)
        h.synchronize()
    print(f"  host issue {np.median(hs):.2f} us/call (h.sum_t in a loop)", flush=True)
    def f(i):
        h.sum_t(xs[i % 2], (0, 2, 3), o)
    t = EventTimer("pycuda", h.stream)
    print(f"  suite-like EventTimer LOOP=10: {t.time(f, reps=REPS, inner=LOOP) * 1e3:.2f} us",
          flush=True)
    for unroll in (4, 8, 2):
        for bps in (1, 2):
            src = SRC.replace(OLD, f"constexpr int UNROLL = V == 8 ? {unroll} : {unroll * 4} / V;")
            fn = kernel_loader.source_function(src, plan0[0][0].name, plan0[0][0].fmt.decode())
            p = h._plan_mid((64, 128, 32, 32), 1, 2, True, blocks_per_sm=bps)
            h._sum_plans[key] = ((fn,) + p[0][1:],) + p[1:]
            h._sum_launches.clear()
            h.sum_t(xs[0], (0, 2, 3), o)
            got = h.get_numpy_copy(o).astype(np.float64)
            err = np.abs(got - want).max() / np.abs(want).max()
            def issue():
                for i in range(LOOP):
                    h.sum_t(xs[i % 2], (0, 2, 3), o)
            eager = per_call_us(h, issue)
            queued = per_call_us(h, issue, pre=busy)
            g = h.capture(issue)
            graph = per_call_us(h, g.replay)
            def pct(us):
                return nb / (us * 1e-6) / copy_bw
            print(f"  unroll {unroll} bps {bps}: eager {eager:.2f} us {pct(eager):.1%}, queued "
                  f"{queued:.2f} us {pct(queued):.1%}, graph {graph:.2f} us {pct(graph):.1%}, "
                  f"rel err {err:.1e}", flush=True)
    h._sum_plans[key] = plan0
    h._sum_launches.clear()
