#!/usr/bin/env bash
# The A/Bs of the patches written on 2026-11-28 (benchmarks/results/
# diagnostics/README.md: half_cols_blocks, gen_families,
# stream_sums_prefetch), in one device call from the project root, logs
# under $OUT.  Prepare on the dev machine first (snapshots are repositories
# of their own):
#     bash .ci/gpu-snapshot HEAD snapA && cp -r snapA snapB
#     for p in half_cols_blocks gen_families stream_sums_prefetch; do
#         git -C snapB apply ../benchmarks/results/diagnostics/$p.patch; done
# then run with carry [".gpu", "snapA", "snapB"]:
#     bash benchmarks/results/diagnostics/pending_ab.sh
# About 8 minutes: the first timed command of each tree compiles its
# kernels, which WARM does once, untimed (its tests check the patched
# kernels on the GPU too).
set -u
source .gpu/setup.sh
D=benchmarks/results/diagnostics
# Warm with the fused-rows tests alone: the whole two files took 157 s a
# tree on 2026-11-28 and left the A/B no time.
export WARM="python3 -m pytest -q -x -p no:cacheprovider tests/test_fused_reduce.py \
-k 'pycuda and not bf16 and not f16 and (softmax or cross_entropy or layer_norm)'"
timeout 330 bash .ci/gpu-ab $OUT/fused snapA snapB 1 \
    python3 -m benchmarks reductions --sections fused --no-compile
unset WARM
(cd snapB && timeout 150 python3 $D/middle_axis_gen.py > $OUT/middle_axis_gen.log 2>&1
 echo "middle_axis_gen rc=$?")
timeout 200 bash .ci/gpu-ab $OUT/half snapA snapB 1 python3 -m benchmarks half --quick --peers none
tail -n 30 $OUT/middle_axis_gen.log
grep -h "sum_t\|LayerNorm backward" $OUT/fused/*.log $OUT/half/*.log | head -40
