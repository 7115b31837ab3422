"""LayerNorm's backward with its summed outputs: do more rows in flight a
block close the gap to the kernels without sums?

On an H200 (``fused_terms``, main at 15b09d4) LayerNorm's backward over
8192x4096 took 170 us (59% of copy), where dx alone (a block per row, no
summed outputs) took 105.6 and dgain and dbias alone 107.9.  The summed
outputs make the row kernel loop over rows on the resident blocks (one
block of 1024 threads a multiprocessor there, each thread holding 4
columns of dy and x and their running sums), so each multiprocessor has
one row in flight at a time: its loads, two block reductions and its
stores, then the next row (an L2 prefetch of the next row helps: 167 us
against 195 without).  8192 rows over 132 multiprocessors at about 2.7 us
a row is the 167 us.

This times standalone kernels of the same math (float32, a thread per
16-byte packet of each array, dgain and dbias summed in registers, the
blocks' partial rows added by a second kernel), with ``ROWS`` rows a
block's trip (1, 2 or 4: their loads issued together, their reductions
behind one barrier), with and without an L2 prefetch of the next trip's
rows, on grids of 1 to 4 blocks a multiprocessor, beside the library's
program (``layers.layernorm._BACKWARD``), each checked against float64
NumPy.  Run on the GPU machine from the project root::

    python benchmarks/results/diagnostics/summed_rows_pipeline.py
"""
import pathlib
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import variants  # noqa: E402  (this folder's, beside the script)

REPS, CALLS = 10, 10
SHAPES = [(8192, 4096), (32768, 1000), (4096, 1024)]
EPS = 1e-5
TRIPS = (1, 2, 4)

SOURCE = r"""
// Block b takes rows b * ROWS + k * gridDim.x * ROWS + j (j < ROWS): each
// thread owns columns 4t..4t+3 (one float4 of each array), sums dy * xhat
// and dy of its columns over its rows in registers, and writes them at the
// end into partial[b * 2 * d + ...]; blockDim.x * 4 >= d, d % 4 == 0.
template <int ROWS, bool PREFETCH>
__device__ void ln_backward(const float* dy, const float* x, const float* gain,
                            const float* mu, const float* rs, float* dx, float* partial,
                            long long n, int d) {
    __shared__ float red[2][2 * ROWS][32];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, warps = blockDim.x >> 5;
    const bool mine = t * 4 < d;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 gn = mine ? reinterpret_cast<const float4*>(gain)[t] : zero;
    float4 sg = zero, sb = zero;
    const float inv_d = 1.0f / d;
    const long long q = d / 4;   // packets a row
    int parity = 0;
    for (long long base = (long long)blockIdx.x * ROWS; base < n;
         base += (long long)gridDim.x * ROWS) {
        float4 vd[ROWS], vx[ROWS];
        float m[ROWS], r[ROWS];
#pragma unroll
        for (int j = 0; j < ROWS; ++j) {
            const long long row = base + j;
            const bool live = mine && row < n;
            vd[j] = live ? reinterpret_cast<const float4*>(dy)[row * q + t] : zero;
            vx[j] = live ? reinterpret_cast<const float4*>(x)[row * q + t] : zero;
            m[j] = row < n ? mu[row] : 0.f;
            r[j] = row < n ? rs[row] : 0.f;
        }
        if (PREFETCH && mine) {
#pragma unroll
            for (int j = 0; j < ROWS; ++j) {
                const long long row = base + (long long)gridDim.x * ROWS + j;
                if (row < n) {
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(dy + row * d + 4 * t));
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(x + row * d + 4 * t));
                }
            }
        }
        float a[ROWS], c[ROWS];   // per row: sum of g, sum of g * xhat
        float4 xh[ROWS], g[ROWS];
#pragma unroll
        for (int j = 0; j < ROWS; ++j) {
            xh[j] = make_float4((vx[j].x - m[j]) * r[j], (vx[j].y - m[j]) * r[j],
                                (vx[j].z - m[j]) * r[j], (vx[j].w - m[j]) * r[j]);
            g[j] = make_float4(vd[j].x * gn.x, vd[j].y * gn.y, vd[j].z * gn.z, vd[j].w * gn.w);
            a[j] = (g[j].x + g[j].y) + (g[j].z + g[j].w);
            c[j] = (g[j].x * xh[j].x + g[j].y * xh[j].y) + (g[j].z * xh[j].z + g[j].w * xh[j].w);
            sg.x += vd[j].x * xh[j].x; sg.y += vd[j].y * xh[j].y;
            sg.z += vd[j].z * xh[j].z; sg.w += vd[j].w * xh[j].w;
            sb.x += vd[j].x; sb.y += vd[j].y; sb.z += vd[j].z; sb.w += vd[j].w;
        }
        // every row's two sums over the block, behind one barrier
#pragma unroll
        for (int j = 0; j < ROWS; ++j) {
            for (int off = 16; off > 0; off >>= 1) {
                a[j] += __shfl_xor_sync(0xffffffffu, a[j], off);
                c[j] += __shfl_xor_sync(0xffffffffu, c[j], off);
            }
            if (lane == 0) {
                red[parity][2 * j][warp] = a[j];
                red[parity][2 * j + 1][warp] = c[j];
            }
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < ROWS; ++j) {
            float aa = lane < warps ? red[parity][2 * j][lane] : 0.f;
            float cc = lane < warps ? red[parity][2 * j + 1][lane] : 0.f;
            for (int off = 16; off > 0; off >>= 1) {
                aa += __shfl_xor_sync(0xffffffffu, aa, off);
                cc += __shfl_xor_sync(0xffffffffu, cc, off);
            }
            a[j] = aa * inv_d;
            c[j] = cc * inv_d;
        }
        parity ^= 1;   // the next trip writes the other half: one barrier a trip
#pragma unroll
        for (int j = 0; j < ROWS; ++j) {
            const long long row = base + j;
            if (mine && row < n) {
                float4 o;
                o.x = r[j] * (g[j].x - a[j] - xh[j].x * c[j]);
                o.y = r[j] * (g[j].y - a[j] - xh[j].y * c[j]);
                o.z = r[j] * (g[j].z - a[j] - xh[j].z * c[j]);
                o.w = r[j] * (g[j].w - a[j] - xh[j].w * c[j]);
                reinterpret_cast<float4*>(dx)[row * q + t] = o;
            }
        }
    }
    if (mine) {
        reinterpret_cast<float4*>(partial + (long long)blockIdx.x * 2 * d)[t] = sg;
        reinterpret_cast<float4*>(partial + (long long)blockIdx.x * 2 * d + d)[t] = sb;
    }
}

// dgain and dbias: column j of the blocks' partial rows, added in block order.
extern "C" __global__ void ln_finish(const float* partial, float* dgain, float* dbias,
                                     int blocks, int d) {
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < 2 * d; j += gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int b = 0; b < blocks; ++b) s += partial[(long long)b * 2 * d + j];
        if (j < d) dgain[j] = s;
        else dbias[j - d] = s;
    }
}
"""


def _source():
    """SOURCE and its entry points ``ln_backward_<ROWS>_<p>`` (p: prefetch)."""
    lines = [SOURCE]
    for rows in TRIPS:
        for pf in (0, 1):
            lines.append(
                f'extern "C" __global__ void __launch_bounds__(1024) ln_backward_{rows}_{pf}('
                f"const float* dy, const float* x, const float* gain, const float* mu, "
                f"const float* rs, float* dx, float* partial, long long n, int d) {{ "
                f"ln_backward<{rows}, {'true' if pf else 'false'}>(dy, x, gain, mu, rs, dx, "
                f"partial, n, d); }}")
    return "\n".join(lines) + "\n"


def main():
    from benchmarks.gpu import EventTimer, cuda_handler
    from benchmarks.ops import copy_spread
    from handlers.cuda import kernel_loader
    from layers.layernorm import _BACKWARD
    h = cuda_handler("summed_rows_pipeline", np.float32, what="tool")
    if h is None:
        return
    source = _source()
    names = {f"ln_backward_{r}_{p}": "PPPPPPPqi" for r in TRIPS for p in (0, 1)}
    names["ln_finish"] = "PPPii"
    kernels = {k: kernel_loader.source_function(source, k, f) for k, f in names.items()}
    launch = kernel_loader.launch_function()
    timer = EventTimer("pycuda", h.stream)
    copy_Bps = copy_spread(h, (128 << 20) // 4, 7)["median"]
    sms = h._sms
    print(f"LayerNorm backward, rows in flight: {sms} SMs, copy {copy_Bps / 1e12:.3f} TB/s; "
          f"us per call, median of {REPS} samples of {CALLS} calls, inputs from DRAM; "
          f"check: max |error| / max |reference| against float64")
    rng = np.random.default_rng(5)
    for n, d in SHAPES:
        dy = rng.standard_normal((n, d)).astype(np.float32)
        x = rng.standard_normal((n, d)).astype(np.float32)
        gain = (1 + 0.1 * rng.standard_normal((1, d))).astype(np.float32)
        t = variants.layer_norm_backward_case(h, dy, x, gain, EPS)
        k, dys, outs, check = t.k, t.dys, t.outs, t.check
        hx, hg, hmu, hr = t.args
        nbytes = (3 * n * d + 3 * d + 2 * n) * 4

        def line(name, us, err):
            print(f"  {name:34s} {us:9.2f} ({nbytes / (us * 1e-6) / copy_Bps:6.1%})  {err:.1e} "
                  f"{'ok' if err < 1e-4 else 'WRONG'}", flush=True)
        print(f"\n({n}, {d}): {nbytes / 1e6:.0f} MB moved, {k} inputs cycled")

        def ours(i):
            _BACKWARD(h, dys[i % k], hx, hg, hmu, hr, *outs)
        for o in outs:
            h.fill(o, np.nan)
        ours(0)
        line("ours (layer_norm_backward)", timer.measure(ours, reps=REPS, warmup=2,
                                                         inner=CALLS)["median"] * 1e3, check())
        if d % 4 or d > 4096:
            continue
        block = -(-(d // 4) // 32) * 32
        for per_sm in (1, 2, 4):
            if block * per_sm > h._sm_threads:
                continue
            grid = sms * per_sm
            partial = h.allocate((grid * 2 * d,))
            for rows in TRIPS:
                for pf in (0, 1):
                    kern, fin = kernels[f"ln_backward_{rows}_{pf}"], kernels["ln_finish"]

                    def call(i, kern=kern, fin=fin, grid=grid, partial=partial):
                        launch(kern.handle, h.stream.handle, grid, block, kern.fmt,
                               int(dys[i % k].gpudata), int(hx.gpudata), int(hg.gpudata),
                               int(hmu.gpudata), int(hr.gpudata), int(outs[0].gpudata),
                               int(partial.gpudata), n, d)
                        launch(fin.handle, h.stream.handle, max(1, -(-2 * d // 256)), 256,
                               fin.fmt, int(partial.gpudata), int(outs[1].gpudata),
                               int(outs[2].gpudata), grid, d)
                    for o in outs:
                        h.fill(o, np.nan)
                    call(0)
                    err = check()
                    us = timer.measure(call, reps=REPS, warmup=2, inner=CALLS)["median"] * 1e3
                    line(f"{rows} row(s) a trip, {'prefetch' if pf else 'no prefetch'}, "
                         f"{per_sm}/SM", us, err)


if __name__ == "__main__":
    main()
