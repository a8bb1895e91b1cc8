"""Compiled modules side by side on the GPU, loaded from their files (so modules of other checkouts, compiled there,
time beside this one's), in one process at 64k tokens, realistic and uniform selections: each module's call timed in
turn (CUDA-event median of 10 calls after 2), twice per selection. CONFIG names a layout of nsa_iree.benchmark.CONFIGS
(its spec on the hopper target gives the block lists' buffers of a module over the pieces).

    python3 -m bench.ab_modules forward CONFIG A.vmfb B.vmfb ...
        selection_attention_fwd of each; bitwise_equal_first: o and lse equal to the first module's, bit for bit
    python3 -m bench.ab_modules backward CONFIG FORWARD.vmfb A.vmfb B.vmfb ...
        selection_attention_backward of each (two-pass modules), after FORWARD's o and lse; dq, dk, dv against the
        first's
    python3 -m bench.ab_modules lists CONFIG FORWARD.vmfb PIECES.vmfb TWO_PASS.vmfb
        a forward against a forward over the block lists' pieces (compiled with that layout's forward over the pieces)
        and TWO_PASS's backward two ways: inverting the lists itself, and taking those PIECES wrote
        (backward_lists_bitwise: the two equal)

Each timed call allocates and poisons its outputs (NaN) inside the timed span, as bench.hopper_checks' calls do: the
columns compare; a column is not a module's bare time. Modules run in command-line order each round. Modules over the
pieces get the block lists' buffers of api._list_buffers (whatever the recipe's forward for CONFIG: the lists mode
times a pieces forward the recipe does not choose). A column is named by the file's folder, its position on the
command line and the first six characters of the cache key that ends its name.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch

from nsa_iree import api
from nsa_iree.benchmark import CONFIGS
from nsa_iree.runtime import device_for
from nsa_iree.spec import KernelSpec

from .hopper_checks import _dkdv_dq as _backward
from .hopper_checks import _forward, _median_ms
from .kernel_checks import _problem

SEQ = 65536


MODES = ("forward", "backward", "lists")


def _name(position: int, path: str) -> str:
    p = Path(path)
    return f"{p.parent.name}/{position}/{p.stem.rsplit('_', 1)[-1][:6]}"


def _takes_lists(module) -> bool:
    """Whether a forward module writes the block lists: the forward over the pieces, which inverts them itself."""
    return module.vm_module.lookup_function("invert_block_indices") is not None


def _rows(label: str, config: str, selection: str, runs: dict, extra: dict) -> None:
    for _ in range(2):
        row = {"mode": label, "config": config, "seq": SEQ, "selection": selection, **extra}
        row.update({name: _median_ms(run, 10) for name, run in runs.items()})
        print(json.dumps(row), flush=True)


def main(mode: str, config: str, paths: list[str]) -> None:
    if mode not in MODES:
        raise SystemExit(f"bench.ab_modules: mode {mode!r} is not one of {', '.join(MODES)}")
    if mode == "lists" and len(paths) != 3:
        raise SystemExit("bench.ab_modules lists: FORWARD.vmfb PIECES.vmfb TWO_PASS.vmfb")
    cfg = CONFIGS[config]
    spec = KernelSpec(target="hopper", **cfg)
    device = device_for(torch.device("cuda"))
    modules = {_name(i, p): device.module(p) for i, p in enumerate(paths)}
    for selection in ("realistic", "uniform"):
        q, k, v, do, idx = _problem(cfg, 1, SEQ, SEQ, selection, False, 0)
        lists = api._list_buffers(spec, idx, SEQ)
        if mode == "forward":
            runs = {name: functools.partial(_forward, m, q, k, v, idx, lists if _takes_lists(m) else None)
                    for name, m in modules.items()}
        elif mode == "backward":
            (forward, *backwards) = modules.values()
            o, lse = _forward(forward, q, k, v, idx, lists if _takes_lists(forward) else None)
            runs = {name: functools.partial(_backward, m, q, k, v, idx, lse, o, do)
                    for name, m in list(modules.items())[1:]}
        else:
            forward, pieces, two_pass = modules.values()
            o, lse = _forward(forward, q, k, v, idx, lists if _takes_lists(forward) else None)
            o_p, lse_p = _forward(pieces, q, k, v, idx, lists)
            diff = {"o_max_abs_diff": (o.float() - o_p.float()).abs().max().item(),
                    "lse_max_abs_diff": (lse - lse_p).abs().max().item()}
            same = all(torch.equal(a, b) for a, b in zip(_backward(two_pass, q, k, v, idx, lse_p, o_p, do),
                                                          _backward(two_pass, q, k, v, idx, lse_p, o_p, do, lists)))
            names = list(modules)
            runs = {f"forward {names[0]}": functools.partial(_forward, forward, q, k, v, idx,
                                                             lists if _takes_lists(forward) else None),
                    f"forward {names[1]}": functools.partial(_forward, pieces, q, k, v, idx, lists),
                    "backward inverting": functools.partial(_backward, two_pass, q, k, v, idx, lse_p, o_p, do),
                    "backward with the lists": functools.partial(_backward, two_pass, q, k, v, idx, lse_p, o_p, do,
                                                                 lists)}
            _rows(mode, config, selection, runs, {**diff, "backward_lists_bitwise": same})
            continue
        outputs = {name: run() for name, run in runs.items()}
        first = next(iter(outputs.values()))
        same = {name: all(torch.equal(a, b) for a, b in zip(out, first)) for name, out in outputs.items()}
        _rows(mode, config, selection, runs, {"bitwise_equal_first": same})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
