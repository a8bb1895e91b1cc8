"""gfx950 ISA budgets of the hot dispatches (compile only: no AMD GPU is reachable).

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
    monkeypatch.setenv("NSA_IREE_KERNELS", "linalg")
    rows = inspect_spec(CONFIGS[config], variant)
    regions = [r for r in rows if any(tag in r.name for tag in FUSED_REGIONS[variant])]
    assert len(regions) == len(FUSED_REGIONS[variant]), [r.name for r in rows]
    for r in regions:
        assert r.stats["mfma"] > 0, r
        assert r.stats["waves/simd"] >= 2, r
        assert r.stats["lds"] <= LDS_BYTES["gfx950"], r
    for r in rows:
        assert r.stats["scratch"] == 0, r


# The hand-written cuda kernels (nsa_iree/mlir/*_kernel.mlir), anchors and paper layouts:
# every fragment read is 32 bits or wider (ldmatrix, 16-byte copies), at most 1.5 shared-memory reads per
# mma.sync, no atomics (the two-pass backward stays bitwise reproducible). Static counts of the PTX.
CUDA_KERNELS = {"forward": ("selection_attention_fwd_row",),
                "two-pass": ("selection_attention_dq_row", "selection_attention_dkdv_piece")}
CUDA_CONFIGS = {
    "anchors_h64g4_d128": ANCHORS.replace(target="cuda"),
    "paper_h64g4_d192": ANCHORS.replace(target="cuda", head_dim=192),
}


@pytest.mark.parametrize("variant", ["forward", "two-pass"])
@pytest.mark.parametrize("config", CUDA_CONFIGS, ids=list(CUDA_CONFIGS))
def test_cuda_kernels_feed_mma_with_wide_shared_reads(config, variant):
    rows = {r.name: r for r in inspect_spec(CUDA_CONFIGS[config], variant)}
    for name in CUDA_KERNELS[variant]:
        r = rows[name]
        assert r.pipeline == "hand-written", r
        assert r.stats["mma"] > 0, r
        assert r.stats["narrow_lds"] == 0, r
        assert r.stats["lds/mma"] <= 1.5, r
        assert r.stats["atomic_add"] == 0 and r.stats["cas"] == 0, r


# The hand-written gfx950 kernels (nsa_iree/mlir/*_portable.mlir), anchors and paper layouts: the budgets of the
# backward kernels' issue. Every LDS read feeding an MFMA is 32 bits or wider (one 16-byte read per fragment),
# at most 1.5 LDS reads per MFMA, 2 or more waves per SIMD, no scratch, LDS within 160 KB. Static counts of
# the .rocmasm (nsa-iree inspect --target gfx950).
GFX950_KERNELS = {"forward": ("selection_attention_fwd_row",),
                  "two-pass": ("selection_attention_dq_row", "selection_attention_dkdv_piece")}
GFX950_CONFIGS = {
    "anchors_h64g4_d128": ANCHORS,
    "paper_h64g4_d192": ANCHORS.replace(head_dim=192),
}


@pytest.mark.parametrize("variant", list(GFX950_KERNELS))
@pytest.mark.parametrize("config", GFX950_CONFIGS, ids=list(GFX950_CONFIGS))
def test_gfx950_kernels_feed_mfma_with_wide_lds_reads(config, variant):
    rows = {r.name: r for r in inspect_spec(GFX950_CONFIGS[config], variant)}
    for name in GFX950_KERNELS[variant]:
        r = rows[name]
        assert r.pipeline == "hand-written", r
        assert r.stats["mfma"] > 0, r
        assert r.stats["narrow_lds"] == 0, r
        assert r.stats["lds/mma"] <= 1.5, r
        assert r.stats["waves/simd"] >= 2, r
        assert r.stats["scratch"] == 0, r
        assert r.stats["lds"] <= LDS_BYTES["gfx950"], r
        assert r.stats["atomic_add"] == 0 and r.stats["cmpswap"] == 0, r


def test_gfx950_onepass_kernel_on_mfma_with_native_atomics():
    """The portable one-pass (nsa_iree/mlir/onepass_portable.mlir), anchors layout: its five products on the
    MFMA units, dk/dv added with global_atomic_add_f32 (never a compare-and-swap loop), no scratch, 2 or more
    waves per SIMD, wide LDS reads only."""
    rows = {r.name: r for r in inspect_spec(ANCHORS, "one-pass")}
    r = rows["selection_attention_onepass_row"]
    assert r.pipeline == "hand-written", r
    assert r.stats["mfma"] > 0 and r.stats["atomic_add"] > 0 and r.stats["cmpswap"] == 0, r
    assert r.stats["scratch"] == 0 and r.stats["waves/simd"] >= 2, r
    assert r.stats["narrow_lds"] == 0 and r.stats["lds/mma"] <= 1.5, r
