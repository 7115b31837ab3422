"""Zero-copy interop: wrapping other libraries' arrays as handler arrays and
handing handler arrays to them (PyTorch and CuPy on the GPU; NumPy on the CPU)."""
import numpy as np
import pytest


def test_wrap_shares_memory_both_ways(handler, rng):
    data = rng.standard_normal((5, 7)).astype(handler.dtype)
    a = handler.create_from_numpy(data)
    b = handler.create_from_device_array(a)       # a handler array is itself one
    handler.mult_st(2.0, b, b)
    np.testing.assert_array_equal(handler.get_numpy_copy(a), 2 * data)


def test_wrap_rejects_bad_input(handler):
    with pytest.raises(TypeError, match="create_from_device_array"):
        handler.create_from_device_array([1.0, 2.0])
    other = np.float64 if handler.dtype == np.float32 else np.float32
    if handler.array_type is np.ndarray:
        with pytest.raises(TypeError, match="create_from_device_array"):
            handler.create_from_device_array(np.zeros(3, other))
        with pytest.raises(ValueError, match="create_from_device_array"):
            handler.create_from_device_array(np.zeros((4, 4), handler.dtype)[:, ::2])


def _gpu(handler):
    if handler.array_type is np.ndarray:
        pytest.skip("GPU interop: PyCudaHandler only")


def test_torch_tensor_round_trip(handler, rng):
    _gpu(handler)
    torch = pytest.importorskip("torch")
    tdt = torch.float32 if handler.dtype == np.float32 else torch.float64
    t = torch.randn(64, 33, dtype=tdt, device="cuda")
    torch.cuda.synchronize()
    before = t.cpu().numpy()
    a = handler.create_from_device_array(t)
    out = handler.allocate((64, 33))
    handler.mult_st(3.0, a, out)
    handler.add_st(1.0, a, a)                      # writes into t's memory
    handler.synchronize_all_streams()
    back = torch.as_tensor(out, device="cuda")     # no copy the other way
    np.testing.assert_allclose(back.cpu().numpy(), 3 * before.astype(np.float64), rtol=1e-6)
    np.testing.assert_array_equal(t.cpu().numpy(), before + before.dtype.type(1))
    assert back.data_ptr() == int(out.gpudata)
    with pytest.raises(ValueError, match="create_from_device_array"):
        handler.create_from_device_array(t.t())    # a transposed view


def test_cupy_array_round_trip(handler, rng):
    _gpu(handler)
    cp = pytest.importorskip("cupy")
    c = cp.asarray(rng.standard_normal((17, 9)).astype(handler.dtype))
    cp.cuda.Device().synchronize()
    a = handler.create_from_device_array(c)
    s = handler.allocate((9,))
    handler.sum_t(a, 0, s)
    handler.synchronize_all_streams()
    got = cp.asarray(s)
    assert got.data.ptr == int(s.gpudata)
    np.testing.assert_allclose(cp.asnumpy(got), cp.asnumpy(c).sum(0), rtol=1e-5, atol=1e-6)
