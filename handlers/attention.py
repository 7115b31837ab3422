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


def _kept(h, key, make):
    """``make()``, made once per ``key`` and stream group and kept by ``h``
    (views of a handler share its state; each group gets its own, since
    two groups' calls may run at once)."""
    cache = h.__dict__.setdefault("_attention_kept", {})
    found = cache.get((h.group, key))
    if found is None:
        found = cache[(h.group, key)] = make()
    return found


def _seen(h, role, a, shape):
    """``a`` seen with ``shape`` (``h._view``), the last view made in
    ``role`` kept and returned while ``a`` is the same array: a layer calls
    with the same arrays every step, and a view is a new array object that
    costs host time to make."""
    cache = h.__dict__.setdefault("_attention_seen", {})
    hit = cache.get((h.group, role))
    if hit is None or hit[0] is not a or hit[1].shape != shape:
        hit = cache[(h.group, role)] = (a, h._view(a, 0, shape))
    return hit[1]


def _scores(h, name, n, t, s):
    """Scratch (n, t, s) scores of ``h``'s format and their (n * t, s) rows."""
    def make():
        a = h.allocate((n, t, s))
        return a, h._view(a, 0, (n * t, s))
    return _kept(h, (name, n, t, s), make)


def _limits(h, n, t, s, causal):
    """The keys each of the n * t score rows sees, (n * t, 1), in the
    compute format (exact counts): t + 1 for query t under the causal mask,
    else all s.  Uploaded once per shape, so a call issues nothing for it."""
    def make():
        hc = h.twin(dtypes.compute_dtype(h.dtype))
        counts = np.arange(1, t + 1, dtype=np.float64) if causal else np.full(t, float(s))
        return hc.create_from_numpy(np.tile(counts, n).reshape(n * t, 1))
    return _kept(h, ("lim", n, t, s, causal), make)


def forward(h, q, k, v, out, lse, causal, scale):
    """``Handler._attention_forward``: out = softmax(scale q k^T [masked]) v
    and lse, the rows' log-sum-exp, (B, H, T)."""
    (b, hh, t, d), s = q.shape, k.shape[2]
    n = b * hh
    scores, rows = _scores(h, "scores", n, t, s)
    h._dot(_seen(h, "q", q, (n, t, d)), _seen(h, "k", k, (n, s, d)), scores, False, True, 0.0)
    h._fused(SOFTMAX, rows, _limits(h, n, t, s, causal), scale, rows,
             _seen(h, "lse", lse, (n * t, 1)))
    h._dot(scores, _seen(h, "v", v, (n, s, d)), _seen(h, "out", out, (n, t, d)), False, False,
           0.0)


def backward(h, q, k, v, out, lse, dout, dq, dk, dv, causal, scale):
    """``Handler._attention_backward``: dq, dk and dv from dout, the
    forward's inputs, its out and lse."""
    (b, hh, t, d), s = q.shape, k.shape[2]
    n = b * hh
    q3, k3 = _seen(h, "q", q, (n, t, d)), _seen(h, "k", k, (n, s, d))
    do3 = _seen(h, "dout", dout, (n, t, d))
    scores, rows = _scores(h, "scores", n, t, s)
    dp, drows = _scores(h, "dp", n, t, s)
    h._dot(q3, k3, scores, False, True, 0.0)
    h._dot(do3, _seen(h, "v", v, (n, s, d)), dp, False, True, 0.0)
    h._fused(SOFTMAX_BACKWARD, rows, drows, _seen(h, "lse", lse, (n * t, 1)),
             _limits(h, n, t, s, causal), scale, rows, drows)
    h._dot(scores, do3, _seen(h, "dv", dv, (n, s, d)), True, False, 0.0)
    h._dot(dp, k3, _seen(h, "dq", dq, (n, t, d)), False, False, 0.0)
    h._dot(dp, q3, _seen(h, "dk", dk, (n, s, d)), True, False, 0.0)
