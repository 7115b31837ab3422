// Moving elements between layouts: transpose_m, permute_t, concat_t and split_t.
//
//   transpose   out (cols, rows) = a (rows, cols).T through 32x32 tiles in
//               shared memory (one padding column: no bank conflicts), so
//               both the reads and the writes are coalesced.  Blocks of
//               exactly SH_BLOCK threads, 32 x SH_ROWS_PER_BLOCK: warp y
//               moves tile rows y, y + SH_ROWS_PER_BLOCK, ...; any grid size
//               (tiles are grid-strided).
//   copy2d      dst[r * dst_ld + dst_off + c] = src[r * src_ld + src_off + c]
//               for r < rows, c < cols: a block of columns of a row-major
//               matrix into another.  concat_t and split_t along an axis view
//               their arrays as (outer, axis length * inner) and copy each
//               piece's columns.  Grid-stride over rows * cols elements.
//   cast_from_<src>  dst[i] = src[i] converted from format <src> (f32, f64,
//               bf16, f16) to T, through T's compute format (cast_t): into
//               float32 or float64 one rounding at most; into a half format
//               one rounding from float32 or a half, and from float64 through
//               float32 (two, as NumPy's reference path does).  Grid-stride
//               over n elements, eight at a time where aligned.
//
//   permute     out = a's axes reordered (up to 4): a gather per element of
//               out, a's stride for each of out's axes.  Grid-stride.  Where
//               the permutation keeps the last axis, the host passes
//               extents and strides in units of `unit` bytes (16, 8 or 4,
//               dividing the last axis's bytes, both arrays aligned to it)
//               and a unit moves as one vector: a 2-byte element at a time
//               moved attention's heads at a fifth of copy bandwidth.
//
// transpose, permute and copy2d move elements without arithmetic, so they copy T as
// stored in every format (2-byte elements for the halves).
#include "common.cuh"

namespace sh {

template <typename T>
__device__ void transpose_impl(const T* __restrict__ a, T* __restrict__ out, long long rows,
                               long long cols) {
    __shared__ T tile[32][33];
    const long long tiles_r = (rows + 31) / 32, tiles_c = (cols + 31) / 32;
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;   // 32 x SH_ROWS_PER_BLOCK
    for (long long t = blockIdx.x; t < tiles_r * tiles_c; t += gridDim.x) {
        const long long r0 = (t / tiles_c) * 32, c0 = (t % tiles_c) * 32;
        for (int k = ty; k < 32; k += SH_ROWS_PER_BLOCK) {
            const long long r = r0 + k, c = c0 + tx;
            if (r < rows && c < cols) tile[k][tx] = a[r * cols + c];
        }
        __syncthreads();
        for (int k = ty; k < 32; k += SH_ROWS_PER_BLOCK) {
            const long long r = c0 + k, c = r0 + tx;   // out row = a column
            if (r < cols && c < rows) out[r * rows + c] = tile[tx][k];
        }
        __syncthreads();   // the tile is free for the next one
    }
}

template <typename T>
__device__ void copy2d_impl(const T* __restrict__ src, T* __restrict__ dst, long long rows,
                            long long cols, long long src_ld, long long src_off,
                            long long dst_ld, long long dst_off) {
    const long long n = rows * cols;
    for (long long e = grid_thread(); e < n; e += grid_stride()) {
        const long long r = e / cols, c = e - r * cols;
        dst[r * dst_ld + dst_off + c] = src[r * src_ld + src_off + c];
    }
}

// out (e0, e1, e2, e3) from a, out's axis i stepping a by s_i elements of U:
// each thread finds its element's four indices and gathers it.  Writes are
// coalesced; reads are too along the axes a permutation keeps innermost
// (attention's head size), strided otherwise.
template <typename T>
__device__ void permute_impl(const T* __restrict__ a, T* __restrict__ out, long long n,
                             long long e0, long long e1, long long e2, long long e3,
                             long long s0, long long s1, long long s2, long long s3) {
    for (long long e = grid_thread(); e < n; e += grid_stride()) {
        long long r = e;
        const long long i3 = r % e3;
        r /= e3;
        const long long i2 = r % e2;
        r /= e2;
        const long long i1 = r % e1;
        const long long i0 = r / e1;
        out[e] = a[i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3];
    }
}

// S -> D through D's compute format: the cast to it rounds (float64 into
// float32, or into a half's float), then st<D> rounds into a half format.
// Eight elements a trip where both ends are aligned to eight of theirs: a
// half moved 2 bytes at a time kept the mixed-precision master casts at
// about two thirds of copy bandwidth.
template <typename S, typename D>
__device__ void cast_impl(const S* __restrict__ src, D* __restrict__ dst, long long n) {
    constexpr int N = 8;
    long long done = 0;
    if (is_aligned_to(src, N * sizeof(S)) && is_aligned_to(dst, N * sizeof(D))) {
        const long long packets = n / N;
        for (long long p = grid_thread(); p < packets; p += grid_stride()) {
            const Lanes<compute_t<S>, N> a = load_lanes<N>(src, p);
            Lanes<compute_t<D>, N> b;
#pragma unroll
            for (int k = 0; k < N; ++k) b.v[k] = static_cast<compute_t<D>>(a.v[k]);
            store_lanes<N>(dst, p, b);
        }
        done = packets * N;
    }
    for (long long e = done + grid_thread(); e < n; e += grid_stride())
        dst[e] = st<D>(static_cast<compute_t<D>>(ld(src[e])));
}

}  // namespace sh

SH_EXPORT(transpose, (const T* a, T* out, long long rows, long long cols),
          sh::transpose_impl<T>(a, out, rows, cols))
SH_EXPORT(copy2d, (const T* src, T* dst, long long rows, long long cols, long long src_ld,
                   long long src_off, long long dst_ld, long long dst_off),
          sh::copy2d_impl<T>(src, dst, rows, cols, src_ld, src_off, dst_ld, dst_off))
namespace sh {
// permute_impl on units of `unit` bytes (16, 8, 4; else one element T).
template <typename T>
__device__ void permute_units(const T* a, T* out, long long n, long long e0, long long e1,
                              long long e2, long long e3, long long s0, long long s1,
                              long long s2, long long s3, int unit) {
    if (unit == 16)
        permute_impl(reinterpret_cast<const uint4*>(a), reinterpret_cast<uint4*>(out), n, e0, e1,
                     e2, e3, s0, s1, s2, s3);
    else if (unit == 8)
        permute_impl(reinterpret_cast<const uint2*>(a), reinterpret_cast<uint2*>(out), n, e0, e1,
                     e2, e3, s0, s1, s2, s3);
    else if (unit == 4)
        permute_impl(reinterpret_cast<const unsigned*>(a), reinterpret_cast<unsigned*>(out), n,
                     e0, e1, e2, e3, s0, s1, s2, s3);
    else
        permute_impl(a, out, n, e0, e1, e2, e3, s0, s1, s2, s3);
}
}  // namespace sh

SH_EXPORT(permute, (const T* a, T* out, long long n, long long e0, long long e1, long long e2,
                    long long e3, long long s0, long long s1, long long s2, long long s3,
                    int unit),
          sh::permute_units<T>(a, out, n, e0, e1, e2, e3, s0, s1, s2, s3, unit))
SH_EXPORT(cast_from_f32, (const float* src, T* dst, long long n), sh::cast_impl(src, dst, n))
SH_EXPORT(cast_from_f64, (const double* src, T* dst, long long n), sh::cast_impl(src, dst, n))
SH_EXPORT(cast_from_bf16, (const __nv_bfloat16* src, T* dst, long long n),
          sh::cast_impl(src, dst, n))
SH_EXPORT(cast_from_f16, (const __half* src, T* dst, long long n), sh::cast_impl(src, dst, n))
