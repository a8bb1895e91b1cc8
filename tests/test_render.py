"""The renderer's rules (nsa_iree/render.py): macro files state what they take, every name has a value, each
family's values reach only its own templates."""

from __future__ import annotations

import re
import shutil

import pytest

from nsa_iree import render
from nsa_iree.kernels import FAMILIES, choose
from nsa_iree.recipes import load_recipe
from nsa_iree.spec import KernelSpec

KERNELS = render.KERNELS_DIR
IMPORT = re.compile(r"""<%\s*(?:from|import)\s+["']([\w/.]+)["']""")
IMPORTED = sorted({name for f in KERNELS.rglob("*.mlir") for name in IMPORT.findall(f.read_text())})


INCLUDE = re.compile(r"""<%\s*include\s+["']([\w/.]+)["']""")
PARTS = sorted({name for f in KERNELS.rglob("*.mlir") for name in INCLUDE.findall(f.read_text())})


@pytest.mark.parametrize("name", PARTS)
def test_every_part_declares_the_names_it_takes(name):
    render.check_part(name)


@pytest.mark.parametrize("name", IMPORTED)
def test_every_macro_file_uses_only_its_arguments_and_the_configuration(name):
    render.check_macro_library(name)


@pytest.fixture
def kernels_copy(tmp_path, monkeypatch):
    copy = tmp_path / "kernels"
    shutil.copytree(KERNELS, copy)
    monkeypatch.setattr(render, "KERNELS_DIR", copy)
    render.check_macro_library.cache_clear()
    render.check_part.cache_clear()
    yield copy
    render.check_macro_library.cache_clear()
    render.check_part.cache_clear()


# (the check, the faulty file's text, the name its error must carry)
FAULTS = {
    # a macro reading a family value it was not given
    "macro_free_name": ("check_macro_library", "<% macro m(x) %>${x} ${LANES}<% endmacro %>\n", "LANES"),
    # text outside a macro would be rendered into every importer
    "macro_file_text_outside_macros": ("check_macro_library",
                                       "%stray = arith.constant 0 : index\n<% macro m(x) %>${x}<% endmacro %>\n",
                                       "line"),
    "part_without_declaration": ("check_part", "%x = arith.constant ${LANES} : index\n", "opens with"),
    "part_undeclared_name": ("check_part",
                             "<# part: takes LANES #>\n%x = arith.constant ${LANES} : index ${D_TILES}\n", "D_TILES"),
    "part_declared_but_unused": ("check_part", "<# part: takes LANES, PAD #>\n%x = arith.constant ${LANES} : index\n",
                                 "PAD"),
}


@pytest.mark.parametrize("check, text, named", FAULTS.values(), ids=list(FAULTS))
def test_a_faulty_macro_file_or_part_is_an_error_naming_the_fault(kernels_copy, check, text, named):
    (kernels_copy / "common" / "faulty.mlir").write_text(text)
    with pytest.raises(ValueError, match=named):
        getattr(render, check)("common/faulty.mlir")


def test_a_name_without_a_value_is_an_error_naming_it(kernels_copy):
    forward = kernels_copy / "linalg" / "forward.mlir"
    forward.write_text(forward.read_text() + "\n// ${NO_SUCH_VALUE}\n")
    with pytest.raises(KeyError, match="NO_SUCH_VALUE"):
        render.render_module(KernelSpec(kernels="linalg"), "forward")


SPECS = {
    "cpu": KernelSpec(heads=16, kv_heads=1, head_dim=64, value_dim=64, dtype="bf16"),
    "cuda": KernelSpec(heads=64, kv_heads=4, head_dim=128, value_dim=128, dtype="bf16", target="cuda"),
    "gfx950": KernelSpec(heads=64, kv_heads=4, head_dim=128, value_dim=128, dtype="bf16", target="gfx950"),
    "hopper": KernelSpec(heads=64, kv_heads=4, head_dim=128, value_dim=128, dtype="bf16", target="hopper"),
    "hopper_hpg64": KernelSpec(heads=64, kv_heads=1, head_dim=128, value_dim=128, dtype="bf16", target="hopper"),
}


@pytest.mark.parametrize("spec", SPECS.values(), ids=list(SPECS))
def test_each_family_gets_its_own_values_only(spec):
    """No family's values redefine the configuration's or the recipe's (template_values raises if one does), and
    the module renders each stage from the template of the family choose() picked."""
    recipe = load_recipe(spec.target)
    for family in FAMILIES.values():
        render.template_values(spec, recipe, family)
    rendered = {name for name, family in render.module_templates(spec, "two-pass", recipe)}
    chosen = {stage: choose(stage, spec, recipe) for stage in ("dq", "dkdv")}
    assert all(FAMILIES[c.family].template(c.template or stage) in rendered for stage, c in chosen.items())


def test_rendering_reads_no_environment(tmp_path, monkeypatch):
    """A module is a function of (spec, variant, recipe): the kernel choice is the spec's (KernelSpec.kernels), the
    recipe the caller's; $NSA_IREE_KERNELS and $NSA_IREE_PIPELINES_DIR (read where specs and recipes are made)
    change nothing a renderer does."""
    spec = SPECS["cuda"]
    before = render.render_module(spec, "two-pass")
    sweep = tmp_path / "pipelines"
    shutil.copytree(render.PIPELINES_DIR, sweep)
    recipe = sweep / "cuda.toml"
    recipe.write_text(recipe.read_text().replace('dq = "nvidia"', 'dq = "linalg"'))
    monkeypatch.setenv("NSA_IREE_PIPELINES_DIR", str(sweep))
    monkeypatch.setenv("NSA_IREE_KERNELS", "linalg")
    assert render.render_module(spec, "two-pass") == before
    assert render.render_module(spec, "two-pass", load_recipe("cuda")) != before     # the sweep's recipe, given


# A module holding a kernel of a family that names its device (gpu/hopper/: sm_90a, which the compile flags cannot
# name) names it: its aliases first, then its operations in a module whose default device is that target; every
# other module is the flags' (the hopper target's selection modules are cuda's, one artifact for both:
# compiler.shared_spec).
HOPPER_WINDOW = SPECS["cuda"].replace(target="hopper", num_blocks=9, window=512)
DEVICE_NAMING = [
    ("hopper_window_forward", HOPPER_WINDOW, "forward", True, "hopper"),
    ("hopper_window_two_pass", HOPPER_WINDOW, "two-pass", True, "hopper"),
    ("hopper_window_one_pass", HOPPER_WINDOW, "one-pass", False, "cuda"),
    ("hopper_compressed_two_pass", SPECS["cuda"].replace(target="hopper", key_stride=64), "two-pass", False, "cuda"),
    ("hopper_selection_forward", SPECS["cuda"].replace(target="hopper"), "forward", False, "cuda"),
    ("hopper_hpg64_forward", SPECS["cuda"].replace(target="hopper", kv_heads=1), "forward", True, "hopper"),
    ("hopper_selection_two_pass", SPECS["cuda"].replace(target="hopper"), "two-pass", True, "hopper"),   # dk/dv
    ("hopper_hpg64_two_pass", SPECS["cuda"].replace(target="hopper", kv_heads=1), "two-pass", True, "hopper"),
    ("hopper_hpg64_one_pass", SPECS["cuda"].replace(target="hopper", kv_heads=1), "one-pass", False, "cuda"),
    ("hopper_compressed_forward", SPECS["cuda"].replace(target="hopper", key_stride=64), "forward", False, "cuda"),
    ("cuda_window_forward", HOPPER_WINDOW.replace(target="cuda"), "forward", False, "cuda"),
]


@pytest.mark.parametrize("case, spec, variant, names_device, artifact_target", DEVICE_NAMING,
                         ids=[c[0] for c in DEVICE_NAMING])
def test_a_module_names_its_device_where_a_family_needs_one(case, spec, variant, names_device, artifact_target):
    from nsa_iree.compiler import shared_spec

    lines = render.render_module(spec, variant).splitlines()
    opening = [i for i, line in enumerate(lines) if line.startswith("module attributes")]
    assert bool(opening) == names_device
    if names_device:
        (first,) = opening
        assert 'arch = "sm_90a"' in lines[first + 1] and lines[-1] == "}"
        assert not any(re.match(r"[#!][\w.$-]+\s*=", line) for line in lines[first:])    # aliases before it
    assert shared_spec(spec, variant).target == artifact_target


def test_an_nvidia_gpu_of_compute_capability_9_runs_the_hopper_recipe(monkeypatch):
    import torch

    from nsa_iree import api

    monkeypatch.setattr(torch.version, "hip", None)
    for capability, target in (((9, 0), "hopper"), ((8, 0), "cuda"), ((8, 9), "cuda"), ((10, 0), "cuda")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert api._target_for(torch.device("cuda")) == target
