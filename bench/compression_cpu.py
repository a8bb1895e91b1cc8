"""The compression branch on the CPU against torch-eager versions of the same math, in one process: mean pooling +
compressed attention (one dense masked softmax over the compressed keys), and select_blocks (lse given; einsum,
probabilities, torch.topk after the forced blocks).

    python3 -m bench.compression_cpu [--seq 4096] [--repeats 5] [--slots 16]

Layout: the benchmark's "cpu" configuration (H 16, G 1, D = Dv = 64, BS 64, f32). Prints a markdown table per
function. Median of `repeats` after 2 warm-ups (nsa_iree.benchmark.timed).
"""

from __future__ import annotations

import argparse

import torch

import nsa_iree
from nsa_iree.benchmark import (CONFIGS, timed, torch_eager_compressed_attention, torch_eager_mean_pooling,
                                torch_eager_select_blocks)
from nsa_iree.reference import select_blocks_reference
from nsa_iree.testing import relative_rms_error


def _seconds(fn, repeats):
    return timed(fn, torch.device("cpu"), repeats)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[4096])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slots", type=int, default=16, help="select_blocks' S")
    args = parser.parse_args(argv)
    cfg = CONFIGS["cpu"]
    bs = cfg["block_size"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; layout cpu: {cfg}")
    print("| N | forward: nsa_iree / eager (ms) | eager/ours | fwd + bwd with pooling: nsa_iree / eager (ms) | "
          "eager/ours | o vs eager |")
    print("|---|---|---|---|---|---|")
    for n in args.seq:
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(1, n, cfg["heads"], cfg["head_dim"], generator=gen)
        k = torch.randn(1, n, cfg["kv_heads"], cfg["head_dim"], generator=gen)
        v = torch.randn(1, n, cfg["kv_heads"], cfg["value_dim"], generator=gen)
        do = torch.randn(1, n, cfg["heads"], cfg["value_dim"], generator=gen)
        impls = {"nsa_iree": (nsa_iree.mean_pooling, nsa_iree.compressed_attention),
                 "eager": (torch_eager_mean_pooling, torch_eager_compressed_attention)}
        row = {}
        for name, (pool, attend) in impls.items():
            kc, vc = pool(k, bs), pool(v, bs)
            row[f"{name}_forward"] = _seconds(lambda: attend(q, kc, vc, bs), args.repeats)

            def training():
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                o, _ = attend(leaves[0], pool(leaves[1], bs), pool(leaves[2], bs), bs)
                o.backward(do)
            row[f"{name}_training"] = _seconds(training, args.repeats)
        o_mine, _ = nsa_iree.compressed_attention(q, nsa_iree.mean_pooling(k, bs), nsa_iree.mean_pooling(v, bs), bs)
        k_eager, v_eager = torch_eager_mean_pooling(k, bs), torch_eager_mean_pooling(v, bs)
        o_eager, _ = torch_eager_compressed_attention(q, k_eager, v_eager, bs)
        err = relative_rms_error(o_mine, o_eager)
        print(f"| {n} | {row['nsa_iree_forward'] * 1e3:.2f} / {row['eager_forward'] * 1e3:.2f} | "
              f"{row['eager_forward'] / row['nsa_iree_forward']:.2f} | {row['nsa_iree_training'] * 1e3:.1f} / "
              f"{row['eager_training'] * 1e3:.1f} | {row['eager_training'] / row['nsa_iree_training']:.2f} | "
              f"{err:.1e} |", flush=True)
    print(f"\n| N | select_blocks (S {args.slots}, lse given): nsa_iree / eager (ms) | eager/ours | rows where the "
          "f64 oracle's ids equal ours | rows where eager's equal ours |")
    print("|---|---|---|---|---|")
    for n in args.seq:
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(1, n, cfg["heads"], cfg["head_dim"], generator=gen)
        k_cmp = torch.randn(1, -(-n // bs), cfg["kv_heads"], cfg["head_dim"], generator=gen)
        scale = cfg["head_dim"] ** -0.5
        lse = nsa_iree.compressed_attention(q, k_cmp, k_cmp, bs)[1]
        ids = nsa_iree.select_blocks(q, k_cmp, args.slots, bs, lse=lse)
        exact = (ids == select_blocks_reference(q, k_cmp, args.slots, bs, lse=lse)).all(-1).double().mean()
        agree = (torch_eager_select_blocks(q, k_cmp, lse, args.slots, bs, scale) == ids).all(-1).double().mean()
        ours = _seconds(lambda: nsa_iree.select_blocks(q, k_cmp, args.slots, bs, lse=lse), args.repeats)
        eager = _seconds(lambda: torch_eager_select_blocks(q, k_cmp, lse, args.slots, bs, scale), args.repeats)
        print(f"| {n} | {ours * 1e3:.2f} / {eager * 1e3:.2f} | {eager / ours:.2f} | {float(exact):.4f} | "
              f"{float(agree):.4f} |", flush=True)


if __name__ == "__main__":
    main()
