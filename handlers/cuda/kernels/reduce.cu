// Sums over one axis, for sum_t.
//
// The host views the input as (outer, n, inner) and the output as
// (outer, inner): n is the length of the reduced axis, inner the product of the
// axes after it.  No transposed copy is made; two kernels cover every case:
//
//   sum_rows  inner == 1: each reduced segment is contiguous.  One warp per
//             (row, chunk) task, 16-byte loads.
//   sum_cols  inner > 1: each thread owns V adjacent columns and walks down
//             the rows of its chunk, so a warp reads whole rows coalesced.
//   sum_mid   sum_t over a leading and a trailing run of axes at once (the
//             conv bias gradient, (0, 2, 3) of NCHW): the input is viewed as
//             (A, M, I) and out[m] sums x[:, m, :].  One block per (m, chunk
//             of A) task reads its rows' contiguous I elements.
//
// Long axes are split into `chunks`; partial sums go to a per-stream workspace
// and both kernels finish in the same launch: the last warp of each row
// (sum_rows) or the last block of each column tile (sum_cols) to finish adds
// the partials up, told by a per-stream counter that it resets to 0.
// Summation order depends only on the shape, never on timing: results are
// bit-for-bit reproducible on every stream.
//
// Half formats (bf16, f16): every sum accumulates in float (C =
// compute_t<T>), the workspace partials are float too, and the result is
// rounded once, as it is stored.
//
// Launch: 1-D grid of SH_BLOCK-thread blocks (sum_mid: SH_MID_BLOCK, see
// reductions.plan_mid); any grid size is correct.
#include "common.cuh"

namespace sh {

// Eight float partials of a half tile (sum_cols_vec's second stage): the
// 32 bytes that match a 16-byte packet of 8 halves, as two 16-byte loads.
struct Float8 { float4 lo, hi; };

}  // namespace sh

namespace {

using sh::compute_t;
using sh::kVec;
using sh::ld;
using sh::st;
using sh::VecTraits;

// The V-wide load type of sum_cols: the scalar for V == 1, else the packet
// (16 bytes; the float partials of a half tile: 32 bytes).
template <typename T, int V> struct Load { using type = typename VecTraits<T>::type; };
template <typename T> struct Load<T, 1> { using type = T; };
template <> struct Load<float, 8> { using type = sh::Float8; };

// Loads in flight per thread in sum_cols; the host rounds chunks to match
// (SUM_UNROLL in handlers/cuda/launch.py, SH_SUM_UNROLL of
// launch_constants.cuh).  16 beat 8 and 12 on an H200 (median of five
// interleaved runs: 8192x4096 axis 0 93.0% of copy against 86.3% with 8,
// 1Mx16 axis 0 72.6% against 69.2%, (64,128,32,32) axis 1 70.8% against
// 69.6%).
constexpr int UNROLL = SH_SUM_UNROLL;

__device__ __forceinline__ float hsum(float4 v) { return (v.x + v.y) + (v.z + v.w); }
__device__ __forceinline__ double hsum(double2 v) { return v.x + v.y; }

// Value j of `raw`, a load of several S (a scalar, a packet, a Float8), in
// the compute format.
template <typename S, typename R>
__device__ __forceinline__ compute_t<S> elem(const R& raw, int j) {
    return ld(reinterpret_cast<const S*>(&raw)[j]);
}

// The sum of one 16-byte packet of T, in the compute format.  (v by value:
// a reference changes the float and double kernels' PTX.)
template <typename T, typename VT>
__device__ __forceinline__ compute_t<T> packet_sum(VT v) {
    if constexpr (sh::is_half_v<T>) {
        const sh::Packet<T> e = sh::widen_packet<T>(v);
        return ((e.v[0] + e.v[1]) + (e.v[2] + e.v[3])) + ((e.v[4] + e.v[5]) + (e.v[6] + e.v[7]));
    } else {
        return hsum(v);
    }
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

// One warp per (row, chunk) task.  With chunks > 1, lane 0 writes the task's
// partial sum to ws[task] and bumps the row's counter; the warp that finishes
// a row's last chunk adds the row's partials up in chunk order and resets the
// counter for the next launch on this stream.
// O, the output's format: T, or the compute format (a "wide" sum, whose
// result a later pass or a scaling reads before the one rounding to T).
template <typename T, typename O>
__device__ void sum_rows_impl(const T* __restrict__ a, compute_t<T>* __restrict__ ws,
                              O* __restrict__ out, unsigned int* __restrict__ counters,
                              long long rows, long long n, long long chunk,
                              long long chunks) {
    using C = compute_t<T>;
    using VT = typename VecTraits<T>::type;
    constexpr int V = kVec<T>;
    const int lane = threadIdx.x & 31;
    const long long nwarps = (long long)gridDim.x * (blockDim.x >> 5);
    const long long tasks = rows * chunks;
    for (long long task = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
         task < tasks; task += nwarps) {
        const long long row = task / chunks;
        const long long begin = (task - row * chunks) * chunk;
        const long long len = begin < n ? min(chunk, n - begin) : 0;
        const T* p = a + row * n + begin;
        C acc = 0;
        // Peel the first elements until p is 16-byte aligned.
        const int mis = (int)(((uintptr_t)p % 16) / sizeof(T));
        const long long head = min((long long)(mis ? V - mis : 0), len);
        if (lane < head) acc += ld(p[lane]);
        const VT* q = reinterpret_cast<const VT*>(p + head);
        const long long nv = (len - head) / V;
        // Four independent 16-byte loads in flight per lane, the last trip
        // predicated: a short row then costs one round trip to memory, not
        // one per remaining packet.
        const VT zero{};
        for (long long i = lane; i < nv; i += 128) {
            const VT v0 = q[i];
            const VT v1 = i + 32 < nv ? q[i + 32] : zero;
            const VT v2 = i + 64 < nv ? q[i + 64] : zero;
            const VT v3 = i + 96 < nv ? q[i + 96] : zero;
            acc += (packet_sum<T>(v0) + packet_sum<T>(v1)) +
                   (packet_sum<T>(v2) + packet_sum<T>(v3));
        }
        for (long long k = head + nv * V + lane; k < len; k += 32) acc += ld(p[k]);
        acc = warp_sum(acc);
        if (chunks == 1) {
            if (lane == 0) out[row] = st<O>(acc);
            continue;
        }
        unsigned int done = 0;
        if (lane == 0) {
            ws[task] = acc;
            __threadfence();   // the partial reaches L2 before the count does
            done = atomicAdd(counters + row, 1u);
        }
        done = __shfl_sync(0xffffffffu, done, 0);
        if (done != (unsigned int)(chunks - 1)) continue;
        if (lane == 0) counters[row] = 0u;
        __threadfence();       // order the other warps' partials before our reads
        const C* part = ws + row * chunks;
        C s = 0;
        for (long long k = lane; k < chunks; k += 32) s += __ldcg(part + k);   // L2: other SMs wrote them
        s = warp_sum(s);
        if (lane == 0) out[row] = st<O>(s);
    }
}

template <bool CG, typename VT>
__device__ __forceinline__ VT load(const VT* p) {
    if constexpr (CG) return __ldcg(p);   // L2 only: written by other blocks
    else return *p;
}

// Eight float partials (32 bytes, 16-byte aligned) as two 16-byte loads.
template <bool CG>
__device__ __forceinline__ sh::Float8 load(const sh::Float8* p) {
    const float4* q = reinterpret_cast<const float4*>(p);
    return {load<CG>(q), load<CG>(q + 1)};
}

// Sums rows [r_begin, r_end) of one tile of columns [col0, col0 + tx * V) of
// the (rows, inner) slab at src into dst[c] (c < inner), in a fixed order.
// blockDim.x == SH_BLOCK == tx * ty; thread (x, y) sums V adjacent columns over
// rows y, y + ty, ...; the ty partial sums are then added in y order.  The
// caller synchronizes before `part` is used again.  S is the format of src
// (the input T, or the compute format of the partials), D that of dst (T,
// or the partials'); the sums are in the compute format C and rounded to D
// as they are stored.
template <typename S, typename D, int V, bool CG>
__device__ void tile_sum(const S* __restrict__ src, D* __restrict__ dst, long long inner,
                         long long col0, long long r_begin, long long r_end, int tx,
                         compute_t<S>* part) {
    using C = compute_t<S>;
    using VT = typename Load<S, V>::type;
    // Loads in flight per thread: UNROLL, but UNROLL / 4 for the 32-byte
    // loads of a half tile's float partials (the second stage; more spill
    // registers next to the eight float sums).
    constexpr int U = sizeof(VT) > 16 ? (UNROLL + 3) / 4 : UNROLL;
    const int ty = blockDim.x / tx;
    const int x = threadIdx.x % tx, y = threadIdx.x / tx;
    const int tile_cols = tx * V;
    const long long col = col0 + (long long)x * V;
    C acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0;
    if (col < inner) {
        const S* base = src + col;
        long long r = r_begin + y;
        // U independent loads in flight per thread: the loop is bound by
        // memory latency, not arithmetic (the host picks chunks that are
        // multiples of UNROLL * ty, so the tail loop rarely runs).
        for (; r + (U - 1) * ty < r_end; r += U * ty) {
            VT v[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                v[u] = load<CG>(reinterpret_cast<const VT*>(base + (r + u * ty) * inner));
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int j = 0; j < V; ++j) acc[j] += elem<S>(v[u], j);
            }
        }
        for (; r < r_end; r += ty) {
            const VT v0 = load<CG>(reinterpret_cast<const VT*>(base + r * inner));
#pragma unroll
            for (int j = 0; j < V; ++j) acc[j] += elem<S>(v0, j);
        }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) part[y * tile_cols + x * V + j] = acc[j];
    __syncthreads();
    if (threadIdx.x < tile_cols) {
        const long long c = col0 + threadIdx.x;
        C s = 0;
        for (int k = 0; k < ty; ++k) s += part[k * tile_cols + threadIdx.x];
        if (c < inner) dst[c] = st<D>(s);
    }
}

// One launch whatever the chunking.  With chunks > 1, each (outer, tile,
// chunk) task writes its partial sums to ws, laid out (outer, chunks, inner),
// and bumps the tile's counter; the block that finishes a tile's last chunk
// adds the tile's partials up in chunk order and resets the counter to 0 for
// the next launch on this stream.  The order never depends on which block
// comes last, so results stay bit-for-bit reproducible.
// ws holds compute_t<T> values (float for the half formats); O is the
// output's format (sum_rows_impl says which).
template <typename T, int V, typename O>
__device__ void sum_cols_impl(const T* __restrict__ a, compute_t<T>* __restrict__ ws,
                              O* __restrict__ out, unsigned int* __restrict__ counters,
                              long long outer, long long n, long long inner,
                              long long chunk, long long chunks, int tx) {
    using C = compute_t<T>;
    __shared__ C part[SH_BLOCK * V];
    __shared__ bool last;
    const long long tile_cols = (long long)tx * V;
    const long long tiles = (inner + tile_cols - 1) / tile_cols;
    const long long tasks = outer * tiles * chunks;
    for (long long task = blockIdx.x; task < tasks; task += gridDim.x) {
        const long long o = task / (tiles * chunks);
        const long long rem = task - o * tiles * chunks;
        const long long tile = rem / chunks, ch = rem - (rem / chunks) * chunks;
        const long long col0 = tile * tile_cols;
        if (chunks == 1) {
            tile_sum<T, O, V, false>(a + o * n * inner, out + o * inner, inner, col0, 0, n,
                                     tx, part);
            __syncthreads();
            continue;
        }
        tile_sum<T, C, V, false>(a + o * n * inner, ws + (o * chunks + ch) * inner, inner,
                                 col0, ch * chunk, min(n, (ch + 1) * chunk), tx, part);
        __threadfence();   // this block's partials reach L2 before the count does
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned int* count = counters + o * tiles + tile;
            last = atomicAdd(count, 1u) == (unsigned int)(chunks - 1);
            if (last) *count = 0u;
        }
        __syncthreads();
        if (last) {
            tile_sum<C, O, V, true>(ws + o * chunks * inner, out + o * inner, inner, col0, 0,
                                    chunks, tx, part);
        }
        __syncthreads();
    }
}

// sum_mid: x viewed as (A, M, I); out[m] = sum over a < A, i < I of x[a, m, i].
// Task t = m * chunks + c sums rows a in [c * chunk, (c + 1) * chunk) of
// column m: len * I elements in len contiguous runs of I at a stride of M * I.
// The block's threads stride over the task's V-wide packets (32-bit indices:
// the host keeps len * I / V below 2^31), UNROLL packets (below) in
// flight each; the block's partial sums are added in thread order.  With
// chunks > 1 the last block of a column adds its chunks' partials in chunk
// order, so the result depends only on the shape and the block size (as in
// sum_rows).  Any block size that is a multiple of 32, up to 1024, is
// correct; the host launches SH_MID_BLOCK (reductions.plan_mid says why).
// ws holds compute_t<T> values; O is the output's format (sum_rows_impl).
template <typename T, int V, typename O>
__device__ void sum_mid_impl(const T* __restrict__ a, compute_t<T>* __restrict__ ws,
                             O* __restrict__ out, unsigned int* __restrict__ counters,
                             long long A, long long M, long long I, long long chunk,
                             long long chunks) {
    using C = compute_t<T>;
    using VT = typename Load<T, V>::type;
    // Loads in flight per thread: 16 elements (16 / V packets), and for the
    // halves 8 packets (64 elements).  On an H200, bfloat16 (64, 128, 32, 32)
    // over (0, 2, 3) took 4.50 us a call in a graph with 8, 4.59 with 4 and
    // 4.83 with 2; float32 took 10.8 us with 4 and 12.8 with 8 (November 2026).
    constexpr int UNROLL = V == 8 ? 8 : 16 / V;
    __shared__ C warps[32];
    __shared__ bool last;
    const unsigned int nvi = (unsigned int)(I / V);     // packets per run
    const unsigned int threads = blockDim.x;
    const long long tasks = M * chunks;
    for (long long task = blockIdx.x; task < tasks; task += gridDim.x) {
        const long long m = task / chunks, c = task - m * chunks;
        const long long a0 = c * chunk;
        const long long len = a0 < A ? min(chunk, A - a0) : 0;
        const unsigned int total = (unsigned int)(len * nvi);
        const T* base = a + (a0 * M + m) * I;
        const long long stride = M * I;                  // elements between runs
        C acc = 0;
        unsigned int j = threadIdx.x;
        for (; j + (UNROLL - 1) * threads < total; j += UNROLL * threads) {
            VT v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const unsigned int k = j + u * threads;
                const unsigned int r = k / nvi;
                v[u] = *reinterpret_cast<const VT*>(base + r * stride + (long long)(k - r * nvi) * V);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
                for (int q = 0; q < V; ++q) acc += elem<T>(v[u], q);
            }
        }
        for (; j < total; j += threads) {
            const unsigned int r = j / nvi;
            const VT v0 = *reinterpret_cast<const VT*>(base + r * stride + (long long)(j - r * nvi) * V);
#pragma unroll
            for (int q = 0; q < V; ++q) acc += elem<T>(v0, q);
        }
        acc = warp_sum(acc);
        if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = acc;
        __syncthreads();
        C s = 0;
        if (threadIdx.x < 32) {   // one warp adds the warps' sums
            s = warp_sum(threadIdx.x < (threads >> 5) ? warps[threadIdx.x] : C(0));
        }
        if (threadIdx.x == 0) {
            if (chunks == 1) {
                out[m] = st<O>(s);
            } else {
                ws[task] = s;
                __threadfence();   // the partial reaches L2 before the count does
                last = atomicAdd(counters + m, 1u) == (unsigned int)(chunks - 1);
            }
        }
        __syncthreads();
        // The block that finished column m's last chunk adds its partials up.
        // One warp loads them all at once (one thread adding them in a loop
        // waits a memory round trip per chunk, at the very end of the call,
        // when nothing else hides it).  The order depends only on `chunks`.
        if (chunks > 1 && last && threadIdx.x < 32) {
            __threadfence();
            C t = 0;
            for (long long k = threadIdx.x; k < chunks; k += 32) t += __ldcg(ws + m * chunks + k);
            t = warp_sum(t);
            if (threadIdx.x == 0) {
                out[m] = st<O>(t);
                counters[m] = 0u;   // ready for the next launch on this stream
            }
        }
        __syncthreads();   // warps[] is reused by the next task
    }
}

}  // namespace

// The exported kernels: ws, the workspace of partial sums, holds compute_t<T>
// (float for the half formats: the host sizes it with 4-byte elements).
// The half formats' vec kernels read 16-byte packets of 8 halves.  Each
// kernel also exists as a "wide" one, NAME_wide_SUF, whose output is in the
// compute format (for the halves: a sum that a later pass or mean_t's
// scaling reads before the one rounding; the same kernel for float and
// double).
#define SH_EXPORT_ROWS(T, O, NAME)                                                   \
    extern "C" __global__ void __launch_bounds__(SH_BLOCK)                           \
    NAME(const T* a, sh::compute_t<T>* ws, O* out, unsigned int* counters,           \
         long long rows, long long n, long long chunk, long long chunks) {           \
        sum_rows_impl<T, O>(a, ws, out, counters, rows, n, chunk, chunks);           \
    }
#define SH_EXPORT_COLS(T, V, O, NAME)                                                \
    extern "C" __global__ void __launch_bounds__(SH_BLOCK)                           \
    NAME(const T* a, sh::compute_t<T>* ws, O* out, unsigned int* counters,           \
         long long outer, long long n, long long inner, long long chunk,             \
         long long chunks, int tx) {                                                 \
        sum_cols_impl<T, V, O>(a, ws, out, counters, outer, n, inner, chunk, chunks, tx); \
    }
#define SH_EXPORT_MID(T, V, O, NAME)                                                 \
    extern "C" __global__ void __launch_bounds__(SH_MID_BLOCK)                       \
    NAME(const T* a, sh::compute_t<T>* ws, O* out, unsigned int* counters,           \
         long long A, long long M, long long I, long long chunk, long long chunks) { \
        sum_mid_impl<T, V, O>(a, ws, out, counters, A, M, I, chunk, chunks);         \
    }
// Every sum kernel of format T (suffix SUF, packets of V elements), plain and wide.
#define SH_EXPORT_SUMS(T, V, SUF)                                                    \
    SH_EXPORT_ROWS(T, T, sum_rows_##SUF)                                             \
    SH_EXPORT_ROWS(T, sh::compute_t<T>, sum_rows_wide_##SUF)                         \
    SH_EXPORT_COLS(T, 1, T, sum_cols_##SUF)                                          \
    SH_EXPORT_COLS(T, 1, sh::compute_t<T>, sum_cols_wide_##SUF)                      \
    SH_EXPORT_COLS(T, V, T, sum_cols_vec_##SUF)                                      \
    SH_EXPORT_COLS(T, V, sh::compute_t<T>, sum_cols_vec_wide_##SUF)                  \
    SH_EXPORT_MID(T, 1, T, sum_mid_##SUF)                                            \
    SH_EXPORT_MID(T, 1, sh::compute_t<T>, sum_mid_wide_##SUF)                        \
    SH_EXPORT_MID(T, V, T, sum_mid_vec_##SUF)                                        \
    SH_EXPORT_MID(T, V, sh::compute_t<T>, sum_mid_vec_wide_##SUF)

SH_EXPORT_SUMS(float, 4, f32)
SH_EXPORT_SUMS(double, 2, f64)
SH_EXPORT_SUMS(__nv_bfloat16, 8, bf16)
SH_EXPORT_SUMS(__half, 8, f16)
