"""Reductions in fused ops (``handlers.fused_op``): ``sum``, ``mean``,
``max`` and ``min`` along the last axis, ``col``, per-row (``:col``) arrays
and summed (``:row``) outputs, per handler and dtype.

References are float64 NumPy formulas written here, independently of the
evaluator in handlers/fused.py, on fresh random inputs; outputs are poisoned
with NaN first.  Row lengths cover every strategy of the GPU's row kernel
(``fused_source.plan_rows``): lane groups (1, 3, 32), a block holding the
row (257, 5000; 512 and 16384 in every slot of the block's threads) and
streaming passes (40000); the summed outputs' shapes
add grids of many blocks (two levels of partial rows on a GPU).  The CUDA
source of every declaration here compiles with nvcc where it is installed.
"""
import re
import shutil
import subprocess

import numpy as np
import pytest

from handlers import DebugHandler, dtypes, fused_op
from handlers.cuda import fused_source
from handlers.fused import REDUCTIONS
from handlers.testing import check_fused_op
from helpers import as_handler_values, poisoned, rand, shape_id, upload

#: these ops run on the float16 and bfloat16 NumpyHandler too (conftest)
HALF_FORMATS = True

#: 257 and 16384: the fewest and the most columns a block holds (one warp and
#: 1024 threads of 16 elements each, fused_source.plan_rows) on the GPU; 512
#: and 16384 fill every slot of the block's threads (the ``full`` kernel),
#: 512 whatever the count a thread holds (2 to 16)
COLS = [1, 3, 32, 257, 512, 5000, 16384, 40000]
ROWS = [1, 6]

SOFTMAX = fused_op("softmax", "x", "y", "m = max(x); e = exp(x - m); s = sum(e); y = e / s")
LOG_SOFTMAX = fused_op("log_softmax", "x", "y", "m = max(x); y = x - m - log(sum(exp(x - m)))")
CROSS_ENTROPY = fused_op("cross_entropy", "z t:col #inv_n", "loss:col dz", """
m = max(z)
e = exp(z - m)
s = sum(e)
picked = sum(where(col == t, z, 0))
loss = (log(s) + m - picked) * inv_n
dz = (e / s - (col == t)) * inv_n
""")
LAYER_NORM = fused_op("layer_norm", "x g:row b:row #eps", "y mu:col r:col", """
mu = mean(x)
d = x - mu
r = rsqrt(mean(d * d) + eps)
y = d * r * g + b
""")
LAYER_NORM_BACK = fused_op("layer_norm_back", "x dy g:row mu:col r:col", "dx", """
xhat = (x - mu) * r
gdy = g * dy
dx = r * (gdy - mean(gdy) - xhat * mean(gdy * xhat))
""")
RMS_NORM = fused_op("rms_norm", "x g:row $eps", "y", "y = x * rsqrt(mean(x * x) + eps) * g")
# Backward passes in one kernel each: dx, and the gain's and bias's gradients
# summed over the rows (':row' outputs).
LN_BACKWARD = fused_op("layer_norm_backward", "dy x g:row mu:col r:col", "dx dg:row db:row", """
xhat = (x - mu) * r
gy = dy * g
dx = r * (gy - mean(gy) - xhat * mean(gy * xhat))
dg = dy * xhat
db = dy
""")
RMS_BACKWARD = fused_op("rms_norm_backward", "dy x g:row r:col", "dx dg:row", """
gy = dy * g
dx = r * (gy - x * (r * r) * mean(gy * x))
dg = dy * x * r
""")
# No reduction: a row kernel for the sum alone.
BIAS_BACKWARD = fused_op("bias_backward", "dy", "dx db:row", "dx = dy * 2; db = dy")
# Per-row values summed: each column gets the sum over the rows.
ROW_TOTALS = fused_op("row_totals", "x t:col", "s:row n:row", "s = t * 2 + max(x); n = 1")
EPS = 1e-5
#: Shapes of the summed outputs' tests: lane groups (1, 5, 17, 40, 64 columns;
#: 5000 rows make hundreds of blocks), a block per row (300, 1000; 1500 rows
#: fill the GPU; 512 in every slot of its threads) and streaming (20000, with
#: 16-byte packets; 20001 without; 500 rows: batches of streamed rows, more
#: than a GPU's blocks take one each, the last one short).
SUM_SHAPES = [(1, 1), (1, 1000), (7, 5), (33, 17), (64, 300), (4, 3, 40), (5000, 64),
              (1500, 300), (600, 512), (3, 20000), (2, 20001), (40, 20000), (500, 20001)]


def close(h, arr, ref, rtol=2e-5, scale=None):
    """Compare handler array ``arr`` with the float64 ``ref`` (NaN where NaN):
    within ``rtol`` of each element or of ``scale``, the magnitude of the
    terms it is computed from (default: its row's largest magnitude; a value
    computed from row sums carries their absolute error, and a difference
    of large terms, such as a loss near 0, theirs)."""
    got = h.get_numpy_copy(arr)
    assert got.dtype == h.dtype and got.shape == ref.shape
    if h.dtype == np.float64:
        rtol = 1e-11
    if scale is None:
        scale = np.nanmax(np.abs(ref), axis=-1, keepdims=True) if ref.size else 0.0
    atol = rtol * scale
    if dtypes.is_half(h.dtype):   # float32 arithmetic, then one rounding to the format
        rtol = rtol + 1.01 * dtypes.unit_roundoff(h.dtype)
        atol = atol + dtypes.smallest_subnormal(h.dtype)
    got = got.astype(np.float64)
    bad = ~(np.abs(got - ref) <= atol + rtol * np.abs(ref)) & ~(np.isnan(got) & np.isnan(ref))
    assert not bad.any(), (f"{bad.sum()} of {bad.size} elements differ, first at "
                           f"{np.argwhere(bad)[0]}: got {got[bad][0]}, want {ref[bad][0]}")


def targets(h, rng, rows, d):
    """Class indices in [0, d) as a (rows, 1) handler array, each exactly
    representable in the handler's format (bfloat16 holds every integer
    only up to 256, float16 up to 2048)."""
    limit = {"bfloat16": 256, "float16": 2048}.get(h.dtype.name, d)
    return upload(h, rng.integers(0, min(d, limit), (rows, 1)).astype(np.float64))


def softmax64(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm64(x):
    mu = x.mean(axis=-1, keepdims=True)
    r = 1 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + EPS)
    return mu, r


# ============================================================================ results
@pytest.mark.parametrize("d", COLS)
@pytest.mark.parametrize("rows", ROWS)
def test_softmax(handler, rng, rows, d):
    x, x64 = upload(handler, rand((rows, d), rng, -4, 4))
    y = poisoned(handler, (rows, d))
    SOFTMAX(handler, x, y)
    close(handler, y, softmax64(x64))


@pytest.mark.parametrize("d", COLS)
@pytest.mark.parametrize("rows", ROWS)
def test_log_softmax(handler, rng, rows, d):
    x, x64 = upload(handler, rand((rows, d), rng, -4, 4))
    y = poisoned(handler, (rows, d))
    LOG_SOFTMAX(handler, x, y)
    m = x64.max(axis=-1, keepdims=True)
    close(handler, y, x64 - m - np.log(np.exp(x64 - m).sum(axis=-1, keepdims=True)))


@pytest.mark.parametrize("d", COLS)
@pytest.mark.parametrize("rows", ROWS)
def test_cross_entropy_and_gradient(handler, rng, rows, d):
    """Loss per row (rows, 1) and its gradient (rows, d), from class indices
    t (rows, 1) and a scalar 1 / rows."""
    (z, z64), (t, t64) = upload(handler, rand((rows, d), rng, -4, 4)), targets(handler, rng,
                                                                             rows, d)
    loss, dz = poisoned(handler, (rows, 1)), poisoned(handler, (rows, d))
    CROSS_ENTROPY(handler, z, t, 1.0 / rows, loss, dz)
    m = z64.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(z64 - m).sum(axis=-1, keepdims=True))
    onehot = np.arange(d) == t64
    picked = z64[onehot].reshape(rows, 1)
    close(handler, loss, (lse - picked) / rows, scale=(np.abs(lse) + np.abs(picked)) / rows)
    close(handler, dz, (softmax64(z64) - onehot) / rows)


@pytest.mark.parametrize("d", COLS)
@pytest.mark.parametrize("rows", ROWS)
def test_layer_norm(handler, rng, rows, d):
    (x, x64), (g, g64), (b, b64) = (upload(handler, rand(s, rng)) for s in
                                    ((rows, d), (d,), (1, d)))
    y, mu, r = poisoned(handler, (rows, d)), poisoned(handler, (rows, 1)), \
        poisoned(handler, (rows, 1))
    LAYER_NORM(handler, x, g, b, EPS, y, mu, r)
    mu64, r64 = layer_norm64(x64)
    close(handler, mu, mu64, scale=np.abs(x64).mean(axis=-1, keepdims=True))
    close(handler, r, r64)
    close(handler, y, (x64 - mu64) * r64 * g64 + b64)


@pytest.mark.parametrize("d", COLS)
@pytest.mark.parametrize("rows", ROWS)
def test_layer_norm_backward(handler, rng, rows, d):
    x64 = rand((rows, d), rng)
    mu, r = layer_norm64(x64)
    (x, x64), (dy, dy64), (g, g64) = (upload(handler, a) for a in
                                      (x64, rand((rows, d), rng), rand((d,), rng)))
    (mu, mu64), (r, r64) = upload(handler, mu), upload(handler, r)
    dx = poisoned(handler, (rows, d))
    LAYER_NORM_BACK(handler, x, dy, g, mu, r, dx)
    xhat, gdy = (x64 - mu64) * r64, g64 * dy64
    want = r64 * (gdy - gdy.mean(axis=-1, keepdims=True)
                  - xhat * (gdy * xhat).mean(axis=-1, keepdims=True))
    # the terms' magnitude: a row of one element cancels to 0 exactly in
    # float64, but an FMA's unrounded g * dy leaves its rounding error times r
    terms = r64 * (np.abs(gdy) + np.abs(xhat) * np.abs(gdy * xhat).mean(axis=-1, keepdims=True))
    close(handler, dx, want, scale=terms.max(axis=-1, keepdims=True))


@pytest.mark.parametrize("d", COLS)
@pytest.mark.parametrize("rows", ROWS)
def test_rms_norm(handler, rng, rows, d):
    (x, x64), (g, g64) = upload(handler, rand((rows, d), rng)), upload(handler, rand((d,), rng))
    eps, eps64 = upload(handler, np.array([EPS]))   # a device scalar, as the format holds it
    y = poisoned(handler, (rows, d))
    RMS_NORM(handler, x, g, eps, y)
    close(handler, y, x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps64) * g64)


@pytest.mark.parametrize("d", COLS)
def test_every_element_counts_once(handler, rng, d):
    """Exact: a sum of ones is the row's length, ``max(col)`` its last column
    and ``col`` every column, whichever strategy covers the row."""
    op = fused_op("cover", "x", "n:col hi:col lo:col c",
                  "n = sum(x * 0 + 1); hi = max(col); lo = min(col); c = col")
    x = upload(handler, rand((3, d), rng))[0]
    n, hi, lo = (poisoned(handler, (3, 1)) for _ in range(3))
    c = poisoned(handler, (3, d))
    op(handler, x, n, hi, lo, c)
    for arr, want in ((n, d), (hi, d - 1), (lo, 0)):
        np.testing.assert_array_equal(handler.get_numpy_copy(arr).astype(np.float64),
                                      np.full((3, 1), as_handler_values(handler, float(want))))
    np.testing.assert_array_equal(handler.get_numpy_copy(c).astype(np.float64),
                                  np.broadcast_to(as_handler_values(handler, np.arange(d)), (3, d)))


@pytest.mark.parametrize("d", [5, 1000, 40000])
def test_reductions_propagate_nan(handler, rng, d):
    """``max``, ``min``, ``sum`` and ``mean`` of a row holding a NaN are NaN,
    wherever the NaN is; a row of -inf has max -inf (not NaN)."""
    op = fused_op("nan_rows", "x", "mx:col mn:col s:col m:col",
                  "mx = max(x); mn = min(x); s = sum(x); m = mean(x)")
    xv = rand((5, d), rng)
    xv[0, rng.integers(d)] = np.nan
    xv[1, 0] = xv[2, -1] = np.nan
    xv[3] = -np.inf
    xv[4, rng.integers(d)] = 50.0           # the row's maximum, exact
    x, x64 = upload(handler, xv)
    outs = [handler.create_from_numpy(np.full((5, 1), 7.0)) for _ in range(4)]
    op(handler, x, *outs)
    got = [handler.get_numpy_copy(o).astype(np.float64).ravel() for o in outs]
    for g in got:
        assert np.isnan(g[:3]).all()
    assert got[0][3] == -np.inf and got[1][3] == -np.inf and got[0][4] == 50.0
    assert got[1][4] == x64[4].min()
    rtol = 1e-4 + (dtypes.unit_roundoff(handler.dtype) if dtypes.is_half(handler.dtype) else 0)
    assert abs(got[2][4] - x64[4].sum()) <= rtol * np.abs(x64[4]).sum()
    assert abs(got[3][4] - x64[4].mean()) <= rtol * np.abs(x64[4]).mean()


@pytest.mark.parametrize("shape", [(7,), (2, 3, 33), (0, 5), (0, 3, 4)], ids=shape_id)
def test_any_number_of_axes_and_no_rows(handler, rng, shape):
    """A 1-D array is one row (per-row arrays of shape (1,)); more axes are
    rows of rows (per-row shape (..., 1)); no rows compute nothing."""
    (z, z64) = upload(handler, rand(shape, rng, -2, 2))
    per_row = shape[:-1] + (1,)
    t, t64 = upload(handler, rng.integers(0, shape[-1], per_row).astype(np.float64))
    loss, dz = poisoned(handler, per_row), poisoned(handler, shape)
    CROSS_ENTROPY(handler, z, t, 0.5, loss, dz)
    m = z64.max(axis=-1, keepdims=True) if z64.size else np.zeros(per_row)
    lse = m + np.log(np.exp(z64 - m).sum(axis=-1, keepdims=True))
    onehot = np.arange(shape[-1]) == t64
    picked = np.where(onehot, z64, 0).sum(axis=-1, keepdims=True)
    close(handler, loss, (lse - picked) * 0.5, scale=np.abs(lse) + np.abs(picked))
    close(handler, dz, (np.exp(z64 - lse) - onehot) * 0.5)


@pytest.mark.parametrize("cols", [9, 3000, 40000])
def test_in_place(handler, rng, cols):
    """Softmax over its own input, and an output over a per-row input, in
    rows of lane groups (9), of a block holding them (3000) and streamed
    (40000) on the GPU."""
    x, x64 = upload(handler, rand((4, 300), rng, -3, 3))
    SOFTMAX(handler, x, x)
    close(handler, x, softmax64(x64))
    op = fused_op("shift", "x s:col", "y m:col", "y = x - s; m = max(x) + s")
    (x, x64), (s, s64) = upload(handler, rand((4, cols), rng)), upload(handler, rand((4, 1), rng))
    y = poisoned(handler, (4, cols))
    op(handler, x, s, y, s)                  # m is s's memory: s read before m is written
    close(handler, y, x64 - s64, scale=2)
    close(handler, s, x64.max(axis=-1, keepdims=True) + s64, scale=2)


@pytest.mark.parametrize("cols, offset", [(40001, 0), (40003, 0), (40000, 1), (40002, 3)])
def test_streamed_rows_of_any_length_and_alignment(handler, rng, cols, offset):
    """Streamed rows (longer than a block holds) of any length: on the GPU the
    aligned middle of each row goes by 16-byte packets, the few elements
    before and after it one by one, so rows of odd length start at every
    alignment in turn; arrays at an odd element offset take the element
    path.  Softmax out of place and in place, and cross-entropy with its
    per-row outputs, against float64."""
    rows = 5
    data, _ = upload(handler, rand((rows * cols + offset,), rng, -4, 4))
    x = handler.view_t(data, offset, (rows, cols))
    x64 = handler.get_numpy_copy(x).astype(np.float64)
    y = poisoned(handler, (rows, cols))
    SOFTMAX(handler, x, y)
    close(handler, y, softmax64(x64))
    t, t64 = targets(handler, rng, rows, cols)
    loss, dz = poisoned(handler, (rows, 1)), poisoned(handler, (rows, cols))
    CROSS_ENTROPY(handler, x, t, 0.5, loss, dz)
    m = x64.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(x64 - m).sum(axis=-1, keepdims=True))
    onehot = np.arange(cols) == t64
    picked = x64[onehot].reshape(rows, 1)
    close(handler, loss, (lse - picked) * 0.5, scale=np.abs(lse) + np.abs(picked))
    close(handler, dz, (softmax64(x64) - onehot) * 0.5)
    SOFTMAX(handler, x, x)                       # in place: each element read before written
    close(handler, x, softmax64(x64))


def test_per_row_values_broadcast_and_accumulate(handler, rng):
    """A full output assigned a per-row value is that value along the row;
    a per-row input is broadcast without any reduction; a reduction of a
    per-row value sums it along the row; a per-row output can accumulate."""
    op = fused_op("row_values", "x s:col", "avg scaled acc:col",
                  "avg = mean(x); scaled = x * s; acc += sum(s) + max(x * s)")
    (x, x64), (s, s64) = upload(handler, rand((5, 13), rng)), upload(handler, rand((5, 1), rng))
    acc, acc64 = upload(handler, rand((5, 1), rng))
    avg, scaled = poisoned(handler, (5, 13)), poisoned(handler, (5, 13))
    assert op.row.reads == ("x", "s", "acc") and op.row.writes == ("avg", "scaled", "acc")
    op(handler, x, s, avg, scaled, acc)
    close(handler, avg, np.broadcast_to(x64.mean(axis=-1, keepdims=True), (5, 13)), scale=1)
    close(handler, scaled, x64 * s64)
    close(handler, acc, acc64 + 13 * s64 + (x64 * s64).max(axis=-1, keepdims=True), scale=15)


def test_col_without_reductions(handler, rng):
    """One-hot rows from class indices: ``col`` alone makes a row kernel."""
    op = fused_op("one_hot", "t:col", "y", "y = col == t")
    t, t64 = upload(handler, rng.integers(0, 7, (6, 1)).astype(np.float64))
    y = poisoned(handler, (6, 7))
    op(handler, t, y)
    np.testing.assert_array_equal(handler.get_numpy_copy(y).astype(np.float64),
                                  (np.arange(7) == t64).astype(np.float64))


def test_nested_reductions_inline(handler, rng):
    """A reduction inside another's argument, within one expression."""
    op = fused_op("lse", "x", "l:col", "l = log(sum(exp(x - max(x, axis=-1)))) + max(x)")
    x, x64 = upload(handler, rand((3, 50), rng, -5, 5))
    lv = poisoned(handler, (3, 1))
    op(handler, x, lv)
    m = x64.max(axis=-1, keepdims=True)
    close(handler, lv, m + np.log(np.exp(x64 - m).sum(axis=-1, keepdims=True)))


def test_check_fused_op_knows_summed_outputs(handler, rng):
    """The test kit's check_fused_op makes a summed (':row') output of shape
    (1, last axis), and a wrong reference for it fails."""
    op = fused_op("kit_col_sums", "x", "y s:row", "y = x * 2; s = x * x")
    check_fused_op(handler, op, lambda x: (x * 2, (x * x).sum(axis=0, keepdims=True)),
                   (6, 9), rng)
    with pytest.raises(AssertionError, match="output s"):
        check_fused_op(handler, op, lambda x: (x * 2, (x * x).sum(axis=0, keepdims=True) + 1),
                       (6, 9), rng)


def test_check_fused_op_knows_per_row_arrays(handler, rng):
    """The test kit's check_fused_op makes per-row inputs and outputs of
    shape (..., 1)."""
    op = fused_op("scaled_sum", "x s:col", "y:col", "y = sum(x) * s")
    check_fused_op(handler, op, lambda x, s: x.sum(axis=-1, keepdims=True) * s, (4, 20), rng)


# ============================================================================ summed outputs
def column_sums(terms):
    """(the sum over every leading axis of float64 ``terms``, the sum of
    their magnitudes: the scale of a float32 sum's error)."""
    lead = tuple(range(terms.ndim - 1))
    return terms.sum(axis=lead), np.abs(terms).sum(axis=lead)


@pytest.mark.parametrize("shape", SUM_SHAPES, ids=shape_id)
def test_layer_norm_backward_in_one_kernel(handler, rng, shape):
    """dx, and dg and db summed over the rows, from dy and x read once; dg
    of shape (d,), db of shape (1, d)."""
    d = shape[-1]
    x64 = rand(shape, rng)
    mu, r = layer_norm64(x64)
    (dy, dy64), (x, x64), (g, g64) = (upload(handler, a) for a in
                                      (rand(shape, rng), x64, rand((d,), rng)))
    (mu, mu64), (r, r64) = upload(handler, mu), upload(handler, r)
    dx, dg, db = poisoned(handler, shape), poisoned(handler, (d,)), poisoned(handler, (1, d))
    LN_BACKWARD(handler, dy, x, g, mu, r, dx, dg, db)
    xhat, gy = (x64 - mu64) * r64, dy64 * g64
    want = r64 * (gy - gy.mean(axis=-1, keepdims=True)
                  - xhat * (gy * xhat).mean(axis=-1, keepdims=True))
    terms = r64 * (np.abs(gy) + np.abs(xhat) * np.abs(gy * xhat).mean(axis=-1, keepdims=True))
    close(handler, dx, want, scale=terms.max(axis=-1, keepdims=True))
    want, scale = column_sums(dy64 * xhat)
    close(handler, dg, want, scale=scale)
    want, scale = column_sums(dy64)
    close(handler, db, want.reshape(1, d), scale=scale)


@pytest.mark.parametrize("shape", [(7, 5), (33, 17), (64, 300), (4, 3, 40), (3, 20000),
                                   (400, 20000)], ids=shape_id)
def test_rms_norm_backward_in_one_kernel(handler, rng, shape):
    d = shape[-1]
    x64 = rand(shape, rng)
    (dy, dy64), (x, x64), (g, g64) = (upload(handler, a) for a in
                                      (rand(shape, rng), x64, rand((d,), rng)))
    r, r64 = upload(handler, 1 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + EPS))
    dx, dg = poisoned(handler, shape), poisoned(handler, (1, d))
    RMS_BACKWARD(handler, dy, x, g, r, dx, dg)
    gy = dy64 * g64
    want = r64 * (gy - x64 * r64 ** 2 * (gy * x64).mean(axis=-1, keepdims=True))
    terms = r64 * (np.abs(gy) + np.abs(x64) * r64 ** 2 * np.abs(gy * x64).mean(axis=-1,
                                                                               keepdims=True))
    close(handler, dx, want, scale=terms.max(axis=-1, keepdims=True))
    want, scale = column_sums(dy64 * x64 * r64)
    close(handler, dg, want.reshape(1, d), scale=scale)


@pytest.mark.parametrize("shape", [(1, 3), (5, 7), (3, 20000), (300, 33), (400, 20001)],
                         ids=shape_id)
def test_summed_output_without_reductions(handler, rng, shape):
    """A bias gradient beside an elementwise output: a row kernel with no
    reduction; in place too (dx over dy: the sum is of the old dy)."""
    assert BIAS_BACKWARD.row_wise and not BIAS_BACKWARD.program.reduces
    d = shape[-1]
    dy, dy64 = upload(handler, rand(shape, rng))
    dx, db = poisoned(handler, shape), poisoned(handler, (d,))
    BIAS_BACKWARD(handler, dy, dx, db)
    close(handler, dx, 2 * dy64, scale=2)
    want, scale = column_sums(dy64)
    close(handler, db, want, scale=scale)
    db2 = poisoned(handler, (1, d))
    BIAS_BACKWARD(handler, dy, dy, db2)    # dx is dy's memory
    close(handler, dy, 2 * dy64, scale=2)
    close(handler, db2, want.reshape(1, d), scale=scale)


def test_summed_output_of_one_row(handler, rng):
    """A 1-D array is one row: its sum over the rows is itself."""
    dy, dy64 = upload(handler, rand((9,), rng))
    dx, db = poisoned(handler, (9,)), poisoned(handler, (9,))
    BIAS_BACKWARD(handler, dy, dx, db)
    np.testing.assert_array_equal(handler.get_numpy_copy(db), handler.get_numpy_copy(dy))


@pytest.mark.parametrize("shape", [(7, 5), (4, 3, 40), (2, 3000), (2, 20001), (250, 20001)],
                         ids=shape_id)
def test_per_row_values_summed(handler, rng, shape):
    """A per-row value assigned to a summed output is broadcast along the
    row, then summed: every column gets the sum of the rows' values (n = 1:
    the number of rows, exactly)."""
    d, per_row = shape[-1], shape[:-1] + (1,)
    (x, x64), (t, t64) = upload(handler, rand(shape, rng)), upload(handler, rand(per_row, rng))
    s, n = poisoned(handler, (d,)), poisoned(handler, (1, d))
    ROW_TOTALS(handler, x, t, s, n)
    values = np.broadcast_to(2 * t64 + x64.max(axis=-1, keepdims=True), shape)
    want, scale = column_sums(values)
    close(handler, s, want, scale=scale)
    rows = int(np.prod(shape[:-1]))
    np.testing.assert_array_equal(handler.get_numpy_copy(n).astype(np.float64),
                                  np.full((1, d), float(rows)))


@pytest.mark.parametrize("shape", [(0, 5), (0, 3, 4), (0, 20000)], ids=shape_id)
def test_summed_outputs_of_no_rows_are_zero(handler, shape):
    d = shape[-1]
    per_row = shape[:-1] + (1,)
    dy, x, dx = poisoned(handler, shape), poisoned(handler, shape), poisoned(handler, shape)
    mu, r = poisoned(handler, per_row), poisoned(handler, per_row)
    g, dg, db = poisoned(handler, (d,)), poisoned(handler, (d,)), poisoned(handler, (1, d))
    LN_BACKWARD(handler, dy, x, g, mu, r, dx, dg, db)
    for arr in (dg, db):
        np.testing.assert_array_equal(handler.get_numpy_copy(arr).astype(np.float64),
                                      np.zeros(arr.shape))
    s, n = poisoned(handler, (d,)), poisoned(handler, (d,))
    ROW_TOTALS(handler, x, mu, s, n)
    for arr in (s, n):
        np.testing.assert_array_equal(handler.get_numpy_copy(arr).astype(np.float64),
                                      np.zeros(d))


def test_summed_outputs_of_empty_rows(handler):
    """Rows of no element: summed outputs of shape (0,), nothing to write."""
    dy, dx, db = poisoned(handler, (4, 0)), poisoned(handler, (4, 0)), poisoned(handler, (0,))
    BIAS_BACKWARD(handler, dy, dx, db)
    assert handler.get_numpy_copy(db).shape == (0,)


@pytest.mark.parametrize("shape", [(5000, 64), (1500, 300), (40, 20000), (500, 20001)],
                         ids=shape_id)
def test_summed_outputs_are_reproducible(make_handler, handler_id, rng, shape):
    """The same bits at every run, whichever block finishes last (no value
    is added atomically), through a bound call and a replayed capture too."""
    h = make_handler(handler_id)
    d = shape[-1]
    (dy, dy64), (x, x64) = upload(h, rand(shape, rng)), upload(h, rand(shape, rng))
    mu, r = layer_norm64(x64)
    g, mu, r = upload(h, rand((d,), rng))[0], upload(h, mu)[0], upload(h, r)[0]
    outs = [poisoned(h, shape), poisoned(h, (d,)), poisoned(h, (d,))]
    LN_BACKWARD(h, dy, x, g, mu, r, *outs)
    first = [h.get_numpy_copy(o) for o in outs]
    run = LN_BACKWARD.bind(h, dy, x, g, mu, r, *outs)
    for _ in range(3):
        for o in outs:
            h.fill(o, np.nan)
        run()
        for o, want in zip(outs, first):
            np.testing.assert_array_equal(h.get_numpy_copy(o), want)
    with h.capture() as graph:
        run()
    for _ in range(2):
        for o in outs:
            h.fill(o, np.nan)
        graph.replay()
        for o, want in zip(outs, first):
            np.testing.assert_array_equal(h.get_numpy_copy(o), want)
    want, scale = column_sums(dy64)
    close(h, outs[2], want, scale=scale)


def test_summed_output_calls(handler, rng):
    """Summed outputs must be (d,) or (1, d) rows and may not overlap an
    input (not even as its very memory) or another output."""
    dy = upload(handler, rand((7, 5), rng))[0]
    g, dx, dg, db = handler.ones((5,)), poisoned(handler, (7, 5)), poisoned(handler, (5,)), \
        poisoned(handler, (5,))
    mu, r = handler.zeros((7, 1)), handler.ones((7, 1))
    for bad in [(6,), (2, 5), (5, 1), (7, 5)]:
        with pytest.raises(ValueError, match=(
                rf"^layer_norm_backward: row output db must have shape \(5,\) or \(1, 5\) to "
                rf"hold the sum over the rows of dx \(7, 5\), got {re.escape(str(bad))}$")):
            LN_BACKWARD(handler, dy, dy, g, mu, r, dx, dg, poisoned(handler, bad))
    with pytest.raises(ValueError, match=r"^layer_norm_backward: the summed output db must not "
                                         r"overlap the input g$"):
        LN_BACKWARD(handler, dy, dy, g, mu, r, dx, dg, g)
    with pytest.raises(ValueError, match=r"^layer_norm_backward: dg must not overlap db$"):
        LN_BACKWARD(handler, dy, dy, g, mu, r, dx, dg, dg)
    with pytest.raises(ValueError, match=r"^row_totals: row output s must have shape"):
        ROW_TOTALS(handler, dy, mu, poisoned(handler, (1, 7)), dg)
    t = handler.zeros((5, 1))
    with pytest.raises(ValueError, match=r"^row_totals: the summed output n must not overlap "
                                         r"the input t$"):   # t's memory, another object
        ROW_TOTALS(handler, handler.zeros((5, 5)), t, dg, handler.reshape_t(t, (5,)))
    # A full output may still be an input's very memory
    LN_BACKWARD(handler, dy, dy, g, mu, r, dy, dg, db)


# ============================================================================ gradients
def test_cross_entropy_gradient_is_the_derivative(make_handler, rng):
    """dz from the op is the derivative of the summed loss (float64,
    central differences)."""
    h = make_handler("numpy-f64")
    z64, t64 = rand((3, 6), rng, -2, 2), rng.integers(0, 6, (3, 1)).astype(np.float64)
    z, t = h.create_from_numpy(z64), h.create_from_numpy(t64)
    loss, dz = h.zeros((3, 1)), h.zeros((3, 6))
    CROSS_ENTROPY(h, z, t, 1 / 3, loss, dz)

    def total(zv):
        h.set_from_numpy(z, zv)
        CROSS_ENTROPY(h, z, t, 1 / 3, loss, h.zeros((3, 6)))
        return h.get_numpy_copy(loss).sum()
    grad = h.get_numpy_copy(dz)
    for i, j in [(0, 0), (1, int(t64[1, 0])), (2, 5)]:
        step = np.zeros_like(z64)
        step[i, j] = 1e-6
        fd = (total(z64 + step) - total(z64 - step)) / 2e-6
        assert abs(fd - grad[i, j]) < 1e-8, (i, j, fd, grad[i, j])


def test_layer_norm_backward_is_the_derivative(make_handler, rng):
    """dx of LAYER_NORM_BACK is the derivative of sum(y * dy) (float64)."""
    h = make_handler("numpy-f64")
    x64, dy64, g64, b64 = rand((2, 7), rng), rand((2, 7), rng), rand((7,), rng), rand((7,), rng)
    x, dy, g, b = (h.create_from_numpy(a) for a in (x64, dy64, g64, b64))
    y, mu, r, dx = h.zeros((2, 7)), h.zeros((2, 1)), h.zeros((2, 1)), h.zeros((2, 7))
    LAYER_NORM(h, x, g, b, EPS, y, mu, r)
    LAYER_NORM_BACK(h, x, dy, g, mu, r, dx)

    def total(xv):
        h.set_from_numpy(x, xv)
        LAYER_NORM(h, x, g, b, EPS, y, h.zeros((2, 1)), h.zeros((2, 1)))
        return (h.get_numpy_copy(y) * dy64).sum()
    grad = h.get_numpy_copy(dx)
    for i, j in [(0, 0), (1, 3), (1, 6)]:
        step = np.zeros_like(x64)
        step[i, j] = 1e-6
        fd = (total(x64 + step) - total(x64 - step)) / 2e-6
        assert abs(fd - grad[i, j]) < 1e-7, (i, j, fd, grad[i, j])


# ============================================================================ calls
def test_bound_call_capture_and_debug(make_handler, handler_id, rng):
    """A reduction op binds, captures and replays like any fused op, and
    DebugHandler tracks its per-row arrays."""
    h = make_handler(handler_id)
    (z, z64), (t, t64) = upload(h, rand((4, 40), rng)), targets(h, rng, 4, 40)
    loss, dz = poisoned(h, (4, 1)), poisoned(h, (4, 40))
    run = CROSS_ENTROPY.bind(h, z, t, 0.25, loss, dz)
    with h.capture() as g:
        run()
    assert np.isnan(h.get_numpy_copy(loss)).all()     # recorded, not run
    g.replay()
    m = z64.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(z64 - m).sum(axis=-1, keepdims=True))
    onehot = np.arange(40) == t64
    picked = z64[onehot].reshape(4, 1)
    close(h, loss, (lse - picked) * 0.25, scale=np.abs(lse) + np.abs(picked))
    debug = DebugHandler(h)
    CROSS_ENTROPY(debug, z, t, 0.25, loss, dz)
    assert CROSS_ENTROPY.row.reads == ("z", "t") and CROSS_ENTROPY.row.writes == ("loss", "dz")
    close(h, dz, (np.exp(z64 - lse) - onehot) * 0.25)


def test_bad_calls(handler, rng):
    x = upload(handler, rand((3, 4), rng))[0]
    with pytest.raises(ValueError, match=r"cross_entropy: per-row array t must have shape "
                                         r"\(3, 1\) \(one value per row of dz \(3, 4\)\), "
                                         r"got \(3,\)"):
        CROSS_ENTROPY(handler, x, poisoned(handler, (3,)), 1.0, poisoned(handler, (3, 1)),
                      poisoned(handler, (3, 4)))
    with pytest.raises(ValueError, match=r"per-row array loss must have shape \(3, 1\)"):
        CROSS_ENTROPY(handler, x, poisoned(handler, (3, 1)), 1.0, poisoned(handler, (1, 3)),
                      poisoned(handler, (3, 4)))
    with pytest.raises(ValueError, match=r"softmax: y \(3, 0\) has rows of 0 elements: a "
                                         r"reduction over an empty row is undefined"):
        SOFTMAX(handler, poisoned(handler, (3, 0)), poisoned(handler, (3, 0)))
    with pytest.raises(ValueError, match=r"softmax: y has shape \(\): .* at least one dimension"):
        SOFTMAX(handler, handler.zeros(()), handler.zeros(()))
    with pytest.raises(ValueError, match=r"softmax: shapes differ"):
        SOFTMAX(handler, x, poisoned(handler, (3, 5)))


# ============================================================================ declarations
@pytest.mark.parametrize("inputs, outputs, body, message", [
    ("x", "y:col", "y = x * 2", r"output 'y' is declared per row \(':col'\) but is assigned "
                                r"a value that varies along the row at line 1, column 5"),
    ("x", "y:col", "m = max(x)\ny = m + col", r"output 'y' .* at line 2, column 5"),
    ("x b:row", "y:col", "y = max(x) * b", r"output 'y' is declared per row"),
    ("x", "y", "y = sum(x, 1)", r"sum takes 1 positional argument \(the value to reduce"),
    ("x", "y", "y = mean(x, x)", r"mean takes 1 positional argument"),
    ("x", "y", "y = sum(x, axis=0)", r"sum: axis must be -1, got 0 at line 1, column 5 "
                                     r"\(fused_op reduces along the last axis only\)"),
    ("x", "y", "y = max(x, axis=1)", r"max: axis must be -1, got 1"),
    ("x", "y", "y = sum(x, axis=a)", r"sum: axis must be -1, got a"),
    ("x", "y", "y = sum(x, keepdims=True)", r"sum takes no keyword 'keepdims' \(only axis=-1\)"),
    ("x", "y", "y = min(x, x, x)", r"min takes 1 \(a reduction along the last axis\) or 2"),
    ("x", "y", "y = max(x, 0, axis=-1)", r"max takes 1 \(a reduction"),
    ("x", "y", "y = sum()", r"sum takes 1 positional argument"),
    ("x", "y", "y = prod(x)", r"unknown function 'prod' .*known: .*max, mean, min, .*sum"),
    ("col", "y", "y = col", r"'col' cannot name a parameter"),
    ("x", "sum", "sum = x", r"'sum' cannot name a parameter"),
    ("x", "y", "col = x; y = col", r"'col' cannot name a value"),
    ("x", "y", "mean = x; y = mean", r"'mean' cannot name a value"),
    ("x:rows", "y", "y = x", r"unknown input mode 'rows' in 'x:rows' \(only ':row' or ':col'\)"),
    ("x", "y:rows", "y = x", r"unknown output mode 'rows' in 'y:rows' \(only ':row' or "
                             r"':col'\)"),
    ("dy", "dx db:row", "dx = dy\ndb = db + dy", r"output 'db' is declared ':row' \(a sum "
                                                 r"over the rows\): the body cannot read its "
                                                 r"old contents at line 2, column 6"),
    ("dy", "db:row", "db += dy", r"output 'db' is declared ':row' .* at line 1, column 1"),
    ("dy", "y db:row", "y = db; db = dy", r"output 'db' is declared ':row'"),
    ("b:row", "db:row", "db = b", r"has no input or output of full rows"),
    ("t:col", "db:row", "db = t", r"has no input or output of full rows"),
    ("t:col", "y:col", "y = sum(t)", r"has no input or output of full rows"),
    ("t:col b:row", "y:col", "y = t + max(b)", r"has no input or output of full rows"),
])
def test_bad_declarations(inputs, outputs, body, message):
    with pytest.raises(ValueError, match="^bad: " + message):
        fused_op("bad", inputs=inputs, outputs=outputs, body=body)


def test_declaration_attributes():
    assert CROSS_ENTROPY.cols == ("t", "loss") and CROSS_ENTROPY.full == "dz"
    assert CROSS_ENTROPY.row_wise and not fused_op("e", "x", "y", "y = max(x, 0)").row_wise
    assert fused_op("c", "x", "y", "y = x * col").row_wise
    assert fused_op("s", "x s:col", "y", "y = x * s").row_wise
    assert LAYER_NORM.full == "y" and "per row" in LAYER_NORM.__doc__
    assert set(REDUCTIONS) == {"sum", "mean", "max", "min"}
    # max and min keep their elementwise meaning with two arguments
    prog = fused_op("two", "x", "y", "y = max(x, 0) + min(x)").program
    assert prog.statements[0][1] == ("add", ("max", ("ref", "in:x"), ("num", 0.0)),
                                     ("reduce", "min", ("ref", "in:x")))
    assert prog.per_row == frozenset() and prog.reduces and not prog.uses_col
    assert LN_BACKWARD.sums == ("dg", "db") and LN_BACKWARD.full == "dx"
    assert LN_BACKWARD.row.writes == ("dx", "dg", "db") and "sum over the rows" in \
        LN_BACKWARD.__doc__
    assert ROW_TOTALS.full == "x" and ROW_TOTALS.sums == ("s", "n") and ROW_TOTALS.row_wise
    # after its assignment, a summed output's name is the value assigned
    op = fused_op("reuse", "dy", "db:row y", "db = dy * 2; y = db + 1")
    assert op.program.reads_old == ()


# ============================================================================ CUDA source
def test_stream_batch():
    """Streamed rows with summed outputs go in batches of STREAM_BATCH rows
    (fewer in float64, whose values take two registers each); an op without
    summed outputs, or with a per-row output, takes a row at a time."""
    per_row_and_sums = fused_op("max_and_col_sums", "x", "m:col s:row", "m = max(x); s = x")
    assert fused_source.stream_batch(LN_BACKWARD, np.float32) == 3
    assert fused_source.stream_batch(LN_BACKWARD, dtypes.resolve("bf16")) == 3
    assert fused_source.stream_batch(LN_BACKWARD, np.float64) == 2
    assert fused_source.stream_batch(BIAS_BACKWARD, np.float32) == 3
    assert fused_source.stream_batch(SOFTMAX, np.float32) == 1
    assert fused_source.stream_batch(per_row_and_sums, np.float32) == 1


def test_plan_rows():
    """The row kernel's launches: lane groups in blocks of BLOCK threads up
    to 32 * held columns, then a block per row of as few threads as hold it
    (or streaming past ROW_BLOCK * held); a block for every row group, but
    with summed outputs at most one wave of blocks, and past a block a
    multiprocessor, about sms * sqrt(rows / (SUM_SPREAD * cols)) blocks."""
    plan, block = fused_source.plan_rows, fused_source.BLOCK
    assert plan(0, 100, 8, 132, 2048) == (0, block)
    assert plan(1000, 32, 8, 132, 2048) == (16, block)    # groups of 4 lanes: 64 rows a block
    assert plan(10 ** 6, 1, 8, 132, 2048) == (-(-10 ** 6 // block), block)    # a lane a row
    assert plan(10, 300, 8, 132, 2048) == (10, 64)       # as few threads as hold the row
    assert plan(10, 5000, 8, 132, 2048) == (10, 640)                         # 625 threads hold it
    assert plan(10 ** 6, 5000, 8, 132, 2048) == (10 ** 6, 640)               # a block a row
    assert plan(3, 40000, 8, 132, 2048) == (3, fused_source.ROW_BLOCK)       # streams
    # the kernel: lane groups, a block holding, streaming, a block holding in every slot
    way = fused_source.strategy
    assert [way(c, 8, b) for c, b in ((1, 256), (256, 256), (257, 64), (500, 64), (512, 64),
                                      (513, 64), (8192, 1024), (8193, 1024))] \
        == [0, 0, 1, 1, 3, 2, 3, 2]
    # a block's thread holds up to 16 where a lane group's holds 8: past 32 * 8
    # columns, a block of as few threads as hold the row 16 each
    assert plan(10, 300, 16, 132, 2048) == (10, 32)
    assert plan(10, 5000, 16, 132, 2048) == (10, 320)
    assert plan(1000, 200, 16, 132, 2048) == (125, block)   # groups of 32 lanes, 8 each
    assert plan(3, 16384, 16, 132, 2048) == (3, fused_source.ROW_BLOCK)
    assert [way(c, 16, fused_source.row_block(c, 16)) for c in (256, 257, 4096, 16384, 16385)] \
        == [0, 1, 3, 3, 2]
    assert [fused_source.lane_held(h) for h in (1, 4, 8, 16)] == [1, 4, 8, 8]
    assert fused_source.held_elements(SOFTMAX, np.float32) == 16
    assert fused_source.held_elements(SOFTMAX, np.float64) == 4
    assert fused_source.held_elements(SOFTMAX, np.float16) == 16
    # x and dy held (g, a row input, is read where used); whole packets
    assert fused_source.held_elements(LAYER_NORM_BACK, np.float32) == 8
    assert fused_source.held_elements(LAYER_NORM_BACK, np.float64) == 2
    assert fused_source.held_elements(LAYER_NORM_BACK, np.float16) == 8
    # two arrays and two summed outputs: 4 within the budget in float32; a
    # half format holds its whole packet even so
    assert fused_source.held_elements(LN_BACKWARD, np.float32) == 4
    assert fused_source.held_elements(LN_BACKWARD, np.float16) == 8
    assert fused_source.held_elements(LN_BACKWARD, dtypes.resolve("bfloat16")) == 8
    # Summed outputs: one block at least (zeros over no rows), and no more
    # blocks than keep their partial rows within SUM_WORKSPACE.
    assert plan(0, 100, 8, 132, 2048, 8) == (1, block)
    assert plan(0, 5000, 8, 132, 2048, 8) == (1, 640)
    assert plan(10 ** 6, 5000, 8, 132, 2048, 8) == (132 * 3, 640)     # the resident blocks
    assert plan(10 ** 6, 5000, 8, 132, 1536, 8) == (132 * 2, 640)    # fewer threads an SM
    # the kernel's occupancy, where given: its registers may allow fewer blocks
    assert plan(10 ** 6, 5000, 8, 132, 2048, 8, 0, 1) == (132, 640)
    assert plan(10 ** 6, 5000, 8, 132, 2048, 8, 0, 5) == (132 * 5, 640)
    assert plan(10 ** 6, 5000, 8, 132, 2048, 0, 0, 1) == (10 ** 6, 640)   # no sums: every row
    # a block per row: the grid's limit bounds the rows (held or streamed)
    assert plan(2 ** 31 - 1, 300, 8, 132, 2048) == (2 ** 31 - 1, 64)
    for cols in (300, 40000):
        with pytest.raises(ValueError, match="at most 2\\*\\*31 - 1 rows"):
            plan(2 ** 31, cols, 8, 132, 2048)
    assert plan(2 ** 31, 300, 8, 132, 2048, 8) == (132 * 32, 64)   # summing blocks stride
    assert plan(2 ** 40, 8, 8, 132, 2048) == (2 ** 31 - 1, block)  # lane groups stride
    assert [fused_source.row_block(c, 8) for c in (1, 256, 257, 5000, 10 ** 6)] == [
        block, block, 64, 640, fused_source.ROW_BLOCK]
    # past a block a multiprocessor, sms * sqrt(rows / (2 cols)) blocks: more
    # rows a block where rows are long against their count
    assert fused_source.SUM_SPREAD == 2
    assert plan(4 * 2 * 5000, 5000, 8, 132, 2048, 8) == (264, 640)   # sqrt(4): 2 an SM
    assert plan(9 * 2 * 5000, 5000, 8, 132, 2048, 8) == (396, 640)   # 3 an SM
    assert plan(4096, 4096, 8, 132, 2048, 8, 0, 4) == (132, 512)     # one an SM
    assert plan(32768, 1000, 4, 132, 2048, 8, 0, 4) == (528, 256)    # the resident ones
    assert plan(100, 5000, 8, 132, 2048, 8) == (100, 640)            # a row each
    assert plan(10 ** 4, 256, 8, 132, 2048, 8, 0, 18) == (round(132 * (10 ** 4 / 512) ** 0.5),
                                                          block)
    # streamed rows: the partial rows within half of a 50 MiB L2 (held rows
    # ignore it), but a block a multiprocessor at least
    assert plan(10 ** 4, 50257, 8, 132, 2048, 8, 50 << 20) == (132, fused_source.ROW_BLOCK)
    assert plan(10 ** 4, 50257, 8, 40, 2048, 8, 50 << 20) == (40, fused_source.ROW_BLOCK)
    assert plan(10 ** 6, 50257, 8, 40, 2048, 8, 50 << 20) == (
        (25 << 20) // (8 * 50257), fused_source.ROW_BLOCK)
    assert plan(10 ** 6, 5000, 8, 132, 2048, 8, 50 << 20) == (132 * 3, 640)
    assert plan(10 ** 4, 10 ** 6, 8, 132, 2048, 8) == (
        fused_source.SUM_WORKSPACE // (8 * 10 ** 6), fused_source.ROW_BLOCK)
    assert [fused_source.sum_groups(g) for g in (1, 2, 3, 4, 5, 1056)] == [
        (1, 2), (2, 2), (2, 3), (2, 3), (3, 3), (33, 33)]
    assert fused_source.sum_bytes(LN_BACKWARD, np.float32) == 8
    assert fused_source.sum_bytes(LN_BACKWARD, np.float64) == 16
    assert fused_source.sum_bytes(LN_BACKWARD, dtypes.resolve("bf16")) == 8
    assert fused_source.sum_bytes(SOFTMAX, np.float32) == 0
    # a block holding rows in every slot, with summed outputs, takes trip
    # rows a trip: a block per trip at most; other blocks take one
    assert plan(100, 5120, 8, 132, 2048, 8, 0, None, 2) == (50, 640)
    assert plan(101, 5120, 8, 132, 2048, 8, 0, None, 2) == (51, 640)
    assert plan(100, 5000, 8, 132, 2048, 8, 0, None, 2) == (100, 640)    # a slot past the row
    assert plan(100, 5120, 8, 132, 2048, 0, 0, None, 2) == (100, 640)    # no sums: a row each
    assert plan(100, 40000, 8, 132, 2048, 8, 0, None, 2) == (100, fused_source.ROW_BLOCK)
    # a block streaming rows with summed outputs takes batch rows a batch: a
    # block per batch at most (fused_source.stream_batch)
    assert plan(100, 40000, 8, 132, 2048, 8, 0, None, 2, None, 3) == (34, fused_source.ROW_BLOCK)
    assert plan(100, 5120, 8, 132, 2048, 8, 0, None, 1, None, 3) == (100, 640)   # held rows
    assert plan(100, 40000, 8, 132, 2048, 0, 0, None, 1, None, 3) == (
        100, fused_source.ROW_BLOCK)   # no sums: a row each
    assert plan(10 ** 6, 5120, 8, 132, 2048, 8, 0, None, 2) == (132 * 3, 640)
    assert fused_source.trip_rows(SOFTMAX, np.float32) == 1                  # no sums
    assert fused_source.trip_rows(BIAS_BACKWARD, np.float32) == 2            # 8 values a row
    assert fused_source.trip_rows(LN_BACKWARD, np.float64) == 2
    assert fused_source.trip_rows(LN_BACKWARD, dtypes.resolve("bf16")) == 1  # a half: one


def test_generated_row_source():
    src = fused_source.kernel_source(CROSS_ENTROPY, np.float32, fused_source.ROW_BLOCK)
    name = fused_source.kernel_name(CROSS_ENTROPY, np.float32)
    for i, way in enumerate(fused_source.STRATEGIES):   # a kernel per strategy
        assert f'__launch_bounds__(1024) {name}_{way}(' in src
        assert f"    {name}_body<{i}>(in_z, in_t, sp_inv_n, sv_inv_n, out_loss, out_dz, rows, " \
               "cols);" in src
    assert f"template <int STRATEGY> __device__ __forceinline__ void {name}_body(" in src
    assert ("const T* in_z, const T* in_t, const T* sp_inv_n, T sv_inv_n, T* out_loss, "
            "T* out_dz, long long rows, long long cols") in src
    assert fused_source.kernel_format(CROSS_ENTROPY, np.float32) == "PPPfPPqq"
    assert "const T v_t = live ? in_t[r] : T(0);" in src
    # the first level's two reductions share one barrier; each term is
    # pinned and folded only on the row's own slots (a block row's every
    # slot runs the element function)
    assert "s.reduce_pair(rd0, fx::Max{}, rd2, fx::Sum{});" in src
    assert "const T k0 = s.keep(v_z);" in src and "rd0 = ok ? fx::Max{}(rd0, k0) : rd0;" in src
    assert "rd1 = s.reduce(rd1, fx::Sum{});" in src
    assert "const T j_col = T(j);" in src
    assert "out_loss[r] = t4_loss;" in src and "fx::rows_loop<T, R, In, STRATEGY>(" in src
    # a per-row value that only per-row outputs need: the leader computes it,
    # after the outputs' pass; the max, which the outputs need, every thread
    lead = src.index("if (live && s.leader()) {")
    assert src.index("const T t4_loss = ") > lead and src.index("const T t0_m = rd0;") < lead
    half = fused_source.kernel_source(LAYER_NORM, np.float16, fused_source.ROW_BLOCK)
    assert "using C = float;" in half and "rd0 = s.reduce(rd0, fx::Sum{});" in half
    assert "rd0 = rd0 / C(cols);" in half and "const C v_g = ok ? ld(in_g[j]) : C(0);" in half
    assert "out_mu[r] = st<T>(t0_mu);" in half and "v.v_x = ld(in_x[r * cols + j]);" in half
    src = fused_source.kernel_source(LN_BACKWARD, np.float32, fused_source.ROW_BLOCK)
    assert ("T* out_dx, T* out_dg, T* out_db, long long rows, long long cols, "
            "C* sum_partials, unsigned int* sum_counters, long long sum_group)") in src
    assert fused_source.kernel_format(LN_BACKWARD, np.float32) == "PPPPPPPPqqPPq"
    assert "struct Values { T dx; T sums[2]; };" in src
    assert "o.sums[0] = t3_dg;" in src and "o.sums[1] = t4_db;" in src
    # two rows a trip in the full kernel: 4 elements a thread of three held
    # arrays (dy, x, g), 12 values a row within the trip's 24
    assert fused_source.trip_rows(LN_BACKWARD, np.float32) == 2
    assert "fx::rows_loop_sums<T, R, In, 2, STRATEGY, STRATEGY == 3 ? 2 : 1>(" in src
    assert "fx::rows_loop<" not in src
    assert "rows, cols, aligned, load, load_packets, prefetch, row," in src
    # packets counted from the arrays' starts, as the streamed rows' aligned
    # middles need; every array's alignment decides, not the row length
    assert "const auto load_packets = [&](const long long q, const long long c) {" in src
    assert "const Packet<T> p0 = load_packet(in_dy, q);" in src
    # its row input g, one over 4 elements a thread, is held with them: by
    # packets of the row's columns, never read at use, never prefetched
    assert fused_source.holds_row_inputs(LN_BACKWARD, np.float32)
    assert "struct In { T v_dy; T v_x; T v_g; };" in src and "v.v_g = in_g[j];" in src
    assert "const Packet<T> p2 = load_row_packet(in_g, c);" in src
    assert "const T v_g = e.v_g;" in src and "in_g[j] :" not in src
    assert "const bool aligned = is_aligned16(in_dy) && is_aligned16(in_x) && " \
        "is_aligned16(in_g) && is_aligned16(out_dx);" in src
    assert "fx::prefetch_l2(in_dy + r * cols + j);" in src and "prefetch_l2(in_g" not in src
    # two row inputs over 16 elements a thread would take 32 registers: read at use
    assert not fused_source.holds_row_inputs(LAYER_NORM, np.float32)
    half = fused_source.kernel_source(ROW_TOTALS, np.float16, fused_source.ROW_BLOCK)
    assert "if (i == 1) out_n[j] = st<T>(v);" in half and "struct Values { C sums[2]; };" in half


NVCC = shutil.which("nvcc")
COMPILED = [(op, dt) for op in (SOFTMAX, LOG_SOFTMAX, CROSS_ENTROPY, LAYER_NORM, LAYER_NORM_BACK,
                                RMS_NORM) for dt in ("f32", "f64")]
COMPILED += [(op, dt) for op in (SOFTMAX, CROSS_ENTROPY, LAYER_NORM_BACK) for dt in ("bf16", "f16")]
COMPILED += [(op, dt) for op in (LN_BACKWARD, RMS_BACKWARD, BIAS_BACKWARD, ROW_TOTALS)
             for dt in ("f32", "f64", "bf16", "f16")]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("op, fmt", COMPILED, ids=[f"{op.name}-{dt}" for op, dt in COMPILED])
def test_generated_row_source_compiles(op, fmt, tmp_path):
    """As tests/test_kernels_compile.py for the .cu files: nvcc accepts the
    generated row kernel, and a float kernel does no double arithmetic."""
    dtype = dtypes.resolve(fmt)
    src = tmp_path / "fused.cu"
    src.write_text(fused_source.kernel_source(op, dtype, fused_source.ROW_BLOCK))
    kernels = fused_source.__file__.rsplit("/", 1)[0] + "/kernels"
    ptx = tmp_path / "fused.ptx"
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-I", kernels, "-ptx", "-o", str(ptx), str(src)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"nvcc failed:\n{result.stderr}\n{src.read_text()}"
    text = ptx.read_text()
    for way in fused_source.STRATEGIES:
        assert f".entry {fused_source.kernel_name(op, dtype)}_{way}(" in text
    if fmt != "f64":
        assert ".f64" not in text, "the float kernel computes in double somewhere"


def test_summed_half_rows_take_two_packets_a_lane():
    """A row kernel with summed outputs in a half format holds two packets a
    lane (LANE_SUMMED_HALF): rows of up to 512 columns go to lane groups, a
    warp a row and 8 rows a block of BLOCK threads, in a lane kernel bound
    by BLOCK (a block per row of 64 threads before); float32, and ops
    without sums, keep lane_held(held)."""
    bf16 = dtypes.resolve("bfloat16")
    lane = fused_source.lane_elements(LN_BACKWARD, bf16)
    assert lane == fused_source.LANE_SUMMED_HALF == 16
    assert fused_source.lane_elements(LN_BACKWARD, np.float16) == 16
    assert fused_source.lane_elements(LN_BACKWARD, np.float32) == 4
    assert fused_source.lane_elements(SOFTMAX, bf16) == fused_source.LANE_HELD_MOST
    held, block = fused_source.held_elements(LN_BACKWARD, bf16), fused_source.BLOCK
    assert fused_source.row_block(512, held, lane) == block
    assert fused_source.strategy(512, held, block, lane) == 0
    assert fused_source.strategy(513, held, fused_source.row_block(513, held, lane), lane) == 1
    # 8192 rows of 512, 2 resident blocks an SM (128 registers): the resident ones
    assert fused_source.plan_rows(8192, 512, held, 132, 2048, 8, 0, 2, 1, lane) == (264, block)
    # the lane kernel's bound is BLOCK's, the others' the longest row's block
    name = fused_source.kernel_name(LN_BACKWARD, bf16)
    text = fused_source.row_kernel_source(LN_BACKWARD, bf16, fused_source.ROW_BLOCK)
    assert f"__launch_bounds__({block}) {name}_lane(" in text
    assert f"__launch_bounds__({fused_source.ROW_BLOCK}) {name}_block(" in text
    assert "constexpr int R = STRATEGY == 0 ? 16 : 8;" in text
    name = fused_source.kernel_name(LN_BACKWARD, np.float32)
    text = fused_source.row_kernel_source(LN_BACKWARD, np.float32, fused_source.ROW_BLOCK)
    assert f"__launch_bounds__({fused_source.ROW_BLOCK}) {name}_lane(" in text
