#!/usr/bin/env bash
# stream_batch.patch on a GPU (written 2026-11-28, ninth session; CPU tests
# and nvcc 13 compiles only: LayerNorm's backward streamed kernel 64
# registers in float32 and float64, 59 in bfloat16, no spill), in one
# device call from the project root, logs under $OUT: the patch's GPU tests
# of the fused reductions (its batches of streamed rows: (500, 20001) and
# the like, every handler's result against float64), then an A/B of
# ln_split.py over rows of 50257 and 20001 (HEAD in snapA, the patch in
# snapB), then the reductions suite's fused rows alone in both trees.
# What it tests: a block streaming rows with summed outputs takes them
# three at a time (two in float64), adds the three rows' terms of each of
# its columns in registers and reads and writes its partial row once per
# batch, where it did once per row (fused_terms-NVIDIA-H200.log: over
# 4096 x 50257 LayerNorm's backward took 3679 us, dx alone 1062, the
# summed outputs alone 3173; torch.compile's 1602 in the last run).
# Prepare on the dev machine (snapshots are repositories of their own):
#     bash .ci/gpu-snapshot HEAD snapA && cp -r snapA snapB
#     git -C snapB apply "$PWD/benchmarks/results/diagnostics/stream_batch.patch"
#     rm -rf snapA/.git snapB/.git snapA/benchmarks/results/runs snapB/benchmarks/results/runs
# then run with carry [".gpu", "snapA", "snapB"]:
#     bash benchmarks/results/diagnostics/pending_stream_batch.sh
# About 6 minutes on a fresh machine.  If snapB's tests pass and its
# LayerNorm backward over 4096 x 50257 is faster, land the patch, then the
# whole suite and every suite.
set -u
source .gpu/setup.sh
(cd snapB && python3 setup.py build_ext --inplace -q > /dev/null 2>&1 && bash .ci/gpu-warm \
    && timeout 200 python3 -m pytest -q -p no:cacheprovider -k pycuda \
        tests/test_fused_reduce.py > "$OUT/fused_reduce_tests.log" 2>&1
 echo "fused reduction tests (snapB): rc=$? $(tail -n 1 "$OUT/fused_reduce_tests.log")")
restore() {   # a tree that a timeout left at .ci/gpu-ab's path goes home
    [ -e snap-ab ] || return 0
    for d in snapA snapB; do [ -e "$d" ] || { mv snap-ab "$d"; return 0; }; done
}
timeout 170 bash .ci/gpu-ab "$OUT/ln" snapA snapB 1 \
    python3 benchmarks/results/diagnostics/ln_split.py \
    --shapes 4096x50257,1024x50257,500x20001 --dtypes float32,bfloat16
restore
timeout 120 bash .ci/gpu-ab "$OUT/rows" snapA snapB 1 \
    python3 -m benchmarks reductions --sections fused --no-compile
restore
for d in ln rows; do
    echo "== $d"; grep -h "shape\|(\|LayerNorm\|cross" "$OUT/$d"/snap?-1.log | head -60
done
