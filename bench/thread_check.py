"""GPU check (no timing): the operators from threads that have no CUDA context of their own. torch runs a GPU
backward on a thread of its own (one per device), where the backward's modules are loaded on first use; a thread
the user starts has no current context either until torch touches the GPU there. Each case runs in a fresh
process, so that every module is loaded there for the first time:

  1. a step through autograd (the forward's module loaded on the main thread, the backward's on autograd's);
  2. the same step on a new threading.Thread (forward and backward: modules loaded, calls made there);
  3. the step on the main thread once more.

Each must finish, its outputs and gradients finite and bitwise equal across the three (the backward is
deterministic). Nothing of the inputs is poisoned: a torch fill on the thread would make the context current
and hide what the check looks for.

    python3 -m bench.thread_check --compile      (here: the cuda modules into $NSA_IREE_CACHE_DIR)
    python3 -m bench.thread_check                (on the GPU; one JSON row per case, exit status 1 on a failure)
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import torch

# name: the operator; every case H 32 over G 2, D 64, bf16, N 1024 (the block size 64)
CASES = ("selection", "compression", "window")
HEADS, KV_HEADS, DIM, N, BLOCK_SIZE, SLOTS, WINDOW = 32, 2, 64, 1024, 64, 4, 128


def _inputs(device):
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(1, N, h, DIM, device=device, generator=gen).to(torch.bfloat16)
                   for h in (HEADS, KV_HEADS, KV_HEADS, HEADS))
    # every row's own block and the SLOTS - 1 before it (-1 where there is none)
    own = torch.arange(N, device=device) // BLOCK_SIZE
    idx = (own[:, None] - torch.arange(SLOTS, device=device)).clamp(min=-1).to(torch.int32)
    return q, k, v, do, idx.view(1, N, 1, SLOTS).expand(1, N, KV_HEADS, SLOTS).contiguous()


def _attention(case):
    import nsa_iree

    if case == "selection":
        return lambda q, k, v, idx: nsa_iree.selection_attention(q, k, v, idx, BLOCK_SIZE)
    if case == "compression":
        return lambda q, k, v, idx: nsa_iree.compressed_attention(
            q, nsa_iree.mean_pooling(k, BLOCK_SIZE), nsa_iree.mean_pooling(v, BLOCK_SIZE), BLOCK_SIZE)[0]
    return lambda q, k, v, idx: nsa_iree.sliding_window_attention(q, k, v, WINDOW)


def _step(case, inputs):
    q, k, v, do, idx = inputs
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o = _attention(case)(*leaves, idx)
    o.backward(do)
    torch.cuda.synchronize()
    return [o.detach(), *(t.grad for t in leaves)]


def run_case(case) -> dict:
    """The three steps of the module docstring in this process (which must not have loaded any module yet)."""
    inputs = _inputs(torch.device("cuda"))
    results, errors = {}, {}

    def attempt(name):
        try:
            results[name] = _step(case, inputs)
        except Exception as err:  # noqa: BLE001 - reported in the row
            errors[name] = f"{type(err).__name__}: {err}"[:400]

    attempt("autograd_thread")
    worker = threading.Thread(target=attempt, args=("new_thread",))
    worker.start()
    worker.join()
    attempt("main_thread_again")
    row = {"check": case, "errors": errors}
    if not errors:
        first = results["autograd_thread"]
        row["finite"] = all(bool(torch.isfinite(t.float()).all()) for t in first)
        row["bitwise_equal"] = all(torch.equal(a, b) for other in ("new_thread", "main_thread_again")
                                   for a, b in zip(first, results[other], strict=True))
    row["ok"] = not errors and row["finite"] and row["bitwise_equal"]
    return row


def specs():
    """(KernelSpec, variant) of every cuda module the cases load."""
    from nsa_iree import compression, window
    from nsa_iree.spec import KernelSpec

    base = dict(heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM, value_dim=DIM, dtype="bf16", target="cuda")
    keys = -(-N // BLOCK_SIZE)
    for spec in (KernelSpec(**base, block_size=BLOCK_SIZE, num_blocks=SLOTS),
                 KernelSpec(**base, block_size=compression.DEFAULT_TILE, key_stride=BLOCK_SIZE,
                            num_blocks=compression.tile_slots(keys, compression.DEFAULT_TILE)),
                 KernelSpec(**base, block_size=window.WINDOW_BLOCK, num_blocks=window.window_slots(WINDOW),
                            window=WINDOW)):
        for variant in ("forward", "two-pass"):
            yield spec, variant


def main(argv) -> int:
    if "--compile" in argv:
        from nsa_iree.compiler import compile_loaded

        for spec, variant in specs():
            print(compile_loaded(spec, variant)[0].path.name, flush=True)
        return 0
    if argv[:1] == ["--case"]:
        print(json.dumps(run_case(argv[1])), flush=True)
        return 0
    failed = 0
    for case in CASES:       # each in a process of its own: no module loaded before
        done = subprocess.run([sys.executable, "-m", "bench.thread_check", "--case", case], capture_output=True,
                              text=True, timeout=300)
        lines = [line for line in done.stdout.splitlines() if line.startswith('{"check"')]
        row = json.loads(lines[-1]) if lines else {"check": case, "ok": False,
                                                   "errors": {"process": done.stderr[-600:]}}
        failed += not row["ok"]
        print(json.dumps(row), flush=True)
    print(json.dumps({"checks": len(CASES), "failed": failed}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
