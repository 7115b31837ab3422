/* handlers.cuda._launch: 2-D convolutions through cuDNN's legacy API.
 *
 * Like the rest of the extension it builds without CUDA or cuDNN headers:
 * cudnn_load(path) dlopen's libcudnn.so.9 at run time, and the few types,
 * enum values and the one struct used here are declared below, checked
 * against cuDNN 9's headers (cudnn_graph.h, cudnn_cnn.h; see the values'
 * comments).  Handles, descriptors, plans and addresses are Python ints.
 *
 * A *plan* holds what one convolution of one geometry needs, made once and
 * cached by the caller: the tensor, filter and convolution descriptors and
 * the algorithm (from the _v7 heuristics, which only read tables on the host:
 * no device work, so planning is safe inside a stream capture), with its
 * workspace size.  Running a plan is one cuDNN call on the handle's stream.
 *
 * Every failing cuDNN call raises CudaError(call, cudnnGetErrorString, status)
 * through status_error().
 */
#include "_launch.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Enum values of cuDNN 9 (the same since cuDNN 7 for these). */
enum {
    SH_CUDNN_STATUS_SUCCESS = 0,        /* cudnnStatus_t */
    SH_CUDNN_DATA_FLOAT = 0,            /* cudnnDataType_t */
    SH_CUDNN_DATA_DOUBLE = 1,
    SH_CUDNN_TENSOR_NCHW = 0,           /* cudnnTensorFormat_t */
    SH_CUDNN_CROSS_CORRELATION = 1,     /* cudnnConvolutionMode_t (0 is CONVOLUTION) */
    SH_CUDNN_TENSOR_OP_MATH = 1,        /* cudnnMathType_t: 0 DEFAULT, 1 TENSOR_OP, */
    SH_CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2,   /* 2 ..._ALLOW_CONVERSION, */
    SH_CUDNN_FMA_MATH = 3,              /* 3 FMA (no TF32 for float data) */
    SH_CUDNN_DETERMINISTIC = 1,         /* cudnnDeterminism_t (0 NON_DETERMINISTIC) */
    /* Fallbacks when the heuristics offer nothing usable: deterministic,
     * general algorithms with small workspaces. */
    SH_CUDNN_FWD_ALGO_IMPLICIT_GEMM = 0,        /* cudnnConvolutionFwdAlgo_t */
    SH_CUDNN_BWD_DATA_ALGO_1 = 1,               /* cudnnConvolutionBwdDataAlgo_t */
    SH_CUDNN_BWD_FILTER_ALGO_1 = 1,             /* cudnnConvolutionBwdFilterAlgo_t */
};

/* cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t: one layout for the
 * three (the algo field's enum differs; every enum is an int). */
typedef struct {
    int algo;
    int status;          /* cudnnStatus_t */
    float time;
    size_t memory;       /* workspace bytes */
    int determinism;     /* cudnnDeterminism_t */
    int mathType;        /* cudnnMathType_t */
    int reserved[3];
} algo_perf;

#define MAX_PERF 16      /* more than any *_ALGO_COUNT of cuDNN 9 (8, 6, 7) */

typedef int (*create_fn)(void **);
typedef int (*destroy_fn)(void *);
typedef int (*set_stream_fn)(void *, void *);
typedef const char *(*error_string_fn)(int);
typedef size_t (*version_fn)(void);
typedef int (*set_tensor_fn)(void *, int, int, int, int, int, int);   /* desc, format, type, n,c,h,w */
typedef int (*set_filter_fn)(void *, int, int, int, int, int, int);   /* desc, type, format, k,c,h,w */
typedef int (*set_conv_fn)(void *, int, int, int, int, int, int, int, int);
typedef int (*set_math_fn)(void *, int);
/* Get*Algorithm_v7(handle, d1, d2, conv, d3, requested, *returned, *perf) */
typedef int (*algo_fn)(void *, void *, void *, void *, void *, int, int *, algo_perf *);
/* Get*WorkspaceSize(handle, d1, d2, conv, d3, algo, *bytes) */
typedef int (*ws_fn)(void *, void *, void *, void *, void *, int, size_t *);
/* Convolution*(handle, alpha, d1, p1, d2, p2, conv, algo, ws, ws bytes, beta, d3, p3) */
typedef int (*run_fn)(void *, const void *, void *, const void *, void *, const void *, void *,
                      int, void *, size_t, const void *, void *, void *);

static void *cudnn_lib;
static create_fn cudnn_create, create_tensor, create_filter, create_conv;
static destroy_fn cudnn_destroy, destroy_tensor, destroy_filter, destroy_conv;
static set_stream_fn set_stream;
static error_string_fn error_string;
static version_fn get_version;
static set_tensor_fn set_tensor;
static set_filter_fn set_filter;
static set_conv_fn set_conv;
static set_math_fn set_math;
static algo_fn algo_of[3];
static ws_fn workspace_of[3];
static run_fn run_of[3];

/* kind: 0 forward (x, w -> y), 1 backward data (dy, w -> dx), 2 backward
 * filter (x, dy -> dw).  The names of the calls, for errors. */
static const char *const ALGO_NAMES[3] = {
    "cudnnGetConvolutionForwardAlgorithm_v7", "cudnnGetConvolutionBackwardDataAlgorithm_v7",
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7"};
static const char *const WS_NAMES[3] = {
    "cudnnGetConvolutionForwardWorkspaceSize", "cudnnGetConvolutionBackwardDataWorkspaceSize",
    "cudnnGetConvolutionBackwardFilterWorkspaceSize"};
static const char *const RUN_NAMES[3] = {
    "cudnnConvolutionForward", "cudnnConvolutionBackwardData", "cudnnConvolutionBackwardFilter"};
static const int FALLBACK[3] = {SH_CUDNN_FWD_ALGO_IMPLICIT_GEMM, SH_CUDNN_BWD_DATA_ALGO_1,
                                SH_CUDNN_BWD_FILTER_ALGO_1};

typedef struct {
    int kind, dbl, algo;
    size_t workspace;
    void *x, *y, *w, *conv;   /* x: (N,C,H,W) side, y: (N,K,P,Q) side, w: (K,C,R,S) */
} conv_plan;

static PyObject *cudnn_error(const char *what, int status) {
    const char *s = error_string ? error_string(status) : NULL;
    return status_error(what, s ? s : "CUDNN_STATUS_UNKNOWN", status);
}

static int cudnn_ready(const char *what) {
    if (!cudnn_lib) {
        PyErr_Format(PyExc_RuntimeError, "%s: cuDNN is not loaded (cudnn_load first)", what);
        return 0;
    }
    return loaded(what);   /* libcuda loaded and the handlers' context current */
}

static int nargs_is(const char *what, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want) return 1;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", what, want, nargs);
    return 0;
}

static int arg_pointer(const char *what, const char *name, PyObject *o, void **out) {
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int, not %.200s", what, name,
                     Py_TYPE(o)->tp_name);
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return 0;
    if (v > UINTPTR_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s: %s does not fit a pointer", what, name);
        return 0;
    }
    *out = (void *)(uintptr_t)v;
    return 1;
}

/* An int in [lo, INT_MAX] (cuDNN's descriptor setters take ints). */
static int arg_int(const char *what, const char *name, PyObject *o, int lo, int *out) {
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int, not %.200s", what, name,
                     Py_TYPE(o)->tp_name);
        return 0;
    }
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return 0;
    if (v < lo || v > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: %s = %lld out of range [%d, %d]", what, name, v, lo,
                     INT_MAX);
        return 0;
    }
    *out = (int)v;
    return 1;
}

#define RESOLVE(var, type, symbol)                                                 \
    do {                                                                           \
        var = (type)dlsym(lib, symbol);                                            \
        if (!var) {                                                                \
            missing = symbol;                                                      \
            goto fail;                                                             \
        }                                                                          \
    } while (0)

/* cudnn_load(path): dlopen the cuDNN 9 library at `path` (a file or a
 * soname) and find its calls; once per process (later calls return at
 * once).  RuntimeError naming the path and dlerror() if it cannot. */
static PyObject *py_cudnn_load(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyUnicode_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "cudnn_load: path must be str, not %.200s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    if (cudnn_lib) Py_RETURN_NONE;
    const char *path = PyUnicode_AsUTF8(arg);
    if (!path) return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *err = dlerror();
        PyErr_Format(PyExc_RuntimeError, "cudnn_load: cannot open %s: %s", path,
                     err ? err : "unknown error");
        return NULL;
    }
    const char *missing = NULL;
    RESOLVE(cudnn_create, create_fn, "cudnnCreate");
    RESOLVE(cudnn_destroy, destroy_fn, "cudnnDestroy");
    RESOLVE(set_stream, set_stream_fn, "cudnnSetStream");
    RESOLVE(error_string, error_string_fn, "cudnnGetErrorString");
    RESOLVE(get_version, version_fn, "cudnnGetVersion");
    RESOLVE(create_tensor, create_fn, "cudnnCreateTensorDescriptor");
    RESOLVE(destroy_tensor, destroy_fn, "cudnnDestroyTensorDescriptor");
    RESOLVE(set_tensor, set_tensor_fn, "cudnnSetTensor4dDescriptor");
    RESOLVE(create_filter, create_fn, "cudnnCreateFilterDescriptor");
    RESOLVE(destroy_filter, destroy_fn, "cudnnDestroyFilterDescriptor");
    RESOLVE(set_filter, set_filter_fn, "cudnnSetFilter4dDescriptor");
    RESOLVE(create_conv, create_fn, "cudnnCreateConvolutionDescriptor");
    RESOLVE(destroy_conv, destroy_fn, "cudnnDestroyConvolutionDescriptor");
    RESOLVE(set_conv, set_conv_fn, "cudnnSetConvolution2dDescriptor");
    RESOLVE(set_math, set_math_fn, "cudnnSetConvolutionMathType");
    for (int k = 0; k < 3; ++k) {
        RESOLVE(algo_of[k], algo_fn, ALGO_NAMES[k]);
        RESOLVE(workspace_of[k], ws_fn, WS_NAMES[k]);
        RESOLVE(run_of[k], run_fn, RUN_NAMES[k]);
    }
    cudnn_lib = lib;
    Py_RETURN_NONE;
fail:
    dlclose(lib);
    error_string = NULL;
    PyErr_Format(PyExc_RuntimeError, "cudnn_load: %s has no %s (not cuDNN 9?)", path, missing);
    return NULL;
}

/* cudnn_version() -> int: cudnnGetVersion (e.g. 91400 for 9.14.0). */
static PyObject *py_cudnn_version(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    if (!cudnn_lib) {
        PyErr_SetString(PyExc_RuntimeError, "cudnn_version: cuDNN is not loaded");
        return NULL;
    }
    return PyLong_FromSize_t(get_version());
}

/* cudnn_create(stream) -> int: cudnnCreate, then cudnnSetStream(stream). */
static PyObject *py_cudnn_create(PyObject *self, PyObject *arg) {
    (void)self;
    void *stream, *handle = NULL;
    if (!arg_pointer("cudnn_create", "stream", arg, &stream)) return NULL;
    if (!cudnn_ready("cudnn_create")) return NULL;
    int st;
    Py_BEGIN_ALLOW_THREADS   /* loads cuDNN's sub-libraries on first use */
    st = cudnn_create(&handle);
    Py_END_ALLOW_THREADS
    if (st != SH_CUDNN_STATUS_SUCCESS) return cudnn_error("cudnnCreate", st);
    st = set_stream(handle, stream);
    if (st != SH_CUDNN_STATUS_SUCCESS) {
        cudnn_destroy(handle);
        return cudnn_error("cudnnSetStream", st);
    }
    return PyLong_FromVoidPtr(handle);
}

/* cudnn_destroy(handle): cudnnDestroy. */
static PyObject *py_cudnn_destroy(PyObject *self, PyObject *arg) {
    (void)self;
    void *handle;
    if (!arg_pointer("cudnn_destroy", "handle", arg, &handle)) return NULL;
    if (!handle) {
        PyErr_SetString(PyExc_ValueError, "cudnn_destroy: null handle");
        return NULL;
    }
    if (!cudnn_ready("cudnn_destroy")) return NULL;
    int st = cudnn_destroy(handle);
    if (st != SH_CUDNN_STATUS_SUCCESS) return cudnn_error("cudnnDestroy", st);
    Py_RETURN_NONE;
}

static void plan_free(conv_plan *p) {
    if (!p) return;
    if (p->x) destroy_tensor(p->x);
    if (p->y) destroy_tensor(p->y);
    if (p->w) destroy_filter(p->w);
    if (p->conv) destroy_conv(p->conv);
    free(p);
}

/* The workspace of algorithm `algo` for plan p, or (size_t)-1 where cuDNN
 * refuses it (that algorithm does not support this geometry). */
static size_t algo_workspace(conv_plan *p, void *handle, int algo) {
    size_t bytes = 0;
    int st;
    if (p->kind == 0)
        st = workspace_of[0](handle, p->x, p->w, p->conv, p->y, algo, &bytes);
    else if (p->kind == 1)
        st = workspace_of[1](handle, p->w, p->y, p->conv, p->x, algo, &bytes);
    else
        st = workspace_of[2](handle, p->x, p->y, p->conv, p->w, algo, &bytes);
    return st == SH_CUDNN_STATUS_SUCCESS ? bytes : (size_t)-1;
}

/* cudnn_conv_plan(handle, kind, double, ws_limit, n, c, h, w, k, r, s, p, q,
 * sh, sw, ph, pw, dh, dw) -> (plan, algo, workspace bytes).
 *
 * The algorithm: the first of the heuristics' list (best first) that
 * succeeded, uses no tensor-op math (float data must not run as TF32: the
 * descriptor is set to FMA math, and results that report tensor-op math are
 * skipped), is deterministic (the backward algorithms that add with atomics
 * are not), and needs at most ws_limit bytes of workspace; else the
 * deterministic fallback (IMPLICIT_GEMM, BWD_*_ALGO_1).  */
static PyObject *py_cudnn_conv_plan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "cudnn_conv_plan";
    void *handle;
    int kind, dbl, n, c, h, w, k, r, s, p, q, sh, sw, ph, pw, dh, dw;
    long long ws_limit;
    if (!nargs_is(what, nargs, 19) || !arg_pointer(what, "handle", args[0], &handle) ||
        !arg_int(what, "kind", args[1], 0, &kind) || !arg_int(what, "double", args[2], 0, &dbl))
        return NULL;
    ws_limit = PyLong_AsLongLong(args[3]);
    if (ws_limit == -1 && PyErr_Occurred()) return NULL;
    if (kind > 2) {
        PyErr_Format(PyExc_ValueError, "%s: kind must be 0, 1 or 2, got %d", what, kind);
        return NULL;
    }
    int *dims[] = {&n, &c, &h, &w, &k, &r, &s, &p, &q, &sh, &sw, &ph, &pw, &dh, &dw};
    static const char *const names[] = {"n", "c", "h", "w", "k", "r", "s", "p", "q",
                                        "sh", "sw", "ph", "pw", "dh", "dw"};
    for (int i = 0; i < 15; ++i) {
        int lo = (i == 11 || i == 12) ? 0 : 1;   /* padding may be 0 */
        if (!arg_int(what, names[i], args[4 + i], lo, dims[i])) return NULL;
    }
    if (!cudnn_ready(what)) return NULL;
    conv_plan *pl = calloc(1, sizeof *pl);
    if (!pl) return PyErr_NoMemory();
    pl->kind = kind;
    pl->dbl = dbl != 0;
    int type = dbl ? SH_CUDNN_DATA_DOUBLE : SH_CUDNN_DATA_FLOAT;
    int st;
    const char *call;
#define TRY(name, expr)                                                            \
    do {                                                                           \
        call = name;                                                               \
        st = (expr);                                                               \
        if (st != SH_CUDNN_STATUS_SUCCESS) goto fail;                              \
    } while (0)
    TRY("cudnnCreateTensorDescriptor", create_tensor(&pl->x));
    TRY("cudnnCreateTensorDescriptor", create_tensor(&pl->y));
    TRY("cudnnCreateFilterDescriptor", create_filter(&pl->w));
    TRY("cudnnCreateConvolutionDescriptor", create_conv(&pl->conv));
    TRY("cudnnSetTensor4dDescriptor", set_tensor(pl->x, SH_CUDNN_TENSOR_NCHW, type, n, c, h, w));
    TRY("cudnnSetTensor4dDescriptor", set_tensor(pl->y, SH_CUDNN_TENSOR_NCHW, type, n, k, p, q));
    TRY("cudnnSetFilter4dDescriptor", set_filter(pl->w, type, SH_CUDNN_TENSOR_NCHW, k, c, r, s));
    /* computeType = the data type: float accumulates in float, double in double */
    TRY("cudnnSetConvolution2dDescriptor",
        set_conv(pl->conv, ph, pw, sh, sw, dh, dw, SH_CUDNN_CROSS_CORRELATION, type));
    TRY("cudnnSetConvolutionMathType", set_math(pl->conv, SH_CUDNN_FMA_MATH));
    algo_perf perf[MAX_PERF];
    memset(perf, 0, sizeof perf);
    int got = 0;
    call = ALGO_NAMES[kind];
    if (kind == 0)
        st = algo_of[0](handle, pl->x, pl->w, pl->conv, pl->y, MAX_PERF, &got, perf);
    else if (kind == 1)
        st = algo_of[1](handle, pl->w, pl->y, pl->conv, pl->x, MAX_PERF, &got, perf);
    else
        st = algo_of[2](handle, pl->x, pl->y, pl->conv, pl->w, MAX_PERF, &got, perf);
    if (st != SH_CUDNN_STATUS_SUCCESS) goto fail;
    if (got > MAX_PERF) got = MAX_PERF;
    pl->algo = -1;
    for (int i = 0; i < got && pl->algo < 0; ++i) {
        const algo_perf *a = &perf[i];
        if (a->status != SH_CUDNN_STATUS_SUCCESS || a->mathType == SH_CUDNN_TENSOR_OP_MATH ||
            a->mathType == SH_CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ||
            (kind != 0 && a->determinism != SH_CUDNN_DETERMINISTIC))
            continue;
        size_t bytes = algo_workspace(pl, handle, a->algo);
        if (bytes == (size_t)-1 || (ws_limit >= 0 && bytes > (unsigned long long)ws_limit))
            continue;
        pl->algo = a->algo;
        pl->workspace = bytes;
    }
    if (pl->algo < 0) {
        call = WS_NAMES[kind];
        size_t bytes = 0;
        int algo = FALLBACK[kind];
        if (kind == 0)
            st = workspace_of[0](handle, pl->x, pl->w, pl->conv, pl->y, algo, &bytes);
        else if (kind == 1)
            st = workspace_of[1](handle, pl->w, pl->y, pl->conv, pl->x, algo, &bytes);
        else
            st = workspace_of[2](handle, pl->x, pl->y, pl->conv, pl->w, algo, &bytes);
        if (st != SH_CUDNN_STATUS_SUCCESS) goto fail;
        pl->algo = algo;
        pl->workspace = bytes;
    }
#undef TRY
    return Py_BuildValue("(NiK)", PyLong_FromVoidPtr(pl), pl->algo,
                         (unsigned long long)pl->workspace);
fail:
    plan_free(pl);
    return cudnn_error(call, st);
}

/* cudnn_conv_run(plan, handle, a, b, out, workspace): out = the plan's
 * convolution of a and b (alpha 1, beta 0: out is overwritten), on the
 * handle's stream.  (a, b, out) are (x, w, y) forward, (dy, w, dx) backward
 * data, (x, dy, dw) backward filter; `workspace` holds at least the plan's
 * workspace bytes (0 if it needs none). */
static PyObject *py_cudnn_conv_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "cudnn_conv_run";
    void *plan, *handle, *a, *b, *out, *ws;
    if (!nargs_is(what, nargs, 6) || !arg_pointer(what, "plan", args[0], &plan) ||
        !arg_pointer(what, "handle", args[1], &handle) ||
        !arg_pointer(what, "a", args[2], &a) || !arg_pointer(what, "b", args[3], &b) ||
        !arg_pointer(what, "out", args[4], &out) ||
        !arg_pointer(what, "workspace", args[5], &ws))
        return NULL;
    if (!plan || !handle || !a || !b || !out) {
        PyErr_Format(PyExc_ValueError, "%s: null plan, handle or array", what);
        return NULL;
    }
    conv_plan *p = plan;
    if (p->workspace && !ws) {
        PyErr_Format(PyExc_ValueError, "%s: the plan needs %zu bytes of workspace", what,
                     p->workspace);
        return NULL;
    }
    if (!cudnn_ready(what)) return NULL;
    /* alpha and beta are host scalars of the data's type (double for double
     * data, float otherwise), as cuDNN reads them. */
    const float one_f = 1.0f, zero_f = 0.0f;
    const double one_d = 1.0, zero_d = 0.0;
    const void *alpha = p->dbl ? (const void *)&one_d : (const void *)&one_f;
    const void *beta = p->dbl ? (const void *)&zero_d : (const void *)&zero_f;
    int st;
    if (p->kind == 0)
        st = run_of[0](handle, alpha, p->x, a, p->w, b, p->conv, p->algo, ws, p->workspace, beta,
                       p->y, out);
    else if (p->kind == 1)
        st = run_of[1](handle, alpha, p->w, b, p->y, a, p->conv, p->algo, ws, p->workspace, beta,
                       p->x, out);
    else
        st = run_of[2](handle, alpha, p->x, a, p->y, b, p->conv, p->algo, ws, p->workspace, beta,
                       p->w, out);
    if (st != SH_CUDNN_STATUS_SUCCESS) return cudnn_error(RUN_NAMES[p->kind], st);
    Py_RETURN_NONE;
}

/* cudnn_plan_free(plan): destroy a plan's descriptors (no device work). */
static PyObject *py_cudnn_plan_free(PyObject *self, PyObject *arg) {
    (void)self;
    void *plan;
    if (!arg_pointer("cudnn_plan_free", "plan", arg, &plan)) return NULL;
    if (plan) {
        if (!cudnn_lib) {
            PyErr_SetString(PyExc_RuntimeError, "cudnn_plan_free: cuDNN is not loaded");
            return NULL;
        }
        plan_free(plan);
    }
    Py_RETURN_NONE;
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

static PyMethodDef cudnn_methods[] = {
    {"cudnn_load", py_cudnn_load, METH_O,
     "cudnn_load(path): dlopen cuDNN 9 (a path or soname) once; RuntimeError if it cannot."},
    {"cudnn_version", py_cudnn_version, METH_NOARGS, "cudnn_version() -> int: cudnnGetVersion."},
    {"cudnn_create", py_cudnn_create, METH_O,
     "cudnn_create(stream) -> int: a cudnnHandle_t bound to `stream` (cudnnSetStream)."},
    {"cudnn_destroy", py_cudnn_destroy, METH_O, "cudnn_destroy(handle): cudnnDestroy."},
    {"cudnn_conv_plan", FASTCALL(py_cudnn_conv_plan),
     "cudnn_conv_plan(handle, kind, double, ws_limit, n, c, h, w, k, r, s, p, q, sh, sw, ph, "
     "pw, dh, dw) -> (plan, algo, workspace bytes); kind 0 forward, 1 backward data, 2 "
     "backward filter."},
    {"cudnn_conv_run", FASTCALL(py_cudnn_conv_run),
     "cudnn_conv_run(plan, handle, a, b, out, workspace): run a plan on the handle's stream."},
    {"cudnn_plan_free", py_cudnn_plan_free, METH_O,
     "cudnn_plan_free(plan): destroy a plan's descriptors."},
    {NULL, NULL, 0, NULL},
};

int add_cudnn_functions(PyObject *module) {
    return PyModule_AddFunctions(module, cudnn_methods);
}
