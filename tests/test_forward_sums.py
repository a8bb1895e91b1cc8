"""The combine of a forward over the block lists' pieces (common/forward_sums.mlir) on its own, on the CPU: a row's o
and lse from its per-slot partials (the block's max m_t, sum l_t and unnormalised o_t), over the slots naming a
block it reads (each block once), in slot order in f32: m = max m_t, l = sum exp(m_t - m) l_t, o = sum
(exp(m_t - m) / l) o_t rounded once, lse = m + log l; o = 0 and lse = -inf for a row with no such slot; the other
slots' values, NaN here, never added."""

from __future__ import annotations

import pytest
import torch

from nsa_iree.spec import KernelSpec

from conftest import helper_module
from test_dq_sums import CASES, DTYPES, case_slots, counted_slots


def expected(o_slots, stats_slots, counted, dtype):
    """The contract restated in torch, slot by slot in f32."""
    batch, m_rows, groups, slots, hpg, dv = o_slots.shape
    row_max = torch.full((batch, m_rows, groups, hpg), float("-inf"))
    for t in range(slots):
        row_max = torch.where(counted[:, :, :, t, None], torch.maximum(row_max, stats_slots[:, :, :, t, :, 0]),
                              row_max)
    row_sum = torch.zeros(batch, m_rows, groups, hpg)
    for t in range(slots):
        rescale = torch.exp(stats_slots[:, :, :, t, :, 0] - row_max)
        row_sum = torch.where(counted[:, :, :, t, None], row_sum + rescale * stats_slots[:, :, :, t, :, 1], row_sum)
    seen = row_sum > 0
    o = torch.zeros(batch, m_rows, groups, hpg, dv)
    for t in range(slots):
        share = torch.exp(stats_slots[:, :, :, t, :, 0] - row_max) / torch.where(seen, row_sum, 1.0)
        o = torch.where(counted[:, :, :, t, None, None], o + share[..., None] * o_slots[:, :, :, t], o)
    lse = torch.where(seen, row_max + torch.log(row_sum), float("-inf"))
    heads = groups * hpg
    return o.reshape(batch, m_rows, heads, dv).to(dtype), lse.reshape(batch, m_rows, heads).transpose(1, 2)


def combine_module(spec: KernelSpec, directory):
    """The CPU module of forward_sums.mlir for spec with a public @combine calling @forward_partial_sums."""
    h, g, dv, t, e, hpg = spec.heads, spec.kv_heads, spec.value_dim, spec.num_blocks, spec.dtype, spec.heads_per_group
    o_type, stats_type = f"tensor<?x?x{g}x{t}x{hpg}x{dv}xf32>", f"tensor<?x?x{g}x{t}x{hpg}x2xf32>"
    results = f"tensor<?x?x{h}x{dv}x{e}>, tensor<?x{h}x?xf32>"
    wrapper = f"""
func.func @combine(%o_slots: {o_type}, %stats_slots: {stats_type}, %block_indices: tensor<?x?x{g}x{t}xi32>,
    %n: index) -> ({results}) {{
  %o, %lse = func.call @forward_partial_sums(%o_slots, %stats_slots, %block_indices, %n)
      : ({o_type}, {stats_type}, tensor<?x?x{g}x{t}xi32>, index) -> ({results})
  return %o, %lse : {results}
}}
"""
    return helper_module("common/forward_sums.mlir", spec, wrapper, directory)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_rows_o_and_lse_combine_its_read_blocks_partials_in_slot_order(case, dtype, helper_dir):
    spec, idx, counted, gen = case_slots(case, dtype, seed=5)
    b, m, n, h, g, d, bs, t = CASES[case]
    hpg = spec.heads_per_group
    o_slots = torch.randn(b, m, g, t, hpg, d, generator=gen)
    stats_slots = torch.stack([4 * torch.randn(b, m, g, t, hpg, generator=gen),
                               torch.rand(b, m, g, t, hpg, generator=gen) * 9 + 1], dim=-1)
    o_slots[~counted] = float("nan")                    # the slots no block's piece writes: never added
    stats_slots[~counted] = float("nan")
    want_o, want_lse = expected(o_slots, stats_slots, counted, DTYPES[dtype])

    module = combine_module(spec, helper_dir)
    got_o, got_lse = (module.device.export_tensor(x).clone() for x in module.call("combine", o_slots, stats_slots,
                                                                                    idx, n))

    assert not got_o.isnan().any() and not got_lse.isnan().any()
    torch.testing.assert_close(got_lse, want_lse, rtol=1e-6, atol=1e-6)
    tolerance = {"f32": 1e-6, "bf16": 8e-3}[dtype]     # (exp may differ in its last bit: one rounding in bf16)
    torch.testing.assert_close(got_o.float(), want_o.float(), rtol=tolerance, atol=tolerance)
    empty = ~counted.any(-1)                            # [B, M, G]: rows with no counted slot
    assert torch.equal(got_lse.transpose(1, 2).reshape(b, m, g, hpg)[empty],
                       torch.full_like(got_lse.transpose(1, 2).reshape(b, m, g, hpg)[empty], float("-inf")))
    if case == "empty_row":
        assert empty[0, 0].all() and not got_o[0, 0].any()


def test_a_nan_in_a_counted_slot_reaches_the_rows_o_and_lse(helper_dir):
    """A NaN in a row's q or in the keys of a block it reads makes that block's max and sum NaN: the row's o and lse
    are NaN (docs/semantics.md), not those of a row that saw nothing; the row's other heads are unaffected."""
    b, m, n, h, g, d, bs, t = 1, 3, 192, 2, 1, 32, 64, 4
    spec = KernelSpec(target="cpu", heads=h, kv_heads=g, head_dim=d, value_dim=d, block_size=bs, num_blocks=t,
                      dtype="f32")
    idx = torch.tensor([[[[0, 1, -1, -1]]]], dtype=torch.int32).expand(b, m, g, t).contiguous()
    counted = counted_slots(idx, n, bs)
    o_slots = torch.randn(b, m, g, t, h, d)
    stats_slots = torch.stack([torch.randn(b, m, g, t, h), torch.rand(b, m, g, t, h) + 1], dim=-1)
    o_slots[~counted] = float("nan")
    stats_slots[~counted] = float("nan")
    stats_slots[0, 2, 0, 1, 0] = float("nan")          # row 2's head 0: its second block's max and sum
    o_slots[0, 2, 0, 1, 0] = float("nan")
    module = combine_module(spec, helper_dir)
    got_o, got_lse = (module.device.export_tensor(x).clone() for x in module.call("combine", o_slots, stats_slots,
                                                                                    idx, n))
    assert counted[0, 2, 0, :2].all()
    assert got_o[0, 2, 0].isnan().all() and got_lse[0, 0, 2].isnan()
    assert not got_o[0, 2, 1].isnan().any() and not got_lse[0, 1, 2].isnan()
    assert not got_o[0, :2].isnan().any() and not got_lse[0, :, :2].isnan().any()
