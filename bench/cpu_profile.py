"""Per-dispatch CPU profile of the compiled modules (forward, two-pass and one-pass backward).

    python -m bench.cpu_profile --config cpu --seq 4096 --out bench/results/cpu_profile_before

Each stage function of the cpu artifacts is run by IREE's own `iree-benchmark-module` with the runtime's
host-execution profiling (`--device_profiling_mode=host-execution`), and `iree-profile dispatch` reduces the
bundle to a time per dispatch. The modules are the ones the package renders for the cpu target, compiled
with the recipe's flags, except that the caller-provided transient storage argument is removed (the tool
cannot pass one; IREE then allocates the transients itself). The inputs are the benchmark's problem
(bench.bench.make_problem, realistic selection); lse, delta and the inverted block lists come from the
package's own stages, so every dispatch sees the data it sees in a real call.

With --branch compression the problem is the compression branch's instead (nsa_iree.compression): the
compressed attention over mean_pooling of the benchmark's k and v, its tiles of compressed keys
(compression.TILE) and key stride BS as the package runs them; the variant "pooling" profiles the pooling's
forward and backward dispatches (kernels/common/pooling.mlir) on the same k.

Times are wall-clock per dispatch (all workers of the task system; `tile_sum` adds the time of every
workgroup on every worker). The table gives the median over --repeats calls of each function.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

import nsa_iree
from nsa_iree import api, compression
from nsa_iree.recipes import load_recipe
from nsa_iree.render import render_module

from .bench import CONFIGS, make_problem

_TRANSIENTS = re.compile(r",\s*%transients: !hal.buffer \{iree\.abi\.transients\}\)")
# a host function's call of another entry point hands it its transients (cpu/dense_backward.mlir's of delta)
_CALL_TRANSIENTS = re.compile(r"(func\.call @\w+\([^)]*), %transients\)(\s*:\s*\([^)]*), !hal\.buffer\)")


def _tool(name: str) -> str:
    import iree._runtime_libs as libs
    return str(Path(libs.__file__).parent / name)


def _compile(spec, variant: str, where: Path) -> Path:
    from iree.compiler import compile_str
    if variant == "pooling":     # compression._pooling_module's spec for the keys (G heads of D)
        spec = spec.replace(heads=spec.kv_heads, value_dim=spec.head_dim, block_size=spec.key_stride, num_blocks=1,
                            key_stride=1)
    text = _CALL_TRANSIENTS.sub(r"\1)\2)", _TRANSIENTS.sub(")", render_module(spec, variant)))
    vmfb = where / f"{variant}.vmfb"
    vmfb.write_bytes(compile_str(text, extra_args=list(load_recipe("cpu").flags)))
    return vmfb


def _inputs(cfg, seq, where: Path):
    q, k, v, do, idx = make_problem(cfg, seq, "realistic", torch.device("cpu"))
    idx = idx.to(torch.int32).contiguous()
    bs = cfg["block_size"]
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, bs)
    spec = api.describe(q, k, v, idx, bs)
    module = api.kernels(spec, "two-pass", q.device)
    host = module.device.copy_to_host
    delta = (do.float() * o.float()).sum(-1)     # [B, M, H]: the input of the delta-reading stages
    entries, piece_start, piece_count = map(host, module.call("invert_block_indices", idx, seq))
    arrays = dict(q=q, k=k, v=v, do=do, o=o, idx=idx, lse=lse, delta=delta, entries=entries,
                  piece_start=piece_start, piece_count=piece_count)
    files = {}
    for name, t in arrays.items():
        files[name] = where / f"{name}.npy"
        np.save(files[name], t.contiguous().numpy())
    return spec, files, {name: tuple(t.shape) for name, t in arrays.items()}


def _compression_inputs(cfg, seq, where: Path):
    """spec, files and shapes of the compressed attention at `seq` tokens (compression._forward's call), and the
    pooling's inputs (k, its block counts, the pooled k as its backward's dy)."""
    q, k, v, do, _ = make_problem(cfg, seq, "realistic", torch.device("cpu"))
    bs = cfg["block_size"]
    k_cmp, v_cmp = nsa_iree.mean_pooling(k, bs), nsa_iree.mean_pooling(v, bs)
    tile = compression._tile(q.device)
    idx = compression._tile_indices(1, seq, 0, k_cmp.shape[2], k_cmp.shape[1], q.device)
    o, lse = nsa_iree.compressed_attention(q, k_cmp, v_cmp, bs)
    spec, _ = api.loaded_spec(api.describe(q, k_cmp, v_cmp, idx, tile, key_stride=bs), "two-pass")
    module = api.kernels(spec, "two-pass", q.device)
    host = module.device.copy_to_host
    delta = (do.float() * o.float()).sum(-1)     # [B, M, H]: the input of the delta-reading stages
    counts = compression._block_counts((seq,), (seq,), bs)
    arrays = dict(q=q, k=k_cmp, v=v_cmp, do=do, o=o, idx=idx, lse=lse, delta=delta, x=k, counts=counts, dy=k_cmp)
    if not api.dense_backward(spec):        # the two-pass's dk/dv pass reads the inverted lists
        arrays["entries"], arrays["piece_start"], arrays["piece_count"] = map(
            host, module.call("invert_block_indices", idx, k_cmp.shape[1]))
    files = {}
    for name, t in arrays.items():
        files[name] = where / f"{name}.npy"
        np.save(files[name], t.contiguous().numpy())
    return spec, files, {name: tuple(t.shape) for name, t in arrays.items()}


def _pooling_calls(files, shapes, seq, dtype):
    f = {name: f"--input=@{path}" for name, path in files.items()}
    return {"pooling": [("block_means", [f["x"], f["counts"], f"--input={_shape(shapes['dy'], dtype)}"]),
                        ("block_means_grad", [f["dy"], f["counts"], f"--input={seq}",
                                              f"--input={_shape(shapes['x'], dtype)}"])]}


def _shape(shape, dtype="f32"):
    return "x".join(str(s) for s in shape) + "x" + dtype


def _calls(files, shapes, scale, seq, dtype, dense_backward=False):
    """The functions each variant's module is profiled with, and their inputs; dense_backward: the two-pass module
    is the dense backward's (api.dense_backward: one call, delta made inside, for dq, dk and dv)."""
    f = {name: f"--input=@{path}" for name, path in files.items()}
    zeros = lambda name, typ=dtype: f"--input={_shape(shapes[name], typ)}"   # noqa: E731 - output buffers
    backward = [f["q"], f["k"], f["v"], f["idx"], f["lse"], f["delta"], f["do"], f"--input={scale}", zeros("q"),
                zeros("k"), zeros("v")]
    if dense_backward:
        two_pass = [("selection_attention_backward", [*backward[:5], f["o"], *backward[6:]])]
    else:
        two_pass = [("selection_attention_delta", [f["o"], f["do"]]),
                    ("selection_attention_dq", [f["q"], f["k"], f["v"], f["idx"], f["lse"], f["delta"], f["do"],
                                                f"--input={scale}", zeros("q")]),
                    ("invert_block_indices", [f["idx"], f"--input={seq}"]),
                    ("selection_attention_dkdv", [f["q"], f["k"], f["v"], f["idx"], f["lse"], f["delta"], f["do"],
                                                  f["entries"], f["piece_start"], f["piece_count"],
                                                  f"--input={scale}", zeros("k"), zeros("v")])]
    return {
        "forward": [("selection_attention_fwd",
                     [f["q"], f["k"], f["v"], f["idx"], f"--input={scale}", zeros("o"),
                      f"--input={_shape(shapes['lse'], 'f32')}"])],
        "two-pass": two_pass,
        "one-pass": [("selection_attention_onepass", backward)],
    }


def profile_function(vmfb: Path, function: str, inputs, repeats: int, where: Path):
    """[(dispatch name, median ms per call, calls)] of one function, from a host-execution profile."""
    bundle = where / f"{function}.ireeprof"
    run = subprocess.run([_tool("iree-benchmark-module"), f"--module={vmfb}", "--device=local-task",
                          f"--function={function}", *inputs, f"--benchmark_repetitions={repeats}",
                          "--device_profiling_mode=host-execution", f"--device_profiling_output={bundle}"],
                         capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"iree-benchmark-module {function} failed:\n{run.stderr[-2000:]}")
    walls = [float(m.group(1)) for m in re.finditer(r"real_time\s+([0-9.]+) ms", run.stdout)]
    out = subprocess.run([_tool("iree-profile"), "dispatch", "--format=jsonl", "--dispatch_events", str(bundle)],
                         capture_output=True, text=True, check=True).stdout
    per_call = {}   # dispatch -> submission (one call of the function) -> ms
    for line in out.splitlines():
        event = json.loads(line)
        if event.get("type") != "host_dispatch_event" or not event.get("valid", True):
            continue
        calls = per_call.setdefault(event["key"], {})
        calls[event["submission_id"]] = calls.get(event["submission_id"], 0.0) + event["duration_ns"] / 1e6
    per_dispatch = {key: {"ms": statistics.median(calls.values()), "calls": len(calls)}
                    for key, calls in per_call.items()}
    return walls, per_dispatch


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=CONFIGS, default="cpu")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--branch", choices=("selection", "compression"), default="selection")
    parser.add_argument("--variant", nargs="+", default=None,
                        help="default: forward two-pass one-pass (selection), forward two-pass pooling (compression)")
    parser.add_argument("--out", required=True, help="path stem: writes STEM.md and STEM.json")
    args = parser.parse_args(argv)
    cfg = CONFIGS[args.config]
    variants = args.variant or (["forward", "two-pass", "pooling"] if args.branch == "compression"
                                else ["forward", "two-pass", "one-pass"])
    record = {"config": {"name": args.config, **cfg}, "branch": args.branch, "seq": args.seq,
              "load": os.getloadavg(),
              "threads": os.environ.get("NSA_IREE_CPU_THREADS", "default"), "functions": {}}
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        if args.branch == "compression":
            spec, files, shapes = _compression_inputs(cfg, args.seq, where)
            record["tile"], record["slots"] = spec.block_size, spec.num_blocks
            calls = {**_calls(files, shapes, cfg["head_dim"] ** -0.5, shapes["k"][1], cfg["dtype"],
                              api.dense_backward(spec)),
                     **_pooling_calls(files, shapes, args.seq, cfg["dtype"])}
        else:
            spec, files, shapes = _inputs(cfg, args.seq, where)
            calls = _calls(files, shapes, cfg["head_dim"] ** -0.5, args.seq, cfg["dtype"])
        for variant in variants:
            vmfb = _compile(spec, variant, where)
            for function, inputs in calls[variant]:
                walls, dispatches = profile_function(vmfb, function, inputs, args.repeats, where)
                record["functions"][f"{variant} {function}"] = {
                    "wall_ms": statistics.median(walls) if walls else None,
                    "dispatches": dispatches}
                print(f"{variant} {function}: {record['functions'][f'{variant} {function}']['wall_ms']} ms", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(record, indent=1))
    Path(args.out + ".md").write_text(markdown(record))
    print(markdown(record))


def markdown(record) -> str:
    cfg = record["config"]
    problem = ("the compression branch (compressed attention, key stride BS)" if record.get("branch") == "compression"
               else "realistic selection")
    lines = [f"# Per-dispatch CPU profile: {cfg['name']} layout, M=N={record['seq']}, {problem}", "",
             f"H={cfg['heads']} G={cfg['kv_heads']} D={cfg['head_dim']} Dv={cfg['value_dim']} BS={cfg['block_size']} "
             + (f"(tiles of {record['tile']} compressed keys, T={record['slots']}) " if "tile" in record
                else f"T={cfg['num_blocks']} ") + f"{cfg['dtype']}; "
             "iree-benchmark-module with host-execution profiling; "
             f"threads: {record['threads']}; load average at start: "
             + ", ".join(f"{x:.2f}" for x in record["load"]), "",
             "| function | wall ms (median) | dispatch | ms per call |", "|---|---|---|---|"]
    for function, entry in record["functions"].items():
        wall = f"{entry['wall_ms']:.1f}" if entry["wall_ms"] is not None else "-"
        for i, (name, d) in enumerate(sorted(entry["dispatches"].items(), key=lambda kv: -kv[1]["ms"])):
            lines.append(f"| {function if i == 0 else ''} | {wall if i == 0 else ''} | {name} | {d['ms']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
