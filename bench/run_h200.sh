#!/usr/bin/env bash
# The H200 run (through the device tool): artifacts compiled on the dev machine (no compiler there), the
# cp312 iree-base-runtime and fla-core wheels carried in .whl/. Usage: bench/run_h200.sh OUT [bench args]
set -euo pipefail
out=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -m bench.bench --device cuda --out "$out" "$@" 2>&1 | tee "$out/log.txt"
