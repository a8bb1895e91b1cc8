"""Run bench/wgmma/probe.mlir's module on an NVIDIA GPU with sm_90a (H100, H200) and compare c = a b^T with torch.

    python3 -m bench.wgmma.check probe.vmfb      # prints one JSON line: the relative error and c's scale
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

from nsa_iree.runtime import device_for


def main(path: str) -> bool:
    vmfb = Path(path)
    digest = vmfb.with_name(vmfb.name + ".sha256")
    if not digest.exists():          # the runtime loads only artifacts with their digest beside them
        digest.write_text(f"{hashlib.sha256(vmfb.read_bytes()).hexdigest()}  {vmfb.name}\n")
    gen = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(64, 16, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
    c = device_for(torch.device("cuda")).module(vmfb).call("wgmma_gemm", a, b)[0].float()
    torch.cuda.synchronize()
    ref = a.float() @ b.float().T
    row = {"vmfb": vmfb.name, "shape": list(c.shape), "rel_err": ((c - ref).norm() / ref.norm()).item(),
           "scale": ((c * ref).sum() / (ref * ref).sum()).item()}
    row["ok"] = row["shape"] == [64, 64] and row["rel_err"] < 1e-5
    print(json.dumps(row), flush=True)
    return row["ok"]


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv[1]) else 1)
