#!/usr/bin/env bash
# Every branch row of `nsa-iree bench` on the H200 (bench/branches_h200.py; through the device tool, carry .whl and
# .dev): the cuda modules compiled on the dev machine into .dev/artifacts (NSA_IREE_CACHE_DIR=.dev/artifacts
# python3 -m bench.branches_h200 --compile), the cp312 iree-base-runtime and fla-core wheels in .whl/. One process
# per branch, each under its own time limit so that the whole run stays within 8 minutes: a branch cut short keeps
# the rows it finished (each record is written after every row). Usage: [BRANCHES="compression select"]
# bench/run_branches_h200.sh OUT
set -euo pipefail
out=$1
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
declare -A seconds=([compression]=120 [select]=60 [layer]=160 [window]=100)
for branch in ${BRANCHES:-compression select layer window}; do
  start=$SECONDS
  status=0
  timeout -k 5 "${seconds[$branch]}" python3 -m bench.branches_h200 "$out" "$branch" > "$out/$branch.log" 2>&1 \
    || status=$?
  echo "$branch: exit $status after $((SECONDS - start)) s (limit ${seconds[$branch]} s)" | tee -a "$out/summary.txt"
  grep -h '^check\|"error"' "$out/$branch.log" | cut -c1-300 || true
done
