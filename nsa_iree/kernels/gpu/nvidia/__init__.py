"""The NVIDIA kernel family (nsa_iree/kernels/gpu/nvidia/): mma.sync kernels with ldmatrix, cp.async and PTX
instructions from the recipe; which shapes it serves and the values its templates are rendered with."""

from __future__ import annotations

from ....fragments import HEAD_ROWS, KEYS_PER_SUBGROUP, LAYOUTS, PAD, mma_kind_name, swizzle_mask
from ....spec import KernelSpec
from ...family import Family
from .. import combine_values

REGISTERS_PER_SM = 65536    # 32-bit registers of one NVIDIA multiprocessor (sm_80, sm_90)
WORKGROUP_RESERVED = 1024   # workgroup memory the driver reserves per workgroup (sm_80, sm_90)


# The PTX instructions each NVIDIA kernel takes from its recipe's [kernels] table (values: EX2,
# PACK_PAIR, VOTE_ANY).
INSTRUCTIONS = {"forward": ("ex2", "pack_pair", "vote_any"), "dq": ("ex2", "pack_pair"),
                "dkdv": ("ex2", "pack_pair"), "dense_forward": ("ex2", "pack_pair", "vote_any"),
                "wide_forward": ("ex2", "pack_pair", "vote_any"),
                "dense_dq": ("ex2", "pack_pair"), "select_blocks": ("ex2",)}
# The kernels whose subgroups each take 16 rows (the dense forward and dq: any group's rows; select_blocks: one
# query row's 16 heads), DENSE_SUBGROUPS to a workgroup.
DENSE_STAGES = ("dense_forward", "dense_dq", "select_blocks")
# The kernels of wide groups (more heads per group than one 16-row tile: kernels.WIDE), one subgroup per 16 heads,
# up to WIDE_MAX_TILES subgroups (the layouts checked on the H200; more heads go as groups of them: group_split).
WIDE_STAGES = ("wide_forward",)
WIDE_MAX_TILES = 4
STAGES = tuple(INSTRUCTIONS)


def dense_subgroups(recipe) -> int:
    """Subgroups of the dense forward (16 rows each): the recipe's `[kernels] dense_subgroups`, default 4."""
    return int(recipe.kernel_settings.get("dense_subgroups", 4))


def wide_subgroups(spec: KernelSpec) -> tuple[int, int]:
    """(head tiles, key splits) of the wide forward's subgroups: a tile per 16 heads, and the keys of a block split
    (in 16-key steps) over as many subgroups as keep four busy where the tiles are fewer."""
    tiles = max(spec.heads_per_group // HEAD_ROWS, 1)
    splits = 1
    while tiles * splits * 2 <= 4 and (spec.block_size // KEYS_PER_SUBGROUP) % (splits * 2) == 0:
        splits *= 2
    return tiles, splits


def lanes(stage: str, spec: KernelSpec, subgroup_size: int, recipe) -> int:
    """Lanes of one workgroup of `stage`'s kernel: the selection kernels' one subgroup per 16 keys of a block;
    the dense forward's one per 16 rows; the wide forward's one per (16 heads, key split)."""
    if stage in DENSE_STAGES:
        return dense_subgroups(recipe) * subgroup_size
    if stage in WIDE_STAGES:
        tiles, splits = wide_subgroups(spec)
        return tiles * splits * subgroup_size
    return (spec.block_size // KEYS_PER_SUBGROUP) * subgroup_size


def limits(stage: str, spec: KernelSpec, recipe) -> list[str]:
    """Why the NVIDIA kernel of `stage` cannot serve spec on recipe's target (empty: it can)."""
    if stage not in STAGES:
        return [f"no NVIDIA kernel for stage {stage!r}"]
    why = []
    if spec.window and stage == "select_blocks":
        why.append("select_blocks.mlir has no sliding-window mask")
    if stage in ("dense_forward", "dense_dq") and spec.key_stride == 1 and not spec.window:
        why.append(f"{stage}.mlir serves the compressed attention (key_stride > 1) and the sliding window only")
    if stage == "select_blocks":
        if spec.heads_per_group != HEAD_ROWS:
            why.append(f"select_blocks.mlir takes {HEAD_ROWS} heads per group (one row's heads per subgroup)")
        if spec.num_blocks > 32:
            why.append("more than 32 output slots (one per lane)")
    kind = recipe.kernel_settings.get("mma_kind", "")
    if spec.dtype not in ("bf16", "f16"):
        why.append("dtype is not bf16 or f16")
    layout = LAYOUTS.get(mma_kind_name(kind, spec))
    if layout is None:
        why.append(f"no fragment table for {kind!r}")
    elif layout.mnk != (16, 8, 16):
        # The template's fragment loads and its ds re-tiling are written for this placement; other
        # intrinsics take the portable kernels (recipe value "portable", portable_limits).
        why.append(f"{stage}_kernel.mlir is written for 16x8x16 fragments, not {layout.name}")
    missing = [key for key in INSTRUCTIONS[stage] if key not in recipe.kernel_settings]
    if missing:
        why.append(f"the recipe names no {', '.join(missing)} instruction")
    if spec.heads_per_group > HEAD_ROWS and stage in ("forward", "dq", "dkdv"):   # (the others' rows are not heads)
        why.append(f"more than {HEAD_ROWS} heads per group")
    if stage in WIDE_STAGES:
        if spec.heads_per_group <= HEAD_ROWS or spec.heads_per_group % HEAD_ROWS:
            why.append(f"{stage}.mlir takes a multiple of {HEAD_ROWS} heads per group above {HEAD_ROWS}")
        elif spec.heads_per_group // HEAD_ROWS > WIDE_MAX_TILES:
            why.append(f"more than {WIDE_MAX_TILES * HEAD_ROWS} heads per group (a subgroup per {HEAD_ROWS})")
        if spec.key_stride > 1 or spec.window:
            why.append(f"{stage}.mlir serves the selection (block lists), not dense attention")
    if spec.head_dim % 16 or spec.value_dim % 16:
        why.append("D or Dv not a multiple of 16")
    if spec.block_size % KEYS_PER_SUBGROUP or spec.block_size // KEYS_PER_SUBGROUP > 8:
        why.append(f"BS not a multiple of {KEYS_PER_SUBGROUP} up to {8 * KEYS_PER_SUBGROUP}")
    limit = int(recipe.kernel_settings.get("max_workgroup_memory", 0))
    need = workgroup_memory(stage, spec, recipe)
    if limit and need > limit:
        why.append(f"needs {need} bytes of workgroup memory, the target has {limit}")
    return why


def parts_bytes(parts: int, rows: int, dv: int) -> dict[str, int]:
    """Offsets of a forward's combine inputs after its loop (gpu/forward_combine.mlir): o [parts, rows, Dv] f32,
    then max and sum [parts, rows] f32; "end" is their size."""
    return {"max": parts * rows * dv * 4, "sum": parts * rows * (dv + 1) * 4, "end": parts * rows * (dv + 2) * 4}


def workgroup_memory(stage: str, spec: KernelSpec, recipe) -> int:
    """Bytes of workgroup memory the kernel of `stage` allocates for spec (16-bit elements)."""
    d, dv, bs = spec.head_dim + PAD, spec.value_dim + PAD, spec.block_size
    if stage in DENSE_STAGES:        # the K/V pipeline (select_blocks: K alone); dq: each subgroup's do tile besides
        stages = int(recipe.kernel_settings.get("dq_stages", 2))
        kv_bytes = stages * bs * (spec.head_dim + (spec.value_dim if stage != "select_blocks" else 0)) * 2
        return kv_bytes + (dense_subgroups(recipe) * HEAD_ROWS * dv * 2 if stage == "dense_dq" else 0)
    if stage in WIDE_STAGES:         # the forward's K/V pipeline, then (key splits) the splits' partial o and stats
        kv_bytes = int(recipe.kernel_settings.get("dq_stages", 2)) * bs * (spec.head_dim + spec.value_dim) * 2
        splits = wide_subgroups(spec)[1]
        parts = parts_bytes(splits, spec.heads_per_group, spec.value_dim)["end"]
        return kv_bytes if splits == 1 else max(kv_bytes, parts)
    if stage in ("dq", "forward"):
        stages = int(recipe.kernel_settings.get("dq_stages", 2))
        kv_bytes = stages * bs * (spec.head_dim + spec.value_dim) * 2      # swizzled, unpadded rows
        if stage == "forward":
            subgroups = bs // KEYS_PER_SUBGROUP
            return max(kv_bytes, parts_bytes(subgroups, HEAD_ROWS, spec.value_dim)["end"])
        return kv_bytes + HEAD_ROWS * dv * 2
    stages = int(recipe.kernel_settings.get("dkdv_stages", 2))
    rows = stages * HEAD_ROWS * (spec.head_dim + spec.value_dim) * 2            # swizzled q and do rows
    return bs * (d + dv) * 2 + rows + 2 * stages * HEAD_ROWS * 4 + 16 * recipe.rows_per_piece


# D and Dv up to which a recipe's `register_cap_small_dims` replaces its `register_cap` (the kernels' fragments of
# q, k, v and o scale with them: fewer registers hold a workgroup).
SMALL_DIM = 64


def min_workgroups_per_sm(stage: str, spec: KernelSpec, recipe) -> int:
    """Workgroups of the NVIDIA kernel of `stage` that ptxas is asked to fit on one multiprocessor
    (`nvvm.minctasm`, PTX .minnctapersm): as many as the recipe's register cap for the stage allows
    (`[kernels] register_cap`; `register_cap_small_dims` where D and Dv <= SMALL_DIM), but no more than the
    multiprocessor's workgroup memory holds (`sm_workgroup_memory`, WORKGROUP_RESERVED of it per workgroup); 1 (no
    constraint) without a cap."""
    caps = recipe.kernel_settings.get("register_cap", {})
    if max(spec.head_dim, spec.value_dim) <= SMALL_DIM:
        caps = {**caps, **recipe.kernel_settings.get("register_cap_small_dims", {})}
    cap = int(caps.get(stage, 0))
    sm_memory = int(recipe.kernel_settings.get("sm_workgroup_memory", 0))
    if not cap or not sm_memory:
        return 1
    kind = LAYOUTS[mma_kind_name(recipe.kernel_settings["mma_kind"], spec)]
    by_registers = REGISTERS_PER_SM // (lanes(stage, spec, kind.subgroup_size, recipe) * cap)
    by_memory = sm_memory // (workgroup_memory(stage, spec, recipe) + WORKGROUP_RESERVED)
    return max(1, min(by_registers, by_memory))


def values(spec: KernelSpec, recipe) -> dict[str, str]:
    """Substitutions of the hand-written kernels beyond the common ones (render.template_values)."""
    kind = LAYOUTS.get(mma_kind_name(recipe.kernel_settings.get("mma_kind", ""), spec))
    if kind is None:
        return {}
    subgroups = spec.block_size // KEYS_PER_SUBGROUP
    # Workgroup-memory buffers of the asynchronous copies: the copies of step t + STAGES - 1 are in flight
    # while step t computes.
    dq_stages = int(recipe.kernel_settings.get("dq_stages", 2))
    dkdv_stages = int(recipe.kernel_settings.get("dkdv_stages", 2))
    d, dv, bs = spec.head_dim, spec.value_dim, spec.block_size
    dq_k_bytes = dq_stages * bs * d * 2          # 16-bit elements, swizzled rows (swizzle_mask)
    dq_v_bytes = dq_stages * bs * dv * 2
    values = {
        "MMA_KIND": kind.name, "SUBGROUP_SIZE": kind.subgroup_size, "SUBGROUPS": subgroups,
        "LANES": subgroups * kind.subgroup_size,
        "D_PADDED": d + PAD, "DV_PADDED": dv + PAD,
        "K_SWIZZLE_MASK": swizzle_mask(d), "V_SWIZZLE_MASK": swizzle_mask(dv),
        # -(elements of a swizzle group): column & HIGH is the group's first column
        "K_SWIZZLE_HIGH": -8 * (swizzle_mask(d) + 1), "V_SWIZZLE_HIGH": -8 * (swizzle_mask(dv) + 1),
        "DQ_STAGES": dq_stages, "DQ_STAGES_MINUS_1": dq_stages - 1, "T_PLUS_DQ_LAG": spec.num_blocks + dq_stages - 1,
        "DKDV_STAGES": dkdv_stages, "DKDV_STAGES_MINUS_1": dkdv_stages - 1,
        "ROWS_PER_PIECE_PLUS_DKDV_LAG": recipe.rows_per_piece + dkdv_stages - 1,
        "DQ_K_BYTES": dq_k_bytes, "DQ_KV_BYTES": dq_k_bytes + dq_v_bytes,
        "DQ_SMEM_BYTES": workgroup_memory("dq", spec, recipe),       # (the size the kernel choice checks)
        # The forward kernel: after its loop the K/V bytes hold each subgroup's o [16, Dv], max and sum.
        "FWD_O_PARTS_BYTES": parts_bytes(subgroups, HEAD_ROWS, dv)["max"],
        "FWD_O_PARTS_STATS_BYTES": parts_bytes(subgroups, HEAD_ROWS, dv)["sum"],
        "FWD_SMEM_BYTES": workgroup_memory("forward", spec, recipe),
        **combine_values(spec),
        # Cache hint of the 16-byte asynchronous copies ("bypassL1": cp.async.cg, L2 only; "": cp.async.ca).
        "ASYNC_COPY_HINT": recipe.kernel_settings.get("async_copy_hint", ""),
        "G_D": spec.kv_heads * d, "G_DV": spec.kv_heads * dv,   # row strides of k and v
        "D_CHUNKS": d // 8, "DV_CHUNKS": dv // 8, "K_STAGE_ITEMS": bs * (d // 8), "V_STAGE_ITEMS": bs * (dv // 8),
        "D_STEPS": d // kind.mnk[2], "DV_STEPS": dv // kind.mnk[2], "D_TILES": d // kind.mnk[1],
        "DV_TILES": dv // kind.mnk[1], "DQ_ITEMS": spec.heads_per_group * d,
        "Q_STAGE_ITEMS": HEAD_ROWS * (d // 8), "DO_STAGE_ITEMS": HEAD_ROWS * (dv // 8),
    }
    if "ex2" in recipe.kernel_settings:
        # 2^x on the hardware's approximation unit, the recipe's instruction (IREE 3.13 lowers math.exp to a
        # polynomial of about 14 FMAs: most of the NVIDIA kernels' per-block instructions were exps).
        values["EX2"] = f'llvm.inline_asm "{recipe.kernel_settings["ex2"]} $0, $1;", "=f,f"'
    if "pack_pair" in recipe.kernel_settings:
        # Two f32 to a packed pair of the input type in one instruction, $0 = {high: $1, low: $2} (IREE 3.13
        # expands arith.truncf to bf16 into 7 integer instructions per element).
        pack = recipe.kernel_settings["pack_pair"].format(dtype=spec.dtype)
        values["PACK_PAIR"] = f'llvm.inline_asm "{pack} $0, $1, $2;", "=r,f,f"'
    if "vote_any" in recipe.kernel_settings:
        # 1 where any lane of the subgroup passes a nonzero i32, else 0 (the same in every lane).
        vote = recipe.kernel_settings["vote_any"]
        values["VOTE_ANY"] = ('llvm.inline_asm has_side_effects "{ .reg .pred p; setp.ne.b32 p, $1, 0; '
                              f'{vote} p, p, 0xffffffff; selp.b32 $0, 1, 0, p; }}", "=r,r"')
    # The forward kernel's online softmax moves its running max only when a block's max passes it by more
    # than this (base-2 units): p stays <= 2^RESCALE_SLACK, and o is rescaled about once per row instead of
    # once per block.
    values["RESCALE_SLACK"] = "8.0"
    for stage in STAGES:
        values[f"{stage.upper()}_MIN_WORKGROUPS_PER_SM"] = min_workgroups_per_sm(stage, spec, recipe)
    values["K_STAGE_PER_LANE"] = -(-values["K_STAGE_ITEMS"] // values["LANES"])
    values["V_STAGE_PER_LANE"] = -(-values["V_STAGE_ITEMS"] // values["LANES"])
    # The dense forward (dense_forward.mlir): DENSE_SUBGROUPS subgroups of 16 rows, a staged tile taken 16 keys
    # at a time.
    dense_lanes = lanes("dense_forward", spec, kind.subgroup_size, recipe)
    values.update({
        "DENSE_LANES": dense_lanes, "DENSE_SUBGROUPS": dense_subgroups(recipe),
        "DENSE_ROWS": HEAD_ROWS * dense_subgroups(recipe),
        "DENSE_DQ_SMEM_BYTES": workgroup_memory("dense_dq", spec, recipe),
        "SELECT_SMEM_BYTES": workgroup_memory("select_blocks", spec, recipe),
        "DENSE_SUBTILES": bs // KEYS_PER_SUBGROUP, "DENSE_SMEM_BYTES": workgroup_memory("dense_forward", spec, recipe),
        "DENSE_K_STAGE_PER_LANE": -(-values["K_STAGE_ITEMS"] // dense_lanes),
        "DENSE_V_STAGE_PER_LANE": -(-values["V_STAGE_ITEMS"] // dense_lanes),
    })
    # The wide groups' forward (wide_forward.mlir): a subgroup per (16 heads, key split).
    wide_lanes = lanes("wide_forward", spec, kind.subgroup_size, recipe)
    wide_tiles, wide_splits = wide_subgroups(spec)
    values.update({
        "WIDE_LANES": wide_lanes, "WIDE_SMEM_BYTES": workgroup_memory("wide_forward", spec, recipe),
        "WIDE_TILES": wide_tiles, "WIDE_SPLITS": wide_splits,
        "WIDE_O_PARTS_BYTES": parts_bytes(wide_splits, spec.heads_per_group, dv)["max"],
        "WIDE_O_PARTS_STATS_BYTES": parts_bytes(wide_splits, spec.heads_per_group, dv)["sum"],
        "WIDE_K_STAGE_PER_LANE": -(-values["K_STAGE_ITEMS"] // wide_lanes),
        "WIDE_V_STAGE_PER_LANE": -(-values["V_STAGE_ITEMS"] // wide_lanes),
    })
    return {key: str(value) for key, value in values.items()}




FAMILY = Family("nvidia", "gpu/nvidia", stages=STAGES, limits=limits, values=values)
