"""The forward and the two-pass backward in slices of query rows (forward_into's and backward_into's rows_per_slice;
by default where the kernels make partials per (row, slot), kernels.SMALL, as many rows as api.PARTIALS_BYTES of
partials hold): each slice against the keys its rows may see; o, lse and dq per slice exactly as unsliced, dk and dv
summed over the slices in f32 and rounded once: close to the f64 reference, reproducible bit for bit, every output
written."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nsa_iree import api
from nsa_iree.api import backward_into, effective_block_indices, forward_into
from nsa_iree.reference import selection_attention_reference
from nsa_iree.spec import KernelSpec

from nsa_iree.testing import TOLERANCE, relative_rms_error

from conftest import (DTYPES, RMS_FLOOR, Problem, assert_bitwise_equal, make_inputs, poisoned, realistic_indices,
                      reference_outputs)

# (problem, rows per slice)
CASES = {
    "three_slices_m_eq_n": (Problem(batch=1, m_rows=96, n=96), 40),
    "b2_m_lt_n_partial_block": (Problem(batch=2, m_rows=70, n=101, select=realistic_indices), 32),
    "last_slice_one_row": (Problem(batch=1, m_rows=65, n=80, heads=2, kv_heads=2), 64),
    "slice_of_one_row": (Problem(batch=1, m_rows=5, n=40, heads=4, kv_heads=1), 1),
    # more rows than keys: the first slices' rows come before the first key (no keys, zero gradients)
    "m_gt_n": (Problem(batch=2, m_rows=96, n=40), 16),
}


def _backward(p: Problem, dtype, rows_per_slice, wanted=("dq", "dk", "dv")):
    q, k, v, do, block_indices, block_counts = make_inputs(p, dtype)
    scale = p.head_dim ** -0.5
    idx = effective_block_indices(block_indices, block_counts)
    o, lse = poisoned((p.batch, p.m_rows, p.heads, p.value_dim), dtype), poisoned((p.batch, p.heads, p.m_rows),
                                                                                  torch.float32)
    forward_into(o, lse, q, k, v, idx, p.block_size, scale)
    grads = {name: poisoned(x.shape, dtype) if name in wanted else None for name, x in zip(("dq", "dk", "dv"),
                                                                                           (q, k, v))}
    backward_into(grads["dq"], grads["dk"], grads["dv"], q, k, v, o, lse, do, idx, p.block_size, scale, "two-pass",
                  rows_per_slice=rows_per_slice)
    return (q, k, v, do, block_indices, block_counts, o, lse), grads


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_sliced_backward_matches_the_reference(case, dtype):
    p, rows = CASES[case]
    (q, k, v, do, block_indices, block_counts, o, lse), grads = _backward(p, DTYPES[dtype], rows)
    refs = reference_outputs(p, q, k, v, do, block_indices, block_counts, o, lse)[2:]
    for (name, x), ref in zip(grads.items(), refs):
        assert not torch.isnan(x).any(), f"{name}: an element was never written"
        assert relative_rms_error(x, ref, rms_floor=RMS_FLOOR) < TOLERANCE[DTYPES[dtype]], name


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_sliced_dq_is_the_unsliced_dq_and_dk_dv_are_reproducible(case):
    p, rows = CASES[case]
    _, sliced = _backward(p, torch.bfloat16, rows)
    _, again = _backward(p, torch.bfloat16, rows)
    _, whole = _backward(p, torch.bfloat16, None)
    assert_bitwise_equal(list(sliced.values()), list(again.values()), ("dq", "dk", "dv"))
    assert_bitwise_equal([sliced["dq"]], [whole["dq"]], ("dq",))


@pytest.mark.parametrize("wanted", [("dq",), ("dk", "dv")], ids=["dq_only", "dk_dv_only"])
def test_sliced_backward_writes_only_what_is_asked(wanted):
    p, rows = CASES["three_slices_m_eq_n"]
    _, grads = _backward(p, torch.float32, rows, wanted)
    _, whole = _backward(p, torch.float32, None)
    for name, x in grads.items():
        assert (x is None) == (name not in wanted)
        if x is not None:
            torch.testing.assert_close(x, whole[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows", [0, -3, 2.5, True])
def test_a_bad_rows_per_slice_is_named(rows):
    p, _ = CASES["three_slices_m_eq_n"]
    with pytest.raises(ValueError, match="backward_into: rows_per_slice"):
        _backward(p, torch.float32, rows)
    q, k, v, _, block_indices, block_counts = make_inputs(p, torch.float32)
    o, lse = poisoned((p.batch, p.m_rows, p.heads, p.value_dim), torch.float32), poisoned(
        (p.batch, p.heads, p.m_rows), torch.float32)
    with pytest.raises(ValueError, match="forward_into: rows_per_slice"):
        forward_into(o, lse, q, k, v, effective_block_indices(block_indices, block_counts), p.block_size, 1.0,
                     rows_per_slice=rows)


def _forward(p: Problem, rows_per_slice, dtype=torch.bfloat16):
    q, k, v, _, block_indices, block_counts = make_inputs(p, dtype)
    idx = effective_block_indices(block_indices, block_counts)
    o, lse = poisoned((p.batch, p.m_rows, p.heads, p.value_dim), dtype), poisoned((p.batch, p.heads, p.m_rows),
                                                                                torch.float32)
    forward_into(o, lse, q, k, v, idx, p.block_size, p.head_dim ** -0.5, rows_per_slice=rows_per_slice)
    return (q, k, v, block_indices, block_counts), (o, lse)


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_sliced_forward_is_the_unsliced_forward(case):
    p, rows = CASES[case]
    (q, k, v, block_indices, block_counts), sliced = _forward(p, rows)
    _, whole = _forward(p, None)
    assert not sliced[0].isnan().any() and not sliced[1].isnan().any(), "an element was never written"
    assert_bitwise_equal(list(sliced), list(whole), ("o", "lse"))
    o_ref, lse_ref = selection_attention_reference(q, k, v, block_indices, p.block_size, block_counts,
                                                   p.head_dim ** -0.5)
    assert relative_rms_error(sliced[0], o_ref, rms_floor=RMS_FLOOR) < TOLERANCE[torch.bfloat16]
    seen = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(sliced[1]), seen)
    torch.testing.assert_close(sliced[1][seen], lse_ref[seen].float(), rtol=1e-4, atol=1e-4)


def test_the_forward_slices_by_the_budget_where_its_kernels_make_partials(monkeypatch):
    """Where the forward makes partials per (row, slot) (the hopper target's pieces; here the CPU's forward standing
    in: the budget is counted as theirs, the slices run the CPU's kernels) a call beyond PARTIALS_BYTES runs in slices
    of the rows the budget holds, at least 64: the same o and lse."""
    p = Problem(batch=1, m_rows=200, n=200)
    _, whole = _forward(p, None, torch.float32)
    calls, pieces = [], [True]

    def slices(rows, *args):
        calls.append(rows)
        pieces[0] = False           # (the slices run the CPU's forward module, which writes no block lists)
        return _slices(rows, *args)

    monkeypatch.setattr(api, "forward_over_pieces", lambda spec: pieces[0])
    monkeypatch.setattr(api, "PARTIALS_BYTES", 1)
    monkeypatch.setattr(api, "_forward_in_row_slices", slices)
    _, sliced = _forward(p, None, torch.float32)
    assert calls == [64]
    assert_bitwise_equal(list(sliced), list(whole), ("o", "lse"))


_slices = api._forward_in_row_slices


def test_the_default_slice_holds_the_partials_budget(monkeypatch):
    """Where dk/dv makes dq's partials (T x H x D x 4 bytes a row and batch) or the forward its own (T x H x (Dv + 2)
    x 4) a call takes as many rows as PARTIALS_BYTES hold, at least 64; elsewhere no slicing."""
    spec = KernelSpec(target="hopper", heads=16, kv_heads=4, head_dim=128, value_dim=128, block_size=64,
                      num_blocks=16, dtype="bf16")
    monkeypatch.setattr(api, "PARTIALS_BYTES", 1 << 30)
    per_row = 16 * 16 * 128 * 4
    assert api._rows_per_slice(spec, 1) == (1 << 30) // per_row
    assert api._rows_per_slice(spec, 2) == (1 << 30) // (2 * per_row)
    assert api._rows_per_slice(spec, 1, "forward") == (1 << 30) // (16 * 16 * 130 * 4)
    assert api._rows_per_slice(dataclasses.replace(spec, heads=32), 1, "forward") is None  # 8 per group: no pieces
    monkeypatch.setattr(api, "PARTIALS_BYTES", 1)
    assert api._rows_per_slice(spec, 1) == 64
    assert api._rows_per_slice(dataclasses.replace(spec, heads=64), 1) is None      # 16 heads per group: no partials
    assert api._rows_per_slice(dataclasses.replace(spec, target="cpu"), 1) is None


def test_the_old_name_of_the_budget_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("NSA_IREE_DQ_PARTIALS_BYTES", "1048576")
    with pytest.raises(ValueError, match="NSA_IREE_DQ_PARTIALS_BYTES is now NSA_IREE_PARTIALS_BYTES"):
        api._partials_bytes_from_environment()


@pytest.mark.parametrize("value", ["", "-1", "0", "2GiB"])
def test_a_bad_partials_budget_in_the_environment_is_named(monkeypatch, value):
    monkeypatch.setenv("NSA_IREE_PARTIALS_BYTES", value)
    with pytest.raises(ValueError, match="NSA_IREE_PARTIALS_BYTES"):
        api._partials_bytes_from_environment()


def test_the_partials_budget_is_read_from_the_environment_where_it_is_used(monkeypatch):
    spec = KernelSpec(target="hopper", heads=16, kv_heads=4, head_dim=128, value_dim=128, block_size=64,
                      num_blocks=16, dtype="bf16")
    monkeypatch.setattr(api, "PARTIALS_BYTES", None)
    monkeypatch.setenv("NSA_IREE_PARTIALS_BYTES", "1048576")
    assert api._rows_per_slice(spec, 1) == max(64, (1 << 20) // (16 * 16 * 128 * 4))
    monkeypatch.delenv("NSA_IREE_PARTIALS_BYTES")
    assert api._rows_per_slice(spec, 1) == (16 << 30) // (16 * 16 * 128 * 4)
    monkeypatch.setenv("NSA_IREE_PARTIALS_BYTES", "8G")
    with pytest.raises(ValueError, match="NSA_IREE_PARTIALS_BYTES"):
        api._rows_per_slice(spec, 1)
