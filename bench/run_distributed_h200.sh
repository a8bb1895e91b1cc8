#!/usr/bin/env bash
# Context parallelism on 2 x H200 (issue 18), through the device tool (kind nvidia-h200-x2, carry .whl .dev).
# First, here where iree-compile is:  NSA_IREE_CACHE_DIR=.dev/artifacts python3 -m bench.distributed_bench precompile
# Then on the device:                 bench/run_distributed_h200.sh [bench args, e.g. --seq 65536 131072]
# Writes $OUT/distributed_2xH200.{md,json} (after every length) and $OUT/distributed_log.txt.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/iree_base_runtime-*.whl
# NVLink multicast stays off (the machine's rule: it can take the host's shared GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts
# One host, no outside network: the ranks meet over the loopback interface.
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvidia-smi topo -m || true
timeout 450 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m bench.distributed_bench run \
  --out "$out" "$@" 2>&1 | tee "$out/distributed_log.txt"
