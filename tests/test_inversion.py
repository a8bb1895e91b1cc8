"""The two-pass inversion stage on its own: its lists equal the directly computed layout, bit for bit."""

from __future__ import annotations

import pytest
import torch

from nsa_iree.api import describe, kernels
from nsa_iree.recipes import load_recipe
from nsa_iree.reference import block_lists_reference
from nsa_iree.selection import realistic_block_indices

ROWS_PER_PIECE = load_recipe("cpu").rows_per_piece

CASES = {
    # (B, M, N, G, T, BS, selection)
    "random": (2, 150, 170, 2, 4, 16, "random"),
    "realistic_long_lists": (1, 300, 300, 1, 6, 16, "realistic"),
    "single_row": (1, 1, 9, 1, 3, 8, "zeros"),
    "m_lt_n_partial_block": (2, 33, 100, 2, 5, 16, "random"),
    # Every row selects block 0: its list is two full pieces and one row.
    "piece_boundary": (1, 2 * ROWS_PER_PIECE + 1, 2 * ROWS_PER_PIECE + 1, 1, 2, 64, "zeros"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_inversion_matches_the_direct_layout(case):
    b, m, n, g, t, bs, selection = CASES[case]
    gen = torch.Generator().manual_seed(7)
    num_blocks = -(-n // bs)
    if selection == "random":
        idx = torch.randint(-2, num_blocks + 2, (b, m, g, t), generator=gen, dtype=torch.int32)
        idx[:, ::5, :, 1] = idx[:, ::5, :, 0]                            # duplicates
    elif selection == "realistic":
        idx = realistic_block_indices(b, m, n, g, t, bs, generator=gen)
    else:
        idx = torch.zeros(b, m, g, t, dtype=torch.int32)
    q, k, v = torch.zeros(b, m, 2 * g, 8), torch.zeros(b, n, g, 8), torch.zeros(b, n, g, 8)
    module = kernels(describe(q, k, v, idx, bs), "two-pass", q.device)
    got = [module.device.export_tensor(x).clone() for x in module.call("invert_block_indices", idx, n)]
    want = block_lists_reference(idx, bs, n, ROWS_PER_PIECE)
    for name, a, e in zip(("entries", "piece_start", "piece_count"), got, want):
        assert a.shape == e.shape and torch.equal(a, e), name


def test_a_fixed_block_list_is_inverted_once_per_version(monkeypatch):
    """backward_into's fixed_blocks (the window's band, the compressed attention's tiles): the inversion of one
    block-index tensor is made on its first backward, reused by the next (the same gradients, bit for bit, as a
    backward that inverts it), and made again after the tensor changes in place."""
    from nsa_iree import api, runtime

    b, m, n, g, t, bs = 1, 96, 96, 1, 3, 16
    gen = torch.Generator().manual_seed(3)
    q, do = torch.randn(b, m, 2, 16, generator=gen), torch.randn(b, m, 2, 16, generator=gen)
    k, v = torch.randn(b, n, g, 16, generator=gen), torch.randn(b, n, g, 16, generator=gen)
    idx = realistic_block_indices(b, m, n, g, t, bs, generator=gen)
    o, lse = api.selection_attention_fwd(q, k, v, idx, bs)
    inversions = []
    call = runtime.Module.call
    monkeypatch.setattr(runtime.Module, "call", lambda self, name, *args, **kw: (
        inversions.append(name) if name == "invert_block_indices" else None, call(self, name, *args, **kw))[1])

    def grads(fixed):
        out = [torch.full_like(x, float("nan")) for x in (q, k, v)]
        api.backward_into(*out, q, k, v, o, lse, do, idx, bs, q.shape[-1] ** -0.5, "two-pass", fixed_blocks=fixed)
        return out

    inverted_each_time = grads(False)
    counts = []
    for change in (False, False, True, False):
        if change:
            idx.add_(0)                    # written in place: a new version
        assert all(torch.equal(a, e) for a, e in zip(grads(True), inverted_each_time))
        counts.append(len(inversions))
    assert counts == [2, 2, 3, 3]          # the first backward's own inversion, then one per version
    with torch.inference_mode():           # an inference tensor counts no versions: inverted every time
        idx = idx.clone()
    for _ in range(2):
        assert all(torch.equal(a, e) for a, e in zip(grads(True), inverted_each_time))
    assert len(inversions) == 5


def test_the_forward_over_the_pieces_hands_its_lists_to_the_backward(monkeypatch):
    """Where the forward runs over the block lists' pieces (the hopper target's small groups; here a recording module
    stands in for its kernels) it writes the lists into torch buffers of the inversion's shapes, and the backward of
    the same block-index tensor takes them (selection_attention_backward_lists, no inversion) while that tensor keeps
    its version and the keys are the same; changed in place, another tensor, other keys, or a group split (the
    indices repeated), the backward inverts; freed, nothing of it is kept."""
    import gc

    from nsa_iree import api

    calls = []

    class Recording:
        device = api.device_for(torch.device("cpu"))

        def call(self, name, *args, **kwargs):
            calls.append((name, args))
            return []

    monkeypatch.setattr(api, "kernels", lambda spec, variant, device: Recording())
    for name in ("forward_over_pieces", "dense_backward", "dq_with_dkdv"):
        monkeypatch.setattr(api, name, lambda spec: True)
    b, m, n, g, t, bs = 2, 150, 170, 2, 4, 16
    gen = torch.Generator().manual_seed(5)
    q, do = torch.randn(b, m, 2 * g, 16, generator=gen), torch.randn(b, m, 2 * g, 16, generator=gen)
    k, v = torch.randn(b, n, g, 16, generator=gen), torch.randn(b, n, g, 16, generator=gen)
    idx = realistic_block_indices(b, m, n, g, t, bs, generator=gen)
    o, lse = torch.empty(b, m, 2 * g, 16), torch.empty(b, 2 * g, m)
    grads = [torch.empty_like(x) for x in (q, k, v)]

    def forward(block_indices, keys=k):
        api.forward_into(o, lse, q, keys, keys, block_indices, bs, 0.25)
        name, args = calls[-1]
        assert name == "selection_attention_fwd" and len(args) == 10
        return args[7:]

    def backward(block_indices, keys=k):
        api.backward_into(grads[0], *(torch.empty_like(keys) for _ in range(2)), q, keys, keys, o, lse, do,
                          block_indices, bs, 0.25, "two-pass")
        return calls[-1]

    lists = forward(idx)
    want = block_lists_reference(idx, bs, n, ROWS_PER_PIECE)
    assert [x.shape for x in lists] == [x.shape for x in want]
    assert all(x.dtype == torch.int32 for x in lists)
    for _ in range(2):
        name, args = backward(idx)
        assert name == "selection_attention_backward_lists" and all(a is e for a, e in zip(args[7:10], lists))
    assert backward(idx.clone())[0] == "selection_attention_backward"
    assert backward(idx, k[:, :160])[0] == "selection_attention_backward"     # other keys: other lists
    api.backward_into(*grads, q, k, v, o, lse, do, idx, bs, 0.25, "two-pass", key_stride=bs)
    assert calls[-1][0] == "selection_attention_backward"                     # keys every bs positions: others
    api.backward_into(*grads, q, k, v, o, lse, do, idx, bs // 2, 0.25, "two-pass")
    assert calls[-1][0] == "selection_attention_backward"                     # another block size: others
    idx.add_(0)                                     # written in place: a new version
    assert backward(idx)[0] == "selection_attention_backward"
    forward(idx)
    assert backward(idx)[0] == "selection_attention_backward_lists"
    kept = len(Recording.device._kept)
    del idx, lists, args
    calls.clear()                                   # (the recorded calls hold idx too)
    gc.collect()
    assert len(Recording.device._kept) == kept - 1
    # a group split (each kv head's query heads as two groups) runs on repeated indices: nothing kept for idx
    loaded = api.loaded_spec
    monkeypatch.setattr(api, "loaded_spec", lambda spec, variant: (loaded(spec, variant)[0], 2))
    idx = realistic_block_indices(b, m, n, g, t, bs, generator=gen)
    forward(idx)
    # (the repeated indices the split made are alive in `calls`: had they been kept, the store would have grown)
    assert len(Recording.device._kept) == kept - 1
    assert backward(idx)[0] == "selection_attention_backward"
