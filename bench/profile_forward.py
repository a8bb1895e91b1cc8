"""One forward of nsa_iree and of fla's parallel_nsa on the anchors layout, for Nsight Compute.

On a GPU machine with the carried wheels on PYTHONPATH and the artifacts in NSA_IREE_CACHE_DIR, e.g.:

    ncu --kernel-name regex:"selection_attention_fwd|parallel_nsa_fwd" \
        --metrics lts__t_requests.sum,lts__t_sectors.sum,l1tex__m_xbar2l1tex_read_bytes.sum,gpu__time_duration.sum \
        python3 -m bench.profile_forward 16384

(fla autotunes on its first call: its last launch is the one to read.) The records made with it are
bench/results/ncu_H200_fwd_16k_*.txt and bench/results/kernels_H200.md.
"""

from __future__ import annotations

import sys

import torch

import nsa_iree
from bench.bench import CONFIGS, fla_impl
from bench.gpu_checks import _inputs


def main(seq: int = 16384, with_fla: bool = True) -> None:
    cfg = CONFIGS["anchors"]
    q, k, v, do, idx = _inputs(cfg, 1, seq)
    fla_fwd = fla_impl(cfg, q, k, v, do, idx)[0] if with_fla else None
    for _ in range(2):
        nsa_iree.selection_attention_fwd(q, k, v, idx, cfg["block_size"])
        if fla_fwd is not None:
            fla_fwd()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16384, "--no-fla" not in sys.argv)
