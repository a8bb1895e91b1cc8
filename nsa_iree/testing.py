"""Helpers shared by the tests, the benchmarks and the demo: the error measure and tolerances of
docs/semantics.md ("Precision"), and random problems to run.

An output passes when ``relative_rms_error(o, o_reference) < TOLERANCE[o.dtype]``.
"""

from __future__ import annotations

import torch

from .selection import realistic_block_indices

__all__ = ["TOLERANCE", "relative_rms_error", "random_problem"]

# Relative RMS error against the f64 reference, per output (o, lse, dq, dk, dv), by input dtype.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 1e-2}


def relative_rms_error(x: torch.Tensor, ref: torch.Tensor, rms_floor: float = 0.0,
                       chunk: int = 1 << 24) -> float:
    """||x - ref|| / ||ref|| over the finite entries of ref (lse is -inf on empty rows; x must match there).

    rms_floor bounds the denominator below by rms_floor * sqrt(n): where the exact result is zero up to
    rounding (e.g. dq and dk of a row that sees a single key), a relative error says nothing.
    The sums run in f64 over `chunk` elements at a time, so comparing 128k-token gradients on a GPU needs
    no f64 copy of the whole tensors. Returns inf where x is not finite exactly where ref is not, or differs
    from it there.
    """
    if x.shape != ref.shape:
        raise ValueError(f"shapes differ: {tuple(x.shape)} vs reference {tuple(ref.shape)}")
    x, ref = x.detach().reshape(-1), ref.detach().reshape(-1)
    num2 = den2 = 0.0
    finite_count = 0
    for start in range(0, x.numel(), chunk):
        a, b = x[start:start + chunk].double(), ref[start:start + chunk].double()
        finite = torch.isfinite(b)
        if not torch.equal(torch.isfinite(a), finite) or not torch.equal(a[~finite], b[~finite]):
            return float("inf")
        num2 += float(((a[finite] - b[finite]) ** 2).sum())
        den2 += float((b[finite] ** 2).sum())
        finite_count += int(finite.sum())
    num = num2 ** 0.5
    den = max(den2 ** 0.5, rms_floor * finite_count ** 0.5)
    return num / den if den > 0 else num


def random_problem(batch: int = 1, seq: int = 256, heads: int = 16, kv_heads: int = 1, head_dim: int = 64,
                   value_dim: int = 64, block_size: int = 64, num_blocks: int = 16, dtype=torch.float32,
                   device="cpu", seed: int = 0, requires_grad: bool = False):
    """q [B, M, H, D], k [B, N, G, D], v [B, N, G, Dv] (standard normal, M = N = seq) and realistic block
    indices [B, M, G, T] int32 (nsa_iree.selection), drawn on the host from `seed`, then moved to `device`."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, heads, head_dim, generator=gen)
    k = torch.randn(batch, seq, kv_heads, head_dim, generator=gen)
    v = torch.randn(batch, seq, kv_heads, value_dim, generator=gen)
    idx = realistic_block_indices(batch, seq, seq, kv_heads, num_blocks, block_size, generator=gen)
    q, k, v = (t.to(device=device, dtype=dtype).requires_grad_(requires_grad) for t in (q, k, v))
    return q, k, v, idx.to(device)
