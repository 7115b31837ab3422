"""``LayerNorm``: normalize each sample over its last axis, then scale and shift."""
import math

import numpy as np

from handlers import fused_op
from handlers.checks import check_scalar

from . import init
from .base import Layer

#: The forward pass: y, and each row's mean and 1 / std kept for the backward.
_FORWARD = fused_op("layer_norm", inputs="x gain:row bias:row #eps", outputs="y mu:col r:col",
                    body="""
mu = mean(x)
d = x - mu
r = 1 / sqrt(mean(d * d) + eps)
y = d * r * gain + bias
""")
# The backward pass, from x and the kept mean and 1 / std (xhat is recomputed,
# never stored): dgain and dbias are sums over the rows (":row" outputs).
_GRADS = """
xhat = (x - mu) * r
dgain = dy * xhat
dbias = dy
"""
_BACKWARD = fused_op("layer_norm_backward", inputs="dy x gain:row mu:col r:col",
                     outputs="dx dgain:row dbias:row", body=_GRADS + """
g = dy * gain
dx = r * (g - mean(g) - xhat * mean(g * xhat))
""")
#: The backward pass when no layer below needs dL/dx: the parameters' alone.
_PARAM_GRADS = fused_op("layer_norm_param_grads", inputs="dy x mu:col r:col",
                        outputs="dgain:row dbias:row", body=_GRADS)


class RowNorm(Layer):
    """A normalization over the last axis of each sample whose forward and
    backward are one fused op each: a subclass names the ops, its
    parameters (``gain`` first; ``gain`` starts at 1, the others at 0) and
    the per-row values its forward keeps for the backward.

    The input is (n, d), or (..., d) such as a (T, B, d) sequence, whose
    leading axes are flattened into one batch axis (every time step is
    normalized on its own); each parameter is (1, d).  The ops' arguments:
    forward (x, *params, eps) -> (y, *kept); backward (dy, x, gain, *kept)
    -> (dx, *grads); parameter gradients alone (dy, x, *kept) -> grads.
    """

    PARAMS = ("gain",)
    KEPT = ()
    FORWARD = BACKWARD = PARAM_GRADS = None

    def __init__(self, d, eps):
        super().__init__()
        name = type(self).__name__
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"{name}: d must be an int, got {type(d).__name__} {d!r}")
        self.d, self.eps = int(d), check_scalar(name, "eps", eps)
        if self.d < 1:
            raise ValueError(f"{name}: d must be >= 1, got {d}")
        if not 0.0 < self.eps < math.inf:   # NaN fails too
            raise ValueError(f"{name}: eps must be finite and > 0, got {eps}")

    def __repr__(self):
        return f"{type(self).__name__}({self.d}, eps={self.eps:g})"

    def param_shapes(self):
        return {p: (1, self.d) for p in self.PARAMS}

    def init_params(self, rng, host):
        for p in self.PARAMS:
            init.constant(host[p], 1.0 if p == "gain" else 0.0)

    def forward(self, x, training=True):
        self.check_input(x, (2, 3, 4), self.d)
        shape = tuple(x.shape)
        rows = shape[:-1] + (1,)
        b = self.buffers(shape, y=shape, dx=shape, **{k: rows for k in self.KEPT})
        self.run_fused(("forward", shape), self.FORWARD, x,
                       *(self.params[p] for p in self.PARAMS), self.eps, b.y,
                       *(getattr(b, k) for k in self.KEPT))
        self._x, self._b = x, b
        return b.y

    def backward(self, dy):
        b = self._b
        if tuple(dy.shape) != tuple(b.y.shape):
            raise ValueError(f"{self!r}: dy must have the output's shape {tuple(b.y.shape)}, "
                             f"got {tuple(dy.shape)}")
        kept = [getattr(b, k) for k in self.KEPT]
        grads = [self.grads[p] for p in self.PARAMS]
        if not self.input_grad:
            self.run_fused(("param grads", dy.shape), self.PARAM_GRADS, dy, self._x, *kept,
                           *grads)
            return None
        self.run_fused(("backward", dy.shape), self.BACKWARD, dy, self._x, self.params["gain"],
                       *kept, b.dx, *grads)
        return b.dx


class LayerNorm(RowNorm):
    """y = (x - mean) / sqrt(var + eps) * gain + bias, the mean and the
    (biased) variance taken over the last axis of each sample (Ba, Kiros and
    Hinton, 2016).

    The input is (n, d), or (..., d) such as a (T, B, d) sequence, whose
    leading axes are flattened into one batch axis (every time step is
    normalized on its own).  ``gain`` and ``bias`` are (1, d), starting at 1
    and 0.

    Forward and backward are one fused op each (``handlers.fused``), one
    kernel on a GPU: the forward reads x once and keeps only each row's mean
    and 1 / std; the backward reads dy and x once and gives dx and the sums
    over the rows of the gain's and the bias's gradients.
    """

    PARAMS = ("gain", "bias")
    KEPT = ("mu", "r")
    FORWARD, BACKWARD, PARAM_GRADS = _FORWARD, _BACKWARD, _PARAM_GRADS

    def __init__(self, d, eps=1e-5):
        super().__init__(d, eps)
