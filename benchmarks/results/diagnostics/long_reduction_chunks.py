"""Does the chunking of ``*_long`` hold large few-row reductions below 80% of
copy?  The reductions suite's inputs above 64 MB ran at a median of 81.8%
and 79.7% of copy in two H200 runs, where a kernel that only reads the same
bytes reached 95.6% (its best of a sweep of launch shapes): a 1-D ``mean_t``
of 82 MB at 77.6%.  ``plan_rows`` splits each row into as many chunks as
one wave of the kernel's resident blocks holds (reductions.py).

For each case this times ours on the planner's plan and with the chunks
forced (fewer and more than one wave), beside torch and the read-only kernel
(``benchmarks.ops.read_only_ms``), every input read from DRAM (inputs cycled
as the suites do, ``inputs_beyond_l2``): us per call, the fraction of copy
bandwidth, torch's time over ours; each variant's result checked against
float64 NumPy.  Nothing in the library changes: the process wraps
``reductions.plan`` and uses a fresh handler per variant (plans are cached
per handler).

Run by hand from the project root on a GPU machine with torch:
``python benchmarks/results/diagnostics/long_reduction_chunks.py``.
"""
import pathlib
import statistics
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

REPS, CALLS = 15, 10
#: (op, shape, axis): the weak large cases of the random sets, and a larger one
CASES = [("mean_t", (21538982,), None), ("sum_t", (2, 1, 3671, 3767), None),
         ("max_t", (60000000,), 0), ("sum_t", (3, 20000000), 1)]
#: chunks per row to force (None: the planner's)
CHUNKS = [None, 132, 264, 528, 1056, 2112]


def main():
    from benchmarks.gpu import EventTimer, optional_peers
    from benchmarks.ops import copy_bandwidth, inputs_beyond_l2, read_only_ms
    from handlers.cuda import reductions as R
    from handlers.cuda.handler import PyCudaHandler

    plan = R.plan
    force = {"chunks": None, "seen": None}

    def forced(shape, axes, aligned, width, family, *a, **k):
        p = plan(shape, axes, aligned, width, family, *a, **k)
        if p is None or "_long" not in p.launch.kernel:
            return p
        rows, n, chunk, chunks, div, kind = p.launch.args
        force["seen"] = (p.launch.kernel, p.launch.grid, chunks)
        if force["chunks"] is None:
            return p
        chunks = max(1, min(force["chunks"] // rows, n))
        chunk = -(-n // chunks)
        chunk += -chunk % width
        chunks = -(-n // chunk)
        launch = R.Launch(p.launch.kernel, min(rows * chunks, 2**31 - 1),
                          (rows, n, chunk, chunks, div, kind), p.launch.block)
        return R.Plan(launch, rows * chunks * R._state(family, width) if chunks > 1 else 0,
                      rows if chunks > 1 else 0)

    R.plan = forced
    torch = optional_peers().get("torch")
    rng = np.random.default_rng(0)
    h0 = PyCudaHandler(np.float32)
    copy = copy_bandwidth(h0, (128 << 20) // 4)   # bytes/s, as the reductions suite's
    print(f"long reductions: copy {copy / 1e12:.3f} TB/s; us per call, median of {REPS} "
          f"samples of {CALLS} calls, inputs from DRAM")
    for op, shape, axis in CASES:
        host = rng.standard_normal(shape).astype(np.float32)
        nbytes = host.nbytes
        k = inputs_beyond_l2(nbytes)
        ref = getattr(np, {"mean_t": "mean", "sum_t": "sum", "max_t": "max"}[op])(
            host.astype(np.float64), axis=axis)
        ro = read_only_ms(h0, nbytes)["median"] * 1e3
        print(f"\n{op} {shape} axis {axis}: {nbytes / 1e6:.1f} MB, {k} inputs cycled; "
              f"read-only kernel {ro:.2f} us ({nbytes / (ro * 1e-6) / copy:.1%} of copy)")
        if torch is not None:
            ts = [torch.from_numpy(host).cuda() for _ in range(k)]
            fn = {"mean_t": torch.mean, "sum_t": torch.sum, "max_t": torch.amax}[op]
            tt = EventTimer("torch", module=torch)
            kw = {} if axis is None else {"dim": axis}
            t_us = statistics.median(
                tt.sample(lambda i, fn=fn, ts=ts, kw=kw: fn(ts[i % k], **kw), 0, CALLS)
                for _ in range(REPS)) * 1e3
            print(f"  torch {t_us:.2f} us ({nbytes / (t_us * 1e-6) / copy:.1%} of copy)")
        else:
            t_us = None
        for chunks in CHUNKS:
            force["chunks"] = chunks
            h = PyCudaHandler(np.float32)
            xs = [h.create_from_numpy(host) for _ in range(k)]
            out = h.zeros(np.shape(ref) if np.ndim(ref) else (1,))
            red = getattr(h, op)
            red(xs[0], axis, out)
            got = h.get_numpy_copy(out).astype(np.float64).reshape(np.shape(ref))
            err = float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))
            timer = EventTimer("pycuda", h.stream)
            us = statistics.median(
                timer.sample(lambda i, red=red, xs=xs, out=out: red(xs[i % k], axis, out),
                             0, CALLS) for _ in range(REPS)) * 1e3
            kernel, grid, planned = force["seen"] or ("?", 0, 0)
            what = f"chunks {chunks}" if chunks else f"planned ({planned} chunks)"
            vs = f", torch/ours {t_us / us:.3f}" if t_us else ""
            print(f"  {what:>22}: {kernel} {us:8.2f} us "
                  f"({nbytes / (us * 1e-6) / copy:.1%} of copy{vs}); rel. error {err:.1e}")
    R.plan = plan


if __name__ == "__main__":
    main()
