"""Where one forward call's time goes beyond its kernels, on the GPU (64k tokens, realistic selection):

    python3 -m bench.forward_overhead CONFIG [CONFIG ...]      # e.g. fla-d64-g1 hpg4

Per configuration one JSON row of medians (20 calls after 5): the public selection_attention_fwd, api.forward_into
with its outputs made once, the module's call alone (with and without the wait for torch's stream), and the GPU
time of the call's kernels (torch.profiler); then cProfile's heaviest functions over 20 public calls. The steps
between two columns are what each layer adds: validation and the custom op, the spec and module lookups, IREE's
call and its wait.
"""

from __future__ import annotations

import cProfile
import json
import pstats
import statistics
import sys
import time

import torch

import nsa_iree
from nsa_iree import api

from .bench import CONFIGS, make_problem


def _median_ms(fn, repeats: int = 20) -> float:
    """Median wall time of fn() to a synchronised GPU (host time included, which is what this script looks at; the
    CUDA-event medians of bench.hopper_checks time the GPU's work)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e3, 3)


def main(config: str, seq: int = 65536) -> None:
    cfg = CONFIGS[config]
    q, k, v, _, idx = make_problem(cfg, seq, "realistic", torch.device("cuda"), generate_on_device=True)
    bs, scale = cfg["block_size"], cfg["head_dim"] ** -0.5
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, bs)
    idx32 = api.effective_block_indices(idx, None)
    spec, _ = api.loaded_spec(api.describe(q, k, v, idx32, bs), "forward")
    module = api.kernels(spec, "forward", q.device)
    lists = api._list_buffers(spec, idx32, k.shape[1]) if api.forward_over_pieces(spec) else ()

    def call(wait=True):
        return module.call("selection_attention_fwd", q, k, v, idx32, scale, o, lse, *lists, wait_for_torch=wait)

    row = {"config": config, "idx_dtype": str(idx.dtype),
           "public_ms": _median_ms(lambda: nsa_iree.selection_attention_fwd(q, k, v, idx, bs)),
           "forward_into_ms": _median_ms(lambda: api.forward_into(o, lse, q, k, v, idx32, bs, scale)),
           "module_call_ms": _median_ms(call),
           "module_call_nowait_ms": _median_ms(lambda: call(False))}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            call()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    row["kernels_ms_per_call"] = round(sum(e.device_time for e in kernels) / 5 / 1000, 3)
    print(json.dumps(row), flush=True)
    profile = cProfile.Profile()
    profile.runcall(lambda: [nsa_iree.selection_attention_fwd(q, k, v, idx, bs) for _ in range(20)])
    pstats.Stats(profile).sort_stats("tottime").print_stats(8)


if __name__ == "__main__":
    for name in sys.argv[1:]:
        main(name)
