"""The package as users get it: a wheel built from (a copy of) the checkout, installed into an empty directory,
runs a forward and a backward from another directory, with no access to the checkout.

The wheel is built with `pip wheel --no-deps` (without build isolation when a setuptools that can build
wheels is installed, else pip fetches one) and installed with `pip install --no-deps --target`; torch and
IREE come from the running interpreter's site-packages. The kernels of the small problem below are the
ones tests/test_api.py compiles, so with a shared NSA_IREE_CACHE_DIR nothing is compiled again.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import sys, torch, nsa_iree
    from pathlib import Path
    assert Path(nsa_iree.__file__).resolve().is_relative_to(Path(sys.argv[1]).resolve()), nsa_iree.__file__
    B, M, N, H, G, D, DV, BS, T = 2, 40, 56, 4, 2, 16, 8, 8, 3
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, n, h, d, generator=gen, requires_grad=True)
               for n, h, d in ((M, H, D), (N, G, D), (N, G, DV)))
    idx = torch.randint(-1, N // BS, (B, M, G, T), generator=gen)
    o = nsa_iree.selection_attention(q, k, v, idx, block_size=BS)
    do = torch.randn_like(o)
    o.backward(do)
    ref = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    o_ref, _ = nsa_iree.selection_attention_reference(*ref, idx, BS)
    o_ref.backward(do.double())
    errors = [nsa_iree.testing.relative_rms_error(a, b) for a, b in
              zip([o.detach(), q.grad, k.grad, v.grad], [o_ref.detach()] + [t.grad for t in ref])]
    assert max(errors) < 1e-5, errors
    print("forward and backward ok", nsa_iree.__file__)
""")


def _pip(*args, cwd):
    result = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], cwd=cwd,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _can_build_without_isolation() -> bool:
    """setuptools >= 68 (pyproject's requirement) that can make wheels: itself from 70.1 on, else with `wheel`."""
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(p) for p in setuptools.__version__.split(".")[:2] if p.isdigit())
    return version >= (70, 1) or (version >= (68,) and importlib.util.find_spec("wheel") is not None)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel, target): the wheel built from a copy of the checkout, and the directory it is installed in."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"                             # a copy: building writes build/ and egg-info
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "nsa_iree", source / "nsa_iree", ignore=shutil.ignore_patterns("__pycache__"))
    isolation = ["--no-build-isolation"] if _can_build_without_isolation() else []
    _pip("wheel", "--no-deps", *isolation, "-w", str(tmp / "dist"), str(source), cwd=tmp)
    (wheel,) = (tmp / "dist").glob("nsa_iree-*.whl")
    target = tmp / "site"
    _pip("install", "--no-deps", "--target", str(target), str(wheel), cwd=tmp)
    return wheel, target


def test_wheel_holds_the_templates_and_recipes_and_nothing_of_the_checkout(installed):
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels = ROOT / "nsa_iree" / "kernels"
    templates = {p.relative_to(kernels).as_posix() for p in kernels.rglob("*.mlir")}
    recipes = {p.name for p in (ROOT / "nsa_iree" / "pipelines").glob("*.toml")}
    assert templates and {f"nsa_iree/kernels/{n}" for n in templates} <= names
    assert {f"nsa_iree/pipelines/{n}" for n in recipes} <= names
    assert not any(n.startswith(("bench/", "tests/", "kernels/", "pipelines/")) for n in names), sorted(names)


def _run(target, *args, cwd):
    env = {**os.environ, "PYTHONPATH": str(target)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_installed_wheel_runs_forward_and_backward_from_another_directory(installed, tmp_path):
    _, target = installed
    result = _run(target, "-c", SCRIPT, str(target), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "forward and backward ok" in result.stdout and str(target) in result.stdout


def test_installed_command_line(installed, tmp_path):
    _, target = installed
    render = _run(target, "-m", "nsa_iree.cli", "render", "--target", "cuda", "--heads", "16", cwd=tmp_path)
    assert render.returncode == 0 and "nsa_iree: forward for h16g1" in render.stdout, render.stderr[-2000:]
    bench = _run(target, "-m", "nsa_iree.cli", "bench", "--smoke", "--out", str(tmp_path / "results"), cwd=tmp_path)
    assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-2000:]       # installed: no checkout needed
    assert list((tmp_path / "results").glob("*.md")), "no table written"
