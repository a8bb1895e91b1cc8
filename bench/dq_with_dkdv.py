"""The small groups' backward on the hopper target, variant against variant in one process: the two-pass module's
one call where dk/dv makes dq (selection_attention_backward: delta, the inversion, dk/dv with dq; kernels.SMALL) or,
for a module without it, the inversion, dk/dv and the position-major dq, per layout at 64k tokens, realistic and
uniform selections.

    python -m bench.dq_with_dkdv compile LABEL [--unfused]  # here: the two-pass modules of LAYOUTS from this checkout
                                                       # (--unfused: the hopper recipe without dkdv_dq), recorded
                                                       # as LABEL in $NSA_IREE_CACHE_DIR/dq_with_dkdv.json
    python3 -m bench.dq_with_dkdv time [SEQ]           # on the GPU: every label's modules, alternating

A label's modules are loaded from their files, so variants from other checkouts (compiled there into the same cache
directory under their own label) time side by side.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from nsa_iree.benchmark import CONFIGS
from nsa_iree.cache import cache_dir
from nsa_iree.compiler import compile_artifact
from nsa_iree.recipes import PIPELINES_DIR
from nsa_iree.runtime import device_for
from nsa_iree.spec import KernelSpec

from .hopper_checks import _dkdv, _dkdv_dq, _dq, _median_ms
from .kernel_checks import _problem

LAYOUTS = ("hpg8", "hpg4", "hpg2", "hpg1")


def _manifest() -> Path:
    return cache_dir() / "dq_with_dkdv.json"


def compile_label(label: str, unfused: bool = False) -> None:
    manifest = json.loads(_manifest().read_text()) if _manifest().exists() else {}
    with tempfile.TemporaryDirectory() as recipes:
        if unfused:
            for name in ("cuda", "hopper"):
                text = (PIPELINES_DIR / f"{name}.toml").read_text()
                if name == "hopper":
                    text = "\n".join(line for line in text.splitlines() if not line.startswith("dkdv_dq ="))
                (Path(recipes) / f"{name}.toml").write_text(text)
            os.environ["NSA_IREE_PIPELINES_DIR"] = recipes
        modules = {}
        for layout in LAYOUTS:
            path = compile_artifact(KernelSpec(target="hopper", **CONFIGS[layout]), "two-pass").path
            modules[layout] = {"path": path.name, "fused": not unfused}
        os.environ.pop("NSA_IREE_PIPELINES_DIR", None)
    manifest[label] = modules
    _manifest().write_text(json.dumps(manifest, indent=1))
    print(json.dumps({label: modules}))


def time(seq: int = 65536, repeats: int = 10) -> None:
    manifest = json.loads(_manifest().read_text())
    device = device_for(torch.device("cuda"))
    for layout in LAYOUTS:
        cfg = CONFIGS[layout]
        modules = {label: (device.module(cache_dir() / m[layout]["path"]), m[layout]["fused"])
                   for label, m in manifest.items()}
        for selection in ("realistic", "uniform"):
            q, k, v, do, idx = _problem(cfg, 1, seq, seq, selection, False, 0)
            lse = torch.randn(1, cfg["heads"], seq, device="cuda").abs() + 4.0
            delta = torch.randn(1, seq, cfg["heads"], device="cuda")
            args = (q, k, v, idx, lse, delta, do)
            runs = {}
            for label, (module, fused) in modules.items():
                if fused:
                    runs[label] = lambda m=module, a=(q, k, v, idx, lse, do, do): _dkdv_dq(m, *a)   # (do as o)
                else:
                    runs[label] = lambda m=module, a=args: (_dkdv(m, *a), _dq(m, *a))
            for _ in range(2):
                row = {"seq": seq, "layout": layout, "selection": selection}
                row.update({f"{label}_ms": _median_ms(run, repeats) for label, run in runs.items()})
                print(json.dumps(row), flush=True)
            del q, k, v, do, idx, lse, delta, args, runs      # (free the GPU memory before the next layout)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    if sys.argv[1] == "compile":
        compile_label(sys.argv[2], "--unfused" in sys.argv[3:])
    else:
        time(*(int(a) for a in sys.argv[2:]))
