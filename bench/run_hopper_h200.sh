#!/usr/bin/env bash
# The hopper target's checks on the H200 (through the device tool, carry .whl .dev): numerics and time against the
# NVIDIA kernels, memcheck and racecheck; the window's edge cases through the API (bench.compression_gpu_checks
# --only window: f64 oracle, linalg stages, bitwise backward) and its step against FlexAttention (bench.window_h200).
# Compile first where iree-compile is:
#   NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts python -m bench.hopper_checks compile
#   NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts python -m bench.compression_gpu_checks --only window --compile
#   NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts python -m bench.window_h200 --compile 65536
# Usage: [STEPS="check check_bwd time time_bwd window_checks window_step window_profile memcheck racecheck"]
#        bench/run_hopper_h200.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NSA_IREE_CACHE_DIR=${NSA_IREE_CACHE_DIR:-$PWD/.dev/artifacts}
out=${OUT:-/tmp/out}; mkdir -p "$out"
for step in ${STEPS:-check check_bwd time time_bwd window_checks window_step memcheck racecheck}; do
  echo "== $step"
  case $step in
    memcheck) timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 -m bench.hopper_checks sanitize 600 ;;
    racecheck) timeout 150 compute-sanitizer --tool racecheck --print-limit 5 python3 -m bench.hopper_checks sanitize 150 ;;
    window_checks) timeout 200 python3 -m bench.compression_gpu_checks --only window ;;
    window_step) timeout 300 python3 -m bench.window_h200 "$out" 65536 ;;
    window_profile) timeout 200 python3 -m bench.window_h200 --profile "$out" 65536 ;;
    *) timeout 200 python3 -m bench.hopper_checks "$step" ;;
  # (nanobind's exit messages end without a newline: the sanitizers' summaries are split off them, then kept)
  esac 2>&1 | sed 's/\(.\)\(=========\)/\1\n\2/' | grep -v "^nsa_iree: load\|leaked \(function\|type\)\|nanobind" \
    | tail -40
done | tee "$out/hopper_checks.log"
