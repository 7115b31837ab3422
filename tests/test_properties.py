"""Property tests (hypothesis) over random shapes and axes: ``sum_t``, the
dot ops and the broadcasts against a float64 NumPy reference, per handler.
Bounded (few examples, small shapes) so CI stays fast."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import tolerance

SETTINGS = settings(max_examples=40, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
dims = st.integers(min_value=1, max_value=9)


def _data(seed, shape):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


def _check(h, out, expected, n=1):
    rtol, atol = tolerance(h, n)
    np.testing.assert_allclose(h.get_numpy_copy(out), expected, rtol=rtol, atol=atol)


@SETTINGS
@given(shape=st.lists(dims, min_size=1, max_size=4), data=st.data(),
       seed=st.integers(0, 2**32 - 1))
def test_sum_t_any_axis(handler, shape, data, seed):
    nd = len(shape)
    axis = data.draw(st.one_of(st.none(), st.integers(-nd, nd - 1)), label="axis")
    keep = data.draw(st.booleans(), label="keepdims")
    host = _data(seed, shape)
    expected = host.sum(axis=axis, keepdims=keep)
    out = handler.allocate(expected.shape)
    handler.fill(out, np.nan)
    handler.sum_t(handler.create_from_numpy(host), axis, out)
    # the longest sum behind one result: the reduced axis, or every element
    _check(handler, out, expected, n=host.size if axis is None else shape[axis])


@SETTINGS
@given(m=dims, k=dims, n=dims, transa=st.booleans(), transb=st.booleans(),
       accumulate=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_dot_ops(handler, m, k, n, transa, transb, accumulate, seed):
    a = _data(seed, (k, m) if transa else (m, k))
    b = _data(seed + 1, (n, k) if transb else (k, n))
    c = _data(seed + 2, (m, n))
    expected = (a.T if transa else a) @ (b.T if transb else b)
    out = handler.create_from_numpy(c)
    op = handler.dot_add_mm if accumulate else handler.dot_mm
    op(handler.create_from_numpy(a), handler.create_from_numpy(b), out,
       transa=transa, transb=transb)
    _check(handler, out, expected + c if accumulate else expected, n=k)


@SETTINGS
@given(rows=dims, cols=dims, column=st.booleans(),
       op=st.sampled_from(["add_mv", "subtract_mv", "mult_mv", "divide_mv"]),
       seed=st.integers(0, 2**32 - 1))
def test_matrix_vector_broadcasts(handler, rows, cols, column, op, seed):
    m = _data(seed, (rows, cols))
    v = _data(seed + 1, (rows, 1) if column else (1, cols))
    v = np.where(np.abs(v) < 0.1, 0.5, v)     # keep division well conditioned
    ref = {"add_mv": np.add, "subtract_mv": np.subtract,
           "mult_mv": np.multiply, "divide_mv": np.divide}[op](m, v)
    out = handler.allocate(m.shape)
    handler.fill(out, np.nan)
    getattr(handler, op)(handler.create_from_numpy(m), handler.create_from_numpy(v), out)
    _check(handler, out, ref)


@SETTINGS
@given(shape=st.lists(dims, min_size=1, max_size=4), data=st.data(),
       seed=st.integers(0, 2**32 - 1))
def test_broadcast_t_any_axis(handler, shape, data, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    small = list(shape)
    small[axis] = 1
    a = _data(seed, small)
    out = handler.allocate(tuple(shape))
    handler.fill(out, np.nan)
    handler.broadcast_t(handler.create_from_numpy(a), axis, out)
    _check(handler, out, np.broadcast_to(a, shape))


def test_property_tests_can_fail(handler):
    """The reference above is independent: a wrong axis is caught."""
    host = _data(0, (3, 4))
    out = handler.allocate((4,))
    handler.sum_t(handler.create_from_numpy(host), 0, out)
    with pytest.raises(AssertionError):
        _check(handler, out, host.sum(axis=1)[:3].repeat(2)[:4])
