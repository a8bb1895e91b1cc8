"""The hopper target's wgmma kernels against the NVIDIA (mma.sync) kernels and the f64 oracle, on an H100 or H200.

    python -m bench.hopper_checks compile      # here (iree-compile): both targets' window forwards into the cache
    python3 -m bench.hopper_checks check       # on the GPU: o and lse of every case against f64, outputs poisoned
    python3 -m bench.hopper_checks time [SEQ]  # on the GPU: the two forwards at SEQ tokens (default 65536), alternating
    python3 -m bench.hopper_checks sanitize M  # under compute-sanitizer: one small forward per case layout

The modules are loaded directly (KernelSpec with target "cuda" or "hopper"), so both run in one process whatever
nsa_iree.api would pick. bench/run_hopper_h200.sh runs the GPU steps through the device tool;
bench/results/hopper_dense_forward_H200_2026-12-03/ holds the first run.
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from nsa_iree import window
from nsa_iree.compiler import compile_artifact
from nsa_iree.spec import KernelSpec

WINDOW = 512
# name: (heads per group, D, Dv, dtype); 4 kv heads
CASES = {"bf16": (16, 128, 128, "bf16"), "f16": (16, 128, 128, "f16"), "hpg4_dv64": (4, 128, 64, "bf16"),
         "d64": (16, 64, 64, "bf16")}
SHAPES = ((1, 1000, 1000), (2, 700, 1300), (1, 77, 77))      # (B, M, N): M < N, B = 2, fewer rows than a tile


def spec(target: str, case: str) -> KernelSpec:
    hpg, d, dv, dtype = CASES[case]
    return KernelSpec(target=target, heads=4 * hpg, kv_heads=4, head_dim=d, value_dim=dv,
                      block_size=window.WINDOW_BLOCK, num_blocks=window.window_slots(WINDOW), dtype=dtype,
                      window=WINDOW)


def compile_all() -> None:
    for case in CASES:
        for target in ("cuda", "hopper"):
            print(compile_artifact(spec(target, case), "forward").path.name, flush=True)


def _module(target: str, case: str):
    from nsa_iree.runtime import device_for

    return device_for(torch.device("cuda")).module(compile_artifact(spec(target, case), "forward").path)


def _inputs(case: str, b: int, m: int, n: int, gen):
    hpg, d, dv, dtype = CASES[case]
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    q = torch.randn(b, m, 4 * hpg, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(b, n, 4, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(b, n, 4, dv, device="cuda", generator=gen).to(dtype)
    idx = torch.zeros(b, m, 4, window.window_slots(WINDOW), dtype=torch.int32, device="cuda")   # (not read)
    return q, k, v, idx


def _forward(module, q, k, v, idx):
    o = torch.full((*q.shape[:3], v.shape[3]), float("nan"), dtype=q.dtype, device="cuda")
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), dtype=torch.float32, device="cuda")
    module.call("selection_attention_fwd", q, k, v, idx, q.shape[3] ** -0.5, o, lse)
    return o, lse


def _error(x, ref) -> float:
    """Relative RMS error over the reference's finite elements; inf where x is not finite exactly there."""
    x, ref = x.double(), ref.double()
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(x), finite):
        return float("inf")
    return ((x[finite] - ref[finite]).norm() / ref[finite].norm().clamp_min(1e-30)).item()


def check(seed: int = 0) -> None:
    from nsa_iree.reference import sliding_window_attention_reference

    gen = torch.Generator(device="cuda").manual_seed(seed)
    for case in CASES:
        modules = {target: _module(target, case) for target in ("cuda", "hopper")}
        for b, m, n in SHAPES:
            q, k, v, idx = _inputs(case, b, m, n, gen)
            o_ref, lse_ref = sliding_window_attention_reference(q, k, v, WINDOW)
            row = {"case": case, "b": b, "m": m, "n": n}
            for target, module in modules.items():
                o, lse = _forward(module, q, k, v, idx)
                torch.cuda.synchronize()
                row[f"{target}_o"], row[f"{target}_lse"] = _error(o, o_ref), _error(lse, lse_ref)
            print(json.dumps(row), flush=True)


def time(seq: int = 65536, repeats: int = 10) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    modules = {target: _module(target, "bf16") for target in ("cuda", "hopper")}
    q, k, v, idx = _inputs("bf16", 1, seq, seq, gen)
    for _ in range(2):
        for target, module in modules.items():
            times = []
            for _ in range(repeats + 2):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                _forward(module, q, k, v, idx)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            print(json.dumps({"target": target, "seq": seq, "ms": round(statistics.median(times[2:]), 3)}),
                  flush=True)


def sanitize(m: int = 300) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    for case in ("bf16", "d64"):
        q, k, v, idx = _inputs(case, 2, m, m + 100, gen)
        o, lse = _forward(_module("hopper", case), q, k, v, idx)
        torch.cuda.synchronize()
        print(json.dumps({"case": case, "m": m, "finite": bool(torch.isfinite(o).all() and torch.isfinite(lse).all())}),
              flush=True)


if __name__ == "__main__":
    what, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    {"compile": compile_all, "check": check, "time": time, "sanitize": sanitize}[what](*args)
