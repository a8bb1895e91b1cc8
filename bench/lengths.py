"""The command line the H200 scripts over sequence lengths share (bench/layer_h200.py, bench/window_h200.py):

    python3 -m bench.<script> --compile N ...     here: compile into $NSA_IREE_CACHE_DIR the cuda modules it loads
    python3 -m bench.<script> OUT [N ...]          on the GPU: one row per length (default 65536), OUT/<name>.json
    python3 -m bench.<script> --profile OUT N       on the GPU: one step under torch.profiler (profile_step)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def main(argv: list[str], specs, timing, name: str, layout: dict) -> None:
    """`--compile N ...` compiles specs(N)'s (KernelSpec, variant) pairs; otherwise times timing(N) for each
    length and writes the rows, the device and the layout to OUT/`name`.json."""
    if argv and argv[0] == "--compile":
        from nsa_iree.compiler import compile_loaded

        for n in map(int, argv[1:]):
            for spec, variant in specs(n):
                print(compile_loaded(spec, variant)[0].path.name, flush=True)
        return
    out, lengths = Path(argv[0]), [int(x) for x in argv[1:]] or [65536]
    rows = []
    for n in lengths:
        rows.append(timing(n))
        print(json.dumps(rows[-1]), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "layout": layout,
                                                  "timings": rows}, indent=1))


def profile_step(out: Path, step) -> None:
    """`step` (one training step) under torch.profiler after three warm-ups: the table of its ops and kernels by
    device time (CUPTI sees IREE's launches as well as torch's) and the trace, written to OUT."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    out.mkdir(parents=True, exist_ok=True)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=60, max_name_column_width=90)
    (out / "profile.txt").write_text(table)
    prof.export_chrome_trace(str(out / "trace.json"))
    print(table, flush=True)
