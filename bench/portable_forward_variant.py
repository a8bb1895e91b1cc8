"""The recipe variant that runs the portable forward kernel (kernels/gpu/portable/forward.mlir, the AMD targets'
forward) on NVIDIA GPUs: nsa_iree/pipelines/cuda.toml with `forward = "portable"` and nothing else changed. Its
`mma_kind` (mma.sync 16x8x16) is the portable unit there, so the H200 runs the text gfx950 and gfx942 compile with
the mma.sync placement.

    python3 -m bench.portable_forward_variant [DIR]     # writes DIR/cuda.toml (default .dev/variants/portable_forward)

Then, with NSA_IREE_PIPELINES_DIR=DIR, NSA_IREE_CACHE_DIR set and KERNEL_CASES naming cases the portable forward
serves (e.g. hpg16_b2_m_lt_n_bad,hpg8_bs32_f16,hpg4_bs128_dv64,hpg16_g2_t2_d64,hpg1_t1), `python3 -m
bench.kernel_checks precompile` here and `python3 -m bench.kernel_checks check` on the GPU: its o and lse against the
linalg stages and f64 (bench/results/host_time_H200_2026-12-04/portable_forward_check.log).
"""

from __future__ import annotations

import sys
from pathlib import Path

from nsa_iree.spec import KernelSpec

from .recipe_variants import write_cuda_variant

DEFAULT_DIR = Path(".dev/variants/portable_forward")


def write(directory: Path = DEFAULT_DIR) -> Path:
    """DIR/cuda.toml: the package's cuda recipe with the forward on the portable family; checked to make choose()
    pick it for 16 heads per group. Returns the file written."""
    spec = KernelSpec(heads=16, kv_heads=1, head_dim=128, value_dim=128, block_size=64, num_blocks=16, dtype="bf16",
                      target="cuda")
    return write_cuda_variant(directory, {"forward": "portable"}, "", spec, ("forward",))


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR))
