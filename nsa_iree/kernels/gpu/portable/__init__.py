"""The portable kernel family (nsa_iree/kernels/gpu/portable/): one text for MFMA and mma.sync, every operand
staged with its reduction dimension contiguous; which shapes it serves and the values its templates are
rendered with (the fragment placement as affine maps: nsa_iree.fragments.Unit)."""

from __future__ import annotations

from ....fragments import HEAD_ROWS, KEYS_PER_SUBGROUP, LAYOUTS, PAD, UNIT, Unit, mma_kind_name
from ....spec import KernelSpec
from ...family import Family
from .. import combine_values

STAGES = ("forward", "dq", "dkdv", "onepass", "select_blocks")

# select_blocks.mlir: query rows per workgroup (one subgroup each), which share every staged tile of compressed keys,
# and the compressed keys of a tile (whole 16-column units).
SELECT_SUBGROUPS = 4
SELECT_TILE_KEYS = 64
SELECT_MAX_SLOTS = 32      # the kept list: entry l in lane l (mma.sync's subgroups have 32 lanes)


def _unit(spec: KernelSpec, recipe) -> Unit | None:
    """The recipe's unit: its `mma_kind` (None: no fragment table for it), `unit_k` // the intrinsic's K of them
    side by side along K (default one: gfx942 takes two 16x16x16 MFMAs, so that a fragment is one 16-byte read)."""
    kind = LAYOUTS.get(mma_kind_name(recipe.kernel_settings.get("mma_kind", ""), spec))
    if kind is None:
        return None
    return Unit(kind, int(recipe.kernel_settings.get("unit_k", kind.mnk[2])) // kind.mnk[2])


def limits(stage: str, spec: KernelSpec, recipe) -> list[str]:
    """Why the portable kernel of `stage` cannot serve spec on recipe's target (empty: it can)."""
    if stage not in STAGES:
        return [f"no portable kernel for stage {stage!r}"]
    if stage == "select_blocks":
        return _select_limits(spec, recipe)
    # The forward, dq and dk/dv take the window's band (common/rules.mlir: first_key, key_in_range); the one-pass
    # does not (the window's backward is the two-pass one), as on the CPU.
    window = spec.window and stage == "onepass"
    why = ["onepass.mlir has no sliding-window mask (the linalg stages take it)"] if window else []
    unit = _unit_limits(spec, recipe, why)
    if unit is None:
        return why
    k = unit.k
    if spec.heads_per_group > HEAD_ROWS:
        why.append(f"more than {HEAD_ROWS} heads per group")
    if spec.head_dim % k or spec.value_dim % k:
        why.append(f"D or Dv not a multiple of the intrinsic's K ({k})")
    # dq and the forward reduce over a block's keys K at a time; dk/dv over K // 16 piece rows at a time.
    keys = max(KEYS_PER_SUBGROUP, k) if stage in ("dq", "forward", "onepass") else KEYS_PER_SUBGROUP
    if spec.block_size % keys or spec.block_size > 8 * KEYS_PER_SUBGROUP:
        why.append(f"BS not a multiple of {keys} up to {8 * KEYS_PER_SUBGROUP}")
    if stage == "dkdv" and recipe.rows_per_piece % (k // UNIT):
        why.append(f"rows_per_piece not a multiple of {k // UNIT}")
    if stage == "onepass":
        # q and do transposed are staged once, in the bytes the K and V tiles take later.
        staged = (spec.head_dim + spec.value_dim) * (HEAD_ROWS + PAD) * 2
        if staged > _dq_memory(spec)["DQP_DS_OFFSET"]:
            why.append("q and do transposed do not fit the K and V tiles")
    need = {"dq": lambda: _dq_memory(spec)["DQP_SMEM_BYTES"],
            "dkdv": lambda: _dkdv_memory(spec, k, recipe.rows_per_piece)["DKP_SMEM_BYTES"],
            "forward": lambda: _forward_memory(spec, k)["FWP_SMEM_BYTES"],
            "onepass": lambda: _onepass_memory(spec)["OPP_SMEM_BYTES"]}[stage]()
    return why + _memory_limits(need, recipe)


def _unit_limits(spec: KernelSpec, recipe, why: list[str]):
    """What every portable kernel needs, added to `why`: 16-bit inputs and a fragment table for the recipe's
    mma_kind. Returns the unit, None when there is no table."""
    if spec.dtype not in ("bf16", "f16"):
        why.append("dtype is not bf16 or f16")
    unit = _unit(spec, recipe)
    if unit is None:
        why.append("no fragment table for the recipe's mma_kind")
    return unit


def _memory_limits(need: int, recipe) -> list[str]:
    """Why `need` bytes of workgroup memory do not fit the recipe's target (empty: they do)."""
    limit = int(recipe.kernel_settings.get("max_workgroup_memory", 0))
    return [f"needs {need} bytes of workgroup memory, the target has {limit}"] if limit and need > limit else []


def _select_limits(spec: KernelSpec, recipe) -> list[str]:
    """Why select_blocks.mlir cannot serve spec (T its output slots, D the compressed keys' dim)."""
    why = ["select_blocks.mlir has no sliding-window mask"] if spec.window else []
    unit = _unit_limits(spec, recipe, why)
    if unit is None:
        return why
    if spec.heads_per_group > HEAD_ROWS:
        why.append(f"select_blocks.mlir takes up to {HEAD_ROWS} heads per group (a query row's heads are one unit's "
                   f"rows)")
    slots = min(SELECT_MAX_SLOTS, unit.kind.subgroup_size)
    if spec.num_blocks > slots:
        why.append(f"more than {slots} output slots (one per lane)")
    if spec.head_dim % unit.k:
        why.append(f"D not a multiple of the unit's K ({unit.k})")
    return why + _memory_limits(_select_memory(spec), recipe)


def _select_memory(spec: KernelSpec) -> int:
    """Bytes of select_blocks.mlir's one tile: SELECT_TILE_KEYS compressed keys, rows padded by PAD (16-bit)."""
    return SELECT_TILE_KEYS * (spec.head_dim + PAD) * 2


def _tile_offsets(prefix: str, tiles: list[tuple[str, int]]) -> dict[str, int]:
    """``{prefix}_{NAME}_OFFSET`` of each (NAME, bytes) tile laid out in order, and ``{prefix}_SMEM_BYTES``."""
    out, offset = {}, 0
    for name, size in tiles:
        out[f"{prefix}_{name}_OFFSET"] = offset
        offset += size
    out[f"{prefix}_SMEM_BYTES"] = offset
    return out


def _dq_memory(spec: KernelSpec) -> dict[str, int]:
    """Byte offsets of the portable dq kernel's tiles (16-bit elements, rows padded by PAD): K rows, V rows,
    K transposed, ds."""
    d, dv, bs = spec.head_dim, spec.value_dim, spec.block_size
    return _tile_offsets("DQP", [("K", bs * (d + PAD) * 2), ("V", bs * (dv + PAD) * 2), ("KT", d * (bs + PAD) * 2),
                                 ("DS", HEAD_ROWS * (bs + PAD) * 2)])


def _dkdv_memory(spec: KernelSpec, unit_k: int, rows_per_piece: int) -> dict[str, int]:
    """Byte offsets of the portable dk/dv kernel's tiles, in order: one step's q and do both ways, p^T and
    ds^T of every key, the step's (lse, delta) pairs, and four words per piece row."""
    d, dv, bs, pairs = spec.head_dim, spec.value_dim, spec.block_size, unit_k
    return _tile_offsets("DKP", [
        ("Q", pairs * (d + PAD) * 2), ("QT", d * (pairs + PAD) * 2), ("DO", pairs * (dv + PAD) * 2),
        ("DOT", dv * (pairs + PAD) * 2), ("PT", bs * (pairs + PAD) * 2), ("DST", bs * (pairs + PAD) * 2),
        ("STATS", pairs * 2 * 4), ("ROW_INFO", rows_per_piece * 16)])


def _forward_memory(spec: KernelSpec, unit_k: int) -> dict[str, int]:
    """Byte offsets of the portable forward kernel's tiles, in order: V transposed, each subgroup's p, and
    each subgroup's o, max and sum (f32)."""
    dv, bs = spec.value_dim, spec.block_size
    subgroups = bs // unit_k
    return _tile_offsets("FWP", [
        ("V_COLS", dv * (bs + PAD) * 2), ("P", subgroups * HEAD_ROWS * (unit_k + PAD) * 2),
        ("O_PARTS", subgroups * HEAD_ROWS * dv * 4), ("MAX", subgroups * HEAD_ROWS * 4),
        ("SUM", subgroups * HEAD_ROWS * 4)])


def _onepass_memory(spec: KernelSpec) -> dict[str, int]:
    """Byte offsets of the portable one-pass kernel's tiles: the dq kernel's and no more. p^T and ds^T of a block
    ([BS keys][16 heads]) are written in the K rows' and V rows' tiles (rows of D + PAD and Dv + PAD elements, key j
    in row j): a subgroup writes and reads only the rows of its own 16 keys, which nothing reads between its
    s = q k^T and dp = do v^T and the next block's staging (after a barrier). q and do transposed ([D][16 heads],
    [Dv][16 heads], rows padded by PAD) live at the start until their fragments are loaded."""
    dq = _dq_memory(spec)
    q_cols = spec.head_dim * (HEAD_ROWS + PAD) * 2      # fits before DQP_DS_OFFSET with do's (limits)
    return {"OPP_PT_OFFSET": dq["DQP_K_OFFSET"], "OPP_DST_OFFSET": dq["DQP_V_OFFSET"],
            "OPP_QT_OFFSET": 0, "OPP_DOT_OFFSET": q_cols, "OPP_SMEM_BYTES": dq["DQP_SMEM_BYTES"]}


def values(spec: KernelSpec, recipe) -> dict[str, str]:
    """Substitutions of the portable kernels beyond the common ones."""
    unit = _unit(spec, recipe)
    if unit is None:
        return {}
    kind = unit.kind
    major, k = unit.run_maps("lhs")
    # One pair of maps serves both operands' reads (the template uses it for both).
    assert all(unit.run_origin("lhs", lane, j) == unit.run_origin("rhs", lane, j)
               for lane in range(kind.subgroup_size) for j in range(unit.runs("lhs"))), kind.name
    acc_row, acc_col = unit.acc_maps()
    subgroups = spec.block_size // KEYS_PER_SUBGROUP
    lanes = subgroups * kind.subgroup_size
    d, dv, bs = spec.head_dim, spec.value_dim, spec.block_size
    shape = lambda operand: "x".join(map(str, unit.shape(operand)))  # noqa: E731
    values = {
        "MMA_KIND": kind.name, "SUBGROUP_SIZE": kind.subgroup_size, "SUBGROUPS": subgroups, "LANES": lanes,
        "UNIT_K": unit.k, "LHS_UNIT": shape("lhs"), "RHS_UNIT": shape("rhs"), "ACC_UNIT": shape("acc"),
        "RUN": unit.run, "RUNS": unit.runs("lhs"), "ACC_N": unit.size("acc"),
        "RUN_MAJOR_MAP": major, "RUN_K_MAP": k, "ACC_ROW_MAP": acc_row, "ACC_COL_MAP": acc_col,
        "D_UNITS": d // unit.k, "DV_UNITS": dv // unit.k, "KEY_UNITS": bs // unit.k,
        "D_TILES16": d // UNIT, "DQ_UNITS_PER_SUBGROUP": -(-(d // UNIT) // subgroups),
        "K_ITEMS": bs * d // 8, "V_ITEMS": bs * dv // 8,
        "K_ITEMS_PER_LANE": -(-(bs * d // 8) // lanes), "V_ITEMS_PER_LANE": -(-(bs * dv // 8) // lanes),
        "PAD": PAD, "D_PADDED": d + PAD, "DV_PADDED": dv + PAD, "BS_PADDED": bs + PAD, "T_PLUS_1": spec.num_blocks + 1,
        **_dq_memory(spec),
        # dk/dv: a step is K // 16 piece rows, so that its (row, head) pairs are one reduction of K.
        "ROWS_PER_STEP": unit.k // UNIT, "ROW_HEADS": unit.k, "ROW_HEADS_PADDED": unit.k + PAD,
        "ROW_STEPS": recipe.rows_per_piece // (unit.k // UNIT),
        "ROW_STEPS_PLUS_1": recipe.rows_per_piece // (unit.k // UNIT) + 1,
        "DV_TILES16": dv // UNIT, "Q_STEP_ITEMS": unit.k * d // 8, "DO_STEP_ITEMS": unit.k * dv // 8,
        "Q_STEP_ITEMS_PER_LANE": -(-(unit.k * d // 8) // lanes),
        "DO_STEP_ITEMS_PER_LANE": -(-(unit.k * dv // 8) // lanes),
        **_dkdv_memory(spec, unit.k, recipe.rows_per_piece),
        # The forward: a subgroup owns K keys of a block (its p v is whole units); the lanes holding one row
        # of an accumulator differ in the lane bits of the column placement (xor shuffles over them).
        "FWD_SUBGROUPS": bs // unit.k, "FWD_LANES": bs // unit.k * kind.subgroup_size,
        **combine_values(spec),
        "KEY_TILES": unit.k // UNIT, "UNIT_K_PADDED": unit.k + PAD,
        "ROW_SHUFFLES": kind.acc.thread[1].bit_length() - 1, "ROW_SHUFFLE_STRIDE": kind.acc.tstrides[1],
        "FWD_V_ITEMS_PER_LANE": -(-(bs * dv // 8) // (bs // unit.k * kind.subgroup_size)),
        **_forward_memory(spec, unit.k),
        # The one-pass: the dq kernel's values, the [d][head] tiles of 16 heads, and the slices of 16 heads in the
        # intrinsic's K (one rhs unit of q or do serves that many column tiles).
        "OPP_SLICES": unit.k // HEAD_ROWS, "OPP_HEADS_PADDED": HEAD_ROWS + PAD,
        "OPP_HEADS_PADDED_CHUNKS": (HEAD_ROWS + PAD) // 8,
        "OPP_Q_COLS_CHUNKS": d * (HEAD_ROWS + PAD) // 8, "OPP_DO_COLS_CHUNKS": dv * (HEAD_ROWS + PAD) // 8,
        "OPP_Q_ITEMS": HEAD_ROWS * d // 8, "OPP_DO_ITEMS": HEAD_ROWS * dv // 8,
        **_onepass_memory(spec),
    }
    # select_blocks: SELECT_SUBGROUPS rows per workgroup, a tile of SELECT_TILE_KEYS compressed keys staged as rows
    # [key][d] in 16-byte chunks (chunk c: key c / (D / 8), elements 8 (c mod (D / 8)) ..); a score is summed over
    # the lanes holding its column (COL_SHUFFLES xor distances from COL_SHUFFLE_STRIDE), a kept entry's rank over
    # all LANE_SHUFFLES of the subgroup's lanes; candidate c of a unit comes from lane ACC_COL_LANE_MAP(c), element
    # ACC_COL_INDEX_MAP(c).
    select_lanes = SELECT_SUBGROUPS * kind.subgroup_size
    column_lanes, column_stride = unit.column_lanes
    col_lane, col_index = unit.acc_column_maps()
    values.update({
        "SELECT_SUBGROUPS": SELECT_SUBGROUPS, "SELECT_LANES": select_lanes, "SELECT_TILE_KEYS": SELECT_TILE_KEYS,
        "SELECT_KEY_STEPS": SELECT_TILE_KEYS // UNIT, "D_CHUNKS": d // 8,
        "SELECT_K_ITEMS": SELECT_TILE_KEYS * d // 8,
        "SELECT_K_ITEMS_PER_LANE": -(-(SELECT_TILE_KEYS * d // 8) // select_lanes),
        "SELECT_SMEM_BYTES": _select_memory(spec),
        "COL_SHUFFLES": column_lanes.bit_length() - 1, "COL_SHUFFLE_STRIDE": column_stride,
        "LANE_SHUFFLES": kind.subgroup_size.bit_length() - 1,
        "ACC_COL_LANE_MAP": col_lane, "ACC_COL_INDEX_MAP": col_index,
    })
    return {key: str(value) for key, value in values.items()}


FAMILY = Family("portable", "gpu/portable", stages=STAGES, limits=limits, values=values)
