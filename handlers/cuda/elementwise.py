"""PyCudaHandler's elementwise ops, fused ops, optimizers and layout copies.

Functions of a PyCudaHandler ``h``, which takes them as its hooks (its class
body names them).  Each launches grid-stride kernels of ``kernels/`` through
``h._launch`` (over a number of elements) or ``h._run`` (a grid of its own),
on the stream group's stream.
"""
import math

import numpy as np

from .. import dtypes
from . import fused_source, kernel_loader
from .context import enter as _enter
from .launch import BLOCK as _BLOCK


def axpby(h, alpha, x, beta, y):
    """y = alpha * x + beta * y; either scalar a number or a device scalar."""
    if type(alpha) is float and type(beta) is float:
        h._launch("axpby", y.size, alpha, x.gpudata, beta, y.gpudata, y.size)
        return
    # Device scalars: pass their address, and 0 as the (unused) value.
    ap, alpha = (0, alpha) if type(alpha) is float else (alpha.gpudata, 0.0)
    bp, beta = (0, beta) if type(beta) is float else (beta.gpudata, 0.0)
    h._launch("axpby_dev", y.size, ap, alpha, x.gpudata, bp, beta, y.gpudata, y.size)


def adam_update(h, g, lr, beta1, beta2, eps, weight_decay, step, m, v, p, decoupled, gate):
    """adam_update's hook: one grid-stride kernel, its last block advancing ``step``."""
    _enter()
    n = p.size
    # A device scalar lr or gate: its address, and 0 as the (unused) value.
    lr_p, lr = (0, lr) if type(lr) is float else (lr.gpudata, 0.0)
    gate_p, gate = (0, gate) if type(gate) is float else (gate.gpudata, 0.0)
    arrays = [x.gpudata if n else 0 for x in (m, v, p, g)]   # empty arrays have no memory
    # At least one block even for n == 0: the kernel's last block advances
    # step.  It counts finished blocks in this stream's counter (kernels
    # leave the counters zero), so launches on one stream never share it
    # while running.
    h._run(h._k["adam"], h._grid(n), arrays[3], lr_p, lr, beta1, beta2, eps,
           weight_decay, step.gpudata, arrays[0], arrays[1], arrays[2], n,
              int(decoupled), h._slot.counters(1), gate_p, gate)


def scale_finite(h, a, factor, flag):
    """Scale ``a`` by ``factor``; ``flag`` becomes 0 where a value is not finite."""
    _enter()
    factor_p, factor = (0, factor) if type(factor) is float else (factor.gpudata, 0.0)
    h._launch("fill", 1, flag.gpudata, 1.0, 1)   # the kernel only ever stores 0 there
    h._launch("scale_finite", a.size, a.gpudata, factor_p, factor, flag.gpudata, a.size)


def update_loss_scale(h, flag, state, interval, max_scale):
    """The loss scaler's step, on the device (one thread)."""
    _enter()
    # one thread does the work (the kernel returns on the others)
    h._run(h._k["loss_scale"], 1, flag.gpudata, state.gpudata, interval, max_scale)


def cast_t(h, src, dst):
    """Copy ``src`` into ``dst``, converting from the format of ``src``."""
    if src.dtype == h.dtype:
        h._copy_to(src, dst)
    elif dst.size:
        _enter()
        h._launch("cast_from_" + dtypes.short_name(src.dtype), dst.size, src.gpudata,
                  dst.gpudata, dst.size)


def transpose_m(h, a, out):
    """out = a.T, in 32x32 tiles."""
    rows, cols = a.shape
    tiles = -(-rows // 32) * -(-cols // 32)
    if tiles:
        _enter()
        h._run(h._k["transpose"], min(tiles, h._max_blocks), a.gpudata, out.gpudata,
               rows, cols)


def permute_t(h, a, axes, out):
    """out = a's axes reordered: one gather kernel over out's elements, out
    read as 4 axes (leading ones of extent 1) with a's stride for each; where
    the last axis stays last, in vector units of up to 16 bytes (layout.cu)."""
    n = out.size
    if not n:
        return
    strides = [math.prod(a.shape[i + 1:]) for i in range(a.ndim)]
    pad = 4 - a.ndim
    extents = (1,) * pad + tuple(out.shape)
    steps = (0,) * pad + tuple(strides[i] for i in axes)
    size = h.dtype.itemsize
    unit = size
    if axes[-1] == a.ndim - 1:
        row = a.shape[-1] * size
        unit = next(u for u in (16, 8, 4, size)
                    if row % u == 0 and int(a.gpudata) % u == 0 and int(out.gpudata) % u == 0)
    per = unit // size if unit > size else 1
    if per > 1:   # every stride but the last is a multiple of the last extent
        extents = extents[:3] + (extents[3] // per,)
        steps = tuple(s // per for s in steps[:3]) + (1,)
        n //= per
    _enter()
    h._run(h._k["permute"], h._grid(n), a.gpudata, out.gpudata, n, *extents, *steps, unit)


def cut(h, whole, first, second, axis, into):
    """concat_t (``into``) or split_t: each piece is a block of columns of
    the (outer, length * inner) view of the whole, copied by copy2d."""
    _enter()
    outer = math.prod(whole.shape[:axis])
    inner = math.prod(whole.shape[axis + 1:])
    wa, wb = first.shape[axis] * inner, second.shape[axis] * inner
    for piece, width, at in ((first, wa, 0), (second, wb, wa)):
        if into:   # piece -> whole
            h._launch("copy2d", outer * width, piece.gpudata, whole.gpudata, outer, width,
                      width, 0, wa + wb, at)
        else:      # whole -> piece
            h._launch("copy2d", outer * width, whole.gpudata, piece.gpudata, outer, width,
                      wa + wb, at, width, 0)


def concat_t(h, a, b, axis, out):
    """Join ``a`` and ``b`` along ``axis`` into ``out``."""
    h._cut(out, a, b, axis, True)


def split_t(h, a, axis, out_a, out_b):
    """Split ``a`` along ``axis`` into ``out_a`` and ``out_b``."""
    h._cut(a, out_a, out_b, axis, False)


def elementwise(h, op, *args):
    """A table row's elementwise kernel over its output's elements (the ops of
    ``one_call.OPS`` reach this only when the one-call path declined)."""
    n = args[op.out].size
    h._launch(op.kernel, n, *[a if type(a) is float else a.gpudata for a in args], n)


def fused(h, op, *args):
    """Run fused op ``op`` on checked arguments."""
    grid, block, values, kernel = h._fused_arguments(op, args)
    if grid:
        sums = _sum_arguments(h, op, grid, values[-1]) if op.sums else ()
        h._run(kernel, grid, *values, *sums, block=block)


def _sum_arguments(h, op, grid, cols):
    """The last kernel arguments of a row kernel with summed (``:row``)
    outputs: this stream's workspace for the blocks' partial rows, its
    counters and the group size (``fused_source.sum_groups``); none
    without.  Taken at each launch, never kept: a capture gives the slot
    back its own scratch when it ends (the graph keeps what it grew), so an
    address kept by a bound call could outlive its memory.  Called holding
    the stream's lock (as the work hooks are): Scratch grows unlocked."""
    if not op.sums:
        return ()
    group, counters = fused_source.sum_groups(grid)
    nbytes = grid * cols * fused_source.sum_bytes(op, h.dtype)
    ws = h._slot.workspace(nbytes) if nbytes else 0   # no column: nothing is written
    return ws, h._slot.counters(counters), group


def _loaded(h, op, key, name, bound, formats=None):
    """The kernel of fused op ``op`` kept under ``key`` in h._k: generated,
    compiled and loaded at its first use (``formats``: the arrays of another
    format, ``fused_source.array_formats``)."""
    kernel = h._k.get(key)
    if kernel is None:
        kernel = h._k[key] = kernel_loader.source_function(
            fused_source.kernel_source(op, h.dtype, bound, formats), name,
            fused_source.kernel_format(op, h.dtype))
    return kernel


def fused_arguments(h, op, args):
    """(grid, block, kernel arguments, kernel) of fused op ``op`` on the
    checked ``args``; grid 0 (and kernel None) when there is nothing to
    compute.  An elementwise op's kernel strides over the elements
    (``h._grid``); a row kernel (``op.row_wise``) over the rows of its full
    arrays, on the grid and block of ``fused_source.plan_rows``, the kernel
    of the strategy they give (``fused_source.strategy``; one block at least
    with summed outputs, which are zeros over no rows; their workspace
    arguments follow, from ``_sum_arguments`` at each launch).  The source is
    generated, compiled and loaded at the first call that computes (once per
    process; pycuda's disk cache skips nvcc in later processes), and each
    kernel kept under (op, strategy) in _k."""
    formats = fused_source.array_formats(op, h.dtype, args)
    name = fused_source.kernel_name(op, h.dtype, formats)
    # A kernel per combination of formats: the handler's own keeps the plain key.
    special = (tuple((p, str(d)) for p, d in formats.items()),) if formats else ()
    if op.row_wise:
        full = args[op.params.index(op.full)]
        cols = full.shape[-1]
        rows = math.prod(full.shape[:-1])
        held = fused_source.held_elements(op, h.dtype)
        lane = fused_source.lane_elements(op, h.dtype)
        block = fused_source.row_block(cols, held, lane)
        sizes, bound = (rows, cols), fused_source.ROW_BLOCK
        way = fused_source.STRATEGIES[fused_source.strategy(cols, held, block, lane)]
        key, name = (op, way) + special, f"{name}_{way}"
        per_sm = None
        if op.sums and rows:   # the grid is the resident blocks: the kernel's occupancy
            per_sm = h._resident(_loaded(h, op, key, name, bound, formats), block)
        grid, block = fused_source.plan_rows(
            rows, cols, held, h._sms, h._sm_threads, fused_source.sum_bytes(op, h.dtype),
            h._l2_bytes, per_sm, fused_source.trip_rows(op, h.dtype), lane,
            fused_source.stream_batch(op, h.dtype))
    else:
        out = args[op.row.out]
        n = out.size
        grid, block = (h._grid(n) if n else 0), _BLOCK
        sizes, bound = (n, out.shape[-1] if out.shape else 1), _BLOCK
        key = (op,) + special if special else op
    kernel = _loaded(h, op, key, name, bound, formats) if grid else None
    values = []
    for p, a in zip(op.params, args):
        if p not in op.scalars:
            values.append(a.gpudata)
        elif type(a) is float:
            values += (0, a)                # a number: no address
        else:
            values += (a.gpudata, 0.0)      # a device scalar, read by the kernel
    if op.row_wise:
        # An empty array has no memory (gpudata None): a row kernel over
        # rows of 0 elements reads none of it, so any address does.
        values = [0 if v is None else v for v in values]
    return grid, block, (*values, *sizes), kernel


def bind_fused(h, op, args, kwargs):
    """A call of fused op ``op`` with its checks and arguments done once."""
    # The checks and the argument list once; each call is then a launch,
    # or, while a capture records, the _fused hook that it shadows.
    checked = op._checks(h, *args, **kwargs)
    grid, block, values, kernel = h._fused_arguments(op, checked)
    # Once the handler is closed, a call goes to the _fused hook, whose
    # stand-in raises (handlers.closed), as the unbound op would.
    capturing, closed = h._capture_box, h._closed_box
    if not grid:
        def nothing():
            if closed[0]:
                h._fused(op, *checked)
        return nothing
    launch = kernel_loader.launch_function()
    if op.sums:
        slot, cols = h._slot, values[-1]

        def call_summing():
            if capturing[0] is None and not closed[0]:
                with slot.lock:   # the stream's workspace and counters, as the hooks
                    launch(kernel.handle, slot.handle, grid, block, kernel.fmt, *values,
                           *_sum_arguments(h, op, grid, cols))
            else:
                h._fused(op, *checked)
        return call_summing

    def call():
        if capturing[0] is None and not closed[0]:
            launch(kernel.handle, h._slot.handle, grid, block, kernel.fmt, *values)
        else:
            h._fused(op, *checked)
    return call


def broadcast_t(h, a, axis, out):
    """Repeat ``a`` along ``axis`` of ``out``."""
    s = out.shape
    outer = int(np.prod(s[:axis], dtype=np.int64))
    inner = int(np.prod(s[axis + 1:], dtype=np.int64))
    h._launch("broadcast", out.size, a.gpudata, out.gpudata, outer, s[axis], inner)


def mv(h, name, m, v, out, orientation):
    """A matrix-vector elementwise op (``name``) with ``v`` along rows (0) or columns."""
    side = "row" if orientation == 0 else "col"
    rows, cols = m.shape
    h._launch(f"mv_{name}_{side}", out.size, m.gpudata, v.gpudata, out.gpudata,
              rows, cols)
