"""The two-pass backward is bitwise reproducible: no atomics, and every reduction runs in a fixed order."""

from __future__ import annotations

import dataclasses

import torch

from nsa_iree.selection import realistic_block_indices

from conftest import Problem, make_inputs, run_poisoned


def test_two_pass_is_bitwise_identical_over_20_runs():
    p = Problem(batch=2, m_rows=200, n=200, heads=8, kv_heads=2, head_dim=32, value_dim=32, block_size=16,
                num_blocks=6, select=lambda gen, p: realistic_block_indices(
                    p.batch, p.m_rows, p.n, p.kv_heads, p.num_blocks, p.block_size, generator=gen))
    inputs = make_inputs(p, torch.bfloat16, seed=3)
    first = run_poisoned(p, *inputs)
    for _ in range(19):
        again = run_poisoned(p, *inputs)
        for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), first, again):
            assert torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a.view(torch.int32),
                               b.view(torch.uint8) if b.dtype != torch.float32 else b.view(torch.int32)), name


def test_two_pass_is_bitwise_identical_across_cpu_thread_counts(tmp_path):
    import os
    import subprocess
    import sys

    script = (
        "import sys, torch, dataclasses\n"
        "sys.path.insert(0, 'tests')\n"
        "from conftest import Problem, make_inputs, run_poisoned\n"
        "from nsa_iree.selection import realistic_block_indices\n"
        "p = Problem(batch=2, m_rows=300, n=300, heads=8, kv_heads=2, head_dim=32, value_dim=32, block_size=16,\n"
        "            num_blocks=6, select=lambda gen, p: realistic_block_indices(p.batch, p.m_rows, p.n, p.kv_heads,\n"
        "            p.num_blocks, p.block_size, generator=gen))\n"
        "outs = run_poisoned(p, *make_inputs(p, torch.float32, seed=5))\n"
        "torch.save([o.clone() for o in outs], sys.argv[1])\n")
    results = []
    for threads in (1, 2, 3):
        path = tmp_path / f"t{threads}.pt"
        env = {**os.environ, "NSA_IREE_CPU_THREADS": str(threads)}
        subprocess.run([sys.executable, "-c", script, str(path)], check=True, env=env,
                       cwd=os.path.dirname(os.path.dirname(__file__)))
        results.append(torch.load(path))
    for other in results[1:]:
        for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), results[0], other):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)), name
