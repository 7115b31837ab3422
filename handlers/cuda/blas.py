"""A small cuBLAS adapter: one GEMM call, two backends.

``make_gemm(backend, dtype, stream)`` returns a callable
``gemm(transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)`` in
cuBLAS's column-major convention, bound to its own cuBLAS handle whose stream
is set once, at creation; so a handle per stream never needs re-binding.
``gemm.batched(transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb,
strideB, beta, C, ldc, strideC, batch)`` is the strided-batched form
(``cublas[SD]gemmStridedBatched``, ``cublasGemmStridedBatchedEx``): ``batch``
products, matrix i of each operand ``stride`` elements after matrix i - 1
(stride 0: one matrix shared by the whole batch).
``gemm.set_workspace(address, nbytes)`` gives the handle scratch memory of
ours (after the stream is set: setting a stream resets the workspace), so
cuBLAS allocates none of its own, which a graph capture could not record.
Scalars are passed in host pointer mode.  ``gemm.handle`` is the cuBLAS
handle, ``gemm.c_symbol`` the address of the GEMM it calls, for the C path of
``handlers.cuda.one_call`` (0 where not known), and ``gemm.kind`` how that
path calls it (:data:`KINDS`).

The half formats go through ``cublasGemmEx`` (and its strided-batched form)
with float32 compute (``CUBLAS_COMPUTE_32F``): the products run on tensor
cores, accumulate in float32 and round into the output's format; alpha and
beta are float32.  ``out_f32=True`` (half formats only) writes a float32 C
instead, for callers that add the product to something themselves: with
beta = 1 and a half C, cuBLAS was seen to round twice.  Backends:

* ``"scikit-cuda"``: ``skcuda.cublas`` (only that module: ``skcuda.misc`` and
  ``skcuda.linalg`` fail under NumPy 2).  We call its loaded ``cublas*gemm_v2``
  symbol directly, through the extension (``handlers.cuda._launch.gemm``), to skip
  the per-call wrapper work, and its ``cublasSetWorkspace_v2`` the same way
  (``_launch.blas_set_workspace``).
* ``"nvmath"``: ``nvmath.bindings.cublas`` from nvmath-python.

A failed cuBLAS call raises ``kernel_loader.CudaError`` with the status name,
whichever the backend.
"""
import ctypes
import warnings

import numpy as np

from .. import dtypes
from . import kernel_loader

BACKENDS = ("scikit-cuda", "nvmath")
# The C side owns the numbers both sides use (GEMM kinds: _launch.h; cuBLAS's
# types: _launch.c); they are read from the extension, never copied here.
_abi = kernel_loader.extension()
#: The GEMM kind of each format (GEMM_FLOAT... in ``_launch.h``).
KINDS = {"f32": _abi.GEMM_FLOAT, "f64": _abi.GEMM_DOUBLE, "bf16": _abi.GEMM_BF16,
         "f16": _abi.GEMM_F16}
#: The kind of a half kind's inputs with a float32 output: the C path's
#: form of ``out_f32``
_F32_KIND = {_abi.GEMM_BF16: _abi.GEMM_BF16_TO_F32, _abi.GEMM_F16: _abi.GEMM_F16_TO_F32}
#: cudaDataType_t of the half kinds; cublasComputeType_t CUBLAS_COMPUTE_32F;
#: cublasGemmAlgo_t CUBLAS_GEMM_DEFAULT.
_HALF_TYPE = {_abi.GEMM_BF16: _abi.CUDA_R_16BF, _abi.GEMM_F16: _abi.CUDA_R_16F}
_COMPUTE_32F, _GEMM_DEFAULT = _abi.CUBLAS_COMPUTE_32F, _abi.CUBLAS_GEMM_DEFAULT
#: cuBLAS's entry points per kind: plain, strided-batched.
_ENTRY = {_abi.GEMM_FLOAT: ("cublasSgemm_v2", "cublasSgemmStridedBatched"),
          _abi.GEMM_DOUBLE: ("cublasDgemm_v2", "cublasDgemmStridedBatched"),
          _abi.GEMM_BF16: ("cublasGemmEx", "cublasGemmStridedBatchedEx"),
          _abi.GEMM_F16: ("cublasGemmEx", "cublasGemmStridedBatchedEx")}


def _import_skcuda_cublas():
    # scikit-cuda prints SyntaxWarnings and a pkg_resources deprecation warning
    # on import; they say nothing about our use, so keep them quiet.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import skcuda.cublas as cublas
        except ImportError as e:
            raise ImportError(f"blas='scikit-cuda' needs scikit-cuda and setuptools<81 "
                              f"(pip install 'streamhandlers[gpu]'): {e}") from e
    return cublas


class _SkcudaGemm:
    def __init__(self, dtype, stream):
        cublas = self._cublas = _import_skcuda_cublas()
        self.handle = cublas.cublasCreate()
        cublas.cublasSetStream(self.handle, stream.handle)
        lib = cublas._libcublas
        self.kind = KINDS[dtypes.short_name(dtype)]
        self._kind_f32 = _F32_KIND.get(self.kind)   # out_f32 (the halves only)
        # scikit-cuda may not wrap the strided-batched or Ex GEMMs, but its
        # loaded libcublas exports them; ctypes resolves a symbol on first access.
        self._name, self._batched_name = _ENTRY[self.kind]
        self._symbol = ctypes.cast(getattr(lib, self._name), ctypes.c_void_p).value
        self._c_gemm = kernel_loader.require().gemm
        self.c_symbol = self._symbol
        self._batched_symbol = ctypes.cast(getattr(lib, self._batched_name),
                                           ctypes.c_void_p).value
        self._c_batched = kernel_loader.require().gemm_batched

    def __call__(self, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
                 out_f32=False):
        status = self._c_gemm(self._symbol, self.handle, transa, transb, m, n, k, alpha,
                              int(A), lda, int(B), ldb, beta, int(C), ldc,
                              self._kind_f32 if out_f32 else self.kind)
        if status:
            kernel_loader.check_blas(self._name, status)

    def batched(self, transa, transb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC,
                batch, out_f32=False):
        status = self._c_batched(self._batched_symbol, self.handle, transa, transb, m, n, k,
                                 alpha, int(A), lda, sA, int(B), ldb, sB, beta, int(C), ldc, sC,
                                 batch, self._kind_f32 if out_f32 else self.kind)
        if status:
            kernel_loader.check_blas(self._batched_name, status)

    def set_math_mode(self, mode):
        """cublasSetMathMode on this handle (``_TF32_MATH`` or ``_DEFAULT_MATH``)."""
        fn = self._cublas._libcublas.cublasSetMathMode
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_int
        status = fn(ctypes.c_void_p(self.handle), mode)
        if status:
            raise RuntimeError(f"cublasSetMathMode failed with status {status}")

    def set_workspace(self, address, nbytes):
        symbol = ctypes.cast(self._cublas._libcublas.cublasSetWorkspace_v2, ctypes.c_void_p).value
        kernel_loader.require().blas_set_workspace(symbol, self.handle, int(address), nbytes)

    def close(self):
        self._cublas.cublasDestroy(self.handle)


class _NvmathGemm:
    # nvmath's bindings do not expose the function they call, so the C path
    # (handlers.cuda.one_call) leaves cuBLAS-sized products to this object.
    c_symbol = 0

    def __init__(self, dtype, stream):
        try:
            from nvmath.bindings import cublas
        except ImportError as e:
            raise ImportError(f"blas='nvmath' needs nvmath-python "
                              f"(pip install 'streamhandlers[nvmath]'): {e}") from e
        self._cublas = cublas
        self._error = getattr(cublas, "cuBLASError", RuntimeError)
        self.handle = cublas.create()
        cublas.set_stream(self.handle, stream.handle)
        cublas.set_pointer_mode(self.handle, int(cublas.PointerMode.HOST))
        self.kind = KINDS[dtypes.short_name(dtype)]
        self._fn, self._batched_fn = {
            _abi.GEMM_FLOAT: (cublas.sgemm, cublas.sgemm_strided_batched),
            _abi.GEMM_DOUBLE: (cublas.dgemm, cublas.dgemm_strided_batched),
        }.get(self.kind) or self._ex(cublas, _HALF_TYPE[self.kind])
        if self.kind in _HALF_TYPE:   # the same inputs, a float32 output (out_f32)
            self._fn_f32, self._batched_fn_f32 = self._ex(cublas, _HALF_TYPE[self.kind],
                                                          _abi.CUDA_R_32F)
        # alpha and beta live in one host array (float32 for the half
        # formats' float compute); cuBLAS reads them during the call.
        self._scalars = np.zeros(2, dtypes.compute_dtype(dtype))
        self._palpha = self._scalars.ctypes.data
        self._pbeta = self._palpha + self._scalars.itemsize

    def __call__(self, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
                 out_f32=False):
        s = self._scalars
        s[0] = alpha
        s[1] = beta
        fn = self._fn_f32 if out_f32 else self._fn
        try:
            fn(self.handle, transa, transb, m, n, k, self._palpha,
                     int(A), lda, int(B), ldb, self._pbeta, int(C), ldc)
        except self._error as e:   # one error type, whichever the backend
            self._raise(fn, e)

    def batched(self, transa, transb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC,
                batch, out_f32=False):
        s = self._scalars
        s[0] = alpha
        s[1] = beta
        fn = self._batched_fn_f32 if out_f32 else self._batched_fn
        try:
            fn(self.handle, transa, transb, m, n, k, self._palpha, int(A), lda, sA,
               int(B), ldb, sB, self._pbeta, int(C), ldc, sC, batch)
        except self._error as e:
            self._raise(fn, e)

    @staticmethod
    def _ex(cublas, t, tc=None):
        """The GemmEx pair with the plain GEMMs' signatures, for inputs of data
        type ``t`` and an output of ``tc`` (``t`` if None)."""
        tc = t if tc is None else tc

        def gemm_ex(handle, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
            cublas.gemm_ex(handle, ta, tb, m, n, k, alpha, A, t, lda, B, t, ldb, beta, C, tc, ldc,
                           _COMPUTE_32F, _GEMM_DEFAULT)

        def gemm_batched_ex(handle, ta, tb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, C,
                            ldc, sC, batch):
            cublas.gemm_strided_batched_ex(handle, ta, tb, m, n, k, alpha, A, t, lda, sA, B, t,
                                           ldb, sB, beta, C, tc, ldc, sC, batch, _COMPUTE_32F,
                                           _GEMM_DEFAULT)
        gemm_ex.__name__, gemm_batched_ex.__name__ = _ENTRY[_abi.GEMM_BF16]
        return gemm_ex, gemm_batched_ex

    @staticmethod
    def _raise(fn, e):
        status = int(getattr(e, "status", -1))
        raise kernel_loader.CudaError(fn.__name__, kernel_loader.CUBLAS_STATUS.get(
            status, "CUBLAS_STATUS_UNKNOWN"), status) from e

    def set_math_mode(self, mode):
        """cublasSetMathMode on this handle (``_TF32_MATH`` or ``_DEFAULT_MATH``)."""
        try:
            self._cublas.set_math_mode(self.handle, mode)
        except self._error as e:
            self._raise(self._cublas.set_math_mode, e)

    def set_workspace(self, address, nbytes):
        self._cublas.set_workspace(self.handle, address, nbytes)

    def close(self):
        self._cublas.destroy(self.handle)


#: cublasMath_t: CUBLAS_DEFAULT_MATH, and CUBLAS_TF32_TENSOR_OP_MATH (float32
#: products on TF32 tensor cores: inputs rounded to 10 explicit mantissa bits)
_DEFAULT_MATH, _TF32_MATH = 0, 3
#: CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION: without it, cuBLAS may
#: add a half product's split-K partial sums in the output's format (seen on
#: an H200: float16 dot_add_mm at 64x129x64 off by 0.9 of a unit in the last
#: place, i.e. rounded twice); with it, every reduction stays in float32.
_NO_REDUCED_REDUCTION = 16


def make_gemm(backend, dtype, stream, tf32=False):
    """Return a GEMM callable for ``backend`` bound to ``stream`` (a ``resources.Stream``).

    ``transa``/``transb`` are 0 (no transpose) or 1 (transpose), as in
    ``cublasOperation_t``.  ``tf32`` sets the handle's math mode to
    ``CUBLAS_TF32_TENSOR_OP_MATH`` (float32 only; every product on the
    handle, the one-call C path's included, may then run on TF32 tensor
    cores); otherwise the handle stays in cuBLAS's default mode, which never
    uses TF32 unless the environment variable ``NVIDIA_TF32_OVERRIDE`` says
    so.  The half formats' handles disallow reduced-precision reductions.
    """
    if backend == "scikit-cuda":
        gemm = _SkcudaGemm(np.dtype(dtype), stream)
    elif backend == "nvmath":
        gemm = _NvmathGemm(np.dtype(dtype), stream)
    else:
        raise ValueError(f"PyCudaHandler: blas must be one of {BACKENDS}, got {backend!r}")
    if tf32:
        gemm.set_math_mode(_TF32_MATH)
    elif gemm.kind in _HALF_TYPE:   # the halves: float32 accumulation throughout
        gemm.set_math_mode(_DEFAULT_MATH | _NO_REDUCED_REDUCTION)
    return gemm
