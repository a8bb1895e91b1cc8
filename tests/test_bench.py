"""The benchmark harness runs end to end (a tiny CPU smoke run: no timing is asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench import main  # noqa: E402


def test_bench_smoke_run_writes_table_and_record(tmp_path):
    record = main(["--smoke", "--out", str(tmp_path)])
    assert all("error" not in row for row in record["rows"]), record["rows"]
    assert {row["impl"] for row in record["rows"]} >= {"nsa_iree two-pass", "nsa_iree one-pass", "dense sdpa"}
    assert all(err < 1e-5 for err in record["checks"]["realistic"]["errors"].values())
    md = next(tmp_path.glob("*.md")).read_text()
    assert "| realistic | 256 | nsa_iree two-pass |" in md
    assert json.loads(next(tmp_path.glob("*.json")).read_text())["config"]["name"] == "tiny"
