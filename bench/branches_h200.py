"""Every branch row of `nsa-iree bench` on the H200 (issues 27 and 28), and the compile step it needs (the GPU has
no compiler: every module it loads is compiled here and carried in .dev/artifacts).

    NSA_IREE_CACHE_DIR=.dev/artifacts python3 -m bench.branches_h200 --compile [BRANCH ...]
        here: every cuda module the rows of PLAN (default: all its branches) and their checks load
    python3 -m bench.branches_h200 OUT BRANCH [--config C ...] [--seq N ...] [--repeats R]
        on the GPU: `nsa-iree bench --branch BRANCH` for each config (default PLAN's for the branch), in this process
        (OUT/<config>_<branch>_H200.{json,md}); bench/run_branches_h200.sh runs every branch, a process each

The modules a row loads depend on its length only through the compressed attention's tiles (a power of two of
them, nsa_iree.compression.tile_slots); branch_specs lists them as nsa_iree.api.describe, nsa_iree.compression and
nsa_iree.layer make them (tests/test_bench.py checks the list against what a CPU run asks for).
"""

from __future__ import annotations

import argparse
import sys

import torch

from nsa_iree import benchmark, compression, window
from nsa_iree.spec import KernelSpec, kernels_from_environment, target_cpu_from_environment

LENGTHS = (8192, 16384, 32768, 65536, 131072)
WINDOW = 512            # fla-default NativeSparseAttention's window
REPEATS = 5
# branch: the configs its rows run (in this order, one after another in one process)
PLAN = {"compression": ("anchors", "paper", "fla-default"), "select": ("anchors", "paper", "fla-default"),
        "layer": ("anchors", "fla-default"), "window": ("anchors", "fla-default")}

Spec = tuple[KernelSpec, str]
# The recipe nsa_iree.api runs an H200's tensors with (compute capability 9.0: hopper, cuda's modules but the window's
# forward); the modules without a Hopper kernel are cuda's artifacts (nsa_iree.compiler.shared_spec).
H200 = "hopper"


def branch_specs(config: str, branch: str, seq: int, window_size: int, target: str = H200) -> list[Spec]:
    """(KernelSpec, variant) of every module nsa_iree's rows of `branch` (--branch) load at `seq` tokens with the
    window `window_size`, on `target`."""
    cfg = benchmark.CONFIGS[config]
    h, g, d, dv, bs, t = (cfg[x] for x in ("heads", "kv_heads", "head_dim", "value_dim", "block_size", "num_blocks"))
    host = dict(dtype=cfg["dtype"], target=target,
                target_cpu=target_cpu_from_environment() if target == "cpu" else "host")
    layout = dict(heads=h, kv_heads=g, head_dim=d, value_dim=dv, **host, kernels=kernels_from_environment())
    tile = compression._tile(torch.device("cpu" if target == "cpu" else "cuda"))
    compressed = KernelSpec(**layout, block_size=tile, key_stride=bs,
                            num_blocks=compression.tile_slots(-(-seq // bs), tile))
    select = KernelSpec(**dict(layout, value_dim=d), block_size=bs, num_blocks=t)
    windowed = KernelSpec(**layout, block_size=window.WINDOW_BLOCK, num_blocks=window.window_slots(window_size),
                          window=window_size)
    # the mean pooling of k and v: IREE dispatches on the CPU (nsa_iree.compression), torch's reduction on GPUs
    pooling = [(KernelSpec(heads=g, kv_heads=g, head_dim=dim, value_dim=dim, block_size=bs, num_blocks=1, **host),
                "pooling") for dim in dict.fromkeys((d, dv))] if target == "cpu" else []
    if branch == "compression":
        return [*pooling, (compressed, "forward"), (compressed, "two-pass")]
    if branch == "select":
        return [*pooling, (compressed, "forward"), (select, "select")]
    if branch == "window":
        return [(windowed, "forward"), (windowed, "two-pass")]
    if branch != "layer":
        raise ValueError(f"no modules listed for the branch {branch!r}")
    selection = KernelSpec(**layout, block_size=bs, num_blocks=t)
    gates = KernelSpec(heads=h, kv_heads=1, head_dim=dv, value_dim=dv, **host)
    return [*pooling, (selection, "forward"), (selection, "two-pass"), (compressed, "forward"),
            (compressed, "two-pass"), (select, "select"), (gates, "gates"), (windowed, "forward"),
            (windowed, "two-pass")]


def run_specs(config: str, branch: str, lengths, window_size: int, target: str = H200) -> list[Spec]:
    """branch_specs of a run of `lengths` and of its check (benchmark.check_sizes), each once."""
    check_seq, check_window = benchmark.check_sizes(benchmark.CONFIGS[config], "cpu" if target == "cpu" else "cuda",
                                                    branch, window_size)
    wanted = branch_specs(config, branch, check_seq, check_window, target)
    for seq in lengths:
        wanted += branch_specs(config, branch, seq, window_size, target)
    return list(dict.fromkeys(wanted))


def compile_all(branches) -> None:
    """Compile into $NSA_IREE_CACHE_DIR every cuda module PLAN's rows of `branches` load."""
    from nsa_iree.compiler import compile_loaded

    wanted = [s for branch in branches for config in PLAN[branch] for s in run_specs(config, branch, LENGTHS, WINDOW)]
    for spec, variant in dict.fromkeys(wanted):
        print(compile_loaded(spec, variant)[0].path.name, flush=True)


def run(out: str, branch: str, configs=None, lengths=LENGTHS, repeats: int = REPEATS) -> list[dict]:
    """`nsa-iree bench --device cuda --branch BRANCH` for each config (default PLAN's), one after another in this
    process; the records, each also written to OUT after every row."""
    records = []
    for config in configs or PLAN[branch]:
        records.append(benchmark.main(["--device", "cuda", "--config", config, "--branch", branch,
                                       "--window", str(WINDOW), "--seq", *map(str, lengths),
                                       "--repeats", str(repeats), "--out", out]))
    return records


def main(argv: list[str]) -> None:
    if argv[:1] == ["--compile"]:
        unknown = [b for b in argv[1:] if b not in PLAN]
        if unknown:
            raise SystemExit(f"branches_h200: no branch {', '.join(unknown)} (choose from {', '.join(PLAN)})")
        compile_all(argv[1:] or list(PLAN))
        return
    parser = argparse.ArgumentParser(prog="python3 -m bench.branches_h200", description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("branch", choices=PLAN)
    parser.add_argument("--config", nargs="+", choices=sorted(set(c for cs in PLAN.values() for c in cs)))
    parser.add_argument("--seq", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args(argv)
    run(args.out, args.branch, args.config, lengths=args.seq, repeats=args.repeats)


if __name__ == "__main__":
    main(sys.argv[1:])
