// The reduction engine: sum_t, mean_t, max_t, min_t and argmax_t.
//
// The host (handlers/cuda/reductions.py) drops size-1 axes, merges adjacent
// reduced and adjacent kept axes, and so sees one of three layouts, or a
// general one:
//
//   rows  (rows, n): each reduced segment is contiguous (inner == 1).
//         *_thread n <= THREAD_ROW (launch.py): a thread per row, the loads of
//                  THREAD_UNROLL rows in flight;
//         *_lanes  n <= SHORT_ROW (launch.py): a group of as few lanes as hold
//                  the row (at most 2 elements a lane), LANE_UNROLL rows in
//                  flight, shuffles within the group;
//         *_short  small (n, inner) slabs of cols, n > THREAD_ROW: a block
//                  copies a tile of whole slabs to shared memory with
//                  coalesced loads, then a few lanes reduce each output
//                  (*_stride takes those of n <= THREAD_ROW: *_thread's
//                  thread an output, its elements inner apart; *_walk
//                  the same for n <= WALK_MOST and inner <= WALK_COLS,
//                  in trips; *_slab
//                  slabs of inner <= 32 columns and SLAB_LEAST elements or
//                  more: a warp reads a slab as one run, a lane a column);
//         *_rows   a warp per (row, chunk), 16-byte loads, 4 in flight;
//         *_long   a block per (row, chunk): few long rows (a 1-D array to a
//                  scalar is one row) split into enough chunks to fill the GPU.
//   cols  (outer, n, inner), inner > 1: thread (x, y) of a tx * ty block
//         owns V columns (*_cols_vec: a 16-byte packet of adjacent ones;
//         *_cols: scalars tx apart, where rows are not 16-byte aligned) and
//         walks down rows y, y + ty, ... with several loads in flight
//         (predicated, so short axes keep them in flight too); the ty
//         partials are then combined in a tree down y.
//   mid   (A, M, I) summed over A and I (the conv bias gradient, (0, 2, 3)
//         of NCHW): a block per (m, chunk of the A * I elements).
//   gen   sum_gen*: reduced and kept runs interleaved beyond these (up to 4
//         of each), the cols kernel with general offsets: a column is an
//         output element, a row a flat index of the reduced runs, which a
//         thread walks by digits (GenIx).
//   one   *_one: nothing to reduce (every reduced axis of extent 1): each
//         output is its input (argmax: 0), a grid-stride copy or fill.
//
// One combine is a template parameter of every kernel:
//   Sum<T>      compute-format sums (float for the halves), scaled by 1 / div
//               as they are stored: mean_t is the same launch with div = n;
//   Max<T>, Min<T>  (Extreme) max_t and min_t: the value alone, one
//               compute-format number a state as a sum's.  NaN wins, as in
//               NumPy: a slice holding NaN gives NaN; otherwise the largest
//               (smallest) element bit for bit (of equal ones such as -0.0
//               and +0.0, one the shape decides);
//   Pick<T, I>  argmax (kind 2; 0 and 1 are max and min, which run Extreme):
//               (value, index) pairs, the value widened to the compute
//               format, the index an int (Pick32, the "pick" kernels) where
//               the reduced extent allows, else a long long (Pick64,
//               "pick64").  NaN wins: argmax gives the index of the first
//               NaN; among equal values the first index wins.  A packet's
//               first best element is found by a tree of independent
//               compares and meets the state once, as a max's packet does.
//               argmax stores st<T>(index): the host checks beforehand that
//               every index is exact in T.
//
// Long axes are split into `chunks`; the partial states go to a per-stream
// workspace and the launch finishes them itself: the last group of a row
// (rows) or the last block of a column tile (cols, mid) to finish combines
// the partials in chunk order, told by a per-stream counter that it resets
// to 0 for the next launch.  The combining order depends only on the shape,
// never on timing, so results are bit-for-bit reproducible on every stream.
//
// Launch: 1-D grid of SH_BLOCK-thread blocks (mid: SH_MID_BLOCK); any grid
// size is correct.
#include "common.cuh"

namespace {

using sh::compute_t;
using sh::kVec;
using sh::ld;
using sh::st;
using sh::VecTraits;

// Loads in flight per thread in the column kernels (SUM_UNROLL and
// PICK_UNROLL in handlers/cuda/launch.py): the host sizes chunks by them.
// An argmax keeps a (value, index) pair per column (two registers with a
// 32-bit index); max and min keep one value, as a sum, and take SUM_UNROLL.
constexpr int SUM_UNROLL = SH_SUM_UNROLL;
constexpr int PICK_UNROLL = SH_PICK_UNROLL;
// Loads in flight per thread in the row kernels.
constexpr int ROW_UNROLL = 4;
// Columns a thread of *_cols reads (scalar_cols in reductions.py): a packet's
// elements, at most SCALAR_COLS (more spill registers), so that a thread of
// 4-byte or 2-byte elements keeps several times the bytes of one column in
// flight; double keeps one column, whose SUM_UNROLL loads of 8 bytes
// already hold as many bytes as a packet trip (two columns held fewer loads
// in flight in 64 registers).
constexpr int SCALAR_COLS = 4;
template <typename T>
constexpr int kScalarCols = kVec<T> <= 2 ? 1 : kVec<T> < SCALAR_COLS ? kVec<T> : SCALAR_COLS;
// Resident blocks per multiprocessor that *_cols_vec is bound to: a packet
// of halves is 8 columns, 8 states (an argmax's (value, index) pairs, or a
// sum's, max's or min's floats) beside 16 packets in flight, which spill at
// 64 registers (4 blocks: 24 bytes for a sum, nvcc 13, sm_90) and fit in 80
// (3 blocks, still 12K loads of 16 bytes in flight per multiprocessor).
template <typename T>
constexpr int kVecColsBlocks = kVec<T> == 8 ? 3 : 4;
// Rows a trip in the general kernels (GEN_UNROLL in reductions.py): each
// load's offset comes from the walk's digits and is held until the load
// issues; 7 is the most that fit the 64 registers of 4 resident blocks
// without spilling (8 packets of float spill).
constexpr int GEN_UNROLL = 7;
// Elements of a *_short tile: 8 loads in flight per thread.
constexpr int SHORT_TILE = SH_BLOCK * 8;

__device__ __forceinline__ float hsum(float4 v) { return (v.x + v.y) + (v.z + v.w); }
__device__ __forceinline__ double hsum(double2 v) { return v.x + v.y; }

// The sum of one 16-byte packet of T, in the compute format.
template <typename T, typename VT>
__device__ __forceinline__ compute_t<T> packet_sum(VT v) {
    if constexpr (sh::is_half_v<T>) {
        const sh::Packet<T> e = sh::widen_packet<T>(v);
        return ((e.v[0] + e.v[1]) + (e.v[2] + e.v[3])) + ((e.v[4] + e.v[5]) + (e.v[6] + e.v[7]));
    } else {
        return hsum(v);
    }
}

// ---------------------------------------------------------------- combines
// S: the state; identity: the state of nothing; add: absorb element v at
// index i; join(a, b): a's elements come before b's; result<O>: the stored
// output.

template <typename T>
struct Sum {
    using C = compute_t<T>;
    using S = C;
    __device__ static S identity(int) { return C(0); }
    __device__ static void add(S& s, T v, long long, int) { s += ld(v); }
    template <typename VT>
    __device__ static void add_packet(S& s, VT v, long long, int) { s += packet_sum<T>(v); }
    __device__ static S join(S a, S b, int) { return a + b; }
    __device__ static S down(S s, int o, int width) {
        return __shfl_down_sync(0xffffffffu, s, o, width);
    }
    __device__ static S load_l2(const S* p) { return __ldcg(p); }
    template <typename O>
    __device__ static O result(S s, long long div, int) {
        return st<O>(div == 1 ? s : s / (C)div);
    }
};

// The values of one 16-byte packet of T, in the compute format.
template <typename T, typename VT>
__device__ __forceinline__ sh::Packet<T> packet_values(VT v) {
    if constexpr (sh::is_half_v<T>) {
        return sh::widen_packet<T>(v);
    } else {
        sh::Packet<T> e;
        memcpy(&e, &v, sizeof(VT));
        return e;
    }
}

// argmax: (value, index) states, the value in the compute format (widened
// exactly, so compares are those of T) and the index an I: int wherever
// every index of the reduced extent fits (the host's "pick" kernels), long
// long beyond (its "pick64" fallback), so that the index arithmetic of the
// hot loops is 32-bit and a state is 8 bytes for float and the halves (16
// for double), half the registers, shuffles and workspace of a 64-bit one.
// NaN wins: argmax gives the index of the first NaN; among equal values
// (-0.0 and +0.0 too) the first index wins.
template <typename T, typename I>
struct Pick {
    using C = compute_t<T>;
    struct alignas(sizeof(C) + sizeof(I) <= 8 ? 8 : 16) S { C v; I i; };
    // No element yet: index -1, which every element beats.
    __device__ static S identity(int) { return {C(0), I(-1)}; }
    // Does x, later than w, replace it?  A NaN replaces a number; a number
    // replaces a smaller one; equals and anything after a NaN keep the
    // earlier (every comparison with NaN is false).
    __device__ static bool beats(C x, C w) { return x > w || (x != x && w == w); }
    // Is a a better pick than b, in either order (join's lanes and chunks)?
    __device__ static bool better(const S& a, const S& b) {
        if (a.i < 0) return false;
        if (b.i < 0) return true;
        const bool vn = a.v != a.v, wn = b.v != b.v;
        if (vn || wn) return vn && (!wn || a.i < b.i);
        if (a.v == b.v) return a.i < b.i;
        return a.v > b.v;
    }
    // Absorb element v at index i, later than every index s has seen (each
    // thread walks its elements in order): no index compare on the hot path.
    __device__ static void add(S& s, T v, long long i, int) {
        const C x = ld(v);
        if (s.i < 0 || beats(x, s.v)) s = S{x, (I)i};
    }
    // A packet of elements i0, i0 + 1, ...: its first best element by a tree
    // of adjacent pairs (the left one holds the earlier indices and keeps
    // ties, so the winner is the packet's first occurrence; independent
    // compares, the offsets constants until selected), then one compare
    // with the state: the same pick as adding the elements one by one.
    template <typename VT>
    __device__ static void add_packet(S& s, VT v, long long i0, int) {
        sh::Packet<T> e = packet_values<T>(v);
        constexpr int N = kVec<T>;
        int k[N];
#pragma unroll
        for (int j = 0; j < N; ++j) k[j] = j;
#pragma unroll
        for (int w = 1; w < N; w *= 2) {
#pragma unroll
            for (int j = 0; j + w < N; j += 2 * w) {
                if (beats(e.v[j + w], e.v[j])) {
                    e.v[j] = e.v[j + w];
                    k[j] = k[j + w];
                }
            }
        }
        if (s.i < 0 || beats(e.v[0], s.v)) s = S{e.v[0], (I)i0 + k[0]};
    }
    __device__ static S join(S a, S b, int) { return better(b, a) ? b : a; }
    __device__ static S down(S s, int o, int width) {
        return {__shfl_down_sync(0xffffffffu, s.v, o, width),
                __shfl_down_sync(0xffffffffu, s.i, o, width)};
    }
    __device__ static S load_l2(const S* p) {   // one load, written by another block
        S s;
        if constexpr (sizeof(S) == 16) {
            const longlong2 raw = __ldcg(reinterpret_cast<const longlong2*>(p));
            memcpy(&s, &raw, sizeof(S));
        } else {
            static_assert(sizeof(S) == 8, "a pick's state is 8 or 16 bytes");
            const long long raw = __ldcg(reinterpret_cast<const long long*>(p));
            memcpy(&s, &raw, sizeof(S));
        }
        return s;
    }
    template <typename O>
    __device__ static O result(S s, long long, int) { return st<O>((compute_t<O>)s.i); }
};
template <typename T> using Pick32 = Pick<T, int>;
template <typename T> using Pick64 = Pick<T, long long>;

// max_t (MAX) and min_t: the value alone, which is all they return (argmax_t
// needs Pick's index).  The state is one compute-format value (4 bytes for
// float and the halves, 8 for double): always an element widened, or the
// identity, so result() gives that element bit for bit.  NaN wins as in
// Pick: a NaN state is never replaced by a number, so a slice holding NaN
// gives one of its NaNs.  Equal values (-0.0 and +0.0) keep the state's:
// which zero comes back depends on the shape, never on timing.  A slice of
// -inf alone (max) meets the identity -inf and gives -inf.
template <typename T, bool MAX>
struct Extreme {
    using C = compute_t<T>;
    using S = C;
    __device__ static S identity(int) {
        return MAX ? -sh::dm::infinity<C>() : sh::dm::infinity<C>();
    }
    // Does x replace s?  A NaN replaces anything; nothing replaces a NaN
    // but a NaN (every comparison with NaN is false).
    __device__ static bool wins(C x, C s) { return (MAX ? x > s : x < s) || x != x; }
    __device__ static void add(S& s, T v, long long, int) {
        const C x = ld(v);
        if (wins(x, s)) s = x;
    }
    // A packet's values joined in a tree (independent compares), then into s.
    template <typename VT>
    __device__ static void add_packet(S& s, VT v, long long, int) {
        sh::Packet<T> e = packet_values<T>(v);
        constexpr int N = kVec<T>;
#pragma unroll
        for (int w = N / 2; w > 0; w /= 2) {
#pragma unroll
            for (int j = 0; j < w; ++j) e.v[j] = join(e.v[j], e.v[j + w], 0);
        }
        s = join(s, e.v[0], 0);
    }
    __device__ static S join(S a, S b, int) { return wins(b, a) ? b : a; }
    __device__ static S down(S s, int o, int width) {
        return __shfl_down_sync(0xffffffffu, s, o, width);
    }
    __device__ static S load_l2(const S* p) { return __ldcg(p); }
    template <typename O>
    __device__ static O result(S s, long long, int) { return st<O>(s); }
};
template <typename T> using Max = Extreme<T, true>;
template <typename T> using Min = Extreme<T, false>;

// The states of `width` adjacent lanes (a power of 2 up to 32) combined in
// lane order; the result is in the group's first lane.
template <class R>
__device__ __forceinline__ typename R::S group_join(typename R::S s, int kind, int width) {
    for (int o = width >> 1; o > 0; o >>= 1) s = R::join(s, R::down(s, o, width), kind);
    return s;
}

// The states of a block's threads combined in thread order; the result is
// in thread 0.  `red` holds 32 states; every thread must call this.
template <class R>
__device__ typename R::S block_join(typename R::S s, int kind, typename R::S* red) {
    s = group_join<R>(s, kind, 32);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();   // red may still be read from the previous call
    if (lane == 0) red[w] = s;
    __syncthreads();
    if (w == 0) {
        s = lane < (int)(blockDim.x >> 5) ? red[lane] : R::identity(kind);
        s = group_join<R>(s, kind, 32);
    }
    return s;
}

// Shared memory for N values of a type with constructors (the halves), which
// a __shared__ array of that type cannot hold.
template <typename S, int N>
struct SharedArray {
    __device__ static S* get() {
        __shared__ __align__(16) unsigned char raw[N * sizeof(S)];
        return reinterpret_cast<S*>(raw);
    }
};

// ---------------------------------------------------------------- rows

// *_short: small slabs.  The input is (outer, n, inner) with n * inner at
// most SHORT_TILE elements (the host sends rows, inner == 1, to *_thread and
// *_lanes):
// out[o, c] reduces x[o, :, c].  A tile of `per` whole slabs is copied to
// shared memory with coalesced scalar loads (8 in flight per thread, any
// alignment); then P lanes (a power of 2) reduce each output.  No lane idles
// on a 2-element row, and no block waits on a tile of a few bytes.
template <class R, typename T, typename O>
__device__ void short_impl(const T* __restrict__ a, O* __restrict__ out, long long outer,
                           long long n, long long inner, long long div, int kind) {
    using S = typename R::S;
    T* tile = SharedArray<T, SHORT_TILE>::get();
    const long long slab = n * inner, per = SHORT_TILE / slab, outs = per * inner;
    int P = 1;
    while (P * outs < blockDim.x && P < 32) P <<= 1;
    const long long tiles = (outer + per - 1) / per;
    const int lanes = blockDim.x / P;
    for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
        const long long r0 = t * per, nr = min(per, outer - r0), count = nr * slab;
        const T* base = a + r0 * slab;
#pragma unroll
        for (int u = 0; u < SHORT_TILE / SH_BLOCK; ++u) {
            const long long k = threadIdx.x + (long long)u * blockDim.x;
            if (k < count) tile[k] = base[k];
        }
        for (long long k = threadIdx.x + (long long)SHORT_TILE / SH_BLOCK * blockDim.x;
             k < count; k += blockDim.x) {   // blocks smaller than SH_BLOCK
            tile[k] = base[k];
        }
        __syncthreads();
        const long long nq = nr * inner;                 // this tile's outputs
        for (long long qb = 0; qb < nq; qb += lanes) {   // the same trips in every lane
            const long long q = qb + threadIdx.x / P;
            S s = R::identity(kind);
            if (q < nq) {
                const long long o = q / inner, c = q - o * inner;
                const T* col = tile + o * slab + c;
                for (long long k = threadIdx.x % P; k < n; k += P) R::add(s, col[k * inner], k, kind);
            }
            s = group_join<R>(s, kind, P);
            if (q < nq && threadIdx.x % P == 0)
                out[r0 * inner + q] = R::template result<O>(s, div, kind);
        }
        __syncthreads();
    }
}

// *_slab: small (outer, n, inner) slabs of inner <= 32 columns (n * inner at
// most SHORT_TILE elements, SLAB_LEAST at least: the host's rule), a warp per
// slab, no shared memory or barrier.  The warp reads its slab as one run:
// lane l < L (L = 32 - 32 % inner, a multiple of inner) takes elements l,
// l + L, l + 2 L, ..., all of column l % inner (a warp's load reads L
// contiguous elements, L / inner whole rows), SLAB_UNROLL of its loads in
// flight before any is added; then the L / inner lanes of each column join
// their states by shuffles, a tree in lane order, and the column's first
// lane stores it.  Where *_short copies a tile of one such slab to shared
// memory and leaves most of its lanes idle on a few outputs, every lane
// here reads.  The warps stride over the slabs.
template <typename T>
constexpr int kSlabUnroll = sizeof(T) == 2 ? 16 : 8;
template <class R, typename T, typename O>
__device__ void slab_impl(const T* __restrict__ a, O* __restrict__ out, long long outer,
                          long long n, long long inner, long long div, int kind) {
    using S = typename R::S;
    constexpr int U = kSlabUnroll<T>;
    const int c = (int)inner, size = (int)(n * inner);   // inner <= 32, size <= SHORT_TILE
    const int L = 32 - 32 % c, G = L / c;                // lanes that read; rows a load
    const int lane = threadIdx.x & 31, first = lane / c; // this lane's first row
    const bool reads = lane < L;
    int top = 1;                                         // the tree's widest step
    while (2 * top < G) top *= 2;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long o = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; o < outer;
         o += warps) {
        const T* p = a + o * size;
        S s = R::identity(kind);
        for (int t0 = 0; t0 * L < size; t0 += U) {
            T x[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int e = lane + (t0 + u) * L;
                if (reads && e < size) x[u] = p[e];
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int e = lane + (t0 + u) * L;
                if (reads && e < size) R::add(s, x[u], first + (t0 + u) * G, kind);
            }
        }
        // lane first * c + col joins lane (first + w) * c + col, for w = top,
        // top / 2, ..., 1 where that lane holds a row group: the column's
        // G states end in its first lane
        for (int w = top; w > 0; w >>= 1) {
            const S other = R::down(s, w * c, 32);
            if (first + w < G) s = R::join(s, other, kind);
        }
        if (lane < c) out[o * inner + lane] = R::template result<O>(s, div, kind);
    }
}

// *_thread: rows of n <= SH_THREAD_ROW elements, a thread per row.  Thread t
// of a trip's first row r0 reduces rows r0 + u * blockDim.x for u <
// SH_THREAD_UNROLL (one load instruction of a warp reads an element of 32
// adjacent rows: the lanes share the lines, which L1 serves), every load of
// those rows issued before any is added, and no shared memory or barrier
// stands between the loads and the sums; grid-stride over the rows.  Each
// row is added in element order.
// *_stride (STRIDED): the same over the columns of small (outer, n, inner)
// slabs, `rows` = outer * inner outputs: output r = o * inner + c reduces
// x[o, :, c], elements `inner` apart (adjacent outputs' elements are
// adjacent, so a warp's load still reads one or two runs).  A kernel of its
// own: the index arithmetic took the rows' kernel from 37-40 registers to
// 48-58 (nvcc 13, sm_90) and rows of 2 or 3 elements 11-18% slower on an
// H200 (benchmarks/results/diagnostics/short_thread).
template <class R, bool STRIDED, typename T, typename O>
__device__ void thread_impl(const T* __restrict__ a, O* __restrict__ out, long long rows,
                            long long n, long long inner, long long div, int kind) {
    using S = typename R::S;
    constexpr int U = SH_THREAD_UNROLL, N = SH_THREAD_ROW;
    const int m = (int)n;   // n <= N
    const long long step = (long long)gridDim.x * blockDim.x * U;
    for (long long r0 = (long long)blockIdx.x * blockDim.x * U + threadIdx.x; r0 < rows;
         r0 += step) {
        T x[U][N];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long r = r0 + (long long)u * blockDim.x;
            if constexpr (STRIDED) {   // column c of slab o
                const long long o = r / inner;
                const T* p = a + o * n * inner + (r - o * inner);
#pragma unroll
                for (int k = 0; k < N; ++k)
                    if (k < m && r < rows) x[u][k] = p[k * inner];
            } else {
                const T* p = a + r * n;
#pragma unroll
                for (int k = 0; k < N; ++k)
                    if (k < m && r < rows) x[u][k] = p[k];
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long r = r0 + (long long)u * blockDim.x;
            if (r < rows) {
                S s = R::identity(kind);
#pragma unroll
                for (int k = 0; k < N; ++k)
                    if (k < m) R::add(s, x[u][k], k, kind);
                out[r] = R::template result<O>(s, div, kind);
            }
        }
    }
}

// *_walk: *_stride's thread an output over small (outer, n, inner) slabs of
// any n (the host's rule sends those of n <= reductions.WALK_MOST and inner
// <= WALK_COLS), each
// thread walking its column down the slab in trips of SH_THREAD_ROW
// elements: a trip's loads of the thread's SH_THREAD_UNROLL outputs are
// issued before any is added, and each output's elements are added in
// order, so the bits are those of one at a time.  A kernel of its own:
// the trips' loop and the states it keeps took *_stride's 52-58 registers
// to 64-80 (float32, nvcc 13, sm_90), where *_stride serves n <= 8 as
// measured.
template <class R, typename T, typename O>
__device__ void walk_impl(const T* __restrict__ a, O* __restrict__ out, long long rows,
                          long long n, long long inner, long long div, int kind) {
    using S = typename R::S;
    constexpr int U = SH_THREAD_UNROLL, N = SH_THREAD_ROW;
    const long long step = (long long)gridDim.x * blockDim.x * U;
    for (long long r0 = (long long)blockIdx.x * blockDim.x * U + threadIdx.x; r0 < rows;
         r0 += step) {
        const T* p[U];
        S s[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {   // column c of slab o
            const long long r = r0 + (long long)u * blockDim.x;
            const long long o = r / inner;
            p[u] = a + o * n * inner + (r - o * inner);
            s[u] = R::identity(kind);
        }
        for (long long k0 = 0; k0 < n; k0 += N) {
            T x[U][N];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const bool live = r0 + (long long)u * blockDim.x < rows;
#pragma unroll
                for (int k = 0; k < N; ++k)
                    if (k0 + k < n && live) x[u][k] = p[u][(k0 + k) * inner];
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int k = 0; k < N; ++k)
                    if (k0 + k < n) R::add(s[u], x[u][k], (int)(k0 + k), kind);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long r = r0 + (long long)u * blockDim.x;
            if (r < rows) out[r] = R::template result<O>(s[u], div, kind);
        }
    }
}

// *_lanes: rows of SH_THREAD_ROW < n <= SH_SHORT_ROW elements, a group of G
// lanes per row (the host's reductions.lane_group(n), the plan's third
// number: the least power of 2 with 2 * G >= n, at most 32; lane l of a
// group holds elements l and l + G), 32 / G rows a warp a trip, the loads
// of SH_LANE_UNROLL trips issued before any is added (a warp's load reads
// 32 / G adjacent rows: one contiguous run); each group's states joined by
// shuffles in lane order, the result written by its first lane.  Every lane
// of a warp takes the same trips (the shuffles need the whole warp); the
// warps stride over the rows.
template <class R, typename T, typename O>
__device__ void lanes_impl(const T* __restrict__ a, O* __restrict__ out, long long rows,
                           long long n, long long group, long long div, int kind) {
    using S = typename R::S;
    constexpr int U = SH_LANE_UNROLL;
    const int m = (int)n, G = (int)group;   // n <= SH_SHORT_ROW, G <= 32
    const int lane = threadIdx.x & 31, li = lane & (G - 1);
    const long long per = 32 / G;                        // rows a warp a trip
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    const bool first = li < m, second = li + G < m;   // this lane's elements
    const long long stride = per * n;                  // a trip's rows, in elements
    for (long long base = warp * per * U; base < rows; base += warps * per * U) {
        const long long r0 = base + lane / G;
        const T* p = a + r0 * n + li;
        T x[U][2];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const bool live = r0 + u * per < rows;
            if (live && first) x[u][0] = p[u * stride];
            if (live && second) x[u][1] = p[u * stride + G];
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const bool live = r0 + u * per < rows;
            S s = R::identity(kind);
            if (live && first) R::add(s, x[u][0], li, kind);
            if (live && second) R::add(s, x[u][1], li + G, kind);
            s = group_join<R>(s, kind, G);
            if (li == 0 && live) out[r0 + u * per] = R::template result<O>(s, div, kind);
        }
    }
}

// *_rows (G == 32) and *_long (G == blockDim.x): a group of G threads per
// (row, chunk) task.  With chunks > 1, the group's first thread writes the
// task's state to ws[task] and bumps the row's counter; the group that
// finishes a row's last chunk combines the row's states in chunk order and
// resets the counter.
template <class R, bool BLOCKWIDE, typename T, typename O>
__device__ void rows_impl(const T* __restrict__ a, typename R::S* __restrict__ ws,
                          O* __restrict__ out, unsigned int* __restrict__ counters,
                          long long rows, long long n, long long chunk, long long chunks,
                          long long div, int kind) {
    using S = typename R::S;
    using VT = typename VecTraits<T>::type;
    constexpr int V = kVec<T>;
    S* red = SharedArray<S, 32>::get();
    __shared__ unsigned int done_s;
    const int G = BLOCKWIDE ? blockDim.x : 32;
    const int t = BLOCKWIDE ? threadIdx.x : (threadIdx.x & 31);
    const long long groups = BLOCKWIDE ? gridDim.x : (long long)gridDim.x * (blockDim.x >> 5);
    const long long first = BLOCKWIDE ? blockIdx.x : sh::grid_thread() >> 5;
    const long long tasks = rows * chunks;
    for (long long task = first; task < tasks; task += groups) {
        const long long row = task / chunks;
        const long long begin = (task - row * chunks) * chunk;
        const long long len = begin < n ? min(chunk, n - begin) : 0;
        const T* p = a + row * n + begin;
        S s = R::identity(kind);
        // Peel the first elements until p is 16-byte aligned.
        const int mis = (int)(((uintptr_t)p % 16) / sizeof(T));
        const long long head = min((long long)(mis ? V - mis : 0), len);
        if (t < head) R::add(s, p[t], begin + t, kind);
        const VT* q = reinterpret_cast<const VT*>(p + head);
        const long long nv = (len - head) / V;
        // ROW_UNROLL independent 16-byte loads in flight per thread, the last
        // trip predicated: a short row costs one round trip to memory.
        for (long long i = t; i < nv; i += ROW_UNROLL * G) {
            VT v[ROW_UNROLL];
#pragma unroll
            for (int u = 0; u < ROW_UNROLL; ++u)
                if (i + u * G < nv) v[u] = q[i + u * G];
#pragma unroll
            for (int u = 0; u < ROW_UNROLL; ++u)
                if (i + u * G < nv) R::add_packet(s, v[u], begin + head + (i + u * G) * V, kind);
        }
        for (long long k = head + nv * V + t; k < len; k += G) R::add(s, p[k], begin + k, kind);
        s = BLOCKWIDE ? block_join<R>(s, kind, red) : group_join<R>(s, kind, 32);
        if (chunks == 1) {
            if (t == 0) out[row] = R::template result<O>(s, div, kind);
            continue;
        }
        unsigned int done = 0;
        if (t == 0) {
            ws[task] = s;
            __threadfence();   // the partial reaches L2 before the count does
            done = atomicAdd(counters + row, 1u);
        }
        if (BLOCKWIDE) {
            if (t == 0) done_s = done;
            __syncthreads();
            done = done_s;
            __syncthreads();   // done_s is written again by the next task
        } else {
            done = __shfl_sync(0xffffffffu, done, 0);
        }
        if (done != (unsigned int)(chunks - 1)) continue;
        if (t == 0) counters[row] = 0u;
        __threadfence();       // order the other groups' partials before our reads
        S r = R::identity(kind);
        for (long long k = t; k < chunks; k += G) r = R::join(r, R::load_l2(ws + row * chunks + k), kind);
        r = BLOCKWIDE ? block_join<R>(r, kind, red) : group_join<R>(r, kind, 32);
        if (t == 0) out[row] = R::template result<O>(r, div, kind);
    }
}

// ---------------------------------------------------------------- cols

// The V-wide load type: the scalar for V == 1, else the 16-byte packet.
template <typename T, int V> struct Load { using type = typename VecTraits<T>::type; };
template <typename T> struct Load<T, 1> { using type = T; };

// Where a column kernel's elements are, in elements: slab(o) is outer o's
// first from the input's start (computed once a task, by cols_impl: inside
// tile_reduce the compiler kept a trip's loads fewer in flight), base(col)
// row 0 of column col from the slab, and offset(w, r) row r's from that,
// where a Walk w follows the rows r, r + step, r + 2 * step, ... of a thread
// (advance(w) to the next), so that the loads of one trip need no division.

// The cols layout: an (outer, n, inner) array, contiguous.  Row r is at
// r * inner: each load's address is independent of the others (a chain of
// adds would hold the trip's loads back).
struct PlainIx {
    long long n, inner;
    struct Walk {};
    __device__ bool yfast() const { return false; }
    __device__ long long slab(long long o) const { return o * n * inner; }
    __device__ long long base(long long col) const { return col; }
    __device__ Walk walk(long long, int) const { return {}; }
    __device__ long long offset(const Walk&, long long r) const { return r * inner; }
    __device__ void advance(Walk&) const {}
};

// The "passes" layouts (reductions.layout): up to 4 merged kept runs and 4
// merged reduced runs, interleaved.  A column is a flat index of the output
// (the kept runs in order) and a row a flat index of the reduced runs; the
// host passes each kind's runs innermost first, padded to 4 with extent 1
// and stride 0 (the outermost run's extent is never needed: it takes the
// quotient).  Every offset and index is below 2^31 (the host sends larger
// arrays through passes), so the digits are 32-bit.  The walk steps rows by
// the block's ty, whose digits sd (each below its run's extent), offset
// soff and carry offsets wr (wr[i] = rs[i + 1] - re[i] * rs[i]: digit i
// wraps, digit i + 1 counts one more) the host computes: advance() is adds
// and compares, one conditional subtraction a digit.  A digit beyond the
// last real run may go wrong only once the row passes n, where no load is
// made.  yfast: consecutive threads take consecutive rows (the reduced runs
// end the layout: rows are contiguous) rather than columns.
struct GenArgs {
    int yfast;
    int ke[3], ks[4];          // kept runs: extents, strides
    int re[3], rs[4];          // reduced runs: extents, strides
    int sd[3], wr[3], soff;    // the walk's step: digits, carries, offset
};

struct GenIx {
    GenArgs g;
    struct Walk { unsigned off; int d[3]; };
    __device__ bool yfast() const { return g.yfast != 0; }
    __device__ long long slab(long long) const { return 0; }   // outer is 1
    __device__ long long base(long long col) const {
        unsigned c = (unsigned)col, off = 0;
#pragma unroll
        for (int i = 0; i < 3; ++i) {
            const unsigned q = c / (unsigned)g.ke[i];
            off += (c - q * (unsigned)g.ke[i]) * (unsigned)g.ks[i];
            c = q;
        }
        return off + c * (unsigned)g.ks[3];
    }
    // The digits of row r (any step: the host's sd are for blockDim / tx).
    __device__ Walk walk(long long r, int) const {
        Walk w;
        unsigned q = (unsigned)r;
        w.off = 0;
#pragma unroll
        for (int i = 0; i < 3; ++i) {
            const unsigned p = q / (unsigned)g.re[i];
            w.d[i] = (int)(q - p * (unsigned)g.re[i]);
            w.off += (unsigned)w.d[i] * (unsigned)g.rs[i];
            q = p;
        }
        w.off += q * (unsigned)g.rs[3];
        return w;
    }
    __device__ long long offset(const Walk& w, long long) const { return w.off; }
    __device__ void advance(Walk& w) const {
        w.off += (unsigned)g.soff;
        int c = 0;
#pragma unroll
        for (int i = 0; i < 3; ++i) {
            w.d[i] += g.sd[i] + c;
            c = w.d[i] >= g.re[i];
            if (c) {
                w.d[i] -= g.re[i];
                w.off += (unsigned)g.wr[i];
            }
        }
    }
};

// Reduces rows [r_begin, r_end) of one tile of columns [col0, col0 + tx * V)
// of the slab src.  Thread (x, y) of the tx * ty block covers V columns over rows
// y, y + ty, ...: V adjacent ones read as one 16-byte packet (VEC), or V
// columns tx apart read as scalars (every load of a warp is then 32
// consecutive elements, and a thread keeps V times the bytes of one column
// in flight).  The ty states of each column are then combined (a tree down
// to 8 rows, then in turn), and part[cc] holds column col0 + cc's state for
// the columns cc = threadIdx.x, threadIdx.x + blockDim.x, ... below tx * V
// (a thread reads only its own: no barrier needed before it does).
// STAGE2: the rows are the workspace's states (the chunks' partials of a
// column, laid out (outer, chunks, inner)), read from L2.
template <class R, class Ix, typename T, int V, bool VEC, int U, bool STAGE2>
__device__ void tile_reduce(const T* __restrict__ src, const typename R::S* __restrict__ states,
                            const Ix& ix, long long inner, long long col0, long long r_begin,
                            long long r_end, int tx, typename R::S* part, int kind) {
    using S = typename R::S;
    using VT = typename VecTraits<T>::type;
    const int ty = blockDim.x / tx;
    const bool yf = !VEC && ix.yfast();   // packets: the kept runs end the layout
    const int x = yf ? threadIdx.x / ty : threadIdx.x % tx;
    const int y = yf ? threadIdx.x % ty : threadIdx.x / tx;
    const int tile_cols = tx * V;
    const int cstep = VEC ? 1 : tx;   // between the thread's columns
    const long long col = col0 + (VEC ? (long long)x * V : x);
    S acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = R::identity(kind);
    if (col < inner) {   // VEC: inner % V == 0, so the whole packet is in
        if constexpr (!STAGE2) {
            // Column j's offset from the first; columns past inner (the
            // scalar path's last tile) read the last column instead: their
            // states are never stored, and no load needs a column predicate
            // (with one a row, they outnumber the predicate registers and
            // the loads trickle out one by one).
            int cj[V];
#pragma unroll
            for (int j = 0; j < V; ++j)
                cj[j] = VEC ? j : (int)min((long long)j * cstep, inner - 1 - col);
            const T* base = src + ix.base(col);
            long long r = r_begin + y;
            typename Ix::Walk w = ix.walk(r, ty);
            // Whole trips of U rows in flight (the host sizes chunks in
            // them), then predicated trips of UT rows for the rest: a short
            // axis keeps several loads in flight too.  Each row is one
            // packet (VEC) or V scalars.
            for (; r + (U - 1) * ty < r_end; r += (long long)U * ty) {
                if constexpr (VEC) {
                    VT v[U];
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        v[u] = *reinterpret_cast<const VT*>(base + ix.offset(w, r + u * ty));
                        ix.advance(w);
                    }
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        const T* e = reinterpret_cast<const T*>(&v[u]);
#pragma unroll
                        for (int j = 0; j < V; ++j) R::add(acc[j], e[j], r + u * ty, kind);
                    }
                } else {
                    T v[U][V];
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        const T* p = base + ix.offset(w, r + u * ty);
#pragma unroll
                        for (int j = 0; j < V; ++j) v[u][j] = p[cj[j]];
                        ix.advance(w);
                    }
#pragma unroll
                    for (int u = 0; u < U; ++u) {
#pragma unroll
                        for (int j = 0; j < V; ++j) R::add(acc[j], v[u][j], r + u * ty, kind);
                    }
                }
            }
            // The rest: ceil(U / 4) rows a trip, or with V scalar columns
            // all U rows of a trip, which are few (UNROLL / V): then one
            // round trip reads an axis of U rows, as one column's did.
            constexpr int UT = VEC || V == 1 ? (U + 3) / 4 : U;
            for (; r < r_end; r += (long long)UT * ty) {
                if constexpr (VEC) {
                    VT v[UT];
#pragma unroll
                    for (int u = 0; u < UT; ++u) {
                        if (r + u * ty < r_end)
                            v[u] = *reinterpret_cast<const VT*>(base + ix.offset(w, r + u * ty));
                        ix.advance(w);
                    }
#pragma unroll
                    for (int u = 0; u < UT; ++u) {
                        if (r + u * ty < r_end) {
                            const T* e = reinterpret_cast<const T*>(&v[u]);
#pragma unroll
                            for (int j = 0; j < V; ++j) R::add(acc[j], e[j], r + u * ty, kind);
                        }
                    }
                } else {
                    T v[UT][V];
#pragma unroll
                    for (int u = 0; u < UT; ++u) {
                        const T* p = base + ix.offset(w, r + u * ty);
                        if (r + u * ty < r_end) {
#pragma unroll
                            for (int j = 0; j < V; ++j) v[u][j] = p[cj[j]];
                        }
                        ix.advance(w);
                    }
#pragma unroll
                    for (int u = 0; u < UT; ++u) {
                        if (r + u * ty < r_end) {
#pragma unroll
                            for (int j = 0; j < V; ++j) R::add(acc[j], v[u][j], r + u * ty, kind);
                        }
                    }
                }
            }
        } else {
            const S* base = states + col;
#pragma unroll 4
            for (long long r = r_begin + y; r < r_end; r += ty) {
#pragma unroll
                for (int j = 0; j < V; ++j)
                    if (col + (long long)j * cstep < inner)
                        acc[j] = R::join(acc[j], R::load_l2(base + r * inner + j * cstep), kind);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < V; ++j)
        part[y * tile_cols + (VEC ? x * V + j : x + j * tx)] = acc[j];
    __syncthreads();
    // The ty states of each column halved in a tree, row k joined with row
    // k + h, down to 8 rows, which one thread a column then joins in turn:
    // a column's combine is at most log2(ty / 8) + 7 joins deep, where
    // joining all ty in turn was ty deep (an argmax's join is a dozen
    // dependent instructions: 255 of them outlasted the reads of (1173013,
    // 4) over axis 0), and a shallow tile pays no barrier for it (ty = 8:
    // three barriers cost 4-6% on (887, 1806) over axis 0).  The order is
    // fixed by ty alone.
    int rows = ty;
    while (rows > 8) {
        const int h = (rows + 1) / 2;
        for (int i = threadIdx.x; i < (rows - h) * tile_cols; i += blockDim.x)
            part[i] = R::join(part[i], part[i + h * tile_cols], kind);
        __syncthreads();
        rows = h;
    }
    for (int cc = threadIdx.x; cc < tile_cols; cc += blockDim.x) {
        S s = part[cc];
        for (int k = 1; k < rows; ++k) s = R::join(s, part[k * tile_cols + cc], kind);
        part[cc] = s;   // row 0 of column cc: only this thread reads or writes it now
    }
}

// One launch whatever the chunking.  With chunks > 1, each (outer, tile,
// chunk) task writes its states to ws, laid out (outer, chunks, inner), and
// bumps the tile's counter; the block that finishes a tile's last chunk
// combines the tile's states in chunk order and resets the counter.
template <class R, class Ix, typename T, int V, bool VEC, int U, typename O>
__device__ void cols_impl(const T* __restrict__ a, typename R::S* __restrict__ ws,
                          O* __restrict__ out, unsigned int* __restrict__ counters, const Ix& ix,
                          long long outer, long long n, long long inner, long long chunk,
                          long long chunks, long long div, int tx, int kind) {
    using S = typename R::S;
    S* part = SharedArray<S, SH_BLOCK * V>::get();
    __shared__ bool last;
    const long long tile_cols = (long long)tx * V;
    const long long tiles = (inner + tile_cols - 1) / tile_cols;
    const long long tasks = outer * tiles * chunks;
    for (long long task = blockIdx.x; task < tasks; task += gridDim.x) {
        const long long o = task / (tiles * chunks);
        const long long rem = task - o * tiles * chunks;
        const long long tile = rem / chunks, ch = rem - tile * chunks;
        const long long col0 = tile * tile_cols;
        const long long ncols = min(tile_cols, inner - col0);   // this tile's columns
        const T* slab = a + ix.slab(o);
        if (chunks == 1) {
            tile_reduce<R, Ix, T, V, VEC, U, false>(slab, nullptr, ix, inner, col0, 0, n, tx,
                                                    part, kind);
            for (int cc = threadIdx.x; cc < ncols; cc += blockDim.x)
                out[o * inner + col0 + cc] = R::template result<O>(part[cc], div, kind);
            __syncthreads();
            continue;
        }
        tile_reduce<R, Ix, T, V, VEC, U, false>(slab, nullptr, ix, inner, col0, ch * chunk,
                                                min(n, (ch + 1) * chunk), tx, part, kind);
        for (int cc = threadIdx.x; cc < ncols; cc += blockDim.x)
            ws[(o * chunks + ch) * inner + col0 + cc] = part[cc];
        __threadfence();   // this block's partials reach L2 before the count does
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned int* count = counters + o * tiles + tile;
            last = atomicAdd(count, 1u) == (unsigned int)(chunks - 1);
            if (last) *count = 0u;
        }
        __syncthreads();
        if (last) {
            __threadfence();
            tile_reduce<R, Ix, T, V, VEC, U, true>(nullptr, ws + o * chunks * inner, ix, inner,
                                                   col0, 0, chunks, tx, part, kind);
            for (int cc = threadIdx.x; cc < ncols; cc += blockDim.x)
                out[o * inner + col0 + cc] = R::template result<O>(part[cc], div, kind);
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------- mid

// x viewed as (A, M, I); out[m] = the sum over a < A, i < I of x[a, m, i].
// Column m's A * I elements are A runs of I at a stride of M * I, flattened
// into A * (I / V) packets; task t = m * chunks + c reduces packets
// [c * chunk, (c + 1) * chunk) of that range (chunks over A and I alike, so
// few columns of few runs still fill the GPU).  The block's threads stride
// over the task's packets, MID_UNROLL in flight each (32-bit offsets: the
// host keeps chunk and I / V below 2^31); the block's partial sums are
// combined in thread order, and with chunks > 1 the last block of a column
// combines its chunks' sums in chunk order.  Any block size that is a
// multiple of 32, up to 1024, is correct; the host launches SH_MID_BLOCK.
template <typename T, int V, typename O>
__device__ void mid_impl(const T* __restrict__ a, compute_t<T>* __restrict__ ws,
                         O* __restrict__ out, unsigned int* __restrict__ counters,
                         long long A, long long M, long long I, long long chunk,
                         long long chunks, long long div) {
    using R = Sum<T>;
    using C = compute_t<T>;
    using VT = typename Load<T, V>::type;
    // Loads in flight per thread: 16 elements (16 / V packets), and for the
    // halves 8 packets (64 elements).  On an H200, bfloat16 (64, 128, 32, 32)
    // over (0, 2, 3) took 4.50 us a call in a graph with 8, 4.59 with 4 and
    // 4.83 with 2; float32 took 10.8 us with 4 and 12.8 with 8 (November 2026).
    constexpr int MID_UNROLL = V == 8 ? 8 : 16 / V;
    C* red = SharedArray<C, 32>::get();
    __shared__ bool last;
    const unsigned int nvi = (unsigned int)(I / V);     // packets per run
    const long long total = A * (long long)nvi;
    const unsigned int threads = blockDim.x;
    const long long stride = M * I;                     // elements between runs
    const long long tasks = M * chunks;
    for (long long task = blockIdx.x; task < tasks; task += gridDim.x) {
        const long long m = task / chunks, c = task - m * chunks;
        const long long k0 = c * chunk;
        const unsigned int len = (unsigned int)(k0 < total ? min(chunk, total - k0) : 0);
        const long long r0 = k0 / nvi;
        const unsigned int off0 = (unsigned int)(k0 - r0 * nvi);   // < nvi < 2^31
        const T* base = a + r0 * stride + m * I;
        C acc = 0;
        const auto add = [&](const VT& v) {   // a scalar or a 16-byte packet
            if constexpr (V == 1) acc += ld(v);
            else acc += packet_sum<T>(v);
        };
        unsigned int j = threadIdx.x;
        for (; j + (MID_UNROLL - 1) * threads < len; j += MID_UNROLL * threads) {
            VT v[MID_UNROLL];
#pragma unroll
            for (int u = 0; u < MID_UNROLL; ++u) {
                const unsigned int k = off0 + j + u * threads;   // < 2^32
                const unsigned int r = k / nvi;
                v[u] = *reinterpret_cast<const VT*>(base + r * stride + (long long)(k - r * nvi) * V);
            }
#pragma unroll
            for (int u = 0; u < MID_UNROLL; ++u) add(v[u]);
        }
        for (; j < len; j += threads) {
            const unsigned int k = off0 + j, r = k / nvi;
            add(*reinterpret_cast<const VT*>(base + r * stride + (long long)(k - r * nvi) * V));
        }
        const C s = block_join<R>(acc, 0, red);
        if (threadIdx.x == 0) {
            if (chunks == 1) {
                out[m] = R::template result<O>(s, div, 0);
            } else {
                ws[task] = s;
                __threadfence();   // the partial reaches L2 before the count does
                last = atomicAdd(counters + m, 1u) == (unsigned int)(chunks - 1);
            }
        }
        __syncthreads();
        // The block that finished column m's last chunk combines its sums.
        // One warp loads them all at once (one thread adding them in a loop
        // waits a memory round trip per chunk, at the very end of the call,
        // when nothing else hides it).  The order depends only on `chunks`.
        if (chunks > 1 && last && threadIdx.x < 32) {
            __threadfence();
            C t = 0;
            for (long long k = threadIdx.x; k < chunks; k += 32) t += __ldcg(ws + m * chunks + k);
            t = group_join<R>(t, 0, 32);
            if (threadIdx.x == 0) {
                out[m] = R::template result<O>(t, div, 0);
                counters[m] = 0u;   // ready for the next launch on this stream
            }
        }
        __syncthreads();   // `last` is written again by the next task
    }
}

// ---------------------------------------------------------------- one element

// *_one: a reduction with nothing to reduce (every reduced axis of extent 1;
// the host's layout is then rows of one element), each output from its one
// input, as NumPy gives it: max and min (ONE_COPY) copy the element bit for
// bit (NaN and -0.0 included); a sum (ONE_PLUS_ZERO; a mean divides by 1)
// is the element added to the sum's identity +0.0, which changes -0.0 to
// +0.0 alone (NumPy's sum of [-0.0] is 0.0, as the engine's sums of zeros
// are); argmax (ONE_ZERO) writes index 0 and reads nothing.  No per-row
// work of a reduction kernel: *_short with rows of one element ran 3.5x
// slower than torch's copy.  Grid-stride over 16-byte packets where input
// and output both start on 16 bytes (loads batched 4 a trip, as the
// elementwise kernels do), over elements elsewhere.
enum OneMode { ONE_COPY, ONE_PLUS_ZERO, ONE_ZERO };

__device__ __forceinline__ float add_rn(float x, float y) { return __fadd_rn(x, y); }
__device__ __forceinline__ double add_rn(double x, double y) { return __dadd_rn(x, y); }

// x + 0 in the compute format, rounded back (exact: x is a T): the explicit
// round-to-nearest add is never contracted or dropped as an identity.
template <typename T>
__device__ __forceinline__ T plus_zero(T x) { return st<T>(add_rn(ld(x), compute_t<T>(0))); }

template <OneMode MODE, typename T>
__device__ void one_impl(const T* __restrict__ a, T* __restrict__ out, long long n) {
    using VT = typename VecTraits<T>::type;
    constexpr int V = kVec<T>;
    const bool vec = sh::is_aligned16(out) && (MODE == ONE_ZERO || sh::is_aligned16(a));
    const long long packets = vec ? n / V : 0;
    const long long start = sh::grid_thread(), stride = sh::grid_stride();
    if constexpr (MODE == ONE_ZERO) {
        for (long long i = start; i < packets; i += stride) reinterpret_cast<VT*>(out)[i] = VT{};
        for (long long i = packets * V + start; i < n; i += stride) out[i] = st<T>(0);
    } else {
        const VT* src = reinterpret_cast<const VT*>(a);
        VT* dst = reinterpret_cast<VT*>(out);
        sh::NoCounter c;
        sh::batched_loop<4>(
            0, packets, c, [&](long long i, sh::NoCounter&) { return src[i]; },
            [&](long long i, VT v) {
                if constexpr (MODE == ONE_PLUS_ZERO) {
                    T e[V];
                    memcpy(e, &v, sizeof(VT));
#pragma unroll
                    for (int j = 0; j < V; ++j) e[j] = plus_zero(e[j]);
                    memcpy(&v, e, sizeof(VT));
                }
                dst[i] = v;
            });
        for (long long i = packets * V + start; i < n; i += stride)
            out[i] = MODE == ONE_PLUS_ZERO ? plus_zero(a[i]) : a[i];
    }
}

}  // namespace

// The exported kernels.  Each takes (a, ws, out, counters, ...); the row
// kernels' third number is the chunk, but *_short's, *_slab's and
// *_stride's are `inner`; ws, the workspace of partial states, holds
// compute_t<T> (sums, max, min) or (value, index) pairs (argmax's picks:
// Pick::S, 8 or 16 bytes).  Every sum kernel but
// sum_gen* also exists as a "wide" one, NAME_wide_SUF, whose output is in
// the compute format (for the halves: a sum that a later pass or mean_t's
// scaling reads before the one rounding).
#define SH_EXPORT_ROWS(R, T, O, NAME, BOUNDS, BODY)                                  \
    extern "C" __global__ void __launch_bounds__(BOUNDS)                             \
    NAME(const T* a, void* ws, O* out, unsigned int* counters, long long rows,       \
         long long n, long long chunk, long long chunks, long long div, int kind) {  \
        BODY;                                                                        \
    }
#define SH_EXPORT_ROW_KINDS(R, T, O, PRE, SUF)                                       \
    SH_EXPORT_ROWS(R, T, O, PRE##_thread##SUF, SH_BLOCK,                             \
                   (thread_impl<R, false, T, O>(a, out, rows, n, 1, div, kind)))     \
    SH_EXPORT_ROWS(R, T, O, PRE##_stride##SUF, SH_BLOCK,                             \
                   (thread_impl<R, true, T, O>(a, out, rows, n, chunk, div, kind)))  \
    SH_EXPORT_ROWS(R, T, O, PRE##_walk##SUF, SH_BLOCK,                               \
                   (walk_impl<R, T, O>(a, out, rows, n, chunk, div, kind)))          \
    SH_EXPORT_ROWS(R, T, O, PRE##_lanes##SUF, SH_BLOCK,                              \
                   (lanes_impl<R, T, O>(a, out, rows, n, chunk, div, kind)))                \
    SH_EXPORT_ROWS(R, T, O, PRE##_short##SUF, SH_BLOCK,                              \
                   (short_impl<R, T, O>(a, out, rows, n, chunk, div, kind)))                  \
    SH_EXPORT_ROWS(R, T, O, PRE##_slab##SUF, SH_BLOCK,                               \
                   (slab_impl<R, T, O>(a, out, rows, n, chunk, div, kind)))                   \
    SH_EXPORT_ROWS(R, T, O, PRE##_rows##SUF, SH_BLOCK,                               \
                   (rows_impl<R, false, T, O>(a, static_cast<typename R::S*>(ws), out, \
                                              counters, rows, n, chunk, chunks, div, kind))) \
    SH_EXPORT_ROWS(R, T, O, PRE##_long##SUF, SH_BLOCK,                               \
                   (rows_impl<R, true, T, O>(a, static_cast<typename R::S*>(ws), out, \
                                             counters, rows, n, chunk, chunks, div, kind)))
#define SH_EXPORT_COLS(R, T, V, VEC, U, O, NAME, MIN_BLOCKS)                         \
    extern "C" __global__ void __launch_bounds__(SH_BLOCK, MIN_BLOCKS)               \
    NAME(const T* a, void* ws, O* out, unsigned int* counters, long long outer,      \
         long long n, long long inner, long long chunk, long long chunks,            \
         long long div, int tx, int kind) {                                          \
        cols_impl<R, PlainIx, T, V, VEC, U, O>(a, static_cast<typename R::S*>(ws), out, \
                                               counters, PlainIx{n, inner}, outer, n,  \
                                               inner, chunk, chunks, div, tx, kind);   \
    }
// The general kernels (GenIx): the column kernel's arguments (outer is 1,
// inner the outputs), then GenArgs's in order.
#define SH_EXPORT_GEN(R, T, V, VEC, U, O, NAME)                                      \
    extern "C" __global__ void __launch_bounds__(SH_BLOCK, 4)                        \
    NAME(const T* a, void* ws, O* out, unsigned int* counters, long long outer,      \
         long long n, long long inner, long long chunk, long long chunks,            \
         long long div, int tx, int kind, int yfast, int ke0, int ke1, int ke2,      \
         int ks0, int ks1, int ks2, int ks3, int re0, int re1, int re2, int rs0,     \
         int rs1, int rs2, int rs3, int sd0, int sd1, int sd2, int wr0, int wr1,     \
         int wr2, int soff) {                                                        \
        const GenIx ix{{yfast, {ke0, ke1, ke2}, {ks0, ks1, ks2, ks3}, {re0, re1, re2}, \
                        {rs0, rs1, rs2, rs3}, {sd0, sd1, sd2}, {wr0, wr1, wr2}, soff}}; \
        cols_impl<R, GenIx, T, V, VEC, U, O>(a, static_cast<typename R::S*>(ws), out,  \
                                             counters, ix, outer, n, inner, chunk,     \
                                             chunks, div, tx, kind);                   \
    }
#define SH_EXPORT_MID(T, V, O, NAME)                                                 \
    extern "C" __global__ void __launch_bounds__(SH_MID_BLOCK)                       \
    NAME(const T* a, void* ws, O* out, unsigned int* counters, long long A,          \
         long long M, long long I, long long chunk, long long chunks, long long div) { \
        mid_impl<T, V, O>(a, static_cast<sh::compute_t<T>*>(ws), out, counters, A, M, I, \
                          chunk, chunks, div);                                       \
    }
// The column kernels are bound to 4 resident blocks per multiprocessor (64
// registers a thread, as many as the earlier sum_cols used): unbounded, the
// compiler kept every load of a trip in its own registers (156 a thread for
// float) and one block fit per multiprocessor.  Packets of halves hold 8
// columns' states, so *_cols_vec of the halves are bound to 3
// (kVecColsBlocks).  *_cols read kScalarCols<T> columns a thread (the
// strided scalar path), *_cols_vec one packet's; max and min keep one value
// a column, as a sum does, and so get SUM_UNROLL loads in flight.
// Every sum kernel of format T (suffix SUF, packets of V elements), output
// in O (T, or the compute format for the "wide" ones, W = _wide).
#define SH_EXPORT_SUMS_TO(T, V, SUF, O, W)                                           \
    SH_EXPORT_ROW_KINDS(Sum<T>, T, O, sum, W##_##SUF)                                \
    SH_EXPORT_COLS(Sum<T>, T, kScalarCols<T>, false, SUM_UNROLL / kScalarCols<T>, O,          \
                   sum_cols##W##_##SUF, 4)                                           \
    SH_EXPORT_COLS(Sum<T>, T, V, true, SUM_UNROLL, O, sum_cols_vec##W##_##SUF,          \
                   kVecColsBlocks<T>)                                                \
    SH_EXPORT_MID(T, 1, O, sum_mid##W##_##SUF)                                       \
    SH_EXPORT_MID(T, V, O, sum_mid_vec##W##_##SUF)
// max_t or min_t (R: Max<T> or Min<T>, kernel names PRE_...).
#define SH_EXPORT_EXTREMES(R, T, V, SUF, PRE)                                        \
    SH_EXPORT_ROW_KINDS(R, T, T, PRE, _##SUF)                                        \
    SH_EXPORT_COLS(R, T, kScalarCols<T>, false, SUM_UNROLL / kScalarCols<T>, T,               \
                   PRE##_cols_##SUF, 4)                                              \
    SH_EXPORT_COLS(R, T, V, true, SUM_UNROLL, T, PRE##_cols_vec_##SUF, kVecColsBlocks<T>)
// argmax_t (R: Pick32<T>, or Pick64<T> beyond 32-bit indices): the column
// kernels as max's, a state of a value and an index a column.
#define SH_EXPORT_PICKS(R, T, V, SUF, PRE)                                           \
    SH_EXPORT_ROW_KINDS(R, T, T, PRE, _##SUF)                                        \
    SH_EXPORT_COLS(R, T, kScalarCols<T>, false, PICK_UNROLL / kScalarCols<T>, T,              \
                   PRE##_cols_##SUF, 4)                                              \
    SH_EXPORT_COLS(R, T, V, true, PICK_UNROLL, T, PRE##_cols_vec_##SUF, kVecColsBlocks<T>)
// A reduction with nothing to reduce (one_impl, its MODE): PRE_one_SUF;
// n is the element count.
#define SH_EXPORT_UNIT(T, SUF, PRE, MODE)                                            \
    extern "C" __global__ void __launch_bounds__(SH_BLOCK)                           \
    PRE##_one_##SUF(const T* a, void* ws, T* out, unsigned int* counters, long long n) { \
        one_impl<MODE, T>(a, out, n);                                                \
    }
#define SH_EXPORT_ALL(T, V, SUF)                                                     \
    SH_EXPORT_SUMS_TO(T, V, SUF, T, )                                                \
    SH_EXPORT_SUMS_TO(T, V, SUF, sh::compute_t<T>, _wide)                            \
    SH_EXPORT_GEN(Sum<T>, T, 1, false, GEN_UNROLL, T, sum_gen_##SUF)                   \
    SH_EXPORT_GEN(Sum<T>, T, V, true, GEN_UNROLL, T, sum_gen_vec_##SUF)                \
    SH_EXPORT_EXTREMES(Max<T>, T, V, SUF, max)                                       \
    SH_EXPORT_EXTREMES(Min<T>, T, V, SUF, min)                                       \
    SH_EXPORT_PICKS(Pick32<T>, T, V, SUF, pick)                                      \
    SH_EXPORT_PICKS(Pick64<T>, T, V, SUF, pick64)                                    \
    SH_EXPORT_UNIT(T, SUF, sum, ONE_PLUS_ZERO)                                       \
    SH_EXPORT_UNIT(T, SUF, max, ONE_COPY)                                            \
    SH_EXPORT_UNIT(T, SUF, min, ONE_COPY)                                            \
    SH_EXPORT_UNIT(T, SUF, pick, ONE_ZERO)

SH_EXPORT_ALL(float, 4, f32)
SH_EXPORT_ALL(double, 2, f64)
SH_EXPORT_ALL(__nv_bfloat16, 8, bf16)
SH_EXPORT_ALL(__half, 8, f16)
