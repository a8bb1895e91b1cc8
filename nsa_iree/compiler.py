"""Compile rendered modules with IREE and cache the artifacts on disk.

An artifact is keyed by sha256 over the rendered MLIR, the compiler version and the target's flags (plus
the host CPU for the ``cpu`` target, whose code is tuned for the machine that compiles it). A changed
template renders different text and so can never load a stale vmfb. Artifacts are written to a temporary
file and renamed into place, so processes compiling the same key at once never see a torn file.
Compiling never needs a device.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
import tempfile
import time
from pathlib import Path

from .recipes import load_recipe
from .render import render_module
from .spec import KernelSpec


class CompileError(RuntimeError):
    """iree-compile rejected a rendered module. The message carries the diagnostic and the MLIR's path."""


@dataclasses.dataclass(frozen=True)
class Artifact:
    spec: KernelSpec
    variant: str
    path: Path          # the .vmfb
    mlir_path: Path     # the rendered module it was compiled from
    key: str
    compile_seconds: float  # 0.0 when it came from the cache


def cache_dir() -> Path:
    """``$NSA_IREE_CACHE_DIR``, else ``$XDG_CACHE_HOME/nsa_iree``, else ``~/.cache/nsa_iree``."""
    env = os.environ.get("NSA_IREE_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nsa_iree"


def compiler_version() -> str:
    from iree.compiler import version
    return f"{version.VERSION} {version.REVISIONS.get('IREE', '')}"


def _host_fingerprint() -> str:
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line
                break
    except OSError:
        pass
    return f"{platform.machine()} {flags}"


def cache_key(text: str, flags: tuple[str, ...], target: str) -> str:
    h = hashlib.sha256()
    for part in (text, compiler_version(), "\0".join(flags), _host_fingerprint() if target == "cpu" else ""):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def compile_artifact(spec: KernelSpec, variant: str, out_dir: Path | None = None) -> Artifact:
    """The vmfb for (spec, variant), from the cache or freshly compiled into it (or into out_dir)."""
    recipe = load_recipe(spec.target)
    if spec.dtype not in recipe.dtypes:
        raise ValueError(f"target {spec.target} supports dtypes {list(recipe.dtypes)} (pipelines/{spec.target}.toml), "
                         f"got {spec.dtype}: use bf16 or f16 inputs on GPUs, or the cpu target")
    if recipe.block_sizes is not None and spec.block_size not in recipe.block_sizes:
        raise ValueError(f"target {spec.target} supports block_size in {list(recipe.block_sizes)} "
                         f"(pipelines/{spec.target}.toml), got {spec.block_size}")
    text = render_module(spec, variant)
    directory = Path(out_dir) if out_dir is not None else cache_dir()
    try:
        key = cache_key(text, recipe.flags, spec.target)
    except ImportError:
        return _prebuilt(spec, variant, text, recipe.flags, directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{variant}_{spec.name}_{key[:16]}"
    vmfb, mlir = directory / f"{stem}.vmfb", directory / f"{stem}.mlir"
    if vmfb.exists():
        return Artifact(spec, variant, vmfb, mlir, key, 0.0)

    _atomic_write(mlir, text.encode())
    _atomic_write(mlir.with_suffix(".flags"), "\n".join(recipe.flags).encode())
    start = time.perf_counter()
    try:
        from iree.compiler import CompilerToolError, compile_str
        binary = compile_str(text, extra_args=list(recipe.flags))
    except CompilerToolError as err:
        raise CompileError(
            f"iree-compile failed for {variant} {spec.name}; rendered MLIR kept at {mlir}\n{err}") from None
    seconds = time.perf_counter() - start
    _atomic_write(vmfb, binary)
    return Artifact(spec, variant, vmfb, mlir, key, seconds)


def _prebuilt(spec: KernelSpec, variant: str, text: str, flags, directory: Path) -> Artifact:
    """On a machine with only the IREE runtime (a GPU box): an artifact compiled elsewhere is used when the
    MLIR and flags saved beside it are exactly what this checkout renders, so it cannot be stale."""
    for vmfb in sorted(directory.glob(f"{variant}_{spec.name}_*.vmfb")):
        mlir, saved_flags = vmfb.with_suffix(".mlir"), vmfb.with_suffix(".flags")
        if (mlir.exists() and saved_flags.exists() and mlir.read_text() == text
                and saved_flags.read_text() == "\n".join(flags)):
            return Artifact(spec, variant, vmfb, mlir, vmfb.stem.rsplit("_", 1)[-1], 0.0)
    raise CompileError(f"iree-base-compiler is not installed and {directory} holds no artifact compiled from "
                       f"this checkout's {variant} module for {spec.name}: compile it with `nsa-iree compile` "
                       f"where the compiler is installed and point NSA_IREE_CACHE_DIR at the result")


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
