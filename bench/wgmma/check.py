"""Run a wgmma probe (bench/wgmma/probe.mlir, or a variant of it: bench/wgmma/run_h200.sh) on an NVIDIA GPU with
sm_90a (H100, H200) and compare c = scale a b^T with torch.

    python3 -m bench.wgmma.check probe.vmfb                      # a, b [64, 16] bf16 -> c [64, 64] f32
    python3 -m bench.wgmma.check loop.vmfb --scale 4
    python3 -m bench.wgmma.check bulk.vmfb --laid-out             # b (and a) passed in the core-matrix layout
    python3 -m bench.wgmma.check registers_a.vmfb --laid-out --n 128 --function wgmma_rega_gemm

Prints one JSON line: the relative error against torch and the fitted scale of c.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

from nsa_iree.runtime import device_for


def core_matrix_layout(x: torch.Tensor) -> torch.Tensor:
    """x [rows, 16] as wgmma's no-swizzle K-major operand in memory: 8 x 8 core matrices of 128 contiguous bytes,
    element (r, k) at (r / 8) 128 + (k / 8) 64 + (r mod 8) 8 + k mod 8 (the stores of probe.mlir)."""
    rows = x.shape[0]
    return x.reshape(rows // 8, 8, 2, 8).permute(0, 2, 1, 3).reshape(-1).contiguous()


def main(argv=None) -> bool:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vmfb")
    parser.add_argument("--function", default="wgmma_gemm")
    parser.add_argument("--n", type=int, default=64, help="c's columns (b's rows)")
    parser.add_argument("--scale", type=float, default=1.0, help="c = scale a b^T")
    parser.add_argument("--laid-out", action="store_true",
                        help="pass b (and, with n 64, a) in the core-matrix layout, flat")
    args = parser.parse_args(argv)
    vmfb = Path(args.vmfb)
    digest = vmfb.with_name(vmfb.name + ".sha256")
    if not digest.exists():          # the runtime loads only artifacts with their digest beside them
        digest.write_text(f"{hashlib.sha256(vmfb.read_bytes()).hexdigest()}  {vmfb.name}\n")
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(64, 16, generator=gen, device="cuda").to(torch.bfloat16)
    b = torch.randn(args.n, 16, generator=gen, device="cuda").to(torch.bfloat16)
    a_in = core_matrix_layout(a) if args.laid_out and args.n == 64 else a
    b_in = core_matrix_layout(b) if args.laid_out else b
    device = device_for(torch.device("cuda"))
    result = device.module(vmfb).call(args.function, a_in, b_in)[0]     # an IREE buffer (IREE allocated it)
    c = device.copy_to_host(result).float().to(a.device)
    del result
    torch.cuda.synchronize()
    ref = args.scale * (a.float() @ b.float().T)
    row = {"vmfb": vmfb.name, "shape": list(c.shape)}
    if c.shape == ref.shape:
        row["rel_err"] = ((c - ref).norm() / ref.norm()).item()
        row["scale"] = args.scale * ((c * ref).sum() / (ref * ref).sum()).item()
    row["ok"] = row.get("rel_err", 1.0) < 1e-5
    print(json.dumps(row), flush=True)
    return row["ok"]


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
