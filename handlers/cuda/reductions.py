"""Planning PyCudaHandler's reductions: ``sum_t`` (and ``mean_t``'s sums) and
``max_t``, ``min_t``, ``argmax_t``.

A planner is a pure function of the shapes, the format's packet width and the
device's number of multiprocessors (no handler): it returns an immutable
record, which the handler caches by key and runs (``run_sum`` and
``extreme_t``, below).  Kernel names are those of ``kernels/reduce.cu`` and
``kernels/extrema.cu`` (``handlers.optable.KERNELS``).
"""
import functools
import math
from typing import NamedTuple

import numpy as np

from .. import shape_rules
from ..base import Handler
from .context import enter as _enter
from .launch import (
    BLOCK,
    MAX_BLOCKS_PER_SM,
    MID_BLOCK,
    ROWS_PER_BLOCK,
    SUM_UNROLL,
    warp_rows_grid,
)


class Launch(NamedTuple):
    """One kernel launch: the kernel's name, its grid and block, and the
    arguments that follow the array pointers."""
    kernel: str
    grid: int
    args: tuple
    block: int


class SumPlan(NamedTuple):
    """A sum in one launch (``launch``, None when there is nothing to add
    up), ``zero``: the output must be zero-filled instead (an empty axis);
    ``workspace``: float partials a chunked launch needs (elements);
    ``counters``: the per-stream counters it needs (0 unchunked).  A
    chunked sum finishes in the same launch."""
    launch: Launch | None
    zero: bool
    workspace: int
    counters: int


def sum_view(shape, axis):
    """(outer, n, inner): the sum over ``axis`` (an int or None) runs over n
    of this view of ``shape``."""
    if axis is None:
        return 1, math.prod(shape), 1
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def runs(axes):
    """[lo, hi) runs of adjacent axes in a sorted tuple of axes."""
    out = []
    for ax in axes:
        if out and out[-1][1] == ax:
            out[-1][1] = ax + 1
        else:
            out.append([ax, ax + 1])
    return out


def plan_sum(outer, n, inner, aligned, width, sms, suffix="", row_warps=32, col_split=2,
             col_blocks=4):
    """The ``SumPlan`` of a sum over the middle axis of an (outer, n, inner)
    view: ``aligned`` whether the input starts on 16 bytes, ``width`` its
    elements per 16-byte packet, ``sms`` the device's multiprocessors,
    ``suffix`` the kernels' ("_wide": the halves' sums that write float32).

    The keyword arguments (per multiprocessor) are the tuning knobs that
    ``python -m benchmarks sumtune`` sweeps: ``row_warps``, the warps that
    long rows are split to fill; ``col_split``, the number of column blocks
    under which the rows are split too; ``col_blocks``, the blocks that
    such a split aims for.  The defaults won the sweep on an H200:
    col_blocks 4 beat 8 by 5 points of copy bandwidth on 8192x4096 and
    1Mx16 over axis 0, where fewer, longer chunks keep more loads in flight
    per thread."""
    if not outer * inner:
        return SumPlan(None, False, 0, 0)          # empty output
    if not n:
        return SumPlan(None, True, 0, 0)           # empty axis: the sum is 0
    if inner == 1:
        rows, chunks = outer, 1
        if n > 2048:   # split long rows so that about one wave of warps runs
            chunks = min(-(-n // 2048), max(1, -(-(sms * row_warps) // rows)))
        chunk = -(-n // chunks)
        chunk += -chunk % max(4, width)   # keep chunk starts 16-byte aligned
        chunks = -(-n // chunk)
        grid = max(1, min(-(-(rows * chunks) // ROWS_PER_BLOCK), sms * 64))
        first = Launch("sum_rows" + suffix, grid, (rows, n, chunk, chunks), BLOCK)
        if chunks == 1:
            return SumPlan(first, False, 0, 0)
        return SumPlan(first, False, rows * chunks, rows)
    vec = width if aligned and inner % width == 0 else 1
    cols = -(-inner // vec)
    tx = 1
    while tx < cols and tx < 32:
        tx *= 2
    ty = BLOCK // tx
    tiles = -(-cols // tx)
    base = outer * tiles
    chunks = 1
    if base < sms * col_split:   # too few blocks to fill the GPU: split the rows too
        chunks = max(1, min(-(-(sms * col_blocks) // base), n // (ty * 4)))
    chunk = -(-n // chunks)
    if chunks > 1:   # whole unrolled steps per thread (UNROLL in reduce.cu)
        chunk += -chunk % (ty * SUM_UNROLL)
    chunks = -(-n // chunk)
    kernel = ("sum_cols_vec" if vec > 1 else "sum_cols") + suffix
    first = Launch(kernel, max(1, min(base * chunks, sms * 32)),
                   (outer, n, inner, chunk, chunks, tx), BLOCK)
    if chunks == 1:
        return SumPlan(first, False, 0, 0)
    return SumPlan(first, False, outer * chunks * inner, base)


def plan_mid(shape, lead, trail, aligned, width, sms, suffix="", blocks_per_sm=1):
    """The ``SumPlan`` of sum_mid for a sum over axes [0, lead) and
    [trail, ndim) of ``shape`` (the conv bias gradient) in one pass, or None
    when the trailing run is too long for the kernel's 32-bit indices (the
    caller then sums one run at a time).  Other arguments as ``plan_sum``'s.

    Blocks of 1024 threads, ``blocks_per_sm`` of them per multiprocessor
    (the knob ``python -m benchmarks sumtune`` sweeps): the rows of A are
    split into chunks only as far as M columns alone leave multiprocessors
    idle.  Few, large blocks beat many small ones here because a chunked
    sum ends with a second stage (partials, a fence, an atomic, a last
    block's reads) that a short call cannot hide: on an H200, (64, 128,
    32, 32) took 10.7 us in a graph as 128 blocks of 1024 against 11.4 us
    as 1024 blocks of 256 (8 per SM), where a plain contiguous read of the
    same bytes took 10.0 us."""
    A = math.prod(shape[:lead])
    M, inner = math.prod(shape[lead:trail]), math.prod(shape[trail:])
    vec = width if aligned and inner % width == 0 else 1
    packets = inner // vec
    if packets >= 2**31:
        return None
    chunks = max(1, min(A, round(sms * blocks_per_sm / M)))
    chunk = max(1, min(-(-A // chunks), (2**31 - 1) // packets))
    chunks = -(-A // chunk)
    kernel = ("sum_mid_vec" if vec > 1 else "sum_mid") + suffix
    first = Launch(kernel, max(1, min(M * chunks, sms * 32)), (A, M, inner, chunk, chunks),
                   MID_BLOCK)
    return SumPlan(first, False, M * chunks, M) if chunks > 1 else SumPlan(first, False, 0, 0)


class ExtremePlan(NamedTuple):
    """max_t, min_t or argmax_t over the middle axis of an (outer, n, inner)
    view.  ``rows``: a warp per row (inner 1), one launch of ``grid``
    blocks.  Otherwise columns: ``chunks`` chunks of ``chunk`` rows each,
    joined (when there are several) by a second launch of ``join_grid``
    blocks through ``workspace`` bytes of this stream's workspace, whose
    indices start ``index_at`` bytes in."""
    rows: bool
    grid: int
    chunk: int
    chunks: int
    join_grid: int
    workspace: int
    index_at: int


@functools.lru_cache(maxsize=1024)   # pure; asked at every call of the op
def plan_extreme(outer, n, inner, itemsize, sms):
    """The ``ExtremePlan`` of a non-empty extremum (outer * inner > 0) of
    elements of ``itemsize`` bytes on a device of ``sms`` multiprocessors."""
    cap = MAX_BLOCKS_PER_SM * sms
    if inner == 1:   # a warp per row: BLOCK-thread blocks, ROWS_PER_BLOCK rows each
        return ExtremePlan(True, warp_rows_grid(outer, cap), 0, 1, 0, 0, 0)
    # Enough threads to fill the GPU: few columns over many rows split the
    # rows into chunks (at least 32 rows each), joined in a second launch.
    cols, fill = outer * inner, cap * BLOCK
    chunks = max(1, min(n // 32, fill // cols))
    chunk = -(-n // chunks)
    chunks = -(-n // chunk)
    workspace = index_at = 0
    if chunks > 1:
        workspace = chunks * cols * (itemsize + 8) + 8
        index_at = chunks * cols * itemsize
    return ExtremePlan(False, min(-(-(cols * chunks) // BLOCK), cap), chunk, chunks,
                       min(-(-cols // BLOCK), cap), workspace, index_at)


# Running the plans -----------------------------------------------------------
# Functions of a PyCudaHandler ``h``, which takes them as its hooks (its class
# body names them): they cache plans on ``h`` by key and launch through
# ``h._run``, on the stream group's stream and workspace.
def remember_sum(h, a, axis, out):
    """Store the launch of a checked sum_t combination for the one-call path,
    or None if it stays in Python (nothing to launch, or a chunked plan,
    which uses this group's workspace); once per combination."""
    aligned = int(a.gpudata) % 16 == 0 if a.size else True
    key = (a.shape, axis, out.shape, aligned)
    if key in h._sum_launches:
        return
    checked_axis = h._sum_shapes[(a.shape, axis, out.shape)]
    # One plan for the whole sum: an int axis, None, or a tuple summed by
    # sum_mid in one pass (other tuples take several passes: no plan here).
    plan = h._sum_plans.get((a.shape, checked_axis, aligned))
    launch = None
    if plan and plan.launch is not None and not plan.counters:
        first = plan.launch
        fn = h._k[first.kernel]
        launch = (fn.handle, first.grid, fn.fmt, first.args, first.block)
    h._sum_launches[key] = launch


#: The extreme kernels' code of each kind
EXTREME_KINDS = {"max": 0, "min": 1, "argmax": 2}


def extreme_t(h, kind, a, axis, out):
    """max_t, min_t or argmax_t (``kind``) of ``a`` over ``axis`` into ``out``."""
    _enter()
    outer, n, inner = sum_view(a.shape, axis)
    if not outer * inner:
        return
    code = EXTREME_KINDS[kind]
    plan = plan_extreme(outer, n, inner, h.dtype.itemsize, h._sms)
    if plan.rows:
        h._run(h._k["extreme_rows"], plan.grid, a.gpudata, out.gpudata, outer, n, code)
        return
    ws = wi = 0
    if plan.chunks > 1:   # partial extrema and their indices in this stream's workspace
        ws = h._slot.workspace(plan.workspace)
        wi = int(ws) + plan.index_at
        wi += -wi % 8
    h._run(h._k["extreme_cols"], plan.grid, a.gpudata, out.gpudata, ws, wi, outer, n,
           inner, plan.chunk, plan.chunks, code)
    if plan.chunks > 1:
        h._run(h._k["extreme_join"], plan.join_grid, ws, wi, out.gpudata,
               outer * inner, plan.chunks, code)


def sum_t(h, a, axis, out):
    """The sum_t hook: a tuple of axes (``sum_axes``) or one pass."""
    if type(axis) is tuple:
        return h._sum_axes(a, axis, out)
    h._sum_pass(a, axis, out)


def sum_pass(h, a, axis, out, form="TT"):
    """One sum over ``axis`` (an int or None).  ``form`` says the formats
    of input and output (``sum_kernels``): "TT" the handler's both; for the
    halves "TC" writes float32 and "CC" reads and writes float32."""
    _enter()
    key = (a.shape, axis, int(a.gpudata) % 16 == 0 if a.size else True)
    if form != "TT":   # TT keeps the 3-tuple: OneCall.sum's plans are keyed so
        key += (form,)
    plan = h._sum_plans.get(key)
    if plan is None:
        suffix, width = h._sum_kernels(form)
        plan = h._sum_plans[key] = plan_sum(
            *sum_view(a.shape, axis), key[2], width, h._sms, suffix)
    h._run_sum(plan, a, out, form)


def sum_kernels(h, form):
    """(name suffix, elements per 16-byte packet of the input) of the
    sums of ``form``: "TT" and "TC" read the handler's format and write
    it ("TT") or its compute format ("TC", the _wide kernels); "CC"
    reads and writes float32 (the halves only, from ``_k32``)."""
    if form == "CC":
        return "", 4
    return "_wide" if form == "TC" else "", h._vec


def mid_plan(h, a, axes, runs, form="TT"):
    """The plan of the sum over ``runs`` in one pass (sum_mid, for
    ``run_sum``) where they are one leading and one trailing run and the
    kernel takes the shape, else False.  ``form`` as ``sum_pass``'s."""
    if not (len(runs) == 2 and runs[0][0] == 0 and runs[1][1] == a.ndim):
        return False
    _enter()
    key = (a.shape, axes, int(a.gpudata) % 16 == 0)   # a tuple axis: no clash
    if form != "TT":
        key += (form,)
    plan = h._sum_plans.get(key)
    if plan is None:
        suffix, width = h._sum_kernels(form)
        plan = h._sum_plans[key] = plan_mid(
            a.shape, runs[0][1], runs[1][0], key[2], width, h._sms, suffix) or False
    return plan


def sum_passes(h, a, runs, out=None):
    """The sum over separate runs of axes, last run first, one pass each
    through this stream's two intermediate buffers (alternating: a pass
    never writes what it reads), the last pass into ``out``.  Without
    ``out`` (the halves' "wide" sum) every pass writes float32, the last
    one too, into an intermediate buffer, which is returned for the one
    rounding."""
    wide = out is None
    shape, src, form = list(a.shape), a, "TC" if wide else "TT"
    for i, (lo, hi) in enumerate(reversed(runs)):
        merged = shape[:lo] + [math.prod(shape[lo:hi])] + shape[hi:]
        shape = shape[:lo] + shape[hi:]
        if i == len(runs) - 1 and not wide:
            dst = out
        else:
            dst = h._slot.intermediate(i % 2, tuple(shape),
                                       np.dtype(np.float32) if wide else h.dtype)
        dst = dst.reshape(tuple(shape))
        h._sum_pass(src.reshape(tuple(merged)), lo, dst, form)
        src, form = dst, "CC" if wide else form
    return src


def sum_wide(h, a, axis):
    """The sum of non-empty ``a`` over ``axis`` (None, an int or a sorted
    tuple) in float32, in this stream's intermediate buffers: mean_t's in
    the half formats, whose result is then scaled and rounded once (the
    "narrow" kernel)."""
    _enter()
    axes = (tuple(range(a.ndim)) if axis is None else axis if type(axis) is tuple
            else (axis,))
    parts = runs(axes)
    plan = h._mid_plan(a, axes, parts, "TC")
    if not plan:
        return h._sum_passes(a, parts)
    kept = tuple(n for i, n in enumerate(a.shape) if i not in axes)
    dst = h._slot.intermediate(0, kept, np.dtype(np.float32))
    h._run_sum(plan, a, dst, "TC")
    return dst


def mean_t(h, a, axis, out):
    """The mean_t hook: the halves sum in float32 and round once; other
    formats take the contract's sum then scale."""
    n = shape_rules.reduced_size(a.shape, axis)
    if not h._half or n <= 1 or not out.size:
        return Handler._mean_t(h, a, axis, out)
    # The halves: the float32 sum scaled by 1 / n, rounded once.
    wide = h._sum_wide(a, axis)
    h._launch("narrow", out.size, wide.gpudata, 1.0 / n, out.gpudata, out.size)


def run_sum(h, plan, a, out, form="TT"):
    """Run a ``SumPlan`` of ``form`` (``sum_pass``'s)."""
    first = plan.launch
    if first is None:          # nothing to add up
        if plan.zero:
            h._fill(out, 0.0)
        return
    fn = (h._k32 if form == "CC" else h._k)[first.kernel]
    ws = cnt = 0
    if plan.counters:          # chunked: partials and per-stream counters
        ws = h._slot.workspace(plan.workspace * h._compute_itemsize)   # float partials
        cnt = h._slot.counters(plan.counters)
    h._run(fn, first.grid, a.gpudata, ws, out.gpudata, cnt, *first.args, block=first.block)


def sum_axes(h, a, axes, out):
    """sum_t over a sorted tuple of axes.  Each run of adjacent axes is
    one axis of a reshaped view, so (2, 3) of NCHW is one pass; separate
    runs are summed last run first, each pass into this stream's
    intermediate buffers, the last into ``out``."""
    if not a.size:   # nothing to add up (and empty GPUArrays cannot be reshaped)
        if out.size:
            h._fill(out, 0.0)
        return
    parts = runs(axes)
    plan = h._mid_plan(a, axes, parts)
    if plan:
        h._run_sum(plan, a, out)
        return
    if h._half and len(parts) > 1:   # passes in float32, one rounding at the end
        _enter()
        wide = h._sum_passes(a, parts)
        h._launch("narrow", out.size, wide.gpudata, 1.0, out.gpudata, out.size)
        return
    h._sum_passes(a, parts, out)
