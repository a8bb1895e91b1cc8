"""Per-target compile recipes, read from ``pipelines/<target>.toml``.

A recipe holds the ``iree-compile`` flags of a target, the IREE runtime driver that runs its artifacts,
its tuning parameters, and the target-specific attributes substituted into the MLIR templates (GPU
lowering configurations; none on CPU). It knows nothing about torch.
"""

from __future__ import annotations

import dataclasses
import string
import tomllib
from pathlib import Path

from .spec import TARGETS, KernelSpec

PIPELINES_DIR = Path(__file__).resolve().parent.parent / "pipelines"

# Attribute slots the templates may use; a recipe that does not set one renders it empty.
ATTRIBUTE_SLOTS = (
    "FWD_LSE_SCORES_CONFIG", "FWD_O_SCORES_CONFIG", "FWD_O_ROOT_CONFIG",
    "DQ_SCORES_CONFIG", "DQ_DP_CONFIG", "DQ_ROOT_CONFIG",
    "DV_SCORES_CONFIG", "DV_ROOT_CONFIG",
    "DK_SCORES_CONFIG", "DK_DP_CONFIG", "DK_ROOT_CONFIG",
)

_MMA_DTYPE = {"f16": "F16", "bf16": "BF16", "f32": "F32"}
_BITS = {"f16": 16, "bf16": 16, "f32": 32}


def _promotable(dim: int, bits: int) -> bool:
    """Whether a tile whose innermost dimension is ``dim`` can be promoted to shared memory.

    IREE 3.13 copies a promoted operand with 128-bit loads per thread and needs the number of loads along
    the innermost dimension to divide, or be a multiple of, the (power-of-two) workgroup size; otherwise
    codegen stops with "failed to derive layout for promoted read-like op" (e.g. D = 192: 24 loads a row).
    So promotion is used only when dim * bits / 128 is a power of two.
    """
    loads = dim * bits // 128
    return dim * bits % 128 == 0 and loads > 0 and loads & (loads - 1) == 0


@dataclasses.dataclass(frozen=True)
class Recipe:
    target: str
    driver: str
    flags: tuple[str, ...]
    rows_per_piece: int
    attribute_templates: dict

    def attributes(self, spec: KernelSpec) -> dict[str, str]:
        """Attribute text for every slot, with the recipe's own ``${...}`` values filled in for spec."""
        values = {"MMA_DTYPE": _MMA_DTYPE[spec.dtype], "HPG": str(spec.heads_per_group),
                  "D": str(spec.head_dim), "DV": str(spec.value_dim), "BS": str(spec.block_size), "T": str(spec.num_blocks),
                  "ROWS_PER_PIECE": str(self.rows_per_piece),
                  "HEAD_TILE": "2" if spec.heads_per_group % 2 == 0 else "1"}
        # promote_operands lists for contractions whose operands have D or Dv innermost (see _promotable):
        # *_BOTH for q k^T / do v^T (both operands), *_RHS for products whose second operand has it.
        bits = _BITS[spec.dtype]
        for name, dim in (("D", spec.head_dim), ("DV", spec.value_dim)):
            ok = _promotable(dim, bits)
            values[f"PROMOTE_BOTH_{name}"] = "0, 1" if ok else ""
            values[f"PROMOTE_RHS_{name}"] = "1" if ok else ""
        out = {}
        for slot in ATTRIBUTE_SLOTS:
            text = self.attribute_templates.get(slot, "")
            try:
                out[slot] = string.Template(text).substitute(values) if text else ""
            except KeyError as err:
                raise ValueError(f"pipelines/{self.target}.toml: {slot} uses unknown value {err}") from None
        return out


def load_recipe(target: str) -> Recipe:
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    data = tomllib.loads((PIPELINES_DIR / f"{target}.toml").read_text())
    unknown = set(data.get("attributes", {})) - set(ATTRIBUTE_SLOTS)
    if unknown:
        raise ValueError(f"pipelines/{target}.toml: unknown attribute slots {sorted(unknown)}")
    return Recipe(target=target, driver=data["driver"], flags=tuple(data["flags"]),
                  rows_per_piece=int(data["rows_per_piece"]),
                  attribute_templates=dict(data.get("attributes", {})))
