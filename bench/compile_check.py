"""torch.compile(fullgraph=True) against eager on one device: o and the three gradients, graph breaks,
torch.export, autocast, and the time of a training step both ways.

    python -m bench.compile_check --device cuda                   # H200: anchors layout, 8k tokens, bf16
    python -m bench.compile_check --device cpu --config tiny --seq 256

Prints one JSON line per check and a summary; exits 1 when a check fails. A check compares the compiled
result with eager: the plain function must agree bit for bit (the same kernels run on the same inputs), a
layer with projections around it to rounding (inductor fuses and reorders the projections' sums), and
both against the f64 reference at a small size (relative RMS error, docs/semantics.md tolerances).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import nsa_iree
from nsa_iree.testing import TOLERANCE, relative_rms_error

from .bench import CONFIGS, DTYPES, _sync, make_problem


def _grads(fn, q, k, v, idx, do):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    o = fn(*leaves, idx)
    o.backward(do)
    return [o.detach()] + [t.grad for t in leaves]


def _step_ms(fn, q, k, v, idx, do, device, repeats):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    times = []
    for _ in range(repeats + 2):
        _sync(device)
        start = time.perf_counter()
        fn(*leaves, idx).backward(do)
        _sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times[2:])[len(times[2:]) // 2] * 1e3


class Layer(torch.nn.Module):
    def __init__(self, cfg, dim=256):
        super().__init__()
        self.cfg = cfg
        h, g, d, dv = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["value_dim"]
        self.q, self.k, self.v = torch.nn.Linear(dim, h * d), torch.nn.Linear(dim, g * d), torch.nn.Linear(dim, g * dv)
        self.out = torch.nn.Linear(h * dv, dim)

    def forward(self, x, idx):
        c, (b, m, _) = self.cfg, x.shape
        q = self.q(x).view(b, m, c["heads"], c["head_dim"])
        k = self.k(x).view(b, m, c["kv_heads"], c["head_dim"])
        v = self.v(x).view(b, m, c["kv_heads"], c["value_dim"])
        o = nsa_iree.selection_attention(q, k, v, idx, block_size=c["block_size"])
        return self.out(o.reshape(b, m, -1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compile_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--config", choices=CONFIGS, default="anchors")
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    device, cfg = torch.device(args.device), CONFIGS[args.config]
    bs, dtype = cfg["block_size"], DTYPES[cfg["dtype"]]
    failures = []

    def report(name, ok, **fields):
        print(json.dumps({"check": name, "ok": bool(ok), **fields}), flush=True)
        if not ok:
            failures.append(name)

    def attend(q, k, v, idx):
        return nsa_iree.selection_attention(q, k, v, idx, block_size=bs)

    compiled = torch.compile(attend, fullgraph=True)
    q, k, v, do, idx = make_problem(cfg, args.seq, "realistic", device)

    explanation = torch._dynamo.explain(attend)(q.detach().requires_grad_(), k, v, idx)
    report("graph breaks", explanation.graph_break_count == 0, graph_breaks=explanation.graph_break_count,
           graphs=explanation.graph_count)

    eager = _grads(attend, q, k, v, idx, do)
    comp = _grads(compiled, q, k, v, idx, do)
    report(f"compile(fullgraph) == eager at {args.seq} tokens", all(torch.equal(a, b) for a, b in zip(eager, comp)),
           bitwise={n: torch.equal(a, b) for n, a, b in zip(("o", "dq", "dk", "dv"), eager, comp)},
           rel_rms={n: relative_rms_error(b, a) for n, a, b in zip(("o", "dq", "dk", "dv"), eager, comp)})
    del eager, comp

    small = make_problem(cfg, 512, "realistic", device, seed=1)
    q_s, k_s, v_s, do_s, idx_s = small
    comp = _grads(compiled, q_s, k_s, v_s, idx_s, do_s)
    ref_leaves = [t.detach().double().requires_grad_(True) for t in (q_s, k_s, v_s)]
    o_ref, _ = nsa_iree.selection_attention_reference(*ref_leaves, idx_s, bs)
    o_ref.backward(do_s.double())
    errors = {n: relative_rms_error(a, b) for n, a, b in zip(("o", "dq", "dk", "dv"), comp,
                                                               [o_ref.detach()] + [t.grad for t in ref_leaves])}
    report("compiled vs f64 reference at 512 tokens", all(e < TOLERANCE[dtype] for e in errors.values()),
           rel_rms=errors, tolerance=TOLERANCE[dtype])

    torch.manual_seed(0)
    layer = Layer(cfg).to(device=device, dtype=dtype)
    x = torch.randn(1, 512, 256, device=device, dtype=dtype)
    results = []
    for model in (layer, torch.compile(layer, fullgraph=True)):
        layer.zero_grad()
        xl = x.clone().requires_grad_(True)
        y = model(xl, idx_s)
        y.float().square().sum().backward()
        # k's bias is left out: its exact gradient is zero (it shifts all scores of a row alike), so both
        # runs hold rounding noise there.
        results.append([y.detach(), xl.grad] + [p.grad.clone() for n, p in layer.named_parameters() if n != "k.bias"])
    errors = [relative_rms_error(b, a) for a, b in zip(*results)]
    report("layer: compile(fullgraph) vs eager (o, x.grad, parameter grads)",
           max(errors) < TOLERANCE[dtype], max_rel_rms=max(errors))

    class Attend(torch.nn.Module):
        def forward(self, q, k, v, idx):
            return attend(q, k, v, idx)

    exported = torch.export.export(Attend(), (q_s, k_s, v_s, idx_s))
    report("torch.export forward", torch.equal(exported.module()(q_s, k_s, v_s, idx_s), attend(q_s, k_s, v_s, idx_s)))

    if device.type == "cuda":
        autocast_dtype = torch.float16
        by_hand = _grads(attend, *(t.to(autocast_dtype) for t in (q_s, k_s, v_s)), idx_s, do_s.to(autocast_dtype))

        def autocast_attend(q, k, v, idx):
            with torch.autocast("cuda", dtype=autocast_dtype):
                return attend(q, k, v, idx)

        q32, k32, v32 = (t.float() for t in (q_s, k_s, v_s))
        for name, fn in (("eager", autocast_attend), ("compiled", torch.compile(autocast_attend, fullgraph=True))):
            got = _grads(fn, q32, k32, v32, idx_s, do_s.to(autocast_dtype))
            report(f"autocast(cuda, float16) {name}: f32 inputs run as float16",
                   got[0].dtype == autocast_dtype and all(g.dtype == torch.float32 for g in got[1:])
                   and all(torch.equal(a, b.to(a.dtype)) for a, b in zip(got, by_hand)))

    t_eager = _step_ms(attend, q, k, v, idx, do, device, args.repeats)
    t_comp = _step_ms(compiled, q, k, v, idx, do, device, args.repeats)
    print(json.dumps({"training step ms (forward + backward)": {"eager": round(t_eager, 2),
                                                                 "compiled": round(t_comp, 2)},
                      "seq": args.seq, "config": args.config, "device": str(device)}), flush=True)
    print("PASS" if not failures else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
