"""Every ```python block of README.md runs, in order, in one namespace (later blocks use earlier names);
a block that starts with "# train.py, run with `torchrun" runs as that script under torchrun, 2 processes
(on this machine: CPU processes with gloo, as the block itself chooses without a GPU).

The only change made to the text: the README's token count, 4096, becomes 256 (SHRINK), so that the blocks
run in seconds on a CPU. Nothing else is edited, so a README that breaks for its readers breaks here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

README = Path(__file__).resolve().parent.parent / "README.md"
SHRINK = {r"\b4096\b": "256"}
TORCHRUN = "# train.py, run with `torchrun"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_has_python_blocks_to_run():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 3
    assert any("4096" in block for block in blocks)     # the substitution below does something


def test_every_python_block_of_the_readme_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                         # nothing may depend on the checkout as cwd
    torch.manual_seed(0)
    namespace = {"__name__": "__readme__"}
    for i, block in enumerate(python_blocks(README.read_text())):
        if block.startswith(TORCHRUN):
            continue
        for pattern, small in SHRINK.items():
            block = re.sub(pattern, small, block)
        exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
    # What the blocks promise: shapes and gradients.
    q, o, y = namespace["q"], namespace["o"], namespace["y"]
    assert o.shape == (1, 256, 16, 128) and q.grad is not None and q.grad.shape == q.shape
    assert y.dtype == torch.bfloat16


def test_the_torchrun_block_runs_on_two_processes(tmp_path):
    """The multi-GPU example, as the script it says it is, on 2 CPU processes (after the blocks above: its
    kernels are the first block's, already in the cache)."""
    (block,) = [b for b in python_blocks(README.read_text()) if b.startswith(TORCHRUN)]
    for pattern, small in SHRINK.items():
        block = re.sub(pattern, small, block)
    (tmp_path / "train.py").write_text(block)
    env = dict(os.environ, NSA_IREE_CPU_THREADS="1", OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in (0, 1):                                  # 128 tokens each
        assert f"rank {rank}: o (1, 128, 16, 128), k.grad (1, 128, 1, 192)" in result.stdout, result.stdout


def test_every_result_file_the_readme_and_docs_cite_exists():
    """A `bench/results/NAME` the README or docs/ names is in the repository (archived runs are cited by no one)."""
    repo = README.parent
    missing = []
    for doc in [README, *sorted((repo / "docs").glob("*.md"))]:
        for name in re.findall(r"bench/results/([\w.\-]+\.(?:md|json|png|txt|log))", doc.read_text()):
            if not (repo / "bench" / "results" / name).exists():
                missing.append(f"{doc.name}: {name}")
    assert not missing, missing
