"""The benchmark harness runs end to end (a tiny CPU smoke run: no timing is asserted), and its torch-eager
baseline computes what the reference computes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench import main  # noqa: E402


def test_bench_smoke_run_writes_table_and_record(tmp_path, monkeypatch):
    """`nsa-iree bench` without --out writes under the current directory, never into the checkout."""
    from nsa_iree import cli

    checked_in = sorted((REPO / "bench" / "results").rglob("*"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "--smoke"]) == 0
    out = tmp_path / "nsa_iree_results"
    record = json.loads(next(out.glob("*.json")).read_text())
    assert all("error" not in row for row in record["rows"]), record["rows"]
    assert {row["impl"] for row in record["rows"]} >= {"nsa_iree two-pass", "nsa_iree one-pass", "dense sdpa"}
    for key in ("errors", "one-pass_errors"):                       # f32 config: the f32 tolerance
        assert all(err < 1e-5 for err in record["checks"]["realistic"][key].values()), key
    md = next(out.glob("*.md")).read_text()
    assert "| realistic | 256 | nsa_iree two-pass |" in md
    assert record["config"]["name"] == "tiny"
    assert sorted((REPO / "bench" / "results").rglob("*")) == checked_in


# --branch: what each CPU run times (the CUDA-only baselines, fla and FlexAttention, are left out there)
BRANCH_RUNS = {"layer": {"nsa_iree nsa", "nsa_iree nsa + window", "torch eager nsa + window"},
               "window": {"nsa_iree window", "torch eager window"},
               "compression": {"nsa_iree compression", "torch eager compression"},
               "select": {"nsa_iree select_blocks", "torch eager select_blocks"}}
CHECKED = {"layer": {"o", "dq", "dk", "dv", "dg_cmp", "dg_slc", "dg_swa"}, "window": {"o", "dq", "dk", "dv"},
           "compression": {"o", "lse", "dq", "dk", "dv"}, "select": {"ids"}}


@pytest.mark.parametrize("branch", list(BRANCH_RUNS))
def test_bench_branch_checks_then_times_its_implementations(tmp_path, monkeypatch, branch):
    """`nsa-iree bench --branch layer|window|compression|select`: nsa_iree checked against the f64 oracle (o and
    every gradient, the gates' too; select_blocks' ids), then every CPU implementation timed (each of the branch's
    timed columns, with its rates), in a table of its own. The modules the run loads are the ones
    bench/branches_h200.py compiles for the GPU (the same list on the CPU target)."""
    from bench.branches_h200 import run_specs
    from nsa_iree import api, benchmark

    loaded = []
    kernels = api.kernels

    def recording(spec, variant, device):
        loaded.append((spec, variant))
        return kernels(spec, variant, device)
    monkeypatch.setattr(api, "kernels", recording)
    record = main(["--device", "cpu", "--config", "tiny", "--branch", branch, "--seq", "256", "--repeats", "1",
                   "--window", "32", "--out", str(tmp_path)])
    check = record["checks"][branch]
    assert set(check["errors"]) == CHECKED[branch], check
    assert all(err < 1e-5 for err in check["errors"].values()), check
    if branch == "select":
        assert check["agreement"] == {"nsa_iree": 1.0, "torch eager": 1.0}, check
    assert all("error" not in row for row in record["rows"]), record["rows"]
    assert {row["impl"] for row in record["rows"]} == BRANCH_RUNS[branch]
    for row in record["rows"]:
        for name in benchmark.TIMED[branch]:
            assert row[f"{name}_ms"] > 0 and row[f"{name}_tflops"] > 0 and row[f"{name}_tbps"] > 0, row
    md = next(tmp_path.glob(f"tiny_{branch}_*.md")).read_text()
    ours = [line for line in md.splitlines() if line.startswith(f"| {branch} | 256 | nsa_iree")]
    assert ours and any("| torch eager " in line for line in ours), md          # the ratio to the eager baseline
    assert set(loaded) == set(run_specs("tiny", branch, [256], 32, target="cpu"))


@pytest.mark.parametrize("option, value", [("--branch", "compressed"), ("--config", "fla_default")])
def test_bench_bad_branch_or_config_is_a_usage_error(capsys, option, value):
    """A --branch or --config the benchmark does not have: argparse's one-line error naming the choices, exit 2."""
    from nsa_iree import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "--device", "cpu", option, value])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: invalid choice: '{value}'" in err
    assert ("compression" if option == "--branch" else "fla-default") in err


def test_branch_work_counts_the_visible_keys():
    """The FLOP counts' visible (row, key) pairs against a loop over the positions: the compressed blocks complete
    at each row, the window's keys."""
    from nsa_iree.benchmark import _visible_compressed, _visible_window

    for seq, bs in ((1, 16), (63, 64), (64, 64), (200, 16), (4096, 64)):
        assert _visible_compressed(seq, bs) == sum((p + 1) // bs for p in range(seq))
    for seq, w in ((5, 8), (8, 8), (300, 32), (4096, 512)):
        assert _visible_window(seq, w) == sum(min(p + 1, w) for p in range(seq))


def test_bench_out_option(tmp_path):
    record = main(["--smoke", "--out", str(tmp_path / "elsewhere"), "--impl", "dense sdpa"])
    assert record["rows"] and next((tmp_path / "elsewhere").glob("*.md"))


def test_sweep_variants_load_their_own_recipe(tmp_path):
    """A sweep variant is compiled from, and run with, its own recipe: rows_per_piece 32 changes the
    artifact (a different rendered inversion) but not the gradients."""
    from bench import sweep

    import os

    before = {key: os.environ.get(key) for key in ("NSA_IREE_CACHE_DIR", "NSA_IREE_PIPELINES_DIR")}
    sweep.main(["prepare", "--target", "cpu", "--config", "tiny", "--dir", str(tmp_path),
                "--variants", "rows_per_piece 32"])
    recipes = sorted(p.name for p in (tmp_path / "recipes").iterdir())
    assert recipes == ["baseline", "rows_per_piece_32"]
    assert "rows_per_piece = 32" in (tmp_path / "recipes" / "rows_per_piece_32" / "cpu.toml").read_text()
    assert len(list((tmp_path / "artifacts").glob("two-pass_*.vmfb"))) == 2
    sweep.main(["run", "--device", "cpu", "--config", "tiny", "--dir", str(tmp_path), "--seq", "200",
                "--repeats", "1", "--out", str(tmp_path / "out"), "--target", "cpu"])
    rows = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert [r["variant"] for r in rows] == ["baseline", "rows_per_piece 32"]
    assert all("bwd_ms" in r for r in rows), rows
    assert rows[1]["difference"] < 1e-5, rows                           # (the baseline is its own reference)
    assert {key: os.environ.get(key) for key in before} == before       # the sweep leaves no variant selected


def test_compile_check_passes_on_cpu(capsys):
    """bench/compile_check.py (the script run on the GPU): every check passes in a tiny CPU run."""
    from bench import compile_check

    assert compile_check.main(["--device", "cpu", "--config", "tiny", "--seq", "128", "--repeats", "1"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")


def test_bench_packed_selection_runs_and_checks_against_the_reference(tmp_path):
    """The packed row (documents with cu_seqlens): checked against the f64 reference run document by
    document, timed for nsa_iree and for the same kernels on inputs given in the padded layout."""
    record = main(["--device", "cpu", "--config", "tiny", "--seq", "300", "--repeats", "1", "--selection", "packed",
                   "--doc-lengths", "20", "120", "--impl", "nsa_iree two-pass", "nsa_iree two-pass, padded given",
                   "dense sdpa", "--out", str(tmp_path)])
    assert all(err < 1e-5 for err in record["checks"]["packed"]["errors"].values()), record["checks"]
    rows = record["rows"]
    assert [r["impl"] for r in rows] == ["nsa_iree two-pass", "nsa_iree two-pass, padded given"], rows
    assert all("error" not in r and r["documents"] >= 3 for r in rows), rows
    assert "| packed | 300 (" in next(tmp_path.glob("*.md")).read_text()


def test_distributed_bench_smoke_run_on_two_gloo_ranks(tmp_path):
    """bench/distributed_bench.py (the 2 x H200 script) end to end under torchrun, on CPU with gloo: the check
    passes, every length has a row and no error, the table is written. Nothing about its timings is asserted."""
    import os
    import subprocess

    from bench import distributed_bench

    distributed_bench.main(["precompile", "--smoke"])          # here, so the two ranks only load the artifacts
    env = dict(os.environ, NSA_IREE_CPU_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", "bench.distributed_bench", "run", "--smoke", "--out", str(tmp_path)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((tmp_path / "distributed_2xcpu.json").read_text())
    assert [row["seq"] for row in record["rows"]] == [256, 512]
    assert all("error" not in row for row in record["rows"]), record["rows"]
    assert all(err < 1e-5 for rank in record["check"] for err in rank.values()), record["check"]
    assert "| 512 |" in (tmp_path / "distributed_2xcpu.md").read_text()


EAGER_CASES = {
    # name: (M, N, block ids drawn from [-1, NB + 1): skipped, out-of-range and repeated slots included)
    "square": (40, 40),
    "m_below_n": (24, 56),
    "rows_without_keys": (40, 40),     # every slot of the first rows skipped (below)
}


@pytest.mark.parametrize("case", EAGER_CASES, ids=list(EAGER_CASES))
def test_torch_eager_baseline_matches_the_reference(case):
    """The benchmark's torch-eager baseline computes selection attention and its gradients: against the f64
    reference (skipped, future and repeated slots, rows that see nothing)."""
    from bench.bench import torch_eager_selection_attention
    from nsa_iree.reference import selection_attention_reference
    from nsa_iree.testing import relative_rms_error

    m, n = EAGER_CASES[case]
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, m, 4, 8, generator=gen), torch.randn(2, n, 2, 8, generator=gen),
               torch.randn(2, n, 2, 6, generator=gen))
    do = torch.randn(2, m, 4, 6, generator=gen)
    idx = torch.randint(-1, -(-n // 8) + 1, (2, m, 2, 5), generator=gen, dtype=torch.int32)
    if case == "rows_without_keys":
        idx[:, :5] = -1
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref_leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    o = torch_eager_selection_attention(*leaves, idx, 8)
    o_ref, _ = selection_attention_reference(*ref_leaves, idx, 8)
    o.backward(do.double())
    o_ref.backward(do.double())
    assert relative_rms_error(o, o_ref) < 1e-12
    for a, b in zip(leaves, ref_leaves):
        assert relative_rms_error(a.grad, b.grad) < 1e-12
    if case == "rows_without_keys":
        assert torch.all(o[:, :5] == 0) and torch.all(leaves[0].grad[:, :5] == 0)


def test_atomics_issued_counts_every_visible_key_of_every_selected_slot():
    """bench.kernel_checks.atomics_issued (the one-pass floor's numerator) against a plain loop: slots past the
    row's position, negative and past-the-end ones add nothing, a slot listed twice adds twice, the diagonal
    block adds only the keys up to the row, M < N shifts the rows to the end."""
    from bench.kernel_checks import atomics_issued

    gen = torch.Generator().manual_seed(0)
    batch, m_rows, n, groups, slots, bs, dims = 2, 150, 230, 2, 5, 16, 7
    nb = -(-n // bs)
    idx = torch.randint(-2, nb + 3, (batch, m_rows, groups, slots), generator=gen, dtype=torch.int32)
    idx[:, :, :, 1] = idx[:, :, :, 0]                         # duplicates
    expected = 0
    for b in range(batch):
        for m in range(m_rows):
            pos = m + n - m_rows
            for g in range(groups):
                for t in range(slots):
                    i = int(idx[b, m, g, t])
                    if i >= 0 and i * bs <= pos:
                        expected += min(pos - i * bs + 1, bs) * dims
    assert expected > 0
    assert atomics_issued(idx, m_rows, n, bs, dims) == expected


def test_layer_cpu_runs_and_agrees_with_its_eager_layer(capsys):
    """bench/layer_cpu.py at a small size: one table row, nsa_iree's layer within f32 rounding of the eager one."""
    from bench import layer_cpu

    layer_cpu.main(["--seq", "512", "--repeats", "1", "--window", "64"])
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 512 |")]
    assert len(row) == 1
    assert float(row[0].rstrip(" |").rsplit("|", 1)[-1]) < 1e-5
