"""Matrix-unit fragments of the hand-written GPU kernels: where each lane's elements sit, per intrinsic.

A hand-written kernel (``nsa_iree/kernels/gpu/``) does its products with ``iree_codegen.inner_tiled``
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
# CDNA3 (gfx942) has no 16x16x32 for 16-bit types: its 16x16x16 takes 4 elements along K per lane.
_MFMA_16x16x16 = dict(mnk=(16, 16, 16), subgroup_size=64,
                      lhs=OperandLayout(outer=(1, 1), thread=(16, 4), tstrides=(1, 16), element=(1, 4)),
                      rhs=OperandLayout(outer=(1, 1), thread=(4, 16), tstrides=(16, 1), element=(4, 1)),
                      acc=OperandLayout(outer=(1, 1), thread=(4, 16), tstrides=(16, 1), element=(4, 1)))

LAYOUTS: dict[str, MMAKind] = {
    name: MMAKind(name=name, **table)
    for name, table in (("NV_MMA_SYNC_F32_16x8x16_BF16", _NV), ("NV_MMA_SYNC_F32_16x8x16_F16", _NV),
                        ("MFMA_F32_16x16x32_BF16", _MFMA_16x16x32), ("MFMA_F32_16x16x32_F16", _MFMA_16x16x32),
                        ("MFMA_F32_16x16x16_BF16", _MFMA_16x16x16), ("MFMA_F32_16x16x16_F16", _MFMA_16x16x16))
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
# Tiling shared by the GPU kernels (nsa_iree/kernels/gpu/)

KEYS_PER_SUBGROUP = 16   # each subgroup owns 16 keys of every block (two 8-key column tiles of s)
HEAD_ROWS = 16           # one 16-row lhs tile holds the heads of a group (padded when HPG < 16)
PAD = 8                  # elements added to a padded workgroup-memory row: 8 consecutive rows start on different
                         # banks (the portable kernels' tiles, dq's do tile, dk/dv's K/V tiles; the NVIDIA
                         # kernels' staged K/V and q/do rows are swizzled instead: swizzle_mask)


def swizzle_mask(elements: int) -> int:
    """The XOR swizzle of an unpadded workgroup-memory row of `elements` 16-bit values (the NVIDIA kernels'
    staged K/V rows, and dk/dv's q/do rows): 16-byte chunk c of row j is stored at chunk c ^ (j & mask). ldmatrix
    reads one chunk of 8 consecutive rows (8 distinct 16-byte bank groups when mask = 7: no conflicts), and every 8
    lanes of a staging copy fill one aligned 128-byte line. mask + 1 is the largest power of two up to 8 dividing the
    row's chunks."""
    chunks = elements // 8
    return min(8, chunks & -chunks) - 1


# ---------------------------------------------------------------------------------------------------------
# The portable kernels' units (nsa_iree/kernels/gpu/portable/): one text for every intrinsic
#
# A portable kernel works on 16 x 16 "units": a product step is lhs [16 rows x K] x rhs [K x 16 columns]
# into acc [16 x 16], K the intrinsic's reduction size (one MFMA 16x16x32; two mma.sync 16x8x16 side by
# side), or k_tiles times it (gfx942: two MFMA 16x16x16 side by side along K). Both operands are staged in
# workgroup memory with K contiguous (lhs as [row][k], rhs as [column][k]), so each lane reads its fragment as
# `runs` contiguous vectors of `run` elements (MFMA: one 16-byte read; mma.sync: four 4-byte reads). With
# k_tiles > 1 the stored K is interleaved: a lane's run of one intrinsic is followed by its run of the next, so
# its k_tiles runs are one read; lhs and rhs are stored alike, so each product still pairs the elements of one
# stored k (the sum over K is the same sum). The placement enters the template only as affine maps
# (lane, run) -> (row or column, k) and (lane, index) -> (row, column) of the accumulator, derived here
# from the tables above and pinned against them by tests/test_fragments.py.

UNIT = 16  # rows and columns of a unit


@dataclasses.dataclass(frozen=True)
class Unit:
    """A kind's 16 x 16 x K unit: fragment shapes (IREE's distributed vectors) and placement maps; K is the
    intrinsic's reduction times k_tiles (intrinsics side by side along K, each lane's reads interleaved)."""

    kind: MMAKind
    k_tiles: int = 1

    def __post_init__(self) -> None:
        if self.k_tiles > 1 and (self.n_tiles > 1 or self.kind.lhs.outer != (1, 1) or self.kind.rhs.outer != (1, 1)):
            raise ValueError(f"{self.kind.name}: K tiles need one run per intrinsic operand and one N tile")

    @property
    def k(self) -> int:
        return self.kind.mnk[2] * self.k_tiles

    @property
    def n_tiles(self) -> int:
        """Intrinsic tiles side by side along the unit's 16 columns."""
        return UNIT // self.kind.mnk[1]

    def shape(self, operand: str) -> list[int]:
        """Shape of one unit's fragment: the intrinsic tiles along its outer dims (lhs [1, K tiles], rhs [K tiles,
        N tiles], acc [1, N tiles]), then IREE's per-lane vector of one intrinsic operand ([outer repeats,
        elements] where there are repeats, else [elements])."""
        layout = getattr(self.kind, operand)
        repeats = layout.outer[0] * layout.outer[1]
        elements = layout.element[0] * layout.element[1]
        inner = [repeats, elements] if repeats > 1 else [elements]
        outer = {"lhs": [1, self.k_tiles], "rhs": [self.k_tiles, self.n_tiles], "acc": [1, self.n_tiles]}[operand]
        return outer + inner

    def size(self, operand: str) -> int:
        tiles = {"lhs": self.k_tiles, "rhs": self.k_tiles * self.n_tiles, "acc": self.n_tiles}[operand]
        return getattr(self.kind, operand).fragment_size * tiles

    def stored_k(self, k: int, k_tile: int) -> int:
        """Where k (of the intrinsic's K) of K tile k_tile is stored in the unit's K: a lane's run of `e`
        consecutive k of one intrinsic, then its run of the next, (k // e) e k_tiles + k_tile e + k mod e (k
        itself with one K tile)."""
        e = self.kind.lhs.element[1]
        return (k // e) * e * self.k_tiles + k_tile * e + k % e

    def position(self, operand: str, lane: int, index: int) -> tuple[int, int]:
        """(row, column) in the unit (lhs 16 x K, rhs K x 16, acc 16 x 16) of element `index` of lane's
        flat unit fragment ([K tile][intrinsic fragment] for lhs, [tile along N][intrinsic fragment] for rhs
        and acc, or [K tile][intrinsic fragment] for rhs with K tiles), K as stored (stored_k)."""
        layout = getattr(self.kind, operand)
        tile, inner = divmod(index, layout.fragment_size)
        row, col = element_position(layout, lane, inner)
        if operand == "lhs":
            return row, self.stored_k(col, tile)
        if operand == "rhs" and self.k_tiles > 1:
            return self.stored_k(row, tile), col
        return row, col + tile * self.kind.mnk[1]

    @property
    def run(self) -> int:
        """Contiguous elements along K per read (lhs element columns = rhs element rows, times the K tiles)."""
        assert self.kind.lhs.element[1] == self.kind.rhs.element[0]
        return self.kind.lhs.element[1] * self.k_tiles

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

    def acc_column_origin(self, column: int) -> tuple[int, int]:
        """(lane, index) holding (row 0, `column`) of the acc unit: the lowest lane of the lanes holding that
        column (their row-thread index 0) and the element there (row 0 of its element rows)."""
        layout, n = self.kind.acc, self.kind.mnk[1]
        tile, col = divmod(column, n)
        e_rows, e_cols = layout.element
        outer_col, rest = divmod(col, layout.thread[1] * e_cols)
        thread, element_col = divmod(rest, e_cols)
        return thread * layout.tstrides[1], tile * layout.fragment_size + outer_col * e_rows * e_cols + element_col

    def acc_column_maps(self) -> tuple[str, str]:
        """affine maps (c) -> lane and (c) -> index of acc_column_origin(c), c < 16 (a column of the unit)."""
        layout, n = self.kind.acc, self.kind.mnk[1]
        e_rows, e_cols = layout.element
        col = f"(d0 mod {n})"
        lane = f"(({col} mod {layout.thread[1] * e_cols}) floordiv {e_cols}) * {layout.tstrides[1]}"
        index = (f"(d0 floordiv {n}) * {layout.fragment_size} + ({col} floordiv {layout.thread[1] * e_cols}) * "
                 f"{e_rows * e_cols} + {col} mod {e_cols}")
        return f"affine_map<(d0) -> ({lane})>", f"affine_map<(d0) -> ({index})>"

    @property
    def column_lanes(self) -> tuple[int, int]:
        """(count, stride): the lanes holding one column of an acc unit are lane_0 + stride * (0 .. count - 1)
        (its rows spread over them; xor shuffles over log2(count) distances stride, 2 stride, .. reach them all)."""
        return self.kind.acc.thread[0], self.kind.acc.tstrides[0]

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
        if operand == "acc" or (operand == "rhs" and self.k_tiles == 1):
            out[1] = f"{out[1]} + {tile} * {self.kind.mnk[1]}"
        if operand != "acc" and self.k_tiles > 1:       # stored_k of the K dimension, the tile its K tile
            along_k, run = (1, self.kind.lhs.element[1]) if operand == "lhs" else (0, self.kind.rhs.element[0])
            k = out[along_k]
            out[along_k] = f"(({k}) floordiv {run}) * {run * self.k_tiles} + {tile} * {run} + ({k}) mod {run}"
        return out[0], out[1]


def evaluate_map(text: str, *dims: int) -> int:
    """Value of a one-result affine map written by :class:`Unit` at integer dims (for the tests)."""
    body = text[text.index("->") + 2:].strip()[1:-2]
    expr = body.replace("floordiv", "//").replace("mod", "%")
    return eval(expr, {}, {f"d{i}": v for i, v in enumerate(dims)})  # noqa: S307 (our own map text)


def mma_kind_name(kind: str, spec: KernelSpec) -> str:
    """The recipe's mma_kind with its element type filled in (NV_MMA_SYNC_F32_16x8x16_${MMA_DTYPE} -> ..._BF16)."""
    return kind.replace("${MMA_DTYPE}", spec.dtype.upper())
