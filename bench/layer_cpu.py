"""The whole NSA layer's attention on the CPU against the same math in eager torch, in one process: nsa_iree.nsa
(pooling, compressed attention, select_blocks, selection, window 128, gates) and an eager version of each branch
(bench/compression_cpu.py's compressed attention and top-n, nsa_iree.benchmark's gathered selection, a masked
dense window), forward and forward + backward.

    python3 -m bench.layer_cpu [--seq 4096] [--repeats 3] [--window 128]

Layout: the benchmark's "cpu" configuration (H 16, G 1, D = Dv = 64, BS 64, 16 blocks, f32). Prints a markdown
table.
"""

from __future__ import annotations

import argparse

import torch

import nsa_iree
from nsa_iree.benchmark import CONFIGS, timed, torch_eager_selection_attention
from nsa_iree.testing import relative_rms_error

from .compression_cpu import mean_pool_eager, torch_eager_compressed_attention, torch_eager_select_blocks


def eager_window(q, k, v, window, scale):
    """Sliding-window attention in eager torch: dense scores, the band masked, softmax."""
    m_rows, heads, groups = q.shape[1], q.shape[2], k.shape[2]
    kh, vh = k.repeat_interleave(heads // groups, dim=2), v.repeat_interleave(heads // groups, dim=2)
    s = torch.einsum("bmhd,bnhd->bhmn", q, kh) * scale
    pos = torch.arange(m_rows).view(-1, 1)
    j = torch.arange(k.shape[1]).view(1, -1)
    s = s.masked_fill(~((j <= pos) & (j > pos - window)), float("-inf"))
    return torch.einsum("bhmn,bnhe->bmhe", torch.softmax(s, dim=-1), vh)


def eager_nsa(q, k, v, g_cmp, g_slc, g_swa, counts, bs, window):
    scale = q.shape[-1] ** -0.5
    k_cmp, v_cmp = mean_pool_eager(k, bs), mean_pool_eager(v, bs)
    o_cmp, lse = torch_eager_compressed_attention(q, k_cmp, v_cmp, bs, scale)
    with torch.no_grad():
        idx = torch_eager_select_blocks(q, k_cmp, lse.detach(), counts, bs, scale)
    o_slc = torch_eager_selection_attention(q, k, v, idx, bs, scale)
    o_swa = eager_window(q, k, v, window, scale)
    return o_slc * g_slc.unsqueeze(-1) + o_cmp * g_cmp.unsqueeze(-1) + o_swa * g_swa.unsqueeze(-1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=128)
    args = parser.parse_args(argv)
    cfg = CONFIGS["cpu"]
    bs, counts = cfg["block_size"], cfg["num_blocks"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; layout cpu: {cfg}, window {args.window}")
    print("| N | forward: nsa_iree / eager (ms) | eager/ours | fwd + bwd: nsa_iree / eager (ms) | eager/ours | "
          "o vs eager |")
    print("|---|---|---|---|---|---|")
    for n in args.seq:
        gen = torch.Generator().manual_seed(0)
        h, g, d = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        inputs = [torch.randn(1, n, heads, d, generator=gen) for heads in (h, g, g)]
        inputs += [torch.rand(1, n, h, generator=gen) for _ in range(3)]
        do = torch.randn(1, n, h, d, generator=gen)
        impls = {
            "nsa_iree": lambda q, k, v, gc, gs, gw: nsa_iree.nsa(q, k, v, gc, gs, gw, block_counts=counts,
                                                                 block_size=bs, window_size=args.window),
            "eager": lambda q, k, v, gc, gs, gw: eager_nsa(q, k, v, gc, gs, gw, counts, bs, args.window),
        }
        row = {}
        for name, fn in impls.items():
            row[f"{name}_forward"] = timed(lambda: fn(*inputs), torch.device("cpu"), args.repeats)

            def step():
                leaves = [t.clone().requires_grad_() for t in inputs]
                fn(*leaves).backward(do)
            row[f"{name}_step"] = timed(step, torch.device("cpu"), args.repeats)
        err = relative_rms_error(impls["nsa_iree"](*inputs), impls["eager"](*inputs))
        print(f"| {n} | {row['nsa_iree_forward'] * 1e3:.1f} / {row['eager_forward'] * 1e3:.1f} | "
              f"{row['eager_forward'] / row['nsa_iree_forward']:.2f} | {row['nsa_iree_step'] * 1e3:.1f} / "
              f"{row['eager_step'] * 1e3:.1f} | {row['eager_step'] / row['nsa_iree_step']:.2f} | {err:.1e} |",
              flush=True)


if __name__ == "__main__":
    main()
