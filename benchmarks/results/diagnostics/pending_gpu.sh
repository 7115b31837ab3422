#!/usr/bin/env bash
# The next GPU session's first call (written 2026-11-28, tenth session), from
# the project root, logs under $OUT, about 8 minutes on a fresh machine:
#   1. the float32 attention A/B: main (snapA) against a branch `pending`
#      holding cols_wave2.patch, f32_simt.patch and tidy.patch (snapB), the
#      attention and transformer tests on the GPU first in each tree (WARM: every
#      pycuda float32 case against float64; f32_simt.patch sends float32
#      attention with head sizes 32 and 64 to new SIMT kernels, compiled
#      with nvcc 13 for sm_90 only: no spill, at most 156 registers, 44 KB
#      of shared memory), then f32_attention_ab.py twice in each tree;
#   2. the whole GPU suite in snapB;
#   3. cols_wave.py in snapB as time allows (60 s, about half its cases:
#      its `tree` column is then cols_wave2's rule and must match `wave2`).
# Prepare on the dev machine (the pending commits are the ones that land):
#     git checkout -q -b pending
#     git apply benchmarks/results/diagnostics/cols_wave2.patch
#     git commit -qam "reductions: column chunks in a wave of two blocks a multiprocessor"
#     git apply benchmarks/results/diagnostics/f32_simt.patch
#     git commit -qam "attention: float32 on fused SIMT kernels"
#     git apply benchmarks/results/diagnostics/tidy.patch
#     git commit -qam "fused_source: one default for a lane's elements, one roots list"
#     git checkout -q main
#     bash .ci/gpu-snapshot main snapA && rm -rf snapA/.git snapA/benchmarks/results/runs
#     bash .ci/gpu-snapshot pending snapB
# then run with carry [".gpu", "snapA", "snapB"]:
#     bash benchmarks/results/diagnostics/pending_gpu.sh
# Land: if snapB's WARM tests and suite pass, fast-forward main to pending
# (or, if only the attention tests fail, rebuild pending without
# f32_simt.patch and rerun the suite); then every suite in snapB.
set -u
source .gpu/setup.sh
D=benchmarks/results/diagnostics
restore() {   # a tree that a timeout left at .ci/gpu-ab's path goes home
    [ -e snap-ab ] || return 0
    for d in snapA snapB; do [ -e "$d" ] || { mv snap-ab "$d"; return 0; }; done
}
export WARM="python3 -m pytest -q -p no:cacheprovider tests/test_attention.py \
tests/test_transformer.py -k 'pycuda and f32'"
timeout 260 bash .ci/gpu-ab "$OUT/f32attn" snapA snapB 2 python3 $D/f32_attention_ab.py
restore
unset WARM
tail -n 3 "$OUT/f32attn/snapB-warm.log"
grep -h "ours\|efficient\|check" "$OUT"/f32attn/snap?-[12].log
(cd snapB && source prov.sh && JOBS=15 timeout 260 bash .ci/gpu-suite /tmp/suite \
    > "$OUT/suite_out.txt" 2>&1
 tail -30 "$OUT/suite_out.txt" | tee "$OUT/summary.txt"
 for f in /tmp/suite/*.log; do
     grep -q "^rc=[1-9]" "$f" && ! grep -q "^rc=5" "$f" && cp "$f" "$OUT/"
 done
 timeout 60 python3 $D/cols_wave.py 2>&1 | grep -v "warn" | tee "$OUT/cols_wave.log")
