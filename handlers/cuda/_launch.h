/* Shared by the sources of handlers.cuda._launch (_launch.c, _one_call.c, _driver.c). */
#ifndef HANDLERS_LAUNCH_H
#define HANDLERS_LAUNCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* cuLaunchKernel; NULL until load() has found libcuda. */
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
extern launch_fn cu_launch;

/* GEMM kinds: which cuBLAS entry point `symbol` is and how it is called.
 * The _TO_F32 kinds take half inputs and write a float32 output (C).  The
 * module exports them (GEMM_FLOAT, ...: handlers/cuda/blas.py reads them). */
enum { GEMM_FLOAT = 0, GEMM_DOUBLE = 1, GEMM_BF16 = 2, GEMM_F16 = 3, GEMM_BF16_TO_F32 = 4,
       GEMM_F16_TO_F32 = 5 };

/* Blocks of a grid-stride launch over n elements, per_block (>= 1) of them
 * per block: ceil(n / per_block), at most max_blocks, at least 1 (n <= 0
 * too).  The one grid formula of elementwise launches: OneCall's, and
 * PyCudaHandler._grid's through the module's grid(). */
static inline long long grid_blocks(long long n, long long per_block, long long max_blocks) {
    long long g = n > 0 ? n / per_block + (n % per_block != 0) : 0;
    if (g > max_blocks) g = max_blocks;
    return g < 1 ? 1 : g;
}

/* The GEMM at `symbol` in host pointer mode: cublasSgemm_v2 (GEMM_FLOAT),
 * cublasDgemm_v2 (GEMM_DOUBLE) or cublasGemmEx with float compute (the
 * others); returns the cublasStatus_t. */
int call_gemm(void *symbol, void *handle, int kind, int transa, int transb, int m, int n, int k,
              double alpha, const void *a, int lda, const void *b, int ldb, double beta, void *c,
              int ldc);

/* Raise CudaError (set_error_type) naming the failed driver call and its
 * status; returns NULL. */
PyObject *driver_error(const char *what, int rc);

/* The same for a cuBLAS call and its cublasStatus_t. */
PyObject *blas_error(const char *what, int status);

/* Make the handlers' context current on this thread if no context is (once
 * per thread); 1 on success, else 0 with an exception set. */
int ensure_context(void);

/* 1 if libcuda is loaded (and the context current, ensure_context), else 0
 * with a RuntimeError naming `what`. */
int loaded(const char *what);

/* 1 if load() has opened libcuda, else 0 with a RuntimeError naming `what`;
 * unlike loaded(), makes no context current. */
int libcuda_loaded(const char *what);

/* Raise CudaError(what, status, code) (a RuntimeError before set_error_type);
 * returns NULL.  For libraries with their own status strings (cuDNN). */
PyObject *status_error(const char *what, const char *status, int code);

/* _cudnn.c: add the cuDNN functions to the module (-1 with an exception set). */
int add_cudnn_functions(PyObject *module);

/* The driver's name of CUresult rc (CUDA_ERROR_UNKNOWN where it has none). */
const char *status_name(int rc);

/* Add the OneCall type to the module; -1 with an exception set on failure. */
int add_one_call_type(PyObject *module);

/* _driver.c: find its driver calls in `lib`, the libcuda handle load()
 * opened (a missing one raises when its function is called), and add its
 * functions to the module (-1 with an exception set on failure). */
void resolve_driver_calls(void *lib);
int add_driver_functions(PyObject *module);

#endif
