"""The dq sums of the dk/dv kernel that makes dq (common/dq_sums.mlir) on their own, on the CPU: each row's dq is
its dq partials, found through the block lists' inversion, summed in f32 in slot order over the blocks it reads
(each once) and rounded once, bit for bit as the contract restated in plain torch below."""

from __future__ import annotations

import pytest
import torch
from iree.compiler import compile_str

from nsa_iree.cache import write_artifact
from nsa_iree.kernels import COMMON
from nsa_iree.recipes import load_recipe
from nsa_iree.reference import block_lists_reference
from nsa_iree.render import render_template
from nsa_iree.runtime import device_for
from nsa_iree.spec import KernelSpec

RECIPE = load_recipe("cpu")
ROWS_PER_PIECE = RECIPE.rows_per_piece
INT32_MIN = torch.iinfo(torch.int32).min
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

CASES = {
    # (B, M, N, H, G, D, BS, T): the M rows are the last M of N positions. Every case's slots hold random block ids
    # (valid, past the end, -1); the case's own slots are written by `special` below.
    # Both batches, two groups of 4 heads; -1, INT32_MIN, a block past the end, future blocks of the early rows and
    # the same block in two slots of a row.
    "hpg4_b2_m_lt_n_bad_slots_duplicates": (2, 40, 100, 8, 2, 32, 16, 6),
    # One head per group; blocks 0 and 1 are read by every row (of each group) that sees them: lists of 2 RPP + 1
    # and 2 RPP - 8 rows, three and two pieces, whose rows past the first piece are found in the later ones.
    "hpg1_piece_boundary": (1, 2 * ROWS_PER_PIECE + 1, 2 * ROWS_PER_PIECE + 8, 2, 2, 16, 16, 4),
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
    elif case == "hpg1_piece_boundary":
        idx[:, :, :, 0] = 0                             # every row reads block 0
        idx[:, :, :, 2] = 1                             # and block 1 from pos(m) = m + 7 >= 16 on: a future one before
    elif case == "empty_row":
        # pos(m) = m + 31: row 0 reads blocks 0 and 1, rows 1 and 2 blocks 0 to 2
        idx[0, 0] = torch.tensor([-1, INT32_MIN, num_blocks + 5, 2, -1, -7], dtype=torch.int32)
        idx[0, 1:] = -1
        idx[0, 2, 1, 3] = 0                             # row 2 reads block 0 in group 1 only
    else:
        raise ValueError(case)


def expected_dq(dq_pieces, idx, entries, n: int, bs: int, heads: int, dtype: torch.dtype) -> torch.Tensor:
    """The contract restated: dq[b, m, h] = the f32 sum, in slot order, over the slots that name a block row
    (b, m, g = h // HPG) reads and no earlier slot of the row names, of the partial of (h, the row's place in that
    block's list) (place = p RPP + r where entries[p, r] = (row, flat block)), rounded once to dtype."""
    batch, m_rows, groups, slots = idx.shape
    hpg = heads // groups
    num_blocks = -(-n // bs)
    place = {(int(c), int(fb)): p * ROWS_PER_PIECE + r
             for p, piece in enumerate(entries.tolist()) for r, (c, fb) in enumerate(piece) if c >= 0}
    dq = torch.zeros(batch, m_rows, heads, dq_pieces.shape[-1], dtype=torch.float32)
    for b in range(batch):
        for m in range(m_rows):
            last_visible = (m + n - m_rows) // bs                    # pos(m) // BS: no block past it is read
            for g in range(groups):
                row = (b * m_rows + m) * groups + g
                acc = torch.zeros(hpg, dq_pieces.shape[-1], dtype=torch.float32)
                named = set()
                for block in idx[b, m, g].tolist():
                    reads = 0 <= block <= last_visible and block not in named
                    named.add(block)
                    if reads:
                        at = place[(row, (b * groups + g) * num_blocks + block)]
                        p, r = divmod(at, ROWS_PER_PIECE)
                        acc = acc + dq_pieces[p, r * hpg:(r + 1) * hpg]
                dq[b, m, g * hpg:(g + 1) * hpg] = acc
    return dq.to(dtype)


_MODULES = {}


def dq_sums_module(spec: KernelSpec, directory):
    """The CPU module of dq_sums.mlir for spec with a public @dq_sums calling @dq_partial_sums (compiled once)."""
    if spec not in _MODULES:
        h, g, d, t, e = spec.heads, spec.kv_heads, spec.head_dim, spec.num_blocks, spec.dtype
        rows = ROWS_PER_PIECE * spec.heads_per_group
        types = (f"tensor<?x{rows}x{d}xf32>, tensor<?x?x{g}x{t}xi32>, tensor<?x{ROWS_PER_PIECE}x2xi32>, "
                 f"tensor<?xi32>, tensor<?xi32>, index")
        result = f"tensor<?x?x{h}x{d}x{e}>"
        wrapper = f"""
func.func @dq_sums(%dq_pieces: tensor<?x{rows}x{d}xf32>, %block_indices: tensor<?x?x{g}x{t}xi32>,
    %entries: tensor<?x{ROWS_PER_PIECE}x2xi32>, %piece_start: tensor<?xi32>, %piece_count: tensor<?xi32>,
    %n: index) -> {result} {{
  %dq = func.call @dq_partial_sums(%dq_pieces, %block_indices, %entries, %piece_start, %piece_count, %n)
      : ({types}) -> {result}
  return %dq : {result}
}}
"""
        text = render_template("common/dq_sums.mlir", spec, RECIPE, COMMON) + wrapper
        vmfb = directory / f"dq_sums_{spec.name}.vmfb"
        write_artifact(vmfb, compile_str(text, extra_args=list(RECIPE.flags_for(spec))))
        _MODULES[spec] = device_for(torch.device("cpu")).module(vmfb)
    return _MODULES[spec]


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("dq_sums")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_rows_dq_is_its_read_blocks_partials_summed_in_slot_order_and_rounded_once(case, dtype, build_dir):
    b, m, n, h, g, d, bs, t = CASES[case]
    spec = KernelSpec(target="cpu", heads=h, kv_heads=g, head_dim=d, value_dim=d, block_size=bs, num_blocks=t,
                      dtype=dtype)
    gen = torch.Generator().manual_seed(11)
    num_blocks = -(-n // bs)
    idx = torch.randint(-1, num_blocks + 2, (b, m, g, t), generator=gen, dtype=torch.int32)
    special(case, idx, n, bs)
    entries, piece_start, piece_count = block_lists_reference(idx, bs, n, ROWS_PER_PIECE)
    dq_pieces = torch.randn(entries.shape[0], ROWS_PER_PIECE * spec.heads_per_group, d, generator=gen)
    want = expected_dq(dq_pieces, idx, entries, n, bs, h, DTYPES[dtype])

    module = dq_sums_module(spec, build_dir)
    got = module.device.export_tensor(module.call("dq_sums", dq_pieces, idx, entries, piece_start, piece_count,
                                                  n)[0]).clone()

    assert got.shape == want.shape and got.dtype == want.dtype
    differ = (got != want).any(dim=-1).nonzero().tolist()
    assert torch.equal(got, want), f"(b, m, h) whose dq differs: {differ[:20]} ({len(differ)} in all)"
    if case == "hpg1_piece_boundary":
        assert int(piece_count.max()) == 3             # the case covers what it names: lists of three pieces
    if case == "empty_row":
        assert not got[0, :2].any() and not got[0, 2, :4].any()    # every slot skipped: exactly 0
        assert got[0, 2, 4:].any()
