#!/usr/bin/env bash
# The next GPU session's first call (written 2026-11-28, eleventh session),
# from the project root, logs under $OUT, about 6 minutes on a fresh machine:
# the half formats' attention A/B, main (snapA) against a branch `pending`
# holding attention_graphed.patch and tc_attention.patch (snapB): the
# attention and transformer tests on the GPU first in each tree (WARM:
# every pycuda bfloat16 and float16 case against float64; tc_attention.patch
# moves the half formats' kernels from WMMA through shared memory to
# mma.sync with the scores in registers, compiled with nvcc 13 for sm_90
# only: no spill, at most 167 registers, 19 KB of shared memory, and
# tc_attention_emulation.py checks its index maps lane by lane), then
# attention_ab.py bf16 twice in each tree (snapB's rows add both sides
# replayed from graphs), each round also scatter_ab.py (scatter_held.patch:
# the GPT's embedding gradient, replayed from a graph, checked bit for bit
# against ufunc.at; 115 us a call in the last GPT breakdown).
# Prepare on the dev machine (the pending commits are the ones that land):
#     git checkout -q -b pending
#     git apply benchmarks/results/diagnostics/attention_graphed.patch
#     git commit -qam "gpt: attention judged on both sides replayed from graphs"
#     git apply benchmarks/results/diagnostics/provenance_gpu.patch
#     git commit -qam "provenance: clocks of the GPU the process uses"
#     git apply benchmarks/results/diagnostics/tc_attention.patch
#     git commit -qam "attention: half formats on mma.sync, scores in registers"
#     git apply benchmarks/results/diagnostics/scatter_held.patch
#     git commit -qam "scatter_add_rows: a warp's running row in a register"
#     git checkout -q main
#     bash .ci/gpu-snapshot main snapA && rm -rf snapA/.git snapA/benchmarks/results/runs
#     bash .ci/gpu-snapshot pending snapB
# Ask `status`; if it lists nvidia-h200-x2, take every call below on it
# (device time counts the machine, not its GPUs: the suites run two at a
# time there, and dp needs it anyway); else on nvidia-h200, the suites one
# list after another with .ci/gpu-bench.
#  1. carry [".gpu", "snapA", "snapB"] (about 5 minutes with the start):
#         bash benchmarks/results/diagnostics/pending_gpu.sh
#  2. carry [".gpu", "snapB"], the whole GPU suite (about 3 minutes on two
#     GPUs, 4.5 on one):
#         source .gpu/setup.sh && cd snapB && source prov.sh && JOBS=24 \
#             timeout 560 bash .ci/gpu-suite /tmp/suite > $OUT/suite_out.txt 2>&1; \
#             tail -5 $OUT/suite_out.txt
#     If it passes, fast-forward main to pending (if only the half attention
#     tests fail, rebuild pending without tc_attention.patch, if only the
#     scatter tests, without scatter_held.patch, and rerun it).
#  3. carry [".gpu", "snapB"], every suite but dp (about 8 minutes on two GPUs):
#         source .gpu/setup.sh && cd snapB && source prov.sh && timeout 590 \
#             bash .ci/gpu-bench-pair $OUT "reductions train" "half conv gpt fusion" \
#             "ops upload mxb streams"
#     (one GPU: .ci/gpu-bench $OUT reductions train half conv, then gpt
#     fusion ops upload mxb streams, in two calls); the runs come back
#     packed in $OUT/bench.tgz.
#  4. carry [".gpu", "snapB"], dp: ... && timeout 400 bash .ci/gpu-bench $OUT dp
#  5. Device time left: half_epilogues.py --quick (about 2-3 minutes).
set -u
source .gpu/setup.sh
D=benchmarks/results/diagnostics
restore() {   # a tree that a timeout left at .ci/gpu-ab's path goes home
    [ -e snap-ab ] || return 0
    for d in snapA snapB; do [ -e "$d" ] || { mv snap-ab "$d"; return 0; }; done
}
export WARM="python3 -m pytest -q -p no:cacheprovider tests/test_attention.py \
tests/test_transformer.py -k 'pycuda and (bf16 or f16)' && python3 -m pytest -q \
-p no:cacheprovider tests/test_ops.py -k 'pycuda and scatter'"
timeout 500 bash .ci/gpu-ab "$OUT/tcattn" snapA snapB 2 \
    bash -c "python3 $D/attention_ab.py bf16; python3 $D/scatter_ab.py"
restore
tail -n 3 "$OUT"/tcattn/snap?-warm.log
grep -h "ours\|flash\|efficient\|cudnn\|check\|scatter" "$OUT"/tcattn/snap?-[12].log
