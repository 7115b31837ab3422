#!/usr/bin/env bash
# cols_wave2.patch on a GPU (written 2026-11-28, tenth session, from
# cols_wave-NVIDIA-H200.log; CPU tests pass, never run on a GPU), in one
# device call from the project root, logs under $OUT: the whole GPU suite
# in a snapshot of main with the patch committed, then cols_wave.py there
# (its `tree` column is then the patch's rule: it must match `wave2`; the
# four sum_gen layouts, which the patch also chunks anew, untimed before).
# Prepare on the dev machine (the commit is the one that lands):
#     git checkout -b pending && git apply benchmarks/results/diagnostics/cols_wave2.patch
#     git commit -qam "reductions: column chunks in a wave of two blocks a multiprocessor"
#     bash .ci/gpu-snapshot pending snapW && git checkout main
# then run with carry [".gpu", "snapW"]:
#     bash benchmarks/results/diagnostics/pending_cols_wave2.sh
# About 8 minutes on a fresh machine.  If every file is rc 0 and the
# `tree` column matches `wave2`, fast-forward main to pending and run every
# suite in snapW (its prov.sh names the commit).
set -u
source .gpu/setup.sh
cd snapW || exit 2
source prov.sh
JOBS=15 timeout 340 bash .ci/gpu-suite /tmp/suite > "$OUT/suite_out.txt" 2>&1
tail -30 "$OUT/suite_out.txt" | tee "$OUT/summary.txt"
for f in /tmp/suite/*.log; do
    grep -q "^rc=[1-9]" "$f" && ! grep -q "^rc=5" "$f" && cp "$f" "$OUT/"
done
timeout 200 python3 benchmarks/results/diagnostics/cols_wave.py 2>&1 | grep -v "warn" \
    | tee "$OUT/cols_wave.log"
