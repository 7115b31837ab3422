// Device helpers of the generated fused-op kernels (handlers/cuda/fused_source.py).
//
// Each elementwise helper here has a NumPy twin in handlers/fused.py (NUMPY)
// that does the same operations in the same order, so the two backends agree
// up to the rounding of the math library (products are rounded on their own,
// never fused into multiply-adds: see mul below).
// The row kernels' reductions (below) group their sums differently from
// NumPy's pairwise sums, so those agree to the rounding of a sum.
#ifndef STREAMHANDLERS_KERNELS_FUSED_CUH
#define STREAMHANDLERS_KERNELS_FUSED_CUH

#include "common.cuh"

namespace sh {
namespace fx {

__device__ __forceinline__ float log1p(float x) { return ::log1pf(x); }
__device__ __forceinline__ double log1p(double x) { return ::log1p(x); }
__device__ __forceinline__ float erf(float x) { return ::erff(x); }
__device__ __forceinline__ double erf(double x) { return ::erf(x); }

// A product rounded on its own, as NumPy rounds it: nvcc never contracts
// __fmul_rn/__dmul_rn into a fused multiply-add with a later addition, which
// would keep the product's rounding error (dy * g - mean(dy * g) over a row
// of one element is then the error, not 0).
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }

// NaN in either operand gives NaN, as numpy.maximum/minimum (and the Max/Min
// functors of elementwise.cu); fmax/fmin would return the other operand.
template <typename T> __device__ __forceinline__ T max(T a, T b) {
    return a != a ? a : (b != b || b > a) ? b : a;
}
template <typename T> __device__ __forceinline__ T min(T a, T b) {
    return a != a ? a : (b != b || b < a) ? b : a;
}

// 1 / (1 + exp(-x)): exp overflows to inf for very negative x and gives 0,
// never NaN (NaN in, NaN out).
template <typename T> __device__ __forceinline__ T sigmoid(T x) {
    return T(1) / (T(1) + dm::exp(-x));
}

// x ** K for an integer K by squaring, the products in the order of
// handlers/fused.py's _ipow (IEEE multiplication is commutative, not
// associative, so the order is part of the result).  K is a template
// argument so the loop unrolls into straight multiplications.
template <int K, typename T> __device__ __forceinline__ T ipow(T x) {
    if (K == 0) return T(1);
    unsigned n = K < 0 ? unsigned(-K) : unsigned(K);
    T result = x, base = x;
    bool first = true;
#pragma unroll
    for (int bit = 0; bit < 8; ++bit) {
        if (n == 0) break;
        if (n & 1u) {
            result = first ? base : mul(result, base);
            first = false;
        }
        n >>= 1;
        if (n) base = mul(base, base);
    }
    return K < 0 ? T(1) / result : result;
}

// ------------------------------------------------------------- row kernels
//
// A fused op whose body reduces along the last axis (or reads `col`, or has
// per-row arrays) is generated as a row kernel: the kernel writes one row as
// a generic lambda row(s, r, live) and rows_loop below runs it with one of
// four strategies, a kernel each (STRATEGY, a template argument; the host
// picks it from cols and the block, fused_source.strategy):
//   cols <= 32 * R            LaneRow: a group of G lanes per row, G the
//                             smallest power of two with G * R >= cols, the
//                             row held in registers (R elements a lane):
//                             one read per element, shuffles only, many rows
//                             (and many loads) in flight per warp;
//   cols <= blockDim.x * R    BlockRow: a block per row, held in registers;
//   cols == blockDim.x * R    the same, every slot an element of the row
//                             (FULL_ROWS): no fold or store behind a test
//                             of the slot (softmax, the cross-entropy and
//                             LayerNorm's forward over 8192x4096 on an H200
//                             took 7-9% less time, their kernels 9-14 fewer
//                             registers; the loads keep their test, which
//                             held LayerNorm's forward at 40 registers, not
//                             52, and 4% faster);
//   larger                    StreamRow: a block per row, one pass over the
//                             row in memory per level of reductions (a
//                             reduction of a value that depends on another
//                             is a level deeper) and one for the outputs,
//                             each pass recomputing the values it needs from
//                             the inputs; by 16-byte packets where the rows
//                             allow.
// R (elements held per thread) is the generator's, from the number of arrays
// read per element, and each strategy's own: a lane group's thread holds at
// most 8, a block's 16 (fused_source.lane_held, held_elements); the host
// plans blocks and grids with the same rule
// (fused_source.plan_rows).  A strategy s gives the row function:
//   s.each(f)           f(const In& e, long long j, bool ok) for each
//                       element j of the row that this thread holds (or
//                       reads, streaming); a held row also calls it on its
//                       slots past the row's end (ok false: fold nothing);
//   s.reduce(v, op)     v combined over the row's threads: every thread of
//                       the row gets the same bits (the butterfly's a + b
//                       and b + a are equal, and each warp combines the
//                       per-warp partials in the same order);
//   s.reduce_pair(a, opa, b, opb)  two at once, as two s.reduce calls would
//                       (a block's: behind one barrier);
//   s.outputs(f, store, store_packets)  f(e, j, true) -> Values for each
//                       element, stored (streaming: read, computed, stored
//                       per packet);
//   s.sync()            orders every read of the row before a per-row store
//                       (an output may be an input's memory);
//   s.leader()          the thread that stores the row's per-row outputs.
// In place (an output over an input) is safe: held rows are read whole
// before any store, and streaming passes read and write an element in the
// same thread, after the reductions' barriers end the previous passes.
//
// Summed (':row') outputs, rows_loop_sums: S outputs of one row each, the
// sums over all rows of the values the body assigns them.  s.outputs(f, ...)
// then also adds each element's terms (Values::sums[S], returned by f) to
// the running sums of its column, and after the rows each block holds one
// partial row of S * cols sums; finish_sums adds the blocks' partial rows
// in block order.  Everything accumulates in the compute format C, and no
// value is ever added atomically: the order of every addition depends only
// on the shape and the grid, so the results are the same bits at every run.
//   LaneRow, BlockRow   a thread's columns are the same for every row it
//                       takes (first + k * step), so it keeps their sums in
//                       registers (R * S values).  After the rows, a block
//                       row's threads hold disjoint columns and write them
//                       as they are; a lane-row block combines the lane
//                       groups of each warp (a butterfly of shuffles over the
//                       groups, which hold the same columns), then its warps
//                       in warp order through shared memory.
//   StreamRow           a column has no register to live in (a row may be
//                       any length), so the block's partial row lives in the
//                       workspace, and the thread that reads a column in a
//                       row adds to it: per element and summed output, one
//                       more read and one more write of a C, in L2 where the
//                       grid's partial rows fit (the host caps the grid so
//                       that they stay small).  Which thread that is moves
//                       with a row's alignment (rows of odd length go by
//                       packets from their first 16-byte boundary), so a
//                       barrier ends each row.  The first row stores instead
//                       of adding, so nothing clears the row.  An op without
//                       per-row outputs takes its streamed rows in batches
//                       instead (stream_rows_sums, below): a thread adds a
//                       batch's terms of its columns in registers first.

// Asks the L2 cache for the line holding p (no register waits for it).
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// v, computed here whatever follows: an empty volatile asm that the
// compiler may neither move nor drop.  A block row's pass folds each term
// only where its slot is in the row; without the pin, the compiler moved
// the term's computation behind that test, where the outputs' pass could not
// reuse it (a softmax took each exp twice).  Strategies call it through
// s.keep(v), which lane and streamed rows leave a plain value (pinned in
// a lane row's branches, LayerNorm's forward took 99 registers, not 64).
__device__ __forceinline__ float keep(float v) {
    asm volatile("" : "+f"(v));
    return v;
}
__device__ __forceinline__ double keep(double v) {
    asm volatile("" : "+d"(v));
    return v;
}

// The reductions: combining functions (max and min propagate NaN, as
// numpy.max and numpy.min) and their identities (padding adds nothing).
struct Sum {
    template <typename C> __device__ __forceinline__ C operator()(C a, C b) const { return a + b; }
    template <typename C> static __device__ __forceinline__ C identity() { return C(0); }
};
struct Max {
    template <typename C> __device__ __forceinline__ C operator()(C a, C b) const {
        return max(a, b);
    }
    template <typename C> static __device__ __forceinline__ C identity() {
        return -dm::infinity<C>();
    }
};
struct Min {
    template <typename C> __device__ __forceinline__ C operator()(C a, C b) const {
        return min(a, b);
    }
    template <typename C> static __device__ __forceinline__ C identity() {
        return dm::infinity<C>();
    }
};

// The running sums of the S summed outputs at one column (R of them per
// thread in the held strategies); Values::sums[S] are an element's terms.
// S = 0 (no summed output) holds and adds nothing.
template <typename C, int S>
struct ColumnSums {
    C v[S];
    template <typename Values> __device__ __forceinline__ void add(const Values& o) {
#pragma unroll
        for (int i = 0; i < S; ++i) v[i] += o.sums[i];
    }
};
template <typename C>
struct ColumnSums<C, 0> {
    template <typename Values> __device__ __forceinline__ void add(const Values&) {}
};

// Where the blocks of a launch with summed outputs meet (kernel arguments):
// `partials`, gridDim.x partial rows of S * cols values (block b's at
// b * S * cols, output i's column j at i * cols + j); `counters`, at least
// ceil(gridDim.x / group) + 1 zeroed counters, left zero; `group`, the
// blocks per first-level group of finish_sums (fused_source.sum_groups).
template <typename C>
struct GridSums {
    C* partials;
    unsigned int* counters;
    long long group;
};

// v combined over aligned groups of `width` lanes (a power of two <= 32).
// The whole warp must call it: every lane takes part in the shuffles.
template <typename C, typename Op>
__device__ __forceinline__ C lanes_reduce(C v, Op op, int width) {
    for (int offset = width >> 1; offset > 0; offset >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// v combined over the block, returned to every thread.  blockDim.x must be a
// multiple of 32; scratch holds 2 x 64 values, and every thread of the block
// calls block_reduce and block_reduce_pair the same number of times, in the
// same order, with its own `parity`, which picks the half (64 values) that
// this call uses and flips.  Every warp combines the per-warp partials
// itself, in the same order: bit-identical results, no broadcast.  One
// barrier a call: a call writes the half that the call before the last
// read, and every thread has passed the last call's barrier, so has
// finished reading it (a second barrier, to free a single half, doubled a
// softmax's barriers).
template <typename C, typename Op>
__device__ __forceinline__ C block_reduce(C v, Op op, C* scratch, int& parity) {
    C* const half = scratch + 64 * parity;
    parity ^= 1;
    const int lane = threadIdx.x & 31;
    v = lanes_reduce(v, op, 32);
    if (lane == 0) half[threadIdx.x >> 5] = v;
    __syncthreads();
    return lanes_reduce(lane < int(blockDim.x >> 5) ? half[lane] : Op::template identity<C>(),
                        op, 32);
}

// Two reductions of one level at once (a with opa, b with opb): the same
// bits as two block_reduce calls, behind one barrier instead of two (a
// cross-entropy reduces two values at each of its two levels).
template <typename C, typename OpA, typename OpB>
__device__ __forceinline__ void block_reduce_pair(C& a, OpA opa, C& b, OpB opb, C* scratch,
                                                  int& parity) {
    C* const half = scratch + 64 * parity;
    parity ^= 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    a = lanes_reduce(a, opa, 32);
    b = lanes_reduce(b, opb, 32);
    if (lane == 0) {
        half[warp] = a;
        half[32 + warp] = b;
    }
    __syncthreads();
    const bool in = lane < int(blockDim.x >> 5);
    a = lanes_reduce(in ? half[lane] : OpA::template identity<C>(), opa, 32);
    b = lanes_reduce(in ? half[32 + lane] : OpB::template identity<C>(), opb, 32);
}

// R elements of row r held in registers.  By packets of W (R a multiple of W)
// when `packets` (cols % W == 0, every array 16-byte aligned): this thread's
// packets are first, first + step, ... (element k of v is lane k % W of
// packet k / W); else element by element, columns first, first + step, ...
// One 16-byte load or store moves W elements: element-wise loads reached
// about 0.66-0.79 of a plain copy's bandwidth in a softmax on an H200 where
// packets reached 0.93-1.07 (8192 x 4096 to 65536 x 512, float32).  A
// thread's columns are the same for every row (summed outputs rely on it).
// `live` is false for a lane group past the last row, which only joins the
// shuffles.
template <typename In, int R, typename C, int S, int W, bool EVERY, bool FULL = false,
          int TRIP = 1>
struct HeldRow {
    using value_type = C;
    static constexpr int P = R % W == 0 ? R / W : 0;  // packets held (0: never by packets)
    // TRIP rows a trip (rows_impl's loop with summed outputs): row U of the
    // trip is v[U * R] .. v[U * R + R - 1], U a template argument of load,
    // each and outputs (a constant index: v stays in registers; a member
    // index put it in local memory), r and live the row in hand's.
    In v[TRIP * R];
    ColumnSums<C, S> acc[R];  // the summed outputs' running sums of this thread's columns
    long long r;
    // A held row has at most ROW_BLOCK * R columns: int arithmetic and int
    // tests against cols (64-bit ones were a third of a softmax's integer
    // instructions).
    int cols;
    int first, step;
    bool live, packets;

    // The column of element k.
    __device__ __forceinline__ int col(int k) const {
        return P && packets ? (first + (k / W) * step) * W + k % W : first + k * step;
    }

    // Whether column j, one of this thread's slots, is an element of a row
    // to compute (FULL: every slot is, known at compile time).  load() tests
    // it at run time whatever FULL: loads known to happen were hoisted, and
    // LayerNorm's forward, whose row inputs are read at use, took 52
    // registers where 40 did.
    __device__ __forceinline__ bool holds(int j) const { return FULL || (live && in_row(j)); }
    // Whether column j is within a row at all, whichever row (a row past
    // the last included): FULL's every slot is.
    __device__ __forceinline__ bool in_row(int j) const { return FULL || j < cols; }

    // Slots past the row hold zeros (each() computes on them, masked).
    template <int U = 0, typename Load, typename LoadPackets>
    __device__ __forceinline__ void load(Load load, LoadPackets load_packets) {
        if (P && packets) {
#pragma unroll
            for (int q = 0; q < P; ++q) {
                const int p = first + q * step;
                if (live && p * W < cols) {
                    const auto e = load_packets(r * (cols / W) + p, p * W);
#pragma unroll
                    for (int i = 0; i < W; ++i) v[U * R + q * W + i] = e.v[i];
                } else {
#pragma unroll
                    for (int i = 0; i < W; ++i) v[U * R + q * W + i] = In{};
                }
            }
            return;
        }
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const int j = first + k * step;
            v[U * R + k] = live && j < cols ? load(r, j) : In{};
        }
    }

    // With summed outputs a block or lane group loops over rows, each row's
    // loads waiting on memory after the last row's reductions: this asks
    // the L2 for row `next`'s elements that this thread will load, by
    // prefetch(next, j) per packet (its first element j) or element, while
    // the row in hand is reduced.  Nothing is held in registers.
    template <typename Prefetch>
    __device__ __forceinline__ void prefetch(Prefetch pf, long long next, bool ok) const {
        if (!ok) return;
        if (P && packets) {
#pragma unroll
            for (int q = 0; q < P; ++q) {
                const int p = first + q * step;
                if (in_row(p * W)) pf(next, (long long)p * W);
            }
            return;
        }
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const int j = first + k * step;
            if (in_row(j)) pf(next, j);
        }
    }

    // EVERY: f runs on every slot, told whether it is an element of the row
    // (ok), and folds only those: straight-line code, so that the values a
    // reduction's pass computes are the ones the outputs' pass reuses (the
    // compiler merges the two computations; behind a branch per element it
    // did not, and a softmax took each exp twice).  Else f runs on the
    // row's elements alone and the outputs' pass recomputes: values held
    // across the reductions cost registers, which lane rows (many rows a
    // block) cannot spare: LayerNorm's forward took 80 where 64 let two
    // blocks of 512 threads share a multiprocessor.
    template <int U = 0, typename F> __device__ __forceinline__ void each(F f) const {
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const int j = col(k);
            if constexpr (EVERY) {
                f(v[U * R + k], j, holds(j));
            } else if (holds(j)) {
                f(v[U * R + k], j, true);
            }
        }
    }

    // A term of a reduction, pinned where EVERY (fx::keep), as is.
    template <typename V> __device__ __forceinline__ V keep(V x) const {
        if constexpr (EVERY) return fx::keep(x);
        else return x;
    }

    template <int U = 0, typename F, typename Store, typename StorePackets>
    __device__ __forceinline__ void outputs(F f, Store store, StorePackets store_packets) {
        if (P && packets) {
#pragma unroll
            for (int q = 0; q < P; ++q) {
                const int p = first + q * step;
                if (holds(p * W)) {
                    Lanes<decltype(f(v[U * R], 0LL, true)), W> o;
#pragma unroll
                    for (int i = 0; i < W; ++i) o.v[i] = f(v[U * R + q * W + i], p * W + i, true);
                    store_packets(r * (cols / W) + p, o);
#pragma unroll
                    for (int i = 0; i < W; ++i) acc[q * W + i].add(o.v[i]);
                }
            }
            return;
        }
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const int j = first + k * step;
            if (holds(j)) {
                const auto o = f(v[U * R + k], j, true);
                store(r, j, o);
                acc[k].add(o);
            }
        }
    }
};

template <typename In, int R, typename C, int S, int W>
struct LaneRow : HeldRow<In, R, C, S, W, false> {
    int width;
    template <typename Op> __device__ __forceinline__ C reduce(C v, Op op) const {
        return lanes_reduce(v, op, width);
    }
    template <typename OpA, typename OpB>
    __device__ __forceinline__ void reduce_pair(C& a, OpA opa, C& b, OpB opb) const {
        a = lanes_reduce(a, opa, width);
        b = lanes_reduce(b, opb, width);
    }
    __device__ __forceinline__ bool leader() const { return this->first == 0; }
    __device__ __forceinline__ void sync() const { __syncwarp(); }
};

template <typename In, int R, typename C, int S, int W, bool FULL, int TRIP = 1>
struct BlockRow : HeldRow<In, R, C, S, W, true, FULL, TRIP> {
    C* scratch;  // 2 x 64 values (block_reduce)
    int parity = 0;
    template <typename Op> __device__ __forceinline__ C reduce(C v, Op op) {
        return block_reduce(v, op, scratch, parity);
    }
    template <typename OpA, typename OpB>
    __device__ __forceinline__ void reduce_pair(C& a, OpA opa, C& b, OpB opb) {
        block_reduce_pair(a, opa, b, opb, scratch, parity);
    }
    __device__ __forceinline__ bool leader() const { return threadIdx.x == 0; }
    __device__ __forceinline__ void sync() const { __syncthreads(); }
};

// Row U of a block's trip (a BlockRow holding TRIP rows), as the row
// function sees a strategy: its elements are the block row's v[U * R ..].
template <int U, typename Block>
struct TripRow {
    using C = typename Block::value_type;
    Block& s;
    template <typename F> __device__ __forceinline__ void each(F f) const {
        s.template each<U>(f);
    }
    template <typename F, typename Store, typename StorePackets>
    __device__ __forceinline__ void outputs(F f, Store store, StorePackets store_packets) {
        s.template outputs<U>(f, store, store_packets);
    }
    template <typename Op> __device__ __forceinline__ C reduce(C v, Op op) {
        return s.reduce(v, op);
    }
    template <typename OpA, typename OpB>
    __device__ __forceinline__ void reduce_pair(C& a, OpA opa, C& b, OpB opb) {
        s.reduce_pair(a, opa, b, opb);
    }
    template <typename V> __device__ __forceinline__ V keep(V x) const { return s.keep(x); }
    __device__ __forceinline__ bool leader() const { return s.leader(); }
    __device__ __forceinline__ void sync() const { s.sync(); }
};

// f(Index<0>{}), f(Index<1>{}), ... f(Index<N - 1>{}): a loop whose index is
// a constant in each copy (an array it indexes stays in registers).
template <int U> struct Index { static constexpr int value = U; };
template <int U, int N, typename F> __device__ __forceinline__ void unrolled(F f) {
    if constexpr (U < N) {
        f(Index<U>{});
        unrolled<U + 1, N>(f);
    }
}

// Row r read from memory at each pass.  Where every array is 16-byte aligned
// (`aligned`), the row's aligned middle goes by packets of W = kVec<T>
// elements (span(): the elements before the first 16-byte boundary, at most
// W - 1, and after the last whole packet, fewer than W, go one by one); any
// row length, so rows of 50257 move by packets too (element loads had a
// quarter of the bytes in flight).  Else element by element.  With S summed
// outputs, `partial` is this block's partial row (S * cols values) and
// `fresh` says that no row has been summed into it yet.
// Each pass keeps STREAM_PACKETS packets' loads in flight a thread, or by
// elements 16 bytes' worth: a trip's loads are issued before any value is
// used (one in flight, load then use, left a softmax over rows of 50257 at
// 31% of copy where a standalone kernel with four packets reached 76%).
// Two, not four: a row kernel may take 64 registers (its launch bound of
// 1024 threads), and four packets of halves spilled.  A thread visits its
// packets in column order, then its elements before and after them, so every
// fold adds in an order fixed by the shape and the block.
constexpr int STREAM_PACKETS = 2;

template <typename T, typename In, typename Load, typename LoadPackets, int S = 0>
struct StreamRow {
    using C = compute_t<T>;
    static constexpr int W = kVec<T>;
    Load load;
    LoadPackets load_packets;  // load_packets(q, c): as rows_impl's
    C* scratch;  // 2 x 64 values (block_reduce)
    long long r, cols;
    bool aligned;
    C* partial;
    bool fresh;
    int parity;

    // The row's packets: columns [lo, hi) are packets q0, q0 + 1, ... (in
    // packets of the arrays); lo == hi where the arrays are not aligned.
    struct Span {
        long long lo, hi, q0;
    };
    __device__ __forceinline__ Span span() const {
        if (!aligned) return {0, 0, 0};
        const long long start = r * cols;
        const long long lo = min((long long)((W - start % W) % W), cols);
        const long long hi = lo + (cols - lo) / W * W;
        return {lo, hi, (start + lo) / W};
    }

    // Element j's terms into the block's partial row (this thread owns j).
    template <typename Values>
    __device__ __forceinline__ void add(long long j, const Values& o) const {
        if constexpr (S > 0) {
#pragma unroll
            for (int i = 0; i < S; ++i) {
                C* p = partial + i * cols + j;
                *p = fresh ? o.sums[i] : *p + o.sums[i];
            }
        }
    }

    // The passes are written out, not built from lambdas around f: a lambda
    // capturing the span by reference put it on the stack, and a
    // cross-entropy's kernel spilled.
    template <typename F> __device__ __forceinline__ void each(F f) const {
        const long long step = blockDim.x, t = threadIdx.x;
        if (aligned) {
            const Span s = span();
            constexpr int U = STREAM_PACKETS;
            const long long n = (s.hi - s.lo) / W;
            long long p = t;
            for (; p + (U - 1) * step < n; p += U * step) {
                Lanes<In, W> e[U];
#pragma unroll
                for (int u = 0; u < U; ++u)
                    e[u] = load_packets(s.q0 + p + u * step, s.lo + (p + u * step) * W);
#pragma unroll
                for (int u = 0; u < U; ++u) {
#pragma unroll
                    for (int k = 0; k < W; ++k) f(e[u].v[k], s.lo + (p + u * step) * W + k, true);
                }
            }
            for (; p < n; p += step) {
                const Lanes<In, W> e = load_packets(s.q0 + p, s.lo + p * W);
#pragma unroll
                for (int k = 0; k < W; ++k) f(e.v[k], s.lo + p * W + k, true);
            }
            // Fewer than W elements before the packets and fewer after.
            if (t < s.lo) f(load(r, t), t, true);
            if (s.hi + t < cols) f(load(r, s.hi + t), s.hi + t, true);
            return;
        }
        // Element by element, 16 bytes of loads in flight.
        constexpr int U = 16 / sizeof(T);
        long long j = t;
        for (; j + (U - 1) * step < cols; j += U * step) {
            In e[U];
#pragma unroll
            for (int u = 0; u < U; ++u) e[u] = load(r, j + u * step);
#pragma unroll
            for (int u = 0; u < U; ++u) f(e[u], j + u * step, true);
        }
        for (; j < cols; j += step) f(load(r, j), j, true);
    }

    // Element j of the outputs from its inputs e: computed, stored, summed.
    template <typename F, typename Store>
    __device__ __forceinline__ void element_out(F f, Store store, long long j,
                                                const In& e) const {
        const auto o = f(e, j, true);
        store(r, j, o);
        if constexpr (S > 0) add(j, o);
    }

    // Packet q of the arrays, holding columns j0 .. j0 + W - 1, of the
    // outputs from its inputs e: computed, stored, summed.
    template <typename F, typename StorePackets>
    __device__ __forceinline__ void packet_out(F f, StorePackets store_packets, long long q,
                                               long long j0, const Lanes<In, W>& e) const {
        Lanes<decltype(f(e.v[0], 0LL, true)), W> o;
#pragma unroll
        for (int k = 0; k < W; ++k) o.v[k] = f(e.v[k], j0 + k, true);
        store_packets(q, o);
        if constexpr (S > 0) {
#pragma unroll
            for (int k = 0; k < W; ++k) add(j0 + k, o.v[k]);
        }
    }

    // In place is safe: a thread stores only elements it has loaded.
    template <typename F, typename Store, typename StorePackets>
    __device__ __forceinline__ void outputs(F f, Store store, StorePackets store_packets) const {
        const long long step = blockDim.x, t = threadIdx.x;
        if (aligned) {
            const Span s = span();
            constexpr int U = STREAM_PACKETS;
            const long long n = (s.hi - s.lo) / W;
            long long p = t;
            for (; p + (U - 1) * step < n; p += U * step) {
                Lanes<In, W> e[U];
#pragma unroll
                for (int u = 0; u < U; ++u)
                    e[u] = load_packets(s.q0 + p + u * step, s.lo + (p + u * step) * W);
#pragma unroll
                for (int u = 0; u < U; ++u)
                    packet_out(f, store_packets, s.q0 + p + u * step, s.lo + (p + u * step) * W,
                               e[u]);
            }
            for (; p < n; p += step)
                packet_out(f, store_packets, s.q0 + p, s.lo + p * W,
                           load_packets(s.q0 + p, s.lo + p * W));
            if (t < s.lo) element_out(f, store, t, load(r, t));
            if (s.hi + t < cols) element_out(f, store, s.hi + t, load(r, s.hi + t));
            return;
        }
        constexpr int U = 16 / sizeof(T);
        long long j = t;
        for (; j + (U - 1) * step < cols; j += U * step) {
            In e[U];
#pragma unroll
            for (int u = 0; u < U; ++u) e[u] = load(r, j + u * step);
#pragma unroll
            for (int u = 0; u < U; ++u) element_out(f, store, j + u * step, e[u]);
        }
        for (; j < cols; j += step) element_out(f, store, j, load(r, j));
    }

    template <typename Op> __device__ __forceinline__ C reduce(C v, Op op) {
        return block_reduce(v, op, scratch, parity);
    }
    template <typename OpA, typename OpB>
    __device__ __forceinline__ void reduce_pair(C& a, OpA opa, C& b, OpB opb) {
        block_reduce_pair(a, opa, b, opb, scratch, parity);
    }
    template <typename V> __device__ __forceinline__ V keep(V x) const { return x; }
    __device__ __forceinline__ bool leader() const { return threadIdx.x == 0; }
    __device__ __forceinline__ void sync() const { __syncthreads(); }
};

// p[0] + p[step] + ... + p[(count - 1) * step] (count >= 1), added in that
// order, read from L2 sixteen at a time, the last batch predicated: a
// batch's loads are issued before its additions, where one load then one
// add left the combine a chain of L2 round trips (a dense layer's bias
// gradient, 256 rows of 1024 in groups of 16, took about 10 us for a 5 us
// read).  The order, and so the bits, are those of one at a time: the
// first value is taken as it is, never added to a zero (-0.0 stays -0.0).
template <typename C>
__device__ __forceinline__ C add_rows(const C* p, long long step, long long count) {
    constexpr int U = 16;
    C v = C(0);
    for (long long b = 0; b < count; b += U) {
        C x[U];
#pragma unroll
        for (int u = 0; u < U; ++u) x[u] = b + u < count ? __ldcg(p + (b + u) * step) : C(0);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (b + u < count) v = b + u == 0 ? x[u] : v + x[u];
        }
    }
    return v;
}

// The end of a launch with S summed outputs: this block's partial row
// (S * cols values at sums.partials + blockIdx.x * S * cols) is written by
// its threads; the blocks' partial rows are added up in block order and
// store(i, j, sum) writes output i's column j.
//
// In two levels, each finished by the last block to arrive, told by a
// counter that it resets to 0 for the next launch on the stream (as
// reduce.cu's chunked kernels): the last block of each group of `group`
// consecutive blocks adds the group's partial rows into the group's first
// one, and the last group to finish adds the groups' rows and stores them.
// With group ~ sqrt(gridDim.x), no block adds more than ~sqrt(grid) rows:
// one last block adding every row would read all of grid * S * cols
// values alone (megabytes for a thousand blocks of long rows), many times
// the time of the rows themselves.  Every sum's order is block order, fixed
// by the grid, whichever block happens to finish last.
template <int S, typename C, typename Store>
__device__ __forceinline__ void finish_sums(const GridSums<C>& sums, long long cols,
                                            Store store) {
    __shared__ bool last;
    const long long n = S * cols;
    const long long group = sums.group;
    const long long g = blockIdx.x / group, groups = (gridDim.x + group - 1) / group;
    const long long size = min(group, (long long)gridDim.x - g * group);
    C* const head = sums.partials + g * group * n;  // the group's first partial row
    __threadfence();  // this block's partial row reaches L2 before the count does
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(sums.counters + g, 1u) == (unsigned int)(size - 1);
        if (last) sums.counters[g] = 0u;  // ready for the next launch on this stream
    }
    __syncthreads();
    if (!last) return;
    __threadfence();  // order the group's partial rows before our reads
#pragma unroll
    for (int i = 0; i < S; ++i) {
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            const long long e = i * cols + j;
            const C v = add_rows(head + e, n, size);
            if (groups == 1) {
                store(i, j, v);
            } else {
                head[e] = v;
            }
        }
    }
    if (groups == 1) return;
    __threadfence();  // the group's row reaches L2 before the count does
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(sums.counters + groups, 1u) == (unsigned int)(groups - 1);
        if (last) sums.counters[groups] = 0u;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
#pragma unroll
    for (int i = 0; i < S; ++i) {
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            const long long e = i * cols + j;
            const C v = add_rows(sums.partials + e, group * n, groups);
            store(i, j, v);
        }
    }
}

// The strategies, one kernel each (the host picks: fused_source.strategy).
constexpr int LANE_ROWS = 0;    // cols <= 32 * R
constexpr int BLOCK_ROWS = 1;   // cols <= blockDim.x * R
constexpr int STREAM_ROWS = 2;  // longer rows
constexpr int FULL_ROWS = 3;    // cols == blockDim.x * R

// Runs row(s, r, live) for every row of a (rows, cols) problem that this
// thread's lane group or block takes, with strategy STRATEGY, which the
// host chose for cols and the block (see above).  load(r, j) gives element
// j of row r's inputs (In), load_packets(q, c) the W elements of packet q
// of the full arrays (16-byte packets from their starts) with columns c ..
// c + W - 1 of the `:row` inputs that In holds (only called when `aligned`:
// every array 16-byte aligned).  Held rows go by packets where cols % W == 0 too;
// streamed rows, by packets over each row's aligned middle whatever cols.
// Lane groups stride over the rows on any grid; a block or streamed row
// takes row blockIdx.x alone without summed outputs (the grid must cover
// the rows: fused_source.plan_rows's), and strides with them.  blockDim.x a
// multiple of 32.
// With S > 0 summed outputs (rows_loop_sums), the blocks then combine their
// sums (finish_sums): store_sum(i, j, v) stores output i's column j.
template <typename T, int R, typename In, int S, int STRATEGY, int TRIP, typename Load,
          typename LoadPackets, typename Prefetch, typename Row, typename StoreSum>
__device__ __forceinline__ void rows_impl(long long rows, long long cols, bool aligned,
                                          Load load, LoadPackets load_packets,
                                          Prefetch prefetch, Row row,
                                          const GridSums<compute_t<T>>& sums,
                                          StoreSum store_sum) {
    using C = compute_t<T>;
    // Held rows go by packets where no packet straddles two rows.
    const bool packets = aligned && cols % kVec<T> == 0;
    __shared__ C scratch[2 * 64];  // per-warp partials of block reductions, in C
    C* const partial = S > 0 ? sums.partials + (long long)blockIdx.x * S * cols : nullptr;
    if constexpr (STRATEGY == LANE_ROWS) {
        LaneRow<In, R, C, S, kVec<T>> s;
        if constexpr (S > 0) {
#pragma unroll
            for (int k = 0; k < R; ++k) s.acc[k] = ColumnSums<C, S>{};
        }
        s.width = 1;
        while ((long long)s.width * R < cols) s.width <<= 1;
        const int lane = threadIdx.x & 31;
        s.first = lane & (s.width - 1);
        s.step = s.width;
        s.cols = (int)cols;
        s.packets = packets;
        const long long per_warp = 32 / s.width;  // rows per warp and trip
        const long long warp = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
        const long long nwarps = (long long)gridDim.x * (blockDim.x >> 5);
        // The trip count depends only on the warp, so all its lanes stay in
        // the loop together for the shuffles.
        for (long long base = warp * per_warp; base < rows; base += nwarps * per_warp) {
            s.r = base + lane / s.width;
            s.live = s.r < rows;
            s.load(load, load_packets);
            if constexpr (S > 0) {
                const long long next = s.r + nwarps * per_warp;
                s.prefetch(prefetch, next, s.live && next < rows);
            }
            row(s, s.r, s.live);
        }
        if constexpr (S > 0) {
            // The warp's lane groups hold the same columns (lane & (width - 1)):
            // a butterfly over them leaves every lane the same bits.
            for (int offset = 16; offset >= s.width; offset >>= 1) {
#pragma unroll
                for (int k = 0; k < R; ++k) {
#pragma unroll
                    for (int i = 0; i < S; ++i)
                        s.acc[k].v[i] += __shfl_xor_sync(0xffffffffu, s.acc[k].v[i], offset);
                }
            }
            // Then the warps, in warp order, through shared memory (cols <= 32 * R).
            __shared__ C part[S * 32 * R];
            const int my_warp = threadIdx.x >> 5;
            for (int w = 0; w < int(blockDim.x >> 5); ++w) {
                if (my_warp == w && lane < s.width) {
#pragma unroll
                    for (int k = 0; k < R; ++k) {
                        const long long j = s.col(k);
                        if (j < cols) {
#pragma unroll
                            for (int i = 0; i < S; ++i) {
                                C& p = part[i * cols + j];
                                p = w == 0 ? s.acc[k].v[i] : p + s.acc[k].v[i];
                            }
                        }
                    }
                }
                __syncthreads();
            }
            for (long long e = threadIdx.x; e < S * cols; e += blockDim.x) partial[e] = part[e];
            finish_sums<S>(sums, cols, store_sum);
        }
    } else if constexpr (STRATEGY == BLOCK_ROWS || STRATEGY == FULL_ROWS) {
        using Block = BlockRow<In, R, C, S, kVec<T>, STRATEGY == FULL_ROWS, TRIP>;
        Block s;
        if constexpr (S > 0) {
#pragma unroll
            for (int k = 0; k < R; ++k) s.acc[k] = ColumnSums<C, S>{};
        }
        s.scratch = scratch;
        s.first = threadIdx.x;
        s.step = blockDim.x;
        s.cols = (int)cols;
        s.packets = packets;
        s.live = true;
        if constexpr (S == 0) {
            // A block per row (the host's grid covers the rows): no loop
            // state to keep took softmax's kernel from 43 registers to 31,
            // and so from 2 resident blocks of 512 threads to 4.
            s.r = blockIdx.x;
            if (s.r < rows) {
                s.load(load, load_packets);
                row(s, s.r, true);
            }
        } else {
            // TRIP consecutive rows a trip: their loads are issued together,
            // the next trip's asked of the L2, then each row is reduced in
            // turn (one row's loads in flight a multiprocessor left a
            // standalone LayerNorm backward over 8192x4096 at 122.9 us on
            // an H200, two rows a trip at 107.4).  A row past the last
            // (block-uniform) loads nothing and is skipped.
            const long long stride = (long long)gridDim.x * TRIP;
            for (long long base = (long long)blockIdx.x * TRIP; base < rows; base += stride) {
                unrolled<0, TRIP>([&](auto u) {
                    s.r = base + u.value;
                    s.live = s.r < rows;
                    s.template load<u.value>(load, load_packets);
                });
#pragma unroll
                for (int t = 0; t < TRIP; ++t) {
                    const long long next = base + stride + t;
                    s.prefetch(prefetch, next, next < rows);
                }
                unrolled<0, TRIP>([&](auto u) {
                    s.r = base + u.value;
                    s.live = s.r < rows;
                    if (s.live) {
                        TripRow<u.value, Block> view{s};
                        row(view, s.r, true);
                    }
                });
            }
        }
        if constexpr (S > 0) {
            // Each column of the block is one thread's: its sums are the block's.
#pragma unroll
            for (int k = 0; k < R; ++k) {
                const int j = s.col(k);
                if (s.in_row(j)) {
#pragma unroll
                    for (int i = 0; i < S; ++i) partial[i * cols + j] = s.acc[k].v[i];
                }
            }
            finish_sums<S>(sums, cols, store_sum);
        }
    } else {
        static_assert(STRATEGY == STREAM_ROWS, "LANE_ROWS, BLOCK_ROWS, FULL_ROWS or STREAM_ROWS");
        StreamRow<T, In, Load, LoadPackets, S> s{load, load_packets, scratch, 0, cols,
                                                 aligned, partial, true, 0};
        if constexpr (S == 0) {  // a block per row, as above
            s.r = blockIdx.x;
            if (s.r < rows) row(s, s.r, true);
        } else {
            for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
                s.r = r;
                row(s, r, true);
                s.fresh = false;
                // The next row's columns may fall to other threads (StreamRow's
                // span): this row's additions to the partial row are done and
                // seen by the block first.
                __syncthreads();
            }
        }
        if constexpr (S > 0) {
            if (s.fresh) {  // no row (an op over no rows): the sums are 0
                for (long long e = threadIdx.x; e < S * cols; e += blockDim.x) partial[e] = C(0);
            }
            finish_sums<S>(sums, cols, store_sum);
        }
    }
}

// A row kernel without summed outputs.
template <typename T, int R, typename In, int STRATEGY, typename Load, typename LoadPackets,
          typename Row>
__device__ __forceinline__ void rows_loop(long long rows, long long cols, bool aligned,
                                          Load load, LoadPackets load_packets, Row row) {
    rows_impl<T, R, In, 0, STRATEGY, 1>(rows, cols, aligned, load, load_packets,
                                        [](long long, long long) {}, row,
                                        GridSums<compute_t<T>>{nullptr, nullptr, 1},
                                        [](int, long long, compute_t<T>) {});
}

// A row kernel with S > 0 summed outputs (see finish_sums); prefetch(r, j)
// asks the L2 for element j of row r of every array the row loads; a block
// holding rows takes TRIP of them a trip.
template <typename T, int R, typename In, int S, int STRATEGY, int TRIP, typename Load,
          typename LoadPackets, typename Prefetch, typename Row, typename StoreSum>
__device__ __forceinline__ void rows_loop_sums(long long rows, long long cols, bool aligned,
                                               Load load, LoadPackets load_packets,
                                               Prefetch prefetch, Row row,
                                               const GridSums<compute_t<T>>& sums,
                                               StoreSum store_sum) {
    static_assert(S > 0, "rows_loop_sums sums at least one output");
    rows_impl<T, R, In, S, STRATEGY, TRIP>(rows, cols, aligned, load, load_packets, prefetch,
                                           row, sums, store_sum);
}

// Streamed rows with S > 0 summed outputs, B rows a batch (the host's
// fused_source.stream_batch; ops without per-row outputs): each block takes
// batches of B consecutive rows, batch blockIdx.x first, then every
// gridDim.x-th.  row_values(s, r, live) runs a row's reductions (StreamRow's
// passes, by packets where aligned) and returns the per-row values its
// outputs read; then one walk over the columns gives each element of the
// batch's rows its outputs, element(v, e, j) -> Values, stored, and adds
// the batch's terms of a column in registers, the rows in order, before one
// read and write of the block's partial row.  A thread's columns (t, t +
// blockDim.x, ...) are the same in every row, so its partial columns are its
// own (a barrier ends a batch only for its values in shared memory).  Row at a time (rows_impl's streamed
// rows), that partial row was read and written for every row.  The order of
// every addition depends only on the shape and the grid.  In place is safe:
// a batch's reductions have read its rows whole (their barriers) before any
// store, and a thread stores only what it has loaded.
template <typename T, typename In, int S, int B, typename Load, typename LoadPackets,
          typename RowValues, typename Element, typename Store, typename StoreSum>
__device__ __forceinline__ void stream_rows_sums(long long rows, long long cols, bool aligned,
                                                 Load load, LoadPackets load_packets,
                                                 RowValues row_values, Element element,
                                                 Store store,
                                                 const GridSums<compute_t<T>>& sums,
                                                 StoreSum store_sum) {
    static_assert(S > 0 && B > 0, "stream_rows_sums sums at least one output, in batches");
    using C = compute_t<T>;
    __shared__ C scratch[2 * 64];  // per-warp partials of block reductions
    C* const partial = sums.partials + (long long)blockIdx.x * S * cols;
    StreamRow<T, In, Load, LoadPackets, 0> s{load, load_packets, scratch, 0, cols,
                                             aligned, nullptr, true, 0};
    // A batch's per-row values, the same in every thread (the reductions
    // give every thread the same bits): in shared memory, as registers held
    // through the next rows' passes spilled (LayerNorm's backward, float32,
    // 222 bytes at 4 rows a batch; nvcc 13, sm_90).
    using V = decltype(row_values(s, 0LL, true));
    __shared__ V v[B];
    const long long step = blockDim.x;
    bool fresh = true;
    for (long long base = (long long)blockIdx.x * B; base < rows;
         base += (long long)gridDim.x * B) {
        const int n = (int)min((long long)B, rows - base);  // block-uniform
#pragma unroll 1
        for (int b = 0; b < B; ++b) {
            if (b < n) {
                s.r = base + b;
                const V got = row_values(s, s.r, true);
                if (threadIdx.x == 0) v[b] = got;
            }
        }
        __syncthreads();  // the batch's values reach every thread
        for (long long j = threadIdx.x; j < cols; j += step) {
            In e[B];
#pragma unroll
            for (int b = 0; b < B; ++b) {
                if (b < n) e[b] = load(base + b, j);
            }
            C acc[S];
#pragma unroll
            for (int b = 0; b < B; ++b) {
                if (b < n) {
                    const auto o = element(v[b], e[b], j);
                    store(base + b, j, o);
#pragma unroll
                    for (int i = 0; i < S; ++i) acc[i] = b == 0 ? o.sums[i] : acc[i] + o.sums[i];
                }
            }
#pragma unroll
            for (int i = 0; i < S; ++i) {
                C* p = partial + i * cols + j;
                *p = fresh ? acc[i] : *p + acc[i];
            }
        }
        fresh = false;
        __syncthreads();  // every thread is done with v before the next batch's
    }
    if (fresh) {  // no row (an op over no rows, or more blocks than batches): the sums are 0
        for (long long e = threadIdx.x; e < S * cols; e += blockDim.x) partial[e] = C(0);
    }
    finish_sums<S>(sums, cols, store_sum);
}

}  // namespace fx
}  // namespace sh

#endif  // STREAMHANDLERS_KERNELS_FUSED_CUH
