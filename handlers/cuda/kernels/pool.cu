// 2-D max and average pooling over NCHW arrays, forward and backward.
//
//   pool_fwd    out[plane, p, q] = max or mean of the window (p, q) of x's
//               plane; for max, argmax[plane, p, q] = r * ww + s, the
//               maximum's row and column within the window (counted from its
//               first corner, padding included), stored as a T: an index
//               that stays exact in a half format whatever the image size
//               (the host refuses windows whose indices would not be).
//               Grid-stride over the planes * P * Q outputs; each thread
//               reads its whole window.
//   pool_bwd    dx[plane, h, w] = the sum, over the windows (p, q) that
//               contain (h, w), of dy[plane, p, q] (max: where argmax[plane,
//               p, q] names (h, w); average: divided by the window's count).
//               Grid-stride over the planes * H * W elements of dx: each
//               element gathers from its windows in a fixed order, so there
//               are no atomics and the result is deterministic.
//
// Geometry: a plane is H x W (x, dx) and P x Q (out, argmax, dy); window
// (p, q) covers rows p * sh - ph .. p * sh - ph + wh - 1 and columns q * sw -
// pw .. q * sw - pw + ww - 1, clipped to the plane.  The host guarantees
// window, stride >= 1, 0 <= padding < window and P, Q >= 1, so every clipped
// window is non-empty; only elements inside the plane are read.  mode 0 is
// max, 1 average (argmax is then unused and may be null).
//
// Max semantics (as the NumPy handler): the first maximum in row-major order
// within the window, the first NaN if the window holds one (NaN wins).
// Average: the sum over the clipped window divided by its size (padding
// excluded, cuDNN's CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING).
//
// Formats: values are widened with ld() as they are read and compared or
// summed in the compute format C (float for the halves), and each output is
// rounded once with st<T>() (exact for max, whose output is an input
// element).  The backward pass matches argmax against (h, w)'s index in C:
// both are exact integers there.
//
// Launch: 1-D grid of 1-D blocks, any sizes.
#include "common.cuh"

namespace sh {

// The clipped range [lo, hi) of window `p` along one axis of length n.
__device__ __forceinline__ void window_range(long long p, int stride, int pad, int win,
                                             long long n, long long* lo, long long* hi) {
    const long long start = p * stride - pad;
    *lo = start < 0 ? 0 : start;
    *hi = start + win < n ? start + win : n;
}

// The windows [lo, hi] (inclusive) along one axis that contain index h;
// lo > hi when none does (possible only for h past the last window).
__device__ __forceinline__ void windows_of(long long h, int stride, int pad, int win,
                                           long long count, long long* lo, long long* hi) {
    const long long hp = h + pad;
    long long top = hp / stride;
    *hi = top < count - 1 ? top : count - 1;
    *lo = hp >= win ? (hp - win) / stride + 1 : 0;
}

template <typename T, typename C = compute_t<T>>
__device__ void pool_fwd_impl(const T* __restrict__ x, T* __restrict__ out,
                              T* __restrict__ argmax, long long planes, long long H,
                              long long W, long long P, long long Q, int wh, int ww, int sh,
                              int sw, int ph, int pw, int mode) {
    const long long n = planes * P * Q;
    for (long long e = grid_thread(); e < n; e += grid_stride()) {
        const long long q = e % Q, t = e / Q;
        const long long p = t % P, plane = t / P;
        long long h0, h1, w0, w1;
        window_range(p, sh, ph, wh, H, &h0, &h1);
        window_range(q, sw, pw, ww, W, &w0, &w1);
        const T* src = x + plane * H * W;
        if (mode == 0) {
            const long long r0 = p * sh - ph, c0 = q * sw - pw;   // the window's corner
            C best = ld(src[h0 * W + w0]);
            long long at = (h0 - r0) * ww + (w0 - c0);
            bool nan = best != best;
            for (long long h = h0; h < h1 && !nan; ++h) {
                for (long long w = w0; w < w1; ++w) {
                    const C v = ld(src[h * W + w]);
                    if (v != v) {          // the first NaN wins
                        best = v, at = (h - r0) * ww + (w - c0), nan = true;
                        break;
                    }
                    if (v > best) best = v, at = (h - r0) * ww + (w - c0);   // first of equals
                }
            }
            out[e] = st<T>(best);
            argmax[e] = st<T>((C)at);
        } else {
            C sum = 0;
            for (long long h = h0; h < h1; ++h)
                for (long long w = w0; w < w1; ++w) sum += ld(src[h * W + w]);
            out[e] = st<T>(sum / (C)((h1 - h0) * (w1 - w0)));
        }
    }
}

template <typename T, typename C = compute_t<T>>
__device__ void pool_bwd_impl(const T* __restrict__ dy, const T* __restrict__ argmax,
                              T* __restrict__ dx, long long planes, long long H, long long W,
                              long long P, long long Q, int wh, int ww, int sh, int sw, int ph,
                              int pw, int mode) {
    const long long n = planes * H * W;
    for (long long e = grid_thread(); e < n; e += grid_stride()) {
        const long long w = e % W, t = e / W;
        const long long h = t % H, plane = t / H;
        long long p0, p1, q0, q1;
        windows_of(h, sh, ph, wh, P, &p0, &p1);
        windows_of(w, sw, pw, ww, Q, &q0, &q1);
        const long long base = plane * P * Q;
        C sum = 0;
        for (long long p = p0; p <= p1; ++p) {
            for (long long q = q0; q <= q1; ++q) {
                const long long o = base + p * Q + q;
                if (mode == 0) {
                    // (h, w)'s index within window (p, q)
                    const C self = (C)((h - (p * sh - ph)) * ww + (w - (q * sw - pw)));
                    if (ld(argmax[o]) == self) sum += ld(dy[o]);
                } else {
                    long long a0, a1, b0, b1;
                    window_range(p, sh, ph, wh, H, &a0, &a1);
                    window_range(q, sw, pw, ww, W, &b0, &b1);
                    sum += ld(dy[o]) / (C)((a1 - a0) * (b1 - b0));
                }
            }
        }
        dx[e] = st<T>(sum);
    }
}

}  // namespace sh

SH_EXPORT(pool_fwd, (const T* x, T* out, T* argmax, long long planes, long long H, long long W,
                     long long P, long long Q, int wh, int ww, int sh, int sw, int ph, int pw,
                     int mode),
          sh::pool_fwd_impl<T>(x, out, argmax, planes, H, W, P, Q, wh, ww, sh, sw, ph, pw, mode))
SH_EXPORT(pool_bwd, (const T* dy, const T* argmax, T* dx, long long planes, long long H,
                     long long W, long long P, long long Q, int wh, int ww, int sh, int sw,
                     int ph, int pw, int mode),
          sh::pool_bwd_impl<T>(dy, argmax, dx, planes, H, W, P, Q, wh, ww, sh, sw, ph, pw, mode))
