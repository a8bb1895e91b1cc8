#!/usr/bin/env bash
# The whole layer's attention on the H200 against fla's parallel_nsa (bench/layer_h200.py). Artifacts compiled on
# the dev machine (python -m bench.layer_h200 --compile N ...) into .dev/artifacts. Usage: bench/run_layer_h200.sh OUT [N ...]
set -euo pipefail
out=$1; shift
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts
python3 -m bench.layer_h200 "$out" "$@" 2>&1 | tee "$out/log.txt"
