// Row-wise kernels on a matrix (rows, cols): softmax, indexing by a vector of
// float-coded indices, one-hot encoding, and gathering rows of a table by such
// indices and the gradient of that (scatter-add).
//
// Every kernel exists as name_f32 (float), name_f64 (double), name_bf16 and
// name_f16.  The half formats compute in float (C = compute_t<T>): values are
// widened with ld() as they are loaded, reductions (row max, sums, means,
// variances) are carried in float, in registers, shuffles and shared memory,
// and each result is rounded once with st<T>() as it is stored.  Scalars
// (eps) are passed in C, sizes as long long.  Launch: 1-D grid of 1-D blocks.
//   softmax_rows   grid-stride over rows (rows go to lane groups or to whole
//                  blocks, see below), so any grid size works; the block
//                  size must be a multiple of 32, at most 1024.  The host
//                  uses block = SH_BLOCK and min(rows, SH_MAX_BLOCKS_PER_SM *
//                  SMs) blocks: as fast as a block per row for long rows and
//                  several times faster for rows of up to 256 elements, where
//                  a warp takes several rows and most of a grid of `rows`
//                  blocks would sit idle.
//   index_m_by_v   grid-stride over rows; any grid and block size.
//   binarize_v     grid-stride over rows * cols elements; any grid and block.
//   gather_rows    grid-stride over n * d elements; any grid and block.
//   scatter_add_rows  one thread per column: at least ceil(d / block) blocks.
//   normalize_rows(_backward)  a warp per row, grid-stride; block a multiple of 32.
//
// An index v[i] is valid when 0 <= v[i] < cols, tested on the floating-point
// value widened to C (NaN fails both tests), and is then truncated toward
// zero.  Index arrays have the handler's format T: bfloat16 holds every whole
// number only up to 256, float16 up to 2048 (float32 up to 2^24).
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
    using C = compute_t<T>;
    constexpr int R = kSoftmaxRegs;
    int width = 1;
    while ((long long)width * R < cols) width <<= 1;
    const int lane = threadIdx.x & 31;
    const int sub = lane & (width - 1);  // lane within its group
    const long long per_warp = 32 / width;  // rows per warp and trip
    const long long warp = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const long long nwarps = (long long)gridDim.x * (blockDim.x >> 5);
    const C ninf = -dm::infinity<C>();
    // The trip count depends only on the warp, so all its lanes stay in the
    // loop together; groups past the last row compute on padding.
    for (long long base = warp * per_warp; base < rows; base += nwarps * per_warp) {
        const long long r = base + lane / width;
        const bool live = r < rows;
        const T* x = m + (live ? r : 0) * cols;
        T* y = out + (live ? r : 0) * cols;
        C v[R];
        C mx = ninf;
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const long long j = sub + (long long)k * width;
            v[k] = live && j < cols ? ld(x[j]) : ninf;
            mx = dm::fmax(mx, v[k]);
        }
        mx = group_reduce(mx, MaxOp{}, width);
        C s = C(0);
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
            if (live && j < cols) y[j] = st<T>(v[k] / s);
        }
    }
}

// One block per row, the row in registers.
template <typename T>
__device__ __forceinline__ void softmax_block_cached(const T* m, T* out, long long rows,
                                                     long long cols, compute_t<T>* scratch) {
    using C = compute_t<T>;
    constexpr int R = kSoftmaxRegs;
    const C ninf = -dm::infinity<C>();
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* x = m + r * cols;
        T* y = out + r * cols;
        C v[R];
        C mx = ninf;
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const long long j = threadIdx.x + (long long)k * blockDim.x;
            v[k] = j < cols ? ld(x[j]) : ninf;
            mx = dm::fmax(mx, v[k]);
        }
        mx = block_reduce(mx, MaxOp{}, ninf, scratch);
        C s = C(0);
#pragma unroll
        for (int k = 0; k < R; ++k) {
            if ((long long)k * blockDim.x < cols) {
                v[k] = dm::exp(v[k] - mx);
                s += v[k];
            }
        }
        s = block_reduce(s, SumOp{}, C(0), scratch);
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const long long j = threadIdx.x + (long long)k * blockDim.x;
            if (j < cols) y[j] = st<T>(v[k] / s);
        }
    }
}

// Calls f(x[j]) (widened to the compute format) for this thread's share of
// the row x[0, cols), by packets when the row is 16-byte aligned and
// cols % VEC == 0.
template <typename T, typename F>
__device__ __forceinline__ void visit_row(const T* x, long long cols, bool packets, F f) {
    if (packets) {
        for (long long p = threadIdx.x; p < cols / kVec<T>; p += blockDim.x) {
            const Packet<T> v = load_packet(x, p);
#pragma unroll
            for (int k = 0; k < kVec<T>; ++k) f(v.v[k]);
        }
    } else {
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) f(ld(x[j]));
    }
}

template <typename T>
__device__ __forceinline__ void softmax_three_pass(const T* m, T* out, long long rows,
                                                   long long cols, compute_t<T>* scratch) {
    using C = compute_t<T>;
    const C ninf = -dm::infinity<C>();
    // Every row starts on a boundary if the first does and cols % VEC == 0.
    const bool packets = cols % kVec<T> == 0 && is_aligned16(m) && is_aligned16(out);
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* x = m + r * cols;
        T* y = out + r * cols;
        C mx = ninf;
        visit_row(x, cols, packets, [&](C v) { mx = dm::fmax(mx, v); });
        mx = block_reduce(mx, MaxOp{}, ninf, scratch);
        C s = C(0);
        visit_row(x, cols, packets, [&](C v) { s += dm::exp(v - mx); });
        s = block_reduce(s, SumOp{}, C(0), scratch);
        if (packets) {
            for (long long p = threadIdx.x; p < cols / kVec<T>; p += blockDim.x) {
                Packet<T> v = load_packet(x, p);
#pragma unroll
                for (int k = 0; k < kVec<T>; ++k) v.v[k] = dm::exp(v.v[k] - mx) / s;
                store_packet(y, p, v);
            }
        } else {
            for (long long j = threadIdx.x; j < cols; j += blockDim.x)
                y[j] = st<T>(dm::exp(ld(x[j]) - mx) / s);
        }
    }
}

template <typename T>
__device__ __forceinline__ void softmax_rows(const T* m, T* out, long long rows, long long cols) {
    __shared__ compute_t<T> scratch[32];  // partial max / sum per warp, in C
    if (cols <= 32 * kSoftmaxRegs)
        softmax_groups(m, out, rows, cols);
    else if (cols <= (long long)blockDim.x * kSoftmaxRegs)
        softmax_block_cached(m, out, rows, cols, scratch);
    else
        softmax_three_pass(m, out, rows, cols, scratch);
}

// ------------------------------------------------------------- indexing

// True when x (an index widened to C with ld) is a valid index into
// [0, cols); then *j is its truncation.  The integer test after the float one
// guards against C(cols) rounding up.
template <typename C>
__device__ __forceinline__ bool valid_index(C x, long long cols, long long* j) {
    if (!(x >= C(0) && x < C(cols))) return false;
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
        // The element is copied as stored (no widening needed); NaN is rounded from C.
        out[i] = valid_index(ld(v[i]), cols, &j) ? m[i * cols + j]
                                                 : st<T>(dm::quiet_nan<compute_t<T>>());
    }
}

// What binarize_v's batched loop carries from its load to its store: the
// row's index value (as stored, widened in the store step) and the (packet)
// column.  The arithmetic waits for the store step, so that all loads of a
// batch are in flight together.
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
    using C = compute_t<T>;
    constexpr int W = kVec<T>;
    const long long total = rows * cols;
    if (total <= 0) return;
    const long long start = grid_thread(), stride = grid_stride();
    const auto pick = [&](long long, const MixedRadix& c) { return RowPick<T>{v[c.d1], c.d0}; };
    if (cols % W == 0 && is_aligned16(out)) {
        MixedRadix ij(start, stride, cols / W, rows);  // d1 = row, d0 = packet column
        batched_loop<4>(0, total / W, ij, pick, [&](long long p, const RowPick<T>& x) {
            long long hot;
            if (!valid_index(ld(x.index), cols, &hot)) hot = -1;
            Packet<T> r;
#pragma unroll
            for (int k = 0; k < W; ++k) r.v[k] = x.col * W + k == hot ? C(1) : C(0);
            store_packet(out, p, r);
        });
    } else {
        MixedRadix ij(start, stride, cols, rows);  // d1 = row, d0 = column
        batched_loop<4>(0, total, ij, pick, [&](long long e, const RowPick<T>& x) {
            long long hot;
            out[e] = st<T>(valid_index(ld(x.index), cols, &hot) && hot == x.col ? C(1) : C(0));
        });
    }
}

// ------------------------------------------------------------- row gather and scatter-add
//
// table (vocab, d); rows (n, d); idx (n) float-coded row indices, valid as in
// valid_index with cols = vocab.  Neither kernel touches memory outside
// table, rows and idx, whatever idx holds.

// out[i, :] = table[idx[i], :], NaN for an invalid index.  Elements are
// copied as stored (T, no widening: a copy is exact).  Grid-stride over
// the n * d elements of out; any grid and block size.  out must not overlap
// table or idx (the op table's rule), so loads may be batched ahead of stores.
template <typename T>
__device__ __forceinline__ void gather_rows(const T* __restrict__ table,
                                            const T* __restrict__ idx, T* __restrict__ out,
                                            long long n, long long vocab, long long d) {
    const long long total = n * d;
    if (total <= 0) return;
    MixedRadix ij(grid_thread(), grid_stride(), d, n);  // d1 = row of out, d0 = column
    batched_loop<4>(0, total, ij,
                    [&](long long, const MixedRadix& c) {
                        long long j;
                        return valid_index(ld(idx[c.d1]), vocab, &j)
                                   ? table[j * d + c.d0]
                                   : st<T>(dm::quiet_nan<compute_t<T>>());
                    },
                    [&](long long e, T x) { out[e] = x; });
}

// out[idx[i], :] += a[i, :] for i = 0, 1, ..., n-1, skipping invalid indices.
// One thread per column c walks every i in order, so each element of out
// receives its additions in the order of i, with no atomics: the result is
// the same bits on every run (captured graphs are compared bit for bit with
// eager runs) and equals NumPy's ufunc.at.  The price is n dependent steps on
// only d threads: about 0.2 us per index on an H100 whatever d (up to a few
// hundred), e.g. 0.23 ms for 1024 indices, 0.84 ms for 4096, 17 ms for 65536.
// A batch's loads of idx and a are issued first so that only the
// read-modify-writes of out stay serial.  (Also loading the batch's out
// values ahead and replaying repeats in registers measured slower.)  Threads
// of a warp take adjacent columns: every access of a step is coalesced.
// Grid: at least ceil(d / blockDim.x) blocks (extra threads exit).  out must
// not overlap a or idx.
// Half formats: each addition is computed in float and rounded to T as it is
// stored in out's format O.  O is T, or the compute format (the wide
// kernel): the half formats' host path widens out into a float buffer, adds
// there and rounds once at the end (PyCudaHandler._scatter_add_rows), so
// a row hit k times is rounded once, not k times.
template <typename T, typename O>
__device__ __forceinline__ void scatter_add_rows(const T* __restrict__ a,
                                                 const T* __restrict__ idx, O* out, long long n,
                                                 long long vocab, long long d) {
    using C = compute_t<T>;
    constexpr int kBatch = 8;
    const long long c = grid_thread();
    if (c >= d) return;
    for (long long i0 = 0; i0 < n; i0 += kBatch) {
        long long row[kBatch];
        C add[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const long long i = i0 + k;
            row[k] = -1;
            add[k] = C(0);
            if (i < n) {
                long long j;
                if (valid_index(ld(idx[i]), vocab, &j)) {
                    row[k] = j;
                    add[k] = ld(a[i * d + c]);
                }
            }
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k)
            if (row[k] >= 0) {
                O& o = out[row[k] * d + c];
                o = st<O>(add[k] + ld(o));
            }
    }
}

// ------------------------------------------------------------- row normalization
//
// LayerNorm's row work: one warp per row (grid-stride over rows by warps, so
// any grid works; the block size must be a multiple of 32).  A warp's trip
// count depends only on the warp, so its lanes stay in the loop together for
// the shuffles.  Each lane strides over the row; sums are in C (float for
// the half formats), reduced by shuffles in a fixed order (the same bits on
// every run).  Rows are read again for each pass rather than kept: d is
// unbounded.

// rstd[r] = 1 / sqrt(mean((x - mean)^2) + eps), xhat = (x - mean) * rstd.
// The variance is summed from centred values (two passes), which stays
// accurate when the mean is large next to the spread.  xhat is computed from
// the unrounded float rstd; rstd is rounded to T only as it is stored.
template <typename T, typename C = compute_t<T>>
__device__ __forceinline__ void normalize_rows(const T* x, C eps, T* xhat, T* rstd,
                                               long long rows, long long d) {
    const int lane = threadIdx.x & 31;
    const long long warp = grid_thread() >> 5, nwarps = grid_stride() >> 5;
    for (long long r = warp; r < rows; r += nwarps) {
        const T* xr = x + r * d;
        C s = C(0);
        for (long long j = lane; j < d; j += 32) s += ld(xr[j]);
        const C mean = group_reduce(s, SumOp{}, 32) / C(d);
        C q = C(0);
        for (long long j = lane; j < d; j += 32) {
            const C c = ld(xr[j]) - mean;
            q += c * c;
        }
        const C inv = C(1) / dm::sqrt(group_reduce(q, SumOp{}, 32) / C(d) + eps);
        T* yr = xhat + r * d;
        for (long long j = lane; j < d; j += 32) yr[j] = st<T>((ld(xr[j]) - mean) * inv);
        if (lane == 0) rstd[r] = st<T>(inv);
    }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) per row.
template <typename T>
__device__ __forceinline__ void normalize_rows_backward(const T* xhat, const T* rstd, const T* g,
                                                        T* dx, long long rows, long long d) {
    using C = compute_t<T>;
    const int lane = threadIdx.x & 31;
    const long long warp = grid_thread() >> 5, nwarps = grid_stride() >> 5;
    for (long long r = warp; r < rows; r += nwarps) {
        const T* hr = xhat + r * d;
        const T* gr = g + r * d;
        C s1 = C(0), s2 = C(0);
        for (long long j = lane; j < d; j += 32) {
            const C gj = ld(gr[j]);
            s1 += gj;
            s2 += gj * ld(hr[j]);
        }
        const C m1 = group_reduce(s1, SumOp{}, 32) / C(d);
        const C m2 = group_reduce(s2, SumOp{}, 32) / C(d);
        const C inv = ld(rstd[r]);
        T* out = dx + r * d;
        for (long long j = lane; j < d; j += 32)
            out[j] = st<T>(inv * (ld(gr[j]) - m1 - ld(hr[j]) * m2));
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
SH_EXPORT(gather_rows, (const T* table, const T* idx, T* out, long long n, long long vocab,
                        long long d),
          sh::gather_rows(table, idx, out, n, vocab, d))
SH_EXPORT(scatter_add_rows, (const T* a, const T* idx, T* out, long long n, long long vocab,
                             long long d),
          sh::scatter_add_rows(a, idx, out, n, vocab, d))
SH_EXPORT(scatter_add_rows_wide, (const T* a, const T* idx, C* out, long long n,
                                  long long vocab, long long d),
          sh::scatter_add_rows(a, idx, out, n, vocab, d))
SH_EXPORT(normalize_rows, (const T* x, C eps, T* xhat, T* rstd, long long rows, long long d),
          sh::normalize_rows(x, eps, xhat, rstd, rows, d))
SH_EXPORT(normalize_rows_backward, (const T* xhat, const T* rstd, const T* g, T* dx,
                                    long long rows, long long d),
          sh::normalize_rows_backward(xhat, rstd, g, dx, rows, d))
