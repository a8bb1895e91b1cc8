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
    # A weight of w adds log(w) to the score.
    return _masked_attention(s + torch.log(torch.where(visible, w, torch.ones_like(w))), visible, vh)


def _masked_attention(s: torch.Tensor, visible: torch.Tensor, vh: torch.Tensor):
    """o [B, M, H, Dv] and lse [B, H, M] of scores s [B, M, H, N] where `visible`, values vh [B, N, H, Dv]; a row
    that sees nothing gets o = 0 and lse = -inf (its logits finite dummies, so no NaN reaches autograd)."""
    empty = ~visible.any(dim=-1, keepdim=True)
    logits = torch.where(visible, s, torch.full_like(s, float("-inf")))
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
    """The two-pass inversion's output layout, computed directly (oracle for kernels/common/inversion.mlir).

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


# ---------------------------------------------------------------------------------------------------------------
# The compression branch and the top-n block selection (docs/semantics.md, "The compression branch").
# Written from that page alone, dense ([B, M, H, C] scores), every sum in float64.


def _num_blocks(length: int, block_size: int) -> int:
    """ceil(length / block_size): the blocks of a sequence of `length` tokens (0 for an empty one)."""
    return -(-length // block_size)


def _packed(fn, cu_seqlens: torch.Tensor, block_size: int, rows: tuple, heads: tuple, blocks: tuple,
            dims: tuple[int, ...]):
    """fn run on every packed sequence alone, its outputs joined.

    Sequence s (tokens a..b) gets rows[i][:, a:b], heads[i][:, :, a:b] and blocks[i][:, f:f + ceil((b - a) / BS)],
    f being the sum of ceil(L_r / BS) over the sequences before it (the layout mean_pooling_reference gives);
    fn(rows, heads, blocks, length) returns a tuple whose i-th entry is joined along dims[i]. With no token at
    all fn runs once on the whole (empty) inputs.
    """
    results = []
    first = 0
    for a, b in sequences(cu_seqlens):
        c = _num_blocks(b - a, block_size)
        if a < b:
            results.append(fn(tuple(t[:, a:b] for t in rows), tuple(t[:, :, a:b] for t in heads),
                              tuple(t[:, first:first + c] for t in blocks), b - a))
        first += c
    if not results:
        return fn(rows, heads, blocks, rows[0].shape[1])
    return tuple(torch.cat(parts, dim=d) for parts, d in zip(zip(*results), dims))


def mean_pooling_reference(x: torch.Tensor, block_size: int, cu_seqlens: torch.Tensor | None = None,
                           compute_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The mean of every block of block_size tokens; a sequence's last block is the mean of the tokens it has.

    Args:
        x: [B, N, G, D], any float dtype (computed in compute_dtype); differentiable.
        block_size: BS, tokens per block.
        cu_seqlens: None, or [S + 1] integer with B = 1: x holds S packed sequences, sequence s being tokens
            cu_seqlens[s] .. cu_seqlens[s + 1] - 1; each is pooled alone and its ceil(L_s / BS) blocks follow
            those of the sequences before it (an empty sequence has none).
        compute_dtype: float64 for the oracle.
    Returns:
        [B, C, G, D] in compute_dtype, C = ceil(N / BS) (with cu_seqlens: the sum of ceil(L_s / BS)).
    """
    if cu_seqlens is not None:
        return _packed(lambda rows, heads, blocks, length: (mean_pooling_reference(rows[0], block_size,
                                                                                   None, compute_dtype),),
                       cu_seqlens, block_size, (x,), (), (), (1,))[0]
    batch, n, groups, dim = x.shape
    c = _num_blocks(n, block_size)
    xc = x.to(compute_dtype)
    padded = torch.cat([xc, xc.new_zeros(batch, c * block_size - n, groups, dim)], dim=1)
    sums = padded.reshape(batch, c, block_size, groups, dim).sum(dim=2)
    counts = (n - torch.arange(c, device=x.device) * block_size).clamp(max=block_size).to(compute_dtype)
    return sums / counts.view(1, c, 1, 1)


def compressed_positions(m_rows: int, seq_len: int | None) -> torch.Tensor:
    """pos(m) = m + N - M of every query row, [M] int64 (N = seq_len, default M)."""
    n = m_rows if seq_len is None else seq_len
    return torch.arange(m_rows) + (n - m_rows)


def compressed_visible(pos: torch.Tensor, num_blocks: int, block_size: int) -> torch.Tensor:
    """[M, C] bool: row at pos sees compressed block c iff the block is complete, (c + 1) * BS - 1 <= pos."""
    c = torch.arange(num_blocks, device=pos.device)
    return (c + 1) * block_size - 1 <= pos.view(-1, 1)


def _compressed_scores(q, k_cmp, scale, compute_dtype):
    """s[b, m, h, c] = scale * q[b, m, h] . k_cmp[b, c, h // (H / G)], in compute_dtype."""
    hpg = q.shape[2] // k_cmp.shape[2]
    scale = q.shape[3] ** -0.5 if scale is None else scale
    kh = k_cmp.to(compute_dtype).repeat_interleave(hpg, dim=2)                           # [B, C, H, D]
    return torch.einsum("bmhd,bchd->bmhc", q.to(compute_dtype), kh) * scale


def compressed_attention_reference(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, block_size: int,
                                   scale: float | None = None, seq_len: int | None = None,
                                   cu_seqlens: torch.Tensor | None = None,
                                   compute_dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Compressed attention forward, differentiable in q, k_cmp and v_cmp (rows that see nothing get zeros).

    Args:
        q: [B, M, H, D]; k_cmp: [B, C, G, D]; v_cmp: [B, C, G, Dv]; any float dtype (computed in compute_dtype).
            Query head h reads kv head h // (H / G).
        block_size: BS; compressed block c stands for keys c * BS .. c * BS + BS - 1.
        scale: softmax scale, default D ** -0.5.
        seq_len: N, default M: row m stands at pos(m) = m + N - M and sees block c iff (c + 1) * BS - 1 <= pos(m).
        cu_seqlens: None, or [S + 1] integer: B = 1, q holds M = total packed tokens and k_cmp, v_cmp the
            sequences' blocks one after another (as mean_pooling_reference(..., cu_seqlens) lays them out);
            every sequence is computed alone, its rows at positions 0 .. L_s - 1 seeing its own blocks only.
        compute_dtype: float64 for the oracle.
    Returns:
        o: [B, M, H, Dv] in compute_dtype (0 for a row that sees no block);
        lse: [B, H, M] in compute_dtype, natural log (-inf for a row that sees no block).
    """
    if cu_seqlens is not None:
        return _packed(lambda rows, heads, blocks, length: compressed_attention_reference(
            rows[0], blocks[0], blocks[1], block_size, scale, length, None, compute_dtype),
            cu_seqlens, block_size, (q,), (), (k_cmp, v_cmp), (1, 2))
    hpg = q.shape[2] // k_cmp.shape[2]
    s = _compressed_scores(q, k_cmp, scale, compute_dtype)                             # [B, M, H, C]
    visible = compressed_visible(compressed_positions(q.shape[1], seq_len).to(q.device), k_cmp.shape[1],
                                 block_size).view(1, q.shape[1], 1, k_cmp.shape[1])
    empty = ~visible.any(dim=-1, keepdim=True)
    # Rows that see nothing get finite dummy logits, so that no NaN reaches autograd; their p is 0.
    logits = torch.where(visible, s, torch.full_like(s, float("-inf")))
    logits = torch.where(empty, torch.zeros_like(logits), logits)
    lse_safe = torch.logsumexp(logits, dim=-1, keepdim=True)
    p = torch.where(visible, torch.exp(logits - lse_safe), torch.zeros_like(logits))
    vh = v_cmp.to(compute_dtype).repeat_interleave(hpg, dim=2)                           # [B, C, H, Dv]
    o = torch.einsum("bmhc,bche->bmhe", p, vh)
    lse = torch.where(empty, torch.full_like(lse_safe, float("-inf")), lse_safe).squeeze(-1)
    return o, lse.permute(0, 2, 1).contiguous()


def compressed_attention_backward_reference(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor,
                                            o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor, block_size: int,
                                            scale: float | None = None, seq_len: int | None = None,
                                            cu_seqlens: torch.Tensor | None = None):
    """The backward of compressed attention written out (delta, then the formulas of semantics.md), in f64.

    Args:
        q, k_cmp, v_cmp, block_size, scale, seq_len, cu_seqlens: as for compressed_attention_reference.
        o: [B, M, H, Dv]; lse: [B, H, M] (-inf where a row sees no block); do: [B, M, H, Dv]; any float dtype.
    Returns:
        delta [B, H, M], dq [B, M, H, D], dk_cmp [B, C, G, D], dv_cmp [B, C, G, Dv], all float64; a row that
        sees no block has dq = 0 and adds nothing to dk_cmp and dv_cmp.
    """
    if cu_seqlens is not None:
        return _packed(lambda rows, heads, blocks, length: compressed_attention_backward_reference(
            rows[0], blocks[0], blocks[1], rows[1], heads[0], rows[2], block_size, scale, length),
            cu_seqlens, block_size, (q, o, do), (lse,), (k_cmp, v_cmp), (2, 1, 1, 1))
    batch, m_rows, heads, head_dim = q.shape
    num_blocks, groups = k_cmp.shape[1], k_cmp.shape[2]
    hpg = heads // groups
    scale = head_dim ** -0.5 if scale is None else scale
    qd, kd, vd, od, dod = (x.to(torch.float64) for x in (q, k_cmp, v_cmp, o, do))
    delta = (od * dod).sum(-1)                                                          # [B, M, H]
    kh = kd.repeat_interleave(hpg, dim=2)
    vh = vd.repeat_interleave(hpg, dim=2)
    s = torch.einsum("bmhd,bchd->bmhc", qd, kh) * scale
    visible = compressed_visible(compressed_positions(m_rows, seq_len).to(q.device), num_blocks,
                                 block_size).view(1, m_rows, 1, num_blocks)
    lse_rows = lse.to(torch.float64).permute(0, 2, 1).unsqueeze(-1)                     # [B, M, H, 1]
    lse_rows = torch.where(torch.isfinite(lse_rows), lse_rows, torch.zeros_like(lse_rows))
    p = torch.where(visible, torch.exp(s - lse_rows), torch.zeros_like(s))
    dp = torch.einsum("bmhe,bche->bmhc", dod, vh)
    ds = p * (dp - delta.unsqueeze(-1))
    dq = scale * torch.einsum("bmhc,bchd->bmhd", ds, kh)
    dk = scale * torch.einsum("bmhc,bmhd->bchd", ds, qd).reshape(batch, num_blocks, groups, hpg, head_dim).sum(3)
    dv = torch.einsum("bmhc,bmhe->bche", p, dod).reshape(batch, num_blocks, groups, hpg, vd.shape[3]).sum(3)
    return delta.permute(0, 2, 1).contiguous(), dq, dk, dv


def block_scores_reference(q: torch.Tensor, k_cmp: torch.Tensor, block_size: int, scale: float | None = None,
                           lse: torch.Tensor | None = None, seq_len: int | None = None) -> torch.Tensor:
    """The importance of every compressed block for every (row, kv head); one sequence (no cu_seqlens).

    score[b, m, g, c] = the mean over the H / G query heads h of group g of exp(s[b, m, h, c] - lse[b, h, m]),
    the probability of block c in the row's compressed attention, for the blocks the row sees; NaN elsewhere
    (a score that is not defined).

    Args:
        q: [B, M, H, D]; k_cmp: [B, C, G, D]; block_size, scale, seq_len: as for compressed_attention_reference.
        lse: None (computed here) or [B, H, M] (that of compressed_attention on these inputs), any float dtype.
    Returns:
        [B, M, G, C] float64.
    """
    batch, m_rows, heads, _ = q.shape
    num_blocks, groups = k_cmp.shape[1], k_cmp.shape[2]
    s = _compressed_scores(q, k_cmp, scale, torch.float64)                             # [B, M, H, C]
    visible = compressed_visible(compressed_positions(m_rows, seq_len).to(q.device), num_blocks,
                                 block_size).view(1, m_rows, 1, num_blocks)
    if lse is None:
        lse_rows = torch.logsumexp(torch.where(visible, s, torch.full_like(s, float("-inf"))), dim=-1)
    else:
        lse_rows = lse.to(torch.float64).permute(0, 2, 1)                                # [B, M, H]
    p = torch.exp(s - lse_rows.unsqueeze(-1))
    score = p.reshape(batch, m_rows, groups, heads // groups, num_blocks).mean(dim=3)
    return torch.where(visible, score, torch.full_like(score, float("nan")))


def block_counts_width(block_counts: torch.Tensor | int) -> int:
    """S, the slots of select_blocks' output: block_counts itself (an int), or its maximum (0 if it is empty)."""
    if isinstance(block_counts, int):
        return max(block_counts, 0)
    return max(int(block_counts.max()), 0) if block_counts.numel() else 0


def select_blocks_reference(q: torch.Tensor, k_cmp: torch.Tensor, block_counts: torch.Tensor | int,
                            block_size: int, scale: float | None = None, lse: torch.Tensor | None = None,
                            seq_len: int | None = None, cu_seqlens: torch.Tensor | None = None,
                            width: int | None = None) -> torch.Tensor:
    """NSA's top-n block selection: block_indices for selection_attention_reference.

    Row m (position p = pos(m)) and kv head g rank the blocks it may select, c = 0 .. p // BS, in this order:
    its own block p // BS, then p // BS - 1, then block 0 (the forced blocks, each once), then every other one
    by descending score (block_scores_reference), equal scores to the lower block id, NaN scores last. It keeps
    the first count of them, count being block_counts (or block_counts[b, m, g]; below 0 counts as 0), in that
    order in slots 0, 1, ...; the slots left over hold -1. A row with p < 0 selects nothing.

    Args:
        q: [B, M, H, D]; k_cmp: [B, C, G, D]; block_size, scale, seq_len, cu_seqlens: as for
            compressed_attention_reference (with cu_seqlens the ids are relative to each sequence).
        block_counts: an int or a [B, M, G] integer tensor.
        lse: None or [B, H, M]: compressed attention's lse, reused for the scores.
        width: S; default block_counts_width(block_counts).
    Returns:
        [B, M, G, S] int32.
    """
    width = block_counts_width(block_counts) if width is None else width
    if cu_seqlens is not None:
        counts = (block_counts,) if isinstance(block_counts, torch.Tensor) else ()
        return _packed(lambda rows, heads, blocks, length: (select_blocks_reference(
            rows[0], blocks[0], rows[1] if counts else block_counts, block_size, scale,
            heads[0] if lse is not None else None, length, None, width),),
            cu_seqlens, block_size, (q, *counts), () if lse is None else (lse,), (k_cmp,), (1,))[0]
    batch, m_rows, _, _ = q.shape
    groups = k_cmp.shape[2]
    pos = compressed_positions(m_rows, seq_len).to(q.device).view(1, m_rows, 1, 1)
    own = torch.div(pos, block_size, rounding_mode="floor")
    c = torch.arange(max(k_cmp.shape[1], int(own.max()) + 1 if m_rows else 0), device=q.device)
    score = block_scores_reference(q, k_cmp, block_size, scale, lse, seq_len)
    score = torch.cat([score, score.new_full((*score.shape[:3], len(c) - score.shape[3]), float("nan"))], dim=3)
    selectable = (c * block_size <= pos).expand(batch, m_rows, groups, len(c))
    forced_rank = torch.where(c == own, 0, torch.where(c == own - 1, 1, torch.where(c == 0, 2, -1)))
    forced = (forced_rank >= 0) & selectable
    # Tiers: 0 forced, 1 by score, 2 not selectable. Within a tier the key: the forced rank, or -score (NaN
    # sorts last). Stable sorts, the least significant key first, keep the lower block id first among equals.
    tier = torch.where(forced, 0, torch.where(selectable, 1, 2))
    key = torch.where(forced, forced_rank.to(torch.float64).expand_as(score), -score)
    order = torch.sort(key, dim=-1, stable=True).indices
    order = order.gather(-1, torch.sort(tier.gather(-1, order), dim=-1, stable=True).indices)
    ranked = torch.where(tier.gather(-1, order) < 2, order, torch.full_like(order, -1))
    if ranked.shape[-1] < width:
        ranked = torch.cat([ranked, ranked.new_full((*ranked.shape[:3], width - ranked.shape[-1]), -1)], dim=-1)
    ranked = ranked[..., :width]
    if isinstance(block_counts, int):
        count = torch.full((batch, m_rows, groups), block_counts, device=q.device)
    else:
        count = block_counts.to(device=q.device, dtype=torch.int64)
    slot = torch.arange(width, device=q.device)
    return torch.where(slot < count.unsqueeze(-1), ranked, torch.full_like(ranked, -1)).to(torch.int32)


def nsa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g_cmp: torch.Tensor | None = None,
                  g_slc: torch.Tensor | None = None, g_swa: torch.Tensor | None = None,
                  block_indices: torch.Tensor | None = None, block_counts: torch.Tensor | int = 16,
                  block_size: int = 64, window_size: int = 0, scale: float | None = None,
                  cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """The NSA layer (fla's parallel_nsa), from the branch oracles, differentiable in every floating input (the
    selected blocks are constants).

    k_cmp, v_cmp = mean_pooling_reference(k, v); o_cmp, lse_cmp = compressed_attention_reference (when g_cmp is
    given or the blocks are to be selected); block_indices = select_blocks_reference(q, k_cmp, block_counts, lse
    = lse_cmp) unless given (then block_counts limits its slots); o_slc = selection_attention_reference;
    o = o_slc * g_slc (o_slc alone without g_slc) + o_cmp * g_cmp (with g_cmp) + o_swa * g_swa (with
    window_size > 0: sliding_window_attention_reference). Shapes as nsa_iree.nsa's; the result [B, M, H, Dv] in
    float64.
    """
    n = k.shape[1]
    o_cmp = None
    if g_cmp is not None or block_indices is None:
        k_cmp = mean_pooling_reference(k, block_size, cu_seqlens)
        v_cmp = mean_pooling_reference(v, block_size, cu_seqlens)
        o_cmp, lse_cmp = compressed_attention_reference(q, k_cmp, v_cmp, block_size, scale, n, cu_seqlens)
        if block_indices is None:
            block_indices = select_blocks_reference(q.detach(), k_cmp.detach(), block_counts, block_size, scale,
                                                    lse_cmp.detach(), n, cu_seqlens)
            block_counts = None
    o, _ = selection_attention_reference(q, k, v, block_indices, block_size, block_counts, scale,
                                         cu_seqlens=cu_seqlens)
    if g_slc is not None:
        o = o * g_slc.to(o.dtype).unsqueeze(-1)
    if g_cmp is not None:
        o = o + o_cmp * g_cmp.to(o.dtype).unsqueeze(-1)
    if window_size > 0:
        o_swa, _ = sliding_window_attention_reference(q, k, v, window_size, scale, cu_seqlens)
        o = o + o_swa * g_swa.to(o.dtype).unsqueeze(-1)
    return o


def sliding_window_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_size: int,
                                       scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
                                       compute_dtype: torch.dtype = torch.float64):
    """Sliding-window attention, differentiable: row m at pos(m) = m + N - M sees key j iff
    pos(m) - window_size < j <= pos(m).

    Args:
        q: [B, M, H, D]; k: [B, N, G, D]; v: [B, N, G, Dv]; any float dtype (computed in compute_dtype).
        window_size: W >= 1; scale: default D ** -0.5.
        cu_seqlens: None, or [S + 1] integer: B = 1, M = N packed tokens, every sequence alone.
    Returns:
        o [B, M, H, Dv] and lse [B, H, M] (natural log, -inf for a row that sees no key), in compute_dtype.
    """
    if cu_seqlens is not None:
        outs = [sliding_window_attention_reference(q[:, a:b], k[:, a:b], v[:, a:b], window_size, scale, None,
                                                   compute_dtype) for a, b in sequences(cu_seqlens)]
        if not outs:
            return (q.new_zeros(*q.shape[:3], v.shape[3], dtype=compute_dtype),
                    q.new_full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), dtype=compute_dtype))
        return torch.cat([o for o, _ in outs], dim=1), torch.cat([lse for _, lse in outs], dim=2)
    batch, m_rows, heads, head_dim = q.shape
    n, groups = k.shape[1], k.shape[2]
    hpg = heads // groups
    scale = head_dim ** -0.5 if scale is None else scale
    qc, kc, vc = (x.to(compute_dtype) for x in (q, k, v))
    kh, vh = kc.repeat_interleave(hpg, dim=2), vc.repeat_interleave(hpg, dim=2)
    s = torch.einsum("bmhd,bnhd->bmhn", qc, kh) * scale
    pos = (torch.arange(m_rows, device=q.device) + (n - m_rows)).view(1, m_rows, 1, 1)
    j = torch.arange(n, device=q.device).view(1, 1, 1, n)
    visible = ((j <= pos) & (j > pos - window_size)).expand_as(s)
    return _masked_attention(s, visible, vh)
