"""Input checks at the public API: they run before any compile or launch and name the argument at fault."""

from __future__ import annotations

import math
import numbers

import torch

from .packing import check_cu_seqlens_values
from .spec import VARIANTS

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def _shape(t) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _tensor(name, t, rank, layout):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {layout}, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have shape {layout}, got a rank-{t.dim()} tensor of shape {_shape(t)}")


def _same(name, t, expected, layout):
    if tuple(t.shape) != tuple(expected):
        want = "[" + ", ".join(str(s) for s in expected) + "]"
        raise ValueError(f"{name} must have shape {layout} = {want}, got {_shape(t)}")


def _autocast_enabled(device: torch.device) -> bool:
    return device.type in ("cpu", "cuda") and torch.is_autocast_enabled(device.type)


def _same_dtype(q, *named) -> None:
    """The floating tensors share q's dtype; under torch.autocast (on their device) any of float32, float16 and
    bfloat16 will do: the operators cast them all to the autocast dtype, as scaled_dot_product_attention does."""
    autocast = _autocast_enabled(q.device)
    for name, t in named:
        if autocast and t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")
        if not autocast and t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")


def _cu_seqlens_tensor(cu_seqlens, name, t) -> None:
    """cu_seqlens is a [S + 1] int32 tensor on the device of `t` (the argument `name`), and t has B = 1."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be None or a [S + 1] int32 tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] == 0:
        raise ValueError(f"cu_seqlens must have shape [S + 1] (S >= 0 packed sequences), got {_shape(cu_seqlens)}")
    if cu_seqlens.dtype != torch.int32:
        raise TypeError(f"cu_seqlens must be int32, got {cu_seqlens.dtype}")
    if cu_seqlens.device != t.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but {name} is on {t.device}: all tensors must "
                         f"share a device")
    if t.shape[0] != 1:
        what = "M" if name == "q" else "N"
        raise ValueError(f"with cu_seqlens the sequences are packed along {what}: {name} must have B = 1, got "
                         f"{name} of shape {_shape(t)}")


def check_cu_seqlens(q, k, cu_seqlens) -> None:
    """The checks of cu_seqlens that need no look at its values (those are packing.check_cu_seqlens_values)."""
    _cu_seqlens_tensor(cu_seqlens, "q", q)
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"with cu_seqlens q, k and v hold the same packed tokens: N = k.shape[1] = {k.shape[1]} "
                         f"must equal M = q.shape[1] = {q.shape[1]}")


def check_scale(scale) -> None:
    """scale: None or a finite real number (a Python or NumPy float or int; a symbolic one while tracing)."""
    if scale is None or isinstance(scale, (torch.SymFloat, torch.SymInt)):
        return
    if isinstance(scale, torch.Tensor):
        raise TypeError(f"scale must be None or a float, got a tensor ({scale.dtype} on {scale.device}): pass "
                        f"float(scale); the kernels take it as a constant and no gradient flows into it")
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be None or a float, got {type(scale).__name__} {scale!r}")
    try:
        finite = math.isfinite(scale)
    except OverflowError:          # an int too large for a float
        finite = False
    if not finite:
        raise ValueError(f"scale must be a finite float, got {scale!r}")


def _qkv(q, k, v) -> None:
    """q [B, M, H, D], k [B, N, G, D], v [B, N, G, Dv]: floating, one dtype (or autocast's), one device, H a
    positive multiple of G."""
    _tensor("q", q, 4, "[B, M, H, D]")
    _tensor("k", k, 4, "[B, N, G, D]")
    _tensor("v", v, 4, "[B, N, G, Dv]")
    if q.dtype not in FLOAT_DTYPES:
        raise TypeError(f"q must be float32, float16 or bfloat16, got {q.dtype}")
    _same_dtype(q, ("k", k), ("v", v))
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}: all tensors must share a device")
    batch, _, heads, head_dim = q.shape
    n, groups = k.shape[1], k.shape[2]
    _same("k", k, (batch, n, groups, head_dim), "[B, N, G, D]")
    _same("v", v, (batch, n, groups, v.shape[3]), "[B, N, G, Dv]")
    if groups == 0 or heads % groups:
        raise ValueError(f"the number of query heads H={heads} (q.shape[2]) must be a positive multiple of the "
                         f"number of kv heads G={groups} (k.shape[2])")


def check_forward_inputs(q, k, v, block_indices, block_size, block_counts, cu_seqlens=None, scale=None) -> None:
    check_scale(scale)
    _qkv(q, k, v)
    _tensor("block_indices", block_indices, 4, "[B, M, G, T]")
    if block_indices.dtype not in INDEX_DTYPES:
        raise TypeError(f"block_indices must be int32 or int64, got {block_indices.dtype}")
    if block_indices.device != q.device:
        raise ValueError(f"block_indices is on {block_indices.device} but q is on {q.device}: all tensors must "
                         f"share a device")
    batch, m_rows, _, head_dim = q.shape
    groups = k.shape[2]
    _same("block_indices", block_indices, (batch, m_rows, groups, block_indices.shape[3]), "[B, M, G, T]")
    if block_indices.shape[3] == 0:
        raise ValueError("block_indices must have T >= 1 slots (its last dimension is 0)")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if min(head_dim, v.shape[3]) == 0:
        raise ValueError(f"head dims must be positive, got D={head_dim}, Dv={v.shape[3]}")
    if cu_seqlens is not None:
        check_cu_seqlens(q, k, cu_seqlens)
    if block_counts is None or (isinstance(block_counts, int) and not isinstance(block_counts, bool)):
        return
    if not isinstance(block_counts, torch.Tensor):
        raise TypeError(f"block_counts must be None, an int or a [B, M, G] tensor, got {type(block_counts).__name__}")
    if block_counts.dtype not in INDEX_DTYPES:
        raise TypeError(f"block_counts must be int32 or int64, got {block_counts.dtype}")
    if block_counts.device != q.device:
        raise ValueError(f"block_counts is on {block_counts.device} but q is on {q.device}")
    _same("block_counts", block_counts, (batch, m_rows, groups), "[B, M, G]")


def check_variant(variant) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")


def check_backward_inputs(q, k, v, o, lse, do, block_indices, block_size, block_counts, variant,
                          cu_seqlens=None, scale=None) -> None:
    check_forward_inputs(q, k, v, block_indices, block_size, block_counts, cu_seqlens, scale)
    check_variant(variant)
    batch, m_rows, heads, _ = q.shape
    value_dim = v.shape[3]
    _tensor("o", o, 4, "[B, M, H, Dv]")
    _tensor("do", do, 4, "[B, M, H, Dv]")
    _tensor("lse", lse, 3, "[B, H, M]")
    _same("o", o, (batch, m_rows, heads, value_dim), "[B, M, H, Dv]")
    _same("do", do, (batch, m_rows, heads, value_dim), "[B, M, H, Dv]")
    _same("lse", lse, (batch, heads, m_rows), "[B, H, M]")
    _same_dtype(q, ("o", o), ("do", do))
    if lse.dtype != torch.float32:
        raise TypeError(f"lse must be float32, got {lse.dtype}")
    for name, t in (("o", o), ("lse", lse), ("do", do)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}: all tensors must share a device")


# ---------------------------------------------------------------------------------------------------------------
# The compression branch (docs/semantics.md, "The compression branch"): mean_pooling, compressed_attention and
# select_blocks. None of these checks reads a tensor's values; check_packed_blocks does (on the host).


def _block_size(block_size) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")


def _seq_len(seq_len, m_rows, cu_seqlens) -> int:
    """N, the keys the rows stand among: seq_len (an int >= 0), default M; with cu_seqlens None or M."""
    if seq_len is None:
        return m_rows
    if isinstance(seq_len, bool) or not isinstance(seq_len, int):
        raise TypeError(f"seq_len must be None or an int, got {type(seq_len).__name__} {seq_len!r}")
    if seq_len < 0:
        raise ValueError(f"seq_len must be >= 0, got {seq_len}")
    if cu_seqlens is not None and seq_len != m_rows:
        raise ValueError(f"with cu_seqlens every sequence is its own rows (M = N): seq_len must be None or "
                         f"M = q.shape[1] = {m_rows}, got {seq_len}")
    return seq_len


def _compressed_keys(q, k_cmp, block_size, seq_len, cu_seqlens) -> None:
    """q [B, M, H, D] and k_cmp [B, C, G, D]: ranks, dtypes, devices, H % G, C = ceil(N / BS) (unpacked)."""
    _tensor("q", q, 4, "[B, M, H, D]")
    _tensor("k_cmp", k_cmp, 4, "[B, C, G, D]")
    if q.dtype not in FLOAT_DTYPES:
        raise TypeError(f"q must be float32, float16 or bfloat16, got {q.dtype}")
    _same_dtype(q, ("k_cmp", k_cmp))
    if k_cmp.device != q.device:
        raise ValueError(f"k_cmp is on {k_cmp.device} but q is on {q.device}: all tensors must share a device")
    _block_size(block_size)
    batch, m_rows, heads, head_dim = q.shape
    groups = k_cmp.shape[2]
    _same("k_cmp", k_cmp, (batch, k_cmp.shape[1], groups, head_dim), "[B, C, G, D]")
    if groups == 0 or heads % groups:
        raise ValueError(f"the number of query heads H={heads} (q.shape[2]) must be a positive multiple of the "
                         f"number of kv heads G={groups} (k_cmp.shape[2])")
    if head_dim == 0:
        raise ValueError(f"head dims must be positive, got D={head_dim}")
    n = _seq_len(seq_len, m_rows, cu_seqlens)
    if cu_seqlens is not None:
        _cu_seqlens_tensor(cu_seqlens, "q", q)
        return
    blocks = -(-n // block_size)
    if k_cmp.shape[1] != blocks:
        raise ValueError(f"k_cmp must have shape [B, C, G, D] with C = ceil(N / block_size) = ceil({n} / "
                         f"{block_size}) = {blocks} compressed blocks (N = seq_len, default M), got {_shape(k_cmp)}")


def check_mean_pooling(x, block_size, cu_seqlens=None) -> None:
    """x [B, N, G, D] float32/float16/bfloat16, block_size a positive int, cu_seqlens as the selection ops'."""
    _tensor("x", x, 4, "[B, N, G, D]")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    _block_size(block_size)
    if min(x.shape[2], x.shape[3]) == 0:
        raise ValueError(f"x must have G >= 1 heads and D >= 1, got shape {_shape(x)}")
    if cu_seqlens is not None:
        _cu_seqlens_tensor(cu_seqlens, "x", x)


def check_compressed_attention(q, k_cmp, v_cmp, block_size, scale=None, seq_len=None, cu_seqlens=None) -> None:
    """q [B, M, H, D], k_cmp [B, C, G, D], v_cmp [B, C, G, Dv] with C = ceil(N / BS) (with cu_seqlens: see
    check_packed_blocks), H a positive multiple of G, one dtype and one device, scale None or a finite real."""
    check_scale(scale)
    _compressed_keys(q, k_cmp, block_size, seq_len, cu_seqlens)
    _tensor("v_cmp", v_cmp, 4, "[B, C, G, Dv]")
    _same_dtype(q, ("v_cmp", v_cmp))
    if v_cmp.device != q.device:
        raise ValueError(f"v_cmp is on {v_cmp.device} but q is on {q.device}: all tensors must share a device")
    _same("v_cmp", v_cmp, (*k_cmp.shape[:3], v_cmp.shape[3]), "[B, C, G, Dv]")
    if v_cmp.shape[3] == 0:
        raise ValueError(f"head dims must be positive, got Dv={v_cmp.shape[3]}")


def check_compressed_attention_backward(q, k_cmp, v_cmp, o, lse, do, block_size, scale=None, seq_len=None,
                                        cu_seqlens=None) -> None:
    """The forward's checks, and o, do [B, M, H, Dv] in q's dtype, lse [B, H, M] float32, on q's device."""
    check_compressed_attention(q, k_cmp, v_cmp, block_size, scale, seq_len, cu_seqlens)
    batch, m_rows, heads, _ = q.shape
    _tensor("o", o, 4, "[B, M, H, Dv]")
    _tensor("do", do, 4, "[B, M, H, Dv]")
    _same("o", o, (batch, m_rows, heads, v_cmp.shape[3]), "[B, M, H, Dv]")
    _same("do", do, (batch, m_rows, heads, v_cmp.shape[3]), "[B, M, H, Dv]")
    _same_dtype(q, ("o", o), ("do", do))
    _lse(q, lse)
    for name, t in (("o", o), ("do", do)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}: all tensors must share a device")


def _lse(q, lse) -> None:
    _tensor("lse", lse, 3, "[B, H, M]")
    _same("lse", lse, (q.shape[0], q.shape[2], q.shape[1]), "[B, H, M]")
    if lse.dtype != torch.float32:
        raise TypeError(f"lse must be float32, got {lse.dtype}")
    if lse.device != q.device:
        raise ValueError(f"lse is on {lse.device} but q is on {q.device}: all tensors must share a device")


def check_select_blocks(q, k_cmp, block_counts, block_size, scale=None, lse=None, seq_len=None,
                        cu_seqlens=None) -> None:
    """q and k_cmp as for compressed_attention; block_counts an int >= 0 or a [B, M, G] int32/int64 tensor on
    q's device (its entries below 0 count as 0); lse None or [B, H, M] float32 on q's device."""
    check_scale(scale)
    _compressed_keys(q, k_cmp, block_size, seq_len, cu_seqlens)
    _selected_counts(q, k_cmp.shape[2], block_counts)
    if lse is not None:
        _lse(q, lse)


def _selected_counts(q, groups, block_counts) -> None:
    """block_counts of a selection to make: an int >= 0 or a [B, M, G] int32/int64 tensor on q's device."""
    if isinstance(block_counts, int) and not isinstance(block_counts, bool):
        if block_counts < 0:
            raise ValueError(f"block_counts must be >= 0 (the slots of the result), got {block_counts}")
    elif not isinstance(block_counts, torch.Tensor):
        raise TypeError(f"block_counts must be an int or a [B, M, G] tensor, got {type(block_counts).__name__}")
    else:
        if block_counts.dtype not in INDEX_DTYPES:
            raise TypeError(f"block_counts must be int32 or int64, got {block_counts.dtype}")
        if block_counts.device != q.device:
            raise ValueError(f"block_counts is on {block_counts.device} but q is on {q.device}: all tensors must "
                             f"share a device")
        _same("block_counts", block_counts, (q.shape[0], q.shape[1], groups), "[B, M, G]")


def check_packed_blocks(cu_seqlens, total, block_size, num_blocks, name="k_cmp") -> list[int]:
    """The values of cu_seqlens (read on the host) against `total` packed tokens, and the packed compressed
    blocks: `num_blocks` (name.shape[1]) must be the sum of ceil(L_s / block_size). Returns the boundaries."""
    bounds = check_cu_seqlens_values(cu_seqlens, total)
    blocks = sum(-(-(b - a) // block_size) for a, b in zip(bounds[:-1], bounds[1:]))
    if num_blocks != blocks:
        raise ValueError(f"with cu_seqlens {name} must hold every sequence's ceil(L_s / block_size) blocks one "
                         f"after another, {blocks} in all for block_size {block_size}, got {name}.shape[1] = "
                         f"{num_blocks}")
    return bounds


def _positive_int(name, value, minimum=1) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_nsa(q, k, v, g_cmp, g_slc, g_swa, block_indices, block_counts, block_size, window_size, scale=None,
              cu_seqlens=None, variant="two-pass") -> None:
    """nsa's own arguments: the gates None or [B, M, H] floating tensors on q's device (q's dtype unless under
    autocast), window_size an int >= 0 (with g_swa given when above 0), block_size a positive int; q, k, v,
    block_indices and block_counts as the branches check them (they check again when they run)."""
    _qkv(q, k, v)
    _positive_int("block_size", block_size)
    _positive_int("window_size", window_size, minimum=0)
    for name, gate in (("g_cmp", g_cmp), ("g_slc", g_slc), ("g_swa", g_swa)):
        if gate is None:
            continue
        _tensor(name, gate, 3, "[B, M, H]")
        _same(name, gate, q.shape[:3], "[B, M, H]")
        if gate.device != q.device:
            raise ValueError(f"{name} is on {gate.device} but q is on {q.device}: all tensors must share a device")
        _same_dtype(q, (name, gate))
    if window_size > 0 and g_swa is None:
        raise ValueError("window_size > 0 needs g_swa, the sliding window's gate [B, M, H]")
    check_variant(variant)
    if block_indices is not None:
        check_forward_inputs(q, k, v, block_indices, block_size, block_counts, cu_seqlens, scale)
        return
    check_scale(scale)
    _selected_counts(q, k.shape[2], block_counts)
    most = block_counts if isinstance(block_counts, int) else int(block_counts.max()) if block_counts.numel() else 0
    if most < 1:
        raise ValueError(f"block_counts must keep at least one block somewhere when nsa selects them (block_indices "
                         f"None), got at most {most}")
    if cu_seqlens is not None:
        check_cu_seqlens(q, k, cu_seqlens)


def check_layer(hidden_size, num_heads, num_kv_heads, head_dim, block_size, block_counts, window_size, rope_theta,
                variant) -> None:
    """NativeSparseAttention's configuration: positive ints (window_size >= 0), num_heads a multiple of
    num_kv_heads, an even head_dim, a positive finite rope_theta, a backward variant."""
    for name, value in (("hidden_size", hidden_size), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim), ("block_size", block_size), ("block_counts", block_counts)):
        _positive_int(name, value)
    _positive_int("window_size", window_size, minimum=0)
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (the rotary embedding rotates its halves), got {head_dim}")
    if not isinstance(rope_theta, numbers.Real) or not math.isfinite(rope_theta) or rope_theta <= 0:
        raise ValueError(f"rope_theta must be a positive finite number, got {rope_theta!r}")
    check_variant(variant)


def check_sliding_window(q, k, v, window_size, scale=None, cu_seqlens=None) -> None:
    """q, k, v as for the selection ops; window_size an int >= 1; scale; cu_seqlens as the selection ops'."""
    check_scale(scale)
    _qkv(q, k, v)
    _positive_int("window_size", window_size)
    if cu_seqlens is not None:
        check_cu_seqlens(q, k, cu_seqlens)


def check_gated_sum(outs: list, gates: list) -> None:
    """layer.gated_sum's branches: 1 to 3 pairs (o_i, g_i), every o_i [B, M, H, Dv] of one shape, dtype and device,
    every g_i None or [B, M, H] in that dtype on that device."""
    if not 1 <= len(outs) <= 3 or len(outs) != len(gates):
        raise ValueError(f"gated_sum takes 1 to 3 (o, g) pairs, got {len(outs) + len(gates)} arguments")
    first = outs[0]
    for i, (o, g) in enumerate(zip(outs, gates), start=1):
        if not isinstance(o, torch.Tensor) or o.dim() != 4:
            raise ValueError(f"gated_sum: o_{i} must be a [B, M, H, Dv] tensor")
        if o.shape != first.shape or o.dtype != first.dtype or o.device != first.device:
            raise ValueError(f"gated_sum: o_{i} must match o_1 ({list(first.shape)} {first.dtype} on {first.device}), "
                             f"got {list(o.shape)} {o.dtype} on {o.device}")
        if g is not None and (not isinstance(g, torch.Tensor) or g.shape != first.shape[:3] or g.dtype != first.dtype
                              or g.device != first.device):
            raise ValueError(f"gated_sum: g_{i} must be None or a {list(first.shape[:3])} {first.dtype} tensor on "
                             f"{first.device}")
