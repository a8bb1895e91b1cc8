"""The whole NSA layer's attention on a GPU: nsa_iree.nsa (compression, select_blocks, selection, gates; no
window) against fla-core's parallel_nsa with g_cmp and g_slc, forward and a training step (forward + backward),
in one process, and nsa_iree.nsa with the window branch (W 512) beside them; anchors layout, bf16.

    python3 -m bench.layer_h200 OUT [N ...]      (artifacts prebuilt: python -m bench.layer_h200 --compile N ...)
    python3 -m bench.layer_h200 --profile OUT N  (one nsa_iree training step under torch.profiler: its kernels and
                                                  ops by device time, the step's wall time beside them)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ANCHORS = dict(heads=64, kv_heads=4, head_dim=128, block_size=64, block_counts=16)
WINDOW = 512        # the window of the run with the sliding-window branch (fla-default NativeSparseAttention's)


def specs(n):
    """The cuda modules timing(n) loads (those of `nsa-iree bench --branch layer` in the anchors layout)."""
    from bench.branches_h200 import branch_specs

    return branch_specs("anchors", "layer", n, WINDOW)


def timing(n, baselines=True):
    """Ours at n tokens, without and with the window, and fla's parallel_nsa beside them unless not `baselines` (an
    A/B of builds: bench/ab_step.py)."""
    import nsa_iree
    from nsa_iree.benchmark import timed

    h, g, d, bs, t = (ANCHORS[x] for x in ("heads", "kv_heads", "head_dim", "block_size", "block_counts"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, n, heads, d, device="cuda", generator=gen).to(torch.bfloat16) for heads in (h, g, g))
    g_cmp, g_slc = (torch.rand(1, n, h, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    do = torch.randn(1, n, h, d, device="cuda", generator=gen).to(torch.bfloat16)
    ms = lambda fn: timed(fn, torch.device("cuda"), 5, warmup=2) * 1e3  # noqa: E731

    def step(attention):
        leaves = [x.detach().requires_grad_() for x in (q, k, v, g_cmp, g_slc)]
        attention(*leaves).backward(do)

    ours = lambda q, k, v, gc, gs: nsa_iree.nsa(q, k, v, gc, gs, block_counts=t, block_size=bs)  # noqa: E731
    row = {"n": n, "nsa_iree_forward_ms": ms(lambda: ours(q, k, v, g_cmp, g_slc)),
           "nsa_iree_step_ms": ms(lambda: step(ours))}
    # ours with the window branch beside it (W 512, its own gate): fla's parallel_nsa has none without flash-attn
    g_swa = torch.rand(1, n, h, device="cuda", generator=gen).to(torch.bfloat16)
    windowed = lambda q, k, v, gc, gs: nsa_iree.nsa(q, k, v, gc, gs, g_swa, block_counts=t, block_size=bs,  # noqa: E731
                                                    window_size=WINDOW)
    row["nsa_iree_window_forward_ms"] = ms(lambda: windowed(q, k, v, g_cmp, g_slc))
    row["nsa_iree_window_step_ms"] = ms(lambda: step(windowed))
    if not baselines:
        return row
    from fla.ops.nsa.parallel import parallel_nsa

    theirs = lambda q, k, v, gc, gs: parallel_nsa(q, k, v, gc, gs, block_counts=t, block_size=bs)  # noqa: E731
    row["fla_forward_ms"] = ms(lambda: theirs(q, k, v, g_cmp, g_slc))
    row["fla_step_ms"] = ms(lambda: step(theirs))
    row["step_ratio_ours_over_fla"] = row["nsa_iree_step_ms"] / row["fla_step_ms"]
    return row


def profile(out: Path, n: int, window: int = 0) -> None:
    """One nsa_iree training step under torch.profiler (bench.lengths.profile_step), with the window branch beside
    the others when `window` > 0."""
    import nsa_iree
    from bench.lengths import profile_step

    h, g, d, bs, t = (ANCHORS[x] for x in ("heads", "kv_heads", "head_dim", "block_size", "block_counts"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, n, heads, d, device="cuda", generator=gen).to(torch.bfloat16) for heads in (h, g, g))
    g_cmp, g_slc, g_swa = (torch.rand(1, n, h, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))
    do = torch.randn(1, n, h, d, device="cuda", generator=gen).to(torch.bfloat16)
    gates = (g_cmp, g_slc, g_swa) if window else (g_cmp, g_slc)

    def step():
        leaves = [x.detach().requires_grad_() for x in (q, k, v, *gates)]
        nsa_iree.nsa(*leaves, block_counts=t, block_size=bs, window_size=window).backward(do)

    profile_step(out, step)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--profile"]:
        profile(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        from bench.lengths import main

        main(sys.argv[1:], specs, timing, "layer", ANCHORS)
