"""The reduction engine's planner (``handlers.cuda.reductions``) on the CPU:
``layout`` and the plans are pure functions of shapes and device facts, so
they are checked here without a GPU (the GPU runs the kernels in
``test_ops.py`` and ``test_reductions_random.py``).

What must hold: the canonical layout reduces exactly what NumPy reduces (an
independent check: reshaping by the layout and reducing gives NumPy's
result); a plan's chunks cover the reduced axis with none empty; chunk
starts of the row kernels stay 16-byte aligned; a chunked plan asks for the
partials and counters its second stage reads, in the size of its family's
state (a max's or a min's one value, an argmax's 16 bytes); the kernel is
one of the table's and gets as many arguments as its format says; the
general kernel's walk (``sum_gen*``: digits and carries, simulated here from
the plan's arguments as reduce.cu's GenIx does it) reaches exactly the
elements NumPy reduces for each output; the numbers the host copies from
the kernels' sources agree with them; and the plans that earlier tuning
fixed on an H200 stay as they were.

Grids follow each kernel's occupancy (the blocks of it one multiprocessor
holds at once, which the handler asks the driver for), so the plans are
checked under several (``OCCUPANCIES``): a grid meant as one wave (``*_long``
chunks, ``*_short`` tiles) never exceeds the chosen kernel's resident blocks,
the column kernels chunk up to a wave of theirs, and where the occupancy is
the threads' limit (8 blocks of 256 on an H200, what the planners assumed
before they asked) the plans are those of before, one deliberate change
aside (``test_long_rows_take_one_wave``)."""
import math
import re
from pathlib import Path

import numpy as np
import pytest

from handlers.cuda import reductions as R
from handlers.cuda.launch import (
    BLOCK,
    LANE_UNROLL,
    MAX_BLOCKS_PER_SM,
    MID_BLOCK,
    SHORT_ROW,
    THREAD_ROW,
    THREAD_UNROLL,
)
from handlers.optable import KERNELS

SOURCES = Path(R.__file__).resolve().parent

DEVICES = ((132, 2048), (78, 2048), (108, 2048), (16, 1536))   # (sms, threads per SM)
EXTENTS = (1, 1, 2, 3, 5, 7, 31, 32, 33, 127, 1000, 4097, 70001)
#: Resident blocks per SM of the reduction kernels on an H200 (sm_90,
#: float32), from ptxas's registers: 64 a thread hold 4 blocks of 256, 48
#: hold 5; the column kernels are bound to 4 (an argmax's packets of halves
#: to 3, which ``_blocks`` gives every ``pick_cols_vec``); sum_mid's
#: 1024-thread blocks of 32 registers hold 2; the walks' 64 (an argmax's
#: 79: 3 blocks) hold 4
H200_BLOCKS = {"thread": 6, "stride": 4, "lanes": 4, "short": 4, "slab": 6, "rows": 5,
               "long": 4, "cols": 4, "gen": 4, "mid": 2, "one": 6, "walk": 4}
#: The occupancies the plans are checked under: "threads", the threads'
#: limit alone (sm_threads // block: the planners' default, their rule before
#: they asked the driver); a number, that many blocks of every kernel (at
#: most the threads' limit); "h200", H200_BLOCKS
OCCUPANCIES = ("threads", 4, 3, 1, "h200")


def _blocks(spec, sm_threads):
    """The planners' ``blocks_per_sm`` (kernel name, block size -> resident
    blocks per SM) of occupancy ``spec`` (``OCCUPANCIES``) on a device of
    ``sm_threads`` threads per SM, and every kernel it is asked about."""
    def blocks(kernel, block):
        asked.append((kernel, block))
        limit = sm_threads // block
        if spec == "threads":
            return limit
        if spec == "h200":
            kind = kernel.split("_")[1]
            return min(limit, 3 if kernel.startswith("pick_cols_vec") else H200_BLOCKS[kind])
        return min(limit, spec)
    asked = []
    blocks.asked = asked
    return blocks


def _case(rng):
    """A random shape (rank 1 to 4) and a random sorted tuple of its axes."""
    ndim = int(rng.integers(1, 5))
    shape = tuple(int(rng.choice(EXTENTS[:10])) for _ in range(ndim))
    axes = tuple(sorted(set(int(x) for x in rng.integers(0, ndim, int(rng.integers(1, ndim + 1))))))
    return shape, axes


def _reduce_by_layout(x, axes):
    """x summed over ``axes`` the way the layout says the kernels do it."""
    form, dims = R.layout(x.shape, axes)
    if form == "rows":
        return x.reshape(dims).sum(axis=1)
    if form == "cols":
        return x.reshape(dims).sum(axis=1)
    if form == "mid":
        return x.reshape(dims).sum(axis=(0, 2))
    extents, reduced = dims
    return x.reshape(extents).sum(axis=reduced)


def test_the_layout_reduces_what_numpy_reduces(rng):
    for _ in range(500):
        shape, axes = _case(rng)
        x = rng.standard_normal(shape)
        want = x.sum(axis=axes).reshape(-1)
        got = _reduce_by_layout(x, axes).reshape(-1)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"{shape} {axes}")


def test_the_layout_drops_size_one_axes_and_merges():
    # the issue's cases: a mean over (0, 2, 3) of (6, 1, 3, N) is a total
    assert R.layout((6, 1, 3, 2753005), (0, 2, 3)) == ("rows", (1, 6 * 3 * 2753005))
    assert R.layout((81, 1, 16960, 3), (3,)) == ("rows", (81 * 16960, 3))
    assert R.layout((12, 11135, 344), (0,)) == ("cols", (1, 12, 11135 * 344))
    assert R.layout((64, 128, 32, 32), (0, 2, 3)) == ("mid", (64, 128, 1024))
    assert R.layout((8, 1, 1), (1, 2)) == ("rows", (8, 1))        # a copy
    assert R.layout((2, 3, 4, 5), (0, 2)) == ("passes", ((2, 3, 4, 5), (0, 2)))


def _check(plan, n, width):
    """The invariants of one plan whose reduced extent is n (``width``
    elements per packet)."""
    launch = plan.launch
    assert launch.kernel in KERNELS, launch.kernel
    assert len(KERNELS[launch.kernel][1]) == 4 + len(launch.args)
    mid = launch.kernel.startswith("sum_mid")
    assert launch.grid >= 1 and (mid or launch.block in (256, 1024))
    if mid:
        A, M, inner, chunk, chunks, _ = launch.args
        total = A * (inner // (width if "_vec" in launch.kernel else 1))
        assert chunk < 2**31 and (chunks - 1) * chunk < total <= chunks * chunk
        # a power of 2 from a warp to MID_BLOCK (the kernel takes any multiple
        # of 32); blocks under MID_BLOCK split a column only past 32-bit offsets
        block = launch.block
        assert 32 <= block <= MID_BLOCK and block & (block - 1) == 0
        assert block == MID_BLOCK or chunks == -(-total // (2**31 - 1))
    elif launch.kernel.endswith("_one"):   # nothing to reduce: its elements
        assert n == 1 and len(launch.args) == 1
    elif "_cols" in launch.kernel or "_gen" in launch.kernel:
        outer, m, inner, chunk, chunks, _, tx, _ = launch.args[:8]
        assert m == n and 256 % tx == 0
        assert (chunks - 1) * chunk < n <= chunks * chunk
        if chunks > 1:   # whole trips of the block's rows (the kernel's fast loop)
            assert chunk % (256 // tx * _trip(launch.kernel, width)) == 0
    else:
        rows, m, chunk, chunks, _, _ = launch.args
        assert m == n
        if chunks > 1:
            assert launch.kernel.split("_")[1] == "long"
            assert (chunks - 1) * chunk < n <= chunks * chunk and chunk % 2 == 0
    columns = any(k in launch.kernel for k in ("_cols", "_mid", "_gen"))
    chunked = len(launch.args) > 1 and launch.args[4 if columns else 3] > 1
    assert (plan.counters > 0) == chunked and (plan.workspace > 0) == chunked
    # the one-call path takes every plan but the general kernel's (remember
    # keeps a plan of more arguments in Python)
    assert "_gen" in launch.kernel or 4 + len(launch.args) <= R.ONE_CALL_PARAMS


def _check_occupancy(plan, width, sms, sm_threads, blocks):
    """The occupancy rules of one plan on a device of ``sms`` SMs of
    ``sm_threads`` threads whose kernels hold ``blocks(kernel, block)``
    blocks each per SM (what the planner was given): each rule counts the
    resident blocks of the kernel it launches."""
    launch = plan.launch
    kind = launch.kernel.split("_")[1]
    resident = sms * blocks(launch.kernel, launch.block)
    if kind in ("thread", "stride", "walk", "lanes"):   # every output, or a grid-stride cap
        rows, n = launch.args[:2]
        per_block = BLOCK // R.lane_group(n) * LANE_UNROLL if kind == "lanes" else \
            BLOCK * THREAD_UNROLL
        if kind == "walk":   # a slab's column of more than THREAD_ROW, up to WALK_MOST
            assert THREAD_ROW < n <= R.WALK_MOST and 1 < launch.args[2] <= R.WALK_COLS, launch
            assert launch.grid == max(1, min(-(-rows // per_block), MAX_BLOCKS_PER_SM * sms))
            return
        assert (kind != "lanes") == (n <= THREAD_ROW) and n <= SHORT_ROW, launch
        assert (kind == "stride") == (launch.args[2] > 1) or kind == "lanes", launch
        if kind == "lanes":   # the kernel's group, from the plan alone
            assert launch.args[2] == R.lane_group(n), launch
        assert launch.grid == max(1, min(-(-rows // per_block), MAX_BLOCKS_PER_SM * sms)), launch
    elif kind in ("short", "slab"):   # a wave, or every tile (slab: warp); the kernel strides
        outer, n, inner = launch.args[:3]
        assert THREAD_ROW < n and n * inner <= R.SHORT_TILE, launch
        slab = inner <= R.SLAB_COLS and n * inner >= R.SLAB_LEAST
        assert (kind == "slab") == slab, launch
        per = BLOCK // 32 if slab else R.SHORT_TILE // (n * inner)
        assert launch.grid == min(-(-outer // per), resident), launch
    elif kind in ("rows", "long"):
        rows, n, _, chunks = launch.args[:4]
        row_warps = sms * blocks(launch.kernel.replace("_long", "_rows"), BLOCK) * (BLOCK // 32)
        # a warp a row while rows fill half the warps, or while a warp's
        # trips over its row are no more than the block plan's rounds of
        # loads (its waves times its chunk's trips, one more to combine)
        long_resident = sms * blocks(launch.kernel.replace("_rows", "_long"), BLOCK)
        trip = BLOCK * width * R.ROW_UNROLL
        parts = max(1, min(long_resident // rows, -(-n // trip)))
        part = -(-n // parts)
        part += -part % width
        parts = -(-n // part)
        block_rounds = -(-rows * parts // long_resident) * -(-part // trip) + (parts > 1)
        warp_trips = -(-n // (32 * width * R.ROW_UNROLL))
        few = 2 * rows < row_warps and warp_trips > block_rounds
        assert (kind == "long") == few, launch
        if kind == "rows":
            assert launch.grid <= 4 * resident, launch
        elif chunks > 1:         # one wave of chunks
            assert launch.grid == rows * chunks <= resident, launch
    elif kind in ("cols", "gen"):
        # chunked only while the tasks leave a wave of the kernel's blocks
        # (at most a quarter of the threads' blocks) short, and only that far; never
        # left short where the rows allow two chunks of whole trips, but for
        # a tile wider than a warp (rows for two trips a thread at most)
        target = sms * min(blocks(launch.kernel, BLOCK), sm_threads // BLOCK // 4)
        n, chunks, tx = launch.args[1], launch.args[4], launch.args[6]
        if chunks > 1:
            base = plan.counters
            assert base < target and base * (chunks - 1) < target, (launch, target)
        else:
            tiles = -(-launch.args[2] // (tx * _columns(launch.kernel, width)))
            base = launch.args[0] * tiles
            assert base >= target or tx > 32 or n < 2 * (BLOCK // tx) * _trip(launch.kernel,
                                                                               width), \
                (launch, target)
    elif kind == "mid":
        A, M, inner, chunk, chunks, _ = launch.args
        block, threads = launch.block, sms * sm_threads
        # the device's threads shared among the columns, a power of 2 from a warp
        # to MID_BLOCK: no room for twice the block, unless at MID_BLOCK
        assert block * M <= threads or block == 32, launch
        assert 2 * block * M > threads or block == MID_BLOCK, launch
        packets = A * (inner // (width if "_vec" in launch.kernel else 1))
        if block == MID_BLOCK:
            per_sm = max(1, blocks(launch.kernel, block) // 2)
            assert chunks <= max(1, round(sms * per_sm / M), -(-packets // (2**31 - 1))), launch


def _columns(kernel, width):
    """Columns a thread of a column kernel reads: a packet's for the
    ``_vec`` kernels, else ``scalar_cols``'s (one for the general kernel)."""
    if kernel.endswith("_vec") or "_vec_" in kernel:
        return width
    return 1 if "_gen" in kernel else R.scalar_cols(width)


def _trip(kernel, width):
    """Rows a trip of a column kernel, as reduce.cu's exports give them."""
    if "_gen" in kernel:
        return R.GEN_UNROLL
    family = kernel.split("_")[0]
    unroll = R.PICK_UNROLL if family.startswith("pick") else R.SUM_UNROLL
    return unroll if "_vec" in kernel else unroll // R.scalar_cols(width)


def _state_bytes(kernel, width):
    """Bytes of one partial state of ``kernel``'s family: a pick's value
    and a 32-bit index (8 bytes, 16 for double), a pick64's 16."""
    value = 4 if width >= 4 else 8
    if kernel.startswith("pick64"):
        return 16
    return 2 * value if kernel.startswith("pick") else value


@pytest.mark.parametrize("occupancy", OCCUPANCIES)
@pytest.mark.parametrize("family,width,suffix",
                         [("sum", 4, ""), ("sum", 2, ""), ("sum", 8, ""), ("sum", 8, "_wide"),
                          ("max", 4, ""), ("pick", 4, ""), ("pick", 8, ""), ("pick", 2, "")])
def test_plans_hold_their_invariants(rng, family, width, suffix, occupancy):
    for _ in range(300):
        shape, axes = _case(rng)
        if family != "sum":
            axes = axes[:1]
        if rng.random() < 0.3:   # long rows and columns too, up to 2^27 elements
            shape = tuple(int(rng.choice((1, 3, 17, 1000, 70001, 2**20 + 7))) for _ in shape)
            while math.prod(shape) > 2**27:
                shape = shape[1:] + (3,)
        sms, threads = DEVICES[int(rng.integers(len(DEVICES)))]
        aligned = bool(rng.integers(2))
        blocks = _blocks(occupancy, threads)
        plan = R.plan(shape, axes, aligned, width, family, sms, threads, 1, 0, suffix, blocks)
        asked = list(blocks.asked)   # by the planner (the checks below ask too)
        form, dims = R.layout(shape, axes)
        if plan is None:   # only where the general kernel declines
            assert form == "passes" and (family != "sum" or suffix), (shape, axes)
            continue
        _check(plan, math.prod(shape[a] for a in axes), width)
        _check_occupancy(plan, width, sms, threads, blocks)
        assert plan.launch.kernel.endswith(suffix) or suffix == ""
        assert plan.launch.kernel.startswith(family)
        assert ("_gen" in plan.launch.kernel) == (form == "passes")
        # the planner asks about its own kernels only, each in its block size
        for kernel, block in asked:
            assert kernel in KERNELS and block == (MID_BLOCK if "_mid" in kernel else BLOCK)
            assert kernel.startswith(family) and kernel.endswith(suffix)
        # the launched kernel's occupancy is asked (here or by the checks),
        # but for nothing to reduce and the mid kernel's smaller blocks
        launch = plan.launch
        small_mid = "_mid" in launch.kernel and launch.block < MID_BLOCK
        assert (launch.kernel, launch.block) in blocks.asked \
            or launch.kernel.endswith("_one") or small_mid


@pytest.mark.parametrize("width", [4, 2, 8])
def test_nothing_to_reduce_is_one_launch_of_a_copy(rng, width):
    """Every reduced axis of extent 1 (the layout's rows of one element):
    ``*_one`` of the family, the engine's signature with the element count
    alone (a copy for sum, mean, max and min, argmax's fill of 0), no
    workspace, whatever the alignment; a packet a thread, as many blocks as
    that takes up to MAX_BLOCKS_PER_SM per multiprocessor.  The halves'
    wide passes (never of extent 1) keep the row kernel."""
    from handlers.cuda.launch import MAX_BLOCKS_PER_SM
    cases = [((1589183, 1), (1,)), ((883, 1, 13, 2), (1,)), ((1,), (0,)), ((1, 1), (0, 1)),
             ((6, 1, 1, 3), (1, 2)), ((4, 1), (1,)), ((1, 70001), (0,))]
    for _ in range(20):   # random shapes with a run of size-1 axes reduced
        shape = [int(rng.choice(EXTENTS)) for _ in range(int(rng.integers(1, 4)))]
        at = int(rng.integers(len(shape) + 1))
        ones = int(rng.integers(1, 3))
        cases.append((tuple(shape[:at] + [1] * ones + shape[at:]),
                      tuple(range(at, at + ones))))
    for shape, axes in cases:
        size = math.prod(shape)
        assert R.layout(shape, axes) == ("rows", (size, 1))
        for family in ("sum", "max", "min", "pick"):
            for sms, threads in DEVICES:
                for aligned in (True, False):
                    plan = R.plan(shape, axes, aligned, width, family, sms, threads,
                                  div=1, kind=R.PICK_KINDS.get(family, 2))
                    launch = plan.launch
                    assert launch.kernel == f"{family}_one", (shape, axes, launch)
                    assert launch.args == (size,) and launch.block == BLOCK
                    packets = -(-size // (BLOCK * width))
                    assert launch.grid == max(1, min(packets, MAX_BLOCKS_PER_SM * sms))
                    _check(plan, 1, width)
    plan = R.plan((7, 1), (1,), True, 8, "sum", 132, 2048, suffix="_wide")
    assert plan.launch.kernel == "sum_thread_wide" and plan.launch.args[1] == 1


def test_long_rows_fill_the_gpu():
    # A 1-D min to a scalar (0.3 GB/s on one warp before the engine) now
    # splits over a block per chunk, at least one per multiprocessor.
    plan = R.plan((8859584,), (0,), True, 4, R.family_of("min"), 132, 2048, 1, 1)
    assert plan.launch.kernel == "min_long" and plan.launch.args[3] >= 132
    # a few long rows: (5, 1154496) over its last axis
    plan = R.plan((5, 1154496), (1,), True, 4, "pick", 132, 2048, 1, 2)
    assert plan.launch.kernel == "pick_long" and 5 * plan.launch.args[3] >= 132


def test_short_rows_and_short_columns():
    # rows of up to THREAD_ROW elements: a thread a row; longer short rows: tiles
    plan = R.plan((400, 70348, 2), (2,), True, 4, "sum", 132, 2048)
    assert plan.launch.kernel == "sum_thread" and plan.launch.args[:2] == (400 * 70348, 2)
    assert plan.launch.grid == 132 * MAX_BLOCKS_PER_SM   # strides over the rest
    plan = R.plan((3, 5), (1,), True, 4, "max", 132, 2048)
    assert plan.launch.kernel == "max_thread" and plan.launch.grid == 1
    for n, kernel in ((THREAD_ROW, "pick_thread"), (THREAD_ROW + 1, "pick_lanes"),
                      (SHORT_ROW, "pick_lanes"), (SHORT_ROW + 1, "pick_rows")):
        assert R.plan((1000, n), (1,), True, 4, "pick", 132, 2048, 1, 2).launch.kernel == kernel
    # a group of lanes a row: 2 elements a lane at most, a power of 2, 32 at most
    assert [R.lane_group(n) for n in (9, 16, 17, 32, 33, 64)] == [8, 8, 16, 16, 32, 32]
    plan = R.plan((10 ** 6, 29), (1,), True, 4, "sum", 132, 2048)
    assert plan.launch.kernel == "sum_lanes" and plan.launch.grid == 132 * MAX_BLOCKS_PER_SM
    plan = R.plan((100, 29), (1,), True, 4, "sum", 132, 2048)   # 64 rows a block
    assert plan.launch.kernel == "sum_lanes" and plan.launch.grid == 2
    # a short reduced axis over many columns: ty == 1, no chunks
    plan = R.plan((12, 11135, 344), (0,), True, 4, "sum", 132, 2048)
    assert plan.launch.kernel == "sum_cols_vec" and plan.launch.args[6] == 256
    assert plan.counters == 0


@pytest.mark.parametrize("occupancy", ["threads", "h200"])
def test_tuned_plans_stay(occupancy):
    """The plans tuned on an H200, under the threads' limit and under the
    H200's own occupancy (its column kernels hold 4 blocks a multiprocessor;
    the tuned 2 a multiprocessor, a quarter of the threads' blocks, are
    under that: cols_wave-NVIDIA-H200.log)."""
    blocks = _blocks(occupancy, 2048)
    # 8192x4096 over axis 0: 32 columns of float4 a tile, 8 rows deep
    plan = R.plan((8192, 4096), (0,), True, 4, "sum", 132, 2048, blocks_per_sm=blocks)
    assert plan.launch.kernel == "sum_cols_vec" and plan.launch.args[6] == 32
    assert 8 <= plan.launch.args[4] <= 9
    # the conv bias gradient: one 1024-thread block per channel, no chunks
    plan = R.plan((64, 128, 32, 32), (0, 2, 3), True, 4, "sum", 132, 2048, blocks_per_sm=blocks)
    assert plan.launch.kernel == "sum_mid_vec" and plan.launch.block == 1024
    assert plan.counters == 0 and plan.launch.grid == 128


#: Plans of the planner before it asked for occupancy (the parent of the
#: change), on an H200 (132 SMs of 2048 threads) and a device of 16 SMs of
#: 1536: (shape, axes, aligned, width, family, div, kind, suffix), device,
#: (kernel, grid, the first 8 arguments, block, workspace, counters).  Where
#: the occupancy is the threads' limit they must not move.
BEFORE = [
    # (since: chunks of columns in a wave of a quarter of the threads'
    # blocks, not half: the (8192, 4096), (1000003, 3) and sum_gen plans
    # below take half the chunks, cols_wave-NVIDIA-H200.log)
    # (since: slabs of a few columns and a short axis walk, so the tiles'
    # case is one of 10 columns, not (1000000, 12, 2))
    (((1000000, 9, 10), (1,), True, 4, "sum", 1, 0, ""), (132, 2048),
     ("sum_short", 1056, (1000000, 9, 10, 1, 1, 0), 256, 0, 0)),
    (((1000000, 9, 10), (1,), True, 4, "sum", 1, 0, ""), (16, 1536),
     ("sum_short", 96, (1000000, 9, 10, 1, 1, 0), 256, 0, 0)),
    # (since: a reduced axis of up to THREAD_ROW elements takes a thread an
    # output, its elements inner apart, not a tile of whole slabs)
    (((81, 16960, 3, 5), (2,), True, 4, "max", 1, 0, ""), (132, 2048),
     ("max_stride", 2112, (6868800, 3, 5, 1, 1, 0), 256, 0, 0)),
    (((5000, 3000), (1,), True, 4, "sum", 3000, 0, ""), (132, 2048),
     ("sum_rows", 625, (5000, 3000, 3000, 1, 3000, 0), 256, 0, 0)),
    (((5000, 3000), (1,), True, 4, "sum", 3000, 0, ""), (16, 1536),
     ("sum_rows", 384, (5000, 3000, 3000, 1, 3000, 0), 256, 0, 0)),
    (((8859584,), (0,), True, 4, "min", 1, 1, ""), (132, 2048),
     ("min_long", 1056, (1, 8859584, 8392, 1056, 1, 1), 256, 4224, 1)),
    (((8859584,), (0,), True, 4, "min", 1, 1, ""), (16, 1536),
     ("min_long", 96, (1, 8859584, 92288, 96, 1, 1), 256, 384, 1)),
    (((4, 1048576), (1,), True, 2, "pick", 1, 2, ""), (132, 2048),
     ("pick_long", 1056, (4, 1048576, 3972, 264, 1, 2), 256, 16896, 4)),
    (((3000000,), (0,), True, 8, "sum", 1, 0, "_wide"), (132, 2048),
     ("sum_long_wide", 367, (1, 3000000, 8176, 367, 1, 0), 256, 1468, 1)),
    (((8192, 4096), (0,), True, 4, "sum", 1, 0, ""), (132, 2048),
     ("sum_cols_vec", 256, (1, 8192, 4096, 1024, 8, 1, 32, 0), 256, 131072, 32)),
    (((8192, 4096), (0,), True, 4, "sum", 1, 0, ""), (16, 1536),
     ("sum_cols_vec", 32, (1, 8192, 4096, 8192, 1, 1, 32, 0), 256, 0, 0)),
    (((64, 300007), (0,), False, 4, "max", 1, 0, ""), (132, 2048),
     ("max_cols", 2344, (1, 64, 300007, 64, 1, 1, 32, 0), 256, 0, 0)),
    (((1000003, 3), (0,), True, 8, "pick", 1, 2, ""), (132, 2048),
     ("pick_cols", 245, (1, 1000003, 3, 4096, 245, 1, 1, 2), 256, 5880, 1)),
    (((1000003, 3), (0,), True, 8, "pick", 1, 2, ""), (16, 1536),
     ("pick_cols", 16, (1, 1000003, 3, 63488, 16, 1, 1, 2), 256, 384, 1)),
    (((12, 11135, 344), (0,), True, 4, "sum", 1, 0, ""), (132, 2048),
     ("sum_cols_vec", 3741, (1, 12, 3830440, 12, 1, 1, 256, 0), 256, 0, 0)),
    (((64, 128, 32, 32), (0, 2, 3), True, 4, "sum", 1, 0, ""), (132, 2048),
     ("sum_mid_vec", 128, (64, 128, 1024, 16384, 1, 1), 1024, 0, 0)),
    (((8, 16, 7, 7), (0, 2, 3), True, 2, "sum", 392, 0, ""), (16, 1536),
     ("sum_mid", 16, (8, 16, 49, 392, 1, 392), 1024, 0, 0)),
    (((593, 4, 11, 11), (0, 2), True, 4, "sum", 6523, 0, ""), (132, 2048),
     ("sum_gen", 118, (1, 6523, 44, 112, 59, 6523, 32, 0), 256, 10384, 2)),
    (((593, 4, 11, 11), (0, 2), True, 4, "sum", 6523, 0, ""), (16, 1536),
     ("sum_gen", 16, (1, 6523, 44, 840, 8, 6523, 32, 0), 256, 1408, 2)),
    (((7, 300, 5, 400), (1, 3), True, 4, "sum", 1, 0, ""), (132, 2048),
     ("sum_gen", 280, (1, 120000, 35, 16128, 8, 1, 1, 0), 256, 1120, 35)),
    (((1589183, 1), (1,), True, 4, "max", 1, 0, ""), (132, 2048),
     ("max_one", 1552, (1589183,), 256, 0, 0)),
]


@pytest.mark.parametrize("occupancy", [None, "threads"])
def test_plans_at_the_threads_limit_are_those_of_before(occupancy):
    """Where every kernel's occupancy is the threads' limit (given, or by
    default), the plans are the planner's before it asked: one of each
    kernel kind, pinned."""
    for (shape, axes, aligned, width, family, div, kind, suffix), (sms, threads), want in BEFORE:
        blocks = None if occupancy is None else _blocks(occupancy, threads)
        plan = R.plan(shape, axes, aligned, width, family, sms, threads, div, kind, suffix,
                      blocks)
        launch = plan.launch
        got = (launch.kernel, launch.grid, launch.args[:8], launch.block, plan.workspace,
               plan.counters)
        assert got == want, (shape, axes, sms)


@pytest.mark.parametrize("occupancy", OCCUPANCIES)
def test_long_rows_take_one_wave(occupancy):
    """``*_long``: as many chunks as one wave of the kernel's resident
    blocks holds, resident // rows a row (each a full trip of the block's
    loads at least): never a block beyond the wave, which would run alone
    as long as the wave.  The one change where the occupancy is the
    threads' limit: rows that do not divide the wave took ceil(resident /
    rows) chunks, a few blocks past it (5 rows on an H200: 5 * 212 = 1060
    blocks of 1056 slots, now 5 * 211)."""
    for sms, threads in DEVICES:
        blocks = _blocks(occupancy, threads)
        for family, width in (("sum", 4), ("max", 2), ("pick", 8), ("min", 4)):
            resident = sms * blocks(f"{family}_long", BLOCK)
            for rows in (1, 2, 3, 5, 7, 31, 100):
                n = 2**25 + 5   # trips enough for every chunk
                plan = R.plan((rows, n), (1,), True, width, family, sms, threads, 1, 0, "",
                              blocks)
                launch = plan.launch
                row_warps = sms * blocks(f"{family}_rows", BLOCK) * (BLOCK // 32)
                if 2 * rows >= row_warps:   # enough rows for a warp each
                    assert launch.kernel == f"{family}_rows"
                    continue
                assert launch.kernel == f"{family}_long", (rows, launch)
                chunks = launch.args[3]
                assert chunks == max(1, resident // rows), (sms, rows, launch)
                assert launch.grid == rows * chunks
                assert launch.grid <= resident or chunks == 1
    plan = R.plan((5, 1154496), (1,), True, 4, "pick", 132, 2048, 1, 2)
    assert plan.launch.args[3] == 211 and plan.launch.grid == 1055


def test_occupancy_below_the_threads_limit_shrinks_the_waves():
    """An H200 whose reduction kernels hold 4 blocks of 256 a
    multiprocessor (64 registers), not the threads' 8: the 1-D min and the
    short rows take one wave of 528 blocks, not 1056 in two; a warp-per-row
    kernel that holds 5 takes the rows that half the warps of 5 fill."""
    four = _blocks(4, 2048)
    plan = R.plan((8859584,), (0,), True, 4, "min", 132, 2048, 1, 1, blocks_per_sm=four)
    assert plan.launch.kernel == "min_long"
    assert plan.launch.args[3] == plan.launch.grid == 528 and plan.workspace == 528 * 4
    plan = R.plan((1000000, 9, 10), (1,), True, 4, "sum", 132, 2048, blocks_per_sm=four)
    assert plan.launch.kernel == "sum_short" and plan.launch.grid == 528
    # 3000 rows of 10^5: fewer than half the warps of 8 blocks a
    # multiprocessor (4224 rows), more than half those of sum_rows's 5 (2640)
    h200 = _blocks("h200", 2048)
    assert R.plan((3000, 10**5), (1,), True, 4, "sum", 132, 2048).launch.kernel == "sum_long"
    plan = R.plan((3000, 10**5), (1,), True, 4, "sum", 132, 2048, blocks_per_sm=h200)
    assert plan.launch.kernel == "sum_rows" and plan.launch.grid == 375


def test_mid_declines_runs_beyond_32_bit_offsets():
    assert R.plan_mid(2, 3, 2**33, True, 4, 132, 2048) is None


def test_small_slabs_share_a_tile_or_take_a_thread_an_output():
    # (13, 8069, 4, 4) over axis 2 and (15158082, 2, 2) over axis 1: a block
    # per column tile of a few bytes waited on latency (3 ms, 150 ms).  A
    # reduced axis of up to THREAD_ROW elements: a thread an output, its
    # elements inner apart (the third number), every output in the grid's
    # reach; longer ones: tiles of whole slabs, many a block (or a walk,
    # for slabs of a few columns: test_walk_takes_the_slabs_its_bounds_send).
    for shape, axis in (((13, 8069, 4, 4), 2), ((15158082, 2, 2), 1),
                        ((19054, 3, 3, 41), 2), ((2048, 2, 809), 1)):
        plan = R.plan(shape, (axis,), True, 4, "pick", 132, 2048, 1, 0)
        outputs = math.prod(shape) // shape[axis]
        assert plan.launch.kernel == "pick_stride", shape
        assert plan.launch.args[:3] == (outputs, shape[axis], shape[-1]), shape
        assert plan.launch.grid == min(-(-outputs // (256 * THREAD_UNROLL)),
                                       MAX_BLOCKS_PER_SM * 132)
    # rows: *_thread, the stride 1
    plan = R.plan((1000, 5), (1,), True, 4, "sum", 132, 2048)
    assert plan.launch.kernel == "sum_thread" and plan.launch.args[:3] == (1000, 5, 1)
    for shape in ((1000000, THREAD_ROW + 1, R.WALK_COLS + 1), (500, 9, 200)):
        plan = R.plan(shape, (1,), True, 4, "pick", 132, 2048, 1, 0)
        assert plan.launch.kernel == "pick_short" and plan.launch.args[2] == shape[-1]


def test_slabs_of_few_columns_take_a_warp_each(monkeypatch):
    # (4774, 709, 2) over axis 1 (a random set's miss: a tile per slab, its
    # two outputs on two of a block's eight lane groups) and (20000, 40, 30)
    # (the tutorial's slow layout once): a warp a slab, 8 a block, at most one
    # wave of the kernel's resident blocks; the third number is inner
    h200 = _blocks("h200", 2048)
    for shape, family in (((4774, 709, 2), "pick"), ((20000, 40, 30), "sum"),
                          ((5501, 997, 1, 2), "max")):
        plan = R.plan(shape, (1,), True, 4, family, 132, 2048, 1, 0, blocks_per_sm=h200)
        outer, n, inner = shape[0], shape[1], shape[-1]
        assert plan.launch.kernel == f"{family}_slab", shape
        assert plan.launch.args[:3] == (outer, n, inner), shape
        assert plan.launch.grid == min(-(-outer // 8), 132 * H200_BLOCKS["slab"]), shape
        assert plan.workspace == plan.counters == 0
    # the bounds: at most SLAB_COLS columns, SLAB_LEAST elements or more
    # (the walks set aside: they take slabs of 4 columns and a short axis first)
    monkeypatch.setattr(R, "WALK_COLS", 0)
    assert R.SLAB_LEAST // 4 > R.THREAD_ROW   # else *_stride takes the slabs
    cases = (((100000, R.SLAB_LEAST // 4, 4), "sum_slab"),
             ((100000, R.SLAB_LEAST // 4 - 1, 4), "sum_short"),
             ((100000, 40, R.SLAB_COLS), "sum_slab"),
             ((100000, 40, R.SLAB_COLS + 1), "sum_short"))
    for shape, kernel in cases:
        assert R.plan(shape, (1,), True, 4, "sum", 132, 2048).launch.kernel == kernel, shape


def test_walk_takes_the_slabs_its_bounds_send():
    """``*_walk`` (a thread an output, its column in trips) takes small slabs
    of at most WALK_COLS columns whose reduced axis is longer than
    THREAD_ROW and at most WALK_MOST, before the tiles and the warps; wider
    slabs and longer axes keep theirs, and every plan passes the occupancy
    rules."""
    for shape, family in (((1000000, 12, 2), "sum"), ((200000, 40, 3), "max"),
                          ((100000, 25, 5), "pick"), ((300000, 16, 4), "min"),
                          ((100000, R.WALK_MOST, R.WALK_COLS), "sum"),
                          ((1000, THREAD_ROW + 1, 2), "sum")):
        for sms, threads in DEVICES:
            plan = R.plan(shape, (1,), True, 4, family, sms, threads)
            outer, n, inner = shape
            assert plan.launch.kernel == f"{family}_walk", (shape, plan)
            assert plan.launch.args[:3] == (outer * inner, n, inner), plan
            assert plan.workspace == plan.counters == 0
            _check_occupancy(plan, 4, sms, threads, lambda k, b: max(1, threads // b))
    for shape, kernel in (((100000, R.WALK_MOST + 1, 3), "sum_slab"),
                          ((100000, 12, R.WALK_COLS + 8), "sum_slab"),
                          ((20000, 64, 30), "sum_slab"), ((4774, 709, 2), "sum_slab"),
                          ((100000, THREAD_ROW, 3), "sum_stride")):
        assert R.plan(shape, (1,), True, 4, "sum", 132, 2048).launch.kernel == kernel, shape


# --------------------------------------------------------------- extremes
def test_max_and_min_keep_the_value_alone():
    """max_t and min_t run kernels of their own (reduce.cu's Extreme): the
    same grids as a sum's, one compute-format value a partial state; argmax
    stays on the (value, index) pick."""
    assert R.family_of("max") == "max" and R.family_of("min") == "min"
    assert R.family_of("argmax") == "pick"
    for width, state in ((4, 4), (2, 8), (8, 4)):
        for shape, axis in (((8859584,), 0), ((5, 1154496), 1), ((8192, 4096), 0),
                            ((64, 300007), 0), ((1000003, 3), 0)):
            for aligned in (True, False):
                plans = {f: R.plan(shape, (axis,), aligned, width, f, 132, 2048, 1,
                                   R.PICK_KINDS.get(f, 2)) for f in ("sum", "max", "min")}
                kernels = {f: p.launch.kernel for f, p in plans.items()}
                assert kernels["max"] == kernels["sum"].replace("sum", "max", 1)
                assert kernels["min"] == kernels["sum"].replace("sum", "min", 1)
                for f in ("max", "min"):
                    p, q = plans[f], plans["sum"]
                    assert p.launch.grid == q.launch.grid
                    assert p.launch.args[:-1] == q.launch.args[:-1]
                    assert p.workspace == q.workspace
                    if p.counters:
                        tasks = p.workspace // state
                        assert p.workspace == tasks * state and tasks > 1
                # argmax: the same grids (PICK_UNROLL == SUM_UNROLL), a
                # (value, 32-bit index) state twice a max's
                arg = R.plan(shape, (axis,), aligned, width, "pick", 132, 2048, 1, 2)
                assert arg.launch.kernel == kernels["sum"].replace("sum", "pick", 1)
                assert arg.launch.grid == plans["max"].launch.grid
                assert arg.workspace == 2 * plans["max"].workspace
    # a chunked max: each chunk's partial is one value
    plan = R.plan((8859584,), (0,), True, 4, "max", 132, 2048, 1, 0)
    assert plan.workspace == plan.launch.args[3] * 4
    plan = R.plan((8859584,), (0,), True, 2, "max", 132, 2048, 1, 0)
    assert plan.workspace == plan.launch.args[3] * 8


# --------------------------------------------------------------- columns
def test_unaligned_columns_read_several_a_thread():
    """Rows that do not start on 16 bytes (an odd inner extent, or an input
    at an odd offset) read min(packet, SCALAR_COLS) columns a thread with
    scalar loads, tx apart (one for double): the tiles and a whole trip
    count those columns."""
    assert [R.scalar_cols(w) for w in (2, 4, 8)] == [1, 4, 4]
    for width in (4, 2, 8):
        per = R.scalar_cols(width)
        for outer, n, inner, aligned in ((1, 42, 322763, True), (1, 3, 6197 * 23 * 29, True),
                                         (1, 8192, 4096, False), (7, 1000, 33, True),
                                         (1, 20011, 5, True), (3, 100003, 77, False)):
            plan = R.plan_cols(outer, n, inner, aligned, width, "sum", 132, 2048)
            launch = plan.launch
            assert launch.kernel == "sum_cols", (n, inner, aligned)
            _, _, _, chunk, chunks, _, tx, _ = launch.args
            ty = BLOCK // tx
            tiles = -(-inner // (tx * per))
            assert plan.counters in (0, outer * tiles)
            if chunks > 1:
                assert chunk % (ty * (R.SUM_UNROLL // per)) == 0
                assert plan.workspace == outer * chunks * inner * (4 if width >= 4 else 8)
    # short axes: rows of float in trips of 4 rows of 4 columns a thread,
    # each thread at least two trips (ty the largest power of 2 that leaves
    # them), the rest of the block across the columns, and no chunks
    for n, ty in ((42, 4), (17, 2), (13, 1), (15, 1), (16, 2), (63, 4), (64, 8), (8192, 8)):
        args = R.plan_cols(1, n, 322763, True, 4, "sum", 132, 2048).launch.args
        assert (args[6], BLOCK // args[6]) == (BLOCK // ty, ty), n
        assert args[4] == 1 or ty == 8, n


# --------------------------------------------------------------- general kernel
def _passes_case(rng):
    """A random shape of 4 to 9 axes whose merged layout is a ``passes``
    one (reduced and kept runs interleaved beyond rows/cols/mid), at most
    30000 elements, and its reduced axes."""
    while True:
        ndim = int(rng.integers(4, 10))
        shape = [int(rng.choice((1, 2, 3, 4, 5, 7, 8, 11, 16, 31, 64))) for _ in range(ndim)]
        while math.prod(shape) > 30000:
            shape[int(rng.integers(ndim))] = max(1, shape[int(rng.integers(ndim))] // 2)
        axes = tuple(i for i in range(ndim) if rng.random() < 0.5)
        if axes and R.layout(tuple(shape), axes)[0] == "passes":
            return tuple(shape), axes


def _simulate_gen(launch, size, width):
    """{output: sorted element indices} that ``sum_gen*`` reduces, computed
    as reduce.cu's cols_impl, tile_reduce and GenIx do from the launch's
    arguments: every task (tile, chunk) of every block, each thread's
    columns (a packet of ``width`` for ``sum_gen_vec``) and its walk down
    the rows (the digits of its first row by division, then the step's
    digits with one conditional wrap a digit, offsets modulo 2^32)."""
    outer, n, inner, chunk, chunks, _, tx, _ = launch.args[:8]
    g = launch.args[8:]
    yfast, ke, ks, re_, rs = g[0], g[1:4], g[4:8], g[8:11], g[11:15]
    sd, wr, soff = g[15:18], g[18:21], g[21]
    assert outer == 1
    V = width if launch.kernel.endswith("_vec") else 1
    ty = launch.block // tx
    t = np.arange(launch.block)
    x = t // ty if yfast else t % tx
    y = t % ty if yfast else t // tx
    tile_cols = tx * V
    tiles = -(-inner // tile_cols)
    got = {o: [] for o in range(inner)}
    mask = 2**32 - 1
    for tile in range(tiles):
        for ch in range(chunks):
            r_begin, r_end = ch * chunk, min(n, (ch + 1) * chunk)
            for xi, yi in zip(x.tolist(), y.tolist()):
                col = tile * tile_cols + xi * V
                if col >= inner:
                    continue
                c, base = col, 0
                for i in range(3):
                    q = c // ke[i]
                    base += (c - q * ke[i]) * ks[i]
                    c = q
                base += c * ks[3]
                r = r_begin + yi
                q, off, d = r, 0, []
                for i in range(3):
                    p = q // re_[i]
                    d.append(q - p * re_[i])
                    off += d[-1] * rs[i]
                    q = p
                off = (off + q * rs[3]) & mask
                while r < r_end:
                    for j in range(V):
                        got[col + j].append(base + off + j)
                    off = (off + soff) & mask
                    carry = 0
                    for i in range(3):
                        d[i] += sd[i] + carry
                        carry = int(d[i] >= re_[i])
                        if carry:
                            d[i] -= re_[i]
                            off = (off + wr[i]) & mask
                    r += ty
    for o, offsets in got.items():
        assert all(0 <= e < size for e in offsets), (o, offsets)
    return {o: sorted(v) for o, v in got.items()}


@pytest.mark.parametrize("width", [4, 2, 8])
def test_the_general_kernel_reduces_what_numpy_reduces(rng, width):
    seen = set()

    def covered():
        return ({k for k, _, _ in seen} == {"sum_gen", "sum_gen_vec"}
                and {c for _, c, _ in seen} == {False, True}
                and {yf for _, _, yf in seen} == {0, 1})
    # 60 cases at least, more (up to 600) until they meet every kernel and
    # layout below: with 8-element packets some draws of 60 met no sum_gen_vec
    for i in range(600):
        if i >= 60 and covered():
            break
        shape, axes = _passes_case(rng)
        sms, threads = DEVICES[int(rng.integers(len(DEVICES)))]
        aligned = bool(rng.integers(2))
        blocks = _blocks(OCCUPANCIES[int(rng.integers(len(OCCUPANCIES)))], threads)
        plan = R.plan(shape, axes, aligned, width, "sum", sms, threads, blocks_per_sm=blocks)
        extents, reduced = R.layout(shape, axes)[1]
        runs = (len(reduced), len(extents) - len(reduced))
        if max(runs) > R.GEN_RUNS:
            assert plan is None, (shape, axes)
            continue
        launch = plan.launch
        seen.add((launch.kernel, launch.args[4] > 1, launch.args[8]))
        _check(plan, math.prod(shape[a] for a in axes), width)
        _check_occupancy(plan, width, sms, threads, blocks)
        if launch.kernel.endswith("_vec"):
            assert aligned and extents[-1] % width == 0 and reduced[-1] != len(extents) - 1
        kept = [i for i in range(len(extents)) if i not in reduced]
        index = np.arange(math.prod(extents)).reshape(extents)
        want = np.transpose(index, kept + list(reduced)).reshape(launch.args[2], -1)
        got = _simulate_gen(launch, index.size, width)
        for o in range(launch.args[2]):
            assert got[o] == sorted(want[o].tolist()), (shape, axes, o)
    # the cases met both kernels, chunked and not, and both thread layouts
    assert {k for k, _, _ in seen} == {"sum_gen", "sum_gen_vec"}, seen
    assert {c for _, c, _ in seen} == {False, True}, seen
    assert {yf for _, _, yf in seen} == {0, 1}, seen


def test_the_general_kernel_takes_the_issue_cases():
    """(593, 4, 11, 11) over (0, 2), RKRK: one launch (three before: two
    passes and their intermediate), its outputs few enough to chunk; a
    mean divides in the same launch."""
    plan = R.plan((593, 4, 11, 11), (0, 2), True, 4, "sum", 132, 2048, div=593 * 11)
    launch = plan.launch
    assert launch.kernel == "sum_gen" and launch.args[:3] == (1, 593 * 11, 44)
    assert launch.args[5] == 593 * 11 and launch.args[4] > 1 and launch.args[8] == 0
    assert plan.counters >= 1 and plan.workspace == launch.args[4] * 44 * 4
    # packets where the last kept extent allows, rows first where reduced axes end
    assert R.plan((593, 4, 11, 16), (0, 2), True, 4, "sum", 132, 2048).launch.kernel \
        == "sum_gen_vec"
    assert R.plan((593, 4, 11, 16), (0, 2), False, 4, "sum", 132, 2048).launch.kernel \
        == "sum_gen"
    plan = R.plan((7, 300, 5, 400), (1, 3), True, 4, "sum", 132, 2048)
    assert plan.launch.kernel == "sum_gen" and plan.launch.args[8] == 1
    # beyond the kernel: more runs, other families, the halves' wide passes
    assert R.plan((2,) * 10, (0, 2, 4, 6, 8), True, 4, "sum", 132, 2048) is None
    assert R.plan((2, 3, 4, 5), (0, 2), True, 8, "sum", 132, 2048, suffix="_wide") is None
    assert R.plan_gen((2, 3, 4, 5), (0, 2), True, 4, "max", 132, 2048) is None
    assert R.plan_gen((2**16, 3, 2**15, 5), (0, 2), True, 4, "sum", 132, 2048) is None


def test_gen_args_follow_the_runs():
    # (33, 127, 31, 7) over (0, 2): kept 127 (stride 217) and 7 (stride 1);
    # reduced 33 (stride 27559) and 31 (stride 7); a step of 8 rows
    args = R.gen_args((33, 127, 31, 7), (0, 2), 8)
    assert len(args) == 22 and len(KERNELS["sum_gen"][1]) == 12 + len(args)
    assert args == (0, 7, 127, 1, 1, 217, 0, 0, 31, 33, 1, 7, 27559, 0, 0,
                    8, 0, 0, 27559 - 31 * 7, -33 * 27559, 0, 56)
    assert R.gen_args((5, 31, 7, 33), (1, 3), 256)[0] == 1   # reduced axes end it


# --------------------------------------------------------------- shared numbers
@pytest.mark.parametrize("name,value,source,macro", [
    ("SCALAR_COLS", R.SCALAR_COLS, "kernels/reduce.cu", r"constexpr int SCALAR_COLS = (\d+);"),
    ("SHORT_TILE", R.SHORT_TILE // BLOCK, "kernels/reduce.cu",
     r"constexpr int SHORT_TILE = SH_BLOCK \* (\d+);"),
    ("GEN_UNROLL", R.GEN_UNROLL, "kernels/reduce.cu", r"constexpr int GEN_UNROLL = (\d+);"),
    ("ROW_UNROLL", R.ROW_UNROLL, "kernels/reduce.cu", r"constexpr int ROW_UNROLL = (\d+);"),
    ("ONE_CALL_PARAMS", R.ONE_CALL_PARAMS, "_one_call.c", r"#define MAX_PARAMS (\d+)"),
], ids=lambda v: v if isinstance(v, str) and v.isupper() else "")
def test_the_host_copies_agree_with_the_sources(name, value, source, macro):
    """The numbers reductions.py copies from the kernels and the one-call
    path, each read from its source."""
    found = re.findall(macro, (SOURCES / source).read_text())
    assert found == [str(value)], (name, found)


def test_argmax_index_width():
    """argmax keeps 32-bit indices (``pick`` kernels) wherever the reduced
    extent's indices and a chunk's offsets fit (n <= 2^31), in every layout
    it takes, and takes ``pick64`` (16-byte states) beyond; the kept axes do
    not count."""
    limit = R.PICK32_EXTENT
    for width in (2, 4, 8):
        for n, family in ((limit, "pick"), (limit + 1, "pick64"), (2**33, "pick64")):
            for shape, axis, form in (((n,), 0, "_long"), ((3, n), 1, "_long"),
                                      ((n, 6), 0, "_cols"), ((2, n, 8), 1, "_cols"),
                                      ((n, 2), 1, "_thread")):
                plan = R.plan(shape, (axis,), True, width, "pick", 132, 2048, 1, 2)
                kernel = plan.launch.kernel
                if form == "_thread":   # a 2-element axis: 32-bit whatever the rows
                    assert kernel == "pick_thread", (shape, kernel)
                    continue
                assert kernel.startswith(family + form), (shape, kernel)
                if plan.counters:
                    tasks = plan.workspace // (16 if family == "pick64" or width == 2 else 8)
                    assert tasks * (16 if family == "pick64" or width == 2 else 8) \
                        == plan.workspace
        # many rows of a long axis that fits: 32-bit, even past 2^31 elements
        plan = R.plan((4, 2**30 + 3), (1,), True, width, "pick", 132, 2048, 1, 2)
        assert plan.launch.kernel.startswith("pick_")


# --------------------------------------------------------------- one-call scratch
def test_chunked_plans_fit_the_one_call_scratch(rng):
    """``one_call_scratch`` holds every chunked plan of 32-bit indices and
    offsets, of every family and packet width, on every device and under
    every occupancy (it is sized by the threads' limit, which no kernel's
    occupancy exceeds): random shapes of up to 2^32 elements, extents
    spread over six decades.  So the one-call path serves chunked
    reductions.  A chunked plan of each
    kind comes first, so that every kind is checked whatever the draw (4000
    draws held no chunked ``*_gen`` for some seeds).  ``pick64`` columns of
    the halves (4096 bytes a task) fit too: ``_chunking`` makes under
    resident / 2 tasks."""
    seen = set()
    anchors = [((593, 4, 11, 11), (0, 2), "sum"), ((5, 1675841), (1,), "max"),
               ((500000, 5), (0,), "min"), ((2, 4, 1000, 1000), (0, 2, 3), "sum")]
    for i in range(4000 + len(anchors)):
        sms, threads = DEVICES[i % len(DEVICES)]
        nbytes, counters = R.one_call_scratch(sms, threads)
        if i < len(anchors):
            shape, axes, family = anchors[i]
            ndim = len(shape)
        else:
            ndim = int(rng.integers(1, 5))
            while True:
                shape = tuple(max(1, int(np.exp(rng.uniform(0, np.log(2e6)))))
                              for _ in range(ndim))
                if math.prod(shape) <= 2**32:
                    break
            axes = tuple(sorted(set(int(x) for x in rng.integers(
                0, ndim, int(rng.integers(1, ndim + 1))))))
            family = str(rng.choice(["sum", "max", "min", "pick"]))
        if family != "sum":
            axes = axes[:1]
        width = int(rng.choice([2, 4, 8]))
        blocks = _blocks(OCCUPANCIES[i // len(DEVICES) % len(OCCUPANCIES)], threads)
        plan = R.plan(shape, axes, bool(rng.integers(2)), width, family, sms, threads,
                      blocks_per_sm=blocks)
        assert i >= len(anchors) or plan.counters, (shape, axes, plan)   # chunked
        if plan is None or not plan.counters:
            continue
        seen.add(plan.launch.kernel.split("_")[1])
        assert plan.workspace <= nbytes and plan.counters <= counters, (shape, axes, plan)
    assert seen >= {"long", "cols", "mid", "gen"}, seen


def test_few_rows_take_a_block_where_a_warp_waits_longer():
    """A few rows that a warp each would read in many trips take ``*_long``
    (a block per chunk: the random set's ``max_t`` of (6, 6029) over axis 1
    ran 12 trips of one warp a row, 10.6 us on an H200 against torch's
    10.0); many rows of a trip or two keep a warp each, where a block per
    row would idle most of its threads over several waves."""
    h200 = _blocks("h200", 2048)
    plan = R.plan((6, 6029), (1,), True, 4, "max", 132, 2048, blocks_per_sm=h200)
    assert plan.launch.kernel == "max_long"
    rows, n, chunk, chunks = plan.launch.args[:4]
    assert (rows, n, chunks) == (6, 6029, 2) and chunk * chunks >= n and chunk % 4 == 0
    assert plan.counters == 6 and plan.launch.grid == 12
    # 2000 rows of 1500: a warp takes 3 trips; blocks would take 4 waves
    plan = R.plan((2000, 1500), (1,), True, 4, "sum", 132, 2048, blocks_per_sm=h200)
    assert plan.launch.kernel == "sum_rows"
    # 1000 rows of 2000: 4 trips a warp against 2 waves of one trip
    plan = R.plan((1000, 2000), (1,), True, 4, "sum", 132, 2048, blocks_per_sm=h200)
    assert plan.launch.kernel == "sum_long" and plan.counters == 0
