"""The half formats' attention kernels of ``tc_attention.patch`` (mma.sync
m16n8k16 and ldmatrix, scores kept in registers) written out in NumPy, lane
by lane, to check their index maps without a GPU (2026-11-28, eleventh
session).

``ldsm4`` and ``mma`` below follow the PTX ISA's register layouts, not the
kernels: ldmatrix's lanes 8 i .. 8 i + 7 give the rows of matrix i, and lane
l receives row l / 4, elements 2 (l % 4) and + 1 (``.trans``: column l / 4,
rows 2 (l % 4) and + 1); mma's A register r of lane l holds row g + 8 (r % 2)
and columns 2 t + 8 (r // 2) + {0, 1} (g = l / 4, t = l % 4), B register r
rows 2 t + 8 r + {0, 1} of column g, C elements e row g + 8 (e // 2),
column 2 t + e % 2.  The kernels' own parts (the lanes' addresses, the
score blocks packed as A operands, the masks, the rows each lane stores)
are transliterated from the patch.  Everything is float64 (no rounding to
bfloat16), so the kernels must match attention written out directly
(float64 NumPy: ``f32_simt_emulation.reference``) to rounding; the CUDA
itself only the GPU tests check.

Run: ``python benchmarks/results/diagnostics/tc_attention_emulation.py``
(NumPy only, under a minute).
"""
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from f32_simt_emulation import compare  # noqa: E402  (this folder's, beside the script)

TILE, WARPS = 64, 4
L = np.arange(32)
G, TIG = L // 4, L % 4          # a lane's group (row) and place in its quad
COL = TIG * 2


def load_tile(src, r0, length, D):
    """Rows r0 .. r0 + TILE of src, zeros past length (the staged tile)."""
    tile = np.zeros((TILE, D))
    n = max(0, min(TILE, length - r0))
    tile[:n] = src[r0:r0 + n]
    return tile


def ldsm4(tile, rows, cols, trans):
    """ldmatrix .x4: lane l points at tile[rows[l], cols[l]:+8]; returns
    regs[l, i, 2] (matrix i's pair for lane l)."""
    regs = np.zeros((32, 4, 2))
    for i in range(4):
        m = np.stack([tile[rows[8 * i + r], cols[8 * i + r]:cols[8 * i + r] + 8]
                      for r in range(8)])
        for e in range(2):
            regs[:, i, e] = m[G, COL + e] if not trans else m[COL + e, G]
    return regs


def mma(c, a, b0, b1):
    """c[l, 4] += A (16 x 16 from a[l, 4, 2]) times B (16 x 8 from b0, b1 [l, 2])."""
    A, B, C = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
    for r in range(4):
        for e in range(2):
            A[G + 8 * (r % 2), COL + 8 * (r // 2) + e] = a[:, r, e]
    for e in range(2):
        B[COL + e, G] = b0[:, e]
        B[COL + 8 + e, G] = b1[:, e]
    for e in range(4):
        C[G + 8 * (e // 2), COL + e % 2] = c[:, e]
    C += A @ B
    return np.stack([C[G + 8 * (e // 2), COL + e % 2] for e in range(4)], 1)


def rows_a(tile, r0, D):
    """tc::rows_a: a[kk] of [l, 4, 2]."""
    return [ldsm4(tile, r0 + (L & 15), kk * 16 + (L >> 4) * 8, False) for kk in range(D // 16)]


def times_rows_t(a, tile, j0, D):
    """tc::times_rows_t: c[2] of [l, 4]."""
    c = [np.zeros((32, 4)), np.zeros((32, 4))]
    for kk in range(D // 16):
        b = ldsm4(tile, j0 + (L >> 4) * 8 + (L & 7), kk * 16 + ((L >> 3) & 1) * 8, False)
        c[0] = mma(c[0], a[kk], b[:, 0], b[:, 1])
        c[1] = mma(c[1], a[kk], b[:, 2], b[:, 3])
    return c


def as_a(c):
    """tc::as_a: the A operand [l, 4, 2] of a score block c[2] of [l, 4]."""
    return np.stack([c[0][:, 0:2], c[0][:, 2:4], c[1][:, 0:2], c[1][:, 2:4]], 1)


def add_times_rows(acc, a, tile, j0, D):
    """tc::add_times_rows: acc[D / 8] of [l, 4]."""
    for c in range(0, D // 8, 2):
        b = ldsm4(tile, j0 + (L & 15), c * 8 + (L >> 4) * 8, True)
        acc[c] = mma(acc[c], a, b[:, 0], b[:, 1])
        acc[c + 1] = mma(acc[c + 1], a, b[:, 2], b[:, 3])


def store_rows(dst, acc, r0, length, factor, D):
    """tc::store_rows: dst (length, D) takes the warp's rows; factor[h] of [l]."""
    for h in range(2):
        for lane in range(32):
            row = r0 + G[lane] + 8 * h
            if row >= length:
                continue
            for c in range(D // 8):
                for e in range(2):
                    dst[row, c * 8 + COL[lane] + e] = acc[c][lane, 2 * h + e] * factor[h][lane]


def quad(x, op):
    """x[l] combined over each quad, every lane of it given the result."""
    return np.repeat(op(x.reshape(8, 4), axis=1), 4)


def forward(q, k, v, t, s, D, causal, scale):
    n = q.shape[0]
    out, lse = np.full((n, t, D), np.nan), np.full((n, t), np.nan)
    for head in range(n):
        for q0 in range(0, t, TILE):
            qs = load_tile(q[head], q0, t, D)
            for w in range(WARPS):
                row0 = q0 + w * 16 + G
                qa = rows_a(qs, w * 16, D)
                m, total = [np.full(32, -np.inf)] * 2, [np.zeros(32)] * 2
                o = [np.zeros((32, 4)) for _ in range(D // 8)]
                end = min(s, q0 + TILE) if causal else s
                for j0 in range(0, end, TILE):
                    ks, vs = load_tile(k[head], j0, s, D), load_tile(v[head], j0, s, D)
                    z, top = [], [np.full(32, -np.inf), np.full(32, -np.inf)]
                    for b in range(TILE // 16):
                        zb = times_rows_t(qa, ks, 16 * b, D)
                        for j in range(2):
                            for e in range(4):
                                kj = j0 + 16 * b + 8 * j + COL + (e & 1)
                                seen = (kj < s) & (~causal | (kj <= row0 + 8 * (e >> 1)))
                                zb[j][:, e] = np.where(seen, zb[j][:, e] * scale, -np.inf)
                                top[e >> 1] = np.maximum(top[e >> 1], zb[j][:, e])
                        z.append(zb)
                    mn = [np.maximum(m[h], quad(top[h], np.max)) for h in range(2)]
                    with np.errstate(invalid="ignore"):
                        alpha = [np.where(mn[h] == -np.inf, 1.0, np.exp(m[h] - mn[h]))
                                 for h in range(2)]
                    ssum = [np.zeros(32), np.zeros(32)]
                    for b in range(TILE // 16):
                        for j in range(2):
                            for e in range(4):
                                h = e >> 1
                                with np.errstate(invalid="ignore"):
                                    p = np.where(mn[h] == -np.inf, 0.0,
                                                 np.exp(z[b][j][:, e] - mn[h]))
                                ssum[h] = ssum[h] + p
                                z[b][j][:, e] = p
                    for h in range(2):
                        total[h] = total[h] * alpha[h] + quad(ssum[h], np.sum)
                        m[h] = mn[h]
                    for c in range(D // 8):
                        for e in range(4):
                            o[c][:, e] *= alpha[e >> 1]
                    for b in range(TILE // 16):
                        add_times_rows(o, as_a(z[b]), vs, 16 * b, D)
                store_rows(out[head], o, q0 + w * 16, t, [1 / total[0], 1 / total[1]], D)
                for h in range(2):
                    for lane in range(0, 32, 4):
                        row = row0[lane] + 8 * h
                        if row < t:
                            lse[head, row] = m[h][lane] + np.log(total[h][lane])
    return out, lse


def backward_q(q, k, v, out, lse, dout, t, s, D, causal, scale):
    n = q.shape[0]
    dq, stats = np.full((n, t, D), np.nan), np.full((2, n, t), np.nan)
    for head in range(n):
        for q0 in range(0, t, TILE):
            qs, gs = load_tile(q[head], q0, t, D), load_tile(dout[head], q0, t, D)
            for w in range(WARPS):
                row0 = q0 + w * 16 + G
                qa, da = rows_a(qs, w * 16, D), rows_a(gs, w * 16, D)
                d, row_lse = [np.zeros(32), np.zeros(32)], [np.zeros(32), np.zeros(32)]
                for h in range(2):
                    for lane in range(32):
                        qi = row0[lane] + 8 * h
                        if qi < t:
                            for c in range(D // 8):
                                for e in range(2):
                                    x = 8 * c + COL[lane] + e
                                    d[h][lane] += out[head, qi, x] * dout[head, qi, x]
                            row_lse[h][lane] = lse[head, qi]
                    d[h] = quad(d[h], np.sum)
                end = min(s, q0 + TILE) if causal else s
                total = [np.zeros(32), np.zeros(32)]
                acc = [np.zeros((32, 4)) for _ in range(D // 8)]
                for j0 in range(0, end, TILE):
                    ks, vs = load_tile(k[head], j0, s, D), load_tile(v[head], j0, s, D)
                    for b in range(TILE // 16):
                        p = times_rows_t(qa, ks, 16 * b, D)
                        dp = times_rows_t(da, vs, 16 * b, D)
                        for j in range(2):
                            for e in range(4):
                                h = e >> 1
                                kj = j0 + 16 * b + 8 * j + COL + (e & 1)
                                qi = row0 + 8 * h
                                seen = (qi < t) & (kj < s) & (~causal | (kj <= qi))
                                pe = np.where(seen, np.exp(p[j][:, e] * scale - row_lse[h]), 0.0)
                                total[h] = total[h] + pe
                                p[j][:, e] = pe * (dp[j][:, e] - d[h]) * scale
                        add_times_rows(acc, as_a(p), ks, 16 * b, D)
                factor = []
                for h in range(2):
                    total[h] = quad(total[h], np.sum)
                    factor.append(np.where(total[h] > 0, 1 / np.maximum(total[h], 1e-300), 0.0))
                    for lane in range(0, 32, 4):
                        qi = row0[lane] + 8 * h
                        if qi < t:
                            stats[0, head, qi] = row_lse[h][lane] + np.log(total[h][lane])
                            stats[1, head, qi] = d[h][lane]
                store_rows(dq[head], acc, q0 + w * 16, t, factor, D)
    return dq, stats


def backward_kv(q, k, v, dout, stats, t, s, D, causal, scale):
    n = q.shape[0]
    dk, dv = np.full((n, s, D), np.nan), np.full((n, s, D), np.nan)
    for head in range(n):
        for k0 in range(0, s, TILE):
            ks, vs = load_tile(k[head], k0, s, D), load_tile(v[head], k0, s, D)
            for w in range(WARPS):
                row0 = k0 + w * 16 + G
                ka, va = rows_a(ks, w * 16, D), rows_a(vs, w * 16, D)
                dka = [np.zeros((32, 4)) for _ in range(D // 8)]
                dva = [np.zeros((32, 4)) for _ in range(D // 8)]
                for i0 in range(k0 - k0 % TILE if causal else 0, t, TILE):
                    qs, gs = load_tile(q[head], i0, t, D), load_tile(dout[head], i0, t, D)
                    lses = load_tile(stats[0, head][:, None], i0, t, 1)[:, 0]
                    ds_ = load_tile(stats[1, head][:, None], i0, t, 1)[:, 0]
                    for b in range(TILE // 16):
                        p = times_rows_t(ka, qs, 16 * b, D)
                        dp = times_rows_t(va, gs, 16 * b, D)
                        for j in range(2):
                            for e in range(4):
                                c = 16 * b + 8 * j + COL + (e & 1)
                                qi, kj = i0 + c, row0 + 8 * (e >> 1)
                                seen = (qi < t) & (kj < s) & (~causal | (kj <= qi))
                                pe = np.where(seen, np.exp(p[j][:, e] * scale - lses[c]), 0.0)
                                p[j][:, e] = pe
                                dp[j][:, e] = pe * (dp[j][:, e] - ds_[c]) * scale
                        add_times_rows(dva, as_a(p), gs, 16 * b, D)
                        add_times_rows(dka, as_a(dp), qs, 16 * b, D)
                one = [np.ones(32), np.ones(32)]
                store_rows(dk[head], dka, k0 + w * 16, s, one, D)
                store_rows(dv[head], dva, k0 + w * 16, s, one, D)
    return dk, dv


def main():
    worst = compare((forward, backward_q, backward_kv),
                    [(1, 70, 70, 64, True), (1, 5, 40, 32, False), (1, 40, 5, 64, False),
                     (1, 37, 45, 32, True), (1, 130, 130, 64, True)])
    return 0 if worst < 1e-12 else 1


if __name__ == "__main__":
    raise SystemExit(main())
