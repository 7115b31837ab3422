"""Streams, copies, page-locked host memory, timing events and device
attributes: the driver calls of ``handlers.cuda._launch`` that make it the
one way from the package to the driver (pycuda stays the array library).

Without a GPU: each call exists with its docstring and refuses bad arguments
before it needs libcuda; ``empty_pinned`` arrays free their memory once they
and their views are collected (a fake extension counts); no module of
``handlers`` calls ``pycuda.driver`` outside the context's setup.  On a GPU:
copy round trips, stream synchronize, timing events and pinned arrays.
"""
import ast
import gc
import os

import numpy as np
import pytest

_launch = pytest.importorskip(
    "handlers.cuda._launch",
    reason="handlers.cuda._launch is not built (no C compiler at install); PyCudaHandler "
           "needs it: `pip install -e .` builds it")

CALLS = ("stream_new", "stream_free", "stream_sync", "context_sync", "copy_htod", "copy_dtoh",
         "copy_dtod", "host_alloc", "host_free", "timing_event_new", "event_elapsed",
         "device_attribute", "occupancy")


@pytest.mark.parametrize("call", CALLS)
def test_each_call_exists_with_its_docstring(call):
    doc = getattr(_launch, call).__doc__
    assert doc and doc.startswith(call + "("), doc


@pytest.mark.parametrize("call, args, error", [
    ("stream_free", (None,), TypeError),
    ("stream_free", (0,), ValueError),               # null stream
    ("stream_sync", ("1",), TypeError),
    ("stream_sync", (0,), ValueError),
    ("copy_htod", (1, 5, 0), TypeError),             # host side not a buffer
    ("copy_htod", (1.0, np.zeros(3), 0), TypeError),
    ("copy_htod", (1, np.zeros(3), None), TypeError),
    ("copy_htod", (1, np.zeros(3)), TypeError),      # too few
    ("copy_htod", (0, np.zeros(3), 0), ValueError),  # null device address
    ("copy_htod", (1, np.zeros((3, 4))[:, 1], 0), ValueError),   # not contiguous
    ("copy_htod", (1, np.zeros((3, 4), order="F"), 0), ValueError),   # not in C order
    ("copy_dtoh", (np.zeros((3, 4), order="F"), 1, 0), ValueError),
    ("copy_dtoh", (np.zeros(3), "1", 0), TypeError),
    ("copy_dtoh", ([0.0], 1, 0), TypeError),
    ("copy_dtoh", (np.frombuffer(b"abcd", np.uint8), 1, 0), ValueError),   # read-only
    ("copy_dtoh", (np.zeros(3), 0, 0), ValueError),
    ("copy_dtod", (1, 2, 8), TypeError),
    ("copy_dtod", (1, 2, 8.0, 0), TypeError),
    ("copy_dtod", (1, 2, -8, 0), ValueError),        # negative size
    ("copy_dtod", (0, 2, 8, 0), ValueError),
    ("host_alloc", (4096.0,), TypeError),
    ("host_alloc", (True,), TypeError),
    ("copy_dtod", (1, 2, True, 0), TypeError),
    ("host_alloc", (-1,), ValueError),
    ("host_alloc", (-2**70,), ValueError),
    ("host_alloc", (0,), ValueError),
    ("host_free", ("1",), TypeError),
    ("host_free", (0,), ValueError),
    ("event_elapsed", (1,), TypeError),
    ("event_elapsed", (1, None), TypeError),
    ("event_elapsed", (0, 1), ValueError),
    ("device_attribute", ("16", 0), TypeError),
    ("device_attribute", (16,), TypeError),
])
def test_calls_refuse_bad_arguments_before_touching_the_driver(call, args, error):
    with pytest.raises(error):
        getattr(_launch, call)(*args)


class _FakeHostMemory:
    """Stands in for the extension's host_alloc/host_free: real memory from
    NumPy, and a count of what is still allocated."""

    def __init__(self):
        self.blocks = {}

    def host_alloc(self, nbytes):
        block = np.zeros(nbytes, np.uint8)
        self.blocks[block.ctypes.data] = block
        return block.ctypes.data

    def host_free(self, address):
        del self.blocks[address]


@pytest.fixture
def fake_host(monkeypatch):
    from handlers.cuda import context as cuda_context
    from handlers.cuda import kernel_loader
    # Objects an earlier test dropped release through the real extension
    # first: a handler collected while the fake is in place would call it.
    gc.collect()
    fake = _FakeHostMemory()
    monkeypatch.setattr(kernel_loader, "require", lambda: fake)
    monkeypatch.setattr(cuda_context, "entered", lambda: True)   # frees run at once
    yield fake
    gc.collect()   # what the test dropped goes back to the fake, not the extension


def test_pinned_arrays_are_freed_once_they_and_their_views_are_collected(fake_host):
    from handlers.cuda.transfer import empty_pinned
    a = empty_pinned((3, 5), np.float32)
    assert a.shape == (3, 5) and a.dtype == np.float32 and a.flags.c_contiguous
    assert len(fake_host.blocks) == 1
    a[...] = 7
    view = a[1:, 2]
    del a
    gc.collect()
    assert len(fake_host.blocks) == 1, "a view must keep the memory"
    np.testing.assert_array_equal(view, [7, 7])
    del view
    gc.collect()
    assert not fake_host.blocks


def test_pinned_arrays_of_every_format_and_size(fake_host):
    from handlers import dtypes
    from handlers.cuda.transfer import empty_pinned, free_pinned
    for dtype in (np.float32, np.float64, np.float16, dtypes.resolve("bfloat16"), np.uint32):
        for shape in ((0,), (2, 0), (1,), (4, 3)):
            a = empty_pinned(shape, dtype)
            assert a.shape == shape and a.dtype == np.dtype(dtype)
            free_pinned(a[:1])           # from a view too; then once only
            free_pinned(a)
    gc.collect()
    assert not fake_host.blocks


def test_many_pinned_arrays_leave_nothing_behind(fake_host):
    from handlers.cuda.transfer import empty_pinned
    for _ in range(1000):
        empty_pinned((64,), np.float32)
    gc.collect()
    assert not fake_host.blocks


# Where handlers may use pycuda: the context (which its arrays need), the
# arrays and their memory pool, and nvcc.
_ALLOWED = {"pycuda.gpuarray", "pycuda.tools", "pycuda.compiler"}
_DRIVER_OK = {os.path.join("handlers", "cuda", "context.py")}


def test_no_pycuda_driver_use_outside_the_context():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = []
    for folder, _, files in os.walk(os.path.join(root, "handlers")):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Attribute) and node.attr in ("_drv", "drv"):
                    found.append(f"{rel}:{node.lineno}: .{node.attr}")
                    continue
                else:
                    continue
                for mod in mods:
                    if not mod.startswith("pycuda") or mod in _ALLOWED or mod == "pycuda":
                        continue
                    if any(mod.startswith(ok + ".") for ok in _ALLOWED):
                        continue
                    if mod == "pycuda.driver" and rel in _DRIVER_OK:
                        continue
                    found.append(f"{rel}:{node.lineno}: {mod}")
    assert not found, found


# On a GPU ----------------------------------------------------------------------

def _gpu_or_skip():
    try:
        from handlers import PyCudaHandler
        return PyCudaHandler(np.float32)
    except (ImportError, RuntimeError) as e:
        pytest.skip(f"PyCudaHandler unavailable: {e}")


def test_copy_round_trip_through_the_extension():
    from handlers.cuda.resources import Stream
    from handlers.cuda.transfer import empty_pinned
    h = _gpu_or_skip()
    stream = Stream()
    try:
        host = np.arange(1000, dtype=np.float32)
        a, b = h.allocate((1000,)), h.allocate((1000,))
        _launch.copy_htod(int(a.gpudata), host, stream.handle)               # pageable
        _launch.copy_dtod(int(b.gpudata), int(a.gpudata), a.nbytes, stream.handle)
        back = empty_pinned((1000,), np.float32)                              # pinned
        _launch.copy_dtoh(back, int(b.gpudata), stream.handle)
        stream.synchronize()
        np.testing.assert_array_equal(back, host)
        _launch.context_sync()
    finally:
        stream.close()
    assert stream.handle == 0
    stream.synchronize()      # closed: nothing to wait for
    stream.close()            # once only


def test_timing_events_measure_a_positive_time():
    h = _gpu_or_skip()
    big = h.create_from_numpy(np.ones((1024, 1024), np.float32))
    out = h.allocate((1024, 1024))
    start, end = _launch.timing_event_new(), _launch.timing_event_new()
    try:
        _launch.record(start, h.stream.handle)
        for _ in range(5):
            h.dot_mm(big, big, out)
        _launch.record(end, h.stream.handle)
        _launch.event_sync(end)
        assert _launch.event_elapsed(start, end) > 0
    finally:
        _launch.event_free(start)
        _launch.event_free(end)


def test_untimed_events_are_a_cuda_error_for_event_elapsed():
    from handlers import CudaError
    _gpu_or_skip()
    start, end = _launch.event_new(), _launch.event_new()
    try:
        with pytest.raises(CudaError) as e:
            _launch.event_elapsed(start, end)
        assert e.value.op == "cuEventElapsedTime"
    finally:
        _launch.event_free(start)
        _launch.event_free(end)


def test_device_attributes():
    from handlers.cuda import kernel_loader
    h = _gpu_or_skip()
    assert _launch.device_attribute(kernel_loader.MULTIPROCESSOR_COUNT, 0) == h._sms > 0
    assert _launch.device_attribute(kernel_loader.COMPUTE_CAPABILITY_MAJOR, 0) >= 5


def test_pinned_arrays_are_freed_on_the_gpu():
    from handlers.cuda.transfer import empty_pinned
    _gpu_or_skip()
    for _ in range(200):      # 200 x 64 MiB: freed as they go, or the host runs out
        a = empty_pinned((16 << 20,), np.float32)
        a[::4096] = 1
    del a
    gc.collect()


def test_handler_streams_and_pinned_buffers_are_the_extensions():
    from handlers.cuda.resources import Stream
    h = _gpu_or_skip()
    assert isinstance(h.stream, Stream) and h.stream.handle == h._slot.handle
    p = h.empty_pinned((4, 4))
    p[...] = 3
    a = h.create_from_numpy(p)
    np.testing.assert_array_equal(h.get_numpy_copy(a), p)
    h.synchronize()
    h.close()
    assert all(s.stream.handle == 0 for s in h._all_slots)


class _FakeStream:
    def __init__(self, fail=False):
        self.fail, self.closed = fail, False

    def synchronize(self):
        if self.fail:
            raise RuntimeError("a sticky CUDA error")

    def close(self):
        self.closed = True


class _FakePool:
    held = True

    def stop_holding(self):
        self.held = False


def test_a_failed_release_still_closes_the_streams_and_lets_the_pool_go(monkeypatch):
    """Resources._release after a CUDA error (every later call fails): the
    error propagates, and the streams are closed and the pool stops holding
    anyway (a pool still holding at exit aborts the process)."""
    from types import SimpleNamespace

    from handlers.cuda import kernel_loader
    from handlers.cuda.resources import Resources
    monkeypatch.setattr(kernel_loader, "events", lambda: SimpleNamespace(free=lambda e: None))
    monkeypatch.setattr(kernel_loader, "require", lambda: SimpleNamespace())
    res = Resources.__new__(Resources)
    slots = [SimpleNamespace(stream=_FakeStream(fail=True), event=1, cudnn=0),
             SimpleNamespace(stream=_FakeStream(), event=2, cudnn=0)]
    upload = _FakeStream()
    res.slots, res.uploads, res.gemms, res.events, res.conv_plans = slots, [upload], [], [], {}
    res.pool = pool = _FakePool()
    with pytest.raises(RuntimeError, match="sticky"):
        res._release()
    assert all(s.stream.closed for s in slots) and upload.closed
    assert not pool.held and res.slots is None and res.pool is None
    res._release()   # once only
