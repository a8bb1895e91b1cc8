"""nsa_iree.select_blocks (the CPU kernel kernels/cpu/select_blocks.mlir) against the f64 oracle
reference.select_blocks_reference: block ids exactly equal (docs/semantics.md, 'The compression branch and block
selection'), M < N and M > N, N not a multiple of BS, the first BS - 1 rows, counts of 0, above the visible
blocks and per row with negatives, ties, NaN scores, packed sequences, lse given or computed, errors.

The oracle gets the lse the kernel ranks with (compressed_attention's float32 one, given to both), so what is
compared is the ranking itself; the kernel's scores are float32 sums, exact enough on these random inputs that no
two candidates' scores fall within rounding of each other where it matters (f16 and bf16 included: the oracle
reads the same 16-bit inputs). The buffers the kernels write start poisoned (INT32_MAX ids, NaN floats), so a
slot left unwritten fails the range check (every id in [-1, C)) and the exact comparison. Also which kernel each
target takes (the NVIDIA and the AMD targets' portable kernels run on the H200: bench/run_select_h200.sh), and that a
layout none takes raises before anything compiles."""

from __future__ import annotations

import pytest
import torch

from conftest import DTYPES

import nsa_iree
from nsa_iree import api, compression
from nsa_iree.kernels import choose
from nsa_iree.recipes import load_recipe
from nsa_iree.reference import select_blocks_reference
from nsa_iree.spec import KernelSpec

pytestmark = pytest.mark.usefixtures("poisoned_compression_outputs")

# (B, M, N (seq_len, None: M), H, G, D, BS, S)
SHAPES = {
    "square": (1, 256, None, 16, 1, 64, 16, 8),
    "n_not_a_multiple_of_bs": (2, 203, None, 4, 2, 32, 16, 5),
    "m_below_n": (1, 100, 230, 8, 2, 32, 16, 6),
    "m_above_n": (1, 150, 90, 4, 1, 32, 16, 4),
    "one_head_per_group": (1, 129, None, 4, 4, 32, 16, 4),
    "three_heads_per_group": (1, 97, None, 6, 2, 16, 8, 7),
    "d128_many_candidates": (1, 300, None, 16, 1, 128, 8, 6),
    "count_above_visible": (1, 70, None, 3, 1, 16, 8, 20),
    "shorter_than_a_block": (1, 40, None, 4, 1, 16, 64, 3),
}


def _problem(shape, dtype, seed=0):
    batch, m_rows, n, heads, groups, dim, bs, slots = shape
    gen = torch.Generator().manual_seed(seed)
    c = -(-(m_rows if n is None else n) // bs)
    q = torch.randn(batch, m_rows, heads, dim, generator=gen).to(dtype)
    k = torch.randn(batch, c, groups, dim, generator=gen).to(dtype)
    return q, k, bs, n, slots


def _lse(q, k, bs, n, cu_seqlens=None):
    return nsa_iree.compressed_attention(q, k, k, bs, seq_len=n, cu_seqlens=cu_seqlens)[1]


def _check_range(ids, num_blocks):
    assert ids.dtype == torch.int32
    assert ((ids >= -1) & (ids < max(num_blocks, 1))).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES.values(), ids=list(SHAPES))
def test_ids_equal_the_reference(shape, dtype):
    q, k, bs, n, slots = _problem(shape, DTYPES[dtype])
    lse = _lse(q, k, bs, n)
    got = nsa_iree.select_blocks(q, k, slots, bs, seq_len=n, lse=lse)
    ref = select_blocks_reference(q, k, slots, bs, lse=lse, seq_len=n)
    assert got.shape == (q.shape[0], q.shape[1], k.shape[2], slots)
    _check_range(got, k.shape[1])
    assert torch.equal(got, ref)


def test_lse_given_or_computed_select_the_same_blocks():
    q, k, bs, n, slots = _problem(SHAPES["m_below_n"], torch.float32)
    assert torch.equal(nsa_iree.select_blocks(q, k, slots, bs, seq_len=n),
                       nsa_iree.select_blocks(q, k, slots, bs, seq_len=n, lse=_lse(q, k, bs, n)))


def test_the_reference_without_lse_agrees_too():
    q, k, bs, n, slots = _problem(SHAPES["n_not_a_multiple_of_bs"], torch.float32)
    assert torch.equal(nsa_iree.select_blocks(q, k, slots, bs, seq_len=n),
                       select_blocks_reference(q, k, slots, bs, seq_len=n))


def test_first_rows_select_their_own_block_then_the_one_before():
    q, k, bs, _, _ = _problem((1, 64, None, 4, 1, 16, 16, 5), torch.float32)
    got = nsa_iree.select_blocks(q, k, 5, bs)
    minus = [-1] * 4
    assert (got[0, :bs - 1, 0] == torch.tensor([0] + minus, dtype=torch.int32)).all()      # no visible block
    assert (got[0, bs:2 * bs, 0] == torch.tensor([1, 0] + minus[:3], dtype=torch.int32)).all()
    assert (got[0, 2 * bs:3 * bs, 0, :3] == torch.tensor([2, 1, 0], dtype=torch.int32)).all()
    assert (got[0, 2 * bs:3 * bs, 0, 3:] == -1).all()      # own block 2: nothing else to score


COUNTS = {
    "negative_zero_and_above_visible": (-3, 12),
    "all_zero": (0, 1),
    "all_negative": (-5, 0),
}


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("low, high", COUNTS.values(), ids=list(COUNTS))
def test_per_row_counts(low, high, dtype):
    q, k, bs, n, _ = _problem(SHAPES["n_not_a_multiple_of_bs"], torch.float32)
    counts = torch.randint(low, high, (q.shape[0], q.shape[1], k.shape[2]),
                           generator=torch.Generator().manual_seed(3)).to(dtype)
    lse = _lse(q, k, bs, n)
    got = nsa_iree.select_blocks(q, k, counts, bs, lse=lse)
    ref = select_blocks_reference(q, k, counts, bs, lse=lse)
    assert got.shape[-1] == max(int(counts.max()), 0)
    _check_range(got, k.shape[1])
    assert torch.equal(got, ref)
    if got.shape[-1]:
        kept = (got >= 0).sum(-1)
        assert (kept <= counts.clamp(min=0)).all()


def test_count_zero_gives_no_slot():
    q, k, bs, _, _ = _problem(SHAPES["square"], torch.float32)
    assert nsa_iree.select_blocks(q, k, 0, bs).shape == (1, 256, 1, 0)


def test_equal_scores_go_to_the_lower_block_id():
    q, k, bs, _, _ = _problem((1, 200, None, 4, 1, 16, 8, 7), torch.float32)
    k = k[:, :1].expand_as(k).contiguous()             # every block the same key: every score equal
    got = nsa_iree.select_blocks(q, k, 7, bs)
    assert torch.equal(got, select_blocks_reference(q, k, 7, bs))
    row = 10 * bs + 3                                  # own block 10
    assert got[0, row, 0].tolist() == [10, 9, 0, 1, 2, 3, 4]


def test_nan_scores_rank_last():
    q, k, bs, _, _ = _problem((1, 160, None, 4, 1, 16, 8, 6), torch.float32)
    lse = _lse(q, k, bs, None)
    k[0, 2:4] = float("nan")                           # blocks 2 and 3 score NaN for every row
    got = nsa_iree.select_blocks(q, k, 20, bs, lse=lse)
    assert torch.equal(got, select_blocks_reference(q, k, 20, bs, lse=lse))
    row = got[0, 159, 0].tolist()                      # own block 19: 19, 18, 0, then 1 .. 17 by score, NaNs last
    assert row[:3] == [19, 18, 0] and row[-2:] == [2, 3] and sorted(row) == list(range(20))


PACKED = {
    "mixed": [0, 1, 15, 16, 17, 50],
    "empty_first_and_last": [0, 70, 0],
    "one_sequence": [45],
}


@pytest.mark.parametrize("lengths", PACKED.values(), ids=list(PACKED))
def test_packed_sequences_equal_separate_calls(lengths):
    bs, slots = 8, 5
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, sum(lengths), 4, 16, generator=gen)
    k_cmp = nsa_iree.mean_pooling(torch.randn(1, sum(lengths), 2, 16, generator=gen), bs, cu_seqlens=cu)
    lse = _lse(q, k_cmp, bs, None, cu)
    got = nsa_iree.select_blocks(q, k_cmp, slots, bs, cu_seqlens=cu, lse=lse)
    assert torch.equal(got, select_blocks_reference(q, k_cmp, slots, bs, lse=lse, cu_seqlens=cu))
    assert torch.equal(got, nsa_iree.select_blocks(q, k_cmp, slots, bs, cu_seqlens=cu))
    first = 0
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        blocks = -(-(b - a) // bs)
        if b > a:
            alone = nsa_iree.select_blocks(q[:, a:b], k_cmp[:, first:first + blocks], slots, bs)
            assert torch.equal(got[:, a:b], alone)
        first += blocks


def test_inputs_that_require_grad_give_a_plain_int32_tensor():
    q, k, bs, _, slots = _problem(SHAPES["three_heads_per_group"], torch.float32)
    got = nsa_iree.select_blocks(q.requires_grad_(), k.requires_grad_(), slots, bs)
    assert got.dtype == torch.int32 and not got.requires_grad
    assert torch.equal(got, select_blocks_reference(q.detach(), k.detach(), slots, bs))


# The kernel of each target (select_blocks has no linalg form): the CPU's, the NVIDIA one on cuda (16 heads per
# group), the portable one on the AMD targets (up to 16 heads per group; kernels/gpu/portable/select_blocks.mlir).
# (target, KernelSpec fields, family)
KERNEL_CHOICE = {
    "cpu": ("cpu", dict(heads=64, kv_heads=4, head_dim=128, dtype="f32"), "cpu"),
    "cpu_one_head_per_group": ("cpu", dict(heads=4, kv_heads=4, head_dim=32, dtype="bf16"), "cpu"),
    "cuda_anchors": ("cuda", dict(heads=64, kv_heads=4, head_dim=128), "nvidia"),
    "gfx950_anchors": ("gfx950", dict(heads=64, kv_heads=4, head_dim=128), "portable"),
    "gfx950_f16_4_heads_per_group_d64_32_slots": ("gfx950", dict(heads=16, kv_heads=4, head_dim=64, dtype="f16",
                                                                 num_blocks=32), "portable"),
    "gfx950_one_head_per_group_d192": ("gfx950", dict(heads=4, kv_heads=4, head_dim=192), "portable"),
    "gfx942_anchors": ("gfx942", dict(heads=64, kv_heads=4, head_dim=128), "portable"),
    "gfx942_f16_8_heads_per_group": ("gfx942", dict(heads=32, kv_heads=4, head_dim=64, dtype="f16"), "portable"),
    "linalg_setting_keeps_the_kernel": ("gfx950", dict(heads=64, kv_heads=4, head_dim=128, kernels="linalg"),
                                        "portable"),
}


@pytest.mark.parametrize("target, fields, family", KERNEL_CHOICE.values(), ids=KERNEL_CHOICE)
def test_each_target_has_its_kernel(target, fields, family):
    spec = KernelSpec(**{"value_dim": fields["head_dim"], "block_size": 64, "num_blocks": 16, "dtype": "bf16",
                         **fields, "target": target})
    assert choose("select_blocks", spec, load_recipe(target)).family == family


def test_an_amd_target_gets_to_its_kernel(monkeypatch):
    """On gfx950 select_blocks asks for the portable kernel's module ("select" of a gfx950 spec), after its checks."""
    class Reached(Exception):
        pass

    def kernels(spec, variant, device):
        assert (spec.target, variant, spec.num_blocks) == ("gfx950", "select", 4)
        assert choose("select_blocks", spec, load_recipe("gfx950")).family == "portable"
        raise Reached

    monkeypatch.setattr(api, "_target_for", lambda device: "gfx950")
    monkeypatch.setattr(api, "kernels", kernels)
    q, k, bs, _, _ = _problem((1, 128, None, 16, 1, 64, 64, 4), torch.bfloat16)
    with pytest.raises(Reached):
        compression.select_blocks(q, k, 4, bs, lse=torch.zeros(1, 16, 128))


# Where select_blocks has no kernel: a recipe that names none, on cuda a layout the NVIDIA kernel does not take (it
# needs 16 heads per group and at most 32 slots), on the AMD targets one the portable kernel does not take (up to 16
# heads per group, at most 32 slots, D a multiple of the unit's K: 32).
NO_KERNEL = {
    "a_recipe_without_the_entry": ("gfx950", dict(heads=16, num_blocks=4), "names none"),
    "cuda_4_heads_per_group": ("cuda", dict(heads=4, num_blocks=4), "16 heads per group"),
    "cuda_33_slots": ("cuda", dict(heads=16, num_blocks=33), "more than 32 output slots"),
    "gfx950_32_heads_per_group": ("gfx950", dict(heads=32, num_blocks=4), "up to 16 heads per group"),
    "gfx950_33_slots": ("gfx950", dict(heads=16, num_blocks=33), "more than 32 output slots"),
    "gfx950_d16": ("gfx950", dict(heads=16, num_blocks=4), "D not a multiple of the unit's K"),
    "gfx942_33_slots": ("gfx942", dict(heads=16, num_blocks=33), "more than 32 output slots"),
}


def _recipe(case, target):
    """The target's recipe; for a_recipe_without_the_entry, without its select_blocks entry."""
    import dataclasses

    recipe = load_recipe(target)
    if case != "a_recipe_without_the_entry":
        return recipe
    settings = {key: value for key, value in recipe.kernel_settings.items() if key != "select_blocks"}
    return dataclasses.replace(recipe, kernel_settings=settings)


@pytest.mark.parametrize("case, target, fields, message", [(c, *v) for c, v in NO_KERNEL.items()], ids=NO_KERNEL)
def test_a_layout_without_a_kernel_raises_before_compiling(monkeypatch, case, target, fields, message):
    spec = KernelSpec(kv_heads=1, head_dim=16, value_dim=16, block_size=16, dtype="bf16", target=target, **fields)
    recipe = _recipe(case, target)
    with pytest.raises(NotImplementedError, match=message):
        choose("select_blocks", spec, recipe)
    monkeypatch.setattr(compression, "_check_select_kernel", lambda spec: choose("select_blocks", spec, recipe))
    monkeypatch.setattr(api, "_target_for", lambda device: target)
    monkeypatch.setattr(api, "kernels", lambda *a: pytest.fail("compiled on a target without the kernel"))
    q, k, bs, _, _ = _problem((1, 64, None, fields["heads"], 1, 16, 16, 4), torch.bfloat16)
    with pytest.raises(NotImplementedError, match=message):
        compression.select_blocks(q, k, fields["num_blocks"], bs, lse=torch.zeros(1, fields["heads"], 64))


def test_linalg_kernels_setting_still_runs_the_cpu_kernel(monkeypatch):
    monkeypatch.setenv("NSA_IREE_KERNELS", "linalg")
    q, k, bs, _, slots = _problem(SHAPES["one_head_per_group"], torch.float32)
    lse = _lse(q, k, bs, None)
    assert torch.equal(nsa_iree.select_blocks(q, k, slots, bs, lse=lse),
                       select_blocks_reference(q, k, slots, bs, lse=lse))


BAD = {
    "k_cmp_wrong_block_count": (dict(k_cmp=torch.zeros(1, 3, 1, 16)), "k_cmp"),
    "k_cmp_other_dtype": (dict(k_cmp=torch.zeros(1, 4, 1, 16, dtype=torch.float16)), "k_cmp"),
    "q_rank": (dict(q=torch.zeros(64, 2, 16)), "q"),
    "heads_not_a_multiple": (dict(q=torch.zeros(1, 64, 3, 16), k_cmp=torch.zeros(1, 4, 2, 16)), "kv heads"),
    "block_size_zero": (dict(block_size=0), "block_size"),
    "scale_nan": (dict(scale=float("nan")), "scale"),
    "counts_negative_int": (dict(block_counts=-1), "block_counts"),
    "counts_float_tensor": (dict(block_counts=torch.zeros(1, 64, 1)), "block_counts"),
    "counts_wrong_shape": (dict(block_counts=torch.zeros(1, 64, 2, dtype=torch.int32)), "block_counts"),
    "counts_a_float": (dict(block_counts=2.0), "block_counts"),
    "lse_not_float32": (dict(lse=torch.zeros(1, 2, 64, dtype=torch.float16)), "lse"),
    "lse_wrong_shape": (dict(lse=torch.zeros(1, 64, 2)), "lse"),
    "seq_len_negative": (dict(seq_len=-1), "seq_len"),
}


@pytest.mark.parametrize("override, named", BAD.values(), ids=list(BAD))
def test_bad_input_names_the_argument(override, named):
    args = dict(q=torch.zeros(1, 64, 2, 16), k_cmp=torch.zeros(1, 4, 1, 16), block_counts=4, block_size=16) | override
    with pytest.raises((TypeError, ValueError), match=named):
        nsa_iree.select_blocks(args.pop("q"), args.pop("k_cmp"), args.pop("block_counts"), args.pop("block_size"),
                               **args)


def test_packed_bad_block_count_names_k_cmp():
    cu = torch.tensor([0, 10, 30], dtype=torch.int32)
    with pytest.raises(ValueError, match="k_cmp"):
        nsa_iree.select_blocks(torch.zeros(1, 30, 2, 16), torch.zeros(1, 3, 1, 16), 4, 8, cu_seqlens=cu)


def test_autocast_selects_from_the_autocast_dtype():
    """Under autocast q and k_cmp are cast (as for the attention ops) before the kernel is chosen and run."""
    q, k, bs, n, slots = _problem(SHAPES["one_head_per_group"], torch.float32)
    lse = _lse(q.bfloat16(), k.bfloat16(), bs, n)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = nsa_iree.select_blocks(q, k, slots, bs, lse=lse)
    assert torch.equal(got, nsa_iree.select_blocks(q.bfloat16(), k.bfloat16(), slots, bs, lse=lse))
