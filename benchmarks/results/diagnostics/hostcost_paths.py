"""Host microseconds per call of ops that take PyCudaHandler's Python path
(and two one-call ops, and an eager SGD step), for the code tree given as
argv[1] and labelled argv[2]: run for two trees in turn on one warm machine
to compare them (the log: the tree before this session's issue-37 work,
03697c3, as "old", against 03735a9 as "new", twice).

    python hostcost_paths.py /path/to/old old; python hostcost_paths.py . new
"""
import sys

sys.path.insert(0, sys.argv[1])
import numpy as np  # noqa: E402

from benchmarks.gpu import host_overhead_us  # noqa: E402
from handlers import PyCudaHandler  # noqa: E402

h = PyCudaHandler(np.float32)
r = np.random.default_rng(0)


def A(*s):
    return h.create_from_numpy(r.uniform(0.5, 1.5, s))


m, o, col = A(64, 100), A(64, 100), A(64, 1)
x3, s2 = A(6, 50, 7, 3), A(50, 3)
g, p, mm, vv, st = A(1000), A(1000), A(1000), A(1000), h.zeros((1,))
tall, row = A(3000, 5), A(5)
a, b, c = A(1000), A(1000), A(1000)
ops = {
    "add_tt (one call)": lambda: h.add_tt(a, b, c),
    "axpby (one call)": lambda: h.axpby(0.5, a, 1.0, c),
    "softmax_m": lambda: h.softmax_m(m, o),
    "normalize_rows_m": lambda: h.normalize_rows_m(m, 1e-3, o, col),
    "sum_t (0, 2) in passes": lambda: h.sum_t(x3, (0, 2), s2),
    "max_t axis 0, chunked": lambda: h.max_t(tall, 0, row),
    "adam_update": lambda: h.adam_update(g, 0.0, 0.9, 0.99, 1e-3, 0.0, st, mm, vv, p),
}
for name, fn in ops.items():
    us = host_overhead_us(fn, calls=5000, sync=h.synchronize_all_streams)
    print(f"{sys.argv[2]:4s} {name:26s} {us:6.2f} us")

from layers import SGD, FullyConnected, Sequential, SoftmaxCrossEntropy, Tanh  # noqa: E402

net = Sequential(h, [FullyConnected(64, 64), Tanh(), FullyConnected(64, 10)],
                 SoftmaxCrossEntropy(), seed=0)
opt = SGD(net.parameters, lr=0.01, momentum=0.9)
us = host_overhead_us(opt.step, calls=5000, sync=h.synchronize_all_streams)
print(f"{sys.argv[2]:4s} {'SGD.step (2 axpby)':26s} {us:6.2f} us")
