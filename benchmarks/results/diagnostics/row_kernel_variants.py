"""Which row-kernel structure brings softmax and LayerNorm to >= 85% of copy on an H200:
standalone float32 kernels of a few structures, timed beside ours at the suite's shapes.

On an H200 (``benchmarks reductions``' fused rows: float32, inputs from DRAM, copy
4.0 TB/s over the bytes read and written) the generated row kernels
(``handlers/cuda/fused_source.py``, ``fx::rows_loop`` of kernels/fused.cuh) reach 0.58 of
copy for ``softmax_m`` at (8192, 4096) (115 us; torch.compile 111) and 0.69 at
(32768, 1000) (94.5 us; torch 69), and LayerNorm's forward 0.61 (110 us; torch.compile 74)
and 86 us (torch.compile 72); rows of 50257 (streamed, not held) take 1319 us against
torch's 776.  A hand-written softmax once ran (8192, 4096) in 77-80 us, and cutting the
generated kernel's registers from 53 to 43 gained nothing.  What ours does there (R = 8
floats a thread, a block per row of cols / 8 threads rounded up to a warp): each level of
reductions is a pass over the held row and a ``block_reduce`` with two barriers, and the
outputs' pass recomputes the per-element values from the inputs, so softmax evaluates
``expf`` twice per element and divides each one by the sum; LayerNorm reads gain and bias
element by element; rows of odd length are streamed element by element (no 16-byte
packets), one pass over memory per level plus one for the outputs.  Hypotheses:

1. the math per element, not the memory structure, is what holds a held row back: ``exp``
   twice and an IEEE division per element (softmax's ``ours`` mode below) against ``exp``
   once kept in registers (``two``), a reciprocal multiply (``recip``), ``__expf``
   (``fast``);
2. bytes in flight against occupancy: 4, 8 or 16 floats a thread (blocks of 1024, 512, 256
   threads at 4096 columns), one block per row against a resident grid striding over rows;
3. barriers: one block reduction of (max, sum) pairs, an online softmax (``online``), or of
   (count, mean, M2) triples for LayerNorm (``welford``), against two reductions;
4. rows of <= 1024 floats: a warp (32 floats a lane) or a half-warp (64) per row, several
   rows a block, shuffles only, no ``__syncthreads``;
5. rows too long to hold: two passes over memory (pass 1 an online max and sum, pass 2 the
   outputs) with 16-byte packets after a scalar peel to the row's first 16-byte boundary,
   fewer rows in flight than fill the L2 so that pass 2 reads from it, and cache hints
   (pass 2 loads ``__ldcs``, stores ``__stcs``) so that the outputs do not evict the inputs
   pass 2 rereads; or a cluster of 8 blocks holding the row in registers (distributed
   shared memory for the combine, one read and one write of every element).

Kernels (CUDA sources below; every kernel compiled and launched as the project's fused ops
are: ``kernel_loader.source_function`` and ``kernel_loader.launch_function``):

* ``softmax_{b4,b8,b16}_{mode}``, (a) and (c): a block per row, row held as float4 packets,
  4/8/16 floats a thread (block = the smallest multiple of 32 that holds the row); modes
  ``two`` (max then sum, two block reductions: warp shuffles and one shared-memory step
  with one barrier each, exp once, ``e / s``), ``ours`` (the same, exp recomputed for the
  outputs and ``exp(x - m) / s``: our kernel's math, not its two barriers a reduction),
  ``recip`` (``e * (1 / s)``),
  ``fast`` (``recip`` with ``__expf``: the only mode not using precise math) and
  ``online`` (each thread's max and its sum of exp(x - its max), one block reduction of
  the pairs, outputs ``e * (exp(own max - max) / s)``; precise ``expf``);
* ``softmax_{w32,w16}_{mode}``, (b): a warp (half-warp) per row, 32 (64) floats a lane,
  rows <= 1024 floats, several rows a block, no barrier;
* ``layernorm_{b4,b8,b16,w32,w16}_{mode}``: the same structures for LayerNorm's y
  (``y = (x - mean) * rstd * gain + bias``, products rounded alone as ours,
  ``rstd = 1 / sqrtf(var + eps)``): ``two`` (mean, then the mean of (x - mean)^2 over the
  held row: two reductions; gain and bias as float4), ``scalar`` (the same, gain and bias
  read element by element as ours does) and ``welford`` (each thread's count, mean and M2,
  one reduction of triples combined by Chan et al.'s rule);
* ``softmax_stream_u{4,8}[_hints]``, (d), rows of 50257 (odd: each row starts 0-3 floats
  off a 16-byte boundary): a block per row, U float4 packets in flight a thread (U = 8
  only at 512 threads: under 1024 it spills), precise ``expf``, ``* (1 / s)``, at several
  grids (rows in flight);
* ``softmax_cluster_p{2,4,8}``: a cluster of 8 blocks per row (``__cluster_dims__``), each
  block holding an eighth in registers (P packets a thread), one cluster barrier a row.

Ours: ``h.softmax_m(x, out)`` and ``layers.LayerNorm``'s forward (built as
``benchmarks.reductions``' fused rows build it; ours also writes each row's mean and
1 / std, 8 bytes a row, not counted), with the strategy, grid and block the host plans
(``fused_source.plan_rows``, ``strategy``) and the registers of its generated kernel.

Timing as the suites: float32, each case cycling ``benchmarks.ops.inputs_beyond_l2``
copies of its input (so that every call reads from DRAM), LOOP = 10 calls back to back
between CUDA events (``benchmarks.gpu.EventTimer`` on the handler's stream), median of
REPS = 7; bytes = inputs read once + output written once (LayerNorm: x, gain and bias, y),
as ``benchmarks.reductions``; fraction of the copy bandwidth of 128 MB
(``benchmarks.ops.copy_spread``).  Each table lists every launch shape; a summary gives
each kernel's best.  Registers a thread (and local memory, where spilled) from
cuFuncGetAttribute through pycuda on the binary ``kernel_loader`` compiled (kernel_loader
exposes no attribute query), else from ``nvcc --resource-usage``, else "?".

Checks: every output (ours' and each launch shape's, into an output filled with NaN first)
against NumPy in float64 (``benchmarks.reductions``' ``_softmax64`` and ``_layernorm64``):
the float64 reference is rounded once to float32 and compared on the device (a max |got -
ref| kernel, NaN counting as infinite), the error reported as that over max |ref| plus
2^-24 (a bound of the reference's rounding), within 1e-5 (softmax) and 1e-4 (LayerNorm);
ours is also compared on the host against the float64 reference itself, which validates
the device check.  A failed check prints FAILED instead of a time.  Each section catches
its own errors and prints them, so one failure leaves the rest (a kernel that faulted the
context would still end every later section: the riskiest kernels, the clusters, run last).

Run by hand from the project root on a GPU machine (sm_90 for the cluster kernels):
``python benchmarks/results/diagnostics/row_kernel_variants.py``.  Estimated 30-50 s on an
H200 with a cold pycuda cache (nvcc about 10 s, the float64 references about 10 s, some 175
checked and timed launches); about 4 GB of device memory and 4 GB of host memory.  Its run:
``row_kernel_variants-NVIDIA-H200.log`` (2026-11-27).
"""
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from types import SimpleNamespace

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from benchmarks.gpu import EventTimer, cuda_handler  # noqa: E402
from benchmarks.ops import LOOP, copy_spread, inputs_beyond_l2  # noqa: E402
from benchmarks.reductions import (  # noqa: E402
    LAYERNORM_TOL,
    LN_EPS,
    SOFTMAX_TOL,
    _layer,
    _layernorm64,
    _softmax64,
)
from handlers.cuda import fused_source, kernel_loader  # noqa: E402

F32 = np.float32
MB = 1 << 20
REPS = 7
TARGET = 0.85                      # the fraction of copy the generator should reach
SEED = 20261202
HELD_SHAPES = ((8192, 4096), (32768, 1000))
LONG_SHAPE = (4096, 50257)
REF_ROWS = 512                     # rows of a float64 reference chunk (bounds host memory)
CLUSTER = 8                        # blocks a cluster (the portable maximum)

# ------------------------------------------------------------------ CUDA sources
#: What the held kernels share: NaN-propagating max (numpy.max's rule, as fx::max), the
#: combines of one value, of (max, sum) pairs and of (count, mean, M2) triples, over aligned
#: groups of G lanes (shuffles) or over the block (shuffles in each warp, the warps'
#: partials through shared memory with one barrier, then each warp combines them itself).
#: A block reduction's buffer is rewritten only after a later barrier, which every thread
#: reaches after its reads: so callers alternate buffers and need no second barrier.
COMMON = r"""
namespace rkv {
constexpr unsigned FULL = 0xffffffffu;
constexpr float NEG_INF = -__builtin_huge_valf();

__device__ __forceinline__ float nanmax(float a, float b) {
    return a != a ? a : (b != b || b > a) ? b : a;
}
struct Max { __device__ float operator()(float a, float b) const { return nanmax(a, b); } };
struct Add { __device__ float operator()(float a, float b) const { return a + b; } };

template <int G, class Op> __device__ __forceinline__ float lanes(float v, Op op) {
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

template <class Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float id, float* buf) {
    const int lane = threadIdx.x & 31;
    v = lanes<32>(v, op);
    if (lane == 0) buf[threadIdx.x >> 5] = v;
    __syncthreads();
    return lanes<32>(lane < (int)(blockDim.x >> 5) ? buf[lane] : id, op);
}

// Over the row's G lanes, or the block where G == 0.
template <int G, class Op>
__device__ __forceinline__ float row_reduce(float v, Op op, float id, float* buf) {
    if constexpr (G == 0) return block_reduce(v, op, id, buf);
    else return lanes<G>(v, op);
}

// (m, s): a maximum and a sum of exp(x - m).  The side at the joint maximum keeps its sum
// (no exp(-inf + inf) when both are -inf); a NaN maximum gives a NaN sum.
struct MS { float m, s; };
__device__ __forceinline__ MS join(MS a, MS b) {
    const float m = nanmax(a.m, b.m);
    const bool a_top = a.m == m;
    const MS top = a_top ? a : b, low = a_top ? b : a;
    return {m, top.s + (low.m == m ? low.s : low.s * expf(low.m - m))};
}
template <int G> __device__ __forceinline__ MS lanes_ms(MS v) {
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1)
        v = join(v, MS{__shfl_xor_sync(FULL, v.m, o), __shfl_xor_sync(FULL, v.s, o)});
    return v;
}
__device__ __forceinline__ MS block_ms(MS v, float* bm, float* bs) {
    const int lane = threadIdx.x & 31;
    v = lanes_ms<32>(v);
    if (lane == 0) {
        bm[threadIdx.x >> 5] = v.m;
        bs[threadIdx.x >> 5] = v.s;
    }
    __syncthreads();
    const bool in = lane < (int)(blockDim.x >> 5);
    return lanes_ms<32>(MS{in ? bm[lane] : NEG_INF, in ? bs[lane] : 0.f});
}
template <int G> __device__ __forceinline__ MS row_ms(MS v, float* bm, float* bs) {
    if constexpr (G == 0) return block_ms(v, bm, bs);
    else return lanes_ms<G>(v);
}

// (n, mean, M2) of Chan, Golub and LeVeque: counts as floats (exact below 2^24).
struct W { float n, mean, m2; };
__device__ __forceinline__ W join(W a, W b) {
    const float n = a.n + b.n;
    const float f = n > 0.f ? b.n / n : 0.f;
    const float d = b.mean - a.mean;
    return {n, a.mean + d * f, a.m2 + b.m2 + d * d * a.n * f};
}
template <int G> __device__ __forceinline__ W lanes_w(W v) {
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1)
        v = join(v, W{__shfl_xor_sync(FULL, v.n, o), __shfl_xor_sync(FULL, v.mean, o),
                      __shfl_xor_sync(FULL, v.m2, o)});
    return v;
}
__device__ __forceinline__ W block_w(W v, float* bn, float* bmean, float* bm2) {
    const int lane = threadIdx.x & 31;
    v = lanes_w<32>(v);
    if (lane == 0) {
        bn[threadIdx.x >> 5] = v.n;
        bmean[threadIdx.x >> 5] = v.mean;
        bm2[threadIdx.x >> 5] = v.m2;
    }
    __syncthreads();
    const bool in = lane < (int)(blockDim.x >> 5);
    return lanes_w<32>(W{in ? bn[lane] : 0.f, in ? bmean[lane] : 0.f, in ? bm2[lane] : 0.f});
}
template <int G> __device__ __forceinline__ W row_w(W v, float* bn, float* bmean, float* bm2) {
    if constexpr (G == 0) return block_w(v, bn, bmean, bm2);
    else return lanes_w<G>(v);
}
}  // namespace rkv
"""

#: (a), (b), (c) for softmax: rows of cols floats (cols % 4 == 0, 16-byte aligned arrays),
#: held as P float4 packets a thread.  G == 0: a block per row (n = blockDim.x threads
#: hold it); G = 32 or 16: a lane group per row, blockDim.x / G rows a block.  Thread li of
#: a row holds packets li, li + n, ... (each load instruction of a warp reads contiguous
#: bytes).  The blocks stride over row groups; every thread of a block takes the same trips
#: (a group past the last row only joins the shuffles).  Padding is -inf: exp gives 0.
SOFTMAX_SOURCE = COMMON + r"""
namespace rkv {
enum { TWO = 0, OURS = 1, RECIP = 2, FAST = 3, ONLINE = 4 };

template <int P, int G, int MODE>
__device__ __forceinline__ void softmax_held(const float* __restrict__ x, float* __restrict__ y,
                                             long long rows, int cols) {
    __shared__ float buf[4][32];
    const int n = G ? G : (int)blockDim.x;
    const int li = G ? (int)(threadIdx.x & (G - 1)) : (int)threadIdx.x;
    const long long rpb = G ? blockDim.x / G : 1;
    const int npk = cols >> 2;
    int parity = 0;
    for (long long r0 = blockIdx.x * rpb; r0 < rows; r0 += gridDim.x * rpb, parity ^= 1) {
        const long long r = r0 + (G ? threadIdx.x / G : 0);
        const bool live = r < rows;
        const float4* __restrict__ xr = reinterpret_cast<const float4*>(x) + r * npk;
        float4* __restrict__ yr = reinterpret_cast<float4*>(y) + r * npk;
        float v[4 * P];
#pragma unroll
        for (int q = 0; q < P; ++q) {
            const int p = li + q * n;
            float4 a = make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
            if (live && p < npk) a = xr[p];
            v[4 * q] = a.x; v[4 * q + 1] = a.y; v[4 * q + 2] = a.z; v[4 * q + 3] = a.w;
        }
        float4 o[P];   // the outputs, by packet
        if constexpr (MODE == ONLINE) {
            MS t{NEG_INF, 0.f};
#pragma unroll
            for (int k = 0; k < 4 * P; ++k) t.m = nanmax(t.m, v[k]);
            const float base = t.m == NEG_INF ? 0.f : t.m;   // a thread holding padding only
#pragma unroll
            for (int k = 0; k < 4 * P; ++k) {
                v[k] = expf(v[k] - base);
                t.s += v[k];
            }
            const MS row = row_ms<G>(t, buf[2 * parity], buf[2 * parity + 1]);
            const float c = (t.m == row.m ? 1.f : expf(t.m - row.m)) / row.s;
#pragma unroll
            for (int q = 0; q < P; ++q)
                o[q] = make_float4(v[4 * q] * c, v[4 * q + 1] * c, v[4 * q + 2] * c,
                                   v[4 * q + 3] * c);
        } else {
            float m = NEG_INF;
#pragma unroll
            for (int k = 0; k < 4 * P; ++k) m = nanmax(m, v[k]);
            m = row_reduce<G>(m, Max{}, NEG_INF, buf[0]);
            float s = 0.f;
#pragma unroll
            for (int k = 0; k < 4 * P; ++k) {
                if constexpr (MODE == OURS) {
                    s += expf(v[k] - m);
                } else {
                    v[k] = MODE == FAST ? __expf(v[k] - m) : expf(v[k] - m);
                    s += v[k];
                }
            }
            s = row_reduce<G>(s, Add{}, 0.f, buf[1]);
            const float inv = 1.f / s;
            float e[4 * P];
#pragma unroll
            for (int k = 0; k < 4 * P; ++k) {
                if constexpr (MODE == OURS) e[k] = expf(v[k] - m) / s;
                else if constexpr (MODE == TWO) e[k] = v[k] / s;
                else e[k] = v[k] * inv;
            }
#pragma unroll
            for (int q = 0; q < P; ++q)
                o[q] = make_float4(e[4 * q], e[4 * q + 1], e[4 * q + 2], e[4 * q + 3]);
        }
#pragma unroll
        for (int q = 0; q < P; ++q) {
            const int p = li + q * n;
            if (live && p < npk) yr[p] = o[q];
        }
    }
}
}  // namespace rkv

#define SOFTMAX_KERNEL(NAME, P, G, MODE, BOUND)                                         \
    extern "C" __global__ void __launch_bounds__(BOUND)                                 \
    NAME(const float* x, float* y, long long rows, int cols) {                          \
        rkv::softmax_held<P, G, MODE>(x, y, rows, cols);                                \
    }
"""

#: The same structures for LayerNorm's y.  Modes: TWO_STEP (two reductions over the held
#: row, gain and bias as float4), SCALAR_GB (the same, gain and bias read element by
#: element, as ours), WELFORD (one reduction of (count, mean, M2) triples).  Padding is 0
#: and left out of every sum by the packet's predicate.
LAYERNORM_SOURCE = COMMON + r"""
namespace rkv {
enum { TWO_STEP = 0, SCALAR_GB = 1, WELFORD = 2 };

template <int P, int G, int MODE>
__device__ __forceinline__ void layernorm_held(const float* __restrict__ x,
                                               const float* __restrict__ gain,
                                               const float* __restrict__ bias, float eps,
                                               float* __restrict__ y, long long rows, int cols) {
    __shared__ float buf[6][32];
    const int n = G ? G : (int)blockDim.x;
    const int li = G ? (int)(threadIdx.x & (G - 1)) : (int)threadIdx.x;
    const long long rpb = G ? blockDim.x / G : 1;
    const int npk = cols >> 2;
    const float4* __restrict__ g4 = reinterpret_cast<const float4*>(gain);
    const float4* __restrict__ b4 = reinterpret_cast<const float4*>(bias);
    int parity = 0;
    for (long long r0 = blockIdx.x * rpb; r0 < rows; r0 += gridDim.x * rpb, parity ^= 1) {
        const long long r = r0 + (G ? threadIdx.x / G : 0);
        const bool live = r < rows;
        const float4* __restrict__ xr = reinterpret_cast<const float4*>(x) + r * npk;
        float4* __restrict__ yr = reinterpret_cast<float4*>(y) + r * npk;
        float v[4 * P];
        bool held[P];
#pragma unroll
        for (int q = 0; q < P; ++q) {
            const int p = li + q * n;
            held[q] = live && p < npk;
            float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
            if (held[q]) a = xr[p];
            v[4 * q] = a.x; v[4 * q + 1] = a.y; v[4 * q + 2] = a.z; v[4 * q + 3] = a.w;
        }
        float mean, rstd;
        if constexpr (MODE == WELFORD) {
            float cnt = 0.f, s = 0.f;
#pragma unroll
            for (int q = 0; q < P; ++q) {
                if (held[q]) {
                    cnt += 4.f;
                    s += ((v[4 * q] + v[4 * q + 1]) + (v[4 * q + 2] + v[4 * q + 3]));
                }
            }
            const float mt = cnt > 0.f ? s / cnt : 0.f;
            float m2 = 0.f;
#pragma unroll
            for (int k = 0; k < 4 * P; ++k) {
                const float d = v[k] - mt;
                if (held[k / 4]) m2 += __fmul_rn(d, d);
            }
            const W w = row_w<G>(W{cnt, mt, m2}, buf[3 * parity], buf[3 * parity + 1],
                                 buf[3 * parity + 2]);
            mean = w.mean;
            rstd = 1.f / sqrtf(w.m2 / (float)cols + eps);
        } else {
            float s = 0.f;
#pragma unroll
            for (int k = 0; k < 4 * P; ++k) s += v[k];   // padding is 0
            mean = row_reduce<G>(s, Add{}, 0.f, buf[0]) / (float)cols;
            float q2 = 0.f;
#pragma unroll
            for (int k = 0; k < 4 * P; ++k) {
                const float d = v[k] - mean;
                if (held[k / 4]) q2 += __fmul_rn(d, d);
            }
            rstd = 1.f / sqrtf(row_reduce<G>(q2, Add{}, 0.f, buf[1]) / (float)cols + eps);
        }
#pragma unroll
        for (int q = 0; q < P; ++q) {
            if (!held[q]) continue;
            const int p = li + q * n;
            float4 g, b;
            if constexpr (MODE == SCALAR_GB) {
                g = make_float4(gain[4 * p], gain[4 * p + 1], gain[4 * p + 2], gain[4 * p + 3]);
                b = make_float4(bias[4 * p], bias[4 * p + 1], bias[4 * p + 2], bias[4 * p + 3]);
            } else {
                g = g4[p];
                b = b4[p];
            }
            const float* e = v + 4 * q;
            yr[p] = make_float4(__fmul_rn(__fmul_rn(e[0] - mean, rstd), g.x) + b.x,
                                __fmul_rn(__fmul_rn(e[1] - mean, rstd), g.y) + b.y,
                                __fmul_rn(__fmul_rn(e[2] - mean, rstd), g.z) + b.z,
                                __fmul_rn(__fmul_rn(e[3] - mean, rstd), g.w) + b.w);
        }
    }
}
}  // namespace rkv

#define LAYERNORM_KERNEL(NAME, P, G, MODE, BOUND)                                       \
    extern "C" __global__ void __launch_bounds__(BOUND)                                 \
    NAME(const float* x, const float* gain, const float* bias, float eps, float* y,     \
         long long rows, int cols) {                                                    \
        rkv::layernorm_held<P, G, MODE>(x, gain, bias, eps, y, rows, cols);             \
    }
"""

#: (d): rows too long to hold.  Row r starts at element r * cols; with 16-byte aligned
#: arrays its first head = (4 - (r * cols) % 4) % 4 elements come before a 16-byte
#: boundary, then npk whole packets (loaded as float4 by x and y alike: both arrays have the
#: same layout), then tail < 4 elements.  Thread t < head holds head element t and thread
#: T - tail + i tail element i as one scalar each.  Pass 1: an online (max, sum) over
#: trips of U packets in flight (each trip rescales the running sum once), the scalar
#: folded in, one block reduction of the pairs; pass 2 reads again and writes
#: exp(x - m) * (1 / s), precise expf.  HINTS: pass 2 loads with __ldcs (last use: evict
#: first) and stores with __stcs (streaming), so that the outputs do not push out of the
#: L2 the inputs that pass 2 of the other rows in flight is about to read.
STREAM_SOURCE = COMMON + r"""
namespace rkv {
template <bool HINTS> __device__ __forceinline__ float4 last_load(const float4* p) {
    if constexpr (HINTS) return __ldcs(p);
    else return *p;
}
template <bool HINTS> __device__ __forceinline__ void store(float4* p, float4 v) {
    if constexpr (HINTS) __stcs(p, v);
    else *p = v;
}

template <int U, bool HINTS>
__device__ __forceinline__ void softmax_stream(const float* __restrict__ x,
                                               float* __restrict__ y, long long rows,
                                               long long cols) {
    __shared__ float buf[4][32];
    const int T = blockDim.x, t = threadIdx.x;
    int parity = 0;
    for (long long r = blockIdx.x; r < rows; r += gridDim.x, parity ^= 1) {
        const long long start = r * cols;
        const long long head = min((long long)((4 - (start & 3)) & 3), cols);
        const long long npk = (cols - head) >> 2;
        const long long tail = cols - head - 4 * npk;
        const float4* __restrict__ xb = reinterpret_cast<const float4*>(x + start + head);
        float4* __restrict__ yb = reinterpret_cast<float4*>(y + start + head);
        long long si = -1;   // this thread's scalar (head or tail element), if any
        if (t < head) si = start + t;
        else if (t >= T - tail) si = start + head + 4 * npk + (t - (T - tail));
        MS acc{NEG_INF, 0.f};
        const float xs = si >= 0 ? x[si] : NEG_INF;
        if (si >= 0) acc = MS{xs, 1.f};
        for (long long p = t; p < npk; p += (long long)U * T) {
            float4 a[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                a[u] = p + u * T < npk ? xb[p + u * T]
                                       : make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
            float cm = NEG_INF;
#pragma unroll
            for (int u = 0; u < U; ++u)
                cm = nanmax(nanmax(nanmax(cm, a[u].x), nanmax(a[u].y, a[u].z)), a[u].w);
            const float m = nanmax(acc.m, cm);
            const float base = m == NEG_INF ? 0.f : m;
            float s = 0.f;
#pragma unroll
            for (int u = 0; u < U; ++u)
                s += (expf(a[u].x - base) + expf(a[u].y - base))
                   + (expf(a[u].z - base) + expf(a[u].w - base));
            acc.s = (acc.m == m ? acc.s : acc.s * expf(acc.m - m)) + s;
            acc.m = m;
        }
        const MS row = block_ms(acc, buf[2 * parity], buf[2 * parity + 1]);
        const float inv = 1.f / row.s;
        for (long long p = t; p < npk; p += (long long)U * T) {
            float4 a[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (p + u * T < npk) a[u] = last_load<HINTS>(xb + p + u * T);
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (p + u * T < npk)
                    store<HINTS>(yb + p + u * T,
                                 make_float4(expf(a[u].x - row.m) * inv,
                                             expf(a[u].y - row.m) * inv,
                                             expf(a[u].z - row.m) * inv,
                                             expf(a[u].w - row.m) * inv));
        }
        if (si >= 0) y[si] = expf(xs - row.m) * inv;
    }
}
}  // namespace rkv

#define STREAM_KERNEL(NAME, U, HINTS, BOUND)                                            \
    extern "C" __global__ void __launch_bounds__(BOUND)                                 \
    NAME(const float* x, float* y, long long rows, long long cols) {                    \
        rkv::softmax_stream<U, HINTS>(x, y, rows, cols);                                \
    }
"""

#: Rows too long for a block, held by a cluster of CL blocks (``__cluster_dims__``: the
#: plain launch honours it; the grid is a multiple of CL).  The row's whole packets (after
#: the head, as STREAM_SOURCE) are cut into CL runs of per = ceil(npk / CL); block k holds
#: run k, P packets a thread (T * P >= per, checked by the host); block 0's threads hold
#: the head's scalars and block CL - 1's the tail's.  Each thread: its max and sum of
#: exp(x - its max) (kept in registers), the block's pair through block_ms, written to
#: shared memory; a cluster barrier; every thread joins the CL blocks' pairs in rank order
#: (distributed shared memory) and writes e * (exp(own max - max) / s).  Pairs and block
#: partials alternate buffers by row parity, so one cluster barrier a row suffices: the
#: next row's barrier comes after every block's reads; a last barrier keeps each block's
#: shared memory alive until the others have read it.
CLUSTER_SOURCE = COMMON + r"""
#include <cooperative_groups.h>
namespace rkv {
namespace cg = cooperative_groups;

template <int P, int CL>
__device__ __forceinline__ void softmax_cluster(const float* __restrict__ x,
                                                float* __restrict__ y, long long rows,
                                                long long cols) {
    __shared__ float buf[4][32];
    __shared__ float part[2][2];
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int T = blockDim.x, t = threadIdx.x;
    const long long clusters = gridDim.x / CL;
    int parity = 0;
    for (long long r = blockIdx.x / CL; r < rows; r += clusters, parity ^= 1) {
        const long long start = r * cols;
        const long long head = min((long long)((4 - (start & 3)) & 3), cols);
        const long long npk = (cols - head) >> 2;
        const long long tail = cols - head - 4 * npk;
        const long long per = (npk + CL - 1) / CL;
        const long long b0 = rank * per, b1 = min(npk, b0 + per);
        const float4* __restrict__ xb = reinterpret_cast<const float4*>(x + start + head);
        float4* __restrict__ yb = reinterpret_cast<float4*>(y + start + head);
        float v[4 * P];
#pragma unroll
        for (int q = 0; q < P; ++q) {
            const long long p = b0 + t + (long long)q * T;
            float4 a = make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
            if (p < b1) a = xb[p];
            v[4 * q] = a.x; v[4 * q + 1] = a.y; v[4 * q + 2] = a.z; v[4 * q + 3] = a.w;
        }
        long long si = -1;
        if (rank == 0 && t < head) si = start + t;
        else if (rank == CL - 1 && t < tail) si = start + head + 4 * npk + t;
        float xs = si >= 0 ? x[si] : NEG_INF;
        MS own{xs, 0.f};
#pragma unroll
        for (int k = 0; k < 4 * P; ++k) own.m = nanmax(own.m, v[k]);
        const float base = own.m == NEG_INF ? 0.f : own.m;
        xs = expf(xs - base);
        own.s = xs;
#pragma unroll
        for (int k = 0; k < 4 * P; ++k) {
            v[k] = expf(v[k] - base);
            own.s += v[k];
        }
        const MS blk = block_ms(own, buf[2 * parity], buf[2 * parity + 1]);
        if (t == 0) {
            part[parity][0] = blk.m;
            part[parity][1] = blk.s;
        }
        cluster.sync();
        MS row{NEG_INF, 0.f};
#pragma unroll
        for (int k = 0; k < CL; ++k) {
            const float* other = cluster.map_shared_rank(&part[parity][0], k);
            row = join(row, MS{other[0], other[1]});
        }
        const float c = (own.m == row.m ? 1.f : expf(own.m - row.m)) / row.s;
#pragma unroll
        for (int q = 0; q < P; ++q) {
            const long long p = b0 + t + (long long)q * T;
            if (p < b1)
                yb[p] = make_float4(v[4 * q] * c, v[4 * q + 1] * c, v[4 * q + 2] * c,
                                    v[4 * q + 3] * c);
        }
        if (si >= 0) y[si] = xs * c;
    }
    cluster.sync();
}
}  // namespace rkv

#define CLUSTER_KERNEL(NAME, P, CL, BOUND)                                              \
    extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(BOUND)      \
    NAME(const float* x, float* y, long long rows, long long cols) {                    \
        rkv::softmax_cluster<P, CL>(x, y, rows, cols);                                  \
    }
"""

#: The device check: the largest |a[i] - b[i]| of each block into out[block] (a NaN or an
#: infinite difference counts as infinite, so an output left NaN always fails).
CHECK_SOURCE = r"""
#include <math_constants.h>
extern "C" __global__ void __launch_bounds__(256)
max_abs_diff(const float* a, const float* b, long long n, float* out) {
    float m = 0.f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d == d ? d : CUDART_INF_F;
    }
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    __shared__ float w[8];
    if ((threadIdx.x & 31) == 0) w[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < (int)(blockDim.x >> 5); ++k) m = fmaxf(m, w[k]);
        out[blockIdx.x] = fmaxf(m, w[0]);
    }
}
"""
CHECK_BLOCK, CHECK_PER_SM = 256, 4

#: The held kernels' structures: tag -> (P float4 packets a thread, G lanes a row (0: the
#: block), __launch_bounds__, what).  A block per row's block size follows from cols.
HELD = {"b4": (1, 0, 1024, "block/row, 4 floats a thread"),
        "b8": (2, 0, 512, "block/row, 8 floats a thread"),
        "b16": (4, 0, 256, "block/row, 16 floats a thread"),
        "w32": (8, 32, 256, "warp/row, 32 floats a lane"),
        "w16": (16, 16, 256, "half-warp/row, 64 floats a lane")}
#: mode -> (its index in the source, what it computes)
SOFTMAX_MODES = {"two": (0, "expf once, e / s"),
                 "ours": (1, "expf twice, expf / s (ours)"),
                 "recip": (2, "expf once, e * (1/s)"),
                 "fast": (3, "__expf (fast), e * (1/s)"),
                 "online": (4, "expf, 1 reduction of (max, sum)")}
LAYERNORM_MODES = {"two": (0, "2 reductions, float4 gain/bias"),
                   "scalar": (1, "2 reductions, scalar gain/bias (ours)"),
                   "welford": (2, "1 reduction of (n, mean, M2)")}
#: the streamed kernels: packets in flight a thread -> __launch_bounds__ (8 packets spill
#: under 1024: 64 registers)
STREAM_UNROLLS = {4: 1024, 8: 512}
#: the cluster kernels: packets a thread -> threads a block (also its __launch_bounds__)
CLUSTER_PACKETS = {2: 1024, 4: 512, 8: 256}


def held_names(op, modes):
    """{kernel name: (tag, mode)} of the held kernels of ``op`` ("softmax" or "layernorm")."""
    return {f"{op}_{tag}_{mode}": (tag, mode) for tag in HELD for mode in modes}


def instantiations(macro, op, modes):
    """The lines that instantiate every held kernel of ``op`` through ``macro``."""
    return "\n".join(f"{macro}({name}, {HELD[tag][0]}, {HELD[tag][1]}, {modes[mode][0]}, "
                     f"{HELD[tag][2]})" for name, (tag, mode) in held_names(op, modes).items())


def stream_names():
    """{name: (U, hints)} of the streamed softmax kernels."""
    return {f"softmax_stream_u{u}{'_hints' if hints else ''}": (u, hints)
            for u in STREAM_UNROLLS for hints in (False, True)}


def cluster_names():
    """{name: P} of the cluster softmax kernels."""
    return {f"softmax_cluster_p{p}": p for p in CLUSTER_PACKETS}


def sources():
    """{section: (complete CUDA source, kernel names)}: what is compiled, one module each."""
    sm, ln = held_names("softmax", SOFTMAX_MODES), held_names("layernorm", LAYERNORM_MODES)
    st, cl = stream_names(), cluster_names()
    return {
        "softmax": (SOFTMAX_SOURCE + instantiations("SOFTMAX_KERNEL", "softmax", SOFTMAX_MODES)
                    + "\n", list(sm)),
        "layernorm": (LAYERNORM_SOURCE + instantiations("LAYERNORM_KERNEL", "layernorm",
                                                        LAYERNORM_MODES) + "\n", list(ln)),
        "stream": (STREAM_SOURCE + "\n".join(
            f"STREAM_KERNEL({n}, {u}, {'true' if h else 'false'}, {STREAM_UNROLLS[u]})"
            for n, (u, h) in st.items())
            + "\n", list(st)),
        "cluster": (CLUSTER_SOURCE + "\n".join(
            f"CLUSTER_KERNEL({n}, {p}, {CLUSTER}, {CLUSTER_PACKETS[p]})"
            for n, p in cl.items()) + "\n", list(cl)),
        "check": (CHECK_SOURCE, ["max_abs_diff"]),
    }


# ------------------------------------------------------------------ registers
def _nvcc_registers(source, names, arch):
    """{name: (registers, spill store bytes)} from ``nvcc --resource-usage`` on ``source``
    (the include path and standard of ``kernel_loader.compile_source``); {} without nvcc."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return {}
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.cu")
        with open(src, "w") as f:
            f.write(source)
        r = subprocess.run([nvcc, f"-arch=sm_{arch}", "-std=c++17", "-I",
                            kernel_loader.KERNEL_DIR, "--resource-usage", "-cubin", "-o",
                            os.path.join(d, "k.cubin"), src],
                           capture_output=True, text=True, timeout=300)
    found, name, spill = {}, None, 0
    for line in (r.stdout + r.stderr).splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            name, spill = m.group(1), 0
            continue
        m = re.search(r"(\d+) bytes spill stores", line)
        if m:
            spill = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and name in names:
            found[name] = (int(m.group(1)), spill)
    return found


def registers(source, names, arch):
    """{name: (registers a thread, local bytes a thread)} of ``source``'s kernels: from
    cuFuncGetAttribute (through pycuda, on the binary ``kernel_loader.compile_source``
    made: a query, nothing launched), else ``nvcc --resource-usage`` (its spill stores in
    place of local bytes), else {}.  Only printed columns depend on it."""
    try:
        import pycuda.driver as drv
        mod = drv.module_from_buffer(kernel_loader.compile_source(source))
        return {k: (mod.get_function(k).num_regs, mod.get_function(k).local_size_bytes)
                for k in names}
    except Exception as e:  # fall back to nvcc
        print(f"(cuFuncGetAttribute through pycuda failed: {type(e).__name__}: {e}; "
              f"trying nvcc --resource-usage)")
    try:
        return _nvcc_registers(source, set(names), arch)
    except Exception as e:  # only a printed column is lost
        print(f"(register counts unavailable: {type(e).__name__}: {e})")
        return {}


def regs_text(regs):
    """A registers cell: "43", "96 +64B local", or "?"."""
    if not regs:
        return "?"
    return f"{regs[0]}" + (f" +{regs[1]}B local" if regs[1] else "")


# ------------------------------------------------------------------ the device
class Device:
    """The handler and what every section needs of the device: multiprocessors, threads
    and compute capability; the copy bandwidth (bytes/s, read + written); the EventTimer
    on the handler's stream; the launch; the compiled kernels and their registers."""

    def __init__(self, h):
        import pycuda.driver as drv
        dev = drv.Context.get_device()
        self.h, self.name = h, dev.name()
        self.sms = h._sms
        self.sm_threads = h._sm_threads
        self.l2 = h._l2_bytes
        major, minor = dev.compute_capability()
        self.arch = f"{major}{minor}"
        self.timer = EventTimer("pycuda", h.stream)
        self.launch = kernel_loader.launch_function()
        self.copy_Bps = copy_spread(h, (128 * MB) // 4, REPS)["median"]
        self.kernels, self.regs = {}, {}
        self.partials = h.allocate((self.sms * CHECK_PER_SM,))

    def load(self, section):
        """Compile and load ``section``'s source (``sources()``) once, its kernels into
        ``self.kernels`` (format by name) and their registers into ``self.regs``."""
        if section in getattr(self, "_loaded", set()):
            return
        source, names = sources()[section]
        t0 = time.perf_counter()
        for name in names:
            self.kernels[name] = kernel_loader.source_function(source, name, kernel_format(name))
        self.regs.update(registers(source, names, self.arch))
        self._loaded = getattr(self, "_loaded", set()) | {section}
        print(f"({section}: {len(names)} kernels compiled and loaded in "
              f"{time.perf_counter() - t0:.1f} s)", flush=True)

    def run(self, name, grid, block, *args):
        """Launch kernel ``name`` on the handler's stream (no sync)."""
        k = self.kernels[name]
        self.launch(k.handle, self.h.stream.handle, grid, block, k.fmt, *args)

    def resident(self, regs, threads):
        """Blocks of ``threads`` a multiprocessor holds by threads and registers (64K a
        multiprocessor, given a warp at a time in units of 256), at most 32; by threads
        alone where ``regs`` is unknown.  Shared memory is no limit here (under 1 KB)."""
        by_threads = self.sm_threads // threads
        if not regs:
            return max(1, min(by_threads, 32))
        per_warp = -(-regs[0] * 32 // 256) * 256
        return max(1, min(by_threads, (65536 // per_warp) // (threads // 32), 32))

    def max_abs_diff(self, a, b, n):
        """max |a - b| over ``n`` floats of two device arrays (inf where any is NaN)."""
        self.run("max_abs_diff", self.sms * CHECK_PER_SM, CHECK_BLOCK, a, b, n,
                 self.partials.gpudata)
        return float(self.h.get_numpy_copy(self.partials).max())


def kernel_format(name):
    """The launch format of kernel ``name`` (struct codes of handlers/cuda/_launch.c)."""
    if name == "max_abs_diff":
        return "PPqP"
    if name.startswith("layernorm_"):
        return "PPPfPqi"       # x, gain, bias, eps, y, rows, cols
    if name.startswith(("softmax_stream", "softmax_cluster")):
        return "PPqq"          # x, y, rows, cols
    return "PPqi"              # x, y, rows, cols


# ------------------------------------------------------------------ one case
class Case:
    """One shape of one op: its inputs (``k`` copies on the device), output, float32
    reference on the device (the float64 one rounded once) and its scale, bytes, and the
    rows of its table."""

    def __init__(self, dev, what, shape, nbytes, tol):
        self.dev, self.what, self.shape, self.nbytes, self.tol = dev, what, shape, nbytes, tol
        self.rows, self.n = [], shape[0] * shape[1]

    def error(self, out):
        """The relative error of device array ``out`` against the reference: max |out -
        ref32| / max |ref64| + 2^-24 (an upper bound of the reference's rounding)."""
        d = self.dev.max_abs_diff(out.gpudata, self.ref.gpudata, self.n)
        return d / self.scale + 2.0 ** -24 if self.scale else d

    def time(self, label, mode, launch, regs, call, host_error=None, target=None):
        """Check, then time ``call(i)`` (issuing one call on the handler's stream, ``i``
        counting calls, returning the output) and add its row; FAILED (no time) where the
        check fails, ERROR where anything raises.  The output (``target``, by default
        ``self.out``) is filled with NaN before the checked call, so that an element the
        call leaves unwritten fails.  ``host_error``: ours' error against float64 on the
        host, printed beside the device check's."""
        h = self.dev.h
        try:
            h.fill(self.out if target is None else target, np.nan)
            out = call(0)
            err = self.error(out)
            note = f"{err:.1e}" + (f" (host {host_error:.1e})" if host_error is not None else "")
            if not err <= self.tol:
                self.rows.append([label, mode, launch, regs_text(regs), "FAILED", "-", "-", note])
                return
            ms = self.dev.timer.measure(call, reps=REPS, inner=LOOP)["median"]
        except Exception as e:  # one case's failure leaves the others
            print(f"{self.what} {self.shape} {label} [{launch}]: ERROR {type(e).__name__}: {e}")
            self.rows.append([label, mode, launch, regs_text(regs), "ERROR", "-", "-", "-"])
            return
        frac = self.nbytes / (ms * 1e-3) / self.dev.copy_Bps
        self.rows.append([label, mode, launch, regs_text(regs), f"{ms * 1e3:.1f}",
                          f"{frac:.1%}", "yes" if frac >= TARGET else "no", note])

    def print(self):
        """The table of every row, then each variant's best launch shape."""
        print(f"\n{self.what} {self.shape} float32: {self.nbytes / MB:.1f} MB moved (inputs "
              f"read once, output written once), {self.k} inputs cycled; copy "
              f"{self.dev.copy_Bps / 1e12:.3f} TB/s; {LOOP} calls back to back, median of "
              f"{REPS}; check: max relative error against float64 NumPy (tol {self.tol:.0e})")
        headers = ["variant", "math", "launch (block x grid)", "regs", "us", "of copy",
                   f">={TARGET:.0%}", "check"]
        _table(headers, self.rows)
        best = {}
        for r in self.rows:
            if r[4] in ("FAILED", "ERROR"):
                continue
            if r[0] not in best or float(r[4]) < float(best[r[0]][4]):
                best[r[0]] = r
        print(f"\n{self.what} {self.shape}: best launch of each variant, fastest first")
        _table(headers, sorted(best.values(), key=lambda r: float(r[4])))


def _table(headers, rows):
    """Print text ``rows`` under ``headers``, left-aligned in columns."""
    widths = [max(len(h), *(len(str(r[i])) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())


def reference(case, x, ours_out, ref_rows):
    """Build ``case``'s reference chunk by chunk of rows: ``ref_rows(a, b)`` gives rows a:b
    in float64; keeps its float32 rounding on the device (``case.ref``) and max |ref|
    (``case.scale``), and returns ours' relative error against it, computed on the host
    from ``ours_out`` (a NumPy copy of ours' output)."""
    rows = x.shape[0]
    ref32 = np.empty(x.shape, F32)
    scale = worst = 0.0
    for a in range(0, rows, REF_ROWS):
        b = min(rows, a + REF_ROWS)
        r64 = ref_rows(a, b)
        ref32[a:b] = r64
        scale = max(scale, float(np.abs(r64).max()))
        e = float(np.abs(ours_out[a:b].astype(np.float64) - r64).max())
        worst = max(worst, math.inf if math.isnan(e) else e)   # max() would drop a NaN
    case.ref, case.scale = case.dev.h.create_from_numpy(ref32), scale
    return worst / scale if scale else worst


def aligned16(*arrays):
    """Raise ValueError unless every device array starts on 16 bytes: the kernels here
    load and store float4 packets without testing (a misaligned one would fault the
    context, ending every later section, where this ends one section)."""
    bad = [int(a.gpudata) for a in arrays if int(a.gpudata) % 16]
    if bad:
        raise ValueError(f"device arrays not 16-byte aligned: {[hex(p) for p in bad]}")


def ours_launch(dev, op, shape):
    """(launch text, regs) of ours's row kernel for ``op`` at ``shape``: the strategy,
    block and grid the host plans (as ``handlers.cuda.elementwise.fused_arguments``) and
    the registers of the generated kernel of that strategy."""
    rows, cols = shape
    held = fused_source.held_elements(op, F32)
    grid, block = fused_source.plan_rows(rows, cols, held, dev.sms, dev.sm_threads,
                                         fused_source.sum_bytes(op, F32), dev.l2)
    way = fused_source.STRATEGIES[fused_source.strategy(cols, held, block)]
    name = f"{fused_source.kernel_name(op, F32)}_{way}"
    source = fused_source.kernel_source(op, F32, fused_source.ROW_BLOCK)
    regs = registers(source, [name], dev.arch).get(name)
    return f"{way} R={held}: {block} x {grid}", regs


def held_launches(dev, tag, rows, cols, regs):
    """[(text, grid, block)] of held kernel ``tag`` at ``rows`` x ``cols`` (empty where
    it cannot hold the row): a block per row, of the smallest multiple of 32 threads that
    holds it, one block per row and a resident grid striding over the rows; a lane group
    per row, blocks of 128 and 256 threads, one block per row group, and a resident grid
    of 256-thread blocks."""
    p, g, bound, _ = HELD[tag]
    npk = cols // 4
    out = []
    if g == 0:
        block = -(-npk // (p * 32)) * 32
        if block > bound:
            return []
        res = dev.sms * dev.resident(regs, block)
        out.append((f"{block} x {rows} (a block per row)", rows, block))
        if res < rows:
            out.append((f"{block} x {res} (resident, striding)", res, block))
        return out
    if npk > g * p:
        return []
    for block in (128, 256):
        grid = -(-rows // (block // g))
        out.append((f"{block} x {grid} ({block // g} rows a block)", grid, block))
    res = dev.sms * dev.resident(regs, 256)
    out.append((f"256 x {res} (resident, striding)", res, 256))
    return out


# ------------------------------------------------------------------ sections
def softmax_case(dev, shape, rng):
    """A softmax case at ``shape`` with ours checked and timed first: (case,
    the input copies, the output), both 16-byte aligned for the variants."""
    from handlers.fused_rows import SOFTMAX
    h = dev.h
    x = rng.standard_normal(shape, dtype=F32)
    case = Case(dev, "softmax", shape, 2 * x.nbytes, SOFTMAX_TOL)
    k = case.k = inputs_beyond_l2(x.nbytes)
    xs = [h.create_from_numpy(x) for _ in range(k)]
    out = case.out = h.allocate(shape)
    h.softmax_m(xs[0], out)
    host_err = reference(case, x, h.get_numpy_copy(out),
                         lambda a, b: _softmax64(x[a:b].astype(np.float64)))
    launch, regs = ours_launch(dev, SOFTMAX, shape)

    def ours(i):
        h.softmax_m(xs[i % k], out)
        return out
    case.time("ours softmax_m", "expf twice, expf / s", launch, regs, ours, host_err)
    aligned16(*xs, out)
    return case, xs, out


def softmax_held_section(dev, shape, rng):
    """Ours and the held softmax kernels at ``shape`` (cols % 4 == 0)."""
    rows, cols = shape
    case, xs, out = softmax_case(dev, shape, rng)
    k = case.k
    dev.load("softmax")
    xp = [int(a.gpudata) for a in xs]
    for name, (tag, mode) in held_names("softmax", SOFTMAX_MODES).items():
        regs = dev.regs.get(name)
        for text, grid, block in held_launches(dev, tag, rows, cols, regs):
            def call(i, name=name, grid=grid, block=block):
                dev.run(name, grid, block, xp[i % k], out.gpudata, rows, cols)
                return out
            case.time(name, SOFTMAX_MODES[mode][1], text, regs, call)
    case.print()


def layernorm_section(dev, shape, rng):
    """Ours (``LayerNorm.forward``) and the held LayerNorm kernels at ``shape``."""
    from layers.layernorm import _FORWARD
    h = dev.h
    rows, cols = shape
    x = rng.standard_normal(shape, dtype=F32)
    gain = (1 + 0.1 * rng.standard_normal(cols)).astype(F32)
    bias = (0.1 * rng.standard_normal(cols)).astype(F32)
    case = Case(dev, "LayerNorm forward", shape, (2 * rows * cols + 2 * cols) * 4,
                LAYERNORM_TOL)
    k = case.k = inputs_beyond_l2(x.nbytes)
    xs = [h.create_from_numpy(x) for _ in range(k)]
    layer = _layer(SimpleNamespace(h32=h), cols, gain, bias)
    case.out = h.allocate(shape)            # the hand kernels' y
    y = layer.forward(xs[0])                # ours writes the layer's own buffer
    host_err = reference(case, x, h.get_numpy_copy(y),
                         lambda a, b: _layernorm64(x[a:b], gain, bias)[0])
    launch, regs = ours_launch(dev, _FORWARD, shape)

    def ours(i):
        return layer.forward(xs[i % k])
    # Ours writes the layer's own y (the same buffer at every call of this shape).
    case.time("ours LayerNorm.forward", "2 reductions, scalar gain/bias", launch, regs, ours,
              host_err, target=y)
    dev.load("layernorm")
    xp = [int(a.gpudata) for a in xs]
    g, b = h.create_from_numpy(gain), h.create_from_numpy(bias)
    aligned16(*xs, case.out, g, b)
    for name, (tag, mode) in held_names("layernorm", LAYERNORM_MODES).items():
        regs = dev.regs.get(name)
        for text, grid, block in held_launches(dev, tag, rows, cols, regs):
            def call(i, name=name, grid=grid, block=block):
                dev.run(name, grid, block, xp[i % k], g.gpudata, b.gpudata, float(LN_EPS),
                        case.out.gpudata, rows, cols)
                return case.out
            case.time(name, LAYERNORM_MODES[mode][1], text, regs, call)
    case.print()


def stream_launches(dev, rows, bound):
    """[(text, grid, block)] of a streamed kernel of ``__launch_bounds__(bound)``: 512 or
    1024 threads, one, two or four blocks a multiprocessor striding over the rows (rows in
    flight: the L2's share of each), or a block per row (the hardware keeps as many
    resident as fit)."""
    out = []
    for block in (b for b in (1024, 512) if b <= bound):
        for per_sm in (1, 2, 4):
            if block * per_sm <= dev.sm_threads:
                out.append((f"{block} x {dev.sms * per_sm} ({per_sm}/SM)", dev.sms * per_sm,
                            block))
        out.append((f"{block} x {rows} (a block per row)", rows, block))
    return out


def long_rows_section(dev, rng):
    """Softmax over LONG_SHAPE: ours (streamed), the two-pass streamed kernels and the
    cluster kernels."""
    rows, cols = shape = LONG_SHAPE
    case, xs, out = softmax_case(dev, shape, rng)
    k = case.k
    xp = [int(a.gpudata) for a in xs]
    try:
        dev.load("stream")
        for name, (u, hints) in stream_names().items():
            regs = dev.regs.get(name)
            for text, grid, block in stream_launches(dev, rows, STREAM_UNROLLS[u]):
                def call(i, name=name, grid=grid, block=block):
                    dev.run(name, grid, block, xp[i % k], out.gpudata, rows, cols)
                    return out
                case.time(name, f"expf, 2 passes, {u} packets in flight"
                          + (", cache hints" if hints else ""), text, regs, call)
    except Exception:  # the cluster kernels still run
        traceback.print_exc()
    try:
        dev.load("cluster")
        per = -(-(cols // 4) // CLUSTER)   # packets a block, at most (npk <= cols // 4)
        for name, p in cluster_names().items():
            block = CLUSTER_PACKETS[p]
            if block * p < per:
                print(f"{name}: {block} x {p} packets cannot hold {per}: left out")
                continue

            def call(i, name=name, block=block):
                dev.run(name, rows * CLUSTER, block, xp[i % k], out.gpudata, rows, cols)
                return out
            case.time(name, f"expf, cluster of {CLUSTER}, 1 reduction of (max, sum)",
                      f"{block} x {rows * CLUSTER} ({CLUSTER} blocks a row)",
                      dev.regs.get(name), call)
    except Exception:  # the table still prints
        traceback.print_exc()
    case.print()


def main():
    h = cuda_handler("row_kernel_variants", F32, what="tool")
    if h is None:
        return 0
    t0 = time.perf_counter()
    dev = Device(h)
    print(f"{dev.name}: {dev.sms} SMs, L2 {dev.l2 / MB:.0f} MB, copy 128 MB: "
          f"{dev.copy_Bps / 1e12:.3f} TB/s; target {TARGET:.0%} of copy", flush=True)
    print("held kernels (name = op_structure_mode): "
          + "; ".join(f"{tag} = {what}" for tag, (_, _, _, what) in HELD.items()), flush=True)
    dev.load("check")
    rng = np.random.default_rng(SEED)
    sections = [(f"softmax {s}", lambda s=s: softmax_held_section(dev, s, rng))
                for s in HELD_SHAPES]
    sections += [(f"LayerNorm {s}", lambda s=s: layernorm_section(dev, s, rng))
                 for s in HELD_SHAPES]
    sections.append((f"softmax {LONG_SHAPE}", lambda: long_rows_section(dev, rng)))
    for what, run in sections:
        try:
            run()
        except Exception:  # the next section still runs
            print(f"\n{what}: section failed")
            traceback.print_exc()
        h.synchronize_all_streams()
        print(f"({what} done at {time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
