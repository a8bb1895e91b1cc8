"""The compression branch's f64 oracles (mean pooling, compressed attention, top-n selection) against loops
written here from docs/semantics.md, their edge cases, and the input checks of nsa_iree.validate."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from nsa_iree.reference import (compressed_attention_backward_reference, compressed_attention_reference,
                                mean_pooling_reference, select_blocks_reference, selection_attention_reference)
from nsa_iree.validate import (check_compressed_attention, check_compressed_attention_backward,
                               check_mean_pooling, check_packed_blocks, check_select_blocks)

F64 = torch.float64
NEG_INF = float("-inf")


# ---------------------------------------------------------------------------------------------------------------
# Loops: one row, one head, one block at a time, from the semantics page.


def loop_mean_pooling(x, bs, lengths=None):
    """[B, C, G, D] f64; lengths: the packed sequences (B = 1)."""
    spans = [(0, x.shape[1])] if lengths is None else spans_of(lengths)
    out = []
    for b in range(x.shape[0]):
        blocks = []
        for a, e in spans:
            for start in range(a, e, bs):
                tokens = [x[b, t].to(F64) for t in range(start, min(start + bs, e))]
                blocks.append(sum(tokens) / len(tokens))
        out.append(torch.stack(blocks) if blocks else x.new_zeros(0, *x.shape[2:], dtype=F64))
    return torch.stack(out)


def spans_of(lengths):
    spans, at = [], 0
    for n in lengths:
        spans.append((at, at + n))
        at += n
    return spans


def loop_compressed(q, kc, vc, bs, scale, n):
    """o [B, M, H, Dv], lse [B, H, M] (f64) for one unpacked problem with N = n keys."""
    batch, m_rows, heads, _ = q.shape
    hpg = heads // kc.shape[2]
    o = torch.zeros(batch, m_rows, heads, vc.shape[3], dtype=F64)
    lse = torch.full((batch, heads, m_rows), NEG_INF, dtype=F64)
    for b in range(batch):
        for m in range(m_rows):
            p = m + n - m_rows
            seen = [c for c in range(kc.shape[1]) if (c + 1) * bs - 1 <= p]
            for h in range(heads):
                if not seen:
                    continue
                g = h // hpg
                s = [scale * float(q[b, m, h].to(F64) @ kc[b, c, g].to(F64)) for c in seen]
                top = max(s)
                total = sum(math.exp(x - top) for x in s)
                lse[b, h, m] = top + math.log(total)
                for x, c in zip(s, seen):
                    o[b, m, h] += math.exp(x - top) / total * vc[b, c, g].to(F64)
    return o, lse


def loop_select(q, kc, counts, bs, scale, n, width):
    """[B, M, G, width] int32 for one unpacked problem; counts an int or [B, M, G]."""
    batch, m_rows, heads, _ = q.shape
    groups = kc.shape[2]
    hpg = heads // groups
    _, lse = loop_compressed(q, kc, torch.zeros(*kc.shape[:3], 1), bs, scale, n)
    out = torch.full((batch, m_rows, groups, width), -1, dtype=torch.int32)
    for b in range(batch):
        for m in range(m_rows):
            p = m + n - m_rows
            if p < 0:
                continue
            own = p // bs
            for g in range(groups):
                forced = []
                for c in (own, own - 1, 0):
                    if c >= 0 and c not in forced:
                        forced.append(c)
                score = {}
                for c in range(own + 1):
                    if c in forced:
                        continue
                    probs = [math.exp(scale * float(q[b, m, h].to(F64) @ kc[b, c, g].to(F64)) - float(lse[b, h, m]))
                             for h in range(g * hpg, (g + 1) * hpg)]
                    score[c] = sum(probs) / hpg
                ranked = forced + sorted(score, key=lambda c: (-score[c], c))
                count = counts if isinstance(counts, int) else int(counts[b, m, g])
                chosen = ranked[:max(0, min(count, width))]
                out[b, m, g, :len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Layouts.


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int = 2
    m_rows: int = 37
    n: int = 37
    heads: int = 4
    groups: int = 2
    dim: int = 8
    vdim: int = 8
    bs: int = 4
    scale: float | None = None

    @property
    def blocks(self) -> int:
        return -(-self.n // self.bs)

    def inputs(self, seed=0, dtype=F64):
        gen = torch.Generator().manual_seed(seed)
        q = torch.randn(self.batch, self.m_rows, self.heads, self.dim, generator=gen, dtype=F64)
        kc = torch.randn(self.batch, self.blocks, self.groups, self.dim, generator=gen, dtype=F64)
        vc = torch.randn(self.batch, self.blocks, self.groups, self.vdim, generator=gen, dtype=F64)
        return q.to(dtype), kc.to(dtype), vc.to(dtype)

    @property
    def used_scale(self) -> float:
        return self.dim ** -0.5 if self.scale is None else self.scale


CASES = {
    "m_eq_n": Case(),
    "m_lt_n": Case(m_rows=9, n=40),
    "n_not_multiple_of_bs": Case(m_rows=45, n=45, bs=8),
    "m_lt_n_partial_last_block": Case(m_rows=5, n=43, bs=8),
    "only_first_bs_minus_1_rows": Case(m_rows=7, n=7, bs=8),
    "m_gt_n": Case(m_rows=10, n=6, bs=2),
    "single_row": Case(batch=1, m_rows=1, n=33, bs=4),
    "d_ne_dv": Case(dim=16, vdim=5),
    "hpg1": Case(heads=3, groups=3),
    "hpg3": Case(heads=6, groups=2),
    "hpg64": Case(batch=1, m_rows=20, n=20, heads=64, groups=1, dim=4, vdim=3),
    "custom_scale": Case(scale=0.9),
    "bs1": Case(m_rows=6, n=6, bs=1),
    "no_rows": Case(m_rows=0, n=0),
}


def call_kwargs(case):
    return dict(scale=case.scale, seq_len=None if case.n == case.m_rows else case.n)


# ---------------------------------------------------------------------------------------------------------------
# Mean pooling.


@pytest.mark.parametrize("n, bs", [(16, 4), (17, 4), (3, 8), (1, 1), (0, 4), (31, 16)],
                         ids=["multiple", "one_extra", "shorter_than_a_block", "bs1", "empty", "partial_last"])
def test_mean_pooling_matches_loops(n, bs):
    x = torch.randn(2, n, 3, 5)
    ref = mean_pooling_reference(x, bs)
    assert ref.dtype == F64 and ref.shape == (2, -(-n // bs), 3, 5)
    torch.testing.assert_close(ref, loop_mean_pooling(x, bs), rtol=1e-12, atol=1e-12)


PACKED_LENGTHS = {
    "mixed": (5, 0, 8, 1, 13, 3),
    "empty_first_and_last": (0, 9, 0),
    "all_empty": (0, 0),
    "no_sequence": (),
    "one_long": (23,),
    "shorter_than_a_block": (1, 2, 3),
}


def cu_of(lengths):
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("lengths", PACKED_LENGTHS.values(), ids=list(PACKED_LENGTHS))
def test_mean_pooling_packed(lengths):
    bs = 4
    x = torch.randn(1, sum(lengths), 2, 3)
    ref = mean_pooling_reference(x, bs, cu_of(lengths))
    torch.testing.assert_close(ref, loop_mean_pooling(x, bs, lengths), rtol=1e-12, atol=1e-12)
    separate = [mean_pooling_reference(x[:, a:e], bs) for a, e in spans_of(lengths)]
    assert torch.equal(ref, torch.cat(separate, dim=1) if separate else ref)


def test_mean_pooling_gradient():
    x = torch.randn(1, 10, 2, 3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: mean_pooling_reference(x, 4), (x,))
    mean_pooling_reference(x, 4).sum().backward()
    # every token gets 1 / (tokens of its block): 1/4 for the two whole blocks, 1/2 for the last one
    assert torch.allclose(x.grad[0, :, 0, 0], torch.tensor([0.25] * 8 + [0.5] * 2, dtype=F64))


# ---------------------------------------------------------------------------------------------------------------
# Compressed attention.


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_compressed_attention_matches_loops(case):
    q, kc, vc = case.inputs()
    o, lse = compressed_attention_reference(q, kc, vc, case.bs, **call_kwargs(case))
    o_loop, lse_loop = loop_compressed(q, kc, vc, case.bs, case.used_scale, case.n)
    assert o.dtype == lse.dtype == F64
    assert o.shape == (case.batch, case.m_rows, case.heads, case.vdim)
    assert lse.shape == (case.batch, case.heads, case.m_rows)
    torch.testing.assert_close(o, o_loop, rtol=1e-10, atol=1e-12)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_loop))
    torch.testing.assert_close(lse, lse_loop, rtol=1e-10, atol=1e-12)


def test_rows_that_see_nothing():
    # BS = 4, N = 10: rows 0..2 see no block, row 3 sees block 0, row 9 blocks 0 and 1 (block 2 is partial).
    q, kc, vc = (t.requires_grad_() for t in Case(batch=1, m_rows=10, n=10, bs=4).inputs())
    o, lse = compressed_attention_reference(q, kc, vc, 4)
    assert torch.all(o[0, :3] == 0) and torch.all(lse[0, :, :3] == NEG_INF)
    assert torch.isfinite(lse[0, :, 3:]).all()
    torch.testing.assert_close(o[0, 3], vc[0, 0].repeat_interleave(2, dim=0).detach())   # one block: p = 1
    (o.sum() + lse[torch.isfinite(lse)].sum()).backward()
    assert not any(torch.isnan(t.grad).any() for t in (q, kc, vc))
    assert torch.all(q.grad[0, :3] == 0) and torch.all(kc.grad[0, 2] == 0) and torch.all(vc.grad[0, 2] == 0)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_compressed_backward_matches_autograd(case):
    q, kc, vc = (t.requires_grad_() for t in case.inputs(seed=3))
    kwargs = call_kwargs(case)
    o, lse = compressed_attention_reference(q, kc, vc, case.bs, **kwargs)
    do = torch.randn(o.shape, dtype=F64)
    o.backward(do)
    delta, dq, dk, dv = compressed_attention_backward_reference(q, kc, vc, o, lse, do, case.bs, **kwargs)
    torch.testing.assert_close(delta, (o * do).sum(-1).permute(0, 2, 1))
    for ours, auto in ((dq, q.grad), (dk, kc.grad), (dv, vc.grad)):
        assert ours.dtype == F64
        torch.testing.assert_close(ours, auto, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seq_len", [None, 9], ids=["m_eq_n", "m_lt_n"])
def test_compressed_gradcheck(seq_len):
    q = torch.randn(1, 6 if seq_len is None else 4, 2, 3, dtype=F64, requires_grad=True)
    n = q.shape[1] if seq_len is None else seq_len
    kc = torch.randn(1, -(-n // 2), 1, 3, dtype=F64, requires_grad=True)
    vc = torch.randn(1, kc.shape[1], 1, 2, dtype=F64, requires_grad=True)

    def fwd(q, kc, vc):
        o, lse = compressed_attention_reference(q, kc, vc, 2, 0.7, seq_len)
        return o, torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))

    assert torch.autograd.gradcheck(fwd, (q, kc, vc))

    def explicit(q, kc, vc):
        o, lse = compressed_attention_reference(q, kc, vc, 2, 0.7, seq_len)
        return compressed_attention_backward_reference(q, kc, vc, o.detach(), lse.detach(), torch.ones_like(o), 2,
                                                       0.7, seq_len)[1:]

    auto = torch.autograd.grad(fwd(q, kc, vc)[0].sum(), (q, kc, vc))
    for ours, want in zip(explicit(q, kc, vc), auto):
        torch.testing.assert_close(ours, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("lengths", PACKED_LENGTHS.values(), ids=list(PACKED_LENGTHS))
def test_compressed_packed_equals_separate_calls(lengths):
    bs, heads, groups = 4, 4, 2
    cu = cu_of(lengths)
    total = sum(lengths)
    q = torch.randn(1, total, heads, 5, dtype=F64, requires_grad=True)
    k, v = torch.randn(1, total, groups, 5, dtype=F64), torch.randn(1, total, groups, 3, dtype=F64)
    kc = mean_pooling_reference(k, bs, cu).requires_grad_()
    vc = mean_pooling_reference(v, bs, cu).requires_grad_()
    o, lse = compressed_attention_reference(q, kc, vc, bs, cu_seqlens=cu)
    assert o.shape == (1, total, heads, 3) and lse.shape == (1, heads, total)
    do = torch.randn(o.shape, dtype=F64)
    o.backward(do)
    delta, dq, dk, dv = compressed_attention_backward_reference(q, kc, vc, o, lse, do, bs, cu_seqlens=cu)
    first = 0
    for a, e in spans_of(lengths):
        c = -(-(e - a) // bs)
        qs = q[:, a:e].detach()
        kcs, vcs = kc[:, first:first + c].detach(), vc[:, first:first + c].detach()
        o_s, lse_s = compressed_attention_reference(qs, kcs, vcs, bs)
        assert torch.equal(o[:, a:e], o_s) and torch.equal(lse[:, :, a:e], lse_s)
        _, dq_s, dk_s, dv_s = compressed_attention_backward_reference(qs, kcs, vcs, o_s, lse_s, do[:, a:e], bs)
        assert torch.equal(dq[:, a:e], dq_s)
        assert torch.equal(dk[:, first:first + c], dk_s) and torch.equal(dv[:, first:first + c], dv_s)
        first += c
    for ours, auto in ((dq, q.grad), (dk, kc.grad), (dv, vc.grad)):
        torch.testing.assert_close(ours, auto, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
def test_low_precision_inputs_are_computed_in_f64(dtype):
    case = Case()
    q, kc, vc = case.inputs(dtype=dtype)
    o, lse = compressed_attention_reference(q, kc, vc, case.bs)
    o64, lse64 = compressed_attention_reference(q.double(), kc.double(), vc.double(), case.bs)
    assert o.dtype == F64 and torch.equal(o, o64) and torch.equal(lse, lse64)
    counts = torch.randint(0, 6, (case.batch, case.m_rows, case.groups))
    assert torch.equal(select_blocks_reference(q, kc, counts, case.bs),
                       select_blocks_reference(q.double(), kc.double(), counts, case.bs))
    x = torch.randn(2, 10, 2, 3).to(dtype)
    assert torch.equal(mean_pooling_reference(x, 4), mean_pooling_reference(x.double(), 4))


# ---------------------------------------------------------------------------------------------------------------
# Top-n selection.


def counts_tensor(case, high, seed=1):
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, high + 1, (case.batch, case.m_rows, case.groups), generator=gen)
    if counts.numel():
        counts.view(-1)[0] = 0                       # a row that selects nothing
        counts.view(-1)[-1] = high                   # one that may ask for more than it can see
    return counts


@pytest.mark.parametrize("counts", ["int3", "int16", "tensor"], ids=["int3", "int16_more_than_visible", "tensor"])
@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_select_blocks_matches_loops(case, counts):
    q, kc, _ = case.inputs(seed=5)
    block_counts = {"int3": 3, "int16": 16, "tensor": counts_tensor(case, 7)}[counts]
    width = block_counts if isinstance(block_counts, int) else int(block_counts.max()) if block_counts.numel() else 0
    idx = select_blocks_reference(q, kc, block_counts, case.bs, **call_kwargs(case))
    assert idx.dtype == torch.int32 and idx.shape == (case.batch, case.m_rows, case.groups, width)
    assert torch.equal(idx, loop_select(q, kc, block_counts, case.bs, case.used_scale, case.n, width))
    # never a block twice; the -1s trail; every id is selectable (c * BS <= pos)
    pos = torch.arange(case.m_rows) + case.n - case.m_rows
    for row, p in zip(idx.transpose(0, 1), pos.tolist()):
        for slots in row.reshape(-1, width).tolist():
            chosen = [c for c in slots if c >= 0]
            assert slots == chosen + [-1] * (width - len(chosen))
            assert len(set(chosen)) == len(chosen) and all(c * case.bs <= p for c in chosen)


def test_forced_blocks_and_slot_order_by_hand():
    # BS = 4, N = 20, one head. Row 13 (own block 3): forced 3, 2, 0, then block 1 (the only other one).
    # Make block 1 score high: it still comes after the forced ones.
    q = torch.ones(1, 20, 1, 2, dtype=F64)
    kc = torch.tensor([0.0, 5.0, 0.0, 0.0, 0.0], dtype=F64).view(1, 5, 1, 1).expand(1, 5, 1, 2).contiguous()
    idx = select_blocks_reference(q, kc, 5, 4)[0, :, 0].tolist()
    assert idx[0] == idx[2] == [0, -1, -1, -1, -1]             # no visible compressed block: block 0 alone
    assert idx[3] == [0, -1, -1, -1, -1]                       # sees block 0, which is forced anyway
    assert idx[4] == idx[7] == [1, 0, -1, -1, -1]              # own block 1, then its predecessor 0
    assert idx[8] == [2, 1, 0, -1, -1]
    assert idx[13] == [3, 2, 0, 1, -1]
    assert idx[19] == [4, 3, 0, 1, 2]                          # block 1 (score ~1) before block 2 (~0)
    assert select_blocks_reference(q, kc, 2, 4)[0, 19, 0].tolist() == [4, 3]
    assert select_blocks_reference(q, kc, 1, 4)[0, 19, 0].tolist() == [4]
    assert select_blocks_reference(q, kc, 0, 4).shape == (1, 20, 1, 0)


def test_equal_scores_go_to_the_lower_block():
    # identical compressed keys: every visible block has the same score
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 64, 4, 8, dtype=F64, generator=gen)
    kc = torch.randn(1, 1, 2, 8, dtype=F64, generator=gen).expand(1, 8, 2, 8).contiguous()
    idx = select_blocks_reference(q, kc, 5, 8)
    assert idx[0, 63, 0].tolist() == [7, 6, 0, 1, 2]
    assert idx[0, 40, 1].tolist() == [5, 4, 0, 1, 2]
    # two blocks with exactly equal, highest scores: the lower id first
    kc = torch.zeros(1, 8, 1, 8, dtype=F64)
    kc[0, 3] = kc[0, 5] = 1.0
    q = torch.ones(1, 64, 1, 8, dtype=F64)
    assert select_blocks_reference(q, kc, 5, 8)[0, 63, 0].tolist() == [7, 6, 0, 3, 5]


def test_prefix_of_a_larger_count():
    case = Case(m_rows=30, n=50, heads=8, groups=2)
    q, kc, _ = case.inputs(seed=9)
    wide = select_blocks_reference(q, kc, 9, case.bs, seq_len=case.n)
    for count in range(10):
        assert torch.equal(select_blocks_reference(q, kc, count, case.bs, seq_len=case.n), wide[..., :count])


def test_select_reuses_lse():
    case = Case(m_rows=20, n=44, heads=8, groups=2)
    q, kc, vc = case.inputs(seed=4)
    _, lse = compressed_attention_reference(q, kc, vc, case.bs, seq_len=case.n)
    counts = counts_tensor(case, 6)
    want = select_blocks_reference(q, kc, counts, case.bs, seq_len=case.n)
    assert torch.equal(select_blocks_reference(q, kc, counts, case.bs, lse=lse, seq_len=case.n), want)
    assert torch.equal(select_blocks_reference(q, kc, counts, case.bs, lse=lse.float(), seq_len=case.n), want)


@pytest.mark.parametrize("counts", ["int", "tensor"])
@pytest.mark.parametrize("lengths", PACKED_LENGTHS.values(), ids=list(PACKED_LENGTHS))
def test_select_packed_equals_separate_calls(lengths, counts):
    bs, heads, groups = 4, 4, 2
    cu = cu_of(lengths)
    total = sum(lengths)
    q, k = torch.randn(1, total, heads, 5, dtype=F64), torch.randn(1, total, groups, 5, dtype=F64)
    kc = mean_pooling_reference(k, bs, cu)
    block_counts = 4 if counts == "int" else torch.randint(0, 6, (1, total, groups))
    width = 4 if counts == "int" else (int(block_counts.max()) if total else 0)
    idx = select_blocks_reference(q, kc, block_counts, bs, cu_seqlens=cu)
    assert idx.shape == (1, total, groups, width)
    _, lse = compressed_attention_reference(q, kc, kc, bs, cu_seqlens=cu)
    assert torch.equal(select_blocks_reference(q, kc, block_counts, bs, lse=lse, cu_seqlens=cu), idx)
    first = 0
    for a, e in spans_of(lengths):
        c = -(-(e - a) // bs)
        sub_counts = block_counts if counts == "int" else block_counts[:, a:e]
        alone = select_blocks_reference(q[:, a:e], kc[:, first:first + c], sub_counts, bs, width=width)
        assert torch.equal(idx[:, a:e], alone)            # ids relative to the sequence
        first += c
    # it feeds the selection oracle as it is
    v = torch.randn(1, total, groups, 3, dtype=F64)
    o, _ = selection_attention_reference(q, k, v, idx if width else idx.new_full((1, total, groups, 1), -1), bs,
                                         cu_seqlens=cu)
    assert not torch.isnan(o).any()


# ---------------------------------------------------------------------------------------------------------------
# Input checks: each names the argument at fault.


def good(**over):
    """Valid inputs of every check, B = 2, M = N = 10, H = 4, G = 2, D = 8, Dv = 6, BS = 4 (C = 3)."""
    args = dict(q=torch.randn(2, 10, 4, 8), k_cmp=torch.randn(2, 3, 2, 8), v_cmp=torch.randn(2, 3, 2, 6),
                block_size=4, scale=None, seq_len=None, cu_seqlens=None)
    args.update(over)
    return args


def packed(**over):
    """B = 1, 10 tokens in sequences of 3, 0 and 7 tokens: C = 1 + 0 + 2 = 3 blocks for BS = 4."""
    args = dict(q=torch.randn(1, 10, 4, 8), k_cmp=torch.randn(1, 3, 2, 8), v_cmp=torch.randn(1, 3, 2, 6),
                cu_seqlens=torch.tensor([0, 3, 3, 10], dtype=torch.int32))
    args.update(over)
    return good(**args)


def attention(**args):
    check_compressed_attention(**args)


def select(block_counts=3, lse=None, **args):
    args.pop("v_cmp")
    check_select_blocks(block_counts=block_counts, lse=lse, **args)


def backward(o=None, lse=None, do=None, **args):
    m, h = args["q"].shape[1], args["q"].shape[2]
    o = torch.randn(args["q"].shape[0], m, h, 6) if o is None else o
    do = torch.randn_like(o) if do is None else do
    lse = torch.randn(args["q"].shape[0], h, m) if lse is None else lse
    check_compressed_attention_backward(o=o, lse=lse, do=do, **args)


BAD = {
    "q_not_a_tensor": (attention, good(q=[1.0]), TypeError, "q must be a torch.Tensor"),
    "q_rank": (attention, good(q=torch.randn(10, 4, 8)), ValueError, r"q must have shape \[B, M, H, D\]"),
    "q_f64": (attention, good(q=torch.randn(2, 10, 4, 8, dtype=F64)), TypeError, "q must be float32"),
    "k_cmp_rank": (attention, good(k_cmp=torch.randn(3, 2, 8)), ValueError, r"k_cmp must have shape \[B, C, G, D\]"),
    "k_cmp_dtype": (attention, good(k_cmp=torch.randn(2, 3, 2, 8).half()), TypeError, "k_cmp must have q's dtype"),
    "k_cmp_head_dim": (attention, good(k_cmp=torch.randn(2, 3, 2, 7)), ValueError, r"k_cmp must have shape"),
    "k_cmp_batch": (attention, good(k_cmp=torch.randn(1, 3, 2, 8)), ValueError, r"k_cmp must have shape"),
    "k_cmp_too_few_blocks": (attention, good(k_cmp=torch.randn(2, 2, 2, 8), v_cmp=torch.randn(2, 2, 2, 6)),
                             ValueError, r"k_cmp must have shape .* ceil\(10 / 4\) = 3"),
    "k_cmp_too_many_blocks": (attention, good(k_cmp=torch.randn(2, 4, 2, 8), v_cmp=torch.randn(2, 4, 2, 6)),
                              ValueError, "k_cmp must have shape"),
    "k_cmp_blocks_for_seq_len": (attention, good(seq_len=13), ValueError, r"ceil\(13 / 4\) = 4"),
    "heads_not_multiple": (attention, good(k_cmp=torch.randn(2, 3, 3, 8), v_cmp=torch.randn(2, 3, 3, 6)),
                           ValueError, "H=4 .* positive multiple of the number of kv heads G=3"),
    "v_cmp_rank": (attention, good(v_cmp=torch.randn(3, 2, 6)), ValueError, r"v_cmp must have shape \[B, C, G, Dv\]"),
    "v_cmp_blocks": (attention, good(v_cmp=torch.randn(2, 4, 2, 6)), ValueError, r"v_cmp must have shape"),
    "v_cmp_dtype": (attention, good(v_cmp=torch.randn(2, 3, 2, 6).bfloat16()), TypeError, "v_cmp must have q's"),
    "v_cmp_dv_zero": (attention, good(v_cmp=torch.randn(2, 3, 2, 0)), ValueError, "Dv=0"),
    "block_size_zero": (attention, good(block_size=0), ValueError, "block_size must be a positive int"),
    "block_size_float": (attention, good(block_size=4.0), ValueError, "block_size must be a positive int"),
    "block_size_bool": (attention, good(block_size=True), ValueError, "block_size must be a positive int"),
    "scale_nan": (attention, good(scale=float("nan")), ValueError, "scale must be a finite float"),
    "scale_tensor": (attention, good(scale=torch.tensor(0.5)), TypeError, "scale must be None or a float"),
    "seq_len_float": (attention, good(seq_len=10.0), TypeError, "seq_len must be None or an int"),
    "seq_len_negative": (attention, good(seq_len=-1), ValueError, "seq_len must be >= 0"),
    "cu_seqlens_int64": (attention, packed(cu_seqlens=torch.tensor([0, 10])), TypeError, "cu_seqlens must be int32"),
    "cu_seqlens_rank": (attention, packed(cu_seqlens=torch.zeros(1, 2, dtype=torch.int32)), ValueError,
                        r"cu_seqlens must have shape \[S \+ 1\]"),
    "cu_seqlens_list": (attention, packed(cu_seqlens=[0, 10]), TypeError, "cu_seqlens must be None or a"),
    "cu_seqlens_batch": (attention, good(cu_seqlens=torch.tensor([0, 10], dtype=torch.int32)), ValueError,
                         "q must have B = 1"),
    "cu_seqlens_seq_len": (attention, packed(seq_len=12), ValueError, "seq_len must be None or M"),
    "select_block_counts_negative": (select, good(block_counts=-1), ValueError, "block_counts must be >= 0"),
    "select_block_counts_float": (select, good(block_counts=2.0), TypeError, "block_counts must be an int or"),
    "select_block_counts_bool": (select, good(block_counts=True), TypeError, "block_counts must be an int or"),
    "select_block_counts_dtype": (select, good(block_counts=torch.ones(2, 10, 2)), TypeError,
                                  "block_counts must be int32 or int64"),
    "select_block_counts_shape": (select, good(block_counts=torch.ones(2, 10, 4, dtype=torch.int32)), ValueError,
                                  r"block_counts must have shape \[B, M, G\] = \[2, 10, 2\]"),
    "select_lse_shape": (select, good(lse=torch.randn(2, 10, 4)), ValueError, r"lse must have shape \[B, H, M\]"),
    "select_lse_dtype": (select, good(lse=torch.randn(2, 4, 10, dtype=F64)), TypeError, "lse must be float32"),
    "select_k_cmp_blocks": (select, good(k_cmp=torch.randn(2, 5, 2, 8)), ValueError, "k_cmp must have shape"),
    "select_q_rank": (select, good(q=torch.randn(2, 10, 32)), ValueError, "q must have shape"),
    "backward_o_shape": (backward, good(o=torch.randn(2, 10, 4, 5)), ValueError, r"o must have shape"),
    "backward_do_dtype": (backward, good(do=torch.randn(2, 10, 4, 6).half()), TypeError, "do must have q's dtype"),
    "backward_lse_dtype": (backward, good(lse=torch.randn(2, 4, 10).half()), TypeError, "lse must be float32"),
    "pool_x_rank": (lambda **a: check_mean_pooling(**a), dict(x=torch.randn(10, 2, 8), block_size=4), ValueError,
                    r"x must have shape \[B, N, G, D\]"),
    "pool_x_int": (lambda **a: check_mean_pooling(**a), dict(x=torch.ones(1, 10, 2, 8, dtype=torch.int32),
                                                             block_size=4), TypeError, "x must be float32"),
    "pool_block_size": (lambda **a: check_mean_pooling(**a), dict(x=torch.randn(1, 10, 2, 8), block_size=-2),
                        ValueError, "block_size must be a positive int"),
    "pool_cu_seqlens_batch": (lambda **a: check_mean_pooling(**a), dict(
        x=torch.randn(2, 10, 2, 8), block_size=4, cu_seqlens=torch.tensor([0, 10], dtype=torch.int32)), ValueError,
        "x must have B = 1"),
    "packed_blocks_count": (lambda **a: check_packed_blocks(**a), dict(
        cu_seqlens=torch.tensor([0, 3, 3, 10], dtype=torch.int32), total=10, block_size=4, num_blocks=4),
        ValueError, r"k_cmp must hold every sequence's .* 3 in all for block_size 4, got k_cmp.shape\[1\] = 4"),
    "packed_blocks_values": (lambda **a: check_packed_blocks(**a), dict(
        cu_seqlens=torch.tensor([0, 5, 3, 10], dtype=torch.int32), total=10, block_size=4, num_blocks=3),
        ValueError, "cu_seqlens must be non-decreasing"),
}


@pytest.mark.parametrize("check, args, error, match", BAD.values(), ids=list(BAD))
def test_bad_inputs_name_the_argument(check, args, error, match):
    with pytest.raises(error, match=match):
        check(**args)


@pytest.mark.parametrize("check, args", [
    (attention, good()), (attention, good(seq_len=12)), (attention, packed()), (attention, packed(seq_len=10)),
    (select, good()), (select, good(block_counts=torch.zeros(2, 10, 2, dtype=torch.int64), lse=torch.randn(2, 4, 10))),
    (select, packed(block_counts=0)), (backward, good()), (attention, good(q=torch.randn(2, 0, 4, 8), seq_len=0,
                                                                          k_cmp=torch.randn(2, 0, 2, 8),
                                                                          v_cmp=torch.randn(2, 0, 2, 6))),
    (lambda **a: check_packed_blocks(**a), dict(cu_seqlens=torch.tensor([0, 3, 3, 10], dtype=torch.int32), total=10,
                                                block_size=4, num_blocks=3)),
], ids=["attention", "attention_m_lt_n", "attention_packed", "attention_packed_seq_len_m", "select",
        "select_tensor_counts_lse", "select_packed", "backward", "no_rows", "packed_blocks"])
def test_good_inputs_pass(check, args):
    check(**args)
