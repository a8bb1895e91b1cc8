"""Raw wgmma throughput from a hand-written IREE 3.13 dispatch on sm_90a: WG workgroups, each one warpgroup that
stages a [64, 16] and b [N, 16] once (bench/wgmma/probe.mlir's layout and descriptors) and then runs ITERS
iterations of PER chained nvvm.wgmma.mma_async m64nNk16 (bf16 -> f32) on one accumulator, one commit and wait per
iteration; each lane stores the sum of its accumulator fragment. No memory traffic in the loop: the MMA issue rate
this path reaches, against the GPU's ceiling.

    python -m bench.wgmma.throughput render N PER ITERS > .dev/wgmma/loopN.mlir     # where iree-compile is
    iree-compile .dev/wgmma/loopN.mlir --iree-opt-level=O2 -o .dev/wgmma/loopN.vmfb
    python3 -m bench.wgmma.throughput run [N ...]                                   # on the GPU (PER 4, ITERS 2048)

The check: each workgroup's lane sums add up to ITERS PER sum(a b^T) (float32 sums of 8192 products a lane: a
relative 1e-3, not a bit-level check; bench/wgmma/check.py checks one product against torch)."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

PER, ITERS = 4, 2048


def _struct(floats: int) -> str:
    return "!llvm.struct<(" + ", ".join(["f32"] * floats) + ")>"


def render(n: int, per: int, iters: int) -> str:
    """The module: probe.mlir's target and layout, a looping dispatch and its host function wgmma_loop(a, b, wg)."""
    source = (Path(__file__).with_name("probe.mlir")).read_text()
    head = source[:source.index("hal.executable.source private @wgmma_exe")]
    head = head.replace("// b [64, 16] bf16 (N x K, K contiguous)", f"// b [{n}, 16] bf16 (N x K, K contiguous)")
    head = head.replace("// c [64, 64] f32", "// c [WG, 128] f32: each lane's accumulator sum")
    acc, smem = _struct(n // 2), f"memref<{1024 + n * 16}xbf16, #gpu.address_space<workgroup>>"
    lines = [f"""hal.executable.source private @wgmma_exe {{
  hal.executable.export public @wgmma_loop ordinal(0) layout(#layout)
      count(%device: !hal.device, %wg: index) -> (index, index, index) {{
    %c1 = arith.constant 1 : index
    hal.return %wg, %c1, %c1 : index, index, index
  }} <workgroup_size = [128 : index, 1 : index, 1 : index]>
  builtin.module {{
    func.func @wgmma_loop() attributes {{translation_info = #iree_codegen.translation_info<
        pipeline = #iree_codegen.pass_pipeline<"canonicalize,cse">
        workgroup_size = [128, 1, 1] subgroup_size = 32>}} {{
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c2 = arith.constant 2 : index
      %c8 = arith.constant 8 : index
      %c64 = arith.constant 64 : index
      %c128 = arith.constant 128 : index
      %c1024 = arith.constant 1024 : index
      %iters = arith.constant {iters} : index
      %wgs = hal.interface.workgroup.count[0] : index
      %wid = hal.interface.workgroup.id[0] : index
      %a = hal.interface.binding.subspan layout(#layout) binding(0) alignment(64) offset(%c0) flags(ReadOnly)
          : memref<64x16xbf16>
      %b = hal.interface.binding.subspan layout(#layout) binding(1) alignment(64) offset(%c0) flags(ReadOnly)
          : memref<{n}x16xbf16>
      %c = hal.interface.binding.subspan layout(#layout) binding(2) alignment(64) offset(%c0)
          : memref<?x128xf32>{{%wgs}}
      %smem = memref.alloc() : {smem}
      %tid = gpu.thread_id x
      // lane t stages 16 bytes of rows t / 2 (+ 64 i for b) at k chunk t % 2, as probe.mlir
      %row = arith.divui %tid, %c2 : index
      %kc = arith.remui %tid, %c2 : index
      %k0 = arith.muli %kc, %c8 : index
      %o2 = arith.muli %kc, %c64 : index"""]
    for name, rows, base in (("a", 64, "%c0"), ("b", n, "%c1024")):
        for part in range(rows // 64):
            lines.append(f"""      %{name}_rows{part} = arith.constant {64 * part} : index
      %{name}_row{part} = arith.addi %row, %{name}_rows{part} : index
      %{name}_rg{part} = arith.divui %{name}_row{part}, %c8 : index
      %{name}_ri{part} = arith.remui %{name}_row{part}, %c8 : index
      %{name}_o1_{part} = arith.muli %{name}_rg{part}, %c128 : index
      %{name}_o3_{part} = arith.muli %{name}_ri{part}, %c8 : index
      %{name}_o12_{part} = arith.addi %{name}_o1_{part}, %o2 : index
      %{name}_o123_{part} = arith.addi %{name}_o12_{part}, %{name}_o3_{part} : index
      %{name}_off{part} = arith.addi %{name}_o123_{part}, {base} : index
      %{name}_v{part} = vector.load %{name}[%{name}_row{part}, %k0]
          : memref<{rows}x16xbf16>, vector<8xbf16>
      vector.store %{name}_v{part}, %smem[%{name}_off{part}] : {smem}, vector<8xbf16>""")
    lines.append(f"""      llvm.inline_asm has_side_effects "fence.proxy.async.shared::cta;", "" : () -> ()
      gpu.barrier
      // descriptors as probe.mlir's (no swizzle, LBO 128 B, SBO 256 B); b at byte 2048
      %base_idx = memref.extract_aligned_pointer_as_index %smem : {smem} -> index
      %base = arith.index_cast %base_idx : index to i64
      %c4_i64 = arith.constant 4 : i64
      %mask14 = arith.constant 16383 : i64
      %lbo_sbo = arith.constant 68720001024 : i64
      %b_bytes = arith.constant 2048 : i64
      %a_addr4 = arith.shrui %base, %c4_i64 : i64
      %a_lo = arith.andi %a_addr4, %mask14 : i64
      %desc_a = arith.ori %a_lo, %lbo_sbo : i64
      %b_addr = arith.addi %base, %b_bytes : i64
      %b_addr4 = arith.shrui %b_addr, %c4_i64 : i64
      %b_lo = arith.andi %b_addr4, %mask14 : i64
      %desc_b = arith.ori %b_lo, %lbo_sbo : i64
      %zero_acc = llvm.mlir.zero : {acc}
      %acc = scf.for %it = %c0 to %iters step %c1 iter_args(%acc0 = %zero_acc) -> ({acc}) {{
        nvvm.wgmma.fence.aligned""")
    for i in range(per):
        lines.append(f"""        %m{i} = nvvm.wgmma.mma_async %desc_a, %desc_b, {"%acc0" if i == 0 else f"%m{i - 1}"},
            #nvvm.shape<m = 64, n = {n}, k = 16>,
            D [<f32>, #nvvm.wgmma_scale_out<one>],
            A [<bf16>, #nvvm.wgmma_scale_in<one>, <row>],
            B [<bf16>, #nvvm.wgmma_scale_in<one>, <col>]
            : {acc} -> {acc}""")
    lines.append(f"""        nvvm.wgmma.commit.group.sync.aligned
        nvvm.wgmma.wait.group.sync.aligned 0
        scf.yield %m{per - 1} : {acc}
      }}
      %s0 = arith.constant 0.0 : f32""")
    for i in range(n // 2):
        lines.append(f"      %e{i} = llvm.extractvalue %acc[{i}] : {acc}")
        lines.append(f"      %s{i + 1} = arith.addf %s{i}, %e{i} : f32")
    lines.append(f"""      memref.store %s{n // 2}, %c[%wid, %tid] : memref<?x128xf32>
      return
    }}
  }}
}}

func.func @wgmma_loop(%a: tensor<64x16xbf16>, %b: tensor<{n}x16xbf16>, %wg: index) -> tensor<?x128xf32> {{
  %c = flow.dispatch @wgmma_exe::@wgmma_loop[%wg](%a, %b)
      : (tensor<64x16xbf16>, tensor<{n}x16xbf16>) -> tensor<?x128xf32>{{%wg}}
  return %c : tensor<?x128xf32>
}}
}}
""")
    return head + "\n".join(lines)


def run(ns=(64, 128, 256), where=".dev/wgmma"):
    """Time each loopN.vmfb at 1, 4 and 8 workgroups per SM (132 SMs): best of 5 calls, TFLOP/s."""
    import torch

    from nsa_iree.runtime import device_for

    device = device_for(torch.device("cuda"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n in ns:
        vmfb = Path(where) / f"loop{n}.vmfb"
        digest = hashlib.sha256(vmfb.read_bytes()).hexdigest()
        vmfb.with_name(vmfb.name + ".sha256").write_text(f"{digest}  {vmfb.name}\n")
        module = device.module(vmfb)
        a = torch.randn(64, 16, generator=gen, device="cuda").to(torch.bfloat16)
        b = torch.randn(n, 16, generator=gen, device="cuda").to(torch.bfloat16)
        for wg in (132, 528, 1056):
            module.call("wgmma_loop", a, b, wg)      # warm-up
            times = []
            for _ in range(5):
                start = time.perf_counter()
                out = module.call("wgmma_loop", a, b, wg)
                times.append(time.perf_counter() - start)
            sums = device.copy_to_host(out[0]).double().sum(dim=1)
            del out
            want = ITERS * PER * (a.double() @ b.double().T).sum().item()
            best = min(times)
            print(json.dumps({"n": n, "workgroups": wg, "ms_best": round(best * 1e3, 3),
                              "tflops_best": round(wg * ITERS * PER * 2 * 64 * n * 16 / best / 1e12, 1),
                              "rel_err_of_sums": ((sums - want).abs().max() / abs(want)).item()}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "render":
        print(render(*(int(x) for x in sys.argv[2:5])), end="")
    else:
        run(tuple(int(x) for x in sys.argv[2:]) or (64, 128, 256))
