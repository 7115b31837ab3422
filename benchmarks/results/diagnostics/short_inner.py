"""Column reductions whose contiguous (inner) run is a few elements: two
kernel shapes the engine does not have, beside ours and torch.

The random set's misses on an H200 are mostly reductions over a middle
axis whose kept inner run is 1 to 4 elements: ``argmax_t`` of (547, 2467,
2) over axis 1 at 0.56x torch (``pick_cols``: a block of 256 threads down
each outer slab, one thread column wide), ``max_t`` of (1861, 449, 3, 2)
over axis 2 at 0.73x (``max_short``: slabs of 6 elements through shared
memory), ``argmax_t`` of (245270, 4) over axis 0 at 0.51x in an earlier
run.  ``cols_tiles`` found that no tile, grid or chunk count cures them.
This times, on the view (outer, n, inner) of each case, float32:

* ``per_output``: a thread per output (o, i), reading its n elements
  ``inner`` apart; each thread takes ``U`` outputs a grid stride apart at
  once, so that U * n loads are in flight.  A warp's loads of one row fall
  in a few lines, which the next rows' loads find in L1: every byte read
  is used.  For short n (a slab of n * inner elements read by a few
  threads), not for long ones (few outputs, each a long walk).
* ``packets``: each outer slab (n * inner contiguous elements) split into
  ``chunks`` runs of rows, a block a run, whose threads read 16-byte
  packets across the run (the slab's first and last partial packets
  element by element); element e of the slab is column e % inner, row e /
  inner, folded into the thread's ``inner`` partial states (inner a
  template constant, 1 to 8).  The block combines each column's states
  (shuffles, then a warp of warp results), and with several chunks a
  second kernel combines the chunks' states of each output in chunk
  order.  For long n.

Both keep the extremes' rules: max propagates NaN, argmax gives the first
index of the largest element (the first NaN where there is one).  Each
variant is checked against NumPy, then timed (median of ``REPS`` samples of
``CALLS`` calls, inputs cycled beyond the L2) beside ``h.max_t`` /
``h.argmax_t`` and ``torch.amax`` / ``torch.argmax``.  Run on the GPU
machine from the project root::

    python benchmarks/results/diagnostics/short_inner.py
"""
import pathlib
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

REPS, CALLS = 10, 10
BLOCK = 256
U = 4            # outputs a thread of ``per_output`` takes at once
INNERS = range(1, 9)
#: (op, shape, axis): the misses named above and neighbours of theirs
CASES = [("argmax_t", (547, 2467, 2), 1), ("max_t", (547, 2467, 2), 1),
         ("max_t", (1861, 449, 3, 2), 2), ("argmax_t", (1861, 449, 3, 2), 2),
         ("argmax_t", (245270, 4), 0), ("max_t", (245270, 4), 0),
         ("max_t", (20000, 17, 3), 1), ("argmax_t", (64, 100000, 1, 3), 1)]

SOURCE = r"""
#include <cstdint>

// The running extreme of a column: its value and the row it came from.
struct State {
    float v;
    long long i;
};

// b after a in row order (b.i > a.i within a thread's walk; across threads
// the combine orders by index): the max keeps the larger value, NaN over
// any number, the first index among equals and among NaNs.
__device__ __forceinline__ State take(State a, State b) {
    const bool an = a.v != a.v, bn = b.v != b.v;
    bool b_wins;
    if (an || bn) b_wins = bn && (!an || b.i < a.i);
    else b_wins = b.v > a.v || (b.v == a.v && b.i < a.i);
    return b_wins ? b : a;
}

__device__ __forceinline__ State shfl(State s, int offset) {
    State o;
    o.v = __shfl_xor_sync(0xffffffffu, s.v, offset);
    o.i = __shfl_xor_sync(0xffffffffu, s.i, offset);
    return o;
}

// A thread per output (o, c) of the (outer, n, inner) view: out[o * inner + c].
// ARG: write the index (as a float), else the value.
template <bool ARG>
__device__ void per_output(const float* x, float* out, long long outputs, int n, int inner) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long base = (long long)blockIdx.x * blockDim.x + threadIdx.x; base < outputs;
         base += stride * __U__) {
        State s[__U__];
        const float* p[__U__];
#pragma unroll
        for (int u = 0; u < __U__; ++u) {
            const long long t = base + u * stride;
            const long long o = t / inner, c = t - o * inner;
            p[u] = x + (o * n) * inner + c;
            s[u].v = -__int_as_float(0x7f800000);
            s[u].i = 0;
        }
        for (int r = 0; r < n; ++r) {
            float v[__U__];
#pragma unroll
            for (int u = 0; u < __U__; ++u)
                v[u] = base + u * stride < outputs ? p[u][(long long)r * inner] : 0.0f;
#pragma unroll
            for (int u = 0; u < __U__; ++u) {
                const State b = {v[u], r};
                s[u] = r == 0 ? b : take(s[u], b);
            }
        }
#pragma unroll
        for (int u = 0; u < __U__; ++u) {
            const long long t = base + u * stride;
            if (t < outputs) out[t] = ARG ? (float)s[u].i : s[u].v;
        }
    }
}

// Block b = o * chunks + k reduces rows [k * chunk, min(n, (k + 1) * chunk))
// of outer slab o (elements o * n * I onwards, contiguous) into I states,
// written to states[(o * chunks + k) * I + c], or, with one chunk, into out.
template <int I, bool ARG>
__device__ void packets(const float* x, float* out, State* states, long long outer, long long n,
                        long long chunk, int chunks) {
    __shared__ State warp_part[32][I];
    const long long o = blockIdx.x / chunks;
    const int k = blockIdx.x - o * chunks;
    if (o >= outer) return;
    const long long slab = o * n * I;
    const long long r0 = k * chunk, r1 = min(n, r0 + chunk);
    const long long a = slab + r0 * I, b = slab + r1 * I;   // the run's elements
    State s[I];
#pragma unroll
    for (int c = 0; c < I; ++c) {
        s[c].v = -__int_as_float(0x7f800000);
        s[c].i = 0x7fffffffffffffffLL;
    }
    // element e of the run: slab column (e - slab) % I, row (e - slab) / I
    const auto fold = [&](long long e, float v) {
        const long long rel = e - slab;
        const int c = (int)(rel % I);
        const State t = {v, rel / I};
#pragma unroll
        for (int cc = 0; cc < I; ++cc)
            if (cc == c) s[cc] = take(s[cc], t);
    };
    const long long q0 = (a + 3) / 4, q1 = b / 4;   // whole 16-byte packets in [a, b)
    if (q0 >= q1) {
        for (long long e = a + threadIdx.x; e < b; e += blockDim.x) fold(e, x[e]);
    } else {
        for (long long e = a + threadIdx.x; e < q0 * 4; e += blockDim.x) fold(e, x[e]);
        for (long long e = q1 * 4 + threadIdx.x; e < b; e += blockDim.x) fold(e, x[e]);
        const float4* xp = reinterpret_cast<const float4*>(x);
        long long q = q0 + threadIdx.x;
        for (; q + 3 * (long long)blockDim.x < q1; q += 4 * (long long)blockDim.x) {
            float4 pk[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) pk[j] = xp[q + j * (long long)blockDim.x];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const long long e = (q + j * (long long)blockDim.x) * 4;
                fold(e, pk[j].x);
                fold(e + 1, pk[j].y);
                fold(e + 2, pk[j].z);
                fold(e + 3, pk[j].w);
            }
        }
        for (; q < q1; q += blockDim.x) {
            const float4 pk = xp[q];
            fold(q * 4, pk.x);
            fold(q * 4 + 1, pk.y);
            fold(q * 4 + 2, pk.z);
            fold(q * 4 + 3, pk.w);
        }
    }
    // the block's states of each column: the warp, then the warps
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int c = 0; c < I; ++c) {
        for (int off = 16; off > 0; off >>= 1) s[c] = take(s[c], shfl(s[c], off));
        if (lane == 0) warp_part[warp][c] = s[c];
    }
    __syncthreads();
    if (warp == 0) {
        const int warps = blockDim.x >> 5;
#pragma unroll
        for (int c = 0; c < I; ++c) {
            State t = lane < warps ? warp_part[lane][c]
                                   : State{-__int_as_float(0x7f800000), 0x7fffffffffffffffLL};
            for (int off = 16; off > 0; off >>= 1) t = take(t, shfl(t, off));
            if (lane == 0) {
                if (chunks == 1) out[o * I + c] = ARG ? (float)t.i : t.v;
                else states[(o * chunks + k) * I + c] = t;
            }
        }
    }
}

// The chunks' states of each output (o, c), in chunk order.
template <bool ARG>
__device__ void finish(const State* states, float* out, long long outputs, int chunks,
                       int inner) {
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < outputs;
         t += (long long)gridDim.x * blockDim.x) {
        const long long o = t / inner, c = t - o * inner;
        State s = states[(o * chunks) * inner + c];
        for (int k = 1; k < chunks; ++k) s = take(s, states[(o * chunks + k) * inner + c]);
        out[t] = ARG ? (float)s.i : s.v;
    }
}
"""


def _entry(name, template, params):
    """An ``extern "C"`` kernel ``name`` calling ``template`` on ``params``
    (a C parameter list)."""
    args = ", ".join(p.rsplit(" ", 1)[1].lstrip("*") for p in params.split(", "))
    return f'extern "C" __global__ void {name}({params}) {{ {template}({args}); }}'


def _packets_source():
    """SOURCE and its entry points: ``per_output_<kind>``, ``finish_<kind>``
    and ``packets_<kind>_<I>`` (I = 1 to 8), kind max or argmax."""
    lines = [SOURCE.replace("__U__", str(U))]
    for kind, arg in (("max", "false"), ("argmax", "true")):
        lines.append(_entry(f"per_output_{kind}", f"per_output<{arg}>",
                            "const float* x, float* out, long long outputs, int n, int inner"))
        lines.append(_entry(f"finish_{kind}", f"finish<{arg}>",
                            "const State* states, float* out, long long outputs, int chunks, "
                            "int inner"))
        lines += [_entry(f"packets_{kind}_{i}", f"packets<{i}, {arg}>",
                         "const float* x, float* out, State* states, long long outer, "
                         "long long n, long long chunk, int chunks") for i in INNERS]
    return "\n".join(lines) + "\n"


def _view(shape, axis):
    """(outer, n, inner) of a reduction of ``shape`` over ``axis``."""
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, shape[axis], inner


def main():
    from benchmarks.gpu import EventTimer, cuda_handler
    from benchmarks.ops import inputs_beyond_l2
    from handlers.cuda import kernel_loader
    h = cuda_handler("short_inner", np.float32, what="tool")
    if h is None:
        return
    try:
        import torch
    except ImportError:
        torch = None
    source = _packets_source()
    names = {"per_output_max": "PPqii", "per_output_argmax": "PPqii",
             "finish_max": "PPqii", "finish_argmax": "PPqii"}
    names.update({f"packets_{k}_{i}": "PPPqqqi" for i in INNERS for k in ("max", "argmax")})
    kernels = {n: kernel_loader.source_function(source, n, f) for n, f in names.items()}
    launch = kernel_loader.launch_function()

    def run(name, grid, *args):
        k = kernels[name]
        launch(k.handle, h.stream.handle, grid, BLOCK, k.fmt, *args)

    timer = EventTimer("pycuda", h.stream)
    sms = h._sms
    rng = np.random.default_rng(11)
    print(f"short inner runs: {sms} SMs; us per call, median of {REPS} samples of {CALLS} "
          f"calls, inputs from DRAM; float32; check against NumPy")
    for op, shape, axis in CASES:
        kind = "argmax" if op == "argmax_t" else "max"
        host = rng.standard_normal(shape).astype(np.float32)
        want = (np.argmax(host, axis=axis) if kind == "argmax"
                else np.max(host, axis=axis)).astype(np.float32).ravel()
        outer, n, inner = _view(shape, axis)
        k = inputs_beyond_l2(host.nbytes)
        xs = [h.create_from_numpy(host) for _ in range(k)]
        oshape = tuple(1 if i == axis else s for i, s in enumerate(shape))
        out = h.allocate(oshape)
        outputs = outer * inner
        flat = h.allocate((outputs,))
        line = (f"\n{op} {shape} axis {axis}: (outer, n, inner) = {(outer, n, inner)}, "
                f"{host.nbytes / 1e6:.1f} MB, {k} inputs cycled")
        if torch is not None:
            fn = torch.argmax if kind == "argmax" else torch.amax
            ts = [torch.from_numpy(host).cuda() for _ in range(k)]
            tt = EventTimer("torch", module=torch)
            us = tt.measure(lambda i: fn(ts[i % k], axis), reps=REPS, warmup=2,
                            inner=CALLS)["median"] * 1e3
            line += f"; torch {us:.2f} us"
        print(line, flush=True)
        red = getattr(h, op)
        us = timer.measure(lambda i: red(xs[i % k], axis, out), reps=REPS, warmup=2,
                           inner=CALLS)["median"] * 1e3
        plan = next(iter(h._sum_plans.values()), None) if h._sum_plans else None
        print(f"  ours ({plan.launch.kernel if plan else '?'}): {us:8.2f} us", flush=True)
        h._sum_plans.clear()
        variants = []
        if n * inner <= 4096:
            for per_sm in (4, 8, 16, 32):
                grid = max(1, min(-(-outputs // (BLOCK * U)), sms * per_sm))
                variants.append((f"per_output, {per_sm}/SM", grid, None))
        if inner <= max(INNERS):
            for chunks in sorted({1, 2, 4, -(-sms * 4 // outer), -(-sms * 8 // outer),
                                  -(-sms * 16 // outer)}):
                chunks = max(1, min(chunks, -(-n // 64)))
                variants.append((f"packets, {chunks} chunk(s)", None, chunks))
        seen = set()
        for name, grid, chunks in variants:
            if name in seen:
                continue
            seen.add(name)
            if chunks is None:
                def call(i, grid=grid):
                    run(f"per_output_{kind}", grid, int(xs[i % k].gpudata),
                        int(flat.gpudata), outputs, n, inner)
            else:
                chunk = -(-n // chunks)
                chunks = -(-n // chunk)
                states = h.allocate((max(1, outer * chunks * inner * 4),))   # 16-byte states

                def call(i, chunks=chunks, chunk=chunk, states=states):
                    run(f"packets_{kind}_{inner}", outer * chunks, int(xs[i % k].gpudata),
                        int(flat.gpudata), int(states.gpudata), outer, n, chunk, chunks)
                    if chunks > 1:
                        run(f"finish_{kind}", max(1, min(-(-outputs // BLOCK), sms * 8)),
                            int(states.gpudata), int(flat.gpudata), outputs, chunks, inner)
            h.fill(flat, np.nan)
            call(0)
            got = h.get_numpy_copy(flat)
            ok = np.array_equal(got, want, equal_nan=True)
            us = timer.measure(call, reps=REPS, warmup=2, inner=CALLS)["median"] * 1e3
            print(f"  {name:28s} {us:8.2f} us  {'ok' if ok else 'WRONG'}", flush=True)


if __name__ == "__main__":
    main()
