#!/usr/bin/env bash
# Issue 40's A/B (benchmarks/results/diagnostics/README.md): run by the device tool
# from the project root with ./baseline = git archive fea5f8a, logs under $OUT.
# Device call B: benchmarks ops and train, baseline (fea5f8a) and this tree
# alternating on one warm GPU; tables to stdout, logs under $OUT.
set -u
source .gpu/setup.sh
python3 setup.py build_ext --inplace -q > /dev/null 2>&1 || exit 1
(cd baseline && python3 setup.py build_ext --inplace -q > /dev/null 2>&1) || exit 1
source baseline/prov.sh
(cd baseline && timeout 120 python3 -m benchmarks ops > $OUT/ops_base2.log 2>&1)
timeout 120 python3 -m benchmarks ops > $OUT/ops_new2.log 2>&1
(cd baseline && timeout 120 python3 -m benchmarks train > $OUT/train_base.log 2>&1)
timeout 120 python3 -m benchmarks train --save > $OUT/train_new.log 2>&1
cp benchmarks/results/runs/train-*$(date -u +%Y%m%d)* $OUT/ 2>/dev/null
for f in ops_base2 ops_new2; do echo "== $f"; sed -n '/Host overhead/,/^check/p' $OUT/$f.log | grep -v "^check"; done
for f in train_base train_new; do echo "== $f"; grep -v "^check\|^  \|^$" $OUT/$f.log | head -60; done
