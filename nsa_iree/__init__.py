"""nsa_iree: the selection branch of Native Sparse Attention, forward and backward, compiled by IREE.

    o = nsa_iree.selection_attention(q, k, v, block_indices, block_size=64)

The contract (shapes, masking, skipped slots, dtypes, tolerances) is docs/semantics.md.
"""

from . import reference, selection, testing
from .api import selection_attention, selection_attention_bwd, selection_attention_fwd
from .reference import selection_attention_reference
from .selection import local_block_indices, realistic_block_indices, uniform_block_indices
from .spec import KernelSpec

__all__ = [
    "selection_attention", "selection_attention_fwd", "selection_attention_bwd",
    "selection_attention_reference", "realistic_block_indices", "uniform_block_indices", "local_block_indices",
    "KernelSpec", "reference", "selection", "testing",
]
__version__ = "0.1.0"
