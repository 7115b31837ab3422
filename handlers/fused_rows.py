"""The contract's row ops declared as fused ops: ``softmax_m``,
``normalize_rows_m`` and ``normalize_rows_backward_m`` are each one program,
run by NumpyHandler with NumPy and by PyCudaHandler as one generated row
kernel (``handlers/cuda/fused_source.py``), so the two handlers compute them
from the same text and the GPU plans their rows with the fused-op planner.

The contract's methods check their arguments as always, then issue the
program through the ``_fused`` work hook (``handlers/optable.py`` names it in
their ``call``), so captures, stream groups and DebugHandler see an ordinary
op, under the contract op's own name (errors name it).
"""
from .fused import fused_op

#: softmax_m: exp(m - rowmax) / rowsum, so that large inputs do not overflow.
SOFTMAX = fused_op("softmax_m", inputs="m", outputs="out", body="""
e = exp(m - max(m))
out = e / sum(e)
""")

#: normalize_rows_m: xhat = (x - mean) * rstd, rstd = 1 / sqrt(var + eps),
#: the mean and the biased variance over each row.
NORMALIZE = fused_op("normalize_rows_m", inputs="x #eps", outputs="xhat rstd:col", body="""
d = x - mean(x)
rstd = 1 / sqrt(mean(d * d) + eps)
xhat = d * rstd
""")

#: normalize_rows_backward_m: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
NORMALIZE_BACKWARD = fused_op("normalize_rows_backward_m", inputs="xhat rstd:col g",
                              outputs="dx", body="""
dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
""")
