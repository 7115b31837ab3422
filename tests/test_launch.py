"""The C extension handlers.cuda._launch, PyCudaHandler's one path to the driver.

The argument packer is checked on any machine where the extension is built
(no GPU needed): its buffer must equal Python's ``struct.pack`` in native
alignment, which is how the kernels' parameters are laid out.  So are the
argument checks of the other driver calls (wrong types, null handles).  Without the
extension PyCudaHandler refuses to start with an ImportError naming the fix.
On a GPU, the path runs a mix of ops in a fresh process, and failed driver and
cuBLAS calls raise ``CudaError`` with the status name.
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

_launch = pytest.importorskip(
    "handlers.cuda._launch",
    reason="handlers.cuda._launch is not built (no C compiler at install); PyCudaHandler "
           "needs it: `pip install -e .` builds it")

CODES = "PqQidf"
VALUES = {
    "P": lambda r: int(r.integers(0, 2**63)),
    "q": lambda r: int(r.integers(-2**62, 2**62)),
    "Q": lambda r: int(r.integers(0, 2**63)),
    "i": lambda r: int(r.integers(-2**31, 2**31)),
    "d": lambda r: float(r.normal()),
    "f": lambda r: float(np.float32(r.normal())),
}


def _native(fmt, args):
    # struct pads only between items; the C packer's buffer ends at the last one.
    return struct.pack("@" + fmt, *args)


@pytest.mark.parametrize("trial", range(50))
def test_pack_matches_struct_native_layout(trial):
    rng = np.random.default_rng(1000 + trial)
    fmt = "".join(rng.choice(list(CODES), size=int(rng.integers(1, 12))))
    args = [VALUES[c](rng) for c in fmt]
    assert _launch.pack(fmt.encode(), *args) == _native(fmt, args)
    assert _launch.pack(fmt, *args) == _native(fmt, args)


def test_pack_takes_objects_with_int_for_pointers():
    class Allocation:
        def __int__(self):
            return 0x7F00_0000_1000

    assert _launch.pack(b"Pq", Allocation(), 3) == struct.pack("@Pq", 0x7F00_0000_1000, 3)


@pytest.mark.parametrize("fmt,args,error", [
    (b"PP", (1,), TypeError),                 # too few arguments
    (b"P", (1, 2), TypeError),                # too many
    (b"Px", (1, 2), ValueError),              # unknown code
    (b"i", (2**31,), OverflowError),          # out of range for int32
    (b"P", (-1,), OverflowError),             # negative pointer
    (b"q", ("3",), TypeError),                # not a number
    (b"P" * 257, (0,) * 257, ValueError),     # more than the packer holds
    (3, (), TypeError),                       # format not bytes/str
])
def test_pack_rejects_bad_arguments(fmt, args, error):
    with pytest.raises(error):
        _launch.pack(fmt, *args)


def test_launch_rejects_null_function_before_touching_the_driver():
    with pytest.raises((ValueError, RuntimeError)):
        _launch.launch(0, 0, 1, 256, b"P", 1)


@pytest.mark.parametrize("call, args", [
    ("record", (0, 0)), ("wait", (0, 0)), ("query", (0,)), ("event_sync", (0,)),
    ("event_free", (0,))])
def test_event_calls_reject_a_null_event_before_touching_the_driver(call, args):
    # Before load() they say libcuda is not loaded; after it, that the event is null.
    with pytest.raises((ValueError, RuntimeError), match=call):
        getattr(_launch, call)(*args)


@pytest.mark.parametrize("call, args", [
    ("record", (1,)), ("wait", (1, 2, 3)), ("query", ()), ("event_sync", (1, 2))])
def test_event_calls_check_their_argument_count(call, args):
    with pytest.raises(TypeError, match=call):
        getattr(_launch, call)(*args)


def _gpu_or_skip():
    try:
        from handlers import PyCudaHandler
        return PyCudaHandler(np.float32)
    except (ImportError, RuntimeError) as e:
        pytest.skip(f"PyCudaHandler unavailable: {e}")


def test_missing_extension_is_a_clear_import_error(monkeypatch):
    from handlers.cuda import kernel_loader
    monkeypatch.setattr(kernel_loader, "_launch", None)
    monkeypatch.setitem(sys.modules, "handlers.cuda._launch", None)   # import fails
    with pytest.raises(ImportError, match=r"handlers\.cuda\._launch.*build_ext --inplace"):
        kernel_loader.require()


def test_a_failed_launch_is_a_cuda_error():
    from handlers import CudaError
    h = _gpu_or_skip()
    k = h._k["fill"]
    a = h.zeros((4,))
    with pytest.raises(CudaError, match="cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE") as e:
        _launch.launch(k.handle, h._slot.handle, 1, 4096, k.fmt, a.gpudata, 1.0, 4)  # block > 1024
    assert (e.value.op, e.value.status) == ("cuLaunchKernel", "CUDA_ERROR_INVALID_VALUE")
    np.testing.assert_array_equal(h.get_numpy_copy(a), np.zeros(4))   # nothing ran; usable


def test_a_failed_cublas_call_is_a_cuda_error():
    from handlers import CudaError
    h = _gpu_or_skip()
    a = h.zeros((300, 300))
    with pytest.raises(CudaError, match="CUBLAS_STATUS_INVALID_VALUE") as e:
        h.gemm_raw()(0, 0, 300, 300, 300, 1.0, a.gpudata, 1, a.gpudata, 300, 0.0,
                     a.gpudata, 300)   # lda 1 < m
    assert e.value.op.startswith("cublas")


_FALLBACK = r"""
import json, numpy as np
from handlers import PyCudaHandler
h = PyCudaHandler(np.float32, seed=3)
r = np.random.default_rng(5)
x, y = r.normal(size=(300, 70)).astype(np.float32), r.normal(size=(70, 50)).astype(np.float32)
a, b = h.create_from_numpy(x), h.create_from_numpy(y)
out = h.allocate((300, 50)); h.dot_mm(a, b, out)
s = h.allocate((70,)); h.sum_t(a, 0, s)
big = r.normal(size=(4096, 64)).astype(np.float32); bg = h.create_from_numpy(big)
cs = h.allocate((64,)); h.sum_t(bg, 0, cs)
sm = h.allocate((300, 70)); h.softmax_m(a, sm)
e = h.allocate((300, 70)); h.with_streams(2).axpby(2.0, a, 0.0, e)
g1 = h.with_streams(1)
g1.wait_event(h.with_streams(2).record_event())   # events on this launch path
f = h.allocate((300, 70)); g1.add_tt(e, a, f)
ev = g1.record_event(); ev.synchronize(); done = ev.query()
h.wait_for(g1)
batches = [x[i * 50:(i + 1) * 50] for i in range(6)]
got = [h.get_numpy_copy(bt) for bt in h.prefetch(batches, depth=2)]
pend = h.get_numpy_copy_async(f)
h.synchronize_all_streams()
print(json.dumps({
    "events": float(np.abs(pend.result() - 3.0 * x.astype(np.float64)).max()),
    "query": 0.0 if done else 1.0,
    "prefetch": max(float(np.abs(g - bt).max()) for g, bt in zip(got, batches)),
    "dot": float(np.abs(h.get_numpy_copy(out) - x.astype(np.float64) @ y).max()),
    "sum": float(np.abs(h.get_numpy_copy(s) - x.astype(np.float64).sum(0)).max()),
    "colsum": float(np.abs(h.get_numpy_copy(cs) - big.astype(np.float64).sum(0)).max()),
    "axpby": float(np.abs(h.get_numpy_copy(e) - 2.0 * x.astype(np.float64)).max()),
    "softmax_rows": float(np.abs(h.get_numpy_copy(sm).sum(1) - 1).max())}))
"""


@pytest.mark.timeout(400)   # beyond the subprocess's own 300 s limit
def test_the_launch_path_runs_ops_correctly():
    _gpu_or_skip()
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-c", _FALLBACK], env=env, capture_output=True,
                          text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    for what, err in res.items():
        assert err < 1e-3, (what, err)


# The driver calls of _driver.c: arguments are checked before libcuda is
# needed, so a wrong type is a TypeError with or without a GPU.
@pytest.mark.parametrize("call, args", [
    ("module_load", ("not bytes",)),
    ("module_load", (bytearray(b"\0"),)),
    ("module_function", (1, 7)),
    ("module_function", ("1", "fill_f32")),
    ("capture_begin", (None, 2)),
    ("capture_begin", (0, 2.0)),
    ("capture_end", ("0",)),
    ("capture_status", (0.0,)),
    ("graph_node_count", (None,)),
    ("graph_instantiate", (b"graph",)),
    ("graph_launch", (1, "stream")),
    ("graph_launch", (1,)),                        # too few
    ("graph_destroy", (1.0,)),
    ("graph_exec_destroy", ([1],)),
    ("memset_d32", (1, 0, 1)),                     # too few
    ("memset_d32", (1, "0", 1, 0)),
    ("host_register", (4096.0, 4096, 0)),
    ("host_register", (4096, 4096)),               # too few
    ("host_unregister", (None,)),
    ("error_name", ("1",)),
    ("blas_set_workspace", (1, 2, 3, 4.0)),
    ("occupancy", ("1", 256, 0)),
    ("occupancy", (1, 256.0, 0)),
    ("occupancy", (1, 256, None)),
    ("occupancy", (1, 256, True)),                 # a bool is no byte count
    ("occupancy", (1, 256)),                       # too few
])
def test_driver_calls_reject_wrong_types(call, args):
    with pytest.raises(TypeError, match=call):
        getattr(_launch, call)(*args)


@pytest.mark.parametrize("call, args, error", [
    ("graph_destroy", (0,), ValueError),             # null handles
    ("graph_exec_destroy", (0,), ValueError),
    ("graph_launch", (0, 0), ValueError),
    ("module_function", (0, "fill_f32"), ValueError),
    ("module_function", (1, "fill\0f32"), ValueError),
    ("memset_d32", (0, 1, 1, 0), ValueError),
    ("memset_d32", (4096, 2**32, 1, 0), OverflowError),
    ("host_register", (-4096, 4096, 0), OverflowError),
    ("blas_set_workspace", (0, 1, 2, 3), ValueError),
    ("occupancy", (0, 256, 0), ValueError),          # null function
    ("occupancy", (1, 0, 0), ValueError),            # block out of 1..1024
    ("occupancy", (1, 1025, 0), ValueError),
    ("occupancy", (1, 256, -1), ValueError),         # negative shared memory
    ("occupancy", (1, 2**40, 0), OverflowError),
    ("occupancy", (-1, 256, 0), OverflowError),
])
def test_driver_calls_reject_bad_values_before_touching_the_driver(call, args, error):
    with pytest.raises(error):
        getattr(_launch, call)(*args)


def test_loading_garbage_is_a_cuda_error():
    from handlers import CudaError
    _gpu_or_skip()
    with pytest.raises(CudaError) as e:
        _launch.module_load(b"garbage, neither a cubin nor PTX\n" * 8)
    assert e.value.op == "cuModuleLoadData"
    assert e.value.status.startswith("CUDA_ERROR_") and e.value.code != 0
    assert _launch.error_name(e.value.code) == e.value.status


def test_an_unknown_kernel_name_is_a_cuda_error():
    from handlers import CudaError
    from handlers.cuda import kernel_loader
    h = _gpu_or_skip()
    assert h._k["fill"].handle   # the module of fill is loaded
    mod = next(iter(kernel_loader._modules.values()))
    with pytest.raises(CudaError, match=r"cuModuleGetFunction\(no_such_kernel\)") as e:
        _launch.module_function(mod, "no_such_kernel")
    assert e.value.status.startswith("CUDA_ERROR_") and e.value.code != 0


def test_host_register_round_trip():
    import mmap

    from handlers import CudaError
    _gpu_or_skip()
    page = mmap.PAGESIZE
    raw = np.zeros(4 * page, np.uint8)
    start = raw.ctypes.data
    first = -start % page                          # the first page-aligned byte
    buf = raw[first: first + 2 * page]
    address = buf.ctypes.data
    assert address % page == 0
    _launch.host_register(address, buf.nbytes, 0)
    _launch.host_unregister(address)
    with pytest.raises(CudaError) as e:            # no longer registered
        _launch.host_unregister(address)
    assert e.value.op == "cuMemHostUnregister"
    assert e.value.status.startswith("CUDA_ERROR_") and e.value.code != 0
