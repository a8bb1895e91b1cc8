"""The hopper target's wgmma kernels against the NVIDIA (mma.sync) kernels and the f64 oracle, on an H100 or H200.

    python -m bench.hopper_checks compile      # here (iree-compile): every module the steps below load, into the cache
    python3 -m bench.hopper_checks check       # on the GPU: o and lse of every case against f64, outputs poisoned
    python3 -m bench.hopper_checks check_bwd   # on the GPU: dq, dk, dv of every case against f64, outputs poisoned
    python3 -m bench.hopper_checks time [SEQ]  # on the GPU: the two forwards at SEQ tokens (default 65536), alternating
    python3 -m bench.hopper_checks time_bwd [SEQ]  # on the GPU: the two targets' whole backward at SEQ tokens
    python3 -m bench.hopper_checks sanitize M  # under compute-sanitizer: the window, wide forward and selection
                                               # backward kernels on small problems
    python3 -m bench.hopper_checks check_wide  # on the GPU: the 64-heads-per-group forward against NVIDIA's and f64
    python3 -m bench.hopper_checks time_wide [SEQ]  # on the GPU: that forward, NVIDIA's wide kernel and fla's
    python3 -m bench.hopper_checks check_two_pass  # on the GPU: the selection's dq and dk/dv (every group size;
                                               # dq on wgmma at 64) against NVIDIA's, the linalg stages and f64,
                                               # outputs poisoned, bitwise
    python3 -m bench.hopper_checks time_two_pass [SEQ]  # on the GPU: those dq and dk/dv and NVIDIA's, per group size
    python3 -m bench.hopper_checks check_pieces  # on the GPU: the small groups' forward over the block lists' pieces
                                               # against NVIDIA's, the linalg stages and f64, outputs poisoned, bitwise
    python3 -m bench.hopper_checks time_pieces [SEQ]  # on the GPU: that forward and NVIDIA's, per group size

The modules are loaded directly (KernelSpec with target "cuda" or "hopper"), so both run in one process whatever
nsa_iree.api would pick. bench/run_hopper_h200.sh runs the GPU steps through the device tool;
bench/results/hopper_dense_forward_H200_2026-12-03/ holds the first run.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys

import torch

from nsa_iree import api, window
from nsa_iree.compiler import compile_artifact
from nsa_iree.benchmark import CONFIGS
from nsa_iree.kernels import choose
from nsa_iree.recipes import load_recipe
from nsa_iree.runtime import device_for
from nsa_iree.spec import KernelSpec

from .kernel_checks import _cfg, _problem

WINDOW = 512
# name: (heads per group, D, Dv, dtype); 4 kv heads
CASES = {"bf16": (16, 128, 128, "bf16"), "f16": (16, 128, 128, "f16"), "hpg4_dv64": (4, 128, 64, "bf16"),
         "d64": (16, 64, 64, "bf16")}
SHAPES = ((1, 1000, 1000), (2, 700, 1300), (1, 77, 77))      # (B, M, N): M < N, B = 2, fewer rows than a tile


def spec(target: str, case: str) -> KernelSpec:
    hpg, d, dv, dtype = CASES[case]
    return KernelSpec(target=target, heads=4 * hpg, kv_heads=4, head_dim=d, value_dim=dv,
                      block_size=window.WINDOW_BLOCK, num_blocks=window.window_slots(WINDOW), dtype=dtype,
                      window=WINDOW)


def compile_all() -> None:
    for case in CASES:
        for target in ("cuda", "hopper"):
            for variant in ("forward", "two-pass"):
                print(compile_artifact(spec(target, case), variant).path.name, flush=True)
    for _, cfg, *_ in WIDE_CASES:
        for target, kernels in (("cuda", "auto"), ("hopper", "auto"), ("cuda", "linalg")):
            print(compile_artifact(KernelSpec(target=target, kernels=kernels, **cfg), "forward").path.name, flush=True)
    for cfg in WIDE_TIMED.values():
        for target in ("cuda", "hopper"):
            print(compile_artifact(KernelSpec(target=target, **cfg), "forward").path.name, flush=True)
    two_pass = [KernelSpec(target="hopper", **cfg) for _, cfg, *_ in TWO_PASS_CASES]
    two_pass += [KernelSpec(target="cuda", **cfg) for _, cfg, *_ in TWO_PASS_CASES
                 if cfg["heads"] // cfg["kv_heads"] <= 16]
    two_pass += [KernelSpec(target="cuda", kernels="linalg", **cfg) for _, cfg, *_ in TWO_PASS_CASES]
    two_pass += [KernelSpec(target=target, **dict(CONFIGS["anchors"], heads=heads, kv_heads=kv_heads))
                 for hpg, (heads, kv_heads) in TWO_PASS_LAYOUTS.items()
                 for target in (("hopper", "cuda") if hpg <= 16 else ("hopper",))]
    for spec_ in two_pass:
        print(compile_artifact(spec_, "two-pass").path.name, flush=True)
    for _, cfg, *_ in PIECE_CASES:
        for target, kernels in (("hopper", "auto"), ("cuda", "auto"), ("cuda", "linalg")):
            print(compile_artifact(KernelSpec(target=target, kernels=kernels, **cfg), "forward").path.name, flush=True)
        print(compile_artifact(KernelSpec(target="hopper", **cfg), "two-pass").path.name, flush=True)  # (its lists)
    for hpg, (heads, kv_heads) in TWO_PASS_LAYOUTS.items():
        for target in ("hopper", "cuda") if hpg < 16 else ():
            cfg = dict(CONFIGS["anchors"], heads=heads, kv_heads=kv_heads)
            print(compile_artifact(KernelSpec(target=target, **cfg), "forward").path.name, flush=True)


def _load(spec_: KernelSpec, variant: str):
    """The module of (spec_, variant) on the GPU, from the cache (compile_all)."""
    return device_for(torch.device("cuda")).module(compile_artifact(spec_, variant).path)


def _module(target: str, case: str, variant: str = "forward"):
    return _load(spec(target, case), variant)


def _inputs(case: str, b: int, m: int, n: int, gen):
    hpg, d, dv, dtype = CASES[case]
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    q = torch.randn(b, m, 4 * hpg, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(b, n, 4, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(b, n, 4, dv, device="cuda", generator=gen).to(dtype)
    idx = torch.zeros(b, m, 4, window.window_slots(WINDOW), dtype=torch.int32, device="cuda")   # (not read)
    return q, k, v, idx


def _forward(module, q, k, v, idx, lists=None):
    """o and lse of a forward module, poisoned first; `lists`: the buffers a forward over the pieces writes its block
    lists into (_list_buffers)."""
    o = torch.full((*q.shape[:3], v.shape[3]), float("nan"), dtype=q.dtype, device="cuda")
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), dtype=torch.float32, device="cuda")
    module.call("selection_attention_fwd", q, k, v, idx, q.shape[3] ** -0.5, o, lse, *(lists or ()))
    return o, lse


def _list_buffers(spec_: KernelSpec, idx, n: int):
    """Where spec_'s forward runs over the pieces (api.forward_over_pieces), buffers for the block lists it writes,
    poisoned (-7); else None."""
    if not api.forward_over_pieces(spec_):
        return None
    return [x.fill_(-7) for x in api._list_buffers(spec_, idx, n)]


def _backward(target, case, q, k, v, o, lse, do, idx):
    """dq, dk, dv of the two-pass module of (target, case), every output poisoned first: one call where its
    backward is one function (api.dense_backward; hopper's window), else its stages one by one (delta, the block
    lists' inversion, dk/dv, dq)."""
    module = _module(target, case, "two-pass")
    if api.dense_backward(spec(target, case)):
        dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
        module.call("selection_attention_backward", q, k, v, idx, lse, o, do, q.shape[3] ** -0.5, dq, dk, dv)
        return dq, dk, dv
    (delta,) = module.call("selection_attention_delta", o, do)
    dk, dv = _dkdv(module, q, k, v, idx, lse, delta, do)
    return _dq(module, q, k, v, idx, lse, delta, do), dk, dv


def _error(x, ref) -> float:
    """Relative RMS error over the reference's finite elements; inf where x is not finite exactly there."""
    x, ref = x.double(), ref.double()
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(x), finite):
        return float("inf")
    return ((x[finite] - ref[finite]).norm() / ref[finite].norm().clamp_min(1e-30)).item()


def check(seed: int = 0) -> None:
    from nsa_iree.reference import sliding_window_attention_reference

    gen = torch.Generator(device="cuda").manual_seed(seed)
    for case in CASES:
        modules = {target: _module(target, case) for target in ("cuda", "hopper")}
        for b, m, n in SHAPES:
            q, k, v, idx = _inputs(case, b, m, n, gen)
            o_ref, lse_ref = sliding_window_attention_reference(q, k, v, WINDOW)
            row = {"case": case, "b": b, "m": m, "n": n}
            for target, module in modules.items():
                o, lse = _forward(module, q, k, v, idx)
                torch.cuda.synchronize()
                row[f"{target}_o"], row[f"{target}_lse"] = _error(o, o_ref), _error(lse, lse_ref)
            print(json.dumps(row), flush=True)


def check_bwd(seed: int = 0) -> None:
    """dq, dk and dv of both targets against the f64 oracle's gradients (o and lse from the oracle)."""
    from nsa_iree.reference import sliding_window_attention_reference

    gen = torch.Generator(device="cuda").manual_seed(seed)
    for case in CASES:
        for b, m, n in SHAPES:
            q, k, v, _ = _inputs(case, b, m, n, gen)
            idx = window._band_indices(b, m, n, 4, WINDOW, q.device)
            do = torch.randn(b, m, q.shape[2], v.shape[3], device="cuda", generator=gen).to(q.dtype)
            leaves = [x.double().requires_grad_() for x in (q, k, v)]
            o_ref, lse_ref = sliding_window_attention_reference(*leaves, WINDOW)
            o_ref.backward(do.double())
            o, lse = o_ref.detach().to(q.dtype), lse_ref.detach().float()
            row = {"case": case, "b": b, "m": m, "n": n}
            for target in ("cuda", "hopper"):
                grads = _backward(target, case, q, k, v, o, lse, do, idx)
                torch.cuda.synchronize()
                for name, x, leaf in zip(("dq", "dk", "dv"), grads, leaves):
                    row[f"{target}_{name}"] = _error(x, leaf.grad)
            print(json.dumps(row), flush=True)


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times[2:]), 3)


def time_bwd(seq: int = 65536, repeats: int = 10) -> None:
    """Each target's whole backward at seq tokens, alternating: hopper's one call (delta, dk/dv, dq), NVIDIA's
    stages one by one (its block lists' inversion made once outside, as nsa_iree.api keeps the band's)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, _ = _inputs("bf16", 1, seq, seq, gen)
    idx = window._band_indices(1, seq, seq, 4, WINDOW, q.device)
    do = torch.randn(1, seq, q.shape[2], v.shape[3], device="cuda", generator=gen).to(q.dtype)
    o, lse = _forward(_module("cuda", "bf16"), q, k, v, idx)
    scale = q.shape[3] ** -0.5
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    hopper, cuda = _module("hopper", "bf16", "two-pass"), _module("cuda", "bf16", "two-pass")
    lists = cuda.call("invert_block_indices", idx, seq)

    def stages():
        (delta,) = cuda.call("selection_attention_delta", o, do)
        cuda.call("selection_attention_dkdv", q, k, v, idx, lse, delta, do, *lists, scale, dk, dv)
        cuda.call("selection_attention_dq", q, k, v, idx, lse, delta, do, scale, dq)

    runs = {"hopper": lambda: hopper.call("selection_attention_backward", q, k, v, idx, lse, o, do, scale, dq, dk, dv),
            "cuda": stages}
    for _ in range(2):
        for target, run in runs.items():
            print(json.dumps({"target": target, "seq": seq, "backward_ms": _median_ms(run, repeats)}), flush=True)


def time(seq: int = 65536, repeats: int = 10) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    modules = {target: _module(target, "bf16") for target in ("cuda", "hopper")}
    q, k, v, idx = _inputs("bf16", 1, seq, seq, gen)
    for _ in range(2):
        for target, module in modules.items():
            times = []
            for _ in range(repeats + 2):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                _forward(module, q, k, v, idx)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            print(json.dumps({"target": target, "seq": seq, "ms": round(statistics.median(times[2:]), 3)}),
                  flush=True)


# The wide forward (gpu/hopper/wide_forward.mlir: 64 heads per kv head), in bench.kernel_checks' case form (id,
# layout, B, M, N, selection, bad slots) and on its problems; against the NVIDIA wide kernel (target cuda) and the
# f64 oracle, outputs poisoned.
WIDE_CASES = [
    ("hpg64_b2_m_lt_n_bad", _cfg(64, 1, 128, 128, 64, 16), 2, 700, 1000, "realistic", True),
    ("hpg64_g2_rising_keys", _cfg(128, 2, 128, 128, 64, 16), 1, 1024, 1024, "realistic rising", False),
    ("hpg64_d64_f16_uniform", _cfg(64, 1, 64, 64, 64, 8, "f16"), 1, 777, 777, "uniform", True),
    ("hpg64_bs128_dv64", _cfg(64, 1, 128, 64, 128, 8), 1, 900, 900, "realistic", False),
    ("hpg64_d64_t1", _cfg(64, 1, 64, 64, 64, 1), 1, 300, 300, "uniform", False),
]


def _wide_module(target: str, cfg, kernels: str = "auto"):
    return _load(KernelSpec(target=target, kernels=kernels, **cfg), "forward")


def check_wide(seed: int = 0) -> None:
    """o and lse of the hopper wide forward, the NVIDIA wide kernel and the linalg stages (the oracle's GPU twin)
    against the f64 oracle, outputs poisoned; the hopper forward twice (bitwise equal)."""
    from nsa_iree.reference import selection_attention_reference

    for i, (name, cfg, *problem) in enumerate(WIDE_CASES):
        q, k, v, _, idx = _problem(cfg, *problem, seed + i)
        o_ref, lse_ref = selection_attention_reference(q, k, v, idx, cfg["block_size"])
        # (the kernel the hopper target runs: a shape its wide forward does not serve falls back to NVIDIA's)
        row = {"case": name, "hopper_kernel": choose("forward", KernelSpec(target="hopper", **cfg),
                                                     load_recipe("hopper")).family}
        for label, target, kernels in (("cuda", "cuda", "auto"), ("linalg", "cuda", "linalg"),
                                       ("hopper", "hopper", "auto")):
            module = _wide_module(target, cfg, kernels)
            o, lse = _forward(module, q, k, v, idx)
            torch.cuda.synchronize()
            row[f"{label}_o"], row[f"{label}_lse"] = _error(o, o_ref), _error(lse, lse_ref)
            if label == "hopper":
                again = _forward(module, q, k, v, idx)
                torch.cuda.synchronize()
                row["hopper_bitwise"] = torch.equal(o, again[0]) and torch.equal(lse, again[1])
        print(json.dumps(row), flush=True)


# the benchmark configs time_wide runs: 64 heads per group at the anchors' D and at D 64
WIDE_TIMED = {"hpg64": CONFIGS["hpg64"], "hpg64_d64": dict(CONFIGS["hpg64"], head_dim=64, value_dim=64)}


def time_wide(seq: int = 65536, repeats: int = 10) -> None:
    """The 64-heads-per-group forward (WIDE_TIMED: H 64, G 1, BS 64, T 16 at D 128 and 64) at seq tokens: hopper's
    wgmma kernel, the NVIDIA wide kernel and fla's selection forward (nsa_iree.benchmark.fla_impl, as bench.bench
    times it), alternating, realistic and uniform selections."""
    from nsa_iree.benchmark import fla_impl

    for config in WIDE_TIMED:
        _time_wide(config, seq, repeats, fla_impl)


def _time_wide(config, seq, repeats, fla_impl):
    cfg = WIDE_TIMED[config]
    modules = {target: _wide_module(target, cfg) for target in ("hopper", "cuda")}
    for selection in ("realistic", "uniform"):
        q, k, v, do, idx = _problem(cfg, 1, seq, seq, selection, False, 0)
        runs = {target: (lambda m=module: _forward(m, q, k, v, idx)) for target, module in modules.items()}
        runs["fla"], _ = fla_impl(cfg, q, k, v, do, idx)
        for _ in range(2):
            row = {"config": config, "seq": seq, "selection": selection}
            row.update({f"{name}_ms": _median_ms(run, repeats) for name, run in runs.items()})
            print(json.dumps(row), flush=True)


# The selection's two-pass backward on the hopper target, in bench.kernel_checks' case form and on its problems: dk/dv
# on wgmma for every divisor of 64 as heads per group (gpu/hopper/dkdv.mlir: a piece's rows in chunks of 64 / HPG
# positions), dq on wgmma at 64 (gpu/hopper/wide_dq.mlir), the NVIDIA dq up to 16 and linalg's at 32 (the module of
# the unsplit spec: nsa_iree.api runs 32 as two groups of 16). Against the NVIDIA kernels (target cuda, up to 16 heads
# per group), the linalg stages and the f64 oracle. Below 16 heads per group dk/dv makes dq too (dkdv_dq.mlir,
# kernels.SMALL: selection_attention_dkdv_dq).
TWO_PASS_CASES = [
    ("hpg16_b2_m_lt_n_bad", _cfg(64, 4, 128, 128, 64, 16), 2, 700, 1000, "realistic", True),
    ("hpg8_f16_uniform", _cfg(32, 4, 128, 128, 64, 16, "f16"), 1, 1000, 1000, "uniform", False),
    ("hpg4_dv64_bad", _cfg(16, 4, 128, 64, 64, 8), 2, 900, 900, "realistic", True),
    ("hpg2_d64_rising", _cfg(8, 4, 64, 64, 64, 16), 1, 1024, 1024, "realistic rising", False),
    ("hpg1_t1", _cfg(4, 4, 64, 64, 64, 1), 1, 300, 300, "uniform", False),
    ("hpg1_d128_bad", _cfg(2, 2, 128, 128, 64, 16), 1, 2000, 2100, "uniform", True),
    ("hpg4_b2_duplicates", _cfg(16, 4, 128, 128, 64, 16), 2, 1000, 1000, "realistic duplicates", False),
    ("hpg8_d64_f16_m_lt_n", _cfg(32, 4, 64, 64, 64, 16, "f16"), 1, 700, 1300, "realistic", True),
    ("hpg32_g2_bad", _cfg(64, 2, 128, 128, 64, 16), 1, 1000, 1000, "realistic", True),
    ("hpg64_d64_f16", _cfg(64, 1, 64, 64, 64, 8, "f16"), 1, 777, 777, "uniform", False),
    ("hpg64_b2_m_lt_n_bad", _cfg(64, 1, 128, 128, 64, 16), 2, 700, 1000, "realistic", True),
    ("hpg64_g2_rising_keys", _cfg(128, 2, 128, 128, 64, 16), 1, 1024, 1024, "realistic rising", False),
    ("hpg64_dv64_t1", _cfg(64, 1, 128, 64, 64, 1), 1, 300, 300, "uniform", False),
]


def _two_pass(spec_, kernels="auto"):
    return _load(spec_.replace(kernels=kernels), "two-pass")


def _dkdv(module, q, k, v, idx, lse, delta, do):
    """dk, dv of a two-pass module's stages (the block lists' inversion, then dk/dv), outputs poisoned."""
    dk, dv = (torch.full_like(x, float("nan")) for x in (k, v))
    entries, piece_start, piece_count = module.call("invert_block_indices", idx, k.shape[1])
    module.call("selection_attention_dkdv", q, k, v, idx, lse, delta, do, entries, piece_start, piece_count,
                q.shape[3] ** -0.5, dk, dv)
    return dk, dv


def _dq(module, q, k, v, idx, lse, delta, do):
    """dq of a two-pass module's dq stage, output poisoned."""
    dq = torch.full_like(q, float("nan"))
    module.call("selection_attention_dq", q, k, v, idx, lse, delta, do, q.shape[3] ** -0.5, dq)
    return dq


def _dkdv_dq(module, q, k, v, idx, lse, o, do, lists=None):
    """dq, dk, dv of a two-pass module whose dk/dv makes dq (kernels.SMALL: one call, delta and the inversion made
    in it), outputs poisoned; with `lists` (the block lists a forward over the pieces wrote), its function taking
    them (selection_attention_backward_lists: no inversion)."""
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    if lists is None:
        module.call("selection_attention_backward", q, k, v, idx, lse, o, do, q.shape[3] ** -0.5, dq, dk, dv)
    else:
        module.call("selection_attention_backward_lists", q, k, v, idx, lse, o, do, *lists, q.shape[3] ** -0.5, dq,
                    dk, dv)
    return dq, dk, dv


def _grads(spec_, module, q, k, v, idx, lse, o, do):
    """dq, dk, dv of a two-pass module (outputs poisoned): its one call where dk/dv makes dq, else its stages (delta,
    dq, then the inversion and dk/dv)."""
    if api.dq_with_dkdv(spec_):
        return _dkdv_dq(module, q, k, v, idx, lse, o, do)
    (delta,) = module.call("selection_attention_delta", o, do)
    args = (q, k, v, idx, lse, delta, do)
    return (_dq(module, *args), *_dkdv(module, *args))


def check_two_pass(seed: int = 0) -> None:
    """dq, dk and dv of the hopper two-pass module, the NVIDIA kernels' (up to 16 heads per group) and the linalg
    stages' against the f64 oracle (o, lse from the oracle's forward); the hopper module twice (bitwise equal)."""
    from nsa_iree.reference import selection_attention_backward_reference, selection_attention_reference

    recipe = load_recipe("hopper")
    for i, (name, cfg, *problem) in enumerate(TWO_PASS_CASES):
        q, k, v, do, idx = _problem(cfg, *problem, seed + i)
        o_ref, lse_ref = selection_attention_reference(q.cpu(), k.cpu(), v.cpu(), idx.cpu(), cfg["block_size"])
        o, lse = o_ref.to(q.dtype).cuda(), lse_ref.float().cuda()
        _, *ref = selection_attention_backward_reference(
            q.cpu(), k.cpu(), v.cpu(), o.cpu(), lse.cpu(), do.cpu(), idx.cpu(), cfg["block_size"])
        spec_ = KernelSpec(target="hopper", **cfg)
        choices = [choose(stage, spec_, recipe) for stage in ("dq", "dkdv")]
        # (dq's stage is not rendered where dk/dv makes dq: both named by dk/dv's form)
        kernels = [c.template or c.family for c in choices]
        row = {"case": name, "hopper_kernels": [kernels[1]] * 2 if api.dq_with_dkdv(spec_) else kernels}
        for label, target, kernels in (("hopper", "hopper", "auto"), ("cuda", "cuda", "auto"),
                                       ("linalg", "cuda", "linalg")):
            if label == "cuda" and cfg["heads"] // cfg["kv_heads"] > 16:
                continue
            spec_ = KernelSpec(target=target, kernels=kernels, **cfg)
            module = _two_pass(spec_, kernels)
            grads = _grads(spec_, module, q, k, v, idx, lse, o, do)
            torch.cuda.synchronize()
            for grad, x, r in zip(("dq", "dk", "dv"), grads, ref):
                row[f"{label}_{grad}"] = _error(x.cpu(), r)
            if label == "hopper":
                again = _grads(spec_, module, q, k, v, idx, lse, o, do)
                torch.cuda.synchronize()
                row["hopper_bitwise"] = all(torch.equal(a, b) for a, b in zip(grads, again))
        print(json.dumps(row), flush=True)


# (heads, kv heads) of each group size at the anchors' D, BS and T: 64 query heads over 1 kv head down to 4 over 4
TWO_PASS_LAYOUTS = {64: (64, 1), 16: (64, 4), 8: (32, 4), 4: (16, 4), 2: (8, 4), 1: (4, 4)}


def time_two_pass(seq: int = 65536, repeats: int = 10) -> None:
    """The selection's dq call and dk/dv call (its inversion included) at seq tokens per group size, hopper's module
    and NVIDIA's (up to 16 heads per group), alternating, realistic and uniform selections."""
    for hpg, (heads, kv_heads) in TWO_PASS_LAYOUTS.items():
        cfg = dict(CONFIGS["anchors"], heads=heads, kv_heads=kv_heads)
        targets = ("hopper", "cuda") if hpg <= 16 else ("hopper",)
        modules = {target: _two_pass(KernelSpec(target=target, **cfg)) for target in targets}
        for selection in ("realistic", "uniform"):
            q, k, v, do, idx = _problem(cfg, 1, seq, seq, selection, False, 0)
            lse = torch.randn(1, heads, seq, device="cuda").abs() + 4.0
            delta = torch.randn(1, seq, heads, device="cuda")
            runs = {}
            for target, module in modules.items():
                if api.dq_with_dkdv(KernelSpec(target=target, **cfg)):
                    runs[f"{target}_dkdv_dq"] = functools.partial(_dkdv_dq, module, q, k, v, idx, lse, do, do)
                    continue
                runs[f"{target}_dq"] = functools.partial(_dq, module, q, k, v, idx, lse, delta, do)
                runs[f"{target}_dkdv"] = functools.partial(_dkdv, module, q, k, v, idx, lse, delta, do)
            for _ in range(2):
                row = {"seq": seq, "heads_per_group": hpg, "selection": selection}
                row.update({f"{name}_ms": _median_ms(run, repeats) for name, run in runs.items()})
                print(json.dumps(row), flush=True)


# The small groups' forward (kernels.SMALL: gpu/hopper/forward_pieces.mlir, the block lists' pieces against their
# rows, each row's partials per slot combined in slot order) on the two-pass cases below 16 heads per group (B 2,
# M < N, bad slots, duplicates, rising keys, f16, T 1, D 64; the kernel serves 4 heads per group and fewer, the 8's
# run the NVIDIA forward) and two of its own: f16 with M > N (rows before the first key) and bad slots, f16 D 64
# duplicates.
PIECE_CASES = [case for case in TWO_PASS_CASES if case[1]["heads"] // case[1]["kv_heads"] < 16] + [
    ("hpg4_f16_m_gt_n_bad", _cfg(16, 4, 128, 128, 64, 16, "f16"), 2, 1300, 700, "realistic", True),
    ("hpg2_d64_f16_duplicates", _cfg(8, 4, 64, 64, 64, 16, "f16"), 1, 1000, 1000, "realistic duplicates", False),
    # D 64 and Dv 128: o's partials staged in four rounds of 32 columns (pieces.staged_stores)
    ("hpg4_d64_dv128_m_lt_n", _cfg(16, 4, 64, 128, 64, 16, "bf16"), 1, 700, 900, "uniform", True),
]


def check_pieces(seed: int = 0) -> None:
    """o and lse of the hopper forward module (over the pieces below 16 heads per group), the NVIDIA forward's and
    the linalg stages' against the f64 oracle, outputs poisoned; the hopper module twice (bitwise equal)."""
    from nsa_iree.reference import selection_attention_reference

    recipe = load_recipe("hopper")
    for i, (name, cfg, *problem) in enumerate(PIECE_CASES):
        q, k, v, _, idx = _problem(cfg, *problem, seed + i)
        o_ref, lse_ref = selection_attention_reference(q.cpu(), k.cpu(), v.cpu(), idx.cpu(), cfg["block_size"])
        choice = choose("forward", KernelSpec(target="hopper", **cfg), recipe)
        row = {"case": name, "hopper_kernel": choice.template or choice.family}
        for label, target, kernels in (("hopper", "hopper", "auto"), ("cuda", "cuda", "auto"),
                                       ("linalg", "cuda", "linalg")):
            spec_ = KernelSpec(target=target, kernels=kernels, **cfg)
            module = _load(spec_, "forward")
            lists = _list_buffers(spec_, idx, k.shape[1])
            o, lse = _forward(module, q, k, v, idx, lists)
            torch.cuda.synchronize()
            row[f"{label}_o"], row[f"{label}_lse"] = _error(o.cpu(), o_ref), _error(lse.cpu(), lse_ref)
            if label == "hopper":
                again = _forward(module, q, k, v, idx, _list_buffers(spec_, idx, k.shape[1]))
                torch.cuda.synchronize()
                row["hopper_bitwise"] = torch.equal(o, again[0]) and torch.equal(lse, again[1])
                if lists is not None:
                    row.update(_check_forward_lists(spec_, q, k, v, idx, o, lse, lists, seed + i))
                # a NaN in one query row (batch 0, its first head) reaches that head's o and lse, no other (batch,
                # row, head)'s o or lse
                q_nan = q.clone()
                m = q.shape[1] // 2
                q_nan[0, m, 0] = float("nan")
                o_nan, lse_nan = _forward(module, q_nan, k, v, idx, _list_buffers(spec_, idx, k.shape[1]))
                torch.cuda.synchronize()
                others = torch.ones(o.shape[:3], dtype=torch.bool, device="cuda")      # [B, M, H]
                others[0, m, 0] = False
                others_lse = others.permute(0, 2, 1)                                  # [B, H, M]
                unchanged = {"others_o_unchanged": torch.equal(o_nan[others], o[others]),
                             "others_lse_unchanged": torch.equal(lse_nan[others_lse], lse[others_lse])}
                row["hopper_nan_row"] = ({"o_nan": bool(o_nan[0, m, 0].isnan().all()),
                                          "lse_nan": bool(lse_nan[0, 0, m].isnan()), **unchanged}
                                         if torch.isfinite(lse[0, 0, m]) else {"row sees no key": True, **unchanged})
        print(json.dumps(row), flush=True)


def _check_forward_lists(spec_, q, k, v, idx, o, lse, lists, seed):
    """The block lists a forward over the pieces wrote against the oracle's (reference.block_lists_reference), and
    the backward taking them (selection_attention_backward_lists) against the one inverting them itself: dq, dk and
    dv bit for bit."""
    from nsa_iree.reference import block_lists_reference

    want = block_lists_reference(idx.cpu(), spec_.block_size, k.shape[1], api._rows_per_piece(spec_))
    row = {"lists_equal_oracle": all(a.shape == e.shape and torch.equal(a.cpu(), e) for a, e in zip(lists, want))}
    do = torch.randn(o.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)).to(o.dtype)
    module = _two_pass(spec_)
    inverting = _dkdv_dq(module, q, k, v, idx, lse, o, do)
    given = _dkdv_dq(module, q, k, v, idx, lse, o, do, lists)
    torch.cuda.synchronize()
    row["backward_lists_bitwise"] = all(torch.equal(a, b) for a, b in zip(given, inverting))
    return row


def time_pieces(seq: int = 65536, repeats: int = 10) -> None:
    """The forward call at seq tokens below 16 heads per group: the hopper module's (over the pieces) and NVIDIA's
    (position-major), alternating, realistic and uniform selections."""
    for hpg, (heads, kv_heads) in TWO_PASS_LAYOUTS.items():
        if hpg >= 16:
            continue
        cfg = dict(CONFIGS["anchors"], heads=heads, kv_heads=kv_heads)
        specs = {target: KernelSpec(target=target, **cfg) for target in ("hopper", "cuda")}
        for selection in ("realistic", "uniform"):
            q, k, v, _, idx = _problem(cfg, 1, seq, seq, selection, False, 0)
            runs = {target: functools.partial(_forward, _load(spec_, "forward"), q, k, v, idx,
                                              _list_buffers(spec_, idx, seq))
                    for target, spec_ in specs.items()}
            for _ in range(2):
                row = {"seq": seq, "heads_per_group": hpg, "selection": selection}
                row.update({f"{name}_ms": _median_ms(run, repeats) for name, run in runs.items()})
                print(json.dumps(row), flush=True)


def sanitize(m: int = 300) -> None:
    """For compute-sanitizer: one small forward and backward per window layout, one wide forward, and the selection's
    dk/dv at 4 heads per group with its forward over the pieces (Dv 64 and 128), and dq and dk/dv at 64 (B 2, bad
    slots)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    for case in ("bf16", "d64"):
        q, k, v, idx = _inputs(case, 2, m, m + 100, gen)
        o, lse = _forward(_module("hopper", case), q, k, v, idx)
        band = window._band_indices(2, m, m + 100, 4, WINDOW, q.device)
        grads = _backward("hopper", case, q, k, v, o, lse, torch.randn_like(o), band)
        torch.cuda.synchronize()
        finite = all(bool(torch.isfinite(x).all()) for x in (o, lse, *grads))
        print(json.dumps({"case": case, "m": m, "finite": finite}), flush=True)
    # the wide forward: 64 heads per kv head, B 2, bad slots
    name, cfg, _, _, _, selection, bad = WIDE_CASES[0]
    q, k, v, _, idx = _problem(cfg, 2, m, m + 100, selection, bad, 0)
    o, lse = _forward(_wide_module("hopper", cfg), q, k, v, idx)
    torch.cuda.synchronize()
    print(json.dumps({"case": name, "m": m, "finite": bool(torch.isfinite(o).all())}), flush=True)
    # the selection's dk/dv at 4 heads per group (16 positions a chunk; Dv 64 and 128: the forward over the pieces
    # staging o's partials in one round and in two), and dq and dk/dv at 64: B 2, bad slots
    for name, cfg, _, _, _, selection, bad in (c for c in TWO_PASS_CASES if c[0] in ("hpg4_dv64_bad",
                                                                                    "hpg4_b2_duplicates",
                                                                                    "hpg64_b2_m_lt_n_bad")):
        q, k, v, do, idx = _problem(cfg, 2, m, m + 100, selection, bad, 0)
        lse = torch.randn(2, cfg["heads"], m, device="cuda").abs() + 4.0
        spec_ = KernelSpec(target="hopper", **cfg)
        grads = _grads(spec_, _two_pass(spec_), q, k, v, idx, lse, do, do)      # (do as o: any o will do)
        torch.cuda.synchronize()
        print(json.dumps({"case": name, "m": m, "finite": all(bool(torch.isfinite(x).all()) for x in grads)}),
              flush=True)
        if cfg["heads"] // cfg["kv_heads"] < 16:
            # the forward over the pieces (kernels.SMALL; rows that see no key have lse -inf), and the backward
            # taking the lists it wrote
            lists = _list_buffers(spec_, idx, m + 100)
            o, lse = _forward(_load(spec_, "forward"), q, k, v, idx, lists)
            given = _dkdv_dq(_two_pass(spec_), q, k, v, idx, lse, o, do, lists)
            torch.cuda.synchronize()
            print(json.dumps({"case": name + " forward", "m": m, "finite": bool(torch.isfinite(o).all()),
                              "backward_lists_finite": all(bool(torch.isfinite(x).all()) for x in given)}),
                  flush=True)


if __name__ == "__main__":
    what, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    {"compile": compile_all, "check": check, "check_bwd": check_bwd, "time": time, "time_bwd": time_bwd,
     "sanitize": sanitize, "check_wide": check_wide, "time_wide": time_wide, "check_two_pass": check_two_pass,
     "time_two_pass": time_two_pass, "check_pieces": check_pieces, "time_pieces": time_pieces}[what](*args)
