"""The recipe variant that runs the sliding window on the portable kernels (kernels/gpu/portable/forward.mlir, dq.mlir,
dkdv.mlir: the AMD targets' text, with the band's mask) on NVIDIA GPUs: nsa_iree/pipelines/cuda.toml with
`forward = dq = dkdv = "portable"` and no dense_forward / dense_dq entries (kernels.choose would offer those first for
a window). The portable family's settings are cuda.toml's own: `mma_kind` (mma.sync 16x8x16, the portable unit there,
K 16) and `max_workgroup_memory`; so the H200 runs the text gfx950 compiles, with the mma.sync placement (the
numerics check of the portable kernels: bench/results/portable_kernels.md).

    python3 -m bench.portable_window_variant [DIR]      # writes DIR/cuda.toml (default .dev/variants/portable_window)

Then, with NSA_IREE_PIPELINES_DIR=DIR and NSA_IREE_CACHE_DIR=.dev/artifacts, here (the compiler) and on the GPU
(the runtime, the same checkout and cache directory; bench/run_window_h200.sh does the GPU's part):

    python3 -m bench.compression_gpu_checks --only window --compile       # here
    python3 -m bench.compression_gpu_checks --only window                 # on the GPU
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from nsa_iree import window
from nsa_iree.kernels import choose
from nsa_iree.recipes import PIPELINES_DIR, load_recipe
from nsa_iree.spec import KernelSpec

DEFAULT_DIR = Path(".dev/variants/portable_window")
STAGES = ("forward", "dq", "dkdv")
DENSE_ENTRIES = ("dense_forward", "dense_dq")
HEADER = ("# Written by bench/portable_window_variant.py from nsa_iree/pipelines/cuda.toml: the forward, dq and\n"
          "# dk/dv on the portable kernels, no dense kernels (the sliding window's check of the AMD targets' text).\n")


def _edit(text: str) -> str:
    """cuda.toml's text with STAGES on the portable family and the DENSE_ENTRIES lines gone (each found once)."""
    for stage in STAGES:
        text, count = re.subn(rf'^{stage} = "nvidia"$', f'{stage} = "portable"', text, flags=re.MULTILINE)
        if count != 1:
            raise SystemExit(f'pipelines/cuda.toml has no line {stage} = "nvidia" to replace')
    for entry in DENSE_ENTRIES:
        text, count = re.subn(rf'^{entry} = "nvidia"\n', "", text, flags=re.MULTILINE)
        if count != 1:
            raise SystemExit(f'pipelines/cuda.toml has no line {entry} = "nvidia" to remove')
    return HEADER + text


def write(directory: Path = DEFAULT_DIR) -> Path:
    """DIR/cuda.toml: the package's cuda recipe with the forward, dq and dk/dv on the portable family and no dense
    kernels; checked to make choose() pick the portable templates of those stages for the window (anchors layout,
    W 512). Returns the file written."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "cuda.toml"
    path.write_text(_edit((PIPELINES_DIR / "cuda.toml").read_text()))
    spec = KernelSpec(heads=64, kv_heads=4, head_dim=128, value_dim=128, block_size=window.WINDOW_BLOCK,
                      num_blocks=window.window_slots(512), dtype="bf16", target="cuda", window=512)
    recipe = load_recipe("cuda", directory)
    for stage in STAGES:
        choice = choose(stage, spec, recipe)
        if (choice.family, choice.template) != ("portable", None):
            raise SystemExit(f"{path}: the window's {stage} renders with {choice.family} {choice.template or stage}, "
                             f"not the portable {stage}")
    return path


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR))
