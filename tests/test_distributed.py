"""Context parallelism (issue 18): nsa_iree.distributed.selection_attention over 2 and 3 gloo ranks equals one
process computing the whole sequence.

Each table below runs in one set of spawned processes per world size (torch.multiprocessing, gloo, file
rendezvous, 60 s collective timeout), which write what they got to files read here. Every rank of a case
recomputes the whole problem from its seed and keeps its chunk (sequence_chunk); in the ranks, torch's
new_empty and nsa_iree's output allocation return NaN-filled memory, so a gathered, padded or reduced
element that nothing writes shows up as NaN. The shapes are test_api's (H=4 G=2 D=16 Dv=8 BS=8 T=3): this
process compiles them first (or finds them in the on-disk cache), the ranks inherit its environment and load
them from the same cache.

What is required: o and dq, concatenated over the ranks, bitwise equal to the single-process call (the same
kernels see the same rows and keys; delta's sums do not depend on where a row sits in its chunk); dk and dv within
a relative RMS error of 1e-6 of it in f32 (the ranks' float32 contributions are added in another order). Under
bf16 autocast the ranks add their float32 dk/dv contributions and round once, so the sharded dk and dv are as
close to the f64 reference as the single process's (within 5%). All four within semantics.md's tolerance of the
f64 reference. Cases with target_cpu run the kernels compiled for that CPU (x86-64-v3: AVX2) in this process and
in the ranks; a compiled case runs the sharded call inside torch.compile(fullgraph=True).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import traceback
from pathlib import Path

import pytest
import torch

import nsa_iree
from nsa_iree import distributed
from nsa_iree.compiler import compile_artifact
from nsa_iree.reference import selection_attention_reference
from nsa_iree.spec import KernelSpec
from nsa_iree.testing import TOLERANCE, relative_rms_error

from conftest import cpu_target

H, G, D, DV, BS, T = 4, 2, 16, 8, 8, 3
SAME_AS_ONE_PROCESS = 1e-6
AS_CLOSE_AS_ONE_PROCESS = 1.05   # bf16 dk/dv: error from f64 at most this times the single process's
RMS_FLOOR = 0.05                 # as tests/conftest.py
DEADLINE_S = 400


@dataclasses.dataclass(frozen=True)
class Case:
    """One sharded problem: `world` processes, the sequence split over `members` (default: all of them)."""

    world: int
    batch: int
    chunk: int                      # tokens per rank (C); the sequence has len(members) * C
    counts: object = None           # block_counts: None, an int, or "tensor" ([B, M, G], 0 .. T)
    variant: str = "two-pass"
    grads: str = "qkv"              # the inputs that require grad
    members: tuple | None = None    # a subgroup of the world's ranks
    overlap: bool = False           # distributed.OVERLAP_BACKWARD (the default: reduce-scatter after dq)
    autocast: bool = False          # f32 inputs under torch.autocast("cpu", bfloat16)
    target_cpu: str = "host"        # NSA_IREE_CPU_TARGET of the run (and of the single-process call)
    compiled: bool = False          # the sharded call inside torch.compile(fullgraph=True)
    value_dim: int = DV             # Dv (64: delta's sums of 64 products span several vectors)
    seed: int = 0

    @property
    def ranks(self) -> tuple:
        return self.members or tuple(range(self.world))


# Slots are uniform over [-1, blocks + 2): skipped -1 and past-the-end entries, future blocks, blocks that
# straddle two ranks' chunks (C is not a multiple of BS unless said), and duplicates.
CASES = {
    "2ranks-B2-chunk20-counts_tensor": Case(2, 2, 20, counts="tensor"),
    "2ranks-B1-chunk24-counts_int": Case(2, 1, 24, counts=2),
    "2ranks-one_pass": Case(2, 2, 12, variant="one-pass"),
    "2ranks-reduce_during_dq": Case(2, 2, 20, counts="tensor", overlap=True),
    "2ranks-only_q_requires_grad": Case(2, 2, 20, grads="q"),
    "2ranks-only_v_requires_grad": Case(2, 1, 20, grads="v"),
    "2ranks-autocast_bf16": Case(2, 1, 16, autocast=True),
    "2ranks-autocast_bf16-chunk512": Case(2, 1, 512, autocast=True, seed=6),
    "2ranks-one_pass-autocast_bf16": Case(2, 2, 20, counts="tensor", variant="one-pass", autocast=True, seed=10),
    "2ranks-chunk500-dv64": Case(2, 1, 500, value_dim=64, seed=7),
    "2ranks-chunk500-dv64-avx2": Case(2, 1, 500, value_dim=64, target_cpu="x86-64-v3", seed=7),
    "2ranks-B2-chunk20-avx2": Case(2, 2, 20, counts="tensor", target_cpu="x86-64-v3"),
    "2ranks-compiled": Case(2, 1, 20, counts="tensor", compiled=True, seed=8),
    "2ranks-compiled-B2-autocast": Case(2, 2, 12, autocast=True, compiled=True, seed=9),
    "3ranks-B2-chunk20-counts_tensor": Case(3, 2, 20, counts="tensor", seed=1),
    "3ranks-B1-chunk8": Case(3, 1, 8, seed=2),
    "3ranks-B2-chunk12-one_pass-counts_int": Case(3, 2, 12, counts=1, variant="one-pass", seed=3),
    "3ranks-subgroup_of_ranks_1_and_2": Case(3, 2, 12, members=(1, 2), seed=4),
}
# Each rank calls with a group of its own: the whole sequence, no communication.
SINGLETON = Case(2, 2, 40, counts="tensor", seed=5)


def problem(case: Case):
    """q, k, v, do (f32), block_indices and block_counts of the whole sequence, drawn from case.seed."""
    gen = torch.Generator().manual_seed(case.seed)
    b, n = case.batch, case.chunk * len(case.ranks)
    shapes = ((H, D), (G, D), (G, case.value_dim), (H, case.value_dim))
    q, k, v, do = (torch.randn(b, n, heads, dim, generator=gen) for heads, dim in shapes)
    idx = torch.randint(-1, -(-n // BS) + 2, (b, n, G, T), generator=gen, dtype=torch.int32)
    counts = torch.randint(0, T + 1, (b, n, G), generator=gen) if case.counts == "tensor" else case.counts
    return q, k, v, do, idx, counts


def forward_backward(call, case: Case, q, k, v, do, idx, counts):
    """o and the gradients of the inputs that require grad (None for the others)."""
    leaves = [t.clone().requires_grad_(name in case.grads) for name, t in zip("qkv", (q, k, v))]

    def step(q, k, v, idx, counts):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case.autocast):
            return call(q, k, v, idx, BS, counts, None, case.variant)

    if case.compiled:
        step = torch.compile(step, fullgraph=True)
    with cpu_target(case.target_cpu):
        o = step(*leaves, idx, counts)
        o.backward(do.to(o.dtype))
    return [o.detach()] + [t.grad for t in leaves]


# --- what the ranks run ---------------------------------------------------------------------------------

def _poison_allocations():
    """In a rank: the float tensors that new_empty and nsa_iree's outputs allocate start as NaN."""
    import nsa_iree.api as api

    new_empty, empty = torch.Tensor.new_empty, api._empty

    def poisoned(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.Tensor.new_empty = lambda self, *a, **kw: poisoned(new_empty(self, *a, **kw))
    api._empty = lambda *a, **kw: poisoned(empty(*a, **kw))


# Inputs that one or all ranks get wrong: name -> how rank r calls (given the group's size P).
def _bad_call(name, rank, size):
    q, k, v, do, idx, counts = problem(Case(size, 1, 16))
    mine = [distributed.sequence_chunk(t) for t in (q, k, v, idx)]
    if name in ("chunk_lengths_differ", "compiled_chunk_lengths_differ"):
        mine = [t[:, : 16 - 4 * rank] for t in mine]
        if name.startswith("compiled"):      # traced: the operator exchanges the shapes when it runs
            return torch.compile(lambda *a: distributed.selection_attention(*a, block_size=BS), fullgraph=True)(*mine)
    elif name == "k_chunk_is_not_q_chunk":
        mine[1], mine[2] = mine[1][:, :8], mine[2][:, :8]
    elif name == "one_rank_has_float_block_indices" and rank == size - 1:
        mine[3] = mine[3].float()
    elif name == "block_size_differs":
        return distributed.selection_attention(*mine, block_size=BS * (rank + 1))
    elif name == "tensors_on_a_device_gloo_does_not_send":
        mine = [t.to("meta") for t in mine]
    elif name == "sequence_not_divisible_by_the_ranks":
        return distributed.sequence_chunk(torch.zeros(1, 16 * size + 1, G))
    return distributed.selection_attention(*mine, block_size=BS)


BAD = {  # name -> {rank: (error type, message regex)}; "*" for every rank
    "chunk_lengths_differ": {"*": ("ValueError", r"different chunk lengths \(q.shape\[1\]\) "
                                                 r"\(rank 0: 16, rank 1: 12\)")},
    "compiled_chunk_lengths_differ": {"*": ("ValueError", r"different chunk lengths \(q.shape\[1\]\) "
                                                          r"\(rank 0: 16, rank 1: 12\)")},
    "k_chunk_is_not_q_chunk": {"*": ("ValueError", r"k has 8 tokens \(k.shape\[1\]\) but q has 16")},
    "one_rank_has_float_block_indices": {0: ("ValueError", "rank 1 of the group rejected its inputs"),
                                         1: ("TypeError", "block_indices must be int32 or int64")},
    "block_size_differs": {"*": ("ValueError", r"different block_size \(rank 0: 8, rank 1: 16\)")},
    "tensors_on_a_device_gloo_does_not_send": {"*": ("ValueError", "q is on meta, but the process group's backend "
                                                                    r"\(gloo for cpu\)")},
    "sequence_not_divisible_by_the_ranks": {"*": ("ValueError", "33 positions along dim 1, "
                                                                "not divisible by the 2 ranks")},
}


def _rank_main(rank, world, directory):
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank,
                                         world_size=world, timeout=datetime.timedelta(seconds=60))
    _poison_allocations()
    results = {}

    def record(key, fn):
        try:
            results[key] = ("ok", fn())
        except Exception as err:  # noqa: BLE001 - the parent checks what was raised
            results[key] = (type(err).__name__, str(err), traceback.format_exc())

    if world == 2:
        for name in BAD:
            record(("bad", name), lambda: _bad_call(name, rank, world))
        singletons = [torch.distributed.new_group([r]) for r in range(world)]
        record(("singleton",), lambda: forward_backward(
            lambda *a: distributed.selection_attention(*a, group=singletons[rank]), SINGLETON, *problem(SINGLETON)))
    default_overlap = distributed.OVERLAP_BACKWARD
    for name, case in CASES.items():
        if case.world != world:
            continue
        group = torch.distributed.new_group(list(case.members)) if case.members else None
        if rank not in case.ranks:
            continue
        distributed.OVERLAP_BACKWARD = case.overlap

        def run(case=case, group=group):
            whole = problem(case)
            q, k, v, do, idx, counts = [distributed.sequence_chunk(t, group) if isinstance(t, torch.Tensor) else t
                                        for t in whole]
            return forward_backward(lambda *a: distributed.selection_attention(*a, group=group), case,
                                    q, k, v, do, idx, counts)
        record(("case", name), run)
        distributed.OVERLAP_BACKWARD = default_overlap
    torch.save(results, Path(directory) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


_RUNS: dict = {}


def ranks_results(world, tmp_path_factory) -> list[dict]:
    """Spawn `world` ranks once (per test session) and return what each recorded.

    The single-process calls of every case run first, here, and the ranks' own bf16 backward modules (dk/dv in
    f32) are compiled: the cache then holds everything (f32 and bf16, two-pass and one-pass), so the ranks only
    load artifacts, never compile them side by side."""
    if world not in _RUNS:
        for case in [SINGLETON, *CASES.values()]:
            if case.world == world:
                _one_process(case)
                if case.autocast:     # the ranks' bf16 backward, with dk/dv left in f32 for the reduce-scatter
                    spec = KernelSpec(heads=H, kv_heads=G, head_dim=D, value_dim=case.value_dim, block_size=BS,
                                      num_blocks=T, dtype="bf16", target_cpu=case.target_cpu, dkdv_dtype="f32")
                    compile_artifact(spec, case.variant)
        directory = tmp_path_factory.mktemp(f"ranks{world}")
        saved = os.environ.get("NSA_IREE_CPU_THREADS")
        os.environ["NSA_IREE_CPU_THREADS"] = "1"            # the ranks share this machine's cores
        try:
            context = torch.multiprocessing.start_processes(_rank_main, args=(world, str(directory)), nprocs=world,
                                                            join=False, start_method="spawn")
            deadline = datetime.datetime.now() + datetime.timedelta(seconds=DEADLINE_S)
            while not context.join(timeout=5):
                if datetime.datetime.now() > deadline:
                    for process in context.processes:
                        process.kill()
                    pytest.fail(f"{world} ranks did not finish within {DEADLINE_S} s")
        finally:
            if saved is None:
                os.environ.pop("NSA_IREE_CPU_THREADS")
            else:
                os.environ["NSA_IREE_CPU_THREADS"] = saved
        _RUNS[world] = [torch.load(directory / f"rank{r}.pt") for r in range(world)]
    return _RUNS[world]


_EXPECTED: dict = {}


def _one_process(case: Case):
    """The single-process call on the whole sequence (once per case)."""
    if case not in _EXPECTED:      # eager, also for the compiled cases
        _EXPECTED[case] = forward_backward(nsa_iree.selection_attention, dataclasses.replace(case, compiled=False),
                                           *problem(case))
    return _EXPECTED[case]


def _outputs(result, where):
    status, *rest = result
    assert status == "ok", f"{where} raised {status}: {rest[0]}\n{rest[1]}"
    return rest[0]


# --- the specification ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", CASES, ids=list(CASES))
def test_sharded_call_equals_the_single_process_call(name, tmp_path_factory):
    case = CASES[name]
    expected = _one_process(case)
    results = ranks_results(case.world, tmp_path_factory)
    chunks = [_outputs(results[r][("case", name)], f"rank {r}") for r in case.ranks]
    q, k, v, do, idx, counts = problem(case)
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    o_ref, _ = selection_attention_reference(*leaves, idx, BS, counts)
    o_ref.backward(do.double())
    references = (o_ref, *(t.grad for t in leaves))
    for i, what in enumerate(("o", "dq", "dk", "dv")):
        if expected[i] is None:
            assert all(c[i] is None for c in chunks), f"{what}: a gradient nobody asked for"
            continue
        got = torch.cat([c[i] for c in chunks], dim=1)
        assert got.dtype == expected[i].dtype and got.shape == expected[i].shape, what
        assert not torch.isnan(got).any(), f"{what}: NaN (an element nothing wrote)"
        from_f64 = relative_rms_error(got, references[i], rms_floor=RMS_FLOOR)
        computed_in = torch.bfloat16 if case.autocast else got.dtype
        assert from_f64 < TOLERANCE[computed_in], f"{what}: {from_f64:.2e} from the f64 reference"
        if what in ("o", "dq"):
            bits = torch.int32 if got.element_size() == 4 else torch.int16
            assert torch.equal(got.view(bits), expected[i].view(bits)), f"{what}: not bitwise the single process's"
        elif case.autocast:
            alone = relative_rms_error(expected[i], references[i], rms_floor=RMS_FLOOR)
            assert from_f64 <= AS_CLOSE_AS_ONE_PROCESS * alone, \
                f"{what}: {from_f64:.3e} from f64 against the single process's {alone:.3e}"
        else:
            error = relative_rms_error(got, expected[i])
            assert error < SAME_AS_ONE_PROCESS, f"{what}: {error:.2e} from the single-process call"


def test_a_group_of_one_process_is_the_plain_call(tmp_path_factory):
    expected = _one_process(SINGLETON)
    for rank, result in enumerate(ranks_results(2, tmp_path_factory)):
        got = _outputs(result[("singleton",)], f"rank {rank}")
        for what, a, b in zip(("o", "dq", "dk", "dv"), got, expected):
            assert torch.equal(a, b), what


@pytest.mark.parametrize("name", BAD, ids=list(BAD))
def test_bad_inputs_raise_on_every_rank_before_keys_are_sent(name, tmp_path_factory):
    """Every rank raises (none is left waiting in a collective), and the ranks' later calls still work."""
    results = ranks_results(2, tmp_path_factory)
    for rank, result in enumerate(results):
        error, message = BAD[name].get(rank) or BAD[name]["*"]
        status, *rest = result[("bad", name)]
        assert status == error and re.search(message, rest[0]), f"rank {rank}: {status}: {rest[0] if rest else ''}"


def test_without_torch_distributed_initialised_the_error_says_so():
    q = torch.zeros(1, 8, H, D)
    with pytest.raises(RuntimeError, match="needs torch.distributed initialised"):
        distributed.selection_attention(q, q[:, :, :G], q[:, :, :G, :DV], torch.zeros(1, 8, G, T, dtype=torch.int32))
