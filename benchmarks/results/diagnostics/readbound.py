"""What bounds the bias-gradient sums of (64, 128, 32, 32) over (0, 2, 3).

A diagnostic, not a suite: run it on a GPU machine with CuPy beside the
built library (``python benchmarks/results/diagnostics/readbound.py``); its
output on an H200 is ``readbound-NVIDIA-H200.log`` here.

* A read-only kernel (``benchmarks.ops.READ_ONLY``, which the conv and
  half suites now time beside the bias sums; the log is of this script at
  6e16483, whose own copy of the kernel differed only in the order of its
  additions): grid-stride 16-byte loads, each block writing one partial sum
  and nothing more (no second stage, so it does less than any complete
  reduction), best over launch shapes, over the bias case's bytes
  in bfloat16 (16.8 MB) and float32 (33.5 MB).  Eager: LOOP launches back to
  back between two events (as the suites time), median of REPS; then the
  same LOOP launches captured in a CUDA graph.  Its eager launches go through
  CuPy, whose host time per launch is longer than ours.
* Ours: ``sum_t(x, (0, 2, 3), out)`` the same two ways.

Every figure is bytes read (and written) per second over the device copy
bandwidth of a 128 MB buffer, as the suites compute it.
"""
import cupy as cp
import ml_dtypes
import numpy as np

from benchmarks.ops import READ_ONLY
from handlers.cuda.handler import PyCudaHandler

LOOP, REPS, WARM = 10, 15, 3


def per_call_ms(stream, run):
    """Median ms per call of ``run()`` (which issues LOOP calls on ``stream``)."""
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for r in range(WARM + REPS):
        e0.record(stream)
        run()
        e1.record(stream)
        e1.synchronize()
        if r >= WARM:
            ts.append(cp.cuda.get_elapsed_time(e0, e1) / LOOP)
    return float(np.median(ts))


def captured(stream, issue):
    """A CUDA graph of LOOP calls ``issue(i)`` on ``stream``."""
    with stream:
        stream.begin_capture()
        for i in range(LOOP):
            issue(i)
        return stream.end_capture()


def read_only(stream, copy_bw, sms):
    kernel = cp.RawKernel(READ_ONLY, "read_only")
    for nbytes, what in ((64 * 128 * 1024 * 2, "bf16 bias (16.8 MB)"),
                         (64 * 128 * 1024 * 4, "f32 bias (33.5 MB)")):
        xs = [cp.ones(nbytes // 4, cp.float32) for _ in range(2)]
        out = cp.empty(sms * 64, cp.float32)
        n4 = np.int64(nbytes // 16)
        best = None
        for threads in (256, 512, 1024):
            for per_sm in (1, 2, 4, 8):
                if threads == 1024 and per_sm > 2:
                    continue

                def issue(i, b=sms * per_sm, t=threads):
                    kernel((b,), (t,), (xs[i % 2], n4, out), stream=stream)
                ms = per_call_ms(stream, lambda: [issue(i) for i in range(LOOP)])
                if best is None or ms < best[0]:
                    best = (ms, threads, per_sm, issue)
        ms, threads, per_sm, issue = best
        graph = captured(stream, issue)
        gms = per_call_ms(stream, lambda: graph.launch(stream))
        print(f"{what}: read-only kernel best {ms * 1e3:.2f} us ({threads} threads x {per_sm}/SM)"
              f" = {nbytes / (ms * 1e-3) / copy_bw:.1%} of copy eager; in a graph "
              f"{gms * 1e3:.2f} us = {nbytes / (gms * 1e-3) / copy_bw:.1%}", flush=True)


def ours(copy_bw):
    for dt, name in ((ml_dtypes.bfloat16, "bf16"), (np.float32, "f32")):
        h = PyCudaHandler(dt)
        host = np.random.default_rng(0).standard_normal((64, 128, 32, 32)).astype(dt)
        xs = [h.create_from_numpy(host) for _ in range(2)]
        o = h.allocate((128,))
        stream = cp.cuda.ExternalStream(int(h.stream.handle))
        eager = per_call_ms(stream, lambda: [h.sum_t(xs[i % 2], (0, 2, 3), o)
                                             for i in range(LOOP)])
        graph = h.capture(lambda: [h.sum_t(xs[i % 2], (0, 2, 3), o) for i in range(LOOP)])
        gms = per_call_ms(stream, graph.replay)
        nb = host.nbytes + 128 * host.itemsize
        print(f"ours sum_t {name}: eager {eager * 1e3:.2f} us = {nb / (eager * 1e-3) / copy_bw:.1%}"
              f" of copy; in a graph {gms * 1e3:.2f} us = {nb / (gms * 1e-3) / copy_bw:.1%}",
              flush=True)


def main():
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    stream = cp.cuda.Stream(non_blocking=True)
    big = cp.ones(1 << 25, cp.float32)
    dst = cp.empty_like(big)
    copy_ms = per_call_ms(stream, lambda: [
        dst.data.copy_from_device_async(big.data, big.nbytes, stream) for _ in range(LOOP)])
    copy_bw = 2 * big.nbytes / (copy_ms * 1e-3)
    print(f"copy 128 MB: {copy_bw / 1e12:.3f} TB/s  ({sms} SMs)")
    read_only(stream, copy_bw, sms)
    ours(copy_bw)


if __name__ == "__main__":
    main()
