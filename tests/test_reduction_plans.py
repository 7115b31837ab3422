"""The reduction planners (``handlers.cuda.reductions``) on the CPU: they are
pure functions of shapes and device facts, so their plans can be checked
without a GPU (the GPU tests in ``test_ops.py`` run them).

What every plan must hold: its chunks cover the summed axis and no chunk is
empty, chunk starts keep the 16-byte alignment the vector loads need, grids
stay within the caps the kernels are written for, a chunked plan asks for
the partials and counters its second stage reads, and the kernel's name is
one of the table's."""
import math

import numpy as np
import pytest

from handlers.cuda import reductions as R
from handlers.optable import KERNELS

SMS = (132, 78)


def shapes(rng, count):
    """(outer, n, inner) views, from tiny to tens of millions of elements."""
    pick = [0, 1, 2, 3, 7, 31, 64, 255, 1000, 4097, 70000, 1 << 20]
    return [tuple(int(rng.choice(pick)) for _ in range(3)) for _ in range(count)]


@pytest.mark.parametrize("suffix,width", [("", 4), ("", 8), ("_wide", 8), ("", 2)])
def test_sum_plans_cover_the_axis(rng, suffix, width):
    for outer, n, inner in shapes(rng, 400):
        sms = int(rng.choice(SMS))
        aligned = bool(rng.random() < 0.7)
        plan = R.plan_sum(outer, n, inner, aligned, width, sms, suffix)
        if not outer * inner:
            assert plan == R.SumPlan(None, False, 0, 0)
            continue
        if not n:
            assert plan.launch is None and plan.zero
            continue
        launch = plan.launch
        assert launch.kernel in KERNELS and launch.kernel.endswith(suffix)
        if inner == 1:
            rows, n_, chunk, chunks = launch.args
            assert (rows, n_) == (outer, n) and launch.grid <= sms * 64
            assert chunk % max(4, width) == 0            # chunk starts stay aligned
        else:
            o, n_, i, chunk, chunks, tx = launch.args
            assert (o, n_, i) == (outer, n, inner) and launch.grid <= sms * 32
            assert tx & (tx - 1) == 0 and tx <= 32         # a power of two, at most a warp
            vec = launch.kernel.startswith("sum_cols_vec")
            assert not vec or (aligned and inner % width == 0)
        assert chunks >= 1 and chunk * chunks >= n > chunk * (chunks - 1)
        assert (plan.counters > 0) == (chunks > 1) and (plan.workspace > 0) == (chunks > 1)
        assert launch.grid >= 1 and launch.block == R.BLOCK


def test_mid_plans_cover_the_leading_run(rng):
    for _ in range(400):
        shape = tuple(int(rng.choice([1, 2, 3, 16, 64, 100, 1000])) for _ in range(4))
        sms, width = int(rng.choice(SMS)), int(rng.choice([4, 8]))
        plan = R.plan_mid(shape, 1, 2, True, width, sms)
        a, m, inner, chunk, chunks = plan.launch.args
        assert (a, m, inner) == (shape[0], shape[1], math.prod(shape[2:]))
        assert chunk * chunks >= a > chunk * (chunks - 1)
        assert plan.launch.block == R.MID_BLOCK and 1 <= plan.launch.grid <= sms * 32
        assert plan.counters == (m if chunks > 1 else 0)
    # a trailing run past the kernel's 32-bit indices: no one-pass plan
    assert R.plan_mid((2, 3, 2**31, 4), 1, 2, True, 4, 132) is None


def test_extreme_plans_cover_the_axis(rng):
    for outer, n, inner in shapes(rng, 400):
        if not outer * inner * n:   # the ops refuse an empty axis: no extremum of nothing
            continue
        sms, itemsize = int(rng.choice(SMS)), int(rng.choice([2, 4, 8]))
        plan = R.plan_extreme(outer, n, inner, itemsize, sms)
        if inner == 1:
            assert plan.rows and 1 <= plan.grid <= 16 * sms
            continue
        assert plan.chunk * plan.chunks >= n > plan.chunk * (plan.chunks - 1)
        if plan.chunks > 1:   # values, then 8-byte indices, after rounding up to 8
            cols = outer * inner
            assert plan.index_at == plan.chunks * cols * itemsize
            assert plan.workspace >= plan.index_at + 7 + plan.chunks * cols * 8
        else:
            assert plan.workspace == 0


def test_views_and_runs():
    assert R.sum_view((2, 3, 4), None) == (1, 24, 1)
    assert R.sum_view((2, 3, 4), 1) == (2, 3, 4)
    assert R.runs((0, 2, 3)) == [[0, 1], [2, 4]]
    assert R.runs(()) == []
    assert np.array_equal(R.runs((1,)), [[1, 2]])
