"""The compression branch on the CPU: nsa_iree's mean pooling + compressed attention against a torch-eager
version of the same math (one dense masked softmax over the compressed keys), in one process.

    python3 -m bench.compression_cpu [--seq 4096] [--repeats 5]

Layout: the benchmark's "cpu" configuration (H 16, G 1, D = Dv = 64, BS 64, f32). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import nsa_iree
from nsa_iree.benchmark import CONFIGS
from nsa_iree.testing import relative_rms_error


def torch_eager_compressed_attention(q, k_cmp, v_cmp, block_size, scale=None):
    """The same math in eager torch: scores [B, H, M, C] masked to the complete blocks, softmax, p v."""
    heads, groups = q.shape[2], k_cmp.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k = k_cmp.repeat_interleave(heads // groups, dim=2)
    v = v_cmp.repeat_interleave(heads // groups, dim=2)
    s = torch.einsum("bmhd,bchd->bhmc", q, k) * scale
    pos = torch.arange(q.shape[1])
    visible = (torch.arange(k.shape[1]) + 1) * block_size - 1 <= pos.view(-1, 1)
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    return torch.einsum("bhmc,bchd->bmhd", p, v), lse


def mean_pool_eager(x, block_size):
    n = x.shape[1]
    c = -(-n // block_size)
    padded = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, c * block_size - n))
    sums = padded.view(x.shape[0], c, block_size, *x.shape[2:]).sum(2)
    counts = (n - torch.arange(c) * block_size).clamp(max=block_size).to(x.dtype)
    return sums / counts.view(1, -1, 1, 1)


def _median_s(fn, repeats, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[4096])
    parser.add_argument("--repeats", type=int, default=5)
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
                 "eager": (mean_pool_eager, torch_eager_compressed_attention)}
        row = {}
        for name, (pool, attend) in impls.items():
            kc, vc = pool(k, bs), pool(v, bs)
            row[f"{name}_forward"] = _median_s(lambda: attend(q, kc, vc, bs), args.repeats)

            def training():
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                o, _ = attend(leaves[0], pool(leaves[1], bs), pool(leaves[2], bs), bs)
                o.backward(do)
            row[f"{name}_training"] = _median_s(training, args.repeats)
        o_mine, _ = nsa_iree.compressed_attention(q, nsa_iree.mean_pooling(k, bs), nsa_iree.mean_pooling(v, bs), bs)
        o_eager, _ = torch_eager_compressed_attention(q, mean_pool_eager(k, bs), mean_pool_eager(v, bs), bs)
        err = relative_rms_error(o_mine, o_eager)
        print(f"| {n} | {row['nsa_iree_forward'] * 1e3:.2f} / {row['eager_forward'] * 1e3:.2f} | "
              f"{row['eager_forward'] / row['nsa_iree_forward']:.2f} | {row['nsa_iree_training'] * 1e3:.1f} / "
              f"{row['eager_training'] * 1e3:.1f} | {row['eager_training'] / row['nsa_iree_training']:.2f} | "
              f"{err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
