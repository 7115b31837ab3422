"""The reduction engine's planner (``handlers.cuda.reductions``) on the CPU:
``layout`` and the plans are pure functions of shapes and device facts, so
they are checked here without a GPU (the GPU runs the kernels in
``test_ops.py`` and ``test_reductions_random.py``).

What must hold: the canonical layout reduces exactly what NumPy reduces (an
independent check: reshaping by the layout and reducing gives NumPy's
result); a plan's chunks cover the reduced axis with none empty; chunk
starts of the row kernels stay 16-byte aligned; a chunked plan asks for the
partials and counters its second stage reads; the kernel is one of the
table's and gets as many arguments as its format says; and the plans that
earlier tuning fixed on an H200 stay as they were."""
import math

import numpy as np
import pytest

from handlers.cuda import reductions as R
from handlers.optable import KERNELS

DEVICES = ((132, 2048), (78, 2048), (108, 2048), (16, 1536))   # (sms, threads per SM)
EXTENTS = (1, 1, 2, 3, 5, 7, 31, 32, 33, 127, 1000, 4097, 70001)


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
    # the cases: a mean over (0, 2, 3) of (6, 1, 3, N) is a total
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
    assert launch.grid >= 1 and launch.block in (256, 1024)
    if launch.kernel.startswith("sum_mid"):
        A, M, inner, chunk, chunks, _ = launch.args
        total = A * (inner // (width if "_vec" in launch.kernel else 1))
        assert chunk < 2**31 and (chunks - 1) * chunk < total <= chunks * chunk
    elif "_cols" in launch.kernel:
        outer, m, inner, chunk, chunks, _, tx, _ = launch.args
        assert m == n and 256 % tx == 0
        assert (chunks - 1) * chunk < n <= chunks * chunk
    else:
        rows, m, chunk, chunks, _, _ = launch.args
        assert m == n
        if chunks > 1:
            assert launch.kernel.startswith(("sum_long", "pick_long"))
            assert (chunks - 1) * chunk < n <= chunks * chunk and chunk % 2 == 0
    chunked = launch.args[4 if "_cols" in launch.kernel or "_mid" in launch.kernel else 3] > 1
    assert (plan.counters > 0) == chunked and (plan.workspace > 0) == chunked


@pytest.mark.parametrize("family,width,suffix",
                         [("sum", 4, ""), ("sum", 2, ""), ("sum", 8, ""), ("sum", 8, "_wide"),
                          ("pick", 4, ""), ("pick", 8, ""), ("pick", 2, "")])
def test_plans_hold_their_invariants(rng, family, width, suffix):
    for _ in range(400):
        shape, axes = _case(rng)
        if family == "pick":
            axes = axes[:1]
        sms, threads = DEVICES[int(rng.integers(len(DEVICES)))]
        aligned = bool(rng.integers(2))
        plan = R.plan(shape, axes, aligned, width, family, sms, threads, 1, 0, suffix)
        form, dims = R.layout(shape, axes)
        if form == "passes":
            assert plan is None
            continue
        _check(plan, math.prod(shape[a] for a in axes), width)
        assert plan.launch.kernel.endswith(suffix) or suffix == ""


def test_long_rows_fill_the_gpu():
    # A 1-D max to a scalar (0.3 GB/s on one warp before the engine) now
    # splits over a block per chunk, at least one per multiprocessor.
    plan = R.plan((8859584,), (0,), True, 4, "pick", 132, 2048, 1, 1)
    assert plan.launch.kernel == "pick_long" and plan.launch.args[3] >= 132
    # a few long rows: (5, 1154496) over its last axis
    plan = R.plan((5, 1154496), (1,), True, 4, "pick", 132, 2048, 1, 2)
    assert plan.launch.kernel == "pick_long" and 5 * plan.launch.args[3] >= 132


def test_short_rows_and_short_columns():
    assert R.plan((400, 70348, 2), (2,), True, 4, "sum", 132, 2048).launch.kernel == "sum_short"
    # a short reduced axis over many columns: ty == 1, no chunks
    plan = R.plan((12, 11135, 344), (0,), True, 4, "sum", 132, 2048)
    assert plan.launch.kernel == "sum_cols_vec" and plan.launch.args[6] == 256
    assert plan.counters == 0


def test_tuned_plans_stay():
    # 8192x4096 over axis 0: 32 columns of float4 a tile, 8 rows deep
    plan = R.plan((8192, 4096), (0,), True, 4, "sum", 132, 2048)
    assert plan.launch.kernel == "sum_cols_vec" and plan.launch.args[6] == 32
    assert 16 <= plan.launch.args[4] <= 17
    # the conv bias gradient: one 1024-thread block per channel, no chunks
    plan = R.plan((64, 128, 32, 32), (0, 2, 3), True, 4, "sum", 132, 2048)
    assert plan.launch.kernel == "sum_mid_vec" and plan.launch.block == 1024
    assert plan.counters == 0 and plan.launch.grid == 128


def test_mid_declines_runs_beyond_32_bit_offsets():
    assert R.plan_mid(2, 3, 2**33, True, 4, 132, 2048) is None


def test_small_slabs_share_a_tile():
    # (13, 8069, 4, 4) over axis 2 and (15158082, 2, 2) over axis 1: a block
    # per column tile of a few bytes waited on latency (3 ms, 150 ms)
    for shape, axis in (((13, 8069, 4, 4), 2), ((15158082, 2, 2), 1)):
        plan = R.plan(shape, (axis,), True, 4, "pick", 132, 2048, 1, 0)
        assert plan.launch.kernel == "pick_short" and plan.launch.args[2] == shape[-1]
