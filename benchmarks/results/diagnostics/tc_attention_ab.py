"""Attention forward and backward alone in the half formats, ours beside
PyTorch's SDPA backends, on the gpt suite's shape (``benchmarks/gpt.py``'s
``attention_rows``; none of the suite's compiled peers), for the A/B of
``tc_attention.patch`` (the half formats' kernels on mma.sync with the
scores in registers) against main's WMMA kernels, which stage every score
block through shared memory.  With ``attention_graphed.patch`` in a tree,
its rows include both sides replayed from graphs.

Run on a GPU machine from a tree's root: ``python
benchmarks/results/diagnostics/tc_attention_ab.py [bf16]``.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from benchmarks.gpt import CFG, attention_rows  # noqa: E402
from benchmarks.gpu import optional_peers  # noqa: E402
from benchmarks.train import handler_or_skip  # noqa: E402


def main(argv=None):
    precisions = (argv if argv is not None else sys.argv[1:]) or ["bf16"]
    h, timer = handler_or_skip("gpt", "pycuda")
    if h is None:
        return 0
    torch = optional_peers().get("torch")
    results = {"checks": []}
    for precision in precisions:
        attention_rows(h, timer, torch, CFG, 10, results, precision)
    return 0 if all(c["ok"] for c in results["checks"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
