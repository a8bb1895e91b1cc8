"""Block selections to feed the kernels in demos, tests and benchmarks.

`realistic_block_indices` mimics what NSA's top-n produces: block 0 and the two local blocks are chosen by
(nearly) every query row, the rest are earlier blocks. This is the worst case for a backward that walks
each block's list of selecting rows, and the case to benchmark. `uniform_block_indices` draws distinct
causal blocks uniformly. Both pad with -1 where a row has fewer than T visible blocks.
"""

from __future__ import annotations

import torch


def _pick(scores: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """The T best-scoring blocks per row (ties impossible), -1 where the score is -inf, sorted ascending."""
    top = scores.topk(min(num_blocks, scores.shape[-1]), dim=-1)
    idx = torch.where(torch.isinf(top.values) & (top.values < 0), -1, top.indices)
    if idx.shape[-1] < num_blocks:
        pad = idx.new_full((*idx.shape[:-1], num_blocks - idx.shape[-1]), -1)
        idx = torch.cat([idx, pad], dim=-1)
    # Ascending, with -1 padding moved to the end.
    key = torch.where(idx < 0, torch.iinfo(torch.int64).max, idx)
    order = key.argsort(dim=-1)
    return idx.gather(-1, order).to(torch.int32)


def _causal_scores(batch, m_rows, n, kv_heads, block_size, generator, device):
    num_kv_blocks = -(-n // block_size)
    pos = torch.arange(m_rows, device=device) + (n - m_rows)
    last = torch.div(pos, block_size, rounding_mode="floor")                     # [M]
    blocks = torch.arange(num_kv_blocks, device=device)
    scores = torch.rand(batch, m_rows, kv_heads, num_kv_blocks, generator=generator, device=device)
    future = blocks.view(1, 1, 1, -1) > last.view(1, -1, 1, 1)
    return scores.masked_fill(future, float("-inf")), blocks, last


def uniform_block_indices(batch, m_rows, n, kv_heads, num_blocks, block_size, generator=None, device="cpu"):
    """[B, M, G, T] int32: T distinct visible blocks per row, drawn uniformly; -1 where fewer exist."""
    scores, _, _ = _causal_scores(batch, m_rows, n, kv_heads, block_size, generator, device)
    return _pick(scores, num_blocks)


def realistic_block_indices(batch, m_rows, n, kv_heads, num_blocks, block_size, generator=None, device="cpu"):
    """[B, M, G, T] int32: block 0, the row's own block and the one before it, then random earlier blocks."""
    scores, blocks, last = _causal_scores(batch, m_rows, n, kv_heads, block_size, generator, device)
    forced = (blocks.view(1, 1, 1, -1) == 0) | (blocks.view(1, 1, 1, -1) >= last.view(1, -1, 1, 1) - 1)
    scores = torch.where(forced & torch.isfinite(scores), scores + 2.0, scores)
    return _pick(scores, num_blocks)


def local_block_indices(batch, m_rows, n, kv_heads, num_blocks, block_size, generator=None, device="cpu"):
    """[B, M, G, T] int32: the T most recent visible blocks of each row (a sliding window of blocks)."""
    scores, blocks, _ = _causal_scores(batch, m_rows, n, kv_heads, block_size, generator, device)
    recency = torch.where(torch.isfinite(scores), blocks.to(scores.dtype).expand_as(scores), scores)
    return _pick(recency, num_blocks)
