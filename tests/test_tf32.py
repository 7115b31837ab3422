"""PyCudaHandler(np.float32, tf32=True): float32 products on TF32 tensor cores,
an opt-in.  Against a float64 NumPy reference on fresh random data: off (the
default), a product has float32's accuracy; on, its error is TF32's (inputs
rounded to 10 explicit mantissa bits), larger than float32's and bounded.
GPU only: skipped on machines without pycuda or a GPU."""
import numpy as np
import pytest

from handlers.testing import CONFIGS as HANDLER_CONFIGS
from handlers.testing import make_handler

GPU_F32 = [k for k, (backend, kw) in HANDLER_CONFIGS.items()
           if backend != "numpy" and kw.get("dtype", np.float32) == np.float32]


def _tf32_handler(handler_id):
    make_handler(handler_id)   # skips where the configuration cannot run
    from handlers import PyCudaHandler
    _, kw = HANDLER_CONFIGS[handler_id]
    return PyCudaHandler(**dict(kw, tf32=True))


def _relative_error(h, a, b, ref):
    out = h.allocate(ref.shape)
    h.dot_mm(h.create_from_numpy(a), h.create_from_numpy(b), out)
    return float(np.abs(h.get_numpy_copy(out) - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("handler_id", GPU_F32)
def test_tf32_is_an_opt_in_with_a_bounded_error(handler_id):
    rng = np.random.default_rng()
    k = 1024
    a = rng.uniform(-1, 1, (256, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, 384)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    plain = make_handler(handler_id)
    fast = _tf32_handler(handler_id)
    assert not plain.tf32 and fast.tf32
    e_plain = _relative_error(plain, a, b, ref)
    e_tf32 = _relative_error(fast, a, b, ref)
    print(f"\n{handler_id}: max relative error of a 256x{k}x384 product: "
          f"float32 {e_plain:.2e}, TF32 {e_tf32:.2e}")
    assert e_plain < 2e-6
    # TF32 really ran (its rounding shows), and stays within its own bound:
    # each input within 2^-11 relative, so a term within about 2^-10
    assert e_tf32 > 10 * e_plain
    assert e_tf32 < 2.0 ** -10 * 4


def test_tf32_refuses_what_it_cannot_mean():
    gpu = [k for k, (backend, _) in HANDLER_CONFIGS.items() if backend != "numpy"]
    if not gpu:
        pytest.skip("no GPU configurations")
    make_handler(gpu[0])   # skips without a GPU
    from handlers import PyCudaHandler
    with pytest.raises(ValueError, match="tf32 applies to float32"):
        PyCudaHandler(np.float64, tf32=True)
    with pytest.raises(TypeError, match="tf32 must be a bool"):
        PyCudaHandler(np.float32, tf32="yes")
