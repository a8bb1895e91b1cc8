"""NSA's compression branch: the compressed keys and values its attention reads (docs/semantics.md, 'The
compression branch and block selection').

``mean_pooling`` is a memory-bound reduction: on GPUs plain torch (with autograd for its backward), on the CPU
IREE dispatches (kernels/common/pooling.mlir) so that the branch's calls follow one another on IREE's workers with
no torch parallel op between them (each hands the cores to torch's OpenMP threads, which then spin on them:
docs/runtime.md, 'CPU threads'). ``compressed_attention`` runs on the selection kernels of every target: a dense
attention over the compressed keys is a selection of every tile of them, with the rows standing for positions
and key c visible from position (c + 1) BS - 1 on (KernelSpec.key_stride, kernels/common/rules.mlir).
"""

from __future__ import annotations

import functools

import torch

from . import api, packing, validate


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
    layout = (tuple(lengths), tuple(padded or lengths), block_size)
    if x.device.type == "cpu":
        # traced code makes the counts a constant of the graph; eager code reuses them per layout
        counts = _block_counts_of(*layout) if torch.compiler.is_compiling() else _block_counts(*layout)
        return torch.ops.nsa_iree.block_means(x, counts, block_size)
    batch, total, groups, dim = x.shape
    full, rest = divmod(total, block_size)
    sums = x[:, :full * block_size].reshape(batch, full, block_size, groups, dim).sum(dim=2, dtype=torch.float32)
    if rest:
        sums = torch.cat([sums, x[:, full * block_size:].sum(dim=1, keepdim=True, dtype=torch.float32)], dim=1)
    divisors = _block_counts_of(*layout).to(x.device).view(1, -1, 1, 1)
    return (sums / divisors).to(x.dtype)


def _block_counts_of(lengths: tuple[int, ...], padded: tuple[int, ...], block_size: int) -> torch.Tensor:
    """[C] float32 on the CPU: the tokens of each block of sequences of `lengths` tokens laid out over `padded`."""
    return torch.tensor([min(block_size, n - i * block_size) for n, p in zip(lengths, padded)
                         for i in range(-(-p // block_size))], dtype=torch.float32)


_block_counts = functools.lru_cache(maxsize=16)(_block_counts_of)      # once per layout in a training loop


def _pooling_module(x: torch.Tensor, block_size: int):
    """The CPU pooling module for x's G, D and dtype and `block_size` (kernels/common/pooling.mlir)."""
    from .spec import KernelSpec, target_cpu_from_environment

    spec = KernelSpec(heads=x.shape[2], kv_heads=x.shape[2], head_dim=x.shape[3], value_dim=x.shape[3],
                      block_size=block_size, num_blocks=1, dtype=api._DTYPE_NAME[x.dtype], target="cpu",
                      target_cpu=target_cpu_from_environment())
    return api.kernels(spec, "pooling", x.device)


@torch.library.custom_op("nsa_iree::block_means", mutates_args=())
def _block_means_op(x: torch.Tensor, counts: torch.Tensor, block_size: int) -> torch.Tensor:
    """[B, C, G, D]: block c of x [B, P, G, D] (BS tokens a block, the last one short) summed in float32, over
    counts[c] (its tokens, float32), rounded once to x's dtype (C = counts' length)."""
    y = api.output_buffer((x.shape[0], counts.shape[0], *x.shape[2:]), x)
    if y.numel():
        _pooling_module(x, block_size).call("block_means", x.contiguous(), counts, y)
    return y


@_block_means_op.register_fake
def _block_means_fake(x, counts, block_size):
    return x.new_empty((x.shape[0], counts.shape[0], *x.shape[2:]))


@torch.library.custom_op("nsa_iree::block_means_bwd", mutates_args=())
def _block_means_bwd_op(dy: torch.Tensor, counts: torch.Tensor, tokens: int, block_size: int) -> torch.Tensor:
    """[B, tokens, G, D]: each token's block's dy over the block's count, rounded once."""
    dx = api.output_buffer((dy.shape[0], tokens, *dy.shape[2:]), dy)
    if dx.numel():
        _pooling_module(dy, block_size).call("block_means_grad", dy.contiguous(), counts, tokens, dx)
    return dx


@_block_means_bwd_op.register_fake
def _block_means_bwd_fake(dy, counts, tokens, block_size):
    return dy.new_empty((dy.shape[0], tokens, *dy.shape[2:]))


def _block_means_setup(ctx, inputs, output):
    x, counts, block_size = inputs
    ctx.save_for_backward(counts)
    ctx.tokens, ctx.block_size = x.shape[1], block_size


def _block_means_backward(ctx, dy):
    (counts,) = ctx.saved_tensors
    return torch.ops.nsa_iree.block_means_bwd(dy, counts, ctx.tokens, ctx.block_size), None, None


def _block_means_bwd_setup(ctx, inputs, output):
    dy, counts, tokens, block_size = inputs
    ctx.save_for_backward(counts)
    ctx.block_size = block_size


def _block_means_bwd_backward(ctx, ddx):
    """The pooling's backward is linear in dy: its adjoint is the pooling itself (so mean_pooling is differentiable
    twice, as torch's mean is)."""
    (counts,) = ctx.saved_tensors
    return torch.ops.nsa_iree.block_means(ddx, counts, ctx.block_size), None, None, None


_block_means_op.register_autograd(_block_means_backward, setup_context=_block_means_setup)
_block_means_bwd_op.register_autograd(_block_means_bwd_backward, setup_context=_block_means_bwd_setup)


# The compressed attention runs on the selection kernels (every family) with KernelSpec.key_stride = its block
# size: the compressed keys in tiles (the kernels' blocks), every row listing all the tiles (the kernels skip those
# past the row's position) and the rows standing for every position (kernels/common/rules.mlir). Tiles of 64 keys
# on GPUs (the matrix-unit kernels' block sizes); of 32 on CPUs, whose dk/dv kernel scores a whole tile per row
# (the invisible keys of a row's last tile included) and whose every kernel pays a fixed cost per (row, tile).
TILE = {"cpu": 32}
DEFAULT_TILE = 64


def _tile(device: torch.device) -> int:
    return TILE.get(device.type, DEFAULT_TILE)


def compressed_attention(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, block_size: int,
                         scale: float | None = None, *, seq_len: int | None = None,
                         cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """NSA's compression branch: every query row attends to the compressed blocks complete at its position.

    Args:
        q: [B, M, H, D] float32, float16 or bfloat16; the rows are the last M of N positions, row m at
            p = m + N - M.
        k_cmp: [B, C, G, D] in q's dtype, C = ceil(N / block_size): compressed keys (e.g. mean_pooling of k, or
            a learned compression computed by the caller); H a multiple of G, head h reads kv head h // (H / G).
        v_cmp: [B, C, G, Dv] in q's dtype.
        block_size: BS, positions per compressed block: block c is seen from position (c + 1) * BS - 1 on.
        scale: the softmax scale, default D ** -0.5.
        seq_len: N, default M. With M < N the kernels run over all N positions (the rows before the first query
            row zero, their slots skipped): the cost grows with N, not M.
        cu_seqlens: None, or [S + 1] int32 with B = 1 and M = N packed tokens: every sequence alone, its
            compressed blocks one after another in k_cmp and v_cmp (as mean_pooling lays them out).
    Returns:
        o [B, M, H, Dv] in q's dtype and lse [B, H, M] float32 (natural log). A row that sees no block (the first
        BS - 1 positions) gets o = 0, lse = -inf and zero gradients. Differentiable in q, k_cmp and v_cmp; the
        backward is the selection kernels' two-pass one, without atomics (bitwise reproducible).

    Raises a TypeError or ValueError naming the argument for bad input, before anything compiles.
    """
    validate.check_compressed_attention(q, k_cmp, v_cmp, block_size, scale, seq_len, cu_seqlens)
    if cu_seqlens is not None:
        validate.check_packed_blocks(cu_seqlens, q.shape[1], block_size, k_cmp.shape[1])
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    q, k_cmp, v_cmp = api._autocast(q, k_cmp, v_cmp)
    n = q.shape[1] if seq_len is None else seq_len
    return torch.ops.nsa_iree.compressed_attention_fwd(q, k_cmp, v_cmp, block_size, scale, n, cu_seqlens)


# --- the operators (as the selection ones: a fake each, autograd on the forward, autocast on both) ----------
#
# cu_seqlens is runtime data inside the bodies: every sequence runs alone on its rows and its compressed blocks.

@torch.library.custom_op("nsa_iree::compressed_attention_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, block_size: int, scale: float, seq_len: int,
            cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """o [B, M, H, Dv] (q's dtype) and lse [B, H, M] (float32)."""
    if cu_seqlens is None:
        return _forward(q, k_cmp, v_cmp, block_size, scale, seq_len)
    outs = [_forward(q[:, a:b], k_cmp[:, c:d], v_cmp[:, c:d], block_size, scale, b - a)
            for (a, b), (c, d) in _sequences(cu_seqlens, block_size)]
    if not outs:
        return _forward(q, k_cmp, v_cmp, block_size, scale, 0)
    return torch.cat([o for o, _ in outs], dim=1), torch.cat([lse for _, lse in outs], dim=2)


@_fwd_op.register_fake
def _fwd_fake(q, k_cmp, v_cmp, block_size, scale, seq_len, cu_seqlens=None):
    batch, m_rows, heads, _ = q.shape
    return q.new_empty(batch, m_rows, heads, v_cmp.shape[3]), q.new_empty(batch, heads, m_rows, dtype=torch.float32)


@torch.library.custom_op("nsa_iree::compressed_attention_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, o: torch.Tensor,
            lse: torch.Tensor, block_size: int, scale: float, seq_len: int,
            cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk_cmp, dv_cmp in q's dtype."""
    if cu_seqlens is None:
        return _backward(do, q, k_cmp, v_cmp, o, lse, block_size, scale, seq_len)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k_cmp), torch.zeros_like(v_cmp)
    for (a, b), (c, d) in _sequences(cu_seqlens, block_size):
        dq[:, a:b], dk[:, c:d], dv[:, c:d] = _backward(do[:, a:b], q[:, a:b], k_cmp[:, c:d], v_cmp[:, c:d],
                                                       o[:, a:b], lse[:, :, a:b], block_size, scale, b - a)
    return dq, dk, dv


@_bwd_op.register_fake
def _bwd_fake(do, q, k_cmp, v_cmp, o, lse, block_size, scale, seq_len, cu_seqlens=None):
    return q.new_empty(q.shape), k_cmp.new_empty(k_cmp.shape), v_cmp.new_empty(v_cmp.shape)


def _setup_context(ctx, inputs, output):
    q, k_cmp, v_cmp, block_size, scale, seq_len, cu_seqlens = inputs
    ctx.save_for_backward(q, k_cmp, v_cmp, *output, cu_seqlens)
    ctx.block_size, ctx.scale, ctx.seq_len = block_size, scale, seq_len
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)     # no zeros made for lse (api.py: _fwd_setup_context)


def _fwd_backward(ctx, do, _dlse):
    if do is None:
        return (None,) * 7
    q, k_cmp, v_cmp, o, lse, cu_seqlens = ctx.saved_tensors
    dq, dk, dv = torch.ops.nsa_iree.compressed_attention_bwd(do, q, k_cmp, v_cmp, o, lse, ctx.block_size, ctx.scale,
                                                             ctx.seq_len, cu_seqlens)
    return dq, dk, dv, None, None, None, None


api.register_operator_pair("compressed_attention", _fwd_op, _bwd_op, _fwd_backward, _setup_context, (0, 1, 2),
                           (0, 1, 2, 3, 4))


def _sequences(cu_seqlens: torch.Tensor, block_size: int):
    """((a, b), (c, d)) per non-empty packed sequence: its tokens a .. b - 1 and its compressed blocks c .. d - 1."""
    bounds = [int(x) for x in cu_seqlens.tolist()]
    first = 0
    for a, b in zip(bounds[:-1], bounds[1:]):
        blocks = -(-(b - a) // block_size)
        if b > a:
            yield (a, b), (first, first + blocks)
        first += blocks


def _positions(q: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """q laid out over the N positions (rows before the first query row zero) and the first query row's position
    p0 = N - M; rows at negative positions (M > N) are dropped (they see nothing)."""
    m_rows = q.shape[1]
    if n == m_rows:
        return q, 0
    if n > m_rows:
        return torch.cat([q.new_zeros(q.shape[0], n - m_rows, *q.shape[2:]), q], dim=1), n - m_rows
    return q[:, m_rows - n:], n - m_rows


def tile_slots(keys: int, tile: int) -> int:
    """The kernels' T for `keys` compressed keys in tiles of `tile`: the tiles rounded up to a power of two."""
    return 1 << (-(-keys // tile) - 1).bit_length()


@functools.lru_cache(maxsize=8)
def _tile_indices(batch: int, n: int, p0: int, groups: int, keys: int, device) -> torch.Tensor:
    """[B, N, G, T] int32: every tile of the keys for the rows at positions >= p0, -1 for the rows before and in the
    slots past the last tile. T is the tiles rounded up to a power of two, so that lengths share modules (T is
    compiled in: one module per power of two, not per length); the kernels skip the extra slots. Made once per
    shape (a training loop's every step reuses it; the kernels only read it)."""
    tiles = -(-keys // _tile(device))
    slots = tile_slots(keys, _tile(device))
    idx = torch.arange(slots, dtype=torch.int32, device=device)
    idx = torch.where(idx < tiles, idx, -1).expand(batch, n, groups, slots).clone()
    if p0 > 0:
        idx[:, :p0] = -1
    return idx


def _forward(q, k_cmp, v_cmp, block_size, scale, n):
    """o and lse of one (unpacked) problem: the selection forward over every tile of the compressed keys."""
    batch, m_rows, heads, _ = q.shape
    if 0 in (batch, m_rows, n, k_cmp.shape[1]):
        return (q.new_zeros(batch, m_rows, heads, v_cmp.shape[3]),
                torch.full((batch, heads, m_rows), float("-inf"), dtype=torch.float32, device=q.device))
    qp, p0 = _positions(q, n)
    idx = _tile_indices(batch, n, p0, k_cmp.shape[2], k_cmp.shape[1], q.device)
    o = api.output_buffer((batch, n, heads, v_cmp.shape[3]), q)
    lse = api.output_buffer((batch, heads, n), q, torch.float32)
    api.forward_into(o, lse, qp.contiguous(), k_cmp.contiguous(), v_cmp.contiguous(), idx, _tile(q.device), scale,
                     key_stride=block_size)
    return _from_positions(o, p0, m_rows, 1, 0.0), _from_positions(lse, p0, m_rows, 2, float("-inf"))


def _backward(do, q, k_cmp, v_cmp, o, lse, block_size, scale, n):
    """dq, dk_cmp, dv_cmp of one (unpacked) problem: the selection two-pass backward (no atomics)."""
    batch, m_rows = q.shape[:2]
    if 0 in (batch, m_rows, n, k_cmp.shape[1]):
        return torch.zeros_like(q), torch.zeros_like(k_cmp), torch.zeros_like(v_cmp)
    qp, p0 = _positions(q, n)
    op, dop = _positions(o, n)[0], _positions(do, n)[0]
    if p0 > 0:          # the rows before the first query row: -inf, they see nothing
        lsep = lse.new_full((batch, lse.shape[1], n), float("-inf"))
        lsep[:, :, p0:] = lse
    else:
        lsep = lse[:, :, -p0:]
    idx = _tile_indices(batch, n, p0, k_cmp.shape[2], k_cmp.shape[1], q.device)
    dq = api.output_buffer(qp.shape, q)
    dk, dv = api.output_buffer(k_cmp.shape, k_cmp), api.output_buffer(v_cmp.shape, v_cmp)
    api.backward_into(dq, dk, dv, qp.contiguous(), k_cmp.contiguous(), v_cmp.contiguous(), op.contiguous(),
                      lsep.contiguous(), dop.contiguous(), idx, _tile(q.device), scale, "two-pass",
                      key_stride=block_size, fixed_blocks=True)
    return _from_positions(dq, p0, m_rows, 1, 0.0), dk, dv


def _from_positions(x: torch.Tensor, p0: int, m_rows: int, dim: int, fill: float) -> torch.Tensor:
    """The M query rows of x laid out over the positions (dim `dim`): positions p0 .. N - 1, after -p0 rows of
    `fill` where rows stand before position 0 (M > N). x itself when the rows are the positions."""
    if p0 == 0:
        return x
    if p0 > 0:
        return x.narrow(dim, p0, x.shape[dim] - p0).contiguous()
    shape = list(x.shape)
    shape[dim] = -p0
    return torch.cat([x.new_full(shape, fill), x], dim=dim)


# --- select_blocks: the top-n block selection (hand-written kernels: cpu/, gpu/nvidia/, gpu/portable/) ------------


def select_blocks(q: torch.Tensor, k_cmp: torch.Tensor, block_counts: torch.Tensor | int, block_size: int,
                  scale: float | None = None, *, lse: torch.Tensor | None = None, seq_len: int | None = None,
                  cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """NSA's top-n block selection: the blocks each (row, kv head) reads in ``selection_attention``.

    Row m at position p = m + N - M ranks the blocks c = 0 .. p // BS: its own block p // BS, then p // BS - 1,
    then block 0 (the forced blocks, each once), then the others by descending score, the mean over the
    group's query heads of exp(scale * q . k_cmp[c] - lse) (their compressed-attention probability); equal
    scores go to the lower block id, NaN scores last. It keeps the first count of them; every other slot is -1.

    Args:
        q: [B, M, H, D] float32, float16 or bfloat16.
        k_cmp: [B, C, G, D] in q's dtype, C = ceil(N / block_size) (with cu_seqlens, every sequence's blocks one
            after another, as mean_pooling lays them out); H a multiple of G.
        block_counts: an int >= 0 (S = it), or a [B, M, G] int32/int64 tensor on q's device (S = its maximum,
            0 if it is empty; each row keeps its own count, entries below 0 count as 0).
        block_size: BS, the compression's block size and the selection's (one for both).
        scale: the softmax scale, default D ** -0.5.
        lse: None (computed with compressed_attention(q, k_cmp, k_cmp, ...)), or [B, H, M] float32 on q's device:
            compressed_attention's lse of these inputs.
        seq_len: N, default M.
        cu_seqlens: None, or [S + 1] int32 with B = 1 and M = N packed tokens: every sequence alone, its block
            ids relative to the sequence (as selection_attention takes them).
    Returns:
        block_indices [B, M, G, S] int32, ready for selection_attention(q, k, v, block_indices, block_size).
        Not differentiable (computed without autograd whatever the inputs require).

    Raises a TypeError or ValueError naming the argument for bad input, and NotImplementedError on a layout
    without a select_blocks kernel (on NVIDIA GPUs H / G other than 16, on AMD GPUs H / G above 16 or D not a
    multiple of 32, S above 32 on both), before anything compiles. On a GPU the scores are summed in another
    order than the CPU kernel's and the oracle's: blocks whose scores agree to rounding (a relative 1e-7) may come
    in either order.
    """
    validate.check_select_blocks(q, k_cmp, block_counts, block_size, scale, lse, seq_len, cu_seqlens)
    if cu_seqlens is not None:
        validate.check_packed_blocks(cu_seqlens, q.shape[1], block_size, k_cmp.shape[1])
    width = block_counts if isinstance(block_counts, int) else (
        max(int(block_counts.max()), 0) if block_counts.numel() else 0)
    batch, m_rows, heads, dim = q.shape
    q, k_cmp = api._autocast(q.detach(), k_cmp.detach())        # the spec's dtype is the cast one
    if not torch.compiler.is_compiling():      # a kernel for this target before anything runs (traced: in the op)
        _select_spec(q, k_cmp.shape[2], block_size, max(width, 1))
    scale = float(dim ** -0.5 if scale is None else scale)
    n = m_rows if seq_len is None else seq_len
    if isinstance(block_counts, int):
        counts = torch.full((batch, m_rows, k_cmp.shape[2]), block_counts, dtype=torch.int32, device=q.device)
    else:
        counts = block_counts.detach().clamp(0, max(width, 0)).to(torch.int32)
    if lse is None and 0 not in (batch, m_rows, width):
        lse = compressed_attention(q, k_cmp, k_cmp, block_size, scale, seq_len=seq_len, cu_seqlens=cu_seqlens)[1]
    lse = q.new_empty((batch, heads, m_rows), dtype=torch.float32) if lse is None else lse.detach()
    return torch.ops.nsa_iree.select_blocks(q, k_cmp, lse, counts, block_size, width, scale, n, cu_seqlens)


@torch.library.custom_op("nsa_iree::select_blocks", mutates_args=())
def _select_op(q: torch.Tensor, k_cmp: torch.Tensor, lse: torch.Tensor, counts: torch.Tensor, block_size: int,
               width: int, scale: float, seq_len: int, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """block_indices [B, M, G, width] int32 (select_blocks' kernel: counts clamped, lse given)."""
    batch, m_rows, groups = counts.shape
    spec = _select_spec(q, groups, block_size, max(width, 1))
    if 0 in (batch, m_rows, width) or cu_seqlens is not None:
        out = torch.full((batch, m_rows, groups, width), -1, dtype=torch.int32, device=q.device)
    else:
        out = api.output_buffer((batch, m_rows, groups, width), counts)       # the kernel writes every slot
    if 0 in (batch, m_rows, width):
        return out
    if cu_seqlens is None:
        return _select(out, q, k_cmp, lse, counts, scale, seq_len, spec)
    for (a, b), (c, d) in _sequences(cu_seqlens, block_size):
        out[:, a:b] = _select(api.output_buffer((batch, b - a, groups, width), counts), q[:, a:b], k_cmp[:, c:d],
                              lse[:, :, a:b], counts[:, a:b], scale, b - a, spec)
    return out


@_select_op.register_fake
def _select_fake(q, k_cmp, lse, counts, block_size, width, scale, seq_len, cu_seqlens=None):
    return counts.new_empty((*counts.shape, width), dtype=torch.int32)


def _select_spec(q: torch.Tensor, groups: int, block_size: int, width: int):
    """The KernelSpec of select_blocks' kernel (T = the output slots, BS = the compression's block size), checked
    to have a kernel on q's target (NotImplementedError otherwise) before anything compiles."""
    from .spec import KernelSpec, kernels_from_environment, target_cpu_from_environment

    target = api._target_for(q.device)
    spec = KernelSpec(heads=q.shape[2], kv_heads=groups, head_dim=q.shape[3], value_dim=q.shape[3],
                      block_size=block_size, num_blocks=width, dtype=api._DTYPE_NAME[q.dtype], target=target,
                      target_cpu=target_cpu_from_environment() if target == "cpu" else "host",
                      kernels=kernels_from_environment())
    _check_select_kernel(spec)
    return spec


@functools.lru_cache(maxsize=None)
def _check_select_kernel(spec) -> None:
    """choose()'s verdict on select_blocks for spec, once per spec and process (a training step asks every call;
    the recipe is read once, as the compiled module is looked up once: api._artifact_path)."""
    from .kernels import choose
    from .recipes import load_recipe

    choose("select_blocks", spec, load_recipe(spec.target))


def _select(out, q, k_cmp, lse, counts, scale, n, spec):
    """out [B, M, G, S] int32 (a fresh contiguous buffer, which the kernel writes whole) for one (unpacked)
    problem; returns out."""
    if n == 0 or k_cmp.shape[1] == 0:           # every row before position 0 (or none): nothing selected
        return out.fill_(-1)
    module = api.kernels(spec, "select", q.device)
    module.call("select_blocks", q.contiguous(), k_cmp.contiguous(), lse.contiguous(), counts.contiguous(), scale, n,
                out)
    return out
