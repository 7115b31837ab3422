"""Float32 GEMMs (TF32 off) at the dp suite's LSTM per-step shapes, 256 rows (one rank's
half of the batch) against 512 (the whole batch): our ``dot_mm`` (cuBLAS's own choice) beside
every algorithm cuBLASLt's heuristic offers for the shape (up to 64 asked, 64 MiB workspace),
each timed (20 calls between events, median of 15).

A diagnostic (run by hand from the project root on a GPU machine with nvmath-python:
``python benchmarks/results/diagnostics/gemm_algos.py``); its output on an H200, at commit
e150977, is ``gemm_algos-NVIDIA-H200.log``.  Finding: at 256 rows no algorithm beats cuBLAS's
choice (40.0 against 39.9 TFLOP/s forward; 36.0 against 36.5 for the backward product); at 512
rows one does (45.4 against 42.5).  Choosing the algorithm by timing would speed the one-GPU
step more than each rank's, so it cannot lift the LSTM's two-GPU scaling.

Other shapes from the command line, each ``M:K:N`` or ``M:K:N:t`` (B transposed), with
``torch.matmul`` timed beside them where PyTorch is installed; e.g. the train suite's LSTM
(batch 64, hidden 512) per-step products::

    python benchmarks/results/diagnostics/gemm_algos.py 64:512:2048 64:2048:512:t
"""
import sys

import numpy as np
from nvmath.bindings import cublas
from nvmath.bindings import cublasLt as lt

from benchmarks.gpu import EventTimer
from handlers.cuda.handler import PyCudaHandler

h = PyCudaHandler(np.float32)
handle = lt.create()
sh = h.stream.handle
ws_bytes = 64 << 20
ws = h.allocate((ws_bytes // 4,))
RES = 96
TIMER = EventTimer("pycuda", h.stream)


def events_us(issue):
    """Median microseconds per call of ``issue()``: 20 calls between events, 15 samples."""
    return TIMER.time(lambda i: issue(), reps=15, inner=20) * 1e3


def lt_search(M, K, N, transb, a, b, c, want=64):
    """Row-major C(MxN) = A(MxK) @ op(B); cuBLASLt in column-major: C^T = op(B)^T A^T."""
    desc = lt.matmul_desc_create(int(cublas.ComputeType.COMPUTE_32F), 0)
    ta = np.array([1 if transb else 0], np.int32)
    tb = np.zeros(1, np.int32)
    lt.matmul_desc_set_attribute(desc, int(lt.MatmulDescAttribute.TRANSA), ta.ctypes.data, 4)
    lt.matmul_desc_set_attribute(desc, int(lt.MatmulDescAttribute.TRANSB), tb.ctypes.data, 4)
    la = lt.matrix_layout_create(0, K, N, K) if transb else lt.matrix_layout_create(0, N, K, N)
    lb = lt.matrix_layout_create(0, K, M, K)
    lc = lt.matrix_layout_create(0, N, M, N)
    pref = lt.matmul_preference_create()
    wsz = np.array([ws_bytes], np.uint64)
    lt.matmul_preference_set_attribute(
        pref, int(lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES), wsz.ctypes.data, 8)
    results = np.zeros(RES * want, np.uint8)
    count = np.zeros(1, np.int32)
    lt.matmul_algo_get_heuristic(handle, desc, la, lb, lc, lc, pref, want,
                                 results.ctypes.data, count.ctypes.data)
    scal = np.array([1.0, 0.0], np.float32)
    out = []
    for i in range(int(count[0])):
        base = results.ctypes.data + i * RES
        need = int(results[i * RES + 64: i * RES + 72].view(np.uint64)[0])
        if need > ws_bytes:
            continue
        def run(base=base):
            lt.matmul(handle, desc, scal.ctypes.data, int(b.gpudata), la, int(a.gpudata), lb,
                      scal.ctypes.data + 4, int(c.gpudata), lc, int(c.gpudata), lc, base,
                      int(ws.gpudata), ws_bytes, sh)
        try:
            us = events_us(run)
        except Exception as e:
            print("   algo", i, "failed", e)
            continue
        out.append((us, i, need))
    return sorted(out)


def _shapes(args):
    """[(M, K, N, transb)] from ``M:K:N[:t]`` arguments, or the dp suite's."""
    if not args:
        return [(m, k, n, t) for m in (256, 512)
                for k, n, t in ((1024, 4096, False), (4096, 1024, True))]
    out = []
    for a in args:
        parts = a.split(":")
        out.append((int(parts[0]), int(parts[1]), int(parts[2]), parts[3:] == ["t"]))
    return out


try:
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
except ImportError:
    torch = None

for M, K, N, transb in _shapes(sys.argv[1:]):
    rng = np.random.default_rng(0)
    ha = rng.standard_normal((M, K)).astype(np.float32)
    hb = rng.standard_normal((N, K) if transb else (K, N)).astype(np.float32)
    a, b = h.create_from_numpy(ha), h.create_from_numpy(hb)
    c = h.allocate((M, N))
    flop = 2 * M * K * N
    ours = events_us(lambda: h.dot_mm(a, b, c, transb=transb))
    ref = ha.astype(np.float64) @ (hb.T if transb else hb).astype(np.float64)
    found = lt_search(M, K, N, transb, a, b, c)
    best = found[0] if found else None
    print(f"M={M} K={K} N={N} transb={transb}: ours {ours:.1f} us {flop/ours/1e6:.1f} TF/s;"
          f" cuBLASLt {len(found)} algos, best {best[0]:.1f} us {flop/best[0]/1e6:.1f} TF/s "
          f"(#{best[1]}, ws {best[2]}); heuristic #0 {[f[0] for f in found if f[1]==0]}",
          flush=True)
    print("   top5:", [(round(u, 1), i) for u, i, _ in found[:5]], flush=True)
    if torch is not None:
        ta, tb = torch.from_numpy(ha).cuda(), torch.from_numpy(hb).cuda()
        tt = EventTimer("torch", module=torch)
        us = tt.measure(lambda i: torch.matmul(ta, tb.T if transb else tb), reps=15,
                        inner=20)["median"] * 1e3
        print(f"   torch.matmul {us:.1f} us {flop / us / 1e6:.1f} TF/s", flush=True)
