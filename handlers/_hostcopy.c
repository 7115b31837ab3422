/* handlers._hostcopy: one host-to-host byte copy split across threads that
 * never touch the interpreter.
 *
 * prefetch's stager copies each batch into page-locked staging memory, and on
 * the GPU machines one thread copies only 7-9 GB/s (a 4 MB batch: ~450-550
 * us).  Splitting the copy over Python threads (each calling np.copyto, which
 * releases the GIL) helps alone, but each worker must take the GIL to start
 * and to finish its part: inside an upload loop, where the consumer's thread
 * runs Python most of the time, those hand-offs wait, and the reader's copy
 * took twice its time alone.  Here the calling thread releases the GIL once
 * and shares the copy with POSIX worker threads that never take it.
 *
 * The workers are started on first use and kept, asleep on a condition
 * variable between copies: starting threads per call cost tens of us each on
 * the GPU machines' virtual CPUs, enough that eight threads copied slower
 * than four.  A copy is cut into chunks that the caller and the woken workers
 * claim one at a time, so a worker that wakes late takes less work instead of
 * holding the copy up.  One copy runs at a time (a second caller waits, with
 * the GIL released); after fork() the child starts workers of its own.
 *
 * It needs only a C compiler and Python's headers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

#define MAX_THREADS 64
/* Chunks per thread taking part: enough for late wakers to even out. */
#define CHUNKS_PER_THREAD 4
/* Chunks start on cache-line boundaries of the copy's start. */
#define ALIGN 64

/* The pool's state; `lock` guards every field. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;      /* workers: a new copy (generation) is posted */
    pthread_cond_t finished;  /* the caller: every chunk is copied */
    int workers;              /* workers started (ids 0 .. workers - 1) */
    unsigned long generation; /* bumped once per copy */
    int helpers;              /* workers taking part in this copy */
    char *dst;
    const char *src;
    size_t n, chunk;          /* bytes, and bytes per chunk */
    size_t next;              /* the next chunk's offset */
    size_t unfinished;        /* bytes claimed or unclaimed, not yet copied */
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER,
          .finished = PTHREAD_COND_INITIALIZER};
/* Serializes copies: a copy owns the pool from posting to finishing. */
static pthread_mutex_t one_copy = PTHREAD_MUTEX_INITIALIZER;

/* Claim and copy chunks until none is left; `pool.lock` held on entry and on
 * return, released while copying. */
static void copy_chunks(void) {
    while (pool.next < pool.n) {
        size_t lo = pool.next;
        size_t len = pool.n - lo < pool.chunk ? pool.n - lo : pool.chunk;
        pool.next = lo + len;
        pthread_mutex_unlock(&pool.lock);
        memcpy(pool.dst + lo, pool.src + lo, len);
        pthread_mutex_lock(&pool.lock);
        pool.unfinished -= len;
        if (!pool.unfinished)
            pthread_cond_signal(&pool.finished);
    }
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.lock);
    unsigned long seen = pool.generation;
    for (;;) {
        while (pool.generation == seen)
            pthread_cond_wait(&pool.wake, &pool.lock);
        seen = pool.generation;
        if (id < pool.helpers)
            copy_chunks();
    }
    return NULL;
}

/* Start workers until `want` run; fewer if the system refuses threads (the
 * caller copies whatever they do not).  Called with `one_copy` held. */
static void start_workers(int want) {
    sigset_t all, old;
    sigfillset(&all);
    /* Workers inherit a mask blocking every signal: signals go to the
     * interpreter's threads, as Python expects. */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (pool.workers < want) {
        pthread_t id;
        pthread_attr_t attr;
        int ok = pthread_attr_init(&attr) == 0;
        if (ok) {
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            pthread_attr_setstacksize(&attr, 1 << 16);
            ok = pthread_create(&id, &attr, worker, (void *)(intptr_t)pool.workers) == 0;
            pthread_attr_destroy(&attr);
        }
        if (!ok)
            break;
        pool.workers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* In a child after fork() only the forking thread exists: no workers, and the
 * locks may have been held by threads that are gone. */
static void after_fork_in_child(void) {
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.finished, NULL);
    pthread_mutex_init(&one_copy, NULL);
    pool.workers = 0;
    pool.helpers = 0;
}

static void pooled_copy(char *dst, const char *src, size_t n, int threads) {
    pthread_mutex_lock(&one_copy);
    if (threads > 1 && pool.workers < threads - 1)
        start_workers(threads - 1);
    int helpers = threads - 1 < pool.workers ? threads - 1 : pool.workers;
    size_t chunks = (size_t)(helpers + 1) * CHUNKS_PER_THREAD;
    size_t chunk = (n / chunks + ALIGN - 1) / ALIGN * ALIGN;
    pthread_mutex_lock(&pool.lock);
    pool.dst = dst;
    pool.src = src;
    pool.n = pool.unfinished = n;
    pool.chunk = chunk ? chunk : ALIGN;
    pool.next = 0;
    pool.helpers = helpers;
    if (helpers) {
        pool.generation++;
        pthread_cond_broadcast(&pool.wake);
    }
    copy_chunks();
    while (pool.unfinished)
        pthread_cond_wait(&pool.finished, &pool.lock);
    pool.helpers = 0;
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&one_copy);
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
    if (!n) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    pooled_copy((char *)dst, (const char *)src, n, (int)threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* workers(): see the method table. */
static PyObject *py_workers(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    int n;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&one_copy);
    n = pool.workers;
    pthread_mutex_unlock(&one_copy);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(n);
}

static PyMethodDef methods[] = {
    {"copy", (PyCFunction)(void (*)(void))py_copy, METH_FASTCALL,
     "copy(dst_address, src_address, nbytes, threads): copy nbytes bytes between\n"
     "two non-overlapping host ranges, shared by the calling thread and up to\n"
     "threads - 1 of the module's worker threads, without the GIL.  The caller\n"
     "keeps both ranges alive and unchanged until it returns."},
    {"workers", py_workers, METH_NOARGS,
     "workers(): how many worker threads this process has started (they are\n"
     "kept, asleep between copies, for the process's life)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "handlers._hostcopy",
    "Host byte copies split across threads that never take the GIL.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hostcopy(void) {
    static int registered = 0;
    if (!registered) {
        if (pthread_atfork(NULL, NULL, after_fork_in_child) != 0) {
            PyErr_SetString(PyExc_OSError, "handlers._hostcopy: pthread_atfork failed");
            return NULL;
        }
        registered = 1;
    }
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "MAX_THREADS", MAX_THREADS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
