// Device helpers of the generated fused-op kernels (handlers/cuda/fused_source.py).
//
// Each helper here has a NumPy twin in handlers/fused.py (NUMPY) that does
// the same operations in the same order, so the two backends agree up to the
// rounding of the math library (and nvcc's fused multiply-adds).
#ifndef STREAMHANDLERS_KERNELS_FUSED_CUH
#define STREAMHANDLERS_KERNELS_FUSED_CUH

#include "common.cuh"

namespace sh {
namespace fx {

__device__ __forceinline__ float log1p(float x) { return ::log1pf(x); }
__device__ __forceinline__ double log1p(double x) { return ::log1p(x); }
__device__ __forceinline__ float erf(float x) { return ::erff(x); }
__device__ __forceinline__ double erf(double x) { return ::erf(x); }

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
            result = first ? base : result * base;
            first = false;
        }
        n >>= 1;
        if (n) base = base * base;
    }
    return K < 0 ? T(1) / result : result;
}

}  // namespace fx
}  // namespace sh

#endif  // STREAMHANDLERS_KERNELS_FUSED_CUH
