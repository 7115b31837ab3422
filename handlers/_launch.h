/* Shared by the sources of handlers._launch (_launch.c, _one_call.c). */
#ifndef HANDLERS_LAUNCH_H
#define HANDLERS_LAUNCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* cuLaunchKernel; NULL until load() has found libcuda. */
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
extern launch_fn cu_launch;

#define MAX_ARGS 16
#define MAX_BYTES 256

/* Pack args by fmt (struct codes P q Q i f d, native alignment) into buf;
 * params[i] points at argument i.  Returns the number of bytes used, or -1
 * with a Python exception set. */
Py_ssize_t pack_args(const char *fmt, Py_ssize_t nfmt, PyObject *const *args, Py_ssize_t nargs,
                     char *buf, void **params);

/* Set a RuntimeError naming the failed driver call and its error; returns NULL. */
PyObject *driver_error(const char *what, int rc);

/* 1 if libcuda is loaded, else 0 with a RuntimeError naming `what`. */
int loaded(const char *what);

/* Add the OneCall type to the module; -1 with an exception set on failure. */
int add_one_call_type(PyObject *module);

#endif
