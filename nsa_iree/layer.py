"""The whole NSA layer: :func:`nsa` (fla's ``parallel_nsa`` semantics: the compression branch, the top-n block
selection, the selection branch and their gates) and :class:`NativeSparseAttention`, the ``nn.Module`` a model
uses (projections, rotary embedding, the gates through a sigmoid, :func:`nsa`, the output projection).

The branches are the package's operators (nsa_iree.compression, nsa_iree.api), so a model of these layers trains
with exact gradients through every branch and the pooling, traces with ``torch.compile(fullgraph=True)`` and runs
under autocast. The gating is one kernel each way (kernels/common/gates.mlir). The sliding window has
hand-written kernels on NVIDIA, the CPU and gfx950; on gfx942 it runs on the linalg stages for now
(nsa_iree.window).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import api, compression, validate, window

BlockCounts = int | torch.Tensor


def nsa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g_cmp: torch.Tensor | None = None,
        g_slc: torch.Tensor | None = None, g_swa: torch.Tensor | None = None,
        block_indices: torch.Tensor | None = None, block_counts: BlockCounts = 16, block_size: int = 64,
        window_size: int = 0, scale: float | None = None, *, cu_seqlens: torch.Tensor | None = None,
        variant: str = "two-pass") -> torch.Tensor:
    """Native Sparse Attention: o = o_slc g_slc + o_cmp g_cmp + o_swa g_swa (fla's parallel_nsa).

    Args:
        q: [B, M, H, D] float32, float16 or bfloat16; the rows are the last M of N positions.
        k: [B, N, G, D] and v: [B, N, G, Dv] in q's dtype; H a multiple of G.
        g_cmp: None or [B, M, H] in q's dtype: the compression branch's gate (already through the caller's
            sigmoid); None leaves the branch out of o (it is still computed when it selects the blocks).
        g_slc: None or [B, M, H]: the selection branch's gate; None adds o_slc ungated.
        g_swa: None or [B, M, H]: the sliding window's gate (with window_size > 0).
        block_indices: None (select_blocks on the compressed attention's probabilities), or [B, M, G, S] int32
            or int64 block ids, as selection_attention takes them (then block_counts limits their slots).
        block_counts: an int or a [B, M, G] integer tensor: the blocks each (row, kv head) keeps.
        block_size: BS, the compression's block size and the selection's.
        window_size: W, the sliding window's keys (nsa_iree.sliding_window_attention, gated by g_swa); 0: none.
        scale: the softmax scale of every branch, default D ** -0.5.
        cu_seqlens: None, or [S + 1] int32 with B = 1 and M = N packed tokens: every sequence alone.
        variant: the selection branch's backward, "two-pass" (bitwise reproducible) or "one-pass".
    Returns:
        o [B, M, H, Dv] in q's dtype: the branches' gated sum in float32, rounded once. Differentiable in q, k, v
        (through every branch and the pooling) and the gates; the selected blocks are constants.

    Raises a TypeError or ValueError naming the argument for bad input, before anything compiles.
    """
    validate.check_nsa(q, k, v, g_cmp, g_slc, g_swa, block_indices, block_counts, block_size, window_size, scale,
                       cu_seqlens, variant)
    if block_indices is None and not torch.compiler.is_compiling():
        # select_blocks' kernel for this target and layout, before the compression branch runs
        width = block_counts if isinstance(block_counts, int) else int(block_counts.max())
        compression._select_spec(api._autocast(q.detach())[0], k.shape[2], block_size, max(width, 1))
    n = k.shape[1]
    o_cmp = None
    if g_cmp is not None or block_indices is None:
        k_cmp = compression.mean_pooling(k, block_size, cu_seqlens=cu_seqlens)
        v_cmp = compression.mean_pooling(v, block_size, cu_seqlens=cu_seqlens)
        o_cmp, lse_cmp = compression.compressed_attention(q, k_cmp, v_cmp, block_size, scale, seq_len=n,
                                                          cu_seqlens=cu_seqlens)
        if block_indices is None:
            block_indices = compression.select_blocks(q, k_cmp, block_counts, block_size, scale, lse=lse_cmp,
                                                      seq_len=n, cu_seqlens=cu_seqlens)
            block_counts = None                 # select_blocks kept each row's count, -1 in the rest
    o_slc = api.selection_attention(q, k, v, block_indices, block_size, block_counts, scale, variant,
                                    cu_seqlens=cu_seqlens)
    # the gates under autocast take the branches' dtype, as the operators' inputs do (api._autocast)
    g_cmp, g_slc, g_swa = (None if g is None else api._autocast(g)[0] for g in (g_cmp, g_slc, g_swa))
    branches = [o_slc, g_slc]
    if g_cmp is not None:
        branches += [o_cmp, g_cmp]
    if window_size > 0:
        branches += [window.sliding_window_attention(q, k, v, window_size, scale, cu_seqlens=cu_seqlens), g_swa]
    return gated_sum(*branches)


def gated_sum(*branches: torch.Tensor | None) -> torch.Tensor:
    """o = sum over the branches of o_i g_i, in float32 and rounded once: the layer's gating, one kernel each way
    (kernels/common/gates.mlir).

    Args:
        branches: o_1, g_1, o_2, g_2, ... for 1 to 3 branches: each o_i [B, M, H, Dv] and g_i [B, M, H] or None
            (o_i ungated), all in one dtype and on one device.
    Returns:
        o [B, M, H, Dv] in the branches' dtype. Differentiable in every o_i and g_i: do_i = do g_i and
        dg_i = sum over Dv of do o_i, each in float32 and rounded once to the input's dtype.
    """
    outs, gates = list(branches[0::2]), list(branches[1::2])
    validate.check_gated_sum(outs, gates)
    if len(outs) == 1 and gates[0] is None:
        return outs[0]
    ones = None
    for i, g in enumerate(gates):
        if g is None:              # an ungated branch: weight 1 (its gradient never asked for)
            ones = torch.ones(outs[i].shape[:3], dtype=outs[i].dtype, device=outs[i].device) if ones is None else ones
            gates[i] = ones
    return torch.ops.nsa_iree.gated_sum(outs, gates)


def _gates_module(o: torch.Tensor):
    """The gating's compiled module for o's heads, Dv, dtype and device (the spec's other fields are unused)."""
    from .spec import KernelSpec, target_cpu_from_environment

    target = api._target_for(o.device)
    spec = KernelSpec(heads=o.shape[2], kv_heads=1, head_dim=o.shape[3], value_dim=o.shape[3],
                      dtype=api._DTYPE_NAME[o.dtype], target=target,
                      target_cpu=target_cpu_from_environment() if target == "cpu" else "host")
    return api.kernels(spec, "gates", o.device)


@torch.library.custom_op("nsa_iree::gated_sum", mutates_args=())
def _gated_sum_op(outs: list[torch.Tensor], gates: list[torch.Tensor]) -> torch.Tensor:
    """o [B, M, H, Dv] = sum_i outs[i] gates[i] (float32, rounded once)."""
    o = api.output_buffer(outs[0].shape, outs[0])
    if o.numel():
        pairs = [t.contiguous() for pair in zip(outs, gates) for t in pair]
        _gates_module(o).call(f"gated_sum_{len(outs)}", *pairs, o)
    return o


@_gated_sum_op.register_fake
def _gated_sum_fake(outs, gates):
    return torch.empty_like(outs[0])


@torch.library.custom_op("nsa_iree::gated_sum_bwd", mutates_args=())
def _gated_sum_bwd_op(do: torch.Tensor, outs: list[torch.Tensor], gates: list[torch.Tensor],
                      gate_grads: list[bool]) -> list[torch.Tensor]:
    """[do g_i for every branch] + [sum over Dv of do o_i for the branches whose gate_grads is set]."""
    d_outs = [api.output_buffer(do.shape, do) for _ in outs]
    wanted = [o for o, want in zip(outs, gate_grads) if want]
    if not do.numel():
        return d_outs + [torch.zeros(o.shape[:3], dtype=o.dtype, device=o.device) for o in wanted]
    do = do.contiguous()
    module = _gates_module(do)
    module.call(f"gate_products_{len(outs)}", do, *[g.contiguous() for g in gates], *d_outs)
    d_gates = [api.output_buffer(o.shape[:3], o) for o in wanted]
    for o, dg in zip(wanted, d_gates):
        module.call("gate_dot", o.contiguous(), do, dg, wait_for_torch=False)
    return d_outs + d_gates


@_gated_sum_bwd_op.register_fake
def _gated_sum_bwd_fake(do, outs, gates, gate_grads):
    return [torch.empty_like(do) for _ in outs] + [o.new_empty(o.shape[:3]) for o, w in zip(outs, gate_grads) if w]


def _gated_sum_setup(ctx, inputs, output):
    outs, gates = inputs
    ctx.gate_grads = [g.requires_grad for g in gates]
    ctx.save_for_backward(*outs, *gates)


def _gated_sum_backward(ctx, do):
    saved = ctx.saved_tensors
    outs, gates = list(saved[:len(saved) // 2]), list(saved[len(saved) // 2:])
    grads = torch.ops.nsa_iree.gated_sum_bwd(do, outs, gates, ctx.gate_grads)
    d_outs, rest = grads[:len(outs)], iter(grads[len(outs):])
    return d_outs, [next(rest) if want else None for want in ctx.gate_grads]


_gated_sum_op.register_autograd(_gated_sum_backward, setup_context=_gated_sum_setup)


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """The rotary position embedding of x [B, M, heads, D] (D even) at positions [B, M] (integers): the two halves
    of every head rotated by position * theta ** (-2 i / D), i < D / 2 (non-interleaved, as fla's and Llama's),
    computed in float32 and returned in x's dtype."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) * 2 / x.shape[-1])
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq                  # [B, M, D / 2]
    cos, sin = angles.cos().unsqueeze(2), angles.sin().unsqueeze(2)
    x1, x2 = x.float()[..., :half], x.float()[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def positions_of(batch: int, m_rows: int, device, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """[B, M] int64: each token's position, 0 .. M - 1, or with cu_seqlens counted from its sequence's start."""
    if cu_seqlens is None:
        return torch.arange(m_rows, device=device).expand(batch, m_rows)
    starts = cu_seqlens.to(device=device, dtype=torch.int64)
    tokens = torch.arange(m_rows, device=device)
    sequence = torch.searchsorted(starts[1:], tokens, right=True)
    return (tokens - starts[sequence]).view(1, m_rows)


class NativeSparseAttention(nn.Module):
    """An NSA attention layer, built as fla's ``fla.layers.NativeSparseAttention``: q, k, v projections, rotary
    embedding on q and k, a projection to three gates per head through a sigmoid (compression, selection,
    window), :func:`nsa`, the output projection.

    Args:
        hidden_size: the model's width.
        num_heads: H, query heads; num_kv_heads: G (H a multiple of G); head_dim: D (= Dv), even.
        block_size, block_counts: the compression's and selection's block size, and the blocks each row keeps.
        window_size: the sliding window's keys (0: no window branch; its gate is then unused).
        rope_theta: the rotary embedding's base.
        qkv_bias: whether the q, k and v projections have biases (fla's qkv_bias; the gate and output
            projections have none).
        variant: the selection branch's backward ("two-pass": bitwise reproducible; "one-pass").
    """

    def __init__(self, hidden_size: int, num_heads: int = 64, num_kv_heads: int = 4, head_dim: int = 64,
                 block_size: int = 64, block_counts: int = 16, window_size: int = 512, rope_theta: float = 10000.0,
                 qkv_bias: bool = False, variant: str = "two-pass", device=None, dtype=None) -> None:
        super().__init__()
        validate.check_layer(hidden_size, num_heads, num_kv_heads, head_dim, block_size, block_counts, window_size,
                             rope_theta, variant)
        self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim = (hidden_size, num_heads, num_kv_heads,
                                                                              head_dim)
        self.block_size, self.block_counts, self.window_size = block_size, block_counts, window_size
        self.rope_theta, self.variant = rope_theta, variant
        factory = dict(device=device, dtype=dtype)
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=qkv_bias, **factory)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=qkv_bias, **factory)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=qkv_bias, **factory)
        self.g_proj = nn.Linear(hidden_size, num_heads * 3, bias=False, **factory)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False, **factory)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """y [B, M, hidden_size] from x [B, M, hidden_size] (with cu_seqlens, [S + 1] int32 or int64: B = 1, M
        packed tokens, every sequence alone, its positions from 0)."""
        if x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"x must have shape [B, M, hidden_size={self.hidden_size}], got {list(x.shape)}")
        if cu_seqlens is not None and cu_seqlens.dtype == torch.int64:
            cu_seqlens = cu_seqlens.to(torch.int32)            # (fla's layers take int64)
        batch, m_rows, _ = x.shape
        h, g, d = self.num_heads, self.num_kv_heads, self.head_dim
        positions = positions_of(batch, m_rows, x.device, cu_seqlens)
        q = rotary(self.q_proj(x).view(batch, m_rows, h, d), positions, self.rope_theta)
        k = rotary(self.k_proj(x).view(batch, m_rows, g, d), positions, self.rope_theta)
        v = self.v_proj(x).view(batch, m_rows, g, d)
        gates = torch.sigmoid(self.g_proj(x).view(batch, m_rows, h, 3))
        g_cmp, g_slc, g_swa = gates.unbind(-1)
        o = nsa(q, k, v, g_cmp, g_slc, g_swa if self.window_size else None, block_counts=self.block_counts,
                block_size=self.block_size, window_size=self.window_size, scale=1 / math.sqrt(d),
                cu_seqlens=cu_seqlens, variant=self.variant)
        return self.o_proj(o.reshape(batch, m_rows, h * d))

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, block_size={self.block_size}, block_counts={self.block_counts}, "
                f"window_size={self.window_size}")
