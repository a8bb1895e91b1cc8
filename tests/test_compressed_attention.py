"""nsa_iree.compressed_attention against the f64 oracle (reference.compressed_attention_reference and its
backward): outputs and gradients, rows that see nothing, M < N and M > N, packed sequences, determinism, errors
(docs/semantics.md, 'The compression branch and block selection'). Outputs are poisoned (NaN) before the
kernels write them."""

from __future__ import annotations

import pytest
import torch

from conftest import CPU_TARGETS, DTYPES, assert_bitwise_equal, cpu_target

import nsa_iree
from nsa_iree.reference import compressed_attention_backward_reference, compressed_attention_reference
from nsa_iree.testing import TOLERANCE, relative_rms_error

pytestmark = pytest.mark.usefixtures("poisoned_compression_outputs")

# (B, M, N (seq_len, None: M), H, G, D, Dv, BS)
SHAPES = {
    "square": (1, 256, None, 16, 1, 64, 64, 32),
    "n_not_a_multiple_of_bs": (2, 203, None, 4, 2, 32, 16, 16),
    "m_below_n": (1, 100, 230, 8, 2, 32, 32, 16),
    "m_above_n": (1, 150, 90, 4, 1, 32, 32, 16),
    "shorter_than_a_block": (1, 40, None, 4, 1, 16, 16, 64),
    "one_head_per_group": (1, 129, None, 4, 4, 32, 32, 16),
    "three_heads_per_group": (1, 97, None, 6, 2, 16, 32, 8),
    "sixty_four_heads_per_group": (1, 70, None, 64, 1, 16, 16, 16),
    "sixty_four_heads_per_group_d192": (1, 90, None, 64, 1, 192, 128, 16),     # the CPU's as 2 groups of 32
    "more_keys_than_a_tile": (1, 300, None, 4, 1, 16, 16, 4),
}


def _problem(shape, dtype, seed=0):
    batch, m_rows, n, heads, groups, dim, value_dim, bs = shape
    gen = torch.Generator().manual_seed(seed)
    c = -(-(m_rows if n is None else n) // bs)
    q = torch.randn(batch, m_rows, heads, dim, generator=gen).to(dtype)
    k = torch.randn(batch, c, groups, dim, generator=gen).to(dtype)
    v = torch.randn(batch, c, groups, value_dim, generator=gen).to(dtype)
    return q, k, v, bs, n


@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES.values(), ids=list(SHAPES))
def test_forward_and_gradients_match_the_reference(shape, dtype):
    q, k, v, bs, n = _problem(shape, DTYPES[dtype])
    tol = TOLERANCE[q.dtype]
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    o, lse = nsa_iree.compressed_attention(q, k, v, bs, seq_len=n)
    ro, rl = compressed_attention_reference(q.detach(), k.detach(), v.detach(), bs, seq_len=n)
    assert o.dtype == q.dtype and lse.dtype == torch.float32
    assert relative_rms_error(o.double(), ro) <= tol
    assert relative_rms_error(lse.double(), rl) <= tol       # -inf exactly where the row sees nothing
    do = torch.randn_like(o)
    o.backward(do)
    _, dq, dk, dv = compressed_attention_backward_reference(q.detach(), k.detach(), v.detach(), ro, rl, do, bs,
                                                            seq_len=n)
    for name, got, ref in (("dq", q.grad, dq), ("dk", k.grad, dk), ("dv", v.grad, dv)):
        assert relative_rms_error(got.double(), ref, rms_floor=1e-3) <= tol, name


# Some of the gradients asked for (what autograd needs): the other inputs take no gradient. On the CPU one call
# writes all three; with the query heads as two groups of 32 (HPG 64 at D 192) its dk and dv are float32 sums.
ASKED = {"dq": (True, False, False), "dk_dv": (False, True, True)}


@pytest.mark.parametrize("dtype", ("f32", "bf16"))
@pytest.mark.parametrize("shape", (SHAPES["sixty_four_heads_per_group_d192"], SHAPES["three_heads_per_group"]),
                         ids=("two_groups", "one_group"))
@pytest.mark.parametrize("asked", ASKED.values(), ids=list(ASKED))
def test_only_the_gradients_asked_for(asked, shape, dtype):
    q, k, v, bs, n = _problem(shape, DTYPES[dtype], seed=3)
    for t, wanted in zip((q, k, v), asked):
        t.requires_grad_(wanted)
    o, _ = nsa_iree.compressed_attention(q, k, v, bs, seq_len=n)
    do = torch.randn_like(o)
    o.backward(do)
    ro, rl = compressed_attention_reference(q.detach(), k.detach(), v.detach(), bs, seq_len=n)
    refs = compressed_attention_backward_reference(q.detach(), k.detach(), v.detach(), ro, rl, do, bs, seq_len=n)[1:]
    for name, t, ref, wanted in zip(("dq", "dk", "dv"), (q, k, v), refs, asked):
        assert (t.grad is not None) == wanted, name
        if wanted:
            assert relative_rms_error(t.grad.double(), ref, rms_floor=1e-3) <= TOLERANCE[q.dtype], name


@pytest.mark.parametrize("shape", (SHAPES["sixty_four_heads_per_group_d192"], SHAPES["three_heads_per_group"]),
                         ids=("two_groups", "one_group"))
def test_backward_into_without_some_destinations_equals_the_full_call(shape):
    """api.backward_into with dq or dk and dv left None (the gradients a caller does not need) writes the others
    bit for bit as the call with all three: where one call writes all (the CPU's dense backward), the ones not
    asked for go to scratch of the module's types (float32 dk and dv for two groups of 16-bit heads)."""
    from nsa_iree import api, compression

    q, k, v, bs, _ = _problem(shape, torch.bfloat16, seed=6)
    o, lse = nsa_iree.compressed_attention(q, k, v, bs)
    do = torch.randn_like(o)
    idx = compression._tile_indices(q.shape[0], q.shape[1], 0, k.shape[2], k.shape[1], q.device)
    tile, scale = compression._tile(q.device), q.shape[-1] ** -0.5

    def backward(want_dq, want_dkdv):
        grads = (torch.empty_like(q) if want_dq else None, *((torch.empty_like(k), torch.empty_like(v)) if want_dkdv
                                                              else (None, None)))
        return api.backward_into(*grads, q, k, v, o, lse, do, idx, tile, scale, "two-pass", key_stride=bs)

    dq, dk, dv = backward(True, True)
    assert_bitwise_equal(backward(True, False)[:1], [dq], names=("dq",))
    assert_bitwise_equal(backward(False, True)[1:], [dk, dv], names=("dk", "dv"))


def test_rows_that_see_no_block_get_zero_output_minus_inf_lse_and_no_gradient():
    q, k, v, bs, _ = _problem((1, 100, None, 4, 1, 16, 16, 16), torch.float32)
    q.requires_grad_()
    o, lse = nsa_iree.compressed_attention(q, k, v, bs)
    o.sum().backward()
    blind = bs - 1                      # positions 0 .. BS - 2 see no complete block
    assert torch.equal(o[:, :blind], torch.zeros_like(o[:, :blind]))
    assert torch.isneginf(lse[:, :, :blind]).all() and torch.isfinite(lse[:, :, blind:]).all()
    assert torch.equal(q.grad[:, :blind], torch.zeros_like(q.grad[:, :blind]))


PACKED = {
    "mixed": [0, 1, 15, 16, 17, 50],
    "empty_first_and_last": [0, 33, 0],
    "one_sequence": [45],
}


@pytest.mark.parametrize("lengths", PACKED.values(), ids=list(PACKED))
def test_packed_sequences_equal_separate_calls(lengths):
    """Outputs and gradients of a packed call: the oracle's with cu_seqlens, and each sequence's own call's."""
    bs = 16
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, sum(lengths), 4, 16, generator=gen).requires_grad_()
    kv = torch.randn(1, sum(lengths), 2, 16, generator=gen)
    k_cmp = nsa_iree.mean_pooling(kv, bs, cu_seqlens=cu).requires_grad_()
    v_cmp = nsa_iree.mean_pooling(kv.flip(-1), bs, cu_seqlens=cu).requires_grad_()
    o, lse = nsa_iree.compressed_attention(q, k_cmp, v_cmp, bs, cu_seqlens=cu)
    ro, rl = compressed_attention_reference(q.detach(), k_cmp.detach(), v_cmp.detach(), bs, cu_seqlens=cu)
    assert relative_rms_error(o.double(), ro) <= TOLERANCE[torch.float32]
    assert relative_rms_error(lse.double(), rl) <= TOLERANCE[torch.float32]
    do = torch.randn(o.shape, generator=gen)
    o.backward(do)
    _, dq, dk, dv = compressed_attention_backward_reference(q.detach(), k_cmp.detach(), v_cmp.detach(), ro, rl, do,
                                                            bs, cu_seqlens=cu)
    for name, got, ref in (("dq", q.grad, dq), ("dk", k_cmp.grad, dk), ("dv", v_cmp.grad, dv)):
        assert relative_rms_error(got.double(), ref, rms_floor=1e-3) <= TOLERANCE[torch.float32], name
    first = 0
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        blocks = -(-(b - a) // bs)
        if b > a:
            blocks_of = slice(first, first + blocks)
            alone, alone_lse = nsa_iree.compressed_attention(q.detach()[:, a:b], k_cmp.detach()[:, blocks_of],
                                                             v_cmp.detach()[:, blocks_of], bs)
            assert_bitwise_equal((o[:, a:b], lse[:, :, a:b]), (alone, alone_lse), names=("o", "lse"))
        first += blocks


def test_backward_is_bitwise_reproducible():
    q, k, v, bs, _ = _problem((1, 300, None, 8, 2, 32, 32, 8), torch.bfloat16)
    do = torch.randn(1, 300, 8, 32, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    grads = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o, _ = nsa_iree.compressed_attention(*leaves, bs)
        o.backward(do)
        grads.append([t.grad for t in leaves])
    assert_bitwise_equal(*grads, names=("dq", "dk", "dv"))


@pytest.mark.skipif("avx512f" not in open("/proc/cpuinfo").read(), reason="the host's code is AVX2 code here")
@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
def test_avx512_and_avx2_code_give_the_same_bits(dtype):
    """The forward and the backward (on the CPU one pass, its dk/dv partials summed in item order) compiled for this
    host and for x86-64-v3 agree bit for bit: no sum is split by the vector width."""
    q, k, v, bs, n = _problem((2, 203, 230, 8, 2, 32, 16, 8), DTYPES[dtype], seed=4)
    do = torch.randn(2, 203, 8, 16, generator=torch.Generator().manual_seed(5)).to(q.dtype)
    results = []
    for name in CPU_TARGETS:
        with cpu_target(name):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            o, lse = nsa_iree.compressed_attention(*leaves, bs, seq_len=n)
            o.backward(do)
            results.append([o, lse, *(t.grad for t in leaves)])
    assert_bitwise_equal(*results)


BAD = {
    "k_cmp_wrong_block_count": (dict(k_cmp=torch.zeros(1, 3, 1, 16)), "k_cmp"),
    "v_cmp_other_dtype": (dict(v_cmp=torch.zeros(1, 4, 1, 16, dtype=torch.float16)), "v_cmp"),
    "q_rank": (dict(q=torch.zeros(64, 2, 16)), "q"),
    "heads_not_a_multiple": (dict(q=torch.zeros(1, 64, 3, 16), k_cmp=torch.zeros(1, 4, 2, 16),
                                  v_cmp=torch.zeros(1, 4, 2, 16)), "kv heads"),
    "block_size_zero": (dict(block_size=0), "block_size"),
    "scale_nan": (dict(scale=float("nan")), "scale"),
}


@pytest.mark.parametrize("override, named", BAD.values(), ids=list(BAD))
def test_bad_input_names_the_argument(override, named):
    args = dict(q=torch.zeros(1, 64, 2, 16), k_cmp=torch.zeros(1, 4, 1, 16), v_cmp=torch.zeros(1, 4, 1, 16),
                block_size=16) | override
    with pytest.raises((TypeError, ValueError), match=named):
        nsa_iree.compressed_attention(args.pop("q"), args.pop("k_cmp"), args.pop("v_cmp"), args.pop("block_size"),
                                      **args)


def _small():
    q, k, v, bs, _ = _problem((1, 130, None, 4, 2, 16, 16, 16), torch.float32)
    return q, k, v, bs


def test_operators_pass_opcheck(monkeypatch):
    """torch's checks of the two custom ops: schema, fake implementation, autograd registration, AOT dispatch."""
    monkeypatch.undo()                     # opcheck compares runs: real (unpoisoned) buffers
    q, k, v, bs = _small()
    fwd, bwd = torch.ops.nsa_iree.compressed_attention_fwd, torch.ops.nsa_iree.compressed_attention_bwd
    torch.library.opcheck(fwd, (q.clone().requires_grad_(), k.clone().requires_grad_(), v, bs, 0.25, q.shape[1]))
    o, lse = fwd(q, k, v, bs, 0.25, q.shape[1])
    torch.library.opcheck(bwd, (torch.randn_like(o), q, k, v, o, lse, bs, 0.25, q.shape[1]))


def test_torch_compile_fullgraph_equals_eager():
    q, k, v, bs = _small()

    def step(q, k, v):
        o, lse = nsa_iree.compressed_attention(q, k, v, bs)
        return o.square().sum() + lse[torch.isfinite(lse)].sum()

    grads = []
    for fn in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves).backward()
        grads.append([t.grad for t in leaves])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_autocast_runs_the_autocast_dtype_like_sdpa():
    q, k, v, bs = _small()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o, lse = nsa_iree.compressed_attention(q, k, v, bs)
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32
    ref, _ = nsa_iree.compressed_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), bs)
    assert torch.equal(o, ref)
