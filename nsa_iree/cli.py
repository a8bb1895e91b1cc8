"""``nsa-iree``: compile artifacts, print rendered MLIR, and run the demo.

A bad value is reported in one line (``nsa-iree: error: ...``, exit status 2), as argparse reports a bad
option; an artifact or directory that cannot be compiled, stored or loaded likewise (exit status 1), without a
traceback. ``compile``, ``render`` and ``inspect`` never import torch (they start in a fraction of a second).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .spec import DEMO_SPEC, DTYPES, KERNEL_CHOICES, TARGETS, VARIANTS, KernelSpec, kernels_from_environment, \
    target_cpu_from_environment


def _add_spec_options(parser: argparse.ArgumentParser, target_default: str = "cpu") -> None:
    d = DEMO_SPEC
    parser.add_argument("--target", choices=TARGETS, default=target_default)
    parser.add_argument("--heads", type=int, default=d.heads, help="H, query heads (default %(default)s)")
    parser.add_argument("--kv-heads", type=int, default=d.kv_heads, help="G, key/value heads (default %(default)s)")
    parser.add_argument("--head-dim", type=int, default=d.head_dim, help="D (default %(default)s)")
    parser.add_argument("--value-dim", type=int, default=d.value_dim, help="Dv (default %(default)s)")
    parser.add_argument("--block-size", type=int, default=d.block_size, help="BS (default %(default)s)")
    parser.add_argument("--num-blocks", type=int, default=d.num_blocks,
                        help="T, selected blocks per row (default %(default)s)")
    parser.add_argument("--dtype", choices=DTYPES, default=d.dtype)
    parser.add_argument("--target-cpu", default=None,
                        help="cpu target: the CPU to compile for, 'host' or an LLVM CPU name such as x86-64-v3 "
                             "(AVX2, runs on any such x86-64 machine); default $NSA_IREE_CPU_TARGET, else host")
    parser.add_argument("--dkdv-dtype", choices=("f32",), default=None,
                        help="backward variants: dk and dv left in float32 (what nsa_iree.distributed adds across "
                             "ranks for 16-bit inputs); default: the input dtype")
    parser.add_argument("--kernels", choices=KERNEL_CHOICES, default=None,
                        help="auto: the hand-written kernels where they serve the layout; linalg: the compiler-"
                             "generated stages everywhere (default $NSA_IREE_KERNELS, else auto)")
    parser.add_argument("--window", type=int, default=0,
                        help="W > 0: the sliding window's modules (nsa_iree.window: keys pos - W + 1 .. pos of a row; "
                             "they run with --block-size 64 and --num-blocks (W + 62) // 64 + 1); default 0, none")


class UsageError(ValueError):
    """A value the command line accepted but nsa_iree cannot use; reported in one line, exit status 2."""


class OutputError(RuntimeError):
    """A directory the command must write cannot be made; reported in one line, exit status 1."""


_SPEC_OPTIONS = {"heads": "--heads", "kv_heads": "--kv-heads", "head_dim": "--head-dim",
                 "value_dim": "--value-dim", "block_size": "--block-size", "num_blocks": "--num-blocks"}


def _positive(option: str, value: int) -> None:
    if value <= 0:
        raise UsageError(f"{option} must be a positive integer, got {value}")


def _spec_from(args) -> KernelSpec:
    from .compiler import check_supported

    for field, option in _SPEC_OPTIONS.items():
        _positive(option, getattr(args, field))
    if args.heads % args.kv_heads:
        raise UsageError(f"--heads ({args.heads}) must be a multiple of --kv-heads ({args.kv_heads})")
    try:
        target_cpu = args.target_cpu or (target_cpu_from_environment() if args.target == "cpu" else "host")
        kernels = args.kernels or kernels_from_environment()
        spec = KernelSpec(heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim, value_dim=args.value_dim,
                          block_size=args.block_size, num_blocks=args.num_blocks, dtype=args.dtype, target=args.target,
                          target_cpu=target_cpu, kernels=kernels, dkdv_dtype=args.dkdv_dtype, window=args.window)
    except ValueError as err:
        raise UsageError(str(err).replace("target_cpu", "--target-cpu").replace("KernelSpec.window", "--window")) \
            from None
    try:
        check_supported(spec)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return spec


def _directory(option: str, path: str) -> None:
    """The directory an option names, made if need be; a UsageError naming the option if it cannot be."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"{option} {path}: cannot create the directory ({err.strerror or err})") from None


def _cmd_compile(args) -> int:
    from .compiler import compile_loaded

    spec = _spec_from(args)
    _directory("-o/--output", args.output)
    for variant in ("forward", args.variant):
        # what the operators load for this layout (its query heads may run as several groups: kernels.group_split)
        art, split = compile_loaded(spec, variant, out_dir=Path(args.output))
        how = f"compiled in {art.compile_seconds:.1f} s" if art.compile_seconds else "already there"
        groups = f", each kv head's query heads as {split} groups" if split > 1 else ""
        print(f"{art.path}  ({art.path.stat().st_size / 1024:.0f} KiB, {how}{groups})")
    return 0


def _cmd_render(args) -> int:
    from .recipes import load_recipe
    from .render import render_module

    spec = _spec_from(args)
    sys.stdout.write(render_module(spec, args.variant, load_recipe(spec.target)))
    return 0


def _cmd_inspect(args) -> int:
    from .inspect import format_table, inspect_spec
    from .kernels import loaded_spec
    from .recipes import load_recipe

    spec = _spec_from(args)
    if args.dump:
        _directory("--dump", args.dump)
    variants = ("forward",) + VARIANTS if args.variant == "all" else (args.variant,)
    for variant in variants:
        dump = Path(args.dump) / variant if args.dump else None
        # the module the operators load for this layout (kernels.loaded_spec; `render` shows the spec as given)
        run, split = loaded_spec(spec, variant, load_recipe(spec.target))
        groups = f" (each kv head's query heads as {split} groups)" if split > 1 else ""
        print(f"## {variant}: {run.name}{groups}\n")
        print(format_table(inspect_spec(run, variant, dump)))
        if dump:
            print(f"\nIR and ISA of every dispatch: {dump}")
        print()
    return 0


def _cmd_bench(rest) -> int:
    """nsa_iree.benchmark (installed with the package); results go to its --out (default ./nsa_iree_results)."""
    from .benchmark import main as bench_main

    bench_main(rest)
    return 0


def _cmd_demo(args) -> int:
    from .demo import run_demo

    _positive("--seq-len", args.seq_len)
    return run_demo(seq_len=args.seq_len, seed=args.seed)


def _fail(status: int, message: str) -> int:
    sys.stderr.write(f"nsa-iree: error: {message}\n")
    return status


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="nsa-iree", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="compile the forward and a backward variant into DIR")
    _add_spec_options(p)
    p.add_argument("--variant", choices=VARIANTS, default="two-pass")
    p.add_argument("-o", "--output", default="nsa_iree_artifacts", help="output directory (default %(default)s)")
    p.set_defaults(fn=_cmd_compile)

    # "select": nsa_iree.select_blocks' module (T its output slots, BS the compression's block size)
    p = sub.add_parser("render", help="print the MLIR module compiled for a configuration")
    _add_spec_options(p)
    p.add_argument("--variant", choices=("forward",) + VARIANTS + ("select",), default="forward")
    p.set_defaults(fn=_cmd_render)

    p = sub.add_parser("inspect", help="one row per dispatch: pipeline, registers, scratch, LDS, MMA and atomics")
    _add_spec_options(p, target_default="gfx950")
    p.add_argument("--variant", choices=("all", "forward") + VARIANTS + ("select",), default="all")
    p.add_argument("--dump", help="keep the full IR and ISA of every dispatch under DIR/<variant>")
    p.set_defaults(fn=_cmd_inspect)

    p = sub.add_parser("demo", help="compile the default configuration for gfx950 and cpu, run and check it on cpu")
    p.add_argument("--seq-len", type=int, default=1024, help="M = N (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=_cmd_demo)

    sub.add_parser("bench", help="benchmarks against dense attention and fla (nsa-iree bench --help)",
                   add_help=False)

    from .cache import ArtifactError
    from .compiler import CompileError

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["bench"]:
            return _cmd_bench(argv[1:])
        args = parser.parse_args(argv)
        return args.fn(args)
    except (UsageError, NotImplementedError) as err:     # NotImplementedError: no kernel for the layout (select)
        return _fail(2, str(err))
    except (ArtifactError, CompileError, OutputError) as err:
        return _fail(1, str(err))
    except OSError as err:          # a directory that cannot be made or written (-o, --dump, the cache)
        where = f"{err.filename}: " if err.filename else ""
        return _fail(1, f"{where}{err.strerror or err}")


if __name__ == "__main__":
    sys.exit(main())
