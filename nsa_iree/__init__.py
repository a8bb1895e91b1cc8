"""nsa_iree: the selection branch of Native Sparse Attention, forward and backward, compiled by IREE."""

from .api import selection_attention, selection_attention_bwd, selection_attention_fwd
from .spec import KernelSpec

__all__ = ["selection_attention", "selection_attention_fwd", "selection_attention_bwd", "KernelSpec"]
__version__ = "0.1.0"
