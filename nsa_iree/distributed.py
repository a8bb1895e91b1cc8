"""Context parallelism: one sequence sharded over the ranks of a torch.distributed process group.

``selection_attention(q, k, v, block_indices, ..., group=None)`` is :func:`nsa_iree.selection_attention` for
a sequence whose tokens are split into P contiguous, equal chunks, held by the P ranks of ``group`` in rank
order: rank r holds tokens ``r*C .. r*C + C - 1`` (C = M / P) of q, k, v, block_indices and block_counts, and
block_indices hold block numbers of the whole sequence. Each rank gets its chunk of o, and autograd its chunks
of dq, dk and dv: the numbers one process computes for the whole sequence, up to the order in which the
dk/dv contributions of different ranks are summed.

How it runs (docs/design.md, "Context parallelism"):

- Forward: K and V are all-gathered (two asynchronous all-gathers into chunk-major ``[P, B, C, G, *]``
  buffers). Rank r keeps the prefix of chunks 0..r, L = (r + 1) * C keys, and runs the forward kernel with its
  C query rows against it. They are the prefix's last C rows, and the kernels' bottom-right alignment (row m
  stands at key position m + L - C) puts each at its absolute position; a row sees only blocks at or before
  its own position, all inside the prefix, so every skipping rule (-1, future, past the end, block_counts)
  gives the same result as on the whole sequence.
- Backward: the backward on the prefix writes the dk/dv contributions of this rank's rows to all L keys into
  a zero-padded ``[P, B, C, G, *]`` buffer, and a reduce-scatter (sum) hands every rank the total for its own
  chunk. It runs after the dq pass (OVERLAP_BACKWARD = True starts it asynchronously as soon as dk and dv are
  written, in api.backward_into's after_dkdv hook, and computes dq meanwhile: measured slower on 2 x H200,
  bench/results/distributed_2xH200.md; the one-pass writes all three in one dispatch).
- Why a padded reduce-scatter, not a sequence of reduces: one collective, on every backend (gloo in torch 2.13
  has reduce_scatter_tensor), whose ring moves (P - 1) / P of the buffer per rank; P reduces of one chunk each
  (ranks before the chunk's owner sending zeros) move as much per rank in P collectives, and the unequal
  prefixes save only on the ranks that are not the bottleneck (the last rank holds the full length).
- Checks: before any K or V is sent, one small all-gather of every rank's shapes, dtype and settings. When
  they disagree (chunk lengths differ, say) every rank raises the same error; when a rank's inputs are invalid
  it raises its own error and the others say which rank it was: a bad input never leaves ranks waiting.

Under torch.compile the forward and backward are custom operators holding the collectives (traced, fullgraph
included); every rank of the group must call it, and run the backward, in the same order, as with any
collective.
"""

from __future__ import annotations

import struct
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from . import api
from .api import BlockCounts
from .validate import check_forward_inputs, check_variant

__all__ = ["selection_attention", "sequence_chunk"]

_DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_VARIANT_CODE = {"two-pass": 0, "one-pass": 1}
# What every rank sends in the exchange before the call (one int64 each), and what must agree across ranks.
_FIELDS = ("valid", "B", "q chunk", "H", "D", "k chunk", "G", "Dv", "T", "dtype", "block_size", "variant",
           "scale", "k/v need grad")
_MUST_AGREE = ("B", "q chunk", "H", "D", "G", "Dv", "T", "dtype", "block_size", "variant", "scale",
               "k/v need grad")
# Backends and the tensors they communicate (a "cpu:gloo,cuda:nccl" group names its own).
_BACKEND_DEVICES = {"gloo": ("cpu",), "nccl": ("cuda",)}

# Whether the backward starts the reduce-scatter of dk/dv before dq is computed (True) or after (False). On 2 x H200
# the overlapped collective slowed the dq pass more than it hid (bench/results/distributed_2xH200.md,
# docs/performance.md); bench/distributed_bench.py measures both.
OVERLAP_BACKWARD = False


def _all_gather(stacked: Tensor, mine: Tensor, group, async_op=False):
    """stacked[j] = rank j's `mine` ([P, *mine.shape]; sent as the concatenation along dim 0, the one layout
    gloo takes). torch 2.13 renamed all_gather_into_tensor to all_gather_single."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(stacked.view(-1, *mine.shape[1:]), mine, group=group, async_op=async_op)


def _reduce_scatter(mine: Tensor, stacked: Tensor, group, async_op=False):
    """mine = the sum over ranks of their stacked[r], r this rank ([P, *mine.shape], as in _all_gather).
    torch 2.13 renamed reduce_scatter_tensor to reduce_scatter_single."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(mine, stacked.view(-1, *mine.shape[1:]), group=group, async_op=async_op)


def _group_layout(group):
    """(rank in group, group size, {device type: backend}); RuntimeError naming `group` if there is none."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("nsa_iree.distributed.selection_attention needs torch.distributed initialised "
                           "(torch.distributed.init_process_group, e.g. under torchrun) on every rank; for one "
                           "process use nsa_iree.selection_attention")
    rank = dist.get_rank(group)
    if rank < 0:
        raise RuntimeError("nsa_iree.distributed.selection_attention: this process is not a member of `group`")
    name = str(dist.get_backend(group))
    if ":" in name:
        backends = dict(part.split(":", 1) for part in name.split(","))
    else:
        backends = {device: name for device in _BACKEND_DEVICES.get(name, ("cpu", "cuda"))}
    return rank, dist.get_world_size(group), backends


def _check_device(q, backends) -> None:
    if isinstance(q, Tensor) and q.device.type not in backends:
        raise ValueError(f"q is on {q.device}, but the process group's backend ("
                         + ", ".join(f"{b} for {d}" for d, b in backends.items())
                         + ") does not communicate tensors of that device: use nccl for CUDA tensors and gloo for "
                           "CPU tensors")


def _exchange_device(q, backends) -> torch.device:
    """Where the small exchange tensor lives: q's device when the backend takes it, else one it takes."""
    if isinstance(q, Tensor) and q.device.type in backends:
        return q.device
    if "cuda" in backends and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _scale_bits(scale: float) -> int:
    return struct.unpack("<q", struct.pack("<d", scale))[0]


def _describe_mismatch(table: list[dict]) -> Optional[str]:
    """Why the ranks cannot run together (their fields differ), or None."""
    for field in _MUST_AGREE:
        values = [row[field] for row in table]
        if len(set(values)) > 1:
            if field == "scale":
                values = [struct.unpack("<d", struct.pack("<q", v))[0] for v in values]
            if field == "dtype":
                names = {code: str(dtype) for dtype, code in _DTYPE_CODE.items()}
                values = [names[v] for v in values]
            if field == "variant":
                names = {code: name for name, code in _VARIANT_CODE.items()}
                values = [names[v] for v in values]
            what = {"q chunk": "chunk lengths (q.shape[1])", "k/v need grad": "k/v requires_grad (under grad mode)",
                    "B": "batch sizes (q.shape[0])"}.get(field, field)
            per_rank = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            return (f"the ranks of the group hold different {what} ({per_rank}): every rank must hold an "
                    f"equal-length chunk of one sequence, with the same layout and settings")
    return None


def _check_self_attention(q, k) -> None:
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"k has {k.shape[1]} tokens (k.shape[1]) but q has {q.shape[1]} (q.shape[1]): the "
                         f"distributed call is self-attention over one sequence (M == N), every rank holding "
                         f"the same tokens of q, k and v")


def _exchange_and_check(q, k, v, block_indices, block_size, block_counts, scale, variant, kv_need_grad, rank, size,
                        backends, group) -> float:
    """Validate this rank's inputs, exchange shapes with the other ranks, raise on every rank if any rank
    cannot run. Returns the resolved scale."""
    error, fields = None, {name: -1 for name in _FIELDS}
    try:
        check_forward_inputs(q, k, v, block_indices, block_size, block_counts, scale=scale)
        check_variant(variant)
        _check_self_attention(q, k)
        resolved = api._scale_of(q, scale)
        batch, m_chunk, heads, head_dim = q.shape
        fields.update({"valid": 1, "B": batch, "q chunk": m_chunk, "H": heads, "D": head_dim, "k chunk": k.shape[1],
                       "G": k.shape[2], "Dv": v.shape[3], "T": block_indices.shape[3],
                       "dtype": _DTYPE_CODE[q.dtype], "block_size": block_size, "variant": _VARIANT_CODE[variant],
                       "scale": _scale_bits(resolved),
                       "k/v need grad": int(kv_need_grad)})
    except (TypeError, ValueError) as err:
        error = err
    device = _exchange_device(q, backends)
    mine = torch.tensor([fields[name] for name in _FIELDS], dtype=torch.int64, device=device)
    everyone = torch.empty(size, len(_FIELDS), dtype=torch.int64, device=device)
    _all_gather(everyone, mine, group)
    table = [dict(zip(_FIELDS, row)) for row in everyone.tolist()]
    if error is not None:
        raise error
    bad = [r for r, row in enumerate(table) if row["valid"] != 1]
    if bad:
        raise ValueError(f"nsa_iree.distributed.selection_attention: rank{'s' if len(bad) > 1 else ''} "
                         f"{', '.join(map(str, bad))} of the group rejected its inputs (its own error says why); "
                         f"no rank ran the kernels")
    mismatch = _describe_mismatch(table)
    if mismatch is not None:
        raise ValueError(f"nsa_iree.distributed.selection_attention: {mismatch}")
    return resolved


def _prefix(chunks: Tensor, rank: int) -> Tensor:
    """[B, (rank + 1) * C, G, X] from chunk-major [P, B, C, G, X] (a view when B == 1, else a copy)."""
    _, batch, chunk = chunks.shape[:3]
    first = chunks[: rank + 1]
    if batch == 1:
        return first.view(1, (rank + 1) * chunk, *chunks.shape[3:])
    return first.transpose(0, 1).reshape(batch, (rank + 1) * chunk, *chunks.shape[3:])


def _group_named(group_name: str):
    return dist.distributed_c10d._resolve_process_group(group_name)


def _name_of(group) -> str:
    return (group if group is not None else dist.group.WORLD).group_name


# --- the operators ------------------------------------------------------------------------------------
#
# The sharded forward and backward are torch custom operators, as the single-process ones are (nsa_iree.api), so
# torch.compile traces a model that calls selection_attention (fullgraph included) and runs them as opaque nodes.
# Their bodies hold every collective: the forward exchanges and checks the ranks' shapes, all-gathers K and V and
# runs the kernels on this rank's prefix; it returns the prefix too, which the backward reads. The process group
# travels by name (ProcessGroup.group_name). block_counts is already folded into the int32 block indices.

@torch.library.custom_op("nsa_iree::sharded_selection_attention_fwd", mutates_args=())
def _sharded_fwd_op(q: Tensor, k: Tensor, v: Tensor, block_indices: Tensor, block_size: int, scale: float,
                    variant: str, kv_need_grad: bool, group_name: str, rank: int,
                    checked: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """o [B, C, H, Dv], lse [B, H, C] float32, and this rank's key and value prefix [B, (r + 1) * C, G, *].

    rank: this process's rank in the group, an argument so that a traced graph (whose prefix shape depends on it)
    is never shared between ranks through a compile cache. checked: whether the ranks have already exchanged and
    checked their shapes (eager calls do, before the op)."""
    group = _group_named(group_name)
    _, size, backends = _group_layout(group)
    if not checked:
        _exchange_and_check(q, k, v, block_indices, block_size, None, scale, variant, kv_need_grad, rank, size,
                            backends, group)
    k_all = k.new_empty(size, *k.shape)
    v_all = v.new_empty(size, *v.shape)
    works = [_all_gather(k_all, k.contiguous(), group, async_op=True),
             _all_gather(v_all, v.contiguous(), group, async_op=True)]
    for work in works:
        work.wait()
    k_prefix, v_prefix = _prefix(k_all, rank), _prefix(v_all, rank)
    o, lse = api._forward(q, k_prefix, v_prefix, block_indices, block_size, scale)
    return o, lse, k_prefix, v_prefix


@_sharded_fwd_op.register_fake
def _sharded_fwd_fake(q, k, v, block_indices, block_size, scale, variant, kv_need_grad, group_name, rank, checked):
    batch, chunk, heads, _ = q.shape
    prefix = (rank + 1) * chunk
    return (q.new_empty(batch, chunk, heads, v.shape[3]), q.new_empty(batch, heads, chunk, dtype=torch.float32),
            k.new_empty(batch, prefix, *k.shape[2:]), v.new_empty(batch, prefix, *v.shape[2:]))


@torch.library.custom_op("nsa_iree::sharded_selection_attention_bwd", mutates_args=())
def _sharded_bwd_op(do: Tensor, q: Tensor, k_prefix: Tensor, v_prefix: Tensor, o: Tensor, lse: Tensor,
                    block_indices: Tensor, block_size: int, scale: float, variant: str, need_dq: bool,
                    need_dkdv: bool, group_name: str) -> tuple[Tensor, Tensor, Tensor]:
    """dq [B, C, H, D], dk [B, C, G, D], dv [B, C, G, Dv] of this rank (q's dtype); one not asked for is [0].

    dk and dv: every rank's backward on its prefix leaves float32 contributions to all of the prefix's keys in a
    zero-padded chunk-major buffer; a reduce-scatter adds them (in float32) and hands each rank its chunk, rounded
    once to q's dtype."""
    group = _group_named(group_name)
    rank, size, _ = _group_layout(group)
    batch, chunk = q.shape[0], q.shape[1]
    k_shape = (batch, chunk, *k_prefix.shape[2:])
    v_shape = (batch, chunk, *v_prefix.shape[2:])
    one_pass = variant == "one-pass"                     # one dispatch writes all three
    dq = api._empty(q.shape, q) if need_dq or one_pass else None
    dk = dv = None
    if need_dkdv or one_pass:
        sums = torch.float32
        dk_all = torch.empty((size, *k_shape), dtype=sums, device=q.device)
        dv_all = torch.empty((size, *v_shape), dtype=sums, device=q.device)
        dk_all[rank + 1:].zero_()
        dv_all[rank + 1:].zero_()
        if batch == 1:      # chunk-major is sequence-major: the kernel writes into the buffer itself
            dk, dv = _prefix(dk_all, rank), _prefix(dv_all, rank)
        else:
            dk = api._empty(k_prefix.shape, q, sums)
            dv = api._empty(v_prefix.shape, q, sums)

    pending, mine = [], {}

    def reduce_scatter():
        if batch != 1:
            dk_all[: rank + 1].copy_(dk.view(batch, rank + 1, chunk, *k_shape[2:]).transpose(0, 1))
            dv_all[: rank + 1].copy_(dv.view(batch, rank + 1, chunk, *v_shape[2:]).transpose(0, 1))
        for name, stacked, shape in (("dk", dk_all, k_shape), ("dv", dv_all, v_shape)):
            mine[name] = torch.empty(shape, dtype=sums, device=q.device)
            pending.append(_reduce_scatter(mine[name], stacked, group, async_op=True))

    overlap = need_dkdv and OVERLAP_BACKWARD
    api.backward_into(dq, dk, dv, q, k_prefix, v_prefix, o, lse, do, block_indices, block_size, scale, variant,
                      after_dkdv=reduce_scatter if overlap else None)
    if need_dkdv and not overlap:
        reduce_scatter()
    for work in pending:
        work.wait()
    return (dq if need_dq else q.new_empty(0), mine["dk"].to(q.dtype) if need_dkdv else q.new_empty(0),
            mine["dv"].to(q.dtype) if need_dkdv else q.new_empty(0))


@_sharded_bwd_op.register_fake
def _sharded_bwd_fake(do, q, k_prefix, v_prefix, o, lse, block_indices, block_size, scale, variant, need_dq,
                      need_dkdv, group_name):
    batch, chunk = q.shape[0], q.shape[1]
    return (q.new_empty(q.shape) if need_dq else q.new_empty(0),
            q.new_empty(batch, chunk, *k_prefix.shape[2:]) if need_dkdv else q.new_empty(0),
            q.new_empty(batch, chunk, *v_prefix.shape[2:]) if need_dkdv else q.new_empty(0))


def _sharded_setup_context(ctx, inputs, output):
    q, _k, _v, block_indices, block_size, scale, variant, _kv_need_grad, group_name, _rank, _checked = inputs
    o, lse, k_prefix, v_prefix = output
    ctx.save_for_backward(q, k_prefix, v_prefix, o, lse, block_indices)
    ctx.settings = (block_size, scale, variant, group_name)
    ctx.mark_non_differentiable(lse, k_prefix, v_prefix)


def _sharded_backward(ctx, do, _dlse, _dk_prefix, _dv_prefix):
    q, k_prefix, v_prefix, o, lse, block_indices = ctx.saved_tensors
    block_size, scale, variant, group_name = ctx.settings
    # The exchange made sure every rank agrees on whether k or v needs grad: all ranks reduce, or none.
    need_dq, need_dk, need_dv = ctx.needs_input_grad[:3]
    dq, dk, dv = torch.ops.nsa_iree.sharded_selection_attention_bwd(
        do, q, k_prefix, v_prefix, o, lse, block_indices, block_size, scale, variant, need_dq, need_dk or need_dv,
        group_name)
    return (dq if need_dq else None, dk if need_dk else None, dv if need_dv else None) + (None,) * 8


_sharded_fwd_op.register_autograd(_sharded_backward, setup_context=_sharded_setup_context)


def _not_twice_differentiable(ctx, *grads):
    raise RuntimeError("nsa_iree.distributed.selection_attention is not twice differentiable")


_sharded_bwd_op.register_autograd(_not_twice_differentiable)


def selection_attention(q: Tensor, k: Tensor, v: Tensor, block_indices: Tensor, block_size: int = 64,
                        block_counts: BlockCounts = None, scale: Optional[float] = None,
                        variant: str = "two-pass", group=None) -> Tensor:
    """Differentiable selection attention over a sequence sharded across the ranks of `group`.

    Every rank of `group` (default: the whole world) calls it with its own chunk; the P ranks' chunks,
    concatenated in group-rank order, are one sequence of M = N = P * C tokens (self-attention).

    Args:
        q: [B, C, H, D] float32, float16 or bfloat16: the query rows r*C .. r*C + C - 1 of rank r.
        k: [B, C, G, D] and v: [B, C, G, Dv], q's dtype and device: the same tokens' keys and values.
        block_indices: [B, C, G, T] int32 or int64: the blocks each of this rank's rows attends to, numbered
            in the whole sequence (block i = keys i*BS .. i*BS + BS - 1 of all P * C); skipped slots as in
            nsa_iree.selection_attention (-1, future, past the end).
        block_size: BS, keys per block (C need not be a multiple of it).
        block_counts: None, an int, or a [B, C, G] integer tensor (this rank's rows).
        scale: softmax scale, default D ** -0.5.
        variant: backward variant, "two-pass" or "one-pass" (see nsa_iree.selection_attention).
        group: a torch.distributed process group; nccl for CUDA tensors, gloo for CPU tensors (or a
            "cpu:gloo,cuda:nccl" group). Default: the default group.
    Returns:
        o: [B, C, H, Dv] in q's dtype, this rank's rows. Backpropagating gives this rank's dq [B, C, H, D],
        dk [B, C, G, D] and dv [B, C, G, Dv]: dk and dv summed over the rows of every rank.
    Raises (on every rank, before any key or value is sent; under torch.compile a rank's own bad input raises
    while that rank traces, see the README): ValueError when the ranks' chunk lengths,
    layouts, dtypes or settings differ, when k's chunk is not q's, when a tensor is on a device the
    group's backend does not communicate; a rank's own invalid input raises its usual error there and a
    ValueError naming that rank on the others. RuntimeError when torch.distributed is not initialised.
    A group of one process is the plain nsa_iree.selection_attention. Under torch.autocast the floating
    inputs are first cast to the autocast dtype, as the plain call does.
    """
    rank, size, backends = _group_layout(group)
    _check_device(q, backends)
    if size == 1:
        return api.selection_attention(q, k, v, block_indices, block_size, block_counts, scale, variant)
    if all(isinstance(t, Tensor) for t in (q, k, v)):
        q, k, v = api._autocast(q, k, v)           # the single-process call's rule (nsa_iree.api)
    kv_need_grad = torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in (k, v))
    if torch.compiler.is_compiling():
        # Traced: this rank's inputs are checked here, the ranks' shapes inside the operator when it runs.
        check_forward_inputs(q, k, v, block_indices, block_size, block_counts, scale=scale)
        check_variant(variant)
        _check_self_attention(q, k)
        resolved, checked = api._scale_of(q, scale), False
    else:
        resolved = _exchange_and_check(q, k, v, block_indices, block_size, block_counts, scale, variant,
                                       kv_need_grad, rank, size, backends, group)
        checked = True
    if checked and (q.shape[0] == 0 or q.shape[1] == 0):   # exchanged: every rank holds an empty chunk
        # (traced calls go through the operator, whose exchange every rank joins, empty or not)
        return api.selection_attention(q, k, v, block_indices, block_size, block_counts, scale, variant)
    idx = api.effective_block_indices(block_indices, block_counts)
    o, _, _, _ = _sharded_fwd_op(q, k, v, idx, block_size, resolved, variant, kv_need_grad, _name_of(group), rank,
                              checked)
    return o


def sequence_chunk(x: Tensor, group=None, dim: int = 1) -> Tensor:
    """This rank's contiguous chunk of a whole-sequence tensor (a view): the input layout of selection_attention.

    Args:
        x: any tensor whose dimension `dim` is the sequence (q, k, v, block_indices, block_counts: dim 1).
        group: the process group the sequence is sharded over (default: the world).
    Returns:
        x narrowed to positions r*C .. r*C + C - 1 of `dim`, C = x.shape[dim] / P, r this process's rank.
    Raises ValueError when x.shape[dim] is not divisible by the group's size P.
    """
    rank, size, _ = _group_layout(group)
    length = x.shape[dim]
    if length % size:
        raise ValueError(f"x has {length} positions along dim {dim}, not divisible by the {size} ranks of the "
                         f"group: context parallelism needs equal chunks (pad the sequence to a multiple of {size})")
    chunk = length // size
    return x.narrow(dim, rank * chunk, chunk)
