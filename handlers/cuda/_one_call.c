/* handlers.cuda._launch.OneCall: check and launch, in one C call, PyCudaHandler's
 * most frequent ops: those whose arrays all share one shape (add_tt, relu,
 * sigmoid_deriv, mult_st, axpby...), sum_t, dot_mm and dot_add_mm.
 *
 * PyCudaHandler's Python checks and launch cost 0.6-1.3 us per elementwise op
 * and 1.5-3.6 us per product, next to the driver's own 3-4 us launch.  This
 * type handles the common case only: arrays of exactly the handler's array
 * type and dtype object, C-contiguous strides, shapes that fit, device
 * addresses as ints (or objects with __int__), scalars as float or int.  In
 * any other case a call returns False having done nothing, and the handler
 * runs its Python path, which raises the precise error or handles the unusual
 * array.  So every error message stays in one place, the Python checks.
 *
 * One object per stream group (it holds the group's stream and cuBLAS
 * handle); every kernel launch goes through launch_args.  With dry=True
 * nothing is launched and `last` holds what would have been (tests on
 * machines without a GPU).
 */
#include "_launch.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

#define MAX_PARAMS 12   /* kernel arguments: sum's (4 pointers and up to 8 more) at most */
#define MAX_RUN 8       /* run/scalar: index and at most 7 more arguments (more: decline) */

/* An elementwise function: its handle and its kernel argument format (the
 * struct codes of Kernel.fmt), whose 'f' or 'd' at a scalar's place says
 * how wide that scalar is passed. */
typedef struct {
    void *fn;
    char fmt[MAX_PARAMS];
    Py_ssize_t nfmt;
} Function;

#define DOT_CACHE 16    /* dot: decoded records kept, by a hash of their call */

/* dot: what a call is keyed by: the shapes, flags and beta of products.dot_key. */
typedef struct {
    long long dim[9];       /* a, b and out: 3 slots each, -1 past an array's last axis */
    int flags;              /* transa | transb << 1 */
    double beta;
} DotKey;

/* dot: a record of products.DotPlan.launch, decoded, and the call it is for. */
enum { DOT_DECLINE, DOT_NOTHING, DOT_SMALL, DOT_GEMM };
typedef struct {
    DotKey key;
    int used;
    int what;               /* DOT_DECLINE ... */
    long long grid, q[3];   /* small: grid, then m, n, k */
    unsigned block;         /* small */
    int32_t flags[3];       /* small: transa, transb, accumulate */
    int g[10];              /* gemm: transa, transb, m, n, k, A, lda, B, ldb, ldc */
    double beta;            /* gemm */
} DotEntry;

typedef struct {
    PyObject_HEAD
    PyObject *array_type;   /* borrowed by identity: the exact type required */
    PyObject *dtype;        /* the dtype object required (identity) */
    void *stream;
    long long per_block;    /* elements one block covers: block * per-thread vector */
    long long max_blocks;
    unsigned block;
    int itemsize;           /* bytes per element (strides, overlaps) */
    int dry;
    Py_ssize_t nfn;
    Function *fns;          /* the elementwise functions that run/scalar/axpby name */
    PyObject *last;         /* dry: (function, grid, block, args) of the last call */
    /* dot: set by set_dot */
    PyObject *dot_launches; /* dict: products.dot_key -> record (products.DotPlan.launch) */
    void *gemm;             /* the cuBLAS GEMM, or NULL (then no record may call it) */
    int gemm_kind;          /* how to call it (GEMM_FLOAT, ... in _launch.h) */
    void *cublas;           /* the group's cuBLAS handle, bound to its stream */
    void *small_fn;         /* small_gemm kernel */
    DotEntry dot_cache[DOT_CACHE];   /* records read from dot_launches */
    /* sum: the group's fixed scratch for chunked plans, set by set_scratch
     * (none until then: every chunked plan declines) */
    void *sum_ws, *sum_counters;
    long long sum_ws_bytes, sum_ncounters;
} OneCall;

/* One kernel argument; params[] points into these. */
typedef struct {
    char code;   /* 'P' pointer, 'q' int64, 'i' int32, 'f' float, 'd' double */
    union { void *p; long long q; int32_t i; float f; double d; } v;
} Arg;

static PyObject *s_shape, *s_strides, *s_dtype, *s_gpudata;

static void one_call_dealloc(OneCall *self) {
    Py_XDECREF(self->array_type);
    Py_XDECREF(self->dtype);
    Py_XDECREF(self->last);
    Py_XDECREF(self->dot_launches);
    PyMem_Free(self->fns);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int one_call_init(OneCall *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"stream", "array_type", "dtype", "itemsize", "block",
                             "per_block", "max_blocks", "functions", "dry", NULL};
    PyObject *stream, *array_type, *dtype, *functions;
    int itemsize, dry = 0;
    unsigned block;
    long long per_block, max_blocks;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOiILLO|p", kwlist, &stream, &array_type,
                                     &dtype, &itemsize, &block, &per_block, &max_blocks,
                                     &functions, &dry))
        return -1;
    if (itemsize != 2 && itemsize != 4 && itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "OneCall: itemsize must be 2, 4 or 8");
        return -1;
    }
    if (block < 1 || per_block < 1 || max_blocks < 1) {
        PyErr_SetString(PyExc_ValueError, "OneCall: block sizes must be positive");
        return -1;
    }
    void *st = PyLong_AsVoidPtr(stream);
    if (PyErr_Occurred()) return -1;
    PyObject *seq = PySequence_Fast(functions, "OneCall: functions must be a sequence");
    if (!seq) return -1;
    Py_ssize_t nfn = PySequence_Fast_GET_SIZE(seq);
    Function *fns = PyMem_Calloc(nfn ? nfn : 1, sizeof(Function));
    if (!fns) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < nfn; ++i) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i), *handle;
        const char *fmt;
        Py_ssize_t nfmt;
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "Oy#", &handle, &fmt, &nfmt)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError,
                            "OneCall: functions must be (handle, fmt: bytes) pairs");
        } else if (nfmt > MAX_PARAMS) {
            PyErr_SetString(PyExc_ValueError, "OneCall: a function's fmt is too long");
        } else {
            fns[i].fn = PyLong_AsVoidPtr(handle);
            memcpy(fns[i].fmt, fmt, nfmt);
            fns[i].nfmt = nfmt;
            if (!fns[i].fn && !PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "OneCall: null function");
        }
        if (PyErr_Occurred()) {
            Py_DECREF(seq);
            PyMem_Free(fns);
            return -1;
        }
    }
    Py_DECREF(seq);
    PyMem_Free(self->fns);
    self->fns = fns;
    self->nfn = nfn;
    Py_INCREF(array_type);
    Py_XSETREF(self->array_type, array_type);
    Py_INCREF(dtype);
    Py_XSETREF(self->dtype, dtype);
    self->stream = st;
    self->itemsize = itemsize;
    self->block = block;
    self->per_block = per_block;
    self->max_blocks = max_blocks;
    self->dry = dry;
    return 0;
}

/* An attribute of an array, or NULL with no exception set: a missing or
 * failing attribute is a doubt for the Python checks to report. */
static PyObject *attr(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) PyErr_Clear();
    return v;
}

/* Equal tuples (identity first, as Python's == does). */
static int same_tuple(PyObject *x, PyObject *y) {
    if (x == y) return 1;
    if (!PyTuple_CheckExact(x)) return 0;
    int eq = PyObject_RichCompareBool(x, y, Py_EQ);
    if (eq < 0) PyErr_Clear();
    return eq == 1;
}

/* The device address of array `a` into arg; 0 on any doubt (a negative or
 * non-numeric gpudata). */
static int pointer_of(PyObject *a, Arg *arg) {
    PyObject *gpudata = attr(a, s_gpudata);
    if (!gpudata) return 0;
    PyObject *addr = PyLong_CheckExact(gpudata) ? gpudata : PyNumber_Long(gpudata);
    unsigned long long p = addr ? PyLong_AsUnsignedLongLong(addr) : 0;
    if (addr && addr != gpudata) Py_DECREF(addr);
    Py_DECREF(gpudata);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    arg->code = 'P';
    arg->v.p = (void *)(uintptr_t)p;
    return 1;
}

/* The type and dtype test of array `a`. */
static int typed(OneCall *self, PyObject *a) {
    if ((PyObject *)Py_TYPE(a) != self->array_type) return 0;
    PyObject *dtype = attr(a, s_dtype);
    if (!dtype) return 0;
    Py_DECREF(dtype);   /* only its identity is used */
    return dtype == self->dtype;
}

/* Check one array: type, dtype, C-contiguous strides (computed as
 * Handler._strides_of does) and its address.  On success returns 1 with new
 * references in *shape and *strides and the element count in *n; 0 on any
 * doubt, with nothing held. */
static int check_one(OneCall *self, PyObject *a, PyObject **shape, PyObject **strides,
                     long long *n, Arg *arg) {
    if (!typed(self, a)) return 0;
    PyObject *sh = attr(a, s_shape), *st = sh ? attr(a, s_strides) : NULL;
    if (!st || !PyTuple_CheckExact(sh) || !PyTuple_CheckExact(st) ||
        PyTuple_GET_SIZE(st) != PyTuple_GET_SIZE(sh))
        goto doubt;
    long long step = self->itemsize, size = 1;
    for (Py_ssize_t k = PyTuple_GET_SIZE(sh) - 1; k >= 0; --k) {
        long long dim = PyLong_AsLongLong(PyTuple_GET_ITEM(sh, k));
        long long stride = PyLong_AsLongLong(PyTuple_GET_ITEM(st, k));
        if (PyErr_Occurred()) {
            PyErr_Clear();
            goto doubt;
        }
        /* A count or stride past 64 bits is a doubt (Python's exact ints
         * reject it: not C-contiguous, or an n no kernel can take). */
        if (dim < 0 || stride != step || __builtin_mul_overflow(step, dim, &step) ||
            __builtin_mul_overflow(size, dim, &size))
            goto doubt;
    }
    if (!pointer_of(a, arg)) goto doubt;
    *shape = sh;
    *strides = st;
    *n = size;
    return 1;
doubt:
    Py_XDECREF(sh);
    Py_XDECREF(st);
    return 0;
}

/* Check `count` arrays of one shape and put their device addresses in
 * args[0..count).  Returns 1 when all pass (with *n the element count), 0 on
 * any doubt. */
static int check_arrays(OneCall *self, PyObject *const *arrays, Py_ssize_t count, Arg *args,
                        long long *n) {
    PyObject *shape0, *strides0;
    if (!check_one(self, arrays[0], &shape0, &strides0, n, &args[0])) return 0;
    int ok = 1;
    for (Py_ssize_t i = 1; ok && i < count; ++i) {
        PyObject *a = arrays[i];
        ok = typed(self, a);
        if (ok) {
            PyObject *shape = attr(a, s_shape), *strides = shape ? attr(a, s_strides) : NULL;
            ok = strides && same_tuple(shape, shape0) && same_tuple(strides, strides0);
            Py_XDECREF(shape);
            Py_XDECREF(strides);
        }
        ok = ok && pointer_of(a, &args[i]);
    }
    Py_DECREF(shape0);
    Py_DECREF(strides0);
    return ok;
}

/* The code of function f's argument p, a scalar: 'f' (float) or 'd'
 * (double), as its fmt says; 0 with a TypeError if the fmt has no scalar
 * there (the op table and this call's layout disagree). */
static char scalar_code(const Function *f, Py_ssize_t p) {
    char code = p < f->nfmt ? f->fmt[p] : 0;
    if (code == 'f' || code == 'd') return code;
    PyErr_Format(PyExc_TypeError, "OneCall: argument %zd of the function is no scalar", p);
    return 0;
}

/* A scalar argument of width `code` ('f' or 'd', scalar_code); 0 (no
 * exception) unless it is a float or a plain int that converts. */
static int scalar_arg(char code, PyObject *o, Arg *arg) {
    double v;
    if (PyFloat_CheckExact(o)) {
        v = PyFloat_AS_DOUBLE(o);
    } else if (PyLong_CheckExact(o)) {
        v = PyLong_AsDouble(o);
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    } else {
        return 0;
    }
    arg->code = code;
    if (code == 'f')
        arg->v.f = (float)v;
    else
        arg->v.d = v;
    return 1;
}

static PyObject *record_dry(OneCall *self, void *fn, long long grid, unsigned block, Arg *args,
                            Py_ssize_t nargs) {
    PyObject *values = PyTuple_New(nargs);
    if (!values) return NULL;
    for (Py_ssize_t i = 0; i < nargs; ++i) {
        PyObject *v;
        switch (args[i].code) {
            case 'P': v = PyLong_FromVoidPtr(args[i].v.p); break;
            case 'q': v = PyLong_FromLongLong(args[i].v.q); break;
            case 'i': v = PyLong_FromLong(args[i].v.i); break;
            case 'f': v = PyFloat_FromDouble(args[i].v.f); break;
            default: v = PyFloat_FromDouble(args[i].v.d);   /* 'd' */
        }
        if (!v) {
            Py_DECREF(values);
            return NULL;
        }
        PyTuple_SET_ITEM(values, i, v);
    }
    PyObject *last = Py_BuildValue("(NLIN)", PyLong_FromVoidPtr(fn), grid, block, values);
    if (!last) return NULL;
    Py_XSETREF(self->last, last);
    Py_RETURN_TRUE;
}

/* Launch fn with `grid` blocks of `block` threads on this group's stream (or,
 * dry, record the launch); returns True.  Every launch of this type goes
 * through here. */
static PyObject *launch_args(OneCall *self, void *fn, long long grid, unsigned block, Arg *args,
                             Py_ssize_t nargs) {
    if (self->dry) return record_dry(self, fn, grid, block, args, nargs);
    if (!loaded("OneCall")) return NULL;
    void *params[MAX_PARAMS];
    for (Py_ssize_t k = 0; k < nargs; ++k) params[k] = &args[k].v;
    int rc = cu_launch(fn, (unsigned)grid, 1, 1, block, 1, 1, 0, self->stream, params,
                       NULL);
    if (rc) return driver_error("cuLaunchKernel", rc);
    Py_RETURN_TRUE;
}

/* Elementwise function `index`, or NULL with an IndexError. */
static const Function *function_at(OneCall *self, PyObject *index) {
    Py_ssize_t i = PyLong_AsSsize_t(index);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0 || i >= self->nfn) {
        PyErr_Format(PyExc_IndexError, "OneCall: no function %zd", i);
        return NULL;
    }
    return &self->fns[i];
}

/* Launch elementwise function f over n elements with args[0..nargs) then
 * n, on the grid grid_blocks gives (as PyCudaHandler._grid). */
static PyObject *launch(OneCall *self, const Function *f, Arg *args, Py_ssize_t nargs,
                        long long n) {
    if (!n) Py_RETURN_TRUE;   /* nothing to do, as the Python path */
    args[nargs].code = 'q';
    args[nargs].v.q = n;
    return launch_args(self, f->fn, grid_blocks(n, self->per_block, self->max_blocks),
                       self->block, args, nargs + 1);
}

/* run and scalar: args are (index, scalars..., arrays...), the kernel takes
 * (scalars..., pointers..., n).  More arguments than MAX_RUN decline: the
 * Python path serves such an op. */
static PyObject *run_with(OneCall *self, PyObject *const *args, Py_ssize_t nargs,
                          Py_ssize_t scalars, const char *usage) {
    if (nargs < 2 + scalars) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    const Function *f = function_at(self, args[0]);
    if (!f) return NULL;
    if (nargs > MAX_RUN) Py_RETURN_FALSE;
    Arg kargs[MAX_PARAMS];
    long long n = 0;
    for (Py_ssize_t i = 0; i < scalars; ++i) {
        char code = scalar_code(f, i);
        if (!code) return NULL;
        if (!scalar_arg(code, args[1 + i], &kargs[i])) Py_RETURN_FALSE;
    }
    if (!check_arrays(self, args + 1 + scalars, nargs - 1 - scalars, kargs + scalars, &n))
        Py_RETURN_FALSE;
    return launch(self, f, kargs, nargs - 1, n);
}

static PyObject *one_call_run(OneCall *self, PyObject *const *args, Py_ssize_t nargs) {
    return run_with(self, args, nargs, 0, "run(index, *arrays): at least one array");
}

static PyObject *one_call_scalar(OneCall *self, PyObject *const *args, Py_ssize_t nargs) {
    return run_with(self, args, nargs, 1, "scalar(index, s, *arrays): at least one array");
}

/* axpby(index, alpha, x, beta, y) -> bool: the kernel takes (alpha, x, beta, y, n). */
static PyObject *one_call_axpby(OneCall *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "axpby(index, alpha, x, beta, y)");
        return NULL;
    }
    const Function *f = function_at(self, args[0]);
    if (!f) return NULL;
    char ca = scalar_code(f, 0), cb = ca ? scalar_code(f, 2) : 0;
    if (!cb) return NULL;
    Arg kargs[MAX_PARAMS], ptrs[2];
    long long n = 0;
    PyObject *arrays[2] = {args[2], args[4]};
    if (!scalar_arg(ca, args[1], &kargs[0]) || !scalar_arg(cb, args[3], &kargs[2]))
        Py_RETURN_FALSE;
    if (!check_arrays(self, arrays, 2, ptrs, &n)) Py_RETURN_FALSE;
    kargs[1] = ptrs[0];
    kargs[3] = ptrs[1];
    return launch(self, f, kargs, 4, n);
}

/* Do the memory ranges of two checked arrays of nx and ny elements overlap? */
static int overlap(const Arg *x, long long nx, const Arg *y, long long ny, int itemsize) {
    uintptr_t px = (uintptr_t)x->v.p, py = (uintptr_t)y->v.p;
    return nx && ny && px < py + (uintptr_t)ny * itemsize && py < px + (uintptr_t)nx * itemsize;
}

/* The kernel arguments of a sum plan (function, grid, fmt, trailing, block,
 * workspace bytes, counters): a, the workspace, out, the counters, then the
 * trailing ints as fmt says ("PPPP" then 'q' or 'i' for each).  A plan of
 * no workspace and no counters gets null pointers; a chunked one this
 * object's fixed scratch (set_scratch), which the plan states its needs of
 * and does not name: the plans are shared by the views of every stream
 * group, each with its own scratch.  Returns the argument count; 0 (no
 * exception) for a chunked plan that needs more than the scratch holds
 * (declined: the Python path runs it on its own workspace); -1 with an
 * exception set for a malformed plan. */
static Py_ssize_t sum_args(OneCall *self, PyObject *plan, const Arg *a, const Arg *out,
                           Arg *args, void **fn, long long *grid, unsigned *block) {
    PyObject *fmt, *trailing;
    if (!PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != 7 ||
        !PyBytes_Check(fmt = PyTuple_GET_ITEM(plan, 2)) ||
        !PyTuple_CheckExact(trailing = PyTuple_GET_ITEM(plan, 3)) ||
        PyBytes_GET_SIZE(fmt) != 4 + PyTuple_GET_SIZE(trailing) ||
        PyBytes_GET_SIZE(fmt) > MAX_PARAMS || memcmp(PyBytes_AS_STRING(fmt), "PPPP", 4)) {
        PyErr_SetString(PyExc_TypeError,
                        "sum: a plan is (function, grid, fmt: bytes 'PPPP...', args, block, "
                        "workspace bytes, counters)");
        return -1;
    }
    *fn = PyLong_AsVoidPtr(PyTuple_GET_ITEM(plan, 0));
    *grid = PyLong_AsLongLong(PyTuple_GET_ITEM(plan, 1));
    long long threads = PyLong_AsLongLong(PyTuple_GET_ITEM(plan, 4));
    long long ws = PyLong_AsLongLong(PyTuple_GET_ITEM(plan, 5));
    long long counters = PyLong_AsLongLong(PyTuple_GET_ITEM(plan, 6));
    if (PyErr_Occurred()) return -1;
    if (!*fn || *grid < 1 || threads < 32 || threads > 1024 || threads % 32 || ws < 0 ||
        counters < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "sum: null function, empty grid, a block size that is not a "
                        "multiple of 32 up to 1024, or a negative workspace or count in a plan");
        return -1;
    }
    const int chunked = ws > 0 || counters > 0;
    if (chunked && (ws > self->sum_ws_bytes || counters > self->sum_ncounters)) return 0;
    *block = (unsigned)threads;
    args[0] = *a;
    args[2] = *out;
    args[1].code = args[3].code = 'P';
    args[1].v.p = chunked ? self->sum_ws : NULL;
    args[3].v.p = chunked ? self->sum_counters : NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(fmt);
    for (Py_ssize_t k = 4; k < n; ++k) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(trailing, k - 4));
        if (v == -1 && PyErr_Occurred()) return -1;
        char code = PyBytes_AS_STRING(fmt)[k];
        args[k].code = code;
        if (code == 'q') {
            args[k].v.q = v;
        } else if (code == 'i' && v >= INT32_MIN && v <= INT32_MAX) {
            args[k].v.i = (int32_t)v;
        } else {
            PyErr_Format(PyExc_ValueError, "sum: plan argument %zd does not fit code '%c'", k,
                         code);
            return -1;
        }
    }
    return n;
}

/* sum(plans, a, axis, out) -> bool: a reduction's launch for a combination
 * that the Python path has checked and planned before (reductions.remember).
 * `plans` maps (a.shape, axis, out.shape, a's address 16-byte aligned) to
 * (function, grid, fmt, trailing args, block, workspace bytes, counters) of
 * a kernel taking (a, workspace, out, counters, trailing...), or to None for
 * a combination that stays in Python.  A chunked plan (workspace bytes or
 * counters) runs on this object's fixed scratch (sum_args).  Declines an
 * unknown combination, a chunked plan larger than the scratch, an axis
 * other than None, an int or a tuple of ints (a bool would hash like one),
 * and overlapping a and out. */
static PyObject *one_call_sum(OneCall *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyDict_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "sum(plans: dict, a, axis, out)");
        return NULL;
    }
    PyObject *axis = args[2];
    if (PyTuple_CheckExact(axis)) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(axis); ++k)
            if (!PyLong_CheckExact(PyTuple_GET_ITEM(axis, k))) Py_RETURN_FALSE;
    } else if (axis != Py_None && !PyLong_CheckExact(axis)) {
        Py_RETURN_FALSE;
    }
    PyObject *sa, *sta, *so, *sto;
    long long na, no;
    Arg pa, po;
    if (!check_one(self, args[1], &sa, &sta, &na, &pa)) Py_RETURN_FALSE;
    if (!check_one(self, args[3], &so, &sto, &no, &po)) {
        Py_DECREF(sa);
        Py_DECREF(sta);
        Py_RETURN_FALSE;
    }
    PyObject *plan = NULL;
    if (!overlap(&po, no, &pa, na, self->itemsize)) {
        PyObject *key = PyTuple_Pack(4, sa, axis, so,
                                     (uintptr_t)pa.v.p % 16 == 0 ? Py_True : Py_False);
        if (key) {
            plan = PyDict_GetItemWithError(args[0], key);
            Py_XINCREF(plan);
            Py_DECREF(key);
        }
    }
    Py_DECREF(sa);
    Py_DECREF(sta);
    Py_DECREF(so);
    Py_DECREF(sto);
    if (!plan) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_FALSE;
    }
    PyObject *result;
    Arg kargs[MAX_PARAMS];
    void *fn;
    long long grid;
    unsigned block;
    Py_ssize_t n;
    if (plan == Py_None)
        result = Py_NewRef(Py_False);
    else if ((n = sum_args(self, plan, &pa, &po, kargs, &fn, &grid, &block)) < 0)
        result = NULL;
    else if (n == 0)
        result = Py_NewRef(Py_False);
    else
        result = launch_args(self, fn, grid, block, kargs, n);
    Py_DECREF(plan);
    return result;
}

/* set_dot(launches, gemm, cublas, small_gemm, kind): what dot() reads and
 * calls: the dict of records that products.dot fills, the cuBLAS GEMM (0:
 * none) with the group's cuBLAS handle, the small_gemm kernel, and the GEMM
 * kind of call_gemm (_launch.h).  Forgets the records read before. */
static PyObject *one_call_set_dot(OneCall *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyDict_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "set_dot(launches: dict, gemm, cublas, small_gemm, kind)");
        return NULL;
    }
    void *gemm = PyLong_AsVoidPtr(args[1]), *cublas = PyLong_AsVoidPtr(args[2]);
    void *small = PyLong_AsVoidPtr(args[3]);
    long kind = PyLong_AsLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (kind < GEMM_FLOAT || kind > GEMM_F16) {
        PyErr_SetString(PyExc_ValueError, "set_dot: kind must be in 0..3");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(self->dot_launches, args[0]);
    self->gemm_kind = (int)kind;
    self->gemm = gemm;
    self->cublas = cublas;
    self->small_fn = small;
    memset(self->dot_cache, 0, sizeof self->dot_cache);
    Py_RETURN_NONE;
}

/* set_scratch(workspace, bytes, counters, count): the fixed scratch of this
 * group's stream that chunked sum plans run on: a workspace of `bytes` and
 * `count` uint32 counters, zero when no launch is running (the kernels
 * leave them so).  The caller keeps both allocated while this object may
 * launch, and lets nothing else on the stream use them. */
static PyObject *one_call_set_scratch(OneCall *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "set_scratch(workspace, bytes, counters, count)");
        return NULL;
    }
    void *ws = PyLong_AsVoidPtr(args[0]), *counters = PyLong_AsVoidPtr(args[2]);
    long long nbytes = PyLong_AsLongLong(args[1]), count = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (nbytes < 0 || count < 0 || (nbytes && !ws) || (count && !counters)) {
        PyErr_SetString(PyExc_ValueError,
                        "set_scratch: sizes must be >= 0, and a non-empty buffer not null");
        return NULL;
    }
    self->sum_ws = ws;
    self->sum_ws_bytes = nbytes;
    self->sum_counters = counters;
    self->sum_ncounters = count;
    Py_RETURN_NONE;
}

/* A transpose flag: True or False only (the Python checks raise TypeError
 * for anything else, numpy.bool_ included, which they accept; so decline). */
static int flag(PyObject *o) {
    if (o == Py_True) return 1;
    if (o == Py_False) return 0;
    return -1;
}

/* Items [from, from + count) of record tuple t, each an int in lo..hi, into
 * out; 0 with an exception set otherwise. */
static int record_ints(PyObject *t, Py_ssize_t from, int count, long long lo, long long hi,
                       long long *out) {
    for (int i = 0; i < count; ++i) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(t, from + i));
        if (v == -1 && PyErr_Occurred()) return 0;
        if (v < lo || v > hi) {
            PyErr_Format(PyExc_ValueError, "dot: record item %zd is %lld, not in %lld..%lld",
                         from + i, v, lo, hi);
            return 0;
        }
        out[i] = v;
    }
    return 1;
}

static int is_tag(PyObject *o, const char *tag) {
    return PyUnicode_Check(o) && PyUnicode_CompareWithASCIIString(o, tag) == 0;
}

/* Decode record `rec` (products.DotPlan.launch) into e; 0 with an exception
 * set for a malformed one. */
static int dot_decode(PyObject *rec, DotEntry *e) {
    long long v[10];
    Py_ssize_t size = PyTuple_CheckExact(rec) ? PyTuple_GET_SIZE(rec) : 0;
    if (rec == Py_None || rec == Py_True) {
        e->what = rec == Py_None ? DOT_DECLINE : DOT_NOTHING;
        return 1;
    }
    if (size == 9 && is_tag(PyTuple_GET_ITEM(rec, 0), "small")) {
        if (!record_ints(rec, 1, 1, 1, INT_MAX, &e->grid) || !record_ints(rec, 2, 1, 1, 1024, v) ||
            !record_ints(rec, 3, 3, 0, LLONG_MAX, e->q) || !record_ints(rec, 6, 3, 0, 1, v + 1))
            return 0;
        e->block = (unsigned)v[0];
        for (int i = 0; i < 3; ++i) e->flags[i] = (int32_t)v[1 + i];
        e->what = DOT_SMALL;
        return 1;
    }
    if (size == 12 && is_tag(PyTuple_GET_ITEM(rec, 0), "gemm")) {
        if (!record_ints(rec, 1, 10, 0, INT_MAX, v)) return 0;
        if (v[0] > 1 || v[1] > 1 || v[5] > 1 || v[7] > 1) {
            PyErr_SetString(PyExc_ValueError, "dot: a gemm record's flags, A and B are 0 or 1");
            return 0;
        }
        e->beta = PyFloat_AsDouble(PyTuple_GET_ITEM(rec, 11));
        if (e->beta == -1.0 && PyErr_Occurred()) return 0;
        for (int i = 0; i < 10; ++i) e->g[i] = (int)v[i];
        e->what = DOT_GEMM;
        return 1;
    }
    PyErr_SetString(PyExc_TypeError,
                    "dot: a record is None, True, ('small', grid, block, m, n, k, transa, "
                    "transb, accumulate) or ('gemm', transa, transb, m, n, k, A, lda, B, ldb, "
                    "ldc, beta)");
    return 0;
}

/* The decoded record of a call with `key`: from the cache, else read from
 * dot_launches under products.dot_key (the three shape objects, the flag
 * and beta objects of the call) and kept.  NULL if dot_launches holds none,
 * or with an exception set for a malformed one.  A key's record never
 * changes (products.plan_dot depends on the key and the format only), so a
 * kept one stays right. */
static const DotEntry *dot_record(OneCall *self, const DotKey *key, PyObject *const *shape,
                                  PyObject *const *args) {
    unsigned long long h = (unsigned long long)key->flags * 2 + (key->beta != 0.0);
    for (int i = 0; i < 9; ++i) h = (h ^ (unsigned long long)key->dim[i]) * 0x100000001B3ULL;
    DotEntry *e = &self->dot_cache[(h ^ h >> 32) % DOT_CACHE];
    if (e->used && e->key.flags == key->flags && e->key.beta == key->beta &&
        !memcmp(e->key.dim, key->dim, sizeof key->dim))
        return e;
    PyObject *k = PyTuple_Pack(6, shape[0], shape[1], shape[2], args[3], args[4], args[5]);
    if (!k) return NULL;
    PyObject *rec = PyDict_GetItemWithError(self->dot_launches, k);
    Py_DECREF(k);
    if (!rec) return NULL;
    DotEntry fresh;
    memset(&fresh, 0, sizeof fresh);
    Py_INCREF(rec);
    int ok = dot_decode(rec, &fresh);
    Py_DECREF(rec);
    if (!ok) return NULL;
    fresh.key = *key;
    fresh.used = 1;
    *e = fresh;
    return e;
}

/* dot(a, b, out, transa, transb, beta) -> bool: out = op(a) op(b) + beta out
 * (beta 0.0 for dot_mm, 1.0 for dot_add_mm) as the record that products.dot
 * stored for these shapes, flags and beta says: small_gemm, the cuBLAS GEMM,
 * or nothing to do.  Checks the three arrays (check_one) and that out
 * overlaps neither input; declines any doubt, a combination with no record
 * yet (the Python path plans it and stores one) and a record of None (the
 * product runs in Python). */
static PyObject *one_call_dot(OneCall *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyFloat_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError, "dot(a, b, out, transa, transb, beta: float)");
        return NULL;
    }
    int ta = flag(args[3]), tb = flag(args[4]);
    if (ta < 0 || tb < 0 || !self->dot_launches) Py_RETURN_FALSE;
    PyObject *shape[3] = {NULL}, *strides[3] = {NULL};
    long long count[3];
    Arg ptr[3];
    DotKey key;
    key.flags = ta | tb << 1;
    key.beta = PyFloat_AS_DOUBLE(args[5]);
    int ok = 1;
    for (int i = 0; ok && i < 3; ++i) {
        /* at most 3 axes: the key's room (a product's arrays have 2 or 3) */
        ok = check_one(self, args[i], &shape[i], &strides[i], &count[i], &ptr[i]) &&
             PyTuple_GET_SIZE(shape[i]) <= 3;
        for (Py_ssize_t j = 0; ok && j < 3; ++j)   /* checked already: no error possible */
            key.dim[3 * i + j] = j < PyTuple_GET_SIZE(shape[i])
                                     ? PyLong_AsLongLong(PyTuple_GET_ITEM(shape[i], j)) : -1;
    }
    const DotEntry *found = NULL;
    if (ok && !overlap(&ptr[2], count[2], &ptr[0], count[0], self->itemsize) &&
        !overlap(&ptr[2], count[2], &ptr[1], count[1], self->itemsize))
        found = dot_record(self, &key, shape, args);
    /* The record is copied out before the references go: a DECREF may run
     * Python code (a finalizer), which may call this object again and
     * overwrite the cache slot. */
    DotEntry entry;
    if (found) entry = *found;
    const DotEntry *e = found ? &entry : NULL;
    for (int i = 0; i < 3; ++i) {
        Py_XDECREF(shape[i]);
        Py_XDECREF(strides[i]);
    }
    if (!e) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_FALSE;
    }
    if (e->what == DOT_DECLINE) Py_RETURN_FALSE;
    if (e->what == DOT_NOTHING) Py_RETURN_TRUE;
    if (e->what == DOT_SMALL) {
        if (!self->small_fn) {
            PyErr_SetString(PyExc_ValueError, "dot: a small_gemm record, and no small_gemm set");
            return NULL;
        }
        /* small_gemm(a, b, out, m, n, k, transa, transb, accumulate) */
        Arg kargs[9] = {ptr[0], ptr[1], ptr[2]};
        for (int i = 0; i < 3; ++i) {
            kargs[3 + i].code = 'q';
            kargs[3 + i].v.q = e->q[i];
            kargs[6 + i].code = 'i';
            kargs[6 + i].v.i = e->flags[i];
        }
        return launch_args(self, self->small_fn, e->grid, e->block, kargs, 9);
    }
    if (!self->gemm) {
        PyErr_SetString(PyExc_ValueError, "dot: a gemm record, and no gemm symbol set");
        return NULL;
    }
    int g[10];
    memcpy(g, e->g, sizeof g);
    double beta = e->beta;
    void *a = ptr[g[5]].v.p, *b = ptr[g[7]].v.p, *c = ptr[2].v.p;
    if (self->dry) {
        PyObject *last = Py_BuildValue(
            "(NN(iiiiidNiNidNi))", PyLong_FromVoidPtr(self->gemm),
            PyLong_FromVoidPtr(self->cublas), g[0], g[1], g[2], g[3], g[4], 1.0,
            PyLong_FromVoidPtr(a), g[6], PyLong_FromVoidPtr(b), g[8], beta,
            PyLong_FromVoidPtr(c), g[9]);
        if (!last) return NULL;
        Py_XSETREF(self->last, last);
        Py_RETURN_TRUE;
    }
    if (!loaded("OneCall.dot")) return NULL;
    int status = call_gemm(self->gemm, self->cublas, self->gemm_kind, g[0], g[1], g[2], g[3],
                           g[4], 1.0, a, g[6], b, g[8], beta, c, g[9]);
    if (status) {
        static const char *names[] = {"cublasSgemm_v2", "cublasDgemm_v2", "cublasGemmEx",
                                      "cublasGemmEx"};
        return blas_error(names[self->gemm_kind], status);
    }
    Py_RETURN_TRUE;
}

static PyObject *one_call_last(OneCall *self, void *closure) {
    (void)closure;
    PyObject *last = self->last ? self->last : Py_None;
    Py_INCREF(last);
    return last;
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

static PyMethodDef one_call_methods[] = {
    {"run", FASTCALL(one_call_run),
     "run(index, *arrays) -> bool: check the arrays and launch function `index` with "
     "(pointers..., n); False, with nothing done, if any check is in doubt or more than 7 "
     "arguments follow the index."},
    {"scalar", FASTCALL(one_call_scalar),
     "scalar(index, s, *arrays) -> bool: as run, for kernels taking (s, pointers..., n)."},
    {"sum", FASTCALL(one_call_sum),
     "sum(plans, a, axis, out) -> bool: a reduction with a plan from `plans` (see the "
     "source)."},
    {"set_scratch", FASTCALL(one_call_set_scratch),
     "set_scratch(workspace, bytes, counters, count): the group's fixed workspace and zeroed "
     "uint32 counters that chunked sum plans run on (none set: they decline)."},
    {"dot", FASTCALL(one_call_dot),
     "dot(a, b, out, transa, transb, beta) -> bool: dot_mm (beta 0.0) or dot_add_mm "
     "(beta 1.0) as its stored record says, see the source."},
    {"set_dot", FASTCALL(one_call_set_dot),
     "set_dot(launches, gemm, cublas, small_gemm, kind): the records dot() runs "
     "(products.dot fills the dict), the cuBLAS GEMM symbol (0: none), the group's cuBLAS "
     "handle and the small-product kernel."},
    {"axpby", FASTCALL(one_call_axpby),
     "axpby(index, alpha, x, beta, y) -> bool: as run, for (alpha, x, beta, y, n)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef one_call_getset[] = {
    {"last", (getter)one_call_last, NULL,
     "dry=True: (function, grid, block, args) of the last call that would have launched.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject OneCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "handlers.cuda._launch.OneCall",
    .tp_basicsize = sizeof(OneCall),
    .tp_dealloc = (destructor)one_call_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "OneCall(stream, array_type, dtype, itemsize, block, per_block, max_blocks, "
              "functions, dry=False): checks and launch of same-shape elementwise ops on "
              "one stream, in one C call; functions are (handle, fmt: bytes) pairs, the fmt "
              "giving each scalar's width ('f' or 'd').",
    .tp_methods = one_call_methods,
    .tp_getset = one_call_getset,
    .tp_init = (initproc)one_call_init,
    .tp_new = PyType_GenericNew,
};

int add_one_call_type(PyObject *module) {
    if (!(s_shape = PyUnicode_InternFromString("shape")) ||
        !(s_strides = PyUnicode_InternFromString("strides")) ||
        !(s_dtype = PyUnicode_InternFromString("dtype")) ||
        !(s_gpudata = PyUnicode_InternFromString("gpudata")))
        return -1;
    if (PyType_Ready(&OneCallType) < 0) return -1;
    Py_INCREF(&OneCallType);
    if (PyModule_AddObject(module, "OneCall", (PyObject *)&OneCallType) < 0) {
        Py_DECREF(&OneCallType);
        return -1;
    }
    return 0;
}
