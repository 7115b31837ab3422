"""PyCudaHandler's row ops: indexing by class and embedding rows
(``kernels/rows.cu``).  Softmax and LayerNorm's rows are fused-op programs
(``handlers/fused_rows.py``).

Functions of a PyCudaHandler ``h``, which takes them as its hooks (its class
body names them); they launch through ``h._launch`` and ``h._run``.  Kernels
that stride over rows take a grid that fills the GPU (``h._max_blocks``),
which is much faster for short rows than a block per row.
"""
from .launch import BLOCK

#: scatter_add_rows's warps a multiprocessor (a quarter of its 64): each owns
#: rows of out and reads all of idx, so more owners shorten the in-order work
#: of each warp but repeat the reading of idx
OWNER_WARPS = 16


def index_m_by_v(h, m, v, out):
    """out[i] = m[i, v[i]], NaN where v[i] is no column of m."""
    rows, cols = m.shape
    # With no columns m has no memory (gpudata is None, which the launch
    # refuses); no index is then in [0, 0), so the kernel writes NaN for
    # every row and never reads m: any address does.
    h._launch("index_m_by_v", rows, m.gpudata if m.size else 0, v.gpudata, out.gpudata,
              rows, cols)


def binarize_v(h, v, out):
    """One-hot rows of ``out`` from the class indices ``v``."""
    rows, cols = out.shape
    h._launch("binarize_v", out.size, v.gpudata, out.gpudata, rows, cols)


def gather_rows(h, table, idx, out):
    """out[i] = table[idx[i]] (an embedding lookup)."""
    n, d = out.shape
    # An empty table (vocab 0) has no device pointer; every index is then
    # invalid and the kernel never reads it.
    h._launch("gather_rows", out.size, table.gpudata if table.size else 0, idx.gpudata,
              out.gpudata, n, table.shape[0], d)


def scatter_add_rows(h, a, idx, out):
    """out[idx[i]] += a[i] (an embedding's gradient)."""
    n, d = a.shape
    if n and out.size:   # nothing to add, or no row to add into (every index invalid)
        # A warp per 32 columns and owner of rows (see rows.cu): enough
        # owners for about OWNER_WARPS warps a multiprocessor, at most a row each.
        slices = -(-d // 32)
        owners = max(1, min(out.shape[0], -(-h._sms * OWNER_WARPS // slices)))
        grid = -(-slices * owners * 32 // BLOCK)
        if not h._half:
            h._run(h._k["scatter_add_rows"], grid, a.gpudata, idx.gpudata,
                   out.gpudata, n, out.shape[0], d, owners)
            return
        # The halves add in a float copy of out and round once at the end
        # (as NumPy's float32 ufunc.at on the widened arrays, bit for bit).
        wide = h._slot.workspace(out.size * 4)
        h._launch("widen", out.size, out.gpudata, wide, out.size)
        h._run(h._k["scatter_add_rows_wide"], grid, a.gpudata, idx.gpudata, wide, n,
               out.shape[0], d, owners)
        h._launch("narrow", out.size, wide, 1.0, out.gpudata, out.size)
