"""gfx950 (and for select_blocks gfx942) ISA budgets of the hot dispatches (compile only: no AMD GPU is reachable).

The hand-written kernels (the default) and the linalg stages (the fallback): every kernel and fused
contraction region must run on the matrix units, keep at least 2 waves per SIMD, fit its LDS in 160 KB and
never spill; no dispatch of either module may spill. The regions are found by dispatch number
(tests/lit/dispatch_count.test pins the numbering); IREE names them `matmul_like` or, with fewer than 16
heads per group, `gather_..._generic`.
Read from the kernel metadata by `nsa_iree.inspect` (what `nsa-iree inspect --target gfx950` prints).
"""

from __future__ import annotations

import pytest

from nsa_iree.inspect import LDS_BYTES, inspect_spec
from nsa_iree.spec import DEMO_SPEC, KernelSpec
from nsa_iree.window import WINDOW_BLOCK, window_slots

ANCHORS = KernelSpec(heads=64, kv_heads=4, head_dim=128, value_dim=128, block_size=64, num_blocks=16,
                     dtype="bf16", target="gfx950")

FUSED_REGIONS = {
    "forward": ("fwd_dispatch_4_", "fwd_dispatch_6_"),                          # block statistics, o
    "two-pass": ("dq_dispatch_4_", "dkdv_dispatch_5_", "dkdv_dispatch_6_"),     # dq, dv, dk
}

CONFIGS = {
    "demo_h16g1_d192": DEMO_SPEC.replace(target="gfx950"),
    "anchors_h64g4_d128": ANCHORS,
    "four_heads_per_group_f16": ANCHORS.replace(heads=16, dtype="f16"),
}


@pytest.mark.parametrize("variant", ["forward", "two-pass"])
@pytest.mark.parametrize("config", CONFIGS, ids=list(CONFIGS))
def test_gfx950_fused_regions_within_budget(monkeypatch, config, variant):
    """The linalg stages, gfx950's fallback (NSA_IREE_KERNELS=linalg, or shapes the portable kernels do not
    take)."""
    rows = inspect_spec(CONFIGS[config].replace(kernels="linalg"), variant)
    regions = [r for r in rows if any(tag in r.name for tag in FUSED_REGIONS[variant])]
    assert len(regions) == len(FUSED_REGIONS[variant]), [r.name for r in rows]
    for r in regions:
        assert r.stats["mfma"] > 0, r
        assert r.stats["waves/simd"] >= 2, r
        assert r.stats["lds"] <= LDS_BYTES["gfx950"], r
    for r in rows:
        assert r.stats["scratch"] == 0, r


# The hand-written kernels of both GPUs, anchors and paper layouts and the compressed attention's (cuda:
# kernels/gpu/nvidia/ and the portable one-pass; gfx950: kernels/gpu/portable/): every fragment read from workgroup
# memory is 32 bits or wider (ldmatrix / 16-byte reads, transposed copies written while staging), at most 1.5 such
# reads per matrix instruction, atomics only in the one-pass and never a compare-and-swap loop. On gfx950 also: 2 or
# more waves per SIMD, no scratch, LDS within 160 KB. Static counts of the PTX / .rocmasm (nsa-iree inspect). The one-
# pass kernel serves D = 192 on gfx950 too: p^T and ds^T live in the K and V rows' tiles (71.25 KB, within the
# recipe's 80 KB) and each rhs unit of q and do serves two column tiles (234 VGPRs: 2 waves per SIMD). On cuda it is
# the portable text with mma.sync's 4-byte fragment reads (2.3 per mma.sync), outside these budgets (its native
# atomics: tests/lit/atomics_one_pass.test).
DENSE_FORWARD, DENSE_DQ, SELECT, SELECT_PORTABLE = ("dense_attention_fwd_tile", "dense_attention_dq_tile",
                                                   "select_blocks_nvidia_rows", "select_blocks_portable_rows")
# select_blocks' portable kernel on the AMD targets (gfx942: units of two 16x16x16 MFMAs): the anchors layout, and
# 4 heads per group (padded to the unit's 16 rows), D 64, f16, 32 slots; on gfx942 also D 192 (25 KB of LDS).
SELECT_AMD = {
    "anchors": ANCHORS,
    "hpg4_d64_f16_s32": ANCHORS.replace(heads=16, head_dim=64, value_dim=64, dtype="f16", num_blocks=32),
}
# the sliding window's modules (nsa_iree.window) for W 512, anchors layout
WINDOW512 = ANCHORS.replace(block_size=WINDOW_BLOCK, num_blocks=window_slots(512), window=512)
WIDE_FORWARD = "selection_attention_wide_fwd_row"
FORWARD, DQ, DKDV, ONEPASS = ("selection_attention_fwd_row", "selection_attention_dq_row",
                              "selection_attention_dkdv_piece", "selection_attention_onepass_row")
HAND_WRITTEN = [
    # (id, spec, variant, kernels)
    *[(f"{target}_{name}_{variant}", spec, variant, kernels)
      for target in ("cuda", "gfx950")
      for name, spec in (("anchors_h64g4_d128", ANCHORS.replace(target=target)),
                         ("paper_h64g4_d192", ANCHORS.replace(target=target, head_dim=192)))
      for variant, kernels in (("forward", (FORWARD,)), ("two-pass", (DQ, DKDV)))],
    ("gfx950_anchors_h64g4_d128_one-pass", ANCHORS, "one-pass", (ONEPASS,)),
    ("gfx950_paper_h64g4_d192_one-pass", ANCHORS.replace(head_dim=192), "one-pass", (ONEPASS,)),
    # the compressed attention's (nsa_iree.compression, key_stride 64): on cuda the dense forward and dq
    # (kernels.DENSE), on gfx950 the selection kernels
    ("cuda_compressed_anchors_forward", ANCHORS.replace(target="cuda", key_stride=64), "forward", (DENSE_FORWARD,)),
    ("cuda_compressed_anchors_two-pass", ANCHORS.replace(target="cuda", key_stride=64), "two-pass", (DENSE_DQ, DKDV)),
    *[(f"gfx950_compressed_anchors_{variant}", ANCHORS.replace(key_stride=64), variant, kernels)
      for variant, kernels in (("forward", (FORWARD,)), ("two-pass", (DQ, DKDV)))],
    # wide groups' forward (kernels.WIDE: a subgroup per 16 heads, 32 and 64 heads per kv head)
    *[(f"cuda_wide_hpg{h // g}_forward", ANCHORS.replace(target="cuda", kv_heads=g), "forward", (WIDE_FORWARD,))
      for h, g in ((64, 2), (64, 1))],
    # select_blocks (T its slots): the NVIDIA kernel, the portable one on gfx950 and gfx942
    ("cuda_select_anchors", ANCHORS.replace(target="cuda"), "select", (SELECT,)),
    *[(f"{target}_select_{name}", spec.replace(target=target), "select", (SELECT_PORTABLE,))
      for target in ("gfx950", "gfx942") for name, spec in SELECT_AMD.items()],
    ("gfx942_select_paper_d192", ANCHORS.replace(target="gfx942", head_dim=192), "select", (SELECT_PORTABLE,)),
    # the sliding window (nsa_iree.window, W 512 in the band's window_slots(512) = 9 slots of WINDOW_BLOCK keys): on
    # cuda the dense forward and dq over the band and the selection kernel's dk/dv, on gfx950 the portable selection
    # kernels with the band's mask
    ("cuda_window512_anchors_forward", WINDOW512.replace(target="cuda"), "forward", (DENSE_FORWARD,)),
    ("cuda_window512_anchors_two-pass", WINDOW512.replace(target="cuda"), "two-pass", (DENSE_DQ, DKDV)),
    *[(f"gfx950_window512_{name}_{variant}", spec, variant, kernels)
      for name, spec in (("anchors", WINDOW512), ("paper_d192", WINDOW512.replace(head_dim=192)))
      for variant, kernels in (("forward", (FORWARD,)), ("two-pass", (DQ, DKDV)))],
]
# What the two inspectors call a matrix instruction and a compare-and-swap.
MATRIX_OP = {"cuda": "mma", "gfx950": "mfma", "gfx942": "mfma"}
CAS = {"cuda": "cas", "gfx950": "cmpswap", "gfx942": "cmpswap"}


@pytest.mark.parametrize("case,spec,variant,kernels", HAND_WRITTEN, ids=[c[0] for c in HAND_WRITTEN])
def test_hand_written_kernels_within_budget(case, spec, variant, kernels):
    rows = {r.name: r for r in inspect_spec(spec, variant)}
    for name in kernels:
        r = rows[name]
        assert r.pipeline == "hand-written", r
        assert r.stats[MATRIX_OP[spec.target]] > 0, r
        assert r.stats["narrow_lds"] == 0, r
        assert r.stats["lds/mma"] <= 1.5, r
        assert r.stats[CAS[spec.target]] == 0, r
        assert (r.stats["atomic_add"] > 0) == (variant == "one-pass"), r
        if spec.target in LDS_BYTES:
            assert r.stats["waves/simd"] >= 2, r
            assert r.stats["scratch"] == 0, r
            assert r.stats["lds"] <= LDS_BYTES[spec.target], r


SELECT_AMD_CASES = [(f"{target}_{name}", spec.replace(target=target))
                    for target in ("gfx950", "gfx942") for name, spec in SELECT_AMD.items()]


@pytest.mark.parametrize("case,spec", SELECT_AMD_CASES, ids=[c[0] for c in SELECT_AMD_CASES])
def test_portable_select_reads_workgroup_memory_16_bytes_at_a_time(case, spec):
    """Every workgroup-memory read of the portable select_blocks is a whole fragment of a unit (ds_read_b128; on
    gfx942 the unit of two 16x16x16 MFMAs keeps it so), one per MFMA of 16x16x32 (two of 16x16x16)."""
    import re

    from nsa_iree.inspect import dump_executables

    asm = "\n".join(f.read_text() for f in sorted(dump_executables(spec, "select").glob("*.rocmasm")))
    body = re.search(rf"^{SELECT_PORTABLE}:\n(.*?)^\.Lfunc_end", asm, flags=re.MULTILINE | re.DOTALL).group(1)
    reads = re.findall(r"^\s+(ds_read\w*)", body, flags=re.MULTILINE)
    mfma = re.findall(r"^\s+(v_mfma\w*)", body, flags=re.MULTILINE)
    assert reads and set(reads) == {"ds_read_b128"}, sorted(set(reads))
    assert len(mfma) == len(reads) * (2 if spec.target == "gfx942" else 1), (len(mfma), len(reads))


# The NVIDIA forward and dq kernels carry the occupancy hint of the recipe's register cap (ptxas then holds
# them to 168 registers: three workgroups per SM where the workgroup memory allows; D = 192 fits two).
OCCUPANCY = [
    ("anchors_h64g4_d128", ANCHORS.replace(target="cuda"), {FORWARD: 3, DQ: 3, DKDV: 1}),
    ("paper_h64g4_d192", ANCHORS.replace(target="cuda", head_dim=192), {FORWARD: 2, DQ: 2, DKDV: 1}),
    ("wide_hpg32_h64g2_d128", ANCHORS.replace(target="cuda", kv_heads=2), {WIDE_FORWARD: 3}),
    ("wide_hpg64_h64g1_d128", ANCHORS.replace(target="cuda", kv_heads=1), {WIDE_FORWARD: 3}),
    # D and Dv <= 64: the recipe's register_cap_small_dims (128 registers), four
    ("d64_h64g4", ANCHORS.replace(target="cuda", head_dim=64, value_dim=64), {FORWARD: 4, DQ: 4, DKDV: 1}),
]


@pytest.mark.parametrize("case,spec,expected", OCCUPANCY, ids=[c[0] for c in OCCUPANCY])
def test_cuda_kernels_carry_their_occupancy_hint(case, spec, expected):
    rows = {r.name: r for variant in ("forward", "two-pass") for r in inspect_spec(spec, variant)}
    assert {name: rows[name].stats["min_ctas"] for name in expected} == expected


def test_inspect_counts_every_warpgroup_product_of_the_hopper_wide_forward():
    """s = q k^T as 8 k16 steps over D = 128 and o += p v as 4 over BS = 64, the latter with p from registers (an
    inline-PTX line that sets its predicate first): 12 wgmma, no mma.sync."""
    rows = {r.name: r for r in inspect_spec(ANCHORS.replace(target="hopper", kv_heads=1), "forward")}
    assert (rows["wide_attention_fwd_tile"].stats["wgmma"], rows["wide_attention_fwd_tile"].stats["mma"]) == (12, 0)
