"""Why large float32 reductions miss 80% of copy on an H200, while a read-only kernel over the
same bytes reaches it: standalone variants of the two kernels concerned, timed beside ours.

On an H200 (``benchmarks reductions``: inputs from DRAM, LOOP calls back to back between
CUDA events) a 1-D sum or max to a scalar (``*_long``: ``rows_impl<..., BLOCKWIDE=true>`` in
reduce.cu, planned by ``plan_rows``: a block per contiguous chunk of about n / (resident
blocks) elements, ROW_UNROLL = 4 16-byte loads in flight a thread, the last block combining
the partials) reaches 72-82% of copy at 92-253 MB, and rows of 3 or 29 elements (``*_short``:
tiles of whole rows staged in shared memory, then lanes reduce each row) 31-37%, where
``benchmarks.ops.READ_ONLY`` (grid-stride 16-byte loads, one partial a block, best of a few
launch shapes) reaches 100% on the same bytes.  Hypotheses tested here:

1. the long kernel's contiguous chunk a block (about 1000 sequential streams at once) loses to
   the read-only kernel's grid-wide interleaving, or to its launch shape;
2. the short kernel is bound by its load and reduce phases not overlapping and by its few
   bytes in flight; a kernel without shared memory would do better: a thread per row (rows of
   n <= 8, U rows in flight a thread, L1 serving a row's neighbouring elements), or a warp per
   group of rows (n <= 64) reading the group's contiguous bytes with 16-byte loads and reducing
   each row with shuffles.

Sections (float32; each figure the median of REPS samples of ms per call, LOOP calls back to
back between CUDA events of ``benchmarks.gpu.EventTimer`` on the handler's stream, every case
cycling ``benchmarks.ops.inputs_beyond_l2`` copies of its input so that each call reads it
from DRAM; GB/s over the input and output bytes, and that over the device copy bandwidth of
128 MB, ``benchmarks.ops.copy_spread``):

1. 1-D inputs of 24M, 40M and 64M elements (96-256 MB): ours ``sum_t(x, None, out)`` and
   ``max_t(x, 0, out)``; ours's ``sum_long_f32`` launched directly with sms x 2, 4 and 8
   chunks (the planner's: 8); the read-only kernel (``benchmarks.ops.read_only_ms``, its best
   launch shape); and complete sums (per-block partials, the last block to finish adding them
   in block order, as ours does): (a) ``chunk``, a contiguous chunk a block, (b) ``stride``,
   grid-stride interleaved (block b reads packets b*T + t, (b + G)*T + t, ...), each at
   256/512/1024 threads x 1/2/4/8 blocks a multiprocessor and U = 4 or 8 loads in flight,
   each shape compiled with ``__launch_bounds__(threads, blocks)`` so that it runs in one
   wave (at 2048 threads a multiprocessor, 32 registers, U = 8 keeps about 5 loads in flight
   in nvcc 13.0's code for sm_90).  Every launch's registers and resident blocks a
   multiprocessor (from pycuda's register count) are printed, ours's too: ``(2+ waves)``
   marks a grid larger than one wave.  Here, nvcc 13.0 gives ours's ``sum_long_f32`` 64
   registers (4 resident blocks of 256) while ``plan_rows`` launches 8 a multiprocessor.
2. Rows of 3, 8, 29 and 64 elements, about 200 MB, reduced over the last axis: ours
   ``sum_t``, ``min_t``, ``argmax_t``; ours's ``sum_short_f32`` launched directly at 2, 4
   and 8 blocks a multiprocessor (the planner's: 8; the kernel strides over its tiles, so
   blocks beyond the resident ones wait for one to finish all its tiles; nvcc 13.0 gives it
   64 registers and 8 KB of shared memory, 4 resident); the read-only kernel over the input's
   bytes (it writes no output: the figure is the row's bytes over its time, as the suite's
   bound); and complete sums and argmaxes in blocks of 256 threads, one task a thread (a)
   or a warp (b), as many blocks as the tasks need: (a) ``thread`` (n <= 8), U = 2/4/8 rows
   a thread in flight, each row's elements scalar loads (neighbouring lanes' rows share
   cache lines: L1 serves them); (b) ``warp``, a task of up to U stripes (a stripe: 32
   lanes x one 16-byte packet, 512 contiguous bytes) starting on a row boundary, each row
   reduced by a segmented scan of shuffles over the lanes (a packet spans at most two rows
   for n >= 3), no shared memory.  argmax keeps NumPy's rule: the first index of the
   maximum, NaN wins; its input has planted NaNs (two in some rows) and ties.

Every result is checked against NumPy (sums in float64, within ``benchmarks.reductions``'s
``sum_tolerance`` of the reduced count; max, min and argmax exactly) after one call into an
output filled with NaN; a failed check prints FAILED instead of a time.  Each section (and
each row) catches its own errors and prints them, so one failure leaves the rest.

Run by hand from the project root on a GPU machine:
``python benchmarks/results/diagnostics/reduction_variants.py``.  About 15-20 s on an H200
once kernels are compiled (pycuda's disk cache; a cold cache adds nvcc time, reduce.cu's
alone about 30 s); under 3 GB of device memory.  Its run:
``reduction_variants-NVIDIA-H200.log`` (2026-11-27).
"""
import hashlib
import math
import pathlib
import sys
import traceback

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from benchmarks.common import print_table, rel_error
from benchmarks.gpu import EventTimer, cuda_handler
from benchmarks.ops import LOOP, copy_spread, inputs_beyond_l2, read_only_ms
from benchmarks.reductions import sum_tolerance
from handlers.cuda import kernel_loader, reductions

F32 = np.float32
MB, M = 1 << 20, 1 << 20
REPS = 7
LONG_SIZES = (24 * M, 40 * M, 64 * M)           # elements of the 1-D inputs
THREADS, PER_SM, LONG_UNROLLS = (256, 512, 1024), (1, 2, 4, 8), (4, 8)
ROW_LENGTHS, ROW_BYTES, ROW_UNROLLS = (3, 8, 29, 64), 200 * MB, (2, 4, 8)
THREAD_ROW_MAX = 8            # the longest row of the ``thread`` kernels (NMAX below)
ROW_BLOCK = 256               # threads a block of the row kernels
SEED = 20261201
#: ours's row kernels (reduce.cu's *_short, *_rows, *_long): their argument format (optable's),
#: block (launch.py's BLOCK) and the blocks a multiprocessor they are also launched at here
#: (the planner's grids are 8 a multiprocessor)
OURS_ROW_FMT, OURS_BLOCK, OURS_PER_SM = "PPPPqqqqqi", reductions.BLOCK, (2, 4, 8)
#: elements of a *_short tile (reductions.SHORT_TILE)
SHORT_TILE = reductions.SHORT_TILE

# ------------------------------------------------------------------ CUDA sources
#: Section 1: complete sums of a 1-D float32 array into out[0].  Each block adds its packets
#: (U 16-byte loads in flight a thread, the last trip predicated so its loads stay in flight
#: together), writes its sum to ws[block], and the last block to finish (a counter, reset for
#: the next launch) adds the partials in block order: the second stage of ours.  CHUNK: block b
#: reads the contiguous packets [b * chunk, (b + 1) * chunk), its threads T apart; otherwise
#: the grid strides: block b reads b * T + t, b * T + t + G * T, ...
LONG_SOURCE = r"""
namespace {
constexpr unsigned FULL = 0xffffffffu;

__device__ __forceinline__ float hsum(float4 v) { return (v.x + v.y) + (v.z + v.w); }

// The block's sum, in the first warp (every thread calls; callable twice a launch).
__device__ float block_sum(float s) {
    __shared__ float w[32];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
    __syncthreads();   // w may still be read by an earlier call
    if ((threadIdx.x & 31) == 0) w[threadIdx.x >> 5] = s;
    __syncthreads();
    s = 0.f;
    if (threadIdx.x < 32) {
        s = threadIdx.x < (blockDim.x >> 5) ? w[threadIdx.x] : 0.f;
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
    }
    return s;
}

template <int U, bool CHUNK>
__device__ void sum_1d(const float* __restrict__ a, long long n, float* __restrict__ ws,
                       unsigned int* __restrict__ count, float* __restrict__ out) {
    const float4* __restrict__ a4 = reinterpret_cast<const float4*>(a);
    const long long n4 = n >> 2, T = blockDim.x, G = gridDim.x;
    long long i, end, step;
    if (CHUNK) {
        const long long chunk = (n4 + G - 1) / G;
        i = blockIdx.x * chunk + threadIdx.x;
        end = min(n4, (blockIdx.x + 1) * chunk);
        step = T;
    } else {
        i = blockIdx.x * T + threadIdx.x;
        end = n4;
        step = G * T;
    }
    float acc = 0.f;
    for (; i + (U - 1) * step < end; i += U * step) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = a4[i + u * step];
#pragma unroll
        for (int u = 0; u < U; ++u) acc += hsum(v[u]);
    }
    {   // the last, partial trip: its loads predicated, still in flight together
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            v[u] = i + u * step < end ? a4[i + u * step] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int u = 0; u < U; ++u) acc += hsum(v[u]);
    }
    if (blockIdx.x == 0)   // elements past the last whole packet
        for (long long k = 4 * n4 + threadIdx.x; k < n; k += T) acc += a[k];
    const float s = block_sum(acc);
    __shared__ bool last;
    if (threadIdx.x == 0) {
        ws[blockIdx.x] = s;
        __threadfence();   // the partial reaches L2 before the count does
        last = atomicAdd(count, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    float t = 0.f;
    for (unsigned k = threadIdx.x; k < gridDim.x; k += blockDim.x) t += __ldcg(ws + k);
    t = block_sum(t);
    if (threadIdx.x == 0) {
        out[0] = t;
        *count = 0u;   // ready for the next launch
    }
}
}  // namespace

// One kernel a (pattern, U, launch shape): __launch_bounds__(T, B) lets ptxas use the
// registers that B blocks of T threads leave each (64K a multiprocessor), no more: every
// shape runs in one wave, and where U packets do not fit those registers ptxas issues fewer
// at a time (the register counts printed tell).  With bounds of (1024) alone ptxas held
// every kernel to 32 registers and kept 1-2 of 8 loads in flight (nvcc 13.0, sm_90).
#define SUM_1D(NAME, U, CHUNK, T, B)                                                    \
    extern "C" __global__ void __launch_bounds__(T, B)                                  \
    NAME(const float* a, long long n, float* ws, unsigned int* count, float* out) {     \
        sum_1d<U, CHUNK>(a, n, ws, count, out);                                         \
    }
"""

#: Section 2: sums and argmaxes of contiguous rows of n float32 elements into out[row] (an
#: argmax as a float index, as ours stores it).  Sum and Arg give each kernel its combine:
#: one(x, k) is element x at index k of its row; join(a, b) combines a with b, whose elements
#: come after a's.  Arg keeps NumPy's pick: the first index of the maximum, NaN wins.
ROWS_SOURCE = r"""
namespace {
constexpr unsigned FULL = 0xffffffffu;

struct Sum {
    using S = float;
    __device__ static S identity() { return 0.f; }
    __device__ static S one(float x, int) { return x; }
    __device__ static S join(S a, S b) { return a + b; }
    __device__ static S up(S s, int o) { return __shfl_up_sync(FULL, s, o); }
    __device__ static S from(S s, int lane) { return __shfl_sync(FULL, s, lane); }
    __device__ static float result(S s) { return s; }
};

struct Pick { float v; int i; };

struct Arg {
    using S = Pick;
    __device__ static S identity() { return {0.f, -1}; }
    __device__ static S one(float x, int k) { return {x, k}; }
    // Does x, later than w, replace it?  A NaN replaces a number; a larger number replaces
    // a smaller; an equal one, or anything after a NaN, does not.
    __device__ static bool beats(float x, float w) { return x > w || (x != x && w == w); }
    __device__ static S join(S a, S b) {
        return (a.i < 0 || (b.i >= 0 && beats(b.v, a.v))) ? b : a;
    }
    __device__ static S up(S s, int o) {
        return {__shfl_up_sync(FULL, s.v, o), __shfl_up_sync(FULL, s.i, o)};
    }
    __device__ static S from(S s, int lane) {
        return {__shfl_sync(FULL, s.v, lane), __shfl_sync(FULL, s.i, lane)};
    }
    __device__ static float result(S s) { return (float)s.i; }
};

// (a) A thread per row, n <= NMAX: block b's thread t reduces rows b * T * U + u * T + t for
// u < U (a warp's loads of one u cover 32 adjacent rows: the lanes share their lines, which
// L1 serves), all U * n scalar loads issued before any is used.
template <class R, int U>
__device__ void rows_thread(const float* __restrict__ a, long long rows, int n,
                            float* __restrict__ out) {
    constexpr int NMAX = 8;
    const long long r0 = (long long)blockIdx.x * blockDim.x * U + threadIdx.x;
    float x[U][NMAX];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const long long r = r0 + (long long)u * blockDim.x;
        const float* p = a + r * n;
#pragma unroll
        for (int k = 0; k < NMAX; ++k) x[u][k] = (r < rows && k < n) ? p[k] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const long long r = r0 + (long long)u * blockDim.x;
        typename R::S s = R::identity();
#pragma unroll
        for (int k = 0; k < NMAX; ++k)
            if (k < n) s = R::join(s, R::one(x[u][k], k));
        if (r < rows) out[r] = R::result(s);
    }
}

// (b) A warp per task: packets [task * C, task * C + C) of the array (C <= 32 * U, a whole
// number of rows: the host makes 4 * C a multiple of n, so a task starts on a row boundary
// and on 16 bytes), read as up to U stripes of 32 lanes x one 16-byte packet, all loads
// issued first.  With n >= 3 a packet holds the end of at most one row (head: elements of
// the row it starts in) and the start of at most one more (tail).  A stripe's rows are then
// reduced by a segmented inclusive scan over the lanes of each lane's last row (a segment:
// the lanes from the one where that row starts), and a row ends either in a lane's head
// (the previous lane's scan joined to it) or at a lane's last element (the scan).  The last
// lane's scan carries a row that goes on into the next stripe.  No shared memory.
template <class R, int U>
__device__ void rows_warp(const float* __restrict__ a, long long rows, int n, long long C,
                          long long rows_per_task, float* __restrict__ out) {
    using S = typename R::S;
    const int lane = threadIdx.x & 31;
    const long long task = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long E = rows * n, P = (E + 3) >> 2;   // elements, packets (the last partial)
    const long long p0 = task * C;
    if (p0 >= P) return;   // the whole warp
    const long long p1 = min(p0 + C, P);
    const float4* __restrict__ a4 = reinterpret_cast<const float4*>(a);
    float4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const long long p = p0 + 32 * u + lane;
        v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (p < p1) {
            if (4 * p + 3 < E) {
                v[u] = a4[p];
            } else {   // the array's last packet, partial: its missing elements stay 0
                float t[4] = {0.f, 0.f, 0.f, 0.f};
                for (int j = 0; j < 4; ++j)
                    if (4 * p + j < E) t[j] = a[4 * p + j];
                v[u] = make_float4(t[0], t[1], t[2], t[3]);
            }
        }
    }
    // This lane's first element: its row and its offset in the row; a stripe moves it 128
    // elements on (dq rows and dr elements), which keeps divisions out of the loop.
    long long row = task * rows_per_task + (4 * lane) / n;
    int off = (4 * lane) % n;
    const int dq = 128 / n, dr = 128 % n;
    S carry = R::identity();
#pragma unroll
    for (int u = 0; u < U; ++u) {
        if (p0 + 32 * u >= p1) break;   // the whole warp
        const bool active = p0 + 32 * u + lane < p1;   // lanes past the task write nothing
        const float x[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
        const int b = n - off;          // elements of the head (4 or more: no tail)
        S head = R::identity(), tail = R::identity();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (j < b) head = R::join(head, R::one(x[j], off + j));
            else tail = R::join(tail, R::one(x[j], j - b));
        }
        const bool has_tail = b < 4;
        if (lane == 0 && off != 0) head = R::join(carry, head);   // a row from the last stripe
        S last = has_tail ? tail : head;   // the state of this lane's last row
        // Lane l's last row starts in lane l where it has a tail or starts a row; the
        // segment of lane l runs from the highest such lane <= l (lane 0 at the least).
        const unsigned starts = __ballot_sync(FULL, has_tail || off == 0) | 1u;
        const int seg = 31 - __clz(starts & (FULL >> (31 - lane)));
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const S y = R::up(last, o);
            if (lane - o >= seg) last = R::join(y, last);
        }
        const S before = R::up(last, 1);   // lane - 1's last row: this lane's first if off != 0
        if (active && has_tail && row < rows)
            out[row] = R::result((lane > 0 && off != 0) ? R::join(before, head) : head);
        const int last_off = has_tail ? 3 - b : off + 3;   // of this lane's last element
        const long long last_row = row + (has_tail ? 1 : 0);
        if (active && last_off == n - 1 && last_row < rows) out[last_row] = R::result(last);
        carry = R::from(last, 31);
        off += dr;
        row += dq;
        if (off >= n) {
            off -= n;
            ++row;
        }
    }
}
}  // namespace

#define ROW_KERNELS(R, NAME, U)                                                         \
    extern "C" __global__ void __launch_bounds__(256)                                   \
    NAME##_thread_u##U(const float* a, long long rows, int n, float* out) {             \
        rows_thread<R, U>(a, rows, n, out);                                             \
    }                                                                                   \
    extern "C" __global__ void __launch_bounds__(256)                                   \
    NAME##_warp_u##U(const float* a, long long rows, int n, long long C,                \
                     long long rows_per_task, float* out) {                             \
        rows_warp<R, U>(a, rows, n, C, rows_per_task, out);                             \
    }
ROW_KERNELS(Sum, sum, 2)
ROW_KERNELS(Sum, sum, 4)
ROW_KERNELS(Sum, sum, 8)
ROW_KERNELS(Arg, argmax, 2)
ROW_KERNELS(Arg, argmax, 4)
ROW_KERNELS(Arg, argmax, 8)
"""


def ceil_div(a, b):
    """ceil(a / b) for positive ints."""
    return -(-a // b)


def long_shapes(sm_threads=2048):
    """(threads, blocks a multiprocessor) of section 1's launches: THREADS x PER_SM within
    ``sm_threads``."""
    return [(t, b) for t in THREADS for b in PER_SM if t * b <= sm_threads]


def long_name(kind, unroll, threads, per_sm):
    """The kernel of section 1 for ``kind`` ("chunk" or "stride"), U = ``unroll`` and a
    launch of ``threads`` x ``per_sm`` blocks a multiprocessor."""
    return f"sum_{kind}_u{unroll}_t{threads}_b{per_sm}"


#: {kernel name: (kind, U, threads, blocks a multiprocessor)} of section 1
LONG_KERNELS = {long_name(k, u, t, b): (k, u, t, b) for k in ("chunk", "stride")
                for u in LONG_UNROLLS for t, b in long_shapes()}
LONG_SOURCE += "".join(f"SUM_1D({name}, {u}, {'true' if k == 'chunk' else 'false'}, {t}, {b})\n"
                       for name, (k, u, t, b) in LONG_KERNELS.items())


# ------------------------------------------------------------------ the device
class Device:
    """The handler ``h`` and what every section needs of the device: multiprocessors,
    threads a multiprocessor, the copy bandwidth (bytes/s, read + written), an EventTimer
    on the handler's stream and the extension's launch."""

    def __init__(self, h):
        import pycuda.driver as drv
        dev = drv.Context.get_device()
        self.h, self.name = h, dev.name()
        self.sms = dev.get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)
        self.sm_threads = dev.get_attribute(drv.device_attribute.MAX_THREADS_PER_MULTIPROCESSOR)
        self.l2 = dev.get_attribute(drv.device_attribute.L2_CACHE_SIZE)
        self.timer = EventTimer("pycuda", h.stream)
        self.launch = kernel_loader.launch_function()
        self.copy_Bps = copy_spread(h, (128 * MB) // 4, REPS)["median"]

    def kernels(self, source, names, fmt):
        """{name: Kernel} of ``source``'s kernels ``names``, all with argument format
        ``fmt``, compiled and loaded as the project's fused ops are."""
        return {k: kernel_loader.source_function(source, k, fmt) for k in names}

    def run(self, kernel, grid, block, *args):
        """Launch ``kernel`` on the handler's stream (no sync)."""
        self.launch(kernel.handle, self.h.stream.handle, grid, block, kernel.fmt, *args)

    def shape_text(self, regs, threads, per_sm=None):
        """"regs R resident K" for a kernel of ``regs`` registers in blocks of ``threads``,
        with "(2+ waves)" where ``per_sm`` blocks a multiprocessor exceed K."""
        fit = self.resident(regs, threads)
        text = f"regs {regs if regs else '?'} resident {fit if fit is not None else '?'}"
        return text + (" (2+ waves)" if fit is not None and per_sm and per_sm > fit else "")

    def resident(self, regs, threads):
        """Blocks of ``threads`` that fit on one multiprocessor by threads and registers
        (64K a multiprocessor, allocated a warp at a time in units of 256), at most 32; None
        where ``regs`` is unknown.  Shared memory is no limit here: at most 8 KB a block
        (ours's *_short tile), 64 KB for 8 blocks."""
        if not regs:
            return None
        per_warp = -(-regs * 32 // 256) * 256
        return min(self.sm_threads // threads, (65536 // per_warp) // (threads // 32), 32)


_QUERIED = {}   # binary's hash: its pycuda module, loaded once


def register_counts(binary, names):
    """{name: registers a thread} of the kernels ``names`` of the compiled ``binary`` (from
    ``kernel_loader.compile_source`` or ``cubin``), read through pycuda (a query: nothing
    is launched this way); {} with a note where pycuda cannot say."""
    try:
        import pycuda.driver as drv
        key = hashlib.sha256(binary).hexdigest()
        if key not in _QUERIED:
            _QUERIED[key] = drv.module_from_buffer(binary)
        return {k: _QUERIED[key].get_function(k).num_regs for k in names}
    except Exception as e:  # only a printed column is lost
        print(f"(register counts unavailable: {type(e).__name__}: {e})")
        return {}


def timed(dev, call, check, reset):
    """(spread of ms per call, check note) of ``call(i)`` (issued on the handler's stream,
    ``i`` counting calls so that inputs rotate): first ``reset()`` (the output to NaN), one
    ``call(0)`` and ``check()`` -> (ok, note); a failed check gives (None, note), untimed."""
    reset()
    call(0)
    dev.h.synchronize_all_streams()
    ok, note = check()
    if not ok:
        return None, note
    return dev.timer.measure(call, reps=REPS, inner=LOOP), note


def figures(dev, ms, nbytes):
    """[us, GB/s, fraction of copy] of a median ``ms`` per call moving ``nbytes``."""
    bps = nbytes / (ms * 1e-3)
    return [ms * 1e3, bps / 1e9, bps / dev.copy_Bps]


def case_row(dev, label, launch, nbytes, call, check, reset):
    """One table row: ``label``, ``launch`` (text), then [us, GB/s, of copy, check] of
    :func:`timed`; FAILED or ERROR (printed) in place of the figures."""
    try:
        ms, note = timed(dev, call, check, reset)
    except Exception as e:  # one failing case leaves the others
        print(f"{label} [{launch}]: ERROR {type(e).__name__}: {e}")
        return [label, launch, "ERROR", "-", "-", "-"]
    if ms is None:
        return [label, launch, "FAILED", "-", "-", note]
    return [label, launch, *figures(dev, ms["median"], nbytes), note]


def sum_check(got_fn, ref, count):
    """check() of a sum: relative error (``rel_error``) within ``sum_tolerance(count)``."""
    def check():
        err, tol = rel_error(got_fn(), ref), sum_tolerance(count, F32)
        return err <= tol, f"err {err:.1e}"
    return check


def exact_check(got_fn, ref):
    """check() of a max or min: equal to NumPy's, NaN where NumPy's is NaN."""
    def check():
        got = np.asarray(got_fn(), np.float64).reshape(np.shape(ref))
        ok = np.array_equal(got, np.asarray(ref, np.float64), equal_nan=True)
        return ok, "exact" if ok else "MISMATCH"
    return check


def index_check(got_fn, ref):
    """check() of an argmax (float indices): every index NumPy's."""
    def check():
        got = np.rint(np.asarray(got_fn(), np.float64)).astype(np.int64)
        wrong = int(np.count_nonzero(got != ref))
        return wrong == 0, "exact" if not wrong else f"{wrong} wrong"
    return check


def ours_plan(dev, shape, axis, family):
    """Ours's launch for ``shape`` over ``axis`` (the planner the handler runs), as text:
    kernel, grid x block, and the kernel's registers and resident blocks a multiprocessor
    (the planner sizes grids for sm_threads / BLOCK of them)."""
    try:
        p = reductions.plan(shape, (axis,), True, 4, family, dev.sms, dev.sm_threads).launch
        name = f"{p.kernel}_f32"
        regs = register_counts(kernel_loader.cubin("reduce"), [name]).get(name)
        return (f"{name} {p.grid}x{p.block} ({p.grid / dev.sms:.1f}/SM), "
                f"{dev.shape_text(regs, p.block)}")
    except Exception as e:  # only a label is lost
        return f"plan? {type(e).__name__}: {e}"


HEADERS = ["case", "launch", "us", "GB/s", "of copy", "check"]


# ------------------------------------------------------------------ section 1
def long_sums(dev, pool):
    """Section 1: 1-D sums and max over LONG_SIZES elements (see the module docstring)."""
    h = dev.h
    kern = dev.kernels(LONG_SOURCE, list(LONG_KERNELS), "PqPPP")
    regs = register_counts(kernel_loader.compile_source(LONG_SOURCE), list(LONG_KERNELS))
    ws = h.allocate((dev.sms * max(PER_SM),))
    count = h.allocate((1,))
    h.fill(count, 0.0)   # the last-block counter: 0 as an unsigned int, reset by each launch
    out = h.allocate((1,))

    def reset():
        h.fill(out, np.nan)

    def got():
        return h.get_numpy_copy(out)[0]

    for n in LONG_SIZES:
        try:
            host = pool[:n]
            ref_sum, ref_max = host.sum(dtype=np.float64), host.max()
            k = inputs_beyond_l2(host.nbytes)
            xs = [h.create_from_numpy(host) for _ in range(k)]
            ptrs = [int(x.gpudata) for x in xs]
            nbytes = host.nbytes + 4
            rows = [
                case_row(dev, "ours sum_t", ours_plan(dev, (n,), 0, "sum"), nbytes,
                         lambda i: h.sum_t(xs[i % k], None, out),
                         sum_check(got, ref_sum, n), reset),
                case_row(dev, "ours max_t", ours_plan(dev, (n,), 0, "max"), nbytes,
                         lambda i: h.max_t(xs[i % k], 0, out), exact_check(got, ref_max),
                         reset)]
            # Ours's own kernel with fewer, longer chunks: one wave where its registers
            # allow 8 blocks a multiprocessor no more (the planner's chunks = its grid).
            long_k = kernel_loader.function("reduce", "sum_long", "f32", OURS_ROW_FMT)
            long_regs = register_counts(kernel_loader.cubin("reduce"), ["sum_long_f32"])
            for per_sm in OURS_PER_SM:
                chunk = ceil_div(ceil_div(n, dev.sms * per_sm), 4) * 4   # starts on packets
                chunks = ceil_div(n, chunk)

                def call(i, c=chunk, g=chunks):
                    dev.run(long_k, g, OURS_BLOCK, ptrs[i % k], int(ws.gpudata),
                            int(out.gpudata), int(count.gpudata), 1, n, c, g, 1, 0)
                launch = (f"sum_long_f32 {chunks}x{OURS_BLOCK} ({per_sm}/SM), "
                          f"{dev.shape_text(long_regs.get('sum_long_f32'), OURS_BLOCK, per_sm)}")
                rows.append(case_row(dev, "ours kernel", launch, nbytes, call,
                                     sum_check(got, ref_sum, n), reset))
            try:
                ro = read_only_ms(h, host.nbytes, REPS)["median"]
                rows.append(["read-only", "best of ops sweep", *figures(dev, ro, nbytes), "-"])
            except Exception as e:  # the bound's row alone is lost
                print(f"read-only: ERROR {type(e).__name__}: {e}")
            best = {}
            for name, (kind, unroll, threads, per_sm) in LONG_KERNELS.items():
                if threads * per_sm > dev.sm_threads:
                    continue
                grid = dev.sms * per_sm

                def call(i, f=kern[name], g=grid, t=threads):
                    dev.run(f, g, t, ptrs[i % k], n, int(ws.gpudata), int(count.gpudata),
                            int(out.gpudata))
                launch = (f"{threads}x{per_sm}/SM, "
                          f"{dev.shape_text(regs.get(name), threads, per_sm)}")
                row = case_row(dev, f"{kind} U{unroll}", launch, nbytes, call,
                               sum_check(got, ref_sum, n), reset)
                rows.append(row)
                if isinstance(row[2], float) and (kind not in best or row[2] < best[kind][2]):
                    best[kind] = row
            print(f"\n1-D float32, n = {n} ({host.nbytes / MB:.0f} MB), {k} inputs; "
                  f"copy = {dev.copy_Bps / 1e12:.3f} TB/s; {LOOP} calls back to back, "
                  f"median of {REPS}")
            print_table(HEADERS, rows)
            for kind, row in best.items():
                print(f"best {kind}: {row[0]}, {row[1]}: {row[4]:.1%} of copy")
            sys.stdout.flush()
        except Exception:  # the next size still runs
            traceback.print_exc()


# ------------------------------------------------------------------ section 2
def with_nans_and_ties(host, rng):
    """A copy of ``host`` (rows, n) for argmax: a row in 997 gets its maximum copied to a
    random position (a tie: the earlier index must win, or NaN where the row has one); then
    a row in 1009 a NaN at a random position, and a row in 2003 a second one (the first NaN
    must win)."""
    p = host.copy()
    rows, n = p.shape
    t = rng.integers(0, rows, rows // 997)
    p[t, rng.integers(0, n, t.size)] = p[t].max(axis=1)
    for every in (1009, 2003):
        r = rng.integers(0, rows, rows // every)
        p[r, rng.integers(0, n, r.size)] = np.nan
    return p


def warp_task(n, unroll):
    """(C, rows a task) of the ``warp`` kernels for rows of ``n``: C packets a task, the
    most that fit ``unroll`` stripes of 32 packets while 4 * C stays a multiple of n (a task
    starts on a row boundary and on 16 bytes)."""
    q = math.lcm(n, 4) // 4            # packets of the smallest whole number of rows
    if q > 32 * unroll:
        raise ValueError(f"rows of {n} need more than {unroll} stripes a task")
    c = q * (32 * unroll // q)
    return c, 4 * c // n


def short_rows(dev, pool, rng):
    """Section 2: rows of ROW_LENGTHS elements, about ROW_BYTES (see the module docstring)."""
    h = dev.h
    names = [f"{op}_{k}_u{u}" for op in ("sum", "argmax") for k in ("thread", "warp")
             for u in ROW_UNROLLS]
    kern = {**dev.kernels(ROWS_SOURCE, [x for x in names if "_thread_" in x], "PqiP"),
            **dev.kernels(ROWS_SOURCE, [x for x in names if "_warp_" in x], "PqiqqP")}
    regs = register_counts(kernel_loader.compile_source(ROWS_SOURCE), names)
    short_k = kernel_loader.function("reduce", "sum_short", "f32", OURS_ROW_FMT)
    short_regs = register_counts(kernel_loader.cubin("reduce"), ["sum_short_f32"])
    for n in ROW_LENGTHS:
        try:
            rows = ROW_BYTES // (4 * n)
            host = pool[:rows * n].reshape(rows, n)
            picks = with_nans_and_ties(host, rng)
            ref_sum = host.sum(axis=1, dtype=np.float64)
            ref_min, ref_arg = host.min(axis=1), np.argmax(picks, axis=1)
            k = inputs_beyond_l2(host.nbytes)
            xs = [h.create_from_numpy(host) for _ in range(k)]
            ps = [h.create_from_numpy(picks) for _ in range(k)]
            xp, pp = [int(x.gpudata) for x in xs], [int(x.gpudata) for x in ps]
            out = h.allocate((rows,))

            def reset(o=out):
                h.fill(o, np.nan)

            def got(o=out):
                return h.get_numpy_copy(o)
            nbytes = host.nbytes + rows * 4
            checks = {"sum": sum_check(got, ref_sum, n), "argmax": index_check(got, ref_arg)}
            table = [
                case_row(dev, "ours sum_t", ours_plan(dev, (rows, n), 1, "sum"), nbytes,
                         lambda i: h.sum_t(xs[i % k], 1, out), checks["sum"], reset),
                case_row(dev, "ours min_t", ours_plan(dev, (rows, n), 1, "min"), nbytes,
                         lambda i: h.min_t(xs[i % k], 1, out), exact_check(got, ref_min),
                         reset),
                case_row(dev, "ours argmax_t", ours_plan(dev, (rows, n), 1, "pick"), nbytes,
                         lambda i: h.argmax_t(ps[i % k], 1, out), checks["argmax"], reset)]
            # Ours's sum_short_f32 at other grids (it strides over tiles of whole rows):
            # blocks beyond the resident ones start only when a resident one has finished
            # all its tiles.
            tiles = ceil_div(rows, SHORT_TILE // n)
            for per_sm in OURS_PER_SM:
                grid = min(tiles, dev.sms * per_sm)

                def call(i, g=grid, o=out):
                    dev.run(short_k, g, OURS_BLOCK, xp[i % k], 0, int(o.gpudata), 0, rows, n,
                            1, 1, 1, 0)
                launch = (f"sum_short_f32 {grid}x{OURS_BLOCK} ({per_sm}/SM), "
                          f"{dev.shape_text(short_regs.get('sum_short_f32'), OURS_BLOCK, per_sm)}")
                table.append(case_row(dev, "ours kernel", launch, nbytes, call, checks["sum"],
                                      reset))
            try:
                ro = read_only_ms(h, host.nbytes, REPS)["median"]
                table.append(["read-only (input only)", "best of ops sweep",
                              *figures(dev, ro, nbytes), "-"])
            except Exception as e:  # the bound's row alone is lost
                print(f"read-only: ERROR {type(e).__name__}: {e}")
            for name in names:
                op, kind, unroll = name.split("_")
                u = int(unroll[1:])
                src = pp if op == "argmax" else xp
                if kind == "thread":
                    if n > THREAD_ROW_MAX:
                        continue
                    grid = ceil_div(rows, ROW_BLOCK * u)

                    def call(i, f=kern[name], g=grid, s=src, o=out):
                        dev.run(f, g, ROW_BLOCK, s[i % k], rows, n, int(o.gpudata))
                    launch = f"{grid}x{ROW_BLOCK}, {u} rows a thread"
                else:
                    c, per_task = warp_task(n, u)
                    tasks = ceil_div(ceil_div(rows * n, 4), c)     # packets / C
                    grid = ceil_div(tasks, ROW_BLOCK // 32)         # a warp a task

                    def call(i, f=kern[name], g=grid, s=src, c=c, r=per_task, o=out):
                        dev.run(f, g, ROW_BLOCK, s[i % k], rows, n, c, r, int(o.gpudata))
                    launch = f"{grid}x{ROW_BLOCK}, {c} packets a warp"
                launch += f", {dev.shape_text(regs.get(name), ROW_BLOCK)}"
                table.append(case_row(dev, f"{op} {kind} U{u}", launch, nbytes, call,
                                      checks[op], reset))
            print(f"\nrows of {n}: ({rows}, {n}) float32 over axis 1 ({host.nbytes / MB:.0f} MB "
                  f"in, {rows * 4 / MB:.1f} MB out), {k} inputs; copy = "
                  f"{dev.copy_Bps / 1e12:.3f} TB/s; {LOOP} calls back to back, median of {REPS}")
            print_table(HEADERS, table)
            sys.stdout.flush()
        except Exception:  # the next row length still runs
            traceback.print_exc()


def main():
    h = cuda_handler("reduction_variants", F32, what="tool")
    if h is None:
        return 0
    dev = Device(h)
    print(f"{dev.name}: {dev.sms} SMs, {dev.sm_threads} threads/SM, L2 {dev.l2 / MB:.0f} MB; "
          f"copy (128 MB) = {dev.copy_Bps / 1e12:.3f} TB/s", flush=True)
    rng = np.random.default_rng(SEED)
    # Mean 1, so that a 1-D sum is far from 0 and its relative error means something.
    pool = rng.standard_normal(max(*LONG_SIZES, ROW_BYTES // 4), dtype=F32)
    pool += F32(1)
    for section in (lambda: long_sums(dev, pool), lambda: short_rows(dev, pool, rng)):
        try:
            section()
        except Exception:  # the next section still runs
            traceback.print_exc()
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
