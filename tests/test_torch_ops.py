"""selection_attention as torch operators: torch.compile (fullgraph, no graph break), torch.export, autocast,
the gradients autograd asks for, and a clear error on double backward."""

from __future__ import annotations

import contextlib

import pytest
import torch

import nsa_iree
from nsa_iree import api, runtime
from nsa_iree.testing import relative_rms_error

B, M, N, H, G, D, DV, BS, T = 2, 40, 56, 4, 2, 16, 8, 8, 3


def inputs(dtype=torch.float32, seed=0, b=B, m=M, n=N, h=H, g=G, d=D, dv=DV, bs=BS, t=T):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, m, h, d, generator=gen).to(dtype)
    k = torch.randn(b, n, g, d, generator=gen).to(dtype)
    v = torch.randn(b, n, g, dv, generator=gen).to(dtype)
    idx = torch.randint(-1, n // bs, (b, m, g, t), generator=gen)
    do = torch.randn(b, m, h, dv, generator=gen).to(dtype)
    return q, k, v, idx, do


def attend(q, k, v, idx):
    return nsa_iree.selection_attention(q, k, v, idx, block_size=BS, block_counts=2)


def run(fn, q, k, v, idx, do, requires_grad=(True, True, True)):
    """o and the gradients of (o * do).sum() for the leaves that require grad (None for the others)."""
    leaves = [t.clone().requires_grad_(r) for t, r in zip((q, k, v), requires_grad)]
    o = fn(*leaves, idx)
    o.backward(do)
    return [o.detach()] + [t.grad for t in leaves]


def test_torch_compile_fullgraph_equals_eager():
    q, k, v, idx, do = inputs()
    eager = run(attend, q, k, v, idx, do)
    compiled = run(torch.compile(attend, fullgraph=True), q, k, v, idx, do)
    for name, a, b in zip(("o", "dq", "dk", "dv"), eager, compiled):
        assert torch.equal(a, b), name


def test_no_graph_break():
    q, k, v, idx, _ = inputs()
    explanation = torch._dynamo.explain(attend)(q.requires_grad_(), k, v, idx)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons


class SelectionLayer(torch.nn.Module):
    """Projections around selection attention, the way a model uses it."""

    def __init__(self, dim=24):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(dim, n * d) for n, d in ((H, D), (G, D), (G, DV)))
        self.out = torch.nn.Linear(H * DV, dim)

    def forward(self, x, idx):
        b, m, _ = x.shape
        q = self.q(x).view(b, m, H, D)
        k, v = self.k(x).view(b, m, G, D), self.v(x).view(b, m, G, DV)
        o = nsa_iree.selection_attention(q, k, v, idx, block_size=BS)
        return self.out(o.reshape(b, m, H * DV))


def _layer_grads(layer, x, idx):
    x = x.clone().requires_grad_(True)
    layer.zero_grad()
    y = layer(x, idx)
    y.square().sum().backward()
    return [y.detach(), x.grad] + [p.grad.clone() for p in layer.parameters()]


def test_torch_compile_of_a_module_matches_eager():
    torch.manual_seed(0)
    layer = SelectionLayer()
    x = torch.randn(B, N, 24)
    idx = torch.randint(-1, N // BS, (B, N, G, T), generator=torch.Generator().manual_seed(1))
    eager = _layer_grads(layer, x, idx)
    compiled = _layer_grads(torch.compile(layer, fullgraph=True), x, idx)
    # Inductor reorders the projections' sums: equal up to f32 rounding. (k's bias has a gradient of zero up
    # to rounding, ~1e-7: a bias shared by every key shifts all scores of a row alike.)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_dynamic_shapes_one_graph_for_every_length():
    q, k, v, idx, do = inputs()
    compiled = torch.compile(attend, fullgraph=True, dynamic=True, backend="aot_eager")
    for m in (M, M // 2, 7):
        a = run(attend, q[:, :m], k, v, idx[:, :m], do[:, :m])
        b = run(compiled, q[:, :m], k, v, idx[:, :m], do[:, :m])
        for name, x, y in zip(("o", "dq", "dk", "dv"), a, b):
            assert torch.equal(x, y), (m, name)


def test_torch_export_of_a_module():
    class Attend(torch.nn.Module):
        def forward(self, q, k, v, idx):
            return attend(q, k, v, idx)

    q, k, v, idx, _ = inputs()
    exported = torch.export.export(Attend(), (q, k, v, idx))
    ops = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "nsa_iree.selection_attention_fwd.default" in ops
    assert torch.equal(exported.module()(q, k, v, idx), attend(q, k, v, idx))


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("function", ("selection_attention", "selection_attention_fwd"))
def test_jit_trace(function):
    q, k, v, idx, _ = inputs()

    def run(q, k, v, idx):
        out = getattr(nsa_iree, function)(q, k, v, idx, block_size=BS, block_counts=2)
        return out if function == "selection_attention" else out[0]
    traced = torch.jit.trace(run, (q, k, v, idx), check_trace=False)
    assert torch.equal(traced(q, k, v, idx), run(q, k, v, idx))


def test_operators_pass_opcheck():
    """torch's own checks of a custom op: schema, fake (meta) implementation, autograd registration and
    AOT dispatch, forward and backward."""
    q, k, v, idx, do = inputs()
    idx = api.effective_block_indices(idx, None)
    scale = D ** -0.5
    fwd, bwd = torch.ops.nsa_iree.selection_attention_fwd, torch.ops.nsa_iree.selection_attention_bwd
    torch.library.opcheck(fwd, (q.requires_grad_(), k.requires_grad_(), v, idx, BS, scale))
    o, lse = fwd(q.detach(), k.detach(), v, idx, BS, scale)
    for need in ((True, True), (True, False), (False, True)):
        torch.library.opcheck(bwd, (do, q.detach(), k.detach(), v, o, lse, idx, BS, scale, "two-pass", *need))


@pytest.mark.parametrize("variant", ["two-pass", "one-pass"])
@pytest.mark.parametrize("wanted", ["q", "kv", "k", "v"])
def test_only_the_gradients_asked_for(variant, wanted, monkeypatch):
    """Gradients of leaves that do not require grad are None, the others equal a full backward; the two-pass
    variant skips the dk/dv work (inversion and dk/dv pass) when only dq is wanted, and the dq pass when
    only dk or dv are."""
    q, k, v, idx, do = inputs()
    fn = lambda *a: nsa_iree.selection_attention(*a, block_size=BS, variant=variant)  # noqa: E731
    full = run(fn, q, k, v, idx, do)
    calls = []
    original = runtime.Module.call
    monkeypatch.setattr(runtime.Module, "call",
                        lambda self, name, *a, **kw: calls.append(name) or original(self, name, *a, **kw))
    requires = tuple(name in wanted for name in "qkv")
    partial = run(fn, q, k, v, idx, do, requires)
    assert torch.equal(partial[0], full[0])
    for name, needed, got, ref in zip("qkv", requires, partial[1:], full[1:]):
        assert (got is not None) == needed, name
        if needed:                                 # (one-pass: f32 atomics, equal up to rounding order)
            assert torch.equal(got, ref) if variant == "two-pass" else relative_rms_error(got, ref) < 1e-6, name
    if variant == "two-pass":
        assert ("selection_attention_dq" in calls) == (wanted == "q"), calls
        assert ("selection_attention_dkdv" in calls) == (wanted != "q"), calls
        assert ("invert_block_indices" in calls) == (wanted != "q"), calls


def test_bad_inputs_under_torch_compile_name_the_argument():
    q, k, v, idx, _ = inputs()
    bad = (q[:, :, :3], k, v, idx)                                     # H = 3 is no multiple of G = 2
    message = "H=3 .* must be a positive multiple of the number of kv heads G=2"
    with pytest.raises(ValueError, match=message):
        torch.compile(attend, backend="eager")(*bad)
    with pytest.raises(Exception, match=message):                     # fullgraph: dynamo wraps the ValueError
        torch.compile(attend, fullgraph=True, backend="eager")(*bad)
    # Dynamo runs a function whose trace raised eagerly from then on, compiling its callees frame by frame
    # (fullgraph then refuses autograd.Function's generator frames): start the next tests from a clean slate.
    torch._dynamo.reset()


def test_lse_from_the_operator_is_not_differentiable():
    q, k, v, idx, _ = inputs()
    o, lse = torch.ops.nsa_iree.selection_attention_fwd(q.requires_grad_(), k, v, idx.int(), BS, 0.25)
    assert o.requires_grad and not lse.requires_grad


def test_double_backward_raises_a_clear_error():
    q, k, v, idx, _ = inputs()
    q.requires_grad_(True)
    o = attend(q, k, v, idx)
    (dq,) = torch.autograd.grad(o.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="selection_attention is not twice differentiable"):
        dq.sum().backward()


def _autocast_matches_casting_by_hand(device_type, dtype, **sizes):
    bs = sizes.get("bs", BS)
    q, k, v, idx, do = (t.to(device_type) for t in inputs(**sizes))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with torch.autocast(device_type, dtype=dtype):
        o = nsa_iree.selection_attention(*leaves, idx, block_size=bs)
        sdpa = torch.nn.functional.scaled_dot_product_attention(leaves[0].transpose(1, 2), leaves[0].transpose(1, 2),
                                                                leaves[0].transpose(1, 2))
    assert o.dtype == sdpa.dtype == dtype
    o.backward(do.to(dtype))
    assert all(t.grad.dtype == torch.float32 for t in leaves)         # the leaves' own dtype, as for SDPA
    by_hand = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
    o2 = nsa_iree.selection_attention(*by_hand, idx, block_size=bs)
    o2.backward(do.to(dtype))
    assert torch.equal(o, o2)
    for a, b in zip(leaves, by_hand):
        assert torch.equal(a.grad, b.grad.float())
    with torch.autocast(device_type, dtype=dtype):                    # the functions without autograd too
        o3, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, bs)
        grads = nsa_iree.selection_attention_bwd(q, k, v, o3, lse, do, idx, bs)
    assert o3.dtype == dtype and lse.dtype == torch.float32 and torch.equal(o3, o2.detach())
    assert all(g.dtype == dtype for g in grads)
    with torch.autocast(device_type, dtype=dtype):                    # mixed float inputs, as SDPA takes them
        assert torch.equal(nsa_iree.selection_attention(q, k.to(dtype), v, idx, bs), o3)
    with pytest.raises(TypeError, match="k must have q's dtype"):   # (outside autocast they must agree)
        nsa_iree.selection_attention(q, k.to(dtype), v, idx, bs)


def test_autocast_casts_like_sdpa_on_cpu():
    _autocast_matches_casting_by_hand("cpu", torch.bfloat16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_autocast_casts_like_sdpa_on_cuda():
    # A layout and block size the cuda recipe compiles (GPUs take f16/bf16 and BS 32, 64 or 128).
    _autocast_matches_casting_by_hand("cuda", torch.float16, b=1, m=256, n=256, h=16, g=1, d=128, dv=128, bs=64, t=4)


def test_autocast_under_torch_compile():
    q, k, v, idx, do = inputs()

    def step(q, k, v, idx):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return attend(q, k, v, idx)

    eager = run(step, q, k, v, idx, do.bfloat16())
    compiled = run(torch.compile(step, fullgraph=True, backend="aot_eager"), q, k, v, idx, do.bfloat16())
    assert compiled[0].dtype == torch.bfloat16
    for name, a, b in zip(("o", "dq", "dk", "dv"), eager, compiled):
        assert torch.equal(a, b), name


def test_torch_compile_with_only_q_requiring_grad():
    q, k, v, idx, do = inputs()
    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    eager = run(attend, q, k, v, idx, do, (True, False, False))
    got = run(compiled, q, k, v, idx, do, (True, False, False))
    assert got[2] is None and got[3] is None
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])


# --- torch.func -------------------------------------------------------------------------------------------

def _autograd_grads(q, k, v, idx, do):
    return run(attend, q, k, v, idx, do)[1:]


def test_torch_func_grad_equals_autograd():
    q, k, v, idx, do = inputs()
    grads = torch.func.grad(lambda q, k, v: (attend(q, k, v, idx) * do).sum(), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip(("dq", "dk", "dv"), grads, _autograd_grads(q, k, v, idx, do)):
        assert torch.equal(a, b), name


def test_torch_func_vjp_equals_autograd():
    q, k, v, idx, do = inputs()
    o, pullback = torch.func.vjp(lambda q, k, v: attend(q, k, v, idx), q, k, v)
    expected = run(attend, q, k, v, idx, do)
    assert torch.equal(o, expected[0])
    for name, a, b in zip(("dq", "dk", "dv"), pullback(do), expected[1:]):
        assert torch.equal(a, b), name


def test_torch_func_jacrev_equals_rows_of_autograd():
    """jacrev (a vmap over vjps, so the backward operator's batching rule): row r of the Jacobian of o[0, 5, 1, :]
    with respect to v is the gradient of o[0, 5, 1, r]."""
    q, k, v, idx, _ = inputs(b=1)
    jac = torch.func.jacrev(lambda v: attend(q, k, v, idx)[0, 5, 1])(v)
    assert jac.shape == (DV, *v.shape)
    for r in range(DV):
        leaf = v.clone().requires_grad_(True)
        attend(q, k, leaf, idx)[0, 5, 1, r].backward()
        assert torch.equal(jac[r], leaf.grad), r


@pytest.mark.parametrize("packed", (False, True), ids=("batched", "packed"))
def test_torch_func_vmap_equals_a_loop_without_the_fallback_warning(packed, recwarn):
    """vmap over a leading dimension of q, k and v (block_indices shared): folded into the batch, or with cu_seqlens
    (B = 1) one call per entry; either way the numbers of one call per entry and no slow-path warning."""
    q, k, v, idx, _ = inputs(b=1, n=M)
    cu_seqlens = torch.tensor([0, 13, M], dtype=torch.int32) if packed else None
    qs, ks, vs = (torch.stack([t, -t, 2 * t]) for t in (q, k, v))

    def call(q, k, v):
        return nsa_iree.selection_attention(q, k, v, idx, block_size=BS, cu_seqlens=cu_seqlens)

    got = torch.func.vmap(call)(qs, ks, vs)
    for i in range(3):
        assert torch.equal(got[i], call(qs[i], ks[i], vs[i])), i
    assert not [w for w in recwarn if "batching rule" in str(w.message)]


def test_torch_func_grad_of_grad_raises_the_double_backward_error():
    q, k, v, idx, do = inputs()

    def loss(q):
        return (attend(q, k, v, idx) * do).sum()

    with pytest.raises(RuntimeError, match="not twice differentiable"):
        torch.func.grad(lambda q: torch.func.grad(loss)(q).sum())(q)


@pytest.mark.parametrize("empty", ("no_rows", "no_batch"))
def test_torch_func_vmap_over_empty_problems_keeps_the_shapes(empty):
    """Empty outputs are outputs, not placeholders: vmap over 3 entries of problems with M = 0 or B = 0."""
    q, k, v, idx, _ = inputs()
    if empty == "no_rows":
        q, idx = q[:, :0], idx[:, :0]
    else:
        q, k, v, idx = (t[:0] for t in (q, k, v, idx))
    qs = torch.stack([q, q, q])
    o = torch.func.vmap(lambda q: attend(q, k, v, idx))(qs)
    assert o.shape == (3, *q.shape[:3], DV)
    grad = torch.func.grad(lambda q: torch.func.vmap(lambda q: attend(q, k, v, idx))(q).sum())(qs)
    assert grad.shape == qs.shape


# Where no gradient can flow the public function runs the forward operator alone (no autograd.Function); where one
# can, or under a torch.func transform, the Function. The output is the same either way.
NEEDS_AUTOGRAD = [
    ("no_grad_mode", False, (True, False, False), False),
    ("no_input_requires_grad", True, (False, False, False), False),
    ("q_requires_grad", True, (True, False, False), True),
    ("only_v_requires_grad", True, (False, False, True), True),
]


@pytest.mark.parametrize("case,grad_mode,requires_grad,function", NEEDS_AUTOGRAD, ids=[c[0] for c in NEEDS_AUTOGRAD])
def test_the_autograd_function_runs_only_where_a_gradient_can_flow(monkeypatch, case, grad_mode, requires_grad,
                                                                   function):
    q, k, v, idx, _ = inputs()
    expected = attend(q, k, v, idx).detach()
    calls = []
    apply = api._SelectionAttention.apply
    monkeypatch.setattr(api._SelectionAttention, "apply", lambda *a: calls.append(1) or apply(*a))
    leaves = [t.clone().requires_grad_(r) for t, r in zip((q, k, v), requires_grad)]
    with torch.set_grad_enabled(grad_mode):
        o = attend(*leaves, idx)
    assert bool(calls) == function
    assert o.requires_grad == (grad_mode and any(requires_grad))
    assert torch.equal(o.detach(), expected)


# The operators' bodies run directly where torch's dispatch of the custom op would only come back to them (host time
# a call): plain eager tensors needing no recorded gradient; anything that intercepts torch calls gets the operator.
def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode(allow_non_fake_inputs=True)


DISPATCH_FREE = [      # (case, context, inputs' device, q requires grad, direct)
    ("eager", contextlib.nullcontext, "cpu", False, True),
    ("inference_mode", torch.inference_mode, "cpu", False, True),
    ("leaves_under_no_grad", torch.no_grad, "cpu", True, True),
    ("leaves_needing_grad", contextlib.nullcontext, "cpu", True, False),
    ("fake_tensor_mode", _fake_mode, "cpu", False, False),
    ("device_context_mode", lambda: torch.device("cpu"), "cpu", False, False),
    ("autocast", lambda: torch.autocast("cpu", dtype=torch.bfloat16), "cpu", False, False),
    ("meta_tensors", contextlib.nullcontext, "meta", False, False),
]


@pytest.mark.parametrize("case,context,device,requires_grad,direct", DISPATCH_FREE, ids=[c[0] for c in DISPATCH_FREE])
def test_dispatch_free_only_where_nothing_intercepts(case, context, device, requires_grad, direct):
    q, k, v, idx = (t.to(device) for t in inputs()[:4])
    q.requires_grad_(requires_grad)
    with context():
        assert api.dispatch_free(q, k, v, idx, None) == direct


def test_dispatch_free_is_false_under_vmap():
    q, k, v, idx, _ = inputs()
    seen = []
    torch.func.vmap(lambda q: seen.append(api.dispatch_free(q, k, v)) or q)(q)
    assert seen == [False]


def test_a_profile_shows_the_direct_calls_as_the_operators():
    q, k, v, idx, do = inputs()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
        nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, BS)
    names = {e.name for e in prof.events()}
    assert {"nsa_iree::selection_attention_fwd", "nsa_iree::selection_attention_bwd"} <= names


def test_direct_body_and_operator_give_the_same_bits():
    q, k, v, idx, do = inputs()
    idx = api.effective_block_indices(idx, 2)
    args = (q, k, v, idx, BS, D ** -0.5, "two-pass", None)
    direct, through = api._fwd(*args), torch.ops.nsa_iree.selection_attention_fwd(*args)
    assert all(torch.equal(a, b) for a, b in zip(direct, through))
    o, lse = direct
    args = (do, q, k, v, o, lse, idx, BS, D ** -0.5, "two-pass", True, True, None)
    direct, through = api._bwd(*args), torch.ops.nsa_iree.selection_attention_bwd(*args)
    assert all(torch.equal(a, b) for a, b in zip(direct, through))
