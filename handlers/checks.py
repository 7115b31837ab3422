"""Cheap argument validation shared by every handler.

Each check runs before an op touches memory, so a failing op leaves its outputs
untouched.  Messages name the op and the offending shapes.  The checks are plain
attribute comparisons (no array traversal), so they cost about a microsecond.
"""
import math
import numbers
import reprlib

import numpy as np

#: The most bytes an array can span: the largest signed 64-bit size.
MAX_ARRAY_BYTES = 2**63 - 1


def fail_type(op, msg):
    raise TypeError(f"{op}: {msg}")


def fail_value(op, msg):
    raise ValueError(f"{op}: {msg}")


def check_arrays(handler, op, *arrays):
    """Check array type, dtype and C-contiguity of each array in ``arrays``."""
    array_type, dtype, c_strides = handler.array_type, handler.dtype, handler._c_strides
    for a in arrays:   # fast path: exact type, dtype object and C strides
        if type(a) is not array_type or a.dtype is not dtype \
                or a.strides != c_strides.get(a.shape):
            break
    else:
        return
    for a in arrays:
        _check_one(handler, op, a, _own_format)


def check_writable(op, names, *arrays):
    """Raise ValueError naming ``op`` and the output if one of ``arrays``
    (an op's outputs, named ``names``) is read-only memory: checked with the
    other rules, so that an op writes none of its outputs when one of them
    cannot be written."""
    for name, a in zip(names, arrays):
        if not a.flags.writeable:
            fail_value(op, f"{name} (shape {a.shape}) is read-only memory; an op's outputs "
                           f"must be writeable")


def _own_format(handler, op, a):
    dtype = handler.dtype
    if a.dtype is not dtype and a.dtype != dtype:   # identity first: the common case
        fail_type(op, f"expected dtype {dtype}, got {a.dtype} (shape {a.shape})")


def _class_format(handler, op, a):
    if getattr(a.dtype, "name", None) not in handler.supported_dtypes:
        fail_type(op, f"expected a format {type(handler).__name__} holds "
                      f"({', '.join(handler.supported_dtypes)}), got {a.dtype} (shape {a.shape})")


def _check_one(handler, op, a, check_format):
    """Array type, then ``check_format(handler, op, a)``, then C-contiguity:
    the full checks, which raise the precise error."""
    array_type = handler.array_type
    if not isinstance(a, array_type) or isinstance(a, handler.refused_array_types):
        fail_type(op, f"expected {array_type.__module__}.{array_type.__name__}, "
                      f"got {type(a).__module__}.{type(a).__name__}")
    check_format(handler, op, a)
    if not handler._c_contiguous(a):
        fail_value(op, f"array of shape {a.shape} is not C-contiguous")


def check_any_format(handler, op, a):
    """Check array type and C-contiguity of ``a``, and that its format is one
    ``handler``'s class holds (``supported_dtypes``), not necessarily the
    handler's own (``cast_t``'s source)."""
    _check_one(handler, op, a, _class_format)


def check_same_shape(handler, op, *arrays):
    """Check type/dtype/contiguity and that all arrays have one shape."""
    # Fast path: one test per array for the common case of exact types and C
    # strides already seen; any doubt goes to the full checks below, which
    # raise the precise error (and cache the strides of a new shape).
    array_type, dtype = handler.array_type, handler.dtype
    a = arrays[0]
    shape = a.shape if type(a) is array_type else None
    strides = handler._c_strides.get(shape)
    for a in arrays:
        if type(a) is not array_type or a.dtype is not dtype or a.shape != shape \
                or a.strides != strides:
            break
    else:
        return
    check_arrays(handler, op, *arrays)
    shape = arrays[0].shape
    for a in arrays[1:]:
        if a.shape != shape:
            fail_value(op, "shapes differ: " + ", ".join(str(x.shape) for x in arrays))


def check_ndim(op, a, ndim, name="array"):
    if len(a.shape) != ndim:
        fail_value(op, f"{name} must be {ndim}-D, got shape {a.shape}")


def check_scalar(op, name, value):
    """Return ``value`` as a Python float, or raise TypeError naming the op."""
    if type(value) is float:    # the common case, without the ABC check below
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "fiu":
        return float(value)
    fail_type(op, f"{name} must be a real number, got {type(value).__name__} "
                  f"{reprlib.repr(value)}")


def check_flag(op, name, value):
    """Return ``value`` as a bool if it is one (``numpy.bool_`` included);
    anything else, a truthy string say, raises TypeError."""
    if type(value) is bool or isinstance(value, np.bool_):
        return bool(value)
    fail_type(op, f"{name} must be a bool, got {type(value).__name__} {value!r}")


def check_array_scalar(handler, op, name, value, out):
    """Return ``value`` as a Python float, or, if it is an array of ``handler``
    (a device scalar, read when the op runs), the array itself after checking
    that it has one element and does not overlap the op's output ``out``."""
    if type(value) is float:
        return value
    if isinstance(value, handler.array_type) and getattr(value, "ndim", 0) > 0:
        check_arrays(handler, op, value)
        if value.size != 1:
            fail_value(op, f"{name} as a device scalar must have one element, "
                           f"got shape {value.shape}")
        if isinstance(out, handler.array_type) and handler._overlaps(value, out):
            fail_value(op, f"{name} must not overlap the output")
        return value
    return check_scalar(op, name, value)


def normalize_axis(op, axis, ndim):
    """Return ``axis`` in ``range(ndim)``; accepts negative axes."""
    if type(axis) is int and 0 <= axis < ndim:   # the common case, without ABC checks
        return axis
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        fail_type(op, f"axis must be an int or None, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        fail_value(op, f"axis {axis} is out of range for an array of {ndim} dimensions")
    return int(axis) % ndim


def check_shape_arg(op, shape, itemsize=None):
    """Normalise a shape argument (int or tuple of non-negative ints).

    With ``itemsize`` (the allocators: bytes per element), also raise
    ValueError naming the shape and the bytes when the array would span
    more than :data:`MAX_ARRAY_BYTES`, which no machine can allocate (and
    which would overflow a size in C); a smaller array too big for the
    memory at hand is the backend's ``MemoryError``."""
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (int(shape),)
    try:
        dims = tuple(shape)
    except TypeError:
        dims = None
    if dims is None or any(isinstance(s, bool) or not isinstance(s, numbers.Integral)
                           for s in dims):
        fail_type(op, f"shape must be an int or a tuple of ints, got {shape!r}")
    shape = tuple(int(s) for s in dims)
    if any(s < 0 for s in shape):
        fail_value(op, f"shape {shape} has a negative dimension")
    if itemsize is not None:
        n = math.prod(shape)
        if n * itemsize > MAX_ARRAY_BYTES:
            fail_value(op, f"{n} elements of {itemsize} bytes need {n * itemsize} bytes, more "
                           f"than any array can span (2**63 - 1 bytes), got shape {shape}")
    return shape

