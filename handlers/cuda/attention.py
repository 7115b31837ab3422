"""PyCudaHandler's attention: fused kernels (``kernels/attention.cu``),
where the scores never reach memory, for the half formats (on tensor cores)
and float32 (on the CUDA cores); every other case takes the composed work
of ``handlers.attention`` (batched products and fused row programs), which
stores them.

Functions of a PyCudaHandler ``h``, which takes them as its hooks.
"""
import numpy as np

from .. import attention as composed
from .. import dtypes

#: head sizes the fused kernels are built for
HEAD_SIZES = (32, 64)
#: rows (queries, or keys in the backward's second kernel) a block of each
#: kernel takes: (forward, backward's dq, backward's dk and dv), by format
#: family; float32's backward blocks take 32 rows to keep their staged
#: rows within 48 KB of shared memory
TILES = {"half": (64, 64, 64), "float32": (64, 32, 32)}
#: threads a block: the kernels' one block size
THREADS = 128


def fused(h, *arrays):
    """Whether the fused kernels take these arrays: a half format or
    float32, a head size they are built for, some queries and keys (no empty
    grid), every array 16-byte aligned (they move rows by 16-byte vectors)."""
    q, k = arrays[0], arrays[1]
    return (_tiles(h) is not None and q.shape[-1] in HEAD_SIZES and q.size > 0
            and k.size > 0 and all(int(a.gpudata) % 16 == 0 for a in arrays))


def _tiles(h):
    """``TILES``' entry for ``h``'s format, or None where no fused kernel is."""
    if dtypes.is_half(h.dtype):
        return TILES["half"]
    return TILES["float32"] if h.dtype == np.float32 else None


def forward(h, q, k, v, out, lse, causal, scale):
    """``_attention_forward``: out and the rows' log-sum-exp lse."""
    if not fused(h, q, k, v, out, lse):
        composed.forward(h, q, k, v, out, lse, causal, scale)
        return
    (b, hh, t, d), s = q.shape, k.shape[2]
    n = b * hh
    h._run(h._k[f"attn_fwd_d{d}"], n * -(-t // _tiles(h)[0]), q.gpudata, k.gpudata, v.gpudata,
           out.gpudata, lse.gpudata, n, t, s, int(causal), scale, block=THREADS)


def backward(h, q, k, v, out, lse, dout, dq, dk, dv, causal, scale):
    """``_attention_backward``: dq, then dk and dv, through each row's
    float log-sum-exp and sum(dout * out) in this stream's workspace."""
    if not fused(h, q, k, v, out, lse, dout, dq, dk, dv):
        composed.backward(h, q, k, v, out, lse, dout, dq, dk, dv, causal, scale)
        return
    (b, hh, t, d), s = q.shape, k.shape[2]
    n = b * hh
    _, q_tile, kv_tile = _tiles(h)
    stats = h._slot.workspace(2 * n * t * 4)
    h._run(h._k[f"attn_bwd_q_d{d}"], n * -(-t // q_tile), q.gpudata, k.gpudata, v.gpudata,
           out.gpudata, lse.gpudata, dout.gpudata, dq.gpudata, stats, n, t, s, int(causal),
           scale, block=THREADS)
    h._run(h._k[f"attn_bwd_kv_d{d}"], n * -(-s // kv_tile), q.gpudata, k.gpudata, v.gpudata,
           dout.gpudata, stats, dk.gpudata, dv.gpudata, n, t, s, int(causal), scale,
           block=THREADS)
