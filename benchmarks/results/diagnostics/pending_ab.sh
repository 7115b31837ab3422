#!/usr/bin/env bash
# The A/Bs still pending on 2026-11-28 (benchmarks/results/diagnostics/
# README.md, fourth session: the next GPU session's list), in one device
# call from the project root, logs under $OUT: first the upload loop's
# probes on main (stage_copy.py, upload_phases.py), then the patches
# gen_families and stream_sums_prefetch (half_cols_blocks landed in
# 63ce90e).  Prepare on the dev machine first (snapshots are repositories
# of their own; both patches apply to main at e918e36, together, and their
# CPU tests and nvcc compiles pass there):
#     bash .ci/gpu-snapshot HEAD snapA && cp -r snapA snapB
#     for p in gen_families stream_sums_prefetch; do
#         git -C snapB apply "$PWD/benchmarks/results/diagnostics/$p.patch"; done
# then run with carry [".gpu", "snapA", "snapB"]:
#     bash benchmarks/results/diagnostics/pending_ab.sh
# About 8 minutes: the first timed command of each tree compiles its
# kernels, which WARM does once, untimed (its tests check the patched
# kernels on the GPU too).
set -u
source .gpu/setup.sh
D=benchmarks/results/diagnostics
# snapA's build for the probes (gpu-ab builds both trees again, quickly)
(cd snapA && python3 setup.py build_ext --inplace -q > /dev/null 2>&1)
(cd snapA && timeout 200 python3 $D/stage_copy.py > $OUT/stage_copy.log 2>&1
 echo "stage_copy rc=$?"; timeout 120 python3 $D/upload_phases.py > $OUT/upload_phases.log 2>&1
 echo "upload_phases rc=$?")
cat $OUT/stage_copy.log; tail -n 16 $OUT/upload_phases.log
# Warm with the fused-rows tests alone: the whole two files took 157 s a
# tree on 2026-11-28 and left the A/B no time.
export WARM="python3 -m pytest -q -x -p no:cacheprovider tests/test_fused_reduce.py \
-k 'pycuda and not bf16 and not f16 and (softmax or cross_entropy or layer_norm)'"
timeout 330 bash .ci/gpu-ab $OUT/fused snapA snapB 1 \
    python3 -m benchmarks reductions --sections fused --no-compile
unset WARM
(cd snapB && timeout 150 python3 $D/middle_axis_gen.py > $OUT/middle_axis_gen.log 2>&1
 echo "middle_axis_gen rc=$?")
tail -n 30 $OUT/middle_axis_gen.log
grep -h "cross-entropy\|LayerNorm" $OUT/fused/*.log | head -40
