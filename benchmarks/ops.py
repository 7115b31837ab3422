"""``python -m benchmarks ops``: PyCudaHandler ops against CuPy and PyTorch.

Sections, all measured in one process on one GPU:

* host overhead per call (median over 10,000 calls) on 1,000 elements and a
  16x16 ``dot_mm``; target <= 0.8x PyTorch;
* bandwidth of elementwise ops on 32M float32 elements against the measured
  device-to-device copy bandwidth (bytes: each input read once, the output
  written once); target >= 85%;
* ``sum_t`` over the benchmark shapes; targets >= 85% of copy (two large
  cases) / 70% (others) and faster than ``torch.sum`` and ``cupy.sum``;
* ``dot_add_mm`` at 1000^3 and 4096^3 against a bare cuBLAS loop, both BLAS
  backends; target >= 95%;
* the m·x+b loop with everything resident against a bare cuBLAS loop; target
  <= 1.05x, NumPy's time beside it.
"""
import argparse
import time

import numpy as np

from benchmarks.common import gpu_name, print_table, result_name, save_results
from benchmarks.gpu import EventTimer, cuda_handler, host_overhead_us, optional_peers

F32 = np.float32
# Device-time rows time LOOP back-to-back calls between two events, so that the
# host's launch latency overlaps device work as it does in a real program,
# for this library and its peers alike.
LOOP = 10


def _ratio(a, b):
    return a / b if a and b else float("nan")


def small_ops(h, rng, n=1000):
    """{name: fn()} of the small ops whose host overhead is measured: on ``n``
    elements, and a 16x16 ``dot_mm``; inputs drawn from ``rng`` (three vectors,
    then three 16x16 matrices)."""
    x, y, z = (h.create_from_numpy(rng.standard_normal(n)) for _ in range(3))
    s = h.allocate((1,))
    a16, b16, c16 = (h.create_from_numpy(rng.standard_normal((16, 16))) for _ in range(3))
    return {
        "axpby": lambda: h.axpby(2.0, x, 0.5, y),
        "add_tt": lambda: h.add_tt(x, y, z),
        "relu": lambda: h.relu(x, z),
        "sum_t": lambda: h.sum_t(x, 0, s),
        "dot_mm 16x16": lambda: h.dot_mm(a16, b16, c16),
    }


def overhead(hs, peers, calls):
    """Host microseconds per call for small ops on every library."""
    h = hs["scikit-cuda"]
    rng = np.random.default_rng(0)
    n = 1000
    ops = small_ops(h, rng, n)
    ours = {k: host_overhead_us(f, calls, sync=h.synchronize_all_streams) for k, f in ops.items()}
    hn = hs.get("nvmath")
    nv = {}
    if hn is not None:
        a, b, c = (hn.create_from_numpy(rng.standard_normal((16, 16))) for _ in range(3))
        nv["dot_mm 16x16"] = host_overhead_us(lambda: hn.dot_mm(a, b, c), calls,
                                              sync=hn.synchronize_all_streams)
    peer = {}
    if "torch" in peers:
        t = peers["torch"]
        tx, ty, tz = (t.randn(n, device="cuda") for _ in range(3))
        ts = t.zeros((), device="cuda")
        ta, tb, tc = (t.randn(16, 16, device="cuda") for _ in range(3))

        def t_axpby():
            ty.mul_(0.5)
            ty.add_(tx, alpha=2.0)
        tops = {"axpby": t_axpby, "add_tt": lambda: t.add(tx, ty, out=tz),
                "relu": lambda: t.clamp_min(tx, 0.0, out=tz),
                "sum_t": lambda: t.sum(tx, 0, out=ts),
                "dot_mm 16x16": lambda: t.mm(ta, tb, out=tc)}
        peer["torch"] = {k: host_overhead_us(f, calls, sync=t.cuda.synchronize)
                         for k, f in tops.items()}
    if "cupy" in peers:
        cp = peers["cupy"]
        axpby_k = cp.ElementwiseKernel("T x, T alpha, T beta", "T y",
                                       "y = alpha * x + beta * y", "sh_axpby")
        cx, cy, cz = (cp.random.standard_normal(n, dtype=F32) for _ in range(3))
        cs = cp.zeros((), F32)
        ca, cb, cc = (cp.random.standard_normal((16, 16), dtype=F32) for _ in range(3))
        cops = {"axpby": lambda: axpby_k(cx, F32(2.0), F32(0.5), cy),
                "add_tt": lambda: cp.add(cx, cy, out=cz),
                "relu": lambda: cp.maximum(cx, F32(0), out=cz),
                "sum_t": lambda: cp.sum(cx, axis=0, out=cs),
                "dot_mm 16x16": lambda: cp.matmul(ca, cb, out=cc)}
        peer["cupy"] = {k: host_overhead_us(f, calls, sync=cp.cuda.Device().synchronize)
                        for k, f in cops.items()}
    rows, out = [], []
    for k in ops:
        tt = peer.get("torch", {}).get(k)
        best = min(ours[k], nv.get(k, ours[k]))
        r = _ratio(best, tt)
        rows.append([k, ours[k], nv.get(k, float("nan")), tt or float("nan"),
                     peer.get("cupy", {}).get(k, float("nan")), r,
                     "yes" if r <= 0.8 else "NO"])
        out.append(dict(op=k, skcuda_us=ours[k], nvmath_us=nv.get(k), torch_us=tt,
                        cupy_us=peer.get("cupy", {}).get(k), ratio_to_torch=r))
    print(f"\nHost overhead per call, median of {calls} calls (us); target <= 0.8x torch")
    print_table(["op", "ours", "ours nvmath", "torch", "cupy", "ours/torch", "<=0.8"], rows)
    return out


def copy_bandwidth(h, n, timer):
    """Device-to-device copy bandwidth in bytes/s (bytes read + written)."""
    import pycuda.driver as drv
    src, dst = h.allocate((n,)), h.allocate((n,))
    h.fill(src, 1.0)
    ms = timer.time(lambda i: drv.memcpy_dtod_async(dst.gpudata, src.gpudata, src.nbytes,
                                                    h.stream), reps=15, inner=LOOP)
    return 2 * src.nbytes / (ms * 1e-3)


def bandwidth(h, peers, n, copy_bw, timer):
    rng = np.random.default_rng(1)
    sets = [[h.create_from_numpy(rng.standard_normal(n).astype(F32)) for _ in range(3)]
            for _ in range(2)]
    cases = {   # op: (handler call, element accesses per element)
        "axpby": (lambda s: h.axpby(2.0, s[0], 0.5, s[1]), 3),
        "add_tt": (lambda s: h.add_tt(s[0], s[1], s[2]), 3),
        "mult_add_tt": (lambda s: h.mult_add_tt(s[0], s[1], s[2]), 4),
        "sigmoid": (lambda s: h.sigmoid(s[0], s[2]), 2),
    }
    peer_bw = {k: {} for k in cases}
    if "torch" in peers:
        t = peers["torch"]
        ts = [[t.randn(n, device="cuda") for _ in range(3)] for _ in range(2)]
        tt = EventTimer("torch", module=t)
        tcalls = {"axpby": lambda s: s[1].mul_(0.5).add_(s[0], alpha=2.0),
                  "add_tt": lambda s: t.add(s[0], s[1], out=s[2]),
                  "mult_add_tt": lambda s: s[2].addcmul_(s[0], s[1]),
                  "sigmoid": lambda s: t.sigmoid(s[0], out=s[2])}
        for k, f in tcalls.items():
            ms = tt.time(lambda i, f=f: f(ts[i % 2]), inner=LOOP)
            peer_bw[k]["torch"] = cases[k][1] * n * 4 / (ms * 1e-3)
    if "cupy" in peers:
        cp = peers["cupy"]
        cs = [[cp.random.standard_normal(n, dtype=F32) for _ in range(3)] for _ in range(2)]
        ct = EventTimer("cupy", module=cp)
        axpby_k = cp.ElementwiseKernel("T x, T a, T b", "T y", "y = a * x + b * y", "sh_axpby")
        muladd_k = cp.ElementwiseKernel("T a, T b", "T c", "c += a * b", "sh_muladd")
        sigm_k = cp.ElementwiseKernel("T x", "T y", "y = 1 / (1 + exp(-x))", "sh_sigmoid")
        ccalls = {"axpby": lambda s: axpby_k(s[0], F32(2), F32(0.5), s[1]),
                  "add_tt": lambda s: cp.add(s[0], s[1], out=s[2]),
                  "mult_add_tt": lambda s: muladd_k(s[0], s[1], s[2]),
                  "sigmoid": lambda s: sigm_k(s[0], s[2])}
        for k, f in ccalls.items():
            ms = ct.time(lambda i, f=f: f(cs[i % 2]), inner=LOOP)
            peer_bw[k]["cupy"] = cases[k][1] * n * 4 / (ms * 1e-3)
    rows, out = [], []
    for k, (f, acc) in cases.items():
        ms = timer.time(lambda i, f=f: f(sets[i % 2]), inner=LOOP)
        bw = acc * n * 4 / (ms * 1e-3)
        frac = bw / copy_bw
        tb, cb = peer_bw[k].get("torch"), peer_bw[k].get("cupy")
        rows.append([k, bw / 1e12, frac, (tb or float("nan")) / 1e12,
                     (cb or float("nan")) / 1e12, "yes" if frac >= 0.85 else "NO"])
        out.append(dict(op=k, n=n, ours_Bps=bw, fraction_of_copy=frac, torch_Bps=tb, cupy_Bps=cb))
    print(f"\nElementwise bandwidth, {n} float32 elements (TB/s), {LOOP} calls back to back; "
          f"copy = {copy_bw/1e12:.3f} TB/s; target >= 85% of copy")
    print_table(["op", "ours", "ours/copy", "torch", "cupy", ">=85%"], rows)
    return out


SUM_CASES = [((8192, 4096), 0, 0.85), ((8192, 4096), 1, 0.85), ((1048576, 16), 0, 0.70),
             ((16, 1048576), 1, 0.70), ((64, 128, 32, 32), 1, 0.70)]


def sums(h, peers, copy_bw, timer, scale=1):
    rng = np.random.default_rng(2)
    rows, out = [], []
    for shape, axis, target in SUM_CASES:
        if scale > 1:
            shape = (shape[0] // scale,) + shape[1:]
        rshape = shape[:axis] + shape[axis + 1:]
        host = rng.standard_normal(shape).astype(F32)
        xs = [h.create_from_numpy(host) for _ in range(2)]
        o = h.allocate(rshape)
        nbytes = host.nbytes + int(np.prod(rshape)) * 4
        ms = timer.time(lambda i: h.sum_t(xs[i % 2], axis, o), inner=LOOP)
        bw = nbytes / (ms * 1e-3)
        tb = cb = None
        if "torch" in peers:
            t = peers["torch"]
            txs = [t.from_numpy(host).cuda() for _ in range(2)]
            to = t.empty(rshape, device="cuda")
            tms = EventTimer("torch", module=t).time(lambda i: t.sum(txs[i % 2], axis, out=to),
                                                     inner=LOOP)
            tb = nbytes / (tms * 1e-3)
        if "cupy" in peers:
            cp = peers["cupy"]
            cxs = [cp.asarray(host) for _ in range(2)]
            co = cp.empty(rshape, F32)
            cms = EventTimer("cupy", module=cp).time(
                lambda i: cp.sum(cxs[i % 2], axis=axis, out=co), inner=LOOP)
            cb = nbytes / (cms * 1e-3)
        frac = bw / copy_bw
        ok = frac >= target and all(bw > p for p in (tb, cb) if p)
        rows.append([f"{shape} axis {axis}", bw / 1e12, frac, target,
                     (tb or float("nan")) / 1e12, (cb or float("nan")) / 1e12,
                     "yes" if ok else "NO"])
        out.append(dict(shape=list(shape), axis=axis, ours_Bps=bw, fraction_of_copy=frac,
                        target=target, torch_Bps=tb, cupy_Bps=cb))
    print("\nsum_t bandwidth (TB/s); target: >= target x copy and faster than torch and cupy")
    print_table(["case", "ours", "ours/copy", "target", "torch", "cupy", "ok"], rows)
    return out


def gemms(hs, peers, sizes):
    rows, out = [], []
    for size in sizes:
        flops = 2.0 * size ** 3
        tms = None   # torch does not depend on the backend: timed once per size
        if "torch" in peers:
            t = peers["torch"]
            ta, tb, tc = (t.randn(size, size, device="cuda") for _ in range(3))
            tms = EventTimer("torch", module=t).time(lambda i: tc.addmm_(ta, tb),
                                                     reps=10, inner=10)
        for backend, h in hs.items():
            rng = np.random.default_rng(3)
            a, b, c = (h.create_from_numpy(rng.standard_normal((size, size))) for _ in range(3))
            timer = EventTimer("pycuda", h.stream)
            gemm = h.gemm_raw()
            ms = timer.time(lambda i: h.dot_add_mm(a, b, c), reps=10, inner=10)
            bare = timer.time(lambda i: gemm(0, 0, size, size, size, 1.0, b.gpudata, size,
                                             a.gpudata, size, 1.0, c.gpudata, size),
                              reps=10, inner=10)
            frac = bare / ms
            rows.append([f"{size}^3", backend, flops / ms / 1e9, flops / bare / 1e9,
                         frac, flops / tms / 1e9 if tms else float("nan"),
                         "yes" if frac >= 0.95 else "NO"])
            out.append(dict(size=size, blas=backend, ours_ms=ms, bare_ms=bare, torch_ms=tms,
                            fraction_of_bare=frac))
    print("\ndot_add_mm float32 (TFLOP/s); target >= 95% of the bare cuBLAS loop")
    print_table(["size", "blas", "ours", "bare cuBLAS", "ours/bare", "torch addmm_", ">=95%"],
                rows)
    return out


def mxb(h, n, iters):
    import pycuda.driver as drv

    from benchmarks.mxb import mxb_loop, numpy_loop
    rng = np.random.default_rng(4)
    m_h, x_h = rng.standard_normal((n, n)).astype(F32), rng.standard_normal((n, n)).astype(F32)
    b_h = rng.standard_normal((n, 1)).astype(F32)
    m, x, b = h.create_from_numpy(m_h), h.create_from_numpy(x_h), h.create_from_numpy(b_h)
    y = h.allocate((n, n))
    bfull = h.create_from_numpy(np.repeat(b_h, n, axis=1))
    gemm = h.gemm_raw()
    timer = EventTimer("pycuda", h.stream)
    ours = timer.time(lambda i: mxb_loop(h, m, x, b, y, iters), reps=3, warmup=1) / 1e3

    def bare(i):
        for _ in range(iters):   # y = b (broadcast copy), then y += m x
            drv.memcpy_dtod_async(y.gpudata, bfull.gpudata, y.nbytes, h.stream)
            gemm(0, 0, n, n, n, 1.0, x.gpudata, n, m.gpudata, n, 1.0, y.gpudata, n)
    bare_s = timer.time(bare, reps=3, warmup=1) / 1e3
    ym = np.empty((n, n), F32)
    t0 = time.perf_counter()
    numpy_loop(m_h, x_h, b_h, ym, iters)
    np_s = time.perf_counter() - t0
    r = ours / bare_s
    print(f"\nm·x+b loop, {n}x{n} float32, {iters} iterations, all resident (s); "
          f"target <= 1.05x bare")
    print_table(["PyCudaHandler", "bare cuBLAS", "ratio", "NumPy (CPU)", "<=1.05"],
                [[ours, bare_s, r, np_s, "yes" if r <= 1.05 else "NO"]])
    return dict(n=n, iters=iters, ours_s=ours, bare_s=bare_s, ratio=r, numpy_s=np_s)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks ops", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, few calls")
    parser.add_argument("--save", action="store_true",
                        help="write benchmarks/results/ops-<gpu>.json")
    args = parser.parse_args(argv)
    h = cuda_handler("ops", F32, blas="scikit-cuda")
    if h is None:
        return 0
    from handlers import PyCudaHandler
    hs = {"scikit-cuda": h}
    try:
        hs["nvmath"] = PyCudaHandler(F32, blas="nvmath")
    except ImportError as e:
        print(f"ops: nvmath backend skipped: {e}")
    peers = optional_peers()
    gpu = gpu_name()
    print(f"GPU: {gpu}; peers: {', '.join(peers) or 'none'}")
    n = (1 << 22) if args.quick else (1 << 25)
    timer = EventTimer("pycuda", h.stream)
    results = {"gpu": gpu}
    results["overhead"] = overhead(hs, peers, 1000 if args.quick else 10000)
    copy_bw = copy_bandwidth(h, n, timer)
    results["copy_Bps"] = copy_bw
    results["bandwidth"] = bandwidth(h, peers, n, copy_bw, timer)
    results["sum_t"] = sums(h, peers, copy_bw, timer, scale=8 if args.quick else 1)
    results["gemm"] = gemms(hs, peers, [256, 1000] if args.quick else [1000, 4096])
    results["mxb"] = mxb(h, 1000, 50 if args.quick else 500)
    if args.save:
        print("saved", save_results(result_name("ops", gpu), results))
    return 0
