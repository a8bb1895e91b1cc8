"""Per-kernel GPU time of one nsa_iree backward (two-pass, through the API) on a benchmark layout, from
torch.profiler's CUDA trace (CUPTI records IREE's launches as well as torch's), on the H200:

    python3 -m bench.profile_backward CONFIG [SEQ] [SELECTION]     # e.g. hpg4 65536 realistic

Prints each kernel of the profiled call in launch order with its time, and the sum (the kernels only: no host gaps).
"""

from __future__ import annotations

import json
import sys

import torch

import nsa_iree

from .bench import CONFIGS, make_problem


def main(config: str, seq: int = 65536, selection: str = "realistic") -> None:
    cfg = CONFIGS[config]
    q, k, v, do, idx = make_problem(cfg, seq, selection, torch.device("cuda"), generate_on_device=True)
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, cfg["block_size"])

    def backward():
        return nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, cfg["block_size"], variant="two-pass")

    for _ in range(2):
        backward()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        backward()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    rows = [{"kernel": e.name[:90], "ms": round(e.device_time / 1000, 3)} for e in kernels]
    for row in rows:
        print(json.dumps(row), flush=True)
    print(json.dumps({"config": config, "seq": seq, "selection": selection,
                      "kernels_ms": round(sum(r["ms"] for r in rows), 3)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]), *sys.argv[3:4])
