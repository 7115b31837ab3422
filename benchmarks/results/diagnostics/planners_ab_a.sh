#!/usr/bin/env bash
# Issue 40's A/B (benchmarks/results/diagnostics/README.md): run by the device tool
# from the project root with ./baseline = git archive fea5f8a, logs under $OUT.
# Device call A: build this tree and the baseline (fea5f8a), a short GPU smoke
# test, then benchmarks ops and train on both, alternating, on one warm GPU.
set -u
source .gpu/setup.sh
python3 setup.py build_ext --inplace -q > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
(cd baseline && python3 setup.py build_ext --inplace -q > $OUT/build_base.log 2>&1) || { tail -30 $OUT/build_base.log; exit 1; }
nvidia-smi -L
timeout 150 python3 -m pytest -q -x -p no:cacheprovider -rs tests/test_one_call.py tests/test_pycuda.py \
   tests/test_batched_dot.py tests/test_launch.py > $OUT/smoke.log 2>&1; echo "smoke rc=$?"; tail -4 $OUT/smoke.log
grep -q " failed\|error" $OUT/smoke.log && grep -E "^FAILED|^ERROR|Error" $OUT/smoke.log | head -20
source baseline/prov.sh
timeout 150 python3 -m benchmarks ops --save > $OUT/ops_new.log 2>&1; echo "ops new rc=$?"
(cd baseline && timeout 150 python3 -m benchmarks ops > $OUT/ops_base.log 2>&1; echo "ops base rc=$?")
timeout 100 python3 -m benchmarks train --save > $OUT/train_new.log 2>&1; echo "train new rc=$?"
(cd baseline && timeout 100 python3 -m benchmarks train > $OUT/train_base.log 2>&1; echo "train base rc=$?")
cp benchmarks/results/runs/*$(date -u +%Y%m%d)* $OUT/ 2>/dev/null
ls $OUT
