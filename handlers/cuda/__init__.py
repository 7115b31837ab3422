"""PyCudaHandler and what it stands on: the handler (``handler``), the
device's primary context (``context``), host-device transfers (``transfer``),
cuBLAS (``blas``), CUDA graphs (``graph``), kernel compilation and loading
(``kernel_loader``), the C extension ``_launch`` through which every kernel
launches, its one-call fast path (``one_call``), and the CUDA sources
(``kernels/``).  Importing this package needs no pycuda; constructing the
handler does.
"""
