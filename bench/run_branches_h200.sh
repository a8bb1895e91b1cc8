#!/usr/bin/env bash
# Every branch row of `nsa-iree bench` on the H200 (bench/branches_h200.py; through the device tool, carry .whl and
# .dev): the cuda modules compiled on the dev machine into .dev/artifacts (NSA_IREE_CACHE_DIR=.dev/artifacts
# python3 -m bench.branches_h200 --compile), the cp312 iree-base-runtime and fla-core wheels in .whl/. One process
# per job (a branch and its configs, optionally its lengths), each under its own time limit so that a run fits one
# device call: a job cut short keeps the rows it finished (each record is written after every row).
# Usage: [JOBS="window:anchors layer:fla-default compression:anchors:65536,131072"] bench/run_branches_h200.sh OUT
# (default: every branch with PLAN's configs and lengths, about 20 minutes: more than one device call).
set -euo pipefail
out=$1
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
# seconds per config of a job
declare -A seconds=([compression]=130 [select]=60 [layer]=170 [window]=90) plan=([compression]=3 [select]=3 [layer]=2 [window]=2)
for job in ${JOBS:-compression select layer window}; do
  IFS=: read -r branch configs lengths <<< "$job"
  args=()
  [ -n "$configs" ] && args+=(--config ${configs//,/ })
  [ -n "$lengths" ] && args+=(--seq ${lengths//,/ })
  count=${plan[$branch]}
  [ -n "$configs" ] && count=$(tr , '\n' <<< "$configs" | wc -l)
  limit=$((seconds[$branch] * count))
  start=$SECONDS
  status=0
  timeout -k 5 "$limit" python3 -m bench.branches_h200 "$out" "$branch" "${args[@]}" > "$out/${job//[:,]/_}.log" 2>&1 \
    || status=$?
  echo "$job: exit $status after $((SECONDS - start)) s (limit $limit s)" | tee -a "$out/summary.txt"
  grep -h '^check\|"error"' "$out/${job//[:,]/_}.log" | cut -c1-300 || true
done
