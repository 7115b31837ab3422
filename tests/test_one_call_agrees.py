"""The one-call path (``handlers.cuda._launch.OneCall``) agrees with the Python path.

Generated from the op table: for every op of ``one_call.OPS`` and a set of
argument cases made from the op's row (its parameters and scalars), the C
path, built as PyCudaHandler builds it (``one_call.make``, dry), is compared
with the contract's Python path (``Handler``'s public method: the checks of
``handlers/checks.py``, then the backend hook) run on a handler with no GPU
that records what PyCudaHandler would launch.  For each case and dtype:

* the C path never accepts what the Python path rejects;
* it accepts the ordinary valid call (exact array type and dtype, C strides,
  float or int scalars);
* when it accepts, it launches exactly what the Python path would: the
  function of the op's kernel, the grid, the block and the kernel arguments
  as the kernel receives them (nothing at all for n == 0);
* when it declines, it has done nothing.

Runs on a CPU: no kernel is launched, only recorded.
"""
import math
import threading
import zlib
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest

_launch = pytest.importorskip(
    "handlers.cuda._launch",
    reason="handlers.cuda._launch is not built (no C compiler at install): same-shape ops "
           "take the Python path; `pip install -e .` builds it")

from handlers import dtypes, optable  # noqa: E402
from handlers.base import Handler  # noqa: E402
from handlers.cuda import kernel_loader, one_call, products  # noqa: E402
from handlers.cuda.handler import PyCudaHandler  # noqa: E402

BLOCK, MAX_BLOCKS = 256, 37          # a small block cap, so that big arrays reach it
VEC = {4: 4, 8: 2}                   # elements per thread, as PyCudaHandler._vec
DTYPES = (np.float32, np.float64)
#: kernel name -> a fake function handle, for every kernel of the table
HANDLES = {name: 0x1000 + 0x10 * i for i, name in enumerate(optable.KERNELS)}
SLOT = SimpleNamespace(handle=7, sum_scratch=(0x9000_0000, 1 << 16, 0xA000_0000, 64))
GEMM = SimpleNamespace(c_symbol=0, handle=0, kind=0)


# --------------------------------------------------------------------- arrays
def _c_strides(shape, itemsize):
    step, out = itemsize, []
    for dim in reversed(shape):
        out.append(step)
        step *= dim
    return tuple(reversed(out))


class FakeArray:
    """What the handler and OneCall read of a GPUArray; no memory behind it."""

    def __init__(self, shape, dtype, gpudata, strides=None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.strides = _c_strides(self.shape, self.dtype.itemsize) if strides is None \
            else strides
        self.gpudata = gpudata

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def flags(self):
        # NumPy's rule: strides of size-1 axes do not matter, empty arrays
        # are contiguous.
        step, ok = self.dtype.itemsize, True
        for dim, stride in zip(reversed(self.shape), reversed(self.strides)):
            if dim != 1 and stride != step:
                ok = False
            step *= dim
        return SimpleNamespace(c_contiguous=ok or self.size == 0)

    def __repr__(self):
        return f"FakeArray({self.shape}, {self.dtype}, gpudata={self.gpudata!r})"


class SubArray(FakeArray):
    pass


class Allocation:
    """A device allocation as pycuda has it: an object with ``__int__``."""

    def __init__(self, address):
        self.address = address

    def __int__(self):
        return self.address


# --------------------------------------------------------------------- the Python path
def _packed(h, kernel, args):
    """The bytes the launcher passes for ``args`` of ``kernel`` with its
    format as ``h`` loaded it (the extension's own packer, raising as the
    launch does)."""
    return _launch.pack(h._k[kernel].fmt, *args)


def _fake_function(file, name, suffix, arg_format):
    """kernel_loader.function without a GPU: the Kernel with a fake handle."""
    return kernel_loader.Kernel(f"{name}_{suffix}", arg_format, handle=HANDLES[name])


class _Recorder(Handler):
    """A handler with no GPU whose launches are recorded: ``launched`` is
    (kernel, grid, kernel arguments) of the last launch, as PyCudaHandler
    would make it, or None."""

    array_type = FakeArray
    launcher = "c"

    def __init__(self, dtype):
        super().__init__(dtype)
        self._vec = VEC[self.dtype.itemsize]
        self._max_blocks = MAX_BLOCKS
        self._grids = {}
        self._dot_launches = {}   # products' records for OneCall.dot (none here)
        # The kernels' formats as PyCudaHandler loads them: the scalar width
        # both paths pass comes from here.
        self._half = dtypes.is_half(self.dtype)
        with mock.patch.object(kernel_loader, "function", _fake_function):
            PyCudaHandler._load_kernels(self)
        # PyCudaHandler's hooks hold their stream's lock while they issue
        self._slot = SimpleNamespace(lock=threading.RLock())
        self._next = 0x7F00_0000_0000
        self.launched = None

    def array(self, shape, dtype=None, strides=None, cls=FakeArray, gpudata=None):
        """A new array at its own address (1 GiB apart: none overlap)."""
        self._next += 2**30
        return cls(shape, self.dtype if dtype is None else dtype,
                   self._next if gpudata is None else gpudata, strides)

    # PyCudaHandler's own Python path, with a launch that records instead.
    _grid, _elementwise, _axpby = (PyCudaHandler._grid, PyCudaHandler._elementwise,
                                   PyCudaHandler._axpby)

    def _launch(self, kernel, n, *args):
        if n:   # as PyCudaHandler._launch: nothing for n == 0
            self.launched = (kernel, self._grid(n), _packed(self, kernel, args))

    _overlaps, _same_memory = PyCudaHandler._overlaps, PyCudaHandler._same_memory
    _span = PyCudaHandler._span


def _stub(name):
    def hook(self, *args):
        raise AssertionError(f"{name} is not used by the ops under test")
    hook.__name__ = hook.__qualname__ = name
    return hook


#: _Recorder with every other abstract hook as a stub.
Recorder = type("Recorder", (_Recorder,),
                {name: _stub(name) for name in _Recorder.__abstractmethods__})


# --------------------------------------------------------------------- cases
class Case:
    """Arguments of one call (``build(handler)`` makes them, in the row's
    order), and what each path must do with them where the case says: True
    (accepts), False (rejects/declines) or None (only agreement matters)."""

    def __init__(self, build, c=None, py=None):
        self.build, self.c, self.py = build, c, py


def _args(op, shape, floats, arrays=None, scalars=None, post=None):
    """A builder of ``op``'s arguments: arrays of ``shape`` and the scalars
    ``floats``, with ``arrays[p](h, shape)`` / ``scalars[s](h)`` in place of
    a parameter, then ``post(args)`` on the list."""
    arrays, scalars = arrays or {}, scalars or {}

    def build(h):
        args = []
        for p in op.params:
            if p in op.scalars:
                args.append(scalars[p](h) if p in scalars else floats[p])
            else:
                args.append(arrays[p](h, shape) if p in arrays else h.array(shape))
        if post:
            post(args)
        return args
    return build


def _other_dtype(h):
    return np.float64 if h.dtype == np.float32 else np.float32


def _f_strides(h, shape):
    return tuple(reversed(_c_strides(tuple(reversed(shape)), h.dtype.itemsize)))


#: array replacements: id -> (make(h, shape), C accepts, Python accepts)
ARRAY_CASES = {
    "other dtype": (lambda h, s: h.array(s, dtype=_other_dtype(h)), False, False),
    "subclass": (lambda h, s: h.array(s, cls=SubArray), False, True),
    "other shape": (lambda h, s: h.array((s[0] + 1,) + s[1:]), False, False),
    "other rank, same size": (lambda h, s: h.array((math.prod(s),)), False, False),
    "F strides": (lambda h, s: h.array(s, strides=_f_strides(h, s)), False, False),
    "not an array": (lambda h, s: np.zeros(s, h.dtype), False, False),
    "not an array type": (lambda h, s: SimpleNamespace(shape=s, dtype=h.dtype,
                                                       strides=_c_strides(s, h.dtype.itemsize),
                                                       gpudata=0x1000), False, False),
    "gpudata negative": (lambda h, s: h.array(s, gpudata=-4096), False, False),
    "gpudata past 64 bits": (lambda h, s: h.array(s, gpudata=2**64), False, False),
    "gpudata None": (lambda h, s: _with(h.array(s), gpudata=None), False, False),
    "gpudata str": (lambda h, s: _with(h.array(s), gpudata="x"), False, False),
    "gpudata float": (lambda h, s: _with(h.array(s), gpudata=float(2**40)), None, None),
    "gpudata with __int__": (lambda h, s: _with(h.array(s), gpudata=Allocation(2**41)),
                             True, True),
}

#: scalar replacements: id -> (value(h), C accepts, Python accepts)
SCALAR_CASES = {
    "int": (lambda h: 3, True, True),
    "negative int": (lambda h: -2**40, True, True),
    "bool": (lambda h: True, False, False),
    "numpy.float32": (lambda h: np.float32(1.5), False, True),
    "numpy.float64": (lambda h: np.float64(1.5), False, True),
    "0-d numpy array": (lambda h: np.array(1.5), False, True),
    "str": (lambda h: "1.5", False, False),
    "None": (lambda h: None, False, False),
    "complex": (lambda h: 1.5 + 0j, False, False),
    "int past double": (lambda h: 10**400, False, False),
    "nan": (lambda h: float("nan"), True, True),
    "float past float32": (lambda h: 1e300, True, True),
}

#: axpby's device scalars (alpha, beta): id -> (value(h), C accepts, Python accepts)
DEVICE_SCALAR_CASES = {
    "device scalar (1,)": (lambda h: h.array((1,)), False, True),
    "device scalar (1, 1)": (lambda h: h.array((1, 1)), False, True),
    "device scalar of 2 elements": (lambda h: h.array((2,)), False, False),
    "device scalar of rank 0": (lambda h: h.array(()), False, False),
    "device scalar of another dtype": (lambda h: h.array((1,), dtype=_other_dtype(h)),
                                       False, False),
}


def _with(a, **attrs):
    a.__dict__.update(attrs)
    return a


#: Shapes whose element count or strides do not fit int64: the Python path
#: rejects them (in exact ints), and so must the C path, which once computed
#: them in wrapping 64-bit arithmetic and accepted them (found by this test).
OVERFLOW_CASES = {
    "element count past int64": (
        lambda h: (2**62 + 1, 4), None,
        "C wraps n = (2**62 + 1) * 4 to 4 and launches over 4 elements; the Python "
        "path raises OverflowError packing n"),
    "element count wrapping to 0": (
        lambda h: (2**32, 2**32), None,
        "C wraps n = 2**64 to 0 and returns True having launched nothing; the Python "
        "path raises OverflowError packing n"),
    "strides wrapping past int64": (
        lambda h: (2, 2**62, 1), lambda h: (0, h.dtype.itemsize, h.dtype.itemsize),
        "C wraps the expected stride 2**62 * itemsize to 0 and accepts strides "
        "(0, itemsize, itemsize); the Python checks raise ValueError (not C-contiguous)"),
}


def _cases(name):
    """id -> Case (or pytest.param of one) for the op ``name``."""
    op = optable.OPS[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))

    def dims(k):
        return tuple(int(d) for d in rng.integers(2, 9, size=k))
    base = dims(2)
    floats = {s: float(rng.normal()) for s in op.scalars}
    arrays = [p for p in op.params if p not in op.scalars]
    index = {p: i for i, p in enumerate(op.params)}
    cases = {}

    # the valid call
    for label, shape in [("rank 0", ()), ("rank 1", dims(1)), ("rank 2", base),
                         ("rank 3", dims(3)), ("size 0", (base[0], 0, base[1])),
                         ("big 1-D", (int(rng.integers(200_000, 400_000)),))]:
        cases[f"valid {label}"] = Case(_args(op, shape, floats), True, True)

    def alias_out(args):
        args[op.out] = args[index[arrays[0]]]

    def alias_all(args):
        for p in arrays[1:]:
            args[index[p]] = args[index[arrays[0]]]
    cases["valid, out is the first input"] = Case(_args(op, base, floats, post=alias_out),
                                                  True, True)
    cases["valid, one array for all"] = Case(_args(op, base, floats, post=alias_all),
                                             True, True)
    cases["shape of numpy ints"] = Case(
        _args(op, tuple(np.int64(d) for d in base), floats), None, True)

    # each array replaced in turn
    for p in arrays:
        for label, (make, c, py) in ARRAY_CASES.items():
            cases[f"{p}: {label}"] = Case(_args(op, base, floats, arrays={p: make}), c, py)
        col = (base[0], 1)
        odd = {p: lambda h, s: h.array(s, strides=(h.dtype.itemsize, 64))}
        cases[f"{p}: odd stride of a size-1 axis"] = Case(_args(op, col, floats, odd),
                                                          False, True)

    # each scalar replaced in turn
    for s in op.scalars:
        table = dict(SCALAR_CASES, **DEVICE_SCALAR_CASES) if name == "axpby" \
            else SCALAR_CASES
        for label, (make, c, py) in table.items():
            cases[f"{s}: {label}"] = Case(_args(op, base, floats, scalars={s: make}), c, py)
        if name == "axpby":
            def overlap_y(args, s=s):
                y = args[index["y"]]
                args[index[s]] = FakeArray((1,), y.dtype, y.gpudata)
            cases[f"{s}: device scalar overlapping y"] = Case(
                _args(op, base, floats, post=overlap_y), False, False)

    # shapes past int64: known disagreements
    for label, (shape, strides, _why) in OVERFLOW_CASES.items():
        def build(h, shape=shape, strides=strides):
            sh = shape(h)
            st = strides(h) if strides else None
            return _args(op, sh, floats, arrays={p: (lambda h, s: h.array(s, strides=st))
                                                 for p in arrays})(h)
        cases[label] = Case(build, None, False)
    return cases


def _params():
    out = []
    for name in one_call.OPS:
        for label, case in _cases(name).items():
            if isinstance(case, Case):
                case = pytest.param(case)
            out.append(pytest.param(name, *case.values, marks=case.marks,
                                    id=f"{name}-{label}"))
    return out


def _python_path(h, name, args):
    """(accepted, exception) of the contract's Python path on ``args``."""
    try:
        getattr(Handler, name)(h, *args)
    except (TypeError, ValueError, OverflowError) as e:
        return False, e
    return True, None


@pytest.mark.parametrize("name,case", _params())
def test_one_call_agrees_with_the_python_path(name, case):
    call, kernel = one_call.OPS[name]
    index = list(one_call.OPS).index(name)
    for dtype in DTYPES:
        h = Recorder(dtype)
        ops = one_call.make(h, SLOT, GEMM, BLOCK, dry=True)
        args = case.build(h)
        c_ok = getattr(ops, call)(index, *args)
        py_ok, error = _python_path(h, name, args)
        where = f"{name} ({np.dtype(dtype).name}) on {args!r}"
        assert c_ok is True or c_ok is False, where
        if case.py is not None:
            assert py_ok is case.py, f"the Python path on {where}: {error!r}"
        assert py_ok or not c_ok, f"C accepts what the Python path rejects ({error!r}): {where}"
        if case.c is not None:
            assert c_ok is case.c, f"the C path on {where}"
        if not c_ok:
            assert ops.last is None, f"C declined but launched: {where}"
            continue
        if h.launched is None:   # n == 0: neither path launches
            assert ops.last is None, where
            continue
        k, grid, kargs = h.launched
        assert k == kernel, where
        fn, c_grid, block, c_args = ops.last
        assert (fn, c_grid, block) == (HANDLES[k], grid, BLOCK), f"{where}: C {ops.last}"
        assert _packed(h, k, c_args) == kargs, \
            f"{where}: C passes {c_args}, the Python path other arguments"


def test_every_op_has_its_cases():
    params = _params()
    for name in one_call.OPS:
        assert any(p.id.startswith(f"{name}-valid") for p in params), name
    # a kernel's arguments are the row's parameters then n, as the C path passes them
    for name, (call, kernel) in one_call.OPS.items():
        op = optable.OPS[name]
        assert op.kernel == kernel, name
        assert optable.KERNELS[kernel][1] == optable.kernel_format(op, "T"), name


# --------------------------------------------------------------------- products
#: cuBLAS as the handler's binding has it (a known GEMM symbol), per itemsize
DOT_GEMM = {4: SimpleNamespace(c_symbol=0x5000, handle=0x6000, kind=0),
            8: SimpleNamespace(c_symbol=0x5000, handle=0x6000, kind=1)}


class _GemmRecorder:
    def __init__(self, h):
        self.h = h

    def __call__(self, *args, **options):
        self.h.launched = ("gemm", args, options)

    def batched(self, *args, **options):
        self.h.launched = ("batched", args, options)


class DotRecorder(Recorder):
    """Recorder whose products run PyCudaHandler's own hook (``products.dot``):
    ``launched`` is what it issued last (small_gemm through ``_run``, cuBLAS,
    a zero fill)."""

    _dot = products.dot

    def __init__(self, dtype):
        super().__init__(dtype)
        self._gemms = [DOT_GEMM[self.dtype.itemsize]]
        self._gemm = _GemmRecorder(self)
        self._dot_plans = {}

    def _run(self, kernel, grid, *args):
        self.launched = (kernel.handle, grid, _launch.pack(kernel.fmt, *args))

    def _fill(self, out, value):
        self.launched = ("fill", value)


def _dot_cases():
    """name -> (a shape, b shape, out shape, transa, transb, change, served):
    change(h, args) may replace arrays or flags; served says whether C serves
    the call once planned (None: k = 0, served for dot_add_mm only)."""
    def f_order(h, args):
        args[0] = h.array(args[0].shape, strides=_f_strides(h, args[0].shape))

    def odd_unit_stride(h, args):   # C-contiguous for the checks, a doubt for C
        args[0] = h.array(args[0].shape, strides=(args[0].strides[0], 64))

    def numpy_flag(h, args):
        args[4] = np.bool_(args[4])

    def other_dtype(h, args):
        args[1] = h.array(args[1].shape, _other_dtype(h))

    def overlap(h, args):
        args[2] = h.array(args[2].shape, gpudata=args[0].gpudata)

    def subclass(h, args):
        args[2] = h.array(args[2].shape, cls=SubArray)
    return {
        "small": ((16, 8), (8, 16), (16, 16), False, False, None, True),
        "small, transposed": ((8, 16), (16, 8), (16, 16), True, True, None, True),
        "cublas": ((100, 80), (80, 96), (100, 96), False, False, None, True),
        "cublas, transposed a": ((80, 100), (80, 96), (100, 96), True, False, None, True),
        "cublas, k past small": ((4, 129), (5, 129), (4, 5), False, True, None, True),
        "tall small": ((3, 4, 8), (8, 16), (3, 4, 16), False, False, None, True),
        "tall cublas": ((4, 50, 80), (96, 80), (4, 50, 96), False, True, None, True),
        "batched": ((2, 50, 80), (2, 80, 96), (2, 50, 96), False, False, None, False),
        "shared b, transposed a": ((2, 80, 50), (80, 96), (2, 50, 96), True, False, None,
                                   False),
        "empty k": ((16, 0), (0, 16), (16, 16), False, False, None, None),
        "empty m": ((0, 8), (8, 16), (0, 16), False, False, None, True),
        "k differs": ((16, 8), (9, 16), (16, 16), False, False, None, False),
        "out shape": ((16, 8), (8, 16), (16, 15), False, False, None, False),
        "F order": ((16, 8), (8, 16), (16, 16), False, False, f_order, False),
        "odd stride of a size-1 axis": ((16, 1), (1, 16), (16, 16), False, False,
                                        odd_unit_stride, False),
        "numpy flag": ((16, 8), (16, 8), (16, 16), False, True, numpy_flag, False),
        "other dtype": ((16, 8), (8, 16), (16, 16), False, False, other_dtype, False),
        "out overlaps a": ((16, 8), (8, 16), (16, 16), False, False, overlap, False),
        "subclass out": ((16, 8), (8, 16), (16, 16), False, False, subclass, False),
    }


@pytest.mark.parametrize("case", sorted(_dot_cases()))
@pytest.mark.parametrize("name,beta", [("dot_mm", 0.0), ("dot_add_mm", 1.0)])
def test_dot_agrees_with_the_python_path(case, name, beta):
    """A product is unknown to C until the Python path has planned it; then
    C declines what the Python path rejects, and launches exactly what the
    Python path does: small_gemm with the same grid and arguments, or the same
    cuBLAS call."""
    a_shape, b_shape, out_shape, ta, tb, change, served = _dot_cases()[case]
    for dtype in DTYPES:
        h = DotRecorder(dtype)
        ops = one_call.make(h, SLOT, DOT_GEMM[h.dtype.itemsize], BLOCK, dry=True)
        args = [h.array(a_shape), h.array(b_shape), h.array(out_shape), ta, tb]
        if change:
            change(h, args)
        where = f"{name} ({np.dtype(dtype).name}) on {args!r}"
        assert ops.dot(*args, beta) is False, f"C served an unplanned product: {where}"
        py_ok, error = _python_path(h, name, args)
        c_ok = ops.dot(*args, beta)
        assert py_ok or not c_ok, f"C accepts what the Python path rejects ({error!r}): {where}"
        if served is None:   # k = 0: a zero fill (Python) for dot_mm, nothing for dot_add_mm
            served = beta != 0.0
        assert c_ok is served, f"the C path on {where}"
        if not c_ok:
            assert ops.last is None, f"C declined but launched: {where}"
            continue
        if h.launched is None:   # nothing to do on either path
            assert ops.last is None, where
            continue
        if h.launched[0] == "gemm":
            _, call, options = h.launched
            gemm = DOT_GEMM[h.dtype.itemsize]
            assert options == {} and ops.last == (gemm.c_symbol, gemm.handle, call), where
        else:
            fn, grid, block, c_args = ops.last
            assert (fn, grid, block) == (HANDLES["small_gemm"], h.launched[1], BLOCK), where
            assert _launch.pack(h._k["small_gemm"].fmt, *c_args) == h.launched[2], where
