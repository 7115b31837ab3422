#!/usr/bin/env bash
# walk.patch on a GPU (its bounds WALK_MOST 64 and WALK_COLS 8 from
# slab_walk-NVIDIA-H200.log, 2026-11-28, ninth session; its GPU tests never
# run yet), in one device call from the project root, logs under $OUT:
# walk.patch's GPU tests (the cases tagged "walk", run with the bounds
# raised), the fused reductions' GPU tests, then slab_warp.py, whose
# fourth rule puts every slab of a reduced axis past THREAD_ROW on *_walk
# beside the tree's rule (now the patch's bounds), the tiles and the warps.
# Prepare on the dev machine (a snapshot is a repository of its own):
#     bash .ci/gpu-snapshot HEAD snapW
#     git -C snapW apply "$PWD/benchmarks/results/diagnostics/walk.patch"
#     rm -rf snapW/.git
# then run with carry [".gpu", "snapW"]:
#     bash benchmarks/results/diagnostics/pending_walk.sh
# About 7 minutes on a fresh machine (reduce.cu and the rest compile first,
# about 85 s).  If the tests pass and the tree's rule matches the walks'
# wins, land the patch, then the whole suite and every suite.
set -u
source .gpu/setup.sh
cd snapW || exit 2
python3 setup.py build_ext --inplace -q > /dev/null 2>&1
bash .ci/gpu-warm
timeout 120 python3 -m pytest -q -p no:cacheprovider -k "walk and pycuda" \
    tests/test_reductions_random.py > $OUT/walk_tests.log 2>&1
echo "walk tests: rc=$? $(tail -n 1 $OUT/walk_tests.log)"
timeout 150 python3 -m pytest -q -p no:cacheprovider -k pycuda tests/test_fused_reduce.py \
    > $OUT/fused_reduce_tests.log 2>&1
echo "fused reduction tests: rc=$? $(tail -n 1 $OUT/fused_reduce_tests.log)"
timeout 300 python3 benchmarks/results/diagnostics/slab_warp.py > $OUT/walk.log 2>&1
echo "slab_warp.py: rc=$?"
grep -v "warning\|constexpr\|^ *\^$\|Remark\|^$" $OUT/walk.log
