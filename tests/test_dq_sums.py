"""The dq sums of the dk/dv kernel that makes dq (common/dq_sums.mlir) on their own, on the CPU: each row's dq is
its per-slot dq partials summed in f32 in slot order over the slots naming a block it reads (each block once) and
rounded once, bit for bit as the contract restated in plain torch below; the other slots' values are never added."""

from __future__ import annotations

import pytest
import torch

from nsa_iree.spec import KernelSpec

from conftest import helper_module

INT32_MIN = torch.iinfo(torch.int32).min
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

CASES = {
    # (B, M, N, H, G, D, BS, T): the M rows are the last M of N positions. Every case's slots hold random block ids
    # (valid, past the end, -1); the case's own slots are written by `special` below.
    # Both batches, two groups of 4 heads; -1, INT32_MIN, a block past the end, future blocks of the early rows and
    # the same block in two slots of a row.
    "hpg4_b2_m_lt_n_bad_slots_duplicates": (2, 40, 100, 8, 2, 32, 16, 6),
    # One head per group; every slot of the even rows names block 0: counted once.
    "hpg1_one_block_in_every_slot": (1, 50, 60, 2, 2, 16, 16, 4),
    # Rows whose every slot is skipped (dq exactly 0), beside one that reads a block, on the first case's layout.
    "empty_row": (1, 3, 34, 8, 2, 32, 16, 6),
}


def special(case: str, idx: torch.Tensor, n: int, bs: int) -> None:
    """Write case's edge cases into idx [B, M, G, T] in place."""
    num_blocks = -(-n // bs)
    if case == "hpg4_b2_m_lt_n_bad_slots_duplicates":
        idx[:, 0::4, :, 0] = -1
        idx[:, 1::4, :, 1] = INT32_MIN
        idx[:, 2::4, :, 2] = num_blocks + 5
        idx[:, :8, :, 3] = num_blocks - 1               # pos(m) = m + 60 < 96: the last block is future to rows < 36
        idx[:, 3::5, :, 4] = idx[:, 3::5, :, 1]         # duplicates: slot 4 names what slot 1 names
        idx[:, 5, :, 5] = idx[:, 5, :, 0] = 2           # and slot 5 what slot 0 names, a block the row reads
    elif case == "hpg1_one_block_in_every_slot":
        idx[:, ::2] = 0
    elif case == "empty_row":
        # pos(m) = m + 31: row 0 reads blocks 0 and 1, rows 1 and 2 blocks 0 to 2
        idx[0, 0] = torch.tensor([-1, INT32_MIN, num_blocks + 5, 2, -1, -7], dtype=torch.int32)
        idx[0, 1:] = -1
        idx[0, 2, 1, 3] = 0                             # row 2 reads block 0 in group 1 only
    else:
        raise ValueError(case)


def counted_slots(idx: torch.Tensor, n: int, bs: int) -> torch.Tensor:
    """[B, M, G, T] bool: the slot names a block the row reads (not negative, not past pos(m) // BS, which also
    rules out blocks past the end) that no earlier slot of the row names."""
    batch, m_rows, groups, slots = idx.shape
    counted = torch.zeros(idx.shape, dtype=torch.bool)
    for b in range(batch):
        for m in range(m_rows):
            last_visible = (m + n - m_rows) // bs
            for g in range(groups):
                named = set()
                for t, block in enumerate(idx[b, m, g].tolist()):
                    counted[b, m, g, t] = 0 <= block <= last_visible and block not in named
                    named.add(block)
    return counted


def expected_dq(dq_slots: torch.Tensor, counted: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The contract restated: dq[b, m, h] = the f32 sum, in slot order, of dq_slots[b, m, h // HPG, t, h mod HPG]
    over the counted slots t, rounded once to dtype."""
    batch, m_rows, groups, slots, hpg, d = dq_slots.shape
    acc = torch.zeros(batch, m_rows, groups, hpg, d, dtype=torch.float32)
    for t in range(slots):
        acc = torch.where(counted[:, :, :, t, None, None], acc + dq_slots[:, :, :, t], acc)
    return acc.reshape(batch, m_rows, groups * hpg, d).to(dtype)


def case_slots(case: str, dtype: str, seed: int):
    """CASES[case]'s CPU spec, random block indices (with the case's special slots), the counted slots, and the
    generator that made them (for the partials)."""
    b, m, n, h, g, d, bs, t = CASES[case]
    spec = KernelSpec(target="cpu", heads=h, kv_heads=g, head_dim=d, value_dim=d, block_size=bs, num_blocks=t,
                      dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, -(-n // bs) + 2, (b, m, g, t), generator=gen, dtype=torch.int32)
    special(case, idx, n, bs)
    return spec, idx, counted_slots(idx, n, bs), gen


def dq_sums_module(spec: KernelSpec, directory):
    """The CPU module of dq_sums.mlir for spec with a public @dq_sums calling @dq_partial_sums (compiled once)."""
    h, g, d, t, e, hpg = spec.heads, spec.kv_heads, spec.head_dim, spec.num_blocks, spec.dtype, spec.heads_per_group
    slots_type, result = f"tensor<?x?x{g}x{t}x{hpg}x{d}xf32>", f"tensor<?x?x{h}x{d}x{e}>"
    wrapper = f"""
func.func @dq_sums(%dq_slots: {slots_type}, %block_indices: tensor<?x?x{g}x{t}xi32>, %n: index) -> {result} {{
  %dq = func.call @dq_partial_sums(%dq_slots, %block_indices, %n)
      : ({slots_type}, tensor<?x?x{g}x{t}xi32>, index) -> {result}
  return %dq : {result}
}}
"""
    return helper_module("common/dq_sums.mlir", spec, wrapper, directory)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_rows_dq_is_its_read_blocks_partials_summed_in_slot_order_and_rounded_once(case, dtype, helper_dir):
    spec, idx, counted, gen = case_slots(case, dtype, seed=11)
    b, m, n, h, g, d, bs, t = CASES[case]
    dq_slots = torch.randn(b, m, g, t, spec.heads_per_group, d, generator=gen)
    dq_slots[~counted] = float("nan")                  # the slots no block's piece writes: never added
    want = expected_dq(dq_slots, counted, DTYPES[dtype])

    module = dq_sums_module(spec, helper_dir)
    got = module.device.export_tensor(module.call("dq_sums", dq_slots, idx, n)[0]).clone()

    assert got.shape == want.shape and got.dtype == want.dtype
    differ = (got != want).any(dim=-1).nonzero().tolist()
    assert torch.equal(got, want), f"(b, m, h) whose dq differs: {differ[:20]} ({len(differ)} in all)"
    if case == "hpg1_one_block_in_every_slot":
        assert (counted[:, ::2].sum(-1) <= 1).all()     # the case covers what it names: one slot counted
    if case == "empty_row":
        assert not got[0, :2].any() and not got[0, 2, :4].any()    # every slot skipped: exactly 0
        assert got[0, 2, 4:].any()
