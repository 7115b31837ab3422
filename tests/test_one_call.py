"""The one-call path of same-shape ops (``handlers.cuda._launch.OneCall``).

On any machine where the extension is built, ``OneCall(dry=True)`` is
checked against an independent Python model of what it must do: accept only
exact-type arrays of the handler's dtype object with one C-contiguous shape
and float/int scalars, and then launch the kernel with (scalars..., pointers...,
n) over a grid of min(ceil(n / per_block), max_blocks) blocks; decline
anything else having done nothing.  A product (``dot``) runs the record that
the Python path stored for its shapes (``handlers.cuda.products``), checked
here against an independent model of what the product must launch.  On a GPU,
every op the path serves gives bit for bit the result of its Python path, and
is served by it.
"""
import math

import numpy as np
import pytest

_launch = pytest.importorskip(
    "handlers.cuda._launch",
    reason="handlers.cuda._launch is not built (no C compiler at install): same-shape ops "
           "take the Python path; `pip install -e .` builds it")

from handlers import dtypes, optable  # noqa: E402
from handlers.cuda import kernel_loader, one_call, products, reductions  # noqa: E402

BLOCK, PER_BLOCK, MAX_BLOCKS = 256, 1024, 37
FUNCS = [0x1000 + 16 * i for i in range(5)]
#: each function's kernel format, T standing for its scalars' width: run
#: reads none of it, scalar (function 1) and axpby (function 2) their scalars'
FORMATS = [b"PPPPq", b"TPPq", b"TPTPq", b"PPPPq", b"PPPPq"]


class Arr:
    """The attributes OneCall reads, as pycuda's GPUArray has them."""

    def __init__(self, shape, dtype=np.float32, gpudata=None, strides=None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.strides = np.empty(shape, dtype).strides if strides is None else strides
        self.gpudata = 0x7000_0000 + 4096 * id(self) % 2**20 if gpudata is None else gpudata

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def ndim(self):
        return len(self.shape)


class SubArr(Arr):
    pass


def _functions(scalar):
    """(handle, fmt) of each function, its scalars of width ``scalar``."""
    return [(f, fmt.replace(b"T", scalar)) for f, fmt in zip(FUNCS, FORMATS)]


def _ops(itemsize=4, dtype=np.float32, scalar=None):
    """A dry OneCall; scalars as PyCudaHandler._load_kernels formats them
    (double for float64, else float) unless ``scalar`` says."""
    scalar = scalar or (b"d" if itemsize == 8 else b"f")
    return _launch.OneCall(7, Arr, np.dtype(dtype), itemsize, BLOCK, PER_BLOCK, MAX_BLOCKS,
                           _functions(scalar), dry=True)


def _grid(n):
    return min(MAX_BLOCKS, -(-n // PER_BLOCK))


def _random_shape(rng):
    return tuple(int(d) for d in rng.integers(1, 9, size=int(rng.integers(0, 5))))


@pytest.mark.parametrize("trial", range(40))
def test_run_launches_pointers_then_n(trial):
    rng = np.random.default_rng(trial)
    shape = _random_shape(rng)
    if trial % 5 == 0:   # some large enough to hit the block cap
        shape = (int(rng.integers(30_000, 60_000)),)
    arrays = [Arr(shape) for _ in range(int(rng.integers(1, 5)))]
    index = int(rng.integers(0, len(FUNCS)))
    ops = _ops()
    assert ops.run(index, *arrays) is True
    n = math.prod(shape)
    assert ops.last == (FUNCS[index], _grid(n), BLOCK,
                        tuple(a.gpudata for a in arrays) + (n,))


@pytest.mark.parametrize("itemsize,dtype", [(4, np.float32), (8, np.float64), (2, np.float16),
                                            (2, "bfloat16")])
def test_scalars_are_passed_in_the_handlers_precision(itemsize, dtype):
    """float32 and float64 scalars in their own format; the half formats'
    in float32, the format their kernels compute in."""
    dtype = dtypes.resolve(dtype)
    rng = np.random.default_rng(itemsize)
    ops = _ops(itemsize, dtype)
    x, y = Arr((5, 3), dtype), Arr((5, 3), dtype)
    for s in [float(rng.normal()), 3, -2**40, 0.1, 70000.0]:
        want = float(dtypes.compute_dtype(dtype).type(s))
        assert ops.scalar(1, s, x, y) is True
        assert ops.last == (FUNCS[1], 1, BLOCK, (want, x.gpudata, y.gpudata, 15))
        assert ops.axpby(2, s, x, 0.5, y) is True
        assert ops.last == (FUNCS[2], 1, BLOCK, (want, x.gpudata, 0.5, y.gpudata, 15))


@pytest.mark.parametrize("scalar", [b"f", b"d"])
def test_scalars_are_as_wide_as_the_kernels_format(scalar):
    """The width comes from each function's format, not from the dtype."""
    x, y = Arr((5, 3)), Arr((5, 3))
    want = 0.1 if scalar == b"d" else float(np.float32(0.1))
    ops = _ops(scalar=scalar)
    assert ops.scalar(1, 0.1, x, y) is True
    assert ops.last[3][0] == want
    assert ops.axpby(2, 0.1, x, 0.1, y) is True
    assert ops.last[3][0] == ops.last[3][2] == want


def test_more_arrays_than_a_launch_takes_decline():
    """A row with more arrays than OneCall.run takes (7 arguments after the
    index) stays on the Python path: its method declines, raising nothing."""
    arrays = [Arr((4,)) for _ in range(8)]
    ops = _ops()
    assert ops.run(0, *arrays[:7]) is True
    assert ops.run(0, *arrays) is False
    assert ops.scalar(1, 1.0, *arrays[:7]) is False
    assert ops.last[3] == tuple(a.gpudata for a in arrays[:7]) + (4,)


@pytest.mark.parametrize("per_block,max_blocks", [(1, 1), (1024, 37), (4096, 1), (7, 2**40)])
def test_the_grid_is_one_formula(per_block, max_blocks):
    """_launch.grid (PyCudaHandler._grid's) and OneCall's launches agree with
    ceil(n / per_block), capped, at least one block, at the edges."""
    edges = {0, 1, per_block - 1, per_block, per_block + 1, per_block * max_blocks - 1,
             per_block * max_blocks, per_block * max_blocks + 1, 2**62}
    ops = _launch.OneCall(7, Arr, np.dtype(np.float32), 4, BLOCK, per_block, max_blocks,
                          _functions(b"f"), dry=True)
    for n in sorted(e for e in edges if 0 <= e < 2**63):
        want = max(1, min(-(-n // per_block), max_blocks))
        assert _launch.grid(n, per_block, max_blocks) == want, n
        if 0 < n < 2**40:
            ops.run(0, Arr((n,), strides=(4,)))
            assert ops.last[1] == want, n
    assert _launch.grid(-5, per_block, max_blocks) == 1
    with pytest.raises(ValueError):
        _launch.grid(10, 0, 4)
    with pytest.raises(TypeError):
        _launch.grid(10, 4)


def test_empty_arrays_need_no_launch():
    ops = _ops()
    empty = [Arr((0, 4), strides=(16, 4)) for _ in range(2)]   # C strides by the rule
    assert ops.run(0, *empty) is True
    assert ops.last is None


class Allocation:
    def __int__(self):
        return 0x7F00_0000_1000


def test_gpudata_may_be_an_object_with_int():
    ops = _ops()
    a = Arr((4,), gpudata=Allocation())
    assert ops.run(0, a, a) is True
    assert ops.last[3] == (0x7F00_0000_1000, 0x7F00_0000_1000, 4)


def _declined_cases():
    f32 = np.float32
    good = Arr((4, 6))

    class NoStrides:
        pass
    bare = Arr((4, 6))
    del bare.strides
    return {
        "subclass": [good, SubArr((4, 6))],
        "other dtype": [good, Arr((4, 6), np.float64)],
        "shapes differ": [good, Arr((6, 4))],
        "same size, other rank": [good, Arr((24,))],
        "transposed strides": [Arr((4, 6), strides=(4, 16))],
        "strides of a size-1 dim": [Arr((4, 1), strides=(4, 8))],
        "strides as a list": [Arr((4, 6), strides=[24, 4])],
        "shape as a list": [_with(Arr((4, 6)), shape=[4, 6])],
        "strides of another array": [good, Arr((4, 6), strides=(48, 8))],
        "no strides attribute": [bare],
        "gpudata None": [_with(Arr((4, 6)), gpudata=None)],
        "gpudata not a number": [_with(Arr((4, 6)), gpudata="x")],
        "negative gpudata": [_with(Arr((4, 6)), gpudata=-1)],
        "not an array": [np.zeros((4, 6), f32)],
        "other type": [NoStrides()],
    }


def _with(a, **attrs):
    a.__dict__.update(attrs)
    return a


@pytest.mark.parametrize("case", sorted(_declined_cases()))
def test_declines_every_doubt_and_does_nothing(case):
    arrays = _declined_cases()[case]
    ops = _ops()
    assert ops.run(0, *arrays) is False
    assert ops.last is None


@pytest.mark.parametrize("s", [True, np.float32(2.0), np.float64(1.5), "2", None, 10**400,
                               np.array(1.0)])
def test_declines_scalars_the_python_checks_must_see(s):
    ops = _ops()
    x = Arr((3,))
    assert ops.scalar(1, s, x, x) is False
    assert ops.axpby(2, s, x, 1.0, x) is False
    assert ops.axpby(2, 1.0, x, s, x) is False
    assert ops.last is None


def test_rejects_misuse_with_errors():
    ops = _ops()
    x = Arr((3,))
    with pytest.raises(IndexError):
        ops.run(len(FUNCS), x)
    with pytest.raises(IndexError):
        ops.run(-1, x)
    with pytest.raises(TypeError):
        ops.run(0)
    with pytest.raises(TypeError):
        ops.axpby(0, 1.0, x, 1.0)
    with pytest.raises(TypeError):   # a call's scalar where its kernel has none
        _ops(scalar=b"P").scalar(1, 1.0, x, x)
    with pytest.raises(TypeError):
        _ops().scalar(0, 1.0, x, x)
    functions = _functions(b"f")
    with pytest.raises(ValueError):
        _launch.OneCall(7, Arr, np.dtype(np.float32), 3, BLOCK, PER_BLOCK, MAX_BLOCKS, functions)
    for bad, error in (([(0, b"Pq")], ValueError), ([0x1000], TypeError),
                       ([(0x1000, "Pq")], TypeError), ([(0x1000, b"P" * 13)], ValueError)):
        with pytest.raises(error):
            _launch.OneCall(7, Arr, np.dtype(np.float32), 4, BLOCK, PER_BLOCK, MAX_BLOCKS, bad)


def test_the_op_table_matches_the_handler_contract():
    from handlers.base import Handler
    from handlers.optable import OPS
    for name, (call, kernel) in one_call.OPS.items():
        assert callable(getattr(Handler, name)), name
        assert call in ("run", "scalar", "axpby"), name
        assert kernel == OPS[name].kernel, name
    # Every elementwise row whose kernel takes its arrays (after at most one
    # leading scalar) is served: forgetting one is no longer possible.
    assert {"add_tt", "relu", "where_t", "pow_st", "elu_deriv", "copy_to_if"} <= set(one_call.OPS)


def _plan_key(a, axis, out):
    return (a.shape, axis, out.shape, a.gpudata % 16 == 0)


def test_sum_launches_a_stored_plan():
    ops = _ops()
    a, out = Arr((6, 5), gpudata=0x10000), Arr((5,), gpudata=0x20000)
    plans = {_plan_key(a, 0, out): (FUNCS[3], 9, b"PPPPqqqq", (1, 6, 5, 1), BLOCK, 0, 0)}
    assert ops.sum(plans, a, 0, out) is True
    assert ops.last == (FUNCS[3], 9, BLOCK, (0x10000, 0, 0x20000, 0, 1, 6, 5, 1))
    plans = {_plan_key(a, None, out): (FUNCS[3], 2, b"PPPPqqqq", (1, 30, 30, 1), BLOCK, 0, 0)}
    assert ops.sum(plans, a, None, Arr((1,), gpudata=0x20000)) is False   # other out shape
    out1 = Arr((1,), gpudata=0x20000)
    plans = {_plan_key(a, None, out1): (FUNCS[3], 2, b"PPPPqqqq", (1, 30, 30, 1), BLOCK, 0, 0)}
    assert ops.sum(plans, a, None, out1) is True
    # a tuple of axes, with the plan's own block size (sum_mid's 1024)
    b, outb = Arr((4, 6, 5), gpudata=0x10000), Arr((6,), gpudata=0x20000)
    plans = {_plan_key(b, (0, 2), outb): (FUNCS[3], 6, b"PPPPqqqqq", (4, 6, 5, 4, 1), 1024, 0, 0)}
    assert ops.sum(plans, b, (0, 2), outb) is True
    assert ops.last == (FUNCS[3], 6, 1024, (0x10000, 0, 0x20000, 0, 4, 6, 5, 4, 1))


class Reducer:
    """What ``reductions.remember`` reads of a PyCudaHandler, without a GPU:
    the device's facts (an H200's), the plan caches, the kernel table with
    made-up handles and the kernels' occupancy: ``per_sm`` blocks of each
    a multiprocessor, or by default the threads' limit (made-up handles
    must never reach the driver, so not ``reductions.blocks_per_sm``)."""

    def __init__(self, dtype=np.float32, sms=132, sm_threads=2048, per_sm=None):
        self.dtype = np.dtype(dtype)
        self._vec = 16 // self.dtype.itemsize
        self._sms, self._sm_threads = sms, sm_threads
        self.per_sm, self.asked = per_sm, []
        self._sum_plans = {}
        self._reduce_launches = {op: {} for op in reductions.ONE_CALL_OPS}
        scalar = "d" if self.dtype == np.float64 else "f"
        self._k = {name: kernel_loader.Kernel(name, fmt.replace("T", scalar), 0x40000 + 16 * i)
                   for i, (name, (_, fmt)) in enumerate(optable.KERNELS.items())}

    _sum_kernels = reductions.sum_kernels

    def _blocks_per_sm(self, form="TT"):
        def blocks(kernel, block):
            assert kernel in self._k, kernel
            self.asked.append((form, kernel, block))
            limit = self._sm_threads // block
            return limit if self.per_sm is None else min(limit, self.per_sm)
        return blocks


def _c_strides(shape, itemsize):
    return tuple(itemsize * math.prod(shape[i + 1:]) for i in range(len(shape)))


def _reduced(shape, axis, dtype=np.float32):
    """Arrays (a, out) of a reduction of ``shape`` over ``axis`` (none
    allocated: shapes of any size)."""
    axes = range(len(shape)) if axis is None else axis if type(axis) is tuple else (axis,)
    axes = {x % len(shape) for x in axes}
    out_shape = tuple(d for i, d in enumerate(shape) if i not in axes) or (1,)
    itemsize = np.dtype(dtype).itemsize
    return (Arr(shape, dtype, 0x100000, _c_strides(shape, itemsize)),
            Arr(out_shape, dtype, 0x80000000, _c_strides(out_shape, itemsize)))


#: the kernel family that serves each reduction
FAMILY = {"sum_t": "sum", "mean_t": "sum", "max_t": "max", "min_t": "min", "argmax_t": "pick"}


@pytest.mark.parametrize("name", reductions.ONE_CALL_OPS)
def test_extent_one_reductions_are_served_in_c(name):
    """A reduction over axes of extent 1 (the issue's max_t of (1589183, 1)
    and argmax_t of (883, 1, 13, 2) over axis 1) is remembered, and the C
    path launches it: the family's ``*_one`` kernel over every element (a
    copy, argmax's fill of 0), no workspace or counters, a 16-byte packet a
    thread up to 16 blocks per multiprocessor."""
    cases = [((1589183, 1), 1), ((883, 1, 13, 2), 1), ((1, 5, 1), 0), ((5, 1, 1, 3), -2)]
    if name in ("sum_t", "mean_t"):
        cases += [((1, 1), None), ((5, 1, 1, 3), (1, 2))]
    for shape, axis in cases:
        h, ops = Reducer(), _ops()
        a, out = _reduced(shape, axis)
        reductions.remember(h, name, a, axis, out)
        assert ops.sum(h._reduce_launches[name], a, axis, out) is True, (shape, axis)
        size = math.prod(shape)
        grid = max(1, min(-(-size // (256 * 4)), 16 * 132))
        assert ops.last == (h._k[f"{FAMILY[name]}_one"].handle, grid, 256,
                            (a.gpudata, 0, out.gpudata, 0, size)), (shape, axis)


#: a stream slot's fixed scratch for chunked sums (StreamSlot.sum_scratch)
WS, CNT = 0x9000_0000, 0xA000_0000


def _scratch_ops(scratch=(1 << 16, 64), base=0, **kw):
    """A dry OneCall with a fixed scratch of (bytes, counters) at WS and CNT
    (each moved by ``base``)."""
    ops = _ops(**kw)
    ops.set_scratch(WS + base, scratch[0], CNT + base, scratch[1])
    return ops


def test_a_chunked_plan_runs_on_the_objects_scratch():
    """A plan stating a workspace and counters gets the OneCall's own fixed
    scratch in their places: two objects (two stream groups) serving one
    dict of plans each pass theirs.  A plan needing more than the scratch
    holds, or any chunked plan on an object without scratch, declines with
    nothing done; a plan of neither gets null pointers."""
    a, out = Arr((6, 5), gpudata=0x10000), Arr((5,), gpudata=0x20000)

    def plans(ws, counters):
        return {_plan_key(a, 0, out): (FUNCS[3], 9, b"PPPPqqqq", (1, 6, 5, 2), BLOCK, ws,
                                       counters)}
    shared = plans(1 << 16, 64)   # exactly the scratch
    for base in (0, 0x100000):
        ops = _scratch_ops(base=base)
        assert ops.sum(shared, a, 0, out) is True
        assert ops.last == (FUNCS[3], 9, BLOCK, (0x10000, WS + base, 0x20000, CNT + base,
                                                 1, 6, 5, 2))
    for ws, counters in (((1 << 16) + 1, 1), (8, 65)):
        ops = _scratch_ops()
        assert ops.sum(plans(ws, counters), a, 0, out) is False
        assert ops.last is None
    bare = _ops()
    assert bare.sum(plans(8, 1), a, 0, out) is False and bare.last is None
    ops = _scratch_ops()
    assert ops.sum(plans(0, 0), a, 0, out) is True
    assert ops.last == (FUNCS[3], 9, BLOCK, (0x10000, 0, 0x20000, 0, 1, 6, 5, 2))


def test_set_scratch_checks_its_arguments():
    ops = _ops()
    for bad in ((WS, -1, CNT, 4), (WS, 16, CNT, -1), (0, 16, CNT, 4), (WS, 16, 0, 4)):
        with pytest.raises(ValueError):
            ops.set_scratch(*bad)
    with pytest.raises(TypeError):
        ops.set_scratch(WS, 16, CNT)
    with pytest.raises(TypeError):
        ops.set_scratch(WS, 16.0, CNT, 4)
    ops.set_scratch(0, 0, 0, 0)   # none: chunked plans decline


#: (shape, axis) whose plans on an H200 are chunked: 1-D extrema and sums of
#: 60k to 2M elements, a sum over None of a small array, few long rows, few
#: wide columns (8192x4096 over axis 0) and the mid kernel's chunks
CHUNKED = [((60000,), 0), ((250007,), -1), ((2000000,), 0), ((5, 1154496), 1),
           ((8192, 4096), 0), ((300, 300), None), ((256, 12, 32, 32), (0, 2, 3))]


@pytest.mark.parametrize("name", reductions.ONE_CALL_OPS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, "bfloat16"])
def test_remembered_chunked_launches_are_served_in_c(name, dtype):
    """A chunked plan whose scratch fits ``one_call_scratch`` is remembered
    with its needs (no address), and the C path launches the planner's
    kernel, grid and numbers on the OneCall's fixed scratch."""
    dtype = dtypes.resolve(dtype)
    width = 16 // dtype.itemsize
    nbytes, counters = reductions.one_call_scratch(132, 2048)
    served = 0
    for shape, axis in CHUNKED:
        if name in ("max_t", "min_t", "argmax_t") and type(axis) is not int:
            continue
        h, ops = Reducer(dtype), _scratch_ops((nbytes, counters), itemsize=dtype.itemsize,
                                              dtype=dtype)
        a, out = _reduced(shape, axis, dtype)
        axes = tuple(range(len(shape))) if axis is None else \
            tuple(sorted(x % len(shape) for x in (axis if type(axis) is tuple else (axis,))))
        n = math.prod(shape[x] for x in axes)
        plan = reductions.plan(shape, axes, True, width, FAMILY[name], 132, 2048,
                               n if name == "mean_t" else 1,
                               reductions.PICK_KINDS.get(name[:-2], 0))
        assert plan.counters > 0 and 0 < plan.workspace <= nbytes, (shape, plan)
        reductions.remember(h, name, a, axis, out)
        assert ops.sum(h._reduce_launches[name], a, axis, out) is True, (shape, axis)
        launch = plan.launch
        assert ops.last == (h._k[launch.kernel].handle, launch.grid, launch.block,
                            (a.gpudata, WS, out.gpudata, CNT) + launch.args), (shape, axis)
        served += 1
    assert served >= 5


@pytest.mark.parametrize("per_sm", [4, 8])
def test_remembered_launches_follow_the_kernels_occupancy(per_sm):
    """``remember`` stores the plan made with the handler's occupancy of
    the kernels (``_blocks_per_sm``), asked about the kernel it launches:
    a 1-D sum on an H200 whose kernels hold 4 blocks of 256 a
    multiprocessor is one wave of 528 chunks, where the threads' 8 gave
    1056, and short rows a wave of 528 tiles; the C path launches that."""
    nbytes, counters = reductions.one_call_scratch(132, 2048)
    for shape, axis, kernel in (((2**23,), 0, "sum_long"), ((100000, 9, 10), 1, "sum_short")):
        h = Reducer(per_sm=per_sm)
        ops = _scratch_ops((nbytes, counters))
        a, out = _reduced(shape, axis)
        reductions.remember(h, "sum_t", a, axis, out)
        assert ops.sum(h._reduce_launches["sum_t"], a, axis, out) is True
        assert ("TT", kernel, 256) in h.asked
        handle, grid, block, args = ops.last
        assert handle == h._k[kernel].handle and block == 256
        assert grid == 132 * per_sm, (shape, grid)
        if kernel == "sum_long":   # rows, n, chunk, chunks: a chunk a block
            rows, n, chunk, chunks = args[4:8]
            assert (rows, n, chunks) == (1, 2**23, grid)
            assert (chunks - 1) * chunk < n <= chunks * chunk


def test_chunked_plans_beyond_the_scratch_stay_in_python(monkeypatch):
    """A chunked plan that needs more than the fixed scratch is remembered
    as None, and declined: an argmax of the halves over a column axis past
    2^31 (pick64: 16-byte states, 8 columns a packet), 1 MB of states,
    against a scratch of a quarter of the library's (every plan of today's
    planners fits the library's: test_chunked_plans_fit_the_one_call_scratch)."""
    monkeypatch.setattr(reductions, "ONE_CALL_TASK_BYTES", reductions.ONE_CALL_TASK_BYTES // 4)
    dtype = dtypes.resolve("bfloat16")
    nbytes, counters = reductions.one_call_scratch(132, 2048)
    shape = (2**31 + 1, 1280)
    plan = reductions.plan(shape, (0,), True, 8, "pick", 132, 2048, 1, 2)
    assert plan.launch.kernel.startswith("pick64") and plan.workspace > nbytes
    h, ops = Reducer(dtype), _scratch_ops((nbytes, counters), itemsize=2, dtype=dtype)
    a, out = _reduced(shape, 0, dtype)
    reductions.remember(h, "argmax_t", a, 0, out)
    assert h._reduce_launches["argmax_t"][_plan_key(a, 0, out)] is None
    assert ops.sum(h._reduce_launches["argmax_t"], a, 0, out) is False and ops.last is None


@pytest.mark.parametrize("case", ["unknown", "stays in Python", "bool axis", "numpy axis",
                                  "bool in a tuple", "list axis", "overlap", "other alignment",
                                  "bad out", "bad a"])
def test_sum_declines(case):
    ops = _ops()
    a, out = Arr((6, 5), gpudata=0x10000), Arr((5,), gpudata=0x20000)
    axis = {"bool axis": 1, "bool in a tuple": (0, 1)}.get(case, 0)
    plans = {_plan_key(a, axis, out): (FUNCS[3], 9, b"PPPPqqqq", (1, 6, 5, 1), BLOCK, 0, 0)}
    if case == "unknown":
        plans = {}
    elif case == "stays in Python":   # a known combination that remember keeps in Python
        plans = {_plan_key(a, axis, out): None}
    elif case == "bool axis":
        axis = True
    elif case == "numpy axis":
        axis = np.int64(0)
    elif case == "bool in a tuple":   # (False, 1) == (0, 1): only the plan of (0, 1) is known
        axis = (False, 1)
    elif case == "list axis":
        axis = [0]
    elif case == "overlap":
        out = Arr((5,), gpudata=0x10000 + 4 * 29)   # the last element of a
        plans = {_plan_key(a, axis, out): (FUNCS[3], 9, b"PPPPqqqq", (1, 6, 5, 1), BLOCK, 0, 0)}
    elif case == "other alignment":
        a = Arr((6, 5), gpudata=0x10004)
    elif case == "bad out":
        out = Arr((5,), np.float64, gpudata=0x20000)
    else:
        a = Arr((6, 5), strides=(4, 24), gpudata=0x10000)
    assert ops.sum(plans, a, axis, out) is False
    assert ops.last is None


def test_sum_rejects_a_malformed_plan():
    ops = _ops()
    a, out = Arr((6, 5), gpudata=0x10000), Arr((5,), gpudata=0x20000)
    key = _plan_key(a, 0, out)
    with pytest.raises(TypeError):
        ops.sum({key: (FUNCS[3], 9, "PPPP", (), BLOCK, 0, 0)}, a, 0, out)
    with pytest.raises(TypeError):   # no block size
        ops.sum({key: (FUNCS[3], 9, b"PPPP", ())}, a, 0, out)
    with pytest.raises(TypeError):   # no workspace and counters
        ops.sum({key: (FUNCS[3], 9, b"PPPP", (), BLOCK)}, a, 0, out)
    with pytest.raises(ValueError):
        ops.sum({key: (0, 9, b"PPPP", (), BLOCK, 0, 0)}, a, 0, out)
    for block in (0, 48, 2048):
        with pytest.raises(ValueError):
            ops.sum({key: (FUNCS[3], 9, b"PPPP", (), block, 0, 0)}, a, 0, out)
    for ws, counters in ((-1, 0), (0, -1), (-8, 2)):
        with pytest.raises(ValueError):
            ops.sum({key: (FUNCS[3], 9, b"PPPP", (), BLOCK, ws, counters)}, a, 0, out)
    with pytest.raises(TypeError):
        ops.sum([], a, 0, out)
    assert ops.last is None


GEMM, CUBLAS, SMALL = 0x5000, 0x6000, 0x8000
#: The model's own copy of the rule: products with at most this many output
#: elements and inner dimension run on small_gemm, larger ones on cuBLAS.
SMALL_OUT, SMALL_K = 4096, 128


def _dot_ops(itemsize=4, gemm=GEMM, kind=None, dtype=None):
    """A dry OneCall reading the records of a fresh dict, as PyCudaHandler's
    (``products.dot`` fills it)."""
    dtype = dtype or (np.float32 if itemsize == 4 else np.float64)
    ops = _ops(itemsize, dtype)
    records = {}
    ops.set_dot(records, gemm, CUBLAS if gemm else 0, SMALL,
                int(itemsize == 8) if kind is None else kind)
    return ops, records, dtype


def _plan(records, a, b, out, ta, tb, beta, half=False, c_gemm=True):
    """Store the record that PyCudaHandler's Python path (``products.dot``)
    stores for this call; nothing for shapes that fail the shape rule."""
    try:
        plan = products.plan_dot(a.shape, b.shape, out.shape, ta, tb, beta, half, c_gemm)
    except ValueError:
        return
    records[products.dot_key(a.shape, b.shape, out.shape, ta, tb, beta)] = plan.launch


def _expected_dot(a, b, out, ta, tb, beta):
    """What a product must launch, from the shapes (an independent model):
    small_gemm for small products, else cuBLAS's column-major out^T =
    op(b)^T op(a)^T; a stack of untransposed a times one 2-D b is one tall
    product of all the stack's rows."""
    m, n = math.prod(out.shape[:-1]), out.shape[-1]
    k = a.shape[-2] if ta else a.shape[-1]
    if m * n <= SMALL_OUT and k <= SMALL_K:
        return (SMALL, -(-m * n // BLOCK), BLOCK,
                (a.gpudata, b.gpudata, out.gpudata, m, n, k, int(ta), int(tb), int(beta != 0)))
    return (GEMM, CUBLAS, (int(tb), int(ta), n, m, k, 1.0, b.gpudata, b.shape[-1], a.gpudata,
                           a.shape[-1], beta, out.gpudata, n))


def _product(rng, dtype, tall=False):
    m, n, k = (int(v) for v in rng.choice([1, 3, 16, 64, 100, 300], size=3))
    ta, tb = (False if tall else bool(rng.integers(2))), bool(rng.integers(2))
    stack = (int(rng.integers(1, 4)),) if tall else ()
    a = Arr(stack + ((k, m) if ta else (m, k)), dtype, gpudata=0x1000_0000)
    b = Arr((n, k) if tb else (k, n), dtype, gpudata=0x2000_0000)
    out = Arr(stack + (m, n), dtype, gpudata=0x3000_0000)
    return a, b, out, ta, tb, float(rng.integers(2))


@pytest.mark.parametrize("trial", range(40))
def test_dot_launches_the_small_kernel_or_cublas(trial):
    """Unknown to C until the Python path has stored its record; then served
    as the model says, on the first call and again from C's own cache."""
    rng = np.random.default_rng(500 + trial)
    ops, records, dtype = _dot_ops(4 if trial % 2 else 8)
    a, b, out, ta, tb, beta = _product(rng, dtype, tall=trial % 4 == 3)
    assert ops.dot(a, b, out, ta, tb, beta) is False
    assert ops.last is None
    _plan(records, a, b, out, ta, tb, beta)
    for _ in range(2):
        assert ops.dot(a, b, out, ta, tb, beta) is True
        assert ops.last == _expected_dot(a, b, out, ta, tb, beta)
    other = 1.0 - beta   # the other op: a record of its own
    assert ops.dot(a, b, out, ta, tb, other) is False


class _Trap(int):
    """A stride whose finalizer runs Python (once): what a DECREF inside
    OneCall.dot may do with arrays of an exotic type."""

    def __new__(cls, value, fn):
        obj = int.__new__(cls, value)
        obj.fn = fn
        return obj

    def __del__(self):
        fn, self.fn = self.fn, None
        if fn:
            fn()


class _TrapArr(Arr):
    """Its strides are new objects at every read, with finalizers when it has
    a ``fn`` (OneCall takes this class as its exact array type)."""

    fn = None

    @property
    def strides(self):
        return tuple(_Trap(v, self.fn) for v in self._plain)

    @strides.setter
    def strides(self, value):
        self._plain = value


def test_dot_runs_its_record_though_a_finalizer_clears_the_cache():
    """OneCall.dot copies its record out before dropping its references: a
    finalizer run by that drop (here one that empties C's cache through
    set_dot) cannot change what this call launches."""
    ops = _launch.OneCall(7, _TrapArr, np.dtype(np.float32), 4, BLOCK, PER_BLOCK, MAX_BLOCKS,
                          _functions(b"f"), dry=True)
    records = {}
    ops.set_dot(records, GEMM, CUBLAS, SMALL, 0)
    shapes = ((4, 8), (8, 4), (4, 4))
    a, b, out = (_TrapArr(s, gpudata=0x7000_0000 + 0x10000 * i) for i, s in enumerate(shapes))
    _plan(records, a, b, out, False, False, 0.0)
    assert ops.dot(a, b, out, False, False, 0.0) is True   # the record now in C's cache
    fired = []

    def clear():
        fired.append(True)
        ops.set_dot({}, GEMM, CUBLAS, SMALL, 0)

    out.fn = clear
    assert ops.dot(a, b, out, False, False, 0.0) is True
    assert fired
    assert ops.last == _expected_dot(a, b, out, False, False, 0.0)


def test_dot_serves_many_combinations_from_one_object():
    """More combinations than C keeps: each is served as its own record says,
    whatever was called before."""
    rng = np.random.default_rng(7)
    ops, records, dtype = _dot_ops()
    calls = [_product(rng, dtype, tall=i % 3 == 0) for i in range(60)]
    for call in calls:
        _plan(records, *call)
    for call in calls * 2 + calls[::-1]:
        assert ops.dot(*call) is True
        assert ops.last == _expected_dot(*call)


@pytest.mark.parametrize("case", ["k differs", "out shape", "1-D", "3-D", "batched",
                                  "out overlaps a", "out overlaps b", "numpy flag", "flag 2",
                                  "strides", "no gemm symbol", "empty k, beta 0", "other dtype",
                                  "unknown"])
def test_dot_declines(case):
    """Declines the checks' doubts even where a record is stored for the
    shapes, and the products that stay in Python (record None)."""
    ops, records, dtype = _dot_ops(gemm=0 if case == "no gemm symbol" else GEMM)
    a, b, out = Arr((64, 80), gpudata=0x100000), Arr((80, 96), gpudata=0x200000), \
        Arr((64, 96), gpudata=0x300000)
    ta, tb, beta = False, False, 0.0
    if case == "k differs":
        b = Arr((81, 96), gpudata=0x200000)
    elif case == "out shape":
        out = Arr((96, 64), gpudata=0x300000)
    elif case == "1-D":
        a = Arr((64 * 80,), gpudata=0x100000)
    elif case == "3-D":
        out = Arr((64, 96, 1), gpudata=0x300000)
    elif case == "batched":   # cuBLAS's strided-batched GEMM: the Python path
        a, out = Arr((2, 64, 80), gpudata=0x100000), Arr((2, 64, 96), gpudata=0x300000)
        b = Arr((2, 80, 96), gpudata=0x200000)
    elif case == "out overlaps a":
        out = Arr((64, 96), gpudata=0x100000 + 4 * 64 * 80 - 4)
    elif case == "out overlaps b":
        out = Arr((64, 96), gpudata=0x200000 - 4 * 64 * 96 + 4)
    elif case == "numpy flag":
        ta = np.bool_(False)
    elif case == "flag 2":
        tb = 2
    elif case == "strides":
        a = Arr((64, 80), strides=(4, 256), gpudata=0x100000)
    elif case == "empty k, beta 0":   # the Python path zero-fills out
        a, b = Arr((64, 0), strides=(0, 4), gpudata=0x100000), \
            Arr((0, 96), strides=(384, 4), gpudata=0x200000)
    elif case == "other dtype":
        b = Arr((80, 96), np.float64, gpudata=0x200000)
    if case != "unknown":
        _plan(records, a, b, out, ta, tb, beta, c_gemm=case != "no gemm symbol")
    assert ops.dot(a, b, out, ta, tb, beta) is False
    assert ops.last is None


@pytest.mark.parametrize("kind", [2, 3])
def test_half_dot_add_on_cublas_stays_in_python(kind):
    """A half format's cuBLAS-sized dot_add_mm declines (the Python path
    adds a float32 product and rounds once); its dot_mm and small products
    are served."""
    dtype = dtypes.resolve("bfloat16" if kind == 2 else np.float16)
    ops, records, _ = _dot_ops(2, kind=kind, dtype=dtype)
    a, b = Arr((64, 80), dtype, gpudata=0x100000), Arr((80, 96), dtype, gpudata=0x200000)
    out = Arr((64, 96), dtype, gpudata=0x300000)
    small_a, small_out = Arr((8, 80), dtype, gpudata=0x100000), Arr((8, 96), dtype,
                                                                     gpudata=0x300000)
    for call in ((a, b, out, False, False, 1.0), (a, b, out, False, False, 0.0),
                 (small_a, b, small_out, False, False, 1.0)):
        _plan(records, *call, half=True)
    assert ops.dot(a, b, out, False, False, 1.0) is False
    assert ops.last is None
    assert ops.dot(a, b, out, False, False, 0.0) is True
    assert ops.last == _expected_dot(a, b, out, False, False, 0.0)
    assert ops.dot(small_a, b, small_out, False, False, 1.0) is True   # one rounding there too
    assert ops.last == _expected_dot(small_a, b, small_out, False, False, 1.0)


def test_set_dot_takes_a_dict_and_a_known_kind():
    ops = _ops()
    for kind in (-1, 6):
        with pytest.raises(ValueError):
            ops.set_dot({}, GEMM, CUBLAS, SMALL, kind)
    with pytest.raises(TypeError):
        ops.set_dot({}, GEMM, CUBLAS, SMALL)
    with pytest.raises(TypeError):
        ops.set_dot([], GEMM, CUBLAS, SMALL, 0)


def test_dot_rejects_a_malformed_record():
    a, b, out = Arr((4, 5), gpudata=0x100000), Arr((5, 6), gpudata=0x200000), \
        Arr((4, 6), gpudata=0x300000)
    key = products.dot_key(a.shape, b.shape, out.shape, False, False, 0.0)
    for record, error in ((("small", 1, BLOCK, 4, 6, 5, 0, 0), TypeError),   # one short
                          (("small", 0, BLOCK, 4, 6, 5, 0, 0, 0), ValueError),   # no blocks
                          (("small", 1, 2048, 4, 6, 5, 0, 0, 0), ValueError),
                          (("gemm", 0, 0, 6, 4, 5, 2, 6, 0, 5, 6, 0.0), ValueError),   # A = 2
                          (("gemm", 0, 0, 6, 4, 5, 1, 6, 0, 5, 6, "0"), TypeError),
                          (("other", 1), TypeError), (False, TypeError)):
        ops, records, _ = _dot_ops()
        records[key] = record
        with pytest.raises(error):
            ops.dot(a, b, out, False, False, 0.0)
    ops, records, _ = _dot_ops(gemm=0)   # a gemm record with no GEMM to call
    records[key] = ("gemm", 0, 0, 6, 4, 5, 1, 6, 0, 5, 6, 0.0)
    with pytest.raises(ValueError):
        ops.dot(a, b, out, False, False, 0.0)


def test_dot_has_nothing_to_do_for_empty_products():
    ops, records, _ = _dot_ops()
    a, b = Arr((64, 0), strides=(0, 4), gpudata=0x100000), \
        Arr((0, 96), strides=(384, 4), gpudata=0x200000)
    out = Arr((64, 96), gpudata=0x300000)
    e = Arr((0, 5), strides=(20, 4), gpudata=0x100000)
    e_b, e_out = Arr((5, 7), gpudata=0x200000), Arr((0, 7), strides=(28, 4), gpudata=0x300000)
    _plan(records, a, b, out, False, False, 1.0)
    _plan(records, e, e_b, e_out, False, False, 0.0)
    assert ops.dot(a, b, out, False, False, 1.0) is True
    assert ops.dot(e, e_b, e_out, False, False, 0.0) is True
    assert ops.last is None
    # Flags other than True/False (the Python checks raise TypeError): declined.
    assert ops.dot(e, e_b, e_out, 0, 0, 0.0) is False
    with pytest.raises(TypeError):
        ops.dot(a, b, a, False, False, 1)   # beta must be a float


# --------------------------------------------------------------------- on a GPU
@pytest.fixture(scope="module", params=[np.float32, np.float64], ids=["f32", "f64"])
def gpu(request):
    try:
        from handlers import PyCudaHandler
        h = PyCudaHandler(request.param, seed=3)
    except (ImportError, RuntimeError) as e:
        pytest.skip(f"PyCudaHandler unavailable: {e}")
    return h


def _args(name, h, rng, shape):
    call, _ = one_call.OPS[name]
    from handlers.base import Handler
    nargs = Handler.__dict__[name].__code__.co_argcount - 1

    def arr():
        return h.create_from_numpy(rng.uniform(0.1, 2.0, shape))
    if call == "axpby":
        return [float(rng.normal()), arr(), float(rng.normal()), arr()]
    if call == "scalar":
        return [float(rng.normal()), arr(), arr()]
    return [arr() for _ in range(nargs)]


@pytest.mark.parametrize("name", sorted(one_call.OPS))
def test_gpu_one_call_equals_the_python_path(gpu, name):
    from handlers.base import Handler
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    for shape in [(1000,), (37, 53), (2, 3, 4, 5), (1,)]:
        fast = _args(name, gpu, rng, shape)
        slow = [gpu.create_from_numpy(gpu.get_numpy_copy(a)) if hasattr(a, "gpudata") else a
                for a in fast]
        method, kernel = one_call.OPS[name]
        index = list(one_call.OPS).index(name)
        assert getattr(gpu._one_call, method)(index, *fast) is True   # served in C
        Handler.__dict__[name](gpu, *slow)                             # the Python path
        for f, s in zip(fast, slow):
            if hasattr(f, "gpudata"):
                np.testing.assert_array_equal(gpu.get_numpy_copy(f), gpu.get_numpy_copy(s))


def test_gpu_views_launch_on_their_own_stream(gpu):
    views = [gpu.with_streams(k) for k in range(gpu.num_stream_groups)]
    assert len({id(v._one_call) for v in views}) == len(views)
    x = gpu.create_from_numpy(np.arange(4096.0))
    outs = [gpu.zeros((4096,)) for _ in views]
    for k, (v, out) in enumerate(zip(views, outs)):
        v.mult_st(float(k), x, out)
    gpu.synchronize_all_streams()
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(gpu.get_numpy_copy(out), k * np.arange(4096.0))


def test_gpu_declined_arrays_still_compute(gpu):
    # A (4, 1) array with an unusual stride of its size-1 axis is C-contiguous
    # for the Python checks but not for the one-call path.
    from pycuda.gpuarray import GPUArray
    x = gpu.create_from_numpy(np.arange(4.0).reshape(4, 1))
    odd = GPUArray((4, 1), gpu.dtype, gpudata=x.gpudata, strides=(x.dtype.itemsize, 64),
                   base=x)
    out = gpu.zeros((4, 1))
    assert gpu._one_call.run(0, odd, odd, out) is False
    gpu.add_tt(odd, odd, out)
    np.testing.assert_array_equal(gpu.get_numpy_copy(out), 2 * np.arange(4.0).reshape(4, 1))


_REFERENCE = {"sum_t": np.sum, "mean_t": np.mean, "max_t": np.max, "min_t": np.min,
              "argmax_t": np.argmax}


@pytest.mark.parametrize("name", list(_REFERENCE))
@pytest.mark.parametrize("shape,axis", [((1000,), 0), ((1000,), None), ((37, 53), -1),
                                        ((37, 53), 0), ((2, 3, 4, 5), 2), ((64, 4096), 0),
                                        ((3, 70000), 1), ((8, 200, 4, 4), (0, 2, 3)),
                                        ((64, 12, 8, 8), (0, 2, 3)), ((3, 5, 7), (0, 2)),
                                        ((3, 5, 7, 2), (1, 2)), ((6, 1, 9), 1),
                                        ((4, 1, 1, 3), (1, 2)), ((1589183, 1), 1),
                                        ((883, 1, 13, 2), 1), ((1, 1), None)])
def test_gpu_reduction_one_call_equals_the_python_path(gpu, name, shape, axis):
    """Each reduction's second call of a combination is served in C (every
    one-launch plan but the general kernel's, whose arguments are too many:
    chunked plans on the slot's fixed scratch, a reduction over axes of
    extent 1 the ``*_one`` copy or fill), bit for bit as the Python path,
    and both agree with float64 NumPy."""
    from handlers.base import Handler
    if name in ("max_t", "min_t", "argmax_t") and type(axis) is not int:
        pytest.skip(f"{name} takes one int axis")
    rng = np.random.default_rng(len(shape) * 100 + (axis if type(axis) is int else 7))
    x = rng.uniform(-1, 1, shape)
    a = gpu.create_from_numpy(x)
    want = _REFERENCE[name](x, axis=axis)
    out, ref = gpu.zeros(np.shape(want)), gpu.zeros(np.shape(want))
    getattr(gpu, name)(a, axis, out)        # the first call checks, plans and remembers
    getattr(Handler, name)(gpu, a, axis, ref)
    key = (a.shape, axis, out.shape, int(a.gpudata) % 16 == 0)
    stored = gpu._reduce_launches[name][key]
    served = gpu._one_call.sum(gpu._reduce_launches[name], a, axis, out)
    assert served is (stored is not None)
    axes = tuple(range(len(shape))) if axis is None else \
        tuple(sorted(k % len(shape) for k in (axis if type(axis) is tuple else (axis,))))
    assert served or reductions.layout(shape, axes)[0] == "passes"   # sum_gen*: Python
    getattr(gpu, name)(a, axis, out)
    np.testing.assert_array_equal(gpu.get_numpy_copy(out), gpu.get_numpy_copy(ref))
    tol = 1e-4 if gpu.dtype == np.float32 else 1e-10
    np.testing.assert_allclose(gpu.get_numpy_copy(out), want, rtol=tol, atol=tol * shape[-1])


@pytest.mark.parametrize("name", list(_REFERENCE))
@pytest.mark.parametrize("shape,axis", [((4099, 1), 1), ((1, 4099), 0), ((3, 1, 1, 5), (1, 2))])
@pytest.mark.parametrize("in_off,out_off", [(0, 0), (1, 1), (0, 1)])
def test_gpu_extent_one_reductions_are_numpys(gpu, name, shape, axis, in_off, out_off):
    """Over axes of extent 1, as NumPy: max_t and min_t return each element
    bit for bit (NaN, -0.0, infinities, subnormals), sum_t and mean_t the
    element plus 0 (-0.0 gives 0.0), argmax_t 0; on the contract's Python
    path and in C, with input and output on 16 bytes or not (the kernel's
    packets or elements), the elements around the output untouched."""
    from handlers.base import Handler
    if name in ("max_t", "min_t", "argmax_t") and type(axis) is not int:
        pytest.skip(f"{name} takes one int axis")
    rng = np.random.default_rng(in_off * 10 + out_off + len(shape))
    flat = rng.uniform(-1, 1, math.prod(shape))
    special = [np.nan, -0.0, 0.0, np.inf, -np.inf, np.finfo(gpu.dtype).smallest_subnormal]
    each = min(50, flat.size // len(special))   # (3, 1, 1, 5) holds 15 elements
    flat[rng.permutation(flat.size)[:len(special) * each]] = np.repeat(special, each)
    x = flat.astype(gpu.dtype).reshape(shape)
    want = np.asarray(_REFERENCE[name](x, axis=axis), gpu.dtype)
    a = gpu.view_t(gpu.create_from_numpy(np.concatenate([np.ones(in_off), x.reshape(-1), [2.0]])),
                   in_off, shape)
    guard = rng.uniform(-1, 1, want.size + 2).astype(gpu.dtype)
    buf = gpu.create_from_numpy(guard)
    out = gpu.view_t(buf, out_off, want.shape)
    getattr(gpu, name)(a, axis, out)           # remembered (in C already if seen before)
    for call in ("python", "c"):
        gpu.fill(out, 7.0)
        if call == "python":
            getattr(Handler, name)(gpu, a, axis, out)
        else:
            assert gpu._one_call.sum(gpu._reduce_launches[name], a, axis, out) is True
        got = gpu.get_numpy_copy(out)
        if name in ("sum_t", "mean_t"):       # NaN as NaN: the GPU's may be another one
            np.testing.assert_array_equal(got, want)
            numbers = ~np.isnan(want)
            np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]))
        else:
            assert got.tobytes() == want.tobytes(), call
        rest = np.delete(gpu.get_numpy_copy(buf), range(out_off, out_off + want.size))
        np.testing.assert_array_equal(rest, np.delete(guard, range(out_off, out_off + want.size)))


_FEW_HANDLERS = {}


def _few_handler(fmt):
    """A PyCudaHandler of format ``fmt`` for the few-element rows' test (one
    per format and module), or a skip."""
    if fmt not in _FEW_HANDLERS:
        try:
            from handlers import PyCudaHandler
            _FEW_HANDLERS[fmt] = PyCudaHandler(dtypes.resolve(fmt), seed=5)
        except (ImportError, RuntimeError) as e:
            _FEW_HANDLERS[fmt] = e
    h = _FEW_HANDLERS[fmt]
    if isinstance(h, Exception):
        pytest.skip(f"PyCudaHandler unavailable: {h}")
    return h


@pytest.mark.parametrize("fmt", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("name", list(_REFERENCE))
@pytest.mark.parametrize("n", [2, 3, 5, 8, 9, 17, 29, 64])
@pytest.mark.parametrize("rows,in_off", [(1, 0), (511, 1), (513, 1), (1081347, 0)])
def test_gpu_short_rows_are_numpys(fmt, name, n, rows, in_off):
    """Short rows (``*_thread`` up to THREAD_ROW elements: a thread a row,
    two rows a thread; ``*_lanes`` up to SHORT_ROW: a group of lanes a
    row), with grids that stride past 16 blocks a multiprocessor for the
    million rows, give float64 NumPy's results in every format, on the
    Python path and in C, from inputs on 16 bytes or not: sums and means
    within rounding, max and min exactly with NaN propagated, argmax the
    first index of the maximum or of the first NaN (rows of ties and of
    NaN planted)."""
    from handlers.base import Handler
    from handlers.cuda.launch import THREAD_ROW
    h = _few_handler(fmt)
    rng = np.random.default_rng([n, rows, in_off, len(name)])
    x = rng.integers(-4, 5, (rows, n)).astype(np.float64)   # small integers: many ties
    if rows > 4:
        x[1] = 2.0                                          # a row of ties
        x[2, n // 2] = np.nan                               # NaN inside a row
        x[3, :] = np.nan
        x[4, 0] = -0.0
    x = x.astype(h.dtype)                                   # what the handler holds
    want = _REFERENCE[name](x.astype(np.float64), axis=1)
    flat = np.concatenate([np.ones(in_off, h.dtype), x.reshape(-1)])
    a = h.view_t(h.create_from_numpy(flat), in_off, (rows, n))
    out = h.zeros((rows,))
    plan = reductions.plan((rows, n), (1,), in_off == 0, h._vec, FAMILY[name], 132, 2048)
    assert plan.launch.kernel.split("_")[1] == ("thread" if n <= THREAD_ROW else "lanes")
    getattr(h, name)(a, 1, out)                              # planned and remembered
    for call in ("python", "c"):
        h.fill(out, 7.0)
        if call == "python":
            getattr(Handler, name)(h, a, 1, out)
        else:
            assert h._one_call.sum(h._reduce_launches[name], a, 1, out) is True
        got = h.get_numpy_copy(out).astype(np.float64)
        if name in ("sum_t", "mean_t"):
            # integers: exact sums (64 of at most 4 in magnitude: exact in
            # every format); a mean's quotient is rounded to the
            # format (once, or through float for the halves: an ulp apart)
            close = np.asarray(want, h.dtype).astype(np.float64)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(close))
            ulp = 2.0 ** (1 - dtypes.significand_bits(h.dtype))
            np.testing.assert_allclose(got, close, rtol=ulp, atol=0)
        else:
            np.testing.assert_array_equal(got, np.asarray(want, np.float64), call)


def _chunked_case(gpu, name, shape, axis, rng):
    """(a, out, want, atol) of reduction ``name`` of fresh random values:
    ``want`` float64 NumPy's result of the values the handler holds, and
    its tolerance (sums and means: 1e-4 of sqrt(n) in float32; the extrema
    are exact)."""
    x = rng.uniform(-1, 1, shape).astype(gpu.dtype)
    want = _REFERENCE[name](x.astype(np.float64), axis=axis)
    n = x.size // max(1, np.size(want))
    tol = (1e-4 if gpu.dtype == np.float32 else 1e-10) * math.sqrt(n)
    atol = tol / n if name == "mean_t" else tol if name == "sum_t" else 0.0
    return gpu.create_from_numpy(x), gpu.zeros(np.shape(want) or (1,)), want, atol


@pytest.mark.parametrize("name", list(_REFERENCE))
@pytest.mark.parametrize("shape,axis", CHUNKED)
def test_gpu_chunked_reductions_are_served_in_c(gpu, name, shape, axis):
    """A chunked plan (partials and counters: 1-D extrema and sums of 60k
    to 2M elements, a sum over None, few long rows, wide columns, the mid
    kernel) is remembered and served in C on the slot's fixed scratch, bit
    for bit as the Python path (on the slot's own workspace) and as float64
    NumPy says.  Served ten times back to back between launches of another
    chunked plan, it gives the same bits each time: every launch finds its
    counters at zero (the kernels reset them)."""
    from handlers.base import Handler
    if name in ("max_t", "min_t", "argmax_t") and type(axis) is not int:
        pytest.skip(f"{name} takes one int axis")
    rng = np.random.default_rng(math.prod(shape) % 2**32 + len(name))
    a, out, want, atol = _chunked_case(gpu, name, shape, axis, rng)
    b, out_b, want_b, atol_b = _chunked_case(gpu, name, (3, 250007), 1, rng)
    ref = gpu.zeros(out.shape)
    getattr(Handler, name)(gpu, a, axis, ref)          # the Python path alone
    getattr(gpu, name)(a, axis, out)                   # the Python path, then remember
    getattr(gpu, name)(b, 1, out_b)
    for x, ax, o in ((a, axis, out), (b, 1, out_b)):
        key = (x.shape, ax, o.shape, int(x.gpudata) % 16 == 0)
        stored = gpu._reduce_launches[name][key]
        assert stored is not None and stored[5] > 0 and stored[6] > 0   # chunked, in C
    expect = gpu.get_numpy_copy(ref)
    np.testing.assert_allclose(expect.reshape(np.shape(want)), want, rtol=0, atol=atol)
    expect_b = gpu.get_numpy_copy(out_b)
    np.testing.assert_allclose(expect_b, want_b, rtol=0, atol=atol_b)
    outs = []
    for _ in range(10):
        o, o_b = gpu.zeros(out.shape), gpu.zeros(out_b.shape)
        gpu.fill(o, np.nan)
        assert gpu._one_call.sum(gpu._reduce_launches[name], a, axis, o) is True
        assert gpu._one_call.sum(gpu._reduce_launches[name], b, 1, o_b) is True
        outs.append((o, o_b))
    for o, o_b in outs:
        assert gpu.get_numpy_copy(o).tobytes() == expect.tobytes()
        assert gpu.get_numpy_copy(o_b).tobytes() == expect_b.tobytes()


def test_gpu_chunked_reductions_on_every_group_and_thread(gpu):
    """Each stream group's view serves chunked reductions on its own slot's
    scratch, all groups at once (one scratch shared by two streams would mix
    their partials), while threads issue on one group's stream, in C and on
    the Python path (same stream: its launches run one after another); every
    result is float64 NumPy's."""
    import threading

    from handlers.base import Handler
    views = [gpu.with_streams(k) for k in range(gpu.num_stream_groups)]
    assert len({s.sum_scratch[0] for s in gpu._all_slots}) == len(gpu._all_slots)
    assert len({s.sum_scratch[2] for s in gpu._all_slots}) == len(gpu._all_slots)
    rng = np.random.default_rng(11)
    cases = [_chunked_case(gpu, "sum_t", (2000000,), 0, rng) for _ in views]
    gpu.synchronize_all_streams()                       # the inputs, for every group
    for v, (a, out, _, _) in zip(views, cases):
        v.sum_t(a, 0, out)                              # plan and remember, per group
    assert gpu._reduce_launches["sum_t"][((2000000,), 0, (1,), True)][6] > 0   # chunked
    gpu.synchronize_all_streams()
    for _ in range(5):
        for v, (a, out, _, _) in zip(views, cases):
            assert v._one_call.sum(v._reduce_launches["sum_t"], a, 0, out) is True
    gpu.synchronize_all_streams()
    for _, out, want, atol in cases:
        np.testing.assert_allclose(gpu.get_numpy_copy(out), [want], rtol=0, atol=atol)
    view = views[-1]
    jobs = [_chunked_case(gpu, "max_t", (250007,), 0, rng) for _ in range(4)]
    gpu.synchronize_all_streams()

    def work(k):
        a, out, _, _ = jobs[k]
        for i in range(20):
            if k % 2 or i % 3:
                view.max_t(a, 0, out)                   # C, after its first call
            else:
                Handler.max_t(view, a, 0, out)          # the Python path's workspace
    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    view.synchronize()
    for _, out, want, _ in jobs:
        np.testing.assert_array_equal(gpu.get_numpy_copy(out), [want])


def test_gpu_chunked_reductions_beside_a_captured_one(gpu):
    """A captured chunked reduction keeps the Python path (the graph owns
    its partials and counters); eager ones served in C between its replays,
    on the same stream, use the slot's fixed scratch: neither disturbs the
    other."""
    rng = np.random.default_rng(5)
    a, out, want, _ = _chunked_case(gpu, "min_t", (2000000,), 0, rng)
    b, out_b, want_b, _ = _chunked_case(gpu, "min_t", (250007,), 0, rng)
    gpu.min_t(b, 0, out_b)                              # remembered: C from now on
    with gpu.capture() as g:
        gpu.min_t(a, 0, out)
    for _ in range(5):
        gpu.fill(out, np.nan)
        gpu.fill(out_b, np.nan)
        g.replay()
        assert gpu._one_call.sum(gpu._reduce_launches["min_t"], b, 0, out_b) is True
        g.replay()
        np.testing.assert_array_equal(gpu.get_numpy_copy(out), [want])
        np.testing.assert_array_equal(gpu.get_numpy_copy(out_b), [want_b])
    g.close()


def _assert_dot_served_in_c(gpu, x, y, c, ta, tb):
    """dot_mm and dot_add_mm of host x, y (into c): the Python path plans and
    runs each; then OneCall.dot serves the same call in C, bit for bit, and
    both agree with NumPy."""
    from handlers.base import Handler
    a, b = gpu.create_from_numpy(x), gpu.create_from_numpy(y)
    k = x.shape[-2] if ta else x.shape[-1]
    for name, beta in (("dot_mm", 0.0), ("dot_add_mm", 1.0)):
        fast, slow = gpu.create_from_numpy(c), gpu.create_from_numpy(c)
        Handler.__dict__[name](gpu, a, b, slow, ta, tb)   # the Python path, which plans
        assert gpu._one_call.dot(a, b, fast, ta, tb, beta) is True    # served in C
        got = gpu.get_numpy_copy(fast)
        np.testing.assert_array_equal(got, gpu.get_numpy_copy(slow))
        want = (np.swapaxes(x, -1, -2) if ta else x) @ (y.T if tb else y) + beta * c
        tol = 1e-4 if gpu.dtype == np.float32 else 1e-10
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * k)


@pytest.mark.parametrize("m,n,k", [(16, 16, 16), (1, 7, 3), (64, 50, 128), (300, 200, 100),
                                   (256, 256, 16)])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_gpu_dot_one_call_equals_the_python_path(gpu, m, n, k, ta, tb):
    rng = np.random.default_rng(m * 7 + n * 3 + k + 2 * ta + tb)
    x = rng.uniform(-1, 1, (k, m) if ta else (m, k))
    y = rng.uniform(-1, 1, (n, k) if tb else (k, n))
    _assert_dot_served_in_c(gpu, x, y, rng.uniform(-1, 1, (m, n)), ta, tb)


@pytest.mark.parametrize("stack,m,n,k", [(3, 5, 7, 16), (4, 100, 96, 64)])
@pytest.mark.parametrize("tb", [False, True])
def test_gpu_tall_dot_one_call_equals_the_python_path(gpu, stack, m, n, k, tb):
    """A stack of a times one shared b, one tall product, is served in C too."""
    rng = np.random.default_rng(stack * 1000 + m + n + k + tb)
    x = rng.uniform(-1, 1, (stack, m, k))
    y = rng.uniform(-1, 1, (n, k) if tb else (k, n))
    _assert_dot_served_in_c(gpu, x, y, rng.uniform(-1, 1, (stack, m, n)), False, tb)


def test_gemm_entry_points_refuse_an_unknown_kind_or_no_symbol():
    """_launch.gemm and gemm_batched check their GEMM kind (0-5: float,
    double, the two halves, the halves into float32) and symbol before they
    call anything."""
    ints = (0, 0, 4, 4, 4)
    for kind, symbol in ((6, 0x10), (-1, 0x10), (0, 0)):
        with pytest.raises(ValueError):
            _launch.gemm(symbol, 0, *ints, 1.0, 0, 4, 0, 4, 0.0, 0, 4, kind)
        with pytest.raises(ValueError):
            _launch.gemm_batched(symbol, 0, *ints, 1.0, 0, 4, 16, 0, 4, 16, 0.0, 0, 4, 16, 2,
                                 kind)
