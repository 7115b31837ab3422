"""Host time per NumpyHandler op with per-thread scratch (today) and with the
old scratch shared by every thread (--shared), on 16x16 float32 arrays."""
import sys, timeit
import numpy as np
sys.path.insert(0, ".")  # run from the project root
from handlers import NumpyHandler, numpy_handler
shared = "--shared" in sys.argv
h = NumpyHandler(np.float32)
if shared:   # the pre-fix behaviour: one scratch dict for every thread
    class Plain:
        def __init__(self): self.cache = {}
    h._scratch_local = Plain()
rng = np.random.default_rng(0)
a = h.create_from_numpy(rng.random((16, 16))); b = h.create_from_numpy(rng.random((16, 16))); o = h.zeros((16, 16))
for name, fn in [("mult_add_tt", lambda: h.mult_add_tt(a, b, o)), ("dot_add_mm", lambda: h.dot_add_mm(a, b, o)),
                 ("axpby", lambda: h.axpby(0.5, a, 1.0, o)), ("elu", lambda: h.elu(a, o))]:
    t = min(timeit.repeat(fn, number=20000, repeat=9)) / 20000 * 1e6
    print(f"{'shared' if shared else 'per-thread'} {name:12s} {t:.3f} us")
