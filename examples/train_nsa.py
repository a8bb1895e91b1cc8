"""Train a small decoder language model of NSA layers (nsa_iree.NativeSparseAttention) on a synthetic retrieval
task, generated here:

- "needle": random filler tokens with one (marker, value) pair at a random depth; the sequence ends with the marker
  again, to be answered with the value. The model must find the needle's block: with the CPU preset's 4 selected
  blocks of 16, three of them forced (the first, the row's own, the one before), only the compression's ranking
  brings the needle's block in.
- "recall": a sequence of (key, value) token pairs, then some of the keys again, each to be answered with its value.

Answering needs a token anywhere in the context: long-range retrieval, what NSA's compression and selection
branches are for. The loss is the cross entropy of the answers alone.

    python examples/train_nsa.py                                   # CPU: a tiny model, the needle in 128 tokens
    python examples/train_nsa.py --device cuda --preset h200       # H200: 97M parameters, 32k tokens
    python examples/train_nsa.py --device cuda --preset h200 --attention fla   # fla's parallel_nsa instead

Prints a progress line, writes the loss log (a CSV: step, loss, answer accuracy, tokens/s) and, with matplotlib
installed (the "bench" extra), the loss and accuracy curves.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

import nsa_iree


@dataclasses.dataclass
class Config:
    task: str = "needle"          # "needle" or "recall" (the module docstring)
    seq_len: int = 128            # tokens per sequence
    queries: int = 8              # recall: the keys asked again at the end
    keys: int = 64                # recall: distinct key tokens (>= the pairs a sequence holds), as many value
                                  # tokens; needle: the values the needle can carry
    filler: int = 64              # needle: the tokens the haystack is drawn from
    layers: int = 2
    hidden: int = 64
    heads: int = 16
    kv_heads: int = 1
    head_dim: int = 16
    block_size: int = 16
    block_counts: int = 4
    batch: int = 32
    steps: int = 500
    lr: float = 3e-3
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"        # autocast dtype on the GPU ("bfloat16"); float32 on the CPU
    attention: str = "nsa_iree"   # or "fla": fla's parallel_nsa in the same layer

    @property
    def vocab(self) -> int:
        if self.task == "needle":
            return self.filler + 1 + self.keys     # filler, the marker, the values
        return 2 * self.keys + 1   # keys, values, and the separator before the queries


PRESETS = {
    "cpu": Config(),
    "h200": Config(task="recall", seq_len=32768, queries=256, keys=16384, layers=4, hidden=768, heads=64, kv_heads=4,
                   head_dim=64, block_size=64, block_counts=16, batch=1, steps=2000, lr=1e-3, device="cuda",
                   dtype="bfloat16"),
}


def needle_batch(cfg: Config, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [B, seq_len - 1] and targets (-100 except at the answer, the last): filler tokens, the marker and a
    value at a random depth, the marker again at the end, to be answered with that value."""
    b, marker = cfg.batch, cfg.filler
    tokens = torch.randint(0, cfg.filler, (b, cfg.seq_len), generator=generator)
    depth = torch.randint(0, cfg.seq_len - 4, (b,), generator=generator)
    value = cfg.filler + 1 + torch.randint(0, cfg.keys, (b,), generator=generator)
    rows = torch.arange(b)
    tokens[rows, depth], tokens[rows, depth + 1] = marker, value
    tokens[:, -2], tokens[:, -1] = marker, value
    targets = torch.full_like(tokens, -100)
    targets[:, -1] = value
    # the model predicts token t + 1 from tokens .. t
    return tokens[:, :-1], targets[:, 1:]


def recall_batch(cfg: Config, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [B, seq_len] and targets [B, seq_len] (-100 except at the answers): (key, value) pairs with distinct
    keys, the separator, then `queries` of the keys, each followed by its value."""
    pairs = (cfg.seq_len - 1 - 2 * cfg.queries) // 2
    if pairs < cfg.queries or pairs > cfg.keys:
        raise ValueError(f"seq_len {cfg.seq_len} holds {pairs} pairs: need queries ({cfg.queries}) <= pairs <= "
                         f"keys ({cfg.keys})")
    b = cfg.batch
    keys = torch.rand(b, cfg.keys, generator=generator).argsort(dim=1)[:, :pairs]             # distinct keys
    values = cfg.keys + torch.randint(0, cfg.keys, (b, pairs), generator=generator)
    asked = torch.rand(b, pairs, generator=generator).argsort(dim=1)[:, :cfg.queries]
    ask_keys, ask_values = keys.gather(1, asked), values.gather(1, asked)
    body = torch.stack([keys, values], dim=2).view(b, 2 * pairs)
    tail = torch.stack([ask_keys, ask_values], dim=2).view(b, 2 * cfg.queries)
    separator = torch.full((b, 1), 2 * cfg.keys)
    pad = cfg.seq_len - 1 - 2 * pairs - 2 * cfg.queries
    tokens = torch.cat([torch.full((b, pad), 2 * cfg.keys), body, separator, tail], dim=1)
    targets = torch.full_like(tokens, -100)
    answer_at = cfg.seq_len - 2 * cfg.queries + 1 + 2 * torch.arange(cfg.queries)        # each value's place
    targets[:, answer_at] = tokens[:, answer_at]
    # the model predicts token t + 1 from tokens .. t
    return tokens[:, :-1], targets[:, 1:]


BATCHES = {"needle": needle_batch, "recall": recall_batch}


class FlaAttention(nn.Module):
    """NativeSparseAttention with fla's parallel_nsa in place of nsa_iree.nsa (same parameters)."""

    def __init__(self, inner: nsa_iree.NativeSparseAttention) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from fla.ops.nsa.parallel import parallel_nsa

        from nsa_iree.layer import positions_of, rotary

        m = self.inner
        batch, m_rows, _ = x.shape
        pos = positions_of(batch, m_rows, x.device)
        q = rotary(m.q_proj(x).view(batch, m_rows, m.num_heads, m.head_dim), pos, m.rope_theta)
        k = rotary(m.k_proj(x).view(batch, m_rows, m.num_kv_heads, m.head_dim), pos, m.rope_theta)
        v = m.v_proj(x).view(batch, m_rows, m.num_kv_heads, m.head_dim)
        gates = torch.sigmoid(m.g_proj(x).view(batch, m_rows, m.num_heads, 3))
        o = parallel_nsa(q, k, v, gates[..., 0], gates[..., 1], None, block_counts=m.block_counts,
                         block_size=m.block_size, scale=m.head_dim ** -0.5)
        return m.o_proj(o.reshape(batch, m_rows, -1))


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(cfg.hidden), nn.RMSNorm(cfg.hidden)
        attention = nsa_iree.NativeSparseAttention(cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim,
                                                   cfg.block_size, cfg.block_counts, window_size=0)
        self.attention = FlaAttention(attention) if cfg.attention == "fla" else attention
        width = 4 * cfg.hidden
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, width), nn.GELU(), nn.Linear(width, cfg.hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class RecallModel(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, scored: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, M, vocab], or [K, vocab] at the K positions where `scored` [B, M] is true (the answers:
        the only positions the loss reads, so the vocabulary's projection runs there alone)."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x if scored is None else x[scored]))


def train(cfg: Config, log_path: Path | None = None, quiet: bool = False) -> list[dict]:
    """Train cfg's model; returns one row per step: step, loss, answer accuracy, tokens/s."""
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    model = RecallModel(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s / cfg.steps, 1.0))))
    data = torch.Generator().manual_seed(cfg.seed + 1)     # the same data for every attention and run
    autocast = torch.autocast(device.type, dtype=getattr(torch, cfg.dtype), enabled=cfg.dtype != "float32")
    rows = []
    if not quiet:
        params = sum(p.numel() for p in model.parameters())
        print(f"{cfg.attention}, {cfg.task}: {params / 1e6:.2f}M parameters, {cfg.layers} layers, "
              f"{cfg.seq_len} tokens x {cfg.batch}, {cfg.steps} steps on {device}", flush=True)
    for step in range(cfg.steps):
        tokens, targets = (t.to(device) for t in BATCHES[cfg.task](cfg, data))
        start = time.perf_counter()
        answered = targets != -100
        with autocast:
            logits = model(tokens, answered)
        loss = nn.functional.cross_entropy(logits.float(), targets[answered])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        accuracy = (logits.argmax(-1) == targets[answered]).float().mean().item()
        rows.append({"step": step, "loss": loss.item(), "accuracy": accuracy,
                     "tokens_per_s": tokens.numel() / seconds})
        if not quiet:
            done = (step + 1) * 30 // cfg.steps
            print(f"\r[{'#' * done}{'.' * (30 - done)}] step {step + 1}/{cfg.steps} loss {loss.item():.3f} "
                  f"accuracy {accuracy:.2f} {rows[-1]['tokens_per_s']:.0f} tokens/s", end="", flush=True)
    if not quiet:
        print()
    if log_path is not None:
        with open(log_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return rows


def plot(logs: dict[str, list[dict]], path: Path, window: int = 25) -> bool:
    """The loss curves of `logs` (label -> rows) and their answer accuracy (the mean over `window` steps), side by
    side; False when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (loss_ax, accuracy_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for label, rows in logs.items():
        steps = [r["step"] for r in rows]
        loss_ax.plot(steps, [r["loss"] for r in rows], label=label)
        accuracy = [r["accuracy"] for r in rows]
        smoothed = [sum(accuracy[max(0, i - window + 1):i + 1]) / len(accuracy[max(0, i - window + 1):i + 1])
                    for i in range(len(accuracy))]
        accuracy_ax.plot(steps, smoothed, label=label)
    loss_ax.set(xlabel="step", ylabel="answer cross entropy", title="loss")
    accuracy_ax.set(xlabel="step", ylabel=f"answers right (mean of {window} steps)", title="accuracy", ylim=(0, 1))
    loss_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=PRESETS, default="cpu")
    parser.add_argument("--device")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--attention", choices=("nsa_iree", "fla"))
    parser.add_argument("--task", choices=tuple(BATCHES))
    parser.add_argument("--out", default="train_nsa", help="file prefix of the log (.csv) and the plot (.png)")
    args = parser.parse_args(argv)
    cfg = dataclasses.replace(PRESETS[args.preset], **{k: v for k, v in (
        ("device", args.device), ("steps", args.steps), ("seq_len", args.seq_len), ("seed", args.seed),
        ("attention", args.attention), ("task", args.task)) if v is not None})
    rows = train(cfg, Path(f"{args.out}.csv"))
    print(f"loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}; log {args.out}.csv")
    if plot({cfg.attention: rows}, Path(f"{args.out}.png")):
        print(f"plot {args.out}.png")
    else:
        print("matplotlib is not installed (pip install nsa_iree[bench]): no plot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
