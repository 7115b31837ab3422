/* handlers.cuda._launch: 2-D convolutions through cuDNN's backend (graph) API.
 *
 * Like the rest of the extension it builds without CUDA or cuDNN headers:
 * cudnn_load(path) dlopen's libcudnn.so.9 at run time, and the few enum
 * values used here are declared below, checked against cuDNN 9's
 * cudnn_graph.h (see the values' comments).  Handles, plans and addresses
 * are Python ints.
 *
 * Why the backend API rather than cudnnConvolutionForward and its kin: in
 * cuDNN 9 the legacy entry points are a shim over this API that rebuilds its
 * objects on every call.  On an H100 one legacy call of a LeNet-sized
 * convolution cost 28-65 us of host time for 6-28 us of device work, so a
 * small network was host-bound at twice PyTorch's time.
 *
 * A *plan* holds what one convolution of one geometry needs, made once and
 * cached by the caller: the tensor, convolution and operation descriptors,
 * the operation graph and the finalized execution plan of the engine chosen
 * from cuDNN's heuristics, with its workspace size.  Running a plan is one
 * cudnnBackendExecute on the handle's stream with a variant pack (the data
 * addresses), which the plan keeps and rebuilds only when the addresses
 * change.
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

/* Enum values of cuDNN 9 (cudnn_graph.h). */
enum {
    SH_CUDNN_STATUS_SUCCESS = 0,        /* cudnnStatus_t */
    SH_CUDNN_DATA_FLOAT = 0,            /* cudnnDataType_t */
    SH_CUDNN_DATA_DOUBLE = 1,
    SH_CUDNN_DATA_HALF = 2,
    SH_CUDNN_DATA_BFLOAT16 = 9,
    SH_CUDNN_CROSS_CORRELATION = 1,     /* cudnnConvolutionMode_t (0 is CONVOLUTION) */
    /* cudnnBackendDescriptorType_t */
    SH_DESC_CONVOLUTION = 1, SH_DESC_ENGINE = 2, SH_DESC_ENGINECFG = 3, SH_DESC_ENGINEHEUR = 4,
    SH_DESC_EXECUTION_PLAN = 5, SH_DESC_OP_CONV_FORWARD = 10, SH_DESC_OP_CONV_BWD_FILTER = 11,
    SH_DESC_OP_CONV_BWD_DATA = 12, SH_DESC_OPERATIONGRAPH = 15, SH_DESC_VARIANT_PACK = 16,
    SH_DESC_TENSOR = 17, SH_DESC_POINTWISE = 0, SH_DESC_OP_POINTWISE = 13,
    /* cudnnBackendAttributeType_t */
    SH_TYPE_HANDLE = 0, SH_TYPE_DATA_TYPE = 1, SH_TYPE_BOOLEAN = 2, SH_TYPE_INT64 = 3,
    SH_TYPE_FLOAT = 4, SH_TYPE_POINTWISE_MODE = 14,
    SH_TYPE_DOUBLE = 5, SH_TYPE_VOID_PTR = 6, SH_TYPE_CONVOLUTION_MODE = 7, SH_TYPE_HEUR_MODE = 8,
    SH_TYPE_NUMERICAL_NOTE = 11, SH_TYPE_BACKEND_DESCRIPTOR = 15, SH_TYPE_BEHAVIOR_NOTE = 19,
    /* cudnnBackendAttributeName_t */
    SH_ATTR_POINTWISE_MODE = 0, SH_ATTR_POINTWISE_MATH_PREC = 1,
    SH_ATTR_CONVOLUTION_COMP_TYPE = 100, SH_ATTR_CONVOLUTION_CONV_MODE = 101,
    SH_ATTR_CONVOLUTION_DILATIONS = 102, SH_ATTR_CONVOLUTION_FILTER_STRIDES = 103,
    SH_ATTR_CONVOLUTION_POST_PADDINGS = 104, SH_ATTR_CONVOLUTION_PRE_PADDINGS = 105,
    SH_ATTR_CONVOLUTION_SPATIAL_DIMS = 106,
    SH_ATTR_ENGINEHEUR_MODE = 200, SH_ATTR_ENGINEHEUR_OPERATION_GRAPH = 201,
    SH_ATTR_ENGINEHEUR_RESULTS = 202,
    SH_ATTR_ENGINECFG_ENGINE = 300,
    SH_ATTR_EXECUTION_PLAN_HANDLE = 400, SH_ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 401,
    SH_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE = 402,
    /* the operations' alpha, beta, conv descriptor and three tensors, in the
     * order forward (x w y), backward data (w dx dy), backward filter (dw x dy) */
    SH_ATTR_OP_CONV_FORWARD_ALPHA = 700, SH_ATTR_OP_CONV_BWD_DATA_ALPHA = 706,
    SH_ATTR_OP_CONV_BWD_FILTER_ALPHA = 712,
    SH_ATTR_OP_POINTWISE_PW_DESCRIPTOR = 750, SH_ATTR_OP_POINTWISE_XDESC = 751,
    SH_ATTR_OP_POINTWISE_BDESC = 752, SH_ATTR_OP_POINTWISE_YDESC = 753,
    SH_ATTR_OPERATIONGRAPH_HANDLE = 800, SH_ATTR_OPERATIONGRAPH_OPS = 801,
    SH_ATTR_TENSOR_BYTE_ALIGNMENT = 900, SH_ATTR_TENSOR_DATA_TYPE = 901,
    SH_ATTR_TENSOR_DIMENSIONS = 902, SH_ATTR_TENSOR_STRIDES = 903,
    SH_ATTR_TENSOR_UNIQUE_ID = 906, SH_ATTR_TENSOR_IS_VIRTUAL = 907,
    SH_ATTR_VARIANT_PACK_UNIQUE_IDS = 1000, SH_ATTR_VARIANT_PACK_DATA_POINTERS = 1001,
    SH_ATTR_VARIANT_PACK_WORKSPACE = 1003,
    SH_ATTR_ENGINE_GLOBAL_INDEX = 1301, SH_ATTR_ENGINE_NUMERICAL_NOTE = 1303,
    SH_ATTR_ENGINE_BEHAVIOR_NOTE = 1305,
    SH_BEHAVIOR_RUNTIME_COMPILATION = 0,   /* cudnnBackendBehaviorNote_t */
    SH_HEUR_MODE_FALLBACK = 2, SH_HEUR_MODE_A = 3,   /* cudnnBackendHeurMode_t */
    SH_POINTWISE_ADD = 0, SH_POINTWISE_RELU_FWD = 100,  /* cudnnPointwiseMode_t */
};

/* The tensors' unique ids: the variant pack's (x, w, y and a fused
 * forward's bias), then the fused forward's virtual intermediates. */
enum { UID_X = 1, UID_W = 2, UID_Y = 3, UID_B = 4, UID_Z = 5, UID_S = 6 };

#define MAX_DENIED 16    /* engines a plan may deny by index */
#define MAX_NOTES 32     /* more than CUDNN_NUMERICAL_NOTE_TYPE_COUNT (10); a note
                            * (cudnnBackendNumericalNote_t) is bit `note` of a mask */

typedef int (*create_fn)(void **);
typedef int (*destroy_fn)(void *);
typedef int (*set_stream_fn)(void *, void *);
typedef const char *(*error_string_fn)(int);
typedef size_t (*version_fn)(void);
typedef int (*be_create_fn)(int, void **);
typedef int (*be_finalize_fn)(void *);
typedef int (*be_set_fn)(void *, int, int, int64_t, const void *);
typedef int (*be_get_fn)(void *, int, int, int64_t, int64_t *, void *);
typedef int (*be_execute_fn)(void *, void *, void *);

static void *cudnn_lib;
static create_fn cudnn_create;
static destroy_fn cudnn_destroy, be_destroy;
static set_stream_fn set_stream;
static error_string_fn error_string;
static version_fn get_version;
static be_create_fn be_create;
static be_finalize_fn be_finalize;
static be_set_fn be_set;
static be_get_fn be_get;
static be_execute_fn be_execute;

/* kind: 0 forward (x, w -> y), 1 backward data (dy, w -> dx), 2 backward
 * filter (x, dy -> dw); the fused forwards 3 (y = conv + b) and 4 (y =
 * relu(conv + b)), b one value per output channel, are forward
 * convolutions followed by pointwise operations in one graph. */
#define N_KINDS 5
#define FUSED(kind) ((kind) >= 3)
#define PASS(kind) (FUSED(kind) ? 0 : (kind))   /* the pass a kind runs */
static const int OP_DESC[3] = {SH_DESC_OP_CONV_FORWARD, SH_DESC_OP_CONV_BWD_DATA,
                               SH_DESC_OP_CONV_BWD_FILTER};
static const int OP_ALPHA[3] = {SH_ATTR_OP_CONV_FORWARD_ALPHA, SH_ATTR_OP_CONV_BWD_DATA_ALPHA,
                                SH_ATTR_OP_CONV_BWD_FILTER_ALPHA};

/* Which engines a plan may take: the caller's policy, needed while planning only. */
typedef struct {
    long long refused;         /* numerical notes (a mask) the engine may not carry */
    int n_denied;              /* engines (global indices) never chosen */
    long long denied[MAX_DENIED];
    int rtc;                   /* 1: engines compiled at runtime allowed, after the others */
} engine_policy;

typedef struct {
    int kind;
    long long engine;          /* the chosen engine's global index (for reports) */
    long long notes;           /* and its numerical notes, a mask (for reports) */
    size_t workspace;
    void *x, *w, *y, *conv, *op, *graph, *cfg, *exec;
    /* a fused forward's: the bias, the virtual conv (z) and z + b (s)
     * tensors, and its pointwise descriptors and operations (add, relu) */
    void *b, *z, *s, *pw[2], *pw_op[2];
    void *pack;                /* the variant pack of `ptrs`, or NULL */
    void *ptrs[5];             /* x, w, y, bias (or NULL) and workspace addresses of `pack` */
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
    RESOLVE(be_create, be_create_fn, "cudnnBackendCreateDescriptor");
    RESOLVE(be_destroy, destroy_fn, "cudnnBackendDestroyDescriptor");
    RESOLVE(be_finalize, be_finalize_fn, "cudnnBackendFinalize");
    RESOLVE(be_set, be_set_fn, "cudnnBackendSetAttribute");
    RESOLVE(be_get, be_get_fn, "cudnnBackendGetAttribute");
    RESOLVE(be_execute, be_execute_fn, "cudnnBackendExecute");
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

static void plan_release_pack(conv_plan *p) {
    if (p->pack) be_destroy(p->pack);
    p->pack = NULL;
}

static void plan_free(conv_plan *p) {
    if (!p) return;
    plan_release_pack(p);
    void *descs[] = {p->exec, p->cfg, p->graph, p->pw_op[1], p->pw_op[0], p->pw[1], p->pw[0],
                     p->op, p->conv, p->s, p->z, p->b, p->x, p->w, p->y};
    for (size_t i = 0; i < sizeof descs / sizeof *descs; ++i)
        if (descs[i]) be_destroy(descs[i]);
    free(p);
}

/* A finalized NCHW tensor descriptor (dims d, packed strides) with id uid;
 * `virt`: an intermediate of the graph, in no variant pack. */
static int make_tensor(void **desc, int type, const int64_t d[4], int64_t uid, int64_t align,
                       int virt, const char **call) {
    const _Bool is_virtual = virt != 0;
    int64_t strides[4] = {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
    int st;
    *call = "cudnnBackendCreateDescriptor(TENSOR)";
    if ((st = be_create(SH_DESC_TENSOR, desc))) return st;
    *call = "cudnnBackendSetAttribute(TENSOR)";
    if ((st = be_set(*desc, SH_ATTR_TENSOR_DATA_TYPE, SH_TYPE_DATA_TYPE, 1, &type)) ||
        (st = be_set(*desc, SH_ATTR_TENSOR_DIMENSIONS, SH_TYPE_INT64, 4, d)) ||
        (st = be_set(*desc, SH_ATTR_TENSOR_STRIDES, SH_TYPE_INT64, 4, strides)) ||
        (st = be_set(*desc, SH_ATTR_TENSOR_UNIQUE_ID, SH_TYPE_INT64, 1, &uid)) ||
        (st = be_set(*desc, SH_ATTR_TENSOR_BYTE_ALIGNMENT, SH_TYPE_INT64, 1, &align)) ||
        (virt && (st = be_set(*desc, SH_ATTR_TENSOR_IS_VIRTUAL, SH_TYPE_BOOLEAN, 1,
                              &is_virtual))))
        return st;
    *call = "cudnnBackendFinalize(TENSOR)";
    return be_finalize(*desc);
}

/* A finalized pointwise operation y = mode(x) or mode(x, b) (b NULL: none),
 * computing in `prec`, and its pointwise descriptor. */
static int make_pointwise(void **pw, void **op, int mode, int prec, void *x, void *b, void *y,
                          const char **call) {
    int st;
    *call = "cudnnBackendCreateDescriptor(POINTWISE)";
    if ((st = be_create(SH_DESC_POINTWISE, pw))) return st;
    *call = "cudnnBackendSetAttribute(POINTWISE)";
    if ((st = be_set(*pw, SH_ATTR_POINTWISE_MODE, SH_TYPE_POINTWISE_MODE, 1, &mode)) ||
        (st = be_set(*pw, SH_ATTR_POINTWISE_MATH_PREC, SH_TYPE_DATA_TYPE, 1, &prec)))
        return st;
    *call = "cudnnBackendFinalize(POINTWISE)";
    if ((st = be_finalize(*pw))) return st;
    *call = "cudnnBackendCreateDescriptor(OPERATION_POINTWISE)";
    if ((st = be_create(SH_DESC_OP_POINTWISE, op))) return st;
    *call = "cudnnBackendSetAttribute(OPERATION_POINTWISE)";
    if ((st = be_set(*op, SH_ATTR_OP_POINTWISE_PW_DESCRIPTOR, SH_TYPE_BACKEND_DESCRIPTOR, 1,
                     pw)) ||
        (st = be_set(*op, SH_ATTR_OP_POINTWISE_XDESC, SH_TYPE_BACKEND_DESCRIPTOR, 1, &x)) ||
        (b && (st = be_set(*op, SH_ATTR_OP_POINTWISE_BDESC, SH_TYPE_BACKEND_DESCRIPTOR, 1,
                           &b))) ||
        (st = be_set(*op, SH_ATTR_OP_POINTWISE_YDESC, SH_TYPE_BACKEND_DESCRIPTOR, 1, &y)))
        return st;
    *call = "cudnnBackendFinalize(OPERATION_POINTWISE)";
    return be_finalize(*op);
}

/* Whether engine configuration cfg may run a plan under `policy`: its engine
 * is not a denied one, carries none of the refused numerical notes, and,
 * unless allow_rtc, needs no runtime compilation (which can take seconds at
 * first use).  Sets *engine to the engine's global index and *mask to its
 * notes. */
static int engine_usable(void *cfg, const engine_policy *policy, int allow_rtc,
                         long long *engine, long long *mask) {
    void *eng = NULL;
    int ok = 0;
    int64_t n = 0, index = -1;
    int notes[MAX_NOTES];
    long long have = 0;
    if (be_create(SH_DESC_ENGINE, &eng)) return 0;
    if (be_get(cfg, SH_ATTR_ENGINECFG_ENGINE, SH_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) || n != 1)
        goto done;
    n = 0;
    if (be_get(eng, SH_ATTR_ENGINE_GLOBAL_INDEX, SH_TYPE_INT64, 1, &n, &index) || n != 1)
        index = -1;
    for (int i = 0; i < policy->n_denied; ++i)
        if (index == policy->denied[i]) goto done;
    n = 0;
    if (be_get(eng, SH_ATTR_ENGINE_NUMERICAL_NOTE, SH_TYPE_NUMERICAL_NOTE, MAX_NOTES, &n, notes))
        goto done;
    for (int64_t i = 0; i < n && i < MAX_NOTES; ++i)
        if (notes[i] >= 0 && notes[i] < 63) have |= 1LL << notes[i];
    if (have & policy->refused) goto done;
    n = 0;
    if (!allow_rtc &&
        !be_get(eng, SH_ATTR_ENGINE_BEHAVIOR_NOTE, SH_TYPE_BEHAVIOR_NOTE, MAX_NOTES, &n, notes))
        for (int64_t i = 0; i < n && i < MAX_NOTES; ++i)
            if (notes[i] == SH_BEHAVIOR_RUNTIME_COMPILATION) goto done;
    *engine = index;
    *mask = have;
    ok = 1;
done:
    be_destroy(eng);
    return ok;
}

/* Try the engine configurations of heuristics `mode` in order (best first)
 * and keep the first one usable under `policy` that finalizes into an execution plan within
 * ws_limit bytes of workspace (negative: no limit).  Returns a cuDNN status;
 * *found is 1 when pl->cfg and pl->exec were set. */
static int choose_engine(conv_plan *pl, const engine_policy *policy, void *handle, int mode,
                         int allow_rtc, long long ws_limit, int *found, const char **call) {
    void *heur = NULL, **cfgs = NULL;
    int64_t count = 0;
    int st;
    *found = 0;
    *call = "cudnnBackendCreateDescriptor(ENGINEHEUR)";
    if ((st = be_create(SH_DESC_ENGINEHEUR, &heur))) return st;
    *call = "cudnnBackendSetAttribute(ENGINEHEUR)";
    if ((st = be_set(heur, SH_ATTR_ENGINEHEUR_OPERATION_GRAPH, SH_TYPE_BACKEND_DESCRIPTOR, 1,
                     &pl->graph)) ||
        (st = be_set(heur, SH_ATTR_ENGINEHEUR_MODE, SH_TYPE_HEUR_MODE, 1, &mode)))
        goto out;
    *call = "cudnnBackendFinalize(ENGINEHEUR)";
    if ((st = be_finalize(heur))) goto out;
    *call = "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS)";
    if ((st = be_get(heur, SH_ATTR_ENGINEHEUR_RESULTS, SH_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                     NULL)))
        goto out;
    if (count <= 0) goto out;
    cfgs = calloc((size_t)count, sizeof *cfgs);
    if (!cfgs) { st = -1; *call = "calloc"; goto out; }
    int64_t made = 0;
    for (; made < count; ++made)
        if ((st = be_create(SH_DESC_ENGINECFG, &cfgs[made]))) goto out;
    int64_t got = 0;
    if ((st = be_get(heur, SH_ATTR_ENGINEHEUR_RESULTS, SH_TYPE_BACKEND_DESCRIPTOR, count, &got,
                     cfgs)))
        goto out;
    for (int64_t i = 0; i < got && i < count && !*found; ++i) {
        long long engine = -1, notes = 0;
        if (!engine_usable(cfgs[i], policy, allow_rtc, &engine, &notes)) continue;
        void *exec = NULL;
        int64_t ws = 0, n = 0;
        if (be_create(SH_DESC_EXECUTION_PLAN, &exec)) continue;
        if (be_set(exec, SH_ATTR_EXECUTION_PLAN_HANDLE, SH_TYPE_HANDLE, 1, &handle) ||
            be_set(exec, SH_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, SH_TYPE_BACKEND_DESCRIPTOR, 1,
                   &cfgs[i]) ||
            be_finalize(exec) ||
            be_get(exec, SH_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, SH_TYPE_INT64, 1, &n, &ws) ||
            ws < 0 || (ws_limit >= 0 && ws > ws_limit)) {
            be_destroy(exec);
            continue;
        }
        pl->exec = exec;
        pl->cfg = cfgs[i];
        cfgs[i] = NULL;        /* kept by the plan */
        pl->workspace = (size_t)ws;
        pl->engine = engine;
        pl->notes = notes;
        *found = 1;
    }
    st = SH_CUDNN_STATUS_SUCCESS;
out:
    if (cfgs)
        for (int64_t i = 0; i < count; ++i)
            if (cfgs[i]) be_destroy(cfgs[i]);
    free(cfgs);
    be_destroy(heur);
    return st;
}

/* cudnn_conv_plan(handle, kind, format, ws_limit, align, refused, denied, rtc,
 * n, c, h, w, k, r, s, p, q, sh, sw, ph, pw, dh, dw) -> (plan, engine, notes,
 * workspace bytes), or None when no engine qualifies.  `kind`: 0 to 4 (see
 * OP_DESC; the fused forwards' n, c, ... are the forward's).  `format`: 0 float, 1
 * double, 2 bfloat16, 3 float16 (blas.KINDS' numbers); the caller's policy:
 * `refused`, the mask of numerical notes no engine may carry (bit `note` of
 * cudnnBackendNumericalNote_t), `denied`, a tuple of engine global indices
 * never to choose, and `rtc`, 1 to allow runtime-compiled engines; `notes`:
 * the chosen engine's.
 *
 * The engine: the first of cuDNN's heuristics (mode A, best first) that
 * engine_usable accepts, finalizes on this GPU and needs at most ws_limit
 * bytes of workspace; failing that the same over the fallback heuristics,
 * then, with `rtc`, both again allowing runtime-compiled engines.  `align` is the byte
 * alignment every address given to cudnn_conv_run will have (1 to 16): the
 * caller keys its plans on it.  Planning is host work only, so it may run
 * inside a stream capture. */
static PyObject *py_cudnn_conv_plan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "cudnn_conv_plan";
    void *handle;
    int kind, format, align, dims[15];
    long long ws_limit;
    engine_policy policy;
    if (!nargs_is(what, nargs, 23) || !arg_pointer(what, "handle", args[0], &handle) ||
        !arg_int(what, "kind", args[1], 0, &kind) || !arg_int(what, "format", args[2], 0, &format))
        return NULL;
    ws_limit = PyLong_AsLongLong(args[3]);
    if (ws_limit == -1 && PyErr_Occurred()) return NULL;
    if (!arg_int(what, "align", args[4], 1, &align)) return NULL;
    policy.refused = PyLong_AsLongLong(args[5]);
    if (policy.refused == -1 && PyErr_Occurred()) return NULL;
    if (!PyTuple_Check(args[6]) || PyTuple_GET_SIZE(args[6]) > MAX_DENIED) {
        PyErr_Format(PyExc_TypeError, "%s: denied must be a tuple of at most %d engine indices",
                     what, MAX_DENIED);
        return NULL;
    }
    policy.n_denied = (int)PyTuple_GET_SIZE(args[6]);
    for (int i = 0; i < policy.n_denied; ++i) {
        policy.denied[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(args[6], i));
        if (policy.denied[i] == -1 && PyErr_Occurred()) return NULL;
    }
    if (!arg_int(what, "rtc", args[7], 0, &policy.rtc)) return NULL;
    policy.rtc = policy.rtc != 0;
    if (kind >= N_KINDS || format > 3) {
        PyErr_Format(PyExc_ValueError, "%s: kind must be 0 to %d and format 0 to 3, got %d, %d",
                     what, N_KINDS - 1, kind, format);
        return NULL;
    }
    static const char *const names[] = {"n", "c", "h", "w", "k", "r", "s", "p", "q",
                                        "sh", "sw", "ph", "pw", "dh", "dw"};
    for (int i = 0; i < 15; ++i) {
        int lo = (i == 11 || i == 12) ? 0 : 1;   /* padding may be 0 */
        if (!arg_int(what, names[i], args[8 + i], lo, &dims[i])) return NULL;
    }
    if (!cudnn_ready(what)) return NULL;
    const int64_t xd[4] = {dims[0], dims[1], dims[2], dims[3]};
    const int64_t wd[4] = {dims[4], dims[1], dims[5], dims[6]};
    const int64_t yd[4] = {dims[0], dims[4], dims[7], dims[8]};
    const int64_t stride[2] = {dims[9], dims[10]}, pad[2] = {dims[11], dims[12]};
    const int64_t dil[2] = {dims[13], dims[14]}, spatial = 2;
    conv_plan *pl = calloc(1, sizeof *pl);
    if (!pl) return PyErr_NoMemory();
    pl->kind = kind;
    /* format: 0 float, 1 double, 2 bfloat16, 3 float16.  The half formats
     * compute in float (and take float alpha and beta). */
    static const int types[4] = {SH_CUDNN_DATA_FLOAT, SH_CUDNN_DATA_DOUBLE,
                                 SH_CUDNN_DATA_BFLOAT16, SH_CUDNN_DATA_HALF};
    const int dbl = format == 1;
    pl->engine = -1;
    int type = types[format], comp = format >= 2 ? SH_CUDNN_DATA_FLOAT : type;
    int mode = SH_CUDNN_CROSS_CORRELATION;
    int64_t al = align;
    int st;
    const char *call = "";
#define TRY(name, expr)                                                            \
    do {                                                                           \
        call = name;                                                               \
        if ((st = (expr)) != SH_CUDNN_STATUS_SUCCESS) goto fail;                   \
    } while (0)
    const int fused = FUSED(kind), pass = PASS(kind);
    const int64_t bd[4] = {1, dims[4], 1, 1};
    /* a fused forward: the convolution into z (virtual, in the compute
     * type), s = z + b (virtual too where the activation follows), y */
    if ((st = make_tensor(&pl->x, type, xd, UID_X, al, 0, &call)) ||
        (st = make_tensor(&pl->w, type, wd, UID_W, al, 0, &call)) ||
        (st = make_tensor(&pl->y, type, yd, UID_Y, al, 0, &call)) ||
        (fused && ((st = make_tensor(&pl->b, type, bd, UID_B, al, 0, &call)) ||
                   (st = make_tensor(&pl->z, comp, yd, UID_Z, al, 1, &call)))) ||
        (kind == 4 && (st = make_tensor(&pl->s, comp, yd, UID_S, al, 1, &call))))
        goto fail;
    TRY("cudnnBackendCreateDescriptor(CONVOLUTION)", be_create(SH_DESC_CONVOLUTION, &pl->conv));
    call = "cudnnBackendSetAttribute(CONVOLUTION)";
    /* the compute type: float accumulates in float, double in double, the
     * half formats in float */
    if ((st = be_set(pl->conv, SH_ATTR_CONVOLUTION_SPATIAL_DIMS, SH_TYPE_INT64, 1, &spatial)) ||
        (st = be_set(pl->conv, SH_ATTR_CONVOLUTION_COMP_TYPE, SH_TYPE_DATA_TYPE, 1, &comp)) ||
        (st = be_set(pl->conv, SH_ATTR_CONVOLUTION_CONV_MODE, SH_TYPE_CONVOLUTION_MODE, 1,
                     &mode)) ||
        (st = be_set(pl->conv, SH_ATTR_CONVOLUTION_FILTER_STRIDES, SH_TYPE_INT64, 2, stride)) ||
        (st = be_set(pl->conv, SH_ATTR_CONVOLUTION_PRE_PADDINGS, SH_TYPE_INT64, 2, pad)) ||
        (st = be_set(pl->conv, SH_ATTR_CONVOLUTION_POST_PADDINGS, SH_TYPE_INT64, 2, pad)) ||
        (st = be_set(pl->conv, SH_ATTR_CONVOLUTION_DILATIONS, SH_TYPE_INT64, 2, dil)))
        goto fail;
    TRY("cudnnBackendFinalize(CONVOLUTION)", be_finalize(pl->conv));
    TRY("cudnnBackendCreateDescriptor(OPERATION_CONVOLUTION)", be_create(OP_DESC[pass], &pl->op));
    /* Each operation's attributes follow its alpha: beta, conv, then the
     * w-side, x-side and y-side tensors (cudnn_graph.h). */
    const int base = OP_ALPHA[pass];
    const float one_f = 1.0f, zero_f = 0.0f;
    const double one_d = 1.0, zero_d = 0.0;
    const int scalar = dbl ? SH_TYPE_DOUBLE : SH_TYPE_FLOAT;
    call = "cudnnBackendSetAttribute(OPERATION_CONVOLUTION)";
    if ((st = be_set(pl->op, base, scalar, 1, dbl ? (const void *)&one_d : (const void *)&one_f)) ||
        (st = be_set(pl->op, base + 1, scalar, 1,
                     dbl ? (const void *)&zero_d : (const void *)&zero_f)) ||
        (st = be_set(pl->op, base + 2, SH_TYPE_BACKEND_DESCRIPTOR, 1, &pl->conv)) ||
        (st = be_set(pl->op, base + 3, SH_TYPE_BACKEND_DESCRIPTOR, 1, &pl->w)) ||
        (st = be_set(pl->op, base + 4, SH_TYPE_BACKEND_DESCRIPTOR, 1, &pl->x)) ||
        (st = be_set(pl->op, base + 5, SH_TYPE_BACKEND_DESCRIPTOR, 1, fused ? &pl->z : &pl->y)))
        goto fail;
    TRY("cudnnBackendFinalize(OPERATION_CONVOLUTION)", be_finalize(pl->op));
    if (fused &&
        ((st = make_pointwise(&pl->pw[0], &pl->pw_op[0], SH_POINTWISE_ADD, comp, pl->z, pl->b,
                              kind == 4 ? pl->s : pl->y, &call)) ||
         (kind == 4 && (st = make_pointwise(&pl->pw[1], &pl->pw_op[1], SH_POINTWISE_RELU_FWD,
                                            comp, pl->s, NULL, pl->y, &call)))))
        goto fail;
    void *ops[3] = {pl->op, pl->pw_op[0], pl->pw_op[1]};
    const int64_t n_ops = fused ? kind - 1 : 1;
    TRY("cudnnBackendCreateDescriptor(OPERATIONGRAPH)",
        be_create(SH_DESC_OPERATIONGRAPH, &pl->graph));
    call = "cudnnBackendSetAttribute(OPERATIONGRAPH)";
    if ((st = be_set(pl->graph, SH_ATTR_OPERATIONGRAPH_HANDLE, SH_TYPE_HANDLE, 1, &handle)) ||
        (st = be_set(pl->graph, SH_ATTR_OPERATIONGRAPH_OPS, SH_TYPE_BACKEND_DESCRIPTOR, n_ops,
                     ops)))
        goto fail;
    TRY("cudnnBackendFinalize(OPERATIONGRAPH)", be_finalize(pl->graph));
    int found = 0;
    const int modes[2] = {SH_HEUR_MODE_A, SH_HEUR_MODE_FALLBACK};
    for (int rtc = 0; rtc <= policy.rtc && !found; ++rtc)
        for (int m = 0; m < 2 && !found; ++m)
            if ((st = choose_engine(pl, &policy, handle, modes[m], rtc, ws_limit, &found,
                                    &call)) &&
                m == 0)
                st = SH_CUDNN_STATUS_SUCCESS;   /* mode A failed: try the fallback list */
            else if (st)
                goto fail;
    if (!found) {   /* the caller says why (it knows its policy) */
        plan_free(pl);
        Py_RETURN_NONE;
    }
#undef TRY
    return Py_BuildValue("(NLLK)", PyLong_FromVoidPtr(pl), pl->engine, pl->notes,
                         (unsigned long long)pl->workspace);
fail:
    plan_free(pl);
    return cudnn_error(call, st);
}

/* cudnn_conv_run(plan, handle, a, b, out, workspace[, bias]): out = the
 * plan's convolution of a and b (alpha 1, beta 0: out is overwritten), on
 * the handle's stream.  (a, b, out) are (x, w, y) forward, fused forward
 * included, (dy, w, dx) backward data, (x, dy, dw) backward filter;
 * `workspace` holds at least the plan's workspace bytes (0 if it needs
 * none); `bias`, a fused forward's only (K values).  The variant pack of
 * the last addresses is kept: a training loop passes the same arrays every
 * step. */
static PyObject *py_cudnn_conv_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "cudnn_conv_run";
    void *plan, *handle, *a, *b, *out, *ws, *bias = NULL;
    if (nargs != 6 && nargs != 7) {
        PyErr_Format(PyExc_TypeError, "%s takes 6 or 7 arguments (%zd given)", what, nargs);
        return NULL;
    }
    if ((nargs == 7 && !arg_pointer(what, "bias", args[6], &bias)) ||
        !arg_pointer(what, "plan", args[0], &plan) ||
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
    if (FUSED(p->kind) != (bias != NULL)) {
        PyErr_Format(PyExc_ValueError, "%s: a bias is %s for a plan of kind %d", what,
                     FUSED(p->kind) ? "needed" : "not taken", p->kind);
        return NULL;
    }
    if (p->workspace && !ws) {
        PyErr_Format(PyExc_ValueError, "%s: the plan needs %zu bytes of workspace", what,
                     p->workspace);
        return NULL;
    }
    if (!cudnn_ready(what)) return NULL;
    /* the addresses of the x, w, y and bias tensors, by pass */
    const int pass = PASS(p->kind);
    void *const ptrs[5] = {pass == 1 ? out : a, pass == 2 ? out : b,
                           pass == 0 ? out : (pass == 1 ? a : b), bias, ws};
    int st;
    const char *call = "cudnnBackendExecute";
    if (!p->pack || memcmp(ptrs, p->ptrs, sizeof ptrs) != 0) {
        static const int64_t uids[4] = {UID_X, UID_W, UID_Y, UID_B};
        const int64_t n = bias ? 4 : 3;
        plan_release_pack(p);
        void *pack = NULL;
        call = "cudnnBackendCreateDescriptor(VARIANT_PACK)";
        if ((st = be_create(SH_DESC_VARIANT_PACK, &pack))) return cudnn_error(call, st);
        call = "cudnnBackendSetAttribute(VARIANT_PACK)";
        if ((st = be_set(pack, SH_ATTR_VARIANT_PACK_UNIQUE_IDS, SH_TYPE_INT64, n, uids)) ||
            (st = be_set(pack, SH_ATTR_VARIANT_PACK_DATA_POINTERS, SH_TYPE_VOID_PTR, n, ptrs)) ||
            (st = be_set(pack, SH_ATTR_VARIANT_PACK_WORKSPACE, SH_TYPE_VOID_PTR, 1, &ptrs[4])) ||
            (call = "cudnnBackendFinalize(VARIANT_PACK)", st = be_finalize(pack))) {
            be_destroy(pack);
            return cudnn_error(call, st);
        }
        p->pack = pack;
        memcpy(p->ptrs, ptrs, sizeof ptrs);
        call = "cudnnBackendExecute";
    }
    st = be_execute(handle, p->exec, p->pack);
    if (st != SH_CUDNN_STATUS_SUCCESS) return cudnn_error(call, st);
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
     "cudnn_conv_plan(handle, kind, format, ws_limit, align, refused, denied, rtc, n, c, h, w, "
     "k, r, s, p, q, sh, sw, ph, pw, dh, dw) -> (plan, engine, notes, workspace bytes) or None; "
     "kind 0 forward, 1 backward data, 2 backward filter; refused and notes: masks of "
     "numerical notes; denied: a tuple of engine indices; rtc: 1 allows runtime-compiled "
     "engines."},
    {"cudnn_conv_run", FASTCALL(py_cudnn_conv_run),
     "cudnn_conv_run(plan, handle, a, b, out, workspace): run a plan on the handle's stream."},
    {"cudnn_plan_free", py_cudnn_plan_free, METH_O,
     "cudnn_plan_free(plan): destroy a plan's descriptors."},
    {NULL, NULL, 0, NULL},
};

int add_cudnn_functions(PyObject *module) {
    return PyModule_AddFunctions(module, cudnn_methods);
}
