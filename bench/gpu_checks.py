"""GPU robustness checks (run on the H200 through bench/run_h200.sh-style setup; no timing):

    python3 -m bench.gpu_checks sanitize [SEQ]  # every nsa_iree dispatch of one forward + both backwards,
                                              #   meant to run under `compute-sanitizer --tool memcheck|racecheck`
                                              #   (racecheck is slow: pass a small SEQ)
    python3 -m bench.gpu_checks large         # 64k and 128k tokens, B = 2, against fla (no 32-bit overflow)
    python3 -m bench.gpu_checks determinism   # two-pass bitwise identical over repeated runs on the GPU
    python3 -m bench.gpu_checks inversion     # the inversion stage's lists on the GPU against the oracle
    python3 -m bench.gpu_checks nonfinite     # NaN / Inf in an unselected block reaches no output
    python3 -m bench.gpu_checks packed [SEQ]  # cu_seqlens at 64k: each document alone, fla, determinism
    python3 -m bench.gpu_checks row_slices    # the two-pass in slices of query rows against f64 and unsliced
    python3 -m bench.gpu_checks dkdv_f32 [SEQ] # the float32 dk/dv modules (nsa_iree.distributed's) against the
                                              #   input-dtype ones: two-pass rounded bitwise equal, one-pass close
"""

from __future__ import annotations

import json
import sys

import torch

import nsa_iree
from nsa_iree.testing import relative_rms_error

from .bench import CONFIGS, DOC_LENGTHS, fla_function, make_packed_problem, make_problem


def _inputs(cfg, batch, seq, seed=0):
    return make_problem(cfg, seq, "realistic", torch.device("cuda"), seed=seed, batch=batch, generate_on_device=True)


def _with_bad_slots(idx, seq, block_size):
    """-1 padding, far out-of-range, INT32_MIN and future slots mixed into a realistic selection."""
    nb = -(-seq // block_size)
    idx[:, :, :, -1] = -1
    idx[:, ::3, :, -2] = nb + 5
    idx[:, 1::3, :, -2] = -(2**31)
    idx[:, 2::3, :, -2] = nb - 1                       # future for most rows
    return idx


def sanitize(seq=1000, variants=("two-pass", "one-pass"), config="anchors"):
    """A mid-size problem whose selection has -1 padding, negative, future and out-of-range indices (the benchmark's
    `config` layout)."""
    cfg = CONFIGS[config]
    q, k, v, do, idx = _inputs(cfg, 2, seq)
    idx = _with_bad_slots(idx, seq, cfg["block_size"])
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, cfg["block_size"])
    torch.cuda.synchronize()
    out = {"forward": [bool(torch.isfinite(o).all()), bool((torch.isfinite(lse) | (lse == float("-inf"))).all())]}
    for variant in variants:
        grads = nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, cfg["block_size"], variant=variant)
        torch.cuda.synchronize()
        out[variant] = [bool(torch.isfinite(t).all()) for t in grads]
    print(json.dumps({"seq": seq, "finite": out}))


def large(seqs=(65536, 131072)):
    """B = 2 at 64k and 128k tokens against fla, compared on the GPU (relative_rms_error sums in f64 chunks;
    a whole-tensor f64 comparison asked for 64 GiB at 128k and failed)."""
    cfg = CONFIGS["anchors"]
    fn = fla_function()
    for seq in seqs:
        q, k, v, do, idx = _inputs(cfg, 2, seq)
        o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, cfg["block_size"])
        dq, dk, dv = nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, cfg["block_size"])
        torch.cuda.synchronize()
        ours = {"o": o, "dq": dq, "dk": dk, "dv": dv}
        row = {"seq": seq, "batch": 2, "finite": all(bool(torch.isfinite(t).all()) for t in ours.values())}
        del lse
        torch.cuda.empty_cache()
        if fn is not None:
            leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
            try:
                o_fla = fn.apply(*leaves, idx, cfg["num_blocks"], cfg["block_size"], cfg["head_dim"] ** -0.5, None)
                o_fla.backward(do)
                theirs = {"o": o_fla.detach(), "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad}
                row.update({name: relative_rms_error(ours[name], theirs[name]) for name in theirs})
                # The last batch's last rows and blocks exercise the largest offsets of every address computation.
                row["o_last_rows"] = relative_rms_error(o[1:, -64:], theirs["o"][1:, -64:])
                row["dk_last_rows"] = relative_rms_error(dk[1:, -1024:], theirs["dk"][1:, -1024:])
                del o_fla, theirs
            except torch.OutOfMemoryError as err:
                row["fla"] = f"out of memory: {str(err).splitlines()[0]}"
            del leaves
        print(json.dumps(row), flush=True)
        del q, k, v, do, idx, o, dq, dk, dv, ours
        torch.cuda.empty_cache()


def determinism(repeats=20):
    cfg = CONFIGS["anchors"]
    q, k, v, do, idx = _inputs(cfg, 1, 16384)
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, cfg["block_size"])
    first = nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, cfg["block_size"])
    same = 0
    for _ in range(repeats):
        again = nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, cfg["block_size"])
        same += all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(first, again))
    one = [nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, cfg["block_size"], variant="one-pass")
           for _ in range(3)]
    one_same = sum(all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(one[0], x))
                   for x in one[1:])
    print(json.dumps({"two_pass_identical_runs": f"{same}/{repeats}",
                      "one_pass_identical_runs": f"{one_same}/2 (not expected: f32 atomics)"}))


def inversion(seqs=(1, 300, 2048, 16384)):
    """Stage-level check for a new inversion: its (entries, piece_start, piece_count) against the oracle,
    for realistic selections and for selections with skipped slots of every kind."""
    from nsa_iree.api import describe, kernels
    from nsa_iree.recipes import load_recipe
    from nsa_iree.reference import block_lists_reference

    cfg = CONFIGS["anchors"]
    for seq in seqs:
        for selection in ("realistic", "bad_slots"):
            q, k, v, do, idx = _inputs(cfg, 2 if seq <= 2048 else 1, seq)
            if selection == "bad_slots":
                idx = _with_bad_slots(idx, seq, cfg["block_size"])
            module = kernels(describe(q, k, v, idx, cfg["block_size"]), "two-pass", q.device)
            got = [module.device.copy_to_host(x) for x in module.call("invert_block_indices", idx, seq)]
            want = block_lists_reference(idx.cpu(), cfg["block_size"], seq, load_recipe("cuda").rows_per_piece)
            same = {name: bool(a.shape == e.shape and torch.equal(a, e))
                    for name, a, e in zip(("entries", "piece_start", "piece_count"), got, want)}
            print(json.dumps({"seq": seq, "selection": selection, **same}), flush=True)


def nonfinite(seq=2048):
    """NaN / Inf in K and V of a block no row selects (every slot naming it set to -1) must not reach any
    output: skipped slots gather the zero block."""
    cfg = CONFIGS["anchors"]
    q, k, v, do, idx = _inputs(cfg, 2, seq)
    idx = torch.where(idx == 0, torch.full_like(idx, -1), idx)
    k[:, :cfg["block_size"]] = float("nan")
    v[:, :cfg["block_size"]] = float("inf")
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, cfg["block_size"])
    out = {"o": bool(torch.isfinite(o).all())}
    for variant in ("two-pass", "one-pass"):
        grads = nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, cfg["block_size"], variant=variant)
        out[variant] = [bool(torch.isfinite(t).all()) for t in grads]
    print(json.dumps({"seq": seq, "finite": out}))


def dkdv_f32(seq=4000):
    """The backward modules that leave dk and dv in float32 (KernelSpec.dkdv_dtype, what the sharded call adds
    across ranks) against the ones that round them to bf16: the two-pass's rounded once equal them bit for bit
    (the same kernels, the same sums), the one-pass's (atomics) within rounding; dq equal; every output finite."""
    from nsa_iree.api import backward_into

    out = {}
    for name in ("anchors", "paper"):
        cfg = CONFIGS[name]
        q, k, v, do, idx = _inputs(cfg, 2, seq)
        idx = _with_bad_slots(idx, seq, cfg["block_size"])
        scale = cfg["head_dim"] ** -0.5
        o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, cfg["block_size"])
        for variant in ("two-pass", "one-pass"):
            rounded = nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, cfg["block_size"], variant=variant)
            dq = torch.full_like(q, float("nan"))
            dk, dv = (torch.full(t.shape, float("nan"), device=t.device) for t in (k, v))
            backward_into(dq, dk, dv, q, k, v, o, lse, do, idx.to(torch.int32), cfg["block_size"], scale, variant)
            torch.cuda.synchronize()
            row = {"finite": [bool(torch.isfinite(t).all()) for t in (dq, dk, dv)]}
            for what, wide, narrow in (("dk", dk, rounded[1]), ("dv", dv, rounded[2])):
                row[f"{what} bitwise"] = bool(torch.equal(wide.to(narrow.dtype).view(torch.int16),
                                                          narrow.view(torch.int16)))
                row[f"{what} rel"] = relative_rms_error(wide.to(narrow.dtype), narrow)
                row[f"{what} f32 vs bf16 rel"] = relative_rms_error(narrow, wide)
            row["dq bitwise"] = bool(torch.equal(dq.view(torch.int16), rounded[0].view(torch.int16)))
            out[f"{name} {variant}"] = row
    print(json.dumps({"seq": seq, "dkdv_f32": out}, indent=1))


def row_slices(seq=3000, rows=700, configs=("hpg4", "hpg1")):
    """The two-pass in slices of `rows` query rows (backward_into's rows_per_slice, the default where dk/dv makes
    dq's partials on the hopper target) against the f64 reference and the unsliced call, B 2, bad slots: dq bitwise
    the unsliced dq, dk and dv close (summed over the slices in f32), a second sliced run bitwise equal, every
    output written; and the forward in slices (forward_into's, over the pieces at these group sizes): o and lse
    bitwise the unsliced call's."""
    from nsa_iree.api import backward_into, forward_into
    from nsa_iree.reference import selection_attention_backward_reference

    for name in configs:
        cfg = CONFIGS[name]
        q, k, v, do, idx = _inputs(cfg, 2, seq)
        idx = _with_bad_slots(idx, seq, cfg["block_size"]).to(torch.int32)
        scale = cfg["head_dim"] ** -0.5
        o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, cfg["block_size"])
        runs = []
        for slice_rows in (rows, rows, None):
            grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
            backward_into(*grads, q, k, v, o, lse, do, idx, cfg["block_size"], scale, "two-pass",
                          rows_per_slice=slice_rows)
            torch.cuda.synchronize()
            runs.append(grads)
        _, *ref = selection_attention_backward_reference(q.cpu(), k.cpu(), v.cpu(), o.cpu(), lse.cpu(), do.cpu(),
                                                         idx.cpu(), cfg["block_size"])
        sliced, again, whole = runs
        forwards = []
        for slice_rows in (rows, None):
            o_lse = (torch.full_like(o, float("nan")), torch.full_like(lse, float("nan")))
            forwards.append(forward_into(*o_lse, q, k, v, idx, cfg["block_size"], scale, rows_per_slice=slice_rows))
        torch.cuda.synchronize()
        row = {"config": name, "seq": seq, "rows_per_slice": rows,
               "forward_bitwise_unsliced": all(torch.equal(a, b) for a, b in zip(*forwards)),
               "finite": all(bool(torch.isfinite(t).all()) for t in sliced),
               "bitwise_repeat": all(torch.equal(a, b) for a, b in zip(sliced, again)),
               "dq_bitwise_unsliced": torch.equal(sliced[0], whole[0])}
        for what, x, y, r in zip(("dq", "dk", "dv"), sliced, whole, ref):
            row[f"{what}_sliced_vs_f64"] = relative_rms_error(x.cpu(), r, rms_floor=1e-3)
            row[f"{what}_unsliced_vs_f64"] = relative_rms_error(y.cpu(), r, rms_floor=1e-3)
        print(json.dumps(row), flush=True)


def packed(seq=65536, device="cuda", config="anchors", doc_lengths=DOC_LENGTHS):
    """Documents of 1k to 16k tokens packed with cu_seqlens (realistic selections inside each): the packed
    call against nsa_iree's unpacked call on every document alone (bit for bit expected from the two-pass
    variant: the same rows and blocks summed in the same order), against fla with the same cu_seqlens, and
    twice in a row (two-pass bitwise reproducible); the one-pass variant against the two-pass one.
    (device, config and doc_lengths let a small CPU run try the script.)"""
    cfg = CONFIGS[config]
    bs = cfg["block_size"]
    q, k, v, do, idx, cu = make_packed_problem(cfg, seq, torch.device(device), doc_lengths)
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, bs, cu_seqlens=cu)
    grads = nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, bs, cu_seqlens=cu)
    ours = {"o": o, "lse": lse, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
    bounds = cu.tolist()
    row = {"seq": seq, "documents": len(bounds) - 1,
           "finite": all(bool(torch.isfinite(t).all()) for t in ours.values())}
    bits = lambda t: t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)  # noqa: E731
    alone, worst = True, {}
    for a, b in zip(bounds, bounds[1:]):
        o1, lse1 = nsa_iree.selection_attention_fwd(q[:, a:b], k[:, a:b], v[:, a:b], idx[:, a:b], bs)
        g1 = nsa_iree.selection_attention_bwd(q[:, a:b], k[:, a:b], v[:, a:b], o1, lse1, do[:, a:b], idx[:, a:b], bs)
        for name, x, y in zip(ours, (o1, lse1, *g1), (o[:, a:b], lse[:, :, a:b], *(g[:, a:b] for g in grads))):
            alone &= torch.equal(bits(x), bits(y))
            worst[name] = max(worst.get(name, 0.0), relative_rms_error(y, x))
    row["equal_to_documents_alone_bitwise"] = bool(alone)
    row["worst_error_against_documents_alone"] = worst
    again = nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, bs, cu_seqlens=cu)
    row["two_pass_reproducible"] = all(torch.equal(bits(a), bits(b)) for a, b in zip(grads, again))
    one = nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, bs, variant="one-pass", cu_seqlens=cu)
    row["one_pass_vs_two_pass"] = {n: relative_rms_error(a, b) for n, a, b in zip(("dq", "dk", "dv"), one, grads)}
    del again, one
    fn = fla_function()
    if fn is not None and q.is_cuda:
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        o_fla = fn.apply(*leaves, idx.to(torch.int32), cfg["num_blocks"], bs, cfg["head_dim"] ** -0.5,
                         cu.to(torch.int64))
        o_fla.backward(do)
        theirs = {"o": o_fla.detach(), "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad}
        row["against_fla"] = {name: relative_rms_error(ours[name], theirs[name]) for name in theirs}
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    check = {"sanitize": sanitize, "large": large, "determinism": determinism, "inversion": inversion,
             "nonfinite": nonfinite, "packed": packed, "dkdv_f32": dkdv_f32, "row_slices": row_slices}[sys.argv[1]]
    sizes = [int(s) for s in sys.argv[2:]]        # optional sequence lengths
    if sizes:
        check(*([sizes] if check in (large, inversion) else sizes))
    else:
        check()
