"""Per-target compile recipes, read from ``nsa_iree/pipelines/<target>.toml`` (package data).

A recipe holds the ``iree-compile`` flags of a target, the IREE runtime driver that runs its artifacts,
its tuning parameters, and the target-specific attributes substituted into the MLIR templates (GPU
lowering configurations; none on CPU). The ``[onepass]`` table holds the target-specific pieces of the
hand-written one-pass dispatch (kernels/linalg/onepass.mlir), rendered into its ``${ONEPASS_<KEY>}`` placeholders:
unlike the attribute slots these are required (the CPU has values too), so a recipe without the table
cannot render the one-pass variant. It knows nothing about torch.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
import string
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, packaged as tomli (a dependency there)
    import tomli as tomllib

from .spec import TARGETS, KernelSpec

PIPELINES_DIR = importlib.resources.files(__package__) / "pipelines"   # package data


def pipelines_dir():
    """Where recipes are read from: ``$NSA_IREE_PIPELINES_DIR`` (tuning sweeps, see bench/sweep.py) or
    ``pipelines/``. The rendered MLIR and flags key the artifact cache, so a changed recipe never reuses an
    artifact built from another one."""
    env = os.environ.get("NSA_IREE_PIPELINES_DIR")
    return Path(env) if env else PIPELINES_DIR

# Attribute slots the templates may use; a recipe that does not set one renders it empty.
ATTRIBUTE_SLOTS = (
    "FWD_LSE_SCORES_CONFIG", "FWD_LSE_MAX_CONFIG", "FWD_LSE_ROOT_CONFIG", "FWD_O_SCORES_CONFIG", "FWD_O_ROOT_CONFIG",
    "DQ_SCORES_CONFIG", "DQ_DP_CONFIG", "DQ_ROOT_CONFIG",
    "DV_SCORES_CONFIG", "DV_ROOT_CONFIG",
    "DK_SCORES_CONFIG", "DK_DP_CONFIG", "DK_ROOT_CONFIG",
    "PIECE_SUM_CONFIG", "DELTA_CONFIG", "CHUNK_COUNT_CONFIG", "CHUNK_SUM_CONFIG", "GATES_CONFIG",
)

# Keys of the [onepass] table, each rendered as the placeholder ONEPASS_<KEY> of kernels/linalg/onepass.mlir.
ONEPASS_SLOTS = (
    "LANES",                # threads per workgroup (1 on CPU: the lanes become loops)
    "LANE_ID",              # an op giving this thread's lane as an index
    "BARRIER",              # a workgroup barrier (empty on CPU)
    "WORKGROUP_ALLOC",      # the op allocating the tiles shared by the lanes
    "WORKGROUP_SPACE",      # their memory space, with its leading comma (empty on CPU)
    "GLOBAL_PTR",           # the LLVM pointer type of the dk/dv accumulator's memory
    "ATOMIC_ATTRIBUTES",    # attributes of the llvm.atomicrmw fadd
    "FUNC_ATTRIBUTES",      # attributes of the dispatch function (GPU translation_info)
)

# The flag naming the CPU that cpu artifacts are compiled for ("host" in pipelines/cpu.toml).
CPU_FLAG = "--iree-llvmcpu-target-cpu="
HOST_CPU_FLAG = CPU_FLAG + "host"

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
    dtypes: tuple[str, ...] = ("f32", "f16", "bf16")
    block_sizes: tuple[int, ...] | None = None  # None: any block size (the CPU)
    onepass_templates: dict = dataclasses.field(default_factory=dict)
    kernel_settings: dict = dataclasses.field(default_factory=dict)
    values: dict = dataclasses.field(default_factory=dict)      # [values]: ${NAME}s the recipe's own text uses
    base: str | None = None     # the recipe it states its differences from (base = "..."), if any
    # IREE's calling convention of the modules' functions: None (synchronous) or "async-external" (they take a wait
    # and a signal fence: runtime.Module.call passes them)
    execution_model: str | None = None

    def flags_for(self, spec: KernelSpec) -> tuple[str, ...]:
        """The iree-compile flags of spec: the recipe's, with the CPU named by spec.target_cpu (cpu target), and
        its execution model's."""
        model = (f"--iree-execution-model={self.execution_model}",) if self.execution_model else ()
        if spec.target_cpu == "host":
            return self.flags + model
        if not any(flag.startswith(CPU_FLAG) for flag in self.flags):
            raise ValueError(f"pipelines/{self.target}.toml has no {CPU_FLAG}... flag to set to target_cpu "
                             f"{spec.target_cpu!r}")
        return tuple(f"{CPU_FLAG}{spec.target_cpu}" if flag.startswith(CPU_FLAG) else flag
                     for flag in self.flags) + model

    def attributes(self, spec: KernelSpec) -> dict[str, str]:
        """Attribute text for every slot, with the recipe's own ``${...}`` values filled in for spec."""
        values = {**self.values, "MMA_DTYPE": _MMA_DTYPE[spec.dtype], "H": str(spec.heads),
                  "HPG": str(spec.heads_per_group),
                  "D": str(spec.head_dim), "DV": str(spec.value_dim), "BS": str(spec.block_size),
                  "T": str(spec.num_blocks), "ROWS_PER_PIECE": str(self.rows_per_piece),
                  "HEAD_TILE": "2" if spec.heads_per_group % 2 == 0 else "1"}
        # The forward's block statistics: one 32-lane subgroup per selected block, reducing its [16 heads, BS
        # keys] score tile with lanes along the keys (at most 16, 4 or more keys each) and the rest along the
        # heads; up to 4 blocks per workgroup (2 when BS > 64, whose K tiles would not fit shared memory), a
        # divisor of T (a partial last tile fails to distribute for some head dims).
        lanes_keys = max(1, min(16, spec.block_size // 4))
        slots = next(n for n in ((4, 2, 1) if spec.block_size <= 64 else (2, 1)) if spec.num_blocks % n == 0)
        values.update(LANES_KEYS=str(lanes_keys), LANES_HEADS=str(32 // lanes_keys),
                      KEYS_PER_LANE=str(-(-spec.block_size // lanes_keys)),
                      HEADS_PER_LANE=str(max(1, 16 * lanes_keys // 32)),
                      SLOTS_PER_WORKGROUP=str(slots), SLOT_LANES=str(32 * slots))
        # The gating's elementwise ops (common/gates.mlir): GATE_VECTOR elements of 16 bytes or fewer per lane
        # (a power of two dividing Dv), GATE_HEADS heads of a row per workgroup (a divisor of H), at most 256
        # lanes in all.
        vector = next(n for n in (128 // _BITS[spec.dtype], 4, 2, 1) if spec.value_dim % n == 0)
        lanes_per_head = spec.value_dim // vector
        heads = max([n for n in range(1, spec.heads + 1) if spec.heads % n == 0 and n * lanes_per_head <= 256]
                    or [1])
        values.update(GATE_VECTOR=str(vector), GATE_HEADS=str(heads), GATE_LANES=str(heads * lanes_per_head))
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
        # A recipe without [onepass] leaves these placeholders unset: rendering onepass.mlir then fails
        # naming the missing placeholder, and the other templates, which do not use them, are unaffected.
        values["LANES"] = str(self.onepass_templates.get("LANES", ""))
        for key, text in self.onepass_templates.items():
            out[f"ONEPASS_{key}"] = string.Template(str(text)).substitute(values)
        return out


_TABLES = ("attributes", "onepass", "kernels", "values")


def _read(name: str, directory) -> dict:
    """<directory>/<name>.toml, over the base it names (``base = "amd"``): the target's keys replace the base's,
    its tables add to and replace the base's tables key by key; "base" is then the file's own."""
    data = tomllib.loads((directory / f"{name}.toml").read_text())
    base = data.get("base")
    if base is None:
        return data
    merged = _read(base, directory)
    for key, value in data.items():
        merged[key] = {**merged.get(key, {}), **value} if key in _TABLES else value
    return merged


def load_recipe(target: str, directory=None) -> Recipe:
    """The recipe of `target` from `directory` (default: pipelines_dir(), which a tuning sweep may point
    elsewhere; the renderer's own default is the package's recipes, so rendering reads no environment)."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    data = _read(target, pipelines_dir() if directory is None else directory)
    unknown = set(data.get("attributes", {})) - set(ATTRIBUTE_SLOTS)
    if unknown:
        raise ValueError(f"pipelines/{target}.toml: unknown attribute slots {sorted(unknown)}")
    onepass = data.get("onepass", {})
    unknown = set(onepass) - set(ONEPASS_SLOTS)
    if unknown:
        raise ValueError(f"pipelines/{target}.toml: unknown [onepass] keys {sorted(unknown)}")
    return Recipe(target=target, driver=data["driver"], flags=tuple(data["flags"]), base=data.get("base"),
                  rows_per_piece=int(data["rows_per_piece"]),
                  attribute_templates=dict(data.get("attributes", {})), onepass_templates=dict(onepass),
                  dtypes=tuple(data.get("dtypes", ("f32", "f16", "bf16"))),
                  block_sizes=tuple(data["block_sizes"]) if "block_sizes" in data else None,
                  kernel_settings=dict(data.get("kernels", {})), values=dict(data.get("values", {})),
                  execution_model=data.get("execution_model"))
