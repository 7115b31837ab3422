"""Planning PyCudaHandler's reductions: ``sum_t`` (and ``mean_t``'s sums) and
``max_t``, ``min_t``, ``argmax_t``.

A planner is a pure function of the shapes, the format's packet width and the
device's number of multiprocessors (no handler): it returns an immutable
record, which the handler caches by key and runs (``PyCudaHandler._run_sum``,
``_extreme_t``).  Kernel names are those of ``kernels/reduce.cu`` and
``kernels/extrema.cu`` (``handlers.optable.KERNELS``).
"""
import math
from typing import NamedTuple

#: Threads per block of the grid-stride kernels (elementwise, sum_rows, sum_cols)
BLOCK = 256
#: Threads per block of sum_mid (``plan_mid`` says why so many)
MID_BLOCK = 1024
#: Loads in flight per thread in sum_cols (``UNROLL`` in reduce.cu)
SUM_UNROLL = 16


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
        grid = max(1, min(-(-(rows * chunks) // 8), sms * 64))
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


def plan_extreme(outer, n, inner, itemsize, sms):
    """The ``ExtremePlan`` of a non-empty extremum (outer * inner > 0) of
    elements of ``itemsize`` bytes on a device of ``sms`` multiprocessors."""
    if inner == 1:   # a warp per row: grid of 256-thread blocks, 8 rows each
        return ExtremePlan(True, min((outer + 7) // 8, 16 * sms), 0, 1, 0, 0, 0)
    # Enough threads to fill the GPU: few columns over many rows split the
    # rows into chunks (at least 32 rows each), joined in a second launch.
    cols, fill = outer * inner, 16 * sms * BLOCK
    chunks = max(1, min(n // 32, fill // cols))
    chunk = -(-n // chunks)
    chunks = -(-n // chunk)
    workspace = index_at = 0
    if chunks > 1:
        workspace = chunks * cols * (itemsize + 8) + 8
        index_at = chunks * cols * itemsize
    return ExtremePlan(False, min(-(-(cols * chunks) // BLOCK), 16 * sms), chunk, chunks,
                       min(-(-cols // BLOCK), 16 * sms), workspace, index_at)
