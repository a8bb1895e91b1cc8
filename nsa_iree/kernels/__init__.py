"""The kernel layer: MLIR templates (package data), one folder per kernel family, and the one place that picks
the family rendering a stage (:func:`choose`).

    common/         the helper stages every family uses (delta, the block lists and their inversion, the
                    piece sums), the layer's gating (gates), the mean pooling (pooling) and the macros shared by
                    all (host functions, dispatch openings)
    linalg/         the fused-region stages IREE tiles itself: every shape, every target (the oracle the
                    hand-written kernels are checked against, and the fallback)
    cpu/            hand-written vectorised CPU kernels
    gpu/            what the GPU families share (the skeleton of a stage: its bindings, ids, slot loop)
    gpu/nvidia/     mma.sync kernels with ldmatrix, cp.async and PTX instructions (NVIDIA only)
    gpu/portable/   one text for MFMA and mma.sync (the AMD targets' kernels)
    gpu/hopper/     kernels on sm_90a's warpgroup MMA (wgmma), beside the NVIDIA ones on the hopper target

A family is a :class:`~nsa_iree.kernels.family.Family`: its folder, the stages it has, the shapes it serves
(``limits``) and its templates' values (``values``).
"""

from __future__ import annotations

import dataclasses

from ..fragments import HEAD_ROWS
from .cpu import FAMILY as CPU
from .family import Family
from .gpu.hopper import FAMILY as HOPPER
from .gpu.nvidia import FAMILY as NVIDIA
from .gpu.portable import FAMILY as PORTABLE

# The helper stages: one template each, in common/, whichever family renders the kernels around them.
COMMON = Family("common", "common", stages=("kv_blocks", "selected_slots", "delta", "inversion", "piece_sums",
                                           "gates", "pooling"))
# The fused-region (linalg) stages; the one-pass has no linalg form, its fallback is one scalar dispatch with the
# recipe's [onepass] pieces (linalg/onepass.mlir).
LINALG = Family("linalg", "linalg", stages=("forward", "dq", "dkdv", "onepass"))

# The families a recipe's [kernels] table may name for a stage.
FAMILIES = {family.name: family for family in (LINALG, CPU, NVIDIA, PORTABLE, HOPPER)}


@dataclasses.dataclass(frozen=True)
class Choice:
    """The kernel family that renders a stage, and why not the recipe's hand-written one where it is linalg."""

    family: str                      # "nvidia", "portable", "hopper", "cpu" or "linalg"
    wanted: str | None               # the recipe's [kernels] entry for the stage (None: linalg by design; for a
                                     # list, the family chosen, or the last one where none serves)
    crossed: tuple[str, ...] = ()    # the limits of `wanted` that spec crosses (empty unless it fell back)
    template: str | None = None      # the family's template that renders it, if not the stage's own (DENSE)


# Stages with a dense form: a kernel for the problems whose rows see a range of keys rather than a selection, the
# compressed attention (KernelSpec.key_stride > 1: every key up to the row's position) and the sliding window
# (KernelSpec.window: a band), where the recipe names a family for the dense stage and it serves spec; the stage's
# own kernel otherwise. On NVIDIA the forward and dq as dense attention (query tiles against key tiles, no block
# lists); on Hopper dk/dv as well (dense_dkdv: key tiles against the rows that see them); on the CPU the dk/dv
# stage's dense form is the whole backward (dense_backward: dq written beside dk and dv, from one making of each
# row's scores over its tiles; COVERS). A stage may have several dense forms: the first the recipe names a family
# for that serves spec.
DENSE = {"forward": ("dense_forward",), "dq": ("dense_dq",), "dkdv": ("dense_backward", "dense_dkdv")}

# The dk/dv forms whose template renders the whole backward as one function, selection_attention_backward (one
# call of the runtime: nsa_iree.api.backward_into), and the stages that a module rendering one does not render:
# those whose results it computes itself (the CPU's dense_backward: delta and dq; Hopper's dense_dkdv: delta,
# made by its dq kernel, whose dispatch it makes) and those it needs no more (the block lists' inversion and their
# pieces' sums: both take the keys in tiles).
# The dk/dv form that makes dq too (SMALL: dkdv_dq) covers the dq stage; its backward is one function that calls
# delta and the inversion (and a second one, selection_attention_backward_lists, taking the lists the forward over
# the pieces wrote).
COVERS = {"dense_backward": ("delta", "dq", "inversion"), "dense_dkdv": ("delta", "inversion", "piece_sums"),
          "dkdv_dq": ("dq",)}


# Stages with a form for wide groups: more query heads per kv head than the hand-written kernels' 16-row tiles,
# where the recipe names a family for the wide stage and it serves spec (each selected block staged once for all the
# position's heads: NVIDIA's a subgroup per 16 heads, Hopper's one warpgroup's m64 tile for 64); elsewhere
# group_split runs such groups as several smaller ones.
WIDE = {"forward": ("wide_forward",), "dq": ("wide_dq",)}

# Stages with a form for small groups: fewer query heads per kv head than the 16-row tiles, where the recipe names a
# family for the small form and it serves spec. The position-major dq reads each selected block once per position
# and kv head, whatever its heads; dkdv_dq makes dq from dk/dv's products (ds k per piece of the block lists'
# inversion, summed per row in slot order), so each block is read once per piece of its rows (COVERS: no dq stage).
# The forward likewise: forward_pieces inverts the block lists itself and writes each row's partials (its max, sum
# and unnormalised o per slot) per piece, combined per row in slot order.
SMALL = {"forward": ("forward_pieces",), "dkdv": ("dkdv_dq",)}


def choose(stage: str, spec, recipe) -> Choice:
    """The one place that picks the kernel of a stage: the recipe's dense kernel for a stage with a dense form
    (DENSE: compressed attention, the sliding window) where it serves spec (the first that does, where the recipe
    names a list), the recipe's wide kernel for a stage with a wide form (WIDE: more heads per group than a tile) and
    its small kernel for a stage with a small form (SMALL: fewer) where it serves spec, else the recipe's
    hand-written family where it serves spec (a recipe may name a list for a stage too: the first that serves spec,
    else the linalg stage with the last one's limits as `crossed`), the linalg stage otherwise, and everywhere when
    spec.kernels is "linalg". A stage with no linalg template (select_blocks) gets the recipe's family or raises
    NotImplementedError naming the target.
    Reads nothing but its arguments (the environment's NSA_IREE_KERNELS is read where a spec is made,
    nsa_iree.api.describe)."""
    # the stage's other forms, in order: dense (compressed attention, the window), wide (more heads than a tile),
    # small (fewer)
    for forms, applies in ((DENSE, spec.key_stride > 1 or spec.window), (WIDE, spec.heads_per_group > HEAD_ROWS),
                           (SMALL, spec.heads_per_group < HEAD_ROWS)):
        for form in forms.get(stage, ()) if applies and spec.kernels != "linalg" else ():
            family = _first_serving(recipe.kernel_settings.get(form), form, spec, recipe)
            if family is not None:
                return Choice(family, family, template=form)
    wanted = recipe.kernel_settings.get(stage)
    if isinstance(wanted, list):     # several families for the stage: the first that serves, else the last's limits
        wanted = _first_serving(wanted, stage, spec, recipe) or (wanted[-1] if wanted else None)
    if stage not in LINALG.stages and stage not in COMMON.stages:
        # A stage without a linalg form (select_blocks): the recipe's family or nothing, whatever spec.kernels.
        if wanted not in FAMILIES or wanted == "linalg":
            raise NotImplementedError(f"{stage} has no kernel for target {spec.target!r}: its recipe's [kernels] "
                                      f"table names none")
        crossed = tuple(FAMILIES[wanted].limits(stage, spec, recipe))
        if crossed:
            raise NotImplementedError(f"{stage} has no kernel for {spec.name}: the {wanted} kernel "
                                      f"{'; '.join(crossed)}")
        return Choice(wanted, wanted)
    if wanted not in FAMILIES or wanted == "linalg" or spec.kernels == "linalg":
        return Choice("linalg", None)
    crossed = tuple(FAMILIES[wanted].limits(stage, spec, recipe))
    return Choice("linalg", wanted, crossed) if crossed else Choice(wanted, wanted)


def _first_serving(named, stage: str, spec, recipe) -> str | None:
    """The first of the families a recipe names for `stage` (one name, or a list in order) whose limits spec keeps
    within; None if none does."""
    for family in [named] if isinstance(named, str) else named or []:
        if family in FAMILIES and not FAMILIES[family].limits(stage, spec, recipe):
            return family
    return None


def group_split(stages: tuple[str, ...], spec, recipe) -> int:
    """How many groups of query heads to run each kv head's as: 1, or the least s (a power of two dividing the heads
    per group) such that spec with s times the kv heads, each reading its kv head's keys and values, runs every one
    of `stages` on its hand-written kernel where spec itself falls back to the linalg stage for one of them (more
    heads per group than the GPU kernels' tiles hold). nsa_iree.api runs the split: K, V and the block lists repeated
    per group, dk and dv summed over a kv head's groups in float32 and rounded once. Each selected block is then read
    once per group of heads, not once."""
    def falls_back(groups: int) -> bool:
        split = spec.replace(kv_heads=groups)
        return any(choose(stage, split, recipe).crossed for stage in stages)
    if not falls_back(spec.kv_heads):
        return 1
    s = 2
    while spec.heads_per_group % s == 0:
        if not falls_back(spec.kv_heads * s):
            return s
        s *= 2
    return 1


# The attention stages of a variant that a group split can bring onto their hand-written kernels.
SPLIT_STAGES = {"forward": ("forward",), "two-pass": ("dq", "dkdv"), "one-pass": ("onepass",)}


def loaded_spec(spec, variant: str, recipe):
    """(the spec whose module of `variant` runs a problem of `spec`, the group split it takes): spec and 1 (always
    for the variants without attention stages: select, gates, pooling), or, where group_split names s > 1, spec
    with s times the kv heads (and for a backward, dk and dv as the groups' float32 sums before the rounding:
    dkdv_dtype "f32"). What nsa_iree.api loads and `nsa-iree compile` builds (compiler.compile_loaded)."""
    split = group_split(SPLIT_STAGES[variant], spec, recipe) if variant in SPLIT_STAGES else 1
    if split == 1:
        return spec, 1
    run = spec.replace(kv_heads=spec.kv_heads * split)
    if variant != "forward" and spec.dtype != "f32":
        run = run.replace(dkdv_dtype="f32")
    return run, split


def covered(stages: tuple[str, ...], spec, recipe) -> frozenset[str]:
    """The stages of `stages` whose results another's chosen form computes (COVERS): not rendered."""
    return frozenset(other for stage in stages if stage not in COMMON.stages
                     for other in COVERS.get(choose(stage, spec, recipe).template, ()))


def dense_backward(spec, recipe) -> bool:
    """Whether the two-pass backward of spec is one call (choose()'s form of its dk/dv stage is in COVERS):
    selection_attention_backward(q, k, v, block_indices, lse, o, do, scale) -> dq, dk, dv, delta made inside."""
    return choose("dkdv", spec, recipe).template in COVERS


def forward_over_pieces(spec, recipe) -> bool:
    """Whether spec's forward runs over the block lists' pieces, from f32 partials per (row, slot) (SMALL's
    forward_pieces)."""
    return choose("forward", spec, recipe).template == "forward_pieces"


def dq_with_dkdv(spec, recipe) -> bool:
    """Whether spec's dk/dv stage makes dq too, from f32 partials per (row, slot) (SMALL's dkdv_dq; its backward is
    one call: dense_backward)."""
    return choose("dkdv", spec, recipe).template == "dkdv_dq"


def template_for(stage: str, spec, recipe) -> tuple[str, Family]:
    """The template rendering `stage` for spec (a path under nsa_iree/kernels/) and its family: common/'s for the
    helper stages, else choose()'s."""
    if stage in COMMON.stages:
        return COMMON.template(stage), COMMON
    choice = choose(stage, spec, recipe)
    family = FAMILIES[choice.family]
    return family.template(choice.template or stage), family
