#!/usr/bin/env bash
# The sliding window on the portable kernels, on the H200 (through the device tool, carry .whl .dev): the AMD targets'
# forward, dq and dk/dv text (kernels/gpu/portable/, with the band's mask) on mma.sync, through the recipe variant
# .dev/variants/portable_window written by `python -m bench.portable_window_variant`, against the f64 oracle and the
# linalg stages (bench/compression_gpu_checks.py --only window: outputs poisoned, the backward twice bitwise). The
# artifacts are compiled on the dev machine first into .dev/artifacts:
#   NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts NSA_IREE_PIPELINES_DIR=$PWD/.dev/variants/portable_window \
#       python -m bench.compression_gpu_checks --only window --compile
# The cp312 iree-base-runtime wheel in .whl/. Usage: [STEPS="checks memcheck racecheck"] bench/run_window_h200.sh OUT
# (each sanitizer step is held to 280 s: STEPS="checks memcheck" and STEPS=racecheck fit one 600 s call each)
set -uo pipefail
out=${1:-/tmp/out}
steps=${STEPS:-checks memcheck racecheck}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts
export NSA_IREE_PIPELINES_DIR=$PWD/.dev/variants/portable_window
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# the checks twice in two processes: every row "ok", its "kernels" portable, and the same gradient digests in both
if [[ " $steps " == *" checks "* ]]; then
  for run in portable portable_again; do
    echo "== $run"
    python3 -m bench.compression_gpu_checks --only window 2>&1 | tee "$out/window_$run.log" || echo "WINDOW CHECKS FAILED"
  done
  python3 - "$out/window_portable.log" "$out/window_portable_again.log" <<'EOF'
import json
import sys


def rows(path):
    return [json.loads(line) for line in open(path) if line.startswith('{"check"')]


first, again = ({row["check"]: row for row in rows(path)} for path in sys.argv[1:])
digests = [{case: row["gradient_digest"] for case, row in run.items()} for run in (first, again)]
same = bool(first) and digests[0] == digests[1]
print("== gradient digests of the two processes:", "EQUAL" if same else f"DIFFER {digests}")
other = {case: row["kernels"] for case, row in first.items() if set(row["kernels"].values()) != {"portable"}}
print("== kernels:", f"NOT ALL PORTABLE {other}" if other else "forward, dq, dkdv portable in every case")
EOF
fi
# memcheck of every kernel three small cases run (M > N, HPG 1 and W below the block, f16 with W 1); racecheck
# (workgroup memory hazards) on two of them
if [[ " $steps " == *" memcheck "* ]]; then
  echo "== memcheck"
  timeout 280 compute-sanitizer --tool memcheck --print-limit 5 python3 -m bench.compression_gpu_checks --only window \
    --cases hpg4_d64dv128_m1200_n1000_w77,hpg1_n1000_w40,anchors_f16_n700_w1 2>&1 | tail -6 | tee "$out/window_memcheck.log"
fi
if [[ " $steps " == *" racecheck "* ]]; then
  echo "== racecheck"
  timeout 280 compute-sanitizer --tool racecheck --print-limit 5 python3 -m bench.compression_gpu_checks --only window \
    --cases hpg4_d64dv128_m1200_n1000_w77,hpg1_n1000_w40 2>&1 | tail -6 | tee "$out/window_racecheck.log"
fi
