"""The compression branch on a GPU: nsa_iree's compressed attention (mean pooling included) timed in one process
with fla-core's mean_pooling + parallel_nsa_compression (the checks: bench/compression_gpu_checks.py).

    python3 -m bench.compression_h200 OUT      (artifacts prebuilt: bench/run_compression_h200.sh)

Writes OUT/compression.json and prints one JSON line per row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import nsa_iree
from nsa_iree.benchmark import timed
from nsa_iree.testing import relative_rms_error

from .compression_gpu_checks import TIMED_LENGTHS as LENGTHS
from .compression_gpu_checks import TIMED_SLOTS as SLOTS

ANCHORS = dict(heads=64, kv_heads=4, head_dim=128, value_dim=128, block_size=64)


def _inputs(m, n, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    h, g, d, dv = ANCHORS["heads"], ANCHORS["kv_heads"], ANCHORS["head_dim"], ANCHORS["value_dim"]
    q = torch.randn(1, m, h, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(1, n, g, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(1, n, g, dv, device="cuda", generator=gen).to(dtype)
    return q, k, v


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

    def ours_forward_and_select():
        _, lse = nsa_iree.compressed_attention(q, mine_k, mine_v, bs)
        nsa_iree.select_blocks(q, mine_k, SLOTS, bs, lse=lse)

    ours_lse = nsa_iree.compressed_attention(q, mine_k, mine_v, bs)[1]
    rows["nsa_iree_forward_ms"] = _median_ms(ours_forward)
    rows["nsa_iree_select_ms"] = _median_ms(lambda: nsa_iree.select_blocks(q, mine_k, SLOTS, bs, lse=ours_lse))
    rows["nsa_iree_forward_and_select_ms"] = _median_ms(ours_forward_and_select)
    rows["nsa_iree_fwd_bwd_with_pooling_ms"] = _median_ms(ours_training)
    try:
        from fla.ops.nsa.compression import parallel_nsa_compression
        from fla.ops.nsa.parallel import parallel_nsa_topk
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

    # fla's top-k with the lse of its compression, as parallel_nsa runs it ([B, M, H] there; its scale is not
    # defaulted)
    scale = ANCHORS["head_dim"] ** -0.5
    fla_lse = parallel_nsa_compression(q, fk, fv, TK=n, block_size=bs)[1]

    def fla_topk():
        return parallel_nsa_topk(q, fk, TK=n, lse=fla_lse, block_counts=SLOTS, block_size=bs, scale=scale)

    def fla_forward_and_topk():
        _, lse = parallel_nsa_compression(q, fk, fv, TK=n, block_size=bs)
        parallel_nsa_topk(q, fk, TK=n, lse=lse, block_counts=SLOTS, block_size=bs, scale=scale)

    rows["fla_forward_ms"] = _median_ms(fla_forward)
    rows["fla_topk_ms"] = _median_ms(fla_topk)
    rows["fla_forward_and_topk_ms"] = _median_ms(fla_forward_and_topk)
    rows["select_ratio_ours_over_fla"] = rows["nsa_iree_select_ms"] / rows["fla_topk_ms"]
    # the same blocks? per (row, kv head), the sets of ids (fla's order differs; -1 padding dropped)
    ours_ids = nsa_iree.select_blocks(q, mine_k, SLOTS, bs, lse=ours_lse).long().sort(-1).values
    fla_ids = fla_topk().long().clamp_min(-1).sort(-1).values
    rows["rows_same_blocks_as_fla"] = float((ours_ids == fla_ids).all(-1).float().mean())
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
    results = {"device": torch.cuda.get_device_name(), "layout": ANCHORS, "timings": []}
    for n in LENGTHS:
        results["timings"].append(timing(n))
        print(json.dumps(results["timings"][-1]), flush=True)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "compression.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
