// Row-wise kernels on a matrix (rows, cols): indexing by a vector of
// float-coded indices, one-hot encoding, and gathering rows of a table by such
// indices and the gradient of that (scatter-add).  Softmax and the rows of
// LayerNorm are fused-op programs (handlers/fused_rows.py), generated.
//
// Every kernel exists as name_f32 (float), name_f64 (double), name_bf16 and
// name_f16.  The half formats compute in float (C = compute_t<T>): values are
// widened with ld() as they are loaded and each result is rounded once with
// st<T>() as it is stored.  Sizes are passed as long long.  Launch: 1-D grid
// of 1-D blocks.
//   index_m_by_v   grid-stride over rows; any grid and block size.
//   binarize_v     grid-stride over rows * cols elements; any grid and block.
//   gather_rows    grid-stride over n * d elements; any grid and block.
//   scatter_add_rows  a warp per 32 columns and owner of rows: at least
//                  ceil(d / 32) * owners warps, blocks of whole warps.
//
// An index v[i] is valid when 0 <= v[i] < cols, tested on the floating-point
// value widened to C (NaN fails both tests), and is then truncated toward
// zero.  Index arrays have the handler's format T: bfloat16 holds every whole
// number only up to 256, float16 up to 2048 (float32 up to 2^24).
#include "common.cuh"

namespace sh {

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
// Each element of out receives its additions in the order of i, with no
// atomics: the result is the same bits on every run (captured graphs are
// compared bit for bit with eager runs) and equals NumPy's ufunc.at.  Rows of
// out are dealt to `owners` warps per 32 columns: row j to owner j % owners.
// Every warp reads all of idx, 32 at a time (one index a lane, a ballot of
// those it owns), and adds the rows it owns in the order of i, lane = column,
// so every access of a step is coalesced.  The work that must stay in order
// is then per row, not per column: the dependent read-modify-writes of one
// warp are n / owners on average rather than n (one thread per column
// walking every i took 1.43 ms for the gradient of a 128 x 512 table from
// 8192 indices on an H200), while the extra reading of idx costs each warp
// n / 32 ballots.  Grid: at least ceil(d / 32) * owners warps (extra whole
// warps exit); blocks a multiple of 32 threads.  out must not overlap a or
// idx.
// Half formats: each addition is computed in float and rounded to T as it is
// stored in out's format O.  O is T, or the compute format (the wide
// kernel): the half formats' host path widens out into a float buffer, adds
// there and rounds once at the end (PyCudaHandler._scatter_add_rows), so
// a row hit k times is rounded once, not k times.
template <typename T, typename O>
__device__ __forceinline__ void scatter_add_rows(const T* __restrict__ a,
                                                 const T* __restrict__ idx, O* out, long long n,
                                                 long long vocab, long long d, long long owners) {
    using C = compute_t<T>;
    const long long slices = (d + 31) / 32, warp = grid_thread() / 32;
    if (warp >= slices * owners) return;   // the whole warp: the ballots need all lanes
    const int lane = threadIdx.x & 31;
    const long long mine = warp / slices, c = (warp % slices) * 32 + lane;
    for (long long i0 = 0; i0 < n; i0 += 32) {
        long long j = -1;
        if (i0 + lane < n && valid_index(ld(idx[i0 + lane]), vocab, &j) && j % owners != mine)
            j = -1;
        for (unsigned hits = __ballot_sync(0xffffffffu, j >= 0); hits; hits &= hits - 1) {
            const int k = __ffs(hits) - 1;
            const long long row = __shfl_sync(0xffffffffu, j, k);
            if (c < d) {
                O& o = out[row * d + c];
                o = st<O>(ld(a[(i0 + k) * d + c]) + ld(o));
            }
        }
    }
}

}  // namespace sh

// ------------------------------------------------------------- exported kernels

SH_EXPORT(index_m_by_v, (const T* m, const T* v, T* out, long long rows, long long cols),
          sh::index_m_by_v(m, v, out, rows, cols))
SH_EXPORT(binarize_v, (const T* v, T* out, long long rows, long long cols),
          sh::binarize_v(v, out, rows, cols))
SH_EXPORT(gather_rows, (const T* table, const T* idx, T* out, long long n, long long vocab,
                        long long d),
          sh::gather_rows(table, idx, out, n, vocab, d))
SH_EXPORT(scatter_add_rows, (const T* a, const T* idx, T* out, long long n, long long vocab,
                             long long d, long long owners),
          sh::scatter_add_rows(a, idx, out, n, vocab, d, owners))
SH_EXPORT(scatter_add_rows_wide, (const T* a, const T* idx, C* out, long long n,
                                  long long vocab, long long d, long long owners),
          sh::scatter_add_rows(a, idx, out, n, vocab, d, owners))
