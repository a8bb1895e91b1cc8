#!/usr/bin/env bash
# The wgmma probe on the H200 (through the device tool, carry .whl .dev/wgmma), against torch by bench/wgmma/check.py
# (bench/results/wgmma_probe_H200_2026-12-02.log). Compile it first where iree-compile is:
#   iree-compile bench/wgmma/probe.mlir --iree-opt-level=O2 -o .dev/wgmma/probe.vmfb
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/iree_base_runtime*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
d=.dev/wgmma
python3 -m bench.wgmma.check $d/probe.vmfb
