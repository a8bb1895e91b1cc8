"""Compile pipeline: one template set for every target, an on-disk cache that is hit and never stale."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import shutil
import warnings

import pytest
import torch

import nsa_iree
from nsa_iree import api, compiler, render
from nsa_iree.compiler import CompileError, compile_artifact
from nsa_iree.recipes import load_recipe
from nsa_iree.spec import DEMO_SPEC


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NSA_IREE_CACHE_DIR", str(tmp_path))
    api._artifact_path.cache_clear()
    yield tmp_path
    api._artifact_path.cache_clear()


def _without_attributes(spec, variant):
    """The module with the target's attributes left out and its tuning values (rows_per_piece) the CPU's."""
    recipe = load_recipe(spec.target)
    blank = type(recipe)(recipe.target, recipe.driver, recipe.flags, load_recipe("cpu").rows_per_piece, {})
    return "\n".join(render.render_template(name, spec, blank, family)
                     for name, family in render.module_templates(spec, variant, blank))


@pytest.mark.parametrize("variant", ["forward", "two-pass"])
def test_gfx950_renders_the_cpu_mlir_plus_attributes(variant):
    cpu, gfx = DEMO_SPEC, DEMO_SPEC.replace(target="gfx950")
    assert _without_attributes(cpu, variant) == _without_attributes(gfx, variant)
    assert "MFMA_F32_16x16x32_BF16" in render.render_module(gfx, variant)
    assert "#iree_gpu" not in render.render_module(cpu, variant)


@pytest.mark.parametrize("variant", ["forward", "two-pass"])
def test_gfx950_artifact_compiles(variant, fresh_cache):
    art = compile_artifact(DEMO_SPEC.replace(target="gfx950"), variant)
    data = art.path.read_bytes()
    assert len(data) > 10_000 and b"gfx950" in data


def test_other_sequence_lengths_and_batches_hit_the_cache(fresh_cache, monkeypatch):
    compiles = []
    real = compiler.compile_artifact

    def counting(*args, **kwargs):
        art = real(*args, **kwargs)
        compiles.append(art.compile_seconds > 0)
        return art

    monkeypatch.setattr(api, "compile_artifact", counting)
    for b, m, n in ((1, 32, 32), (3, 17, 70), (2, 64, 200)):
        q, k, v = torch.randn(b, m, 4, 16), torch.randn(b, n, 2, 16), torch.randn(b, n, 2, 8)
        idx = torch.randint(-1, 4, (b, m, 2, 3))
        nsa_iree.selection_attention_fwd(q, k, v, idx, block_size=16)
    assert compiles == [True]                       # compiled once, then served from memory and disk
    api._artifact_path.cache_clear()
    nsa_iree.selection_attention_fwd(q, k, v, idx, block_size=16)
    assert compiles == [True, False]                # a new process finds the vmfb on disk
    assert len(list(fresh_cache.glob("*.vmfb"))) == 1


@pytest.fixture
def edit_forward_template(tmp_path_factory, monkeypatch):
    """edit(change) renders from a copy of kernels/ whose linalg/forward.mlir is change(original text). Its tests
    select the linalg forward (KernelSpec.kernels="linalg": on cpu the recipe would render cpu/forward.mlir)."""

    def edit(change):
        copy = tmp_path_factory.mktemp("kernels") / "kernels"
        shutil.copytree(render.KERNELS_DIR, copy)
        forward = copy / "linalg" / "forward.mlir"
        forward.write_text(change(forward.read_text()))
        monkeypatch.setattr(render, "KERNELS_DIR", copy)
    return edit


def test_changed_template_never_loads_a_stale_artifact(fresh_cache, edit_forward_template):
    spec = DEMO_SPEC.replace(heads=2, kv_heads=1, head_dim=16, value_dim=16, block_size=16, num_blocks=2,
                             dtype="f32", kernels="linalg")
    first = compile_artifact(spec, "forward")
    edit_forward_template(lambda text: "// an edited comment\n" + text)
    second = compile_artifact(spec, "forward")
    assert second.key != first.key and second.path != first.path and second.compile_seconds > 0


def test_compile_error_carries_the_diagnostic_and_the_rendered_mlir(fresh_cache, edit_forward_template):
    edit_forward_template(lambda text: text.replace("linalg.fill", "linalg.fil", 1))
    with pytest.raises(CompileError) as err:
        compile_artifact(DEMO_SPEC.replace(dtype="f32", kernels="linalg"), "forward")
    message = str(err.value)
    assert "error:" in message and "rendered MLIR kept at" in message
    kept = message.split("rendered MLIR kept at ")[1].split("\n")[0]
    assert "linalg.fil " in open(kept).read()


def test_concurrent_compiles_of_one_key_do_not_corrupt_the_cache(fresh_cache):
    script = textwrap.dedent("""
        import torch, nsa_iree
        q, k, v = torch.randn(1, 24, 2, 8), torch.randn(1, 24, 1, 8), torch.randn(1, 24, 1, 8)
        idx = torch.randint(-1, 3, (1, 24, 1, 2))
        o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, block_size=8)
        assert torch.isfinite(o).all()
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(3)]
    assert [p.wait(timeout=600) for p in procs] == [0, 0, 0]
    assert len(list(fresh_cache.glob("*.vmfb"))) == 1
    assert not list(fresh_cache.glob(".*.tmp"))


def test_gpu_target_without_a_matrix_layout_for_the_dtype_is_refused_before_compiling(fresh_cache):
    with pytest.raises(ValueError, match=r"target cuda supports dtypes \['bf16', 'f16'\].*got f32"):
        compile_artifact(DEMO_SPEC.replace(target="cuda", dtype="f32"), "two-pass")
    assert not list(fresh_cache.glob("*"))


@pytest.mark.parametrize("target, block_size", [("cuda", 16), ("gfx950", 32), ("gfx942", 128)],
                         ids=["cuda-bs16", "gfx950-bs32", "gfx942-bs128"])
def test_block_size_a_target_cannot_compile_is_refused_before_compiling(fresh_cache, target, block_size):
    with pytest.raises(ValueError, match=rf"target {target} supports block_size in \[.*\].*got {block_size}"):
        compile_artifact(DEMO_SPEC.replace(target=target, block_size=block_size), "forward")
    assert not list(fresh_cache.glob("*"))


GPU_BLOCK_SIZES = [(target, bs) for target in ("cuda", "gfx950", "gfx942") for bs in load_recipe(target).block_sizes]


@pytest.mark.parametrize("target, block_size", GPU_BLOCK_SIZES, ids=[f"{t}-bs{bs}" for t, bs in GPU_BLOCK_SIZES])
def test_every_block_size_a_gpu_recipe_lists_compiles(fresh_cache, target, block_size):
    """The recipes' block_sizes lists are what compiles, for the forward and both backward variants."""
    spec = DEMO_SPEC.replace(target=target, heads=32, kv_heads=2, head_dim=128, block_size=block_size, num_blocks=6)
    for variant in ("forward", "two-pass", "one-pass"):
        assert compile_artifact(spec, variant).path.exists()


# A CPU without AVX-512, and one more: host fingerprints as nsa_iree.compiler reads them from /proc/cpuinfo.
NO_AVX512 = "x86_64 flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma"
THIRD_CPU = "x86_64 flags\t\t: fpu sse sse2"


def test_cpu_artifacts_are_keyed_and_served_by_the_host_cpu(fresh_cache, monkeypatch):
    """cpu artifacts are compiled for the host's CPU features (--iree-llvmcpu-target-cpu=host): another CPU
    gets its own key, and a runtime-only machine never serves an artifact compiled for another CPU."""
    spec = DEMO_SPEC.replace(heads=2, kv_heads=1, head_dim=16, value_dim=16, block_size=16, num_blocks=2, dtype="f32")
    this_cpu = compiler._host_fingerprint
    here = compile_artifact(spec, "forward")
    monkeypatch.setattr(compiler, "_host_fingerprint", lambda: NO_AVX512)
    elsewhere = compile_artifact(spec, "forward")
    assert elsewhere.key != here.key and elsewhere.compile_seconds > 0
    assert "host: " + NO_AVX512 in elsewhere.path.with_suffix(".flags").read_text()
    flags = load_recipe("cpu").flags
    text = render.render_module(spec, "forward")
    # Runtime only (no compiler): each host finds exactly its own artifact, a third one none.
    assert compiler._prebuilt(spec, "forward", text, flags, fresh_cache, False).path == elsewhere.path
    monkeypatch.setattr(compiler, "_host_fingerprint", this_cpu)
    assert compiler._prebuilt(spec, "forward", text, flags, fresh_cache, False).path == here.path
    monkeypatch.setattr(compiler, "_host_fingerprint", lambda: THIRD_CPU)
    with pytest.raises(CompileError, match="holds no artifact"):
        compiler._prebuilt(spec, "forward", text, flags, fresh_cache, False)


def test_artifacts_for_a_named_cpu_carry_no_host_and_serve_every_host(fresh_cache, monkeypatch):
    """target_cpu="x86-64-v3" (NSA_IREE_CPU_TARGET): code for that CPU, not the host's. Its key and .flags hold
    no host fingerprint, so a runtime-only machine of another CPU loads it as it is."""
    spec = DEMO_SPEC.replace(heads=2, kv_heads=1, head_dim=16, value_dim=16, block_size=16, num_blocks=2, dtype="f32",
                             target_cpu="x86-64-v3")
    art = compile_artifact(spec, "forward")
    saved = art.path.with_suffix(".flags").read_text()
    assert "--iree-llvmcpu-target-cpu=x86-64-v3" in saved and "host:" not in saved and "=host" not in saved
    assert spec.name.endswith("_cpu-x86-64-v3") and spec.name in art.path.name
    monkeypatch.setattr(compiler, "_host_fingerprint", lambda: THIRD_CPU)
    flags = load_recipe("cpu").flags_for(spec)
    assert compiler.cache_key(render.render_module(spec, "forward"), flags) == art.key
    assert compiler._prebuilt(spec, "forward", render.render_module(spec, "forward"), flags, fresh_cache,
                              False).path == art.path


@pytest.mark.parametrize("value, message", [("x86 64", "NSA_IREE_CPU_TARGET must be 'host' or an LLVM CPU name"),
                                            ("-mcpu=evil", "NSA_IREE_CPU_TARGET must be 'host' or an LLVM CPU name")])
def test_a_bad_cpu_target_is_refused_naming_the_variable(value, message, monkeypatch):
    monkeypatch.setenv("NSA_IREE_CPU_TARGET", value)
    q, k, v = torch.randn(1, 8, 2, 8), torch.randn(1, 8, 1, 8), torch.randn(1, 8, 1, 8)
    with pytest.raises(ValueError, match=message):
        nsa_iree.selection_attention(q, k, v, torch.zeros(1, 8, 1, 2, dtype=torch.int32), block_size=8)


def test_a_compile_says_what_it_compiles_before_and_how_long_after(fresh_cache, caplog):
    spec = DEMO_SPEC.replace(heads=2, kv_heads=1, head_dim=16, value_dim=8, block_size=16, num_blocks=2, dtype="f32")
    with caplog.at_level("INFO", logger="nsa_iree"):
        compile_artifact(spec, "forward")
        compile_artifact(spec, "forward")                # cached: says nothing
    lines = [r.getMessage() for r in caplog.records if r.name == "nsa_iree"]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"compiling the forward kernels of {spec.name} for cpu") and str(fresh_cache) in lines[0]
    assert lines[1].startswith(f"compiled the forward kernels of {spec.name} in ") and " s: forward_" in lines[1]


def test_a_layout_past_the_hand_written_kernels_warns_once_with_the_limit_and_the_cost(monkeypatch):
    """64 heads per kv head at D 192 needs more stack than the CPU kernels' tiles may take: a module of that spec
    has the linalg stages, and its first lookup says so (once per process). (The operators run such a layout as
    groups of query heads that fit: kernels.loaded_spec.)"""
    monkeypatch.delenv("NSA_IREE_KERNELS", raising=False)
    monkeypatch.setattr(api, "compile_artifact", lambda spec, variant: type("A", (), {"path": f"{variant}.vmfb"}))
    api._artifact_path.cache_clear()
    wide = DEMO_SPEC.replace(heads=64, kv_heads=1, head_dim=192, value_dim=128, dtype="f32")
    try:
        with pytest.warns(RuntimeWarning) as record:
            api._artifact_path(wide, "forward")
            api._artifact_path(wide, "forward")
        assert len(record) == 1 and record[0].filename == __file__     # points at the caller, not nsa_iree
        message = str(record[0].message)
        assert "linalg" in message and "forward: needs" in message and "bytes of stack tiles" in message
        assert "Cost: 14x (forward, dq) to 34x (dk/dv) the time of the CPU kernels" in message
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            api._artifact_path(DEMO_SPEC, "two-pass")       # served by the CPU kernels: no warning
    finally:
        api._artifact_path.cache_clear()


def test_nsa_iree_compile_builds_the_modules_the_operators_load(tmp_path, capsys):
    """32 query heads per kv head on cuda: the forward on the wide kernel (kernels.WIDE), the backward as two groups of
    16 (kernels.loaded_spec): `nsa-iree compile` builds those modules (the backward's with float32 dk/dv), which a
    machine without the compiler then loads."""
    from nsa_iree import cli

    layout = ["--target", "cuda", "--heads", "32", "--kv-heads", "1", "--head-dim", "64", "--value-dim", "64",
              "--block-size", "64", "--num-blocks", "4", "--dtype", "bf16"]
    assert cli.main(["compile", *layout, "-o", str(tmp_path)]) == 0
    names = sorted(path.name.rsplit("_", 1)[0] for path in tmp_path.glob("*.vmfb"))
    assert names == ["forward_h32g1_d64dv64_bs64t4_bf16_cuda", "two-pass_h32g2_d64dv64_bs64t4_bf16_dkdvf32_cuda"]
    assert capsys.readouterr().out.count("each kv head's query heads as 2 groups") == 1


def test_compile_lines_go_to_stderr_until_the_application_configures_logging():
    """Before the application configures logging, nsa_iree's INFO lines are printed on stderr; after it configures
    the root logger at WARNING, they follow that level (none printed anywhere); a level the application gives the
    nsa_iree logger itself is obeyed."""
    script = textwrap.dedent("""
        import logging, sys
        from nsa_iree.compiler import LOG
        LOG.info("first")
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="root: %(message)s")
        LOG.info("second")
        LOG.warning("third")
        logging.getLogger("nsa_iree").setLevel(logging.INFO)
        LOG.info("fourth")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "nsa_iree: first\n"
    assert result.stdout == "root: third\nroot: fourth\n"


def test_the_amd_recipes_are_one_base_and_their_differences():
    """gfx950 and gfx942 read pipelines/amd.toml under their own few keys: the same driver, tuning, attribute and
    one-pass text, apart from the matrix intrinsic each names; the rendered modules are those frozen before the
    split (tests/test_frozen_modules.py)."""
    gfx950, gfx942 = load_recipe("gfx950"), load_recipe("gfx942")
    assert (gfx950.driver, gfx950.rows_per_piece, gfx950.dtypes) == (gfx942.driver, gfx942.rows_per_piece,
                                                                     gfx942.dtypes)
    assert gfx950.onepass_templates == gfx942.onepass_templates
    assert gfx950.attribute_templates == gfx942.attribute_templates
    assert (gfx950.values["MFMA"], gfx942.values["MFMA"]) == ("MFMA_F32_16x16x32", "MFMA_F32_16x16x16")
    assert gfx950.block_sizes == (64, 128) and gfx942.block_sizes == (64,)
    assert "onepass" in gfx950.kernel_settings and "onepass" not in gfx942.kernel_settings
    # hand-written: gfx950 the portable forward, dq, dk/dv, one-pass and select_blocks; gfx942 select_blocks only
    assert {stage for stage, family in gfx942.kernel_settings.items() if family == "portable"} == {"select_blocks"}
    assert gfx950.kernel_settings["select_blocks"] == "portable"
    spec = DEMO_SPEC.replace(dtype="bf16")
    assert "MFMA_F32_16x16x32_BF16" in load_recipe("gfx950").attributes(spec.replace(target="gfx950"))[
        "DQ_SCORES_CONFIG"]
