"""Would a Hydra++ prefix-attention layer lift the default model's Hydra heads?

Hydra++ (Ankner et al., 2024) feeds its heads, instead of the base model's last hidden state
alone, the output of one extra decoder layer that attends over the base model's states of the
whole context. Before the runtime grows a drafter with its own KV cache for such a layer, this
probe measures what the layer buys here, offline: two fine-tunes of the same heads on the same
head data, with the same schedule and the same batches of whole sequences,

- ``plain``: the heads alone;
- ``prefix``: the heads reading ``PrefixBlock`` over the final-norm states of the prompt and
  continuation (causal self-attention then a SiLU-gated MLP, pre-norm, residual; both output
  projections start at zero, so it starts exactly where ``plain`` does),

then the held-out top-1 / top-5 per head and ``mc_sim_7b_63``'s replayed accept length per
task, and head-1 top-1 by position in the continuation (early positions have little context
beyond the prompt). It times nothing, so it may run beside other work.

    .venv/bin/python bench/prefix_attention_probe.py --train-data DATA --eval-data EVAL \\
        --heads trees/heads/smollm2-135m-hydra --json probe.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from entmtp.calibrate import (
    HeadRanks,
    Trajectory,
    head_ranks,
    read_head_data,
    read_head_data_index,
    record_trajectories,
)
from entmtp.calibrate._head_examples import _examples
from entmtp.calibrate._train import (
    _frequent_tokens,
    batch_loss,
    optimizer_step,
    teacher_topk,
    warmup_cosine,
)
from entmtp.model import load_base_model, load_heads
from entmtp.treesearch import reference_tree

POSITION_BUCKETS = ((0, 16), (16, 64), (64, 10**9))


@dataclass
class ForwardedRecord:
    """One head-data record, teacher-forced through the base model."""

    hidden: Tensor  # [L - 1, H] float32 final-norm state at every position but the last
    tokens: Tensor  # [L - 1] int64, tokens[s] follows position s
    start: int  # positions start.. are the continuation the heads train on
    source: str

    def trained(self, hidden: Tensor | None = None) -> Trajectory:
        h = self.hidden if hidden is None else hidden
        return Trajectory(h[self.start:], self.tokens[self.start:], self.source)


class PrefixBlock(nn.Module):
    """Pre-norm causal self-attention + SiLU-gated MLP over [B, T, H] states, residual, no
    position encoding (causal masking alone orders the context)."""

    def __init__(self, hidden_size: int, num_heads: int, intermediate: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.attn_norm = nn.RMSNorm(hidden_size)
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=False)
        self.out = nn.Linear(hidden_size, hidden_size, bias=False)
        self.mlp_norm = nn.RMSNorm(hidden_size)
        self.gate_up = nn.Linear(hidden_size, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden_size, bias=False)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.down.weight)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, size = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).chunk(3, dim=-1)
        shape = (batch, length, self.num_heads, size // self.num_heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, size))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def forward_sequences(base, records) -> list[ForwardedRecord]:
    """Teacher-forced final-norm states of every record with trained positions, prompt
    included, in record order."""
    usable = [r for r in records if r.trained_positions > 0]
    whole = record_trajectories(base, usable, whole=True)
    return [ForwardedRecord(t.hidden, t.tokens, r.start, r.source)
            for r, t in zip(usable, whole, strict=True)]


def transformed(block: PrefixBlock | None, group: list[ForwardedRecord]) -> list[Tensor]:
    """Each sequence's heads input: ``block`` over its states ([L - 1, H] each)."""
    if block is None:
        return [s.hidden for s in group]
    width = max(len(s.tokens) for s in group)
    padded = torch.zeros(len(group), width, group[0].hidden.shape[1])
    for row, s in enumerate(group):
        padded[row, :len(s.tokens)] = s.hidden  # right padding: causal rows never see it
    out = block(padded)
    return [out[row, :len(s.tokens)] for row, s in enumerate(group)]


def groups_of(order: list[int], sequences: list[ForwardedRecord],
              positions: int) -> list[list[int]]:
    """Consecutive sequences of ``order`` with about ``positions`` trained positions each."""
    result, current, count = [], [], 0
    for i in order:
        current.append(i)
        count += len(sequences[i].tokens) - sequences[i].start - 1
        if count >= positions:
            result.append(current)
            current, count = [], 0
    if current:
        result.append(current)
    return result


def fine_tune(heads, block: PrefixBlock | None, sequences: list[ForwardedRecord], *, epochs: int,
              lr: float, positions: int, distill: int, seed: int) -> list[float]:
    heads.float()
    trained = [s.trained() for s in sequences]
    examples = _examples(trained, heads.num_heads)
    lengths = torch.as_tensor([len(t) for t in trained])
    offsets = torch.cumsum(lengths, 0) - lengths  # first flat position of each sequence
    row_starts = torch.cumsum(lengths - 1, 0) - (lengths - 1)  # its first index in rows
    teacher = teacher_topk(heads, examples.hidden, distill) if distill else None
    frequent = _frequent_tokens(examples, 1024)
    parameters = [p for p in heads.parameters() if p.requires_grad]
    if block is not None:
        parameters += list(block.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    plans = [groups_of(torch.randperm(len(sequences), generator=generator).tolist(), sequences,
                       positions) for _ in range(epochs)]
    total = sum(len(p) for p in plans)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total))
    losses, step, started = [], 0, time.perf_counter()
    heads.train()
    for plan in plans:
        epoch_loss, batches = 0.0, 0
        for group in plan:
            picked = torch.cat([int(row_starts[i]) + torch.arange(int(lengths[i]) - 1)
                                for i in group])
            rows = examples.rows[picked]
            states = transformed(block, [sequences[i] for i in group])
            hidden = torch.cat([
                states[n][sequences[i].start + torch.arange(int(lengths[i]) - 1)]
                for n, i in enumerate(group)])
            assert torch.equal(rows, torch.cat([offsets[i] + torch.arange(int(lengths[i]) - 1)
                                                for i in group]))
            loss = batch_loss(heads, examples, rows, hidden, examples.targets[picked],
                              vocab_ids=None, teacher=teacher, frequent=frequent,
                              random_negatives=4096, generator=generator)
            epoch_loss += optimizer_step(loss, optimizer, scheduler, parameters)
            batches += 1
            step += 1
            if step % 200 == 0:
                print(f"  step {step}/{total} epoch loss {epoch_loss / batches:.3f} "
                      f"{time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)
        losses.append(epoch_loss / len(plan))
    heads.eval()
    return losses


@torch.no_grad()
def evaluate(heads, block: PrefixBlock | None, sequences: list[ForwardedRecord]) -> dict:
    tree = reference_tree("mc_sim_7b_63")
    inputs = [s.trained(transformed(block, [s])[0]) for s in sequences]
    result: dict = {"accept_length": {}, "top1": {}, "top5": {}, "head1_top1_by_position": {}}
    sources = sorted({s.source for s in sequences})
    ranks = {source: head_ranks(heads, [t for t in inputs if t.source == source],
                                topk=max(5, tree.min_topk))
             for source in sources}
    ranks["all"] = HeadRanks.concat([ranks[source] for source in sources])
    for source, ranked in ranks.items():
        result["accept_length"][source] = ranked.accept_length(tree)
        accuracy = ranked.accuracy()
        result["top1"][source] = [a.top1 for a in accuracy]
        result["top5"][source] = [a.top5 for a in accuracy]
    # "all" is the sources' positions in source order: positions within each trajectory
    ordered = [t for source in sources for t in inputs if t.source == source]
    position = torch.cat([torch.arange(len(t) - 1) for t in ordered]).numpy()
    everything = ranks["all"]
    for low, high in POSITION_BUCKETS:
        inside = (position >= low) & (position < high) & everything.scored[:, 0]
        bucket = HeadRanks(everything.ranks[inside], everything.scored[inside], everything.topk)
        result["head1_top1_by_position"][f"{low}-{min(high, 999)}"] = (
            bucket.accuracy()[0].top1, int(inside.sum()))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train-data", type=Path, required=True)
    parser.add_argument("--eval-data", type=Path, required=True)
    parser.add_argument("--heads", default="trees/heads/smollm2-135m-hydra")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.0015)
    parser.add_argument("--positions", type=int, default=256, help="trained positions per step")
    parser.add_argument("--distill", type=int, default=16)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--cache", type=Path, help="keep the forward's states here")
    parser.add_argument("--arms", default="plain,prefix")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    base = load_base_model()
    if args.cache is not None and args.cache.exists():
        train, held = torch.load(args.cache, weights_only=False)
    else:
        train = forward_sequences(base, read_head_data(args.train_data, base).records)
        held = forward_sequences(base, read_head_data(args.eval_data, base).records)
        if args.cache is not None:
            torch.save((train, held), args.cache)
    shipped = load_heads(args.heads, base.model)
    config = base.model.config
    # folder names and data digests, not this machine's paths
    settings = {name: value.name if isinstance(value, Path) else value
                for name, value in vars(args).items()}
    report: dict = {"heads": Path(args.heads).name, "sha256": shipped.sha256()[:12],
                    "settings": settings | {
                        f"{name}_plan_sha256": read_head_data_index(path)["plan_sha256"]
                        for name, path in (("train_data", args.train_data),
                                           ("eval_data", args.eval_data))},
                    "train_positions": sum(len(s.tokens) - s.start for s in train),
                    "eval_positions": sum(len(s.tokens) - s.start for s in held),
                    "arms": {"shipped": evaluate(shipped, None, held)}}
    args.json.write_text(json.dumps(report, indent=1))
    for arm in [name for name in args.arms.split(",") if name]:
        heads = copy.deepcopy(shipped)
        block = (PrefixBlock(config.hidden_size, config.num_attention_heads, args.intermediate)
                 if arm == "prefix" else None)
        started = time.perf_counter()
        losses = fine_tune(heads, block, train, epochs=args.epochs, lr=args.lr,
                           positions=args.positions, distill=args.distill, seed=args.seed)
        report["arms"][arm] = {"losses": losses, "seconds": time.perf_counter() - started,
                               "block_parameters": 0 if block is None else
                               sum(p.numel() for p in block.parameters()),
                               **evaluate(heads, block, held)}
        args.json.write_text(json.dumps(report, indent=1))
        print(json.dumps({arm: report["arms"][arm]["accept_length"]}), flush=True)


if __name__ == "__main__":
    main()
