"""The f64 oracle checked against itself and against hand-computed cases."""

from __future__ import annotations

import math

import torch

from nsa_iree.reference import (key_weights, selection_attention_backward_reference,
                                selection_attention_reference)


def test_key_weights_by_hand():
    # N = 10, BS = 4: blocks {0..3}, {4..7}, {8, 9}. M = 3 rows at positions 7, 8, 9.
    idx = torch.tensor([[[[1, -1]], [[2, 0]], [[2, 2]]]])          # [B=1, M=3, G=1, T=2]
    w = key_weights(idx, block_size=4, n=10)[0, :, 0]
    assert w[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 0, 0]            # block 1; -1 skipped
    assert w[1].tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 1, 0]            # key 9 is in the future of pos 8
    assert w[2].tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 2, 2]            # a duplicate counts twice


def test_block_counts_and_skipped_slots():
    # N = 4, BS = 2, M = 2: rows at positions 2 and 3; block 2 does not exist.
    idx = torch.tensor([[[[0, 1]], [[1, 2]]]])
    w = key_weights(idx, block_size=2, n=4, block_counts=1)[0, :, 0]
    assert w[0].tolist() == [1, 1, 0, 0]
    assert w[1].tolist() == [0, 0, 1, 1]
    w = key_weights(idx, block_size=2, n=4, block_counts=torch.tensor([[[2], [0]]]))[0, :, 0]
    assert w[0].tolist() == [1, 1, 1, 0]                               # key 3 is after position 2
    assert w[1].tolist() == [0, 0, 0, 0]
    w = key_weights(idx, block_size=2, n=4)[0, :, 0]
    assert w[1].tolist() == [0, 0, 1, 1]                               # block 2 is out of range: skipped


def test_duplicate_is_log2_on_the_score():
    q = torch.randn(1, 1, 1, 4, dtype=torch.float64)
    k = torch.randn(1, 2, 1, 4, dtype=torch.float64)
    v = torch.randn(1, 2, 1, 3, dtype=torch.float64)
    o, lse = selection_attention_reference(q, k, v, torch.tensor([[[[0, 0, 1]]]]), block_size=1)
    s = (q[0, 0, 0] @ k[0, :, 0].T) * 0.5
    expected_lse = torch.logsumexp(torch.stack([s[0] + math.log(2), s[1]]), 0)
    assert torch.allclose(lse[0, 0, 0], expected_lse)
    p = torch.stack([2 * torch.exp(s[0] - expected_lse), torch.exp(s[1] - expected_lse)])
    assert torch.allclose(o[0, 0, 0], p @ v[0, :, 0])


def test_explicit_backward_matches_autograd():
    gen = torch.Generator().manual_seed(1)
    b, m, n, h, g, d, dv, bs, t = 2, 37, 45, 6, 2, 8, 5, 4, 5
    q = torch.randn(b, m, h, d, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(b, n, g, d, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(b, n, g, dv, dtype=torch.float64, generator=gen, requires_grad=True)
    idx = torch.randint(-1, 13, (b, m, g, t), generator=gen)
    idx[0, 0] = -1                                                      # an empty row
    idx[1, 3, :, 1] = idx[1, 3, :, 0]                                   # a duplicate
    counts = torch.randint(0, t + 1, (b, m, g), generator=gen)
    o, lse = selection_attention_reference(q, k, v, idx, bs, counts, scale=0.4)
    do = torch.randn(o.shape, dtype=torch.float64, generator=gen)
    o.backward(do)
    delta, dq, dk, dvv = selection_attention_backward_reference(q, k, v, o, lse, do, idx, bs, counts, scale=0.4)
    assert torch.allclose(delta, (o * do).sum(-1).permute(0, 2, 1))
    for ours, auto in ((dq, q.grad), (dk, k.grad), (dvv, v.grad)):
        assert torch.allclose(ours, auto, rtol=1e-10, atol=1e-12)
    assert not any(torch.isnan(x).any() for x in (q.grad, k.grad, v.grad))


def test_empty_row_output_and_lse():
    q, k, v = torch.randn(1, 2, 2, 4), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)
    o, lse = selection_attention_reference(q, k, v, torch.tensor([[[[-1]], [[0]]]]), block_size=2)
    assert torch.all(o[0, 0] == 0) and torch.all(lse[0, :, 0] == float("-inf"))
    assert torch.isfinite(lse[0, :, 1]).all()


def test_relative_rms_error_is_the_same_in_chunks():
    """The error measure every test uses sums in chunks; chunking must not change it, nor its checks."""
    import pytest

    from nsa_iree.testing import relative_rms_error

    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(300, 37, generator=gen, dtype=torch.float64)
    x = ref + 1e-3 * torch.randn(300, 37, generator=gen, dtype=torch.float64)
    ref[3, 4] = x[3, 4] = float("-inf")                      # like lse on an empty row: must match exactly
    finite = torch.isfinite(ref)
    direct = float((x[finite] - ref[finite]).norm() / ref[finite].norm())
    for chunk in (7, 1000, 1 << 24):
        assert math.isclose(relative_rms_error(x, ref, chunk=chunk), direct, rel_tol=1e-12)
    x[299, 36] = float("nan")
    assert relative_rms_error(x, ref, chunk=7) == float("inf")
    with pytest.raises(ValueError, match="shapes differ"):
        relative_rms_error(x[0], ref)
