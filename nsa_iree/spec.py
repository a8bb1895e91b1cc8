"""The problem description every compiled artifact is specialised on.

A :class:`KernelSpec` holds the static part of a selection-attention problem: head layout, head
dimensions, block size, selected blocks per row, element type and compile target. Batch size B and the
sequence lengths M and N stay dynamic in the compiled functions, so one artifact serves them all.
"""

from __future__ import annotations

import dataclasses
import os
import re

DTYPES = ("f32", "f16", "bf16")
TARGETS = ("cpu", "gfx950", "gfx942", "cuda", "hopper")
# Backward variants: "two-pass" (inverted block lists, no atomics, bitwise reproducible) and "one-pass"
# (one dispatch over query rows, f32 atomics for dk/dv: not bitwise reproducible).
VARIANTS = ("two-pass", "one-pass")
KERNEL_CHOICES = ("auto", "linalg")
_CPU_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


# The two settings the environment may give a spec, read where a spec is made (nsa_iree.api.describe, the CLI's
# defaults) and never while rendering: the CPU the cpu kernels are compiled for ("host", or an LLVM CPU name such
# as x86-64-v3), and whether the hand-written kernels are used ("auto") or the linalg stages everywhere.
CPU_TARGET_ENV = "NSA_IREE_CPU_TARGET"
KERNELS_ENV = "NSA_IREE_KERNELS"


def kernels_from_environment() -> str:
    """``$NSA_IREE_KERNELS``: unset or "auto" ("custom", its earlier name, too), or "linalg"; a ValueError naming
    the variable otherwise."""
    choice = os.environ.get(KERNELS_ENV, "").strip().lower() or "auto"
    choice = "auto" if choice == "custom" else choice
    if choice not in KERNEL_CHOICES:
        raise ValueError(f"{KERNELS_ENV} must be one of {KERNEL_CHOICES} (or unset), got {choice!r}")
    return choice


def target_cpu_from_environment() -> str:
    """``$NSA_IREE_CPU_TARGET``: unset or "host", or an LLVM CPU name; a ValueError naming the variable otherwise."""
    name = os.environ.get(CPU_TARGET_ENV, "").strip() or "host"
    if not _CPU_NAME.fullmatch(name):
        raise ValueError(f"{CPU_TARGET_ENV} must be 'host' or an LLVM CPU name such as 'x86-64-v3', got {name!r}")
    return name


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """Static configuration of the kernels (the compile-cache key, with the target's flags).

    Attributes:
        heads: H, query heads.
        kv_heads: G, key/value heads ("groups"); H must be a multiple of G.
        head_dim: D, query/key head dimension.
        value_dim: Dv, value head dimension (may differ from D).
        block_size: BS, keys per selectable block.
        num_blocks: T, selected block slots per (query row, group).
        dtype: element type of q, k, v, o, do, dq, dk, dv: "f32", "f16" or "bf16".
        target: "cpu", "gfx950", "gfx942", "cuda" (NVIDIA, sm_80 PTX) or "hopper" (cuda's kernels plus those on
            sm_90a's warpgroup MMA: an H100 or H200).
        target_cpu: for target "cpu", the CPU the code is compiled for (IREE's --iree-llvmcpu-target-cpu):
            "host" (the default: the machine that compiles, AVX-512 where it has it; the artifact is keyed by
            that machine's CPU features and loaded only there) or an LLVM CPU name such as "x86-64-v3" (AVX2 and
            FMA, runs on any x86-64 CPU that has them) or "x86-64-v4" (AVX-512). "host" for the GPU targets.
        dkdv_dtype: element type of the dk and dv the backward returns: None (dtype, the default) or "f32"
            (their float32 sums before the one rounding to dtype: what nsa_iree.distributed adds across ranks).
        kernels: "auto" (the default: each stage on the target's hand-written kernel where it serves the layout,
            else the compiler-generated linalg stage) or "linalg" (the linalg stages everywhere: the oracle the
            hand-written kernels are checked against, and a fallback for users; $NSA_IREE_KERNELS=linalg).
        key_stride: positions per key. 1 (selection attention): key j is position j, and query row m stands at
            position m + N - M. S > 1 (compressed attention, S its block size): key c stands for the S positions
            c S .. c S + S - 1 and is seen from position c S + S - 1 on; the M query rows are then all the
            positions, row m seeing keys up to floor((m + 1) / S) - 1 (kernels/common/rules.mlir).
        window: 0 (no window), or W > 0 (the sliding-window attention, key_stride 1): row m sees key j iff
            pos(m) - W < j <= pos(m). The NVIDIA, CPU and portable kernels (not the one-pass nor select_blocks)
            and the linalg stages take a window.
    """

    heads: int = 16
    kv_heads: int = 1
    head_dim: int = 64
    value_dim: int = 64
    block_size: int = 64
    num_blocks: int = 16
    dtype: str = "f32"
    target: str = "cpu"
    target_cpu: str = "host"
    dkdv_dtype: str | None = None
    kernels: str = "auto"
    key_stride: int = 1
    window: int = 0

    def __post_init__(self) -> None:
        for name in ("heads", "kv_heads", "head_dim", "value_dim", "block_size", "num_blocks", "key_stride"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"KernelSpec.{name} must be a positive int, got {value!r}")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")
        if not isinstance(self.target_cpu, str) or not _CPU_NAME.fullmatch(self.target_cpu):
            raise ValueError(f"target_cpu must be 'host' or an LLVM CPU name such as 'x86-64-v3', got "
                             f"{self.target_cpu!r}")
        if self.kernels not in KERNEL_CHOICES:
            raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {self.kernels!r}")
        if self.dkdv_dtype not in (None, "f32"):
            raise ValueError(f"dkdv_dtype must be None or 'f32', got {self.dkdv_dtype!r}")
        if self.dkdv_dtype == self.dtype:           # the same module: one spec, one cache entry
            object.__setattr__(self, "dkdv_dtype", None)
        if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 0:
            raise ValueError(f"KernelSpec.window must be an int >= 0, got {self.window!r}")
        if self.window and self.key_stride != 1:
            raise ValueError("KernelSpec.window applies to key_stride 1 (the sliding window over keys) only")
        if self.target != "cpu" and self.target_cpu != "host":
            raise ValueError(f"target_cpu applies to the cpu target only; target {self.target!r} got "
                             f"target_cpu={self.target_cpu!r}")

    @property
    def heads_per_group(self) -> int:
        """HPG = H // G: query heads sharing one K/V head and one row of block_indices."""
        return self.heads // self.kv_heads

    def replace(self, **changes) -> "KernelSpec":
        return dataclasses.replace(self, **changes)

    @property
    def name(self) -> str:
        """A readable tag for file names: h64g4_d192dv128_bs64t16_bf16_gfx950."""
        cpu = "" if self.target_cpu == "host" else f"-{self.target_cpu}"
        dkdv = "" if self.dkdv_dtype in (None, self.dtype) else f"_dkdv{self.dkdv_dtype}"
        linalg = "_linalg" if self.kernels == "linalg" else ""
        stride = "" if self.key_stride == 1 else f"_stride{self.key_stride}"
        stride += f"_window{self.window}" if self.window else ""
        return (f"h{self.heads}g{self.kv_heads}_d{self.head_dim}dv{self.value_dim}"
                f"_bs{self.block_size}t{self.num_blocks}{stride}_{self.dtype}{dkdv}_{self.target}{cpu}{linalg}")


# The NSA paper's head layout (64 query heads in 4 groups, D 192, Dv 128, BS 64, 16 blocks), scaled to run in
# seconds on a CPU: one group of 16 heads keeps HPG 16 and the head dimensions, block size and T.
DEMO_SPEC = KernelSpec(heads=16, kv_heads=1, head_dim=192, value_dim=128, block_size=64, num_blocks=16,
                       dtype="bf16", target="cpu")
