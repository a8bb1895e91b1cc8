"""nsa_iree: Native Sparse Attention for PyTorch, forward and backward, compiled by IREE.

    layer = nsa_iree.NativeSparseAttention(hidden_size, num_heads=64, num_kv_heads=4, head_dim=64)
    o = nsa_iree.nsa(q, k, v, g_cmp, g_slc)                      # the layer's attention: fla's parallel_nsa
    o = nsa_iree.selection_attention(q, k, v, block_indices, block_size=64)     # one branch

The contract (shapes, masking, skipped slots, dtypes, tolerances) is docs/semantics.md.

The torch-facing modules (the functions below, their torch operators ``torch.ops.nsa_iree.*``) are imported on
first use of any of these names, or at once when torch is already imported; the compiler side (``nsa_iree.spec``,
``render``, ``compiler``, ``inspect``, the ``nsa-iree compile | render | inspect`` commands) never imports torch.
A program that imports nsa_iree before torch and then needs ``torch.ops.nsa_iree.*`` without touching a name
(e.g. ``torch.export.load`` of an exported model) imports ``nsa_iree.api``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

# public name -> the module that defines it
_EXPORTS = {
    "selection_attention": "api", "selection_attention_fwd": "api", "selection_attention_bwd": "api",
    "selection_attention_reference": "reference", "mean_pooling": "compression", "compressed_attention": "compression",
    "select_blocks": "compression", "nsa": "layer", "NativeSparseAttention": "layer",
    "sliding_window_attention": "window", "sliding_window_attention_fwd": "window",
    "realistic_block_indices": "selection", "uniform_block_indices": "selection", "local_block_indices": "selection",
    "KernelSpec": "spec",
}

__all__ = [*_EXPORTS, "reference", "selection", "testing"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif importlib.util.find_spec(f"{__name__}.{name}") is not None:     # any submodule: nsa_iree.cache, .api
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'nsa_iree' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


if "torch" in sys.modules:      # a torch program: register the operators now (torch.ops.nsa_iree.*, torch.export)
    importlib.import_module(".api", __name__)
