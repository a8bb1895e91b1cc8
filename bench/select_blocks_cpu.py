"""select_blocks on the CPU (kernels/cpu/select_blocks.mlir, lse given) against eager torch doing the same math:
scores by einsum and masked softmax probabilities (exp(s - lse)), the mean over the group, then torch.topk over
the scored blocks with the forced ones (own, own - 1, 0) put first. Prints the median of a few runs each.

    PYTHONPATH=$PWD python bench/select_blocks_cpu.py [N]
"""

from __future__ import annotations

import sys
import time

import torch

import nsa_iree
from nsa_iree.reference import select_blocks_reference


def eager_select(q, k_cmp, lse, slots, block_size, scale):
    """The same ids in eager torch (ties by topk, so equal to the kernel only away from ties)."""
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


def median_ms(fn, repeats=7):
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e3


def main(n=4096, heads=16, groups=1, dim=64, block_size=64, slots=16):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, n, heads, dim, generator=gen)
    k_cmp = torch.randn(1, -(-n // block_size), groups, dim, generator=gen)
    scale = dim ** -0.5
    lse = nsa_iree.compressed_attention(q, k_cmp, k_cmp, block_size)[1]
    ids = nsa_iree.select_blocks(q, k_cmp, slots, block_size, lse=lse)
    assert torch.equal(ids, select_blocks_reference(q, k_cmp, slots, block_size, lse=lse))
    eager = eager_select(q, k_cmp, lse, slots, block_size, scale)
    agree = (eager == ids).all(-1).double().mean().item()
    t_kernel = median_ms(lambda: nsa_iree.select_blocks(q, k_cmp, slots, block_size, lse=lse))
    t_eager = median_ms(lambda: eager_select(q, k_cmp, lse, slots, block_size, scale))
    print(f"N={n} H={heads} G={groups} D={dim} BS={block_size} S={slots} threads={torch.get_num_threads()}: "
          f"select_blocks {t_kernel:.2f} ms, eager torch {t_eager:.2f} ms ({t_eager / t_kernel:.1f}x); "
          f"rows where eager's ids equal the kernel's: {agree:.4f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4096)
