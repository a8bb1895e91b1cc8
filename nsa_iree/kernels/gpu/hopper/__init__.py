"""The Hopper kernel family (nsa_iree/kernels/gpu/hopper/): kernels on the warpgroup matrix multiply of sm_90a
(wgmma), for the `hopper` recipe (an H100 or H200: nsa_iree.api picks it for a GPU of compute capability 9.0);
which shapes they serve and the values their templates are rendered with. They share the NVIDIA family's macros and
values (gpu/nvidia/) and add their workgroup-memory map."""

from __future__ import annotations

from ....spec import KernelSpec
from ...family import Family
from .. import nvidia

STAGES = ("dense_forward",)
WARPGROUPS = 2               # warpgroups of a workgroup: each takes 64 rows (its m64 tile, 4 subgroups of 16)
ROWS = 64 * WARPGROUPS       # rows of a workgroup, against each key tile staged once
LANES = 128 * WARPGROUPS


def tile_bytes(rows: int, width: int) -> int:
    """Bytes of a [rows, width] tile of 16-bit elements (gpu/hopper/wgmma.mlir's swizzled layout)."""
    return rows * width * 2


def p_in_k(spec: KernelSpec) -> bool:
    """Whether p [ROWS, BS] is written over the K tile it was computed from (free once s = q k^T is read): where it
    fits, which keeps two workgroups on a multiprocessor at D = 128."""
    return tile_bytes(ROWS, spec.block_size) <= tile_bytes(spec.block_size, spec.head_dim)


def workgroup_memory(stage: str, spec: KernelSpec) -> dict[str, int]:
    """Byte offsets of the dense forward's workgroup memory (gpu/hopper/dense_forward.mlir): q [ROWS, D], two K
    tiles [BS, D], two V tiles [BS, Dv], and p [ROWS, BS] unless it goes over a K tile (p_in_k) (16-bit elements,
    wgmma.mlir's layout); "end" is its size."""
    d, dv, bs = spec.head_dim, spec.value_dim, spec.block_size
    k = tile_bytes(ROWS, d)
    v = k + 2 * tile_bytes(bs, d)
    p = v + 2 * tile_bytes(bs, dv)
    return {"k": k, "v": v, "p": p, "end": p + (0 if p_in_k(spec) else tile_bytes(ROWS, bs))}


def limits(stage: str, spec: KernelSpec, recipe) -> list[str]:
    """Why the Hopper kernel of `stage` cannot serve spec on recipe's target (empty: it can)."""
    if stage not in STAGES:
        return [f"no Hopper kernel for stage {stage!r}"]
    why = [w for w in nvidia.limits(stage, spec, recipe) if "workgroup memory" not in w]
    if not spec.window:
        # (its KEY_STRIDE text renders, but only the window's has run on an H200: docs/performance.md)
        why.append("serves the sliding window; the compressed attention's forward is the NVIDIA kernel's")
    if spec.head_dim % 64 or spec.value_dim % 64 or spec.value_dim > 256:
        why.append("D not a multiple of 64, or Dv not a multiple of 64 up to 256 (the layout's 128-byte lines; "
                   "wgmma's n)")
    if spec.block_size % 64 or spec.block_size > 256:
        why.append("BS not a multiple of 64 up to 256 (the layout's 128-byte lines; wgmma's n)")
    sm_memory = int(recipe.kernel_settings.get("sm_workgroup_memory", 0))
    need = workgroup_memory(stage, spec)["end"] + 1024 + nvidia.WORKGROUP_RESERVED
    if sm_memory and 2 * need > sm_memory:
        # (the design keeps two on a multiprocessor, one's softmax beside the other's products)
        why.append(f"needs {need} bytes of workgroup memory: fewer than two workgroups per multiprocessor")
    return why


def values(spec: KernelSpec, recipe) -> dict[str, str]:
    """The NVIDIA family's values and the Hopper kernels' own."""
    out = nvidia.values(spec, recipe)
    offsets = workgroup_memory("dense_forward", spec)
    sm_memory = int(recipe.kernel_settings.get("sm_workgroup_memory", 0))
    out.update({
        "HOPPER_SMEM_BYTES": offsets["end"] + 1024, "HOPPER_K_OFFSET": offsets["k"], "HOPPER_V_OFFSET": offsets["v"],
        "HOPPER_P_OFFSET": offsets["p"], "HOPPER_P_IN_K": int(p_in_k(spec)),
        "HOPPER_ROWS": ROWS, "HOPPER_LANES": LANES,
        "HOPPER_S_VALUES": 64 * spec.block_size // 128, "HOPPER_O_VALUES": 64 * spec.value_dim // 128,
        "HOPPER_K_TILE_BYTES": tile_bytes(spec.block_size, spec.head_dim),
        "HOPPER_V_TILE_BYTES": tile_bytes(spec.block_size, spec.value_dim),
        "HOPPER_MIN_WORKGROUPS_PER_SM": max(1, sm_memory // (offsets["end"] + 1024 + nvidia.WORKGROUP_RESERVED)),
    })
    return {key: str(value) for key, value in out.items()}


FAMILY = Family("hopper", "gpu/hopper", stages=STAGES, limits=limits, values=values, device="executable_target")
