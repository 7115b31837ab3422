/* handlers.cuda._launch: the one way streamhandlers' own code reaches the CUDA
 * driver, plus a lean path to cuBLAS GEMM.
 *
 * pycuda's launch goes through boost.python (argument tuples converted per
 * call) and a separate argument packer, and scikit-cuda's GEMM through ctypes;
 * together that is several microseconds of host time per op, more than the
 * driver's own launch.  This file packs the arguments and makes the call in
 * one C function (METH_FASTCALL: no argument tuple is built), and holds the
 * event calls.  _one_call.c checks and launches the most frequent ops in one
 * call; _driver.c has the remaining driver calls (streams, copies, pinned
 * host memory, module loading, stream capture and graphs, memset, host
 * page-locking, timing events, device attributes) and cuBLAS's workspace
 * setter.  pycuda remains the array library (GPUArray, its memory pool and
 * the context it needs) and nvcc's front end, and makes no other driver call.
 *
 * It needs no CUDA headers or libraries at build time: load() opens libcuda at
 * run time and the few driver types used here are plain integers and
 * pointers.  So it builds on any machine with a C compiler, and a machine
 * without a GPU can still test the argument packer.
 *
 * Argument formats use pycuda's struct codes with native alignment:
 * P (device pointer: an int or anything with __int__), q, Q, i, f, d.
 */
#include "_launch.h"

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

/* CUDA's parameter space is 4 KiB on every architecture we build for; a
 * fused op passes 8 bytes per array (LSTM steps pass 22-24 arguments). */
#define MAX_ARGS 256
#define MAX_BYTES 4096

typedef int (*error_name_fn)(int, const char **);
typedef int (*sgemm_fn)(void *, int, int, int, int, int, const float *, const void *, int,
                        const void *, int, const float *, void *, int);
typedef int (*dgemm_fn)(void *, int, int, int, int, int, const double *, const void *, int,
                        const void *, int, const double *, void *, int);

/* cublas[SD]gemmStridedBatched: as the plain GEMM, plus a long long stride
 * after each matrix's leading dimension and the batch count last. */
typedef int (*sgemm_batched_fn)(void *, int, int, int, int, int, const float *, const void *,
                                int, long long, const void *, int, long long, const float *,
                                void *, int, long long, int);
typedef int (*dgemm_batched_fn)(void *, int, int, int, int, int, const double *, const void *,
                                int, long long, const void *, int, long long, const double *,
                                void *, int, long long, int);

/* cublasGemmEx / cublasGemmStridedBatchedEx (the half formats): each
 * matrix's cudaDataType_t after its pointer, the compute type and algorithm
 * last; alpha and beta are floats (CUBLAS_COMPUTE_32F). */
typedef int (*gemm_ex_fn)(void *, int, int, int, int, int, const void *, const void *, int, int,
                          const void *, int, int, const void *, void *, int, int, int, int);
typedef int (*gemm_batched_ex_fn)(void *, int, int, int, int, int, const void *, const void *,
                                  int, int, long long, const void *, int, int, long long,
                                  const void *, void *, int, int, long long, int, int, int);
/* cudaDataType_t values (library_types.h), and cuBLAS's float32 compute
 * type and default algorithm (cublas_api.h); exported with the GEMM kinds
 * (add_constants) for handlers/cuda/blas.py's nvmath backend. */
enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
#define CUBLAS_COMPUTE_32F 68
#define CUBLAS_GEMM_DEFAULT (-1)
/* cudaDataType_t of a half GEMM kind's inputs and of its output. */
static int half_type(int kind) {
    return kind == GEMM_BF16 || kind == GEMM_BF16_TO_F32 ? CUDA_R_16BF : CUDA_R_16F;
}
static int out_type(int kind) {
    return kind >= GEMM_BF16_TO_F32 ? CUDA_R_32F : half_type(kind);
}

typedef int (*event_fn)(void *);                      /* destroy, query, synchronize */
typedef int (*event_record_fn)(void *, void *);       /* (event, stream) */
typedef int (*stream_wait_fn)(void *, void *, unsigned);
typedef int (*ctx_get_fn)(void **);
typedef int (*ctx_set_fn)(void *);

launch_fn cu_launch;
static error_name_fn cu_error_name;
typedef int (*event_create_fn)(void **, unsigned);
static event_create_fn cu_event_create;
static event_fn cu_event_destroy, cu_event_query, cu_event_sync;
static event_record_fn cu_event_record;
static stream_wait_fn cu_stream_wait;
static ctx_get_fn cu_ctx_get_current;
static ctx_set_fn cu_ctx_set_current;
/* The context handlers use (set_context), made current on each thread that
 * launches through this module when none is (ensure_context). */
static void *handler_context;
static _Thread_local int context_checked;

/* Pack args by fmt into buf; params[i] points at argument i.  Returns the
 * number of bytes used, or -1 with a Python exception set. */
static Py_ssize_t pack_args(const char *fmt, Py_ssize_t nfmt, PyObject *const *args,
                       Py_ssize_t nargs, char *buf, void **params) {
    if (nfmt != nargs) {
        PyErr_Format(PyExc_TypeError, "format has %zd codes but %zd arguments were given",
                     nfmt, nargs);
        return -1;
    }
    if (nargs > MAX_ARGS) {
        PyErr_Format(PyExc_ValueError, "at most %d kernel arguments", MAX_ARGS);
        return -1;
    }
    Py_ssize_t off = 0;
    for (Py_ssize_t i = 0; i < nargs; ++i) {
        PyObject *o = args[i];
        size_t size;
        switch (fmt[i]) {
            case 'P': case 'q': case 'Q': case 'd': size = 8; break;
            case 'i': case 'f': size = 4; break;
            default:
                PyErr_Format(PyExc_ValueError, "unknown argument code '%c'", fmt[i]);
                return -1;
        }
        off = (off + (Py_ssize_t)size - 1) & ~((Py_ssize_t)size - 1);   /* native alignment */
        if (off + (Py_ssize_t)size > MAX_BYTES) {
            PyErr_SetString(PyExc_ValueError, "kernel arguments too large");
            return -1;
        }
        char *dst = buf + off;
        params[i] = dst;
        off += (Py_ssize_t)size;
        switch (fmt[i]) {
            case 'P': {
                /* Device allocations are objects with __int__; plain ints pass as is. */
                PyObject *n = PyLong_Check(o) ? (Py_INCREF(o), o) : PyNumber_Long(o);
                if (!n) return -1;
                unsigned long long v = PyLong_AsUnsignedLongLong(n);
                Py_DECREF(n);
                if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
                memcpy(dst, &v, 8);
                break;
            }
            case 'q': {
                long long v = PyLong_AsLongLong(o);
                if (v == -1 && PyErr_Occurred()) return -1;
                memcpy(dst, &v, 8);
                break;
            }
            case 'Q': {
                unsigned long long v = PyLong_AsUnsignedLongLong(o);
                if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
                memcpy(dst, &v, 8);
                break;
            }
            case 'i': {
                long v = PyLong_AsLong(o);
                if (v == -1 && PyErr_Occurred()) return -1;
                if (v < INT32_MIN || v > INT32_MAX) {
                    PyErr_SetString(PyExc_OverflowError, "'i' argument out of range");
                    return -1;
                }
                int32_t w = (int32_t)v;
                memcpy(dst, &w, 4);
                break;
            }
            case 'f': {
                double v = PyFloat_AsDouble(o);
                if (v == -1.0 && PyErr_Occurred()) return -1;
                float w = (float)v;
                memcpy(dst, &w, 4);
                break;
            }
            case 'd': {
                double v = PyFloat_AsDouble(o);
                if (v == -1.0 && PyErr_Occurred()) return -1;
                memcpy(dst, &v, 8);
                break;
            }
        }
    }
    return off;
}

static int as_bytes(PyObject *o, const char **s, Py_ssize_t *n) {
    if (PyBytes_Check(o)) {
        *s = PyBytes_AS_STRING(o);
        *n = PyBytes_GET_SIZE(o);
        return 0;
    }
    if (PyUnicode_Check(o)) {
        *s = PyUnicode_AsUTF8AndSize(o, n);
        return *s ? 0 : -1;
    }
    PyErr_SetString(PyExc_TypeError, "format must be bytes or str");
    return -1;
}

static PyObject *py_pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "pack(fmt, *args)");
        return NULL;
    }
    const char *fmt;
    Py_ssize_t nfmt;
    if (as_bytes(args[0], &fmt, &nfmt) < 0) return NULL;
    char buf[MAX_BYTES];
    void *params[MAX_ARGS];
    memset(buf, 0, sizeof buf);
    Py_ssize_t used = pack_args(fmt, nfmt, args + 1, nargs - 1, buf, params);
    if (used < 0) return NULL;
    return PyBytes_FromStringAndSize(buf, used);
}

static void *open_cuda(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    return lib ? lib : dlopen("libcuda.so", RTLD_NOW | RTLD_GLOBAL);
}

static PyObject *py_load(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    if (cu_launch) Py_RETURN_TRUE;
    void *lib = open_cuda();
    if (!lib) Py_RETURN_FALSE;
    cu_error_name = (error_name_fn)dlsym(lib, "cuGetErrorName");
    cu_event_create = (event_create_fn)dlsym(lib, "cuEventCreate");
    cu_event_destroy = (event_fn)dlsym(lib, "cuEventDestroy_v2");
    cu_event_query = (event_fn)dlsym(lib, "cuEventQuery");
    cu_event_sync = (event_fn)dlsym(lib, "cuEventSynchronize");
    cu_event_record = (event_record_fn)dlsym(lib, "cuEventRecord");
    cu_stream_wait = (stream_wait_fn)dlsym(lib, "cuStreamWaitEvent");
    cu_ctx_get_current = (ctx_get_fn)dlsym(lib, "cuCtxGetCurrent");
    cu_ctx_set_current = (ctx_set_fn)dlsym(lib, "cuCtxSetCurrent");
    if (!cu_event_create || !cu_event_destroy || !cu_event_query || !cu_event_sync ||
        !cu_event_record || !cu_stream_wait || !cu_ctx_get_current || !cu_ctx_set_current)
        Py_RETURN_FALSE;
    resolve_driver_calls(lib);
    /* Set last: a true cu_launch means every symbol above was found. */
    cu_launch = (launch_fn)dlsym(lib, "cuLaunchKernel");
    if (!cu_launch) Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

/* CudaError and the cuBLAS status names ({code: name}), from set_error_type;
 * until then errors are RuntimeError. */
static PyObject *error_type, *blas_names;

static PyObject *raise_error(const char *what, const char *status, int code) {
    if (!error_type) {
        PyErr_Format(PyExc_RuntimeError, "%s failed: %s (%d)", what, status, code);
        return NULL;
    }
    PyObject *e = PyObject_CallFunction(error_type, "ssi", what, status, code);
    if (e) {
        PyErr_SetObject(error_type, e);
        Py_DECREF(e);
    }
    return NULL;
}

const char *status_name(int rc) {
    const char *name = NULL;
    if (!cu_error_name || cu_error_name(rc, &name) != 0 || !name) name = "CUDA_ERROR_UNKNOWN";
    return name;
}

PyObject *status_error(const char *what, const char *status, int code) {
    return raise_error(what, status, code);
}

PyObject *driver_error(const char *what, int rc) {
    return raise_error(what, status_name(rc), rc);
}

PyObject *blas_error(const char *what, int status) {
    PyObject *key = PyLong_FromLong(status);
    PyObject *name = key && blas_names ? PyDict_GetItemWithError(blas_names, key) : NULL;
    Py_XDECREF(key);
    const char *text = name ? PyUnicode_AsUTF8(name) : NULL;
    PyErr_Clear();
    return raise_error(what, text ? text : "CUBLAS_STATUS_UNKNOWN", status);
}

/* set_error_type(CudaError, {cuBLAS status: name}): the exception every
 * failed driver or cuBLAS call raises, CudaError(call, status name, code). */
static PyObject *py_set_error_type(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyType_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "set_error_type(type, dict)");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(error_type, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(blas_names, args[1]);
    Py_RETURN_NONE;
}

int ensure_context(void) {
    if (context_checked || !handler_context) return 1;
    void *current = NULL;
    int rc = cu_ctx_get_current(&current);
    if (!rc && !current) rc = cu_ctx_set_current(handler_context);
    if (rc) {
        driver_error("cuCtxSetCurrent", rc);
        return 0;
    }
    context_checked = 1;
    return 1;
}

int libcuda_loaded(const char *what) {
    if (cu_launch) return 1;
    PyErr_Format(PyExc_RuntimeError, "%s: libcuda not loaded (call load() first)", what);
    return 0;
}

int loaded(const char *what) {
    return libcuda_loaded(what) && ensure_context();
}

/* set_context(handle): the CUcontext (an int) that launches on a thread
 * with no current context make current first. */
static PyObject *py_set_context(PyObject *self, PyObject *handle) {
    (void)self;
    void *ctx = PyLong_AsVoidPtr(handle);
    if (PyErr_Occurred()) return NULL;
    handler_context = ctx;
    Py_RETURN_NONE;
}

/* grid(n, per_block, max_blocks) -> int: grid_blocks (_launch.h), the
 * blocks of an elementwise launch, for PyCudaHandler._grid. */
static PyObject *py_grid(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "grid(n, per_block, max_blocks)");
        return NULL;
    }
    long long v[3];
    for (int i = 0; i < 3; ++i) {
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) return NULL;
    }
    if (v[1] < 1) {
        PyErr_SetString(PyExc_ValueError, "grid: per_block must be positive");
        return NULL;
    }
    return PyLong_FromLongLong(grid_blocks(v[0], v[1], v[2]));
}

/* launch(function, stream, grid, block, fmt, *args): cuLaunchKernel with a
 * 1-D grid of 1-D blocks on `stream` (CUfunction and CUstream as ints). */
static PyObject *py_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 5) {
        PyErr_SetString(PyExc_TypeError, "launch(function, stream, grid, block, fmt, *args)");
        return NULL;
    }
    if (!loaded("launch")) return NULL;
    void *fn = PyLong_AsVoidPtr(args[0]);
    void *stream = PyLong_AsVoidPtr(args[1]);
    long grid = PyLong_AsLong(args[2]);
    long block = PyLong_AsLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (!fn || grid < 1 || block < 1) {
        PyErr_SetString(PyExc_ValueError, "launch: null function or empty grid");
        return NULL;
    }
    const char *fmt;
    Py_ssize_t nfmt;
    if (as_bytes(args[4], &fmt, &nfmt) < 0) return NULL;
    char buf[MAX_BYTES];
    void *params[MAX_ARGS];
    if (pack_args(fmt, nfmt, args + 5, nargs - 5, buf, params) < 0) return NULL;
    int rc = cu_launch(fn, (unsigned)grid, 1, 1, (unsigned)block, 1, 1, 0, stream, params, NULL);
    if (rc) return driver_error("cuLaunchKernel", rc);
    Py_RETURN_NONE;
}

int call_gemm(void *symbol, void *handle, int kind, int transa, int transb, int m, int n, int k,
              double alpha, const void *a, int lda, const void *b, int ldb, double beta, void *c,
              int ldc) {
    if (kind == GEMM_DOUBLE)
        return ((dgemm_fn)symbol)(handle, transa, transb, m, n, k, &alpha, a, lda, b, ldb, &beta,
                                  c, ldc);
    float fa = (float)alpha, fb = (float)beta;
    if (kind == GEMM_FLOAT)
        return ((sgemm_fn)symbol)(handle, transa, transb, m, n, k, &fa, a, lda, b, ldb, &fb, c,
                                  ldc);
    int t = half_type(kind);
    return ((gemm_ex_fn)symbol)(handle, transa, transb, m, n, k, &fa, a, t, lda, b, t, ldb, &fb,
                                c, out_type(kind), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

/* gemm(symbol, handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C,
 * ldc, kind): call the GEMM at address `symbol` in host pointer mode:
 * cublas[SD]gemm_v2 for kind 0 (float) and 1 (double), cublasGemmEx with
 * float compute for 2 (bfloat16) and 3 (float16), and for 4 and 5 (the same
 * inputs, a float32 output); returns the cublasStatus_t (0 on success). */
static PyObject *py_gemm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "gemm takes 16 arguments");
        return NULL;
    }
    void *sym = PyLong_AsVoidPtr(args[0]);
    void *handle = PyLong_AsVoidPtr(args[1]);
    int ints[5];
    for (int i = 0; i < 5; ++i) ints[i] = (int)PyLong_AsLong(args[2 + i]);
    double alpha = PyFloat_AsDouble(args[7]);
    void *a = PyLong_AsVoidPtr(args[8]);
    int lda = (int)PyLong_AsLong(args[9]);
    void *b = PyLong_AsVoidPtr(args[10]);
    int ldb = (int)PyLong_AsLong(args[11]);
    double beta = PyFloat_AsDouble(args[12]);
    void *c = PyLong_AsVoidPtr(args[13]);
    int ldc = (int)PyLong_AsLong(args[14]);
    long kind = PyLong_AsLong(args[15]);
    if (PyErr_Occurred()) return NULL;
    if (!sym || kind < GEMM_FLOAT || kind > GEMM_F16_TO_F32) {
        PyErr_SetString(PyExc_ValueError, "gemm: null symbol or a kind not in 0..5");
        return NULL;
    }
    int status = call_gemm(sym, handle, (int)kind, ints[0], ints[1], ints[2], ints[3], ints[4], alpha,
                           a, lda, b, ldb, beta, c, ldc);
    return PyLong_FromLong(status);
}

/* cublasLtMatmul and cublasLtMatmulDescSetAttribute (cublasLt.h). */
typedef int (*lt_matmul_fn)(void *, void *, const void *, const void *, void *, const void *,
                            void *, const void *, const void *, void *, void *, void *,
                            const void *, void *, size_t, void *);
typedef int (*lt_set_fn)(void *, int, const void *, size_t);
#define LT_DESC_BIAS_POINTER 8

/* lt_matmul(matmul, set_attribute, handle, desc, bias, A, Adesc, B, Bdesc, D,
 * Ddesc, algo, workspace, workspace_bytes, stream, double): set desc's bias
 * pointer, then D = A B through desc's epilogue (alpha 1, beta 0, C is D),
 * both under the GIL so no other thread's bias comes between; scalars are
 * doubles for the float64 format, else floats.  Returns the cublasStatus_t
 * (0 on success). */
static PyObject *py_lt_matmul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "lt_matmul takes 16 arguments");
        return NULL;
    }
    void *p[15];   /* every argument but workspace_bytes (13) and double (15) */
    for (int i = 0; i < 15; ++i) p[i] = i == 13 ? NULL : PyLong_AsVoidPtr(args[i]);
    size_t ws_bytes = PyLong_AsSize_t(args[13]);
    int f64 = PyObject_IsTrue(args[15]);
    if (PyErr_Occurred()) return NULL;
    if (!p[0] || !p[1] || !p[2] || !p[3]) {
        PyErr_SetString(PyExc_ValueError, "lt_matmul: null function, handle or descriptor");
        return NULL;
    }
    void *bias = p[4];
    int status = ((lt_set_fn)p[1])(p[3], LT_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (status) return PyLong_FromLong(status);
    static const float one = 1.0f, zero = 0.0f;
    static const double one_d = 1.0, zero_d = 0.0;
    const void *alpha = f64 ? (const void *)&one_d : (const void *)&one;
    const void *beta = f64 ? (const void *)&zero_d : (const void *)&zero;
    status = ((lt_matmul_fn)p[0])(p[2], p[3], alpha, p[5], p[6], p[7], p[8], beta, p[9], p[10],
                                  p[9], p[10], p[11], p[12], ws_bytes, p[14]);
    return PyLong_FromLong(status);
}

/* gemm_batched(symbol, handle, transa, transb, m, n, k, alpha, A, lda, strideA,
 * B, ldb, strideB, beta, C, ldc, strideC, batch, kind): call
 * cublas[SD]gemmStridedBatched (kind 0, 1) or cublasGemmStridedBatchedEx
 * (kind 2, 3; see gemm) at address `symbol` in host pointer mode (strides in
 * elements; 0 shares one matrix across the batch); returns the
 * cublasStatus_t (0 on success). */
static PyObject *py_gemm_batched(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 20) {
        PyErr_SetString(PyExc_TypeError, "gemm_batched takes 20 arguments");
        return NULL;
    }
    void *sym = PyLong_AsVoidPtr(args[0]);
    void *handle = PyLong_AsVoidPtr(args[1]);
    int ints[5];
    for (int i = 0; i < 5; ++i) ints[i] = (int)PyLong_AsLong(args[2 + i]);
    double alpha = PyFloat_AsDouble(args[7]);
    void *a = PyLong_AsVoidPtr(args[8]);
    int lda = (int)PyLong_AsLong(args[9]);
    long long sa = PyLong_AsLongLong(args[10]);
    void *b = PyLong_AsVoidPtr(args[11]);
    int ldb = (int)PyLong_AsLong(args[12]);
    long long sb = PyLong_AsLongLong(args[13]);
    double beta = PyFloat_AsDouble(args[14]);
    void *c = PyLong_AsVoidPtr(args[15]);
    int ldc = (int)PyLong_AsLong(args[16]);
    long long sc = PyLong_AsLongLong(args[17]);
    int batch = (int)PyLong_AsLong(args[18]);
    long kind = PyLong_AsLong(args[19]);
    if (PyErr_Occurred()) return NULL;
    if (!sym || kind < GEMM_FLOAT || kind > GEMM_F16_TO_F32) {
        PyErr_SetString(PyExc_ValueError, "gemm_batched: null symbol or a kind not in 0..5");
        return NULL;
    }
    int status;
    if (kind == GEMM_DOUBLE) {
        status = ((dgemm_batched_fn)sym)(handle, ints[0], ints[1], ints[2], ints[3], ints[4],
                                         &alpha, a, lda, sa, b, ldb, sb, &beta, c, ldc, sc,
                                         batch);
    } else if (kind == GEMM_FLOAT) {
        float fa = (float)alpha, fb = (float)beta;
        status = ((sgemm_batched_fn)sym)(handle, ints[0], ints[1], ints[2], ints[3], ints[4],
                                         &fa, a, lda, sa, b, ldb, sb, &fb, c, ldc, sc, batch);
    } else {
        float fa = (float)alpha, fb = (float)beta;
        int t = half_type((int)kind);
        status = ((gemm_batched_ex_fn)sym)(handle, ints[0], ints[1], ints[2], ints[3], ints[4],
                                           &fa, a, t, lda, sa, b, t, ldb, sb, &fb, c,
                                           out_type((int)kind), ldc, sc, batch,
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    return PyLong_FromLong(status);
}

/* Events: a CUevent and a CUstream are passed as ints.  Each call is one
 * driver call, about half of what pycuda's Event and Stream methods cost. */
#define CUDA_ERROR_NOT_READY 600
#define CU_EVENT_DISABLE_TIMING 2

/* A new CUevent, as an int; `flags` 0 for one that records time. */
static PyObject *new_event(const char *what, unsigned flags) {
    if (!loaded(what)) return NULL;
    void *ev = NULL;
    int rc = cu_event_create(&ev, flags);
    if (rc) return driver_error("cuEventCreate", rc);
    return PyLong_FromVoidPtr(ev);
}

static PyObject *py_event_new(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    return new_event("event_new", CU_EVENT_DISABLE_TIMING);
}

/* timing_event_new() -> int: a CUevent that records time, for
 * event_elapsed; freed with event_free. */
static PyObject *py_timing_event_new(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    return new_event("timing_event_new", 0);
}

/* Shared by the event calls: checks the argument count and returns the event
 * handle at args[at], or NULL with an exception set. */
static void *event_arg(const char *what, PyObject *const *args, Py_ssize_t nargs,
                       Py_ssize_t want, Py_ssize_t at) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", what, want);
        return NULL;
    }
    if (!loaded(what)) return NULL;
    void *ev = PyLong_AsVoidPtr(args[at]);
    if (!ev && !PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: null event", what);
    return ev;
}

static PyObject *py_event_free(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *ev = event_arg("event_free", args, nargs, 1, 0);
    if (!ev) return NULL;
    int rc = cu_event_destroy(ev);
    if (rc) return driver_error("cuEventDestroy", rc);
    Py_RETURN_NONE;
}

/* The event and stream of record(event, stream) and wait(stream, event):
 * the event at args[ev_at], the stream at the other place.  0 with an
 * exception set on failure. */
static int event_and_stream(const char *what, PyObject *const *args, Py_ssize_t nargs,
                            Py_ssize_t ev_at, void **ev, void **stream) {
    *ev = event_arg(what, args, nargs, 2, ev_at);
    if (!*ev) return 0;
    *stream = PyLong_AsVoidPtr(args[1 - ev_at]);
    return !PyErr_Occurred();
}

static PyObject *py_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *ev, *stream;
    if (!event_and_stream("record", args, nargs, 0, &ev, &stream)) return NULL;
    int rc = cu_event_record(ev, stream);
    if (rc) return driver_error("cuEventRecord", rc);
    Py_RETURN_NONE;
}

/* wait(stream, event): the argument order of cuStreamWaitEvent. */
static PyObject *py_wait(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *ev, *stream;
    if (!event_and_stream("wait", args, nargs, 1, &ev, &stream)) return NULL;
    int rc = cu_stream_wait(stream, ev, 0);
    if (rc) return driver_error("cuStreamWaitEvent", rc);
    Py_RETURN_NONE;
}

static PyObject *py_query(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *ev = event_arg("query", args, nargs, 1, 0);
    if (!ev) return NULL;
    int rc = cu_event_query(ev);
    if (rc == 0) Py_RETURN_TRUE;
    if (rc == CUDA_ERROR_NOT_READY) Py_RETURN_FALSE;
    return driver_error("cuEventQuery", rc);
}

static PyObject *py_event_sync(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *ev = event_arg("event_sync", args, nargs, 1, 0);
    if (!ev) return NULL;
    int rc;
    /* Other threads (prefetch's reader and stager) run while this one waits. */
    Py_BEGIN_ALLOW_THREADS
    rc = cu_event_sync(ev);
    Py_END_ALLOW_THREADS
    if (rc) return driver_error("cuEventSynchronize", rc);
    Py_RETURN_NONE;
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

static PyMethodDef methods[] = {
    {"set_error_type", (PyCFunction)(void (*)(void))py_set_error_type, METH_FASTCALL,
     "set_error_type(CudaError, {cuBLAS status: name}): what failed calls raise."},
    {"set_context", py_set_context, METH_O,
     "set_context(handle): the CUcontext made current on a thread that has none."},
    {"load", py_load, METH_NOARGS,
     "load() -> bool: open libcuda; False where there is no CUDA driver."},
    {"launch", (PyCFunction)(void (*)(void))py_launch, METH_FASTCALL,
     "launch(function, stream, grid, block, fmt, *args): cuLaunchKernel, 1-D grid."},
    {"pack", (PyCFunction)(void (*)(void))py_pack, METH_FASTCALL,
     "pack(fmt, *args) -> bytes: the argument buffer launch() would pass."},
    {"grid", (PyCFunction)(void (*)(void))py_grid, METH_FASTCALL,
     "grid(n, per_block, max_blocks) -> int: blocks of an elementwise launch over n "
     "elements, as OneCall sizes them: ceil(n / per_block), at most max_blocks, at least 1."},
    {"gemm", (PyCFunction)(void (*)(void))py_gemm, METH_FASTCALL,
     "gemm(symbol, handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, "
     "double) -> cublasStatus_t."},
    {"gemm_batched", (PyCFunction)(void (*)(void))py_gemm_batched, METH_FASTCALL,
     "gemm_batched(symbol, handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, "
     "strideB, beta, C, ldc, strideC, batch, double) -> cublasStatus_t."},
    {"lt_matmul", (PyCFunction)(void (*)(void))py_lt_matmul, METH_FASTCALL,
     "lt_matmul(matmul, set_attribute, handle, desc, bias, A, Adesc, B, Bdesc, D, Ddesc, "
     "algo, workspace, workspace_bytes, stream, double) -> cublasStatus_t."},
    {"event_new", py_event_new, METH_NOARGS,
     "event_new() -> int: a new CUevent without timing."},
    {"timing_event_new", py_timing_event_new, METH_NOARGS,
     "timing_event_new() -> int: a CUevent that records time (free it with event_free)."},
    {"event_free", FASTCALL(py_event_free), "event_free(event): cuEventDestroy."},
    {"record", FASTCALL(py_record), "record(event, stream): cuEventRecord."},
    {"wait", FASTCALL(py_wait), "wait(stream, event): cuStreamWaitEvent."},
    {"query", FASTCALL(py_query), "query(event) -> bool: has the event completed?"},
    {"event_sync", FASTCALL(py_event_sync),
     "event_sync(event): block (without the GIL) until the event completes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "handlers.cuda._launch",
    .m_doc = "Every CUDA driver call of streamhandlers, and lean cuBLAS GEMM calls.",
    .m_size = -1,
    .m_methods = methods,
};

/* The numbers of the C side's ABI that Python passes back (GEMM kinds) or
 * hands to another binding (cuBLAS's types): Python reads them from here and
 * keeps no copy. */
static int add_constants(PyObject *m) {
    static const struct { const char *name; int value; } constants[] = {
        {"GEMM_FLOAT", GEMM_FLOAT}, {"GEMM_DOUBLE", GEMM_DOUBLE}, {"GEMM_BF16", GEMM_BF16},
        {"GEMM_F16", GEMM_F16}, {"GEMM_BF16_TO_F32", GEMM_BF16_TO_F32},
        {"GEMM_F16_TO_F32", GEMM_F16_TO_F32}, {"CUDA_R_32F", CUDA_R_32F},
        {"CUDA_R_16F", CUDA_R_16F}, {"CUDA_R_16BF", CUDA_R_16BF},
        {"CUBLAS_COMPUTE_32F", CUBLAS_COMPUTE_32F}, {"CUBLAS_GEMM_DEFAULT", CUBLAS_GEMM_DEFAULT},
    };
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; ++i)
        if (PyModule_AddIntConstant(m, constants[i].name, constants[i].value) < 0) return -1;
    return 0;
}

PyMODINIT_FUNC PyInit__launch(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && (add_constants(m) < 0 || add_one_call_type(m) < 0 ||
              add_driver_functions(m) < 0 || add_cudnn_functions(m) < 0))
        Py_CLEAR(m);
    return m;
}
