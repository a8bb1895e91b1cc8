"""The one-pass backward: skipped slots are never read nor written, one template for every target, and
its atomics are native f32 adds in the GPU code (compile only: no GPU in CI)."""

from __future__ import annotations

import dataclasses
import re
import shutil

import pytest
import torch

import nsa_iree
from nsa_iree import render
from nsa_iree.testing import relative_rms_error
from nsa_iree.inspect import dump_executables
from nsa_iree.recipes import load_recipe
from nsa_iree.spec import DEMO_SPEC

from conftest import TOLERANCE, Problem, assert_close_to_reference, make_inputs, realistic_indices, reference_outputs, \
    run_poisoned

# --- skipped slots --------------------------------------------------------------------------------------


def hostile_selection(gen, p):
    """Every row lists -1, INT32_MIN, two out-of-range ids and the last block (future for all but its own
    rows, which list -5 instead), plus one valid block from 1 .. NB-2 twice. Blocks 0 and NB-1 are thus
    never validly selected, and rows of block 0 select nothing at all.

    With the flat dk/dv accumulator, a -1 slot written anyway would land in the previous batch's last
    block (or the end of dk, for dv), an id of NB in the next batch's block 0: both must stay exactly 0.
    """
    nb = p.num_kv_blocks
    pos = torch.arange(p.m_rows) + (p.n - p.m_rows)
    own = pos // p.block_size
    idx = torch.empty(p.batch, p.m_rows, p.kv_heads, 7, dtype=torch.int32)
    idx[..., 0] = -1
    idx[..., 1] = nb
    idx[..., 2] = nb + 7
    idx[..., 3] = torch.where(own == nb - 1, -5, nb - 1).view(1, -1, 1)
    high = torch.clamp(own, max=nb - 2).view(1, -1, 1).expand(p.batch, -1, p.kv_heads)
    pick = 1 + (torch.rand(high.shape, generator=gen) * high.clamp(min=1)).long()
    valid = torch.where(high >= 1, torch.minimum(pick, high), torch.full_like(pick, -1))
    idx[..., 4] = valid
    idx[..., 5] = valid
    idx[..., 6] = -(2**31)
    return idx


HOSTILE = Problem(batch=3, m_rows=100, n=100, heads=4, kv_heads=2, head_dim=24, value_dim=16, block_size=16,
                  num_blocks=7, select=hostile_selection)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_skipped_slots_are_never_read_nor_written(dtype):
    p = HOSTILE
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    q, k, v, do, block_indices, _ = make_inputs(p, torch_dtype, seed=5)
    nb, bs = p.num_kv_blocks, p.block_size
    never = torch.zeros(p.n, dtype=torch.bool)
    never[:bs] = True
    never[(nb - 1) * bs:] = True

    # The forward and the reference see finite K/V; the one-pass backward sees NaN in every key nobody
    # validly selected: reading one (even to multiply it by p = 0) would put NaN into dq.
    idx = nsa_iree.api.effective_block_indices(block_indices, None)
    scale = float(p.head_dim ** -0.5)
    o = torch.empty(p.batch, p.m_rows, p.heads, p.value_dim, dtype=torch_dtype)
    lse = torch.empty(p.batch, p.heads, p.m_rows, dtype=torch.float32)
    nsa_iree.api.forward_into(o, lse, q, k, v, idx, bs, scale)
    k_poisoned, v_poisoned = k.clone(), v.clone()
    k_poisoned[:, never] = float("nan")
    v_poisoned[:, never] = float("nan")
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    nsa_iree.api.backward_into(dq, dk, dv, q, k_poisoned, v_poisoned, o, lse, do, idx, bs, scale, "one-pass")

    for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert not torch.isnan(t).any(), f"{name}: NaN (a skipped key was read, or an element never written)"
    assert torch.count_nonzero(dk[:, never]) == 0 and torch.count_nonzero(dv[:, never]) == 0
    assert torch.all(dq[:, :bs] == 0)                               # rows of block 0 select nothing
    _, _, dq_ref, dk_ref, dv_ref = reference_outputs(p, q, k, v, do, block_indices, None, o, lse)
    for name, x, ref in (("dq", dq, dq_ref), ("dk", dk, dk_ref), ("dv", dv, dv_ref)):
        assert relative_rms_error(x, ref) < TOLERANCE[torch_dtype], name


def test_paper_head_layout_in_f32():
    # HPG 16, D 192, Dv 128, BS 64: the largest per-row tiles of the suite (40 KiB of stack on CPU).
    p = Problem(batch=1, m_rows=200, n=200, heads=16, kv_heads=1, head_dim=192, value_dim=128, block_size=64,
                num_blocks=7, select=hostile_selection)
    assert_close_to_reference(p, torch.float32, variant="one-pass")


def test_repeated_runs_agree_within_tolerance():
    # Atomics add in a varying order: results may differ in the last bits between runs, never by more.
    p = dataclasses.replace(HOSTILE, batch=1, heads=8, kv_heads=1, m_rows=200, n=200)
    inputs = make_inputs(p, torch.float32, seed=1)
    first = run_poisoned(p, *inputs, variant="one-pass")
    again = run_poisoned(p, *inputs, variant="one-pass")
    for a, b in zip(first[2:], again[2:]):
        assert relative_rms_error(a, b) < 1e-6


# Which rows of the cpu one-pass kernel never get their block's lock (the compare-and-swap expects a value the
# lock never holds: 7), as a change to the kernel's text; those rows add their dk/dv with atomics.
LOCK_REFUSED = {
    "every_row": "%refused = arith.constant 7 : i32",
    "odd_rows": "%two = arith.constant 2 : index\n          %odd = arith.remui %m, %two : index\n"
                "          %odd_i32 = arith.index_cast %odd : index to i32\n"
                "          %seven = arith.constant 7 : i32\n          %refused = arith.muli %odd_i32, %seven : i32",
}


@pytest.mark.parametrize("rows", LOCK_REFUSED, ids=list(LOCK_REFUSED))
def test_cpu_kernel_adds_with_atomics_when_a_lock_stays_taken(rows, tmp_path, monkeypatch):
    # The cpu one-pass kernel adds a row's dk/dv under its block's lock; after CPU_LOCK_TRIES failed attempts
    # (a descheduled holder) it adds them with f32 atomics into an accumulator of their own, while other rows
    # may hold the lock. Here the rows of LOCK_REFUSED never get it (even rows do, with "odd_rows").
    from nsa_iree import api
    from nsa_iree.kernels import cpu

    copy = tmp_path / "kernels"
    shutil.copytree(render.KERNELS_DIR, copy)
    kernel = copy / "cpu" / "onepass.mlir"
    text = kernel.read_text()
    cas, loop = "llvm.cmpxchg %lock, %c0_i32, %c1_i32", "          %tries, %taken = scf.while"
    assert text.count(cas) == 1 and text.count(loop) == 1
    text = text.replace(cas, "llvm.cmpxchg %lock, %refused, %c1_i32")
    text = text.replace(loop, "          " + LOCK_REFUSED[rows] + "\n" + loop)
    kernel.write_text(text)
    monkeypatch.setattr(render, "KERNELS_DIR", copy)
    monkeypatch.setattr(cpu, "CPU_LOCK_TRIES", 2)
    monkeypatch.setenv("NSA_IREE_CACHE_DIR", str(tmp_path / "cache"))
    api._artifact_path.cache_clear()
    try:
        p = dataclasses.replace(HOSTILE, batch=2, heads=8, kv_heads=2, m_rows=150, n=170, select=realistic_indices)
        assert_close_to_reference(p, torch.float32, variant="one-pass")
        (module,) = (tmp_path / "cache").glob("one-pass_*.mlir")
        assert "llvm.cmpxchg %lock, %refused, %c1_i32" in module.read_text()
    finally:
        api._artifact_path.cache_clear()


# --- one template, every target -------------------------------------------------------------------------

def test_every_target_renders_one_template(monkeypatch):
    # With the [onepass] pieces replaced by markers, every target renders the same text: the CPU body is
    # the GPU body, not a copy of it. (The GPUs' default one-pass is the portable matrix-unit kernel,
    # gpu/portable/onepass.mlir, the cpu's the vectorised cpu/onepass.mlir; this scalar template is their
    # fallback, rendered for KernelSpec(kernels="linalg").)
    texts = set()
    for target in ("cpu", "gfx950", "gfx942", "cuda"):
        recipe = load_recipe(target)
        marked = dataclasses.replace(recipe, onepass_templates={k: f"<{k}>" for k in recipe.onepass_templates})
        texts.add(render.render_template("linalg/onepass.mlir", DEMO_SPEC.replace(target=target), marked))
    assert len(texts) == 1
    assert "%lane = gpu.thread_id" not in render.render_module(DEMO_SPEC, "one-pass")
    assert "@selection_attention_onepass_portable_exe" in render.render_module(DEMO_SPEC.replace(target="cuda"),
                                                                              "one-pass")
    assert "%lane = gpu.thread_id x" in render.render_module(DEMO_SPEC.replace(target="cuda", kernels="linalg"),
                                                            "one-pass")


# --- native atomics in the GPU code (compile only) --------------------------------------------------------

def _kernels(asm_text: str) -> dict[str, str]:
    """AMDGPU assembly split per kernel: name -> its instructions (from its label to .Lfunc_endN)."""
    out = {}
    for match in re.finditer(r"^(\S+):\n(.*?)^\.Lfunc_end\d+:", asm_text, re.S | re.M):
        out[match.group(1)] = match.group(2)
    return out


NATIVE_AMD_F32_ADD = re.compile(r"\b(global|buffer|flat)_atomic_(add_f32|pk_add_\w+)\b")
ANY_AMD_ATOMIC = re.compile(r"\b(global|buffer|flat|ds)_atomic_\w+")


def test_gfx950_one_pass_uses_native_f32_atomics(tmp_path):
    dump = dump_executables(DEMO_SPEC.replace(target="gfx950"), "one-pass", tmp_path / "gfx950")
    (asm,) = dump.glob("*.rocmasm")
    kernels = _kernels(asm.read_text())
    onepass = [body for name, body in kernels.items() if name == "selection_attention_onepass_row"]
    assert len(onepass) == 1, sorted(kernels)
    assert len(NATIVE_AMD_F32_ADD.findall(onepass[0])) >= 2          # one for dk, one for dv
    assert "cmpswap" not in onepass[0]
    for name, body in kernels.items():
        if name != "selection_attention_onepass_row":
            assert not ANY_AMD_ATOMIC.search(body), f"{name} has atomics"


def test_sm80_one_pass_uses_native_f32_atomics(tmp_path):
    dump = dump_executables(DEMO_SPEC.replace(target="cuda"), "one-pass", tmp_path / "cuda")
    (ptx,) = dump.glob("*.ptx")
    text = ptx.read_text()
    entry = re.search(r"\.entry\s+(selection_attention_onepass_row)\((.*?)^\}", text, re.S | re.M)
    assert entry, "no one-pass kernel in the PTX"
    body = entry.group(2)
    assert len(re.findall(r"\b(atom|red)(\.\w+)*\.global(\.\w+)*\.add\.f32\b", body)) >= 2
    assert "atom.cas" not in body and ".cas." not in body
