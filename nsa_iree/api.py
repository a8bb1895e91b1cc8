"""Public entry points: selection attention forward, backward, and the differentiable op.

A call goes: validate and describe the problem (a KernelSpec) -> the compiled module for (spec, variant),
from the on-disk cache -> the module's stage functions on the tensors' device -> torch tensors.
"""

from __future__ import annotations

import functools

import torch

from .compiler import compile_artifact
from .runtime import device_for, importable
from .spec import KernelSpec
from .validate import check_backward_inputs, check_forward_inputs, check_variant

_DTYPE_NAME = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_INT32_MAX = 2**31 - 1


def _target_for(device: torch.device) -> str:
    if device.type == "cpu":
        return "cpu"
    if getattr(torch.version, "hip", None):
        arch = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
        return arch
    return "cuda"


def describe(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_indices: torch.Tensor,
             block_size: int) -> KernelSpec:
    """The KernelSpec of a problem: everything static about it (B, M and N are not part of it)."""
    return KernelSpec(heads=q.shape[2], kv_heads=k.shape[2], head_dim=q.shape[3], value_dim=v.shape[3],
                      block_size=block_size, num_blocks=block_indices.shape[3], dtype=_DTYPE_NAME[q.dtype],
                      target=_target_for(q.device))


@functools.lru_cache(maxsize=None)
def _artifact_path(spec: KernelSpec, variant: str):
    return compile_artifact(spec, variant).path


def kernels(spec: KernelSpec, variant: str, device: torch.device):
    """The loaded module holding the stage functions of `variant` ("forward" or a backward variant).

    An artifact that fails its digest check or that IREE refuses to load is compiled again, once.
    """
    return device_for(device).module(_artifact_path(spec, variant),
                                     rebuild=lambda: compile_artifact(spec, variant, rebuild=True).path)


def effective_block_indices(block_indices: torch.Tensor, block_counts) -> torch.Tensor:
    """block_indices as contiguous int32 with slots t >= block_counts set to -1.

    Values outside int32 are clamped to -1 or INT32_MAX: both stay skipped slots, as they were.
    """
    idx = block_indices
    if idx.dtype != torch.int32:
        idx = idx.clamp(-1, _INT32_MAX).to(torch.int32)
    if block_counts is not None:
        slots = torch.arange(idx.shape[-1], device=idx.device)
        counts = block_counts if isinstance(block_counts, int) else block_counts.to(torch.int64).unsqueeze(-1)
        idx = torch.where(slots < counts, idx, torch.full_like(idx, -1))
    return idx.contiguous()


def _scale_of(q: torch.Tensor, scale) -> float:
    return float(q.shape[-1] ** -0.5 if scale is None else scale)


def _check_destinations(**outputs):
    for name, t in outputs.items():
        if t.numel() and not importable(t):
            raise ValueError(f"{name} must be contiguous, 64-byte aligned and start its storage: the kernel "
                             f"writes into its memory")


def forward_into(o, lse, q, k, v, idx, block_size, scale):
    """Run the forward kernel writing into caller-owned o [B, M, H, Dv] and lse [B, H, M] (float32).

    idx is the output of effective_block_indices. Inputs are not validated here (the public functions do
    that); tests use this entry point to poison o and lse before the run.
    """
    _check_destinations(o=o, lse=lse)
    batch, m_rows, _, _ = q.shape
    if batch == 0 or m_rows == 0:
        return o, lse
    if k.shape[1] == 0:
        o.zero_()
        lse.fill_(float("-inf"))
        return o, lse
    module = kernels(describe(q, k, v, idx, block_size), "forward", q.device)
    module.call("selection_attention_fwd", q, k, v, idx, scale, o, lse)
    return o, lse


def backward_into(dq, dk, dv, q, k, v, o, lse, do, idx, block_size, scale, variant):
    """Run delta and the backward `variant`, writing into caller-owned dq, dk and dv (q's dtype).

    two-pass: dq query-major, the block lists inverted, dk/dv block-major (no atomics).
    one-pass: a single dispatch over (query row, kv group) writes dq and adds dk/dv with f32 atomics.
    """
    check_variant(variant)
    _check_destinations(dq=dq, dk=dk, dv=dv)
    batch, m_rows, _, _ = q.shape
    n = k.shape[1]
    if batch == 0 or n == 0 or m_rows == 0:
        for t in (dq, dk, dv):
            t.zero_()
        return dq, dk, dv
    module = kernels(describe(q, k, v, idx, block_size), variant, q.device)
    (delta,) = module.call("selection_attention_delta", o, do)
    if variant == "two-pass":
        module.call("selection_attention_dq", q, k, v, idx, lse, delta, do, scale, dq, wait_for_torch=False)
        entries, piece_start, piece_count = module.call("invert_block_indices", idx, n, wait_for_torch=False)
        module.call("selection_attention_dkdv", q, k, v, idx, lse, delta, do, entries, piece_start, piece_count,
                    scale, dk, dv, wait_for_torch=False)
        return dq, dk, dv
    module.call("selection_attention_onepass", q, k, v, idx, lse, delta, do, scale, dq, dk, dv,
                wait_for_torch=False)
    return dq, dk, dv


def _forward(q, k, v, idx, block_size, scale):
    o = q.new_empty(q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
    return forward_into(o, lse, q, k, v, idx, block_size, scale)


def _backward(q, k, v, o, lse, do, idx, block_size, scale, variant):
    # Contiguous whatever the inputs' strides (empty_like would copy a transposed view's layout).
    dq, dk, dv = (torch.empty(t.shape, dtype=q.dtype, device=q.device) for t in (q, k, v))
    return backward_into(dq, dk, dv, q, k, v, o, lse, do, idx, block_size, scale, variant)


def selection_attention_fwd(q, k, v, block_indices, block_size=64, block_counts=None, scale=None):
    """Selection attention forward.

    Args:
        q: [B, M, H, D] float32, float16 or bfloat16.
        k: [B, N, G, D], same dtype; H must be a multiple of G (heads_per_group = H // G).
        v: [B, N, G, Dv], same dtype.
        block_indices: [B, M, G, T] int32 or int64: the blocks each (query row, group) attends to.
            Negative, future and out-of-range entries are skipped; a block listed twice counts twice.
        block_size: BS, keys per block (block i covers keys i*BS .. i*BS + BS - 1, clipped to N).
        block_counts: None, an int, or a [B, M, G] integer tensor: slots t >= count are skipped.
        scale: softmax scale, default D ** -0.5.
    Returns:
        o: [B, M, H, Dv] in q's dtype (0 for rows that see no key);
        lse: [B, H, M] float32, natural-log logsumexp of the scaled scores (-inf for rows that see no key).
    """
    check_forward_inputs(q, k, v, block_indices, block_size, block_counts)
    idx = effective_block_indices(block_indices, block_counts)
    return _forward(q.detach(), k.detach(), v.detach(), idx, block_size, _scale_of(q, scale))


def selection_attention_bwd(q, k, v, o, lse, do, block_indices, block_size=64, block_counts=None, scale=None,
                            variant="two-pass"):
    """Selection attention backward: the gradients of sum(o * do).

    Args:
        q, k, v, block_indices, block_size, block_counts, scale: as for selection_attention_fwd.
        o: [B, M, H, Dv] and lse: [B, H, M] float32, as returned by the forward.
        do: [B, M, H, Dv], q's dtype: the gradient flowing into o.
        variant: "two-pass" (deterministic: bitwise identical results run to run) or "one-pass" (one
            dispatch over query rows with f32 atomics for dk/dv: results vary run to run within rounding).
    Returns:
        dq [B, M, H, D], dk [B, N, G, D], dv [B, N, G, Dv] in q's dtype (accumulated in float32).
    """
    check_backward_inputs(q, k, v, o, lse, do, block_indices, block_size, block_counts, variant)
    idx = effective_block_indices(block_indices, block_counts)
    return _backward(q.detach(), k.detach(), v.detach(), o.detach(), lse.detach(), do.detach(), idx,
                     block_size, _scale_of(q, scale), variant)


class SelectionAttentionFunction(torch.autograd.Function):
    """Forward saves (q, k, v, o, lse, effective block indices); backward runs delta and the variant."""

    @staticmethod
    def forward(ctx, q, k, v, idx, block_size, scale, variant):
        o, lse = _forward(q, k, v, idx, block_size, scale)
        ctx.save_for_backward(q, k, v, o, lse, idx)
        ctx.block_size, ctx.scale, ctx.variant = block_size, scale, variant
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, idx = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, o, lse, do.contiguous(), idx, ctx.block_size, ctx.scale, ctx.variant)
        return dq, dk, dv, None, None, None, None


def selection_attention(q, k, v, block_indices, block_size=64, block_counts=None, scale=None,
                        variant="two-pass"):
    """Differentiable selection attention (the selection branch of NSA).

    Args:
        q: [B, M, H, D] float32, float16 or bfloat16.
        k: [B, N, G, D] and v: [B, N, G, Dv], same dtype and device; H a multiple of G.
        block_indices: [B, M, G, T] int32 or int64 (see selection_attention_fwd for skipped slots).
        block_size: BS, keys per block.
        block_counts: None, an int, or a [B, M, G] integer tensor.
        scale: softmax scale, default D ** -0.5.
        variant: backward variant, "two-pass" (bitwise reproducible) or "one-pass" (f32 atomics).
    Returns:
        o: [B, M, H, Dv] in q's dtype. Backpropagating through it gives dq, dk, dv.
    """
    check_forward_inputs(q, k, v, block_indices, block_size, block_counts)
    check_variant(variant)
    idx = effective_block_indices(block_indices, block_counts)
    return SelectionAttentionFunction.apply(q, k, v, idx, block_size, _scale_of(q, scale), variant)
