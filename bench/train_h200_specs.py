"""Compile here the cuda modules examples/train_nsa.py --preset h200 loads on the H200 (bench/train_h200.sh):

    NSA_IREE_CACHE_DIR=.dev/artifacts python -m bench.train_h200_specs
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from nsa_iree import compression
from nsa_iree.compiler import compile_loaded
from nsa_iree.spec import KernelSpec


def specs(cfg):
    """(KernelSpec, variant) of the layer's kernels: selection, compressed attention, select_blocks, the gating."""
    n = cfg.seq_len - 1                                                  # the tokens the model reads
    layout = dict(heads=cfg.heads, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim, value_dim=cfg.head_dim,
                  dtype="bf16", target="cuda")
    selection = KernelSpec(**layout, block_size=cfg.block_size, num_blocks=cfg.block_counts)
    tiles = compression.tile_slots(-(-n // cfg.block_size), compression.DEFAULT_TILE)
    compressed = KernelSpec(**layout, block_size=compression.DEFAULT_TILE, num_blocks=tiles,
                            key_stride=cfg.block_size)
    gates = KernelSpec(heads=cfg.heads, kv_heads=1, head_dim=cfg.head_dim, value_dim=cfg.head_dim, dtype="bf16",
                       target="cuda")
    return [(selection, "forward"), (selection, "two-pass"), (compressed, "forward"), (compressed, "two-pass"),
            (selection, "select"), (gates, "gates")]


if __name__ == "__main__":
    path = Path(__file__).resolve().parents[1] / "examples" / "train_nsa.py"
    spec = importlib.util.spec_from_file_location("train_nsa", path)
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example
    spec.loader.exec_module(example)
    for kernel_spec, variant in specs(example.PRESETS["h200"]):
        print(compile_loaded(kernel_spec, variant)[0].path.name, flush=True)
