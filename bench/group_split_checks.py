"""More query heads per kv head than the GPU kernels' 16-row tiles (kernels.group_split: 2 or 4 groups of 16 heads on
the hand-written kernels), on the GPU: forward, two-pass (twice, bitwise) and one-pass backward through
nsa_iree.api's forward_into / backward_into with every output poisoned (NaN), against the f64 reference.

    python3 -m bench.group_split_checks --compile   # here (the compiler): every module the cases load, for cuda
    python3 -m bench.group_split_checks             # on the GPU ($NSA_IREE_CACHE_DIR holding them)
"""

from __future__ import annotations

import json
import sys

import torch

from nsa_iree import api
from nsa_iree.reference import selection_attention_backward_reference, selection_attention_reference
from nsa_iree.selection import realistic_block_indices
from nsa_iree.spec import KernelSpec
from nsa_iree.testing import relative_rms_error

# (id, H, G, D, Dv, dtype, B, M, N, bad slots); BS 64, T 16
CASES = [
    ("hpg32", 64, 2, 128, 128, "bf16", 1, 1024, 1024, False),
    ("hpg64_b2_m_lt_n_bad", 64, 1, 128, 128, "bf16", 2, 700, 1000, True),
    ("hpg32_d64_f16", 32, 1, 64, 64, "f16", 1, 600, 600, False),
]
BS, T = 64, 16
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def _spec(h, g, d, dv, dtype):
    return KernelSpec(heads=h, kv_heads=g, head_dim=d, value_dim=dv, block_size=BS, num_blocks=T, dtype=dtype,
                      target="cuda")


def compile_all() -> None:
    from nsa_iree.compiler import compile_loaded

    for _, h, g, d, dv, dtype, *_ in CASES:
        spec = _spec(h, g, d, dv, dtype)
        for variant in ("forward", "two-pass", "one-pass"):
            artifact, split = compile_loaded(spec, variant)
            print(artifact.path.name, split, flush=True)


def _poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def check(seed: int = 0) -> bool:
    ok = True
    for name, h, g, d, dv, dtype, batch, m_rows, n, bad in CASES:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        dt = DTYPES[dtype]
        q = torch.randn(batch, m_rows, h, d, generator=gen, device="cuda").to(dt)
        k = torch.randn(batch, n, g, d, generator=gen, device="cuda").to(dt)
        v = torch.randn(batch, n, g, dv, generator=gen, device="cuda").to(dt)
        do = torch.randn(batch, m_rows, h, dv, generator=gen, device="cuda").to(dt)
        idx = realistic_block_indices(batch, m_rows, n, g, T, BS, generator=gen, device="cuda")
        if bad:
            idx[:, :, :, -1] = -1
            idx[:, ::3, :, 0] = -(-n // BS) + 5
            idx[:, 1::3, :, 0] = -(2**31)
        idx = api.effective_block_indices(idx, None)
        scale = d ** -0.5
        spec = _spec(h, g, d, dv, dtype)
        row = {"check": name, "split": {v: api.loaded_spec(spec, v)[1] for v in ("forward", "two-pass", "one-pass")}}
        o, lse = _poisoned((batch, m_rows, h, dv), dt), _poisoned((batch, h, m_rows), torch.float32)
        api.forward_into(o, lse, q, k, v, idx, BS, scale)
        grads = {}
        for run in ("two-pass", "two-pass again", "one-pass"):
            out = [_poisoned(t.shape, dt) for t in (q, k, v)]
            api.backward_into(*out, q, k, v, o, lse, do, idx, BS, scale, run.split()[0])
            grads[run] = out
        torch.cuda.synchronize()
        o_ref, lse_ref = selection_attention_reference(q.cpu(), k.cpu(), v.cpu(), idx.cpu(), BS, scale=scale)
        _, *ref = selection_attention_backward_reference(q.cpu(), k.cpu(), v.cpu(), o.cpu(), lse.cpu(), do.cpu(),
                                                         idx.cpu(), BS, scale=scale)
        row["o"] = relative_rms_error(o.cpu(), o_ref)
        row["lse"] = relative_rms_error(lse.cpu(), lse_ref)
        for run in ("two-pass", "one-pass"):
            for grad, a, r in zip(("dq", "dk", "dv"), grads[run], ref):
                row[f"{grad}_{run}"] = relative_rms_error(a.cpu(), r, rms_floor=1e-3)
        row["all_written"] = bool(torch.isfinite(o).all()) and all(
            bool(torch.isfinite(t).all()) for run in grads.values() for t in run)
        row["two_pass_bitwise"] = all(torch.equal(a, b) for a, b in zip(grads["two-pass"], grads["two-pass again"]))
        errors = [value for key, value in row.items() if key in ("o", "lse") or key.startswith("d")]
        row["ok"] = row["all_written"] and row["two_pass_bitwise"] and all(e < 1e-2 for e in errors)
        ok &= row["ok"]
        print(json.dumps(row), flush=True)
    return ok


if __name__ == "__main__":
    if sys.argv[1:] == ["--compile"]:
        compile_all()
    else:
        sys.exit(0 if check() else 1)
