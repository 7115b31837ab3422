"""cuBLASLt products with epilogues, for the diagnostics that weigh them
against ours (``mlp_gemm_epilogues``: float32; ``half_epilogues``:
bfloat16), through ``nvmath.bindings.cublasLt``.

``Session`` holds what every product of one handler shares: a cuBLASLt
handle, the heuristic's preference and workspace, a timer on the handler's
stream, and the check and timing of a call (``max_err``, ``graphed``,
``timed``).  ``Lt`` is one row-major product with its epilogue, its
algorithm picked by ``search`` among those whose results pass a check.
``run_sections`` runs a script's sections, a failing one reported and
passed over.
"""
import sys
import traceback

import numpy as np
from nvmath.bindings import cublas
from nvmath.bindings import cublasLt as lt

from benchmarks.gpu import EventTimer, interleaved, our_captured

RES = 96               # bytes of one cublasLtMatmulHeuristicResult_t (workspace size at 64)
WS_BYTES = 64 << 20
R_32F = 0              # cudaDataType_t of float, alpha's and beta's
#: cudaDataType_t of the matrices (and a bias) by the handler's format
MATRIX_TYPES = {"float32": 0, "bfloat16": 14}
BIAS_DATA_TYPE = 26    # cublasLtMatmulDescAttributes_t


class Session:
    """cuBLASLt on handler ``h``'s stream: products checked to ``tol``, timed
    ``repeat`` calls a graph, the heuristic asked for ``want`` algorithms."""

    def __init__(self, h, repeat, tol, want):
        self.h, self.repeat, self.tol, self.want = h, repeat, tol, want
        self.handle, self.pref = lt.create(), lt.matmul_preference_create()
        self.ws = h.allocate((WS_BYTES // h.dtype.itemsize,))
        ws = np.array([WS_BYTES], np.uint64)
        lt.matmul_preference_set_attribute(
            self.pref, int(lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES), ws.ctypes.data, 8)
        self.timer = EventTimer("pycuda", h.stream)

    def max_err(self, issue, checks):
        """Run ``issue()`` once; the largest max |got - want| / max |want|
        over ``checks``, pairs of (device array, float64 reference)."""
        issue()
        return max(float(np.abs(self.h.get_numpy_copy(a).astype(np.float64).reshape(w.shape)
                                - w).max() / max(np.abs(w).max(), 1e-30))
                   for a, w in checks)

    def graphed(self, issue):
        """(timer, fn(i)) for ``interleaved``: fn replays ``repeat`` calls of
        ``issue()`` captured once in a graph on the handler's stream."""
        def step(i):
            for _ in range(self.repeat):
                issue()
        return self.timer, our_captured(self.h, step)

    def timed(self, cases, reps):
        """{label: us per call} of ``{label: graphed(...)}``, timed interleaved."""
        ms = interleaved(cases, reps=reps, warmup=2)
        return {k: v["median"] * 1e3 / self.repeat for k, v in ms.items()}


class Lt:
    """Row-major C (M, N) = op(A) @ op(B) (``dot_mm``'s transa, transb) in
    the session handler's format, with a cuBLASLt epilogue, run on its
    stream by calling it.  cuBLASLt sees the column-major C^T = op(B)^T
    op(A)^T, so its "rows of D" are C's columns: a bias or bias gradient has
    N elements (M for BGRADB), BGRAD sums over C's rows, and an aux array
    holds ``aux_ld`` elements (bits for the ReLU mask) per row of C.
    ``pick`` indexes the heuristic's algorithms."""

    def __init__(self, session, a, b, c, transa=False, transb=False, epilogue="DEFAULT",
                 bias=None, aux=None, aux_ld=None):
        self.s = session
        matrix = MATRIX_TYPES[session.h.dtype.name]
        M, n = c.shape
        K = a.shape[0] if transa else a.shape[1]
        self.name, self.pick, self.best = f"{M}x{K}x{n} {epilogue}", 0, None
        self.desc = lt.matmul_desc_create(int(cublas.ComputeType.COMPUTE_32F), R_32F)
        A = lt.MatmulDescAttribute
        attrs = [(int(A.TRANSA), np.int32(transb)), (int(A.TRANSB), np.int32(transa)),
                 (int(A.EPILOGUE), np.uint32(getattr(lt.Epilogue, epilogue)))]
        if bias is not None:
            attrs += [(BIAS_DATA_TYPE, np.int32(matrix)),
                      (int(A.BIAS_POINTER), np.uint64(int(bias.gpudata)))]
        if aux is not None:
            attrs += [(int(A.EPILOGUE_AUX_POINTER), np.uint64(int(aux.gpudata))),
                      (int(A.EPILOGUE_AUX_LD), np.int64(aux_ld))]
        for attr, value in attrs:
            v = np.array([value])
            lt.matmul_desc_set_attribute(self.desc, attr, v.ctypes.data, v.nbytes)
        self.la = lt.matrix_layout_create(matrix, *((K, n, K) if transb else (n, K, n)))
        self.lb = lt.matrix_layout_create(matrix, *((M, K, M) if transa else (K, M, K)))
        self.lc = lt.matrix_layout_create(matrix, n, M, n)
        self.ptrs = int(b.gpudata), int(a.gpudata), int(c.gpudata)
        self.results = np.zeros(RES * session.want, np.uint8)   # the algorithms live here
        count = np.zeros(1, np.int32)
        lt.matmul_algo_get_heuristic(session.handle, self.desc, self.la, self.lb, self.lc,
                                     self.lc, session.pref, session.want,
                                     self.results.ctypes.data, count.ctypes.data)
        self.algos = [i for i in range(int(count[0]))   # those whose workspace fits ours
                      if self.results[i * RES + 64: i * RES + 72].view(np.uint64)[0] <= WS_BYTES]
        self.scal = np.array([1.0, 0.0], np.float32)    # alpha, beta (host pointers)

    def __call__(self):
        pb, pa, pc = self.ptrs
        s = self.s
        lt.matmul(s.handle, self.desc, self.scal.ctypes.data, pb, self.la, pa, self.lb,
                  self.scal.ctypes.data + 4, pc, self.lc, pc, self.lc,
                  self.results.ctypes.data + self.algos[self.pick] * RES, int(s.ws.gpudata),
                  WS_BYTES, s.h.stream.handle)

    def search(self, checks):
        """Time alone (5 replays) each algorithm that passes ``checks``;
        leave ``pick`` and ``best`` at the fastest (``best`` None where none
        passed) and run it once (a chain's next product reads its output).
        Returns whether one passed."""
        found = []
        for i in range(len(self.algos)):
            self.pick = i
            try:
                if self.s.max_err(self, checks) <= self.s.tol:
                    found.append((self.s.timed({"a": self.s.graphed(self)}, reps=5)["a"], i))
            except Exception as e:   # refused at run time: left out
                print(f"   {self.name} algorithm {i}: {type(e).__name__}: {e}")
        self.best = min(found)[1] if found else None
        self.pick = self.best or 0
        if self.algos:
            self()
        print(f"   {self.name}: {len(self.algos)} algorithms, {len(found)} pass; fastest "
              + (f"#{self.best}, {min(found)[0]:.1f} us" if found else "none"), flush=True)
        return self.best is not None


def run_sections(sections):
    """Call each of ``sections`` in turn; one that raises prints its
    traceback and the rest still run (a section is a table of its own)."""
    for section in sections:
        try:
            section()
        except Exception:
            print("section failed:")
            traceback.print_exc()
        sys.stdout.flush()
