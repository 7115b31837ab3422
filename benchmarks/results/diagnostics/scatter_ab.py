"""``scatter_add_rows_m`` at the GPT step's size (the token embedding's
gradient: 8192 rows of 512 added into a table of 128, float32 and
bfloat16), replayed from a graph so that the device time is what is timed,
each result checked against NumPy's in-order ``ufunc.at`` (bit for bit, as
tests/test_ops.py does), for the A/B of ``scatter_held.patch`` (a warp
keeps its row's running sum in a register) against main.

Run on a GPU machine from a tree's root: ``python
benchmarks/results/diagnostics/scatter_ab.py``.
"""
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from benchmarks.gpu import EventTimer, our_captured  # noqa: E402
from benchmarks.train import handler_or_skip  # noqa: E402


def main():
    h32, _ = handler_or_skip("scatter", "pycuda")
    if h32 is None:
        return 0
    rng = np.random.default_rng(3)
    n, vocab, d = 8192, 128, 512
    host_a = rng.standard_normal((n, d)).astype(np.float32)
    rows = rng.integers(0, vocab, n)
    ok = True
    for name in ("float32", "bfloat16"):
        h = h32 if name == "float32" else h32.twin(name)
        a = h.create_from_numpy(host_a)
        idx = h.create_from_numpy(rows.astype(np.float32).reshape(n, 1))
        out = h.zeros((vocab, d))
        held = h.get_numpy_copy(a).astype(np.float32)   # a as the handler holds it
        want = np.zeros((vocab, d), np.float32)
        np.add.at(want, rows, held)
        h.scatter_add_rows_m(a, idx, out)
        got = h.get_numpy_copy(out).astype(np.float32)
        exact = np.array_equal(got, want.astype(h.dtype).astype(np.float32))
        ok &= exact
        replay = our_captured(h, lambda i: h.scatter_add_rows_m(a, idx, out))
        ms = EventTimer("pycuda", h.stream).time(replay, reps=20, inner=10)
        print(f"scatter_add_rows_m {n}x{d} into {vocab}x{d} {name}: {ms * 1e3:.1f} us a call "
              f"(replayed from a graph, median of 20 x 10); equal to ufunc.at: {exact}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
