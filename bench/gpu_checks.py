"""GPU robustness checks (run on the H200 through bench/run_h200.sh-style setup; no timing):

    python3 -m bench.gpu_checks sanitize      # every nsa_iree dispatch of one forward + both backwards,
                                              #   meant to run under `compute-sanitizer --tool memcheck|racecheck`
    python3 -m bench.gpu_checks large         # 64k and 128k tokens, B = 2, against fla (no 32-bit overflow)
    python3 -m bench.gpu_checks determinism   # two-pass bitwise identical over repeated runs on the GPU
    python3 -m bench.gpu_checks inversion     # the inversion stage's lists on the GPU against the oracle
"""

from __future__ import annotations

import json
import sys

import torch

import nsa_iree
from nsa_iree.demo import relative_rms_error
from nsa_iree.selection import realistic_block_indices

from .bench import CONFIGS, fla_function


def _inputs(cfg, batch, seq, seed=0, device="cuda"):
    gen = torch.Generator().manual_seed(seed)
    h, g, d, dv = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["value_dim"]
    q, k, v, do = (torch.randn(batch, seq, *s, generator=gen).to(device=device, dtype=torch.bfloat16)
                   for s in ((h, d), (g, d), (g, dv), (h, dv)))
    idx = realistic_block_indices(batch, seq, seq, g, cfg["num_blocks"], cfg["block_size"], generator=gen).to(device)
    return q, k, v, do, idx


def sanitize():
    """A mid-size problem whose selection has -1 padding, negative, future and out-of-range indices."""
    cfg = CONFIGS["anchors"]
    q, k, v, do, idx = _inputs(cfg, 2, 1000)
    nb = -(-1000 // cfg["block_size"])
    idx[:, :, :, -1] = -1
    idx[:, ::3, :, -2] = nb + 5
    idx[:, 1::3, :, -2] = -(2**31)
    idx[:, 2::3, :, -2] = nb - 1                       # future for most rows
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, cfg["block_size"])
    out = {}
    for variant in ("two-pass", "one-pass"):
        grads = nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, cfg["block_size"], variant=variant)
        torch.cuda.synchronize()
        out[variant] = [bool(torch.isfinite(t).all()) for t in grads]
    print(json.dumps({"finite": out}))


def large():
    cfg = CONFIGS["anchors"]
    fn = fla_function()
    results = []
    for seq in (65536, 131072):
        q, k, v, do, idx = _inputs(cfg, 2, seq)
        o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, cfg["block_size"])
        dq, dk, dv = nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, cfg["block_size"])
        row = {"seq": seq, "batch": 2}
        if fn is not None:
            leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
            o_fla = fn.apply(*leaves, idx, cfg["num_blocks"], cfg["block_size"], cfg["head_dim"] ** -0.5, None)
            o_fla.backward(do)
            row.update({name: relative_rms_error(a, b.grad if b.grad is not None else b)
                        for name, a, b in (("dq", dq, leaves[0]), ("dk", dk, leaves[1]), ("dv", dv, leaves[2]))})
            row["o"] = relative_rms_error(o, o_fla.detach())
            # The last batch's last rows exercise the largest offsets of every address computation.
            row["o_last_rows"] = relative_rms_error(o[1, -64:], o_fla.detach()[1, -64:])
        row["finite"] = all(bool(torch.isfinite(t).all()) for t in (o, dq, dk, dv))
        results.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, do, idx, o, lse, dq, dk, dv
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


def inversion():
    """Stage-level check for a new inversion: its (entries, piece_start, piece_count) against the oracle."""
    from nsa_iree.api import describe, kernels
    from nsa_iree.pipelines import load_recipe
    from nsa_iree.reference import block_lists_reference

    cfg = CONFIGS["anchors"]
    for seq in (1, 300, 2048):
        q, k, v, do, idx = _inputs(cfg, 2, seq)
        module = kernels(describe(q, k, v, idx, cfg["block_size"]), "two-pass", q.device)
        got = [module.device.export_tensor(x).cpu() for x in module.call("invert_block_indices", idx, seq)]
        want = block_lists_reference(idx.cpu(), cfg["block_size"], seq, load_recipe("cuda").rows_per_piece)
        same = {name: bool(a.shape == e.shape and torch.equal(a, e))
                for name, a, e in zip(("entries", "piece_start", "piece_count"), got, want)}
        print(json.dumps({"seq": seq, **same}), flush=True)


if __name__ == "__main__":
    {"sanitize": sanitize, "large": large, "determinism": determinism, "inversion": inversion}[sys.argv[1]]()
