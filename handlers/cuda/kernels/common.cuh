// Device helpers shared by elementwise.cu, rows.cu, random.cu and reduce.cu
// (reduce.cu uses only the packet traits, VecTraits and kVec).
//
// What is here:
//   * SH_EXPORT: emits the four extern "C" kernels name_f32 / name_f64 /
//     name_bf16 / name_f16 around one templated body, so every format shares
//     every line of code;
//   * storage and compute types: a kernel stores T and computes in C
//     (compute_t<T>): float for the half formats, T itself otherwise.  Values
//     are widened with ld() as they are loaded and rounded once with st<T>()
//     as they are stored, so a half op is float math rounded once;
//   * grid-stride indexing in 64-bit (arrays may exceed 2^31 elements);
//   * MixedRadix: the (row, column, ...) digits of a flat index that
//     advances by a fixed grid stride, without a 64-bit division per element,
//     and batched_loop, a grid-stride loop that keeps several loads in
//     flight per thread;
//   * 16-byte packets (float4 / double2 / 8 halves) with their load/store
//     helpers, which widen and round as ld and st do, and the alignment tests
//     that decide whether a packet path may run;
//   * math overloads for float and double (expf vs exp, ...).
//
// Launch convention of every kernel that includes this file: a 1-D grid of
// 1-D blocks.  Kernels are correct for any grid size and any block size up
// to 1024 (unless the kernel's own comment says otherwise); the host
// launches SH_BLOCK threads per block and at least one, at most
// SH_MAX_BLOCKS_PER_SM * SMs blocks of ceil(n / (SH_BLOCK * VEC)), where
// VEC = kVec<T> (4 for float, 2 for double, 8 for the halves).  The SH_
// launch constants come from launch_constants.cuh, which the host writes
// from its own (handlers/cuda/launch.py).
#ifndef STREAMHANDLERS_KERNELS_COMMON_CUH
#define STREAMHANDLERS_KERNELS_COMMON_CUH

#include "launch_constants.cuh"

// tests/test_optable.py reads the sources through the host's preprocessor,
// where CUDA's headers may not exist (only the SH_ macros matter there).
#ifndef SH_HOST_PREPROCESS
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include <cstdint>
#include <type_traits>

// Each exported kernel is written once, in terms of types T and C, and
// emitted four times.  extern "C" gives the unmangled names pycuda looks up;
// a function with C linkage keeps its plain name inside a namespace, and the
// namespace supplies the types.  __launch_bounds__(1024, 1) keeps every
// kernel within the register budget of the largest block (64 registers per
// thread), so that any block size launches.
//   T      the storage format of the handler's arrays;
//   C      the format of arithmetic and of scalar arguments: float for the
//          half formats (cuda_bf16.h and cuda_fp16.h define half arithmetic
//          operators; kernels never use them, they widen first);
namespace sh_f32 { using T = float; using C = float; }
namespace sh_f64 { using T = double; using C = double; }
namespace sh_bf16 { using T = __nv_bfloat16; using C = float; }
namespace sh_f16 { using T = __half; using C = float; }

#define SH_EXPORT_ONE(ns, suffix, name, params, ...)                             \
    namespace ns {                                                               \
    extern "C" __global__ void __launch_bounds__(1024, 1) name##suffix params {  \
        __VA_ARGS__;                                                             \
    }                                                                            \
    }
#define SH_EXPORT(name, params, ...)                                             \
    SH_EXPORT_ONE(sh_f32, _f32, name, params, __VA_ARGS__)                       \
    SH_EXPORT_ONE(sh_f64, _f64, name, params, __VA_ARGS__)                       \
    SH_EXPORT_ONE(sh_bf16, _bf16, name, params, __VA_ARGS__)                     \
    SH_EXPORT_ONE(sh_f16, _f16, name, params, __VA_ARGS__)

namespace sh {

// ------------------------------------------------------------- formats

template <typename T> struct Compute { using type = T; };
template <> struct Compute<__nv_bfloat16> { using type = float; };
template <> struct Compute<__half> { using type = float; };
// The format a kernel computes in for storage format T.
template <typename T> using compute_t = typename Compute<T>::type;

// ld: a stored value in the compute format (exact: float holds every half).
__device__ __forceinline__ float ld(float x) { return x; }
__device__ __forceinline__ double ld(double x) { return x; }
__device__ __forceinline__ float ld(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ld(__half x) { return __half2float(x); }

// st<T>: a computed value in storage format T, rounded once to nearest even
// (overflow gives inf, NaN stays NaN).
template <typename T> __device__ __forceinline__ T st(compute_t<T> x);
template <> __device__ __forceinline__ float st<float>(float x) { return x; }
template <> __device__ __forceinline__ double st<double>(double x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half st<__half>(float x) { return __float2half_rn(x); }

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
template <> struct VecTraits<__nv_bfloat16> { using type = uint4; static constexpr int width = 8; };
template <> struct VecTraits<__half> { using type = uint4; static constexpr int width = 8; };

// Elements per 16-byte packet.
template <typename T> constexpr int kVec = VecTraits<T>::width;

// N values of one thread, as an array so that code can loop over them; a
// Packet holds the contents of one 16-byte vector of T, in the compute format.
template <typename T, int N>
struct Lanes { T v[N]; };

template <typename T>
using Packet = Lanes<compute_t<T>, kVec<T>>;

// Offset of p from the previous 16-byte boundary, in bytes.
__device__ __forceinline__ unsigned misalignment16(const void* p) {
    return (unsigned)(reinterpret_cast<uintptr_t>(p) & 15u);
}

__device__ __forceinline__ bool is_aligned16(const void* p) {
    return misalignment16(p) == 0;
}

// A fused op's array of another format A than the handler's T moves in T's
// packets of N = kVec<T> elements: one access of N * sizeof(A) bytes
// (4 bfloat16 in 8 bytes beside float32's 16-byte packets), aligned to
// that size (is_aligned_to), widened to A's compute format as it is
// loaded and rounded once to A as it is stored.
template <int N, typename A>
struct alignas(N * sizeof(A)) RawLanes { A v[N]; };

__device__ __forceinline__ bool is_aligned_to(const void* p, unsigned bytes) {
    return (reinterpret_cast<uintptr_t>(p) & (bytes - 1u)) == 0;
}

template <int N, typename A>
__device__ __forceinline__ Lanes<compute_t<A>, N> load_lanes(const A* p, long long i) {
    const RawLanes<N, A> raw = reinterpret_cast<const RawLanes<N, A>*>(p)[i];
    Lanes<compute_t<A>, N> r;
#pragma unroll
    for (int k = 0; k < N; ++k) r.v[k] = ld(raw.v[k]);
    return r;
}

template <int N, typename A, typename V>
__device__ __forceinline__ void store_lanes(A* p, long long i, const Lanes<V, N>& v) {
    RawLanes<N, A> raw;
#pragma unroll
    for (int k = 0; k < N; ++k) raw.v[k] = st<A>(v.v[k]);
    reinterpret_cast<RawLanes<N, A>*>(p)[i] = raw;
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

// The half formats: eight values, widened in pairs on load, rounded in pairs
// on store.  HalfPair<T> names a format's two-element type and its two
// conversions, so that one code serves both formats.
template <typename T> struct HalfPair;
template <> struct HalfPair<__nv_bfloat16> {
    using type = __nv_bfloat162;
    static __device__ __forceinline__ float2 widen(type h) { return __bfloat1622float2(h); }
    static __device__ __forceinline__ type round(float a, float b) {
        return __floats2bfloat162_rn(a, b);
    }
};
template <> struct HalfPair<__half> {
    using type = __half2;
    static __device__ __forceinline__ float2 widen(type h) { return __half22float2(h); }
    static __device__ __forceinline__ type round(float a, float b) {
        return __floats2half2_rn(a, b);
    }
};

// Is T one of the half formats (stored in 2 bytes, computed in float)?
template <typename T>
constexpr bool is_half_v = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

// The eight values of a 16-byte packet of halves (its raw bytes), widened.
template <typename T, typename = std::enable_if_t<is_half_v<T>>>
__device__ __forceinline__ Packet<T> widen_packet(uint4 raw) {
    const auto* h = reinterpret_cast<const typename HalfPair<T>::type*>(&raw);
    Packet<T> r;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 f = HalfPair<T>::widen(h[k]);
        r.v[2 * k] = f.x;
        r.v[2 * k + 1] = f.y;
    }
    return r;
}

template <typename T, typename = std::enable_if_t<is_half_v<T>>>
__device__ __forceinline__ Packet<T> load_packet(const T* p, long long i) {
    return widen_packet<T>(reinterpret_cast<const uint4*>(p)[i]);
}

template <typename T, typename = std::enable_if_t<is_half_v<T>>>
__device__ __forceinline__ void store_packet(T* p, long long i, const Packet<T>& v) {
    uint4 raw;
    auto* h = reinterpret_cast<typename HalfPair<T>::type*>(&raw);
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = HalfPair<T>::round(v.v[2 * k], v.v[2 * k + 1]);
    reinterpret_cast<uint4*>(p)[i] = raw;
}

// A packet of T holding x (a compute-format value) in every lane.
template <typename T>
__device__ __forceinline__ Packet<T> splat(compute_t<T> x) {
    Packet<T> r;
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) r.v[k] = x;
    return r;
}

// Columns [c, c + kVec<T>) of a row array p (a fused op's `:row` input,
// one value a column), widened: one packet load where c starts a packet
// (always in a held row, whose packets start at multiples of kVec), else
// element by element (a streamed row's packets start where its full
// arrays' 16-byte boundary falls).  p must be 16-byte aligned.
template <typename T>
__device__ __forceinline__ Packet<T> load_row_packet(const T* p, long long c) {
    if (c % kVec<T> == 0) return load_packet(p, c / kVec<T>);
    Packet<T> v;
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) v.v[k] = ld(p[c + k]);
    return v;
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
