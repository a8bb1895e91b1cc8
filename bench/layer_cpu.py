"""The whole NSA layer's attention on the CPU against the same math in eager torch, in one process: nsa_iree.nsa
(pooling, compressed attention, select_blocks, selection, window 128, gates) and an eager version of each branch
(nsa_iree.benchmark.torch_eager_nsa: a dense masked softmax over the compressed keys, top-k, the gathered
selection, a masked dense window), forward and forward + backward; `nsa-iree bench --branch layer` times the same
in the benchmark's tables.

    python3 -m bench.layer_cpu [--seq 4096] [--repeats 3] [--window 128]

Layout: the benchmark's "cpu" configuration (H 16, G 1, D = Dv = 64, BS 64, 16 blocks, f32). Prints a markdown
table.
"""

from __future__ import annotations

import argparse

import torch

import nsa_iree
from nsa_iree.benchmark import CONFIGS, timed, torch_eager_nsa
from nsa_iree.testing import relative_rms_error


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=128)
    args = parser.parse_args(argv)
    cfg = CONFIGS["cpu"]
    bs, counts = cfg["block_size"], cfg["num_blocks"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; layout cpu: {cfg}, window {args.window}")
    print("| N | forward: nsa_iree / eager (ms) | eager/ours | fwd + bwd: nsa_iree / eager (ms) | eager/ours | "
          "o vs eager |")
    print("|---|---|---|---|---|---|")
    for n in args.seq:
        gen = torch.Generator().manual_seed(0)
        h, g, d = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        inputs = [torch.randn(1, n, heads, d, generator=gen) for heads in (h, g, g)]
        inputs += [torch.rand(1, n, h, generator=gen) for _ in range(3)]
        do = torch.randn(1, n, h, d, generator=gen)
        impls = {
            "nsa_iree": lambda q, k, v, gc, gs, gw: nsa_iree.nsa(q, k, v, gc, gs, gw, block_counts=counts,
                                                                 block_size=bs, window_size=args.window),
            "eager": lambda q, k, v, gc, gs, gw: torch_eager_nsa(q, k, v, gc, gs, gw, counts, bs, args.window),
        }
        row = {}
        for name, fn in impls.items():
            row[f"{name}_forward"] = timed(lambda: fn(*inputs), torch.device("cpu"), args.repeats)

            def step():
                leaves = [t.clone().requires_grad_() for t in inputs]
                fn(*leaves).backward(do)
            row[f"{name}_step"] = timed(step, torch.device("cpu"), args.repeats)
        err = relative_rms_error(impls["nsa_iree"](*inputs), impls["eager"](*inputs))
        print(f"| {n} | {row['nsa_iree_forward'] * 1e3:.1f} / {row['eager_forward'] * 1e3:.1f} | "
              f"{row['eager_forward'] / row['nsa_iree_forward']:.2f} | {row['nsa_iree_step'] * 1e3:.1f} / "
              f"{row['eager_step'] * 1e3:.1f} | {row['eager_step'] / row['nsa_iree_step']:.2f} | {err:.1e} |",
              flush=True)


if __name__ == "__main__":
    main()
