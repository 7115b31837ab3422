"""bfloat16 4096^3 products in each layout a training step uses: our ``dot_mm`` and
``dot_add_mm`` against ``torch.matmul`` (TFLOP/s, 5 calls between events, median of 15).

A diagnostic (run by hand from the project root on a GPU machine:
``python benchmarks/results/diagnostics/half_gemm_layouts.py``); its output on an H100 at
commit 677cc5f (measured code of 2069ae4) is ``half_gemm_layouts-NVIDIA-H100-80GB-HBM3.log``.
Finding: ``dot_mm`` matches PyTorch in every layout (786-792 against 749-785 TFLOP/s), but the
halves' ``dot_add_mm`` runs at 528-559: it writes the product in float32 and adds it with one
rounding in a second pass, which costs most where bandwidth is lowest.  A lead for the H100's
mixed-precision MLP step at 0.98x PyTorch autocast (``../other_gpus/``), not yet followed.
"""
import ml_dtypes
import numpy as np
import torch

from benchmarks.gpu import EventTimer
from handlers.cuda.handler import PyCudaHandler

h = PyCudaHandler("bfloat16")
t = EventTimer("pycuda", h.stream)
tt = EventTimer("torch", module=torch)
n = 4096
rng = np.random.default_rng(0)
A = [h.create_from_numpy(rng.standard_normal((n, n)).astype(np.float32).astype(ml_dtypes.bfloat16))
     for _ in range(2)]
out = h.allocate((n, n))
TA = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
for ta_, tb_ in ((False, False), (False, True), (True, False)):
    ours = t.time(lambda i: h.dot_mm(A[0], A[1], out, transa=ta_, transb=tb_), reps=15, inner=5)
    add = t.time(lambda i: h.dot_add_mm(A[0], A[1], out, transa=ta_, transb=tb_), reps=15, inner=5)
    x = TA[0].t() if ta_ else TA[0]
    y = TA[1].t() if tb_ else TA[1]
    th = tt.time(lambda i: torch.matmul(x, y), reps=15, inner=5)
    f = 2 * n**3 / 1e9
    print(f"transa={ta_} transb={tb_}: ours dot_mm {f / ours:.0f} TF/s, dot_add_mm "
          f"{f / add:.0f}, torch {f / th:.0f}", flush=True)
