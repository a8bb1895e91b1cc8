#!/usr/bin/env bash
# wgmma probes on the H200 (through the device tool, carry .whl .dev/wgmma), each against torch by bench/wgmma/check.py:
# bench/wgmma/probe.mlir, and the scratch variants of it a helper wrote (.dev/wgmma: the accumulator through scf.for,
# operands by cp.async.bulk with an mbarrier, A from registers at m64n128k16), outside the package until a kernel
# takes them up. Compile them first where iree-compile is:
#   iree-compile bench/wgmma/probe.mlir --iree-opt-level=O2 -o .dev/wgmma/probe.vmfb
#   for f in loop bulk registers_a; do iree-compile .dev/wgmma/$f.mlir --iree-opt-level=O2 -o .dev/wgmma/$f.vmfb; done
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/iree_base_runtime*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
d=.dev/wgmma
python3 -m bench.wgmma.check $d/probe.vmfb
python3 -m bench.wgmma.check $d/loop.vmfb --scale 4
python3 -m bench.wgmma.check $d/bulk.vmfb --laid-out
python3 -m bench.wgmma.check $d/registers_a.vmfb --laid-out --n 128 --function wgmma_rega_gemm
