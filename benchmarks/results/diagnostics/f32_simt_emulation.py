"""The float32 attention kernels (``namespace simt`` in kernels/attention.cu,
landed in 5c85064) written out in NumPy, thread by thread, to check their
index maps without a GPU (written 2026-11-28, tenth session).

Each kernel's blocks run in turn; a block's 128 threads are its (ty, tx)
pairs, each phase between two barriers a loop over them, a half warp's
shuffles (a row's maximum and sum) a reduction over tx; shared tiles are
arrays of the kernels' shapes, their padding NaN so that a read of an
unwritten slot shows.  Everything is float64, so the kernels' results
must match scaled dot-product attention written out directly (float64
NumPy, as tests/test_attention.py's reference) to rounding: they did, at
most 9.4e-16 relative over five shapes (causal and not, more keys than
queries and fewer, head sizes 32 and 64, none a multiple of a tile).  What
this cannot check is the CUDA itself: the GPU tests do.

Run: ``python benchmarks/results/diagnostics/f32_simt_emulation.py`` (about
a minute; NumPy only).
"""
import itertools

import numpy as np

KEYS, FWD_ROWS, BWD_ROWS = 32, 64, 32


def threads(R):
    """A block's threads (ty, tx) by each of their R rows i: ty * R + i."""
    return itertools.product(range(8), range(16), range(R))


def stage(src, r0, rows, length, D):
    tile = np.zeros((rows, D))
    n = max(0, min(rows, length - r0))
    tile[:n] = src[r0:r0 + n]
    return tile


def scores(a, b, R):
    # acc[ty, tx, i, j] = a[ty*R+i] . b[tx+16j]
    acc = np.zeros((8, 16, R, 2))
    for ty, tx, i in threads(R):
        for j in range(2):
            acc[ty, tx, i, j] = a[ty * R + i] @ b[tx + 16 * j]
    return acc


def add_times(acc, p, b, R, DV):
    for ty, tx, i in threads(R):
        for c in range(DV):
            acc[ty, tx, i, c] += sum(p[ty * R + i, k] * b[k, tx * DV + c] for k in range(KEYS))


def forward(q, k, v, t, s, D, causal, scale):
    n = q.shape[0]
    out, lse = np.full((n, t, D), np.nan), np.full((n, t), np.nan)
    R, DV = FWD_ROWS // 8, D // 16
    tiles = -(-t // FWD_ROWS)
    for block in range(n * tiles):
        head, q0 = block // tiles, (block % tiles) * FWD_ROWS
        qs = stage(q[head], q0, FWD_ROWS, t, D)
        m = np.full((8, 16, R), -np.inf)
        rsum = np.zeros((8, 16, R))
        o = np.zeros((8, 16, R, DV))
        end = min(s, q0 + FWD_ROWS) if causal else s
        for j0 in range(0, end, KEYS):
            ks, vs = stage(k[head], j0, KEYS, s, D), stage(v[head], j0, KEYS, s, D)
            z = scores(qs, ks, R)
            ps = np.full((FWD_ROWS, KEYS + 4), np.nan)
            for ty in range(8):
                for i in range(R):
                    qi = q0 + ty * R + i
                    tops = []
                    for tx in range(16):
                        top = -np.inf
                        for j in range(2):
                            kj = j0 + tx + 16 * j
                            seen = kj < s and (not causal or kj <= qi)
                            z[ty, tx, i, j] = z[ty, tx, i, j] * scale if seen else -np.inf
                            top = max(top, z[ty, tx, i, j])
                        tops.append(top)
                    rowmax = max(tops)
                    sums = []
                    for tx in range(16):
                        mn = max(m[ty, tx, i], rowmax)
                        alpha = 1.0 if mn == -np.inf else np.exp(m[ty, tx, i] - mn)
                        sm = 0.0
                        for j in range(2):
                            p = 0.0 if mn == -np.inf else np.exp(z[ty, tx, i, j] - mn)
                            sm += p
                            ps[ty * R + i, tx + 16 * j] = p
                        sums.append((alpha, sm, mn))
                    total = sum(x[1] for x in sums)
                    for tx in range(16):
                        alpha, _, mn = sums[tx]
                        rsum[ty, tx, i] = rsum[ty, tx, i] * alpha + total
                        m[ty, tx, i] = mn
                        o[ty, tx, i] *= alpha
            add_times(o, ps, vs, R, DV)
        for ty, tx, i in threads(R):
            qi = q0 + ty * R + i
            if qi < t:
                inv = 1 / rsum[ty, tx, i] if rsum[ty, tx, i] > 0 else 0
                out[head, qi, tx * DV:(tx + 1) * DV] = o[ty, tx, i] * inv
                if tx == 0:
                    lse[head, qi] = m[ty, tx, i] + np.log(rsum[ty, tx, i])
    return out, lse


def backward_q(q, k, v, out, lse, dout, t, s, D, causal, scale):
    n = q.shape[0]
    dq = np.full((n, t, D), np.nan)
    stats = np.full(2 * n * t, np.nan)
    R, DV = BWD_ROWS // 8, D // 16
    tiles = -(-t // BWD_ROWS)
    for block in range(n * tiles):
        head, q0 = block // tiles, (block % tiles) * BWD_ROWS
        qs, gs = stage(q[head], q0, BWD_ROWS, t, D), stage(dout[head], q0, BWD_ROWS, t, D)
        d = np.zeros((8, R))
        row_lse = np.zeros((8, R))
        for ty in range(8):
            for i in range(R):
                qi = q0 + ty * R + i
                part = 0.0
                for tx in range(16):
                    if qi < t:
                        cols = slice(tx * DV, (tx + 1) * DV)
                        part += out[head, qi, cols] @ dout[head, qi, cols]
                d[ty, i] = part
                row_lse[ty, i] = lse[head, qi] if qi < t else 0
        acc = np.zeros((8, 16, R, DV))
        end = min(s, q0 + BWD_ROWS) if causal else s
        for j0 in range(0, end, KEYS):
            ks, vs = stage(k[head], j0, KEYS, s, D), stage(v[head], j0, KEYS, s, D)
            z, dp = scores(qs, ks, R), scores(gs, vs, R)
            dss = np.full((BWD_ROWS, KEYS + 4), np.nan)
            for ty, tx, i in threads(R):
                qi = q0 + ty * R + i
                for j in range(2):
                    kj = j0 + tx + 16 * j
                    seen = qi < t and kj < s and (not causal or kj <= qi)
                    p = np.exp(z[ty, tx, i, j] * scale - row_lse[ty, i]) if seen else 0
                    dss[ty * R + i, tx + 16 * j] = p * (dp[ty, tx, i, j] - d[ty, i]) * scale
            add_times(acc, dss, ks, R, DV)
        for ty, tx, i in threads(R):
            qi = q0 + ty * R + i
            if qi < t:
                dq[head, qi, tx * DV:(tx + 1) * DV] = acc[ty, tx, i]
                if tx == 0:
                    stats[head * t + qi] = row_lse[ty, i]
                    stats[n * t + head * t + qi] = d[ty, i]
    return dq, stats


def backward_kv(q, k, v, dout, stats, t, s, D, causal, scale):
    n = q.shape[0]
    dk, dv = np.full((n, s, D), np.nan), np.full((n, s, D), np.nan)
    R, DV = BWD_ROWS // 8, D // 16
    tiles = -(-s // BWD_ROWS)
    for block in range(n * tiles):
        head, k0 = block // tiles, (block % tiles) * BWD_ROWS
        ks, vs = stage(k[head], k0, BWD_ROWS, s, D), stage(v[head], k0, BWD_ROWS, s, D)
        dka, dva = np.zeros((8, 16, R, DV)), np.zeros((8, 16, R, DV))
        for i0 in range(k0 - k0 % KEYS if causal else 0, t, KEYS):
            qs, gs = stage(q[head], i0, KEYS, t, D), stage(dout[head], i0, KEYS, t, D)
            lses = [stats[head * t + i0 + x] if i0 + x < t else 0 for x in range(KEYS)]
            ds_ = [stats[n * t + head * t + i0 + x] if i0 + x < t else 0 for x in range(KEYS)]
            z, dp = scores(ks, qs, R), scores(vs, gs, R)
            ps = np.full((BWD_ROWS, KEYS + 4), np.nan)
            dss = np.full((BWD_ROWS, KEYS + 4), np.nan)
            for ty, tx, i in threads(R):
                kj = k0 + ty * R + i
                for j in range(2):
                    col = tx + 16 * j
                    qi = i0 + col
                    seen = qi < t and kj < s and (not causal or kj <= qi)
                    p = np.exp(z[ty, tx, i, j] * scale - lses[col]) if seen else 0
                    ps[ty * R + i, col] = p
                    dss[ty * R + i, col] = p * (dp[ty, tx, i, j] - ds_[col]) * scale
            add_times(dva, ps, gs, R, DV)
            add_times(dka, dss, qs, R, DV)
        for ty, tx, i in threads(R):
            kj = k0 + ty * R + i
            if kj < s:
                dk[head, kj, tx * DV:(tx + 1) * DV] = dka[ty, tx, i]
                dv[head, kj, tx * DV:(tx + 1) * DV] = dva[ty, tx, i]
    return dk, dv


def reference(q, k, v, dout, causal, scale):
    """Attention and its gradients written out directly, float64: out, lse,
    dq, dk, dv."""
    z = np.einsum("ntd,nsd->nts", q, k) * scale
    t, s = z.shape[-2:]
    if causal:
        z = np.where(np.arange(s)[None, :] > np.arange(t)[:, None], -np.inf, z)
    mx = z.max(-1, keepdims=True)
    e = np.exp(z - mx)
    p = e / e.sum(-1, keepdims=True)
    lse = (mx + np.log(e.sum(-1, keepdims=True)))[..., 0]
    dp = dout @ v.transpose(0, 2, 1)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * scale
    return p @ v, lse, ds @ k, ds.transpose(0, 2, 1) @ q, p.transpose(0, 2, 1) @ dout


def compare(kernels, shapes, seed=0):
    """Run an emulation's three kernels ``(forward, backward_q,
    backward_kv)``, each taking what the one before gives, on random inputs
    of each (n, t, s, D, causal) in ``shapes`` against :func:`reference`;
    prints each shape's relative errors and returns the worst."""
    forward, backward_q, backward_kv = kernels
    rng = np.random.default_rng(seed)
    worst = 0.0
    for (n, t, s, D, causal) in shapes:
        q, k, v, g = (rng.standard_normal(sh) for sh in ((n, t, D), (n, s, D), (n, s, D),
                                                          (n, t, D)))
        scale = 1 / np.sqrt(D)
        want = reference(q, k, v, g, causal, scale)
        out, lse = forward(q, k, v, t, s, D, causal, scale)
        dq, stats = backward_q(q, k, v, out, lse, g, t, s, D, causal, scale)
        dk, dv = backward_kv(q, k, v, g, stats, t, s, D, causal, scale)
        errs = [np.abs(a - b).max() / np.abs(b).max()
                for a, b in zip((out, lse, dq, dk, dv), want)]
        worst = max(worst, *errs)
        print((n, t, s, D, causal), "out lse dq dk dv:", " ".join("%.1e" % e for e in errs))
    print(f"worst relative error against float64 attention: {worst:.1e}")
    return worst


def main():
    worst = compare((forward, backward_q, backward_kv),
                    [(2, 70, 70, 64, True), (1, 5, 40, 32, False), (1, 40, 5, 64, False),
                     (1, 37, 45, 32, True), (1, 33, 33, 64, False)])
    return 0 if worst < 1e-12 else 1


if __name__ == "__main__":
    raise SystemExit(main())
