"""The Hopper kernel family (nsa_iree/kernels/gpu/hopper/): kernels on the warpgroup matrix multiply of sm_90a
(wgmma), for the `hopper` recipe (an H100 or H200: nsa_iree.api picks it for a GPU of compute capability 9.0);
which shapes they serve and the values their templates are rendered with. They share the NVIDIA family's macros and
values (gpu/nvidia/) and add their workgroup-memory map."""

from __future__ import annotations

from ....spec import KernelSpec
from ...family import Family
from .. import nvidia

STAGES = ("dense_forward", "dense_dq", "dense_dkdv", "wide_forward", "wide_dq", "dkdv", "dkdv_dq", "forward_pieces")
# the selection's dk/dv kernel (dkdv_tile.mlir over the block lists' pieces), alone or making dq's partials too
PIECE_STAGES = ("dkdv", "dkdv_dq")
# the kernels over the block lists' pieces: dk/dv's and the small groups' forward (forward_pieces.mlir), which
# serves up to PIECE_FORWARD_HEADS heads per group (the crossover measured on the H200: docs/performance.md)
OVER_PIECES = (*PIECE_STAGES, "forward_pieces")
PIECE_FORWARD_HEADS = 4
WARPGROUPS = 2               # warpgroups of a workgroup: each takes 64 rows (its m64 tile, 4 subgroups of 16)
ROWS = 64 * WARPGROUPS       # rows of a workgroup, against each key tile staged once
# the wide forward's (wide_forward.mlir: the part forward.mlir over block lists): one warpgroup, one position's heads
WIDE_HEADS = 64
WIDE_STAGES = ("wide_forward", "wide_dq")     # (dq's: the part dq_tile.mlir over block lists, as the forward's)
# dq's: one warpgroup a workgroup, two workgroups a multiprocessor (faster than one workgroup of two warpgroups
# sharing each key tile: docs/performance.md)
DQ_WARPGROUPS = 1
DQ_ROWS = 64 * DQ_WARPGROUPS
assert DQ_ROWS == WIDE_HEADS    # (wide_dq.mlir: a workgroup's rows are one position's heads)


# Workgroups a multiprocessor holds at once, by design (a warpgroup's softmax beside another's products): the
# dense forward's two of two warpgroups each, dq's and dk/dv's two of one, the wide forward's and the forward over the
# pieces' three of one (a shape whose workgroup memory holds fewer takes the NVIDIA kernel; the forward over the
# pieces asks ptxas for no more than three).
RESIDENT = {"dense_forward": 2, "dense_dq": 2, "dense_dkdv": 2, "wide_forward": 3, "wide_dq": 2, "dkdv": 2,
            "dkdv_dq": 2, "forward_pieces": 3}
# The fewest a stage is served with (RESIDENT unless named): the wide forward runs at two where three do not fit
# (BS 128 with Dv 64), and asks ptxas for no more than RESIDENT (six at D = 64 would leave 80 registers: spills).
REQUIRED = {"wide_forward": 2}
# V buffers of a forward (2 unless named): the wide forward's one (V staged once the previous tile's o += p v has
# read it), which with q, two K tiles and no p region of its own fits three workgroups on a multiprocessor.
V_BUFFERS = {"wide_forward": 1}
# Forwards whose p stays in registers as o += p v's A operand (wgmma's register A): no p tile, no stores of it and
# no barrier before it would go over K; the wide forward's.
P_REGISTERS = ("wide_forward",)


def forward_rows(stage: str) -> int:
    """Rows of a forward workgroup: the dense forward's two warpgroups, the wide forward's one (a position's heads)."""
    return WIDE_HEADS if stage == "wide_forward" else ROWS


def tile_bytes(rows: int, width: int) -> int:
    """Bytes of a [rows, width] tile of 16-bit elements (gpu/hopper/wgmma.mlir's swizzled layout)."""
    return rows * width * 2


def p_in_k(spec: KernelSpec, rows: int = ROWS) -> bool:
    """Whether p [rows, BS] is written over the K tile it was computed from (free once s = q k^T is read): where it
    fits, which keeps two workgroups on a multiprocessor at D = 128."""
    return tile_bytes(rows, spec.block_size) <= tile_bytes(spec.block_size, spec.head_dim)


def ds_in_v(spec: KernelSpec) -> bool:
    """Whether dq's ds [DQ_ROWS, BS] is written over the V tile dp was computed from (free once dp is made)."""
    return tile_bytes(DQ_ROWS, spec.block_size) <= tile_bytes(spec.block_size, spec.value_dim)


def workgroup_memory(stage: str, spec: KernelSpec, rows_per_piece: int = 0) -> dict[str, int]:
    """Byte offsets of a stage's workgroup memory (16-bit elements in wgmma.mlir's layout); "end" is its size.
    dense_forward: q [ROWS, D], two K tiles [BS, D], two V tiles [BS, Dv], and p [ROWS, BS] unless it goes over a
    K tile (p_in_k). dense_dq: q [DQ_ROWS, D], do [DQ_ROWS, Dv] ("do"), two K tiles, two V tiles, and ds
    [DQ_ROWS, BS] unless it goes over the V tile it was computed from (ds_in_v); wide_dq: dense_dq's (DQ_ROWS =
    WIDE_HEADS: one position's heads).
    dense_dkdv: K [64, D], V [64, Dv], two q chunks [64, D], two do chunks [64, Dv], p^T (then ds^T) [64, 64], and
    two chunks' lse and delta ("stats", f32 [2][2][64]). dkdv and dkdv_dq: dense_dkdv's, then the piece's rows
    ("rows", i32 [rows_per_piece][4]) and their count (16 bytes). wide_forward: dense_forward's with 64 rows,
    V_BUFFERS V tiles and no p (P_REGISTERS). forward_pieces: K [64, D], V [64, Dv], two q chunks [64, D], the piece's
    rows and their count."""
    d, dv, bs = spec.head_dim, spec.value_dim, spec.block_size
    if stage == "forward_pieces":
        v = tile_bytes(64, d)
        q = v + tile_bytes(64, dv)
        rows = q + 2 * tile_bytes(64, d)
        return {"v": v, "q": q, "rows": rows, "end": rows + rows_per_piece * 16 + 16}
    if stage in ("dense_dkdv", *PIECE_STAGES):
        v = tile_bytes(64, d)
        q = v + tile_bytes(64, dv)
        do = q + 2 * tile_bytes(64, d)
        pt = do + 2 * tile_bytes(64, dv)
        stats = pt + tile_bytes(64, 64)
        tiles = {"v": v, "q": q, "do": do, "pt": pt, "stats": stats, "end": stats + 2 * 2 * 64 * 4}
        if stage in PIECE_STAGES:
            tiles.update(rows=tiles["end"], end=tiles["end"] + rows_per_piece * 16 + 16)
        return tiles
    if stage in ("dense_dq", "wide_dq"):
        do = tile_bytes(DQ_ROWS, d)
        k = do + tile_bytes(DQ_ROWS, dv)
        v = k + 2 * tile_bytes(bs, d)
        ds = v + 2 * tile_bytes(bs, dv)
        return {"do": do, "k": k, "v": v, "ds": ds, "end": ds + (0 if ds_in_v(spec) else tile_bytes(DQ_ROWS, bs))}
    rows = forward_rows(stage)
    k = tile_bytes(rows, d)
    v = k + 2 * tile_bytes(bs, d)
    p = v + V_BUFFERS.get(stage, 2) * tile_bytes(bs, dv)
    return {"k": k, "v": v, "p": p,
            "end": p + (0 if stage in P_REGISTERS or p_in_k(spec, rows) else tile_bytes(rows, bs))}


def limits(stage: str, spec: KernelSpec, recipe) -> list[str]:
    """Why the Hopper kernel of `stage` cannot serve spec on recipe's target (empty: it can)."""
    if stage not in STAGES:
        return [f"no Hopper kernel for stage {stage!r}"]
    # (the NVIDIA family's limits of the same stage: dtype, instructions, head dims; the window's dk/dv takes its
    # dense dq's, the wide dq the wide forward's (a multiple of 16 heads, block lists; its vote_any instruction too,
    # which hopper.toml names), the selection's dk/dv the NVIDIA dk/dv's but its 16 heads per group)
    like = {"dense_dkdv": "dense_dq", "wide_dq": "wide_forward", "dkdv_dq": "dkdv", "forward_pieces": "dkdv"}.get(
        stage, stage)
    why = [w for w in nvidia.limits(like, spec, recipe)
           if "workgroup memory" not in w and not (stage in OVER_PIECES and "heads per group" in w)]
    if stage in WIDE_STAGES and spec.heads_per_group != WIDE_HEADS:
        why.append(f"takes {WIDE_HEADS} heads per group (a position's heads, one warpgroup's m64 tile)")
    if stage in WIDE_STAGES and max(spec.head_dim, spec.value_dim, spec.block_size) > 128:
        why.append("D, Dv or BS above 128 (the layouts run on an H200: bench.hopper_checks check_wide)")
    if stage in ("dense_dkdv", *OVER_PIECES) and spec.block_size != 64:
        why.append("BS is not 64 (a warpgroup's m64 tile of keys)")
    if stage in ("dense_dkdv", *PIECE_STAGES) and spec.head_dim + spec.value_dim > 256:
        why.append("D + Dv above 256 (dk and dv accumulate in a lane's registers)")
    if stage == "dkdv_dq" and spec.head_dim > 128:
        why.append("D above 128 (dq's partial takes D / 2 more registers a lane beside dk and dv: spills; the "
                   "layouts run on an H200: bench.hopper_checks check_two_pass)")
    if stage == "forward_pieces" and spec.heads_per_group > PIECE_FORWARD_HEADS:
        why.append(f"above {PIECE_FORWARD_HEADS} heads per group (each row's partials cost more than the "
                   f"position-major forward's padded tile saves: docs/performance.md)")
    if stage == "forward_pieces" and max(spec.head_dim, spec.value_dim) > 128:
        why.append("D or Dv above 128 (o's partial takes Dv / 2 registers a lane beside s and p; the layouts run on "
                   "an H200: bench.hopper_checks check_pieces)")
    if stage in OVER_PIECES:
        if 64 % spec.heads_per_group:
            why.append("the heads per group do not divide 64 (a chunk of 64 rows holds whole positions)")
        elif recipe.rows_per_piece % (64 // spec.heads_per_group):
            why.append(f"rows_per_piece {recipe.rows_per_piece} is not a multiple of the {64 // spec.heads_per_group} "
                       f"positions of a chunk")
        if spec.window or spec.key_stride > 1:
            why.append("serves the selection (block lists); the window's and the compressed attention's dk/dv are "
                       "dense forms")
    elif not spec.window and stage not in WIDE_STAGES:
        # (its KEY_STRIDE text renders, but only the window's has run on an H200: docs/performance.md)
        why.append("serves the sliding window; the compressed attention's stages are the NVIDIA kernels'")
    if spec.head_dim % 64 or spec.value_dim % 64 or spec.value_dim > 256:
        why.append("D not a multiple of 64, or Dv not a multiple of 64 up to 256 (the layout's 128-byte lines; "
                   "wgmma's n)")
    if spec.block_size % 64 or spec.block_size > 256:
        why.append("BS not a multiple of 64 up to 256 (the layout's 128-byte lines; wgmma's n)")
    sm_memory = int(recipe.kernel_settings.get("sm_workgroup_memory", 0))
    required = REQUIRED.get(stage, RESIDENT[stage])
    if sm_memory and _per_multiprocessor(stage, spec, recipe) < required:
        why.append(f"needs {_allocation(stage, spec, recipe) + nvidia.WORKGROUP_RESERVED} bytes of workgroup memory: "
                   f"fewer than {required} workgroups per multiprocessor")
    return why


def _allocation(stage: str, spec: KernelSpec, recipe) -> int:
    """The bytes a stage's workgroup allocates: its tiles and 1024 to align them (the swizzle's period)."""
    return workgroup_memory(stage, spec, recipe.rows_per_piece)["end"] + 1024


def _per_multiprocessor(stage: str, spec: KernelSpec, recipe) -> int:
    """How many of the stage's workgroups a multiprocessor's workgroup memory holds (at least 1)."""
    sm_memory = int(recipe.kernel_settings.get("sm_workgroup_memory", 0))
    return max(1, sm_memory // (_allocation(stage, spec, recipe) + nvidia.WORKGROUP_RESERVED))


def values(spec: KernelSpec, recipe) -> dict[str, str]:
    """The NVIDIA family's values and the Hopper kernels' own."""
    from ... import choose, dense_backward      # (kernels/__init__.py imports this family)

    out = nvidia.values(spec, recipe)
    # the forward's values: the wide forward's where spec's forward is it, the dense forward's otherwise
    forward = "wide_forward" if choose("forward", spec, recipe).template == "wide_forward" else "dense_forward"
    rows = forward_rows(forward)
    offsets = workgroup_memory(forward, spec)
    out.update({
        "HOPPER_SMEM_BYTES": _allocation(forward, spec, recipe), "HOPPER_K_OFFSET": offsets["k"],
        "HOPPER_V_OFFSET": offsets["v"],
        "HOPPER_P_OFFSET": offsets["p"], "HOPPER_P_IN_K": int(p_in_k(spec, rows)),
        "HOPPER_V_BUFFERS": V_BUFFERS.get(forward, 2), "HOPPER_P_REGISTERS": int(forward in P_REGISTERS),
        "HOPPER_ROWS": rows, "HOPPER_LANES": 128 * rows // 64,      # a warpgroup per 64 rows
        "HOPPER_S_VALUES": 64 * spec.block_size // 128, "HOPPER_O_VALUES": 64 * spec.value_dim // 128,
        "HOPPER_K_TILE_BYTES": tile_bytes(spec.block_size, spec.head_dim),
        "HOPPER_V_TILE_BYTES": tile_bytes(spec.block_size, spec.value_dim),
        "HOPPER_MIN_WORKGROUPS_PER_SM": (min(_per_multiprocessor(forward, spec, recipe), RESIDENT[forward])
                                         if forward in REQUIRED else _per_multiprocessor(forward, spec, recipe)),
    })
    # dk/dv's: the selection's (a piece's rows besides the tiles) where spec's dk/dv stage is it, else the window's
    dkdv_choice = choose("dkdv", spec, recipe)
    dkdv_form = (dkdv_choice.template or "dkdv") if dkdv_choice.family == "hopper" else "dense_dkdv"
    dkdv = workgroup_memory(dkdv_form, spec, recipe.rows_per_piece)
    out.update({
        "HOPPER_DKDV_SMEM_BYTES": _allocation(dkdv_form, spec, recipe), "HOPPER_DKDV_V_OFFSET": dkdv["v"],
        "HOPPER_DKDV_ROWS_OFFSET": dkdv.get("rows", 0),
        "HOPPER_DKDV_Q_OFFSET": dkdv["q"], "HOPPER_DKDV_DO_OFFSET": dkdv["do"], "HOPPER_DKDV_PT_OFFSET": dkdv["pt"],
        "HOPPER_DKDV_STATS_OFFSET": dkdv["stats"],
        "HOPPER_DKDV_MIN_WORKGROUPS_PER_SM": _per_multiprocessor(dkdv_form, spec, recipe),
    })
    pieces = workgroup_memory("forward_pieces", spec, recipe.rows_per_piece)
    out.update({
        "HOPPER_FWP_SMEM_BYTES": _allocation("forward_pieces", spec, recipe), "HOPPER_FWP_V_OFFSET": pieces["v"],
        "HOPPER_FWP_Q_OFFSET": pieces["q"], "HOPPER_FWP_ROWS_OFFSET": pieces["rows"],
        "HOPPER_FWP_MIN_WORKGROUPS_PER_SM": min(_per_multiprocessor("forward_pieces", spec, recipe),
                                                RESIDENT["forward_pieces"]),
    })
    dq = workgroup_memory("dense_dq", spec)
    out.update({
        "HOPPER_DQ_SMEM_BYTES": _allocation("dense_dq", spec, recipe), "HOPPER_DQ_DO_OFFSET": dq["do"],
        "HOPPER_DQ_K_OFFSET": dq["k"],
        "HOPPER_DQ_V_OFFSET": dq["v"], "HOPPER_DQ_DS_OFFSET": dq["ds"], "HOPPER_DQ_DS_IN_V": int(ds_in_v(spec)),
        "HOPPER_DQ_VALUES": 64 * spec.head_dim // 128, "HOPPER_DQ_ROWS": DQ_ROWS,
        "HOPPER_DQ_LANES": 128 * DQ_WARPGROUPS,
        "HOPPER_DQ_MIN_WORKGROUPS_PER_SM": _per_multiprocessor("dense_dq", spec, recipe),
        # dq makes delta where the backward is one call (dk/dv on dense_dkdv too: kernels.COVERS)
        "HOPPER_DQ_MAKES_DELTA": int(dense_backward(spec, recipe)),
    })
    return {key: str(value) for key, value in out.items()}


FAMILY = Family("hopper", "gpu/hopper", stages=STAGES, limits=limits, values=values, device="executable_target")
