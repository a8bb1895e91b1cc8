"""Benchmarks: nsa_iree's selection attention against dense SDPA, fla's parallel_nsa (when fla is importable) and a
torch-eager version; with --branch, the whole layer's attention (nsa, with and without the window, against fla's
parallel_nsa and an eager layer), the sliding window (against FlexAttention and an eager window), the compression
branch (mean pooling + compressed attention, against fla's mean_pooling + parallel_nsa_compression and an eager
version) or the block selection (select_blocks against fla's parallel_nsa_topk and an eager top-k). Installed with
the package: `nsa-iree bench`; the lab scripts under bench/ build on it.

    nsa-iree bench --device cuda --seq 8192 16384 32768 65536      # the H200 run
    nsa-iree bench --device cpu --config cpu --seq 1024 4096 --selection realistic --repeats 5  # the CPU run
    nsa-iree bench --smoke                                          # tiny CPU run (the CI smoke test)
    nsa-iree bench --device cuda --seq 65536 --selection realistic packed  # packed documents (cu_seqlens)
    nsa-iree bench --device cuda --branch layer --seq 8192 65536    # nsa against fla's parallel_nsa
    nsa-iree bench --device cpu --config cpu --branch layer --window 128 --seq 4096 --repeats 3   # the CPU layer
    nsa-iree bench --device cpu --config cpu --branch compression --seq 4096    # pooling + compressed attention
    nsa-iree bench --device cuda --config fla-default --branch select --seq 65536   # select_blocks against fla's

Selection "packed": each problem of `seq` tokens is documents of --doc-lengths MIN MAX tokens (uniform draws,
the last one cut to fit) packed into one sequence with cu_seqlens, a realistic selection inside every
document; nsa_iree and fla get the same cu_seqlens (dense SDPA would attend across documents: not run). The
row "nsa_iree two-pass, padded given" times the same kernels on inputs already in nsa_iree's block-aligned
layout: the difference to "nsa_iree two-pass" is what the packed call adds (its gathers and scatters).

Every configuration is checked for correctness at a small size (against fla when importable, else the f64
reference) before it is timed. Timings: warm-up, then the median of --repeats runs, each synchronised
(IREE runs on its own CUDA stream: the runtime waits for torch's stream before a call, and a call returns
when its results are ready). Results go to --out (default ./nsa_iree_results, under the current directory;
the checked-in tables are in bench/results/): a Markdown table and a JSON record stamped with date, machine
and versions, and a PNG plot (time against sequence length) when matplotlib is present.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple

import torch

import nsa_iree
from nsa_iree.spec import target_cpu_from_environment
from nsa_iree.testing import relative_rms_error
from nsa_iree.reference import selection_attention_reference
from nsa_iree.selection import local_block_indices, realistic_block_indices, uniform_block_indices

DEFAULT_OUT = "nsa_iree_results"                # relative: under the current directory

CONFIGS = {
    # anchors.md: the configuration fla and dense SDPA were measured in on the H200.
    "anchors": dict(heads=64, kv_heads=4, head_dim=128, value_dim=128, block_size=64, num_blocks=16, dtype="bf16"),
    # The NSA paper's head layout.
    "paper": dict(heads=64, kv_heads=4, head_dim=192, value_dim=128, block_size=64, num_blocks=16, dtype="bf16"),
    # Fewer heads per group than the MMA tile's 16 rows (the anchors layout with 32, 16, 8 and 4 query heads):
    # what the padded tiles cost on GPUs.
    "hpg8": dict(heads=32, kv_heads=4, head_dim=128, value_dim=128, block_size=64, num_blocks=16, dtype="bf16"),
    "hpg4": dict(heads=16, kv_heads=4, head_dim=128, value_dim=128, block_size=64, num_blocks=16, dtype="bf16"),
    "hpg2": dict(heads=8, kv_heads=4, head_dim=128, value_dim=128, block_size=64, num_blocks=16, dtype="bf16"),
    "hpg1": dict(heads=4, kv_heads=4, head_dim=128, value_dim=128, block_size=64, num_blocks=16, dtype="bf16"),
    # More heads per group than the tile's 16 rows (fla's own tests' 32 heads over 1 or 2 kv heads; MQA-style 64):
    # the forward runs them on the wide kernel (kernels.WIDE), the backward as 2 or 4 groups of 16 (group_split).
    "hpg32": dict(heads=64, kv_heads=2, head_dim=128, value_dim=128, block_size=64, num_blocks=16, dtype="bf16"),
    "hpg64": dict(heads=64, kv_heads=1, head_dim=128, value_dim=128, block_size=64, num_blocks=16, dtype="bf16"),
    # fla's default NativeSparseAttention layer layout.
    "fla-default": dict(heads=64, kv_heads=4, head_dim=64, value_dim=64, block_size=64, num_blocks=16, dtype="bf16"),
    # fla's default head size on one kv head (16 query heads per kv head: the NVIDIA forward's tile).
    "fla-d64-g1": dict(heads=16, kv_heads=1, head_dim=64, value_dim=64, block_size=64, num_blocks=16, dtype="bf16"),
    # What fits this project's 2-core CPU (anchors.md, CPU baseline).
    "cpu": dict(heads=16, kv_heads=1, head_dim=64, value_dim=64, block_size=64, num_blocks=16, dtype="f32"),
    "tiny": dict(heads=16, kv_heads=1, head_dim=32, value_dim=32, block_size=16, num_blocks=4, dtype="f32"),
}
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
SELECTIONS = {"realistic": realistic_block_indices, "uniform": uniform_block_indices, "local": local_block_indices}
PACKED = "packed"                               # documents packed with cu_seqlens (make_packed_problem)
DOC_LENGTHS = (1024, 16384)


def selection_flops(cfg, seq):
    """Forward FLOPs of the selection branch (anchors.md): 2 * M * H * (D + Dv) * T * BS; backward ~2.5x."""
    return 2 * seq * cfg["heads"] * (cfg["head_dim"] + cfg["value_dim"]) * cfg["num_blocks"] * cfg["block_size"]


def dense_flops(cfg, seq):
    return 2 * cfg["heads"] * (cfg["head_dim"] + cfg["value_dim"]) * seq * seq / 2


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats, warmup=2):
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class PeakMemory:
    """Peak device memory in use (all allocators: torch's and IREE's), sampled from cudaMemGetInfo."""

    def __init__(self, device):
        self.device, self.peak, self._stop = device, 0, threading.Event()

    def __enter__(self):
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            self.base = total - free
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def _poll(self):
        while not self._stop.is_set():
            free, total = torch.cuda.mem_get_info(self.device)
            self.peak = max(self.peak, total - free - self.base)
            time.sleep(0.0005)

    def __exit__(self, *exc):
        self._stop.set()
        if self.device.type == "cuda":
            self._thread.join()


def make_problem(cfg, seq, selection, device, seed=0, batch=1, generate_on_device=False):
    """q, k, v, do (cfg's dtype) and block indices [batch, seq, G, T] on `device`.

    generate_on_device draws them with a generator on `device` instead of the host: the selection's scores
    are [B, M, G, NB] (2G floats at 128k tokens with B = 2), too slow to rank on the host.
    """
    where = device if generate_on_device else "cpu"
    gen = torch.Generator(device=where).manual_seed(seed)
    dtype = DTYPES[cfg["dtype"]]
    h, g, d, dv = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["value_dim"]
    q, k, v, do = (torch.randn(batch, seq, heads, dim, generator=gen, device=where).to(device=device, dtype=dtype)
                   for heads, dim in ((h, d), (g, d), (g, dv), (h, dv)))
    idx = SELECTIONS[selection](batch, seq, seq, g, cfg["num_blocks"], cfg["block_size"], generator=gen,
                                device=where).to(device)
    return q, k, v, do, idx


def document_lengths(total, shortest, longest, generator):
    """Lengths drawn uniformly in [shortest, longest] until they cover `total` tokens, the last one cut."""
    lengths = []
    while sum(lengths) < total:
        n = int(torch.randint(shortest, longest + 1, (1,), generator=generator))
        lengths.append(min(n, total - sum(lengths)))
    return lengths


def make_packed_problem(cfg, seq, device, doc_lengths=DOC_LENGTHS, seed=0):
    """q, k, v, do [1, seq, ...], block indices [1, seq, G, T] (realistic inside each document, ids relative to
    it) and cu_seqlens [S + 1] int32, for documents of doc_lengths (min, max) tokens packed into `seq` tokens."""
    gen = torch.Generator().manual_seed(seed)
    lengths = document_lengths(seq, *doc_lengths, gen)
    dtype = DTYPES[cfg["dtype"]]
    h, g, d, dv = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["value_dim"]
    q, k, v, do = (torch.randn(1, seq, heads, dim, generator=gen).to(device=device, dtype=dtype)
                   for heads, dim in ((h, d), (g, d), (g, dv), (h, dv)))
    idx = torch.cat([realistic_block_indices(1, n, n, g, cfg["num_blocks"], cfg["block_size"], generator=gen)
                     for n in lengths], dim=1).to(device)
    cu_seqlens = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], dtype=torch.int32,
                              device=device)
    return q, k, v, do, idx, cu_seqlens


def fla_function():
    try:
        from fla.ops.nsa.parallel import ParallelNSAFunction
    except Exception:  # noqa: BLE001 - fla is optional
        return None
    return ParallelNSAFunction


# --- implementations: each returns (forward callable, backward callable) --------------------------------

def nsa_iree_impl(variant):
    def build(cfg, q, k, v, do, idx, cu_seqlens=None):
        bs = cfg["block_size"]
        state = {}

        def fwd():
            state["o"], state["lse"] = nsa_iree.selection_attention_fwd(q, k, v, idx, bs, cu_seqlens=cu_seqlens)

        fwd()

        def bwd():
            nsa_iree.selection_attention_bwd(q, k, v, state["o"], state["lse"], do, idx, bs, variant=variant,
                                             cu_seqlens=cu_seqlens)
        return fwd, bwd
    return build


def nsa_iree_padded_impl(cfg, q, k, v, do, idx, cu_seqlens=None):
    """The two-pass kernels on inputs already laid out as a packed call lays them out (nsa_iree.packing), the
    unpacked call: what a packed call costs without its gathers and scatters. Packed problems only."""
    from nsa_iree.api import effective_block_indices
    from nsa_iree.packing import packed_layout

    if cu_seqlens is None:
        raise ValueError("only for the packed selection")
    bs = cfg["block_size"]
    layout = packed_layout(cu_seqlens, q.shape[1], bs)
    global_idx = layout.block_indices(effective_block_indices(idx, None), bs)
    qp, kp, vp, dop = (layout.to_padded(t) for t in (q, k, v, do))
    return nsa_iree_impl("two-pass")(cfg, qp, kp, vp, dop, global_idx)


def sdpa_impl(cfg, q, k, v, do, idx, cu_seqlens=None):
    if cu_seqlens is not None:
        raise ValueError("dense SDPA would attend across the packed documents")
    hpg = cfg["heads"] // cfg["kv_heads"]
    qt = q.transpose(1, 2).detach().requires_grad_(True)
    kt = k.transpose(1, 2).repeat_interleave(hpg, dim=1).detach().requires_grad_(True)
    vt = v.transpose(1, 2).repeat_interleave(hpg, dim=1).detach().requires_grad_(True)
    dot = do.transpose(1, 2)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    state = {}

    def fwd():
        with torch.no_grad():
            sdpa(qt, kt, vt, is_causal=True)

    def bwd():
        if "o" not in state:
            state["o"] = sdpa(qt, kt, vt, is_causal=True)
        state["o"].backward(dot, retain_graph=True)
    bwd()
    return fwd, bwd


def fla_impl(cfg, q, k, v, do, idx, cu_seqlens=None):
    fn = fla_function()
    idx_fla = idx.to(torch.int32)
    scale = cfg["head_dim"] ** -0.5
    cu_fla = None if cu_seqlens is None else cu_seqlens.to(torch.int64)     # fla documents a LongTensor
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    state = {}

    def fwd():
        with torch.no_grad():
            fn.apply(qg, kg, vg, idx_fla, cfg["num_blocks"], cfg["block_size"], scale, cu_fla)

    def bwd():
        if "o" not in state:
            state["o"] = fn.apply(qg, kg, vg, idx_fla, cfg["num_blocks"], cfg["block_size"], scale, cu_fla)
        state["o"].backward(do, retain_graph=True)
    bwd()
    return fwd, bwd


def torch_eager_selection_attention(q, k, v, block_indices, block_size, scale=None):
    """Selection attention the way a torch user would write it (the "what a user would write" baseline):
    gather the selected K/V blocks of every (row, group), mask future keys and skipped slots, softmax, and
    let autograd do the backward.

    q [B, M, H, D], k [B, N, G, D], v [B, N, G, Dv] (any float dtype, computed in it), block_indices
    [B, M, G, T] (negative and future blocks skipped; a block listed twice counts twice). Returns o
    [B, M, H, Dv] (0 for a row that sees no key). Memory: the gathered K and V, [B, M, G, T * BS, D + Dv].
    """
    batch, m_rows, heads, dim = q.shape
    n, groups = k.shape[1], k.shape[2]
    scale = dim ** -0.5 if scale is None else scale
    dev = q.device
    keys = block_indices.long().unsqueeze(-1) * block_size + torch.arange(block_size, device=dev)  # [B, M, G, T, BS]
    position = torch.arange(m_rows, device=dev) + (n - m_rows)                                      # bottom-right
    visible = (block_indices >= 0).unsqueeze(-1) & (keys <= position.view(1, -1, 1, 1, 1))
    keys, visible = keys.clamp(0, n - 1).flatten(-2), visible.flatten(-2)                         # [B, M, G, T*BS]
    b = torch.arange(batch, device=dev).view(-1, 1, 1, 1)
    g = torch.arange(groups, device=dev).view(1, 1, -1, 1)
    k_sel, v_sel = k[b, keys, g], v[b, keys, g]                                                   # [B, M, G, T*BS, D]
    qg = q.view(batch, m_rows, groups, heads // groups, dim)
    s = (qg @ k_sel.transpose(-1, -2)) * scale                                                    # [B, M, G, HPG, T*BS]
    s = s.masked_fill(~visible.unsqueeze(-2), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)                                                  # empty rows: 0
    return (p @ v_sel).reshape(batch, m_rows, heads, v.shape[-1])


def torch_eager_impl(cfg, q, k, v, do, idx, cu_seqlens=None):
    """torch_eager_selection_attention, forward without autograd, backward through autograd."""
    if cu_seqlens is not None:
        raise ValueError("the torch-eager baseline takes no packed documents (cu_seqlens)")
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    state = {}

    def fwd():
        with torch.no_grad():
            torch_eager_selection_attention(*leaves, idx, cfg["block_size"])

    def bwd():
        if "o" not in state:
            state["o"] = torch_eager_selection_attention(*leaves, idx, cfg["block_size"])
        state["o"].backward(do, retain_graph=True)
    bwd()
    return fwd, bwd


def torch_reference_impl(cfg, q, k, v, do, idx, cu_seqlens=None):
    """The package's dense torch reference in f32 (CPU comparisons; it is O(M * N) in memory)."""
    leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    state = {}

    def fwd():
        with torch.no_grad():
            selection_attention_reference(*leaves, idx, cfg["block_size"], compute_dtype=torch.float32,
                                          cu_seqlens=cu_seqlens)

    def bwd():
        if "o" not in state:
            state["o"], _ = selection_attention_reference(*leaves, idx, cfg["block_size"], compute_dtype=torch.float32,
                                                          cu_seqlens=cu_seqlens)
        state["o"].backward(do.float(), retain_graph=True)
    return fwd, bwd


# --- the other branches (--branch layer | window): the whole layer's attention and the sliding window ----------
#
# The same math in eager torch, as a user would write it without nsa_iree (the baselines of the CPU bars): each
# materialises its scores ([B, H, M, C] compressed, [B, H, M, N] for the window), so they are for short sequences.

def torch_eager_mean_pooling(x, block_size):
    """x [B, N, G, D] -> [B, C, G, D], the mean of every block (the last over the tokens it has)."""
    n = x.shape[1]
    c = -(-n // block_size)
    padded = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, c * block_size - n))
    sums = padded.view(x.shape[0], c, block_size, *x.shape[2:]).sum(2)
    counts = (n - torch.arange(c, device=x.device) * block_size).clamp(max=block_size).to(x.dtype)
    return sums / counts.view(1, -1, 1, 1)


def torch_eager_compressed_attention(q, k_cmp, v_cmp, block_size, scale=None):
    """Compressed attention (M = N): scores [B, H, M, C] masked to the complete blocks, softmax, p v; (o, lse)."""
    heads, groups = q.shape[2], k_cmp.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k = k_cmp.repeat_interleave(heads // groups, dim=2)
    v = v_cmp.repeat_interleave(heads // groups, dim=2)
    s = torch.einsum("bmhd,bchd->bhmc", q, k) * scale
    pos = torch.arange(q.shape[1], device=q.device)
    visible = (torch.arange(k.shape[1], device=q.device) + 1) * block_size - 1 <= pos.view(-1, 1)
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    return torch.einsum("bhmc,bchd->bmhd", p, v), lse


def torch_eager_select_blocks(q, k_cmp, lse, slots, block_size, scale):
    """select_blocks (M = N): scores by einsum, probabilities exp(s - lse), the mean over the group, torch.topk
    after the forced blocks (ties by topk, so equal to the kernel only away from ties); [B, M, G, slots] int32."""
    batch, m_rows, heads, _ = q.shape
    groups, num_blocks = k_cmp.shape[2], k_cmp.shape[1]
    dev = q.device
    s = torch.einsum("bmhd,bchd->bmhc", q, k_cmp.repeat_interleave(heads // groups, dim=2)) * scale
    pos = torch.arange(m_rows, device=dev).view(m_rows, 1)
    c = torch.arange(num_blocks, device=dev).view(1, num_blocks)
    own = pos // block_size
    scored = (c >= 1) & (c <= own - 2)                                   # every other selectable block
    p = torch.exp(s - lse.permute(0, 2, 1).unsqueeze(-1))
    score = p.view(batch, m_rows, groups, heads // groups, num_blocks).mean(dim=3)
    score = score.masked_fill(~scored.view(1, m_rows, 1, num_blocks), float("-inf"))
    forced = torch.stack([own, own - 1, torch.zeros_like(own)], dim=-1).view(1, m_rows, 1, 3).expand(
        batch, m_rows, groups, 3)
    nforced = torch.clamp(own + 1, max=3).view(1, m_rows, 1, 1)
    top_v, top_i = score.topk(min(slots, num_blocks), dim=-1)
    top_i = torch.where(torch.isinf(top_v), -1, top_i)
    unused = torch.arange(3, device=dev).view(1, 1, 1, 3) >= nforced
    ranked = torch.cat([forced.masked_fill(unused, -1), top_i], dim=-1)
    # forced first (the unused ones -1 dropped by a stable sort on "is -1"), then the scored ones
    key = (ranked < 0).to(torch.int8)
    ranked = ranked.gather(-1, key.sort(dim=-1, stable=True).indices)
    out = torch.full((batch, m_rows, groups, slots), -1, dtype=torch.int32, device=dev)
    width = min(slots, ranked.shape[-1])
    out[..., :width] = ranked[..., :width].to(torch.int32)
    return out


def torch_eager_window(q, k, v, window, scale=None):
    """Sliding-window attention (M = N): dense scores [B, H, M, N], the band masked, softmax."""
    m_rows, heads, groups = q.shape[1], q.shape[2], k.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    kh, vh = k.repeat_interleave(heads // groups, dim=2), v.repeat_interleave(heads // groups, dim=2)
    s = torch.einsum("bmhd,bnhd->bhmn", q, kh) * scale
    pos = torch.arange(m_rows, device=q.device).view(-1, 1)
    j = torch.arange(k.shape[1], device=q.device).view(1, -1)
    s = s.masked_fill(~((j <= pos) & (j > pos - window)), float("-inf"))
    return torch.einsum("bhmn,bnhe->bmhe", torch.softmax(s, dim=-1), vh)


def torch_eager_nsa(q, k, v, g_cmp, g_slc, g_swa, counts, block_size, window):
    """nsa's gated sum of the branches (M = N), each in eager torch; the blocks selected without gradient."""
    scale = q.shape[-1] ** -0.5
    k_cmp, v_cmp = torch_eager_mean_pooling(k, block_size), torch_eager_mean_pooling(v, block_size)
    o_cmp, lse = torch_eager_compressed_attention(q, k_cmp, v_cmp, block_size, scale)
    with torch.no_grad():
        idx = torch_eager_select_blocks(q, k_cmp, lse.detach(), counts, block_size, scale)
    o_slc = torch_eager_selection_attention(q, k, v, idx, block_size, scale)
    o = o_slc * g_slc.unsqueeze(-1) + o_cmp * g_cmp.unsqueeze(-1)
    return o + torch_eager_window(q, k, v, window, scale) * g_swa.unsqueeze(-1) if window else o


BRANCHES = ("selection", "layer", "window", "compression", "select")
# What a row of each branch times, in the order its builder returns the callables: the forward without autograd and
# the backward of one recorded forward; for the compression branch a whole step instead of the backward (pooling,
# forward and backward from fresh leaves: what a training step runs of it); select_blocks has no backward.
TIMED = {"selection": ("fwd", "bwd"), "layer": ("fwd", "bwd"), "window": ("fwd", "bwd"),
         "compression": ("fwd", "fwd_bwd"), "select": ("fwd",)}
TIMED_LABELS = {"fwd": "fwd", "bwd": "bwd", "fwd_bwd": "fwd + bwd"}


def make_branch_problem(cfg, seq, device, seed=0):
    """q [1, seq, H, D], k [1, seq, G, D], v [1, seq, G, Dv], do [1, seq, H, Dv] in cfg's dtype and the three
    gates [1, seq, H] (g_cmp, g_slc, g_swa, after a sigmoid)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = DTYPES[cfg["dtype"]]
    h, g, d, dv = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["value_dim"]

    def draw(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(dtype)
    q, k, v, do = draw(1, seq, h, d), draw(1, seq, g, d), draw(1, seq, g, dv), draw(1, seq, h, dv)
    gates = [torch.rand(1, seq, h, generator=gen, device=device).to(dtype) for _ in range(3)]
    return q, k, v, do, gates


def _autograd_pair(fn, inputs, do):
    """(fwd, bwd) of fn(*inputs): the forward without autograd, and the backward of one recorded forward."""
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    state = {}

    def fwd():
        with torch.no_grad():
            fn(*leaves)

    def bwd():
        if "o" not in state:
            state["o"] = fn(*leaves)
        state["o"].backward(do, retain_graph=True)
    bwd()
    return fwd, bwd


# Each builds (fwd, bwd) from (cfg, q, k, v, do, gates, window).
def _nsa_layer_impl(with_window):
    def build(cfg, q, k, v, do, gates, window):
        w = window if with_window else 0

        def layer(q, k, v, g_cmp, g_slc, g_swa):
            return nsa_iree.nsa(q, k, v, g_cmp, g_slc, g_swa if w else None, block_counts=cfg["num_blocks"],
                                block_size=cfg["block_size"], window_size=w)
        return _autograd_pair(layer, (q, k, v, *gates), do)
    return build


def _fla_layer_impl(cfg, q, k, v, do, gates, window):
    from fla.ops.nsa.parallel import parallel_nsa

    def layer(q, k, v, g_cmp, g_slc):
        return parallel_nsa(q, k, v, g_cmp, g_slc, block_counts=cfg["num_blocks"], block_size=cfg["block_size"])
    return _autograd_pair(layer, (q, k, v, *gates[:2]), do)


def _dense_scores_fit(q: torch.Tensor) -> None:
    """Raise before an eager baseline with [B, H, M, N] float32 scores (the window's, the layer's) would run out of
    the GPU's memory: autograd keeps about four tensors of that size."""
    if q.device.type != "cuda":
        return
    need = 4 * q.shape[0] * q.shape[2] * q.shape[1] ** 2 * 4
    free = torch.cuda.mem_get_info(q.device)[0]
    if need > free:
        raise RuntimeError(f"not run: the eager [B, H, M, N] scores need about {need / 2**30:.0f} GiB, "
                           f"{free / 2**30:.0f} GiB free")


def _eager_layer_impl(cfg, q, k, v, do, gates, window):
    _dense_scores_fit(q)

    def layer(q, k, v, g_cmp, g_slc, g_swa):
        return torch_eager_nsa(q, k, v, g_cmp, g_slc, g_swa, cfg["num_blocks"], cfg["block_size"], window)
    return _autograd_pair(layer, (q, k, v, *gates), do)


def _nsa_window_impl(cfg, q, k, v, do, gates, window):
    return _autograd_pair(lambda q, k, v: nsa_iree.sliding_window_attention(q, k, v, window), (q, k, v), do)


def flex_window(window, seq, device):
    """torch's FlexAttention (compiled, GQA) with a sliding-window block mask of `window` keys over `seq`
    positions: a function of q [B, seq, H, D], k, v [B, seq, G, D | Dv] returning o [B, seq, H, Dv]."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def in_window(b, head, query, key):
        return (key <= query) & (query - key < window)
    # compiled: the mask's blocks are found without a [seq, seq] boolean tensor (4 GiB at 64k, too much at 128k)
    mask = create_block_mask(in_window, None, None, seq, seq, device=device, _compile=True)
    # A compiled backward with donated buffers refuses retain_graph, which the benchmark's backward (of one
    # recorded forward, repeated) needs.
    torch._functorch.config.donated_buffer = False
    flex = torch.compile(flex_attention)

    def attention(q, k, v):
        return flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=mask,
                    enable_gqa=True).transpose(1, 2)
    return attention


def _flex_window_impl(cfg, q, k, v, do, gates, window):
    return _autograd_pair(flex_window(window, q.shape[1], q.device), (q, k, v), do)


def _eager_window_impl(cfg, q, k, v, do, gates, window):
    _dense_scores_fit(q)
    return _autograd_pair(lambda q, k, v: torch_eager_window(q, k, v, window), (q, k, v), do)


class Compression(NamedTuple):
    """One library's compression branch and block selection, the three steps fla's parallel_nsa chains."""
    pool: Callable          # (x [B, N, G, D], BS) -> [B, C, G, D]: the compressed keys (or values)
    attend: Callable        # (q, k_cmp, v_cmp, BS) -> (o, lse): lse in the library's layout
    select: Callable        # (q, k_cmp, lse, S, BS, scale) -> block ids [B, M, G, S]


def _nsa_iree_select(q, k_cmp, lse, slots, block_size, scale):
    return nsa_iree.select_blocks(q, k_cmp, slots, block_size, scale, lse=lse)


def _fla_pool(x, block_size):
    from fla.ops.utils.pooling import mean_pooling

    return mean_pooling(x, block_size)


def _fla_attend(q, k_cmp, v_cmp, block_size):
    """fla-core's parallel_nsa_compression (M = N): o [B, M, H, Dv] and lse [B, M, H]."""
    from fla.ops.nsa.compression import parallel_nsa_compression

    return parallel_nsa_compression(q, k_cmp, v_cmp, TK=q.shape[1], block_size=block_size)


def _fla_select(q, k_cmp, lse, slots, block_size, scale):
    """fla-core's parallel_nsa_topk (M = N) with its compression's lse ([B, M, H]), as its parallel_nsa runs it."""
    from fla.ops.nsa.parallel import parallel_nsa_topk

    return parallel_nsa_topk(q, k_cmp, TK=q.shape[1], lse=lse, block_counts=slots, block_size=block_size,
                             scale=scale)


LIBRARIES = {"nsa_iree": Compression(nsa_iree.mean_pooling, nsa_iree.compressed_attention, _nsa_iree_select),
             "fla": Compression(_fla_pool, _fla_attend, _fla_select),
             "torch eager": Compression(torch_eager_mean_pooling, torch_eager_compressed_attention,
                                        torch_eager_select_blocks)}


def _pooled_attention(lib: Compression, q, k, v, block_size: int):
    """(o, lse) of the library's compression branch, the pooling of k and v included."""
    return lib.attend(q, lib.pool(k, block_size), lib.pool(v, block_size), block_size)


def _compression_impl(library: str):
    """(fwd, step) of the library's compression branch: the forward without autograd, and a step from fresh leaves
    (pooling, forward, backward: the gradients to q, k and v)."""
    lib = LIBRARIES[library]

    def build(cfg, q, k, v, do, gates, window):
        bs = cfg["block_size"]

        def fwd():
            with torch.no_grad():
                _pooled_attention(lib, q, k, v, bs)

        def step():
            leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
            _pooled_attention(lib, *leaves, bs)[0].backward(do)
        return fwd, step
    return build


def _select_impl(library: str):
    """(select,): the library's block selection alone, S = the config's T, on the compressed keys and the lse of the
    same library's compression (made here, untimed: fla's parallel_nsa passes its compression's lse the same way)."""
    lib = LIBRARIES[library]

    def build(cfg, q, k, v, do, gates, window):
        bs, slots, scale = cfg["block_size"], cfg["num_blocks"], cfg["head_dim"] ** -0.5
        with torch.no_grad():
            k_cmp = lib.pool(k, bs)
            lse = lib.attend(q, k_cmp, lib.pool(v, bs), bs)[1]
        return (lambda: lib.select(q, k_cmp, lse, slots, bs, scale),)
    return build


BRANCH_IMPLS = {
    "layer": {"nsa_iree nsa": _nsa_layer_impl(False), "nsa_iree nsa + window": _nsa_layer_impl(True),
              "fla parallel_nsa": _fla_layer_impl, "torch eager nsa + window": _eager_layer_impl},
    "window": {"nsa_iree window": _nsa_window_impl, "flex window": _flex_window_impl,
               "torch eager window": _eager_window_impl},
    "compression": {"nsa_iree compression": _compression_impl("nsa_iree"), "fla compression": _compression_impl("fla"),
                    "torch eager compression": _compression_impl("torch eager")},
    "select": {"nsa_iree select_blocks": _select_impl("nsa_iree"), "fla parallel_nsa_topk": _select_impl("fla"),
               "torch eager select_blocks": _select_impl("torch eager")},
}
# The baselines each nsa_iree row is set against (their time over its own, same run), doing the same work: fla's
# parallel_nsa has no window (it needs flash-attn for one), the eager layer has one.
BASELINES = {"nsa_iree nsa": ("fla parallel_nsa",), "nsa_iree nsa + window": ("torch eager nsa + window",),
             "nsa_iree window": ("flex window", "torch eager window"),
             "nsa_iree compression": ("fla compression", "torch eager compression"),
             "nsa_iree select_blocks": ("fla parallel_nsa_topk", "torch eager select_blocks")}
WINDOWED = ("nsa_iree nsa + window", "torch eager nsa + window")     # the layers with the window branch
# fla's Triton kernels, and implementations that need a CUDA device (those and FlexAttention, compiled).
FLA_IMPLS = ("fla parallel_nsa", "fla compression", "fla parallel_nsa_topk")
CUDA_ONLY = (*FLA_IMPLS, "flex window")


def fla_runs(cfg: dict, device: torch.device) -> bool:
    """Whether fla's NSA kernels run here: a CUDA device, fla-core importable, H / G a power of two >= 16 (fla
    asserts it)."""
    hpg = cfg["heads"] // cfg["kv_heads"]
    return device.type == "cuda" and fla_function() is not None and hpg >= 16 and hpg & (hpg - 1) == 0


def check_sizes(cfg: dict, device_type: str, branch: str, window: int) -> tuple[int, int]:
    """The tokens and the window of check_branch's problem: 512 tokens on GPUs, 256 elsewhere, the window capped to
    half of them; for select_blocks twice S x BS at least, so that most rows see more blocks than they keep."""
    seq = 512 if device_type == "cuda" else 256
    if branch == "select":
        seq = max(seq, 2 * cfg["num_blocks"] * cfg["block_size"])
    return seq, min(window, seq // 2)


def check_branch(cfg, device, branch, window):
    """nsa_iree's results for the branch at a small size (check_sizes) against the f64 oracle: o and every gradient
    (the layer, the window, the compression), or the block ids (select)."""
    seq, w = check_sizes(cfg, device.type, branch, window)
    if branch == "compression":
        return _check_compression(cfg, device, seq)
    if branch == "select":
        return _check_select(cfg, device, seq)
    from nsa_iree.reference import nsa_reference, sliding_window_attention_reference

    q, k, v, do, gates = make_branch_problem(cfg, seq, device, seed=1)
    inputs = (q, k, v, *gates) if branch == "layer" else (q, k, v)
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    ref_leaves = [t.detach().double().requires_grad_(True) for t in inputs]
    kwargs = dict(block_counts=cfg["num_blocks"], block_size=cfg["block_size"], window_size=w)
    if branch == "layer":
        o, o_ref = nsa_iree.nsa(*leaves, **kwargs), nsa_reference(*ref_leaves, **kwargs)
    else:
        o = nsa_iree.sliding_window_attention(*leaves, w)
        o_ref = sliding_window_attention_reference(*ref_leaves, w)[0]
    o.backward(do)
    o_ref.backward(do.double())
    names = ("dq", "dk", "dv", "dg_cmp", "dg_slc", "dg_swa")
    errors = {"o": relative_rms_error(o.detach(), o_ref.detach())}
    errors.update({n: relative_rms_error(a.grad, b.grad) for n, a, b in zip(names, leaves, ref_leaves)})
    return {"against": f"f64 reference, {seq} tokens, window {w}", "errors": errors}


def _check_compression(cfg: dict, device: torch.device, seq: int) -> dict:
    """nsa_iree's pooling + compressed attention (o, lse, the gradients to q, k and v through the pooling) against
    autograd through the f64 oracle (mean_pooling_reference, compressed_attention_reference); fla's beside it
    where it runs (fla_errors)."""
    from nsa_iree.reference import compressed_attention_reference, mean_pooling_reference

    bs = cfg["block_size"]
    q, k, v, do, _ = make_branch_problem(cfg, seq, device, seed=1)
    ref = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    o_ref, lse_ref = compressed_attention_reference(ref[0], mean_pooling_reference(ref[1], bs),
                                                    mean_pooling_reference(ref[2], bs), bs)
    o_ref.backward(do.double())

    def errors(library: str) -> tuple[dict, torch.Tensor]:
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        o, lse = _pooled_attention(LIBRARIES[library], *leaves, bs)
        o.backward(do)
        found = {"o": relative_rms_error(o.detach(), o_ref.detach())}
        found.update({n: relative_rms_error(a.grad, b.grad) for n, a, b in zip(("dq", "dk", "dv"), leaves, ref)})
        return found, lse.detach()

    found, lse = errors("nsa_iree")
    result = {"against": f"f64 reference, {seq} tokens",
              "errors": {"o": found["o"], "lse": relative_rms_error(lse, lse_ref.detach()),
                         **{n: found[n] for n in ("dq", "dk", "dv")}}}
    if fla_runs(cfg, device):
        try:
            result["fla_errors"] = errors("fla")[0]
        except Exception as err:  # noqa: BLE001 - fla is a baseline, not the thing under test
            result["fla_error"] = repr(err)[:300]
    return result


def _check_select(cfg: dict, device: torch.device, seq: int) -> dict:
    """select_blocks (lse given: nsa_iree's compressed attention's) against select_blocks_reference on the same lse.
    errors["ids"]: the fraction of (row, kv head) pairs whose ids differ from the oracle's (blocks whose scores
    agree to rounding may come in either order); agreement: the fraction equal, for the eager top-k too and for
    fla's (as sets: fla orders its ids otherwise) where it runs."""
    from nsa_iree.reference import select_blocks_reference

    bs, slots, scale = cfg["block_size"], cfg["num_blocks"], cfg["head_dim"] ** -0.5
    q, k, v, _, _ = make_branch_problem(cfg, seq, device, seed=1)
    ours = LIBRARIES["nsa_iree"]
    k_cmp = ours.pool(k, bs)
    lse = ours.attend(q, k_cmp, ours.pool(v, bs), bs)[1]
    ref = select_blocks_reference(q, k_cmp, slots, bs, scale, lse=lse).to(device).long()

    def equal(ids: torch.Tensor, as_sets: bool = False) -> float:
        ids, expected = ids.long().clamp_min(-1), ref
        if as_sets:
            ids, expected = ids.sort(-1).values, expected.sort(-1).values
        return float((ids == expected).all(-1).double().mean())

    agreement = {name: equal(LIBRARIES[name].select(q, k_cmp, lse, slots, bs, scale))
                 for name in ("nsa_iree", "torch eager")}
    if fla_runs(cfg, device):
        try:
            ids = LIBRARIES["fla"].select(q, k_cmp, lse.transpose(1, 2).contiguous(), slots, bs, scale)
            agreement["fla (as sets)"] = equal(ids, as_sets=True)
        except Exception as err:  # noqa: BLE001 - fla is a baseline, not the thing under test
            agreement["fla error"] = repr(err)[:300]
    return {"against": f"f64 reference on the same lse, {seq} tokens, S {slots}",
            "errors": {"ids": 1.0 - agreement["nsa_iree"]}, "agreement": agreement}


def _visible_compressed(seq: int, block_size: int) -> int:
    """(row, compressed block) pairs a compressed attention of M = N = seq sees: block c from position (c + 1) BS - 1
    on, i.e. the sum over the positions p of (p + 1) // BS."""
    full = seq // block_size
    return full * (seq + 1) - block_size * full * (full + 1) // 2


def _visible_window(seq: int, window: int) -> int:
    """(row, key) pairs of a sliding window of `window` keys over M = N = seq: min(p + 1, W) at position p."""
    w = min(window, seq)
    return w * (w + 1) // 2 + (seq - w) * window


def branch_work(cfg: dict, branch: str, impl: str, seq: int, window: int) -> dict[str, tuple[float, float]]:
    """(FLOPs, bytes) of each timed column of a row (TIMED[branch]), counted from the shapes (M = N = seq, B = 1).

    FLOPs: 2 (D + Dv) per (row, head, visible key) forward and 2 (3 D + 2 Dv) backward (its five products), over the
    compressed blocks complete at the row's position, the window's min(p + 1, W) keys, and for the selection T x BS
    keys a row (anchors.md's count, the selection rows'); select_blocks 2 D per (row, head, visible block) (its
    scores; the ranking is not counted); the pooling, softmax and gating are not counted. Bytes: every tensor the
    timed call reads (its saved ones included) and writes, once (a lower bound on the traffic)."""
    h, g, d, dv, bs, t = (cfg[x] for x in ("heads", "kv_heads", "head_dim", "value_dim", "block_size", "num_blocks"))
    e = DTYPES[cfg["dtype"]].itemsize
    q, k, v, o, lse = seq * h * d * e, seq * g * d * e, seq * g * dv * e, seq * h * dv * e, 4 * h * seq
    fwd_pair, bwd_pair = 2 * (d + dv), 2 * (3 * d + 2 * dv)
    cmp_keys, win_keys = h * _visible_compressed(seq, bs), h * _visible_window(seq, window)
    grads = o + q + k + v                                           # do read, dq, dk and dv written
    if branch == "compression":
        return {"fwd": (fwd_pair * cmp_keys, q + k + v + o + lse),
                "fwd_bwd": ((fwd_pair + bwd_pair) * cmp_keys, q + k + v + grads)}
    if branch == "select":
        k_cmp, ids = -(-seq // bs) * g * d * e, 4 * seq * g * t
        return {"fwd": (2 * d * cmp_keys, q + k_cmp + lse + ids)}
    if branch == "window":
        return {"fwd": (fwd_pair * win_keys, q + k + v + o + lse),
                "bwd": (bwd_pair * win_keys, q + k + v + o + lse + grads)}
    if branch != "layer":
        raise ValueError(f"no work count for the branch {branch!r}")
    windowed = impl in WINDOWED
    keys = cmp_keys + seq * h * t * bs + (win_keys if windowed else 0)
    gates = (3 if windowed else 2) * seq * h * e
    return {"fwd": (fwd_pair * keys + 2 * d * cmp_keys, q + k + v + gates + o),
            "bwd": (bwd_pair * keys, 2 * (q + k + v + gates) + o)}


# The ceilings a GPU's rows are set against, by device name: bf16 matrix TFLOP/s and copy TB/s (bytes read and
# written), as measured on the lent machines (the device notes, KINDS.md: an 8192^3 bf16 product on random data, a
# device-to-device copy, both through PyTorch); the datasheet's are higher (H200: 990 TFLOP/s, 4.8 TB/s).
CEILINGS = {"NVIDIA H200": {"tflops": 788.0, "tbps": 4.3}}


def run_branch(args, on_row=None):
    """Check, then time every (seq, impl) of a branch other than the selection (--branch), as run() the selection's;
    each row with its achieved TFLOP/s and TB/s (branch_work) and the record with the device's CEILINGS if known."""
    device = torch.device(args.device)
    cfg = CONFIGS[args.config]
    impls = [i for i in (args.impl or BRANCH_IMPLS[args.branch]) if i in BRANCH_IMPLS[args.branch]]
    if device.type != "cuda":
        impls = [i for i in impls if i not in CUDA_ONLY]
    if not fla_runs(cfg, device):
        impls = [i for i in impls if i not in FLA_IMPLS]
    machine = _machine(device)
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine,
              "versions": _versions(), "config": {"name": args.config, **cfg, "branch": args.branch,
                                                  "window": args.window},
              "rows": [], "checks": {}, "load_average": list(os.getloadavg())}
    if machine in CEILINGS:
        record["ceilings"] = CEILINGS[machine]
    try:
        record["checks"][args.branch] = check_branch(cfg, device, args.branch, args.window)
    except Exception as err:  # noqa: BLE001 - a failed check is reported, nothing of nsa_iree is timed
        record["checks"][args.branch] = {"against": "f64 reference", "errors": {}, "error": repr(err)[:500]}
    check = record["checks"][args.branch]
    print(f"check ({args.branch}):", json.dumps(check), flush=True)
    wrong = "error" in check or not all(e < CHECK_TOLERANCE for e in check["errors"].values())
    names = TIMED[args.branch]
    for seq in args.seq:
        for impl in impls:
            row = dict(selection=args.branch, seq=seq, impl=impl)
            if impl.startswith("nsa_iree") and wrong:
                row["error"] = "not timed: failed the correctness check"
            else:
                build = BRANCH_IMPLS[args.branch][impl]
                row = timed_row(row, device, args.repeats, lambda: make_branch_problem(cfg, seq, device),
                                lambda q, k, v, do, gates: build(cfg, q, k, v, do, gates, args.window), names=names)
            if "error" not in row:
                for name, (flops, moved) in branch_work(cfg, args.branch, impl, seq, args.window).items():
                    seconds = row[f"{name}_ms"] * 1e-3
                    row[f"{name}_tflops"], row[f"{name}_tbps"] = flops / seconds / 1e12, moved / seconds / 1e12
            record["rows"].append(row)
            print(json.dumps(row), flush=True)
            if on_row:
                on_row(record)
    return record


IMPLS = {
    "nsa_iree two-pass": nsa_iree_impl("two-pass"),
    "nsa_iree one-pass": nsa_iree_impl("one-pass"),
    "nsa_iree two-pass, padded given": nsa_iree_padded_impl,
    "dense sdpa": sdpa_impl,
    "torch eager": torch_eager_impl,
    "fla parallel_nsa": fla_impl,
    "torch reference f32": torch_reference_impl,
}


def problem(cfg, seq, selection, device, seed=0, doc_lengths=DOC_LENGTHS):
    """q, k, v, do, idx and cu_seqlens (None unless the selection is "packed")."""
    if selection == PACKED:
        return make_packed_problem(cfg, seq, device, doc_lengths, seed)
    return (*make_problem(cfg, seq, selection, device, seed), None)


def check(cfg, device, selection):
    """Correctness at a small size before timing: nsa_iree's o and grads against fla or the f64 reference.
    Packed: documents of 1 to seq / 3 tokens (odd lengths and partial blocks included)."""
    seq = 512 if device.type == "cuda" else 128
    q, k, v, do, idx, cu = problem(cfg, seq, selection, device, seed=1, doc_lengths=(1, seq // 3))
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    o = nsa_iree.selection_attention(*leaves, idx, block_size=cfg["block_size"], cu_seqlens=cu)
    o.backward(do)
    ref_leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    o_ref, _ = selection_attention_reference(*ref_leaves, idx, cfg["block_size"], cu_seqlens=cu)
    o_ref.backward(do.double())
    errors = {"o": relative_rms_error(o.detach(), o_ref.detach())}
    for name, a, b in zip(("dq", "dk", "dv"), leaves, ref_leaves):
        errors[name] = relative_rms_error(a.grad, b.grad)
    result = {"against": "f64 reference", "errors": errors}
    fn = fla_function()
    if fla_runs(cfg, device):
        try:
            fl = [t.detach().requires_grad_(True) for t in (q, k, v)]
            o_fla = fn.apply(*fl, idx.to(torch.int32), cfg["num_blocks"], cfg["block_size"], cfg["head_dim"] ** -0.5,
                             None if cu is None else cu.to(torch.int64))
            o_fla.backward(do)
            result["fla_errors"] = {"o": relative_rms_error(o_fla.detach(), o_ref.detach()),
                                    **{n: relative_rms_error(a.grad, b.grad)
                                       for n, a, b in zip(("dq", "dk", "dv"), fl, ref_leaves)}}
        except Exception as err:  # noqa: BLE001 - fla is a baseline, not the thing under test
            result["fla_error"] = repr(err)[:300]
    for variant in ("one-pass",):
        vl = [t.detach().requires_grad_(True) for t in (q, k, v)]
        nsa_iree.selection_attention(*vl, idx, block_size=cfg["block_size"], variant=variant,
                                     cu_seqlens=cu).backward(do)
        result[f"{variant}_errors"] = {n: relative_rms_error(a.grad, b.grad)
                                       for n, a, b in zip(("dq", "dk", "dv"), vl, ref_leaves)}
    return result


# Relative RMS error above which a variant's check fails (bf16 results sit near 2.5e-3 on the H200).
CHECK_TOLERANCE = 1e-2


def wrong_variants(result) -> set[str]:
    """The nsa_iree variants whose check failed (a wrong kernel is reported, never timed)."""
    wrong = set()
    for variant, key in (("two-pass", "errors"), ("one-pass", "one-pass_errors")):
        errors = result.get(key)
        if key in result and (not errors or not all(e < CHECK_TOLERANCE for e in errors.values())):
            wrong.add(variant)
    if "error" in result:
        wrong.update({"two-pass", "one-pass"})
    return wrong


def timed_row(row, device, repeats, make, build, describe=None, names=("fwd", "bwd")):
    """row (its labels) with <name>_ms for each callable build(*make()) returns, in the order of `names` (by default
    the (fwd, bwd) pair), peak_mem_gb and input_gb (every input tensor) and the labels describe(*inputs) adds, or
    the error that stopped it (e.g. out of memory). The inputs and the closures, which hold their outputs, are
    dropped after, so the next row's baseline is clean."""
    inputs = fns = None
    try:
        inputs = make()
        with PeakMemory(device) as mem:
            fns = build(*inputs)
            times = [timed(fn, device, repeats) for fn in fns]
        tensors = [t for x in inputs for t in (x if isinstance(x, (list, tuple)) else [x])
                   if isinstance(t, torch.Tensor)]
        row = dict(row, **{f"{name}_ms": t * 1e3 for name, t in zip(names, times, strict=True)},
                   peak_mem_gb=mem.peak / 1e9, input_gb=sum(t.numel() * t.element_size() for t in tensors) / 1e9,
                   **(describe(*inputs) if describe else {}))
    except Exception as err:  # noqa: BLE001 - record and go on (e.g. out of memory)
        row = dict(row, error=f"{type(err).__name__}: {err}"[:300])
    finally:
        inputs = fns = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def run(args, on_row=None):
    """Check, then time every (selection, seq, impl); on_row(record) after each row (partial results survive a
    run that is cut short)."""
    device = torch.device(args.device)
    cfg = CONFIGS[args.config]
    impls = [i for i in (args.impl or IMPLS) if i in IMPLS]
    if device.type == "cuda":
        impls = [i for i in impls if i != "torch reference f32"]
    if not fla_runs(cfg, device):
        impls = [i for i in impls if not i.startswith("fla")]
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": _machine(device),
              "versions": _versions(), "config": {"name": args.config, **cfg}, "rows": [], "checks": {},
              "load_average": list(os.getloadavg())}    # other processes on the machine, at the start
    for selection in args.selection:
        try:
            record["checks"][selection] = check(cfg, device, selection)
        except Exception as err:  # noqa: BLE001 - a failed check is reported, the timings still run
            record["checks"][selection] = {"against": "f64 reference", "errors": {}, "error": repr(err)[:500]}
        print(f"check ({selection}):", json.dumps(record["checks"][selection]), flush=True)
        wrong = wrong_variants(record["checks"][selection])
        for seq in args.seq:
            for impl in impls:
                packed_only = impl == "nsa_iree two-pass, padded given"
                if (selection == PACKED) != packed_only and (packed_only or impl == "dense sdpa"):
                    continue                                     # not meaningful for this selection
                if impl.startswith("nsa_iree") and impl.split(",")[0].split()[-1] in wrong:
                    row = dict(selection=selection, seq=seq, impl=impl, error="not timed: failed the correctness check")
                    record["rows"].append(row)
                    print(json.dumps(row), flush=True)
                    continue
                def make(seq=seq, selection=selection):
                    return problem(cfg, seq, selection, device, doc_lengths=args.doc_lengths)

                def build(q, k, v, do, idx, cu, impl=impl):
                    return IMPLS[impl](cfg, q, k, v, do, idx, cu)

                def documents(q, k, v, do, idx, cu):
                    return {} if cu is None else {"documents": cu.numel() - 1}
                row = timed_row(dict(selection=selection, seq=seq, impl=impl), device, args.repeats, make, build,
                                documents)
                record["rows"].append(row)
                print(json.dumps(row), flush=True)
                if on_row:
                    on_row(record)
    return record


def profile(args, out):
    """Per-kernel device time of one nsa_iree forward and backward of each variant (CUPTI sees IREE's kernels)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    device, cfg = torch.device(args.device), CONFIGS[args.config]
    tables = {}
    for impl in ("nsa_iree two-pass", "nsa_iree one-pass"):
        q, k, v, do, idx = make_problem(cfg, args.profile, "realistic", device)
        fwd, bwd = IMPLS[impl](cfg, q, k, v, do, idx)
        for name, fn in (("forward", fwd), ("backward", bwd)):
            if name == "forward" and impl != "nsa_iree two-pass":
                continue
            fn()
            _sync(device)
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                _sync(device)
            rows = sorted(((e.key, e.device_time_total / 1e3, e.count) for e in prof.key_averages()
                           if e.device_time_total > 0), key=lambda r: -r[1])
            tables[f"{impl} {name}"] = [dict(kernel=k, ms=ms, calls=c) for k, ms, c in rows[:25]]
            print(f"## {impl} {name} at {args.profile}")
            for k, ms, c in rows[:25]:
                print(f"  {ms:9.3f} ms  x{c:<3} {k[:110]}")
    (out / "profile.json").write_text(json.dumps(tables, indent=1))
    return tables


def _machine(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = target_cpu_from_environment()
    vectors = "AVX-512" if "avx512f" in _cpu_flags() else "AVX2" if "avx2" in _cpu_flags() else "no AVX2"
    code = f"kernels for {cpu}" + (f", {vectors} host" if cpu == "host" else f" on an {vectors} host")
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads, {code})"


def _cpu_flags() -> set:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _versions():
    out = {"torch": torch.__version__, "nsa_iree": nsa_iree.__version__}
    try:
        import importlib.metadata as md
        for name in ("iree-base-runtime", "iree-base-compiler", "fla-core", "triton"):
            try:
                out[name] = md.version(name)
            except md.PackageNotFoundError:
                pass
    except ImportError:
        pass
    return out


BRANCH_TITLES = {"selection": "Selection attention", "layer": "The whole layer's attention (nsa)",
                 "window": "Sliding-window attention",
                 "compression": "The compression branch (mean pooling + compressed attention)",
                 "select": "The block selection (select_blocks, lse given)"}
BRANCH_TIMES = {
    "layer": "the forward without autograd, the backward of one recorded forward (through every branch and the "
             "gates)",
    "window": "the forward without autograd, the backward of one recorded forward",
    "compression": "the forward without autograd and forward + backward (a step from fresh leaves: the gradients to "
                   "q, k and v), both with the pooling of k and v",
    "select": "the selection alone, S = T, on the compressed keys and the lse of the same library's compression "
              "(made before, untimed, as fla's parallel_nsa passes its compression's lse)",
}
WORK_NOTE = ("TFLOP/s and TB/s count the work from the shapes (nsa_iree.benchmark.branch_work): 2 (D + Dv) FLOPs per "
             "(row, head, visible key) forward, 2 (3 D + 2 Dv) backward, over the compressed blocks complete at the "
             "row, the window's keys and T x BS selected keys a row; select_blocks 2 D per (row, head, visible "
             "block); bytes: every tensor the timed call reads and writes, once (a lower bound on the traffic).")


def markdown(record) -> str:
    cfg = record["config"]
    branch = cfg.get("branch", "selection")
    window = f", window {cfg['window']}" if branch in ("layer", "window") else ""
    lines = [f"# {BRANCH_TITLES[branch]} benchmark: {cfg['name']}{window} ({record['machine']}, {record['date']})", "",
             f"H={cfg['heads']} G={cfg['kv_heads']} D={cfg['head_dim']} Dv={cfg['value_dim']} BS={cfg['block_size']} "
             f"T={cfg['num_blocks']} {cfg['dtype']}, B=1. Versions: "
             + ", ".join(f"{k} {v}" for k, v in record["versions"].items()), "",
             ("Times in ms (median). 'x dense' = dense SDPA time / this time, same run, same selection. "
              "TFLOP/s use the selection FLOP count of anchors.md (backward = 2.5 x forward)." if branch == "selection"
              else f"Times in ms (median): {BRANCH_TIMES[branch]}. {WORK_NOTE}")
             + (" Load average at the start (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in record["load_average"])
                + "." if "load_average" in record else ""), ""]
    if "ceilings" in record:
        lines += [f"Ceilings (the percentages): {record['ceilings']['tflops']:g} TFLOP/s bf16 matrix products, "
                  f"{record['ceilings']['tbps']:g} TB/s copy (measured on the lent machines; "
                  "nsa_iree.benchmark.CEILINGS).", ""]
    for selection, check in record["checks"].items():
        lines.append(f"Check ({selection}): " + ", ".join(f"{k} {v:.1e}" for k, v in check["errors"].items())
                     + f" vs {check['against']}"
                     + ("; fla: " + ", ".join(f"{k} {v:.1e}" for k, v in check["fla_errors"].items())
                        if "fla_errors" in check else "")
                     + ("; (row, kv head) pairs with the oracle's ids: "
                        + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                    for k, v in check["agreement"].items()) if "agreement" in check else "")
                     + (f"; error: {check['error']}" if "error" in check else ""))
    return "\n".join(lines + (_selection_table(record) if branch == "selection" else _branch_table(record))) + "\n"


def _selection_table(record) -> list[str]:
    cfg = record["config"]
    lines = ["", "| selection | seq | implementation | fwd ms | bwd ms | bwd x dense | bwd TFLOP/s | "
             "peak GB (inputs GB) |", "|---|---|---|---|---|---|---|---|"]
    dense = {(r["selection"], r["seq"]): r for r in record["rows"] if r["impl"] == "dense sdpa" and "bwd_ms" in r}
    for r in record["rows"]:
        if "error" in r:
            lines.append(f"| {r['selection']} | {r['seq']} | {r['impl']} | {r['error']} | | | | |")
            continue
        d = dense.get((r["selection"], r["seq"]))
        speed = f"{d['bwd_ms'] / r['bwd_ms']:.2f}x" if d else ""
        seq = f"{r['seq']} ({r['documents']} documents)" if "documents" in r else r["seq"]
        flops = 2.5 * (dense_flops if r["impl"] == "dense sdpa" else selection_flops)(cfg, r["seq"])
        tflops = f"{flops / (r['bwd_ms'] * 1e-3) / 1e12:.1f}"
        lines.append(f"| {r['selection']} | {seq} | {r['impl']} | {r['fwd_ms']:.2f} | {r['bwd_ms']:.2f} | {speed} "
                     f"| {tflops} | {r['peak_mem_gb']:.2f} ({r['input_gb']:.2f}) |")
    return lines


def _branch_table(record) -> list[str]:
    """The rows of a branch other than the selection: the times of TIMED[branch], each nsa_iree row's ratio to its
    BASELINES (their time over its own), the achieved rates (of the ceilings where the record has them)."""
    branch = record["config"]["branch"]
    names = TIMED[branch]
    ceilings = record.get("ceilings")
    what = " / ".join(TIMED_LABELS[n] for n in names)
    header = ["branch", "seq", "implementation", *(f"{TIMED_LABELS[n]} ms" for n in names),
              f"their time / ours ({what})", f"TFLOP/s ({what})", f"TB/s ({what})", "peak GB (inputs GB)"]
    lines = ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    timed_rows = {(r["seq"], r["impl"]): r for r in record["rows"] if "error" not in r}

    def rate(r, unit: str) -> str:
        values = [r[f"{n}_{unit}"] for n in names]
        text = " / ".join(f"{x:.3g}" for x in values)
        if ceilings:
            text += " (" + " / ".join(f"{100 * x / ceilings[unit]:.0f}%" for x in values) + ")"
        return text

    for r in record["rows"]:
        if "error" in r:
            lines.append(f"| {branch} | {r['seq']} | {r['impl']} | {r['error']} |" + " |" * (len(header) - 4))
            continue
        ratios = "; ".join(f"{b} " + " / ".join(f"{timed_rows[r['seq'], b][f'{n}_ms'] / r[f'{n}_ms']:.2f}x"
                                                for n in names)
                           for b in BASELINES.get(r["impl"], ()) if (r["seq"], b) in timed_rows)
        times = " | ".join(f"{r[f'{n}_ms']:.2f}" for n in names)
        lines.append(f"| {branch} | {r['seq']} | {r['impl']} | {times} | {ratios} | {rate(r, 'tflops')} | "
                     f"{rate(r, 'tbps')} | {r['peak_mem_gb']:.2f} ({r['input_gb']:.2f}) |")
    return lines


def plot(record, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    selections = list(record["checks"])
    branch = record["config"].get("branch", "selection")
    # One column per selection, one row per timed column (the forward first), each point of a non-dense curve
    # labelled with dense's time over its own ("x dense").
    keys = [f"{n}_ms" for n in TIMED[branch]]
    fig, axes = plt.subplots(len(keys), len(selections), figsize=(6 * len(selections), 4.5 * len(keys)),
                             squeeze=False)
    for row_axes, key, name in zip(axes, keys, TIMED[branch]):
        what = TIMED_LABELS[name]
        for ax, selection in zip(row_axes, selections):
            rows = [r for r in record["rows"] if r["selection"] == selection and key in r]
            dense = {r["seq"]: r[key] for r in rows if r["impl"] == "dense sdpa"}
            labelled = 0
            for impl in dict.fromkeys(r["impl"] for r in rows):
                pts = sorted((r["seq"], r[key]) for r in rows if r["impl"] == impl)
                (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
                if impl != "dense sdpa":
                    # Labels alternate above and below their points, so close curves stay readable.
                    offset = (4, 5) if labelled % 2 == 0 else (4, -11)
                    labelled += 1
                    for seq, ms in pts:
                        if seq in dense:
                            ax.annotate(f"{dense[seq] / ms:.1f}x", (seq, ms), textcoords="offset points",
                                        xytext=offset, fontsize=7, color=line.get_color())
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length")
            ax.set_ylabel(f"{what} ms")
            label = f"{selection} selection" if branch == "selection" else selection
            ax.set_title(f"{record['config']['name']}, {label}, {what} ({record['machine']})", fontsize=9)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def device_is_cuda(args) -> bool:
    return torch.device(args.device).type == "cuda"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="nsa-iree bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--config", choices=CONFIGS, default="anchors")
    parser.add_argument("--seq", type=int, nargs="+", default=[8192, 16384, 32768, 65536])
    parser.add_argument("--selection", nargs="+", choices=[*SELECTIONS, PACKED], default=["realistic", "uniform"])
    parser.add_argument("--doc-lengths", type=int, nargs=2, default=list(DOC_LENGTHS), metavar=("MIN", "MAX"),
                        help="document lengths of the packed selection (default %(default)s)")
    parser.add_argument("--branch", choices=BRANCHES, default="selection",
                        help="what to time: the selection branch (default), the whole layer's attention (nsa), "
                             "the sliding window, the compression branch (pooling + compressed attention) or the "
                             "block selection (select_blocks)")
    parser.add_argument("--window", type=int, default=512,
                        help="the window of --branch layer's and window's runs (default %(default)s)")
    parser.add_argument("--impl", nargs="+", default=None,
                        help="the implementations to time (default: all of the branch's)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="directory for the table, record and plot (default ./%(default)s)")
    parser.add_argument("--profile", type=int, default=0, metavar="SEQ",
                        help="also record per-kernel GPU times (torch.profiler) of nsa_iree at this length")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny CPU run: the harness works, nothing is timed seriously")
    args = parser.parse_args(argv)
    if args.smoke:
        args.device, args.config, args.seq, args.repeats, args.selection = "cpu", "tiny", [256], 1, ["realistic"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save(record):
        machine = record["machine"].split("(")[0].strip().split()[-1] if device_is_cuda(args) else "cpu"
        branch = record["config"].get("branch", "selection")
        tag = "" if branch == "selection" else f"_{branch}"
        stem = f"{record['config']['name']}{tag}_{re.sub(r'[^A-Za-z0-9]+', '_', machine)}"
        (out / f"{stem}.json").write_text(json.dumps(record, indent=1))
        (out / f"{stem}.md").write_text(markdown(record))
        return stem

    record = (run if args.branch == "selection" else run_branch)(args, on_row=save)
    if args.profile and args.branch == "selection":
        record["profile"] = profile(args, out)
    stem = save(record)
    png = plot(record, out / f"{stem}.png")
    print(markdown(record))
    print(f"wrote {out / (stem + '.md')}" + (f" and {png}" if png else ""))
    return record


if __name__ == "__main__":
    main()
