#!/usr/bin/env bash
# The measurements still pending after 2026-11-28's seventh session
# (benchmarks/results/diagnostics/README.md, its list for the next GPU
# session), in one device call from the project root, logs under $OUT:
#   1. the half formats' summed rows two a trip (half_trip.patch): the grid
#      sweep of summed_rows_grid.py in main (snapA) and patched (snapB);
#   2. a warp a small slab of few columns (slab_warp.patch): its GPU tests
#      (the layout, special-value and argmax cases tagged "slab"), then
#      slab_warp.py's three rules, both in snapB.
# Prepare on the dev machine first (snapshots are repositories of their
# own; both patches' CPU tests and nvcc compiles passed on main at f98cc12,
# and they apply together):
#     bash .ci/gpu-snapshot HEAD snapA && cp -r snapA snapB
#     for p in half_trip slab_warp; do
#         git -C snapB apply "$PWD/benchmarks/results/diagnostics/$p.patch"; done
# then run with carry [".gpu", "snapA", "snapB"]:
#     bash benchmarks/results/diagnostics/pending_ab.sh
# About 7 minutes on a fresh machine: .ci/gpu-ab runs both trees from one
# path, so the second compiles only the kernels that differ (the first
# took 73-74 s on 2026-11-28); every variant's outputs are checked against
# float64.  Whatever wins lands with the whole suite and every suite rerun.
set -u
source .gpu/setup.sh
timeout 330 bash .ci/gpu-ab $OUT/trip snapA snapB 1 \
    python3 benchmarks/results/diagnostics/summed_rows_grid.py --dtype bfloat16 \
    --shapes 4096x4096,8192x2048,8192x512
# snapB from the path .ci/gpu-ab ran it at, so its compiled kernels serve
mv snapB snap-ab
(cd snap-ab && timeout 90 python3 -m pytest -q -p no:cacheprovider -k "slab and pycuda" \
    tests/test_reductions_random.py) > $OUT/slab_tests.log 2>&1
echo "slab tests: rc=$? $(tail -n 1 $OUT/slab_tests.log)"
(cd snap-ab && timeout 150 python3 benchmarks/results/diagnostics/slab_warp.py) \
    > $OUT/slab_warp.log 2>&1
echo "slab_warp.py: rc=$?"
mv snap-ab snapB
grep -h "planned grid\|^ *[0-9]" $OUT/trip/snap?-1.log | head -80
cat $OUT/slab_warp.log | grep -v "warning\|constexpr\|^ *\^$\|Remark\|^$"
