#!/usr/bin/env bash
# The measurement still pending after 2026-11-28's eighth session
# (benchmarks/results/diagnostics/README.md, its list for the next GPU
# session), in one device call from the project root, logs under $OUT:
# the half formats' summed rows two a trip (half_trip.patch), the grid
# sweep of summed_rows_grid.py in main (snapA) and patched (snapB), over
# the two shapes of the GPT step's and the MLP's sums (the bias-and-ReLU
# backward, LayerNorm's backward and its parameters' sums alone).  Main's sweep over
# three shapes took 135 s on 2026-11-28 (summed_rows_grid_bf16_813fe6b-NVIDIA-H200.log),
# so its A/B over three ran out the call; two shapes a tree fit.
# Prepare on the dev machine first (snapshots are repositories of their
# own; the patch's CPU tests and nvcc compiles passed on main at f98cc12):
#     bash .ci/gpu-snapshot HEAD snapA && cp -r snapA snapB
#     git -C snapB apply "$PWD/benchmarks/results/diagnostics/half_trip.patch"
#     rm -rf snapA/.git snapB/.git
# then run with carry [".gpu", "snapA", "snapB"]:
#     bash benchmarks/results/diagnostics/pending_ab.sh
# About 7 minutes on a fresh machine (the second tree compiles only the
# kernel files that differ: the kernel cache keys binaries without their
# folder); every variant's outputs are checked against float64.  Whatever
# wins lands with the whole suite and every suite rerun.
set -u
source .gpu/setup.sh
timeout 500 bash .ci/gpu-ab $OUT/trip snapA snapB 1 \
    python3 benchmarks/results/diagnostics/summed_rows_grid.py --dtype bfloat16 \
    --shapes 8192x2048,8192x512
grep -h "planned grid\|^ *[0-9]" $OUT/trip/snap?-1.log | head -80
