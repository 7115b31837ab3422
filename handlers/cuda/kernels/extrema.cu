// Largest, smallest and arg-largest element along one axis: max_t, min_t,
// argmax_t.
//
// The host views the input as (outer, n, inner), like sum_t, and the output
// as (outer, inner); n >= 1.  `kind` is 0 (max), 1 (min) or 2 (argmax: the
// index, stored as a T).  NaN wins, as in NumPy: a slice holding NaN gives
// NaN, and argmax the index of its first NaN.  Among equal values the first
// index wins.  Results do not depend on the grid.
//
// Half formats (bf16, f16): values are compared widened to float (ld, exact)
// and kept in their storage format, so max and min return the chosen element
// bit for bit (NaN payloads included) and the workspace wv holds elements of
// T.  argmax stores st<T>(index): the host checks beforehand that every
// index is exact in T (up to 256 for bf16, 2048 for f16).
//
//   extreme_rows  inner == 1: one warp per row, lanes striding along it, then
//                 a shuffle reduction of (value, index) pairs.
//   extreme_cols  inner > 1: one thread per output column and chunk of n,
//                 walking down its rows; adjacent threads read adjacent
//                 columns (coalesced).  Few columns over many rows split n
//                 into chunks, whose picks go to a workspace (values and
//                 int64 indices) that extreme_join combines in chunk order.
//
// Launch: 1-D grid of 1-D blocks (a multiple of 32 threads for extreme_rows);
// any grid size is correct.
#include "common.cuh"

namespace sh {

// Is (v, i) a better pick than (w, j) for `kind`?  NaN beats numbers; ties
// go to the smaller index.  v and w are compute-format values.
template <typename C>
__device__ __forceinline__ bool better(int kind, C v, long long i, C w, long long j) {
    const bool vn = v != v, wn = w != w;
    if (vn || wn) return vn && (!wn || i < j);
    if (v == w) return i < j;
    return kind == 1 ? v < w : v > w;
}

// The output for pick (v, i): the element v itself, or for argmax its index
// rounded to T.
template <typename T>
__device__ __forceinline__ T result(int kind, T v, long long i) {
    return kind == 2 ? st<T>((compute_t<T>)i) : v;
}

template <typename T>
__device__ void extreme_rows_impl(const T* __restrict__ a, T* __restrict__ out,
                                  long long rows, long long n, int kind) {
    const int lane = threadIdx.x & 31;
    const long long nwarps = grid_stride() >> 5;
    for (long long row = grid_thread() >> 5; row < rows; row += nwarps) {
        const T* p = a + row * n;
        // Every lane starts from a real element when it has one; lanes past
        // the end of a short row hold element 0, which never loses a tie.
        long long best_i = lane < n ? lane : 0;
        T best = p[best_i];
        for (long long k = best_i + 32; k < n; k += 32) {
            const T v = p[k];
            if (better(kind, ld(v), k, ld(best), best_i)) { best = v; best_i = k; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const T w = __shfl_down_sync(0xffffffffu, best, o);
            const long long j = __shfl_down_sync(0xffffffffu, best_i, o);
            if (better(kind, ld(w), j, ld(best), best_i)) { best = w; best_i = j; }
        }
        if (lane == 0) out[row] = result(kind, best, best_i);
    }
}

// Thread t < outer * inner * chunks owns column c of slab o over the rows of
// chunk ch (t = (ch * outer + o) * inner + c): it writes that stretch's pick
// to wv[t] and its index to wi[t].  With chunks == 1 it writes the result to
// out instead.
template <typename T>
__device__ void extreme_cols_impl(const T* __restrict__ a, T* __restrict__ out,
                                  T* __restrict__ wv, long long* __restrict__ wi,
                                  long long outer, long long n, long long inner,
                                  long long chunk, long long chunks, int kind) {
    const long long cols = outer * inner, total = cols * chunks;
    for (long long t = grid_thread(); t < total; t += grid_stride()) {
        const long long ch = t / cols, oc = t - ch * cols;
        const long long o = oc / inner, c = oc - o * inner;
        const long long begin = ch * chunk, end = min(n, begin + chunk);
        const T* p = a + o * n * inner + c;
        T best = p[begin * inner];
        long long best_i = begin;
        for (long long k = begin + 1; k < end; ++k) {
            const T v = p[k * inner];
            if (better(kind, ld(v), k, ld(best), best_i)) { best = v; best_i = k; }
        }
        if (chunks == 1) {
            out[t] = result(kind, best, best_i);
        } else {
            wv[t] = best;
            wi[t] = best_i;
        }
    }
}

// Combines the chunks' picks of each of the `cols` columns, in chunk order.
template <typename T>
__device__ void extreme_join_impl(const T* __restrict__ wv, const long long* __restrict__ wi,
                                  T* __restrict__ out, long long cols, long long chunks,
                                  int kind) {
    for (long long c = grid_thread(); c < cols; c += grid_stride()) {
        T best = wv[c];
        long long best_i = wi[c];
        for (long long ch = 1; ch < chunks; ++ch) {
            const T v = wv[ch * cols + c];
            const long long i = wi[ch * cols + c];
            if (better(kind, ld(v), i, ld(best), best_i)) { best = v; best_i = i; }
        }
        out[c] = result(kind, best, best_i);
    }
}

}  // namespace sh

SH_EXPORT(extreme_rows, (const T* a, T* out, long long rows, long long n, int kind),
          sh::extreme_rows_impl<T>(a, out, rows, n, kind))
SH_EXPORT(extreme_cols, (const T* a, T* out, T* wv, long long* wi, long long outer, long long n,
                         long long inner, long long chunk, long long chunks, int kind),
          sh::extreme_cols_impl<T>(a, out, wv, wi, outer, n, inner, chunk, chunks, kind))
SH_EXPORT(extreme_join, (const T* wv, const long long* wi, T* out, long long cols,
                         long long chunks, int kind),
          sh::extreme_join_impl<T>(wv, wi, out, cols, chunks, kind))
