"""Hand-written kernels against the linalg stages they replace, on the GPU.

    python3 -m bench.kernel_checks check        # every case: the recipe's forward, two-pass and one-pass vs linalg
                                                # vs f64
    python3 -m bench.kernel_checks determinism  # custom backward bitwise identical over 20 runs (16k tokens)
    python3 -m bench.kernel_checks time [SEQ]   # dq stage and whole two-pass backward, custom vs linalg
    python3 -m bench.kernel_checks onepass_time [SEQ...]  # one-pass vs its atomic floor and the two-pass

KERNEL_CASES=id,id,... narrows precompile and check to those CASES.

The linalg stages are the oracle: both modules come from the same checkout, the linalg one rendered for
KernelSpec(kernels="linalg") (nsa_iree/recipes.py: choose). Artifacts are compiled where the compiler is and carried
in $NSA_IREE_CACHE_DIR (bench/run_h200.sh); `precompile` does that for every case here.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch

from nsa_iree.api import effective_block_indices
from nsa_iree.compiler import compile_artifact
from nsa_iree.testing import relative_rms_error
from nsa_iree.recipes import load_recipe
from nsa_iree.kernels import choose
from nsa_iree.reference import selection_attention_backward_reference, selection_attention_reference
from nsa_iree.runtime import device_for
from nsa_iree.selection import local_block_indices, realistic_block_indices, uniform_block_indices
from nsa_iree.spec import KernelSpec

from .bench import CONFIGS

_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def _cfg(heads, kv_heads, head_dim, value_dim, block_size, num_blocks, dtype="bf16"):
    return dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, value_dim=value_dim, block_size=block_size,
                num_blocks=num_blocks, dtype=dtype)


# (id, layout, batch, M, N, selection, bad slots)
CASES = [
    ("anchors", CONFIGS["anchors"], 1, 1024, 1024, "realistic", False),
    ("paper_d192", CONFIGS["paper"], 1, 1024, 1024, "realistic", False),
    ("hpg16_b2_m_lt_n_bad", _cfg(16, 1, 128, 128, 64, 16), 2, 700, 1000, "realistic", True),
    ("hpg8_bs32_f16", _cfg(32, 4, 64, 64, 32, 8, "f16"), 1, 1000, 1000, "uniform", False),
    ("hpg4_bs128_dv64", _cfg(16, 4, 128, 64, 128, 4), 2, 900, 900, "realistic", True),
    ("hpg1_t1", _cfg(4, 4, 64, 64, 64, 1), 1, 300, 300, "uniform", False),
    ("hpg16_g2_t2_d64", _cfg(32, 2, 64, 64, 64, 2), 2, 513, 513, "realistic", True),
    ("d192_bs128", _cfg(16, 2, 192, 128, 128, 4), 1, 600, 600, "realistic", True),   # forward kernel, linalg dq
    # wide groups (kernels.WIDE): the forward on the wide kernel, dq and dk/dv of the unsplit spec on linalg
    ("hpg64_b2_m_lt_n_bad", _cfg(64, 1, 128, 128, 64, 16), 2, 700, 1000, "realistic", True),
    ("hpg32_g2_rising_keys", _cfg(64, 2, 128, 128, 64, 16), 1, 1024, 1024, "realistic rising", False),
    ("hpg48_d64_bs32_f16_bad", _cfg(48, 1, 64, 64, 32, 8, "f16"), 1, 777, 777, "uniform", True),
    # keys scaled up along the sequence: later blocks' scores pass the forward's running max by far more than its
    # rescale slack (2^8) again and again, so the rescale branch runs with o already accumulated
    ("anchors_rising_keys", CONFIGS["anchors"], 1, 1024, 1024, "realistic rising", False),
]


def _cases():
    """CASES, or those named in $KERNEL_CASES (comma-separated ids)."""
    only = os.environ.get("KERNEL_CASES")
    return [c for c in CASES if not only or c[0] in only.split(",")]


def _spec(cfg, target="cuda"):
    return KernelSpec(target=target, **cfg)


def _artifact(spec, variant, kernels):
    """The artifact of `variant` with the recipe's hand-written kernels ("custom") or the linalg stages."""
    return compile_artifact(spec.replace(kernels="linalg" if kernels == "linalg" else "auto"), variant)


def precompile():
    """Compile every module these checks load (run where iree-compile is installed)."""
    specs = {_spec(cfg) for _, cfg, *_ in _cases()} | {_spec(CONFIGS["anchors"])}
    for spec in sorted(specs, key=lambda s: s.name):
        for kernels in ("custom", "linalg"):
            for variant in ("two-pass", "forward"):
                print(_artifact(spec, variant, kernels).path.name, flush=True)
    for spec in sorted(specs, key=lambda s: s.name):
        print(_artifact(spec, "one-pass", "custom").path.name, flush=True)
    from pathlib import Path

    root = Path(".dev/variants")
    for recipe_dir in sorted(root.iterdir()) if root.exists() else ():
        os.environ["NSA_IREE_PIPELINES_DIR"] = str(recipe_dir)
        for variant in ("two-pass", "forward"):
            print(recipe_dir.name, _artifact(_spec(CONFIGS["anchors"]), variant, "custom").path.name, flush=True)
        os.environ.pop("NSA_IREE_PIPELINES_DIR")


def _problem(cfg, batch, m_rows, n, selection, bad, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = _DTYPES[cfg["dtype"]]
    h, g, d, dv = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["value_dim"]
    q = torch.randn(batch, m_rows, h, d, generator=gen, device="cuda").to(dtype)
    k = torch.randn(batch, n, g, d, generator=gen, device="cuda").to(dtype)
    v = torch.randn(batch, n, g, dv, generator=gen, device="cuda").to(dtype)
    do = torch.randn(batch, m_rows, h, dv, generator=gen, device="cuda").to(dtype)
    duplicates = selection.endswith(" duplicates")    # every other row lists its slot-2 block again in slot 3
    selection = selection.removesuffix(" duplicates")
    if selection.endswith(" rising"):          # key n scaled by 1 + 8 n / N
        selection = selection.removesuffix(" rising")
        ramp = 1 + 8 * torch.arange(n, device="cuda", dtype=torch.float32) / n
        k = (k.float() * ramp.view(1, n, 1, 1)).to(dtype)
    pick = {"realistic": realistic_block_indices, "uniform": uniform_block_indices,
            "local": local_block_indices}[selection]
    idx = pick(batch, m_rows, n, g, cfg["num_blocks"], cfg["block_size"], generator=gen, device="cuda")
    if duplicates:
        idx[:, ::2, :, 3] = idx[:, ::2, :, 2]
    if bad:
        nb = -(-n // cfg["block_size"])
        if cfg["num_blocks"] > 2:       # (with two slots, one stays a selected block: the rows are not all empty)
            idx[:, :, :, -1] = -1
        idx[:, ::3, :, 0] = nb + 5
        idx[:, 1::3, :, 0] = -(2**31)
        idx[:, 2::3, :, 0] = nb - 1
    return q, k, v, do, effective_block_indices(idx, None)


class Backward:
    """The two-pass backward of one artifact, stage by stage (as nsa_iree.api.backward_into runs it), the
    forward, and the one-pass backward (its module loaded on first use)."""

    def __init__(self, spec, kernels):
        self.spec, self.kernels = spec, kernels
        self.module = device_for(torch.device("cuda")).module(_artifact(spec, "two-pass", kernels).path)
        self.forward = device_for(torch.device("cuda")).module(_artifact(spec, "forward", kernels).path)
        self._onepass = None

    def fwd(self, q, k, v, idx, scale, poison=False):
        o = q.new_empty(*q.shape[:3], v.shape[3])
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
        if poison:
            o.fill_(float("nan"))
            lse.fill_(float("nan"))
        self.forward.call("selection_attention_fwd", q, k, v, idx, scale, o, lse)
        return o, lse

    def delta(self, o, do):
        return self.module.call("selection_attention_delta", o, do)[0]

    def dq(self, q, k, v, idx, lse, delta, do, scale, dq):
        self.module.call("selection_attention_dq", q, k, v, idx, lse, delta, do, scale, dq, wait_for_torch=False)
        return dq

    def bwd(self, q, k, v, o, lse, do, idx, scale, poison=False):
        dq, dk, dv = (torch.full_like(x, float("nan")) if poison else torch.empty_like(x) for x in (q, k, v))
        delta = self.delta(o, do)
        self.dq(q, k, v, idx, lse, delta, do, scale, dq)
        entries, start, count = self.module.call("invert_block_indices", idx, k.shape[1], wait_for_torch=False)
        self.module.call("selection_attention_dkdv", q, k, v, idx, lse, delta, do, entries, start, count, scale,
                         dk, dv, wait_for_torch=False)
        return dq, dk, dv

    def onepass(self, q, k, v, o, lse, do, idx, scale, poison=False):
        if self._onepass is None:
            self._onepass = device_for(torch.device("cuda")).module(
                _artifact(self.spec, "one-pass", self.kernels).path)
        dq, dk, dv = (torch.full_like(x, float("nan")) if poison else torch.empty_like(x) for x in (q, k, v))
        delta = self._onepass.call("selection_attention_delta", o, do)[0]
        self._onepass.call("selection_attention_onepass", q, k, v, idx, lse, delta, do, scale, dq, dk, dv,
                           wait_for_torch=False)
        return dq, dk, dv


def check(seed=0):
    """Every case: the recipe's forward, two-pass and one-pass backward (outputs poisoned first) against the
    linalg stages and the f64 reference (the one-pass adds dk/dv with atomics: equal up to the order of f32
    additions)."""
    recipe = load_recipe("cuda")
    for name, cfg, batch, m_rows, n, selection, bad in _cases():
        spec = _spec(cfg)
        custom, linalg = Backward(spec, "custom"), Backward(spec, "linalg")
        q, k, v, do, idx = _problem(cfg, batch, m_rows, n, selection, bad, seed)
        scale = cfg["head_dim"] ** -0.5
        o, lse = linalg.fwd(q, k, v, idx, scale)
        o_mine, lse_mine = custom.fwd(q, k, v, idx, scale, poison=True)
        mine = custom.bwd(q, k, v, o, lse, do, idx, scale, poison=True)
        one = custom.onepass(q, k, v, o, lse, do, idx, scale, poison=True)
        theirs = linalg.bwd(q, k, v, o, lse, do, idx, scale, poison=True)
        torch.cuda.synchronize()
        _, *ref = selection_attention_backward_reference(q.cpu(), k.cpu(), v.cpu(), o.cpu(), lse.cpu(), do.cpu(),
                                                         idx.cpu(), cfg["block_size"])
        o_ref, lse_ref = selection_attention_reference(q.cpu(), k.cpu(), v.cpu(), idx.cpu(), cfg["block_size"])
        row = {"case": name,
               "kernels": [choose(s, spec, recipe).family for s in ("forward", "dq", "dkdv", "onepass")]}
        for out, a, b, r in (("o", o_mine, o, o_ref), ("lse", lse_mine, lse, lse_ref)):
            row[f"{out}_custom_vs_linalg"] = relative_rms_error(a.float(), b.float())
            row[f"{out}_custom_vs_f64"] = relative_rms_error(a.cpu(), r)
            row[f"{out}_linalg_vs_f64"] = relative_rms_error(b.cpu(), r)
        for grad, a, b, r in zip(("dq", "dk", "dv"), mine, theirs, ref):
            row[f"{grad}_custom_vs_linalg"] = relative_rms_error(a.float(), b.float())
            row[f"{grad}_custom_vs_f64"] = relative_rms_error(a.cpu(), r, rms_floor=1e-3)
            row[f"{grad}_linalg_vs_f64"] = relative_rms_error(b.cpu(), r, rms_floor=1e-3)
        for grad, a, b, r in zip(("dq", "dk", "dv"), one, theirs, ref):
            row[f"{grad}_onepass_vs_linalg"] = relative_rms_error(a.float(), b.float())
            row[f"{grad}_onepass_vs_f64"] = relative_rms_error(a.cpu(), r, rms_floor=1e-3)
        row["all_written"] = all(bool(torch.isfinite(t).all()) for t in (*mine, *one, o_mine)) and bool(
            (torch.isfinite(lse_mine) | (lse_mine == float("-inf"))).all())
        print(json.dumps(row), flush=True)


def atomic_rate(adds=1 << 30, width=256, rows=1 << 18):
    """The GPU's f32 atomic-add rate: torch index_add_ of [n, width] f32 rows (one atomic add per element, rows
    coalesced, row ids in whole 64-row blocks like a selection's) into a [rows, width] accumulator."""
    n = adds // width
    acc = torch.zeros(rows, width, device="cuda")
    blocks = torch.randint(0, rows // 64, (n // 64,), device="cuda")
    index = (blocks[:, None] * 64 + torch.arange(64, device="cuda")).reshape(-1)
    src = torch.randn(index.numel(), width, device="cuda")
    ms = _median_ms(lambda: acc.index_add_(0, index, src), repeats=5, warmup=1)
    return index.numel() * width / (ms / 1e3)


def atomics_issued(idx, m_rows, n, block_size, dims):
    """f32 atomic adds of one one-pass call: every visible key of every selected slot adds D + Dv values (the
    heads of a group are summed on chip first; a slot listed twice adds twice)."""
    pos = torch.arange(m_rows, device=idx.device) + (n - m_rows)
    blocks = idx.to(torch.int64)
    pos = pos.view(1, -1, 1, 1)
    visible = (pos - blocks * block_size + 1).clamp(min=0, max=block_size)
    visible = torch.where((blocks >= 0) & (blocks * block_size <= pos), visible, torch.zeros_like(visible))
    return int(visible.sum()) * dims


def onepass_time(seqs=(8192, 32768, 65536), selections=("realistic",)):
    """The recipe's one-pass backward against its floor (atomics issued / the measured atomic-add rate) and the
    two-pass backward, anchors layout, in one process."""
    cfg = CONFIGS["anchors"]
    spec = _spec(cfg)
    rate = atomic_rate()
    print(json.dumps({"atomic_adds_per_s": rate}), flush=True)
    impl = Backward(spec, "custom")
    for seq in seqs:
        for selection in selections:
            q, k, v, do, idx = _problem(cfg, 1, seq, seq, selection, False, 2)
            scale = cfg["head_dim"] ** -0.5
            o, lse = impl.fwd(q, k, v, idx, scale)
            issued = atomics_issued(idx, seq, seq, cfg["block_size"], cfg["head_dim"] + cfg["value_dim"])
            one_ms = _median_ms(lambda: impl.onepass(q, k, v, o, lse, do, idx, scale), repeats=5, warmup=1)
            two_ms = _median_ms(lambda: impl.bwd(q, k, v, o, lse, do, idx, scale), repeats=5, warmup=1)
            floor_ms = issued / rate * 1e3
            print(json.dumps({"seq": seq, "selection": selection, "onepass_ms": round(one_ms, 2),
                              "twopass_ms": round(two_ms, 2), "atomics_issued": issued,
                              "floor_ms": round(floor_ms, 2), "onepass_over_floor": round(one_ms / floor_ms, 3)}),
                  flush=True)
            q = k = v = do = idx = o = lse = None  # free the GPU memory (closures above read them)
            torch.cuda.empty_cache()


def determinism(repeats=20):
    cfg = CONFIGS["anchors"]
    custom = Backward(_spec(cfg), "custom")
    q, k, v, do, idx = _problem(cfg, 1, 16384, 16384, "realistic", False, 1)
    scale = cfg["head_dim"] ** -0.5
    o, lse = custom.fwd(q, k, v, idx, scale)
    first = [x.clone() for x in custom.bwd(q, k, v, o, lse, do, idx, scale)]
    same = sum(all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                   for a, b in zip(first, custom.bwd(q, k, v, o, lse, do, idx, scale)))
               for _ in range(repeats))
    print(json.dumps({"custom_backward_identical_runs": f"{same}/{repeats}"}), flush=True)


def _median_ms(fn, repeats=10, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time(seqs=(65536,), selections=("realistic", "uniform", "local")):
    cfg = CONFIGS["anchors"]
    spec = _spec(cfg)
    impls = {"custom": Backward(spec, "custom"), "linalg": Backward(spec, "linalg")}
    for seq in seqs:
        for selection in selections:
            q, k, v, do, idx = _problem(cfg, 1, seq, seq, selection, False, 2)
            scale = cfg["head_dim"] ** -0.5
            o, lse = impls["linalg"].fwd(q, k, v, idx, scale)
            row = {"seq": seq, "selection": selection}
            outs = {}
            for name, impl in impls.items():
                row[f"fwd_ms_{name}"] = _median_ms(lambda: impl.fwd(q, k, v, idx, scale))
                delta = impl.delta(o, do)
                dq = torch.empty_like(q)
                row[f"dq_ms_{name}"] = _median_ms(lambda: impl.dq(q, k, v, idx, lse, delta, do, scale, dq))
                row[f"bwd_ms_{name}"] = _median_ms(lambda: impl.bwd(q, k, v, o, lse, do, idx, scale))
                outs[name] = impl.bwd(q, k, v, o, lse, do, idx, scale)
            torch.cuda.synchronize()
            row["dq_custom_vs_linalg"] = relative_rms_error(outs["custom"][0].float(), outs["linalg"][0].float())
            o_custom, lse_custom = impls["custom"].fwd(q, k, v, idx, scale)
            row["o_custom_vs_linalg"] = relative_rms_error(o_custom.float(), o.float())
            row["lse_custom_vs_linalg"] = relative_rms_error(lse_custom, lse)
            for i, grad in ((1, "dk"), (2, "dv")):
                row[f"{grad}_custom_vs_linalg"] = relative_rms_error(outs["custom"][i].float(),
                                                                     outs["linalg"][i].float())
            print(json.dumps(row), flush=True)
            q = k = v = do = idx = o = lse = outs = None  # free the GPU memory (closures above read them)
            torch.cuda.empty_cache()


def variants(root=".dev/variants", seq=65536, selections=("realistic", "uniform", "local")):
    """Time the custom backward of each recipe variant under `root` (one directory each, holding a cuda.toml;
    loaded through $NSA_IREE_PIPELINES_DIR), in one process. The first variant is also profiled per kernel."""
    from pathlib import Path

    cfg = CONFIGS["anchors"]
    spec = _spec(cfg)
    names = sorted(p.name for p in Path(root).iterdir() if (p / "cuda.toml").exists())
    impls = {}
    for name in names:
        os.environ["NSA_IREE_PIPELINES_DIR"] = str(Path(root) / name)
        impls[name] = Backward(spec, "custom")
    os.environ.pop("NSA_IREE_PIPELINES_DIR", None)
    for selection in selections:
        q, k, v, do, idx = _problem(cfg, 1, seq, seq, selection, False, 2)
        scale = cfg["head_dim"] ** -0.5
        o, lse = next(iter(impls.values())).fwd(q, k, v, idx, scale)
        row = {"seq": seq, "selection": selection}
        for name, impl in impls.items():
            row[f"{name}_fwd_ms"] = round(_median_ms(lambda: impl.fwd(q, k, v, idx, scale)), 2)
            delta = impl.delta(o, do)
            dq = torch.empty_like(q)
            row[f"{name}_dq_ms"] = round(_median_ms(lambda: impl.dq(q, k, v, idx, lse, delta, do, scale, dq)), 2)
            row[f"{name}_bwd_ms"] = round(_median_ms(lambda: impl.bwd(q, k, v, o, lse, do, idx, scale)), 2)
        print(json.dumps(row), flush=True)
        if selection == selections[0]:
            impl = impls[names[0]]
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                impl.bwd(q, k, v, o, lse, do, idx, scale)
                torch.cuda.synchronize()
            kernels = sorted(((e.key, e.device_time_total / 1e3)
                              for e in prof.key_averages() if e.device_time_total > 0),
                             key=lambda r: -r[1])
            print(json.dumps({"profile": names[0], "kernels_ms": [(key[:60], round(ms, 2)) for key, ms in kernels]}),
                  flush=True)
        q = k = v = do = idx = o = lse = None  # free the GPU memory (closures above read them)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    what = sys.argv[1]
    args = [int(a) for a in sys.argv[2:]]
    {"precompile": precompile, "check": check, "determinism": determinism,
     "time": lambda: time(tuple(args) or (65536,)), "variants": variants,
     "onepass_time": lambda: onepass_time(tuple(args) or (8192, 32768, 65536))}[what]()
