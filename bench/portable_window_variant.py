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

import sys
from pathlib import Path

from nsa_iree import window
from nsa_iree.spec import KernelSpec

from .recipe_variants import write_cuda_variant

DEFAULT_DIR = Path(".dev/variants/portable_window")
HEADER = ("# Written by bench/portable_window_variant.py from nsa_iree/pipelines/cuda.toml: the forward, dq and\n"
          "# dk/dv on the portable kernels, no dense kernels (the sliding window's check of the AMD targets' text).\n")
STAGES = ("forward", "dq", "dkdv")


def write(directory: Path = DEFAULT_DIR) -> Path:
    """DIR/cuda.toml: the package's cuda recipe with the forward, dq and dk/dv on the portable family and no dense
    kernels (kernels.choose would offer those first for a window); checked to make choose() pick the portable
    templates of those stages for the window (anchors layout, W 512). Returns the file written."""
    spec = KernelSpec(heads=64, kv_heads=4, head_dim=128, value_dim=128, block_size=window.WINDOW_BLOCK,
                      num_blocks=window.window_slots(512), dtype="bf16", target="cuda", window=512)
    entries = {**dict.fromkeys(STAGES, "portable"), "dense_forward": None, "dense_dq": None}
    return write_cuda_variant(directory, entries, HEADER, spec, STAGES)


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR))
