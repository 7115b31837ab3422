#!/usr/bin/env bash
# The A/B of narrow_rows_trip.patch (a half format's `full` row kernels with
# summed outputs on blocks of at most 256 threads compiled under that launch
# bound, two rows a trip; written 2026-11-28, third session, never run on a
# GPU), in one device call from the project root, logs under $OUT.  Prepare
# on the dev machine first (snapshots are repositories of their own):
#     bash .ci/gpu-snapshot HEAD snapA && cp -r snapA snapB
#     git -C snapB apply "$PWD/benchmarks/results/diagnostics/narrow_rows_trip.patch"
# then run with carry [".gpu", "snapA", "snapB"]:
#     bash benchmarks/results/diagnostics/narrow_rows_ab.sh
# First the patched tree's GPU tests of the half formats' fused rows and
# LayerNorm, then, only if they pass, the summed rows' sweep over the GPT's
# narrow rows and the bf16 GPT step (no compiled peers) on each tree.
set -u
source .gpu/setup.sh
D=benchmarks/results/diagnostics
for tree in snapA snapB; do
    (cd $tree && python3 setup.py build_ext --inplace -q > /dev/null 2>&1)
done
(cd snapB && timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_fused_reduce.py \
    tests/test_layers_norm_embed.py -k "pycuda and (bf16 or f16)" > $OUT/tests.log 2>&1;
    echo "tests rc=$?")
tail -n 3 $OUT/tests.log
if ! grep -q " passed" $OUT/tests.log || grep -q "failed\|error" $OUT/tests.log; then
    echo "narrow rows: the tests did not pass; no timing"; exit 1
fi
for tree in snapA snapB; do
    (cd $tree && timeout 100 python3 $D/summed_rows_grid.py --dtype bfloat16 \
        --shapes 8192x512,8192x2048 > $OUT/grid_$tree.log 2>&1; echo "$tree grid rc=$?")
    grep -A3 "planned grid" $OUT/grid_$tree.log | grep -v "one level"
    (cd $tree && timeout 150 python3 -m benchmarks gpt --precision bf16 --peers none \
        > $OUT/gpt_$tree.log 2>&1; echo "$tree gpt rc=$?")
    grep -E "^bf16 " $OUT/gpt_$tree.log | head -2
done
