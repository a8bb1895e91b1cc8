"""The hand-written kernels' fragment tables and kernel choice.

The kernels load their matrix-unit fragments themselves, so the lane -> element placement in
nsa_iree/fragments.py must be IREE's own for each intrinsic: pinned here against the installed compiler's
`get_single_subgroup_layout` (the AMD tables cannot be checked on hardware, so they are checked against
IREE). Which stages render as hand-written kernels follows the recipe, the environment override and the
shapes a kernel supports.
"""

from __future__ import annotations

import pytest

from nsa_iree.fragments import LAYOUTS, Unit, covers_tile, element_position, evaluate_map
from nsa_iree.recipes import load_recipe
from nsa_iree.kernels import choose, dense_backward, dq_with_dkdv, group_split
from nsa_iree.render import module_templates, render_module
from nsa_iree.spec import KernelSpec

ANCHORS_CUDA = KernelSpec(heads=64, kv_heads=4, head_dim=128, value_dim=128, block_size=64, num_blocks=16,
                          dtype="bf16", target="cuda")


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_fragment_table_is_irees_layout(name):
    from iree.compiler import ir
    from iree.compiler.dialects import iree_gpu

    kind = LAYOUTS[name]
    with ir.Context():
        intrinsic = iree_gpu.MMAIntrinsicAttr.get(getattr(iree_gpu.MMAIntrinsic, name))
        mma = iree_gpu.MMAAttr.get(getattr(iree_gpu.MMAIntrinsic, name))
        assert tuple(mma.mnk_shape) == kind.mnk
        for operand, table in enumerate((kind.lhs, kind.rhs, kind.acc)):
            irees = iree_gpu.get_single_subgroup_layout(intrinsic, operand)
            assert (tuple(irees.outer), tuple(irees.thread), tuple(irees.tstrides), tuple(irees.element)) == (
                table.outer, table.thread, table.tstrides, table.element), (name, operand)
            fragment = mma.abc_vector_types[operand]
            assert fragment.shape and table.fragment_size == fragment.shape[0] * (
                fragment.shape[1] if len(fragment.shape) > 1 else 1)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_tile_element_has_exactly_one_lane(name):
    kind = LAYOUTS[name]
    m, n, k = kind.mnk
    assert kind.lhs.shape == (m, k) and kind.rhs.shape == (k, n) and kind.acc.shape == (m, n)
    for table in (kind.lhs, kind.rhs, kind.acc):
        assert covers_tile(table, kind.subgroup_size)


# The placement the cuda kernels' comments state (lane l, r = l / 4, c = l % 4), from the table.
NV_PLACEMENT = [
    ("lhs", 0, lambda r, c: (r, 2 * c)), ("lhs", 1, lambda r, c: (r, 2 * c + 1)),
    ("lhs", 2, lambda r, c: (r, 2 * c + 8)), ("lhs", 5, lambda r, c: (r + 8, 2 * c + 1)),
    ("lhs", 7, lambda r, c: (r + 8, 2 * c + 9)),
    ("rhs", 1, lambda r, c: (2 * c + 1, r)), ("rhs", 2, lambda r, c: (2 * c + 8, r)),
    ("acc", 1, lambda r, c: (r, 2 * c + 1)), ("acc", 2, lambda r, c: (r + 8, 2 * c)),
]


@pytest.mark.parametrize("operand,index,where", NV_PLACEMENT, ids=[f"{o}[{i}]" for o, i, _ in NV_PLACEMENT])
def test_nv_placement_used_by_the_kernels(operand, index, where):
    table = getattr(LAYOUTS["NV_MMA_SYNC_F32_16x8x16_BF16"], operand)
    for lane in range(32):
        assert element_position(table, lane, index) == where(lane // 4, lane % 4), lane


KERNEL_CHOICE = [
    ("cuda_anchors", ANCHORS_CUDA, {}, ("nvidia", "nvidia", "nvidia")),
    ("cuda_linalg", ANCHORS_CUDA.replace(kernels="linalg"), {}, ("linalg", "linalg", "linalg")),
    ("cuda_32_heads_per_group", ANCHORS_CUDA.replace(heads=128), {}, ("nvidia", "linalg", "linalg")),   # wide forward
    ("cuda_head_dim_72", ANCHORS_CUDA.replace(head_dim=72), {}, ("linalg", "linalg", "linalg")),
    ("gfx950_portable", ANCHORS_CUDA.replace(target="gfx950"), {},
     ("portable", "portable", "portable")),
    ("gfx950_paper_d192", ANCHORS_CUDA.replace(target="gfx950", head_dim=192), {},
     ("portable", "portable", "portable")),
    ("gfx950_linalg", ANCHORS_CUDA.replace(target="gfx950", kernels="linalg"), {}, ("linalg", "linalg", "linalg")),
    # dq's K, V, K transposed and ds for BS = 128, D = 128 need 109 KB: over the 80 KB that keep 2 waves per
    # SIMD; the forward's and dk/dv's tiles still fit.
    ("gfx950_dq_over_its_lds_budget", ANCHORS_CUDA.replace(target="gfx950", block_size=128), {},
     ("portable", "linalg", "portable")),
    # The MFMA's K is 32: a head dim of 48 is not whole units.
    ("gfx950_head_dim_48", ANCHORS_CUDA.replace(target="gfx950", head_dim=48, value_dim=48), {},
     ("linalg", "linalg", "linalg")),
    ("cpu", ANCHORS_CUDA.replace(target="cpu", dtype="f32"), {}, ("cpu", "cpu", "cpu")),
    ("cpu_bf16_one_head_per_group", ANCHORS_CUDA.replace(target="cpu", heads=4), {},
     ("cpu", "cpu", "cpu")),
    ("cpu_linalg", ANCHORS_CUDA.replace(target="cpu", dtype="f32", kernels="linalg"), {},
     ("linalg", "linalg", "linalg")),
    # 64 heads per group at D 192: the forward's and dq's stack tiles exceed 48 KiB (dk/dv's do not).
    ("cpu_tiles_over_the_stack", ANCHORS_CUDA.replace(target="cpu", heads=64, kv_heads=1, head_dim=192), {},
     ("linalg", "linalg", "cpu")),
    # the sliding window: the CPU, NVIDIA and portable (gfx950) kernels take its mask; gfx942's recipe names no
    # portable forward, dq or dk/dv
    ("cpu_window", ANCHORS_CUDA.replace(target="cpu", dtype="f32", num_blocks=9, window=512), {},
     ("cpu", "cpu", "cpu")),
    ("cuda_window", ANCHORS_CUDA.replace(num_blocks=9, window=512), {}, ("nvidia", "nvidia", "nvidia")),
    ("gfx950_window", ANCHORS_CUDA.replace(target="gfx950", num_blocks=9, window=512), {},
     ("portable", "portable", "portable")),
    ("gfx950_window_hpg4_d64_dv128_f16", ANCHORS_CUDA.replace(target="gfx950", heads=16, head_dim=64, dtype="f16",
                                                               num_blocks=3, window=100), {},
     ("portable", "portable", "portable")),
    ("gfx950_window_linalg", ANCHORS_CUDA.replace(target="gfx950", num_blocks=9, window=512, kernels="linalg"), {},
     ("linalg", "linalg", "linalg")),
    ("gfx942_window", ANCHORS_CUDA.replace(target="gfx942", num_blocks=9, window=512), {},
     ("linalg", "linalg", "linalg")),
]


@pytest.mark.parametrize("case,spec,env,expected", KERNEL_CHOICE, ids=[c[0] for c in KERNEL_CHOICE])
def test_kernel_choice(monkeypatch, case, spec, env, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    recipe = load_recipe(spec.target)
    assert tuple(choose(stage, spec, recipe).family for stage in ("forward", "dq", "dkdv")) == expected


# The compressed attention (key_stride > 1) and the sliding window: forward and dq on the dense kernels
# (kernels.DENSE) where the recipe names a family for them (cuda.toml), at any heads per group; the stage's own
# kernel otherwise.
COMPRESSED_CUDA = ANCHORS_CUDA.replace(key_stride=64)
DENSE_CHOICE = [
    ("cuda_hpg1", COMPRESSED_CUDA.replace(heads=4), ("nvidia", "dense_forward"), ("nvidia", "dense_dq")),
    ("cuda_hpg16", COMPRESSED_CUDA, ("nvidia", "dense_forward"), ("nvidia", "dense_dq")),
    ("cuda_hpg64", COMPRESSED_CUDA.replace(kv_heads=1), ("nvidia", "dense_forward"), ("nvidia", "dense_dq")),
    ("cuda_key_stride_1", ANCHORS_CUDA, ("nvidia", None), ("nvidia", None)),
    ("cuda_window", ANCHORS_CUDA.replace(num_blocks=9, window=512), ("nvidia", "dense_forward"),
     ("nvidia", "dense_dq")),
    ("cpu_window", ANCHORS_CUDA.replace(target="cpu", dtype="f32", num_blocks=9, window=512), ("cpu", None),
     ("cpu", None)),
    ("gfx950_window", ANCHORS_CUDA.replace(target="gfx950", num_blocks=9, window=512), ("portable", None),
     ("portable", None)),
    ("cuda_linalg", COMPRESSED_CUDA.replace(kernels="linalg"), ("linalg", None), ("linalg", None)),
    # hopper.toml names the Hopper kernel, then the NVIDIA one: the window's forward and dq on wgmma, the rest as cuda
    ("hopper_window", ANCHORS_CUDA.replace(target="hopper", num_blocks=9, window=512), ("hopper", "dense_forward"),
     ("hopper", "dense_dq")),
    ("hopper_window_d64_hpg4", ANCHORS_CUDA.replace(target="hopper", heads=16, head_dim=64, value_dim=64,
                                                    num_blocks=9, window=512), ("hopper", "dense_forward"),
     ("hopper", "dense_dq")),
    ("hopper_window_bs32", ANCHORS_CUDA.replace(target="hopper", block_size=32, num_blocks=17, window=512),
     ("nvidia", "dense_forward"), ("nvidia", "dense_dq")),                 # the 128-byte lines take BS 64
    ("hopper_window_d192", ANCHORS_CUDA.replace(target="hopper", head_dim=192, num_blocks=9, window=512),
     ("nvidia", "dense_forward"), ("nvidia", "dense_dq")),                 # one workgroup per multiprocessor
    ("hopper_compressed", COMPRESSED_CUDA.replace(target="hopper"), ("nvidia", "dense_forward"),
     ("nvidia", "dense_dq")),
    ("hopper_selection", ANCHORS_CUDA.replace(target="hopper"), ("nvidia", None), ("nvidia", None)),
    ("gfx950_no_dense_entry", COMPRESSED_CUDA.replace(target="gfx950"), ("portable", None), ("portable", None)),
]


@pytest.mark.parametrize("case,spec,forward,dq", DENSE_CHOICE, ids=[c[0] for c in DENSE_CHOICE])
def test_dense_kernel_choice(case, spec, forward, dq):
    recipe = load_recipe(spec.target)
    chosen = [choose(stage, spec, recipe) for stage in ("forward", "dq")]
    assert [(c.family, c.template) for c in chosen] == [forward, dq]


# The dk/dv stage's dense forms: on the CPU the whole backward of the compressed attention (dense_backward: dq with
# dk and dv, one dispatch); on Hopper the window's dk/dv on wgmma (dense_dkdv: key tiles against the rows that see
# them, in one host function with delta and dq). (the family, the template, whether the backward is the one call:
# kernels.dense_backward)
HOPPER_WINDOW = ANCHORS_CUDA.replace(target="hopper", num_blocks=9, window=512)
COMPRESSED_CPU = ANCHORS_CUDA.replace(target="cpu", dtype="f32", key_stride=64)
DENSE_BACKWARD_CHOICE = [
    ("cpu_compressed", COMPRESSED_CPU, ("cpu", "dense_backward", True)),
    ("cpu_compressed_bf16_hpg1", COMPRESSED_CPU.replace(heads=4, dtype="bf16"), ("cpu", "dense_backward", True)),
    ("cpu_compressed_hpg64_d128", COMPRESSED_CPU.replace(kv_heads=1), ("cpu", None, False)),     # stack tiles
    ("cpu_window", COMPRESSED_CPU.replace(key_stride=1, num_blocks=9, window=512), ("cpu", None, False)),
    ("cpu_selection", COMPRESSED_CPU.replace(key_stride=1), ("cpu", None, False)),
    ("cpu_linalg", COMPRESSED_CPU.replace(kernels="linalg"), ("linalg", None, False)),
    ("cuda_compressed", COMPRESSED_CUDA, ("nvidia", None, False)),
    ("gfx950_compressed", COMPRESSED_CUDA.replace(target="gfx950"), ("portable", None, False)),
    ("hopper_window", HOPPER_WINDOW, ("hopper", "dense_dkdv", True)),
    ("hopper_window_d64_dv128_hpg1", HOPPER_WINDOW.replace(heads=4, head_dim=64), ("hopper", "dense_dkdv", True)),
    ("hopper_window_d192", HOPPER_WINDOW.replace(head_dim=192), ("nvidia", None, False)),   # dk, dv in registers
    ("hopper_window_bs32", HOPPER_WINDOW.replace(block_size=32, num_blocks=17), ("nvidia", None, False)),
    ("hopper_window_f32", HOPPER_WINDOW.replace(dtype="f32"), ("linalg", None, False)),
    ("hopper_compressed", COMPRESSED_CUDA.replace(target="hopper"), ("nvidia", None, False)),
]


@pytest.mark.parametrize("case,spec,expected", DENSE_BACKWARD_CHOICE, ids=[c[0] for c in DENSE_BACKWARD_CHOICE])
def test_dense_backward_choice(case, spec, expected):
    recipe = load_recipe(spec.target)
    chosen = choose("dkdv", spec, recipe)
    assert (chosen.family, chosen.template, dense_backward(spec, recipe)) == expected


def test_the_dense_backward_module_renders_neither_dq_nor_the_inversion():
    """Its dispatch writes dq and each item's dk/dv partials: the module has no dq pass and no block lists to
    invert; the partials are summed by the piece sums."""
    names = [name for name, _ in module_templates(COMPRESSED_CPU, "two-pass")]
    assert "cpu/dense_backward.mlir" in names and "common/piece_sums.mlir" in names
    assert not {"cpu/dq.mlir", "cpu/dkdv.mlir", "common/inversion.mlir"} & set(names)


def test_the_hopper_window_backward_is_one_function_without_delta_or_the_inversion():
    """Hopper's dense dk/dv renders selection_attention_backward: the dq kernel's dispatch (which makes delta)
    then its own; neither delta's stage nor the block lists' inversion is rendered, and dq has no function of its
    own. Where dk/dv is not the dense form, dq is the stage it always was (delta read)."""
    names = [name for name, _ in module_templates(HOPPER_WINDOW, "two-pass")]
    assert {"gpu/hopper/dense_dq.mlir", "gpu/hopper/dense_dkdv.mlir"} <= set(names)
    assert not {"common/delta.mlir", "common/inversion.mlir", "common/piece_sums.mlir"} & set(names)
    module = render_module(HOPPER_WINDOW, "two-pass")
    assert "func.func @selection_attention_backward(" in module and "func.func @selection_attention_dq(" not in module
    apart = render_module(HOPPER_WINDOW.replace(head_dim=192), "two-pass")     # dk/dv: the NVIDIA kernel
    assert "func.func @selection_attention_dq(" in apart and "func.func @selection_attention_delta(" in apart


# kernels.group_split: the groups of query heads a kv head's run as, per variant's stages (forward; dq and dk/dv;
# the one-pass), so that every stage has its hand-written kernel.
GROUP_SPLIT = [
    ("cuda_hpg16", ANCHORS_CUDA, (1, 1, 1)),
    ("cuda_hpg32", ANCHORS_CUDA.replace(kv_heads=2), (1, 2, 2)),                      # the wide forward
    ("cuda_hpg64", ANCHORS_CUDA.replace(kv_heads=1), (1, 4, 4)),
    ("cuda_hpg128", ANCHORS_CUDA.replace(heads=128, kv_heads=1), (2, 8, 8)),          # past the wide forward's 64
    ("cuda_hpg256", ANCHORS_CUDA.replace(heads=256, kv_heads=1), (4, 16, 16)),
    ("cuda_hpg24", ANCHORS_CUDA.replace(heads=48, kv_heads=2), (2, 2, 2)),           # two groups of 12 (no wide form)
    ("cuda_hpg64_f32", ANCHORS_CUDA.replace(kv_heads=1, dtype="f32"), (1, 1, 1)),        # no kernel takes f32
    ("cuda_compressed_hpg64", COMPRESSED_CUDA.replace(kv_heads=1), (1, 4, 4)),         # the dense forward: any HPG
    ("gfx950_hpg32", ANCHORS_CUDA.replace(target="gfx950", kv_heads=2), (2, 2, 2)),
    ("gfx942_hpg64", ANCHORS_CUDA.replace(target="gfx942", kv_heads=1), (1, 1, 1)),     # linalg by design
    ("cpu_hpg64_d128", ANCHORS_CUDA.replace(target="cpu", kv_heads=1, dtype="f32"), (2, 2, 4)),   # stack tiles
    ("cpu_hpg16", ANCHORS_CUDA.replace(target="cpu", dtype="f32"), (1, 1, 1)),
    ("cuda_linalg", ANCHORS_CUDA.replace(kv_heads=1, kernels="linalg"), (1, 1, 1)),
    ("hopper_hpg64", ANCHORS_CUDA.replace(target="hopper", kv_heads=1), (1, 1, 4)),     # wide forward and dq, dk/dv
    ("hopper_hpg32", ANCHORS_CUDA.replace(target="hopper", kv_heads=2), (1, 2, 2)),     # dq as groups of 16
]


@pytest.mark.parametrize("case,spec,expected", GROUP_SPLIT, ids=[c[0] for c in GROUP_SPLIT])
def test_group_split(case, spec, expected):
    recipe = load_recipe(spec.target)
    stages = (("forward",), ("dq", "dkdv"), ("onepass",))
    assert tuple(group_split(s, spec, recipe) for s in stages) == expected
    for s, split in zip(stages, expected):
        chosen = [choose(stage, spec.replace(kv_heads=spec.kv_heads * split), recipe) for stage in s]
        assert split == 1 or not any(c.crossed for c in chosen)


# Wide groups (more heads per group than one 16-row tile, a multiple of 16, up to 128): the forward on the wide
# kernel (kernels.WIDE) where the recipe names a family for it (cuda.toml); cuda's dq and dk/dv have no wide form.
WIDE_CHOICE = [
    ("cuda_hpg16", ANCHORS_CUDA, (None, "nvidia", "nvidia")),
    ("cuda_hpg32", ANCHORS_CUDA.replace(kv_heads=2), ("wide_forward", "linalg", "linalg")),
    ("cuda_hpg48_d64", ANCHORS_CUDA.replace(heads=48, kv_heads=1, head_dim=64, value_dim=64),
     ("wide_forward", "linalg", "linalg")),
    ("cuda_hpg64", ANCHORS_CUDA.replace(kv_heads=1), ("wide_forward", "linalg", "linalg")),
    ("cuda_hpg128", ANCHORS_CUDA.replace(heads=128, kv_heads=1), (None, "linalg", "linalg")),   # past 4 head tiles
    ("cuda_hpg64_window", ANCHORS_CUDA.replace(kv_heads=1, num_blocks=9, window=512), ("dense_forward", "nvidia",
                                                                                         "linalg")),
    ("cuda_hpg24", ANCHORS_CUDA.replace(heads=48, kv_heads=2), (None, "linalg", "linalg")),      # not a multiple of 16
    ("cuda_hpg64_compressed", COMPRESSED_CUDA.replace(kv_heads=1), ("dense_forward", "nvidia", "linalg")),
    ("cuda_hpg64_linalg", ANCHORS_CUDA.replace(kv_heads=1, kernels="linalg"), (None, "linalg", "linalg")),
    ("gfx950_hpg64", ANCHORS_CUDA.replace(target="gfx950", kv_heads=1), (None, "linalg", "linalg")),
]


# The forward on Hopper: 64 heads per group take the wgmma forward (a position's heads one m64 tile: hopper.toml's
# wide_forward list), other wide groups the NVIDIA wide kernel, up to 4 the forward over the pieces: (the forward's
# family, its template).
HOPPER_ANCHORS = ANCHORS_CUDA.replace(target="hopper")
HOPPER_FORWARD_CHOICE = [
    ("hopper_hpg64", HOPPER_ANCHORS.replace(kv_heads=1), ("hopper", "wide_forward")),
    ("hopper_hpg64_g2", HOPPER_ANCHORS.replace(heads=128, kv_heads=2), ("hopper", "wide_forward")),
    ("hopper_hpg64_d64_bs128", HOPPER_ANCHORS.replace(kv_heads=1, head_dim=64, value_dim=64, block_size=128,
                                                      num_blocks=8), ("hopper", "wide_forward")),
    ("hopper_hpg64_d192", HOPPER_ANCHORS.replace(kv_heads=1, head_dim=192), ("nvidia", "wide_forward")),
    # BS 128 with Dv 64: 97 KiB of workgroup memory, two workgroups (REQUIRED) rather than three
    ("hopper_hpg64_bs128_dv64", HOPPER_ANCHORS.replace(kv_heads=1, value_dim=64, block_size=128, num_blocks=8),
     ("hopper", "wide_forward")),
    ("hopper_hpg32", HOPPER_ANCHORS.replace(kv_heads=2), ("nvidia", "wide_forward")),
    ("hopper_hpg48_d64", HOPPER_ANCHORS.replace(heads=48, kv_heads=1, head_dim=64, value_dim=64),
     ("nvidia", "wide_forward")),
    ("hopper_hpg16", HOPPER_ANCHORS, ("nvidia", None)),
    # up to 4 heads per group the forward over the block lists' pieces (kernels.SMALL: hopper.toml's forward_pieces),
    # above it and where its limits bind the NVIDIA forward
    ("hopper_hpg8", HOPPER_ANCHORS.replace(heads=32), ("nvidia", None)),
    ("hopper_hpg4", HOPPER_ANCHORS.replace(heads=16), ("hopper", "forward_pieces")),
    ("hopper_hpg2_d64", HOPPER_ANCHORS.replace(heads=8, head_dim=64, value_dim=64), ("hopper", "forward_pieces")),
    ("hopper_hpg1", HOPPER_ANCHORS.replace(heads=4), ("hopper", "forward_pieces")),
    ("hopper_hpg4_d192", HOPPER_ANCHORS.replace(heads=16, head_dim=192), ("nvidia", None)),
    ("hopper_hpg4_bs32", HOPPER_ANCHORS.replace(heads=16, block_size=32, num_blocks=32), ("nvidia", None)),
    ("hopper_hpg4_window", HOPPER_ANCHORS.replace(heads=16, num_blocks=9, window=512), ("hopper", "dense_forward")),
    ("hopper_hpg64_window", HOPPER_ANCHORS.replace(kv_heads=1, num_blocks=9, window=512), ("hopper", "dense_forward")),
    ("hopper_hpg64_f32", HOPPER_ANCHORS.replace(kv_heads=1, dtype="f32"), ("linalg", None)),
]


# The selection's backward on Hopper: dk/dv on wgmma wherever its chunks of 64 rows hold whole positions (hopper.toml's
# dkdv list: the heads per group divide 64, BS 64, D + Dv <= 256; else the NVIDIA kernel, else linalg), dq on wgmma at
# 64 heads per group (wide_dq), the NVIDIA kernel up to 16: ((dq's family, template), (dk/dv's family, template)).
HOPPER_BACKWARD_CHOICE = [
    ("hopper_hpg64", HOPPER_ANCHORS.replace(kv_heads=1), ("hopper", "wide_dq"), ("hopper", None)),
    ("hopper_hpg64_g2", HOPPER_ANCHORS.replace(heads=128, kv_heads=2), ("hopper", "wide_dq"), ("hopper", None)),
    ("hopper_hpg32", HOPPER_ANCHORS.replace(kv_heads=2), ("linalg", None), ("hopper", None)),
    ("hopper_hpg16", HOPPER_ANCHORS, ("nvidia", None), ("hopper", None)),
    # fewer heads per group than a tile: dk/dv makes dq (kernels.SMALL; the dq stage's choice is not rendered)
    ("hopper_hpg8", HOPPER_ANCHORS.replace(heads=32), ("nvidia", None), ("hopper", "dkdv_dq")),
    ("hopper_hpg4_d64", HOPPER_ANCHORS.replace(heads=16, head_dim=64, value_dim=64), ("nvidia", None),
     ("hopper", "dkdv_dq")),
    ("hopper_hpg1", HOPPER_ANCHORS.replace(heads=4), ("nvidia", None), ("hopper", "dkdv_dq")),
    ("hopper_hpg4_bs32", HOPPER_ANCHORS.replace(heads=16, block_size=32, num_blocks=32), ("nvidia", None),
     ("nvidia", None)),
    ("hopper_hpg4_d192_dv64", HOPPER_ANCHORS.replace(heads=16, head_dim=192, value_dim=64), ("nvidia", None),
     ("hopper", None)),
    ("hopper_hpg4_window", HOPPER_WINDOW.replace(heads=16), ("hopper", "dense_dq"), ("hopper", "dense_dkdv")),
    ("hopper_hpg4_linalg", HOPPER_ANCHORS.replace(heads=16, kernels="linalg"), ("linalg", None), ("linalg", None)),
    ("hopper_hpg16_bs32", HOPPER_ANCHORS.replace(block_size=32, num_blocks=32), ("nvidia", None), ("nvidia", None)),
    ("hopper_hpg16_d192", HOPPER_ANCHORS.replace(head_dim=192), ("nvidia", None), ("nvidia", None)),
    ("hopper_hpg48_d64", HOPPER_ANCHORS.replace(heads=48, kv_heads=1, head_dim=64, value_dim=64), ("linalg", None),
     ("linalg", None)),
    ("hopper_hpg64_d192", HOPPER_ANCHORS.replace(kv_heads=1, head_dim=192), ("linalg", None), ("linalg", None)),
    ("hopper_hpg16_f16", HOPPER_ANCHORS.replace(dtype="f16"), ("nvidia", None), ("hopper", None)),
    ("hopper_hpg16_f32", HOPPER_ANCHORS.replace(dtype="f32"), ("linalg", None), ("linalg", None)),
    ("hopper_hpg16_window", HOPPER_WINDOW, ("hopper", "dense_dq"), ("hopper", "dense_dkdv")),
    ("hopper_hpg16_linalg", HOPPER_ANCHORS.replace(kernels="linalg"), ("linalg", None), ("linalg", None)),
]


@pytest.mark.parametrize("case,spec,dq,dkdv", HOPPER_BACKWARD_CHOICE, ids=[c[0] for c in HOPPER_BACKWARD_CHOICE])
def test_hopper_backward_choice(case, spec, dq, dkdv):
    recipe = load_recipe("hopper")
    chosen = [choose(stage, spec, recipe) for stage in ("dq", "dkdv")]
    assert [(c.family, c.template) for c in chosen] == [dq, dkdv]


@pytest.mark.parametrize("case,spec,dq,dkdv", HOPPER_BACKWARD_CHOICE, ids=[c[0] for c in HOPPER_BACKWARD_CHOICE])
def test_hopper_two_pass_functions(case, spec, dq, dkdv):
    """The two-pass module has dq's stage, or a backward in one call (dk/dv making dq, kernels.dq_with_dkdv; the
    window), never both."""
    recipe = load_recipe("hopper")
    text = render_module(spec, "two-pass", recipe)
    assert dq_with_dkdv(spec, recipe) == (dkdv == ("hopper", "dkdv_dq"))
    one_call = dense_backward(spec, recipe)
    assert one_call == (dkdv in (("hopper", "dkdv_dq"), ("hopper", "dense_dkdv")))
    assert ("func.func @selection_attention_backward(" in text) == one_call
    assert ("func.func @selection_attention_dq(" in text) == (not one_call)


def test_hopper_dkdv_chunks_hold_whole_pieces_rows():
    """A chunk of 64 rows takes 64 / HPG of a piece's rows: rows_per_piece must be a multiple of that (one head per
    group: 64), or the chunks would read past the piece's rows; the NVIDIA kernel takes such recipes."""
    import dataclasses

    recipe = dataclasses.replace(load_recipe("hopper"), rows_per_piece=32)
    assert choose("dkdv", HOPPER_ANCHORS.replace(heads=4), recipe).family == "nvidia"
    assert choose("dkdv", HOPPER_ANCHORS, recipe).family == "hopper"        # 4 positions a chunk


def test_a_stage_list_falls_back_on_its_last_family_limits():
    """Where no family of a stage's list serves spec, the linalg stage is chosen with the last family's limits."""
    chosen = choose("dkdv", HOPPER_ANCHORS.replace(heads=48, kv_heads=1, head_dim=64, value_dim=64),
                    load_recipe("hopper"))
    assert chosen.wanted == "nvidia" and any("heads per group" in why for why in chosen.crossed)


@pytest.mark.parametrize("case,spec,expected", HOPPER_FORWARD_CHOICE, ids=[c[0] for c in HOPPER_FORWARD_CHOICE])
def test_hopper_forward_choice(case, spec, expected):
    chosen = choose("forward", spec, load_recipe("hopper"))
    assert (chosen.family, chosen.template) == expected


@pytest.mark.parametrize("case,spec,expected", WIDE_CHOICE, ids=[c[0] for c in WIDE_CHOICE])
def test_wide_kernel_choice(case, spec, expected):
    """(the forward's template, dq's family, dk/dv's family): None is the stage's own template."""
    recipe = load_recipe(spec.target)
    forward = choose("forward", spec, recipe)
    assert (forward.template, choose("dq", spec, recipe).family, choose("dkdv", spec, recipe).family) == expected
    assert forward.family != "linalg" or expected[0] is None


# The wide forward's subgroups: (head tiles, key splits), four subgroups where the tiles and the block's 16-key
# steps allow.
WIDE_SUBGROUPS = [("hpg32_bs64", 64, 2, 64, (2, 2)), ("hpg64_bs64", 64, 1, 64, (4, 1)),
                  ("hpg48_bs32", 48, 1, 32, (3, 1)), ("hpg32_bs16", 32, 1, 16, (2, 1)),
                  ("hpg32_bs128", 32, 1, 128, (2, 2))]


@pytest.mark.parametrize("case,heads,kv_heads,block_size,expected", WIDE_SUBGROUPS, ids=[c[0] for c in WIDE_SUBGROUPS])
def test_wide_subgroups(case, heads, kv_heads, block_size, expected):
    from nsa_iree.kernels.gpu.nvidia import wide_subgroups

    assert wide_subgroups(ANCHORS_CUDA.replace(heads=heads, kv_heads=kv_heads, block_size=block_size)) == expected


def test_compressed_cuda_modules_take_the_dense_templates():
    """The dense forward and dq replace the selection ones; dk/dv stays the selection kernel over tile indices."""
    forward = {name for name, _ in module_templates(COMPRESSED_CUDA, "forward")}
    backward = {name for name, _ in module_templates(COMPRESSED_CUDA, "two-pass")}
    assert "gpu/nvidia/dense_forward.mlir" in forward and "gpu/nvidia/forward.mlir" not in forward
    assert {"gpu/nvidia/dense_dq.mlir", "gpu/nvidia/dkdv.mlir"} <= backward and "gpu/nvidia/dq.mlir" not in backward


def test_a_kernel_over_the_targets_workgroup_memory_falls_back(monkeypatch):
    spec = ANCHORS_CUDA.replace(head_dim=192, block_size=128)      # dq would need 164.25 KiB, sm_80 has 163 KiB
    recipe = load_recipe("cuda")                                   # (the forward's 160 KiB fit)
    assert [choose(s, spec, recipe).family for s in ("forward", "dq", "dkdv")] == ["nvidia", "linalg", "nvidia"]


def test_a_recipe_without_the_kernels_instructions_gets_the_linalg_stages():
    import dataclasses

    recipe = load_recipe("cuda")
    settings = {k: v for k, v in recipe.kernel_settings.items() if k != "vote_any"}
    recipe = dataclasses.replace(recipe, kernel_settings=settings)         # forward needs vote_any, dq dk/dv not
    assert [choose(s, ANCHORS_CUDA, recipe).family for s in ("forward", "dq", "dkdv")] == [
        "linalg", "nvidia", "nvidia"]


def test_rendered_cuda_modules_hold_the_kernels():
    backward = render_module(ANCHORS_CUDA, "two-pass")
    assert "@selection_attention_dq_kernel_exe" in backward and "@selection_attention_dkdv_kernel_exe" in backward
    forward = render_module(ANCHORS_CUDA, "forward")
    assert "@selection_attention_fwd_kernel_exe" in forward
    for text in (backward, forward):
        assert "iree_codegen.inner_tiled" in text and "${" not in text


CPU_MODULES = [("forward", "@selection_attention_fwd_cpu_exe"), ("two-pass", "@selection_attention_dq_cpu_exe"),
               ("two-pass", "@selection_attention_dkdv_cpu_exe"), ("one-pass", "@selection_attention_onepass_cpu_exe")]


@pytest.mark.parametrize("variant,executable", CPU_MODULES, ids=[e.strip("@") for _, e in CPU_MODULES])
def test_rendered_cpu_modules_hold_the_cpu_kernels(variant, executable):
    text = render_module(ANCHORS_CUDA.replace(target="cpu"), variant)
    assert executable in text and "@cpu_blocks_t" in text and "${" not in text
    assert "flow.dispatch.region" not in text.split("func.func @selection_attention_delta")[0]


def test_unknown_kernel_choice_is_refused(monkeypatch):
    import torch

    import nsa_iree

    with pytest.raises(ValueError, match="kernels must be one of"):
        ANCHORS_CUDA.replace(kernels="fast")
    monkeypatch.setenv("NSA_IREE_KERNELS", "fast")
    q, k, v = torch.randn(1, 8, 2, 8), torch.randn(1, 8, 1, 8), torch.randn(1, 8, 1, 8)
    with pytest.raises(ValueError, match="NSA_IREE_KERNELS must be one of"):
        nsa_iree.selection_attention(q, k, v, torch.zeros(1, 8, 1, 2, dtype=torch.int32), block_size=8)


def test_kernel_choice_reads_no_environment(monkeypatch):
    """The choice is the spec's (NSA_IREE_KERNELS is read where the spec is made, nsa_iree.api.describe):
    rendering under any environment gives the same module."""
    before = render_module(ANCHORS_CUDA, "two-pass")
    monkeypatch.setenv("NSA_IREE_KERNELS", "linalg")
    assert render_module(ANCHORS_CUDA, "two-pass") == before
    assert render_module(ANCHORS_CUDA.replace(kernels="linalg"), "two-pass") != before


# The portable kernels (nsa_iree/kernels/gpu/portable/) see the placement only through a unit's fragment shapes
# and affine maps: each map must say what the table says, for every lane. Every kind's unit, and gfx942's of two
# 16x16x16 MFMAs along K (pipelines/gfx942.toml: unit_k 32).
UNITS = [(name, 1) for name in sorted(LAYOUTS)] + [("MFMA_F32_16x16x16_BF16", 2), ("MFMA_F32_16x16x16_F16", 2)]
UNIT_IDS = [f"{name}_k{kind_k * LAYOUTS[name].mnk[2]}" for name, kind_k in UNITS]


@pytest.mark.parametrize("name,k_tiles", UNITS, ids=UNIT_IDS)
def test_unit_maps_are_the_table(name, k_tiles):
    unit = Unit(LAYOUTS[name], k_tiles)
    lanes = range(unit.kind.subgroup_size)
    for operand in ("lhs", "rhs"):
        major, k = unit.run_maps(operand)
        for lane in lanes:
            for j in range(unit.runs(operand)):
                assert (evaluate_map(major, lane, j), evaluate_map(k, lane, j)) == unit.run_origin(operand, lane, j)
                # A read is `run` consecutive elements along K of the unit's fragment.
                row, col = unit.position(operand, lane, j * unit.run)
                for e in range(unit.run):
                    expected = (row, col + e) if operand == "lhs" else (row + e, col)
                    assert unit.position(operand, lane, j * unit.run + e) == expected
    row, col = unit.acc_maps()
    for lane in lanes:
        for i in range(unit.size("acc")):
            assert (evaluate_map(row, lane, i), evaluate_map(col, lane, i)) == unit.position("acc", lane, i)


@pytest.mark.parametrize("name,k_tiles", UNITS, ids=UNIT_IDS)
def test_unit_fragments_cover_their_tiles(name, k_tiles):
    unit = Unit(LAYOUTS[name], k_tiles)
    shapes = {"lhs": (16, unit.k), "rhs": (unit.k, 16), "acc": (16, 16)}
    for operand, (rows, cols) in shapes.items():
        seen = sorted(unit.position(operand, lane, i)
                      for lane in range(unit.kind.subgroup_size) for i in range(unit.size(operand)))
        assert seen == [(r, c) for r in range(rows) for c in range(cols)], operand
        assert unit.size(operand) == __import__("math").prod(unit.shape(operand)), operand


UNIT_SHAPES = [("NV_MMA_SYNC_F32_16x8x16_BF16", 1, [1, 1, 4, 2], [1, 2, 2, 2], [1, 2, 2, 2]),
               ("MFMA_F32_16x16x32_BF16", 1, [1, 1, 8], [1, 1, 8], [1, 1, 4]),
               ("MFMA_F32_16x16x16_BF16", 2, [1, 2, 4], [2, 1, 4], [1, 1, 4])]


@pytest.mark.parametrize("name,k_tiles,lhs,rhs,acc", UNIT_SHAPES, ids=[f"{u[0]}_x{u[1]}" for u in UNIT_SHAPES])
def test_unit_fragment_shapes(name, k_tiles, lhs, rhs, acc):
    """The per-lane vectors inner_tiled takes for one unit (IREE's distributed shapes; the MFMA ones were
    probed: vector<1x1x8> operands and vector<1x1x4> accumulators compile for gfx950; vector<1x2x4> lhs and
    vector<2x1x4> rhs of 16x16x16 compile for gfx942 into two v_mfma_f32_16x16x16 per unit)."""
    unit = Unit(LAYOUTS[name], k_tiles)
    assert (unit.shape("lhs"), unit.shape("rhs"), unit.shape("acc")) == (lhs, rhs, acc)


@pytest.mark.parametrize("name", ["MFMA_F32_16x16x16_BF16", "MFMA_F32_16x16x16_F16"])
def test_k_tiles_pair_each_products_elements_at_one_stored_k(name):
    """With K tiles, the intrinsic of K tile kt multiplies lhs (row, k) by rhs (k, column) of its own fragments: both
    must sit at the same stored k of the unit (and each stored k be one tile's k), so that the unit's products are
    the sum over the stored K, whatever the interleaving."""
    unit, kind = Unit(LAYOUTS[name], 2), LAYOUTS[name]
    stored = {}
    for operand, along_k in (("lhs", 1), ("rhs", 0)):
        layout = getattr(kind, operand)
        for lane in range(kind.subgroup_size):
            for kt in range(unit.k_tiles):
                for i in range(layout.fragment_size):
                    k = element_position(layout, lane, i)[along_k]
                    stored.setdefault((kt, k), set()).add(unit.position(operand, lane, kt * layout.fragment_size + i)
                                                          [along_k])
    assert all(len(places) == 1 for places in stored.values())
    assert sorted(p for places in stored.values() for p in places) == list(range(unit.k))


def test_k_tiles_need_single_run_fragments():
    with pytest.raises(ValueError, match="K tiles"):
        Unit(LAYOUTS["NV_MMA_SYNC_F32_16x8x16_BF16"], 2)


# select_blocks sums each score over an accumulator column: the lanes holding column c are ACC_COL_LANE_MAP(c) +
# stride (0 .. count - 1) (xor shuffles over them), and the lane and element of ACC_COL_*_MAP(c) hold its row 0.
@pytest.mark.parametrize("name,k_tiles", UNITS, ids=UNIT_IDS)
def test_acc_column_origins_and_lanes(name, k_tiles):
    unit = Unit(LAYOUTS[name], k_tiles)
    lane_map, index_map = unit.acc_column_maps()
    count, stride = unit.column_lanes
    assert count & (count - 1) == 0
    for column in range(16):
        lane, index = unit.acc_column_origin(column)
        assert unit.position("acc", lane, index) == (0, column)
        assert (evaluate_map(lane_map, column), evaluate_map(index_map, column)) == (lane, index)
        holders = sorted({lane2 for lane2 in range(unit.kind.subgroup_size) for i in range(unit.size("acc"))
                          if unit.position("acc", lane2, i)[1] == column})
        assert holders == [lane + stride * r for r in range(count)]
    # a lane's elements of one column: the same column offset in every lane (the template folds them by lane 0's)
    for i in range(unit.size("acc")):
        offsets = {unit.position("acc", lane2, i)[1] - unit.position("acc", lane2, 0)[1]
                   for lane2 in range(unit.kind.subgroup_size)}
        assert len(offsets) == 1


# The one-pass's dk and dv (kernels/gpu/portable/onepass.mlir: column_units, key_contributions, add_keys): the unit's K
# holds K / 16 slices of the group's 16 heads; rhs unit x holds, in slice s, the heads of columns K x + 16 s .. of q
# transposed, the lhs of slice s the heads of p^T in slice s and zeros elsewhere, so lhs slice s times rhs unit x is
# p^T q's columns K x + 16 s ... Emulated from the templates' read maps, the products from the placement tables.
@pytest.mark.parametrize("name,k_tiles", UNITS, ids=UNIT_IDS)
def test_onepass_slices_share_rhs_units(name, k_tiles):
    import numpy as np

    unit = Unit(LAYOUTS[name], k_tiles)
    major_map, k_map = unit.run_maps("lhs")         # the template reads both operands with these (values())
    rng = np.random.default_rng(0)
    units = 2
    pt, q = rng.standard_normal((16, 16)), rng.standard_normal((16, units * unit.k))    # [key][head], [head][col]

    def read(lane, j):
        """(key or column, slice, first head) of read j of lane: k = run_k = 16 slice + head."""
        major, k = evaluate_map(major_map, lane, j), evaluate_map(k_map, lane, j)
        assert k % unit.run == 0 and 16 % unit.run == 0             # a read of `run` elements lies in one slice
        return major, k // 16, k % 16

    def operand(which, values):
        """The [16 x K] (lhs) or [K x 16] (rhs) matrix whose fragments hold values(lane, j) as read j."""
        matrix = np.full((16, unit.k) if which == "lhs" else (unit.k, 16), np.nan)
        for lane in range(unit.kind.subgroup_size):
            for j in range(unit.runs(which)):
                for e, value in enumerate(values(lane, j)):
                    matrix[unit.position(which, lane, j * unit.run + e)] = value
        assert not np.isnan(matrix).any()
        return matrix

    def lhs_read(s):
        def values(lane, j):
            key, slice_, head = read(lane, j)
            return pt[key, head:head + unit.run] if slice_ == s else np.zeros(unit.run)
        return values

    for x in range(units):
        def rhs_read(lane, j, x=x):
            col, slice_, head = read(lane, j)
            return q[head:head + unit.run, unit.k * x + 16 * slice_ + col]
        rhs = operand("rhs", rhs_read)
        for s in range(unit.k // 16):
            columns = unit.k * x + 16 * s
            np.testing.assert_allclose(operand("lhs", lhs_read(s)) @ rhs, pt @ q[:, columns:columns + 16])


ONEPASS_CHOICE = [
    ("gfx950_anchors", ANCHORS_CUDA.replace(target="gfx950"), "portable"),
    # D = 192: the dq tiles alone (p^T and ds^T written in the K and V rows'), 71.25 KB, within the 80 KB that keep 2
    # waves per SIMD.
    ("gfx950_paper_d192", ANCHORS_CUDA.replace(target="gfx950", head_dim=192), "portable"),
    ("cpu", ANCHORS_CUDA.replace(target="cpu", dtype="f32"), "cpu"),
    # HPG 64 at D 192: the row's tiles (q, do, S, dP, DS^T, dq) exceed 48 KiB of stack.
    ("cpu_tiles_over_the_stack", ANCHORS_CUDA.replace(target="cpu", heads=64, kv_heads=1, head_dim=192), "linalg"),
    # the window's mask is in the CPU and portable two-pass kernels only (the window's backward is the two-pass)
    ("cpu_window", ANCHORS_CUDA.replace(target="cpu", dtype="f32", num_blocks=9, window=512), "linalg"),
    ("gfx950_window", ANCHORS_CUDA.replace(target="gfx950", num_blocks=9, window=512), "linalg"),
]


@pytest.mark.parametrize("case,spec,expected", ONEPASS_CHOICE, ids=[c[0] for c in ONEPASS_CHOICE])
def test_onepass_kernel_choice(case, spec, expected):
    assert choose("onepass", spec, load_recipe(spec.target)).family == expected


# The NVIDIA kernels' K/V (and q/do) tiles: unpadded rows with 16-byte chunks XOR-swizzled by row.
SWIZZLE_ROWS = [16 * i for i in range(1, 17)]


@pytest.mark.parametrize("elements", SWIZZLE_ROWS, ids=[f"row{e}" for e in SWIZZLE_ROWS])
def test_swizzle_permutes_each_row_and_matches_the_templates_additive_form(elements):
    from nsa_iree.kernels.gpu import nvidia

    values = nvidia.values(ANCHORS_CUDA.replace(head_dim=elements), load_recipe("cuda"))
    mask, high, chunks = int(values["K_SWIZZLE_MASK"]), int(values["K_SWIZZLE_HIGH"]), elements // 8
    assert chunks % (mask + 1) == 0 and mask in (1, 3, 7)
    for row in range(64):
        swizzle = (row & mask) * 8
        assert sorted((c * 8) ^ swizzle for c in range(chunks)) == [c * 8 for c in range(chunks)]
        for col0 in range(0, elements, 16):                     # ldmatrix columns: 16 s + lo8 / hi8
            for lane in (0, 8):
                col_high = col0 & high
                assert col_high + ((col0 - col_high + lane) ^ swizzle) == (col0 + lane) ^ swizzle


@pytest.mark.parametrize("elements", [64, 128, 192, 256])
def test_swizzled_ldmatrix_reads_and_staging_copies_are_conflict_free(elements):
    from nsa_iree.fragments import swizzle_mask

    mask = swizzle_mask(elements)
    assert mask == 7
    def stored(row, chunk):
        return row * elements * 2 + ((chunk ^ (row & mask)) * 16)   # byte address
    for chunk in range(elements // 8):
        for base in range(0, 64, 8):                            # one 8x8 matrix: 8 aligned rows, one chunk
            groups = {(stored(base + r, chunk) // 16) % 8 for r in range(8)}
            assert len(groups) == 8                             # 8 distinct 16-byte bank groups
    # A staging copy: lanes run along rows, 8 lanes (8 chunks) fill one aligned 128-byte line.
    for row in range(64):
        for first in range(0, elements // 8, 8):
            lines = {stored(row, chunk) // 128 for chunk in range(first, first + 8)}
            offsets = sorted(stored(row, chunk) % 128 for chunk in range(first, first + 8))
            assert len(lines) == 1 and offsets == list(range(0, 128, 16))


# ptxas is asked for as many workgroups per SM as the recipe's register cap and the SM's workgroup memory allow.
OCCUPANCY = [
    ("anchors_forward", ANCHORS_CUDA, "forward", 3),
    ("anchors_dq", ANCHORS_CUDA, "dq", 3),
    ("anchors_dkdv_uncapped", ANCHORS_CUDA, "dkdv", 1),
    ("d192_forward_by_memory", ANCHORS_CUDA.replace(head_dim=192), "forward", 2),
    ("bs128_forward_by_registers", ANCHORS_CUDA.replace(block_size=128), "forward", 1),
    # D and Dv <= 64: register_cap_small_dims (128 registers), four workgroups
    ("d64_forward_small_dims_cap", ANCHORS_CUDA.replace(head_dim=64, value_dim=64), "forward", 4),
    ("d64_dq_small_dims_cap", ANCHORS_CUDA.replace(head_dim=64, value_dim=64), "dq", 4),
    ("d64_dv32_forward_small_dims_cap", ANCHORS_CUDA.replace(head_dim=64, value_dim=32), "forward", 4),
    ("d96_dv32_forward_register_cap", ANCHORS_CUDA.replace(head_dim=96, value_dim=32), "forward", 3),
]


@pytest.mark.parametrize("case,spec,stage,expected", OCCUPANCY, ids=[c[0] for c in OCCUPANCY])
def test_min_workgroups_per_sm(case, spec, stage, expected):
    from nsa_iree.kernels.gpu.nvidia import min_workgroups_per_sm

    assert min_workgroups_per_sm(stage, spec, load_recipe("cuda")) == expected


def test_rendered_forward_kernel_asks_ptxas_for_three_workgroups():
    assert "nvvm.minctasm = 3 : i32" in render_module(ANCHORS_CUDA, "forward")
