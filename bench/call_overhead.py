"""The host's cost of one nsa_iree kernel call on a GPU (no timing of kernels: the tensors are tiny), and what
IREE's CUDA runtime flags change of it: the wall time of Module.call on the layer's gating module, and of its
parts (importing a torch tensor, the invoke).

    python3 -m bench.call_overhead [IREE_FLAG ...]     (on the GPU; artifacts prebuilt: bench.layer_h200 --compile)
"""

from __future__ import annotations

import json
import sys
import time

import torch


def main(flags: list[str]) -> None:
    import iree.runtime as rt

    if flags:
        rt.flags.parse_flags(*flags)
    from nsa_iree import layer

    o = torch.randn(1, 1, 64, 128, device="cuda").to(torch.bfloat16)
    g = torch.rand(1, 1, 64, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(o)
    module = layer._gates_module(o)
    device = module.device

    def per_call_us(fn, repeats=200):
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / repeats * 1e6

    row = {"flags": flags,
           "call_us": per_call_us(lambda: module.call("gated_sum_1", o, g, out)),
           "call_no_torch_wait_us": per_call_us(lambda: module.call("gated_sum_1", o, g, out, wait_for_torch=False)),
           "import_us": per_call_us(lambda: device.import_tensor(o)),
           "torch_op_us": per_call_us(lambda: torch.mul(o, 2.0))}
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
