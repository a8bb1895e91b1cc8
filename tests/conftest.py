"""Shared helpers: problem builders, the tolerance rule of semantics.md, and poisoned runs."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from typing import Callable

import pytest
import torch

from nsa_iree.api import backward_into, effective_block_indices, forward_into
from nsa_iree.reference import selection_attention_backward_reference, selection_attention_reference
from nsa_iree.selection import realistic_block_indices
from nsa_iree.spec import CPU_TARGET_ENV
from nsa_iree.testing import TOLERANCE, relative_rms_error

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# The CPUs the cpu kernels are compiled for where a property must hold on every x86-64 host: this machine's own
# (AVX-512 vectors where it has them) and x86-64-v3 (AVX2 and FMA, 256-bit vectors), which any such host runs.
CPU_TARGETS = ("host", "x86-64-v3")
# Inputs are standard normal, so outputs are O(1) per element. Where an output is exactly zero up to
# rounding (dq and dk of rows that see one key: the softmax is constant there), the relative error is
# measured against an RMS of 0.05 per element instead of the reference's own (vanishing) norm. The floor
# binds only there: the single-key edge case, all-skipped selections, and hypothesis draws with tiny N or
# zero counts; the other configurations of test_numerics have output RMS 0.11 to 1.2.
RMS_FLOOR = 0.05


@dataclasses.dataclass(frozen=True)
class Problem:
    """One selection-attention problem; `select(gen, problem)` returns (block_indices, block_counts)."""

    batch: int = 2
    m_rows: int = 96
    n: int = 96
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    value_dim: int = 16
    block_size: int = 16
    num_blocks: int = 4
    select: Callable | None = None
    scale: float | None = None

    @property
    def num_kv_blocks(self) -> int:
        return -(-self.n // self.block_size)


@contextlib.contextmanager
def cpu_target(name: str):
    """Run the cpu kernels compiled for `name` (NSA_IREE_CPU_TARGET; "host": unset) for the duration."""
    saved = os.environ.pop(CPU_TARGET_ENV, None)
    if name != "host":
        os.environ[CPU_TARGET_ENV] = name
    try:
        yield
    finally:
        os.environ.pop(CPU_TARGET_ENV, None)
        if saved is not None:
            os.environ[CPU_TARGET_ENV] = saved


def random_indices(gen, p: Problem, low=-1, high=None):
    """Uniform block ids in [low, high) (default: every block id that exists), -1 included."""
    high = p.num_kv_blocks if high is None else high
    return torch.randint(low, high, (p.batch, p.m_rows, p.kv_heads, p.num_blocks), generator=gen, dtype=torch.int32)


def realistic_indices(gen, p: Problem):
    """Realistic selections (nsa_iree.selection): the first block, the local window, and random others."""
    return realistic_block_indices(p.batch, p.m_rows, p.n, p.kv_heads, p.num_blocks, p.block_size, generator=gen)


def assert_bitwise_equal(first, second, names=("o", "lse", "dq", "dk", "dv")):
    """Outputs equal bit for bit (NaN payloads and signed zeros included)."""
    for name, a, b in zip(names, first, second):
        bits = torch.int32 if a.element_size() == 4 else torch.int16
        assert torch.equal(a.view(bits), b.view(bits)), name


def make_inputs(p: Problem, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(p.batch, p.m_rows, p.heads, p.head_dim, generator=gen).to(dtype)
    k = torch.randn(p.batch, p.n, p.kv_heads, p.head_dim, generator=gen).to(dtype)
    v = torch.randn(p.batch, p.n, p.kv_heads, p.value_dim, generator=gen).to(dtype)
    do = torch.randn(p.batch, p.m_rows, p.heads, p.value_dim, generator=gen).to(dtype)
    select = p.select or random_indices
    out = select(gen, p)
    block_indices, block_counts = out if isinstance(out, tuple) else (out, None)
    return q, k, v, do, block_indices, block_counts


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


@pytest.fixture
def poisoned_compression_outputs(monkeypatch):
    """Every buffer nsa_iree.compression's and nsa_iree.window's kernels write (api.output_buffer) starts
    poisoned: NaN floats, INT32_MAX ids; a value the kernels leave unwritten fails the comparison that follows."""
    from nsa_iree import api

    def output(shape, like, dtype=None):
        dtype = dtype or like.dtype
        fill = 2 ** 31 - 1 if dtype == torch.int32 else float("nan")
        return torch.full(shape, fill, dtype=dtype, device=like.device)
    monkeypatch.setattr(api, "output_buffer", output)


def run_poisoned(p: Problem, q, k, v, do, block_indices, block_counts, variant="two-pass"):
    """Forward then backward through the compiled kernels, every output buffer NaN-filled beforehand."""
    scale = float(p.head_dim ** -0.5 if p.scale is None else p.scale)
    idx = effective_block_indices(block_indices, block_counts)
    o = poisoned((p.batch, p.m_rows, p.heads, p.value_dim), q.dtype)
    lse = poisoned((p.batch, p.heads, p.m_rows), torch.float32)
    forward_into(o, lse, q, k, v, idx, p.block_size, scale)
    dq, dk, dv = poisoned(q.shape, q.dtype), poisoned(k.shape, q.dtype), poisoned(v.shape, q.dtype)
    backward_into(dq, dk, dv, q, k, v, o, lse, do, idx, p.block_size, scale, variant)
    return o, lse, dq, dk, dv


def reference_outputs(p: Problem, q, k, v, do, block_indices, block_counts, o_used, lse_used):
    """f64 reference forward, and the f64 backward at the o/lse the kernels actually used."""
    o_ref, lse_ref = selection_attention_reference(q, k, v, block_indices, p.block_size, block_counts, p.scale)
    _, dq_ref, dk_ref, dv_ref = selection_attention_backward_reference(
        q, k, v, o_used, lse_used, do, block_indices, p.block_size, block_counts, p.scale)
    return o_ref, lse_ref, dq_ref, dk_ref, dv_ref


def assert_close_to_reference(p: Problem, dtype, seed=0, variant="two-pass"):
    q, k, v, do, block_indices, block_counts = make_inputs(p, dtype, seed)
    outs = run_poisoned(p, q, k, v, do, block_indices, block_counts, variant)
    refs = reference_outputs(p, q, k, v, do, block_indices, block_counts, outs[0], outs[1])
    tol = TOLERANCE[dtype]
    report = {}
    for name, x, ref in zip(("o", "lse", "dq", "dk", "dv"), outs, refs):
        assert not torch.isnan(x).any(), f"{name}: NaN in the output (an element was never written?)"
        report[name] = relative_rms_error(x, ref, rms_floor=RMS_FLOOR)
    if os.environ.get("NSA_IREE_ERROR_LOG"):  # collect every error, e.g. for a table of the worst ones
        with open(os.environ["NSA_IREE_ERROR_LOG"], "a") as log:
            log.write(json.dumps({"dtype": str(dtype), "variant": variant, "errors": report}) + "\n")
    bad = {k: e for k, e in report.items() if not e < tol}
    assert not bad, f"relative RMS error above {tol:g}: {bad} (all: {report})"
    return outs, report


_HELPER_MODULES: dict = {}


@pytest.fixture(scope="module")
def helper_dir(tmp_path_factory):
    """Where a test module's helper_module artifacts go."""
    return tmp_path_factory.mktemp("helpers")


def helper_module(template: str, spec, wrapper: str, directory):
    """The CPU module of a common/ helper template (private functions only) for spec, with `wrapper`'s public
    function calling into it: compiled once per (template, spec, wrapper)."""
    from iree.compiler import compile_str

    from nsa_iree.cache import write_artifact
    from nsa_iree.kernels import COMMON
    from nsa_iree.recipes import load_recipe
    from nsa_iree.render import render_template
    from nsa_iree.runtime import device_for

    key = (template, spec, wrapper)
    if key not in _HELPER_MODULES:
        recipe = load_recipe("cpu")
        text = render_template(template, spec, recipe, COMMON) + wrapper
        stem = f"{template.rsplit('/', 1)[-1].removesuffix('.mlir')}_{spec.name}"
        vmfb = directory / f"{stem}_{hashlib.sha256(wrapper.encode()).hexdigest()[:12]}.vmfb"
        write_artifact(vmfb, compile_str(text, extra_args=list(recipe.flags_for(spec))))
        _HELPER_MODULES[key] = device_for(torch.device("cpu")).module(vmfb)
    return _HELPER_MODULES[key]
