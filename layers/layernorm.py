"""``LayerNorm``: normalize each sample over its last axis, then scale and shift."""
import math
from types import SimpleNamespace

import numpy as np

from handlers.checks import check_scalar

from . import init
from .base import Layer
from .params import view


class LayerNorm(Layer):
    """y = (x - mean) / sqrt(var + eps) * gain + bias, the mean and the
    (biased) variance taken over the last axis of each sample (Ba, Kiros and
    Hinton, 2016).

    The input is (n, d), or (..., d) such as a (T, B, d) sequence, whose
    leading axes are flattened into one batch axis (every time step is
    normalized on its own).  ``gain`` and ``bias`` are (1, d), starting at 1
    and 0.

    Forward is 3 ops (``normalize_rows_m``, then the gain and the bias),
    backward 5 (the two parameter sums, ``normalize_rows_backward_m``), one
    kernel each on a GPU.  From the general ops alone (``mean_t``,
    ``subtract_mv``, ``rsqrt_t``, ...) the same took 24 kernels, and a step of
    small ops costs its launches, not its bytes.
    """

    def __init__(self, d, eps=1e-5):
        super().__init__()
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"LayerNorm: d must be an int, got {type(d).__name__} {d!r}")
        self.d, self.eps = int(d), check_scalar("LayerNorm", "eps", eps)
        if self.d < 1:
            raise ValueError(f"LayerNorm: d must be >= 1, got {d}")
        if not 0.0 < self.eps < math.inf:   # NaN fails too
            raise ValueError(f"LayerNorm: eps must be finite and > 0, got {eps}")

    def __repr__(self):
        return f"LayerNorm({self.d}, eps={self.eps:g})"

    def param_shapes(self):
        return {"gain": (1, self.d), "bias": (1, self.d)}

    def init_params(self, rng, host):
        init.constant(host["gain"], 1.0)
        init.constant(host["bias"], 0.0)

    def _bufs(self, shape):
        def build():
            h, d = self.h, self.d
            n = math.prod(shape[:-1])
            y, dx = h.allocate(shape), h.allocate(shape)
            return SimpleNamespace(
                y=y, dx=dx, n=n,
                # 2-D views of N-D arrays: the row ops want matrices.
                y2=view(h, y, 0, (n, d)), dx2=view(h, dx, 0, (n, d)),
                xhat=h.allocate((n, d)),    # the normalized input, kept for backward
                rstd=h.allocate((n, 1)),    # 1 / sqrt(var + eps), kept for backward
                tmp=h.allocate((n, d)))     # dy * xhat, then dy * gain
        return self.cached(shape, build)

    def forward(self, x, training=True):
        self.check_input(x, (2, 3, 4), self.d)
        h, b = self.h, self._bufs(tuple(x.shape))
        x2 = x if len(x.shape) == 2 else view(h, x, 0, (b.n, self.d))
        h.normalize_rows_m(x2, self.eps, b.xhat, b.rstd)
        h.mult_mv(b.xhat, self.params["gain"], b.y2)
        h.add_mv(b.y2, self.params["bias"], b.y2)
        self._b = b
        return b.y

    def backward(self, dy):
        h, b = self.h, self._b
        if tuple(dy.shape) != tuple(b.y.shape):
            raise ValueError(f"{self!r}: dy must have the output's shape {tuple(b.y.shape)}, "
                             f"got {tuple(dy.shape)}")
        dy2 = dy if len(dy.shape) == 2 else view(h, dy, 0, (b.n, self.d))
        h.sum_t(dy2, 0, self.grads["bias"])           # dbias = sum over the batch of dy
        h.mult_tt(dy2, b.xhat, b.tmp)
        h.sum_t(b.tmp, 0, self.grads["gain"])         # dgain = sum of dy * xhat
        if not self.input_grad:
            return None
        h.mult_mv(dy2, self.params["gain"], b.tmp)    # dL/dxhat = dy * gain
        h.normalize_rows_backward_m(b.xhat, b.rstd, b.tmp, b.dx2)
        return b.dx
