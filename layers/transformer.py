"""The layers of a transformer beside the dense ones: ``MultiHeadAttention``,
``RMSNorm``, ``PositionEmbedding`` and ``Reshape``.

Sequences here are (B, T, d): B sequences of T positions of width d (the
layout PyTorch's ``batch_first`` takes).  ``FullyConnected``, ``LayerNorm``
and the activations take them as they are (their leading axes flattened);
a ``Residual`` adds around a block of them; ``Reshape(-1, vocab)`` makes a
(B, T, vocab) output the (B * T, vocab) rows a loss takes.
"""
import math

import numpy as np

from handlers import fused_op

from . import init
from .base import Layer
from .layernorm import RowNorm
from .params import view


def _positive_int(owner, name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{owner}: {name} must be an int >= 1, got {value!r}")
    return int(value)


class MultiHeadAttention(Layer):
    """Self-attention with ``heads`` heads over (B, T, d) sequences:
    q, k, v = x W_qkv + b_qkv split into heads of d / heads, each head's
    softmax(q k^T / sqrt(d / heads)) v (``attention_forward``; with
    ``causal`` position t attends to positions 0 to t only), the heads
    joined and projected, y = a W_o + b_o.

    Parameters: ``W_qkv`` (d, 3 d) and ``b_qkv`` (1, 3 d), the queries',
    keys' and values' projections side by side, each head's d / heads
    columns in turn; ``W_o`` (d, d) and ``b_o`` (1, d).  Weights start
    Glorot-uniform, biases at 0.

    A step is two products with their biases (``dot_bias_act``), two
    ``permute_t`` moving the heads between (B, T, H, D) and the
    head-major (3H, B, T, D) the attention op reads, and the attention
    op; the backward mirrors it (``attention_backward``, two permutes,
    four products and two sums).
    """

    def __init__(self, d, heads, causal=False):
        super().__init__()
        self.d = _positive_int("MultiHeadAttention", "d", d)
        self.heads = _positive_int("MultiHeadAttention", "heads", heads)
        if self.d % self.heads:
            raise ValueError(f"MultiHeadAttention: d ({d}) must be a multiple of heads ({heads})")
        if not isinstance(causal, bool):
            raise TypeError(f"MultiHeadAttention: causal must be a bool, got {causal!r}")
        self.causal = causal

    def __repr__(self):
        return (f"MultiHeadAttention({self.d}, {self.heads}"
                f"{', causal=True' if self.causal else ''})")

    def param_shapes(self):
        d = self.d
        return {"W_qkv": (d, 3 * d), "b_qkv": (1, 3 * d), "W_o": (d, d), "b_o": (1, d)}

    def init_params(self, rng, host):
        init.glorot_uniform(rng, host["W_qkv"], self.d, 3 * self.d)
        init.glorot_uniform(rng, host["W_o"], self.d, self.d)
        init.constant(host["b_qkv"], 0.0)
        init.constant(host["b_o"], 0.0)

    def _bufs(self, shape):
        b, t, d = shape
        hh, dh = self.heads, d // self.heads

        def build():
            h = self.h
            n = b * t
            qkv, heads3 = h.allocate((n, 3 * d)), h.allocate((3 * hh, b, t, dh))
            att, joined = h.allocate((hh, b, t, dh)), h.allocate((n, d))
            y, dx = h.allocate(shape), h.allocate(shape)
            dheads3, dqkv = h.allocate((3 * hh, b, t, dh)), h.allocate((n, 3 * d))
            datt = h.allocate((hh, b, t, dh))
            part = (hh, b, t, dh)
            size = hh * b * t * dh
            return dict(
                n=n, qkv=qkv, qkv4=view(h, qkv, 0, (b, t, 3 * hh, dh)), heads3=heads3,
                q=view(h, heads3, 0, part), k=view(h, heads3, size, part),
                v=view(h, heads3, 2 * size, part), att=att, lse=h.allocate((hh, b, t)),
                joined=joined, joined4=view(h, joined, 0, (b, t, hh, dh)),
                y=y, y2=view(h, y, 0, (n, d)), dx=dx, dx2=view(h, dx, 0, (n, d)),
                datt=datt, dheads3=dheads3, dq=view(h, dheads3, 0, part),
                dk=view(h, dheads3, size, part), dv=view(h, dheads3, 2 * size, part),
                dqkv=dqkv, dqkv4=view(h, dqkv, 0, (b, t, 3 * hh, dh)))
        return self.cached(("bufs", tuple(shape)), build)

    def forward(self, x, training=True):
        self.check_input(x, 3, self.d)
        h, p = self.h, self.params
        bf = self._bufs(tuple(x.shape))
        x2 = self.reshaped("x", x, (bf["n"], self.d))
        h.dot_bias_act(x2, p["W_qkv"], p["b_qkv"], bf["qkv"])
        h.permute_t(bf["qkv4"], (2, 0, 1, 3), bf["heads3"])        # (3H, B, T, D)
        h.attention_forward(bf["q"], bf["k"], bf["v"], bf["att"], bf["lse"],
                            causal=self.causal)
        h.permute_t(bf["att"], (1, 2, 0, 3), bf["joined4"])        # (B, T, H, D)
        h.dot_bias_act(bf["joined"], p["W_o"], p["b_o"], bf["y2"])
        self._x2, self._bf = x2, bf
        return bf["y"]

    def backward(self, dy):
        h, p, g, bf = self.h, self.params, self.grads, self._bf
        if tuple(dy.shape) != tuple(bf["y"].shape):
            raise ValueError(f"{self!r}: dy must have the output's shape "
                             f"{tuple(bf['y'].shape)}, got {tuple(dy.shape)}")
        dy2 = self.reshaped("dy", dy, (bf["n"], self.d))
        h.sum_t(dy2, 0, g["b_o"])
        h.dot_mm(bf["joined"], dy2, g["W_o"], transa=True)
        h.dot_mm(dy2, p["W_o"], bf["joined"], transb=True)       # d(joined), in place
        h.permute_t(bf["joined4"], (2, 0, 1, 3), bf["datt"])
        h.attention_backward(bf["q"], bf["k"], bf["v"], bf["att"], bf["lse"], bf["datt"],
                             bf["dq"], bf["dk"], bf["dv"], causal=self.causal)
        h.permute_t(bf["dheads3"], (1, 2, 0, 3), bf["dqkv4"])      # (B, T, 3H, D)
        h.sum_t(bf["dqkv"], 0, g["b_qkv"])
        h.dot_mm(self._x2, bf["dqkv"], g["W_qkv"], transa=True)
        if not self.input_grad:
            return None
        h.dot_mm(bf["dqkv"], p["W_qkv"], bf["dx2"], transb=True)
        return bf["dx"]


_RMS_FORWARD = fused_op("rms_norm", inputs="x gain:row #eps", outputs="y r:col",
                        body="r = rsqrt(mean(x * x) + eps)\ny = x * r * gain\n")
_RMS_GAIN = "dgain = dy * x * r\n"
_RMS_BACKWARD = fused_op("rms_norm_backward", inputs="dy x gain:row r:col",
                         outputs="dx dgain:row", body=_RMS_GAIN + (
                             "g = dy * gain\ndx = r * (g - x * (r * r) * mean(g * x))\n"))
_RMS_PARAM_GRAD = fused_op("rms_norm_param_grad", inputs="dy x r:col", outputs="dgain:row",
                           body=_RMS_GAIN)


class RMSNorm(RowNorm):
    """y = x / sqrt(mean(x^2) + eps) * gain over the last axis of each
    sample (Zhang and Sennrich, 2019): LayerNorm without the mean and the
    bias.  The input is (n, d) or (..., d); ``gain`` (1, d) starts at 1.
    Forward and backward are one fused op each, which keep only each row's
    1 / rms."""

    KEPT = ("r",)
    FORWARD, BACKWARD, PARAM_GRADS = _RMS_FORWARD, _RMS_BACKWARD, _RMS_PARAM_GRAD

    def __init__(self, d, eps=1e-6):
        super().__init__(d, eps)


class PositionEmbedding(Layer):
    """y = x + P[:T]: a learned vector per position added to (B, T, d)
    sequences of up to ``context`` positions.  ``P`` (context, d) starts as
    N(0, 0.02^2) samples (GPT-2's).  dL/dx is dy itself; P's gradient is the
    sum of dy over the batch (zero past T)."""

    def __init__(self, context, d):
        super().__init__()
        self.context = _positive_int("PositionEmbedding", "context", context)
        self.d = _positive_int("PositionEmbedding", "d", d)

    def __repr__(self):
        return f"PositionEmbedding({self.context}, {self.d})"

    def param_shapes(self):
        return {"P": (self.context, self.d)}

    def init_params(self, rng, host):
        host["P"][...] = 0.02 * rng.standard_normal(host["P"].shape)

    def _bufs(self, shape):
        b, t, d = shape
        h = self.h

        def build():
            y = h.allocate(shape)
            return (y, view(h, y, 0, (b, t * d)), view(h, self.params["P"], 0, (1, t * d)),
                    view(h, self.grads["P"], 0, (t * d,)))
        return self.cached(("bufs", shape), build)

    def forward(self, x, training=True):
        self.check_input(x, 3, self.d)
        b, t, d = x.shape
        if t > self.context:
            raise ValueError(f"{self!r}: sequences of {t} positions exceed the context of "
                             f"{self.context}")
        y, y2, p_row, _ = self._bufs(tuple(x.shape))
        self.h.add_mv(self.reshaped("x", x, (b, t * d)), p_row, y2)
        self._shape = tuple(x.shape)
        return y

    def backward(self, dy):
        b, t, d = self._shape
        if tuple(dy.shape) != self._shape:
            raise ValueError(f"{self!r}: dy must have the output's shape {self._shape}, got "
                             f"{tuple(dy.shape)}")
        *_, dp = self._bufs(self._shape)
        if t < self.context:
            self.h.fill(self.grads["P"], 0.0)
        self.h.sum_t(self.reshaped("dy", dy, (b, t * d)), 0, dp)
        return dy if self.input_grad else None


class Reshape(Layer):
    """A view of the input in another shape, ``shape`` with at most one -1
    (what the other axes leave), and dL/dx as dy seen in the input's shape:
    ``Reshape(-1, vocab)`` turns a (B, T, vocab) output into the rows a
    loss takes.  No work at all (``reshape_t``)."""

    def __init__(self, *shape):
        super().__init__()
        if not shape or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool)
                                and (s >= 1 or s == -1) for s in shape) \
                or list(shape).count(-1) > 1:
            raise ValueError(f"Reshape: the shape takes ints >= 1 and at most one -1, "
                             f"got {shape!r}")
        self.shape = tuple(int(s) for s in shape)

    def __repr__(self):
        return f"Reshape({', '.join(map(str, self.shape))})"

    def _target(self, size):
        known = math.prod(s for s in self.shape if s != -1)
        if -1 in self.shape:
            if size % known:
                return None
            return tuple(size // known if s == -1 else s for s in self.shape)
        return self.shape if known == size else None

    def forward(self, x, training=True):
        target = self._target(math.prod(x.shape))
        if target is None:
            raise ValueError(f"{self!r}: an input of shape {tuple(x.shape)} does not fit")
        self._shape = tuple(x.shape)
        return self.reshaped(("y", self._shape), x, target)

    def backward(self, dy):
        if not self.input_grad:
            return None
        if math.prod(dy.shape) != math.prod(self._shape):
            raise ValueError(f"{self!r}: dy of shape {tuple(dy.shape)} does not fit the "
                             f"input's {self._shape}")
        return self.reshaped(("dx", self._shape), dy, self._shape)
