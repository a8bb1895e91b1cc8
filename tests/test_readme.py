"""Every ```python block of README.md runs, in order, in one namespace (later blocks use earlier names).

The only change made to the text: the README's token count, 4096, becomes 256 (SHRINK), so that the blocks
run in seconds on a CPU. Nothing else is edited, so a README that breaks for its readers breaks here.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parent.parent / "README.md"
SHRINK = {r"\b4096\b": "256"}


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
        for pattern, small in SHRINK.items():
            block = re.sub(pattern, small, block)
        exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
    # What the blocks promise: shapes and gradients.
    q, o, y = namespace["q"], namespace["o"], namespace["y"]
    assert o.shape == (1, 256, 16, 128) and q.grad is not None and q.grad.shape == q.shape
    assert y.dtype == torch.bfloat16
