"""The sliding-window branch on a GPU: nsa_iree.sliding_window_attention against torch's FlexAttention with a
sliding-window block mask (GQA, compiled), forward and forward + backward, in one process; anchors layout, bf16.

    python3 -m bench.window_h200 OUT [N ...]     (artifacts prebuilt: python3 -m bench.window_h200 --compile N ...)
    python3 -m bench.window_h200 --profile OUT N (one forward + backward under torch.profiler)
"""

from __future__ import annotations

import sys

import torch

ANCHORS = dict(heads=64, kv_heads=4, head_dim=128, window=512)


def specs(n):
    """The cuda modules timing(n) loads (those of `nsa-iree bench --branch window` in the anchors layout)."""
    from bench.branches_h200 import branch_specs

    return branch_specs("anchors", "window", n, ANCHORS["window"])


def timing(n, baselines=True):
    """Ours at n tokens, and FlexAttention's beside it unless not `baselines` (an A/B of builds: bench/ab_step.py)."""
    import nsa_iree
    from nsa_iree.benchmark import flex_window, timed

    h, g, d, w = (ANCHORS[x] for x in ("heads", "kv_heads", "head_dim", "window"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, n, heads, d, device="cuda", generator=gen).to(torch.bfloat16) for heads in (h, g, g))
    do = torch.randn(1, n, h, d, device="cuda", generator=gen).to(torch.bfloat16)
    ms = lambda fn: timed(fn, torch.device("cuda"), 10, warmup=3) * 1e3  # noqa: E731

    def step(attention, *inputs):
        leaves = [x.detach().requires_grad_() for x in inputs]
        attention(*leaves).backward(do)

    ours = lambda q, k, v: nsa_iree.sliding_window_attention(q, k, v, w)  # noqa: E731
    row = {"n": n, "window": w, "nsa_iree_forward_ms": ms(lambda: ours(q, k, v)),
           "nsa_iree_fwd_bwd_ms": ms(lambda: step(ours, q, k, v))}
    if not baselines:
        return row

    theirs = flex_window(w, n, torch.device("cuda"))
    row["flex_forward_ms"] = ms(lambda: theirs(q, k, v))
    row["flex_fwd_bwd_ms"] = ms(lambda: step(theirs, q, k, v))
    row["o_vs_flex"] = float((ours(q, k, v).float() - theirs(q, k, v).float()).norm() / theirs(q, k, v).float().norm())
    row["fwd_bwd_ours_over_flex"] = row["nsa_iree_fwd_bwd_ms"] / row["flex_fwd_bwd_ms"]
    return row


def profile(out, n):
    """One nsa_iree window forward + backward under torch.profiler (bench.lengths.profile_step)."""
    import nsa_iree
    from bench.lengths import profile_step

    h, g, d, w = (ANCHORS[x] for x in ("heads", "kv_heads", "head_dim", "window"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, n, heads, d, device="cuda", generator=gen).to(torch.bfloat16) for heads in (h, g, g))
    do = torch.randn(1, n, h, d, device="cuda", generator=gen).to(torch.bfloat16)

    def step():
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        nsa_iree.sliding_window_attention(*leaves, w).backward(do)

    profile_step(out, step)


if __name__ == "__main__":
    from pathlib import Path

    from bench.lengths import main

    if sys.argv[1:2] == ["--profile"]:
        profile(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        main(sys.argv[1:], specs, timing, "window", ANCHORS)
