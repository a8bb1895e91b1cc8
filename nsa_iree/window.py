"""NSA's sliding-window branch: every query row attends to the window_size keys that end at its position.

It runs on the selection stages with KernelSpec.window: each row lists the blocks its window touches and the
kernels mask the keys outside the window (kernels/common/rules.mlir). On NVIDIA the forward and dq run on the
dense kernels over the band of keys and dk/dv on the selection kernel, on the CPU and gfx950 on their selection
kernels (kernels.choose: the CPU ones, the portable ones); gfx942's recipe names no hand-written forward, dq or
dk/dv, so there the linalg stages run it (correct, not yet fast).
"""

from __future__ import annotations

import functools

import torch

from . import api, validate
from .packing import check_cu_seqlens_values

# Keys per block of the window's block lists (a block size every target's kernels and linalg stages take).
WINDOW_BLOCK = 64


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_size: int,
                             scale: float | None = None, *, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention over a sliding window: the row at position p attends to keys p - window_size + 1 .. p.

    Args:
        q: [B, M, H, D] float32, float16 or bfloat16; the rows are the last M of N positions, row m at
            p = m + N - M.
        k: [B, N, G, D] and v: [B, N, G, Dv] in q's dtype; H a multiple of G.
        window_size: W >= 1, keys per window (fla's flash-attn window (W - 1, 0)).
        scale: the softmax scale, default D ** -0.5.
        cu_seqlens: None, or [S + 1] int32 with B = 1 and M = N packed tokens: every sequence alone.
    Returns:
        o [B, M, H, Dv] in q's dtype (0 for a row before position 0). Differentiable in q, k and v; the backward
        is the two-pass one, without atomics (bitwise reproducible).

    Raises a TypeError or ValueError naming the argument for bad input, before anything compiles.
    """
    return sliding_window_attention_fwd(q, k, v, window_size, scale, cu_seqlens=cu_seqlens)[0]


def sliding_window_attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_size: int,
                                 scale: float | None = None, *,
                                 cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """sliding_window_attention's o [B, M, H, Dv] and lse [B, H, M] float32 (natural log, -inf for a row that
    sees no key); differentiable in q, k, v through o."""
    validate.check_sliding_window(q, k, v, window_size, scale, cu_seqlens)
    if cu_seqlens is not None and not torch.compiler.is_compiling():
        check_cu_seqlens_values(cu_seqlens, q.shape[1])
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    q, k, v = api._autocast(q, k, v)
    return torch.ops.nsa_iree.sliding_window_fwd(q, k, v, window_size, scale, cu_seqlens)


@torch.library.custom_op("nsa_iree::sliding_window_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_size: int, scale: float,
            cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """o [B, M, H, Dv] (q's dtype) and lse [B, H, M] (float32)."""
    if cu_seqlens is None:
        return _forward(q, k, v, window_size, scale)
    outs = [_forward(q[:, a:b], k[:, a:b], v[:, a:b], window_size, scale)
            for a, b in _sequences(cu_seqlens, q.shape[1])]
    if not outs:
        return _forward(q, k, v, window_size, scale)
    return torch.cat([o for o, _ in outs], dim=1), torch.cat([lse for _, lse in outs], dim=2)


@_fwd_op.register_fake
def _fwd_fake(q, k, v, window_size, scale, cu_seqlens=None):
    batch, m_rows, heads, _ = q.shape
    return q.new_empty(batch, m_rows, heads, v.shape[3]), q.new_empty(batch, heads, m_rows, dtype=torch.float32)


@torch.library.custom_op("nsa_iree::sliding_window_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
            lse: torch.Tensor, window_size: int, scale: float,
            cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv in q's dtype."""
    if cu_seqlens is None:
        return _backward(do, q, k, v, o, lse, window_size, scale)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for a, b in _sequences(cu_seqlens, q.shape[1]):
        dq[:, a:b], dk[:, a:b], dv[:, a:b] = _backward(do[:, a:b], q[:, a:b], k[:, a:b], v[:, a:b], o[:, a:b],
                                                       lse[:, :, a:b], window_size, scale)
    return dq, dk, dv


@_bwd_op.register_fake
def _bwd_fake(do, q, k, v, o, lse, window_size, scale, cu_seqlens=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, window_size, scale, cu_seqlens = inputs
    ctx.save_for_backward(q, k, v, *output, cu_seqlens)
    ctx.window_size, ctx.scale = window_size, scale
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)     # no zeros made for lse (api.py: _fwd_setup_context)


def _fwd_backward(ctx, do, _dlse):
    if do is None:
        return (None,) * 6
    q, k, v, o, lse, cu_seqlens = ctx.saved_tensors
    dq, dk, dv = torch.ops.nsa_iree.sliding_window_bwd(do, q, k, v, o, lse, ctx.window_size, ctx.scale, cu_seqlens)
    return dq, dk, dv, None, None, None


api.register_operator_pair("sliding_window", _fwd_op, _bwd_op, _fwd_backward, _setup_context, (0, 1, 2),
                           (0, 1, 2, 3, 4))


def _sequences(cu_seqlens: torch.Tensor, total: int) -> list[tuple[int, int]]:
    """(a, b): the tokens of every non-empty packed sequence, its values checked against `total` tokens."""
    bounds = check_cu_seqlens_values(cu_seqlens, total)
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def window_slots(window: int) -> int:
    """T of a window of `window` keys: the most blocks of WINDOW_BLOCK keys it spans (one module per window,
    whatever the lengths: the slots a short sequence does not reach are -1)."""
    return (window + WINDOW_BLOCK - 2) // WINDOW_BLOCK + 1


@functools.lru_cache(maxsize=8)
def _band_indices(batch: int, m_rows: int, n: int, groups: int, window: int, device) -> torch.Tensor:
    """[B, M, G, T] int32: the blocks of WINDOW_BLOCK keys the window of each row touches, in increasing order,
    -1 past them (and for rows before position 0); T = window_slots(W). Made once per shape (the kernels only
    read it)."""
    bs = WINDOW_BLOCK
    slots = window_slots(window)
    pos = torch.arange(m_rows, device=device) + (n - m_rows)
    first = (pos - window + 1).clamp(min=0) // bs
    last = torch.div(pos, bs, rounding_mode="floor")
    idx = first.view(-1, 1) + torch.arange(slots, device=device)
    idx = torch.where((idx <= last.view(-1, 1)) & (pos.view(-1, 1) >= 0), idx, -1).to(torch.int32)
    return idx.view(1, m_rows, 1, slots).expand(batch, m_rows, groups, slots).contiguous()


def _forward(q, k, v, window, scale):
    batch, m_rows, heads, _ = q.shape
    o = api.output_buffer((batch, m_rows, heads, v.shape[3]), q)
    lse = api.output_buffer((batch, heads, m_rows), q, torch.float32)
    if 0 in (batch, m_rows):
        return o, lse
    idx = _band_indices(batch, m_rows, k.shape[1], k.shape[2], window, q.device)
    api.forward_into(o, lse, q.contiguous(), k.contiguous(), v.contiguous(), idx, WINDOW_BLOCK, scale,
                     window=window)
    return o, lse


def _backward(do, q, k, v, o, lse, window, scale):
    batch, m_rows = q.shape[:2]
    if 0 in (batch, m_rows):
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dq, dk, dv = api.output_buffer(q.shape, q), api.output_buffer(k.shape, k), api.output_buffer(v.shape, v)
    idx = _band_indices(batch, m_rows, k.shape[1], k.shape[2], window, q.device)
    api.backward_into(dq, dk, dv, q.contiguous(), k.contiguous(), v.contiguous(), o.contiguous(), lse.contiguous(),
                      do.contiguous(), idx, WINDOW_BLOCK, scale, "two-pass", window=window,
                      fixed_blocks=True)
    return dq, dk, dv
