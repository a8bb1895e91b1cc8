"""The kept inversion of fixed block lists (api.backward_into's fixed_blocks) on a GPU: the sliding window's and the
compressed attention's backward, run three times in one process (the first makes the inversion, the next reuse it),
give the same gradients bit for bit as a backward that inverts its lists every time; anchors layout, bf16.

    python3 -m bench.fixed_blocks_check [N]
"""

from __future__ import annotations

import sys

import torch


def main(argv=None) -> bool:
    import nsa_iree
    from nsa_iree import api, compression, window

    n = int((argv or sys.argv[1:] or ["8192"])[0])
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, n, heads, 128, device="cuda", generator=gen).to(torch.bfloat16) for heads in (64, 4, 4))
    do = torch.randn(1, n, 64, 128, device="cuda", generator=gen).to(torch.bfloat16)
    scale = 128 ** -0.5
    ok = True
    k_cmp, v_cmp = nsa_iree.mean_pooling(k, 64), nsa_iree.mean_pooling(v, 64)
    cases = {"window": (lambda: nsa_iree.sliding_window_attention_fwd(q, k, v, 512),
                        lambda o, lse, fixed: _window_grads(window, api, do, q, k, v, o, lse, 512, scale, fixed)),
             "compressed": (lambda: nsa_iree.compressed_attention(q, k_cmp, v_cmp, 64),
                            lambda o, lse, fixed: _compressed_grads(compression, api, do, q, k_cmp, v_cmp, o, lse,
                                                                    scale, fixed))}
    for name, (forward, grads) in cases.items():
        o, lse = forward()
        every_time = grads(o, lse, False)
        kept = [grads(o, lse, True) for _ in range(3)]
        same = all(torch.equal(a, b) for run in kept for a, b in zip(run, every_time))
        finite = all(torch.isfinite(t).all().item() for t in every_time)
        print(f"{name}: N {n}, three backwards with the kept inversion equal to one that inverts: {same}; "
              f"finite: {finite}")
        ok &= same and finite
    return ok


def _window_grads(window, api, do, q, k, v, o, lse, size, scale, fixed):
    idx = window._band_indices(1, q.shape[1], k.shape[1], k.shape[2], size, q.device)
    out = [torch.full_like(x, float("nan")) for x in (q, k, v)]
    api.backward_into(*out, q, k, v, o, lse, do, idx, window.WINDOW_BLOCK, scale, "two-pass", window=size,
                      fixed_blocks=fixed)
    return out


def _compressed_grads(compression, api, do, q, k_cmp, v_cmp, o, lse, scale, fixed):
    n = q.shape[1]
    idx = compression._tile_indices(1, n, 0, k_cmp.shape[2], k_cmp.shape[1], q.device)
    out = [torch.full_like(x, float("nan")) for x in (q, k_cmp, v_cmp)]
    api.backward_into(*out, q, k_cmp, v_cmp, o, lse, do, idx, compression._tile(q.device), scale, "two-pass",
                      key_stride=64, fixed_blocks=fixed)
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
