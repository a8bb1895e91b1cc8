#!/usr/bin/env bash
# The training example on the H200 (through the device tool): nsa_iree's layer and fla's parallel_nsa in the same
# model, same initialisation and data, two seeds each (examples/train_nsa.py --preset h200). Artifacts compiled on
# the dev machine into .dev/artifacts (python -m bench.train_h200_specs), the cp312 iree-base-runtime and fla-core
# wheels in .whl/. Usage: [STEPS=100] bench/train_h200.sh OUT
set -euo pipefail
out=$1
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for seed in 0 1; do
  for attention in nsa_iree fla; do
    python3 examples/train_nsa.py --preset h200 --steps "${STEPS:-100}" --seed $seed --attention $attention \
      --out "$out/train_${attention}_seed$seed" 2>&1 | tr '\r' '\n' | grep -v "^\[" | tee -a "$out/train.log"
  done
done
