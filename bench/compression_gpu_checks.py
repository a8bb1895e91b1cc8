"""GPU checks of the compressed attention (no timing): the hand-written kernels against the linalg stages and the
f64 oracle, meant to run under `compute-sanitizer --tool memcheck` too (small sizes, artifacts prebuilt).

    python3 -m bench.compression_gpu_checks       (bench/run_compression_h200.sh's setup)
"""

from __future__ import annotations

import json
import os

import torch

import nsa_iree
from nsa_iree.testing import relative_rms_error

from .compression_h200 import ANCHORS, CHECKS, _inputs, check


def against_linalg(m, n):
    """o, lse and the gradients of the hand-written kernels against the linalg stages' (KernelSpec.kernels)."""
    bs = ANCHORS["block_size"]
    q, k, v = _inputs(m, n or m, seed=1)
    k_cmp, v_cmp = nsa_iree.mean_pooling(k, bs), nsa_iree.mean_pooling(v, bs)
    gen = torch.Generator(device="cuda").manual_seed(3)
    do = torch.randn(*q.shape[:3], v.shape[3], device="cuda", generator=gen).to(q.dtype)
    runs = {}
    for kernels in ("auto", "linalg"):
        os.environ["NSA_IREE_KERNELS"] = kernels
        leaves = [t.clone().requires_grad_() for t in (q, k_cmp, v_cmp)]
        o, lse = nsa_iree.compressed_attention(*leaves, bs, seq_len=n)
        o.backward(do)
        runs[kernels] = (o, lse, *(t.grad for t in leaves))
    os.environ.pop("NSA_IREE_KERNELS")
    names = ("o", "lse", "dq", "dk_cmp", "dv_cmp")
    return {f"{name}_vs_linalg": relative_rms_error(a.float(), b.float(), rms_floor=1e-3)
            for name, a, b in zip(names, runs["auto"], runs["linalg"])}


if __name__ == "__main__":
    for name, (m, n) in CHECKS.items():
        print(json.dumps(check(name, m, n) | against_linalg(m, n)), flush=True)
