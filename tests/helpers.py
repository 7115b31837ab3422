"""Shared test helpers of this project's own tests.

The kit users get (``handlers.testing``) holds the general ones: random
inputs, poisoned outputs, tolerances and comparison against float64
references computed on the inputs *as the handler holds them* (after
rounding to its dtype), so the only error measured is the handler's own.
They are re-exported here, one copy; below are the few this project's tests
alone use.
"""
import numpy as np

from handlers import dtypes
from handlers.testing import (  # noqa: F401
    as_handler_values,
    assert_close,
    assert_unchanged,
    by_dtype,
    poisoned,
    rand,
    rand_input,
    tolerance,
    tolerance_of,
    upload,
)
from layers import Layer


def act_reference(act, z):
    """act(z) in float64 for the ops' activations (``dot_bias_act``,
    ``conv2d_bias_act``), from the formulas' definitions (not the handler's)."""
    if act == "relu":
        return np.maximum(z, 0.0)
    if act == "gelu_tanh":
        return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
    return z


def assert_epilogue_close(handler, out, expected, product, n, what=""):
    """``out`` (an op's act(product + bias)) against the float64
    ``expected``: the handler's tolerance for sums of ``n`` terms, plus, in
    a half format, one more rounding of ``product`` (an op may round it to
    the format before its epilogue, which the bias can cancel down to a
    much smaller result; 1.5: GELU's slope is below it)."""
    rtol, atol = tolerance(handler, n)
    slack = 1.5 * dtypes.unit_roundoff(handler.dtype) * np.abs(product) \
        if dtypes.is_half(handler.dtype) else 0.0
    got = handler.get_numpy_copy(out).astype(np.float64)
    bad = ~(np.abs(got - expected) <= atol + rtol * np.abs(expected) + slack)
    assert not bad.any(), (what, got[bad][:5], expected[bad][:5])


def other_dtype(dtype):
    """The other float dtype a handler may have."""
    return np.dtype(np.float64 if np.dtype(dtype) == np.float32 else np.float32)


def shape_id(shape):
    """Readable test id for a shape: (2, 3) -> '2x3', () -> 'scalar'."""
    return "x".join(str(s) for s in shape) if shape else "scalar"


def differing(got, want, prefix=""):
    """Names (starting with ``prefix``) whose values differ between two state
    dicts; an array differs unless dtype, shape and every byte agree."""
    out = []
    for name in sorted(set(got) | set(want)):
        if not name.startswith(prefix):
            continue
        a, b = got.get(name), want.get(name)
        if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
            if (a.dtype, a.shape) != (b.dtype, b.shape) or a.tobytes() != b.tobytes():
                out.append(name)
        elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray) or a != b:
            out.append(name)
    return out


class Scale(Layer):
    """y = x * s, one learned factor per feature: a layer written by a user."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def param_shapes(self):
        return {"s": (1, self.n)}

    def init_params(self, rng, host):
        host["s"][...] = 1.0

    def forward(self, x, training=True):
        b = self.buffers(x.shape, y=x.shape, tmp=x.shape, dx=x.shape)
        self.h.mult_mv(x, self.params["s"], b.y)
        self.x = x
        return b.y

    def backward(self, dy):
        b = self.buffers(dy.shape)
        self.h.mult_tt(dy, self.x, b.tmp)
        self.h.sum_t(b.tmp, 0, self.grads["s"])       # writes (does not add) the gradient
        self.h.mult_mv(dy, self.params["s"], b.dx)
        return b.dx
