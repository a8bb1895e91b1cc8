"""What each kernel became on each target: one row per dispatch, read from IREE's executable dumps.

gfx950 / gfx942 (the .rocmasm of the linked hsaco): codegen pipeline, workgroup size, VGPRs / AGPRs,
scratch bytes, LDS bytes, occupancy (waves per SIMD), and counts of MFMA, LDS reads (all, 8/16-bit, and
per MFMA), global loads / stores, atomic adds and compare-and-swap loops. cuda (the PTX): declared
registers, static shared memory, mma.sync, shared-memory reads (ld.shared and ldmatrix: all, 8/16-bit,
per mma.sync), atomics. cpu (the x86 / AArch64 assembly): the widest vector register used and instruction counts.

How to read gfx950 (CDNA4) numbers: ScratchSize 0 (no spills), MFMA in every contraction, at least
2 waves per SIMD (512 VGPR+AGPR registers per lane are shared by the waves of a SIMD; 8 waves at most),
LDS within 160 KB per workgroup.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

from .cache import cache_dir, writable_dir
from .compiler import CompileError, cache_key
from .recipes import load_recipe
from .render import render_module
from .spec import KernelSpec

LDS_BYTES = {"gfx950": 160 * 1024, "gfx942": 64 * 1024}
VGPRS_PER_SIMD_LANE = 512
MAX_WAVES_PER_SIMD = 8


@dataclasses.dataclass
class DispatchInfo:
    name: str
    pipeline: str = ""
    workgroup_size: str = ""
    stats: dict = dataclasses.field(default_factory=dict)


def dump_executables(spec: KernelSpec, variant: str, dump_dir: Path | None = None) -> Path:
    """Compile (spec, variant) with executable dumps, once per cache key; returns the dump directory.
    CompileError when iree-compile refuses the module or is not installed."""
    try:
        from iree.compiler import CompilerToolError, compile_str
    except ImportError:
        raise CompileError("nsa-iree inspect compiles the module: it needs iree-base-compiler, which is not "
                           "installed here") from None

    recipe = load_recipe(spec.target)
    text = render_module(spec, variant, recipe)
    flags = recipe.flags_for(spec)
    key = cache_key(text, flags)
    if dump_dir:
        target = Path(dump_dir)
    else:
        target = writable_dir(cache_dir(), "executable dumps") / "dumps" / f"{variant}_{spec.name}_{key[:16]}"
    if not (target / ".complete").exists():
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        (target / "module.mlir").write_text(text)
        # Sources, configurations, intermediates (.rocmasm, .ptx, .s) and binaries; not the benchmarks that
        # --iree-hal-dump-executable-files-to also asks for (IREE remarks on every module that it made none).
        dumps = [f"--iree-hal-dump-executable-{kind}-to={target}"
                 for kind in ("sources", "configurations", "intermediates", "binaries")]
        try:
            compile_str(text, extra_args=[*flags, *dumps])
        except CompilerToolError as err:
            raise CompileError(f"iree-compile failed for {variant} {spec.name} (module kept at "
                               f"{target / 'module.mlir'})\n{err}") from None
        (target / ".complete").write_text(key)
    return target


def _configurations(dump: Path) -> dict[str, tuple[str, str]]:
    """dispatch name -> (codegen pipeline, workgroup size) from the configured_module_*.mlir files."""
    out = {}
    for f in sorted(dump.glob("configured_module_*.mlir")):
        text = f.read_text()
        # (other attributes, e.g. the NVIDIA kernels' nvvm.minctasm, print before translation_info)
        for m in re.finditer(r"func\.func @(\w+)\(\) attributes \{(?:[\w.]+ = [^,{}]*, )*translation_info = "
                             r"#iree_codegen\.translation_info<\s*pipeline = (#iree_codegen\.pass_pipeline<\"[^\"]*\">|"
                             r"(?:#iree_\w+\.pipeline<)?\w+)([^}]*)", text):
            name, pipeline, rest = m.groups()
            # A hand-written kernel (nsa_iree/kernels/gpu/nvidia/) names its own pass list.
            pipeline = "hand-written" if pipeline.startswith("#iree_codegen.pass_pipeline") else pipeline.split("<")[-1]
            wg = re.search(r"workgroup_size = \[([^\]]*)\]", rest)
            out[name] = (pipeline, wg.group(1).replace(" ", "") if wg else "")
    return out


def _count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text, flags=re.MULTILINE))


def _rocm(dump: Path, arch: str) -> list[DispatchInfo]:
    asm = "\n".join(f.read_text() for f in sorted(dump.glob("*.rocmasm")))
    configs = _configurations(dump)
    rows = []
    for meta in re.finditer(r"^  - \.agpr_count:\s+(\d+)\n(.*?)(?=^  - \.agpr_count:|^amdhsa\.target|\Z)", asm,
                            flags=re.MULTILINE | re.DOTALL):
        agprs, block = int(meta.group(1)), meta.group(2)
        def field(key):
            return re.search(rf"^\s+\.{key}:\s+(\S+)", block, flags=re.MULTILINE).group(1)
        name = field("name")
        body_match = re.search(rf"^{re.escape(name)}:\n(.*?)^\.Lfunc_end", asm, flags=re.MULTILINE | re.DOTALL)
        body = body_match.group(1) if body_match else ""
        accum = re.search(rf"\.amdhsa_kernel {re.escape(name)}\n.*?\.amdhsa_accum_offset (\d+)", asm, flags=re.DOTALL)
        vgprs, lds, scratch = int(field("vgpr_count")), int(field("group_segment_fixed_size")), int(
            field("private_segment_fixed_size"))
        wg_threads = int(field("max_flat_workgroup_size"))
        waves = _waves_per_simd(int(accum.group(1)) if accum else vgprs, agprs, lds, wg_threads, arch)
        pipeline, wg = configs.get(name, ("", ""))
        rows.append(DispatchInfo(name, pipeline, wg or str(wg_threads), {
            "vgpr": vgprs, "agpr": agprs, "scratch": scratch, "lds": lds, "waves/simd": waves,
            "mfma": _count(r"^\s+v_mfma", body),
            **_lds_reads(_count(r"^\s+ds_read", body), _count(r"^\s+ds_read_[ui](8|16)", body),
                         _count(r"^\s+v_mfma", body)),
            "gload": _count(r"^\s+(global|buffer)_load", body),
            "gstore": _count(r"^\s+(global|buffer)_store", body),
            "atomic_add": _count(r"^\s+(global|buffer|flat)_atomic_(pk_)?add_(f32|bf16|f16)", body),
            "cmpswap": _count(r"^\s+(global|buffer|flat)_atomic_cmpswap", body),
        }))
    return rows


def _lds_reads(reads: int, narrow: int, matrix_ops: int) -> dict:
    """Workgroup-memory read instructions (ds_read / ld.shared / ldmatrix), how many of them move 8 or 16
    bits (a transposed operand read element by element), and reads per matrix instruction (static counts)."""
    return {"lds_reads": reads, "narrow_lds": narrow,
            "lds/mma": round(reads / matrix_ops, 2) if matrix_ops else "-"}


def _waves_per_simd(accum_offset: int, agprs: int, lds: int, wg_threads: int, arch: str) -> int:
    """Occupancy bound from registers (unified VGPR/AGPR file, granule 8) and from LDS per CU."""
    regs = accum_offset + agprs
    regs = max(8, -(-regs // 8) * 8)
    by_regs = min(MAX_WAVES_PER_SIMD, VGPRS_PER_SIMD_LANE // regs)
    if lds == 0:
        return by_regs
    waves_per_group = max(1, -(-wg_threads // 64))
    groups_per_cu = LDS_BYTES.get(arch, 64 * 1024) // lds
    return min(by_regs, groups_per_cu * waves_per_group // 4)


def _cuda(dump: Path) -> list[DispatchInfo]:
    ptx = "\n".join(f.read_text() for f in sorted(dump.glob("*.ptx")))
    configs = _configurations(dump)
    rows = []
    entries = list(re.finditer(r"^\.visible \.entry (\w+)\(", ptx, flags=re.MULTILINE))
    for i, m in enumerate(entries):
        body = ptx[m.end(): entries[i + 1].start() if i + 1 < len(entries) else len(ptx)]
        regs = sum(int(n) for n in re.findall(r"\.reg \.(?:b32|f32|b16|f16|pred|b64|f64)\s+%\w+<(\d+)>", body))
        shared = sum(int(n) for n in re.findall(r"\.shared \.align \d+ \.b8 \w+\[(\d+)\]", body))
        pipeline, wg = configs.get(m.group(1), ("", ""))
        rows.append(DispatchInfo(m.group(1), pipeline, wg, {
            "regs(declared)": regs, "shared": shared,
            "mma": _count(r"^\s+mma\.sync", body),
            # sm_90a's warpgroup products (the hopper kernels: inline PTX, one line each; A from registers after a
            # predicate's setp on the same line)
            "wgmma": _count(r"^.*\bwgmma\.mma_async", body),
            **_lds_reads(_count(r"^\s+(ld\.shared|ldmatrix)", body), _count(r"^\s+ld\.shared\.[bsu](8|16)\b", body),
                         _count(r"^\s+mma\.sync", body)),
            "gload": _count(r"^\s+ld\.global", body), "gstore": _count(r"^\s+st\.global", body),
            "atomic_add": _count(r"^\s+(atom|red)\.[\w.]*add\.f32", body),
            "cas": _count(r"^\s+atom\.[\w.]*cas", body),
            # workgroups per multiprocessor ptxas is asked to fit (.minnctapersm; 1 when absent)
            "min_ctas": int(m2.group(1)) if (m2 := re.search(r"^\.minnctapersm (\d+)", body, re.MULTILINE)) else 1,
        }))
    return rows


def _cpu(dump: Path) -> list[DispatchInfo]:
    asm = "\n".join(f.read_text() for f in sorted(dump.glob("*.s")))
    configs = _configurations(dump)
    rows = []
    for name in configs:
        m = re.search(rf"^{re.escape(name)}:\n(.*?)^\.Lfunc_end", asm, flags=re.MULTILINE | re.DOTALL)
        body = m.group(1) if m else ""
        width = 512 if "%zmm" in body else 256 if "%ymm" in body else 128 if "%xmm" in body else (
            128 if re.search(r"\bv\d+\.\d+[sbhd]\b|\bq\d+\b", body) else 0)
        pipeline, wg = configs[name]
        rows.append(DispatchInfo(name, pipeline, wg, {
            "vector_bits": width, "instructions": _count(r"^\s+[a-z]", body),
            "fma": _count(r"^\s+v?fmadd|^\s+vfmadd|^\s+fmla", body),
        }))
    return rows


def inspect_spec(spec: KernelSpec, variant: str, dump_dir: Path | None = None) -> list[DispatchInfo]:
    dump = dump_executables(spec, variant, dump_dir)
    if spec.target in ("gfx950", "gfx942"):
        return _rocm(dump, spec.target)
    if spec.target in ("cuda", "hopper"):
        return _cuda(dump)
    return _cpu(dump)


def format_table(rows: list[DispatchInfo]) -> str:
    keys = list(rows[0].stats) if rows else []
    header = ["dispatch", "pipeline", "workgroup"] + keys
    table = [[r.name, r.pipeline, r.workgroup_size] + [str(r.stats[k]) for k in keys] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *table)]
    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in table])
