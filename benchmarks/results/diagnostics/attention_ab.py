"""Attention forward and backward alone, ours beside PyTorch's SDPA
backends, on the gpt suite's shape (``benchmarks/gpt.py``'s
``attention_rows``; none of the suite's compiled peers), in each precision
asked (``f32``, ``bf16``; f32 without one), for A/Bs of the attention
kernels (``handlers/cuda/kernels/attention.cu``): ``f32_attention.patch``
and ``f32_simt.patch`` in float32, ``tc_attention.patch`` in bf16.  With
``attention_graphed.patch`` in a tree, its rows include both sides
replayed from graphs.

Run on a GPU machine from a tree's root: ``python
benchmarks/results/diagnostics/attention_ab.py [f32] [bf16]``;
``f32_attention_ab.sh`` and ``pending_gpu.sh`` run A/Bs in one device call.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from benchmarks.gpt import CFG, attention_rows  # noqa: E402
from benchmarks.gpu import optional_peers  # noqa: E402
from benchmarks.train import handler_or_skip  # noqa: E402


def main(argv=None):
    precisions = (argv if argv is not None else sys.argv[1:]) or ["f32"]
    h, timer = handler_or_skip("gpt", "pycuda")
    if h is None:
        return 0
    torch = optional_peers().get("torch")
    results = {"checks": []}
    for precision in precisions:
        attention_rows(h, timer, torch, CFG, 10, results, precision)
    for check in results["checks"]:
        print(check)
    return 0 if all(c["ok"] for c in results["checks"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
