#!/usr/bin/env bash
# The float32 attention kernels' A/B (f32_attention.patch, written
# 2026-11-28, fifth session, compiled with nvcc 13 for sm_90 but never run
# on a GPU): the patched tree's attention and transformer tests on the GPU
# first (they compare against float64 NumPy; the patch sends float32
# attention with head sizes 32 and 64 to the new kernels), then the
# attention rows of both trees beside PyTorch's SDPA, in one device call
# from the project root, logs under $OUT.  Prepare on the dev machine:
#     bash .ci/gpu-snapshot HEAD snapA && cp -r snapA snapB
#     git -C snapB apply "$PWD/benchmarks/results/diagnostics/f32_attention.patch"
# then run with carry [".gpu", "snapA", "snapB"]:
#     bash benchmarks/results/diagnostics/f32_attention_ab.sh
# About 4 minutes.  If the tests fail, the timings of snapB mean nothing.
set -u
source .gpu/setup.sh
D=benchmarks/results/diagnostics
export WARM="python3 -m pytest -q -p no:cacheprovider tests/test_attention.py \
tests/test_transformer.py -k 'pycuda-f32'"
timeout 420 bash .ci/gpu-ab $OUT/f32attn snapA snapB 2 python3 $D/attention_ab.py f32
unset WARM
tail -n 3 $OUT/f32attn/snapB-warm.log
grep -h "ours\|efficient\|check" $OUT/f32attn/snap*-[12].log
