"""``python -m benchmarks sumtune``: sweep the chunking knobs of ``sum_t``.

For each ``sum_t`` benchmark case, times the plan that each setting of
``handlers.cuda.reductions.plan_sum``'s knobs (``row_warps``, ``col_split``,
``col_blocks``) produces, in TB/s and as a fraction of the copy bandwidth, so
one GPU run shows which defaults to pick.  The handler's defaults are marked.
Then the same for the one-kernel sum over a leading and a trailing run of
axes (the conv bias gradient, ``reductions.plan_mid``'s ``blocks_per_sm``), with the
host's time to issue one call beside it: a row whose device time per call is
below the host's is host-bound, and no kernel tuning helps it.

Last, what bounds the bias gradient at (64, 128, 32, 32): the one-kernel sum,
a device-to-device copy of the same bytes and PyTorch's full ``sum()`` are
timed at five batch sizes, and each is fitted as a fixed cost per call plus
bytes over a bandwidth.  A kernel that reads the input at the copy's
bandwidth with the copy's fixed cost gives the best fraction of copy one can
expect at that size.
"""
import itertools
import time

import numpy as np

from benchmarks.common import suite_parser
from benchmarks.gpu import EventTimer, cuda_handler
from benchmarks.ops import LOOP, SUM_CASES, copy_bandwidth
from handlers.cuda import reductions

F32 = np.float32
DEFAULTS = dict(row_warps=32, col_split=2, col_blocks=4)
GRID = dict(row_warps=[16, 32, 64, 128], col_split=[1, 2, 4, 8], col_blocks=[2, 4, 8, 16])
#: the one-kernel sums over a leading and a trailing run: (shape, axes)
MID_CASES = [((64, 128, 32, 32), (0, 2, 3)), ((256, 64, 56, 56), (0, 2, 3)),
             ((64, 512, 7, 7), (0, 2, 3))]
MID_DEFAULT, MID_GRID = 1, [1, 2, 4, 8]


def main(argv=None):
    suite_parser("sumtune", __doc__, save=False).parse_args(argv)
    h = cuda_handler("sumtune", F32)
    if h is None:
        return 0
    timer = EventTimer("pycuda", h.stream)
    copy_bw = copy_bandwidth(h, 1 << 25, timer)
    rng = np.random.default_rng(0)
    print(f"copy {copy_bw / 1e12:.3f} TB/s")
    for shape, axis, target in SUM_CASES:
        host = rng.standard_normal(shape).astype(F32)
        # Two inputs, alternated as in the ops suite: a case that fits in L2
        # would otherwise be timed from the cache.
        xs = [h.create_from_numpy(host), h.create_from_numpy(host)]
        x = xs[0]
        rshape = shape[:axis] + shape[axis + 1:]
        out = h.allocate(rshape)
        ref = host.sum(axis)
        nbytes = host.nbytes + int(np.prod(rshape)) * 4
        view = reductions.sum_view(shape, axis)
        key = (tuple(shape), axis, int(x.gpudata) % 16 == 0)
        knobs = ["row_warps"] if view[2] == 1 else ["col_split", "col_blocks"]
        results = []
        for values in itertools.product(*(GRID[k] for k in knobs)):
            kw = dict(zip(knobs, values))
            h._sum_plans[key] = reductions.plan_sum(*view, key[2], h._vec, h._sms, **kw)
            h._sum_launches.clear()   # the one-call path keeps the launch it saw first
            h.sum_t(x, axis, out)
            err = np.abs(h.get_numpy_copy(out) - ref).max()
            ms = timer.time(lambda i: h.sum_t(xs[i % 2], axis, out), inner=LOOP)
            bw = nbytes / (ms * 1e-3)
            mark = " (default)" if all(DEFAULTS[k] == v for k, v in kw.items()) else ""
            results.append((bw, kw, mark, err))
        del h._sum_plans[key]
        print(f"\n{shape} axis {axis} (target {target:.0%} of copy):")
        for bw, kw, mark, err in sorted(results, key=lambda r: -r[0]):
            print(f"  {bw / 1e12:6.3f} TB/s {bw / copy_bw:6.1%}  {kw}{mark}  max err {err:.1e}")
    mid(h, timer, copy_bw, rng)
    bound(h, timer, copy_bw, rng)
    return 0


def mid(h, timer, copy_bw, rng, calls=2000):
    """Sweep ``blocks_per_sm`` of the one-kernel sum (``reductions.plan_mid``)."""
    for shape, axes in MID_CASES:
        host = rng.standard_normal(shape).astype(F32)
        xs = [h.create_from_numpy(host), h.create_from_numpy(host)]
        rshape = tuple(n for i, n in enumerate(shape) if i not in axes)
        out = h.allocate(rshape)
        ref = host.astype(np.float64).sum(axes)
        nbytes = host.nbytes + int(np.prod(rshape)) * 4
        key = (tuple(shape), axes, int(xs[0].gpudata) % 16 == 0)
        h.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):          # the host's time to issue a call
            h.sum_t(xs[0], axes, out)
        host_us = (time.perf_counter() - t0) / calls * 1e6
        h.synchronize()
        print(f"\n{shape} over {axes}: host issue {host_us:.1f} us per call")
        for bps in MID_GRID:
            # axes (0, 2, 3): the leading run ends at axis 1, the trailing starts at 2
            h._sum_plans[key] = reductions.plan_mid(shape, 1, 2, key[2], h._vec, h._sms,
                                                    blocks_per_sm=bps)
            h._sum_launches.clear()
            h.sum_t(xs[0], axes, out)
            err = np.abs(h.get_numpy_copy(out) - ref).max() / np.abs(ref).max()
            ms = timer.time(lambda i: h.sum_t(xs[i % 2], axes, out), inner=LOOP)
            bw = nbytes / (ms * 1e-3)
            mark = " (default)" if bps == MID_DEFAULT else ""
            print(f"  {bw / 1e12:6.3f} TB/s {bw / copy_bw:6.1%}  {1e3 * ms:7.1f} us  "
                  f"blocks_per_sm={bps}{mark}  rel err {err:.1e}")
        del h._sum_plans[key]


def _fit(nbytes, us):
    """Least-squares (fixed us, bytes/s) of ``us = fixed + nbytes / rate``."""
    slope, fixed = np.polyfit(np.asarray(nbytes, float), np.asarray(us, float), 1)
    return fixed, 1e6 / slope


def bound(h, timer, copy_bw, rng, batches=(16, 32, 64, 128, 256)):
    """Fixed cost and bandwidth of the bias-gradient sum, a copy and
    PyTorch's full sum over (batch, 128, 32, 32), and the fraction of copy
    they imply for batch 64."""
    from handlers.cuda import kernel_loader
    ext = kernel_loader.require()
    try:
        import torch
        tt = EventTimer("torch", module=torch) if torch.cuda.is_available() else None
    except ImportError:
        torch = tt = None
    # name: (bytes moved per input byte, us per call at each batch size)
    rows = {"sum_t (0, 2, 3)": (1, []), "copy (same bytes)": (2, []),
            "ours axpby (same)": (3, []), "torch x.sum()": (1, [])}
    sizes = []
    for b in batches:
        shape = (b, 128, 32, 32)
        xs = [h.create_from_numpy(rng.standard_normal(shape).astype(F32)) for _ in range(2)]
        out, dst = h.allocate((128,)), h.allocate(shape)
        nb = xs[0].nbytes
        sizes.append(nb)
        rows["sum_t (0, 2, 3)"][1].append(1e3 * timer.time(
            lambda i: h.sum_t(xs[i % 2], (0, 2, 3), out), inner=LOOP))
        rows["copy (same bytes)"][1].append(1e3 * timer.time(
            lambda i: ext.copy_dtod(int(dst.gpudata), int(xs[i % 2].gpudata), nb,
                                    h.stream.handle),
            inner=LOOP))
        # our own elementwise kernel (y = 2x + 0.5y: x and y read, y written)
        # as a second reference: is the fixed cost the sum's, or any kernel's?
        rows["ours axpby (same)"][1].append(1e3 * timer.time(
            lambda i: h.axpby(2.0, xs[i % 2], 0.5, dst), inner=LOOP))
        if tt is not None:
            txs = [torch.randn(shape, device="cuda") for _ in range(2)]
            rows["torch x.sum()"][1].append(1e3 * tt.time(lambda i: txs[i % 2].sum(), inner=LOOP))

    print(f"\nwhat bounds the bias gradient: us per call at batch {list(batches)} of "
          f"(batch, 128, 32, 32), fitted as fixed us + bytes / rate")
    fits = {}
    for name, (factor, us) in rows.items():
        if not us:
            continue
        fits[name] = _fit([factor * n for n in sizes], us)
        print(f"  {name:18s} " + " ".join(f"{u:7.2f}" for u in us)
              + f"   fixed {fits[name][0]:5.2f} us, {fits[name][1] / 1e12:5.3f} TB/s")
    fixed, rate = fits["copy (same bytes)"]
    n64 = 64 * 128 * 32 * 32 * 4
    best = (n64 + 128 * 4) / ((fixed + n64 / rate * 1e6) * 1e-6)
    print(f"  a read of batch 64 at the copy's rate with the copy's fixed cost: "
          f"{(fixed + n64 / rate * 1e6):.2f} us, {best / copy_bw:.1%} of copy")
