"""PyCudaHandler's matrix products (``dot_mm``, ``dot_add_mm``): where each one runs.

``plan_dot`` makes every decision about a product once, from its shapes,
transpose flags, beta and two facts of the format, and returns a
:class:`DotPlan`; it needs no handler, so tests/test_product_plans.py checks it
on a CPU.  ``dot`` (PyCudaHandler's ``_dot`` hook) plans each combination once,
runs the plan, and stores the plan's :attr:`DotPlan.launch` record in
``h._dot_launches`` under :func:`dot_key`, where the one-call path
(``OneCall.dot`` in ``_one_call.c``) looks it up: the C path checks the arrays
and launches the record, and declines a combination it finds no record for.

Products small enough that cuBLAS's own host work would dominate (at most
:data:`SMALL_OUT` output elements, inner dimension at most :data:`SMALL_K`)
run on ``kernels/small_gemm.cu``; all others go to cuBLAS through the
handler's binding.
"""
from types import SimpleNamespace
from typing import NamedTuple

from .. import shape_rules
from ..base import Handler
from ..checks import fail_value
from . import lt
from .context import enter as _enter
from .launch import BLOCK

#: Products with at most SMALL_OUT output elements and inner dimension at most
#: SMALL_K run on kernels/small_gemm.cu instead of cuBLAS, whose host work per
#: call (~6 us on an H200 host) is more than such a product costs: a 16x16
#: dot_mm then takes about one kernel launch.  Larger products use cuBLAS.
SMALL_OUT, SMALL_K = 4096, 128
#: cuBLAS takes m, n, k, the leading dimensions and the batch count as 32-bit ints.
INT_MAX = 2**31 - 1


class DotPlan(NamedTuple):
    """How one product runs.  ``kind`` is one of

    * ``"nothing"``: out is empty, or k is 0 and beta is not (out unchanged);
    * ``"zero"``: k is 0 and beta is 0: out is filled with zeros;
    * ``"small"``: kernels/small_gemm.cu, ``grid`` blocks of BLOCK threads,
      arguments ``(a, b, out, *small)``;
    * ``"gemm"``: one cuBLAS GEMM, ``gemm``;
    * ``"gemm_f32_add"``: a half format with beta != 0: ``gemm`` writes the
      product in float32 to the workspace, then ``add_compute`` adds it to out
      (one rounding; cuBLAS's own beta = 1 rounds twice);
    * ``"batched"``, ``"batched_f32_add"``: the same with cuBLAS's
      strided-batched GEMM, ``gemm`` and ``batch``;
    * ``"tall"``: a 3-D a (not transposed) times a 2-D b is one 2-D product
      of (batch * m, k) by op(b) on the same memory, ``inner``.
    """

    kind: str
    #: small: blocks of BLOCK threads
    grid: int = 0
    #: small: small_gemm's (m, n, k, transa, transb, accumulate)
    small: tuple = ()
    #: the gemm kinds: the column-major cuBLAS call (transa, transb, m, n, k,
    #: A, lda, B, ldb, ldc), A and B naming an operand: 0 for a, 1 for b
    gemm: tuple = ()
    #: the batched kinds: (strideA, strideB, strideC, batch count), strides in elements
    batch: tuple = ()
    #: tall: the plan of the 2-D product
    inner: object = None
    #: what OneCall.dot runs for this combination: True (nothing to do),
    #: ("small", grid, block, m, n, k, transa, transb, accumulate),
    #: ("gemm", transa, transb, m, n, k, A, lda, B, ldb, ldc, beta), or None
    #: (the Python path runs it)
    launch: object = None


_NOTHING = DotPlan("nothing", launch=True)
_ZERO = DotPlan("zero")


def dot_key(a_shape, b_shape, out_shape, transa, transb, beta):
    """The key of a product's plan in ``h._dot_plans`` and of its record in
    ``h._dot_launches``; OneCall.dot builds the same tuple from the call."""
    return (a_shape, b_shape, out_shape, transa, transb, beta)


def _fits(op, **dims):
    """ValueError unless every dimension fits cuBLAS's 32-bit ints."""
    for name, value in dims.items():
        if value > INT_MAX:
            fail_value(op, f"{name} = {value} is past cuBLAS's 32-bit limit (2**31 - 1)")


def plan_dot(a_shape, b_shape, out_shape, transa, transb, beta, half, c_gemm):
    """The :class:`DotPlan` of ``out = op(a) op(b) + beta out`` (beta 0.0 for
    dot_mm, 1.0 for dot_add_mm).  ``half``: the format is bfloat16 or
    float16; ``c_gemm``: the C path can call the binding's GEMM
    (``gemm.c_symbol`` is known).  ValueError for shapes that fail the op's
    shape rule (``shape_rules.dot``: so a stored record always belongs to a
    valid product) and if cuBLAS would get a dimension past 32 bits."""
    op = "dot_mm" if beta == 0.0 else "dot_add_mm"
    shape_rules.dot(op)(None, *(SimpleNamespace(shape=s) for s in (a_shape, b_shape, out_shape)),
                        transa, transb)
    return _plan(op, a_shape, b_shape, out_shape, transa, transb, beta, half, c_gemm)


def _plan(op, a_shape, b_shape, out_shape, transa, transb, beta, half, c_gemm):
    """plan_dot for shapes that passed the shape rule."""
    if len(out_shape) == 3:
        return _plan_batched(op, a_shape, b_shape, out_shape, transa, transb, beta, half,
                             c_gemm)
    m, n = out_shape
    k = a_shape[0] if transa else a_shape[1]
    if not m or not n:
        return _NOTHING
    if not k:
        return _ZERO if beta == 0.0 else _NOTHING
    if m * n <= SMALL_OUT and k <= SMALL_K:
        grid = -(-m * n // BLOCK)
        small = (m, n, k, int(transa), int(transb), int(beta != 0.0))
        return DotPlan("small", grid=grid, small=small, launch=("small", grid, BLOCK) + small)
    _fits(op, m=m, n=n, k=k)
    # Row-major out = op(a) op(b) is column-major out^T = op(b)^T op(a)^T:
    # swap the operands, keep each one's transpose flag.
    gemm = (int(transb), int(transa), n, m, k, 1, b_shape[1], 0, a_shape[1], n)
    if beta != 0.0 and half:
        return DotPlan("gemm_f32_add", gemm=gemm)
    return DotPlan("gemm", gemm=gemm, launch=(("gemm",) + gemm + (beta,)) if c_gemm else None)


def _plan_batched(op, a_shape, b_shape, out_shape, transa, transb, beta, half, c_gemm):
    """plan_dot for out (batch, m, n): a and b are 3-D or one of them is 2-D,
    shared by the whole batch."""
    batch, m, n = out_shape
    k = a_shape[-2] if transa else a_shape[-1]
    if not batch or not m or not n:
        return _NOTHING
    if not k:
        return _ZERO if beta == 0.0 else _NOTHING
    if len(b_shape) == 2 and not transa:
        # A stack of untransposed a times one shared b is one tall product,
        # (batch * m, k) @ op(b), in C order: the 2-D plan (and its choice of
        # kernel) on the same memory.
        inner = _plan(op, (batch * m, k), b_shape, (batch * m, n), False, transb, beta, half,
                      c_gemm)
        return DotPlan("tall", inner=inner, launch=inner.launch)
    _fits(op, batch=batch, m=m, n=n, k=k)
    # As in plan_dot, each row-major product is the column-major op(b_i)^T
    # op(a_i)^T: operands swapped, flags kept.  Matrix i of an operand starts
    # stride * i elements in; a 2-D operand has stride 0, the same matrix for
    # every i.
    gemm = (int(transb), int(transa), n, m, k, 1, b_shape[-1], 0, a_shape[-1], n)
    strides = (k * n if len(b_shape) == 3 else 0, m * k if len(a_shape) == 3 else 0, m * n,
               batch)
    kind = "batched_f32_add" if beta != 0.0 and half else "batched"
    return DotPlan(kind, gemm=gemm, batch=strides)


# ------------------------------------------------------------------ runners
def dot(h, a, b, out, transa, transb, beta):
    """PyCudaHandler's ``_dot`` hook: run this combination's plan (made and
    stored on the first call, its record for OneCall.dot with it)."""
    _enter()
    key = dot_key(a.shape, b.shape, out.shape, transa, transb, beta)
    plan = h._dot_plans.get(key)
    if plan is None:
        plan = plan_dot(a.shape, b.shape, out.shape, transa, transb, beta, h._half,
                        bool(h._gemms[0].c_symbol))
        h._dot_plans[key] = plan
        # Written once per key and never changed: OneCall.dot keeps the
        # records it has read, and sees a new one only under a new key.
        h._dot_launches[key] = plan.launch
    run_dot(h, plan, a, b, out, beta)


def run_dot(h, plan, a, b, out, beta):
    """Issue ``plan`` on ``h``'s stream, only through its launchers (``h._run``,
    ``h._launch``, ``h._gemm``, ``h._fill``)."""
    kind = plan.kind
    if kind == "small":
        h._run(h._k["small_gemm"], plan.grid, a.gpudata, b.gpudata, out.gpudata, *plan.small)
    elif kind == "gemm":
        ta, tb, m, n, k, first, lda, second, ldb, ldc = plan.gemm
        operands = (a, b)
        h._gemm(ta, tb, m, n, k, 1.0, operands[first].gpudata, lda, operands[second].gpudata,
                ldb, beta, out.gpudata, ldc)
    elif kind == "gemm_f32_add":
        ta, tb, m, n, k, first, lda, second, ldb, ldc = plan.gemm
        operands = (a, b)
        add_half(h, out, lambda tmp: h._gemm(
            ta, tb, m, n, k, 1.0, operands[first].gpudata, lda, operands[second].gpudata, ldb,
            0.0, tmp, ldc, out_f32=True))
    elif kind == "tall":
        run_dot(h, plan.inner, a, b, out, beta)
    elif kind == "zero":
        h._fill(out, 0.0)
    elif kind in ("batched", "batched_f32_add"):
        ta, tb, m, n, k, first, lda, second, ldb, ldc = plan.gemm
        stride_first, stride_second, stride_out, batch = plan.batch
        operands = (a, b)

        def product(c, beta, out_f32):
            h._gemm.batched(ta, tb, m, n, k, 1.0, operands[first].gpudata, lda, stride_first,
                            operands[second].gpudata, ldb, stride_second, beta, c, ldc,
                            stride_out, batch, out_f32=out_f32)
        if kind == "batched_f32_add":
            add_half(h, out, lambda tmp: product(tmp, 0.0, True))
        else:
            product(out.gpudata, beta, False)


def dot_bias_act(h, a, b, bias, out, act):
    """PyCudaHandler's ``_dot_bias_act`` hook: one cuBLASLt call, the bias
    and activation in its epilogue, where ``handlers.cuda.lt`` has a plan
    for the shapes and every pointer is aligned for it; else the product,
    then the epilogue as a fused op (``Handler._dot_bias_act``)."""
    (m, k), n = a.shape, b.shape[1]
    plan = h._lt.plan(m, n, k, act)   # None for an empty product: no memory to point at
    pointers = plan and (int(a.gpudata), int(b.gpudata), int(bias.gpudata), int(out.gpudata))
    if plan is None or not lt.aligned(*pointers):
        Handler._dot_bias_act(h, a, b, bias, out, act)
        return
    _enter()
    h._lt.run(plan, h._slot.handle, *pointers, int(h._slot.blas_work))


def add_half(h, out, product):
    """dot_add_mm in a half format with one rounding: ``product(address)``
    writes op(a) op(b) in float32 there (this stream's workspace), then
    one kernel adds it to out.  cuBLAS's own beta = 1 with a half output
    rounded the product before adding it (seen on an H200, batched and
    not), which the contract's single rounding rules out."""
    tmp = h._slot.workspace(out.size * 4)
    product(int(tmp))
    h._launch("add_compute", out.size, tmp, out.gpudata, out.size)
