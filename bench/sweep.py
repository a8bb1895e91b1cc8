"""Tuning sweeps: the two-pass backward under variants of a target's recipe, timed per dispatch.

The tile and subgroup settings of the fused regions live in ``pipelines/<target>.toml``; a sweep renders
each variant below into its own recipe directory, compiles it (where the compiler is), and times it on the
GPU (where only the runtime is), loading each variant through ``$NSA_IREE_PIPELINES_DIR``:

    python3 -m bench.sweep prepare --target cuda --dir .dev/sweep        # here: recipes + artifacts
    python3 -m bench.sweep run --dir .dev/sweep --seq 65536 --out OUT    # on the GPU, same checkout

Every variant is checked against the baseline's gradients before it is timed (a variant that changes the
numbers beyond bf16 rounding is reported, not timed). Results: ``OUT/sweep.md`` and ``OUT/sweep.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import time
from pathlib import Path

import torch

# Attribute slots of the backward's fused regions (dq pass, dv and dk regions).
BACKWARD_SLOTS = ("DQ_", "DV_", "DK_")


def _subgroups(count: int):
    """4 subgroups per workgroup -> `count`: the split dimension of every subgroup_basis, and the lanes."""
    def edit(line: str) -> str:
        line = re.sub(r"(subgroup_basis = \[\[[\d, ]*?)\b4\b", rf"\g<1>{count}", line)
        return line.replace("workgroup_size = [128, 1, 1]", f"workgroup_size = [{32 * count}, 1, 1]")
    return edit


def _only(prefix: str, edit):
    """An edit applied to the attribute lines of one region only."""
    return lambda line: edit(line) if line.startswith(prefix) else line


def _promote_blocks_only(line: str) -> str:
    """Shared-memory promotion for the gathered K/V block operands only, not for the row's q / do / ds
    tiles (the same small tile every step of the dq loop)."""
    line = line.replace("[${PROMOTE_BOTH_D}]", "[${PROMOTE_RHS_D}]")
    return line.replace("[${PROMOTE_BOTH_DV}]", "[${PROMOTE_RHS_DV}]")


def _no_promotion(line: str) -> str:
    return re.sub(r"promote_operands = \[[^\]]*\]", "promote_operands = []", line)


def _dkdv_split_keys(line: str) -> str:
    """dv/dk roots: subgroups own 16 of the block's 64 keys each instead of a quarter of the head dim."""
    if line.startswith(("DV_ROOT", "DK_ROOT")):
        return line.replace("subgroup_basis = [[1, 1, 4, 1, 1]", "subgroup_basis = [[1, 4, 1, 1, 1]")
    return line


# name -> (edit applied to every backward attribute line, rows_per_piece or None)
VARIANTS = {
    "baseline": (None, None),
    "2 subgroups": (_subgroups(2), None),
    "8 subgroups": (_subgroups(8), None),
    "no shared-memory promotion": (_no_promotion, None),
    "dk/dv subgroups split keys": (_dkdv_split_keys, None),
    "dq: promote K/V blocks only": (_only("DQ_", _promote_blocks_only), None),
    "dq: no shared-memory promotion": (_only("DQ_", _no_promotion), None),
    "dq: 2 subgroups": (_only("DQ_", _subgroups(2)), None),
    "rows_per_piece 32": (None, 32),
    "rows_per_piece 64": (None, 64),
    "rows_per_piece 128": (None, 128),
    "rows_per_piece 256": (None, 256),
}


@contextlib.contextmanager
def _sweep_environment():
    """The variants are selected through environment variables; leave the process as it was found."""
    from nsa_iree import api

    saved = {key: os.environ.get(key) for key in ("NSA_IREE_CACHE_DIR", "NSA_IREE_PIPELINES_DIR")}
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        api._artifact_path.cache_clear()


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def prepare(args):
    from nsa_iree.compiler import CompileError, compile_artifact
    from nsa_iree.recipes import PIPELINES_DIR
    from nsa_iree.spec import KernelSpec

    from .bench import CONFIGS

    cfg = CONFIGS[args.config]
    spec = KernelSpec(heads=cfg["heads"], kv_heads=cfg["kv_heads"], head_dim=cfg["head_dim"],
                      value_dim=cfg["value_dim"], block_size=cfg["block_size"], num_blocks=cfg["num_blocks"],
                      dtype=cfg["dtype"], target=args.target)
    recipes = {p.name: p.read_text() for p in PIPELINES_DIR.glob("*.toml")}   # the target's and any base it names
    root = Path(args.dir)
    os.environ["NSA_IREE_CACHE_DIR"] = str(root / "artifacts")
    for name, (edit, rows_per_piece) in VARIANTS.items():
        if args.variants and name != "baseline" and name not in args.variants:
            continue
        recipe_dir = root / "recipes" / _slug(name)
        recipe_dir.mkdir(parents=True, exist_ok=True)
        for file_name, text in recipes.items():
            lines = []
            for line in text.splitlines():
                if edit is not None and line.startswith(BACKWARD_SLOTS):
                    line = edit(line)
                if rows_per_piece is not None and line.startswith("rows_per_piece ="):
                    line = f"rows_per_piece = {rows_per_piece}"
                lines.append(line)
            (recipe_dir / file_name).write_text("\n".join(lines) + "\n")
        (recipe_dir / "name").write_text(name)
        os.environ["NSA_IREE_PIPELINES_DIR"] = str(recipe_dir)
        try:
            for variant in ("forward", "two-pass"):
                art = compile_artifact(spec, variant)
            print(f"{name}: compiled in {art.compile_seconds:.1f} s")
        except CompileError as err:
            (recipe_dir / "compile_error.txt").write_text(str(err))
            print(f"{name}: does not compile: {str(err).splitlines()[-1][:200]}")


def run(args):
    import nsa_iree
    from nsa_iree.testing import relative_rms_error
    from torch.profiler import ProfilerActivity, profile

    from .bench import CONFIGS, _sync, make_problem

    device = torch.device(args.device)
    cfg = CONFIGS[args.config]
    root = Path(args.dir)
    os.environ["NSA_IREE_CACHE_DIR"] = str(root / "artifacts")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for selection in args.selection:
        q, k, v, do, idx = make_problem(cfg, args.seq, selection, device)
        reference = None
        for recipe_dir in sorted((root / "recipes").iterdir(), key=lambda d: d.name != "baseline"):
            name = (recipe_dir / "name").read_text()
            row = {"variant": name, "selection": selection, "seq": args.seq}
            if (recipe_dir / "compile_error.txt").exists():
                row["error"] = "does not compile"
                results.append(row)
                print(json.dumps(row), flush=True)
                continue
            os.environ["NSA_IREE_PIPELINES_DIR"] = str(recipe_dir)      # (nsa_iree.api's answers are per directory)
            o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, cfg["block_size"])

            def bwd():
                return nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, cfg["block_size"])
            grads = bwd()
            _sync(device)
            if reference is None:
                reference = [g.float() for g in grads]
            row["difference"] = max(relative_rms_error(g.float(), r) for g, r in zip(grads, reference))
            if row["difference"] > 1e-2:
                row["error"] = "gradients differ from the baseline's"
                results.append(row)
                print(json.dumps(row), flush=True)
                continue
            times = []
            for _ in range(args.repeats + 2):       # two warm-up runs, then the median of the rest
                _sync(device)
                start = time.perf_counter()
                bwd()
                _sync(device)
                times.append(time.perf_counter() - start)
            row["bwd_ms"] = statistics.median(times[2:]) * 1e3
            kernels = {}
            if device.type == "cuda":                # per-dispatch device time (CUPTI sees IREE's kernels)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    bwd()
                    _sync(device)
                for e in prof.key_averages():
                    m = re.search(r"(dq|dkdv|delta|invert_block_indices)_dispatch_(\d+)", e.key)
                    if m and e.device_time_total > 0:
                        kernels[f"{m.group(1)}_{m.group(2)}"] = round(e.device_time_total / 1e3, 3)
            row["kernels_ms"] = dict(sorted(kernels.items(), key=lambda kv: -kv[1]))
            results.append(row)
            print(json.dumps(row), flush=True)
        q = k = v = do = idx = None  # free the GPU memory (closures above read them)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    (out / "sweep.json").write_text(json.dumps(results, indent=1))
    title = (f"# Two-pass backward sweep, {args.config} configuration ({cfg}), {args.seq} tokens, "
             f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}")
    text = markdown(results, title, f"pipelines/{args.target}.toml as checked in", args.repeats)
    (out / "sweep.md").write_text(text)
    print(text)


def markdown(results, title: str, baseline: str, repeats: int) -> str:
    lines = [title, "", f"Baseline: {baseline}. Median of {repeats} runs after 2 warm-ups; dispatch times from one",
             "profiled run (dq_4 = dq region, dkdv_6 = dk region, dkdv_5 = dv region, dkdv_7 = ordered piece sums).",
             "Every variant's gradients were checked against the baseline's before timing.", "",
             "| selection | variant | bwd ms | hottest dispatches (ms) |", "|---|---|---|---|"]
    for r in results:
        hot = ", ".join(f"{k} {v:.1f}" for k, v in list(r.get("kernels_ms", {}).items())[:4])
        result = f"{r['bwd_ms']:.1f}" if "bwd_ms" in r else r["error"]
        lines.append(f"| {r['selection']} | {r['variant']} | {result} | {hot} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m bench.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("prepare", "run"))
    parser.add_argument("--dir", default=".dev/sweep")
    parser.add_argument("--target", default="cuda", help="prepare: the recipe to vary; run: for the report")
    parser.add_argument("--config", default="anchors")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seq", type=int, default=65536)
    parser.add_argument("--selection", nargs="+", default=["realistic"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=".dev/sweep/results")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, help="prepare only these (and the baseline)")
    args = parser.parse_args(argv)
    with _sweep_environment():
        (prepare if args.mode == "prepare" else run)(args)


if __name__ == "__main__":
    main()
