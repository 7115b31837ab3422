"""The reduction engine of PyCudaHandler: ``sum_t``, ``mean_t``, ``max_t``,
``min_t`` and ``argmax_t`` all plan here and run the kernels of
``kernels/reduce.cu``.

Planning has two steps, both pure functions of shapes and the device (no
handler), cached by the handler per combination:

1. ``layout``: the input's size-1 axes are dropped and adjacent reduced (and
   adjacent kept) axes merged, which leaves one of three layouts, or several
   passes for the rare interleavings beyond them: ``rows`` (each reduced
   segment contiguous), ``cols`` (a reduced axis with contiguous kept axes
   after it) and ``mid`` (kept axes between reduced ones: the conv bias
   gradient, (0, 2, 3) of NCHW).
2. ``plan_rows``, ``plan_cols``, ``plan_mid``: the kernel, its grid and its
   chunking, from the device's multiprocessors and threads per
   multiprocessor.  The rules (each planner's docstring says why): enough
   blocks to keep the loads in flight that hide memory latency; chunks of a
   long axis only as far as that needs, so the in-launch second stage stays
   small; never a second launch.

The combine is a kernel family: ``sum`` (mean_t is a sum whose result is
divided by the count as it is stored: one launch) or ``pick`` (max, min,
argmax: the ``kind`` argument).
"""
import math
from typing import NamedTuple

import numpy as np

from .. import shape_rules
from ..base import Handler
from ..optable import OPS
from .context import enter as _enter
from .launch import BLOCK, MID_BLOCK, PICK_UNROLL, SHORT_ROW, SUM_UNROLL


class Launch(NamedTuple):
    """One kernel launch: the kernel's name, its grid and block, and the
    arguments that follow the pointers (input, workspace, output, counters)."""
    kernel: str
    grid: int
    args: tuple
    block: int


class Plan(NamedTuple):
    """A reduction in one launch: ``launch``; ``workspace``, the bytes of
    partial states a chunked launch needs; ``counters``, the per-stream
    counters it needs (0 unchunked).  A chunked launch finishes itself."""
    launch: Launch
    workspace: int
    counters: int


#: The code of each pick (the kernels' ``kind``)
PICK_KINDS = {"max": 0, "min": 1, "argmax": 2}
#: Bytes of a pick's partial state: the value and its int64 index
PICK_STATE = 16
#: Loads of 16 bytes in flight per thread in the row kernels (ROW_UNROLL in
#: reduce.cu)
ROW_UNROLL = 4
#: Elements of a ``*_short`` tile in shared memory (SHORT_TILE in reduce.cu)
SHORT_TILE = BLOCK * 8


def layout(shape, axes):
    """The canonical form of a reduction of ``shape`` over ``axes`` (a tuple
    of axes in range): ``("rows", (rows, n))``, ``("cols", (outer, n,
    inner))``, ``("mid", (A, M, I))`` or ``("passes", (extents, reduced))``
    for the others, where ``extents`` is the merged shape and ``reduced``
    the merged axes to reduce.  Size-1 axes are dropped (reducing one is a
    copy), then adjacent axes of the same kind are merged; the output's
    layout is the kept axes in order, so every form writes it contiguously."""
    merged = []   # [extent, reduced]
    for i, e in enumerate(shape):
        if e == 1:
            continue
        reduced = i in axes
        if merged and merged[-1][1] == reduced:
            merged[-1][0] *= e
        else:
            merged.append([e, reduced])
    pattern = "".join("R" if r else "K" for _, r in merged)
    ext = [e for e, _ in merged]
    if pattern in ("", "K"):           # nothing left to reduce: rows of one
        return "rows", (math.prod(ext), 1)
    if pattern == "R":
        return "rows", (1, ext[0])
    if pattern == "KR":
        return "rows", (ext[0], ext[1])
    if pattern == "RK":
        return "cols", (1, ext[0], ext[1])
    if pattern == "KRK":
        return "cols", tuple(ext)
    if pattern == "RKR":
        return "mid", tuple(ext)
    return "passes", (tuple(ext), tuple(i for i, (_, r) in enumerate(merged) if r))


def _pow2(x):
    """The smallest power of 2 >= x (x >= 1)."""
    return 1 << (max(1, x) - 1).bit_length()


def plan_rows(rows, n, width, family, sms, sm_threads, div=1, kind=0, suffix=""):
    """The ``Plan`` of a reduction of each contiguous row of n elements:
    ``width`` elements per 16-byte packet, ``family`` "sum" or "pick",
    ``sms`` and ``sm_threads`` the device's multiprocessors and threads per
    multiprocessor, ``div`` the count a mean divides by (1: a sum), ``kind``
    the pick, ``suffix`` the kernels' ("_wide": a sum in the compute format).

    * n <= SHORT_ROW: ``*_short`` (a warp per row would leave most lanes idle).
    * rows enough for half the resident warps: ``*_rows``, a warp per row;
      each keeps ROW_UNROLL 16-byte loads in flight.
    * fewer, longer rows: ``*_long``, a block per (row, chunk), with enough
      chunks for every resident block (few rows could not hide memory
      latency otherwise: a 1-D array to a scalar is one row), each chunk at
      least one full trip of the block's loads."""
    resident = sms * sm_threads // BLOCK                   # blocks the GPU holds at once
    if n <= SHORT_ROW:
        return _plan_short(rows, n, 1, family, sms, sm_threads, div, kind, suffix)
    args = (rows, n, n, 1, div, kind)                      # one chunk: the row
    if rows >= sms * sm_threads // 64 or n < 2 * BLOCK * width * ROW_UNROLL:
        warps_per_block = BLOCK // 32
        grid = max(1, min(-(-rows // warps_per_block), 4 * resident))
        return Plan(Launch(f"{family}_rows{suffix}", grid, args, BLOCK), 0, 0)
    trip = BLOCK * width * ROW_UNROLL
    chunks = max(1, min(-(-resident // rows), -(-n // trip)))
    chunk = -(-n // chunks)
    chunk += -chunk % width                                # chunk starts stay aligned
    chunks = -(-n // chunk)
    grid = max(1, min(rows * chunks, 4 * resident))
    launch = Launch(f"{family}_long{suffix}", grid, (rows, n, chunk, chunks, div, kind), BLOCK)
    if chunks == 1:
        return Plan(launch, 0, 0)
    return Plan(launch, rows * chunks * _state(family, width), rows)


def _plan_short(outer, n, inner, family, sms, sm_threads, div, kind, suffix):
    """The ``*_short`` plan: tiles of whole (n, inner) slabs in shared memory
    (n * inner <= SHORT_TILE); the kernel's third number is ``inner``."""
    tiles = -(-outer // (SHORT_TILE // (n * inner)))
    grid = max(1, min(tiles, sms * sm_threads // BLOCK))
    return Plan(Launch(f"{family}_short{suffix}", grid, (outer, n, inner, 1, div, kind), BLOCK),
                0, 0)


def _state(family, width):
    """Bytes of one partial state: a pick's (value, index) or a sum in the
    compute format (float for the halves, whose packets hold 8)."""
    return PICK_STATE if family == "pick" else (4 if width >= 4 else 8)


def plan_cols(outer, n, inner, aligned, width, family, sms, sm_threads, div=1, kind=0,
              suffix=""):
    """The ``Plan`` of a reduction over the middle axis of an (outer, n,
    inner) view, inner > 1 (arguments as ``plan_rows``'s; ``aligned``:
    whether the input starts on 16 bytes).

    A block of tx * ty threads: tx across the columns (V-wide loads where the
    rows stay 16-byte aligned), ty down the rows, each thread with UNROLL
    loads in flight.  tx is at most 32 (a warp reads 512 contiguous bytes),
    unless the axis is too short to give ty rows UNROLL loads each: then the
    block widens across the columns, down to ty = 1 (every thread reads its
    whole column in one trip, no partials to combine).  Slabs of n * inner
    <= SHORT_TILE elements go to ``*_short`` instead, many to a block (a
    block per tiny tile would wait on latency, not bandwidth).  Too few tiles to
    give every multiprocessor half its resident blocks split the rows into
    chunks (half: each thread's UNROLL loads keep enough bytes in flight,
    and fewer chunks keep the second stage small; 4 blocks per SM beat 8 by
    5 points of copy bandwidth on an H200 on 8192x4096 and 1Mx16 over axis
    0)."""
    if n * inner <= SHORT_TILE:   # small slabs: a tile holds many of them
        return _plan_short(outer, n, inner, family, sms, sm_threads, div, kind, suffix)
    vec = width if aligned and inner % width == 0 else 1
    cols = -(-inner // vec)
    unroll = PICK_UNROLL if family == "pick" else SUM_UNROLL
    wide = _pow2(cols)
    tx = min(32, wide)
    ty = max(1, min(BLOCK // tx, _pow2(-(-n // unroll))))
    tx = min(BLOCK // ty, wide)
    ty = BLOCK // tx
    tiles = -(-cols // tx)
    base = outer * tiles
    target = sms * sm_threads // BLOCK // 2
    chunks = 1
    if base < target:
        chunks = max(1, min(-(-target // base), n // (ty * unroll)))
    chunk = -(-n // chunks)
    if chunks > 1:   # whole trips of loads per thread (the kernel's fast loop)
        chunk += -chunk % (ty * unroll)
    chunks = -(-n // chunk)
    kernel = f"{family}_cols{'_vec' if vec > 1 else ''}{suffix}"
    launch = Launch(kernel, max(1, min(base * chunks, sms * 32)),
                    (outer, n, inner, chunk, chunks, div, tx, kind), BLOCK)
    if chunks == 1:
        return Plan(launch, 0, 0)
    return Plan(launch, outer * chunks * inner * _state(family, width), base)


def plan_mid(A, M, inner, aligned, width, sms, sm_threads, div=1, suffix=""):
    """The ``Plan`` of the sum over A and I of an (A, M, I) view in one pass
    (the kernels ``sum_mid*``), or None when a run of I is too long for the
    kernel's 32-bit offsets (the caller then takes one axis at a time).

    Blocks of 1024 threads, half the device's resident threads per
    multiprocessor: each column's A * I elements are split into chunks only
    as far as M columns alone leave multiprocessors idle.  Few, large blocks
    beat many small ones here because a chunked sum ends with a second stage
    (partials, a fence, an atomic, a last block's reads) that a short call
    cannot hide: on an H200, (64, 128, 32, 32) took 10.7 us in a graph as
    128 blocks of 1024 against 11.4 us as 1024 blocks of 256 (8 per SM),
    where a plain contiguous read of the same bytes took 10.0 us."""
    vec = width if aligned and inner % width == 0 else 1
    packets = inner // vec
    if packets >= 2**31:
        return None
    total = A * packets
    unroll = 8 if vec == 8 else 16 // vec
    per_sm = max(1, sm_threads // 2 // MID_BLOCK)
    chunks = max(1, min(round(sms * per_sm / M), total // (MID_BLOCK * unroll)))
    chunks = max(chunks, -(-total // (2**31 - 1)))
    chunk = -(-total // chunks)
    chunks = -(-total // chunk)
    kernel = f"sum_mid{'_vec' if vec > 1 else ''}{suffix}"
    launch = Launch(kernel, max(1, min(M * chunks, sms * 32)), (A, M, inner, chunk, chunks, div),
                    MID_BLOCK)
    if chunks == 1:
        return Plan(launch, 0, 0)
    return Plan(launch, M * chunks * _state("sum", width), M)


def plan(shape, axes, aligned, width, family, sms, sm_threads, div=1, kind=0, suffix=""):
    """The ``Plan`` of a reduction of ``shape`` over ``axes`` (a sorted tuple
    in range) in one launch, or None where it takes several passes (``layout``
    says which; ``plan_mid`` may decline too).  Other arguments as
    ``plan_cols``'s.  Pure: the handler caches it per combination."""
    form, dims = layout(shape, axes)
    if form == "rows":
        return plan_rows(*dims, width, family, sms, sm_threads, div, kind, suffix)
    if form == "cols":
        return plan_cols(*dims, aligned, width, family, sms, sm_threads, div, kind, suffix)
    if form == "mid" and family == "sum":
        return plan_mid(*dims, aligned, width, sms, sm_threads, div, suffix)
    return None


def _axes(ndim, axis):
    """A checked axis (None, an int in range or a sorted tuple) as a tuple."""
    if axis is None:
        return tuple(range(ndim))
    return axis if type(axis) is tuple else (axis,)


# Running the plans -----------------------------------------------------------
# Functions of a PyCudaHandler ``h``, which takes them as its hooks (its class
# body names them): they cache plans on ``h`` by key and launch through
# ``h._run``, on the stream group's stream and workspace.
def _planned(h, family, a, axis, form="TT", div=1, kind=0):
    """The cached ``Plan`` (or None: several passes) of a reduction of ``a``
    over checked ``axis`` in ``form`` (``sum_pass``'s)."""
    aligned = int(a.gpudata) % 16 == 0 if a.size else True
    key = (a.shape, axis, aligned) if family == "sum" and div == 1 and form == "TT" \
        else (a.shape, axis, aligned, family, form, div, kind)
    found = h._sum_plans.get(key, False)
    if found is False:
        suffix, width = h._sum_kernels(form)
        found = h._sum_plans[key] = plan(a.shape, _axes(a.ndim, axis), aligned, width, family,
                                         h._sms, h._sm_threads, div, kind, suffix)
    return found


def remember_sum(h, a, axis, out):
    """Store the launch of a checked sum_t combination for the one-call path,
    or None if it stays in Python (nothing to launch, several passes, or a
    chunked plan, which uses this group's workspace); once per combination."""
    aligned = int(a.gpudata) % 16 == 0 if a.size else True
    key = (a.shape, axis, out.shape, aligned)
    if key in h._sum_launches:
        return
    checked_axis = h._sum_shapes[(a.shape, axis, out.shape)]
    found = _planned(h, "sum", a, checked_axis) if a.size and out.size else None
    launch = None
    if found and not found.counters:
        first = found.launch
        fn = h._k[first.kernel]
        launch = (fn.handle, first.grid, fn.fmt, first.args, first.block)
    h._sum_launches[key] = launch


def run(h, found, a, out, form="TT"):
    """Launch a ``Plan`` of ``form`` (``sum_pass``'s) from ``a`` into ``out``."""
    first = found.launch
    fn = (h._k32 if form == "CC" else h._k)[first.kernel]
    ws = cnt = 0
    if found.counters:         # chunked: partials and per-stream counters
        ws = h._slot.workspace(found.workspace)
        cnt = h._slot.counters(found.counters)
    h._run(fn, first.grid, a.gpudata, ws, out.gpudata, cnt, *first.args, block=first.block)


def extreme_t(h, kind, a, axis, out):
    """max_t, min_t or argmax_t (``kind``) of ``a`` over ``axis`` into ``out``."""
    _enter()
    if not out.size:
        return
    # One int axis (the checks refuse others), so one launch always.
    h._run_reduction(_planned(h, "pick", a, axis, kind=PICK_KINDS[kind]), a, out)


def sum_t(h, a, axis, out):
    """The sum_t hook: one launch, or passes over separate runs of axes."""
    _enter()
    if not out.size:
        return
    if not a.size:             # an empty axis: the sum is 0
        h._fill(out, 0.0)
        return
    _sum(h, a, axis, out)


def mean_t(h, a, axis, out):
    """The mean_t hook: the sum divided by the count as it is stored, in one
    launch (NaN over an empty axis); passes take the sum, then one scaling."""
    _enter()
    n = shape_rules.reduced_size(a.shape, axis)
    if not out.size or n == 0:
        return Handler._mean_t(h, a, axis, out)
    with h._slot.lock:         # as the work hooks: the stream's workspace is ours
        _sum(h, a, axis, out, n)


def _sum(h, a, axis, out, n=1):
    """The sum of non-empty ``a`` over checked ``axis`` into ``out``, divided
    by ``n`` (a mean) as it is stored: one launch where the layout allows,
    else passes, the halves' in float32 with one scaling and rounding."""
    found = _planned(h, "sum", a, axis, div=n)
    if found is not None:
        h._run_reduction(found, a, out)
    elif h._half:
        wide = h._sum_passes(a, _axes(a.ndim, axis))
        h._launch("narrow", out.size, wide.gpudata, 1.0 / n, out.gpudata, out.size)
    else:
        h._sum_passes(a, _axes(a.ndim, axis), out)
        if n != 1:
            h._elementwise(OPS["mult_st"], 1.0 / n, out, out)


def sum_kernels(h, form):
    """(name suffix, elements per 16-byte packet of the input) of the
    sums of ``form``: "TT" and "TC" read the handler's format and write
    it ("TT") or its compute format ("TC", the _wide kernels); "CC"
    reads and writes float32 (the halves only, from ``_k32``)."""
    if form == "CC":
        return "", 4
    return "_wide" if form == "TC" else "", h._vec


def sum_passes(h, a, axes, out=None):
    """The sum over ``axes`` taken one merged run of axes at a time, last run
    first, each pass through this stream's two intermediate buffers
    (alternating: a pass never writes what it reads), the last pass into
    ``out``.  Without ``out`` (the halves) every pass writes float32, the
    last one too, into an intermediate buffer, which is returned for the one
    rounding."""
    _, (extents, reduced) = layout(a.shape, axes)
    wide = out is None
    shape, src, form = list(extents), a.reshape(extents), "TC" if wide else "TT"
    for i, ax in enumerate(reversed(reduced)):
        shape = shape[:ax] + shape[ax + 1:]
        if i == len(reduced) - 1 and not wide:
            dst = out.reshape(tuple(shape))
        else:
            dst = h._slot.intermediate(i % 2, tuple(shape),
                                       np.dtype(np.float32) if wide else h.dtype)
        found = _planned(h, "sum", src, ax, form)
        h._run_reduction(found, src, dst, form)
        src, form = dst, "CC" if wide else form
    return src
