"""The recipe variant that runs the portable select_blocks kernel (kernels/gpu/portable/select_blocks.mlir, the AMD
targets' kernel) on NVIDIA GPUs: nsa_iree/pipelines/cuda.toml with `select_blocks = "portable"` and nothing else
changed. Its `mma_kind` (mma.sync 16x8x16) is the portable unit there, so the H200 runs the text gfx950 and gfx942
compile with the mma.sync placement (the numerics check of the portable kernels: bench/results/portable_kernels.md).

    python3 -m bench.portable_select_variant [DIR]      # writes DIR/cuda.toml (default .dev/variants/portable_select)

Then, with NSA_IREE_PIPELINES_DIR=DIR and NSA_IREE_CACHE_DIR=.dev/artifacts, here (the compiler) and on the GPU
(the runtime, the same checkout and cache directory; bench/run_select_h200.sh does the GPU's part):

    python3 -m bench.compression_gpu_checks --only select --compile       # here
    python3 -m bench.compression_gpu_checks --only select                 # on the GPU
"""

from __future__ import annotations

import sys
from pathlib import Path

from nsa_iree.spec import KernelSpec

from .recipe_variants import write_cuda_variant

DEFAULT_DIR = Path(".dev/variants/portable_select")


def write(directory: Path = DEFAULT_DIR) -> Path:
    """DIR/cuda.toml: the package's cuda recipe with select_blocks on the portable family; checked to make
    choose() pick it for the anchors layout. Returns the file written."""
    anchors = KernelSpec(heads=64, kv_heads=4, head_dim=128, value_dim=128, block_size=64, num_blocks=16,
                         dtype="bf16", target="cuda")
    return write_cuda_variant(directory, {"select_blocks": "portable"}, "", anchors, ("select_blocks",))


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR))
