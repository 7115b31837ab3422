"""Fused ops with arrays of any format (``^``), per handler and format.

An array declared ``x^`` may be of any format the handler's class holds (an
array of a twin, ``Handler.twin``): the op computes in the handler's format,
loading such an input converted and rounding such an output once.  The
references are float64 NumPy written here on the values the arrays hold,
on fresh random inputs, outputs poisoned with NaN first; the CUDA source of
each specialization is compiled with nvcc where it is installed.
"""
import shutil
import subprocess

import numpy as np
import pytest

from handlers import NumpyHandler, dtypes, fused_op
from handlers.cuda import fused_source
from handlers.testing import poisoned, rand, tolerance

HALF_FORMATS = True

SHAPES = [(1,), (7,), (3, 257), (1100, 1000)]   # odd, unaligned tails, packets
ROW_SHAPES = [(1, 1), (4, 7), (3, 257), (5, 4, 8), (64, 1000)]

#: SGD with momentum reading a gradient and writing a working copy of the
#: parameters, both of any format (mixed precision's master update)
SGD_MIXED = fused_op("sgd_mixed", "g^ $alpha $beta", "v p w^",
                     "v = beta * v + alpha * g\np = p + v\nw = p")
#: softmax cross-entropy with its gradient on logits of any format, the
#: labels and the loss per row in the handler's
CE_MIXED = fused_op("ce_mixed", "x^ t:col", "dx^ loss:col",
                    "m = max(x); e = exp(x - m); s = sum(e); "
                    "dx = e / s - (col == t); loss = log(s) + m - sum((col == t) * x)")


def other_format(dtype):
    """A format of the handler's class other than ``dtype``."""
    return dtypes.resolve("float32" if dtypes.short_name(dtype) != "f32" else "bfloat16")


def held(h, arr):
    """An array of ``h`` or of a twin of it, its values as float64."""
    own = h if arr.dtype == h.dtype else h.twin(arr.dtype)
    return own.get_numpy_copy(arr).astype(np.float64)


def check(h, arr, ref, fmt, n=1):
    """``arr`` (of format ``fmt``) against the float64 ``ref``: the handler's
    tolerance, plus one rounding to ``fmt`` where it is another format."""
    rtol, atol = tolerance(h, n)
    if fmt != h.dtype:
        rtol += 1.01 * dtypes.unit_roundoff(fmt)
        atol += dtypes.smallest_subnormal(fmt)
    np.testing.assert_allclose(held(h, arr), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("own", [False, True], ids=["other", "own"])
def test_elementwise_arrays_of_another_format(handler, rng, shape, own):
    h = handler
    fmt = h.dtype if own else other_format(h.dtype)
    ho = h.twin(fmt)
    g = ho.create_from_numpy(rand(shape, rng, -2, 2))
    v, p = h.create_from_numpy(rand(shape, rng)), h.create_from_numpy(rand(shape, rng))
    w = poisoned(ho, shape)
    g64, v64, p64 = held(ho, g), held(h, v), held(h, p)
    SGD_MIXED(h, g, -0.1, 0.9, v, p, w)
    v_ref = 0.9 * v64 - 0.1 * g64
    check(h, v, v_ref, h.dtype, 2)
    check(h, p, p64 + v_ref, h.dtype, 3)
    check(h, w, p64 + v_ref, fmt, 3)
    assert ho.get_numpy_copy(w).dtype == fmt


@pytest.mark.parametrize("shape", ROW_SHAPES, ids=str)
def test_row_arrays_of_another_format(handler, rng, shape):
    h = handler
    fmt = other_format(h.dtype)
    if dtypes.is_half(h.dtype) and shape[-1] > 256:
        pytest.skip("class labels past 256 are not whole numbers of a half format")
    ho = h.twin(fmt)
    x = ho.create_from_numpy(rand(shape, rng, -3, 3))
    labels = rng.integers(0, shape[-1], shape[:-1] + (1,)).astype(np.float64)
    t = h.create_from_numpy(labels)
    dx, loss = poisoned(ho, shape), poisoned(h, shape[:-1] + (1,))
    CE_MIXED(h, x, t, dx, loss)
    x64 = held(ho, x)
    z = x64 - x64.max(axis=-1, keepdims=True)
    prob = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
    onehot = np.arange(shape[-1]) == labels
    check(h, dx, prob - onehot, fmt, shape[-1])
    ref_loss = -np.log((prob * onehot).sum(axis=-1, keepdims=True))
    check(h, loss, ref_loss, h.dtype, shape[-1])


def test_declarations_of_any_format():
    assert SGD_MIXED.any_format == ("g", "w")
    assert CE_MIXED.any_format == ("x", "dx")
    assert SGD_MIXED.row.any_format == ("g", "w")
    assert "of any format" in SGD_MIXED.__doc__
    for inputs, outputs in (("x b:row^", "y"), ("x", "s:row^"), ("x^^", "y"), ("^", "y")):
        with pytest.raises(ValueError):
            fused_op("bad_format", inputs, outputs, "y = x" if "y" in outputs else "s = x")


def test_an_output_over_an_input_of_another_format_is_refused():
    """An element of another size sits at another offset: writing over an
    input of another format would overwrite elements not yet read."""
    h = NumpyHandler(np.float32)
    hb = h.twin("bfloat16")
    copy = fused_op("copy_any", "x^", "y", "y = 2 * x")
    y = h.create_from_numpy(np.ones(8))
    x = y.view(hb.dtype)[:8]     # bfloat16 over the first half of y's memory
    with pytest.raises(ValueError, match="same format"):
        copy(h, x, y)
    x_ok = hb.create_from_numpy(np.arange(8.0))
    copy(h, x_ok, y)
    np.testing.assert_array_equal(y, 2 * np.arange(8.0))


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("dtype,other", [("float32", "bfloat16"), ("bfloat16", "float32"),
                                         ("float64", "float32"), ("float32", "float16")])
@pytest.mark.parametrize("op", [SGD_MIXED, CE_MIXED], ids=lambda op: op.name)
def test_specialized_source_compiles(op, dtype, other, tmp_path):
    """nvcc accepts each specialization, named for its formats; a float
    kernel over bfloat16 arrays does no double arithmetic."""
    dt, ot = dtypes.resolve(dtype), dtypes.resolve(other)
    formats = {p: ot for p in op.any_format}
    block = fused_source.ROW_BLOCK if op.row_wise else 256
    src = tmp_path / "fused.cu"
    src.write_text(fused_source.kernel_source(op, dt, block, formats))
    kernels = fused_source.__file__.rsplit("/", 1)[0] + "/kernels"
    ptx = tmp_path / "fused.ptx"
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-I", kernels, "-ptx", "-o", str(ptx), str(src)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"nvcc failed:\n{result.stderr}\n{src.read_text()}"
    name = fused_source.kernel_name(op, dt, formats)
    assert name.endswith("".join(f"_{p}_{dtypes.short_name(ot)}" for p in op.any_format))
    assert name in ptx.read_text()
    if dtype == "float32" and other != "float64":
        assert ".f64" not in ptx.read_text(), "the float kernel computes in double somewhere"


def test_the_handlers_own_format_takes_the_plain_kernel():
    """Arrays of the handler's own format specialize nothing: the kernel and
    its name are the op's plain ones."""
    f32 = np.dtype(np.float32)
    assert fused_source.array_formats(SGD_MIXED, f32, [np.zeros(2, np.float32)] * 6) == {}
    bf = dtypes.resolve("bfloat16")
    args = [np.zeros(2, bf), -0.1, 0.9, np.zeros(2, np.float32), np.zeros(2, np.float32),
            np.zeros(2, bf)]
    assert fused_source.array_formats(SGD_MIXED, f32, args) == {"g": bf, "w": bf}
    assert fused_source.kernel_name(SGD_MIXED, f32, {}) == fused_source.kernel_name(SGD_MIXED, f32)
