"""How many selected blocks the NVIDIA forward and dq kernels keep in flight (the cuda recipe's `dq_stages`: K/V
buffers in workgroup memory, cp.async groups outstanding) and how many of their workgroups share a multiprocessor
(`register_cap`), per layout, on an H100 or H200: each variant's modules against f64 (outputs poisoned, bitwise
repeat) and timed in one process with fla's forward.

    python -m bench.pipeline_depth compile          # here (iree-compile): every variant's recipe and modules
    python3 -m bench.pipeline_depth check           # on the GPU: o, lse and dq of every variant against f64
    python3 -m bench.pipeline_depth time [SEQ]      # on the GPU: the forward and dq of every variant, fla's forward
    python3 -m bench.pipeline_depth sanitize [M [VARIANT]]  # under compute-sanitizer: a variant's forward and dq
                                                    # of the D 64 layouts (B 2, bad slots; default: the recipe)

A variant's recipe is the package's cuda and hopper recipes with `dq_stages` or a register cap edited, written under
the cache directory ($NSA_IREE_CACHE_DIR/recipes/VARIANT, carried with it) and chosen per module through
NSA_IREE_PIPELINES_DIR.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import torch

from nsa_iree.benchmark import CONFIGS
from nsa_iree.cache import cache_dir
from nsa_iree.compiler import compile_artifact
from nsa_iree.recipes import PIPELINES_DIR
from nsa_iree.spec import KernelSpec

from .hopper_checks import _dq, _error, _forward, _median_ms
from .kernel_checks import _problem

SMALL_DIMS_CAP = "register_cap_small_dims = { forward = 128, dq = 128 }"
# variant -> edits of the package's cuda recipe ((old, new) text, each found once); "recipe" is the package's own.
VARIANTS = {
    "recipe": [],
    "stages3": [("[kernels]\n", "[kernels]\ndq_stages = 3\n")],
    "small_dims_168": [(SMALL_DIMS_CAP, SMALL_DIMS_CAP.replace("128", "168"))],
    "small_dims_96": [(SMALL_DIMS_CAP, SMALL_DIMS_CAP.replace("128", "96"))],
}
LAYOUTS = {name: CONFIGS[name] for name in ("fla-default", "fla-d64-g1", "anchors")}
CHECKS = [  # (layout, B, M, N, selection, bad slots)
    ("fla-default", 2, 700, 1000, "realistic", True),
    ("fla-d64-g1", 1, 1000, 1000, "uniform", False),
    ("anchors", 1, 777, 777, "realistic rising", True),
]


def _recipe_dir(variant: str) -> Path:
    return cache_dir() / "recipes" / variant


def _write_recipes(variant: str) -> None:
    directory = _recipe_dir(variant)
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("cuda", "hopper"):
        text = (PIPELINES_DIR / f"{name}.toml").read_text()
        for old, new in VARIANTS[variant] if name == "cuda" else ():
            if text.count(old) != 1:
                raise SystemExit(f"pipelines/cuda.toml: {old!r} not found once")
            text = text.replace(old, new)
        (directory / f"{name}.toml").write_text(text)


@contextlib.contextmanager
def _recipes(variant: str):
    before = os.environ.get("NSA_IREE_PIPELINES_DIR")
    os.environ["NSA_IREE_PIPELINES_DIR"] = str(_recipe_dir(variant))
    try:
        yield
    finally:
        if before is None:
            del os.environ["NSA_IREE_PIPELINES_DIR"]
        else:
            os.environ["NSA_IREE_PIPELINES_DIR"] = before


def _artifact(layout: str, variant: str, module: str):
    with _recipes(variant):
        return compile_artifact(KernelSpec(target="hopper", **LAYOUTS[layout]), module)


def compile_all() -> None:
    for variant in VARIANTS:
        _write_recipes(variant)
        for layout in LAYOUTS:
            for module in ("forward", "two-pass"):
                print(variant, layout, module, _artifact(layout, variant, module).path.name, flush=True)


def _modules(layout: str, variant: str):
    from nsa_iree.runtime import device_for
    device = device_for(torch.device("cuda"))
    return tuple(device.module(_artifact(layout, variant, m).path) for m in ("forward", "two-pass"))


def check(seed: int = 0) -> None:
    """o, lse and dq (from the oracle's o and lse) of every variant against f64, outputs poisoned; twice, bitwise."""
    from nsa_iree.reference import selection_attention_backward_reference, selection_attention_reference

    for i, (layout, *problem) in enumerate(CHECKS):
        cfg = LAYOUTS[layout]
        q, k, v, do, idx = _problem(cfg, *problem, seed + i)
        o_ref, lse_ref = selection_attention_reference(q.cpu(), k.cpu(), v.cpu(), idx.cpu(), cfg["block_size"])
        _, dq_ref, _, _ = selection_attention_backward_reference(
            q.cpu(), k.cpu(), v.cpu(), o_ref.to(q.dtype), lse_ref.float(), do.cpu(), idx.cpu(), cfg["block_size"])
        o_in, lse_in = o_ref.to(q.dtype).cuda(), lse_ref.float().cuda()
        for variant in VARIANTS:
            forward, two_pass = _modules(layout, variant)
            (delta,) = two_pass.call("selection_attention_delta", o_in, do)
            runs = [(*_forward(forward, q, k, v, idx), _dq(two_pass, q, k, v, idx, lse_in, delta, do))
                    for _ in range(2)]
            torch.cuda.synchronize()
            o, lse, dq = runs[0]
            print(json.dumps({"layout": layout, "variant": variant, "o": _error(o.cpu(), o_ref),
                              "lse": _error(lse.cpu(), lse_ref), "dq": _error(dq.cpu(), dq_ref),
                              "bitwise": all(torch.equal(a, b) for a, b in zip(*runs))}), flush=True)


def time(seq: int = 65536, repeats: int = 10) -> None:
    """The forward and dq of every variant and fla's forward at seq tokens (B 1), realistic and uniform selections,
    alternating, twice; one process."""
    from nsa_iree.benchmark import fla_impl

    for layout, cfg in LAYOUTS.items():
        modules = {variant: _modules(layout, variant) for variant in VARIANTS}
        for selection in ("realistic", "uniform"):
            q, k, v, do, idx = _problem(cfg, 1, seq, seq, selection, False, 0)
            o, lse = _forward(modules["recipe"][0], q, k, v, idx)
            (delta,) = modules["recipe"][1].call("selection_attention_delta", o, do)
            runs = {}
            for variant, (forward, two_pass) in modules.items():
                runs[f"fwd_{variant}"] = lambda m=forward: _forward(m, q, k, v, idx)
                runs[f"dq_{variant}"] = lambda m=two_pass: _dq(m, q, k, v, idx, lse, delta, do)
            runs["fla_fwd"], _ = fla_impl(cfg, q, k, v, do, idx)
            for _ in range(2):
                row = {"layout": layout, "seq": seq, "selection": selection}
                row.update({f"{name}_ms": _median_ms(run, repeats) for name, run in runs.items()})
                print(json.dumps(row), flush=True)


def sanitize(m: int = 300, variant: str = "recipe") -> None:
    """A variant's forward and dq of the D = 64 layouts on small problems (B 2, M < N, bad slots)."""
    for layout in ("fla-default", "fla-d64-g1"):
        q, k, v, do, idx = _problem(LAYOUTS[layout], 2, m, m + 100, "realistic", True, 0)
        forward, two_pass = _modules(layout, variant)
        o, lse = _forward(forward, q, k, v, idx)
        (delta,) = two_pass.call("selection_attention_delta", o, do)
        dq = _dq(two_pass, q, k, v, idx, lse, delta, do)
        torch.cuda.synchronize()
        finite = all(bool(torch.isfinite(x).all()) for x in (o, dq))
        print(json.dumps({"layout": layout, "variant": variant, "m": m, "finite": finite}), flush=True)


if __name__ == "__main__":
    what, args = sys.argv[1], [int(a) if a.isdigit() else a for a in sys.argv[2:]]
    {"compile": compile_all, "check": check, "time": time, "sanitize": sanitize}[what](*args)
