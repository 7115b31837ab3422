/* handlers._hostcopy: one host-to-host byte copy split across threads that
 * never touch the interpreter.
 *
 * prefetch's stager copies each batch into page-locked staging memory, and on
 * the GPU machines one thread copies only 7-9 GB/s (a 4 MB batch: ~450-550
 * us).  Splitting the copy over Python threads (each calling np.copyto, which
 * releases the GIL) helps alone but each worker must take the GIL to start and
 * to finish its part: inside an upload loop, where the consumer's thread runs
 * Python most of the time, those hand-offs wait, and the reader's copy took
 * twice its time alone.  Here the calling thread releases the GIL once, starts
 * threads - 1 POSIX threads, copies the first part itself and joins the rest:
 * no worker ever needs the GIL.  Threads are started per call (some us each),
 * which is small beside the copies of a megabyte or more this is used for.
 *
 * It needs only a C compiler and Python's headers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define MAX_THREADS 64
/* Parts start on cache-line boundaries of the source offset. */
#define ALIGN 64

typedef struct {
    char *dst;
    const char *src;
    size_t n;
} part_t;

static void *copy_part(void *arg) {
    part_t *p = (part_t *)arg;
    if (p->n) memcpy(p->dst, p->src, p->n);
    return NULL;
}

/* copy(dst_address, src_address, nbytes, threads): see the method table. */
static PyObject *py_copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "copy(dst_address, src_address, nbytes, threads) takes 4 arguments");
        return NULL;
    }
    uintptr_t dst = (uintptr_t)PyLong_AsUnsignedLongLong(args[0]);
    if (PyErr_Occurred()) return NULL;
    uintptr_t src = (uintptr_t)PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[2]);
    if (nbytes == -1 && PyErr_Occurred()) return NULL;
    long threads = PyLong_AsLong(args[3]);
    if (threads == -1 && PyErr_Occurred()) return NULL;
    if (nbytes < 0) {
        PyErr_SetString(PyExc_ValueError, "copy: nbytes must be >= 0");
        return NULL;
    }
    if (threads < 1 || threads > MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "copy: threads must be 1 to %d, not %ld", MAX_THREADS,
                     threads);
        return NULL;
    }
    if (nbytes && (!dst || !src)) {
        PyErr_SetString(PyExc_ValueError, "copy: a null address");
        return NULL;
    }
    size_t n = (size_t)nbytes;
    if (n && (dst < src ? src - dst < n : dst - src < n)) {
        PyErr_SetString(PyExc_ValueError, "copy: the two ranges overlap");
        return NULL;
    }
    part_t parts[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS];
    size_t step = (n / (size_t)threads + ALIGN - 1) / ALIGN * ALIGN;
    for (long i = 0; i < threads; i++) {
        size_t lo = (size_t)i * step, hi = lo + step;
        if (lo > n) lo = n;
        if (hi > n || i == threads - 1) hi = n;
        parts[i].dst = (char *)dst + lo;
        parts[i].src = (const char *)src + lo;
        parts[i].n = hi - lo;
        started[i] = 0;
    }
    Py_BEGIN_ALLOW_THREADS
    for (long i = 1; i < threads; i++) {
        if (parts[i].n)   /* a thread that cannot start: its part is copied below */
            started[i] = pthread_create(&ids[i], NULL, copy_part, &parts[i]) == 0;
    }
    copy_part(&parts[0]);
    for (long i = 1; i < threads; i++) {
        if (started[i])
            pthread_join(ids[i], NULL);
        else
            copy_part(&parts[i]);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"copy", (PyCFunction)(void (*)(void))py_copy, METH_FASTCALL,
     "copy(dst_address, src_address, nbytes, threads): copy nbytes bytes between\n"
     "two non-overlapping host ranges, split in `threads` nearly equal parts\n"
     "copied at once (the caller's thread copies one), without the GIL.  The\n"
     "caller keeps both ranges alive and unchanged until it returns."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "handlers._hostcopy",
    "Host byte copies split across threads that never take the GIL.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hostcopy(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "MAX_THREADS", MAX_THREADS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
