"""Contract rules that identity or truthiness once decided: aliasing is
decided on memory (two views of one buffer are the same array), booleans
must be ``bool``, masked arrays are refused, outputs stay untouched when
``DebugHandler(check_finite=True)`` raises.  Each test failed before its fix."""
import time

import numpy as np
import pytest

from handlers import DebugHandler
from helpers import assert_close, assert_unchanged, rand, upload


def same_memory_view(a):
    """Another array object over exactly the memory of ``a``."""
    b = a.reshape((1,) + a.shape).reshape(a.shape)   # reshape(a.shape) may return a
    assert b is not a
    return b


@pytest.mark.parametrize("alpha, beta", [(1.0, 2.0), (0.5, -1.5), (2.0, 1.0)])
def test_axpby_x_as_another_view_of_y(handler, rng, alpha, beta):
    """axpby(alpha, view of y, beta, y) is (alpha + beta) * y, as with x is y."""
    y, y_ref = upload(handler, rand((7, 5), rng))
    handler.axpby(alpha, same_memory_view(y), beta, y)
    np.testing.assert_allclose(handler.get_numpy_copy(y), (alpha + beta) * y_ref,
                               rtol=1e-6)


def test_axpby_issue_example(handler):
    y = handler.create_from_numpy(np.array([1.0, 2.0, 3.0]))
    handler.axpby(1.0, same_memory_view(y), 2.0, y)
    np.testing.assert_array_equal(handler.get_numpy_copy(y), [3.0, 6.0, 9.0])


@pytest.mark.parametrize("op", ["add_tt", "mult_tt", "subtract_tt"])
def test_elementwise_out_as_another_view_of_input(handler, rng, op):
    a, a_ref = upload(handler, rand((6, 4), rng))
    b, b_ref = upload(handler, rand((6, 4), rng))
    getattr(handler, op)(a, b, same_memory_view(a))
    want = {"add_tt": a_ref + b_ref, "mult_tt": a_ref * b_ref,
            "subtract_tt": a_ref - b_ref}[op]
    np.testing.assert_allclose(handler.get_numpy_copy(a), want, rtol=1e-6)


def test_index_m_by_v_out_overlapping_m_raises(handler, rng):
    m, m_ref = upload(handler, rand((4, 1), rng))
    v = handler.zeros((4, 1))
    with pytest.raises(ValueError, match="index_m_by_v: out must not overlap m"):
        handler.index_m_by_v(m, v, same_memory_view(m))
    assert_unchanged(handler, m, m_ref, "m")


def test_index_m_by_v_out_partially_overlapping_v_raises(handler):
    buf = handler.create_from_numpy(np.array([0.0, 1.0, 0.0, 1.0, 0.0]))
    m = handler.create_from_numpy(np.arange(8.0).reshape(4, 2))
    v, out = buf[:4].reshape((4, 1)), buf[1:].reshape((4, 1))
    with pytest.raises(ValueError, match="out must be v or not overlap it"):
        handler.index_m_by_v(m, v, out)
    np.testing.assert_array_equal(handler.get_numpy_copy(buf), [0, 1, 0, 1, 0])


def test_index_m_by_v_out_may_be_v_by_memory(handler):
    m = handler.create_from_numpy(np.arange(8.0).reshape(4, 2))
    v = handler.create_from_numpy(np.array([[1.0], [0.0], [1.0], [0.0]]))
    handler.index_m_by_v(m, v, same_memory_view(v))
    np.testing.assert_array_equal(handler.get_numpy_copy(v)[:, 0], [1.0, 2.0, 5.0, 6.0])


@pytest.mark.parametrize("flag", ["no", "", 1, 0, None, 1.0, np.int64(1)])
@pytest.mark.parametrize("op", ["dot_mm", "dot_add_mm"])
@pytest.mark.parametrize("which", ["transa", "transb"])
def test_transpose_flags_must_be_bool(handler, rng, op, which, flag):
    a, _ = upload(handler, rand((3, 3), rng))
    b, _ = upload(handler, rand((3, 3), rng))
    out, out_ref = upload(handler, rand((3, 3), rng))
    with pytest.raises(TypeError, match=f"{op}: {which} must be a bool"):
        getattr(handler, op)(a, b, out, **{which: flag})
    assert_unchanged(handler, out, out_ref, "out")


def test_numpy_bool_flag_is_accepted(handler, rng):
    a, a_ref = upload(handler, rand((3, 4), rng))
    b, b_ref = upload(handler, rand((3, 2), rng))
    out = handler.zeros((4, 2))
    handler.dot_mm(a, b, out, transa=np.bool_(True), transb=np.bool_(False))
    assert_close(handler, out, a_ref.T @ b_ref, n=3)


def test_masked_arrays_are_refused(handler):
    masked = np.ma.masked_array([1.0, 2.0, 3.0], mask=[0, 1, 0])
    with pytest.raises(TypeError, match="MaskedArray"):
        handler.create_from_numpy(masked)
    a = handler.zeros((3,))
    with pytest.raises(TypeError, match="MaskedArray"):
        handler.set_from_numpy(a, masked)
    np.testing.assert_array_equal(handler.get_numpy_copy(a), [0.0, 0.0, 0.0])
    with pytest.raises(TypeError, match="MaskedArray"):
        next(iter(handler.prefetch([masked])))


@pytest.mark.parametrize("op", ["divide_tt", "log_t"])
def test_check_finite_leaves_outputs_untouched(handler, op):
    dh = DebugHandler(handler, check_finite=True)
    a = dh.create_from_numpy(np.array([1.0, 0.0, 2.0]))
    out = dh.create_from_numpy(np.array([7.0, 8.0, 9.0]))
    with pytest.raises(FloatingPointError, match=op):
        if op == "divide_tt":
            dh.divide_tt(a, a, out)      # 0 / 0 is NaN
        else:
            dh.log_t(a, out)             # log 0 is -inf
    np.testing.assert_array_equal(handler.get_numpy_copy(out), [7.0, 8.0, 9.0])


def test_check_finite_untouched_when_out_is_the_input(handler):
    dh = DebugHandler(handler, check_finite=True)
    a = dh.create_from_numpy(np.array([1.0, 0.0, 2.0]))
    with pytest.raises(FloatingPointError):
        dh.log_t(a, a)
    np.testing.assert_array_equal(handler.get_numpy_copy(a), [1.0, 0.0, 2.0])


def test_debug_handler_reports_partial_overlap_of_views(handler):
    dh = DebugHandler(handler)
    buf = dh.create_from_numpy(np.arange(6.0))
    with pytest.raises(ValueError, match="partially overlaps"):
        dh.add_tt(buf[:5], buf[:5], buf[1:])
    dh.add_tt(buf[:5], buf[:5], same_memory_view(buf[:5]))   # the same range: allowed
    np.testing.assert_array_equal(handler.get_numpy_copy(buf), [0, 2, 4, 6, 8, 5])


@pytest.mark.parametrize("bad_axis", [True, 1.0, np.float64(1.0)])
def test_sum_t_axis_type_checked_after_a_cached_call(handler, rng, bad_axis):
    """A shape combination seen before skips the shape checks, never the
    axis type check."""
    a, _ = upload(handler, rand((4, 3), rng))
    out = handler.zeros((4,))
    handler.sum_t(a, 1, out)
    out_before = handler.get_numpy_copy(out)
    with pytest.raises(TypeError, match="sum_t: axis must be an int or None"):
        handler.sum_t(a, bad_axis, out)
    np.testing.assert_array_equal(handler.get_numpy_copy(out), out_before)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_prefetch_in_flight_limit_on_a_direct_transfer(depth):
    """At most ``depth`` uploads are started and not yet handed out, also when
    batches need no staging (NumPy's own transfer always stages)."""
    from handlers import NumpyHandler
    from handlers.prefetch import Transfer, prefetch

    class Direct(Transfer):
        started = finished = most = 0

        def is_direct(self, arrays):
            return True

        def start(self, views, slot):
            Direct.started += 1
            Direct.most = max(Direct.most, Direct.started - Direct.finished)
            return views

        def finish(self, token):
            Direct.finished += 1
            return token

    h = NumpyHandler()
    batches = [np.full((2, 3), float(i)) for i in range(12)]
    seen = []
    for b in prefetch(h, batches, depth, Direct(h)):
        time.sleep(0.002)   # let the reader run ahead as far as it may
        seen.append(float(b[0, 0]))
    assert seen == [float(i) for i in range(12)]
    assert Direct.most == depth
