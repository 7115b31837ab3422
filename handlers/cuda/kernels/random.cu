// Random fills: normal samples (fill_gaussian) and Bernoulli masks
// (probability_mask), from a counter-based generator, Philox4x32-10
// (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
// SC 2011), written out below.
//
// Every kernel exists as name_f32 (float), name_f64 (double), name_bf16 and
// name_f16; mean, stddev and p are passed in the compute format C (float for
// the halves).  Launch: a 1-D grid of 1-D blocks of any size (grid-stride
// loop); the host uses the elementwise grid (common.cuh).
//
// Reproducibility: element i of a call gets the value numbered offset + i of
// the stream selected by (seed, kernel, dtype), whatever the launch shape.
// Value number k comes from Philox block k / VEC, lane k % VEC, where one
// Philox block (four 32-bit words, key = seed, counter = (k / VEC, tag)) makes
// one 16-byte packet: 4 floats or 2 doubles.  The half formats draw exactly
// the float values (block k / 4, lane k % 4: two blocks per packet of 8) and
// round each once on store, so value k of a bfloat16 or float16 stream is
// value k of the float32 stream of the same (seed, kernel), rounded to
// nearest even.  The host advances offset by n after each call, so
// successive calls continue the stream.
#include "common.cuh"

namespace sh {

// ------------------------------------------------------------- Philox4x32-10

// The high and low halves of a 32x32-bit product.  Host-callable too, so
// that the generator can be checked against the published test vectors on
// a machine without a GPU.
__host__ __device__ __forceinline__ unsigned mulhi32(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}

struct Philox4x32Block { unsigned w[4]; };

__host__ __device__ __forceinline__ Philox4x32Block philox4x32_10(Philox4x32Block c,
                                                                  unsigned k0, unsigned k1) {
    constexpr unsigned M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;  // round multipliers
    constexpr unsigned W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;  // Weyl key increments
    for (int round = 0; round < 10; ++round) {
        if (round > 0) { k0 += W0; k1 += W1; }
        const unsigned hi0 = mulhi32(M0, c.w[0]), lo0 = M0 * c.w[0];
        const unsigned hi1 = mulhi32(M1, c.w[2]), lo1 = M1 * c.w[2];
        c = Philox4x32Block{{hi1 ^ c.w[1] ^ k0, lo1, hi0 ^ c.w[3] ^ k1, lo0}};
    }
    return c;
}

// ------------------------------------------------------------- uniforms
// Built from the top bits of each word, so that every value is exact in T.

// [0, 1) and (0, 1] with 24 bits: float's full precision at 1.
__host__ __device__ __forceinline__ float uniform_co_f32(unsigned w) {
    return (float)(w >> 8) * 0x1p-24f;
}
__host__ __device__ __forceinline__ float uniform_oc_f32(unsigned w) {
    return (float)((w >> 8) + 1u) * 0x1p-24f;
}

// [0, 1) and (0, 1] with 53 bits taken from two words (27 + 26).
__host__ __device__ __forceinline__ unsigned long long bits53(unsigned a, unsigned b) {
    return ((unsigned long long)(a >> 5) << 26) | (b >> 6);
}
__host__ __device__ __forceinline__ double uniform_co_f64(unsigned a, unsigned b) {
    return (double)bits53(a, b) * 0x1p-53;
}
__host__ __device__ __forceinline__ double uniform_oc_f64(unsigned a, unsigned b) {
    return (double)(bits53(a, b) + 1ull) * 0x1p-53;
}

// ------------------------------------------------------------- distributions
// Each maps one Philox block to one packet of VEC values.

// Box-Muller: u1 in (0, 1] keeps log away from 0; sincospi(2 * u2) is
// sin/cos of 2 * pi * u2 without rounding pi first.
__device__ __forceinline__ void box_muller(float u1, float u2, float* z0, float* z1) {
    const float r = sqrtf(-2.0f * logf(u1));
    float s, c;
    sincospif(2.0f * u2, &s, &c);
    *z0 = r * c;
    *z1 = r * s;
}

__device__ __forceinline__ void box_muller(double u1, double u2, double* z0, double* z1) {
    const double r = sqrt(-2.0 * log(u1));
    double s, c;
    sincospi(2.0 * u2, &s, &c);
    *z0 = r * c;
    *z1 = r * s;
}

template <typename T> struct Gaussian;

template <> struct Gaussian<float> {
    float mean, stddev;
    __device__ Packet<float> operator()(const Philox4x32Block& b) const {
        Packet<float> z;
        box_muller(uniform_oc_f32(b.w[0]), uniform_co_f32(b.w[1]), &z.v[0], &z.v[1]);
        box_muller(uniform_oc_f32(b.w[2]), uniform_co_f32(b.w[3]), &z.v[2], &z.v[3]);
#pragma unroll
        for (int k = 0; k < 4; ++k) z.v[k] = mean + stddev * z.v[k];
        return z;
    }
};

template <> struct Gaussian<double> {
    double mean, stddev;
    __device__ Packet<double> operator()(const Philox4x32Block& b) const {
        Packet<double> z;
        box_muller(uniform_oc_f64(b.w[0], b.w[1]), uniform_co_f64(b.w[2], b.w[3]),
                   &z.v[0], &z.v[1]);
#pragma unroll
        for (int k = 0; k < 2; ++k) z.v[k] = mean + stddev * z.v[k];
        return z;
    }
};

// u < p with u in [0, 1): p = 0 gives all zeros, p = 1 all ones.
template <typename T> struct Bernoulli;

template <> struct Bernoulli<float> {
    float p;
    __device__ Packet<float> operator()(const Philox4x32Block& b) const {
        Packet<float> m;
#pragma unroll
        for (int k = 0; k < 4; ++k) m.v[k] = uniform_co_f32(b.w[k]) < p ? 1.0f : 0.0f;
        return m;
    }
};

template <> struct Bernoulli<double> {
    double p;
    __device__ Packet<double> operator()(const Philox4x32Block& b) const {
        Packet<double> m;
        m.v[0] = uniform_co_f64(b.w[0], b.w[1]) < p ? 1.0 : 0.0;
        m.v[1] = uniform_co_f64(b.w[2], b.w[3]) < p ? 1.0 : 0.0;
        return m;
    }
};

// Tags in the counter's third word keep the kernels' streams apart, should
// the host ever hand both the same (seed, offset).
enum : unsigned { kTagGaussian = 1u, kTagBernoulli = 2u };

// ------------------------------------------------------------- the fill loop

// Value number k = offset + i goes to out[i].  Block g (numbered from
// g0 = offset / VEC) covers out[g * VEC - lead, (g + 1) * VEC - lead), lead =
// offset % VEC; lanes falling before out[0] or past out[n - 1] are dropped.
// When out[-lead] would sit on a 16-byte boundary, every full block is one
// aligned packet store; otherwise the lanes are stored one by one.  For the
// half formats, "block" g here is the pair of Philox blocks 2 (g0 + g) and
// 2 (g0 + g) + 1 (see the top), and values are rounded to T as stored.
template <typename T, typename Gen>
__device__ __forceinline__ void fill_random(const Gen& gen, unsigned tag, T* out, long long n,
                                            unsigned long long seed,
                                            unsigned long long offset) {
    if (n <= 0) return;
    constexpr int W = kVec<T>;
    const unsigned long long g0 = offset / W;
    const long long lead = (long long)(offset - g0 * W);
    const long long nblocks = (lead + n + W - 1) / W;
    // Integer arithmetic: out - lead need not point into the allocation.
    const bool packets =
        ((reinterpret_cast<uintptr_t>(out) - (uintptr_t)lead * sizeof(T)) & 15u) == 0;
    const unsigned k0 = (unsigned)seed, k1 = (unsigned)(seed >> 32);
    const long long stride = grid_stride();
    for (long long g = grid_thread(); g < nblocks; g += stride) {
        const unsigned long long ctr = g0 + (unsigned long long)g;
        const auto block = [&](unsigned long long c) {   // Philox block number c
            return philox4x32_10(Philox4x32Block{{(unsigned)c, (unsigned)(c >> 32), tag, 0u}},
                                 k0, k1);
        };
        Packet<T> r;
        if constexpr (W == 8) {   // the half formats: the float values of two blocks
            const unsigned long long c0 = 2 * ctr, c1 = c0 + 1;
            const Philox4x32Block b0 = block(c0), b1 = block(c1);
            const Packet<float> lo = gen(b0), hi = gen(b1);
#pragma unroll
            for (int k = 0; k < 4; ++k) r.v[k] = lo.v[k], r.v[4 + k] = hi.v[k];
        } else {
            r = gen(block(ctr));
        }
        const long long e = g * W - lead;  // index in out of lane 0
        if (packets && e >= 0 && e + W <= n) {
            store_packet(out + e, 0, r);
        } else {
#pragma unroll
            for (int k = 0; k < W; ++k)
                if (e + k >= 0 && e + k < n) out[e + k] = st<T>(r.v[k]);
        }
    }
}

}  // namespace sh

// ------------------------------------------------------------- exported kernels

// `base`, when not null, points to a device counter added to `offset`: a
// captured graph reads where its random values start on each replay from
// there (the host sets it before a replay, rng_advance moves it after), so
// replays continue the sequence instead of repeating the capture's values.
SH_EXPORT(fill_gaussian,
          (T* out, long long n, C mean, C stddev, unsigned long long seed,
           unsigned long long offset, const unsigned long long* base),
          sh::fill_random(sh::Gaussian<C>{mean, stddev}, sh::kTagGaussian, out, n, seed,
                          offset + (base ? *base : 0ull)))
SH_EXPORT(probability_mask,
          (T* mask, long long n, C p, unsigned long long seed, unsigned long long offset,
           const unsigned long long* base),
          sh::fill_random(sh::Bernoulli<C>{p}, sh::kTagBernoulli, mask, n, seed,
                          offset + (base ? *base : 0ull)))
// *counter += n, by one thread: the last node of a graph that draws n values.
SH_EXPORT(rng_advance, (unsigned long long* counter, unsigned long long n),
          if (blockIdx.x == 0 && threadIdx.x == 0) *counter += n)
