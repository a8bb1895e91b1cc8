"""How often a CPU call takes about twice its time: 300 calls each of select_blocks (lse given, S 16) and the
compressed attention's forward on the same buffers, the benchmark's cpu layout (H 16, G 1, D 64, BS 64, f32) at
4096 tokens; prints each one's median and 90th percentile (ms) and the calls slower than 1.8x the fastest.

    python3 -m bench.cpu_call_modes [--calls 300]

(docs/runtime.md, 'CPU threads': the calling thread's wakeup could preempt the worker that signals the call done.)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from nsa_iree import compression

TOKENS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 4096, 16, 1, 64, 64


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    calls = parser.parse_args(argv).calls
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, TOKENS, HEADS, HEAD_DIM, generator=gen)
    k_cmp = compression.mean_pooling(torch.randn(1, TOKENS, KV_HEADS, HEAD_DIM, generator=gen), BLOCK)
    _, lse = compression.compressed_attention(q, k_cmp, k_cmp, BLOCK)
    cases = {"select_blocks": lambda: compression.select_blocks(q, k_cmp, 16, BLOCK, lse=lse),
             "compressed forward": lambda: compression.compressed_attention(q, k_cmp, k_cmp, BLOCK)}
    parts = []
    for name, call in cases.items():
        for _ in range(5):
            call()
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            call()
            times.append((time.perf_counter() - start) * 1e3)
        slow = sum(t > 1.8 * min(times) for t in times)
        p90 = statistics.quantiles(times, n=10)[8]
        parts.append(f"{name}: median {statistics.median(times):.2f} ms, p90 {p90:.2f}, over 1.8x the fastest "
                     f"{slow}/{calls}")
    line = " | ".join(parts)
    print(line)
    return line


if __name__ == "__main__":
    main()
