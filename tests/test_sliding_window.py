"""nsa_iree.sliding_window_attention against the f64 oracle (reference.sliding_window_attention_reference): o, lse
and the gradients for windows of 1 key, a few, not a multiple of the blocks, longer than the sequence; M < N and
M > N; one and many heads per group; D != Dv; packed sequences; determinism; errors (docs/semantics.md, 'The
sliding window'). Outputs are poisoned (NaN) before the kernels write them."""

from __future__ import annotations

import pytest
import torch

from conftest import DTYPES

import nsa_iree
from nsa_iree.reference import sliding_window_attention_reference
from nsa_iree.testing import TOLERANCE, relative_rms_error

pytestmark = pytest.mark.usefixtures("poisoned_compression_outputs")

# (B, M, N (None: M), H, G, D, Dv, W)
SHAPES = {
    "two_keys": (1, 150, None, 4, 1, 32, 32, 2),
    "not_a_multiple_of_the_blocks": (2, 203, None, 4, 2, 32, 16, 50),
    "m_below_n": (1, 100, 230, 8, 2, 16, 16, 70),
    "m_above_n": (1, 150, 90, 4, 1, 16, 16, 30),
    "longer_than_the_sequence": (1, 90, None, 4, 1, 16, 16, 500),
    "sixteen_heads_per_group": (1, 130, None, 16, 1, 16, 32, 64),
}
PACKED = [0, 60, 60, 61, 200]


def _problem(shape, dtype, seed=0):
    batch, m_rows, n, heads, groups, dim, value_dim, window = shape
    gen = torch.Generator().manual_seed(seed)
    n = m_rows if n is None else n
    q = torch.randn(batch, m_rows, heads, dim, generator=gen).to(dtype)
    k = torch.randn(batch, n, groups, dim, generator=gen).to(dtype)
    v = torch.randn(batch, n, groups, value_dim, generator=gen).to(dtype)
    return q, k, v, window


def _check(q, k, v, window, cu_seqlens=None):
    tol = TOLERANCE[q.dtype]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = nsa_iree.sliding_window_attention_fwd(*leaves, window, cu_seqlens=cu_seqlens)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ro, rl = sliding_window_attention_reference(*ref, window, cu_seqlens=cu_seqlens)
    assert o.dtype == q.dtype and lse.dtype == torch.float32
    assert relative_rms_error(o.double(), ro) <= tol
    assert relative_rms_error(lse.double(), rl) <= tol           # -inf exactly where a row sees nothing
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.dtype)
    grads = torch.autograd.grad(o, leaves, do)
    ref_grads = torch.autograd.grad(ro, ref, do.double())
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert relative_rms_error(got.double(), want, rms_floor=1e-3) <= tol, name
    return grads


@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES.values(), ids=list(SHAPES))
def test_output_and_gradients_match_the_reference(shape, dtype):
    _check(*_problem(shape, DTYPES[dtype]))


def test_a_window_of_one_key_returns_its_value():
    q, k, v, _ = _problem(SHAPES["two_keys"], torch.float32)
    o = nsa_iree.sliding_window_attention(q, k, v, 1)
    torch.testing.assert_close(o, v.repeat_interleave(4, dim=2), rtol=1e-6, atol=1e-6)    # p = exp(s - lse) = 1


def test_packed_sequences_match_the_reference_and_separate_calls():
    q, k, v, window = _problem((1, 200, None, 4, 1, 16, 16, 40), torch.float32)
    cu = torch.tensor(PACKED, dtype=torch.int32)
    _check(q, k, v, window, cu)
    got = nsa_iree.sliding_window_attention(q, k, v, window, cu_seqlens=cu)
    for a, b in zip(PACKED[:-1], PACKED[1:]):
        if b > a:
            alone = nsa_iree.sliding_window_attention(q[:, a:b], k[:, a:b], v[:, a:b], window)
            torch.testing.assert_close(got[:, a:b], alone, rtol=0, atol=0)


def test_backward_is_bitwise_reproducible():
    problem = _problem(SHAPES["not_a_multiple_of_the_blocks"], torch.bfloat16)
    first, again = _check(*problem), _check(*problem)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


BAD = {
    "window_zero": ({"window_size": 0}, ValueError, "window_size"),
    "window_float": ({"window_size": 4.0}, TypeError, "window_size"),
    "k_dtype": ({"k": torch.ones(1, 150, 1, 32, dtype=torch.float64)}, TypeError, "k"),
    "v_rank": ({"v": torch.ones(150, 1, 32)}, ValueError, "v"),
}


def test_bad_cu_seqlens_values_raise_before_anything_runs(monkeypatch):
    q, k, v, window = _problem((1, 100, None, 4, 1, 16, 16, 40), torch.float32)
    monkeypatch.setattr("nsa_iree.api.kernels", lambda *a: pytest.fail("ran with bad cu_seqlens"))
    for bounds in ([0, 40], [0, 60, 30, 100], [5, 100]):
        with pytest.raises(ValueError, match="cu_seqlens"):
            nsa_iree.sliding_window_attention(q, k, v, window, cu_seqlens=torch.tensor(bounds, dtype=torch.int32))


@pytest.mark.parametrize("change, error, named", BAD.values(), ids=list(BAD))
def test_bad_input_names_the_argument(change, error, named, monkeypatch):
    q, k, v, window = _problem(SHAPES["two_keys"], torch.float32)
    monkeypatch.setattr("nsa_iree.api.kernels", lambda *a: pytest.fail("compiled for bad input"))
    args = {"q": q, "k": k, "v": v, "window_size": window} | change
    with pytest.raises(error, match=named):
        nsa_iree.sliding_window_attention(**args)
