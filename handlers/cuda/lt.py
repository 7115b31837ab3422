"""``dot_bias_act`` on cuBLASLt: a product with its bias and activation in
the GEMM's epilogue, one call where the product alone and a fused op after
it take two passes over the output.

``LtProducts`` opens cuBLASLt (``libcublasLt``, the library beside cuBLAS)
through ctypes, makes its descriptors and asks its heuristic for an
algorithm once per combination of shapes and activation (:meth:`plan`); each
call is then one C call (``_launch.lt_matmul``), which sets the bias pointer
and runs ``cublasLtMatmul`` without releasing the GIL, so two threads never
interleave on one descriptor.  The descriptors are freed with the handler.

Where cuBLASLt gives no algorithm (a format or shape its epilogues do not
take, a pointer not 16-byte aligned, an empty product, or no cuBLASLt at
all), or its epilogue misses the format's accuracy (float64's GELU: see
``_INEXACT``), :meth:`plan` returns None and the handler runs the product
and then the epilogue as a fused op (``Handler._dot_bias_act``).

The row-major product out (m, n) = a (m, k) @ b (k, n) is the column-major
out^T (n x m) = b^T (n x k) @ a^T (k x m) on the same memory, so cuBLASLt's
A is b and its B is a, neither transposed, and its bias (one value per row
of its D) is our row of n.  Measured before this path was taken (H200,
``benchmarks/results/diagnostics/lt_epilogues``): the forward epilogues cost
0.4-2.5 us over the plain product, less than a separate pass; the backward
ones (ReLU's derivative from the forward's mask and the bias gradient)
cost 6.7 us over a 1024x1024 product, more than our fused backward op, so
the layers' backward stays a fused op and two products.
"""
import ctypes
import ctypes.util

from . import kernel_loader

# cublasLtEpilogue_t of the bias followed by each activation
_EPILOGUE = {None: 4, "relu": 6, "gelu_tanh": 36}          # BIAS, RELU_BIAS, GELU_BIAS
# cublasLtMatmulDescAttributes_t
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_DATA_TYPE = 3, 4, 7, 26
# cublasLtMatmulPreferenceAttributes_t
_PREF_MAX_WORKSPACE, _PREF_ALIGN = 1, (5, 6, 7, 8)          # A, B, C, D minimum alignment
#: bytes every pointer of a cuBLASLt product must be aligned to (the plans
#: ask the heuristic for algorithms that need no more)
ALIGN = 16
# format -> (cudaDataType_t of the matrices and bias, cublasComputeType_t,
# cudaDataType_t of alpha and beta); TF32 is float32's compute 77
_TYPES = {"f32": (0, 68, 0), "f64": (1, 70, 1), "bf16": (14, 68, 0), "f16": (2, 68, 0)}
_TF32_COMPUTE = 77
# (act, matrix type) whose epilogue misses the format's accuracy: float64's
# GELU came out with relative errors near 1e-9 on an H200 (CUDA 13), a
# float32-grade tanh, where the contract wants float64's
_INEXACT = {("gelu_tanh", 1)}
_NAMES = ("libcublasLt.so", "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11")


def _open():
    """The cuBLASLt library, or None where none loads."""
    found = ctypes.util.find_library("cublasLt")
    for name in ((found,) if found else ()) + _NAMES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


class _Heuristic(ctypes.Structure):
    # cublasLtMatmulHeuristicResult_t
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t),
                ("state", ctypes.c_int), ("waves", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


class LtPlan:
    """One combination's descriptors and algorithm (addresses for the C call)."""

    __slots__ = ("_keep", "a", "algo", "b", "d", "desc")

    def __init__(self, desc, a, b, d, heuristic):
        self.desc, self.a, self.b, self.d = desc, a, b, d
        self._keep = heuristic   # owns the algorithm's bytes
        self.algo = ctypes.addressof(heuristic.algo)


class LtProducts:
    """cuBLASLt products with an epilogue for one handler format."""

    def __init__(self, short_name, tf32, workspace_bytes):
        self._lib = _open()
        self._handle = ctypes.c_void_p()
        self._plans = {}        # (m, n, k, act) -> LtPlan or None
        self._objects = []      # (destroy function, handle) to free on close
        types = _TYPES.get(short_name)
        self._types = types and ((types[0], _TF32_COMPUTE, types[2]) if tf32 else types)
        self._workspace_bytes = workspace_bytes
        if self._lib is None or self._types is None or \
                self._lib.cublasLtCreate(ctypes.byref(self._handle)):
            self._lib = None
            return
        # what every call passes, bound once: the C entry, the two functions
        # it calls, and whether alpha and beta are doubles (float64)
        self._call = kernel_loader.extension().lt_matmul
        self._matmul = ctypes.cast(self._lib.cublasLtMatmul, ctypes.c_void_p).value
        self._set_attribute = ctypes.cast(self._lib.cublasLtMatmulDescSetAttribute,
                                          ctypes.c_void_p).value
        self._f64 = int(self._types[2] == 1)

    @property
    def available(self):
        """Whether cuBLASLt loaded for this format."""
        return self._lib is not None

    def plan(self, m, n, k, act):
        """The :class:`LtPlan` of out (m, n) = act(a (m, k) @ b (k, n) + bias),
        made once; None where cuBLASLt offers no algorithm for it."""
        key = (m, n, k, act)
        if key not in self._plans:
            self._plans[key] = self._make(m, n, k, act) if self._lib and m and n and k \
                and (act, self._types[0]) not in _INEXACT else None
        return self._plans[key]

    def _new(self, create, destroy, *args):
        handle = ctypes.c_void_p()
        if getattr(self._lib, create)(ctypes.byref(handle), *args):
            raise kernel_loader.CudaError(f"{create} failed")
        self._objects.append((getattr(self._lib, destroy), handle))
        return handle

    def _set(self, fn, obj, attr, value, ctype):
        v = ctype(value)
        if fn(obj, attr, ctypes.byref(v), ctypes.c_size_t(ctypes.sizeof(v))):
            raise kernel_loader.CudaError(f"cuBLASLt attribute {attr} refused")

    def _make(self, m, n, k, act):
        lib, (dtype, compute, scale) = self._lib, self._types
        u64 = ctypes.c_uint64
        desc = self._new("cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy",
                         ctypes.c_int(compute), ctypes.c_int(scale))
        set_desc = lib.cublasLtMatmulDescSetAttribute
        self._set(set_desc, desc, _DESC_TRANSA, 0, ctypes.c_int32)
        self._set(set_desc, desc, _DESC_TRANSB, 0, ctypes.c_int32)
        self._set(set_desc, desc, _DESC_EPILOGUE, _EPILOGUE[act], ctypes.c_uint32)
        self._set(set_desc, desc, _DESC_BIAS_DATA_TYPE, dtype, ctypes.c_int32)

        def layout(rows, cols):
            return self._new("cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy",
                             ctypes.c_int(dtype), u64(rows), u64(cols), ctypes.c_int64(rows))
        lt_a, lt_b, lt_d = layout(n, k), layout(k, m), layout(n, m)
        pref = self._new("cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy")
        set_pref = lib.cublasLtMatmulPreferenceSetAttribute
        self._set(set_pref, pref, _PREF_MAX_WORKSPACE, self._workspace_bytes, u64)
        for attr in _PREF_ALIGN:
            self._set(set_pref, pref, attr, ALIGN, ctypes.c_uint32)
        result, count = _Heuristic(), ctypes.c_int(0)
        status = lib.cublasLtMatmulAlgoGetHeuristic(
            self._handle, desc, lt_a, lt_b, lt_d, lt_d, pref, 1, ctypes.byref(result),
            ctypes.byref(count))
        if status or count.value < 1 or result.state:
            return None
        return LtPlan(desc.value, lt_a.value, lt_b.value, lt_d.value, result)

    def run(self, plan, stream, a, b, bias, out, workspace):
        """Issue ``plan`` on ``stream`` for device pointers a, b, bias, out."""
        status = self._call(
            self._matmul, self._set_attribute, self._handle.value, plan.desc, bias, b, plan.a,
            a, plan.b, out, plan.d, plan.algo, workspace, self._workspace_bytes, stream,
            self._f64)
        if status:
            raise kernel_loader.CudaError(f"cublasLtMatmul failed with status {status}")

    def close(self):
        """Free the descriptors and the cuBLASLt handle."""
        while self._objects:
            destroy, handle = self._objects.pop()
            destroy(handle)
        if self._lib is not None and self._handle:
            self._lib.cublasLtDestroy(self._handle)
            self._handle = ctypes.c_void_p()
        self._plans.clear()


def aligned(*pointers):
    """Whether every device pointer is :data:`ALIGN`-byte aligned."""
    return not any(int(p) % ALIGN for p in pointers)
