#!/usr/bin/env bash
# bench/wgmma's modules on the H200 (through the device tool, carry .whl .dev/wgmma): each run against torch by
# bench/wgmma/check.py. Compile them first where iree-compile is:
#   mkdir -p .dev/wgmma && for f in probe loop bulk registers_a; do
#     iree-compile bench/wgmma/$f.mlir --iree-opt-level=O2 -o .dev/wgmma/$f.vmfb; done
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/iree_base_runtime*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
d=.dev/wgmma
python3 -m bench.wgmma.check $d/probe.vmfb
python3 -m bench.wgmma.check $d/loop.vmfb --scale 4
python3 -m bench.wgmma.check $d/bulk.vmfb --laid-out
python3 -m bench.wgmma.check $d/registers_a.vmfb --laid-out --n 128 --function wgmma_rega_gemm
