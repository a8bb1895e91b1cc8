"""Host-side profile on a GPU: the whole layer's training step (nsa, no window) and the window's forward + backward
at 64k tokens, anchors layout, bf16; each one's step time (5 warm steps), then cProfile of 5 more by own time.

    python3 -m bench.host_profile        (artifacts prebuilt: python -m bench.layer_h200 --compile 65536 and
                                          python -m bench.window_h200 --compile 65536)
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch

N, HEADS, KV_HEADS, HEAD_DIM, BLOCK, COUNTS, WINDOW = 65536, 64, 4, 128, 64, 16, 512


def main() -> None:
    import nsa_iree

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, N, heads, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
               for heads in (HEADS, KV_HEADS, KV_HEADS))
    g_cmp, g_slc = (torch.rand(1, N, HEADS, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    do = torch.randn(1, N, HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)

    def layer():
        leaves = [x.detach().requires_grad_() for x in (q, k, v, g_cmp, g_slc)]
        nsa_iree.nsa(*leaves, block_counts=COUNTS, block_size=BLOCK).backward(do)

    def window():
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        nsa_iree.sliding_window_attention(*leaves, WINDOW).backward(do)

    for name, step in (("layer", layer), ("window", window)):
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        print(f"{name} step ms {(time.perf_counter() - start) / 5 * 1e3:.2f}")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
        print(text.getvalue()[:9000])


if __name__ == "__main__":
    main()
