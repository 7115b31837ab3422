"""The float32 attention forward and backward alone, ours beside PyTorch's
SDPA backends, on the gpt suite's shape (``benchmarks/gpt.py``'s
``attention_rows``, float32 only, none of the suite's compiled peers), for
the A/B of ``f32_attention.patch`` (float32 on tf32 tensor cores with each
product split in three, in ``handlers/cuda/kernels/attention.cu``) against
main's composed float32 attention.

Run on a GPU machine from a tree's root: ``python
benchmarks/results/diagnostics/f32_attention_ab.py``; ``f32_attention_ab.sh``
runs the A/B in one device call.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from benchmarks.gpt import CFG, attention_rows  # noqa: E402
from benchmarks.gpu import optional_peers  # noqa: E402
from benchmarks.train import handler_or_skip  # noqa: E402


def main():
    h, timer = handler_or_skip("gpt", "pycuda")
    if h is None:
        return 0
    torch = optional_peers().get("torch")
    results = {"checks": []}
    attention_rows(h, timer, torch, CFG, 10, results, "f32")
    for check in results["checks"]:
        print(check)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
