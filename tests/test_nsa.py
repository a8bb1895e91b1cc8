"""nsa_iree.nsa and NativeSparseAttention against the f64 oracle (reference.nsa_reference: the branch oracles put
together): the gated sum, the ungated selection, given block indices, per-row counts, M < N, packed sequences;
the sliding window's gated branch; gradients into q, k, v and the gates; the module's output and parameter
gradients, packed input, torch.compile and autocast; bad input (docs/semantics.md, 'The whole layer'). The
compression branch's and the window's buffers are poisoned."""

from __future__ import annotations

import pytest
import torch

from conftest import DTYPES

import nsa_iree
from nsa_iree import layer
from nsa_iree.reference import nsa_reference
from nsa_iree.selection import realistic_block_indices
from nsa_iree.testing import TOLERANCE, relative_rms_error

pytestmark = pytest.mark.usefixtures("poisoned_compression_outputs")


# name: (B, M, N (None: M), H, G, D, Dv, BS, block_counts, what else: "gates" (g_cmp and g_slc), "indices" (given
# block indices), "counts" (a [B, M, G] tensor), "packed" (cu_seqlens))
CASES = {
    "gated": (1, 200, None, 16, 1, 32, 32, 32, 4, {"gates"}),
    "ungated_selection": (2, 150, None, 4, 2, 32, 16, 16, 3, set()),
    "given_indices": (1, 160, None, 8, 2, 16, 16, 16, 5, {"gates", "indices"}),
    "per_row_counts": (1, 130, None, 4, 1, 16, 16, 16, 6, {"gates", "counts"}),
    "m_below_n": (1, 90, 230, 8, 2, 32, 32, 16, 4, {"gates"}),
    "packed": (1, 300, None, 4, 1, 16, 16, 16, 3, {"gates", "packed"}),
}
PACKED = [0, 70, 70, 190, 300]          # an empty sequence, one shorter than a few blocks


def _problem(case, dtype, seed=0):
    batch, m_rows, n, heads, groups, dim, value_dim, bs, counts, extra = CASES[case]
    n = m_rows if n is None else n
    gen = torch.Generator().manual_seed(seed)
    t = {"q": torch.randn(batch, m_rows, heads, dim, generator=gen),
         "k": torch.randn(batch, n, groups, dim, generator=gen),
         "v": torch.randn(batch, n, groups, value_dim, generator=gen)}
    if "gates" in extra:
        t["g_cmp"] = torch.rand(batch, m_rows, heads, generator=gen)
        t["g_slc"] = torch.rand(batch, m_rows, heads, generator=gen)
    t = {name: x.to(dtype) for name, x in t.items()}
    kwargs = {"block_size": bs, "block_counts": counts}
    if "indices" in extra:
        kwargs["block_indices"] = realistic_block_indices(batch, m_rows, n, groups, counts + 2, bs, generator=gen)
    if "counts" in extra:
        kwargs["block_counts"] = torch.randint(0, counts + 3, (batch, m_rows, groups), generator=gen)
    if "packed" in extra:
        kwargs["cu_seqlens"] = torch.tensor(PACKED, dtype=torch.int32)
    return t, kwargs


def _run_both(case, dtype):
    """nsa's o and gradients, and the oracle's in f64 on the same inputs (the oracle selecting the same blocks as
    the kernels for 16-bit inputs, whose compressed-attention lse moves near-tied scores)."""
    t, kwargs = _problem(case, dtype)
    leaves = {name: x.clone().requires_grad_() for name, x in t.items()}
    o = nsa_iree.nsa(**leaves, **kwargs)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.dtype)
    grads = torch.autograd.grad(o, list(leaves.values()), do)
    ref_kwargs = dict(kwargs)
    if dtype != torch.float32 and "block_indices" not in kwargs:
        ref_kwargs["block_indices"] = _selected(t, kwargs)
    ref_leaves = {name: x.detach().double().requires_grad_() for name, x in t.items()}
    ro = nsa_reference(**ref_leaves, **ref_kwargs)
    ref_grads = torch.autograd.grad(ro, list(ref_leaves.values()), do.double())
    return o, dict(zip(leaves, grads)), ro, dict(zip(ref_leaves, ref_grads))


def _selected(t, kwargs):
    """The blocks nsa selects for these inputs (select_blocks on the kernels' compressed attention)."""
    bs, cu = kwargs["block_size"], kwargs.get("cu_seqlens")
    k_cmp = nsa_iree.mean_pooling(t["k"], bs, cu_seqlens=cu)
    v_cmp = nsa_iree.mean_pooling(t["v"], bs, cu_seqlens=cu)
    _, lse = nsa_iree.compressed_attention(t["q"], k_cmp, v_cmp, bs, seq_len=t["k"].shape[1], cu_seqlens=cu)
    return nsa_iree.select_blocks(t["q"], k_cmp, kwargs["block_counts"], bs, lse=lse, seq_len=t["k"].shape[1],
                                  cu_seqlens=cu)


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_output_and_gradients_match_the_reference_f32(case):
    o, grads, ro, ref_grads = _run_both(case, torch.float32)
    tol = TOLERANCE[torch.float32]
    assert o.dtype == torch.float32 and relative_rms_error(o.double(), ro) <= tol
    for name in grads:
        assert relative_rms_error(grads[name].double(), ref_grads[name], rms_floor=1e-3) <= tol, name


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("case", ["gated", "packed"])
def test_output_and_gradients_match_the_reference_16_bit(case, dtype):
    o, grads, ro, ref_grads = _run_both(case, DTYPES[dtype])
    tol = TOLERANCE[DTYPES[dtype]]
    assert o.dtype == DTYPES[dtype] and relative_rms_error(o.double(), ro) <= tol
    for name in grads:
        assert relative_rms_error(grads[name].double(), ref_grads[name], rms_floor=1e-3) <= tol, name


def test_without_gates_the_output_is_the_selection_branch():
    t, kwargs = _problem("ungated_selection", torch.float32)
    blocks = _selected(t, kwargs)
    expected = nsa_iree.selection_attention(t["q"], t["k"], t["v"], blocks, kwargs["block_size"])
    assert torch.equal(nsa_iree.nsa(**t, **kwargs), expected)


def test_packed_sequences_equal_separate_calls():
    t, kwargs = _problem("packed", torch.float32)
    got = nsa_iree.nsa(**t, **kwargs)
    for a, b in zip(PACKED[:-1], PACKED[1:]):
        if b > a:
            alone = nsa_iree.nsa(**{name: x[:, a:b] for name, x in t.items()}, block_size=kwargs["block_size"],
                                 block_counts=kwargs["block_counts"])
            torch.testing.assert_close(got[:, a:b], alone, rtol=0, atol=0)


def test_backward_is_bitwise_reproducible():
    first = _run_both("gated", torch.bfloat16)[1]
    again = _run_both("gated", torch.bfloat16)[1]
    assert all(torch.equal(first[name], again[name]) for name in first)


# --- the module -------------------------------------------------------------------------------------------

LAYER = dict(hidden_size=48, num_heads=16, num_kv_heads=1, head_dim=16, block_size=16, block_counts=3, window_size=24)


def _layer(seed=0, **changes):
    torch.manual_seed(seed)
    return nsa_iree.NativeSparseAttention(**(LAYER | changes))


def _with_oracle(monkeypatch):
    """layer.nsa replaced by the f64 oracle (inputs cast up, the result cast back)."""
    def oracle(q, k, v, g_cmp, g_slc, g_swa, block_counts, block_size, window_size, scale, cu_seqlens, variant):
        o = nsa_reference(q.double(), k.double(), v.double(), g_cmp.double(), g_slc.double(), g_swa.double(),
                          block_counts=block_counts, block_size=block_size, window_size=window_size, scale=scale,
                          cu_seqlens=cu_seqlens)
        return o.to(q.dtype)
    monkeypatch.setattr(layer, "nsa", oracle)


def test_module_output_and_parameter_gradients_match_the_oracle_layer(monkeypatch):
    x = torch.randn(2, 100, LAYER["hidden_size"], generator=torch.Generator().manual_seed(2))
    module = _layer()
    y = module(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    y.square().sum().backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters()}
    oracle_module = _layer()
    _with_oracle(monkeypatch)
    ry = oracle_module(x)
    ry.square().sum().backward()
    assert relative_rms_error(y.double(), ry.double()) <= 1e-5
    for name, p in oracle_module.named_parameters():
        assert relative_rms_error(grads[name].double(), p.grad.double(), rms_floor=1e-3) <= 1e-5, name


def test_module_on_packed_input_equals_each_sequence_alone():
    module = _layer()
    x = torch.randn(1, 150, LAYER["hidden_size"], generator=torch.Generator().manual_seed(3))
    bounds = [0, 40, 40, 150]
    y = module(x, cu_seqlens=torch.tensor(bounds, dtype=torch.int32))
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b > a:
            torch.testing.assert_close(y[:, a:b], module(x[:, a:b]), rtol=1e-5, atol=1e-6)


def test_module_under_torch_compile_fullgraph_equals_eager():
    module = _layer()
    x = torch.randn(1, 64, LAYER["hidden_size"], generator=torch.Generator().manual_seed(4))
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), module(x), rtol=0, atol=0)


def test_module_under_autocast_runs_in_bfloat16():
    module = _layer()
    x = torch.randn(1, 64, LAYER["hidden_size"], generator=torch.Generator().manual_seed(5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = module(x)
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    y.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters())


# --- bad input ----------------------------------------------------------------------------------------------

def _bad(name):
    t, kwargs = _problem("gated", torch.float32)
    q = t["q"]
    changes = {
        "g_cmp_shape": ({"g_cmp": q.new_ones(1, 200, 8)}, "g_cmp"),
        "g_slc_dtype": ({"g_slc": torch.ones(1, 200, 16, dtype=torch.float64)}, "g_slc"),
        "g_cmp_rank": ({"g_cmp": q.new_ones(200, 16)}, "g_cmp"),
        "block_size_zero": ({"block_size": 0}, "block_size"),
        "window_negative": ({"window_size": -1}, "window_size"),
        "window_without_gate": ({"window_size": 8}, "g_swa"),
        "block_counts_negative": ({"block_counts": -1}, "block_counts"),
        "block_counts_zero_when_selecting": ({"block_counts": 0}, "block_counts"),
        "variant": ({"variant": "three-pass"}, "variant"),
        "g_swa_shape_without_window": ({"g_swa": q.new_ones(1, 200, 3)}, "g_swa"),
        "v_heads": ({"v": q.new_ones(1, 200, 2, 32)}, "v"),
    }
    return changes[name], t, kwargs


BAD = ["g_cmp_shape", "g_slc_dtype", "g_cmp_rank", "block_size_zero", "window_negative", "window_without_gate",
       "block_counts_negative", "block_counts_zero_when_selecting", "variant", "g_swa_shape_without_window",
       "v_heads"]


@pytest.mark.parametrize("name", BAD)
def test_bad_input_names_the_argument(name, monkeypatch):
    (change, named), t, kwargs = _bad(name)
    monkeypatch.setattr("nsa_iree.api.kernels", lambda *a: pytest.fail("compiled for bad input"))
    with pytest.raises((TypeError, ValueError), match=named):
        nsa_iree.nsa(**(t | kwargs | change))


@pytest.mark.parametrize("case", ["gated", "m_below_n", "packed"])
def test_the_window_branch_adds_its_gated_attention(case):
    t, kwargs = _problem(case, torch.float32)
    g_swa = torch.rand(t["g_slc"].shape, generator=torch.Generator().manual_seed(6))
    leaves = {name: x.clone().requires_grad_() for name, x in (t | {"g_swa": g_swa}).items()}
    o = nsa_iree.nsa(**leaves, **kwargs, window_size=40)
    ref_leaves = {name: x.detach().double().requires_grad_() for name, x in leaves.items()}
    ro = nsa_reference(**ref_leaves, **kwargs, window_size=40)
    assert relative_rms_error(o.double(), ro) <= TOLERANCE[torch.float32]
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(7))
    grads = torch.autograd.grad(o, list(leaves.values()), do)
    ref_grads = torch.autograd.grad(ro, list(ref_leaves.values()), do.double())
    for name, got, ref in zip(leaves, grads, ref_grads):
        assert relative_rms_error(got.double(), ref, rms_floor=1e-3) <= TOLERANCE[torch.float32], name


LAYER_BAD = {
    "heads_not_a_multiple": ({"num_heads": 6, "num_kv_heads": 4}, "num_heads"),
    "odd_head_dim": ({"head_dim": 15}, "head_dim"),
    "zero_block_size": ({"block_size": 0}, "block_size"),
    "rope_theta": ({"rope_theta": 0.0}, "rope_theta"),
    "variant": ({"variant": "three-pass"}, "variant"),
}


@pytest.mark.parametrize("change, named", LAYER_BAD.values(), ids=list(LAYER_BAD))
def test_bad_layer_configuration_names_the_argument(change, named):
    with pytest.raises((TypeError, ValueError), match=named):
        _layer(**change)


def test_module_input_of_the_wrong_shape_names_x():
    with pytest.raises(ValueError, match="x must have shape"):
        _layer()(torch.ones(10, LAYER["hidden_size"]))


def test_module_takes_int64_cu_seqlens_as_fla_layers_do():
    module = _layer()
    x = torch.randn(1, 80, LAYER["hidden_size"], generator=torch.Generator().manual_seed(8))
    bounds = [0, 30, 80]
    torch.testing.assert_close(module(x, cu_seqlens=torch.tensor(bounds)),
                               module(x, cu_seqlens=torch.tensor(bounds, dtype=torch.int32)), rtol=0, atol=0)


def test_a_layout_without_select_blocks_raises_before_anything_compiles(monkeypatch):
    """gfx950's select_blocks (the portable kernel) takes D in whole units of 32: D 16 has no kernel there."""
    t, kwargs = _problem("gated", torch.bfloat16)
    t["q"], t["k"] = t["q"][..., :16].contiguous(), t["k"][..., :16].contiguous()
    monkeypatch.setattr("nsa_iree.api._target_for", lambda device: "gfx950")
    monkeypatch.setattr("nsa_iree.api.kernels", lambda *a: pytest.fail("compiled before the selection's check"))
    with pytest.raises(NotImplementedError, match="select_blocks.*D not a multiple"):
        nsa_iree.nsa(**t, **kwargs)


# The gating's kernels (layer.gated_sum, kernels/common/gates.mlir): name: (branches, the first one ungated, dtype,
# shape [B, M, H, Dv])
GATINGS = {
    "one_gated_f32": (1, False, torch.float32, (2, 33, 4, 16)),
    "two_bf16": (2, False, torch.bfloat16, (1, 70, 8, 32)),
    "two_first_ungated_f16": (2, True, torch.float16, (2, 41, 4, 24)),
    "three_bf16": (3, False, torch.bfloat16, (1, 50, 16, 8)),
    "empty_rows_bf16": (2, False, torch.bfloat16, (1, 0, 4, 16)),
}


@pytest.mark.parametrize("case", list(GATINGS))
def test_gated_sum_is_the_float32_sum_rounded_once(case):
    """o is sum_i o_i g_i in float32 rounded once, do_i = do g_i rounded once (16-bit products are exact in
    float32, so both are bitwise torch's float32 arithmetic), dg_i the float32 dot of do and o_i over Dv."""
    branches, ungated_first, dtype, shape = GATINGS[case]
    gen = torch.Generator().manual_seed(7)
    outs = [torch.randn(shape, generator=gen).to(dtype) for _ in range(branches)]
    gates = [torch.rand(shape[:3], generator=gen).to(dtype) for _ in range(branches)]
    if ungated_first:
        gates[0] = None
    do = torch.randn(shape, generator=gen).to(dtype)
    leaves = [None if t is None else t.clone().requires_grad_() for pair in zip(outs, gates) for t in pair]
    o = layer.gated_sum(*leaves)
    o.backward(do)
    weights = [torch.ones(shape[:3], dtype=dtype) if g is None else g for g in gates]
    total = sum(x.double() * w.double().unsqueeze(-1) for x, w in zip(outs, weights))
    if dtype == torch.float32:
        assert relative_rms_error(o.double(), total) < 1e-6
    else:
        assert torch.equal(o, sum(x.float() * w.float().unsqueeze(-1) for x, w in zip(outs, weights)).to(dtype))
    for i, (x, g) in enumerate(zip(outs, gates)):
        w = weights[i]
        assert torch.equal(leaves[2 * i].grad, (do.float() * w.float().unsqueeze(-1)).to(dtype))
        if g is None:
            assert leaves[2 * i + 1] is None
        else:
            dot = (do.double() * x.double()).sum(-1)
            assert leaves[2 * i + 1].grad.dtype == dtype
            assert relative_rms_error(leaves[2 * i + 1].grad.double(), dot) < TOLERANCE[dtype], case


def test_gated_sum_under_torch_compile_fullgraph_equals_eager():
    gen = torch.Generator().manual_seed(8)
    o1, o2 = (torch.randn(1, 20, 4, 16, generator=gen, dtype=torch.bfloat16) for _ in range(2))
    g1, g2 = (torch.rand(1, 20, 4, generator=gen).to(torch.bfloat16) for _ in range(2))
    compiled = torch.compile(layer.gated_sum, fullgraph=True)
    assert torch.equal(compiled(o1, g1, o2, g2), layer.gated_sum(o1, g1, o2, g2))


# name: (the branches from o [1, 5, 4, 8] and g [1, 5, 4], what the error names)
GATED_SUM_BAD = {
    "four_branches": (lambda o, g: [o, g] * 4, "1 to 3"),
    "o_2_dtype": (lambda o, g: [o, g, o.double(), g], "o_2"),
    "g_1_shape": (lambda o, g: [o, g[:, :1]], "g_1"),
    "g_2_dtype": (lambda o, g: [o, g, o, g.half()], "g_2"),
}


@pytest.mark.parametrize("case", list(GATED_SUM_BAD))
def test_gated_sum_names_the_bad_branch(case):
    branches, named = GATED_SUM_BAD[case]
    with pytest.raises(ValueError, match=named):
        layer.gated_sum(*branches(torch.randn(1, 5, 4, 8), torch.rand(1, 5, 4)))
