"""Every op of the Handler contract against an independent float64 NumPy reference.

Inputs are fresh random data; outputs are poisoned with NaN first, so an element
an op fails to write fails the comparison.  References use plain NumPy on
float64 copies of the inputs as the handler holds them (never NumpyHandler).
"""
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from handlers import Handler, NumpyHandler, dtypes
from helpers import (
    act_reference,
    as_handler_values,
    assert_close,
    assert_epilogue_close,
    assert_unchanged,
    by_dtype,
    poisoned,
    rand,
    rand_input,
    shape_id,
    tolerance,
    upload,
)

#: every op here runs on the float16 and bfloat16 NumpyHandler too (conftest)
HALF_FORMATS = True

BIG = 1048583  # > 2**20 elements, not a multiple of 4 or of 256
SHAPES = [(1,), (7,), (3, 5), (2, 3, 5, 7), (BIG,)]
SMALL_SHAPES = SHAPES[:-1]
shapes = pytest.mark.parametrize("shape", SHAPES, ids=shape_id)


def shape_grid(argnames, values, ids, big):
    """Parametrize ``argnames`` + ``shape``: every value with every small shape,
    and the BIG shape only for the values where ``big(value)`` is true (the
    large cases test sizes, not parameters, so a few of them are enough)."""
    params = [pytest.param(*v, shape, id=f"{i}-{shape_id(shape)}")
              for v, i in zip(values, ids) for shape in SHAPES
              if shape != (BIG,) or big(v)]
    return pytest.mark.parametrize(argnames + ",shape", params)


def sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-x))


# ============================================================================ memory
ALLOC_SHAPES = [(1,), (7,), (3, 5), (2, 3, 5, 7), (), (4, 0)]


@pytest.mark.parametrize("shape", ALLOC_SHAPES, ids=shape_id)
@pytest.mark.parametrize("op,value", [("allocate", None), ("zeros", 0.0), ("ones", 1.0)])
def test_allocators(handler, op, value, shape):
    a = getattr(handler, op)(shape)
    assert isinstance(a, handler.array_type)
    assert tuple(a.shape) == shape and a.dtype == handler.dtype
    host = handler.get_numpy_copy(a)
    assert isinstance(host, np.ndarray)
    assert host.shape == shape and host.dtype == handler.dtype
    if value is not None:
        np.testing.assert_array_equal(host, np.full(shape, value))


def test_allocate_int_shape(handler):
    assert tuple(handler.zeros(7).shape) == (7,)
    assert tuple(handler.allocate(np.int64(3)).shape) == (3,)
    assert tuple(handler.ones((np.int32(2), 3)).shape) == (2, 3)


def _host_sources(rng):
    data = rand((6, 10), rng, -4, 4)
    return {
        "float64": data,
        "float32": data.astype(np.float32),
        "int32": rng.integers(-1000, 1000, (6, 10)).astype(np.int32),
        "uint8": rng.integers(0, 256, (6, 10)).astype(np.uint8),
        "int64": rng.integers(-1000, 1000, (6, 10)),
        "bool": rng.random((6, 10)) < 0.5,
        "strided": rand((6, 20), rng)[:, ::2],
        "transposed": rand((10, 6), rng).T,
        "reversed": data[::-1, ::-1],
        "zero-d": np.array(2.5),
    }


HOST_KINDS = list(_host_sources(np.random.default_rng(0)))


@pytest.mark.parametrize("kind", HOST_KINDS)
def test_create_from_numpy(handler, rng, kind):
    src = _host_sources(rng)[kind]
    before = src.copy()
    a = handler.create_from_numpy(src)
    assert isinstance(a, handler.array_type)
    assert tuple(a.shape) == src.shape and a.dtype == handler.dtype
    got = handler.get_numpy_copy(a)
    np.testing.assert_array_equal(got, src.astype(handler.dtype))
    np.testing.assert_array_equal(src, before)  # host input untouched
    src[...] = 7  # the handler array is a copy, not a view of the host data
    np.testing.assert_array_equal(handler.get_numpy_copy(a), before.astype(handler.dtype))


@shapes
def test_get_numpy_copy_is_an_independent_copy(handler, rng, shape):
    a, ref = rand_input(handler, shape, rng)
    c1 = handler.get_numpy_copy(a)
    assert isinstance(c1, np.ndarray) and c1.dtype == handler.dtype and c1.shape == shape
    np.testing.assert_array_equal(c1.astype(np.float64), ref)
    c1[...] = np.nan
    c2 = handler.get_numpy_copy(a)
    assert c2 is not c1
    np.testing.assert_array_equal(c2.astype(np.float64), ref)


@pytest.mark.parametrize("kind", HOST_KINDS)
def test_set_from_numpy(handler, rng, kind):
    src = _host_sources(rng)[kind]
    a = poisoned(handler, src.shape)
    assert handler.set_from_numpy(a, src) is None
    expected = src.astype(handler.dtype)
    np.testing.assert_array_equal(handler.get_numpy_copy(a), expected)
    src[...] = 3  # later host changes do not reach the handler array
    np.testing.assert_array_equal(handler.get_numpy_copy(a), expected)


@shapes
def test_set_from_numpy_shapes(handler, rng, shape):
    data = rand(shape, rng)
    a = poisoned(handler, shape)
    handler.set_from_numpy(a, data)
    assert_close(handler, a, as_handler_values(handler, data), rtol=0, atol=0)


@shapes
def test_copy_to(handler, rng, shape):
    src, ref = rand_input(handler, shape, rng)
    dest = poisoned(handler, shape)
    assert handler.copy_to(src, dest) is None
    assert_close(handler, dest, ref, rtol=0, atol=0)
    assert_unchanged(handler, src, ref, "src")
    handler.fill(src, 0.5)  # dest is a separate buffer
    assert_close(handler, dest, ref, rtol=0, atol=0)


@shape_grid("value", [(0.25,), (-3,), (0.0,), (np.float64(1.5),), (np.float32(-2.0),)],
            ["0.25", "int-3", "0", "np64", "np32"], big=lambda v: v == (0.25,))
def test_fill(handler, shape, value):
    a = poisoned(handler, shape)
    assert handler.fill(a, value) is None
    assert_close(handler, a, np.full(shape, float(value)), rtol=0, atol=0)


# ============================================================================ BLAS
# (m, k, n).  On PyCudaHandler, products with m * n <= 4096 and k <= 128 run
# on its small-product kernel, larger ones on cuBLAS: both sides of each limit.
DOT_SHAPES = [(1, 1, 1), (7, 13, 5), (6, 6, 6), (1, 9, 4), (5, 9, 1), (16, 16, 16),
              (64, 128, 64), (64, 129, 64), (65, 128, 63), (64, 8, 65), (130, 257, 67)]


@pytest.mark.parametrize("mkn", DOT_SHAPES, ids=shape_id)
@pytest.mark.parametrize("transb", [False, True], ids=["b", "bT"])
@pytest.mark.parametrize("transa", [False, True], ids=["a", "aT"])
@pytest.mark.parametrize("op", ["dot_mm", "dot_add_mm"])
def test_dot(handler, rng, op, transa, transb, mkn):
    m, k, n = mkn
    a, ra = rand_input(handler, (k, m) if transa else (m, k), rng)
    b, rb = rand_input(handler, (n, k) if transb else (k, n), rng)
    product = (ra.T if transa else ra) @ (rb.T if transb else rb)
    if op == "dot_mm":
        out, expected = poisoned(handler, (m, n)), product
    else:
        out, r_out = rand_input(handler, (m, n), rng)
        expected = r_out + product
    assert getattr(handler, op)(a, b, out, transa=transa, transb=transb) is None
    assert_close(handler, out, expected, n=k + 1)
    assert_unchanged(handler, a, ra, "a")
    assert_unchanged(handler, b, rb, "b")


# (m, k, n): a dense layer's shapes, odd ones (leading dimensions cuBLASLt
# may refuse), and empty ones (k = 0: the bias alone)
BIAS_ACT_SHAPES = [(1, 1, 1), (7, 13, 5), (64, 33, 10), (256, 784, 1024), (130, 257, 67),
                   (0, 4, 3), (3, 0, 5)]


@pytest.mark.parametrize("mkn", BIAS_ACT_SHAPES, ids=shape_id)
@pytest.mark.parametrize("act", [None, "relu", "gelu_tanh"])
def test_dot_bias_act(handler, rng, act, mkn):
    """act(a @ b + bias) against float64 NumPy, on aligned arrays (the
    cuBLASLt path on a GPU where it plans the shapes) and on views one
    element in (never aligned for it: the product, then a fused op)."""
    m, k, n = mkn
    a, ra = rand_input(handler, (m, k), rng, -2, 2)
    b, rb = rand_input(handler, (k, n), rng)
    bias, r_bias = rand_input(handler, (1, n), rng)
    product = ra @ rb
    expected = act_reference(act, product + r_bias)
    out = poisoned(handler, (m, n))
    assert handler.dot_bias_act(a, b, bias, out, act) is None
    assert_epilogue_close(handler, out, expected, product, k + 1, "aligned")
    assert_unchanged(handler, a, ra, "a")
    assert_unchanged(handler, bias, r_bias, "bias")
    spare, _ = rand_input(handler, (m * n + 1,), rng)
    shifted = handler.view_t(spare, 1, (m, n))
    handler.dot_bias_act(a, b, bias, shifted, act)
    assert_epilogue_close(handler, shifted, expected, product, k + 1, "one element in")


def test_dot_positional_flags(handler, rng):
    a, ra = rand_input(handler, (4, 3), rng)
    b, rb = rand_input(handler, (5, 4), rng)
    out = poisoned(handler, (3, 5))
    handler.dot_mm(a, b, out, True, True)
    assert_close(handler, out, ra.T @ rb.T, n=4)


AXPBY = [(0.7, -1.3), (1.0, 0.5), (1.0, 1.0), (-2.0, 1.0), (0.5, 0.0), (0.0, 0.75),
         (np.float32(0.25), np.float64(2.0)), (3, -1)]


@shape_grid("alpha,beta", AXPBY, [f"{a}_{b}" for a, b in AXPBY],
            big=lambda v: v in AXPBY[:2])
def test_axpby(handler, rng, alpha, beta, shape):
    x, rx = rand_input(handler, shape, rng)
    y, ry = rand_input(handler, shape, rng)
    assert handler.axpby(alpha, x, beta, y) is None
    assert_close(handler, y, float(alpha) * rx + float(beta) * ry, n=2)
    assert_unchanged(handler, x, rx, "x")


@shapes
@pytest.mark.parametrize("alpha", [1.0, -0.6])
def test_axpby_beta_zero_ignores_old_y(handler, rng, alpha, shape):
    x, rx = rand_input(handler, shape, rng)
    junk = np.full(shape, np.nan)
    junk.reshape(-1)[1::3] = np.inf
    junk.reshape(-1)[2::3] = -np.inf
    y = handler.create_from_numpy(junk)
    handler.axpby(alpha, x, 0.0, y)
    assert_close(handler, y, alpha * rx)


@shapes
@pytest.mark.parametrize("alpha,beta", [(0.7, -1.3), (1.0, 1.0), (1.0, 0.0), (-0.5, 0.0)])
def test_axpby_x_is_y(handler, rng, alpha, beta, shape):
    y, ry = rand_input(handler, shape, rng)
    handler.axpby(alpha, y, beta, y)
    assert_close(handler, y, (alpha + beta) * ry, n=2)


# ============================================================================ sum_t
def _sum_cases():
    for shape in [(1,), (7,), (3, 5), (4, 1, 3), (2, 3, 5, 7)]:
        nd = len(shape)
        for axis in list(range(nd)) + list(range(-nd, 0)):
            for keep in (False, True):
                yield shape, axis, keep
    for shape in [(1,), (7,), (3, 5), (2, 3, 5, 7)]:
        for out_shape in sorted({(), (1,), (1,) * len(shape)}):
            yield shape, None, out_shape
    yield (1 << 20,), 0, False
    yield (1 << 20,), -1, True
    yield (1024, 1025), 0, False
    yield (1024, 1025), 1, True
    yield (3, 1 << 18, 2), 1, False
    yield (1024, 1025), None, ()
    # Few wide columns over many rows: the GPU splits the rows into chunks
    # (vectorized loads where the rows are 16-byte aligned).
    yield (4096, 64), 0, False
    yield (5, 3000, 12), 1, True
    yield (20000, 3), 0, False


def _sum_id(case):
    shape, axis, keep = case
    out = (f"out{shape_id(keep)}" if axis is None else "keep" if keep else "drop")
    return f"{shape_id(shape)}-axis{axis}-{out}"


SUM_CASES = list(_sum_cases())


@pytest.mark.parametrize("case", SUM_CASES, ids=[_sum_id(c) for c in SUM_CASES])
def test_sum_t(handler, rng, case):
    shape, axis, keep = case
    a, ra = rand_input(handler, shape, rng)
    if axis is None:
        out_shape, n = keep, ra.size
        expected = ra.sum().reshape(out_shape)
    else:
        n = shape[axis]
        expected = ra.sum(axis=axis, keepdims=keep)
        out_shape = expected.shape
    out = poisoned(handler, out_shape)
    assert handler.sum_t(a, axis, out) is None
    assert_close(handler, out, expected, n=n)
    assert_unchanged(handler, a, ra, "a")


def test_sum_t_repeats_bit_for_bit_on_every_group(handler, rng):
    """Chunked sums (one launch whose last block per tile finishes, with
    counters that must reset) give identical bits on every call and group."""
    for shape, axis in (((4096, 64), 0), ((3000, 7), 0), ((8, 50000), 1)):
        a, ra = rand_input(handler, shape, rng)
        out_shape = shape[:axis] + shape[axis + 1:]
        first = None
        for k in list(range(handler.num_stream_groups)) * 2:
            view = handler.with_streams(k)
            out = poisoned(handler, out_shape)
            view.sum_t(a, axis, out)
            got = view.get_numpy_copy(out)
            if first is None:
                first = got
                assert_close(handler, out, ra.sum(axis=axis), n=shape[axis])
            assert np.array_equal(got, first), (shape, axis, k)


AXES_CASES = [  # (shape, axes, keep): runs of adjacent axes and separate runs
    ((2, 3, 4, 5), (0, 2, 3), False), ((2, 3, 4, 5), (0, 2, 3), True),
    ((2, 3, 4, 5), (0, 2), False), ((2, 3, 4, 5), (1, 2), True),
    ((2, 3, 4, 5), (-1, 0), False), ((2, 3, 4, 5), (3, 1), False),
    ((2, 3, 4, 5), (0, 1, 2, 3), False), ((7,), (0,), True),
    ((2, 3, 2, 3, 4), (0, 2, 4), False),            # three runs: two intermediates
    ((64, 16, 32, 32), (0, 2, 3), False),           # a conv bias gradient
    # a leading and a trailing run (one launch on the GPU): unaligned runs,
    # many chunks of the leading run, a leading run of two axes
    ((2, 3, 4, 5), (0, 3), False), ((300, 3, 7), (0, 2), False),
    ((5, 2, 9, 3), (0, 1, 3), True),
    ((3, 0, 4), (0, 1), False),                     # an empty axis: zeros
]


def _axes_id(case):
    shape, axes, keep = case
    return f"{shape_id(shape)}-axes{'_'.join(map(str, axes))}-{'keep' if keep else 'drop'}"


@pytest.mark.parametrize("op", ["sum_t", "mean_t"])
@pytest.mark.parametrize("case", AXES_CASES, ids=[_axes_id(c) for c in AXES_CASES])
def test_reduce_over_axes(handler, rng, op, case):
    shape, axes, keep = case
    a, ra = rand_input(handler, shape, rng)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # the mean over nothing is NaN
        expected = getattr(np, op[:-2])(ra, axis=axes, keepdims=keep)
    out = poisoned(handler, expected.shape)
    assert getattr(handler, op)(a, axes, out) is None
    n = int(np.prod([shape[x] for x in axes]))
    assert_close(handler, out, expected, n=max(n, 1))
    assert_unchanged(handler, a, ra, "a")


@pytest.mark.parametrize("shape, axis", [((2, 3, 5, 7), 2), ((4, 9), -1), ((5,), None),
                                         ((3, 4), 0)])
def test_mean_t_one_axis(handler, rng, shape, axis):
    a, ra = rand_input(handler, shape, rng)
    expected = ra.mean(axis=axis)
    out = poisoned(handler, expected.shape)
    handler.mean_t(a, axis, out)
    assert_close(handler, out, expected, n=ra.size if axis is None else shape[axis])


EXTREME_CASES = [((7,), 0), ((3, 5), 1), ((3, 5), 0), ((4, 100), 1), ((100, 4), 0),
                 ((2, 3, 5, 7), 1), ((2, 3, 5, 7), -1), ((2, 3, 5, 7), 0), ((1000, 33), 1),
                 ((33, 1000), 0), ((5, 1), 1), ((1, 5), 0)]


@pytest.mark.parametrize("op", ["max_t", "min_t", "argmax_t"])
@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("shape, axis", EXTREME_CASES, ids=lambda v: str(v))
def test_extremes(handler, rng, op, keep, shape, axis):
    a, ra = rand_input(handler, shape, rng)
    ref = {"max_t": np.max, "min_t": np.min, "argmax_t": np.argmax}[op]
    expected = ref(ra, axis=axis, keepdims=keep).astype(np.float64)
    out = poisoned(handler, expected.shape)
    assert getattr(handler, op)(a, axis, out) is None
    assert_close(handler, out, expected, rtol=0, atol=0)   # a pick, not arithmetic
    assert_unchanged(handler, a, ra, "a")


@pytest.mark.parametrize("op", ["max_t", "min_t", "argmax_t"])
def test_extremes_nan_and_ties(handler, op):
    # NaN wins (argmax: its first index); equal values: the first index.
    m = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 5.0, 5.0, -1.0], [-4.0, -4.0, -4.0, -4.0]])
    cols = np.tile(m.T, (1, 40))   # the same along axis 0, with 120 columns
    ref = {"max_t": np.max, "min_t": np.min, "argmax_t": np.argmax}[op]
    for data, axis in ((m, 1), (cols, 0), (np.tile(m, (1, 20)), 1)):
        a = handler.create_from_numpy(data)
        out = poisoned(handler, (data.shape[1 - axis],))
        getattr(handler, op)(a, axis, out)
        assert_close(handler, out, ref(data, axis=axis).astype(np.float64), rtol=0, atol=0)


@pytest.mark.parametrize("op", ["max_t", "min_t", "argmax_t"])
def test_extremes_down_long_columns(handler, rng, op):
    # Few columns over many rows: the GPU splits the rows into chunks and
    # joins their picks; ties and NaN must still go to the first index.
    data = rng.uniform(-1, 1, (5000, 3))
    data[:, 1] = 0.25                      # all equal: index 0
    data[[1200, 3900], 2] = np.nan         # NaN in two chunks: the first
    data[4321, 0] = 7.0                    # a unique maximum deep down
    data[17, 0] = -7.0                     # and minimum near the top
    ref = {"max_t": np.max, "min_t": np.min, "argmax_t": np.argmax}[op]
    a, ra = upload(handler, data)
    out = poisoned(handler, (3,))
    if op == "argmax_t" and len(data) - 1 > dtypes.exact_integers(handler.dtype):
        with pytest.raises(ValueError, match=r"argmax_t: axis 0 of \(5000, 3\) has 5000 "
                                             r"elements, too many for \w+ indices"):
            handler.argmax_t(a, 0, out)
        assert np.isnan(handler.get_numpy_copy(out)).all()
        return
    getattr(handler, op)(a, 0, out)
    assert_close(handler, out, ref(ra, axis=0).astype(np.float64), rtol=0, atol=0)


def test_reshape_t_and_view_t_share_memory(handler, rng):
    a, ra = rand_input(handler, (4, 6), rng)
    r = handler.reshape_t(a, (3, -1))
    v = handler.view_t(a, 5, (2, 3))
    assert r.shape == (3, 8) and v.shape == (2, 3)
    assert_close(handler, r, ra.reshape(3, 8), rtol=0, atol=0)
    assert_close(handler, v, ra.reshape(-1)[5:11].reshape(2, 3), rtol=0, atol=0)
    handler.fill(v, 2.0)                     # writes through the view reach a
    expected = ra.reshape(-1).copy()
    expected[5:11] = 2.0
    assert_close(handler, a, expected.reshape(4, 6), rtol=0, atol=0)
    assert_close(handler, r, expected.reshape(3, 8), rtol=0, atol=0)
    # views of nothing: empty shapes anywhere, and of an empty array
    assert handler.view_t(a, 24, (0, 3)).shape == (0, 3)
    assert handler.reshape_t(handler.zeros((0, 4)), (4, 0)).shape == (4, 0)


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (33, 65), (64, 32), (1000, 7), (0, 4)],
                         ids=shape_id)
def test_transpose_m(handler, rng, shape):
    a, ra = rand_input(handler, shape, rng)
    out = poisoned(handler, shape[::-1])
    assert handler.transpose_m(a, out) is None
    assert_close(handler, out, ra.T, rtol=0, atol=0)
    assert_unchanged(handler, a, ra, "a")


CUT_CASES = [((3, 4), (3, 2), 1), ((3, 4), (3, 2), -1), ((2, 5), (4, 5), 0),
             ((2, 3, 4), (2, 5, 4), 1), ((2, 3, 4, 5), (2, 3, 4, 1), 3), ((7,), (0,), 0),
             ((300, 129), (300, 1), 1)]


@pytest.mark.parametrize("sa, sb, axis", CUT_CASES, ids=lambda v: str(v))
def test_concat_t_and_split_t(handler, rng, sa, sb, axis):
    a, ra = rand_input(handler, sa, rng)
    b, rb = rand_input(handler, sb, rng)
    expected = np.concatenate([ra, rb], axis=axis)
    out = poisoned(handler, expected.shape)
    assert handler.concat_t(a, b, axis, out) is None
    assert_close(handler, out, expected, rtol=0, atol=0)
    pa, pb = poisoned(handler, sa), poisoned(handler, sb)
    assert handler.split_t(out, axis, pa, pb) is None
    assert_close(handler, pa, ra, rtol=0, atol=0)
    assert_close(handler, pb, rb, rtol=0, atol=0)


@pytest.mark.parametrize("shape, axes", [((5,), (0,)), ((3, 7), (1, 0)), ((2, 3, 4), (2, 0, 1)),
                                         ((2, 5, 3, 4), (0, 2, 1, 3)),
                                         ((3, 1, 4, 2), (3, 2, 1, 0)), ((2, 3, 0, 2), (1, 0, 3, 2)),
                                         ((4, 33, 8, 16), (0, 2, 1, 3)),
                                         # the last axis kept: 8, 2 and 6 elements
                                         # (moved in vectors of 16, 8 or 4 bytes)
                                         ((2, 3, 4, 8), (1, 0, 2, 3)), ((3, 5, 2), (1, 0, 2)),
                                         ((2, 3, 6), (1, 0, 2))],
                         ids=lambda v: str(v))
def test_permute_t(handler, rng, shape, axes):
    """Every element moved exactly, against numpy.transpose."""
    a, ra = rand_input(handler, shape, rng)
    out = poisoned(handler, tuple(shape[i] for i in axes))
    assert handler.permute_t(a, axes, out) is None
    assert_close(handler, out, np.transpose(ra, axes), rtol=0, atol=0)
    assert_unchanged(handler, a, ra)


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_permute_t_between_offset_views(handler, rng, offset):
    """Views that start ``offset`` elements into their buffers, so that a
    vector of several elements is not aligned in either: still exact."""
    shape, axes = (3, 4, 8), (1, 0, 2)
    size = int(np.prod(shape))
    whole, rw = rand_input(handler, (size + offset,), rng)
    a = handler.view_t(whole, offset, shape)
    dest = poisoned(handler, (size + offset,))
    out = handler.view_t(dest, offset, tuple(shape[i] for i in axes))
    assert handler.permute_t(a, axes, out) is None
    want = np.transpose(rw[offset:].reshape(shape), axes)
    assert_close(handler, out, want, rtol=0, atol=0)
    assert_unchanged(handler, whole, rw)


# ============================================================================ elementwise
BINARY = {  # name: (reference(a, b, old_out), range of b)
    "add_tt": (lambda a, b, o: a + b, None),
    "subtract_tt": (lambda a, b, o: a - b, None),
    "mult_tt": (lambda a, b, o: a * b, None),
    "divide_tt": (lambda a, b, o: a / b, "away-from-zero"),
    "mult_add_tt": (lambda a, b, o: o + a * b, None),
    "maximum_tt": (lambda a, b, o: np.maximum(a, b), None),
    "minimum_tt": (lambda a, b, o: np.minimum(a, b), None),
    "greater_tt": (lambda a, b, o: (a > b).astype(np.float64), None),
    "equal_tt": (lambda a, b, o: (a == b).astype(np.float64), None),
}


def _away_from_zero(shape, rng):
    return rand(shape, rng, 0.5, 2.0) * rng.choice([-1.0, 1.0], shape)


@shapes
@pytest.mark.parametrize("where", ["out", "out-is-a", "out-is-b"])
@pytest.mark.parametrize("op", list(BINARY))
def test_binary(handler, rng, op, where, shape):
    ref_fn, b_range = BINARY[op]
    a, ra = rand_input(handler, shape, rng)
    if b_range == "away-from-zero":
        b, rb = upload(handler, _away_from_zero(shape, rng))
    else:
        b, rb = rand_input(handler, shape, rng)
    if where == "out":
        if op == "mult_add_tt":
            out, r_out = rand_input(handler, shape, rng)
        else:
            out, r_out = poisoned(handler, shape), None
    else:
        out, r_out = (a, ra) if where == "out-is-a" else (b, rb)
    expected = ref_fn(ra, rb, r_out)
    assert getattr(handler, op)(a, b, out) is None
    assert_close(handler, out, expected, n=2)
    if where == "out":
        assert_unchanged(handler, a, ra, "a")
        assert_unchanged(handler, b, rb, "b")


LIMIT_OPS = {  # name: float64 reference of (a, b)
    "add_tt": np.add, "subtract_tt": np.subtract, "mult_tt": np.multiply,
    "divide_tt": np.divide, "maximum_tt": np.maximum, "minimum_tt": np.minimum,
}


@pytest.mark.parametrize("region", ["largest", "smallest-normal"])
@pytest.mark.parametrize("op", list(LIMIT_OPS))
def test_binary_near_the_formats_range_limits(handler, rng, op, region):
    """Operands near the format's largest number (sums and products overflow
    to inf) or its smallest normal one (products underflow through the
    subnormals to 0): the result is the exact one rounded once to the format,
    within half a subnormal step."""
    dt = np.dtype(handler.dtype)
    scale = dtypes.largest(dt) if region == "largest" else dtypes.smallest_normal(dt)
    low, high = (0.25, 1.0) if region == "largest" else (1.0, 4.0)
    signs = lambda: rng.choice([-1.0, 1.0], (257,))   # noqa: E731
    a, ra = upload(handler, rand((257,), rng, low, high) * signs() * scale)
    b, rb = upload(handler, rand((257,), rng, low, high) * signs() * scale)
    out = poisoned(handler, (257,))
    getattr(handler, op)(a, b, out)
    with np.errstate(over="ignore", under="ignore"):
        expected = as_handler_values(handler, LIMIT_OPS[op](ra, rb))
    rt, _ = tolerance(handler)
    assert_close(handler, out, expected, rtol=rt, atol=dtypes.smallest_subnormal(dt))


def test_divide_tt_ieee(handler):
    a = handler.create_from_numpy(np.array([1.0, -1.0, 0.0, 3.0]))
    b = handler.create_from_numpy(np.array([0.0, 0.0, 0.0, -1.5]))
    out = handler.allocate((4,))
    handler.divide_tt(a, b, out)
    assert_close(handler, out, [np.inf, -np.inf, np.nan, -2.0])


SCALAR = {  # name: reference(s, t, old_out)
    "add_st": lambda s, t, o: t + s,
    "mult_st": lambda s, t, o: s * t,
    "mult_add_st": lambda s, t, o: o + s * t,
    "pow_st": lambda s, t, o: np.power(t, s),   # t > 0 here; signs in test_pow_st_special
}


@pytest.mark.parametrize("where", ["out", "out-is-t"])
@shape_grid("s", [(-1.7,), (0.37,), (2,), (np.float32(0.5),)], ["-1.7", "0.37", "int2", "np32"],
            big=lambda v: v == (-1.7,))
@pytest.mark.parametrize("op", list(SCALAR))
def test_scalar_ops(handler, rng, op, s, where, shape):
    t, rt = rand_input(handler, shape, rng, *((0.05, 2.0) if op == "pow_st" else ()))
    if where == "out-is-t":
        out, r_out = t, rt
    elif op == "mult_add_st":
        out, r_out = rand_input(handler, shape, rng)
    else:
        out, r_out = poisoned(handler, shape), None
    expected = SCALAR[op](float(s), rt, r_out)
    assert getattr(handler, op)(s, t, out) is None
    assert_close(handler, out, expected, n=2)


UNARY = {  # name: (float64 reference, input range)
    "abs_t": (np.abs, (-1, 1)),
    "sign_t": (np.sign, (-1, 1)),
    "sqrt_t": (np.sqrt, (0.05, 4)),
    "log_t": (np.log, (0.05, 4)),
    "exp_t": (np.exp, (-3, 3)),
    "sigmoid": (sigmoid64, (-8, 8)),
    "tanh": (np.tanh, (-3, 3)),
    "relu": (lambda x: np.maximum(x, 0.0), (-1, 1)),
    "elu": (lambda x: np.where(x > 0, x, np.expm1(x)), (-3, 3)),
    "square_t": (np.square, (-3, 3)),
    "rsqrt_t": (lambda x: 1.0 / np.sqrt(x), (0.05, 4)),
}


@shapes
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "out-is-a"])
@pytest.mark.parametrize("op", list(UNARY))
def test_unary(handler, rng, op, in_place, shape):
    ref_fn, (low, high) = UNARY[op]
    a, ra = rand_input(handler, shape, rng, low, high)
    out = a if in_place else poisoned(handler, shape)
    assert getattr(handler, op)(a, out) is None
    assert_close(handler, out, ref_fn(ra))
    if not in_place:
        assert_unchanged(handler, a, ra, "a")


SPECIAL = [  # documented edge values: (op, inputs, expected)
    ("sqrt_t", [-1.0, 0.0, 4.0, -np.inf], [np.nan, 0.0, 2.0, np.nan]),
    ("log_t", [0.0, -1.0, 1.0, np.e], [-np.inf, np.nan, 0.0, 1.0]),
    ("sign_t", [-2.5, 0.0, 3.0, -6e-8], [-1.0, 0.0, 1.0, -1.0]),   # tiny, even in float16
    ("abs_t", [-2.5, 0.0, 3.0], [2.5, 0.0, 3.0]),
    ("exp_t", [0.0, -1000.0, 1.0], [1.0, 0.0, np.e]),
    ("relu", [-1.0, 0.0, 2.0], [0.0, 0.0, 2.0]),
    ("elu", [-100.0, 0.0, 2.0], [-1.0, 0.0, 2.0]),
    ("tanh", [-100.0, 100.0, 0.0], [-1.0, 1.0, 0.0]),
    ("sigmoid", [-100.0, 100.0, -1000.0, 1000.0, 0.0], [0.0, 1.0, 0.0, 1.0, 0.5]),
    ("rsqrt_t", [0.0, -1.0, 4.0, np.inf, 0.25], [np.inf, np.nan, 0.5, 0.0, 2.0]),
    ("square_t", [-3.0, 0.0, np.nan, -np.inf], [9.0, 0.0, np.nan, np.inf]),
]


BINARY_SPECIAL = [  # (op, a, b, expected): NaN handling and ties
    ("maximum_tt", [np.nan, 1.0, 2.0, -np.inf, 3.0], [0.0, np.nan, 2.0, 1.0, -1.0],
     [np.nan, np.nan, 2.0, 1.0, 3.0]),
    ("minimum_tt", [np.nan, 1.0, 2.0, -np.inf, 3.0], [0.0, np.nan, 2.0, 1.0, -1.0],
     [np.nan, np.nan, 2.0, -np.inf, -1.0]),
    ("greater_tt", [np.nan, 1.0, 2.0, np.inf, 3.0], [0.0, np.nan, 2.0, 1.0, -1.0],
     [0.0, 0.0, 0.0, 1.0, 1.0]),
    ("equal_tt", [np.nan, 1.0, 2.0, np.inf, 3.0, -0.0], [np.nan, np.nan, 2.0, np.inf, -1.0, 0.0],
     [0.0, 0.0, 1.0, 1.0, 0.0, 1.0]),
]


@pytest.mark.parametrize("op,a,b,expected", BINARY_SPECIAL, ids=[c[0] for c in BINARY_SPECIAL])
def test_binary_special_values(handler, op, a, b, expected):
    out = poisoned(handler, (len(a),))
    getattr(handler, op)(handler.create_from_numpy(np.array(a)),
                         handler.create_from_numpy(np.array(b)), out)
    assert_close(handler, out, expected)


@pytest.mark.parametrize("s,t,expected", [
    (2.0, [-3.0, 0.0, 1.5], [9.0, 0.0, 2.25]),
    (3.0, [-2.0, 0.5], [-8.0, 0.125]),
    (0.5, [4.0, -4.0, 0.0], [2.0, np.nan, 0.0]),
    (-1.0, [0.0, 2.0, -4.0], [np.inf, 0.5, -0.25]),
    (0.0, [0.0, -7.0, np.nan], [1.0, 1.0, 1.0]),
])
def test_pow_st_special_values(handler, s, t, expected):
    out = poisoned(handler, (len(t),))
    handler.pow_st(s, handler.create_from_numpy(np.array(t)), out)
    assert_close(handler, out, expected)


@shapes
@pytest.mark.parametrize("where", ["out", "out-is-a", "out-is-b", "out-is-cond"])
def test_where_t(handler, rng, where, shape):
    cond_data = rng.choice([0.0, 1.0, -2.0, np.nan], shape)
    cond, rc = upload(handler, cond_data)
    a, ra = rand_input(handler, shape, rng)
    b, rb = rand_input(handler, shape, rng)
    out = {"out": poisoned(handler, shape), "out-is-a": a, "out-is-b": b,
           "out-is-cond": cond}[where]
    expected = np.where(np.isnan(rc) | (rc != 0), ra, rb)
    assert handler.where_t(cond, a, b, out) is None
    assert_close(handler, out, expected)
    if where == "out":
        assert_unchanged(handler, a, ra, "a")
        assert_unchanged(handler, b, rb, "b")


@pytest.mark.parametrize("op,inputs,expected", SPECIAL, ids=[s[0] for s in SPECIAL])
def test_unary_special_values(handler, op, inputs, expected):
    a = handler.create_from_numpy(np.array(inputs))
    out = poisoned(handler, (len(inputs),))
    getattr(handler, op)(a, out)
    assert_close(handler, out, expected)
    if op in ("sigmoid", "tanh", "elu"):
        assert np.isfinite(handler.get_numpy_copy(out)).all(), f"{op} overflowed"


CLIP = [(-0.3, 0.6), (0.2, 0.2), (-5.0, 5.0), (-1, 0)]


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "out-is-a"])
@shape_grid("a_min,a_max", CLIP, [f"{lo}_{hi}" for lo, hi in CLIP], big=lambda v: v == CLIP[0])
def test_clip_t(handler, rng, a_min, a_max, in_place, shape):
    a, ra = rand_input(handler, shape, rng)
    out = a if in_place else poisoned(handler, shape)
    assert handler.clip_t(a, a_min, a_max, out) is None
    assert_close(handler, out, np.clip(ra, a_min, a_max))


BROADCAST = [((3, 4, 5), ax) for ax in (0, 1, 2, -1, -2, -3)] + [
    ((3, 1, 5), 1), ((1, 7, 1), 0), ((1024, 1025), 0), ((1024, 1025), 1)]


@pytest.mark.parametrize("out_shape,axis", BROADCAST,
                         ids=[f"{shape_id(s)}-axis{ax}" for s, ax in BROADCAST])
def test_broadcast_t(handler, rng, out_shape, axis):
    a_shape = list(out_shape)
    a_shape[axis] = 1
    a, ra = rand_input(handler, tuple(a_shape), rng)
    out = poisoned(handler, out_shape)
    assert handler.broadcast_t(a, axis, out) is None
    assert_close(handler, out, np.broadcast_to(ra, out_shape), rtol=0, atol=0)
    assert_unchanged(handler, a, ra, "a")


MV_OPS = {"add_mv": np.add, "subtract_mv": np.subtract, "mult_mv": np.multiply,
          "divide_mv": np.divide}
MV_CASES = [((3, 5), "row"), ((3, 5), "col"), ((1, 5), "row"), ((1, 5), "col"),
            ((4, 1), "row"), ((4, 1), "col"), ((1, 1), "row"), ((1024, 1025), "row"),
            ((1024, 1025), "col")]


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "out-is-m"])
@pytest.mark.parametrize("m_shape,orient", MV_CASES,
                         ids=[f"{shape_id(s)}-{o}" for s, o in MV_CASES])
@pytest.mark.parametrize("op", list(MV_OPS))
def test_mv(handler, rng, op, m_shape, orient, in_place):
    rows, cols = m_shape
    m, rm = rand_input(handler, m_shape, rng)
    v_shape = (1, cols) if orient == "row" else (rows, 1)
    if op == "divide_mv":
        v, rv = upload(handler, _away_from_zero(v_shape, rng))
    else:
        v, rv = rand_input(handler, v_shape, rng)
    out = m if in_place else poisoned(handler, m_shape)
    assert getattr(handler, op)(m, v, out) is None
    assert_close(handler, out, MV_OPS[op](rm, rv))
    assert_unchanged(handler, v, rv, "v")


# ============================================================================ activations
DERIVS = {  # name: (activation, its derivative from x and y = f(x), input range)
    # The derivative is written in terms of y where the op reads y (the
    # contract's formulas), so that the reference uses y as the handler holds
    # it: in a half format, y's rounding would otherwise be counted as error.
    "sigmoid_deriv": (sigmoid64, lambda x, y: y * (1 - y), (-8, 8)),
    "tanh_deriv": (np.tanh, lambda x, y: 1 - y * y, (-3, 3)),
    "relu_deriv": (lambda x: np.maximum(x, 0.0), lambda x, y: (x > 0).astype(float), (-1, 1)),
    "elu_deriv": (lambda x: np.where(x > 0, x, np.expm1(x)),
                  lambda x, y: np.where(x > 0, 1.0, y + 1), (-3, 3)),
}


def test_derivative_references_are_the_derivatives():
    """The references above, from y = f(x) in float64, are f's derivatives."""
    x = np.linspace(-3, 3, 61) + 0.01
    for f, fprime, _ in DERIVS.values():
        h = 1e-6
        np.testing.assert_allclose(fprime(x, f(x)), (f(x + h) - f(x - h)) / (2 * h),
                                   rtol=1e-6, atol=1e-8)


@shapes
@pytest.mark.parametrize("in_place", [False, True], ids=["dx", "dx-is-dy"])
@pytest.mark.parametrize("op", list(DERIVS))
def test_derivatives(handler, rng, op, in_place, shape):
    f, fprime, (low, high) = DERIVS[op]
    x, rx = rand_input(handler, shape, rng, low, high)
    y, ry = upload(handler, f(rx))
    dy, rdy = rand_input(handler, shape, rng)
    dx = dy if in_place else poisoned(handler, shape)
    assert getattr(handler, op)(x, y, dy, dx) is None
    assert_close(handler, dx, rdy * fprime(rx, ry))
    assert_unchanged(handler, x, rx, "x")
    assert_unchanged(handler, y, ry, "y")


def test_sigmoid_deriv_does_not_read_x(handler, rng):
    # The contract: "x is unused but checked"; dx depends on y and dy only.
    x = poisoned(handler, (3, 5))
    y, ry = rand_input(handler, (3, 5), rng, 0.01, 0.99)
    dy, rdy = rand_input(handler, (3, 5), rng)
    dx = poisoned(handler, (3, 5))
    handler.sigmoid_deriv(x, y, dy, dx)
    assert_close(handler, dx, rdy * ry * (1 - ry))


@pytest.mark.parametrize("op,x,dx", [("relu_deriv", [-1.0, 0.0, 2.0], [0.0, 0.0, 5.0]),
                                     ("elu_deriv", [-1.0, 0.0, 2.0],
                                      [5.0 * np.exp(-1.0), 5.0, 5.0])],
                         ids=["relu", "elu"])
def test_deriv_at_zero(handler, op, x, dx):
    f = DERIVS[op][0]
    x64 = np.array(x)
    hx, _ = upload(handler, x64)
    y, ry = upload(handler, f(x64))
    dy = handler.create_from_numpy(np.full(3, 5.0))
    out = poisoned(handler, (3,))
    getattr(handler, op)(hx, y, dy, out)
    if op == "elu_deriv":   # dy * (y + 1) for x <= 0, y as the handler holds it
        dx = [5.0 * (ry[0] + 1)] + dx[1:]
    assert_close(handler, out, dx)


SOFTMAX = [((1, 1), (-1, 1)), ((3, 1), (-1, 1)), ((5, 7), (-3, 3)), ((130, 10), (-5, 5)),
           ((4, 1500), (-3, 3)), ((6, 10), (990, 1010)), ((6, 10), (-1000, 1000)),
           ((2, 3000), (-1000, -990))]


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "out-is-m"])
@pytest.mark.parametrize("shape,bounds", SOFTMAX,
                         ids=[f"{shape_id(s)}-{lo}_{hi}" for s, (lo, hi) in SOFTMAX])
def test_softmax_m(handler, rng, shape, bounds, in_place):
    m, rm = rand_input(handler, shape, rng, *bounds)
    out = m if in_place else poisoned(handler, shape)
    assert handler.softmax_m(m, out) is None
    e = np.exp(rm - rm.max(axis=1, keepdims=True))
    assert_close(handler, out, e / e.sum(axis=1, keepdims=True))
    rows = handler.get_numpy_copy(out).astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(rows, 1.0, rtol=0, atol=10 * tolerance(handler)[0],
                               err_msg="rows do not sum to 1")


# ============================================================================ indexing and masks
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "out-is-v"])
@pytest.mark.parametrize("shape", [(1, 1), (5, 7), (300, 11), (4, 1)], ids=shape_id)
def test_index_m_by_v(handler, rng, shape, in_place):
    r, c = shape
    m, rm = rand_input(handler, shape, rng)
    idx = rng.integers(0, c, r)
    v, _ = upload(handler, (idx + rng.uniform(0.0, 0.9, r)).reshape(r, 1))  # truncated
    out = v if in_place else poisoned(handler, (r, 1))
    assert handler.index_m_by_v(m, v, out) is None
    assert_close(handler, out, rm[np.arange(r), idx].reshape(r, 1), rtol=0, atol=0)
    assert_unchanged(handler, m, rm, "m")


OUT_OF_RANGE = [5.0, 6.0, -1.0, -0.5, np.nan, np.inf, -np.inf, 1e9, -1e9]


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "out-is-v"])
def test_index_m_by_v_out_of_range(handler, rng, in_place):
    c = 5
    index = [0.0, 4.5, 2.99] + OUT_OF_RANGE
    r = len(index)
    m, rm = rand_input(handler, (r, c), rng)
    v = handler.create_from_numpy(np.array(index).reshape(r, 1))
    out = v if in_place else poisoned(handler, (r, 1))
    handler.index_m_by_v(m, v, out)
    expected = np.full((r, 1), np.nan)
    expected[:3, 0] = rm[0, 0], rm[1, 4], rm[2, 2]
    assert_close(handler, out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(1, 1), (6, 1), (7, 4), (300, 11)], ids=shape_id)
def test_binarize_v(handler, rng, shape):
    r, c = shape
    idx = rng.integers(0, c, r)
    v, rv = upload(handler, (idx + rng.uniform(0.0, 0.9, r)).reshape(r, 1))
    out = poisoned(handler, shape)
    assert handler.binarize_v(v, out) is None
    assert_close(handler, out, np.eye(c)[idx], rtol=0, atol=0)
    assert_unchanged(handler, v, rv, "v")


def test_binarize_v_out_of_range(handler):
    c = 5
    index = [0.0, 4.5, 2.99] + OUT_OF_RANGE
    v = handler.create_from_numpy(np.array(index).reshape(-1, 1))
    out = poisoned(handler, (len(index), c))
    handler.binarize_v(v, out)
    expected = np.zeros((len(index), c))
    expected[0, 0] = expected[1, 4] = expected[2, 2] = 1.0
    assert_close(handler, out, expected, rtol=0, atol=0)


# (n, vocab, d): one element, odd sizes, more rows than the table (repeats),
# columns not a multiple of the block, and n * d > 2**20 for the grid stride.
# (300, 200, 2000): more rows of out than a GPU deals out per 32 columns
# (rows.cu: its warps then own several rows each); 200 rows, so that
# bfloat16 holds every index exactly.
ROWS_BY_INDEX = [(1, 1, 1), (7, 3, 5), (40, 6, 300), (3, 50, 1), (2100, 17, 513),
                 (300, 200, 2000)]
ROWS_IDS = [f"n{n}-vocab{v}-d{d}" for n, v, d in ROWS_BY_INDEX]


def _row_indices(rng, n, vocab, flat, dtype):
    """Valid float-coded row indices (fractions truncate) and their int rows;
    a fraction that ``dtype`` would round up to the next row (40.9 is 41 in
    bfloat16) is dropped."""
    rows = rng.integers(0, vocab, n)
    idx = rows + rng.uniform(0.0, 0.9, n)
    held = idx.astype(dtype).astype(np.float64)
    idx = np.where(np.trunc(held) == rows, idx, rows)
    return (idx if flat else idx.reshape(n, 1)), rows


@pytest.mark.parametrize("flat", [True, False], ids=["idx-n", "idx-n1"])
@pytest.mark.parametrize("n,vocab,d", ROWS_BY_INDEX, ids=ROWS_IDS)
def test_gather_rows_m(handler, rng, n, vocab, d, flat):
    table, rt = rand_input(handler, (vocab, d), rng)
    host_idx, rows = _row_indices(rng, n, vocab, flat, handler.dtype)
    idx, ri = upload(handler, host_idx)
    out = poisoned(handler, (n, d))
    assert handler.gather_rows_m(table, idx, out) is None
    assert_close(handler, out, rt[rows], rtol=0, atol=0)
    assert_unchanged(handler, table, rt, "table")
    assert_unchanged(handler, idx, ri, "idx")


def _scatter_reference(out, rows, a):
    """out[rows[i]] += a[i] in float64, one i after another."""
    out = out.copy()
    for i, r in enumerate(rows):
        out[r] += a[i]
    return out


@pytest.mark.parametrize("flat", [True, False], ids=["idx-n", "idx-n1"])
@pytest.mark.parametrize("n,vocab,d", ROWS_BY_INDEX, ids=ROWS_IDS)
def test_scatter_add_rows_m(handler, rng, n, vocab, d, flat):
    a, ra = rand_input(handler, (n, d), rng)
    host_idx, rows = _row_indices(rng, n, vocab, flat, handler.dtype)
    idx, ri = upload(handler, host_idx)
    out, ro = rand_input(handler, (vocab, d), rng)   # accumulates into what is there
    assert handler.scatter_add_rows_m(a, idx, out) is None
    # float32 adds in the handler's precision: the error grows with the rows
    # added into one element (at most n).
    assert_close(handler, out, _scatter_reference(ro, rows, ra), n=n + 1)
    assert_unchanged(handler, a, ra, "a")
    assert_unchanged(handler, idx, ri, "idx")


def test_scatter_add_rows_m_is_deterministic(handler, rng):
    """Many additions into few rows give the same bits every time, on every group,
    and the same bits as NumPy's in-order ufunc.at in the handler's dtype."""
    n, vocab, d = 3000, 3, 33
    # A wide range, so that the order changes the rounding; float16's sums
    # of 1000 such values would pass its largest finite value (65504) now
    # and then, so a tenth of it there.
    wide = 1e2 if np.dtype(handler.dtype) == np.float16 else 1e3
    host_a = rand((n, d), rng, -wide, wide)
    a = handler.create_from_numpy(host_a)
    host_idx, rows = _row_indices(rng, n, vocab, True, handler.dtype)
    idx = handler.create_from_numpy(host_idx)
    results = []
    for k in range(handler.num_stream_groups):
        hk = handler.with_streams(k)
        out = hk.zeros((vocab, d))
        hk.scatter_add_rows_m(a, idx, out)
        results.append(hk.get_numpy_copy(out))
    acc = dtypes.compute_dtype(handler.dtype)    # half formats add in float32, round once
    want = np.zeros((vocab, d), acc)
    np.add.at(want, rows, host_a.astype(handler.dtype).astype(acc))
    want = want.astype(handler.dtype)
    for got in results:
        np.testing.assert_array_equal(got, want)


# (n, d): one element, a row of one, odd sizes, rows longer than a warp's
# stride many times over, many short rows.
NORM_ROWS = [(1, 1), (4, 1), (5, 7), (3, 1000), (2000, 33)]


@pytest.mark.parametrize("shape", NORM_ROWS, ids=shape_id)
def test_normalize_rows_m(handler, rng, shape):
    host = rand(shape, rng, -2, 2) + rng.uniform(-10, 10, (shape[0], 1))   # offset rows
    x, rx = upload(handler, host)
    xhat, rstd = poisoned(handler, shape), poisoned(handler, (shape[0], 1))
    eps = 1e-3
    assert handler.normalize_rows_m(x, eps, xhat, rstd) is None
    centred = rx - rx.mean(axis=1, keepdims=True)
    want_rstd = 1.0 / np.sqrt((centred ** 2).mean(axis=1, keepdims=True) + eps)
    # Rounding of x in float32 is amplified by rstd (up to 1/sqrt(eps)).
    rtol = atol = by_dtype(handler, 2e-4, 1e-10)
    assert_close(handler, rstd, want_rstd, rtol=rtol, atol=atol)
    assert_close(handler, xhat, centred * want_rstd, rtol=rtol, atol=atol)
    assert_unchanged(handler, x, rx, "x")


@pytest.mark.parametrize("shape", NORM_ROWS, ids=shape_id)
def test_normalize_rows_backward_m(handler, rng, shape):
    xhat, rh = rand_input(handler, shape, rng, -2, 2)
    rstd, rr = rand_input(handler, (shape[0], 1), rng, 0.5, 3)
    g, rg = rand_input(handler, shape, rng)
    dx = poisoned(handler, shape)
    assert handler.normalize_rows_backward_m(xhat, rstd, g, dx) is None
    want = rr * (rg - rg.mean(axis=1, keepdims=True)
                 - rh * (rg * rh).mean(axis=1, keepdims=True))
    assert_close(handler, dx, want, n=shape[1], rtol=by_dtype(handler, 1e-4, 1e-10))
    for arr, ref, name in ((xhat, rh, "xhat"), (rstd, rr, "rstd"), (g, rg, "g")):
        assert_unchanged(handler, arr, ref, name)


# Invalid indices: at the end of the table, negative, fractions below 0, NaN,
# infinities and values too large for an int.
BAD_ROWS = [5.0, 6.0, -1.0, -0.5, np.nan, np.inf, -np.inf, 1e9, -1e9, 2.0**64]


@pytest.mark.parametrize("bad", BAD_ROWS, ids=str)
@pytest.mark.parametrize("op", ["gather_rows_m", "scatter_add_rows_m"])
def test_rows_by_index_invalid(handler, rng, op, bad):
    """NumpyHandler raises before writing; PyCudaHandler gives NaN rows (gather)
    or skips the row (scatter-add), reading and writing nothing out of bounds."""
    vocab, d = 5, 3
    idx = handler.create_from_numpy(np.array([4.5, bad, 0.0, 2.99]))
    table, rt = rand_input(handler, (vocab, d), rng)
    a, ra = rand_input(handler, (4, d), rng)
    if op == "gather_rows_m":
        args, out, before = (table, idx, poisoned(handler, (4, d))), 2, np.full((4, d), np.nan)
        expected = np.vstack([rt[4], np.full(d, np.nan), rt[0], rt[2]])
    else:
        args, out, before = (a, idx, table), 2, rt
        expected = rt.copy()
        expected[4] += ra[0]
        expected[0] += ra[2]
        expected[2] += ra[3]
    if isinstance(handler, NumpyHandler):
        with pytest.raises(ValueError, match=rf"{op}: idx\[1\]"):
            getattr(handler, op)(*args)
        assert_unchanged(handler, args[out], before, "out")
    else:
        getattr(handler, op)(*args)
        assert_close(handler, args[out], expected)


def _condition(shape, rng, kind):
    on = rng.random(shape) < 0.5
    if kind == "all-off":
        on[...] = False
    elif kind == "all-on":
        on[...] = True
    values = rand(shape, rng, -3, 3) if kind == "any-nonzero" else np.ones(shape)
    return np.where(on, values, 0.0)


MASKED = {  # name: (call(handler, src, val, dest, cond), reference(src, val, dest, on))
    "copy_to_if": (lambda h, s, val, d, c: h.copy_to_if(s, d, c),
                   lambda s, val, d, on: np.where(on, s, d)),
    "fill_if": (lambda h, s, val, d, c: h.fill_if(d, val, c),
                lambda s, val, d, on: np.where(on, val, d)),
    "add_into_if": (lambda h, s, val, d, c: h.add_into_if(s, d, c),
                    lambda s, val, d, on: np.where(on, d + s, d)),
}


@shape_grid("cond_kind", [("0/1",), ("any-nonzero",), ("all-off",), ("all-on",)],
            ["0/1", "any-nonzero", "all-off", "all-on"], big=lambda v: v == ("0/1",))
@pytest.mark.parametrize("op", list(MASKED))
def test_masked_ops(handler, rng, op, cond_kind, shape):
    call, ref_fn = MASKED[op]
    src, rs = rand_input(handler, shape, rng)
    dest, rd = rand_input(handler, shape, rng)
    cond, rc = upload(handler, _condition(shape, rng, cond_kind))
    assert call(handler, src, -0.625, dest, cond) is None
    assert_close(handler, dest, ref_fn(rs, -0.625, rd, rc != 0))
    assert_unchanged(handler, src, rs, "src")
    assert_unchanged(handler, cond, rc, "cond")


@pytest.mark.parametrize("shape", SMALL_SHAPES, ids=shape_id)
def test_copy_to_if_dest_is_src(handler, rng, shape):
    src, rs = rand_input(handler, shape, rng)
    cond, _ = upload(handler, _condition(shape, rng, "0/1"))
    handler.copy_to_if(src, src, cond)
    assert_close(handler, src, rs, rtol=0, atol=0)


FINITE_SHAPES = [(1,), (7,), (3, 5), (2, 3, 5, 7), (BIG,)]


@pytest.mark.parametrize("shape", FINITE_SHAPES, ids=shape_id)
def test_is_fully_finite_true(handler, rng, shape):
    a, _ = rand_input(handler, shape, rng, -1e4, 1e4)
    result = handler.is_fully_finite(a)
    assert result is True


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("shape", FINITE_SHAPES, ids=shape_id)
def test_is_fully_finite_false(handler, rng, shape, where, bad):
    data = rand(shape, rng)
    flat = data.reshape(-1)
    flat[{"first": 0, "middle": flat.size // 2, "last": flat.size - 1}[where]] = bad
    a = handler.create_from_numpy(data)
    assert handler.is_fully_finite(a) is False


# ============================================================================ randomness
N_SAMPLES = 1 << 20


@pytest.mark.parametrize("mean,std", [(0.0, 1.0), (0.5, 2.0), (-3.0, 0.1)])
def test_fill_gaussian_statistics(handler, mean, std):
    out = poisoned(handler, (N_SAMPLES,))
    assert handler.fill_gaussian(mean, std, out) is None
    x = handler.get_numpy_copy(out).astype(np.float64)
    assert np.isfinite(x).all()
    n = x.size
    assert abs(x.mean() - mean) < 6 * std / np.sqrt(n), f"mean {x.mean()}"
    assert abs(x.std() / std - 1) < 6 / np.sqrt(2 * n), f"std {x.std()}"
    within = np.mean(np.abs(x - mean) < std)  # 68.27% for a normal distribution
    distinct = n // 2                           # most draws differ
    if dtypes.is_half(handler.dtype):
        # A half format has few numbers near mean (bfloat16: 128 per octave):
        # compare with normal draws in float64 rounded to it.
        ref = (mean + std * np.random.default_rng(0).standard_normal(n)).astype(
            handler.dtype).astype(np.float64)
        want, distinct = np.mean(np.abs(ref - mean) < std), len(np.unique(ref)) * 9 // 10
    else:
        want = 0.682689
    assert abs(within - want) < 6 * np.sqrt(0.2166 / n), f"{within:.4f} within one std"
    assert len(np.unique(x)) > distinct


@pytest.mark.parametrize("shape", SMALL_SHAPES + [(3, 1, 7)], ids=shape_id)
def test_fill_gaussian_writes_every_element(handler, shape):
    out = poisoned(handler, shape)
    handler.fill_gaussian(1.0, 0.5, out)
    assert np.isfinite(handler.get_numpy_copy(out)).all()


def test_fill_gaussian_std_zero(handler):
    out = poisoned(handler, (1001,))
    handler.fill_gaussian(0.25, 0.0, out)
    assert_close(handler, out, np.full(1001, 0.25), rtol=0, atol=0)


def _draws(h, op, arg, shape=(4097,), times=2):
    results = []
    for _ in range(times):
        a = h.allocate(shape)
        if op == "fill_gaussian":
            h.fill_gaussian(0.0, 1.0, a)
        else:
            h.generate_probability_mask(a, arg)
        results.append(h.get_numpy_copy(a))
    return results


@pytest.mark.parametrize("op,arg", [("fill_gaussian", None), ("generate_probability_mask", 0.5)],
                         ids=["fill_gaussian", "generate_probability_mask"])
def test_randomness_is_reproducible(handler_id, make_handler, op, arg):
    first = _draws(make_handler(handler_id, seed=1234), op, arg)
    again = _draws(make_handler(handler_id, seed=1234), op, arg)
    other = _draws(make_handler(handler_id, seed=4321), op, arg)
    for x, y in zip(first, again):
        np.testing.assert_array_equal(x, y, err_msg="same seed, different results")
    assert not np.array_equal(first[0], first[1]), "consecutive calls gave the same values"
    assert not np.array_equal(first[0], other[0]), "different seeds gave the same values"


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.93, 1.0])
def test_generate_probability_mask(handler, p):
    mask = poisoned(handler, (N_SAMPLES,))
    assert handler.generate_probability_mask(mask, p) is None
    x = handler.get_numpy_copy(mask)
    assert set(np.unique(x).tolist()) <= {0.0, 1.0}, "values other than 0 and 1"
    frac = x.mean(dtype=np.float64)
    if p in (0.0, 1.0):
        assert frac == p
    else:
        assert abs(frac - p) < 6 * np.sqrt(p * (1 - p) / x.size), f"fraction {frac}"


@pytest.mark.parametrize("shape", SMALL_SHAPES + [(3, 1, 7)], ids=shape_id)
def test_generate_probability_mask_shapes(handler, shape):
    mask = poisoned(handler, shape)
    handler.generate_probability_mask(mask, 0.3)
    assert set(np.unique(handler.get_numpy_copy(mask)).tolist()) <= {0.0, 1.0}


# ============================================================================ coverage
def test_every_contract_op_is_tested():
    """A public op added to Handler without a test here (or in the streams tests)
    fails this test."""
    here = Path(__file__).parent
    text = (Path(__file__).read_text()
            + (here / "test_streams_api.py").read_text()
            + (here / "test_prefetch.py").read_text()
            + (here / "test_interop.py").read_text()
            + (here / "test_graphs.py").read_text()
            + (here / "test_conv.py").read_text()         # convolution and pooling
            + (here / "test_adam.py").read_text()         # the optimizer's fused update
            + (here / "test_loss_scale_ops.py").read_text()   # loss scaling's device ops
            + (here / "test_twin.py").read_text()         # twins and cast_t
            + (here / "test_attention.py").read_text()    # attention forward and backward
            + (here / "test_checkpoint.py").read_text())  # the generators' state
    ops = [name for name, value in vars(Handler).items()
           if callable(value) and not name.startswith("_")]
    missing = [op for op in ops if not re.search(rf"\b{op}\b", text)]
    assert len(ops) > 50
    assert not missing, f"ops without tests: {missing}"
