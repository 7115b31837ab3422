// Fused scaled dot-product attention, the half formats on tensor cores and
// float32 on the CUDA cores (namespace simt, below): the scores never leave
// the multiprocessor (handlers/cuda/attention.py chooses this path;
// handlers/attention.py is the composed one it replaces).
//
// Arrays: q (n, t, D), k and v (n, s, D), out and dout (n, t, D), lse (n, t),
// all of format T (bfloat16, float16 or float32), contiguous, 16-byte
// aligned; n = batch x heads, D the head size (32 or 64).  Scores z = scale
// * q k^T, key j seen by query i when j < s and (not causal or j <= i), as
// handlers/attention.py.  In the half formats, products run through WMMA
// 16x16x16 fragments of T with float accumulators; softmax, its
// statistics and every scaling in float, in registers, two lanes a row (a
// lane the even columns, its partner the odd: 16 rows of a warp then fall
// on different banks of shared memory but for rows 8 apart); T only where a
// product reads it.
//
//   attn_fwd      a block of 4 warps per 64 queries of a head, grid n *
//                 ceil(t / 64): each warp 16 query rows, walking the key
//                 tiles of 64 that its block sees (causal: up to its last
//                 query) with the running maximum and sum of the online
//                 softmax; out = o / l and lse = m + log(l) at the end.
//   attn_bwd_q    the same blocks: dq = scale * ds k over the key tiles,
//                 ds = p * (dp - d), dp = dout v^T, d = sum(dout * out).
//                 lse comes rounded to T, so exp(z - lse) is p times a
//                 constant of the row, c, which its sum over the row gives:
//                 one pass accumulates c dq and c, then divides.  Writes dq,
//                 and each row's float lse (lse + log c) and d to `stats`
//                 (2 * n * t floats) for attn_bwd_kv.
//   attn_bwd_kv   a block per 64 keys of a head, grid n * ceil(s / 64): dv =
//                 p^T dout and dk = scale * ds^T q over the query tiles that
//                 see its keys, p and ds recomputed from stats.
//
// No atomics: every output element is written by one thread once, so
// results are the same bits on every run.  Blocks of exactly 128 threads.
// The float32 instantiations run the SIMT kernels below (namespace simt);
// the float64 ones exist for the loader (every kernel of the table has all
// four) and trap: the host never launches them, nor the half formats' below
// sm_80 (no bfloat16 fragments there).
#ifndef SH_HOST_PREPROCESS   // the tests' preprocessing without CUDA's headers
#include <mma.h>
#endif

#include "common.cuh"

namespace sh {
namespace attn {

constexpr int TILE = 64;           // queries or keys a tile
constexpr int WARPS = 4;           // a block: 4 warps of 16 rows each
constexpr int SLD = TILE + 4;      // floats a row of a warp's scores (a multiple of 4)
constexpr int PLD = TILE + 8;      // elements a row of a warp's p or ds (a multiple of 8)

template <int D>
struct Dims {
    static constexpr int LD = D + 8;   // elements a row of a staged tile (a multiple of 8)
};

// rows [r0, r0 + TILE) of a (len, D) array into tile (TILE, LD), rows past
// len as zeros; 16-byte vectors, the block's 128 threads.
template <typename T, int D>
__device__ __forceinline__ void load_tile(T* tile, const T* src, long long r0, long long len) {
    constexpr int LD = Dims<D>::LD, VEC = 16 / sizeof(T), PER_ROW = D / VEC;
    for (int e = threadIdx.x; e < TILE * PER_ROW; e += WARPS * 32) {
        const int row = e / PER_ROW, col = (e % PER_ROW) * VEC;
        uint4 value = make_uint4(0, 0, 0, 0);
        if (r0 + row < len) value = *reinterpret_cast<const uint4*>(src + (r0 + row) * D + col);
        *reinterpret_cast<uint4*>(tile + row * LD + col) = value;
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
using namespace nvcuda;
template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;   // read as X^T
template <typename T>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// sw (16, TILE) floats = a (16, D, fragments) times the transpose of the
// tile's rows (TILE, D) in shared memory.
template <typename T, int D>
__device__ __forceinline__ void times_rows_t(float* sw, const FragA<T> (&a)[D / 16],
                                             const T* tile) {
    constexpr int LD = Dims<D>::LD;
#pragma unroll
    for (int c = 0; c < TILE / 16; ++c) {
        Acc acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            FragBt<T> b;
            wmma::load_matrix_sync(b, tile + c * 16 * LD + kk * 16, LD);
            wmma::mma_sync(acc, a[kk], b, acc);
        }
        wmma::store_matrix_sync(sw + c * 16, acc, SLD, wmma::mem_row_major);
    }
}

// acc (D / 16 fragments of 16 x 16) += pw (16, TILE) of T times the tile's
// rows (TILE, D).
template <typename T, int D>
__device__ __forceinline__ void add_times_rows(Acc (&acc)[D / 16], const T* pw, const T* tile) {
    constexpr int LD = Dims<D>::LD;
#pragma unroll
    for (int kk = 0; kk < TILE / 16; ++kk) {
        FragA<T> a;
        wmma::load_matrix_sync(a, pw + kk * 16, PLD);
#pragma unroll
        for (int c = 0; c < D / 16; ++c) {
            FragB<T> b;
            wmma::load_matrix_sync(b, tile + kk * 16 * LD + c * 16, LD);
            wmma::mma_sync(acc[c], a, b, acc[c]);
        }
    }
}

// Rows w * 16 .. of the staged tile as A fragments (16, D).
template <typename T, int D>
__device__ __forceinline__ void load_rows(FragA<T> (&a)[D / 16], const T* tile, int w) {
    constexpr int LD = Dims<D>::LD;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        wmma::load_matrix_sync(a[kk], tile + w * 16 * LD + kk * 16, LD);
}

// The fragments' (16, D) through sw, each lane's columns of row r (every
// other one from `half`) rounded into dst (the row's element `half`),
// nothing where not `valid`.
template <typename T, int D>
__device__ __forceinline__ void store_rows(float* sw, Acc (&acc)[D / 16], T* dst, bool valid,
                                           int r, int half, float factor = 1.0f) {
#pragma unroll
    for (int c = 0; c < D / 16; ++c)
        wmma::store_matrix_sync(sw + c * 16, acc[c], SLD, wmma::mem_row_major);
    __syncwarp();
    if (valid) {
        const float* row = sw + r * SLD + half;
#pragma unroll
        for (int i = 0; i < D / 2; ++i) dst[2 * i] = st<T>(row[2 * i] * factor);
    }
    __syncwarp();
}
#endif


// ------------------------------------------------------------ float32, SIMT
// float32 has no tensor-core product of float32's accuracy (tf32 split in
// three was slower than the composed path: f32_attention_ab), so its fused
// kernels run on the CUDA cores: each thread a 4- or 8-row by 2-column tile
// of a score block (rows ROWS apart from warp pairs, columns 16 apart) and
// the same rows of the output's D / 16 adjacent columns, every product read
// from shared memory in 16-byte vectors along the head (a row's value
// broadcast to the 16 lanes that share it).  The 16 lanes of a row are a
// half warp, so a row's maximum and sum are four shuffles.  Scores,
// softmax and every sum in float; exp and log the accurate ones.
//
//   forward   a block per 64 queries (as the halves'), 32 keys a step: the
//             online softmax of attn_fwd, o kept in registers.
//   bwd_q     a block per 32 queries, 32 keys a step: dq = scale * ds k,
//             ds = p * (dp - d); writes lse and d to `stats` for bwd_kv.
//   bwd_kv    a block per 32 keys, 32 queries a step: dv = p^T dout,
//             dk = scale * ds^T q.
// 128 threads: 16 across the columns (tx) by 8 down the rows (ty).  Shared
// memory stays under 48 KB (static): 44 KB at D = 64.
namespace simt {

constexpr int KEYS = 32;     // columns of a score block: keys, or queries in bwd_kv
constexpr int FWD_ROWS = 64;
constexpr int BWD_ROWS = 32;

template <int D>
struct Simt {
    static constexpr int LD = D + 4;      // floats a staged row: 16-byte rows, no conflicts
    static constexpr int PLD = KEYS + 4;  // floats a row of p or ds
    static constexpr int DV = D / 16;     // output columns a thread: 4 or 2
};

// rows [r0, r0 + ROWS) of a (len, D) float array into tile (ROWS, LD),
// rows past len as zeros, 16-byte vectors over the block's 128 threads.
template <int D, int ROWS>
__device__ __forceinline__ void stage(float* tile, const float* src, long long r0,
                                      long long len) {
    constexpr int LD = Simt<D>::LD, PER_ROW = D / 4;
    for (int e = threadIdx.x; e < ROWS * PER_ROW; e += 128) {
        const int row = e / PER_ROW, col = (e % PER_ROW) * 4;
        float4 value = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r0 + row < len) value = *reinterpret_cast<const float4*>(src + (r0 + row) * D + col);
        *reinterpret_cast<float4*>(tile + row * LD + col) = value;
    }
}

// acc[i][j] = row (ty * R + i) of a times row (tx + 16 j) of b, both
// staged (., LD): R rows by 2 columns of a score block.
template <int D, int R>
__device__ __forceinline__ void scores(float (&acc)[R][2], const float* a, const float* b,
                                       int tx, int ty) {
    constexpr int LD = Simt<D>::LD;
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = 0.f;
#pragma unroll 4
    for (int d = 0; d < D; d += 4) {
        const float4 b0 = *reinterpret_cast<const float4*>(b + tx * LD + d);
        const float4 b1 = *reinterpret_cast<const float4*>(b + (tx + 16) * LD + d);
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const float4 x = *reinterpret_cast<const float4*>(a + (ty * R + i) * LD + d);
            acc[i][0] += x.x * b0.x + x.y * b0.y + x.z * b0.z + x.w * b0.w;
            acc[i][1] += x.x * b1.x + x.y * b1.y + x.z * b1.z + x.w * b1.w;
        }
    }
}

// x = DV adjacent floats at p (16-byte or 8-byte aligned: DV 4 or 2), one load
template <int DV>
__device__ __forceinline__ void load_cols(float (&x)[DV], const float* p) {
    if constexpr (DV == 4) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    } else {
        static_assert(DV == 2, "head sizes 32 and 64");
        const float2 v = *reinterpret_cast<const float2*>(p);
        x[0] = v.x, x[1] = v.y;
    }
}

// DV adjacent floats x to p, one store
template <int DV>
__device__ __forceinline__ void store_cols(float* p, const float (&x)[DV], float factor) {
    if constexpr (DV == 4) {
        *reinterpret_cast<float4*>(p) =
            make_float4(x[0] * factor, x[1] * factor, x[2] * factor, x[3] * factor);
    } else {
        *reinterpret_cast<float2*>(p) = make_float2(x[0] * factor, x[1] * factor);
    }
}

// acc[i][c] += sum over k < KEYS of p[ty * R + i][k] * b[k][tx * DV + c]:
// p (., PLD) and b (KEYS, LD) staged.
template <int D, int R>
__device__ __forceinline__ void add_times(float (&acc)[R][Simt<D>::DV], const float* p,
                                          const float* b, int tx, int ty) {
    constexpr int LD = Simt<D>::LD, PLD = Simt<D>::PLD, DV = Simt<D>::DV;
#pragma unroll 2
    for (int k = 0; k < KEYS; k += 4) {
        float bv[4][DV];
#pragma unroll
        for (int u = 0; u < 4; ++u) load_cols<DV>(bv[u], b + (k + u) * LD + tx * DV);
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const float4 x = *reinterpret_cast<const float4*>(p + (ty * R + i) * PLD + k);
#pragma unroll
            for (int c = 0; c < DV; ++c)
                acc[i][c] += x.x * bv[0][c] + x.y * bv[1][c] + x.z * bv[2][c] + x.w * bv[3][c];
        }
    }
}

// the sum, or the maximum, of a value over the 16 lanes of a half warp
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
    for (int m = 1; m < 16; m <<= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
}
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
    for (int m = 1; m < 16; m <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, m));
    return x;
}

template <int D>
__device__ void forward(const float* __restrict__ q, const float* __restrict__ k,
                        const float* __restrict__ v, float* __restrict__ out,
                        float* __restrict__ lse, long long t, long long s, int causal,
                        float scale) {
    constexpr int LD = Simt<D>::LD, PLD = Simt<D>::PLD, DV = Simt<D>::DV, R = FWD_ROWS / 8;
    __shared__ __align__(16) float qs[FWD_ROWS * LD];
    __shared__ __align__(16) float ks[KEYS * LD];
    __shared__ __align__(16) float vs[KEYS * LD];
    __shared__ __align__(16) float ps[FWD_ROWS * PLD];
    const long long tiles = (t + FWD_ROWS - 1) / FWD_ROWS;
    const long long head = blockIdx.x / tiles, q0 = (blockIdx.x % tiles) * FWD_ROWS;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const float* kh = k + head * s * D;
    const float* vh = v + head * s * D;

    stage<D, FWD_ROWS>(qs, q + head * t * D, q0, t);
    float m[R], l[R], o[R][DV];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.f;
#pragma unroll
        for (int c = 0; c < DV; ++c) o[i][c] = 0.f;
    }
    const long long end = causal ? min(s, q0 + FWD_ROWS) : s;
    for (long long j0 = 0; j0 < end; j0 += KEYS) {
        __syncthreads();   // every thread is done with ks, vs and ps
        stage<D, KEYS>(ks, kh, j0, s);
        stage<D, KEYS>(vs, vh, j0, s);
        __syncthreads();
        float z[R][2];
        scores<D, R>(z, qs, ks, tx, ty);
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const long long qi = q0 + ty * R + i;
            float top = -INFINITY;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const long long kj = j0 + tx + 16 * j;
                const bool seen = kj < s && (!causal || kj <= qi);
                z[i][j] = seen ? z[i][j] * scale : -INFINITY;
                top = fmaxf(top, z[i][j]);
            }
            const float mn = fmaxf(m[i], row_max(top));
            // no key seen yet (mn = -inf): nothing to rescale, nothing to add
            const float alpha = mn == -INFINITY ? 1.f : expf(m[i] - mn);
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const float p = mn == -INFINITY ? 0.f : expf(z[i][j] - mn);
                sum += p;
                ps[(ty * R + i) * PLD + tx + 16 * j] = p;
            }
            l[i] = l[i] * alpha + row_sum(sum);
            m[i] = mn;
#pragma unroll
            for (int c = 0; c < DV; ++c) o[i][c] *= alpha;
        }
        __syncthreads();   // ps whole
        add_times<D, R>(o, ps, vs, tx, ty);
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const long long qi = q0 + ty * R + i;
        if (qi >= t) continue;
        store_cols<DV>(out + (head * t + qi) * D + tx * DV, o[i], l[i] > 0.f ? 1.f / l[i] : 0.f);
        if (tx == 0) lse[head * t + qi] = m[i] + logf(l[i]);
    }
}

template <int D>
__device__ void backward_q(const float* __restrict__ q, const float* __restrict__ k,
                           const float* __restrict__ v, const float* __restrict__ out,
                           const float* __restrict__ lse, const float* __restrict__ dout,
                           float* __restrict__ dq, float* __restrict__ stats, long long n,
                           long long t, long long s, int causal, float scale) {
    constexpr int LD = Simt<D>::LD, PLD = Simt<D>::PLD, DV = Simt<D>::DV, R = BWD_ROWS / 8;
    __shared__ __align__(16) float qs[BWD_ROWS * LD];
    __shared__ __align__(16) float gs[BWD_ROWS * LD];   // dout's rows
    __shared__ __align__(16) float ks[KEYS * LD];
    __shared__ __align__(16) float vs[KEYS * LD];
    __shared__ __align__(16) float dss[BWD_ROWS * PLD];
    const long long tiles = (t + BWD_ROWS - 1) / BWD_ROWS;
    const long long head = blockIdx.x / tiles, q0 = (blockIdx.x % tiles) * BWD_ROWS;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const float* kh = k + head * s * D;
    const float* vh = v + head * s * D;

    stage<D, BWD_ROWS>(qs, q + head * t * D, q0, t);
    stage<D, BWD_ROWS>(gs, dout + head * t * D, q0, t);
    // d = sum(dout * out) over each row; the row's lse
    float d[R], row_lse[R], acc[R][DV];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const long long qi = q0 + ty * R + i;
        float part = 0.f;
        if (qi < t) {
            float o[DV], g[DV];
            load_cols<DV>(o, out + (head * t + qi) * D + tx * DV);
            load_cols<DV>(g, dout + (head * t + qi) * D + tx * DV);
#pragma unroll
            for (int c = 0; c < DV; ++c) part += o[c] * g[c];
        }
        d[i] = row_sum(part);
        row_lse[i] = qi < t ? lse[head * t + qi] : 0.f;
#pragma unroll
        for (int c = 0; c < DV; ++c) acc[i][c] = 0.f;
    }
    const long long end = causal ? min(s, q0 + BWD_ROWS) : s;
    for (long long j0 = 0; j0 < end; j0 += KEYS) {
        __syncthreads();
        stage<D, KEYS>(ks, kh, j0, s);
        stage<D, KEYS>(vs, vh, j0, s);
        __syncthreads();
        float z[R][2], dp[R][2];
        scores<D, R>(z, qs, ks, tx, ty);
        scores<D, R>(dp, gs, vs, tx, ty);   // dp = dout v^T
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const long long qi = q0 + ty * R + i;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const long long kj = j0 + tx + 16 * j;
                const bool seen = qi < t && kj < s && (!causal || kj <= qi);
                const float p = seen ? expf(z[i][j] * scale - row_lse[i]) : 0.f;
                dss[(ty * R + i) * PLD + tx + 16 * j] = p * (dp[i][j] - d[i]) * scale;
            }
        }
        __syncthreads();   // dss whole
        add_times<D, R>(acc, dss, ks, tx, ty);   // dq += ds k
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const long long qi = q0 + ty * R + i;
        if (qi >= t) continue;
        store_cols<DV>(dq + (head * t + qi) * D + tx * DV, acc[i], 1.f);
        if (tx == 0) {
            stats[head * t + qi] = row_lse[i];
            stats[n * t + head * t + qi] = d[i];
        }
    }
}

template <int D>
__device__ void backward_kv(const float* __restrict__ q, const float* __restrict__ k,
                            const float* __restrict__ v, const float* __restrict__ dout,
                            const float* __restrict__ stats, float* __restrict__ dk,
                            float* __restrict__ dv, long long n, long long t, long long s,
                            int causal, float scale) {
    constexpr int LD = Simt<D>::LD, PLD = Simt<D>::PLD, DV = Simt<D>::DV, R = BWD_ROWS / 8;
    __shared__ __align__(16) float ks[BWD_ROWS * LD];   // this block's keys
    __shared__ __align__(16) float vs[BWD_ROWS * LD];
    __shared__ __align__(16) float qs[KEYS * LD];       // a step's queries
    __shared__ __align__(16) float gs[KEYS * LD];       // and their dout rows
    __shared__ __align__(16) float ps[BWD_ROWS * PLD];  // p^T: keys x queries
    __shared__ __align__(16) float dss[BWD_ROWS * PLD];
    __shared__ float lses[KEYS], ds_[KEYS];
    const long long tiles = (s + BWD_ROWS - 1) / BWD_ROWS;
    const long long head = blockIdx.x / tiles, k0 = (blockIdx.x % tiles) * BWD_ROWS;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const float* qh = q + head * t * D;
    const float* gh = dout + head * t * D;

    stage<D, BWD_ROWS>(ks, k + head * s * D, k0, s);
    stage<D, BWD_ROWS>(vs, v + head * s * D, k0, s);
    float dka[R][DV], dva[R][DV];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int c = 0; c < DV; ++c) dka[i][c] = dva[i][c] = 0.f;
    // causal: query i sees key j only where j <= i, so the steps start at
    // the step holding query k0
    for (long long i0 = causal ? k0 - k0 % KEYS : 0; i0 < t; i0 += KEYS) {
        __syncthreads();
        stage<D, KEYS>(qs, qh, i0, t);
        stage<D, KEYS>(gs, gh, i0, t);
        if (threadIdx.x < KEYS) {
            const long long qi = i0 + threadIdx.x;
            lses[threadIdx.x] = qi < t ? stats[head * t + qi] : 0.f;
            ds_[threadIdx.x] = qi < t ? stats[n * t + head * t + qi] : 0.f;
        }
        __syncthreads();
        float z[R][2], dp[R][2];
        scores<D, R>(z, ks, qs, tx, ty);    // scores^T: keys x queries
        scores<D, R>(dp, vs, gs, tx, ty);   // dp^T = v dout^T
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const long long kj = k0 + ty * R + i;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int col = tx + 16 * j;
                const long long qi = i0 + col;
                const bool seen = qi < t && kj < s && (!causal || kj <= qi);
                const float p = seen ? expf(z[i][j] * scale - lses[col]) : 0.f;
                ps[(ty * R + i) * PLD + col] = p;
                dss[(ty * R + i) * PLD + col] = p * (dp[i][j] - ds_[col]) * scale;
            }
        }
        __syncthreads();   // ps and dss whole
        add_times<D, R>(dva, ps, gs, tx, ty);    // dv += p^T dout
        add_times<D, R>(dka, dss, qs, tx, ty);   // dk += ds^T q
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const long long kj = k0 + ty * R + i;
        if (kj >= s) continue;
        store_cols<DV>(dk + (head * s + kj) * D + tx * DV, dka[i], 1.f);
        store_cols<DV>(dv + (head * s + kj) * D + tx * DV, dva[i], 1.f);
    }
}

}  // namespace simt

template <typename T, int D>
__device__ void forward(const T* __restrict__ q, const T* __restrict__ k,
                        const T* __restrict__ v, T* __restrict__ out, T* __restrict__ lse,
                        long long t, long long s, int causal, float scale) {
    if constexpr (std::is_same_v<T, float>) {
        simt::forward<D>(q, k, v, out, lse, t, s, causal, scale);
        return;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (is_half_v<T>) {
        constexpr int LD = Dims<D>::LD;
        __shared__ __align__(32) T ks[TILE * LD];
        __shared__ __align__(32) T vs[TILE * LD];
        __shared__ __align__(32) float sf[WARPS * 16 * SLD];
        __shared__ __align__(32) T ps[WARPS * 16 * PLD];
        const long long tiles = (t + TILE - 1) / TILE;
        const long long head = blockIdx.x / tiles, q0 = (blockIdx.x % tiles) * TILE;
        const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
        const long long qi = q0 + w * 16 + r;
        const T* kh = k + head * s * D;
        const T* vh = v + head * s * D;
        float* sw = sf + w * 16 * SLD;
        T* pw = ps + w * 16 * PLD;

        load_tile<T, D>(ks, q + head * t * D, q0, t);   // the queries, staged in ks
        __syncthreads();
        FragA<T> qa[D / 16];
        load_rows<T, D>(qa, ks, w);

        float m = -INFINITY, l = 0.0f, o[D / 2];
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
        const long long end = causal ? min(s, q0 + TILE) : s;
        for (long long j0 = 0; j0 < end; j0 += TILE) {
            __syncthreads();   // every warp is done with ks and vs
            load_tile<T, D>(ks, kh, j0, s);
            load_tile<T, D>(vs, vh, j0, s);
            __syncthreads();
            times_rows_t<T, D>(sw, qa, ks);
            __syncwarp();
            float z[TILE / 2], top = -INFINITY;
#pragma unroll
            for (int i = 0; i < TILE / 2; ++i) {
                const long long kj = j0 + 2 * i + half;
                const bool seen = kj < s && (!causal || kj <= qi);
                z[i] = seen ? sw[r * SLD + 2 * i + half] * scale : -INFINITY;
                top = fmaxf(top, z[i]);
            }
            top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
            const float mn = fmaxf(m, top);
            // no key seen yet (mn = -inf): nothing to rescale, nothing to add
            const float alpha = mn == -INFINITY ? 1.0f : __expf(m - mn);
            float sum = 0.0f;
#pragma unroll
            for (int i = 0; i < TILE / 2; ++i) {
                const float p = mn == -INFINITY ? 0.0f : __expf(z[i] - mn);
                sum += p;
                pw[r * PLD + 2 * i + half] = st<T>(p);
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            l = l * alpha + sum;
            m = mn;
#pragma unroll
            for (int i = 0; i < D / 2; ++i) o[i] *= alpha;
            __syncwarp();
            Acc pv[D / 16];
#pragma unroll
            for (int c = 0; c < D / 16; ++c) wmma::fill_fragment(pv[c], 0.0f);
            add_times_rows<T, D>(pv, pw, vs);
#pragma unroll
            for (int c = 0; c < D / 16; ++c)
                wmma::store_matrix_sync(sw + c * 16, pv[c], SLD, wmma::mem_row_major);
            __syncwarp();
#pragma unroll
            for (int i = 0; i < D / 2; ++i) o[i] += sw[r * SLD + 2 * i + half];
            __syncwarp();
        }
        if (qi < t) {
            const float inv = 1.0f / l;
            T* row = out + (head * t + qi) * D + half;
#pragma unroll
            for (int i = 0; i < D / 2; ++i) row[2 * i] = st<T>(o[i] * inv);
            if (half == 0) lse[head * t + qi] = st<T>(m + logf(l));
        }
        return;
    }
#endif
    __trap();
}

template <typename T, int D>
__device__ void backward_q(const T* __restrict__ q, const T* __restrict__ k,
                           const T* __restrict__ v, const T* __restrict__ out,
                           const T* __restrict__ lse, const T* __restrict__ dout,
                           T* __restrict__ dq, float* __restrict__ stats, long long n,
                           long long t, long long s, int causal, float scale) {
    if constexpr (std::is_same_v<T, float>) {
        simt::backward_q<D>(q, k, v, out, lse, dout, dq, stats, n, t, s, causal, scale);
        return;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (is_half_v<T>) {
        constexpr int LD = Dims<D>::LD;
        __shared__ __align__(32) T ks[TILE * LD];
        __shared__ __align__(32) T vs[TILE * LD];
        __shared__ __align__(32) float sf[WARPS * 16 * SLD];
        __shared__ __align__(32) T ps[WARPS * 16 * PLD];
        const long long tiles = (t + TILE - 1) / TILE;
        const long long head = blockIdx.x / tiles, q0 = (blockIdx.x % tiles) * TILE;
        const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
        const long long qi = q0 + w * 16 + r;
        const bool valid = qi < t;
        const T* kh = k + head * s * D;
        const T* vh = v + head * s * D;
        float* sw = sf + w * 16 * SLD;
        T* pw = ps + w * 16 * PLD;

        load_tile<T, D>(ks, q + head * t * D, q0, t);
        load_tile<T, D>(vs, dout + head * t * D, q0, t);
        __syncthreads();
        FragA<T> qa[D / 16], da[D / 16];
        load_rows<T, D>(qa, ks, w);
        load_rows<T, D>(da, vs, w);

        // d = sum(dout * out) over the row, two lanes a row
        float d = 0.0f, row_lse = 0.0f;
        if (valid) {
            const T* o = out + (head * t + qi) * D + half;
            const T* g = dout + (head * t + qi) * D + half;
#pragma unroll
            for (int i = 0; i < D / 2; ++i) d += ld(o[2 * i]) * ld(g[2 * i]);
            row_lse = ld(lse[head * t + qi]);
        }
        d += __shfl_xor_sync(0xffffffffu, d, 1);
        const long long end = causal ? min(s, q0 + TILE) : s;

        // lse comes rounded to T, so p' = exp(z - lse) is the row's softmax
        // times one constant c = sum(p') per row: one pass accumulates
        // c * dq and c, and dq and the float lse (lse + log c) follow.
        float total = 0.0f;
        Acc acc[D / 16];
#pragma unroll
        for (int c = 0; c < D / 16; ++c) wmma::fill_fragment(acc[c], 0.0f);
        for (long long j0 = 0; j0 < end; j0 += TILE) {
            __syncthreads();
            load_tile<T, D>(ks, kh, j0, s);
            load_tile<T, D>(vs, vh, j0, s);
            __syncthreads();
            times_rows_t<T, D>(sw, qa, ks);
            __syncwarp();
            float p[TILE / 2];
#pragma unroll
            for (int i = 0; i < TILE / 2; ++i) {
                const long long kj = j0 + 2 * i + half;
                const bool seen = valid && kj < s && (!causal || kj <= qi);
                p[i] = seen ? __expf(sw[r * SLD + 2 * i + half] * scale - row_lse)
                            : 0.0f;
                total += p[i];
            }
            __syncwarp();
            times_rows_t<T, D>(sw, da, vs);   // dp = dout v^T
            __syncwarp();
#pragma unroll
            for (int i = 0; i < TILE / 2; ++i) {
                const float dp = sw[r * SLD + 2 * i + half];
                pw[r * PLD + 2 * i + half] = st<T>(p[i] * (dp - d) * scale);
            }
            __syncwarp();
            add_times_rows<T, D>(acc, pw, ks);   // c dq += c ds k
            __syncwarp();
        }
        total += __shfl_xor_sync(0xffffffffu, total, 1);
        if (valid && half == 0) {
            stats[head * t + qi] = row_lse + logf(total);
            stats[n * t + head * t + qi] = d;
        }
        store_rows<T, D>(sw, acc, dq + (head * t + qi) * D + half, valid, r, half,
                         total > 0.0f ? 1.0f / total : 0.0f);
        return;
    }
#endif
    __trap();
}

template <typename T, int D>
__device__ void backward_kv(const T* __restrict__ q, const T* __restrict__ k,
                            const T* __restrict__ v, const T* __restrict__ dout,
                            const float* __restrict__ stats, T* __restrict__ dk,
                            T* __restrict__ dv, long long n, long long t, long long s,
                            int causal, float scale) {
    if constexpr (std::is_same_v<T, float>) {
        simt::backward_kv<D>(q, k, v, dout, stats, dk, dv, n, t, s, causal, scale);
        return;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (is_half_v<T>) {
        constexpr int LD = Dims<D>::LD;
        __shared__ __align__(32) T qs[TILE * LD];
        __shared__ __align__(32) T gs[TILE * LD];   // dout's rows
        __shared__ __align__(32) float sf[WARPS * 16 * SLD];
        __shared__ __align__(32) T ps[WARPS * 16 * PLD];
        __shared__ float lses[TILE], ds_[TILE];
        const long long tiles = (s + TILE - 1) / TILE;
        const long long head = blockIdx.x / tiles, k0 = (blockIdx.x % tiles) * TILE;
        const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
        const long long kj = k0 + w * 16 + r;
        const T* qh = q + head * t * D;
        const T* gh = dout + head * t * D;
        float* sw = sf + w * 16 * SLD;
        T* pw = ps + w * 16 * PLD;

        load_tile<T, D>(qs, k + head * s * D, k0, s);
        load_tile<T, D>(gs, v + head * s * D, k0, s);
        __syncthreads();
        FragA<T> ka[D / 16], va[D / 16];
        load_rows<T, D>(ka, qs, w);
        load_rows<T, D>(va, gs, w);
        Acc dka[D / 16], dva[D / 16];
#pragma unroll
        for (int c = 0; c < D / 16; ++c) {
            wmma::fill_fragment(dka[c], 0.0f);
            wmma::fill_fragment(dva[c], 0.0f);
        }
        // causal: query i sees key j only where j <= i
        for (long long i0 = causal ? k0 - k0 % TILE : 0; i0 < t; i0 += TILE) {
            __syncthreads();
            load_tile<T, D>(qs, qh, i0, t);
            load_tile<T, D>(gs, gh, i0, t);
            if (threadIdx.x < TILE) {
                const long long qi = i0 + threadIdx.x;
                lses[threadIdx.x] = qi < t ? stats[head * t + qi] : 0.0f;
                ds_[threadIdx.x] = qi < t ? stats[n * t + head * t + qi] : 0.0f;
            }
            __syncthreads();
            times_rows_t<T, D>(sw, ka, qs);   // scores^T: keys x queries
            __syncwarp();
#pragma unroll
            for (int i = 0; i < TILE / 2; ++i) {
                const int col = 2 * i + half;
                const long long qi = i0 + col;
                const bool seen = qi < t && kj < s && (!causal || kj <= qi);
                pw[r * PLD + col] =
                    st<T>(seen ? __expf(sw[r * SLD + col] * scale - lses[col]) : 0.0f);
            }
            __syncwarp();
            add_times_rows<T, D>(dva, pw, gs);   // dv += p^T dout
            __syncwarp();
            times_rows_t<T, D>(sw, va, gs);      // dp^T = v dout^T
            __syncwarp();
#pragma unroll
            for (int i = 0; i < TILE / 2; ++i) {
                const int col = 2 * i + half;
                // p as dv's product took it, rounded to T: each lane
                // reads back what it wrote, so no other lane races it
                const float p = ld(pw[r * PLD + col]);
                pw[r * PLD + col] = st<T>(p * (sw[r * SLD + col] - ds_[col]) * scale);
            }
            __syncwarp();
            add_times_rows<T, D>(dka, pw, qs);   // dk += ds^T q
            __syncwarp();
        }
        const bool valid = kj < s;
        store_rows<T, D>(sw, dka, dk + (head * s + kj) * D + half, valid, r, half);
        store_rows<T, D>(sw, dva, dv + (head * s + kj) * D + half, valid, r, half);
        return;
    }
#endif
    __trap();
}

}  // namespace attn
}  // namespace sh

// SH_EXPORT with these kernels' one block size, 128 threads, and three
// blocks a multiprocessor (at most 168 registers a thread): the bound of
// 1024 threads spilled a kilobyte a thread of fragments and rows, and
// attn_bwd_kv took 255 registers, two blocks a multiprocessor (nvcc 13,
// sm_90).
#define SH_EXPORT_128(name, params, ...)                                                      \
    namespace sh_f32 { extern "C" __global__ void __launch_bounds__(128, 3) name##_f32 params {  \
        __VA_ARGS__; } }                                                                      \
    namespace sh_f64 { extern "C" __global__ void __launch_bounds__(128, 3) name##_f64 params {  \
        __VA_ARGS__; } }                                                                      \
    namespace sh_bf16 { extern "C" __global__ void __launch_bounds__(128, 3) name##_bf16 params { \
        __VA_ARGS__; } }                                                                      \
    namespace sh_f16 { extern "C" __global__ void __launch_bounds__(128, 3) name##_f16 params {  \
        __VA_ARGS__; } }

// head size D: 32 or 64 (the host's choice; attention.py)
#define SH_ATTN(D)                                                                            \
    SH_EXPORT_128(attn_fwd_d##D, (const T* q, const T* k, const T* v, T* out, T* lse, long long n, \
                              long long t, long long s, int causal, C scale),             \
              sh::attn::forward<T, D>(q, k, v, out, lse, t, s, causal, scale))                \
    SH_EXPORT_128(attn_bwd_q_d##D,                                                                \
              (const T* q, const T* k, const T* v, const T* out, const T* lse, const T* dout, \
               T* dq, float* stats, long long n, long long t, long long s, int causal,        \
               C scale),                                                                      \
              sh::attn::backward_q<T, D>(q, k, v, out, lse, dout, dq, stats, n, t, s, causal, \
                                         scale))                                              \
    SH_EXPORT_128(attn_bwd_kv_d##D,                                                               \
              (const T* q, const T* k, const T* v, const T* dout, const float* stats, T* dk,  \
               T* dv, long long n, long long t, long long s, int causal, C scale),        \
              sh::attn::backward_kv<T, D>(q, k, v, dout, stats, dk, dv, n, t, s, causal,      \
                                          scale))
SH_ATTN(32)
SH_ATTN(64)
