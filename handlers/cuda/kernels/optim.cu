// Optimizer updates over the flat parameter buffer: Adam and AdamW in one
// pass (the op table's adam_update).
//
// One kernel per step reads g, m, v and p once and writes m, v and p once:
// the update is memory bound, so a single pass is what bounds it by the
// copy bandwidth.  Launch: a 1-D grid of 1-D blocks of any size (grid-stride
// loops); the host uses the elementwise grid (common.cuh), at least one
// block even for n == 0.
//
// The step counter lives on the device, so a captured step replays with the
// right bias corrections: every block reads t = *step + 1 when it starts,
// and the last block to finish stores t.  "Last" is decided by `done`, a
// zeroed counter of the launching stream: each block adds one when its work
// is done, after it read *step, so the block that sees gridDim.x - 1 knows
// that no block will read *step any more; it then stores t and puts the
// counter back to zero for the next launch on the stream.
//
// Formats: g, m, v, p, *lr_p and *step are arrays of the handler's format T;
// the scalars (lr, beta1, beta2, eps, weight_decay) and all the arithmetic
// are in the compute format C (float for the halves).  Each element's update
// runs in C on the widened g, m, v and p, and the new m, v and p are each
// rounded once to T as they are stored (the new p uses the unrounded new m
// and v).  The step counter is read widened and stored as st<T>(t).
#include "common.cuh"

namespace sh {

// Per-launch coefficients, computed once per block by thread 0.
// T here is the compute format.
template <typename T>
struct AdamCoeffs {
    T lr, beta1, beta2, eps;
    T decay;        // AdamW: p *= 1 - lr * weight_decay (1 for Adam)
    T l2;           // Adam: g += weight_decay * p (0 for AdamW)
    T c1, c2;       // bias corrections 1 - beta^t
    T t;

    // One element; the order of operations is NumpyHandler's (_adam_update).
    __device__ __forceinline__ void apply(T g, T& m, T& v, T& p) const {
        if (l2 != T(0)) g = g + p * l2;
        p = p * decay;
        m = m * beta1 + g * (T(1) - beta1);
        v = v * beta2 + (g * g) * (T(1) - beta2);
        const T denom = dm::sqrt(v / c2) + eps;   // eps after the square root
        p = p - ((m / c1) * lr) / denom;
    }
};

// g, m, v and p never overlap (the op's rule), hence __restrict__: the
// compiler may then keep the next trip's loads in flight across the stores.
template <typename T, typename C = compute_t<T>>
__device__ __forceinline__ void adam(const T* __restrict__ g, const T* lr_p, C lr, C beta1,
                                     C beta2, C eps, C wd, T* step, T* __restrict__ m,
                                     T* __restrict__ v, T* __restrict__ p, long long n,
                                     int decoupled, unsigned int* done, const T* gate_p,
                                     C gate) {
    // A gate of 0 (a skipped step) leaves everything as it is, step and the
    // counter included: every thread of every block returns here.
    if ((gate_p ? ld(*gate_p) : gate) == C(0)) return;
    __shared__ AdamCoeffs<C> shared;
    if (threadIdx.x == 0) {
        AdamCoeffs<C> c;
        c.t = ld(*step) + C(1);
        c.lr = lr_p ? ld(*lr_p) : lr;
        c.beta1 = beta1;
        c.beta2 = beta2;
        c.eps = eps;
        c.decay = decoupled ? C(1) - c.lr * wd : C(1);
        c.l2 = decoupled ? C(0) : wd;
        c.c1 = C(1) - dm::pow(beta1, c.t);
        c.c2 = C(1) - dm::pow(beta2, c.t);
        shared = c;
    }
    __syncthreads();
    const AdamCoeffs<C> c = shared;
    const long long stride = grid_stride();
    long long scalar_from = 0;
    // The flat buffers are 16-byte aligned (the parameter layout keeps them
    // so); any other alignment takes the scalar loop throughout.
    if (is_aligned16(g) && is_aligned16(m) && is_aligned16(v) && is_aligned16(p)) {
        const long long packets = n / kVec<T>;
        for (long long i = grid_thread(); i < packets; i += stride) {
            const Packet<T> pg = load_packet(g, i);
            Packet<T> pm = load_packet(m, i), pv = load_packet(v, i), pp = load_packet(p, i);
#pragma unroll
            for (int k = 0; k < kVec<T>; ++k) c.apply(pg.v[k], pm.v[k], pv.v[k], pp.v[k]);
            store_packet(m, i, pm);
            store_packet(v, i, pv);
            store_packet(p, i, pp);
        }
        scalar_from = packets * kVec<T>;
    }
    for (long long i = scalar_from + grid_thread(); i < n; i += stride) {
        C mi = ld(m[i]), vi = ld(v[i]), pi = ld(p[i]);
        c.apply(ld(g[i]), mi, vi, pi);
        m[i] = st<T>(mi);
        v[i] = st<T>(vi);
        p[i] = st<T>(pi);
    }
    // Advance the step counter once every block has read it (see the top).
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(done, 1u) == gridDim.x - 1) {
            *step = st<T>(c.t);
            *done = 0u;
        }
    }
}

// scale_finite_t: a = factor * a where a is finite, else 0; *flag, set to 1
// by the host before the launch, becomes 0 if any element was not finite
// (every writer stores the same 0, so a plain store suffices).  Each product
// is computed in C and rounded once.
template <typename T, typename C = compute_t<T>>
__device__ __forceinline__ void scale_finite(T* a, const T* factor_p, C factor, T* flag,
                                             long long n) {
    const C f = factor_p ? ld(*factor_p) : factor;
    const long long stride = grid_stride();
    bool ok = true;
    long long scalar_from = 0;
    if (is_aligned16(a)) {
        const long long packets = n / kVec<T>;
        for (long long i = grid_thread(); i < packets; i += stride) {
            Packet<T> x = load_packet(a, i);
#pragma unroll
            for (int k = 0; k < kVec<T>; ++k) {
                const bool fin = dm::isfinite(x.v[k]);
                ok &= fin;
                x.v[k] = fin ? x.v[k] * f : C(0);
            }
            store_packet(a, i, x);
        }
        scalar_from = packets * kVec<T>;
    }
    for (long long i = scalar_from + grid_thread(); i < n; i += stride) {
        const C x = ld(a[i]);
        const bool fin = dm::isfinite(x);
        ok &= fin;
        a[i] = st<T>(fin ? x * f : C(0));
    }
    if (!ok) *flag = st<T>(C(0));
}

// update_loss_scale, on one thread: state = [scale, 1 / scale, streak of
// finite steps, steps skipped], in the handler's format.
template <typename T, typename C = compute_t<T>>
__device__ __forceinline__ void loss_scale(const T* flag, T* state, C interval, C max_scale) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    C scale = ld(state[0]), streak = ld(state[2]), skipped = ld(state[3]);
    if (ld(*flag) == C(0)) {
        scale = scale * C(0.5);
        streak = C(0);
        skipped = skipped + C(1);
    } else {
        streak = streak + C(1);
        if (streak >= interval) {
            scale = scale * C(2) < max_scale ? scale * C(2) : max_scale;
            streak = C(0);
        }
    }
    state[0] = st<T>(scale);
    state[1] = st<T>(C(1) / scale);
    state[2] = st<T>(streak);
    state[3] = st<T>(skipped);
}

}  // namespace sh

SH_EXPORT(adam,
          (const T* g, const T* lr_p, C lr, C beta1, C beta2, C eps, C weight_decay, T* step,
           T* m, T* v, T* p, long long n, int decoupled, unsigned int* done, const T* gate_p,
           C gate),
          sh::adam(g, lr_p, lr, beta1, beta2, eps, weight_decay, step, m, v, p, n, decoupled,
                   done, gate_p, gate))

SH_EXPORT(scale_finite, (T* a, const T* factor_p, C factor, T* flag, long long n),
          sh::scale_finite(a, factor_p, factor, flag, n))

SH_EXPORT(loss_scale, (const T* flag, T* state, C interval, C max_scale),
          sh::loss_scale(flag, state, interval, max_scale))
