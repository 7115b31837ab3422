#!/usr/bin/env bash
# Issue 40's A/B (benchmarks/results/diagnostics/README.md): run by the device tool
# from the project root with ./baseline = git archive fea5f8a, logs under $OUT.
# Device call C: the eager MLP step, baseline (fea5f8a) and this tree
# alternating four times each on one warm GPU.
set -u
source .gpu/setup.sh
python3 setup.py build_ext --inplace -q > /dev/null 2>&1 || exit 1
(cd baseline && python3 setup.py build_ext --inplace -q > /dev/null 2>&1) || exit 1
for i in 1 2 3 4; do
  for t in base new; do
    d=.; [ $t = base ] && d=baseline
    (cd $d && timeout 60 python3 -m benchmarks train --models mlp --no-graphs --reps 30 2>&1 \
       | grep -E "^mlp +(PyCudaHandler|PyTorch eager) " | sed "s/^/$t $i /")
  done
done
