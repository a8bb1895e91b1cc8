"""Context parallelism (issue 18): selection attention on P GPUs (one sequence sharded) against one GPU.

    NSA_IREE_CACHE_DIR=.dev/artifacts python3 -m bench.distributed_bench precompile   # where iree-compile is
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m bench.distributed_bench run --out DIR
    bench/run_distributed_h200.sh                     # the 2 x H200 run through the device tool (carry .whl .dev)

`run`, on every rank (one process per GPU, NCCL for the attention, a gloo group for the bookkeeping):

1. Fails early: torch.distributed under torchrun with >= 2 ranks, one GPU per rank, the anchors artifacts
   loadable (compiled elsewhere and carried: `precompile`), all before any timing.
2. Check at 8192 tokens: the sharded o, dq, dk, dv against the one-GPU call on the whole sequence (relative RMS
   error < 1e-2, bf16); the run stops on every rank when a rank fails it.
3. Per sequence length (anchors layout, B = 1, realistic selection, bf16): every rank holds the same whole
   problem (each draws it, then rank 0 broadcasts its copy) and times the one-GPU call on it (side by side,
   each on its own GPU); then each keeps its chunk and times the sharded call. A step's time is the slowest rank's
   (synchronised, barrier before each step), the median over --repeats steps. Also timed alone: the forward's
   all-gather of K and V and the backward's reduce-scatter of the padded dk/dv (the communication), and the
   backward both ways: the reduce-scatter started before dq (overlapped with it) and after (no overlap); the
   headline backward is the default (nsa_iree.distributed.OVERLAP_BACKWARD). Peak memory per GPU: torch's
   max_memory_allocated (inputs included; IREE's own small results are not in it) and the device's used memory
   sampled from cudaMemGetInfo during the step (everything, the inputs excluded).
   The sharded results at each length are compared with the one-GPU results too.

Rank 0 writes DIR/distributed_<P>x<GPU>.md and .json after every length (partial results survive a cut run)
and prints progress; an error on any rank is printed with its rank and stops the run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

import nsa_iree
from nsa_iree import distributed
from nsa_iree.compiler import compile_artifact
from nsa_iree.selection import realistic_block_indices
from nsa_iree.spec import KernelSpec
from nsa_iree.testing import relative_rms_error

from .bench import CONFIGS, PeakMemory, _versions

VARIANTS = ("forward", "two-pass")
ROWS_PER_DRAW = 8192            # the selection is drawn this many rows at a time ([rows, G, blocks] scores)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


class Setup:
    """The GPU run (anchors, bf16, NCCL), or --smoke: the harness end to end on CPU with gloo (tiny, f32)."""

    def __init__(self, smoke: bool = False):
        self.smoke = smoke
        self.cfg_name = "tiny" if smoke else "anchors"
        self.cfg = CONFIGS[self.cfg_name]
        self.spec = KernelSpec(target="cpu" if smoke else "cuda", **self.cfg)
        self.dtype = DTYPES[self.cfg["dtype"]]
        self.backend = "gloo" if smoke else "nccl"
        self.check_seq = 128 if smoke else 8192
        self.tolerance = 1e-5 if smoke else 1e-2


S = Setup()                     # main() replaces it for --smoke


def sync():
    if not S.smoke:
        torch.cuda.synchronize()


def free_cache():
    if not S.smoke:
        torch.cuda.empty_cache()


def precompile():
    """The artifacts `run` loads, into $NSA_IREE_CACHE_DIR (run where iree-compile is installed)."""
    for variant in VARIANTS:
        artifact = compile_artifact(S.spec, variant)
        print(f"{artifact.path} ({'cached' if artifact.compile_seconds == 0 else f'{artifact.compile_seconds:.0f} s'})",
              flush=True)


# --- one rank -------------------------------------------------------------------------------------------

class Rank:
    def __init__(self):
        if "LOCAL_RANK" not in os.environ:
            raise SystemExit("run under torchrun: python3 -m torch.distributed.run --standalone --nproc-per-node 2 "
                             "-m bench.distributed_bench run")
        self.local = int(os.environ["LOCAL_RANK"])
        if S.smoke:
            self.device = torch.device("cpu")
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
        else:
            if not torch.cuda.is_available() or torch.cuda.device_count() <= self.local:
                raise SystemExit(f"rank {os.environ.get('RANK')}: no GPU {self.local} (torch sees "
                                 f"{torch.cuda.device_count() if torch.cuda.is_available() else 0})")
            self.device = torch.device("cuda", self.local)
            torch.cuda.set_device(self.device)
            dist.init_process_group("nccl", device_id=self.device, timeout=datetime.timedelta(seconds=120))
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.cpu = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=300))
        if self.size < 2:
            raise SystemExit("context parallelism needs >= 2 ranks (--nproc-per-node 2)")

    def log(self, *parts):
        if self.rank == 0:
            print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)

    def gather(self, value):
        values = [None] * self.size
        dist.all_gather_object(values, value, group=self.cpu)
        return values

    def agree_or_stop(self, ok: bool, what: str):
        """Every rank stops when one failed (so none waits in a collective for a rank that is gone)."""
        flags = self.gather(ok)
        if not all(flags):
            raise SystemExit(f"rank {self.rank}: stopping, {what} failed on rank(s) "
                             f"{[r for r, f in enumerate(flags) if not f]}")

    def timed(self, fn, repeats, warmup=2):
        """Median over steps of the slowest rank's time (ms); every step starts after a barrier."""
        for _ in range(warmup):
            fn()
        sync()
        times = []
        for _ in range(repeats):
            dist.barrier(group=self.cpu)
            start = time.perf_counter()
            fn()
            sync()
            times.append((time.perf_counter() - start) * 1e3)
        per_rank = self.gather(times)
        return statistics.median(max(step) for step in zip(*per_rank)), [statistics.median(t) for t in per_rank]


def problem(seq, device, seed=0):
    """The whole sequence's q, k, v, do (bf16) and realistic block indices, the same on every rank."""
    gen = torch.Generator(device=device).manual_seed(seed)
    h, g, d, dv = S.cfg["heads"], S.cfg["kv_heads"], S.cfg["head_dim"], S.cfg["value_dim"]
    q, k, v, do = (torch.randn(1, seq, heads, dim, generator=gen, device=device).to(S.dtype)
                   for heads, dim in ((h, d), (g, d), (g, dv), (h, dv)))
    idx = torch.empty(1, seq, g, S.cfg["num_blocks"], dtype=torch.int32, device=device)
    for start in range(0, seq, ROWS_PER_DRAW):
        end = min(seq, start + ROWS_PER_DRAW)      # rows start..end-1 are the last rows of an end-token prefix
        idx[:, start:end] = realistic_block_indices(1, end - start, end, g, S.cfg["num_blocks"], S.cfg["block_size"],
                                                    generator=gen, device=device)
    return q, k, v, do, idx


def same_problem(r: Rank, seq, seed=0):
    """problem() on every rank, then rank 0's copy broadcast over it: the ranks hold one sequence even if
    their generators were to differ."""
    tensors = problem(seq, r.device, seed)
    for t in tensors:
        dist.broadcast(t, src=0)
    return tensors


def one_gpu(q, k, v, do, idx):
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    o = nsa_iree.selection_attention(*leaves, idx, S.cfg["block_size"])
    return leaves, o


def sharded(q, k, v, do, idx):
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    o = distributed.selection_attention(*leaves, idx, S.cfg["block_size"])
    return leaves, o


def chunk(t):
    """This rank's chunk of a whole-sequence tensor, contiguous (the layout a training loop holds)."""
    return distributed.sequence_chunk(t).contiguous()


def compare(mine, whole) -> dict:
    """Relative RMS errors of this rank's (o, dq, dk, dv) against its chunk of the one-GPU results."""
    return {name: relative_rms_error(a.float(), chunk(b).float())
            for name, a, b in zip(("o", "dq", "dk", "dv"), mine, whole)}


def check(r: Rank):
    q, k, v, do, idx = same_problem(r, S.check_seq, seed=1)
    leaves, o = one_gpu(q, k, v, do, idx)
    whole = [o.detach(), *torch.autograd.grad(o, leaves, do)]
    leaves, o = sharded(*(chunk(t) for t in (q, k, v, do, idx)))
    mine = [o.detach(), *torch.autograd.grad(o, leaves, chunk(do))]
    sync()
    errors = compare(mine, whole)
    all_errors = r.gather(errors)
    r.log(f"check at {S.check_seq} tokens, sharded vs one GPU (relative RMS, per rank):", json.dumps(all_errors))
    ok = all(e < S.tolerance for e in errors.values())
    r.agree_or_stop(ok, f"the check at {S.check_seq} tokens (tolerance {S.tolerance})")
    return all_errors


def comm_times(r: Rank, k, v, repeats):
    """The forward's two all-gathers and the backward's two reduce-scatters, alone (ms, slowest rank)."""
    k_all, v_all = k.new_empty(r.size, *k.shape), v.new_empty(r.size, *v.shape)

    def gather():
        works = [distributed._all_gather(k_all, k, None, async_op=True),
                 distributed._all_gather(v_all, v, None, async_op=True)]
        for w in works:
            w.wait()

    dk, dv = torch.empty_like(k), torch.empty_like(v)

    def scatter():
        works = [distributed._reduce_scatter(dk, k_all, None, async_op=True),
                 distributed._reduce_scatter(dv, v_all, None, async_op=True)]
        for w in works:
            w.wait()

    return r.timed(gather, repeats)[0], r.timed(scatter, repeats)[0]


def peak(r: Rank, fn):
    """(torch's max_memory_allocated GB incl. inputs, device memory in use GB above the start); 0 on CPU."""
    if S.smoke:
        fn()
        return 0.0, 0.0
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    with PeakMemory(r.device) as sampled:
        fn()
        torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 1e9, sampled.peak / 1e9


def timed_attention(r: Rank, call, attend, q, k, v, do, idx, repeats):
    """Peak memory of one step, the forward (no autograd) and the backward of `call` / `attend` (one_gpu /
    nsa_iree.selection_attention, or sharded / distributed.selection_attention): (peaks, fwd (ms, per rank),
    bwd (ms, per rank), leaves, o, bwd)."""
    peaks = r.gather(peak(r, lambda: step(call, q, k, v, do, idx)))

    def fwd():
        with torch.no_grad():
            attend(q, k, v, idx, S.cfg["block_size"])
    leaves, o = call(q, k, v, do, idx)

    def bwd():
        torch.autograd.grad(o, leaves, do, retain_graph=True)
    return peaks, r.timed(fwd, repeats), r.timed(bwd, repeats), leaves, o, bwd


def measure(r: Rank, seq: int, repeats: int) -> dict:
    row = {"seq": seq, "ranks": r.size}
    q, k, v, do, idx = same_problem(r, seq)
    r.log(f"{seq}: problem drawn; one GPU (each rank on its own GPU, side by side)")

    # One GPU, the whole sequence.
    (row["one_gpu_peak_gb"], (row["one_gpu_fwd_ms"], row["one_gpu_fwd_ms_per_rank"]),
     (row["one_gpu_bwd_ms"], row["one_gpu_bwd_ms_per_rank"]), leaves, o, _) = timed_attention(
        r, one_gpu, nsa_iree.selection_attention, q, k, v, do, idx, repeats)
    whole = [chunk(t) for t in (o.detach(), *torch.autograd.grad(o, leaves, do))]
    r.log(f"{seq}: one GPU fwd {row['one_gpu_fwd_ms']:.2f} ms, bwd {row['one_gpu_bwd_ms']:.2f} ms")

    # Sharded: this rank's chunk only.
    q, k, v, do, idx = (chunk(t) for t in (q, k, v, do, idx))
    del leaves, o
    free_cache()
    (row["peak_gb"], (row["fwd_ms"], row["fwd_ms_per_rank"]), (row["bwd_ms"], row["bwd_ms_per_rank"]),
     leaves, o, bwd) = timed_attention(r, sharded, distributed.selection_attention, q, k, v, do, idx, repeats)
    # row["bwd_ms"] is the default (distributed.OVERLAP_BACKWARD); both ways below.
    default = distributed.OVERLAP_BACKWARD
    try:
        distributed.OVERLAP_BACKWARD = True
        row["bwd_overlap_ms"], _ = r.timed(bwd, repeats)
        distributed.OVERLAP_BACKWARD = False
        row["bwd_no_overlap_ms"], _ = r.timed(bwd, repeats)
    finally:
        distributed.OVERLAP_BACKWARD = default
    row["allgather_kv_ms"], row["reduce_scatter_dkdv_ms"] = comm_times(r, k, v, repeats)
    mine = [o.detach(), *torch.autograd.grad(o, leaves, do)]
    row["errors_vs_one_gpu"] = r.gather({name: relative_rms_error(a.float(), b.float())
                                         for name, a, b in zip(("o", "dq", "dk", "dv"), mine, whole)})
    row["bwd_speedup"] = row["one_gpu_bwd_ms"] / row["bwd_ms"]
    row["fwd_speedup"] = row["one_gpu_fwd_ms"] / row["fwd_ms"]
    r.log(f"{seq}: {r.size} GPUs fwd {row['fwd_ms']:.2f} ms ({row['fwd_speedup']:.2f}x), bwd {row['bwd_ms']:.2f} ms "
          f"({row['bwd_speedup']:.2f}x; overlapped {row['bwd_overlap_ms']:.2f}, not {row['bwd_no_overlap_ms']:.2f}), "
          f"all-gather K+V {row['allgather_kv_ms']:.2f} ms, reduce-scatter dK+dV "
          f"{row['reduce_scatter_dkdv_ms']:.2f} ms, errors {json.dumps(row['errors_vs_one_gpu'])}")
    return row


def step(call, q, k, v, do, idx):
    """One training step's attention: forward with autograd, then the backward."""
    leaves, o = call(q, k, v, do, idx)
    torch.autograd.grad(o, leaves, do)


def markdown(record) -> str:
    lines = [f"# Context parallelism: {record['ranks']} x {record['gpu']} against one ({record['date']})", "",
             f"{S.cfg_name} layout: H={S.cfg['heads']} G={S.cfg['kv_heads']} D={S.cfg['head_dim']} "
             f"Dv={S.cfg['value_dim']} BS={S.cfg['block_size']} T={S.cfg['num_blocks']} {S.cfg['dtype']}, B=1, "
             "realistic selection, two-pass backward. "
             "Versions: " + ", ".join(f"{k} {v}" for k, v in record["versions"].items()) + ".", "",
             f"Command: `{record['command']}`", "",
             "Times in ms: median over steps of the slowest rank (barrier before each step). 'one GPU' is the plain "
             "call on the whole sequence; the sharded call gives each rank 1/P of the tokens. Backward = "
             "autograd's backward of o (dq, dk, dv). Communication timed alone: the forward's all-gather of K and "
             "V, the backward's reduce-scatter of the zero-padded dK and dV. 'bwd P GPUs' is the default "
             f"(reduce-scatter {'before' if distributed.OVERLAP_BACKWARD else 'after'} dq); the two columns after "
             "'bwd x' time it started before dq (overlapped with the dq pass) and after. Peak GB per GPU: torch "
             "max_memory_allocated with the "
             "inputs / device memory sampled during one step above the inputs.", ""]
    if "check" in record:
        lines += [f"Check at {S.check_seq} tokens, sharded vs one GPU (relative RMS per rank): "
                  + "; ".join(", ".join(f"{k} {v:.1e}" for k, v in e.items()) for e in record["check"]), ""]
    lines += ["| tokens | fwd 1 GPU | fwd P GPUs | fwd x | bwd 1 GPU | bwd P GPUs | bwd x | bwd overlapped | bwd not "
              "overlapped | all-gather K,V | reduce-scatter dK,dV | peak GB 1 GPU | peak GB per GPU (P) "
              "| max err vs 1 GPU |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in record["rows"]:
        if "error" in row:
            lines.append(f"| {row['seq']} | {row['error']} |" + " |" * 12)
            continue
        mem1 = " / ".join(f"{a:.1f}/{b:.1f}" for a, b in row["one_gpu_peak_gb"][:1])
        memp = ", ".join(f"{a:.1f}/{b:.1f}" for a, b in row["peak_gb"])
        err = max(max(e.values()) for e in row["errors_vs_one_gpu"])
        lines.append(f"| {row['seq']} | {row['one_gpu_fwd_ms']:.2f} | {row['fwd_ms']:.2f} | {row['fwd_speedup']:.2f} | "
                     f"{row['one_gpu_bwd_ms']:.2f} | {row['bwd_ms']:.2f} | **{row['bwd_speedup']:.2f}** | "
                     f"{row['bwd_overlap_ms']:.2f} | {row['bwd_no_overlap_ms']:.2f} | {row['allgather_kv_ms']:.2f} | "
                     f"{row['reduce_scatter_dkdv_ms']:.2f} | "
                     f"{mem1} | {memp} | {err:.1e} |")
    def ms(values):
        return "/".join(f"{x:.2f}" for x in values)
    lines += ["", "Per-rank medians, rank 0 / rank 1 / ... (ms): " + "; ".join(
        f"{row['seq']}: fwd {ms(row['fwd_ms_per_rank'])}, bwd {ms(row['bwd_ms_per_rank'])} (one GPU: fwd "
        f"{ms(row['one_gpu_fwd_ms_per_rank'])}, bwd {ms(row['one_gpu_bwd_ms_per_rank'])})"
        for row in record["rows"] if "error" not in row)]
    return "\n".join(lines) + "\n"


def run(args):
    r = Rank()
    name = "cpu" if S.smoke else torch.cuda.get_device_name(r.device)
    r.log(f"{r.size} ranks, {name}, torch {torch.__version__}, NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}")
    try:
        for variant in VARIANTS:              # loadable here (compiled elsewhere): fail before any timing
            compile_artifact(S.spec, variant)
        ok = True
    except Exception:  # noqa: BLE001 - reported with its rank, then every rank stops
        print(f"rank {r.rank}: the artifacts cannot be loaded:\n{traceback.format_exc()}", flush=True)
        ok = False
    r.agree_or_stop(ok, "loading the artifacts")
    gpu = name.split()[-1]
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "ranks": r.size, "gpu": gpu,
              "versions": _versions(), "command": " ".join(sys.argv), "config": S.cfg, "rows": []}
    out = Path(args.out)
    stem = f"distributed_{r.size}x{re.sub(r'[^A-Za-z0-9]+', '_', gpu)}"

    def save():
        if r.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{stem}.json").write_text(json.dumps(record, indent=1))
            (out / f"{stem}.md").write_text(markdown(record))

    record["check"] = check(r)
    save()
    for seq in args.seq:
        try:
            row, ok = measure(r, seq, args.repeats), True
        except Exception as err:  # noqa: BLE001 - reported, partial results written, then every rank stops
            print(f"rank {r.rank}: {seq} tokens failed:\n{traceback.format_exc()}", flush=True)
            row, ok = {"seq": seq, "error": f"{type(err).__name__}: {err}"[:300]}, False
        record["rows"].append(row)
        save()
        free_cache()
        r.agree_or_stop(ok, f"the {seq}-token step")
    r.log(f"wrote {out / stem}.md")
    if r.rank == 0:
        print(markdown(record), flush=True)
    dist.destroy_process_group()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m bench.distributed_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("precompile", "run"))
    parser.add_argument("--seq", type=int, nargs="+", default=[65536, 131072, 262144])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default="nsa_iree_results")
    parser.add_argument("--smoke", action="store_true",
                        help="the harness end to end on CPU with gloo, tiny layout, f32 (nothing timed seriously)")
    args = parser.parse_args(argv)
    if args.smoke:
        global S
        S = Setup(smoke=True)
        if args.seq == parser.get_default("seq"):
            args.seq, args.repeats = [256, 512], 1
    if args.what == "precompile":
        precompile()
    else:
        run(args)


if __name__ == "__main__":
    main()
