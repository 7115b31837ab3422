"""PyCudaHandler and what it stands on: the handler (``handler``), its
streams' resources (``resources``), convolution and pooling
(``convolution``), the device's primary context (``context``), host-device
transfers (``transfer``), cuBLAS (``blas``), CUDA graphs and the handler's
capture hooks (``graph``), kernel compilation and loading (``kernel_loader``),
the C extension ``_launch`` through which every kernel launches, its
one-call fast path (``one_call``), and the CUDA sources (``kernels/``).
Importing this package needs no pycuda; constructing the handler does.
"""
