"""Per-kernel GPU time of one nsa_iree backward (two-pass, through the API) or forward on a benchmark layout, from
torch.profiler's CUDA trace (CUPTI records IREE's launches as well as torch's), on the H200:

    python3 -m bench.profile_backward CONFIG [SEQ] [SELECTION] [PASS]   # e.g. hpg4 65536 realistic forward

Prints each kernel of the profiled call in launch order with its time and the GPU's idle time before it, the sum
of the kernels' times and the span from the first kernel's start to the last one's end (PASS: backward, the
default, or forward). NSA_IREE_RUNTIME_FLAGS: IREE runtime flags (space-separated, e.g.
--cuda_async_allocations=false) parsed before the device is made.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import nsa_iree

from .bench import CONFIGS, make_problem


def main(config: str, seq: int = 65536, selection: str = "realistic", which: str = "backward") -> None:
    if os.environ.get("NSA_IREE_RUNTIME_FLAGS"):
        import iree.runtime as rt

        rt.flags.parse_flags(*os.environ["NSA_IREE_RUNTIME_FLAGS"].split())
    cfg = CONFIGS[config]
    q, k, v, do, idx = make_problem(cfg, seq, selection, torch.device("cuda"), generate_on_device=True)
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, cfg["block_size"])

    def backward():
        return nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, cfg["block_size"], variant="two-pass")

    def forward():
        return nsa_iree.selection_attention_fwd(q, k, v, idx, cfg["block_size"])

    run = {"backward": backward, "forward": forward}[which]
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    rows, end = [], None
    for e in kernels:
        gap = 0.0 if end is None else max(0.0, e.time_range.start - end) / 1000
        end = e.time_range.end if end is None else max(end, e.time_range.end)
        rows.append({"kernel": e.name[:90], "ms": round(e.device_time / 1000, 3), "idle_before_ms": round(gap, 3)})
    for row in rows:
        print(json.dumps(row), flush=True)
    span = (end - kernels[0].time_range.start) / 1000 if kernels else 0.0
    print(json.dumps({"config": config, "seq": seq, "selection": selection, "pass": which,
                      "kernels_ms": round(sum(r["ms"] for r in rows), 3), "span_ms": round(span, 3)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]), *sys.argv[3:5])
