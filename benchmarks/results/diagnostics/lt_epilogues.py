"""What cuBLASLt's epilogues would save the MLP step (issue 42, item 1).

The train suite on an H200 (2026-11-27, commit b9216d0): the MLP step
(784-1024-1024-10, batch 256, float32) captured at 0.171 ms against
torch.compile graphed's 0.166; its 8 gemms replayed alone 0.114 ms, its 6
elementwise ops 0.036 ms and its bias sums 0.008 ms.  cuBLASLt can add the
bias and apply ReLU in the forward product (``RELU_AUX_BIAS``, keeping a
bitmask of the positive outputs), and in the backward product of the layer
above apply ReLU's derivative from that mask and reduce the bias gradient
(``DRELU_BGRAD``).  This times, through ``nvmath.bindings.cublasLt`` on
torch's memory and stream (TF32 off: ``CUBLAS_COMPUTE_32F``), each of the
MLP's products plain and with its epilogue, beside the plain product
followed by torch's bias and ReLU (two kernels, about what our step runs:
the product, then one fused op), each result checked against float64
NumPy.  Each product, plain or with its epilogue, runs on the fastest of
the heuristic's first ALGOS algorithms.  Run on the GPU machine (torch and nvmath-python there)::

    python benchmarks/results/diagnostics/lt_epilogues.py
"""
import statistics

import numpy as np

M, SIZES = 256, [784, 1024, 1024, 10]   # batch, the MLP's widths
REPS, CALLS = 7, 200
ALGOS = 8   # the heuristic's first algorithms, each timed for the epilogues
COMPUTE_32F, R_32F = 68, 0                  # cublasComputeType_t, cudaDataType_t
OP_N, OP_T = 0, 1


class Lt:
    """One cuBLASLt handle, a workspace, and column-major products on it."""

    def __init__(self, torch, lt):
        self.torch, self.lt = torch, lt
        self.handle = lt.create()
        self.ws = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
        self.alpha = np.ones(1, np.float32)
        self.beta = np.zeros(1, np.float32)

    def _set(self, desc, attr, value, dtype):
        v = np.array(value, dtype=dtype)
        self.lt.matmul_desc_set_attribute(desc, attr, v.ctypes.data, v.nbytes)

    def plan(self, m, n, k, transa, lda, ldb, epilogue="DEFAULT", bias=None, aux=None,
             aux_ld=0, choice=0):
        """A callable running D (m x n, ld m) = op(A) (m x k) @ B (k x n) with
        ``epilogue`` (a ``cublasLt.Epilogue`` name) on pointers (a, b, d), by
        the heuristic's ``choice``-th algorithm (IndexError past the last of
        its first ALGOS)."""
        lt = self.lt
        A = lt.MatmulDescAttribute
        desc = lt.matmul_desc_create(COMPUTE_32F, R_32F)
        self._set(desc, A.TRANSA, OP_T if transa else OP_N, np.int32)
        self._set(desc, A.TRANSB, OP_N, np.int32)
        self._set(desc, A.EPILOGUE, int(lt.Epilogue[epilogue]), np.uint32)
        if bias is not None:
            self._set(desc, A.BIAS_POINTER, bias.data_ptr(), np.int64)
        if aux is not None:
            self._set(desc, A.EPILOGUE_AUX_POINTER, aux.data_ptr(), np.int64)
            self._set(desc, A.EPILOGUE_AUX_LD, aux_ld, np.int64)
        a_rows, a_cols = (k, m) if transa else (m, k)
        la = lt.matrix_layout_create(R_32F, a_rows, a_cols, lda)
        lb = lt.matrix_layout_create(R_32F, k, n, ldb)
        ld = lt.matrix_layout_create(R_32F, m, n, m)
        pref = lt.matmul_preference_create()
        size = np.array(self.ws.numel(), np.uint64)
        lt.matmul_preference_set_attribute(pref, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES,
                                           size.ctypes.data, size.nbytes)
        found = lt.MatmulHeuristicResult(ALGOS)
        count = np.zeros(1, np.int32)
        lt.matmul_algo_get_heuristic(self.handle, desc, la, lb, ld, ld, pref, ALGOS, found.ptr,
                                     count.ctypes.data)
        if not count[0]:
            raise RuntimeError(f"no cuBLASLt algorithm for {epilogue} {m}x{n}x{k}")
        if choice >= count[0]:
            raise IndexError(choice)
        # each result's first member is its algorithm
        algo = found.ptr + choice * lt.matmul_heuristic_result_dtype.itemsize
        torch = self.torch

        def run(a, b, d, keep=(found, bias, aux)):   # keep: alive while run is
            lt.matmul(self.handle, desc, self.alpha.ctypes.data, a.data_ptr(), la, b.data_ptr(),
                      lb, self.beta.ctypes.data, d.data_ptr(), ld, d.data_ptr(), ld, algo,
                      self.ws.data_ptr(), self.ws.numel(),
                      torch.cuda.current_stream().cuda_stream)
        return run


def _time(torch, fn):
    """Device time of one call of ``fn``: CALLS calls captured in a CUDA
    graph (the host's time per call, 10-20 us through the bindings, would
    hide the products' own), the graph replayed REPS times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    samples = []
    for _ in range(REPS + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / CALLS)
    return statistics.median(samples[1:])


def _best(torch, make, call):
    """(us, run) of the fastest of the heuristic's algorithms: ``make(c)``
    plans with the c-th, ``call(run)`` runs one."""
    best = None
    for c in range(ALGOS):
        try:
            run = make(c)
        except (IndexError, RuntimeError):
            break
        us = _time(torch, lambda: call(run))
        if best is None or us < best[0]:
            best = us, run
    return best


def _check(got, want):
    got = got.double().cpu().numpy()
    err = float(np.max(np.abs(got - want)) / max(1e-30, float(np.max(np.abs(want)))))
    return f"{err:.1e} {'ok' if err < 1e-5 else 'WRONG'}"


def main():
    try:
        import torch
        from nvmath.bindings import cublasLt as lt
    except ImportError as e:
        print(f"lt_epilogues: skipped, this tool needs torch and nvmath-python: {e}")
        return
    if not torch.cuda.is_available():
        print("lt_epilogues: skipped, no GPU")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    L = Lt(torch, lt)
    rng = np.random.default_rng(42)
    total = {"plain": 0.0, "epilogue": 0.0, "plain + torch": 0.0}
    print(f"cuBLASLt {lt.get_version()}; us per call, from a graph of {CALLS} calls, median "
          f"of {REPS} replays; check: max |error| / max |reference| against float64")
    x = rng.standard_normal((M, SIZES[0])).astype(np.float32)
    below = None   # the layer below's (aux mask, its ld), once it ran with RELU_AUX_BIAS
    for i, (k, n) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        relu = i < len(SIZES) - 2
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        tx, tw, tb = (torch.from_numpy(a).cuda() for a in (x, w, b))
        y = torch.empty((M, n), device="cuda")
        z64 = x.astype(np.float64) @ w + b
        want = np.maximum(z64, 0) if relu else z64
        # row-major Y (M x n) = X W + b is column-major Y^T (n x M) = W^T X^T
        us_plain, plain = _best(torch, lambda c: L.plan(n, M, k, False, n, k, choice=c),
                                lambda run: run(tw, tx, y))
        aux_ld = -(-n // 128) * 128
        aux = torch.empty(aux_ld * M // 8, dtype=torch.uint8, device="cuda")

        def then_torch():
            plain(tw, tx, y)
            y.add_(tb)
            if relu:
                torch.relu_(y)
        us_torch = _time(torch, then_torch)
        then_torch()
        check_torch = _check(y, want)
        us_fused, fused = _best(torch, lambda c: L.plan(
            n, M, k, False, n, k, "RELU_AUX_BIAS" if relu else "BIAS", tb,
            aux if relu else None, aux_ld, c), lambda run: run(tw, tx, y))
        fused(tw, tx, y)
        check_fused = _check(y, want)
        name = f"forward {M}x{k} @ {k}x{n} + bias{', ReLU' if relu else ''}"
        print(f"{name:38s} plain {us_plain:7.2f}  epilogue {us_fused:7.2f} ({check_fused})  "
              f"plain + torch {us_torch:7.2f} ({check_torch})")
        for key, us in (("plain", us_plain), ("epilogue", us_fused), ("plain + torch", us_torch)):
            total[key] += us
        if below is not None:
            # the backward product into the layer below, dX = G W^T, times
            # ReLU's derivative there (x > 0: x is that layer's output) and
            # its bias gradient, the sum of that over the rows
            g = rng.standard_normal((M, n)).astype(np.float32)
            tg = torch.from_numpy(g).cuda()
            dx = torch.empty((M, k), device="cuda")
            db = torch.empty(k, device="cuda")
            us_plain, dgrad = _best(torch, lambda c: L.plan(k, M, n, True, n, n, choice=c),
                                    lambda run: run(tw, tg, dx))
            mask = (tx > 0).float()

            def dgrad_torch():
                dgrad(tw, tg, dx)
                dx.mul_(mask)
                torch.sum(dx, 0, out=db)
            us_torch = _time(torch, dgrad_torch)
            us_fused, fused_back = _best(torch, lambda c: L.plan(
                k, M, n, True, n, n, "DRELU_BGRAD", db, *below, choice=c),
                lambda run: run(tw, tg, dx)) or (float("nan"), dgrad)
            fused_back(tw, tg, dx)
            dx64 = (g.astype(np.float64) @ w.T.astype(np.float64)) * (x > 0)
            check = f"{_check(dx, dx64)}, bias grad {_check(db, dx64.sum(axis=0))}"
            name = f"backward {M}x{n} @ {n}x{k} + ReLU', bias grad"
            print(f"{name:38s} plain {us_plain:7.2f}  epilogue {us_fused:7.2f} ({check})  "
                  f"plain + torch {us_torch:7.2f}")
            for key, us in (("plain", us_plain), ("epilogue", us_fused),
                            ("plain + torch", us_torch)):
                total[key] += us
        if relu:   # this layer's output, and the mask of it, feed the next
            fused(tw, tx, y)
            below = (aux, aux_ld)
            x = y.cpu().numpy()
    print("the products above, summed (us): " + ", ".join(f"{k} {v:.1f}"
                                                          for k, v in total.items()))


if __name__ == "__main__":
    main()
