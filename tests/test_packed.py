"""Packed variable-length sequences (cu_seqlens): every output equals the f64 reference run on each sequence
alone, for every dtype and both backward variants, outputs poisoned (NaN-filled) before each run; a sequence
never sees another; one sequence is the unpacked call; bad cu_seqlens are refused before any work.

The head layout is test_numerics' BASE (H 4, G 2, D 32, Dv 16, BS 16, T 4): its artifacts are compiled once
for the whole suite, and packed calls reuse them (cu_seqlens is runtime data).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

import pytest
import torch

import nsa_iree
from nsa_iree import api
from nsa_iree.packing import packed_layout
from nsa_iree.reference import selection_attention_backward_reference, selection_attention_reference
from nsa_iree.selection import realistic_block_indices

from conftest import CPU_TARGETS, DTYPES, RMS_FLOOR, TOLERANCE, assert_bitwise_equal, cpu_target, poisoned, \
    relative_rms_error

H, G, D, DV, BS, T = 4, 2, 32, 16, 16, 4


def cu_seqlens_of(lengths, dtype=torch.int32):
    return torch.tensor([0] + [sum(lengths[:s + 1]) for s in range(len(lengths))], dtype=dtype)


# --- selections, drawn per sequence with block ids relative to the sequence's first token ----------------

def per_sequence(draw):
    def select(gen, lengths):
        parts = [draw(gen, n) for n in lengths if n]
        idx = torch.cat(parts, dim=1) if parts else torch.zeros(1, 0, G, T, dtype=torch.int32)
        return idx, None
    return select


@per_sequence
def realistic(gen, n):
    """NSA-like: block 0, the row's own block and the one before, random earlier ones; -1 padding."""
    return realistic_block_indices(1, n, n, G, T, BS, generator=gen)


@per_sequence
def hostile(gen, n):
    """Random ids of the sequence's blocks and past its end (future for every row), -1 and other negatives,
    INT32_MIN, duplicates (slot 1 repeats slot 0), and ids that would be valid blocks of the next sequence."""
    blocks = -(-n // BS)
    idx = torch.randint(-1, blocks + 2, (1, n, G, T), generator=gen, dtype=torch.int32)
    idx[..., 1] = idx[..., 0]
    idx[:, ::3, :, 2] = -(2**31)
    idx[:, 1::3, :, 2] = -5
    idx[:, ::2, :, 3] = blocks + 1
    return idx


def hostile_int64_with_counts(gen, lengths):
    """hostile, as int64 with ids beyond the int32 range, and a block_counts tensor in 0 .. T."""
    idx, _ = hostile(gen, lengths)
    idx = idx.to(torch.int64)
    idx[:, ::4, :, 3] = 2**40
    counts = torch.randint(0, T + 1, idx.shape[:3], generator=gen)
    return idx, counts


def counts_int(gen, lengths):
    return realistic(gen, lengths)[0], 2


SELECTIONS = {"realistic": realistic, "hostile": hostile, "hostile_int64_counts": hostile_int64_with_counts}

LENGTHS = {
    "around_block_size": (0, 1, BS - 1, BS, BS + 1, 0),        # empty, 1-token and BS +- 1 sequences
    "many_short": (3, 1, 7, 2, 9, 1, 1, 4, 8, 5, 2, 6, 3, 1, 9, 2, 7, 1, 5, 3),
    "one_long": (150,),
    "mixed": (40, 0, 33, 64, 5, 16, 31, 1),
    "whole_blocks_then_partial": (16, 48, 32, 7),              # the packed layout is block-aligned already
}


@dataclasses.dataclass(frozen=True)
class Packed:
    lengths: tuple
    select: Callable
    scale: float | None = None

    @property
    def total(self):
        return sum(self.lengths)


def make_inputs(p: Packed, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, p.total, H, D, generator=gen).to(dtype)
    k = torch.randn(1, p.total, G, D, generator=gen).to(dtype)
    v = torch.randn(1, p.total, G, DV, generator=gen).to(dtype)
    do = torch.randn(1, p.total, H, DV, generator=gen).to(dtype)
    idx, counts = p.select(gen, p.lengths)
    return q, k, v, do, idx, counts


def run_poisoned(p: Packed, q, k, v, do, idx, counts, variant):
    """Forward and backward through the kernels with cu_seqlens, every output NaN-filled beforehand."""
    cu = cu_seqlens_of(p.lengths)
    scale = float(D ** -0.5 if p.scale is None else p.scale)
    folded = api.effective_block_indices(idx, counts)
    o, lse = poisoned((1, p.total, H, DV), q.dtype), poisoned((1, H, p.total), torch.float32)
    api.forward_into(o, lse, q, k, v, folded, BS, scale, cu)
    dq, dk, dv = poisoned(q.shape, q.dtype), poisoned(k.shape, q.dtype), poisoned(v.shape, q.dtype)
    api.backward_into(dq, dk, dv, q, k, v, o, lse, do, folded, BS, scale, variant, cu)
    return o, lse, dq, dk, dv


def assert_packed_matches_reference(p: Packed, dtype, variant, seed=0):
    q, k, v, do, idx, counts = make_inputs(p, dtype, seed)
    outs = run_poisoned(p, q, k, v, do, idx, counts, variant)
    cu = cu_seqlens_of(p.lengths)
    o_ref, lse_ref = selection_attention_reference(q, k, v, idx, BS, counts, p.scale, cu_seqlens=cu)
    _, dq_ref, dk_ref, dv_ref = selection_attention_backward_reference(q, k, v, outs[0], outs[1], do, idx, BS,
                                                                       counts, p.scale, cu_seqlens=cu)
    errors = {}
    for name, x, ref in zip(("o", "lse", "dq", "dk", "dv"), outs, (o_ref, lse_ref, dq_ref, dk_ref, dv_ref)):
        assert not torch.isnan(x).any(), f"{name}: NaN in the output (an element was never written?)"
        errors[name] = relative_rms_error(x, ref, rms_floor=RMS_FLOOR)
    bad = {name: e for name, e in errors.items() if not e < TOLERANCE[dtype]}
    assert not bad, f"relative RMS error above {TOLERANCE[dtype]:g}: {bad} (all: {errors})"
    return outs


VARIANTS = ["two-pass", "one-pass"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("selection", SELECTIONS, ids=list(SELECTIONS))
@pytest.mark.parametrize("lengths", LENGTHS, ids=list(LENGTHS))
def test_packed_f32_equals_reference_on_each_sequence_alone(lengths, selection, variant):
    assert_packed_matches_reference(Packed(LENGTHS[lengths], SELECTIONS[selection]), torch.float32, variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("selection", ["realistic", "hostile"])
@pytest.mark.parametrize("lengths", ["around_block_size", "mixed"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_packed_low_precision_equals_reference(dtype, lengths, selection, variant):
    assert_packed_matches_reference(Packed(LENGTHS[lengths], SELECTIONS[selection]), DTYPES[dtype], variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_packed_block_counts_int_and_custom_scale(variant):
    assert_packed_matches_reference(Packed(LENGTHS["mixed"], counts_int, scale=0.3), torch.float32, variant)


# --- isolation and the unpacked call --------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_a_sequence_never_sees_another(variant):
    """Changing every other sequence's q, k, v and do leaves a sequence's o, lse, dq, dk and dv unchanged,
    bit for bit (hostile selections list ids that would be valid blocks of the neighbours)."""
    p = Packed(LENGTHS["mixed"], hostile)
    q, k, v, do, idx, counts = make_inputs(p, torch.float32)
    first = run_poisoned(p, q, k, v, do, idx, counts, variant)
    cu = cu_seqlens_of(p.lengths).tolist()
    a, b = cu[2], cu[4]                                              # sequences 2 and 3 (33 and 64 tokens)
    others = torch.ones(p.total, dtype=torch.bool)
    others[a:b] = False
    changed = [t.clone() for t in (q, k, v, do)]
    gen = torch.Generator().manual_seed(11)
    for t in changed:
        t[:, others] = torch.randn(t[:, others].shape, generator=gen) * 3
    second = run_poisoned(p, *changed, idx, counts, variant)
    if variant == "two-pass":
        assert_bitwise_equal([t[:, a:b] if t.dim() == 4 else t[:, :, a:b] for t in first],
                             [t[:, a:b] if t.dim() == 4 else t[:, :, a:b] for t in second])
    else:                                                            # dk/dv sums in a varying order
        for x, y in zip(first, second):
            x, y = (x[:, a:b], y[:, a:b]) if x.dim() == 4 else (x[:, :, a:b], y[:, :, a:b])
            assert relative_rms_error(y, x) < 1e-6


def _unpacked_poisoned(q, k, v, do, idx, variant):
    scale = float(D ** -0.5)
    folded = api.effective_block_indices(idx, None)
    o, lse = poisoned((1, q.shape[1], H, DV), q.dtype), poisoned((1, H, q.shape[1]), torch.float32)
    api.forward_into(o, lse, q, k, v, folded, BS, scale)
    dq, dk, dv = poisoned(q.shape, q.dtype), poisoned(k.shape, q.dtype), poisoned(v.shape, q.dtype)
    api.backward_into(dq, dk, dv, q, k, v, o, lse, do, folded, BS, scale, variant)
    return o, lse, dq, dk, dv


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_one_sequence_is_the_unpacked_call(dtype):
    """cu_seqlens = [0, M] gives the unpacked call's results bit for bit (two-pass)."""
    p = Packed(LENGTHS["one_long"], hostile)
    q, k, v, do, idx, _ = make_inputs(p, DTYPES[dtype])
    assert_bitwise_equal(run_poisoned(p, q, k, v, do, idx, None, "two-pass"),
                         _unpacked_poisoned(q, k, v, do, idx, "two-pass"))


@pytest.mark.parametrize("target_cpu", CPU_TARGETS)
def test_packed_sequences_equal_separate_unpacked_calls(target_cpu):
    """Every sequence of a packed call equals the unpacked call on that sequence alone, bit for bit
    (two-pass): the padded layout changes where rows and keys sit, not what is summed nor in which order.
    On the host's vectors and on AVX2 code alike (x86-64-v3)."""
    p = Packed(LENGTHS["mixed"], realistic)
    q, k, v, do, idx, _ = make_inputs(p, torch.float32, seed=4)
    with cpu_target(target_cpu):
        packed = run_poisoned(p, q, k, v, do, idx, None, "two-pass")
        cu = cu_seqlens_of(p.lengths).tolist()
        for a, b in zip(cu, cu[1:]):
            if a == b:
                continue
            alone = _unpacked_poisoned(*(t[:, a:b] for t in (q, k, v, do, idx)), "two-pass")
            assert_bitwise_equal([t[:, a:b] if t.dim() == 4 else t[:, :, a:b] for t in packed], alone)


def test_two_pass_packed_is_bitwise_reproducible():
    p = Packed(LENGTHS["around_block_size"] + LENGTHS["mixed"], hostile_int64_with_counts)
    inputs = make_inputs(p, torch.bfloat16, seed=2)
    first = run_poisoned(p, *inputs, "two-pass")
    for _ in range(4):
        assert_bitwise_equal(first, run_poisoned(p, *inputs, "two-pass"))


# --- the layout -----------------------------------------------------------------------------------------

def test_layout_puts_every_sequence_on_a_block_boundary():
    lengths = (0, 1, BS - 1, BS, BS + 1, 0, 3)
    layout = packed_layout(cu_seqlens_of(lengths), sum(lengths), BS)
    # Padded starts 0, 0, 16, 32, 48, 80, 80 (the last sequence is not padded): P = 83.
    assert layout.padded == 83
    assert layout.rows.tolist() == [0] + list(range(16, 31)) + list(range(32, 48)) + list(range(48, 65)) + [80, 81, 82]
    assert sorted(layout.rows.tolist() + layout.pad_rows.tolist()) == list(range(83))
    assert layout.first_block.tolist() == [0] + [1] * 15 + [2] * 16 + [3] * 17 + [5] * 3
    assert layout.position.tolist() == [0] + list(range(15)) + list(range(16)) + list(range(17)) + [0, 1, 2]


def test_layout_maps_block_ids_to_global_ones_and_skipped_slots_to_minus_one():
    lengths = (20, 40)                                   # second sequence: padded rows 32 .. 71, blocks 2, 3, 4
    idx = torch.full((1, 60, 1, 4), -1, dtype=torch.int32)
    idx[0, 20 + 35, 0] = torch.tensor([0, 2, 2, 3])      # position 35: blocks 0 and 2 (twice); 3 is past the end
    idx[0, 20 + 5, 0] = torch.tensor([0, 1, -4, 2**31 - 1])  # position 5: block 1 is in its future
    layout = packed_layout(cu_seqlens_of(lengths), 60, BS)
    mapped = layout.block_indices(idx, BS)
    assert mapped.shape == (1, 72, 1, 4) and mapped.dtype == torch.int32
    assert mapped[0, 32 + 35, 0].tolist() == [2, 4, 4, -1]
    assert mapped[0, 32 + 5, 0].tolist() == [2, -1, -1, -1]
    assert torch.all(mapped[0, 20:32] == -1)             # padding rows select nothing


def test_layout_of_whole_blocks_copies_nothing():
    layout = packed_layout(cu_seqlens_of((16, 48, 7)), 71, BS)
    assert layout.identity and layout.padded == 71
    q = torch.randn(1, 71, H, D)
    assert layout.to_padded(q) is q


# --- through the public functions: autograd, zero sizes, the torch operators --------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_autograd_with_cu_seqlens_matches_reference(variant):
    p = Packed(LENGTHS["mixed"], realistic)
    q, k, v, do, idx, _ = make_inputs(p, torch.float32, seed=7)
    cu = cu_seqlens_of(p.lengths)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = nsa_iree.selection_attention(*leaves, idx, BS, variant=variant, cu_seqlens=cu)
    o.backward(do)
    ref = [t.double().requires_grad_(True) for t in (q, k, v)]
    o_ref, _ = selection_attention_reference(*ref, idx, BS, cu_seqlens=cu)
    o_ref.backward(do.double())
    assert relative_rms_error(o.detach(), o_ref.detach()) < 1e-5
    for name, ours, theirs in zip(("dq", "dk", "dv"), leaves, ref):
        assert relative_rms_error(ours.grad, theirs.grad, rms_floor=RMS_FLOOR) < 1e-5, name
    o2, lse2 = nsa_iree.selection_attention_fwd(q, k, v, idx, BS, cu_seqlens=cu)
    assert torch.equal(o2, o.detach())
    if variant == "two-pass":
        grads = nsa_iree.selection_attention_bwd(q, k, v, o2, lse2, do, idx, BS, cu_seqlens=cu)
        for ours, leaf in zip(grads, leaves):
            assert torch.equal(ours, leaf.grad)


@pytest.mark.parametrize("lengths", [(), (0,), (0, 0, 0)], ids=["no_sequence", "one_empty", "three_empty"])
def test_no_packed_token(lengths):
    q, k, v = torch.randn(1, 0, H, D), torch.randn(1, 0, G, D), torch.randn(1, 0, G, DV)
    idx = torch.zeros(1, 0, G, T, dtype=torch.int32)
    cu = cu_seqlens_of(lengths)
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, BS, cu_seqlens=cu)
    assert o.shape == (1, 0, H, DV) and lse.shape == (1, H, 0)
    grads = nsa_iree.selection_attention_bwd(q, k, v, o, lse, torch.randn_like(o), idx, BS, cu_seqlens=cu)
    assert [t.shape for t in grads] == [q.shape, k.shape, v.shape]


def _attend_packed(q, k, v, idx, cu):
    return nsa_iree.selection_attention(q, k, v, idx, BS, block_counts=3, cu_seqlens=cu)


def test_torch_compile_fullgraph_with_cu_seqlens_no_graph_break():
    p = Packed(LENGTHS["mixed"], hostile)
    q, k, v, do, idx, _ = make_inputs(p, torch.float32, seed=1)
    cu = cu_seqlens_of(p.lengths)
    explanation = torch._dynamo.explain(_attend_packed)(q.requires_grad_(), k, v, idx, cu)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons

    def run(fn):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        o = fn(*leaves, idx, cu)
        o.backward(do)
        return [o.detach()] + [t.grad for t in leaves]

    compiled = torch.compile(_attend_packed, fullgraph=True, dynamic=True, backend="aot_eager")
    for name, a, b in zip(("o", "dq", "dk", "dv"), run(_attend_packed), run(compiled)):
        assert torch.equal(a, b), name


def test_operators_with_cu_seqlens_pass_opcheck():
    p = Packed(LENGTHS["around_block_size"], realistic)
    q, k, v, do, idx, _ = make_inputs(p, torch.float32, seed=3)
    idx = api.effective_block_indices(idx, None)
    cu = cu_seqlens_of(p.lengths)
    scale = D ** -0.5
    fwd, bwd = torch.ops.nsa_iree.selection_attention_fwd, torch.ops.nsa_iree.selection_attention_bwd
    torch.library.opcheck(fwd, (q.requires_grad_(), k.requires_grad_(), v, idx, BS, scale, "one-pass", cu))
    o, lse = fwd(q.detach(), k.detach(), v, idx, BS, scale, "two-pass", cu)
    torch.library.opcheck(bwd, (do, q.detach(), k.detach(), v, o, lse, idx, BS, scale, "two-pass", True, True, cu))


# --- bad cu_seqlens --------------------------------------------------------------------------------------

def _small():
    p = Packed((5, 9), realistic)
    q, k, v, do, idx, _ = make_inputs(p, torch.float32)
    return q, k, v, idx


BAD_CU_SEQLENS = {
    "not_starting_at_0": (lambda q, k, v, i: (q, k, v, i, torch.tensor([1, 5, 14], dtype=torch.int32)),
                          ValueError, "cu_seqlens must start at 0, got cu_seqlens[0] = 1"),
    "decreasing": (lambda q, k, v, i: (q, k, v, i, torch.tensor([0, 9, 5, 14], dtype=torch.int32)),
                   ValueError, "cu_seqlens must be non-decreasing, got cu_seqlens[2] = 5 < cu_seqlens[1] = 9"),
    "last_not_total": (lambda q, k, v, i: (q, k, v, i, torch.tensor([0, 5, 13], dtype=torch.int32)),
                       ValueError, "cu_seqlens must end at the number of packed tokens M = q.shape[1] = 14"),
    "float_dtype": (lambda q, k, v, i: (q, k, v, i, torch.tensor([0.0, 5.0, 14.0])),
                    TypeError, "cu_seqlens must be int32, got torch.float32"),
    "int64_dtype": (lambda q, k, v, i: (q, k, v, i, torch.tensor([0, 5, 14], dtype=torch.int64)),
                    TypeError, "cu_seqlens must be int32, got torch.int64"),
    "other_device": (lambda q, k, v, i: (q, k, v, i, torch.tensor([0, 5, 14], dtype=torch.int32, device="meta")),
                     ValueError, "cu_seqlens is on meta but q is on cpu"),
    "rank_2": (lambda q, k, v, i: (q, k, v, i, torch.tensor([[0, 5, 14]], dtype=torch.int32)),
               ValueError, "cu_seqlens must have shape [S + 1]"),
    "no_entry": (lambda q, k, v, i: (q, k, v, i, torch.zeros(0, dtype=torch.int32)),
                 ValueError, "cu_seqlens must have shape [S + 1]"),
    "a_list": (lambda q, k, v, i: (q, k, v, i, [0, 5, 14]), TypeError, "cu_seqlens must be None or a [S + 1]"),
    "batch_2": (lambda q, k, v, i: (q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1),
                                    i.expand(2, -1, -1, -1), torch.tensor([0, 5, 14], dtype=torch.int32)),
                ValueError, "with cu_seqlens the sequences are packed along M: q must have B = 1"),
    "keys_not_queries": (lambda q, k, v, i: (q[:, :9], k, v, i[:, :9], torch.tensor([0, 5, 9], dtype=torch.int32)),
                         ValueError, "N = k.shape[1] = 14 must equal M = q.shape[1] = 9"),
}


@pytest.mark.parametrize("function", ["selection_attention", "selection_attention_fwd", "selection_attention_bwd"])
@pytest.mark.parametrize("case", BAD_CU_SEQLENS, ids=list(BAD_CU_SEQLENS))
def test_bad_cu_seqlens_raise_before_any_compile(case, function, monkeypatch):
    monkeypatch.setattr(api, "compile_artifact", lambda *a, **k: pytest.fail("compiled on bad input"))
    monkeypatch.setattr(api, "_artifact_path", lambda *a, **k: pytest.fail("looked up a kernel on bad input"))
    make, error, message = BAD_CU_SEQLENS[case]
    q, k, v, idx, cu = make(*_small())
    with pytest.raises(error, match=re.escape(message)):
        if function == "selection_attention":
            nsa_iree.selection_attention(q, k, v, idx, BS, cu_seqlens=cu)
        elif function == "selection_attention_fwd":
            nsa_iree.selection_attention_fwd(q, k, v, idx, BS, cu_seqlens=cu)
        else:
            o = torch.zeros(q.shape[0], q.shape[1], H, DV)
            lse = torch.zeros(q.shape[0], H, q.shape[1])
            nsa_iree.selection_attention_bwd(q, k, v, o, lse, o, idx, BS, cu_seqlens=cu)
