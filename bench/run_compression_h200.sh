#!/usr/bin/env bash
# The compression branch on the H200 (through the device tool): artifacts compiled on the dev machine into
# .dev/artifacts (python -m bench.compression_gpu_checks --compile), the cp312 iree-base-runtime and fla-core
# wheels in .whl/. Usage: [STEPS="time checks sanitize"] bench/run_compression_h200.sh OUT
set -euo pipefail
out=$1
steps=${STEPS:-time checks sanitize}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# the checks twice in two processes (their gradient digests must be equal)
if [[ " $steps " == *" checks "* ]]; then
  python3 -m bench.compression_gpu_checks 2>&1 | tee "$out/checks.log" || echo "CHECKS FAILED"
  python3 -m bench.compression_gpu_checks 2>&1 | tee "$out/checks_again.log" || echo "CHECKS FAILED"
fi
if [[ " $steps " == *" time "* ]]; then python3 -m bench.compression_h200 "$out" 2>&1 | tee "$out/log.txt"; fi
# memcheck and initcheck of the same (small sizes: every dispatch of the forward and the two-pass backward)
if [[ " $steps " == *" sanitize "* ]]; then
  for tool in memcheck initcheck; do
    timeout 280 compute-sanitizer --tool $tool --print-limit 5 python3 -m bench.compression_gpu_checks 2>&1 \
      | tail -6 | tee "$out/$tool.log"
  done
fi
