// Row-wise kernels on a matrix (rows, cols): softmax, indexing by a vector of
// float-coded indices, and one-hot encoding.
//
// Every kernel exists as name_f32 (float) and name_f64 (double); sizes are
// long long.  Launch: 1-D grid of 1-D blocks.
//   softmax_rows   grid-stride over rows (rows go to lane groups or to whole
//                  blocks, see below), so any grid size works; the block
//                  size must be a multiple of 32, at most 1024.  The host
//                  uses block = 256 and grid = (rows,); min(rows, 16 * SMs)
//                  blocks are as fast for long rows and several times faster
//                  for rows of up to 256 elements, where a warp takes several
//                  rows and most of a grid of `rows` blocks would sit idle.
//   index_m_by_v   grid-stride over rows; any grid and block size.
//   binarize_v     grid-stride over rows * cols elements; any grid and block.
//
// An index v[i] is valid when 0 <= v[i] < cols, tested on the floating-point
// value (NaN fails both tests), and is then truncated toward zero.
#include "common.cuh"

namespace sh {

// ------------------------------------------------------------- block reductions

struct MaxOp {
    template <typename T> __device__ T operator()(T a, T b) const { return dm::fmax(a, b); }
};

struct SumOp {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};

template <typename T, typename Op>
__device__ __forceinline__ T group_reduce(T v, Op op, int width);  // below, with softmax

// Reduces v over the block and returns the result to every thread.
// blockDim.x must be a multiple of 32 (full warps for the shuffles); scratch
// holds 32 values.  Every warp reduces the per-warp partials itself, in the
// same order, so all threads get bit-identical results without a broadcast.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T identity, T* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = group_reduce(v, op, 32);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = group_reduce(lane < nwarps ? scratch[lane] : identity, op, 32);
    __syncthreads();  // scratch is free for the next reduction
    return v;
}

// ------------------------------------------------------------- softmax
//
// Three strategies, chosen per launch from cols and blockDim (both uniform,
// so every thread of a block takes the same branch):
//   cols <= 32 * R            a group of G lanes per row, G the smallest power
//                             of two with G * R >= cols, the row held in
//                             registers (R per lane): one read and one write
//                             per element, shuffles only, no barriers.  Small
//                             rows thus put many rows, and many independent
//                             loads, in flight per warp.
//   cols <= blockDim.x * R    one block per row, the row held in registers.
//   larger                    one block per row, three passes over memory
//                             (by packets where the rows are aligned): max,
//                             sum of exp(x - max), then the quotient,
//                             recomputing exp rather than storing it.
// A NaN in a row makes its sum, hence the whole row, NaN, as in the NumPy
// reference; so does a row of -inf (inf - inf).
//
// In place (out == m): an element is written only by the thread that reads
// it in the last step, and only after both reductions over its row, which
// come after every other read of that row.

constexpr int kSoftmaxRegs = 8;

// Reduction over aligned groups of `width` lanes (a power of two <= 32).
// The whole warp must call it: every lane takes part in the shuffles.
template <typename T, typename Op>
__device__ __forceinline__ T group_reduce(T v, Op op, int width) {
    for (int offset = width >> 1; offset > 0; offset >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

template <typename T>
__device__ __forceinline__ void softmax_groups(const T* m, T* out, long long rows,
                                               long long cols) {
    constexpr int R = kSoftmaxRegs;
    int width = 1;
    while ((long long)width * R < cols) width <<= 1;
    const int lane = threadIdx.x & 31;
    const int sub = lane & (width - 1);  // lane within its group
    const long long per_warp = 32 / width;  // rows per warp and trip
    const long long warp = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const long long nwarps = (long long)gridDim.x * (blockDim.x >> 5);
    const T ninf = -dm::infinity<T>();
    // The trip count depends only on the warp, so all its lanes stay in the
    // loop together; groups past the last row compute on padding.
    for (long long base = warp * per_warp; base < rows; base += nwarps * per_warp) {
        const long long r = base + lane / width;
        const bool live = r < rows;
        const T* x = m + (live ? r : 0) * cols;
        T* y = out + (live ? r : 0) * cols;
        T v[R];
        T mx = ninf;
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const long long j = sub + (long long)k * width;
            v[k] = live && j < cols ? x[j] : ninf;
            mx = dm::fmax(mx, v[k]);
        }
        mx = group_reduce(mx, MaxOp{}, width);
        T s = T(0);
#pragma unroll
        for (int k = 0; k < R; ++k) {
            // Padding holds -inf: exp(-inf - mx) = 0 adds nothing.
            if ((long long)k * width < cols) {
                v[k] = dm::exp(v[k] - mx);
                s += v[k];
            }
        }
        s = group_reduce(s, SumOp{}, width);
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const long long j = sub + (long long)k * width;
            if (live && j < cols) y[j] = v[k] / s;
        }
    }
}

// One block per row, the row in registers.
template <typename T>
__device__ __forceinline__ void softmax_block_cached(const T* m, T* out, long long rows,
                                                     long long cols, T* scratch) {
    constexpr int R = kSoftmaxRegs;
    const T ninf = -dm::infinity<T>();
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* x = m + r * cols;
        T* y = out + r * cols;
        T v[R];
        T mx = ninf;
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const long long j = threadIdx.x + (long long)k * blockDim.x;
            v[k] = j < cols ? x[j] : ninf;
            mx = dm::fmax(mx, v[k]);
        }
        mx = block_reduce(mx, MaxOp{}, ninf, scratch);
        T s = T(0);
#pragma unroll
        for (int k = 0; k < R; ++k) {
            if ((long long)k * blockDim.x < cols) {
                v[k] = dm::exp(v[k] - mx);
                s += v[k];
            }
        }
        s = block_reduce(s, SumOp{}, T(0), scratch);
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const long long j = threadIdx.x + (long long)k * blockDim.x;
            if (j < cols) y[j] = v[k] / s;
        }
    }
}

// Calls f(x[j]) for this thread's share of the row x[0, cols), by packets
// when the row is 16-byte aligned and cols % VEC == 0.
template <typename T, typename F>
__device__ __forceinline__ void visit_row(const T* x, long long cols, bool packets, F f) {
    if (packets) {
        for (long long p = threadIdx.x; p < cols / kVec<T>; p += blockDim.x) {
            const Packet<T> v = load_packet(x, p);
#pragma unroll
            for (int k = 0; k < kVec<T>; ++k) f(v.v[k]);
        }
    } else {
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) f(x[j]);
    }
}

template <typename T>
__device__ __forceinline__ void softmax_three_pass(const T* m, T* out, long long rows,
                                                   long long cols, T* scratch) {
    const T ninf = -dm::infinity<T>();
    // Every row starts on a boundary if the first does and cols % VEC == 0.
    const bool packets = cols % kVec<T> == 0 && is_aligned16(m) && is_aligned16(out);
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* x = m + r * cols;
        T* y = out + r * cols;
        T mx = ninf;
        visit_row(x, cols, packets, [&](T v) { mx = dm::fmax(mx, v); });
        mx = block_reduce(mx, MaxOp{}, ninf, scratch);
        T s = T(0);
        visit_row(x, cols, packets, [&](T v) { s += dm::exp(v - mx); });
        s = block_reduce(s, SumOp{}, T(0), scratch);
        if (packets) {
            for (long long p = threadIdx.x; p < cols / kVec<T>; p += blockDim.x) {
                Packet<T> v = load_packet(x, p);
#pragma unroll
                for (int k = 0; k < kVec<T>; ++k) v.v[k] = dm::exp(v.v[k] - mx) / s;
                store_packet(y, p, v);
            }
        } else {
            for (long long j = threadIdx.x; j < cols; j += blockDim.x)
                y[j] = dm::exp(x[j] - mx) / s;
        }
    }
}

template <typename T>
__device__ __forceinline__ void softmax_rows(const T* m, T* out, long long rows, long long cols) {
    __shared__ T scratch[32];
    if (cols <= 32 * kSoftmaxRegs)
        softmax_groups(m, out, rows, cols);
    else if (cols <= (long long)blockDim.x * kSoftmaxRegs)
        softmax_block_cached(m, out, rows, cols, scratch);
    else
        softmax_three_pass(m, out, rows, cols, scratch);
}

// ------------------------------------------------------------- indexing

// True when x is a valid index into [0, cols); then *j is its truncation.
// The integer test after the float one guards against T(cols) rounding up.
template <typename T>
__device__ __forceinline__ bool valid_index(T x, long long cols, long long* j) {
    if (!(x >= T(0) && x < T(cols))) return false;
    *j = (long long)x;
    return *j < cols;
}

// out may be v: v[i] is read before out[i] is written, by the same thread.
template <typename T>
__device__ __forceinline__ void index_m_by_v(const T* m, const T* v, T* out, long long rows,
                                             long long cols) {
    const long long stride = grid_stride();
    for (long long i = grid_thread(); i < rows; i += stride) {
        long long j;
        out[i] = valid_index(v[i], cols, &j) ? m[i * cols + j] : dm::quiet_nan<T>();
    }
}

// What binarize_v's batched loop carries from its load to its store: the
// row's index value and the (packet) column.  The arithmetic waits for the
// store step, so that all loads of a batch are in flight together.
template <typename T>
struct RowPick {
    T index;
    long long col;
};

// out[i, j] = 1 where j is row i's valid index, else 0.  Rows come from a
// MixedRadix counter; with cols % VEC == 0 and out aligned, a packet never
// straddles rows and goes out as one 16-byte store.
template <typename T>
__device__ __forceinline__ void binarize_v(const T* v, T* out, long long rows, long long cols) {
    constexpr int W = kVec<T>;
    const long long total = rows * cols;
    if (total <= 0) return;
    const long long start = grid_thread(), stride = grid_stride();
    const auto pick = [&](long long, const MixedRadix& c) { return RowPick<T>{v[c.d1], c.d0}; };
    if (cols % W == 0 && is_aligned16(out)) {
        MixedRadix ij(start, stride, cols / W, rows);  // d1 = row, d0 = packet column
        batched_loop<4>(0, total / W, ij, pick, [&](long long p, const RowPick<T>& x) {
            long long hot;
            if (!valid_index(x.index, cols, &hot)) hot = -1;
            Packet<T> r;
#pragma unroll
            for (int k = 0; k < W; ++k) r.v[k] = x.col * W + k == hot ? T(1) : T(0);
            store_packet(out, p, r);
        });
    } else {
        MixedRadix ij(start, stride, cols, rows);  // d1 = row, d0 = column
        batched_loop<4>(0, total, ij, pick, [&](long long e, const RowPick<T>& x) {
            long long hot;
            out[e] = valid_index(x.index, cols, &hot) && hot == x.col ? T(1) : T(0);
        });
    }
}

}  // namespace sh

// ------------------------------------------------------------- exported kernels

SH_EXPORT(softmax_rows, (const T* m, T* out, long long rows, long long cols),
          sh::softmax_rows(m, out, rows, cols))
SH_EXPORT(index_m_by_v, (const T* m, const T* v, T* out, long long rows, long long cols),
          sh::index_m_by_v(m, v, out, rows, cols))
SH_EXPORT(binarize_v, (const T* v, T* out, long long rows, long long cols),
          sh::binarize_v(v, out, rows, cols))
