"""The CPU kernel family (nsa_iree/kernels/cpu/): vectorised dispatches with their tiles on the stack; which
shapes it serves and the values its templates are rendered with."""

from __future__ import annotations

from ...spec import KernelSpec
from ..family import Family

# The CPU kernels keep their tiles on the stack; the cpu recipe allows 64 KiB
# (--iree-llvmcpu-stack-allocation-limit) and these tiles stay within 48 KiB of it.
CPU_STACK_BYTES = 48 * 1024
CPU_VECTOR_REGISTERS = 16   # accumulator registers of one register block (of the 32 AVX-512 registers)
# Compare-and-swap attempts on a kv block's lock before the one-pass CPU kernel adds with atomics instead:
# a lock is held for one row's dk/dv products of one block (microseconds), so this many failed attempts mean
# a descheduled holder.
CPU_LOCK_TRIES = 20000
# Work items of the dense backward (dense_backward.mlir), each with an f32 dk/dv partial of every key block: one per
# CPU_ITEM_ROWS rows, at most CPU_ITEMS per (batch, kv head). IREE's workers claim a dispatch's workgroups one at a
# time when it has fewer than 8 per worker and 8 at a time otherwise: a dispatch of fewer than 16 workgroups (items
# x G x B < 16) is claimed one at a time on every machine of two or more workers, so a worker that falls behind (its
# core shared for a while) leaves the items it has not started to the others. 16 items on two workers were two
# claims of 8: a backward took a third more while one core was half taken (docs/performance.md, 'The CPU
# backward's work items'). The price: at most 15 workers share one (batch, kv head)'s rows.
CPU_ITEMS = 15
CPU_ITEM_ROWS = 256
_BYTES = {"f32": 4, "bf16": 2, "f16": 2}     # bytes of an element of each KernelSpec.dtype


def cpu_stack_bytes(stage: str, spec: KernelSpec) -> int:
    """Bytes of f32 stack tiles the CPU kernel of `stage` allocates for spec."""
    hpg, d, dv, bs = spec.heads_per_group, spec.head_dim, spec.value_dim, spec.block_size
    if stage == "forward":                       # qT, oT, sT (p in place)
        return (d + dv + bs) * hpg * 4
    if stage in ("dq", "dense_backward"):       # S (P), dP (DS), dq
        return (2 * bs + d) * hpg * 4
    if stage == "select_blocks":                 # the scores of one step's candidates, the kept ids
        return 16 * 4 + spec.num_blocks * 4
    if stage == "onepass":                       # qT, doT, S (P), dP (DS), DS transposed, dq
        return ((d + dv) * hpg + 3 * hpg * bs + hpg * d) * 4
    return 2 * hpg * bs * 4                      # dkdv: S (then P) and dP (then DS)


def limits(stage: str, spec: KernelSpec, recipe) -> list[str]:
    """Why the CPU kernel of `stage` cannot serve spec (empty: it can)."""
    if stage not in FAMILY.stages:
        return [f"no CPU kernel for stage {stage!r}"]
    window = spec.window and stage in ("onepass", "select_blocks")
    why = [f"{stage}.mlir has no sliding-window mask (the linalg stages take it)"] if window else []
    if stage == "dense_backward" and spec.window:
        # each work item's partial covers every key block: few for the compressed keys' tiles, items x K and V for
        # a window's keys
        why.append("dense_backward.mlir serves the compressed attention (a window's rows read 2 of N / BS blocks)")
    need = cpu_stack_bytes(stage, spec)
    return why + ([f"needs {need} bytes of stack tiles, more than {CPU_STACK_BYTES}"] if need > CPU_STACK_BYTES
                  else [])


def _largest_divisor(n: int, cap: int) -> int:
    return max(c for c in range(1, min(n, cap) + 1) if n % c == 0)


def values(spec: KernelSpec, recipe) -> dict[str, str]:
    """Register-block sizes of the CPU kernels: CPU_ROWS keys (or value/head elements) share one vector of
    heads per step, each row's accumulator a vector of HPG floats; CPU_ROWS * ceil(HPG / 16) accumulators stay
    within CPU_VECTOR_REGISTERS. CPU_COLS and CPU_DCOLS divide Dv and D (the o, dq column steps)."""
    per_row = -(-spec.heads_per_group // 16)
    rows = max(1, CPU_VECTOR_REGISTERS // per_row)
    # The dk/dv and dq kernels: CPU_SROWS heads of S (each a vector of BS keys), and CPU_KROWS keys times CPU_VCOLS
    # (CPU_KCOLS) elements of dv (dk), up to 64 floats (4 registers) a row.
    per_keys = -(-spec.block_size // 16)
    return {"CPU_ROWS": str(rows), "CPU_COLS": str(_largest_divisor(spec.value_dim, rows)),
            "CPU_DCOLS": str(_largest_divisor(spec.head_dim, rows)),
            "CPU_SROWS": str(_largest_divisor(spec.heads_per_group, max(1, CPU_VECTOR_REGISTERS // per_keys))),
            # the same over half a block's keys (products.visible_scores)
            "CPU_SROWS_HALF": str(_largest_divisor(spec.heads_per_group,
                                                   max(1, CPU_VECTOR_REGISTERS // max(1, per_keys // 2)))),
            "CPU_VCOLS": str(_largest_divisor(spec.value_dim, 64)),
            "CPU_KCOLS": str(_largest_divisor(spec.head_dim, 64)),
            "CPU_KROWS": str(_largest_divisor(spec.block_size, 4)), "CPU_DKV": str(spec.head_dim + spec.value_dim),
            # select_blocks: CPU_CANDS candidates a vector, CPU_SEL_HEADS heads' score vectors in registers.
            "CPU_CANDS": "16", "CPU_SEL_HEADS": str(_largest_divisor(spec.heads_per_group, CPU_VECTOR_REGISTERS)),
            # dq's sum over keys: CPU_DQ_HEADS heads times CPU_DQ_COLS elements of d (up to 4 x 64 floats).
            "CPU_DQ_HEADS": str(_largest_divisor(spec.heads_per_group, 4)),
            "CPU_DQ_COLS": str(_largest_divisor(spec.head_dim, 64)),
            # the dense backward's delta of a row (products.delta_of_row): lanes along Dv
            "CPU_DELTA_LANES": str(_largest_divisor(spec.value_dim, 16)),
            # dq's rows written with streaming stores: each head's row (D elements) whole 64-byte lines. The aligned
            # non-temporal stores need dq 64-byte aligned: IREE aligns bindings to 64 bytes, and the runtime copies
            # a tensor whose data is not (runtime.importable).
            "CPU_DQ_STREAM": "true" if spec.head_dim * _BYTES[spec.dtype] % 64 == 0 else "false",
            # the forward's o likewise, each head's run of CPU_COLS elements whole lines
            "CPU_O_STREAM": "true" if (spec.value_dim * _BYTES[spec.dtype] % 64 == 0
                                       and _largest_divisor(spec.value_dim, rows) * _BYTES[spec.dtype] % 64 == 0)
            else "false",
            "CPU_SLOT_STRIDE": str(max(1, spec.num_blocks // 2)), "CPU_LOCK_TRIES": str(CPU_LOCK_TRIES),
            "CPU_ITEMS": str(CPU_ITEMS), "CPU_ITEM_ROWS": str(CPU_ITEM_ROWS)}




# Every CPU kernel reads K and V as transposed blocks (blocks.mlir), made once per call.
FAMILY = Family("cpu", "cpu", stages=("forward", "dq", "dkdv", "onepass", "select_blocks", "dense_backward"),
                limits=limits, values=values,
                helpers=("blocks",))
