"""Render the MLIR templates under ``nsa_iree/mlir/`` (package data) for one :class:`~nsa_iree.spec.KernelSpec`.

Templates are plain ``.mlir`` files with ``${NAME}`` placeholders for the few per-configuration values
(head counts and dims, block size, T, element type) and for target-specific attributes, which come from
the target's recipe in ``pipelines/`` (empty on CPU; the one-pass dispatch's ``ONEPASS_*`` pieces have CPU
values too). Nothing else in the package writes MLIR.
"""

from __future__ import annotations

import importlib.resources
import re
import string

from .fragments import cpu_values, kernel_values, portable_values
from .recipes import Recipe, choose, load_recipe
from .spec import KernelSpec

# Package data, wherever the package is installed (a directory on disk for a wheel or a checkout).
MLIR_DIR = importlib.resources.files(__package__) / "mlir"

# Every variant's module: the stage templates it needs, in order (helpers first).
STAGES = {
    "forward": ("kv_blocks", "selected_slots", "forward"),
    "two-pass": ("kv_blocks", "selected_slots", "delta", "dq", "inversion", "piece_sums", "dkdv"),
    "one-pass": ("delta", "onepass"),
}

_MLIR_TYPE = {"f32": "f32", "f16": "f16", "bf16": "bf16"}


def template_values(spec: KernelSpec, recipe: Recipe) -> dict[str, str]:
    """The substitutions for one specialisation: configuration values, then the recipe's attributes."""
    wide = spec.dtype == "f32"
    values = {
        "H": spec.heads,
        "G": spec.kv_heads,
        "HPG": spec.heads_per_group,
        "D": spec.head_dim,
        "DV": spec.value_dim,
        "BS": spec.block_size,
        "T": spec.num_blocks,
        "E": _MLIR_TYPE[spec.dtype],
        # f32 -> E and E -> f32 conversions; for f32 inputs a same-type bitcast that folds away.
        "TRUNCF": "arith.bitcast" if wide else "arith.truncf",
        "EXTF": "arith.bitcast" if wide else "arith.extf",
        "ROWS_PER_PIECE": recipe.rows_per_piece,
        # dk and dv: in E, or in f32 (spec.dkdv_dtype) where their sums are added to others before rounding.
        "DKV_E": _MLIR_TYPE[spec.dkdv_dtype or spec.dtype],
        "DKV_TRUNCF": "arith.bitcast" if (spec.dkdv_dtype or spec.dtype) == "f32" else "arith.truncf",
    }
    values = {k: str(v) for k, v in values.items()}
    values.update(recipe.attributes(spec))
    values.update(kernel_values(spec, recipe))
    values.update(portable_values(spec, recipe))
    values.update(cpu_values(spec))
    return values


def template_for(stage: str, spec: KernelSpec, recipe: Recipe) -> str:
    """The template file rendering `stage`: ``<stage>_kernel``, ``<stage>_portable`` or ``<stage>_cpu`` where
    the recipe picks a hand-written kernel, else the linalg ``<stage>``."""
    family = choose(stage, spec, recipe).family
    return {"custom": f"{stage}_kernel", "portable": f"{stage}_portable", "cpu": f"{stage}_cpu"}.get(family, stage)


_PART_LINE = re.compile(r"^[ \t]*// part: (\w+)\n", flags=re.MULTILINE)


def _with_parts(text: str) -> str:
    """Each line `// part: NAME` replaced by nsa_iree/mlir/parts/NAME.mlir without its leading comment lines
    (which say what the part uses and defines): text the hand-written kernels share, written once."""
    def part(match):
        lines = (MLIR_DIR / "parts" / f"{match.group(1)}.mlir").read_text().splitlines(keepends=True)
        while lines and lines[0].startswith("//"):
            lines.pop(0)
        return "".join(lines)
    return _PART_LINE.sub(part, text)


def render_template(name: str, spec: KernelSpec, recipe: Recipe | None = None) -> str:
    """One template, rendered. Raises KeyError naming any placeholder left without a value."""
    recipe = recipe or load_recipe(spec.target)
    text = _with_parts((MLIR_DIR / f"{name}.mlir").read_text())
    values = template_values(spec, recipe)
    # The shared host-function parts (parts/host_*.mlir) dispatch the executable their template declares.
    executables = re.findall(r"hal\.executable\.source private @(\w+)", text)
    if len(executables) == 1:
        values["EXECUTABLE"] = executables[0]
    try:
        return string.Template(text).substitute(values)
    except KeyError as err:
        raise KeyError(f"mlir/{name}.mlir: no value for placeholder {err}") from None


def render_module(spec: KernelSpec, variant: str) -> str:
    """The whole module compiled for (spec, variant): its stage templates, rendered and concatenated."""
    recipe = load_recipe(spec.target)
    header = f"// nsa_iree: {variant} for {spec.name}\n"
    names = [template_for(name, spec, recipe) for name in STAGES[variant]]
    if any(name.endswith("_cpu") for name in names):
        names.insert(0, "cpu_blocks")          # the transposed K/V blocks the CPU kernels read
    return header + "\n".join(render_template(name, spec, recipe) for name in names)
