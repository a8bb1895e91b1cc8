"""Public entry points: selection attention forward, backward, and the differentiable op.

Layers, from the top:

- ``selection_attention``, ``selection_attention_fwd``, ``selection_attention_bwd``: validate the inputs
  (naming the argument at fault), fold ``block_counts`` into the block indices with plain torch ops, and call
  one of the two operators below. They hold no IREE call, so ``torch.compile`` and ``torch.export`` trace
  them like any torch code.
- ``_SelectionAttention``: the autograd.Function (with setup_context, so torch.func transforms it) the public
  functions call where a gradient can flow (else the forward operator alone), autocast applied ahead of it; its
  forward and backward are the two operators below.
- ``torch.ops.nsa_iree.selection_attention_fwd`` and ``torch.ops.nsa_iree.selection_attention_bwd``:
  ``torch.library.custom_op`` operators with a fake (meta) implementation each (output shapes follow from
  the inputs), autograd registered on the forward (``register_autograd``), and an autocast rule on both
  (floating inputs cast to the autocast dtype, as ``scaled_dot_product_attention`` does). Their bodies are
  the only place the IREE runtime is called; traced code sees them as opaque nodes.
- ``forward_into`` / ``backward_into``: describe the problem (a KernelSpec), fetch the compiled module for
  (spec, variant) from the on-disk cache, and run its stage functions writing into caller-owned tensors.

Shapes, masking and numerics are specified in docs/semantics.md.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import warnings
from typing import Optional, Union

import torch
from torch import Tensor

from .compiler import compile_artifact, fallback_warning
from .packing import packed_layout
from .runtime import device_for, importable
from .spec import CPU_TARGET_ENV, KERNELS_ENV, KernelSpec, kernels_from_environment, target_cpu_from_environment
from .validate import check_backward_inputs, check_forward_inputs, check_variant

__all__ = ["selection_attention", "selection_attention_fwd", "selection_attention_bwd"]

_DTYPE_NAME = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_INT32_MAX = 2**31 - 1

BlockCounts = Optional[Union[int, Tensor]]


# --- running the compiled kernels (real tensors, eager) ------------------------------------------------

def _target_for(device: torch.device) -> str:
    """The recipe a device's tensors run with: cpu; the AMD GPU's architecture; hopper for an NVIDIA GPU of compute
    capability 9.0 (H100, H200: cuda's kernels plus those on sm_90a's warpgroup MMA); cuda for the other NVIDIA
    GPUs."""
    if device.type == "cpu":
        return "cpu"
    if getattr(torch.version, "hip", None):
        arch = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
        return arch
    return "hopper" if torch.cuda.get_device_capability(device) == (9, 0) else "cuda"


def describe(q: Tensor, k: Tensor, v: Tensor, block_indices: Tensor, block_size: int,
             key_stride: int = 1, window: int = 0) -> KernelSpec:
    """The KernelSpec of a problem: everything static about it (B, M and N are not part of it), with the two
    settings the environment gives (NSA_IREE_CPU_TARGET, NSA_IREE_KERNELS: nsa_iree.spec), read where a spec is
    made (here for the operators, in the CLI for its commands), never while rendering."""
    return _spec_of(_target_for(q.device), q.shape[2], k.shape[2], q.shape[3], v.shape[3], block_size,
                    block_indices.shape[3], q.dtype, key_stride, window, os.environ.get(KERNELS_ENV),
                    os.environ.get(CPU_TARGET_ENV))


@functools.lru_cache(maxsize=1024, typed=True)      # (typed: True or 8.0 is not 1 or 8 to KernelSpec's checks)
def _spec_of(target, heads, kv_heads, head_dim, value_dim, block_size, num_blocks, dtype, key_stride, window,
             kernels_env, cpu_target_env) -> KernelSpec:
    """describe's KernelSpec, made once per problem and environment (its checks are host time on every call)."""
    return KernelSpec(heads=heads, kv_heads=kv_heads, head_dim=head_dim, value_dim=value_dim, block_size=block_size,
                      num_blocks=num_blocks, dtype=_DTYPE_NAME[dtype], target=target,
                      target_cpu=target_cpu_from_environment() if target == "cpu" else "host",
                      kernels=kernels_from_environment(), key_stride=key_stride, window=window)


def _callers_level() -> int:
    """The warnings stacklevel of the first frame outside nsa_iree and torch (the user's call), seen from the
    function that calls this one."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] in ("nsa_iree", "torch"):
        frame, level = frame.f_back, level + 1
    return level


def _once_per_recipes(question):
    """`question`'s answer kept per arguments and recipe directory (recipes.pipelines_dir(), which a tuning sweep
    switches within a process: bench/sweep.py): load_recipe parses its TOML at each call, about 0.5 ms, more than a
    call's own host cost. cache_clear() forgets every answer."""
    from .recipes import pipelines_dir

    answers = functools.lru_cache(maxsize=None)(lambda directory, *args: question(*args))

    @functools.wraps(question)
    def once(*args):
        return answers(pipelines_dir(), *args)

    once.cache_clear = answers.cache_clear
    return once


@_once_per_recipes
def _artifact_path(spec: KernelSpec, variant: str):
    """The verified vmfb of (spec, variant), once per process; the first lookup warns when a stage falls back to
    the linalg kernels (compiler.fallback_warning)."""
    warning = fallback_warning(spec, variant)
    if warning:
        warnings.warn(warning, RuntimeWarning, stacklevel=_callers_level())
    return compile_artifact(spec, variant).path


def kernels(spec: KernelSpec, variant: str, device: torch.device):
    """The loaded module holding the stage functions of `variant` ("forward" or a backward variant).

    An artifact that fails its digest check or that IREE refuses to load is compiled again, once.
    """
    return device_for(device).module(_artifact_path(spec, variant),
                                     rebuild=lambda: compile_artifact(spec, variant, rebuild=True).path)


def effective_block_indices(block_indices: Tensor, block_counts: BlockCounts) -> Tensor:
    """block_indices as contiguous int32 with slots t >= block_counts set to -1 (plain torch ops).

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


def _scale_of(q: Tensor, scale: Optional[float]) -> float:
    return float(q.shape[-1] ** -0.5 if scale is None else scale)


def _check_destinations(**outputs):
    for name, t in outputs.items():
        if t is not None and t.numel() and not importable(t):
            raise ValueError(f"{name} must be contiguous, 64-byte aligned and start its storage: the kernel "
                             f"writes into its memory")


def forward_into(o, lse, q, k, v, idx, block_size, scale, cu_seqlens=None, key_stride=1, window=0,
                 rows_per_slice=None):
    """Run the forward kernel writing into caller-owned o [B, M, H, Dv] and lse [B, H, M] (float32).

    idx is the output of effective_block_indices. Inputs are not validated here (the public functions do
    that), except the values of cu_seqlens (packing.check_cu_seqlens_values); tests use this entry point to
    poison o and lse before the run. With cu_seqlens ([S + 1], B = 1, M = N packed tokens) the kernels run on
    the block-aligned layout of nsa_iree.packing. key_stride: KernelSpec.key_stride (compressed attention: its
    block size, the M rows then every position; nsa_iree.compression). window: KernelSpec.window (the sliding
    window, nsa_iree.window; callers run packed sequences one by one). rows_per_slice: run in slices of that many
    query rows, each against the keys its rows may see (default: where the forward makes partials per (row, slot),
    kernels.SMALL, as many as PARTIALS_BYTES of them hold; else all); o and lse are those of the unsliced call, bit
    for bit (the selection only: not with a window or a key_stride). The forward over the pieces (kernels.SMALL)
    writes the block lists it inverts into torch tensors too, kept for idx's backward as long as idx lives
    (_keep_lists; B G (ceil(M T / R) + ceil(N / BS)) R 8 bytes, R the recipe's rows_per_piece).
    """
    _check_rows_per_slice(rows_per_slice, "forward_into")
    _check_destinations(o=o, lse=lse)
    if cu_seqlens is not None:
        layout = packed_layout(cu_seqlens, q.shape[1], block_size)
        idx = layout.block_indices(idx, block_size)
        if not layout.identity:
            o_pad, lse_pad = _forward(layout.to_padded(q), layout.to_padded(k), layout.to_padded(v), idx,
                                      block_size, scale, rows_per_slice=rows_per_slice)
            layout.from_padded(o_pad, o, dim=1)
            layout.from_padded(lse_pad, lse, dim=2)
            return o, lse
    batch, m_rows, _, _ = q.shape
    if batch == 0 or m_rows == 0:
        return o, lse
    if k.shape[1] == 0:
        o.zero_()
        lse.fill_(float("-inf"))
        return o, lse
    spec, split = loaded_spec(describe(q, k, v, idx, block_size, key_stride, window), "forward")
    if key_stride == 1 and not window:
        rows = rows_per_slice or _rows_per_slice(spec, batch, "forward")
        if rows is not None and rows < m_rows:
            return _forward_in_row_slices(rows, o, lse, q, k, v, idx, block_size, scale)
    idx_in = idx
    if split > 1:
        k, v, idx = (_repeat_groups(t, split) for t in (k, v, idx))
    module = kernels(spec, "forward", q.device)
    if forward_over_pieces(spec):
        # (the forward over the pieces writes the block lists it inverted too: kept for idx's backward)
        lists = _list_buffers(spec, idx, k.shape[1])
        module.call("selection_attention_fwd", q, k, v, idx, scale, o, lse, *lists)
        if idx is idx_in:
            _keep_lists(module.device, spec, idx, k.shape[1], lists)
    else:
        module.call("selection_attention_fwd", q, k, v, idx, scale, o, lse)
    return o, lse


def _forward_in_row_slices(rows, o, lse, q, k, v, idx, block_size, scale):
    """forward_into over slices of `rows` query rows, in order: slice [m0, m1) against the keys its rows may see
    (the first N - M + m1), its o and lse copied into place."""
    batch, m_rows = q.shape[:2]
    for m0, m1, keys in _row_slices(m_rows, k.shape[1], rows):
        o_part = _empty((batch, m1 - m0, *o.shape[2:]), o)
        lse_part = _empty((batch, lse.shape[1], m1 - m0), lse)
        # (a slice the runtime cannot import in place copied once here)
        q_of, idx_of = (_importable(t[:, m0:m1]) for t in (q, idx))
        k_of, v_of = (_importable(t[:, :keys]) for t in (k, v))
        forward_into(o_part, lse_part, q_of, k_of, v_of, idx_of, block_size, scale, rows_per_slice=m1 - m0)
        o[:, m0:m1].copy_(o_part)
        lse[:, :, m0:m1].copy_(lse_part)
    return o, lse


@_once_per_recipes
def loaded_spec(spec: KernelSpec, variant: str) -> tuple[KernelSpec, int]:
    """kernels.loaded_spec on spec's target's recipe: the spec whose module of `variant` the operators load, and the
    group split it runs (each kv head's query heads as that many groups)."""
    from .kernels import loaded_spec as loaded
    from .recipes import load_recipe

    return loaded(spec, variant, load_recipe(spec.target))


@_once_per_recipes
def dense_backward(spec: KernelSpec) -> bool:
    """kernels.dense_backward on spec's target's recipe (once per spec and recipe directory): the backward is one
    call, selection_attention_backward(q, k, v, block_indices, lse, o, do, scale) -> dq, dk, dv."""
    from .kernels import dense_backward as dense
    from .recipes import load_recipe

    return dense(spec, load_recipe(spec.target))


@_once_per_recipes
def forward_over_pieces(spec: KernelSpec) -> bool:
    """kernels.forward_over_pieces on spec's target's recipe (once per spec and recipe directory): the forward makes
    f32 partials per (row, slot) over the block lists' pieces."""
    from .kernels import forward_over_pieces as pieces
    from .recipes import load_recipe

    return pieces(spec, load_recipe(spec.target))


@_once_per_recipes
def dq_with_dkdv(spec: KernelSpec) -> bool:
    """kernels.dq_with_dkdv on spec's target's recipe (once per spec and recipe directory): the two-pass's dk/dv makes
    dq too, from f32 partials per (row, slot), in the one call of dense_backward."""
    from .kernels import dq_with_dkdv as fused
    from .recipes import load_recipe

    return fused(spec, load_recipe(spec.target))


@_once_per_recipes
def _rows_per_piece(spec: KernelSpec) -> int:
    """spec's recipe's rows_per_piece."""
    from .recipes import load_recipe

    return load_recipe(spec.target).rows_per_piece


def _list_buffers(spec: KernelSpec, idx: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """Torch buffers for the block lists of idx [B, M, G, T] (common/inversion.mlir), which the forward over the
    pieces writes: entries [B G (ceil(M T / R) + NB), R, 2], piece_start and piece_count [B G NB] (int32; R the
    recipe's rows per piece, NB = ceil(N / BS)): as many pieces as each row adding T entries and each block padding
    one piece can need (the inversion's %capacity; the module refuses other shapes)."""
    batch, m_rows, groups, slots = idx.shape
    rows = _rows_per_piece(spec)
    num_blocks = -(-n // spec.block_size)
    lines = batch * groups
    capacity = lines * (-(-m_rows * slots // rows) + num_blocks)
    return (_empty((capacity, rows, 2), idx, torch.int32), _empty((lines * num_blocks,), idx, torch.int32),
            _empty((lines * num_blocks,), idx, torch.int32))


def _lists_key(spec: KernelSpec, idx: Tensor, n: int) -> tuple:
    """What the block lists of idx depend on besides its values (common/inversion.mlir: B, M, G and T are its shape;
    N; BS, the key stride and the rows per piece)."""
    return "block lists", id(idx), tuple(idx.shape), n, spec.block_size, spec.key_stride, _rows_per_piece(spec)


def _kept_lists(device, spec: KernelSpec, idx: Tensor, n: int):
    """idx's block lists kept on `device` (_keep_lists) for its current version, else None."""
    return None if idx.is_inference() else device.kept(idx, _lists_key(spec, idx, n))


def _keep_lists(device, spec: KernelSpec, idx: Tensor, n: int, lists) -> None:
    """Keep idx's block lists (entries, piece_start, piece_count) on `device` for the later calls that would invert
    idx again (its backward): until idx is freed, for the version of idx they were made from (a change in place
    that torch counts makes them again). An inference tensor (made under torch.inference_mode, which counts no
    versions) is not kept."""
    if not idx.is_inference():
        device.keep(idx, _lists_key(spec, idx, n), lists)


def _inverted_blocks(module, spec: KernelSpec, idx: Tensor, n: int, keep: bool):
    """(entries, piece_start, piece_count): the two-pass's block -> rows lists of idx: the ones kept for this
    version of idx (the forward over the pieces wrote them, or an earlier call kept them), else made by the module,
    and kept where `keep` (backward_into's fixed_blocks)."""
    lists = _kept_lists(module.device, spec, idx, n)
    if lists is None:
        lists = module.call("invert_block_indices", idx, n, wait_for_torch=False)
        if keep:
            _keep_lists(module.device, spec, idx, n, lists)
    return lists


def _repeat_groups(x: Tensor, split: int) -> Tensor:
    """x [B, N, G, ...] as [B, N, G * split, ...]: each kv head's slice repeated for its `split` groups of query
    heads (group g * split + i reads kv head g)."""
    return x.repeat_interleave(split, dim=2)


# The most bytes of f32 partials per (row, slot) one call may hold where its kernels make them (kernels.SMALL: the
# forward over the pieces, T x H x (Dv + 2) x 4 bytes a query row and batch; dk/dv making dq, T x H x D x 4); a longer
# sequence runs in row slices (forward_into, backward_into). None: NSA_IREE_PARTIALS_BYTES, read at each such call,
# else 16 GiB (docs/runtime.md).
PARTIALS_BYTES: int | None = None


def _partials_bytes_from_environment(default: int = 16 << 30) -> int:
    if "NSA_IREE_DQ_PARTIALS_BYTES" in os.environ:
        raise ValueError("NSA_IREE_DQ_PARTIALS_BYTES is now NSA_IREE_PARTIALS_BYTES (it bounds the forward's "
                         "partials too): set that instead")
    text = os.environ.get("NSA_IREE_PARTIALS_BYTES")
    if text is None:
        return default
    if not text.strip().isdigit() or int(text) <= 0:
        raise ValueError(f"NSA_IREE_PARTIALS_BYTES must be a positive number of bytes, got {text!r}")
    return int(text)


def _rows_per_slice(spec: KernelSpec, batch: int, variant: str = "two-pass") -> int | None:
    """The query rows of a forward or two-pass backward call whose partials per (row, slot) fit PARTIALS_BYTES (at
    least 64); None where spec's kernels of `variant` make no partials."""
    if variant == "forward" and forward_over_pieces(spec):
        width = spec.value_dim + 2
    elif variant == "two-pass" and dq_with_dkdv(spec):
        width = spec.head_dim
    else:
        return None
    budget = PARTIALS_BYTES if PARTIALS_BYTES is not None else _partials_bytes_from_environment()
    per_row = batch * spec.num_blocks * spec.heads * width * 4
    return max(64, budget // per_row)


def _check_rows_per_slice(rows_per_slice, function: str) -> None:
    if rows_per_slice is not None and (isinstance(rows_per_slice, bool) or not isinstance(rows_per_slice, int)
                                       or rows_per_slice <= 0):
        raise ValueError(f"{function}: rows_per_slice must be a positive int or None, got {rows_per_slice!r}")


def backward_into(dq, dk, dv, q, k, v, o, lse, do, idx, block_size, scale, variant, cu_seqlens=None,
                  after_dkdv=None, key_stride=1, window=0, fixed_blocks=False, rows_per_slice=None):
    """Run delta and the backward `variant`, writing into caller-owned dq, dk and dv (q's dtype; dk and dv may
    be float32 for 16-bit inputs: their sums before the rounding to q's dtype).

    two-pass: the block lists inverted and dk/dv block-major (no atomics), then dq query-major. dq=None skips
    the dq pass; dk=dv=None skips the inversion and the dk/dv pass (the gradients autograd does not need).
    Where the two-pass is one call (the compressed attention on the CPU, the window on Hopper:
    kernels.dense_backward; and the selection on Hopper below 16 heads per group, where dk/dv makes dq:
    kernels.dq_with_dkdv), it writes all three, the ones passed as None into scratch. one-pass: a single
    dispatch over (query row, kv group) writes dq and adds dk/dv with f32 atomics; it needs all three buffers.
    cu_seqlens: as for forward_into.
    after_dkdv: called (no arguments) as soon as dk and dv are written, before the dq pass of two-pass runs,
    so that a caller can start sending them while dq is computed (nsa_iree.distributed); after the one call of
    the one-call backward, of the row slices and of the one-pass. Not called when dk/dv are not
    computed; with packed sequences that
    need padding, called at the end (dk and dv are copied out of the padded layout last). key_stride, window: as
    for forward_into. fixed_blocks: idx is a tensor made once per shape and only read (the band of the sliding
    window, the compressed attention's tiles): the two-pass's inversion of it is made once and kept as long as idx
    lives (a change to idx in place makes it again). Lists kept for idx's current version (fixed_blocks, or the
    forward over the pieces') are used in place of the inversion. rows_per_slice: run the two-pass in slices of that
    many query rows (default: where dk/dv makes dq, as many as PARTIALS_BYTES of partials hold; else all), each
    slice's dk and dv summed over the slices in float32 and rounded once (the selection's two-pass only: not with a
    window, a key_stride or the one-pass).
    """
    check_variant(variant)
    _check_rows_per_slice(rows_per_slice, "backward_into")
    if (dk is None) != (dv is None) or (variant == "one-pass" and None in (dq, dk, dv)):
        raise ValueError("backward_into: dk and dv are computed together (both or neither), and the one-pass "
                         "variant writes dq, dk and dv")
    _check_destinations(dq=dq, dk=dk, dv=dv)
    if cu_seqlens is not None:
        layout = packed_layout(cu_seqlens, q.shape[1], block_size)
        idx = layout.block_indices(idx, block_size)
        if not layout.identity:
            pad = layout.to_padded
            dq_pad, dk_pad, dv_pad = (None if t is None else _empty((1, layout.padded, *t.shape[2:]), t)
                                      for t in (dq, dk, dv))
            backward_into(dq_pad, dk_pad, dv_pad, pad(q), pad(k), pad(v), pad(o), pad(lse, dim=2, fill=float("-inf")),
                          pad(do), idx, block_size, scale, variant, rows_per_slice=rows_per_slice)
            for grad, grad_pad in ((dq, dq_pad), (dk, dk_pad), (dv, dv_pad)):
                if grad is not None:
                    layout.from_padded(grad_pad, grad, dim=1)
            if dk is not None and after_dkdv is not None:
                after_dkdv()
            return dq, dk, dv
    batch, m_rows, _, _ = q.shape
    n = k.shape[1]
    if batch == 0 or n == 0 or m_rows == 0:
        for t in (dq, dk, dv):
            if t is not None:
                t.zero_()
        if dk is not None and after_dkdv is not None:
            after_dkdv()
        return dq, dk, dv
    if dq is None and dk is None:
        return dq, dk, dv
    spec, split = loaded_spec(describe(q, k, v, idx, block_size, key_stride, window), variant)
    if variant == "two-pass" and key_stride == 1 and not window:
        rows = rows_per_slice or _rows_per_slice(spec, batch)
        if rows is not None and rows < m_rows:
            return _backward_in_row_slices(rows, dq, dk, dv, q, k, v, o, lse, do, idx, block_size, scale, after_dkdv)
    dk_out, dv_out = dk, dv
    if split > 1:
        # Each kv head's query heads as `split` groups (loaded_spec); their dk and dv summed after.
        k, v, idx = (_repeat_groups(t, split) for t in (k, v, idx))
        if dk is not None:
            dk = _empty((batch, n, spec.kv_heads, k.shape[3]), k, torch.float32)
            dv = _empty((batch, n, spec.kv_heads, v.shape[3]), v, torch.float32)
    if dk is not None and dk.dtype == torch.float32 != q.dtype:
        spec = spec.replace(dkdv_dtype="f32")          # dk and dv left unrounded (nsa_iree.distributed)
    module = kernels(spec, variant, q.device)
    if variant == "two-pass" and not dense_backward(spec):
        (delta,) = module.call("selection_attention_delta", o, do)
        if dk is not None:
            entries, piece_start, piece_count = _inverted_blocks(module, spec, idx, n, fixed_blocks and split == 1)
            module.call("selection_attention_dkdv", q, k, v, idx, lse, delta, do, entries, piece_start,
                        piece_count, scale, dk, dv, wait_for_torch=False)
            del entries, piece_start, piece_count
            # (the groups' float32 parts stay referenced until this call returns: on a GPU torch's stream may
            # still be summing them while dq runs on IREE's, so no workspace of dq may take their memory)
            parts = dk, dv
            dk, dv = _sum_groups(dk_out, parts[0], split), _sum_groups(dv_out, parts[1], split)
            if after_dkdv is not None:
                after_dkdv()
        if dq is not None:
            module.call("selection_attention_dq", q, k, v, idx, lse, delta, do, scale, dq, wait_for_torch=False)
        return dq, dk, dv
    elif variant == "two-pass":
        # The backward in one call (the compressed attention on the CPU, the window on Hopper:
        # kernels.dense_backward): it makes delta and writes all three (dk and dv, when not asked for, into scratch
        # of the module's types).
        dkdv_dtype = torch.float32 if spec.dkdv_dtype == "f32" else k.dtype
        outputs = (dq if dq is not None else _empty(q.shape, q),
                   dk if dk is not None else _empty(k.shape, k, dkdv_dtype),
                   dv if dv is not None else _empty(v.shape, v, dkdv_dtype))
        lists = _kept_lists(module.device, spec, idx, n) if dq_with_dkdv(spec) else None
        if lists is not None:       # (the forward over the pieces' lists of this idx: no inversion here)
            module.call("selection_attention_backward_lists", q, k, v, idx, lse, o, do, *lists, scale, *outputs)
        else:
            module.call("selection_attention_backward", q, k, v, idx, lse, o, do, scale, *outputs)
        if dk is None:
            return dq, dk, dv
    else:
        (delta,) = module.call("selection_attention_delta", o, do)
        module.call("selection_attention_onepass", q, k, v, idx, lse, delta, do, scale, dq, dk, dv,
                    wait_for_torch=False)
    dk, dv = _sum_groups(dk_out, dk, split), _sum_groups(dv_out, dv, split)
    if after_dkdv is not None:
        after_dkdv()
    return dq, dk, dv


def _backward_in_row_slices(rows, dq, dk, dv, q, k, v, o, lse, do, idx, block_size, scale, after_dkdv):
    """backward_into's two-pass over slices of `rows` query rows, in order: slice [m0, m1) against the keys its rows
    may see (the first N - M + m1: its last row's position and before), dq written per slice, dk and dv summed over
    the slices in float32 and rounded once."""
    batch, m_rows = q.shape[:2]
    dk_sum, dv_sum = (None if t is None else torch.zeros(t.shape, dtype=torch.float32, device=t.device)
                      for t in (dk, dv))
    for m0, m1, keys in _row_slices(m_rows, k.shape[1], rows):
        dq_part = None if dq is None else _empty((batch, m1 - m0, *dq.shape[2:]), dq)
        dk_part, dv_part = (None if t is None else _empty((batch, keys, *t.shape[2:]), t, torch.float32)
                            for t in (dk, dv))
        # (a slice the runtime cannot import in place copied once here, not by each call that reads it)
        rows_of = [_importable(t[:, m0:m1]) for t in (q, o, do, idx)]
        keys_of = [_importable(t[:, :keys]) for t in (k, v)]
        lse_of = _importable(lse[:, :, m0:m1])
        backward_into(dq_part, dk_part, dv_part, rows_of[0], *keys_of, rows_of[1], lse_of, rows_of[2], rows_of[3],
                      block_size, scale, "two-pass", rows_per_slice=m1 - m0)
        if dq is not None:
            dq[:, m0:m1].copy_(dq_part)
        if dk is not None:
            dk_sum[:, :keys] += dk_part
            dv_sum[:, :keys] += dv_part
    if dk is not None:
        dk.copy_(dk_sum)
        dv.copy_(dv_sum)
        if after_dkdv is not None:
            after_dkdv()
    return dq, dk, dv


def _row_slices(m_rows: int, n: int, rows: int):
    """(m0, m1, keys) of each slice of `rows` query rows, in order: rows [m0, m1) and the keys they may see, the
    first N - M + m1 (none for rows before the first key: M > N)."""
    for m0 in range(0, m_rows, rows):
        m1 = min(m_rows, m0 + rows)
        yield m0, m1, max(0, n - m_rows + m1)


def _importable(t: Tensor) -> Tensor:
    """t, or a contiguous copy of it where the runtime could not take its memory as it is (runtime.importable)."""
    return t if importable(t) else t.clone(memory_format=torch.contiguous_format)


def _sum_groups(total: Tensor, parts: Tensor, split: int) -> Tensor:
    """total [B, N, G, ...] = the sum of parts [B, N, G * split, ...] over each kv head's `split` groups of query
    heads, in float32 in group order, rounded once (parts itself when split is 1)."""
    if split == 1:
        return parts
    groups = parts.unflatten(2, (parts.shape[2] // split, split))
    if total.dtype == torch.float32:
        return torch.sum(groups, dim=3, out=total)
    return total.copy_(groups.sum(3))


def _empty(shape, like: Tensor, dtype=None) -> Tensor:
    """A contiguous output (the kernels write into its memory whatever the layout of `like`)."""
    return torch.empty(shape, dtype=dtype or like.dtype, device=like.device)


def _forward(q, k, v, idx, block_size, scale, cu_seqlens=None, rows_per_slice=None):
    o = _empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]), q)
    lse = _empty((q.shape[0], q.shape[2], q.shape[1]), q, torch.float32)
    return forward_into(o, lse, q, k, v, idx, block_size, scale, cu_seqlens, rows_per_slice=rows_per_slice)


def _backward(q, k, v, o, lse, do, idx, block_size, scale, variant, need_dq=True, need_dkdv=True,
              cu_seqlens=None):
    if variant == "one-pass":
        need_dq = need_dkdv = True                      # one dispatch writes all three
    dq = _empty(q.shape, q) if need_dq else None
    dk, dv = (_empty(k.shape, q), _empty(v.shape, q)) if need_dkdv else (None, None)
    return backward_into(dq, dk, dv, q, k, v, o, lse, do, idx, block_size, scale, variant, cu_seqlens)


# --- the operators -------------------------------------------------------------------------------------
#
# Their arguments are plain tensors, ints, floats and strings: block_counts is already folded into the int32
# block indices (effective_block_indices) and the scale resolved. Gradients the caller does not need come back
# as empty tensors of shape [0] (a custom op returns tensors, never None). cu_seqlens (None or [S + 1]) is
# runtime data: the outputs' shapes do not depend on it (the fake implementations ignore it), its values are
# checked and the packed layout built inside the bodies (nsa_iree.packing).

def dispatch_free(*tensors: Optional[Tensor]) -> bool:
    """Whether an operator may run its body directly, not through torch's dispatch of the custom op (tens of
    microseconds of host time a call, which the dispatch would spend only to come back to the body): plain CPU or
    GPU tensors that need no gradient recorded, and nothing that intercepts torch calls (torch.compile's or
    torch.jit's tracing, a torch function or dispatch mode such as FakeTensorMode, a torch.func transform,
    autocast). A profile still shows the call as the operator's event (_as_operator)."""
    tensors = [t for t in tensors if t is not None]
    return (not torch.compiler.is_compiling() and not torch.jit.is_tracing()
            and all(type(t) is Tensor and t.device.type in ("cpu", "cuda") for t in tensors)   # (meta: the fake)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
            and not torch._C._is_torch_function_mode_enabled() and not torch._C._len_torch_dispatch_stack()
            and not torch._C._are_functorch_transforms_active()
            and not (tensors and torch.is_autocast_enabled(tensors[0].device.type)))


def _as_operator(name: str):
    """Under torch.profiler, a directly run body recorded under its operator's name (else nothing)."""
    return torch.profiler.record_function(name) if torch.autograd._profiler_enabled() else contextlib.nullcontext()


def _fwd(q, k, v, block_indices, block_size, scale, variant, cu_seqlens):
    """The forward operator (torch.ops.nsa_iree.selection_attention_fwd), its body called directly where nothing
    needs the dispatch (dispatch_free)."""
    if dispatch_free(q, k, v, block_indices, cu_seqlens):
        with _as_operator("nsa_iree::selection_attention_fwd"):
            return _forward(q, k, v, block_indices, block_size, scale, cu_seqlens)
    return torch.ops.nsa_iree.selection_attention_fwd(q, k, v, block_indices, block_size, scale, variant, cu_seqlens)


def _bwd(do, q, k, v, o, lse, block_indices, block_size, scale, variant, need_dq, need_dkdv, cu_seqlens):
    """The backward operator (torch.ops.nsa_iree.selection_attention_bwd), likewise."""
    if dispatch_free(do, q, k, v, o, lse, block_indices, cu_seqlens):
        with _as_operator("nsa_iree::selection_attention_bwd"):
            return _gradients(do, q, k, v, o, lse, block_indices, block_size, scale, variant, need_dq, need_dkdv,
                              cu_seqlens)
    return torch.ops.nsa_iree.selection_attention_bwd(do, q, k, v, o, lse, block_indices, block_size, scale, variant,
                                                      need_dq, need_dkdv, cu_seqlens)


@torch.library.custom_op("nsa_iree::selection_attention_fwd", mutates_args=())
def _fwd_op(q: Tensor, k: Tensor, v: Tensor, block_indices: Tensor, block_size: int, scale: float,
            variant: str = "two-pass", cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """o [B, M, H, Dv] (q's dtype) and lse [B, H, M] (float32). `variant` is the backward autograd will run."""
    return _forward(q, k, v, block_indices, block_size, scale, cu_seqlens)


@_fwd_op.register_fake
def _fwd_fake(q, k, v, block_indices, block_size, scale, variant="two-pass", cu_seqlens=None):
    batch, m_rows, heads, _ = q.shape
    return (q.new_empty(batch, m_rows, heads, v.shape[3]),
            q.new_empty(batch, heads, m_rows, dtype=torch.float32))


@torch.library.custom_op("nsa_iree::selection_attention_bwd", mutates_args=())
def _bwd_op(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, block_indices: Tensor,
            block_size: int, scale: float, variant: str = "two-pass", need_dq: bool = True,
            need_dkdv: bool = True, cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv (q's dtype); a gradient not asked for (need_dq / need_dkdv False) is an empty [0] tensor."""
    return _gradients(do, q, k, v, o, lse, block_indices, block_size, scale, variant, need_dq, need_dkdv, cu_seqlens)


def _gradients(do, q, k, v, o, lse, block_indices, block_size, scale, variant, need_dq, need_dkdv, cu_seqlens):
    dq, dk, dv = _backward(q, k, v, o, lse, do, block_indices, block_size, scale, variant, need_dq, need_dkdv,
                           cu_seqlens)
    return (dq if need_dq else q.new_empty(0), dk if need_dkdv else q.new_empty(0),
            dv if need_dkdv else q.new_empty(0))


@_bwd_op.register_fake
def _bwd_fake(do, q, k, v, o, lse, block_indices, block_size, scale, variant="two-pass", need_dq=True,
              need_dkdv=True, cu_seqlens=None):
    def grad(t, needed):
        return q.new_empty(t.shape) if needed else q.new_empty(0)
    return grad(q, need_dq), grad(k, need_dkdv), grad(v, need_dkdv)


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, block_indices, block_size, scale, variant, cu_seqlens = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, block_indices, cu_seqlens)
    ctx.block_size, ctx.scale, ctx.variant = block_size, scale, variant
    ctx.mark_non_differentiable(lse)
    # lse is not differentiable: autograd would make it a zeros gradient every backward, a parallel torch op after
    # which torch's threads spin on the cores the next kernel needs (docs/runtime.md, 'CPU threads'). do is None
    # where o has no gradient either.
    ctx.set_materialize_grads(False)


def _fwd_backward(ctx, do, _dlse):
    if do is None:
        return (None,) * 8
    q, k, v, o, lse, block_indices, cu_seqlens = ctx.saved_tensors
    need_dq, need_dk, need_dv = ctx.needs_input_grad[:3]
    dq, dk, dv = _SelectionAttentionBackward.apply(
        do, q, k, v, o, lse, block_indices, ctx.block_size, ctx.scale, ctx.variant, need_dq, need_dk or need_dv,
        cu_seqlens)
    return (dq if need_dq else None, dk if need_dk else None, dv if need_dv else None) + (None,) * 5


_fwd_op.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


class _SelectionAttentionBackward(torch.autograd.Function):
    """The backward operator, with a derivative that says there is none (torch.func.grad builds the graph of a
    backward; a second derivative through it raises)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(do, q, k, v, o, lse, block_indices, block_size, scale, variant, need_dq, need_dkdv, cu_seqlens):
        return _bwd(do, q, k, v, o, lse, block_indices, block_size, scale, variant, need_dq, need_dkdv, cu_seqlens)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        _not_twice_differentiable(ctx, *grads)


def _not_twice_differentiable(ctx, *grads):
    raise RuntimeError("selection_attention is not twice differentiable: its backward "
                       "(nsa_iree::selection_attention_bwd) has no derivative of its own, so double backward "
                       "(create_graph=True followed by a second backward, e.g. gradient penalties or Hessian "
                       "products) is not supported")


_bwd_op.register_autograd(_not_twice_differentiable)


# torch.func: vmap folds the vmapped dimension into the batch (B' = V * B: one launch), or, with cu_seqlens (B = 1),
# runs the vmapped entries one after another. The public functions go through an autograd.Function with
# setup_context (torch.func.grad, vjp and jacrev need one; the custom op's own autograd registration serves
# direct callers of torch.ops.nsa_iree.*), whose vmap is generated from these rules.

def _fold(args, in_dims, size, positions):
    """The tensor arguments at `positions` with the vmapped dimension first (expanded where unbatched), folded
    into their batch dimension; the other arguments as they are."""
    out = list(args)
    for i in positions:
        a, dim = args[i], in_dims[i]
        a = a.movedim(dim, 0) if dim is not None else a.expand(size, *a.shape)
        out[i] = a.reshape(size * a.shape[1], *a.shape[2:])
    return out


def _not_asked_for(t: Tensor) -> bool:
    """The [0] placeholder the backward returns for a gradient nobody asked for (every real output has rank >= 3,
    even when empty)."""
    return t.dim() == 1


def _unfold(t: Tensor, size: int) -> Tensor:
    return t.reshape(size, t.shape[0] // size, *t.shape[1:])


def _entries(args, in_dims, size):
    """The vmapped entries one by one: each argument's slice i (unbatched ones as they are)."""
    for i in range(size):
        yield [a.select(dim, i) if isinstance(a, Tensor) and dim is not None else a for a, dim in zip(args, in_dims)]


def _batched(op, info, in_dims, args, tensor_positions, cu_seqlens_position):
    """op over the vmapped dimension: (outputs, out_dims); a placeholder output (a gradient not asked for) stays
    unbatched."""
    size = info.batch_size
    if args[cu_seqlens_position] is not None:
        results = [op(*entry) for entry in _entries(args, in_dims, size)]
        outs = [parts[0] if _not_asked_for(parts[0]) else torch.stack(parts) for parts in zip(*results)]
    else:
        outs = [t if _not_asked_for(t) else _unfold(t, size)
                for t in op(*_fold(args, in_dims, size, tensor_positions))]
    return tuple(outs), tuple(None if _not_asked_for(t) else 0 for t in outs)


@_fwd_op.register_vmap
def _fwd_vmap(info, in_dims, q, k, v, block_indices, block_size, scale, variant="two-pass", cu_seqlens=None):
    return _batched(_fwd_op, info, in_dims, (q, k, v, block_indices, block_size, scale, variant, cu_seqlens),
                    (0, 1, 2, 3), 7)


@_bwd_op.register_vmap
def _bwd_vmap(info, in_dims, do, q, k, v, o, lse, block_indices, block_size, scale, variant="two-pass",
              need_dq=True, need_dkdv=True, cu_seqlens=None):
    args = (do, q, k, v, o, lse, block_indices, block_size, scale, variant, need_dq, need_dkdv, cu_seqlens)
    return _batched(_bwd_op, info, in_dims, args, (0, 1, 2, 3, 4, 5, 6), 12)


class _SelectionAttention(torch.autograd.Function):
    """The differentiable forward of the public functions (torch.func.grad, vjp, jacrev and vmap included)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(q, k, v, block_indices, block_size, scale, variant, cu_seqlens):
        return _fwd(q, k, v, block_indices, block_size, scale, variant, cu_seqlens)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _fwd_setup_context(ctx, inputs, output)

    @staticmethod
    def backward(ctx, do, dlse):
        return _fwd_backward(ctx, do, dlse)


# Autocast: like scaled_dot_product_attention, the floating inputs (q, k, v and, in the backward, o and do;
# never lse, which stays float32) are cast to the autocast dtype of their device, whatever it is set to.
_AUTOCAST_LIB = torch.library.Library("nsa_iree", "FRAGMENT")
_CAST_POSITIONS = {"selection_attention_fwd": (0, 1, 2), "selection_attention_bwd": (0, 1, 2, 3, 4)}


def _autocast_cast(t, device_type: str, dtype: torch.dtype):
    """The one autocast rule: a floating tensor of the autocast's device other than float64 takes its dtype."""
    if isinstance(t, Tensor) and t.is_floating_point() and t.dtype != torch.float64 and t.device.type == device_type:
        return t.to(dtype)
    return t


def _register_autocast(name: str, device_type: str) -> None:
    key = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}[device_type]
    exclude = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))
    op = getattr(torch.ops.nsa_iree, name).default
    positions = _CAST_POSITIONS[name]

    def kernel(_keyset, *args):
        dtype = torch.get_autocast_dtype(device_type)
        args = tuple(_autocast_cast(a, device_type, dtype) if i in positions else a for i, a in enumerate(args))
        with torch._C._ExcludeDispatchKeyGuard(exclude):
            return op(*args)

    _AUTOCAST_LIB.impl(name, kernel, key, with_keyset=True)


def _autocast(*tensors: Tensor) -> tuple[Tensor, ...]:
    """The operators' autocast rule applied ahead of them (the autograd.Function then saves the cast tensors)."""
    device_type = tensors[0].device.type
    if device_type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple([_autocast_cast(t, device_type, dtype) for t in tensors])


for _name in _CAST_POSITIONS:
    for _device_type in ("cpu", "cuda"):
        _register_autocast(_name, _device_type)


def register_operator_pair(name: str, fwd_op, bwd_op, backward, setup_context, fwd_casts: tuple[int, ...],
                           bwd_casts: tuple[int, ...]) -> None:
    """Make the custom operators nsa_iree::<name>_fwd and <name>_bwd a differentiable pair, as the selection
    operators are: `backward` (with `setup_context`) the forward's derivative, none for the backward operator (a
    second derivative raises), and the autocast rule on both at their floating inputs' positions `fwd_casts`,
    `bwd_casts` (nsa_iree.compression, nsa_iree.window)."""
    def not_twice_differentiable(ctx, *grads):
        raise RuntimeError(f"{name} is not twice differentiable: its backward (nsa_iree::{name}_bwd) has no "
                           f"derivative of its own")

    fwd_op.register_autograd(backward, setup_context=setup_context)
    bwd_op.register_autograd(not_twice_differentiable)
    _CAST_POSITIONS.update({f"{name}_fwd": fwd_casts, f"{name}_bwd": bwd_casts})
    for device_type in ("cpu", "cuda"):
        _register_autocast(f"{name}_fwd", device_type)
        _register_autocast(f"{name}_bwd", device_type)


def output_buffer(shape, like: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    """A buffer a kernel writes whole, on like's device (like's dtype unless given); the tests poison it."""
    return torch.empty(shape, dtype=dtype or like.dtype, device=like.device)



# --- public functions ----------------------------------------------------------------------------------

def selection_attention_fwd(q: Tensor, k: Tensor, v: Tensor, block_indices: Tensor, block_size: int = 64,
                            block_counts: BlockCounts = None, scale: Optional[float] = None, *,
                            cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Selection attention forward (not differentiable: see selection_attention). docs/semantics.md.

    Args:
        q: [B, M, H, D] float32, float16 or bfloat16.
        k: [B, N, G, D], same dtype; H must be a multiple of G (heads_per_group = H // G).
        v: [B, N, G, Dv], same dtype.
        block_indices: [B, M, G, T] int32 or int64: the blocks each (query row, group) attends to.
            Negative, future and out-of-range entries are skipped; a block listed twice counts twice.
        block_size: BS, keys per block (block i covers keys i*BS .. i*BS + BS - 1, clipped to N).
        block_counts: None, an int, or a [B, M, G] integer tensor: slots t >= count are skipped.
        scale: softmax scale, default D ** -0.5.
        cu_seqlens: None, or [S + 1] int32 on q's device: S packed sequences, sequence s being the
            tokens cu_seqlens[s] .. cu_seqlens[s + 1] - 1 (starting at 0, non-decreasing, ending at M; a
            sequence may be empty). Then B = 1 and N = M (q, k and v hold the same packed tokens), and each
            sequence attends within itself: block ids are relative to its first token, token p of it sits at
            position p. New lengths never recompile.
    Returns:
        o: [B, M, H, Dv] in q's dtype (0 for rows that see no key);
        lse: [B, H, M] float32, natural-log logsumexp of the scaled scores (-inf for rows that see no key).
    Query row m sits at key position m + N - M (bottom-right alignment when M < N).
    """
    check_forward_inputs(q, k, v, block_indices, block_size, block_counts, cu_seqlens, scale)
    idx = effective_block_indices(block_indices, block_counts)
    return _fwd(q.detach(), k.detach(), v.detach(), idx, block_size, _scale_of(q, scale), "two-pass", cu_seqlens)


def selection_attention_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor,
                            block_indices: Tensor, block_size: int = 64, block_counts: BlockCounts = None,
                            scale: Optional[float] = None, variant: str = "two-pass", *,
                            cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """Selection attention backward: the gradients of sum(o * do). docs/semantics.md.

    Args:
        q, k, v, block_indices, block_size, block_counts, scale, cu_seqlens: as for selection_attention_fwd.
        o: [B, M, H, Dv] and lse: [B, H, M] float32, as returned by the forward.
        do: [B, M, H, Dv], q's dtype: the gradient flowing into o.
        variant: "two-pass" (deterministic: bitwise identical results run to run) or "one-pass" (one
            dispatch over query rows with f32 atomics for dk/dv: results vary run to run within rounding).
    Returns:
        dq [B, M, H, D], dk [B, N, G, D], dv [B, N, G, Dv] in q's dtype (accumulated in float32).
    """
    check_backward_inputs(q, k, v, o, lse, do, block_indices, block_size, block_counts, variant, cu_seqlens,
                          scale)
    idx = effective_block_indices(block_indices, block_counts)
    return _bwd(do.detach(), q.detach(), k.detach(), v.detach(), o.detach(), lse.detach(), idx, block_size,
                   _scale_of(q, scale), variant, True, True, cu_seqlens)


def selection_attention(q: Tensor, k: Tensor, v: Tensor, block_indices: Tensor, block_size: int = 64,
                        block_counts: BlockCounts = None, scale: Optional[float] = None,
                        variant: str = "two-pass", *, cu_seqlens: Optional[Tensor] = None) -> Tensor:
    """Differentiable selection attention (the selection branch of NSA). docs/semantics.md.

    Args:
        q: [B, M, H, D] float32, float16 or bfloat16.
        k: [B, N, G, D] and v: [B, N, G, Dv], same dtype and device; H a multiple of G.
        block_indices: [B, M, G, T] int32 or int64 (see selection_attention_fwd for skipped slots).
        block_size: BS, keys per block.
        block_counts: None, an int, or a [B, M, G] integer tensor.
        scale: softmax scale, default D ** -0.5.
        variant: backward variant, "two-pass" (bitwise reproducible) or "one-pass" (f32 atomics).
        cu_seqlens: None, or [S + 1] int32 on q's device: S packed sequences, sequence s being the
            tokens cu_seqlens[s] .. cu_seqlens[s + 1] - 1 (starting at 0, non-decreasing, ending at M; a
            sequence may be empty). Then B = 1 and N = M (q, k and v hold the same packed tokens), and each
            sequence attends within itself: block ids are relative to its first token, token p of it sits at
            position p. New lengths never recompile.
    Returns:
        o: [B, M, H, Dv] in q's dtype. Backpropagating through it gives dq, dk, dv (only those whose inputs
        require grad are computed); it is differentiable once (a second backward raises a RuntimeError).
    Works under torch.compile (fullgraph), torch.export and torch.autocast (inputs cast like SDPA's).
    """
    check_forward_inputs(q, k, v, block_indices, block_size, block_counts, cu_seqlens, scale)
    check_variant(variant)
    idx = effective_block_indices(block_indices, block_counts)
    q, k, v = _autocast(q, k, v)
    args = (q, k, v, idx, block_size, _scale_of(q, scale), variant, cu_seqlens)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
            or torch._C._are_functorch_transforms_active()):
        # No gradient can flow and no torch.func transform is active (a grad around a vmap sees no requires_grad
        # inside it): the operator alone, which has its own fake and autocast rule; the autograd.Function's
        # per-call setup would buy nothing (its host cost: docs/design.md).
        o, _ = _fwd(*args)
    else:
        o, _ = _SelectionAttention.apply(*args)
    return o
