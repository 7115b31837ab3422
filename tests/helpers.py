"""Shared test helpers: random inputs, poisoned outputs, tolerances, comparison.

References are always plain NumPy in float64, computed on float64 copies of the
inputs *as the handler holds them* (i.e. after rounding to the handler's dtype),
so the only error measured is the handler's own.
"""
import math

import numpy as np

from handlers import dtypes


def rand(shape, rng, low=-1.0, high=1.0):
    """Fresh float64 uniform data in [low, high), with no exact zeros."""
    a = rng.uniform(low, high, shape)
    nonzero = high / 2 if (low + high) / 2 == 0 else (low + high) / 2
    return np.where(a == 0, nonzero, a)


def as_handler_values(handler, data):
    """``data`` rounded to the handler's dtype, returned as float64."""
    return np.asarray(data, dtype=handler.dtype).astype(np.float64)


def upload(handler, data):
    """Return (handler array holding ``data``, float64 reference of its values)."""
    return handler.create_from_numpy(data), as_handler_values(handler, data)


def rand_input(handler, shape, rng, low=-1.0, high=1.0):
    """Random handler array and its float64 reference: see ``rand``."""
    return upload(handler, rand(shape, rng, low, high))


def poisoned(handler, shape):
    """A handler array filled with NaN: an element an op fails to write shows up."""
    return handler.create_from_numpy(np.full(shape, np.nan))


def tolerance(handler, n=1):
    """(rtol, atol) for comparing a handler result with a float64 reference.

    ``n`` is the length of the longest sum behind one result element (1 for
    elementwise ops, k for a dot, the reduced length for sum_t).  A float32 sum
    of n unit-scale terms summed one after another has an error that grows like
    eps * n; 5e-5 * sqrt(n) still keeps a 2x margin over that at n = 2**20 while
    staying well below the size of one dropped or doubled term.
    """
    dt = np.dtype(handler.dtype)
    if dtypes.is_half(dt):
        # Computed in float32 (its tolerance), then rounded once to the format:
        # at most one unit roundoff more, relative, or half a subnormal step.
        rt, at = tolerance_of(np.float32, n)
        return rt + 1.01 * dtypes.unit_roundoff(dt), at + dtypes.smallest_subnormal(dt)
    return tolerance_of(dt, n)


def by_dtype(handler, f32, f64):
    """A tolerance chosen per format: ``f32`` for float32, ``f64`` for
    float64; a half format computes in float32 and rounds once, so ``f32``
    plus one unit roundoff of the format."""
    dt = np.dtype(handler.dtype)
    if dtypes.is_half(dt):
        return f32 + 1.01 * dtypes.unit_roundoff(dt)
    return f32 if dt == np.float32 else f64


def tolerance_of(dtype, n=1):
    """``tolerance`` for float32 or float64 results."""
    if np.dtype(dtype) == np.float32:
        return 1e-5, (1e-6 if n <= 1 else 5e-5 * math.sqrt(n))
    return 1e-12, 1e-12 * max(1.0, math.sqrt(n))


def assert_close(handler, actual, expected, n=1, rtol=None, atol=None, err_msg=""):
    """Copy ``actual`` back and compare it with the float64 ``expected``.

    NaN passes only where ``expected`` is NaN too; infinities must match exactly.
    """
    got = handler.get_numpy_copy(actual)
    expected = np.asarray(expected, dtype=np.float64)
    assert isinstance(got, np.ndarray), f"get_numpy_copy returned {type(got).__name__}"
    assert got.dtype == handler.dtype, f"result dtype {got.dtype}, handler dtype {handler.dtype}"
    assert got.shape == expected.shape, f"result shape {got.shape}, expected {expected.shape}"
    rt, at = tolerance(handler, n)
    np.testing.assert_allclose(got.astype(np.float64), expected,
                               rtol=rt if rtol is None else rtol,
                               atol=at if atol is None else atol,
                               equal_nan=True, err_msg=err_msg)


def assert_unchanged(handler, arr, ref, what="input"):
    """``arr`` still holds exactly the values ``ref`` (float64 reference)."""
    got = handler.get_numpy_copy(arr).astype(np.float64)
    np.testing.assert_array_equal(got, ref, err_msg=f"{what} was modified")


def other_dtype(dtype):
    """The other float dtype a handler may have."""
    return np.dtype(np.float64 if np.dtype(dtype) == np.float32 else np.float32)


def shape_id(shape):
    """Readable test id for a shape: (2, 3) -> '2x3', () -> 'scalar'."""
    return "x".join(str(s) for s in shape) if shape else "scalar"
