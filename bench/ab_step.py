"""One build's window and whole-layer times on a GPU, for A/B runs of two checkouts alternating in one device call
(anchors layout, 64k tokens, bf16, median of 10 after 3 warm-ups), and with --profile each kernel's time in one
layer step with the window:

    python3 -m bench.ab_step NAME [--profile]     (run from each checkout in turn; NAME labels the JSON row)
"""

from __future__ import annotations

import json
import sys

import torch

import nsa_iree
from nsa_iree.benchmark import timed

N, H, G, D, BS, T, W = 65536, 64, 4, 128, 64, 16, 512


def main(name: str, profile: bool) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, N, x, D, device="cuda", generator=gen).to(torch.bfloat16) for x in (H, G, G))
    g_cmp, g_slc, g_swa = (torch.rand(1, N, H, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))
    do = torch.randn(1, N, H, D, device="cuda", generator=gen).to(torch.bfloat16)
    ms = lambda fn: timed(fn, torch.device("cuda"), 10, warmup=3) * 1e3  # noqa: E731

    def step(attention, *inputs):
        leaves = [x.detach().requires_grad_() for x in inputs]
        attention(*leaves).backward(do)

    window = lambda q, k, v: nsa_iree.sliding_window_attention(q, k, v, W)  # noqa: E731
    layer = lambda q, k, v, gc, gs: nsa_iree.nsa(q, k, v, gc, gs, block_counts=T, block_size=BS)  # noqa: E731
    layer_window = lambda q, k, v, gc, gs, gw: nsa_iree.nsa(q, k, v, gc, gs, gw, block_counts=T,  # noqa: E731
                                                            block_size=BS, window_size=W)
    row = {"build": name, "window_fwd": ms(lambda: window(q, k, v)), "window_step": ms(lambda: step(window, q, k, v)),
           "layer_fwd": ms(lambda: layer(q, k, v, g_cmp, g_slc)),
           "layer_step": ms(lambda: step(layer, q, k, v, g_cmp, g_slc)),
           "layer_window_step": ms(lambda: step(layer_window, q, k, v, g_cmp, g_slc, g_swa))}
    print(json.dumps({key: round(x, 2) if isinstance(x, float) else x for key, x in row.items()}), flush=True)
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(layer_window, q, k, v, g_cmp, g_slc, g_swa)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main(sys.argv[1], "--profile" in sys.argv[2:])
