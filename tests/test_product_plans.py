"""products.plan_dot, PyCudaHandler's decisions about a product, on a CPU.

Each plan is run here on NumPy buffers by an independent model of what it
names: small_gemm as its source describes it (row-major, flags per operand)
and cuBLAS's column-major GEMM as cuBLAS defines it (leading dimensions,
operands by name, strided batches), and the result is compared with
``op(a) @ op(b) + beta * out``.  So a wrong swap, leading dimension or
stride fails whatever the planner's own arithmetic.  The choice of kernel
is checked against the rule itself: at most 4096 output elements and an
inner dimension of at most 128 on small_gemm, cuBLAS beyond.
"""
import numpy as np
import pytest

from handlers.cuda import products

BLOCK = 256
SMALL_OUT, SMALL_K = 4096, 128


def _shapes(batch_a, batch_b, m, n, k, ta, tb):
    """a, b and out shapes of op(a) (m, k) @ op(b) (k, n), each operand with
    a batch axis of that size, or none (None)."""
    a = (k, m) if ta else (m, k)
    b = (n, k) if tb else (k, n)
    batch = batch_a or batch_b
    return ((batch_a,) + a if batch_a else a, (batch_b,) + b if batch_b else b,
            (batch, m, n) if batch else (m, n))


def _want(a, b, c, ta, tb, beta):
    def op(x, t):
        return np.swapaxes(x, -1, -2) if t else x
    return op(a, ta) @ op(b, tb) + beta * c


def _column_major(buf, offset, rows, cols, ld):
    """The rows x cols column-major matrix at buf[offset:] with leading
    dimension ld (IndexError past the buffer)."""
    i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
    return offset + i + j * ld


def _cublas(call, operands, out, beta, strides=(0, 0, 0), batch=1, f32=False):
    """cublas<t>gemm(StridedBatched) on flat buffers: C = op(A) op(B) + beta C,
    column-major; A and B are named by their index in ``operands``."""
    ta, tb, m, n, k, first, lda, second, ldb, ldc = call
    A, B = operands[first], operands[second]
    for i in range(batch):
        ia = _column_major(A, i * strides[0], k if ta else m, m if ta else k, lda)
        ib = _column_major(B, i * strides[1], n if tb else k, k if tb else n, ldb)
        ic = _column_major(out, i * strides[2], m, n, ldc)
        op_a = A[ia].T if ta else A[ia]
        op_b = B[ib].T if tb else B[ib]
        # beta 0 (and a float32 product alone): C is written, never read
        out[ic] = op_a @ op_b if f32 or beta == 0.0 else op_a @ op_b + beta * out[ic]


def _small_gemm(args, a, b, out):
    """kernels/small_gemm.cu on flat buffers: row-major op(a) (m, k) stored
    (m, k) or (k, m), op(b) (k, n) stored (k, n) or (n, k)."""
    m, n, k, ta, tb, accumulate = args
    op_a = a[:m * k].reshape((k, m)).T if ta else a[:m * k].reshape((m, k))
    op_b = b[:k * n].reshape((n, k)).T if tb else b[:k * n].reshape((k, n))
    out[:m * n] = (op_a @ op_b).ravel() + (out[:m * n] if accumulate else 0.0)


def _run(plan, a, b, out, beta):
    """Run ``plan`` on flat buffers as products.run_dot issues it."""
    kind = plan.kind
    if kind == "small":
        assert plan.grid * BLOCK >= 1
        _small_gemm(plan.small, a, b, out)
    elif kind == "gemm":
        _cublas(plan.gemm, (a, b), out, beta)
    elif kind in ("gemm_f32_add", "batched_f32_add"):
        tmp = np.zeros_like(out)
        batched = kind == "batched_f32_add"
        _cublas(plan.gemm, (a, b), tmp, 0.0, *((plan.batch[:3], plan.batch[3]) if batched
                                               else ()), f32=True)
        out += tmp
    elif kind == "batched":
        _cublas(plan.gemm, (a, b), out, beta, plan.batch[:3], plan.batch[3])
    elif kind == "tall":
        _run(plan.inner, a, b, out, beta)
    elif kind == "zero":
        out[:] = 0.0
    else:
        assert kind == "nothing"


def _run_record(record, a, b, out):
    """Run an OneCall.dot record on flat buffers as _one_call.c does."""
    if record is True:
        return
    if record[0] == "small":
        _, grid, block, *args = record
        assert block == BLOCK and grid == -(-args[0] * args[1] // BLOCK)
        _small_gemm(args, a, b, out)
    else:
        assert record[0] == "gemm"
        _cublas(record[1:11], (a, b), out, record[11])


CASES = [(ba, bb, m, n, k) for ba, bb in ((0, 0), (3, 0), (0, 3), (3, 3))
         for m, n, k in ((1, 7, 3), (16, 16, 16), (64, 64, 128), (64, 65, 2), (5, 4, 129),
                         (70, 70, 3), (0, 4, 5), (4, 0, 5), (4, 5, 0))]


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("beta", [0.0, 1.0])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("ba,bb,m,n,k", CASES)
def test_plan_computes_the_product(ba, bb, m, n, k, ta, tb, beta, half):
    a_shape, b_shape, out_shape = _shapes(ba, bb, m, n, k, ta, tb)
    plan = products.plan_dot(a_shape, b_shape, out_shape, ta, tb, beta, half, True)
    rng = np.random.default_rng(m * 100 + n * 10 + k + 1000 * ba + 3000 * bb + 2 * ta + tb)
    a, b, c = (rng.integers(-4, 5, s).astype(np.float64) for s in (a_shape, b_shape, out_shape))
    if beta == 0.0:
        c[...] = np.nan   # dot_mm never reads out
    out = c.ravel().copy()
    _run(plan, a.ravel().copy(), b.ravel().copy(), out, beta)
    np.testing.assert_array_equal(out.reshape(out_shape), _want(a, b, c if beta else 0, ta, tb,
                                                                 beta))
    # OneCall.dot's record, where there is one, computes the same.
    if plan.launch is not None:
        rec = c.ravel().copy()
        _run_record(plan.launch, a.ravel().copy(), b.ravel().copy(), rec)
        if plan.kind != "nothing":
            np.testing.assert_array_equal(rec, out)


def _kind(ba, bb, m, n, k, ta, beta, half):
    """The rule: which path a product takes (independent of the planner)."""
    batch = ba or bb
    if not m or not n:
        return "nothing"
    if not k:
        return "zero" if beta == 0.0 else "nothing"
    if batch and not bb and not ta:     # a stack times one shared, untransposed-a b
        m, batch = batch * m, 0
    if m * n <= SMALL_OUT and k <= SMALL_K and not batch:
        return "small"
    return ("batched" if batch else "gemm") + ("_f32_add" if beta and half else "")


@pytest.mark.parametrize("m,n,k", [(64, 64, 128), (64, 64, 129), (64, 65, 128), (1, 4096, 1),
                                   (1, 4097, 1), (4096, 1, 128), (2, 2049, 1), (3, 4, 0),
                                   (0, 4, 5)])
@pytest.mark.parametrize("batched", [None, "a", "b", "both"])
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("beta,half", [(0.0, False), (1.0, False), (0.0, True), (1.0, True)])
def test_the_kernel_chosen(m, n, k, batched, ta, beta, half):
    ba = 2 if batched in ("a", "both") else 0
    bb = 2 if batched in ("b", "both") else 0
    shapes = _shapes(ba, bb, m, n, k, ta, False)
    plan = products.plan_dot(*shapes, ta, False, beta, half, True)
    want = _kind(ba, bb, m, n, k, ta, beta, half)
    got = plan.inner.kind if plan.kind == "tall" else plan.kind
    assert got == want
    assert (plan.kind == "tall") == (bool(ba) and not bb and not ta and want != "nothing"
                                     and want != "zero")


def test_records_for_the_c_path():
    """True: nothing to do; a small or gemm record; None where the Python
    path must run it: a zero fill, a half format's float32 product then add,
    a batched product, or no GEMM symbol for C to call."""
    plan = products.plan_dot
    assert plan((4, 0), (0, 5), (4, 5), False, False, 1.0, False, True).launch is True
    assert plan((0, 3), (3, 5), (0, 5), False, False, 0.0, False, True).launch is True
    assert plan((4, 0), (0, 5), (4, 5), False, False, 0.0, False, True).launch is None
    small = plan((16, 8), (16, 8), (16, 16), False, True, 1.0, True, False)
    assert small.launch == ("small", 1, BLOCK, 16, 16, 8, 0, 1, 1)   # served, symbol or not
    assert small.grid == 1
    big = ((100, 80), (80, 96), (100, 96), False, False)
    assert plan(*big, 0.0, False, True).launch[0] == "gemm"
    assert plan(*big, 0.0, False, True).launch[-1] == 0.0
    assert plan(*big, 1.0, False, True).launch[-1] == 1.0
    assert plan(*big, 0.0, True, True).launch[0] == "gemm"          # a half dot_mm: served
    assert plan(*big, 1.0, True, True).launch is None               # a half dot_add_mm
    assert plan(*big, 0.0, False, False).launch is None             # no symbol
    assert plan((2, 100, 80), (2, 80, 96), (2, 100, 96), False, False, 0.0, False,
                True).launch is None
    tall = plan((2, 50, 80), (80, 96), (2, 50, 96), False, False, 0.0, False, True)
    assert tall.kind == "tall" and tall.launch == tall.inner.launch
    assert tall.inner.launch[:6] == ("gemm", 0, 0, 96, 100, 80)
    assert plan((2, 8, 8), (8, 8), (2, 8, 8), False, False, 0.0, False, True).launch[:2] == \
        ("small", 1)


def test_the_rows_and_leading_dimensions_for_cublas():
    """Row-major out = op(a) op(b) is column-major out^T = op(b)^T op(a)^T:
    b first (A), a second (B), each with its own flag and row length."""
    p = products.plan_dot((300, 100), (300, 200), (100, 200), True, False, 0.0, False, True)
    assert p.gemm == (0, 1, 200, 100, 300, 1, 200, 0, 100, 200)
    p = products.plan_dot((2, 100, 300), (200, 300), (2, 100, 200), False, True, 0.0, False,
                          True)
    assert p.kind == "tall" and p.inner.gemm == (1, 0, 200, 200, 300, 1, 300, 0, 300, 200)
    p = products.plan_dot((2, 300, 100), (200, 300), (2, 100, 200), True, True, 0.0, False,
                          True)
    assert p.kind == "batched" and p.gemm == (1, 1, 200, 100, 300, 1, 300, 0, 100, 200)
    assert p.batch == (0, 300 * 100, 100 * 200, 2)   # b shared: stride 0


@pytest.mark.parametrize("shapes,name", [
    (((2**31, 3), (3, 200), (2**31, 200)), "m = 2147483648"),
    (((3, 2**31), (2**31, 200), (3, 200)), "k = 2147483648"),
    (((200, 3), (3, 2**31), (200, 2**31)), "n = 2147483648"),
    (((2**31, 2, 3), (2**31, 3, 200), (2**31, 2, 200)), "batch = 2147483648"),
    (((2**30, 2, 3), (3, 200), (2**30, 2, 200)), "m = 2147483648"),   # the tall fold
])
@pytest.mark.parametrize("beta,op", [(0.0, "dot_mm"), (1.0, "dot_add_mm")])
def test_dimensions_past_32_bits_raise(shapes, name, beta, op):
    """cuBLAS takes 32-bit ints: a larger dimension raises, naming the op and
    the dimension, instead of reaching the GEMM truncated."""
    with pytest.raises(ValueError, match=f"{op}: {name}"):
        products.plan_dot(*shapes, False, False, beta, False, True)


def test_dimensions_that_fit_or_need_no_cublas():
    fits = 2**31 - 1
    p = products.plan_dot((fits, 3), (3, 200), (fits, 200), False, False, 0.0, False, True)
    assert p.kind == "gemm" and p.gemm[3] == fits
    big = 2**31
    # nothing to do, or a zero fill: no GEMM, so no limit
    assert products.plan_dot((big, 3), (3, 0), (big, 0), False, False, 0.0, False,
                             True).kind == "nothing"
    assert products.plan_dot((big, 0), (0, 2), (big, 2), False, False, 0.0, False,
                             True).kind == "zero"


@pytest.mark.parametrize("shapes,flags", [
    (((4, 5), (6, 7), (4, 7)), (False, False)),
    (((4, 5), (5, 7), (4, 8)), (False, False)),
    (((4, 5), (5, 7), (4, 7)), (True, False)),
    (((4, 5), (5, 7), (2, 4, 7)), (False, False)),
    (((4,), (4, 7), (7,)), (False, False)),
])
def test_shapes_that_fail_the_rule_get_no_plan(shapes, flags):
    with pytest.raises(ValueError, match="dot_mm"):
        products.plan_dot(*shapes, *flags, 0.0, False, True)


def test_the_key_is_the_calls_shapes_flags_and_beta():
    assert products.dot_key((2, 3), (3, 4), (2, 4), False, True, 1.0) == \
        ((2, 3), (3, 4), (2, 4), False, True, 1.0)
