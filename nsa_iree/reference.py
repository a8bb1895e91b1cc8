"""The f64 oracle: selection attention in plain torch, straight from docs/semantics.md.

This module depends on torch alone and shares nothing with the compiled path, so that it stays an
independent check of it. It is dense (it builds the [B, M, G, N] key-weight matrix), so it is meant for
the sizes tests and demos use, not for 64k tokens.
"""

from __future__ import annotations

import torch


def key_weights(block_indices: torch.Tensor, block_size: int, n: int,
                block_counts: torch.Tensor | int | None = None) -> torch.Tensor:
    """w[b, m, g, n]: how many valid slots of row (b, m, g) cover key n (0 = not visible).

    A slot t of row m holding block i is valid when t < count, i >= 0 and i * block_size <= pos(m), with
    pos(m) = m + N - M; it covers keys i*BS <= n < min(i*BS + BS, N) with n <= pos(m). Duplicates add up.

    Args:
        block_indices: [B, M, G, T] integer tensor.
        block_size: BS.
        n: N, number of keys.
        block_counts: None (all T slots), an int, or a [B, M, G] integer tensor.
    Returns:
        [B, M, G, N] float64 tensor on block_indices' device.
    """
    batch, m_rows, groups, slots = block_indices.shape
    device = block_indices.device
    idx = block_indices.to(torch.int64)
    t = torch.arange(slots, device=device)
    if block_counts is None:
        in_count = torch.ones_like(idx, dtype=torch.bool)
    elif isinstance(block_counts, int):
        in_count = (t < block_counts).expand_as(idx)
    else:
        in_count = t < block_counts.to(torch.int64).unsqueeze(-1)
    pos = torch.arange(m_rows, device=device) + (n - m_rows)              # [M]
    keys = torch.arange(n, device=device)                                # [N]
    slot_ok = in_count & (idx >= 0) & (idx * block_size <= pos.view(1, -1, 1, 1))
    # covers[b, m, g, t, n]: key n lies in slot t's block and is not in the future of row m.
    start = (idx * block_size).unsqueeze(-1)
    covers = (keys >= start) & (keys < start + block_size) & (keys <= pos.view(1, -1, 1, 1, 1))
    covers &= slot_ok.unsqueeze(-1)
    return covers.to(torch.float64).sum(dim=3)


def sequences(cu_seqlens: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of every packed sequence of cu_seqlens [S + 1], in order (empty ones included)."""
    bounds = [int(b) for b in cu_seqlens.tolist()]
    return list(zip(bounds[:-1], bounds[1:]))


def _one_by_one(fn, cu_seqlens, q, k, v, block_indices, block_counts, rest):
    """fn run on every packed sequence alone (rows and keys a:b, block ids relative to a), outputs joined:
    the tensors of shape [1, L, ...] along dim 1, the [1, H, L] ones (lse, delta) along dim 2."""
    results = []
    for a, b in sequences(cu_seqlens):
        if a == b:
            continue
        counts = block_counts[:, a:b] if isinstance(block_counts, torch.Tensor) else block_counts
        results.append(fn(q[:, a:b], k[:, a:b], v[:, a:b], *(t[:, a:b] if t.dim() == 4 else t[:, :, a:b]
                                                            for t in rest), block_indices[:, a:b], counts))
    if not results:                                            # no token at all: the unpacked call is empty too
        return fn(q, k, v, *rest, block_indices, block_counts)
    return tuple(torch.cat(parts, dim=1 if parts[0].dim() == 4 else 2) for parts in zip(*results))


def selection_attention_reference(q, k, v, block_indices, block_size, block_counts=None, scale=None,
                                  compute_dtype=torch.float64, cu_seqlens=None):
    """Selection attention forward, differentiable (autograd gives dq, dk, dv).

    Args:
        q: [B, M, H, D]; k: [B, N, G, D]; v: [B, N, G, Dv]; any float dtype (computed in compute_dtype).
        block_indices: [B, M, G, T] integer; -1 (any negative), future and out-of-range slots are skipped.
        block_size: BS, keys per block.
        block_counts: None, an int, or a [B, M, G] integer tensor; slots t >= count are skipped.
        scale: softmax scale, default D ** -0.5.
        compute_dtype: float64 for the oracle; float32 to time a plain torch implementation.
        cu_seqlens: None, or [S + 1] integer: B = 1 and M = N packed tokens, sequence s being tokens
            cu_seqlens[s] .. cu_seqlens[s + 1] - 1; every sequence is then computed alone (its block ids
            relative to its first token) and the results joined.
    Returns:
        o: [B, M, H, Dv] in compute_dtype; lse: [B, H, M] in compute_dtype (natural log, -inf for empty rows).
    """
    if cu_seqlens is not None:
        return _one_by_one(lambda q, k, v, idx, counts: selection_attention_reference(
            q, k, v, idx, block_size, counts, scale, compute_dtype), cu_seqlens, q, k, v, block_indices,
            block_counts, ())
    batch, m_rows, heads, head_dim = q.shape
    n, groups = k.shape[1], k.shape[2]
    hpg = heads // groups
    scale = head_dim ** -0.5 if scale is None else scale
    qc, kc, vc = (x.to(compute_dtype) for x in (q, k, v))
    w = key_weights(block_indices, block_size, n, block_counts).to(compute_dtype)      # [B, M, G, N]
    w = w.repeat_interleave(hpg, dim=2)                                                # [B, M, H, N]
    kh = kc.repeat_interleave(hpg, dim=2)                                              # [B, N, H, D]
    vh = vc.repeat_interleave(hpg, dim=2)
    s = torch.einsum("bmhd,bnhd->bmhn", qc, kh) * scale
    visible = w > 0
    empty = ~visible.any(dim=-1, keepdim=True)
    # A weight of w adds log(w) to the score. Empty rows get finite dummy logits so no NaN reaches autograd.
    logits = torch.where(visible, s + torch.log(torch.where(visible, w, torch.ones_like(w))),
                         torch.full_like(s, float("-inf")))
    logits = torch.where(empty, torch.zeros_like(logits), logits)
    lse_safe = torch.logsumexp(logits, dim=-1, keepdim=True)
    p = torch.where(visible, torch.exp(logits - lse_safe), torch.zeros_like(logits))
    o = torch.einsum("bmhn,bnhe->bmhe", p, vh)
    lse = torch.where(empty, torch.full_like(lse_safe, float("-inf")), lse_safe).squeeze(-1)
    return o, lse.permute(0, 2, 1).contiguous()


def selection_attention_backward_reference(q, k, v, o, lse, do, block_indices, block_size,
                                           block_counts=None, scale=None, cu_seqlens=None):
    """The two-stage backward written out (delta, then the formulas of semantics.md), in f64.

    Args:
        q, k, v, block_indices, block_size, block_counts, scale, cu_seqlens: as for the forward.
        o: [B, M, H, Dv]; lse: [B, H, M]; do: [B, M, H, Dv].
    Returns:
        delta [B, H, M], dq [B, M, H, D], dk [B, N, G, D], dv [B, N, G, Dv], all float64.
    """
    if cu_seqlens is not None:
        return _one_by_one(lambda q, k, v, o, lse, do, idx, counts: selection_attention_backward_reference(
            q, k, v, o, lse, do, idx, block_size, counts, scale), cu_seqlens, q, k, v, block_indices,
            block_counts, (o, lse, do))
    batch, m_rows, heads, head_dim = q.shape
    n, groups = k.shape[1], k.shape[2]
    hpg = heads // groups
    scale = head_dim ** -0.5 if scale is None else scale
    qd, kd, vd, od, dod = (x.to(torch.float64) for x in (q, k, v, o, do))
    lse_rows = lse.to(torch.float64).permute(0, 2, 1).unsqueeze(-1)                     # [B, M, H, 1]
    delta = (od * dod).sum(-1)                                                          # [B, M, H]
    w = key_weights(block_indices, block_size, n, block_counts).repeat_interleave(hpg, dim=2)
    kh = kd.repeat_interleave(hpg, dim=2)
    vh = vd.repeat_interleave(hpg, dim=2)
    s = torch.einsum("bmhd,bnhd->bmhn", qd, kh) * scale
    visible = w > 0
    p = torch.where(visible, w * torch.exp(s - torch.where(visible, lse_rows, torch.zeros_like(lse_rows))),
                    torch.zeros_like(s))
    dp = torch.einsum("bmhe,bnhe->bmhn", dod, vh)
    ds = p * (dp - delta.unsqueeze(-1))
    dq = scale * torch.einsum("bmhn,bnhd->bmhd", ds, kh)
    dk = scale * torch.einsum("bmhn,bmhd->bnhd", ds, qd).reshape(batch, n, groups, hpg, head_dim).sum(3)
    dv = torch.einsum("bmhn,bmhe->bnhe", p, dod).reshape(batch, n, groups, hpg, -1).sum(3)
    return delta.permute(0, 2, 1).contiguous(), dq, dk, dv


def block_lists_reference(block_indices: torch.Tensor, block_size: int, n: int, rows_per_piece: int):
    """The two-pass inversion's output layout, computed directly (oracle for mlir/inversion.mlir).

    For every flat block fb = (b * G + g) * NB + i, in order: the query rows m (increasing, each once) with
    a valid slot holding i, cut into pieces of rows_per_piece rows, stored as (c, fb) with
    c = (b * M + m) * G + g; unused rows of a piece and unused pieces hold (-1, -1).

    Args:
        block_indices: [B, M, G, T] integer tensor (block_counts already folded in as -1).
    Returns:
        entries [P, rows_per_piece, 2] int32 with P = B * G * (ceil(M * T / rows_per_piece) + NB),
        piece_start [B * G * NB] int32, piece_count [B * G * NB] int32.
    """
    batch, m_rows, groups, slots = block_indices.shape
    num_blocks = -(-n // block_size)
    pos = torch.arange(m_rows) + (n - m_rows)
    idx = block_indices.to(torch.int64).cpu()
    capacity = batch * groups * (-(-(m_rows * slots) // rows_per_piece) + num_blocks)
    entries = torch.full((capacity * rows_per_piece, 2), -1, dtype=torch.int32)
    starts, counts = [], []
    piece = 0
    for b in range(batch):
        for g in range(groups):
            valid = (idx[b, :, g] >= 0) & (idx[b, :, g] <= torch.div(pos, block_size, rounding_mode="floor")[:, None])
            for i in range(num_blocks):
                rows = torch.nonzero(((idx[b, :, g] == i) & valid).any(dim=1)).flatten()
                fb = (b * groups + g) * num_blocks + i
                pieces = -(-len(rows) // rows_per_piece)
                starts.append(piece)
                counts.append(pieces)
                at = piece * rows_per_piece
                entries[at:at + len(rows), 0] = ((b * m_rows + rows) * groups + g).to(torch.int32)
                entries[at:at + len(rows), 1] = fb
                piece += pieces
    return (entries.view(capacity, rows_per_piece, 2), torch.tensor(starts, dtype=torch.int32),
            torch.tensor(counts, dtype=torch.int32))
