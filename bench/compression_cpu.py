"""The compression branch on the CPU against torch-eager versions of the same math, in one process: mean pooling +
compressed attention (one dense masked softmax over the compressed keys), and select_blocks (lse given; einsum,
probabilities, torch.topk after the forced blocks).

    python3 -m bench.compression_cpu [--seq 4096] [--repeats 5] [--slots 16]

Layout: the benchmark's "cpu" configuration (H 16, G 1, D = Dv = 64, BS 64, f32). Prints a markdown table per
function. Median of `repeats` after 2 warm-ups (nsa_iree.benchmark.timed).
"""

from __future__ import annotations

import argparse

import torch

import nsa_iree
from nsa_iree.benchmark import CONFIGS, timed
from nsa_iree.reference import select_blocks_reference
from nsa_iree.testing import relative_rms_error


def torch_eager_compressed_attention(q, k_cmp, v_cmp, block_size, scale=None):
    """The same math in eager torch: scores [B, H, M, C] masked to the complete blocks, softmax, p v."""
    heads, groups = q.shape[2], k_cmp.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k = k_cmp.repeat_interleave(heads // groups, dim=2)
    v = v_cmp.repeat_interleave(heads // groups, dim=2)
    s = torch.einsum("bmhd,bchd->bhmc", q, k) * scale
    pos = torch.arange(q.shape[1])
    visible = (torch.arange(k.shape[1]) + 1) * block_size - 1 <= pos.view(-1, 1)
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    return torch.einsum("bhmc,bchd->bmhd", p, v), lse


def mean_pool_eager(x, block_size):
    n = x.shape[1]
    c = -(-n // block_size)
    padded = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, c * block_size - n))
    sums = padded.view(x.shape[0], c, block_size, *x.shape[2:]).sum(2)
    counts = (n - torch.arange(c) * block_size).clamp(max=block_size).to(x.dtype)
    return sums / counts.view(1, -1, 1, 1)


def torch_eager_select_blocks(q, k_cmp, lse, slots, block_size, scale):
    """select_blocks in eager torch: scores by einsum, probabilities exp(s - lse), the mean over the group,
    torch.topk after the forced blocks (ties by topk, so equal to the kernel only away from ties)."""
    batch, m_rows, heads, _ = q.shape
    groups, num_blocks = k_cmp.shape[2], k_cmp.shape[1]
    s = torch.einsum("bmhd,bchd->bmhc", q, k_cmp.repeat_interleave(heads // groups, dim=2)) * scale
    pos = torch.arange(m_rows).view(m_rows, 1)
    c = torch.arange(num_blocks).view(1, num_blocks)
    own = pos // block_size
    scored = (c >= 1) & (c <= own - 2)                                   # every other selectable block
    p = torch.exp(s - lse.permute(0, 2, 1).unsqueeze(-1))
    score = p.view(batch, m_rows, groups, heads // groups, num_blocks).mean(dim=3)
    score = score.masked_fill(~scored.view(1, m_rows, 1, num_blocks), float("-inf"))
    forced = torch.stack([own, own - 1, torch.zeros_like(own)], dim=-1).view(1, m_rows, 1, 3).expand(
        batch, m_rows, groups, 3)
    nforced = torch.clamp(own + 1, max=3).view(1, m_rows, 1, 1)
    top_v, top_i = score.topk(min(slots, num_blocks), dim=-1)
    top_i = torch.where(torch.isinf(top_v), -1, top_i)
    ranked = torch.cat([forced.masked_fill(torch.arange(3).view(1, 1, 1, 3) >= nforced, -1), top_i], dim=-1)
    # forced first (the unused ones -1 dropped by a stable sort on "is -1"), then the scored ones
    key = (ranked < 0).to(torch.int8)
    ranked = ranked.gather(-1, key.sort(dim=-1, stable=True).indices)
    out = torch.full((batch, m_rows, groups, slots), -1, dtype=torch.int32)
    width = min(slots, ranked.shape[-1])
    out[..., :width] = ranked[..., :width].to(torch.int32)
    return out


def _seconds(fn, repeats):
    return timed(fn, torch.device("cpu"), repeats)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[4096])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slots", type=int, default=16, help="select_blocks' S")
    args = parser.parse_args(argv)
    cfg = CONFIGS["cpu"]
    bs = cfg["block_size"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; layout cpu: {cfg}")
    print("| N | forward: nsa_iree / eager (ms) | eager/ours | fwd + bwd with pooling: nsa_iree / eager (ms) | "
          "eager/ours | o vs eager |")
    print("|---|---|---|---|---|---|")
    for n in args.seq:
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(1, n, cfg["heads"], cfg["head_dim"], generator=gen)
        k = torch.randn(1, n, cfg["kv_heads"], cfg["head_dim"], generator=gen)
        v = torch.randn(1, n, cfg["kv_heads"], cfg["value_dim"], generator=gen)
        do = torch.randn(1, n, cfg["heads"], cfg["value_dim"], generator=gen)
        impls = {"nsa_iree": (nsa_iree.mean_pooling, nsa_iree.compressed_attention),
                 "eager": (mean_pool_eager, torch_eager_compressed_attention)}
        row = {}
        for name, (pool, attend) in impls.items():
            kc, vc = pool(k, bs), pool(v, bs)
            row[f"{name}_forward"] = _seconds(lambda: attend(q, kc, vc, bs), args.repeats)

            def training():
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                o, _ = attend(leaves[0], pool(leaves[1], bs), pool(leaves[2], bs), bs)
                o.backward(do)
            row[f"{name}_training"] = _seconds(training, args.repeats)
        o_mine, _ = nsa_iree.compressed_attention(q, nsa_iree.mean_pooling(k, bs), nsa_iree.mean_pooling(v, bs), bs)
        o_eager, _ = torch_eager_compressed_attention(q, mean_pool_eager(k, bs), mean_pool_eager(v, bs), bs)
        err = relative_rms_error(o_mine, o_eager)
        print(f"| {n} | {row['nsa_iree_forward'] * 1e3:.2f} / {row['eager_forward'] * 1e3:.2f} | "
              f"{row['eager_forward'] / row['nsa_iree_forward']:.2f} | {row['nsa_iree_training'] * 1e3:.1f} / "
              f"{row['eager_training'] * 1e3:.1f} | {row['eager_training'] / row['nsa_iree_training']:.2f} | "
              f"{err:.1e} |", flush=True)
    print(f"\n| N | select_blocks (S {args.slots}, lse given): nsa_iree / eager (ms) | eager/ours | rows where the "
          "f64 oracle's ids equal ours | rows where eager's equal ours |")
    print("|---|---|---|---|---|")
    for n in args.seq:
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(1, n, cfg["heads"], cfg["head_dim"], generator=gen)
        k_cmp = torch.randn(1, -(-n // bs), cfg["kv_heads"], cfg["head_dim"], generator=gen)
        scale = cfg["head_dim"] ** -0.5
        lse = nsa_iree.compressed_attention(q, k_cmp, k_cmp, bs)[1]
        ids = nsa_iree.select_blocks(q, k_cmp, args.slots, bs, lse=lse)
        exact = (ids == select_blocks_reference(q, k_cmp, args.slots, bs, lse=lse)).all(-1).double().mean()
        agree = (torch_eager_select_blocks(q, k_cmp, lse, args.slots, bs, scale) == ids).all(-1).double().mean()
        ours = _seconds(lambda: nsa_iree.select_blocks(q, k_cmp, args.slots, bs, lse=lse), args.repeats)
        eager = _seconds(lambda: torch_eager_select_blocks(q, k_cmp, lse, args.slots, bs, scale), args.repeats)
        print(f"| {n} | {ours * 1e3:.2f} / {eager * 1e3:.2f} | {eager / ours:.2f} | {float(exact):.4f} | "
              f"{float(agree):.4f} |", flush=True)


if __name__ == "__main__":
    main()
