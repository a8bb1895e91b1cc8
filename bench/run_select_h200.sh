#!/usr/bin/env bash
# select_blocks on the H200 (through the device tool, carry .whl .dev): the portable kernel (the AMD targets' text,
# kernels/gpu/portable/select_blocks.mlir, on mma.sync: the recipe variant .dev/variants/portable_select written by
# `python -m bench.portable_select_variant`) and the NVIDIA one, each against the reference
# (bench/compression_gpu_checks.py --only select). The artifacts are compiled on the dev machine first, for both
# recipes, into .dev/artifacts:
#   NSA_IREE_CACHE_DIR=.dev/artifacts python -m bench.compression_gpu_checks --only select --compile
#   NSA_IREE_CACHE_DIR=.dev/artifacts NSA_IREE_PIPELINES_DIR=.dev/variants/portable_select \
#       python -m bench.compression_gpu_checks --only select --compile
# The cp312 iree-base-runtime wheel in .whl/. Usage: [STEPS="checks sanitize"] bench/run_select_h200.sh OUT
set -uo pipefail
out=${1:-/tmp/out}
steps=${STEPS:-checks sanitize}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts
portable=$PWD/.dev/variants/portable_select
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# the portable kernel twice in two processes (the rows' ids_digest must be the same), then the NVIDIA kernel on the
# same cases (the same digests but where near-ties order either way: rows_differing, largest_relative_gap)
if [[ " $steps " == *" checks "* ]]; then
  for run in portable portable_again; do
    echo "== $run"
    NSA_IREE_PIPELINES_DIR=$portable python3 -m bench.compression_gpu_checks --only select 2>&1 \
      | tee "$out/select_$run.log" || echo "PORTABLE CHECKS FAILED"
  done
  echo "== nvidia"
  python3 -m bench.compression_gpu_checks --only select 2>&1 | tee "$out/select_nvidia.log" || echo "NVIDIA CHECKS FAILED"
fi
# memcheck of every kernel the checks run; racecheck (workgroup memory hazards) on two small cases: HPG 16 f16 and
# HPG 1 with per-row counts
if [[ " $steps " == *" sanitize "* ]]; then
  echo "== memcheck"
  NSA_IREE_PIPELINES_DIR=$portable timeout 280 compute-sanitizer --tool memcheck --print-limit 5 \
    python3 -m bench.compression_gpu_checks --only select 2>&1 | tail -6 | tee "$out/select_memcheck.log"
  echo "== racecheck"
  NSA_IREE_PIPELINES_DIR=$portable timeout 280 compute-sanitizer --tool racecheck --print-limit 5 \
    python3 -m bench.compression_gpu_checks --only select --cases anchors_f16_n700_s1,hpg1_n1000_counts 2>&1 \
    | tail -6 | tee "$out/select_racecheck.log"
fi
