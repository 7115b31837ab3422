"""Handler.twin (a handler of another format on the same streams) and cast_t.

cast_t is checked bit for bit against NumPy conversions in float64: a value is
held exactly in float64 whatever its format, so the reference rounds once from
the exact value (through float32 where the destination is a half format, as
the operation is defined).
"""
import numpy as np
import pytest

from handlers import CaptureError, DebugHandler, dtypes
from handlers.debug_handler import StreamHazardError
from helpers import rand

HALF_FORMATS = True
S = (7, 33)   # an odd size: no vector path hides a tail


def _formats(h):
    return [dtypes.resolve(name) for name in h.supported_dtypes]


def _twin_or_skip(h, dt):
    try:
        return h.twin(dt)
    except NotImplementedError as e:
        pytest.skip(str(e))


def _reference(values, src_dt, dst_dt):
    """``values`` (float64) held in src_dt, then converted to dst_dt."""
    held = np.asarray(values).astype(src_dt).astype(np.float64)
    if dtypes.is_half(dst_dt):
        held = held.astype(np.float32)
    with np.errstate(over="ignore"):
        return held.astype(dst_dt)


def _bits(a):
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


def _same(got, want):
    """Equal bit for bit, except that any NaN matches any NaN."""
    got, want = np.asarray(got), np.asarray(want)
    nan = np.isnan(want.astype(np.float64))
    assert np.array_equal(np.isnan(got.astype(np.float64)), nan)
    assert np.array_equal(_bits(got)[~nan], _bits(want)[~nan])


def test_twin_of_own_format_is_the_handler(handler):
    assert handler.twin(handler.dtype) is handler
    view = handler.with_streams(handler.num_stream_groups - 1)
    assert view.twin(handler.dtype) is view


def test_twins_are_cached_share_groups_and_know_each_other(handler):
    for dt in _formats(handler):
        if dt == handler.dtype:
            continue
        t = _twin_or_skip(handler, dt)
        assert t.dtype == dt and type(t) is type(handler)
        assert handler.twin(dt) is t
        assert t.twin(handler.dtype) is handler
        assert t.num_stream_groups == handler.num_stream_groups
        k = handler.num_stream_groups - 1
        assert handler.with_streams(k).twin(dt).group == k
        assert handler.with_streams(k).twin(dt) is t.with_streams(k)


def test_twin_refuses_formats_the_class_does_not_hold(handler):
    for bad in (np.int32, np.complex64, "float8"):
        with pytest.raises(TypeError, match="twin"):
            handler.twin(bad)


@pytest.mark.parametrize("src_name", ["float16", "bfloat16", "float32", "float64"])
def test_cast_t_rounds_once_from_every_format(handler, rng, src_name):
    src_dt = dtypes.resolve(src_name)
    if src_dt.name not in handler.supported_dtypes:
        pytest.skip(f"{type(handler).__name__} does not hold {src_name}")
    src_h = _twin_or_skip(handler, src_dt)
    # ordinary values, values near the destination's and the source's range
    # limits (overflow to inf, subnormals), and the specials
    lim_dst, lim_src = dtypes.largest(handler.dtype), dtypes.largest(src_dt)
    sub = dtypes.smallest_subnormal(handler.dtype)
    values = rand(S, rng, -3.0, 3.0)
    flat = values.reshape(-1)
    specials = [lim_dst, -lim_dst, 0.999 * lim_dst, min(2 * lim_dst, lim_src), sub, 3 * sub,
                0.4 * sub, 0.0, -0.0, np.inf, -np.inf, np.nan, lim_src, -lim_src]
    flat[:len(specials)] = specials
    with np.errstate(over="ignore"):   # a source format's own overflow: inf, held so
        src = src_h.create_from_numpy(values)
        want = _reference(values, src_dt, handler.dtype)
    dst = handler.create_from_numpy(np.full(S, 7.0))
    handler.cast_t(src, dst)
    _same(handler.get_numpy_copy(dst), want)


@pytest.mark.parametrize("src_name", ["bfloat16", "float32", "float64"])
@pytest.mark.parametrize("src_off,dst_off", [(0, 0), (1, 0), (0, 3), (8, 8), (5, 2)])
def test_cast_t_between_views_at_any_offset(handler, rng, src_name, src_off, dst_off):
    """Views that start off a packet boundary (one end, the other or both)
    and a length that is no multiple of eight: every element converted, the
    elements around the destination view untouched."""
    src_dt = dtypes.resolve(src_name)
    if src_dt.name not in handler.supported_dtypes:
        pytest.skip(f"{type(handler).__name__} does not hold {src_name}")
    src_h = _twin_or_skip(handler, src_dt)
    n = 1003
    values = rand((n + 16,), rng, -3.0, 3.0)
    src_all = src_h.create_from_numpy(values)
    before = rand((n + 16,), rng, -3.0, 3.0)
    dst_all = handler.create_from_numpy(before)
    kept = handler.get_numpy_copy(dst_all)
    handler.cast_t(src_h.view_t(src_all, src_off, (n,)), handler.view_t(dst_all, dst_off, (n,)))
    got = handler.get_numpy_copy(dst_all)
    held = src_h.get_numpy_copy(src_all)[src_off:src_off + n]
    _same(got[dst_off:dst_off + n], _reference(held.astype(np.float64), src_dt, handler.dtype))
    _same(np.concatenate([got[:dst_off], got[dst_off + n:]]),
          np.concatenate([kept[:dst_off], kept[dst_off + n:]]))


def test_cast_t_on_another_group_is_ordered_by_the_group(handler, rng):
    others = [dt for dt in _formats(handler) if dt != handler.dtype]
    src_h = _twin_or_skip(handler, others[0]).with_streams(1 % handler.num_stream_groups)
    g = handler.with_streams(1 % handler.num_stream_groups)
    values = rand(S, rng)
    src = src_h.create_from_numpy(values)
    dst = g.allocate(S)
    src_h.mult_st(2.0, src, src)          # on the twin, then the cast: the same group
    g.cast_t(src, dst)
    handler.wait_for(g)
    _same(handler.get_numpy_copy(dst), _reference(2 * np.asarray(values).astype(others[0])
                                                  .astype(np.float64), others[0],
                                                  handler.dtype))


def test_cast_t_refuses_formats_the_class_does_not_hold(handler, rng):
    if handler.array_type is not np.ndarray:
        pytest.skip("builds NumPy arrays of formats no handler holds")
    dst = handler.create_from_numpy(np.ones(S))
    for bad in (np.int32, np.complex64, np.float128 if hasattr(np, "float128") else np.int8):
        with pytest.raises(TypeError, match="cast_t: expected a format"):
            handler.cast_t(np.ones(S, bad), dst)
        np.testing.assert_array_equal(handler.get_numpy_copy(dst), 1.0)


def test_debug_handler_twins_share_its_tracker(handler, rng):
    others = [dt for dt in _formats(handler) if dt != handler.dtype]
    _twin_or_skip(handler, others[0])
    debug = DebugHandler(handler)
    tw = debug.twin(others[0])
    assert isinstance(tw, DebugHandler) and tw.dtype == others[0]
    assert debug.twin(others[0]) is tw and tw.twin(handler.dtype) is debug
    src = tw.create_from_numpy(rand(S, rng))
    dst = debug.allocate(S)
    debug.cast_t(src, dst)                 # same group: ordered
    if handler.num_stream_groups < 2:
        return
    # read by the cast on group 0, then written on the twin's group 1 with
    # nothing ordering the two: the shared tracker sees the hazard
    with pytest.raises(StreamHazardError, match="write-after-read"):
        tw.with_streams(1).fill(src, 0.5)


def test_cast_t_takes_an_array_of_another_handler_of_the_class(handler, handler_id, rng,
                                                              sibling_handler):
    """Not only a twin's: any array of a format the class holds (ordering with
    its handler is then the caller's, as for any two handlers), from each of
    the other formats.  On the GPU these are the cast_from_<format> kernels."""
    for other in (dt for dt in _formats(handler) if dt != handler.dtype):
        src_h = sibling_handler(handler_id, other)
        values = rand(S, rng, -3.0, 3.0)
        values.reshape(-1)[:3] = [1e300, -1e-300, np.nan]   # beyond float32: inf, 0
        with np.errstate(over="ignore", under="ignore"):
            src = src_h.create_from_numpy(values)
            want = _reference(values, other, handler.dtype)
        src_h.synchronize()
        dst = handler.create_from_numpy(np.full(S, 7.0))
        handler.cast_t(src, dst)
        _same(handler.get_numpy_copy(dst), want)


def test_a_capture_records_the_work_of_every_twin(handler, rng):
    others = [dt for dt in _formats(handler) if dt != handler.dtype]
    tw = _twin_or_skip(handler, others[0])
    values = rand(S, rng)
    src = tw.create_from_numpy(values)
    dst = handler.create_from_numpy(np.zeros(S))
    with tw.capture() as g:              # begun on the twin
        tw.mult_st(2.0, src, src)
        handler.cast_t(src, dst)
        with pytest.raises(CaptureError, match="synchronize"):
            handler.synchronize()        # the family's capture is in progress
        with pytest.raises(CaptureError, match="already in progress"):
            with handler.capture():
                pass
    held = np.asarray(values).astype(others[0]).astype(np.float64)
    g.replay()
    g.replay()
    want = _reference(4 * held, others[0], handler.dtype)
    _same(handler.get_numpy_copy(dst), want)


def test_debug_handler_checks_each_array_in_the_format_of_its_twin(make_handler, handler_id,
                                                                    rng):
    """DebugHandler(check_finite=True) checks each array with the handler of
    its own format: cast_t runs both ways between twins and a small Trainer
    fit runs in mixed precision (bfloat16 over a float32/float64 master; a
    half handler's network in its own format, whose loss computes on the
    float32 twin); a NaN made in either format, or brought into a cast from
    the other one, is still reported."""
    from layers import SGD, FullyConnected, Sequential, SoftmaxCrossEntropy, Tanh, Trainer
    h = make_handler(handler_id, seed=0)
    half = dtypes.is_half(h.dtype)
    other = np.dtype(np.float32) if half else dtypes.resolve("bfloat16")
    _twin_or_skip(h, other)
    debug = DebugHandler(h, check_finite=True)
    tw = debug.twin(other)
    values = rand(S, rng, -3.0, 3.0)
    a, b, c = debug.create_from_numpy(values), tw.allocate(S), debug.allocate(S)
    tw.cast_t(a, b)                        # into the other format and back
    debug.cast_t(b, c)
    held = _reference(values, h.dtype, other).astype(np.float64)
    _same(tw.get_numpy_copy(b), _reference(values, h.dtype, other))
    _same(debug.get_numpy_copy(c), _reference(held, other, h.dtype))
    for hh in (debug, tw):                 # a NaN produced in either format
        with pytest.raises(FloatingPointError, match="log_t on stream group 0 produced"):
            hh.log_t(hh.create_from_numpy(np.full(S, -1.0)), hh.allocate(S))
    tw.inner.fill(b, float("nan"))         # from outside, read by a cast from the twin
    with pytest.raises(FloatingPointError, match=r"input to op cast_t: src"):
        debug.cast_t(b, c)
    _same(debug.get_numpy_copy(c), _reference(held, other, h.dtype))   # c untouched
    f16 = debug.twin("float16")
    src = (tw if h.dtype == np.float16 else debug).create_from_numpy(np.full(S, 1e5))
    with pytest.raises(FloatingPointError, match="cast_t on stream group 0 produced"):
        f16.cast_t(src, f16.allocate(S))   # past float16's range: inf
    centers = rng.normal(0.0, 1.0, (3, 6))
    labels = rng.integers(0, 3, 120)
    x = centers[labels] + rng.normal(0.0, 0.5, (120, 6))
    net = Sequential(debug, [FullyConnected(6, 16), Tanh(), FullyConnected(16, 3)],
                     SoftmaxCrossEntropy(), seed=0)
    tr = Trainer(net, SGD(net.parameters, lr=0.1), batch_size=20, progress=False,
                 graph=False, precision=None if half else "bf16")
    assert net.h.dtype == (h.dtype if half else other)
    history = tr.fit(x, labels, 3)
    assert np.isfinite(history.step_losses).all()
    assert history.train_loss[-1] < history.train_loss[0]
