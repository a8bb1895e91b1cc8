"""Matrix-unit fragments of the hand-written kernels, and the values their templates are rendered with.

A hand-written kernel (``nsa_iree/mlir/*_kernel.mlir``) does its products with ``iree_codegen.inner_tiled``
on per-lane fragments and loads those fragments itself, so it must know which element of each operand tile
every lane holds. That placement is IREE's, per intrinsic: :data:`LAYOUTS` writes it down for the intrinsics
the kernels use, in IREE's own terms (per tile dimension: ``outer`` repeats, ``thread`` lanes with lane
strides ``tstrides``, ``element`` contiguous values per lane), and ``tests/test_fragments.py`` pins each
entry against ``iree_gpu.get_single_subgroup_layout`` of the installed compiler. :func:`element_position`
says where element ``i`` of lane ``lane``'s fragment sits in the tile; the templates' comments spell the
same placement out for the shapes they use.
"""

from __future__ import annotations

import dataclasses
import itertools

from .spec import KernelSpec


@dataclasses.dataclass(frozen=True)
class OperandLayout:
    """IREE's single-subgroup layout of one operand tile (2-d: rows, columns)."""

    outer: tuple[int, int]
    thread: tuple[int, int]
    tstrides: tuple[int, int]
    element: tuple[int, int]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(o * t * e for o, t, e in zip(self.outer, self.thread, self.element))

    @property
    def fragment_size(self) -> int:
        return self.outer[0] * self.outer[1] * self.element[0] * self.element[1]


@dataclasses.dataclass(frozen=True)
class MMAKind:
    """An intrinsic's tile shape (M, N, K), its lanes, and the layouts of lhs (M x K), rhs (K x N), acc (M x N)."""

    name: str
    mnk: tuple[int, int, int]
    subgroup_size: int
    lhs: OperandLayout
    rhs: OperandLayout
    acc: OperandLayout


_NV = dict(mnk=(16, 8, 16), subgroup_size=32,
           lhs=OperandLayout(outer=(2, 2), thread=(8, 4), tstrides=(4, 1), element=(1, 2)),
           rhs=OperandLayout(outer=(2, 1), thread=(4, 8), tstrides=(1, 4), element=(2, 1)),
           acc=OperandLayout(outer=(2, 1), thread=(8, 4), tstrides=(4, 1), element=(1, 2)))
_MFMA_16x16x32 = dict(mnk=(16, 16, 32), subgroup_size=64,
                      lhs=OperandLayout(outer=(1, 1), thread=(16, 4), tstrides=(1, 16), element=(1, 8)),
                      rhs=OperandLayout(outer=(1, 1), thread=(4, 16), tstrides=(16, 1), element=(8, 1)),
                      acc=OperandLayout(outer=(1, 1), thread=(4, 16), tstrides=(16, 1), element=(4, 1)))

LAYOUTS: dict[str, MMAKind] = {
    name: MMAKind(name=name, **table)
    for name, table in (("NV_MMA_SYNC_F32_16x8x16_BF16", _NV), ("NV_MMA_SYNC_F32_16x8x16_F16", _NV),
                        ("MFMA_F32_16x16x32_BF16", _MFMA_16x16x32), ("MFMA_F32_16x16x32_F16", _MFMA_16x16x32))
}


def element_position(layout: OperandLayout, lane: int, index: int) -> tuple[int, int]:
    """(row, column) in the operand tile of element ``index`` of lane ``lane``'s flat fragment.

    The fragment is IREE's distributed vector: the outer repeats, then the per-lane elements, each in
    row-major order (``[outer_row, outer_col, element_row, element_col]`` flattened).
    """
    o_rows, o_cols = layout.outer
    e_rows, e_cols = layout.element
    outer_row, outer_col, element_row, element_col = _unflatten(index, (o_rows, o_cols, e_rows, e_cols))
    position = []
    for dim, (o, e) in enumerate(((outer_row, element_row), (outer_col, element_col))):
        t = (lane // layout.tstrides[dim]) % layout.thread[dim]
        position.append(o * layout.thread[dim] * layout.element[dim] + t * layout.element[dim] + e)
    return position[0], position[1]


def _unflatten(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(index % size)
        index //= size
    return tuple(reversed(out))


def covers_tile(layout: OperandLayout, subgroup_size: int) -> bool:
    """Every element of the tile is held by exactly one (lane, index): the table describes a placement."""
    seen = [element_position(layout, lane, i)
            for lane, i in itertools.product(range(subgroup_size), range(layout.fragment_size))]
    rows, cols = layout.shape
    return sorted(seen) == [(r, c) for r in range(rows) for c in range(cols)]


# ---------------------------------------------------------------------------------------------------------
# The NVIDIA kernels (nsa_iree/mlir/forward_kernel.mlir, dq_kernel.mlir, dkdv_kernel.mlir)

KEYS_PER_SUBGROUP = 16   # each subgroup owns 16 keys of every block (two 8-key column tiles of s)
HEAD_ROWS = 16           # one 16-row lhs tile holds the heads of a group (padded when HPG < 16)
PAD = 8                  # elements added to a padded workgroup-memory row: 8 consecutive rows start on different
                         # banks (the portable kernels' tiles, dq's do tile, dk/dv's K/V tiles; the NVIDIA
                         # kernels' staged K/V and q/do rows are swizzled instead: swizzle_mask)
REGISTERS_PER_SM = 65536 # 32-bit registers of one NVIDIA multiprocessor (sm_80, sm_90)
WORKGROUP_RESERVED = 1024 # workgroup memory the driver reserves per workgroup (sm_80, sm_90)


def swizzle_mask(elements: int) -> int:
    """The XOR swizzle of an unpadded workgroup-memory row of `elements` 16-bit values (the NVIDIA kernels'
    staged K/V rows, and dk/dv's q/do rows): 16-byte chunk c of row j is stored at chunk c ^ (j & mask). ldmatrix
    reads one chunk of 8 consecutive rows (8 distinct 16-byte bank groups when mask = 7: no conflicts), and every 8
    lanes of a staging copy fill one aligned 128-byte line. mask + 1 is the largest power of two up to 8 dividing the
    row's chunks."""
    chunks = elements // 8
    return min(8, chunks & -chunks) - 1


# The PTX instructions each NVIDIA kernel takes from its recipe's [kernels] table (kernel_values: EX2,
# PACK_PAIR, VOTE_ANY).
CUSTOM_KERNEL_INSTRUCTIONS = {"forward": ("ex2", "pack_pair", "vote_any"), "dq": ("ex2", "pack_pair"),
                              "dkdv": ("ex2", "pack_pair")}


def custom_kernel_limits(stage: str, spec: KernelSpec, recipe) -> list[str]:
    """Why the custom kernel of `stage` cannot serve spec on recipe's target (empty: it can)."""
    if stage not in ("forward", "dq", "dkdv"):
        return [f"no custom kernel for stage {stage!r}"]
    why = []
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
    missing = [key for key in CUSTOM_KERNEL_INSTRUCTIONS[stage] if key not in recipe.kernel_settings]
    if missing:
        why.append(f"the recipe names no {', '.join(missing)} instruction")
    if spec.heads_per_group > HEAD_ROWS:
        why.append(f"more than {HEAD_ROWS} heads per group")
    if spec.head_dim % 16 or spec.value_dim % 16:
        why.append("D or Dv not a multiple of 16")
    if spec.block_size % KEYS_PER_SUBGROUP or spec.block_size // KEYS_PER_SUBGROUP > 8:
        why.append(f"BS not a multiple of {KEYS_PER_SUBGROUP} up to {8 * KEYS_PER_SUBGROUP}")
    limit = int(recipe.kernel_settings.get("max_workgroup_memory", 0))
    need = workgroup_memory(stage, spec, recipe)
    if limit and need > limit:
        why.append(f"needs {need} bytes of workgroup memory, the target has {limit}")
    return why


# The CPU kernels (nsa_iree/mlir/*_cpu.mlir) keep their tiles on the stack; the cpu recipe allows 64 KiB
# (--iree-llvmcpu-stack-allocation-limit) and these tiles stay within 48 KiB of it.
CPU_STACK_BYTES = 48 * 1024
CPU_VECTOR_REGISTERS = 16   # accumulator registers of one register block (of the 32 AVX-512 registers)
# Compare-and-swap attempts on a kv block's lock before the one-pass CPU kernel adds with atomics instead:
# a lock is held for one row's dk/dv products of one block (microseconds), so this many failed attempts mean
# a descheduled holder.
CPU_LOCK_TRIES = 20000


def cpu_stack_bytes(stage: str, spec: KernelSpec) -> int:
    """Bytes of f32 stack tiles the CPU kernel of `stage` allocates for spec."""
    hpg, d, dv, bs = spec.heads_per_group, spec.head_dim, spec.value_dim, spec.block_size
    if stage == "forward":                       # qT, oT, sT (p in place)
        return (d + dv + bs) * hpg * 4
    if stage == "dq":                            # qT, doT, dqT, sT (p), dpT (ds)
        return (2 * d + dv + 2 * bs) * hpg * 4
    if stage == "onepass":                       # qT, doT, S (P), dP (DS), DS transposed, dq
        return ((d + dv) * hpg + 3 * hpg * bs + hpg * d) * 4
    return 2 * hpg * bs * 4                      # dkdv: S (then P) and dP (then DS)


def cpu_kernel_limits(stage: str, spec: KernelSpec, recipe) -> list[str]:
    """Why the CPU kernel of `stage` cannot serve spec (empty: it can)."""
    if stage not in ("forward", "dq", "dkdv", "onepass"):
        return [f"no CPU kernel for stage {stage!r}"]
    need = cpu_stack_bytes(stage, spec)
    return [f"needs {need} bytes of stack tiles, more than {CPU_STACK_BYTES}"] if need > CPU_STACK_BYTES else []


def _largest_divisor(n: int, cap: int) -> int:
    return max(c for c in range(1, min(n, cap) + 1) if n % c == 0)


def cpu_values(spec: KernelSpec) -> dict[str, str]:
    """Register-block sizes of the CPU kernels: CPU_ROWS keys (or value/head elements) share one vector of
    heads per step, each row's accumulator a vector of HPG floats; CPU_ROWS * ceil(HPG / 16) accumulators stay
    within CPU_VECTOR_REGISTERS. CPU_COLS and CPU_DCOLS divide Dv and D (the o, dq column steps)."""
    per_row = -(-spec.heads_per_group // 16)
    rows = max(1, CPU_VECTOR_REGISTERS // per_row)
    # The dk/dv kernel: CPU_SROWS heads of S (each a vector of BS keys), and CPU_KROWS keys times CPU_VCOLS
    # (CPU_KCOLS) elements of dv (dk), up to 64 floats (4 registers) a row.
    per_keys = -(-spec.block_size // 16)
    return {"CPU_ROWS": str(rows), "CPU_COLS": str(_largest_divisor(spec.value_dim, rows)),
            "CPU_DCOLS": str(_largest_divisor(spec.head_dim, rows)),
            "CPU_SROWS": str(_largest_divisor(spec.heads_per_group, max(1, CPU_VECTOR_REGISTERS // per_keys))),
            "CPU_VCOLS": str(_largest_divisor(spec.value_dim, 64)),
            "CPU_KCOLS": str(_largest_divisor(spec.head_dim, 64)),
            "CPU_KROWS": str(_largest_divisor(spec.block_size, 4)), "CPU_DKV": str(spec.head_dim + spec.value_dim),
            "CPU_SLOT_STRIDE": str(max(1, spec.num_blocks // 2)), "CPU_LOCK_TRIES": str(CPU_LOCK_TRIES)}


def workgroup_memory(stage: str, spec: KernelSpec, recipe) -> int:
    """Bytes of workgroup memory the kernel of `stage` allocates for spec (16-bit elements)."""
    d, dv, bs = spec.head_dim + PAD, spec.value_dim + PAD, spec.block_size
    if stage in ("dq", "forward"):
        stages = int(recipe.kernel_settings.get("dq_stages", 2))
        kv_bytes = stages * bs * (spec.head_dim + spec.value_dim) * 2      # swizzled, unpadded rows
        if stage == "forward":
            subgroups = bs // KEYS_PER_SUBGROUP
            return max(kv_bytes, subgroups * HEAD_ROWS * (spec.value_dim + 2) * 4)
        return kv_bytes + HEAD_ROWS * dv * 2
    stages = int(recipe.kernel_settings.get("dkdv_stages", 2))
    rows = stages * HEAD_ROWS * (spec.head_dim + spec.value_dim) * 2            # swizzled q and do rows
    return bs * (d + dv) * 2 + rows + 2 * stages * HEAD_ROWS * 4 + 16 * recipe.rows_per_piece


def min_workgroups_per_sm(stage: str, spec: KernelSpec, recipe) -> int:
    """Workgroups of the NVIDIA kernel of `stage` that ptxas is asked to fit on one multiprocessor
    (`nvvm.minctasm`, PTX .minnctapersm): as many as the recipe's register cap for the stage allows
    (`[kernels] register_cap`), but no more than the multiprocessor's workgroup memory holds
    (`sm_workgroup_memory`, WORKGROUP_RESERVED of it per workgroup); 1 (no constraint) without a cap."""
    cap = int(recipe.kernel_settings.get("register_cap", {}).get(stage, 0))
    sm_memory = int(recipe.kernel_settings.get("sm_workgroup_memory", 0))
    if not cap or not sm_memory:
        return 1
    kind = LAYOUTS[mma_kind_name(recipe.kernel_settings["mma_kind"], spec)]
    lanes = (spec.block_size // KEYS_PER_SUBGROUP) * kind.subgroup_size          # LANES of the three kernels
    by_registers = REGISTERS_PER_SM // (lanes * cap)
    by_memory = sm_memory // (workgroup_memory(stage, spec, recipe) + WORKGROUP_RESERVED)
    return max(1, min(by_registers, by_memory))


def mma_kind_name(kind: str, spec: KernelSpec) -> str:
    """The recipe's mma_kind with its element type filled in (NV_MMA_SYNC_F32_16x8x16_${MMA_DTYPE} -> ..._BF16)."""
    return kind.replace("${MMA_DTYPE}", spec.dtype.upper())


def kernel_values(spec: KernelSpec, recipe) -> dict[str, str]:
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
        "FWD_O_PARTS_BYTES": subgroups * HEAD_ROWS * dv * 4,
        "FWD_O_PARTS_STATS_BYTES": subgroups * HEAD_ROWS * (dv + 1) * 4,
        "FWD_SMEM_BYTES": workgroup_memory("forward", spec, recipe),
        "FWD_O_ITEMS": spec.heads_per_group * dv,
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
    for stage in ("forward", "dq", "dkdv"):
        values[f"{stage.upper()}_MIN_WORKGROUPS_PER_SM"] = min_workgroups_per_sm(stage, spec, recipe)
    values["K_STAGE_PER_LANE"] = -(-values["K_STAGE_ITEMS"] // values["LANES"])
    values["V_STAGE_PER_LANE"] = -(-values["V_STAGE_ITEMS"] // values["LANES"])
    return {key: str(value) for key, value in values.items()}


# ---------------------------------------------------------------------------------------------------------
# Portable kernels (nsa_iree/mlir/*_portable.mlir): one text for every intrinsic
#
# A portable kernel works on 16 x 16 "units": a product step is lhs [16 rows x K] x rhs [K x 16 columns]
# into acc [16 x 16], K the intrinsic's reduction size (one MFMA 16x16x32; two mma.sync 16x8x16 side by
# side). Both operands are staged in workgroup memory with K contiguous (lhs as [row][k], rhs as
# [column][k]), so each lane reads its fragment as `runs` contiguous vectors of `run` elements (MFMA: one
# 16-byte read; mma.sync: four 4-byte reads). The placement enters the template only as affine maps
# (lane, run) -> (row or column, k) and (lane, index) -> (row, column) of the accumulator, derived here
# from the tables above and pinned against them by tests/test_fragments.py.

UNIT = 16  # rows and columns of a unit


@dataclasses.dataclass(frozen=True)
class Unit:
    """A kind's 16 x 16 x K unit: fragment shapes (IREE's distributed vectors) and placement maps."""

    kind: MMAKind

    @property
    def k(self) -> int:
        return self.kind.mnk[2]

    @property
    def n_tiles(self) -> int:
        """Intrinsic tiles side by side along the unit's 16 columns."""
        return UNIT // self.kind.mnk[1]

    def shape(self, operand: str) -> list[int]:
        """Shape of one unit's fragment: [1, intrinsic tiles along N] (lhs [1, 1]), then IREE's per-lane
        vector of one intrinsic operand ([outer repeats, elements] where there are repeats, else [elements])."""
        layout = getattr(self.kind, operand)
        repeats = layout.outer[0] * layout.outer[1]
        elements = layout.element[0] * layout.element[1]
        inner = [repeats, elements] if repeats > 1 else [elements]
        return [1, 1 if operand == "lhs" else self.n_tiles] + inner

    def size(self, operand: str) -> int:
        return getattr(self.kind, operand).fragment_size * (1 if operand == "lhs" else self.n_tiles)

    def position(self, operand: str, lane: int, index: int) -> tuple[int, int]:
        """(row, column) in the unit (lhs 16 x K, rhs K x 16, acc 16 x 16) of element `index` of lane's
        flat unit fragment ([tile along N][intrinsic fragment] for rhs and acc)."""
        layout = getattr(self.kind, operand)
        tile, inner = divmod(index, layout.fragment_size)
        row, col = element_position(layout, lane, inner)
        if operand == "lhs":
            return row, col
        return row, col + tile * self.kind.mnk[1]

    @property
    def run(self) -> int:
        """Contiguous elements along K per read (lhs element columns = rhs element rows)."""
        assert self.kind.lhs.element[1] == self.kind.rhs.element[0]
        return self.kind.lhs.element[1]

    def runs(self, operand: str) -> int:
        return self.size(operand) // self.run

    def run_origin(self, operand: str, lane: int, run: int) -> tuple[int, int]:
        """(row or column of the unit, k) where read `run` of lane starts: the operand stored K-contiguous."""
        row, col = self.position(operand, lane, run * self.run)
        return (row, col) if operand == "lhs" else (col, row)

    # The same placements as affine maps for the templates. Each map is built from the table's fields
    # (outer, thread, tstrides, element), so it is the table; tests evaluate it against position().
    def run_maps(self, operand: str) -> tuple[str, str]:
        """affine maps (l, j) -> row (lhs) or column (rhs), and (l, j) -> k, of read j of lane l."""
        exprs = self._position_exprs(operand, f"d1 * {self.run}")
        major, k = (exprs[0], exprs[1]) if operand == "lhs" else (exprs[1], exprs[0])
        return f"affine_map<(d0, d1) -> ({major})>", f"affine_map<(d0, d1) -> ({k})>"

    def acc_maps(self) -> tuple[str, str]:
        """affine maps (l, i) -> row and (l, i) -> column of element i of lane l's flat acc unit."""
        row, col = self._position_exprs("acc", "d1")
        return f"affine_map<(d0, d1) -> ({row})>", f"affine_map<(d0, d1) -> ({col})>"

    def _position_exprs(self, operand: str, index: str) -> tuple[str, str]:
        layout = getattr(self.kind, operand)
        size = layout.fragment_size
        # index = ((tile * o_rows + o_row) * o_cols + o_col) * e_rows * e_cols + e_row * e_cols + e_col
        e_rows, e_cols = layout.element
        o_rows, o_cols = layout.outer
        inner = f"(({index}) mod {size})"
        tile = f"(({index}) floordiv {size})"
        e_col = f"({inner} mod {e_cols})"
        e_row = f"(({inner} floordiv {e_cols}) mod {e_rows})"
        o_col = f"(({inner} floordiv {e_cols * e_rows}) mod {o_cols})"
        o_row = f"({inner} floordiv {e_cols * e_rows * o_cols})"
        out = []
        for dim, (o, e) in enumerate(((o_row, e_row), (o_col, e_col))):
            t = f"((d0 floordiv {layout.tstrides[dim]}) mod {layout.thread[dim]})"
            out.append(f"{o} * {layout.thread[dim] * layout.element[dim]} + {t} * {layout.element[dim]} + {e}")
        if operand != "lhs":
            out[1] = f"{out[1]} + {tile} * {self.kind.mnk[1]}"
        return out[0], out[1]


def evaluate_map(text: str, *dims: int) -> int:
    """Value of a one-result affine map written by :class:`Unit` at integer dims (for the tests)."""
    body = text[text.index("->") + 2:].strip()[1:-2]
    expr = body.replace("floordiv", "//").replace("mod", "%")
    return eval(expr, {}, {f"d{i}": v for i, v in enumerate(dims)})  # noqa: S307 (our own map text)


def portable_limits(stage: str, spec: KernelSpec, recipe) -> list[str]:
    """Why the portable kernel of `stage` cannot serve spec on recipe's target (empty: it can)."""
    if stage not in ("forward", "dq", "dkdv", "onepass"):
        return [f"no portable kernel for stage {stage!r}"]
    why = []
    if spec.dtype not in ("bf16", "f16"):
        why.append("dtype is not bf16 or f16")
    kind = LAYOUTS.get(mma_kind_name(recipe.kernel_settings.get("mma_kind", ""), spec))
    if kind is None:
        return why + ["no fragment table for the recipe's mma_kind"]
    k = kind.mnk[2]
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
        staged = (spec.head_dim + spec.value_dim) * (k + PAD) * 2
        if staged > _portable_dq_memory(spec)["DQP_DS_OFFSET"]:
            why.append("q and do transposed do not fit the K and V tiles")
    limit = int(recipe.kernel_settings.get("max_workgroup_memory", 0))
    need = {"dq": lambda: _portable_dq_memory(spec)["DQP_SMEM_BYTES"],
            "dkdv": lambda: _portable_dkdv_memory(spec, k, recipe.rows_per_piece)["DKP_SMEM_BYTES"],
            "forward": lambda: _portable_forward_memory(spec, k)["FWP_SMEM_BYTES"],
            "onepass": lambda: _portable_onepass_memory(spec, k)["OPP_SMEM_BYTES"]}[stage]()
    if limit and need > limit:
        why.append(f"needs {need} bytes of workgroup memory, the target has {limit}")
    return why


def _tile_offsets(prefix: str, tiles: list[tuple[str, int]]) -> dict[str, int]:
    """``{prefix}_{NAME}_OFFSET`` of each (NAME, bytes) tile laid out in order, and ``{prefix}_SMEM_BYTES``."""
    out, offset = {}, 0
    for name, size in tiles:
        out[f"{prefix}_{name}_OFFSET"] = offset
        offset += size
    out[f"{prefix}_SMEM_BYTES"] = offset
    return out


def _portable_dq_memory(spec: KernelSpec) -> dict[str, int]:
    """Byte offsets of the portable dq kernel's tiles (16-bit elements, rows padded by PAD): K rows, V rows,
    K transposed, ds."""
    d, dv, bs = spec.head_dim, spec.value_dim, spec.block_size
    return _tile_offsets("DQP", [("K", bs * (d + PAD) * 2), ("V", bs * (dv + PAD) * 2), ("KT", d * (bs + PAD) * 2),
                                 ("DS", HEAD_ROWS * (bs + PAD) * 2)])


def _portable_dkdv_memory(spec: KernelSpec, unit_k: int, rows_per_piece: int) -> dict[str, int]:
    """Byte offsets of the portable dk/dv kernel's tiles, in order: one step's q and do both ways, p^T and
    ds^T of every key, the step's (lse, delta) pairs, and four words per piece row."""
    d, dv, bs, pairs = spec.head_dim, spec.value_dim, spec.block_size, unit_k
    return _tile_offsets("DKP", [
        ("Q", pairs * (d + PAD) * 2), ("QT", d * (pairs + PAD) * 2), ("DO", pairs * (dv + PAD) * 2),
        ("DOT", dv * (pairs + PAD) * 2), ("PT", bs * (pairs + PAD) * 2), ("DST", bs * (pairs + PAD) * 2),
        ("STATS", pairs * 2 * 4), ("ROW_INFO", rows_per_piece * 16)])


def _portable_forward_memory(spec: KernelSpec, unit_k: int) -> dict[str, int]:
    """Byte offsets of the portable forward kernel's tiles, in order: V transposed, each subgroup's p, and
    each subgroup's o, max and sum (f32)."""
    dv, bs = spec.value_dim, spec.block_size
    subgroups = bs // unit_k
    return _tile_offsets("FWP", [
        ("V_COLS", dv * (bs + PAD) * 2), ("P", subgroups * HEAD_ROWS * (unit_k + PAD) * 2),
        ("O_PARTS", subgroups * HEAD_ROWS * dv * 4), ("MAX", subgroups * HEAD_ROWS * 4),
        ("SUM", subgroups * HEAD_ROWS * 4)])


def _portable_onepass_memory(spec: KernelSpec, unit_k: int) -> dict[str, int]:
    """Byte offsets of the portable one-pass kernel's tiles: the dq kernel's, then p^T and ds^T ([BS][K heads]);
    q and do transposed ([D][K heads], [Dv][K heads]) live at the start until their fragments are loaded."""
    dq = _portable_dq_memory(spec)
    key_heads = spec.block_size * (unit_k + PAD) * 2
    q_cols = spec.head_dim * (unit_k + PAD) * 2      # fits before DQP_DS_OFFSET with do's (portable_limits)
    return {"OPP_PT_OFFSET": dq["DQP_SMEM_BYTES"], "OPP_DST_OFFSET": dq["DQP_SMEM_BYTES"] + key_heads,
            "OPP_QT_OFFSET": 0, "OPP_DOT_OFFSET": q_cols, "OPP_SMEM_BYTES": dq["DQP_SMEM_BYTES"] + 2 * key_heads}


def portable_values(spec: KernelSpec, recipe) -> dict[str, str]:
    """Substitutions of the portable kernels (nsa_iree/mlir/*_portable.mlir)."""
    kind = LAYOUTS.get(mma_kind_name(recipe.kernel_settings.get("mma_kind", ""), spec))
    if kind is None:
        return {}
    unit = Unit(kind)
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
        **_portable_dq_memory(spec),
        # dk/dv: a step is K // 16 piece rows, so that its (row, head) pairs are one reduction of K.
        "ROWS_PER_STEP": unit.k // UNIT, "ROW_HEADS": unit.k, "ROW_HEADS_PADDED": unit.k + PAD,
        "ROW_STEPS": recipe.rows_per_piece // (unit.k // UNIT),
        "ROW_STEPS_PLUS_1": recipe.rows_per_piece // (unit.k // UNIT) + 1,
        "DV_TILES16": dv // UNIT, "Q_STEP_ITEMS": unit.k * d // 8, "DO_STEP_ITEMS": unit.k * dv // 8,
        "Q_STEP_ITEMS_PER_LANE": -(-(unit.k * d // 8) // lanes),
        "DO_STEP_ITEMS_PER_LANE": -(-(unit.k * dv // 8) // lanes),
        **_portable_dkdv_memory(spec, unit.k, recipe.rows_per_piece),
        # The forward: a subgroup owns K keys of a block (its p v is whole units); the lanes holding one row
        # of an accumulator differ in the lane bits of the column placement (xor shuffles over them).
        "FWD_SUBGROUPS": bs // unit.k, "FWD_LANES": bs // unit.k * kind.subgroup_size,
        "KEY_TILES": unit.k // UNIT, "UNIT_K_PADDED": unit.k + PAD,
        "ROW_SHUFFLES": kind.acc.thread[1].bit_length() - 1, "ROW_SHUFFLE_STRIDE": kind.acc.tstrides[1],
        "FWD_V_ITEMS_PER_LANE": -(-(bs * dv // 8) // (bs // unit.k * kind.subgroup_size)),
        **_portable_forward_memory(spec, unit.k),
        # The one-pass: the dq kernel's values, and the [key][head] and [d][head] tiles of K heads.
        "UNIT_K_PADDED_CHUNKS": (unit.k + PAD) // 8, "OPP_KEY_HEADS_CHUNKS": bs * (unit.k + PAD) // 8,
        "OPP_Q_COLS_CHUNKS": d * (unit.k + PAD) // 8, "OPP_DO_COLS_CHUNKS": dv * (unit.k + PAD) // 8,
        "OPP_Q_ITEMS": HEAD_ROWS * d // 8, "OPP_DO_ITEMS": HEAD_ROWS * dv // 8,
        **_portable_onepass_memory(spec, unit.k),
    }
    return {key: str(value) for key, value in values.items()}
