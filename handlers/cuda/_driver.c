/* handlers.cuda._launch: the driver calls besides launches and events.
 *
 * Streams, asynchronous copies, page-locked host memory, timing events, the
 * context's synchronize, device attributes, a kernel's occupancy, module
 * loading, stream capture and CUDA graphs, a 32-bit memset, page-locking of
 * host memory, a status's name, and cuBLAS's workspace setter.  Handles and addresses are Python ints;
 * a copy's host memory is an object with the buffer protocol (a NumPy array).
 * Each function converts and checks its arguments before it needs libcuda,
 * so a wrong type is a TypeError on any machine, then makes one call; a
 * failed call raises CudaError naming it and its status (driver_error,
 * blas_error).  Calls that may wait for the device or the host's pages
 * release the GIL.
 *
 * The symbols come from the libcuda handle that load() opened
 * (resolve_driver_calls); a function whose symbol that driver lacks raises
 * RuntimeError when called.
 */
#include "_launch.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int (*module_load_fn)(void **, const void *);
typedef int (*module_function_fn)(void **, void *, const char *);
typedef int (*capture_begin_fn)(void *, int);
typedef int (*capture_end_fn)(void *, void **);
typedef int (*capture_status_fn)(void *, int *);
typedef int (*graph_nodes_fn)(void *, void **, size_t *);
typedef int (*graph_instantiate_fn)(void **, void *, unsigned long long);
typedef int (*graph_launch_fn)(void *, void *);
typedef int (*handle_fn)(void *);   /* cuGraphDestroy, cuGraphExecDestroy, cuMemHostUnregister */
typedef int (*memset_d32_fn)(unsigned long long, unsigned, size_t, void *);
typedef int (*host_register_fn)(void *, size_t, unsigned);
typedef int (*set_workspace_fn)(void *, void *, size_t);
typedef int (*stream_create_fn)(void **, unsigned);
typedef int (*copy_htod_fn)(unsigned long long, const void *, size_t, void *);
typedef int (*copy_dtoh_fn)(void *, unsigned long long, size_t, void *);
typedef int (*copy_dtod_fn)(unsigned long long, unsigned long long, size_t, void *);
typedef int (*ctx_sync_fn)(void);
typedef int (*elapsed_fn)(float *, void *, void *);
typedef int (*device_get_fn)(int *, int);
typedef int (*device_attribute_fn)(int *, int, int);
typedef int (*host_alloc_fn)(void **, size_t, unsigned);
typedef int (*occupancy_fn)(int *, void *, int, size_t);

static module_load_fn cu_module_load;
static module_function_fn cu_module_function;
static capture_begin_fn cu_capture_begin;
static capture_end_fn cu_capture_end;
static capture_status_fn cu_capture_status;
static graph_nodes_fn cu_graph_nodes;
static graph_instantiate_fn cu_graph_instantiate;
static graph_launch_fn cu_graph_launch;
static handle_fn cu_graph_destroy, cu_graph_exec_destroy, cu_host_unregister;
static memset_d32_fn cu_memset_d32;
static host_register_fn cu_host_register;
/* cuStreamDestroy, cuStreamSynchronize, cuMemFreeHost */
static handle_fn cu_stream_destroy, cu_stream_sync, cu_host_free;
static stream_create_fn cu_stream_create;
static copy_htod_fn cu_copy_htod;
static copy_dtoh_fn cu_copy_dtoh;
static copy_dtod_fn cu_copy_dtod;
static ctx_sync_fn cu_ctx_sync;
static elapsed_fn cu_elapsed;
static device_get_fn cu_device_get;
static device_attribute_fn cu_device_attribute;
static host_alloc_fn cu_host_alloc;
static occupancy_fn cu_occupancy;

void resolve_driver_calls(void *lib) {
    cu_module_load = (module_load_fn)dlsym(lib, "cuModuleLoadData");
    cu_module_function = (module_function_fn)dlsym(lib, "cuModuleGetFunction");
    cu_capture_begin = (capture_begin_fn)dlsym(lib, "cuStreamBeginCapture_v2");
    cu_capture_end = (capture_end_fn)dlsym(lib, "cuStreamEndCapture");
    cu_capture_status = (capture_status_fn)dlsym(lib, "cuStreamIsCapturing");
    cu_graph_nodes = (graph_nodes_fn)dlsym(lib, "cuGraphGetNodes");
    cu_graph_instantiate = (graph_instantiate_fn)dlsym(lib, "cuGraphInstantiateWithFlags");
    cu_graph_launch = (graph_launch_fn)dlsym(lib, "cuGraphLaunch");
    cu_graph_destroy = (handle_fn)dlsym(lib, "cuGraphDestroy");
    cu_graph_exec_destroy = (handle_fn)dlsym(lib, "cuGraphExecDestroy");
    cu_memset_d32 = (memset_d32_fn)dlsym(lib, "cuMemsetD32Async");
    cu_host_register = (host_register_fn)dlsym(lib, "cuMemHostRegister_v2");
    cu_host_unregister = (handle_fn)dlsym(lib, "cuMemHostUnregister");
    cu_stream_create = (stream_create_fn)dlsym(lib, "cuStreamCreate");
    cu_stream_destroy = (handle_fn)dlsym(lib, "cuStreamDestroy_v2");
    cu_stream_sync = (handle_fn)dlsym(lib, "cuStreamSynchronize");
    cu_copy_htod = (copy_htod_fn)dlsym(lib, "cuMemcpyHtoDAsync_v2");
    cu_copy_dtoh = (copy_dtoh_fn)dlsym(lib, "cuMemcpyDtoHAsync_v2");
    cu_copy_dtod = (copy_dtod_fn)dlsym(lib, "cuMemcpyDtoDAsync_v2");
    cu_ctx_sync = (ctx_sync_fn)dlsym(lib, "cuCtxSynchronize");
    cu_elapsed = (elapsed_fn)dlsym(lib, "cuEventElapsedTime");
    cu_device_get = (device_get_fn)dlsym(lib, "cuDeviceGet");
    cu_device_attribute = (device_attribute_fn)dlsym(lib, "cuDeviceGetAttribute");
    cu_host_alloc = (host_alloc_fn)dlsym(lib, "cuMemHostAlloc");
    cu_host_free = (handle_fn)dlsym(lib, "cuMemFreeHost");
    cu_occupancy = (occupancy_fn)dlsym(lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
}

/* 1 if libcuda is loaded, the context current and `symbol` was found there
 * (found != 0); else 0 with an exception set. */
static int ready(const char *what, int found, const char *symbol) {
    if (!loaded(what)) return 0;
    if (!found) {
        PyErr_Format(PyExc_RuntimeError, "%s: this libcuda has no %s (driver too old?)", what,
                     symbol);
        return 0;
    }
    return 1;
}

static int check_nargs(const char *what, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want) return 1;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", what, want, nargs);
    return 0;
}

/* Argument `name` of `what` as an unsigned 64-bit int: TypeError unless an
 * int, OverflowError if negative or too large; 0 with the exception set. */
static int as_u64(const char *what, const char *name, PyObject *o, unsigned long long *out) {
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int, not %.200s", what, name,
                     Py_TYPE(o)->tp_name);
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return 0;
    *out = v;
    return 1;
}

static int as_pointer(const char *what, const char *name, PyObject *o, void **out) {
    unsigned long long v;
    if (!as_u64(what, name, o, &v)) return 0;
    if (v > UINTPTR_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s: %s does not fit a pointer", what, name);
        return 0;
    }
    *out = (void *)(uintptr_t)v;
    return 1;
}

/* A handle that must not be null (a module, graph or executable graph). */
static int as_handle(const char *what, const char *name, PyObject *o, void **out) {
    if (!as_pointer(what, name, o, out)) return 0;
    if (*out) return 1;
    PyErr_Format(PyExc_ValueError, "%s: null %s", what, name);
    return 0;
}

/* A byte or element count: as as_u64, but a negative one is a ValueError. */
static int as_size(const char *what, const char *name, PyObject *o, size_t *out) {
    if (PyBool_Check(o)) {   /* an int to Python, never a size */
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int, not bool", what, name);
        return 0;
    }
    int overflow = 0;
    long long sign = PyLong_Check(o) ? PyLong_AsLongLongAndOverflow(o, &overflow) : 0;
    if (overflow < 0 || (!overflow && sign < 0)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must not be negative", what, name);
        return 0;
    }
    unsigned long long v;
    if (!as_u64(what, name, o, &v)) return 0;
    if (v > SIZE_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s: %s too large", what, name);
        return 0;
    }
    *out = (size_t)v;
    return 1;
}

static int as_uint(const char *what, const char *name, PyObject *o, unsigned max,
                   unsigned *out) {
    unsigned long long v;
    if (!as_u64(what, name, o, &v)) return 0;
    if (v > max) {
        PyErr_Format(PyExc_OverflowError, "%s: %s out of range (at most %u)", what, name, max);
        return 0;
    }
    *out = (unsigned)v;
    return 1;
}

/* module_load(data: bytes) -> int: cuModuleLoadData of a cubin (or of
 * PTX: bytes objects end in a NUL). */
static PyObject *py_module_load(PyObject *self, PyObject *data) {
    (void)self;
    if (!PyBytes_Check(data)) {
        PyErr_Format(PyExc_TypeError, "module_load: data must be bytes, not %.200s",
                     Py_TYPE(data)->tp_name);
        return NULL;
    }
    if (!ready("module_load", cu_module_load != NULL, "cuModuleLoadData")) return NULL;
    const char *image = PyBytes_AS_STRING(data);
    void *module = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS   /* the driver may compile PTX here */
    rc = cu_module_load(&module, image);
    Py_END_ALLOW_THREADS
    if (rc) return driver_error("cuModuleLoadData", rc);
    return PyLong_FromVoidPtr(module);
}

/* module_function(module, name) -> int: cuModuleGetFunction. */
static PyObject *py_module_function(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "module_function";
    void *module;
    if (!check_nargs(what, nargs, 2) || !as_handle(what, "module", args[0], &module))
        return NULL;
    const char *name;
    Py_ssize_t len;
    if (PyBytes_Check(args[1])) {
        name = PyBytes_AS_STRING(args[1]);
        len = PyBytes_GET_SIZE(args[1]);
    } else if (PyUnicode_Check(args[1])) {
        name = PyUnicode_AsUTF8AndSize(args[1], &len);
        if (!name) return NULL;
    } else {
        PyErr_Format(PyExc_TypeError, "%s: name must be str or bytes, not %.200s", what,
                     Py_TYPE(args[1])->tp_name);
        return NULL;
    }
    if ((size_t)len != strlen(name)) {
        PyErr_Format(PyExc_ValueError, "%s: name contains a NUL byte", what);
        return NULL;
    }
    if (!ready(what, cu_module_function != NULL, "cuModuleGetFunction")) return NULL;
    void *fn = NULL;
    int rc = cu_module_function(&fn, module, name);
    if (rc) {
        char call[256];
        snprintf(call, sizeof call, "cuModuleGetFunction(%.200s)", name);
        return driver_error(call, rc);
    }
    return PyLong_FromVoidPtr(fn);
}

/* capture_begin(stream, mode): cuStreamBeginCapture with a CUstreamCaptureMode. */
static PyObject *py_capture_begin(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "capture_begin";
    void *stream;
    unsigned mode;
    if (!check_nargs(what, nargs, 2) || !as_pointer(what, "stream", args[0], &stream) ||
        !as_uint(what, "mode", args[1], INT_MAX, &mode))
        return NULL;
    if (!ready(what, cu_capture_begin != NULL, "cuStreamBeginCapture_v2")) return NULL;
    int rc = cu_capture_begin(stream, (int)mode);
    if (rc) return driver_error("cuStreamBeginCapture", rc);
    Py_RETURN_NONE;
}

/* capture_end(stream) -> int: cuStreamEndCapture; the captured graph. */
static PyObject *py_capture_end(PyObject *self, PyObject *arg) {
    (void)self;
    void *stream;
    if (!as_pointer("capture_end", "stream", arg, &stream)) return NULL;
    if (!ready("capture_end", cu_capture_end != NULL, "cuStreamEndCapture")) return NULL;
    void *graph = NULL;
    int rc = cu_capture_end(stream, &graph);
    if (rc) return driver_error("cuStreamEndCapture", rc);
    return PyLong_FromVoidPtr(graph);
}

/* capture_status(stream) -> int: cuStreamIsCapturing's CUstreamCaptureStatus
 * (0 none, 1 active, 2 invalidated). */
static PyObject *py_capture_status(PyObject *self, PyObject *arg) {
    (void)self;
    void *stream;
    if (!as_pointer("capture_status", "stream", arg, &stream)) return NULL;
    if (!ready("capture_status", cu_capture_status != NULL, "cuStreamIsCapturing"))
        return NULL;
    int status = 0;
    int rc = cu_capture_status(stream, &status);
    if (rc) return driver_error("cuStreamIsCapturing", rc);
    return PyLong_FromLong(status);
}

/* graph_node_count(graph) -> int: cuGraphGetNodes without a node array. */
static PyObject *py_graph_node_count(PyObject *self, PyObject *arg) {
    (void)self;
    void *graph;
    if (!as_handle("graph_node_count", "graph", arg, &graph)) return NULL;
    if (!ready("graph_node_count", cu_graph_nodes != NULL, "cuGraphGetNodes")) return NULL;
    size_t n = 0;
    int rc = cu_graph_nodes(graph, NULL, &n);
    if (rc) return driver_error("cuGraphGetNodes", rc);
    return PyLong_FromSize_t(n);
}

/* graph_instantiate(graph) -> int: cuGraphInstantiateWithFlags, no flags. */
static PyObject *py_graph_instantiate(PyObject *self, PyObject *arg) {
    (void)self;
    void *graph;
    if (!as_handle("graph_instantiate", "graph", arg, &graph)) return NULL;
    if (!ready("graph_instantiate", cu_graph_instantiate != NULL,
               "cuGraphInstantiateWithFlags"))
        return NULL;
    void *exe = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS   /* host work that grows with the graph */
    rc = cu_graph_instantiate(&exe, graph, 0);
    Py_END_ALLOW_THREADS
    if (rc) return driver_error("cuGraphInstantiate", rc);
    return PyLong_FromVoidPtr(exe);
}

/* graph_launch(exec, stream): cuGraphLaunch. */
static PyObject *py_graph_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "graph_launch";
    void *exe, *stream;
    if (!check_nargs(what, nargs, 2) || !as_handle(what, "exec", args[0], &exe) ||
        !as_pointer(what, "stream", args[1], &stream))
        return NULL;
    if (!ready(what, cu_graph_launch != NULL, "cuGraphLaunch")) return NULL;
    int rc = cu_graph_launch(exe, stream);
    if (rc) return driver_error("cuGraphLaunch", rc);
    Py_RETURN_NONE;
}

/* One handle, one driver call (graph_destroy, stream_free, stream_sync,
 * host_free, ...); `nogil` for a call that may wait, so that other Python
 * threads (prefetch's reader and stager) run meanwhile. */
static PyObject *handle_call(const char *what, const char *name, PyObject *arg, handle_fn fn,
                             const char *symbol, int nogil) {
    void *handle;
    if (!as_handle(what, name, arg, &handle)) return NULL;
    if (!ready(what, fn != NULL, symbol)) return NULL;
    int rc;
    if (nogil) {
        Py_BEGIN_ALLOW_THREADS
        rc = fn(handle);
        Py_END_ALLOW_THREADS
    } else {
        rc = fn(handle);
    }
    if (rc) return driver_error(symbol, rc);
    Py_RETURN_NONE;
}

static PyObject *py_graph_destroy(PyObject *self, PyObject *arg) {
    (void)self;
    return handle_call("graph_destroy", "graph", arg, cu_graph_destroy, "cuGraphDestroy", 0);
}

static PyObject *py_graph_exec_destroy(PyObject *self, PyObject *arg) {
    (void)self;
    return handle_call("graph_exec_destroy", "exec", arg, cu_graph_exec_destroy,
                       "cuGraphExecDestroy", 0);
}

/* memset_d32(address, value, count, stream): cuMemsetD32Async, `count`
 * 32-bit words at device `address` set to `value`. */
static PyObject *py_memset_d32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "memset_d32";
    unsigned long long address;
    unsigned value;
    size_t count;
    void *stream;
    if (!check_nargs(what, nargs, 4) || !as_u64(what, "address", args[0], &address) ||
        !as_uint(what, "value", args[1], UINT_MAX, &value) ||
        !as_size(what, "count", args[2], &count) ||
        !as_pointer(what, "stream", args[3], &stream))
        return NULL;
    if (!address) {
        PyErr_Format(PyExc_ValueError, "%s: null address", what);
        return NULL;
    }
    if (!ready(what, cu_memset_d32 != NULL, "cuMemsetD32Async")) return NULL;
    int rc = cu_memset_d32(address, value, count, stream);
    if (rc) return driver_error("cuMemsetD32Async", rc);
    Py_RETURN_NONE;
}

/* host_register(address, nbytes, flags): cuMemHostRegister; the driver
 * locks the pages, which takes time in proportion to nbytes. */
static PyObject *py_host_register(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "host_register";
    void *address;
    size_t nbytes;
    unsigned flags;
    if (!check_nargs(what, nargs, 3) || !as_pointer(what, "address", args[0], &address) ||
        !as_size(what, "nbytes", args[1], &nbytes) ||
        !as_uint(what, "flags", args[2], UINT_MAX, &flags))
        return NULL;
    if (!ready(what, cu_host_register != NULL, "cuMemHostRegister_v2")) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cu_host_register(address, nbytes, flags);
    Py_END_ALLOW_THREADS
    if (rc) return driver_error("cuMemHostRegister", rc);
    Py_RETURN_NONE;
}

/* host_unregister(address): cuMemHostUnregister of a range host_register locked. */
static PyObject *py_host_unregister(PyObject *self, PyObject *arg) {
    (void)self;
    void *address;
    if (!as_pointer("host_unregister", "address", arg, &address)) return NULL;
    if (!ready("host_unregister", cu_host_unregister != NULL, "cuMemHostUnregister"))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cu_host_unregister(address);
    Py_END_ALLOW_THREADS
    if (rc) return driver_error("cuMemHostUnregister", rc);
    Py_RETURN_NONE;
}

/* error_name(code) -> str: the driver's name of a CUresult. */
static PyObject *py_error_name(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned code;
    if (!as_uint("error_name", "code", arg, INT_MAX, &code)) return NULL;
    if (!libcuda_loaded("error_name")) return NULL;
    return PyUnicode_FromString(status_name((int)code));
}

/* blas_set_workspace(symbol, handle, address, nbytes): cublasSetWorkspace_v2
 * at address `symbol` (the caller's loaded cuBLAS). */
static PyObject *py_blas_set_workspace(PyObject *self, PyObject *const *args,
                                       Py_ssize_t nargs) {
    (void)self;
    const char *what = "blas_set_workspace";
    void *symbol, *handle, *address;
    size_t nbytes;
    if (!check_nargs(what, nargs, 4) || !as_handle(what, "symbol", args[0], &symbol) ||
        !as_pointer(what, "handle", args[1], &handle) ||
        !as_pointer(what, "address", args[2], &address) ||
        !as_size(what, "nbytes", args[3], &nbytes))
        return NULL;
    int status = ((set_workspace_fn)(uintptr_t)symbol)(handle, address, nbytes);
    if (status) return blas_error("cublasSetWorkspace_v2", status);
    Py_RETURN_NONE;
}

/* Streams ------------------------------------------------------------------ */
#define CU_STREAM_NON_BLOCKING 1

/* stream_new() -> int: cuStreamCreate of a stream that does not wait for
 * the legacy NULL stream (CU_STREAM_NON_BLOCKING). */
static PyObject *py_stream_new(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    if (!ready("stream_new", cu_stream_create != NULL, "cuStreamCreate")) return NULL;
    void *stream = NULL;
    int rc = cu_stream_create(&stream, CU_STREAM_NON_BLOCKING);
    if (rc) return driver_error("cuStreamCreate", rc);
    return PyLong_FromVoidPtr(stream);
}

static PyObject *py_stream_free(PyObject *self, PyObject *arg) {
    (void)self;
    return handle_call("stream_free", "stream", arg, cu_stream_destroy, "cuStreamDestroy_v2", 0);
}

/* stream_sync(stream): cuStreamSynchronize; other Python threads (prefetch's
 * reader and stager) run while this one waits. */
static PyObject *py_stream_sync(PyObject *self, PyObject *arg) {
    (void)self;
    return handle_call("stream_sync", "stream", arg, cu_stream_sync, "cuStreamSynchronize", 1);
}

/* context_sync(): cuCtxSynchronize, without the GIL. */
static PyObject *py_context_sync(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    if (!ready("context_sync", cu_ctx_sync != NULL, "cuCtxSynchronize")) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cu_ctx_sync();
    Py_END_ALLOW_THREADS
    if (rc) return driver_error("cuCtxSynchronize", rc);
    Py_RETURN_NONE;
}

/* Copies ------------------------------------------------------------------- */

/* The host side of a copy: a C-contiguous buffer (writable for `writable`),
 * its bytes in the order of the device array's (a Fortran-ordered one would
 * arrive transposed); 0 with an exception set.  The caller releases it
 * (PyBuffer_Release). */
static int host_buffer(const char *what, const char *name, PyObject *o, int writable,
                       Py_buffer *view) {
    if (!PyObject_CheckBuffer(o)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a host array (buffer), not %.200s", what,
                     name, Py_TYPE(o)->tp_name);
        return 0;
    }
    return PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0))
           == 0;
}

/* copy_htod(dst, src, stream): cuMemcpyHtoDAsync of host buffer `src` (all
 * of it) to device address `dst`.  Without the GIL: from pageable memory
 * the driver stages the data before it returns. */
static PyObject *py_copy_htod(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "copy_htod";
    unsigned long long dst;
    void *stream;
    if (!check_nargs(what, nargs, 3) || !as_u64(what, "dst", args[0], &dst) ||
        !as_pointer(what, "stream", args[2], &stream))
        return NULL;
    Py_buffer src;
    if (!host_buffer(what, "src", args[1], 0, &src)) return NULL;
    if (!dst || !ready(what, cu_copy_htod != NULL, "cuMemcpyHtoDAsync_v2")) {
        if (!dst) PyErr_Format(PyExc_ValueError, "%s: null dst", what);
        PyBuffer_Release(&src);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cu_copy_htod(dst, src.buf, (size_t)src.len, stream);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    if (rc) return driver_error("cuMemcpyHtoDAsync", rc);
    Py_RETURN_NONE;
}

/* copy_dtoh(dst, src, stream): cuMemcpyDtoHAsync from device address `src`
 * into writable host buffer `dst` (all of it), without the GIL. */
static PyObject *py_copy_dtoh(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "copy_dtoh";
    unsigned long long src;
    void *stream;
    if (!check_nargs(what, nargs, 3) || !as_u64(what, "src", args[1], &src) ||
        !as_pointer(what, "stream", args[2], &stream))
        return NULL;
    Py_buffer dst;
    if (!host_buffer(what, "dst", args[0], 1, &dst)) return NULL;
    if (!src || !ready(what, cu_copy_dtoh != NULL, "cuMemcpyDtoHAsync_v2")) {
        if (!src) PyErr_Format(PyExc_ValueError, "%s: null src", what);
        PyBuffer_Release(&dst);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cu_copy_dtoh(dst.buf, src, (size_t)dst.len, stream);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&dst);
    if (rc) return driver_error("cuMemcpyDtoHAsync", rc);
    Py_RETURN_NONE;
}

/* copy_dtod(dst, src, nbytes, stream): cuMemcpyDtoDAsync between device
 * addresses; queued on the stream, so the GIL is kept. */
static PyObject *py_copy_dtod(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "copy_dtod";
    unsigned long long dst, src;
    size_t nbytes;
    void *stream;
    if (!check_nargs(what, nargs, 4) || !as_u64(what, "dst", args[0], &dst) ||
        !as_u64(what, "src", args[1], &src) || !as_size(what, "nbytes", args[2], &nbytes) ||
        !as_pointer(what, "stream", args[3], &stream))
        return NULL;
    if (!dst || !src) {
        PyErr_Format(PyExc_ValueError, "%s: null address", what);
        return NULL;
    }
    if (!ready(what, cu_copy_dtod != NULL, "cuMemcpyDtoDAsync_v2")) return NULL;
    int rc = cu_copy_dtod(dst, src, nbytes, stream);
    if (rc) return driver_error("cuMemcpyDtoDAsync", rc);
    Py_RETURN_NONE;
}

/* Page-locked host memory ---------------------------------------------------- */

/* host_alloc(nbytes) -> int: cuMemHostAlloc (no flags), the address of
 * nbytes (> 0) page-locked bytes; the driver locks them without the GIL. */
static PyObject *py_host_alloc(PyObject *self, PyObject *arg) {
    (void)self;
    size_t nbytes;
    if (!as_size("host_alloc", "nbytes", arg, &nbytes)) return NULL;
    if (!nbytes) {
        PyErr_SetString(PyExc_ValueError, "host_alloc: nbytes must be positive");
        return NULL;
    }
    if (!ready("host_alloc", cu_host_alloc != NULL, "cuMemHostAlloc")) return NULL;
    void *address = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cu_host_alloc(&address, nbytes, 0);
    Py_END_ALLOW_THREADS
    if (rc) return driver_error("cuMemHostAlloc", rc);
    return PyLong_FromVoidPtr(address);
}

/* host_free(address): cuMemFreeHost of host_alloc's memory, without the GIL. */
static PyObject *py_host_free(PyObject *self, PyObject *arg) {
    (void)self;
    return handle_call("host_free", "address", arg, cu_host_free, "cuMemFreeHost", 1);
}

/* Timing events and device attributes ---------------------------------------- */

/* event_elapsed(start, end) -> float: cuEventElapsedTime, the milliseconds
 * between two completed timing events. */
static PyObject *py_event_elapsed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "event_elapsed";
    void *start, *end;
    if (!check_nargs(what, nargs, 2) || !as_handle(what, "start", args[0], &start) ||
        !as_handle(what, "end", args[1], &end))
        return NULL;
    if (!ready(what, cu_elapsed != NULL, "cuEventElapsedTime")) return NULL;
    float ms = 0.0f;
    int rc = cu_elapsed(&ms, start, end);
    if (rc) return driver_error("cuEventElapsedTime", rc);
    return PyFloat_FromDouble((double)ms);
}

/* device_attribute(attribute, ordinal) -> int: cuDeviceGetAttribute of a
 * CUdevice_attribute (cuda.h's number) of the device at `ordinal`. */
static PyObject *py_device_attribute(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "device_attribute";
    unsigned attribute, ordinal;
    if (!check_nargs(what, nargs, 2) || !as_uint(what, "attribute", args[0], INT_MAX, &attribute) ||
        !as_uint(what, "ordinal", args[1], INT_MAX, &ordinal))
        return NULL;
    if (!ready(what, cu_device_get != NULL && cu_device_attribute != NULL,
               "cuDeviceGetAttribute"))
        return NULL;
    int device = 0, value = 0;
    int rc = cu_device_get(&device, (int)ordinal);
    if (rc) return driver_error("cuDeviceGet", rc);
    rc = cu_device_attribute(&value, (int)attribute, device);
    if (rc) return driver_error("cuDeviceGetAttribute", rc);
    return PyLong_FromLong(value);
}

/* The most threads a block may have (every GPU since compute capability 2.0). */
#define MAX_BLOCK_THREADS 1024

/* occupancy(function, block, dynamic_smem) -> int:
 * cuOccupancyMaxActiveBlocksPerMultiprocessor, the blocks of `block`
 * threads (1 to 1024) of kernel `function` (a CUfunction) that one
 * multiprocessor holds at once with `dynamic_smem` bytes of dynamic shared
 * memory each: the least that the kernel's registers, its shared memory and
 * the multiprocessor's threads and blocks allow (0 where one block does not
 * fit).  The reduction planners size their grids by it. */
static PyObject *py_occupancy(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *what = "occupancy";
    void *function;
    unsigned block;
    size_t smem;
    if (!check_nargs(what, nargs, 3) || !as_handle(what, "function", args[0], &function) ||
        !as_uint(what, "block", args[1], INT_MAX, &block) ||
        !as_size(what, "dynamic_smem", args[2], &smem))
        return NULL;
    if (block < 1 || block > MAX_BLOCK_THREADS) {
        PyErr_Format(PyExc_ValueError, "%s: block must be 1 to %d threads, not %u", what,
                     MAX_BLOCK_THREADS, block);
        return NULL;
    }
    if (!ready(what, cu_occupancy != NULL, "cuOccupancyMaxActiveBlocksPerMultiprocessor"))
        return NULL;
    int blocks = 0;
    int rc = cu_occupancy(&blocks, function, (int)block, smem);
    if (rc) return driver_error("cuOccupancyMaxActiveBlocksPerMultiprocessor", rc);
    return PyLong_FromLong(blocks);
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

static PyMethodDef driver_methods[] = {
    {"module_load", py_module_load, METH_O,
     "module_load(data: bytes) -> int: cuModuleLoadData; the CUmodule."},
    {"module_function", FASTCALL(py_module_function),
     "module_function(module, name) -> int: cuModuleGetFunction; the CUfunction."},
    {"capture_begin", FASTCALL(py_capture_begin),
     "capture_begin(stream, mode): cuStreamBeginCapture in CUstreamCaptureMode `mode`."},
    {"capture_end", py_capture_end, METH_O,
     "capture_end(stream) -> int: cuStreamEndCapture; the captured CUgraph."},
    {"capture_status", py_capture_status, METH_O,
     "capture_status(stream) -> int: cuStreamIsCapturing (0 none, 1 active, 2 invalidated)."},
    {"graph_node_count", py_graph_node_count, METH_O,
     "graph_node_count(graph) -> int: the number of nodes (cuGraphGetNodes)."},
    {"graph_instantiate", py_graph_instantiate, METH_O,
     "graph_instantiate(graph) -> int: cuGraphInstantiateWithFlags; the CUgraphExec."},
    {"graph_launch", FASTCALL(py_graph_launch), "graph_launch(exec, stream): cuGraphLaunch."},
    {"graph_destroy", py_graph_destroy, METH_O, "graph_destroy(graph): cuGraphDestroy."},
    {"graph_exec_destroy", py_graph_exec_destroy, METH_O,
     "graph_exec_destroy(exec): cuGraphExecDestroy."},
    {"memset_d32", FASTCALL(py_memset_d32),
     "memset_d32(address, value, count, stream): cuMemsetD32Async."},
    {"host_register", FASTCALL(py_host_register),
     "host_register(address, nbytes, flags): cuMemHostRegister (without the GIL)."},
    {"host_unregister", py_host_unregister, METH_O,
     "host_unregister(address): cuMemHostUnregister."},
    {"error_name", py_error_name, METH_O,
     "error_name(code) -> str: the driver's name of a CUresult."},
    {"blas_set_workspace", FASTCALL(py_blas_set_workspace),
     "blas_set_workspace(symbol, handle, address, nbytes): cublasSetWorkspace_v2 at `symbol`."},
    {"stream_new", py_stream_new, METH_NOARGS,
     "stream_new() -> int: cuStreamCreate, a CU_STREAM_NON_BLOCKING CUstream."},
    {"stream_free", py_stream_free, METH_O, "stream_free(stream): cuStreamDestroy."},
    {"stream_sync", py_stream_sync, METH_O,
     "stream_sync(stream): cuStreamSynchronize (without the GIL)."},
    {"context_sync", py_context_sync, METH_NOARGS,
     "context_sync(): cuCtxSynchronize (without the GIL)."},
    {"copy_htod", FASTCALL(py_copy_htod),
     "copy_htod(dst, src, stream): cuMemcpyHtoDAsync of the whole host buffer `src` to "
     "device address `dst` (without the GIL)."},
    {"copy_dtoh", FASTCALL(py_copy_dtoh),
     "copy_dtoh(dst, src, stream): cuMemcpyDtoHAsync from device address `src` into the "
     "whole writable host buffer `dst` (without the GIL)."},
    {"copy_dtod", FASTCALL(py_copy_dtod),
     "copy_dtod(dst, src, nbytes, stream): cuMemcpyDtoDAsync between device addresses."},
    {"host_alloc", py_host_alloc, METH_O,
     "host_alloc(nbytes) -> int: cuMemHostAlloc; the address of nbytes page-locked bytes."},
    {"host_free", py_host_free, METH_O, "host_free(address): cuMemFreeHost."},
    {"event_elapsed", FASTCALL(py_event_elapsed),
     "event_elapsed(start, end) -> float: cuEventElapsedTime, milliseconds."},
    {"device_attribute", FASTCALL(py_device_attribute),
     "device_attribute(attribute, ordinal) -> int: cuDeviceGetAttribute of the device at "
     "`ordinal`."},
    {"occupancy", FASTCALL(py_occupancy),
     "occupancy(function, block, dynamic_smem) -> int: "
     "cuOccupancyMaxActiveBlocksPerMultiprocessor, the blocks of `block` threads of kernel "
     "`function` one multiprocessor holds at once."},
    {NULL, NULL, 0, NULL},
};

int add_driver_functions(PyObject *module) {
    return PyModule_AddFunctions(module, driver_methods);
}
