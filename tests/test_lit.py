"""Run the IR-level lit suite (tests/lit, one file per lowering behaviour) as part of pytest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LIT_DIR = Path(__file__).parent / "lit"


@pytest.mark.parametrize("test", sorted(p.name for p in LIT_DIR.glob("*.test")))
def test_lit(test, tmp_path):
    run_lit = "import sys; from lit.main import main; sys.argv = ['lit'] + sys.argv[1:]; main()"
    result = subprocess.run([sys.executable, "-c", run_lit, "-v", str(LIT_DIR / test)], capture_output=True,
                            text=True, env={**os.environ, "NSA_IREE_LIT_OUT": str(tmp_path)})
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
