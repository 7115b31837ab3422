// Elementwise kernels: fill, axpby, binary / scalar / unary ops, clip,
// activation derivatives, matrix-vector broadcasts, broadcast along an axis,
// masked copies and the finiteness test.
//
// Every kernel exists as name_f32 (float), name_f64 (double), name_bf16 and
// name_f16 (computing in float, rounding once on store); scalars are passed
// in the compute format C, sizes as long long.  Launch: a 1-D grid of 1-D
// blocks of any size (grid-stride loops); the host uses the elementwise grid
// (common.cuh).
//
// Memory access: each input element is read once and each output element is
// written once.  When all pointers of a call sit at the same offset from a
// 16-byte boundary (in particular when all are 16-byte aligned) the bulk moves
// in 16-byte packets (float4 / double2 / 8 halves) and a scalar loop finishes the few
// elements before the first boundary and after the last full packet; any
// other mix of alignments takes a scalar loop throughout.
//
// Aliasing: `out` may be the very same array as any input.  This holds
// because the thread that writes an element has read every input at that
// index (and out's old value, where the op needs it) beforehand, and no other
// thread touches that index.  For the same reason nothing here uses
// __restrict__ or the read-only cache.
#include "common.cuh"

namespace sh {

// ------------------------------------------------------------- the map engine
//
// map<ReadOut>(op, out, n, in...) computes, for every i < n,
//     out[i] = op(in[i]...)            (ReadOut == false)
//     out[i] = op(in[i]..., out[i])    (ReadOut == true)
// so an op never reads out unless it says so (axpby with beta == 0 must not
// see NaN in y, fill must not read at all).

template <bool ReadOut, typename T, int N, typename Op, typename... L>
__device__ __forceinline__ void apply_lanes(const Op& op, Lanes<T, N>& r, const L&... in) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
        if constexpr (ReadOut) r.v[k] = op(in.v[k]..., r.v[k]);
        else r.v[k] = op(in.v[k]...);
    }
}

// Elements i, i + stride, ..., i + (N - 1) * stride of p, in the compute format.
template <int N, typename T>
__device__ __forceinline__ Lanes<compute_t<T>, N> gather(const T* p, long long i,
                                                         long long stride) {
    Lanes<compute_t<T>, N> r;
#pragma unroll
    for (int k = 0; k < N; ++k) r.v[k] = ld(p[i + k * stride]);
    return r;
}

// Elements [lo, hi), one at a time per thread and grid stride.  Because out
// may alias an input, the compiler may not move a load above an earlier
// store; so each trip loads kUnroll elements of every array before it
// stores any, which keeps that many loads in flight per thread.
template <bool ReadOut, typename T, typename Op, typename... In>
__device__ __forceinline__ void map_scalar(const Op& op, T* out, long long lo, long long hi,
                                           const In*... in) {
    constexpr int kUnroll = 4;
    const long long stride = grid_stride();
    long long i = lo + grid_thread();
    for (; i + (kUnroll - 1) * stride < hi; i += kUnroll * stride) {
        Lanes<compute_t<T>, kUnroll> r;
        if constexpr (ReadOut) r = gather<kUnroll>(out, i, stride);
        apply_lanes<ReadOut>(op, r, gather<kUnroll>(in, i, stride)...);
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) out[i + k * stride] = st<T>(r.v[k]);
    }
    for (; i < hi; i += stride) {
        if constexpr (ReadOut) out[i] = st<T>(op(ld(in[i])..., ld(out[i])));
        else out[i] = st<T>(op(ld(in[i])...));
    }
}

// Packets [0, npk) of 16-byte aligned pointers.
template <bool ReadOut, typename T, typename Op, typename... In>
__device__ __forceinline__ void map_packets(const Op& op, T* out, long long npk,
                                            const In*... in) {
    const long long stride = grid_stride();
    for (long long p = grid_thread(); p < npk; p += stride) {
        Packet<T> r;
        if constexpr (ReadOut) r = load_packet(out, p);
        // All loads are issued before the store below, so in-place is safe.
        apply_lanes<ReadOut>(op, r, load_packet(in, p)...);
        store_packet(out, p, r);
    }
}

template <bool ReadOut, typename T, typename Op, typename... In>
__device__ __forceinline__ void map(const Op& op, T* out, long long n, const In*... in) {
    const unsigned mis = misalignment16(out);
    const bool same_offset = ((misalignment16(in) == mis) && ...);
    if (!same_offset || mis % sizeof(T) != 0) {
        map_scalar<ReadOut>(op, out, 0, n, in...);
        return;
    }
    // Elements before the first 16-byte boundary, shared by all pointers.
    long long head = (long long)(((16u - mis) & 15u) / sizeof(T));
    if (head > n) head = n;
    const long long npk = (n - head) / kVec<T>;
    const long long body_end = head + npk * kVec<T>;
    map_scalar<ReadOut>(op, out, 0, head, in...);
    map_packets<ReadOut>(op, out + head, npk, (in + head)...);
    map_scalar<ReadOut>(op, out, body_end, n, in...);
}

// ------------------------------------------------------------- ops
// The functors take the inputs in the order the kernel passes them to map,
// then out's old value where ReadOut is set.

template <typename T> struct Fill {
    T value;
    __device__ T operator()() const { return value; }
};

template <typename T> struct Scale {  // axpby with beta == 0
    T alpha;
    __device__ T operator()(T x) const { return alpha * x; }
};

template <typename T> struct Axpby {
    T alpha, beta;
    __device__ T operator()(T x, T y) const { return alpha * x + beta * y; }
};

template <typename T> struct Add { __device__ T operator()(T a, T b) const { return a + b; } };
template <typename T> struct Sub { __device__ T operator()(T a, T b) const { return a - b; } };
template <typename T> struct Mul { __device__ T operator()(T a, T b) const { return a * b; } };
template <typename T> struct Div { __device__ T operator()(T a, T b) const { return a / b; } };

// NaN in either operand gives NaN, as numpy.maximum/minimum do (fmax and
// fmin would return the other operand).
template <typename T> struct Max {
    __device__ T operator()(T a, T b) const { return a != a ? a : (b != b || b > a) ? b : a; }
};
template <typename T> struct Min {
    __device__ T operator()(T a, T b) const { return a != a ? a : (b != b || b < a) ? b : a; }
};

// 1 or 0; any comparison with NaN is false.
template <typename T> struct Greater {
    __device__ T operator()(T a, T b) const { return a > b ? T(1) : T(0); }
};

// 1 where a == b, else 0; false (0) when either is NaN, as every comparison with NaN.
template <typename T> struct Equal {
    __device__ T operator()(T a, T b) const { return a == b ? T(1) : T(0); }
};

// NaN in cond counts as true, as in numpy (NaN != 0).
template <typename T> struct Where {
    __device__ T operator()(T cond, T a, T b) const { return cond != T(0) ? a : b; }
};

template <typename T> struct MulAdd {
    __device__ T operator()(T a, T b, T old) const { return old + a * b; }
};

template <typename T> struct AddScalar {
    T s;
    __device__ T operator()(T t) const { return t + s; }
};

template <typename T> struct MulScalar {
    T s;
    __device__ T operator()(T t) const { return s * t; }
};

template <typename T> struct MulAddScalar {
    T s;
    __device__ T operator()(T t, T old) const { return old + s * t; }
};

template <typename T> struct PowScalar {
    T s;
    __device__ T operator()(T t) const { return dm::pow(t, s); }
};

template <typename T> struct Square { __device__ T operator()(T x) const { return x * x; } };
template <typename T> struct Rsqrt { __device__ T operator()(T x) const { return dm::rsqrt(x); } };

template <typename T> struct Abs { __device__ T operator()(T x) const { return dm::abs(x); } };

// NaN falls through both comparisons and is returned as is; -0 gives +0.
template <typename T> struct Sign {
    __device__ T operator()(T x) const {
        return x > T(0) ? T(1) : x < T(0) ? T(-1) : x == T(0) ? T(0) : x;
    }
};

template <typename T> struct Sqrt { __device__ T operator()(T x) const { return dm::sqrt(x); } };
template <typename T> struct Log { __device__ T operator()(T x) const { return dm::log(x); } };
template <typename T> struct Exp { __device__ T operator()(T x) const { return dm::exp(x); } };

// exp(-x) overflows to +inf for very negative x, and 1 / (1 + inf) = 0: the
// IEEE limits give exactly 0 and 1 at the ends, never NaN (NaN in, NaN out).
template <typename T> struct Sigmoid {
    __device__ T operator()(T x) const { return T(1) / (T(1) + dm::exp(-x)); }
};

// The same for a half format, with the fast float intrinsics: their error
// (a few units of float's last place) is far below the half's rounding, and
// the IEEE division and expf made the bfloat16 kernel compute-bound (81% of
// copy bandwidth on an H200, against 89% for PyTorch's).  __fdividef gives
// 0 for a divisor beyond 2^126, which is sigmoid's limit there anyway.
struct SigmoidFast {
    __device__ float operator()(float x) const { return __fdividef(1.0f, 1.0f + __expf(-x)); }
};

template <typename T> struct Tanh { __device__ T operator()(T x) const { return dm::tanh(x); } };

// Comparisons instead of fmax so that NaN propagates, as numpy.maximum does.
template <typename T> struct Relu {
    __device__ T operator()(T x) const { return x < T(0) ? T(0) : x; }
};

template <typename T> struct Elu {
    __device__ T operator()(T x) const { return x > T(0) ? x : dm::expm1(x); }
};

// Comparisons instead of fmin/fmax so that NaN propagates, as numpy.clip does.
template <typename T> struct Clip {
    T lo, hi;
    __device__ T operator()(T x) const {
        const T y = x < lo ? lo : x;
        return y > hi ? hi : y;
    }
};

// Derivatives read only the arrays their formula needs.
template <typename T> struct SigmoidDeriv {
    __device__ T operator()(T y, T dy) const { return dy * ((T(1) - y) * y); }
};

template <typename T> struct TanhDeriv {
    __device__ T operator()(T y, T dy) const { return dy * (T(1) - y * y); }
};

template <typename T> struct ReluDeriv {
    __device__ T operator()(T x, T dy) const { return x > T(0) ? dy : T(0); }
};

template <typename T> struct EluDeriv {
    __device__ T operator()(T x, T y, T dy) const { return x > T(0) ? dy : dy * (y + T(1)); }
};

// Masked ops write back the old value where cond == 0 (the same bits), which
// keeps the packet path; NaN in cond counts as true, as in numpy (NaN != 0).
template <typename T> struct CopyIf {
    __device__ T operator()(T src, T cond, T old) const { return cond != T(0) ? src : old; }
};

template <typename T> struct FillIf {
    T val;
    __device__ T operator()(T cond, T old) const { return cond != T(0) ? val : old; }
};

template <typename T> struct AddIf {
    __device__ T operator()(T a, T cond, T old) const { return cond != T(0) ? old + a : old; }
};

// ------------------------------------------------------------- axpby

template <typename T, typename C = compute_t<T>>
__device__ __forceinline__ void axpby(C alpha, const T* x, C beta, T* y, long long n) {
    // The branch is uniform over the launch; with beta == 0 y is not read.
    if (beta == C(0)) map<false>(Scale<C>{alpha}, y, n, x);
    else map<true>(Axpby<C>{alpha, beta}, y, n, x);
}

// ------------------------------------------------------------- matrix op vector
//
// m, out: (rows, cols).  ByCol == false: v is (1, cols), element (i, j) uses
// v[j]; ByCol == true: v is (rows, 1), element (i, j) uses v[i].  (i, j) come
// from a MixedRadix counter, not from a division per element.
//
// When m and out sit at the same offset from a 16-byte boundary and cols >=
// VEC, the elements before the first boundary go one by one and the rest by
// packets of m and out.  If moreover m is aligned and cols % VEC == 0, a
// packet never straddles two rows and v comes as a packet too (row case, v
// aligned) or as one value (column case).  Otherwise a packet may wrap once
// into the next row (cols >= VEC) and v is read per lane; v is small and
// stays in cache.  Any other layout takes the scalar loop throughout.

// Trips per batch of loads in batched_loop: 64 bytes of packets in flight
// per thread for float, 32 for double, which keeps the double kernels
// within 64 registers.
template <typename T> constexpr int kBatch = kVec<T>;

template <bool ByCol, typename T, typename Op>
__device__ __forceinline__ void mv_scalar(const Op& op, const T* m, const T* v, T* out,
                                          long long rows, long long cols, long long lo,
                                          long long hi) {
    MixedRadix ij(lo + grid_thread(), grid_stride(), cols, rows);  // d1 = row, d0 = column
    batched_loop<kBatch<T>>(
        lo, hi, ij,
        [&](long long e, const MixedRadix& c) { return op(ld(m[e]), ld(v[ByCol ? c.d1 : c.d0])); },
        [&](long long e, compute_t<T> x) { out[e] = st<T>(x); });
}

template <bool ByCol, typename T, typename Op>
__device__ __forceinline__ void mv_apply(const Op& op, const T* m, const T* v, T* out,
                                         long long rows, long long cols) {
    constexpr int W = kVec<T>;
    const long long total = rows * cols;
    if (total <= 0) return;
    const unsigned mis = misalignment16(out);
    if (!(misalignment16(m) == mis && mis % sizeof(T) == 0 && cols >= W)) {
        mv_scalar<ByCol>(op, m, v, out, rows, cols, 0, total);
        return;
    }
    long long head = (long long)(((16u - mis) & 15u) / sizeof(T));
    if (head > total) head = total;
    const long long npk = (total - head) / W;
    const long long start = grid_thread(), stride = grid_stride();
    const T* mh = m + head;
    T* oh = out + head;
    mv_scalar<ByCol>(op, m, v, out, rows, cols, 0, head);
    if (head == 0 && cols % W == 0 && (ByCol || is_aligned16(v))) {
        MixedRadix ij(start, stride, cols / W, rows);  // d1 = row, d0 = packet column
        batched_loop<kBatch<T>>(
            0, npk, ij,
            [&](long long p, const MixedRadix& c) {
                Packet<T> x = load_packet(m, p);
                const Packet<T> y = ByCol ? splat<T>(ld(v[c.d1])) : load_packet(v, c.d0);
#pragma unroll
                for (int k = 0; k < W; ++k) x.v[k] = op(x.v[k], y.v[k]);
                return x;
            },
            [&](long long p, const Packet<T>& x) { store_packet(out, p, x); });
        return;  // total is a multiple of W: no tail
    }
    MixedRadix ij(head + start * W, stride * W, cols, rows);  // (row, column) of lane 0
    batched_loop<kBatch<T>>(
        0, npk, ij,
        [&](long long p, const MixedRadix& c) {
            Packet<T> x = load_packet(mh, p);
#pragma unroll
            for (int k = 0; k < W; ++k) {
                long long i = c.d1, j = c.d0 + k;
                if (j >= cols) { j -= cols; ++i; }  // at most once: k < W <= cols
                x.v[k] = op(x.v[k], ld(v[ByCol ? i : j]));
            }
            return x;
        },
        [&](long long p, const Packet<T>& x) { store_packet(oh, p, x); });
    mv_scalar<ByCol>(op, m, v, out, rows, cols, head + npk * W, total);
}

// ------------------------------------------------------------- broadcast
//
// out (outer, n, inner) = a (outer, 1, inner) repeated n times along the
// middle axis: out[(o * n + k) * inner + i] = a[o * inner + i].  a and out
// never overlap, except for n == 1 with out == a, where each element is read
// and then written back by one thread.

// U is T, or the 16-byte packet type with inner counted in packets.
template <typename U>
__device__ __forceinline__ void broadcast_units(const U* a, U* out, long long outer, long long n,
                                                long long inner) {
    MixedRadix oki(grid_thread(), grid_stride(), inner, n);  // d2 = o, d1 = k, d0 = i
    batched_loop<4>(
        0, outer * n * inner, oki,
        [&](long long, const MixedRadix& c) { return a[c.d2 * inner + c.d0]; },
        [&](long long e, const U& x) { out[e] = x; });
}

template <typename T>
__device__ __forceinline__ void broadcast(const T* a, T* out, long long outer, long long n,
                                          long long inner) {
    if (outer <= 0 || n <= 0 || inner <= 0) return;
    using V = typename VecTraits<T>::type;
    constexpr int W = kVec<T>;
    if (inner % W == 0 && is_aligned16(a) && is_aligned16(out)) {
        broadcast_units(reinterpret_cast<const V*>(a), reinterpret_cast<V*>(out), outer, n,
                        inner / W);
    } else if (inner == 1 && n % W == 0 && is_aligned16(out)) {
        // Repeating along the last axis: each output packet is one a[o] repeated.
        MixedRadix ok(grid_thread(), grid_stride(), n / W, outer);  // d1 = o
        batched_loop<4>(
            0, outer * (n / W), ok,
            [&](long long, const MixedRadix& c) { return splat<T>(ld(a[c.d1])); },
            [&](long long p, const Packet<T>& x) { store_packet(out, p, x); });
    } else {
        broadcast_units(a, out, outer, n, inner);
    }
}

// ------------------------------------------------------------- all_finite

template <typename T>
__device__ __forceinline__ void all_finite(const T* a, long long n, unsigned int* flag) {
    const long long start = grid_thread(), stride = grid_stride();
    bool ok = true;
    // One pointer: it can always be brought to a 16-byte boundary (unless it
    // is not even T-aligned, in which case everything goes the scalar way).
    const unsigned mis = misalignment16(a);
    long long head = mis % sizeof(T) ? n : (long long)(((16u - mis) & 15u) / sizeof(T));
    if (head > n) head = n;
    const long long npk = (n - head) / kVec<T>;
    for (long long i = start; i < head; i += stride) ok &= dm::isfinite(ld(a[i]));
    for (long long p = start; p < npk; p += stride) {
        const Packet<T> x = load_packet(a + head, p);
#pragma unroll
        for (int k = 0; k < kVec<T>; ++k) ok &= dm::isfinite(x.v[k]);
    }
    for (long long i = head + npk * kVec<T> + start; i < n; i += stride)
        ok &= dm::isfinite(ld(a[i]));
    // Every writer stores the same value, so a plain store suffices.
    if (!ok) *flag = 1u;
}

}  // namespace sh

// ------------------------------------------------------------- exported kernels

SH_EXPORT(fill, (T* out, C value, long long n),
          sh::map<false>(sh::Fill<C>{value}, out, n))

SH_EXPORT(axpby, (C alpha, const T* x, C beta, T* y, long long n),
          sh::axpby(alpha, x, beta, y, n))

// axpby with device scalars: alpha (beta) is read from alpha_p (beta_p) when
// that is not null, so a captured graph sees the value it holds at replay.
SH_EXPORT(axpby_dev,
          (const T* alpha_p, C alpha, const T* x, const T* beta_p, C beta, T* y, long long n),
          sh::axpby(alpha_p ? sh::ld(*alpha_p) : alpha, x, beta_p ? sh::ld(*beta_p) : beta, y, n))

#define SH_BINARY(name, Op)                                                   \
    SH_EXPORT(name, (const T* a, const T* b, T* out, long long n),            \
              sh::map<false>(sh::Op<C>{}, out, n, a, b))
SH_BINARY(binary_add, Add)
SH_BINARY(binary_sub, Sub)
SH_BINARY(binary_mul, Mul)
SH_BINARY(binary_div, Div)
SH_BINARY(binary_max, Max)
SH_BINARY(binary_min, Min)
SH_BINARY(binary_greater, Greater)
SH_BINARY(binary_equal, Equal)

SH_EXPORT(where, (const T* cond, const T* a, const T* b, T* out, long long n),
          sh::map<false>(sh::Where<C>{}, out, n, cond, a, b))

SH_EXPORT(binary_mul_add, (const T* a, const T* b, T* out, long long n),
          sh::map<true>(sh::MulAdd<C>{}, out, n, a, b))

SH_EXPORT(scalar_add, (C s, const T* t, T* out, long long n),
          sh::map<false>(sh::AddScalar<C>{s}, out, n, t))
SH_EXPORT(scalar_mul, (C s, const T* t, T* out, long long n),
          sh::map<false>(sh::MulScalar<C>{s}, out, n, t))
SH_EXPORT(scalar_mul_add, (C s, const T* t, T* out, long long n),
          sh::map<true>(sh::MulAddScalar<C>{s}, out, n, t))
SH_EXPORT(scalar_pow, (C s, const T* t, T* out, long long n),
          sh::map<false>(sh::PowScalar<C>{s}, out, n, t))

#define SH_UNARY(name, Op)                                                    \
    SH_EXPORT(name, (const T* a, T* out, long long n),                        \
              sh::map<false>(sh::Op<C>{}, out, n, a))
SH_UNARY(unary_abs, Abs)
SH_UNARY(unary_sign, Sign)
SH_UNARY(unary_sqrt, Sqrt)
SH_UNARY(unary_rsqrt, Rsqrt)
SH_UNARY(unary_square, Square)
SH_UNARY(unary_log, Log)
SH_UNARY(unary_exp, Exp)
SH_EXPORT(unary_sigmoid, (const T* a, T* out, long long n),
          using Op = std::conditional_t<sh::is_half_v<T>, sh::SigmoidFast, sh::Sigmoid<C>>;
          sh::map<false>(Op{}, out, n, a))
SH_UNARY(unary_tanh, Tanh)
SH_UNARY(unary_relu, Relu)
SH_UNARY(unary_elu, Elu)

SH_EXPORT(clip, (const T* a, C lo, C hi, T* out, long long n),
          sh::map<false>(sh::Clip<C>{lo, hi}, out, n, a))

// All four take (x, y, dy, dx); each reads only what its formula uses.
SH_EXPORT(deriv_sigmoid, (const T* x, const T* y, const T* dy, T* dx, long long n),
          (void)x; sh::map<false>(sh::SigmoidDeriv<C>{}, dx, n, y, dy))
SH_EXPORT(deriv_tanh, (const T* x, const T* y, const T* dy, T* dx, long long n),
          (void)x; sh::map<false>(sh::TanhDeriv<C>{}, dx, n, y, dy))
SH_EXPORT(deriv_relu, (const T* x, const T* y, const T* dy, T* dx, long long n),
          (void)y; sh::map<false>(sh::ReluDeriv<C>{}, dx, n, x, dy))
SH_EXPORT(deriv_elu, (const T* x, const T* y, const T* dy, T* dx, long long n),
          sh::map<false>(sh::EluDeriv<C>{}, dx, n, x, y, dy))

#define SH_MV(name, Op, by_col)                                               \
    SH_EXPORT(name, (const T* m, const T* v, T* out, long long rows, long long cols), \
              sh::mv_apply<by_col>(sh::Op<C>{}, m, v, out, rows, cols))
SH_MV(mv_add_row, Add, false)
SH_MV(mv_sub_row, Sub, false)
SH_MV(mv_mul_row, Mul, false)
SH_MV(mv_div_row, Div, false)
SH_MV(mv_add_col, Add, true)
SH_MV(mv_sub_col, Sub, true)
SH_MV(mv_mul_col, Mul, true)
SH_MV(mv_div_col, Div, true)

SH_EXPORT(broadcast, (const T* a, T* out, long long outer, long long n, long long inner),
          sh::broadcast(a, out, outer, n, inner))

SH_EXPORT(copy_if, (const T* src, T* dest, const T* cond, long long n),
          sh::map<true>(sh::CopyIf<C>{}, dest, n, src, cond))
SH_EXPORT(fill_if, (T* mem, C val, const T* cond, long long n),
          sh::map<true>(sh::FillIf<C>{val}, mem, n, cond))
SH_EXPORT(add_if, (const T* a, T* out, const T* cond, long long n),
          sh::map<true>(sh::AddIf<C>{}, out, n, a, cond))

SH_EXPORT(all_finite, (const T* a, long long n, unsigned int* flag),
          sh::all_finite(a, n, flag))

// Between a format and its compute format (a float buffer of the halves'
// multi-pass work, rounded once at the end): widen copies exactly, narrow
// scales (mean_t's 1 / n, or 1) and rounds once.
SH_EXPORT(widen, (const T* src, C* out, long long n),
          sh::NoCounter none;
          sh::batched_loop<4>(
              0, n, none, [&](long long e, const sh::NoCounter&) { return sh::ld(src[e]); },
              [&](long long e, C x) { out[e] = x; }))
SH_EXPORT(narrow, (const C* src, C scale, T* out, long long n),
          sh::NoCounter none;
          sh::batched_loop<4>(
              0, n, none, [&](long long e, const sh::NoCounter&) { return src[e] * scale; },
              [&](long long e, C x) { out[e] = sh::st<T>(x); }))

// out += src with src in the compute format, rounded once: a half
// dot_add_mm adds its float32 product this way (add_half in handlers/cuda/products.py).
SH_EXPORT(add_compute, (const C* src, T* out, long long n),
          sh::NoCounter none;
          sh::batched_loop<4>(
              0, n, none,
              [&](long long e, const sh::NoCounter&) { return sh::ld(out[e]) + src[e]; },
              [&](long long e, C x) { out[e] = sh::st<T>(x); }))
