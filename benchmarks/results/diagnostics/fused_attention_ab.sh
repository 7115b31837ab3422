#!/usr/bin/env bash
# The A/B of fused_attention.patch (fused attention kernels for the half
# formats, head sizes 32 and 64; written 2026-11-28, never run on a GPU),
# in one device call from the project root, logs under $OUT.  Prepare on
# the dev machine first (snapshots are repositories of their own):
#     bash .ci/gpu-snapshot HEAD snapA && cp -r snapA snapB
#     git -C snapB apply ../benchmarks/results/diagnostics/fused_attention.patch
# then run with carry [".gpu", "snapA", "snapB"]:
#     bash benchmarks/results/diagnostics/fused_attention_ab.sh
# First the patched tree's attention and transformer tests on the GPU
# (tests/test_attention.py's shapes of head size 64 and 32 take the fused
# kernels in bfloat16 and float16; a captured call must equal an eager one
# bit for bit), then, only if they pass, the gpt suite's bf16 step and
# attention alone on each tree, no compiled peers (PyTorch eager and its
# SDPA backends stay), and the bf16 step's breakdown on the patched tree.
set -u
source .gpu/setup.sh
D=benchmarks/results/diagnostics
for tree in snapA snapB; do
    (cd $tree && python3 setup.py build_ext --inplace -q > /dev/null 2>&1)
done
(cd snapB && timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_attention.py \
    tests/test_transformer.py -k "pycuda" > $OUT/tests.log 2>&1; echo "tests rc=$?")
tail -n 3 $OUT/tests.log
if ! grep -q " passed" $OUT/tests.log || grep -q "failed\|error" $OUT/tests.log; then
    echo "fused attention: the tests did not pass; no timing"; exit 1
fi
for tree in snapA snapB; do
    (cd $tree && timeout 150 python3 -m benchmarks gpt --precision bf16 --peers none \
        > $OUT/gpt_$tree.log 2>&1; echo "$tree gpt rc=$?")
    grep -E "^bf16 |attention" $OUT/gpt_$tree.log | grep -v "Warning\|o = torch"
done
(cd snapB && timeout 120 python3 $D/step_breakdown.py --models gpt-bf16 \
    > $OUT/step_breakdown_gpt_fused.log 2>&1; echo "breakdown rc=$?")
grep -E "attention|^eager" $OUT/step_breakdown_gpt_fused.log | cut -c1-60,150-
