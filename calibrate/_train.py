"""Train draft heads on a frozen base model (Medusa-1 style; Hydra teacher-forced).

The base model runs once: batched greedy generation from prompts (self-distillation: the heads
learn the base model's own continuations) or one teacher-forced pass over given text. Each run
is kept as a :class:`Trajectory` of final-norm hidden states and the tokens they chose, so that
the heads then train for several epochs on the cache without touching the base model.

Head ``d`` at trajectory position ``s`` reads ``hidden[s]`` (and, for Hydra, the true prefix
``tokens[s : s + d]``: the root then the tokens above it) and learns ``tokens[s + d]`` by
cross-entropy, exactly the quantity the profiler ranks.

The loss is the cross-entropy over the full vocabulary by default (``softmax_vocab="full"``;
its memory is batch x vocab floats per head, 0.8 GB for 4096 positions of a 49k vocabulary, so
it fits any GPU and a CPU). On a CPU the vocabulary projection dominates the time (49k x hidden
per example and head), so ``softmax_vocab="batch"`` normalises over a subset instead: the most
frequent tokens of the trajectories, each batch's targets and uniformly sampled negatives.
Evaluation always ranks over the full vocabulary.

With ``distill_topk`` > 0 the target is the base model's own distribution at the target
position instead of its one token (a teacher-distillation objective, as Hydra++ trains with):
the softmax of the shared lm_head over the cached final-norm hidden state there, cut to its
top-k tokens and renormalised, precomputed once for every position.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from entmtp.core import EntmtpError, atomic_write
from entmtp.model import DraftHeads, greedy_generate, topk_ranks, unwrap_base
from entmtp.treesearch import Tree, expected_accept_length

Progress = Callable[[str, int, int], None]  # (stage, done, total)
TRAIN_MODES = ("self-distill", "text")


@dataclass
class Trajectory:
    """One base-model run: ``hidden[s]`` is the final-norm state whose logits chose ``tokens[s]``.

    Self-distillation: ``tokens`` are the greedy continuation of a prompt and ``hidden[0]`` is
    the state at the prompt's last token. Text: ``tokens[s]`` is the text token after position s.
    """

    hidden: Tensor  # [T, hidden_size] float
    tokens: Tensor  # [T] int64
    source: str = ""  # a label (e.g. the task) for per-source accuracy

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class HeadAccuracy:
    depth: int  # head d predicts the token d steps after the root
    top1: float
    top5: float
    positions: int


@dataclass
class TrainReport:
    head_type: str
    num_heads: int
    mode: str
    epochs: int
    lr: float
    batch_size: int
    seed: int
    max_new_tokens: int
    train_trajectories: int
    train_positions: int
    heldout_trajectories: int
    heldout_positions: int
    softmax_vocab: str
    distill_topk: int = 0
    epoch_losses: list[float] = field(default_factory=list)
    heldout: list[HeadAccuracy] = field(default_factory=list)
    generation_seconds: float = 0.0
    training_seconds: float = 0.0
    planned_steps: int = 0  # epochs x batches per epoch
    steps: int = 0  # optimizer steps taken: fewer when a deadline shortened the schedule

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        return accuracy_table({"heldout": self.heldout})


def accuracy_table(rows: dict[str, list[HeadAccuracy]]) -> str:
    """Markdown table: one row per label, top-1 / top-5 per head."""
    depths = sorted({acc.depth for accs in rows.values() for acc in accs})
    header = "| data | positions | " + " | ".join(f"head {d} top-1 / top-5" for d in depths) + " |"
    lines = [header, "|" + "---|" * (len(depths) + 2)]
    for label, accs in rows.items():
        by_depth = {acc.depth: acc for acc in accs}
        cells = [
            f"{by_depth[d].top1:.3f} / {by_depth[d].top5:.3f}" if d in by_depth else "-"
            for d in depths
        ]
        positions = by_depth[depths[0]].positions if depths and depths[0] in by_depth else 0
        lines.append(f"| {label} | {positions} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Base model runs


def _eos_ids(base: Any, module: torch.nn.Module) -> set[int]:
    ids = getattr(base, "eos_token_ids", None)
    if ids is None:
        ids = getattr(module.config, "eos_token_id", None)
    if ids is None:
        return set()
    if isinstance(ids, int):
        return {ids}
    return {int(i) for i in ids}


def _prompt_ids(base: Any, item: Any) -> list[int]:
    """Token ids of a prompt given as token ids, text, or a TaskPrompt (or anything with
    ``.text``)."""
    if hasattr(item, "text_for") and hasattr(base, "encode_task_prompt"):
        return list(base.encode_task_prompt(item))
    text = getattr(item, "text", item)
    if isinstance(text, str):
        encode = getattr(base, "encode_prompt", None)
        if encode is None:
            raise EntmtpError(
                "text prompts need a base model with encode_prompt (load it with "
                "entmtp's load_base_model); or pass token ids"
            )
        ids = encode(text)
    else:
        ids = text
    ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1).tolist()
    if not ids:
        raise EntmtpError("an empty prompt cannot be continued; drop it from the data")
    return ids


def _text_ids(base: Any, item: Any) -> list[int]:
    text = getattr(item, "text", item)
    if isinstance(text, str):
        tokenizer = getattr(base, "tokenizer", None)
        if tokenizer is None:
            raise EntmtpError("text mode needs a base model with a tokenizer, or token ids")
        return list(tokenizer(text)["input_ids"])
    return torch.as_tensor(text, dtype=torch.int64).reshape(-1).tolist()


def _report(progress: Progress | None, stage: str, done: int, total: int) -> None:
    if progress is not None:
        progress(stage, done, total)


def generate_trajectories(
    base: Any,
    prompts: Sequence[Any],
    *,
    max_new_tokens: int = 128,
    batch_size: int = 16,
    sources: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> list[Trajectory]:
    """Greedy trajectories of ``prompts`` (text, TaskPrompt-like, or token ids), in order.

    Prompts are batched by length to keep left padding small.
    """
    module = unwrap_base(base)
    eos_ids = _eos_ids(base, module)
    ids = [_prompt_ids(base, prompt) for prompt in prompts]
    labels = list(sources) if sources is not None else [""] * len(ids)
    if len(labels) != len(ids):
        raise EntmtpError(f"{len(labels)} source labels for {len(ids)} prompts")
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    result: list[Trajectory | None] = [None] * len(ids)
    _report(progress, "generate", 0, len(ids))
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        runs = greedy_generate(module, [ids[i] for i in chunk], max_new_tokens=max_new_tokens,
                               eos_token_ids=eos_ids, keep_hidden=True)
        for index, run in zip(chunk, runs, strict=True):
            tokens = torch.tensor(run.tokens, dtype=torch.int64)
            result[index] = Trajectory(hidden=run.hidden, tokens=tokens, source=labels[index])
        _report(progress, "generate", min(start + batch_size, len(ids)), len(ids))
    return [trajectory for trajectory in result if trajectory is not None]


@torch.inference_mode()
def text_trajectories(
    base: Any,
    texts: Sequence[Any],
    *,
    max_length: int = 512,
    batch_size: int = 8,
    sources: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> list[Trajectory]:
    """Teacher-forced trajectories of ``texts`` cut into windows of ``max_length`` tokens."""
    module = unwrap_base(base)
    decoder = module.base_model
    device = next(module.parameters()).device
    labels = list(sources) if sources is not None else [""] * len(texts)
    windows: list[tuple[list[int], str]] = []
    for text, label in zip(texts, labels, strict=True):
        ids = _text_ids(base, text)
        for start in range(0, max(len(ids) - 1, 0), max_length - 1):
            window = ids[start:start + max_length]
            if len(window) >= 2:
                windows.append((window, label))
    result: list[Trajectory] = []
    _report(progress, "forward", 0, len(windows))
    for start in range(0, len(windows), batch_size):
        chunk = windows[start:start + batch_size]
        width = max(len(window) for window, _ in chunk)
        input_ids = torch.zeros((len(chunk), width), dtype=torch.int64, device=device)
        mask = torch.zeros_like(input_ids)
        for row, (window, _) in enumerate(chunk):
            input_ids[row, : len(window)] = torch.as_tensor(window)
            mask[row, : len(window)] = 1
        hidden = decoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
        for row, (window, label) in enumerate(chunk):
            length = len(window)
            result.append(
                Trajectory(
                    hidden=hidden[row, : length - 1].float().cpu().clone(),
                    tokens=input_ids[row, 1:length].cpu().clone(),
                    source=label,
                )
            )
        _report(progress, "forward", min(start + batch_size, len(windows)), len(windows))
    return result


def save_trajectories(path: str | os.PathLike, trajectories: Sequence[Trajectory], *,
                      key: dict[str, Any] | None = None) -> Path:
    """One safetensors file (concatenated hidden states and tokens, lengths, sources, and
    ``key``: what the states were computed from, read back by ``trajectories_key``)."""
    from safetensors.torch import save

    if not trajectories:
        raise EntmtpError("no trajectories to save")
    tensors = {
        "hidden": torch.cat([t.hidden for t in trajectories]).contiguous(),
        "tokens": torch.cat([t.tokens for t in trajectories]).contiguous(),
        "lengths": torch.as_tensor([len(t) for t in trajectories], dtype=torch.int64),
    }
    metadata = {"sources": json.dumps([t.source for t in trajectories])}
    if key is not None:
        metadata["key"] = json.dumps(key, sort_keys=True)
    payload = save(tensors, metadata=metadata)
    return atomic_write(path, lambda handle: handle.write(payload))


def trajectories_key(path: str | os.PathLike) -> dict[str, Any] | None:
    """The ``key`` a trajectories file was saved with (None: saved without one)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            text = (handle.metadata() or {}).get("key")
        return None if text is None else json.loads(text)
    except Exception as err:
        raise EntmtpError(f"cannot read trajectories {path}: {err}") from err


def load_trajectories(path: str | os.PathLike) -> list[Trajectory]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            sources = json.loads((handle.metadata() or {}).get("sources", "[]"))
            hidden, tokens, lengths = (
                handle.get_tensor(name) for name in ("hidden", "tokens", "lengths")
            )
    except Exception as err:
        raise EntmtpError(f"cannot read trajectories {path}: {err}") from err
    result, offset = [], 0
    for index, length in enumerate(lengths.tolist()):
        source = sources[index] if index < len(sources) else ""
        result.append(
            Trajectory(hidden[offset:offset + length], tokens[offset:offset + length], source)
        )
        offset += length
    return result


# ---------------------------------------------------------------------------------------------
# Training and evaluation on cached trajectories


@dataclass
class _Examples:
    """Positions of concatenated trajectories with their per-head targets."""

    hidden: Tensor  # [M, H] all positions
    tokens: Tensor  # [M] all positions
    rows: Tensor  # [n] positions with at least one target
    targets: Tensor  # [n, num_heads] token d steps after the root, -1 past the trajectory end


def _examples(trajectories: Sequence[Trajectory], num_heads: int) -> _Examples:
    if not trajectories:
        raise EntmtpError("no trajectories: give prompts or texts to train or evaluate on")
    hidden = torch.cat([t.hidden for t in trajectories])
    tokens = torch.cat([t.tokens for t in trajectories]).long()
    lengths = torch.as_tensor([len(t) for t in trajectories])
    starts = torch.cumsum(lengths, 0) - lengths
    index = torch.arange(len(tokens))
    remaining = torch.repeat_interleave(starts + lengths, lengths) - 1 - index
    rows = index[remaining >= 1]
    depth = torch.arange(1, num_heads + 1)
    gather = _target_positions(rows, num_heads, len(tokens))
    targets = torch.where(depth <= remaining[rows, None], tokens[gather], -1)
    return _Examples(hidden=hidden, tokens=tokens, rows=rows, targets=targets)


def _target_positions(rows: Tensor, num_heads: int, length: int) -> Tensor:
    """[n, num_heads] position ``row + d`` of head d's target, clamped to the last of
    ``length`` positions (a target past its trajectory's end is -1 in ``_Examples.targets``)."""
    return (rows[:, None] + torch.arange(1, num_heads + 1)).clamp(max=length - 1)


def _prefixes(examples: _Examples, rows: Tensor, depth: int) -> Tensor:
    """[n, depth] root then true tokens above it (teacher forcing) for positions ``rows``."""
    return examples.tokens[rows[:, None] + torch.arange(depth)]


def fit_heads(
    heads: DraftHeads,
    trajectories: Sequence[Trajectory],
    *,
    epochs: int = 3,
    lr: float = 1e-3,
    batch_size: int = 256,
    seed: int = 0,
    weight_decay: float = 0.0,
    softmax_vocab: str = "full",
    frequent_tokens: int = 1024,
    random_negatives: int = 4096,
    distill_topk: int = 0,
    progress: Progress | None = None,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    plan: FitPlan | None = None,
) -> list[float]:
    """Train ``heads`` in place on cached trajectories; returns the mean loss of each epoch.

    ``deadline`` (a ``clock()`` value; None: none): the training ends by then. Once a few steps
    have timed the step, a schedule that would not fit is shortened to the steps that do (the
    learning rate still warms up and decays to zero, over fewer steps), leaving a twentieth of
    the time left for what follows (held-out accuracy, saving). ``plan`` (optional) receives the
    planned and the taken step counts.

    AdamW with 5 % linear warm-up then cosine decay; the loss is the sum over heads of the
    cross-entropy on the token ``d`` steps after the root. ``softmax_vocab`` is the vocabulary
    the softmax is normalised over: "batch" (the ``frequent_tokens`` most frequent tokens of the
    trajectories, the batch's targets and ``random_negatives`` tokens drawn uniformly afresh for
    each batch, so that no token escapes the push-down: cheapest), "seen" (every token of the
    trajectories) or "full". ``distill_topk`` > 0 trains on the base model's top-k distribution
    at each target position (``teacher_topk``; its tokens join a "batch" vocabulary) instead of
    the one token.

    The heads train, and stay, in float32 whatever the base model's dtype (they are cast in
    place): AdamW's steps are far below a bf16 weight's resolution (8 significant bits, so a
    step under 1/256 of the weight rounds away) and often below fp16's, so low-precision head
    weights would stop learning. The heads are small next to the base, whose forward (cached
    in the trajectories) and shared lm_head / embedding stay in its own dtype; saving stores
    the float32 weights in the precision asked for.
    """
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise EntmtpError("training needs epochs >= 1, batch_size >= 1 and lr > 0")
    if distill_topk < 0:
        raise EntmtpError(f"distill_topk must be 0 (no distillation) or more, got {distill_topk}")
    if distill_topk and softmax_vocab == "seen":
        raise EntmtpError("distillation's targets are any tokens of the vocabulary: use the "
                          "'batch' or 'full' softmax with it, not 'seen'")
    heads.float()
    examples = _examples(trajectories, heads.num_heads)
    teacher = (teacher_topk(heads, examples.hidden, distill_topk, progress=progress)
               if distill_topk else None)
    vocab_ids, targets = _softmax_vocab(examples, heads.vocab_size, softmax_vocab)
    frequent = _frequent_tokens(examples, frequent_tokens) if softmax_vocab == "batch" else None
    parameters = [p for p in heads.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    count = len(examples.rows)
    plan = plan if plan is not None else FitPlan()
    plan.planned = plan.total = epochs * math.ceil(count / batch_size)
    plan.taken, plan.timed_from = 0, None
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(plan.total)(step))
    device, dtype = heads.device, heads.dtype
    heads.train()
    losses: list[float] = []
    _report(progress, "train", 0, plan.total)
    try:
        for _ in range(epochs):
            if plan.taken >= plan.total:
                break
            order = torch.randperm(count, generator=generator)
            epoch_loss, epoch_batches = 0.0, 0
            for start in range(0, count, batch_size):
                if plan.taken >= plan.total:
                    break
                picked = order[start:start + batch_size]
                rows = examples.rows[picked]
                hidden = examples.hidden[rows].to(device, dtype)
                loss = batch_loss(heads, examples, rows, hidden, targets[picked],
                                  vocab_ids=vocab_ids, teacher=teacher, frequent=frequent,
                                  random_negatives=random_negatives, generator=generator)
                epoch_loss += optimizer_step(loss, optimizer, scheduler, parameters)
                epoch_batches += 1
                plan.taken += 1
                if deadline is not None:
                    plan.fit_to(deadline, clock())
                _report(progress, "train", plan.taken, plan.total)
            losses.append(epoch_loss / max(1, epoch_batches))
    finally:
        heads.eval()
    return losses


@dataclass
class FitPlan:
    """Optimizer steps of a training: planned (epochs x batches), the schedule's length (the
    planned count, or fewer to meet a deadline) and taken."""

    planned: int = 0
    total: int = 0
    taken: int = 0
    timed_from: float | None = None  # clock() after the warm-up steps

    WARMUP_STEPS = 3  # steps not timed (allocation, kernel selection)
    TIMED_STEPS = 2  # steps timed before the schedule may be shortened

    def fit_to(self, deadline: float, now: float) -> None:
        """After a step: stop at once past ``deadline``; else shorten the schedule to the steps
        that end by then with a twentieth of the time left to spare, judged by the mean step
        since the warm-up steps. The schedule only ever shortens."""
        if now >= deadline:
            self.total = self.taken
            return
        if self.taken == self.WARMUP_STEPS:
            self.timed_from = now
        if self.timed_from is None or self.taken < self.WARMUP_STEPS + self.TIMED_STEPS:
            return
        per_step = (now - self.timed_from) / (self.taken - self.WARMUP_STEPS)
        if per_step <= 0:
            return
        remaining = int((deadline - now) * 0.95 / per_step)
        floor = min(self.taken + 1, self.total)  # the step the deadline still leaves room for
        self.total = max(floor, min(self.total, self.taken + remaining))


def warmup_cosine(total_steps: int) -> Callable[[int], float]:
    """The learning-rate factor of each step: 5 % linear warm-up, then cosine decay to 0."""
    warmup = max(1, total_steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))

    return factor


def optimizer_step(loss: Tensor, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler,
                   parameters: Sequence[Tensor]) -> float:
    """Back-propagate ``loss``, clip the gradients to norm 1, step; returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()
    scheduler.step()
    return float(loss.detach())


def batch_loss(
    heads: DraftHeads,
    examples: _Examples,
    rows: Tensor,
    hidden: Tensor,
    targets: Tensor,
    *,
    vocab_ids: Tensor | None,
    teacher: TeacherTopK | None,
    frequent: Tensor | None,
    random_negatives: int,
    generator: torch.Generator,
) -> Tensor:
    """The training loss of one batch: the sum over heads of the cross-entropy of head ``d``
    on the token ``d`` steps after each of ``rows`` (positions of ``examples``), or on the
    teacher's top-k there. hidden: [n, H] the heads' input at ``rows``; targets: [n, heads]
    indexed in ``vocab_ids`` (None: token ids); ``frequent`` (not None: the "batch" softmax)
    joins the batch's targets, the teacher's tokens and ``random_negatives`` uniform tokens.
    """
    device = hidden.device
    batch_vocab = vocab_ids
    soft = None
    if teacher is not None:
        at = _target_positions(rows, heads.num_heads, len(examples.tokens))
        soft = (teacher.ids[at].long(), teacher.probs[at])  # [n, heads, k] each
    if frequent is not None:
        negatives = torch.randint(0, heads.vocab_size, (random_negatives,), generator=generator)
        always = [frequent, negatives]
        if soft is not None:
            always.append(soft[0][targets >= 0].reshape(-1))
        batch_vocab, targets = _batch_vocab(torch.cat(always), targets)
        if soft is not None:
            soft = (torch.searchsorted(batch_vocab, soft[0]), soft[1])
    loss = torch.zeros((), device=device)
    for depth in range(1, heads.num_heads + 1):
        target = targets[:, depth - 1]
        valid = target >= 0
        if not bool(valid.any()):
            continue
        prefix = _prefixes(examples, rows[valid], depth).to(device)
        features = heads.head_features(depth, hidden[valid], prefix)
        logits = heads.project(
            depth, features, None if batch_vocab is None else batch_vocab.to(device)
        )
        if soft is None:
            loss = loss + F.cross_entropy(logits.float(), target[valid].to(device))
            continue
        log_probs = F.log_softmax(logits.float(), dim=-1)
        columns = soft[0][valid, depth - 1].to(device)
        weights = soft[1][valid, depth - 1].to(device)
        loss = loss - (weights * log_probs.gather(1, columns)).sum(-1).mean()
    return loss


@dataclass
class TeacherTopK:
    """The base model's next-token distribution at every position, cut to its top-k."""

    ids: Tensor  # [M, k] int32 token ids, most likely first
    probs: Tensor  # [M, k] float32, renormalised over the k tokens (rows sum to 1)


@torch.no_grad()
def teacher_topk(heads: DraftHeads, hidden: Tensor, k: int, *, batch_size: int = 4096,
                 progress: Progress | None = None) -> TeacherTopK:
    """Top-``k`` of softmax(lm_head(hidden)) for each row of ``hidden`` [M, H] (final-norm
    states: the base model's own distribution), through the heads' shared lm_head; reports the
    rows done as stage "teacher" (a full-vocabulary projection of every row: minutes on a CPU)."""
    if not heads.shared_lm_head:
        raise EntmtpError("distillation reads the base model's distribution through the lm_head "
                          "the heads share; these heads have their own projections")
    weight, bias = heads.projection_weight(1)
    k = min(int(k), weight.shape[0])
    rows = hidden.shape[0]
    ids = torch.empty((rows, k), dtype=torch.int32)
    probs = torch.empty((rows, k), dtype=torch.float32)
    _report(progress, "teacher", 0, rows)
    for start in range(0, rows, batch_size):
        chunk = hidden[start:start + batch_size].to(weight.device, weight.dtype)
        logits = F.linear(chunk, weight, bias).float()
        top = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
        ids[start:start + batch_size] = top.indices.to(torch.int32).cpu()
        probs[start:start + batch_size] = (top.values / top.values.sum(-1, keepdim=True)).cpu()
        _report(progress, "teacher", min(start + batch_size, rows), rows)
    return TeacherTopK(ids=ids, probs=probs)


def _softmax_vocab(
    examples: _Examples, vocab_size: int, mode: str
) -> tuple[Tensor | None, Tensor]:
    """(vocabulary subset or None, targets indexed in it) for the "seen" and "full" modes."""
    if mode in ("full", "batch"):
        return None, examples.targets
    if mode != "seen":
        raise EntmtpError(
            f"softmax_vocab must be 'batch', 'seen' or 'full', got {mode!r}"
        )
    vocab_ids = torch.unique(examples.tokens)
    lookup = torch.full((vocab_size,), -1, dtype=torch.int64)
    lookup[vocab_ids] = torch.arange(len(vocab_ids))
    targets = torch.where(examples.targets >= 0, lookup[examples.targets.clamp(min=0)], -1)
    return vocab_ids, targets


def _frequent_tokens(examples: _Examples, count: int) -> Tensor:
    """The ``count`` most frequent tokens of the trajectories (always-present negatives)."""
    values, counts = torch.unique(examples.tokens, return_counts=True)
    return values[counts.argsort(descending=True)[:count]]


def _batch_vocab(frequent: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Vocabulary of one batch: the frequent tokens plus the batch's targets, and the targets
    re-indexed into it (-1 stays -1)."""
    vocab = torch.unique(torch.cat([frequent, targets[targets >= 0]]))
    index = torch.searchsorted(vocab, targets.clamp(min=0))
    return vocab, torch.where(targets >= 0, index, -1)


@dataclass
class HeadRanks:
    """Where the true future token ranks in each head, at every scored position."""

    ranks: np.ndarray  # [positions, num_heads] int16: rank in the head's top-k, -1 outside it
    scored: np.ndarray  # [positions, num_heads] bool: the token d steps after the root exists
    topk: int  # how deep each head's ranking went

    @staticmethod
    def concat(parts: Sequence[HeadRanks]) -> HeadRanks:
        return HeadRanks(np.concatenate([p.ranks for p in parts]),
                         np.concatenate([p.scored for p in parts]),
                         min(p.topk for p in parts))

    def accuracy(self) -> list[HeadAccuracy]:
        """Top-1 / top-5 of each head over its scored positions."""
        if self.topk < 5:
            raise EntmtpError(f"top-5 accuracy needs ranks to top-5, these go to top-{self.topk}")
        result = []
        for d in range(self.ranks.shape[1]):
            ranks = self.ranks[self.scored[:, d], d]
            total = len(ranks)
            result.append(HeadAccuracy(
                depth=d + 1,
                top1=float((ranks == 0).sum()) / total if total else float("nan"),
                top5=float(((ranks >= 0) & (ranks < 5)).sum()) / total if total else float("nan"),
                positions=total,
            ))
        return result

    def accept_length(self, tree: Tree) -> float:
        """The tree's mean accept length replayed on these positions (tokens per step)."""
        if tree.min_topk > self.topk:
            raise EntmtpError(f"ranks were taken to top-{self.topk}, the tree needs "
                              f"top-{tree.min_topk}: rank again with a larger topk")
        return expected_accept_length(tree, self.ranks)


@torch.inference_mode()
def head_ranks(
    heads: DraftHeads,
    trajectories: Sequence[Trajectory],
    *,
    topk: int = 5,
    batch_size: int = 512,
) -> HeadRanks:
    """Rank of the true token ``d`` steps after the root in head ``d``'s top-k over its draft
    vocabulary (the whole vocabulary without one; Hydra fed the true prefix), at every position
    with at least one future token: the ranks a profile records, so that a tree's accept length
    replays on them (``treesearch.expected_accept_length``)."""
    examples = _examples(trajectories, heads.num_heads)
    device, dtype = heads.device, heads.dtype
    ranks = torch.full(examples.targets.shape, -1, dtype=torch.int16)
    for start in range(0, len(examples.rows), batch_size):
        rows = examples.rows[start:start + batch_size]
        hidden = examples.hidden[rows].to(device, dtype)
        for depth in range(1, heads.num_heads + 1):
            target = examples.targets[start:start + batch_size, depth - 1]
            valid = target >= 0
            if not bool(valid.any()):
                continue
            prefix = _prefixes(examples, rows[valid], depth).to(device)
            logits = heads.head_logits(depth, hidden[valid], prefix)
            columns = heads.draft_columns(target[valid].to(device))
            found = topk_ranks(logits, columns, topk).cpu().to(torch.int16)
            ranks[start + torch.nonzero(valid)[:, 0], depth - 1] = found
    return HeadRanks(ranks.numpy(), (examples.targets >= 0).numpy(), topk)


def head_accuracy(
    heads: DraftHeads,
    trajectories: Sequence[Trajectory],
    *,
    batch_size: int = 512,
) -> list[HeadAccuracy]:
    """Per-head top-1 / top-5 accuracy over the full vocabulary (Hydra: true prefix)."""
    return head_ranks(heads, trajectories, topk=5, batch_size=batch_size).accuracy()


def split_heldout(
    trajectories: Sequence[Trajectory], *, fraction: float, seed: int
) -> tuple[list[Trajectory], list[Trajectory]]:
    """(train, heldout): a seeded random ``fraction`` of whole trajectories is held out."""
    if not 0 <= fraction < 1:
        raise EntmtpError(f"heldout fraction must be in [0, 1), got {fraction}")
    order = torch.randperm(len(trajectories), generator=torch.Generator().manual_seed(seed))
    held = int(round(fraction * len(trajectories)))
    if fraction > 0 and len(trajectories) > 1:
        held = max(held, 1)
    heldout = sorted(order[:held].tolist())
    keep = sorted(order[held:].tolist())
    return [trajectories[i] for i in keep], [trajectories[i] for i in heldout]


def train_heads(
    base: Any,
    heads: DraftHeads,
    *,
    texts_or_prompts: Sequence[Any],
    mode: str = "self-distill",
    epochs: int = 3,
    lr: float = 1e-3,
    batch_size: int = 256,
    seed: int = 0,
    max_new_tokens: int = 128,
    progress: Progress | None = None,
    heldout_fraction: float = 0.1,
    generation_batch_size: int = 16,
    max_length: int = 512,
    softmax_vocab: str = "full",
    distill_topk: int = 0,
    deadline: float | None = None,
) -> TrainReport:
    """Train ``heads`` in place (in float32: see ``fit_heads``) on ``base`` (frozen, in its own
    dtype and device) and report held-out accuracy per head. ``deadline``: a
    ``time.monotonic()`` value the training ends by (``fit_heads``).

    mode "self-distill": ``texts_or_prompts`` are prompts (text, TaskPrompt-like or token ids)
    whose greedy continuations are the targets; "text": the texts themselves, teacher-forced.
    A seeded ``heldout_fraction`` of the trajectories is held out for the report.
    """
    if mode not in TRAIN_MODES:
        raise EntmtpError(f"mode must be one of {', '.join(TRAIN_MODES)}, got {mode!r}")
    started = time.perf_counter()
    if mode == "self-distill":
        trajectories = generate_trajectories(
            base,
            texts_or_prompts,
            max_new_tokens=max_new_tokens,
            batch_size=generation_batch_size,
            progress=progress,
        )
    else:
        trajectories = text_trajectories(
            base, texts_or_prompts, max_length=max_length, progress=progress
        )
    report = train_on_trajectories(
        heads, trajectories, mode=mode, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
        max_new_tokens=max_new_tokens, progress=progress, heldout_fraction=heldout_fraction,
        softmax_vocab=softmax_vocab, distill_topk=distill_topk, deadline=deadline,
    )
    report.generation_seconds = time.perf_counter() - started - report.training_seconds
    return report


def train_on_trajectories(
    heads: DraftHeads,
    trajectories: Sequence[Trajectory],
    *,
    mode: str,
    epochs: int = 3,
    lr: float = 1e-3,
    batch_size: int = 256,
    seed: int = 0,
    max_new_tokens: int = 0,
    progress: Progress | None = None,
    heldout_fraction: float = 0.1,
    softmax_vocab: str = "full",
    distill_topk: int = 0,
    deadline: float | None = None,
) -> TrainReport:
    """Train ``heads`` in place on ready trajectories (in memory or read from head data) and
    report held-out accuracy on a seeded ``heldout_fraction`` of them. ``deadline``: a
    ``time.monotonic()`` value the training ends by (``fit_heads``)."""
    started = time.perf_counter()
    train, heldout = split_heldout(trajectories, fraction=heldout_fraction, seed=seed)
    plan = FitPlan()
    losses = fit_heads(
        heads,
        train,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        softmax_vocab=softmax_vocab,
        distill_topk=distill_topk,
        progress=progress,
        deadline=deadline,
        plan=plan,
    )
    trained = time.perf_counter()
    accuracy = head_accuracy(heads, heldout) if heldout else []
    return TrainReport(
        head_type=heads.head_type,
        num_heads=heads.num_heads,
        mode=mode,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        max_new_tokens=max_new_tokens,
        train_trajectories=len(train),
        train_positions=sum(len(t) for t in train),
        heldout_trajectories=len(heldout),
        heldout_positions=sum(len(t) for t in heldout),
        softmax_vocab=softmax_vocab,
        distill_topk=distill_topk,
        epoch_losses=losses,
        heldout=accuracy,
        training_seconds=trained - started,
        planned_steps=plan.planned,
        steps=plan.taken,
    )
