"""Compile rendered modules with IREE and cache the artifacts on disk.

An artifact is keyed by sha256 over the rendered MLIR, the compiler version and the target's flags (plus
the host CPU for the ``cpu`` target, whose code is tuned for the machine that compiles it). A changed
template renders different text and so can never load a stale vmfb. Artifacts are written to a temporary
file and renamed into place, so processes compiling the same key at once never see a torn file, and each
vmfb has a sha256 digest beside it: a cached vmfb that does not match it (truncated, overwritten, or written
before digests) is compiled again, never loaded. A read-only cache is used as it is; what it lacks is
compiled into a per-user writable directory (nsa_iree/cache.py). Compiling never needs a device.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import platform
import sys
import time
import warnings
from pathlib import Path

from .cache import ArtifactError, atomic_write, cache_dir, describe_dir, fallback_dirs, problem_with, \
    probe_writable, tool_tmpdir, write_artifact, writable_dir
from .kernels import choose
from .recipes import HOST_CPU_FLAG, load_recipe
from .render import render_module
from .spec import TARGETS, KernelSpec


LOG = logging.getLogger("nsa_iree")

# What the compiler-generated (linalg) stages cost against the hand-written kernels they stand in for, per target
# (measured: README, Limitations; docs/performance.md).
LINALG_COST = {"cpu": "14x (forward, dq) to 34x (dk/dv) the time of the CPU kernels",
               "cuda": "on an H200 at 64k tokens the forward takes 3.4x and the backward 2.3x the time",
               "gfx950": "unmeasured on gfx950 (no MI350 here); on an H200 the forward takes 3.4x and the backward "
                         "2.3x the time"}
LINALG_COST["hopper"] = LINALG_COST["cuda"]


class _UnlessConfigured(logging.StreamHandler):
    """nsa_iree's own lines on stderr, until the application configures logging (a handler on the root logger):
    then they only go where its configuration sends them."""

    def __init__(self):
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter("nsa_iree: %(message)s"))

    def emit(self, record):
        if not logging.getLogger().handlers:
            self.stream = sys.stderr         # the current one (a test runner or notebook may have replaced it)
            super().emit(record)

    def handleError(self, record):      # a closed stderr never breaks a compile
        pass


class _ConfiguredLevel(logging.Filter):
    """Once the application configures logging, nsa_iree's INFO lines pass only where its levels let them. The
    logger starts at _OWN_LEVEL (just below INFO) so that they reach stderr before then; that must not override
    the application's root level, while a level the application gives the nsa_iree logger itself is obeyed."""

    def filter(self, record):
        root = logging.getLogger()
        if not root.handlers or LOG.level != _OWN_LEVEL:
            return True
        return record.levelno >= root.getEffectiveLevel()


_OWN_LEVEL = logging.INFO - 1         # told apart from an application's own setLevel(logging.INFO)
if not LOG.handlers:
    LOG.addHandler(_UnlessConfigured())
if LOG.level == logging.NOTSET:
    LOG.setLevel(_OWN_LEVEL)
    LOG.addFilter(_ConfiguredLevel())


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


def saved_flags(flags: tuple[str, ...]) -> str:
    """The text saved beside an artifact (``.flags``): its compile flags and, for code compiled for the host CPU
    (``--iree-llvmcpu-target-cpu=host``), the CPU it was compiled for. A runtime-only machine uses an artifact
    only when this text is its own, so code built for CPU features it lacks (AVX-512, avx512_bf16) is never
    loaded there. Code compiled for a named CPU (KernelSpec.target_cpu, e.g. x86-64-v3) carries no host."""
    text = "\n".join(flags)
    return text + f"\nhost: {_host_fingerprint()}" if HOST_CPU_FLAG in flags else text


def cache_key(text: str, flags: tuple[str, ...]) -> str:
    """sha256 over the rendered MLIR, the compiler version, the flags and (host-CPU code only) the host CPU."""
    h = hashlib.sha256()
    for part in (text, compiler_version(), "\0".join(flags), _host_fingerprint() if HOST_CPU_FLAG in flags else ""):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def check_supported(spec: KernelSpec) -> None:
    """ValueError naming the value when the target's recipe cannot compile `spec` (before any work)."""
    recipe = load_recipe(spec.target)
    if spec.dtype not in recipe.dtypes:
        raise ValueError(f"target {spec.target} supports dtypes {list(recipe.dtypes)} (pipelines/{spec.target}.toml), "
                         f"got {spec.dtype}: use bf16 or f16 inputs on GPUs, or the cpu target")
    if recipe.block_sizes is not None and spec.block_size not in recipe.block_sizes:
        raise ValueError(f"target {spec.target} supports block_size in {list(recipe.block_sizes)} "
                         f"(pipelines/{spec.target}.toml), got {spec.block_size}")


def compile_loaded(spec: KernelSpec, variant: str, out_dir: Path | None = None) -> tuple[Artifact, int]:
    """The artifact the operators load for a problem of spec (kernels.loaded_spec: its query heads may run as several
    groups), and that group split; what a machine without the compiler needs carried to it."""
    from .kernels import loaded_spec

    run, split = loaded_spec(spec, variant, load_recipe(spec.target))
    return compile_artifact(run, variant, out_dir), split


def shared_spec(spec: KernelSpec, variant: str) -> KernelSpec:
    """spec, or spec on its recipe's base target where that is a target whose module of `variant` is the same text
    under the same flags (a hopper module that holds no Hopper kernel is cuda's): one artifact serves both."""
    recipe = load_recipe(spec.target)
    if recipe.base not in TARGETS:
        return spec
    base = spec.replace(target=recipe.base)
    base_recipe = load_recipe(recipe.base)
    same_text = _body(render_module(spec, variant, recipe)) == _body(render_module(base, variant, base_recipe))
    return base if same_text and recipe.flags_for(spec) == base_recipe.flags_for(base) else spec


def _body(text: str) -> str:
    """A rendered module without its first line (render_module's header, which names the spec)."""
    return text.split("\n", 1)[1]


def compile_artifact(spec: KernelSpec, variant: str, out_dir: Path | None = None,
                     rebuild: bool = False) -> Artifact:
    """The vmfb for (spec, variant), from the cache or freshly compiled into it (or into out_dir).

    A cached vmfb is used only when it matches the digest beside it; otherwise it is compiled again (with a
    warning). rebuild=True compiles again even over a verified one (IREE refused to load it). When the cache
    directory cannot be written, its verified artifacts are still used and new ones go to a per-user
    directory (cache.writable_dir, with a warning); out_dir must be writable.
    """
    check_supported(spec)
    spec = shared_spec(spec, variant)
    recipe = load_recipe(spec.target)
    text = render_module(spec, variant, recipe)
    flags = recipe.flags_for(spec)
    primary = Path(out_dir) if out_dir is not None else cache_dir()
    try:
        key = cache_key(text, flags)
    except ImportError:
        return _prebuilt(spec, variant, text, flags, primary, searched_fallbacks=out_dir is None)
    stem = f"{variant}_{spec.name}_{key[:16]}"
    problem = problem_with(primary / f"{stem}.vmfb")
    if problem is None and not rebuild:
        return Artifact(spec, variant, primary / f"{stem}.vmfb", primary / f"{stem}.mlir", key, 0.0)
    what = f"the {variant} artifact for {spec.name}"
    if out_dir is None:
        directory = writable_dir(primary, what)
    else:
        error = probe_writable(primary)
        if error is not None:
            raise ArtifactError(f"nsa_iree: cannot write {what} into {primary}: {error.strerror or error}")
        directory = primary
    vmfb, mlir = directory / f"{stem}.vmfb", directory / f"{stem}.mlir"
    if directory != primary and not rebuild and problem_with(vmfb) is None:
        return Artifact(spec, variant, vmfb, mlir, key, 0.0)   # compiled into the fallback by an earlier run
    if rebuild and problem is None:
        warnings.warn(f"nsa_iree: IREE could not load the cached artifact {primary / (stem + '.vmfb')}: "
                      f"compiling it again into {vmfb}", RuntimeWarning, stacklevel=2)
    elif problem != "it does not exist":
        warnings.warn(f"nsa_iree: the cached artifact {primary / (stem + '.vmfb')} cannot be used ({problem}): "
                      f"compiling it again into {vmfb}", RuntimeWarning, stacklevel=2)

    atomic_write(mlir, text.encode())
    atomic_write(mlir.with_suffix(".flags"), saved_flags(flags).encode())
    LOG.info("compiling the %s kernels of %s for %s (seconds to a minute, once; cached in %s)", variant, spec.name,
             spec.target if spec.target_cpu == "host" else f"cpu {spec.target_cpu}", directory)
    start = time.perf_counter()
    try:
        from iree.compiler import CompilerToolError, compile_str
        with tool_tmpdir(directory):
            binary = compile_str(text, extra_args=list(flags))
    except CompilerToolError as err:
        raise CompileError(
            f"iree-compile failed for {variant} {spec.name}; rendered MLIR kept at {mlir}\n{err}") from None
    seconds = time.perf_counter() - start
    write_artifact(vmfb, binary)
    LOG.info("compiled the %s kernels of %s in %.1f s: %s", variant, spec.name, seconds, vmfb.name)
    return Artifact(spec, variant, vmfb, mlir, key, seconds)


def fallback_warning(spec: KernelSpec, variant: str) -> str | None:
    """The warning for (spec, variant) when some of its stages cannot run their hand-written kernel (None if all
    can): which stages, the limits they cross, what it costs."""
    from .render import STAGES

    recipe = load_recipe(spec.target)
    choices = {stage: choose(stage, spec, recipe) for stage in STAGES[variant]}
    crossed = {stage: c.crossed for stage, c in choices.items() if c.crossed}
    if not crossed:
        return None
    stages = "; ".join(f"{stage}: {', '.join(why)}" for stage, why in crossed.items())
    return (f"nsa_iree: {spec.name} runs the compiler-generated (linalg) {variant} stages instead of the hand-written "
            f"kernels ({stages}). Cost: {LINALG_COST.get(spec.target, 'slower')}.")


def _prebuilt(spec: KernelSpec, variant: str, text: str, flags, primary: Path, searched_fallbacks: bool) -> Artifact:
    """On a machine with only the IREE runtime (a GPU box): an artifact compiled elsewhere is used when the
    MLIR and flags saved beside it are exactly what this checkout renders, so it cannot be stale, and the
    vmfb matches its digest, so it is not torn or corrupted."""
    directories = [primary] + (fallback_dirs(primary) if searched_fallbacks else [])
    rejected = []
    for directory in directories:
        for vmfb in sorted(directory.glob(f"{variant}_{spec.name}_*.vmfb")):
            mlir, flags_file = vmfb.with_suffix(".mlir"), vmfb.with_suffix(".flags")
            try:
                same = mlir.read_text() == text and flags_file.read_text() == saved_flags(flags)
            except (OSError, UnicodeDecodeError):
                continue
            if not same:
                continue
            problem = problem_with(vmfb)
            if problem is None:
                return Artifact(spec, variant, vmfb, mlir, vmfb.stem.rsplit("_", 1)[-1], 0.0)
            rejected.append(f"{vmfb}: {problem}")
    if rejected:
        raise ArtifactError(f"nsa_iree: iree-base-compiler is not installed, so the cached {variant} artifact for "
                            f"{spec.name} cannot be rebuilt here: {'; '.join(rejected)}. Compile it again with "
                            f"`nsa-iree compile` where the compiler is installed and point NSA_IREE_CACHE_DIR at "
                            f"the result (now {describe_dir(primary)}).")
    raise CompileError(f"iree-base-compiler is not installed and {primary} holds no artifact compiled from "
                       f"this checkout's {variant} module for {spec.name}: compile it with `nsa-iree compile` "
                       f"where the compiler is installed and point NSA_IREE_CACHE_DIR at the result")
