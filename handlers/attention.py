"""Scaled dot-product attention: the default work of the contract's
``attention_forward`` and ``attention_backward`` (``Handler``'s hooks), in
the contract's own batched products and two fused row programs, so that
it runs on every handler and a capture records it like any op.

Over queries q (B, H, T, D), keys k and values v (B, H, S, D), with
scores z = scale * q k^T (masked to -inf above the diagonal when causal:
query t sees keys 0..t, PyTorch's ``is_causal``):

* forward: p = softmax(z) along each row, out = p v, and per row the
  log-sum-exp lse = m + log(sum(exp(z - m))) (m the row's maximum), which is
  all the backward needs of the softmax;
* backward: p again from the scores (lse keeping exp in range), dp = dout
  v^T, then per row d = sum(p * dp) (= sum(dout * out)), ds = p * (dp - d),
  and dv = p^T dout, dq = scale * ds k, dk = scale * ds^T q.

The (B * H, T, S) scores take scratch memory of the handler's format, two
such arrays in the backward, allocated at the first call of each shape on
each stream group and kept by the handler (a captured step's warm-up
allocates them; memory grows as T * S, which fused attention kernels
avoid: the issue's cuDNN path, where a backend has it, replaces this work).
"""
import math

import numpy as np

from . import dtypes
from .fused import fused_op

#: the forward's softmax over the scores' rows, with the mask and the scale
SOFTMAX = fused_op("attention_softmax", inputs="s lim:col^ #scale", outputs="p lse:col",
                   body="z = where(col < lim, s * scale, log(0))\n"
                        "m = max(z)\ne = exp(z - m)\nt = sum(e)\np = e / t\nlse = m + log(t)")
#: the backward's p and the scores' gradient.  p is normalized by its own
#: row sum: lse (stored in the handler's format, rounded in a half) only
#: keeps exp from overflowing, so p sums to 1 and d, the row's sum of
#: p * dp (= sum(dout * out) over the head size), matches it
SOFTMAX_BACKWARD = fused_op(
    "attention_softmax_backward", inputs="s dp lse:col lim:col^ #scale", outputs="p ds",
    body="z = where(col < lim, s * scale, log(0))\ne = exp(z - lse)\np = e / sum(e)\n"
         "d = sum(p * dp)\nds = p * (dp - d) * scale")


def default_scale(q):
    """1 / sqrt(D), for queries of head size D."""
    return 1.0 / math.sqrt(q.shape[-1])


def _scratch(h, name, shape):
    """An array of ``shape`` and ``h``'s format kept by ``h`` for this
    stream group (views of a handler share its state; each group gets its
    own, since two groups' calls may run at once)."""
    cache = h.__dict__.setdefault("_attention_scratch", {})
    key = (h.group, name, shape)
    found = cache.get(key)
    if found is None:
        found = cache[key] = h.allocate(shape)
    return found


def _views(h, q, k, v):
    """(B * H, T, D) and (B * H, S, D) views of q, k, v, and B*H, T, S."""
    b, hh, t, d = q.shape
    s = k.shape[2]
    n = b * hh
    return (h._view(q, 0, (n, t, d)), h._view(k, 0, (n, s, d)), h._view(v, 0, (n, s, d)),
            n, t, s)


def _limits(h, n, t, s, causal):
    """The keys each of the n * t score rows sees, (n * t, 1), in the
    compute format (exact counts): t + 1 for query t under the causal mask,
    else all s.  Uploaded once per shape and kept with the scratch, so a
    call issues nothing for it."""
    cache = h.__dict__.setdefault("_attention_scratch", {})
    key = (h.group, "lim", n, t, s, causal)
    lim = cache.get(key)
    if lim is None:
        hc = h.twin(dtypes.compute_dtype(h.dtype))
        counts = np.arange(1, t + 1, dtype=np.float64) if causal else np.full(t, float(s))
        lim = cache[key] = hc.create_from_numpy(np.tile(counts, n).reshape(n * t, 1))
    return lim


def forward(h, q, k, v, out, lse, causal, scale):
    """``Handler._attention_forward``: out = softmax(scale q k^T [masked]) v
    and lse, the rows' log-sum-exp, (B, H, T)."""
    q3, k3, v3, n, t, s = _views(h, q, k, v)
    scores = _scratch(h, "scores", (n, t, s))
    h._dot(q3, k3, scores, False, True, 0.0)
    rows = h._view(scores, 0, (n * t, s))
    h._fused(SOFTMAX, rows, _limits(h, n, t, s, causal), scale, rows,
             h._view(lse, 0, (n * t, 1)))
    h._dot(scores, v3, h._view(out, 0, (n, t, q.shape[3])), False, False, 0.0)


def backward(h, q, k, v, out, lse, dout, dq, dk, dv, causal, scale):
    """``Handler._attention_backward``: dq, dk and dv from dout, the
    forward's inputs, its out and lse."""
    q3, k3, v3, n, t, s = _views(h, q, k, v)
    d = q.shape[3]
    do3 = h._view(dout, 0, (n, t, d))
    scores = _scratch(h, "scores", (n, t, s))
    dp = _scratch(h, "dp", (n, t, s))
    h._dot(q3, k3, scores, False, True, 0.0)
    h._dot(do3, v3, dp, False, True, 0.0)
    rows, drows = h._view(scores, 0, (n * t, s)), h._view(dp, 0, (n * t, s))
    h._fused(SOFTMAX_BACKWARD, rows, drows, h._view(lse, 0, (n * t, 1)),
             _limits(h, n, t, s, causal), scale, rows, drows)
    h._dot(scores, do3, h._view(dv, 0, (n, s, d)), True, False, 0.0)
    h._dot(dp, k3, h._view(dq, 0, (n, t, d)), False, False, 0.0)
    h._dot(dp, q3, h._view(dk, 0, (n, s, d)), True, False, 0.0)
