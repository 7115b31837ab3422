"""The reduction kernels' occupancy, by which the engine sizes its grids
(``handlers.cuda.reductions``: the blocks of a kernel one multiprocessor
holds at once, which the driver counts from the compiled kernel's registers
and shared memory; ``kernel_loader.blocks_per_sm``).

Without a GPU: ``kernel_loader.blocks_per_sm`` passes the kernel's handle,
block and dynamic shared memory to the extension's ``occupancy`` (at least 1
back), and where the extension predates that call falls back to the
threads' limit; the handler's ``blocks_per_sm`` asks once per kernel and
block, from the table of its form.  The extension's own argument checks are
in ``test_launch.py``.  On a GPU: every reduction kernel of every format
holds 1 to ``sm_threads // block`` blocks, as the driver says; the plans the
handler makes are the planner's under those occupancies, and reductions so
planned agree with float64 NumPy.
"""
import math
import types

import numpy as np
import pytest

from handlers import optable
from handlers.cuda import kernel_loader, reductions
from handlers.cuda.launch import BLOCK, MID_BLOCK

#: Every reduction kernel of the op table (reduce.cu) and its block size
REDUCE_KERNELS = {name: MID_BLOCK if name.startswith("sum_mid") else BLOCK
                  for name, (file, _) in optable.KERNELS.items() if file == "reduce"}


class _Extension:
    """Stands in for the extension in ``kernel_loader``: ``occupancy``
    answers ``blocks`` and records its arguments (absent where ``blocks``
    is None: an extension built before the call)."""

    def __init__(self, blocks):
        self.calls = []
        if blocks is not None:
            def occupancy(function, block, dynamic_smem):
                self.calls.append((function, block, dynamic_smem))
                return blocks
            self.occupancy = occupancy


def test_blocks_per_sm_asks_the_driver(monkeypatch):
    kernel = kernel_loader.Kernel("sum_long_f32", "PPPPqqqqqi", 0x5150)
    ext = _Extension(3)
    monkeypatch.setattr(kernel_loader, "_launch", ext)
    assert kernel_loader.blocks_per_sm(kernel, 256, 2048) == 3
    assert kernel_loader.blocks_per_sm(kernel, 1024, 2048, 4096) == 3
    assert ext.calls == [(0x5150, 256, 0), (0x5150, 1024, 4096)]
    # a block that does not fit at all (the launch itself will fail): the
    # planners still get a positive count
    monkeypatch.setattr(kernel_loader, "_launch", _Extension(0))
    assert kernel_loader.blocks_per_sm(kernel, 256, 2048) == 1


@pytest.mark.parametrize("block, sm_threads, want", [(256, 2048, 8), (256, 1536, 6),
                                                     (1024, 2048, 2), (1024, 1536, 1),
                                                     (1024, 768, 1)])
def test_blocks_per_sm_without_the_call_is_the_threads_limit(monkeypatch, block, sm_threads,
                                                             want):
    monkeypatch.setattr(kernel_loader, "_launch", _Extension(None))
    kernel = kernel_loader.Kernel("sum_mid_f32", "PPPPqqqqqq", 0x5150)
    assert kernel_loader.blocks_per_sm(kernel, block, sm_threads) == want


def test_the_handlers_query_is_cached_per_kernel_and_form(monkeypatch):
    """``reductions.blocks_per_sm``: the table of the form ("CC": ``_k32``,
    the halves' float32 passes), one driver query per (kernel, block),
    the cache the handler's own."""
    asked = []

    def fake(kernel, block, sm_threads, dynamic_smem=0):
        asked.append((kernel.handle, block))
        return 4 if block == BLOCK else 1
    monkeypatch.setattr(kernel_loader, "blocks_per_sm", fake)
    names = list(REDUCE_KERNELS)
    h = types.SimpleNamespace(
        _sm_threads=2048, _occupancy={},
        _k={n: kernel_loader.Kernel(n, "", 0x1000 + i) for i, n in enumerate(names)},
        _k32={n: kernel_loader.Kernel(n, "", 0x9000 + i) for i, n in enumerate(names)})
    own, wide = reductions.blocks_per_sm(h), reductions.blocks_per_sm(h, "CC")
    for _ in range(3):
        assert own("sum_long", BLOCK) == 4 and own("sum_mid_vec", MID_BLOCK) == 1
        assert wide("sum_long", BLOCK) == 4
    assert asked == [(h._k["sum_long"].handle, BLOCK), (h._k["sum_mid_vec"].handle, MID_BLOCK),
                     (h._k32["sum_long"].handle, BLOCK)]
    assert reductions.blocks_per_sm(h)("sum_long", BLOCK) == 4 and len(asked) == 3


# ----------------------------------------------------------------------- GPU
def _gpu(dtype):
    try:
        from handlers import PyCudaHandler
        return PyCudaHandler(dtype)
    except (ImportError, RuntimeError) as e:
        pytest.skip(f"PyCudaHandler unavailable: {e}")


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_every_reduction_kernel_holds_one_to_the_threads_limit(dtype):
    """The driver's count for each reduction kernel of the format (and the
    halves' float32 passes): at least one block, at most the threads'
    limit, and what the handler's cached query gives."""
    h = _gpu(dtype)
    ext = kernel_loader.require()
    tables = [("TT", h._k)] + ([("CC", h._k32)] if h._k32 else [])
    for form, table in tables:
        query = h._blocks_per_sm(form)
        for name, block in REDUCE_KERNELS.items():
            got = query(name, block)
            assert 1 <= got <= h._sm_threads // block, (form, name, got)
            assert got == ext.occupancy(table[name].handle, block, 0), (form, name)


#: (shape, axis) reaching the kernels whose grids follow the occupancy: a
#: 1-D array to a scalar and a few long rows (``*_long``, one wave of
#: chunks), short rows (``*_short``, a wave of tiles), chunked columns and
#: the general kernel
CASES = [((8859584,), 0), ((5, 1154496), 1), ((2000003, 2), 1), ((8192, 4096), 0),
         ((1000003, 3), 0), ((593, 4, 11, 11), (0, 2))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["sum_t", "mean_t", "max_t", "min_t", "argmax_t"])
def test_reductions_planned_by_occupancy_agree_with_numpy(dtype, op):
    """Each case runs on the plan of the handler's occupancy (checked to be
    the planner's under it, and one wave for ``*_long``) and agrees with
    NumPy in float64: sums and means within the accumulation's bound,
    extrema and argmax exactly."""
    h = _gpu(dtype)
    rng = np.random.default_rng(20261128)
    u = np.finfo(dtype).eps / 2
    for shape, axis in CASES:
        if op in ("max_t", "min_t", "argmax_t") and type(axis) is not int:
            continue
        x = rng.standard_normal(shape).astype(dtype)
        axes = axis if type(axis) is tuple else (axis,)
        out_shape = tuple(e for i, e in enumerate(shape) if i not in axes) or (1,)
        a, out = h.create_from_numpy(x), h.allocate(out_shape)
        getattr(h, op)(a, axis, out)
        got = h.get_numpy_copy(out).reshape(-1)
        moved = np.moveaxis(x.astype(np.float64), axes, range(-len(axes), 0))
        flat = moved.reshape(len(got), -1)
        n = flat.shape[1]
        family = {"sum_t": "sum", "mean_t": "sum", "argmax_t": "pick"}.get(op, op[:3])
        blocks = h._blocks_per_sm()
        plan = reductions.plan(shape, tuple(sorted(axes)), True, h._vec, family, h._sms,
                               h._sm_threads, n if op == "mean_t" else 1,
                               reductions.PICK_KINDS.get(op[:-2], 0), "", blocks)
        found = reductions._planned(h, family, a, axis if type(axis) is int else axes,
                                    div=n if op == "mean_t" else 1,
                                    kind=reductions.PICK_KINDS.get(op[:-2], 0))
        assert found == plan, (shape, axis, found, plan)
        launch = plan.launch
        if launch.kernel.split("_")[1] == "long":
            rows, chunks = launch.args[0], launch.args[3]
            assert rows * chunks <= h._sms * blocks(launch.kernel, launch.block), launch
        if op == "argmax_t":
            np.testing.assert_array_equal(got, flat.argmax(axis=1), err_msg=str(shape))
        elif op in ("max_t", "min_t"):
            want = flat.max(axis=1) if op == "max_t" else flat.min(axis=1)
            np.testing.assert_array_equal(got, want, err_msg=str(shape))
        else:
            want = flat.sum(axis=1)
            bound = (2 * u * math.sqrt(n) + (20 + math.log2(n)) * 2.0**-53) \
                * np.abs(flat).sum(axis=1) + u * np.abs(want)
            if op == "mean_t":
                want, bound = want / n, bound / n + 4 * u * np.abs(want / n)
            bad = np.abs(got - want) > bound
            assert not bad.any(), (op, shape, axis, got[bad][:4], want[bad][:4])
