#!/usr/bin/env bash
# One H200 call for the hand-written kernels: install the carried wheels, then checks, determinism, timing,
# and memcheck of one forward + two-pass backward. Usage (device tool, carry .whl .dev): bench/run_kernel_checks.sh
# STEPS picks the steps; RECIPE=.dev/variants/NAME checks a recipe variant (e.g. the portable kernels on
# mma.sync) instead of nsa_iree/pipelines; WHEELS is the wheel directory (default .whl).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ${WHEELS:-.whl}/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts
[ -n "${RECIPE:-}" ] && export NSA_IREE_PIPELINES_DIR=$PWD/$RECIPE
out=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for step in ${STEPS:-check determinism time sanitize}; do
  echo "== $step"
  case $step in
    sanitize) timeout 240 compute-sanitizer --tool memcheck --print-limit 5 python3 -c \
                "from bench.gpu_checks import sanitize; sanitize(1000, variants=('two-pass',))" 2>&1 | tail -8 ;;
    racecheck) timeout 300 compute-sanitizer --tool racecheck --print-limit 5 python3 -c \
                "from bench.gpu_checks import sanitize; sanitize(160, variants=('two-pass',))" 2>&1 | tail -8 ;;
    inversion|nonfinite) timeout 300 python3 -m bench.gpu_checks $step ;;
    *) timeout 400 python3 -m bench.kernel_checks $step ;;
  esac
done 2>&1 | tee "$out/kernel_checks.log"
