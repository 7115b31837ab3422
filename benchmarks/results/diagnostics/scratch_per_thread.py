"""Host time per NumpyHandler op with per-thread scratch (today) and with the
old scratch shared by every thread (--shared), on 16x16 float32 arrays.

Run from the project root: ``python benchmarks/results/diagnostics/scratch_per_thread.py``.
"""
import sys
import timeit

import numpy as np

sys.path.insert(0, ".")
from handlers import NumpyHandler  # noqa: E402


class _Shared:
    """The pre-fix scratch: one dict for every thread."""

    def __init__(self):
        self.cache = {}


def main():
    shared = "--shared" in sys.argv
    h = NumpyHandler(np.float32)
    if shared:
        h._scratch_local = _Shared()
    rng = np.random.default_rng(0)
    a = h.create_from_numpy(rng.random((16, 16)))
    b = h.create_from_numpy(rng.random((16, 16)))
    o = h.zeros((16, 16))
    ops = [("mult_add_tt", lambda: h.mult_add_tt(a, b, o)),
           ("dot_add_mm", lambda: h.dot_add_mm(a, b, o)),
           ("axpby", lambda: h.axpby(0.5, a, 1.0, o)),
           ("elu", lambda: h.elu(a, o))]
    for name, fn in ops:
        t = min(timeit.repeat(fn, number=20000, repeat=9)) / 20000 * 1e6
        print(f"{'shared' if shared else 'per-thread'} {name:12s} {t:.3f} us")


if __name__ == "__main__":
    main()
