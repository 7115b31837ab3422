"""GPU-only checks of PyCudaHandler beyond the per-handler suite.

* The same random inputs give the same results on PyCudaHandler and
  NumpyHandler for every op (both float64, so differences are rounding only).
* PyTorch and CuPy can be imported and used in the same process, and the
  handler's later ops are still correct.
* A subprocess that uses the handler exits 0 with nothing on stderr.
* A dropped handler releases its streams, cuBLAS handles and memory, also
  when the garbage collector runs on another thread.
* Host arrays that straddle pinned and ordinary pages upload and download.
"""
import gc
import subprocess
import sys
import textwrap
import threading
import warnings
import weakref
from pathlib import Path

import numpy as np
import pytest

from handlers import NumpyHandler

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu():
    try:
        from handlers import PyCudaHandler
        return PyCudaHandler(np.float64, seed=5)
    except (ImportError, RuntimeError) as e:
        pytest.skip(f"PyCudaHandler unavailable: {e}")


M, N = 37, 53


def _inputs(rng):
    a = rng.uniform(-2, 2, (M, N))
    return {
        "a": a, "b": rng.uniform(-2, 2, (M, N)), "pos": rng.uniform(0.1, 3, (M, N)),
        "row": rng.uniform(0.5, 2, (1, N)), "col": rng.uniform(0.5, 2, (M, 1)),
        "k": rng.uniform(-1, 1, (N, 11)), "idx": rng.integers(-1, N + 1, (M, 1)).astype(float),
        "cond": (rng.random((M, N)) < 0.5).astype(float),
        "rows": rng.integers(0, M, (M, 1)).astype(float),   # valid (NumPy raises otherwise)
        "t4": rng.uniform(-1, 1, (3, 4, 5, 6)),
    }


# op name -> (argument names or ("out", shape)), the out argument's position is last
CASES = {
    "dot_mm": (["a", "k", ("out", (M, 11))], {}),
    "dot_add_mm": (["a", "b", ("out", (M, M))], {"transb": True}),
    "sum_t": (["t4", 2, ("out", (3, 4, 6))], {}),
    "sum_t-axes": (["t4", (0, 2, 3), ("out", (4,))], {}),
    "mean_t": (["t4", (1, 2), ("out", (3, 6))], {}),
    "max_t": (["t4", 1, ("out", (3, 5, 6))], {}),
    "min_t": (["a", 1, ("out", (M,))], {}),
    "argmax_t": (["a", -1, ("out", (M, 1))], {}),
    "transpose_m": (["a", ("out", (N, M))], {}),
    "concat_t": (["a", "b", 0, ("out", (2 * M, N))], {}),
    "add_tt": (["a", "b", ("out", (M, N))], {}),
    "subtract_tt": (["a", "b", ("out", (M, N))], {}),
    "mult_tt": (["a", "b", ("out", (M, N))], {}),
    "divide_tt": (["a", "pos", ("out", (M, N))], {}),
    "mult_add_tt": (["a", "b", ("out", (M, N))], {}),
    "add_st": ([0.7, "a", ("out", (M, N))], {}),
    "mult_st": ([0.7, "a", ("out", (M, N))], {}),
    "mult_add_st": ([0.7, "a", ("out", (M, N))], {}),
    "abs_t": (["a", ("out", (M, N))], {}),
    "sign_t": (["a", ("out", (M, N))], {}),
    "sqrt_t": (["pos", ("out", (M, N))], {}),
    "log_t": (["pos", ("out", (M, N))], {}),
    "exp_t": (["a", ("out", (M, N))], {}),
    "clip_t": (["a", -0.5, 0.8, ("out", (M, N))], {}),
    "broadcast_t": (["row", 0, ("out", (M, N))], {}),
    "add_mv": (["a", "row", ("out", (M, N))], {}),
    "subtract_mv": (["a", "col", ("out", (M, N))], {}),
    "mult_mv": (["a", "row", ("out", (M, N))], {}),
    "divide_mv": (["a", "col", ("out", (M, N))], {}),
    "sigmoid": (["a", ("out", (M, N))], {}),
    "tanh": (["a", ("out", (M, N))], {}),
    "relu": (["a", ("out", (M, N))], {}),
    "elu": (["a", ("out", (M, N))], {}),
    "softmax_m": (["a", ("out", (M, N))], {}),
    "index_m_by_v": (["a", "idx", ("out", (M, 1))], {}),
    "binarize_v": (["idx", ("out", (M, N))], {}),
    "gather_rows_m": (["a", "rows", ("out", (M, N))], {}),
    "scatter_add_rows_m": (["a", "rows", ("out", (M, N))], {}),
    "normalize_rows_m": (["a", 1e-3, ("out", (M, N)), "col"], {}),
    "normalize_rows_backward_m": (["a", "col", "b", ("out", (M, N))], {}),
    "copy_to_if": (["a", ("out", (M, N)), "cond"], {}),
    "fill_if": ([("out", (M, N)), 3.5, "cond"], {}),
    "add_into_if": (["a", ("out", (M, N)), "cond"], {}),
    "axpby": ([1.5, "a", -0.5, ("out", (M, N))], {}),
}
for _act in ("sigmoid", "tanh", "relu", "elu"):
    CASES[_act + "_deriv"] = (["a", "b", "pos", ("out", (M, N))], {})


@pytest.mark.parametrize("op", sorted(CASES))
def test_gpu_matches_numpy_handler(gpu, op):
    cpu = NumpyHandler(np.float64)
    rng = np.random.default_rng()
    data = _inputs(rng)
    start = rng.uniform(-1, 1, 1000)   # initial contents of "out" (some ops read it)
    args, kwargs = CASES[op]
    results = []
    for h in (cpu, gpu):
        call, out = [], None
        for arg in args:
            if isinstance(arg, tuple) and arg[0] == "out":
                out = h.create_from_numpy(np.resize(start, arg[1]))
                call.append(out)
            elif isinstance(arg, str):
                call.append(h.create_from_numpy(data[arg]))
            else:
                call.append(arg)
        getattr(h, op.split("-")[0])(*call, **kwargs)   # "sum_t-axes": sum_t
        results.append(h.get_numpy_copy(out))
    np.testing.assert_allclose(results[1], results[0], rtol=1e-12, atol=1e-12,
                               err_msg=f"{op}: PyCudaHandler differs from NumpyHandler")


@pytest.mark.parametrize("act", [None, "relu", "gelu_tanh"])
def test_dot_bias_act_runs_on_cublaslt(gpu, act):
    """A dense layer's product with its bias and activation is one cuBLASLt
    call on the GPU (handlers.cuda.lt has a plan), not the product and a
    fused op; tests/test_ops.py checks its values on every handler."""
    h = type(gpu)(np.float32, seed=5)   # the fixture's float64 may have no epilogues
    try:
        assert h._lt.available, "cuBLASLt did not load"
        for m, k, n in [(256, 784, 1024), (256, 1024, 1024), (256, 1024, 10)]:
            assert h._lt.plan(m, n, k, act) is not None, (m, k, n, act)
    finally:
        h.close()
    # float64's GELU epilogue is not float64-accurate: the fused op runs it
    assert gpu._lt.plan(256, 1024, 784, "gelu_tanh") is None


@pytest.mark.parametrize("act", [None, "relu"])
def test_conv2d_bias_act_runs_on_one_cudnn_graph(gpu, act):
    """The LeNet layers' convolution, bias and activation are one cuDNN
    graph in float32 (a fused plan, not the fallback's three ops; an H200
    offered engines 11 and 44 for both layers, November 2026);
    tests/test_conv.py checks the op's values on every handler."""
    from handlers.cuda import convolution
    h = type(gpu)(np.float32, seed=5)
    rng = np.random.default_rng(0)
    try:
        for xs, ws in [((64, 1, 28, 28), (6, 1, 5, 5)), ((64, 6, 12, 12), (16, 6, 5, 5))]:
            x = h.create_from_numpy(rng.standard_normal(xs).astype(np.float32))
            w = h.create_from_numpy(rng.standard_normal(ws).astype(np.float32))
            b = h.create_from_numpy(rng.standard_normal(ws[0]).astype(np.float32))
            y = h.allocate((xs[0], ws[0], xs[2] - 4, xs[3] - 4))
            h.conv2d_bias_act(x, w, b, y, act=act)
            code = convolution.FUSED_KINDS[act]
            plans = [p for key, p in h._conv_plans.items()
                     if key[0] == code and key[2] == xs]
            assert plans and plans[0] is not convolution.NO_PLAN, (xs, act, h.conv_engines())
    finally:
        h.close()


def test_torch_and_cupy_in_same_process(gpu):
    used = []
    try:
        import torch
        if torch.cuda.is_available():
            t = torch.randn(256, 256, device="cuda")
            torch.cuda.synchronize()
            assert torch.isfinite((t @ t).sum()).item()
            used.append("torch")
    except ImportError:
        pass
    try:
        import cupy
        c = cupy.arange(1000, dtype=cupy.float32)
        assert float(c.sum()) == 499500.0
        used.append("cupy")
    except ImportError:
        pass
    if not used:
        pytest.skip("neither PyTorch nor CuPy is importable here")
    rng = np.random.default_rng()
    a, b = rng.standard_normal((65, 33)), rng.standard_normal((33, 17))
    out = gpu.allocate((65, 17))
    gpu.dot_mm(gpu.create_from_numpy(a), gpu.create_from_numpy(b), out)
    np.testing.assert_allclose(gpu.get_numpy_copy(out), a @ b, rtol=1e-12, atol=1e-12)
    s = gpu.allocate((17,))
    gpu.sum_t(out, 0, s)
    np.testing.assert_allclose(gpu.get_numpy_copy(s), (a @ b).sum(0), rtol=1e-12, atol=1e-11)


@pytest.mark.timeout(400)   # beyond the subprocess's own 300 s limit
def test_subprocess_exits_cleanly(gpu):
    code = textwrap.dedent("""
        import numpy as np
        from handlers import PyCudaHandler
        for blas in ("scikit-cuda", "nvmath"):
            h = PyCudaHandler(np.float32, blas=blas)
            a = h.create_from_numpy(np.ones((64, 64)))
            out = h.zeros((64, 64))
            h.with_streams(1).dot_add_mm(a, a, out)
            h.synchronize_all_streams()
            assert h.get_numpy_copy(out)[0, 0] == 64.0
        try:
            import torch, cupy
            torch.ones(3, device="cuda").sum().item(); cupy.ones(3).sum().item()
        except ImportError:
            pass
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert proc.stderr == "", proc.stderr


@pytest.mark.timeout(400)   # beyond the subprocess's own 300 s limit
def test_arrays_collected_on_another_thread_do_not_abort(gpu):
    # An array in a reference cycle is freed wherever the garbage collector
    # runs.  A pycuda pool that receives a block while holding none needs the
    # context current on that thread, and aborted the process on prefetch's
    # reader thread; the block now goes back on the context's own thread.
    code = textwrap.dedent("""
        import gc, threading
        import numpy as np
        from handlers import PyCudaHandler
        h = PyCudaHandler(np.float32)
        x = h.create_from_numpy(np.arange(1000.0))
        gc.disable()
        class Node:
            pass
        node = Node(); node.self = node; node.a = h.zeros((1000,))
        del node
        h._pool.free_held()                   # the pool holds no block now
        t = threading.Thread(target=gc.collect)
        t.start(); t.join()
        held = h._pool.held_blocks            # still none: the block waits for us
        y = h.zeros((1000,))                  # on this thread: deferred blocks return
        h.add_tt(x, x, y)
        assert (h.get_numpy_copy(y) == 2 * np.arange(1000.0)).all()
        print("ok", held, h._pool.held_blocks + h._pool.active_blocks > 0)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ok", "0", "True"], proc.stdout
    assert proc.stderr == "", proc.stderr


def _use_and_drop(PyCudaHandler, rng):
    h = PyCudaHandler(np.float32)
    a = h.create_from_numpy(rng.standard_normal((256, 256)))
    out = h.zeros((256, 256))
    h.with_streams(2).dot_add_mm(a, a, out)
    data = h.pin(rng.standard_normal((4, 256, 256)).astype(np.float32))
    for xb in h.prefetch(data[i] for i in range(4)):
        h.add_tt(xb, out, out)
    assert np.isfinite(h.get_numpy_copy(out)).all()
    return weakref.ref(h), h._resources


def test_dropped_handlers_release_their_resources(gpu):
    import pycuda.driver as drv

    from handlers import PyCudaHandler
    rng = np.random.default_rng(0)
    ref, res = _use_and_drop(PyCudaHandler, rng)
    gc.collect()
    assert ref() is None, "nothing may keep a dropped handler alive"
    assert res.slots is None and res.pool is None, "its resources were not released"
    # Collected on another thread: the release waits for the thread that owns
    # the context (here: the next handler creation), so that pycuda frees
    # every object with its context current and warns about none.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref, res = _use_and_drop(PyCudaHandler, rng)
        worker = threading.Thread(target=gc.collect)
        worker.start()
        worker.join()
        assert ref() is None
        PyCudaHandler(np.float32)
        gc.collect()
    assert res.slots is None, "a release deferred from another thread never ran"
    assert not [w for w in caught if "could not be cleaned up" in str(w.message)], \
        [str(w.message) for w in caught]
    free = drv.mem_get_info()[0]
    for _ in range(20):
        _use_and_drop(PyCudaHandler, rng)
        gc.collect()
    assert abs(drv.mem_get_info()[0] - free) < 64 << 20, "device memory grew"


def test_copies_of_arrays_that_straddle_pinned_pages(gpu):
    """A host array partly inside page-locked pages (its neighbour was pinned)
    and partly outside them still uploads and downloads: the driver refuses a
    copy over such a mixed range, so the handler must route around it."""
    import mmap
    page = mmap.PAGESIZE
    n = gpu.dtype.itemsize
    raw = np.zeros(6 * page // n + page // n, gpu.dtype)
    base = raw.__array_interface__["data"][0]
    first = (-base % page) // n                      # first element on a page boundary
    pinned = raw[first + page // n: first + 3 * page // n]   # exactly pages 1-2
    gpu.pin(pinned)
    # 64 elements ending in pinned page 2 and 64 starting after it.
    lo = first + 3 * page // n - 64
    straddler = raw[lo: lo + 128]
    rng = np.random.default_rng(1)
    straddler[:] = rng.standard_normal(128)
    orig = straddler.copy()
    x = gpu.create_from_numpy(straddler)
    np.testing.assert_array_equal(gpu.get_numpy_copy(x), orig)
    gpu.set_from_numpy(x, orig[::-1].copy())
    got = gpu.get_numpy_copy_async(x, out=straddler).result()   # download into it
    assert got is straddler
    np.testing.assert_array_equal(straddler, orig[::-1])
    for xb in gpu.prefetch([straddler.reshape(2, 64)]):
        np.testing.assert_array_equal(gpu.get_numpy_copy(xb), orig[::-1].reshape(2, 64))
    # Pinning a neighbour that shares page 2 merges both into one registration:
    # a copy across the old boundary is then a plain pinned copy.
    gpu.pin(raw[lo + 32: first + 5 * page // n])
    assert gpu._pinned.contains(straddler)
    x2 = gpu.create_from_numpy(straddler)
    np.testing.assert_array_equal(gpu.get_numpy_copy(x2), orig[::-1])
