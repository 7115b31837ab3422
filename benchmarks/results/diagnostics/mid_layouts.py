"""Which plan a sum over A and I of an (A, M, I) layout wants.

The reductions run at efb3aad (an H200, 2026-11-27) drew ``sum_t`` of
(127, 4096, 2, 4) over (0, 2, 3), the layout (A, M, I) = (127, 4096, 8), at
40.2 us against PyTorch's 14.9 (0.37x): ``plan_mid`` gives each of the 4096
columns a block of 1024 threads for its 254 packets.  The branch
``mid-short`` (b78574f) sent such short columns to ``sum_gen``
instead: 34.3 us, 0.42x, so the general kernel is no cure either.  This
times, ours only beside PyTorch, four ways of the same layouts in one
process (a fresh handler per way: plans are cached per handler):

- ``mid``: ``plan_mid`` (the tree's plan for every such layout);
- ``mid/B``: the same plan launched in blocks of B threads (the kernel is
  correct for any multiple of 32 up to 1024);
- ``gen``: ``plan_gen`` over extents (A, M, I) reducing (0, 2);
- ``I,A``: two ``sum_t`` calls on views, I first as rows of (A*M, I),
  then A as columns of (A, M), through a scratch array;
- ``A,I``: A first as columns of (A, M*I), then I as rows of (M, I).

Each figure is the median of REPS samples of CALLS calls back to back
between CUDA events, cycling inputs beyond the L2 so that every call reads
from DRAM, checked against float64 NumPy.  Run on the GPU machine from the
project root::

    python benchmarks/results/diagnostics/mid_layouts.py
"""
import pathlib
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

from benchmarks.gpu import EventTimer, cuda_handler  # noqa: E402
from benchmarks.ops import inputs_beyond_l2  # noqa: E402
from handlers.cuda import reductions as R  # noqa: E402

REPS, CALLS = 10, 10
WAYS = ("mid", "mid/256", "mid/128", "mid/64", "gen", "I,A", "A,I")
#: (shape, axes): short columns first, then the conv bias gradient's long ones
CASES = [((127, 4096, 2, 4), (0, 2, 3)), ((1000, 4096, 4), (0, 2)), ((8, 4096, 4, 4), (0, 2, 3)),
         ((256, 512, 2, 2), (0, 2, 3)), ((64, 256, 7, 7), (0, 2, 3)),
         ((32, 1024, 16), (0, 2)), ((64, 128, 32, 32), (0, 2, 3)),
         ((256, 64, 56, 56), (0, 2, 3))]


def forced(how):
    """``reductions.plan`` with mid layouts planned ``how``."""
    tree = R.plan

    def plan(shape, axes, aligned, width, family, sms, sm_threads, div=1, kind=0, suffix="",
             blocks_per_sm=None):
        form, dims = R.layout(shape, axes)
        if form != "mid" or family != "sum" or suffix:
            return tree(shape, axes, aligned, width, family, sms, sm_threads, div, kind, suffix,
                        blocks_per_sm)
        if how.startswith("mid"):
            got = R.plan_mid(*dims, aligned, width, sms, sm_threads, div, suffix,
                             blocks_per_sm)
            if got is None or how == "mid":
                return got
            return got._replace(launch=got.launch._replace(block=int(how[4:])))
        return R.plan_gen(dims, (0, 2), aligned, width, family, sms, sm_threads, div,
                          kind, suffix, blocks_per_sm)
    return plan


def two_passes(h, how, x, dims, out):
    """A call that sums (A, M, I) view ``x`` over A and I into ``out`` (M,)
    in two ``sum_t`` calls, in the order ``how`` ("I,A" or "A,I")."""
    A, M, inner = dims
    if how == "I,A":
        first, mid_shape, second = (A * M, inner), (A, M), 0
    else:
        first, mid_shape, second = (A, M * inner), (M, inner), 1
    src = h.reshape_t(x, first)
    tmp = h.allocate((first[0] if how == "I,A" else first[1],))
    tmp2 = h.reshape_t(tmp, mid_shape)
    flat = h.reshape_t(out, (M,))
    axis1 = 1 if how == "I,A" else 0

    def call():
        h.sum_t(src, axis1, tmp)
        h.sum_t(tmp2, second, flat)
    return call


def main():
    probe = cuda_handler("mid_layouts", np.float32, what="tool")
    if probe is None:
        return
    probe.close()
    import torch
    tree = R.plan
    rng = np.random.default_rng(0)
    data = {case: rng.standard_normal(case[0]).astype(np.float32) for case in CASES}
    refs = {case: data[case].astype(np.float64).sum(axis=case[1]) for case in CASES}
    rows = {case: {} for case in CASES}
    for how in WAYS:
        R.plan = forced(how) if "," not in how else tree
        h = cuda_handler("mid_layouts", np.float32, what="tool")
        if h is None:
            return
        try:
            timer = EventTimer("pycuda", h.stream)
            for case in CASES:
                shape, axes = case
                copies = inputs_beyond_l2(data[case].nbytes)
                xs = [h.create_from_numpy(data[case]) for _ in range(copies)]
                out = h.allocate(refs[case].shape)
                dims = R.layout(shape, axes)[1]
                if "," not in how:
                    calls = [lambda x=x: h.sum_t(x, axes, out) for x in xs]
                else:
                    calls = [two_passes(h, how, x, dims, out) for x in xs]
                ms = timer.time(lambda i: calls[i % copies](), reps=REPS, warmup=2,
                                inner=CALLS)
                got = h.get_numpy_copy(out).astype(np.float64)
                err = float(np.abs(got - refs[case]).max() / np.abs(refs[case]).max())
                plan = h._sum_plans.get((shape, axes, True))
                kernel = plan.launch.kernel if "," not in how and plan else how
                rows[case][how] = (ms * 1e3, err, kernel)
        finally:
            h.close()
            R.plan = tree
    ttimer = EventTimer("torch", module=torch)
    for case in CASES:
        shape, axes = case
        copies = inputs_beyond_l2(data[case].nbytes)
        ts = [torch.from_numpy(data[case]).cuda() for _ in range(copies)]
        rows[case]["torch"] = (ttimer.time(lambda i: ts[i % copies].sum(dim=axes), reps=REPS,
                                           warmup=2, inner=CALLS) * 1e3, 0.0, "torch.sum")
    print(f"sum over A and I of (A, M, I), float32, us per call (median of {REPS} samples "
          f"of {CALLS} calls, inputs from DRAM); max error against float64 relative to the "
          f"largest result")
    print(f"{'shape':22s} {'axes':10s} {'(A, M, I)':18s} " + "  ".join(
        f"{h:>22s}" for h in WAYS + ("torch",)))
    for case in CASES:
        shape, axes = case
        dims = R.layout(shape, axes)[1]
        cells = []
        for how in WAYS + ("torch",):
            us, err, kernel = rows[case][how]
            cells.append(f"{us:8.2f} {kernel[:13]:13s}" + ("" if err < 1e-5 else " BAD"))
        print(f"{str(shape):22s} {str(axes):10s} {str(dims):18s} " + "  ".join(cells))


if __name__ == "__main__":
    main()
