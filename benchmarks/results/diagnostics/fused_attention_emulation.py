"""The tiled algorithm of the fused attention kernels
(``handlers/cuda/kernels/attention.cu``) in NumPy, checked
against float64 attention (``tests/test_attention.reference``): the same
tiles of 64 rows, masks, causal tile bounds, online softmax, the
backward's one pass for dq (through the rounded lse, then divided by the
row's sum, which restores the float lse) and its pass for dk and dv per
key tile from the float statistics, with the kernels' roundings to
bfloat16 (p and ds before their products, every output).
It checks the algorithm, not the CUDA: indexing inside the kernels is
for the GPU tests (``tests/test_attention.py``) to check.

Run on any machine from the project root:
``python benchmarks/results/diagnostics/fused_attention_emulation.py``;
2026-11-28: every shape of tests/test_attention.py with head size 64 or
32, causal or not, within 4.2e-3 of float64 (max |error| / max
|reference|; the test allows bfloat16 6e-2).
"""
import pathlib
import sys

import ml_dtypes
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests"))
from test_attention import reference  # noqa: E402

TILE = 64
SHAPES = [(2, 2, 70, 70, 64), (1, 3, 5, 130, 32), (1, 2, 130, 40, 64)]


def bf(x):
    """``x`` rounded to bfloat16, as float32."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def tile(a, r0, length):
    """Rows r0 .. r0 + TILE of ``a`` (length, D), zeros past ``length``."""
    out = np.zeros((TILE, a.shape[1]), np.float32)
    rows = np.arange(r0, r0 + TILE)
    out[rows < length] = a[rows[rows < length]]
    return out


def seen(queries, keys, s, causal):
    """(queries, keys) mask: key j seen by query i."""
    m = keys[None, :] < s
    return m & (keys[None, :] <= queries[:, None]) if causal else m


def forward(q, k, v, causal, scale):
    """out, lse of attn_fwd: online softmax over key tiles."""
    n, t, _ = q.shape
    s = k.shape[1]
    out, lse = np.zeros_like(q), np.zeros((n, t), np.float32)
    for h in range(n):
        for q0 in range(0, t, TILE):
            rows = np.arange(q0, q0 + TILE)
            qt = tile(q[h], q0, t)
            m, total, o = np.full(TILE, -np.inf), np.zeros(TILE), np.zeros((TILE, q.shape[2]))
            for j0 in range(0, min(s, q0 + TILE) if causal else s, TILE):
                kt, vt = tile(k[h], j0, s), tile(v[h], j0, s)
                z = np.where(seen(rows, np.arange(j0, j0 + TILE), s, causal),
                             qt @ kt.T * scale, -np.inf)
                mn = np.maximum(m, z.max(1))
                with np.errstate(invalid="ignore"):
                    alpha = np.where(mn == -np.inf, 1.0, np.exp(m - mn))
                    p = np.where(mn[:, None] == -np.inf, 0.0, np.exp(z - mn[:, None]))
                total, m = total * alpha + p.sum(1), mn
                o = o * alpha[:, None] + bf(p) @ vt
            ok = rows < t
            out[h, rows[ok]] = bf(o[ok] / total[ok, None])
            lse[h, rows[ok]] = bf(m[ok] + np.log(total[ok]))
    return out, lse


def backward(q, k, v, out, lse, dout, causal, scale):
    """dq, dk, dv of attn_bwd_q then attn_bwd_kv."""
    n, t, _ = q.shape
    s = k.shape[1]
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    stats = np.zeros((2, n, t))
    for h in range(n):
        for q0 in range(0, t, TILE):
            rows = np.arange(q0, q0 + TILE)
            ok = rows < t
            qt, gt = tile(q[h], q0, t), tile(dout[h], q0, t)
            d = (tile(out[h], q0, t) * gt).sum(1)
            row_lse = tile(lse[h][:, None], q0, t)[:, 0]
            end = min(s, q0 + TILE) if causal else s
            total = np.zeros(TILE)
            acc = np.zeros((TILE, q.shape[2]))
            for j0 in range(0, end, TILE):
                kt, vt = tile(k[h], j0, s), tile(v[h], j0, s)
                mask = ok[:, None] & seen(rows, np.arange(j0, j0 + TILE), s, causal)
                p = np.where(mask, np.exp(qt @ kt.T * scale - row_lse[:, None]), 0)
                total += p.sum(1)
                acc += bf(p * (gt @ vt.T - d[:, None]) * scale) @ kt
            stats[0, h, rows[ok]] = row_lse[ok] + np.log(total[ok])
            stats[1, h, rows[ok]] = d[ok]
            dq[h, rows[ok]] = bf(acc[ok] / total[ok, None])
        for k0 in range(0, s, TILE):
            keys = np.arange(k0, k0 + TILE)
            kt, vt = tile(k[h], k0, s), tile(v[h], k0, s)
            dka, dva = np.zeros((TILE, q.shape[2])), np.zeros((TILE, q.shape[2]))
            for i0 in range(k0 - k0 % TILE if causal else 0, t, TILE):
                rows = np.arange(i0, i0 + TILE)
                qt, gt = tile(q[h], i0, t), tile(dout[h], i0, t)
                lses = tile(stats[0, h][:, None], i0, t)[:, 0]
                ds_ = tile(stats[1, h][:, None], i0, t)[:, 0]
                mask = (rows < t)[None, :] & seen(rows, keys, s, causal).T
                p = np.where(mask, np.exp(kt @ qt.T * scale - lses[None, :]), 0)
                dva += bf(p) @ gt
                dka += bf(bf(p) * (vt @ gt.T - ds_[None, :]) * scale) @ qt
            ok = keys < s
            dk[h, keys[ok]], dv[h, keys[ok]] = bf(dka[ok]), bf(dva[ok])
    return dq, dk, dv


def main():
    """Print each shape's errors against float64; 1 if any is over 6e-2."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for b, hh, t, s, d in SHAPES:
        for causal in (False, True):
            q, k, v, g = (bf(rng.uniform(-1, 1, sh)) for sh in
                          ((b * hh, t, d), (b * hh, s, d), (b * hh, s, d), (b * hh, t, d)))
            scale = 1 / np.sqrt(d)
            out, lse = forward(q, k, v, causal, scale)
            got = (out, lse, *backward(q, k, v, out, lse, g, causal, scale))
            want = reference(*(x.astype(np.float64) for x in (q, k, v, g)), causal, scale)
            errs = [np.abs(a - w).max() / np.abs(w).max() for a, w in zip(got, want)]
            worst = max(worst, *errs)
            print((b, hh, t, s, d), "causal" if causal else "full",
                  " ".join(f"{n} {e:.1e}" for n, e in zip(("out", "lse", "dq", "dk", "dv"), errs)))
    return int(worst > 6e-2)


if __name__ == "__main__":
    sys.exit(main())
