"""GPU checks of the compressed attention (no timing): every layout of LAYOUTS through mean pooling, forward and
backward, against the f64 oracle and the linalg stages (KernelSpec.kernels), outputs poisoned first, the backward
twice bit for bit; small sizes, so that `compute-sanitizer --tool memcheck` runs it too.

    python3 -m bench.compression_gpu_checks               (on the GPU: bench/run_compression_h200.sh's setup)
    python3 -m bench.compression_gpu_checks --only gates  (one group of GROUPS, or several: layouts,select)
    python3 -m bench.compression_gpu_checks --compile     (here: compile the cuda modules it and
                                                           bench/compression_h200.py load into $NSA_IREE_CACHE_DIR)
    python3 -m bench.compression_gpu_checks --only select --compile   (here: those the group(s) load)
    python3 -m bench.compression_gpu_checks --only select --cases anchors_f16_n700_s1,hpg1_n1000_counts

$NSA_IREE_PIPELINES_DIR picks the recipes, here and on the GPU alike: with bench/portable_select_variant.py's
directory the select group checks the portable select_blocks kernel (the AMD targets' text, on mma.sync), with
bench/portable_window_variant.py's the window group the portable forward, dq and dk/dv with the band's mask.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from unittest import mock

import torch

import nsa_iree
from nsa_iree import api, compression
from nsa_iree.reference import (compressed_attention_backward_reference, compressed_attention_reference,
                                mean_pooling_reference)
from nsa_iree.testing import TOLERANCE, relative_rms_error

from .branches_h200 import H200

BLOCK_SIZE = 64
# name: (H, G, D, Dv, dtype, M, N): the anchors layout (HPG 16), M < N, every group size the dense forward takes
# (HPG 1, 4, 32, 64: one 16-row tile holds several positions, or a position's heads span tiles), D != Dv, f16.
LAYOUTS = {
    "anchors_n2048": (64, 4, 128, 128, torch.bfloat16, 2048, 2048),
    "anchors_m1000_n3000": (64, 4, 128, 128, torch.bfloat16, 1000, 3000),
    "hpg1_n1000": (4, 4, 128, 128, torch.bfloat16, 1000, 1000),
    "hpg4_d64dv128_n1500": (16, 4, 64, 128, torch.bfloat16, 1500, 1500),
    "hpg32_n1100": (32, 1, 128, 128, torch.bfloat16, 1100, 1100),
    "hpg64_m300_n1300": (64, 1, 64, 64, torch.bfloat16, 300, 1300),
    "anchors_f16_n700": (64, 4, 128, 128, torch.float16, 700, 700),
}
TIMED_LENGTHS = (8192, 16384, 32768, 65536)      # bench/compression_h200.py's, anchors layout
TIMED_SLOTS = 16
# select_blocks' layouts besides LAYOUTS: the last 300 of 16384 positions, 256 compressed keys (the portable kernel
# stages 64 at a time: four tiles)
SELECT_LAYOUTS = {"anchors_m300_n16384": (64, 4, 128, 128, torch.bfloat16, 300, 16384)}
# select_blocks on the GPU: name: (layout, block_counts: an int, or (low, high) for a [B, M, G] tensor of counts drawn
# from low .. high - 1, 0 and more than a row sees among them, the compressed keys: "pooled" (mean pooling of the
# random keys), "equal" (every block block 0's: all scores equal, the ranking by id alone) or "nan" (blocks 3 and 4
# NaN after the lse is computed: their scores NaN, ranked last)). An "equal" or "nan" case must equal the reference
# exactly (no near-tie is a reason there). A case the recipe's kernel does not take (the NVIDIA one: HPG 16 only) is
# reported skipped.
SELECT_CASES = {
    "anchors_n2048_s16": ("anchors_n2048", 16, "pooled"),
    "anchors_m1000_n3000_s32": ("anchors_m1000_n3000", 32, "pooled"),
    "anchors_f16_n700_s1": ("anchors_f16_n700", 1, "pooled"),
    "anchors_n2048_counts": ("anchors_n2048", (-2, 30), "pooled"),
    "anchors_m300_n16384_s32": ("anchors_m300_n16384", 32, "pooled"),
    "anchors_n2048_equal_s8": ("anchors_n2048", 8, "equal"),
    "anchors_n2048_nan_s32": ("anchors_n2048", 32, "nan"),
    "hpg4_d64_n1500_s8": ("hpg4_d64dv128_n1500", 8, "pooled"),
    "hpg1_n1000_counts": ("hpg1_n1000", (-2, 30), "pooled"),
}
# the sliding window's layouts besides LAYOUTS: M > N (the first 200 rows before position 0 see no key)
WINDOW_LAYOUTS = {"hpg4_d64dv128_m1200_n1000": (16, 4, 64, 128, torch.bfloat16, 1200, 1000)}
# the sliding window (nsa_iree.window: the recipe's kernels, kernels.choose; with bench/portable_window_variant.py's
# recipe the portable forward, dq and dk/dv): name: (layout, W). W 512 at N 2048; M < N; W not a multiple of the
# block (64), below it and 1; HPG 1, 4 (D != Dv) and 16; f16; M > N.
WINDOW_CASES = {"anchors_n2048_w512": ("anchors_n2048", 512), "anchors_m1000_n3000_w100": ("anchors_m1000_n3000", 100),
                "hpg1_n1000_w1000": ("hpg1_n1000", 1000), "hpg4_d64dv128_n1500_w300": ("hpg4_d64dv128_n1500", 300),
                "hpg4_d64dv128_m1200_n1000_w77": ("hpg4_d64dv128_m1200_n1000", 77),
                "anchors_f16_n700_w200": ("anchors_f16_n700", 200), "anchors_f16_n700_w1": ("anchors_f16_n700", 1),
                "hpg1_n1000_w40": ("hpg1_n1000", 40)}
# the layer's gating (nsa_iree.layer.gated_sum, kernels/common/gates.mlir): name: (layout, branches, the first
# branch ungated)
GATE_CASES = {"anchors_n2048_two": ("anchors_n2048", 2, False), "anchors_n2048_three": ("anchors_n2048", 3, False),
              "anchors_f16_n700_ungated_first": ("anchors_f16_n700", 2, True),
              "hpg4_d64dv128_n1500_one": ("hpg4_d64dv128_n1500", 1, False)}
_DTYPE_NAME = {torch.bfloat16: "bf16", torch.float16: "f16"}


def specs(groups=None):
    """(KernelSpec, variant) of every cuda module the checks of `groups` load (None: every group's and
    bench/compression_h200.py's), each once."""
    seen = set()
    for item in _specs(groups):
        if item not in seen:
            seen.add(item)
            yield item


def _compressed_spec(h, g, d, dv, dtype, n, kernels="auto"):
    """The compressed attention's module spec for N = n positions (tiles of compression.DEFAULT_TILE keys)."""
    from nsa_iree.spec import KernelSpec

    keys = -(-n // BLOCK_SIZE)
    return KernelSpec(heads=h, kv_heads=g, head_dim=d, value_dim=dv, block_size=compression.DEFAULT_TILE,
                      num_blocks=compression.tile_slots(keys, compression.DEFAULT_TILE),
                      dtype=_DTYPE_NAME[dtype], target=H200, kernels=kernels, key_stride=BLOCK_SIZE)


def _select_spec(h, g, d, dtype, slots):
    """select_blocks' module spec (T = its slots; BS the compression's block size, key_stride 1)."""
    from nsa_iree.spec import KernelSpec

    return KernelSpec(heads=h, kv_heads=g, head_dim=d, value_dim=d, block_size=BLOCK_SIZE, num_blocks=slots,
                      dtype=_DTYPE_NAME[dtype], target=H200)


def _select_kernel_missing(spec) -> str | None:
    """Why the recipe ($NSA_IREE_PIPELINES_DIR's or the package's) has no select_blocks kernel for spec (None: it
    has one)."""
    from nsa_iree.kernels import choose
    from nsa_iree.recipes import load_recipe

    try:
        choose("select_blocks", spec, load_recipe(H200))
    except NotImplementedError as err:
        return str(err)
    return None


def _specs(groups):
    everything = groups is None
    groups = list(GROUPS) if everything else groups
    if "layouts" in groups:
        for h, g, d, dv, dtype, _, n in LAYOUTS.values():
            for kernels in ("auto", "linalg"):
                for variant in ("forward", "two-pass"):
                    yield _compressed_spec(h, g, d, dv, dtype, n, kernels), variant
    if everything:          # bench/compression_h200.py's
        h, g, d, dv, dtype = LAYOUTS["anchors_n2048"][:5]
        for n in TIMED_LENGTHS:
            for variant in ("forward", "two-pass"):
                yield _compressed_spec(h, g, d, dv, dtype, n), variant
        yield _select_spec(h, g, d, dtype, TIMED_SLOTS), "select"
    if "select" in groups:
        for layout, counts, _ in SELECT_CASES.values():
            h, g, d, _, dtype, _, n = _layout(layout)
            spec = _select_spec(h, g, d, dtype, _slots(counts))
            if _select_kernel_missing(spec) is None:
                yield _compressed_spec(h, g, d, d, dtype, n), "forward"     # the lse: k_cmp as the values
                yield spec, "select"
    if "window" in groups:
        for case in WINDOW_CASES:
            for kernels in ("auto", "linalg"):
                for variant in ("forward", "two-pass"):
                    yield _window_spec(case, kernels), variant
    if "gates" in groups:
        from nsa_iree.spec import KernelSpec

        for layout in dict.fromkeys(layout for layout, _, _ in GATE_CASES.values()):
            h, _, _, dv, dtype, _, _ = LAYOUTS[layout]
            yield KernelSpec(heads=h, kv_heads=1, head_dim=dv, value_dim=dv, dtype=_DTYPE_NAME[dtype],
                             target=H200), "gates"


def _window_spec(case, kernels="auto"):
    """The sliding window's module spec of WINDOW_CASES[case] (BS window.WINDOW_BLOCK, T window.window_slots(W))."""
    from nsa_iree import window
    from nsa_iree.spec import KernelSpec

    layout, w = WINDOW_CASES[case]
    h, g, d, dv, dtype, _, _ = _layout(layout)
    return KernelSpec(heads=h, kv_heads=g, head_dim=d, value_dim=dv, block_size=window.WINDOW_BLOCK,
                      num_blocks=window.window_slots(w), dtype=_DTYPE_NAME[dtype], target=H200, kernels=kernels,
                      window=w)


def _slots(counts) -> int:
    return counts if isinstance(counts, int) else counts[1] - 1


def _layout(layout):
    return {**LAYOUTS, **SELECT_LAYOUTS, **WINDOW_LAYOUTS}[layout]


def _inputs(layout, seed=0):
    h, g, d, dv, dtype, m, n = _layout(layout)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(1, m, h, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(1, n, g, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(1, n, g, dv, device="cuda", generator=gen).to(dtype)
    do = torch.randn(1, m, h, dv, device="cuda", generator=gen).to(dtype)
    return q, k, v, do


def _poisoned(shape, like, dtype=None):
    """api.output_buffer with NaN (block ids: -7) in every element: what the kernels leave unwritten shows."""
    dtype = dtype or like.dtype
    return torch.full(shape, float("nan") if dtype.is_floating_point else -7, dtype=dtype, device=like.device)


def _run(q, k, v, do, n, kernels):
    """o, lse and the gradients of q, k, v (through the pooling) with NSA_IREE_KERNELS = kernels."""
    os.environ["NSA_IREE_KERNELS"] = kernels
    try:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        k_cmp = nsa_iree.mean_pooling(leaves[1], BLOCK_SIZE)
        v_cmp = nsa_iree.mean_pooling(leaves[2], BLOCK_SIZE)
        with mock.patch.object(api, "output_buffer", _poisoned):
            o, lse = nsa_iree.compressed_attention(leaves[0], k_cmp, v_cmp, BLOCK_SIZE, seq_len=n)
            o.backward(do)
        return o.detach(), lse, leaves[0].grad, leaves[1].grad, leaves[2].grad
    finally:
        os.environ.pop("NSA_IREE_KERNELS")


def check(layout):
    """One layout's row: errors against the f64 oracle and against the linalg stages, the blind rows, the backward
    twice bitwise equal, and the gradients' digest (another process must print the same)."""
    m, n = LAYOUTS[layout][5:]
    q, k, v, do = _inputs(layout)
    ours = _run(q, k, v, do, n, "auto")
    oracle = _run(q, k, v, do, n, "linalg")
    kc, vc = mean_pooling_reference(k, BLOCK_SIZE), mean_pooling_reference(v, BLOCK_SIZE)
    ro, rl = compressed_attention_reference(q.double(), kc, vc, BLOCK_SIZE, seq_len=n)
    _, rdq, rdkc, rdvc = compressed_attention_backward_reference(q.double(), kc, vc, ro, rl, do.double(), BLOCK_SIZE,
                                                                 seq_len=n)
    # the pooling's backward in f64: each token gets its block's gradient over the block's count
    count = torch.tensor([min(BLOCK_SIZE, n - c * BLOCK_SIZE) for c in range(kc.shape[1])], device="cuda",
                         dtype=torch.float64).view(1, -1, 1, 1)
    spread = lambda g: (g / count).repeat_interleave(BLOCK_SIZE, dim=1)[:, :n]  # noqa: E731
    reference = (ro, rl, rdq, spread(rdkc), spread(rdvc))
    row = {"check": layout}
    for name, a, b, r in zip(("o", "lse", "dq", "dk", "dv"), ours, oracle, reference):
        floor = 0.0 if name == "lse" else 1e-3
        row[name] = relative_rms_error(a.double(), r, rms_floor=floor)
        row[f"{name}_vs_linalg"] = relative_rms_error(a.double(), b.double(), rms_floor=floor)
        row[f"{name}_nan"] = int(torch.isnan(a).sum())
    row["lse_inf_where_oracle"] = bool(torch.equal(torch.isinf(ours[1]), torch.isinf(rl)))
    again = _run(q, k, v, do, n, "auto")
    row["backward_bitwise_equal"] = all(torch.equal(a, b) for a, b in zip(ours[2:], again[2:]))
    blind = max(0, BLOCK_SIZE - 1 - (n - m))          # query rows at positions < BS - 1 see no block
    row["blind_rows_zero"] = bool((ours[0][:, :blind] == 0).all() and (ours[2][:, :blind] == 0).all())
    row["gradient_digest"] = hashlib.sha256(b"".join(g.view(torch.int16).cpu().numpy().tobytes()
                                                     for g in ours[2:])).hexdigest()[:16]
    return row


def check_select(case):
    """select_blocks on the GPU against the reference (the same lse): rows whose ids differ, and the largest
    relative gap of the f64 scores between the blocks that differ there (near-ties may order either way: the
    scores are sums of 2^x in f32 in a different order, from the hardware's 2^x)."""
    from nsa_iree.reference import block_scores_reference, select_blocks_reference

    layout, counts, keys = SELECT_CASES[case]
    h, g, d, _, dtype, m, n = _layout(layout)
    missing = _select_kernel_missing(_select_spec(h, g, d, dtype, _slots(counts)))
    if missing:
        return {"check": f"select_{case}", "skipped": missing}
    q, k, _, _ = _inputs(layout)
    k_cmp = nsa_iree.mean_pooling(k, BLOCK_SIZE)
    if keys == "equal":
        k_cmp = k_cmp[:, :1].expand_as(k_cmp).contiguous()
    if not isinstance(counts, int):
        gen = torch.Generator(device="cuda").manual_seed(4)
        counts = torch.randint(*counts, (1, m, k.shape[2]), device="cuda", generator=gen, dtype=torch.int32)
    lse = nsa_iree.compressed_attention(q, k_cmp, k_cmp, BLOCK_SIZE, seq_len=n)[1]
    if keys == "nan":
        k_cmp[:, 3:5] = float("nan")
    with mock.patch.object(api, "output_buffer", _poisoned):
        got = nsa_iree.select_blocks(q, k_cmp, counts, BLOCK_SIZE, lse=lse, seq_len=n)
    again = nsa_iree.select_blocks(q, k_cmp, counts, BLOCK_SIZE, lse=lse, seq_len=n)
    ref = select_blocks_reference(q, k_cmp, counts, BLOCK_SIZE, lse=lse, seq_len=n).to(got.device)
    differ = (got != ref).any(-1)
    row = {"check": f"select_{case}", "rows": int(differ.numel()), "rows_differing": int(differ.sum()),
           "poison_left": int((got == -7).sum()), "deterministic": bool(torch.equal(got, again)),
           "ids_digest": hashlib.sha256(got.cpu().numpy().tobytes()).hexdigest()[:16]}
    if differ.any():
        # at the first slot where a differing row's ids part, the relative gap of the two blocks' f64 scores
        # (inf where one side has no block there: a different count is never a near-tie)
        scores = block_scores_reference(q, k_cmp, BLOCK_SIZE, lse=lse, seq_len=n)        # [B, M, G, C]
        gaps = []
        for b, mm, g in differ.nonzero().tolist()[:64]:
            t = int((got[b, mm, g] != ref[b, mm, g]).nonzero()[0])
            a, r = int(got[b, mm, g, t]), int(ref[b, mm, g, t])
            if min(a, r) < 0:
                gaps.append(float("inf"))
                continue
            sa, sr = float(scores[b, mm, g, a]), float(scores[b, mm, g, r])
            gaps.append(abs(sa - sr) / max(abs(sa), abs(sr), 1e-30))
        row["largest_relative_gap"] = max(gaps)
        b, mm, g = differ.nonzero()[0].tolist()
        row["first_differing"] = {"row": mm, "kv_head": g, "ours": got[b, mm, g].tolist(),
                                  "reference": ref[b, mm, g].tolist()}
    return row


def _window_run(q, k, v, do, w, kernels):
    """o, lse and the gradients of q, k, v of sliding_window_attention with NSA_IREE_KERNELS = kernels, every output
    buffer poisoned."""
    os.environ["NSA_IREE_KERNELS"] = kernels
    try:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        with mock.patch.object(api, "output_buffer", _poisoned):
            o, lse = nsa_iree.sliding_window_attention_fwd(*leaves, w)
            grads = torch.autograd.grad(o, leaves, do)
        return (o.detach(), lse, *grads)
    finally:
        os.environ.pop("NSA_IREE_KERNELS")


def _window_kernels(case) -> dict:
    """The family that renders each selection stage of the case's modules (kernels.choose, the recipe of
    $NSA_IREE_PIPELINES_DIR or the package's): which kernels the row checked."""
    from nsa_iree.kernels import choose
    from nsa_iree.recipes import load_recipe

    spec = _window_spec(case)
    recipe = load_recipe(H200)
    chosen = {stage: choose(stage, spec, recipe) for stage in ("forward", "dq", "dkdv")}
    return {stage: c.family + (f" {c.template}" if c.template else "") for stage, c in chosen.items()}


def check_window(case):
    """sliding_window_attention on the GPU against the f64 oracle and the linalg stages: o, lse and the gradients,
    outputs poisoned, the backward twice bitwise equal (and its digest: another process must print the same); rows
    that see no key (M > N) get o = 0, lse = -inf and dq = 0, keys no row sees dk = dv = 0."""
    from nsa_iree.reference import sliding_window_attention_reference

    layout, w = WINDOW_CASES[case]
    m, n = _layout(layout)[5:]
    q, k, v, do = _inputs(layout)
    ours, again = _window_run(q, k, v, do, w, "auto"), _window_run(q, k, v, do, w, "auto")
    oracle = _window_run(q, k, v, do, w, "linalg")
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    ro, rl = sliding_window_attention_reference(*ref, w)
    reference = (ro, rl, *torch.autograd.grad(ro, ref, do.double()))
    row = {"check": f"window_{case}", "kernels": _window_kernels(case)}
    for name, a, b, r in zip(("o", "lse", "dq", "dk", "dv"), ours, oracle, reference):
        floor = 0.0 if name == "lse" else 1e-3
        row[name] = relative_rms_error(a.double(), r, rms_floor=floor)
        row[f"{name}_vs_linalg"] = relative_rms_error(a.double(), b.double(), rms_floor=floor)
        row[f"{name}_nan"] = int(torch.isnan(a).sum())
    row["backward_bitwise_equal"] = all(torch.equal(a, b) for a, b in zip(ours[2:], again[2:]))
    blind = max(0, m - n)                       # rows before position 0
    row["blind_rows"] = blind
    row["blind_rows_zero"] = bool((ours[0][:, :blind] == 0).all() and torch.isneginf(ours[1][:, :, :blind]).all()
                                  and (ours[2][:, :blind] == 0).all())
    unseen = max(0, n - m - w + 1)              # keys before the first row's window
    row["unseen_keys"] = unseen
    row["unseen_keys_zero"] = bool((ours[3][:, :unseen] == 0).all() and (ours[4][:, :unseen] == 0).all())
    row["gradient_digest"] = hashlib.sha256(b"".join(g.view(torch.int16).cpu().numpy().tobytes()
                                                     for g in ours[2:])).hexdigest()[:16]
    return row


def check_gates(case):
    """gated_sum on the GPU: o and the branches' gradients bitwise equal to the same float32 products and sums in
    torch (16-bit products are exact in float32), the gates' gradients against the f64 oracle, outputs poisoned."""
    from nsa_iree.layer import gated_sum

    layout, branches, ungated_first = GATE_CASES[case]
    h, _, _, dv, dtype, m, _ = LAYOUTS[layout]
    gen = torch.Generator(device="cuda").manual_seed(1)
    outs = [torch.randn(1, m, h, dv, device="cuda", generator=gen).to(dtype) for _ in range(branches)]
    gates = [torch.rand(1, m, h, device="cuda", generator=gen).to(dtype) for _ in range(branches)]
    if ungated_first:
        gates[0] = None
    do = torch.randn(1, m, h, dv, device="cuda", generator=gen).to(dtype)
    leaves = [None if t is None else t.clone().requires_grad_() for pair in zip(outs, gates) for t in pair]
    with mock.patch.object(api, "output_buffer", _poisoned):
        o = gated_sum(*leaves)
        o.backward(do)
    weights = [torch.ones_like(gates[-1]) if g is None else g for g in gates]
    total = sum(x.float() * w.float().unsqueeze(-1) for x, w in zip(outs, weights))
    row = {"check": f"gates_{case}", "o_bitwise": torch.equal(o, total.to(dtype)), "o_nan": int(torch.isnan(o).sum())}
    row["do_bitwise"] = all(torch.equal(leaves[2 * i].grad, (do.float() * w.float().unsqueeze(-1)).to(dtype))
                            for i, w in enumerate(weights))
    row["dg"] = max(relative_rms_error(leaves[2 * i + 1].grad.double(), (do.double() * x.double()).sum(-1))
                    for i, x in enumerate(outs) if gates[i] is not None)
    row["grad_nan"] = sum(int(torch.isnan(t.grad).sum()) for t in leaves if t is not None)
    return row


def main(argv) -> int:
    only = argv[argv.index("--only") + 1].split(",") if "--only" in argv else None
    unknown = sorted(set(only or ()) - set(GROUPS))
    if unknown:
        raise SystemExit(f"no check group {unknown}: the groups are {list(GROUPS)}")
    if "--compile" in argv:
        from nsa_iree.compiler import compile_loaded

        for spec, variant in specs(only):
            print(compile_loaded(spec, variant)[0].path.name, flush=True)
        return 0
    groups = only or list(GROUPS)
    picked = argv[argv.index("--cases") + 1].split(",") if "--cases" in argv else None
    known = {case for group in groups for case in GROUPS[group][0]}
    if picked and set(picked) - known:
        raise SystemExit(f"no case {sorted(set(picked) - known)} in the groups {groups}")
    failed = counted = skipped = 0
    for group in groups:
        cases, run, passes = GROUPS[group]
        for case in cases:
            if picked and case not in picked:
                continue
            row = run(case)
            row["ok"] = passes(case, row)
            failed += not row["ok"]
            skipped += "skipped" in row
            counted += 1
            print(json.dumps(row), flush=True)
    print(json.dumps({"groups": groups, "checks": counted, "skipped": skipped, "failed": failed}), flush=True)
    return 1 if failed else 0


def _layout_passes(layout, row):
    names = ("o", "lse", "dq", "dk", "dv")
    return (all(row[x] < TOLERANCE[LAYOUTS[layout][4]] for x in names) and all(row[f"{x}_nan"] == 0 for x in names)
            and row["lse_inf_where_oracle"] and row["backward_bitwise_equal"] and row["blind_rows_zero"])


def _select_passes(case, row):
    if "skipped" in row:
        return True
    exact = SELECT_CASES[case][2] != "pooled"
    return row["poison_left"] == 0 and row["deterministic"] and (
        row["rows_differing"] == 0 if exact else row.get("largest_relative_gap", 0.0) < 1e-3)


def _window_passes(case, row):
    tol = TOLERANCE[_layout(WINDOW_CASES[case][0])[4]]
    return (all(row[x] < tol and row[f"{x}_vs_linalg"] < tol and row[f"{x}_nan"] == 0
                for x in ("o", "lse", "dq", "dk", "dv"))
            and row["backward_bitwise_equal"] and row["blind_rows_zero"] and row["unseen_keys_zero"])


def _gates_pass(case, row):
    return (row["o_bitwise"] and row["do_bitwise"] and row["o_nan"] == 0 and row["grad_nan"] == 0
            and row["dg"] < TOLERANCE[LAYOUTS[GATE_CASES[case][0]][4]])


# The checks by group (--only GROUP,...): the cases, the check, whether its row passes.
GROUPS = {"layouts": (LAYOUTS, check, _layout_passes), "select": (SELECT_CASES, check_select, _select_passes),
          "window": (WINDOW_CASES, check_window, _window_passes), "gates": (GATE_CASES, check_gates, _gates_pass)}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
