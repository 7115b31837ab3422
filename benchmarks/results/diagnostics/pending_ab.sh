#!/usr/bin/env bash
# The A/B still pending after 2026-11-28's fifth session (benchmarks/results/
# diagnostics/README.md, its list for the next GPU session): the fused rows
# with and without stream_sums_prefetch.patch, in one device call from the
# project root, logs under $OUT.  (The upload probes and middle_axis_gen.py
# that this script also ran ran in the fifth session.)  Prepare on the dev
# machine first (snapshots are repositories of their own; the patch's CPU
# tests and nvcc compiles passed on main at e918e36):
#     bash .ci/gpu-snapshot HEAD snapA && cp -r snapA snapB
#     git -C snapB apply "$PWD/benchmarks/results/diagnostics/stream_sums_prefetch.patch"
# then run with carry [".gpu", "snapA", "snapB"]:
#     bash benchmarks/results/diagnostics/pending_ab.sh
# About 6 minutes: the first timed command of each tree compiles its
# kernels, which WARM does once, untimed (its tests check the patched
# kernels on the GPU too).
set -u
source .gpu/setup.sh
# Warm with the fused-rows tests alone: the whole two files took 157 s a
# tree on 2026-11-28 and left the A/B no time.
export WARM="python3 -m pytest -q -x -p no:cacheprovider tests/test_fused_reduce.py \
-k 'pycuda and not bf16 and not f16 and (softmax or cross_entropy or layer_norm)'"
timeout 330 bash .ci/gpu-ab $OUT/fused snapA snapB 1 \
    python3 -m benchmarks reductions --sections fused --no-compile
unset WARM
grep -h "cross-entropy\|LayerNorm" $OUT/fused/*.log | head -40
