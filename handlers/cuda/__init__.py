"""PyCudaHandler and what it stands on.

The handler (``handler``) keeps streams, memory, scratch, graphs and twins, and
runs the launches that each op family plans: products (``products``), sums
and extrema (``reductions``), elementwise, fused, optimizer and layout ops
(``elementwise``), row ops (``rows``), convolution and pooling
(``convolution``), with the launch constants they share (``launch``).
Beside them: its streams' resources (``resources``), the
device's primary context (``context``), host-device transfers
(``transfer``), cuBLAS (``blas``), CUDA graphs and the capture hooks
(``graph``), kernel compilation and loading (``kernel_loader``), the C
extension ``_launch`` through which every kernel launches, its one-call fast
path (``one_call``), and the CUDA sources (``kernels/``).
Importing this package needs no pycuda; constructing the handler does.
"""
