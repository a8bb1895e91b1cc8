"""NSA's compression branch: the compressed keys and values its attention reads (docs/semantics.md, 'The
compression branch and block selection').

``mean_pooling`` is plain torch (a memory-bound reduction that torch runs at bandwidth on every device, with
autograd for its backward); the compressed attention and the top-n block selection are kernels (issue 27).
"""

from __future__ import annotations

import torch

from . import packing, validate


def mean_pooling(x: torch.Tensor, block_size: int, *, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """The mean of every block of ``block_size`` tokens: NSA's compressed keys (or values) by mean pooling.

    Args:
        x: [B, N, G, D] float32, float16 or bfloat16 (keys or values; any G, D).
        block_size: BS, tokens per block (the selection branch's block size).
        cu_seqlens: None, or [S + 1] int32 with B = 1: x holds S packed sequences, sequence s being tokens
            cu_seqlens[s] .. cu_seqlens[s + 1] - 1 (the selection ops' rules). Each is pooled alone, its
            ceil(L_s / BS) blocks after those of the sequences before it; an empty sequence has none.
    Returns:
        [B, C, G, D] in x's dtype, C = ceil(N / BS) (with cu_seqlens, the sum of ceil(L_s / BS)): block c the mean
        of its tokens, the last block of a sequence over the tokens it has. Summed in float32, rounded once.
        Differentiable in x (each token gets its block's gradient over the block's token count).

    Raises a TypeError or ValueError naming the argument for bad input. With cu_seqlens, its values are read on
    the host once.
    """
    validate.check_mean_pooling(x, block_size, cu_seqlens)
    if cu_seqlens is None:
        return _pooled(x, block_size, [x.shape[1]])
    bounds = packing.check_cu_seqlens_values(cu_seqlens, x.shape[1])
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    padded = [-(-n // block_size) * block_size for n in lengths]
    if padded[:-1] == lengths[:-1]:
        # every sequence but the last a whole number of blocks: the packed tokens are already block-aligned
        return _pooled(x, block_size, lengths)
    # Each sequence laid out from a block boundary (zeros after its tokens), then pooled as one sequence.
    starts = torch.tensor([sum(padded[:s]) for s in range(len(lengths))], dtype=torch.int64)
    token = torch.arange(x.shape[1])
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths, dtype=torch.int64))
    where = (starts[seq] + token - torch.tensor(bounds[:-1], dtype=torch.int64)[seq]).to(x.device)
    aligned = x.new_zeros(x.shape[0], sum(padded), *x.shape[2:]).index_copy(1, where, x)
    return _pooled(aligned, block_size, lengths, padded)


def _pooled(x: torch.Tensor, block_size: int, lengths: list[int], padded: list[int] | None = None) -> torch.Tensor:
    """Block means of x [B, P, G, D] whose sequences (token counts `lengths`, each laid out over `padded` tokens,
    a multiple of BS but for the last one) follow one another."""
    batch, total, groups, dim = x.shape
    padded = padded or lengths
    full, rest = divmod(total, block_size)
    sums = x[:, :full * block_size].reshape(batch, full, block_size, groups, dim).sum(dim=2, dtype=torch.float32)
    if rest:
        sums = torch.cat([sums, x[:, full * block_size:].sum(dim=1, keepdim=True, dtype=torch.float32)], dim=1)
    counts = [min(block_size, n - i * block_size) for n, p in zip(lengths, padded)
              for i in range(-(-p // block_size))]
    counts = torch.tensor(counts, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    return (sums / counts).to(x.dtype)
