// small_gemm: out = op(a) op(b) (+ out) for matrices so small that cuBLAS's
// host-side work per call (~6 us: heuristics, argument checks, its launch)
// costs more than the whole product.  PyCudaHandler routes a product here when
// out and the inner dimension are at most SMALL_OUT elements and SMALL_K long
// (handlers/cuda/products.py); everything larger goes to cuBLAS.
//
// Row-major: op(a) is (m, k), stored (m, k), or (k, m) when transa; op(b) is
// (k, n), stored (k, n), or (n, k) when transb; out is (m, n).  One thread per
// output element, n fastest across threads, so the loads of b (not
// transposed) coalesce and a warp reads one element of a at a time.  The sum
// runs in l order, so results are reproducible bit for bit.  With accumulate
// == 0 the old contents of out are never read (NaN there does not propagate).
//
// Formats: the products and the sum are in the compute format C (float for
// the halves, whose products of two elements are exact there), and out[e]
// (with its old value added when accumulating) is rounded once to T.
//
// Launch: a 1-D grid of 1-D blocks of any size (grid-stride loop).
#include "common.cuh"

SH_EXPORT(small_gemm,
          (const T* a, const T* b, T* out, long long m, long long n, long long k, int transa,
           int transb, int accumulate),
          const long long stride_a_row = transa ? 1 : k, stride_a_l = transa ? m : 1;
          const long long stride_b_l = transb ? 1 : n, stride_b_col = transb ? k : 1;
          for (long long e = sh::grid_thread(); e < m * n; e += sh::grid_stride()) {
              const long long i = e / n, j = e - (e / n) * n;
              const T* pa = a + i * stride_a_row;
              const T* pb = b + j * stride_b_col;
              C acc = 0;
              for (long long l = 0; l < k; ++l)
                  acc += sh::ld(pa[l * stride_a_l]) * sh::ld(pb[l * stride_b_l]);
              out[e] = sh::st<T>(accumulate ? sh::ld(out[e]) + acc : acc);
          })
