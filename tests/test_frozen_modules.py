"""The safety net of kernel-layer restructures: every rendered module of the reference layouts, normalised (parsed
by IREE's MLIR and printed again: comments, blank lines and SSA names gone), has the digest frozen in
tests/frozen_modules.json. A change to the templates, recipes or renderer that is meant to move text around
leaves every digest as it is; one that changes a module on purpose is GPU-checked on the H200
(bench/gpu_checks.py, bench/kernel_checks.py) and refreezes, saying so in its commit:

    python tests/test_frozen_modules.py update          # write the digests of this checkout
    python tests/test_frozen_modules.py diff REV DIR    # normalised modules of this checkout and of git REV, to diff
"""

from __future__ import annotations

import hashlib
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

FROZEN = Path(__file__).with_name("frozen_modules.json")

LAYOUTS = {  # the anchors, paper and fla-default (D 64) layouts
    "anchors": dict(heads=64, kv_heads=4, head_dim=128, value_dim=128, block_size=64, num_blocks=16),
    "paper": dict(heads=64, kv_heads=4, head_dim=192, value_dim=128, block_size=64, num_blocks=16),
    "d64": dict(heads=64, kv_heads=4, head_dim=64, value_dim=64, block_size=64, num_blocks=16),
}
TARGET_DTYPES = {"cpu": ("f32", "bf16"), "cuda": ("bf16",), "gfx950": ("bf16",), "gfx942": ("bf16",)}
VARIANTS = ("forward", "two-pass", "one-pass")


def cases():
    for (layout, shape), (target, dtypes), variant in itertools.product(LAYOUTS.items(), TARGET_DTYPES.items(),
                                                                        VARIANTS):
        for dtype in dtypes:
            yield f"{layout}-{target}-{dtype}-{variant}", dict(shape, dtype=dtype, target=target), variant
    # the backward with dk/dv left in f32 (nsa_iree.distributed's, for 16-bit inputs)
    for target, variant in itertools.product(TARGET_DTYPES, VARIANTS[1:]):
        fields = dict(LAYOUTS["anchors"], dtype="bf16", target=target, dkdv_dtype="f32")
        yield f"anchors-{target}-bf16-dkdvf32-{variant}", fields, variant
    # the compressed attention's modules (nsa_iree.compression: key_stride 64, 64k tokens' 16 tiles of 64 keys)
    for target, variant in itertools.product(TARGET_DTYPES, VARIANTS[:2]):
        fields = dict(LAYOUTS["anchors"], dtype="bf16", target=target, key_stride=64)
        yield f"anchors-{target}-bf16-stride64-{variant}", fields, variant
    # the sliding window's (nsa_iree.window: a window of 512, T 9 blocks of 64; the CPU, NVIDIA and portable (gfx950)
    # kernels with the band's mask)
    for (target, dtype), variant in itertools.product((("cpu", "f32"), ("cuda", "bf16"), ("gfx950", "bf16")),
                                                      VARIANTS[:2]):
        fields = dict(LAYOUTS["anchors"], dtype=dtype, target=target, num_blocks=9, window=512)
        yield f"anchors-{target}-{dtype}-window512-{variant}", fields, variant
    # the window's forward and two-pass backward on the hopper target's wgmma kernels (the anchors and D 64 layouts;
    # its one-pass is cuda's: compiler.shared_spec)
    for layout in ("anchors", "d64"):
        fields = dict(LAYOUTS[layout], dtype="bf16", target="hopper", num_blocks=9, window=512)
        for variant in VARIANTS[:2]:
            yield f"{layout}-hopper-bf16-window512-{variant}", fields, variant
    # wide groups' forward (kernels.WIDE; 32 and 64 heads per kv head) on cuda
    for kv_heads in (2, 1):
        fields = dict(LAYOUTS["anchors"], kv_heads=kv_heads, dtype="bf16", target="cuda")
        yield f"anchors-cuda-bf16-hpg{64 // kv_heads}-forward", fields, "forward"
    # and 64 heads per kv head on the hopper target's wgmma forward (gpu/hopper/wide_forward.mlir)
    fields = dict(LAYOUTS["anchors"], kv_heads=1, dtype="bf16", target="hopper")
    yield "anchors-hopper-bf16-hpg64-forward", fields, "forward"
    # and 4 and 1 heads per kv head on the forward over the block lists' pieces (gpu/hopper/forward_pieces.mlir)
    for heads in (16, 4):
        fields = dict(LAYOUTS["anchors"], heads=heads, dtype="bf16", target="hopper")
        yield f"anchors-hopper-bf16-hpg{heads // 4}-forward", fields, "forward"
    # the selection's two-pass on the hopper target: dk/dv on wgmma (gpu/hopper/dkdv.mlir) at 16, 4 and 1 heads per
    # kv head, and dq too at 64 (gpu/hopper/wide_dq.mlir)
    for heads, kv_heads in ((64, 4), (16, 4), (4, 4), (64, 1)):
        fields = dict(LAYOUTS["anchors"], heads=heads, kv_heads=kv_heads, dtype="bf16", target="hopper")
        yield f"anchors-hopper-bf16-hpg{heads // kv_heads}-two-pass", fields, "two-pass"
    # select_blocks (T its 16 output slots, BS the compression's block size): the CPU, NVIDIA and portable (gfx950,
    # gfx942) kernels
    for target, dtype in [*(("cpu", dtype) for dtype in TARGET_DTYPES["cpu"]), ("cuda", "bf16"), ("gfx950", "bf16"),
                          ("gfx942", "bf16")]:
        yield f"anchors-{target}-{dtype}-select", dict(LAYOUTS["anchors"], dtype=dtype, target=target), "select"


def normalised(fields: dict, variant: str) -> str:
    from iree.compiler import ir

    from nsa_iree.render import render_module
    from nsa_iree.spec import KernelSpec

    with ir.Context():
        return str(ir.Module.parse(render_module(KernelSpec(**fields), variant)))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def frozen() -> dict:
    return json.loads(FROZEN.read_text())


@pytest.mark.parametrize("name, fields, variant", list(cases()), ids=[name for name, _, _ in cases()])
def test_rendered_module_is_the_frozen_one(name, fields, variant, frozen):
    assert name in frozen, f"{name} has no frozen digest: python tests/test_frozen_modules.py update"
    assert digest(normalised(fields, variant)) == frozen[name], (
        f"{name}: the rendered module changed; if on purpose, GPU-check it and refreeze "
        f"(python tests/test_frozen_modules.py diff HEAD /tmp/frozen shows what changed)")


def _update() -> None:
    table = {name: digest(normalised(fields, variant)) for name, fields, variant in cases()}
    FROZEN.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"{len(table)} digests written to {FROZEN}")


def _diff(rev: str, out: str) -> None:
    """This checkout's normalised modules under OUT/now, git REV's under OUT/REV (a worktree of REV renders them)."""
    repo = Path(__file__).resolve().parent.parent
    out_dir = Path(out)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", tmp, rev], check=True)
        try:
            for where, root in (("now", repo), (rev, Path(tmp))):
                script = (f"import sys; sys.path[:0] = [{str(root)!r}, {str(Path(__file__).resolve().parent)!r}]\n"
                          "import test_frozen_modules as f\n"
                          "from pathlib import Path\n"
                          f"d = Path({str(out_dir / where)!r}); d.mkdir(parents=True, exist_ok=True)\n"
                          "for name, fields, variant in f.cases():\n"
                          "    (d / f'{name}.mlir').write_text(f.normalised(fields, variant))\n")
                subprocess.run([sys.executable, "-c", script], check=True, cwd=root)
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", tmp], check=True)
    print(f"diff -r {out_dir / rev} {out_dir / 'now'}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["update"]:
        _update()
    elif sys.argv[1:2] == ["diff"] and len(sys.argv) == 4:
        _diff(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
