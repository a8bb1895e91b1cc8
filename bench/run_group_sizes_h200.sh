#!/usr/bin/env bash
# The group-size table's runs on the H200 (bench/results/group_sizes_H200.md): per heads-per-group layout, one
# bench.bench process timing nsa_iree's two-pass, fla's parallel_nsa (16 heads per group and more) and dense SDPA
# at SEQS tokens, realistic and uniform selections. Compile first where iree-compile is (the modules nsa_iree.api
# loads on the hopper target: kernels.loaded_spec; the one-pass too, which bench.bench's correctness check runs, or
# nsa_iree is not timed), e.g.
#   NSA_IREE_CACHE_DIR=$PWD/.dev/artifacts python -c "from nsa_iree.benchmark import CONFIGS; \
#     from nsa_iree.compiler import compile_loaded; from nsa_iree.spec import KernelSpec; \
#     [compile_loaded(KernelSpec(target='hopper', **CONFIGS[c]), v) for c in ('hpg64', 'hpg32', 'anchors', 'hpg8', \
#      'hpg4', 'hpg2', 'hpg1') for v in ('forward', 'two-pass', 'one-pass')]"
# Usage: bench/run_group_sizes_h200.sh OUT [CONFIGS...]   (SEQS="16384 65536" by default)
set -uo pipefail
out=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NSA_IREE_CACHE_DIR=${NSA_IREE_CACHE_DIR:-$PWD/.dev/artifacts}
mkdir -p "$out"
for config in "${@:-hpg64 hpg32 anchors hpg8 hpg4 hpg2 hpg1}"; do
  for c in $config; do
    echo "== $c"
    timeout 280 python3 -m bench.bench --device cuda --config "$c" --seq ${SEQS:-16384 65536} \
      --selection realistic uniform --repeats 3 --out "$out" \
      --impl "nsa_iree two-pass" "fla parallel_nsa" "dense sdpa" 2>&1 | grep -v "^nsa_iree: load" | tail -16
  done
done | tee "$out/group_sizes.log"
