#!/usr/bin/env bash
# The hopper target's checks on the H200 (through the device tool, carry .whl .dev): numerics and time against the
# NVIDIA kernels, memcheck and racecheck. Compile first where iree-compile is:
#   NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts python -m bench.hopper_checks compile
# Usage: [STEPS="check time memcheck racecheck"] bench/run_hopper_h200.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts
out=${OUT:-/tmp/out}; mkdir -p "$out"
for step in ${STEPS:-check time memcheck racecheck}; do
  echo "== $step"
  case $step in
    memcheck) timeout 120 compute-sanitizer --tool memcheck --print-limit 5 python3 -m bench.hopper_checks sanitize 600 ;;
    racecheck) timeout 120 compute-sanitizer --tool racecheck --print-limit 5 python3 -m bench.hopper_checks sanitize 150 ;;
    *) timeout 200 python3 -m bench.hopper_checks "$step" ;;
  esac 2>&1 | grep -v "^nsa_iree: load" | tail -16
done | tee "$out/hopper_checks.log"
