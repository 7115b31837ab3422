#!/usr/bin/env bash
# The summed rows' A/Bs pending after 2026-11-28's eighth session
# (benchmarks/results/diagnostics/README.md, its list for the next GPU
# session), in one device call from the project root, logs under $OUT:
# the grid sweep of summed_rows_grid.py (the bias-and-ReLU backward,
# LayerNorm's backward and its parameters' sums alone, bfloat16, over the
# MLP's 8192 x 2048 and the GPT step's 8192 x 512) in HEAD (snapA) against
#   snapB: lane16.patch, summed rows in a half format two packets a lane:
#          rows of up to 512 columns a warp each, 8 a block of 256 (a
#          block of 64 threads a row before: under 6 warps a
#          multiprocessor, and a 64-thread finishing block);
#   snapC: finish_u32.patch, the partial rows' combine 32 loads a thread
#          in flight, not 16 (the finishing block of 64 threads read them
#          at about 8 KB/us: summed_rows_grid_bf16_813fe6b-NVIDIA-H200.log).
# (half_trip.patch, two rows a trip, is left out: ln_split-NVIDIA-H200.log
# had the parameters' sums slower with it.)
# snapA runs twice (once in each A/B), which also gives its spread.
# Prepare on the dev machine first (snapshots are repositories of their
# own; both patches' CPU tests and nvcc compiles pass on HEAD):
#     bash .ci/gpu-snapshot HEAD snapA && cp -r snapA snapB && cp -r snapA snapC
#     git -C snapB apply "$PWD/benchmarks/results/diagnostics/lane16.patch"
#     git -C snapC apply "$PWD/benchmarks/results/diagnostics/finish_u32.patch"
#     rm -rf snapA/.git snapB/.git snapC/.git
# then run with carry [".gpu", "snapA", "snapB", "snapC"]:
#     bash benchmarks/results/diagnostics/pending_ab.sh
# About 7 minutes on a fresh machine (the kernel cache keys binaries
# without their folder, so each tree compiles only what differs; the
# warm-up's binaries are the handlers' since c61a23a); every variant's
# outputs are checked against float64.  Whatever wins lands with the whole
# suite and every suite rerun.
set -u
source .gpu/setup.sh
shapes=8192x2048,8192x512
restore() {   # a tree that a timeout left at .ci/gpu-ab's path goes home
    [ -e snap-ab ] || return 0
    for d in snapA snapB snapC; do [ -e "$d" ] || { mv snap-ab "$d"; return 0; }; done
}
timeout 280 bash .ci/gpu-ab $OUT/lane snapA snapB 1 \
    python3 benchmarks/results/diagnostics/summed_rows_grid.py --dtype bfloat16 --shapes $shapes
restore
timeout 280 bash .ci/gpu-ab $OUT/finish snapA snapC 1 \
    python3 benchmarks/results/diagnostics/summed_rows_grid.py --dtype bfloat16 --shapes $shapes
restore
for d in lane finish; do
    echo "== $d"; grep -h "planned grid\|^ *[0-9]" $OUT/$d/snap?-1.log | head -90
done
