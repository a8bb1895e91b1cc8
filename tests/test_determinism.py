"""The two-pass backward is bitwise reproducible: no atomics, and every reduction runs in a fixed order, the same
whatever the thread count and whatever the vector width of the x86-64 CPU (with FMA) the kernels run on."""

from __future__ import annotations

import pytest
import torch

from conftest import CPU_TARGETS, DTYPES, Problem, assert_bitwise_equal, cpu_target, make_inputs, random_indices, \
    realistic_indices, relative_rms_error, run_poisoned
from nsa_iree.api import describe, effective_block_indices


def test_two_pass_is_bitwise_identical_over_20_runs():
    p = Problem(batch=2, m_rows=200, n=200, heads=8, kv_heads=2, head_dim=32, value_dim=32, block_size=16,
                num_blocks=6, select=realistic_indices)
    inputs = make_inputs(p, torch.bfloat16, seed=3)
    first = run_poisoned(p, *inputs)
    for _ in range(19):
        assert_bitwise_equal(first, run_poisoned(p, *inputs))


def test_two_pass_is_bitwise_identical_across_cpu_thread_counts(tmp_path):
    import os
    import subprocess
    import sys

    script = (
        "import sys, torch\n"
        "sys.path.insert(0, 'tests')\n"
        "from conftest import Problem, make_inputs, realistic_indices, run_poisoned\n"
        "p = Problem(batch=2, m_rows=300, n=300, heads=8, kv_heads=2, head_dim=32, value_dim=32, block_size=16,\n"
        "            num_blocks=6, select=realistic_indices)\n"
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
        assert_bitwise_equal(results[0], other)


ONE_PASS_REORDERING = 1e-4     # measured up to 1.3e-5 here (5 runs), 2.7e-5 to 3.8e-5 on the H200 (dkdv_f32_H200.log)


def _has_avx512() -> bool:
    try:
        return "avx512f" in open("/proc/cpuinfo").read()
    except OSError:
        return False


@pytest.mark.skipif(not _has_avx512(), reason="the host's code is AVX2 code here: nothing to compare")
@pytest.mark.parametrize("dtype", DTYPES)
def test_avx512_and_avx2_code_give_the_same_bits(dtype):
    """The kernels compiled for this host and for x86-64-v3 (AVX2: 256-bit vectors, two per AVX-512 register)
    agree bit for bit: every reduction is in a fixed order per element, not split by the vector width. 203 rows
    against 230 keys: a ragged last tile of rows, M < N."""
    p = Problem(batch=2, m_rows=203, n=230, heads=8, kv_heads=2, head_dim=32, value_dim=16, block_size=16,
                num_blocks=5, select=random_indices)
    inputs = make_inputs(p, DTYPES[dtype], seed=11)
    results = []
    for name in CPU_TARGETS:
        with cpu_target(name):
            q, k, v, _, idx, _ = inputs
            assert describe(q, k, v, idx, p.block_size).target_cpu == name      # two different artifacts
            results.append(run_poisoned(p, *inputs))
    assert_bitwise_equal(*results)


@pytest.mark.parametrize("variant", ("two-pass", "one-pass"))
def test_float32_dk_dv_are_the_sums_the_input_dtype_rounds(variant):
    """The backward that leaves dk and dv in float32 (what nsa_iree.distributed adds across ranks) holds the sums
    the default one rounds: rounded once they are its bits (two-pass), or within the atomics' reordering
    (one-pass); dq is the same."""
    from nsa_iree.api import backward_into

    p = Problem(batch=2, m_rows=150, n=170, heads=8, kv_heads=2, head_dim=32, value_dim=16, block_size=16,
                num_blocks=5, select=realistic_indices)
    inputs = make_inputs(p, DTYPES["bf16"], seed=13)
    o, lse, dq, dk, dv = run_poisoned(p, *inputs, variant=variant)
    q, k, v, do, block_indices, counts = inputs
    idx = effective_block_indices(block_indices, counts)
    dq32 = torch.full_like(q, float("nan"))
    dk32, dv32 = (torch.full(t.shape, float("nan")) for t in (k, v))
    backward_into(dq32, dk32, dv32, q, k, v, o, lse, do, idx, p.block_size, p.head_dim ** -0.5, variant)
    assert not any(torch.isnan(t).any() for t in (dq32, dk32, dv32))
    assert_bitwise_equal([dq32], [dq], names=("dq",))
    if variant == "two-pass":
        assert_bitwise_equal([dk32.to(dk.dtype), dv32.to(dv.dtype)], [dk, dv], names=("dk", "dv"))
    else:
        for wide, narrow in ((dk32, dk), (dv32, dv)):      # atomics reorder the sums: a few bf16 roundings flip
            assert relative_rms_error(wide.to(narrow.dtype), narrow) < ONE_PASS_REORDERING
