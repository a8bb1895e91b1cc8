"""The main job: compile the default configuration, run it on the CPU, check it against the f64 oracle."""

from __future__ import annotations

import statistics
import time

import torch

from . import selection_attention_bwd, selection_attention_fwd
from .compiler import compile_artifact
from .reference import selection_attention_backward_reference, selection_attention_reference
from .selection import realistic_block_indices
from .spec import DEMO_SPEC, VARIANTS as BACKWARD_VARIANTS, kernels_from_environment, target_cpu_from_environment
from .testing import TOLERANCE, relative_rms_error

_TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def _timed(fn, repeats):
    fn()  # warm-up (and first-call module load)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def run_demo(seq_len: int = 1024, seed: int = 0, repeats: int = 3) -> int:
    spec = DEMO_SPEC
    print(f"nsa-iree demo: H={spec.heads} G={spec.kv_heads} D={spec.head_dim} Dv={spec.value_dim} "
          f"BS={spec.block_size} T={spec.num_blocks} {spec.dtype}, B=1, M=N={seq_len}, realistic selection\n")

    rows = []
    kernels = kernels_from_environment()           # the settings the run below reads too (nsa_iree.api.describe)
    specs = {"gfx950": spec.replace(target="gfx950", kernels=kernels),
             "cpu": spec.replace(kernels=kernels, target_cpu=target_cpu_from_environment())}
    for target, target_spec in specs.items():
        for variant in ("forward",) + BACKWARD_VARIANTS:
            art = compile_artifact(target_spec, variant)
            how = f"{art.compile_seconds:.1f} s" if art.compile_seconds else "cached"
            rows.append((target, variant, how, f"{art.path.stat().st_size / 1024:.0f} KiB", str(art.path)))
    print(_table(("target", "module", "compile", "size", "artifact"), rows))

    gen = torch.Generator().manual_seed(seed)
    dtype = _TORCH_DTYPE[spec.dtype]
    b, m, n = 1, seq_len, seq_len
    q = torch.randn(b, m, spec.heads, spec.head_dim, generator=gen).to(dtype)
    k = torch.randn(b, n, spec.kv_heads, spec.head_dim, generator=gen).to(dtype)
    v = torch.randn(b, n, spec.kv_heads, spec.value_dim, generator=gen).to(dtype)
    do = torch.randn(b, m, spec.heads, spec.value_dim, generator=gen).to(dtype)
    idx = realistic_block_indices(b, m, n, spec.kv_heads, spec.num_blocks, spec.block_size, generator=gen)
    bs = spec.block_size

    (o, lse), t_fwd = _timed(lambda: selection_attention_fwd(q, k, v, idx, bs), repeats)
    backward = {variant: _timed(lambda: selection_attention_bwd(q, k, v, o, lse, do, idx, bs, variant=variant),
                                repeats) for variant in BACKWARD_VARIANTS}
    (o_ref, lse_ref), t_ref_fwd = _timed(lambda: selection_attention_reference(q, k, v, idx, bs), 1)
    (_, dq_ref, dk_ref, dv_ref), t_ref_bwd = _timed(
        lambda: selection_attention_backward_reference(q, k, v, o_ref, lse_ref, do, idx, bs), 1)

    tol = TOLERANCE[dtype]
    checks = [(name, relative_rms_error(x, ref)) for name, x, ref in (("o", o, o_ref), ("lse", lse, lse_ref))]
    for variant, ((dq, dk, dv), _) in backward.items():
        checks += [(f"{name} ({variant})", relative_rms_error(x, ref))
                   for name, x, ref in (("dq", dq, dq_ref), ("dk", dk, dk_ref), ("dv", dv, dv_ref))]
    outputs = [o, lse] + [x for grads, _ in backward.values() for x in grads]
    nan_free = not any(torch.isnan(x).any() for x in outputs)
    print()
    print(_table(("output", "rel. RMS error vs f64", f"bound ({spec.dtype})", "ok"),
                 [(name, f"{err:.2e}", f"{tol:.0e}", "yes" if err < tol else "NO") for name, err in checks]))
    print()
    rows = [("forward", f"{t_fwd * 1e3:.0f} ms", f"{t_ref_fwd * 1e3:.0f} ms", f"{t_ref_fwd / t_fwd:.1f}x")]
    rows += [(f"backward ({variant})", f"{t * 1e3:.0f} ms", f"{t_ref_bwd * 1e3:.0f} ms", f"{t_ref_bwd / t:.1f}x")
             for variant, (_, t) in backward.items()]
    print(_table(("pass", "IREE cpu (median of %d)" % repeats, "torch f64 reference", "speedup"), rows))
    ok = nan_free and all(err < tol for _, err in checks)
    print("\nPASS" if ok else "\nFAIL: " + ("NaN in an output" if not nan_free else "error above bound"))
    return 0 if ok else 1


def _table(header, rows) -> str:
    cols = list(zip(header, *rows))
    widths = [max(len(str(c)) for c in col) for col in cols]
    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows])
