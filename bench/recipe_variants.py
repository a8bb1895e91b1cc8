"""Recipe variants for the H200 checks of the AMD targets' kernel text: nsa_iree/pipelines/cuda.toml with some
stages' `[kernels]` entries moved to the portable family (or removed), written to a directory that
NSA_IREE_PIPELINES_DIR then points at (bench/portable_select_variant.py, bench/portable_window_variant.py)."""

from __future__ import annotations

import re
from pathlib import Path

from nsa_iree.kernels import choose
from nsa_iree.recipes import PIPELINES_DIR, load_recipe
from nsa_iree.spec import KernelSpec


def write_cuda_variant(directory: Path, entries: dict[str, str | None], header: str, spec: KernelSpec,
                       stages: tuple[str, ...]) -> Path:
    """DIR/cuda.toml: the package's cuda recipe, each line `name = "nvidia"` of `entries` set to the family given (None:
    the line removed; each found exactly once), after `header`; checked to make choose() render every one of `stages`
    for spec with the portable family's own template. Returns the file written."""
    text = (PIPELINES_DIR / "cuda.toml").read_text()
    for name, family in entries.items():
        line = f'{name} = "{family}"\n' if family else ""
        text, count = re.subn(rf'^{name} = "nvidia"\n', line, text, flags=re.MULTILINE)
        if count != 1:
            raise SystemExit(f'pipelines/cuda.toml has no line {name} = "nvidia" to '
                             f'{"replace" if family else "remove"}')
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "cuda.toml"
    path.write_text(header + text)
    recipe = load_recipe("cuda", directory)
    for stage in stages:
        choice = choose(stage, spec, recipe)
        if (choice.family, choice.template) != ("portable", None):
            raise SystemExit(f"{path}: {stage} renders with {choice.family} {choice.template or stage}, not the "
                             f"portable {stage}")
    return path
