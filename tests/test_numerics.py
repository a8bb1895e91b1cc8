"""Forward (o, lse) and both backward variants (dq, dk, dv) against the f64 reference of semantics.md.

Every run fills the output buffers with NaN first, so an element the kernels never write fails the test.
Tolerance (relative RMS error per output): 1e-5 for f32, 5e-3 for f16, 1e-2 for bf16. The one-pass variant
adds dk/dv with f32 atomics in a varying order, so its errors may differ slightly from run to run (always
within the tolerance); the two-pass variant's are fixed.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nsa_iree.recipes import load_recipe
from nsa_iree.spec import KernelSpec
from nsa_iree.selection import uniform_block_indices

from conftest import DTYPES, Problem, assert_close_to_reference, random_indices, realistic_indices

BASE = Problem()
BACKWARDS = ["two-pass", "one-pass"]


def uniform(gen, p):
    return uniform_block_indices(p.batch, p.m_rows, p.n, p.kv_heads, p.num_blocks, p.block_size, generator=gen)


# --- configurations: head layout, head dims, block size, T, M < N, partial blocks -------------------------

CONFIGS = {
    "hpg1": dict(heads=2, kv_heads=2),
    "hpg2": dict(heads=4, kv_heads=2),
    "hpg3": dict(heads=6, kv_heads=2),
    "hpg4": dict(heads=4, kv_heads=1),
    "hpg8": dict(heads=8, kv_heads=1),
    "hpg16": dict(heads=16, kv_heads=1, batch=1),
    "d_eq_dv": dict(head_dim=32, value_dim=32),
    "d192_dv128": dict(heads=2, kv_heads=1, head_dim=192, value_dim=128, batch=1, block_size=64, m_rows=160, n=200),
    "bs16_t1": dict(block_size=16, num_blocks=1),
    "bs32_t4": dict(block_size=32, num_blocks=4, m_rows=130, n=150),
    "bs64_t16": dict(block_size=64, num_blocks=16, m_rows=300, n=300, select=realistic_indices),
    "m_lt_n": dict(m_rows=40, n=111),
    "n_not_multiple_of_bs": dict(m_rows=77, n=77),
    # more heads per group than the CPU kernels' stack tiles hold: run as groups (kernels.group_split: 2 of 32, the
    # one-pass 4 of 16)
    "hpg64_d128": dict(heads=64, kv_heads=1, head_dim=128, value_dim=128, batch=1, m_rows=70, n=100),
}


@pytest.mark.parametrize("variant", BACKWARDS)
@pytest.mark.parametrize("config", CONFIGS, ids=list(CONFIGS))
def test_configuration_f32(config, variant):
    assert_close_to_reference(dataclasses.replace(BASE, **CONFIGS[config]), torch.float32, variant=variant)


@pytest.mark.parametrize("variant", BACKWARDS)
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("config", ["hpg2", "hpg16", "d192_dv128", "bs64_t16", "m_lt_n"])
def test_configuration_low_precision(config, dtype, variant):
    assert_close_to_reference(dataclasses.replace(BASE, **CONFIGS[config]), DTYPES[dtype], variant=variant)


# --- the edge cases of semantics.md, one test id each, for every dtype ------------------------------------

def minus_one_padding(gen, p):
    idx = random_indices(gen, p, low=0)
    idx[..., p.num_blocks // 2:] = -1
    return idx


def any_negative(gen, p):
    idx = random_indices(gen, p, low=0)
    idx[..., 0] = -7
    idx[:, ::3, :, 1] = -(2**31)
    return idx


def future_blocks(gen, p):
    # Every row lists blocks up to the end of the sequence: the ones after its own position are skipped.
    return random_indices(gen, p, low=0, high=p.num_kv_blocks)


def out_of_range(gen, p):
    idx = random_indices(gen, p, low=0)
    idx[..., 0] = p.num_kv_blocks
    idx[..., 1] = p.num_kv_blocks + 1000
    return idx


def out_of_range_int64(gen, p):
    idx = random_indices(gen, p, low=0).to(torch.int64)
    idx[..., 0] = 2**40
    idx[..., 1] = -(2**40)
    return idx


def counts_int(gen, p):
    return random_indices(gen, p), 2


def counts_tensor(gen, p):
    counts = torch.randint(0, p.num_blocks + 1, (p.batch, p.m_rows, p.kv_heads), generator=gen)
    return random_indices(gen, p), counts


def duplicates(gen, p):
    idx = random_indices(gen, p, low=0)
    idx[..., 1] = idx[..., 0]
    idx[:, ::2, :, 2] = idx[:, ::2, :, 0]
    return idx


def empty_rows(gen, p):
    idx = random_indices(gen, p)
    idx[:, ::4] = -1                       # every slot skipped
    idx[:, 1::4] = p.num_kv_blocks + 3     # every slot out of range
    return idx


def own_block_only(gen, p):
    # Row m selects only its own block: offsets 0, 1, ..., BS-1 see 1, 2, ..., BS keys (token-level causal mask).
    pos = torch.arange(p.m_rows) + (p.n - p.m_rows)
    own = (pos // p.block_size).to(torch.int32)
    idx = torch.full((p.batch, p.m_rows, p.kv_heads, p.num_blocks), -1, dtype=torch.int32)
    idx[..., 0] = own.view(1, -1, 1)
    return idx


ROWS_PER_PIECE = load_recipe("cpu").rows_per_piece


def list_length_one_past_a_piece(gen, p):
    # Block 0 selected by exactly one piece of rows plus one, the last row among them: the length of a
    # block's list must count its last row.
    assert p.m_rows > ROWS_PER_PIECE + 1, "the problem must hold a full piece and one more row"
    idx = random_indices(gen, p, low=1)
    idx[..., 0] = -1
    idx[:, :ROWS_PER_PIECE, :, 0] = 0
    idx[:, -1, :, 0] = 0
    return idx


def block_zero_everywhere(gen, p):
    return torch.zeros(p.batch, p.m_rows, p.kv_heads, p.num_blocks, dtype=torch.int32)


EDGE_CASES = {
    "minus_one_padding": dict(select=minus_one_padding),
    "any_negative_index": dict(select=any_negative),
    "future_blocks": dict(select=future_blocks),
    "index_ge_num_blocks": dict(select=out_of_range),
    "int64_beyond_int32": dict(select=out_of_range_int64),
    "block_counts_int": dict(select=counts_int),
    "block_counts_tensor": dict(select=counts_tensor),
    "duplicate_indices": dict(select=duplicates),
    "empty_rows": dict(select=empty_rows),
    "query_offsets_in_own_block": dict(select=own_block_only, m_rows=48, n=48),
    "partial_last_block_m_lt_n": dict(select=uniform, m_rows=50, n=90),
    "realistic_selection": dict(select=realistic_indices, m_rows=160, n=160),
    "list_one_past_a_piece": dict(select=list_length_one_past_a_piece, m_rows=ROWS_PER_PIECE + 44,
                                  n=ROWS_PER_PIECE + 44),
    "custom_scale": dict(scale=0.3),
    # Found by the property tests: with M = 1 the block lists came out empty (the scan's accumulator).
    "single_query_row": dict(select=block_zero_everywhere, m_rows=1, n=9),
    "single_key": dict(select=block_zero_everywhere, m_rows=1, n=1),
}


@pytest.mark.parametrize("variant", BACKWARDS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", EDGE_CASES, ids=list(EDGE_CASES))
def test_edge_case(case, dtype, variant):
    assert_close_to_reference(dataclasses.replace(BASE, **EDGE_CASES[case]), DTYPES[dtype], variant=variant)


@pytest.mark.parametrize("variant", BACKWARDS)
def test_empty_rows_give_zero_output_minus_inf_lse_and_no_gradient(variant):
    p = dataclasses.replace(BASE, select=empty_rows)
    (o, lse, dq, dk, dv), _ = assert_close_to_reference(p, torch.float32, variant=variant)
    assert torch.all(o[:, ::4] == 0) and torch.all(lse[:, :, ::4] == float("-inf"))
    assert torch.all(dq[:, ::4] == 0) and torch.all(dq[:, 1::4] == 0)


@pytest.mark.parametrize("variant", BACKWARDS)
def test_everything_skipped_gives_zero_gradients(variant):
    p = dataclasses.replace(BASE, select=lambda gen, p: -torch.ones(p.batch, p.m_rows, p.kv_heads, p.num_blocks,
                                                                     dtype=torch.int32))
    (o, lse, dq, dk, dv), _ = assert_close_to_reference(p, torch.float32, variant=variant)
    for t in (o, dq, dk, dv):
        assert torch.count_nonzero(t) == 0
    assert torch.all(lse == float("-inf"))


# --- the linalg stages on the CPU ---------------------------------------------------------------------------
# The cpu recipe renders its hand-written kernels (mlir/*_cpu.mlir); the linalg stages, which GPUs use for the
# shapes their kernels do not serve (and gfx942 for all but select_blocks), still run here with NSA_IREE_KERNELS=linalg.

@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("split", [2, 4])
def test_query_heads_run_as_several_groups(split, dtype, monkeypatch):
    """A kv head's query heads run as `split` groups on repeated K, V and block lists, their dk and dv summed
    (nsa_iree.api, kernels.group_split: what the GPUs do above 16 heads per group), forced here on the CPU."""
    from nsa_iree import api, kernels

    monkeypatch.setattr(kernels, "group_split", lambda stages, spec, recipe: split)
    api.loaded_spec.cache_clear()               # the specs are kept per problem in a process
    problem = dataclasses.replace(BASE, heads=16, kv_heads=2, m_rows=60, n=90, num_blocks=3, select=realistic_indices)
    try:
        assert api.loaded_spec(KernelSpec(heads=16, kv_heads=2), "forward")[1] == split
        for variant in BACKWARDS:
            assert_close_to_reference(problem, DTYPES[dtype], variant=variant)
    finally:
        api.loaded_spec.cache_clear()


LINALG_CASES = [("hpg3", "f32"), ("bs64_t16", "f32"), ("d192_dv128", "bf16")]


@pytest.mark.parametrize("variant", BACKWARDS)
@pytest.mark.parametrize("config,dtype", LINALG_CASES, ids=[f"{c}_{d}" for c, d in LINALG_CASES])
def test_linalg_stages(config, dtype, variant, monkeypatch):
    from nsa_iree import api

    monkeypatch.setenv("NSA_IREE_KERNELS", "linalg")
    api._artifact_path.cache_clear()            # artifacts are kept per configuration in a process
    try:
        assert_close_to_reference(dataclasses.replace(BASE, **CONFIGS[config]), DTYPES[dtype], variant=variant)
    finally:
        api._artifact_path.cache_clear()
