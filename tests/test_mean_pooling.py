"""nsa_iree.mean_pooling against the f64 oracle (reference.mean_pooling_reference): values, gradients, packed
sequences, errors (docs/semantics.md, 'The compression branch and block selection'). On the CPU it runs as IREE
dispatches (kernels/common/pooling.mlir, outputs poisoned here); the custom operators pass torch's checks."""

from __future__ import annotations

import pytest
import torch

from conftest import DTYPES

import nsa_iree
from nsa_iree.reference import mean_pooling_reference
from nsa_iree.testing import TOLERANCE, relative_rms_error

pytestmark = pytest.mark.usefixtures("poisoned_compression_outputs")


# (B, N, G, D, BS): N a multiple of BS, not one, below one block, one token, none.
SHAPES = {
    "whole_blocks": (2, 256, 2, 32, 64),
    "partial_last_block": (1, 203, 4, 16, 64),
    "shorter_than_a_block": (1, 40, 1, 64, 64),
    "one_token": (3, 1, 2, 8, 16),
    "no_tokens": (1, 0, 2, 8, 16),
    "block_of_one": (1, 7, 1, 4, 1),
}

# packed sequence lengths, BS = 16: empty ones, shorter than a block, exact blocks, the aligned shortcut
PACKED = {
    "mixed": [0, 1, 15, 16, 17, 50],
    "empty_first_and_last": [0, 33, 0],
    "whole_blocks_then_partial": [32, 16, 7],
    "one_sequence": [45],
}


@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES.values(), ids=list(SHAPES))
def test_mean_pooling_matches_the_reference(shape, dtype):
    batch, n, groups, dim, bs = shape
    x = torch.randn(batch, n, groups, dim).to(DTYPES[dtype]).requires_grad_()
    out = nsa_iree.mean_pooling(x, bs)
    ref = mean_pooling_reference(x.detach(), bs)
    assert out.dtype == x.dtype and out.shape == (batch, -(-n // bs), groups, dim)
    assert relative_rms_error(out.double(), ref) <= TOLERANCE[x.dtype]
    if out.numel():
        dout = torch.randn_like(out)
        out.backward(dout)
        xr = x.detach().double().requires_grad_()
        mean_pooling_reference(xr, bs).backward(dout.double())
        assert relative_rms_error(x.grad.double(), xr.grad) <= TOLERANCE[x.dtype]


@pytest.mark.parametrize("lengths", PACKED.values(), ids=list(PACKED))
def test_packed_sequences_are_pooled_alone(lengths):
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    x = torch.randn(1, sum(lengths), 2, 8).requires_grad_()
    out = nsa_iree.mean_pooling(x, 16, cu_seqlens=cu)
    xr = x.detach().double().requires_grad_()
    ref = mean_pooling_reference(xr, 16, cu)
    assert out.shape == ref.shape and relative_rms_error(out.double(), ref.detach()) <= TOLERANCE[torch.float32]
    # each sequence's blocks are what that sequence pools to alone
    blocks = [nsa_iree.mean_pooling(x[:, a:b], 16) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
    assert torch.allclose(out, torch.cat(blocks, dim=1), rtol=1e-6, atol=1e-7)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout.double())
    assert relative_rms_error(x.grad.double(), xr.grad) <= TOLERANCE[torch.float32]

def test_operators_pass_opcheck(monkeypatch):
    """torch's checks of the pooling's custom ops (schema, fake, autograd registration, AOT dispatch), with a short
    last block."""
    monkeypatch.undo()                     # opcheck compares runs: real (unpoisoned) buffers
    x, counts = torch.randn(2, 70, 2, 8), torch.tensor([16.0, 16.0, 16.0, 16.0, 6.0])
    torch.library.opcheck(torch.ops.nsa_iree.block_means, (x.requires_grad_(), counts, 16))
    torch.library.opcheck(torch.ops.nsa_iree.block_means_bwd, (torch.randn(2, 5, 2, 8).requires_grad_(), counts,
                                                               70, 16))


def test_the_gradient_is_differentiable():
    """Differentiating through the gradient (create_graph, as a gradient penalty does): the gradient of
    sum(w * dx) with respect to dy, dx the backward of dy, is the pooling of w, as for the reference."""
    w, dy = torch.randn(1, 45, 2, 8), torch.randn(1, 3, 2, 8)
    found = []
    for pool, dtype in ((nsa_iree.mean_pooling, torch.float32), (mean_pooling_reference, torch.float64)):
        x, d_out = torch.randn(1, 45, 2, 8, dtype=dtype).requires_grad_(), dy.to(dtype).requires_grad_()
        (dx,) = torch.autograd.grad(pool(x, 16), x, d_out, create_graph=True)
        (d_dy,) = torch.autograd.grad((dx * w.to(dtype)).sum(), d_out)
        found.append((dx, d_dy))
    (dx, d_dy), (dx_ref, d_dy_ref) = found
    assert relative_rms_error(dx.double(), dx_ref.detach()) <= TOLERANCE[torch.float32]
    assert relative_rms_error(d_dy.double(), d_dy_ref) <= TOLERANCE[torch.float32]
    assert relative_rms_error(d_dy.double(), mean_pooling_reference(w.double(), 16)) <= TOLERANCE[torch.float32]



def test_torch_compile_fullgraph_equals_eager():
    x = torch.randn(1, 100, 2, 16)

    def pooled(x):
        return nsa_iree.mean_pooling(x, 32).square().sum()

    grads = []
    for fn in (pooled, torch.compile(pooled, fullgraph=True, backend="aot_eager")):
        leaf = x.clone().requires_grad_()
        fn(leaf).backward()
        grads.append(leaf.grad)
    assert torch.equal(*grads)


BAD = {
    "x_rank": (dict(x=torch.zeros(1, 4, 8)), "x"),
    "x_integer": (dict(x=torch.zeros(1, 4, 1, 8, dtype=torch.int32)), "x"),
    "block_size_zero": (dict(block_size=0), "block_size"),
    "block_size_float": (dict(block_size=16.0), "block_size"),
    "cu_seqlens_not_ending_at_n": (dict(cu_seqlens=torch.tensor([0, 5], dtype=torch.int32)), "cu_seqlens"),
    "cu_seqlens_with_batch_2": (dict(x=torch.zeros(2, 8, 1, 4), cu_seqlens=torch.tensor([0, 8], dtype=torch.int32)),
                                "cu_seqlens"),
}


@pytest.mark.parametrize("override, name", BAD.values(), ids=list(BAD))
def test_bad_input_names_the_argument(override, name):
    args = dict(x=torch.zeros(1, 8, 1, 4), block_size=4, cu_seqlens=None) | override
    with pytest.raises((TypeError, ValueError), match=name):
        nsa_iree.mean_pooling(args.pop("x"), args.pop("block_size"), **args)
