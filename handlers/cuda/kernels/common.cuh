// Device helpers shared by elementwise.cu, rows.cu, random.cu and reduce.cu
// (reduce.cu uses only the packet traits, VecTraits and kVec).
//
// What is here:
//   * SH_EXPORT: emits the two extern "C" kernels name_f32 / name_f64 around
//     one templated body, so float and double share every line of code;
//   * grid-stride indexing in 64-bit (arrays may exceed 2^31 elements);
//   * MixedRadix: the (row, column, ...) digits of a flat index that
//     advances by a fixed grid stride, without a 64-bit division per element,
//     and batched_loop, a grid-stride loop that keeps several loads in
//     flight per thread;
//   * 16-byte packets (float4 / double2) with their load/store helpers and
//     the alignment tests that decide whether a packet path may run;
//   * math overloads for float and double (expf vs exp, ...).
//
// Launch convention of every kernel that includes this file: a 1-D grid of
// 1-D blocks.  Kernels are correct for any grid size and any block size up
// to 1024 (unless the kernel's own comment says otherwise); the host
// launches 256 threads per block and min(ceil(n / (256 * VEC)), 16 * SMs)
// blocks, where VEC = kVec<T> (4 for float, 2 for double).
#ifndef STREAMHANDLERS_KERNELS_COMMON_CUH
#define STREAMHANDLERS_KERNELS_COMMON_CUH

#include <cstdint>

// Each exported kernel is written once, in terms of a type T, and emitted
// twice.  extern "C" gives the unmangled names pycuda looks up; a function
// with C linkage keeps its plain name inside a namespace, and the namespace
// supplies T.  __launch_bounds__(1024, 1) keeps every kernel within the
// register budget of the largest block (64 registers per thread), so that
// any block size launches.
// Other is the other real format (cast_t's source of another format).
namespace sh_f32 { using T = float; using Other = double; }
namespace sh_f64 { using T = double; using Other = float; }

#define SH_EXPORT(name, params, ...)                                             \
    namespace sh_f32 {                                                           \
    extern "C" __global__ void __launch_bounds__(1024, 1) name##_f32 params {    \
        __VA_ARGS__;                                                             \
    }                                                                            \
    }                                                                            \
    namespace sh_f64 {                                                           \
    extern "C" __global__ void __launch_bounds__(1024, 1) name##_f64 params {    \
        __VA_ARGS__;                                                             \
    }                                                                            \
    }

namespace sh {

// ------------------------------------------------------------- indexing

__device__ __forceinline__ long long grid_thread() {
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ long long grid_stride() {
    return (long long)gridDim.x * blockDim.x;
}

// Digits of a flat index e = (d2 * r1 + d1) * r0 + d0 that follow e as it
// advances by a fixed step.  The divisions happen once, in the constructor;
// advance() is adds and compares: d0 + s0 < 2 * r0 and d1 + s1 + 1 < 2 * r1,
// so one conditional subtraction per digit keeps each digit in range.
// Requires r0 >= 1 and r1 >= 1.
struct MixedRadix {
    long long d0, d1, d2;
    long long s0, s1, s2;
    long long r0, r1;

    __device__ __forceinline__ MixedRadix(long long e, long long step,
                                          long long radix0, long long radix1)
        : r0(radix0), r1(radix1) {
        long long q = e / r0;
        d0 = e - q * r0;
        d2 = q / r1;
        d1 = q - d2 * r1;
        q = step / r0;
        s0 = step - q * r0;
        s2 = q / r1;
        s1 = q - s2 * r1;
    }

    __device__ __forceinline__ void advance() {
        d0 += s0;
        long long carry = 0;
        if (d0 >= r0) { d0 -= r0; carry = 1; }
        d1 += s1 + carry;
        carry = 0;
        if (d1 >= r1) { d1 -= r1; carry = 1; }
        d2 += s2 + carry;
    }
};

// For batched_loop callers that need only the index.
struct NoCounter {
    __device__ __forceinline__ void advance() {}
};

// Grid-stride loop over the indices e in [lo, hi) doing store(e, load(e, c)),
// where c is a NoCounter or a MixedRadix that follows e (built for
// lo + grid_thread() and the grid stride).  The loads of kBatch trips are
// issued before their stores: the compiler will not make that move itself
// when a store may alias a later load (out may be an input), and without it
// every trip waits out a full memory latency.  It is safe because distinct
// indices are distinct elements and an element written in place was read by
// the same trip.  The last, partial batch is predicated rather than run trip
// by trip, for the same reason.
template <int kBatch, typename Counter, typename Load, typename Store>
__device__ __forceinline__ void batched_loop(long long lo, long long hi, Counter& c, Load load,
                                             Store store) {
    const long long stride = grid_stride();
    for (long long e = lo + grid_thread(); e < hi; e += kBatch * stride) {
        decltype(load(e, c)) x[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            if (e + k * stride < hi) x[k] = load(e + k * stride, c);
            c.advance();
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k)
            if (e + k * stride < hi) store(e + k * stride, x[k]);
    }
}

// ------------------------------------------------------------- packets

template <typename T> struct VecTraits;
template <> struct VecTraits<float>  { using type = float4;  static constexpr int width = 4; };
template <> struct VecTraits<double> { using type = double2; static constexpr int width = 2; };

// Elements per 16-byte packet.
template <typename T> constexpr int kVec = VecTraits<T>::width;

// N values of one thread, as an array so that code can loop over them; a
// Packet holds the contents of one 16-byte vector.
template <typename T, int N>
struct Lanes { T v[N]; };

template <typename T>
using Packet = Lanes<T, kVec<T>>;

// Offset of p from the previous 16-byte boundary, in bytes.
__device__ __forceinline__ unsigned misalignment16(const void* p) {
    return (unsigned)(reinterpret_cast<uintptr_t>(p) & 15u);
}

__device__ __forceinline__ bool is_aligned16(const void* p) {
    return misalignment16(p) == 0;
}

// Packet i of p, i.e. elements [i * kVec, (i + 1) * kVec); p must be
// 16-byte aligned.  One 128-bit access each (LDG.E.128 / STG.E.128).
__device__ __forceinline__ Packet<float> load_packet(const float* p, long long i) {
    const float4 v = reinterpret_cast<const float4*>(p)[i];
    return {{v.x, v.y, v.z, v.w}};
}

__device__ __forceinline__ Packet<double> load_packet(const double* p, long long i) {
    const double2 v = reinterpret_cast<const double2*>(p)[i];
    return {{v.x, v.y}};
}

__device__ __forceinline__ void store_packet(float* p, long long i, const Packet<float>& v) {
    reinterpret_cast<float4*>(p)[i] = make_float4(v.v[0], v.v[1], v.v[2], v.v[3]);
}

__device__ __forceinline__ void store_packet(double* p, long long i, const Packet<double>& v) {
    reinterpret_cast<double2*>(p)[i] = make_double2(v.v[0], v.v[1]);
}

template <typename T>
__device__ __forceinline__ Packet<T> splat(T x) {
    Packet<T> r;
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) r.v[k] = x;
    return r;
}

// ------------------------------------------------------------- math
// Explicit float/double overloads: a template body calls dm::exp(x) and gets
// expf for float, never a silent promotion to double.

namespace dm {
__device__ __forceinline__ float exp(float x) { return ::expf(x); }
__device__ __forceinline__ double exp(double x) { return ::exp(x); }
__device__ __forceinline__ float expm1(float x) { return ::expm1f(x); }
__device__ __forceinline__ double expm1(double x) { return ::expm1(x); }
__device__ __forceinline__ float log(float x) { return ::logf(x); }
__device__ __forceinline__ double log(double x) { return ::log(x); }
__device__ __forceinline__ float sqrt(float x) { return ::sqrtf(x); }
__device__ __forceinline__ double sqrt(double x) { return ::sqrt(x); }
__device__ __forceinline__ float tanh(float x) { return ::tanhf(x); }
__device__ __forceinline__ double tanh(double x) { return ::tanh(x); }
__device__ __forceinline__ float rsqrt(float x) { return ::rsqrtf(x); }
__device__ __forceinline__ double rsqrt(double x) { return ::rsqrt(x); }
__device__ __forceinline__ float pow(float x, float y) { return ::powf(x, y); }
__device__ __forceinline__ double pow(double x, double y) { return ::pow(x, y); }
__device__ __forceinline__ float abs(float x) { return ::fabsf(x); }
__device__ __forceinline__ double abs(double x) { return ::fabs(x); }
// fmax ignores a NaN operand (returns the other one).
__device__ __forceinline__ float fmax(float a, float b) { return ::fmaxf(a, b); }
__device__ __forceinline__ double fmax(double a, double b) { return ::fmax(a, b); }

template <typename T> __device__ __forceinline__ T quiet_nan();
template <> __device__ __forceinline__ float quiet_nan<float>() {
    return __int_as_float(0x7fc00000);
}
template <> __device__ __forceinline__ double quiet_nan<double>() {
    return __longlong_as_double(0x7ff8000000000000LL);
}

template <typename T> __device__ __forceinline__ T infinity();
template <> __device__ __forceinline__ float infinity<float>() {
    return __int_as_float(0x7f800000);
}
template <> __device__ __forceinline__ double infinity<double>() {
    return __longlong_as_double(0x7ff0000000000000LL);
}

// False for NaN (every comparison with NaN is false) and for +-inf.
template <typename T> __device__ __forceinline__ bool isfinite(T x) {
    return abs(x) < infinity<T>();
}
}  // namespace dm

}  // namespace sh

#endif  // STREAMHANDLERS_KERNELS_COMMON_CUH
