"""The reduction engine of PyCudaHandler: ``sum_t``, ``mean_t``, ``max_t``,
``min_t`` and ``argmax_t`` all plan here and run the kernels of
``kernels/reduce.cu``.

Planning has two steps, both pure functions of shapes and the device (no
handler), cached by the handler per combination:

1. ``layout``: the input's size-1 axes are dropped and adjacent reduced (and
   adjacent kept) axes merged, which leaves one of three layouts, or
   ``passes`` for the interleavings beyond them: ``rows`` (each reduced
   segment contiguous), ``cols`` (a reduced axis with contiguous kept axes
   after it) and ``mid`` (kept axes between reduced ones: the conv bias
   gradient, (0, 2, 3) of NCHW).
2. ``plan_rows``, ``plan_cols``, ``plan_mid``, ``plan_gen`` (the ``passes``
   layouts of up to GEN_RUNS merged runs of each kind, in one launch): the
   kernel, its grid and its chunking, from the device's multiprocessors and
   the occupancy of the kernel chosen: the blocks of it that one
   multiprocessor holds at once (``blocks_per_sm``, which the handler asks
   the driver for once per kernel).  Not the threads alone: ptxas gives most
   reduction kernels 48 to 80 registers a thread, so an H100 or H200 holds 3
   to 5 blocks of 256 of them where its 2048 threads would hold 8, and a
   grid sized for 8 a multiprocessor runs half its blocks in a second wave.
   The rules (each planner's docstring says why): enough blocks to keep the
   loads in flight that hide memory latency; a grid meant as one wave no
   larger than the kernel's resident blocks; chunks of a long axis only as
   far as that needs, so the in-launch second stage stays small; never a
   second launch.  Layouts beyond ``plan_gen`` run ``sum_passes``: one
   launch per merged run of reduced axes.  A reduction with nothing to
   reduce (every reduced axis of extent 1: ``layout`` gives rows of one
   element) is a plan too, ``plan_one``: each output from its one input
   (argmax: 0) in one launch of the engine's signature, so the one-call
   path serves it as any other.

A chunked plan (``counters`` > 0) needs partials and counters on its
stream.  The Python path (``run``) takes them from the stream slot's
growable scratch; the one-call path, from a fixed scratch that each slot
allocates once (``one_call_scratch`` sizes it) and that nothing else uses,
so a launch remembered for C never meets a buffer that the Python path
grows or frees.  Plans that need more stay on the Python path.

The combine is a kernel family: ``sum`` (mean_t is a sum whose result is
divided by the count as it is stored: one launch), ``max`` and ``min`` (the
value alone, kept as a sum keeps its total) or ``pick`` (argmax: a value and
its index, a 32-bit one; ``pick64`` where the reduced extent needs more:
``plan`` decides).
"""
import math
from typing import NamedTuple

import numpy as np

from .. import shape_rules
from ..base import Handler
from ..optable import OPS
from . import kernel_loader
from .context import enter as _enter
from .launch import (
    BLOCK,
    LANE_UNROLL,
    MAX_BLOCKS_PER_SM,
    MID_BLOCK,
    PICK_UNROLL,
    SHORT_ROW,
    SUM_UNROLL,
    THREAD_ROW,
    THREAD_UNROLL,
)


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


#: The code of each extreme (the kernels' ``kind`` argument, which none
#: reads now: max and min have kernels of their own, and ``pick`` is argmax)
PICK_KINDS = {"max": 0, "min": 1, "argmax": 2}
#: The longest reduced extent whose indices argmax keeps as 32-bit ints
#: (reduce.cu's Pick32: index arithmetic and states half a 64-bit one's);
#: longer ones run the ``pick64`` kernels
PICK32_EXTENT = 2**31
#: Loads of 16 bytes in flight per thread in the row kernels (ROW_UNROLL in
#: reduce.cu)
ROW_UNROLL = 4
#: Elements of a ``*_short`` tile in shared memory (SHORT_TILE in reduce.cu)
SHORT_TILE = BLOCK * 8
#: The most columns (inner) of a small slab that ``*_slab`` takes, a warp a
#: slab and a lane a column (a warp's 32 lanes)
SLAB_COLS = 32
#: The fewest elements of a small slab that ``*_slab`` takes; smaller slabs
#: share ``*_short``'s tiles, many to a block, since a warp's lanes would
#: have a load or two each and the warp's join would cost more than its
#: reads.  Timed on an H200 (benchmarks/results/diagnostics/slab_warp.py):
#: warps won from 120 elements a slab up (1.1-4x), tiles at 24 (3.3x); 96
#: is three loads a lane, between the two, itself untimed.
SLAB_LEAST = 96
#: The longest reduced axis, and the most columns, of a small slab that
#: ``*_walk`` takes (a thread an output walking its column in trips of
#: THREAD_ROW; ``*_stride`` takes axes of THREAD_ROW or fewer).  Timed on an
#: H200 (benchmarks/results/diagnostics/slab_warp.py, its ``walks`` rule:
#: slab_walk-NVIDIA-H200.log): on slabs of 2-8 columns the walks won at
#: every axis of 9-60 elements (0.47-0.95x the tree's time; 0.93-1.45x
#: torch's speed, where the tree's tiles and warps gave 0.44-1.08x) and
#: lost at every axis of 90 or more (1.15-17x the time: a thread walks too
#: far alone, on too few threads); on slabs of 16-30 columns, whose warps
#: use most lanes, they lost by 4-7% (29% on one small case) but for one
#: tie.  64 sits between 60 and 90, itself untimed.
WALK_MOST = 64
WALK_COLS = 8
#: The most columns a thread of ``*_cols`` (scalar loads) reads, tx apart
#: (SCALAR_COLS in reduce.cu; ``scalar_cols``)
SCALAR_COLS = 4
#: Rows a trip of the general kernels ``sum_gen*`` (GEN_UNROLL in reduce.cu)
GEN_UNROLL = 7
#: The most merged runs of reduced (and of kept) axes that ``sum_gen*`` takes
#: (the four digits of reduce.cu's GenArgs)
GEN_RUNS = 4
#: The most kernel arguments the one-call path takes (MAX_PARAMS in
#: ``_one_call.c``): a plan with more stays in Python
ONE_CALL_PARAMS = 12
#: Bytes of the one-call path's fixed workspace per block the device holds
#: at once (``one_call_scratch`` says why)
ONE_CALL_TASK_BYTES = 2048


def one_call_scratch(sms, sm_threads):
    """(bytes, counters) of the fixed scratch that each stream slot gives
    its one-call path for chunked plans, on a device of ``sms``
    multiprocessors of ``sm_threads`` threads: ONE_CALL_TASK_BYTES and one
    counter per resident block (``resident`` = sms * sm_threads / BLOCK,
    the most blocks of BLOCK threads the device holds at once whatever the
    kernel: a kernel's occupancy, by which the planners chunk, is at most
    that; an H200's 1056 make 2.1 MB a stream, next to cuBLAS's 32 MB).

    The planners chunk only while the tasks are too few to fill the
    device, which bounds what a chunked plan needs:

    * ``plan_rows``: at most resident / 2 rows (counters), at most
      resident // rows chunks each: at most ``resident`` partial states of
      at most 16 bytes.
    * ``_chunking`` (cols, gen): under resident / 4 tiles (counters), at
      most ceil(resident / 4 / tiles) chunks each: under resident / 2
      (tile, chunk) tasks.  A chunked tile is at most 32 thread columns
      (ty >= 8 rows a trip: only the deepest tiles chunk) of a packet of columns
      each, a state a column: at most 32 * 8 * 16 = 4096 bytes a task (a
      64-bit argmax, ``pick64``, of the halves; their 32-bit one 2048, a
      double's 16-byte picks come 2 a packet, sums, max and min at most
      32 * 8 * 4), under ``resident`` * 2048 bytes in all.
    * ``plan_mid``: columns fewer than the multiprocessors, chunked to
      about one block per multiprocessor: a few KB.

    So the fixed scratch takes every chunked plan but ``sum_mid`` columns
    of 2^31 packets or more, which stay on the Python path (``remember``
    checks each plan)."""
    resident = sms * sm_threads // BLOCK
    return ONE_CALL_TASK_BYTES * resident, resident


def layout(shape, axes):
    """The canonical form of a reduction of ``shape`` over ``axes`` (a tuple
    of axes in range): ``("rows", (rows, n))``, ``("cols", (outer, n,
    inner))``, ``("mid", (A, M, I))`` or ``("passes", (extents, reduced))``
    for the others, where ``extents`` is the merged shape and ``reduced``
    the merged axes to reduce.  Size-1 axes are dropped (reducing one is a
    copy: nothing reduced leaves ``("rows", (size, 1))``, ``plan_one``'s),
    then adjacent axes of the same kind are merged; the output's
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


def _per_sm(blocks_per_sm, kernel, block, sm_threads):
    """Blocks of ``kernel`` (``block`` threads each) that one multiprocessor
    holds at once: ``blocks_per_sm(kernel, block)`` (the handler's: the
    driver's occupancy of the compiled kernel), or, where the caller gives
    none, the thread limit alone (``sm_threads // block``, all that the
    planners assumed before they asked the driver); at least 1."""
    per_sm = sm_threads // block if blocks_per_sm is None else blocks_per_sm(kernel, block)
    return max(1, per_sm)


def plan_rows(rows, n, width, family, sms, sm_threads, div=1, kind=0, suffix="",
              blocks_per_sm=None):
    """The ``Plan`` of a reduction of each contiguous row of n elements:
    ``width`` elements per 16-byte packet, ``family`` "sum", "max", "min"
    or "pick" (argmax), ``sms`` and ``sm_threads`` the device's
    multiprocessors and threads per multiprocessor, ``div`` the count a mean
    divides by (1: a sum), ``kind`` the code of ``PICK_KINDS`` (read by
    "pick" alone), ``suffix`` the kernels' ("_wide": a sum in the compute
    format), ``blocks_per_sm`` a function of a kernel's name and block size
    giving the blocks of it that one multiprocessor holds at once (None:
    ``sm_threads // block``, the threads' limit alone; ``_per_sm``).  Each
    rule below counts the resident blocks of the kernel it chooses.

    * n <= THREAD_ROW: ``*_thread``, a thread per row (``_plan_short_rows``).
    * n <= SHORT_ROW: ``*_lanes``, a group of lanes per row (a warp per row
      would leave most lanes idle; ``_plan_short_rows``).
    * rows enough for half the resident warps of ``*_rows``: that kernel, a
      warp per row; each keeps ROW_UNROLL 16-byte loads in flight.
    * fewer rows: ``*_long``, a block per (row, chunk), with as many chunks
      as one wave of the kernel's resident blocks holds (few rows could not
      hide memory latency otherwise: a 1-D array to a scalar is one row),
      each chunk at least one full trip of the block's loads.  One wave,
      rows * chunks <= resident: every chunk is the same work, so a block
      beyond the wave would run alone in a second one, as long as the first
      (a grid sized by the threads' 8 blocks a multiprocessor ran in two
      waves where the kernel's 64 registers hold 4).  Unless a warp per row
      waits on no more rounds of loads (``_rounds``): rows short enough for
      a trip or two of a warp's loads keep ``*_rows``, where a block per row
      would leave most of its threads idle over several waves."""
    if n <= SHORT_ROW:
        return _plan_short_rows(rows, n, family, sms, div, kind, suffix)
    args = (rows, n, n, 1, div, kind)                      # one chunk: the row
    kernel = f"{family}_rows{suffix}"
    resident = sms * _per_sm(blocks_per_sm, kernel, BLOCK, sm_threads)
    warps_per_block = BLOCK // 32
    long_kernel = f"{family}_long{suffix}"
    long_resident = sms * _per_sm(blocks_per_sm, long_kernel, BLOCK, sm_threads)
    trip = BLOCK * width * ROW_UNROLL
    # one wave: rows * chunks <= resident
    chunks = max(1, min(long_resident // rows, -(-n // trip)))
    chunk = -(-n // chunks)
    chunk += -chunk % width                                # chunk starts stay aligned
    chunks = -(-n // chunk)
    if 2 * rows >= resident * warps_per_block or \
            _rounds(1, n, 32 * width * ROW_UNROLL, 1) <= _rounds(rows * chunks, chunk, trip,
                                                                 long_resident, chunks > 1):
        grid = max(1, min(-(-rows // warps_per_block), 4 * resident))
        return Plan(Launch(kernel, grid, args, BLOCK), 0, 0)
    grid = max(1, min(rows * chunks, 4 * long_resident))
    launch = Launch(long_kernel, grid, (rows, n, chunk, chunks, div, kind), BLOCK)
    if chunks == 1:
        return Plan(launch, 0, 0)
    return Plan(launch, rows * chunks * _state(family, width), rows)


def _rounds(tasks, length, trip, resident, combine=False):
    """Rounds of memory latency that ``tasks`` tasks of ``length`` elements
    wait through when each moves ``trip`` elements a round and ``resident``
    of them run at once (waves times trips), one more where a second stage
    combines them (``combine``): what ``plan_rows`` weighs between a warp
    per row (its warps all resident: one wave) and a block per chunk."""
    return -(-tasks // resident) * -(-length // trip) + int(combine)


def plan_one(size, width, family, sms):
    """The ``Plan`` of a reduction with nothing to reduce (``layout``'s
    ``("rows", (size, 1))``: every reduced axis of extent 1), in ``family``
    (``plan_rows``'s; "pick" for argmax): ``*_one``, each output from its
    one input as NumPy gives it: max and min copy it bit for bit (NaN and
    -0.0 included), a sum (a mean divides by 1) adds it to the identity
    +0.0 (-0.0 gives 0.0, NaN stays NaN), argmax writes index 0.  A grid
    as the elementwise kernels' (``PyCudaHandler._grid``): a 16-byte
    packet of ``width`` elements a thread, at most MAX_BLOCKS_PER_SM
    blocks per multiprocessor (the kernel strides over the rest).  The
    kernel's occupancy does not enter: that cap is the elementwise
    kernels' (and the one-call path's), a grid-stride one that gives every
    block the same share, not a wave whose last blocks would run alone.  A
    kernel rather than a device copy: the one-call path launches it from C
    like every other plan (a copy or fill from Python cost 20-23 us a call
    on an H200, against torch's 12-15)."""
    grid = max(1, min(-(-size // (BLOCK * width)), MAX_BLOCKS_PER_SM * sms))
    return Plan(Launch(f"{family}_one", grid, (size,), BLOCK), 0, 0)


def lane_group(n):
    """Lanes of a ``*_lanes`` group for rows of n elements (THREAD_ROW < n
    <= SHORT_ROW): the least power of 2 whose lanes hold the row at 2
    elements a lane.  The plan passes it as the kernel's third number
    (reduce.cu's lanes_impl takes it from there)."""
    group = 1
    while 2 * group < n and group < 32:
        group *= 2
    return group


def _plan_short_rows(rows, n, family, sms, div, kind, suffix, inner=1):
    """The plan of rows of n <= SHORT_ROW elements (``plan_rows``'s
    arguments): ``*_thread``, a thread per row, THREAD_UNROLL rows a
    thread, up to THREAD_ROW elements; ``*_lanes`` beyond, a group of
    ``lane_group(n)`` lanes per row (the launch's third number), 32 / group
    rows a warp and LANE_UNROLL trips in flight.  A grid as ``plan_one``'s: enough blocks for every
    row, at most MAX_BLOCKS_PER_SM a multiprocessor (the kernel strides
    over the rest, every block the same share: no wave to fit).  With
    ``inner`` > 1 (``_plan_short``'s), a row's elements are ``inner``
    apart, the (outer, n, inner) slabs' columns, ``rows`` counts the
    outputs, outer * inner, and the kernel is ``*_stride`` (``*_thread``
    with that stride as its third number), or ``*_walk`` past THREAD_ROW
    elements (the same in trips)."""
    if n <= THREAD_ROW or inner > 1:
        kind_name = "thread" if inner == 1 else "stride" if n <= THREAD_ROW else "walk"
        kernel, per_block, third = f"{family}_{kind_name}{suffix}", BLOCK * THREAD_UNROLL, inner
    else:   # the kernel takes its group from the plan: one rule, here
        kernel, third = f"{family}_lanes{suffix}", lane_group(n)
        per_block = BLOCK // third * LANE_UNROLL
    grid = max(1, min(-(-rows // per_block), MAX_BLOCKS_PER_SM * sms))
    return Plan(Launch(kernel, grid, (rows, n, third, 1, div, kind), BLOCK), 0, 0)


def _plan_short(outer, n, inner, family, sms, sm_threads, div, kind, suffix, blocks_per_sm):
    """The plan of small (n, inner) slabs (n * inner <= SHORT_TILE).

    A reduced axis of n <= THREAD_ROW takes ``*_stride``, a thread per
    output reading its n elements ``inner`` apart (the kernel's third
    number), as ``*_thread`` takes rows of that length: a warp's load then reads 32
    adjacent outputs' elements, and no tile or barrier stands between the
    loads and the sums.  Longer axes take ``*_short``: tiles of whole slabs
    in shared memory, the kernel's third number ``inner``; a block per
    tile, at most one wave of the kernel's resident blocks (it strides over
    the rest: blocks beyond the wave would only wait for a slot, 64
    registers and 8 KB of shared memory hold 4 of 256 threads).  Slabs of
    at most SLAB_COLS columns and SLAB_LEAST elements or more take
    ``*_slab`` instead: a warp a slab, which it reads as one contiguous run,
    each lane a column's elements (a tile of one such slab left most of a
    block's lanes idle on its few outputs: ``argmax_t`` of (4774, 709, 2)
    over axis 1 took 37 us on an H200 against torch's 28), as many warps as
    slabs, at most a wave of the kernel's resident blocks (the warps
    stride over the rest).  Slabs of at most WALK_COLS columns whose axis
    has at most WALK_MOST elements take ``*_walk``, ``*_stride`` in trips
    (the kernel's third number ``inner``), before either: a warp or a tile
    of such a slab leaves most lanes a load or two."""
    if n <= THREAD_ROW or (inner <= WALK_COLS and n <= WALK_MOST):
        return _plan_short_rows(outer * inner, n, family, sms, div, kind, suffix, inner)
    if inner <= SLAB_COLS and n * inner >= SLAB_LEAST:
        kernel, count = f"{family}_slab{suffix}", -(-outer // (BLOCK // 32))
    else:
        kernel, count = f"{family}_short{suffix}", -(-outer // (SHORT_TILE // (n * inner)))
    grid = max(1, min(count, sms * _per_sm(blocks_per_sm, kernel, BLOCK, sm_threads)))
    return Plan(Launch(kernel, grid, (outer, n, inner, 1, div, kind), BLOCK), 0, 0)


def _state(family, width):
    """Bytes of one partial state: a sum's, a max's or a min's one value in
    the compute format (float for the halves, whose packets hold 8); a
    pick's (value, index) that value and a 32-bit index, aligned to 8 or
    16 (reduce.cu's Pick::S: 8 bytes, or 16 for double), a pick64's 16."""
    value = 4 if width >= 4 else 8
    if family == "pick64":
        return 16
    return 2 * value if family == "pick" else value


def family_of(kind):
    """The kernel family of an extreme (``PICK_KINDS``'s keys): max and min
    keep the value alone, argmax a value and its index ("pick")."""
    return kind if kind in ("max", "min") else "pick"


def scalar_cols(width):
    """Columns a thread of ``*_cols`` reads for packets of ``width``
    elements (reduce.cu's kScalarCols, every family's): the packet's, at
    most SCALAR_COLS; one for double (width 2), whose loads of 8 bytes
    already hold as many bytes in flight as a packet trip."""
    return 1 if width <= 2 else min(width, SCALAR_COLS)


def _tile(cols, n, trip, rows_first=False):
    """(tx, ty) of a column kernel's block: tx threads across ``cols``
    thread columns, ty down ``n`` rows, each giving ``trip`` rows a trip.
    Lanes go first where memory is contiguous: across the columns (at most
    32: a warp reads one contiguous run), or with ``rows_first`` down the
    rows (``plan_gen``'s layouts that end with reduced axes), as many as
    give each ``trip`` rows.  Then the rest of the block widens the other way
    (an axis too short for ty rows of two trips each gives its threads to
    the columns, down to ty = 1: a thread of one trip waits on its loads
    once, then on the combine down the block.  On an H200, ``min_t`` over the
    13 rows of (3, 13, 1619410) took 102 us with ty = 4, 75 with ty = 1;
    over the 17 of (2, 17, 155759) 15.7 us with ty = 8, 12.0 with 2; over the
    42 of (42, 322763) 23.5 with ty = 8, 20.6 with 4:
    ``benchmarks/results/diagnostics/cols_tiles-NVIDIA-H200.log``)."""
    if rows_first:
        ty = min(BLOCK, _pow2(-(-n // trip)))
    else:
        two_trips = max(1, n // (2 * trip))
        ty = max(1, min(_deepest(cols, False), 1 << (two_trips.bit_length() - 1)))
    tx = min(BLOCK // ty, _pow2(cols))
    return tx, BLOCK // tx


def _deepest(cols, rows_first):
    """The most rows (ty) a column kernel's tile of ``cols`` thread columns
    takes (``_tile``'s): the whole block with ``rows_first``, else what a
    warp's run across the columns leaves.  Only a tile that deep is split
    into chunks of rows (``_chunking``): a shallower one has rows for at
    most two trips a thread."""
    return BLOCK if rows_first else BLOCK // min(32, _pow2(cols))


def _chunking(base, n, ty, trip, sms, sm_threads, per_sm, deep=True):
    """(chunk, chunks) of a column kernel's n rows, ``base`` tasks before
    chunking, the kernel ``per_sm`` resident blocks a multiprocessor
    (``_per_sm``): too few tasks to give every multiprocessor a wave of
    the kernel's resident blocks, at most a quarter of the blocks its
    threads allow, split the rows, each chunk whole trips of the block's
    rows (the kernel's fast loop), only where the tile is ``deep``
    (``_deepest``).  At most one wave: more would wait for a second (8
    blocks a multiprocessor, two waves, took (100929, 233) over axis 0
    from 35.3 to 54.1 us).  At most a quarter of the threads' blocks (2 of
    8 on an H200): the last block of each tile combines the tile's chunks
    alone, so every chunk lengthens that tail, and 2 blocks a
    multiprocessor still keep enough loads in flight.  On an H200 a wave
    of 2 beat one of 4 on 19 of 24 random-set cases whose plan it changes
    and on the tuned shapes (``sum_t`` (100929, 233) over axis 0 35.3 to
    32.8 us, ``argmax_t`` of (1, 8192, 414) over axis 1 27.0 to 19.1,
    (17, 307, 2198) over axis 1 20.3 to 15.1, 1Mx16 over axis 0 23.3 to
    22.3); it lost by 1-10% on long axes over 3-7 columns (``min_t`` of
    (13811154, 3) over axis 0 46.6 to 51.2 us;
    ``benchmarks/results/diagnostics/cols_wave-NVIDIA-H200.log``)."""
    target = sms * min(per_sm, sm_threads // BLOCK // 4)
    chunks = 1
    if base < target and deep:
        chunks = max(1, min(-(-target // base), n // (ty * trip)))
    chunk = -(-n // chunks)
    if chunks > 1:
        chunk += -chunk % (ty * trip)
    return chunk, -(-n // chunk)


def plan_cols(outer, n, inner, aligned, width, family, sms, sm_threads, div=1, kind=0,
              suffix="", blocks_per_sm=None):
    """The ``Plan`` of a reduction over the middle axis of an (outer, n,
    inner) view, inner > 1 (arguments as ``plan_rows``'s; ``aligned``:
    whether the input starts on 16 bytes).

    A block of tx * ty threads (``_tile``): tx across the columns, ty down
    the rows, each thread with UNROLL loads in flight a trip (SUM_UNROLL;
    argmax's (value, index) pairs take PICK_UNROLL).  Where every row starts
    on 16 bytes (``aligned`` and inner a multiple of the packet), a thread
    reads a packet of adjacent columns (``*_cols_vec``: UNROLL rows a trip);
    elsewhere it reads ``scalar_cols`` columns tx apart with scalar loads
    (``*_cols``: UNROLL / columns rows a trip), so that each load of a warp
    is still 32 consecutive elements and a thread keeps as many loads in
    flight as one column of UNROLL rows did, in fewer rows: a short axis (42
    rows) fills its first trip instead of trickling through single-row
    trips.  Scalar columns beat peeling each row to alignment here: the
    rows' misalignment changes from row to row, a peel per row per thread
    would cost a branch a row, and the strided columns need none.  tx is at
    most 32, unless the axis is too short to give ty rows a trip each: then
    the block widens across the columns, down to ty = 1 (every thread
    reads its whole column in one trip, no partials to combine).  Slabs of
    n * inner <= SHORT_TILE elements go to ``_plan_short`` instead (a
    thread an output, or many slabs to a block's tile: a block per tiny
    tile would wait on latency, not bandwidth).  Too
    few tiles for the device split the rows into chunks (``_chunking``: up
    to a wave of the kernel's resident blocks, at most 2 per SM on an H200,
    where 2 blocks per SM beat 4, and 4 beat 8, on 8192x4096 and 1Mx16
    over axis 0)."""
    if n * inner <= SHORT_TILE:   # small slabs: a tile holds many of them
        return _plan_short(outer, n, inner, family, sms, sm_threads, div, kind, suffix,
                           blocks_per_sm)
    unroll = PICK_UNROLL if family.startswith("pick") else SUM_UNROLL
    vec = aligned and inner % width == 0
    per = width if vec else scalar_cols(width)   # columns a thread
    trip = unroll if vec else unroll // per           # rows a trip
    cols = -(-inner // per)
    tx, ty = _tile(cols, n, trip)
    tiles = -(-cols // tx)
    base = outer * tiles
    kernel = f"{family}_cols{'_vec' if vec else ''}{suffix}"
    chunk, chunks = _chunking(base, n, ty, trip, sms, sm_threads,
                              _per_sm(blocks_per_sm, kernel, BLOCK, sm_threads),
                              ty == _deepest(cols, False))
    launch = Launch(kernel, max(1, min(base * chunks, sms * 32)),
                    (outer, n, inner, chunk, chunks, div, tx, kind), BLOCK)
    if chunks == 1:
        return Plan(launch, 0, 0)
    return Plan(launch, outer * chunks * inner * _state(family, width), base)


def plan_mid(A, M, inner, aligned, width, sms, sm_threads, div=1, suffix="",
             blocks_per_sm=None):
    """The ``Plan`` of the sum over A and I of an (A, M, I) view in one pass
    (the kernels ``sum_mid*``), or None when a run of I is too long for the
    kernel's 32-bit offsets (the caller then takes one axis at a time).
    Arguments as ``plan_cols``'s.

    A block per column, its size the device's threads shared among the M
    columns (``mid_block``).  Few columns take blocks of 1024 threads,
    half the kernel's resident blocks per multiprocessor (at least one):
    each column's A * I elements are split into chunks only as far as M
    columns alone leave multiprocessors idle (one block on an H200 either
    way: ``sum_mid`` takes 32 registers a thread, 2 blocks, float64's
    packets 40, 1).  Few, large blocks beat many small ones there because a
    chunked sum ends with a second stage (partials, a fence, an atomic, a
    last block's reads) that a short call cannot hide: on an H200, (64, 128,
    32, 32) took 10.7 us in a graph as 128 blocks of 1024 against 11.4 us
    as 1024 blocks of 256 (8 per SM), where a plain contiguous read of the
    same bytes took 10.0 us."""
    vec = width if aligned and inner % width == 0 else 1
    packets = inner // vec
    if packets >= 2**31:
        return None
    total = A * packets
    unroll = 8 if vec == 8 else 16 // vec
    kernel = f"sum_mid{'_vec' if vec > 1 else ''}{suffix}"
    block = mid_block(M, sms, sm_threads)
    chunks = 1
    if block == MID_BLOCK:
        per_sm = max(1, _per_sm(blocks_per_sm, kernel, MID_BLOCK, sm_threads) // 2)
        chunks = max(1, min(round(sms * per_sm / M), total // (MID_BLOCK * unroll)))
    chunks = max(chunks, -(-total // (2**31 - 1)))
    chunk = -(-total // chunks)
    chunks = -(-total // chunk)
    launch = Launch(kernel, max(1, min(M * chunks, sms * 32)), (A, M, inner, chunk, chunks, div),
                    block)
    if chunks == 1:
        return Plan(launch, 0, 0)
    return Plan(launch, M * chunks * _state("sum", width), M)


def mid_block(M, sms, sm_threads):
    """Threads per block of ``sum_mid*`` for M columns: the device's
    threads (``sms * sm_threads``) shared among the columns, rounded down to
    a power of 2, from a warp to MID_BLOCK.  Many columns (the kernel's
    block per column) fill the device with small blocks, so each thread
    keeps several loads in flight and a block's join is short; 1024-thread
    blocks there left most threads idle or waiting on the join.  On an H200
    (``benchmarks/results/diagnostics/mid_layouts.py``), (127, 4096, 8)
    took 39.9 us in blocks of 1024 and 11.5 in blocks of 64 (PyTorch 14.1);
    (64, 256, 49), whose 256 columns take blocks of 1024 by this rule, 7.2
    us against 9.5 in blocks of 256."""
    share = max(1, sms * sm_threads // M)
    return max(32, min(MID_BLOCK, 1 << (share.bit_length() - 1)))


def _int32(x):
    """x modulo 2^32 as a signed 32-bit int (an ``i`` argument): the kernels
    add offsets modulo 2^32, which is exact wherever the true sum is below
    2^31."""
    return (x + 2**31) % 2**32 - 2**31


def gen_args(extents, reduced, ty):
    """The trailing arguments of ``sum_gen*`` after ``kind`` (reduce.cu's
    GenArgs, in order) for the merged ``extents`` (contiguous) reduced over
    the merged axes ``reduced``, walked ty rows a step: yfast (1 where the
    layout ends with a reduced run, whose rows are then contiguous); the
    kept runs' extents (all but the outermost) and strides, innermost first;
    the same of the reduced runs; ty's digits in the reduced runs' radices
    (the outermost takes the quotient), the offset each digit's wrap adds
    (rs[i + 1] - re[i] * rs[i]) and the step's offset.  Runs are padded to
    GEN_RUNS with extent 1 and stride 0."""
    strides = [math.prod(extents[i + 1:]) for i in range(len(extents))]
    kept = [i for i in range(len(extents)) if i not in reduced]

    def runs(axes):
        ext = [extents[i] for i in reversed(axes)] + [1] * (GEN_RUNS - len(axes))
        st = [strides[i] for i in reversed(axes)] + [0] * (GEN_RUNS - len(axes))
        return ext, st

    ke, ks = runs(kept)
    re, rs = runs(reduced)
    sd, q = [], ty
    for e in re[:-1]:
        sd.append(q % e)
        q //= e
    soff = sum(d * st for d, st in zip(sd + [q], rs))
    wr = [rs[i + 1] - re[i] * rs[i] for i in range(GEN_RUNS - 1)]
    yfast = int(reduced[-1] == len(extents) - 1)
    return (yfast, *ke[:-1], *ks, *re[:-1], *rs, *sd, *map(_int32, wr), _int32(soff))


def plan_gen(extents, reduced, aligned, width, family, sms, sm_threads, div=1, kind=0,
             suffix="", blocks_per_sm=None):
    """The ``Plan`` of a ``passes`` layout (``layout``'s merged ``extents``
    and ``reduced`` axes) in one launch of ``sum_gen*``, or None where the
    kernel does not take it: more than GEN_RUNS merged runs of either kind,
    2^31 elements or more (its offsets are 32-bit), a family other than
    "sum" (max_t and min_t take one axis, never such a layout) or a wide
    sum (the passes' own).  Other arguments as ``plan_cols``'s.

    The kernel is the column kernel of ``plan_cols`` with general offsets:
    a column is an output element (the kept runs, in order) and a row a flat
    index into the reduced runs, which each thread walks ty rows a step by
    digits (adds and compares, no division; ``gen_args``).  A block of tx *
    ty threads (``_tile``, GEN_UNROLL rows a trip) puts its lanes where
    memory is contiguous: across consecutive outputs where kept axes end
    the layout (packets of them where their extent allows, as
    ``*_cols_vec``), down consecutive rows where reduced axes do (then a
    warp of a long reduction reads a contiguous run, and many short ones
    share a block).  An output's rows are split into chunks only where the
    outputs leave the device idle (``_chunking``), finished in the same
    launch: one launch replaces a pass per merged run of reduced axes and
    its intermediate arrays."""
    if family != "sum" or suffix or math.prod(extents) >= 2**31:
        return None
    kept = [i for i in range(len(extents)) if i not in reduced]
    if len(kept) > GEN_RUNS or len(reduced) > GEN_RUNS:
        return None
    outputs = math.prod(extents[i] for i in kept)
    n = math.prod(extents[i] for i in reduced)
    ends_kept = kept[-1] == len(extents) - 1
    vec = ends_kept and aligned and extents[-1] % width == 0
    per = width if vec else 1
    tx, ty = _tile(outputs // per, n, GEN_UNROLL, rows_first=not ends_kept)
    tiles = -(-outputs // (tx * per))
    kernel = f"sum_gen{'_vec' if vec else ''}"
    chunk, chunks = _chunking(tiles, n, ty, GEN_UNROLL, sms, sm_threads,
                              _per_sm(blocks_per_sm, kernel, BLOCK, sm_threads),
                              ty == _deepest(outputs // per, not ends_kept))
    launch = Launch(kernel, max(1, min(tiles * chunks, sms * 32)),
                    (1, n, outputs, chunk, chunks, div, tx, kind)
                    + gen_args(extents, reduced, ty), BLOCK)
    if chunks == 1:
        return Plan(launch, 0, 0)
    return Plan(launch, chunks * outputs * _state(family, width), tiles)


def plan(shape, axes, aligned, width, family, sms, sm_threads, div=1, kind=0, suffix="",
         blocks_per_sm=None):
    """The ``Plan`` of a reduction of ``shape`` over ``axes`` (a sorted tuple
    in range) in one launch, or None where it takes several passes (``layout``
    says which; ``plan_mid`` and ``plan_gen`` may decline too).  Other
    arguments as ``plan_cols``'s (``blocks_per_sm`` as ``plan_rows``'s).
    Pure: the handler caches it per combination, and gives its kernels'
    occupancy as ``blocks_per_sm`` (the function ``blocks_per_sm`` below).
    Argmax ("pick") keeps 32-bit indices where the reduced extent allows
    (every index and every offset from a chunk's start below 2^31) and
    takes ``pick64`` beyond.  Nothing to reduce is ``plan_one``
    (no wide form: a pass never reduces an axis of extent 1, and a wide
    plan of one takes ``*_thread_wide``, right if slower)."""
    form, dims = layout(shape, axes)
    if form == "rows" and dims[1] == 1 and not suffix:
        return plan_one(dims[0], width, family, sms)
    if family == "pick" and form in ("rows", "cols") and dims[1] > PICK32_EXTENT:
        family = "pick64"
    if form == "rows":
        return plan_rows(*dims, width, family, sms, sm_threads, div, kind, suffix, blocks_per_sm)
    if form == "cols":
        return plan_cols(*dims, aligned, width, family, sms, sm_threads, div, kind, suffix,
                         blocks_per_sm)
    if form == "mid" and family == "sum":
        return plan_mid(*dims, aligned, width, sms, sm_threads, div, suffix, blocks_per_sm)
    if form == "passes":
        return plan_gen(*dims, aligned, width, family, sms, sm_threads, div, kind, suffix,
                        blocks_per_sm)
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
                                         h._sms, h._sm_threads, div, kind, suffix,
                                         h._blocks_per_sm(form))
    return found


def resident(h, kernel, block):
    """Blocks of ``block`` threads of ``kernel`` (a loaded ``Kernel``) that
    one multiprocessor holds at once, as the driver counts them for the
    compiled kernel (``kernel_loader.blocks_per_sm``): asked once per kernel
    and block size, then cached in ``h._occupancy``.  The reduction
    planners ask through ``blocks_per_sm``; the fused row kernels with
    summed outputs directly (``elementwise.fused_arguments``)."""
    key = (kernel.handle, block)
    found = h._occupancy.get(key)
    if found is None:
        found = h._occupancy[key] = kernel_loader.blocks_per_sm(kernel, block, h._sm_threads)
    return found


def blocks_per_sm(h, form="TT"):
    """The planners' ``blocks_per_sm`` for the kernels of ``form``
    (``sum_kernels``'s: "CC" plans the float32 kernels of ``h._k32``, the
    others ``h._k``): a function of a kernel's name and block size giving
    the blocks of it that one multiprocessor holds at once (``resident``;
    each format's kernels are its own)."""
    table = h._k32 if form == "CC" else h._k
    return lambda kernel, block: resident(h, table[kernel], block)


#: The reductions that take the one-call path: ``OneCall.sum`` launches any
#: remembered plan, whatever its family (every reduction kernel takes the
#: input, a workspace, the output, counters, then its plan's numbers)
ONE_CALL_OPS = ("sum_t", "mean_t", "max_t", "min_t", "argmax_t")


def one_call_op(name):
    """PyCudaHandler's method ``name`` (one of ``ONE_CALL_OPS``): a
    combination of shapes, axis and alignment seen before is one C call
    (``OneCall.sum``: no Python checks or planning, 5-7 us where the Python
    path takes 12-21 us), chunked plans included (on the slot's fixed
    scratch, see ``one_call_scratch``); any other, or one whose launch
    ``remember`` kept in Python, runs the contract's method (checks that
    raise on bad input, the engine's plan and launch), then ``remember``."""
    contract = getattr(Handler, name)

    def op(self, a, axis, out):
        launches = self._reduce_launches[name]
        if self._one_call.sum(launches, a, axis, out):
            return
        contract(self, a, axis, out)
        if shape_rules.plain_axis(axis):
            remember(self, name, a, axis, out)
    op.__name__, op.__qualname__ = name, f"PyCudaHandler.{name}"
    op.__doc__ = contract.__doc__
    return op


def remember(h, name, a, axis, out):
    """Store the launch of a combination of reduction ``name`` that has just
    passed its checks, for the one-call path: (function, grid, fmt,
    trailing args, block, workspace bytes, counters), the last two 0 but
    for a chunked plan, to which ``OneCall.sum`` passes its slot's fixed
    scratch (a stored launch holds no address: views of other stream groups
    share these launches, each on its own slot's scratch).  Or None, so that
    it stays in Python: nothing to launch (an empty input or output),
    several passes, a chunked plan that needs more scratch than
    ``one_call_scratch`` gives, or a kernel of more arguments than the
    one-call path takes (``sum_gen*``).  A reduced extent of 1 is stored as
    any other: its plan is ``plan_one``'s copy or fill.  Once per
    combination."""
    aligned = int(a.gpudata) % 16 == 0 if a.size else True
    key = (a.shape, axis, out.shape, aligned)
    launches = h._reduce_launches[name]
    if key in launches:
        return
    checked = shape_rules.checked_axis(a, axis, out, name)
    n = shape_rules.reduced_size(a.shape, checked)
    found = None
    if a.size and out.size:
        kind = name[:-2]   # "sum", "mean", "max", "min", "argmax"
        if kind in ("sum", "mean"):
            found = _planned(h, "sum", a, checked, div=n if kind == "mean" else 1)
        else:
            found = _planned(h, family_of(kind), a, checked, kind=PICK_KINDS[kind])
    launch = None
    nbytes, counters = one_call_scratch(h._sms, h._sm_threads)
    if found and 4 + len(found.launch.args) <= ONE_CALL_PARAMS \
            and found.workspace <= nbytes and found.counters <= counters:
        first = found.launch
        fn = h._k[first.kernel]
        launch = (fn.handle, first.grid, fn.fmt, first.args, first.block, found.workspace,
                  found.counters)
    launches[key] = launch


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
    h._run_reduction(_planned(h, family_of(kind), a, axis, kind=PICK_KINDS[kind]), a, out)


def sum_t(h, a, axis, out):
    """The sum_t hook: one launch, or passes over separate runs of axes
    beyond ``plan_gen``'s."""
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
