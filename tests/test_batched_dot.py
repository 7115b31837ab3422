"""dot_mm / dot_add_mm on batches: out (B, m, n) from a and b each (B, ., .)
or 2-D (shared by the batch), against float64 NumPy on fresh random data.

On PyCudaHandler a 3-D product is one strided-batched cuBLAS GEMM (a shared
operand has stride 0), or one plain GEMM when a stack of untransposed a meets
a shared b; the C one-call path declines 3-D arrays.
"""
import numpy as np
import pytest

from helpers import assert_close, assert_unchanged, poisoned, rand_input

#: these ops run on the float16 and bfloat16 NumpyHandler too (conftest)
HALF_FORMATS = True

# (B, m, k, n): B = 1, odd sizes, both sides of the small-product limits
BATCHED = [(1, 1, 1, 1), (1, 7, 13, 5), (3, 5, 9, 7), (4, 16, 16, 16), (2, 65, 129, 63),
           (5, 1, 9, 4), (3, 64, 8, 65)]
# which operands are 3-D
LAYOUTS = ["both", "a-shared", "b-shared"]


def _operand(handler, rng, batch, rows, cols, trans, shared):
    shape = (cols, rows) if trans else (rows, cols)
    x, r = rand_input(handler, shape if shared else (batch,) + shape, rng)
    r_op = np.swapaxes(r, -1, -2) if trans else r
    return x, r, r_op


@pytest.mark.parametrize("bmkn", BATCHED, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("transb", [False, True], ids=["b", "bT"])
@pytest.mark.parametrize("transa", [False, True], ids=["a", "aT"])
@pytest.mark.parametrize("op", ["dot_mm", "dot_add_mm"])
def test_batched_dot(handler, rng, op, transa, transb, layout, bmkn):
    batch, m, k, n = bmkn
    a, ra, ra_op = _operand(handler, rng, batch, m, k, transa, layout == "a-shared")
    b, rb, rb_op = _operand(handler, rng, batch, k, n, transb, layout == "b-shared")
    product = np.matmul(ra_op, rb_op)
    assert product.shape == (batch, m, n)
    if op == "dot_mm":
        out, expected = poisoned(handler, (batch, m, n)), product
    else:
        out, r_out = rand_input(handler, (batch, m, n), rng)
        expected = r_out + product
    assert getattr(handler, op)(a, b, out, transa=transa, transb=transb) is None
    assert_close(handler, out, expected, n=k + 1)
    assert_unchanged(handler, a, ra, "a")
    assert_unchanged(handler, b, rb, "b")


def test_batched_dot_empty_inner_dimension(handler, rng):
    a, _ = rand_input(handler, (2, 3, 1), rng)
    a = handler.zeros((2, 3, 0))
    b = handler.zeros((2, 0, 4))
    out = poisoned(handler, (2, 3, 4))
    handler.dot_mm(a, b, out)
    assert_close(handler, out, np.zeros((2, 3, 4)), rtol=0, atol=0)
    acc, r_acc = rand_input(handler, (2, 3, 4), rng)
    handler.dot_add_mm(a, b, acc)
    assert_close(handler, acc, r_acc, rtol=0, atol=0)


BAD = [  # (a, b, out, transa, transb): each raises ValueError naming the op
    ((2, 3, 4), (2, 4, 5), (2, 3, 6), False, False),   # out's n
    ((2, 3, 4), (2, 5, 5), (2, 3, 5), False, False),   # k differs
    ((2, 3, 4), (3, 4, 5), (2, 3, 5), False, False),   # b's batch
    ((3, 3, 4), (2, 4, 5), (2, 3, 5), False, False),   # a's batch
    ((2, 3, 4), (2, 4, 5), (3, 3, 5), False, False),   # out's batch
    ((2, 3, 4), (2, 4, 5), (2, 3, 5), True, False),    # transa makes k 3
    ((2, 3, 4), (2, 4, 5), (2, 3, 5), False, True),    # transb makes k 5
    ((2, 3, 4), (2, 4, 5), (6, 5), False, False),      # 3-D inputs, 2-D out
    ((3, 4), (4, 5), (1, 3, 5), False, False),         # no 3-D operand for a 3-D out
    ((2, 3, 4), (4, 5), (2, 3, 5, 1), False, False),   # 4-D out
    ((1, 2, 3, 4), (4, 5), (2, 3, 5), False, False),   # 4-D a
    ((2, 3, 4), (20,), (2, 3, 5), False, False),       # 1-D b
]


@pytest.mark.parametrize("case", BAD, ids=[str(i) for i in range(len(BAD))])
@pytest.mark.parametrize("op", ["dot_mm", "dot_add_mm"])
def test_batched_dot_bad_shapes(handler, rng, op, case):
    sa, sb, so, ta, tb = case
    a, _ = rand_input(handler, sa, rng)
    b, _ = rand_input(handler, sb, rng)
    out, r_out = rand_input(handler, so, rng)
    with pytest.raises(ValueError, match=op):
        getattr(handler, op)(a, b, out, transa=ta, transb=tb)
    assert_unchanged(handler, out, r_out, "out")


def test_batched_dot_out_must_not_overlap_inputs(handler, rng):
    a, _ = rand_input(handler, (2, 3, 3), rng)
    b, _ = rand_input(handler, (3, 3), rng)
    with pytest.raises(ValueError, match="overlap"):
        handler.dot_mm(a, b, a)
