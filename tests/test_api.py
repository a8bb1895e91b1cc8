"""The public API: autograd, accepted inputs, and clear errors for bad ones."""

from __future__ import annotations

import pytest
import torch

import nsa_iree
from nsa_iree.testing import relative_rms_error
from nsa_iree.reference import selection_attention_reference

B, M, N, H, G, D, DV, BS, T = 2, 40, 56, 4, 2, 16, 8, 8, 3


def inputs(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, M, H, D, generator=gen).to(dtype)
    k = torch.randn(B, N, G, D, generator=gen).to(dtype)
    v = torch.randn(B, N, G, DV, generator=gen).to(dtype)
    idx = torch.randint(-1, N // BS, (B, M, G, T), generator=gen)
    return q, k, v, idx


@pytest.mark.parametrize("variant", ["two-pass", "one-pass"])
def test_autograd_matches_reference_gradients(variant):
    q, k, v, idx = inputs()
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = nsa_iree.selection_attention(*leaves, idx, block_size=BS, variant=variant)
    do = torch.randn_like(o)
    o.backward(do)
    ref = [t.double().requires_grad_(True) for t in (q, k, v)]
    o_ref, _ = selection_attention_reference(*ref, idx, BS)
    o_ref.backward(do.double())
    assert relative_rms_error(o.detach(), o_ref.detach()) < 1e-5
    for ours, theirs in zip(leaves, ref):
        assert relative_rms_error(ours.grad, theirs.grad) < 1e-5


def test_fwd_and_bwd_agree_with_autograd_path():
    q, k, v, idx = inputs()
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
    do = torch.randn_like(o)
    dq, dk, dv = nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, BS)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o2 = nsa_iree.selection_attention(*leaves, idx, block_size=BS)
    o2.backward(do)
    assert torch.equal(o, o2.detach())
    for a, b in zip((dq, dk, dv), leaves):
        assert torch.equal(a, b.grad)


def test_non_contiguous_and_offset_views_are_accepted():
    q, k, v, idx = inputs()
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
    wide = torch.randn(B, M, H, 2 * D)
    wide[..., ::2] = q                                                  # q as a strided view
    q_view = wide[..., ::2]
    k_offset = torch.cat([torch.randn(1, N, G, D), k])[1:]              # a view with a storage offset
    o2, lse2 = nsa_iree.selection_attention_fwd(q_view, k_offset, v.transpose(1, 2).contiguous().transpose(1, 2),
                                                idx.transpose(1, 2).contiguous().transpose(1, 2), BS)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("shape", [(0, M, N), (B, 0, N), (B, M, 0)], ids=["B=0", "M=0", "N=0"])
def test_zero_size_dimensions(shape):
    b, m, n = shape
    q, k, v = torch.randn(b, m, H, D), torch.randn(b, n, G, D), torch.randn(b, n, G, DV)
    idx = torch.zeros(b, m, G, T, dtype=torch.int32)
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
    assert o.shape == (b, m, H, DV) and lse.shape == (b, H, m)
    assert torch.all(o == 0) and torch.all(lse == float("-inf"))
    dq, dk, dv = nsa_iree.selection_attention_bwd(q, k, v, o, lse, torch.randn_like(o), idx, BS)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert all(torch.count_nonzero(t) == 0 for t in (dq, dk, dv))


def test_nan_input_gives_nan_output_without_hanging():
    q, k, v, idx = inputs()
    q[0, 5, 0, 0] = float("nan")
    idx[0, 5, :, 0] = 0                                                  # row 5 sees block 0
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
    assert torch.isnan(o[0, 5, 0]).all() and torch.isnan(lse[0, 0, 5])
    assert not torch.isnan(o[1]).any()
    dq, dk, dv = nsa_iree.selection_attention_bwd(q, k, v, o, lse, torch.randn_like(o), idx, BS)
    assert torch.isnan(dq[0, 5, 0]).any() and not torch.isnan(dq[1]).any()


def _grads(q, k, v, idx, do, variant):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = nsa_iree.selection_attention(*leaves, idx, block_size=BS, variant=variant)
    o.backward(do)
    return [o.detach()] + [t.grad for t in leaves]


def _reference_grads(q, k, v, idx, do):
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    o, _ = selection_attention_reference(*leaves, idx, BS)
    o.backward(do.double())
    return [o.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("variant", ["two-pass", "one-pass"])
def test_non_finite_values_in_an_unselected_block_stay_out(variant):
    """NaN/Inf in K/V of a block no row selects (its slots are -1 or out of range) change nothing: skipped
    slots gather a zero block, never a real one whose masked values would still be multiplied by 0."""
    q, k, v, idx = inputs()
    idx = torch.where(idx == 0, torch.full_like(idx, -1), idx)           # block 0: the first block anyone
    idx[:, :, :, -1] = 99                                               # would pick for a skipped slot
    do = torch.randn(B, M, H, DV, generator=torch.Generator().manual_seed(3))
    clean = _reference_grads(q, k, v, idx, do)
    k[:, :BS] = float("nan")
    v[:, :BS] = float("inf")
    for name, ours, ref in zip(("o", "dq", "dk", "dv"), _grads(q, k, v, idx, do, variant), clean):
        assert torch.isfinite(ours).all() and relative_rms_error(ours, ref) < 1e-5, name


@pytest.mark.parametrize("variant", ["two-pass", "one-pass"])
def test_non_finite_values_in_future_keys_of_a_selected_block_stay_out(monkeypatch, variant):
    """NaN/Inf in K/V of keys that every row selecting their block sees as future (the last block, keys
    48..55, selected only by the row at position 48: keys 49..55) change nothing, and those keys get
    dk = dv = 0 (written: every output nsa_iree allocates starts as NaN here)."""
    import nsa_iree.api as api

    empty = api._empty
    monkeypatch.setattr(api, "_empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    q, k, v, idx = inputs()
    last = (N - 1) // BS
    rows = torch.arange(M).view(1, -1, 1, 1) + (N - M)               # each row's key position
    idx = torch.where((idx == last) & (rows > 48), torch.full_like(idx, -1), idx)
    idx[:, 32, :, 0] = last                                             # the row at position 48
    do = torch.randn(B, M, H, DV, generator=torch.Generator().manual_seed(3))
    clean = _reference_grads(q, k, v, idx, do)
    k[:, 49:], v[:, 49:] = float("nan"), float("inf")
    o, dq, dk, dv = _grads(q, k, v, idx, do, variant)
    for name, ours, ref in (("o", o, clean[0]), ("dq", dq, clean[1]), ("dk", dk, clean[2]), ("dv", dv, clean[3])):
        assert torch.isfinite(ours).all() and relative_rms_error(ours, ref) < 1e-5, name
    assert torch.count_nonzero(dk[:, 49:]) == 0 and torch.count_nonzero(dv[:, 49:]) == 0


@pytest.mark.parametrize("variant", ["two-pass", "one-pass"])
def test_a_nan_query_row_reaches_only_its_own_outputs_and_blocks(variant):
    """A NaN in one query row makes that row's o / dq NaN and may reach the dk / dv of the block it selected,
    nothing else (the two-pass dk/dv pieces pad with a row of the same block's list, never an unrelated row)."""
    q, k, v, idx = inputs()
    idx[0, 0] = torch.tensor([1, -1, 99])                               # row 0 selects only block 1
    do = torch.randn(B, M, H, DV, generator=torch.Generator().manual_seed(3))
    clean = _reference_grads(q, k, v, idx, do)
    q[0, 0] = float("nan")
    o, dq, dk, dv = _grads(q, k, v, idx, do, variant)
    rows = torch.ones(B, M, dtype=torch.bool)
    rows[0, 0] = False
    keys = torch.ones(B, N, dtype=torch.bool)
    keys[0, BS:2 * BS] = False
    for name, ours, ref, keep in (("o", o, clean[0], rows), ("dq", dq, clean[1], rows), ("dk", dk, clean[2], keys),
                                  ("dv", dv, clean[3], keys)):
        assert torch.isfinite(ours[keep]).all() and relative_rms_error(ours[keep], ref[keep]) < 1e-5, name
    assert torch.isnan(o[0, 0]).all()


BAD_INPUTS = {
    "q_rank": (lambda q, k, v, i: (q[0], k, v, i, BS), ValueError, "q must have shape [B, M, H, D]"),
    "k_batch": (lambda q, k, v, i: (q, k[:1], v, i, BS), ValueError, "k must have shape [B, N, G, D]"),
    "v_length": (lambda q, k, v, i: (q, k, v[:, :-1], i, BS), ValueError, "v must have shape [B, N, G, Dv]"),
    "k_head_dim": (lambda q, k, v, i: (q, k[..., :-1], v, i, BS), ValueError, "k must have shape"),
    "heads_not_multiple": (lambda q, k, v, i: (q[:, :, :3], k, v, i, BS), ValueError,
                           "multiple of the number of kv heads"),
    "indices_shape": (lambda q, k, v, i: (q, k, v, i[:, :-1], BS), ValueError,
                      "block_indices must have shape [B, M, G, T]"),
    "indices_float": (lambda q, k, v, i: (q, k, v, i.float(), BS), TypeError, "block_indices must be int32 or int64"),
    "dtype_mismatch": (lambda q, k, v, i: (q, k.half(), v, i, BS), TypeError, "k must have q's dtype"),
    "unsupported_dtype": (lambda q, k, v, i: (q.double(), k.double(), v.double(), i, BS), TypeError,
                          "q must be float32, float16 or bfloat16"),
    "block_size_zero": (lambda q, k, v, i: (q, k, v, i, 0), ValueError, "block_size must be a positive int"),
    "counts_shape": (lambda q, k, v, i: (q, k, v, i, BS, torch.ones(B, M, dtype=torch.int32)), ValueError,
                     "block_counts must have shape [B, M, G]"),
    "not_a_tensor": (lambda q, k, v, i: (q.numpy(), k, v, i, BS), TypeError, "q must be a torch.Tensor"),
    "scale_string": (lambda q, k, v, i: (q, k, v, i, BS, None, "x"), TypeError,
                     "scale must be None or a float, got str"),
    "scale_nan": (lambda q, k, v, i: (q, k, v, i, BS, None, float("nan")), ValueError, "scale must be a finite float"),
    "scale_inf": (lambda q, k, v, i: (q, k, v, i, BS, None, float("-inf")), ValueError, "scale must be a finite float"),
    "scale_past_float": (lambda q, k, v, i: (q, k, v, i, BS, None, 10**400), ValueError, "scale must be a finite"),
    "scale_tensor": (lambda q, k, v, i: (q, k, v, i, BS, None, torch.tensor(0.25, device="meta")), TypeError,
                     "scale must be None or a float, got a tensor"),
}


@pytest.mark.parametrize("case", BAD_INPUTS, ids=list(BAD_INPUTS))
def test_bad_forward_inputs_raise_before_any_compile(case, monkeypatch):
    import nsa_iree.api as api

    # Both the compiler and the (lru-cached) artifact lookup in front of it: a cached spec would skip the first.
    monkeypatch.setattr(api, "compile_artifact", lambda *a, **k: pytest.fail("compiled on bad input"))
    monkeypatch.setattr(api, "_artifact_path", lambda *a, **k: pytest.fail("looked up a kernel on bad input"))
    make, error, message = BAD_INPUTS[case]
    with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]")):
        nsa_iree.selection_attention_fwd(*make(*inputs()))


def test_tensors_on_different_devices_are_refused_before_any_launch():
    q, k, v, idx = inputs()
    with pytest.raises(ValueError, match="k is on meta but q is on cpu"):
        nsa_iree.selection_attention_fwd(q, k.to("meta"), v, idx, BS)
    with pytest.raises(ValueError, match="block_indices is on meta"):
        nsa_iree.selection_attention_fwd(q, k, v, idx.to("meta"), BS)


def test_meta_tensors_take_the_shape_only_path(monkeypatch):
    """Meta tensors (a model built on the meta device, shape inference): every public function returns outputs of
    the right shapes and dtypes without compiling or running anything, autograd and cu_seqlens included."""
    import nsa_iree.api as api

    monkeypatch.setattr(api, "compile_artifact", lambda *a, **k: pytest.fail("compiled for meta tensors"))
    monkeypatch.setattr(api, "_artifact_path", lambda *a, **k: pytest.fail("looked up a kernel for meta tensors"))
    q, k, v, idx = (t.to("meta") for t in inputs())
    counts = torch.full((B, M, G), 2, device="meta")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = nsa_iree.selection_attention(*leaves, idx, BS, counts, 0.5)
    o.sum().backward()
    assert o.device.type == "meta" and o.shape == (B, M, H, DV)
    assert [t.grad.shape for t in leaves] == [q.shape, k.shape, v.shape]
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
    assert lse.shape == (B, H, M) and lse.dtype == torch.float32 and lse.device.type == "meta"
    grads = nsa_iree.selection_attention_bwd(q, k, v, o, lse, o, idx, BS, variant="one-pass")
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    packed = [t[:1, :, :, :].narrow(1, 0, M) for t in (q, k[:, :M], v[:, :M], idx)]
    cu_seqlens = torch.tensor([0, 7, M], dtype=torch.int32, device="meta")
    assert nsa_iree.selection_attention(*packed, BS, cu_seqlens=cu_seqlens).shape == (1, M, H, DV)


def test_bad_backward_inputs():
    q, k, v, idx = inputs()
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
    with pytest.raises(ValueError, match=r"lse must have shape \[B, H, M\]"):
        nsa_iree.selection_attention_bwd(q, k, v, o, lse[:, :, 1:], o, idx, BS)
    with pytest.raises(TypeError, match="lse must be float32"):
        nsa_iree.selection_attention_bwd(q, k, v, o, lse.double(), o, idx, BS)
    with pytest.raises(ValueError, match=r"do must have shape \[B, M, H, Dv\]"):
        nsa_iree.selection_attention_bwd(q, k, v, o, lse, o[:, 1:], idx, BS)
    with pytest.raises(ValueError, match="variant must be one of"):
        nsa_iree.selection_attention_bwd(q, k, v, o, lse, o, idx, BS, variant="three-pass")
    with pytest.raises(ValueError, match="variant must be one of"):
        nsa_iree.selection_attention(q, k, v, idx, BS, variant="bogus")


def test_every_stage_takes_its_scratch_memory_from_torch(monkeypatch):
    """Each stage call gets a torch byte tensor sized by the module's own query; the dk/dv call's holds at
    least the f32 partial sums of every piece (pieces x BS x (D + Dv) x 4 bytes)."""
    from nsa_iree import runtime

    calls, storage = [], {}
    original_call, original_storage = runtime.Module.call, runtime.Module._transient_storage

    def call(self, name, *args, **kwargs):
        calls.append(name)
        return original_call(self, name, *args, **kwargs)

    def transient_storage(self, size_fn, values, *rest):
        workspace = original_storage(self, size_fn, values, *rest)
        assert isinstance(workspace, torch.Tensor) and workspace.dtype == torch.uint8
        storage[calls[-1]] = workspace.numel()
        return workspace

    monkeypatch.setattr(runtime.Module, "call", call)
    monkeypatch.setattr(runtime.Module, "_transient_storage", transient_storage)
    q, k, v, idx = inputs()
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
    nsa_iree.selection_attention_bwd(q, k, v, o, lse, torch.randn_like(o), idx, BS)
    assert set(storage) == set(calls) == {"selection_attention_fwd", "selection_attention_delta",
                                          "selection_attention_dq", "invert_block_indices",
                                          "selection_attention_dkdv"}
    spec = nsa_iree.api.describe(q, k, v, idx, BS)
    module = nsa_iree.api.kernels(spec, "two-pass", q.device)
    entries = module.call("invert_block_indices", nsa_iree.api.effective_block_indices(idx, None), N)[0]
    pieces = entries.shape[0]
    assert storage["selection_attention_dkdv"] >= pieces * BS * (D + DV) * 4


def test_transient_sizes_are_queried_once_per_shape():
    """The size queries run on the first call of a shape only; another length asks again and gets its own."""
    q, k, v, idx = inputs()
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
    module = nsa_iree.api.kernels(nsa_iree.api.describe(q, k, v, idx, BS), "two-pass", q.device)

    class CountingContext:
        def __init__(self, context):
            self.context, self.queries = context, []

        def invoke(self, fn, inputs, outputs):
            if fn.name.endswith("_transients_size"):
                self.queries.append(fn.name)
            return self.context.invoke(fn, inputs, outputs)

    counting = module.context = CountingContext(module.context)
    try:
        module._transient_sizes.clear()
        first = nsa_iree.selection_attention_bwd(q, k, v, o, lse, torch.ones_like(o), idx, BS)
        assert sorted(counting.queries) == sorted(f"{name}_transients_size" for name in (
            "selection_attention_delta", "selection_attention_dq", "invert_block_indices", "selection_attention_dkdv"))
        again = nsa_iree.selection_attention_bwd(q, k, v, o, lse, torch.ones_like(o), idx, BS)
        assert len(counting.queries) == 4
        for a, b in zip(first, again):
            assert torch.equal(a, b)
        sizes = dict(module._transient_sizes)
        shorter = [t[:, : M // 2] for t in (q, idx)]
        o2, lse2 = nsa_iree.selection_attention_fwd(shorter[0], k, v, shorter[1], BS)
        nsa_iree.selection_attention_bwd(shorter[0], k, v, o2, lse2, torch.ones_like(o2), shorter[1], BS)
        assert len(counting.queries) == 8
        inversion = [size for key, size in module._transient_sizes.items()
                     if key[0] == "invert_block_indices_transients_size"]
        assert len(inversion) == 2 and inversion[0] != inversion[1], sizes
    finally:
        module.context = counting.context


def test_import_nsa_iree_exposes_what_the_readme_uses():
    """`import nsa_iree` alone gives the submodules and helpers the README and docs name."""
    import subprocess
    import sys

    script = ("import nsa_iree\n"
              "for name in nsa_iree.__all__: getattr(nsa_iree, name)\n"
              "nsa_iree.selection.realistic_block_indices, nsa_iree.selection.uniform_block_indices\n"
              "nsa_iree.reference.selection_attention_reference, nsa_iree.reference.key_weights\n"
              "nsa_iree.testing.relative_rms_error, nsa_iree.testing.TOLERANCE\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_recipe_answers_follow_the_recipe_directory(tmp_path, monkeypatch):
    """The per-spec answers read from a recipe (rows per piece, the loaded spec, the kernel forms) are kept per
    recipe directory: a tuning sweep that points NSA_IREE_PIPELINES_DIR elsewhere within a process gets the other
    recipe's (bench/sweep.py)."""
    import shutil

    from nsa_iree import api
    from nsa_iree.recipes import PIPELINES_DIR
    from nsa_iree.spec import KernelSpec

    spec = KernelSpec(heads=4, kv_heads=2, head_dim=16, value_dim=16, block_size=16, num_blocks=2, dtype="f32")
    packaged = api._rows_per_piece(spec)
    other = tmp_path / "recipes"
    shutil.copytree(PIPELINES_DIR, other)
    text = (other / "cpu.toml").read_text()
    assert f"rows_per_piece = {packaged}\n" in text
    doubled = text.replace(f"rows_per_piece = {packaged}\n", f"rows_per_piece = {2 * packaged}\n")
    (other / "cpu.toml").write_text(doubled)
    monkeypatch.setenv("NSA_IREE_PIPELINES_DIR", str(other))
    assert api._rows_per_piece(spec) == 2 * packaged
    monkeypatch.delenv("NSA_IREE_PIPELINES_DIR")
    assert api._rows_per_piece(spec) == packaged
