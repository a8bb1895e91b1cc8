"""The compression branch on a GPU: nsa_iree's compressed attention (mean pooling included) checked against the
f64 oracle, then timed in one process with fla-core's mean_pooling + parallel_nsa_compression.

    python3 -m bench.compression_h200 OUT      (artifacts prebuilt: bench/run_compression_h200.sh)

Writes OUT/compression.json and prints one JSON line per row.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

import nsa_iree
from nsa_iree.benchmark import timed
from nsa_iree.reference import compressed_attention_backward_reference, compressed_attention_reference
from nsa_iree.testing import relative_rms_error

ANCHORS = dict(heads=64, kv_heads=4, head_dim=128, value_dim=128, block_size=64)
CHECKS = {"n2048": (2048, None), "m1000_n3000": (1000, 3000)}   # (M, N)
LENGTHS = (8192, 16384, 32768, 65536)


def _inputs(m, n, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    h, g, d, dv = ANCHORS["heads"], ANCHORS["kv_heads"], ANCHORS["head_dim"], ANCHORS["value_dim"]
    q = torch.randn(1, m, h, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(1, n, g, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(1, n, g, dv, device="cuda", generator=gen).to(dtype)
    return q, k, v


def check(name, m, n):
    """o, lse, dq, dk, dv (through the pooling) against the f64 oracle; the backward twice, bitwise equal."""
    bs = ANCHORS["block_size"]
    q, k, v = _inputs(m, n or m)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    k_cmp, v_cmp = nsa_iree.mean_pooling(leaves[1], bs), nsa_iree.mean_pooling(leaves[2], bs)
    o, lse = nsa_iree.compressed_attention(leaves[0], k_cmp, v_cmp, bs, seq_len=n)
    do = torch.randn(o.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(2)).to(o.dtype)
    o.backward(do)
    kc, vc = (t.detach().double() for t in (k_cmp, v_cmp))
    ro, rl = compressed_attention_reference(q.double(), kc, vc, bs, seq_len=n)
    _, rdq, rdkc, rdvc = compressed_attention_backward_reference(q.double(), kc, vc, ro, rl, do.double(), bs,
                                                                 seq_len=n)
    # the pooling's backward (each token gets its block's gradient over the block's count), in f64
    count = torch.tensor([min(bs, (n or m) - c * bs) for c in range(kc.shape[1])], device="cuda", dtype=torch.float64)
    spread = lambda g: (g / count.view(1, -1, 1, 1)).repeat_interleave(bs, dim=1)[:, :(n or m)]  # noqa: E731
    row = {"check": name, "o": relative_rms_error(o.double(), ro), "lse": relative_rms_error(lse.double(), rl),
           "dq": relative_rms_error(leaves[0].grad.double(), rdq, rms_floor=1e-3),
           "dk": relative_rms_error(leaves[1].grad.double(), spread(rdkc), rms_floor=1e-3),
           "dv": relative_rms_error(leaves[2].grad.double(), spread(rdvc), rms_floor=1e-3)}
    again = [t.clone().requires_grad_() for t in (q, k, v)]
    o2, _ = nsa_iree.compressed_attention(again[0], nsa_iree.mean_pooling(again[1], bs),
                                          nsa_iree.mean_pooling(again[2], bs), bs, seq_len=n)
    o2.backward(do)
    row["backward_bitwise_equal"] = all(torch.equal(a.grad, b.grad) for a, b in zip(leaves, again))
    row["blind_rows_zero"] = bool((o[:, :bs - 1] == 0).all()) if n is None else None
    # what another process must reproduce bit for bit (bench/run_compression_h200.sh runs the checks twice)
    row["gradient_digest"] = hashlib.sha256(b"".join(t.grad.view(torch.int16).cpu().numpy().tobytes()
                                                     for t in leaves)).hexdigest()[:16]
    return row


def _median_ms(fn, repeats=10):
    return timed(fn, torch.device("cuda"), repeats, warmup=3) * 1e3


def timing(n):
    bs, h = ANCHORS["block_size"], ANCHORS["heads"]
    q, k, v = _inputs(n, n)
    do = torch.randn(1, n, h, ANCHORS["value_dim"], device="cuda").to(q.dtype)
    # FLOPs of the forward: per row, 2 (D + Dv) per visible compressed key per head
    visible = sum(max(0, (p + 1) // bs) for p in range(n))
    flops = 2 * h * (ANCHORS["head_dim"] + ANCHORS["value_dim"]) * visible
    mine_k, mine_v = nsa_iree.mean_pooling(k, bs), nsa_iree.mean_pooling(v, bs)
    rows = {"n": n, "forward_tflop": flops / 1e12}

    def ours_forward():
        nsa_iree.compressed_attention(q, mine_k, mine_v, bs)

    def ours_training():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        o, _ = nsa_iree.compressed_attention(leaves[0], nsa_iree.mean_pooling(leaves[1], bs),
                                             nsa_iree.mean_pooling(leaves[2], bs), bs)
        o.backward(do)

    rows["nsa_iree_forward_ms"] = _median_ms(ours_forward)
    rows["nsa_iree_fwd_bwd_with_pooling_ms"] = _median_ms(ours_training)
    try:
        from fla.ops.nsa.compression import parallel_nsa_compression
        from fla.ops.utils.pooling import mean_pooling
    except ImportError as err:
        rows["fla"] = f"not importable: {err}"
        return rows
    fk, fv = mean_pooling(k, bs), mean_pooling(v, bs)

    def fla_forward():
        parallel_nsa_compression(q, fk, fv, TK=n, block_size=bs)

    def fla_training():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        o, _ = parallel_nsa_compression(leaves[0], mean_pooling(leaves[1], bs), mean_pooling(leaves[2], bs), TK=n,
                                        block_size=bs)
        o.backward(do)

    rows["fla_forward_ms"] = _median_ms(fla_forward)
    rows["fla_fwd_bwd_with_pooling_ms"] = _median_ms(fla_training)
    rows["forward_ratio_fla_over_ours"] = rows["fla_forward_ms"] / rows["nsa_iree_forward_ms"]
    rows["training_ratio_ours_over_fla"] = (rows["nsa_iree_fwd_bwd_with_pooling_ms"]
                                            / rows["fla_fwd_bwd_with_pooling_ms"])
    rows["nsa_iree_forward_tflops"] = flops / rows["nsa_iree_forward_ms"] / 1e9
    # fla vs ours on the same compressed keys: their o should agree (fla's mean_pooling and ours are the same mean)
    o_mine, _ = nsa_iree.compressed_attention(q, mine_k, mine_v, bs)
    o_fla, _ = parallel_nsa_compression(q, fk, fv, TK=n, block_size=bs)
    rows["o_fla_vs_ours"] = relative_rms_error(o_fla.float(), o_mine.float())
    return rows


def main(out: str) -> None:
    results = {"device": torch.cuda.get_device_name(), "layout": ANCHORS, "checks": [], "timings": []}
    for name, (m, n) in CHECKS.items():
        results["checks"].append(check(name, m, n))
        print(json.dumps(results["checks"][-1]), flush=True)
    for n in LENGTHS:
        results["timings"].append(timing(n))
        print(json.dumps(results["timings"][-1]), flush=True)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "compression.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
