"""Packed variable-length sequences (``cu_seqlens``) run through the unchanged kernels.

The kernels see one sequence of P tokens in which every packed sequence starts on a block boundary: sequence s
(tokens ``cu_seqlens[s] .. cu_seqlens[s + 1] - 1``, length L_s) occupies the padded rows and keys
``start_s .. start_s + L_s - 1``, with ``start_s`` the sum of ``ceil(L_r / BS) * BS`` over the sequences before
it; the rows and keys after a sequence, up to the next block boundary, are padding (the last sequence needs
none: the kernels cut the last block at N). M = N = P, so a padded row stands at its own key position.

A packed row at position p of sequence s lists block ids relative to its sequence; in the padded layout slot i
becomes the global block ``start_s / BS + i`` when ``0 <= i`` and ``i * BS <= p`` (then ``i < ceil(L_s / BS)``
too), else -1. The kernels' own rules then give exactly the per-sequence semantics: the causal mask of the
row's own block hides the keys after p (the sequence's later keys, and its padding keys, which come after all
of its rows); every other listed block lies wholly before p inside the same sequence; a duplicate slot maps
to the same global block and still counts twice. Padding rows list no block (o = 0, lse = -inf, nothing
flows into any gradient) and are dropped; padding keys are zero and their gradients are dropped.

Cost: the index maps take a few small torch ops on the device, and the inputs and outputs one gather or
scatter each (q, k, v in, o and lse out for the forward; q, k, v, o, do, lse in and dq, dk, dv out for the
backward). When the layout is the packed one itself (P == total: every sequence but the last is a whole
number of blocks long, one sequence in particular) nothing is copied and only the block ids are rewritten.
The padded length P is needed on the host to allocate; it comes from one copy of cu_seqlens (S + 1
integers) to the host, which also serves to check its values. On CUDA that copy waits for torch's stream,
which the IREE call that follows would wait for anyway (runtime.Module.call).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import Tensor


def check_cu_seqlens_values(cu_seqlens: Tensor, total: int) -> list[int]:
    """The boundaries of cu_seqlens as Python ints, after checking them against `total` packed tokens.

    Raises ValueError unless they start at 0, never decrease and end at `total` (q.shape[1]).
    """
    bounds = [int(b) for b in cu_seqlens.tolist()]
    if bounds[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got cu_seqlens[0] = {bounds[0]}")
    for s in range(1, len(bounds)):
        if bounds[s] < bounds[s - 1]:
            raise ValueError(f"cu_seqlens must be non-decreasing, got cu_seqlens[{s}] = {bounds[s]} < "
                             f"cu_seqlens[{s - 1}] = {bounds[s - 1]}")
    if bounds[-1] != total:
        raise ValueError(f"cu_seqlens must end at the number of packed tokens M = q.shape[1] = {total}, got "
                         f"cu_seqlens[-1] = {bounds[-1]}")
    return bounds


@dataclasses.dataclass
class PackedLayout:
    """Where the packed tokens go in the block-aligned layout the kernels see.

    Attributes:
        total: packed tokens (q.shape[1]).
        padded: P, rows and keys of the block-aligned layout.
        rows: [total] int64, the padded row of every packed token (None when P == total: the identity).
        pad_rows: [P - total] int64, the padding rows (None when P == total).
        position: [total] int64, every token's position inside its sequence.
        first_block: [total] int64, the global block at which its sequence starts.
    """

    total: int
    padded: int
    rows: Optional[Tensor]
    pad_rows: Optional[Tensor]
    position: Tensor
    first_block: Tensor

    @property
    def identity(self) -> bool:
        return self.rows is None

    def block_indices(self, idx: Tensor, block_size: int) -> Tensor:
        """[1, P, G, T] int32 global block ids of the padded layout, from the per-sequence ones.

        idx: [1, total, G, T] int32 (block_counts already folded in, as api.effective_block_indices gives).
        """
        # i * BS <= p  <=>  i <= p // BS for i >= 0: compared in int32, no int64 copy of the ids. (The sum
        # is formed for every slot, kept or not: a wrapped int32 sum of a skipped one is never used.)
        last_block = torch.div(self.position, block_size, rounding_mode="floor").to(torch.int32).view(1, -1, 1, 1)
        keep = (idx >= 0) & (idx <= last_block)
        mapped = torch.where(keep, idx + self.first_block.to(torch.int32).view(1, -1, 1, 1), -1)
        return self.to_padded(mapped, dim=1, fill=-1)

    def to_padded(self, x: Tensor, dim: int = 1, fill: float = 0) -> Tensor:
        """x with its packed dimension `dim` (total long) laid out in the padded layout (P long), padding
        entries set to `fill`; a contiguous tensor (x itself, made contiguous, for the identity)."""
        if self.identity:
            return x.contiguous()
        shape = list(x.shape)
        shape[dim] = self.padded
        out = x.new_empty(shape)
        out.index_copy_(dim, self.rows, x)
        out.index_fill_(dim, self.pad_rows, fill)
        return out

    def from_padded(self, x: Tensor, out: Tensor, dim: int = 1) -> Tensor:
        """The packed rows of padded x (dimension `dim`, P long) written into out (total long)."""
        if self.identity:
            return out.copy_(x) if out is not x else out
        return torch.index_select(x, dim, self.rows, out=out)


def packed_layout(cu_seqlens: Tensor, total: int, block_size: int) -> PackedLayout:
    """The block-aligned layout of the packed sequences of cu_seqlens ([S + 1] int32, on the tensors'
    device); its values are checked first (check_cu_seqlens_values)."""
    bounds = check_cu_seqlens_values(cu_seqlens, total)
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    padded_lengths = [-(-n // block_size) * block_size for n in lengths[:-1]] + lengths[-1:]
    padded = sum(padded_lengths)
    count = len(lengths)
    device = cu_seqlens.device
    if total == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return PackedLayout(total, padded, None, None, empty, empty)

    bounds_d = cu_seqlens.to(torch.int64)
    lengths_d = bounds_d[1:] - bounds_d[:-1]                                       # [S]
    last = torch.arange(count, device=device) == count - 1
    padded_d = torch.where(last, lengths_d, (lengths_d + block_size - 1) // block_size * block_size)
    start_d = torch.cumsum(padded_d, 0) - padded_d                                 # padded start of each sequence
    sequence = torch.repeat_interleave(torch.arange(count, device=device), lengths_d, output_size=total)
    token = torch.arange(total, device=device)
    position = token - bounds_d[:-1][sequence]
    first_block = (start_d // block_size)[sequence]
    if padded == total:
        return PackedLayout(total, padded, None, None, position, first_block)

    rows = start_d[sequence] + position
    pad_d = padded_d - lengths_d                                                   # padding after each sequence
    pad_sequence = torch.repeat_interleave(torch.arange(count, device=device), pad_d, output_size=padded - total)
    pad_offset = torch.arange(padded - total, device=device) - (torch.cumsum(pad_d, 0) - pad_d)[pad_sequence]
    pad_rows = (start_d + lengths_d)[pad_sequence] + pad_offset
    return PackedLayout(total, padded, rows, pad_rows, position, first_block)
