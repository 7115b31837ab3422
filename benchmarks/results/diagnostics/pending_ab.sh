#!/usr/bin/env bash
# The A/B still pending after 2026-11-28's seventh session (benchmarks/results/
# diagnostics/README.md, its list for the next GPU session): the half
# formats' summed rows two a trip (half_trip.patch) against main, in one
# device call from the project root, logs under $OUT.  Prepare on the dev
# machine first (snapshots are repositories of their own; the patch's CPU
# tests and nvcc compiles passed on main at 693221e):
#     bash .ci/gpu-snapshot HEAD snapA && cp -r snapA snapB
#     git -C snapB apply "$PWD/benchmarks/results/diagnostics/half_trip.patch"
# then run with carry [".gpu", "snapA", "snapB"]:
#     bash benchmarks/results/diagnostics/pending_ab.sh
# About 5 minutes on a fresh machine: .ci/gpu-ab runs both trees from one
# path, so the second compiles only the kernels that differ (the first
# took 73-74 s on 2026-11-28); the grid sweep checks every variant's
# outputs against float64.  If the patched rows gain, the half suite's
# bf16 MLP step is the next thing to time (python3 -m benchmarks half).
set -u
source .gpu/setup.sh
timeout 500 bash .ci/gpu-ab $OUT/trip snapA snapB 1 \
    python3 benchmarks/results/diagnostics/summed_rows_grid.py --dtype bfloat16 \
    --shapes 4096x4096,8192x2048,8192x512
grep -h "planned grid\|^ *[0-9]" $OUT/trip/snap?-1.log | head -80
